/* frame.h - length-prefixed msgpack frames: the one wire unit of kvd.
 *
 * A frame is a 4-byte big-endian payload length followed by exactly that
 * many bytes holding exactly one msgpack map:
 *
 *   +----------------+-----------------------------+
 *   | len (u32, BE)  | msgpack map, len bytes      |
 *   +----------------+-----------------------------+
 *
 * The admin socket, the client API and the peer protocol all speak it.
 *
 * Decoding is incremental and pure: frame_decoder_feed() takes any chunk of
 * bytes (it copies at most what its bounded buffer holds and says how much
 * it took), frame_decoder_next() hands out the next complete frame. No
 * input, however hostile, makes the decoder crash, allocate more than a
 * small multiple of the maximum frame size, or loop.
 *
 * Errors: positive FRAME_E_* for conditions of the input (the caller sends
 * a typed error and goes on, or closes for FRAME_E_TOOBIG); negative errno
 * for system failures (-ENOMEM).
 *
 * Thread safety: none; a decoder or writer belongs to one thread.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <msgpack.h>

#define FRAME_HEADER_BYTES 4
#define FRAME_MAX_DEFAULT (1u << 20)   /* payload bytes */
#define FRAME_MAX_LIMIT (1u << 30)     /* no decoder accepts more */
#define FRAME_DEPTH_MAX 32             /* nested non-empty containers */

enum {
	FRAME_E_AGAIN = 1,  /* no complete frame yet: feed more bytes */
	FRAME_E_TOOBIG,     /* declared length above the maximum: the stream
			     * cannot be resynchronised, close it */
	FRAME_E_MALFORMED,  /* payload is not exactly one valid msgpack object;
			     * the frame was consumed, the stream goes on */
	FRAME_E_NOTMAP,     /* payload is msgpack but not a map (consumed) */
	FRAME_E_TRUNCATED,  /* the stream ended inside a frame */
	FRAME_E_MISSING,    /* schema: a required key is absent */
	FRAME_E_TYPE,       /* schema: a key has the wrong type */
	FRAME_E_RANGE,      /* schema: a value is out of range or too long */
	FRAME_E_UNKNOWN,    /* schema: a key the schema does not know (strict) */
	FRAME_E_DUPLICATE,  /* schema: a key appears twice */
	FRAME_E_AUTH,       /* the decoder's opener refused the frame (forged,
			     * replayed, reordered): the stream is unusable */
};

/* Name of a FRAME_E_* code ("too_big", ...), "?" for others. */
const char *frame_strerror(int code);

/* ---- decoding ----------------------------------------------------------- */

struct frame_decoder {
	uint8_t *buf;        /* (cap) bytes: [0, len) received, unconsumed */
	size_t len;
	size_t cap;          /* grows on demand up to FRAME_HEADER_BYTES + max */
	size_t max;          /* largest payload accepted */
	size_t consumed;     /* bytes of the frame last handed out; dropped at
			      * the next feed/next call (the object points
			      * into buf until then) */
	bool broken;         /* TOOBIG or AUTH seen: every later next()
			      * says so */
	int broken_code;
	msgpack_unpacked msg;/* zone of the frame last handed out */
	/* Optional: authenticate (and decrypt) each payload in place before
	 * it is parsed; see frame_decoder_set_opener. */
	int (*open)(void *arg, uint8_t *payload, size_t n, size_t *plain_n);
	void *open_arg;
};

/* max: largest payload in bytes, 1..FRAME_MAX_LIMIT. Allocates nothing. */
void frame_decoder_init(struct frame_decoder *d, size_t max);
/* Free buffers. Safe twice. */
void frame_decoder_deinit(struct frame_decoder *d);
/* Change the largest payload accepted from the next frame on (1 ..
 * FRAME_MAX_LIMIT): e.g. small until a peer has authenticated. */
void frame_decoder_set_max(struct frame_decoder *d, size_t max);

/* Copy up to n bytes of `data` into the decoder; *used says how many were
 * taken (fewer than n when the buffer is full: call next() and feed the
 * rest). 0 or -ENOMEM. Invalidates the object last handed out. */
int frame_decoder_feed(struct frame_decoder *d, const void *data, size_t n,
		       size_t *used);

/* Decode the next frame. 0: *out is the frame's map, valid until the next
 * feed/next/deinit call. FRAME_E_AGAIN: incomplete. FRAME_E_MALFORMED,
 * FRAME_E_NOTMAP: a bad frame was consumed, call again. FRAME_E_TOOBIG:
 * the stream is unusable. -ENOMEM. */
int frame_decoder_next(struct frame_decoder *d, const msgpack_object **out);

/* From the next frame on, hand every payload to open(arg, p, n, &m)
 * first: it authenticates p[0, n) in place and says how many bytes of
 * plaintext lead it (the msgpack map); non-zero makes the stream broken
 * with FRAME_E_AUTH. Frames already handed out are not affected, so an
 * owner may set it from the handler of the last plaintext frame. */
void frame_decoder_set_opener(struct frame_decoder *d,
			      int (*open)(void *arg, uint8_t *payload, size_t n,
					  size_t *plain_n),
			      void *arg);

/* At end of stream: FRAME_E_TRUNCATED when a partial frame is buffered,
 * else 0. */
int frame_decoder_finish(const struct frame_decoder *d);

/* Bytes buffered and not yet consumed. */
size_t frame_decoder_pending(const struct frame_decoder *d);

/* Check that p[0..n) is exactly one well-formed msgpack object whose
 * container counts fit in the bytes present and which nests at most
 * FRAME_DEPTH_MAX non-empty containers: 0 or FRAME_E_MALFORMED.
 * Runs in O(n) with no allocation; frame_decoder_next() calls it before
 * msgpack-c sees the bytes (msgpack-c sizes containers from their declared
 * counts). */
int frame_msgpack_check(const uint8_t *p, size_t n);

/* One-shot decode of a whole frame in `buf` (tests, fuzzing): same codes as
 * frame_decoder_next plus FRAME_E_TRUNCATED and FRAME_E_MALFORMED for
 * trailing bytes. `msg` must be initialised with msgpack_unpacked_init and
 * destroyed by the caller; *out points into buf and msg. */
int frame_decode(const uint8_t *buf, size_t n, size_t max,
		 msgpack_unpacked *msg, const msgpack_object **out);

/* ---- encoding ----------------------------------------------------------- */

/* Packs one frame into a growing buffer. Errors are sticky: check once at
 * frame_writer_finish(). */
struct frame_writer {
	char *buf;           /* (cap) bytes: header then payload, [0, len) */
	size_t len;
	size_t cap;
	int err;             /* first -ENOMEM, else 0 */
	msgpack_packer pk;
};

void frame_writer_init(struct frame_writer *w);
void frame_writer_deinit(struct frame_writer *w);
static inline msgpack_packer *frame_writer_packer(struct frame_writer *w)
{
	return &w->pk;
}
/* Patch the header and hand the frame over: *data (free() it) and *len
 * (header included). FRAME_E_TOOBIG when the payload exceeds max;
 * -ENOMEM. The writer is reset and may be reused. */
int frame_writer_finish(struct frame_writer *w, size_t max, char **data,
			size_t *len);

/* Append bytes that already are packed msgpack (e.g. the payload of
 * another writer: w2->buf + FRAME_HEADER_BYTES, w2->len - 4). */
void frame_writer_append(struct frame_writer *w, const void *data, size_t len);
/* Drop what was packed; keep the buffer. */
void frame_writer_clear(struct frame_writer *w);

/* Pack helpers: a key (string) and a value. */
void frame_pack_str(msgpack_packer *pk, const char *s);
void frame_pack_kv_str(msgpack_packer *pk, const char *k, const char *v);
void frame_pack_kv_u64(msgpack_packer *pk, const char *k, uint64_t v);
void frame_pack_kv_i64(msgpack_packer *pk, const char *k, int64_t v);
void frame_pack_kv_bool(msgpack_packer *pk, const char *k, bool v);
void frame_pack_kv_double(msgpack_packer *pk, const char *k, double v);

/* ---- reading maps with a schema ----------------------------------------- */

enum frame_type {
	FRAME_T_BOOL,    /* -> bool */
	FRAME_T_U64,     /* -> uint64_t; within [min, max] unless both 0 */
	FRAME_T_I64,     /* -> int64_t */
	FRAME_T_DOUBLE,  /* -> double; integers accepted */
	FRAME_T_STR,     /* -> char[size], NUL-terminated; no embedded NUL */
	FRAME_T_MAP,     /* -> const msgpack_object * */
	FRAME_T_ARRAY,   /* -> const msgpack_object * */
	FRAME_T_ANY,     /* -> const msgpack_object * */
};

struct frame_field {
	const char *name;
	enum frame_type type;
	bool required;
	size_t offset;       /* where the value goes in the output struct */
	size_t size;         /* FRAME_T_STR: buffer bytes, NUL included */
	uint64_t min, max;   /* FRAME_T_U64 range; both 0 = any */
};

#define FRAME_FIELDS_MAX 64

struct frame_error {
	int code;            /* FRAME_E_* */
	char key[64];        /* the key concerned, "" if none */
	char msg[160];       /* human sentence */
};

enum {
	FRAME_SCHEMA_STRICT = 1 << 0,  /* unknown keys are FRAME_E_UNKNOWN */
};

/* Read `map` through fields[0..n) (n <= FRAME_FIELDS_MAX) into `out`. Bit i
 * of *present (may be NULL) is set when fields[i] was found. Keys named in
 * `ignore` (NULL-terminated list, may be NULL) are skipped even when strict.
 * 0, or a FRAME_E_* with err filled (out may be partly written). */
int frame_map_parse(const msgpack_object *map, const struct frame_field *fields,
		    size_t n, unsigned flags, const char *const *ignore,
		    void *out, uint64_t *present, struct frame_error *err);

/* The value of `key` in `map`, or NULL (first match; not a map: NULL). */
const msgpack_object *frame_map_get(const msgpack_object *map, const char *key);
/* Typed reads of one object: 0 or FRAME_E_TYPE / FRAME_E_RANGE. */
int frame_obj_u64(const msgpack_object *o, uint64_t *v);
int frame_obj_i64(const msgpack_object *o, int64_t *v);
int frame_obj_double(const msgpack_object *o, double *v);
int frame_obj_bool(const msgpack_object *o, bool *v);
/* Copy a string into buf[size]: FRAME_E_TYPE, or FRAME_E_RANGE when it does
 * not fit or holds a NUL. */
int frame_obj_str(const msgpack_object *o, char *buf, size_t size);
/* True when `o` is a string equal to s. */
bool frame_obj_streq(const msgpack_object *o, const char *s);
