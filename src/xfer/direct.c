/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Direct exchange: the latency path for short vectors. Every member of a
 * group sends its whole vector to every other member in one DIRECT frame,
 * and each sums what it received itself, in member order. One hop instead
 * of the butterfly's two (SCATTER, then GATHER once the part is complete)
 * and the ring's 2(N-1), and half the frames of the butterfly: for a short
 * vector the time is the wake-ups and system calls of the frames, not their
 * bytes, above all on hosts with fewer cores than peers, where every hop of
 * a chain waits for a process to be scheduled (doc/performance.md).
 *
 * A member sends k-1 whole vectors instead of about one, so the path is
 * taken only below MP_DIRECT_MAX bytes (a run-shared setting, settings.h),
 * for vectors that fit one chunk, with codec none, in a run whose codec is
 * not sparse, and in groups without client members (two clients have no
 * connection to each other). Every member decides from these alone, and
 * they are shared by all of them (the OPEN checks the length and the
 * codec), so a group takes the same path everywhere.
 *
 * Results: member i holds Σ w·x / Σ w over the contributions it has, in
 * member order, its own included: the fixed order makes the bits the same
 * on every member that has the same contributions, which without failures
 * is all of them. A member that failed before its frame arrived is left
 * out, by those it did not reach; the contribution log then says, for each
 * member, exactly which contributions its vector holds (a 'reduce' of the
 * whole vector, its own part in its roster). A member leaves with the mean
 * weight Σ w / (contributions used), as a reducer does.
 *
 * For the ring (@strict), a peer that fails fails the operation with
 * -EHOSTUNREACH, as the ring does; but the buffer is then left as it was,
 * since nothing is written before every frame is in.
 *
 * Nothing is written to the buffer during the exchange: the frames go out
 * of it without a copy (codec none), and the result is summed once every
 * channel is done.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "clog.h"
#include "fault.h"
#include "log.h"
#include "mp_kernels.h"
#include "xfer.h"

struct direct {
	struct mp_ctx *ctx;
	struct mp_avg *a;
	const struct mp_group *g;
	uint32_t round;
	int k, me, strict;
	uint32_t plan;       /* DIRECT's aux: members that plan otherwise never combine */
	struct mp_chan *ch;  /* channel i: member cm[i] */
	int *cm;
	float *slots;        /* member m's values at slot m (ours: unused) */
	float *w;            /* per member: the weight its frame carried */
	uint8_t *got, *sent, *failed, *nonfinite, *stalled, *cut;
	int *who;            /* contributions used, member order */
	float *whow;
	int nused;
	uint64_t nsent;      /* frames sent (fault injection's count) */
};

uint32_t mp_short_plan(const struct mp_ctx *ctx, const struct mp_group *g, const struct mp_avg *a,
		       uint32_t salt, uint64_t *ids, uint64_t *lens, uint8_t *modes)
{
	uint32_t plan;

	for (int m = 0; m < g->size; m++) {
		ids[m] = m == g->my_index ? ctx->self_id : ctx->peers[g->members[m]].id;
		lens[m] = a->n;
		modes[m] = (uint8_t)mp_group_mode(g, m);
	}
	plan = mp_plan_hash(g->id ^ salt, g->size, ids, modes, lens);
	for (int m = 0; m < g->size; m++)
		lens[m] = m == g->my_index ? a->n : 0;
	return plan;
}

int mp_short_failed(struct mp_ctx *ctx, uint32_t round, int lost)
{
	if (lost)
		mp_set_error(ctx, "ring all-reduce round %u failed: %d peer(s) dropped out (the "
			     "ring cannot finish without every peer; the buffer is unchanged)",
			     round, lost);
	else
		mp_set_error(ctx, "round %u: every other member failed: no values reached this "
			     "peer", round);
	return -EHOSTUNREACH;
}

void mp_short_done(const struct mp_ctx *ctx, struct mp_avg *a, uint64_t alive)
{
	int cap = !ctx->dynamic && ctx->nlive > 0 ? ctx->nlive : ctx->npeers;

	a->influence *= alive;
	if (a->influence > (uint64_t)cap)
		a->influence = (uint64_t)cap;
	a->res->rounds++;
}

int mp_direct_fits(const struct mp_ctx *ctx, const struct mp_group *g, const struct mp_avg *a)
{
	if (!ctx->cfg.direct_max || a->n == 0 || a->n > ctx->cfg.direct_max / sizeof(float) ||
	    a->n > ctx->chunk_elems || a->codec->id != MP_CODEC_NONE || a->residue || g->size < 2)
		return 0;
	/* The run's codec, not this average's: a sparse run keeps residues
	 * that its uncompressed averages fold in (the butterfly does that). */
	if (ctx->codec_cfg == MP_CODEC_TOPK || ctx->codec_cfg == MP_CODEC_ADACOMP)
		return 0;
	for (int m = 0; m < g->size; m++)
		if (mp_group_mode(g, m) == MP_MODE_CLIENT)
			return 0;
	return 1;
}

static int member_of(const struct direct *d, const struct mp_chan *ch)
{
	return d->cm[ch - d->ch];
}

static uint64_t member_id(const struct direct *d, int m)
{
	return m == d->me ? d->ctx->self_id : d->ctx->peers[d->g->members[m]].id;
}

static float *contribution(struct direct *d, int m)
{
	return m == d->me ? d->a->x : d->slots + (size_t)m * d->a->n;
}

static float *used_contribution(void *arg, int i)
{
	struct direct *d = arg;

	return contribution(d, d->who[i]);
}

/* Fault injection (fault.h): a direct round has one phase, scatter. */
static void faults_due(struct direct *d)
{
	const struct mp_fault *f;

	if (!d->ctx->faults)
		return;
	while ((f = mp_fault_due(d->ctx, d->round, MP_FAULT_SCATTER, d->nsent)))
		for (int m = 0; m < d->k; m++)
			if (m != d->me && (f->all_peers || member_id(d, m) == f->peer)) {
				if (f->kind == MP_FAULT_STALL)
					d->stalled[m] = 1;
				else
					d->cut[m] = 1;
			}
}

static int d_produce(void *op, struct mp_chan *ch, struct mp_wire_hdr *h, struct mp_payload *pl)
{
	struct direct *d = op;
	int j = member_of(d, ch);

	if (d->sent[j])
		return 0;
	faults_due(d);
	if (d->stalled[j] || d->cut[j])
		return 0;
	d->sent[j] = 1;
	d->nsent++;
	h->type = MP_MSG_DIRECT;
	h->part = (uint32_t)d->me;
	h->offset = 0;
	h->count = (uint32_t)d->a->n;
	h->weight = d->a->weight;
	h->aux = d->plan;
	*pl = (struct mp_payload){.kind = MP_PAYLOAD_VALUES, .values = d->a->x};
	return 1;
}

static int d_consume(void *op, struct mp_chan *ch, const struct mp_wire_hdr *h, const void *payload)
{
	struct direct *d = op;
	int j = member_of(d, ch);
	float *dst = d->slots + (size_t)j * d->a->n;

	if (h->type != MP_MSG_DIRECT || d->got[j] || h->part != (uint32_t)j || h->offset != 0 ||
	    h->count != d->a->n)
		return -EPROTO;
	if (h->aux != d->plan) {
		/* Another view of the group (the OPEN carries the plan too). */
		mp_xfer_plans_otherwise(d->ctx, d->strict ? "ring all-reduce" : "group all-reduce",
					d->round, d->g->members[j], h->aux, d->plan);
		return -EPROTO;
	}
	if (d->a->codec->decode(payload, h->length, dst, h->count))
		return -EPROTO;
	if (d->ctx->cfg.check_finite)
		for (uint32_t i = 0; i < h->count && !d->nonfinite[j]; i++)
			d->nonfinite[j] = !isfinite(dst[i]);
	d->w[j] = h->weight;
	d->got[j] = 1;
	return 0;
}

static uint64_t d_recv_left(void *op, struct mp_chan *ch)
{
	struct direct *d = op;
	int j = member_of(d, ch);

	return !d->got[j] && !d->failed[j];
}

static uint64_t d_send_left(void *op, struct mp_chan *ch)
{
	struct direct *d = op;
	int j = member_of(d, ch);

	return !d->sent[j] && !d->stalled[j] && !d->cut[j] && !d->failed[j];
}

static void d_peer_failed(void *op, int peer)
{
	struct direct *d = op;

	for (int m = 0; m < d->k; m++)
		if (m != d->me && d->g->members[m] == peer)
			d->failed[m] = 1;
}

static int d_drop(void *op, struct mp_chan *ch)
{
	struct direct *d = op;

	return d->cut[member_of(d, ch)];
}

static const struct mp_xfer_ops direct_ops = {
	.produce = d_produce,
	.consume = d_consume,
	.recv_left = d_recv_left,
	.send_left = d_send_left,
	.peer_failed = d_peer_failed,
	.drop = d_drop,
};

/* Sum what arrived, in member order, into the buffer; the weight follows. */
static void reduce(struct direct *d)
{
	struct mp_ctx *ctx = d->ctx;
	struct mp_avg *a = d->a;
	float wsum = 0.0f;

	d->nused = 0;
	if (ctx->cfg.check_finite)
		for (size_t i = 0; i < a->n && !d->nonfinite[d->me]; i++)
			d->nonfinite[d->me] = !isfinite(a->x[i]);
	for (int m = 0; m < d->k; m++) {
		if (m != d->me && !d->got[m])
			continue;
		if (d->nonfinite[m]) {
			MP_WARN("round %u: left out peer %d's values: they hold NaN or infinity "
				"(MP_CHECK_FINITE)", d->round,
				m == d->me ? ctx->rank : d->g->members[m]);
			continue;
		}
		d->who[d->nused] = m;
		d->whow[d->nused] = m == d->me ? a->weight : d->w[m];
		wsum += d->whow[d->nused];
		d->nused++;
	}
	if (wsum > 0.0f && d->nused > 1) {
		/* The accumulator is the first contribution used: ours (the
		 * buffer, which takes the result) or a slot, then copied. */
		mp_k_wmean(a->x, d->nused, d->whow, wsum, a->n, used_contribution, d);
	} else if (wsum > 0.0f && d->nused == 1 && d->who[0] != d->me) {
		memcpy(a->x, contribution(d, d->who[0]), a->n * sizeof(float));
	}
	/* A sum of nothing (every weight 0, or only our own values left out)
	 * keeps the buffer as it is. */
	if (!d->strict)
		mp_clog_reduce(ctx, d->round, d->g, 0, a->n, wsum, d->nused, d->who, d->whow);
	if (d->nused)
		a->weight = wsum / (float)d->nused;
}

int mp_direct_allreduce(struct mp_ctx *ctx, const struct mp_group *g, uint32_t round,
			struct mp_avg *a, int strict)
{
	const int k = g->size;
	struct direct d = {.ctx = ctx, .a = a, .g = g, .round = round, .k = k, .me = g->my_index,
			   .strict = strict};
	struct mp_xfer x = {.ctx = ctx, .xops = &direct_ops, .op = &d, .round = round,
			    .group_id = g->id, .user_mr = a->dmr, .res = a->res,
			    .what = strict ? "ring all-reduce" : "group all-reduce",
			    .codec = a->codec, .deadline_ms = strict ? 0 : ctx->cfg.allreduce_timeout_ms,
			    .total = a->n, .no_give_up = a->irreversible, .no_rate = 1};
	uint64_t *ids = NULL, *lens = NULL;
	uint8_t *modes = NULL;
	int rc = -ENOMEM;

	if (mp_pairs_fits(ctx, g, a))
		return mp_pairs_allreduce(ctx, g, round, a, strict);
	a->res->group_size = k;
	d.cm = calloc((size_t)k, sizeof(int) * 2 + sizeof(float) * 2 + 6);
	x.ch = calloc((size_t)k, sizeof(*x.ch));
	ids = calloc((size_t)k, sizeof(uint64_t) * 2 + 1);
	d.slots = mp_scratch(ctx, MP_SCR_REDUCE, (size_t)k * a->n * sizeof(float));
	if (!d.cm || !x.ch || !ids || !d.slots)
		goto out;
	d.who = d.cm + k;
	d.w = (float *)(d.who + k);
	d.whow = d.w + k;
	d.got = (uint8_t *)(d.whow + k);
	d.sent = d.got + k;
	d.failed = d.sent + k;
	d.nonfinite = d.failed + k;
	d.stalled = d.nonfinite + k;
	d.cut = d.stalled + k;
	lens = ids + k;
	modes = (uint8_t *)(lens + k);
	d.plan = mp_short_plan(ctx, g, a, 0, ids, lens, modes);
	x.plan = d.plan;
	d.ch = x.ch;
	for (int m = 0; m < k; m++) {
		if (m == d.me)
			continue;
		d.cm[x.nch] = m;
		x.ch[x.nch].peer = g->members[m];
		x.ch[x.nch].stream = 0;
		x.nch++;
	}
	/* This member's roster: its own part is the whole vector, which it
	 * reduces itself (clog.h); the others' are theirs to log. */
	if (!strict)
		mp_clog_begin(ctx, round, g, a->weight, lens, modes);
	rc = mp_xfer_run(&x);
	if (!rc && !x.fatal) {
		int lost = 0;

		for (int m = 0; m < k; m++)
			lost += m != d.me && !d.got[m];
		if (strict && lost) {
			rc = mp_short_failed(ctx, round, lost);
		} else {
			reduce(&d);
		}
	}
	if (d.nonfinite[d.me])
		mp_set_error(ctx, "round %u: this peer's contribution was left out of the average by "
			     "every member (direct exchange): it holds NaN or infinity "
			     "(MP_CHECK_FINITE)", round);
	/* No 'apply' lines: no other member's result is expected. */
	if (!strict)
		mp_clog_end(ctx, round, g, a->weight);
	if (rc)
		goto out;
	if (d.nused < 2 && !strict) {
		int reached = 0;

		for (int m = 0; m < k; m++)
			reached |= m != d.me && d.got[m];
		if (!reached) {
			rc = mp_short_failed(ctx, round, 0);
			goto out;
		}
	}
	uint64_t alive = 1;
	for (int m = 0; m < k; m++)
		alive += m != d.me && d.got[m];
	mp_short_done(ctx, a, alive);
out:
	free(ids);
	free(x.ch);
	free(d.cm);
	return rc;
}
