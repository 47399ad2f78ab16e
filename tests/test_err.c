/* test_err.c - the one error space at the layers' boundaries (conf/err.h):
 * what each kind means, pinned; every code of every module's table has a
 * name and a kind; nothing outside a table folds to anything but BUG; a
 * module's name function knows no code past its table (a code added to a
 * module without its kind fails here); and the client's wire codes the
 * roles gave engine failures before the fold are the ones they give now.
 */
#include <check.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "conf/err.h"
#include "ctl/admin.h"
#include "ctl/errors.h"
#include "daemon/node/errors.h"
#include "gpu/engine.h"
#include "gpu/errors.h"
#include "gpu/kv/kvpool.h"
#include "net/errors.h"
#include "net/verbs/errors.h"
#include "net/wire/proto_client.h"

static const struct kvd_err_table *const *const layers[] = {
	kvd_err_gpu, kvd_err_net, kvd_err_verbs, kvd_err_node, kvd_err_ctl,
};

/* The kinds and their names are what logs and tests read: stable. */
START_TEST(test_kind_names)
{
	static const char *const want[KVD_ERR__N] = {
		"ok", "invalid", "too_big", "auth", "integrity", "full", "state",
		"unsupported", "not_found", "timeout", "again", "no_memory",
		"system", "bug",
	};

	for (int k = 0; k < KVD_ERR__N; k++) {
		ck_assert_str_eq(kvd_err_name((enum kvd_err)k), want[k]);
		ck_assert(strlen(kvd_err_meaning((enum kvd_err)k)) >= 8);
		for (int j = 0; j < k; j++)
			ck_assert_str_ne(kvd_err_meaning((enum kvd_err)k),
					 kvd_err_meaning((enum kvd_err)j));
	}
	ck_assert_str_eq(kvd_err_name((enum kvd_err)KVD_ERR__N), "bug");
	ck_assert_str_eq(kvd_err_name((enum kvd_err)-1), "bug");
}
END_TEST

START_TEST(test_errno)
{
	ck_assert_int_eq(kvd_err_errno(0), KVD_OK);
	ck_assert_int_eq(kvd_err_errno(-ENOMEM), KVD_ERR_NOMEM);
	ck_assert_int_eq(kvd_err_errno(-ETIMEDOUT), KVD_ERR_TIMEOUT);
	ck_assert_int_eq(kvd_err_errno(-EINVAL), KVD_ERR_INVALID);
	ck_assert_int_eq(kvd_err_errno(-EPROTO), KVD_ERR_INVALID);
	ck_assert_int_eq(kvd_err_errno(-ERANGE), KVD_ERR_TOO_BIG);
	ck_assert_int_eq(kvd_err_errno(-EPERM), KVD_ERR_AUTH);
	ck_assert_int_eq(kvd_err_errno(-ENOTSUP), KVD_ERR_UNSUPPORTED);
	ck_assert_int_eq(kvd_err_errno(-ENOENT), KVD_ERR_NOTFOUND);
	ck_assert_int_eq(kvd_err_errno(-EAGAIN), KVD_ERR_AGAIN);
	ck_assert_int_eq(kvd_err_errno(-EBUSY), KVD_ERR_FULL);
	ck_assert_int_eq(kvd_err_errno(-ECANCELED), KVD_ERR_STATE);
	ck_assert_int_eq(kvd_err_errno(-EIO), KVD_ERR_SYSTEM);
	ck_assert_int_eq(kvd_err_errno(-EPIPE), KVD_ERR_SYSTEM);
	ck_assert_int_eq(kvd_err_errno(7), KVD_ERR_BUG);
}
END_TEST

static void check_table(const struct kvd_err_table *t)
{
	ck_assert_msg(t->module && t->first > 0 && t->last >= t->first,
		      "%s: range %d..%d", t->module, t->first, t->last);
	ck_assert_msg(t->name || t->names, "%s: no names", t->module);
	for (int c = t->first; c <= t->last; c++) {
		enum kvd_err k = kvd_err_fold(t, c);
		const char *n = kvd_err_code_name(t, c);

		ck_assert_msg(k > KVD_OK && k < KVD_ERR_BUG,
			      "%s code %d: kind %d", t->module, c, (int)k);
		ck_assert_msg(n && *n && strcmp(n, "?") && strcmp(n, "unknown"),
			      "%s code %d: no name", t->module, c);
		for (int d = t->first; d < c; d++)
			ck_assert_msg(strcmp(n, kvd_err_code_name(t, d)),
				      "%s codes %d and %d share the name %s",
				      t->module, d, c, n);
	}
	ck_assert_int_eq(kvd_err_fold(t, 0), KVD_OK);
	ck_assert_int_eq(kvd_err_fold(t, -ENOMEM), KVD_ERR_NOMEM);
	ck_assert_int_eq(kvd_err_fold(t, t->last + 1), KVD_ERR_BUG);
	if (t->first > 1)
		ck_assert_int_eq(kvd_err_fold(t, t->first - 1), KVD_ERR_BUG);
	ck_assert_str_eq(kvd_err_code_name(t, t->last + 1), "unknown");
	/* a module that names its codes knows none past the table */
	if (t->name) {
		const char *past = t->name(t->last + 1);

		ck_assert_msg(!strcmp(past, "?") || strstr(past, "unknown") ||
			      strstr(past, "Unknown"),
			      "%s names code %d (%s), which its table lacks",
			      t->module, t->last + 1, past);
	}
}

START_TEST(test_every_table)
{
	unsigned n = 0;

	for (size_t i = 0; i < sizeof(layers) / sizeof(layers[0]); i++)
		for (const struct kvd_err_table *const *t = layers[i]; *t; t++, n++)
			check_table(*t);
	ck_assert_uint_ge(n, 20);
}
END_TEST

/* Codes overlap between modules: only the table says what one means. */
START_TEST(test_same_value_other_meaning)
{
	ck_assert_int_eq(kvd_err_fold(&kvd_err_kvpool, 1), KVD_ERR_FULL);
	ck_assert_int_eq(kvd_err_fold(&kvd_err_frame, 1), KVD_ERR_AGAIN);
	ck_assert_int_eq(kvd_err_fold(&kvd_err_peer_auth, 1), KVD_ERR_AUTH);
	ck_assert_int_eq(kvd_err_fold(&kvd_err_engine, 1), KVD_ERR_BUG);
}
END_TEST

/* What a client is told for an engine failure: the wire codes decode.c
 * and prefill.c gave before the fold (the pool's full now arrives as
 * ENGINE_E_FULL). */
START_TEST(test_engine_to_client)
{
	static const struct { int rc, want; } cases[] = {
		{ ENGINE_E_TOO_LONG, PROTO_ERR_PROMPT_TOO_LONG },
		{ ENGINE_E_INVALID, PROTO_ERR_INVALID_REQUEST },
		{ ENGINE_E_INTEGRITY, PROTO_ERR_INTEGRITY },
		{ ENGINE_E_BUSY, PROTO_ERR_OVERLOADED },
		{ ENGINE_E_FULL, PROTO_ERR_OVERLOADED },
		{ ENGINE_E_GEOMETRY, PROTO_ERR_INTERNAL },
		{ ENGINE_E_MEMORY, PROTO_ERR_INTERNAL },
		{ ENGINE_E_POOL, PROTO_ERR_INTERNAL },
		{ -ENOMEM, PROTO_ERR_INTERNAL },
		{ -EIO, PROTO_ERR_INTERNAL },
		{ KVPOOL_E_FULL, PROTO_ERR_INTERNAL },   /* not an engine code */
	};

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
		ck_assert_msg(kvd_err_to_proto(kvd_err_fold(&kvd_err_engine, cases[i].rc)) ==
			      cases[i].want, "engine rc %d", cases[i].rc);
	ck_assert_int_eq(kvd_err_to_proto(KVD_OK), PROTO_ERR_NONE);
	ck_assert_int_eq(kvd_err_to_proto(KVD_ERR_TIMEOUT), PROTO_ERR_TIMEOUT);
}
END_TEST

/* The admin plane's wire names are the table's: unchanged. */
START_TEST(test_admin_wire_names)
{
	ck_assert_str_eq(admin_strerror(ADMIN_E_MALFORMED), "malformed");
	ck_assert_str_eq(admin_strerror(ADMIN_E_POOL_FULL), "pool_full");
	ck_assert_str_eq(admin_strerror(ADMIN_E_TOO_MANY_CLIENTS), "too_many_clients");
	ck_assert_str_eq(admin_strerror(0), "?");
	ck_assert_str_eq(admin_strerror(ADMIN_E__N), "?");
	ck_assert_int_eq(kvd_err_fold(&kvd_err_admin, ADMIN_E_DENIED), KVD_ERR_AUTH);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("err");
	TCase *tc = tcase_create("core");
	SRunner *sr;
	int failed;

	tcase_add_test(tc, test_kind_names);
	tcase_add_test(tc, test_errno);
	tcase_add_test(tc, test_every_table);
	tcase_add_test(tc, test_same_value_other_meaning);
	tcase_add_test(tc, test_engine_to_client);
	tcase_add_test(tc, test_admin_wire_names);
	suite_add_tcase(s, tc);
	sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
