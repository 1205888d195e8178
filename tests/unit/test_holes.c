/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The holes a peer placing itself chooses from (mp_mm_holes, take_hole in
 * src/matchmaker.c): which cells of a round count as free, in which order,
 * and that placers reading the same declarations each get a different cell
 * when they take the entries in the order of their ids.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <string.h>

#include "grid.h"
#include "matchmaker.h"
#include "rdv.h"

#define CELLS 16

struct view {
	struct mp_hole h[CELLS];
	uint32_t count[CELLS];
	uint8_t used[CELLS];
};

static int holes(const struct mp_grid *g, uint64_t self, uint32_t round, const struct mp_decl *d,
		 int n, struct view *v)
{
	memset(v, 0, sizeof(*v));
	return mp_mm_holes(g, self, round, d, n, v->h, v->count, v->used);
}

/* A member at cell (x, y) of a 4x4 grid declaring for @round. */
static struct mp_decl at(const struct mp_grid *g, uint64_t id, uint32_t round, int x, int y)
{
	int c[2] = {x, y}, dim = (int)(round % 2);

	struct mp_decl d = {.id = id, .expires_ms = 1000, .mode = MP_MODE_NORMAL,
			    .coord = (int16_t)c[dim]};
	c[dim] = 0;
	d.line = (uint32_t)mp_grid_cell(g, c);
	return d;
}

/* A full 4x4 grid less the cells in @skip (x + 4y), declaring for @round. */
static int grid_less(const struct mp_grid *g, uint32_t round, const int *skip, int nskip,
		     struct mp_decl *d)
{
	int n = 0;

	for (int cell = 0; cell < CELLS; cell++) {
		int gone = 0;
		for (int k = 0; k < nskip; k++)
			gone |= skip[k] == cell;
		if (!gone)
			d[n++] = at(g, 100 + (uint64_t)cell, round, cell % 4, cell / 4);
	}
	return n;
}

/* Entry @i of @v is cell @coord of line @line, which holds @count members. */
static void expect(const struct view *v, int i, uint32_t line, uint32_t count, int coord)
{
	assert_int_equal(v->h[i].line, line);
	assert_int_equal(v->h[i].count, count);
	assert_int_equal(v->h[i].coord, coord);
}

static void test_full_grid_has_none(void **state)
{
	struct mp_grid g;
	struct mp_decl d[CELLS];
	struct view v;

	(void)state;
	assert_int_equal(mp_grid_parse("4x4", &g), 0);
	assert_int_equal(holes(&g, 1, 0, d, grid_less(&g, 0, NULL, 0, d), &v), 0);
	assert_int_equal(holes(&g, 1, 1, d, grid_less(&g, 1, NULL, 0, d), &v), 0);
}

/* Round 0 varies x: lines are rows, named by their cell with x = 0. */
static void test_order_emptiest_line_first(void **state)
{
	/* Row 1 misses two cells (x 1 and 3), row 3 one (x 2). */
	int skip[] = {1 + 4 * 1, 3 + 4 * 1, 2 + 4 * 3};
	struct mp_grid g;
	struct mp_decl d[CELLS];
	struct view v;

	(void)state;
	assert_int_equal(mp_grid_parse("4x4", &g), 0);
	int n = grid_less(&g, 0, skip, 3, d);
	assert_int_equal(holes(&g, 1, 0, d, n, &v), 3);
	expect(&v, 0, 4, 2, 1);
	expect(&v, 1, 4, 2, 3);
	expect(&v, 2, 12, 3, 2);

	/* Row 2 emptied as well: its four cells come after every line that
	 * has a member, though their count (0) is the lowest. */
	int skip2[] = {1 + 4 * 1, 3 + 4 * 1, 2 + 4 * 3, 0 + 4 * 2, 1 + 4 * 2, 2 + 4 * 2, 3 + 4 * 2};
	n = grid_less(&g, 0, skip2, 7, d);
	assert_int_equal(holes(&g, 1, 0, d, n, &v), 7);
	expect(&v, 0, 4, 2, 1);
	expect(&v, 1, 4, 2, 3);
	expect(&v, 2, 12, 3, 2);
	for (int i = 0; i < 4; i++)
		expect(&v, 3 + i, 8, 0, i);

	/* Round 1 varies y: lines are columns, named by their cell with y = 0. */
	n = grid_less(&g, 1, skip, 3, d);
	assert_int_equal(holes(&g, 1, 1, d, n, &v), 3);
	/* Every column short by one: by line (column), then coordinate. */
	expect(&v, 0, 1, 3, 1);
	expect(&v, 1, 2, 3, 3);
	expect(&v, 2, 3, 3, 1);
}

/*
 * What does not hold a cell: the reader's own declaration (it is the one
 * moving), an absence, a placing, and a coordinate or line off the grid.
 */
static void test_what_holds_a_cell(void **state)
{
	int skip[] = {5};
	struct mp_grid g;
	struct mp_decl d[CELLS + 4];
	struct view v;

	(void)state;
	assert_int_equal(mp_grid_parse("4x4", &g), 0);
	int n = grid_less(&g, 0, skip, 1, d);
	assert_int_equal(holes(&g, 1, 0, d, n, &v), 1);
	/* The reader's own declaration at (0, 0) leaves that cell free. */
	assert_int_equal(holes(&g, 100, 0, d, n, &v), 2);
	expect(&v, 0, 0, 3, 0);
	expect(&v, 1, 4, 3, 1);
	/* Others' words about cell 5: none takes it. */
	d[n] = at(&g, 7, 0, 1, 1);
	d[n].mode = MP_DECL_ABSENT;
	d[n + 1] = at(&g, 8, 0, 1, 1);
	d[n + 1].mode = MP_DECL_PLACING;
	d[n + 2] = at(&g, 9, 0, 1, 1);
	d[n + 2].line = CELLS;
	d[n + 3] = at(&g, 10, 0, 1, 1);
	d[n + 3].coord = 4;
	assert_int_equal(holes(&g, 1, 0, d, n + 4, &v), 1);
	/* ... the last one still counts in its line (4), though it holds no cell. */
	expect(&v, 0, 4, 4, 1);
	/* A member's declaration does. */
	d[n] = at(&g, 11, 0, 1, 1);
	assert_int_equal(holes(&g, 1, 0, d, n + 1, &v), 0);
}

/*
 * Two joiners and a displaced member place themselves at once, each
 * reading the same declarations (their placings included): taking the
 * list's entries in the order of their ids, they fill three different
 * holes, the emptiest line first.
 */
static void test_placers_spread(void **state)
{
	int skip[] = {0 + 4 * 2, 1 + 4 * 2, 3 + 4 * 0};
	uint64_t placers[] = {900, 40, 7000};
	struct mp_grid g;
	struct mp_decl d[CELLS + 3];
	struct view v;
	int taken[CELLS] = {0};

	(void)state;
	assert_int_equal(mp_grid_parse("4x4", &g), 0);
	int n = grid_less(&g, 0, skip, 3, d);
	for (int k = 0; k < 3; k++) {
		d[n + k] = (struct mp_decl){.id = placers[k], .expires_ms = 1000,
					    .mode = MP_DECL_PLACING, .line = UINT32_MAX};
	}
	for (int k = 0; k < 3; k++) {
		int rank = 0;
		for (int j = 0; j < 3; j++)
			rank += placers[j] < placers[k];
		assert_int_equal(holes(&g, placers[k], 0, d, n + 3, &v), 3);
		int cell = (int)v.h[rank].line + v.h[rank].coord;
		assert_int_equal(taken[cell], 0);
		taken[cell] = 1;
		/* The two holes of row 2 go to the two lowest ids. */
		if (placers[k] != 7000)
			assert_int_equal(v.h[rank].line, 8);
		else
			assert_int_equal(cell, 3);
	}
}

/*
 * When a placer gives its round up (mp_mm_round_left): on a 4x4 grid the
 * next round's declarations come while a line with a hole still waits for
 * it; only round + 2 shows the waiting line went on. One dimension: one
 * line, so any later round does. Three: round + 3.
 */
static void test_round_left_behind(void **state)
{
	struct mp_grid g1, g2, g3;

	(void)state;
	assert_int_equal(mp_grid_parse("8", &g1), 0);
	assert_int_equal(mp_grid_parse("4x4", &g2), 0);
	assert_int_equal(mp_grid_parse("2x2x4", &g3), 0);
	assert_false(mp_mm_round_left(&g2, 6, 5));
	assert_false(mp_mm_round_left(&g2, 6, 6));
	assert_false(mp_mm_round_left(&g2, 6, 7));
	assert_true(mp_mm_round_left(&g2, 6, 8));
	assert_true(mp_mm_round_left(&g2, 6, 9));
	assert_false(mp_mm_round_left(&g1, 6, 6));
	assert_true(mp_mm_round_left(&g1, 6, 7));
	assert_false(mp_mm_round_left(&g3, 6, 8));
	assert_true(mp_mm_round_left(&g3, 6, 9));
	/* No wrap at the top of the round numbers. */
	assert_false(mp_mm_round_left(&g2, UINT32_MAX - 1, UINT32_MAX));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_full_grid_has_none),
		cmocka_unit_test(test_order_emptiest_line_first),
		cmocka_unit_test(test_what_holds_a_cell),
		cmocka_unit_test(test_placers_spread),
		cmocka_unit_test(test_round_left_behind),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
