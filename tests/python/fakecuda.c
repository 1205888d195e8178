/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * libmoshpit_fakecuda.so: libmoshpit whole, with the FAKE CUDA driver and
 * codec kernels of tests/fakes/fake_cuda.c installed behind its seams when
 * it is loaded (no GPU is needed or touched), for the Python package's
 * test of CUDA memory (test_cuda_fake.py, meson test python_cuda_fake).
 * The fkpy_* functions give Python the application's side of the fake:
 * device buffers, the test's own look at them, streams and kernels.
 */
#include <stddef.h>
#include <stdint.h>

#include "fake_cuda.h"

#define FKPY_API __attribute__((visibility("default")))

__attribute__((constructor)) static void fkpy_install(void)
{
	mp_stage_dev_ops = &fk_ops;
	mp_devk_ops = &fk_devk_ops;
}

/* Peer @rank's device buffer of @len bytes (one per rank): its address. */
FKPY_API uintptr_t fkpy_mem_init(int rank, size_t len)
{
	fk_mem_init(rank, len);
	return (uintptr_t)fk.mem[rank].base;
}

FKPY_API void fkpy_mem_fini(int rank)
{
	fk_mem_fini(rank);
}

FKPY_API void fkpy_write(int rank, const void *src, size_t len)
{
	fk_write(rank, 0, src, len);
}

FKPY_API void fkpy_read(int rank, void *dst, size_t len)
{
	fk_read(rank, 0, dst, len);
}

/* Device allocations at the peak, and pinned host bytes at the peak, since
 * the last fkpy_reset. */
FKPY_API int fkpy_dev_peak(void)
{
	return fk.dev_peak;
}

FKPY_API size_t fkpy_host_peak(void)
{
	return fk.host_peak;
}

FKPY_API void fkpy_reset(void)
{
	fk_reset();
}

FKPY_API void *fkpy_stream_new(int rank)
{
	return fk_stream_new(rank);
}

FKPY_API int fkpy_stream_sync_free(void *s, int timeout_ms)
{
	int rc = fk_stream_sync(s, timeout_ms);

	if (!rc)
		fk_stream_free(s);
	return rc;
}

/* A kernel on @s that writes @len bytes of @src over @rank's buffer
 * @delay_ms from now (or when the stream gets there). */
FKPY_API void fkpy_kernel_write(void *s, int rank, const void *src, size_t len, int delay_ms)
{
	fk_kernel_write(s, rank, 0, src, len, delay_ms);
}
