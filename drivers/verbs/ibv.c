/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The real table behind drivers/verbs/ibv.h: libibverbs, and the CUDA driver
 * for the dma-buf of device memory.
 */
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <infiniband/verbs.h>

#include "ibv.h"

#ifdef MP_HAVE_CUDA
#include <dlfcn.h>
#include <pthread.h>
#include <cuda.h>
#include <moshpit/sdk/log.h>
#endif

static struct ibv_device **real_get_device_list(int *num)
{
	return ibv_get_device_list(num);
}

static void real_free_device_list(struct ibv_device **list)
{
	ibv_free_device_list(list);
}

static const char *real_get_device_name(struct ibv_device *dev)
{
	return ibv_get_device_name(dev);
}

static struct ibv_context *real_open_device(struct ibv_device *dev)
{
	return ibv_open_device(dev);
}

static int real_close_device(struct ibv_context *ctx)
{
	return ibv_close_device(ctx);
}

static int real_query_device(struct ibv_context *ctx, struct ibv_device_attr *attr)
{
	return ibv_query_device(ctx, attr);
}

/* A macro over an inline function in verbs.h: it picks the extended query when the provider has one. */
static int real_query_port(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *attr)
{
	return ibv_query_port(ctx, port, attr);
}

static int real_query_gid_ex(struct ibv_context *ctx, uint32_t port, uint32_t index,
			     struct ibv_gid_entry *entry)
{
	return ibv_query_gid_ex(ctx, port, index, entry, 0);
}

static struct ibv_pd *real_alloc_pd(struct ibv_context *ctx)
{
	return ibv_alloc_pd(ctx);
}

static int real_dealloc_pd(struct ibv_pd *pd)
{
	return ibv_dealloc_pd(pd);
}

/* Polled only: no completion channel, vector 0. */
static struct ibv_cq *real_create_cq(struct ibv_context *ctx, int cqe)
{
	return ibv_create_cq(ctx, cqe, NULL, NULL, 0);
}

static int real_resize_cq(struct ibv_cq *cq, int cqe)
{
	return ibv_resize_cq(cq, cqe);
}

static int real_destroy_cq(struct ibv_cq *cq)
{
	return ibv_destroy_cq(cq);
}

static struct ibv_qp *real_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *attr)
{
	return ibv_create_qp(pd, attr);
}

static int real_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask)
{
	return ibv_modify_qp(qp, attr, mask);
}

static int real_destroy_qp(struct ibv_qp *qp)
{
	return ibv_destroy_qp(qp);
}

static struct ibv_mr *real_reg_mr(struct ibv_pd *pd, void *addr, size_t len, int access)
{
	return ibv_reg_mr(pd, addr, len, access);
}

static struct ibv_mr *real_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t len,
					 uint64_t iova, int fd, int access)
{
	return ibv_reg_dmabuf_mr(pd, offset, len, iova, fd, access);
}

static int real_dereg_mr(struct ibv_mr *mr)
{
	return ibv_dereg_mr(mr);
}

static int real_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
	return ibv_post_send(qp, wr, bad);
}

static int real_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
	return ibv_post_recv(qp, wr, bad);
}

static int real_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc)
{
	return ibv_poll_cq(cq, n, wc);
}

#ifdef MP_HAVE_CUDA
/*
 * The CUDA driver (libcuda.so.1) is loaded with dlopen on the first
 * registration of device memory rather than linked. It belongs to the
 * NVIDIA kernel driver's package, not to the toolkit we build with, so
 * linking it would stop libmoshpit from loading on the CPU-only hosts and
 * CI machines where the same build must run, and a process that never
 * registers device memory never touches it. The handle is kept for the
 * life of the process: the driver is not meant to be unloaded.
 */
typedef CUresult (*cu_init_fn)(unsigned int flags);
typedef CUresult (*cu_range_handle_fn)(void *handle, CUdeviceptr dptr, size_t size,
				       CUmemRangeHandleType type, unsigned long long flags);

static pthread_once_t cu_once = PTHREAD_ONCE_INIT;
static cu_range_handle_fn cu_range_handle;
static int cu_err; /* why cu_range_handle is NULL: negative errno */

static void cu_load(void)
{
	void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		MP_INFO("verbs: CUDA driver not loadable (%s); no dma-buf registration", dlerror());
		cu_err = -ENOSYS;
		return;
	}
	cu_init_fn init = (cu_init_fn)(uintptr_t)dlsym(h, "cuInit");
	cu_range_handle_fn rh = (cu_range_handle_fn)(uintptr_t)dlsym(h, "cuMemGetHandleForAddressRange");
	if (!init || !rh) {
		/* cuMemGetHandleForAddressRange arrived with CUDA 11.7. */
		MP_INFO("verbs: CUDA driver lacks cuMemGetHandleForAddressRange (older than 11.7)");
		cu_err = -ENOSYS;
		return;
	}
	/* Idempotent; the application has usually initialised the driver already. */
	CUresult r = init(0);
	if (r != CUDA_SUCCESS) {
		MP_INFO("verbs: cuInit failed (CUresult %d)", (int)r);
		cu_err = -ENODEV;
		return;
	}
	cu_range_handle = rh;
}

static int real_cuda_dmabuf_fd(void *base, size_t len, int *fd)
{
	pthread_once(&cu_once, cu_load);
	if (!cu_range_handle)
		return cu_err;
	int out = -1;
	CUresult r = cu_range_handle(&out, (CUdeviceptr)(uintptr_t)base, len,
				     CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
	if (r != CUDA_SUCCESS) {
		MP_TRACE("verbs: cuMemGetHandleForAddressRange(%p, %zu) = CUresult %d", base, len,
			 (int)r);
		return r == CUDA_ERROR_NOT_SUPPORTED ? -EOPNOTSUPP : -EINVAL;
	}
	*fd = out;
	return 0;
}
#endif

const struct mp_verbs_ibv mp_verbs_ibv_real = {
	.get_device_list = real_get_device_list,
	.free_device_list = real_free_device_list,
	.get_device_name = real_get_device_name,
	.open_device = real_open_device,
	.close_device = real_close_device,
	.query_device = real_query_device,
	.query_port = real_query_port,
	.query_gid_ex = real_query_gid_ex,
	.alloc_pd = real_alloc_pd,
	.dealloc_pd = real_dealloc_pd,
	.create_cq = real_create_cq,
	.resize_cq = real_resize_cq,
	.destroy_cq = real_destroy_cq,
	.create_qp = real_create_qp,
	.modify_qp = real_modify_qp,
	.destroy_qp = real_destroy_qp,
	.reg_mr = real_reg_mr,
	.reg_dmabuf_mr = real_reg_dmabuf_mr,
	.dereg_mr = real_dereg_mr,
	.post_send = real_post_send,
	.post_recv = real_post_recv,
	.poll_cq = real_poll_cq,
#ifdef MP_HAVE_CUDA
	.cuda_dmabuf_fd = real_cuda_dmabuf_fd,
#endif
};

const struct mp_verbs_ibv *mp_verbs_ibv = &mp_verbs_ibv_real;
