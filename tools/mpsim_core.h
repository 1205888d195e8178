/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * mpsim's simulation engine: N virtual peers averaging vectors round by
 * round, with the library's own grid lines (mp_grid_line) and weighted
 * reduction (mp_k_wmean). tools/mpsim.c is the command line around it; the
 * unit test drives it directly.
 */
#ifndef MPSIM_CORE_H
#define MPSIM_CORE_H

#include <stddef.h>
#include <stdint.h>

#include "grid.h"

enum mpsim_algo {
	MPSIM_MOSHPIT,   /* grid lines along dim t mod d */
	MPSIM_RANDOM,    /* a fresh random partition into groups of M */
	MPSIM_ALLREDUCE, /* everyone at once, or nobody if anyone fails */
	MPSIM_GOSSIP,    /* each peer with its ring neighbours */
	MPSIM_PUSHSUM,   /* push-sum over the one-peer exponential graph */
	MPSIM_NALGOS
};

/* Moshpit: where a peer sits after a round. */
enum mpsim_coords {
	MPSIM_COORDS_FIXED,      /* its random cell, for good (the paper's simulation) */
	MPSIM_COORDS_MATCHMAKER, /* coordinate t mod d := part index rotated by the group id */
};

struct mpsim_cfg {
	enum mpsim_algo algo;
	int peers;
	struct mp_grid grid;      /* moshpit; peers <= cells */
	enum mpsim_coords coords; /* moshpit */
	int group;                /* random: group size M */
	int neighbors;            /* gossip: neighbours on each side */
	size_t len;               /* values per peer */
	double fail;              /* probability that a peer sits out a round */
	int direct_pairs;         /* the library's MP_DIRECT_PAIRS (mpsim: 1, the default) */
};

/* xoshiro256**, seeded through splitmix64. */
struct mpsim_rng {
	uint64_t s[4];
};

/* splitmix64: the next value of the sequence at *state (seeds, restarts). */
uint64_t mpsim_splitmix(uint64_t *state);
void mpsim_rng_seed(struct mpsim_rng *r, uint64_t seed);
uint64_t mpsim_rng_next(struct mpsim_rng *r);

struct mpsim {
	struct mpsim_cfg cfg;
	struct mpsim_rng rng;
	uint32_t round;     /* rounds run so far */
	int nfailed;        /* peers that sat out the last round */
	float *x;           /* peers × len; push-sum: the sums s */
	float *w;           /* per peer: the library's averaging weight; push-sum: its weight */
	float *nx, *nw;     /* gossip and push-sum: the next round's values */
	double *mean;       /* len: scratch for the error */
	uint8_t *alive;     /* in the current round */
	int *members;       /* one group, in member order */
	int *held;          /* their coordinates along the line (matchmaker rule) */
	float *gw;          /* its weights */
	float *pairs;       /* short vectors: a group's sums in the pairwise exchange */
	int *order;         /* random: the round's permutation */
	uint32_t *seen;     /* moshpit: round + 1 once the peer's line is done */
	int *cell_of;       /* moshpit: peer -> cell */
	int *peer_at;       /* moshpit: cell -> peer, or -1 */
};

/* Largest grid mpsim holds (a cell table of 4 bytes per cell). */
#define MPSIM_MAX_CELLS (1ULL << 27)

/*
 * A run of @cfg from @seed: values from N(0,1), moshpit peers on distinct
 * random cells. 0, -EINVAL (peers < 1, len < 1, fail outside [0, 1], moshpit
 * with more peers than cells or a grid over MPSIM_MAX_CELLS, group < 1,
 * neighbors < 0) or -ENOMEM.
 */
int mpsim_init(struct mpsim *s, const struct mpsim_cfg *cfg, uint64_t seed);
void mpsim_free(struct mpsim *s);
/* One round: draw the failures, then average. */
void mpsim_round(struct mpsim *s);
/* Mean squared distance of the peers' values from their mean: 1/N Σ |v_i - v̄|². */
double mpsim_error(struct mpsim *s);
/* The quantity averaging preserves: Σ w·x / Σ w (push-sum: Σ s / Σ w), into @out (len). */
void mpsim_global_mean(const struct mpsim *s, double *out);
/* Peer @i's current value: x_i (push-sum: s_i / w_i), into @out (len). */
void mpsim_value(const struct mpsim *s, int i, double *out);

/*
 * Expected contraction of the error in one round of random groups: for r
 * groups of any sizes and no failures (r - 1) / (n - 1); with failures
 * p + (Σ_g (1 - p^M_g) - 1 + p) / (n - 1) (derived in mpsim_core.c). For
 * moshpit, the geometric mean over the dims of that rate for the grid's
 * lines along the dim (round 0's exact expectation). Negative for the other
 * algorithms, which have none.
 */
double mpsim_theory_rate(const struct mpsim_cfg *cfg);

const char *mpsim_algo_name(enum mpsim_algo a);
int mpsim_algo_from_name(const char *name);

#endif
