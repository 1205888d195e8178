/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Virtual grid and group formation. Group formation sits behind an ops table
 * because static membership (this file's grid grouping) will be joined by a
 * decentralised matchmaker, where a peer's next coordinate is its part index.
 */
#ifndef MP_GRID_H
#define MP_GRID_H

#include <stdint.h>
#include <moshpit/moshpit.h>

struct mp_grid {
	int ndims;
	int dims[MP_MAX_GRID_DIMS];
};

/* "4x4", "2x2x2", "8" -> grid; -EINVAL if malformed, a dim < 1 or too many dims. */
int mp_grid_parse(const char *s, struct mp_grid *g);
/* Smallest near-cubic grid with >= npeers cells: d = 1 up to 8 peers, else 2 (or 3 above 256). */
int mp_grid_auto(int npeers, struct mp_grid *g);
/* Number of cells (product of dims). */
uint64_t mp_grid_cells(const struct mp_grid *g);
/* Cell index (row-major, dim 0 fastest) <-> coordinates. */
void mp_grid_coords(const struct mp_grid *g, uint64_t cell, int *coords);
uint64_t mp_grid_cell(const struct mp_grid *g, const int *coords);
/* "2x2x2" into buf. */
void mp_grid_format(const struct mp_grid *g, char *buf, size_t len);

/*
 * The line of round @round through @cell: the cells that differ from @cell
 * only in dimension round mod d, in coordinate order. @occupant names each
 * cell's peer, or -1 for an empty one. Writes the occupants in that order,
 * which is their part index, to @members (room for the dimension's length),
 * sets *@id to the line's group id (the same from every cell on it, distinct
 * for distinct lines of a round) and returns the count. The static grouping
 * and tools/mpsim form their groups with it.
 */
int mp_grid_line(const struct mp_grid *g, uint64_t cell, uint32_t round,
		 int (*occupant)(void *arg, uint64_t cell), void *arg, int *members, uint32_t *id);

/* One round's group, as seen by one member. */
struct mp_group {
	uint32_t id;     /* same for every member */
	int size;        /* members */
	int my_index;    /* this peer's part index */
	int *members;    /* peer-table indices, in part-index order; capacity = npeers */
	/* Matchmade groups (dht): the roster's view, identical on every member.
	 * NULL: from the peer table (bandwidth) and all MP_MODE_NORMAL. */
	const double *bw;     /* size entries */
	const uint8_t *mode;  /* size entries, enum mp_mode */
	/* Static runs: the configured line the group comes from, in part
	 * order, with the members down in this peer's view (the grid's cells,
	 * the butterfly's peers); the pairwise exchange plans on it rather
	 * than on the view (pairs.c). NULL: the group is the plan (dht
	 * rosters, the ring). */
	const int *line;
	int line_size;
};

/* Largest group a roster can describe. */
#define MP_MAX_GROUP 64

/*
 * How a context forms its groups, round after round (src/core's round loop
 * serves static and dht runs alike): the static grid below, or the dht
 * matchmaker (src/ctrl/matchmaker.c). Optional entries may be NULL.
 */
struct mp_grouping_ops {
	const char *name;
	/* Optional: before an operation's rounds; a negative errno fails it. */
	int (*begin)(void *state);
	/* Optional: the global round to run next, given the context's count
	 * @round (a matchmaker that fell behind moves to the run's round). */
	uint32_t (*next_round)(void *state, uint32_t round);
	/* Form the group of @rank for global round @round into @out (whose
	 * members have room for max(npeers, MP_MAX_GROUP)). Returns 0,
	 * -EHOSTUNREACH when no group formed (the round is sat out, values
	 * kept), -EAGAIN when none formed because the run is at a later
	 * round (sat out too; next_round() names the run's round, and the
	 * context matches it in the same operation), or another negative
	 * errno, which fails the operation. */
	int (*form)(void *state, uint32_t round, int rank, struct mp_group *out);
	/* Nonzero when form() of later rounds may be called ahead, with no
	 * side effect, so that the context dials their members early. */
	int lookahead;
	/* Optional: told after each round's all-reduce. */
	void (*after_round)(void *state, uint32_t round, const struct mp_group *g);
	/* Optional: after an operation's rounds. */
	void (*end)(void *state);
	/* Optional: round @round's configured line through @rank, every peer
	 * on it, down or not, in part order, to @out (room for npeers);
	 * returns the count, or a negative errno. A grouping that has one
	 * (the static grid) sets mp_group.line from it; a roster needs none. */
	int (*line)(void *state, uint32_t round, int rank, int *out);
};

/*
 * Static grid grouping: rank r sits in cell r (npeers <= cells). In round t
 * the group is every present peer sharing all coordinates but dim t mod d,
 * ordered by that coordinate, which is also its part index.
 */
struct mp_grid_grouping {
	struct mp_grid grid;
	int npeers;
	/* Failure memory: with peers down, the live ranks (ascending); the
	 * cells of the others are empty, so a dead peer's groupmates meet
	 * without it and every other group is as on the full grid, whatever
	 * each peer knows of the death. NULL: everyone. */
	const int *live;
	int nlive;
};
extern const struct mp_grouping_ops mp_grid_grouping_ops;
int mp_grid_grouping_init(struct mp_grid_grouping *gg, const struct mp_grid *g, int npeers);
/* Leave the ranks not in @live (@nlive ranks, ascending, kept by the
 * caller) out of their lines from now on; NULL or every peer: everyone. */
int mp_grid_grouping_set_live(struct mp_grid_grouping *gg, const int *live, int nlive);

/*
 * The plan hash of one exchange (SCATTER's aux): group id, and per member
 * its id, mode and part length. Members that differ in any of these never
 * combine their parts.
 */
uint32_t mp_plan_hash(uint32_t group_id, int k, const uint64_t *ids, const uint8_t *modes,
		      const uint64_t *lens);

#endif
