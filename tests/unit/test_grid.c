/* SPDX-License-Identifier: BSD-3-Clause */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "grid.h"

static void expect_grid(const char *s, int ndims, const int *dims)
{
	struct mp_grid g;

	assert_int_equal(mp_grid_parse(s, &g), 0);
	assert_int_equal(g.ndims, ndims);
	for (int i = 0; i < ndims; i++)
		assert_int_equal(g.dims[i], dims[i]);
}

static void test_parse(void **st)
{
	static const char *const bad[] = {
		"", "0x4", "4x0", "2x", "x2", "2xx2", "abc", "x", "2x2a", " 2", "2 ", "-2",
		"+2", "2x-2", "1x1x1x1x1x1x1x1x1", "2147483648", "65536x65537",
		"2x2x2x2x2x2x2x67108864", "99999999999999999999", "2,2", "2*2",
	};
	struct mp_grid g = { .ndims = 5 };

	(void)st;
	expect_grid("2x2x2", 3, (const int[]){ 2, 2, 2 });
	expect_grid("16", 1, (const int[]){ 16 });
	expect_grid("4x4", 2, (const int[]){ 4, 4 });
	expect_grid("3X5", 2, (const int[]){ 3, 5 });
	expect_grid("1x1x1x1x1x1x1x1", 8, (const int[]){ 1, 1, 1, 1, 1, 1, 1, 1 });
	expect_grid("65536x32768", 2, (const int[]){ 65536, 32768 }); /* 2^31 cells */
	expect_grid("2147483647", 1, (const int[]){ 2147483647 });
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		assert_int_equal(mp_grid_parse(bad[i], &g), -EINVAL);
		assert_int_equal(g.ndims, 5); /* untouched on failure */
	}
	assert_int_equal(mp_grid_parse(NULL, &g), -EINVAL);
}

static void test_format(void **st)
{
	struct mp_grid g;
	char buf[64];

	(void)st;
	assert_int_equal(mp_grid_parse("2x3x4", &g), 0);
	mp_grid_format(&g, buf, sizeof(buf));
	assert_string_equal(buf, "2x3x4");
	mp_grid_format(&g, buf, 4);
	assert_string_equal(buf, "2x3");
	mp_grid_format(&g, buf, 1);
	assert_string_equal(buf, "");
	assert_int_equal(mp_grid_parse("17", &g), 0);
	mp_grid_format(&g, buf, sizeof(buf));
	assert_string_equal(buf, "17");
}

static void expect_auto(int n, const char *want)
{
	struct mp_grid g;
	char buf[64];

	assert_int_equal(mp_grid_auto(n, &g), 0);
	mp_grid_format(&g, buf, sizeof(buf));
	assert_string_equal(buf, want);
}

static void test_auto(void **st)
{
	struct mp_grid g;

	(void)st;
	expect_auto(1, "1");
	expect_auto(5, "5");
	expect_auto(8, "8");
	expect_auto(9, "3x3");
	expect_auto(10, "4x3");
	expect_auto(12, "4x3");
	expect_auto(13, "4x4");
	expect_auto(16, "4x4");
	expect_auto(17, "5x4");
	expect_auto(100, "10x10");
	expect_auto(256, "16x16");
	expect_auto(257, "7x7x6");
	expect_auto(1000, "10x10x10");
	expect_auto(1001, "11x10x10");
	assert_int_equal(mp_grid_auto(0, &g), -EINVAL);
	assert_int_equal(mp_grid_auto(-3, &g), -EINVAL);

	/* always enough cells, never a side shorter than the longest minus one,
	 * and no near-cubic grid with fewer cells */
	for (int n = 1; n <= 5000; n++) {
		uint64_t cells;
		int lo = 1 << 30, hi = 0;

		assert_int_equal(mp_grid_auto(n, &g), 0);
		assert_int_equal(g.ndims, n <= 8 ? 1 : n <= 256 ? 2 : 3);
		cells = mp_grid_cells(&g);
		assert_true(cells >= (uint64_t)n);
		for (int i = 0; i < g.ndims; i++) {
			lo = g.dims[i] < lo ? g.dims[i] : lo;
			hi = g.dims[i] > hi ? g.dims[i] : hi;
		}
		assert_true(hi - lo <= 1);
		/* one side shorter would not fit */
		if (hi > 1)
			assert_true(cells / (uint64_t)hi * (uint64_t)(hi - 1) < (uint64_t)n);
	}
	assert_int_equal(mp_grid_auto(2147483647, &g), 0);
	assert_true(mp_grid_cells(&g) >= 2147483647ULL);
}

static void test_coords(void **st)
{
	static const char *const grids[] = { "2x2x2", "4x4", "3x5x2", "7", "2x3x1x4" };
	int coords[MP_MAX_GRID_DIMS];
	struct mp_grid g;

	(void)st;
	for (size_t k = 0; k < sizeof(grids) / sizeof(grids[0]); k++) {
		assert_int_equal(mp_grid_parse(grids[k], &g), 0);
		for (uint64_t c = 0; c < mp_grid_cells(&g); c++) {
			mp_grid_coords(&g, c, coords);
			for (int i = 0; i < g.ndims; i++)
				assert_true(coords[i] >= 0 && coords[i] < g.dims[i]);
			assert_true(mp_grid_cell(&g, coords) == c);
		}
	}
	/* dim 0 fastest */
	assert_int_equal(mp_grid_parse("3x5x2", &g), 0);
	mp_grid_coords(&g, 1, coords);
	assert_int_equal(coords[0], 1);
	mp_grid_coords(&g, 3, coords);
	assert_int_equal(coords[0], 0);
	assert_int_equal(coords[1], 1);
	mp_grid_coords(&g, 15, coords);
	assert_int_equal(coords[2], 1);
	assert_int_equal(coords[1], 0);
}

static void test_init(void **st)
{
	struct mp_grid_grouping gg;
	struct mp_grid g;

	(void)st;
	assert_int_equal(mp_grid_parse("2x2x2", &g), 0);
	assert_int_equal(mp_grid_grouping_init(&gg, &g, 8), 0);
	assert_int_equal(mp_grid_grouping_init(&gg, &g, 6), 0);
	assert_int_equal(mp_grid_grouping_init(&gg, &g, 9), -EINVAL);
	assert_int_equal(mp_grid_grouping_init(&gg, &g, 0), -EINVAL);
	assert_int_equal(mp_grid_grouping_init(&gg, &g, -1), -EINVAL);
	g.ndims = 0;
	assert_int_equal(mp_grid_grouping_init(&gg, &g, 1), -EINVAL);
	assert_string_equal(mp_grid_grouping_ops.name, "grid");
}

/*
 * Form every rank's group for @rounds rounds and check: each rank is in
 * exactly one group; all members see the same id, size and member order;
 * my_index is the rank's position; members share every coordinate but the
 * round's dim and are sorted along it; ids of distinct groups differ.
 * @expect_size: the size of every group, or 0 not to check it.
 */
static void check_grouping(const char *grid, int npeers, int rounds, int expect_size)
{
	struct mp_grid_grouping gg;
	struct mp_grid g;
	int *mem = calloc((size_t)npeers * (size_t)npeers, sizeof(int));
	struct mp_group *grp = calloc((size_t)npeers, sizeof(*grp));

	assert_non_null(mem);
	assert_non_null(grp);
	assert_int_equal(mp_grid_parse(grid, &g), 0);
	assert_int_equal(mp_grid_grouping_init(&gg, &g, npeers), 0);
	for (int t = 0; t < rounds; t++) {
		int dim = t % g.ndims;
		int covered = 0;

		for (int r = 0; r < npeers; r++) {
			grp[r].members = mem + (size_t)r * (size_t)npeers;
			assert_int_equal(mp_grid_grouping_ops.form(&gg, (uint32_t)t, r, &grp[r]), 0);
			mp_grid_grouping_ops.after_round(&gg, (uint32_t)t, &grp[r]);
		}
		for (int r = 0; r < npeers; r++) {
			const struct mp_group *a = &grp[r];
			int ca[MP_MAX_GRID_DIMS], cb[MP_MAX_GRID_DIMS];

			if (expect_size)
				assert_int_equal(a->size, expect_size);
			assert_true(a->size >= 1 && a->size <= g.dims[dim]);
			assert_true(a->my_index >= 0 && a->my_index < a->size);
			assert_int_equal(a->members[a->my_index], r);
			mp_grid_coords(&g, (uint64_t)r, ca);
			for (int i = 0; i < a->size; i++) {
				const struct mp_group *b = &grp[a->members[i]];

				/* identical view from every member */
				assert_int_equal(b->id, a->id);
				assert_int_equal(b->size, a->size);
				assert_memory_equal(b->members, a->members,
						    (size_t)a->size * sizeof(int));
				assert_int_equal(b->my_index, i);
				/* same line, ordered along dim */
				mp_grid_coords(&g, (uint64_t)a->members[i], cb);
				for (int d = 0; d < g.ndims; d++)
					if (d != dim)
						assert_int_equal(cb[d], ca[d]);
				if (i)
					assert_true(a->members[i] > a->members[i - 1]);
			}
			/* every present peer of the line is in the group */
			{
				int present = 0;

				memcpy(cb, ca, sizeof(ca));
				for (int k = 0; k < g.dims[dim]; k++) {
					cb[dim] = k;
					if (mp_grid_cell(&g, cb) < (uint64_t)npeers)
						present++;
				}
				assert_int_equal(present, a->size);
			}
			/* groups are disjoint: another group never shares the id */
			for (int o = 0; o < npeers; o++) {
				int same = 0;

				for (int i = 0; i < a->size; i++)
					same |= a->members[i] == o;
				if (!same)
					assert_int_not_equal(grp[o].id, a->id);
			}
			/* count each group once, by its first member */
			if (a->my_index == 0)
				covered += a->size;
		}
		assert_int_equal(covered, npeers);
	}
	free(mem);
	free(grp);
}

static void test_full_grids(void **st)
{
	(void)st;
	check_grouping("2x2x2", 8, 7, 2);
	check_grouping("4x4", 16, 5, 4);
	check_grouping("3x3", 9, 4, 3);
	check_grouping("3x5x2", 30, 6, 0);
	check_grouping("8", 8, 2, 8);
}

static void test_partial_grids(void **st)
{
	(void)st;
	check_grouping("2x2x2", 6, 6, 0);
	check_grouping("4x4", 10, 4, 0);
	check_grouping("3x3", 5, 4, 0);
	check_grouping("3x5x2", 17, 6, 0);
	check_grouping("8", 3, 2, 3);
}

/* Exact membership of the 2x2x2 grid: round t pairs ranks differing in bit t. */
static void test_2x2x2_members(void **st)
{
	struct mp_grid_grouping gg;
	struct mp_grid g;
	int mem[8];
	struct mp_group grp = { .members = mem };

	(void)st;
	assert_int_equal(mp_grid_parse("2x2x2", &g), 0);
	assert_int_equal(mp_grid_grouping_init(&gg, &g, 8), 0);
	for (int t = 0; t < 3; t++) {
		for (int r = 0; r < 8; r++) {
			int lo = r & ~(1 << t), hi = r | (1 << t);

			assert_int_equal(mp_grid_grouping_ops.form(&gg, (uint32_t)t, r, &grp), 0);
			assert_int_equal(grp.size, 2);
			assert_int_equal(mem[0], lo);
			assert_int_equal(mem[1], hi);
			assert_int_equal(grp.my_index, r == lo ? 0 : 1);
		}
	}
}

/* In a partial grid the part index is the position, not the coordinate. */
static void test_partial_index(void **st)
{
	struct mp_grid_grouping gg;
	struct mp_grid g;
	int mem[5];
	struct mp_group grp = { .members = mem };

	(void)st;
	/* 5 peers on 3x3: cells 0..4; row 1 holds ranks 3, 4; column 0 holds 0, 3 */
	assert_int_equal(mp_grid_parse("3x3", &g), 0);
	assert_int_equal(mp_grid_grouping_init(&gg, &g, 5), 0);
	assert_int_equal(mp_grid_grouping_ops.form(&gg, 0, 4, &grp), 0);
	assert_int_equal(grp.size, 2);
	assert_int_equal(mem[0], 3);
	assert_int_equal(mem[1], 4);
	assert_int_equal(grp.my_index, 1);
	assert_int_equal(mp_grid_grouping_ops.form(&gg, 1, 2, &grp), 0);
	assert_int_equal(grp.size, 1);
	assert_int_equal(mem[0], 2);
	assert_int_equal(grp.my_index, 0);
	assert_int_equal(mp_grid_grouping_ops.form(&gg, 1, 3, &grp), 0);
	assert_int_equal(grp.size, 2);
	assert_int_equal(grp.my_index, 1);
	/* bad arguments */
	assert_int_equal(mp_grid_grouping_ops.form(&gg, 0, 5, &grp), -EINVAL);
	assert_int_equal(mp_grid_grouping_ops.form(&gg, 0, -1, &grp), -EINVAL);
}

/* Averaging x_r = r within the groups for d rounds on a full grid gives the
 * exact global mean at every peer. */
static void check_mean(const char *grid)
{
	struct mp_grid_grouping gg;
	struct mp_grid g;
	int n;
	double *x, *nx, mean;
	int *mem;
	struct mp_group grp;

	assert_int_equal(mp_grid_parse(grid, &g), 0);
	n = (int)mp_grid_cells(&g);
	assert_int_equal(mp_grid_grouping_init(&gg, &g, n), 0);
	x = calloc((size_t)n, sizeof(*x));
	nx = calloc((size_t)n, sizeof(*nx));
	mem = calloc((size_t)n, sizeof(*mem));
	assert_true(x && nx && mem);
	grp.members = mem;
	for (int r = 0; r < n; r++)
		x[r] = r;
	mean = (n - 1) / 2.0;
	for (int t = 0; t < g.ndims; t++) {
		for (int r = 0; r < n; r++) {
			double s = 0;

			assert_int_equal(mp_grid_grouping_ops.form(&gg, (uint32_t)t, r, &grp), 0);
			for (int i = 0; i < grp.size; i++)
				s += x[mem[i]];
			nx[r] = s / grp.size;
		}
		memcpy(x, nx, (size_t)n * sizeof(*x));
	}
	for (int r = 0; r < n; r++)
		assert_true(x[r] == mean);
	free(x);
	free(nx);
	free(mem);
}

static void test_exact_mean(void **st)
{
	(void)st;
	check_mean("2x2x2");
	check_mean("4x4");
	check_mean("3x3");
	check_mean("2x3x4");
	check_mean("16");
}

/* Ids depend on the round, and are stable across calls. */
static void test_ids(void **st)
{
	struct mp_grid_grouping gg;
	struct mp_grid g;
	int mem[16];
	struct mp_group a = { .members = mem }, b = { .members = mem };

	(void)st;
	assert_int_equal(mp_grid_parse("4x4", &g), 0);
	assert_int_equal(mp_grid_grouping_init(&gg, &g, 16), 0);
	assert_int_equal(mp_grid_grouping_ops.form(&gg, 0, 5, &a), 0);
	assert_int_equal(mp_grid_grouping_ops.form(&gg, 0, 5, &b), 0);
	assert_int_equal(a.id, b.id);
	/* round 2 uses the same dim and line as round 0, but is another group */
	assert_int_equal(mp_grid_grouping_ops.form(&gg, 2, 5, &b), 0);
	assert_int_not_equal(a.id, b.id);
}

/*
 * Failure memory: a down peer's cell is empty and every other cell keeps
 * its peer, so the groups that do not hold it are those of the full grid,
 * whatever a peer knows of the death (the views of peers that have or have
 * not yet met it form the same groups).
 */
static void test_down_cells_empty(void **st)
{
	struct mp_grid g;
	struct mp_grid_grouping gg, full;
	int live[14], n = 0, members[16], fm[16];
	struct mp_group grp = {.members = members}, fgrp = {.members = fm};

	(void)st;
	/* 16 peers on 4x4 with ranks 5 and 10 down. */
	assert_int_equal(mp_grid_parse("4x4", &g), 0);
	assert_int_equal(mp_grid_grouping_init(&gg, &g, 16), 0);
	assert_int_equal(mp_grid_grouping_init(&full, &g, 16), 0);
	for (int r = 0; r < 16; r++)
		if (r != 5 && r != 10)
			live[n++] = r;
	assert_int_equal(mp_grid_grouping_set_live(&gg, live, n), 0);
	for (int i = 0; i < n; i++) {
		for (uint32_t t = 0; t < 2; t++) {
			int k = 0;

			assert_int_equal(mp_grid_grouping_ops.form(&gg, t, live[i], &grp), 0);
			assert_int_equal(mp_grid_grouping_ops.form(&full, t, live[i], &fgrp), 0);
			/* The full grid's line less the down peers, in order, with the
			 * same id; the part index counts the live members only. */
			assert_int_equal(grp.id, fgrp.id);
			for (int m = 0; m < fgrp.size; m++)
				if (fgrp.members[m] != 5 && fgrp.members[m] != 10)
					assert_int_equal(grp.members[k++], fgrp.members[m]);
			assert_int_equal(grp.size, k);
			assert_int_equal(grp.members[grp.my_index], live[i]);
		}
	}
	/* Rank 1's column (1, 5, 9, 13) in round 1 has 3 members, rank 4's row
	 * (4, 5, 6, 7) in round 0 too; rank 0's row is whole. */
	assert_int_equal(mp_grid_grouping_ops.form(&gg, 1, 1, &grp), 0);
	assert_int_equal(grp.size, 3);
	assert_int_equal(grp.members[1], 9);
	assert_int_equal(mp_grid_grouping_ops.form(&gg, 0, 4, &grp), 0);
	assert_int_equal(grp.size, 3);
	assert_int_equal(mp_grid_grouping_ops.form(&gg, 0, 0, &grp), 0);
	assert_int_equal(grp.size, 4);
	/* A down rank forms no group. */
	assert_int_equal(mp_grid_grouping_ops.form(&gg, 0, 5, &grp), -EHOSTUNREACH);

	/* 8 peers on 2x2x2, rank 7 down: its partners (6, 5, 3) are alone in
	 * one round each, and nobody else's group changes. */
	assert_int_equal(mp_grid_parse("2x2x2", &g), 0);
	assert_int_equal(mp_grid_grouping_init(&gg, &g, 8), 0);
	for (int r = 0; r < 7; r++)
		live[r] = r;
	assert_int_equal(mp_grid_grouping_set_live(&gg, live, 7), 0);
	for (int r = 0; r < 7; r++)
		for (uint32_t t = 0; t < 3; t++) {
			int partner = r ^ (1 << t);

			assert_int_equal(mp_grid_grouping_ops.form(&gg, t, r, &grp), 0);
			assert_int_equal(grp.size, partner == 7 ? 1 : 2);
		}
	/* Everyone back: the full grid again. */
	assert_int_equal(mp_grid_grouping_set_live(&gg, NULL, 8), 0);
	assert_int_equal(mp_grid_grouping_ops.form(&gg, 0, 6, &grp), 0);
	assert_int_equal(grp.size, 2);
	assert_int_equal(mp_grid_grouping_set_live(&gg, live, 0), -EINVAL);
}

/* The plan hash tells apart every field a member may disagree on. */
static void test_plan_hash(void **st)
{
	uint64_t ids[3] = {0, 1, 2}, lens[3] = {10, 10, 11};
	uint8_t modes[3] = {0, 0, 0};
	uint32_t h = mp_plan_hash(7, 3, ids, modes, lens);

	(void)st;
	assert_int_equal(mp_plan_hash(7, 3, ids, modes, lens), h);
	assert_int_not_equal(mp_plan_hash(8, 3, ids, modes, lens), h);
	lens[2] = 10, lens[1] = 11;
	assert_int_not_equal(mp_plan_hash(7, 3, ids, modes, lens), h);
	lens[2] = 11, lens[1] = 10, ids[2] = 3;
	assert_int_not_equal(mp_plan_hash(7, 3, ids, modes, lens), h);
	ids[2] = 2, modes[1] = 2;
	assert_int_not_equal(mp_plan_hash(7, 3, ids, modes, lens), h);
	modes[1] = 0;
	assert_int_not_equal(mp_plan_hash(7, 2, ids, modes, lens), h);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_parse),
		cmocka_unit_test(test_format),
		cmocka_unit_test(test_auto),
		cmocka_unit_test(test_coords),
		cmocka_unit_test(test_init),
		cmocka_unit_test(test_full_grids),
		cmocka_unit_test(test_partial_grids),
		cmocka_unit_test(test_2x2x2_members),
		cmocka_unit_test(test_partial_index),
		cmocka_unit_test(test_exact_mean),
		cmocka_unit_test(test_ids),
		cmocka_unit_test(test_down_cells_empty),
		cmocka_unit_test(test_plan_hash),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
