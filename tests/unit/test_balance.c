/* SPDX-License-Identifier: BSD-3-Clause */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <math.h>
#include <string.h>

#include <moshpit/moshpit.h>

#define MAXN 64

static uint64_t sum_parts(const uint64_t *p, int n)
{
	uint64_t s = 0;

	for (int i = 0; i < n; i++)
		s += p[i];
	return s;
}

static void expect_parts(uint64_t total, const double *bw, int n, uint64_t min_part,
			 const uint64_t *want)
{
	uint64_t parts[MAXN];

	assert_true(n <= MAXN);
	assert_int_equal(mp_balance_parts(total, bw, n, min_part, parts), 0);
	for (int i = 0; i < n; i++) {
		if (parts[i] != want[i])
			fail_msg("part %d: %llu, want %llu", i, (unsigned long long)parts[i],
				 (unsigned long long)want[i]);
	}
}

/* splitmix64: the same sequence on every host */
static uint64_t rnd_next(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static double rnd_unit(uint64_t *s)
{
	return (double)(rnd_next(s) >> 11) / 9007199254740992.0;
}

/* The bandwidths the LP sees: unknown = mean of the known, none known = 1. */
static void resolve(const double *bw, int n, double *b)
{
	double sum = 0.0;
	int known = 0;

	for (int i = 0; i < n; i++)
		if (bw[i] > 0) {
			sum += bw[i];
			known++;
		}
	for (int i = 0; i < n; i++)
		b[i] = bw[i] > 0 ? bw[i] : bw[i] < 0 ? (known ? sum / known : 1.0) : 0.0;
}

/*
 * The reducers' time by bisection, independent of the water-filling in the
 * library: at time xi peer i can reduce at most max(0, (xi·b_i - 1)/(n - 2)),
 * and xi is achievable iff those capacities cover the whole vector.
 */
static double lp_bisect(const double *b, int n)
{
	double lo = 0.0, hi, bmax = 0.0;

	for (int i = 0; i < n; i++)
		if (b[i] > bmax)
			bmax = b[i];
	hi = (n - 1) / bmax; /* the fastest peer alone can reduce everything */
	for (int it = 0; it < 200; it++) {
		double mid = 0.5 * (lo + hi), cap = 0.0;

		for (int i = 0; i < n; i++)
			if (b[i] > 0 && mid * b[i] > 1.0)
				cap += (mid * b[i] - 1.0) / (n - 2);
		if (cap >= 1.0)
			hi = mid;
		else
			lo = mid;
	}
	return hi;
}

static double bmin_of(const double *b, int n)
{
	double m = INFINITY;

	for (int i = 0; i < n; i++)
		if (b[i] > 0 && b[i] < m)
			m = b[i];
	return m;
}

/* Largest time of the integer split, over every peer or over reducers only. */
static double split_cost(const uint64_t *parts, const double *b, int n, uint64_t total,
			 int reducers_only)
{
	double c = 0.0;

	for (int i = 0; i < n; i++) {
		double t;

		if (b[i] <= 0 || (reducers_only && !parts[i]))
			continue;
		t = (1.0 + (n - 2) * ((double)parts[i] / (double)total)) / b[i];
		if (t > c)
			c = t;
	}
	return c;
}

/*
 * The split is optimal up to one value of rounding: the reducers take no
 * longer than the LP's xi, every peer no longer than max(xi, 1/b_min) (a
 * slow peer's own vector takes 1/b whatever it reduces), and, as a feasible
 * point of the LP, not less either.
 */
static void check_optimal(const double *bw, int n, uint64_t total, const uint64_t *parts)
{
	double b[MAXN], xi, bmin, slack, opt, all;

	resolve(bw, n, b);
	xi = lp_bisect(b, n);
	bmin = bmin_of(b, n);
	slack = (n - 2) / ((double)total * bmin);
	opt = fmax(xi, 1.0 / bmin);
	all = split_cost(parts, b, n, total, 0);
	if (split_cost(parts, b, n, total, 1) > xi * (1 + 1e-9) + slack)
		fail_msg("n %d total %llu: reducers %.17g, LP %.17g", n, (unsigned long long)total,
			 split_cost(parts, b, n, total, 1), xi);
	if (all > opt * (1 + 1e-9) + slack)
		fail_msg("n %d total %llu: cost %.17g, LP %.17g", n, (unsigned long long)total,
			 all, opt);
	assert_true(all >= opt * (1 - 1e-9));
}

static void test_equal(void **st)
{
	static const int ns[] = { 1, 2, 3, 4, 5, 8, 13, 16, 64 };
	static const uint64_t totals[] = { 1, 7, 100, 1000003, (1ull << 40) + 5, UINT64_MAX };
	double bw[MAXN];
	uint64_t parts[MAXN];

	(void)st;
	for (int i = 0; i < MAXN; i++)
		bw[i] = 3.5;
	for (size_t a = 0; a < sizeof(ns) / sizeof(ns[0]); a++) {
		for (size_t t = 0; t < sizeof(totals) / sizeof(totals[0]); t++) {
			uint64_t total = totals[t], base = total / (uint64_t)ns[a];
			uint64_t extra = total % (uint64_t)ns[a];

			assert_int_equal(mp_balance_parts(total, bw, ns[a], 0, parts), 0);
			assert_true(sum_parts(parts, ns[a]) == total);
			/* the extra values go to the lower indices */
			for (int i = 0; i < ns[a]; i++)
				assert_true(parts[i] == base + ((uint64_t)i < extra ? 1 : 0));
		}
	}
}

static void test_worked_example(void **st)
{
	double b[4];
	uint64_t parts[4];

	(void)st;
	/* xi = (4 - 2 + 2)/(400 + 800) = 1/300; w = 1/6, 5/6; 100 and 200 reduce nothing */
	expect_parts(1000000, (const double[]){ 100, 200, 400, 800 }, 4, 0,
		     (const uint64_t[]){ 0, 0, 166667, 833333 });
	assert_int_equal(mp_balance_parts(1000000, (const double[]){ 100, 200, 400, 800 }, 4, 0,
					  parts), 0);
	resolve((const double[]){ 100, 200, 400, 800 }, 4, b);
	assert_true(fabs(lp_bisect(b, 4) - 1.0 / 300) < 1e-12);
	check_optimal((const double[]){ 100, 200, 400, 800 }, 4, 1000000, parts);
	/* every peer reduces: xi = 6/370, w = 23/74 (x3) and 5/74 */
	expect_parts(1000, (const double[]){ 100, 100, 100, 70 }, 4, 0,
		     (const uint64_t[]){ 311, 311, 311, 67 });
	/* n = 2: proportional, 100 * 100/101 = 99.01 */
	expect_parts(100, (const double[]){ 100, 1 }, 2, 0, (const uint64_t[]){ 99, 1 });
	expect_parts(100, (const double[]){ 1, 3 }, 2, 0, (const uint64_t[]){ 25, 75 });
	expect_parts(12345, (const double[]){ 42 }, 1, 0, (const uint64_t[]){ 12345 });
	/* the largest total */
	assert_int_equal(mp_balance_parts(UINT64_MAX, (const double[]){ 1, 2, 3, 4 }, 4, 0, parts),
			 0);
	assert_true(sum_parts(parts, 4) == UINT64_MAX);
}

static void test_random_optimal(void **st)
{
	uint64_t seed = 20210601, parts[16], again[16];
	double bw[16], scaled[16];
	int with_reducers_below_all = 0;

	(void)st;
	for (int c = 0; c < 200; c++) {
		int n = 2 + (int)(rnd_next(&seed) % 15), clients = 0;
		uint64_t total = 1 + (rnd_next(&seed) >> (24 + rnd_next(&seed) % 40));
		double b[16];

		for (int i = 0; i < n; i++) {
			uint64_t kind = rnd_next(&seed) % 10;

			/* log-uniform over three decades, some clients and unknowns */
			bw[i] = exp(log(1000.0) * rnd_unit(&seed));
			if (kind == 0 && clients < n - 1) {
				bw[i] = 0;
				clients++;
			} else if (kind == 1) {
				bw[i] = -1;
			}
		}
		assert_int_equal(mp_balance_parts(total, bw, n, 0, parts), 0);
		assert_true(sum_parts(parts, n) == total);
		for (int i = 0; i < n; i++)
			if (bw[i] == 0)
				assert_true(parts[i] == 0);
		resolve(bw, n, b);
		if (n > 2) {
			check_optimal(bw, n, total, parts);
			if (lp_bisect(b, n) < 1.0 / bmin_of(b, n))
				with_reducers_below_all++;
		} else {
			/* n = 2: proportional to bandwidth, within one value */
			double s = 0;

			for (int i = 0; i < n; i++)
				s += b[i];
			for (int i = 0; i < n; i++)
				assert_true(fabs((double)parts[i] - (double)total * b[i] / s) < 1.0);
		}
		/* deterministic, and blind to a power-of-two change of units */
		for (int i = 0; i < n; i++)
			scaled[i] = bw[i] > 0 ? bw[i] * 1024.0 : bw[i];
		assert_int_equal(mp_balance_parts(total, bw, n, 0, again), 0);
		assert_memory_equal(parts, again, (size_t)n * sizeof(parts[0]));
		assert_int_equal(mp_balance_parts(total, scaled, n, 0, again), 0);
		assert_memory_equal(parts, again, (size_t)n * sizeof(parts[0]));

		/* min_part: every part is 0 or at least min_part, or one takes all */
		{
			uint64_t min_part = total / (uint64_t)(1 + rnd_next(&seed) % (2 * n)) + 1;
			int nonzero = 0;

			assert_int_equal(mp_balance_parts(total, bw, n, min_part, again), 0);
			assert_true(sum_parts(again, n) == total);
			for (int i = 0; i < n; i++) {
				if (!again[i])
					continue;
				nonzero++;
				assert_true(bw[i] != 0);
				assert_true(again[i] >= min_part || again[i] == total);
			}
			assert_true(nonzero >= 1);
		}
	}
	/* the cases where a slow peer bounds the round were exercised too */
	assert_true(with_reducers_below_all > 20);
}

static void test_unknown(void **st)
{
	uint64_t a[5], b[5], c[5];

	(void)st;
	/* the mean of 64 and 256 is 160, exact in binary */
	expect_parts(1000000, (const double[]){ 64, -1, 256, -1 }, 4, 0,
		     (const uint64_t[]){ 0, 194445, 611111, 194444 });
	assert_int_equal(mp_balance_parts(1000000, (const double[]){ 64, -1, 256, -1 }, 4, 0, a), 0);
	assert_int_equal(mp_balance_parts(1000000, (const double[]){ 64, 160, 256, 160 }, 4, 0, b),
			 0);
	assert_memory_equal(a, b, 4 * sizeof(a[0]));
	check_optimal((const double[]){ 64, -1, 256, -1 }, 4, 1000000, a);

	/* nothing known: equal, as with any equal bandwidths */
	assert_int_equal(mp_balance_parts(1001, (const double[]){ -1, -1, -1, -1, -1 }, 5, 0, a), 0);
	assert_int_equal(mp_balance_parts(1001, (const double[]){ 7, 7, 7, 7, 7 }, 5, 0, b), 0);
	assert_int_equal(mp_balance_parts(1001, (const double[]){ -2, -0.5, -1, -1e9, -1 }, 5, 0, c),
			 0);
	assert_memory_equal(a, b, sizeof(a));
	assert_memory_equal(a, c, sizeof(a));
	expect_parts(1001, (const double[]){ -1, -1, -1, -1, -1 }, 5, 0,
		     (const uint64_t[]){ 201, 200, 200, 200, 200 });
	expect_parts(11, (const double[]){ -1, 0, -1 }, 3, 0, (const uint64_t[]){ 6, 0, 5 });
}

static void test_clients(void **st)
{
	const double bw[6] = { 100, 0, 200, 400, 0, 800 };
	uint64_t parts[6], keep[3] = { 11, 22, 33 };

	(void)st;
	assert_int_equal(mp_balance_parts(1000000, bw, 6, 0, parts), 0);
	assert_true(parts[1] == 0 && parts[4] == 0);
	assert_true(sum_parts(parts, 6) == 1000000);
	check_optimal(bw, 6, 1000000, parts);
	/* six in the group: xi = (4 + 2)/1200 = 1/200, w = 0, 0, 1/4, 3/4 (the
	 * 200 peer's capacity at that xi is exactly 0) */
	expect_parts(1000000, bw, 6, 0, (const uint64_t[]){ 0, 0, 0, 250000, 0, 750000 });
	expect_parts(9, (const double[]){ 0, 5 }, 2, 0, (const uint64_t[]){ 0, 9 });

	/* nobody to reduce */
	assert_int_equal(mp_balance_parts(5, (const double[]){ 0, 0, 0 }, 3, 0, keep), -EINVAL);
	assert_true(keep[0] == 11 && keep[1] == 22 && keep[2] == 33);
	assert_int_equal(mp_balance_parts(1, (const double[]){ 0 }, 1, 0, keep), -EINVAL);
	assert_true(keep[0] == 11);
	/* nothing to split is fine */
	assert_int_equal(mp_balance_parts(0, (const double[]){ 0, 0, 0 }, 3, 7, keep), 0);
	assert_true(keep[0] == 0 && keep[1] == 0 && keep[2] == 0);
	expect_parts(0, (const double[]){ 1, 2 }, 2, 0, (const uint64_t[]){ 0, 0 });
}

static void test_invalid(void **st)
{
	uint64_t keep[3] = { 11, 22, 33 };
	const double ok[3] = { 1, 2, 3 };
	const double bad[][3] = {
		{ 100, NAN, 200 },
		{ INFINITY, 1, 2 },
		{ 1, 2, -INFINITY },
		{ -NAN, 0, 0 },
	};

	(void)st;
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		assert_int_equal(mp_balance_parts(100, bad[i], 3, 0, keep), -EINVAL);
		assert_int_equal(mp_balance_parts(0, bad[i], 3, 0, keep), -EINVAL);
		assert_true(keep[0] == 11 && keep[1] == 22 && keep[2] == 33);
	}
	assert_int_equal(mp_balance_parts(100, ok, 0, 0, keep), -EINVAL);
	assert_int_equal(mp_balance_parts(100, ok, -1, 0, keep), -EINVAL);
	assert_int_equal(mp_balance_parts(100, NULL, 3, 0, keep), -EINVAL);
	assert_int_equal(mp_balance_parts(100, ok, 3, 0, NULL), -EINVAL);
	assert_true(keep[0] == 11 && keep[1] == 22 && keep[2] == 33);
}

static void test_min_part(void **st)
{
	const double slow[4] = { 100, 100, 100, 70 };

	(void)st;
	/* the slow peer's 67 is below 100: it is dropped and three share alike */
	expect_parts(1000, slow, 4, 100, (const uint64_t[]){ 334, 333, 333, 0 });
	expect_parts(1000, slow, 4, 68, (const uint64_t[]){ 334, 333, 333, 0 });
	expect_parts(1000, slow, 4, 67, (const uint64_t[]){ 311, 311, 311, 67 });
	/* one peer at a time: 25 each is too small, 34/33/33 is not */
	expect_parts(100, (const double[]){ 5, 5, 5, 5 }, 4, 30,
		     (const uint64_t[]){ 34, 33, 33, 0 });
	expect_parts(100, (const double[]){ 5, 5, 5, 5 }, 4, 34,
		     (const uint64_t[]){ 50, 50, 0, 0 });
	/* 8 and 2, then 10 for the fastest alone */
	expect_parts(10, (const double[]){ 100, 200, 400, 800 }, 4, 3,
		     (const uint64_t[]){ 0, 0, 0, 10 });
	/* less than min_part in all: the fastest (lower index on ties) takes it */
	expect_parts(10, (const double[]){ 100, 200, 400, 800 }, 4, 100,
		     (const uint64_t[]){ 0, 0, 0, 10 });
	expect_parts(10, (const double[]){ 5, 5, 5 }, 3, 100, (const uint64_t[]){ 10, 0, 0 });
	expect_parts(10, (const double[]){ 0, 5, -1, 5 }, 4, 100,
		     (const uint64_t[]){ 0, 10, 0, 0 });
	/* n = 2 */
	expect_parts(100, (const double[]){ 100, 1 }, 2, 10, (const uint64_t[]){ 100, 0 });
	expect_parts(100, (const double[]){ 1, 100 }, 2, 1, (const uint64_t[]){ 1, 99 });
	/* a client never comes back as the last resort */
	expect_parts(3, (const double[]){ 0, 1, 2 }, 3, 10, (const uint64_t[]){ 0, 0, 3 });
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_equal),
		cmocka_unit_test(test_worked_example),
		cmocka_unit_test(test_random_optimal),
		cmocka_unit_test(test_unknown),
		cmocka_unit_test(test_clients),
		cmocka_unit_test(test_invalid),
		cmocka_unit_test(test_min_part),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
