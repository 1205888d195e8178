/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Pairwise exchange (recursive doubling): the latency path for short
 * vectors in groups of 4 to 64 members. The direct exchange (direct.c)
 * sends every member's vector to every other in one hop, k-1 frames each;
 * on a host with fewer cores than peers, each of those frames wakes a
 * process, and a member waits until all k-1 senders have been scheduled.
 * Here a member exchanges a running sum with one partner per step, log2(k)
 * steps: 3 frames instead of 7 in a group of 8, and each step waits for one
 * process only (doc/performance.md, "Short vectors").
 *
 * The group's first p = 2^m members are the core; each of the other r =
 * k - p (the extras) is paired with core member e - p. A core member i
 * first takes its extra's values (PRE), then for s = 0..m-1 exchanges its
 * running sum with core member i ^ 2^s, then sends the final sum to its
 * extra (POST). A PAIR frame carries a sum: the set of members in it (a
 * bit mask), their weights in member order, and Σ w·x in fp32, each
 * product rounded before the add, as the direct exchange and the reducer
 * do. Partners add the two sums of a step in the same order (IEEE addition
 * commutes), so without failures every member ends with the same bits;
 * the sums' tree differs from the direct exchange's member order, so the
 * bits differ from it by fp32 rounding.
 *
 * Failures: a partner that fails (before its frame came) is skipped, and
 * the step adds nothing; the steps after it go on. Each member's result is
 * Σ w·x / Σ w over exactly the members in its final set, and the
 * contribution log says which (a 'reduce' of the whole vector): a member
 * that died after its first step is in the results of those its sum
 * reached, as in the direct exchange a member that died mid-send is in the
 * results of those its frame reached. For the ring (@strict), a result
 * without every member fails with -EHOSTUNREACH, the buffer unchanged.
 *
 * The buffer is not written before the end: the running sum lives in
 * scratch memory, and frames are copied out of it into the engine's
 * (registered) slots as they leave.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <moshpit/sdk/le.h>

#include "clog.h"
#include "fault.h"
#include "log.h"
#include "xfer.h"

#define PAIRS_MIN 4
#define PAIRS_MAX 64         /* members: the set is a 64-bit mask */
#define PART_PRE 0x80000000u /* h->part of an extra's values to its core member */
#define PART_POST 0x80000001u /* h->part of the final sum to the extra */

/* A stage: one send and one receive on one channel (PRE: the core member
 * only receives, the extra only sends; POST: the other way round). */
struct stage {
	uint32_t part;  /* wire code: step index, PART_PRE or PART_POST */
	int member;     /* the partner */
	int ch;         /* its channel */
	int tx, rx;     /* this stage sends / receives */
	int sent, got, failed;
	int stalled, cut; /* fault injection (MP_FAULT): this send is never made */
	uint64_t mask;  /* what arrived: its set, weights (by member), sum */
	float *w;
	float *sum;
};

struct pairs {
	struct mp_ctx *ctx;
	struct mp_avg *a;
	const struct mp_group *g;
	uint32_t round;
	int k, me, strict, p, m;
	uint32_t plan;
	struct stage st[PAIRS_MAX];
	int nst, cur;         /* stages in order; the first not yet done */
	struct mp_chan *ch0;  /* the engine's channels */
	int chtx[PAIRS_MAX], chrx[PAIRS_MAX]; /* channel -> its sending, receiving stage */
	uint64_t mask;        /* our running sum: its set, weights, values */
	float w[PAIRS_MAX];
	float *sum;
	uint8_t *frame;       /* the frame being produced (copied by the engine) */
	int nonfinite;
	uint64_t nsent;
};

static int pop(uint64_t v)
{
	return __builtin_popcountll(v);
}

int mp_pairs_fits(const struct mp_ctx *ctx, const struct mp_group *g, const struct mp_avg *a)
{
	/* Room in a chunk's frame for the mask and the weights too. */
	return ctx->cfg.direct_pairs && g->size >= PAIRS_MIN && g->size <= PAIRS_MAX &&
	       a->n + 2 + (size_t)g->size <= ctx->chunk_elems;
}

static uint64_t member_id(const struct pairs *d, int m)
{
	return m == d->me ? d->ctx->self_id : d->ctx->peers[d->g->members[m]].id;
}

/* The members a core member @c holds after its steps below @s (its block
 * of 2^s core members and their extras): what its step-@s frame may carry. */
static uint64_t block(const struct pairs *d, int c, int s)
{
	uint64_t b = 0;

	for (int i = 0; i < d->p; i++)
		if ((i >> s) == (c >> s)) {
			b |= 1ull << i;
			if (i + d->p < d->k)
				b |= 1ull << (i + d->p);
		}
	return b;
}

/* What the frame of stage @t may carry. */
static uint64_t allowed(const struct pairs *d, const struct stage *t)
{
	if (t->part == PART_PRE)
		return 1ull << t->member;
	if (t->part == PART_POST)
		return d->k == 64 ? ~0ull : (1ull << d->k) - 1;
	return block(d, t->member, (int)t->part);
}

static void faults_due(struct pairs *d)
{
	const struct mp_fault *f;

	if (!d->ctx->faults)
		return;
	while ((f = mp_fault_due(d->ctx, d->round, MP_FAULT_SCATTER, d->nsent)))
		for (int i = 0; i < d->nst; i++)
			if (d->st[i].tx && (f->all_peers || member_id(d, d->st[i].member) == f->peer)) {
				if (f->kind == MP_FAULT_STALL)
					d->st[i].stalled = 1;
				else
					d->st[i].cut = 1;
			}
}

/* Fold the stages whose frames are in (or whose partner failed), in
 * order: the sums of a step add in the same order on both partners. */
static void advance(struct pairs *d)
{
	while (d->cur < d->nst) {
		struct stage *t = &d->st[d->cur];

		if (t->tx && !t->sent && !t->failed && !t->stalled && !t->cut)
			return; /* ours first: the frame carries the sum before this stage */
		if (t->rx && !t->got && !t->failed)
			return;
		if (t->rx && t->got && !t->failed) {
			if (t->part == PART_POST) {
				/* The core member's final sum replaces ours. */
				memcpy(d->sum, t->sum, d->a->n * sizeof(float));
				d->mask = t->mask;
			} else {
				for (size_t i = 0; i < d->a->n; i++)
					d->sum[i] = d->sum[i] + t->sum[i];
				d->mask |= t->mask;
			}
			for (int m = 0; m < d->k; m++)
				if (t->mask >> m & 1)
					d->w[m] = t->w[m];
		}
		d->cur++;
	}
}

/* The stage that sends (@tx) or receives on @ch: NULL if none. */
static struct stage *stage_of(struct pairs *d, const struct mp_chan *ch, int tx)
{
	int i = (tx ? d->chtx : d->chrx)[ch - d->ch0];

	return i < 0 ? NULL : &d->st[i];
}

static int can_send(const struct stage *t)
{
	return t && !t->sent && !t->failed && !t->stalled && !t->cut;
}

static int p_ready(void *op, struct mp_chan *ch)
{
	struct pairs *d = op;
	struct stage *t = stage_of(d, ch, 1);

	return can_send(t) && d->cur == (int)(t - d->st);
}

static int p_produce(void *op, struct mp_chan *ch, struct mp_wire_hdr *h, struct mp_payload *pl)
{
	struct pairs *d = op;
	struct stage *t = stage_of(d, ch, 1);
	uint8_t *b = d->frame;
	size_t nw = 0, plen = 0;
	float wsum = 0.0f;

	faults_due(d);
	if (!p_ready(op, ch))
		return 0;
	mp_le_put64(b, d->mask);
	for (int m = 0; m < d->k; m++)
		if (d->mask >> m & 1) {
			uint32_t bits;

			memcpy(&bits, &d->w[m], sizeof(bits));
			mp_le_put32(b + 8 + 4 * nw++, bits);
			wsum += d->w[m];
		}
	if (d->a->codec->encode(&d->ctx->cparams, d->sum, NULL, d->a->n, b + 8 + 4 * nw,
				d->a->n * sizeof(float), &plen, NULL))
		return 0;
	t->sent = 1;
	d->nsent++;
	h->type = MP_MSG_PAIR;
	h->part = t->part;
	h->offset = 0;
	h->count = (uint32_t)d->a->n;
	h->weight = wsum;
	h->aux = d->plan;
	*pl = (struct mp_payload){.kind = MP_PAYLOAD_ENCODED, .bytes = b, .len = 8 + 4 * nw + plen};
	advance(d);
	return 1;
}

int mp_pair_parse(const void *payload, size_t len, uint64_t allowed, size_t count,
		  const struct mp_codec_ops *codec, uint64_t *mask, float *w, float *sum)
{
	const uint8_t *b = payload;
	uint64_t m;
	size_t nw;

	if (len < 8)
		return -EPROTO;
	m = mp_le_get64(b);
	nw = (size_t)pop(m);
	/* Only members the sender can hold at this stage, each once. */
	if ((m & ~allowed) || len - 8 < 4 * nw)
		return -EPROTO;
	for (int i = 0, j = 0; i < 64; i++)
		if (m >> i & 1) {
			uint32_t bits = mp_le_get32(b + 8 + 4 * j++);

			memcpy(&w[i], &bits, sizeof(bits));
			if (!isfinite(w[i]) || w[i] < 0.0f)
				return -EPROTO;
		}
	if (codec->decode(b + 8 + 4 * nw, len - 8 - 4 * nw, sum, count))
		return -EPROTO;
	*mask = m;
	return 0;
}

static int p_consume(void *op, struct mp_chan *ch, const struct mp_wire_hdr *h, const void *payload)
{
	struct pairs *d = op;
	struct stage *t = stage_of(d, ch, 0);

	if (h->type != MP_MSG_PAIR || !t || t->got || h->part != t->part || h->offset != 0 ||
	    h->count != d->a->n)
		return -EPROTO;
	if (h->aux != d->plan) {
		mp_xfer_plans_otherwise(d->ctx, d->strict ? "ring all-reduce" : "group all-reduce",
					d->round, d->g->members[t->member], h->aux, d->plan);
		return -EPROTO;
	}
	if (mp_pair_parse(payload, h->length, allowed(d, t), h->count, d->a->codec, &t->mask, t->w,
			  t->sum))
		return -EPROTO;
	t->got = 1;
	advance(d);
	return 0;
}

static uint64_t p_recv_left(void *op, struct mp_chan *ch)
{
	struct stage *t = stage_of(op, ch, 0);

	return t && !t->got && !t->failed;
}

static uint64_t p_send_left(void *op, struct mp_chan *ch)
{
	return can_send(stage_of(op, ch, 1));
}

static void p_peer_failed(void *op, int peer)
{
	struct pairs *d = op;

	for (int i = 0; i < d->nst; i++)
		if (d->g->members[d->st[i].member] == peer)
			d->st[i].failed = 1;
	advance(d);
}

static int p_drop(void *op, struct mp_chan *ch)
{
	struct stage *t = stage_of(op, ch, 1);

	return t && t->cut;
}

/* Silence on a channel is the partner's fault only where its frame does
 * not wait on its own earlier stages with others. */
static int p_waits_on_others(void *op, struct mp_chan *ch)
{
	struct pairs *d = op;
	struct stage *t = stage_of(d, ch, 0);

	if (!t || t->got)
		return 0;
	if (t->part == PART_POST)
		return 1;
	if (t->part == PART_PRE)
		return 0;
	return t->part > 0 || t->member + d->p < d->k; /* later steps, or its own PRE first */
}

static const struct mp_xfer_ops pairs_ops = {
	.produce = p_produce,
	.consume = p_consume,
	.recv_left = p_recv_left,
	.send_left = p_send_left,
	.peer_failed = p_peer_failed,
	.drop = p_drop,
	.waits_on_others = p_waits_on_others,
	.ready = p_ready,
};

static void add_stage(struct pairs *d, uint32_t part, int member, int tx, int rx)
{
	d->st[d->nst++] = (struct stage){.part = part, .member = member, .tx = tx, .rx = rx};
}

int mp_pairs_allreduce(struct mp_ctx *ctx, const struct mp_group *g, uint32_t round,
		       struct mp_avg *a, int strict)
{
	const int k = g->size;
	struct pairs *d = calloc(1, sizeof(*d));
	struct mp_xfer x = {.ctx = ctx, .xops = &pairs_ops, .round = round, .group_id = g->id,
			    .user_mr = a->dmr, .res = a->res,
			    .what = strict ? "ring all-reduce" : "group all-reduce",
			    .codec = a->codec, .deadline_ms = strict ? 0 : ctx->cfg.allreduce_timeout_ms,
			    .total = a->n, .no_give_up = a->irreversible, .no_rate = 1,
			    .copy_values = 1};
	uint64_t ids[PAIRS_MAX], lens[PAIRS_MAX];
	uint8_t modes[PAIRS_MAX];
	int who[PAIRS_MAX];
	float whow[PAIRS_MAX], wsum = 0.0f;
	int rc = -ENOMEM, nused = 0, core;
	float *mem;

	if (!d)
		return -ENOMEM;
	x.op = d;
	*d = (struct pairs){.ctx = ctx, .a = a, .g = g, .round = round, .k = k, .me = g->my_index,
			    .strict = strict};
	a->res->group_size = k;
	for (d->p = 1; d->p * 2 <= k; d->p *= 2)
		d->m++;
	core = d->me < d->p ? d->me : d->me - d->p;
	if (d->me >= d->p) {
		add_stage(d, PART_PRE, core, 1, 0);
		add_stage(d, PART_POST, core, 0, 1);
	} else {
		if (d->me + d->p < k)
			add_stage(d, PART_PRE, d->me + d->p, 0, 1);
		for (int s = 0; s < d->m; s++)
			add_stage(d, (uint32_t)s, d->me ^ (1 << s), 1, 1);
		if (d->me + d->p < k)
			add_stage(d, PART_POST, d->me + d->p, 1, 0);
	}
	x.ch = calloc((size_t)d->nst, sizeof(*x.ch));
	/* Our sum, a receive buffer and weights per stage, the frame: each
	 * written before it is read (our sum below). */
	mem = mp_scratch(ctx, MP_SCR_REDUCE,
			 ((size_t)(d->nst + 1) * (a->n + k) + a->n + 2 + (size_t)k) * sizeof(float));
	if (!x.ch || !mem)
		goto out;
	d->sum = mem;
	for (int i = 0; i < d->nst; i++) {
		d->st[i].sum = mem + a->n + (size_t)i * (a->n + k);
		d->st[i].w = d->st[i].sum + a->n;
	}
	d->frame = (uint8_t *)(mem + a->n + (size_t)d->nst * (a->n + k));
	/* The channels and the stage each carries: one per partner (the
	 * extra's PRE and POST share one). */
	d->ch0 = x.ch;
	for (int i = 0; i < d->nst; i++) {
		int c = -1;

		for (int j = 0; j < x.nch && c < 0; j++)
			if (x.ch[j].peer == g->members[d->st[i].member])
				c = j;
		if (c < 0) {
			c = x.nch++;
			x.ch[c].peer = g->members[d->st[i].member];
			x.ch[c].stream = 0;
		}
		d->st[i].ch = c;
	}
	for (int c = 0; c < x.nch; c++)
		d->chtx[c] = d->chrx[c] = -1;
	for (int i = 0; i < d->nst; i++) {
		if (d->st[i].tx)
			d->chtx[d->st[i].ch] = i;
		if (d->st[i].rx)
			d->chrx[d->st[i].ch] = i;
	}
	/* The path is part of the plan: a member that would take the direct
	 * exchange plans otherwise, and says so. */
	d->plan = mp_short_plan(ctx, g, a, 0x50414952u, ids, lens, modes);
	x.plan = d->plan;
	/* Our own leaf: w·x, each product rounded, unless the values are not
	 * finite (MP_CHECK_FINITE: every member then goes without them). */
	if (ctx->cfg.check_finite)
		for (size_t i = 0; i < a->n && !d->nonfinite; i++)
			d->nonfinite = !isfinite(a->x[i]);
	if (!d->nonfinite) {
		d->mask = 1ull << d->me;
		d->w[d->me] = a->weight;
		for (size_t i = 0; i < a->n; i++)
			d->sum[i] = a->weight * a->x[i];
	} else {
		memset(d->sum, 0, a->n * sizeof(float));
	}
	if (!strict)
		mp_clog_begin(ctx, round, g, a->weight, lens, modes);
	rc = mp_xfer_run(&x);
	if (!rc && !x.fatal) {
		for (int m = 0; m < k; m++)
			if (d->mask >> m & 1) {
				who[nused] = m;
				whow[nused] = d->w[m];
				wsum += d->w[m];
				nused++;
			}
		if (strict && nused < k) {
			rc = mp_short_failed(ctx, round, k - nused);
		} else {
			if (wsum > 0.0f && !(nused == 1 && who[0] == d->me)) {
				float inv = 1.0f / wsum;

				for (size_t i = 0; i < a->n; i++)
					a->x[i] = d->sum[i] * inv;
			}
			if (!strict)
				mp_clog_reduce(ctx, round, g, 0, a->n, wsum, nused, who, whow);
			if (nused)
				a->weight = wsum / (float)nused;
		}
	}
	if (d->nonfinite)
		mp_set_error(ctx, "round %u: this peer's contribution was left out of the average by "
			     "every member (pairwise exchange): it holds NaN or infinity "
			     "(MP_CHECK_FINITE)", round);
	if (!strict)
		mp_clog_end(ctx, round, g, a->weight);
	if (rc)
		goto out;
	uint64_t reached = d->mask & ~(1ull << d->me);
	if (!reached && !strict) {
		rc = mp_short_failed(ctx, round, 0);
		goto out;
	}
	mp_short_done(ctx, a, (uint64_t)pop(d->mask | 1ull << d->me));
out:
	free(x.ch);
	free(d);
	return rc;
}
