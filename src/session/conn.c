/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Connections between peers and their handshake (doc/protocol.md,
 * "Connection handshake"). A pair of peers has nconn connections: the data
 * streams 0..streams-1, then the control connection (index streams). One side
 * dials each: a client peer always (it does not listen), else the lower id.
 *
 * The dialer sends HELLO (its id, a nonce, its mode, bandwidth and address);
 * the acceptor answers CHALLENGE (its own nonce and a MAC that only a holder
 * of the run key can make); the dialer checks it and answers AUTH (its MAC
 * over both nonces). Only a verified AUTH makes the acceptor adopt the
 * connection, or learn a peer it did not know: a peer without the key
 * changes nothing. Both sides derive the connection's session token from the
 * two nonces, and the engine stamps it on every frame. A connection is handed
 * out (mp_conn_get) only once it is known good: for the dialer when its AUTH
 * is posted, for the acceptor when the AUTH has been checked.
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <moshpit/sdk/le.h>

#include "conn.h"
#include "log.h"

#define RETRY_NS (100ull * 1000 * 1000)

/* Handshake frames (doc/protocol.md, "Connection handshake"): HELLO carries
 * a nonce, the dialer's mode, bandwidth, its settings (a u16 length, then
 * the entries of settings.h) and NUL-terminated address; CHALLENGE a nonce,
 * a MAC and the acceptor's settings the same way; AUTH a MAC. */
#define MP_HELLO_FIXED (MP_NONCE_BYTES + 1 + 8 + 2)
#define MP_HELLO_MAX (MP_WIRE_HDR_SIZE + MP_HELLO_FIXED + MP_SETTINGS_MAX + MP_ADDR_STRLEN)
#define MP_CHALLENGE_FIXED (MP_NONCE_BYTES + MP_MAC_BYTES + 2)
#define MP_CHALLENGE_LEN (MP_WIRE_HDR_SIZE + MP_CHALLENGE_FIXED + MP_SETTINGS_MAX)
#define MP_AUTH_LEN (MP_WIRE_HDR_SIZE + MP_MAC_BYTES)
/* A peer whose settings differ is dialled again this often: it may be
 * restarted with the right ones, but each try is refused on both sides. */
#define SETTINGS_RETRY_NS (1000ull * 1000 * 1000)

/* One connection slot to a peer: the connection, its handshake and session. */
struct mp_link {
	struct mp_drv_conn *conn;   /* NULL = none; dialer: set while the handshake runs */
	int ready;                  /* handshake done (token known): usable */
	uint32_t token;             /* session token once ready (never 0), else 0 */
	uint64_t since_ns;          /* dialer: when the dial began (handshake deadline) */
	uint64_t retry_at_ns;       /* dialer: when to dial again after a failure */
	unsigned auth_fails;        /* dialer: CHALLENGEs refused in a row (log rate) */
	unsigned settings_fails;    /* handshakes refused in a row for settings (log rate) */
	int settings_bad;           /* the last handshake found the peer's settings differ:
	                               mp_conn_get reports -EBADE until one agrees */
	int refusing;               /* dialer: settings differ; our AUTH goes out, then we close */
	int err;                    /* dialer: last failure, until mp_conn_get reports it */
	int probe_kind;             /* the probe slot (index nconn): MP_PROBE_* of the probe */
	uint32_t probe_round;       /* ... and the round its HELLO carries */
	struct mp_drv_req *sreq;    /* dialer: our HELLO, then our AUTH, in flight */
	struct mp_drv_req *rreq;    /* dialer: the CHALLENGE's receive */
	uint8_t nonce_d[MP_NONCE_BYTES];
	uint8_t sbuf[MP_HELLO_MAX];
	uint8_t rbuf[MP_CHALLENGE_LEN];
	uint8_t sset[MP_SETTINGS_MAX]; /* dialer: our settings as the HELLO carried them */
	size_t sset_len;
	char differ[160];           /* with settings_bad: which field, both values */
};

/* An accepted connection in its handshake: waiting for the HELLO, then (our
 * CHALLENGE sent) for the AUTH. */
struct mp_pending {
	struct mp_drv_conn *conn;
	struct mp_drv_req *req;     /* HELLO, then AUTH, receive */
	struct mp_drv_req *sreq;    /* CHALLENGE send */
	uint64_t since_ns;          /* accepted at; the whole handshake has the connect timeout */
	uint64_t chal_ns;           /* CHALLENGE posted at: to the AUTH is a round trip */
	int got_hello;
	uint32_t idx;               /* from the HELLO: connection index */
	uint64_t id;                /* from the HELLO: the dialer's id, unproven until AUTH */
	int probe_kind;             /* from the HELLO on the probe index: MP_PROBE_* */
	uint32_t round;             /* from the HELLO: where the dialer's averages are */
	int late;                   /* an announce for a round we had passed: ignored */
	int mode;
	double bandwidth;
	uint8_t nonce_d[MP_NONCE_BYTES], nonce_a[MP_NONCE_BYTES];
	char addr[MP_ADDR_STRLEN];
	uint8_t dset[MP_SETTINGS_MAX]; /* the dialer's settings as its HELLO carried them */
	size_t dset_len;
	char differ[160];               /* "" or how the dialer's settings differ from ours */
	/* MP_HELLO_MAX received, then MP_CHALLENGE_LEN sent: allocated apart,
	 * since the driver writes into it while ctx->pend may be reallocated */
	uint8_t *buf;
};

/* The rank in a static run, the 16 hex digits of the id in a dht run. */
static const char *id_str(const struct mp_ctx *ctx, uint64_t id, char buf[24])
{
	snprintf(buf, 24, ctx->dynamic ? "%016llx" : "%llu", (unsigned long long)id);
	return buf;
}

/*
 * A handshake with @peer (its slot @l) found that its settings differ from
 * ours (@differ: the field and both values). Refused on this side; the slot
 * remembers it, so that every exchange that needs the peer fails with
 * -EBADE at once instead of at its connect timeout. Logged at powers of two
 * of refusals in a row: the peer is dialled again every second.
 */
static void settings_refused(struct mp_ctx *ctx, struct mp_link *l, const char *name,
			     const char *addr, const char *differ)
{
	MP_STAT_ADD(ctx->rejected[MP_REJ_SETTINGS], 1);
	if (ctx->cur_res)
		ctx->cur_res->frames_rejected++;
	l->settings_bad = 1;
	snprintf(l->differ, sizeof(l->differ), "%s", differ);
	l->settings_fails++;
	if (!(l->settings_fails & (l->settings_fails - 1)))
		mp_set_error(ctx, "peer %s (%s): %s (refused; %u in a row)", name, addr, differ,
			     l->settings_fails);
}

/* What one handshake binds together. Each side's MAC covers its own
 * settings as it sent them, so that a refusal for settings is the peer's
 * word and not a stranger's. */
struct hs {
	const uint8_t *nonce_d, *nonce_a;
	uint64_t dialer, acceptor;
	uint32_t idx;
	const uint8_t *set;  /* CHALLENGE: the acceptor's settings; AUTH: the dialer's */
	size_t set_len;
};

/*
 * The MAC of a handshake step under the run key, into @mac; with @check,
 * verify @mac instead (0 or -EACCES). CHALLENGE covers (nonce_d, dialer,
 * acceptor, index, run id); AUTH covers (nonce_a, nonce_d, dialer, acceptor,
 * index). Integers go in as little-endian bytes.
 */
static int hs_mac(const struct mp_ctx *ctx, enum mp_auth_domain d, const struct hs *s,
		  uint8_t mac[MP_MAC_BYTES], int check)
{
	uint8_t dialer[8], acceptor[8], idx[4], run[8];
	struct mp_auth_piece pc[6];
	int n = 0;

	mp_le_put64(dialer, s->dialer);
	mp_le_put64(acceptor, s->acceptor);
	mp_le_put32(idx, s->idx);
	mp_le_put64(run, ctx->run_id);
	if (d == MP_AUTH_RESPONSE)
		pc[n++] = (struct mp_auth_piece){s->nonce_a, MP_NONCE_BYTES};
	pc[n++] = (struct mp_auth_piece){s->nonce_d, MP_NONCE_BYTES};
	pc[n++] = (struct mp_auth_piece){dialer, sizeof(dialer)};
	pc[n++] = (struct mp_auth_piece){acceptor, sizeof(acceptor)};
	pc[n++] = (struct mp_auth_piece){idx, sizeof(idx)};
	if (d == MP_AUTH_CHALLENGE)
		pc[n++] = (struct mp_auth_piece){run, sizeof(run)};
	pc[n++] = (struct mp_auth_piece){s->set, s->set_len};
	if (check)
		return mp_auth_verify(&ctx->auth, d, pc, n, mac);
	mp_auth_mac(&ctx->auth, d, pc, n, mac);
	return 0;
}

/* Session token: the first 4 bytes (little-endian) of MAC(nonce_d, nonce_a);
 * never 0, which marks handshake frames. */
static uint32_t hs_token(const struct mp_ctx *ctx, const struct hs *s)
{
	const struct mp_auth_piece pc[2] = {{s->nonce_d, MP_NONCE_BYTES},
					    {s->nonce_a, MP_NONCE_BYTES}};
	uint8_t mac[MP_MAC_BYTES];
	uint32_t t;

	mp_auth_mac(&ctx->auth, MP_AUTH_TOKEN, pc, 2, mac);
	t = (uint32_t)mac[0] | (uint32_t)mac[1] << 8 | (uint32_t)mac[2] << 16 |
	    (uint32_t)mac[3] << 24;
	return t ? t : 1;
}

/* Header fields every handshake frame shares. */
static struct mp_wire_hdr hs_header(const struct mp_ctx *ctx, uint8_t type, uint32_t idx,
				    uint32_t length)
{
	struct mp_wire_hdr h = {
		.type = type,
		/* The codec field must be a wire id; the configured choice, "auto"
		 * included, travels in part. */
		.codec = (uint8_t)(ctx->codec_cfg == MP_CODEC_AUTO ? MP_CODEC_NONE : ctx->codec_cfg),
		.part = (uint32_t)ctx->codec_cfg,
		/* Payloads hold MACs: a corrupted one must not read as a wrong key. */
		.flags = MP_WIRE_F_PAYLOAD_CRC,
		.run_id = ctx->run_id,
		.sender = (uint32_t)ctx->self_id,
		.offset = ctx->self_id,
		.aux = idx,
		.length = length,
		/* Where this peer's averages are: a restarted peer learns the
		 * run's round from its first handshakes (failure memory). */
		.round = ctx->avg_round,
	};
	return h;
}

static void count_reject(struct mp_ctx *ctx, enum mp_wire_reject why)
{
	MP_STAT_ADD(ctx->rejected[why], 1);
	if (ctx->cur_res)
		ctx->cur_res->frames_rejected++;
}

void mp_reap(struct mp_ctx *ctx, struct mp_drv_req *req)
{
	int done = 0;

	for (int i = 0; req && !done && i < 1000; i++) {
		ctx->ops->test(req, &done, NULL);
		if (!done)
			ctx->ops->progress(ctx->drv, 0);
	}
}

/* The slot of (@peer, @idx), or NULL if conn.c never needed one for @peer. */
static struct mp_link *link_get(const struct mp_ctx *ctx, int peer, int idx)
{
	return peer < ctx->nlinks && ctx->links[peer] ? &ctx->links[peer][idx] : NULL;
}

/* The same, made if missing (the peer table has grown); NULL: no memory. */
static struct mp_link *link_make(struct mp_ctx *ctx, int peer, int idx)
{
	if (peer >= ctx->nlinks) {
		int n = ctx->nlinks ? ctx->nlinks : 8;
		struct mp_link **nl;

		while (n <= peer)
			n *= 2;
		nl = realloc(ctx->links, (size_t)n * sizeof(*nl));
		if (!nl)
			return NULL;
		memset(nl + ctx->nlinks, 0, (size_t)(n - ctx->nlinks) * sizeof(*nl));
		ctx->links = nl;
		ctx->nlinks = n;
	}
	/* One slot more than the connections: the probe slot (index nconn). */
	if (!ctx->links[peer]) {
		if (!(ctx->links[peer] = calloc((size_t)ctx->nconn + 1, sizeof(struct mp_link))))
			return NULL;
		MP_STAT_ADD(ctx->cstats.peers_held, 1);
	}
	return &ctx->links[peer][idx];
}

struct mp_drv_conn *mp_conn_ready(const struct mp_ctx *ctx, int peer, int idx)
{
	const struct mp_link *l = link_get(ctx, peer, idx);

	return l && l->conn && l->ready ? l->conn : NULL;
}

int mp_conn_open(const struct mp_ctx *ctx, int peer, int idx)
{
	const struct mp_link *l = link_get(ctx, peer, idx);

	return l && l->conn;
}

void mp_conn_drop(struct mp_ctx *ctx, int peer, int idx)
{
	struct mp_link *l = link_get(ctx, peer, idx);

	if (!l || !l->conn)
		return;
	ctx->ops->close(l->conn);
	l->conn = NULL;
	l->ready = 0;
	mp_reap(ctx, l->sreq);
	mp_reap(ctx, l->rreq);
	l->sreq = l->rreq = NULL;
	l->token = 0;
}

uint32_t mp_conn_token(struct mp_ctx *ctx, int peer, int idx)
{
	const struct mp_link *l = link_get(ctx, peer, idx);

	return l && l->ready ? l->token : 0;
}

void mp_conn_agreed_note(struct mp_ctx *ctx, int peer, uint64_t n)
{
	struct mp_peer *p = &ctx->peers[peer];
	uint32_t token = mp_conn_token(ctx, peer, 0);

	if (!token || !n)
		return;
	for (int i = 0; i < MP_AGREED_LENS; i++)
		if (p->agreed[i].n == n && p->agreed[i].token == token)
			return;
	p->agreed[p->agreed_next].n = n;
	p->agreed[p->agreed_next].token = token;
	p->agreed_next = (uint8_t)((p->agreed_next + 1) % MP_AGREED_LENS);
}

int mp_conn_agreed_len(const struct mp_ctx *ctx, int peer, uint64_t n)
{
	const struct mp_peer *p = &ctx->peers[peer];
	const struct mp_link *l = link_get(ctx, peer, 0);
	uint32_t token = l && l->ready ? l->token : 0;

	for (int s = 0; s < ctx->streams; s++)
		if (!mp_conn_ready(ctx, peer, s))
			return 0;
	for (int i = 0; token && i < MP_AGREED_LENS; i++)
		if (p->agreed[i].n == n && p->agreed[i].token == token)
			return 1;
	return 0;
}

const char *mp_conn_settings_diff(const struct mp_ctx *ctx, int peer, int idx)
{
	const struct mp_link *l = link_get(ctx, peer, idx);

	return l && l->settings_bad ? l->differ : NULL;
}

void mp_conn_peer_gone(struct mp_ctx *ctx, int idx)
{
	struct mp_peer *p = &ctx->peers[idx];

	if (p->gone || idx == ctx->rank)
		return;
	p->gone = 1;
	p->gone_wall_ms = mp_wall_ms();
	/* Its slots too (the probe slot included): a run with churn learns
	 * a new peer for every one that leaves, so what a gone peer keeps is
	 * memory that grows with the run (doc/reliability.md, "Soak"). A
	 * gone peer is not dialled; should it come back (a late record,
	 * sync_members) or dial us, link_make makes them anew. */
	for (int s = 0; s <= ctx->nconn; s++)
		mp_conn_drop(ctx, idx, s);
	if (idx < ctx->nlinks && ctx->links[idx]) {
		free(ctx->links[idx]);
		ctx->links[idx] = NULL;
		MP_STAT_ADD(ctx->cstats.peers_held, (uint64_t)-1);
	}
	MP_INFO("peer %016llx left", (unsigned long long)p->id);
}

/* 1 if this side dials @p, 0 if @p dials, -ENOTCONN if neither (two clients). */
static int we_dial(const struct mp_ctx *ctx, const struct mp_peer *p)
{
	int me_client = ctx->mode == MP_MODE_CLIENT, it_client = p->mode == MP_MODE_CLIENT;

	if (me_client && it_client)
		return -ENOTCONN;
	if (me_client || it_client)
		return me_client;
	return ctx->self_id < p->id;
}

/* HELLO for connection @idx into @buf; returns the frame's bytes. */
static size_t hello_frame(const struct mp_ctx *ctx, int idx, const struct mp_link *l,
			  const uint8_t *nonce, uint8_t *buf)
{
	uint8_t *pl = buf + MP_WIRE_HDR_SIZE;
	/* A client accepts nothing, so it has no address to give. */
	const char *addr = ctx->listener && ctx->mode != MP_MODE_CLIENT ? ctx->local_addr : "";
	size_t alen = strlen(addr) + 1;
	size_t slen = mp_settings_encode(&ctx->settings, pl + MP_HELLO_FIXED);
	uint64_t bw;
	struct mp_wire_hdr h = hs_header(ctx, MP_MSG_HELLO, (uint32_t)idx,
					 (uint32_t)(MP_HELLO_FIXED + slen + alen));

	h.count = ctx->dynamic ? 0 : (uint32_t)ctx->npeers;
	if (idx == ctx->nconn) {
		/* A probe says what it asks in the group id (MP_PROBE_*). */
		h.group_id = (uint32_t)l->probe_kind;
		h.round = l->probe_round;
	}
	memcpy(pl, nonce, MP_NONCE_BYTES);
	pl[MP_NONCE_BYTES] = (uint8_t)ctx->mode;
	memcpy(&bw, &ctx->cfg.bandwidth, sizeof(bw));
	mp_le_put64(pl + MP_NONCE_BYTES + 1, bw);
	mp_le_put16(pl + MP_NONCE_BYTES + 9, (uint16_t)slen);
	memcpy(pl + MP_HELLO_FIXED + slen, addr, alen);
	mp_wire_encode(&h, buf, pl);
	return MP_WIRE_HDR_SIZE + h.length;
}

static int dial(struct mp_ctx *ctx, int peer, int idx)
{
	struct mp_peer *p = &ctx->peers[peer];
	struct mp_link *l = link_get(ctx, peer, idx);
	struct mp_drv_conn *c;
	struct mp_iov iov;
	char name[24];
	int rc;

	rc = ctx->ops->connect(ctx->drv, p->blob, p->blob_len, &c);
	if (rc)
		return rc;
	mp_auth_random(l->nonce_d, sizeof(l->nonce_d));
	iov.base = l->sbuf;
	iov.len = hello_frame(ctx, idx, l, l->nonce_d, l->sbuf);
	l->sset_len = mp_le_get16(l->sbuf + MP_WIRE_HDR_SIZE + MP_NONCE_BYTES + 9);
	memcpy(l->sset, l->sbuf + MP_WIRE_HDR_SIZE + MP_HELLO_FIXED, l->sset_len);
	rc = ctx->ops->irecv(c, l->rbuf, sizeof(l->rbuf), NULL, &l->rreq);
	if (!rc)
		rc = ctx->ops->isend(c, &iov, 1, NULL, &l->sreq);
	if (rc) {
		ctx->ops->close(c);
		mp_reap(ctx, l->rreq);
		l->rreq = NULL;
		return rc;
	}
	l->conn = c;
	l->ready = 0;
	l->since_ns = mp_now_ns();
	MP_TRACE("dialing peer %s (%s) connection %d", id_str(ctx, p->id, name), p->addr, idx);
	return 0;
}

/*
 * The CHALLENGE of (@peer, @idx) arrived (@len bytes): check that the
 * acceptor holds the run key, then answer AUTH. Returns 0 (ready), -EACCES
 * (wrong MAC) or -EPROTO (not a CHALLENGE for this connection), both
 * counted, or the error of posting the AUTH.
 */
static int challenge_arrived(struct mp_ctx *ctx, int peer, int idx, size_t len)
{
	struct mp_peer *p = &ctx->peers[peer];
	struct mp_link *l = link_get(ctx, peer, idx);
	const uint8_t *pl = l->rbuf + MP_WIRE_HDR_SIZE;
	enum mp_wire_reject why = MP_REJ_NONE;
	struct hs s = {.nonce_d = l->nonce_d, .nonce_a = pl, .dialer = ctx->self_id,
		       .acceptor = p->id, .idx = (uint32_t)idx,
		       .set = pl + MP_CHALLENGE_FIXED};
	struct mp_settings theirs;
	uint8_t mac[MP_MAC_BYTES];
	char differ[160];
	struct mp_wire_hdr h;
	struct mp_iov iov;
	char name[24];
	int rc, bad;

	id_str(ctx, p->id, name);
	if (mp_wire_decode(l->rbuf, len, ctx->run_id, mp_codec_count(), &h, &why) == 0 &&
	    (h.type != MP_MSG_CHALLENGE || h.token || h.offset != p->id ||
	     h.sender != (uint32_t)p->id || h.aux != (uint32_t)idx ||
	     h.length < MP_CHALLENGE_FIXED ||
	     h.length != MP_CHALLENGE_FIXED + (s.set_len = mp_le_get16(pl + MP_NONCE_BYTES + MP_MAC_BYTES)) ||
	     mp_settings_decode(s.set, s.set_len, &theirs)))
		why = MP_REJ_UNEXPECTED;
	if (why) {
		count_reject(ctx, why);
		MP_WARN("peer %s (%s) connection %d: refused its answer to our HELLO: %s", name,
			p->addr, idx, mp_wire_reject_name(why));
		return -EPROTO;
	}
	memcpy(mac, pl + MP_NONCE_BYTES, sizeof(mac));
	if (hs_mac(ctx, MP_AUTH_CHALLENGE, &s, mac, 1)) {
		count_reject(ctx, MP_REJ_AUTH);
		/* Retried every RETRY_NS: say so at powers of two, not each time. */
		l->auth_fails++;
		if (!(l->auth_fails & (l->auth_fails - 1)))
			MP_WARN("peer %s (%s) failed authentication (wrong run key?): its CHALLENGE "
				"on connection %d has a wrong MAC (%u in a row)", name, p->addr, idx,
				l->auth_fails);
		return -EACCES;
	}
	uint32_t remote_round = h.round, remote_down = h.group_id;
	if (remote_round > ctx->seen_round)
		ctx->seen_round = remote_round;
	/* The acceptor's settings are its word now: compare. Our AUTH goes
	 * out either way (its MAC covers our settings as the HELLO gave
	 * them), so that the acceptor refuses on its side too, and says why. */
	bad = mp_settings_diff(&ctx->settings, &theirs, differ, sizeof(differ));
	s.set = l->sset;
	s.set_len = l->sset_len;
	hs_mac(ctx, MP_AUTH_RESPONSE, &s, mac, 0);
	l->token = hs_token(ctx, &s);
	h = hs_header(ctx, MP_MSG_AUTH, (uint32_t)idx, MP_MAC_BYTES);
	memcpy(l->sbuf + MP_WIRE_HDR_SIZE, mac, sizeof(mac));
	mp_wire_encode(&h, l->sbuf, l->sbuf + MP_WIRE_HDR_SIZE);
	iov.base = l->sbuf;
	iov.len = MP_AUTH_LEN;
	rc = ctx->ops->isend(l->conn, &iov, 1, NULL, &l->sreq);
	if (rc)
		return rc;
	l->auth_fails = 0;
	/* Dialled to CHALLENGE: the connect and HELLO's round trips, the
	 * peer's answer included (mp_peers_info reports it). */
	mp_peer_rtt(ctx, peer, mp_now_ns() - l->since_ns);
	if (bad) {
		settings_refused(ctx, l, name, p->addr, differ);
		l->token = 0;
		l->refusing = 1;
		return -EBADE;
	}
	l->ready = 1;
	l->settings_bad = 0;
	l->settings_fails = 0;
	if (idx == ctx->nconn) {
		/* A probe: the peer holds the key and answers; closed once the
		 * AUTH is out (mp_conn_poll). An answer to a query says in its
		 * group id whether the peer has us down. */
		if (l->probe_kind == MP_PROBE_QUERY && remote_down)
			ctx->seen_down = 1;
		/* Not down for it any more: it took us back after its ALIVE
		 * probe, whose round no longer says where it leaves us out. */
		if (l->probe_kind == MP_PROBE_QUERY && !remote_down)
			p->downs_us_from = 0;
		MP_TRACE("probe of peer %s (%s) answered: its averages start at round %u", name,
			 p->addr, remote_round);
		mp_peer_probe_done(ctx, peer, l->probe_kind, 0, remote_round, remote_down);
		return 0;
	}
	MP_INFO("connected to peer %s (%s) connection %d", name, p->addr, idx);
	return 0;
}

/* Move the dialer's handshake of (@peer, @idx) on. A failure closes the
 * connection, schedules the next dial and is kept for mp_conn_get to report. */
static void handshake(struct mp_ctx *ctx, int peer, int idx)
{
	struct mp_peer *p = &ctx->peers[peer];
	struct mp_link *l = link_get(ctx, peer, idx);
	size_t len = 0;
	int rc, done = 0;
	char name[24];

	if (l->refusing) {
		/* Our AUTH of a refused handshake: once it is out (or the
		 * connect timeout passed), close, and dial again later. */
		if (l->sreq) {
			ctx->ops->test(l->sreq, &done, NULL);
			if (!done && mp_now_ns() - l->since_ns <=
					     (uint64_t)ctx->cfg.connect_timeout_ms * 1000000ull)
				return;
			if (done)
				l->sreq = NULL;
		}
		l->refusing = 0;
		mp_conn_drop(ctx, peer, idx);
		l->retry_at_ns = mp_now_ns() + SETTINGS_RETRY_NS;
		l->err = -EBADE;
		return;
	}
	/* The CHALLENGE is taken only once our HELLO is out, so that one send
	 * request serves the HELLO and then the AUTH. */
	if (l->sreq) {
		rc = ctx->ops->test(l->sreq, &done, NULL);
		if (!done)
			goto wait;
		l->sreq = NULL;
		if (rc)
			goto failed;
	}
	rc = ctx->ops->test(l->rreq, &done, &len);
	if (!done)
		goto wait;
	l->rreq = NULL;
	if (rc == -EMSGSIZE) {
		count_reject(ctx, MP_REJ_LENGTH);
		MP_WARN("peer %s (%s) connection %d: its answer to our HELLO is too long",
			id_str(ctx, p->id, name), p->addr, idx);
		rc = -EPROTO;
	} else if (!rc) {
		rc = challenge_arrived(ctx, peer, idx, len);
		if (!rc)
			return;
		if (rc == -EBADE) {
			/* Refused for settings; the connection lives until our AUTH is out. */
			l->err = rc;
			return;
		}
	} else {
		/* Refused or reset while connecting: in a static run the peer may
		 * not listen yet. A dht peer publishes its record only once it
		 * listens, so there a refusal means the process is gone: a
		 * SIGKILLed peer's record outlives it by up to its TTL, and
		 * rounds would wait for it that long. */
		MP_TRACE("connect to peer %s (%s) failed: %s; retrying", id_str(ctx, p->id, name),
			 p->addr, mp_strerror(rc));
		if (ctx->dynamic && rc == -ECONNREFUSED)
			mp_peer_suspect(ctx, peer, "refuses connections");
	}
	goto failed;
wait:
	if (mp_now_ns() - l->since_ns <= (uint64_t)ctx->cfg.connect_timeout_ms * 1000000ull)
		return;
	MP_INFO("peer %s (%s) connection %d: no answer to our HELLO within %d ms; retrying",
		id_str(ctx, p->id, name), p->addr, idx, ctx->cfg.connect_timeout_ms);
	rc = -ETIMEDOUT;
failed:
	mp_conn_drop(ctx, peer, idx);
	l->retry_at_ns = mp_now_ns() + RETRY_NS;
	l->err = rc;
	if (idx == ctx->nconn) {
		/* A probe is not retried here: peers.c schedules the next. */
		l->err = 0;
		mp_peer_probe_done(ctx, peer, l->probe_kind, rc, 0, 0);
	}
}

struct mp_drv_conn *mp_conn_get(struct mp_ctx *ctx, int peer, int idx, int *err)
{
	struct mp_peer *p = &ctx->peers[peer];
	struct mp_link *l = link_make(ctx, peer, idx);
	uint64_t now;
	int rc, done = 0;

	*err = 0;
	if (!l) {
		*err = -ENOMEM;
		return NULL;
	}
	if (l->conn && l->ready) {
		if (!l->sreq)
			return l->conn;
		/* Our AUTH: once it is out, nothing of the handshake is in flight. */
		rc = ctx->ops->test(l->sreq, &done, NULL);
		if (!done)
			return l->conn;
		l->sreq = NULL;
		if (!rc)
			return l->conn;
		mp_conn_drop(ctx, peer, idx);
		l->retry_at_ns = mp_now_ns() + RETRY_NS;
		*err = rc;
		return NULL;
	}
	if (p->gone) {
		*err = -ENOTCONN;
		return NULL;
	}
	rc = we_dial(ctx, p);
	if (rc <= 0) {
		/* 0: the other side dials, and mp_conn_poll adopts it; unless its
		 * settings differ from ours, which its next try will not change. */
		*err = rc ? rc : l->settings_bad ? -EBADE : 0;
		return NULL;
	}
	now = mp_now_ns();
	if (l->conn) {
		handshake(ctx, peer, idx);
	} else if (now >= l->retry_at_ns && p->blob_len) {
		/* (Without an address, not learned yet, wait for one.) */
		rc = dial(ctx, peer, idx);
		if (rc) {
			l->retry_at_ns = now + RETRY_NS;
			l->err = rc;
		}
	}
	/* The last failure, reported once (mp_conn_poll may have met it); a
	 * difference in settings for as long as it lasts. */
	*err = l->err;
	l->err = 0;
	if (l->conn && l->ready)
		return l->conn;
	if (l->settings_bad)
		*err = -EBADE;
	return NULL;
}

/* ---- acceptor side ----------------------------------------------------- */

/* @pd's connection leaves the handshake (closed, or adopted as a peer's). */
static void pend_done(struct mp_ctx *ctx, struct mp_pending *pd)
{
	if (pd->conn)
		MP_STAT_ADD(ctx->cstats.pending, (uint64_t)-1);
}

static void pend_close(struct mp_ctx *ctx, struct mp_pending *pd)
{
	pend_done(ctx, pd);
	ctx->ops->close(pd->conn);
	mp_reap(ctx, pd->req);
	mp_reap(ctx, pd->sreq);
	pd->conn = NULL;
	pd->req = pd->sreq = NULL;
}

static void reject(struct mp_ctx *ctx, struct mp_pending *pd, enum mp_wire_reject why,
		   const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void pend_broken(struct mp_ctx *ctx, struct mp_pending *pd, int rc);

static void reject(struct mp_ctx *ctx, struct mp_pending *pd, enum mp_wire_reject why,
		   const char *fmt, ...)
{
	char detail[160];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(detail, sizeof(detail), fmt, ap);
	va_end(ap);
	count_reject(ctx, why);
	MP_STAT_ADD(ctx->cstats.refused, 1);
	MP_WARN("rejected an incoming connection: %s (%s)", mp_wire_reject_name(why), detail);
	pend_close(ctx, pd);
}

/* Checks of a HELLO's payload and claims; on success fills @pd. */
static int hello_payload(struct mp_ctx *ctx, struct mp_pending *pd, const struct mp_wire_hdr *h)
{
	const uint8_t *pl = pd->buf + MP_WIRE_HDR_SIZE;
	size_t slen = h->length >= MP_HELLO_FIXED ? mp_le_get16(pl + MP_NONCE_BYTES + 9) : 0;
	const char *addr = (const char *)pl + MP_HELLO_FIXED + slen;
	struct mp_settings theirs;
	uint64_t bits;
	char name[24];
	int known;

	if (h->length < MP_HELLO_FIXED + 1 || slen > MP_SETTINGS_MAX ||
	    h->length < MP_HELLO_FIXED + slen + 1 ||
	    memchr(addr, 0, h->length - MP_HELLO_FIXED - slen) !=
		    addr + h->length - MP_HELLO_FIXED - slen - 1 ||
	    mp_settings_decode(pl + MP_HELLO_FIXED, slen, &theirs) ||
	    pl[MP_NONCE_BYTES] > MP_MODE_AUX || h->sender != (uint32_t)h->offset) {
		reject(ctx, pd, MP_REJ_UNEXPECTED, "malformed HELLO");
		return -EPROTO;
	}
	/* Unproven until the AUTH: judged then, so that a stranger's HELLO
	 * cannot make us refuse a peer. */
	memcpy(pd->dset, pl + MP_HELLO_FIXED, slen);
	pd->dset_len = slen;
	if (!mp_settings_diff(&ctx->settings, &theirs, pd->differ, sizeof(pd->differ)))
		pd->differ[0] = 0;
	pd->id = h->offset;
	pd->idx = h->aux;
	pd->mode = pl[MP_NONCE_BYTES];
	bits = mp_le_get64(pl + MP_NONCE_BYTES + 1);
	memcpy(&pd->bandwidth, &bits, sizeof(bits));
	memcpy(pd->nonce_d, pl, MP_NONCE_BYTES);
	strcpy(pd->addr, addr);
	id_str(ctx, pd->id, name);
	/* The probe index (nconn) is a static run's: either side dials it. */
	int probe = !ctx->dynamic && pd->idx == (uint32_t)ctx->nconn;
	pd->probe_kind = probe ? (int)h->group_id : 0;
	pd->round = h->round;
	/* Decided now, as our CHALLENGE tells our round: an announce for a
	 * round our averages have reached is too late (the peer sees it in
	 * the CHALLENGE and announces a later one). */
	pd->late = (pd->probe_kind == MP_PROBE_ANNOUNCE || pd->probe_kind == MP_PROBE_RETURN) &&
		   pd->round <= ctx->avg_round;
	if (!isfinite(pd->bandwidth) || (pd->idx >= (uint32_t)ctx->nconn && !probe) ||
	    pd->id == ctx->self_id) {
		reject(ctx, pd, MP_REJ_UNEXPECTED, "HELLO from peer %s: bad bandwidth, connection "
		       "index %u or our own id", name, pd->idx);
		return -EPROTO;
	}
	if (ctx->mode == MP_MODE_CLIENT ||
	    (!probe && pd->mode != MP_MODE_CLIENT && pd->id > ctx->self_id)) {
		reject(ctx, pd, MP_REJ_UNEXPECTED, "peer %s dialled, but %s", name,
		       ctx->mode == MP_MODE_CLIENT ? "a client accepts no connections"
						   : "the lower id dials");
		return -EPROTO;
	}
	/* (A peer count that differs is a difference in settings, named at
	 * the AUTH; a rank beyond ours cannot be placed at all.) */
	if (ctx->dynamic ? h->count != 0 : pd->id >= (uint64_t)ctx->npeers) {
		reject(ctx, pd, MP_REJ_UNEXPECTED, "HELLO from an unknown rank %s (%u peers)",
		       name, h->count);
		return -EPROTO;
	}
	known = mp_peer_find(ctx, pd->id);
	if (known >= 0 && ctx->peers[known].gone) {
		reject(ctx, pd, MP_REJ_UNEXPECTED, "peer %s has left the run", name);
		return -EPROTO;
	}
	if (ctx->dynamic && *addr) {
		uint8_t blob[MP_DRV_ADDR_MAX];
		size_t blen = sizeof(blob);
		if (ctx->ops->addr_parse(ctx->drv, addr, blob, &blen)) {
			reject(ctx, pd, MP_REJ_UNEXPECTED, "peer %s gives an unusable address", name);
			return -EPROTO;
		}
	}
	return 0;
}

/* A HELLO arrived on a pending connection: check it and send the CHALLENGE. */
static void hello_arrived(struct mp_ctx *ctx, struct mp_pending *pd, size_t len)
{
	uint8_t *out = pd->buf + MP_HELLO_MAX;
	enum mp_wire_reject why = MP_REJ_NONE;
	struct mp_wire_hdr h;
	struct mp_iov iov;
	struct hs s;
	int rc;

	rc = mp_wire_decode(pd->buf, len, ctx->run_id, mp_codec_count(), &h, &why);
	if (rc) {
		reject(ctx, pd, why, "bad HELLO");
		return;
	}
	/* (The codec is one of the settings, compared with the others.) */
	if (h.type != MP_MSG_HELLO || h.token) {
		reject(ctx, pd, MP_REJ_UNEXPECTED, "first message is not a HELLO");
		return;
	}
	if (hello_payload(ctx, pd, &h))
		return;
	mp_auth_random(pd->nonce_a, sizeof(pd->nonce_a));
	/* Our settings go with the CHALLENGE even when the dialer's differ:
	 * the dialer then refuses on its side too, naming the field. */
	uint8_t *set = out + MP_WIRE_HDR_SIZE + MP_CHALLENGE_FIXED;
	size_t slen = mp_settings_encode(&ctx->settings, set);
	s = (struct hs){.nonce_d = pd->nonce_d, .nonce_a = pd->nonce_a, .dialer = pd->id,
			.acceptor = ctx->self_id, .idx = pd->idx, .set = set, .set_len = slen};
	h = hs_header(ctx, MP_MSG_CHALLENGE, pd->idx, (uint32_t)(MP_CHALLENGE_FIXED + slen));
	if (pd->probe_kind == MP_PROBE_QUERY) {
		/* Tell a peer that asks where the run is whether we have it
		 * down: only then was it left behind (restarted, or late past
		 * our timeouts); a peer behind our round but not down is merely
		 * slower to start, and the run waits for it. */
		int q = mp_peer_find(ctx, pd->id);
		h.group_id = q >= 0 && mp_peer_is_down(ctx, q);
	} else if (pd->probe_kind == MP_PROBE_ALIVE) {
		/* A peer that averages and has peers down answers that it will
		 * name the round of its return to every peer (probe.c): the
		 * prober waits for it rather than take it back at a round of
		 * its own, while we take ours back at another. */
		h.group_id = ctx->synced && ctx->ndown > 0;
	}
	memcpy(out + MP_WIRE_HDR_SIZE, pd->nonce_a, MP_NONCE_BYTES);
	hs_mac(ctx, MP_AUTH_CHALLENGE, &s, out + MP_WIRE_HDR_SIZE + MP_NONCE_BYTES, 0);
	mp_le_put16(out + MP_WIRE_HDR_SIZE + MP_NONCE_BYTES + MP_MAC_BYTES, (uint16_t)slen);
	mp_wire_encode(&h, out, out + MP_WIRE_HDR_SIZE);
	iov.base = out;
	iov.len = MP_WIRE_HDR_SIZE + h.length;
	rc = ctx->ops->irecv(pd->conn, pd->buf, MP_AUTH_LEN, NULL, &pd->req);
	if (!rc)
		rc = ctx->ops->isend(pd->conn, &iov, 1, NULL, &pd->sreq);
	if (rc) {
		pend_broken(ctx, pd, rc);
		return;
	}
	pd->got_hello = 1;
	pd->chal_ns = mp_now_ns();
}

/* The AUTH arrived: verify it, then learn the peer and adopt the connection. */
static void auth_arrived(struct mp_ctx *ctx, struct mp_pending *pd, size_t len)
{
	enum mp_wire_reject why = MP_REJ_NONE;
	struct hs s = {.nonce_d = pd->nonce_d, .nonce_a = pd->nonce_a, .dialer = pd->id,
		       .acceptor = ctx->self_id, .idx = pd->idx, .set = pd->dset,
		       .set_len = pd->dset_len};
	struct mp_wire_hdr h;
	struct mp_peer *p;
	struct mp_link *l;
	char name[24];
	int peer;

	id_str(ctx, pd->id, name);
	if (mp_wire_decode(pd->buf, len, ctx->run_id, mp_codec_count(), &h, &why)) {
		reject(ctx, pd, why, "bad AUTH from peer %s", name);
		return;
	}
	if (h.type != MP_MSG_AUTH || h.token || h.offset != pd->id || h.aux != pd->idx ||
	    h.length != MP_MAC_BYTES) {
		reject(ctx, pd, MP_REJ_UNEXPECTED, "peer %s did not answer the CHALLENGE with AUTH",
		       name);
		return;
	}
	if (hs_mac(ctx, MP_AUTH_RESPONSE, &s, pd->buf + MP_WIRE_HDR_SIZE, 1)) {
		/* A static run knows where its ranks are; a dht dialer says so itself. */
		reject(ctx, pd, MP_REJ_AUTH, "peer %s (%s) failed authentication (wrong run key?)",
		       name, ctx->dynamic ? pd->addr : ctx->peers[pd->id].addr);
		return;
	}
	MP_STAT_ADD(ctx->cstats.authenticated, 1);
	/* The dialer answered, so our CHALLENGE is out. */
	mp_reap(ctx, pd->sreq);
	pd->sreq = NULL;
	if (pd->differ[0]) {
		/* Its settings, now proven its own, differ: refused. A dht peer is
		 * not learned for it; a known one's slot remembers the refusal. */
		peer = ctx->dynamic ? mp_peer_find(ctx, pd->id) : (int)pd->id;
		l = peer >= 0 ? link_make(ctx, peer, (int)pd->idx) : NULL;
		if (l) {
			settings_refused(ctx, l, name, ctx->dynamic ? pd->addr : ctx->peers[peer].addr,
					 pd->differ);
		} else {
			MP_STAT_ADD(ctx->rejected[MP_REJ_SETTINGS], 1);
			MP_WARN("peer %s (%s): %s (refused)", name, pd->addr, pd->differ);
		}
		pend_close(ctx, pd);
		return;
	}
	if (ctx->dynamic) {
		peer = mp_peer_learn(ctx, pd->id, pd->addr, pd->bandwidth, pd->mode);
	} else {
		peer = (int)pd->id;
		/* A static run's table does not know who is a client until it dials. */
		ctx->peers[peer].mode = pd->mode;
	}
	if (peer < 0 || ctx->peers[peer].gone) {
		MP_WARN("peer %s authenticated, but cannot be added: %s", name,
			peer < 0 ? mp_strerror(peer) : "it has left the run");
		pend_close(ctx, pd);
		return;
	}
	/* Where its averages are; an announce's round is one they have
	 * not reached. */
	if (pd->round > ctx->seen_round && pd->probe_kind != MP_PROBE_ANNOUNCE &&
	    pd->probe_kind != MP_PROBE_RETURN)
		ctx->seen_round = pd->round;
	/* An ALIVE probe comes only from a peer that has us down: if we have
	 * not averaged yet, we were left behind (restarted); if we have, our
	 * next average names the round of our return (as our CHALLENGE said). */
	if (pd->idx == (uint32_t)ctx->nconn && pd->probe_kind == MP_PROBE_ALIVE) {
		ctx->seen_down = 1;
		ctx->returning |= ctx->synced;
		ctx->peers[peer].downs_us_from = pd->round + 1;
	}
	if (pd->idx == (uint32_t)ctx->nconn) {
		/* A probe: it only tells us that the peer is alive, where its
		 * averages are, and (an announce) when it rejoins. */
		if (pd->probe_kind == MP_PROBE_ANNOUNCE && !pd->late) {
			/* A restarted process: our connections of its old one are dead. */
			for (int i = 0; i < ctx->nconn; i++)
				mp_conn_drop(ctx, peer, i);
			mp_peer_probed_by(ctx, peer, pd->probe_kind, pd->round);
		} else if (pd->probe_kind == MP_PROBE_RETURN && !pd->late) {
			mp_peer_probed_by(ctx, peer, pd->probe_kind, pd->round);
		}
		pend_close(ctx, pd);
		return;
	}
	p = &ctx->peers[peer];
	l = link_make(ctx, peer, (int)pd->idx);
	if (!l) {
		MP_WARN("peer %s authenticated, but no memory for its connection", name);
		pend_close(ctx, pd);
		return;
	}
	if (l->conn) {
		/* The peer reconnected (it lost the old connection first), or, a
		 * client, overtook our own dial. */
		MP_INFO("peer %s connection %u reconnected", name, pd->idx);
		mp_conn_drop(ctx, peer, (int)pd->idx);
	}
	pend_done(ctx, pd);
	l->conn = pd->conn;
	l->ready = 1;
	l->settings_bad = 0;
	l->settings_fails = 0;
	l->token = hs_token(ctx, &s);
	pd->conn = NULL;
	mp_peer_rtt(ctx, peer, mp_now_ns() - pd->chal_ns);
	MP_INFO("accepted peer %s (%s) connection %u", name, p->addr, pd->idx);
}

/* A stranger's connections cost a log line at the first of each kind and
 * then at powers of two, not one per connection of a flood. */
static void hs_note(struct mp_ctx *ctx, const uint64_t *count, const char *what,
		    const char *why)
{
	uint64_t n = *count;

	(void)ctx;
	if (n & (n - 1))
		return;
	MP_WARN("closed an incoming connection before it authenticated: %s (%s); %llu so far",
		what, why, (unsigned long long)n);
}

/*
 * Posting a receive or a send on a connection in its handshake failed: the
 * other side reset it (a replayer that gave up, a scanner), or the driver
 * had no memory. It ends as hung up, the counter of connections that broke
 * before authenticating, so that every accepted connection ends under one.
 */
static void pend_broken(struct mp_ctx *ctx, struct mp_pending *pd, int rc)
{
	MP_STAT_ADD(ctx->cstats.hung_up, 1);
	hs_note(ctx, &ctx->cstats.hung_up, "hung up", mp_strerror(rc));
	pend_close(ctx, pd);
}

/*
 * max_handshakes connections are in their handshake and one more came:
 * close the oldest that has not sent a whole HELLO (held open, or fed a
 * byte at a time: a run's own peers send theirs at once), else the oldest
 * of all. A peer's dial that is closed this way is retried like any other.
 */
static void pend_evict(struct mp_ctx *ctx)
{
	struct mp_pending *victim = NULL;

	for (int i = 0; i < ctx->npend; i++) {
		struct mp_pending *pd = &ctx->pend[i];

		if (!pd->conn)
			continue;
		if (!victim || (victim->got_hello && !pd->got_hello) ||
		    (victim->got_hello == pd->got_hello && pd->since_ns < victim->since_ns))
			victim = pd;
	}
	if (!victim)
		return;
	MP_STAT_ADD(ctx->cstats.evicted, 1);
	hs_note(ctx, &ctx->cstats.evicted, "evicted",
		victim->got_hello ? "MP_MAX_HANDSHAKES reached; it sent no AUTH yet"
				  : "MP_MAX_HANDSHAKES reached; it sent no whole HELLO");
	pend_close(ctx, victim);
}

/* A free pending slot with its buffer, or NULL (no memory). */
static struct mp_pending *pend_slot(struct mp_ctx *ctx)
{
	struct mp_pending *pd = NULL;
	uint8_t *buf;

	for (int i = 0; i < ctx->npend && !pd; i++)
		if (!ctx->pend[i].conn)
			pd = &ctx->pend[i];
	if (!pd) {
		if (ctx->npend == ctx->pend_cap) {
			int nc = ctx->pend_cap ? ctx->pend_cap * 2 : 16;
			struct mp_pending *np = realloc(ctx->pend, (size_t)nc * sizeof(*np));
			if (!np)
				return NULL;
			ctx->pend = np;
			ctx->pend_cap = nc;
		}
		pd = &ctx->pend[ctx->npend++];
		pd->buf = NULL;
	}
	if (!pd->buf && !(pd->buf = malloc(MP_HELLO_MAX + MP_CHALLENGE_LEN)))
		return NULL;
	buf = pd->buf;
	memset(pd, 0, sizeof(*pd));
	pd->buf = buf;
	return pd;
}

void mp_conn_poll(struct mp_ctx *ctx)
{
	const uint64_t conn_to = (uint64_t)ctx->cfg.connect_timeout_ms * 1000000ull;
	struct mp_drv_conn *c;
	uint64_t now;
	int rc;

	/* Our own dials move on here as well, not only when an exchange asks
	 * for them: a peer held up in an early round (by a dead groupmate,
	 * say) has then finished connecting to the groupmates of its later
	 * rounds, who would otherwise give up on it at their connect timeout. */
	for (int i = 0; i < ctx->npeers && i < ctx->nlinks; i++)
		for (int k = 0; k <= ctx->nconn && ctx->links[i]; k++) {
			struct mp_link *l = &ctx->links[i][k];
			int done = 0;

			if (l->conn && !l->ready)
				handshake(ctx, i, k);
			else if (k == ctx->nconn && l->conn &&
				 (!l->sreq || (ctx->ops->test(l->sreq, &done, NULL), done))) {
				/* A probe whose AUTH is out has done its work. */
				l->sreq = NULL;
				mp_conn_drop(ctx, i, k);
			}
		}
	if (!ctx->listener)
		return;
	while ((rc = ctx->ops->accept(ctx->listener, &c)) == 0) {
		struct mp_pending *pd;

		MP_STAT_ADD(ctx->cstats.accepted, 1);
		if (__atomic_load_n(&ctx->cstats.pending, __ATOMIC_RELAXED) >=
		    (uint64_t)ctx->cfg.max_handshakes)
			pend_evict(ctx);
		pd = pend_slot(ctx);
		if (!pd) {
			/* No memory for its handshake: counted with the broken ones,
			 * so that every accepted connection ends under a counter. */
			MP_STAT_ADD(ctx->cstats.hung_up, 1);
			hs_note(ctx, &ctx->cstats.hung_up, "hung up", "no memory for its handshake");
			ctx->ops->close(c);
			continue;
		}
		pd->conn = c;
		pd->since_ns = mp_now_ns();
		MP_STAT_ADD(ctx->cstats.pending, 1);
		if (ctx->cstats.pending > ctx->cstats.pending_max)
			__atomic_store_n(&ctx->cstats.pending_max, ctx->cstats.pending,
					 __ATOMIC_RELAXED);
		rc = ctx->ops->irecv(c, pd->buf, MP_HELLO_MAX, NULL, &pd->req);
		if (rc)
			pend_broken(ctx, pd, rc);
	}
	now = mp_now_ns();
	for (int i = 0; i < ctx->npend; i++) {
		struct mp_pending *pd = &ctx->pend[i];
		size_t len = 0;
		int done = 0;
		char name[24];

		if (!pd->conn)
			continue;
		rc = ctx->ops->test(pd->req, &done, &len);
		if (!done) {
			/* Someone connected and went quiet, or trickles: do not
			 * hold the slot past the connect timeout. */
			if (now - pd->since_ns > conn_to) {
				MP_STAT_ADD(ctx->cstats.timed_out, 1);
				count_reject(ctx, MP_REJ_TRUNCATED);
				hs_note(ctx, &ctx->cstats.timed_out, "timed out",
					pd->got_hello ? "no AUTH" : "no whole HELLO");
				pend_close(ctx, pd);
			}
			continue;
		}
		pd->req = NULL;
		if (rc == -EMSGSIZE) {
			reject(ctx, pd, MP_REJ_LENGTH, "%s",
			       pd->got_hello ? "AUTH too long" : "first message too long for a HELLO");
		} else if (rc) {
			/* A dialer that refuses our CHALLENGE (it lacks the run key)
			 * hangs up here; so does one that timed out or left. Either
			 * way it sent nothing wrong, and it counts itself. */
			if (pd->got_hello)
				MP_INFO("peer %s hung up during the handshake: %s",
					id_str(ctx, pd->id, name), mp_strerror(rc));
			MP_STAT_ADD(ctx->cstats.hung_up, 1);
			pend_close(ctx, pd);
		} else if (pd->got_hello) {
			auth_arrived(ctx, pd, len);
		} else {
			hello_arrived(ctx, pd, len);
		}
	}
}

void mp_conn_close_all(struct mp_ctx *ctx)
{
	for (int i = 0; i < ctx->npend; i++) {
		if (ctx->pend[i].conn)
			pend_close(ctx, &ctx->pend[i]);
		free(ctx->pend[i].buf);
		ctx->pend[i].buf = NULL;
	}
	for (int p = 0; p < ctx->nlinks; p++)
		for (int s = 0; s <= ctx->nconn; s++)
			mp_conn_drop(ctx, p, s);
}

int mp_conn_probe(struct mp_ctx *ctx, int peer, int kind, uint32_t round)
{
	struct mp_link *l = link_make(ctx, peer, ctx->nconn);
	int rc;

	if (!l)
		return -ENOMEM;
	if (l->conn)
		return -EBUSY;
	if (!ctx->peers[peer].blob_len || ctx->peers[peer].gone || peer == ctx->rank)
		return -ENOTCONN;
	l->probe_kind = kind;
	l->probe_round = round;
	rc = dial(ctx, peer, ctx->nconn);
	if (rc)
		mp_peer_probe_done(ctx, peer, kind, rc, 0, 0);
	return rc;
}

int mp_conn_probing(const struct mp_ctx *ctx, int peer)
{
	return mp_conn_open(ctx, peer, ctx->nconn);
}

int mp_conn_handshaking(const struct mp_ctx *ctx)
{
	if (__atomic_load_n(&ctx->cstats.pending, __ATOMIC_RELAXED))
		return 1;
	for (int i = 0; i < ctx->npeers && i < ctx->nlinks; i++)
		for (int k = 0; k <= ctx->nconn && ctx->links[i]; k++)
			if (ctx->links[i][k].conn && !ctx->links[i][k].ready)
				return 1;
	return 0;
}

void mp_conn_fini(struct mp_ctx *ctx)
{
	mp_conn_close_all(ctx);
	for (int p = 0; p < ctx->nlinks; p++)
		free(ctx->links[p]);
	__atomic_store_n(&ctx->cstats.peers_held, 0, __ATOMIC_RELAXED);
	free(ctx->links);
	ctx->links = NULL;
	ctx->nlinks = 0;
	free(ctx->pend);
	ctx->pend = NULL;
	ctx->npend = ctx->pend_cap = 0;
}
