/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The peer table. A static run knows every peer from the start (index =
 * rank = id); a DHT run learns peers from rendezvous records and from HELLOs
 * and appends them. Indices never change, so groups, channels and logs can
 * hold them; a peer that leaves is marked gone, not removed.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "ctx.h"
#include "log.h"

/* ---- id -> index, for runs whose peers come from the rendezvous ----
 *
 * A DHT run's peers are found by id for every record, HELLO and declaration
 * it takes; with thousands of peers a scan of the table per lookup made each
 * membership refresh quadratic. Peers are only ever appended (indices never
 * change, departures are marks), so the index needs no deletion: linear
 * probing in a table at most half full, rebuilt when the peer table grows.
 */
static uint32_t ix_home(uint64_t id, uint32_t mask)
{
	/* Ids are random, or ranks 0..n-1 in tests: Fibonacci hashing spreads both. */
	return (uint32_t)((id * 0x9E3779B97F4A7C15ull) >> 32) & mask;
}

static void ix_put(struct mp_ctx *ctx, int idx)
{
	uint32_t m = ctx->peer_ix_mask, s = ix_home(ctx->peers[idx].id, m);

	if (!ctx->peer_ix)
		return;
	while (ctx->peer_ix[s])
		s = (s + 1) & m;
	ctx->peer_ix[s] = idx + 1;
}

/* An index of 2 x peers_cap slots (a power of two: peers_cap is one) for the first npeers. */
static int ix_rebuild(struct mp_ctx *ctx)
{
	size_t slots = 2 * (size_t)ctx->peers_cap;
	int *ix = calloc(slots, sizeof(*ix));

	if (!ix)
		return -ENOMEM;
	free(ctx->peer_ix);
	ctx->peer_ix = ix;
	ctx->peer_ix_mask = (uint32_t)(slots - 1);
	for (int i = 0; i < ctx->npeers; i++)
		ix_put(ctx, i);
	return 0;
}

static int grow(struct mp_ctx *ctx, int want)
{
	struct mp_peer *np;
	int cap = ctx->peers_cap ? ctx->peers_cap : 8;

	if (want <= ctx->peers_cap)
		return 0;
	while (cap < want)
		cap *= 2;
	np = realloc(ctx->peers, (size_t)cap * sizeof(*np));
	if (!np)
		return -ENOMEM;
	memset(np + ctx->peers_cap, 0, (size_t)(cap - ctx->peers_cap) * sizeof(*np));
	ctx->peers = np;
	ctx->peers_cap = cap;
	if (ctx->dynamic && ix_rebuild(ctx)) {
		/* Without memory for a larger index, lookups scan (mp_peer_find). */
		free(ctx->peer_ix);
		ctx->peer_ix = NULL;
	}
	return 0;
}

int mp_peers_init(struct mp_ctx *ctx, int n)
{
	int rc;

	ctx->npeers = 0; /* mp_init left the configured count here */
	rc = grow(ctx, n > 0 ? n : 1);

	if (rc)
		return rc;
	for (int i = 0; i < n; i++) {
		struct mp_peer *p = &ctx->peers[i];
		p->id = (uint64_t)i;
		p->bandwidth = 1.0;
		p->mode = MP_MODE_NORMAL;
	}
	ctx->npeers = n;
	return 0;
}

void mp_peers_free(struct mp_ctx *ctx)
{
	if (!ctx->peers)
		return;
	free(ctx->peers);
	ctx->peers = NULL;
	ctx->peers_cap = 0;
	free(ctx->peer_ix);
	ctx->peer_ix = NULL;
}

int mp_peer_find(const struct mp_ctx *ctx, uint64_t id)
{
	if (!ctx->dynamic)
		return id < (uint64_t)ctx->npeers ? (int)id : -1;
	if (ctx->peer_ix) {
		uint32_t m = ctx->peer_ix_mask, s = ix_home(id, m);

		/* At most half full: a free slot ends the probe (the bound is a guard). */
		for (uint32_t k = 0; k <= m && ctx->peer_ix[s]; k++, s = (s + 1) & m)
			if (ctx->peers[ctx->peer_ix[s] - 1].id == id)
				return ctx->peer_ix[s] - 1;
		return -1;
	}
	/* A table built by hand (unit tests) has no index. */
	for (int i = 0; i < ctx->npeers; i++)
		if (ctx->peers[i].id == id)
			return i;
	return -1;
}

static int set_addr(struct mp_ctx *ctx, struct mp_peer *p, const char *addr)
{
	uint8_t blob[MP_DRV_ADDR_MAX];
	size_t blen = sizeof(blob);

	if (!addr || !*addr || !strcmp(addr, p->addr))
		return 0;
	if (strlen(addr) >= sizeof(p->addr) || ctx->ops->addr_parse(ctx->drv, addr, blob, &blen))
		return -EINVAL;
	memcpy(p->blob, blob, blen);
	p->blob_len = blen;
	strcpy(p->addr, addr);
	return 0;
}

int mp_peer_learn(struct mp_ctx *ctx, uint64_t id, const char *addr, double bandwidth, int mode)
{
	int idx = mp_peer_find(ctx, id), rc;
	struct mp_peer *p;

	if (idx < 0) {
		if (!ctx->dynamic)
			return -EPERM;
		rc = grow(ctx, ctx->npeers + 1);
		if (rc)
			return rc;
		p = &ctx->peers[ctx->npeers];
		memset(p, 0, sizeof(*p));
		p->id = id;
		idx = ctx->npeers++;
		ix_put(ctx, idx);
		MP_INFO("learned peer %016llx%s%s", (unsigned long long)id, addr && *addr ? " at " : "",
			addr ? addr : "");
	}
	p = &ctx->peers[idx];
	rc = set_addr(ctx, p, addr);
	if (rc)
		return rc;
	if (ctx->dynamic) {
		p->bandwidth = bandwidth;
		p->mode = mode;
	}
	return idx;
}

void mp_peer_suspect(struct mp_ctx *ctx, int idx, const char *why)
{
	struct mp_peer *p = &ctx->peers[idx];

	if (p->gone || idx == ctx->rank)
		return;
	if (why && !p->failed_ns) {
		MP_INFO("peer %016llx (%s) %s: taken as gone until a newer record",
			(unsigned long long)p->id, p->addr, why);
		ctx->suspects++;
	}
	p->failed_ns = mp_now_ns();
	p->failed_wall_ms = mp_wall_ms();
}
