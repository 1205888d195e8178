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
 *
 * Below the skeletons, the kv layer: the operations in which the AVX2 and
 * AVX-512 versions of a kernel differ, under one set of names, so that a
 * kernel is written once for both widths (see "One algorithm, both widths"
 * at the end).
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

/*
 * The codes kv_narrow makes of the int32 results of its step: KL_U16 and
 * KL_I8 take them as they are (they must lie in the code's range), KL_U8
 * takes a negative one to 0 (uniform8's floor, then the clamp at 0).
 */
enum kl_pack {
	KL_U16,
	KL_U8,
	KL_I8,
};

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
	__m256 w;         /* KL_AXPY's weight */
	__m256 s;         /* a multiplier of the step's own */
	const void *data; /* a table of the step's own */
};

/*
 * Eight floats from the eight elements at @p. @m and @full are there so
 * that a step has kl_step16's form (one step serves both widths, see the kv
 * layer); kl_widen8 always passes full (its ragged end goes through a
 * buffer), so an AVX2 step reads eight whole elements.
 */
typedef __m256 (*kl_step8)(const struct kl8 *c, const void *p, __m256i m, int full);

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
	const __m256i all = _mm256_set1_epi32(-1);
	size_t i = 0;

#define KL_GET(j) kl_apply8(mode, dst + (j), step(c, s + esz * (j), all, 1), c->w)
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
		_mm256_storeu_ps(fb, kl_apply8(mode, fb, step(c, eb, all, 1), c->w));
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

/*
 * ---- AVX2 as the kv layer's kv8_ (see "One algorithm, both widths"):
 * 8 lanes, masks as vectors of all-ones lanes ----
 */

#define KV_TARGET_8 KL_AVX2
#define KV_ISA_8 avx2

typedef __m256 kv8_f;  /* 8 floats */
typedef __m256i kv8_i; /* 8 int32 */
typedef __m256d kv8_d; /* 4 doubles: half a kv8_f's lanes */
typedef __m256i kv8_m; /* lanes all ones (in) or all zeros (out) */
typedef struct kl8 kv8_c;
#define kv8_widen kl_widen8

/* Operations that are one intrinsic or two; the others follow. */
#define kv8_set1_f _mm256_set1_ps
#define kv8_set1_i _mm256_set1_epi32
#define kv8_zero_f _mm256_setzero_ps
#define kv8_zero_i _mm256_setzero_si256
#define kv8_zero_d _mm256_setzero_pd
#define kv8_mzero _mm256_setzero_si256
#define kv8_iota() _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)
#define kv8_loadu_f _mm256_loadu_ps
#define kv8_loadu_i(p) _mm256_loadu_si256((const __m256i *)(p))
#define kv8_storeu_f _mm256_storeu_ps
#define kv8_storeu_d _mm256_storeu_pd
#define kv8_store_i(p, v) _mm256_store_si256((__m256i *)(p), v)
/* The floats at @p in the lanes of @m, +0 in the others (which are not read). */
#define kv8_maskz_loadu_f(m, p) _mm256_maskload_ps(p, m)
#define kv8_mask_storeu_f(p, m, v) _mm256_maskstore_ps(p, m, v)
#define kv8_add_f _mm256_add_ps
#define kv8_sub_f _mm256_sub_ps
#define kv8_mul_f _mm256_mul_ps
#define kv8_min_f _mm256_min_ps
#define kv8_max_f _mm256_max_ps
#define kv8_add_d _mm256_add_pd
#define kv8_mul_d _mm256_mul_pd
#define kv8_add_i _mm256_add_epi32
#define kv8_and_i _mm256_and_si256
#define kv8_or_i _mm256_or_si256
#define kv8_max_u32 _mm256_max_epu32
#define kv8_srl_i _mm256_srl_epi32
/* Macros, not functions, all of these: a shift count must stay a constant even at -O0. */
#define kv8_srli_i(v, k) _mm256_srli_epi32(v, k)
#define kv8_slli_i(v, k) _mm256_slli_epi32(v, k)
#define kv8_ftoi _mm256_castps_si256
#define kv8_itof _mm256_castsi256_ps
#define kv8_cvt_f _mm256_cvtepi32_ps
#define kv8_cvtt_i _mm256_cvttps_epi32
/* Round half to even, whatever MXCSR says (rounded first, so the truncation is exact). */
#define kv8_cvt_rne_i(x) \
	_mm256_cvttps_epi32(_mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC))
/*
 * a > b for int32 lanes that are never negative (bit patterns of |x|, or
 * counts): AVX2 compares signed, AVX-512 unsigned, and there the two agree.
 */
#define kv8_gt_key _mm256_cmpgt_epi32
#define kv8_eq_i _mm256_cmpeq_epi32
/* Float compares: ordered and quiet (a NaN lane is out), but unord. */
#define kv8_ge_f(a, b) _mm256_castps_si256(_mm256_cmp_ps(a, b, _CMP_GE_OQ))
#define kv8_neq_f(a, b) _mm256_castps_si256(_mm256_cmp_ps(a, b, _CMP_NEQ_OQ))
#define kv8_ord_f(a, b) _mm256_castps_si256(_mm256_cmp_ps(a, b, _CMP_ORD_Q))
#define kv8_unord_f(a, b) _mm256_castps_si256(_mm256_cmp_ps(a, b, _CMP_UNORD_Q))
/* Bit i for lane i of @m. */
#define kv8_bits(m) ((unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(m)))
#define kv8_mand _mm256_and_si256
#define kv8_mor _mm256_or_si256
/* @v in the lanes of @m, +0 in the others; @b in the lanes of @m, @a in the others. */
#define kv8_maskz_f(m, v) _mm256_and_ps(v, _mm256_castsi256_ps(m))
#define kv8_maskz_i(m, v) _mm256_and_si256(v, m)
#define kv8_blend_f(a, b, m) _mm256_blendv_ps(a, b, _mm256_castsi256_ps(m))
#define kv8_blend_i _mm256_blendv_epi8
/* Doubles from the 4 floats at @p, or from the low or high half of @x (exact). */
#define kv8_load_cvt_d(p) _mm256_cvtps_pd(_mm_loadu_ps(p))
#define kv8_cvt_lo_d(x) _mm256_cvtps_pd(_mm256_castps256_ps128(x))
#define kv8_cvt_hi_d(x) _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1))

/* The lanes below @k (any k >= 0; all of them from 8 on). */
KL_AVX2 static inline kv8_m kv8_lanes(size_t k)
{
	return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(k < 8 ? k : 8)), kv8_iota());
}

/*
 * The 8 u16 (or, sign-extended, i8) elements at @p; @m and @full as a
 * kl_step8's (AVX2 steps always read whole vectors).
 */
KL_AVX2 static inline kv8_i kv8_load_u16(const void *p, kv8_m m, int full)
{
	(void)m;
	(void)full;
	return _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
}

KL_AVX2 static inline kv8_i kv8_load_i8(const void *p, kv8_m m, int full)
{
	(void)m;
	(void)full;
	return _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p));
}

KL_AVX2 static inline uint32_t kv8_hmax_u32(kv8_i v)
{
	__m128i h = _mm_max_epu32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));

	h = _mm_max_epu32(h, _mm_shuffle_epi32(h, 0x4e));
	h = _mm_max_epu32(h, _mm_shuffle_epi32(h, 0xb1));
	return (uint32_t)_mm_cvtsi128_si32(h);
}

/* Bit i set where lane i of @d is inf or NaN. */
KL_AVX2 static inline unsigned kv8_nonfinite_d(kv8_d d)
{
	/* d - d is 0 for finite d and NaN for inf and NaN. */
	__m256d z = _mm256_sub_pd(d, d);

	return (unsigned)_mm256_movemask_pd(_mm256_cmp_pd(z, z, _CMP_UNORD_Q));
}

/* kv8_narrow's step: the 8 codes of the 8 floats @x, as int32. */
typedef kv8_i (*kv8_nstep)(const void *c, kv8_f x);

/*
 * 32 bytes of codes from the floats at @p (16 for KL_U16, else 32), each
 * vector of them through @step: packs (their saturation only matters for
 * KL_U8's negative results), then the permutation that undoes their
 * interleaving of the 128-bit halves.
 */
KL_AVX2 MP_K_INLINE __m256i kv8_group(enum kl_pack pack, kv8_nstep step, const void *c, const float *p)
{
	if (pack == KL_U16) {
		__m256i r = _mm256_packus_epi32(step(c, _mm256_loadu_ps(p)), step(c, _mm256_loadu_ps(p + 8)));

		return _mm256_permute4x64_epi64(r, 0xd8);
	}
	__m256i a = _mm256_packs_epi32(step(c, _mm256_loadu_ps(p)), step(c, _mm256_loadu_ps(p + 8)));
	__m256i b = _mm256_packs_epi32(step(c, _mm256_loadu_ps(p + 16)), step(c, _mm256_loadu_ps(p + 24)));
	__m256i r = pack == KL_U8 ? _mm256_packus_epi16(a, b) : _mm256_packs_epi16(a, b);

	return _mm256_permutevar8x32_epi32(r, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* kv8_narrow's group step, and what it needs (a kl_nstep8 takes one pointer). */
struct kv8_ng {
	kv8_nstep step;
	const void *c;
	enum kl_pack pack;
};

KL_AVX2 MP_K_INLINE __m256i kv8_ngroup(const void *c, const float *p)
{
	const struct kv8_ng *g = c;

	return kv8_group(g->pack, g->step, g->c, p);
}

/*
 * The n floats at @src into n codes at @dst (2 bytes each for KL_U16, else
 * 1), by @step and @pack: kl_narrow8 on groups of 32 bytes of codes, 32
 * floats a round.
 */
KL_AVX2 MP_K_INLINE void kv8_narrow(void *dst, enum kl_pack pack, const float *src, size_t n,
				    kv8_nstep step, const void *c)
{
	const struct kv8_ng g = {step, c, pack};
	const size_t osz = pack == KL_U16 ? 2 : 1;

	kl_narrow8(dst, osz, src, n, 32 / osz, pack == KL_U16 ? 2 : 1, kv8_ngroup, &g);
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

/*
 * ---- AVX-512 as the kv layer's kv16_: 16 lanes, masks in mask registers;
 * F, BW, VL and DQ, the level dispatch.c calls "avx512" ----
 */

#define KV_TARGET_16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))
#define KV_ISA_16 avx512

typedef __m512 kv16_f;    /* 16 floats */
typedef __m512i kv16_i;   /* 16 int32 */
typedef __m512d kv16_d;   /* 8 doubles: half a kv16_f's lanes */
typedef __mmask16 kv16_m; /* bit i: lane i */
typedef struct kl16 kv16_c;
#define kv16_widen kl_widen16

#define kv16_set1_f _mm512_set1_ps
#define kv16_set1_i _mm512_set1_epi32
#define kv16_zero_f _mm512_setzero_ps
#define kv16_zero_i _mm512_setzero_si512
#define kv16_zero_d _mm512_setzero_pd
#define kv16_mzero() ((kv16_m)0)
#define kv16_iota() _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)
#define kv16_loadu_f _mm512_loadu_ps
#define kv16_loadu_i _mm512_loadu_si512
#define kv16_storeu_f _mm512_storeu_ps
#define kv16_storeu_d _mm512_storeu_pd
#define kv16_store_i _mm512_store_si512
#define kv16_maskz_loadu_f _mm512_maskz_loadu_ps
#define kv16_mask_storeu_f _mm512_mask_storeu_ps
#define kv16_add_f _mm512_add_ps
#define kv16_sub_f _mm512_sub_ps
#define kv16_mul_f _mm512_mul_ps
#define kv16_min_f _mm512_min_ps
#define kv16_max_f _mm512_max_ps
#define kv16_add_d _mm512_add_pd
#define kv16_mul_d _mm512_mul_pd
#define kv16_add_i _mm512_add_epi32
#define kv16_and_i _mm512_and_si512
#define kv16_or_i _mm512_or_si512
#define kv16_max_u32 _mm512_max_epu32
#define kv16_srl_i _mm512_srl_epi32
#define kv16_srli_i(v, k) _mm512_srli_epi32(v, k)
#define kv16_slli_i(v, k) _mm512_slli_epi32(v, k)
#define kv16_ftoi _mm512_castps_si512
#define kv16_itof _mm512_castsi512_ps
#define kv16_cvt_f _mm512_cvtepi32_ps
#define kv16_cvtt_i _mm512_cvttps_epi32
#define kv16_cvt_rne_i(x) _mm512_cvt_roundps_epi32(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define kv16_gt_key _mm512_cmpgt_epu32_mask
#define kv16_eq_i _mm512_cmpeq_epi32_mask
#define kv16_ge_f(a, b) _mm512_cmp_ps_mask(a, b, _CMP_GE_OQ)
#define kv16_neq_f(a, b) _mm512_cmp_ps_mask(a, b, _CMP_NEQ_OQ)
#define kv16_ord_f(a, b) _mm512_cmp_ps_mask(a, b, _CMP_ORD_Q)
#define kv16_unord_f(a, b) _mm512_cmp_ps_mask(a, b, _CMP_UNORD_Q)
#define kv16_bits(m) ((unsigned)(m))
#define kv16_mand(a, b) ((kv16_m)((a) & (b)))
#define kv16_mor(a, b) ((kv16_m)((a) | (b)))
#define kv16_maskz_f _mm512_maskz_mov_ps
#define kv16_maskz_i _mm512_maskz_mov_epi32
#define kv16_blend_f(a, b, m) _mm512_mask_mov_ps(a, m, b)
#define kv16_blend_i(a, b, m) _mm512_mask_mov_epi32(a, m, b)
#define kv16_hmax_u32 _mm512_reduce_max_epu32
#define kv16_load_cvt_d(p) _mm512_cvtps_pd(_mm256_loadu_ps(p))
#define kv16_cvt_lo_d(x) _mm512_cvtps_pd(_mm512_castps512_ps256(x))
#define kv16_cvt_hi_d(x) _mm512_cvtps_pd(_mm512_extractf32x8_ps(x, 1))
/* 0x99: NaN (quiet, signalling) or +-inf. */
#define kv16_nonfinite_d(d) ((unsigned)_mm512_fpclass_pd_mask(d, 0x99))

/* The lanes below @k (any k >= 0; all of them from 16 on). */
KV_TARGET_16 static inline kv16_m kv16_lanes(size_t k)
{
	return k >= 16 ? (kv16_m)0xffff : tail16(k);
}

/* The 16 u16 (or, sign-extended, i8) elements at @p: all if @full, else those in @m. */
KV_TARGET_16 static inline kv16_i kv16_load_u16(const void *p, kv16_m m, int full)
{
	__m256i h = full ? _mm256_loadu_si256((const __m256i *)p) : _mm256_maskz_loadu_epi16(m, p);

	return _mm512_cvtepu16_epi32(h);
}

KV_TARGET_16 static inline kv16_i kv16_load_i8(const void *p, kv16_m m, int full)
{
	__m128i b = full ? _mm_loadu_si128((const __m128i *)p) : _mm_maskz_loadu_epi8(m, p);

	return _mm512_cvtepi8_epi32(b);
}

/* kv16_narrow's step: the 16 codes of the 16 floats @x, as int32. */
typedef kv16_i (*kv16_nstep)(const void *c, kv16_f x);

/*
 * The 64 uniform8 codes (KL_U8) of the 64 floats at @p: the packs, then the
 * permutation that undoes their interleaving of the four 128-bit lanes.
 */
KV_TARGET_16 MP_K_INLINE __m512i kv16_group_u8(kv16_nstep step, const void *c, const float *p)
{
	__m512i a = _mm512_packs_epi32(step(c, _mm512_loadu_ps(p)), step(c, _mm512_loadu_ps(p + 16)));
	__m512i b = _mm512_packs_epi32(step(c, _mm512_loadu_ps(p + 32)), step(c, _mm512_loadu_ps(p + 48)));

	/* Dword k of the pack holds bytes 4k..4k+3 of lane k % 4 in order: k % 4 * 4 + k / 4. */
	return _mm512_permutexvar_epi32(
		_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15),
		_mm512_packus_epi16(a, b));
}

/* kv16_narrow's step for kl_narrow16, and what it needs (a kl_nstep16 takes one pointer). */
struct kv16_ng {
	kv16_nstep step;
	const void *c;
	enum kl_pack pack;
};

/* KL_U16 and KL_I8: the codes of one vector by one VPMOV (truncating: they are in range). */
KV_TARGET_16 MP_K_INLINE __m256i kv16_nvec(const void *c, __m512 x)
{
	const struct kv16_ng *g = c;
	__m512i q = g->step(g->c, x);

	return g->pack == KL_U16 ? _mm512_cvtepi32_epi16(q) : _mm256_castsi128_si256(_mm512_cvtepi32_epi8(q));
}

/*
 * The n floats at @src into n codes at @dst, as kv8_narrow. The loops are
 * those the AVX-512 kernels had before they were shared, which measured
 * fastest for each: uniform8's codes (KL_U8) through the packs, 64 a
 * round, the others through kl_narrow16, one VPMOV a vector (through the
 * packs, the bf16 encoder was 6% slower). Past the last whole round, 16
 * floats at a time under a mask: the floats outside it are neither read nor
 * written.
 */
KV_TARGET_16 MP_K_INLINE void kv16_narrow(void *dst, enum kl_pack pack, const float *src, size_t n,
					  kv16_nstep step, const void *c)
{
	uint8_t *d = dst;
	size_t i = 0;

	if (pack != KL_U8) {
		const struct kv16_ng g = {step, c, pack};

		kl_narrow16(dst, pack == KL_U16 ? 2 : 1, src, n, 2, kv16_nvec, &g);
		return;
	}
#define KL_GET(j) kv16_group_u8(step, c, src + (j))
#define KL_PUT(j, v) _mm512_storeu_si512(d + (j), v)
	KL_ROUNDS(__m512i, 64, 1, i, n, KL_GET, KL_PUT)
#undef KL_GET
#undef KL_PUT
	for (; i < n; i += 16) {
		kv16_m m = kv16_lanes(n - i);
		__m512i q = step(c, _mm512_maskz_loadu_ps(m, src + i));

		/* Negative to 0, then truncation to bytes (the rest is 0..255). */
		_mm512_mask_cvtepi32_storeu_epi8(d + i, m, _mm512_max_epi32(q, _mm512_setzero_si512()));
	}
}

/*
 * ==== One algorithm, both widths ====
 *
 * A kernel whose AVX2 and AVX-512 versions differ only in the vector width
 * is written once, in a file of kernels/cpu that its .c includes once per
 * width, with KV_W defined as 8 (AVX2) or 16 (AVX-512) (quant_vec.h,
 * sparse_vec.h). There, kv_NAME stands for kv8_NAME or kv16_NAME above,
 * which do the same thing lane for lane, KV_FN(name) names the instance
 * (name_avx2, name_avx512) and KV_TARGET is its target. A .c may add kv8_
 * and kv16_ operations of its own; kv_(name) reaches them.
 *
 * Masks (kv_m) are vectors on AVX2 and mask registers on AVX-512: they only
 * meet the operations that take a kv_m, and kv_bits makes an int of them
 * (bit i for lane i) where the code needs one.
 */

#define KV_CAT_(a, b) a##b
#define KV_CAT(a, b) KV_CAT_(a, b)
#define kv_(name) KV_CAT(KV_CAT(kv, KV_W), _##name)
#define KV_FN(name) KV_CAT(name##_, KV_CAT(KV_ISA_, KV_W))
#define KV_TARGET KV_CAT(KV_TARGET_, KV_W)

#define kv_f kv_(f)
#define kv_i kv_(i)
#define kv_d kv_(d)
#define kv_m kv_(m)
#define kv_c kv_(c)
#define kv_nstep kv_(nstep)
#define kv_widen kv_(widen)
#define kv_narrow kv_(narrow)
#define kv_set1_f kv_(set1_f)
#define kv_set1_i kv_(set1_i)
#define kv_zero_f kv_(zero_f)
#define kv_zero_i kv_(zero_i)
#define kv_zero_d kv_(zero_d)
#define kv_mzero kv_(mzero)
#define kv_iota kv_(iota)
#define kv_lanes kv_(lanes)
#define kv_loadu_f kv_(loadu_f)
#define kv_loadu_i kv_(loadu_i)
#define kv_storeu_f kv_(storeu_f)
#define kv_storeu_d kv_(storeu_d)
#define kv_store_i kv_(store_i)
#define kv_maskz_loadu_f kv_(maskz_loadu_f)
#define kv_mask_storeu_f kv_(mask_storeu_f)
#define kv_load_u16 kv_(load_u16)
#define kv_load_i8 kv_(load_i8)
#define kv_load_cvt_d kv_(load_cvt_d)
#define kv_add_f kv_(add_f)
#define kv_sub_f kv_(sub_f)
#define kv_mul_f kv_(mul_f)
#define kv_min_f kv_(min_f)
#define kv_max_f kv_(max_f)
#define kv_add_d kv_(add_d)
#define kv_mul_d kv_(mul_d)
#define kv_add_i kv_(add_i)
#define kv_and_i kv_(and_i)
#define kv_or_i kv_(or_i)
#define kv_max_u32 kv_(max_u32)
#define kv_srl_i kv_(srl_i)
#define kv_srli_i kv_(srli_i)
#define kv_slli_i kv_(slli_i)
#define kv_ftoi kv_(ftoi)
#define kv_itof kv_(itof)
#define kv_cvt_f kv_(cvt_f)
#define kv_cvtt_i kv_(cvtt_i)
#define kv_cvt_rne_i kv_(cvt_rne_i)
#define kv_cvt_lo_d kv_(cvt_lo_d)
#define kv_cvt_hi_d kv_(cvt_hi_d)
#define kv_gt_key kv_(gt_key)
#define kv_eq_i kv_(eq_i)
#define kv_ge_f kv_(ge_f)
#define kv_neq_f kv_(neq_f)
#define kv_ord_f kv_(ord_f)
#define kv_unord_f kv_(unord_f)
#define kv_nonfinite_d kv_(nonfinite_d)
#define kv_bits kv_(bits)
#define kv_mand kv_(mand)
#define kv_mor kv_(mor)
#define kv_maskz_f kv_(maskz_f)
#define kv_maskz_i kv_(maskz_i)
#define kv_blend_f kv_(blend_f)
#define kv_blend_i kv_(blend_i)
#define kv_hmax_u32 kv_(hmax_u32)

/* Made of the operations above, so the same at both widths. */

/* The bits of |x|: for finite floats, a key that orders them by magnitude. */
#define kv_absbits(x) kv_and_i(kv_ftoi(x), kv_set1_i(0x7fffffff))
#define kv_abs_f(x) kv_itof(kv_absbits(x))
/* The lanes where x is finite. */
#define kv_finite(x) kv_gt_key(kv_set1_i(0x7f800000), kv_absbits(x))

#endif /* MP_K_X86 */

#endif
