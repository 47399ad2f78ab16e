/* verbs_emu.h - the emulated RDMA device's test controls.
 *
 * verbs_emu_ops() (net/verbs/verbs_ops.h) is a userspace device with RC
 * semantics; see the design notes at the top of net/verbs/verbs_emu.c. Open it
 * with the device name
 *
 *   emu:DIR[,max_mr_size=BYTES][,mw=0|1][,max_qp_wr=N][,max_inline=N][,auto=0|1]
 *          [,short_mr=BYTES][,mtu=256..4096][,hold_ms=N][,flush=0|1]
 *
 * DIR is a directory both ends can reach (each context binds one Unix
 * datagram socket there: the "wire"); it must be owned by this user and
 * writable by nobody else, or open fails with -EPERM (another local user
 * could otherwise take over the sockets). Writes travel as packets and land
 * in the responder's registered memory only when the responder's process
 * delivers them: verbs_emu_deliver() (the test chooses the moment), or at
 * every pump with auto=1. Polling a CQ, posting, and querying or erring a
 * QP pump the context (send what waits, read what arrived, turn
 * acknowledgements into completions). short_mr makes a faulty device: a
 * registration longer than BYTES registers (and reports) only BYTES.
 * max_inline (default 256, at most 4096) is the device's inline limit: a
 * QP that wants more is refused, one that wants less is granted its want
 * rounded up to 64 bytes (never past the limit), written back into its
 * caps as a provider writes cap.max_inline_data.
 * hold_ms (auto mode) makes a slow fabric: a write that arrives while
 * the file DIR/hold exists lands N ms after it arrived (in order: nothing
 * overtakes it), so a test can have writes land after the sender's peer
 * gave up on them (the late write of issue 13), and turn it off again.
 * flush=0 makes a device that never delivers the flush completions of a
 * QP in the error state (sends and receives): whoever waits for them
 * must bound the wait (transfer.verbs_flush_timeout_ms).
 */
#pragma once

#include "net/verbs/verbs_ops.h"

struct verbs_emu_stats {
	uint64_t applied;   /* writes that landed */
	uint64_t refused;   /* writes the emulated NIC refused (access) */
	uint64_t dropped;   /* writes for no QP / a QP not ready (not placed) */
	uint64_t rnr;       /* WRITE_WITH_IMM without a posted receive */
	uint64_t partial_bytes; /* held now for writes being assembled
				 * (their length + bookkeeping), at most
				 * VERBS_EMU_PARTIAL_MAX */
};

/* The most memory held for writes whose first packet arrived and whose
 * last has not; a first packet past it, or one not from the connected
 * peer of an existing QP, is dropped. */
#define VERBS_EMU_PARTIAL_MAX ((1ull << 30) + (64ull << 20))

/* Send what waits, read what arrived, process acknowledgements (and, in
 * auto mode, deliver everything). 0 or -errno. */
int verbs_emu_pump(struct verbs_ctx *ctx);
/* Pump, then apply up to n complete writes that arrived, oldest first,
 * each with the responder's checks of that moment. Returns how many
 * were applied or refused (both consume a write), or -errno. */
int verbs_emu_deliver(struct verbs_ctx *ctx, unsigned n);
/* Complete writes arrived and not yet delivered (after a pump). */
unsigned verbs_emu_arrived(struct verbs_ctx *ctx);
/* The oldest outstanding send WR of qp completes now with status (not
 * SUCCESS), as a NIC would report it; the QP goes to the error state and
 * the rest are flushed. A write already on the wire may still land.
 * -ENOENT when nothing is outstanding. */
int verbs_emu_inject(struct verbs_qp *qp, enum verbs_wc_status status);
/* Packets wait to leave (the receiver's datagram queue was full:
 * net.unix.max_dgram_qlen, 10 by default), or held writes wait to land
 * (hold_ms): nothing but another pump moves them, so an owner's loop
 * pumps again soon while this is true. */
bool verbs_emu_out_pending(struct verbs_ctx *ctx);
/* Readable when packets arrive: an owner's loop watches it and pumps. */
int verbs_emu_wire_fd(struct verbs_ctx *ctx);
void verbs_emu_stats(struct verbs_ctx *ctx, struct verbs_emu_stats *out);
