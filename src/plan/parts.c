/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Proportional split of a vector into parts, by the largest remainder method.
 *
 * Every member of a group computes the split independently and must get the
 * same answer, possibly on another build or architecture, so no floating
 * point arithmetic touches the shares: weights are first turned into exact
 * integers (their mantissas scaled to a common exponent, an exact operation),
 * and shares and remainders are then computed with 64x64->128-bit integer
 * arithmetic. FP contraction, x87 excess precision or libm differences cannot
 * change the result.
 */
#include "parts.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Bits needed to hold v (0 for 0). */
static int bitlen(uint64_t v)
{
	int n = 0;

	while (v) {
		n++;
		v >>= 1;
	}
	return n;
}

/* 64x64 -> 128-bit product, portable (no __int128). */
static void mul_64x64(uint64_t a, uint64_t b, uint64_t *hi, uint64_t *lo)
{
	uint64_t a0 = (uint32_t)a, a1 = a >> 32, b0 = (uint32_t)b, b1 = b >> 32;
	uint64_t p00 = a0 * b0, p01 = a0 * b1, p10 = a1 * b0, p11 = a1 * b1;
	uint64_t mid = (p00 >> 32) + (uint32_t)p01 + (uint32_t)p10;

	*lo = (mid << 32) | (uint32_t)p00;
	*hi = p11 + (p01 >> 32) + (p10 >> 32) + (mid >> 32);
}

/*
 * (hi:lo) / d by restoring long division. Requires hi < d so the quotient
 * fits in 64 bits; *rem gets the remainder.
 */
static uint64_t div_128_64(uint64_t hi, uint64_t lo, uint64_t d, uint64_t *rem)
{
	uint64_t q = 0;

	for (int i = 0; i < 64; i++) {
		uint64_t carry = hi >> 63;

		hi = (hi << 1) | (lo >> 63);
		lo <<= 1;
		q <<= 1;
		/* with the carry the true value is >= 2^64 > d, and the
		 * wrapping subtraction still yields the right remainder */
		if (carry || hi >= d) {
			hi -= d;
			q |= 1;
		}
	}
	*rem = hi;
	return q;
}

struct rem_entry {
	uint64_t rem;
	int idx;
};

/* Largest remainder first; ties to the lower index. A total order, so qsort's
 * instability cannot make two members disagree. */
static int rem_cmp(const void *a, const void *b)
{
	const struct rem_entry *x = a, *y = b;

	if (x->rem != y->rem)
		return x->rem > y->rem ? -1 : 1;
	return (x->idx > y->idx) - (x->idx < y->idx);
}

static void split_equal(uint64_t total, int n, uint64_t *parts)
{
	uint64_t base = total / (uint64_t)n, extra = total % (uint64_t)n;

	/* all remainders tie, so the lower indices get the extra elements */
	for (int i = 0; i < n; i++)
		parts[i] = base + ((uint64_t)i < extra ? 1 : 0);
}

int mp_parts_split(uint64_t total, const double *weights, int n, uint64_t *parts)
{
	uint64_t *q, sum = 0, known_sum = 0, assigned = 0;
	struct rem_entry *rems;
	double wmax = 0.0;
	int known = 0, unknown = 0, emax, bits;

	if (n < 1 || !parts)
		return -EINVAL;
	if (!weights) {
		split_equal(total, n, parts);
		return 0;
	}
	for (int i = 0; i < n; i++) {
		if (!isfinite(weights[i]))
			return -EINVAL;
		if (weights[i] > 0.0) {
			known++;
			if (weights[i] > wmax)
				wmax = weights[i];
		} else if (weights[i] < 0.0) {
			unknown++;
		}
	}
	if (!known)
		return -EINVAL;

	/*
	 * Integer weights q_i = floor(w_i * 2^(bits - emax)), where wmax =
	 * m * 2^emax with m in [0.5, 1): the largest gets exactly `bits`
	 * bits and the scaling by a power of two is exact. An unknown weight
	 * is the mean of the known ones; to keep it exact every known weight
	 * is multiplied by their count and an unknown one is their sum.
	 * `bits` is chosen so that the grand total stays below 2^63.
	 */
	frexp(wmax, &emax);
	bits = 63 - bitlen((uint64_t)n) - (unknown ? bitlen((uint64_t)known) : 0);
	if (bits > 53)
		bits = 53; /* a double has no more to give */

	q = malloc((size_t)n * sizeof(*q));
	rems = malloc((size_t)n * sizeof(*rems));
	if (!q || !rems) {
		free(q);
		free(rems);
		return -ENOMEM;
	}
	for (int i = 0; i < n; i++) {
		q[i] = 0;
		if (weights[i] > 0.0)
			q[i] = (uint64_t)floor(ldexp(weights[i], bits - emax));
		known_sum += q[i];
	}
	for (int i = 0; i < n; i++) {
		if (weights[i] > 0.0 && unknown)
			q[i] *= (uint64_t)known;
		else if (weights[i] < 0.0)
			q[i] = known_sum;
		sum += q[i];
	}

	/* parts_i = floor(total * q_i / sum); q_i <= sum keeps it in 64 bits */
	for (int i = 0; i < n; i++) {
		uint64_t hi, lo;

		mul_64x64(total, q[i], &hi, &lo);
		parts[i] = div_128_64(hi, lo, sum, &rems[i].rem);
		rems[i].idx = i;
		assigned += parts[i];
	}
	/*
	 * The remainders add up to (total - assigned) * sum and each is below
	 * sum, so fewer than n elements are left, and only parts with a
	 * nonzero remainder (never a zero weight) receive one.
	 */
	if (assigned < total) {
		uint64_t left = total - assigned;

		qsort(rems, (size_t)n, sizeof(*rems), rem_cmp);
		for (uint64_t k = 0; k < left; k++)
			parts[rems[k].idx]++;
	}
	free(q);
	free(rems);
	return 0;
}
