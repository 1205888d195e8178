/* SPDX-License-Identifier: BSD-3-Clause */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "conn.h"
#include "ctrl.h"
#include "log.h"

#define FRAME_MAX (MP_WIRE_HDR_SIZE + MP_CTRL_PAYLOAD_MAX)
/* How long mp_leave waits for its BYEs to leave. */
#define BYE_WAIT_NS (500ull * 1000 * 1000)

struct ctrl_rx {
	struct mp_drv_conn *conn; /* the connection the receive is posted on */
	struct mp_drv_req *req;
	uint8_t *buf;
};

struct ctrl_tx {
	struct mp_drv_req *req;
	uint8_t *buf;
	struct ctrl_tx *next;
};

struct mp_ctrl {
	struct ctrl_rx *rx; /* per peer */
	int nrx;
	struct ctrl_tx *tx;
	struct mp_reqq q; /* arrivals for the matchmaker */
	struct {
		mp_ctrl_handler fn;
		void *arg;
		const char *bad; /* what a refused one is, for the log */
	} on[MP_MSG_TYPE_MAX + 1]; /* registered handlers, by message type */
};

static void poll_ctrl(struct mp_ctx *ctx, int in_exchange);

/* The engine's hook: inside an exchange, a BYE waits for its end. */
static void poll_in_exchange(struct mp_ctx *ctx)
{
	poll_ctrl(ctx, 1);
}

int mp_ctrl_init(struct mp_ctx *ctx)
{
	ctx->ctrl = calloc(1, sizeof(*ctx->ctrl));
	if (!ctx->ctrl)
		return -ENOMEM;
	/* In a dht run an exchange reads the control connections too: a
	 * closed one, or an absence another member declares, tells it that a
	 * peer it waits for has died. */
	if (ctx->dynamic)
		ctx->exchange_hook = poll_in_exchange;
	return 0;
}

int mp_ctrl_on(struct mp_ctx *ctx, enum mp_msg_type type, mp_ctrl_handler fn, void *arg,
	       const char *bad)
{
	if (type > MP_MSG_TYPE_MAX || type == MP_MSG_BYE)
		return -EINVAL;
	ctx->ctrl->on[type].fn = fn;
	ctx->ctrl->on[type].arg = arg;
	ctx->ctrl->on[type].bad = bad;
	return 0;
}

static int ctrl_idx(const struct mp_ctx *ctx)
{
	return ctx->streams;
}

/* The receive of @p is dead (its connection was closed or replaced): release it. */
static void rx_reset(struct mp_ctx *ctx, struct ctrl_rx *r)
{
	if (r->req)
		mp_reap(ctx, r->req);
	r->req = NULL;
	r->conn = NULL;
}

void mp_ctrl_msg_free(struct mp_ctrl_msg *m)
{
	if (!m)
		return;
	free(m->payload);
	free(m);
}

void mp_ctrl_fini(struct mp_ctx *ctx)
{
	struct mp_ctrl *c = ctx->ctrl;

	if (!c)
		return;
	/* The connections are closed by now: what is posted completes cancelled. */
	for (int i = 0; i < c->nrx; i++) {
		rx_reset(ctx, &c->rx[i]);
		free(c->rx[i].buf);
	}
	while (c->tx) {
		struct ctrl_tx *t = c->tx;
		c->tx = t->next;
		mp_reap(ctx, t->req);
		free(t->buf);
		free(t);
	}
	for (struct mp_ctrl_msg *m; (m = mp_reqq_pop_entry(&c->q, struct mp_ctrl_msg, link));)
		mp_ctrl_msg_free(m);
	free(c->rx);
	free(c);
	ctx->ctrl = NULL;
}

static int grow_rx(struct mp_ctx *ctx)
{
	struct mp_ctrl *c = ctx->ctrl;
	struct ctrl_rx *n;

	if (c->nrx >= ctx->npeers)
		return 0;
	n = realloc(c->rx, (size_t)ctx->npeers * sizeof(*n));
	if (!n)
		return -ENOMEM;
	memset(n + c->nrx, 0, (size_t)(ctx->npeers - c->nrx) * sizeof(*n));
	c->rx = n;
	c->nrx = ctx->npeers;
	return 0;
}

static void reject(struct mp_ctx *ctx, int peer, enum mp_wire_reject why, const char *detail)
{
	MP_STAT_ADD(ctx->rejected[why], 1);
	if (ctx->cur_res)
		ctx->cur_res->frames_rejected++;
	MP_WARN("control message from peer %016llx dropped: %s (%s)",
		(unsigned long long)ctx->peers[peer].id, mp_wire_reject_name(why), detail);
}

/* A control frame arrived from @peer: check it, then act on it or queue it. */
static void arrived(struct mp_ctx *ctx, int peer, const uint8_t *buf, size_t len, int in_exchange)
{
	struct mp_ctrl *c = ctx->ctrl;
	enum mp_wire_reject why = MP_REJ_NONE;
	struct mp_wire_hdr h;
	struct mp_ctrl_msg *m;

	if (mp_wire_decode(buf, len, ctx->run_id, mp_codec_count(), &h, &why)) {
		reject(ctx, peer, why, "malformed");
		return;
	}
	if (h.token != mp_conn_token(ctx, peer, ctrl_idx(ctx))) {
		reject(ctx, peer, MP_REJ_TOKEN, "session token mismatch");
		return;
	}
	if (h.sender != (uint32_t)ctx->peers[peer].id ||
	    (h.type != MP_MSG_BYE && h.type != MP_MSG_JOIN && h.type != MP_MSG_BEGIN &&
	     h.type != MP_MSG_REJECT && h.type != MP_MSG_ACCEPT && h.type != MP_MSG_DECL &&
	     h.type != MP_MSG_PEER)) {
		reject(ctx, peer, MP_REJ_UNEXPECTED, "not a control message of this peer");
		return;
	}
	if (h.type == MP_MSG_BYE) {
		MP_INFO("peer %016llx said goodbye", (unsigned long long)ctx->peers[peer].id);
		ctx->peers[peer].gone_bye = 1;
		/* Inside an exchange its data connections are the engine's to
		 * close: gone at the next poll outside it. */
		if (in_exchange)
			ctx->peers[peer].bye_pending = 1;
		else
			mp_conn_peer_gone(ctx, peer);
		return;
	}
	if (c->on[h.type].fn) {
		/* Taken at once, whatever the matchmaker is doing (a DECL is
		 * what the DHT would have brought, only sooner). */
		int rc = c->on[h.type].fn(c->on[h.type].arg, peer, &h, buf + MP_WIRE_HDR_SIZE);
		if (rc == -EBADMSG)
			reject(ctx, peer, MP_REJ_UNEXPECTED, c->on[h.type].bad);
		return;
	}
	if (h.type == MP_MSG_DECL || h.type == MP_MSG_PEER) {
		/* Nobody here takes them: not a dht run. */
		reject(ctx, peer, MP_REJ_UNEXPECTED, "membership message outside a dht run");
		return;
	}
	m = calloc(1, sizeof(*m));
	if (!m)
		return;
	m->peer = peer;
	m->h = h;
	if (h.length) {
		m->payload = malloc(h.length);
		if (!m->payload) {
			free(m);
			return;
		}
		memcpy(m->payload, buf + MP_WIRE_HDR_SIZE, h.length);
	}
	mp_ctrl_requeue(ctx, m);
}

/*
 * Peer @p's control connection failed with @rc: drop it (the next dial or
 * accept makes a new one).
 */
static void rx_lost(struct mp_ctx *ctx, int p, int rc)
{
	MP_TRACE("control connection to peer %016llx: %s", (unsigned long long)ctx->peers[p].id,
		 mp_strerror(rc));
	/* Closed without a BYE: a dht peer's process died (its kernel closed
	 * the socket). */
	if (ctx->dynamic && rc == -ECONNRESET)
		mp_peer_suspect(ctx, p, "closed its control connection without a BYE");
	mp_conn_drop(ctx, p, ctrl_idx(ctx));
	ctx->ctrl->rx[p].conn = NULL;
}

/*
 * Post the next receive on peer @p's control connection @conn. A driver
 * refuses it on a connection that has failed, and that is how a death is
 * learned when the failure was met by a send, between the messages the
 * peer sent before it died: ignored, the connection stayed open and a
 * JOIN to the dead peer waited out the request timeout.
 */
static void rx_post(struct mp_ctx *ctx, int p, struct mp_drv_conn *conn)
{
	struct ctrl_rx *r = &ctx->ctrl->rx[p];
	int rc = ctx->ops->irecv(conn, r->buf, FRAME_MAX, NULL, &r->req);

	if (!rc) {
		r->conn = conn;
		return;
	}
	r->req = NULL;
	if (rc != -EAGAIN && rc != -ENOMEM)
		rx_lost(ctx, p, rc);
}

static void poll_ctrl(struct mp_ctx *ctx, int in_exchange)
{
	struct mp_ctrl *c = ctx->ctrl;
	int ci = ctrl_idx(ctx), rc;

	mp_conn_poll(ctx);
	if (grow_rx(ctx))
		return;
	for (struct ctrl_tx **pp = &c->tx; *pp;) {
		struct ctrl_tx *t = *pp;
		int done = 0;
		ctx->ops->test(t->req, &done, NULL);
		if (!done) {
			pp = &t->next;
			continue;
		}
		*pp = t->next;
		free(t->buf);
		free(t);
	}
	for (int p = 0; p < ctx->npeers; p++) {
		struct mp_peer *pe = &ctx->peers[p];
		struct ctrl_rx *r = &c->rx[p];
		struct mp_drv_conn *conn;

		if (p == ctx->rank)
			continue;
		if (pe->bye_pending && !in_exchange) {
			pe->bye_pending = 0;
			mp_conn_peer_gone(ctx, p);
		}
		conn = mp_conn_ready(ctx, p, ci);
		if (r->req && r->conn != conn)
			rx_reset(ctx, r); /* closed or replaced since we posted */
		while (r->req) {
			size_t len = 0;
			int done = 0;
			rc = ctx->ops->test(r->req, &done, &len);
			if (!done)
				break;
			r->req = NULL;
			if (rc) {
				rx_lost(ctx, p, rc);
				break;
			}
			arrived(ctx, p, r->buf, len, in_exchange);
			if (pe->gone || mp_conn_ready(ctx, p, ci) != conn) {
				r->conn = NULL;
				break;
			}
			rx_post(ctx, p, conn);
		}
		/* The loop may have closed the connection (error, BYE): look again. */
		conn = mp_conn_ready(ctx, p, ci);
		if (!conn && !r->req && r->buf) {
			/* No connection, nothing posted: the buffer waits for a
			 * connection that, for a peer that died, never comes. A
			 * run with churn would keep one per peer it ever knew. */
			free(r->buf);
			r->buf = NULL;
		}
		if (!conn || r->req || pe->gone)
			continue;
		if (!r->buf && !(r->buf = malloc(FRAME_MAX)))
			continue;
		rx_post(ctx, p, conn);
	}
}

void mp_ctrl_poll(struct mp_ctx *ctx)
{
	poll_ctrl(ctx, 0);
}

int mp_ctrl_send(struct mp_ctx *ctx, int peer, struct mp_wire_hdr *h, const void *payload,
		 size_t len)
{
	struct mp_ctrl *c = ctx->ctrl;
	struct mp_drv_conn *conn;
	struct ctrl_tx *t;
	struct mp_iov iov;
	int err, rc;

	if (len > MP_CTRL_PAYLOAD_MAX)
		return -EMSGSIZE;
	if (ctx->peers[peer].gone)
		return -ENOTCONN;
	conn = mp_conn_get(ctx, peer, ctrl_idx(ctx), &err);
	if (!conn)
		return err == -ENOTCONN ? -ENOTCONN : -EAGAIN;
	t = calloc(1, sizeof(*t));
	if (!t || !(t->buf = malloc(MP_WIRE_HDR_SIZE + len))) {
		free(t);
		return -ENOMEM;
	}
	h->run_id = ctx->run_id;
	h->sender = (uint32_t)ctx->self_id;
	h->length = (uint32_t)len;
	h->token = mp_conn_token(ctx, peer, ctrl_idx(ctx));
	if (len)
		memcpy(t->buf + MP_WIRE_HDR_SIZE, payload, len);
	mp_wire_encode(h, t->buf, NULL);
	iov.base = t->buf;
	iov.len = MP_WIRE_HDR_SIZE + len;
	rc = ctx->ops->isend(conn, &iov, 1, NULL, &t->req);
	if (rc) {
		free(t->buf);
		free(t);
		mp_conn_drop(ctx, peer, ctrl_idx(ctx));
		return rc;
	}
	t->next = c->tx;
	c->tx = t;
	return 0;
}

void mp_ctrl_send_all(struct mp_ctx *ctx, struct mp_wire_hdr *h, const void *payload,
		      size_t len, int skip)
{
	for (int i = 0; i < ctx->npeers; i++)
		if (i != ctx->rank && i != skip && !ctx->peers[i].gone)
			mp_ctrl_send(ctx, i, h, payload, len);
}

struct mp_ctrl_msg *mp_ctrl_take(struct mp_ctx *ctx)
{
	return mp_reqq_pop_entry(&ctx->ctrl->q, struct mp_ctrl_msg, link);
}

void mp_ctrl_requeue(struct mp_ctx *ctx, struct mp_ctrl_msg *m)
{
	mp_reqq_push(&ctx->ctrl->q, &m->link);
}

void mp_ctrl_bye_all(struct mp_ctx *ctx)
{
	struct mp_ctrl *c = ctx->ctrl;
	uint64_t until = mp_now_ns() + BYE_WAIT_NS;
	int ci = ctrl_idx(ctx);

	if (!c)
		return;
	for (int p = 0; p < ctx->npeers; p++) {
		struct mp_wire_hdr h = {.type = MP_MSG_BYE};
		struct mp_peer *pe = &ctx->peers[p];
		if (p == ctx->rank || pe->gone || !mp_conn_ready(ctx, p, ci))
			continue;
		mp_ctrl_send(ctx, p, &h, NULL, 0);
	}
	while (c->tx && mp_now_ns() < until) {
		ctx->ops->progress(ctx->drv, 1);
		mp_ctrl_poll(ctx);
	}
}
