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

#endif
