/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The device path on a real GPU: what test_devpath_fake.c checks against the
 * fake, with the kernels of kernels/cuda and libcuda.so.1. Without a GPU the
 * kernels can run on, it says why and exits 77 (skipped).
 *
 * Four peers (threads, loop transport), moshpit on a 2x2 grid, chunks of
 * 64 KiB, a vector of 100003 values (several chunks per part, short ends):
 * each peer averages its input in host memory (the host path, the
 * reference), then the same input in device memory (cudaMalloc) in a second
 * context. Per codec: none, fp16, bf16 and blockwise8 must give the host
 * path's result bit for bit; uniform8, whose GPU encoder sums its
 * statistics in another order, within one code step of it (the largest
 * difference is printed). And MP_CUDA_STAGE=1 (whole staging) bit for bit
 * too, for fp16; topk (its residue on the GPU) bit for bit; the ring, bit
 * for bit, for none and blockwise8; and the kernel of MP_CHECK_FINITE flags a NaN and an
 * infinity, and nothing else.
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include <moshpit/moshpit.h>

#include "mp_cuda_codecs.h"

#define N 100003
#define NP 4

static pthread_barrier_t bar;
static char addr[2][NP][MP_ADDR_STRLEN];
static float *host_res[NP], *dev_res[NP];
static int codec, stage, algo = MP_ALGO_MOSHPIT, failed;

static float input(int rank, size_t i)
{
	unsigned h = ((unsigned)rank * 7919u + (unsigned)i * 31337u) * 2654435761u;

	if (i % 97 == 5)
		return -0.0f;
	return ((float)(h >> 8) / 16777216.0f - 0.5f) * 8.0f + (float)(i % 7) * 0.25f;
}

static void fail(int rank, const char *what, const char *why)
{
	printf("peer %d: %s: %s\n", rank, what, why);
	__atomic_store_n(&failed, 1, __ATOMIC_RELAXED);
}

static mp_ctx *open_ctx(int r, int pass)
{
	struct mp_config cfg;
	mp_ctx *ctx = NULL;
	char run[64];

	snprintf(run, sizeof(run), "devpath-real-%d-%d-%d-%d", codec, stage, algo, pass);
	mp_config_init(&cfg);
	cfg.transport = "loop";
	cfg.run_name = run;
	cfg.rank = r;
	cfg.npeers = NP;
	cfg.algo = algo;
	cfg.grid = algo == MP_ALGO_MOSHPIT ? "2x2" : NULL;
	cfg.codec = codec;
	cfg.chunk_bytes = 64 * 1024;
	cfg.cuda_stage = stage;
	cfg.connect_timeout_ms = 10000;
	cfg.round_timeout_ms = 10000;
	if (mp_init(&cfg, &ctx))
		fail(r, "mp_init", "");
	else
		mp_local_address(ctx, addr[pass][r], MP_ADDR_STRLEN);
	pthread_barrier_wait(&bar);
	const char *addrs[NP];
	for (int i = 0; i < NP; i++)
		addrs[i] = addr[pass][i];
	if (ctx && mp_set_peers(ctx, addrs, NP))
		fail(r, "mp_set_peers", mp_last_error(ctx));
	return ctx;
}

static void *peer(void *p)
{
	const int r = (int)(intptr_t)p;
	const size_t bytes = N * sizeof(float);
	float *v = malloc(bytes), *dev = NULL;
	mp_ctx *ctx;
	mp_mr *mr = NULL;
	mp_request *req;

	cudaSetDevice(0);
	for (size_t i = 0; i < N; i++)
		v[i] = input(r, i);
	ctx = open_ctx(r, 0);
	pthread_barrier_wait(&bar);
	if (ctx && mp_average(ctx, v, N, 1.0f, NULL))
		fail(r, "host average", mp_last_error(ctx));
	host_res[r] = v;
	pthread_barrier_wait(&bar);
	mp_finalize(ctx);

	ctx = open_ctx(r, 1);
	v = malloc(bytes);
	for (size_t i = 0; i < N; i++)
		v[i] = input(r, i);
	if (cudaMalloc((void **)&dev, bytes) || cudaMemcpy(dev, v, bytes, cudaMemcpyHostToDevice))
		fail(r, "cudaMalloc", "");
	if (ctx && mp_mem_register(ctx, dev, bytes, MP_MEM_CUDA, &mr))
		fail(r, "mp_mem_register", mp_last_error(ctx));
	pthread_barrier_wait(&bar);
	if (mr) {
		int rc = mp_average_start(ctx, dev, N, 1.0f, mr, &req);
		if (!rc)
			rc = mp_wait(req, 60000, NULL);
		if (rc)
			fail(r, "device average", mp_last_error(ctx));
	}
	cudaMemcpy(v, dev, bytes, cudaMemcpyDeviceToHost);
	dev_res[r] = v;
	pthread_barrier_wait(&bar);
	if (mr)
		mp_mem_deregister(ctx, mr);
	mp_finalize(ctx);
	cudaFree(dev);
	return NULL;
}

/* One codec: 0 when the device path's result is the host path's (within
 * @tol for uniform8; 0: bit for bit). */
static int run(int c, int st, double tol)
{
	const char *an = algo == MP_ALGO_RING ? ", ring" : "";
	pthread_t th[NP];
	double maxd = 0.0;
	size_t ndiff = 0;

	codec = c;
	stage = st;
	failed = 0;
	for (int r = 0; r < NP; r++)
		pthread_create(&th[r], NULL, peer, (void *)(intptr_t)r);
	for (int r = 0; r < NP; r++)
		pthread_join(th[r], NULL);
	for (int r = 0; r < NP && !failed; r++)
		for (size_t i = 0; i < N; i++) {
			float h = host_res[r][i], d = dev_res[r][i];
			if (!memcmp(&h, &d, sizeof(h)))
				continue;
			ndiff++;
			double e = fabs((double)h - (double)d);
			maxd = e > maxd || isnan(e) ? e : maxd;
			if (!tol || !(e <= tol)) {
				printf("codec %d%s%s, peer %d, value %zu: device %.9g, host %.9g\n", c,
				       st ? " (MP_CUDA_STAGE=1)" : "", an, r, i, d, h);
				failed = 1;
				break;
			}
		}
	printf("codec %d%s%s: %s; %zu of %d values differ from the host path, by at most %g\n", c,
	       st ? " (MP_CUDA_STAGE=1)" : "", an, failed ? "FAILED" : "ok", ndiff, NP * N, maxd);
	for (int r = 0; r < NP; r++) {
		free(host_res[r]);
		free(dev_res[r]);
		host_res[r] = dev_res[r] = NULL;
	}
	return failed;
}

int main(void)
{
	char why[256];
	int n = 0, bad = 0;

	if (cudaGetDeviceCount(&n) || n < 1) {
		printf("skipped: no CUDA device\n");
		return 77;
	}
	cudaSetDevice(0);
	if (mp_cuda_available(why, sizeof(why))) {
		printf("skipped: %s\n", why);
		return 77;
	}
	/* The kernel MP_CHECK_FINITE uses: a flag for a NaN or an infinity
	 * anywhere, none for finite values (the largest and -0 included). */
	{
		const size_t m = 1 << 20;
		float *h = malloc(m * sizeof(float)), *d = NULL;
		uint32_t *flag = NULL, got[3] = {0, 0, 0};
		cudaMalloc((void **)&d, m * sizeof(float));
		cudaMalloc((void **)&flag, 3 * sizeof(uint32_t));
		cudaMemset(flag, 0, 3 * sizeof(uint32_t));
		for (size_t i = 0; i < m; i++)
			h[i] = i % 3 ? 3.4028235e38f : -0.0f;
		cudaMemcpy(d, h, m * sizeof(float), cudaMemcpyHostToDevice);
		int rc = mp_cuda_check_finite(d, m, &flag[0], NULL);
		h[m - 7] = NAN;
		cudaMemcpy(d, h, m * sizeof(float), cudaMemcpyHostToDevice);
		rc |= mp_cuda_check_finite(d, m, &flag[1], NULL);
		h[m - 7] = 1.0f;
		h[12345] = -INFINITY;
		cudaMemcpy(d, h, m * sizeof(float), cudaMemcpyHostToDevice);
		rc |= mp_cuda_check_finite(d, m, &flag[2], NULL);
		cudaMemcpy(got, flag, sizeof(got), cudaMemcpyDeviceToHost);
		printf("mp_cuda_check_finite: finite %u, NaN %u, -inf %u (want 0, 1, 1)\n", got[0],
		       got[1], got[2]);
		bad |= rc || got[0] || !got[1] || !got[2];
		cudaFree(d);
		cudaFree(flag);
		free(h);
	}
	pthread_barrier_init(&bar, NULL, NP);
	bad |= run(MP_CODEC_NONE, 0, 0.0);
	bad |= run(MP_CODEC_FP16, 0, 0.0);
	bad |= run(MP_CODEC_BF16, 0, 0.0);
	bad |= run(MP_CODEC_BLOCKWISE8, 0, 0.0);
	/* A code off by one is a step of the range: about 2 * 2.5 sigma / 255
	 * of values within [-4, 6), per round, two rounds. */
	bad |= run(MP_CODEC_UNIFORM8, 0, 0.2);
	bad |= run(MP_CODEC_FP16, 1, 0.0);
	/* topk: its error feedback on the GPU, the CPU's selection and residue. */
	bad |= run(MP_CODEC_TOPK, 0, 0.0);
	/* The ring on the device: its scalings and its finished chunks' round
	 * trip through the codec. */
	algo = MP_ALGO_RING;
	bad |= run(MP_CODEC_NONE, 0, 0.0);
	bad |= run(MP_CODEC_BLOCKWISE8, 0, 0.0);
	algo = MP_ALGO_MOSHPIT;
	pthread_barrier_destroy(&bar);
	printf("%s\n", bad ? "FAILED" : "ok: the device path gives the host path's results");
	return bad;
}
