/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * mp_peers_info: the peer table as the caller sees it. The table itself is
 * the progress thread's; this reads the copy it publishes (peers.c), so the
 * call is safe while an operation runs. mp_stats: the context's counters,
 * which their writers update atomically (MP_STAT_ADD).
 */
#include <errno.h>
#include <stddef.h>
#include <string.h>

#include "core.h"
#include "state_xfer.h"

int mp_peers_info(mp_ctx *ctx, struct mp_peer_info *out, int max, size_t elem_size)
{
	/* A caller's struct must hold at least the identity of a peer: the
	 * fields up to its address, which every version has. */
	if (!ctx || max < 0 || (max > 0 && !out) ||
	    elem_size < offsetof(struct mp_peer_info, addr) + MP_ADDR_STRLEN)
		return -EINVAL;
	return mp_peers_snapshot(ctx, out, max, elem_size);
}

int mp_stats(mp_ctx *ctx, struct mp_stats *out, size_t size)
{
	const struct mp_conn_stats *c;
	struct mp_stats st;

	if (!ctx || !out || size < offsetof(struct mp_stats, conns_accepted) + sizeof(uint64_t))
		return -EINVAL;
	memset(&st, 0, sizeof(st));
	for (int i = 0; i < MP_REJ_MAX; i++)
		st.frames_rejected += __atomic_load_n(&ctx->rejected[i], __ATOMIC_RELAXED);
	c = &ctx->cstats;
	st.conns_accepted = __atomic_load_n(&c->accepted, __ATOMIC_RELAXED);
	st.conns_authenticated = __atomic_load_n(&c->authenticated, __ATOMIC_RELAXED);
	st.conns_refused = __atomic_load_n(&c->refused, __ATOMIC_RELAXED);
	st.conns_timed_out = __atomic_load_n(&c->timed_out, __ATOMIC_RELAXED);
	st.conns_evicted = __atomic_load_n(&c->evicted, __ATOMIC_RELAXED);
	st.conns_hung_up = __atomic_load_n(&c->hung_up, __ATOMIC_RELAXED);
	st.handshakes_pending = __atomic_load_n(&c->pending, __ATOMIC_RELAXED);
	st.handshakes_max = __atomic_load_n(&c->pending_max, __ATOMIC_RELAXED);
	st.peers_known = __atomic_load_n(&c->peers_known, __ATOMIC_RELAXED);
	st.peers_held = __atomic_load_n(&c->peers_held, __ATOMIC_RELAXED);
	if (ctx->core->state_srv) {
		struct mp_state_srv_counts sc;

		mp_state_srv_counts(ctx->core->state_srv, &sc);
		st.state_served = sc.served;
		st.state_refused = sc.refused;
		st.state_cut = sc.cut;
		st.state_busy = sc.busy;
	}
	memcpy(out, &st, size < sizeof(st) ? size : sizeof(st));
	return 0;
}
