/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Run-time choice of the CPU kernel variant.
 *
 * The variant is picked once per process, on the first kernel call, from the
 * CPU's features (cpuid, with the OS's consent to the wider registers, which
 * __builtin_cpu_supports checks) and MP_KERNELS. All variants give
 * bit-identical results (see reduce.c and fp16.c), so the choice is purely
 * about speed; mp_k_force exists so that the tests can compare them.
 *
 * The current table sits behind one atomic pointer: a kernel call costs one
 * relaxed load and an indirect call, and a concurrent mp_k_force (tests
 * only) is not a data race.
 *
 * Nothing here logs: kernels/ is a leaf under the library, so the choice
 * and what became of MP_KERNELS are kept for the caller to report
 * (mp_k_env_status).
 */
#include "mp_kernels.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels_cpu.h"

#ifdef MP_K_X86
#include <cpuid.h>
#endif

struct kvariant {
	const char *name;
	int level;
	int (*supported)(void);
	void (*axpy)(float *acc, const float *x, float w, size_t n);
	void (*scale)(float *dst, const float *x, float w, size_t n);
	void (*f32_to_f16)(uint16_t *dst, const float *src, size_t n);
	void (*f16_to_f32)(float *dst, const uint16_t *src, size_t n);
	void (*f16_axpy)(float *acc, const uint16_t *src, float w, size_t n);
	void (*copy_stream)(void *dst, const void *src, size_t n);
};

static int have_scalar(void)
{
	return 1;
}

#ifdef MP_K_X86
/* F16C straight from cpuid: not every compiler's __builtin_cpu_supports knows it. */
static int have_f16c(void)
{
	unsigned a, b, c, d;

	return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
}

static int have_avx2(void)
{
	/* __builtin_cpu_supports also checks that the OS saves the YMM state. */
	__builtin_cpu_init();
	return __builtin_cpu_supports("avx2") && have_f16c();
}

static int have_avx512(void)
{
	/* F, BW, VL and DQ together: every AVX-512 server core since Skylake-SP
	 * has them, and the 8-bit codec kernels need byte and word lanes. */
	__builtin_cpu_init();
	return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
	       __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
}
#endif

/* Best first. */
static const struct kvariant variants[] = {
#ifdef MP_K_X86
	{"avx512", MP_K_AVX512, have_avx512, mp_kcpu_axpy_avx512, mp_kcpu_scale_avx512, mp_kcpu_f32_to_f16_avx512,
	 mp_kcpu_f16_to_f32_avx512, mp_kcpu_f16_axpy_avx512, mp_kcpu_copy_stream_avx512},
	{"avx2", MP_K_AVX2, have_avx2, mp_kcpu_axpy_avx2, mp_kcpu_scale_avx2, mp_kcpu_f32_to_f16_avx2,
	 mp_kcpu_f16_to_f32_avx2, mp_kcpu_f16_axpy_avx2, mp_kcpu_copy_stream_avx2},
#endif
	{"scalar", MP_K_SCALAR, have_scalar, mp_kcpu_axpy_scalar, mp_kcpu_scale_scalar, mp_kcpu_f32_to_f16_scalar,
	 mp_kcpu_f16_to_f32_scalar, mp_kcpu_f16_axpy_scalar, mp_kcpu_copy_stream_scalar},
};
#define NVARIANTS (sizeof(variants) / sizeof(variants[0]))

static _Atomic(const struct kvariant *) cur;
static pthread_once_t cur_once = PTHREAD_ONCE_INIT;
/* What pick() made of MP_KERNELS; written before cur is published. */
static int env_rc;
static char env_val[64];

static const struct kvariant *find(const char *name)
{
	for (size_t i = 0; i < NVARIANTS; i++)
		if (!strcmp(variants[i].name, name))
			return &variants[i];
	return NULL;
}

static const struct kvariant *best(void)
{
	for (size_t i = 0; i < NVARIANTS; i++)
		if (variants[i].supported())
			return &variants[i];
	return &variants[NVARIANTS - 1];
}

static void pick(void)
{
	const struct kvariant *v = best();
	const char *env = getenv("MP_KERNELS");

	if (env && *env && strcmp(env, "auto") != 0) {
		const struct kvariant *want = find(env);

		/* A copy: a later setenv may free the environment's string. */
		snprintf(env_val, sizeof(env_val), "%s", env);
		if (!want)
			env_rc = -EINVAL;
		else if (!want->supported())
			env_rc = -ENOTSUP;
		else
			v = want;
	}
	atomic_store_explicit(&cur, v, memory_order_release);
}

static inline const struct kvariant *kv(void)
{
	const struct kvariant *v = atomic_load_explicit(&cur, memory_order_acquire);

	if (__builtin_expect(v == NULL, 0)) {
		pthread_once(&cur_once, pick);
		v = atomic_load_explicit(&cur, memory_order_acquire);
	}
	return v;
}

void mp_k_axpy(float *acc, const float *x, float w, size_t n)
{
	kv()->axpy(acc, x, w, n);
}

void mp_k_scale(float *dst, const float *x, float w, size_t n)
{
	kv()->scale(dst, x, w, n);
}

void mp_k_wmean(float *dst, int n, const float *w, float wsum, size_t len,
		float *(*at)(void *arg, int i), void *arg)
{
	float *acc = at(arg, 0);

	mp_k_scale(acc, acc, w[0], len);
	for (int i = 1; i < n; i++)
		mp_k_axpy(acc, at(arg, i), w[i], len);
	mp_k_scale(dst, acc, 1.0f / wsum, len);
}

void mp_k_f32_to_f16(uint16_t *dst, const float *src, size_t n)
{
	kv()->f32_to_f16(dst, src, n);
}

void mp_k_f16_to_f32(float *dst, const uint16_t *src, size_t n)
{
	kv()->f16_to_f32(dst, src, n);
}

void mp_k_f16_axpy(float *acc, const uint16_t *src, float w, size_t n)
{
	kv()->f16_axpy(acc, src, w, n);
}

void mp_k_copy_stream(void *dst, const void *src, size_t n)
{
	kv()->copy_stream(dst, src, n);
}

int mp_k_level(void)
{
	return kv()->level;
}

const char *mp_k_variant(void)
{
	return kv()->name;
}

int mp_k_env_status(const char **env)
{
	kv(); /* the pick, and with it env_rc, happens before this returns */
	if (env)
		*env = env_val[0] ? env_val : NULL;
	return env_rc;
}

int mp_k_force(const char *variant)
{
	const struct kvariant *v;

	if (!variant)
		return -EINVAL;
	/* Run the one-time pick first so that it cannot overwrite this choice later. */
	kv();
	if (!strcmp(variant, "auto")) {
		v = best();
	} else {
		v = find(variant);
		if (!v) {
#ifndef MP_K_X86
			/* Known names of vector variants this build has none of. */
			if (!strcmp(variant, "avx2") || !strcmp(variant, "avx512"))
				return -ENOTSUP;
#endif
			return -EINVAL;
		}
		if (!v->supported())
			return -ENOTSUP;
	}
	atomic_store_explicit(&cur, v, memory_order_release);
	return 0;
}
