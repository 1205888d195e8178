/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The verbs provider (drivers/verbs/) through the RDMA-provider table
 * (drivers/rdma/prov.h), against the in-process FAKE of libibverbs in
 * tests/fakes/fake_ibverbs.c, swapped in through drivers/verbs/ibv.h.
 * Nothing here touches an RDMA device.
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
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "mp_build_config.h"
#include "drivers/rdma/prov.h"
#include "drivers/verbs/ibv.h"
#include "fake_ibverbs.h"

static const struct mp_rdma_prov_ops *P = &mp_rdma_verbs_prov;

static int setup(void **state)
{
	(void)state;
	fk_reset();
	unsetenv("MP_IB_HCA");
	unsetenv("MP_IB_GID_INDEX");
	unsetenv("MP_IB_TIMEOUT");
	unsetenv("MP_IB_RETRY_CNT");
	mp_verbs_ibv = &fk_ibv;
	return 0;
}

/* Everything the provider took from the fake was given back. */
static int teardown(void **state)
{
	(void)state;
	mp_verbs_ibv = &mp_verbs_ibv_real;
	assert_int_equal(fk.lists_out, 0);
	assert_int_equal(fk.ctxs, 0);
	assert_int_equal(fk.pds, 0);
	assert_int_equal(fk.cqs, 0);
	assert_int_equal(fk.qps, 0);
	assert_int_equal(fk.mrs, 0);
	assert_int_equal(fk.cq_overflow, 0);
	assert_int_equal(fk.cq_overcommit, 0);
	return 0;
}

/* ---- helpers ----------------------------------------------------------- */

static int open_prov(int max_outstanding, int timeout_ms, struct mp_rdma_prov **pv)
{
	struct mp_rdma_params p = {.rank = 0, .max_eps = 4, .max_outstanding = max_outstanding,
				   .timeout_ms = timeout_ms};
	return P->open(&p, pv);
}

/* The variable set to the value, then open_prov must fail with @p rc. */
static void open_refused(const char *var, const char *value, int rc)
{
	struct mp_rdma_prov *pv = NULL;
	setenv(var, value, 1);
	assert_int_equal(open_prov(0, 0, &pv), rc);
}

/* Two providers, an endpoint on each, and (pair_reg) a source on A and a target on B. */
struct pair {
	struct mp_rdma_prov *a, *b;
	struct mp_rdma_ep *ea, *eb;
	uint8_t blob_a[MP_RDMA_EP_BLOB_MAX], blob_b[MP_RDMA_EP_BLOB_MAX];
	size_t la, lb;
	struct mp_rdma_mr *ms, *md;
};

/* New endpoints on the pair's providers; A connected to B, and B to A if @p both. */
static void pair_eps(struct pair *p, bool both)
{
	p->la = sizeof(p->blob_a);
	p->lb = sizeof(p->blob_b);
	assert_int_equal(P->ep_create(p->a, p->blob_a, &p->la, &p->ea), 0);
	assert_int_equal(P->ep_create(p->b, p->blob_b, &p->lb, &p->eb), 0);
	assert_int_equal(P->ep_connect(p->ea, p->blob_b, p->lb), 0);
	if (both)
		assert_int_equal(P->ep_connect(p->eb, p->blob_a, p->la), 0);
}

static void pair_open(struct pair *p, int max_outstanding)
{
	memset(p, 0, sizeof(*p));
	assert_int_equal(open_prov(max_outstanding, 0, &p->a), 0);
	assert_int_equal(open_prov(max_outstanding, 0, &p->b), 0);
	pair_eps(p, true);
}

/* Host memory: @p src (unless NULL) registered on A as ms, @p dst on B as md. */
static void pair_reg(struct pair *p, void *src, size_t src_len, void *dst, size_t dst_len)
{
	if (src)
		assert_int_equal(P->reg(p->a, src, src_len, MP_MEM_HOST, &p->ms), 0);
	assert_int_equal(P->reg(p->b, dst, dst_len, MP_MEM_HOST, &p->md), 0);
}

/* What pair_reg registered is given back before the providers close. */
static void pair_close(struct pair *p)
{
	if (p->ms)
		P->dereg(p->a, p->ms);
	if (p->md)
		P->dereg(p->b, p->md);
	P->close(p->a);
	P->close(p->b);
}

static struct fk_qp *fk_qp_of_blob(const uint8_t *blob)
{
	uint32_t qpn = (uint32_t)blob[4] | (uint32_t)blob[5] << 8 | (uint32_t)blob[6] << 16;
	return fk_qp_by_num(qpn);
}

/* ---- tests ------------------------------------------------------------- */

static void test_fake_open_no_device(void **state)
{
	(void)state;
	struct mp_rdma_prov *pv = NULL;
	/* As on this machine: the library finds no RDMA subsystem at all. */
	fk.list_errno = ENOSYS;
	assert_int_equal(open_prov(0, 0, &pv), -ENODEV);
	assert_null(pv);
	/* A list without devices. */
	fk.list_errno = 0;
	fk.ndev = 0;
	assert_int_equal(open_prov(0, 0, &pv), -ENODEV);
	/* Devices, but none has an active port. */
	fk_world_ib();
	fk.dev[0].port[0].state = IBV_PORT_DOWN;
	assert_int_equal(open_prov(0, 0, &pv), -ENODEV);
	assert_int_equal(fk.ctxs, 0);
}

/* The port and GID index an endpoint's blob reports (bytes 14 and 15). */
static void open_blob(struct mp_rdma_prov **pv, uint8_t *blob)
{
	struct mp_rdma_ep *ep;
	size_t len = MP_RDMA_EP_BLOB_MAX;
	assert_int_equal(open_prov(0, 0, pv), 0);
	assert_int_equal(P->ep_create(*pv, blob, &len, &ep), 0);
	assert_int_equal(len, 32);
	P->ep_destroy(ep);
}

static void test_fake_hca_selection(void **state)
{
	(void)state;
	struct mp_rdma_prov *pv = NULL;
	uint8_t b[MP_RDMA_EP_BLOB_MAX];
	fk_world_roce();

	/* Unset: the first device with an active port. */
	open_blob(&pv, b);
	assert_int_equal(b[2], IBV_LINK_LAYER_ETHERNET);
	assert_int_equal(b[14], 1);
	P->close(pv);

	/* A device by name: its first active port, 2; LID and MTU from that port. */
	setenv("MP_IB_HCA", "fake_ib1", 1);
	open_blob(&pv, b);
	assert_int_equal(b[2], IBV_LINK_LAYER_INFINIBAND);
	assert_int_equal(b[14], 2);
	assert_int_equal(b[12] | b[13] << 8, 9);
	assert_int_equal(b[3], IBV_MTU_2048);
	P->close(pv);
	setenv("MP_IB_HCA", "fake_ib1:2", 1);
	open_blob(&pv, b);
	assert_int_equal(b[14], 2);
	P->close(pv);

	/* Refused, each with its own code: a down port, a port that does not exist, no such device, syntax. */
	open_refused("MP_IB_HCA", "fake_ib1:1", -ENODEV);
	open_refused("MP_IB_HCA", "fake_ib1:3", -EINVAL);
	open_refused("MP_IB_HCA", "mlx5_9", -ENODEV);
	open_refused("MP_IB_HCA", "fake_ib1:x", -EINVAL);
	open_refused("MP_IB_HCA", ":1", -EINVAL);
	open_refused("MP_IB_HCA", "fake_ib1:0", -EINVAL);
	assert_int_equal(fk.ctxs, 0);
}

static void test_fake_gid_selection(void **state)
{
	(void)state;
	struct mp_rdma_prov *pv = NULL;
	uint8_t b[MP_RDMA_EP_BLOB_MAX];
	uint8_t v4[16];
	assert_int_equal(inet_pton(AF_INET6, "::ffff:10.0.0.1", v4), 1);
	fk_world_roce();

	/* Default on RoCE: the RoCE v2 GID of the IPv4 address, index 3 (not the v1 at 2). */
	open_blob(&pv, b);
	assert_int_equal(b[15], 3);
	assert_memory_equal(b + 16, v4, 16);
	P->close(pv);

	setenv("MP_IB_GID_INDEX", "1", 1);
	open_blob(&pv, b);
	assert_int_equal(b[15], 1);
	assert_memory_equal(b + 16, fk.dev[0].port[0].gid[1].gid.raw, 16);
	P->close(pv);

	/* Out of the table (6 entries), an empty entry, not a number. */
	open_refused("MP_IB_GID_INDEX", "6", -EINVAL);
	open_refused("MP_IB_GID_INDEX", "5", -EINVAL);
	open_refused("MP_IB_GID_INDEX", "3x", -EINVAL);
	open_refused("MP_IB_GID_INDEX", "-1", -EINVAL);

	/* No RoCE v2 IPv4 GID: index 0. */
	unsetenv("MP_IB_GID_INDEX");
	fk.dev[0].port[0].gid[3].gid_type = IBV_GID_TYPE_ROCE_V1;
	open_blob(&pv, b);
	assert_int_equal(b[15], 0);
	P->close(pv);

	/* InfiniBand: index 0 and the port's GID. */
	fk_world_ib();
	open_blob(&pv, b);
	assert_int_equal(b[15], 0);
	assert_memory_equal(b + 16, fk.dev[0].port[0].gid[0].gid.raw, 16);
	P->close(pv);
	assert_int_equal(fk.ctxs, 0);
}

/* A provider whose one endpoint is connected to itself: that endpoint's queue pair. */
static struct fk_qp *loopback_qp(int timeout_ms, struct mp_rdma_prov **pv)
{
	uint8_t b[MP_RDMA_EP_BLOB_MAX];
	size_t len = sizeof(b);
	struct mp_rdma_ep *ep;
	assert_int_equal(open_prov(0, timeout_ms, pv), 0);
	assert_int_equal(P->ep_create(*pv, b, &len, &ep), 0);
	assert_int_equal(P->ep_connect(ep, b, len), 0);
	return fk_qp_of_blob(b);
}

/* The RC attributes that reach the queue pair: env, derived from timeout_ms, defaults. */
static void test_fake_qp_attributes(void **state)
{
	(void)state;
	struct pair p;
	pair_open(&p, 0);
	struct fk_qp *qa = fk_qp_of_blob(p.blob_a), *qb = fk_qp_of_blob(p.blob_b);
	assert_non_null(qa);
	assert_non_null(qb);
	assert_int_equal(qa->st, IBV_QPS_RTS);
	assert_int_equal(qa->timeout, 18);
	assert_int_equal(qa->retry, 7);
	assert_int_equal(qa->rnr, 7);
	/* Each side's receive PSN is the other's send PSN, taken from the blobs. */
	assert_int_equal(qa->rq_psn, qb->sq_psn);
	assert_int_equal(qb->rq_psn, qa->sq_psn);
	assert_int_equal(qa->dest_qpn, qb->qp.qp_num);
	assert_int_equal(qa->ah.dlid, 7);
	assert_int_equal(qa->ah.is_global, 0);
	assert_int_equal(qa->mtu, IBV_MTU_4096);
	/* Default depth 64: 2 x 64 receives kept posted. */
	assert_int_equal(qa->rq_count, 128);
	pair_close(&p);

	/* A 1 s protocol timeout: 8 attempts of 4.096 us x 2^14 = 537 ms fit, 2^15 would not. */
	struct mp_rdma_prov *pv;
	assert_int_equal(loopback_qp(1000, &pv)->timeout, 14);
	P->close(pv);

	setenv("MP_IB_TIMEOUT", "20", 1);
	setenv("MP_IB_RETRY_CNT", "3", 1);
	struct fk_qp *q = loopback_qp(1000, &pv);
	assert_int_equal(q->timeout, 20);
	assert_int_equal(q->retry, 3);
	P->close(pv);
	open_refused("MP_IB_TIMEOUT", "0", -EINVAL);
	open_refused("MP_IB_TIMEOUT", "32", -EINVAL);
	unsetenv("MP_IB_TIMEOUT");
	open_refused("MP_IB_RETRY_CNT", "8", -EINVAL);
}

/* A RoCE pair routes by GID: a global route to the peer's RoCE v2 GID. */
static void test_fake_roce_route(void **state)
{
	(void)state;
	fk_world_roce();
	fk.ndev = 1;
	struct pair p;
	pair_open(&p, 8);
	struct fk_qp *qa = fk_qp_of_blob(p.blob_a);
	assert_int_equal(qa->ah.is_global, 1);
	assert_int_equal(qa->ah.grh.sgid_index, 3);
	assert_memory_equal(qa->ah.grh.dgid.raw, fk.dev[0].port[0].gid[3].gid.raw, 16);
	assert_int_equal(qa->mtu, IBV_MTU_1024);

	char src[256], dst[256];
	memset(src, 0x5a, sizeof(src));
	memset(dst, 0, sizeof(dst));
	pair_reg(&p, src, sizeof(src), dst, sizeof(dst));
	assert_int_equal(P->write(p.ea, src, sizeof(src), p.ms, (uintptr_t)dst, p.md->rkey, 0,
				  MP_RDMA_WR_SIGNAL, 1), 0);
	struct mp_rdma_cqe c[4];
	assert_int_equal(P->poll(p.a, c, 4), 1);
	assert_int_equal(c[0].status, 0);
	assert_memory_equal(dst, src, sizeof(dst));
	pair_close(&p);
}

static void test_fake_write_lands(void **state)
{
	(void)state;
	struct pair p;
	pair_open(&p, 16);
	enum { N = 4096, OFF = 100 };
	uint8_t *src = malloc(N), *dst = malloc(N + 2 * OFF);
	assert_true(src && dst);
	for (int i = 0; i < N; i++)
		src[i] = (uint8_t)(i * 7 + 3);
	memset(dst, 0xee, N + 2 * OFF);
	pair_reg(&p, src, N, dst, N + 2 * OFF);
	assert_ptr_equal(p.ms->addr, src);
	assert_int_equal(p.ms->len, N);
	assert_int_equal(p.ms->kind, MP_MEM_HOST);

	assert_int_equal(P->write(p.ea, src, N, p.ms, (uintptr_t)dst + OFF, p.md->rkey, 0,
				  MP_RDMA_WR_SIGNAL, 0xabc), 0);
	struct mp_rdma_cqe c[4];
	assert_int_equal(P->poll(p.a, c, 4), 1);
	assert_int_equal(c[0].op, MP_RDMA_CQE_WRITE);
	assert_int_equal(c[0].status, 0);
	assert_int_equal(c[0].wr_id, 0xabc);
	assert_ptr_equal(c[0].ep, p.ea);
	assert_memory_equal(dst + OFF, src, N);
	for (int i = 0; i < OFF; i++) {
		assert_int_equal(dst[i], 0xee);
		assert_int_equal(dst[OFF + N + i], 0xee);
	}
	/* A plain write gives the target nothing to poll. */
	assert_int_equal(P->poll(p.b, c, 4), 0);

	/* Unsignalled: no completion at all, but the data lands. */
	memset(dst, 0, N + 2 * OFF);
	assert_int_equal(P->write(p.ea, src + 10, 20, p.ms, (uintptr_t)dst, p.md->rkey, 0, 0, 1), 0);
	assert_int_equal(P->poll(p.a, c, 4), 0);
	assert_memory_equal(dst, src + 10, 20);
	assert_int_equal(dst[20], 0);

	/* The source must lie in the registration it names. */
	assert_int_equal(P->write(p.ea, src + N - 4, 8, p.ms, (uintptr_t)dst, p.md->rkey, 0, 0, 1),
			 -EINVAL);
	assert_int_equal(P->write(p.ea, src, 8, NULL, (uintptr_t)dst, p.md->rkey, 0, 0, 1), -EINVAL);
	pair_close(&p);
	free(src);
	free(dst);
}

static void test_fake_write_imm(void **state)
{
	(void)state;
	struct pair p;
	pair_open(&p, 16);
	static uint32_t src[1000], dst[1000];
	for (int i = 0; i < 1000; i++)
		src[i] = (uint32_t)i * 2654435761u;
	pair_reg(&p, src, sizeof(src), dst, sizeof(dst));

	assert_int_equal(P->write(p.ea, src, 1000, p.ms, (uintptr_t)dst, p.md->rkey, 0xdeadbeef,
				  MP_RDMA_WR_IMM, 7), 0);
	struct mp_rdma_cqe c[64];
	assert_int_equal(P->poll(p.a, c, 64), 0);
	assert_int_equal(P->poll(p.b, c, 64), 1);
	assert_int_equal(c[0].op, MP_RDMA_CQE_IMM);
	assert_int_equal(c[0].status, 0);
	assert_int_equal(c[0].imm, 0xdeadbeef);
	assert_int_equal(c[0].len, 1000);
	assert_ptr_equal(c[0].ep, p.eb);
	assert_memory_equal(dst, src, 1000);

	/*
	 * 300 writes with immediate through 32 posted receives and a send queue
	 * of 16: the receives are replaced as they are polled, and every
	 * immediate arrives once, in order, with its length.
	 */
	int posted = 0, got = 0;
	for (int round = 0; round < 10000 && got < 300; round++) {
		while (posted < 300) {
			size_t off = (size_t)(posted % 250) * 16;
			int rc = P->write(p.ea, (char *)src + off, 16, p.ms, (uintptr_t)dst + off,
					  p.md->rkey, (uint32_t)posted, MP_RDMA_WR_IMM, (uint64_t)posted);
			if (rc == -EAGAIN)
				break;
			assert_int_equal(rc, 0);
			posted++;
		}
		assert_int_equal(P->poll(p.a, c, 64), 0);
		int n = P->poll(p.b, c, 64);
		assert_true(n >= 0);
		for (int i = 0; i < n; i++) {
			assert_int_equal(c[i].op, MP_RDMA_CQE_IMM);
			assert_int_equal(c[i].status, 0);
			assert_int_equal(c[i].imm, (uint32_t)got);
			assert_int_equal(c[i].len, 16);
			got++;
		}
	}
	assert_int_equal(got, 300);
	assert_int_equal(fk_qp_of_blob(p.blob_b)->rq_count, 32);

	/* Zero bytes with an immediate: a bare notification. */
	assert_int_equal(P->write(p.ea, NULL, 0, NULL, 0, 0, 42, MP_RDMA_WR_IMM, 9), 0);
	assert_int_equal(P->poll(p.b, c, 64), 1);
	assert_int_equal(c[0].imm, 42);
	assert_int_equal(c[0].len, 0);
	pair_close(&p);
}

static void test_fake_inline(void **state)
{
	(void)state;
	struct pair p;
	pair_open(&p, 16);
	static char dst[128];
	pair_reg(&p, NULL, 0, dst, sizeof(dst));
	assert_int_equal(P->max_inline(p.a), 64);

	/* Copied when posted: the (unregistered) source is reused before the write is carried out. */
	char rec[64];
	memset(rec, 'A', sizeof(rec));
	fk.hold = true;
	assert_int_equal(P->write(p.ea, rec, sizeof(rec), NULL, (uintptr_t)dst, p.md->rkey, 5,
				  MP_RDMA_WR_INLINE | MP_RDMA_WR_IMM | MP_RDMA_WR_SIGNAL, 3), 0);
	memset(rec, 'B', sizeof(rec));
	fk.hold = false;
	struct mp_rdma_cqe c[4];
	assert_int_equal(P->poll(p.a, c, 4), 1);
	assert_int_equal(c[0].wr_id, 3);
	assert_int_equal(c[0].status, 0);
	assert_int_equal(P->poll(p.b, c, 4), 1);
	assert_int_equal(c[0].len, 64);
	for (int i = 0; i < 64; i++)
		assert_int_equal(dst[i], 'A');
	char big[65] = {0};
	assert_int_equal(P->write(p.ea, big, sizeof(big), NULL, (uintptr_t)dst, p.md->rkey, 0,
				  MP_RDMA_WR_INLINE, 4), -EMSGSIZE);
	pair_close(&p);
}

static void test_fake_remote_access_error(void **state)
{
	(void)state;
	struct pair p;
	pair_open(&p, 16);
	static char src[512], dst[512];
	pair_reg(&p, src, sizeof(src), dst, sizeof(dst));

	/* A wrong rkey, on an unsignalled write: errors always complete, with the caller's wr_id. */
	assert_int_equal(P->write(p.ea, src, 64, p.ms, (uintptr_t)dst, p.md->rkey + 1, 0, 0, 77), 0);
	struct mp_rdma_cqe c[8];
	assert_int_equal(P->poll(p.a, c, 8), 1);
	assert_int_equal(c[0].op, MP_RDMA_CQE_WRITE);
	assert_int_equal(c[0].status, -EACCES);
	assert_int_equal(c[0].wr_id, 77);
	assert_ptr_equal(c[0].ep, p.ea);
	/* The endpoint is broken now: refused at post time. */
	assert_int_equal(P->write(p.ea, src, 64, p.ms, (uintptr_t)dst, p.md->rkey, 0, 0, 78),
			 -ECONNRESET);
	P->ep_destroy(p.ea);
	P->ep_destroy(p.eb);

	/* Out of bounds: the last 10 bytes of dst plus 90 beyond it. */
	pair_eps(&p, true);
	assert_int_equal(P->write(p.ea, src, 100, p.ms, (uintptr_t)dst + sizeof(dst) - 10, p.md->rkey,
				  1, MP_RDMA_WR_IMM | MP_RDMA_WR_SIGNAL, 79), 0);
	assert_int_equal(P->poll(p.a, c, 8), 1);
	assert_int_equal(c[0].status, -EACCES);
	assert_int_equal(c[0].wr_id, 79);
	assert_int_equal(P->poll(p.b, c, 8), 0);
	pair_close(&p);
}

static void test_fake_retry_exceeded(void **state)
{
	(void)state;
	struct pair p;
	pair_open(&p, 16);
	static char src[256], dst[256];
	pair_reg(&p, src, sizeof(src), dst, sizeof(dst));

	/* Three outstanding writes; the first one's retries run out, the rest are flushed. */
	fk.hold = true;
	for (int i = 0; i < 3; i++)
		assert_int_equal(P->write(p.ea, src, 8, p.ms, (uintptr_t)dst, p.md->rkey, 0,
					  i == 1 ? MP_RDMA_WR_SIGNAL : 0, 100 + (uint64_t)i), 0);
	fk.inject = IBV_WC_RETRY_EXC_ERR;
	fk.hold = false;
	struct mp_rdma_cqe c[8];
	assert_int_equal(P->poll(p.a, c, 8), 3);
	assert_int_equal(c[0].status, -ETIMEDOUT);
	assert_int_equal(c[0].wr_id, 100);
	assert_int_equal(c[1].status, -ECANCELED);
	assert_int_equal(c[1].wr_id, 101);
	assert_int_equal(c[2].status, -ECANCELED);
	assert_int_equal(c[2].wr_id, 102);
	assert_int_equal(P->poll(p.a, c, 8), 0);

	/* The same without injection: the peer's QP is gone, so nobody answers. */
	P->ep_destroy(p.eb);
	p.eb = NULL;
	P->ep_destroy(p.ea);
	pair_eps(&p, false);
	P->ep_destroy(p.eb);
	assert_int_equal(P->write(p.ea, src, 8, p.ms, (uintptr_t)dst, p.md->rkey, 0, 0, 200), 0);
	assert_int_equal(P->poll(p.a, c, 8), 1);
	assert_int_equal(c[0].status, -ETIMEDOUT);
	assert_int_equal(c[0].wr_id, 200);
	pair_close(&p);
}

static void test_fake_destroy_flushes(void **state)
{
	(void)state;
	struct pair p;
	pair_open(&p, 16);
	static char src[256], dst[256];
	pair_reg(&p, src, sizeof(src), dst, sizeof(dst));
	/* A second endpoint pair on the same providers, with a completion pending. */
	struct pair p2 = {.a = p.a, .b = p.b};
	pair_eps(&p2, true);
	assert_int_equal(P->write(p2.ea, src, 8, p.ms, (uintptr_t)dst, p.md->rkey, 0, MP_RDMA_WR_SIGNAL,
				  900), 0);
	/* B receives an immediate on eb that it has not polled yet. */
	assert_int_equal(P->write(p.ea, src, 8, p.ms, (uintptr_t)dst, p.md->rkey, 1, MP_RDMA_WR_IMM,
				  999), 0);
	struct mp_rdma_cqe c[16];

	/* Carry both out without polling: A's CQ holds 900's completion, B's the immediate. */
	fk_run();

	/* Five writes held outstanding, two of them signalled. */
	fk.hold = true;
	for (int i = 0; i < 5; i++)
		assert_int_equal(P->write(p.ea, src, 8, p.ms, (uintptr_t)dst, p.md->rkey, 0,
					  i % 2 ? MP_RDMA_WR_SIGNAL : 0, 500 + (uint64_t)i), 0);
	P->ep_destroy(p.ea);
	fk.hold = false;
	/* All five come back cancelled, in posting order, beside the other pair's completion. */
	int n = P->poll(p.a, c, 16);
	assert_int_equal(n, 6);
	int w = 0;
	for (int i = 0; i < n; i++) {
		if (c[i].wr_id == 900) {
			assert_int_equal(c[i].status, 0);
			assert_ptr_equal(c[i].ep, p2.ea);
			continue;
		}
		assert_int_equal(c[i].op, MP_RDMA_CQE_WRITE);
		assert_int_equal(c[i].status, -ECANCELED);
		assert_int_equal(c[i].wr_id, 500 + (uint64_t)w);
		w++;
	}
	assert_int_equal(w, 5);
	assert_int_equal(P->poll(p.a, c, 16), 0);

	/* The immediate for eb sits in B's CQ; eb destroyed first: it is dropped, not read through freed memory. */
	P->ep_destroy(p.eb);
	assert_int_equal(P->poll(p.b, c, 16), 0);
	pair_close(&p);
}

static void test_fake_send_queue_full(void **state)
{
	(void)state;
	struct pair p;
	pair_open(&p, 4);
	static char src[64], dst[64];
	pair_reg(&p, src, sizeof(src), dst, sizeof(dst));
	struct mp_rdma_cqe c[8];
	/* Unsignalled writes only: the provider's own periodic signals must free the ring. */
	for (int round = 0; round < 50; round++) {
		fk.hold = true;
		for (int i = 0; i < 4; i++)
			assert_int_equal(P->write(p.ea, src, 8, p.ms, (uintptr_t)dst, p.md->rkey, 0, 0, 1), 0);
		assert_int_equal(P->write(p.ea, src, 8, p.ms, (uintptr_t)dst, p.md->rkey, 0, 0, 1), -EAGAIN);
		fk.hold = false;
		assert_int_equal(P->poll(p.a, c, 8), 0);
	}
	pair_close(&p);
}

static void test_fake_mr_cache(void **state)
{
	(void)state;
	struct mp_rdma_prov *pv;
	assert_int_equal(open_prov(0, 0, &pv), 0);
	static char buf[16384], other[100];
	struct mp_rdma_mr *m1, *m2, *m3, *m4;
	assert_int_equal(P->reg(pv, buf, 8192, MP_MEM_HOST, &m1), 0);
	assert_int_equal(P->reg(pv, buf, 8192, MP_MEM_HOST, &m2), 0);
	assert_int_equal(P->reg(pv, buf + 100, 200, MP_MEM_HOST, &m3), 0);
	assert_int_equal(fk.reg_mr_calls, 1);
	assert_int_equal(m1->rkey, m2->rkey);
	assert_int_equal(m1->rkey, m3->rkey);
	assert_ptr_equal(m1->desc, m3->desc);
	assert_ptr_equal(m3->addr, buf + 100);
	assert_int_equal(m3->len, 200);
	/* A range reaching beyond the cached one is registered on its own. */
	assert_int_equal(P->reg(pv, buf + 8000, 300, MP_MEM_HOST, &m4), 0);
	assert_int_equal(fk.reg_mr_calls, 2);
	assert_int_not_equal(m4->rkey, m1->rkey);
	struct mp_rdma_mr *m5;
	assert_int_equal(P->reg(pv, other, sizeof(other), MP_MEM_HOST, &m5), 0);
	assert_int_equal(fk.reg_mr_calls, 3);

	P->dereg(pv, m1);
	P->dereg(pv, m3);
	assert_int_equal(fk.dereg_mr_calls, 0);
	P->dereg(pv, m2);
	assert_int_equal(fk.dereg_mr_calls, 1);
	/* Released: the same range is registered afresh. */
	assert_int_equal(P->reg(pv, buf, 16, MP_MEM_HOST, &m1), 0);
	assert_int_equal(fk.reg_mr_calls, 4);
	assert_int_equal(P->reg(pv, buf, 0, MP_MEM_HOST, &m2), -EINVAL);
	/* A dma-buf cannot be named by an address alone: the protocol stages it. */
	assert_int_equal(P->reg(pv, buf, 16, MP_MEM_DMABUF, &m2), -EOPNOTSUPP);
	/* close releases what is still registered (m1, m4, m5). */
	P->close(pv);
	assert_int_equal(fk.dereg_mr_calls, 4);
}

static void test_fake_gpudirect(void **state)
{
	(void)state;
	struct mp_rdma_prov *pv;
	assert_int_equal(open_prov(0, 0, &pv), 0);
	fk.devmem_len = 4 * 4096;
	fk.devmem = aligned_alloc(4096, fk.devmem_len);
	assert_non_null(fk.devmem);
	struct mp_rdma_mr *m;
#ifdef MP_HAVE_CUDA
	/* dma-buf: the fd covers the pages around [100, 5100), the MR exactly that range. */
	fk.dmabuf_ok = true;
	assert_int_equal(P->reg(pv, fk.devmem + 100, 5000, MP_MEM_CUDA, &m), 0);
	assert_int_equal(fk.dmabuf_calls, 1);
	assert_int_equal(fk.reg_mr_calls, 0);
	assert_int_equal(fk.last_fd_len, 8192);
	assert_int_equal(fk.last_off, 100);
	assert_int_equal(fk.last_iova, (uintptr_t)fk.devmem + 100);
	assert_int_equal(fcntl(fk.last_fd, F_GETFD), -1); /* closed after registering */
	assert_int_equal(m->kind, MP_MEM_CUDA);
	P->dereg(pv, m);

	/* No dma-buf registration, nvidia-peermem loaded: ibv_reg_mr on the device pointer. */
	fk.dmabuf_ok = false;
	fk.peermem_ok = true;
	assert_int_equal(P->reg(pv, fk.devmem, 4096, MP_MEM_CUDA, &m), 0);
	assert_int_equal(fk.dmabuf_calls, 2);
	assert_int_equal(fk.reg_mr_calls, 1);
	P->dereg(pv, m);
	/* No CUDA driver at all: straight to ibv_reg_mr. */
	fk.cuda_fd_rc = -ENOSYS;
	assert_int_equal(P->reg(pv, fk.devmem, 4096, MP_MEM_CUDA, &m), 0);
	assert_int_equal(fk.dmabuf_calls, 2);
	assert_int_equal(fk.reg_mr_calls, 2);
	P->dereg(pv, m);
	fk.cuda_fd_rc = 0;
#endif
	/* Neither: -EOPNOTSUPP, the protocol stages through host memory. */
	fk.peermem_ok = false;
	assert_int_equal(P->reg(pv, fk.devmem, 4096, MP_MEM_CUDA, &m), -EOPNOTSUPP);
	assert_int_equal(fk.mrs, 0);
	P->close(pv);
	free(fk.devmem);
	fk.devmem = NULL;
}

static void test_fake_endpoint_checks(void **state)
{
	(void)state;
	struct mp_rdma_prov *pv;
	struct mp_rdma_params prm = {.max_eps = 2, .max_outstanding = 4};
	assert_int_equal(P->open(&prm, &pv), 0);
	uint8_t b1[MP_RDMA_EP_BLOB_MAX], b2[MP_RDMA_EP_BLOB_MAX], junk[32];
	size_t l1 = 16, l2 = sizeof(b2);
	struct mp_rdma_ep *e1, *e2, *e3;
	assert_int_equal(P->ep_create(pv, b1, &l1, &e1), -ENOSPC);
	l1 = sizeof(b1);
	assert_int_equal(P->ep_create(pv, b1, &l1, &e1), 0);
	assert_int_equal(P->ep_create(pv, b2, &l2, &e2), 0);
	size_t l3 = sizeof(junk);
	assert_int_equal(P->ep_create(pv, junk, &l3, &e3), -ENOSPC); /* max_eps = 2 */

	char x[8];
	assert_int_equal(P->write(e1, x, sizeof(x), NULL, 0, 0, 0, MP_RDMA_WR_INLINE, 0), -ENOTCONN);
	memset(junk, 0x11, sizeof(junk));
	assert_int_equal(P->ep_connect(e1, junk, sizeof(junk)), -EINVAL);
	assert_int_equal(P->ep_connect(e1, b2, l2 - 1), -EINVAL);
	/* A RoCE peer for an InfiniBand port. */
	memcpy(junk, b2, sizeof(junk));
	junk[2] = IBV_LINK_LAYER_ETHERNET;
	assert_int_equal(P->ep_connect(e1, junk, sizeof(junk)), -EINVAL);
	assert_int_equal(P->ep_connect(e1, b2, l2), 0);
	assert_int_equal(P->ep_connect(e1, b2, l2), -EISCONN);
	/* A freed slot is reused. */
	P->ep_destroy(e2);
	l3 = sizeof(junk);
	assert_int_equal(P->ep_create(pv, junk, &l3, &e3), 0);
	P->close(pv);
}

/*
 * The completion queue starts with room for 4 endpoints and doubles as
 * endpoints come, up to max_eps endpoints' worth. A refused resize fails
 * the endpoint that needed it, and only that one.
 */
static void test_fake_cq_grows(void **state)
{
	(void)state;
	struct mp_rdma_prov *pv;
	/* The protocol's parameters (drivers/rdma): 4 x (129 sends + 256 receives), not 1024 x. */
	struct mp_rdma_params big = {.max_eps = 1024, .max_outstanding = 128};
	assert_int_equal(P->open(&big, &pv), 0);
	assert_int_equal(fk.last_cq->cap, 4 * 385);
	P->close(pv);

	/* 4 writes in flight: 5 sends + 8 receives, 13 entries an endpoint; at most 20 endpoints. */
	enum { N = 20, PER_EP = 13 };
	struct mp_rdma_params prm = {.max_eps = N, .max_outstanding = 4};
	assert_int_equal(P->open(&prm, &pv), 0);
	struct fk_cq *cq = fk.last_cq;
	assert_int_equal(cq->cap, 4 * PER_EP);
	struct mp_rdma_ep *ep[N];
	uint8_t blob[N][MP_RDMA_EP_BLOB_MAX];
	size_t len[N];
	/* Depth after endpoint i + 1: doubling from 52, the last step cut to 20 x 13. */
	static const int depth[N] = {52, 52, 52, 52, 104, 104, 104, 104, 208, 208,
				     208, 208, 208, 208, 208, 208, 260, 260, 260, 260};
	for (int i = 0; i < 8; i++) {
		len[i] = sizeof(blob[i]);
		assert_int_equal(P->ep_create(pv, blob[i], &len[i], &ep[i]), 0);
		assert_int_equal(cq->cap, depth[i]);
	}
	assert_int_equal(fk.resize_calls, 1);

	/* The 9th endpoint needs 117 entries; the device refuses: no endpoint, no queue pair. */
	fk.resize_errno = ENOMEM;
	struct mp_rdma_ep *none = NULL;
	len[8] = sizeof(blob[8]);
	assert_int_equal(P->ep_create(pv, blob[8], &len[8], &none), -ENOMEM);
	assert_null(none);
	assert_int_equal(fk.resize_calls, 2);
	assert_int_equal(cq->cap, 104);
	assert_int_equal(fk.qps, 8);

	/* The 8 before it still work: endpoints 0 and 1 joined, a write with immediate lands. */
	static char src[64], dst[64];
	memset(src, 0x3c, sizeof(src));
	struct mp_rdma_mr *ms, *md;
	assert_int_equal(P->reg(pv, src, sizeof(src), MP_MEM_HOST, &ms), 0);
	assert_int_equal(P->reg(pv, dst, sizeof(dst), MP_MEM_HOST, &md), 0);
	assert_int_equal(P->ep_connect(ep[0], blob[1], len[1]), 0);
	assert_int_equal(P->ep_connect(ep[1], blob[0], len[0]), 0);
	assert_int_equal(P->write(ep[0], src, sizeof(src), ms, (uintptr_t)dst, md->rkey, 17,
				  MP_RDMA_WR_IMM | MP_RDMA_WR_SIGNAL, 5), 0);
	struct mp_rdma_cqe c[4];
	assert_int_equal(P->poll(pv, c, 4), 2);
	for (int i = 0; i < 2; i++) {
		assert_int_equal(c[i].status, 0);
		if (c[i].op == MP_RDMA_CQE_IMM) {
			assert_ptr_equal(c[i].ep, ep[1]);
			assert_int_equal(c[i].imm, 17);
		} else {
			assert_ptr_equal(c[i].ep, ep[0]);
			assert_int_equal(c[i].wr_id, 5);
		}
	}
	assert_memory_equal(dst, src, sizeof(dst));

	/* Once the device agrees, the rest come: two more doublings, the last one cut to the limit. */
	fk.resize_errno = 0;
	for (int i = 8; i < N; i++) {
		len[i] = sizeof(blob[i]);
		assert_int_equal(P->ep_create(pv, blob[i], &len[i], &ep[i]), 0);
		assert_int_equal(cq->cap, depth[i]);
	}
	assert_int_equal(fk.resize_calls, 4);
	len[0] = sizeof(blob[0]);
	assert_int_equal(P->ep_create(pv, blob[0], &len[0], &none), -ENOSPC); /* max_eps */
	/* Endpoints going away leave the depth as it is. */
	for (int i = 2; i < N; i++)
		P->ep_destroy(ep[i]);
	assert_int_equal(cq->cap, 260);
	P->dereg(pv, ms);
	P->dereg(pv, md);
	P->close(pv);
}

/* The real libibverbs: on a machine without RDMA, open fails at once with -ENODEV. */
static void test_real_open_fails_fast(void **state)
{
	(void)state;
	mp_verbs_ibv = &mp_verbs_ibv_real;
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	struct mp_rdma_prov *pv = NULL;
	int rc = open_prov(0, 0, &pv);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	if (rc == 0) {
		P->close(pv);
		skip(); /* this machine has an RDMA device */
	}
	assert_int_equal(rc, -ENODEV);
	double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
	assert_true(s < 5.0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_fake_open_no_device, setup, teardown),
		cmocka_unit_test_setup_teardown(test_fake_hca_selection, setup, teardown),
		cmocka_unit_test_setup_teardown(test_fake_gid_selection, setup, teardown),
		cmocka_unit_test_setup_teardown(test_fake_qp_attributes, setup, teardown),
		cmocka_unit_test_setup_teardown(test_fake_roce_route, setup, teardown),
		cmocka_unit_test_setup_teardown(test_fake_write_lands, setup, teardown),
		cmocka_unit_test_setup_teardown(test_fake_write_imm, setup, teardown),
		cmocka_unit_test_setup_teardown(test_fake_inline, setup, teardown),
		cmocka_unit_test_setup_teardown(test_fake_remote_access_error, setup, teardown),
		cmocka_unit_test_setup_teardown(test_fake_retry_exceeded, setup, teardown),
		cmocka_unit_test_setup_teardown(test_fake_destroy_flushes, setup, teardown),
		cmocka_unit_test_setup_teardown(test_fake_send_queue_full, setup, teardown),
		cmocka_unit_test_setup_teardown(test_fake_mr_cache, setup, teardown),
		cmocka_unit_test_setup_teardown(test_fake_gpudirect, setup, teardown),
		cmocka_unit_test_setup_teardown(test_fake_endpoint_checks, setup, teardown),
		cmocka_unit_test_setup_teardown(test_fake_cq_grows, setup, teardown),
		cmocka_unit_test_setup_teardown(test_real_open_fails_fast, setup, teardown),
	};
	return cmocka_run_group_tests_name("verbs_prov_fake", tests, NULL, NULL);
}
