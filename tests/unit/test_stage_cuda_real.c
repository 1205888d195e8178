/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * mp_average_start_stream and mp_request_stream_wait on a real GPU: the
 * check test_stage_fake.c makes against the fake, through libcuda.so.1.
 * Without a GPU (or without stream memory operations) it says why and exits
 * 77 (skipped).
 *
 * Two peers (threads, loop transport), each with its device buffer holding
 * stale values and a non-blocking stream on which the "application" queues:
 * a wait on a host word (cuStreamWaitValue32) that the test sets 100 ms
 * later, then the copy of its input into the buffer; then the average
 * (mp_average_start_stream on that stream), a wait for it
 * (mp_request_stream_wait) and a copy of the buffer out (the probe). The
 * average must be of the inputs (its copy in waited for the stream: the
 * stale values give another mean), and the probe must read the mean (the
 * stream went on only after the copy back: before it, the buffer holds the
 * input).
 */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cuda.h>
#include <cuda_runtime.h>

#include <moshpit/moshpit.h>

#define N 4096
#define NP 2

static CUresult (*wait_value32)(CUstream, CUdeviceptr, cuuint32_t, unsigned);
static uint32_t *gate;        /* pinned, mapped: the application's stream waits on it */
static CUdeviceptr gate_dev;
static pthread_barrier_t bar;
static char addr[NP][MP_ADDR_STRLEN];
static int failed;

static float input(int rank, size_t i)
{
	return (float)((long)((rank * 7919 + (long)i * 104729) % 2001) - 1000) / 64.0f;
}

static void fail(int rank, const char *what, long detail)
{
	printf("peer %d: %s (%ld)\n", rank, what, detail);
	__atomic_store_n(&failed, 1, __ATOMIC_RELAXED);
}

static void *peer(void *p)
{
	const int r = (int)(intptr_t)p;
	const size_t bytes = N * sizeof(float);
	struct mp_config cfg;
	mp_ctx *ctx;
	mp_mr *mr = NULL;
	mp_request *req = NULL;
	float *dev = NULL, *in = NULL, *probe = NULL, *after = malloc(bytes);
	cudaStream_t a = NULL;
	int rc;

	cudaSetDevice(0);
	mp_config_init(&cfg);
	cfg.transport = "loop";
	cfg.run_name = "stage-cuda-real";
	cfg.rank = r;
	cfg.npeers = NP;
	cfg.connect_timeout_ms = 5000;
	cfg.round_timeout_ms = 5000;
	if (mp_init(&cfg, &ctx)) {
		fail(r, "mp_init", 0);
		exit(1);
	}
	mp_local_address(ctx, addr[r], MP_ADDR_STRLEN);
	pthread_barrier_wait(&bar);
	const char *addrs[NP] = {addr[0], addr[1]};
	if (mp_set_peers(ctx, addrs, NP))
		fail(r, "mp_set_peers", 0);
	if (cudaMalloc((void **)&dev, bytes) || cudaMallocHost((void **)&in, bytes) ||
	    cudaMallocHost((void **)&probe, bytes) ||
	    cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking)) {
		fail(r, "CUDA allocations", 0);
		exit(1);
	}
	for (size_t i = 0; i < N; i++)
		in[i] = -1000.0f; /* stale */
	cudaMemcpy(dev, in, bytes, cudaMemcpyHostToDevice);
	for (size_t i = 0; i < N; i++)
		in[i] = input(r, i);
	rc = mp_mem_register(ctx, dev, bytes, MP_MEM_CUDA, &mr);
	if (rc) {
		printf("peer %d: mp_mem_register: %s\n", r, mp_last_error(ctx));
		fail(r, "mp_mem_register", rc);
		exit(1);
	}
	/* The application's work, held until the test sets the gate. */
	CUresult cr = wait_value32((CUstream)a, gate_dev, 1, CU_STREAM_WAIT_VALUE_GEQ);
	if (cr)
		fail(r, "cuStreamWaitValue32", cr);
	cudaMemcpyAsync(dev, in, bytes, cudaMemcpyHostToDevice, a);
	rc = mp_average_start_stream(ctx, dev, N, 1.0f, mr, 0, a, &req);
	if (rc) {
		printf("peer %d: mp_average_start_stream: %s\n", r, mp_last_error(ctx));
		fail(r, "mp_average_start_stream", rc);
		exit(1);
	}
	rc = mp_request_stream_wait(req, a);
	if (rc) {
		printf("peer %d: mp_request_stream_wait: %s\n", r, mp_last_error(ctx));
		fail(r, "mp_request_stream_wait", rc);
	}
	cudaMemcpyAsync(probe, dev, bytes, cudaMemcpyDeviceToHost, a);
	pthread_barrier_wait(&bar);
	if (r == 0) {
		usleep(100000);
		__atomic_store_n(gate, 1, __ATOMIC_RELEASE);
	}
	rc = mp_wait(req, 20000, NULL);
	if (rc) {
		printf("peer %d: mp_wait: %s\n", r, mp_last_error(ctx));
		fail(r, "mp_wait", rc);
	}
	if (cudaStreamSynchronize(a))
		fail(r, "cudaStreamSynchronize", 0);
	cudaMemcpy(after, dev, bytes, cudaMemcpyDeviceToHost);
	for (size_t i = 0; i < N; i++) {
		float want = (input(0, i) + input(1, i)) / 2.0f;
		if (after[i] != want || probe[i] != want) {
			printf("peer %d, value %zu: %.9g in the buffer, %.9g read by the stream, "
			       "expected %.9g\n", r, i, after[i], probe[i], want);
			fail(r, "values", (long)i);
			break;
		}
	}
	if (mp_mem_deregister(ctx, mr))
		fail(r, "mp_mem_deregister", 0);
	pthread_barrier_wait(&bar);
	mp_finalize(ctx);
	cudaStreamDestroy(a);
	cudaFree(dev);
	cudaFreeHost(in);
	cudaFreeHost(probe);
	free(after);
	return NULL;
}

int main(void)
{
	int n = 0;
	pthread_t th[NP];

	if (cudaGetDeviceCount(&n) || n < 1) {
		printf("skipped: no CUDA device\n");
		return 77;
	}
	void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL), *f = h ? dlsym(h, "cuStreamWaitValue32_v2") : NULL;
	memcpy(&wait_value32, &f, sizeof(f));
	if (!f) {
		printf("skipped: no cuStreamWaitValue32_v2 in libcuda.so.1\n");
		return 77;
	}
	cudaSetDevice(0);
	if (cudaHostAlloc((void **)&gate, 64, cudaHostAllocMapped | cudaHostAllocPortable) ||
	    cudaHostGetDevicePointer((void **)&gate_dev, gate, 0)) {
		printf("skipped: no mapped pinned memory\n");
		return 77;
	}
	*gate = 0;
	/* Stream memory operations at all? */
	cudaStream_t t;
	cudaStreamCreateWithFlags(&t, cudaStreamNonBlocking);
	CUresult cr = wait_value32((CUstream)t, gate_dev, 0, CU_STREAM_WAIT_VALUE_GEQ);
	cudaStreamSynchronize(t);
	cudaStreamDestroy(t);
	if (cr == CUDA_ERROR_NOT_SUPPORTED) {
		printf("skipped: the device has no stream memory operations\n");
		return 77;
	}
	pthread_barrier_init(&bar, NULL, NP);
	for (int r = 0; r < NP; r++)
		pthread_create(&th[r], NULL, peer, (void *)(intptr_t)r);
	for (int r = 0; r < NP; r++)
		pthread_join(th[r], NULL);
	cudaFreeHost(gate);
	printf("%s\n", failed ? "FAILED" : "ok: the average waited for the stream, and the stream "
	       "for the average");
	return failed;
}
