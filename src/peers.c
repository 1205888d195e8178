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

#include "conn.h"
#include "internal.h"
#include "log.h"

static int links_alloc(struct mp_ctx *ctx, struct mp_peer *p)
{
	size_t n = (size_t)ctx->nconn;

	p->conns = calloc(n, sizeof(*p->conns));
	p->ready = calloc(n, sizeof(*p->ready));
	p->links = calloc(n, sizeof(*p->links));
	if (!p->conns || !p->ready || !p->links)
		return -ENOMEM;
	return 0;
}

static void links_free(struct mp_peer *p)
{
	free(p->conns);
	free(p->ready);
	free(p->links);
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
	return 0;
}

int mp_peers_init(struct mp_ctx *ctx, int n)
{
	int rc = grow(ctx, n > 0 ? n : 1);

	if (rc)
		return rc;
	for (int i = 0; i < n; i++) {
		struct mp_peer *p = &ctx->peers[i];
		p->id = (uint64_t)i;
		p->bandwidth = 1.0;
		p->mode = MP_MODE_NORMAL;
		rc = links_alloc(ctx, p);
		if (rc)
			return rc;
	}
	ctx->npeers = n;
	return 0;
}

void mp_peers_free(struct mp_ctx *ctx)
{
	if (!ctx->peers)
		return;
	for (int i = 0; i < ctx->peers_cap; i++)
		links_free(&ctx->peers[i]);
	free(ctx->peers);
	ctx->peers = NULL;
	ctx->peers_cap = 0;
}

int mp_peer_find(const struct mp_ctx *ctx, uint64_t id)
{
	if (!ctx->dynamic)
		return id < (uint64_t)ctx->npeers ? (int)id : -1;
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
		rc = links_alloc(ctx, p);
		if (rc) {
			links_free(p);
			memset(p, 0, sizeof(*p));
			return rc;
		}
		idx = ctx->npeers++;
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

void mp_peer_gone(struct mp_ctx *ctx, int idx)
{
	struct mp_peer *p = &ctx->peers[idx];

	if (p->gone || idx == ctx->rank)
		return;
	p->gone = 1;
	for (int s = 0; s < ctx->nconn; s++)
		mp_conn_drop(ctx, idx, s);
	MP_INFO("peer %016llx left", (unsigned long long)p->id);
}

void mp_peer_suspect(struct mp_ctx *ctx, int idx, const char *why)
{
	struct mp_peer *p = &ctx->peers[idx];

	if (p->gone || idx == ctx->rank)
		return;
	if (why && !p->failed_ns) {
		MP_INFO("peer %016llx (%s) %s: taken as gone until a newer record",
			(unsigned long long)p->id, p->addr, why);
		ctx->suspects_new = 1;
	}
	p->failed_ns = mp_now_ns();
	p->failed_wall_ms = mp_wall_ms();
}
