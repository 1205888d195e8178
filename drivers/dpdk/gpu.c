/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * GPU memory for the dpdk driver through DPDK's gpudev library (gpu.h;
 * doc/dpdk.md, "GPU memory"). Built with -Ddpdk_gpudev.
 */
/* The gpudev API, rte_extmem_* and rte_dev_dma_map are experimental in 22.11. */
#define ALLOW_EXPERIMENTAL_API 1
#include <errno.h>
#include <stdlib.h>

#include <rte_dev.h>
#include <rte_errno.h>
#include <rte_gpudev.h>
#include <rte_memory.h>
#include <moshpit/sdk/log.h>

#include "gpu.h"

const struct mp_dpdk_gpu_ops mp_dpdk_gpu_real = {
	.find_next = rte_gpu_find_next,
	.is_valid = rte_gpu_is_valid,
	.cpu_map = rte_gpu_mem_cpu_map,
	.cpu_unmap = rte_gpu_mem_cpu_unmap,
	.extmem_register = rte_extmem_register,
	.extmem_unregister = rte_extmem_unregister,
	.dma_map = rte_dev_dma_map,
	.dma_unmap = rte_dev_dma_unmap,
};

/* Set by tests before any registration; registrations keep no copy of it. */
static const struct mp_dpdk_gpu_ops *ops = &mp_dpdk_gpu_real;

const struct mp_dpdk_gpu_ops *mp_dpdk_gpu_use(const struct mp_dpdk_gpu_ops *o)
{
	const struct mp_dpdk_gpu_ops *old = ops;

	ops = o ? o : &mp_dpdk_gpu_real;
	return old;
}

/* The negative errno of a DPDK call that just failed. */
static int dpdk_err(void)
{
	return rte_errno > 0 ? -rte_errno : -EIO;
}

int mp_dpdk_gpu_pick(bool quiet, int16_t *dev)
{
	const char *s = getenv("MP_DPDK_GPU");
	int16_t id;

	if (s && *s) {
		char *end;
		long v = strtol(s, &end, 10);

		if (*end || v < 0 || v > INT16_MAX || !ops->is_valid((int16_t)v)) {
			if (!quiet)
				MP_WARN("dpdk: MP_DPDK_GPU=%s names no gpudev device in EAL; CUDA "
					"memory is staged through host memory instead", s);
			return -ENODEV;
		}
		*dev = (int16_t)v;
		return 0;
	}
	id = ops->find_next(0, RTE_GPU_ID_ANY);
	if (id < 0) {
		if (!quiet)
			MP_WARN("dpdk: no gpudev device in EAL (DPDK built with a GPU driver, such as "
				"gpu_cuda, and the GPU allowed in MP_DPDK_EAL); CUDA memory is staged "
				"through host memory instead");
		return -ENODEV;
	}
	*dev = id;
	return 0;
}

int mp_dpdk_gpu_reg(struct mp_dpdk_gpu_reg *r, void *buf, size_t len, struct rte_device *nic)
{
	struct mp_dpdk_gpu_reg x = {.lo = (uintptr_t)buf, .len = len};
	int rc;

	if (!r || !buf || !len)
		return -EINVAL;
	rc = mp_dpdk_gpu_pick(false, &x.dev);
	if (rc)
		return rc;
	/*
	 * The CPU reaches device memory only through this mapping: rel copies
	 * received payload into the posted buffer, and frames of a virtual
	 * device are built by the CPU.
	 */
	x.cpu = ops->cpu_map(x.dev, len, buf);
	if (!x.cpu) {
		rc = dpdk_err();
		MP_WARN("dpdk: GPU memory %p (%zu bytes) on gpudev device %d: no CPU mapping (%s); "
			"gpudev maps only memory from rte_gpu_mem_alloc", buf, len, x.dev,
			rte_strerror(-rc));
		return rc;
	}
	if (nic) {
		/*
		 * The NIC reads attached send pieces by DMA straight from GPU
		 * memory: EAL must know the pages (whole GPU pages) and the NIC
		 * must have them mapped, as for host memory in dpdk_reg_mr.
		 */
		x.ext_lo = x.lo & ~(uintptr_t)(MP_DPDK_GPU_PAGE - 1);
		x.ext_len = ((x.lo + len + MP_DPDK_GPU_PAGE - 1) & ~(uintptr_t)(MP_DPDK_GPU_PAGE - 1)) -
			    x.ext_lo;
		if (ops->extmem_register((void *)x.ext_lo, x.ext_len, NULL, 0, MP_DPDK_GPU_PAGE)) {
			rc = dpdk_err();
			MP_WARN("dpdk: GPU memory %p: registering %zu bytes with EAL: %s", buf,
				x.ext_len, rte_strerror(-rc));
			goto unmap;
		}
		if (ops->dma_map(nic, (void *)x.ext_lo, x.ext_lo, x.ext_len)) {
			rc = dpdk_err();
			MP_WARN("dpdk: GPU memory %p: DMA mapping of %zu bytes for the NIC: %s", buf,
				x.ext_len, rte_strerror(-rc));
			goto unregister;
		}
		x.nic = nic;
	}
	*r = x;
	MP_INFO("dpdk: GPU memory %p (%zu bytes) registered on gpudev device %d, %s", buf, len,
		x.dev, nic ? "DMA-mapped for the NIC" : "sent and received through its CPU mapping");
	return 0;
unregister:
	ops->extmem_unregister((void *)x.ext_lo, x.ext_len);
unmap:
	ops->cpu_unmap(x.dev, buf);
	return rc;
}

void mp_dpdk_gpu_dereg(struct mp_dpdk_gpu_reg *r)
{
	if (!r || !r->cpu)
		return;
	if (r->nic) {
		if (ops->dma_unmap(r->nic, (void *)r->ext_lo, r->ext_lo, r->ext_len))
			MP_WARN("dpdk: GPU memory %p: DMA unmapping: %s", (void *)r->lo,
				rte_strerror(rte_errno));
		if (ops->extmem_unregister((void *)r->ext_lo, r->ext_len))
			MP_WARN("dpdk: GPU memory %p: EAL unregistration: %s", (void *)r->lo,
				rte_strerror(rte_errno));
	}
	if (ops->cpu_unmap(r->dev, (void *)r->lo))
		MP_WARN("dpdk: GPU memory %p: CPU unmapping: %s", (void *)r->lo, rte_strerror(rte_errno));
	*r = (struct mp_dpdk_gpu_reg){0};
}
