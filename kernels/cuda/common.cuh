/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Private to kernels/cuda: launch shapes, alignment-agnostic payload access,
 * the no-FMA arithmetic the formats fix, deterministic block reductions and
 * scans, and the entry points one .cu file offers the other.
 *
 * Numerics. Every rounding step the spec fixes is written with an explicit
 * round-to-nearest intrinsic (__fmul_rn, __fadd_rn, __dadd_rn, ...): those
 * are never contracted into an FMA, whatever -fmad says (the build passes
 * --fmad=false as well, so that nothing else is fused behind our back).
 *
 * Determinism. Sums whose order the spec does not fix on the GPU (uniform8
 * statistics, the AdaComp scale) are taken over fixed tiles of MPC_TILE
 * elements, each thread in element order, then a fixed shuffle tree, then
 * the tiles in index order: the launch shape depends only on the element
 * count, so a payload never depends on the device it was made on or on
 * timing. Integer counts may use atomics (exact in any order).
 */
#ifndef MP_CUDA_COMMON_CUH
#define MP_CUDA_COMMON_CUH

#ifndef __CUDACC__
#error "common.cuh is for the .cu files of kernels/cuda (nvcc)"
#endif

#include <cuda_runtime.h>
#include <errno.h>
#include <stddef.h>
#include <stdint.h>

#include "mp_codec_params.h"
#include "mp_cuda_codecs.h"

#define MPC_TPB 256 /* threads per block of every per-element kernel */
/*
 * Grid-stride kernels' blocks per SM (mpc_gs_grid). 4 from a sweep on an
 * H200 (2, 4, 6, 8, 12, 16, 32; 64M values, doc/performance.md): the best
 * or near it for every dense decode_acc (fp16 77% of the copy's time
 * against 62% at 8) and no encoder slower. A -D overrides it for a sweep.
 */
#ifndef MPC_BLOCKS_PER_SM
#define MPC_BLOCKS_PER_SM 4
#endif
#define MPC_PER 16  /* elements (or payload bytes) one thread of a tile kernel owns */
#define MPC_TILE (MPC_TPB * MPC_PER)
#define MPC_SCAN_TPB 1024 /* the single-block scans and reductions */
#define MPC_FULL 0xffffffffu

/* Wire ids (enum mp_codec; stable by the spec). */
#define MPC_NONE 0
#define MPC_FP16 1
#define MPC_BF16 2
#define MPC_UNIFORM8 3
#define MPC_BLOCKWISE8 4
#define MPC_TOPK 5
#define MPC_ADACOMP 6

/* Status word bits (device): MP_CUDA_BAD for payloads, and for encoders: */
#define MPC_NOSPC 2u

/* Sub-buffers of a scratch area start at multiples of this (from its base). */
#define MPC_SALIGN 256
/* What a caller's scratch area must be aligned to: the widest element in it. */
#define MPC_SCRATCH_ALIGN 16

/* The entry points shared between the .cu files stay out of a shared library's symbol table. */
#define MPC_HIDDEN __attribute__((visibility("hidden")))

static inline size_t mpc_round_up(size_t v)
{
	return (v + MPC_SALIGN - 1) & ~(size_t)(MPC_SALIGN - 1);
}

static __host__ __device__ inline size_t mpc_div_up(size_t a, size_t b)
{
	return a / b + (a % b != 0);
}

/* Carves consecutive sub-buffers from a scratch area. */
struct mpc_carve {
	unsigned char *base;
	size_t used;
};

static inline void *mpc_take(struct mpc_carve *c, size_t bytes)
{
	void *p = c->base ? c->base + c->used : NULL;

	c->used += mpc_round_up(bytes);
	return p;
}

static inline int mpc_aligned(const void *p, size_t a)
{
	return ((uintptr_t)p & (a - 1)) == 0;
}

/* CUDA runtime status -> negative errno (0 for success). */
MPC_HIDDEN int mpc_err(cudaError_t e);
/* Blocks for a grid-stride loop over @units items: enough to fill the device, no more. */
MPC_HIDDEN unsigned mpc_gs_grid(size_t units);
/* cudaMallocAsync where the device has memory pools, else cudaMalloc. */
MPC_HIDDEN int mpc_tmp_alloc(void **p, size_t bytes, cudaStream_t s, int *pooled);
MPC_HIDDEN void mpc_tmp_free(void *p, cudaStream_t s, int pooled);

/* ---- the sparse codecs (sparse.cu), called by the dispatcher in codecs.cu ---- */

MPC_HIDDEN size_t mpc_topk_scratch(const struct mp_codec_params *p, size_t count);
MPC_HIDDEN size_t mpc_ada_scratch(const struct mp_codec_params *p, size_t count);
MPC_HIDDEN size_t mpc_topk_max(const struct mp_codec_params *p, size_t count);
MPC_HIDDEN size_t mpc_ada_max(size_t count);
MPC_HIDDEN int mpc_topk_encode(const struct mp_codec_params *p, const float *src, float *res, size_t n,
		    uint8_t *dst, size_t cap, size_t *len, void *scratch, size_t sbytes,
		    cudaStream_t s);
MPC_HIDDEN int mpc_ada_encode(const struct mp_codec_params *p, const float *src, float *res, size_t n,
		   uint8_t *dst, size_t cap, size_t *len, void *scratch, size_t sbytes,
		   cudaStream_t s);
MPC_HIDDEN size_t mpc_sparse_dec_scratch(size_t len);
/* Queues validation and the write; the verdict lands in *status (device). */
MPC_HIDDEN int mpc_sparse_decode(int codec, const uint8_t *pl, size_t len, float *out, size_t n, float w,
		      int acc, uint32_t *status, void *scratch, cudaStream_t s);

/* ---- payload access at any alignment (little-endian device, as the host) ---- */

static __device__ __forceinline__ uint32_t ld_u32(const uint8_t *p)
{
	if (((uintptr_t)p & 3) == 0)
		return __ldg((const uint32_t *)p);
	return (uint32_t)__ldg(p) | (uint32_t)__ldg(p + 1) << 8 | (uint32_t)__ldg(p + 2) << 16 |
	       (uint32_t)__ldg(p + 3) << 24;
}

static __device__ __forceinline__ float ld_f32(const uint8_t *p)
{
	return __uint_as_float(ld_u32(p));
}

static __device__ __forceinline__ void st_u32(uint8_t *p, uint32_t v)
{
	if (((uintptr_t)p & 3) == 0) {
		*(uint32_t *)p = v;
		return;
	}
	p[0] = (uint8_t)v;
	p[1] = (uint8_t)(v >> 8);
	p[2] = (uint8_t)(v >> 16);
	p[3] = (uint8_t)(v >> 24);
}

static __device__ __forceinline__ uint16_t ld_u16(const uint8_t *p)
{
	return (uint16_t)(__ldg(p) | __ldg(p + 1) << 8);
}

static __device__ __forceinline__ void st_u16(uint8_t *p, uint16_t v)
{
	p[0] = (uint8_t)v;
	p[1] = (uint8_t)(v >> 8);
}

/* ---- arithmetic the formats fix ---- */

static __device__ __forceinline__ int finite32(float v)
{
	return (__float_as_uint(v) & 0x7fffffffu) < 0x7f800000u;
}

/* Non-finite -> +0 (the sparse codecs drop NaN and inf). */
static __device__ __forceinline__ float san(float v)
{
	return finite32(v) ? v : 0.0f;
}

/* acc + w * x, the product rounded before the add (reduce.c's rule). */
static __device__ __forceinline__ float axpy1(float acc, float w, float x)
{
	return __fadd_rn(acc, __fmul_rn(w, x));
}

static __device__ __forceinline__ size_t min_sz(size_t a, size_t b)
{
	return a < b ? a : b;
}

/*
 * Loads elements i..i+3 of @a (0 past @n): one 16-byte load when @vec (a
 * 16-byte aligned and i % 4 == 0) and all four exist.
 */
static __device__ __forceinline__ float4 ld4(const float *a, size_t i, size_t n, bool vec)
{
	if (vec && i + 4 <= n)
		return __ldg((const float4 *)(a + i));
	float4 r;

	r.x = i < n ? a[i] : 0.0f;
	r.y = i + 1 < n ? a[i + 1] : 0.0f;
	r.z = i + 2 < n ? a[i + 2] : 0.0f;
	r.w = i + 3 < n ? a[i + 3] : 0.0f;
	return r;
}

static __device__ __forceinline__ void st4(float *a, size_t i, size_t n, bool vec, float4 v)
{
	if (vec && i + 4 <= n) {
		*(float4 *)(a + i) = v;
		return;
	}
	if (i < n)
		a[i] = v.x;
	if (i + 1 < n)
		a[i + 1] = v.y;
	if (i + 2 < n)
		a[i + 2] = v.z;
	if (i + 3 < n)
		a[i + 3] = v.w;
}

static __device__ __forceinline__ float f4get(const float4 &v, int k)
{
	return k == 0 ? v.x : k == 1 ? v.y : k == 2 ? v.z : v.w;
}

static __device__ __forceinline__ void f4set(float4 &v, int k, float x)
{
	if (k == 0)
		v.x = x;
	else if (k == 1)
		v.y = x;
	else if (k == 2)
		v.z = x;
	else
		v.w = x;
}

/*
 * Whether a guarded kernel must write nothing: *status set. Block-uniform
 * (all threads must call it), so that a kernel may use barriers after it
 * even if the word changes while its blocks start.
 */
static __device__ __forceinline__ bool block_stopped(const uint32_t *status)
{
	return __syncthreads_or(status && *(volatile const uint32_t *)status);
}

/* ---- block-wide reductions and scans (blockDim.x a multiple of 32, <= 1024) ---- */

static __device__ __forceinline__ unsigned lane_id(void)
{
	return threadIdx.x & 31u;
}

template <typename T> static __device__ __forceinline__ T warp_incl_scan(T v)
{
	for (unsigned o = 1; o < 32; o <<= 1) {
		T u = __shfl_up_sync(MPC_FULL, v, o);

		if (lane_id() >= o)
			v += u;
	}
	return v;
}

/*
 * Exclusive prefix of @v over the threads of the block in thread order;
 * *total gets the block's sum. All threads must call it.
 */
template <typename T> static __device__ T block_excl_scan(T v, T *total)
{
	__shared__ T ws[32];
	const unsigned w = threadIdx.x >> 5, nw = blockDim.x >> 5;
	T inc = warp_incl_scan(v);

	if (lane_id() == 31)
		ws[w] = inc;
	__syncthreads();
	if (w == 0) {
		T t = lane_id() < nw ? ws[lane_id()] : (T)0;

		t = warp_incl_scan(t);
		ws[lane_id()] = t;
	}
	__syncthreads();
	T before = w ? ws[w - 1] : (T)0;

	*total = ws[nw - 1];
	__syncthreads(); /* ws is reused by the next call */
	return before + inc - v;
}

template <typename T> static __device__ __forceinline__ T block_sum(T v)
{
	T total;

	(void)block_excl_scan(v, &total);
	return total;
}

static __device__ __forceinline__ uint32_t block_max_u32(uint32_t v)
{
	__shared__ uint32_t ws[32];
	const unsigned w = threadIdx.x >> 5, nw = blockDim.x >> 5;

	for (unsigned o = 16; o; o >>= 1)
		v = max(v, __shfl_xor_sync(MPC_FULL, v, o));
	if (lane_id() == 0)
		ws[w] = v;
	__syncthreads();
	uint32_t r = ws[0];

	for (unsigned k = 1; k < nw; k++)
		r = max(r, ws[k]);
	__syncthreads();
	return r;
}

/*
 * Sum of doubles in a fixed order: a shuffle tree inside each warp, then
 * the warps in order. Every thread gets the result.
 */
static __device__ double block_sum_fixed(double v)
{
	__shared__ double ws[32];
	const unsigned w = threadIdx.x >> 5, nw = blockDim.x >> 5;

	for (unsigned o = 16; o; o >>= 1)
		v = __dadd_rn(v, __shfl_down_sync(MPC_FULL, v, o));
	if (lane_id() == 0)
		ws[w] = v;
	__syncthreads();
	double r = ws[0];

	for (unsigned k = 1; k < nw; k++)
		r = __dadd_rn(r, ws[k]);
	__syncthreads();
	return r;
}

/*
 * Exclusive scan of a[0..n) in place by one block of MPC_SCAN_TPB threads;
 * *total (if not NULL) gets the sum. Each thread takes four entries per
 * round so that large tile counts need few rounds.
 */
template <typename T> static __global__ void k_scan_excl(T *a, size_t n, T *total)
{
	T carry = 0;

	for (size_t base = 0; base < n; base += 4 * (size_t)blockDim.x) {
		size_t i = base + 4 * (size_t)threadIdx.x;
		T v[4], s = 0;

		for (int k = 0; k < 4; k++) {
			v[k] = i + k < n ? a[i + k] : (T)0;
			s += v[k];
		}
		T tot, ex = block_excl_scan(s, &tot);

		for (int k = 0; k < 4; k++) {
			if (i + k < n)
				a[i + k] = carry + ex;
			ex += v[k];
		}
		carry += tot;
	}
	if (total && threadIdx.x == 0)
		*total = carry;
}

/*
 * Max over groups of GS consecutive threads (GS a power of two <= MPC_TPB);
 * every thread of a group gets its group's value. All threads must call it,
 * at most once per kernel (GS > 32 uses shared memory).
 */
template <int GS> static __device__ __forceinline__ uint32_t group_max(uint32_t m)
{
	if constexpr (GS <= 32) {
		for (int o = GS / 2; o > 0; o >>= 1)
			m = max(m, __shfl_xor_sync(MPC_FULL, m, o));
		return m;
	} else {
		__shared__ uint32_t ws[MPC_TPB / 32];

		for (int o = 16; o > 0; o >>= 1)
			m = max(m, __shfl_xor_sync(MPC_FULL, m, o));
		if (lane_id() == 0)
			ws[threadIdx.x >> 5] = m;
		__syncthreads();
		const int first = (int)(threadIdx.x / GS) * (GS / 32);

		m = ws[first];
		for (int k = 1; k < GS / 32; k++)
			m = max(m, ws[first + k]);
		return m;
	}
}

/*
 * Threads per segment for the one-pass segment kernels: the smallest power
 * of two that covers @seg elements at MPC_PER per thread (seg <= MPC_TILE).
 */
static inline int mpc_group_size(size_t seg)
{
	int g = 1;

	while ((size_t)g * MPC_PER < seg)
		g <<= 1;
	return g;
}

#endif
