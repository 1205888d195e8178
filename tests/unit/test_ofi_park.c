/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The libfabric provider (drivers/ofi/ofi.c) through the RDMA-provider
 * table, on the real libfabric (the default provider or MP_OFI_PROVIDER's,
 * loopback): a write aimed at an endpoint that ep_destroy has taken down
 * must place nothing, whether the provider parked the endpoint (1.17's
 * tcp;ofi_rxm, where closing crashes) or closed it. The protocol hands a failed connection's receive
 * buffers back right after ep_destroy, so a byte placed later would be
 * silent corruption. Exits 77 when libfabric offers no usable provider.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mp_build_config.h"
#include "drivers/ofi/ofi.h"
#include "log.h"

#define WAIT_MS 5000
#define LEN 4096

static const struct mp_rdma_prov_ops *P = &mp_rdma_ofi_prov;

static int64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Poll both for @ms; counts what each side saw. */
static void poll_both(struct mp_rdma_prov *a, struct mp_rdma_prov *b, int ms, int *a_writes,
		      int *a_errors, int *b_imms)
{
	int64_t end = now_ms() + ms;

	while (now_ms() < end) {
		struct mp_rdma_cqe c[16];
		int n = P->poll(a, c, 16);

		assert_true(n >= 0);
		for (int i = 0; i < n; i++) {
			if (c[i].status)
				(*a_errors)++;
			else if (c[i].op == MP_RDMA_CQE_WRITE)
				(*a_writes)++;
		}
		n = P->poll(b, c, 16);
		assert_true(n >= 0);
		for (int i = 0; i < n; i++)
			if (c[i].op == MP_RDMA_CQE_IMM && !c[i].status)
				(*b_imms)++;
		if (*a_writes && *b_imms && ms == WAIT_MS)
			return; /* the first round only waits for its write */
	}
}

/* Post a write, polling both sides while the provider pushes back (connection set-up). */
static void post(struct mp_rdma_prov *a, struct mp_rdma_prov *b, struct mp_rdma_ep *ea,
		 const void *src, struct mp_rdma_mr *ma, void *dst, uint64_t rkey, uint32_t imm)
{
	int64_t end = now_ms() + WAIT_MS;
	int rc;

	while ((rc = P->write(ea, src, LEN, ma, (uint64_t)(uintptr_t)dst, rkey, imm,
			      MP_RDMA_WR_IMM | MP_RDMA_WR_SIGNAL, imm)) == -EAGAIN) {
		struct mp_rdma_cqe c[16];

		assert_true(now_ms() < end);
		assert_int_equal(P->poll(a, c, 16), 0);
		assert_int_equal(P->poll(b, c, 16), 0);
	}
	assert_int_equal(rc, 0);
}

static void ofi_destroyed_endpoint_places_nothing(void **state)
{
	struct mp_rdma_params prm = {.rank = 0, .max_eps = 4, .max_outstanding = 16,
				     .timeout_ms = 1000};
	struct mp_rdma_prov *a = *state, *b;
	struct mp_rdma_ep *ea, *eb, *other;
	struct mp_rdma_mr *ma, *mb;
	unsigned char blob_a[MP_RDMA_EP_BLOB_MAX], blob_b[MP_RDMA_EP_BLOB_MAX];
	size_t la = sizeof(blob_a), lb = sizeof(blob_b);
	unsigned char *src = aligned_alloc(4096, LEN), *dst = aligned_alloc(4096, LEN);
	int writes = 0, errors = 0, imms = 0;

	assert_non_null(src);
	assert_non_null(dst);
	assert_int_equal(P->open(&prm, &b), 0);
	assert_int_equal(P->ep_create(a, blob_a, &la, &ea), 0);
	/* B's other connection, live throughout: B keeps polling. */
	assert_int_equal(P->ep_create(b, blob_b, &lb, &other), 0);
	lb = sizeof(blob_b);
	assert_int_equal(P->ep_create(b, blob_b, &lb, &eb), 0);
	assert_int_equal(P->ep_connect(ea, blob_b, lb), 0);
	assert_int_equal(P->ep_connect(eb, blob_a, la), 0);
	assert_int_equal(P->reg(a, src, LEN, MP_MEM_HOST, &ma), 0);
	assert_int_equal(P->reg(b, dst, LEN, MP_MEM_HOST, &mb), 0);

	/* A first write lands: the path works and the connection is up. */
	memset(src, 0x11, LEN);
	memset(dst, 0, LEN);
	post(a, b, ea, src, ma, dst, mb->rkey, 1);
	poll_both(a, b, WAIT_MS, &writes, &errors, &imms);
	assert_int_equal(writes, 1);
	assert_int_equal(imms, 1);
	assert_int_equal(errors, 0);
	for (size_t i = 0; i < LEN; i++)
		assert_int_equal(dst[i], 0x11);

	/* B takes its endpoint down and reuses the buffer; A writes again. */
	P->ep_destroy(eb);
	memset(dst, 0x5c, LEN);
	memset(src, 0x22, LEN);
	post(a, b, ea, src, ma, dst, mb->rkey, 2);
	writes = errors = imms = 0;
	poll_both(a, b, 500, &writes, &errors, &imms);
	print_message("late write: %d completed, %d failed at the writer; %d immediates at the "
		      "target\n", writes, errors, imms);
	assert_int_equal(imms, 0);
	for (size_t i = 0; i < LEN; i++)
		if (dst[i] != 0x5c)
			fail_msg("byte %zu of a buffer behind a destroyed endpoint was overwritten", i);

	/* Closing the target instance does not let it in either. */
	P->close(b);
	for (size_t i = 0; i < LEN; i++)
		assert_int_equal(dst[i], 0x5c);
	P->dereg(a, ma);
	free(src);
	free(dst);
}

static int setup(void **state)
{
	struct mp_rdma_params prm = {.rank = 0, .max_eps = 4, .max_outstanding = 16,
				     .timeout_ms = 1000};
	struct mp_rdma_prov *a;

	if (P->open(&prm, &a))
		return -1;
	*state = a;
	return 0;
}

static int teardown(void **state)
{
	P->close(*state);
	return 0;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(ofi_destroyed_endpoint_places_nothing, setup,
						teardown),
	};
	struct mp_rdma_params prm = {.rank = 0, .max_eps = 1, .max_outstanding = 1};
	struct mp_rdma_prov *probe;

	mp_log_init(); /* MP_DEBUG=INFO says whether failed endpoints are parked or closed */
	if (P->open(&prm, &probe)) {
		printf("SKIP: no usable libfabric provider (see the WARN line above)\n");
		return 77;
	}
	P->close(probe);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
