/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * A FAKE libcuda.so.1 for mpbench --memory=cuda on a machine without a GPU
 * (test mpbench_memory_cuda_fake, found first through LD_LIBRARY_PATH): the
 * driver API entry points that mpbench (tools/mpbench/cuda.c) and the
 * library's staging (src/xfer/stage.c) load, and nothing else.
 *
 * What it holds them to, as the real driver would, failing the call:
 *  - "device memory" is host memory mapped with no access at all, opened
 *    only inside the fake's own copies: a read or write of it from anywhere
 *    else (mpbench, the reducer, a codec) faults;
 *  - copies and allocations need a current context (cuCtxSetCurrent or
 *    cuCtxPushCurrent), per thread;
 *  - a process that did not call cuInit itself (a child forked after its
 *    parent did) gets CUDA_ERROR_NOT_INITIALIZED from every call: CUDA does
 *    not survive fork.
 * FAKE_CUDA_DEVICES sets the device count (default 2); 0 makes cuInit fail
 * with CUDA_ERROR_NO_DEVICE, as on a host whose GPU is not visible.
 *
 * Streams and events (the staging's asynchronous copies, src/xfer/stage.c)
 * are modelled as the simplest driver may run them: an asynchronous copy is
 * done before its call returns, an event is complete once recorded, and a
 * stream's wait on an event has nothing to wait for. Ordering and
 * asynchrony are what tests/fakes/fake_cuda.c models, behind the library's
 * own seam; this one only has to be a driver mpbench can load.
 * cuStreamWaitValue32 is left out, as on drivers older than CUDA 11.7.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;
typedef int CUdevice;

enum {
	OK = 0,
	INVALID_VALUE = 1,
	NOT_INITIALIZED = 3,
	NO_DEVICE = 100,
	INVALID_DEVICE = 101,
	INVALID_CONTEXT = 201,
};

#define MAXDEV 8
#define MAXALLOC 256

/* A context is only an address: one per device (the primary one). */
struct CUctx_st {
	int device;
};

static struct CUctx_st prim[MAXDEV];
static int retains[MAXDEV];
static pid_t init_pid;
static int ndev = -1;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static _Thread_local CUcontext stack[8];
static _Thread_local int depth;

static struct {
	char *base;
	size_t len, maplen;
	int device;
} allocs[MAXALLOC];

#define API __attribute__((visibility("default")))

static CUresult ready(void)
{
	if (init_pid != getpid())
		return NOT_INITIALIZED;
	return OK;
}

static CUresult in_context(void)
{
	CUresult r = ready();

	if (r)
		return r;
	return depth > 0 && stack[depth - 1] ? OK : INVALID_CONTEXT;
}

/* The allocation holding [p, p + len), or -1. Under mu. */
static int find(CUdeviceptr p, size_t len)
{
	for (int i = 0; i < MAXALLOC; i++) {
		uintptr_t b = (uintptr_t)allocs[i].base;

		if (b && p >= b && p - b <= allocs[i].len && len <= allocs[i].len - (p - b))
			return i;
	}
	return -1;
}

API CUresult cuInit(unsigned flags)
{
	const char *e = getenv("FAKE_CUDA_DEVICES");

	(void)flags;
	ndev = e ? atoi(e) : 2;
	if (ndev > MAXDEV)
		ndev = MAXDEV;
	if (ndev <= 0)
		return NO_DEVICE;
	init_pid = getpid();
	for (int i = 0; i < ndev; i++)
		prim[i].device = i;
	return OK;
}

API CUresult cuGetErrorName(CUresult r, const char **s)
{
	switch (r) {
	case OK: *s = "CUDA_SUCCESS"; break;
	case INVALID_VALUE: *s = "CUDA_ERROR_INVALID_VALUE"; break;
	case NOT_INITIALIZED: *s = "CUDA_ERROR_NOT_INITIALIZED"; break;
	case NO_DEVICE: *s = "CUDA_ERROR_NO_DEVICE"; break;
	case INVALID_DEVICE: *s = "CUDA_ERROR_INVALID_DEVICE"; break;
	case INVALID_CONTEXT: *s = "CUDA_ERROR_INVALID_CONTEXT"; break;
	default: return INVALID_VALUE;
	}
	return OK;
}

API CUresult cuDeviceGetCount(int *n)
{
	CUresult r = ready();

	*n = r ? 0 : ndev;
	return r;
}

API CUresult cuDeviceGet(CUdevice *d, int ordinal)
{
	CUresult r = ready();

	if (r)
		return r;
	if (ordinal < 0 || ordinal >= ndev)
		return INVALID_DEVICE;
	*d = ordinal;
	return OK;
}

API CUresult cuDeviceGetName(char *name, int len, CUdevice d)
{
	CUresult r = ready();

	if (r)
		return r;
	snprintf(name, (size_t)len, "Fake GPU %d (tests/integration/fake_libcuda.c)", d);
	return OK;
}

API CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d)
{
	CUresult r = ready();

	if (r)
		return r;
	if (d < 0 || d >= ndev)
		return INVALID_DEVICE;
	pthread_mutex_lock(&mu);
	retains[d]++;
	pthread_mutex_unlock(&mu);
	*c = &prim[d];
	return OK;
}

API CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d)
{
	CUresult r = ready();

	if (r)
		return r;
	if (d < 0 || d >= ndev || retains[d] <= 0)
		return INVALID_DEVICE;
	pthread_mutex_lock(&mu);
	retains[d]--;
	pthread_mutex_unlock(&mu);
	return OK;
}

API CUresult cuCtxSetCurrent(CUcontext c)
{
	CUresult r = ready();

	if (r)
		return r;
	if (depth == 0)
		depth = 1;
	stack[depth - 1] = c;
	return OK;
}

API CUresult cuCtxPushCurrent_v2(CUcontext c)
{
	CUresult r = ready();

	if (r)
		return r;
	if (!c || depth >= 8)
		return INVALID_VALUE;
	stack[depth++] = c;
	return OK;
}

API CUresult cuCtxPopCurrent_v2(CUcontext *c)
{
	CUresult r = in_context();

	if (r)
		return r;
	*c = stack[--depth];
	return OK;
}

API CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t len)
{
	CUresult r = in_context();
	size_t maplen = (len + 4095) & ~(size_t)4095;
	char *m;

	if (r)
		return r;
	if (!len)
		return INVALID_VALUE;
	m = mmap(NULL, maplen, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (m == MAP_FAILED)
		return 2; /* CUDA_ERROR_OUT_OF_MEMORY */
	pthread_mutex_lock(&mu);
	for (int i = 0; i < MAXALLOC; i++) {
		if (!allocs[i].base) {
			allocs[i].base = m;
			allocs[i].len = len;
			allocs[i].maplen = maplen;
			allocs[i].device = stack[depth - 1]->device;
			pthread_mutex_unlock(&mu);
			*p = (CUdeviceptr)(uintptr_t)m;
			return OK;
		}
	}
	pthread_mutex_unlock(&mu);
	munmap(m, maplen);
	return 2;
}

API CUresult cuMemFree_v2(CUdeviceptr p)
{
	CUresult r = in_context();
	int i;

	if (r)
		return r;
	pthread_mutex_lock(&mu);
	i = find(p, 0);
	if (i < 0 || (uintptr_t)allocs[i].base != p) {
		pthread_mutex_unlock(&mu);
		return INVALID_VALUE;
	}
	munmap(allocs[i].base, allocs[i].maplen);
	memset(&allocs[i], 0, sizeof(allocs[i]));
	pthread_mutex_unlock(&mu);
	return OK;
}

API CUresult cuPointerGetAttribute(void *data, int attr, CUdeviceptr p)
{
	CUresult r = ready();
	int i;

	if (r)
		return r;
	pthread_mutex_lock(&mu);
	i = find(p, 1);
	if (i < 0) {
		pthread_mutex_unlock(&mu);
		return INVALID_VALUE;
	}
	switch (attr) {
	case 1: /* CONTEXT */
		*(CUcontext *)data = &prim[allocs[i].device];
		break;
	case 2: /* MEMORY_TYPE: device */
		*(unsigned *)data = 2;
		break;
	case 9: /* DEVICE_ORDINAL */
		*(int *)data = allocs[i].device;
		break;
	case 11: /* RANGE_START_ADDR */
		*(CUdeviceptr *)data = (CUdeviceptr)(uintptr_t)allocs[i].base;
		break;
	case 12: /* RANGE_SIZE */
		*(size_t *)data = allocs[i].len;
		break;
	default:
		r = INVALID_VALUE;
	}
	pthread_mutex_unlock(&mu);
	return r;
}

API CUresult cuMemHostAlloc(void **p, size_t len, unsigned flags)
{
	CUresult r = in_context();

	(void)flags;
	if (r)
		return r;
	*p = malloc(len ? len : 1);
	return *p ? OK : 2;
}

API CUresult cuMemFreeHost(void *p)
{
	CUresult r = in_context();

	if (r)
		return r;
	free(p);
	return OK;
}

/* A copy with the allocation opened for its duration. */
static CUresult copy(CUdeviceptr dev, void *host, size_t len, int to_device)
{
	CUresult r = in_context();
	int i;

	if (r)
		return r;
	pthread_mutex_lock(&mu);
	i = find(dev, len);
	if (i < 0) {
		pthread_mutex_unlock(&mu);
		return INVALID_VALUE;
	}
	if (mprotect(allocs[i].base, allocs[i].maplen, PROT_READ | PROT_WRITE))
		abort();
	if (to_device)
		memcpy((void *)(uintptr_t)dev, host, len);
	else
		memcpy(host, (const void *)(uintptr_t)dev, len);
	if (mprotect(allocs[i].base, allocs[i].maplen, PROT_NONE))
		abort();
	pthread_mutex_unlock(&mu);
	return OK;
}

API CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t len)
{
	return copy(dst, (void *)(uintptr_t)src, len, 1);
}

API CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t len)
{
	return copy(src, dst, len, 0);
}

/* ---- streams and events: done at once (see the top) -------------------- */

struct CUstream_st {
	CUcontext ctx;
};
struct CUevent_st {
	int recorded;
};
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;

API CUresult cuStreamCreate(CUstream *st, unsigned flags)
{
	CUresult r = in_context();

	(void)flags;
	if (r)
		return r;
	*st = calloc(1, sizeof(**st));
	if (!*st)
		return 2;
	(*st)->ctx = stack[depth - 1];
	return OK;
}

API CUresult cuStreamDestroy_v2(CUstream st)
{
	CUresult r = ready();

	if (r)
		return r;
	free(st);
	return OK;
}

API CUresult cuStreamGetCtx(CUstream st, CUcontext *c)
{
	CUresult r = in_context();

	if (r)
		return r;
	/* NULL is the legacy default stream: the current context's. */
	*c = st ? st->ctx : stack[depth - 1];
	return OK;
}

API CUresult cuEventCreate(CUevent *ev, unsigned flags)
{
	CUresult r = in_context();

	(void)flags;
	if (r)
		return r;
	*ev = calloc(1, sizeof(**ev));
	return *ev ? OK : 2;
}

API CUresult cuEventDestroy_v2(CUevent ev)
{
	CUresult r = ready();

	if (r)
		return r;
	free(ev);
	return OK;
}

API CUresult cuEventRecord(CUevent ev, CUstream st)
{
	CUresult r = in_context();

	(void)st;
	if (r)
		return r;
	if (!ev)
		return INVALID_VALUE;
	ev->recorded = 1;
	return OK;
}

API CUresult cuEventQuery(CUevent ev)
{
	CUresult r = ready();

	if (r)
		return r;
	return ev ? OK : INVALID_VALUE;
}

API CUresult cuStreamWaitEvent(CUstream st, CUevent ev, unsigned flags)
{
	CUresult r = in_context();

	(void)st;
	(void)flags;
	if (r)
		return r;
	return ev ? OK : INVALID_VALUE;
}

API CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t len, CUstream st)
{
	(void)st;
	return copy(src, dst, len, 0);
}

API CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t len, CUstream st)
{
	(void)st;
	return copy(dst, (void *)(uintptr_t)src, len, 1);
}

/* The device path's copies and fills (stage.c loads them with the rest),
 * done at once like the other asynchronous calls. */
API CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t len, CUstream st)
{
	CUresult r = in_context();
	int i, j;

	(void)st;
	if (r)
		return r;
	pthread_mutex_lock(&mu);
	i = find(dst, len);
	j = find(src, len);
	if (i < 0 || j < 0) {
		pthread_mutex_unlock(&mu);
		return INVALID_VALUE;
	}
	if (mprotect(allocs[i].base, allocs[i].maplen, PROT_READ | PROT_WRITE) ||
	    mprotect(allocs[j].base, allocs[j].maplen, PROT_READ | PROT_WRITE))
		abort();
	memmove((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, len);
	if (mprotect(allocs[i].base, allocs[i].maplen, PROT_NONE) ||
	    mprotect(allocs[j].base, allocs[j].maplen, PROT_NONE))
		abort();
	pthread_mutex_unlock(&mu);
	return OK;
}

API CUresult cuMemsetD32Async(CUdeviceptr dst, unsigned word, size_t count, CUstream st)
{
	CUresult r = in_context();
	int i;

	(void)st;
	if (r)
		return r;
	if (dst % 4 || count > SIZE_MAX / 4)
		return INVALID_VALUE;
	pthread_mutex_lock(&mu);
	i = find(dst, 4 * count);
	if (i < 0) {
		pthread_mutex_unlock(&mu);
		return INVALID_VALUE;
	}
	if (mprotect(allocs[i].base, allocs[i].maplen, PROT_READ | PROT_WRITE))
		abort();
	for (size_t k = 0; k < count; k++)
		((uint32_t *)(uintptr_t)dst)[k] = word;
	if (mprotect(allocs[i].base, allocs[i].maplen, PROT_NONE))
		abort();
	pthread_mutex_unlock(&mu);
	return OK;
}

API CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *d, void *p, unsigned flags)
{
	CUresult r = in_context();

	(void)flags;
	if (r)
		return r;
	*d = (CUdeviceptr)(uintptr_t)p; /* unified addressing: the same address */
	return OK;
}

API CUresult cuDriverGetVersion(int *v)
{
	*v = 13000;
	return OK;
}

API CUresult cuCtxGetDevice(CUdevice *d)
{
	CUresult r = in_context();

	if (r)
		return r;
	*d = stack[depth - 1]->device;
	return OK;
}

API CUresult cuDeviceGetAttribute(int *v, int attr, CUdevice d)
{
	CUresult r = ready();

	(void)attr;
	if (r)
		return r;
	if (d < 0 || d >= ndev)
		return INVALID_DEVICE;
	*v = 1;
	return OK;
}
