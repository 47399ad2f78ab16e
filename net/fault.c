/* fault.c - parsing the KVD_FAULT spec.
 *
 * Fault points exist so that the integration tests can prove each safety
 * check is load-bearing: a test that corrupts a byte must see INTEGRITY,
 * and the same test with the check skipped must see the damage. The spec
 * is parsed even in builds without fault points (so a typo is still an
 * error), but kvd_fault_fire() never fires there.
 */
#include "net/fault.h"
#include "conf/util.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static const char *const fault_names[KVD_FAULT__N] = {
	[KVD_FAULT_CORRUPT_BATCH] = "corrupt_batch",
	[KVD_FAULT_SHORT_TRANSFER] = "short_transfer",
	[KVD_FAULT_CUT_PEER_MID_BATCH] = "cut_peer_mid_batch",
	[KVD_FAULT_SLOW_BATCH] = "slow_batch",
	[KVD_FAULT_STALE_GENERATION] = "stale_generation",
	[KVD_FAULT_SLOW_ABORT_ACK] = "slow_abort_ack",
	[KVD_FAULT_BAD_TAG] = "bad_tag",
	[KVD_FAULT_SKIP_DECODE_ADMISSION] = "skip_decode_admission",
	[KVD_FAULT_DUP_ENTRY] = "dup_entry",
	[KVD_FAULT_RETAG_READY] = "retag_ready",
	[KVD_FAULT_STUCK_SUBMIT] = "stuck_submit",
	[KVD_FAULT_NAN_KV] = "nan_kv",
	[KVD_FAULT_COMPUTE_NOMEM] = "compute_nomem",
	[KVD_FAULT_BAD_ENTRY_INDEX] = "bad_entry_index",
	[KVD_FAULT_BAD_ENTRY_TOKENS] = "bad_entry_tokens",
	[KVD_FAULT_ABORT_SEND_FAIL] = "abort_send_fail",
	[KVD_FAULT_VERBS_QP_ERROR] = "verbs_qp_error",
	[KVD_FAULT_VERBS_COMPLETION_ERROR] = "verbs_completion_error",
	[KVD_FAULT_VERBS_SLOW_COMPLETION] = "verbs_slow_completion",
	[KVD_FAULT_LIE_ABORT_BATCHES] = "lie_abort_batches",
	[KVD_FAULT_LIE_DONE_BATCHES] = "lie_done_batches",
	[KVD_FAULT_VERBS_WRONG_SLOT] = "verbs_wrong_slot",
	[KVD_FAULT_VERBS_FLOOD] = "verbs_flood",
	[KVD_FAULT_VERBS_LIE_CREDIT] = "verbs_lie_credit",
	[KVD_FAULT_VERBS_WRITE_BESIDE] = "verbs_write_beside",
	[KVD_FAULT_VERBS_BIND_FAIL] = "verbs_bind_fail",
	[KVD_FAULT_VERBS_LATE_WRITE] = "verbs_late_write",
	[KVD_FAULT_LIE_UNASKED_ACK] = "lie_unasked_ack",
};

const char *kvd_fault_name(enum kvd_fault_point p)
{
	return (unsigned)p < KVD_FAULT__N ? fault_names[p] : "?";
}

int kvd_fault_parse(struct kvd_fault *f, const char *spec, const char **bad)
{
	const char *s = spec;

	memset(f, 0, sizeof(*f));
	while (s && *s) {
		size_t len = strcspn(s, ",:");
		uint32_t count = KVD_FAULT_FOREVER;
		int p;

		for (p = 0; p < KVD_FAULT__N; p++)
			if (strlen(fault_names[p]) == len &&
			    !strncmp(s, fault_names[p], len))
				break;
		if (p == KVD_FAULT__N) {
			if (bad)
				*bad = s;
			return -EINVAL;
		}
		s += len;
		if (*s == ':') {
			char *end;
			unsigned long v = strtoul(s + 1, &end, 10);

			if (end == s + 1 || v == 0 || v >= KVD_FAULT_FOREVER) {
				if (bad)
					*bad = s;
				return -EINVAL;
			}
			count = (uint32_t)v;
			s = end;
		}
		f->left[p] = count;
		if (*s == ',')
			s++;
		else if (*s) {
			if (bad)
				*bad = s;
			return -EINVAL;
		}
	}
	return 0;
}
