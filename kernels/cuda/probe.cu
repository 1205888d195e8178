/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Compiled once at configure time (kernels/cuda/meson.build): proves that
 * nvcc runs, finds a host compiler it accepts, and knows the target
 * architectures, before the build relies on it.
 */
__global__ void mp_cuda_probe(float *p)
{
	p[threadIdx.x] = __fadd_rn(p[threadIdx.x], 1.0f);
}
