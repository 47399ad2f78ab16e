/* keyfile.c - read and check the cluster secret file.
 *
 * The checks run on the open descriptor (fstat), not on the path, so the
 * file judged is the file read. O_NOFOLLOW is not used: systemd
 * credentials and configuration management commonly hand secrets over
 * through a symlink, and the mode that matters is the target's.
 */
#include "conf/keyfile.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int kvd_private_open(const char *path, const char *what, char *why,
		     size_t why_size)
{
	struct stat st;
	int fd;

	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		snprintf(why, why_size, "cannot open '%s': %s", path, strerror(errno));
		return -1;
	}
	if (fstat(fd, &st) < 0) {
		snprintf(why, why_size, "cannot stat '%s': %s", path, strerror(errno));
		goto fail;
	}
	if (!S_ISREG(st.st_mode)) {
		snprintf(why, why_size, "'%s' is not a regular file", path);
		goto fail;
	}
	if (st.st_mode & 077) {
		snprintf(why, why_size,
			 "'%s' is accessible to group or others (mode %04o); %s must be mode 0600 or 0400 (chmod 600)",
			 path, (unsigned)(st.st_mode & 07777), what);
		goto fail;
	}
	return fd;
fail:
	close(fd);
	return -1;
}

int kvd_keyfile_read(const char *path, uint8_t *buf, size_t *len,
		     char *why, size_t why_size)
{
	size_t got = 0;
	int fd, rc = -1;

	*len = 0;
	fd = kvd_private_open(path, "the cluster secret", why, why_size);
	if (fd < 0)
		return -1;
	while (got < KVD_KEYFILE_MAX) {
		ssize_t n = read(fd, buf + got, KVD_KEYFILE_MAX - got);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			snprintf(why, why_size, "cannot read '%s': %s", path, strerror(errno));
			goto out;
		}
		if (n == 0)
			break;
		got += (size_t)n;
	}
	if (got == KVD_KEYFILE_MAX) {
		char extra;

		if (read(fd, &extra, 1) == 1) {
			snprintf(why, why_size, "'%s' is larger than %u bytes; is it the right file?",
				 path, KVD_KEYFILE_MAX);
			goto out;
		}
	}
	if (got < KVD_KEYFILE_MIN) {
		snprintf(why, why_size,
			 "'%s' holds %zu bytes; a cluster secret needs at least %u (kvctl keygen FILE writes one)",
			 path, got, KVD_KEYFILE_MIN);
		goto out;
	}
	*len = got;
	rc = 0;
out:
	if (rc)
		memset(buf, 0, KVD_KEYFILE_MAX);
	close(fd);
	return rc;
}
