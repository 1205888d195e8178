/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * GPU memory for the dpdk driver (gpu.c, built with -Ddpdk_gpudev): a
 * registration of MP_MEM_CUDA memory through DPDK's gpudev library, and the
 * narrow seam under it.
 *
 * What a registration holds (doc/dpdk.md, "GPU memory"):
 *  - the gpudev device (MP_DPDK_GPU, else the first one EAL found);
 *  - a CPU mapping of the range (rte_gpu_mem_cpu_map): the receive path
 *    copies payload with the CPU, and so do sends through a virtual device,
 *    so every CPU access to the memory goes through this mapping;
 *  - for a NIC (a bus device) that takes attached send pieces: the range
 *    registered with EAL in 64 KiB GPU pages and DMA-mapped for the NIC,
 *    so the NIC reads send payload from GPU memory itself (GPUDirect).
 *
 * Why a seam: no machine that runs the tests has a GPU, and Debian's DPDK
 * ships no gpudev driver. Every call gpu.c makes into DPDK goes through
 * struct mp_dpdk_gpu_ops; a test swaps in a fake (host memory standing in
 * for the GPU) with mp_dpdk_gpu_use. The entries mirror DPDK's: NULL or a
 * negative value with rte_errno set on failure.
 */
#ifndef MP_DPDK_GPU_H
#define MP_DPDK_GPU_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct rte_device;

struct mp_dpdk_gpu_ops {
	/* rte_gpu_find_next: the first device at or after @dev_id with @parent, else -1. */
	int16_t (*find_next)(int16_t dev_id, int16_t parent);
	/* rte_gpu_is_valid */
	bool (*is_valid)(int16_t dev_id);
	/* rte_gpu_mem_cpu_map / _unmap: a CPU address for @size bytes of device memory at @ptr. */
	void *(*cpu_map)(int16_t dev_id, size_t size, void *ptr);
	int (*cpu_unmap)(int16_t dev_id, void *ptr);
	/* rte_extmem_register / _unregister (EAL's table of external memory). */
	int (*extmem_register)(void *va, size_t len, uint64_t iova[], unsigned int n_pages,
			       size_t page_sz);
	int (*extmem_unregister)(void *va, size_t len);
	/* rte_dev_dma_map / _unmap: a DMA mapping of [addr, addr + len) for @dev. */
	int (*dma_map)(struct rte_device *dev, void *addr, uint64_t iova, size_t len);
	int (*dma_unmap)(struct rte_device *dev, void *addr, uint64_t iova, size_t len);
};

/* DPDK itself. */
extern const struct mp_dpdk_gpu_ops mp_dpdk_gpu_real;

/* Use @o (NULL: mp_dpdk_gpu_real) from now on; returns the table used so far. */
const struct mp_dpdk_gpu_ops *mp_dpdk_gpu_use(const struct mp_dpdk_gpu_ops *o);

/* GPU pages, in which device memory is registered with EAL and DMA-mapped. */
#define MP_DPDK_GPU_PAGE ((size_t)64 << 10)

/* One registered range of device memory; zeroed = nothing registered. */
struct mp_dpdk_gpu_reg {
	int16_t dev;            /* gpudev device id */
	uintptr_t lo;           /* the device range [lo, lo + len) */
	size_t len;
	uint8_t *cpu;           /* its CPU mapping */
	struct rte_device *nic; /* set: registered with EAL and DMA-mapped for this NIC */
	uintptr_t ext_lo;       /* the GPU-page-rounded range registered with EAL */
	size_t ext_len;
};

/*
 * The gpudev device registrations use: MP_DPDK_GPU, else the first one.
 * -ENODEV when there is none (or MP_DPDK_GPU names none); @quiet: say
 * nothing about it (capability queries).
 */
int mp_dpdk_gpu_pick(bool quiet, int16_t *dev);

/*
 * Register device memory [buf, buf + len): CPU mapping, then, with @nic,
 * EAL registration and DMA mapping for it. 0, or a negative errno with
 * every step already done undone (@r left zeroed).
 */
int mp_dpdk_gpu_reg(struct mp_dpdk_gpu_reg *r, void *buf, size_t len, struct rte_device *nic);

/* Undo mp_dpdk_gpu_reg, in reverse order. */
void mp_dpdk_gpu_dereg(struct mp_dpdk_gpu_reg *r);

/* The CPU's address for @p, which lies in @r's device range. */
static inline void *mp_dpdk_gpu_cpu_addr(const struct mp_dpdk_gpu_reg *r, const void *p)
{
	return r->cpu + ((uintptr_t)p - r->lo);
}

#endif /* MP_DPDK_GPU_H */
