/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Private to the codecs (src/codec_quant.c): CPU kernels of the bf16,
 * uniform8 and blockwise8 wire codecs (quant.c). Byte layouts and encode
 * rules are those of the codec spec; these functions do the per-element work
 * and leave framing and payload validation to the codec.
 *
 * Each entry point picks its variant (scalar, AVX2, AVX-512) from
 * mp_k_level(), and every variant gives the same bits. Wire-side pointers
 * (bf16 payloads, scales, codes) may have any alignment; float arrays need
 * natural float alignment. n may be 0.
 */
#ifndef MP_KCPU_QUANT_H
#define MP_KCPU_QUANT_H

#include <stddef.h>
#include <stdint.h>

#include "kernels_cpu.h"

/* ---- bf16: n little-endian u16 at @dst / @src ---- */

/* dst = bf16(src): round to nearest even, clamp to +-0x7f7f, NaN kept quiet. */
MP_K_HIDDEN void mp_kq_bf16_encode(void *dst, const float *src, size_t n);
/* dst[i] = float(src[i]) (exact: the bits shifted left by 16). */
MP_K_HIDDEN void mp_kq_bf16_decode(float *dst, const void *src, size_t n);
/* acc[i] += w * float(src[i]), product rounded before the add. */
MP_K_HIDDEN void mp_kq_bf16_decode_acc(float *acc, const void *src, float w, size_t n);

/* ---- uniform8 ---- */

/*
 * Sum and sum of squares (double) of the finite elements of src[0..n), in
 * the spec's order: 16 interleaved lanes, combined by the fixed pairwise
 * tree. *nfinite gets their number.
 */
MP_K_HIDDEN void mp_kq_u8_moments(const float *src, size_t n, double *sum, double *sumsq,
				  size_t *nfinite);

/*
 * The uniform8 table of bucket means is built from a systematic sample: only
 * element i of the encoded chunk with i % MP_KQ_U8_SAMPLE == 0 feeds it (codec
 * spec). Every element used to cost a dependent read-modify-write of its
 * bucket's double sums, which must stay in element order; one in 16 makes
 * that a fraction of the encode (one in 8 did not bring it to half of
 * memcpy's rate), and the mean of a bucket's samples still lies in the
 * bucket. Part of the format: every encoder must use the same value.
 */
#define MP_KQ_U8_SAMPLE 16

/* A uniform8 bucket: the sum (double, element order) and number of its sampled finite inputs. */
struct mp_kq_u8_bucket {
	double sum;
	double count; /* exact: integers up to 2^53 */
};

/*
 * codes[i] = clamp(floor((x - lo) * inv), 0, 255) with x = src[i], a NaN
 * replaced by @nan_as first, for every i; and, for every finite src[i] with
 * i % MP_KQ_U8_SAMPLE == 0 (i counted from @src), in element order,
 * hist[codes[i]].sum += src[i] (double), .count += 1. The histogram is added
 * to, not cleared (start it at +0.0, not -0.0: see quant.c). lo and inv must
 * be finite, inv > 0. @finite: nonzero promises that every src[i] is finite
 * (mp_kq_u8_moments counted n of them), which spares the NaN replacement.
 */
MP_K_HIDDEN void mp_kq_u8_quantize(uint8_t *codes, struct mp_kq_u8_bucket hist[256], const float *src,
				   size_t n, float lo, float inv, float nan_as, int finite);
/* For tests: nonzero keeps the AVX2 statistics loop off FMA (the bits are the same). */
MP_K_HIDDEN extern int mp_kq_avoid_fma;

/* dst[i] = table[codes[i]] */
MP_K_HIDDEN void mp_kq_u8_decode(float *dst, const uint8_t *codes, const float table[256], size_t n);
/* acc[i] += w * table[codes[i]], product rounded before the add. */
MP_K_HIDDEN void mp_kq_u8_decode_acc(float *acc, const uint8_t *codes, const float table[256],
				     float w, size_t n);

/* ---- blockwise8: nb = ceil(n / block) scales (f32 LE), n codes (i8) ---- */

/*
 * Per block of @block (>= 1) values, a = the largest finite |x|: writes the
 * step s = a / 127 to @steps and q = round-half-even(x * 127 / a), clamped to
 * +-127 (NaN: 0), to @codes; s = 0 and codes 0 if a or s is 0; s is one float
 * lower where 127 * s would overflow. (For a below 127 / FLT_MAX, and for
 * that step, see bw8_block_params in quant.c.)
 */
MP_K_HIDDEN void mp_kq_bw8_encode(void *steps, void *codes, const float *src, size_t n,
				  uint32_t block);
/* dst[i] = (float)code[i] * step[i / block]; the steps must be finite. */
MP_K_HIDDEN void mp_kq_bw8_decode(float *dst, const void *steps, const void *codes, size_t n,
				  uint32_t block);
/* acc[i] += w * ((float)code[i] * step[i / block]), each product rounded. */
MP_K_HIDDEN void mp_kq_bw8_decode_acc(float *acc, const void *steps, const void *codes, float w,
				      size_t n, uint32_t block);

#endif
