/* util.c - clocks, and claiming a unix socket path.
 *
 * A unix socket's file outlives a node that was killed, and bind(2)
 * fails on it; removing it unconditionally would let a second node
 * silently take over a live node's socket (its clients then reach the
 * wrong process). So a path is taken only when connect(2) finds nobody
 * there. Two nodes started at the same instant can both see a dead file;
 * one of them then loses at bind (EADDRINUSE), which is still a refusal.
 */
#include "conf/util.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

uint64_t kvd_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

uint64_t kvd_wall_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

int kvd_unix_claim(const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct stat st;
	int fd, r;

	if (lstat(path, &st) < 0)
		return errno == ENOENT ? 0 : -errno;
	if (!S_ISSOCK(st.st_mode))
		return -EEXIST;
	if (strlen(path) >= sizeof(sa.sun_path))
		return -ENAMETOOLONG;
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	r = connect(fd, (struct sockaddr *)&sa, sizeof(sa));
	close(fd);
	if (r == 0)
		return -EADDRINUSE;
	return unlink(path) < 0 && errno != ENOENT ? -errno : 0;
}

int kvd_unix_connect(const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd, e;

	if (strlen(path) >= sizeof(sa.sun_path))
		return -ENAMETOOLONG;
	memcpy(sa.sun_path, path, strlen(path) + 1);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		e = errno;
		close(fd);
		return -e;
	}
	return fd;
}

bool kvd_dir_owner_only(int dfd)
{
	struct stat st;

	if (fstat(dfd, &st) || !S_ISDIR(st.st_mode))
		return false;
	if (st.st_uid != geteuid() && st.st_uid != 0)
		return false;
	return (st.st_mode & (S_IWGRP | S_IWOTH)) == 0;
}

int kvd_parse_u64(const char *s, uint64_t *out)
{
	char *end;
	unsigned long long v;

	if (!s || !isdigit((unsigned char)s[0]))
		return -EINVAL;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (*end)
		return -EINVAL;
	if (errno)
		return -ERANGE;
	*out = v;
	return 0;
}

void kvd_json_str(FILE *out, const char *s, size_t n)
{
	fputc('"', out);
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)s[i];

		if (c == '"' || c == '\\')
			fprintf(out, "\\%c", c);
		else if (c == '\n')
			fputs("\\n", out);
		else if (c == '\t')
			fputs("\\t", out);
		else if (c == '\r')
			fputs("\\r", out);
		else if (c < 0x20 || c == 0x7f)
			fprintf(out, "\\u%04x", c);
		else
			fputc(c, out);
	}
	fputc('"', out);
}
