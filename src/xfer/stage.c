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

enum {
	MP_CU_ERROR_NO_DEVICE = 100,
	MP_CU_POINTER_ATTRIBUTE_CONTEXT = 1,
	MP_CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2,
	MP_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9,
	MP_CU_POINTER_ATTRIBUTE_RANGE_START_ADDR = 11,
	MP_CU_POINTER_ATTRIBUTE_RANGE_SIZE = 12,
	MP_CU_MEMORYTYPE_DEVICE = 2,
	MP_CU_MEMHOSTALLOC_PORTABLE = 1,
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
	mp_cu_result (*dtoh)(void *dst, mp_cu_ptr src, size_t len);
	mp_cu_result (*htod)(mp_cu_ptr dst, const void *src, size_t len);
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
SAME_TYPE(dtoh, cuMemcpyDtoH_v2);
SAME_TYPE(htod, cuMemcpyHtoD_v2);
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
		{"cuMemcpyDtoH_v2", offsetof(struct cu_api, dtoh)},
		{"cuMemcpyHtoD_v2", offsetof(struct cu_api, htod)},
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
		/* Portable: pinned for every context, whichever one runs the copy. */
		r = cu.host_alloc(host, len, MP_CU_MEMHOSTALLOC_PORTABLE);
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

/*
 * Synchronous copies on the legacy default stream: device to pinned host
 * memory returns once the bytes are there, and so does pinned host memory to
 * device. The legacy stream also waits for work the application queued on
 * its other blocking streams; work on non-blocking streams it must have
 * finished itself before averaging starts (moshpit.h, mp_average_start).
 */
static int real_to_host(const struct mp_stage_dev *d, void *host, const void *dev, size_t len)
{
	mp_cu_result r = cu_enter(d);

	if (!r) {
		r = cu.dtoh(host, (mp_cu_ptr)(uintptr_t)dev, len);
		cu_leave();
	}
	if (r) {
		MP_WARN("stage: cuMemcpyDtoH(%zu bytes from %p): %s", len, dev, cu_name(r));
		return -EIO;
	}
	return 0;
}

static int real_to_device(const struct mp_stage_dev *d, void *dev, const void *host, size_t len)
{
	mp_cu_result r = cu_enter(d);

	if (!r) {
		r = cu.htod((mp_cu_ptr)(uintptr_t)dev, host, len);
		cu_leave();
	}
	if (r) {
		MP_WARN("stage: cuMemcpyHtoD(%zu bytes to %p): %s", len, dev, cu_name(r));
		return -EIO;
	}
	return 0;
}

const struct mp_stage_dev_ops mp_stage_cuda_ops = {
	.name = "CUDA",
	.query = real_query,
	.release = real_release,
	.host_alloc = real_host_alloc,
	.host_free = real_host_free,
	.to_host = real_to_host,
	.to_device = real_to_device,
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
#endif

const struct mp_stage_dev_ops *mp_stage_dev_ops = &mp_stage_cuda_ops;

int mp_stage_open(struct mp_ctx *ctx, void *dev, size_t len, struct mp_stage **out)
{
	const struct mp_stage_dev_ops *ops = mp_stage_dev_ops;
	struct mp_stage *s = calloc(1, sizeof(*s));
	char why[256] = "";
	void *host = NULL;
	int rc;

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
	rc = ops->host_alloc(&s->dev, len, &host);
	if (rc) {
		mp_set_error(ctx, "no %zu bytes of pinned host memory to stage %s memory %p through: %s",
			     len, ops->name, dev, mp_strerror(rc));
		goto fail_release;
	}
	s->host = host;
	rc = ctx->ops->reg_mr(ctx->drv, host, len, MP_MEM_HOST, &s->dmr);
	if (rc) {
		mp_set_error(ctx, "transport %s cannot register the %zu-byte host copy of %s memory %p: %s",
			     ctx->transport, len, ops->name, dev, mp_strerror(rc));
		goto fail_free;
	}
	*out = s;
	return 0;
fail_free:
	ops->host_free(&s->dev, host);
fail_release:
	ops->release(&s->dev);
	free(s);
	return rc;
}

void mp_stage_close(struct mp_ctx *ctx, struct mp_stage *s)
{
	if (!s)
		return;
	ctx->ops->dereg_mr(ctx->drv, s->dmr);
	s->ops->host_free(&s->dev, s->host);
	s->ops->release(&s->dev);
	free(s);
}

int mp_stage_in(struct mp_ctx *ctx, struct mp_stage *s, size_t off, size_t bytes)
{
	int rc = s->ops->to_host(&s->dev, (char *)s->host + off, (char *)s->dev_base + off, bytes);

	if (rc)
		mp_set_error(ctx, "copying %zu bytes of %s memory %p to the host failed (%s): the "
			     "operation did not start and the buffer is as it was", bytes, s->ops->name,
			     (void *)((char *)s->dev_base + off), mp_strerror(rc));
	return rc;
}

int mp_stage_out(struct mp_ctx *ctx, struct mp_stage *s, size_t off, size_t bytes)
{
	int rc = s->ops->to_device(&s->dev, (char *)s->dev_base + off, (char *)s->host + off, bytes);

	if (rc)
		mp_set_error(ctx, "copying the %zu-byte result back to %s memory %p failed (%s): the "
			     "average is lost to this peer", bytes, s->ops->name,
			     (void *)((char *)s->dev_base + off), mp_strerror(rc));
	return rc;
}
