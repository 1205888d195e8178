/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Virtual grid and the static grid grouping.
 *
 * Rank r sits in cell r; cells are numbered row-major with dimension 0
 * fastest. In round t every peer changes partners along dimension t mod d,
 * so after d rounds on a full grid each peer's value has met every other
 * peer's exactly once and the average is exact.
 */
#include "grid.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

/* Largest number of cells: ranks are ints, and one more bit is harmless. */
#define GRID_MAX_CELLS (1ULL << 31)

static int grid_valid(const struct mp_grid *g)
{
	uint64_t cells = 1;

	if (!g || g->ndims < 1 || g->ndims > MP_MAX_GRID_DIMS)
		return 0;
	for (int i = 0; i < g->ndims; i++) {
		if (g->dims[i] < 1)
			return 0;
		/* each dim < 2^31 and the running product <= 2^31: no overflow */
		cells *= (uint64_t)g->dims[i];
		if (cells > GRID_MAX_CELLS)
			return 0;
	}
	return 1;
}

int mp_grid_parse(const char *s, struct mp_grid *g)
{
	struct mp_grid t;
	uint64_t cells = 1;
	const char *p = s;

	if (!s || !g)
		return -EINVAL;
	memset(&t, 0, sizeof(t));
	for (;;) {
		uint64_t v = 0;
		const char *start = p;

		/* digits only: no sign, no spaces, no empty field */
		while (*p >= '0' && *p <= '9') {
			v = v * 10 + (uint64_t)(*p - '0');
			if (v > GRID_MAX_CELLS)
				return -EINVAL;
			p++;
		}
		if (p == start || v < 1)
			return -EINVAL;
		if (t.ndims == MP_MAX_GRID_DIMS)
			return -EINVAL;
		cells *= v;
		if (cells > GRID_MAX_CELLS)
			return -EINVAL;
		/* v <= 2^31 here; 2^31 itself only passes as a lone "2147483648",
		 * which does not fit an int */
		if (v > (uint64_t)INT32_MAX)
			return -EINVAL;
		t.dims[t.ndims++] = (int)v;
		if (*p == '\0')
			break;
		if (*p != 'x' && *p != 'X')
			return -EINVAL;
		p++;
	}
	*g = t;
	return 0;
}

/* Smallest c with c^d >= n. */
static uint64_t ceil_root(uint64_t n, int d)
{
	uint64_t c = 1;

	for (;;) {
		uint64_t pw = 1;

		for (int i = 0; i < d; i++)
			pw *= c;
		if (pw >= n)
			return c;
		c++;
	}
}

int mp_grid_auto(int npeers, struct mp_grid *g)
{
	int d, k;
	uint64_t c;

	if (npeers < 1 || !g)
		return -EINVAL;
	d = npeers <= 8 ? 1 : npeers <= 256 ? 2 : 3;
	c = ceil_root((uint64_t)npeers, d);

	/*
	 * Near-cubic means every side is c or c - 1. With k sides of c the
	 * cell count grows with k, so the smallest k that fits gives both the
	 * fewest cells and (as the sides differ by at most one) the most
	 * cubic shape. The longer sides come first.
	 */
	for (k = 0; k < d; k++) {
		uint64_t cells = 1;

		for (int i = 0; i < d; i++)
			cells *= i < k ? c : c - 1;
		if (cells >= (uint64_t)npeers)
			break;
	}
	memset(g, 0, sizeof(*g));
	g->ndims = d;
	for (int i = 0; i < d; i++)
		g->dims[i] = (int)(i < k ? c : c - 1);
	return 0;
}

uint64_t mp_grid_cells(const struct mp_grid *g)
{
	uint64_t cells = 1;

	for (int i = 0; i < g->ndims; i++)
		cells *= (uint64_t)g->dims[i];
	return cells;
}

void mp_grid_coords(const struct mp_grid *g, uint64_t cell, int *coords)
{
	for (int i = 0; i < g->ndims; i++) {
		coords[i] = (int)(cell % (uint64_t)g->dims[i]);
		cell /= (uint64_t)g->dims[i];
	}
}

uint64_t mp_grid_cell(const struct mp_grid *g, const int *coords)
{
	uint64_t cell = 0;

	for (int i = g->ndims - 1; i >= 0; i--)
		cell = cell * (uint64_t)g->dims[i] + (uint64_t)coords[i];
	return cell;
}

void mp_grid_format(const struct mp_grid *g, char *buf, size_t len)
{
	size_t used = 0;

	if (!len)
		return;
	buf[0] = '\0';
	for (int i = 0; i < g->ndims && used < len; i++) {
		int n = snprintf(buf + used, len - used, i ? "x%d" : "%d", g->dims[i]);

		if (n < 0)
			break;
		used += (size_t)n;
	}
}

/*
 * A bijective 32-bit mixer (xor-shifts and odd multipliers are invertible),
 * so distinct lines of one round get distinct group ids.
 */
static uint32_t mix32(uint32_t x)
{
	x ^= x >> 16;
	x *= 0x3b9ac9f5u;
	x ^= x >> 13;
	x *= 0x6c8e9cf7u;
	x ^= x >> 16;
	return x;
}

static uint32_t group_id(uint32_t round, int dim, uint64_t line)
{
	uint32_t salt = mix32(round * 0x9e3779b9u + (uint32_t)dim + 1u);

	/* line < 2^31 cells, so the truncation loses nothing */
	return mix32((uint32_t)line ^ salt);
}

int mp_grid_line(const struct mp_grid *g, uint64_t cell, uint32_t round,
		 int (*occupant)(void *arg, uint64_t cell), void *arg, int *members, uint32_t *id)
{
	int dim = (int)(round % (uint32_t)g->ndims);
	uint64_t stride = 1, base;
	int n = 0;

	for (int i = 0; i < dim; i++)
		stride *= (uint64_t)g->dims[i];
	/* the line's first cell: @cell with coordinate dim set to 0 */
	base = cell - (cell / stride % (uint64_t)g->dims[dim]) * stride;

	/*
	 * Empty cells (a partial grid) are skipped, so a member's part index
	 * is its position in this list, which differs from its coordinate
	 * when lower cells are empty.
	 */
	for (int k = 0; k < g->dims[dim]; k++) {
		int p = occupant(arg, base + (uint64_t)k * stride);

		if (p >= 0)
			members[n++] = p;
	}
	*id = group_id(round, dim, base);
	return n;
}

/* Whether @rank is in the ascending @live list of @n ranks. */
static int is_live(const int *live, int n, int rank)
{
	int lo = 0, hi = n;

	while (lo < hi) {
		int mid = lo + (hi - lo) / 2;

		if (live[mid] == rank)
			return 1;
		if (live[mid] < rank)
			lo = mid + 1;
		else
			hi = mid;
	}
	return 0;
}

/* Rank r sits in cell r: the first npeers cells are occupied. With peers
 * down, their cells are empty (holes), and every other cell keeps its peer. */
static int grid_occupant(void *arg, uint64_t cell)
{
	const struct mp_grid_grouping *gg = arg;

	if (cell >= (uint64_t)gg->npeers)
		return -1;
	if (gg->live && !is_live(gg->live, gg->nlive, (int)cell))
		return -1;
	return (int)cell;
}

int mp_grid_grouping_set_live(struct mp_grid_grouping *gg, const int *live, int nlive)
{
	if (!live || nlive >= gg->npeers) {
		gg->live = NULL;
		gg->nlive = gg->npeers;
		return 0;
	}
	if (nlive < 1)
		return -EINVAL;
	gg->live = live;
	gg->nlive = nlive;
	return 0;
}

static int grid_form(void *state, uint32_t round, int rank, struct mp_group *out)
{
	struct mp_grid_grouping *gg = state;
	uint64_t cell = (uint64_t)rank;

	if (!gg || !out || !out->members || rank < 0 || rank >= gg->npeers)
		return -EINVAL;
	if (gg->live && !is_live(gg->live, gg->nlive, rank))
		return -EHOSTUNREACH; /* not live ourselves: cannot happen */
	out->size = mp_grid_line(&gg->grid, cell, round, grid_occupant, gg, out->members,
				 &out->id);
	out->my_index = -1;
	for (int i = 0; i < out->size; i++)
		if (out->members[i] == rank)
			out->my_index = i;
	return 0;
}

/* The line without the failure memory's holes: the grouping as if every
 * peer were live. */
static int grid_line_all(void *state, uint32_t round, int rank, int *out)
{
	struct mp_grid_grouping all;
	uint32_t id;

	if (!state || !out || rank < 0 || rank >= ((struct mp_grid_grouping *)state)->npeers)
		return -EINVAL;
	all = *(struct mp_grid_grouping *)state;
	all.live = NULL;
	return mp_grid_line(&all.grid, (uint64_t)rank, round, grid_occupant, &all, out, &id);
}

static void grid_after_round(void *state, uint32_t round, const struct mp_group *g)
{
	/* static membership: nothing learnt from a round */
	(void)state;
	(void)round;
	(void)g;
}

const struct mp_grouping_ops mp_grid_grouping_ops = {
	.name = "grid",
	.form = grid_form,
	.lookahead = 1,
	.after_round = grid_after_round,
	.line = grid_line_all,
};

uint32_t mp_plan_hash(uint32_t group_id, int k, const uint64_t *ids, const uint8_t *modes,
		      const uint64_t *lens)
{
	/* FNV-1a over the fields, little-endian, then mixed: identical on
	 * every member and every build. */
	uint64_t h = 0xcbf29ce484222325ull;
#define MIX_IN(v, bytes)                                            \
	do {                                                          \
		uint64_t v_ = (v);                                    \
		for (int b_ = 0; b_ < (bytes); b_++, v_ >>= 8)        \
			h = (h ^ (v_ & 0xff)) * 0x100000001b3ull;      \
	} while (0)
	MIX_IN(group_id, 4);
	MIX_IN((uint32_t)k, 4);
	for (int m = 0; m < k; m++) {
		MIX_IN(ids[m], 8);
		MIX_IN(modes ? modes[m] : 0, 1);
		MIX_IN(lens[m], 8);
	}
#undef MIX_IN
	return mix32((uint32_t)h ^ (uint32_t)(h >> 32));
}

int mp_grid_grouping_init(struct mp_grid_grouping *gg, const struct mp_grid *g, int npeers)
{
	if (!gg || !grid_valid(g) || npeers < 1 || (uint64_t)npeers > mp_grid_cells(g))
		return -EINVAL;
	memset(gg, 0, sizeof(*gg));
	gg->grid = *g;
	gg->npeers = npeers;
	gg->nlive = npeers;
	return 0;
}
