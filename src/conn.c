/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Connections between peers. The lower rank dials, the higher rank accepts,
 * so each (pair, stream) has exactly one connection. The dialer's first
 * message is a HELLO frame (run, rank, stream); an accepted connection is
 * anonymous until its HELLO arrives and passes validation. A connection is
 * handed to the algorithms only once it is known good: for the dialer when
 * the HELLO has left (the transport connected), for the acceptor when the
 * HELLO has been checked.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "conn.h"
#include "log.h"

#define RETRY_NS (100ull * 1000 * 1000)

void mp_reap(struct mp_ctx *ctx, struct mp_drv_req *req)
{
	int done = 0;

	for (int i = 0; req && !done && i < 1000; i++) {
		ctx->ops->test(req, &done, NULL);
		if (!done)
			ctx->ops->progress(ctx->drv, 0);
	}
}

void mp_conn_drop(struct mp_ctx *ctx, int peer, int stream)
{
	struct mp_peer *p = &ctx->peers[peer];

	if (!p->conns[stream])
		return;
	ctx->ops->close(p->conns[stream]);
	p->conns[stream] = NULL;
	mp_reap(ctx, p->hello[stream]);
	p->hello[stream] = NULL;
}

static void hello_header(struct mp_ctx *ctx, int stream, uint8_t *buf)
{
	struct mp_wire_hdr h = {
		.type = MP_MSG_HELLO,
		/* The codec field must be a wire id; the configured choice, "auto"
		 * included, travels in part. */
		.codec = (uint8_t)(ctx->codec_cfg == MP_CODEC_AUTO ? MP_CODEC_NONE : ctx->codec_cfg),
		.part = (uint32_t)ctx->codec_cfg,
		.run_id = ctx->run_id,
		.sender = (uint32_t)ctx->rank,
		.count = (uint32_t)ctx->npeers,
		.aux = (uint32_t)stream,
	};
	mp_wire_encode(&h, buf, NULL);
}

static int dial(struct mp_ctx *ctx, int peer, int stream)
{
	struct mp_peer *p = &ctx->peers[peer];
	struct mp_drv_conn *c;
	struct mp_iov iov;
	int rc;

	rc = ctx->ops->connect(ctx->drv, p->blob, p->blob_len, &c);
	if (rc)
		return rc;
	hello_header(ctx, stream, p->hello_buf[stream]);
	iov.base = p->hello_buf[stream];
	iov.len = MP_WIRE_HDR_SIZE;
	rc = ctx->ops->isend(c, &iov, 1, NULL, &p->hello[stream]);
	if (rc) {
		ctx->ops->close(c);
		return rc;
	}
	p->conns[stream] = c;
	p->ready[stream] = 0;
	MP_TRACE("dialing peer %d (%s) stream %d", peer, p->addr, stream);
	return 0;
}

struct mp_drv_conn *mp_conn_get(struct mp_ctx *ctx, int peer, int stream, int *err)
{
	struct mp_peer *p = &ctx->peers[peer];
	uint64_t now;
	int rc, done = 0;

	*err = 0;
	if (p->conns[stream] && p->ready[stream])
		return p->conns[stream];
	if (ctx->rank > peer)
		return NULL; /* the other side dials; mp_conn_poll adopts it */
	if (p->conns[stream]) {
		rc = ctx->ops->test(p->hello[stream], &done, NULL);
		if (!done)
			return NULL;
		p->hello[stream] = NULL;
		if (!rc) {
			p->ready[stream] = 1;
			MP_INFO("connected to peer %d (%s) stream %d", peer, p->addr, stream);
			return p->conns[stream];
		}
		/* Refused or reset while connecting: the peer may not listen yet. */
		MP_TRACE("connect to peer %d (%s) failed: %s; retrying", peer, p->addr, mp_strerror(rc));
		ctx->ops->close(p->conns[stream]);
		p->conns[stream] = NULL;
		p->retry_at_ns[stream] = mp_now_ns() + RETRY_NS;
		*err = rc;
		return NULL;
	}
	now = mp_now_ns();
	if (now < p->retry_at_ns[stream])
		return NULL;
	rc = dial(ctx, peer, stream);
	if (rc) {
		p->retry_at_ns[stream] = now + RETRY_NS;
		*err = rc;
	}
	return NULL;
}

static void reject(struct mp_ctx *ctx, struct mp_pending *pd, enum mp_wire_reject why,
		   const char *detail)
{
	ctx->rejected[why]++;
	if (ctx->cur_res)
		ctx->cur_res->frames_rejected++;
	MP_WARN("rejected an incoming connection: %s (%s)", mp_wire_reject_name(why), detail);
	ctx->ops->close(pd->conn);
	mp_reap(ctx, pd->req);
	pd->conn = NULL;
}

/* A HELLO arrived on a pending connection: check it and adopt the connection. */
static void adopt(struct mp_ctx *ctx, struct mp_pending *pd, int status, size_t len)
{
	struct mp_wire_hdr h;
	enum mp_wire_reject why = MP_REJ_NONE;
	int rc;

	pd->req = NULL;
	if (status) {
		if (status == -EMSGSIZE) {
			reject(ctx, pd, MP_REJ_LENGTH, "first message is not a HELLO");
		} else {
			ctx->ops->close(pd->conn);
			pd->conn = NULL;
		}
		return;
	}
	rc = mp_wire_decode(pd->buf, len, ctx->run_id, mp_codec_count(), &h, &why);
	if (rc) {
		reject(ctx, pd, why, "bad HELLO");
		return;
	}
	if (h.part != (uint32_t)ctx->codec_cfg ||
	    h.codec != (ctx->codec_cfg == MP_CODEC_AUTO ? MP_CODEC_NONE : ctx->codec_cfg)) {
		/* Peers must agree on the codec; say so now, not at the first chunk. */
		reject(ctx, pd, MP_REJ_CODEC, "the peer uses another codec");
		return;
	}
	if (h.type != MP_MSG_HELLO || h.sender >= (uint32_t)ctx->npeers ||
	    h.sender == (uint32_t)ctx->rank || (int)h.sender > ctx->rank ||
	    h.aux >= (uint32_t)ctx->streams || h.count != (uint32_t)ctx->npeers) {
		reject(ctx, pd, MP_REJ_UNEXPECTED, "HELLO from an unknown rank or stream");
		return;
	}
	struct mp_peer *p = &ctx->peers[h.sender];
	if (p->conns[h.aux]) {
		/* The peer reconnected (it lost the old connection first). */
		MP_INFO("peer %u stream %u reconnected", h.sender, h.aux);
		mp_conn_drop(ctx, (int)h.sender, (int)h.aux);
	}
	p->conns[h.aux] = pd->conn;
	p->ready[h.aux] = 1;
	pd->conn = NULL;
	MP_INFO("accepted peer %u (%s) stream %u", h.sender, p->addr, h.aux);
}

void mp_conn_poll(struct mp_ctx *ctx)
{
	struct mp_drv_conn *c;
	int rc;

	if (!ctx->listener)
		return;
	while ((rc = ctx->ops->accept(ctx->listener, &c)) == 0) {
		struct mp_pending *pd = NULL;
		for (int i = 0; i < ctx->npend; i++)
			if (!ctx->pend[i].conn)
				pd = &ctx->pend[i];
		if (!pd) {
			if (ctx->npend == ctx->pend_cap) {
				int nc = ctx->pend_cap ? ctx->pend_cap * 2 : 16;
				struct mp_pending *np = realloc(ctx->pend, (size_t)nc * sizeof(*np));
				if (!np) {
					ctx->ops->close(c);
					continue;
				}
				ctx->pend = np;
				ctx->pend_cap = nc;
			}
			pd = &ctx->pend[ctx->npend++];
		}
		memset(pd, 0, sizeof(*pd));
		pd->conn = c;
		pd->since_ns = mp_now_ns();
		rc = ctx->ops->irecv(c, pd->buf, sizeof(pd->buf), NULL, &pd->req);
		if (rc) {
			ctx->ops->close(c);
			pd->conn = NULL;
		}
	}
	uint64_t now = mp_now_ns();
	for (int i = 0; i < ctx->npend; i++) {
		struct mp_pending *pd = &ctx->pend[i];
		size_t len = 0;
		int done = 0;

		if (!pd->conn)
			continue;
		rc = ctx->ops->test(pd->req, &done, &len);
		if (done) {
			adopt(ctx, pd, rc, len);
		} else if (now - pd->since_ns > (uint64_t)ctx->cfg.connect_timeout_ms * 1000000ull) {
			/* Someone connected and said nothing: do not hold the slot forever. */
			reject(ctx, pd, MP_REJ_TRUNCATED, "no HELLO before the connect timeout");
		}
	}
}

void mp_conn_close_all(struct mp_ctx *ctx)
{
	for (int i = 0; i < ctx->npend; i++)
		if (ctx->pend[i].conn) {
			ctx->ops->close(ctx->pend[i].conn);
			mp_reap(ctx, ctx->pend[i].req);
			ctx->pend[i].conn = NULL;
		}
	if (!ctx->peers)
		return;
	for (int p = 0; p < ctx->npeers; p++)
		for (int s = 0; s < ctx->nconn; s++)
			mp_conn_drop(ctx, p, s);
}
