/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Private to the .c files of kernels/cpu: float bit casts, the rounded
 * multiply-add every accumulating variant uses, and the loop skeletons of the
 * vector kernels: widening (wire elements -> floats, stored, added or
 * accumulated with a weight) and narrowing (floats -> codes).
 *
 * A skeleton takes a small step function (what one vector of elements
 * becomes) and, to widen, a mode (what is done with it); both are constants
 * at every call, and the skeleton is always inlined, so each kernel compiles
 * to the loop it would be written out as (no indirect call is left). The
 * skeletons only move data and apply the same rounded operations as the
 * scalar code, so the results stay bit-identical (see reduce.c and quant.c
 * for why each step is exact).
 */
#ifndef MP_KCPU_KLOOP_H
#define MP_KCPU_KLOOP_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "kernels_cpu.h"

#define MP_K_INLINE static inline __attribute__((always_inline))

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

#ifdef MP_K_X86

/* What a widening loop does with the floats its step makes (x). */
enum kl_mode {
	KL_STORE, /* dst = x */
	KL_ADD,   /* dst = dst + x */
	KL_AXPY,  /* dst = dst + w * x, the product rounded before the add */
};

/*
 * The whole rounds every skeleton here starts with, at either width: each of
 * the @unroll (a constant, <= 4) vectors of a round, for @width elements
 * from j on, is made by GET(j) before any is stored by PUT(j, x). Stores
 * between the loads of a round slow the streams down once they leave the
 * caches (axpy over 16 MiB: 15% on Zen 5). A macro, as nothing else in C is
 * generic over the vector type.
 */
#define KL_ROUNDS(vtype, width, unroll, i, n, GET, PUT)                                      \
	for (; (i) + (width) * (unroll) <= (n); (i) += (width) * (unroll)) {                 \
		vtype kl_x_[4];                                                              \
                                                                                             \
		_Pragma("GCC unroll 4") for (unsigned kl_k_ = 0; kl_k_ < (unroll); kl_k_++)  \
			kl_x_[kl_k_] = GET((i) + (width) * kl_k_);                           \
		_Pragma("GCC unroll 4") for (unsigned kl_k_ = 0; kl_k_ < (unroll); kl_k_++)  \
			PUT((i) + (width) * kl_k_, kl_x_[kl_k_]);                            \
	}

/* ---- AVX2: 8 floats a vector ---- */

/* The least target of the AVX2 kernels: theirs may add to it (fp16.c: f16c). */
#define KL_AVX2 __attribute__((target("avx2")))

KL_AVX2 static inline __m256 axpy8(__m256 a, __m256 x, __m256 w)
{
	__m256 p = _mm256_mul_ps(x, w);

	NOFUSE_V(p);
	return _mm256_add_ps(a, p);
}

/* What a step may need besides its elements; the loop reads only w. */
struct kl8 {
	__m256 w;           /* KL_AXPY's weight */
	__m256 s;           /* a multiplier of the step's own */
	const float *table; /* a lookup table of the step's own */
};

/* Eight floats from the eight elements at @p. */
typedef __m256 (*kl_step8)(const struct kl8 *c, const void *p);

/* @x as @mode combines it with d[0..8). */
KL_AVX2 MP_K_INLINE __m256 kl_apply8(enum kl_mode mode, const float *d, __m256 x, __m256 w)
{
	if (mode == KL_ADD)
		return _mm256_add_ps(_mm256_loadu_ps(d), x);
	if (mode == KL_AXPY)
		return axpy8(_mm256_loadu_ps(d), x, w);
	return x;
}

/*
 * dst[0..n) from the n elements of @esz (<= 4) bytes at @src, by @step:
 * 8 * @unroll (a constant: 2 or 4) a round, then 8, and the ragged end
 * through zeroed stack buffers and the same step (the padding's results are
 * thrown away).
 */
KL_AVX2 MP_K_INLINE void kl_widen8(float *dst, const void *src, size_t esz, size_t n, unsigned unroll,
				   kl_step8 step, const struct kl8 *c, enum kl_mode mode)
{
	const unsigned char *s = src;
	size_t i = 0;

#define KL_GET(j) kl_apply8(mode, dst + (j), step(c, s + esz * (j)), c->w)
#define KL_PUT(j, x) _mm256_storeu_ps(dst + (j), x)
	KL_ROUNDS(__m256, 8, unroll, i, n, KL_GET, KL_PUT)
	for (; i + 8 <= n; i += 8)
		KL_PUT(i, KL_GET(i));
#undef KL_GET
#undef KL_PUT
	if (i < n) {
		unsigned char eb[32];
		float fb[8] = {0};

		memset(eb, 0, 8 * esz); /* what the step reads */
		memcpy(eb, s + esz * i, (n - i) * esz);
		if (mode != KL_STORE)
			memcpy(fb, dst + i, (n - i) * sizeof(float));
		_mm256_storeu_ps(fb, kl_apply8(mode, fb, step(c, eb), c->w));
		memcpy(dst + i, fb, (n - i) * sizeof(float));
	}
}

/* Stores the @bytes (16 or 32, a constant) bytes of codes in @v at @out. */
KL_AVX2 MP_K_INLINE void kl_store8(void *out, size_t bytes, __m256i v)
{
	if (bytes == 16)
		_mm_storeu_si128((__m128i *)out, _mm256_castsi256_si128(v));
	else
		_mm256_storeu_si256((__m256i *)out, v);
}

/* The codes of the g floats at @p (g: kl_narrow8's): 32 bytes, or 16 in the low half. */
typedef __m256i (*kl_nstep8)(const void *c, const float *p);

/*
 * The n floats at @src into n codes of @osz (<= 2) bytes at @dst, by @step
 * on groups of @g (<= 32) floats, g * osz being 16 or 32: @unroll (a
 * constant) groups a round, then one, and the ragged end through zeroed
 * stack buffers and the same step.
 */
KL_AVX2 MP_K_INLINE void kl_narrow8(void *dst, size_t osz, const float *src, size_t n, size_t g,
				    unsigned unroll, kl_nstep8 step, const void *c)
{
	unsigned char *d = dst;
	size_t i = 0;

#define KL_GET(j) step(c, src + (j))
#define KL_PUT(j, v) kl_store8(d + osz * (j), g * osz, v)
	KL_ROUNDS(__m256i, g, unroll, i, n, KL_GET, KL_PUT)
	for (; unroll > 1 && i + g <= n; i += g)
		KL_PUT(i, KL_GET(i));
#undef KL_GET
#undef KL_PUT
	if (i < n) {
		float fb[32];
		unsigned char ob[32];

		/* Only the group: a larger clear would be a REP STOS, slow to start. */
		memset(fb, 0, g * sizeof(float));
		memcpy(fb, src + i, (n - i) * sizeof(float));
		kl_store8(ob, g * osz, step(c, fb));
		memcpy(d + osz * i, ob, (n - i) * osz);
	}
}

/* ---- AVX-512: 16 floats a vector, masks for the ragged ends ---- */

#define KL_AVX512 __attribute__((target("avx512f")))

KL_AVX512 static inline __m512 axpy16(__m512 a, __m512 x, __m512 w)
{
	__m512 p = _mm512_mul_ps(x, w);

	NOFUSE_V(p);
	return _mm512_add_ps(a, p);
}

/* The low @k (< 16) lanes. */
KL_AVX512 static inline __mmask16 tail16(size_t k)
{
	return (__mmask16)((1u << k) - 1u);
}

struct kl16 {
	__m512 w;         /* KL_AXPY's weight */
	__m512 s;         /* a multiplier of the step's own */
	const void *data; /* a table of the step's own */
};

/*
 * Sixteen floats from the elements at @p: all sixteen where @full (a
 * constant at each use), else those in @m, with the others loaded as 0.
 */
typedef __m512 (*kl_step16)(const struct kl16 *c, const void *p, __mmask16 m, int full);

/* @x as @mode combines it with d[0..16) (those in @m unless @full, a constant). */
KL_AVX512 MP_K_INLINE __m512 kl_apply16(enum kl_mode mode, const float *d, __mmask16 m, int full,
					__m512 x, __m512 w)
{
	if (mode == KL_STORE)
		return x;
	__m512 a = full ? _mm512_loadu_ps(d) : _mm512_maskz_loadu_ps(m, d);

	return mode == KL_ADD ? _mm512_add_ps(a, x) : axpy16(a, x, w);
}

/*
 * dst[0..n) from the n elements of @esz bytes at @src, by @step: 16 * @unroll
 * (a constant: 2 or 4) a round, then 16 at a time under a mask.
 */
KL_AVX512 MP_K_INLINE void kl_widen16(float *dst, const void *src, size_t esz, size_t n, unsigned unroll,
				      kl_step16 step, const struct kl16 *c, enum kl_mode mode)
{
	const unsigned char *s = src;
	size_t i = 0;

#define KL_GET(j) kl_apply16(mode, dst + (j), 0xffff, 1, step(c, s + esz * (j), 0xffff, 1), c->w)
#define KL_PUT(j, x) _mm512_storeu_ps(dst + (j), x)
	KL_ROUNDS(__m512, 16, unroll, i, n, KL_GET, KL_PUT)
#undef KL_GET
#undef KL_PUT
	for (; i < n; i += 16) {
		__mmask16 m = n - i >= 16 ? 0xffff : tail16(n - i);

		__m512 x = kl_apply16(mode, dst + i, m, 0, step(c, s + esz * i, m, 0), c->w);

		_mm512_mask_storeu_ps(dst + i, m, x);
	}
}

/* kl_narrow16's stores of 16-bit and 8-bit codes need BW and VL too. */
#define KL_AVX512BW __attribute__((target("avx512f,avx512bw,avx512vl")))

/* The codes of the 16 floats @x: 16 words, or 16 bytes in the low half. */
typedef __m256i (*kl_nstep16)(const void *c, __m512 x);

/*
 * The n floats at @src into n codes of @osz (1 or 2) bytes at @dst, by
 * @step: 16 * @unroll (a constant) a round, then 16 at a time under a mask
 * (the floats outside it are neither read nor written).
 */
KL_AVX512BW MP_K_INLINE void kl_narrow16(void *dst, size_t osz, const float *src, size_t n,
					 unsigned unroll, kl_nstep16 step, const void *c)
{
	unsigned char *d = dst;
	size_t i = 0;

#define KL_GET(j) step(c, _mm512_loadu_ps(src + (j)))
#define KL_PUT(j, v) kl_store8(d + osz * (j), 16 * osz, v)
	KL_ROUNDS(__m256i, 16, unroll, i, n, KL_GET, KL_PUT)
#undef KL_GET
#undef KL_PUT
	for (; i < n; i += 16) {
		__mmask16 m = n - i >= 16 ? 0xffff : tail16(n - i);
		__m256i v = step(c, _mm512_maskz_loadu_ps(m, src + i));

		if (osz == 2)
			_mm256_mask_storeu_epi16(d + 2 * i, m, v);
		else
			_mm_mask_storeu_epi8(d + i, m, _mm256_castsi256_si128(v));
	}
}

#endif /* MP_K_X86 */

#endif
