/* fuzz_gguf.c - libFuzzer target: the GGUF reader, the llama checks and
 * the tokenizer on arbitrary bytes.
 *
 * Build (clang only; meson does it when the compiler is clang):
 *   CC=clang meson setup build-fuzz -Db_sanitize=address,undefined \
 *       -Db_lundef=false && ninja -C build-fuzz tests/fuzz/fuzz_gguf
 *   build-fuzz/tests/fuzz/fuzz_gguf -max_total_time=60 CORPUS_DIR
 * Seed the corpus with a small `kvctl model make` output.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gpu/gguf.h"
#include "gpu/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct gguf_file *f = NULL;
	struct gguf_error err;
	struct llama_hparams hp;
	struct tokenizer *t = NULL;
	/* A private copy so reads past `size` hit the ASan redzone. */
	uint8_t *buf = malloc(size ? size : 1);

	if (!buf)
		return 0;
	memcpy(buf, data, size);
	if (gguf_open_mem(&f, buf, size, &err) == 0) {
		gguf_llama_hparams(f, &hp, &err);
		if (tokenizer_new(&t, f, &err) == 0) {
			static const char text[] = "Once upon a time, \xe6\x97\xa5 it's 1234!\n";
			int32_t *ids;
			size_t n;
			char *dec;
			size_t dl;
			if (tokenizer_encode(t, text, sizeof(text) - 1, true, &ids, &n) == 0) {
				if (tokenizer_decode(t, ids, n, &dec, &dl) == 0)
					free(dec);
				free(ids);
			}
			tokenizer_free(t);
		}
		gguf_close(f);
	}
	free(buf);
	return 0;
}
