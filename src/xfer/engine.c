/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The transfer engine: runs one exchange (a group all-reduce, a ring pass)
 * over the driver seam. Each channel (peer, stream) keeps a window of posted
 * sends and a window of posted receives in registered slab memory; the
 * algorithm decides what to send next and what a received frame means.
 *
 * Every frame is validated (wire.c) before the algorithm sees it, and a peer
 * whose connection fails, who sends a bad frame, or who stays silent past the
 * round timeout is dropped for the exchange: its connection is closed so that
 * nothing stale of it can arrive in a later round.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "conn.h"
#include "devpath.h"
#include "xfer.h"
#include "log.h"

/* A dht run's exchange reads the control connections this often. */
#define CTRL_POLL_NS (1000ull * 1000)
/* mp_peers_info's copy of the table is refreshed this often within an exchange. */
#define PUBLISH_NS (100ull * 1000 * 1000)

struct mp_xslot {
	uint8_t *buf; /* send: header then encoded payload; receive: whole frame */
	struct mp_drv_req *req;
	size_t len;   /* send: frame bytes */
	uint32_t count; /* send: values the frame carries */
	struct mp_iov iov[2];
	int iovcnt;
	struct mp_ring_slot *dsl; /* GPUDirect: the ring slot the payload leaves from, or
	                             the receive lands in (devpath.h); given back when done */
};

/* Our own frames: what our encoder settings can produce. */
static size_t frame_max(const struct mp_xfer *x)
{
	return MP_WIRE_HDR_SIZE + x->codec->max_encoded(&x->ctx->cparams, x->ctx->chunk_elems);
}

/*
 * Receive room: decoders accept frames of any encoder settings (payloads
 * describe themselves), so size for the widest settings of every codec this
 * context can be sent: the configured one, or those "auto" picks, and none
 * (mp_average_flush, MP_AVG_UNCOMPRESSED).
 */
size_t mp_frame_rx_max(const struct mp_ctx *ctx)
{
	static const int auto_set[] = {MP_CODEC_FP16, MP_CODEC_BLOCKWISE8};
	const struct mp_codec_params wide = {.block = 1, .sigmas = 1.0f, .topk_ratio = 1.0f, .bin = 1};
	int auto_cfg = ctx->codec_cfg == MP_CODEC_AUTO;
	const int *ids = auto_cfg ? auto_set : &ctx->codec_cfg;
	size_t nids = auto_cfg ? sizeof(auto_set) / sizeof(auto_set[0]) : 1;
	size_t m = mp_codec_by_id(MP_CODEC_NONE)->max_encoded(&wide, ctx->chunk_elems);

	for (size_t i = 0; i < nids; i++) {
		size_t e = mp_codec_by_id((unsigned)ids[i])->max_encoded(&wide, ctx->chunk_elems);
		m = e > m ? e : m;
	}
	return MP_WIRE_HDR_SIZE + m;
}

/* Codec none sends straight from the user's buffer; others encode into the slot. */
static int zero_copy(const struct mp_xfer *x)
{
	return x->codec->id == MP_CODEC_NONE && !x->copy_values;
}

uint8_t *mp_slab(struct mp_ctx *ctx, size_t bytes)
{
	if (bytes <= ctx->slab_size)
		return ctx->slab;
	if (ctx->slab_mr)
		ctx->ops->dereg_mr(ctx->drv, ctx->slab_mr);
	ctx->slab_mr = NULL;
	free(ctx->slab);
	ctx->slab_size = 0;
	bytes = (bytes + 4095) & ~(size_t)4095;
	ctx->slab = aligned_alloc(4096, bytes);
	if (!ctx->slab)
		return NULL;
	if (ctx->ops->reg_mr(ctx->drv, ctx->slab, bytes, MP_MEM_HOST, &ctx->slab_mr)) {
		free(ctx->slab);
		ctx->slab = NULL;
		return NULL;
	}
	ctx->slab_size = bytes;
	return ctx->slab;
}

void *mp_scratch(struct mp_ctx *ctx, int which, size_t bytes)
{
	if (bytes <= ctx->scratch_size[which] && ctx->scratch[which])
		return ctx->scratch[which];
	free(ctx->scratch[which]);
	ctx->scratch_size[which] = 0;
	ctx->scratch[which] = aligned_alloc(64, bytes ? (bytes + 63) & ~(size_t)63 : 64);
	if (ctx->scratch[which])
		ctx->scratch_size[which] = bytes;
	return ctx->scratch[which];
}

/* A ring slot the window slot @s held goes back to the device path. */
static void slot_done(struct mp_xfer *x, struct mp_xslot *s)
{
	if (s->dsl)
		mp_dev_slot_put(x->gdr, s->dsl);
	s->dsl = NULL;
}

static void reap_slots(struct mp_xfer *x, struct mp_xslot *sl, int head, int n)
{
	const int window = x->ctx->window;

	for (int i = 0; i < n; i++) {
		struct mp_xslot *s = &sl[(head + i) % window];
		mp_reap(x->ctx, s->req);
		s->req = NULL;
		slot_done(x, s);
	}
}

static void reject(struct mp_xfer *x, struct mp_chan *ch, enum mp_wire_reject why);

/* Close @ch: its connection, and the requests posted on it. (A peer that
 * plans otherwise is failed only once our OPEN, which says so, is out; a
 * sender whose send fails on the connection we closed reads what arrived
 * first, and the engine takes in what a channel received before it acts on
 * a failed send, so each side reads the other's OPEN.) */
static void close_chan(struct mp_xfer *x, struct mp_chan *ch, int err)
{
	struct mp_ctx *ctx = x->ctx;

	ch->failed = err ? err : -EPROTO;
	if (!ch->open_got && --x->unopened == 0 && !x->fatal && x->xops->opened)
		x->xops->opened(x->op);
	/* Closing cancels what is posted; the slots are then reaped. */
	mp_conn_drop(ctx, ch->peer, ch->stream);
	reap_slots(x, ch->ss, ch->s_head, ch->s_n);
	reap_slots(x, ch->rs, ch->r_head, ch->r_n);
	if (ch->staged) {
		/* Made ready and never posted: it goes no further. */
		slot_done(x, &ch->ss[(ch->s_head + ch->s_n) % ctx->window]);
		ch->staged = 0;
	}
	/* Cancelled sends leave flight too (a clock read on failure only). */
	if (ch->s_n)
		mp_busy_done(&x->busy, mp_now_ns(), ch->s_n, 0);
	ch->s_n = ch->r_n = 0;
}

static void fail_peer(struct mp_xfer *x, int peer, int err, const char *why)
{
	struct mp_ctx *ctx = x->ctx;
	int first = 1;

	for (int i = 0; i < x->nch; i++) {
		struct mp_chan *ch = &x->ch[i];
		if (ch->peer != peer || ch->failed)
			continue;
		if (first) {
			MP_WARN("%s round %u: dropping peer %d (%s): %s (%s)", x->what, x->round, peer,
				ctx->peers[peer].addr, why, mp_strerror(err));
			first = 0;
		}
		close_chan(x, ch, err);
	}
	if (!first) {
		ctx->peers[peer].meas.failures++;
		/* The matchmaker stops counting on it for a while (a SIGKILLed
		 * peer's record outlives it by up to its TTL). */
		mp_peer_suspect(ctx, peer, NULL);
		x->res->failed_peers++;
		x->xops->peer_failed(x->op, peer);
	}
}

/*
 * Give the exchange up (@err: -EBADE or -EMSGSIZE, @msg naming @peer and
 * both values, into mp_last_error): the peers disagree on what is being
 * averaged, so no result of it may stand. Only before the algorithm may
 * have written anything (some OPEN still out); after that, which takes a
 * peer restarted with other settings mid-exchange, it is dropped as any
 * failed peer. So it is too when an earlier round of the average wrote the
 * buffer and no copy can put it back (x->no_give_up): failing then would
 * return -EBADE or -EMSGSIZE over a buffer that is neither the input nor a
 * result, where dropping leaves an average of the others, as for a dead
 * peer. The culprit's channels close; the others go on only until
 * the OPENs have crossed (connections made, ours sent, theirs checked), so
 * that every member hears of the difference from every other, and fails
 * loudly too instead of at a timeout. mp_xfer_run then closes them.
 */
static void give_up(struct mp_xfer *x, int peer, int err, const char *msg)
{
	struct mp_ctx *ctx = x->ctx;

	if ((x->unopened <= 0 || x->no_give_up) && !x->fatal) {
		if (x->no_give_up)
			mp_set_error(ctx, "%s round %u: peer %d (%s): %s: dropped from the round (an "
				     "earlier round's results cannot be taken back)", x->what,
				     x->round, peer, ctx->peers[peer].addr, msg);
		fail_peer(x, peer, err, msg);
		return;
	}
	if (!x->fatal)
		mp_set_error(ctx, "%s round %u: peer %d (%s): %s", x->what, x->round, peer,
			     ctx->peers[peer].addr, msg);
	else
		MP_WARN("%s round %u: peer %d (%s): %s", x->what, x->round, peer,
			ctx->peers[peer].addr, msg);
	x->fatal = x->fatal ? x->fatal : err;
	x->res->failed_peers++;
	for (int i = 0; i < x->nch; i++)
		if (!x->ch[i].failed && x->ch[i].peer == peer)
			close_chan(x, &x->ch[i], err);
}

/* How an exchange sends its values, for messages: "uncompressed (codec
 * none)" or "with fp16". */
static const char *codec_words(unsigned id, char *buf, size_t len)
{
	if (id == MP_CODEC_NONE)
		return "uncompressed (codec none)";
	snprintf(buf, len, "with %s", mp_codec_name((int)id));
	return buf;
}

/*
 * The peer's OPEN on @ch: the length it averages must be ours, and so must
 * the codec it sends this average with. The codec is run-shared (agreed at
 * connect), but a single average may be sent uncompressed
 * (MP_AVG_UNCOMPRESSED, mp_average_flush): a peer that does so against one
 * that does not would otherwise drop every frame of the other as
 * unexpected, and each would finish the average without the other, a
 * result that silently leaves peers out.
 */
static void open_arrived(struct mp_xfer *x, struct mp_chan *ch, const struct mp_wire_hdr *h)
{
	char msg[200], theirs[32], ours[32];

	if (h->count || h->length || h->part) {
		reject(x, ch, MP_REJ_UNEXPECTED);
		return;
	}
	if (h->offset != x->total) {
		MP_STAT_ADD(x->ctx->rejected[MP_REJ_COUNT], 1);
		x->res->frames_rejected++;
		snprintf(msg, sizeof(msg), "peer %d averages %llu values, this peer %llu", ch->peer,
			 (unsigned long long)h->offset, (unsigned long long)x->total);
		give_up(x, ch->peer, -EMSGSIZE, msg);
		return;
	}
	if (h->codec != x->codec->id) {
		/* A per-average setting that differs: -EBADE, as for the
		 * run-shared ones, counted with them. */
		MP_STAT_ADD(x->ctx->rejected[MP_REJ_SETTINGS], 1);
		x->res->frames_rejected++;
		snprintf(msg, sizeof(msg), "peer %d averages %s, this peer %s (MP_AVG_UNCOMPRESSED, "
			 "MP_AVG_FLUSH or mp_average_flush on one side only)", ch->peer,
			 codec_words(h->codec, theirs, sizeof(theirs)),
			 codec_words(x->codec->id, ours, sizeof(ours)));
		give_up(x, ch->peer, -EBADE, msg);
		return;
	}
	if (h->aux != x->plan) {
		/*
		 * Seen here, in the OPEN, both sides of the pair see it: the
		 * member is dropped only once our own OPEN is out (mp_xfer_run),
		 * where a close at its first data frame reached the other side
		 * as a reset in the middle of ours, which it took for a death.
		 */
		mp_xfer_plans_otherwise(x->ctx, x->what, x->round, ch->peer, h->aux, x->plan);
		ch->mismatch = 1;
	}
	ch->open_got = 1;
	/* A later Moshpit average of this length with this peer, on this
	 * connection, may skip its copy (run_moshpit). */
	if (ch->stream == 0)
		mp_conn_agreed_note(x->ctx, ch->peer, x->total);
	if (--x->unopened == 0 && !x->fatal && x->xops->opened)
		x->xops->opened(x->op);
}

void mp_xfer_plans_otherwise(struct mp_ctx *ctx, const char *what, uint32_t round, int peer,
			     uint32_t theirs, uint32_t ours)
{
	MP_WARN("%s round %u: peer %d plans this exchange otherwise (plan %08x, ours %08x: "
		"another live set or other part sizes); its contribution is left out", what, round,
		peer, theirs, ours);
	ctx->peers[peer].excused = !ctx->dynamic;
	ctx->sweep |= !ctx->dynamic;
}

static void reject(struct mp_xfer *x, struct mp_chan *ch, enum mp_wire_reject why)
{
	MP_STAT_ADD(x->ctx->rejected[why], 1);
	x->res->frames_rejected++;
	fail_peer(x, ch->peer, -EPROTO, mp_wire_reject_name(why));
}

/*
 * A frame of @len bytes arrived on @ch: validate, then hand it to the
 * algorithm. @frame holds it whole, or (@split) its header alone, the
 * payload at @payload (device memory, GPUDirect).
 */
static void deliver(struct mp_xfer *x, struct mp_chan *ch, const uint8_t *frame, size_t len,
		    const void *payload, int split)
{
	struct mp_ctx *ctx = x->ctx;
	struct mp_wire_hdr h;
	enum mp_wire_reject why = MP_REJ_NONE;
	int rc;

	x->res->bytes_received += len;
	rc = split ? mp_wire_decode_header(frame, len, ctx->run_id, mp_codec_count(), &h, &why) :
		     mp_wire_decode(frame, len, ctx->run_id, mp_codec_count(), &h, &why);
	if (rc) {
		reject(x, ch, why);
		return;
	}
	if (h.token != mp_conn_token(ctx, ch->peer, ch->stream)) {
		/* Not of this connection's session: dropped, not held against the
		 * peer, whose own frames may still come; the receive is reposted. */
		MP_STAT_ADD(ctx->rejected[MP_REJ_TOKEN], 1);
		x->res->frames_rejected++;
		MP_WARN("%s round %u: dropped a frame with a wrong session token on the connection "
			"to peer %d (%s)", x->what, x->round, ch->peer, ctx->peers[ch->peer].addr);
		return;
	}
	if (h.sender == (uint32_t)ctx->peers[ch->peer].id &&
	    (h.round < x->round || (h.round == x->round && h.group_id != x->group_id))) {
		/* The peer sent for an exchange we were not in, or left: a
		 * roster that named us after we had given up on its leader, or
		 * one that timed us out. Its frames wait on the connection until
		 * the next exchange reads them; they are skipped, not held
		 * against the peer, and the receive is reposted. */
		MP_STAT_ADD(ctx->rejected[MP_REJ_STALE], 1);
		x->res->frames_rejected++;
		MP_TRACE("%s round %u: skipped a frame of round %u (group %08x) from peer %d",
			 x->what, x->round, h.round, h.group_id, ch->peer);
		return;
	}
	if (!ctx->dynamic && h.sender == (uint32_t)ctx->peers[ch->peer].id && h.round > x->round) {
		/* A static peer already in a later round finished this exchange
		 * without us (its view of who is live differed): alive, so not
		 * down (failure memory); probe everyone once the average ends. */
		ctx->peers[ch->peer].excused = 1;
		ctx->sweep = 1;
	}
	/* An OPEN's codec is judged by open_arrived, which says what differs. */
	if (h.round != x->round || h.group_id != x->group_id ||
	    h.sender != (uint32_t)ctx->peers[ch->peer].id ||
	    (h.codec != x->codec->id && h.type != MP_MSG_OPEN)) {
		MP_TRACE("unexpected frame: round %u/%u group %u/%u sender %u/%d codec %u/%u", h.round,
			 x->round, h.group_id, x->group_id, h.sender, ch->peer, h.codec, x->codec->id);
		reject(x, ch, MP_REJ_UNEXPECTED);
		return;
	}
	if (!ch->open_got || h.type == MP_MSG_OPEN) {
		/* The OPEN comes first, once. */
		if (ch->open_got || h.type != MP_MSG_OPEN)
			reject(x, ch, MP_REJ_UNEXPECTED);
		else
			open_arrived(x, ch, &h);
		ch->received++;
		return;
	}
	if (x->fatal || ch->mismatch) {
		/* Given up, or the peer plans otherwise: only the OPENs still
		 * matter. */
		ch->received++;
		return;
	}
	if (x->xops->consume(x->op, ch, &h, payload)) {
		reject(x, ch, MP_REJ_UNEXPECTED);
		return;
	}
	ch->received++;
}

/*
 * A frame of @len bytes landed in the twin of ring slot s->dsl (GPUDirect
 * RDMA): its header comes to the host (the whole frame when its sender
 * checksummed the payload), and the algorithm gets the payload where it
 * lies. A slot the algorithm did not take (an OPEN, a frame refused or
 * left out) goes back. A failed read ends the exchange on this peer alone,
 * as the device path's failures do (-EIO, nobody blamed).
 */
static void land_deliver(struct mp_xfer *x, struct mp_chan *ch, struct mp_xslot *s, size_t len)
{
	struct mp_stage *st = x->gdr;
	struct mp_ring_slot *sl = s->dsl;
	int whole = mp_dev_peek(x->ctx, st, sl, len);

	s->dsl = NULL;
	if (whole < 0) {
		mp_dev_slot_put(st, sl);
		x->abort_err = -EIO;
		return;
	}
	st->dp->landed = sl;
	deliver(x, ch, sl->host - MP_WIRE_HDR_SIZE, len, sl->dev, !whole);
	if (st->dp->landed == sl) {
		st->dp->landed = NULL;
		mp_dev_slot_put(st, sl);
	}
}

/*
 * Put payload @p of header @h into send slot @s and set h->length: the one
 * place where a produced payload becomes frame bytes (see struct
 * mp_payload). Returns 0, or a negative errno (the peer is then dropped).
 */
static int put_payload(struct mp_xfer *x, struct mp_wire_hdr *h, const struct mp_payload *p,
		       struct mp_xslot *s)
{
	struct mp_ctx *ctx = x->ctx;
	uint8_t *body = s->buf + MP_WIRE_HDR_SIZE;
	const size_t room = frame_max(x) - MP_WIRE_HDR_SIZE;
	size_t plen;
	int rc;

	switch (p->kind) {
	case MP_PAYLOAD_NONE:
		plen = 0;
		s->iovcnt = 1;
		break;
	case MP_PAYLOAD_ENCODED:
		if (!p->len) {
			/* A header alone (OPEN): fits every slot. */
			plen = 0;
			s->iovcnt = 1;
			break;
		}
		/* Encoded with this exchange's codec for a chunk of at most
		 * chunk_elems values, so it fits, unless the slot holds only
		 * a header (codec none). */
		if (zero_copy(x) || p->len > room)
			return -EMSGSIZE;
		memcpy(body, p->bytes, p->len);
		plen = p->len;
		s->iovcnt = 1;
		break;
	case MP_PAYLOAD_DEVICE:
		/* Sent from the twin, which the slot holds until then (given
		 * back by the caller on failure); the header's checksum cannot
		 * cover it (the device path takes GPUDirect only without
		 * MP_CHECKSUM=payload). */
		s->dsl = x->gdr ? p->slot : NULL;
		if (!s->dsl || (h->flags & MP_WIRE_F_PAYLOAD_CRC) || p->len > room)
			return -EINVAL;
		plen = p->len;
		s->iov[1].base = p->bytes;
		s->iov[1].len = plen;
		s->iovcnt = 2;
		break;
	case MP_PAYLOAD_VALUES:
		if (zero_copy(x)) {
			plen = (size_t)h->count * sizeof(float);
			s->iov[1].base = p->values;
			s->iov[1].len = plen;
			s->iovcnt = 2;
			break;
		}
		/* Sparse codecs take this peer's error feedback for these
		 * elements along, and leave what they did not send in it. */
		rc = x->codec->encode(&ctx->cparams, p->values,
				      x->residue ? x->residue + h->offset : NULL, h->count, body,
				      room, &plen, x->enc_scratch);
		if (rc)
			return rc;
		s->iovcnt = 1;
		break;
	default:
		return -EINVAL;
	}
	h->length = (uint32_t)plen;
	/* (A device payload is never read: its header's checksum is the header's.) */
	mp_wire_encode(h, s->buf, s->iovcnt == 2 ? s->iov[1].base : body);
	s->iov[0].base = s->buf;
	s->iov[0].len = s->iovcnt == 2 ? MP_WIRE_HDR_SIZE : MP_WIRE_HDR_SIZE + plen;
	s->len = MP_WIRE_HDR_SIZE + plen;
	s->count = h->count;
	return 0;
}

/*
 * Ask the algorithm for the next message and post it. Returns 1 if posted.
 * A message refused with -EAGAIN stays staged in its slot and is posted
 * first next time, since the algorithm has already counted it as produced.
 */
static int post_send(struct mp_xfer *x, struct mp_chan *ch, struct mp_drv_conn *conn,
		     uint64_t now)
{
	struct mp_ctx *ctx = x->ctx;
	struct mp_xslot *s = &ch->ss[(ch->s_head + ch->s_n) % ctx->window];
	int rc;

	if (!ch->staged) {
		struct mp_wire_hdr h;
		struct mp_payload p;

		memset(&h, 0, sizeof(h));
		memset(&p, 0, sizeof(p));
		if ((x->fatal || ch->mismatch) && ch->open_sent)
			return 0;
		if (!ch->open_sent && !x->fatal && !ch->mismatch && x->xops->ready &&
		    x->xops->send_left(x->op, ch) && !x->xops->ready(x->op, ch))
			return 0; /* the OPEN goes with the channel's first frame */
		if (!ch->open_sent) {
			/* Our length and plan, first on every channel: sent with the
			 * data that follows it, not waited for. */
			h.type = MP_MSG_OPEN;
			h.offset = x->total;
			h.aux = x->plan;
			p.kind = MP_PAYLOAD_ENCODED;
			ch->open_sent = 1;
		} else if (!x->xops->produce(x->op, ch, &h, &p)) {
			return 0;
		}
		h.codec = (uint8_t)x->codec->id;
		h.run_id = ctx->run_id;
		h.round = x->round;
		h.group_id = x->group_id;
		h.sender = (uint32_t)ctx->self_id;
		h.token = mp_conn_token(ctx, ch->peer, ch->stream);
		h.flags |= ctx->cfg.checksum_payload ? MP_WIRE_F_PAYLOAD_CRC : 0;
		rc = put_payload(x, &h, &p, s);
		if (rc) {
			slot_done(x, s);
			fail_peer(x, ch->peer, rc, "encode failed");
			return 0;
		}
		ch->staged = 1;
	}
	rc = ctx->ops->isend(conn, s->iov, s->iovcnt,
			     s->dsl ? x->gdr->dp->dring_mr : s->iovcnt == 2 ? x->user_mr : ctx->slab_mr,
			     &s->req);
	if (rc == -EAGAIN)
		return 0;
	ch->staged = 0;
	if (rc) {
		slot_done(x, s);
		/* A broken connection: if requests are posted, their completions
		 * carry the cause (e.g. -EMSGSIZE); otherwise report this one. */
		if (ch->s_n || ch->r_n)
			ch->defer_err = rc;
		else
			fail_peer(x, ch->peer, rc, "send could not be posted");
		return 0;
	}
	ch->s_n++;
	ch->send_posted++;
	mp_busy_post(&x->busy, now);
	return 1;
}

/* What is still due on @ch, the OPENs included. */
static uint64_t recv_left(struct mp_xfer *x, struct mp_chan *ch)
{
	return !ch->open_got + (x->fatal ? 0 : x->xops->recv_left(x->op, ch));
}

static uint64_t send_left(struct mp_xfer *x, struct mp_chan *ch)
{
	return !ch->open_sent + (x->fatal ? 0 : x->xops->send_left(x->op, ch));
}

/* Lays out slots for every channel in the slab. */
static int setup_slots(struct mp_xfer *x)
{
	struct mp_ctx *ctx = x->ctx;
	size_t fmax = ctx->frame_rx_max;
	size_t sbytes = zero_copy(x) ? MP_WIRE_HDR_SIZE : frame_max(x);
	size_t per_ch, slots_bytes;
	uint8_t *base;

	sbytes = (sbytes + 63) & ~(size_t)63;
	fmax = (fmax + 63) & ~(size_t)63;
	per_ch = (size_t)ctx->window * (sbytes + fmax);
	slots_bytes = (size_t)x->nch * 2 * (size_t)ctx->window * sizeof(struct mp_xslot);
	base = mp_slab(ctx, per_ch * (size_t)x->nch);
	if (!base)
		return -ENOMEM;
	struct mp_xslot *sl = calloc(1, slots_bytes ? slots_bytes : 1);
	if (!sl)
		return -ENOMEM;
	for (int i = 0; i < x->nch; i++) {
		struct mp_chan *ch = &x->ch[i];
		uint8_t *p = base + per_ch * (size_t)i;
		ch->ss = sl + (size_t)i * 2 * (size_t)ctx->window;
		ch->rs = ch->ss + ctx->window;
		for (int w = 0; w < ctx->window; w++) {
			ch->ss[w].buf = p;
			p += sbytes;
			ch->rs[w].buf = p;
			p += fmax;
		}
	}
	return 0;
}

/*
 * The exchange is over: per peer, its traffic over the time a transfer with
 * it was active (from the first post on any of its channels to the last
 * completion), into its moving averages (mp_peer_measure). This peer's own
 * figure is its bytes sent over its send-busy time (struct mp_busy, whose
 * comment says why not the sum of the per-peer rates: those share the
 * exchange's length, whatever each member's part).
 */
static void measure(struct mp_xfer *x)
{
	struct mp_ctx *ctx = x->ctx;
	double self = x->no_rate ? 0.0 : mp_busy_rate(&x->busy);

	for (int i = 0; i < x->nch; i++) {
		uint64_t sent = 0, recv = 0, first = 0, last = 0;
		int seen = 0;

		for (int j = 0; j < i && !seen; j++)
			seen = x->ch[j].peer == x->ch[i].peer;
		if (seen)
			continue;
		for (int j = i; j < x->nch; j++) {
			const struct mp_chan *c = &x->ch[j];
			if (c->peer != x->ch[i].peer || !c->m_first)
				continue;
			sent += c->m_sent;
			recv += c->m_recv;
			first = first && first < c->m_first ? first : c->m_first;
			last = last > c->m_last ? last : c->m_last;
		}
		uint64_t active = last > first ? last - first : 0;
		if (x->no_rate)
			active = 0;
		mp_peer_measure(ctx, x->ch[i].peer, sent, recv, active);
	}
	/* Weight 1/16 (the per-peer rates: 1/4): one exchange's busy time swings
	 * with the scheduling of both ends (on a loaded 2-core box from 0.2 to
	 * 4 GB/s over loopback, while the means of all members agree), and
	 * mp_balance_parts magnifies a figure's deviation about 3 times into a
	 * part's (4 members). Replaying two such runs' samples, the largest of
	 * 4 parts was (median) 1.48 times an equal one at 1/4, 1.33 at 1/8,
	 * 1.22 at 1/16 (doc/performance.md); a real change of a link takes
	 * some 16 averages to show. The first 16 samples are a plain mean: the
	 * first exchange, slowed by peers still starting, must not weigh 15/16
	 * in the next. */
	if (self > 0.0) {
		double w = ctx->self_samples < 16 ? 1.0 / (double)(ctx->self_samples + 1) : 0.0625;

		MP_TRACE("%s round %u: sent %llu B over %llu us of sends in flight: %.0f B/s",
			 x->what, x->round, (unsigned long long)x->busy.bytes,
			 (unsigned long long)(x->busy.ns / 1000u), self);
		ctx->self_Bps += w * (self - ctx->self_Bps);
		ctx->self_samples++;
	}
}

int mp_xfer_run(struct mp_xfer *x)
{
	struct mp_ctx *ctx = x->ctx;
	const uint64_t conn_to = (uint64_t)ctx->cfg.connect_timeout_ms * 1000000ull;
	const uint64_t round_to = (uint64_t)ctx->cfg.round_timeout_ms * 1000000ull;
	const size_t fmax = ctx->frame_rx_max;
	uint64_t start = mp_now_ns(), last_move = start, ctrl_at = 0, pub_at = start;
	const uint64_t deadline = x->deadline_ms > 0 ? start + (uint64_t)x->deadline_ms * 1000000ull : 0;
	const uint64_t spin_ns = (uint64_t)ctx->spin_us * 1000u;
	uint64_t *last;
	int rc, *conn_err;

	if (x->nch <= 0)
		return 0;
	x->enc_scratch = NULL;
	if (x->codec->scratch_size) {
		x->enc_scratch = mp_scratch(ctx, MP_SCR_ENCODE,
					    x->codec->scratch_size(&ctx->cparams, ctx->chunk_elems));
		if (!x->enc_scratch)
			return -ENOMEM;
	}
	rc = setup_slots(x);
	last = calloc((unsigned)x->nch, sizeof(*last) + sizeof(*conn_err));
	if (rc || !last) {
		free(last);
		if (!rc)
			free(x->ch[0].ss);
		return -ENOMEM;
	}
	conn_err = (int *)(last + x->nch);
	for (int i = 0; i < x->nch; i++)
		last[i] = start;
	x->unopened = x->nch;
	x->fatal = 0;
	/* GPUDirect: receives land in the device path's ring where each
	 * channel can have one posted at least (no channel waits on slots
	 * that others hold); else in the slab, and cross the bus from there. */
	x->land = x->gdr && x->nch <= MP_DEV_LAND_MAX ? MP_DEV_LAND_MAX / x->nch : 0;
	if (x->land > ctx->window)
		x->land = ctx->window;
	memset(&x->busy, 0, sizeof(x->busy));
	ctx->cur_res = x->res;

	x->abort_err = 0;
	for (;;) {
		int active = 0, moved = 0, pumping = 0;
		uint64_t now = mp_now_ns();

		if (x->abort_err) {
			/* The algorithm failed on its own: no peer is at fault. */
			for (int i = 0; i < x->nch; i++)
				if (!x->ch[i].failed)
					close_chan(x, &x->ch[i], -ECANCELED);
			rc = x->abort_err;
			break;
		}
		if (__atomic_load_n(&ctx->stop, __ATOMIC_ACQUIRE)) {
			for (int i = 0; i < x->nch; i++)
				if (!x->ch[i].failed)
					fail_peer(x, x->ch[i].peer, -ECANCELED, "context finalizing");
			rc = -ECANCELED;
			break;
		}
		if (ctx->exchange_hook && now - ctrl_at >= CTRL_POLL_NS) {
			/* The control plane's progress, which polls the
			 * connections first (see the connect wait below). */
			ctx->exchange_hook(ctx);
			ctrl_at = now;
		} else {
			mp_conn_poll(ctx);
		}
		if (x->xops->pump)
			pumping = x->xops->pump(x->op);
		for (int i = 0; i < x->nch; i++) {
			struct mp_chan *ch = &x->ch[i];
			struct mp_drv_conn *conn;
			int err = 0, chmoved = 0, send_err = 0;

			if (ch->failed)
				continue;
			if (x->xops->drop && x->xops->drop(x->op, ch)) {
				fail_peer(x, ch->peer, -ECONNABORTED, "connection cut (fault injection)");
				continue;
			}
			conn = mp_conn_get(ctx, ch->peer, ch->stream, &err);
			if (err)
				conn_err[i] = err;
			if (!conn && err == -EBADE) {
				const char *d = mp_conn_settings_diff(ctx, ch->peer, ch->stream);
				give_up(x, ch->peer, -EBADE, d ? d : "settings differ");
				continue;
			}
			if (!conn) {
				/* A dht peer listens before it publishes its record,
				 * so a refusal, or a connection of its seen closed
				 * lately (by us or by another member), means it is
				 * gone: no use waiting out the connect timeout. */
				uint64_t f = ctx->peers[ch->peer].failed_ns;
				uint32_t downs = ctx->peers[ch->peer].downs_us_from;
				if (ctx->dynamic && (err == -ECONNREFUSED ||
						     (f && now - f < conn_to))) {
					fail_peer(x, ch->peer, err ? err : -ECONNRESET,
						  "gone (refuses connections, or closed them)");
					continue;
				}
				/* A static peer that probed us as down from this
				 * round or a later one averages without us here:
				 * it will not connect (a restarted peer that
				 * started over at round 0 waited the connect
				 * timeout on each). */
				if (!ctx->dynamic && downs && downs - 1 >= x->round) {
					char why[96];
					snprintf(why, sizeof(why), "it has this peer down (its probe came "
						 "from round %u)", downs - 1);
					fail_peer(x, ch->peer, -ENOTCONN, why);
					continue;
				}
				if (now - start > conn_to || (deadline && now > deadline)) {
					char why[96];
					snprintf(why, sizeof(why), "not connected after %d ms",
						 now - start > conn_to ? ctx->cfg.connect_timeout_ms
								       : x->deadline_ms);
					fail_peer(x, ch->peer,
						  conn_err[i] ? conn_err[i] : -ETIMEDOUT, why);
				} else {
					active = 1;
				}
				continue;
			}
			if (!ch->m_first)
				ch->m_first = now;
			/* Completions, in posting order. */
			while (ch->s_n) {
				struct mp_xslot *s = &ch->ss[ch->s_head];
				int done = 0;
				rc = ctx->ops->test(s->req, &done, NULL);
				if (!done)
					break;
				s->req = NULL;
				slot_done(x, s);
				ch->s_head = (ch->s_head + 1) % ctx->window;
				ch->s_n--;
				mp_busy_done(&x->busy, now, 1, rc ? 0 : s->len);
				if (rc) {
					/* Acted on after the frames that arrived before
					 * it (below): a peer that plans otherwise closes
					 * after an OPEN that says so. */
					send_err = rc;
					break;
				}
				ch->sent++;
				ch->m_sent += s->len;
				ch->m_last = now;
				x->res->bytes_sent += s->len;
				x->res->values_sent += s->count;
				chmoved = 1;
			}
			/* (Past a failure of our own, nothing more is taken in:
			 * the frames after a lost one would look out of order.) */
			while (!ch->failed && !x->abort_err && ch->r_n) {
				struct mp_xslot *s = &ch->rs[ch->r_head];
				size_t len = 0;
				int done = 0;
				/* Past its OPEN, a channel's frames wait in their slots
				 * until every channel's OPEN is in (or failed), where
				 * the algorithm writes the buffer as frames arrive. */
				if (x->gate && ch->open_got && x->unopened > 0)
					break;
				rc = ctx->ops->test(s->req, &done, &len);
				if (!done)
					break;
				s->req = NULL;
				ch->r_head = (ch->r_head + 1) % ctx->window;
				ch->r_n--;
				chmoved = 1;
				ch->m_recv += len;
				ch->m_last = now;
				if (rc == -EMSGSIZE) {
					slot_done(x, s);
					reject(x, ch, MP_REJ_LENGTH);
					break;
				}
				if (rc) {
					slot_done(x, s);
					fail_peer(x, ch->peer, rc, "receive failed");
					break;
				}
				if (s->dsl)
					land_deliver(x, ch, s, len);
				else
					deliver(x, ch, s->buf, len, s->buf + MP_WIRE_HDR_SIZE, 0);
			}
			if (!ch->failed && send_err)
				fail_peer(x, ch->peer, send_err, "send failed");
			if (!ch->failed && ch->mismatch && ch->sent)
				/* Our OPEN is out: the peer sees the difference too. */
				fail_peer(x, ch->peer, -EPROTO, "it plans this exchange otherwise");
			if (!ch->failed && ch->defer_err && !ch->s_n && !ch->r_n)
				fail_peer(x, ch->peer, ch->defer_err, "connection broke");
			if (ch->failed)
				continue;
			if (chmoved) {
				last[i] = now;
				ctx->peers[ch->peer].meas.progress_ns = now;
			}
			moved |= chmoved;
			/* Post more receives and sends, up to the window. */
			while (ch->r_n < (x->land ? x->land : ctx->window) &&
			       (uint64_t)ch->r_n < recv_left(x, ch)) {
				struct mp_xslot *s = &ch->rs[(ch->r_head + ch->r_n) % ctx->window];
				if (x->land) {
					/* Into a twin: the NIC writes the GPU's memory. */
					s->dsl = mp_dev_land_try(x->gdr);
					if (!s->dsl)
						break;
					rc = ctx->ops->irecv(conn, s->dsl->dev - MP_WIRE_HDR_SIZE,
							     MP_WIRE_HDR_SIZE + x->gdr->dp->slot_bytes,
							     x->gdr->dp->dring_mr, &s->req);
					if (rc)
						slot_done(x, s);
				} else {
					rc = ctx->ops->irecv(conn, s->buf, fmax, ctx->slab_mr, &s->req);
				}
				/* With receives posted, their completions say why the
				 * connection broke (e.g. -EMSGSIZE); let them speak first. */
				if (rc && rc != -EAGAIN && ch->r_n)
					ch->defer_err = rc;
				if (rc == -EAGAIN || (rc && ch->r_n))
					break;
				if (rc) {
					fail_peer(x, ch->peer, rc, "receive could not be posted");
					break;
				}
				ch->r_n++;
				ch->recv_posted++;
			}
			while (!ch->failed && ch->s_n < ctx->window && post_send(x, ch, conn, now))
				moved = 1;
			if (ch->failed)
				continue;
			if (ch->s_n || ch->r_n || ch->staged || send_left(x, ch) || recv_left(x, ch)) {
				active = 1;
				/* Held at the OPEN gate: the wait is on other peers. */
				if (x->gate && ch->open_got && x->unopened > 0)
					last[i] = now;
				/* Silence is the peer's fault only if it owes us
				 * something it can send on its own: it counts from
				 * the end of a wait on others. But once nothing at
				 * all has moved for round_to, the others are not
				 * what it waits on (a reducer stopped with every
				 * contribution in its socket would otherwise hold
				 * the group until the deadline): it counts again. */
				if (!ch->s_n && !ch->staged && !x->fatal && x->xops->waits_on_others &&
				    now - last_move <= round_to && x->xops->waits_on_others(x->op, ch))
					last[i] = now;
				if (now - last[i] > round_to) {
					char why[96];
					snprintf(why, sizeof(why), "silent for %d ms",
						 ctx->cfg.round_timeout_ms);
					fail_peer(x, ch->peer, -ETIMEDOUT, why);
				} else if (deadline && now > deadline) {
					char why[96];
					snprintf(why, sizeof(why), "still missing at the %d ms deadline",
						 x->deadline_ms);
					fail_peer(x, ch->peer, -ETIMEDOUT, why);
				}
			}
		}
		if (!active) {
			rc = 0;
			break;
		}
		if (now - pub_at >= PUBLISH_NS) {
			/* mp_peers_info's copy stays fresh in a long exchange. */
			mp_peers_publish(ctx);
			pub_at = now;
		}
		/* Poll while things move and for a short spin after (a reply is
		 * often microseconds away); then sleep in the driver until an
		 * event, bounded so that timeouts are noticed. */
		if (moved)
			last_move = now;
		rc = ctx->ops->progress(ctx->drv,
					moved || pumping || now - last_move < spin_ns ? 0 : 10);
		if (rc && rc != -EAGAIN && rc != -EINTR) {
			MP_WARN("%s: transport progress failed: %s", x->what, mp_strerror(rc));
			for (int i = 0; i < x->nch; i++)
				if (!x->ch[i].failed)
					fail_peer(x, x->ch[i].peer, rc, "transport failure");
		}
	}
	/* Given up: what the OPENs left posted is cancelled. */
	for (int i = 0; x->fatal && i < x->nch; i++)
		if (!x->ch[i].failed)
			close_chan(x, &x->ch[i], -ECANCELED);
	/* Every receive posted into the device path's ring came back (a slot
	 * lost here would shrink the ring for good). */
	if (x->gdr && x->gdr->dp->landing)
		MP_WARN("%s round %u: %d chunk buffers of the device path still posted as receives "
			"after the exchange", x->what, x->round, x->gdr->dp->landing);
	ctx->cur_res = NULL;
	measure(x);
	mp_peers_publish(ctx);
	free(x->ch[0].ss);
	free(last);
	return rc ? rc : x->fatal;
}
