/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * fp32 <-> IEEE half precision conversion, and the fused fp16 accumulate the
 * reducer runs on fp16 payloads.
 *
 * Semantics (all variants, bit for bit):
 *  - fp32 -> fp16 rounds to nearest, ties to even, and handles fp16
 *    subnormals exactly. fp32 subnormals are far below fp16's smallest
 *    subnormal and become signed zeros.
 *  - Finite values beyond the fp16 range, and +-inf, clamp to +-65504: a
 *    gradient that overflows fp16 should saturate, not turn the average into
 *    inf (which would then poison every peer it is mixed with).
 *  - NaN stays NaN: sign kept, quiet bit set, top 10 payload bits kept. That
 *    is what F16C's VCVTPS2PH produces, so the scalar code copies it.
 *  - fp16 -> fp32 is exact; a signalling NaN comes back quiet (VCVTPH2PS
 *    does the same).
 *
 * The vector versions clamp with min/max before converting. MINPS/MAXPS
 * return their second operand when either is NaN, so the constant goes first
 * and a NaN input falls through untouched. The rounding immediate is explicit
 * (_MM_FROUND_TO_NEAREST_INT) so MXCSR's rounding mode does not matter.
 *
 * Ragged ends of the vector loops go through a small stack buffer and the
 * same vector instructions, so no element ever depends on the scalar code
 * matching the hardware (the tests check that it does anyway).
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "kernels_cpu.h"

#define F16_MAX 65504.0f

static inline uint32_t f32_bits(float f)
{
	uint32_t u;

	memcpy(&u, &f, sizeof(u));
	return u;
}

static inline float bits_f32(uint32_t u)
{
	float f;

	memcpy(&f, &u, sizeof(f));
	return f;
}

/* Integer-only, so the result cannot depend on MXCSR (FTZ/DAZ, rounding mode). */
static inline uint16_t f32_to_f16_1(float f)
{
	uint32_t u = f32_bits(f);
	uint32_t sign = (u >> 16) & 0x8000u;
	uint32_t a = u & 0x7fffffffu;

	if (a > 0x7f800000u) /* NaN: quiet it, keep the top of the payload */
		return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
	if (a >= 0x477fe000u) /* >= 65504, inf included: saturate */
		return (uint16_t)(sign | 0x7bffu);
	if (a >= 0x38800000u) { /* >= 2^-14: normal fp16 */
		/*
		 * Rebias the exponent (127 -> 15) and drop 13 mantissa bits with
		 * round-half-even; a carry out of the mantissa correctly bumps the
		 * exponent, and cannot reach inf because a < 65504 here.
		 */
		uint32_t r = a - 0x38000000u;

		r += 0x0fffu + ((r >> 13) & 1u);
		return (uint16_t)(sign | (r >> 13));
	}
	uint32_t e = a >> 23;

	if (e < 102) /* below 2^-25: rounds to zero (2^-25 itself ties to even 0) */
		return (uint16_t)sign;
	/*
	 * fp16 subnormal: value / 2^-24 = m * 2^(e - 126) with the implicit bit
	 * in m; shift right by 126 - e (14..24) with round-half-even.
	 */
	uint32_t m = (a & 0x7fffffu) | 0x800000u;
	unsigned sh = 126 - e;
	uint32_t q = m >> sh;
	uint32_t rem = m & ((1u << sh) - 1u);
	uint32_t half = 1u << (sh - 1);

	if (rem > half || (rem == half && (q & 1u)))
		q++; /* may become 0x400, the smallest normal: still the right encoding */
	return (uint16_t)(sign | q);
}

static inline float f16_to_f32_1(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
	uint32_t e = (h >> 10) & 0x1fu;
	uint32_t m = h & 0x3ffu;

	if (e == 0x1f) /* inf, or NaN made quiet */
		return bits_f32(sign | 0x7f800000u | (m << 13) | (m ? 0x400000u : 0));
	if (e == 0) {
		if (!m)
			return bits_f32(sign);
		/* Subnormal: normalise so the leading one becomes the implicit bit. */
		e = 113;
		while (!(m & 0x400u)) {
			m <<= 1;
			e--;
		}
		return bits_f32(sign | (e << 23) | ((m & 0x3ffu) << 13));
	}
	return bits_f32(sign | ((e + 112) << 23) | (m << 13));
}

void mp_kcpu_f32_to_f16_scalar(uint16_t *dst, const float *src, size_t n)
{
	for (size_t i = 0; i < n; i++)
		dst[i] = f32_to_f16_1(src[i]);
}

void mp_kcpu_f16_to_f32_scalar(float *dst, const uint16_t *src, size_t n)
{
	for (size_t i = 0; i < n; i++)
		dst[i] = f16_to_f32_1(src[i]);
}

void mp_kcpu_f16_axpy_scalar(float *acc, const uint16_t *src, float w, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		float p = w * f16_to_f32_1(src[i]);

		NOFUSE_SCALAR(p);
		acc[i] = acc[i] + p;
	}
}

#ifdef MP_K_X86

/* ---- AVX2 + F16C (no FMA in the target on purpose, see reduce.c) ---- */

#define AVX2 __attribute__((target("avx2,f16c")))

AVX2 static inline __m128i cvt8_to_f16(__m256 v)
{
	const __m256 hi = _mm256_set1_ps(F16_MAX);
	const __m256 lo = _mm256_set1_ps(-F16_MAX);

	/* Constant first: a NaN in v is returned as is by both. */
	v = _mm256_max_ps(lo, _mm256_min_ps(hi, v));
	return _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT);
}

AVX2 static inline __m256 axpy8(__m256 a, __m256 x, __m256 w)
{
	__m256 p = _mm256_mul_ps(x, w);

	NOFUSE_V(p);
	return _mm256_add_ps(a, p);
}

AVX2 void mp_kcpu_f32_to_f16_avx2(uint16_t *dst, const float *src, size_t n)
{
	size_t i = 0;

	for (; i + 16 <= n; i += 16) {
		__m128i h0 = cvt8_to_f16(_mm256_loadu_ps(src + i));
		__m128i h1 = cvt8_to_f16(_mm256_loadu_ps(src + i + 8));

		_mm_storeu_si128((__m128i *)(dst + i), h0);
		_mm_storeu_si128((__m128i *)(dst + i + 8), h1);
	}
	for (; i + 8 <= n; i += 8)
		_mm_storeu_si128((__m128i *)(dst + i), cvt8_to_f16(_mm256_loadu_ps(src + i)));
	if (i < n) {
		float fb[8] = {0};
		uint16_t hb[8];

		memcpy(fb, src + i, (n - i) * sizeof(float));
		_mm_storeu_si128((__m128i *)hb, cvt8_to_f16(_mm256_loadu_ps(fb)));
		memcpy(dst + i, hb, (n - i) * sizeof(uint16_t));
	}
}

AVX2 void mp_kcpu_f16_to_f32_avx2(float *dst, const uint16_t *src, size_t n)
{
	size_t i = 0;

	for (; i + 16 <= n; i += 16) {
		__m256 f0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i)));
		__m256 f1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i + 8)));

		_mm256_storeu_ps(dst + i, f0);
		_mm256_storeu_ps(dst + i + 8, f1);
	}
	for (; i + 8 <= n; i += 8)
		_mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
	if (i < n) {
		uint16_t hb[8] = {0};
		float fb[8];

		memcpy(hb, src + i, (n - i) * sizeof(uint16_t));
		_mm256_storeu_ps(fb, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)hb)));
		memcpy(dst + i, fb, (n - i) * sizeof(float));
	}
}

AVX2 void mp_kcpu_f16_axpy_avx2(float *acc, const uint16_t *src, float w, size_t n)
{
	const __m256 vw = _mm256_set1_ps(w);
	size_t i = 0;

	for (; i + 16 <= n; i += 16) {
		__m256 x0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i)));
		__m256 x1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i + 8)));
		__m256 a0 = axpy8(_mm256_loadu_ps(acc + i), x0, vw);
		__m256 a1 = axpy8(_mm256_loadu_ps(acc + i + 8), x1, vw);

		_mm256_storeu_ps(acc + i, a0);
		_mm256_storeu_ps(acc + i + 8, a1);
	}
	for (; i + 8 <= n; i += 8) {
		__m256 x = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i)));

		_mm256_storeu_ps(acc + i, axpy8(_mm256_loadu_ps(acc + i), x, vw));
	}
	if (i < n) {
		uint16_t hb[8] = {0};
		float ab[8] = {0};

		memcpy(hb, src + i, (n - i) * sizeof(uint16_t));
		memcpy(ab, acc + i, (n - i) * sizeof(float));
		__m256 x = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)hb));

		_mm256_storeu_ps(ab, axpy8(_mm256_loadu_ps(ab), x, vw));
		memcpy(acc + i, ab, (n - i) * sizeof(float));
	}
}

/* ---- AVX-512F: 16 lanes; the conversions are part of AVX-512F itself ---- */

#define AVX512 __attribute__((target("avx512f")))

AVX512 static inline __m256i cvt16_to_f16(__m512 v)
{
	const __m512 hi = _mm512_set1_ps(F16_MAX);
	const __m512 lo = _mm512_set1_ps(-F16_MAX);

	v = _mm512_max_ps(lo, _mm512_min_ps(hi, v));
	return _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT);
}

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

AVX512 void mp_kcpu_f32_to_f16_avx512(uint16_t *dst, const float *src, size_t n)
{
	size_t i = 0;

	for (; i + 32 <= n; i += 32) {
		__m256i h0 = cvt16_to_f16(_mm512_loadu_ps(src + i));
		__m256i h1 = cvt16_to_f16(_mm512_loadu_ps(src + i + 16));

		_mm256_storeu_si256((__m256i *)(dst + i), h0);
		_mm256_storeu_si256((__m256i *)(dst + i + 16), h1);
	}
	for (; i + 16 <= n; i += 16)
		_mm256_storeu_si256((__m256i *)(dst + i), cvt16_to_f16(_mm512_loadu_ps(src + i)));
	if (i < n) {
		/* 16-bit masked stores need AVX-512BW; a bounce buffer needs nothing. */
		uint16_t hb[16];
		__m512 v = _mm512_maskz_loadu_ps(tail_mask(n - i), src + i);

		_mm256_storeu_si256((__m256i *)hb, cvt16_to_f16(v));
		memcpy(dst + i, hb, (n - i) * sizeof(uint16_t));
	}
}

AVX512 void mp_kcpu_f16_to_f32_avx512(float *dst, const uint16_t *src, size_t n)
{
	size_t i = 0;

	for (; i + 32 <= n; i += 32) {
		__m512 f0 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(src + i)));
		__m512 f1 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(src + i + 16)));

		_mm512_storeu_ps(dst + i, f0);
		_mm512_storeu_ps(dst + i + 16, f1);
	}
	for (; i + 16 <= n; i += 16)
		_mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(src + i))));
	if (i < n) {
		uint16_t hb[16] = {0};

		memcpy(hb, src + i, (n - i) * sizeof(uint16_t));
		_mm512_mask_storeu_ps(dst + i, tail_mask(n - i),
				      _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)hb)));
	}
}

AVX512 void mp_kcpu_f16_axpy_avx512(float *acc, const uint16_t *src, float w, size_t n)
{
	const __m512 vw = _mm512_set1_ps(w);
	size_t i = 0;

	for (; i + 32 <= n; i += 32) {
		__m512 x0 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(src + i)));
		__m512 x1 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(src + i + 16)));
		__m512 a0 = axpy16(_mm512_loadu_ps(acc + i), x0, vw);
		__m512 a1 = axpy16(_mm512_loadu_ps(acc + i + 16), x1, vw);

		_mm512_storeu_ps(acc + i, a0);
		_mm512_storeu_ps(acc + i + 16, a1);
	}
	for (; i + 16 <= n; i += 16) {
		__m512 x = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(src + i)));

		_mm512_storeu_ps(acc + i, axpy16(_mm512_loadu_ps(acc + i), x, vw));
	}
	if (i < n) {
		__mmask16 m = tail_mask(n - i);
		uint16_t hb[16] = {0};

		memcpy(hb, src + i, (n - i) * sizeof(uint16_t));
		__m512 x = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)hb));
		__m512 a = axpy16(_mm512_maskz_loadu_ps(m, acc + i), x, vw);

		_mm512_mask_storeu_ps(acc + i, m, a);
	}
}

#endif /* MP_K_X86 */
