/* keyfile.c - open, check and read secret files (see keyfile.h).
 *
 * The checks run on the open descriptor (fstat), not on the path, so the
 * file judged is the file read. The open itself must not wait: a FIFO
 * opened for reading blocks until a writer comes (forever: issue 22 found
 * a node hanging at boot on one), and a device may do anything on open,
 * so the file is opened O_NONBLOCK | O_NOCTTY and refused unless fstat
 * says regular file (O_NONBLOCK changes nothing for a regular file's
 * reads). O_NOFOLLOW is not used: systemd credentials and configuration
 * management commonly hand secrets over through a symlink, and the owner
 * and mode that matter are the target's.
 *
 * Owner: this user or root. A file another (unprivileged) account owns is
 * one that account may rewrite at will, whatever its mode says today;
 * root can rewrite anything anyway, and a root-owned 0400 secret read by
 * a root daemon is the ordinary case.
 */
#include "conf/keyfile.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The rule st breaks, written into why; true when it breaks none. */
static bool private_stat_ok(const struct stat *st, const char *path,
			    const char *what, char *why, size_t why_size)
{
	if (!S_ISREG(st->st_mode)) {
		snprintf(why, why_size,
			 "'%s' is not a regular file (a FIFO, device, socket or directory); %s must be a regular file",
			 path, what);
		return false;
	}
	if (st->st_uid != geteuid() && st->st_uid != 0) {
		snprintf(why, why_size,
			 "'%s' is owned by uid %u, not by this user (uid %u) or root; %s must be owned by the user kvd runs as",
			 path, (unsigned)st->st_uid, (unsigned)geteuid(), what);
		return false;
	}
	if (st->st_mode & 077) {
		snprintf(why, why_size,
			 "'%s' is accessible to group or others (mode %04o); %s must be mode 0600 or 0400 (chmod 600)",
			 path, (unsigned)(st->st_mode & 07777), what);
		return false;
	}
	return true;
}

int kvd_private_open(const char *path, const char *what, char *why,
		     size_t why_size)
{
	struct stat st;
	int fd;

	fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
	if (fd < 0) {
		snprintf(why, why_size, "cannot open '%s': %s", path, strerror(errno));
		return -1;
	}
	if (fstat(fd, &st) < 0) {
		snprintf(why, why_size, "cannot stat '%s': %s", path, strerror(errno));
		close(fd);
		return -1;
	}
	if (!private_stat_ok(&st, path, what, why, why_size)) {
		close(fd);
		return -1;
	}
	return fd;
}

int kvd_private_read(const char *path, const char *what, void *buf,
		     size_t max, size_t *len, char *why, size_t why_size)
{
	uint8_t *p = buf;
	size_t got = 0;
	int fd, rc = -1;

	*len = 0;
	fd = kvd_private_open(path, what, why, why_size);
	if (fd < 0)
		return -1;
	/* one byte past max tells "too large" from "exactly max" */
	for (;;) {
		ssize_t n = read(fd, p + got, max + 1 - got);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			snprintf(why, why_size, "cannot read '%s': %s", path, strerror(errno));
			goto out;
		}
		if (n == 0)
			break;
		got += (size_t)n;
		if (got > max) {
			snprintf(why, why_size, "'%s' is larger than %zu bytes; is it the right file?",
				 path, max);
			goto out;
		}
	}
	*len = got;
	rc = 0;
out:
	if (rc)
		explicit_bzero(buf, got);
	close(fd);
	return rc;
}

int kvd_secret_check(const void *key, size_t len, size_t min, char *why,
		     size_t why_size)
{
	const uint8_t *k = key;
	uint8_t seen[256] = { 0 };
	unsigned distinct = 0;

	if (len < min) {
		snprintf(why, why_size, "is %zu bytes; a secret needs at least %zu", len, min);
		return -1;
	}
	for (size_t i = 0; i < len; i++) {
		distinct += !seen[k[i]];
		seen[k[i]] = 1;
	}
	if (distinct < KVD_SECRET_DISTINCT_MIN) {
		snprintf(why, why_size,
			 "uses only %u distinct byte values; a secret needs at least %u (a random key, as kvctl keygen writes)",
			 distinct, KVD_SECRET_DISTINCT_MIN);
		return -1;
	}
	return 0;
}

int kvd_keyfile_read(const char *path, uint8_t *buf, size_t *len,
		     char *why, size_t why_size)
{
	uint8_t tmp[KVD_KEYFILE_MAX + 1];
	char rule[200];
	size_t got;

	*len = 0;
	if (kvd_private_read(path, "the cluster secret", tmp, KVD_KEYFILE_MAX,
			     &got, why, why_size))
		return -1;
	if (kvd_secret_check(tmp, got, KVD_KEYFILE_MIN, rule, sizeof(rule))) {
		snprintf(why, why_size, "'%s' %s (kvctl keygen FILE writes one)", path, rule);
		explicit_bzero(tmp, sizeof(tmp));
		return -1;
	}
	memcpy(buf, tmp, got);
	explicit_bzero(tmp, sizeof(tmp));
	*len = got;
	return 0;
}
