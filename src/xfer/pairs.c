/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Pairwise exchange (recursive doubling): the latency path for short
 * vectors in groups of 4 and of 8 to 64 members. The direct exchange (direct.c)
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
/* Groups with extras (not a power of two) from this size: an extra adds
 * two hops to the path (its PRE before the core member's first step, the
 * POST after its last), and below 8 the direct exchange's k-1 frames cost
 * less (butterfly, 1-16 KiB, 2 cores: 5-7 members 1.1-3.5x the direct
 * exchange's time, 9-12 members 0.7-1.0x; doc/performance.md). */
#define PAIRS_EXTRAS_MIN 8
#define PART_PRE 0x80000000u /* h->part of an extra's values to its core member */
#define PART_POST 0x80000001u /* h->part of the final sum to the extra */
#define PART_POST2 0x80000002u /* the same from the core member's step-0 partner */

/* A stage: one send and one receive on one channel (PRE: the core member
 * only receives, the extra only sends; POST: the other way round). */
struct stage {
	uint32_t part;  /* wire code: step index, PART_PRE, PART_POST or PART_POST2 */
	int member;     /* the partner */
	int ch;         /* its channel */
	int tx, rx;     /* this stage sends / receives */
	int sent, got, failed;
	int stalled, cut; /* fault injection (MP_FAULT): this send is never made */
	uint64_t mask;  /* what arrived: its set, weights (by member), sum */
	uint64_t ss;    /* and the members its sender's sum has heard are down */
	float *w;
	float *sum;
};

struct pairs {
	struct mp_ctx *ctx;
	struct mp_avg *a;
	const struct mp_group *g;  /* &pg */
	struct mp_group pg;        /* the members planned on (pairs_group) */
	int pm[PAIRS_MAX];
	uint32_t round;
	int k, me, strict, p, m;
	uint32_t plan;
	struct stage st[PAIRS_MAX];
	int nst, cur;         /* stages in order; the first not yet done */
	struct mp_chan *ch0;  /* the engine's channels */
	int chtx[PAIRS_MAX], chrx[PAIRS_MAX]; /* channel -> its sending, receiving stage */
	uint64_t mask;        /* our running sum: its set, weights, values */
	uint64_t ss;          /* members down for a member our sum has heard from */
	int posted;           /* an extra: a final sum came */
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

/*
 * The members the exchange plans on, to @pg (@pm: room for PAIRS_MAX); the
 * count, more than PAIRS_MAX when there are more.
 *
 * A static group is each peer's view: a member met a death, another not
 * yet. The direct exchange's members all meet a death in the same
 * average; here only the dead member's partners do, so planning on the
 * view made the next average's plans differ, and members waited on
 * partners that planned otherwise until they timed out live ones. A
 * static run therefore plans on the configured line less the members
 * every member of it agreed to leave out (pdrop): the same on every
 * member whatever each has met. Members down in this peer's view but not
 * agreed yet are skipped (their stages fail at once), and the sums carry
 * them (ss): a member dropped by the agreement of one exchange is left out
 * of the next (pairs_agree).
 */
static int pairs_group(const struct mp_ctx *ctx, const struct mp_group *g, struct mp_group *pg,
		       int *pm)
{
	int k = 0;

	*pg = *g;
	if (!g->line)
		return g->size;
	pg->my_index = -1;
	for (int i = 0; i < g->line_size; i++) {
		int p = g->line[i];

		if (p != ctx->rank && ctx->peers[p].pdrop)
			continue;
		if (k < PAIRS_MAX) {
			if (p == ctx->rank)
				pg->my_index = k;
			pm[k] = p;
		}
		k++;
	}
	pg->members = pm;
	pg->size = k <= PAIRS_MAX ? k : PAIRS_MAX;
	pg->bw = NULL;
	pg->mode = NULL;
	return k;
}

int mp_pairs_fits(const struct mp_ctx *ctx, const struct mp_group *g, const struct mp_avg *a)
{
	struct mp_group pg;
	int pm[PAIRS_MAX];
	int k;

	if (!ctx->cfg.direct_pairs)
		return 0;
	k = pairs_group(ctx, g, &pg, pm);
	/* Room in a chunk's frame for the two masks and the weights too. */
	return k >= PAIRS_MIN && k <= PAIRS_MAX && (!(k & (k - 1)) || k >= PAIRS_EXTRAS_MIN) &&
	       pg.my_index >= 0 && a->n + 4 + (size_t)k <= ctx->chunk_elems;
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

/* Every member. */
static uint64_t all(const struct pairs *d)
{
	return d->k == 64 ? ~0ull : (1ull << d->k) - 1;
}

/* What the frame of stage @t may carry. */
static uint64_t allowed(const struct pairs *d, const struct stage *t)
{
	if (t->part == PART_PRE)
		return 1ull << t->member;
	if (t->part == PART_POST || t->part == PART_POST2)
		return all(d);
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
		if (t->rx && t->got && !t->failed && d->posted) {
			/* The second final sum: the same as the first, or less. */
			d->ss |= t->ss;
		} else if (t->rx && t->got && !t->failed) {
			if (t->part == PART_POST || t->part == PART_POST2) {
				/* A final sum replaces ours (our PRE reached the
				 * core member), or is added to our leaf (it did not:
				 * the core member failed first, and this is its
				 * step-0 partner's). */
				if (t->mask & d->mask) {
					memcpy(d->sum, t->sum, d->a->n * sizeof(float));
					d->mask = t->mask;
				} else {
					for (size_t i = 0; i < d->a->n; i++)
						d->sum[i] = d->sum[i] + t->sum[i];
					d->mask |= t->mask;
				}
				d->posted = 1;
			} else {
				for (size_t i = 0; i < d->a->n; i++)
					d->sum[i] = d->sum[i] + t->sum[i];
				d->mask |= t->mask;
			}
			for (int m = 0; m < d->k; m++)
				if (t->mask >> m & 1)
					d->w[m] = t->w[m];
			d->ss |= t->ss;
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
	mp_le_put64(b + 8, d->ss);
	for (int m = 0; m < d->k; m++)
		if (d->mask >> m & 1) {
			uint32_t bits;

			memcpy(&bits, &d->w[m], sizeof(bits));
			mp_le_put32(b + 16 + 4 * nw++, bits);
			wsum += d->w[m];
		}
	if (d->a->codec->encode(&d->ctx->cparams, d->sum, NULL, d->a->n, b + 16 + 4 * nw,
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
	*pl = (struct mp_payload){.kind = MP_PAYLOAD_ENCODED, .bytes = b, .len = 16 + 4 * nw + plen};
	advance(d);
	return 1;
}

int mp_pair_parse(const void *payload, size_t len, uint64_t allowed, uint64_t group,
		  size_t count, const struct mp_codec_ops *codec, uint64_t *mask, uint64_t *ss,
		  float *w, float *sum)
{
	const uint8_t *b = payload;
	uint64_t m, down;
	size_t nw;

	if (len < 16)
		return -EPROTO;
	m = mp_le_get64(b);
	down = mp_le_get64(b + 8);
	nw = (size_t)pop(m);
	/* Only members the sender can hold at this stage, each once; down
	 * members of the group only. */
	if ((m & ~allowed) || (down & ~group) || len - 16 < 4 * nw)
		return -EPROTO;
	for (int i = 0, j = 0; i < 64; i++)
		if (m >> i & 1) {
			uint32_t bits = mp_le_get32(b + 16 + 4 * j++);

			memcpy(&w[i], &bits, sizeof(bits));
			if (!isfinite(w[i]) || w[i] < 0.0f)
				return -EPROTO;
		}
	if (codec->decode(b + 16 + 4 * nw, len - 16 - 4 * nw, sum, count))
		return -EPROTO;
	*mask = m;
	*ss = down;
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
	if (mp_pair_parse(payload, h->length, allowed(d, t), all(d), h->count, d->a->codec,
			  &t->mask, &t->ss, t->w, t->sum))
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
	if (t->part == PART_POST || t->part == PART_POST2)
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

/* The end of an exchange in a static run: the members our sum heard are
 * down are left out of the line's later exchanges. Every member's sum
 * hears the same ones when at most one member failed: a member down for
 * some at the start was met by its last-step partner (its death there) or
 * is met by all its partners now (dead from the start), and either's sum
 * reaches every live member (doc/design.md, "Short vectors"). */
static void pairs_agree(struct pairs *d)
{
	for (int m = 0; m < d->k; m++) {
		int peer = d->g->members[m];
		struct mp_peer *p = &d->ctx->peers[peer];

		if (m == d->me || !(d->ss >> m & 1) || p->pdrop)
			continue;
		p->pdrop = 1;
		MP_INFO("round %u: peer %d (%s) failed for a member of its line: left out of the "
			"line's pairwise exchanges from now on", d->round, peer, p->addr);
		mp_peer_mark_down(d->ctx, peer, "a member of its line saw it fail");
	}
}

int mp_pairs_allreduce(struct mp_ctx *ctx, const struct mp_group *gv, uint32_t round,
		       struct mp_avg *a, int strict)
{
	struct pairs *d = calloc(1, sizeof(*d));
	const struct mp_group *g = d ? &d->pg : NULL;
	int k;
	struct mp_xfer x = {.ctx = ctx, .xops = &pairs_ops, .round = round, .group_id = gv->id,
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
	*d = (struct pairs){.ctx = ctx, .a = a, .g = g, .round = round, .strict = strict};
	k = pairs_group(ctx, gv, &d->pg, d->pm);
	if (k > PAIRS_MAX || g->my_index < 0) {
		free(d);
		return -EINVAL; /* mp_pairs_fits said no */
	}
	d->k = k;
	d->me = g->my_index;
	a->res->group_size = k;
	for (d->p = 1; d->p * 2 <= k; d->p *= 2)
		d->m++;
	core = d->me < d->p ? d->me : d->me - d->p;
	/* An extra gets the final sum from its core member and from that
	 * one's step-0 partner, whose sum is the same: a core member that
	 * fails leaves its extra the other's rather than nothing. */
	if (d->me >= d->p) {
		add_stage(d, PART_PRE, core, 1, 0);
		add_stage(d, PART_POST, core, 0, 1);
		add_stage(d, PART_POST2, core ^ 1, 0, 1);
	} else {
		if (d->me + d->p < k)
			add_stage(d, PART_PRE, d->me + d->p, 0, 1);
		for (int s = 0; s < d->m; s++)
			add_stage(d, (uint32_t)s, d->me ^ (1 << s), 1, 1);
		if (d->me + d->p < k)
			add_stage(d, PART_POST, d->me + d->p, 1, 0);
		if ((d->me ^ 1) + d->p < k)
			add_stage(d, PART_POST2, (d->me ^ 1) + d->p, 1, 0);
	}
	x.ch = calloc((size_t)d->nst, sizeof(*x.ch));
	/* Our sum, a receive buffer and weights per stage, the frame: each
	 * written before it is read (our sum below). */
	mem = mp_scratch(ctx, MP_SCR_REDUCE,
			 ((size_t)(d->nst + 1) * (a->n + k) + a->n + 4 + (size_t)k) * sizeof(float));
	if (!x.ch || !mem)
		goto out;
	d->sum = mem;
	for (int i = 0; i < d->nst; i++) {
		d->st[i].sum = mem + a->n + (size_t)i * (a->n + k);
		d->st[i].w = d->st[i].sum + a->n;
	}
	d->frame = (uint8_t *)(mem + a->n + (size_t)d->nst * (a->n + k));
	/* The channels and the stage each carries: one per partner (the
	 * extra's PRE and POST share one). A partner down in our view (static
	 * runs) gets none: its stages fail now, and our sums say so. */
	d->ch0 = x.ch;
	for (int i = 0; i < d->nst; i++) {
		const struct mp_peer *pp = &ctx->peers[g->members[d->st[i].member]];
		int c = -1;

		if (gv->line && !strict && (pp->down || pp->gone)) {
			d->st[i].failed = 1;
			d->st[i].ch = -1;
			d->ss |= 1ull << d->st[i].member;
			continue;
		}
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
		if (d->st[i].ch < 0)
			continue;
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
	if (gv->line && !strict)
		pairs_agree(d);
	mp_short_done(ctx, a, (uint64_t)pop(d->mask | 1ull << d->me));
out:
	free(x.ch);
	free(d);
	return rc;
}
