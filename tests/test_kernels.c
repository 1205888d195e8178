/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * CPU kernels: every variant this CPU runs must match the scalar reference
 * bit for bit, and the scalar fp16 conversion must match an independent
 * oracle (nearest representable half found by search, ties to even).
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mp_kernels.h"

static const char *const all_variants[] = {"scalar", "avx2", "avx512"};
#define NALL (sizeof(all_variants) / sizeof(all_variants[0]))

/* xorshift64*: reproducible inputs without depending on libc's rand(). */
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rnd64(void)
{
	rng_state ^= rng_state >> 12;
	rng_state ^= rng_state << 25;
	rng_state ^= rng_state >> 27;
	return rng_state * 0x2545f4914f6cdd1dull;
}

static uint32_t rnd32(void)
{
	return (uint32_t)(rnd64() >> 32);
}

static float bits_f32(uint32_t u)
{
	float f;

	memcpy(&f, &u, sizeof(f));
	return f;
}

static uint32_t f32_bits(float f)
{
	uint32_t u;

	memcpy(&u, &f, sizeof(u));
	return u;
}

/* A float that exercises the fp16 conversion: mostly near or inside its range. */
static float rnd_float(void)
{
	uint32_t r = rnd32();

	switch (r & 7) {
	case 0: /* any bit pattern at all: NaNs, infs, fp32 subnormals */
		return bits_f32(rnd32());
	case 1: /* the fp16 subnormal range and just around it */
		return bits_f32((r & 0x80000000u) | ((uint32_t)(100 + rnd32() % 16) << 23) |
				(rnd32() & 0x7fffffu));
	case 2: /* exactly halfway between two halves: the tie cases */
		return bits_f32((r & 0x80000000u) | ((uint32_t)(103 + rnd32() % 40) << 23) |
				(rnd32() & 0x7fe000u) | 0x1000u);
	case 3: /* around the clamp threshold */
		return bits_f32((r & 0x80000000u) | (0x477fe000u + (rnd32() % 0x8000u) - 0x4000u));
	default: /* the normal fp16 range */
		return bits_f32((r & 0x80000000u) | ((uint32_t)(112 + rnd32() % 32) << 23) |
				(rnd32() & 0x7fffffu));
	}
}

static int force(const char *v)
{
	int rc = mp_k_force(v);

	assert_true(rc == 0 || rc == -ENOTSUP);
	return rc;
}

/* ---- oracle for fp32 -> fp16 ---- */

/* Positive finite halves 0x0000..0x7bff as doubles: increasing with the code. */
static double half_val[0x7c00];

static void oracle_init(void)
{
	for (uint32_t h = 0; h < 0x7c00; h++) {
		uint32_t e = h >> 10, m = h & 0x3ff;

		half_val[h] = e ? ldexp(1.0 + m / 1024.0, (int)e - 15) : ldexp(m, -24);
	}
}

static uint16_t oracle_f16(float f)
{
	uint32_t u = f32_bits(f);
	uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
	double a = fabs((double)f);

	if (isnan(f))
		return (uint16_t)(sign | 0x7e00u | ((u >> 13) & 0x3ffu));
	if (a >= 65504.0)
		return (uint16_t)(sign | 0x7bffu);
	/* Largest half <= a, then pick between it and the next one. */
	uint32_t lo = 0, hi = 0x7bff;

	while (lo < hi) {
		uint32_t mid = (lo + hi + 1) / 2;

		if (half_val[mid] <= a)
			lo = mid;
		else
			hi = mid - 1;
	}
	if (half_val[lo] == a)
		return (uint16_t)(sign | lo);
	double dlo = a - half_val[lo], dhi = half_val[lo + 1] - a;

	if (dlo < dhi || (dlo == dhi && !(lo & 1)))
		return (uint16_t)(sign | lo);
	return (uint16_t)(sign | (lo + 1));
}

/* ---- tests ---- */

static void test_force(void **state)
{
	(void)state;
	assert_int_equal(mp_k_force("scalar"), 0);
	assert_string_equal(mp_k_variant(), "scalar");
	assert_int_equal(mp_k_force("sse9"), -EINVAL);
	assert_int_equal(mp_k_force(NULL), -EINVAL);
	for (size_t v = 0; v < NALL; v++)
		if (force(all_variants[v]) == 0)
			assert_string_equal(mp_k_variant(), all_variants[v]);
	assert_int_equal(mp_k_force("auto"), 0);
	print_message("best variant here: %s\n", mp_k_variant());
}

/* Every half to float and back, in every variant. */
static void test_f16_all_halves(void **state)
{
	uint16_t *h = malloc(65536 * sizeof(*h));
	uint16_t *back = malloc(65536 * sizeof(*back));
	float *ref = malloc(65536 * sizeof(*ref));
	float *f = malloc(65536 * sizeof(*f));

	(void)state;
	assert_non_null(h);
	assert_non_null(back);
	assert_non_null(ref);
	assert_non_null(f);
	for (uint32_t i = 0; i < 65536; i++)
		h[i] = (uint16_t)i;
	assert_int_equal(mp_k_force("scalar"), 0);
	mp_k_f16_to_f32(ref, h, 65536);

	/* Spot checks of the reference against known values. */
	assert_true(ref[0x3c00] == 1.0f);
	assert_true(ref[0xc000] == -2.0f);
	assert_true(ref[0x7bff] == 65504.0f);
	assert_true(ref[0x0001] == ldexpf(1.0f, -24));
	assert_true(ref[0x03ff] == ldexpf(1023.0f, -24));
	assert_true(ref[0x0400] == ldexpf(1.0f, -14));
	assert_true(isinf(ref[0x7c00]) && ref[0x7c00] > 0);
	assert_int_equal(f32_bits(ref[0x8000]), 0x80000000u);
	assert_true(isnan(ref[0x7c01]));
	assert_int_equal(f32_bits(ref[0x7c01]), 0x7fc02000u);
	assert_int_equal(f32_bits(ref[0xfe00]), 0xffc00000u);
	for (uint32_t i = 0; i < 0x7c00; i++)
		assert_true((double)ref[i] == half_val[i]);

	for (size_t v = 0; v < NALL; v++) {
		if (force(all_variants[v]))
			continue;
		mp_k_f16_to_f32(f, h, 65536);
		assert_memory_equal(f, ref, 65536 * sizeof(*f));
		mp_k_f32_to_f16(back, f, 65536);
		for (uint32_t i = 0; i < 65536; i++) {
			uint16_t want = (uint16_t)i;

			if ((i & 0x7fffu) == 0x7c00u) /* inf clamps */
				want = (uint16_t)((i & 0x8000u) | 0x7bffu);
			else if ((i & 0x7fffu) > 0x7c00u) /* NaN comes back quiet */
				want = (uint16_t)(i | 0x0200u);
			if (back[i] != want)
				fail_msg("%s: half %04x -> %08x -> %04x, want %04x", all_variants[v], i,
					 f32_bits(f[i]), back[i], want);
		}
	}
	free(h);
	free(back);
	free(ref);
	free(f);
}

static const float edge_values[] = {
	0.0f, -0.0f, 1.0f, -1.0f, 65504.0f, -65504.0f, 65519.99f, 65520.0f, -65520.0f, 65536.0f,
	1e10f, -1e10f, 3.4028235e38f, -3.4028235e38f, INFINITY, -INFINITY, NAN, -NAN,
	0x1p-14f, 0x1p-24f, 0x1p-25f, -0x1p-25f, 0x1.000002p-25f, 0x1.8p-24f, 0x1.8p-23f,
	0x1.ffcp-15f, 0x1.ffep-15f, 0x1p-149f, -0x1p-149f, 0x1p-126f, 0x1.002p0f, 0x1.006p0f,
	0x1.001p0f, 0x1.003p0f, 0x1.0010002p0f, 65488.0f, 65490.0f, 65500.0f, 1e-8f, 5.96e-8f,
};

static void test_f32_to_f16_random_and_edges(void **state)
{
	enum { N = 1 << 18 };
	float *src = malloc((N + 64) * sizeof(*src));
	uint16_t *ref = malloc(N * sizeof(*ref));
	uint16_t *out = malloc(N * sizeof(*out));
	size_t ne = sizeof(edge_values) / sizeof(edge_values[0]);

	(void)state;
	assert_non_null(src);
	assert_non_null(ref);
	assert_non_null(out);
	for (size_t i = 0; i < ne; i++)
		src[i] = edge_values[i];
	/* NaNs with payloads only in the bits that are dropped must stay NaN. */
	src[ne] = bits_f32(0x7f800001u);
	src[ne + 1] = bits_f32(0xff801fffu);
	src[ne + 2] = bits_f32(0x7fa00000u);
	for (size_t i = ne + 3; i < N; i++)
		src[i] = rnd_float();

	assert_int_equal(mp_k_force("scalar"), 0);
	mp_k_f32_to_f16(ref, src, N);
	for (size_t i = 0; i < N; i++) {
		uint16_t want = oracle_f16(src[i]);

		if (ref[i] != want)
			fail_msg("scalar: %a (%08x) -> %04x, oracle %04x", (double)src[i],
				 f32_bits(src[i]), ref[i], want);
	}
	/* A few facts stated in the contract, independently of the oracle. */
	assert_int_equal(ref[4], 0x7bff);   /* 65504 */
	assert_int_equal(ref[7], 0x7bff);   /* 65520 would be inf unclamped */
	assert_int_equal(ref[8], 0xfbff);
	assert_int_equal(ref[14], 0x7bff);  /* +inf */
	assert_int_equal(ref[15], 0xfbff);  /* -inf */
	assert_true((ref[16] & 0x7c00) == 0x7c00 && (ref[16] & 0x3ff));
	assert_int_equal(ref[19], 0x0001);  /* 2^-24 */
	assert_int_equal(ref[20], 0x0000);  /* 2^-25 ties to even 0 */
	assert_int_equal(ref[21], 0x8000);
	assert_int_equal(ref[22], 0x0001);  /* just above 2^-25 */
	assert_int_equal(ref[ne], 0x7e00);
	assert_int_equal(ref[ne + 1], 0xfe00);

	for (size_t v = 0; v < NALL; v++) {
		if (force(all_variants[v]))
			continue;
		memset(out, 0xa5, N * sizeof(*out));
		mp_k_f32_to_f16(out, src, N);
		for (size_t i = 0; i < N; i++)
			if (out[i] != ref[i])
				fail_msg("%s: %a (%08x) -> %04x, scalar %04x", all_variants[v],
					 (double)src[i], f32_bits(src[i]), out[i], ref[i]);
	}
	free(src);
	free(ref);
	free(out);
}

/*
 * Lengths 0..67 at every small misalignment, with canaries on both sides of
 * the output: the ragged-end code must neither miss nor overrun an element.
 */
static void test_odd_lengths_unaligned(void **state)
{
	enum { MAXN = 67, PAD = 24 };
	float fsrc[MAXN + 2 * PAD], facc0[MAXN + 2 * PAD], facc[MAXN + 2 * PAD], fref[MAXN + 2 * PAD];
	uint16_t hsrc[MAXN + 2 * PAD], hout[MAXN + 2 * PAD], href[MAXN + 2 * PAD];

	(void)state;
	for (size_t i = 0; i < MAXN + 2 * PAD; i++) {
		fsrc[i] = rnd_float();
		if (isnan(fsrc[i]) || isinf(fsrc[i]))
			fsrc[i] = 1.5f;
		hsrc[i] = (uint16_t)rnd32();
		if ((hsrc[i] & 0x7c00) == 0x7c00)
			hsrc[i] = 0x3555;
		facc0[i] = (float)(int)(rnd32() % 2001 - 1000) / 7.0f;
	}
	for (size_t v = 0; v < NALL; v++) {
		if (force(all_variants[v]))
			continue;
		for (size_t n = 0; n <= MAXN; n++) {
			for (size_t so = 0; so < 9; so++) {
				for (size_t dof = 0; dof < 9; dof += 3) {
					size_t s = PAD / 2 + so, d = PAD / 2 + dof;

					/* f32 -> f16 */
					memset(hout, 0x5a, sizeof(hout));
					memset(href, 0x5a, sizeof(href));
					assert_int_equal(mp_k_force("scalar"), 0);
					mp_k_f32_to_f16(href + d, fsrc + s, n);
					assert_int_equal(mp_k_force(all_variants[v]), 0);
					mp_k_f32_to_f16(hout + d, fsrc + s, n);
					assert_memory_equal(hout, href, sizeof(hout));

					/* f16 -> f32 */
					memset(facc, 0x5a, sizeof(facc));
					memset(fref, 0x5a, sizeof(fref));
					assert_int_equal(mp_k_force("scalar"), 0);
					mp_k_f16_to_f32(fref + d, hsrc + s, n);
					assert_int_equal(mp_k_force(all_variants[v]), 0);
					mp_k_f16_to_f32(facc + d, hsrc + s, n);
					assert_memory_equal(facc, fref, sizeof(facc));

					/* f16 axpy */
					memcpy(facc, facc0, sizeof(facc));
					memcpy(fref, facc0, sizeof(fref));
					assert_int_equal(mp_k_force("scalar"), 0);
					mp_k_f16_axpy(fref + d, hsrc + s, 0.3f, n);
					assert_int_equal(mp_k_force(all_variants[v]), 0);
					mp_k_f16_axpy(facc + d, hsrc + s, 0.3f, n);
					assert_memory_equal(facc, fref, sizeof(facc));

					/* axpy */
					memcpy(facc, facc0, sizeof(facc));
					memcpy(fref, facc0, sizeof(fref));
					assert_int_equal(mp_k_force("scalar"), 0);
					mp_k_axpy(fref + d, fsrc + s, -1.7f, n);
					assert_int_equal(mp_k_force(all_variants[v]), 0);
					mp_k_axpy(facc + d, fsrc + s, -1.7f, n);
					assert_memory_equal(facc, fref, sizeof(facc));

					/* scale, out of place */
					memcpy(facc, facc0, sizeof(facc));
					memcpy(fref, facc0, sizeof(fref));
					assert_int_equal(mp_k_force("scalar"), 0);
					mp_k_scale(fref + d, fsrc + s, 0.25f, n);
					assert_int_equal(mp_k_force(all_variants[v]), 0);
					mp_k_scale(facc + d, fsrc + s, 0.25f, n);
					assert_memory_equal(facc, fref, sizeof(facc));
				}
			}
		}
	}
}

/* Large buffers: bit-identical to scalar, and close to a double-precision sum. */
static void test_axpy_large(void **state)
{
	enum { N = 100003 };
	float *x = malloc((N + 1) * sizeof(float));
	float *acc0 = malloc((N + 1) * sizeof(float));
	float *ref = malloc((N + 1) * sizeof(float));
	float *acc = malloc((N + 1) * sizeof(float));
	const float w = 0.37f;

	(void)state;
	assert_non_null(x);
	assert_non_null(acc0);
	assert_non_null(ref);
	assert_non_null(acc);
	for (size_t i = 0; i <= N; i++) {
		x[i] = (float)((int)(rnd32() % 20001) - 10000) * 1e-3f;
		acc0[i] = (float)((int)(rnd32() % 20001) - 10000) * 1e-2f;
	}
	assert_int_equal(mp_k_force("scalar"), 0);
	memcpy(ref, acc0, (N + 1) * sizeof(float));
	mp_k_axpy(ref + 1, x, w, N);
	for (size_t i = 0; i < N; i++) {
		double exact = (double)acc0[i + 1] + (double)w * (double)x[i];
		double tol = (fabs((double)acc0[i + 1]) + fabs((double)w * x[i])) * 0x1p-23;

		assert_true(fabs((double)ref[i + 1] - exact) <= tol);
	}
	for (size_t v = 0; v < NALL; v++) {
		if (force(all_variants[v]))
			continue;
		memcpy(acc, acc0, (N + 1) * sizeof(float));
		mp_k_axpy(acc + 1, x, w, N);
		assert_memory_equal(acc, ref, (N + 1) * sizeof(float));

		/* acc and x may be the same array. */
		memcpy(acc, acc0, (N + 1) * sizeof(float));
		mp_k_axpy(acc, acc, 2.0f, N + 1);
		for (size_t i = 0; i <= N; i++)
			assert_true(acc[i] == 3.0f * acc0[i]);

		/* scale in place */
		memcpy(acc, acc0, (N + 1) * sizeof(float));
		mp_k_scale(acc, acc, 0.5f, N + 1);
		for (size_t i = 0; i <= N; i++)
			assert_true(acc[i] == 0.5f * acc0[i]);
	}
	free(x);
	free(acc0);
	free(ref);
	free(acc);
}

/*
 * The streaming copy, every variant: each length up to a few lines and some
 * long ones, source and destination at every offset within a line, bytes
 * around the destination untouched, and the LLC size the dpdk driver's
 * threshold comes from is plausible.
 */
static void test_copy_stream(void **state)
{
	enum { PAD = 64, BUF = 146 * 64 }; /* a line before, the longest copy plus its offset after */
	static const size_t lens[] = {0, 1, 31, 63, 64, 65, 127, 128, 129, 255, 256, 257, 320, 8958, 9000};
	uint8_t *src = aligned_alloc(64, BUF), *dst = aligned_alloc(64, BUF);
	size_t llc = mp_k_llc_bytes();
	int copies = 0;

	(void)state;
	assert_non_null(src);
	assert_non_null(dst);
	for (size_t i = 0; i < BUF; i++)
		src[i] = (uint8_t)rnd32();
	for (size_t v = 0; v < NALL; v++) {
		if (force(all_variants[v]))
			continue;
		for (size_t li = 0; li < sizeof(lens) / sizeof(lens[0]); li++)
			for (size_t so = 0; so < 64; so += 9)
				for (size_t dof = 0; dof < 64; dof += 5) {
					size_t n = lens[li];
					uint8_t *d = dst + PAD + dof;

					memset(dst, 0xa5, BUF);
					mp_k_copy_stream(d, src + so, n);
					mp_k_stream_fence();
					assert_memory_equal(d, src + so, n);
					for (uint8_t *p = dst; p < d; p++)
						assert_int_equal(*p, 0xa5);
					for (uint8_t *p = d + n; p < dst + BUF; p++)
						assert_int_equal(*p, 0xa5);
					copies++;
				}
	}
	assert_true(copies > 0);
	print_message("last-level cache: %zu KiB\n", llc / 1024);
	/* 0 (unknown) is allowed; a size is between 256 KiB and 4 GiB. */
	assert_true(llc == 0 || (llc >= (256u << 10) && llc <= ((size_t)4 << 30)));
	assert_int_equal(mp_k_force("auto"), 0);
	free(src);
	free(dst);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_force),
		cmocka_unit_test(test_f16_all_halves),
		cmocka_unit_test(test_f32_to_f16_random_and_edges),
		cmocka_unit_test(test_odd_lengths_unaligned),
		cmocka_unit_test(test_axpy_large),
		cmocka_unit_test(test_copy_stream),
	};

	oracle_init();
	return cmocka_run_group_tests(tests, NULL, NULL);
}
