/* gguf.c - GGUF v2/v3 reader over a read-only mapping.
 *
 * Design. The file is mapped once; every string, array and tensor the
 * caller sees points into that mapping, so opening a model costs one pass
 * over its header and no copies. The parse is a cursor (`struct rd`) that
 * refuses to move past the end of the mapping: each read checks the bytes
 * it needs against what is left with overflow-safe arithmetic first, and
 * every failure records the byte offset where it happened. Counts that
 * decide an allocation (n_kv, n_tensors, string array lengths) are bounded
 * by the bytes left before anything is allocated, so a 40-byte file cannot
 * ask for 2^63 entries.
 *
 * Layout (little endian, v2 and v3 identical; v1 used 32-bit counts and is
 * refused):
 *   "GGUF" u32 version u64 n_tensors u64 n_kv
 *   n_kv    x { str key, u32 type, value }
 *   n_tensors x { str name, u32 n_dims, u64 ne[n_dims], u32 type, u64 off }
 *   padding to general.alignment, then the data section.
 * A str is u64 len + bytes; an array is u32 elem type + u64 n + elements.
 * Nested arrays are legal in the spec but no model uses them: refused.
 *
 * After the walk the tensors are checked as a set: known type, ne[0] a
 * multiple of the block, data aligned and inside the file, names unique
 * and no two data ranges overlapping (sorted by offset, adjacent pairs).
 *
 * The llama part reads the hyperparameters and then checks the graph's
 * tensors against them, so a file that lies about its shapes or vocabulary
 * is refused here with the tensor's name rather than crashing the engine.
 */
#include "gpu/gguf/gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "conf/util.h"

#define GGUF_MAGIC "GGUF"
#define GGUF_DEFAULT_ALIGNMENT 32

/* ---- errors ------------------------------------------------------------ */

int gguf_error_set(struct gguf_error *err, int code, uint64_t off,
		   const char *fmt, ...)
{
	va_list ap;

	if (err) {
		err->code = code;
		err->offset = off;
		va_start(ap, fmt);
		vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
		va_end(ap);
	}
	return code;
}


const char *gguf_strerror(int code)
{
	switch (code) {
	case 0: return "ok";
	case GGUF_E_MAGIC: return "not a GGUF file";
	case GGUF_E_VERSION: return "unsupported GGUF version";
	case GGUF_E_TRUNCATED: return "truncated";
	case GGUF_E_MALFORMED: return "malformed";
	case GGUF_E_TENSOR: return "bad tensor";
	case GGUF_E_MISSING: return "missing key";
	case GGUF_E_TYPE: return "wrong key type";
	case GGUF_E_ARCH: return "unsupported architecture";
	case GGUF_E_UNSUPPORTED: return "unsupported tensor type";
	default: return code < 0 ? strerror(-code) : "unknown error";
	}
}

const char *gguf_error_msg(int rc, const struct gguf_error *err)
{
	return rc < 0 ? strerror(-rc) : err->msg;
}

/* ---- type tables ------------------------------------------------------- */

struct ggml_type_info {
	const char *name;
	uint32_t block;     /* elements per block */
	uint32_t bytes;     /* bytes per block */
};

static const struct ggml_type_info ggml_types[] = {
	[GGML_TYPE_F32] = { "f32", 1, 4 },
	[GGML_TYPE_F16] = { "f16", 1, 2 },
	[GGML_TYPE_Q4_0] = { "q4_0", 32, 2 + 16 },
	[GGML_TYPE_Q4_1] = { "q4_1", 32, 4 + 16 },
	[GGML_TYPE_Q5_0] = { "q5_0", 32, 2 + 4 + 16 },
	[GGML_TYPE_Q5_1] = { "q5_1", 32, 4 + 4 + 16 },
	[GGML_TYPE_Q8_0] = { "q8_0", 32, 2 + 32 },
	[GGML_TYPE_Q8_1] = { "q8_1", 32, 4 + 32 },
	[GGML_TYPE_Q2_K] = { "q2_k", 256, 16 + 64 + 4 },
	[GGML_TYPE_Q3_K] = { "q3_k", 256, 32 + 64 + 12 + 2 },
	[GGML_TYPE_Q4_K] = { "q4_k", 256, 4 + 12 + 128 },
	[GGML_TYPE_Q5_K] = { "q5_k", 256, 4 + 12 + 32 + 128 },
	[GGML_TYPE_Q6_K] = { "q6_k", 256, 128 + 64 + 16 + 2 },
	[GGML_TYPE_Q8_K] = { "q8_k", 256, 4 + 256 + 32 },
	[GGML_TYPE_I8] = { "i8", 1, 1 },
	[GGML_TYPE_I16] = { "i16", 1, 2 },
	[GGML_TYPE_I32] = { "i32", 1, 4 },
	[GGML_TYPE_I64] = { "i64", 1, 8 },
	[GGML_TYPE_F64] = { "f64", 1, 8 },
	[GGML_TYPE_BF16] = { "bf16", 1, 2 },
};

static const struct ggml_type_info *ggml_type_info(enum ggml_type t)
{
	if ((unsigned)t >= KVD_ARRAY_SIZE(ggml_types) || !ggml_types[t].name)
		return NULL;
	return &ggml_types[t];
}

const char *ggml_type_name(enum ggml_type t)
{
	const struct ggml_type_info *ti = ggml_type_info(t);

	return ti ? ti->name : "unknown";
}

uint32_t ggml_type_block(enum ggml_type t)
{
	const struct ggml_type_info *ti = ggml_type_info(t);

	return ti ? ti->block : 0;
}

uint64_t ggml_type_nbytes(enum ggml_type t, uint64_t n)
{
	const struct ggml_type_info *ti = ggml_type_info(t);
	uint64_t r;

	if (!ti || n % ti->block)
		return 0;
	if (__builtin_mul_overflow(n / ti->block, (uint64_t)ti->bytes, &r))
		return 0;
	return r;
}

static const size_t gguf_vtype_sizes[] = {
	[GGUF_VT_UINT8] = 1, [GGUF_VT_INT8] = 1, [GGUF_VT_UINT16] = 2,
	[GGUF_VT_INT16] = 2, [GGUF_VT_UINT32] = 4, [GGUF_VT_INT32] = 4,
	[GGUF_VT_FLOAT32] = 4, [GGUF_VT_BOOL] = 1, [GGUF_VT_STRING] = 0,
	[GGUF_VT_ARRAY] = 0, [GGUF_VT_UINT64] = 8, [GGUF_VT_INT64] = 8,
	[GGUF_VT_FLOAT64] = 8,
};

static const char *const gguf_vtype_names[] = {
	[GGUF_VT_UINT8] = "u8", [GGUF_VT_INT8] = "i8", [GGUF_VT_UINT16] = "u16",
	[GGUF_VT_INT16] = "i16", [GGUF_VT_UINT32] = "u32",
	[GGUF_VT_INT32] = "i32", [GGUF_VT_FLOAT32] = "f32",
	[GGUF_VT_BOOL] = "bool", [GGUF_VT_STRING] = "string",
	[GGUF_VT_ARRAY] = "array", [GGUF_VT_UINT64] = "u64",
	[GGUF_VT_INT64] = "i64", [GGUF_VT_FLOAT64] = "f64",
};

static bool gguf_vtype_valid(uint32_t t)
{
	return t <= GGUF_VT_FLOAT64;
}

size_t gguf_vtype_size(enum gguf_vtype t)
{
	return gguf_vtype_valid(t) ? gguf_vtype_sizes[t] : 0;
}

const char *gguf_vtype_name(enum gguf_vtype t)
{
	return gguf_vtype_valid(t) ? gguf_vtype_names[t] : "unknown";
}

bool gguf_str_eq(struct gguf_str s, const char *c)
{
	size_t n = strlen(c);

	return s.len == n && memcmp(s.ptr, c, n) == 0;
}

/* Print at most `max` bytes of a mapping string for a message, replacing
 * control bytes so an error line stays one line. */
static const char *gguf__show(char *buf, size_t size, struct gguf_str s)
{
	size_t n = 0;

	for (uint64_t i = 0; i < s.len && n + 4 < size; i++) {
		unsigned char c = (unsigned char)s.ptr[i];
		buf[n++] = (c < 0x20 || c == 0x7f) ? '?' : (char)c;
	}
	if (s.len > 0 && n + 4 >= size) {
		memcpy(buf + n, "...", 3);
		n += 3;
	}
	buf[n] = '\0';
	return buf;
}

/* ---- cursor ------------------------------------------------------------ */

struct rd {
	const uint8_t *map;
	uint64_t size;
	uint64_t pos;
	struct gguf_error *err;
};

static int rd_need(struct rd *r, uint64_t n, const char *what)
{
	if (n > r->size - r->pos)
		return gguf_error_set(r->err, GGUF_E_TRUNCATED, r->pos,
				  "%s at offset %llu needs %llu bytes, %llu left",
				  what, (unsigned long long)r->pos,
				  (unsigned long long)n,
				  (unsigned long long)(r->size - r->pos));
	return 0;
}

static int rd_u32(struct rd *r, uint32_t *v, const char *what)
{
	int rc = rd_need(r, 4, what);

	if (rc)
		return rc;
	memcpy(v, r->map + r->pos, 4);
	r->pos += 4;
	return 0;
}

static int rd_u64(struct rd *r, uint64_t *v, const char *what)
{
	int rc = rd_need(r, 8, what);

	if (rc)
		return rc;
	memcpy(v, r->map + r->pos, 8);
	r->pos += 8;
	return 0;
}

static int rd_str(struct rd *r, struct gguf_str *s, const char *what)
{
	uint64_t at = r->pos, len;
	int rc = rd_u64(r, &len, what);

	if (rc)
		return rc;
	if (len > r->size - r->pos)
		return gguf_error_set(r->err, GGUF_E_TRUNCATED, at,
				  "%s at offset %llu: string length %llu runs past the end (%llu bytes left)",
				  what, (unsigned long long)at,
				  (unsigned long long)len,
				  (unsigned long long)(r->size - r->pos));
	s->ptr = (const char *)r->map + r->pos;
	s->len = len;
	r->pos += len;
	return 0;
}

/* ---- metadata ---------------------------------------------------------- */

/* Parse one array's header and elements; builds the string index. */
static int gguf__read_array(struct rd *r, struct gguf_kv *kv,
			    const char *key)
{
	uint32_t at;
	uint64_t n, bytes, type_off = r->pos;
	size_t esz;
	int rc;

	if ((rc = rd_u32(r, &at, "array type")))
		return rc;
	if (!gguf_vtype_valid(at))
		return gguf_error_set(r->err, GGUF_E_MALFORMED, type_off,
				  "key '%s': array element type %u unknown (offset %llu)",
				  key, at, (unsigned long long)type_off);
	if (at == GGUF_VT_ARRAY)
		return gguf_error_set(r->err, GGUF_E_MALFORMED, type_off,
				  "key '%s': nested arrays are not supported (offset %llu)",
				  key, (unsigned long long)type_off);
	uint64_t len_off = r->pos;
	if ((rc = rd_u64(r, &n, "array length")))
		return rc;
	kv->arr_type = at;
	kv->arr_len = n;
	kv->value = r->map + r->pos;
	esz = gguf_vtype_sizes[at];
	if (esz) {
		if (__builtin_mul_overflow(n, (uint64_t)esz, &bytes) ||
		    bytes > r->size - r->pos)
			return gguf_error_set(r->err, GGUF_E_TRUNCATED, len_off,
					  "key '%s': array of %llu %s runs past the end (offset %llu)",
					  key, (unsigned long long)n,
					  gguf_vtype_names[at],
					  (unsigned long long)len_off);
		r->pos += bytes;
		return 0;
	}
	/* Strings: each takes at least its 8-byte length. */
	if (n > (r->size - r->pos) / 8)
		return gguf_error_set(r->err, GGUF_E_TRUNCATED, len_off,
				  "key '%s': array of %llu strings cannot fit in the %llu bytes left (offset %llu)",
				  key, (unsigned long long)n,
				  (unsigned long long)(r->size - r->pos),
				  (unsigned long long)len_off);
	struct gguf_str *idx = calloc(n ? n : 1, sizeof(*idx));
	if (!idx)
		return gguf_error_set(r->err, -ENOMEM, len_off, "out of memory");
	kv->arr_str = idx;
	for (uint64_t i = 0; i < n; i++)
		if ((rc = rd_str(r, &idx[i], "array string")))
			return rc;
	return 0;
}

static int gguf__read_kv(struct rd *r, struct gguf_kv *kv)
{
	uint32_t t;
	uint64_t t_off;
	char key[96];
	int rc;

	kv->key_offset = r->pos;
	if ((rc = rd_str(r, &kv->key, "metadata key")))
		return rc;
	gguf__show(key, sizeof(key), kv->key);
	t_off = r->pos;
	if ((rc = rd_u32(r, &t, "metadata type")))
		return rc;
	if (!gguf_vtype_valid(t))
		return gguf_error_set(r->err, GGUF_E_MALFORMED, t_off,
				  "key '%s': value type %u unknown (offset %llu)",
				  key, t, (unsigned long long)t_off);
	kv->type = t;
	kv->offset = r->pos;
	kv->value = r->map + r->pos;
	if (t == GGUF_VT_ARRAY)
		return gguf__read_array(r, kv, key);
	if (t == GGUF_VT_STRING) {
		struct gguf_str s;
		return rd_str(r, &s, "string value");
	}
	if ((rc = rd_need(r, gguf_vtype_sizes[t], "metadata value")))
		return rc;
	if (t == GGUF_VT_BOOL && r->map[r->pos] > 1)
		return gguf_error_set(r->err, GGUF_E_MALFORMED, r->pos,
				  "key '%s': bool value %u (offset %llu)", key,
				  r->map[r->pos], (unsigned long long)r->pos);
	r->pos += gguf_vtype_sizes[t];
	return 0;
}

const struct gguf_kv *gguf_find(const struct gguf_file *f, const char *key)
{
	for (uint64_t i = 0; i < f->n_kv; i++)
		if (gguf_str_eq(f->kv[i].key, key))
			return &f->kv[i];
	return NULL;
}

/* Any scalar integer as i128-free pair: value fits in i64 or is a u64. */
static int gguf__scalar_int(enum gguf_vtype t, const uint8_t *p,
			    bool *neg, uint64_t *mag)
{
	union { uint8_t u8; int8_t i8; uint16_t u16; int16_t i16; uint32_t u32;
		int32_t i32; uint64_t u64; int64_t i64; } v;
	int64_t s;

	memcpy(&v, p, gguf_vtype_size(t) ? gguf_vtype_size(t) : 1);
	switch (t) {
	case GGUF_VT_UINT8: *neg = false; *mag = v.u8; return 0;
	case GGUF_VT_UINT16: *neg = false; *mag = v.u16; return 0;
	case GGUF_VT_UINT32: *neg = false; *mag = v.u32; return 0;
	case GGUF_VT_UINT64: *neg = false; *mag = v.u64; return 0;
	case GGUF_VT_INT8: s = v.i8; break;
	case GGUF_VT_INT16: s = v.i16; break;
	case GGUF_VT_INT32: s = v.i32; break;
	case GGUF_VT_INT64: s = v.i64; break;
	default: return GGUF_E_TYPE;
	}
	*neg = s < 0;
	*mag = s < 0 ? (uint64_t)0 - (uint64_t)s : (uint64_t)s;
	return 0;
}

int gguf_get_u64(const struct gguf_file *f, const char *key, uint64_t *out)
{
	const struct gguf_kv *kv = gguf_find(f, key);
	bool neg;
	uint64_t mag;

	if (!kv)
		return -ENOENT;
	if (gguf__scalar_int(kv->type, kv->value, &neg, &mag) || neg)
		return GGUF_E_TYPE;
	*out = mag;
	return 0;
}

int gguf_get_u32(const struct gguf_file *f, const char *key, uint32_t *out)
{
	uint64_t v;
	int rc = gguf_get_u64(f, key, &v);

	if (rc)
		return rc;
	if (v > UINT32_MAX)
		return GGUF_E_TYPE;
	*out = (uint32_t)v;
	return 0;
}

int gguf_get_f32(const struct gguf_file *f, const char *key, float *out)
{
	const struct gguf_kv *kv = gguf_find(f, key);
	bool neg;
	uint64_t mag;

	if (!kv)
		return -ENOENT;
	if (kv->type == GGUF_VT_FLOAT32) {
		memcpy(out, kv->value, 4);
		return 0;
	}
	if (kv->type == GGUF_VT_FLOAT64) {
		double d;
		memcpy(&d, kv->value, 8);
		*out = (float)d;
		return 0;
	}
	if (gguf__scalar_int(kv->type, kv->value, &neg, &mag))
		return GGUF_E_TYPE;
	*out = neg ? -(float)mag : (float)mag;
	return 0;
}

int gguf_get_bool(const struct gguf_file *f, const char *key, bool *out)
{
	const struct gguf_kv *kv = gguf_find(f, key);

	if (!kv)
		return -ENOENT;
	if (kv->type != GGUF_VT_BOOL)
		return GGUF_E_TYPE;
	*out = kv->value[0] != 0;
	return 0;
}

int gguf_get_str(const struct gguf_file *f, const char *key,
		 struct gguf_str *out)
{
	const struct gguf_kv *kv = gguf_find(f, key);

	if (!kv)
		return -ENOENT;
	if (kv->type != GGUF_VT_STRING)
		return GGUF_E_TYPE;
	memcpy(&out->len, kv->value, 8);
	out->ptr = (const char *)kv->value + 8;
	return 0;
}

int gguf_arr_str(const struct gguf_file *f, const struct gguf_kv *kv,
		 uint64_t i, struct gguf_str *out)
{
	(void)f;
	if (!kv || kv->type != GGUF_VT_ARRAY || kv->arr_type != GGUF_VT_STRING ||
	    !kv->arr_str)
		return GGUF_E_TYPE;
	if (i >= kv->arr_len)
		return -ERANGE;
	*out = kv->arr_str[i];
	return 0;
}

int gguf_arr_i64(const struct gguf_kv *kv, uint64_t i, int64_t *out)
{
	bool neg = false;
	uint64_t mag = 0;
	size_t esz;

	if (!kv || kv->type != GGUF_VT_ARRAY)
		return GGUF_E_TYPE;
	esz = gguf_vtype_size(kv->arr_type);
	if (!esz || kv->arr_type == GGUF_VT_FLOAT32 ||
	    kv->arr_type == GGUF_VT_FLOAT64 || kv->arr_type == GGUF_VT_BOOL)
		return GGUF_E_TYPE;
	if (i >= kv->arr_len)
		return -ERANGE;
	gguf__scalar_int(kv->arr_type, kv->value + i * esz, &neg, &mag);
	if (!neg && mag > INT64_MAX)
		return GGUF_E_TYPE;
	*out = neg ? (int64_t)(0 - mag) : (int64_t)mag;
	return 0;
}

int gguf_arr_f64(const struct gguf_kv *kv, uint64_t i, double *out)
{
	size_t esz;

	if (!kv || kv->type != GGUF_VT_ARRAY)
		return GGUF_E_TYPE;
	esz = gguf_vtype_size(kv->arr_type);
	if (!esz)
		return GGUF_E_TYPE;
	if (i >= kv->arr_len)
		return -ERANGE;
	if (kv->arr_type == GGUF_VT_FLOAT32) {
		float v;
		memcpy(&v, kv->value + i * 4, 4);
		*out = v;
		return 0;
	}
	if (kv->arr_type == GGUF_VT_FLOAT64) {
		memcpy(out, kv->value + i * 8, 8);
		return 0;
	}
	/* any integer, a uint64 past INT64_MAX included (gguf_arr_i64
	 * refuses that one: it has no int64 value, but it has a double);
	 * not a bool */
	bool neg = false;
	uint64_t mag = 0;
	if (gguf__scalar_int(kv->arr_type, kv->value + i * esz, &neg, &mag))
		return GGUF_E_TYPE;
	*out = neg ? -(double)mag : (double)mag;
	return 0;
}

/* ---- tensors ----------------------------------------------------------- */

static int gguf__read_tensor_info(struct rd *r, struct gguf_tensor *t)
{
	uint32_t nd, type;
	uint64_t at;
	char name[96];
	int rc;

	t->info_offset = r->pos;
	if ((rc = rd_str(r, &t->name, "tensor name")))
		return rc;
	gguf__show(name, sizeof(name), t->name);
	at = r->pos;
	if ((rc = rd_u32(r, &nd, "tensor n_dims")))
		return rc;
	if (nd < 1 || nd > GGUF_MAX_DIMS)
		return gguf_error_set(r->err, GGUF_E_TENSOR, at,
				  "tensor '%s': n_dims %u not in 1..%d (offset %llu)",
				  name, nd, GGUF_MAX_DIMS,
				  (unsigned long long)at);
	t->n_dims = nd;
	for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++)
		t->ne[d] = 1;
	for (uint32_t d = 0; d < nd; d++) {
		at = r->pos;
		if ((rc = rd_u64(r, &t->ne[d], "tensor dimension")))
			return rc;
		if (t->ne[d] == 0 || t->ne[d] > INT64_MAX)
			return gguf_error_set(r->err, GGUF_E_TENSOR, at,
					  "tensor '%s': ne[%u] = %llu invalid (offset %llu)",
					  name, d, (unsigned long long)t->ne[d],
					  (unsigned long long)at);
	}
	at = r->pos;
	if ((rc = rd_u32(r, &type, "tensor type")))
		return rc;
	t->type = type;
	if ((rc = rd_u64(r, &t->offset, "tensor offset")))
		return rc;
	const struct ggml_type_info *ti = ggml_type_info(type);
	if (!ti)
		return gguf_error_set(r->err, GGUF_E_UNSUPPORTED, at,
				  "tensor '%s': ggml type %u unknown (offset %llu)",
				  name, type, (unsigned long long)at);
	uint64_t n = 1;
	for (uint32_t d = 0; d < nd; d++)
		if (__builtin_mul_overflow(n, t->ne[d], &n) || n > INT64_MAX)
			return gguf_error_set(r->err, GGUF_E_TENSOR, t->info_offset,
					  "tensor '%s': element count overflows (offset %llu)",
					  name, (unsigned long long)t->info_offset);
	if (t->ne[0] % ti->block)
		return gguf_error_set(r->err, GGUF_E_TENSOR, t->info_offset,
				  "tensor '%s': ne[0] = %llu is not a multiple of the %s block of %u (offset %llu)",
				  name, (unsigned long long)t->ne[0], ti->name,
				  ti->block, (unsigned long long)t->info_offset);
	t->nbytes = ggml_type_nbytes(type, n);
	if (!t->nbytes)
		return gguf_error_set(r->err, GGUF_E_TENSOR, t->info_offset,
				  "tensor '%s': byte size overflows (offset %llu)",
				  name, (unsigned long long)t->info_offset);
	return 0;
}

static int gguf__cmp_name(const void *a, const void *b)
{
	const struct gguf_tensor *x = *(const struct gguf_tensor *const *)a;
	const struct gguf_tensor *y = *(const struct gguf_tensor *const *)b;
	uint64_t n = KVD_MIN(x->name.len, y->name.len);
	int c = n ? memcmp(x->name.ptr, y->name.ptr, n) : 0;

	if (c)
		return c;
	return (x->name.len > y->name.len) - (x->name.len < y->name.len);
}

static int gguf__cmp_offset(const void *a, const void *b)
{
	const struct gguf_tensor *x = *(const struct gguf_tensor *const *)a;
	const struct gguf_tensor *y = *(const struct gguf_tensor *const *)b;

	return (x->offset > y->offset) - (x->offset < y->offset);
}

static int gguf__cmp_key(const void *a, const void *b)
{
	const struct gguf_kv *x = *(const struct gguf_kv *const *)a;
	const struct gguf_kv *y = *(const struct gguf_kv *const *)b;
	uint64_t n = KVD_MIN(x->key.len, y->key.len);
	int c = n ? memcmp(x->key.ptr, y->key.ptr, n) : 0;

	if (c)
		return c;
	return (x->key.len > y->key.len) - (x->key.len < y->key.len);
}

/* Place every tensor in the data section and check the set: aligned,
 * inside the file, unique names, no overlaps. */
static int gguf__check_tensors(struct gguf_file *f, struct gguf_error *err)
{
	char name[96], name2[96];
	uint64_t avail = f->size - f->data_offset;
	_cleanup_free_ const struct gguf_tensor **v = NULL;

	if (!f->n_tensors)
		return 0;
	for (uint64_t i = 0; i < f->n_tensors; i++) {
		struct gguf_tensor *t = &f->tensors[i];
		gguf__show(name, sizeof(name), t->name);
		if (t->offset % f->alignment)
			return gguf_error_set(err, GGUF_E_TENSOR, t->info_offset,
					  "tensor '%s': data offset %llu is not a multiple of the alignment %llu (offset %llu)",
					  name, (unsigned long long)t->offset,
					  (unsigned long long)f->alignment,
					  (unsigned long long)t->info_offset);
		if (t->offset > avail || t->nbytes > avail - t->offset)
			return gguf_error_set(err, GGUF_E_TRUNCATED, t->info_offset,
					  "tensor '%s': data [%llu, +%llu) runs past the end of the file (data section holds %llu bytes; offset %llu)",
					  name, (unsigned long long)t->offset,
					  (unsigned long long)t->nbytes,
					  (unsigned long long)avail,
					  (unsigned long long)t->info_offset);
		t->data = f->map + f->data_offset + t->offset;
	}
	v = calloc(f->n_tensors, sizeof(*v));
	if (!v)
		return gguf_error_set(err, -ENOMEM, 0, "out of memory");
	for (uint64_t i = 0; i < f->n_tensors; i++)
		v[i] = &f->tensors[i];
	qsort(v, f->n_tensors, sizeof(*v), gguf__cmp_name);
	for (uint64_t i = 1; i < f->n_tensors; i++)
		if (!gguf__cmp_name(&v[i - 1], &v[i]))
			return gguf_error_set(err, GGUF_E_TENSOR, v[i]->info_offset,
					  "tensor '%s' appears twice (offset %llu)",
					  gguf__show(name, sizeof(name), v[i]->name),
					  (unsigned long long)v[i]->info_offset);
	qsort(v, f->n_tensors, sizeof(*v), gguf__cmp_offset);
	for (uint64_t i = 1; i < f->n_tensors; i++) {
		const struct gguf_tensor *a = v[i - 1], *b = v[i];
		if (a->offset + a->nbytes > b->offset)
			return gguf_error_set(err, GGUF_E_TENSOR, b->info_offset,
					  "tensors '%s' and '%s' overlap at data offset %llu (offset %llu)",
					  gguf__show(name, sizeof(name), a->name),
					  gguf__show(name2, sizeof(name2), b->name),
					  (unsigned long long)b->offset,
					  (unsigned long long)b->info_offset);
	}
	return 0;
}

static int gguf__check_keys(struct gguf_file *f, struct gguf_error *err)
{
	_cleanup_free_ const struct gguf_kv **v = NULL;
	char key[96];

	if (f->n_kv < 2)
		return 0;
	v = calloc(f->n_kv, sizeof(*v));
	if (!v)
		return gguf_error_set(err, -ENOMEM, 0, "out of memory");
	for (uint64_t i = 0; i < f->n_kv; i++)
		v[i] = &f->kv[i];
	qsort(v, f->n_kv, sizeof(*v), gguf__cmp_key);
	for (uint64_t i = 1; i < f->n_kv; i++)
		if (!gguf__cmp_key(&v[i - 1], &v[i]))
			return gguf_error_set(err, GGUF_E_MALFORMED, v[i]->key_offset,
					  "key '%s' appears twice (offset %llu)",
					  gguf__show(key, sizeof(key), v[i]->key),
					  (unsigned long long)v[i]->key_offset);
	return 0;
}

static int gguf__alignment(struct gguf_file *f, struct gguf_error *err)
{
	const struct gguf_kv *kv = gguf_find(f, "general.alignment");
	uint64_t a;

	f->alignment = GGUF_DEFAULT_ALIGNMENT;
	if (!kv)
		return 0;
	if (gguf_get_u64(f, "general.alignment", &a))
		return gguf_error_set(err, GGUF_E_TYPE, kv->offset,
				  "key 'general.alignment' has type %s, want an unsigned integer (offset %llu)",
				  gguf_vtype_name(kv->type),
				  (unsigned long long)kv->offset);
	if (a == 0 || (a & (a - 1)) || a > (1u << 30))
		return gguf_error_set(err, GGUF_E_MALFORMED, kv->offset,
				  "general.alignment = %llu is not a power of two in 1..2^30 (offset %llu)",
				  (unsigned long long)a,
				  (unsigned long long)kv->offset);
	f->alignment = a;
	return 0;
}

static void gguf__free(struct gguf_file *f)
{
	if (!f)
		return;
	if (f->kv)
		for (uint64_t i = 0; i < f->n_kv; i++)
			free((void *)f->kv[i].arr_str);
	free(f->kv);
	free(f->tensors);
	if (f->owns_map && f->map)
		munmap((void *)f->map, f->size);
	free(f);
}

static void gguf__freep(struct gguf_file **f)
{
	gguf__free(*f);
}

static int gguf__parse(struct gguf_file *f, struct gguf_error *err)
{
	struct rd r = { .map = f->map, .size = f->size, .pos = 0, .err = err };
	uint64_t n_tensors, n_kv, at;
	int rc;

	if (f->size < 4 || memcmp(f->map, GGUF_MAGIC, 4))
		return gguf_error_set(err, f->size < 4 ? GGUF_E_TRUNCATED : GGUF_E_MAGIC, 0,
				  "no GGUF magic at offset 0 (file has %zu bytes)",
				  f->size);
	r.pos = 4;
	if ((rc = rd_u32(&r, &f->version, "version")))
		return rc;
	if (f->version != 2 && f->version != 3)
		return gguf_error_set(err, GGUF_E_VERSION, 4,
				  "GGUF version %u at offset 4; kvd reads versions 2 and 3",
				  f->version);
	at = r.pos;
	if ((rc = rd_u64(&r, &n_tensors, "tensor count")) ||
	    (rc = rd_u64(&r, &n_kv, "metadata count")))
		return rc;
	/* A key/value takes >= 8 (key len) + 4 (type) + 1 bytes; a tensor info
	 * >= 8 + 4 + 8 + 4 + 8. Bound the counts before allocating. */
	if (n_kv > (f->size - r.pos) / 13)
		return gguf_error_set(err, GGUF_E_MALFORMED, at + 8,
				  "metadata count %llu cannot fit in a %zu-byte file (offset %llu)",
				  (unsigned long long)n_kv, f->size,
				  (unsigned long long)(at + 8));
	if (n_tensors > (f->size - r.pos) / 32)
		return gguf_error_set(err, GGUF_E_MALFORMED, at,
				  "tensor count %llu cannot fit in a %zu-byte file (offset %llu)",
				  (unsigned long long)n_tensors, f->size,
				  (unsigned long long)at);
	f->kv = calloc(n_kv ? n_kv : 1, sizeof(*f->kv));
	f->tensors = calloc(n_tensors ? n_tensors : 1, sizeof(*f->tensors));
	if (!f->kv || !f->tensors)
		return gguf_error_set(err, -ENOMEM, 0, "out of memory");
	for (uint64_t i = 0; i < n_kv; i++) {
		f->n_kv = i + 1; /* so close frees a partial array index */
		if ((rc = gguf__read_kv(&r, &f->kv[i])))
			return rc;
	}
	f->n_kv = n_kv;
	if ((rc = gguf__check_keys(f, err)) || (rc = gguf__alignment(f, err)))
		return rc;
	for (uint64_t i = 0; i < n_tensors; i++)
		if ((rc = gguf__read_tensor_info(&r, &f->tensors[i])))
			return rc;
	f->n_tensors = n_tensors;
	/* The data section starts at the next multiple of the alignment. */
	uint64_t pad = (f->alignment - r.pos % f->alignment) % f->alignment;
	if (n_tensors && pad > f->size - r.pos)
		return gguf_error_set(err, GGUF_E_TRUNCATED, r.pos,
				  "file ends inside the padding before the data section (offset %llu)",
				  (unsigned long long)r.pos);
	f->data_offset = n_tensors ? r.pos + pad : KVD_MIN(r.pos + pad, f->size);
	return gguf__check_tensors(f, err);
}

int gguf_open_mem(struct gguf_file **out, const void *buf, size_t size,
		  struct gguf_error *err)
{
	_cleanup_(gguf__freep) struct gguf_file *f = NULL;
	int rc;

	if (err)
		*err = (struct gguf_error){ 0 };
	f = calloc(1, sizeof(*f));
	if (!f)
		return gguf_error_set(err, -ENOMEM, 0, "out of memory");
	f->map = buf;
	f->size = size;
	f->owns_map = false;
	if ((rc = gguf__parse(f, err)))
		return rc;
	*out = kvd_steal(&f);
	return 0;
}

int gguf_open(struct gguf_file **out, const char *path, struct gguf_error *err)
{
	_cleanup_(gguf__freep) struct gguf_file *f = NULL;
	struct stat st;
	void *map;
	int fd, rc;

	if (err)
		*err = (struct gguf_error){ 0 };
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return gguf_error_set(err, -errno, 0, "open %s: %s", path,
				  strerror(errno));
	if (fstat(fd, &st) < 0) {
		rc = -errno;
		close(fd);
		return gguf_error_set(err, rc, 0, "stat %s: %s", path, strerror(-rc));
	}
	if (!S_ISREG(st.st_mode)) {
		close(fd);
		return gguf_error_set(err, -EINVAL, 0, "%s is not a regular file", path);
	}
	if (st.st_size < 4) {
		close(fd);
		return gguf_error_set(err, GGUF_E_TRUNCATED, 0,
				  "%s has %lld bytes, too short for a GGUF header",
				  path, (long long)st.st_size);
	}
	map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
	rc = -errno;
	close(fd);
	if (map == MAP_FAILED)
		return gguf_error_set(err, rc, 0, "mmap %s: %s", path, strerror(-rc));
	f = calloc(1, sizeof(*f));
	if (!f) {
		munmap(map, (size_t)st.st_size);
		return gguf_error_set(err, -ENOMEM, 0, "out of memory");
	}
	f->map = map;
	f->size = (size_t)st.st_size;
	f->owns_map = true;
	if ((rc = gguf__parse(f, err)))
		return rc;
	*out = kvd_steal(&f);
	return 0;
}

void gguf_close(struct gguf_file *f)
{
	gguf__free(f);
}

const struct gguf_tensor *gguf_tensor_find(const struct gguf_file *f,
					   const char *name)
{
	for (uint64_t i = 0; i < f->n_tensors; i++)
		if (gguf_str_eq(f->tensors[i].name, name))
			return &f->tensors[i];
	return NULL;
}

/* ---- llama hyperparameters --------------------------------------------- */

size_t kv_dtype_size(enum kv_dtype dt)
{
	return dt == KV_DTYPE_F16 ? 2 : 4;
}

const char *kv_dtype_name(enum kv_dtype dt)
{
	return dt == KV_DTYPE_F16 ? "f16" : "f32";
}

uint64_t llama_kv_bytes_per_token(const struct llama_hparams *hp,
				  enum kv_dtype dt)
{
	return 2ull * hp->n_layer * hp->n_head_kv * hp->head_dim *
	       kv_dtype_size(dt);
}

/* File offset of a key's value, 0 when absent (for messages). */
static uint64_t hp_off(const struct gguf_file *f, const char *key)
{
	const struct gguf_kv *kv = gguf_find(f, key);

	return kv ? kv->offset : 0;
}

/* What a getter's result means for hyperparameter `key`: absent is fine
 * unless required (MISSING); a type that does not convert is TYPE. */
static int hp_result(const struct gguf_file *f, const char *key, int rc,
		     bool required, const char *want, struct gguf_error *err)
{
	const struct gguf_kv *kv;

	if (rc == -ENOENT)
		return required ? gguf_error_set(err, GGUF_E_MISSING, 0,
						 "required key '%s' is missing", key)
				: 0;
	if (rc) {
		kv = gguf_find(f, key);
		return gguf_error_set(err, GGUF_E_TYPE, kv->offset,
				      "key '%s' has type %s, want %s (offset %llu)",
				      key, gguf_vtype_name(kv->type), want,
				      (unsigned long long)kv->offset);
	}
	return 0;
}

/* Read `{arch}.suffix` as u32; required keys fail with MISSING. */
static int hp_u32(const struct gguf_file *f, const char *arch,
		  const char *suffix, bool required, uint32_t *out,
		  struct gguf_error *err)
{
	char key[128];

	snprintf(key, sizeof(key), "%s.%s", arch, suffix);
	return hp_result(f, key, gguf_get_u32(f, key, out), required,
			 "an unsigned 32-bit integer", err);
}

static int hp_f32(const struct gguf_file *f, const char *arch,
		  const char *suffix, bool required, float *out,
		  struct gguf_error *err)
{
	char key[128];

	snprintf(key, sizeof(key), "%s.%s", arch, suffix);
	return hp_result(f, key, gguf_get_f32(f, key, out), required,
			 "a number", err);
}

/* A tensor must exist (unless optional) with exactly this shape; missing
 * trailing dimensions count as 1. */
static int hp_tensor(const struct gguf_file *f, const char *name,
		     uint64_t ne0, uint64_t ne1, bool optional,
		     struct gguf_error *err)
{
	const struct gguf_tensor *t = gguf_tensor_find(f, name);

	if (!t)
		return optional ? 0 : gguf_error_set(err, GGUF_E_TENSOR, 0,
						 "tensor '%s' is missing", name);
	if (t->ne[0] != ne0 || t->ne[1] != ne1 || t->ne[2] != 1 || t->ne[3] != 1)
		return gguf_error_set(err, GGUF_E_TENSOR, t->info_offset,
				  "tensor '%s' has shape [%llu, %llu, %llu, %llu], the metadata implies [%llu, %llu] (offset %llu)",
				  name, (unsigned long long)t->ne[0],
				  (unsigned long long)t->ne[1],
				  (unsigned long long)t->ne[2],
				  (unsigned long long)t->ne[3],
				  (unsigned long long)ne0,
				  (unsigned long long)ne1,
				  (unsigned long long)t->info_offset);
	return 0;
}

static int hp_check_tensors(const struct gguf_file *f,
			    const struct llama_hparams *hp,
			    struct gguf_error *err)
{
	uint64_t e = hp->n_embd, q = (uint64_t)hp->n_head * hp->head_dim;
	uint64_t kvd = (uint64_t)hp->n_head_kv * hp->head_dim;
	char nm[96];
	int rc;

	if ((rc = hp_tensor(f, "output_norm.weight", e, 1, false, err)) ||
	    (rc = hp_tensor(f, "output.weight", e, hp->n_vocab, true, err)))
		return rc;
	for (uint32_t l = 0; l < hp->n_layer; l++) {
		/* dims: 0 = n_embd, 1 = q, 2 = kv, 3 = ff, 4 = one, 5 = head */
		static const struct {
			const char *name;
			int r0, r1;
			int only;   /* 0 all, 1 with qkv_bias, 2 with qk_norm */
		} lt[] = {
			{ "attn_norm.weight", 0, 4, 0 }, { "attn_q.weight", 0, 1, 0 },
			{ "attn_k.weight", 0, 2, 0 },    { "attn_v.weight", 0, 2, 0 },
			{ "attn_q.bias", 1, 4, 1 },      { "attn_k.bias", 2, 4, 1 },
			{ "attn_v.bias", 2, 4, 1 },
			{ "attn_q_norm.weight", 5, 4, 2 },
			{ "attn_k_norm.weight", 5, 4, 2 },
			{ "attn_output.weight", 1, 0, 0 }, { "ffn_norm.weight", 0, 4, 0 },
			{ "ffn_gate.weight", 0, 3, 0 },  { "ffn_up.weight", 0, 3, 0 },
			{ "ffn_down.weight", 3, 0, 0 },
		};
		uint64_t dims[6] = { e, q, kvd, hp->n_ff, 1, hp->head_dim };
		for (size_t i = 0; i < KVD_ARRAY_SIZE(lt); i++) {
			if ((lt[i].only == 1 && !hp->qkv_bias) ||
			    (lt[i].only == 2 && !hp->qk_norm))
				continue;
			snprintf(nm, sizeof(nm), "blk.%u.%s", l, lt[i].name);
			if ((rc = hp_tensor(f, nm, dims[lt[i].r0], dims[lt[i].r1],
					    false, err)))
				return rc;
		}
	}
	return 0;
}

/* What differs between the architectures kvd runs. qwen files carry no
 * rope.dimension_count (RoPE spans the head) and use NEOX RoPE, as
 * llama.cpp's graph does for them. */
static const struct hp_arch {
	const char *name;
	enum llama_arch id;
	enum llama_rope_mode rope;
	bool qkv_bias, qk_norm;
} hp_archs[] = {
	{ "llama", LLAMA_ARCH_LLAMA, LLAMA_ROPE_NORMAL, false, false },
	{ "qwen2", LLAMA_ARCH_QWEN2, LLAMA_ROPE_NEOX, true, false },
	{ "qwen3", LLAMA_ARCH_QWEN3, LLAMA_ROPE_NEOX, false, true },
};

/* `{arch}.suffix` into buf, for messages and lookups. */
static const char *hp_key(char *buf, size_t n, const char *arch,
			  const char *suffix)
{
	snprintf(buf, n, "%s.%s", arch, suffix);
	return buf;
}

/* general.architecture: one of hp_archs, whose row sets hp's arch,
 * arch_id, rope_mode, qkv_bias and qk_norm; *a is its name (the prefix
 * of the other keys). 0, or the error's code. */
static int hp_read_arch(const struct gguf_file *f, struct llama_hparams *hp,
			const char **a, struct gguf_error *err)
{
	struct gguf_str arch;
	const struct gguf_kv *kv;
	const struct hp_arch *ha = NULL;
	int rc;

	rc = gguf_get_str(f, "general.architecture", &arch);
	if (rc == -ENOENT)
		return gguf_error_set(err, GGUF_E_MISSING, 0,
				  "required key 'general.architecture' is missing");
	if (rc) {
		kv = gguf_find(f, "general.architecture");
		return gguf_error_set(err, GGUF_E_TYPE, kv->offset,
				  "key 'general.architecture' is not a string (offset %llu)",
				  (unsigned long long)kv->offset);
	}
	gguf__show(hp->arch, sizeof(hp->arch), arch);
	for (size_t i = 0; i < KVD_ARRAY_SIZE(hp_archs); i++)
		if (gguf_str_eq(arch, hp_archs[i].name))
			ha = &hp_archs[i];
	if (!ha) {
		kv = gguf_find(f, "general.architecture");
		return gguf_error_set(err, GGUF_E_ARCH, kv->offset,
				  "architecture '%s' is not supported; kvd runs 'llama', 'qwen2', 'qwen3' (offset %llu)",
				  hp->arch, (unsigned long long)kv->offset);
	}
	*a = ha->name;
	hp->arch_id = ha->id;
	hp->rope_mode = ha->rope;
	hp->qkv_bias = ha->qkv_bias;
	hp->qk_norm = ha->qk_norm;
	return 0;
}

/* The sizes every file names (layers, embedding, heads, feed-forward,
 * trained context, norm epsilon) and the optional KV heads (default: the
 * heads), RoPE base (10000) and linear RoPE scale (rope.scale_linear, or
 * rope.scaling.factor with rope.scaling.type "linear"), read under arch
 * a. 0, or the error's code. */
static int hp_read_sizes(const struct gguf_file *f, const char *a,
			 struct llama_hparams *hp, struct gguf_error *err)
{
	char key[128];
	float scale = 0;
	int rc;

	if ((rc = hp_u32(f, a, "block_count", true, &hp->n_layer, err)) ||
	    (rc = hp_u32(f, a, "embedding_length", true, &hp->n_embd, err)) ||
	    (rc = hp_u32(f, a, "attention.head_count", true, &hp->n_head, err)) ||
	    (rc = hp_u32(f, a, "feed_forward_length", true, &hp->n_ff, err)) ||
	    (rc = hp_u32(f, a, "context_length", true, &hp->n_ctx_train, err)) ||
	    (rc = hp_f32(f, a, "attention.layer_norm_rms_epsilon", true,
			 &hp->norm_eps, err)))
		return rc;
	hp->n_head_kv = hp->n_head;
	hp->rope_freq_base = 10000.0f;
	if ((rc = hp_u32(f, a, "attention.head_count_kv", false, &hp->n_head_kv, err)) ||
	    (rc = hp_f32(f, a, "rope.freq_base", false, &hp->rope_freq_base, err)) ||
	    (rc = hp_f32(f, a, "rope.scale_linear", false, &scale, err)))
		return rc;
	if (scale == 0) {
		struct gguf_str st;
		if (gguf_get_str(f, hp_key(key, sizeof(key), a, "rope.scaling.type"),
				 &st) == 0 &&
		    gguf_str_eq(st, "linear") &&
		    (rc = hp_f32(f, a, "rope.scaling.factor", false, &scale, err)))
			return rc;
	}
	hp->rope_freq_scale = scale > 0 ? 1.0f / scale : 1.0f;
	return 0;
}

/* The sizes checked (none zero, the heads a multiple of the KV heads)
 * and the head size: attention.key_length when given (qwen3's heads are
 * not n_embd / n_head wide), else n_embd / n_head. K and V share the KV
 * pages' kv_dim, so value_length must equal it. 0, or the error's code. */
static int hp_read_heads(const struct gguf_file *f, const char *a,
			 struct llama_hparams *hp, struct gguf_error *err)
{
	char key[128];
	uint64_t eo = hp_off(f, hp_key(key, sizeof(key), a, "embedding_length"));
	uint32_t kl = 0, vl = 0;
	int rc;

	if (hp->n_layer == 0 || hp->n_embd == 0 || hp->n_head == 0 ||
	    hp->n_head_kv == 0 || hp->n_ff == 0 || hp->n_ctx_train == 0)
		return gguf_error_set(err, GGUF_E_MALFORMED, eo,
				  "zero dimension: layers %u embd %u heads %u kv heads %u ff %u ctx %u",
				  hp->n_layer, hp->n_embd, hp->n_head,
				  hp->n_head_kv, hp->n_ff, hp->n_ctx_train);
	if (hp->n_head % hp->n_head_kv)
		return gguf_error_set(err, GGUF_E_MALFORMED,
				  hp_off(f, hp_key(key, sizeof(key), a, "attention.head_count_kv")),
				  "head_count %u is not a multiple of head_count_kv %u",
				  hp->n_head, hp->n_head_kv);
	if ((rc = hp_u32(f, a, "attention.key_length", false, &kl, err)) ||
	    (rc = hp_u32(f, a, "attention.value_length", false, &vl, err)))
		return rc;
	if (!kl && hp->n_embd % hp->n_head)
		return gguf_error_set(err, GGUF_E_MALFORMED, eo,
				  "embedding_length %u is not a multiple of head_count %u (offset %llu)",
				  hp->n_embd, hp->n_head, (unsigned long long)eo);
	hp->head_dim = kl ? kl : hp->n_embd / hp->n_head;
	if (vl && vl != hp->head_dim)
		return gguf_error_set(err, GGUF_E_UNSUPPORTED,
				  hp_off(f, hp_key(key, sizeof(key), a, "attention.value_length")),
				  "attention.value_length %u differs from key_length %u",
				  vl, hp->head_dim);
	return 0;
}

/* The RoPE dimensions (default: the head; even, in 2..head_dim), the
 * sliding window (it cuts the trained context), and the floats checked
 * plausible. 0, or the error's code. */
static int hp_read_rope(const struct gguf_file *f, const char *a,
			struct llama_hparams *hp, struct gguf_error *err)
{
	char key[128];
	int rc;

	hp->rope_dim = hp->head_dim;
	if ((rc = hp_u32(f, a, "rope.dimension_count", false, &hp->rope_dim, err)))
		return rc;
	/* Mistral-style files may name a sliding attention window. kvd
	 * attends to the whole context, which is the same computation for
	 * every position below the window, so the trained context is cut to
	 * the window: by default no request reaches a position where the two
	 * would differ. */
	hp->n_swa = 0;
	if ((rc = hp_u32(f, a, "attention.sliding_window", false, &hp->n_swa, err)))
		return rc;
	if (gguf_find(f, hp_key(key, sizeof(key), a, "attention.sliding_window")) &&
	    hp->n_swa == 0)
		return gguf_error_set(err, GGUF_E_MALFORMED,
				  hp_off(f, hp_key(key, sizeof(key), a, "attention.sliding_window")),
				  "attention.sliding_window is 0");
	if (hp->n_swa && hp->n_swa < hp->n_ctx_train)
		hp->n_ctx_train = hp->n_swa;
	if (hp->rope_dim > hp->head_dim || hp->rope_dim % 2 || !hp->rope_dim)
		return gguf_error_set(err, GGUF_E_MALFORMED,
				  hp_off(f, hp_key(key, sizeof(key), a, "rope.dimension_count")),
				  "rope.dimension_count %u must be even and in 2..head_dim (%u)",
				  hp->rope_dim, hp->head_dim);
	if (!(hp->norm_eps > 0 && hp->norm_eps < 1) ||
	    !(hp->rope_freq_base > 0) || !(hp->rope_freq_scale > 0))
		return gguf_error_set(err, GGUF_E_MALFORMED, 0,
				  "implausible float: norm eps %g, rope base %g, rope scale %g",
				  hp->norm_eps, hp->rope_freq_base,
				  hp->rope_freq_scale);
	return 0;
}

/* The vocabulary size: token_embd.weight's rows ([n_embd, n_vocab]),
 * which {a}.vocab_size and tokenizer.ggml.tokens must agree with when
 * present. 0, or the error's code. */
static int hp_read_vocab(const struct gguf_file *f, const char *a,
			 struct llama_hparams *hp, struct gguf_error *err)
{
	const struct gguf_tensor *te;
	const struct gguf_kv *kv;
	char key[128];
	int rc;

	te = gguf_tensor_find(f, "token_embd.weight");
	if (!te)
		return gguf_error_set(err, GGUF_E_TENSOR, 0,
				  "tensor 'token_embd.weight' is missing");
	if (te->ne[0] != hp->n_embd || te->n_dims != 2 || te->ne[1] > UINT32_MAX)
		return gguf_error_set(err, GGUF_E_TENSOR, te->info_offset,
				  "tensor 'token_embd.weight' has shape [%llu, %llu] (%u dims), want [n_embd=%u, n_vocab] (offset %llu)",
				  (unsigned long long)te->ne[0],
				  (unsigned long long)te->ne[1], te->n_dims,
				  hp->n_embd, (unsigned long long)te->info_offset);
	hp->n_vocab = (uint32_t)te->ne[1];

	uint32_t vs;
	kv = gguf_find(f, hp_key(key, sizeof(key), a, "vocab_size"));
	if (kv) {
		if ((rc = hp_u32(f, a, "vocab_size", false, &vs, err)))
			return rc;
		if (vs != hp->n_vocab)
			return gguf_error_set(err, GGUF_E_MALFORMED, kv->offset,
					  "%s.vocab_size = %u but token_embd.weight has %u rows (offset %llu)",
					  a, vs, hp->n_vocab,
					  (unsigned long long)kv->offset);
	}
	kv = gguf_find(f, "tokenizer.ggml.tokens");
	if (kv) {
		if (kv->type != GGUF_VT_ARRAY || kv->arr_type != GGUF_VT_STRING)
			return gguf_error_set(err, GGUF_E_TYPE, kv->offset,
					  "key 'tokenizer.ggml.tokens' is not an array of strings (offset %llu)",
					  (unsigned long long)kv->offset);
		if (kv->arr_len != hp->n_vocab)
			return gguf_error_set(err, GGUF_E_MALFORMED, kv->offset,
					  "tokenizer.ggml.tokens has %llu tokens but token_embd.weight has %u rows (offset %llu)",
					  (unsigned long long)kv->arr_len,
					  hp->n_vocab,
					  (unsigned long long)kv->offset);
	}
	return 0;
}

int gguf_llama_hparams(const struct gguf_file *f, struct llama_hparams *hp,
		       struct gguf_error *err)
{
	const char *a = NULL;
	int rc;

	if (err)
		*err = (struct gguf_error){ 0 };
	*hp = (struct llama_hparams){ 0 };
	if ((rc = hp_read_arch(f, hp, &a, err)) ||
	    (rc = hp_read_sizes(f, a, hp, err)) ||
	    (rc = hp_read_heads(f, a, hp, err)) ||
	    (rc = hp_read_rope(f, a, hp, err)) ||
	    (rc = hp_read_vocab(f, a, hp, err)))
		return rc;
	return hp_check_tensors(f, hp, err);
}
