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
 * Ragged ends of the vector loops go through the same vector instructions
 * (masked on AVX-512, through a small stack buffer on AVX2), so no element
 * ever depends on the scalar code matching the hardware (the tests check
 * that it does anyway).
 */
#include <stddef.h>
#include <stdint.h>

#include "kernels_cpu.h"
#include "kloop.h"

#define F16_MAX 65504.0f

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

AVX2 static inline __m256i f16_nstep8(const void *c, const float *p)
{
	(void)c;
	return _mm256_castsi128_si256(cvt8_to_f16(_mm256_loadu_ps(p)));
}

AVX2 void mp_kcpu_f32_to_f16_avx2(uint16_t *dst, const float *src, size_t n)
{
	kl_narrow8(dst, sizeof(*dst), src, n, 8, 2, f16_nstep8, NULL);
}

AVX2 static inline __m256 f16_step8(const struct kl8 *c, const void *p, __m256i m, int full)
{
	(void)c;
	(void)m;
	(void)full;
	return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

AVX2 void mp_kcpu_f16_to_f32_avx2(float *dst, const uint16_t *src, size_t n)
{
	const struct kl8 c = {0};

	kl_widen8(dst, src, sizeof(*src), n, 2, f16_step8, &c, KL_STORE);
}

AVX2 void mp_kcpu_f16_axpy_avx2(float *acc, const uint16_t *src, float w, size_t n)
{
	const struct kl8 c = {.w = _mm256_set1_ps(w)};

	kl_widen8(acc, src, sizeof(*src), n, 2, f16_step8, &c, KL_AXPY);
}

/*
 * ---- AVX-512: 16 lanes; the conversions are part of AVX-512F itself, BW
 * and VL (in dispatch.c's "avx512" level) give the 16-bit masked accesses ----
 */

#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl")))

AVX512 static inline __m256i cvt16_to_f16(__m512 v)
{
	const __m512 hi = _mm512_set1_ps(F16_MAX);
	const __m512 lo = _mm512_set1_ps(-F16_MAX);

	v = _mm512_max_ps(lo, _mm512_min_ps(hi, v));
	return _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT);
}

AVX512 static inline __m256i f16_nstep16x(const void *c, __m512 x)
{
	(void)c;
	return cvt16_to_f16(x);
}

AVX512 void mp_kcpu_f32_to_f16_avx512(uint16_t *dst, const float *src, size_t n)
{
	kl_narrow16(dst, sizeof(*dst), src, n, 2, f16_nstep16x, NULL);
}

AVX512 static inline __m512 f16_step16(const struct kl16 *c, const void *p, __mmask16 m, int full)
{
	(void)c;
	return _mm512_cvtph_ps(full ? _mm256_loadu_si256((const __m256i *)p) : _mm256_maskz_loadu_epi16(m, p));
}

AVX512 void mp_kcpu_f16_to_f32_avx512(float *dst, const uint16_t *src, size_t n)
{
	const struct kl16 c = {0};

	kl_widen16(dst, src, sizeof(*src), n, 2, f16_step16, &c, KL_STORE);
}

AVX512 void mp_kcpu_f16_axpy_avx512(float *acc, const uint16_t *src, float w, size_t n)
{
	const struct kl16 c = {.w = _mm512_set1_ps(w)};

	kl_widen16(acc, src, sizeof(*src), n, 2, f16_step16, &c, KL_AXPY);
}

#endif /* MP_K_X86 */
