/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * "sockpair": a moshpit driver built out of the tree, against the installed
 * headers and `pkg-config moshpit` only (tests/integration/oot_driver/run.sh), as a
 * third party would write one. Every peer is a context of one process, as
 * with the loop driver: a process-wide registry maps listener names to
 * listeners, and a connect makes a Unix socketpair whose far end waits in
 * the listener's backlog until its owner accepts it. Messages are framed on
 * the stream: 8 bytes (magic, length, little-endian) and the payload, read
 * straight into the posted receive.
 *
 * It uses what the SDK (moshpit/driver_sdk.h) gives a driver: the request
 * pool and queues, the log, the clock, little-endian fields and
 * mp_container_of. Built as a plugin (-DSP_PLUGIN) it exports
 * mp_driver_plugin() and nothing else; -DSP_BAD_ABI builds a table of
 * another ABI, which the library must refuse.
 *
 * Threading: one thread drives an instance (the context's progress
 * thread); connect and wake reach other instances under g_lock.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <moshpit/driver_sdk.h>

#ifndef SP_NAME
#define SP_NAME "sockpair"
#endif
#define SP_PREFIX "sp:"
#define SP_PREFIX_LEN (sizeof(SP_PREFIX) - 1)
#define SP_NAME_MAX 31
#define SP_MAGIC 0x31505053u /* "SPP1" */
#define SP_HDR 8
#define SP_MAX_MSG ((size_t)1 << 30)
#define SP_QUEUE_MAX 64 /* posted requests per connection and direction */
#define SP_BACKLOG 64
#define SP_REQ_BLOCK 32

struct sp_drv;

struct sp_listener {
	struct sp_drv *d;
	char name[SP_NAME_MAX + 1];
	int backlog[SP_BACKLOG]; /* far ends of connects, oldest first */
	int nback;
	struct sp_listener *next;
};

struct sp_conn {
	struct sp_drv *d;
	int fd;
	int err;               /* set once the connection failed */
	struct mp_reqq sendq;  /* struct sp_req, oldest first */
	struct mp_reqq recvq;
	size_t sent;           /* bytes of the oldest send written */
	uint8_t rhdr[SP_HDR];  /* header of the message being read */
	size_t rhave;          /* of rhdr */
	size_t rlen, rgot;     /* its payload: length, and bytes read */
	struct sp_conn *next;
};

struct sp_req {
	struct mp_reqq_req base;
	struct sp_drv *d;      /* its pool's owner (the connection may be gone) */
	uint8_t hdr[SP_HDR];
	struct iovec iov[1 + MP_DRV_IOV_MAX];
	int iovcnt;
	size_t total;          /* header and payload */
	void *buf;             /* receive */
	size_t cap;
};

struct sp_drv {
	struct mp_drv base; /* first: the core hands us &base */
	int wake_rd, wake_wr;
	int rank;
	struct sp_listener *listener;
	struct sp_conn *conns;
	struct mp_reqpool reqs;
	unsigned long msgs;
	uint64_t t0_ms;
};

struct sp_mr {
	void *buf;
};

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static struct sp_listener *g_listeners;
static unsigned g_next_name;

static struct sp_drv *drv_of(struct mp_drv *d)
{
	return mp_container_of(d, struct sp_drv, base);
}

#define SP_REQ(l) mp_reqq_entry(l, struct sp_req, base.link)

/* ---- requests and failures ------------------------------------------------- */

static void req_done(struct mp_reqq_link *l, int err)
{
	mp_reqq_req_complete(&SP_REQ(l)->base, err);
}

static void conn_fail(struct sp_conn *c, int err)
{
	if (!c->err) {
		MP_INFO("%s: rank %d: connection fails: %s", SP_NAME, c->d->rank, strerror(-err));
		c->err = err;
	}
	mp_reqq_fail(&c->sendq, req_done, err);
	mp_reqq_fail(&c->recvq, req_done, err);
}

static void wake_fd(int fd)
{
	char b = 1;

	/* A full pipe is awake already. */
	if (write(fd, &b, 1) < 0 && errno != EAGAIN)
		MP_WARN("%s: wake: %s", SP_NAME, strerror(errno));
}

static int nonblock(int fd)
{
	int fl = fcntl(fd, F_GETFL);

	return fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0 ? -errno : 0;
}

/* ---- moving bytes ----------------------------------------------------------- */

/* Write queued sends until the socket is full; 1 if something completed. */
static int pump_send(struct sp_conn *c)
{
	int moved = 0;

	while (!c->err && c->sendq.head) {
		struct sp_req *r = mp_reqq_first(&c->sendq, struct sp_req, base.link);
		struct iovec v[1 + MP_DRV_IOV_MAX];
		size_t skip = c->sent;
		int n = 0;

		for (int i = 0; i < r->iovcnt; i++) {
			if (skip >= r->iov[i].iov_len) {
				skip -= r->iov[i].iov_len;
				continue;
			}
			v[n].iov_base = (char *)r->iov[i].iov_base + skip;
			v[n++].iov_len = r->iov[i].iov_len - skip;
			skip = 0;
		}
		ssize_t w = writev(c->fd, v, n);

		if (w < 0) {
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				break;
			if (errno == EINTR)
				continue;
			conn_fail(c, -errno);
			return 1;
		}
		c->sent += (size_t)w;
		if (c->sent < r->total)
			continue;
		mp_reqq_pop(&c->sendq);
		r->base.nbytes = r->total - SP_HDR;
		mp_reqq_req_complete(&r->base, 0);
		c->sent = 0;
		c->d->msgs++;
		moved = 1;
	}
	return moved;
}

/* Read into posted receives (only while one is posted: flow control). */
static int pump_recv(struct sp_conn *c)
{
	int moved = 0;

	while (!c->err && c->recvq.head) {
		struct sp_req *r = mp_reqq_first(&c->recvq, struct sp_req, base.link);
		ssize_t got;

		if (c->rhave < SP_HDR) {
			got = read(c->fd, c->rhdr + c->rhave, SP_HDR - c->rhave);
		} else if (c->rgot < c->rlen) {
			got = read(c->fd, (char *)r->buf + c->rgot, c->rlen - c->rgot);
		} else {
			got = 0; /* an empty message: nothing to read */
		}
		if (got < 0) {
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				break;
			if (errno == EINTR)
				continue;
			conn_fail(c, -errno);
			return 1;
		}
		if (got == 0 && (c->rhave < SP_HDR || c->rgot < c->rlen)) {
			conn_fail(c, -ECONNRESET);
			return 1;
		}
		if (c->rhave < SP_HDR) {
			c->rhave += (size_t)got;
			if (c->rhave < SP_HDR)
				continue;
			if (mp_le_get32(c->rhdr) != SP_MAGIC) {
				conn_fail(c, -EPROTO);
				return 1;
			}
			c->rlen = mp_le_get32(c->rhdr + 4);
			c->rgot = 0;
			/* The stream cannot skip a message: the connection goes with it. */
			if (c->rlen > r->cap) {
				conn_fail(c, -EMSGSIZE);
				return 1;
			}
			continue;
		}
		c->rgot += (size_t)got;
		if (c->rgot < c->rlen)
			continue;
		mp_reqq_pop(&c->recvq);
		r->base.nbytes = c->rlen;
		mp_reqq_req_complete(&r->base, 0);
		c->rhave = 0;
		c->rlen = c->rgot = 0;
		moved = 1;
	}
	return moved;
}

static int pump_all(struct sp_drv *d)
{
	int moved = 0;

	for (struct sp_conn *c = d->conns; c; c = c->next) {
		moved |= pump_send(c);
		moved |= pump_recv(c);
	}
	return moved;
}

/* ---- the ops -------------------------------------------------------------------- */

static int sp_init(const struct mp_drv_params *p, struct mp_drv **out)
{
	struct sp_drv *d;
	int fds[2];

	if (!out)
		return -EINVAL;
	d = calloc(1, sizeof(*d));
	if (!d)
		return -ENOMEM;
	if (pipe(fds) < 0) {
		free(d);
		return -errno;
	}
	d->wake_rd = fds[0];
	d->wake_wr = fds[1];
	if (nonblock(d->wake_rd) || nonblock(d->wake_wr)) {
		close(fds[0]);
		close(fds[1]);
		free(d);
		return -EIO;
	}
	d->rank = -1;
	/* Fields beyond what the caller's struct holds keep their defaults. */
	if (p && p->size >= offsetof(struct mp_drv_params, rank) + sizeof(p->rank))
		d->rank = p->rank;
	d->reqs = MP_REQPOOL(struct sp_req, base.link, SP_REQ_BLOCK);
	d->t0_ms = mp_now_ms();
	MP_INFO("%s: instance for rank %d", SP_NAME, d->rank);
	*out = &d->base;
	return 0;
}

static int sp_query(struct mp_drv *dd, struct mp_drv_caps *caps)
{
	(void)dd;
	caps->flags = MP_DRV_CAP_ORDERED | MP_DRV_CAP_INPROC;
	caps->max_msg = SP_MAX_MSG;
	caps->default_streams = 1;
	return 0;
}

static int sp_addr_parse(struct mp_drv *dd, const char *text, void *blob, size_t *len)
{
	size_t n;

	(void)dd;
	if (!text || strncmp(text, SP_PREFIX, SP_PREFIX_LEN))
		return -EINVAL;
	n = strlen(text + SP_PREFIX_LEN);
	if (!n || n > SP_NAME_MAX || n > *len)
		return -EINVAL;
	memcpy(blob, text + SP_PREFIX_LEN, n);
	*len = n;
	return 0;
}

static int sp_addr_format(struct mp_drv *dd, const void *blob, size_t len, char *text, size_t cap)
{
	(void)dd;
	if (!len || len > SP_NAME_MAX)
		return -EINVAL;
	if (SP_PREFIX_LEN + len + 1 > cap)
		return -ENOSPC;
	memcpy(text, SP_PREFIX, SP_PREFIX_LEN);
	memcpy(text + SP_PREFIX_LEN, blob, len);
	text[SP_PREFIX_LEN + len] = '\0';
	return 0;
}

static struct sp_listener *find_listener(const char *name)
{
	for (struct sp_listener *l = g_listeners; l; l = l->next)
		if (!strcmp(l->name, name))
			return l;
	return NULL;
}

static int sp_listen(struct mp_drv *dd, const char *bind, void *blob, size_t *len,
		     struct mp_drv_listener **out)
{
	struct sp_drv *d = drv_of(dd);
	char name[SP_NAME_MAX + 1];
	size_t n = sizeof(name) - 1;
	struct sp_listener *l;
	int rc;

	if (d->listener)
		return -EADDRINUSE;
	rc = sp_addr_parse(dd, bind, name, &n);
	if (rc)
		return rc;
	name[n] = '\0';
	l = calloc(1, sizeof(*l));
	if (!l)
		return -ENOMEM;
	pthread_mutex_lock(&g_lock);
	if (!strcmp(name, "*"))
		snprintf(name, sizeof(name), "n%u", g_next_name++);
	if (find_listener(name)) {
		pthread_mutex_unlock(&g_lock);
		free(l);
		return -EADDRINUSE;
	}
	memcpy(l->name, name, sizeof(name));
	l->d = d;
	l->next = g_listeners;
	g_listeners = l;
	pthread_mutex_unlock(&g_lock);
	d->listener = l;
	n = strlen(l->name);
	if (blob && len) {
		if (*len < n) {
			*len = n;
			return -ENOSPC;
		}
		memcpy(blob, l->name, n);
		*len = n;
	}
	*out = (struct mp_drv_listener *)(void *)l;
	return 0;
}

static void sp_close(struct mp_drv_conn *cp);

static struct sp_conn *conn_new(struct sp_drv *d, int fd)
{
	struct sp_conn *c = calloc(1, sizeof(*c));

	if (!c)
		return NULL;
	c->d = d;
	c->fd = fd;
	c->next = d->conns;
	d->conns = c;
	return c;
}

static int sp_accept(struct mp_drv_listener *lp, struct mp_drv_conn **out)
{
	struct sp_listener *l = (struct sp_listener *)(void *)lp;
	struct sp_conn *c;
	int fd;

	pthread_mutex_lock(&g_lock);
	if (!l->nback) {
		pthread_mutex_unlock(&g_lock);
		return -EAGAIN;
	}
	fd = l->backlog[0];
	memmove(l->backlog, l->backlog + 1, (size_t)--l->nback * sizeof(l->backlog[0]));
	pthread_mutex_unlock(&g_lock);
	c = conn_new(l->d, fd);
	if (!c) {
		close(fd);
		return -ENOMEM;
	}
	*out = (struct mp_drv_conn *)(void *)c;
	return 0;
}

static void sp_close_listener(struct mp_drv_listener *lp)
{
	struct sp_listener *l = (struct sp_listener *)(void *)lp;

	if (!l)
		return;
	pthread_mutex_lock(&g_lock);
	for (struct sp_listener **pp = &g_listeners; *pp; pp = &(*pp)->next)
		if (*pp == l) {
			*pp = l->next;
			break;
		}
	pthread_mutex_unlock(&g_lock);
	/* Connections never accepted see their far end close. */
	for (int i = 0; i < l->nback; i++)
		close(l->backlog[i]);
	l->d->listener = NULL;
	free(l);
}

static int sp_connect(struct mp_drv *dd, const void *blob, size_t len, struct mp_drv_conn **out)
{
	struct sp_drv *d = drv_of(dd);
	char name[SP_NAME_MAX + 1];
	struct sp_listener *l;
	struct sp_conn *c;
	int fds[2];

	if (!len || len > SP_NAME_MAX)
		return -EINVAL;
	memcpy(name, blob, len);
	name[len] = '\0';
	if (socketpair(AF_UNIX, SOCK_STREAM, 0, fds) < 0)
		return -errno;
	if (nonblock(fds[0]) || nonblock(fds[1]) || !(c = conn_new(d, fds[0]))) {
		close(fds[0]);
		close(fds[1]);
		return -ENOMEM;
	}
	pthread_mutex_lock(&g_lock);
	l = find_listener(name);
	if (l && l->nback < SP_BACKLOG) {
		l->backlog[l->nback++] = fds[1];
		wake_fd(l->d->wake_wr);
		fds[1] = -1;
	}
	pthread_mutex_unlock(&g_lock);
	if (fds[1] >= 0) {
		/* Nobody listens (yet): the core retries, as after a refused TCP connect. */
		close(fds[1]);
		sp_close((struct mp_drv_conn *)(void *)c);
		return -ECONNREFUSED;
	}
	*out = (struct mp_drv_conn *)(void *)c;
	return 0;
}

static void sp_close(struct mp_drv_conn *cp)
{
	struct sp_conn *c = (struct sp_conn *)(void *)cp;

	if (!c)
		return;
	conn_fail(c, -ECANCELED);
	for (struct sp_conn **pp = &c->d->conns; *pp; pp = &(*pp)->next)
		if (*pp == c) {
			*pp = c->next;
			break;
		}
	close(c->fd);
	free(c);
}

static int sp_reg_mr(struct mp_drv *dd, void *buf, size_t len, enum mp_mem_kind kind,
		     struct mp_drv_mr **out)
{
	struct sp_mr *m;

	(void)dd;
	(void)len;
	if (kind != MP_MEM_HOST)
		return -ENOTSUP;
	m = malloc(sizeof(*m));
	if (!m)
		return -ENOMEM;
	m->buf = buf;
	*out = (struct mp_drv_mr *)(void *)m;
	return 0;
}

static void sp_dereg_mr(struct mp_drv *dd, struct mp_drv_mr *mr)
{
	(void)dd;
	free(mr);
}

static struct sp_req *req_get(struct sp_drv *d)
{
	struct sp_req *r = mp_reqpool_get_entry(&d->reqs, struct sp_req, base.link);

	if (r) {
		mp_reqq_req_post(&r->base);
		r->d = d;
	}
	return r;
}

static int sp_isend(struct mp_drv_conn *cp, const struct mp_iov *iov, int iovcnt,
		    struct mp_drv_mr *mr, struct mp_drv_req **out)
{
	struct sp_conn *c = (struct sp_conn *)(void *)cp;
	struct sp_req *r;
	size_t len = 0;

	(void)mr;
	if (iovcnt < 0 || iovcnt > MP_DRV_IOV_MAX)
		return -EINVAL;
	if (c->err)
		return c->err;
	for (int i = 0; i < iovcnt; i++)
		len += iov[i].len;
	if (len > SP_MAX_MSG)
		return -EMSGSIZE;
	if (c->sendq.n >= SP_QUEUE_MAX)
		return -EAGAIN;
	r = req_get(c->d);
	if (!r)
		return -ENOMEM;
	mp_le_put32(r->hdr, SP_MAGIC);
	mp_le_put32(r->hdr + 4, (uint32_t)len);
	r->iov[0].iov_base = r->hdr;
	r->iov[0].iov_len = SP_HDR;
	for (int i = 0; i < iovcnt; i++) {
		r->iov[1 + i].iov_base = (void *)iov[i].base;
		r->iov[1 + i].iov_len = iov[i].len;
	}
	r->iovcnt = 1 + iovcnt;
	r->total = SP_HDR + len;
	mp_reqq_push(&c->sendq, &r->base.link);
	MP_TRACE("%s: rank %d: send of %zu bytes posted", SP_NAME, c->d->rank, len);
	pump_send(c);
	*out = (struct mp_drv_req *)(void *)r;
	return 0;
}

static int sp_irecv(struct mp_drv_conn *cp, void *buf, size_t cap, struct mp_drv_mr *mr,
		    struct mp_drv_req **out)
{
	struct sp_conn *c = (struct sp_conn *)(void *)cp;
	struct sp_req *r;

	(void)mr;
	if (c->err)
		return c->err;
	if (c->recvq.n >= SP_QUEUE_MAX)
		return -EAGAIN;
	r = req_get(c->d);
	if (!r)
		return -ENOMEM;
	r->buf = buf;
	r->cap = cap;
	mp_reqq_push(&c->recvq, &r->base.link);
	pump_recv(c);
	*out = (struct mp_drv_req *)(void *)r;
	return 0;
}

static int sp_test(struct mp_drv_req *rp, int *done, size_t *nbytes)
{
	struct sp_req *r = (struct sp_req *)(void *)rp;

	if (!r || !done)
		return -EINVAL;
	return mp_reqq_req_test(&r->d->reqs, &r->base, done, nbytes);
}

static int sp_progress(struct mp_drv *dd, int timeout_ms)
{
	struct sp_drv *d = drv_of(dd);
	uint64_t until = mp_now_ms() + (uint64_t)(timeout_ms > 0 ? timeout_ms : 0);

	if (pump_all(d))
		return 0;
	for (;;) {
		struct pollfd pf[64]; /* a test's driver: up to 63 connections wait in poll */
		nfds_t n = 0;
		int wait = -1;

		pf[n++] = (struct pollfd){.fd = d->wake_rd, .events = POLLIN};
		for (struct sp_conn *c = d->conns; c && n < sizeof(pf) / sizeof(pf[0]); c = c->next) {
			short ev = (short)((c->recvq.head ? POLLIN : 0) | (c->sendq.head ? POLLOUT : 0));

			if (!c->err && ev)
				pf[n++] = (struct pollfd){.fd = c->fd, .events = ev};
		}
		if (timeout_ms >= 0) {
			uint64_t now = mp_now_ms();

			wait = now < until ? (int)(until - now) : 0;
		}
		int rc = poll(pf, n, wait);

		if (rc < 0 && errno == EINTR)
			continue; /* what is left of the timeout, on the SDK's clock */
		if (rc < 0)
			return -errno;
		break;
	}
	char drain[64];

	while (read(d->wake_rd, drain, sizeof(drain)) > 0)
		;
	pump_all(d);
	return 0;
}

/* The optional describe entry: what mp_transport_detail reports. */
static int sp_describe(struct mp_drv *dd, char *text, size_t cap)
{
	int n = snprintf(text, cap, "pairs=socketpair name=%s", SP_NAME);

	(void)dd;
	if (n < 0 || (size_t)n >= cap) {
		text[0] = '\0';
		return -ENOSPC;
	}
	return n;
}

static void sp_wake(struct mp_drv *dd)
{
	wake_fd(drv_of(dd)->wake_wr);
}

static void sp_fini(struct mp_drv *dd)
{
	struct sp_drv *d = drv_of(dd);

	if (!d)
		return;
	sp_close_listener((struct mp_drv_listener *)(void *)d->listener);
	while (d->conns)
		sp_close((struct mp_drv_conn *)(void *)d->conns);
	MP_INFO("%s: rank %d: %lu messages sent in %llu ms", SP_NAME, d->rank, d->msgs,
		(unsigned long long)(mp_now_ms() - d->t0_ms));
	mp_reqpool_fini(&d->reqs);
	close(d->wake_rd);
	close(d->wake_wr);
	free(d);
}

const struct mp_driver_ops sockpair_driver_ops = {
	.size = sizeof(struct mp_driver_ops),
#ifdef SP_BAD_ABI
	.abi = MP_DRIVER_ABI + 1,
#else
	.abi = MP_DRIVER_ABI,
#endif
	.name = SP_NAME,
	.init = sp_init,
	.fini = sp_fini,
	.query = sp_query,
	.addr_parse = sp_addr_parse,
	.addr_format = sp_addr_format,
	.listen = sp_listen,
	.accept = sp_accept,
	.close_listener = sp_close_listener,
	.connect = sp_connect,
	.close = sp_close,
	.reg_mr = sp_reg_mr,
	.dereg_mr = sp_dereg_mr,
	.isend = sp_isend,
	.irecv = sp_irecv,
	.test = sp_test,
	.progress = sp_progress,
	.wake = sp_wake,
	.default_listen = SP_PREFIX "*",
	.describe = sp_describe,
};

#ifdef SP_PLUGIN
MP_DRIVER_PLUGIN(sockpair_driver_ops)
#endif
