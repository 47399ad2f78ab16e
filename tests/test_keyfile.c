/* test_keyfile.c - secret files are checked, not trusted (conf/keyfile.c,
 * issue 22 item 4): one table of hostile files, each given to both open
 * sites - the cluster secret (kvd_keyfile_read, peers.key_file) and the
 * API keys file (kvd_apikeys_load, http.api_keys_file) - which must refuse
 * it with a sentence naming the file and the rule, and never block (a FIFO
 * hung the node; an alarm turns a hang into a failure here). Then the key
 * strength rule alone (kvd_secret_check) on lengths and byte mixes.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "conf/apikeys.h"
#include "conf/keyfile.h"

static char g_root[] = "/tmp/kvd_keyfile_XXXXXX";

#define KEY64 "5f1c0a9e3b7d2468ace13579bdf02468e1f2a3b4c5d6e7f8091a2b3c4d5e6f70\n"

enum kind { K_FILE, K_FIFO, K_DIR, K_DEVNULL, K_LINK_GOOD, K_LINK_FIFO };

struct row {
	const char *what;
	enum kind kind;
	mode_t mode;
	int foreign;             /* chown to uid 65534 (needs root) */
	const char *secret;      /* the cluster secret file's bytes */
	const char *apikey;      /* the API key written as "KEY alice" */
	const char *needle;      /* in the refusal; NULL: accepted */
};

static const struct row rows[] = {
	{ "a private regular file", K_FILE, 0600, 0, KEY64,
	  "k-0123456789abcdef0123456789abcdef", NULL },
	{ "read-only 0400", K_FILE, 0400, 0, KEY64,
	  "k-0123456789abcdef0123456789abcdef", NULL },
	{ "a symlink to a private file", K_LINK_GOOD, 0600, 0, KEY64,
	  "k-0123456789abcdef0123456789abcdef", NULL },
	{ "a FIFO", K_FIFO, 0600, 0, NULL, NULL, "not a regular file" },
	{ "a symlink to a FIFO", K_LINK_FIFO, 0600, 0, NULL, NULL, "not a regular file" },
	{ "a directory", K_DIR, 0700, 0, NULL, NULL, "not a regular file" },
	{ "/dev/null", K_DEVNULL, 0, 0, NULL, NULL, "not a regular file" },
	{ "group readable", K_FILE, 0640, 0, KEY64,
	  "k-0123456789abcdef0123456789abcdef", "mode 0640" },
	{ "world readable", K_FILE, 0604, 0, KEY64,
	  "k-0123456789abcdef0123456789abcdef", "mode 0604" },
	{ "group writable", K_FILE, 0620, 0, KEY64,
	  "k-0123456789abcdef0123456789abcdef", "mode 0620" },
	{ "another user's file", K_FILE, 0600, 1, KEY64,
	  "k-0123456789abcdef0123456789abcdef", "owned by uid 65534" },
	{ "31 bytes", K_FILE, 0600, 0, "0123456789abcdef0123456789abcd\n",
	  "0123456789abcdef0123456789abcde", "at least 32" },
	{ "empty", K_FILE, 0600, 0, "", NULL, "at least 32" },
	{ "all one byte", K_FILE, 0600, 0,
	  "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
	  "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "distinct byte values" },
	{ "two bytes repeated", K_FILE, 0600, 0,
	  "abababababababababababababababababababababababab\n",
	  "abababababababababababababababababababab", "distinct byte values" },
	{ "seven bytes repeated", K_FILE, 0600, 0,
	  "abcdefgabcdefgabcdefgabcdefgabcdefgabcdefg",
	  "abcdefgabcdefgabcdefgabcdefgabcdefgabcdefg", "distinct byte values" },
};

static void on_alarm(int sig)
{
	(void)sig;
	static const char m[] = "test_keyfile: an open blocked (FIFO?)\n";

	(void)!write(2, m, sizeof(m) - 1);
	_exit(3);
}

static void write_file(const char *path, const char *text, mode_t mode)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
	close(fd);
	ck_assert_int_eq(chmod(path, mode), 0);
}

/* Make the row's file for one site (content: text) at path. */
static void make(const struct row *r, const char *path, const char *text)
{
	char target[256];

	unlink(path);
	rmdir(path);
	switch (r->kind) {
	case K_FILE:
		write_file(path, text, r->mode);
		if (r->foreign)
			ck_assert_int_eq(chown(path, 65534, 65534), 0);
		break;
	case K_FIFO:
		ck_assert_int_eq(mkfifo(path, r->mode), 0);
		break;
	case K_DIR:
		ck_assert_int_eq(mkdir(path, r->mode), 0);
		break;
	case K_DEVNULL:
		ck_assert_int_eq(symlink("/dev/null", path), 0);
		break;
	case K_LINK_GOOD:
	case K_LINK_FIFO:
		snprintf(target, sizeof(target), "%s.target", path);
		unlink(target);
		if (r->kind == K_LINK_GOOD)
			write_file(target, text, r->mode);
		else
			ck_assert_int_eq(mkfifo(target, 0600), 0);
		ck_assert_int_eq(symlink(target, path), 0);
		break;
	}
}

START_TEST(test_hostile_files)
{
	const struct row *r = &rows[_i];
	char path[256], why[600], text[512];
	uint8_t buf[KVD_KEYFILE_MAX];
	struct kvd_apikeys *k = NULL;
	size_t len = 99;
	int rc;

	if (r->foreign && geteuid() != 0)
		return;   /* cannot give a file away without root */
	signal(SIGALRM, on_alarm);
	/* the cluster secret */
	snprintf(path, sizeof(path), "%s/%d.key", g_root, _i);
	make(r, path, r->secret ? r->secret : "");
	why[0] = 0;
	alarm(5);
	rc = kvd_keyfile_read(path, buf, &len, why, sizeof(why));
	alarm(0);
	if (!r->needle) {
		ck_assert_msg(rc == 0, "%s: key file refused: %s", r->what, why);
		ck_assert_uint_eq(len, strlen(r->secret));
		ck_assert(!memcmp(buf, r->secret, len));
	} else {
		ck_assert_msg(rc == -1, "%s: key file accepted", r->what);
		ck_assert_uint_eq(len, 0);
		ck_assert_msg(strstr(why, path) && strstr(why, r->needle),
			      "%s: key file: '%s' lacks the path or '%s'", r->what,
			      why, r->needle);
	}
	/* the API keys file */
	snprintf(path, sizeof(path), "%s/%d.apikeys", g_root, _i);
	snprintf(text, sizeof(text), "# keys\n%s alice\n", r->apikey ? r->apikey : "");
	make(r, path, r->apikey ? text : "");
	why[0] = 0;
	alarm(5);
	rc = kvd_apikeys_load(&k, path, why, sizeof(why));
	alarm(0);
	if (!r->needle) {
		ck_assert_msg(rc == 0, "%s: API keys refused: %s", r->what, why);
		ck_assert_str_eq(kvd_apikeys_lookup(k, r->apikey, strlen(r->apikey)),
				 "alice");
		kvd_apikeys_free(k);
	} else if (r->apikey || r->kind != K_FILE) {
		ck_assert_msg(rc == -1, "%s: API keys accepted", r->what);
		ck_assert_ptr_null(k);
		ck_assert_msg(strstr(why, path) && strstr(why, r->needle),
			      "%s: API keys: '%s' lacks the path or '%s'", r->what,
			      why, r->needle);
	}
}
END_TEST

/* The strength rule alone: length floor, distinct byte floor; and the
 * bound on a key file's size (exactly the bound is read, one more byte
 * refused). */
START_TEST(test_secret_check)
{
	static const struct {
		const char *key;
		size_t len, min;
		int ok;
	} t[] = {
		{ "0123456789abcdef0123456789abcdef", 32, 32, 1 },
		{ "0123456789abcdef0123456789abcde", 31, 32, 0 },
		{ "0123456", 7, 4, 0 },          /* 7 distinct */
		{ "01234567", 8, 4, 1 },         /* 8 distinct */
		{ "\0\0\0\0\0\0\0\0", 8, 8, 0 },
		{ "", 0, 0, 0 },
	};
	char why[200], path[256], big[KVD_KEYFILE_MAX + 2];
	uint8_t buf[KVD_KEYFILE_MAX];
	size_t len;

	for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++)
		ck_assert_msg((kvd_secret_check(t[i].key, t[i].len, t[i].min, why,
						sizeof(why)) == 0) == t[i].ok,
			      "row %zu: %s", i, why);
	for (size_t i = 0; i < sizeof(big) - 1; i++)
		big[i] = (char)('!' + i % 90);
	big[sizeof(big) - 1] = 0;
	snprintf(path, sizeof(path), "%s/big.key", g_root);
	write_file(path, big, 0600);
	ck_assert_int_eq(kvd_keyfile_read(path, buf, &len, why, sizeof(why)), -1);
	ck_assert_ptr_nonnull(strstr(why, "larger than 4096"));
	ck_assert_int_eq(truncate(path, KVD_KEYFILE_MAX), 0);
	ck_assert_int_eq(kvd_keyfile_read(path, buf, &len, why, sizeof(why)), 0);
	ck_assert_uint_eq(len, KVD_KEYFILE_MAX);
}
END_TEST

static void root_make(void)
{
	ck_assert_ptr_nonnull(mkdtemp(g_root));
}

static void root_remove(void)
{
	char cmd[300];

	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", g_root);
	(void)!system(cmd);
}

int main(void)
{
	Suite *s = suite_create("keyfile");
	TCase *tc = tcase_create("keyfile");
	SRunner *sr;
	int failed;

	tcase_add_unchecked_fixture(tc, root_make, root_remove);
	tcase_add_loop_test(tc, test_hostile_files, 0, (int)(sizeof(rows) / sizeof(rows[0])));
	tcase_add_test(tc, test_secret_check);
	suite_add_tcase(s, tc);
	sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
