/* shim.c - an LD_PRELOAD library for the faults a test cannot make from
 * outside a process (a test helper, not installed; the integration tests
 * find it as $KVD_BUILD/tests/libkvd_shim.so). Inert unless one of these
 * is set in the environment:
 *
 *   KVD_SHIM_READ_FAIL=PATH:N   fopen(PATH) gives a stream that reads the
 *                               file's first N bytes, then fails with EIO
 *                               (a disk or network file system that fails
 *                               part way through);
 *   KVD_SHIM_NOMEM_AFTER=WORD   once a read(2) has returned bytes holding
 *                               WORD, every realloc() fails with ENOMEM
 *                               (memory running out at one chosen moment,
 *                               e.g. after a frame named WORD arrived).
 *
 * Not for ASan builds: their runtime wants to be the first library.
 */
/* fopen and fopen64 are both defined below: no redirection of one to the
 * other (meson builds with _FILE_OFFSET_BITS=64) */
#undef _FILE_OFFSET_BITS
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

/* glibc's own realloc, for when no fault is armed (dlsym may allocate,
 * so it cannot be looked up from inside realloc) */
extern void *__libc_realloc(void *p, size_t n);

static ssize_t (*real_read)(int, void *, size_t);
static FILE *(*real_fopen)(const char *, const char *);
static const char *nomem_word;
static volatile bool nomem;

__attribute__((constructor)) static void shim_init(void)
{
	real_read = (ssize_t (*)(int, void *, size_t))dlsym(RTLD_NEXT, "read");
	real_fopen = (FILE * (*)(const char *, const char *))dlsym(RTLD_NEXT, "fopen");
	nomem_word = getenv("KVD_SHIM_NOMEM_AFTER");
}

ssize_t read(int fd, void *buf, size_t n)
{
	ssize_t r = real_read(fd, buf, n);

	if (r > 0 && nomem_word && *nomem_word &&
	    memmem(buf, (size_t)r, nomem_word, strlen(nomem_word)))
		nomem = true;
	return r;
}

void *realloc(void *p, size_t n)
{
	if (nomem) {
		errno = ENOMEM;
		return NULL;
	}
	return __libc_realloc(p, n);
}

/* ---- a stream that fails part way ---------------------------------------- */

struct cut {
	int fd;
	size_t left;    /* bytes still read before the failure */
};

static ssize_t cut_read(void *c, char *buf, size_t n)
{
	struct cut *k = c;
	ssize_t r;

	if (!k->left) {
		errno = EIO;
		return -1;
	}
	r = real_read(k->fd, buf, n < k->left ? n : k->left);
	if (r > 0)
		k->left -= (size_t)r;
	return r;
}

static int cut_close(void *c)
{
	struct cut *k = c;
	int r = close(k->fd);

	free(k);
	return r;
}

/* KVD_SHIM_READ_FAIL names path: a cut stream over it, else NULL. */
static FILE *cut_open(const char *path)
{
	const char *spec = getenv("KVD_SHIM_READ_FAIL");
	const char *colon = spec ? strrchr(spec, ':') : NULL;
	cookie_io_functions_t io = { .read = cut_read, .close = cut_close };
	struct cut *k;
	FILE *f;

	if (!colon || strlen(path) != (size_t)(colon - spec) ||
	    strncmp(spec, path, (size_t)(colon - spec)))
		return NULL;
	k = malloc(sizeof(*k));
	if (!k)
		return NULL;
	k->left = strtoull(colon + 1, NULL, 10);
	k->fd = open(path, O_RDONLY | O_CLOEXEC);
	f = k->fd >= 0 ? fopencookie(k, "r", io) : NULL;
	if (!f) {
		if (k->fd >= 0)
			close(k->fd);
		free(k);
	}
	return f;
}

FILE *fopen(const char *path, const char *mode)
{
	FILE *f = cut_open(path);

	return f ? f : real_fopen(path, mode);
}

FILE *fopen64(const char *path, const char *mode)
{
	return fopen(path, mode);
}
