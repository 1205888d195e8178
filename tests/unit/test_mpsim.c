/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * mpsim's engine (tools/mpsim_core.c): exactness on full grids, monotone
 * error, determinism, all-reduce under failures, the global mean, the
 * random-group contraction against its formula, the static grouping's
 * lines against mpsim's, and mpsim's values against real libmoshpit peers
 * (threads on the loop transport), bit for bit.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <moshpit/moshpit.h>

#include "mpsim_core.h"

static struct mpsim_cfg make(enum mpsim_algo algo, int peers, const char *grid, double fail)
{
	struct mpsim_cfg c = {
		.algo = algo, .peers = peers, .len = 1, .fail = fail, .group = 32, .neighbors = 1,
	};

	if (grid)
		assert_int_equal(mp_grid_parse(grid, &c.grid), 0);
	return c;
}

/* p = 0, every cell full: the error is exactly 0 after d rounds, and not before. */
static void test_full_grid_exact(void **st)
{
	static const char *const grids[] = { "32x32", "4x4x4", "8x8x8", "3x5x2", "2x2x2x2x2", "17" };

	(void)st;
	for (size_t k = 0; k < sizeof(grids) / sizeof(grids[0]); k++)
		for (int coords = 0; coords < 2; coords++)
			for (size_t len = 1; len <= 3; len += 2) {
				struct mpsim_cfg c = make(MPSIM_MOSHPIT, 0, grids[k], 0.0);
				struct mpsim s;

				c.peers = (int)mp_grid_cells(&c.grid);
				c.coords = coords;
				c.len = len;
				assert_int_equal(mpsim_init(&s, &c, 7 + k), 0);
				assert_true(mpsim_error(&s) > 0.1 * (double)len);
				for (int t = 1; t < c.grid.ndims; t++) {
					mpsim_round(&s);
					assert_true(mpsim_error(&s) > 1e-6);
				}
				mpsim_round(&s);
				/* every peer holds the same bits: not just below float precision */
				assert_true(mpsim_error(&s) == 0.0);
				for (int i = 1; i < c.peers; i++)
					assert_memory_equal(s.x, s.x + (size_t)i * len, len * sizeof(float));
				mpsim_free(&s);
			}
}

/*
 * p = 0 on partial grids: a group average never moves the peers away from
 * their mean. The slack is fp32 rounding of values near the mean (about
 * 1e-16 here), far below any error the runs look at.
 */
static void test_moshpit_monotone(void **st)
{
	static const struct {
		const char *grid;
		int peers;
	} cases[] = { { "32x32", 512 }, { "32x32", 900 }, { "10x10x10", 700 }, { "7x7x7", 100 },
		      { "5x3", 2 } };

	(void)st;
	for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++)
		for (int coords = 0; coords < 2; coords++)
			for (uint64_t seed = 1; seed <= 3; seed++) {
				struct mpsim_cfg c = make(MPSIM_MOSHPIT, cases[k].peers, cases[k].grid, 0.0);
				struct mpsim s;
				double prev;

				c.coords = coords;
				assert_int_equal(mpsim_init(&s, &c, seed), 0);
				prev = mpsim_error(&s);
				for (int t = 0; t < 30; t++) {
					double e;

					mpsim_round(&s);
					e = mpsim_error(&s);
					assert_true(e <= prev + 1e-14);
					/* more peers than lines: some line holds two, so round 0 gains */
					if (t == 0 && (uint64_t)c.peers > mp_grid_cells(&c.grid) / (uint64_t)c.grid.dims[0])
						assert_true(e < prev);
					prev = e;
				}
				mpsim_free(&s);
			}
}

/* Same seed, same bits; another seed, other values. */
static void test_deterministic(void **st)
{
	(void)st;
	for (int a = 0; a < MPSIM_NALGOS; a++) {
		struct mpsim_cfg c = make(a, 300, "20x20", 0.05);
		struct mpsim s1, s2, s3;

		c.len = 2;
		c.group = 7;
		assert_int_equal(mpsim_init(&s1, &c, 42), 0);
		assert_int_equal(mpsim_init(&s2, &c, 42), 0);
		assert_int_equal(mpsim_init(&s3, &c, 43), 0);
		for (int t = 0; t < 12; t++) {
			mpsim_round(&s1);
			mpsim_round(&s2);
			mpsim_round(&s3);
			assert_true(mpsim_error(&s1) == mpsim_error(&s2));
			assert_int_equal(s1.nfailed, s2.nfailed);
		}
		assert_memory_equal(s1.x, s2.x, 300 * 2 * sizeof(float));
		assert_memory_equal(s1.w, s2.w, 300 * sizeof(float));
		assert_memory_not_equal(s1.x, s3.x, 300 * 2 * sizeof(float));
		mpsim_free(&s1);
		mpsim_free(&s2);
		mpsim_free(&s3);
	}
}

/*
 * All-reduce with p > 0: a round in which anyone fails leaves every value
 * as it was; a round without failures gives everyone the exact mean (to
 * fp32 rounding), after which the error is 0.
 */
static void test_allreduce_failures(void **st)
{
	struct mpsim_cfg c = make(MPSIM_ALLREDUCE, 40, NULL, 0.02);
	struct mpsim s;
	float before[40 * 3];
	double mean[3];
	int failed_rounds = 0, clean_rounds = 0;

	(void)st;
	c.len = 3;
	assert_int_equal(mpsim_init(&s, &c, 5), 0);
	for (int t = 0; t < 200 && (!failed_rounds || !clean_rounds); t++) {
		memcpy(before, s.x, sizeof(before));
		mpsim_global_mean(&s, mean);
		mpsim_round(&s);
		if (s.nfailed) {
			failed_rounds++;
			assert_memory_equal(before, s.x, sizeof(before));
			continue;
		}
		clean_rounds++;
		for (int i = 0; i < 40; i++) {
			double v[3];

			mpsim_value(&s, i, v);
			for (int l = 0; l < 3; l++)
				assert_true(fabs(v[l] - mean[l]) <= 1e-6 * (1.0 + fabs(mean[l])));
		}
		assert_true(mpsim_error(&s) == 0.0);
	}
	/* p = 0.02 on 40 peers: 45% of rounds see a failure; both kinds occur */
	assert_true(failed_rounds > 0);
	assert_true(clean_rounds > 0);
	mpsim_free(&s);

	/* p = 1: nobody ever averages */
	c.fail = 1.0;
	assert_int_equal(mpsim_init(&s, &c, 5), 0);
	memcpy(before, s.x, sizeof(before));
	for (int t = 0; t < 5; t++)
		mpsim_round(&s);
	assert_memory_equal(before, s.x, sizeof(before));
	mpsim_free(&s);
}

/*
 * Failures only take peers out of whole rounds, so nobody fails mid-average
 * and the global mean (Σ w·x / Σ w; push-sum Σ s / Σ w) stays put, to fp32
 * rounding, for every algorithm but gossip (whose neighbourhood averages
 * are not doubly stochastic once some neighbours are missing); gossip keeps
 * it without failures.
 */
static void test_mean_preserved(void **st)
{
	(void)st;
	for (int a = 0; a < MPSIM_NALGOS; a++)
		for (int coords = 0; coords < 2; coords++) {
			double fail = a == MPSIM_GOSSIP ? 0.0 : 0.1;
			struct mpsim_cfg c = make(a, 500, "24x24", fail);
			struct mpsim s;
			double m0[2], m1[2];

			c.len = 2;
			c.group = 9;
			c.coords = coords;
			assert_int_equal(mpsim_init(&s, &c, 11), 0);
			mpsim_global_mean(&s, m0);
			for (int t = 0; t < 25; t++) {
				mpsim_round(&s);
				mpsim_global_mean(&s, m1);
				for (int l = 0; l < 2; l++)
					assert_true(fabs(m1[l] - m0[l]) < 1e-6);
			}
			mpsim_free(&s);
		}
}

/*
 * One round of random groups, or Moshpit's round 0 (peers on random cells:
 * a random partition into the grid's lines): averaged over many draws, the
 * error shrinks by what mpsim prints as the theory, (r - 1) / (N - 1)
 * without failures. 2000 draws put the mean within about 1% of it.
 */
static void test_theory(void **st)
{
	static const struct {
		enum mpsim_algo algo;
		int peers, group;
		const char *grid;
		double fail;
	} cases[] = {
		{ MPSIM_RANDOM, 256, 16, NULL, 0.0 },  { MPSIM_RANDOM, 100, 30, NULL, 0.0 },
		{ MPSIM_RANDOM, 256, 16, NULL, 0.05 }, { MPSIM_RANDOM, 300, 7, NULL, 0.3 },
		{ MPSIM_MOSHPIT, 300, 0, "20x20", 0.0 }, { MPSIM_MOSHPIT, 300, 0, "20x20", 0.1 },
		/* sparse: most lines empty, and they are no groups */
		{ MPSIM_MOSHPIT, 200, 0, "16x16x16", 0.0 },
	};

	(void)st;
	for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
		struct mpsim_cfg c = make(cases[k].algo, cases[k].peers, cases[k].grid, cases[k].fail);
		double sum = 0.0, want;
		const int draws = 2000;

		c.group = cases[k].group;
		want = mpsim_theory_rate(&c);
		if (c.fail == 0.0 && c.algo == MPSIM_RANDOM)
			assert_true(fabs(want - (ceil((double)c.peers / c.group) - 1.0) / (c.peers - 1.0)) <
				    1e-15);
		for (int d = 0; d < draws; d++) {
			struct mpsim s;
			double e0;

			assert_int_equal(mpsim_init(&s, &c, 1000 + (uint64_t)d), 0);
			e0 = mpsim_error(&s);
			mpsim_round(&s);
			sum += mpsim_error(&s) / e0;
			mpsim_free(&s);
		}
		assert_true(fabs(sum / draws / want - 1.0) < 0.04);
	}
}

/* Push-sum on 2^k peers without failures: exact (to fp32) after k rounds. */
static void test_pushsum_exact(void **st)
{
	struct mpsim_cfg c = make(MPSIM_PUSHSUM, 1024, NULL, 0.0);
	struct mpsim s;

	(void)st;
	assert_int_equal(mpsim_init(&s, &c, 3), 0);
	for (int t = 0; t < 9; t++)
		mpsim_round(&s);
	assert_true(mpsim_error(&s) > 1e-6);
	mpsim_round(&s);
	assert_true(mpsim_error(&s) < 1e-14);
	mpsim_free(&s);
}

/*
 * mpsim's lines are the library's: with peer r placed in cell r, a line
 * mp_grid_line finds is the group the static grouping forms, member order
 * and group id included.
 */
static int identity(void *arg, uint64_t cell)
{
	return cell < (uint64_t)*(const int *)arg ? (int)cell : -1;
}

static void test_lines_match_grouping(void **st)
{
	struct mp_grid_grouping gg;
	struct mp_grid g;
	int npeers = 50, a[8], b[8];
	struct mp_group grp = { .members = b };

	(void)st;
	assert_int_equal(mp_grid_parse("4x3x5", &g), 0);
	assert_int_equal(mp_grid_grouping_init(&gg, &g, npeers), 0);
	for (uint32_t t = 0; t < 6; t++)
		for (int r = 0; r < npeers; r++) {
			uint32_t id;
			int n = mp_grid_line(&g, (uint64_t)r, t, identity, &npeers, a, &id);

			assert_int_equal(mp_grid_grouping_ops.form(&gg, t, r, &grp), 0);
			assert_int_equal(n, grp.size);
			assert_memory_equal(a, grp.members, (size_t)n * sizeof(int));
			assert_int_equal(id, grp.id);
			assert_int_equal(grp.members[grp.my_index], r);
		}
}

#define LIB_PEERS 12
#define LIB_LEN 37

struct lib_run {
	const char *grid;
	int rounds;
	int pairs;          /* mp_config::direct_pairs */
	pthread_barrier_t bar;
	char addr[LIB_PEERS][MP_ADDR_STRLEN];
	float x[LIB_PEERS][LIB_LEN];
	float w[LIB_PEERS];
	int rc[LIB_PEERS];
	int rank_next;
	pthread_mutex_t lock;
};

static void *lib_peer(void *arg)
{
	struct lib_run *lr = arg;
	struct mp_config cfg;
	const char *addrs[LIB_PEERS];
	mp_ctx *ctx = NULL;
	int rank, rc;

	pthread_mutex_lock(&lr->lock);
	rank = lr->rank_next++;
	pthread_mutex_unlock(&lr->lock);
	mp_config_init(&cfg);
	cfg.transport = "loop";
	cfg.run_name = "mpsim-vs-lib";
	cfg.rank = rank;
	cfg.npeers = LIB_PEERS;
	cfg.grid = lr->grid;
	cfg.rounds = lr->rounds;
	cfg.direct_pairs = lr->pairs;
	cfg.connect_timeout_ms = 5000;
	cfg.round_timeout_ms = 5000;
	rc = mp_init(&cfg, &ctx);
	if (!rc)
		mp_local_address(ctx, lr->addr[rank], MP_ADDR_STRLEN);
	pthread_barrier_wait(&lr->bar);
	for (int i = 0; i < LIB_PEERS; i++)
		addrs[i] = lr->addr[i];
	if (!rc)
		rc = mp_set_peers(ctx, addrs, LIB_PEERS);
	if (!rc)
		rc = mp_average(ctx, lr->x[rank], LIB_LEN, lr->w[rank], NULL);
	lr->rc[rank] = rc;
	/* nobody leaves before everyone is done with the others' connections */
	pthread_barrier_wait(&lr->bar);
	mp_finalize(ctx);
	return NULL;
}

/*
 * The same peers, values and weights through libmoshpit (rank r in cell r,
 * the static grid grouping) and through mpsim with its peers put in the
 * same cells: every value and weight agrees bit for bit, on a partial grid
 * with unequal weights. The vectors are short: the direct exchange, and
 * with direct_pairs the pairwise exchange in groups of 4 or more (lines of
 * 4 and 6, and one group of 12: 8 members and 4 extras).
 */
static void test_matches_library(void **st)
{
	static const struct {
		const char *grid;
		int rounds;
		int pairs;
	} cases[] = { { "4x4", 2, 0 }, { "4x4", 5, 0 }, { "3x2x2", 3, 0 }, { "4x4", 2, 1 },
		      { "4x4", 5, 1 }, { "6x2", 2, 1 }, { "12", 1, 1 } };

	(void)st;
	for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
		struct mpsim_cfg c = make(MPSIM_MOSHPIT, LIB_PEERS, cases[k].grid, 0.0);
		struct lib_run *lr = calloc(1, sizeof(*lr));
		pthread_t th[LIB_PEERS];
		struct mpsim s;

		assert_non_null(lr);
		c.len = LIB_LEN;
		c.direct_pairs = cases[k].pairs;
		assert_int_equal(mpsim_init(&s, &c, 99 + k), 0);
		/* rank r in cell r, as the library's static grouping has it */
		for (uint64_t cell = 0; cell < mp_grid_cells(&c.grid); cell++)
			s.peer_at[cell] = cell < LIB_PEERS ? (int)cell : -1;
		for (int i = 0; i < LIB_PEERS; i++) {
			s.cell_of[i] = i;
			s.w[i] = (float)(i % 3 + 1);
			lr->w[i] = s.w[i];
			memcpy(lr->x[i], s.x + (size_t)i * LIB_LEN, sizeof(lr->x[i]));
		}
		lr->grid = cases[k].grid;
		lr->rounds = cases[k].rounds;
		lr->pairs = cases[k].pairs;
		pthread_mutex_init(&lr->lock, NULL);
		pthread_barrier_init(&lr->bar, NULL, LIB_PEERS);
		for (int i = 0; i < LIB_PEERS; i++)
			assert_int_equal(pthread_create(&th[i], NULL, lib_peer, lr), 0);
		for (int i = 0; i < LIB_PEERS; i++)
			pthread_join(th[i], NULL);
		for (int t = 0; t < cases[k].rounds; t++)
			mpsim_round(&s);
		for (int i = 0; i < LIB_PEERS; i++) {
			assert_int_equal(lr->rc[i], 0);
			assert_memory_equal(lr->x[i], s.x + (size_t)i * LIB_LEN, sizeof(lr->x[i]));
		}
		/* and the values did move: the check is not vacuous */
		assert_true(mpsim_error(&s) < 0.5);
		pthread_barrier_destroy(&lr->bar);
		pthread_mutex_destroy(&lr->lock);
		mpsim_free(&s);
		free(lr);
	}
}

static void test_bad_config(void **st)
{
	struct mpsim s;
	struct mpsim_cfg c = make(MPSIM_MOSHPIT, 17, "4x4", 0.0);

	(void)st;
	assert_int_equal(mpsim_init(&s, &c, 1), -EINVAL); /* more peers than cells */
	c.peers = 16;
	c.fail = 1.5;
	assert_int_equal(mpsim_init(&s, &c, 1), -EINVAL);
	c.fail = -0.1;
	assert_int_equal(mpsim_init(&s, &c, 1), -EINVAL);
	c.fail = NAN;
	assert_int_equal(mpsim_init(&s, &c, 1), -EINVAL);
	c.fail = 0.0;
	c.len = 0;
	assert_int_equal(mpsim_init(&s, &c, 1), -EINVAL);
	c = make(MPSIM_RANDOM, 10, NULL, 0.0);
	c.group = 0;
	assert_int_equal(mpsim_init(&s, &c, 1), -EINVAL);
	c = make(MPSIM_MOSHPIT, 10, "1024x1024x1024", 0.0);
	assert_int_equal(mpsim_init(&s, &c, 1), -EINVAL); /* over MPSIM_MAX_CELLS */
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_full_grid_exact),
		cmocka_unit_test(test_moshpit_monotone),
		cmocka_unit_test(test_deterministic),
		cmocka_unit_test(test_allreduce_failures),
		cmocka_unit_test(test_mean_preserved),
		cmocka_unit_test(test_theory),
		cmocka_unit_test(test_pushsum_exact),
		cmocka_unit_test(test_lines_match_grouping),
		cmocka_unit_test(test_matches_library),
		cmocka_unit_test(test_bad_config),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
