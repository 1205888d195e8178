/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The loop driver through its ops table only, as the core uses it: two and
 * eight instances in threads, ordering, size errors, refusal, resets, wake
 * and bounded waits. Every wait here has a deadline so a bug fails the test
 * instead of hanging it.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <moshpit/driver.h>

extern const struct mp_driver_ops mp_loop_driver_ops;
extern int mp_loop_inject(struct mp_drv_conn *c, const void *bytes, size_t len);

static const struct mp_driver_ops *ops = &mp_loop_driver_ops;

#define WAIT_MS 5000

static int64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_ms(int ms)
{
	struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000};

	nanosleep(&ts, NULL);
}

static struct mp_drv *new_drv(int rank, int connect_timeout_ms)
{
	struct mp_drv_params p = {
		.size = sizeof(p),
		.run_name = "t",
		.rank = rank,
		.connect_timeout_ms = connect_timeout_ms,
	};
	struct mp_drv *d = NULL;

	assert_int_equal(ops->init(&p, &d), 0);
	assert_non_null(d);
	assert_ptr_equal(d->ops, ops);
	return d;
}

/*
 * Test and progress until @r completes; -ETIME (never a driver result here)
 * if it does not within WAIT_MS. Usable from any thread.
 */
static int wait_req(struct mp_drv *d, struct mp_drv_req *r, size_t *nbytes)
{
	int64_t end = now_ms() + WAIT_MS;

	for (;;) {
		int done = 0;
		int rc = ops->test(r, &done, nbytes);

		if (done)
			return rc;
		if (now_ms() > end)
			return -ETIME;
		ops->progress(d, 20);
	}
}

/* Main-thread wrapper that insists on completion. */
static int wait_ok(struct mp_drv *d, struct mp_drv_req *r, size_t *nbytes)
{
	int rc = wait_req(d, r, nbytes);

	assert_int_not_equal(rc, -ETIME);
	return rc;
}

static struct mp_drv_conn *accept_one(struct mp_drv *d, struct mp_drv_listener *l)
{
	int64_t end = now_ms() + WAIT_MS;
	struct mp_drv_conn *c = NULL;

	for (;;) {
		int rc = ops->accept(l, &c);

		if (rc == 0)
			return c;
		if (rc != -EAGAIN || now_ms() > end)
			return NULL;
		ops->progress(d, 20);
	}
}

/* A connected pair: @a on instance @da, @b on instance @db (whose listener is kept). */
static void make_pair(struct mp_drv *da, struct mp_drv *db, struct mp_drv_listener **lb,
		      struct mp_drv_conn **a, struct mp_drv_conn **b)
{
	unsigned char blob[MP_DRV_ADDR_MAX];
	size_t len = 0;

	assert_int_equal(ops->listen(db, NULL, blob, &len, lb), 0);
	assert_int_equal(ops->connect(da, blob, len, a), 0);
	*b = accept_one(db, *lb);
	assert_non_null(*b);
}

static void fill(unsigned char *p, size_t n, unsigned seed)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (unsigned char)(seed * 131u + i * 7u + (i >> 8));
}

static int check(const unsigned char *p, size_t n, unsigned seed)
{
	for (size_t i = 0; i < n; i++)
		if (p[i] != (unsigned char)(seed * 131u + i * 7u + (i >> 8)))
			return 0;
	return 1;
}

/* ---- single-thread tests ---- */

static void test_addresses_and_caps(void **state)
{
	struct mp_drv *d = new_drv(0, 0);
	unsigned char blob[MP_DRV_ADDR_MAX];
	char text[MP_ADDR_STRLEN], longname[200];
	size_t len = 0;
	struct mp_drv_caps caps;
	struct mp_drv_mr *mr = NULL;
	char buf[16];

	(void)state;
	assert_string_equal(ops->name, "loop");
	assert_int_equal(ops->abi, MP_DRIVER_ABI);
	assert_int_equal(ops->size, sizeof(struct mp_driver_ops));

	assert_int_equal(ops->addr_parse(d, "loop:alpha", blob, &len), 0);
	assert_int_equal(len, 5);
	assert_memory_equal(blob, "alpha", 5);
	assert_int_equal(ops->addr_format(d, blob, len, text, sizeof(text)), 0);
	assert_string_equal(text, "loop:alpha");
	assert_int_equal(ops->addr_format(d, blob, len, text, 10), -ENOSPC);
	assert_int_equal(ops->addr_format(d, blob, len, text, 11), 0);
	assert_int_equal(ops->addr_parse(d, "tcp:alpha", blob, &len), -EINVAL);
	assert_int_equal(ops->addr_parse(d, "127.0.0.1:5000", blob, &len), -EINVAL);
	assert_int_equal(ops->addr_parse(d, "loop:", blob, &len), -EINVAL);
	assert_int_equal(ops->addr_parse(d, NULL, blob, &len), -EINVAL);
	memcpy(longname, "loop:", 5);
	memset(longname + 5, 'x', 100);
	longname[105] = '\0';
	assert_int_equal(ops->addr_parse(d, longname, blob, &len), 0);
	assert_int_equal(len, 100);
	longname[105] = 'x';
	longname[106] = '\0';
	assert_int_equal(ops->addr_parse(d, longname, blob, &len), -EINVAL);
	assert_int_equal(ops->addr_format(d, "a\0b", 3, text, sizeof(text)), -EINVAL);

	assert_int_equal(ops->query(d, &caps), 0);
	assert_int_equal(caps.flags, MP_DRV_CAP_ORDERED | MP_DRV_CAP_INPROC);
	assert_int_equal(caps.max_msg, (size_t)1 << 30);
	assert_int_equal(caps.default_streams, 1);

	assert_int_equal(ops->reg_mr(d, buf, sizeof(buf), MP_MEM_HOST, &mr), 0);
	assert_non_null(mr);
	ops->dereg_mr(d, mr);
	assert_int_equal(ops->reg_mr(d, buf, sizeof(buf), MP_MEM_CUDA, &mr), -ENOTSUP);
	assert_int_equal(ops->reg_mr(d, buf, sizeof(buf), MP_MEM_DMABUF, &mr), -ENOTSUP);
	ops->fini(d);
}

static void test_listen_names(void **state)
{
	struct mp_drv *d1 = new_drv(0, 0), *d2 = new_drv(1, 0);
	struct mp_drv_listener *l1, *l2, *l3, *l4;
	unsigned char b1[MP_DRV_ADDR_MAX], b2[MP_DRV_ADDR_MAX];
	size_t n1 = 0, n2 = 0;

	(void)state;
	assert_int_equal(ops->listen(d1, "loop:alpha", b1, &n1, &l1), 0);
	assert_int_equal(n1, 5);
	assert_memory_equal(b1, "alpha", 5);
	/* The registry is process-wide: another instance cannot take the name. */
	assert_int_equal(ops->listen(d2, "loop:alpha", b2, &n2, &l2), -EADDRINUSE);
	assert_int_equal(ops->listen(d1, "alpha", b2, &n2, &l2), -EINVAL);
	assert_int_equal(ops->listen(d1, "127.0.0.1:0", b2, &n2, &l2), -EINVAL);
	/* Automatic names never collide. */
	assert_int_equal(ops->listen(d1, "loop:", b1, &n1, &l2), 0);
	assert_int_equal(ops->listen(d2, "loop:*", b2, &n2, &l3), 0);
	assert_false(n1 == n2 && !memcmp(b1, b2, n1));
	assert_int_equal(ops->listen(d2, NULL, b2, &n2, &l4), 0);
	ops->close_listener(l1);
	/* A closed name is free again. */
	assert_int_equal(ops->listen(d2, "loop:alpha", b2, &n2, &l1), 0);
	ops->close_listener(l1);
	ops->close_listener(l2);
	/* l3, l4 are closed by fini. */
	ops->fini(d1);
	ops->fini(d2);
}

static void test_exchange_single_thread(void **state)
{
	struct mp_drv *da = new_drv(0, 0), *db = new_drv(1, 0);
	struct mp_drv_listener *lb;
	struct mp_drv_conn *a, *b;
	struct mp_drv_req *rs, *rr;
	unsigned char sbuf[1000], rbuf[2000];
	size_t n = 0;
	struct mp_iov iov[2];

	(void)state;
	make_pair(da, db, &lb, &a, &b);
	assert_int_equal(ops->accept(lb, &b), -EAGAIN);

	/* Receive posted first, then the send. */
	fill(sbuf, sizeof(sbuf), 1);
	assert_int_equal(ops->irecv(b, rbuf, sizeof(rbuf), NULL, &rr), 0);
	iov[0] = (struct mp_iov){sbuf, 1000};
	assert_int_equal(ops->isend(a, iov, 1, NULL, &rs), 0);
	assert_int_equal(wait_ok(db, rr, &n), 0);
	assert_int_equal(n, 1000); /* shorter than the buffer: its length is reported */
	assert_true(check(rbuf, 1000, 1));
	assert_int_equal(wait_ok(da, rs, &n), 0);
	assert_int_equal(n, 1000);

	/* Send posted first, in two pieces; the receiver sees one message. */
	iov[0] = (struct mp_iov){sbuf, 300};
	iov[1] = (struct mp_iov){sbuf + 300, 700};
	assert_int_equal(ops->isend(a, iov, 2, NULL, &rs), 0);
	memset(rbuf, 0, sizeof(rbuf));
	assert_int_equal(ops->irecv(b, rbuf, 1000, NULL, &rr), 0);
	assert_int_equal(wait_ok(db, rr, &n), 0);
	assert_int_equal(n, 1000);
	assert_true(check(rbuf, 1000, 1));
	assert_int_equal(wait_ok(da, rs, NULL), 0);

	/* Empty messages and the other direction. */
	assert_int_equal(ops->isend(b, NULL, 0, NULL, &rs), 0);
	assert_int_equal(ops->irecv(a, NULL, 0, NULL, &rr), 0);
	assert_int_equal(wait_ok(da, rr, &n), 0);
	assert_int_equal(n, 0);
	assert_int_equal(wait_ok(db, rs, NULL), 0);

	/* Bad arguments. */
	iov[0] = (struct mp_iov){sbuf, 1};
	assert_int_equal(ops->isend(a, iov, 3, NULL, &rs), -EINVAL);
	assert_int_equal(ops->isend(a, iov, -1, NULL, &rs), -EINVAL);
	iov[0] = (struct mp_iov){sbuf, ((size_t)1 << 30) + 1};
	assert_int_equal(ops->isend(a, iov, 1, NULL, &rs), -EMSGSIZE);

	ops->close(a);
	ops->close(b);
	ops->close_listener(lb);
	ops->fini(da);
	ops->fini(db);
}

static void test_ordering_and_emsgsize(void **state)
{
	enum { K = 200 };
	struct mp_drv *da = new_drv(0, 0), *db = new_drv(1, 0);
	struct mp_drv_listener *lb;
	struct mp_drv_conn *a, *b;
	struct mp_drv_req *rs[K], *rr[K];
	static unsigned char sbuf[K][64], rbuf[K][64];
	size_t n;

	(void)state;
	make_pair(da, db, &lb, &a, &b);
	/* All sends queue before any receive exists... */
	for (int i = 0; i < K; i++) {
		struct mp_iov iov = {sbuf[i], (size_t)(i % 64) + 1};

		fill(sbuf[i], sizeof(sbuf[i]), (unsigned)i);
		assert_int_equal(ops->isend(a, &iov, 1, NULL, &rs[i]), 0);
	}
	/* ...and are received in posting order. */
	for (int i = 0; i < K; i++)
		assert_int_equal(ops->irecv(b, rbuf[i], 64, NULL, &rr[i]), 0);
	for (int i = 0; i < K; i++) {
		assert_int_equal(wait_ok(db, rr[i], &n), 0);
		assert_int_equal(n, (size_t)(i % 64) + 1);
		assert_true(check(rbuf[i], n, (unsigned)i));
		assert_int_equal(wait_ok(da, rs[i], NULL), 0);
	}

	/* Too long for the receive: both sides get -EMSGSIZE, the next one flows. */
	struct mp_iov big = {sbuf[0], 64}, small = {sbuf[1], 10};

	assert_int_equal(ops->irecv(b, rbuf[0], 63, NULL, &rr[0]), 0);
	assert_int_equal(ops->irecv(b, rbuf[1], 63, NULL, &rr[1]), 0);
	assert_int_equal(ops->isend(a, &big, 1, NULL, &rs[0]), 0);
	assert_int_equal(ops->isend(a, &small, 1, NULL, &rs[1]), 0);
	assert_int_equal(wait_ok(db, rr[0], NULL), -EMSGSIZE);
	assert_int_equal(wait_ok(da, rs[0], NULL), -EMSGSIZE);
	assert_int_equal(wait_ok(db, rr[1], &n), 0);
	assert_int_equal(n, 10);
	assert_true(check(rbuf[1], 10, 1));
	assert_int_equal(wait_ok(da, rs[1], NULL), 0);

	ops->close_listener(lb);
	ops->fini(da); /* closes a; b sees a reset */
	ops->fini(db);
}

static void test_refused(void **state)
{
	struct mp_drv *d = new_drv(0, 0);
	struct mp_drv *dt = new_drv(1, 100);
	struct mp_drv_conn *c;
	struct mp_drv_req *r1, *r2;
	unsigned char buf[8] = {0};
	struct mp_iov iov = {buf, 8};
	int64_t t0;

	(void)state;
	/* Timeout 0: refused at once, but the connection object exists. */
	assert_int_equal(ops->connect(d, "nobody", 6, &c), 0);
	assert_int_equal(ops->isend(c, &iov, 1, NULL, &r1), 0);
	assert_int_equal(ops->irecv(c, buf, 8, NULL, &r2), 0);
	assert_int_equal(wait_ok(d, r1, NULL), -ECONNREFUSED);
	assert_int_equal(wait_ok(d, r2, NULL), -ECONNREFUSED);
	assert_int_equal(mp_loop_inject(c, buf, 8), -ENOTCONN);
	ops->close(c);

	/* Timeout 100 ms: requests wait for a listener, then fail. */
	t0 = now_ms();
	assert_int_equal(ops->connect(dt, "nobody", 6, &c), 0);
	assert_int_equal(ops->isend(c, &iov, 1, NULL, &r1), 0);
	assert_int_equal(wait_ok(dt, r1, NULL), -ECONNREFUSED);
	assert_true(now_ms() - t0 >= 90);
	assert_true(now_ms() - t0 < 3000);
	ops->close(c);

	assert_int_equal(ops->connect(d, "", 0, &c), -EINVAL);
	ops->fini(d);
	ops->fini(dt);
}

/* A connection made before the listener exists completes when it appears. */
static void test_late_listener(void **state)
{
	struct mp_drv *da = new_drv(0, 5000), *db = new_drv(1, 0);
	struct mp_drv_listener *l;
	struct mp_drv_conn *a, *b;
	struct mp_drv_req *rs, *rr;
	unsigned char sbuf[100], rbuf[100], blob[MP_DRV_ADDR_MAX];
	struct mp_iov iov = {sbuf, 100};
	size_t n = 0;

	(void)state;
	fill(sbuf, 100, 9);
	assert_int_equal(ops->connect(da, "late", 4, &a), 0);
	assert_int_equal(ops->isend(a, &iov, 1, NULL, &rs), 0);
	ops->progress(da, 10);
	assert_int_equal(ops->listen(db, "loop:late", blob, &n, &l), 0);
	b = accept_one(db, l);
	assert_non_null(b);
	assert_int_equal(ops->irecv(b, rbuf, 100, NULL, &rr), 0);
	assert_int_equal(wait_ok(db, rr, &n), 0);
	assert_int_equal(n, 100);
	assert_true(check(rbuf, 100, 9));
	assert_int_equal(wait_ok(da, rs, NULL), 0);
	ops->fini(da);
	ops->fini(db);
}

static void test_close_resets_peer(void **state)
{
	struct mp_drv *da = new_drv(0, 0), *db = new_drv(1, 0);
	struct mp_drv_listener *lb;
	struct mp_drv_conn *a, *b, *c;
	struct mp_drv_req *ra1, *ra2, *rb1, *rb2, *r;
	unsigned char buf[32] = {0}, blob[MP_DRV_ADDR_MAX];
	struct mp_iov iov = {buf, 32};
	size_t n = 0;

	(void)state;
	make_pair(da, db, &lb, &a, &b);
	assert_int_equal(ops->irecv(a, buf, 32, NULL, &ra1), 0); /* the peer's posted receive */
	assert_int_equal(ops->isend(a, &iov, 1, NULL, &ra2), 0); /* is matched below */
	assert_int_equal(ops->irecv(b, buf, 32, NULL, &rb1), 0);
	assert_int_equal(wait_ok(db, rb1, NULL), 0);
	assert_int_equal(wait_ok(da, ra2, NULL), 0);
	assert_int_equal(ops->irecv(b, buf, 32, NULL, &rb1), 0);
	assert_int_equal(ops->irecv(b, buf, 32, NULL, &rb2), 0);
	ops->close(b);
	/* b's posted requests were cancelled; they can still be tested. */
	assert_int_equal(wait_ok(db, rb1, NULL), -ECANCELED);
	assert_int_equal(wait_ok(db, rb2, NULL), -ECANCELED);
	/* a's posted and future requests fail with -ECONNRESET. */
	assert_int_equal(wait_ok(da, ra1, NULL), -ECONNRESET);
	assert_int_equal(ops->isend(a, &iov, 1, NULL, &r), 0);
	assert_int_equal(wait_ok(da, r, NULL), -ECONNRESET);
	assert_int_equal(ops->irecv(a, buf, 32, NULL, &r), 0);
	assert_int_equal(wait_ok(da, r, NULL), -ECONNRESET);
	ops->close(a);

	/* A connection nobody accepted is reset when its listener closes. */
	assert_int_equal(ops->listen(db, "loop:doomed", blob, &n, &lb), 0);
	assert_int_equal(ops->connect(da, blob, n, &c), 0);
	assert_int_equal(ops->irecv(c, buf, 32, NULL, &r), 0);
	ops->close_listener(lb);
	assert_int_equal(wait_ok(da, r, NULL), -ECONNRESET);
	ops->close(c);

	/* fini with live connections resets their peers, and frees everything. */
	make_pair(da, db, &lb, &a, &b);
	assert_int_equal(ops->irecv(a, buf, 32, NULL, &r), 0);
	assert_int_equal(ops->isend(b, &iov, 1, NULL, &ra1), 0);
	assert_int_equal(ops->isend(b, &iov, 1, NULL, &ra2), 0); /* left unmatched */
	ops->fini(db);
	assert_int_equal(wait_ok(da, r, NULL), 0); /* delivered before the fini */
	assert_int_equal(ops->irecv(a, buf, 32, NULL, &r), 0);
	assert_int_equal(wait_ok(da, r, NULL), -ECONNRESET);
	ops->fini(da);
}

static void test_inject(void **state)
{
	struct mp_drv *da = new_drv(0, 0), *db = new_drv(1, 0);
	struct mp_drv_listener *lb;
	struct mp_drv_conn *a, *b;
	struct mp_drv_req *r;
	unsigned char garbage[77], rbuf[100];
	size_t n = 0;

	(void)state;
	make_pair(da, db, &lb, &a, &b);
	fill(garbage, sizeof(garbage), 3);
	assert_int_equal(mp_loop_inject(a, garbage, sizeof(garbage)), 0);
	memset(garbage, 0, sizeof(garbage)); /* the bytes were copied */
	assert_int_equal(mp_loop_inject(a, garbage, 0), 0);
	assert_int_equal(ops->irecv(b, rbuf, sizeof(rbuf), NULL, &r), 0);
	assert_int_equal(wait_ok(db, r, &n), 0);
	assert_int_equal(n, 77);
	assert_true(check(rbuf, 77, 3));
	assert_int_equal(ops->irecv(b, rbuf, sizeof(rbuf), NULL, &r), 0);
	assert_int_equal(wait_ok(db, r, &n), 0);
	assert_int_equal(n, 0);
	/* An injected message left unreceived is freed by fini. */
	assert_int_equal(mp_loop_inject(b, rbuf, 10), 0);
	ops->fini(da);
	ops->fini(db);
}

/* ---- wake and bounded waits ---- */

struct waker {
	struct mp_drv *d;
	int delay_ms;
};

static void *wake_later(void *arg)
{
	struct waker *w = arg;

	sleep_ms(w->delay_ms);
	ops->wake(w->d);
	return NULL;
}

static void test_wake_and_timeouts(void **state)
{
	struct mp_drv *d = new_drv(0, 0);
	struct waker w = {d, 50};
	pthread_t t;
	int64_t t0, dt;

	(void)state;
	/* Nothing happens: progress(0) returns at once, progress(60) after ~60 ms. */
	t0 = now_ms();
	assert_int_equal(ops->progress(d, 0), 0);
	assert_true(now_ms() - t0 < 50);
	t0 = now_ms();
	assert_int_equal(ops->progress(d, 60), 0);
	dt = now_ms() - t0;
	assert_true(dt >= 55 && dt < 2000);

	/* wake() from another thread ends an unbounded wait. */
	assert_int_equal(pthread_create(&t, NULL, wake_later, &w), 0);
	t0 = now_ms();
	assert_int_equal(ops->progress(d, -1), 0);
	dt = now_ms() - t0;
	assert_true(dt >= 40 && dt < 2000);
	pthread_join(t, NULL);

	/* A wake that comes before the wait is not lost. */
	ops->wake(d);
	t0 = now_ms();
	assert_int_equal(ops->progress(d, 5000), 0);
	assert_true(now_ms() - t0 < 1000);
	ops->fini(d);
}

/* A completion made by another instance's thread wakes this instance. */
struct late_sender {
	struct mp_drv *d;
	struct mp_drv_conn *c;
	int rc;
};

static void *send_later(void *arg)
{
	struct late_sender *s = arg;
	static unsigned char msg[256];
	struct mp_iov iov = {msg, sizeof(msg)};
	struct mp_drv_req *r;

	fill(msg, sizeof(msg), 5);
	sleep_ms(50);
	s->rc = ops->isend(s->c, &iov, 1, NULL, &r);
	if (!s->rc)
		s->rc = wait_req(s->d, r, NULL);
	return NULL;
}

static void test_cross_thread_completion_wakes(void **state)
{
	struct mp_drv *da = new_drv(0, 0), *db = new_drv(1, 0);
	struct mp_drv_listener *lb;
	struct mp_drv_conn *a, *b;
	struct mp_drv_req *r;
	unsigned char rbuf[256];
	struct late_sender s;
	pthread_t t;
	int64_t t0;
	int done = 0;
	size_t n = 0;

	(void)state;
	make_pair(da, db, &lb, &a, &b);
	ops->progress(db, 0); /* consume the new-connection event */
	assert_int_equal(ops->irecv(b, rbuf, sizeof(rbuf), NULL, &r), 0);
	s = (struct late_sender){da, a, -1};
	assert_int_equal(pthread_create(&t, NULL, send_later, &s), 0);
	t0 = now_ms();
	assert_int_equal(ops->progress(db, 5000), 0);
	assert_true(now_ms() - t0 < 2000);
	assert_int_equal(ops->test(r, &done, &n), 0);
	assert_int_equal(done, 1);
	assert_int_equal(n, 256);
	assert_true(check(rbuf, 256, 5));
	pthread_join(t, NULL);
	assert_int_equal(s.rc, 0);
	ops->fini(da);
	ops->fini(db);
}

/* ---- threads ---- */

/* First failure inside a worker thread (cmocka asserts belong to the main thread). */
#define T_CHECK(ctx, cond)                                                   \
	do {                                                                 \
		if (!(cond)) {                                               \
			snprintf((ctx)->err, sizeof((ctx)->err), "%s:%d: %s", \
				 __FILE__, __LINE__, #cond);                 \
			return NULL;                                         \
		}                                                            \
	} while (0)

struct pp {
	struct mp_drv *d;
	struct mp_drv_conn *c;
	int server;
	char err[200];
};

enum { PP_ROUNDS = 2000, PP_MAX = 9000 };

/* Ping-pong: the client sends message i, the server echoes it back. */
static void *pingpong(void *arg)
{
	struct pp *p = arg;
	unsigned char *sbuf = malloc(PP_MAX), *rbuf = malloc(PP_MAX);

	T_CHECK(p, sbuf && rbuf);
	for (int i = 0; i < PP_ROUNDS; i++) {
		size_t len = (size_t)(i * 7919) % PP_MAX, n = 0;
		struct mp_drv_req *rs, *rr;
		struct mp_iov iov = {sbuf, len};

		if (!p->server) {
			fill(sbuf, len, (unsigned)i);
			T_CHECK(p, ops->isend(p->c, &iov, 1, NULL, &rs) == 0);
			T_CHECK(p, ops->irecv(p->c, rbuf, PP_MAX, NULL, &rr) == 0);
			T_CHECK(p, wait_req(p->d, rs, NULL) == 0);
			T_CHECK(p, wait_req(p->d, rr, &n) == 0);
			T_CHECK(p, n == len && check(rbuf, n, (unsigned)i));
		} else {
			T_CHECK(p, ops->irecv(p->c, rbuf, PP_MAX, NULL, &rr) == 0);
			T_CHECK(p, wait_req(p->d, rr, &n) == 0);
			T_CHECK(p, n == len && check(rbuf, n, (unsigned)i));
			iov.base = rbuf;
			iov.len = n;
			T_CHECK(p, ops->isend(p->c, &iov, 1, NULL, &rs) == 0);
			T_CHECK(p, wait_req(p->d, rs, NULL) == 0);
		}
	}
	free(sbuf);
	free(rbuf);
	return NULL;
}

static void test_two_threads_pingpong(void **state)
{
	struct mp_drv *da = new_drv(0, 0), *db = new_drv(1, 0);
	struct mp_drv_listener *lb;
	struct mp_drv_conn *a, *b;
	struct pp pa = {0}, pb = {0};
	pthread_t ta, tb;

	(void)state;
	make_pair(da, db, &lb, &a, &b);
	pa = (struct pp){.d = da, .c = a, .server = 0};
	pb = (struct pp){.d = db, .c = b, .server = 1};
	assert_int_equal(pthread_create(&ta, NULL, pingpong, &pa), 0);
	assert_int_equal(pthread_create(&tb, NULL, pingpong, &pb), 0);
	pthread_join(ta, NULL);
	pthread_join(tb, NULL);
	if (pa.err[0])
		fail_msg("client: %s", pa.err);
	if (pb.err[0])
		fail_msg("server: %s", pb.err);
	ops->fini(da);
	ops->fini(db);
}

enum { MESH = 8, MESH_MSGS = 150, MESH_WIN = 6, MESH_MAX = 3000 };

struct mesh_peer {
	int rank;
	struct mp_drv *d;
	struct mp_drv_listener *l;
	unsigned char blob[MP_DRV_ADDR_MAX];
	size_t blob_len;
	struct mp_drv_conn *conn[MESH];
	pthread_barrier_t *bar;
	struct mesh_peer *all;
	void *bufs;
	char err[200];
};

static size_t mesh_len(int src, int dst, int seq)
{
	return (size_t)(seq * 977 + src * 131 + dst * 17) % MESH_MAX;
}

static unsigned mesh_seed(int src, int dst, int seq)
{
	return (unsigned)(src * 100000 + dst * 1000 + seq);
}

/*
 * Full mesh: connect to higher ranks (announcing our rank in a hello),
 * accept the lower ones, then stream MESH_MSGS messages each way on every
 * connection with MESH_WIN in flight, checking length, content and order.
 */
static void *mesh_worker(void *arg)
{
	struct mesh_peer *p = arg;
	struct mp_drv_req *sreq[MESH][MESH_WIN], *rreq[MESH][MESH_WIN];
	struct mesh_bufs {
		unsigned char s[MESH][MESH_WIN][MESH_MAX];
		unsigned char r[MESH][MESH_WIN][MESH_MAX];
	} *bufs = malloc(sizeof(*bufs));
	int32_t hello = p->rank;
	struct mp_iov iov = {&hello, sizeof(hello)};

	T_CHECK(p, bufs != NULL);
	p->bufs = bufs; /* freed by the main thread, whatever happens here */

	for (int j = p->rank + 1; j < MESH; j++) {
		struct mp_drv_req *r;

		T_CHECK(p, ops->connect(p->d, p->all[j].blob, p->all[j].blob_len, &p->conn[j]) == 0);
		T_CHECK(p, ops->isend(p->conn[j], &iov, 1, NULL, &r) == 0);
		sreq[j][0] = r;
	}
	for (int k = 0; k < p->rank; k++) {
		struct mp_drv_conn *c = accept_one(p->d, p->l);
		struct mp_drv_req *r;
		int32_t who = -1;
		size_t n = 0;

		T_CHECK(p, c != NULL);
		T_CHECK(p, ops->irecv(c, &who, sizeof(who), NULL, &r) == 0);
		T_CHECK(p, wait_req(p->d, r, &n) == 0);
		T_CHECK(p, n == sizeof(who) && who >= 0 && who < p->rank && !p->conn[who]);
		p->conn[who] = c;
	}
	for (int j = p->rank + 1; j < MESH; j++)
		T_CHECK(p, wait_req(p->d, sreq[j][0], NULL) == 0);

	for (int base = 0; base < MESH_MSGS; base += MESH_WIN) {
		int w = MESH_MSGS - base < MESH_WIN ? MESH_MSGS - base : MESH_WIN;

		for (int j = 0; j < MESH; j++) {
			if (j == p->rank)
				continue;
			for (int s = 0; s < w; s++) {
				int seq = base + s;
				struct mp_iov v = {bufs->s[j][s], mesh_len(p->rank, j, seq)};

				fill(bufs->s[j][s], v.len, mesh_seed(p->rank, j, seq));
				T_CHECK(p, ops->irecv(p->conn[j], bufs->r[j][s], MESH_MAX, NULL,
						      &rreq[j][s]) == 0);
				T_CHECK(p, ops->isend(p->conn[j], &v, 1, NULL, &sreq[j][s]) == 0);
			}
		}
		for (int j = 0; j < MESH; j++) {
			if (j == p->rank)
				continue;
			for (int s = 0; s < w; s++) {
				int seq = base + s;
				size_t n = 0;

				T_CHECK(p, wait_req(p->d, rreq[j][s], &n) == 0);
				T_CHECK(p, n == mesh_len(j, p->rank, seq));
				T_CHECK(p, check(bufs->r[j][s], n, mesh_seed(j, p->rank, seq)));
				T_CHECK(p, wait_req(p->d, sreq[j][s], NULL) == 0);
			}
		}
	}
	/* Nobody closes while another peer could still be receiving. */
	pthread_barrier_wait(p->bar);
	for (int j = 0; j < MESH; j++)
		if (p->conn[j])
			ops->close(p->conn[j]);
	return NULL;
}

static void test_eight_threads_mesh(void **state)
{
	static struct mesh_peer peers[MESH];
	pthread_t t[MESH];
	pthread_barrier_t bar;

	(void)state;
	memset(peers, 0, sizeof(peers));
	pthread_barrier_init(&bar, NULL, MESH);
	for (int i = 0; i < MESH; i++) {
		peers[i].rank = i;
		peers[i].d = new_drv(i, 2000);
		peers[i].bar = &bar;
		peers[i].all = peers;
		assert_int_equal(ops->listen(peers[i].d, NULL, peers[i].blob, &peers[i].blob_len,
					     &peers[i].l), 0);
	}
	for (int i = 0; i < MESH; i++)
		assert_int_equal(pthread_create(&t[i], NULL, mesh_worker, &peers[i]), 0);
	for (int i = 0; i < MESH; i++)
		pthread_join(t[i], NULL);
	for (int i = 0; i < MESH; i++)
		if (peers[i].err[0])
			fail_msg("peer %d: %s", i, peers[i].err);
	for (int i = 0; i < MESH; i++) {
		ops->fini(peers[i].d);
		free(peers[i].bufs);
	}
	pthread_barrier_destroy(&bar);
}

/*
 * Close racing a large copy: the receiver closes while the sender's thread
 * may be copying into its buffer. Close must wait for the copy; both
 * requests end cleanly one way or the other (ASan catches a late write).
 */
struct big_sender {
	struct mp_drv *d;
	struct mp_drv_conn *c;
	unsigned char *buf;
	size_t len;
	int rc;
};

static void *send_big(void *arg)
{
	struct big_sender *s = arg;
	struct mp_iov iov = {s->buf, s->len};
	struct mp_drv_req *r;

	s->rc = ops->isend(s->c, &iov, 1, NULL, &r);
	if (!s->rc)
		s->rc = wait_req(s->d, r, NULL);
	return NULL;
}

static void test_close_during_copy(void **state)
{
	const size_t len = 64u << 20;

	(void)state;
	for (int round = 0; round < 5; round++) {
		struct mp_drv *da = new_drv(0, 0), *db = new_drv(1, 0);
		struct mp_drv_listener *lb;
		struct mp_drv_conn *a, *b;
		struct mp_drv_req *r;
		unsigned char *src = malloc(len), *dst = malloc(len);
		struct big_sender s;
		pthread_t t;
		int rc, done = 0;

		assert_non_null(src);
		assert_non_null(dst);
		memset(src, 0x11, len);
		memset(dst, 0, len);
		make_pair(da, db, &lb, &a, &b);
		assert_int_equal(ops->irecv(b, dst, len, NULL, &r), 0);
		s = (struct big_sender){da, a, src, len, -1};
		if (round == 0) {
			/* Closed before the send exists: cancelled, and the send is reset. */
			ops->close(b);
			assert_int_equal(pthread_create(&t, NULL, send_big, &s), 0);
		} else {
			/* Closed while the sender's thread is (most likely) copying. */
			assert_int_equal(pthread_create(&t, NULL, send_big, &s), 0);
			sleep_ms(round);
			ops->close(b);
		}
		rc = ops->test(r, &done, NULL);
		assert_int_equal(done, 1);
		if (round == 0)
			assert_int_equal(rc, -ECANCELED);
		assert_true(rc == 0 || rc == -ECANCELED);
		/* A delivered message is complete by the time close returns. */
		if (rc == 0)
			assert_true(dst[0] == 0x11 && dst[len - 1] == 0x11);
		free(dst); /* nothing may write into it any more */
		pthread_join(t, NULL);
		if (round == 0)
			assert_int_equal(s.rc, -ECONNRESET);
		assert_true(s.rc == 0 || s.rc == -ECONNRESET);
		assert_true(rc != 0 || s.rc == 0);
		ops->fini(da);
		ops->fini(db);
		free(src);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_addresses_and_caps),
		cmocka_unit_test(test_listen_names),
		cmocka_unit_test(test_exchange_single_thread),
		cmocka_unit_test(test_ordering_and_emsgsize),
		cmocka_unit_test(test_refused),
		cmocka_unit_test(test_late_listener),
		cmocka_unit_test(test_close_resets_peer),
		cmocka_unit_test(test_inject),
		cmocka_unit_test(test_wake_and_timeouts),
		cmocka_unit_test(test_cross_thread_completion_wakes),
		cmocka_unit_test(test_two_threads_pingpong),
		cmocka_unit_test(test_eight_threads_mesh),
		cmocka_unit_test(test_close_during_copy),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
