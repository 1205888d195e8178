/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * MP_BALANCE=measured: DeDLOC's balancer fed at run time.
 *
 * Part sizes must be the same on every member of a group, so a member
 * cannot size them from what it measured itself: its view of the others
 * differs from theirs. Instead, right before a group all-reduce, every
 * member sends each other member one RATE frame (a header alone, on stream
 * 0) carrying its own figure: its throughput measured on earlier exchanges,
 * the sum over the peers of an exchange of bytes moved / active time
 * (engine.c), rounded to whole bytes per second. Every member then holds the
 * same figures (each one came from its owner, the same to all) and
 * mp_balance_parts, deterministic on every host, gives the same parts.
 *
 * Costs one round trip of a 64-byte frame per group all-reduce, taken only
 * under MP_BALANCE=measured (doc/performance.md). The figures take effect in
 * the very exchange they were sent for, so a member's view can never lag
 * the others'.
 *
 * What can still differ: a RATE that reaches some members and not others
 * (its sender dropped on one link only). The members that lost it count its
 * sender as failed and its figure unknown; the others use the figure. Their
 * parts may then differ, and a part whose offset or length differs is
 * refused chunk by chunk (group_allreduce.c checks both on every SCATTER
 * and GATHER) and left unapplied: never combined wrongly.
 */
#include <errno.h>
#include <stdlib.h>

#include "xfer.h"
#include "log.h"

struct rate_op {
	const struct mp_group *g;
	uint64_t mine;
	uint64_t *fig;     /* per member: the figure it sent; 0 none */
	uint8_t *got, *sent, *failed;
};

static int rate_member(const struct rate_op *o, const struct mp_chan *ch)
{
	for (int m = 0; m < o->g->size; m++)
		if (m != o->g->my_index && o->g->members[m] == ch->peer)
			return m;
	return -1;
}

static int r_produce(void *op, struct mp_chan *ch, struct mp_wire_hdr *h, struct mp_payload *p)
{
	struct rate_op *o = op;
	int m = rate_member(o, ch);

	if (m < 0 || o->sent[m])
		return 0;
	o->sent[m] = 1;
	h->type = MP_MSG_RATE;
	h->part = (uint32_t)o->g->my_index;
	h->offset = o->mine;
	p->kind = MP_PAYLOAD_NONE;
	return 1;
}

static int r_consume(void *op, struct mp_chan *ch, const struct mp_wire_hdr *h, const void *payload)
{
	struct rate_op *o = op;
	int m = rate_member(o, ch);

	(void)payload;
	/* A member that sizes parts otherwise sends a SCATTER here: refused,
	 * like any frame its settings should not produce. */
	if (m < 0 || o->got[m] || h->type != MP_MSG_RATE || h->part != (uint32_t)m || h->count ||
	    h->length)
		return -EPROTO;
	o->fig[m] = h->offset;
	o->got[m] = 1;
	return 0;
}

static uint64_t r_recv_left(void *op, struct mp_chan *ch)
{
	struct rate_op *o = op;
	int m = rate_member(o, ch);

	return m >= 0 && !o->got[m] && !o->failed[m];
}

static uint64_t r_send_left(void *op, struct mp_chan *ch)
{
	struct rate_op *o = op;
	int m = rate_member(o, ch);

	return m >= 0 && !o->sent[m] && !o->failed[m];
}

static void r_peer_failed(void *op, int peer)
{
	struct rate_op *o = op;

	for (int m = 0; m < o->g->size; m++)
		if (m != o->g->my_index && o->g->members[m] == peer)
			o->failed[m] = 1;
}

static const struct mp_xfer_ops rate_ops = {
	.produce = r_produce,
	.consume = r_consume,
	.recv_left = r_recv_left,
	.send_left = r_send_left,
	.peer_failed = r_peer_failed,
};

int mp_rate_exchange(struct mp_ctx *ctx, const struct mp_group *g, uint32_t round,
		     struct mp_result *res, double *bw, uint8_t *failed, int no_give_up)
{
	const int k = g->size, me = g->my_index;
	struct rate_op o = {.g = g};
	struct mp_xfer x = {.ctx = ctx, .xops = &rate_ops, .op = &o, .round = round,
			    .group_id = g->id, .res = res, .what = "rate exchange",
			    .codec = mp_codec_by_id(ctx->codec_cfg == MP_CODEC_AUTO ? MP_CODEC_NONE
										  : (unsigned)ctx->codec_cfg),
			    .deadline_ms = ctx->cfg.round_timeout_ms, .no_rate = 1,
			    .no_give_up = no_give_up};
	int rc = -ENOMEM;

	/* Whole bytes per second: the same number on every member, whatever
	 * its floating point; 0 (nothing measured yet) means unknown. */
	o.mine = ctx->self_Bps >= 1.0 && ctx->self_Bps < 1e18 ? (uint64_t)ctx->self_Bps : 0;
	o.fig = calloc((size_t)k, sizeof(*o.fig));
	o.got = calloc((size_t)k * 3, 1);
	x.ch = calloc((size_t)k, sizeof(*x.ch));
	if (!o.fig || !o.got || !x.ch)
		goto out;
	o.sent = o.got + k;
	o.failed = o.got + 2 * k;
	/* Every pair but two clients, who never reach each other and whose
	 * figures size nothing (a client reduces no part). */
	for (int m = 0; m < k; m++) {
		if (m == me || (mp_group_mode(g, m) == MP_MODE_CLIENT &&
				mp_group_mode(g, me) == MP_MODE_CLIENT))
			continue;
		x.ch[x.nch].peer = g->members[m];
		x.ch[x.nch].stream = 0;
		x.nch++;
	}
	ctx->rate_sent = o.mine;
	rc = mp_xfer_run(&x);
	if (rc)
		goto out;
	o.fig[me] = o.mine;
	for (int m = 0; m < k; m++) {
		failed[m] = o.failed[m];
		if (m != me && o.got[m])
			ctx->peers[g->members[m]].meas.rate_Bps = o.fig[m];
		if (mp_group_mode(g, m) == MP_MODE_CLIENT)
			bw[m] = 0.0;
		else
			bw[m] = o.fig[m] ? (double)o.fig[m] : -1.0;
	}
	MP_TRACE("round %u: measured figures exchanged with %d member(s); ours %llu B/s", round,
		 x.nch, (unsigned long long)o.mine);
out:
	free(o.fig);
	free(o.got);
	free(x.ch);
	return rc;
}
