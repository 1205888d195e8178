/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * GPU memory in the dpdk driver (drivers/dpdk/gpu.c, -Ddpdk_gpudev) against
 * the FAKE gpudev of tests/fakes/fake_gpudev.c behind gpu.h's seam: host
 * memory standing in for a GPU, since this machine has none (and Debian's
 * DPDK has no gpudev driver). The fake's "device memory" and the CPU mapping
 * it hands out are two DIFFERENT host buffers, so a test can tell which one
 * the driver wrote or read.
 *
 * Without arguments (unit, no EAL): registration maps the range for the CPU
 * and, for a NIC, registers it with EAL in 64 KiB pages and DMA-maps it,
 * with the right arguments; deregistration undoes it in reverse; no device
 * (or MP_DPDK_GPU naming none) is -ENODEV with nothing done; a failing step
 * returns its error with every earlier step undone.
 *
 * `--memif` (integration): two processes on a memif pair run the driver's
 * ops table, first with the real gpudev (EAL with --no-pci has no device:
 * -ENODEV, no MP_DRV_CAP_DEVICE_MEM), then with the fake and MP_MEM_CUDA
 * registrations. The sender's device buffer
 * holds garbage and its CPU mapping the message, so the receiver sees the
 * pattern only if sends of a virtual device are read through the mapping;
 * the receiver's messages must land, byte for byte, in the CPU mapping of
 * its registered device buffer, which itself stays untouched. Skips (77)
 * when EAL or the memif port will not start.
 *
 * Built without -Ddpdk_gpudev, `--memif` checks instead that reg_mr refuses
 * MP_MEM_CUDA with -ENOTSUP (the core stages it) and that the driver does not
 * claim MP_DRV_CAP_DEVICE_MEM.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <rte_errno.h>

#include <moshpit/driver.h>

#include "mp_build_config.h"
#ifdef MP_HAVE_DPDK_GPUDEV
#include "drivers/dpdk/gpu.h"
#include "fake_gpudev.h"
#endif

#define SKIP 77
#define BUF FK_DEV_LEN

extern const struct mp_driver_ops mp_dpdk_driver_ops;

#ifdef MP_HAVE_DPDK_GPUDEV
static double mono_s(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int teardown(void **state)
{
	(void)state;
	free(fk.dev_buf);
	free(fk.map_buf);
	memset(&fk, 0, sizeof(fk));
	mp_dpdk_gpu_use(NULL);
	unsetenv("MP_DPDK_GPU");
	return 0;
}

/* A stand-in for the NIC's rte_device: only its address is passed around. */
static int nic_token;
#define NIC ((struct rte_device *)(void *)&nic_token)

/* ---- unit tests of gpu.c ---- */

/* Virtual device: the CPU mapping only. */
static void test_reg_vdev(void **state)
{
	struct mp_dpdk_gpu_reg r;
	uint8_t *buf;

	(void)state;
	fk_reset(1);
	buf = fk.dev_buf + 1000;
	assert_int_equal(mp_dpdk_gpu_reg(&r, buf, 5000, NULL), 0);
	assert_string_equal(fk.seq, "M");
	assert_int_equal(fk.map_dev, 0);
	assert_int_equal(fk.map_size, 5000);
	assert_ptr_equal(fk.map_ptr, buf);
	assert_ptr_equal(r.cpu, fk.map_buf + 1000);
	assert_null(r.nic);
	assert_ptr_equal(mp_dpdk_gpu_cpu_addr(&r, buf + 4999), fk.map_buf + 1000 + 4999);
	mp_dpdk_gpu_dereg(&r);
	assert_string_equal(fk.seq, "Mm");
	assert_int_equal(fk.unmap_dev, 0);
	assert_ptr_equal(fk.unmap_ptr, buf);
	assert_int_equal(fk.map_ok, 0);
	assert_null(r.cpu);
	mp_dpdk_gpu_dereg(&r); /* a second time: nothing */
	assert_string_equal(fk.seq, "Mm");
}

/* A NIC: CPU mapping, EAL registration in whole GPU pages, DMA mapping; undone in reverse. */
static void test_reg_nic(void **state)
{
	struct mp_dpdk_gpu_reg r;
	uint8_t *buf;

	(void)state;
	fk_reset(1);
	buf = fk.dev_buf + 100;
	assert_int_equal(mp_dpdk_gpu_reg(&r, buf, 100000, NIC), 0);
	assert_string_equal(fk.seq, "MED");
	assert_ptr_equal(fk.map_ptr, buf);
	assert_int_equal(fk.map_size, 100000);
	/* [100, 100100) rounds out to the two 64 KiB pages [0, 131072). */
	assert_ptr_equal(fk.ext_va, fk.dev_buf);
	assert_int_equal(fk.ext_len, 131072);
	assert_int_equal(fk.ext_pg, 65536);
	assert_null(fk.ext_iova);
	assert_int_equal(fk.ext_n, 0);
	assert_ptr_equal(fk.dma_dev, NIC);
	assert_ptr_equal(fk.dma_addr, fk.dev_buf);
	assert_true(fk.dma_iova == (uint64_t)(uintptr_t)fk.dev_buf);
	assert_int_equal(fk.dma_len, 131072);
	assert_ptr_equal(r.nic, NIC);
	mp_dpdk_gpu_dereg(&r);
	assert_string_equal(fk.seq, "MEDdem");
	assert_ptr_equal(fk.undma_dev, NIC);
	assert_ptr_equal(fk.undma_addr, fk.dev_buf);
	assert_true(fk.undma_iova == (uint64_t)(uintptr_t)fk.dev_buf);
	assert_int_equal(fk.undma_len, 131072);
	assert_ptr_equal(fk.unext_va, fk.dev_buf);
	assert_int_equal(fk.unext_len, 131072);
	assert_ptr_equal(fk.unmap_ptr, buf);
	assert_int_equal(fk.map_ok + fk.ext_ok + fk.dma_ok, 0);
}

/* No device, or MP_DPDK_GPU naming none: -ENODEV and nothing touched. */
static void test_no_device(void **state)
{
	struct mp_dpdk_gpu_reg r = {0};
	int16_t dev = -5;

	(void)state;
	fk_reset(0);
	assert_int_equal(mp_dpdk_gpu_pick(true, &dev), -ENODEV);
	assert_int_equal(mp_dpdk_gpu_reg(&r, fk.dev_buf, 4096, NIC), -ENODEV);
	assert_string_equal(fk.seq, "");
	assert_null(r.cpu);

	fk_reset(2);
	setenv("MP_DPDK_GPU", "2", 1);
	assert_int_equal(mp_dpdk_gpu_reg(&r, fk.dev_buf, 4096, NULL), -ENODEV);
	setenv("MP_DPDK_GPU", "one", 1);
	assert_int_equal(mp_dpdk_gpu_reg(&r, fk.dev_buf, 4096, NULL), -ENODEV);
	assert_string_equal(fk.seq, "");
	/* MP_DPDK_GPU picks the second device; without it, the first. */
	setenv("MP_DPDK_GPU", "1", 1);
	assert_int_equal(mp_dpdk_gpu_reg(&r, fk.dev_buf, 4096, NULL), 0);
	assert_int_equal(fk.map_dev, 1);
	assert_int_equal(r.dev, 1);
	mp_dpdk_gpu_dereg(&r);
	assert_int_equal(fk.unmap_dev, 1);
	unsetenv("MP_DPDK_GPU");
	assert_int_equal(mp_dpdk_gpu_pick(true, &dev), 0);
	assert_int_equal(dev, 0);
}

/* Each step failing in turn: its error comes back and what was done is undone. */
static void test_fail_steps(void **state)
{
	static const struct {
		char fail;
		int err;
		const char *seq;
	} c[] = {{'M', EPERM, "M"}, {'E', EEXIST, "MEm"}, {'D', ENOTSUP, "MEDem"}};

	(void)state;
	for (size_t i = 0; i < sizeof(c) / sizeof(c[0]); i++) {
		struct mp_dpdk_gpu_reg r = {0};

		fk_reset(1);
		fk.fail = c[i].fail;
		fk.err = c[i].err;
		assert_int_equal(mp_dpdk_gpu_reg(&r, fk.dev_buf + 64, 70000, NIC), -c[i].err);
		assert_string_equal(fk.seq, c[i].seq);
		assert_int_equal(fk.map_ok, 0);
		assert_int_equal(fk.ext_ok, 0);
		assert_int_equal(fk.dma_ok, 0);
		assert_null(r.cpu);
		assert_null(r.nic);
	}
	/* Memory the device does not know (the fake's rte_gpu_mem_alloc check). */
	{
		struct mp_dpdk_gpu_reg r = {0};
		uint8_t host[256];

		fk_reset(1);
		assert_int_equal(mp_dpdk_gpu_reg(&r, host, sizeof(host), NULL), -EPERM);
		assert_string_equal(fk.seq, "M");
	}
}

/* ---- through the driver on a memif pair ---- */

static uint8_t pattern(size_t i)
{
	return (uint8_t)(i * 7 + (i >> 8) + 3);
}

static const size_t msg_len[] = {1, 300, 5000, 100000};
static const size_t send_off[] = {0, 10, 400, 6000};
static const size_t recv_off[] = {0, 8, 512, 8192};
#define NMSG 4
#define DEV_FILL 0x11
#define MAP_FILL 0x22
#define SEND_GARBAGE 0xee
#endif /* MP_HAVE_DPDK_GPUDEV */

/* Driver init on a memif port (@rank 0 server, 1 client); 0, or SKIP without EAL. */
static int memif_init(int rank, const char *sock, const char *ready, struct mp_drv **d,
		      struct mp_drv_listener **l)
{
	const struct mp_driver_ops *o = &mp_dpdk_driver_ops;
	struct mp_drv_params p = {.size = sizeof(p), .run_name = "g", .rank = rank,
				  .connect_timeout_ms = 10000};
	uint8_t blob[MP_DRV_ADDR_MAX];
	size_t blen = sizeof(blob);
	char vdev[256], ip[32], bind[64];
	int rc;

	snprintf(vdev, sizeof(vdev), "net_memif0,role=%s,id=0,socket=%s,mac=02:00:00:00:7a:0%d",
		 rank ? "client" : "server", sock, rank + 1);
	snprintf(ip, sizeof(ip), "10.80.1.%d", rank + 1);
	snprintf(bind, sizeof(bind), "%s:7000", ip);
	setenv("MP_DPDK_VDEV", vdev, 1);
	setenv("MP_DPDK_IP", ip, 1);
	setenv("MP_DPDK_MEM_MB", "128", 1);
	if (!ready) {
		setenv("MP_DPDK_LINK_WAIT_MS", "0", 1);
	} else if (rank == 0) {
		setenv("MP_DPDK_READY_FILE", ready, 1);
	} else {
		for (int i = 0; i < 1000 && access(ready, F_OK); i++)
			usleep(10000);
	}
	rc = o->init(&p, d);
	if (rc) {
		fprintf(stderr, "peer %d: dpdk init: %s\n", rank, strerror(-rc));
		return SKIP;
	}
	if (o->listen(*d, bind, blob, &blen, l)) {
		fprintf(stderr, "peer %d: listen failed\n", rank);
		return 1;
	}
	return 0;
}

#ifdef MP_HAVE_DPDK_GPUDEV
#define CHECK(cond)                                                                    \
	do {                                                                           \
		if (!(cond)) {                                                         \
			fprintf(stderr, "peer %d: %s:%d: %s\n", rank, __FILE__, __LINE__, \
				#cond);                                                \
			return 1;                                                      \
		}                                                                      \
	} while (0)

/* Wait (at most 20 s) for @r; its length in *n. */
static int wait_req(struct mp_drv *d, struct mp_drv_req *r, size_t *n)
{
	const struct mp_driver_ops *o = &mp_dpdk_driver_ops;
	double deadline = mono_s() + 20;
	int fin = 0, rc = 0;

	while (!fin && mono_s() < deadline) {
		o->progress(d, 1);
		rc = o->test(r, &fin, n);
	}
	return fin ? rc : -ETIMEDOUT;
}

/* One peer: rank 1 sends from its fake device memory, rank 0 receives into its own. */
static int memif_peer(int rank, const char *sock, const char *ready)
{
	const struct mp_driver_ops *o = &mp_dpdk_driver_ops;
	struct mp_drv *d;
	struct mp_drv_listener *l;
	struct mp_drv_conn *c = NULL;
	struct mp_drv_mr *mr;
	struct mp_drv_caps caps;
	uint8_t blob[MP_DRV_ADDR_MAX];
	size_t blen = sizeof(blob);
	double deadline = mono_s() + 20;
	int rc;

	memset(&fk, 0, sizeof(fk));
	fk.dev_len = BUF;
	fk.dev_buf = aligned_alloc(MP_DPDK_GPU_PAGE, BUF);
	fk.map_buf = malloc(BUF);
	if (!fk.dev_buf || !fk.map_buf)
		return 1;
	rc = memif_init(rank, sock, ready, &d, &l);
	if (rc)
		return rc;
	/* The real gpudev first: EAL runs with --no-pci here, so it has no device. */
	CHECK(o->query(d, &caps) == 0 && !(caps.flags & MP_DRV_CAP_DEVICE_MEM));
	CHECK(o->reg_mr(d, fk.dev_buf, BUF, MP_MEM_CUDA, &mr) == -ENODEV);
	/* The capability follows the devices gpudev has. */
	mp_dpdk_gpu_use(&fk_gpu_ops);
	CHECK(o->query(d, &caps) == 0 && !(caps.flags & MP_DRV_CAP_DEVICE_MEM));
	CHECK(o->reg_mr(d, fk.dev_buf, BUF, MP_MEM_CUDA, &mr) == -ENODEV);
	CHECK(fk.nseq == 0);
	fk.ndev = 1;
	CHECK(o->query(d, &caps) == 0 && (caps.flags & MP_DRV_CAP_DEVICE_MEM));
	CHECK(o->reg_mr(d, fk.dev_buf, BUF, MP_MEM_CUDA, &mr) == 0);
	/* memif is a virtual device: mapped for the CPU, nothing for a NIC. */
	CHECK(!strcmp(fk.seq, "M") && fk.map_size == BUF && fk.map_ptr == fk.dev_buf);

	if (rank == 1) {
		struct mp_drv_req *r[NMSG];

		memset(fk.dev_buf, SEND_GARBAGE, BUF);
		for (size_t i = 0; i < BUF; i++)
			fk.map_buf[i] = pattern(i);
		blen = sizeof(blob);
		CHECK(o->addr_parse(d, "02-00-00-00-7a-01/10.80.1.1:7000", blob, &blen) == 0);
		CHECK(o->connect(d, blob, blen, &c) == 0);
		for (int k = 0; k < NMSG; k++) {
			/* Two pieces: both must be read through the mapping. */
			struct mp_iov v[2] = {{fk.dev_buf + send_off[k], msg_len[k] / 3},
					      {fk.dev_buf + send_off[k] + msg_len[k] / 3,
					       msg_len[k] - msg_len[k] / 3}};

			while ((rc = o->isend(c, v, 2, mr, &r[k])) == -EAGAIN)
				o->progress(d, 1);
			CHECK(rc == 0);
		}
		for (int k = 0; k < NMSG; k++) {
			size_t n = 0;

			CHECK(wait_req(d, r[k], &n) == 0);
		}
	} else {
		memset(fk.dev_buf, DEV_FILL, BUF);
		memset(fk.map_buf, MAP_FILL, BUF);
		while (o->accept(l, &c) == -EAGAIN && mono_s() < deadline)
			o->progress(d, 1);
		CHECK(c);
		for (int k = 0; k < NMSG; k++) {
			struct mp_drv_req *r;
			size_t n = 0;
			uint8_t *at = fk.map_buf + recv_off[k];

			CHECK(o->irecv(c, fk.dev_buf + recv_off[k], msg_len[k] + 16, mr, &r) == 0);
			rc = wait_req(d, r, &n);
			CHECK(rc == 0 && n == msg_len[k]);
			for (size_t i = 0; i < n; i++)
				if (at[i] != pattern(send_off[k] + i)) {
					fprintf(stderr, "peer 0: message %d byte %zu: %#x, want %#x\n",
						k, i, at[i], pattern(send_off[k] + i));
					return 1;
				}
			/* Nothing beyond the message; nothing before it either. */
			CHECK(at[n] == MAP_FILL);
			CHECK(recv_off[k] == 0 || at[-1] == MAP_FILL);
		}
		/* The device memory itself was never written by the CPU. */
		for (size_t i = 0; i < BUF; i++)
			CHECK(fk.dev_buf[i] == DEV_FILL);
	}
	o->close(c);
	o->close_listener(l);
	o->dereg_mr(d, mr);
	CHECK(!strcmp(fk.seq, "Mm") && fk.map_ok == 0 && fk.unmap_ptr == fk.dev_buf);
	/* Either side may still poll while the other leaves: the driver's BYE
	 * keeps it clear of DPDK's memif unmapping the rings (doc/dpdk.md). */
	o->fini(d);
	printf("peer %d: ok\n", rank);
	return 0;
}

static int memif_main(void)
{
	char tmpl[] = "/tmp/mpt-gpu-XXXXXX", ready[64], sock[64];
	int fails = 0, skipped = 0;
	pid_t pid[2];

	if (!mkdtemp(tmpl))
		return 1;
	snprintf(ready, sizeof(ready), "%s/ready", tmpl);
	snprintf(sock, sizeof(sock), "/mpt-gpu-%ld.sock", (long)getpid());
	fflush(NULL);
	for (int i = 0; i < 2; i++) {
		pid[i] = fork();
		if (pid[i] == 0)
			_exit(memif_peer(i, sock, ready));
	}
	for (int i = 0; i < 2; i++) {
		int st;

		waitpid(pid[i], &st, 0);
		if (WIFEXITED(st) && WEXITSTATUS(st) == SKIP) {
			skipped++;
		} else if (!WIFEXITED(st) || WEXITSTATUS(st)) {
			fprintf(stderr, "peer %d failed (status %d)\n", i, st);
			fails++;
		}
	}
	unlink(ready);
	rmdir(tmpl);
	if (fails)
		return 1;
	if (skipped) {
		printf("SKIP: EAL or the memif port would not start here\n");
		return SKIP;
	}
	printf("PASS\n");
	return 0;
}

int main(int argc, char **argv)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_reg_vdev, teardown),
		cmocka_unit_test_teardown(test_reg_nic, teardown),
		cmocka_unit_test_teardown(test_no_device, teardown),
		cmocka_unit_test_teardown(test_fail_steps, teardown),
	};

	if (argc > 1 && !strcmp(argv[1], "--memif"))
		return memif_main();
	return cmocka_run_group_tests(tests, NULL, NULL);
}
#else
/* Built without -Ddpdk_gpudev: device memory is refused, and the core stages it. */
int main(int argc, char **argv)
{
	const struct mp_driver_ops *o = &mp_dpdk_driver_ops;
	struct mp_drv *d;
	struct mp_drv_listener *l;
	struct mp_drv_mr *mr = NULL;
	struct mp_drv_caps caps;
	static uint8_t buf[4096];
	char sock[64];
	int rc, bad = 0;

	if (argc < 2 || strcmp(argv[1], "--memif")) {
		printf("SKIP: built without -Ddpdk_gpudev; only --memif checks the refusal\n");
		return SKIP;
	}
	snprintf(sock, sizeof(sock), "/mpt-gpu-%ld.sock", (long)getpid());
	rc = memif_init(0, sock, NULL, &d, &l);
	if (rc == SKIP)
		printf("SKIP: EAL or the memif port would not start here\n");
	if (rc)
		return rc;
	rc = o->reg_mr(d, buf, sizeof(buf), MP_MEM_CUDA, &mr);
	printf("%s reg_mr(MP_MEM_CUDA) = %d (want %d)\n", rc == -ENOTSUP ? "ok" : "FAIL", rc,
	       -ENOTSUP);
	bad += rc != -ENOTSUP;
	bad += o->query(d, &caps) != 0 || (caps.flags & MP_DRV_CAP_DEVICE_MEM);
	printf("%s no MP_DRV_CAP_DEVICE_MEM\n", bad ? "FAIL" : "ok");
	o->close_listener(l);
	o->fini(d);
	return bad ? 1 : 0;
}
#endif
