/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Butterfly all-reduce inside one group of k peers (the Moshpit round and the
 * `butterfly` baseline). The vector is cut into k parts, sized by the members'
 * bandwidth weights; member i reduces part i. Every part streams in chunks:
 *
 *   reduce-scatter  each member sends chunk c of part j to member j (SCATTER);
 *                   the reducer accumulates Σ w·x in fp32
 *   all-gather      once every live member's chunk c has arrived, the reducer
 *                   divides by Σ w and sends the chunk back (GATHER)
 *
 * Chunk c of any part travels on stream c mod S, so both ends know which
 * frame comes next on each connection and can check it exactly.
 *
 * Weights: the group result is Σ w·x / Σ w, and each member leaves with the
 * group's mean weight Σ w / k. Averaging the pairs (w·x, w) like this keeps the
 * totals Σ w·x and Σ w over all peers unchanged, so repeated rounds converge
 * to the exact weighted global mean on any grid, and a full grid reaches it
 * after d rounds.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "kernels.h"
#include "log.h"
#include "parts.h"

struct gchan {
	int j;                 /* member index of the channel's peer */
	uint64_t scat_next;    /* next chunk of part j we send (SCATTER) */
	uint64_t gath_next;    /* next chunk of our part we return (GATHER) */
	uint64_t rscat_next;   /* next chunk of our part expected from j */
	uint64_t rgath_next;   /* next chunk of part j expected back from j */
};

struct gar {
	struct mp_ctx *ctx;
	const struct mp_group *g;
	struct mp_avg *a;
	int k, me, S;
	size_t C;
	uint64_t *off, *len, *nch; /* per member */
	int *failed;               /* per member */
	struct gchan *gc;          /* per channel */
	struct mp_chan *ch;
	/* our part */
	float *acc;
	float *wsum;
	uint32_t *ncontrib;
	uint8_t *cdone;
	uint64_t ndone;
	/* lossy codecs: each finished chunk of our part, encoded once for all */
	uint8_t *enc;          /* nch[me] slots of enc_cap bytes */
	uint32_t *enc_len;
	size_t enc_cap;
	float *rtmp;           /* sparse codecs: what the return path held back */
	/* weight reported by the group (sum, contributors) */
	double gw_sum;
	uint32_t gw_n;
};

/* Chunks at or after @next on the stream of @next's residue. */
static uint64_t left_from(uint64_t nch, uint64_t next, int S)
{
	return nch > next ? (nch - next + (uint64_t)S - 1) / (uint64_t)S : 0;
}

static uint32_t chunk_count(const struct gar *r, int member, uint64_t c)
{
	uint64_t start = c * r->C;
	uint64_t n = r->len[member] - start;
	return (uint32_t)(n < r->C ? n : r->C);
}

static int contributed(const struct gar *r, int m, uint64_t c)
{
	/* Contributions arrive in order per stream, so "m sent chunk c" is
	 * "m's cursor on c's stream has passed c". */
	for (int i = 0; i < r->k - 1; i++) {
		const struct gchan *gc = &r->gc[i * r->S + (int)(c % (uint64_t)r->S)];
		if (gc->j == m)
			return gc->rscat_next > c;
	}
	return 0;
}

static void complete_chunk(struct gar *r, uint64_t c)
{
	struct mp_ctx *ctx = r->ctx;
	const struct mp_codec_ops *codec = r->a->codec;
	uint32_t n = chunk_count(r, r->me, c);
	uint64_t off = r->off[r->me] + c * r->C;
	float *x = r->a->x + off;
	float *acc = r->acc + c * r->C;

	if (r->wsum[c] > 0.0f)
		mp_k_scale(x, acc, 1.0f / r->wsum[c], n);
	/* else: nobody had weight; the part keeps this peer's own values. */
	if (codec->id != MP_CODEC_NONE) {
		/*
		 * Members receive the encoded result; the reducer keeps exactly
		 * what they decode, so the whole group holds identical values.
		 * Encoded once here and sent to every member as it is.
		 *
		 * Sparse codecs: what the result's encoding leaves out is lost to
		 * all ncontrib members that take it, each with weight wsum/ncontrib.
		 * The reducer keeps that whole mass in its own residue (ncontrib
		 * times the difference, at its new weight), so Σ w·(x + residue)
		 * over all peers is unchanged by the round (doc/codecs.md).
		 */
		uint8_t *e = r->enc + c * r->enc_cap;
		float *res = NULL;
		size_t len = 0;
		void *scr = codec->scratch_size ?
			mp_scratch(ctx, MP_SCR_ENCODE, codec->scratch_size(&ctx->cparams, ctx->chunk_elems)) :
			NULL;

		if (codec->flags & MP_CODEC_F_SPARSE) {
			res = r->rtmp;
			memset(res, 0, n * sizeof(float));
		}
		if ((codec->scratch_size && !scr) ||
		    codec->encode(&ctx->cparams, x, res, n, e, r->enc_cap, &len, scr) ||
		    codec->decode(e, len, x, n)) {
			/* Cannot happen with a buffer of max_encoded bytes; if it
			 * does, members get a frame they will reject, not garbage. */
			MP_WARN("round: encoding a reduced chunk failed");
			len = 0;
		}
		r->enc_len[c] = (uint32_t)len;
		if (res && r->a->residue)
			mp_k_axpy(r->a->residue + off, res, (float)r->ncontrib[c], n);
	}
	r->cdone[c] = 1;
	r->ndone++;
}

static void try_complete(struct gar *r, uint64_t c)
{
	if (r->cdone[c])
		return;
	for (int m = 0; m < r->k; m++)
		if (m != r->me && !r->failed[m] && !contributed(r, m, c))
			return;
	complete_chunk(r, c);
}

static struct gchan *gchan_of(struct gar *r, struct mp_chan *ch)
{
	return &r->gc[ch - r->ch];
}

static int g_produce(void *op, struct mp_chan *ch, struct mp_wire_hdr *h, const float **src)
{
	struct gar *r = op;
	struct gchan *gc = gchan_of(r, ch);
	int me = r->me;

	/* Results first: other members are waiting on them. */
	if (gc->gath_next < r->nch[me] && r->cdone[gc->gath_next]) {
		uint64_t c = gc->gath_next;
		h->type = MP_MSG_GATHER;
		h->part = (uint32_t)me;
		h->offset = r->off[me] + c * r->C;
		h->count = chunk_count(r, me, c);
		h->weight = r->wsum[c];
		h->aux = r->ncontrib[c];
		gc->gath_next += (uint64_t)r->S;
		if (r->a->codec->id != MP_CODEC_NONE) {
			h->length = r->enc_len[c];
			*src = (const float *)(const void *)(r->enc + c * r->enc_cap);
			return 2;
		}
		*src = r->a->x + h->offset;
		return 1;
	}
	if (gc->scat_next < r->nch[gc->j]) {
		uint64_t c = gc->scat_next;
		h->type = MP_MSG_SCATTER;
		h->part = (uint32_t)gc->j;
		h->offset = r->off[gc->j] + c * r->C;
		h->count = chunk_count(r, gc->j, c);
		h->weight = r->a->weight;
		*src = r->a->x + h->offset;
		gc->scat_next += (uint64_t)r->S;
		return 1;
	}
	return 0;
}

static int g_consume(void *op, struct mp_chan *ch, const struct mp_wire_hdr *h, const void *payload)
{
	struct gar *r = op;
	struct gchan *gc = gchan_of(r, ch);
	int me = r->me, j = gc->j;

	if (h->type == MP_MSG_SCATTER) {
		uint64_t c = gc->rscat_next;
		if (c >= r->nch[me] || h->part != (uint32_t)me || h->offset != r->off[me] + c * r->C ||
		    h->count != chunk_count(r, me, c))
			return -EPROTO;
		if (r->a->codec->decode_acc(payload, h->length, r->acc + c * r->C, h->count, h->weight))
			return -EPROTO;
		r->wsum[c] += h->weight;
		r->ncontrib[c]++;
		gc->rscat_next += (uint64_t)r->S;
		try_complete(r, c);
		return 0;
	}
	if (h->type == MP_MSG_GATHER) {
		uint64_t c = gc->rgath_next;
		if (c >= r->nch[j] || h->part != (uint32_t)j || h->offset != r->off[j] + c * r->C ||
		    h->count != chunk_count(r, j, c) || h->aux < 1 || h->aux > (uint32_t)r->k)
			return -EPROTO;
		/* Validated: only now may the frame touch the user's buffer. */
		if (r->a->codec->decode(payload, h->length, r->a->x + h->offset, h->count))
			return -EPROTO;
		if (!r->gw_n) {
			r->gw_sum = h->weight;
			r->gw_n = h->aux;
		}
		gc->rgath_next += (uint64_t)r->S;
		return 0;
	}
	return -EPROTO;
}

static uint64_t g_recv_left(void *op, struct mp_chan *ch)
{
	struct gar *r = op;
	struct gchan *gc = gchan_of(r, ch);

	return left_from(r->nch[r->me], gc->rscat_next, r->S) + left_from(r->nch[gc->j], gc->rgath_next, r->S);
}

static uint64_t g_send_left(void *op, struct mp_chan *ch)
{
	struct gar *r = op;
	struct gchan *gc = gchan_of(r, ch);

	return left_from(r->nch[r->me], gc->gath_next, r->S) + left_from(r->nch[gc->j], gc->scat_next, r->S);
}

static void g_peer_failed(void *op, int peer)
{
	struct gar *r = op;

	for (int m = 0; m < r->k; m++)
		if (r->g->members[m] == peer)
			r->failed[m] = 1;
	for (uint64_t c = 0; c < r->nch[r->me]; c++)
		try_complete(r, c);
}

static const struct mp_xfer_ops gar_ops = {
	.produce = g_produce,
	.consume = g_consume,
	.recv_left = g_recv_left,
	.send_left = g_send_left,
	.peer_failed = g_peer_failed,
};

int mp_group_allreduce(struct mp_ctx *ctx, const struct mp_group *g, uint32_t round,
		       struct mp_avg *a)
{
	struct gar r = {.ctx = ctx, .g = g, .a = a, .k = g->size, .me = g->my_index,
			.S = ctx->streams, .C = ctx->chunk_elems};
	struct mp_xfer x = {.ctx = ctx, .xops = &gar_ops, .op = &r, .round = round,
			    .group_id = g->id, .user_mr = a->dmr, .res = a->res,
			    .what = "group all-reduce", .codec = a->codec, .residue = a->residue};
	double *bw = NULL;
	int rc = -ENOMEM, k = g->size;

	if (k < 2) {
		/* Alone on its line of the grid (partial grids): nothing to average. */
		a->res->rounds++;
		return 0;
	}
	r.off = calloc((size_t)k * 3, sizeof(uint64_t));
	r.failed = calloc((size_t)k, sizeof(int));
	bw = malloc((size_t)k * sizeof(double));
	x.nch = (k - 1) * r.S;
	x.ch = calloc((size_t)x.nch, sizeof(*x.ch));
	r.gc = calloc((size_t)x.nch, sizeof(*r.gc));
	if (!r.off || !r.failed || !bw || !x.ch || !r.gc)
		goto out;
	r.len = r.off + k;
	r.nch = r.len + k;
	r.ch = x.ch;
	for (int m = 0; m < k; m++)
		bw[m] = ctx->peers[g->members[m]].bandwidth;
	rc = mp_parts_split(a->n, bw, k, r.len);
	if (rc) {
		mp_set_error(ctx, "round %u: cannot split %zu values over the group's bandwidths", round, a->n);
		goto out;
	}
	for (int m = 0; m < k; m++) {
		r.off[m] = m ? r.off[m - 1] + r.len[m - 1] : 0;
		r.nch[m] = (r.len[m] + r.C - 1) / r.C;
	}

	/* Our part's reduction state, allocated once per round, not per chunk. */
	uint64_t mine = r.len[r.me], nc = r.nch[r.me];
	int lossy = a->codec->id != MP_CODEC_NONE;
	int sparse = (a->codec->flags & MP_CODEC_F_SPARSE) != 0;
	r.enc_cap = lossy ? (a->codec->max_encoded(&ctx->cparams, r.C) + 63) & ~(size_t)63 : 0;
	/* Layout: acc | wsum | ncontrib | enc_len | rtmp | cdone | enc (64-aligned) */
	size_t fixed = mine * sizeof(float) + nc * (sizeof(float) + 2 * sizeof(uint32_t)) +
		       (sparse ? r.C * sizeof(float) : 0) + nc;
	fixed = (fixed + 63) & ~(size_t)63;
	r.acc = mp_scratch(ctx, MP_SCR_REDUCE, fixed + nc * r.enc_cap);
	if (!r.acc) {
		rc = -ENOMEM;
		goto out;
	}
	r.wsum = r.acc + mine;
	r.ncontrib = (uint32_t *)(r.wsum + nc);
	r.enc_len = r.ncontrib + nc;
	r.rtmp = (float *)(r.enc_len + nc);
	r.cdone = (uint8_t *)(r.rtmp + (sparse ? r.C : 0));
	r.enc = (uint8_t *)r.acc + fixed;
	memset(r.cdone, 0, nc);
	if (a->residue && mine) {
		/* Our own part reaches the result without the wire: it carries
		 * its held-back residue along in full (mass moves, none is lost). */
		float *xr = a->x + r.off[r.me], *er = a->residue + r.off[r.me];
		mp_k_axpy(xr, er, 1.0f, mine);
		memset(er, 0, mine * sizeof(float));
	}
	mp_k_scale(r.acc, a->x + r.off[r.me], a->weight, mine);
	for (uint64_t c = 0; c < nc; c++) {
		r.wsum[c] = a->weight;
		r.ncontrib[c] = 1;
	}

	int i = 0;
	for (int m = 0; m < k; m++) {
		if (m == r.me)
			continue;
		for (int s = 0; s < r.S; s++, i++) {
			x.ch[i].peer = g->members[m];
			x.ch[i].stream = s;
			r.gc[i].j = m;
			r.gc[i].scat_next = r.gc[i].gath_next = (uint64_t)s;
			r.gc[i].rscat_next = r.gc[i].rgath_next = (uint64_t)s;
		}
	}
	rc = mp_xfer_run(&x);
	if (rc)
		goto out;

	/* Chunks nobody can still contribute to (all others failed) are done too. */
	for (uint64_t c = 0; c < nc; c++)
		if (!r.cdone[c])
			complete_chunk(&r, c);
	int alive = 1;
	for (int m = 0; m < k; m++)
		if (m != r.me && !r.failed[m])
			alive++;
	if (alive == 1) {
		mp_set_error(ctx, "round %u: every other member of the group failed", round);
		rc = -EHOSTUNREACH;
		goto out;
	}
	/* The group's mean weight: from our own part if we reduced one, else as
	 * reported by a reducer. */
	float wold = a->weight;
	if (nc && r.ncontrib[0])
		a->weight = r.wsum[0] / (float)r.ncontrib[0];
	else if (r.gw_n)
		a->weight = (float)(r.gw_sum / r.gw_n);
	if (a->residue && a->weight > 0.0f && a->weight != wold) {
		/* What the residue holds back counts at this peer's weight: keep
		 * its mass w·e as the weight changes. Our own part's residue was
		 * emptied above and refilled at the new weight already. */
		float f = wold / a->weight;
		uint64_t o = r.off[r.me], l = r.len[r.me];
		mp_k_scale(a->residue, a->residue, f, o);
		mp_k_scale(a->residue + o + l, a->residue + o + l, f, a->n - o - l);
	}
	/* Each round on a grid joins disjoint sets, so the sets multiply; the
	 * count is capped at the number of peers. */
	a->influence *= (uint64_t)alive;
	if (a->influence > (uint64_t)ctx->npeers)
		a->influence = (uint64_t)ctx->npeers;
	a->res->rounds++;
out:
	free(r.gc);
	free(x.ch);
	free(bw);
	free(r.failed);
	free(r.off);
	return rc;
}
