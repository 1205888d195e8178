/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * A FAKE of DPDK's gpudev and a GPU, for the dpdk driver's GPU-memory tests:
 * see fake_gpudev.h for what it plays and how faithfully.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include <rte_errno.h>

#include "fake_gpudev.h"

struct fk_state fk;

static void note(char c)
{
	if (fk.nseq < (int)sizeof(fk.seq) - 1)
		fk.seq[fk.nseq++] = c;
}

/* Step @c happens: noted, and failed (rte_errno set) when the test says so. */
static int step(char c)
{
	note(c);
	if (fk.fail != c)
		return 0;
	rte_errno = fk.err;
	return -1;
}

static int16_t fake_find_next(int16_t dev_id, int16_t parent)
{
	(void)parent;
	if (dev_id < 0)
		dev_id = 0;
	return dev_id < fk.ndev ? dev_id : -1;
}

static bool fake_is_valid(int16_t dev_id)
{
	return dev_id >= 0 && dev_id < fk.ndev;
}

static void *fake_cpu_map(int16_t dev_id, size_t size, void *ptr)
{
	note('M');
	fk.map_dev = dev_id;
	fk.map_size = size;
	fk.map_ptr = ptr;
	if (fk.fail == 'M' || dev_id >= fk.ndev || (uint8_t *)ptr < fk.dev_buf ||
	    (uint8_t *)ptr + size > fk.dev_buf + fk.dev_len) {
		rte_errno = fk.fail == 'M' ? fk.err : EPERM;
		return NULL;
	}
	fk.map_ok++;
	return fk.map_buf + ((uint8_t *)ptr - fk.dev_buf);
}

static int fake_cpu_unmap(int16_t dev_id, void *ptr)
{
	note('m');
	fk.unmap_dev = dev_id;
	fk.unmap_ptr = ptr;
	fk.map_ok--;
	return 0;
}

static int fake_extmem_register(void *va, size_t len, uint64_t iova[], unsigned int n,
				size_t pg)
{
	fk.ext_va = va;
	fk.ext_len = len;
	fk.ext_iova = iova;
	fk.ext_n = n;
	fk.ext_pg = pg;
	if (step('E'))
		return -1;
	fk.ext_ok++;
	return 0;
}

static int fake_extmem_unregister(void *va, size_t len)
{
	note('e');
	fk.unext_va = va;
	fk.unext_len = len;
	fk.ext_ok--;
	return 0;
}

static int fake_dma_map(struct rte_device *dev, void *addr, uint64_t iova, size_t len)
{
	fk.dma_dev = dev;
	fk.dma_addr = addr;
	fk.dma_iova = iova;
	fk.dma_len = len;
	if (step('D'))
		return -1;
	fk.dma_ok++;
	return 0;
}

static int fake_dma_unmap(struct rte_device *dev, void *addr, uint64_t iova, size_t len)
{
	note('d');
	fk.undma_dev = dev;
	fk.undma_addr = addr;
	fk.undma_iova = iova;
	fk.undma_len = len;
	fk.dma_ok--;
	return 0;
}

const struct mp_dpdk_gpu_ops fk_gpu_ops = {
	.find_next = fake_find_next,
	.is_valid = fake_is_valid,
	.cpu_map = fake_cpu_map,
	.cpu_unmap = fake_cpu_unmap,
	.extmem_register = fake_extmem_register,
	.extmem_unregister = fake_extmem_unregister,
	.dma_map = fake_dma_map,
	.dma_unmap = fake_dma_unmap,
};

void fk_reset(int ndev)
{
	free(fk.dev_buf);
	free(fk.map_buf);
	memset(&fk, 0, sizeof(fk));
	fk.ndev = ndev;
	fk.dev_len = FK_DEV_LEN;
	fk.dev_buf = aligned_alloc(MP_DPDK_GPU_PAGE, FK_DEV_LEN);
	fk.map_buf = malloc(FK_DEV_LEN);
	assert_non_null(fk.dev_buf);
	assert_non_null(fk.map_buf);
	mp_dpdk_gpu_use(&fk_gpu_ops);
	unsetenv("MP_DPDK_GPU");
}
