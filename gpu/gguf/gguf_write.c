/* gguf_write.c - GGUF v3 writer.
 *
 * Metadata is serialized into a growable byte buffer as each key
 * is added (so strings and arrays are copied once and the caller may free
 * its own), and tensor infos are kept as a list with their data offsets
 * assigned at add time: offset = previous end rounded up to the
 * alignment. Writing is then one sequential pass: header, metadata,
 * tensor infos, padding, and each tensor's bytes followed by padding. A
 * tensor's bytes come from a borrowed pointer or from a fill callback into
 * one scratch buffer reused across tensors, so memory stays at the size
 * of the largest tensor.
 *
 * The random llama generator built on this writer is gguf_gen.c.
 */
#include "gpu/gguf/gguf_write.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "conf/util.h"

/* ---- growable buffer (struct kvd_buf, conf/util.h) ------------------------- */

static int gw_buf_u32(struct kvd_buf *b, uint32_t v) { return kvd_buf_add(b, &v, 4); }
static int gw_buf_u64(struct kvd_buf *b, uint64_t v) { return kvd_buf_add(b, &v, 8); }

static int gw_buf_str(struct kvd_buf *b, const char *s, size_t n)
{
	int rc = gw_buf_u64(b, n);

	return rc ? rc : kvd_buf_add(b, s, n);
}

/* ---- writer ------------------------------------------------------------ */

struct gw_tensor {
	char *name;
	enum ggml_type type;
	uint32_t n_dims;
	uint64_t ne[GGUF_MAX_DIMS];
	uint64_t offset;      /* in the data section */
	uint64_t nbytes;
	const void *data;     /* borrowed, or NULL with fill */
	gguf_fill_fn fill;
	void *ctx;
};

struct gguf_writer {
	uint32_t alignment;
	uint64_t n_kv;
	struct kvd_buf meta;       /* serialized key/values */
	struct kvd_buf keys;       /* NUL-separated keys, for duplicates */
	struct gw_tensor *tensors; /* (n_tensors) */
	uint64_t n_tensors;
	uint64_t cap_tensors;
	uint64_t data_end;         /* end of the last tensor's data */
	void **owned;              /* (n_owned) freed with the writer */
	size_t n_owned;
};

void gguf_writer_free(struct gguf_writer *w)
{
	if (!w)
		return;
	kvd_buf_deinit(&w->meta);
	kvd_buf_deinit(&w->keys);
	for (uint64_t i = 0; i < w->n_tensors; i++)
		free(w->tensors[i].name);
	free(w->tensors);
	for (size_t i = 0; i < w->n_owned; i++)
		free(w->owned[i]);
	free(w->owned);
	free(w);
}

int gguf_writer_attach(struct gguf_writer *w, void *p)
{
	void **n = realloc(w->owned, (w->n_owned + 1) * sizeof(*n));

	if (!n) {
		free(p);
		return -ENOMEM;
	}
	w->owned = n;
	w->owned[w->n_owned++] = p;
	return 0;
}

static int gw_key(struct gguf_writer *w, const char *key, enum gguf_vtype t)
{
	size_t n = strlen(key);
	int rc;

	if (!n)
		return -EINVAL;
	for (size_t at = 0; at < w->keys.len;) {
		const char *k = (const char *)w->keys.p + at;
		size_t kl = strlen(k);
		if (kl == n && !memcmp(k, key, n))
			return -EEXIST;
		at += kl + 1;
	}
	if ((rc = kvd_buf_add(&w->keys, key, n + 1)) ||
	    (rc = gw_buf_str(&w->meta, key, n)) ||
	    (rc = gw_buf_u32(&w->meta, t)))
		return rc;
	w->n_kv++;
	return 0;
}

static int gw_scalar(struct gguf_writer *w, const char *key,
		     enum gguf_vtype t, const void *v)
{
	int rc = gw_key(w, key, t);

	return rc ? rc : kvd_buf_add(&w->meta, v, gguf_vtype_size(t));
}

int gguf_writer_new(struct gguf_writer **out, uint32_t alignment)
{
	_cleanup_(gguf_writer_freep) struct gguf_writer *w = NULL;
	int rc;

	if (!alignment)
		alignment = 32;
	if (alignment & (alignment - 1))
		return -EINVAL;
	w = calloc(1, sizeof(*w));
	if (!w)
		return -ENOMEM;
	w->alignment = alignment;
	if ((rc = gguf_writer_add_u32(w, "general.alignment", alignment)))
		return rc;
	*out = kvd_steal(&w);
	return 0;
}

int gguf_writer_add_u8(struct gguf_writer *w, const char *key, uint8_t v)
{ return gw_scalar(w, key, GGUF_VT_UINT8, &v); }
int gguf_writer_add_i8(struct gguf_writer *w, const char *key, int8_t v)
{ return gw_scalar(w, key, GGUF_VT_INT8, &v); }
int gguf_writer_add_u16(struct gguf_writer *w, const char *key, uint16_t v)
{ return gw_scalar(w, key, GGUF_VT_UINT16, &v); }
int gguf_writer_add_i16(struct gguf_writer *w, const char *key, int16_t v)
{ return gw_scalar(w, key, GGUF_VT_INT16, &v); }
int gguf_writer_add_u32(struct gguf_writer *w, const char *key, uint32_t v)
{ return gw_scalar(w, key, GGUF_VT_UINT32, &v); }
int gguf_writer_add_i32(struct gguf_writer *w, const char *key, int32_t v)
{ return gw_scalar(w, key, GGUF_VT_INT32, &v); }
int gguf_writer_add_u64(struct gguf_writer *w, const char *key, uint64_t v)
{ return gw_scalar(w, key, GGUF_VT_UINT64, &v); }
int gguf_writer_add_i64(struct gguf_writer *w, const char *key, int64_t v)
{ return gw_scalar(w, key, GGUF_VT_INT64, &v); }
int gguf_writer_add_f32(struct gguf_writer *w, const char *key, float v)
{ return gw_scalar(w, key, GGUF_VT_FLOAT32, &v); }
int gguf_writer_add_f64(struct gguf_writer *w, const char *key, double v)
{ return gw_scalar(w, key, GGUF_VT_FLOAT64, &v); }

int gguf_writer_add_bool(struct gguf_writer *w, const char *key, bool v)
{
	uint8_t b = v;

	return gw_scalar(w, key, GGUF_VT_BOOL, &b);
}

int gguf_writer_add_str(struct gguf_writer *w, const char *key, const char *v)
{
	int rc = gw_key(w, key, GGUF_VT_STRING);

	return rc ? rc : gw_buf_str(&w->meta, v, strlen(v));
}

int gguf_writer_add_arr(struct gguf_writer *w, const char *key,
			enum gguf_vtype t, const void *data, uint64_t n)
{
	size_t esz = gguf_vtype_size(t), bytes;
	int rc;

	if (!esz || kvd_mul_size(esz, n, &bytes))
		return -EINVAL;
	if ((rc = gw_key(w, key, GGUF_VT_ARRAY)) ||
	    (rc = gw_buf_u32(&w->meta, t)) ||
	    (rc = gw_buf_u64(&w->meta, n)))
		return rc;
	return kvd_buf_add(&w->meta, data, bytes);
}

int gguf_writer_add_arr_str(struct gguf_writer *w, const char *key,
			    const char *const *strs, uint64_t n)
{
	int rc;

	if ((rc = gw_key(w, key, GGUF_VT_ARRAY)) ||
	    (rc = gw_buf_u32(&w->meta, GGUF_VT_STRING)) ||
	    (rc = gw_buf_u64(&w->meta, n)))
		return rc;
	for (uint64_t i = 0; i < n; i++)
		if ((rc = gw_buf_str(&w->meta, strs[i], strlen(strs[i]))))
			return rc;
	return 0;
}

static uint64_t gw_align(uint64_t x, uint64_t a)
{
	return (x + a - 1) & ~(a - 1);
}

int gguf_writer_add_tensor(struct gguf_writer *w, const char *name,
			   enum ggml_type type, uint32_t n_dims,
			   const uint64_t *ne, const void *data,
			   gguf_fill_fn fill, void *ctx)
{
	struct gw_tensor *t;
	uint64_t n = 1;

	if (n_dims < 1 || n_dims > GGUF_MAX_DIMS || !name[0] ||
	    (!data) == (!fill) || !ggml_type_block(type))
		return -EINVAL;
	for (uint32_t d = 0; d < n_dims; d++)
		if (!ne[d] || __builtin_mul_overflow(n, ne[d], &n))
			return -EINVAL;
	if (ne[0] % ggml_type_block(type))
		return -EINVAL;
	for (uint64_t i = 0; i < w->n_tensors; i++)
		if (!strcmp(w->tensors[i].name, name))
			return -EEXIST;
	if (w->n_tensors == w->cap_tensors) {
		uint64_t cap = w->cap_tensors ? 2 * w->cap_tensors : 16;
		t = realloc(w->tensors, cap * sizeof(*t));
		if (!t)
			return -ENOMEM;
		w->tensors = t;
		w->cap_tensors = cap;
	}
	t = &w->tensors[w->n_tensors];
	*t = (struct gw_tensor){ .type = type, .n_dims = n_dims,
				 .data = data, .fill = fill, .ctx = ctx };
	t->name = strdup(name);
	if (!t->name)
		return -ENOMEM;
	for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++)
		t->ne[d] = d < n_dims ? ne[d] : 1;
	t->nbytes = ggml_type_nbytes(type, n);
	t->offset = gw_align(w->data_end, w->alignment);
	w->data_end = t->offset + t->nbytes;
	w->n_tensors++;
	return 0;
}

static int gw_write(FILE *fp, const void *p, size_t n)
{
	if (n && fwrite(p, 1, n, fp) != n)
		return errno ? -errno : -EIO;
	return 0;
}

static int gw_pad(FILE *fp, uint64_t pos, uint64_t align)
{
	static const uint8_t zeros[256];
	uint64_t pad = gw_align(pos, align) - pos;
	int rc = 0;

	while (pad && !rc) {
		size_t n = pad < sizeof(zeros) ? pad : sizeof(zeros);
		rc = gw_write(fp, zeros, n);
		pad -= n;
	}
	return rc;
}

int gguf_writer_write_stream(struct gguf_writer *w, FILE *fp)
{
	struct kvd_buf hdr = KVD_BUF_NULL;
	_cleanup_free_ uint8_t *scratch = NULL; /* (largest nbytes) fill target */
	uint64_t max = 0, pos;
	int rc;

	rc = kvd_buf_add(&hdr, "GGUF", 4);
	if (!rc) rc = gw_buf_u32(&hdr, 3);
	if (!rc) rc = gw_buf_u64(&hdr, w->n_tensors);
	if (!rc) rc = gw_buf_u64(&hdr, w->n_kv);
	if (!rc) rc = kvd_buf_add(&hdr, w->meta.p, w->meta.len);
	for (uint64_t i = 0; i < w->n_tensors && !rc; i++) {
		const struct gw_tensor *t = &w->tensors[i];
		rc = gw_buf_str(&hdr, t->name, strlen(t->name));
		if (!rc) rc = gw_buf_u32(&hdr, t->n_dims);
		for (uint32_t d = 0; d < t->n_dims && !rc; d++)
			rc = gw_buf_u64(&hdr, t->ne[d]);
		if (!rc) rc = gw_buf_u32(&hdr, t->type);
		if (!rc) rc = gw_buf_u64(&hdr, t->offset);
		if (t->fill && t->nbytes > max)
			max = t->nbytes;
	}
	if (!rc)
		rc = gw_write(fp, hdr.p, hdr.len);
	if (!rc)
		rc = gw_pad(fp, hdr.len, w->alignment);
	kvd_buf_deinit(&hdr);
	if (rc)
		return rc;
	if (max && !(scratch = malloc(max)))
		return -ENOMEM;
	pos = 0;
	for (uint64_t i = 0; i < w->n_tensors; i++) {
		const struct gw_tensor *t = &w->tensors[i];
		const void *src = t->data;
		if ((rc = gw_pad(fp, pos, w->alignment)))
			return rc;
		pos = t->offset;
		if (t->fill) {
			memset(scratch, 0, t->nbytes);
			if ((rc = t->fill(t->ctx, i, scratch, t->nbytes)))
				return rc;
			src = scratch;
		}
		if ((rc = gw_write(fp, src, t->nbytes)))
			return rc;
		pos += t->nbytes;
	}
	if ((rc = gw_pad(fp, pos, w->alignment)))
		return rc;
	return fflush(fp) ? -errno : 0;
}

int gguf_writer_write(struct gguf_writer *w, const char *path)
{
	_cleanup_free_ char *tmp = NULL;
	FILE *fp;
	int rc;

	if (asprintf(&tmp, "%s.tmp", path) < 0)
		return -ENOMEM;
	fp = fopen(tmp, "wb");
	if (!fp)
		return -errno;
	setvbuf(fp, NULL, _IOFBF, 1 << 20);
	rc = gguf_writer_write_stream(w, fp);
	if (fclose(fp) && !rc)
		rc = -errno;
	if (!rc && rename(tmp, path) < 0)
		rc = -errno;
	if (rc)
		unlink(tmp);
	return rc;
}

/* ---- conversions --------------------------------------------------------- */

uint16_t gguf_f32_to_f16(float f)
{
	uint32_t x, sign, exp, mant;

	memcpy(&x, &f, 4);
	sign = (x >> 16) & 0x8000;
	exp = (x >> 23) & 0xff;
	mant = x & 0x7fffff;
	if (exp == 0xff) /* inf / nan */
		return (uint16_t)(sign | 0x7c00 | (mant ? 0x200 : 0));
	int e = (int)exp - 127 + 15;
	if (e >= 31)
		return (uint16_t)(sign | 0x7c00);
	if (e <= 0) {
		/* subnormal half (or zero): shift the implicit 1 in */
		if (e < -10)
			return (uint16_t)sign;
		mant |= 0x800000;
		unsigned shift = (unsigned)(14 - e);
		uint32_t h = mant >> shift;
		uint32_t rem = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
		if (rem > half || (rem == half && (h & 1)))
			h++;
		return (uint16_t)(sign | h);
	}
	uint32_t h = sign | ((uint32_t)e << 10) | (mant >> 13);
	uint32_t rem = mant & 0x1fff;
	if (rem > 0x1000 || (rem == 0x1000 && (h & 1)))
		h++; /* may carry into the exponent, which is right */
	return (uint16_t)h;
}

float gguf_f16_to_f32(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000) << 16;
	uint32_t exp = (h >> 10) & 0x1f, mant = h & 0x3ff, x;
	float f;

	if (exp == 0) {
		f = ldexpf((float)mant, -24);
		return sign ? -f : f;
	}
	if (exp == 31)
		x = sign | 0x7f800000 | (mant << 13);
	else
		x = sign | ((exp - 15 + 127) << 23) | (mant << 13);
	memcpy(&f, &x, 4);
	return f;
}

void gguf_quantize_q8_0(const float *x, uint64_t n, void *dst)
{
	uint8_t *out = dst; /* (n / 32) blocks of { f16 d; int8 q[32] } */

	for (uint64_t b = 0; b < n / 32; b++, x += 32, out += 34) {
		float amax = 0;
		for (int i = 0; i < 32; i++)
			amax = fmaxf(amax, fabsf(x[i]));
		float d = amax / 127.0f;
		float id = d ? 1.0f / d : 0.0f;
		uint16_t dh = gguf_f32_to_f16(d);
		memcpy(out, &dh, 2);
		for (int i = 0; i < 32; i++) {
			float q = roundf(x[i] * id);
			q = q > 127 ? 127 : q < -127 ? -127 : q;
			out[2 + i] = (uint8_t)(int8_t)q;
		}
	}
}

void gguf_quantize_q4_0(const float *x, uint64_t n, void *dst)
{
	/* (n / 32) blocks of { f16 d; u8 qs[16] }: element j is the low
	 * nibble of qs[j], element j+16 the high one; value = (nib - 8) * d.
	 * d carries the sign of the largest magnitude so that element maps
	 * to nibble 0 (-8 x d) and the rest fall within [-8, 7]. */
	uint8_t *out = dst;

	for (uint64_t b = 0; b < n / 32; b++, x += 32, out += 18) {
		float big = 0;

		for (int i = 0; i < 32; i++)
			if (fabsf(x[i]) > fabsf(big))
				big = x[i];
		float d = big / -8.0f;
		float id = d ? 1.0f / d : 0.0f;
		uint16_t dh = gguf_f32_to_f16(d);

		memcpy(out, &dh, 2);
		for (int j = 0; j < 16; j++) {
			int lo = (int)lroundf(x[j] * id) + 8;
			int hi = (int)lroundf(x[j + 16] * id) + 8;

			lo = lo < 0 ? 0 : lo > 15 ? 15 : lo;
			hi = hi < 0 ? 0 : hi > 15 ? 15 : hi;
			out[2 + j] = (uint8_t)(lo | hi << 4);
		}
	}
}
