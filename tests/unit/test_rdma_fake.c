/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The clear-to-send protocol (drivers/rdma/rdma.c) through its driver ops
 * table, on the in-process FAKE RDMA provider of tests/fakes/fake_rdma_prov.c
 * instead of verbs or libfabric. The side channel is real TCP on loopback.
 * Nothing here touches an RDMA device.
 *
 * Every wait is bounded (WAIT_MS), so a broken protocol fails instead of
 * hanging.
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
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <moshpit/driver.h>

#include "drivers/rdma/rdma.h"
#include "fake_rdma_prov.h"
#include "log.h"

#define WAIT_MS 5000
#define QDEPTH 64           /* rdma.c: posted requests per direction, CTS ring slots */
#define HELLO_LEN 136       /* doc/protocol.md: the side-channel hello */

/* ---- the protocol on the fake ------------------------------------------ */

static int fake_init(const struct mp_drv_params *p, struct mp_drv **out);

/* The protocol's table with the fake bound in, as a provider makes one (rdma.h). */
static const struct mp_driver_ops fake_drv_ops = {
	MP_RDMA_DRIVER_OPS,
	.name = "rfake",
	.init = fake_init,
};

static int fake_init(const struct mp_drv_params *p, struct mp_drv **out)
{
	return mp_rdma_init(&fake_drv_ops, &fk_rdma_ops, 0, p, out);
}

struct peer {
	struct mp_drv *d;
	struct fk_prov *pv;
	struct mp_drv_listener *l;
	unsigned char addr[MP_DRV_ADDR_MAX];
	size_t alen;
};

#define MAX_PEERS 4
static struct peer peers[MAX_PEERS];
static int npeers;

static int64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static struct peer *peer_new(void)
{
	struct mp_drv_params p = {.size = sizeof(p), .run_name = "rfake", .rank = npeers,
				  .connect_timeout_ms = 1000};
	struct peer *pr = &peers[npeers++];

	memset(pr, 0, sizeof(*pr));
	assert_int_equal(fake_drv_ops.init(&p, &pr->d), 0);
	pr->pv = fk_last_open;
	assert_non_null(pr->pv);
	pr->alen = sizeof(pr->addr);
	assert_int_equal(fake_drv_ops.listen(pr->d, "127.0.0.1:0", pr->addr, &pr->alen, &pr->l), 0);
	return pr;
}

/* One progress call on every instance. */
static void drive(void)
{
	for (int i = 0; i < npeers; i++)
		assert_int_equal(fake_drv_ops.progress(peers[i].d, 0), 0);
}

/* @from connects to @to; returns both ends. */
static void link_peers(struct peer *from, struct peer *to, struct mp_drv_conn **cf,
		       struct mp_drv_conn **ct)
{
	int64_t end = now_ms() + WAIT_MS;
	int rc;

	assert_int_equal(fake_drv_ops.connect(from->d, to->addr, to->alen, cf), 0);
	while ((rc = fake_drv_ops.accept(to->l, ct)) == -EAGAIN) {
		assert_true(now_ms() < end);
		drive();
	}
	assert_int_equal(rc, 0);
}

/* Wait for @r; returns its status, its length in *@n. */
static int wait_req(struct mp_drv_req *r, size_t *n)
{
	int64_t end = now_ms() + WAIT_MS;
	size_t len = (size_t)-1;
	int done = 0, rc;

	for (;;) {
		rc = fake_drv_ops.test(r, &done, &len);
		if (done)
			break;
		assert_int_equal(rc, 0);
		assert_true(now_ms() < end);
		drive();
	}
	if (n)
		*n = len;
	return rc;
}

static int setup(void **state)
{
	(void)state;
	npeers = 0;
	fk_late_writes = 0;
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	for (int i = 0; i < npeers; i++) {
		fake_drv_ops.close_listener(peers[i].l);
		/* fini closes connections still open, and the provider: nothing may leak. */
		fake_drv_ops.fini(peers[i].d);
	}
	assert_int_equal(fk_live_eps(), 0);
	npeers = 0;
	return 0;
}

/* Byte @i of message @m. */
static unsigned char pat(unsigned m, size_t i)
{
	uint32_t x = m * 2654435761u ^ (uint32_t)i * 40503u;

	return (unsigned char)(x ^ x >> 13);
}

static void fill(unsigned char *p, unsigned m, size_t len)
{
	for (size_t i = 0; i < len; i++)
		p[i] = pat(m, i);
}

static void check(const unsigned char *p, unsigned m, size_t len)
{
	for (size_t i = 0; i < len; i++)
		if (p[i] != pat(m, i))
			fail_msg("message %u byte %zu: 0x%02x, expected 0x%02x", m, i, p[i], pat(m, i));
}

/* ---- tests ------------------------------------------------------------- */

/*
 * 300 messages B -> A with up to 64 of each kind posted, sizes 0..4000,
 * sources and destinations alternately registered and not (bounce buffers,
 * inline writes); then four messages of 1..3 MiB (several writes each, two
 * pieces). Each must arrive in posting order, byte-exact, with its length;
 * the 64-slot ring wraps four times and the fake's short send queue pushes
 * back.
 */
#define ORD_N 300
#define ORD_SLOT 4096
#define BIGCAP ((size_t)3 << 20)
static void fake_order_bytes_ring_wrap(void **state)
{
	struct peer *a, *b;
	struct mp_drv_conn *ca, *cb;
	struct mp_drv_mr *ra, *rb;
	struct mp_drv_req *rr[ORD_N], *sr[ORD_N];
	unsigned char *rreg = malloc((size_t)QDEPTH * ORD_SLOT), *sreg = malloc((size_t)QDEPTH * ORD_SLOT);
	unsigned char *rplain = malloc((size_t)QDEPTH * ORD_SLOT), *splain = malloc((size_t)QDEPTH * ORD_SLOT);
	size_t len[ORD_N];
	unsigned posted_r = 0, posted_s = 0, done_r = 0, done_s = 0;
	int64_t end = now_ms() + 4 * WAIT_MS;

	(void)state;
	assert_non_null(rreg);
	assert_non_null(sreg);
	assert_non_null(rplain);
	assert_non_null(splain);
	a = peer_new();
	b = peer_new();
	link_peers(b, a, &cb, &ca);
	assert_int_equal(fake_drv_ops.reg_mr(a->d, rreg, (size_t)QDEPTH * ORD_SLOT, MP_MEM_HOST, &ra), 0);
	assert_int_equal(fake_drv_ops.reg_mr(b->d, sreg, (size_t)QDEPTH * ORD_SLOT, MP_MEM_HOST, &rb), 0);
	for (unsigned i = 0; i < ORD_N; i++)
		len[i] = i % 5 == 0 ? (size_t)(i * 13) % ORD_SLOT : (size_t)(i * 37) % 200;

	while (done_r < ORD_N || done_s < ORD_N) {
		int done;
		size_t n;
		int rc;

		assert_true(now_ms() < end);
		/* Receives: slot i % 64, registered for even messages. */
		while (posted_r < ORD_N && posted_r - done_r < QDEPTH) {
			unsigned i = posted_r;
			unsigned char *buf = (i % 2 ? rplain : rreg) + (size_t)(i % QDEPTH) * ORD_SLOT;

			memset(buf, 0xee, ORD_SLOT);
			rc = fake_drv_ops.irecv(ca, buf, ORD_SLOT, i % 2 ? NULL : ra, &rr[i]);
			assert_int_equal(rc, 0);
			posted_r++;
		}
		/* Sends: registered when i % 3 == 0. */
		while (posted_s < ORD_N && posted_s - done_s < QDEPTH) {
			unsigned i = posted_s;
			unsigned char *buf = (i % 3 ? splain : sreg) + (size_t)(i % QDEPTH) * ORD_SLOT;
			struct mp_iov iov = {buf, len[i]};

			fill(buf, i, len[i]);
			rc = fake_drv_ops.isend(cb, &iov, 1, i % 3 ? NULL : rb, &sr[i]);
			assert_int_equal(rc, 0);
			posted_s++;
		}
		drive();
		/* Completions in order: a later one done before an earlier is a failure too. */
		while (done_r < posted_r) {
			unsigned i = done_r;
			unsigned char *buf = (i % 2 ? rplain : rreg) + (size_t)(i % QDEPTH) * ORD_SLOT;

			n = 0;
			rc = fake_drv_ops.test(rr[i], &done, &n);
			if (!done)
				break;
			assert_int_equal(rc, 0);
			assert_int_equal(n, len[i]);
			check(buf, i, n);
			assert_int_equal(buf[n], 0xee); /* nothing past the message */
			done_r++;
		}
		while (done_s < posted_s) {
			rc = fake_drv_ops.test(sr[done_s], &done, NULL);
			if (!done)
				break;
			assert_int_equal(rc, 0);
			done_s++;
		}
	}
	/* Every receive put one record into B's ring, every message one immediate into A. */
	assert_int_equal(b->pv->cts_in, ORD_N);
	assert_int_equal(a->pv->data_in, ORD_N);
	assert_true(ORD_N > 4 * QDEPTH);
	assert_true(a->pv->eagain > 0); /* 64 records at once overflow the 48-deep send queue */
	assert_int_equal(a->pv->errors_out + b->pv->errors_out, 0);

	/* Large messages: 1 MiB writes, two pieces, registered and not. */
	{
		enum { NB = 4 };
		size_t big[NB] = {(size_t)1 << 20, BIGCAP, (5u << 19) + 7, 1};
		unsigned char *src = malloc(BIGCAP), *dst[NB];
		struct mp_drv_mr *sm, *dm;
		struct mp_drv_req *br[NB], *bs[NB];
		unsigned char *dreg = malloc(BIGCAP + 64);

		assert_non_null(src);
		assert_non_null(dreg);
		assert_int_equal(fake_drv_ops.reg_mr(b->d, src, BIGCAP, MP_MEM_HOST, &sm), 0);
		assert_int_equal(fake_drv_ops.reg_mr(a->d, dreg, BIGCAP + 64, MP_MEM_HOST, &dm), 0);
		for (int k = 0; k < NB; k++) {
			dst[k] = k == 1 ? dreg : malloc(BIGCAP + 64);
			assert_non_null(dst[k]);
			memset(dst[k], 0xee, BIGCAP + 64);
			assert_int_equal(fake_drv_ops.irecv(ca, dst[k], BIGCAP, k == 1 ? dm : NULL,
							    &br[k]), 0);
		}
		for (int k = 0; k < NB; k++) {
			/* Two pieces from one buffer, filled per message before it is posted. */
			size_t half = big[k] / 2;
			struct mp_iov iov[2] = {{src, half}, {src + half, big[k] - half}};
			unsigned char *copy = malloc(big[k]);

			assert_non_null(copy);
			fill(copy, 1000 + (unsigned)k, big[k]);
			memcpy(src, copy, big[k]);
			free(copy);
			/* Unregistered pieces for k = 2 (bounce), registered otherwise. */
			if (k == 2) {
				unsigned char *tmp = malloc(big[k]);

				assert_non_null(tmp);
				memcpy(tmp, src, big[k]);
				iov[0].base = tmp;
				iov[1].base = tmp + half;
				assert_int_equal(fake_drv_ops.isend(cb, iov, 2, NULL, &bs[k]), 0);
				free(tmp); /* the bounce copy was taken at post time */
			} else {
				assert_int_equal(fake_drv_ops.isend(cb, iov, 2, sm, &bs[k]), 0);
			}
			/* The source is reused by the next message: wait for this one. */
			assert_int_equal(wait_req(bs[k], NULL), 0);
		}
		for (int k = 0; k < NB; k++) {
			size_t n = 0;

			assert_int_equal(wait_req(br[k], &n), 0);
			assert_int_equal(n, big[k]);
			check(dst[k], 1000 + (unsigned)k, n);
			assert_int_equal(dst[k][n], 0xee);
			if (k != 1)
				free(dst[k]);
		}
		assert_int_equal(a->pv->data_in, ORD_N + NB);
		fake_drv_ops.dereg_mr(b->d, sm);
		fake_drv_ops.dereg_mr(a->d, dm);
		free(src);
		free(dreg);
	}
	fake_drv_ops.close(ca);
	fake_drv_ops.close(cb);
	fake_drv_ops.dereg_mr(a->d, ra);
	fake_drv_ops.dereg_mr(b->d, rb);
	free(rreg);
	free(sreg);
	free(rplain);
	free(splain);
}

/* A short message reports its length; a long one fails both sides -EMSGSIZE. */
static void fake_short_and_long(void **state)
{
	struct peer *a, *b;
	struct mp_drv_conn *ca, *cb;
	struct mp_drv_req *r, *s;
	unsigned char rbuf[4096], sbuf[200];
	struct mp_iov iov = {sbuf, 100};
	size_t n = 0;

	(void)state;
	a = peer_new();
	b = peer_new();
	link_peers(b, a, &cb, &ca);

	memset(rbuf, 0xee, sizeof(rbuf));
	fill(sbuf, 1, sizeof(sbuf));
	assert_int_equal(fake_drv_ops.irecv(ca, rbuf, sizeof(rbuf), NULL, &r), 0);
	assert_int_equal(fake_drv_ops.isend(cb, &iov, 1, NULL, &s), 0);
	assert_int_equal(wait_req(s, NULL), 0);
	assert_int_equal(wait_req(r, &n), 0);
	assert_int_equal(n, 100);
	check(rbuf, 1, 100);
	for (size_t i = 100; i < sizeof(rbuf); i++)
		assert_int_equal(rbuf[i], 0xee);

	/* 101 bytes into 100: nothing written, both requests -EMSGSIZE. */
	memset(rbuf, 0xee, sizeof(rbuf));
	iov.len = 101;
	assert_int_equal(fake_drv_ops.irecv(ca, rbuf, 100, NULL, &r), 0);
	assert_int_equal(fake_drv_ops.isend(cb, &iov, 1, NULL, &s), 0);
	assert_int_equal(wait_req(r, &n), -EMSGSIZE);
	assert_int_equal(n, 101);
	assert_int_equal(wait_req(s, NULL), -EMSGSIZE);
	for (size_t i = 0; i < sizeof(rbuf); i++)
		assert_int_equal(rbuf[i], 0xee);

	/* The connection carries on. */
	fill(sbuf, 2, sizeof(sbuf));
	iov.len = 50;
	assert_int_equal(fake_drv_ops.irecv(ca, rbuf, 100, NULL, &r), 0);
	assert_int_equal(fake_drv_ops.isend(cb, &iov, 1, NULL, &s), 0);
	assert_int_equal(wait_req(r, &n), 0);
	assert_int_equal(n, 50);
	check(rbuf, 2, 50);
	assert_int_equal(wait_req(s, NULL), 0);
	assert_int_equal(a->pv->errors_out + b->pv->errors_out, 0);
}

/*
 * A completion error on A's connection to B fails exactly that connection's
 * posted requests with that error; A's connection to C carries on; B sees
 * the side channel close and fails its own requests; nothing hangs.
 */
static void completion_error(int err)
{
	struct peer *a, *b, *c;
	struct mp_drv_conn *ab, *ba, *ac, *ca;
	struct mp_drv_req *abr[3], *abs[2], *acr[3], *acs[2], *bar[2], *bas[3], *car[2], *cas[3];
	unsigned char abuf[3][256], cbuf[3][256], bbuf[2][256], cibuf[2][256], src[3][64];
	struct mp_iov iov;
	size_t n;

	a = peer_new();
	b = peer_new();
	c = peer_new();
	link_peers(a, b, &ab, &ba);
	link_peers(a, c, &ac, &ca);
	for (int k = 0; k < 3; k++)
		fill(src[k], (unsigned)k, sizeof(src[k]));

	/* The next write from A towards B fails with @err. */
	a->pv->inject_to = b->pv;
	a->pv->inject_status = err;
	iov.len = sizeof(src[0]);
	for (int k = 0; k < 3; k++) {
		assert_int_equal(fake_drv_ops.irecv(ab, abuf[k], sizeof(abuf[k]), NULL, &abr[k]), 0);
		assert_int_equal(fake_drv_ops.irecv(ac, cbuf[k], sizeof(cbuf[k]), NULL, &acr[k]), 0);
		iov.base = src[k];
		assert_int_equal(fake_drv_ops.isend(ba, &iov, 1, NULL, &bas[k]), 0);
		assert_int_equal(fake_drv_ops.isend(ca, &iov, 1, NULL, &cas[k]), 0);
	}
	for (int k = 0; k < 2; k++) {
		iov.base = src[k];
		assert_int_equal(fake_drv_ops.isend(ab, &iov, 1, NULL, &abs[k]), 0);
		assert_int_equal(fake_drv_ops.isend(ac, &iov, 1, NULL, &acs[k]), 0);
		assert_int_equal(fake_drv_ops.irecv(ba, bbuf[k], sizeof(bbuf[k]), NULL, &bar[k]), 0);
		assert_int_equal(fake_drv_ops.irecv(ca, cibuf[k], sizeof(cibuf[k]), NULL, &car[k]), 0);
	}

	/* A-B: every request of A's gets exactly @err. */
	for (int k = 0; k < 3; k++)
		assert_int_equal(wait_req(abr[k], NULL), err);
	for (int k = 0; k < 2; k++)
		assert_int_equal(wait_req(abs[k], NULL), err);
	/* ... and later posts are refused with it. */
	iov.base = src[0];
	assert_int_equal(fake_drv_ops.isend(ab, &iov, 1, NULL, &abs[0]), err);
	assert_int_equal(fake_drv_ops.irecv(ab, abuf[0], 16, NULL, &abr[0]), err);
	/* The injected one, then A's two other records flushed behind it. */
	assert_int_equal(a->pv->errors_out, 3);

	/* A-C: untouched. */
	for (int k = 0; k < 3; k++) {
		assert_int_equal(wait_req(acr[k], &n), 0);
		assert_int_equal(n, sizeof(src[k]));
		check(cbuf[k], (unsigned)k, n);
		assert_int_equal(wait_req(cas[k], NULL), 0);
	}
	for (int k = 0; k < 2; k++) {
		assert_int_equal(wait_req(acs[k], NULL), 0);
		assert_int_equal(wait_req(car[k], &n), 0);
		assert_int_equal(n, sizeof(src[k]));
		check(cibuf[k], (unsigned)k, n);
	}

	/*
	 * B: its records went to A's endpoint after A destroyed it. Nothing was
	 * placed; retries ran out (one late write, one flushed behind it) and
	 * B's requests fail with that.
	 */
	for (int k = 0; k < 3; k++)
		assert_int_equal(wait_req(bas[k], NULL), -ETIMEDOUT);
	for (int k = 0; k < 2; k++)
		assert_int_equal(wait_req(bar[k], NULL), -ETIMEDOUT);
	assert_int_equal(fk_late_writes, 1);
	assert_int_equal(b->pv->errors_out, 2);
	assert_int_equal(c->pv->errors_out, 0);
	fake_drv_ops.close(ab);
	fake_drv_ops.close(ba);
	fake_drv_ops.close(ac);
	fake_drv_ops.close(ca);
}

static void fake_error_retry_exceeded(void **state)
{
	(void)state;
	completion_error(-ETIMEDOUT);
}

static void fake_error_remote_access(void **state)
{
	(void)state;
	completion_error(-EACCES);
}

static void fake_error_flush(void **state)
{
	(void)state;
	completion_error(-ECANCELED);
}

/* close() completes every posted request -ECANCELED. */
static void fake_close_cancels(void **state)
{
	struct peer *a, *b;
	struct mp_drv_conn *ca, *cb;
	struct mp_drv_req *s[3], *r[2];
	unsigned char src[3][32], dst[2][64];
	int64_t end;

	(void)state;
	a = peer_new();
	b = peer_new();
	link_peers(a, b, &ca, &cb);
	for (int k = 0; k < 3; k++) {
		struct mp_iov iov = {src[k], sizeof(src[k])};

		assert_int_equal(fake_drv_ops.isend(ca, &iov, 1, NULL, &s[k]), 0);
	}
	for (int k = 0; k < 2; k++)
		assert_int_equal(fake_drv_ops.irecv(ca, dst[k], sizeof(dst[k]), NULL, &r[k]), 0);
	/* Let the records reach B; B posts nothing, so nothing can complete. */
	end = now_ms() + 100;
	while (now_ms() < end)
		drive();
	assert_int_equal(b->pv->cts_in, 2);
	fake_drv_ops.close(ca);
	for (int k = 0; k < 3; k++) {
		int done = 0;

		assert_int_equal(fake_drv_ops.test(s[k], &done, NULL), -ECANCELED);
		assert_int_equal(done, 1);
	}
	for (int k = 0; k < 2; k++) {
		int done = 0;

		assert_int_equal(fake_drv_ops.test(r[k], &done, NULL), -ECANCELED);
		assert_int_equal(done, 1);
	}
	fake_drv_ops.close(cb);
}

/*
 * Up to 64 posted requests per direction, then -EAGAIN; one completion
 * makes room for exactly one more.
 */
static void fake_backpressure(void **state)
{
	struct peer *a, *b;
	struct mp_drv_conn *ca, *cb;
	struct mp_drv_req *s[QDEPTH], *r[QDEPTH], *x;
	unsigned char src[8], dst[QDEPTH][8];
	struct mp_iov iov = {src, sizeof(src)};
	int accepted = 0, rc;
	size_t n;

	(void)state;
	a = peer_new();
	b = peer_new();
	link_peers(a, b, &ca, &cb);
	fill(src, 7, sizeof(src));
	for (int k = 0; k < QDEPTH + 3; k++) {
		rc = fake_drv_ops.isend(ca, &iov, 1, NULL, k < QDEPTH ? &s[k] : &x);
		if (!rc)
			accepted++;
		else
			assert_int_equal(rc, -EAGAIN);
	}
	assert_int_equal(accepted, QDEPTH);
	/* One receive: one message through, so one send done and one slot free. */
	assert_int_equal(fake_drv_ops.irecv(cb, dst[0], sizeof(dst[0]), NULL, &r[0]), 0);
	assert_int_equal(wait_req(r[0], &n), 0);
	assert_int_equal(n, sizeof(src));
	assert_int_equal(wait_req(s[0], NULL), 0);
	assert_int_equal(fake_drv_ops.isend(ca, &iov, 1, NULL, &s[0]), 0);
	assert_int_equal(fake_drv_ops.isend(ca, &iov, 1, NULL, &x), -EAGAIN);
	/* The receive side: 64, then -EAGAIN. */
	accepted = 0;
	for (int k = 0; k < QDEPTH + 3; k++) {
		rc = fake_drv_ops.irecv(cb, dst[k % QDEPTH], sizeof(dst[0]), NULL,
					k < QDEPTH ? &r[k] : &x);
		if (!rc)
			accepted++;
		else
			assert_int_equal(rc, -EAGAIN);
	}
	assert_int_equal(accepted, QDEPTH);
	for (int k = 0; k < QDEPTH; k++) {
		assert_int_equal(wait_req(r[k], &n), 0);
		assert_int_equal(n, sizeof(src));
		check(dst[k], 7, n);
	}
	for (int k = 0; k < QDEPTH; k++)
		assert_int_equal(wait_req(s[k], NULL), 0);
	assert_int_equal(b->pv->data_in, QDEPTH + 1);
	fake_drv_ops.close(ca);
	fake_drv_ops.close(cb);
}

/* ---- bad handshakes ---------------------------------------------------- */

/* Log lines go to stderr; the bad-handshake test counts them in a file. */
static int log_saved = -1;
static int log_level_saved;
static char log_path[64];

static void log_capture(void)
{
	int fd;

	snprintf(log_path, sizeof(log_path), "/tmp/test_rdma_fake.%d.log", (int)getpid());
	fd = open(log_path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	assert_true(fd >= 0);
	fflush(stderr);
	/* A hello cut short is churn as much as an attack: logged at INFO. */
	log_level_saved = mp_log_get_level();
	mp_log_set_level(MP_LOG_INFO);
	log_saved = dup(2);
	assert_true(log_saved >= 0);
	assert_true(dup2(fd, 2) == 2);
	close(fd);
}

/* Stop capturing; returns how many captured lines contain @what. */
static int log_release(const char *what)
{
	char line[1024];
	FILE *f;
	int count = 0;

	fflush(stderr);
	mp_log_set_level(log_level_saved);
	dup2(log_saved, 2);
	close(log_saved);
	log_saved = -1;
	f = fopen(log_path, "r");
	assert_non_null(f);
	while (fgets(line, sizeof(line), f)) {
		fputs(line, stderr); /* still shown */
		if (strstr(line, what))
			count++;
	}
	fclose(f);
	unlink(log_path);
	return count;
}

static void put32(unsigned char *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (unsigned char)(v >> 8 * i);
}

/* A well-formed hello from a stranger, which the cases below spoil. */
static void hello_good(unsigned char *h)
{
	memset(h, 0, HELLO_LEN);
	put32(h, 0x3152504dU);
	h[4] = 1;           /* version */
	h[6] = 8;           /* blob length */
	memcpy(h + 8, "fake", 4);
	put32(h + 40, FK_BLOB_MAGIC);
	put32(h + 44, FK_MAX_EPS - 1); /* names no endpoint */
}

enum bad_kind { BAD_MAGIC, BAD_VERSION, BAD_PROVIDER, BAD_BLOB_LEN, BAD_TRUNCATED_EOF,
		BAD_TRUNCATED_SILENT, BAD_N };

/*
 * Strangers on A's side channel: wrong magic, version, provider, blob
 * length; a hello cut short by the end of the stream; one cut short that
 * then says nothing. Each is refused (the socket closed without a byte
 * back, nothing to accept), logged with its reason, and leaves no endpoint
 * or registration behind; A's connection to B carries on.
 */
static void fake_bad_handshake(void **state)
{
	static const char *reason[BAD_N] = {
		"not a moshpit RDMA handshake", "handshake version 7", "peer speaks provider 'verbs'",
		"endpoint description of 0 bytes", "peer closed the side channel during the handshake",
		"handshake with 127.0.0.1",
	};
	struct peer *a, *b;
	struct mp_drv_conn *ca, *cb, *x;
	struct mp_drv_req *r, *s;
	unsigned char h[HELLO_LEN], buf[64];
	struct sockaddr_in sin;
	int eps, mrs;
	size_t n;

	(void)state;
	a = peer_new();
	b = peer_new();
	link_peers(b, a, &cb, &ca);
	eps = a->pv->live_eps;
	mrs = a->pv->live_mrs;
	memset(&sin, 0, sizeof(sin));
	sin.sin_family = AF_INET;
	memcpy(&sin.sin_port, a->addr + 2, 2);
	memcpy(&sin.sin_addr, a->addr + 4, 4);

	for (int kind = 0; kind < BAD_N; kind++) {
		int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
		int64_t end = now_ms() + WAIT_MS;
		size_t len = HELLO_LEN;
		ssize_t got;

		hello_good(h);
		switch (kind) {
		case BAD_MAGIC:
			put32(h, 0x31504d4fU);
			break;
		case BAD_VERSION:
			h[4] = 7;
			break;
		case BAD_PROVIDER:
			memcpy(h + 8, "verbs", 5);
			break;
		case BAD_BLOB_LEN:
			h[6] = 0;
			break;
		default:
			len = 50;
			break;
		}
		log_capture();
		assert_true(fd >= 0);
		assert_int_equal(connect(fd, (struct sockaddr *)&sin, sizeof(sin)), 0);
		assert_int_equal(send(fd, h, len, MSG_NOSIGNAL), (ssize_t)len);
		if (kind == BAD_TRUNCATED_EOF)
			shutdown(fd, SHUT_WR);
		fcntl(fd, F_SETFL, O_NONBLOCK);
		/* Refused: the socket closes and not one byte of ours comes back. */
		for (;;) {
			got = recv(fd, buf, sizeof(buf), 0);
			if (got >= 0 || (errno != EAGAIN && errno != EWOULDBLOCK))
				break;
			assert_true(now_ms() < end);
			assert_int_equal(fake_drv_ops.accept(a->l, &x), -EAGAIN);
			drive();
		}
		assert_int_equal(got, 0);
		close(fd);
		drive();
		assert_int_equal(fake_drv_ops.accept(a->l, &x), -EAGAIN);
		assert_int_equal(log_release(reason[kind]), 1);
		/* Nothing left behind. */
		assert_int_equal(a->pv->live_eps, eps);
		assert_int_equal(a->pv->live_mrs, mrs);
	}
	assert_int_equal(a->pv->errors_out + b->pv->errors_out, 0);

	/* The real connection never noticed. */
	{
		unsigned char src[16];
		struct mp_iov iov = {src, sizeof(src)};

		fill(src, 9, sizeof(src));
		assert_int_equal(fake_drv_ops.irecv(ca, buf, sizeof(buf), NULL, &r), 0);
		assert_int_equal(fake_drv_ops.isend(cb, &iov, 1, NULL, &s), 0);
		assert_int_equal(wait_req(r, &n), 0);
		assert_int_equal(n, sizeof(src));
		check(buf, 9, n);
		assert_int_equal(wait_req(s, NULL), 0);
	}
	fake_drv_ops.close(ca);
	fake_drv_ops.close(cb);
}

/*
 * No write lands in a receive buffer after it was handed back. A posts a
 * receive into registered memory, B holds A's clear-to-send record for it,
 * A closes the connection and reuses the buffer; B, not yet aware, sends.
 * The protocol must have destroyed A's endpoint before handing the buffer
 * back, so the fake places nothing: the buffer keeps what A put there and
 * the write is counted as late.
 */
static void fake_late_write_after_close(void **state)
{
	struct peer *a, *b;
	struct mp_drv_conn *ca, *cb;
	struct mp_drv_mr *mr;
	struct mp_drv_req *r, *s;
	unsigned char *buf = malloc(4096), src[512];
	struct mp_iov iov = {src, sizeof(src)};
	int64_t end = now_ms() + WAIT_MS;

	(void)state;
	assert_non_null(buf);
	a = peer_new();
	b = peer_new();
	link_peers(b, a, &cb, &ca);
	assert_int_equal(fake_drv_ops.reg_mr(a->d, buf, 4096, MP_MEM_HOST, &mr), 0);
	assert_int_equal(fake_drv_ops.irecv(ca, buf, 4096, mr, &r), 0);
	while (b->pv->cts_in < 1) {
		assert_true(now_ms() < end);
		drive();
	}
	fake_drv_ops.close(ca);
	assert_int_equal(wait_req(r, NULL), -ECANCELED);
	memset(buf, 0x5c, 4096); /* the application's new contents */

	/* B has not progressed since: its side channel EOF is still unread. */
	fill(src, 3, sizeof(src));
	assert_int_equal(fake_drv_ops.isend(cb, &iov, 1, NULL, &s), 0);
	assert_int_not_equal(wait_req(s, NULL), 0);
	assert_int_equal(fk_late_writes, 1);
	for (size_t i = 0; i < 4096; i++)
		if (buf[i] != 0x5c)
			fail_msg("byte %zu of a buffer handed back was overwritten", i);
	assert_int_equal(a->pv->data_in, 0);
	fake_drv_ops.close(cb);
	fake_drv_ops.dereg_mr(a->d, mr);
	free(buf);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(fake_order_bytes_ring_wrap, setup, teardown),
		cmocka_unit_test_setup_teardown(fake_short_and_long, setup, teardown),
		cmocka_unit_test_setup_teardown(fake_error_retry_exceeded, setup, teardown),
		cmocka_unit_test_setup_teardown(fake_error_remote_access, setup, teardown),
		cmocka_unit_test_setup_teardown(fake_error_flush, setup, teardown),
		cmocka_unit_test_setup_teardown(fake_close_cancels, setup, teardown),
		cmocka_unit_test_setup_teardown(fake_backpressure, setup, teardown),
		cmocka_unit_test_setup_teardown(fake_bad_handshake, setup, teardown),
		cmocka_unit_test_setup_teardown(fake_late_write_after_close, setup, teardown),
	};

	signal(SIGPIPE, SIG_IGN);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
