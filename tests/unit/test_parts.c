/* SPDX-License-Identifier: BSD-3-Clause */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "parts.h"

static void expect_split(uint64_t total, const double *w, int n, const uint64_t *want)
{
	uint64_t parts[16];

	assert_true(n <= 16);
	assert_int_equal(mp_parts_split(total, w, n, parts), 0);
	for (int i = 0; i < n; i++)
		assert_true(parts[i] == want[i]);
}

static uint64_t sum_parts(const uint64_t *p, int n)
{
	uint64_t s = 0;

	for (int i = 0; i < n; i++)
		s += p[i];
	return s;
}

static void test_equal(void **st)
{
	(void)st;
	expect_split(10, NULL, 3, (const uint64_t[]){ 4, 3, 3 });
	expect_split(11, NULL, 3, (const uint64_t[]){ 4, 4, 3 });
	expect_split(2, NULL, 4, (const uint64_t[]){ 1, 1, 0, 0 });
	expect_split(0, NULL, 2, (const uint64_t[]){ 0, 0 });
	expect_split(7, NULL, 1, (const uint64_t[]){ 7 });
	/* equal explicit weights give the same split as NULL */
	expect_split(10, (const double[]){ 2, 2, 2 }, 3, (const uint64_t[]){ 4, 3, 3 });
	expect_split(11, (const double[]){ 0.1, 0.1, 0.1 }, 3, (const uint64_t[]){ 4, 4, 3 });
}

static void test_proportional(void **st)
{
	(void)st;
	expect_split(4, (const double[]){ 1, 2, 1 }, 3, (const uint64_t[]){ 1, 2, 1 });
	expect_split(100, (const double[]){ 1, 2, 1 }, 3, (const uint64_t[]){ 25, 50, 25 });
	/* 10 * (1,2,1)/4 = 2.5, 5, 2.5: the tie goes to the lower index */
	expect_split(10, (const double[]){ 1, 2, 1 }, 3, (const uint64_t[]){ 3, 5, 2 });
	/* 7 * (1,1,5)/7 */
	expect_split(7, (const double[]){ 1, 1, 5 }, 3, (const uint64_t[]){ 1, 1, 5 });
	/* 10 * (3,3,4)/10 with non-integer weights */
	expect_split(10, (const double[]){ 0.3, 0.3, 0.4 }, 3, (const uint64_t[]){ 3, 3, 4 });
	expect_split(5, (const double[]){ 1, 3 }, 2, (const uint64_t[]){ 1, 4 });
	/* 5 * 1/4 = 1.25, 5 * 3/4 = 3.75: remainder to the larger fraction */
	expect_split(6, (const double[]){ 1, 3 }, 2, (const uint64_t[]){ 2, 4 });
	/* huge and tiny scales behave alike */
	expect_split(100, (const double[]){ 1e300, 2e300, 1e300 }, 3,
		     (const uint64_t[]){ 25, 50, 25 });
	expect_split(100, (const double[]){ 1e-300, 2e-300, 1e-300 }, 3,
		     (const uint64_t[]){ 25, 50, 25 });
	expect_split(100, (const double[]){ 5e-324, 5e-324 }, 2, (const uint64_t[]){ 50, 50 });
}

static void test_zero_weight(void **st)
{
	(void)st;
	expect_split(10, (const double[]){ 0, 1, 1 }, 3, (const uint64_t[]){ 0, 5, 5 });
	expect_split(11, (const double[]){ 1, 0, 1 }, 3, (const uint64_t[]){ 6, 0, 5 });
	expect_split(3, (const double[]){ 0, 0, 1, 0 }, 4, (const uint64_t[]){ 0, 0, 3, 0 });
	expect_split(10, (const double[]){ 1, 0, 1, 1 }, 4, (const uint64_t[]){ 4, 0, 3, 3 });
}

static void test_unknown(void **st)
{
	(void)st;
	/* unknown = mean(1, 3) = 2 */
	expect_split(6, (const double[]){ 1, 3, -1 }, 3, (const uint64_t[]){ 1, 3, 2 });
	expect_split(60, (const double[]){ -1, 1, 3 }, 3, (const uint64_t[]){ 20, 10, 30 });
	/* zeros do not count toward the mean: mean(2) = 2 */
	expect_split(9, (const double[]){ 2, 0, -5 }, 3, (const uint64_t[]){ 5, 0, 4 });
	/* mean of 1 and 2 is 1.5, exactly: 9 * (1, 2, 1.5)/4.5 */
	expect_split(9, (const double[]){ 1, 2, -1 }, 3, (const uint64_t[]){ 2, 4, 3 });
	/* two unknowns */
	expect_split(12, (const double[]){ -1, 2, -1 }, 3, (const uint64_t[]){ 4, 4, 4 });
}

static void test_invalid(void **st)
{
	uint64_t parts[4] = { 9, 9, 9, 9 };

	(void)st;
	assert_int_equal(mp_parts_split(10, (const double[]){ 0, 0, 0 }, 3, parts), -EINVAL);
	assert_int_equal(mp_parts_split(10, (const double[]){ -1, -1 }, 2, parts), -EINVAL);
	assert_int_equal(mp_parts_split(10, (const double[]){ 1, NAN }, 2, parts), -EINVAL);
	assert_int_equal(mp_parts_split(10, (const double[]){ INFINITY, 1 }, 2, parts), -EINVAL);
	assert_int_equal(mp_parts_split(10, (const double[]){ -INFINITY, 1 }, 2, parts), -EINVAL);
	assert_int_equal(mp_parts_split(10, NULL, 0, parts), -EINVAL);
	assert_int_equal(mp_parts_split(10, NULL, -2, parts), -EINVAL);
	assert_int_equal(mp_parts_split(10, (const double[]){ 1 }, 0, parts), -EINVAL);
}

/*
 * Reference: the shares computed independently in long double. Weights are
 * quantised to (63 - 2 * log2 n) bits or more inside the split, so allow for
 * that on top of the one element that largest remainder may move.
 */
static void check_against_reference(uint64_t total, const double *w, int n)
{
	uint64_t *parts = calloc((size_t)n, sizeof(*parts));
	long double known = 0, cnt = 0, mean, sum = 0, tol;
	long double *share = calloc((size_t)n, sizeof(*share));

	assert_true(parts && share);
	assert_int_equal(mp_parts_split(total, w, n, parts), 0);
	assert_true(sum_parts(parts, n) == total);
	for (int i = 0; i < n; i++)
		if (w[i] > 0) {
			known += w[i];
			cnt++;
		}
	mean = known / cnt;
	tol = 1.0L + (long double)total * 0x1p-36L;
	for (int i = 0; i < n; i++)
		sum += w[i] > 0 ? w[i] : w[i] < 0 ? mean : 0;
	for (int i = 0; i < n; i++) {
		share[i] = (long double)total * (w[i] > 0 ? w[i] : w[i] < 0 ? mean : 0) / sum;
		/* largest remainder never moves a part by a whole element */
		assert_true((long double)parts[i] > share[i] - tol);
		assert_true((long double)parts[i] < share[i] + tol);
		if (w[i] == 0)
			assert_true(parts[i] == 0);
	}
	free(parts);
	free(share);
}

static void test_exact_sums(void **st)
{
	uint64_t parts[1000];
	double w[1000];
	uint64_t seed = 12345;

	(void)st;
	for (int n = 1; n <= 1000; n = n * 3 + 1) {
		for (uint64_t total = 0; total < 50; total += 7) {
			assert_int_equal(mp_parts_split(total, NULL, n, parts), 0);
			assert_true(sum_parts(parts, n) == total);
		}
	}
	for (int trial = 0; trial < 200; trial++) {
		int n = 1 + (int)(trial * 37 % 1000);
		uint64_t totals[] = { 0, 1, (uint64_t)n - 1, 1000003, 1ULL << 40,
				      (1ULL << 40) + 12345, UINT64_MAX, UINT64_MAX - 7 };

		for (int i = 0; i < n; i++) {
			seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
			w[i] = (double)(seed >> 40) / 1000.0;
			if (seed % 11 == 0)
				w[i] = 0;
			else if (seed % 13 == 0)
				w[i] = -1;
		}
		w[0] = 1.5;
		for (size_t k = 0; k < sizeof(totals) / sizeof(totals[0]); k++) {
			assert_int_equal(mp_parts_split(totals[k], w, n, parts), 0);
			assert_true(sum_parts(parts, n) == totals[k]);
			for (int i = 0; i < n; i++)
				if (w[i] == 0)
					assert_true(parts[i] == 0);
		}
		check_against_reference(1000003, w, n);
		check_against_reference(1ULL << 40, w, n);
	}
}

static void test_many_parts(void **st)
{
	const int n = 100000;
	uint64_t *parts = calloc((size_t)n, sizeof(*parts));
	double *w = calloc((size_t)n, sizeof(*w));

	(void)st;
	assert_true(parts && w);
	for (int i = 0; i < n; i++)
		w[i] = (i % 3) ? 1.0 + i % 7 : -1.0;
	assert_int_equal(mp_parts_split(1ULL << 40, w, n, parts), 0);
	assert_true(sum_parts(parts, n) == 1ULL << 40);
	assert_int_equal(mp_parts_split(12345, w, n, parts), 0);
	assert_true(sum_parts(parts, n) == 12345);
	assert_int_equal(mp_parts_split(UINT64_MAX, NULL, n, parts), 0);
	assert_true(sum_parts(parts, n) == UINT64_MAX);
	free(parts);
	free(w);
}

static void test_deterministic(void **st)
{
	double w[64];
	uint64_t a[64], b[64];

	(void)st;
	for (int i = 0; i < 64; i++)
		w[i] = 1.0 / (1 + i % 5) + (i % 4 == 0 ? 0.0 : 1e-9 * i);
	w[10] = -1;
	w[20] = 0;
	for (uint64_t total = 1; total < 5000; total += 97) {
		memset(a, 0xaa, sizeof(a));
		memset(b, 0x55, sizeof(b));
		assert_int_equal(mp_parts_split(total, w, 64, a), 0);
		assert_int_equal(mp_parts_split(total, w, 64, b), 0);
		assert_memory_equal(a, b, sizeof(a));
		assert_true(sum_parts(a, 64) == total);
	}
	/* scaling every weight by a power of two changes nothing */
	for (int i = 0; i < 64; i++)
		if (w[i] > 0)
			w[i] *= 1024.0;
	assert_int_equal(mp_parts_split(4999, w, 64, b), 0);
	for (int i = 0; i < 64; i++)
		if (w[i] > 0)
			w[i] /= 1024.0;
	assert_int_equal(mp_parts_split(4999, w, 64, a), 0);
	assert_memory_equal(a, b, sizeof(a));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_equal),
		cmocka_unit_test(test_proportional),
		cmocka_unit_test(test_zero_weight),
		cmocka_unit_test(test_unknown),
		cmocka_unit_test(test_invalid),
		cmocka_unit_test(test_exact_sums),
		cmocka_unit_test(test_many_parts),
		cmocka_unit_test(test_deterministic),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
