/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * A FAKE of DPDK's gpudev library and a GPU, for tests: a struct
 * mp_dpdk_gpu_ops (drivers/dpdk/gpu.h) that stands in for rte_gpu_* and the
 * EAL calls gpu.c makes (external memory, DMA mapping), since the test
 * machines have no GPU and Debian's DPDK has no gpudev driver.
 *
 * Host memory plays the GPU: the fake's "device memory" (dev_buf) and the
 * CPU mapping it hands out (map_buf) are two DIFFERENT host buffers, so a
 * test can tell which one the driver wrote or read. It records its calls in
 * order (seq: M E D to do, m e d to undo), their last arguments, and what
 * is still mapped, registered and DMA-mapped; one chosen step can fail with
 * a chosen rte_errno.
 */
#ifndef MP_FAKE_GPUDEV_H
#define MP_FAKE_GPUDEV_H

#include <stddef.h>
#include <stdint.h>

#include "drivers/dpdk/gpu.h"

/* Bytes of the fake's device memory (and of its CPU mapping). */
#define FK_DEV_LEN (128 * 1024)

/* The fake's state; tests set it up (fk_reset) and read it directly. */
struct fk_state {
	int ndev;            /* devices 0 .. ndev - 1 */
	char fail;           /* the call that fails ('M', 'E' or 'D'), 0 none */
	int err;             /* with this rte_errno */
	uint8_t *dev_buf;    /* the fake's one piece of "device memory" */
	size_t dev_len;
	uint8_t *map_buf;    /* its CPU mapping: another host buffer */
	char seq[32];        /* calls in order: M E D (do), m e d (undo) */
	int nseq;
	int map_ok, ext_ok, dma_ok; /* live: successful minus undone */
	/* arguments of the last calls */
	int16_t map_dev, unmap_dev;
	size_t map_size;
	void *map_ptr, *unmap_ptr;
	void *ext_va, *unext_va;
	size_t ext_len, unext_len, ext_pg;
	uint64_t *ext_iova;
	unsigned ext_n;
	struct rte_device *dma_dev, *undma_dev;
	void *dma_addr, *undma_addr;
	uint64_t dma_iova, undma_iova;
	size_t dma_len, undma_len;
};
extern struct fk_state fk;

/* The table to point mp_dpdk_gpu_use at. */
extern const struct mp_dpdk_gpu_ops fk_gpu_ops;

/* A fresh fake with @ndev devices and FK_DEV_LEN bytes of device memory
 * (64 KiB aligned), installed with mp_dpdk_gpu_use; MP_DPDK_GPU unset.
 * Fails through cmocka. */
void fk_reset(int ndev);

#endif
