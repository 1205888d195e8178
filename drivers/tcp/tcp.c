/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * tcp transport: framed messages on non-blocking TCP sockets, one epoll
 * instance per driver instance (doc/tcp.md).
 *
 * Wire framing: every message is preceded by an 8-byte driver header,
 * little-endian { u32 tag = TCP_FRAME_MAGIC, u32 payload length }. The tag
 * lets a receiver notice a stream that is not ours (or that lost sync) and
 * fail the connection with -EPROTO instead of scribbling into user buffers.
 *
 * Flow control is the kernel's: a connection reads ahead at most one
 * read-ahead buffer's worth beyond its posted receives; the rest stays in
 * the socket buffer and TCP pushes back on the sender.
 *
 * System calls per message matter more than copies for small messages: on
 * a host with fewer cores than peers, each costs a few microseconds of the
 * cores every peer shares. So
 *  - receives read ahead: one readv fills the rest of the current payload
 *    straight into its posted buffer and, behind it, up to TCP_RBUF bytes
 *    into the connection's read-ahead buffer, where the next headers and
 *    small messages wait to be copied out. A large payload still lands in
 *    its posted buffer without a copy, but for what came in with a header.
 *  - sends are gathered: isend queues the message and the next progress()
 *    writes every queued message of the connection with one sendmsg (an
 *    exchange's OPEN and its first data frame go out together).
 *  - a listener is asked for a connection only after epoll reported it
 *    readable since it last had none.
 *
 * Environment:
 *   MP_TCP_SOCKBUF  socket send and receive buffer size in bytes, optional
 *                   K/M/G suffix (default 4M). 0 leaves the kernel's buffer
 *                   autotuning alone. A size above net.core.{r,w}mem_max is
 *                   not applied either: the kernel would clamp it to a
 *                   smaller fixed buffer than autotuning reaches.
 *
 * Threading: an instance is driven by one thread at a time; only wake() may
 * be called concurrently with the others.
 */
/* accept4, MSG_NOSIGNAL and friends, also when the build does not ask for them. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif
#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <moshpit/driver_sdk.h>

#include "inet.h"
#include "size.h"
#include "sockconn.h"

extern const struct mp_driver_ops mp_tcp_driver_ops;

#define TCP_FRAME_MAGIC 0x3154504dU /* bytes "MPT1" on the wire */
#define TCP_HDR_SIZE 8
#define TCP_MAX_MSG ((size_t)1 << 30)
#define TCP_QUEUE_MAX 64      /* posted requests per connection and direction */
#define TCP_REQ_BLOCK 64      /* requests allocated at once */
#define TCP_GATHER_MAX 64     /* iovecs handed to one sendmsg */
#define TCP_EVENTS 64         /* epoll events taken per wait */
#define TCP_BACKLOG 1024
#define TCP_SOCKBUF_DEFAULT (4 << 20)
#define TCP_RBUF (32 << 10)   /* read-ahead buffer per connection */

/* Address blob (inet.h): moved between hosts, so every field is a byte array. */
_Static_assert(sizeof(struct mp_inet_addr) <= MP_DRV_ADDR_MAX, "address blob too large");

struct tcp_drv;

struct tcp_req {
	/* queue or free list; nbytes: send: payload bytes, recv: message length */
	struct mp_reqq_req base;
	struct tcp_drv *drv;
	union {
		struct {
			/* header + payload pieces; consumed in place as bytes go out */
			struct iovec iov[1 + MP_DRV_IOV_MAX];
			int iovcnt;
			int cur;
			unsigned char hdr[TCP_HDR_SIZE];
		} s;
		struct {
			unsigned char *buf;
			size_t cap;
		} r;
	};
};

enum tcp_conn_state {
	TCP_CONNECTING,
	TCP_OPEN,
	TCP_FAILED,
};

struct tcp_conn {
	struct mp_sock_conn sk; /* socket, epoll interest, peer name; on d->sp.conns */
	struct tcp_drv *drv;
	enum tcp_conn_state state;
	int err;            /* sticky error once failed */
	int want_out;       /* the last write would have blocked */
	int64_t deadline;   /* connect deadline, ms on CLOCK_MONOTONIC; 0 = none */
	struct mp_reqq sq;
	struct mp_reqq rq;
	int dirty;          /* sends queued since the last flush (on d->ndirty) */
	int have_hdr;       /* the current incoming message's header is parsed */
	int rdry;           /* the last read found the socket drained */
	int reof;           /* the peer closed; what was read before is still delivered */
	size_t rlen;        /* its payload length, once the header is in */
	size_t rgot;        /* payload bytes already in the posted buffer */
	unsigned char *rbuf; /* read-ahead, TCP_RBUF bytes, allocated on first read */
	size_t roff, rend;  /* unread bytes of rbuf: [roff, rend) */
};

struct tcp_listener {
	struct mp_sock_listener sk; /* on d->sp.listeners */
	struct tcp_drv *drv;
	int ready;          /* epoll saw it readable since accept last found none */
};

struct tcp_mr {
	void *buf;
	size_t len;
};

struct tcp_drv {
	struct mp_drv base; /* first: the core hands us &base */
	struct mp_sock_poll sp;
	int rank;
	int connect_timeout_ms;
	int sndbuf;         /* 0 = leave the kernel default */
	int rcvbuf;
	int nconnecting;
	int ndirty;         /* connections with queued, unflushed sends */
	struct mp_reqpool reqs;
};

static inline struct tcp_drv *tcp_drv_of(struct mp_drv *d)
{
	return mp_container_of(d, struct tcp_drv, base);
}

static inline struct tcp_conn *tcp_conn_of(struct mp_drv_conn *c)
{
	return (struct tcp_conn *)(void *)c;
}

/* The connection at @l of d->sp.conns; NULL at the end. */
static inline struct tcp_conn *tcp_conn_at(struct mp_sock_link *l)
{
	return l ? mp_container_of(l, struct tcp_conn, sk.link) : NULL;
}

static inline struct tcp_listener *tcp_listener_of(struct mp_drv_listener *l)
{
	return (struct tcp_listener *)(void *)l;
}

static inline struct tcp_req *tcp_req_of(struct mp_drv_req *r)
{
	return (struct tcp_req *)(void *)r;
}

/* ---- requests ---------------------------------------------------------- */

/* The request a queue link belongs to; NULL for NULL. */
#define TCP_REQ(l) mp_reqq_entry(l, struct tcp_req, base.link)

static struct tcp_req *tcp_req_get(struct tcp_drv *d)
{
	/* Blocks of TCP_REQ_BLOCK, so that steady state never touches malloc. */
	struct tcp_req *r = mp_reqpool_get_entry(&d->reqs, struct tcp_req, base.link);

	if (!r)
		return NULL;
	r->drv = d;
	mp_reqq_req_post(&r->base);
	return r;
}

static void tcp_req_complete(struct tcp_req *r, int status)
{
	mp_reqq_req_complete(&r->base, status);
}

/* mp_reqq_fail's view of tcp_req_complete. */
static void tcp_req_fail(struct mp_reqq_link *l, int err)
{
	tcp_req_complete(TCP_REQ(l), err);
}

/* ---- addresses --------------------------------------------------------- */

/* ---- sockets ----------------------------------------------------------- */

/* Errors that mean "the peer went away" all read as -ECONNRESET upstream. */
static int tcp_peer_err(int e)
{
	if (e == EPIPE || e == ESHUTDOWN || e == 0)
		return -ECONNRESET;
	return -e;
}

/* Buffer sizes (TCP_NODELAY comes from mp_sock_open and mp_sock_accept). */
static void tcp_sock_tune(void *arg, int fd)
{
	struct tcp_drv *d = arg;

	/*
	 * Buffers before connect()/listen(): the window scale is fixed by the
	 * SYN, so a later increase could not be used fully.
	 */
	if (d->sndbuf && setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &d->sndbuf, sizeof(d->sndbuf)) < 0)
		MP_TRACE("tcp: SO_SNDBUF %d: %s", d->sndbuf, strerror(errno));
	if (d->rcvbuf && setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &d->rcvbuf, sizeof(d->rcvbuf)) < 0)
		MP_TRACE("tcp: SO_RCVBUF %d: %s", d->rcvbuf, strerror(errno));
}

static long tcp_read_sysctl(const char *path)
{
	FILE *f = fopen(path, "r");
	long v = -1;

	if (!f)
		return -1;
	if (fscanf(f, "%ld", &v) != 1)
		v = -1;
	fclose(f);
	return v;
}

static int tcp_sockbuf_config(struct tcp_drv *d)
{
	const char *s = getenv("MP_TCP_SOCKBUF");
	unsigned long long v = TCP_SOCKBUF_DEFAULT;
	long rmax, wmax;

	if (s && *s) {
		uint64_t x;

		/* The library's size grammar (size.h), which never wraps. */
		if (mp_parse_size(s, &x) || x > INT_MAX / 2)
			goto bad;
		v = x;
	}
	if (!v) {
		MP_INFO("tcp: MP_TCP_SOCKBUF=0, socket buffers left to the kernel");
		return 0;
	}
	/*
	 * Setting a buffer switches off the kernel's autotuning for it; when the
	 * request exceeds the sysctl cap the kernel clamps it, which usually
	 * ends up smaller than what autotuning would have reached.
	 */
	rmax = tcp_read_sysctl("/proc/sys/net/core/rmem_max");
	wmax = tcp_read_sysctl("/proc/sys/net/core/wmem_max");
	d->rcvbuf = (rmax < 0 || (unsigned long long)rmax >= v) ? (int)v : 0;
	d->sndbuf = (wmax < 0 || (unsigned long long)wmax >= v) ? (int)v : 0;
	if (!d->rcvbuf || !d->sndbuf)
		MP_INFO("tcp: socket buffer %llu exceeds net.core.rmem_max=%ld/wmem_max=%ld; "
			"leaving %s to kernel autotuning", v, rmax, wmax,
			!d->rcvbuf && !d->sndbuf ? "both" : !d->rcvbuf ? "SO_RCVBUF" : "SO_SNDBUF");
	return 0;
bad:
	MP_WARN("tcp: MP_TCP_SOCKBUF=%s not understood (bytes up to %d, optionally followed by "
		"K, M or G and B)", s, INT_MAX / 2);
	return -EINVAL;
}

/* ---- connections ------------------------------------------------------- */

/* Fail the connection: every posted request completes with @err, later posts get it too. */
static void tcp_conn_fail(struct tcp_conn *c, int err)
{
	if (c->state == TCP_FAILED)
		return;
	if (c->state == TCP_CONNECTING)
		c->drv->nconnecting--;
	c->state = TCP_FAILED;
	c->err = err;
	if (c->dirty) {
		c->dirty = 0;
		c->drv->ndirty--;
	}
	mp_sock_close(&c->drv->sp, &c->sk);
	mp_reqq_fail(&c->sq, tcp_req_fail, err);
	mp_reqq_fail(&c->rq, tcp_req_fail, err);
}

/*
 * Bring the epoll interest in line with what the connection waits for.
 * Outside event handling (@exact == 0) bits are only added: dropping one
 * costs an epoll_ctl per message, while a stale bit costs at most one
 * spurious event, after which the handler trims it with @exact.
 */
static void tcp_conn_arm(struct tcp_conn *c, int exact)
{
	uint32_t want = 0;
	int rc;

	if (c->state == TCP_CONNECTING) {
		want = EPOLLOUT;
	} else {
		/* Input while a receive is posted, and between exchanges while
		 * the read-ahead has room: EPOLLIN then stays armed, instead of
		 * an epoll_ctl on and off per message. After a close, only a
		 * posted receive wants input: the pending end of stream fails
		 * it (reading an end of stream is level-triggered). */
		if (c->rq.n || (!c->reof && c->rend - c->roff < TCP_RBUF))
			want |= EPOLLIN;
		if (c->sq.n && c->want_out)
			want |= EPOLLOUT;
	}
	if (!exact)
		want |= c->sk.events;
	rc = mp_sock_arm(&c->drv->sp, &c->sk, want);
	if (rc)
		tcp_conn_fail(c, rc);
}

/* Account @n written bytes against the head of the send queue. */
static void tcp_send_consume(struct tcp_conn *c, size_t n)
{
	struct tcp_req *r;

	while (n && (r = TCP_REQ(c->sq.head))) {
		for (; r->s.cur < r->s.iovcnt; r->s.cur++) {
			struct iovec *iv = &r->s.iov[r->s.cur];

			if (iv->iov_len > n) {
				iv->iov_base = (char *)iv->iov_base + n;
				iv->iov_len -= n;
				return;
			}
			n -= iv->iov_len;
			iv->iov_len = 0;
		}
		mp_reqq_pop(&c->sq);
		tcp_req_complete(r, 0);
	}
}

static void tcp_conn_read(struct tcp_conn *c);

/* Write as much of the send queue as the socket takes, several messages per call. */
static void tcp_conn_flush(struct tcp_conn *c)
{
	struct iovec v[TCP_GATHER_MAX];
	struct msghdr msg;

	if (c->dirty) {
		c->dirty = 0;
		c->drv->ndirty--;
	}
	while (c->state == TCP_OPEN && c->sq.head) {
		size_t want = 0;
		ssize_t w;
		int n = 0;

		for (struct tcp_req *r = TCP_REQ(c->sq.head);
		     r && n + 1 + MP_DRV_IOV_MAX <= TCP_GATHER_MAX; r = TCP_REQ(r->base.link.next)) {
			for (int i = r->s.cur; i < r->s.iovcnt; i++) {
				if (!r->s.iov[i].iov_len)
					continue;
				v[n++] = r->s.iov[i];
				want += r->s.iov[i].iov_len;
			}
		}
		memset(&msg, 0, sizeof(msg));
		msg.msg_iov = v;
		msg.msg_iovlen = (size_t)n;
		/* MSG_NOSIGNAL: a dead peer must be an error code, not SIGPIPE. */
		w = sendmsg(c->sk.fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
		if (w < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK) {
				c->want_out = 1;
				break;
			}
			int e = errno;

			MP_INFO("tcp: %s: send: %s", c->sk.name, strerror(e));
			/* What the peer sent before it closed is still there to
			 * be read, into the receives posted for it, before they
			 * fail: a peer that closes after its last message (an
			 * OPEN that says why) means it to be read. */
			tcp_conn_read(c);
			tcp_conn_fail(c, tcp_peer_err(e));
			return;
		}
		tcp_send_consume(c, (size_t)w);
		/* A short write means the socket buffer is full: wait for EPOLLOUT. */
		if ((size_t)w < want) {
			c->want_out = 1;
			break;
		}
	}
	if (!c->sq.head)
		c->want_out = 0;
	tcp_conn_arm(c, 0);
}

/*
 * Handle a read result that is not a positive count. Returns 1 if reading
 * should stop for now (would block, or the connection failed).
 */
static int tcp_read_stop(struct tcp_conn *c, ssize_t n)
{
	if (n == 0) {
		/* Not acted on here: with no receive posted, this is a read
		 * ahead between exchanges, and the close of a peer that is
		 * done with us (it dropped us, or it left) must look the same
		 * as when the socket was not read until the next exchange,
		 * where a receive that needs more bytes fails (tcp_fill).
		 * Failing the connection at once made a dht run take live
		 * peers for gone (doc/tcp.md). */
		c->reof = 1;
		return 1;
	}
	if (errno == EINTR)
		return 0;
	if (errno == EAGAIN || errno == EWOULDBLOCK) {
		c->rdry = 1;
		return 1;
	}
	MP_INFO("tcp: %s: recv: %s", c->sk.name, strerror(errno));
	tcp_conn_fail(c, tcp_peer_err(errno));
	return 1;
}

/* The peer closed and a posted receive needs more than was read before. */
static void tcp_eof_fail(struct tcp_conn *c)
{
	MP_INFO("tcp: %s: peer closed the connection%s", c->sk.name,
		c->have_hdr || c->roff < c->rend ? " in the middle of a message" : "");
	tcp_conn_fail(c, -ECONNRESET);
}

/*
 * One read: @want bytes straight into @dst (the rest of the current
 * payload, or nothing), and behind them as much as fits into the read-ahead
 * buffer. Returns 1 if bytes came, 0 if reading should stop for now.
 */
static int tcp_fill(struct tcp_conn *c, unsigned char *dst, size_t want)
{
	struct iovec v[2];
	size_t room, asked;
	int n = 0;
	ssize_t got;

	if (c->reof) {
		if (c->rq.head)
			tcp_eof_fail(c);
		return 0;
	}
	if (c->rdry)
		return 0; /* drained: wait for EPOLLIN rather than ask again */
	if (!c->rbuf) {
		c->rbuf = malloc(TCP_RBUF);
		if (!c->rbuf) {
			MP_WARN("tcp: %s: no memory for the read-ahead buffer", c->sk.name);
			tcp_conn_fail(c, -ENOMEM);
			return 0;
		}
	}
	if (c->roff == c->rend) {
		c->roff = c->rend = 0;
	} else if (c->roff > TCP_RBUF / 2 || c->rend == TCP_RBUF) {
		/* Only a header's worth or a part of a message waits: move it down. */
		memmove(c->rbuf, c->rbuf + c->roff, c->rend - c->roff);
		c->rend -= c->roff;
		c->roff = 0;
	}
	if (want) {
		v[n].iov_base = dst;
		v[n++].iov_len = want;
	}
	room = TCP_RBUF - c->rend;
	if (room) {
		v[n].iov_base = c->rbuf + c->rend;
		v[n++].iov_len = room;
	}
	if (!n)
		return 0;
	asked = want + room;
	for (;;) {
		got = readv(c->sk.fd, v, n);
		if (got > 0)
			break;
		if (tcp_read_stop(c, got)) {
			if (c->reof && c->rq.head)
				tcp_eof_fail(c);
			return 0;
		}
	}
	if ((size_t)got < asked)
		c->rdry = 1; /* the socket had no more: the next read would block */
	if ((size_t)got <= want) {
		c->rgot += (size_t)got;
	} else {
		c->rgot += want;
		c->rend += (size_t)got - want;
	}
	return 1;
}

/* Read incoming messages into posted receives, in posting order; with none
 * posted, read ahead while there is room. */
static void tcp_conn_read(struct tcp_conn *c)
{
	struct tcp_req *r;

	while (c->state == TCP_OPEN) {
		size_t avail = c->rend - c->roff;

		r = TCP_REQ(c->rq.head);
		if (!r) {
			if (avail < TCP_RBUF)
				tcp_fill(c, NULL, 0);
			break;
		}

		if (!c->have_hdr) {
			const unsigned char *h;
			uint32_t tag, len;

			if (avail < TCP_HDR_SIZE) {
				if (!tcp_fill(c, NULL, 0))
					break;
				continue;
			}
			h = c->rbuf + c->roff;
			tag = mp_le_get32(h);
			len = mp_le_get32(h + 4);
			if (tag != TCP_FRAME_MAGIC || len > TCP_MAX_MSG) {
				MP_WARN("tcp: %s: bad frame header (tag 0x%08x, length %u); "
					"not a moshpit tcp stream or out of sync, closing",
					c->sk.name, tag, len);
				tcp_conn_fail(c, -EPROTO);
				break;
			}
			if (len > r->r.cap) {
				/*
				 * The rest of the message would have to be read
				 * somewhere or the stream loses sync: give up on
				 * the connection.
				 */
				MP_WARN("tcp: %s: message of %u bytes exceeds the posted receive "
					"of %zu bytes, closing", c->sk.name, len, r->r.cap);
				mp_reqq_pop(&c->rq);
				r->base.nbytes = len;
				tcp_req_complete(r, -EMSGSIZE);
				tcp_conn_fail(c, -ECONNRESET);
				break;
			}
			c->roff += TCP_HDR_SIZE;
			avail -= TCP_HDR_SIZE;
			c->have_hdr = 1;
			c->rlen = len;
			c->rgot = 0;
		}
		if (c->rgot < c->rlen) {
			size_t take = c->rlen - c->rgot < avail ? c->rlen - c->rgot : avail;

			if (take) {
				memcpy(r->r.buf + c->rgot, c->rbuf + c->roff, take);
				c->roff += take;
				c->rgot += take;
			}
			if (c->rgot < c->rlen) {
				if (!tcp_fill(c, r->r.buf + c->rgot, c->rlen - c->rgot))
					break;
				continue;
			}
		}
		mp_reqq_pop(&c->rq);
		r->base.nbytes = c->rlen;
		tcp_req_complete(r, 0);
		c->have_hdr = 0;
		c->rlen = 0;
		c->rgot = 0;
	}
	tcp_conn_arm(c, 0);
}

static void tcp_conn_established(struct tcp_conn *c)
{
	c->state = TCP_OPEN;
	c->drv->nconnecting--;
	c->deadline = 0;
	MP_INFO("tcp: connected to %s", c->sk.name);
	tcp_conn_flush(c);
	tcp_conn_read(c);
	tcp_conn_arm(c, 1);
}

static void tcp_conn_event(struct tcp_conn *c, uint32_t ev)
{
	if (c->state == TCP_FAILED)
		return;
	if (c->state == TCP_CONNECTING) {
		int rc = mp_sock_connected(&c->drv->sp, &c->sk, ev);

		if (rc < 0)
			tcp_conn_fail(c, rc);
		else if (rc)
			tcp_conn_established(c);
		return;
	}
	/* Reading or writing surfaces a pending socket error with its own errno. */
	if (ev & (EPOLLIN | EPOLLERR | EPOLLHUP)) {
		c->rdry = 0;
		tcp_conn_read(c);
	}
	if (ev & (EPOLLOUT | EPOLLERR | EPOLLHUP))
		tcp_conn_flush(c);
	if (c->state == TCP_OPEN && (ev & (EPOLLERR | EPOLLHUP))) {
		/* Reset while idle: the error is level-triggered, so act on it now. */
		int e = mp_sock_error(c->sk.fd);

		MP_INFO("tcp: %s: connection lost: %s", c->sk.name,
			strerror(e ? e : ECONNRESET));
		tcp_conn_fail(c, tcp_peer_err(e));
		return;
	}
	tcp_conn_arm(c, 1);
}

static int tcp_conn_new(struct tcp_drv *d, int fd, enum tcp_conn_state state,
			const struct sockaddr *peer, struct tcp_conn **out)
{
	struct tcp_conn *c;
	int err;

	c = calloc(1, sizeof(*c));
	if (!c) {
		err = -ENOMEM;
		goto err_close;
	}
	c->drv = d;
	c->state = state;
	/* Registered from the start so that errors and hang-ups are always seen. */
	err = mp_sock_add(&d->sp, &c->sk, fd, state == TCP_CONNECTING ? EPOLLOUT : 0, peer);
	if (err)
		goto err_free;
	if (state == TCP_CONNECTING) {
		d->nconnecting++;
		if (d->connect_timeout_ms > 0)
			c->deadline = (int64_t)mp_now_ms() + d->connect_timeout_ms;
	}
	*out = c;
	return 0;

err_free:
	free(c);
err_close:
	close(fd);
	return err;
}

static int tcp_connect(struct mp_drv *dp, const void *blob, size_t len, struct mp_drv_conn **out)
{
	struct tcp_drv *d = tcp_drv_of(dp);
	struct sockaddr_storage ss;
	struct tcp_conn *c;
	socklen_t sl;
	int fd, rc;

	if (!out)
		return -EINVAL;
	fd = mp_sock_open(&d->sp, blob, len, tcp_sock_tune, d, &ss, &sl);
	if (fd < 0)
		return fd;
	rc = tcp_conn_new(d, fd, TCP_CONNECTING, (struct sockaddr *)&ss, &c);
	if (rc)
		return rc;
	rc = mp_sock_connect(&d->sp, &c->sk, (struct sockaddr *)&ss, sl);
	if (rc > 0)
		tcp_conn_established(c);
	else if (rc < 0)
		tcp_conn_fail(c, rc); /* still handed over: its posts fail with the reason */
	else
		MP_TRACE("tcp: connecting to %s", c->sk.name);
	*out = (struct mp_drv_conn *)(void *)c;
	return 0;
}

static void tcp_close(struct mp_drv_conn *cp)
{
	struct tcp_conn *c = tcp_conn_of(cp);

	if (!c)
		return;
	MP_TRACE("tcp: closing connection with %s", c->sk.name);
	/* What was queued last (a BYE, a REJECT) still goes, if the socket takes it. */
	if (c->sq.head)
		tcp_conn_flush(c);
	tcp_conn_fail(c, -ECANCELED);
	mp_sock_remove(&c->drv->sp, &c->sk);
	free(c->rbuf);
	free(c);
}

/* ---- listeners --------------------------------------------------------- */

static int tcp_listen(struct mp_drv *dp, const char *bind_text, void *blob, size_t *len,
		      struct mp_drv_listener **out)
{
	struct tcp_drv *d = tcp_drv_of(dp);
	struct tcp_listener *l;
	int rc;

	if (!out)
		return -EINVAL;
	l = calloc(1, sizeof(*l));
	if (!l)
		return -ENOMEM;
	l->drv = d;
	l->ready = 1;
	/* tcp_sock_tune: accepted sockets inherit the buffer sizes, in time for
	 * the SYN-ACK's window scale. */
	rc = mp_sock_listen(&d->sp, bind_text, TCP_BACKLOG, tcp_sock_tune, d, &l->sk, blob, len);
	if (rc) {
		free(l);
		return rc;
	}
	MP_INFO("tcp: listening on %s", l->sk.name);
	*out = (struct mp_drv_listener *)(void *)l;
	return 0;
}

static int tcp_accept(struct mp_drv_listener *lp, struct mp_drv_conn **out)
{
	struct tcp_listener *l = tcp_listener_of(lp);
	struct sockaddr_storage ss;
	struct tcp_conn *c;
	int fd, rc;

	if (!l || !out)
		return -EINVAL;
	/* Level-triggered: epoll reports a waiting connection at every wait. */
	if (!l->ready)
		return -EAGAIN;
	rc = mp_sock_accept(&l->drv->sp, &l->sk, &fd, &ss);
	if (rc == -EAGAIN)
		l->ready = 0;
	if (rc)
		return rc;
	rc = tcp_conn_new(l->drv, fd, TCP_OPEN, (struct sockaddr *)&ss, &c);
	if (rc)
		return rc;
	MP_INFO("tcp: accepted connection from %s on %s", c->sk.name, l->sk.name);
	*out = (struct mp_drv_conn *)(void *)c;
	return 0;
}

static void tcp_close_listener(struct mp_drv_listener *lp)
{
	struct tcp_listener *l = tcp_listener_of(lp);

	if (!l)
		return;
	mp_sock_unlisten(&l->drv->sp, &l->sk);
	MP_TRACE("tcp: stopped listening on %s", l->sk.name);
	free(l);
}

/* ---- posting and progress ---------------------------------------------- */

static int tcp_isend(struct mp_drv_conn *cp, const struct mp_iov *iov, int iovcnt,
		     struct mp_drv_mr *mr, struct mp_drv_req **out)
{
	struct tcp_conn *c = tcp_conn_of(cp);
	struct tcp_req *r;
	size_t total = 0;

	(void)mr; /* host memory needs no registration here */
	if (!c || !out || iovcnt < 0 || iovcnt > MP_DRV_IOV_MAX || (iovcnt && !iov))
		return -EINVAL;
	for (int i = 0; i < iovcnt; i++) {
		if (iov[i].len && !iov[i].base)
			return -EINVAL;
		if (iov[i].len > TCP_MAX_MSG - total)
			return -EMSGSIZE;
		total += iov[i].len;
	}
	if (c->state == TCP_FAILED)
		return c->err;
	if (c->sq.n >= TCP_QUEUE_MAX)
		return -EAGAIN;
	r = tcp_req_get(c->drv);
	if (!r)
		return -ENOMEM;
	mp_le_put32(r->s.hdr, TCP_FRAME_MAGIC);
	mp_le_put32(r->s.hdr + 4, (uint32_t)total);
	r->s.iov[0].iov_base = r->s.hdr;
	r->s.iov[0].iov_len = TCP_HDR_SIZE;
	for (int i = 0; i < iovcnt; i++) {
		r->s.iov[1 + i].iov_base = (void *)(uintptr_t)iov[i].base;
		r->s.iov[1 + i].iov_len = iov[i].len;
	}
	r->s.iovcnt = 1 + iovcnt;
	r->s.cur = 0;
	r->base.nbytes = total;
	mp_reqq_push(&c->sq, &r->base.link);
	*out = (struct mp_drv_req *)(void *)r;
	/* Written by the next progress(), with whatever else is queued by
	 * then; unless earlier sends already wait for room (EPOLLOUT). */
	if (c->state == TCP_OPEN && !c->want_out && !c->dirty) {
		c->dirty = 1;
		c->drv->ndirty++;
	}
	return 0;
}

static int tcp_irecv(struct mp_drv_conn *cp, void *buf, size_t cap, struct mp_drv_mr *mr,
		     struct mp_drv_req **out)
{
	struct tcp_conn *c = tcp_conn_of(cp);
	struct tcp_req *r;

	(void)mr;
	if (!c || !out || (cap && !buf))
		return -EINVAL;
	if (c->state == TCP_FAILED)
		return c->err;
	if (c->rq.n >= TCP_QUEUE_MAX)
		return -EAGAIN;
	r = tcp_req_get(c->drv);
	if (!r)
		return -ENOMEM;
	r->r.buf = buf;
	r->r.cap = cap;
	mp_reqq_push(&c->rq, &r->base.link);
	*out = (struct mp_drv_req *)(void *)r;
	/* The message may already sit in the socket buffer. */
	if (c->state == TCP_OPEN && c->rq.head == &r->base.link)
		tcp_conn_read(c);
	else
		tcp_conn_arm(c, 0);
	return 0;
}

static int tcp_test(struct mp_drv_req *rp, int *done, size_t *nbytes)
{
	struct tcp_req *r = tcp_req_of(rp);

	if (!done)
		return -EINVAL;
	/* A refused handle reads as not done too. */
	*done = 0;
	if (!r)
		return -EINVAL;
	return mp_reqq_req_test(&r->drv->reqs, &r->base, done, nbytes);
}

static void tcp_check_deadlines(struct tcp_drv *d)
{
	int64_t now = (int64_t)mp_now_ms();

	for (struct tcp_conn *c = tcp_conn_at(d->sp.conns); c; c = tcp_conn_at(c->sk.link.next)) {
		if (c->state != TCP_CONNECTING || !c->deadline || now < c->deadline)
			continue;
		MP_INFO("tcp: connect to %s timed out after %d ms", c->sk.name,
			d->connect_timeout_ms);
		tcp_conn_fail(c, -ETIMEDOUT);
	}
}

/* Shorten a wait so that connect deadlines are noticed on time. */
static int tcp_clip_timeout(struct tcp_drv *d, int timeout_ms)
{
	int64_t now, first = 0;

	for (struct tcp_conn *c = tcp_conn_at(d->sp.conns); c; c = tcp_conn_at(c->sk.link.next))
		if (c->state == TCP_CONNECTING && c->deadline && (!first || c->deadline < first))
			first = c->deadline;
	if (!first)
		return timeout_ms;
	now = (int64_t)mp_now_ms();
	if (first <= now)
		return 0;
	if (timeout_ms < 0 || first - now < timeout_ms)
		return (int)(first - now);
	return timeout_ms;
}

static int tcp_progress(struct mp_drv *dp, int timeout_ms)
{
	struct tcp_drv *d = tcp_drv_of(dp);
	struct epoll_event evs[TCP_EVENTS];
	int n;

	if (d->nconnecting)
		timeout_ms = tcp_clip_timeout(d, timeout_ms);
	if (d->ndirty) {
		for (struct tcp_conn *c = tcp_conn_at(d->sp.conns); c && d->ndirty;
		     c = tcp_conn_at(c->sk.link.next))
			if (c->dirty)
				tcp_conn_flush(c);
		/* Sends completed: the caller has work before any wait. */
		timeout_ms = 0;
	}
	n = epoll_wait(d->sp.epfd, evs, TCP_EVENTS, timeout_ms);
	if (n < 0) {
		if (errno != EINTR) {
			int err = -errno;

			MP_WARN("tcp: epoll_wait: %s", strerror(-err));
			return err;
		}
		n = 0;
	}
	for (int i = 0; i < n; i++) {
		struct mp_sock_ep *ep = evs[i].data.ptr;

		switch (ep->kind) {
		case MP_SOCK_WAKE:
			mp_sock_wake_ack(&d->sp);
			break;
		case MP_SOCK_LISTENER:
			/* accept() picks the connection up; the wait just ends. */
			mp_container_of(ep, struct tcp_listener, sk.ep)->ready = 1;
			break;
		case MP_SOCK_CONN:
			tcp_conn_event(mp_container_of(ep, struct tcp_conn, sk.ep), evs[i].events);
			break;
		}
	}
	if (d->nconnecting)
		tcp_check_deadlines(d);
	return 0;
}

static void tcp_wake(struct mp_drv *dp)
{
	mp_sock_wake(&tcp_drv_of(dp)->sp);
}

/* ---- memory ------------------------------------------------------------ */

static int tcp_reg_mr(struct mp_drv *d, void *buf, size_t len, enum mp_mem_kind kind,
		      struct mp_drv_mr **out)
{
	struct tcp_mr *m;

	(void)d;
	if (kind != MP_MEM_HOST)
		return -ENOTSUP;
	if (!out || (len && !buf))
		return -EINVAL;
	m = malloc(sizeof(*m));
	if (!m)
		return -ENOMEM;
	m->buf = buf;
	m->len = len;
	*out = (struct mp_drv_mr *)(void *)m;
	return 0;
}

static void tcp_dereg_mr(struct mp_drv *d, struct mp_drv_mr *mr)
{
	(void)d;
	free(mr);
}

/* ---- instance ---------------------------------------------------------- */

static int tcp_query(struct mp_drv *d, struct mp_drv_caps *caps)
{
	(void)d;
	if (!caps)
		return -EINVAL;
	caps->flags = MP_DRV_CAP_ORDERED;
	caps->max_msg = TCP_MAX_MSG;
	caps->default_streams = 1;
	return 0;
}

static int tcp_init(const struct mp_drv_params *p, struct mp_drv **out)
{
	struct tcp_drv *d;
	int rc;

	if (!out)
		return -EINVAL;
	d = calloc(1, sizeof(*d));
	if (!d)
		return -ENOMEM;
	d->base.ops = &mp_tcp_driver_ops;
	d->reqs = MP_REQPOOL(struct tcp_req, base.link, TCP_REQ_BLOCK);
	d->rank = -1;
	/* Read only the fields the caller's (possibly older) struct has. */
	if (p && p->size >= offsetof(struct mp_drv_params, rank) + sizeof(p->rank))
		d->rank = p->rank;
	if (p && p->size >= offsetof(struct mp_drv_params, connect_timeout_ms) +
				    sizeof(p->connect_timeout_ms))
		d->connect_timeout_ms = p->connect_timeout_ms;
	rc = tcp_sockbuf_config(d);
	if (rc)
		goto err_free;
	rc = mp_sock_poll_open(&d->sp, "tcp");
	if (rc)
		goto err_free;
	MP_TRACE("tcp: instance for rank %d (sndbuf %d, rcvbuf %d, connect timeout %d ms)",
		 d->rank, d->sndbuf, d->rcvbuf, d->connect_timeout_ms);
	*out = &d->base;
	return 0;

err_free:
	if (rc != -EINVAL)
		MP_WARN("tcp: cannot create instance: %s", strerror(-rc));
	free(d);
	return rc;
}

static void tcp_fini(struct mp_drv *dp)
{
	struct tcp_drv *d;

	if (!dp)
		return;
	d = tcp_drv_of(dp);
	while (d->sp.conns)
		tcp_close((struct mp_drv_conn *)(void *)tcp_conn_at(d->sp.conns));
	while (d->sp.listeners) {
		struct tcp_listener *l =
			mp_container_of(d->sp.listeners, struct tcp_listener, sk.link);

		tcp_close_listener((struct mp_drv_listener *)(void *)l);
	}
	/* Requests die with the instance, tested or not. */
	mp_reqpool_fini(&d->reqs);
	mp_sock_poll_close(&d->sp);
	free(d);
}

const struct mp_driver_ops mp_tcp_driver_ops = {
	.size = sizeof(struct mp_driver_ops),
	.abi = MP_DRIVER_ABI,
	.name = "tcp",
	.init = tcp_init,
	.fini = tcp_fini,
	.query = tcp_query,
	.addr_parse = mp_inet_addr_parse,
	.addr_format = mp_inet_addr_format,
	.listen = tcp_listen,
	.accept = tcp_accept,
	.close_listener = tcp_close_listener,
	.connect = tcp_connect,
	.close = tcp_close,
	.reg_mr = tcp_reg_mr,
	.dereg_mr = tcp_dereg_mr,
	.isend = tcp_isend,
	.irecv = tcp_irecv,
	.test = tcp_test,
	.progress = tcp_progress,
	.wake = tcp_wake,
	.default_listen = "127.0.0.1:0",
};
