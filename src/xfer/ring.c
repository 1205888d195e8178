/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Ring all-reduce over all peers: the bandwidth-optimal baseline that MPI and
 * NCCL use. N parts; N-1 reduce-scatter steps pass partial sums Σ w·x to the
 * right neighbour, then N-1 all-gather steps pass the finished means on.
 * Chunk c of every part travels on stream c mod S and frames on a stream come
 * in (step, chunk) order, so chunk c of step t can leave as soon as chunk c of
 * step t-1 has arrived: the steps pipeline.
 *
 * The ring is not fault tolerant, by design of the algorithm: if any peer
 * fails, the operation fails with -EHOSTUNREACH and the buffer is undefined.
 * An exchange given up at its start (a neighbour's settings or length
 * differ, found before any frame is applied) leaves the buffer as it was.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "xfer.h"
#include "mp_kernels.h"
#include "log.h"
#include "parts.h"

struct ring {
	struct mp_ctx *ctx;
	struct mp_avg *a;
	int N, r, left, right, S, steps;
	size_t C;
	uint64_t *off, *len, *nch, *base; /* per part; base = first global chunk id */
	float *wsum;                       /* per global chunk */
	int *sst, *rst;                    /* per stream: step cursors */
	uint64_t *sc, *rc;                 /* per stream: chunk cursors */
	uint64_t *sleft, *rleft;           /* per stream: messages left */
	uint8_t *enc;
	size_t enc_cap;
	void *scr;       /* encoder scratch */
	int broken;
};

static int mod(int a, int n)
{
	return ((a % n) + n) % n;
}

static int part_sent(const struct ring *g, int st)
{
	return st < g->N - 1 ? mod(g->r - st, g->N) : mod(g->r + 1 - (st - (g->N - 1)), g->N);
}

static int part_recv(const struct ring *g, int st)
{
	return st < g->N - 1 ? mod(g->r - st - 1, g->N) : mod(g->r - (st - (g->N - 1)), g->N);
}

/* Skip steps whose part has no chunk on stream @s. */
static void normalize(const struct ring *g, int (*pf)(const struct ring *, int), int s, int *st,
		      uint64_t *c)
{
	while (*st < g->steps && *c >= g->nch[pf(g, *st)]) {
		(*st)++;
		*c = (uint64_t)s;
	}
}

static uint32_t count_of(const struct ring *g, int p, uint64_t c)
{
	uint64_t n = g->len[p] - c * g->C;
	return (uint32_t)(n < g->C ? n : g->C);
}

static int r_produce(void *op, struct mp_chan *ch, struct mp_wire_hdr *h, struct mp_payload *pl)
{
	struct ring *g = op;
	int s = ch->stream, st = g->sst[s];
	uint64_t c = g->sc[s];

	if (g->broken || ch->peer != g->right || st >= g->steps)
		return 0;
	/* Chunk c of step st carries what arrived as chunk c of step st-1. */
	if (st > 0 && !(g->rst[s] > st - 1 || (g->rst[s] == st - 1 && g->rc[s] > c)))
		return 0;
	int p = part_sent(g, st);
	h->type = st < g->N - 1 ? MP_MSG_RING_RS : MP_MSG_RING_AG;
	h->part = (uint32_t)st;
	h->offset = g->off[p] + c * g->C;
	h->count = count_of(g, p, c);
	h->weight = st == 0 ? g->a->weight : g->wsum[g->base[p] + c];
	h->aux = st < g->N - 1 ? (uint32_t)(st + 1) : (uint32_t)g->N;
	*pl = (struct mp_payload){.kind = MP_PAYLOAD_VALUES, .values = g->a->x + h->offset};
	g->sc[s] = c + (uint64_t)g->S;
	normalize(g, part_sent, s, &g->sst[s], &g->sc[s]);
	g->sleft[s]--;
	return 1;
}

static void finish_chunk(struct ring *g, float *x, uint32_t n, float w)
{
	const struct mp_codec_ops *codec = g->a->codec;

	if (w > 0.0f)
		mp_k_scale(x, x, 1.0f / w, n);
	if (codec->id != MP_CODEC_NONE) {
		/* Keep what the others will decode. */
		size_t len;
		if (!codec->encode(&g->ctx->cparams, x, NULL, n, g->enc, g->enc_cap, &len, g->scr))
			codec->decode(g->enc, len, x, n);
	}
}

static int r_consume(void *op, struct mp_chan *ch, const struct mp_wire_hdr *h, const void *payload)
{
	struct ring *g = op;
	const struct mp_codec_ops *codec = g->a->codec;
	int s = ch->stream, st = g->rst[s];
	uint64_t c = g->rc[s];

	if (ch->peer != g->left || st >= g->steps)
		return -EPROTO;
	int p = part_recv(g, st);
	int rs = st < g->N - 1;
	if (h->type != (rs ? MP_MSG_RING_RS : MP_MSG_RING_AG) || h->part != (uint32_t)st ||
	    h->offset != g->off[p] + c * g->C || h->count != count_of(g, p, c))
		return -EPROTO;
	float *x = g->a->x + h->offset;
	if (rs) {
		/* Our own contribution joins the partial sum as it passes. */
		if (g->a->weight != 1.0f)
			mp_k_scale(x, x, g->a->weight, h->count);
		if (codec->decode_acc(payload, h->length, x, h->count, 1.0f))
			return -EPROTO;
		g->wsum[g->base[p] + c] = h->weight + g->a->weight;
		if (st == g->N - 2)
			finish_chunk(g, x, h->count, g->wsum[g->base[p] + c]);
	} else {
		if (codec->decode(payload, h->length, x, h->count))
			return -EPROTO;
		g->wsum[g->base[p] + c] = h->weight;
	}
	g->rc[s] = c + (uint64_t)g->S;
	normalize(g, part_recv, s, &g->rst[s], &g->rc[s]);
	g->rleft[s]--;
	return 0;
}

static uint64_t r_recv_left(void *op, struct mp_chan *ch)
{
	struct ring *g = op;

	return g->broken || ch->peer != g->left ? 0 : g->rleft[ch->stream];
}

static uint64_t r_send_left(void *op, struct mp_chan *ch)
{
	struct ring *g = op;

	return g->broken || ch->peer != g->right ? 0 : g->sleft[ch->stream];
}

static void r_peer_failed(void *op, int peer)
{
	struct ring *g = op;

	(void)peer;
	g->broken = 1;
}

static const struct mp_xfer_ops ring_ops = {
	.produce = r_produce,
	.consume = r_consume,
	.recv_left = r_recv_left,
	.send_left = r_send_left,
	.peer_failed = r_peer_failed,
};

int mp_ring_allreduce(struct mp_ctx *ctx, uint32_t round, struct mp_avg *a)
{
	int N = ctx->npeers, S = ctx->streams, rc = -ENOMEM;
	struct ring g = {.ctx = ctx, .a = a, .N = N, .r = ctx->rank, .S = S,
			 .steps = 2 * (N - 1), .C = ctx->chunk_elems};
	struct mp_xfer x = {.ctx = ctx, .xops = &ring_ops, .op = &g, .round = round, .group_id = 0,
			    .user_mr = a->dmr, .res = a->res, .what = "ring all-reduce",
			    .codec = a->codec, .total = a->n, .gate = 1};
	float *own = NULL;

	/* Failure memory (static runs): the ring closes over the live peers,
	 * in rank order, so a down peer is skipped, not waited for. */
	if (ctx->live && ctx->nlive < ctx->npeers) {
		N = g.N = ctx->nlive;
		g.steps = 2 * (N - 1);
		for (int i = 0; i < N; i++)
			if (ctx->live[i] == ctx->rank)
				g.r = i;
	}
	if (N < 2) {
		a->res->rounds++;
		return 0;
	}
	{
		/* Short vectors: one direct exchange among the ring's peers. */
		int *members = malloc((size_t)N * sizeof(int));
		struct mp_group dg = {.members = members, .size = N, .my_index = g.r, .id = 0};

		if (!members)
			return -ENOMEM;
		for (int i = 0; i < N; i++)
			members[i] = ctx->live && ctx->nlive < ctx->npeers ? ctx->live[i] : i;
		if (mp_direct_fits(ctx, &dg, a)) {
			rc = mp_direct_allreduce(ctx, &dg, round, a, 1);
			free(members);
			return rc;
		}
		free(members);
	}
	g.left = ctx->live && ctx->nlive < ctx->npeers ? ctx->live[mod(g.r - 1, N)] : mod(g.r - 1, N);
	g.right = ctx->live && ctx->nlive < ctx->npeers ? ctx->live[mod(g.r + 1, N)] : mod(g.r + 1, N);
	g.off = calloc((size_t)N * 4, sizeof(uint64_t));
	g.sst = calloc((size_t)S * 2, sizeof(int));
	g.sc = calloc((size_t)S * 4, sizeof(uint64_t));
	x.nch = g.left == g.right ? S : 2 * S;
	x.ch = calloc((size_t)x.nch, sizeof(*x.ch));
	/* Never a sparse codec here: mp_config_resolve refuses them for the
	 * ring, "auto" never picks one, and a flush runs uncompressed. */
	g.enc_cap = a->codec->max_encoded(&ctx->cparams, g.C);
	size_t scr = a->codec->scratch_size ? a->codec->scratch_size(&ctx->cparams, g.C) : 0;
	g.enc = malloc(g.enc_cap + 64);
	g.scr = scr ? aligned_alloc(64, (scr + 63) & ~(size_t)63) : NULL;
	if (!g.off || !g.sst || !g.sc || !x.ch || !g.enc || (scr && !g.scr))
		goto out;
	g.len = g.off + N;
	g.nch = g.len + N;
	g.base = g.nch + N;
	g.rst = g.sst + S;
	g.rc = g.sc + S;
	g.sleft = g.rc + S;
	g.rleft = g.sleft + S;
	rc = mp_parts_split(a->n, NULL, N, g.len);
	if (rc)
		goto out;
	uint64_t total = 0;
	for (int p = 0; p < N; p++) {
		g.off[p] = p ? g.off[p - 1] + g.len[p - 1] : 0;
		g.nch[p] = (g.len[p] + g.C - 1) / g.C;
		g.base[p] = total;
		total += g.nch[p];
	}
	g.wsum = calloc(total ? total : 1, sizeof(float));
	if (!g.wsum) {
		rc = -ENOMEM;
		goto out;
	}
	for (int s = 0; s < S; s++) {
		g.sc[s] = g.rc[s] = (uint64_t)s;
		normalize(&g, part_sent, s, &g.sst[s], &g.sc[s]);
		normalize(&g, part_recv, s, &g.rst[s], &g.rc[s]);
		for (int st = 0; st < g.steps; st++) {
			uint64_t ns = g.nch[part_sent(&g, st)], nr = g.nch[part_recv(&g, st)];
			g.sleft[s] += ns > (uint64_t)s ? (ns - (uint64_t)s + (uint64_t)S - 1) / (uint64_t)S : 0;
			g.rleft[s] += nr > (uint64_t)s ? (nr - (uint64_t)s + (uint64_t)S - 1) / (uint64_t)S : 0;
		}
		x.ch[s].peer = g.right;
		x.ch[s].stream = s;
		if (g.left != g.right) {
			x.ch[S + s].peer = g.left;
			x.ch[S + s].stream = s;
		}
	}
	if (a->weight != 1.0f) {
		/* Our part goes out as w·x; kept as it was, for an exchange given
		 * up before anything arrived (the engine's OPEN check). */
		own = malloc(g.len[g.r] * sizeof(float) + 1);
		if (!own) {
			free(g.wsum);
			rc = -ENOMEM;
			goto out;
		}
		memcpy(own, a->x + g.off[g.r], g.len[g.r] * sizeof(float));
		mp_k_scale(a->x + g.off[g.r], a->x + g.off[g.r], a->weight, g.len[g.r]);
	}
	rc = mp_xfer_run(&x);
	if (x.fatal && own)
		memcpy(a->x + g.off[g.r], own, g.len[g.r] * sizeof(float));
	if (!rc && g.broken) {
		mp_set_error(ctx, "ring all-reduce round %u failed: a peer dropped out (the ring cannot "
			     "finish without every peer; the buffer is undefined)", round);
		rc = -EHOSTUNREACH;
	}
	if (!rc) {
		a->influence = (uint64_t)N;
		if (total)
			a->weight = g.wsum[0] / (float)N;
		a->res->rounds++;
	}
	free(g.wsum);
out:
	free(own);
	free(g.enc);
	free(g.scr);
	free(x.ch);
	free(g.sc);
	free(g.sst);
	free(g.off);
	return rc;
}
