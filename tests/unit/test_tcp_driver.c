/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Unit tests of the tcp transport through its ops table only, on loopback.
 * Every wait is bounded so a broken driver fails the test instead of hanging.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <moshpit/driver.h>

extern const struct mp_driver_ops mp_tcp_driver_ops;

static const struct mp_driver_ops *ops = &mp_tcp_driver_ops;

#define WAIT_MS 5000

struct pair {
	struct mp_drv *d;
	struct mp_drv_listener *l;
	struct mp_drv_conn *a; /* connecting side */
	struct mp_drv_conn *b; /* accepted side */
	unsigned char addr[MP_DRV_ADDR_MAX];
	size_t alen;
};

static int64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static struct mp_drv *new_drv(void)
{
	struct mp_drv_params p = {
		.size = sizeof(p),
		.run_name = "test",
		.rank = 0,
		.connect_timeout_ms = 3000,
	};
	struct mp_drv *d = NULL;

	assert_int_equal(ops->init(&p, &d), 0);
	assert_non_null(d);
	return d;
}

/* Accept one connection, progressing @d (and @d2 if set) until it shows up. */
static struct mp_drv_conn *accept_one(struct mp_drv *d, struct mp_drv *d2, struct mp_drv_listener *l)
{
	struct mp_drv_conn *c = NULL;
	int64_t end = now_ms() + WAIT_MS;
	int rc;

	while ((rc = ops->accept(l, &c)) == -EAGAIN) {
		if (now_ms() > end)
			fail_msg("accept timed out");
		assert_int_equal(ops->progress(d, 1), 0);
		if (d2)
			assert_int_equal(ops->progress(d2, 1), 0);
	}
	assert_int_equal(rc, 0);
	assert_non_null(c);
	return c;
}

/* Wait for @r, progressing both instances; returns its status. */
static int wait_req2(struct mp_drv *d, struct mp_drv *d2, struct mp_drv_req *r, size_t *nbytes)
{
	int64_t end = now_ms() + WAIT_MS;
	int done = 0, rc;

	for (;;) {
		rc = ops->test(r, &done, nbytes);
		if (done)
			return rc;
		assert_int_equal(rc, 0);
		if (now_ms() > end)
			fail_msg("request did not complete within %d ms", WAIT_MS);
		assert_int_equal(ops->progress(d, 1), 0);
		if (d2)
			assert_int_equal(ops->progress(d2, 1), 0);
	}
}

static int wait_req(struct mp_drv *d, struct mp_drv_req *r, size_t *nbytes)
{
	return wait_req2(d, NULL, r, nbytes);
}

static int setup_pair(void **state)
{
	struct pair *p = calloc(1, sizeof(*p));

	assert_non_null(p);
	p->d = new_drv();
	assert_int_equal(ops->listen(p->d, "127.0.0.1:0", p->addr, &p->alen, &p->l), 0);
	assert_true(p->alen > 0 && p->alen <= MP_DRV_ADDR_MAX);
	assert_int_equal(ops->connect(p->d, p->addr, p->alen, &p->a), 0);
	p->b = accept_one(p->d, NULL, p->l);
	*state = p;
	return 0;
}

static int teardown_pair(void **state)
{
	struct pair *p = *state;

	if (p->a)
		ops->close(p->a);
	if (p->b)
		ops->close(p->b);
	if (p->l)
		ops->close_listener(p->l);
	ops->fini(p->d);
	free(p);
	return 0;
}

static unsigned char pattern(size_t i, size_t salt)
{
	return (unsigned char)((i * 131u + salt * 7u + (i >> 12)) & 0xff);
}

/* Port of a blob, through its text form. */
static unsigned blob_port(struct mp_drv *d, const void *blob, size_t len)
{
	char text[128];
	const char *colon;

	assert_int_equal(ops->addr_format(d, blob, len, text, sizeof(text)), 0);
	colon = strrchr(text, ':');
	assert_non_null(colon);
	return (unsigned)atoi(colon + 1);
}

static int raw_connect(unsigned port)
{
	struct sockaddr_in sin;
	int fd = socket(AF_INET, SOCK_STREAM, 0);

	assert_true(fd >= 0);
	memset(&sin, 0, sizeof(sin));
	sin.sin_family = AF_INET;
	sin.sin_port = htons((uint16_t)port);
	sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	assert_int_equal(connect(fd, (struct sockaddr *)&sin, sizeof(sin)), 0);
	return fd;
}

/* ---- tests ------------------------------------------------------------- */

static void test_query_and_mr(void **state)
{
	struct mp_drv *d = new_drv();
	struct mp_drv_caps caps;
	struct mp_drv_mr *mr = NULL;
	char buf[64];

	(void)state;
	assert_int_equal(ops->size, sizeof(struct mp_driver_ops));
	assert_int_equal(ops->abi, MP_DRIVER_ABI);
	assert_string_equal(ops->name, "tcp");
	assert_int_equal(ops->query(d, &caps), 0);
	assert_true(caps.flags & MP_DRV_CAP_ORDERED);
	assert_int_equal(caps.max_msg, (size_t)1 << 30);
	assert_int_equal(caps.default_streams, 1);
	assert_int_equal(ops->reg_mr(d, buf, sizeof(buf), MP_MEM_HOST, &mr), 0);
	assert_non_null(mr);
	ops->dereg_mr(d, mr);
	assert_int_equal(ops->reg_mr(d, buf, sizeof(buf), MP_MEM_CUDA, &mr), -ENOTSUP);
	assert_int_equal(ops->reg_mr(d, buf, sizeof(buf), MP_MEM_DMABUF, &mr), -ENOTSUP);
	ops->fini(d);
}

static void test_addr(void **state)
{
	static const char *bad[] = {
		"nonsense", "1.2.3.4", "1.2.3.4:99999", "1.2.3.4:", ":80", "1.2.3.4:8a",
		"1.2.3.4:-1", "::1:80", "[::1]80", "[::1", "", "1.2.3.4:123456",
	};
	static const char *good[] = {
		"127.0.0.1:4242", "[::1]:4242", "[2001:db8::1]:65535", "10.0.0.1:0",
	};
	unsigned char blob[MP_DRV_ADDR_MAX];
	struct mp_drv *d = new_drv();
	char text[128];
	size_t len;

	(void)state;
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		len = 0;
		if (ops->addr_parse(d, bad[i], blob, &len) != -EINVAL)
			fail_msg("addr_parse accepted '%s'", bad[i]);
	}
	for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
		len = 0;
		assert_int_equal(ops->addr_parse(d, good[i], blob, &len), 0);
		assert_true(len > 0 && len <= MP_DRV_ADDR_MAX);
		assert_int_equal(ops->addr_format(d, blob, len, text, sizeof(text)), 0);
		assert_string_equal(text, good[i]);
	}
	/* Names resolve. */
	assert_int_equal(ops->addr_parse(d, "localhost:80", blob, &len), 0);
	assert_int_equal(ops->addr_format(d, blob, len, text, sizeof(text)), 0);
	assert_true(!strcmp(text, "127.0.0.1:80") || !strcmp(text, "[::1]:80"));
	/* Too small a buffer, then a damaged blob. */
	assert_int_equal(ops->addr_parse(d, "127.0.0.1:4242", blob, &len), 0);
	assert_int_equal(ops->addr_format(d, blob, len, text, 8), -ENOSPC);
	assert_int_equal(ops->addr_format(d, blob, len - 1, text, sizeof(text)), -EINVAL);
	blob[0] = 9;
	assert_int_equal(ops->addr_format(d, blob, len, text, sizeof(text)), -EINVAL);
	ops->fini(d);
}

static void test_listen_reports_port(void **state)
{
	struct pair *p = *state;
	char text[128];

	assert_int_equal(ops->addr_format(p->d, p->addr, p->alen, text, sizeof(text)), 0);
	assert_true(!strncmp(text, "127.0.0.1:", 10));
	assert_true(blob_port(p->d, p->addr, p->alen) > 0);
	/* Nothing else pending. */
	struct mp_drv_conn *c = NULL;
	assert_int_equal(ops->accept(p->l, &c), -EAGAIN);
}

/* Send @size bytes from @from to @to as a 2-piece iov and check them. */
static void exchange(struct mp_drv *d, struct mp_drv *d2, struct mp_drv_conn *from,
		     struct mp_drv_conn *to, size_t size, size_t salt)
{
	unsigned char *src = malloc(size + 1), *dst = malloc(size + 1);
	struct mp_drv_req *rs = NULL, *rr = NULL;
	struct mp_iov iov[2];
	size_t split = size / 3, nb = (size_t)-1;

	assert_non_null(src);
	assert_non_null(dst);
	for (size_t i = 0; i < size; i++)
		src[i] = pattern(i, salt);
	memset(dst, 0xee, size + 1);
	iov[0].base = src;
	iov[0].len = split;
	iov[1].base = src + split;
	iov[1].len = size - split;
	assert_int_equal(ops->irecv(to, dst, size, NULL, &rr), 0);
	assert_int_equal(ops->isend(from, iov, 2, NULL, &rs), 0);
	assert_int_equal(wait_req2(d, d2, rr, &nb), 0);
	assert_int_equal(nb, size);
	nb = (size_t)-1;
	assert_int_equal(wait_req2(d, d2, rs, &nb), 0);
	assert_int_equal(nb, size);
	assert_memory_equal(src, dst, size);
	assert_int_equal(dst[size], 0xee);
	free(src);
	free(dst);
}

static void test_sizes(void **state)
{
	struct pair *p = *state;
	static const size_t sizes[] = {0, 1, 64 * 1024, 8 * 1024 * 1024};

	for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
		exchange(p->d, NULL, p->a, p->b, sizes[i], i);
		exchange(p->d, NULL, p->b, p->a, sizes[i], i + 10);
	}
}

/* Two instances, both directions at once, so neither side can rely on the other draining first. */
static void test_two_instances_bidirectional(void **state)
{
	struct mp_drv *d1 = new_drv(), *d2 = new_drv();
	struct mp_drv_listener *l = NULL;
	struct mp_drv_conn *a = NULL, *b = NULL;
	unsigned char addr[MP_DRV_ADDR_MAX];
	size_t alen, size = 8u << 20, nb;
	unsigned char *s1 = malloc(size), *s2 = malloc(size), *r1 = malloc(size), *r2 = malloc(size);
	struct mp_drv_req *q[4];
	struct mp_iov iov;

	(void)state;
	assert_true(s1 && s2 && r1 && r2);
	for (size_t i = 0; i < size; i++) {
		s1[i] = pattern(i, 1);
		s2[i] = pattern(i, 2);
	}
	assert_int_equal(ops->listen(d2, "127.0.0.1:0", addr, &alen, &l), 0);
	assert_int_equal(ops->connect(d1, addr, alen, &a), 0);
	b = accept_one(d2, d1, l);
	assert_int_equal(ops->irecv(a, r1, size, NULL, &q[0]), 0);
	assert_int_equal(ops->irecv(b, r2, size, NULL, &q[1]), 0);
	iov.base = s1;
	iov.len = size;
	assert_int_equal(ops->isend(a, &iov, 1, NULL, &q[2]), 0);
	iov.base = s2;
	assert_int_equal(ops->isend(b, &iov, 1, NULL, &q[3]), 0);
	for (int i = 0; i < 4; i++) {
		assert_int_equal(wait_req2(d1, d2, q[i], &nb), 0);
		assert_int_equal(nb, size);
	}
	assert_memory_equal(r1, s2, size);
	assert_memory_equal(r2, s1, size);
	ops->close(a);
	ops->close(b);
	ops->close_listener(l);
	ops->fini(d1);
	ops->fini(d2);
	free(s1);
	free(s2);
	free(r1);
	free(r2);
}

#define NORDER 100

/* 100 messages of varying length, posted as fast as back-pressure allows. */
static void test_ordering(void **state)
{
	struct pair *p = *state;
	uint32_t out[NORDER][8], in[NORDER][8];
	struct mp_drv_req *rs[NORDER] = {0}, *rr[NORDER] = {0};
	int ns = 0, nr = 0, sdone = 0, rdone = 0;
	size_t rlen[NORDER];
	int64_t end = now_ms() + WAIT_MS;

	memset(in, 0, sizeof(in));
	for (int i = 0; i < NORDER; i++)
		for (int j = 0; j < 8; j++)
			out[i][j] = (uint32_t)(i * 1000 + j);
	while (sdone < NORDER || rdone < NORDER) {
		int rc, done;

		if (now_ms() > end)
			fail_msg("ordering test timed out (%d sent, %d received)", sdone, rdone);
		while (ns < NORDER) {
			struct mp_iov iov = {out[ns], (size_t)(1 + ns % 8) * 4};

			rc = ops->isend(p->a, &iov, 1, NULL, &rs[ns]);
			if (rc == -EAGAIN)
				break;
			assert_int_equal(rc, 0);
			ns++;
		}
		while (nr < NORDER) {
			rc = ops->irecv(p->b, in[nr], sizeof(in[nr]), NULL, &rr[nr]);
			if (rc == -EAGAIN)
				break;
			assert_int_equal(rc, 0);
			nr++;
		}
		assert_int_equal(ops->progress(p->d, 1), 0);
		for (int i = 0; i < ns; i++) {
			if (!rs[i])
				continue;
			rc = ops->test(rs[i], &done, NULL);
			if (done) {
				assert_int_equal(rc, 0);
				rs[i] = NULL;
				sdone++;
			}
		}
		for (int i = 0; i < nr; i++) {
			if (!rr[i])
				continue;
			rc = ops->test(rr[i], &done, &rlen[i]);
			if (done) {
				assert_int_equal(rc, 0);
				rr[i] = NULL;
				rdone++;
			}
		}
	}
	for (int i = 0; i < NORDER; i++) {
		assert_int_equal(rlen[i], (size_t)(1 + i % 8) * 4);
		assert_memory_equal(in[i], out[i], rlen[i]);
	}
}

/* A message shorter than the posted buffer reports its own length. */
static void test_short_message(void **state)
{
	struct pair *p = *state;
	char buf[1000], msg[] = "0123456789";
	struct mp_drv_req *rr, *rs;
	struct mp_iov iov = {msg, 10};
	size_t nb = 0;

	memset(buf, 0, sizeof(buf));
	assert_int_equal(ops->irecv(p->b, buf, sizeof(buf), NULL, &rr), 0);
	assert_int_equal(ops->isend(p->a, &iov, 1, NULL, &rs), 0);
	assert_int_equal(wait_req(p->d, rr, &nb), 0);
	assert_int_equal(nb, 10);
	assert_memory_equal(buf, msg, 10);
	assert_int_equal(buf[10], 0);
	assert_int_equal(wait_req(p->d, rs, NULL), 0);
	/* A handle that reported done is back in the pool: testing it again
	 * is refused, and reads as not done, rather than reporting anew. */
	int done = 1;
	nb = 77;
	assert_int_equal(ops->test(rr, &done, &nb), -EINVAL);
	assert_int_equal(done, 0);
	assert_int_equal(nb, 77);
}

/* Data sent before a receive is posted waits in the kernel and is not lost. */
static void test_recv_posted_late(void **state)
{
	struct pair *p = *state;
	char buf[16] = {0};
	struct mp_drv_req *rr, *rs;
	struct mp_iov iov = {"late", 4};
	size_t nb = 0;

	assert_int_equal(ops->isend(p->a, &iov, 1, NULL, &rs), 0);
	assert_int_equal(wait_req(p->d, rs, NULL), 0);
	for (int i = 0; i < 20; i++)
		assert_int_equal(ops->progress(p->d, 1), 0);
	assert_int_equal(ops->irecv(p->b, buf, sizeof(buf), NULL, &rr), 0);
	assert_int_equal(wait_req(p->d, rr, &nb), 0);
	assert_int_equal(nb, 4);
	assert_memory_equal(buf, "late", 4);
}

/*
 * Messages of mixed sizes, all queued before any receive is posted, then
 * taken one receive at a time: headers and payloads straddle the read-ahead
 * buffer's end, a large payload starts in it and goes on straight into its
 * posted buffer, and a zero-length message sits between others.
 */
static void test_readahead_mixed(void **state)
{
	struct pair *p = *state;
	static const size_t sizes[] = {1,     0,      7,    4096, 30000,   32760, 40000,
				       3,     100000, 65536, 5,   1u << 20, 12,   32768};
	enum { N = sizeof(sizes) / sizeof(sizes[0]) };
	unsigned char *src[N], *dst = malloc((1u << 20) + 1);
	struct mp_drv_req *rs[N];

	assert_non_null(dst);
	for (int i = 0; i < N; i++) {
		struct mp_iov iov;

		src[i] = malloc(sizes[i] + 1);
		assert_non_null(src[i]);
		for (size_t k = 0; k < sizes[i]; k++)
			src[i][k] = pattern(k, (size_t)i + 100);
		iov.base = src[i];
		iov.len = sizes[i];
		assert_int_equal(ops->isend(p->a, &iov, 1, NULL, &rs[i]), 0);
	}
	for (int i = 0; i < 10; i++)
		assert_int_equal(ops->progress(p->d, 1), 0);
	for (int i = 0; i < N; i++) {
		struct mp_drv_req *rr;
		size_t nb = (size_t)-1;

		memset(dst, 0xee, sizes[i] + 1);
		assert_int_equal(ops->irecv(p->b, dst, (1u << 20) + 1, NULL, &rr), 0);
		assert_int_equal(wait_req(p->d, rr, &nb), 0);
		assert_int_equal(nb, sizes[i]);
		assert_memory_equal(dst, src[i], sizes[i]);
		assert_int_equal(dst[sizes[i]], 0xee);
	}
	for (int i = 0; i < N; i++) {
		assert_int_equal(wait_req(p->d, rs[i], NULL), 0);
		free(src[i]);
	}
	free(dst);
}

/* A message queued just before close still reaches the peer (a BYE, a REJECT). */
static void test_close_sends_queued(void **state)
{
	struct pair *p = *state;
	char buf[16] = {0};
	struct mp_drv_req *rr, *rs;
	struct mp_iov iov = {"bye!", 4};
	size_t nb = 0;

	exchange(p->d, NULL, p->a, p->b, 1, 0); /* connected by now */
	assert_int_equal(ops->isend(p->a, &iov, 1, NULL, &rs), 0);
	ops->close(p->a);
	p->a = NULL;
	assert_int_equal(ops->irecv(p->b, buf, sizeof(buf), NULL, &rr), 0);
	assert_int_equal(wait_req(p->d, rr, &nb), 0);
	assert_int_equal(nb, 4);
	assert_memory_equal(buf, "bye!", 4);
}

/*
 * The same, with the receiver polled before it posts a receive (the
 * message and the close wait in the socket): the message is still
 * delivered, and only the next receive fails.
 */
static void test_polled_then_close(void **state)
{
	struct pair *p = *state;
	char buf[16] = {0};
	struct mp_drv_req *rr, *rs;
	struct mp_iov iov = {"bye!", 4};
	size_t nb = 0;

	exchange(p->d, NULL, p->a, p->b, 1, 0);
	assert_int_equal(ops->isend(p->a, &iov, 1, NULL, &rs), 0);
	ops->close(p->a);
	p->a = NULL;
	for (int i = 0; i < 20; i++)
		assert_int_equal(ops->progress(p->d, 1), 0);
	assert_int_equal(ops->irecv(p->b, buf, sizeof(buf), NULL, &rr), 0);
	assert_int_equal(wait_req(p->d, rr, &nb), 0);
	assert_int_equal(nb, 4);
	assert_memory_equal(buf, "bye!", 4);
	assert_int_equal(ops->irecv(p->b, buf, sizeof(buf), NULL, &rr), 0);
	assert_int_equal(wait_req(p->d, rr, NULL), -ECONNRESET);
}

/*
 * A close between exchanges (reading ahead saw it) is held until a receive
 * needs more bytes: a peer that is done with us is not a failure to act on
 * at once. Sends are still accepted, progress does not spin on the pending
 * end of stream, and the next receive fails.
 */
static void test_idle_close_held(void **state)
{
	struct pair *p = *state;
	char buf[16] = {0};
	struct mp_drv_req *rr, *rs;
	struct mp_iov iov = {"late", 4};
	int calls = 0, rc;
	int64_t t0;

	exchange(p->d, NULL, p->a, p->b, 1, 0);
	ops->close(p->a);
	p->a = NULL;
	t0 = now_ms();
	while (now_ms() - t0 < 300) {
		assert_int_equal(ops->progress(p->d, 50), 0);
		calls++;
	}
	assert_true(calls < 30);
	assert_int_equal(ops->isend(p->b, &iov, 1, NULL, &rs), 0);
	assert_int_equal(ops->irecv(p->b, buf, sizeof(buf), NULL, &rr), 0);
	rc = wait_req(p->d, rr, NULL);
	assert_true(rc == -ECONNRESET || rc == -EPIPE);
}

static void test_emsgsize(void **state)
{
	struct pair *p = *state;
	char small[10], big[100];
	struct mp_drv_req *rr, *rr2 = NULL, *rs;
	struct mp_iov iov = {big, sizeof(big)};
	int rc;

	memset(big, 'x', sizeof(big));
	assert_int_equal(ops->irecv(p->b, small, sizeof(small), NULL, &rr), 0);
	assert_int_equal(ops->irecv(p->b, big, sizeof(big), NULL, &rr2), 0);
	assert_int_equal(ops->isend(p->a, &iov, 1, NULL, &rs), 0);
	assert_int_equal(wait_req(p->d, rr, NULL), -EMSGSIZE);
	/* The connection is gone: the next receive fails too. */
	rc = wait_req(p->d, rr2, NULL);
	assert_true(rc < 0 && rc != -EMSGSIZE);
	rc = ops->irecv(p->b, big, sizeof(big), NULL, &rr2);
	assert_true(rc < 0);
	(void)wait_req(p->d, rs, NULL);
}

static void test_oversized_send_rejected(void **state)
{
	struct pair *p = *state;
	char byte = 0;
	struct mp_iov iov[2] = {{&byte, (size_t)1 << 30}, {&byte, 1}};
	struct mp_drv_req *r = NULL;

	/* Nothing is read: the length check comes first. */
	assert_int_equal(ops->isend(p->a, iov, 2, NULL, &r), -EMSGSIZE);
	assert_int_equal(ops->isend(p->a, iov, MP_DRV_IOV_MAX + 1, NULL, &r), -EINVAL);
}

/* Back-pressure: a full queue says -EAGAIN; close cancels what is posted. */
static void test_queue_full_and_cancel(void **state)
{
	struct pair *p = *state;
	struct mp_drv_req *r[256];
	char buf[8];
	int n = 0, rc, done;

	while (n < 256 && (rc = ops->irecv(p->b, buf, sizeof(buf), NULL, &r[n])) == 0)
		n++;
	assert_int_equal(rc, -EAGAIN);
	assert_true(n >= 16);
	for (int i = 0; i < n; i++) {
		assert_int_equal(ops->test(r[i], &done, NULL), 0);
		assert_int_equal(done, 0);
	}
	ops->close(p->b);
	p->b = NULL;
	for (int i = 0; i < n; i++) {
		assert_int_equal(ops->test(r[i], &done, NULL), -ECANCELED);
		assert_int_equal(done, 1);
	}
}

/* Sends posted before the connection is established go out once it is. */
static void test_send_before_connected(void **state)
{
	struct mp_drv *d = new_drv();
	struct mp_drv_listener *l;
	struct mp_drv_conn *a, *b;
	unsigned char addr[MP_DRV_ADDR_MAX];
	struct mp_drv_req *rs[3], *rr;
	char buf[16];
	size_t alen, nb;

	(void)state;
	assert_int_equal(ops->listen(d, "127.0.0.1:0", addr, &alen, &l), 0);
	assert_int_equal(ops->connect(d, addr, alen, &a), 0);
	for (int i = 0; i < 3; i++) {
		struct mp_iov iov = {&"abc"[i], 1};

		assert_int_equal(ops->isend(a, &iov, 1, NULL, &rs[i]), 0);
	}
	b = accept_one(d, NULL, l);
	for (int i = 0; i < 3; i++) {
		assert_int_equal(ops->irecv(b, buf, sizeof(buf), NULL, &rr), 0);
		assert_int_equal(wait_req(d, rr, &nb), 0);
		assert_int_equal(nb, 1);
		assert_int_equal(buf[0], "abc"[i]);
		assert_int_equal(wait_req(d, rs[i], NULL), 0);
	}
	ops->close(a);
	ops->close(b);
	ops->close_listener(l);
	ops->fini(d);
}

static void test_connect_refused(void **state)
{
	struct mp_drv *d = new_drv();
	struct sockaddr_in sin;
	socklen_t sl = sizeof(sin);
	unsigned char blob[MP_DRV_ADDR_MAX];
	struct mp_drv_conn *c;
	struct mp_drv_req *r = NULL;
	struct mp_iov iov = {"x", 1};
	char text[64];
	size_t len;
	int64_t t0;
	int fd, rc;

	(void)state;
	/* A bound socket that does not listen: its port refuses connections. */
	fd = socket(AF_INET, SOCK_STREAM, 0);
	assert_true(fd >= 0);
	memset(&sin, 0, sizeof(sin));
	sin.sin_family = AF_INET;
	sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	assert_int_equal(bind(fd, (struct sockaddr *)&sin, sizeof(sin)), 0);
	assert_int_equal(getsockname(fd, (struct sockaddr *)&sin, &sl), 0);
	snprintf(text, sizeof(text), "127.0.0.1:%u", (unsigned)ntohs(sin.sin_port));
	assert_int_equal(ops->addr_parse(d, text, blob, &len), 0);

	t0 = now_ms();
	assert_int_equal(ops->connect(d, blob, len, &c), 0);
	rc = ops->isend(c, &iov, 1, NULL, &r);
	if (rc == 0) {
		int done = 0;

		while (!done) {
			rc = ops->test(r, &done, NULL);
			if (!done) {
				assert_int_equal(rc, 0);
				assert_true(now_ms() - t0 < 2000);
				assert_int_equal(ops->progress(d, 10), 0);
			}
		}
	}
	assert_true(rc < 0);
	assert_true(now_ms() - t0 < 2000);
	/* Further posts fail with the same error. */
	assert_int_equal(ops->isend(c, &iov, 1, NULL, &r), rc);
	ops->close(c);
	close(fd);
	ops->fini(d);
}

/* A peer that accepts nothing (full backlog) runs into the connect timeout. */
static void test_connect_timeout(void **state)
{
	struct mp_drv_params prm = {.size = sizeof(prm), .run_name = "t", .connect_timeout_ms = 300};
	struct sockaddr_in sin;
	socklen_t sl = sizeof(sin);
	unsigned char blob[MP_DRV_ADDR_MAX];
	struct mp_drv *d = NULL;
	struct mp_drv_conn *c;
	struct mp_drv_req *r = NULL;
	struct mp_iov iov = {"x", 1};
	int fill[4], lfd, rc, done = 0;
	char text[64];
	size_t len;
	int64_t t0;

	(void)state;
	assert_int_equal(ops->init(&prm, &d), 0);
	lfd = socket(AF_INET, SOCK_STREAM, 0);
	assert_true(lfd >= 0);
	memset(&sin, 0, sizeof(sin));
	sin.sin_family = AF_INET;
	sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	assert_int_equal(bind(lfd, (struct sockaddr *)&sin, sizeof(sin)), 0);
	assert_int_equal(getsockname(lfd, (struct sockaddr *)&sin, &sl), 0);
	assert_int_equal(listen(lfd, 0), 0);
	/* Fill the accept queue so that further SYNs are dropped. */
	for (int i = 0; i < 4; i++) {
		fill[i] = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
		assert_true(fill[i] >= 0);
		rc = connect(fill[i], (struct sockaddr *)&sin, sizeof(sin));
		assert_true(rc == 0 || errno == EINPROGRESS);
	}
	nanosleep(&(struct timespec){0, 50 * 1000 * 1000}, NULL);
	snprintf(text, sizeof(text), "127.0.0.1:%u", (unsigned)ntohs(sin.sin_port));
	assert_int_equal(ops->addr_parse(d, text, blob, &len), 0);
	t0 = now_ms();
	assert_int_equal(ops->connect(d, blob, len, &c), 0);
	assert_int_equal(ops->isend(c, &iov, 1, NULL, &r), 0);
	while (!done) {
		rc = ops->test(r, &done, NULL);
		if (!done) {
			assert_true(now_ms() - t0 < WAIT_MS);
			/* A long wait: the driver must cut it short at the deadline. */
			assert_int_equal(ops->progress(d, 2000), 0);
		}
	}
	for (int i = 0; i < 4; i++)
		close(fill[i]);
	close(lfd);
	ops->close(c);
	ops->fini(d);
	if (rc == 0)
		skip(); /* this kernel completed the handshake anyway */
	assert_int_equal(rc, -ETIMEDOUT);
	assert_true(now_ms() - t0 >= 250);
	assert_true(now_ms() - t0 < 1500);
}

/* A reset on an idle connection fails it without turning progress into a busy loop. */
static void test_idle_reset(void **state)
{
	struct pair *p = *state;
	unsigned port = blob_port(p->d, p->addr, p->alen);
	struct linger lg = {1, 0};
	struct mp_drv_conn *c;
	struct mp_drv_req *r;
	char buf[8];
	int fd, calls = 0, rc;
	int64_t t0;

	fd = raw_connect(port);
	c = accept_one(p->d, NULL, p->l);
	/* Linger 0: close sends RST. */
	assert_int_equal(setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg)), 0);
	close(fd);
	t0 = now_ms();
	while (now_ms() - t0 < 300) {
		assert_int_equal(ops->progress(p->d, 50), 0);
		calls++;
	}
	assert_true(calls < 30);
	rc = ops->irecv(c, buf, sizeof(buf), NULL, &r);
	if (rc == 0)
		rc = wait_req(p->d, r, NULL);
	assert_int_equal(rc, -ECONNRESET);
	ops->close(c);
}

/* The peer closing its end fails a pending receive; close cancels our own. */
static void test_peer_close(void **state)
{
	struct pair *p = *state;
	struct mp_drv_req *ra, *rb;
	char b1[8], b2[8];
	int done = 0;
	int64_t t0;

	assert_int_equal(ops->irecv(p->a, b1, sizeof(b1), NULL, &ra), 0);
	assert_int_equal(ops->irecv(p->b, b2, sizeof(b2), NULL, &rb), 0);
	t0 = now_ms();
	ops->close(p->a);
	p->a = NULL;
	assert_int_equal(ops->test(ra, &done, NULL), -ECANCELED);
	assert_int_equal(done, 1);
	assert_int_equal(wait_req(p->d, rb, NULL), -ECONNRESET);
	assert_true(now_ms() - t0 < 1000);
}

/* A peer process that dies mid-message fails the receive promptly. */
static void test_peer_process_dies(void **state)
{
	struct pair *p = *state;
	unsigned port = blob_port(p->d, p->addr, p->alen);
	struct mp_drv_conn *c;
	struct mp_drv_req *r;
	char buf[100];
	int64_t t0;
	pid_t pid;
	int st;

	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		/* Valid header announcing 100 bytes, then only 10 of them. */
		unsigned char hdr[18] = {'M', 'P', 'T', '1', 100, 0, 0, 0};
		struct sockaddr_in sin = {.sin_family = AF_INET};
		int fd = socket(AF_INET, SOCK_STREAM, 0);

		/* No cmocka asserts here: they would unwind into the parent's runner. */
		sin.sin_port = htons((uint16_t)port);
		sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
		if (fd < 0 || connect(fd, (struct sockaddr *)&sin, sizeof(sin)) < 0)
			_exit(2);
		if (write(fd, hdr, sizeof(hdr)) != (ssize_t)sizeof(hdr))
			_exit(1);
		_exit(0);
	}
	c = accept_one(p->d, NULL, p->l);
	assert_int_equal(ops->irecv(c, buf, sizeof(buf), NULL, &r), 0);
	t0 = now_ms();
	assert_int_equal(wait_req(p->d, r, NULL), -ECONNRESET);
	assert_true(now_ms() - t0 < 1000);
	assert_int_equal(waitpid(pid, &st, 0), pid);
	assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	ops->close(c);
}

/* Garbage on the stream fails the connection with -EPROTO. */
static void test_garbage(void **state)
{
	struct pair *p = *state;
	unsigned port = blob_port(p->d, p->addr, p->alen);
	struct mp_drv_conn *c;
	struct mp_drv_req *r, *r2;
	char buf[64];
	const char junk[] = "GET / HTTP/1.0\r\n\r\n";
	int fd, rc;

	fd = raw_connect(port);
	c = accept_one(p->d, NULL, p->l);
	assert_int_equal(ops->irecv(c, buf, sizeof(buf), NULL, &r), 0);
	assert_int_equal(ops->irecv(c, buf, sizeof(buf), NULL, &r2), 0);
	assert_int_equal(write(fd, junk, sizeof(junk) - 1), (ssize_t)(sizeof(junk) - 1));
	assert_int_equal(wait_req(p->d, r, NULL), -EPROTO);
	assert_int_equal(wait_req(p->d, r2, NULL), -EPROTO);
	rc = ops->irecv(c, buf, sizeof(buf), NULL, &r);
	assert_int_equal(rc, -EPROTO);
	/* The good connection of the fixture still works. */
	exchange(p->d, NULL, p->a, p->b, 100, 3);
	ops->close(c);
	close(fd);
}

static void test_ipv6(void **state)
{
	struct mp_drv *d = new_drv();
	struct mp_drv_listener *l;
	struct mp_drv_conn *a, *b;
	unsigned char addr[MP_DRV_ADDR_MAX];
	char text[128];
	size_t alen;
	int rc;

	(void)state;
	rc = ops->listen(d, "[::1]:0", addr, &alen, &l);
	if (rc) {
		ops->fini(d);
		skip();
	}
	assert_int_equal(ops->addr_format(d, addr, alen, text, sizeof(text)), 0);
	assert_true(!strncmp(text, "[::1]:", 6));
	assert_int_equal(ops->connect(d, addr, alen, &a), 0);
	b = accept_one(d, NULL, l);
	exchange(d, NULL, a, b, 70000, 5);
	ops->close(a);
	ops->close(b);
	ops->close_listener(l);
	ops->fini(d);
}

static void test_listen_in_use(void **state)
{
	struct pair *p = *state;
	struct mp_drv_listener *l2 = NULL;
	unsigned char addr[MP_DRV_ADDR_MAX];
	char text[128];
	size_t len;

	assert_int_equal(ops->addr_format(p->d, p->addr, p->alen, text, sizeof(text)), 0);
	assert_int_equal(ops->listen(p->d, text, addr, &len, &l2), -EADDRINUSE);
	assert_int_equal(ops->listen(p->d, "nonsense", addr, &len, &l2), -EINVAL);
}

struct waker {
	struct mp_drv *d;
	int rc;
	int64_t took;
};

static void *progress_thread(void *arg)
{
	struct waker *w = arg;
	int64_t t0 = now_ms();

	w->rc = w->d->ops->progress(w->d, 10000);
	w->took = now_ms() - t0;
	return NULL;
}

static void test_wake(void **state)
{
	struct mp_drv *d = new_drv();
	struct waker w = {d, -1, -1};
	struct timespec ts = {0, 100 * 1000 * 1000};
	pthread_t th;
	int64_t t0;

	(void)state;
	/* A wake that comes first is not lost. */
	ops->wake(d);
	t0 = now_ms();
	assert_int_equal(ops->progress(d, 10000), 0);
	assert_true(now_ms() - t0 < 1000);

	assert_int_equal(pthread_create(&th, NULL, progress_thread, &w), 0);
	nanosleep(&ts, NULL);
	ops->wake(d);
	assert_int_equal(pthread_join(th, NULL), 0);
	assert_int_equal(w.rc, 0);
	assert_true(w.took < 2000);
	ops->fini(d);
}

static void test_bad_sockbuf_env(void **state)
{
	struct mp_drv_params prm = {.size = sizeof(prm), .run_name = "t"};
	struct mp_drv *d = NULL;

	(void)state;
	/* The size grammar (src/common/size.h), up to INT_MAX / 2. 2^64 (as
	 * 17179869184G) and 2^64 + 4M (as 18014398509486080K) used to wrap
	 * to 0 and 4M in a shift, and be taken. */
	static const char *bad[] = {"lots", "-1", "1.5M", "1G", "17179869184G",
				    "18014398509486080K", "18446744073709551616"};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		setenv("MP_TCP_SOCKBUF", bad[i], 1);
		if (ops->init(&prm, &d) != -EINVAL)
			fail_msg("MP_TCP_SOCKBUF=%s accepted", bad[i]);
	}
	setenv("MP_TCP_SOCKBUF", "1M", 1);
	assert_int_equal(ops->init(&prm, &d), 0);
	ops->fini(d);
	setenv("MP_TCP_SOCKBUF", "256KB", 1);
	assert_int_equal(ops->init(&prm, &d), 0);
	ops->fini(d);
	setenv("MP_TCP_SOCKBUF", "0", 1);
	assert_int_equal(ops->init(&prm, &d), 0);
	ops->fini(d);
	unsetenv("MP_TCP_SOCKBUF");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_query_and_mr),
		cmocka_unit_test(test_addr),
		cmocka_unit_test(test_bad_sockbuf_env),
		cmocka_unit_test_setup_teardown(test_listen_reports_port, setup_pair, teardown_pair),
		cmocka_unit_test_setup_teardown(test_listen_in_use, setup_pair, teardown_pair),
		cmocka_unit_test_setup_teardown(test_sizes, setup_pair, teardown_pair),
		cmocka_unit_test(test_two_instances_bidirectional),
		cmocka_unit_test_setup_teardown(test_ordering, setup_pair, teardown_pair),
		cmocka_unit_test_setup_teardown(test_short_message, setup_pair, teardown_pair),
		cmocka_unit_test_setup_teardown(test_recv_posted_late, setup_pair, teardown_pair),
		cmocka_unit_test_setup_teardown(test_readahead_mixed, setup_pair, teardown_pair),
		cmocka_unit_test_setup_teardown(test_close_sends_queued, setup_pair, teardown_pair),
		cmocka_unit_test_setup_teardown(test_polled_then_close, setup_pair, teardown_pair),
		cmocka_unit_test_setup_teardown(test_idle_close_held, setup_pair, teardown_pair),
		cmocka_unit_test_setup_teardown(test_emsgsize, setup_pair, teardown_pair),
		cmocka_unit_test_setup_teardown(test_oversized_send_rejected, setup_pair, teardown_pair),
		cmocka_unit_test_setup_teardown(test_queue_full_and_cancel, setup_pair, teardown_pair),
		cmocka_unit_test(test_send_before_connected),
		cmocka_unit_test(test_connect_refused),
		cmocka_unit_test(test_connect_timeout),
		cmocka_unit_test_setup_teardown(test_idle_reset, setup_pair, teardown_pair),
		cmocka_unit_test_setup_teardown(test_peer_close, setup_pair, teardown_pair),
		cmocka_unit_test_setup_teardown(test_peer_process_dies, setup_pair, teardown_pair),
		cmocka_unit_test_setup_teardown(test_garbage, setup_pair, teardown_pair),
		cmocka_unit_test(test_ipv6),
		cmocka_unit_test(test_wake),
	};

	/* A driver bug must show up as a failed test, not as a killed process. */
	signal(SIGPIPE, SIG_DFL);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
