/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Encoder settings of the wire codecs, and the rules that every encoder,
 * CPU (src/codec*.c) or CUDA (kernels/cuda), applies to them: one copy, so
 * that the two cannot drift apart (the CUDA encoders must give the CPU's
 * bytes). A leaf: system headers only, valid C and C++ (nvcc's host code).
 */
#ifndef MP_CODEC_PARAMS_H
#define MP_CODEC_PARAMS_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

/* Encoder settings (decoders never need them: payloads describe themselves). */
struct mp_codec_params {
	uint32_t block;   /* blockwise8: elements per absmax scale (default 4096) */
	float sigmas;     /* uniform8: range is mean +- sigmas * stddev (default 6) */
	float topk_ratio; /* topk: fraction of the elements kept, (0, 1] (default 0.01) */
	uint32_t bin;     /* adacomp: bin length L_T (default 500, FC-like; 50 conv-like) */
};

/* 1 if topk can use @p's ratio: in (0, 1], so not NaN. */
static inline int mp_codec_topk_ratio_ok(const struct mp_codec_params *p)
{
	return p && p->topk_ratio > 0.0f && p->topk_ratio <= 1.0f;
}

/* 1 if every field of @p is usable (mp_codec_params_check); NaN fails every comparison. */
static inline int mp_codec_params_ok(const struct mp_codec_params *p)
{
	return p && p->block >= 1 && p->block <= (1u << 24) && p->sigmas > 0.0f && p->sigmas <= 64.0f &&
	       mp_codec_topk_ratio_ok(p) && p->bin >= 1 && p->bin <= (1u << 24);
}

/*
 * Elements topk keeps of @count at @ratio (a usable one): llround(ratio *
 * count) clamped to [1, count], 0 for no elements. Part of the format's
 * encode rule: every encoder must keep the same number.
 */
static inline size_t mp_codec_topk_k(float ratio, size_t count)
{
	if (!count)
		return 0;
	long long k = llround((double)ratio * (double)count);

	if (k < 1)
		return 1;
	return (unsigned long long)k > count ? count : (size_t)k;
}

/*
 * blockwise8's step rule, decided on the bits of the block's absmax a (a
 * positive finite float; the bits of such floats order as the floats do).
 * Each threshold was found by trying every positive float:
 *  - a / 127 rounds to 0 for bits <= MP_BW8_ZERO_STEP_MAX: the block is all
 *    zero codes with step 0;
 *  - 127 / a rounds to +inf for bits <= MP_BW8_PRESCALE_MAX: the values are
 *    scaled by 2^64 first, and inv = 127 / (a * 2^64) (finite for all these);
 *  - 127 * (a / 127) overflows for a = FLT_MAX alone (MP_BW8_STEP_DOWN): the
 *    step sent is the next float below a / 127.
 * Why bits and not float comparisons such as `127.0f / a > FLT_MAX`: GCC
 * 13.3 at -O3 (Ubuntu 24.04's) takes such a branch to mean that the operand
 * itself is infinite (or zero), and folds it to that constant; the encoders
 * it built sent step FLT_MAX for a = FLT_MAX and saturated the codes of tiny
 * blocks. An integer comparison gives it nothing to fold.
 */
#define MP_BW8_ZERO_STEP_MAX 0x0000003fu
#define MP_BW8_PRESCALE_MAX 0x02fe0000u
#define MP_BW8_STEP_DOWN 0x7f7fffffu

#endif
