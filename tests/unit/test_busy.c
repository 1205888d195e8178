/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The estimator of this member's own throughput (struct mp_busy, xfer.h),
 * the figure MP_BALANCE=measured sizes parts from. Synthetic timings, no
 * clock: a member's sends go over one link at a fixed number of ns per
 * byte, a window of frames posted per channel, served in posting order.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <string.h>

#include "xfer.h"

#define K 4            /* members of the group */
#define MIB (1u << 20)
#define FRAME (64u << 10)
#define WINDOW 2

/*
 * Send @bytes[c] on each of @nch channels from time @t0 over a link of
 * @ns_per_byte, in frames of FRAME, WINDOW posted per channel: each
 * completion frees a slot that its channel fills at once. Returns the time
 * the last frame completes.
 */
static uint64_t sim_sends(struct mp_busy *b, uint64_t t0, uint64_t ns_per_byte,
			  const uint64_t *bytes, int nch)
{
	uint64_t left[K], t = t0;
	int q[K * WINDOW * 64], qh = 0, qn = 0;

	assert_true(nch <= K);
	for (int c = 0; c < nch; c++)
		left[c] = bytes[c];
	for (int w = 0; w < WINDOW; w++)
		for (int c = 0; c < nch; c++)
			if (left[c] > (uint64_t)w * FRAME) {
				q[(qh + qn++) % (int)(sizeof(q) / sizeof(q[0]))] = c;
				mp_busy_post(b, t);
			}
	for (int c = 0; c < nch; c++)
		left[c] = bytes[c];
	while (qn) {
		int c = q[qh];
		uint64_t len = left[c] < FRAME ? left[c] : FRAME;

		qh = (qh + 1) % (int)(sizeof(q) / sizeof(q[0]));
		qn--;
		t += len * ns_per_byte;
		left[c] -= len;
		mp_busy_done(b, t, 1, len);
		/* The slot refills while this channel has a frame not yet posted:
		 * WINDOW - 1 others of it are in flight still. */
		if (left[c] > (uint64_t)(WINDOW - 1) * FRAME) {
			q[(qh + qn++) % (int)(sizeof(q) / sizeof(q[0]))] = c;
			mp_busy_post(b, t);
		}
	}
	return t;
}

/*
 * One butterfly exchange of a vector of @n bytes over K members with parts
 * @part, member i's link at @nspb[i] ns per byte. Scatter: i sends part[j]
 * to each j; a member reduces its part once every contribution is in (the
 * last scatter to end); gather: i sends part[i] to each j; the exchange
 * ends when the last gather does. Fills @fig with the new figures, and
 * @old with the former estimator's (bytes sent and received over the
 * exchange's length).
 */
static void butterfly(uint64_t n, const uint64_t *part, const uint64_t *nspb, double *fig,
		      double *old)
{
	struct mp_busy b[K];
	uint64_t scat_end[K], reduced = 0, end = 0, gath_end[K];

	memset(b, 0, sizeof(b));
	for (int i = 0; i < K; i++) {
		uint64_t bytes[K - 1];
		int m = 0;
		for (int j = 0; j < K; j++)
			if (j != i)
				bytes[m++] = part[j];
		scat_end[i] = sim_sends(&b[i], 0, nspb[i], bytes, m);
		reduced = scat_end[i] > reduced ? scat_end[i] : reduced;
	}
	for (int i = 0; i < K; i++) {
		uint64_t bytes[K - 1];
		for (int j = 0; j < K - 1; j++)
			bytes[j] = part[i];
		gath_end[i] = sim_sends(&b[i], reduced, nspb[i], bytes, K - 1);
		end = gath_end[i] > end ? gath_end[i] : end;
	}
	for (int i = 0; i < K; i++) {
		/* sent = received = n + (K-2) part[i] */
		double traffic = 2.0 * (double)(n + (K - 2) * part[i]);

		assert_int_equal(b[i].n, 0);
		assert_int_equal(b[i].bytes, n + (K - 2) * part[i]);
		fig[i] = mp_busy_rate(&b[i]);
		old[i] = traffic * 1e9 / (double)end;
	}
}

static void near(double got, double want, double tol)
{
	if (fabs(got - want) > tol * want)
		fail_msg("%.6g, want %.6g within %.0f%%", got, want, tol * 100.0);
}

/* Equal links, unequal parts: equal figures (the link's rate), where the
 * former estimator gave the larger part a larger figure. */
static void test_equal_links_unequal_parts(void **state)
{
	const uint64_t part[K] = {4 * MIB, 2 * MIB, 1 * MIB, 1 * MIB};
	const uint64_t nspb[K] = {1, 1, 1, 1};
	double fig[K], old[K];

	(void)state;
	butterfly(8 * MIB, part, nspb, fig, old);
	for (int i = 0; i < K; i++)
		near(fig[i], 1e9, 0.02);
	/* The bias this estimator removes, in the same scenario. */
	assert_true(old[0] > 1.3 * old[3]);
}

/* Equal parts, member 1's link twice as slow: its figure is about half. */
static void test_slow_link_half(void **state)
{
	const uint64_t part[K] = {2 * MIB, 2 * MIB, 2 * MIB, 2 * MIB};
	const uint64_t nspb[K] = {1, 2, 1, 1};
	double fig[K], old[K];

	(void)state;
	butterfly(8 * MIB, part, nspb, fig, old);
	near(fig[1], 0.5e9, 0.02);
	for (int i = 0; i < K; i++)
		if (i != 1)
			near(fig[i], 1e9, 0.02);
}

/* Sends in flight on several channels at once count once (the union), and
 * a time with nothing in flight not at all; a cancelled send ends its
 * busy time without bytes. */
static void test_union(void **state)
{
	struct mp_busy b;

	(void)state;
	memset(&b, 0, sizeof(b));
	assert_true(mp_busy_rate(&b) == 0.0);
	mp_busy_post(&b, 100);        /* three channels at once */
	mp_busy_post(&b, 100);
	mp_busy_post(&b, 110);
	mp_busy_done(&b, 120, 1, 10);
	mp_busy_done(&b, 130, 1, 10);
	mp_busy_done(&b, 140, 1, 10); /* busy 100..140 */
	assert_int_equal(b.ns, 40);
	mp_busy_post(&b, 1000);       /* idle 140..1000: not counted */
	mp_busy_post(&b, 1000);
	mp_busy_done(&b, 1010, 1, 10);
	assert_int_equal(b.ns, 40);   /* one still in flight */
	mp_busy_done(&b, 1020, 1, 0); /* cancelled */
	assert_int_equal(b.ns, 60);
	assert_int_equal(b.bytes, 40);
	near(mp_busy_rate(&b), 40.0 * 1e9 / 60.0, 1e-9);
	mp_busy_post(&b, 2000);       /* a whole channel closed: k at once */
	mp_busy_post(&b, 2000);
	mp_busy_done(&b, 2005, 2, 0);
	assert_int_equal(b.n, 0);
	assert_int_equal(b.ns, 65);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_equal_links_unequal_parts),
		cmocka_unit_test(test_slow_link_half),
		cmocka_unit_test(test_union),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
