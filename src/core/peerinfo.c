/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * mp_peers_info: the peer table as the caller sees it. The table itself is
 * the progress thread's; this reads the copy it publishes (peers.c), so the
 * call is safe while an operation runs.
 */
#include <errno.h>
#include <stddef.h>

#include "core.h"

int mp_peers_info(mp_ctx *ctx, struct mp_peer_info *out, int max, size_t elem_size)
{
	/* A caller's struct must hold at least the identity of a peer: the
	 * fields up to its address, which every version has. */
	if (!ctx || max < 0 || (max > 0 && !out) ||
	    elem_size < offsetof(struct mp_peer_info, addr) + MP_ADDR_STRLEN)
		return -EINVAL;
	return mp_peers_snapshot(ctx, out, max, elem_size);
}
