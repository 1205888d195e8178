/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The "loop" transport: every peer lives in this process, each one a driver
 * instance normally driven by its own thread. It exists so that the core,
 * the algorithms and the failure paths can be tested and benchmarked with
 * many peers and no network (doc/loop.md).
 *
 * Design
 *  - A process-wide registry maps listener names to listeners. Addresses are
 *    "loop:NAME" as text and the NAME bytes as the blob.
 *  - connect makes a pair of endpoints at once and queues the far one on the
 *    listener for accept. If no listener has the name yet, the connection
 *    waits for one up to the instance's connect timeout (a peer thread may
 *    simply not have reached listen yet), then its requests fail with
 *    -ECONNREFUSED.
 *  - Messages meet by rendezvous: a send waits in its endpoint's queue until
 *    the peer endpoint has a receive at the head of its queue, then the
 *    thread that posted the second of the two copies the bytes straight
 *    from the sender's pieces into the receive buffer. One copy per message,
 *    no buffering, no allocation once the request free lists are warm.
 *  - One global mutex guards all state; it is never held during a copy.
 *    While a copy runs outside the lock both endpoints count it, and close
 *    waits for the count to drop, so neither endpoint nor buffer goes away
 *    under the copier.
 *  - Each instance has a condition variable (on the global mutex) and an
 *    "events" flag: completing one of its requests, a new connection on its
 *    listener or wake() sets the flag and signals, whichever thread does it.
 *    progress() returns at once when the flag is set, else waits for it up
 *    to its timeout, then clears it.
 *
 * Invariant worth knowing when reading the matching code: outside the lock,
 * for each direction of a connection at most one of (sender's send queue,
 * receiver's receive queue) is non-empty, because any pair is matched as
 * soon as it exists.
 */
#include <moshpit/driver_sdk.h>

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define LOOP_PREFIX "loop:"
#define LOOP_PREFIX_LEN (sizeof(LOOP_PREFIX) - 1)
#define LOOP_NAME_MAX 100
#define LOOP_MAX_MSG ((size_t)1 << 30)
#define LOOP_DEFAULT_CONNECT_MS 10000
#define LOOP_REQ_BLOCK 64 /* requests allocated at once */

/* ---- intrusive doubly linked list ---- */

struct dl {
	struct dl *prev, *next;
};

#define DL_INIT(h) { &(h), &(h) }

static void dl_init(struct dl *h)
{
	h->prev = h->next = h;
}

static bool dl_empty(const struct dl *h)
{
	return h->next == h;
}

static void dl_add_tail(struct dl *h, struct dl *n)
{
	n->prev = h->prev;
	n->next = h;
	h->prev->next = n;
	h->prev = n;
}

static void dl_del(struct dl *n)
{
	n->prev->next = n->next;
	n->next->prev = n->prev;
	n->prev = n->next = n;
}

/* ---- objects ---- */

enum conn_state {
	CONN_CONNECTING, /* no listener had the name yet; requests queue */
	CONN_OPEN,       /* peer endpoint exists (possibly not yet accepted) */
	CONN_REFUSED,    /* nobody listened in time: requests fail -ECONNREFUSED */
	CONN_RESET,      /* the peer closed: requests fail -ECONNRESET */
};

enum req_kind { REQ_SEND, REQ_RECV };

struct loop_drv;

struct loop_req {
	struct mp_reqq_link link;  /* in a conn queue or the free list */
	struct loop_drv *d;        /* owner: signalled on completion */
	atomic_int done;           /* set last, with release, when err/nbytes are final */
	int err;
	int kind;
	bool internal;             /* injected: nobody tests it; recycled when complete */
	int iovcnt;
	struct mp_iov iov[MP_DRV_IOV_MAX];
	size_t len;                /* send: message bytes; receive: capacity */
	void *buf;                 /* receive buffer */
	void *owned;               /* injected bytes, freed on completion */
	size_t nbytes;
};

struct loop_conn {
	struct loop_drv *d;      /* instance whose thread posts on it */
	struct loop_conn *peer;  /* other endpoint, NULL once it is gone */
	int state;
	struct mp_reqq sendq, recvq; /* posted and not yet matched */
	int copies;              /* copies in flight touching this endpoint */
	struct dl node;          /* in d->conns, or in a listener's backlog */
	/* CONNECTING only: */
	struct dl cnode;         /* in g_connecting */
	int64_t deadline_ns;
	size_t target_len;
	char target[LOOP_NAME_MAX];
};

struct loop_listener {
	struct loop_drv *d;
	struct dl node;     /* in g_listeners */
	struct dl dnode;    /* in d->listeners */
	struct dl backlog;  /* arrived endpoints, oldest first */
	size_t name_len;
	char name[LOOP_NAME_MAX + 1];
};

struct loop_drv {
	struct mp_drv base; /* first: the core sees a struct mp_drv * */
	pthread_cond_t cv;  /* waits on g_lock */
	bool events;
	int rank;
	int connect_timeout_ms;
	int nconnecting;    /* own conns in CONNECTING, to skip the deadline scan */
	struct dl conns;
	struct dl listeners;
	struct mp_reqpool reqs;
	char run[64];
};

struct mp_drv_mr {
	int kind;
};

/* The table at the end of this file; instances point back at it. */
extern const struct mp_driver_ops mp_loop_driver_ops;

/* Host memory needs no registration; one shared handle stands for all of it. */
static struct mp_drv_mr host_mr = {MP_MEM_HOST};

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static struct dl g_listeners = DL_INIT(g_listeners);
static struct dl g_connecting = DL_INIT(g_connecting);
static unsigned long g_name_seq;

static inline struct loop_drv *drv_of(struct mp_drv *d)
{
	return (struct loop_drv *)d;
}

static inline struct loop_conn *conn_of(struct mp_drv_conn *c)
{
	return (struct loop_conn *)c;
}

static inline struct loop_listener *lis_of(struct mp_drv_listener *l)
{
	return (struct loop_listener *)l;
}

static inline struct loop_req *req_of(struct mp_drv_req *r)
{
	return (struct loop_req *)r;
}

/* ---- requests (g_lock held) ---- */

/* The request a queue link belongs to; NULL for NULL. */
#define LOOP_REQ(l) mp_reqq_entry(l, struct loop_req, link)

static struct loop_req *req_get(struct loop_drv *d)
{
	struct loop_req *r = mp_reqpool_get_entry(&d->reqs, struct loop_req, link);

	if (!r)
		return NULL;
	r->d = d;
	atomic_store_explicit(&r->done, 0, memory_order_relaxed);
	r->err = 0;
	r->internal = false;
	r->iovcnt = 0;
	r->len = 0;
	r->buf = NULL;
	r->owned = NULL;
	r->nbytes = 0;
	return r;
}

static void req_put(struct loop_req *r)
{
	mp_reqpool_put(&r->d->reqs, &r->link);
}

static void signal_drv(struct loop_drv *d)
{
	d->events = true;
	pthread_cond_broadcast(&d->cv);
}

static void complete(struct loop_req *r, int err, size_t nbytes)
{
	struct loop_drv *d = r->d;

	if (r->internal) {
		/* Injected bytes have no owner to test them. */
		free(r->owned);
		r->owned = NULL;
		req_put(r);
		return;
	}
	r->err = err;
	r->nbytes = err ? 0 : nbytes;
	atomic_store_explicit(&r->done, 1, memory_order_release);
	signal_drv(d);
}

/* mp_reqq_fail's view of complete(): a failed request moved no bytes. */
static void fail_req(struct mp_reqq_link *l, int err)
{
	complete(LOOP_REQ(l), err, 0);
}

/* ---- matching (g_lock held on entry and exit; dropped during copies) ---- */

static void copy_msg(const struct loop_req *s, struct loop_req *r)
{
	unsigned char *dst = r->buf;

	for (int i = 0; i < s->iovcnt; i++) {
		if (!s->iov[i].len)
			continue;
		memcpy(dst, s->iov[i].base, s->iov[i].len);
		dst += s->iov[i].len;
	}
}

/*
 * Match and copy everything that can meet in one direction of @c's
 * connection: @c's sends to the peer (as_sender) or the peer's sends to @c.
 * The pair is taken off both queues under the lock, copied without it, and
 * completed under it again. Endpoints are re-read from @c after each copy:
 * the caller owns @c so it stays, but the peer may have closed meanwhile.
 */
static void pump(struct loop_conn *c, bool as_sender)
{
	for (;;) {
		struct loop_conn *tx = as_sender ? c : c->peer;
		struct loop_conn *rx = as_sender ? c->peer : c;

		if (!tx || !rx || c->state != CONN_OPEN || !tx->sendq.head || !rx->recvq.head)
			return;
		struct loop_req *s = LOOP_REQ(mp_reqq_pop(&tx->sendq));
		struct loop_req *r = LOOP_REQ(mp_reqq_pop(&rx->recvq));

		if (s->len > r->len) {
			/* The message is dropped: both sides learn why. */
			MP_TRACE("loop: %zu-byte message into a %zu-byte receive", s->len, r->len);
			complete(r, -EMSGSIZE, 0);
			complete(s, -EMSGSIZE, 0);
			continue;
		}
		tx->copies++;
		rx->copies++;
		pthread_mutex_unlock(&g_lock);
		copy_msg(s, r);
		pthread_mutex_lock(&g_lock);
		tx->copies--;
		rx->copies--;
		size_t len = s->len;

		complete(r, 0, len);
		complete(s, 0, len);
		/* A close may be waiting for the copy count of either endpoint. */
		signal_drv(tx->d);
		signal_drv(rx->d);
	}
}

/* ---- connections (g_lock held) ---- */

static struct loop_listener *find_listener(const char *name, size_t len)
{
	for (struct dl *n = g_listeners.next; n != &g_listeners; n = n->next) {
		struct loop_listener *l = mp_container_of(n, struct loop_listener, node);

		if (l->name_len == len && !memcmp(l->name, name, len))
			return l;
	}
	return NULL;
}

static struct loop_conn *conn_new(struct loop_drv *d)
{
	struct loop_conn *c = calloc(1, sizeof(*c));

	if (!c)
		return NULL;
	c->d = d;
	dl_init(&c->node);
	dl_init(&c->cnode);
	return c;
}

/* Give @a a peer endpoint waiting on @l's backlog. */
static int attach(struct loop_conn *a, struct loop_listener *l)
{
	struct loop_conn *b = conn_new(l->d);

	if (!b)
		return -ENOMEM;
	b->state = CONN_OPEN;
	b->peer = a;
	a->peer = b;
	a->state = CONN_OPEN;
	dl_add_tail(&l->backlog, &b->node);
	signal_drv(l->d);
	return 0;
}

static void stop_connecting(struct loop_conn *c)
{
	if (c->state == CONN_CONNECTING) {
		dl_del(&c->cnode);
		c->d->nconnecting--;
	}
}

static void refuse(struct loop_conn *c)
{
	stop_connecting(c);
	c->state = CONN_REFUSED;
	mp_reqq_fail(&c->sendq, fail_req, -ECONNREFUSED);
	mp_reqq_fail(&c->recvq, fail_req, -ECONNREFUSED);
}

/* Refuse @d's connections whose listener did not appear in time. */
static void expire_connecting(struct loop_drv *d)
{
	if (!d->nconnecting)
		return;
	int64_t now = (int64_t)mp_now_ns();

	for (struct dl *n = d->conns.next; n != &d->conns;) {
		struct loop_conn *c = mp_container_of(n, struct loop_conn, node);

		n = n->next;
		if (c->state == CONN_CONNECTING && now >= c->deadline_ns) {
			MP_INFO("loop: nobody listens on " LOOP_PREFIX "%.*s", (int)c->target_len,
				c->target);
			refuse(c);
		}
	}
}

/* Earliest connect deadline of @d, or INT64_MAX. */
static int64_t next_deadline(struct loop_drv *d)
{
	int64_t t = INT64_MAX;

	if (!d->nconnecting)
		return t;
	for (struct dl *n = d->conns.next; n != &d->conns; n = n->next) {
		struct loop_conn *c = mp_container_of(n, struct loop_conn, node);

		if (c->state == CONN_CONNECTING && c->deadline_ns < t)
			t = c->deadline_ns;
	}
	return t;
}

/*
 * Tear down one endpoint: cancel what it has posted, reset its peer, wait
 * for copies that still read from or write to it, free it. May drop and
 * retake g_lock while waiting.
 */
static void conn_destroy(struct loop_conn *c)
{
	struct loop_conn *p = c->peer;

	stop_connecting(c);
	dl_del(&c->node);
	c->state = CONN_RESET;
	mp_reqq_fail(&c->sendq, fail_req, -ECANCELED);
	mp_reqq_fail(&c->recvq, fail_req, -ECANCELED);
	if (p) {
		p->peer = NULL;
		c->peer = NULL;
		p->state = CONN_RESET;
		mp_reqq_fail(&p->sendq, fail_req, -ECONNRESET);
		mp_reqq_fail(&p->recvq, fail_req, -ECONNRESET);
		signal_drv(p->d);
	}
	while (c->copies)
		pthread_cond_wait(&c->d->cv, &g_lock);
	free(c);
}

static void listener_destroy(struct loop_listener *l)
{
	dl_del(&l->node);
	dl_del(&l->dnode);
	/* Endpoints nobody accepted: their connectors see a reset. */
	while (!dl_empty(&l->backlog))
		conn_destroy(mp_container_of(l->backlog.next, struct loop_conn, node));
	free(l);
}

/* Post @r on @c (g_lock held). */
static void post(struct loop_conn *c, struct loop_req *r)
{
	if (c->state == CONN_CONNECTING)
		expire_connecting(c->d);
	switch (c->state) {
	case CONN_REFUSED:
		complete(r, -ECONNREFUSED, 0);
		return;
	case CONN_RESET:
		complete(r, -ECONNRESET, 0);
		return;
	case CONN_CONNECTING:
		mp_reqq_push(r->kind == REQ_SEND ? &c->sendq : &c->recvq, &r->link);
		return;
	default:
		mp_reqq_push(r->kind == REQ_SEND ? &c->sendq : &c->recvq, &r->link);
		pump(c, r->kind == REQ_SEND);
		return;
	}
}

/* ---- ops ---- */

static int loop_init(const struct mp_drv_params *p, struct mp_drv **out)
{
	struct loop_drv *d;
	pthread_condattr_t ca;
	const char *run = "moshpit";
	int rank = -1, timeout = LOOP_DEFAULT_CONNECT_MS;

	if (!out)
		return -EINVAL;
	/* Fields beyond what the caller's struct holds keep their defaults. */
	if (p) {
		if (p->size >= offsetof(struct mp_drv_params, run_name) + sizeof(p->run_name) &&
		    p->run_name && *p->run_name)
			run = p->run_name;
		if (p->size >= offsetof(struct mp_drv_params, rank) + sizeof(p->rank))
			rank = p->rank;
		if (p->size >= offsetof(struct mp_drv_params, connect_timeout_ms) +
				       sizeof(p->connect_timeout_ms))
			timeout = p->connect_timeout_ms;
	}
	d = calloc(1, sizeof(*d));
	if (!d)
		return -ENOMEM;
	d->base.ops = &mp_loop_driver_ops;
	d->rank = rank;
	d->connect_timeout_ms = timeout;
	snprintf(d->run, sizeof(d->run), "%s", run);
	dl_init(&d->conns);
	dl_init(&d->listeners);
	/* Requests come in blocks and are recycled: none is allocated per message. */
	d->reqs = MP_REQPOOL(struct loop_req, link, LOOP_REQ_BLOCK);
	/* Timed waits on the monotonic clock: wall-clock steps must not stretch them. */
	if (pthread_condattr_init(&ca)) {
		free(d);
		return -ENOMEM;
	}
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	if (pthread_cond_init(&d->cv, &ca)) {
		pthread_condattr_destroy(&ca);
		free(d);
		return -ENOMEM;
	}
	pthread_condattr_destroy(&ca);
	*out = &d->base;
	return 0;
}

static void loop_fini(struct mp_drv *dd)
{
	struct loop_drv *d = drv_of(dd);

	if (!d)
		return;
	pthread_mutex_lock(&g_lock);
	while (!dl_empty(&d->listeners))
		listener_destroy(mp_container_of(d->listeners.next, struct loop_listener, dnode));
	while (!dl_empty(&d->conns))
		conn_destroy(mp_container_of(d->conns.next, struct loop_conn, node));
	pthread_mutex_unlock(&g_lock);
	/*
	 * Nothing refers to d now: its endpoints and listeners are gone. Their
	 * queues were failed on the way, which completed (and so freed the
	 * bytes of) every injected request; what is left are requests the
	 * caller never tested, which own nothing.
	 */
	mp_reqpool_fini(&d->reqs);
	pthread_cond_destroy(&d->cv);
	free(d);
}

static int loop_query(struct mp_drv *d, struct mp_drv_caps *caps)
{
	(void)d;
	if (!caps)
		return -EINVAL;
	caps->flags = MP_DRV_CAP_ORDERED | MP_DRV_CAP_INPROC;
	caps->max_msg = LOOP_MAX_MSG;
	caps->default_streams = 1;
	return 0;
}

/* "loop:NAME" -> NAME and its length; -EINVAL unless 1..LOOP_NAME_MAX bytes. */
static int parse_text(const char *text, const char **name, size_t *len)
{
	if (!text || strncmp(text, LOOP_PREFIX, LOOP_PREFIX_LEN) != 0)
		return -EINVAL;
	*name = text + LOOP_PREFIX_LEN;
	*len = strlen(*name);
	if (*len == 0 || *len > LOOP_NAME_MAX)
		return -EINVAL;
	return 0;
}

static int loop_addr_parse(struct mp_drv *d, const char *text, void *blob, size_t *len)
{
	const char *name;
	size_t n;
	int rc;

	(void)d;
	if (!blob || !len)
		return -EINVAL;
	rc = parse_text(text, &name, &n);
	if (rc)
		return rc;
	memcpy(blob, name, n);
	*len = n;
	return 0;
}

static int loop_addr_format(struct mp_drv *d, const void *blob, size_t len, char *text, size_t cap)
{
	(void)d;
	if (!blob || len == 0 || len > LOOP_NAME_MAX || memchr(blob, '\0', len))
		return -EINVAL;
	if (!text || cap < LOOP_PREFIX_LEN + len + 1)
		return -ENOSPC;
	memcpy(text, LOOP_PREFIX, LOOP_PREFIX_LEN);
	memcpy(text + LOOP_PREFIX_LEN, blob, len);
	text[LOOP_PREFIX_LEN + len] = '\0';
	return 0;
}

static int loop_listen(struct mp_drv *dd, const char *bind, void *blob, size_t *len,
		       struct mp_drv_listener **out)
{
	struct loop_drv *d = drv_of(dd);
	struct loop_listener *l;
	const char *name = NULL;
	size_t n = 0;
	bool any = !bind || !strcmp(bind, LOOP_PREFIX) || !strcmp(bind, LOOP_PREFIX "*");

	if (!d || !out)
		return -EINVAL;
	if (!any) {
		int rc = parse_text(bind, &name, &n);

		if (rc)
			return rc;
	}
	l = calloc(1, sizeof(*l));
	if (!l)
		return -ENOMEM;
	l->d = d;
	dl_init(&l->backlog);

	pthread_mutex_lock(&g_lock);
	if (any) {
		/* "<run>.<rank>.<n>": readable in logs, unique in the process. */
		do {
			int k = snprintf(l->name, sizeof(l->name), "%.64s.%d.%lu", d->run, d->rank,
					 ++g_name_seq);

			l->name_len = (size_t)k < sizeof(l->name) ? (size_t)k : sizeof(l->name) - 1;
		} while (find_listener(l->name, l->name_len));
	} else {
		if (find_listener(name, n)) {
			pthread_mutex_unlock(&g_lock);
			free(l);
			return -EADDRINUSE;
		}
		memcpy(l->name, name, n);
		l->name[n] = '\0';
		l->name_len = n;
	}
	dl_add_tail(&g_listeners, &l->node);
	dl_add_tail(&d->listeners, &l->dnode);

	/* Connections that were made before this name was taken find it now. */
	for (struct dl *p = g_connecting.next; p != &g_connecting;) {
		struct loop_conn *c = mp_container_of(p, struct loop_conn, cnode);

		p = p->next;
		if (c->target_len == l->name_len && !memcmp(c->target, l->name, l->name_len)) {
			dl_del(&c->cnode);
			c->d->nconnecting--;
			if (attach(c, l)) {
				/* Out of memory: keep waiting; the deadline settles it. */
				dl_add_tail(&g_connecting, &c->cnode);
				c->d->nconnecting++;
			}
		}
	}
	pthread_mutex_unlock(&g_lock);

	if (blob)
		memcpy(blob, l->name, l->name_len);
	if (len)
		*len = l->name_len;
	MP_INFO("loop: listening on " LOOP_PREFIX "%s", l->name);
	*out = (struct mp_drv_listener *)l;
	return 0;
}

static int loop_accept(struct mp_drv_listener *ll, struct mp_drv_conn **out)
{
	struct loop_listener *l = lis_of(ll);
	struct loop_conn *c;

	if (!l || !out)
		return -EINVAL;
	pthread_mutex_lock(&g_lock);
	if (dl_empty(&l->backlog)) {
		pthread_mutex_unlock(&g_lock);
		return -EAGAIN;
	}
	c = mp_container_of(l->backlog.next, struct loop_conn, node);
	dl_del(&c->node);
	dl_add_tail(&c->d->conns, &c->node);
	pthread_mutex_unlock(&g_lock);
	*out = (struct mp_drv_conn *)c;
	return 0;
}

static void loop_close_listener(struct mp_drv_listener *ll)
{
	if (!ll)
		return;
	pthread_mutex_lock(&g_lock);
	listener_destroy(lis_of(ll));
	pthread_mutex_unlock(&g_lock);
}

static int loop_connect(struct mp_drv *dd, const void *blob, size_t len, struct mp_drv_conn **out)
{
	struct loop_drv *d = drv_of(dd);
	struct loop_listener *l;
	struct loop_conn *c;
	int rc = 0;

	if (!d || !out || !blob || len == 0 || len > LOOP_NAME_MAX)
		return -EINVAL;
	c = conn_new(d);
	if (!c)
		return -ENOMEM;
	pthread_mutex_lock(&g_lock);
	l = find_listener(blob, len);
	if (l) {
		rc = attach(c, l);
	} else if (d->connect_timeout_ms > 0) {
		c->state = CONN_CONNECTING;
		c->deadline_ns = (int64_t)mp_now_ns() + (int64_t)d->connect_timeout_ms * 1000000;
		memcpy(c->target, blob, len);
		c->target_len = len;
		dl_add_tail(&g_connecting, &c->cnode);
		d->nconnecting++;
	} else {
		c->state = CONN_REFUSED;
	}
	if (!rc)
		dl_add_tail(&d->conns, &c->node);
	pthread_mutex_unlock(&g_lock);
	if (rc) {
		free(c);
		return rc;
	}
	*out = (struct mp_drv_conn *)c;
	return 0;
}

static void loop_close(struct mp_drv_conn *cc)
{
	if (!cc)
		return;
	pthread_mutex_lock(&g_lock);
	conn_destroy(conn_of(cc));
	pthread_mutex_unlock(&g_lock);
}

static int loop_reg_mr(struct mp_drv *d, void *buf, size_t len, enum mp_mem_kind kind,
		       struct mp_drv_mr **out)
{
	(void)d;
	if (!out || (!buf && len))
		return -EINVAL;
	if (kind != MP_MEM_HOST)
		return -ENOTSUP;
	*out = &host_mr;
	return 0;
}

static void loop_dereg_mr(struct mp_drv *d, struct mp_drv_mr *mr)
{
	(void)d;
	(void)mr;
}

static int loop_isend(struct mp_drv_conn *cc, const struct mp_iov *iov, int iovcnt,
		      struct mp_drv_mr *mr, struct mp_drv_req **out)
{
	struct loop_conn *c = conn_of(cc);
	struct loop_req *r;
	size_t total = 0;

	(void)mr;
	if (!c || !out || iovcnt < 0 || iovcnt > MP_DRV_IOV_MAX || (iovcnt && !iov))
		return -EINVAL;
	for (int i = 0; i < iovcnt; i++) {
		if (!iov[i].base && iov[i].len)
			return -EINVAL;
		if (iov[i].len > LOOP_MAX_MSG - total)
			return -EMSGSIZE;
		total += iov[i].len;
	}
	pthread_mutex_lock(&g_lock);
	r = req_get(c->d);
	if (!r) {
		pthread_mutex_unlock(&g_lock);
		return -ENOMEM;
	}
	r->kind = REQ_SEND;
	r->iovcnt = iovcnt;
	for (int i = 0; i < iovcnt; i++)
		r->iov[i] = iov[i];
	r->len = total;
	post(c, r);
	pthread_mutex_unlock(&g_lock);
	*out = (struct mp_drv_req *)r;
	return 0;
}

static int loop_irecv(struct mp_drv_conn *cc, void *buf, size_t cap, struct mp_drv_mr *mr,
		      struct mp_drv_req **out)
{
	struct loop_conn *c = conn_of(cc);
	struct loop_req *r;

	(void)mr;
	if (!c || !out || (!buf && cap))
		return -EINVAL;
	pthread_mutex_lock(&g_lock);
	r = req_get(c->d);
	if (!r) {
		pthread_mutex_unlock(&g_lock);
		return -ENOMEM;
	}
	r->kind = REQ_RECV;
	r->buf = buf;
	r->len = cap;
	post(c, r);
	pthread_mutex_unlock(&g_lock);
	*out = (struct mp_drv_req *)r;
	return 0;
}

static int loop_test(struct mp_drv_req *rr, int *done, size_t *nbytes)
{
	struct loop_req *r = req_of(rr);
	int err;

	if (!r || !done)
		return -EINVAL;
	/* Polling an unfinished request takes no lock. */
	if (!atomic_load_explicit(&r->done, memory_order_acquire)) {
		*done = 0;
		return 0;
	}
	pthread_mutex_lock(&g_lock);
	err = r->err;
	if (nbytes)
		*nbytes = r->nbytes;
	req_put(r);
	pthread_mutex_unlock(&g_lock);
	*done = 1;
	return err;
}

/* timeout_ms < 0 waits until an event. */
static int loop_progress(struct mp_drv *dd, int timeout_ms)
{
	struct loop_drv *d = drv_of(dd);
	int64_t until = INT64_MAX;

	if (!d)
		return -EINVAL;
	if (timeout_ms > 0)
		until = (int64_t)mp_now_ns() + (int64_t)timeout_ms * 1000000;
	pthread_mutex_lock(&g_lock);
	expire_connecting(d);
	while (!d->events && timeout_ms != 0) {
		int64_t t = next_deadline(d);
		int64_t now;

		if (until < t)
			t = until;
		if (t == INT64_MAX) {
			pthread_cond_wait(&d->cv, &g_lock);
		} else {
			struct timespec ts = {.tv_sec = t / 1000000000, .tv_nsec = t % 1000000000};

			pthread_cond_timedwait(&d->cv, &g_lock, &ts);
		}
		expire_connecting(d);
		now = (int64_t)mp_now_ns();
		if (now >= until)
			break;
	}
	d->events = false;
	pthread_mutex_unlock(&g_lock);
	return 0;
}

static void loop_wake(struct mp_drv *dd)
{
	struct loop_drv *d = drv_of(dd);

	if (!d)
		return;
	pthread_mutex_lock(&g_lock);
	signal_drv(d);
	pthread_mutex_unlock(&g_lock);
}

/*
 * Test hook: deliver @len raw bytes to the peer of @cc as if they had been
 * sent, without a request for the caller to test. For feeding the core
 * garbage and truncated frames. Returns 0, -ENOTCONN when the connection is
 * refused or reset, -EMSGSIZE, -EINVAL or -ENOMEM.
 */
int mp_loop_inject(struct mp_drv_conn *cc, const void *bytes, size_t len);

int mp_loop_inject(struct mp_drv_conn *cc, const void *bytes, size_t len)
{
	struct loop_conn *c = conn_of(cc);
	struct loop_req *r;
	void *copy;

	if (!c || (!bytes && len))
		return -EINVAL;
	if (len > LOOP_MAX_MSG)
		return -EMSGSIZE;
	copy = malloc(len ? len : 1);
	if (!copy)
		return -ENOMEM;
	if (len)
		memcpy(copy, bytes, len);
	pthread_mutex_lock(&g_lock);
	if (c->state == CONN_REFUSED || c->state == CONN_RESET) {
		pthread_mutex_unlock(&g_lock);
		free(copy);
		return -ENOTCONN;
	}
	r = req_get(c->d);
	if (!r) {
		pthread_mutex_unlock(&g_lock);
		free(copy);
		return -ENOMEM;
	}
	r->kind = REQ_SEND;
	r->internal = true;
	r->owned = copy;
	r->iovcnt = 1;
	r->iov[0].base = copy;
	r->iov[0].len = len;
	r->len = len;
	post(c, r);
	pthread_mutex_unlock(&g_lock);
	return 0;
}

const struct mp_driver_ops mp_loop_driver_ops = {
	.size = sizeof(struct mp_driver_ops),
	.abi = MP_DRIVER_ABI,
	.name = "loop",
	.init = loop_init,
	.fini = loop_fini,
	.query = loop_query,
	.addr_parse = loop_addr_parse,
	.addr_format = loop_addr_format,
	.listen = loop_listen,
	.accept = loop_accept,
	.close_listener = loop_close_listener,
	.connect = loop_connect,
	.close = loop_close,
	.reg_mr = loop_reg_mr,
	.dereg_mr = loop_dereg_mr,
	.isend = loop_isend,
	.irecv = loop_irecv,
	.test = loop_test,
	.progress = loop_progress,
	.wake = loop_wake,
	/* A unique name in this process's registry. */
	.default_listen = LOOP_PREFIX "*",
};
