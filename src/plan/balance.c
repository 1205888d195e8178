/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Bandwidth-aware parts: DeDLOC's load-balancing linear program.
 *
 * In a butterfly all-reduce over n peers, peer i reduces a share w_i of the
 * vector. It sends the (1 - w_i) it does not reduce, receives the other
 * n - 1 peers' copies of its own share and sends the result back to them, and
 * receives the rest of the result: 1 + (n - 2)·w_i vector sizes through a
 * link of bandwidth b_i. The round lasts as long as the slowest peer, hence
 *
 *   minimise xi  subject to  (1 + (n - 2)·w_i) / b_i <= xi  (every b_i > 0),
 *                            sum w_i = 1,  w_i >= 0,  w_i = 0 for clients.
 *
 * Why water-filling solves it. For a given xi each peer can take at most
 * c_i(xi) = (xi·b_i - 1)/(n - 2), and xi is achievable iff the capacities of
 * the peers with c_i > 0 add up to 1. That sum grows with xi, so the smallest
 * achievable xi makes it exactly 1 with every peer that gets a share at its
 * capacity: the reducers A all take the same time xi, and
 * sum_A (xi·b_i - 1) = n - 2 gives xi = (n - 2 + |A|) / sum_A b_i. A peer
 * belongs to A iff it still has capacity at that xi, xi·b_i > 1; capacity
 * grows with bandwidth, so A is a prefix of the peers by decreasing
 * bandwidth, and the prefix condition for the k-th fastest peer,
 * (n - 2 + k)·b_k > S_k (S_k the sum of the k largest), once false stays
 * false for every longer prefix. The peers left out have 1/b_i >= xi: their
 * own vector takes that long whatever they reduce, which makes the LP's
 * optimum max(xi, 1/b_min). Among the many optimal w when a slow peer is the
 * bottleneck, this one also minimises the time of the reducers, and loads no
 * peer more than needed.
 *
 * For n = 2 a peer's time is 1/b_i whatever its share and for n = 1 there is
 * nobody to exchange with, so the LP says nothing; shares follow bandwidth.
 *
 * Every member computes the split on its own, possibly on another
 * architecture, and all must agree. The computation uses + - * / on doubles
 * in a fixed order (peers sorted by a total order; -ffp-contract=off) and no
 * libm function, and mp_parts_split turns the shares into integers exactly.
 * Bandwidths are first divided by the largest one so that sums of up to
 * n of them cannot overflow. The active peers' weights are passed as
 * (n - 2 + k)·b_i - S_k, proportional to w_i, because that is the very
 * expression whose sign selected the prefix: it is positive for every peer
 * kept, whatever the rounding.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <moshpit/moshpit.h>

#include "parts.h"

struct bw_entry {
	double b; /* bandwidth divided by the largest known one */
	int idx;
};

/* Fastest first; ties to the lower index. A total order, so every member
 * sorts the same way whatever qsort does with equal keys. */
static int by_bandwidth(const void *a, const void *b)
{
	const struct bw_entry *x = a, *y = b;

	if (x->b != y->b)
		return x->b > y->b ? -1 : 1;
	return (x->idx > y->idx) - (x->idx < y->idx);
}

/* Shares of the peers in `sorted` not yet dropped; 0 for everyone else. */
static void solve(const struct bw_entry *sorted, int m, const unsigned char *dropped, int n,
		  double *share)
{
	double s = 0.0, c;
	int k = 0, j;

	for (int i = 0; i < n; i++)
		share[i] = 0.0;
	if (n <= 2) {
		for (j = 0; j < m; j++)
			if (!dropped[sorted[j].idx])
				share[sorted[j].idx] = sorted[j].b;
		return;
	}
	/* the longest prefix of the fastest peers that all get a share */
	for (j = 0; j < m; j++) {
		double b = sorted[j].b;

		if (dropped[sorted[j].idx])
			continue;
		if (!(((double)(n - 2) + (double)(k + 1)) * b > s + b))
			break;
		s += b;
		k++;
	}
	c = (double)(n - 2) + (double)k;
	for (j = 0; j < m && k > 0; j++) {
		if (dropped[sorted[j].idx])
			continue;
		share[sorted[j].idx] = c * sorted[j].b - s;
		k--;
	}
}

int mp_balance_parts(uint64_t total, const double *bandwidth, int n, uint64_t min_part,
		     uint64_t *parts)
{
	struct bw_entry *sorted = NULL;
	unsigned char *dropped = NULL;
	uint64_t *out = NULL;
	double *share = NULL;
	double bmax = 0.0, known_sum = 0.0, unknown_b = 1.0;
	int known = 0, m = 0, rc;

	if (n < 1 || !bandwidth || !parts)
		return -EINVAL;
	for (int i = 0; i < n; i++) {
		double b = bandwidth[i];

		if (!isfinite(b))
			return -EINVAL;
		if (b > 0.0) {
			known++;
			if (b > bmax)
				bmax = b;
		}
		if (b != 0.0)
			m++;
	}
	if (total == 0) {
		memset(parts, 0, (size_t)n * sizeof(*parts));
		return 0;
	}
	if (!m)
		return -EINVAL;

	sorted = malloc((size_t)m * sizeof(*sorted));
	dropped = calloc((size_t)n, sizeof(*dropped));
	out = malloc((size_t)n * sizeof(*out));
	share = malloc((size_t)n * sizeof(*share));
	if (!sorted || !dropped || !out || !share) {
		rc = -ENOMEM;
		goto out;
	}
	/* unknown bandwidths: the mean of the known ones; none known: all 1 */
	if (known) {
		for (int i = 0; i < n; i++)
			if (bandwidth[i] > 0.0)
				known_sum += bandwidth[i] / bmax;
		unknown_b = known_sum / (double)known;
	}
	m = 0;
	for (int i = 0; i < n; i++) {
		if (bandwidth[i] == 0.0)
			continue;
		sorted[m].b = bandwidth[i] > 0.0 ? bandwidth[i] / bmax : unknown_b;
		sorted[m].idx = i;
		m++;
	}
	qsort(sorted, (size_t)m, sizeof(*sorted), by_bandwidth);

	/*
	 * Parts below min_part are not worth a peer's round trip. The slowest
	 * such peer is dropped, one at a time, and the LP solved again over the
	 * rest, whose parts grow, so that no more peers leave than needed.
	 * Parts grow with bandwidth, so the fastest peer is the last with a
	 * part; when it alone is left (total < min_part) it keeps the total.
	 */
	for (;;) {
		int worst = -1, with_part = 0;

		solve(sorted, m, dropped, n, share);
		rc = mp_parts_split(total, share, n, out);
		if (rc < 0 || !min_part)
			break;
		for (int j = m - 1; j >= 0; j--) {
			int i = sorted[j].idx;

			if (dropped[i] || !out[i])
				continue;
			with_part++;
			if (out[i] < min_part && worst < 0)
				worst = i;
		}
		if (worst < 0 || with_part < 2)
			break;
		dropped[worst] = 1;
	}
	if (!rc)
		memcpy(parts, out, (size_t)n * sizeof(*parts));
out:
	free(sorted);
	free(dropped);
	free(out);
	free(share);
	return rc;
}
