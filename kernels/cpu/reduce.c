/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * fp32 reduction kernels: acc += w * x and dst = w * x.
 *
 * Every variant computes each element as round(round(w * x[i]) + acc[i]):
 * the product is rounded before the add, never fused into an FMA. That makes
 * the scalar, AVX2 and AVX-512 results bit-identical, so a run gives the same
 * averages whichever CPU each peer has (and MP_KERNELS cannot change them).
 * The price is nothing measurable: these loops are bound by memory bandwidth,
 * not by the one extra rounding step.
 *
 * GCC contracts a * b + c into an FMA whenever the target has one (AVX-512F
 * implies FMA, and so does -march=native for the scalar code) unless
 * -ffp-contract=off is in force, which the build may not set. An empty asm
 * that claims to modify the product hides it from the optimiser, so it
 * cannot be fused; it costs no instruction.
 *
 * Pointers need only natural float alignment; any n is fine. acc and x may be
 * the same array but must not otherwise overlap (dst and x likewise).
 */
#include <stddef.h>
#include <stdint.h>

#include "kernels_cpu.h"
#include "kloop.h"

void mp_kcpu_axpy_scalar(float *acc, const float *x, float w, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		float p = w * x[i];

		NOFUSE_SCALAR(p);
		acc[i] = acc[i] + p;
	}
}

void mp_kcpu_scale_scalar(float *dst, const float *x, float w, size_t n)
{
	for (size_t i = 0; i < n; i++)
		dst[i] = w * x[i];
}

#ifdef MP_K_X86

/* ---- AVX2 (no FMA in the target on purpose, see the top comment) ---- */

#define AVX2 __attribute__((target("avx2")))

AVX2 static inline __m256 f32_step8(const struct kl8 *c, const void *p, __m256i m, int full)
{
	(void)c;
	(void)m;
	(void)full;
	return _mm256_loadu_ps(p);
}

AVX2 static inline __m256 f32_scaled8(const struct kl8 *c, const void *p, __m256i m, int full)
{
	return _mm256_mul_ps(f32_step8(c, p, m, full), c->s);
}

AVX2 void mp_kcpu_axpy_avx2(float *acc, const float *x, float w, size_t n)
{
	const struct kl8 c = {.w = _mm256_set1_ps(w)};
	size_t i = 0;

	/*
	 * Align the stores: an unaligned 32-byte store splits a cache line every
	 * other time, which costs more than the loads do.
	 */
	while (i < n && ((uintptr_t)(acc + i) & 31)) {
		float p = w * x[i];

		NOFUSE(p);
		acc[i] = acc[i] + p;
		i++;
	}
	/* Said, so that GCC's generic tuning does not split the accesses to acc in two. */
	kl_widen8(__builtin_assume_aligned(acc + i, 32), x + i, sizeof(*x), n - i, 4, f32_step8, &c,
		  KL_AXPY);
}

AVX2 void mp_kcpu_scale_avx2(float *dst, const float *x, float w, size_t n)
{
	const struct kl8 c = {.s = _mm256_set1_ps(w)};

	kl_widen8(dst, x, sizeof(*x), n, 4, f32_scaled8, &c, KL_STORE);
}

/* ---- AVX-512F: masked loads and stores do the ragged ends ---- */

#define AVX512 __attribute__((target("avx512f")))

AVX512 static inline __m512 f32_step16(const struct kl16 *c, const void *p, __mmask16 m, int full)
{
	(void)c;
	return full ? _mm512_loadu_ps(p) : _mm512_maskz_loadu_ps(m, p);
}

AVX512 static inline __m512 f32_scaled16(const struct kl16 *c, const void *p, __mmask16 m, int full)
{
	return _mm512_mul_ps(f32_step16(c, p, m, full), c->s);
}

AVX512 void mp_kcpu_axpy_avx512(float *acc, const float *x, float w, size_t n)
{
	const struct kl16 c = {.w = _mm512_set1_ps(w)};
	size_t i = 0;

	/* One masked step brings acc to a 64-byte boundary (if it is float aligned). */
	if (!((uintptr_t)acc & 3) && ((uintptr_t)acc & 63)) {
		size_t k = (64 - ((uintptr_t)acc & 63)) / 4;

		if (k > n)
			k = n;
		__mmask16 m = tail16(k);
		__m512 a = _mm512_maskz_loadu_ps(m, acc);

		a = axpy16(a, _mm512_maskz_loadu_ps(m, x), c.w);
		_mm512_mask_storeu_ps(acc, m, a);
		i = k;
	}
	kl_widen16(acc + i, x + i, sizeof(*x), n - i, 4, f32_step16, &c, KL_AXPY);
}

AVX512 void mp_kcpu_scale_avx512(float *dst, const float *x, float w, size_t n)
{
	const struct kl16 c = {.s = _mm512_set1_ps(w)};

	kl_widen16(dst, x, sizeof(*x), n, 4, f32_scaled16, &c, KL_STORE);
}

#endif /* MP_K_X86 */
