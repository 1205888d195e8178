/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The clear-to-send protocol over an RDMA provider (prov.h), written once
 * (doc/protocol.md, "RDMA: clear to send"). Each provider makes a transport
 * of it with a driver table of its own (rdma.h: MP_RDMA_DRIVER_OPS, and an
 * init that hands mp_rdma_init its provider table): verbs, ofi, a test's
 * fake. Nothing here names them.
 *
 * Set-up: listen opens a TCP side channel; its "host:port" is the address.
 * connect dials it and both sides swap a hello { magic, version, provider
 * name, CTS ring address and key, endpoint blob }; the acceptor connects its
 * endpoint before answering, the connector connects its own and sends a
 * 4-byte ack, so neither side writes before the other can take it. The
 * socket then stays open only to notice a peer that goes away.
 *
 * Data: the receiver turns irecv into a clear-to-send record { address,
 * key, capacity, sequence } that it writes (inline, with an immediate) into
 * ring slot sequence % RDMA_QDEPTH in the sender's memory. The sender
 * matches records to its posted sends in order and moves each message with
 * RDMA WRITEs straight into the posted buffer; the last write carries the
 * immediate that completes the receive. The immediate holds the message
 * length (prov.h does not promise the length of a write at the target:
 * libfabric reports 0), so messages stop at RDMA_MAX_MSG. Which receive it
 * completes follows from the order: the provider delivers a connection's
 * immediates in posting order, and records are consumed in order.
 *
 * Immediate layout (32 bits):
 *   bit 31     1 = a clear-to-send record landed; bits 0..30 = its sequence
 *   bit 30     (data) the message did not fit: the receive fails -EMSGSIZE
 *   bits 0..29 (data) message length
 *
 * Memory: buffers inside a registration (reg_mr) are written directly; a
 * receive or a send piece outside every registration goes through a
 * registered bounce buffer (one copy, logged at TRACE), and small send
 * pieces go inline.
 *
 * Errors: a failed completion, an endpoint error or the side channel
 * closing fails the connection: its posted requests complete with the
 * error and the endpoint is destroyed so nothing more lands in their
 * buffers. close() completes them with -ECANCELED.
 *
 * Threading: one thread drives an instance; wake() may come from any.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif
#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <moshpit/driver_sdk.h>

#include "inet.h"
#include "rdma.h"
#include "sockconn.h"

#define RDMA_QDEPTH 64                 /* posted requests per direction; CTS ring slots */
#define RDMA_CTS_SIZE 32               /* bytes of one clear-to-send record */
#define RDMA_MAX_MSG (((size_t)1 << 30) - 1)
#define RDMA_SEG ((size_t)1 << 20)     /* largest single write */
#define RDMA_MAX_OUT 128               /* writes in flight per connection */
#define RDMA_SIGNAL_EVERY 32           /* unsignalled writes between signalled ones */
#define RDMA_REQ_BLOCK 64              /* requests allocated at once */
#define RDMA_EVENTS 64
#define RDMA_CQ_BATCH 32
#define RDMA_BACKLOG 1024
#define RDMA_DEFAULT_TIMEOUT_MS 10000  /* when the core gives no connect timeout */
#define RDMA_EOF_GRACE_MS 200          /* completions may trail the side channel's close */
#define RDMA_SPIN_NS 50000             /* progress polls this long before it sleeps */
#define RDMA_SLEEP_MAX_NS 1000000      /* longest sleep between polls of the CQ */
#define RDMA_BOUNCE_MIN 4096
#define RDMA_BOUNCE_CACHE ((size_t)64 << 20) /* bytes of idle bounce buffers kept */

#define RDMA_IMM_CTS (1u << 31)
#define RDMA_IMM_TOOBIG (1u << 30)
#define RDMA_IMM_LEN ((1u << 30) - 1)
#define RDMA_IMM_SEQ ((1u << 31) - 1)

#define RDMA_HELLO_MAGIC 0x3152504dU /* "MPR1" */
#define RDMA_ACK_MAGIC 0x4b41504dU   /* "MPAK" */
#define RDMA_VERSION 1
#define RDMA_PROV_NAME 16
/* magic, version, blob length, provider, ring address, ring key, blob */
#define RDMA_HELLO_LEN (4 + 2 + 2 + RDMA_PROV_NAME + 8 + 8 + MP_RDMA_EP_BLOB_MAX)
#define RDMA_ACK_LEN 4

_Static_assert(RDMA_MAX_MSG <= RDMA_IMM_LEN, "lengths must fit the immediate");

/* Side-channel address blob, as tcp's: family, zero, port (big-endian), ip. */
_Static_assert(sizeof(struct mp_inet_addr) <= MP_DRV_ADDR_MAX, "address blob too large");

struct rdma_drv;

/* A registered buffer for memory outside the caller's registrations. */
struct rdma_bounce {
	struct rdma_bounce *next;
	size_t cap;
	void *buf;
	struct mp_rdma_mr *mr;
};

/* One contiguous piece of an outgoing message. */
struct rdma_piece {
	const unsigned char *src;
	size_t len;
	struct mp_rdma_mr *mr; /* NULL: goes inline */
};

struct rdma_req {
	/* queue or free list; nbytes: send: message length, recv: received length */
	struct mp_reqq_req base;
	struct rdma_drv *drv;
	struct rdma_bounce *bounce;
	union {
		struct {
			struct rdma_piece piece[MP_DRV_IOV_MAX];
			int npieces;
			int cur;          /* piece being written */
			size_t off;       /* bytes of it written */
			size_t moff;      /* bytes of the message written */
			int matched;      /* has a clear-to-send record */
			int toobig;
			uint64_t raddr;
			uint64_t rkey;
			uint32_t last_wr; /* write count after its last write */
		} s;
		struct {
			unsigned char *buf;
			size_t cap;
			struct mp_rdma_mr *mr; /* where the data lands: the caller's or the bounce's */
			void *target;
		} r;
	};
};

/* Handshake steps; see the file comment. */
enum rdma_hs {
	RDMA_HS_TCP,       /* connector: TCP connect in progress */
	RDMA_HS_C_HELLO,   /* connector: hello out, waiting for the acceptor's */
	RDMA_HS_C_ACK,     /* connector: sending the ack */
	RDMA_HS_A_HELLO,   /* acceptor: waiting for the connector's hello */
	RDMA_HS_A_ACK,     /* acceptor: hello out, waiting for the ack */
	RDMA_HS_DONE,
};

enum rdma_conn_state {
	RDMA_CONNECTING,
	RDMA_OPEN,
	RDMA_FAILED,
};

struct rdma_listener;

struct rdma_conn {
	/* side channel: socket, epoll interest, peer name; on d->sp.conns until freed */
	struct mp_sock_conn sk;
	struct rdma_drv *drv;
	struct rdma_listener *lis;     /* acceptor side, until accepted */
	struct mp_reqq_link llink;     /* listener's ready list */
	uint32_t id;                   /* names the connection in write ids */
	enum rdma_conn_state state;
	enum rdma_hs hs;
	int err;
	int64_t deadline;              /* handshake deadline, or end of the EOF grace; 0 = none */
	unsigned char out[RDMA_HELLO_LEN];
	size_t out_len, out_off;
	unsigned char in[RDMA_HELLO_LEN];
	size_t in_len, in_got;
	struct mp_rdma_ep *ep;
	int ep_ready;                  /* connected: the peer may write to us */
	/* ring[RDMA_QDEPTH] records written by the peer, then our outgoing records */
	unsigned char *ring;
	struct mp_rdma_mr *ring_mr;
	uint64_t peer_ring;
	uint64_t peer_ring_key;
	struct mp_reqq sq;             /* sends not fully posted */
	struct mp_reqq sfly;           /* sends posted, waiting for their last write */
	struct mp_reqq rq;             /* receives without a clear-to-send record out */
	struct mp_reqq rcts;           /* receives waiting for their data */
	uint32_t cts_sent;             /* records we wrote to the peer */
	uint32_t cts_seen;             /* records the peer wrote to us */
	uint32_t cts_used;             /* of those, matched to sends */
	uint32_t wr_posted;            /* writes posted */
	uint32_t wr_done;              /* writes known complete */
	uint32_t unsignalled;
	int stalled;                   /* the provider said -EAGAIN: pump again on progress */
};

struct rdma_listener {
	struct mp_sock_listener sk;    /* on d->sp.listeners */
	struct rdma_drv *drv;
	struct mp_reqq ready;          /* connections set up, waiting for accept */
};

/* What the core sees as a registration. */
struct rdma_mr {
	struct rdma_mr *prev, *next;
	struct mp_rdma_mr *m;
};

struct rdma_drv {
	struct mp_drv base;
	const struct mp_rdma_prov_ops *po;
	struct mp_rdma_prov *pv;
	const char *tname;             /* transport name for logs */
	uint32_t caps_extra;
	struct mp_sock_poll sp;        /* side-channel sockets and wake() */
	int rank;
	int timeout_ms;
	size_t max_inline;
	uint32_t next_id;
	struct rdma_conn *hit;         /* last connection a completion named */
	struct rdma_mr *mrs;
	struct rdma_bounce *bounce_free;
	size_t bounce_cached;
	struct mp_reqpool reqs;
};

static inline struct rdma_drv *rdma_drv_of(struct mp_drv *d)
{
	return mp_container_of(d, struct rdma_drv, base);
}

static inline struct rdma_conn *rdma_conn_of(struct mp_drv_conn *c)
{
	return (struct rdma_conn *)(void *)c;
}

/* The connection at @l of d->sp.conns; NULL at the end. */
static inline struct rdma_conn *conn_at(struct mp_sock_link *l)
{
	return l ? mp_container_of(l, struct rdma_conn, sk.link) : NULL;
}

static void conn_fail(struct rdma_conn *c, int err);
static void conn_pump(struct rdma_conn *c);

/* ---- little helpers ---------------------------------------------------- */

/* a was before b, modulo 2^32 */
static int seq_before(uint32_t a, uint32_t b)
{
	return (int32_t)(a - b) < 0;
}

/* ---- requests ---------------------------------------------------------- */

/* The request a queue link belongs to; NULL for NULL. */
#define RDMA_REQ(l) mp_reqq_entry(l, struct rdma_req, base.link)

static struct rdma_req *req_get(struct rdma_drv *d)
{
	struct rdma_req *r = mp_reqpool_get_entry(&d->reqs, struct rdma_req, base.link);

	if (!r)
		return NULL;
	memset(r, 0, sizeof(*r));
	r->drv = d;
	mp_reqq_req_post(&r->base);
	return r;
}

static void req_put(struct rdma_req *r)
{
	mp_reqq_req_put(&r->drv->reqs, &r->base);
}

/* ---- bounce buffers ---------------------------------------------------- */

static struct rdma_bounce *bounce_get(struct rdma_drv *d, size_t len)
{
	struct rdma_bounce **pp, *b;
	size_t cap = RDMA_BOUNCE_MIN;
	int rc;

	while (cap < len)
		cap <<= 1;
	for (pp = &d->bounce_free; (b = *pp); pp = &b->next)
		if (b->cap == cap) {
			*pp = b->next;
			d->bounce_cached -= cap;
			return b;
		}
	b = calloc(1, sizeof(*b));
	if (!b)
		return NULL;
	b->cap = cap;
	b->buf = aligned_alloc(4096, cap);
	if (!b->buf) {
		free(b);
		return NULL;
	}
	rc = d->po->reg(d->pv, b->buf, cap, MP_MEM_HOST, &b->mr);
	if (rc) {
		MP_WARN("%s: cannot register a %zu-byte bounce buffer: %s", d->tname, cap,
			strerror(-rc));
		free(b->buf);
		free(b);
		return NULL;
	}
	return b;
}

static void bounce_free(struct rdma_drv *d, struct rdma_bounce *b)
{
	d->po->dereg(d->pv, b->mr);
	free(b->buf);
	free(b);
}

static void bounce_put(struct rdma_drv *d, struct rdma_bounce *b)
{
	if (!b)
		return;
	if (d->bounce_cached + b->cap > RDMA_BOUNCE_CACHE) {
		bounce_free(d, b);
		return;
	}
	b->next = d->bounce_free;
	d->bounce_free = b;
	d->bounce_cached += b->cap;
}

static void req_complete(struct rdma_req *r, int status)
{
	if (r->bounce) {
		bounce_put(r->drv, r->bounce);
		r->bounce = NULL;
	}
	mp_reqq_req_complete(&r->base, status);
}

/* mp_reqq_fail's view of req_complete. */
static void req_fail(struct mp_reqq_link *l, int err)
{
	req_complete(RDMA_REQ(l), err);
}

/* The registration that holds [p, p + len), if any: @hint first. */
static struct mp_rdma_mr *mr_find(struct rdma_drv *d, struct mp_drv_mr *hint, const void *p,
				  size_t len)
{
	uintptr_t a = (uintptr_t)p;
	struct rdma_mr *w = (struct rdma_mr *)(void *)hint;

#define RDMA_COVERS(m) \
	(a >= (uintptr_t)(m)->addr && len <= (m)->len && a - (uintptr_t)(m)->addr <= (m)->len - len)
	if (w && RDMA_COVERS(w->m))
		return w->m;
	for (w = d->mrs; w; w = w->next)
		if (RDMA_COVERS(w->m))
			return w->m;
#undef RDMA_COVERS
	return NULL;
}

/* ---- writes ------------------------------------------------------------ */

static int conn_room(const struct rdma_conn *c)
{
	return c->wr_posted - c->wr_done < RDMA_MAX_OUT;
}

/*
 * Post one write on @c. Writes are signalled when asked, and otherwise at
 * least every RDMA_SIGNAL_EVERY so that completions retire the unsignalled
 * ones before them (a connection's writes complete in order).
 */
static int conn_write(struct rdma_conn *c, const void *src, size_t len, struct mp_rdma_mr *mr,
		      uint64_t raddr, uint64_t rkey, uint32_t imm, unsigned flags)
{
	struct rdma_drv *d = c->drv;
	uint32_t seq = c->wr_posted + 1;
	int rc;

	if (!(flags & MP_RDMA_WR_SIGNAL) && c->unsignalled + 1 >= RDMA_SIGNAL_EVERY)
		flags |= MP_RDMA_WR_SIGNAL;
	rc = d->po->write(c->ep, src, len, mr, raddr, rkey, imm, flags,
			  (uint64_t)c->id << 32 | seq);
	if (rc == -EAGAIN)
		c->stalled = 1;
	if (rc)
		return rc;
	c->wr_posted = seq;
	c->unsignalled = flags & MP_RDMA_WR_SIGNAL ? 0 : c->unsignalled + 1;
	return 0;
}

/* Put clear-to-send records out for the receives waiting for one. */
static int conn_pump_recv(struct rdma_conn *c)
{
	struct rdma_drv *d = c->drv;
	struct rdma_req *r;

	while (c->state == RDMA_OPEN && (r = RDMA_REQ(c->rq.head)) && conn_room(c)) {
		uint32_t slot = c->cts_sent % RDMA_QDEPTH;
		unsigned char *rec = c->ring + (RDMA_QDEPTH + slot) * RDMA_CTS_SIZE;
		unsigned flags = MP_RDMA_WR_IMM;
		int rc;

		mp_le_put64(rec, (uint64_t)(uintptr_t)r->r.target);
		mp_le_put64(rec + 8, r->r.mr->rkey);
		mp_le_put64(rec + 16, r->r.cap);
		mp_le_put32(rec + 24, c->cts_sent);
		mp_le_put32(rec + 28, 0);
		if (d->max_inline >= RDMA_CTS_SIZE)
			flags |= MP_RDMA_WR_INLINE;
		rc = conn_write(c, rec, RDMA_CTS_SIZE, c->ring_mr, c->peer_ring + slot * RDMA_CTS_SIZE,
				c->peer_ring_key, RDMA_IMM_CTS | (c->cts_sent & RDMA_IMM_SEQ), flags);
		if (rc == -EAGAIN)
			return 0;
		if (rc) {
			MP_INFO("%s: %s: cannot post a clear-to-send record: %s", d->tname,
				c->sk.name, strerror(-rc));
			return rc;
		}
		mp_reqq_pop(&c->rq);
		mp_reqq_push(&c->rcts, &r->base.link);
		c->cts_sent++;
	}
	return 0;
}

/* Match sends to clear-to-send records and write them out, in order. */
static int conn_pump_send(struct rdma_conn *c)
{
	struct rdma_drv *d = c->drv;
	struct rdma_req *r;
	int rc;

	while (c->state == RDMA_OPEN && (r = RDMA_REQ(c->sq.head))) {
		if (!r->s.matched) {
			const unsigned char *rec;

			if (c->cts_used == c->cts_seen)
				return 0;
			rec = c->ring + (c->cts_used % RDMA_QDEPTH) * RDMA_CTS_SIZE;
			if (mp_le_get32(rec + 24) != c->cts_used) {
				MP_WARN("%s: %s: clear-to-send record %u carries sequence %u; "
					"peer out of step, closing", d->tname, c->sk.name,
					c->cts_used, mp_le_get32(rec + 24));
				return -EPROTO;
			}
			r->s.raddr = mp_le_get64(rec);
			r->s.rkey = mp_le_get64(rec + 8);
			r->s.toobig = r->base.nbytes > mp_le_get64(rec + 16);
			if (r->s.toobig)
				MP_INFO("%s: %s: message of %zu bytes exceeds the posted receive of "
					"%llu bytes", d->tname, c->sk.name, r->base.nbytes,
					(unsigned long long)mp_le_get64(rec + 16));
			r->s.matched = 1;
			c->cts_used++;
		}
		/* The pieces, then (with the last one, or alone) the immediate. */
		for (;;) {
			const struct rdma_piece *p =
				r->s.toobig || !r->s.npieces ? NULL : &r->s.piece[r->s.cur];
			size_t len = p ? p->len - r->s.off : 0;
			unsigned flags = 0;
			uint32_t imm = 0;
			int last;

			if (p && len > RDMA_SEG)
				len = RDMA_SEG;
			last = !p || (r->s.cur == r->s.npieces - 1 && r->s.off + len == p->len);
			if (!conn_room(c))
				return 0;
			if (last) {
				flags = MP_RDMA_WR_IMM | MP_RDMA_WR_SIGNAL;
				imm = r->s.toobig ? RDMA_IMM_TOOBIG | (uint32_t)(r->base.nbytes & RDMA_IMM_LEN)
						  : (uint32_t)r->base.nbytes;
			}
			if (p && !p->mr)
				flags |= MP_RDMA_WR_INLINE;
			rc = conn_write(c, p ? p->src + r->s.off : NULL, len, p ? p->mr : NULL,
					r->s.raddr + r->s.moff, r->s.rkey, imm, flags);
			if (rc == -EAGAIN)
				return 0;
			if (rc) {
				MP_INFO("%s: %s: cannot post a write: %s", d->tname, c->sk.name,
					strerror(-rc));
				return rc;
			}
			r->s.off += len;
			r->s.moff += len;
			if (last)
				break;
			if (r->s.off == p->len) {
				r->s.cur++;
				r->s.off = 0;
			}
		}
		r->s.last_wr = c->wr_posted;
		mp_reqq_pop(&c->sq);
		mp_reqq_push(&c->sfly, &r->base.link);
	}
	return 0;
}

static void conn_pump(struct rdma_conn *c)
{
	int rc;

	if (c->state != RDMA_OPEN)
		return;
	c->stalled = 0;
	rc = conn_pump_recv(c);
	if (!rc)
		rc = conn_pump_send(c);
	if (rc)
		conn_fail(c, rc);
}

/* ---- connections ------------------------------------------------------- */

/* Fail @c: nothing more lands in its buffers, every posted request gets @err. */
static void conn_fail(struct rdma_conn *c, int err)
{
	struct rdma_drv *d = c->drv;

	if (c->state == RDMA_FAILED)
		return;
	c->state = RDMA_FAILED;
	c->err = err;
	c->deadline = 0;
	if (c->ep) {
		d->po->ep_destroy(c->ep);
		c->ep = NULL;
	}
	if (d->hit == c)
		d->hit = NULL;
	mp_sock_close(&d->sp, &c->sk);
	mp_reqq_fail(&c->sq, req_fail, err);
	mp_reqq_fail(&c->sfly, req_fail, err);
	mp_reqq_fail(&c->rq, req_fail, err);
	mp_reqq_fail(&c->rcts, req_fail, err);
}

static void conn_arm(struct rdma_conn *c)
{
	uint32_t want;
	int rc;

	if (c->hs == RDMA_HS_TCP)
		want = EPOLLOUT;
	else
		want = EPOLLIN | EPOLLRDHUP | (c->out_off < c->out_len ? EPOLLOUT : 0);
	rc = mp_sock_arm(&c->drv->sp, &c->sk, want);
	if (rc)
		conn_fail(c, rc);
}

/* Allocate and register the ring, create the endpoint. */
static int conn_fabric(struct rdma_conn *c, void *blob, size_t *blen)
{
	struct rdma_drv *d = c->drv;
	size_t bytes = 2 * RDMA_QDEPTH * RDMA_CTS_SIZE;
	int rc;

	c->ring = aligned_alloc(4096, 4096 > bytes ? 4096 : bytes);
	if (!c->ring)
		return -ENOMEM;
	memset(c->ring, 0, bytes);
	rc = d->po->reg(d->pv, c->ring, bytes, MP_MEM_HOST, &c->ring_mr);
	if (rc) {
		MP_WARN("%s: cannot register a clear-to-send ring: %s", d->tname, strerror(-rc));
		return rc;
	}
	rc = d->po->ep_create(d->pv, blob, blen, &c->ep);
	if (rc)
		MP_WARN("%s: cannot create an endpoint: %s", d->tname, strerror(-rc));
	return rc;
}

static void hello_build(struct rdma_conn *c, const void *blob, size_t blen)
{
	unsigned char *p = c->out;

	memset(p, 0, RDMA_HELLO_LEN);
	mp_le_put32(p, RDMA_HELLO_MAGIC);
	mp_le_put16(p + 4, RDMA_VERSION);
	mp_le_put16(p + 6, (uint16_t)blen);
	strncpy((char *)p + 8, c->drv->po->name, RDMA_PROV_NAME - 1);
	mp_le_put64(p + 8 + RDMA_PROV_NAME, (uint64_t)(uintptr_t)c->ring);
	mp_le_put64(p + 16 + RDMA_PROV_NAME, c->ring_mr->rkey);
	memcpy(p + 24 + RDMA_PROV_NAME, blob, blen);
	c->out_len = RDMA_HELLO_LEN;
	c->out_off = 0;
}

/* Check the peer's hello and connect our endpoint to it. */
static int hello_take(struct rdma_conn *c)
{
	struct rdma_drv *d = c->drv;
	const unsigned char *p = c->in;
	char prov[RDMA_PROV_NAME];
	uint16_t blen;
	int rc;

	if (mp_le_get32(p) != RDMA_HELLO_MAGIC) {
		MP_WARN("%s: %s: not a moshpit RDMA handshake (magic 0x%08x); refusing", d->tname,
			c->sk.name, mp_le_get32(p));
		return -EPROTO;
	}
	if (mp_le_get16(p + 4) != RDMA_VERSION) {
		MP_WARN("%s: %s: handshake version %u, we speak %u; refusing", d->tname, c->sk.name,
			mp_le_get16(p + 4), RDMA_VERSION);
		return -EPROTO;
	}
	memcpy(prov, p + 8, RDMA_PROV_NAME);
	prov[RDMA_PROV_NAME - 1] = '\0';
	if (strncmp(prov, d->po->name, RDMA_PROV_NAME - 1)) {
		MP_WARN("%s: %s: peer speaks provider '%s', we '%s'; refusing", d->tname,
			c->sk.name, prov, d->po->name);
		return -EPROTO;
	}
	blen = mp_le_get16(p + 6);
	if (!blen || blen > MP_RDMA_EP_BLOB_MAX) {
		MP_WARN("%s: %s: endpoint description of %u bytes; refusing", d->tname, c->sk.name,
			blen);
		return -EPROTO;
	}
	c->peer_ring = mp_le_get64(p + 8 + RDMA_PROV_NAME);
	c->peer_ring_key = mp_le_get64(p + 16 + RDMA_PROV_NAME);
	rc = d->po->ep_connect(c->ep, p + 24 + RDMA_PROV_NAME, blen);
	if (rc)
		MP_WARN("%s: %s: cannot connect the endpoint: %s", d->tname, c->sk.name,
			strerror(-rc));
	else
		c->ep_ready = 1;
	return rc;
}

static void conn_opened(struct rdma_conn *c)
{
	c->hs = RDMA_HS_DONE;
	c->state = RDMA_OPEN;
	c->deadline = 0;
	MP_INFO("%s: %s connection with %s", c->drv->tname, c->lis ? "accepted" : "established",
		c->sk.name);
	if (c->lis)
		mp_reqq_push(&c->lis->ready, &c->llink);
	conn_pump(c);
}

/* Move the handshake on after @c's buffers filled or drained. */
static int hs_step(struct rdma_conn *c)
{
	int rc;

	switch (c->hs) {
	case RDMA_HS_C_HELLO:
		if (c->in_got < c->in_len)
			return 0;
		rc = hello_take(c);
		if (rc)
			return rc;
		mp_le_put32(c->out, RDMA_ACK_MAGIC);
		c->out_len = RDMA_ACK_LEN;
		c->out_off = 0;
		c->in_len = c->in_got = 0;
		c->hs = RDMA_HS_C_ACK;
		return 1;
	case RDMA_HS_C_ACK:
		if (c->out_off < c->out_len)
			return 0;
		conn_opened(c);
		return 0;
	case RDMA_HS_A_HELLO:
		if (c->in_got < c->in_len)
			return 0;
		/* The endpoint exists (accept made it); connect before we answer. */
		rc = hello_take(c);
		if (rc)
			return rc;
		c->in_len = RDMA_ACK_LEN;
		c->in_got = 0;
		c->hs = RDMA_HS_A_ACK; /* now our hello (built at accept time) goes out */
		return 1;
	case RDMA_HS_A_ACK:
		if (c->in_got < c->in_len)
			return 0;
		if (mp_le_get32(c->in) != RDMA_ACK_MAGIC) {
			MP_WARN("%s: %s: bad handshake ack; refusing", c->drv->tname, c->sk.name);
			return -EPROTO;
		}
		conn_opened(c);
		return 0;
	default:
		return 0;
	}
}

/* Socket I/O of a connection: handshake bytes, then only watching for the end. */
static void conn_io(struct rdma_conn *c)
{
	for (;;) {
		ssize_t n;
		int rc;

		if (c->state == RDMA_FAILED)
			return;
		if (c->out_off < c->out_len && c->hs != RDMA_HS_A_HELLO) {
			n = send(c->sk.fd, c->out + c->out_off, c->out_len - c->out_off,
				 MSG_NOSIGNAL | MSG_DONTWAIT);
			if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
				MP_INFO("%s: %s: side channel: %s", c->drv->tname, c->sk.name,
					strerror(errno));
				conn_fail(c, errno == EPIPE ? -ECONNRESET : -errno);
				return;
			}
			if (n > 0)
				c->out_off += (size_t)n;
		}
		if (c->hs == RDMA_HS_DONE) {
			unsigned char junk[64];

			n = recv(c->sk.fd, junk, sizeof(junk), MSG_DONTWAIT);
			if (n > 0) {
				MP_WARN("%s: %s: unexpected bytes on the side channel; closing",
					c->drv->tname, c->sk.name);
				conn_fail(c, -EPROTO);
				return;
			}
			if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
				/*
				 * The peer closed or died. Its last writes may still
				 * be on their way (another path than this socket): a
				 * connection with receives out gets a short grace.
				 */
				MP_INFO("%s: %s: peer closed the connection", c->drv->tname,
					c->sk.name);
				mp_sock_close(&c->drv->sp, &c->sk);
				if (c->state == RDMA_OPEN &&
				    (c->rcts.n || c->rq.n || c->sq.n || c->sfly.n))
					c->deadline = (int64_t)mp_now_ms() + RDMA_EOF_GRACE_MS;
				else
					conn_fail(c, -ECONNRESET);
			}
			return;
		}
		if (c->in_got < c->in_len) {
			n = recv(c->sk.fd, c->in + c->in_got, c->in_len - c->in_got, MSG_DONTWAIT);
			if (n == 0) {
				MP_INFO("%s: %s: peer closed the side channel during the handshake",
					c->drv->tname, c->sk.name);
				conn_fail(c, -ECONNRESET);
				return;
			}
			if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
				MP_INFO("%s: %s: side channel: %s", c->drv->tname, c->sk.name,
					strerror(errno));
				conn_fail(c, -errno);
				return;
			}
			if (n > 0)
				c->in_got += (size_t)n;
		}
		rc = hs_step(c);
		if (rc < 0) {
			conn_fail(c, rc);
			return;
		}
		if (rc == 0)
			break;
	}
	conn_arm(c);
}

static void conn_event(struct rdma_conn *c, uint32_t ev)
{
	if (c->state == RDMA_FAILED)
		return;
	if (c->hs == RDMA_HS_TCP) {
		int rc = mp_sock_connected(&c->drv->sp, &c->sk, ev);

		if (rc < 0)
			conn_fail(c, rc);
		if (rc <= 0)
			return;
		c->hs = RDMA_HS_C_HELLO;
	}
	conn_io(c);
}

static struct rdma_conn *conn_new(struct rdma_drv *d, int fd, const struct sockaddr *peer)
{
	struct rdma_conn *c = calloc(1, sizeof(*c));

	if (!c)
		return NULL;
	c->drv = d;
	c->state = RDMA_CONNECTING;
	c->id = ++d->next_id ? d->next_id : ++d->next_id; /* 0 names nothing */
	c->deadline = (int64_t)mp_now_ms() + d->timeout_ms;
	/* registered from the start so errors are seen */
	if (mp_sock_add(&d->sp, &c->sk, fd, EPOLLOUT, peer)) {
		free(c);
		return NULL;
	}
	return c;
}

static void conn_free(struct rdma_conn *c)
{
	struct rdma_drv *d = c->drv;

	conn_fail(c, -ECANCELED);
	if (c->ring_mr)
		d->po->dereg(d->pv, c->ring_mr);
	free(c->ring);
	mp_sock_remove(&d->sp, &c->sk);
	/* Completions of its endpoint may still be in the queue: the lookup
	 * of their connection must not find it in the cache. */
	if (d->hit == c)
		d->hit = NULL;
	free(c);
}

int mp_rdma_connect(struct mp_drv *dp, const void *blob, size_t len, struct mp_drv_conn **out)
{
	struct rdma_drv *d = rdma_drv_of(dp);
	unsigned char eblob[MP_RDMA_EP_BLOB_MAX];
	size_t elen = sizeof(eblob);
	struct sockaddr_storage ss;
	struct rdma_conn *c;
	socklen_t sl;
	int fd, rc;

	if (!out)
		return -EINVAL;
	fd = mp_sock_open(&d->sp, blob, len, NULL, NULL, &ss, &sl);
	if (fd < 0)
		return fd;
	c = conn_new(d, fd, (struct sockaddr *)&ss);
	if (!c) {
		close(fd);
		return -ENOMEM;
	}
	c->hs = RDMA_HS_TCP;
	*out = (struct mp_drv_conn *)(void *)c;
	/* Set-up failures still hand the connection over: its posts carry the reason. */
	rc = conn_fabric(c, eblob, &elen);
	if (rc) {
		conn_fail(c, rc);
		return 0;
	}
	hello_build(c, eblob, elen);
	c->in_len = RDMA_HELLO_LEN;
	rc = mp_sock_connect(&d->sp, &c->sk, (struct sockaddr *)&ss, sl);
	if (rc > 0) {
		c->hs = RDMA_HS_C_HELLO;
		conn_io(c);
	} else if (rc < 0) {
		conn_fail(c, rc);
	}
	return 0;
}

void mp_rdma_close(struct mp_drv_conn *cp)
{
	struct rdma_conn *c = rdma_conn_of(cp);

	if (!c)
		return;
	MP_TRACE("%s: closing connection with %s", c->drv->tname, c->sk.name);
	conn_free(c);
}

/* ---- listeners --------------------------------------------------------- */

int mp_rdma_listen(struct mp_drv *dp, const char *bind_text, void *blob, size_t *len,
		   struct mp_drv_listener **out)
{
	struct rdma_drv *d = rdma_drv_of(dp);
	struct rdma_listener *l;
	int rc;

	if (!out)
		return -EINVAL;
	l = calloc(1, sizeof(*l));
	if (!l)
		return -ENOMEM;
	l->drv = d;
	rc = mp_sock_listen(&d->sp, bind_text, RDMA_BACKLOG, NULL, NULL, &l->sk, blob, len);
	if (rc) {
		free(l);
		return rc;
	}
	MP_INFO("%s: listening on %s (side channel; provider %s)", d->tname, l->sk.name,
		d->po->name);
	*out = (struct mp_drv_listener *)(void *)l;
	return 0;
}

/* Take arrived sockets and start their handshakes. */
static void listener_drain(struct rdma_listener *l)
{
	struct rdma_drv *d = l->drv;

	for (;;) {
		unsigned char eblob[MP_RDMA_EP_BLOB_MAX];
		size_t elen = sizeof(eblob);
		struct sockaddr_storage ss;
		struct rdma_conn *c;
		int fd, rc;

		if (mp_sock_accept(&d->sp, &l->sk, &fd, &ss))
			return; /* none left, or the error is logged */
		c = conn_new(d, fd, (struct sockaddr *)&ss);
		if (!c) {
			close(fd);
			continue;
		}
		c->lis = l;
		c->hs = RDMA_HS_A_HELLO;
		c->in_len = RDMA_HELLO_LEN;
		rc = conn_fabric(c, eblob, &elen);
		if (rc) {
			conn_free(c);
			continue;
		}
		hello_build(c, eblob, elen);
		conn_io(c);
	}
}

int mp_rdma_accept(struct mp_drv_listener *lp, struct mp_drv_conn **out)
{
	struct rdma_listener *l = (struct rdma_listener *)(void *)lp;
	struct rdma_conn *c;

	if (!l || !out)
		return -EINVAL;
	listener_drain(l);
	c = mp_reqq_pop_entry(&l->ready, struct rdma_conn, llink);
	if (!c)
		return -EAGAIN;
	c->lis = NULL;
	*out = (struct mp_drv_conn *)(void *)c;
	return 0;
}

void mp_rdma_close_listener(struct mp_drv_listener *lp)
{
	struct rdma_listener *l = (struct rdma_listener *)(void *)lp;
	struct rdma_drv *d;
	struct rdma_conn *c, *next;

	if (!l)
		return;
	d = l->drv;
	/* Connections it has not handed over die with it. */
	for (c = conn_at(d->sp.conns); c; c = next) {
		next = conn_at(c->sk.link.next);
		if (c->lis == l)
			conn_free(c);
	}
	mp_sock_unlisten(&d->sp, &l->sk);
	free(l);
}

/* ---- posting ----------------------------------------------------------- */

int mp_rdma_isend(struct mp_drv_conn *cp, const struct mp_iov *iov, int iovcnt,
		  struct mp_drv_mr *mr, struct mp_drv_req **out)
{
	struct rdma_conn *c = rdma_conn_of(cp);
	struct rdma_drv *d;
	struct rdma_req *r;
	size_t total = 0;
	int copy = 0;

	if (!c || !out || iovcnt < 0 || iovcnt > MP_DRV_IOV_MAX || (iovcnt && !iov))
		return -EINVAL;
	d = c->drv;
	for (int i = 0; i < iovcnt; i++) {
		if (iov[i].len && !iov[i].base)
			return -EINVAL;
		if (iov[i].len > RDMA_MAX_MSG - total)
			return -EMSGSIZE;
		total += iov[i].len;
	}
	if (c->state == RDMA_FAILED)
		return c->err;
	if (c->sq.n + c->sfly.n >= RDMA_QDEPTH)
		return -EAGAIN;
	r = req_get(d);
	if (!r)
		return -ENOMEM;
	r->base.nbytes = total;
	for (int i = 0; i < iovcnt; i++) {
		struct rdma_piece *p = &r->s.piece[r->s.npieces];

		if (!iov[i].len)
			continue;
		p->src = iov[i].base;
		p->len = iov[i].len;
		p->mr = mr_find(d, mr, iov[i].base, iov[i].len);
		if (!p->mr && p->len > d->max_inline)
			copy = 1;
		r->s.npieces++;
	}
	if (copy) {
		/* Memory nobody registered: one registered copy of the whole message. */
		unsigned char *dst;

		r->bounce = bounce_get(d, total);
		if (!r->bounce) {
			req_put(r);
			return -ENOMEM;
		}
		dst = r->bounce->buf;
		for (int i = 0; i < r->s.npieces; i++) {
			memcpy(dst, r->s.piece[i].src, r->s.piece[i].len);
			dst += r->s.piece[i].len;
		}
		r->s.piece[0].src = r->bounce->buf;
		r->s.piece[0].len = total;
		r->s.piece[0].mr = r->bounce->mr;
		r->s.npieces = 1;
		MP_TRACE("%s: %s: send of %zu bytes from unregistered memory goes through a "
			 "bounce buffer", d->tname, c->sk.name, total);
	}
	mp_reqq_push(&c->sq, &r->base.link);
	*out = (struct mp_drv_req *)(void *)r;
	conn_pump(c);
	return 0;
}

int mp_rdma_irecv(struct mp_drv_conn *cp, void *buf, size_t cap, struct mp_drv_mr *mr,
		  struct mp_drv_req **out)
{
	struct rdma_conn *c = rdma_conn_of(cp);
	struct rdma_drv *d;
	struct rdma_req *r;

	if (!c || !out || (cap && !buf))
		return -EINVAL;
	d = c->drv;
	if (c->state == RDMA_FAILED)
		return c->err;
	if (c->rq.n + c->rcts.n >= RDMA_QDEPTH)
		return -EAGAIN;
	if (cap > RDMA_MAX_MSG)
		cap = RDMA_MAX_MSG; /* nothing longer can come */
	r = req_get(d);
	if (!r)
		return -ENOMEM;
	r->r.buf = buf;
	r->r.cap = cap;
	r->r.target = buf;
	r->r.mr = mr_find(d, mr, buf, cap);
	if (!r->r.mr) {
		r->bounce = bounce_get(d, cap);
		if (!r->bounce) {
			req_put(r);
			return -ENOMEM;
		}
		r->r.mr = r->bounce->mr;
		r->r.target = r->bounce->buf;
		MP_TRACE("%s: %s: receive of %zu bytes into unregistered memory goes through a "
			 "bounce buffer", d->tname, c->sk.name, cap);
	}
	mp_reqq_push(&c->rq, &r->base.link);
	*out = (struct mp_drv_req *)(void *)r;
	conn_pump(c);
	return 0;
}

int mp_rdma_test(struct mp_drv_req *rp, int *done, size_t *nbytes)
{
	struct rdma_req *r = (struct rdma_req *)(void *)rp;

	if (!done)
		return -EINVAL;
	/* A refused handle reads as not done too. */
	*done = 0;
	if (!r)
		return -EINVAL;
	return mp_reqq_req_test(&r->drv->reqs, &r->base, done, nbytes);
}

/* ---- completions ------------------------------------------------------- */

static struct rdma_conn *conn_by_ep(struct rdma_drv *d, const struct mp_rdma_ep *ep)
{
	if (!ep)
		return NULL;
	if (d->hit && d->hit->ep == ep)
		return d->hit;
	for (struct rdma_conn *c = conn_at(d->sp.conns); c; c = conn_at(c->sk.link.next))
		if (c->ep == ep)
			return d->hit = c;
	return NULL;
}

static struct rdma_conn *conn_by_id(struct rdma_drv *d, uint32_t id)
{
	if (d->hit && d->hit->id == id)
		return d->hit;
	for (struct rdma_conn *c = conn_at(d->sp.conns); c; c = conn_at(c->sk.link.next))
		if (c->id == id)
			return d->hit = c;
	return NULL;
}

/* A peer's write with immediate landed. */
static int on_imm(struct rdma_conn *c, uint32_t imm)
{
	struct rdma_drv *d = c->drv;
	struct rdma_req *r;
	size_t len;

	if (imm & RDMA_IMM_CTS) {
		if ((imm & RDMA_IMM_SEQ) != (c->cts_seen & RDMA_IMM_SEQ) ||
		    c->cts_seen - c->cts_used >= RDMA_QDEPTH) {
			MP_WARN("%s: %s: clear-to-send %u out of step (expected %u); closing",
				d->tname, c->sk.name, imm & RDMA_IMM_SEQ,
				c->cts_seen & RDMA_IMM_SEQ);
			return -EPROTO;
		}
		c->cts_seen++;
		return 0;
	}
	r = RDMA_REQ(mp_reqq_pop(&c->rcts));
	if (!r) {
		MP_WARN("%s: %s: data arrived for no clear-to-send record; closing", d->tname,
			c->sk.name);
		return -EPROTO;
	}
	len = imm & RDMA_IMM_LEN;
	r->base.nbytes = len;
	if (imm & RDMA_IMM_TOOBIG) {
		MP_INFO("%s: %s: message of %zu bytes exceeds the posted receive of %zu bytes",
			d->tname, c->sk.name, len, r->r.cap);
		req_complete(r, -EMSGSIZE);
		return 0;
	}
	if (len > r->r.cap) {
		MP_WARN("%s: %s: peer wrote %zu bytes into a receive of %zu; closing", d->tname,
			c->sk.name, len, r->r.cap);
		req_complete(r, -EPROTO);
		return -EPROTO;
	}
	if (r->r.target != r->r.buf && len)
		memcpy(r->r.buf, r->r.target, len);
	req_complete(r, 0);
	return 0;
}

/* Our signalled write number @seq finished: so did every earlier one. */
static void on_write_done(struct rdma_conn *c, uint32_t seq)
{
	struct rdma_req *r;

	if (seq_before(c->wr_done, seq))
		c->wr_done = seq;
	while ((r = RDMA_REQ(c->sfly.head)) && !seq_before(c->wr_done, r->s.last_wr)) {
		mp_reqq_pop(&c->sfly);
		req_complete(r, r->s.toobig ? -EMSGSIZE : 0);
	}
}

static int cqe_errno_reason(int st, const char **why)
{
	switch (st) {
	case -ETIMEDOUT:
		*why = "retries exceeded: peer unreachable or gone";
		break;
	case -EACCES:
		*why = "remote access error";
		break;
	case -ECANCELED:
		*why = "flushed";
		break;
	default:
		*why = "completion error";
		break;
	}
	return st;
}

static void on_cqe(struct rdma_drv *d, const struct mp_rdma_cqe *e)
{
	struct rdma_conn *c;
	int rc = 0;

	if (e->op == MP_RDMA_CQE_WRITE && (e->wr_id >> 32))
		c = conn_by_id(d, (uint32_t)(e->wr_id >> 32));
	else
		c = conn_by_ep(d, e->ep);
	if (!c || c->state == RDMA_FAILED)
		return; /* of a connection that has already ended */
	if (e->status < 0) {
		const char *why;

		rc = cqe_errno_reason(e->status, &why);
		MP_INFO("%s: %s: %s (%s); failing the connection", d->tname, c->sk.name, why,
			strerror(-rc));
	} else if (!c->ep_ready) {
		MP_WARN("%s: %s: completion before the handshake finished; closing", d->tname,
			c->sk.name);
		rc = -EPROTO;
	} else if (e->op == MP_RDMA_CQE_IMM) {
		rc = on_imm(c, e->imm);
	} else if (e->op == MP_RDMA_CQE_WRITE) {
		on_write_done(c, (uint32_t)e->wr_id);
	}
	if (rc)
		conn_fail(c, rc);
	else
		conn_pump(c);
}

/* Reap completions; returns how many, or a negative errno from the provider. */
static int drain_cq(struct rdma_drv *d)
{
	struct mp_rdma_cqe cqe[RDMA_CQ_BATCH];
	int total = 0;

	/* Bounded, so that socket events and deadlines get their turn. */
	for (int round = 0; round < 16; round++) {
		int n = d->po->poll(d->pv, cqe, RDMA_CQ_BATCH);

		if (n < 0) {
			MP_WARN("%s: polling the completion queue: %s", d->tname, strerror(-n));
			return n;
		}
		for (int i = 0; i < n; i++)
			on_cqe(d, &cqe[i]);
		total += n;
		if (n < RDMA_CQ_BATCH)
			break;
	}
	return total;
}

/* Socket events, without waiting; returns how many. */
static int drain_events(struct rdma_drv *d)
{
	struct epoll_event evs[RDMA_EVENTS];
	int n = epoll_wait(d->sp.epfd, evs, RDMA_EVENTS, 0);

	for (int i = 0; i < n; i++) {
		struct mp_sock_ep *ev = evs[i].data.ptr;

		switch (ev->kind) {
		case MP_SOCK_WAKE:
			mp_sock_wake_ack(&d->sp);
			break;
		case MP_SOCK_LISTENER:
			listener_drain(mp_container_of(ev, struct rdma_listener, sk.ep));
			break;
		case MP_SOCK_CONN:
			conn_event(mp_container_of(ev, struct rdma_conn, sk.ep), evs[i].events);
			break;
		}
	}
	return n > 0 ? n : 0;
}

static void check_deadlines(struct rdma_drv *d)
{
	int64_t now = (int64_t)mp_now_ms();
	struct rdma_conn *c, *next;

	for (c = conn_at(d->sp.conns); c; c = next) {
		next = conn_at(c->sk.link.next);
		if (c->lis && c->state == RDMA_FAILED && c->hs != RDMA_HS_DONE) {
			conn_free(c); /* a handshake that failed: nobody will accept it */
			continue;
		}
		if (!c->deadline || now < c->deadline || c->state == RDMA_FAILED)
			continue;
		if (c->state == RDMA_OPEN) {
			conn_fail(c, -ECONNRESET); /* the EOF grace ran out */
		} else if (c->lis) {
			MP_INFO("%s: handshake with %s timed out after %d ms; dropping it", d->tname,
				c->sk.name, d->timeout_ms);
			conn_free(c);
		} else {
			MP_INFO("%s: connect to %s timed out after %d ms", d->tname, c->sk.name,
				d->timeout_ms);
			conn_fail(c, -ETIMEDOUT);
		}
	}
}

/*
 * Completions have no file descriptor here (prov.h), so progress polls the
 * CQ, spinning RDMA_SPIN_NS and then sleeping in growing steps of at most
 * RDMA_SLEEP_MAX_NS on the epoll set; a wake or socket event ends a sleep.
 */
int mp_rdma_progress(struct mp_drv *dp, int timeout_ms)
{
	struct rdma_drv *d = rdma_drv_of(dp);
	int64_t start = (int64_t)mp_now_ns();
	int64_t end = timeout_ms < 0 ? INT64_MAX : start + (int64_t)timeout_ms * 1000000;
	int64_t step = 20000;

	for (;;) {
		int n = drain_cq(d);
		int64_t now;

		if (n < 0)
			return n;
		for (struct rdma_conn *c = conn_at(d->sp.conns); c; c = conn_at(c->sk.link.next))
			if (c->stalled)
				conn_pump(c);
		n += drain_events(d);
		check_deadlines(d);
		now = (int64_t)mp_now_ns();
		if (n || now >= end)
			return 0;
		if (now - start >= RDMA_SPIN_NS) {
			struct pollfd pfd = {.fd = d->sp.epfd, .events = POLLIN};
			int64_t left = end - now;
			struct timespec ts;

			if (step > left)
				step = left;
			ts.tv_sec = step / 1000000000;
			ts.tv_nsec = step % 1000000000;
			if (ppoll(&pfd, 1, &ts, NULL) > 0)
				continue; /* a socket or a wake: handle it at once */
			step = step * 2 > RDMA_SLEEP_MAX_NS ? RDMA_SLEEP_MAX_NS : step * 2;
		}
	}
}

void mp_rdma_wake(struct mp_drv *dp)
{
	mp_sock_wake(&rdma_drv_of(dp)->sp);
}

/* ---- memory ------------------------------------------------------------ */

int mp_rdma_reg_mr(struct mp_drv *dp, void *buf, size_t len, enum mp_mem_kind kind,
		   struct mp_drv_mr **out)
{
	struct rdma_drv *d = rdma_drv_of(dp);
	struct rdma_mr *w;
	int rc;

	if (!out || !buf || !len)
		return -EINVAL;
	w = calloc(1, sizeof(*w));
	if (!w)
		return -ENOMEM;
	rc = d->po->reg(d->pv, buf, len, kind, &w->m);
	if (rc) {
		MP_INFO("%s: cannot register %zu bytes: %s", d->tname, len, strerror(-rc));
		free(w);
		return rc;
	}
	w->next = d->mrs;
	if (d->mrs)
		d->mrs->prev = w;
	d->mrs = w;
	*out = (struct mp_drv_mr *)(void *)w;
	return 0;
}

void mp_rdma_dereg_mr(struct mp_drv *dp, struct mp_drv_mr *mr)
{
	struct rdma_drv *d = rdma_drv_of(dp);
	struct rdma_mr *w = (struct rdma_mr *)(void *)mr;

	if (!w)
		return;
	if (w->prev)
		w->prev->next = w->next;
	else
		d->mrs = w->next;
	if (w->next)
		w->next->prev = w->prev;
	d->po->dereg(d->pv, w->m);
	free(w);
}

/* ---- instance ---------------------------------------------------------- */

int mp_rdma_query(struct mp_drv *dp, struct mp_drv_caps *caps)
{
	struct rdma_drv *d = rdma_drv_of(dp);

	if (!caps)
		return -EINVAL;
	caps->flags = MP_DRV_CAP_ORDERED | MP_DRV_CAP_RDMA_WRITE | MP_DRV_CAP_ZERO_COPY |
		      d->caps_extra;
	caps->max_msg = RDMA_MAX_MSG;
	caps->default_streams = 1;
	return 0;
}

int mp_rdma_init(const struct mp_driver_ops *self, const struct mp_rdma_prov_ops *prov,
		 uint32_t caps_extra, const struct mp_drv_params *p, struct mp_drv **out)
{
	struct mp_rdma_params pp = {.rank = -1, .max_eps = 1024, .max_outstanding = RDMA_MAX_OUT};
	struct rdma_drv *d;
	int rc;

	if (!out || !self || !prov)
		return -EINVAL;
	d = calloc(1, sizeof(*d));
	if (!d)
		return -ENOMEM;
	d->base.ops = self;
	d->po = prov;
	d->tname = self->name;
	d->caps_extra = caps_extra;
	d->rank = -1;
	d->reqs = MP_REQPOOL(struct rdma_req, base.link, RDMA_REQ_BLOCK);
	if (p && p->size >= offsetof(struct mp_drv_params, rank) + sizeof(p->rank))
		d->rank = p->rank;
	if (p && p->size >= offsetof(struct mp_drv_params, connect_timeout_ms) +
				    sizeof(p->connect_timeout_ms))
		d->timeout_ms = p->connect_timeout_ms;
	if (d->timeout_ms <= 0)
		d->timeout_ms = RDMA_DEFAULT_TIMEOUT_MS;
	pp.rank = d->rank;
	pp.timeout_ms = d->timeout_ms;
	rc = mp_sock_poll_open(&d->sp, d->tname);
	if (rc)
		goto err_free;
	rc = prov->open(&pp, &d->pv);
	if (rc) {
		/* The provider logged what it looked for. */
		MP_INFO("%s: provider %s unavailable: %s", d->tname, prov->name, strerror(-rc));
		goto err;
	}
	d->max_inline = prov->max_inline(d->pv);
	MP_TRACE("%s: instance for rank %d on provider %s (inline %zu, timeout %d ms)", d->tname,
		 d->rank, prov->name, d->max_inline, d->timeout_ms);
	*out = &d->base;
	return 0;
err:
	mp_sock_poll_close(&d->sp);
err_free:
	free(d);
	return rc;
}

/* Connections whose side-channel handshake is under way: each of its steps
 * waits for a progress call on both sides. */
int mp_rdma_setting_up(struct mp_drv *dp)
{
	struct rdma_drv *d = rdma_drv_of(dp);
	int n = 0;

	for (struct rdma_conn *c = conn_at(d->sp.conns); c; c = conn_at(c->sk.link.next))
		n += c->state == RDMA_CONNECTING;
	return n;
}

int mp_rdma_describe(struct mp_drv *dp, char *text, size_t cap)
{
	struct rdma_drv *d = rdma_drv_of(dp);

	if (!d->po->describe) {
		text[0] = '\0';
		return 0;
	}
	return d->po->describe(d->pv, text, cap);
}

void mp_rdma_fini(struct mp_drv *dp)
{
	struct rdma_drv *d;

	if (!dp)
		return;
	d = rdma_drv_of(dp);
	while (d->sp.conns)
		conn_free(conn_at(d->sp.conns));
	while (d->sp.listeners) {
		struct rdma_listener *l =
			mp_container_of(d->sp.listeners, struct rdma_listener, sk.link);

		mp_rdma_close_listener((struct mp_drv_listener *)(void *)l);
	}
	while (d->mrs)
		mp_rdma_dereg_mr(dp, (struct mp_drv_mr *)(void *)d->mrs);
	while (d->bounce_free) {
		struct rdma_bounce *b = d->bounce_free;

		d->bounce_free = b->next;
		bounce_free(d, b);
	}
	d->po->close(d->pv);
	/* Requests die with the instance, tested or not. */
	mp_reqpool_fini(&d->reqs);
	mp_sock_poll_close(&d->sp);
	free(d);
}

