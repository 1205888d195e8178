/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Host staging of CUDA memory (stage.h): the pinned host copy of a device
 * registration, and the CUDA driver calls behind it.
 */
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "xfer.h"
#include "log.h"
#include "mp_build_config.h"
#include "stage.h"

#ifdef MP_HAVE_CUDA_STAGE
#include <dlfcn.h>
#include <pthread.h>

/*
 * The CUDA driver (libcuda.so.1) is loaded with dlopen on the first
 * registration of device memory, as the verbs provider does for GPUDirect
 * (drivers/verbs/ibv.c): it ships with the NVIDIA kernel driver, not with
 * the toolkit, so linking it would keep libmoshpit off every host without
 * one, and a process that never registers device memory never loads it.
 *
 * The few types and constants used are those of the driver's ABI, written
 * out here so that staging builds without the CUDA toolkit: a CPU-only
 * build of the library then still stages for an application that brings
 * its own GPU. Where cuda.h is at hand (nvcc found), it checks them, and
 * the entry points' signatures below.
 */
typedef unsigned mp_cu_result;        /* CUresult, an enum; CUDA_SUCCESS is 0 */
typedef unsigned long long mp_cu_ptr; /* CUdeviceptr on 64-bit hosts */
typedef struct CUctx_st *mp_cu_ctx;   /* CUcontext */
typedef int mp_cu_device;             /* CUdevice */
typedef struct CUstream_st *mp_cu_stream; /* CUstream */
typedef struct CUevent_st *mp_cu_event;   /* CUevent */

enum {
	MP_CU_ERROR_NO_DEVICE = 100,
	MP_CU_POINTER_ATTRIBUTE_CONTEXT = 1,
	MP_CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2,
	MP_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9,
	MP_CU_POINTER_ATTRIBUTE_RANGE_START_ADDR = 11,
	MP_CU_POINTER_ATTRIBUTE_RANGE_SIZE = 12,
	MP_CU_MEMORYTYPE_DEVICE = 2,
	MP_CU_MEMHOSTALLOC_PORTABLE = 1,
	MP_CU_MEMHOSTALLOC_DEVICEMAP = 2,
	MP_CU_ERROR_NOT_READY = 600,
	MP_CU_ERROR_NOT_SUPPORTED = 801,
	MP_CU_STREAM_NON_BLOCKING = 1,
	MP_CU_EVENT_DISABLE_TIMING = 2,
	MP_CU_STREAM_WAIT_VALUE_GEQ = 0,
	MP_CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1 = 92,
	MP_CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS = 117,
	MP_CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING = 118,
	MP_CU_FLUSH_GPU_DIRECT_RDMA_WRITES_OPTION_HOST = 1,
	MP_CU_GPU_DIRECT_RDMA_WRITES_ORDERING_OWNER = 100,
	MP_CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TARGET_CURRENT_CTX = 0,
	MP_CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TO_OWNER = 100,
};

/* Entry points, by the names the driver exports (cuda.h maps the plain
 * names of the calls it revised onto their _v2 symbols). */
struct cu_api {
	mp_cu_result (*init)(unsigned flags);
	mp_cu_result (*error_name)(mp_cu_result r, const char **name);
	mp_cu_result (*pointer_attr)(void *data, unsigned attribute, mp_cu_ptr p);
	mp_cu_result (*device_get)(mp_cu_device *dev, int ordinal);
	mp_cu_result (*primary_retain)(mp_cu_ctx *c, mp_cu_device dev);
	mp_cu_result (*primary_release)(mp_cu_device dev);
	mp_cu_result (*push)(mp_cu_ctx c);
	mp_cu_result (*pop)(mp_cu_ctx *c);
	mp_cu_result (*host_alloc)(void **p, size_t len, unsigned flags);
	mp_cu_result (*host_free)(void *p);
	mp_cu_result (*stream_create)(mp_cu_stream *st, unsigned flags);
	mp_cu_result (*stream_destroy)(mp_cu_stream st);
	mp_cu_result (*stream_get_ctx)(mp_cu_stream st, mp_cu_ctx *c);
	mp_cu_result (*event_create)(mp_cu_event *ev, unsigned flags);
	mp_cu_result (*event_destroy)(mp_cu_event ev);
	mp_cu_result (*event_record)(mp_cu_event ev, mp_cu_stream st);
	mp_cu_result (*event_query)(mp_cu_event ev);
	mp_cu_result (*stream_wait_event)(mp_cu_stream st, mp_cu_event ev, unsigned flags);
	mp_cu_result (*dtoh_async)(void *dst, mp_cu_ptr src, size_t len, mp_cu_stream st);
	mp_cu_result (*htod_async)(mp_cu_ptr dst, const void *src, size_t len, mp_cu_stream st);
	mp_cu_result (*host_dev_ptr)(mp_cu_ptr *dptr, void *p, unsigned flags);
	mp_cu_result (*mem_alloc)(mp_cu_ptr *dptr, size_t len);
	mp_cu_result (*mem_free)(mp_cu_ptr dptr);
	mp_cu_result (*dtod_async)(mp_cu_ptr dst, mp_cu_ptr src, size_t len, mp_cu_stream st);
	mp_cu_result (*memset_d32_async)(mp_cu_ptr dst, unsigned word, size_t count, mp_cu_stream st);
	mp_cu_result (*driver_version)(int *v);
	mp_cu_result (*ctx_device)(mp_cu_device *dev);
	mp_cu_result (*device_attr)(int *v, unsigned attribute, mp_cu_device dev);
	/* Optional (CUDA 11.7): without it a stream cannot wait on a request. */
	mp_cu_result (*wait_value32)(mp_cu_stream st, mp_cu_ptr addr, uint32_t value, unsigned flags);
	/* Optional (CUDA 11.3): without it GPUDirect RDMA needs a GPU that
	 * orders a NIC's writes itself. (Its arguments are enums: unsigned.) */
	mp_cu_result (*flush_rdma)(unsigned target, unsigned scope);
};
static struct cu_api cu;

#ifdef MP_HAVE_CUDA
/* The toolkit is here: hold the copies above against its header. */
#include <cuda.h>
#define SAME(ours, theirs) _Static_assert((int)(ours) == (int)(theirs), #theirs)
SAME(MP_CU_ERROR_NO_DEVICE, CUDA_ERROR_NO_DEVICE);
SAME(MP_CU_POINTER_ATTRIBUTE_CONTEXT, CU_POINTER_ATTRIBUTE_CONTEXT);
SAME(MP_CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_MEMORY_TYPE);
SAME(MP_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL);
SAME(MP_CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR);
SAME(MP_CU_POINTER_ATTRIBUTE_RANGE_SIZE, CU_POINTER_ATTRIBUTE_RANGE_SIZE);
SAME(MP_CU_MEMORYTYPE_DEVICE, CU_MEMORYTYPE_DEVICE);
SAME(MP_CU_MEMHOSTALLOC_PORTABLE, CU_MEMHOSTALLOC_PORTABLE);
SAME(MP_CU_MEMHOSTALLOC_DEVICEMAP, CU_MEMHOSTALLOC_DEVICEMAP);
SAME(MP_CU_ERROR_NOT_READY, CUDA_ERROR_NOT_READY);
SAME(MP_CU_ERROR_NOT_SUPPORTED, CUDA_ERROR_NOT_SUPPORTED);
SAME(MP_CU_STREAM_NON_BLOCKING, CU_STREAM_NON_BLOCKING);
SAME(MP_CU_EVENT_DISABLE_TIMING, CU_EVENT_DISABLE_TIMING);
SAME(MP_CU_STREAM_WAIT_VALUE_GEQ, CU_STREAM_WAIT_VALUE_GEQ);
SAME(MP_CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1, CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1);
SAME(MP_CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS,
     CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS);
SAME(MP_CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING,
     CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING);
SAME(MP_CU_FLUSH_GPU_DIRECT_RDMA_WRITES_OPTION_HOST, CU_FLUSH_GPU_DIRECT_RDMA_WRITES_OPTION_HOST);
SAME(MP_CU_GPU_DIRECT_RDMA_WRITES_ORDERING_OWNER, CU_GPU_DIRECT_RDMA_WRITES_ORDERING_OWNER);
SAME(MP_CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TARGET_CURRENT_CTX,
     CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TARGET_CURRENT_CTX);
SAME(MP_CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TO_OWNER, CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TO_OWNER);
SAME(sizeof(mp_cu_ptr), sizeof(CUdeviceptr));
SAME(sizeof(mp_cu_device), sizeof(CUdevice));
#undef SAME
#define SAME_TYPE(entry, fn)                                                              \
	_Static_assert(__builtin_types_compatible_p(__typeof__(((struct cu_api *)0)->entry), \
						    __typeof__(&fn)),                     \
		       #fn)
SAME_TYPE(init, cuInit);
SAME_TYPE(error_name, cuGetErrorName);
SAME_TYPE(pointer_attr, cuPointerGetAttribute);
SAME_TYPE(device_get, cuDeviceGet);
SAME_TYPE(primary_retain, cuDevicePrimaryCtxRetain);
SAME_TYPE(primary_release, cuDevicePrimaryCtxRelease_v2);
SAME_TYPE(push, cuCtxPushCurrent_v2);
SAME_TYPE(pop, cuCtxPopCurrent_v2);
SAME_TYPE(host_alloc, cuMemHostAlloc);
SAME_TYPE(host_free, cuMemFreeHost);
SAME_TYPE(stream_create, cuStreamCreate);
SAME_TYPE(stream_destroy, cuStreamDestroy_v2);
SAME_TYPE(stream_get_ctx, cuStreamGetCtx);
SAME_TYPE(event_create, cuEventCreate);
SAME_TYPE(event_destroy, cuEventDestroy_v2);
SAME_TYPE(event_record, cuEventRecord);
SAME_TYPE(event_query, cuEventQuery);
SAME_TYPE(stream_wait_event, cuStreamWaitEvent);
SAME_TYPE(dtoh_async, cuMemcpyDtoHAsync_v2);
SAME_TYPE(htod_async, cuMemcpyHtoDAsync_v2);
SAME_TYPE(host_dev_ptr, cuMemHostGetDevicePointer_v2);
SAME_TYPE(mem_alloc, cuMemAlloc_v2);
SAME_TYPE(mem_free, cuMemFree_v2);
SAME_TYPE(dtod_async, cuMemcpyDtoDAsync_v2);
SAME_TYPE(memset_d32_async, cuMemsetD32Async);
SAME_TYPE(driver_version, cuDriverGetVersion);
SAME_TYPE(ctx_device, cuCtxGetDevice);
SAME_TYPE(device_attr, cuDeviceGetAttribute);
SAME_TYPE(wait_value32, cuStreamWaitValue32_v2);
#undef SAME_TYPE
#endif

static pthread_once_t cu_once = PTHREAD_ONCE_INIT;
static int cu_err;       /* why the driver cannot be used: negative errno, or 0 */
static char cu_why[256]; /* ... in words */

static const char *cu_name(mp_cu_result r)
{
	static _Thread_local char buf[32];
	const char *s = NULL;

	if (cu.error_name && !cu.error_name(r, &s) && s)
		return s;
	snprintf(buf, sizeof(buf), "CUresult %u", r);
	return buf;
}

static void cu_load(void)
{
	static const struct {
		const char *sym;
		size_t off;
	} syms[] = {
		{"cuInit", offsetof(struct cu_api, init)},
		{"cuGetErrorName", offsetof(struct cu_api, error_name)},
		{"cuPointerGetAttribute", offsetof(struct cu_api, pointer_attr)},
		{"cuDeviceGet", offsetof(struct cu_api, device_get)},
		{"cuDevicePrimaryCtxRetain", offsetof(struct cu_api, primary_retain)},
		{"cuDevicePrimaryCtxRelease_v2", offsetof(struct cu_api, primary_release)},
		{"cuCtxPushCurrent_v2", offsetof(struct cu_api, push)},
		{"cuCtxPopCurrent_v2", offsetof(struct cu_api, pop)},
		{"cuMemHostAlloc", offsetof(struct cu_api, host_alloc)},
		{"cuMemFreeHost", offsetof(struct cu_api, host_free)},
		/* The per-thread default stream variants (_ptsz) are not
		 * taken: a NULL stream here is the legacy default stream. */
		{"cuStreamCreate", offsetof(struct cu_api, stream_create)},
		{"cuStreamDestroy_v2", offsetof(struct cu_api, stream_destroy)},
		{"cuStreamGetCtx", offsetof(struct cu_api, stream_get_ctx)},
		{"cuEventCreate", offsetof(struct cu_api, event_create)},
		{"cuEventDestroy_v2", offsetof(struct cu_api, event_destroy)},
		{"cuEventRecord", offsetof(struct cu_api, event_record)},
		{"cuEventQuery", offsetof(struct cu_api, event_query)},
		{"cuStreamWaitEvent", offsetof(struct cu_api, stream_wait_event)},
		{"cuMemcpyDtoHAsync_v2", offsetof(struct cu_api, dtoh_async)},
		{"cuMemcpyHtoDAsync_v2", offsetof(struct cu_api, htod_async)},
		{"cuMemHostGetDevicePointer_v2", offsetof(struct cu_api, host_dev_ptr)},
		{"cuMemAlloc_v2", offsetof(struct cu_api, mem_alloc)},
		{"cuMemFree_v2", offsetof(struct cu_api, mem_free)},
		{"cuMemcpyDtoDAsync_v2", offsetof(struct cu_api, dtod_async)},
		{"cuMemsetD32Async", offsetof(struct cu_api, memset_d32_async)},
		{"cuDriverGetVersion", offsetof(struct cu_api, driver_version)},
		{"cuCtxGetDevice", offsetof(struct cu_api, ctx_device)},
		{"cuDeviceGetAttribute", offsetof(struct cu_api, device_attr)},
	};
	void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);

	/* Not supported on this host, as a memory kind no transport takes. */
	cu_err = -ENOTSUP;
	if (!h) {
		snprintf(cu_why, sizeof(cu_why), "the CUDA driver cannot be loaded (%s)", dlerror());
		return;
	}
	for (size_t i = 0; i < sizeof(syms) / sizeof(syms[0]); i++) {
		void *f = dlsym(h, syms[i].sym);
		if (!f) {
			/* cuDevicePrimaryCtxRelease_v2 is the youngest: CUDA 11. */
			snprintf(cu_why, sizeof(cu_why),
				 "the CUDA driver lacks %s (older than CUDA 11)", syms[i].sym);
			return;
		}
		/* All entries are function pointers of one size and representation. */
		memcpy((char *)&cu + syms[i].off, &f, sizeof(f));
	}
	/* CUDA 11.7's cuStreamWaitValue32_v2, the name CUDA 12 and 13 bind
	 * cuStreamWaitValue32 to: without it only mp_request_stream_wait is
	 * missing (-ENOTSUP, real_wait_value). */
	void *wv = dlsym(h, "cuStreamWaitValue32_v2");
	memcpy(&cu.wait_value32, &wv, sizeof(wv));
	void *fl = dlsym(h, "cuFlushGPUDirectRDMAWrites");
	memcpy(&cu.flush_rdma, &fl, sizeof(fl));
	/* Idempotent; the application has usually initialised the driver already. */
	mp_cu_result r = cu.init(0);
	if (r) {
		snprintf(cu_why, sizeof(cu_why), "%s (cuInit: %s)",
			 r == MP_CU_ERROR_NO_DEVICE ? "no CUDA device" : "the CUDA driver refuses to start",
			 cu_name(r));
		return;
	}
	cu_err = 0;
	MP_INFO("stage: CUDA driver loaded (libcuda.so.1)");
}

static int real_query(void *ptr, size_t len, struct mp_stage_dev *d, char *why, size_t n)
{
	mp_cu_ptr p = (mp_cu_ptr)(uintptr_t)ptr, start = 0;
	unsigned type = 0;
	size_t size = 0;
	mp_cu_ctx c = NULL;
	mp_cu_result r;

	pthread_once(&cu_once, cu_load);
	if (cu_err) {
		snprintf(why, n, "%s", cu_why);
		return cu_err;
	}
	r = cu.pointer_attr(&type, MP_CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p);
	if (r) {
		snprintf(why, n, "CUDA does not know the address (%s)", cu_name(r));
		return -EINVAL;
	}
	if (type != MP_CU_MEMORYTYPE_DEVICE) {
		snprintf(why, n, "it is host memory to CUDA (memory type %u): register it as host memory",
			 type);
		return -EINVAL;
	}
	r = cu.pointer_attr(&start, MP_CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, p);
	if (!r)
		r = cu.pointer_attr(&size, MP_CU_POINTER_ATTRIBUTE_RANGE_SIZE, p);
	if (r || p - start > size || len > size - (p - start)) {
		snprintf(why, n, "the range leaves its allocation (%zu bytes at %#llx%s%s)", size,
			 start, r ? ": " : "", r ? cu_name(r) : "");
		return -EINVAL;
	}
	d->device = -1;
	r = cu.pointer_attr(&c, MP_CU_POINTER_ATTRIBUTE_CONTEXT, p);
	if (!r && !c) {
		/* Stream-ordered (cudaMallocAsync) and virtual-memory (cuMemCreate)
		 * allocations belong to no context: the copies run in the device's
		 * primary context, held until the registration goes. */
		int ordinal = -1;
		mp_cu_device dev = 0;
		r = cu.pointer_attr(&ordinal, MP_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p);
		if (!r)
			r = cu.device_get(&dev, ordinal);
		if (!r)
			r = cu.primary_retain(&c, dev);
		if (!r)
			d->device = dev;
	}
	if (r) {
		snprintf(why, n, "no CUDA context to copy it in (%s)", cu_name(r));
		return -EINVAL;
	}
	d->ctx = c;
	return 0;
}

static void real_release(struct mp_stage_dev *d)
{
	if (d->device >= 0)
		cu.primary_release(d->device);
	d->device = -1;
}

/*
 * The copies run on the context's progress thread, which has no CUDA
 * context of its own: each call makes the memory's context current for its
 * duration and restores the thread's stack after, so an application thread
 * calling in (registration) keeps whatever it had current.
 */
static mp_cu_result cu_enter(const struct mp_stage_dev *d)
{
	return cu.push((mp_cu_ctx)d->ctx);
}

static void cu_leave(void)
{
	mp_cu_ctx top;

	cu.pop(&top);
}

static int real_host_alloc(const struct mp_stage_dev *d, size_t len, void **host)
{
	mp_cu_result r = cu_enter(d);

	if (!r) {
		/* Portable: pinned for every context, whichever one runs the copy;
		 * mapped: a stream waits on a word of it (real_wait_value). */
		r = cu.host_alloc(host, len, MP_CU_MEMHOSTALLOC_PORTABLE | MP_CU_MEMHOSTALLOC_DEVICEMAP);
		cu_leave();
	}
	if (r) {
		MP_WARN("stage: cuMemHostAlloc(%zu bytes): %s", len, cu_name(r));
		return -ENOMEM;
	}
	return 0;
}

static void real_host_free(const struct mp_stage_dev *d, void *host)
{
	mp_cu_result r = cu_enter(d);

	if (!r) {
		r = cu.host_free(host);
		cu_leave();
	}
	if (r)
		MP_WARN("stage: cuMemFreeHost(%p): %s", host, cu_name(r));
}

static int real_stream_create(const struct mp_stage_dev *d, void **stream)
{
	mp_cu_stream st = NULL;
	mp_cu_result r = cu_enter(d);

	if (!r) {
		/* Non-blocking: the copies neither wait for the legacy default
		 * stream's work nor hold it up; what they wait for is said with
		 * events (mp_stage_in). */
		r = cu.stream_create(&st, MP_CU_STREAM_NON_BLOCKING);
		cu_leave();
	}
	if (r) {
		MP_WARN("stage: cuStreamCreate: %s", cu_name(r));
		return -EIO;
	}
	*stream = st;
	return 0;
}

static void real_stream_destroy(const struct mp_stage_dev *d, void *stream)
{
	if (!cu_enter(d)) {
		cu.stream_destroy((mp_cu_stream)stream);
		cu_leave();
	}
}

static int real_event_create(const struct mp_stage_dev *d, void **ev)
{
	mp_cu_event e = NULL;
	mp_cu_result r = cu_enter(d);

	if (!r) {
		r = cu.event_create(&e, MP_CU_EVENT_DISABLE_TIMING);
		cu_leave();
	}
	if (r) {
		MP_WARN("stage: cuEventCreate: %s", cu_name(r));
		return -EIO;
	}
	*ev = e;
	return 0;
}

static void real_event_destroy(const struct mp_stage_dev *d, void *ev)
{
	if (!cu_enter(d)) {
		cu.event_destroy((mp_cu_event)ev);
		cu_leave();
	}
}

/* A stream of the caller's must be of the memory's context: an event is
 * recorded, and a stream waits, only in their own context. The legacy
 * default stream (NULL) is the current context's, which is the memory's
 * while cu_enter holds it. */
static int check_stream(mp_cu_stream st, const struct mp_stage_dev *d, char *why, size_t n)
{
	mp_cu_ctx c = NULL;
	mp_cu_result r;

	if (!st)
		return 0;
	r = cu.stream_get_ctx(st, &c);
	if (r) {
		snprintf(why, n, "CUDA does not know the stream %p (cuStreamGetCtx: %s)", (void *)st,
			 cu_name(r));
		return -EINVAL;
	}
	if (c != (mp_cu_ctx)d->ctx) {
		snprintf(why, n, "the stream %p belongs to CUDA context %p, the memory to %p",
			 (void *)st, (void *)c, d->ctx);
		return -EINVAL;
	}
	return 0;
}

static int real_event_record(const struct mp_stage_dev *d, void *ev, void *stream, char *why,
			     size_t n)
{
	mp_cu_result r = cu_enter(d);
	int rc;

	if (r) {
		snprintf(why, n, "cuCtxPushCurrent: %s", cu_name(r));
		return -EIO;
	}
	rc = check_stream((mp_cu_stream)stream, d, why, n);
	if (!rc && (r = cu.event_record((mp_cu_event)ev, (mp_cu_stream)stream))) {
		snprintf(why, n, "cuEventRecord: %s", cu_name(r));
		rc = -EIO;
	}
	cu_leave();
	return rc;
}

static int real_stream_wait_event(const struct mp_stage_dev *d, void *stream, void *ev)
{
	mp_cu_result r = cu_enter(d);

	if (!r) {
		r = cu.stream_wait_event((mp_cu_stream)stream, (mp_cu_event)ev, 0);
		cu_leave();
	}
	if (r) {
		MP_WARN("stage: cuStreamWaitEvent: %s", cu_name(r));
		return -EIO;
	}
	return 0;
}

/* Pinned host memory to or from device memory, on a stream: the driver
 * copies without staging it again, and the call returns at once. */
static int real_copy_async(const struct mp_stage_dev *d, void *dst, const void *src, size_t len,
			   int to_device, void *stream)
{
	mp_cu_result r = cu_enter(d);

	if (!r) {
		if (to_device)
			r = cu.htod_async((mp_cu_ptr)(uintptr_t)dst, src, len, (mp_cu_stream)stream);
		else
			r = cu.dtoh_async(dst, (mp_cu_ptr)(uintptr_t)src, len, (mp_cu_stream)stream);
		cu_leave();
	}
	if (r) {
		MP_WARN("stage: %s(%zu bytes %s %p): %s", to_device ? "cuMemcpyHtoDAsync" :
			"cuMemcpyDtoHAsync", len, to_device ? "to" : "from", to_device ? dst : src,
			cu_name(r));
		return -EIO;
	}
	return 0;
}

static int real_event_query(const struct mp_stage_dev *d, void *ev)
{
	mp_cu_result r = cu_enter(d);

	if (!r) {
		r = cu.event_query((mp_cu_event)ev);
		cu_leave();
	}
	if (r == MP_CU_ERROR_NOT_READY)
		return -EAGAIN;
	if (r) {
		MP_WARN("stage: cuEventQuery: %s", cu_name(r));
		return -EIO;
	}
	return 0;
}

/*
 * cuStreamWaitValue32 on the word: a stream memory operation. CUDA 12 and
 * 13 have them on every device; CUDA 11 drivers only where the device
 * says so (CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS, which needed the
 * kernel module's NVreg_EnableStreamMemOPs=1 on most GPUs).
 */
static int real_wait_value(const struct mp_stage_dev *d, void *stream, const uint32_t *word,
			   uint32_t value, char *why, size_t n)
{
	mp_cu_ptr addr = 0;
	mp_cu_device dev = 0;
	int version = 0, can = 0, rc;
	mp_cu_result r;

	if (!cu.wait_value32) {
		snprintf(why, n, "the CUDA driver has no cuStreamWaitValue32_v2 (older than CUDA "
			 "11.7): wait with mp_wait or mp_test instead");
		return -ENOTSUP;
	}
	r = cu_enter(d);
	if (r) {
		snprintf(why, n, "cuCtxPushCurrent: %s", cu_name(r));
		return -EIO;
	}
	rc = check_stream((mp_cu_stream)stream, d, why, n);
	if (!rc && !cu.driver_version(&version) && version < 12000 &&
	    (cu.ctx_device(&dev) || cu.device_attr(&can, MP_CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1,
						    dev) || !can)) {
		snprintf(why, n, "the device has no stream memory operations (CUDA driver %d, "
			 "CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS 0): wait with mp_wait or mp_test "
			 "instead", version);
		rc = -ENOTSUP;
	}
	if (!rc && (r = cu.host_dev_ptr(&addr, (void *)(uintptr_t)word, 0))) {
		snprintf(why, n, "cuMemHostGetDevicePointer: %s", cu_name(r));
		rc = -EIO;
	}
	if (!rc && (r = cu.wait_value32((mp_cu_stream)stream, addr, value,
					MP_CU_STREAM_WAIT_VALUE_GEQ))) {
		snprintf(why, n, "cuStreamWaitValue32: %s%s", cu_name(r),
			 r == MP_CU_ERROR_NOT_SUPPORTED ? " (wait with mp_wait or mp_test instead)" : "");
		rc = r == MP_CU_ERROR_NOT_SUPPORTED ? -ENOTSUP : -EIO;
	}
	cu_leave();
	return rc;
}

/* Device memory for the device path (devk.h): cuMemAlloc gives 256-byte
 * aligned memory of the current context, the memory's here. */
static int real_dev_alloc(const struct mp_stage_dev *d, size_t len, void **dptr)
{
	mp_cu_ptr p = 0;
	mp_cu_result r = cu_enter(d);

	if (!r) {
		r = cu.mem_alloc(&p, len);
		cu_leave();
	}
	if (r) {
		MP_WARN("stage: cuMemAlloc(%zu bytes): %s", len, cu_name(r));
		return -ENOMEM;
	}
	*dptr = (void *)(uintptr_t)p;
	return 0;
}

static void real_dev_free(const struct mp_stage_dev *d, void *dptr)
{
	mp_cu_result r;

	if (!dptr)
		return;
	r = cu_enter(d);
	if (!r) {
		r = cu.mem_free((mp_cu_ptr)(uintptr_t)dptr);
		cu_leave();
	}
	if (r)
		MP_WARN("stage: cuMemFree(%p): %s", dptr, cu_name(r));
}

static int real_copy_d2d(const struct mp_stage_dev *d, void *dst, const void *src, size_t len,
			 void *stream)
{
	mp_cu_result r = cu_enter(d);

	if (!r) {
		r = cu.dtod_async((mp_cu_ptr)(uintptr_t)dst, (mp_cu_ptr)(uintptr_t)src, len,
				  (mp_cu_stream)stream);
		cu_leave();
	}
	if (r) {
		MP_WARN("stage: cuMemcpyDtoDAsync(%zu bytes, %p to %p): %s", len, src, dst,
			cu_name(r));
		return -EIO;
	}
	return 0;
}

static int real_fill32(const struct mp_stage_dev *d, void *dst, uint32_t word, size_t count,
		       void *stream)
{
	mp_cu_result r = cu_enter(d);

	if (!r) {
		r = cu.memset_d32_async((mp_cu_ptr)(uintptr_t)dst, word, count, (mp_cu_stream)stream);
		cu_leave();
	}
	if (r) {
		MP_WARN("stage: cuMemsetD32Async(%zu words at %p): %s", count, dst, cu_name(r));
		return -EIO;
	}
	return 0;
}

/*
 * GPUDirect RDMA: a NIC's write into GPU memory may not yet be visible to
 * work queued after its completion was seen, unless the GPU orders such
 * writes for their owner (CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_
 * ORDERING); else cuFlushGPUDirectRDMAWrites makes them so, where the
 * device offers it (..._FLUSH_WRITES_OPTIONS, host bit), as NCCL flushes.
 */
static int real_rdma_order(const struct mp_stage_dev *d, char *why, size_t n)
{
	int order = 0, opts = 0;
	mp_cu_device dev;
	mp_cu_result r = cu_enter(d);

	if (!r) {
		r = cu.ctx_device(&dev);
		if (!r)
			r = cu.device_attr(&order, MP_CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING,
					   dev);
		if (!r)
			r = cu.device_attr(&opts,
					   MP_CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS,
					   dev);
		cu_leave();
	}
	if (r) {
		snprintf(why, n, "the GPU's GPUDirect RDMA attributes cannot be read (%s)", cu_name(r));
		return -ENOTSUP;
	}
	if (order >= MP_CU_GPU_DIRECT_RDMA_WRITES_ORDERING_OWNER)
		return 0;
	if (cu.flush_rdma && (opts & MP_CU_FLUSH_GPU_DIRECT_RDMA_WRITES_OPTION_HOST))
		return 1;
	snprintf(why, n, "the GPU neither orders a NIC's writes nor can flush them (%s)",
		 cu.flush_rdma ? "CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS 0" :
				 "the driver lacks cuFlushGPUDirectRDMAWrites");
	return -ENOTSUP;
}

static int real_rdma_flush(const struct mp_stage_dev *d)
{
	mp_cu_result r = cu_enter(d);

	if (!r) {
		r = cu.flush_rdma(MP_CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TARGET_CURRENT_CTX,
				  MP_CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TO_OWNER);
		cu_leave();
	}
	if (r) {
		MP_WARN("stage: cuFlushGPUDirectRDMAWrites: %s", cu_name(r));
		return -EIO;
	}
	return 0;
}

int mp_stage_enter(const struct mp_stage_dev *d)
{
	mp_cu_result r;

	/* Only reached after a query succeeded, which loaded the driver; the
	 * check keeps a caller that skipped it from calling through NULL. */
	pthread_once(&cu_once, cu_load);
	if (cu_err) {
		MP_WARN("stage: %s", cu_why);
		return -EIO;
	}
	r = cu_enter(d);
	if (r) {
		MP_WARN("stage: cuCtxPushCurrent(%p): %s", d->ctx, cu_name(r));
		return -EIO;
	}
	return 0;
}

void mp_stage_leave(void)
{
	cu_leave();
}

const struct mp_stage_dev_ops mp_stage_cuda_ops = {
	.name = "CUDA",
	.query = real_query,
	.release = real_release,
	.host_alloc = real_host_alloc,
	.host_free = real_host_free,
	.stream_create = real_stream_create,
	.stream_destroy = real_stream_destroy,
	.event_create = real_event_create,
	.event_destroy = real_event_destroy,
	.event_record = real_event_record,
	.stream_wait_event = real_stream_wait_event,
	.copy_async = real_copy_async,
	.event_query = real_event_query,
	.wait_value = real_wait_value,
	.dev_alloc = real_dev_alloc,
	.dev_free = real_dev_free,
	.copy_d2d = real_copy_d2d,
	.fill32 = real_fill32,
	.rdma_order = real_rdma_order,
	.rdma_flush = real_rdma_flush,
};
#else
/* -Dcuda=disabled: no CUDA code at all. The other entries are never
 * reached, since every registration stops at query. */
static int off_query(void *ptr, size_t len, struct mp_stage_dev *d, char *why, size_t n)
{
	(void)ptr, (void)len, (void)d;
	snprintf(why, n, "built with -Dcuda=disabled");
	return -ENOTSUP;
}

const struct mp_stage_dev_ops mp_stage_cuda_ops = {
	.name = "CUDA",
	.query = off_query,
};

int mp_stage_enter(const struct mp_stage_dev *d)
{
	(void)d;
	return -ENOTSUP;
}

void mp_stage_leave(void)
{
}
#endif

const struct mp_stage_dev_ops *mp_stage_dev_ops = &mp_stage_cuda_ops;

/* Where the word sits: after the copy, on its own cache line. */
static size_t word_off(size_t len)
{
	return (len + 63) & ~(size_t)63;
}

int mp_stage_open_dev(struct mp_ctx *ctx, void *dev, size_t len, mp_stage_dev_open_fn dev_open,
		      int *device, char *why_dev, size_t n, struct mp_stage **out)
{
	const struct mp_stage_dev_ops *ops = mp_stage_dev_ops;
	struct mp_stage *s = calloc(1, sizeof(*s));
	char why[256] = "";
	void *host = NULL;
	int rc;

	*device = 0;
	if (!s)
		return -ENOMEM;
	s->ops = ops;
	s->dev_base = dev;
	s->len = len;
	rc = ops->query(dev, len, &s->dev, why, sizeof(why));
	if (rc) {
		mp_set_error(ctx, "%s memory %p (%zu bytes) cannot be staged through host memory: %s",
			     ops->name, dev, len, why);
		free(s);
		return rc;
	}
	rc = ops->stream_create(&s->dev, &s->stream);
	if (!rc)
		rc = ops->event_create(&s->dev, &s->done);
	if (!rc)
		rc = ops->event_create(&s->dev, &s->legacy);
	if (rc) {
		mp_set_error(ctx, "no %s stream and events for the copies of memory %p: %s",
			     ops->name, dev, mp_strerror(rc));
		goto fail_stream;
	}
	if (dev_open) {
		rc = dev_open(ctx, s, why_dev, n);
		if (!rc) {
			*device = 1;
			__atomic_store_n(s->word, 0, __ATOMIC_RELEASE);
			*out = s;
			return 0;
		}
		if (rc != -ENOTSUP)
			goto fail_stream;
	}
	/* One pinned allocation for the copy and the word: pinning is slow. */
	rc = ops->host_alloc(&s->dev, word_off(len) + 64, &host);
	if (rc) {
		mp_set_error(ctx, "no %zu bytes of pinned host memory to stage %s memory %p through: %s",
			     len, ops->name, dev, mp_strerror(rc));
		goto fail_stream;
	}
	s->host = host;
	s->word = (uint32_t *)((char *)host + word_off(len));
	__atomic_store_n(s->word, 0, __ATOMIC_RELEASE);
	rc = ctx->ops->reg_mr(ctx->drv, host, len, MP_MEM_HOST, &s->dmr);
	if (rc) {
		mp_set_error(ctx, "transport %s cannot register the %zu-byte host copy of %s memory %p: %s",
			     ctx->transport, len, ops->name, dev, mp_strerror(rc));
		goto fail_stream;
	}
	*out = s;
	return 0;
fail_stream:
	if (s->legacy)
		ops->event_destroy(&s->dev, s->legacy);
	if (s->done)
		ops->event_destroy(&s->dev, s->done);
	if (s->stream)
		ops->stream_destroy(&s->dev, s->stream);
	if (host)
		ops->host_free(&s->dev, host);
	ops->release(&s->dev);
	free(s);
	return rc;
}

int mp_stage_open(struct mp_ctx *ctx, void *dev, size_t len, struct mp_stage **out)
{
	int device;

	return mp_stage_open_dev(ctx, dev, len, NULL, &device, NULL, 0, out);
}

/*
 * Wait for the work queued before @ev's last record, polling: the
 * progress thread must not block inside the driver, where nothing bounds
 * the wait (the copy in waits for a stream of the caller's, which may hold
 * anything). Bounded by the round timeout, as a silent peer is: the other
 * peers drop this one after as long. @stop: give up when the context stops.
 */
int mp_stage_poll(struct mp_ctx *ctx, struct mp_stage *s, void *ev, int stop)
{
	int ms = ctx->cfg.round_timeout_ms > 0 ? ctx->cfg.round_timeout_ms : 10000;
	struct timespec now, dl, nap = {0, 20000};
	int rc;

	clock_gettime(CLOCK_MONOTONIC, &dl);
	dl.tv_sec += ms / 1000;
	dl.tv_nsec += (long)(ms % 1000) * 1000000L;
	if (dl.tv_nsec >= 1000000000L) {
		dl.tv_sec++;
		dl.tv_nsec -= 1000000000L;
	}
	for (;;) {
		rc = s->ops->event_query(&s->dev, ev);
		if (rc != -EAGAIN)
			return rc;
		if (stop && __atomic_load_n(&ctx->stop, __ATOMIC_ACQUIRE))
			return -ECANCELED;
		clock_gettime(CLOCK_MONOTONIC, &now);
		if (now.tv_sec > dl.tv_sec || (now.tv_sec == dl.tv_sec && now.tv_nsec >= dl.tv_nsec))
			return -ETIMEDOUT;
		/* 20 us first, for the copies of short vectors; then up to 1 ms. */
		nanosleep(&nap, NULL);
		nap.tv_nsec = nap.tv_nsec >= 500000L ? 1000000L : nap.tv_nsec * 2;
	}
}

void mp_stage_close(struct mp_ctx *ctx, struct mp_stage *s)
{
	int rc;

	if (!s)
		return;
	ctx->ops->dereg_mr(ctx->drv, s->dmr);
	/* A copy in that an operation gave up on may still be queued (behind
	 * a caller's stream), and it writes the pinned copy. */
	if (s->dp) {
		/* The device path's work may still be queued: wait for all of it. */
		char why[128];
		(void)s->ops->event_record(&s->dev, s->done, s->stream, why, sizeof(why));
	}
	rc = mp_stage_poll(ctx, s, s->done, 0);
	if (!rc && s->dp)
		s->dp_close(ctx, s);
	s->ops->event_destroy(&s->dev, s->legacy);
	s->ops->event_destroy(&s->dev, s->done);
	s->ops->stream_destroy(&s->dev, s->stream);
	if (rc)
		MP_WARN("stage: copies of %s memory %p still queued (%s): its pinned %s is left "
			"allocated", s->ops->name, s->dev_base, mp_strerror(rc),
			s->dp ? "ring" : "copy");
	else
		s->ops->host_free(&s->dev, s->host);
	s->ops->release(&s->dev);
	free(s);
}

int mp_stage_mark(struct mp_ctx *ctx, struct mp_stage *s, void *stream, void **ev)
{
	char why[256] = "";
	int rc = s->ops->event_create(&s->dev, ev);

	if (rc) {
		mp_set_error(ctx, "no %s event to order the average after stream %p: %s", s->ops->name,
			     stream, mp_strerror(rc));
		return rc;
	}
	rc = s->ops->event_record(&s->dev, *ev, stream, why, sizeof(why));
	if (rc) {
		mp_set_error(ctx, "the average of %s memory %p cannot wait for stream %p: %s",
			     s->ops->name, s->dev_base, stream, why);
		s->ops->event_destroy(&s->dev, *ev);
		*ev = NULL;
	}
	return rc;
}

void mp_stage_unmark(struct mp_stage *s, void *ev)
{
	if (ev)
		s->ops->event_destroy(&s->dev, ev);
}

/* Queue one copy on the registration's stream, after @ev when not NULL,
 * and s->done after it; then wait for s->done. */
static int stage_copy(struct mp_ctx *ctx, struct mp_stage *s, size_t off, size_t bytes, void *ev,
		      int to_device, const char **what)
{
	char *dev = (char *)s->dev_base + off, *host = (char *)s->host + off;
	char why[256] = "";
	int rc = 0;

	*what = "queued";
	if (ev)
		rc = s->ops->stream_wait_event(&s->dev, s->stream, ev);
	if (!rc)
		rc = to_device ? s->ops->copy_async(&s->dev, dev, host, bytes, 1, s->stream) :
				 s->ops->copy_async(&s->dev, host, dev, bytes, 0, s->stream);
	if (!rc)
		rc = s->ops->event_record(&s->dev, s->done, s->stream, why, sizeof(why));
	if (rc)
		return rc;
	*what = "completed";
	/* The copy back waits for nothing but this registration's earlier
	 * copies, and must not be left running behind a failed request: it
	 * writes the caller's buffer. */
	return mp_stage_poll(ctx, s, s->done, !to_device);
}

int mp_stage_in(struct mp_ctx *ctx, struct mp_stage *s, size_t off, size_t bytes, void *ev)
{
	const char *what;
	char why[256] = "";
	int rc = 0;

	if (!ev) {
		/* No stream given (mp_average_start): the values are those the
		 * legacy default stream sees now, as a synchronous copy on it
		 * would read them. */
		ev = s->legacy;
		rc = s->ops->event_record(&s->dev, ev, NULL, why, sizeof(why));
		if (rc)
			MP_WARN("stage: %s", why);
	}
	if (!rc)
		rc = stage_copy(ctx, s, off, bytes, ev, 0, &what);
	else
		what = "queued";
	if (rc == -ECANCELED)
		mp_set_error(ctx, "the context was finalized while the copy of %s memory %p to the host "
			     "waited: the operation did not start and the buffer is as it was",
			     s->ops->name, (void *)((char *)s->dev_base + off));
	else if (rc)
		mp_set_error(ctx, "copying %zu bytes of %s memory %p to the host failed (not %s: %s%s): "
			     "the operation did not start and the buffer is as it was", bytes,
			     s->ops->name, (void *)((char *)s->dev_base + off), what, mp_strerror(rc),
			     rc == -ETIMEDOUT ? " within round_timeout_ms; the stream it waits for did "
			     "not get there" : "");
	return rc == -ECANCELED ? rc : rc ? -EIO : 0;
}

int mp_stage_order(struct mp_ctx *ctx, struct mp_stage *s, void *ev)
{
	char why[256] = "";
	int rc = 0;

	if (!ev) {
		/* As mp_stage_in: what the legacy default stream sees now. */
		ev = s->legacy;
		rc = s->ops->event_record(&s->dev, ev, NULL, why, sizeof(why));
		if (rc)
			MP_WARN("stage: %s", why);
	}
	if (!rc)
		rc = s->ops->stream_wait_event(&s->dev, s->stream, ev);
	if (!rc)
		rc = s->ops->event_record(&s->dev, s->done, s->stream, why, sizeof(why));
	/* Waited for here rather than found out mid-exchange: a stream that
	 * never gets there fails the operation before it starts. */
	if (!rc)
		rc = mp_stage_poll(ctx, s, s->done, 1);
	if (rc == -ECANCELED)
		mp_set_error(ctx, "the context was finalized while the average of %s memory %p waited "
			     "for the caller's stream: it did not start", s->ops->name, s->dev_base);
	else if (rc)
		mp_set_error(ctx, "the average of %s memory %p could not wait for the caller's stream "
			     "(%s%s): it did not start and the buffer is as it was", s->ops->name,
			     s->dev_base, mp_strerror(rc),
			     rc == -ETIMEDOUT ? " within round_timeout_ms; the stream did not get there" :
			     "");
	return rc == -ECANCELED ? rc : rc ? -EIO : 0;
}

int mp_stage_out(struct mp_ctx *ctx, struct mp_stage *s, size_t off, size_t bytes)
{
	const char *what;
	int rc = stage_copy(ctx, s, off, bytes, NULL, 1, &what);

	if (rc)
		mp_set_error(ctx, "copying the %zu-byte result back to %s memory %p failed (not %s: "
			     "%s): the average is lost to this peer", bytes, s->ops->name,
			     (void *)((char *)s->dev_base + off), what, mp_strerror(rc));
	return rc ? -EIO : 0;
}

void mp_stage_end(struct mp_stage *s, uint32_t ticket)
{
	/* Release: the device buffer's final bytes (the copy back has run)
	 * come before the word that lets a caller's stream read them. */
	__atomic_store_n(s->word, ticket, __ATOMIC_RELEASE);
}

int mp_stage_stream_wait(struct mp_ctx *ctx, struct mp_stage *s, void *stream, uint32_t ticket)
{
	char why[256] = "";
	int rc = s->ops->wait_value(&s->dev, stream, s->word, ticket, why, sizeof(why));

	if (rc)
		mp_set_error(ctx, "stream %p cannot wait for the average of %s memory %p: %s", stream,
			     s->ops->name, s->dev_base, why);
	return rc;
}
