/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Private to kernels/cpu: the variant entry points that dispatch.c chooses
 * between, and the barrier that keeps every variant bit-identical.
 */
#ifndef MP_KERNELS_CPU_H
#define MP_KERNELS_CPU_H

#include <stddef.h>
#include <stdint.h>

#if defined(__x86_64__) || defined(__i386__)
#define MP_K_X86 1
#include <immintrin.h>
#endif

/* Kept out of the shared library's symbol table. */
#define MP_K_HIDDEN __attribute__((visibility("hidden")))

MP_K_HIDDEN void mp_kcpu_axpy_scalar(float *acc, const float *x, float w, size_t n);
MP_K_HIDDEN void mp_kcpu_scale_scalar(float *dst, const float *x, float w, size_t n);
MP_K_HIDDEN void mp_kcpu_f32_to_f16_scalar(uint16_t *dst, const float *src, size_t n);
MP_K_HIDDEN void mp_kcpu_f16_to_f32_scalar(float *dst, const uint16_t *src, size_t n);
MP_K_HIDDEN void mp_kcpu_f16_axpy_scalar(float *acc, const uint16_t *src, float w, size_t n);
MP_K_HIDDEN void mp_kcpu_copy_stream_scalar(void *dst, const void *src, size_t n);
#ifdef MP_K_X86
MP_K_HIDDEN void mp_kcpu_axpy_avx2(float *acc, const float *x, float w, size_t n);
MP_K_HIDDEN void mp_kcpu_scale_avx2(float *dst, const float *x, float w, size_t n);
MP_K_HIDDEN void mp_kcpu_f32_to_f16_avx2(uint16_t *dst, const float *src, size_t n);
MP_K_HIDDEN void mp_kcpu_f16_to_f32_avx2(float *dst, const uint16_t *src, size_t n);
MP_K_HIDDEN void mp_kcpu_f16_axpy_avx2(float *acc, const uint16_t *src, float w, size_t n);
MP_K_HIDDEN void mp_kcpu_copy_stream_avx2(void *dst, const void *src, size_t n);
MP_K_HIDDEN void mp_kcpu_axpy_avx512(float *acc, const float *x, float w, size_t n);
MP_K_HIDDEN void mp_kcpu_scale_avx512(float *dst, const float *x, float w, size_t n);
MP_K_HIDDEN void mp_kcpu_f32_to_f16_avx512(uint16_t *dst, const float *src, size_t n);
MP_K_HIDDEN void mp_kcpu_f16_to_f32_avx512(float *dst, const uint16_t *src, size_t n);
MP_K_HIDDEN void mp_kcpu_f16_axpy_avx512(float *acc, const uint16_t *src, float w, size_t n);
MP_K_HIDDEN void mp_kcpu_copy_stream_avx512(void *dst, const void *src, size_t n);
#endif

/*
 * Opaque to the optimiser, free at run time: the value must be materialised
 * as it is, so a following add cannot be fused with the multiply before it
 * (GCC's target("avx512f") turns FMA on even without -mfma).
 */
#ifdef MP_K_X86
#define NOFUSE(v) __asm__("" : "+x"(v))
#define NOFUSE_V(v) __asm__("" : "+v"(v))
#else
/* Without vector variants there is nothing to stay identical to. */
#define NOFUSE(v) ((void)0)
#endif

/*
 * The scalar loops only need the barrier where the baseline target has FMA
 * (-march=haswell and newer); elsewhere leaving it out lets GCC vectorise
 * them with SSE2, which rounds exactly the same way.
 */
#if defined(__FMA__) || defined(__FMA4__) || defined(__FP_FAST_FMAF)
#define NOFUSE_SCALAR(v) NOFUSE(v)
#else
#define NOFUSE_SCALAR(v) ((void)0)
#endif

#endif
