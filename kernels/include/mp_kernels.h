/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * CPU compute kernels (kernels/cpu). Each has a scalar reference and vector
 * versions picked once at run time from the CPU's features; MP_KERNELS=scalar
 * (or avx2, avx512) forces one.
 *
 * The API of kernels/, which includes nothing of the library above it: the
 * kernels log nothing, their callers report the choice (mp_k_env_status).
 */
#ifndef MP_KERNELS_H
#define MP_KERNELS_H

#include <stddef.h>
#include <stdint.h>

/* acc[i] += w * x[i] */
void mp_k_axpy(float *acc, const float *x, float w, size_t n);
/* dst[i] = w * x[i] (dst may equal x) */
void mp_k_scale(float *dst, const float *x, float w, size_t n);
/*
 * A reducer's weighted mean of n contributions of len values each, x_i =
 * at(arg, i): acc = w[0]·x_0, then acc += w[i]·x_i for i = 1..n-1 in that
 * order, then dst = acc·(1/wsum). The fixed order makes the bits independent
 * of arrival order. The accumulator is x_0 itself (overwritten); dst may be
 * any of the contributions. The group all-reduce and tools/mpsim share it.
 */
void mp_k_wmean(float *dst, int n, const float *w, float wsum, size_t len,
		float *(*at)(void *arg, int i), void *arg);
/* dst[i] = fp16(src[i]), round to nearest even, clamped to +-65504; NaN stays NaN */
void mp_k_f32_to_f16(uint16_t *dst, const float *src, size_t n);
/* dst[i] = float(src[i]) */
void mp_k_f16_to_f32(float *dst, const uint16_t *src, size_t n);
/* acc[i] += w * float(src[i]) */
void mp_k_f16_axpy(float *acc, const uint16_t *src, float w, size_t n);
/*
 * dst = src (n bytes, no alignment needed, no overlap) with non-temporal
 * stores: the destination's lines are written to memory without being read
 * first or kept in the caches (kernels/cpu/copy.c says when that pays). The
 * scalar variant is plain memcpy. The stores are weakly ordered:
 * mp_k_stream_fence() before another thread may look at dst.
 */
void mp_k_copy_stream(void *dst, const void *src, size_t n);
/* Orders every mp_k_copy_stream store before the stores that follow it. */
void mp_k_stream_fence(void);
/* Bytes of this CPU's last-level cache as the system reports it; 0 unknown. */
size_t mp_k_llc_bytes(void);
/*
 * The size from which a copy that lands a shard should stream
 * (mp_k_copy_stream): a quarter of the last-level cache, 8 MiB when its size
 * is unknown. Smaller shards are better left in the cache for whoever reads
 * them next.
 */
size_t mp_k_stream_min(void);

/* Variant levels, for kernel families that keep their own variant tables. */
#define MP_K_SCALAR 0
#define MP_K_AVX2 1
#define MP_K_AVX512 2
/* Level of the variant in use (one relaxed load once the choice is made). */
int mp_k_level(void);

/* Name of the variant in use ("scalar", "avx2", "avx512"). */
const char *mp_k_variant(void);
/*
 * What the once-per-process choice made of MP_KERNELS, for the caller to
 * report: 0 if it was followed (or unset, empty or "auto"); -EINVAL if it
 * names no variant, -ENOTSUP if this CPU cannot run the one it names (the
 * best variant is used then). *env (if @env) gets the value read, or NULL
 * if MP_KERNELS was unset, empty or "auto". Makes the choice if not yet made.
 */
int mp_k_env_status(const char **env);
/* Force a variant (tests); returns 0 or -ENOTSUP if the CPU lacks it. */
int mp_k_force(const char *variant);

#endif
