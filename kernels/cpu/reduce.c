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

AVX2 static inline __m256 axpy8(__m256 a, __m256 x, __m256 w)
{
	__m256 p = _mm256_mul_ps(x, w);

	NOFUSE_V(p);
	return _mm256_add_ps(a, p);
}

AVX2 void mp_kcpu_axpy_avx2(float *acc, const float *x, float w, size_t n)
{
	const __m256 vw = _mm256_set1_ps(w);
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
	for (; i + 32 <= n; i += 32) {
		__m256 a0 = _mm256_load_ps(acc + i);
		__m256 a1 = _mm256_load_ps(acc + i + 8);
		__m256 a2 = _mm256_load_ps(acc + i + 16);
		__m256 a3 = _mm256_load_ps(acc + i + 24);

		a0 = axpy8(a0, _mm256_loadu_ps(x + i), vw);
		a1 = axpy8(a1, _mm256_loadu_ps(x + i + 8), vw);
		a2 = axpy8(a2, _mm256_loadu_ps(x + i + 16), vw);
		a3 = axpy8(a3, _mm256_loadu_ps(x + i + 24), vw);
		_mm256_store_ps(acc + i, a0);
		_mm256_store_ps(acc + i + 8, a1);
		_mm256_store_ps(acc + i + 16, a2);
		_mm256_store_ps(acc + i + 24, a3);
	}
	for (; i + 8 <= n; i += 8)
		_mm256_store_ps(acc + i, axpy8(_mm256_load_ps(acc + i), _mm256_loadu_ps(x + i), vw));
	for (; i < n; i++) {
		float p = w * x[i];

		NOFUSE(p);
		acc[i] = acc[i] + p;
	}
}

AVX2 void mp_kcpu_scale_avx2(float *dst, const float *x, float w, size_t n)
{
	const __m256 vw = _mm256_set1_ps(w);
	size_t i = 0;

	for (; i + 32 <= n; i += 32) {
		__m256 v0 = _mm256_mul_ps(_mm256_loadu_ps(x + i), vw);
		__m256 v1 = _mm256_mul_ps(_mm256_loadu_ps(x + i + 8), vw);
		__m256 v2 = _mm256_mul_ps(_mm256_loadu_ps(x + i + 16), vw);
		__m256 v3 = _mm256_mul_ps(_mm256_loadu_ps(x + i + 24), vw);

		_mm256_storeu_ps(dst + i, v0);
		_mm256_storeu_ps(dst + i + 8, v1);
		_mm256_storeu_ps(dst + i + 16, v2);
		_mm256_storeu_ps(dst + i + 24, v3);
	}
	for (; i + 8 <= n; i += 8)
		_mm256_storeu_ps(dst + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), vw));
	for (; i < n; i++)
		dst[i] = w * x[i];
}

/* ---- AVX-512F: masked loads and stores do the ragged ends ---- */

#define AVX512 __attribute__((target("avx512f")))

AVX512 static inline __m512 axpy16(__m512 a, __m512 x, __m512 w)
{
	__m512 p = _mm512_mul_ps(x, w);

	NOFUSE_V(p);
	return _mm512_add_ps(a, p);
}

AVX512 static inline __mmask16 tail_mask(size_t k)
{
	return (__mmask16)((1u << k) - 1u);
}

AVX512 void mp_kcpu_axpy_avx512(float *acc, const float *x, float w, size_t n)
{
	const __m512 vw = _mm512_set1_ps(w);
	size_t i = 0;

	/* One masked step brings acc to a 64-byte boundary (if it is float aligned). */
	if (!((uintptr_t)acc & 3) && ((uintptr_t)acc & 63)) {
		size_t k = (64 - ((uintptr_t)acc & 63)) / 4;

		if (k > n)
			k = n;
		__mmask16 m = tail_mask(k);
		__m512 a = _mm512_maskz_loadu_ps(m, acc);

		a = axpy16(a, _mm512_maskz_loadu_ps(m, x), vw);
		_mm512_mask_storeu_ps(acc, m, a);
		i = k;
	}
	for (; i + 64 <= n; i += 64) {
		__m512 a0 = _mm512_loadu_ps(acc + i);
		__m512 a1 = _mm512_loadu_ps(acc + i + 16);
		__m512 a2 = _mm512_loadu_ps(acc + i + 32);
		__m512 a3 = _mm512_loadu_ps(acc + i + 48);

		a0 = axpy16(a0, _mm512_loadu_ps(x + i), vw);
		a1 = axpy16(a1, _mm512_loadu_ps(x + i + 16), vw);
		a2 = axpy16(a2, _mm512_loadu_ps(x + i + 32), vw);
		a3 = axpy16(a3, _mm512_loadu_ps(x + i + 48), vw);
		_mm512_storeu_ps(acc + i, a0);
		_mm512_storeu_ps(acc + i + 16, a1);
		_mm512_storeu_ps(acc + i + 32, a2);
		_mm512_storeu_ps(acc + i + 48, a3);
	}
	for (; i + 16 <= n; i += 16)
		_mm512_storeu_ps(acc + i, axpy16(_mm512_loadu_ps(acc + i), _mm512_loadu_ps(x + i), vw));
	if (i < n) {
		__mmask16 m = tail_mask(n - i);
		__m512 a = _mm512_maskz_loadu_ps(m, acc + i);

		a = axpy16(a, _mm512_maskz_loadu_ps(m, x + i), vw);
		_mm512_mask_storeu_ps(acc + i, m, a);
	}
}

AVX512 void mp_kcpu_scale_avx512(float *dst, const float *x, float w, size_t n)
{
	const __m512 vw = _mm512_set1_ps(w);
	size_t i = 0;

	for (; i + 64 <= n; i += 64) {
		__m512 v0 = _mm512_mul_ps(_mm512_loadu_ps(x + i), vw);
		__m512 v1 = _mm512_mul_ps(_mm512_loadu_ps(x + i + 16), vw);
		__m512 v2 = _mm512_mul_ps(_mm512_loadu_ps(x + i + 32), vw);
		__m512 v3 = _mm512_mul_ps(_mm512_loadu_ps(x + i + 48), vw);

		_mm512_storeu_ps(dst + i, v0);
		_mm512_storeu_ps(dst + i + 16, v1);
		_mm512_storeu_ps(dst + i + 32, v2);
		_mm512_storeu_ps(dst + i + 48, v3);
	}
	for (; i + 16 <= n; i += 16)
		_mm512_storeu_ps(dst + i, _mm512_mul_ps(_mm512_loadu_ps(x + i), vw));
	if (i < n) {
		__mmask16 m = tail_mask(n - i);

		_mm512_mask_storeu_ps(dst + i, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), vw));
	}
}

#endif /* MP_K_X86 */
