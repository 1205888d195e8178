/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * mpsim's engine. Values are fp32 like the library's buffers, and every
 * group average goes through the library's reducer arithmetic (mp_k_wmean:
 * the weighted sum in member order, then one multiply by 1/Σw; with
 * direct_pairs, for short vectors in groups of 4 to 64, the pairwise
 * exchange's sums), so a
 * simulated group ends a round with the very bits a real group of
 * libmoshpit peers would hold (default settings: MP_DIRECT_MAX and the
 * 256 KiB chunk). Moshpit's groups are the library's grid
 * lines (mp_grid_line), part indices and group ids included.
 *
 * A failed peer sits out the whole round: it keeps its values and weight,
 * and the others average without it. Nobody fails half-way through an
 * average, so every algorithm but gossip keeps the global mean (up to fp32
 * rounding) whatever the failure rate.
 */
#include "mpsim_core.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <moshpit/moshpit.h>

#include "mp_kernels.h"

static const char *const algo_names[MPSIM_NALGOS] = {
	[MPSIM_MOSHPIT] = "moshpit",
	[MPSIM_RANDOM] = "random",
	[MPSIM_ALLREDUCE] = "allreduce",
	[MPSIM_GOSSIP] = "gossip",
	[MPSIM_PUSHSUM] = "pushsum",
};

const char *mpsim_algo_name(enum mpsim_algo a)
{
	return a >= 0 && a < MPSIM_NALGOS ? algo_names[a] : "?";
}

int mpsim_algo_from_name(const char *name)
{
	for (int a = 0; a < MPSIM_NALGOS; a++)
		if (!strcmp(name, algo_names[a]))
			return a;
	return -EINVAL;
}

uint64_t mpsim_splitmix(uint64_t *state)
{
	uint64_t z = (*state += 0x9e3779b97f4a7c15ULL);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

void mpsim_rng_seed(struct mpsim_rng *r, uint64_t seed)
{
	/* splitmix64 never yields four zeros in a row, the one bad state */
	for (int i = 0; i < 4; i++)
		r->s[i] = mpsim_splitmix(&seed);
}

static uint64_t rotl(uint64_t x, int k)
{
	return (x << k) | (x >> (64 - k));
}

uint64_t mpsim_rng_next(struct mpsim_rng *r)
{
	uint64_t *s = r->s;
	uint64_t out = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;

	s[2] ^= s[0];
	s[3] ^= s[1];
	s[1] ^= s[2];
	s[0] ^= s[3];
	s[2] ^= t;
	s[3] = rotl(s[3], 45);
	return out;
}

/* Uniform in [0, 1), 53 bits. */
static double uniform(struct mpsim_rng *r)
{
	return (double)(mpsim_rng_next(r) >> 11) * 0x1.0p-53;
}

/* Uniform in [0, n) without bias (multiply, reject the short tail). */
static uint32_t below(struct mpsim_rng *r, uint32_t n)
{
	uint64_t m = (mpsim_rng_next(r) >> 32) * n;

	if ((uint32_t)m < n) {
		uint32_t tail = (uint32_t)-n % n;

		while ((uint32_t)m < tail)
			m = (mpsim_rng_next(r) >> 32) * n;
	}
	return (uint32_t)(m >> 32);
}

/* N(0, 1) by Marsaglia's polar method: only log and sqrt. */
static double normal(struct mpsim_rng *r)
{
	double u, v, q;

	do {
		u = 2.0 * uniform(r) - 1.0;
		v = 2.0 * uniform(r) - 1.0;
		q = u * u + v * v;
	} while (q >= 1.0 || q == 0.0);
	return u * sqrt(-2.0 * log(q) / q);
}

static int occupant(void *arg, uint64_t cell)
{
	const struct mpsim *s = arg;

	return s->peer_at[cell];
}

/* Values of the group's i-th member (s->members), for mp_k_wmean. */
static float *member_values(void *arg, int i)
{
	struct mpsim *s = arg;

	return s->x + (size_t)s->members[i] * s->cfg.len;
}

/* Elements of the library's default chunk (256 KiB). */
#define LIB_CHUNK_ELEMS (256u * 1024 / sizeof(float))

/* Whether a group of @k takes the pairwise exchange (src/xfer/pairs.c:
 * mp_direct_fits and mp_pairs_fits, default limits, codec none). */
static int takes_pairs(const struct mpsim *s, int k)
{
	/* 4 to 64 members, a power of two or at least 8 (PAIRS_EXTRAS_MIN). */
	return s->cfg.direct_pairs && s->pairs && k >= 4 && k <= 64 && (!(k & (k - 1)) || k >= 8) &&
	       s->cfg.len * sizeof(float) <= MP_DIRECT_MAX_DEFAULT &&
	       s->cfg.len + 4 + (size_t)k <= LIB_CHUNK_ELEMS;
}

/*
 * The pairwise exchange's sum of the k members in s->members, without
 * failures: leaves w·x (each product rounded); members p..k-1 (p = 2^m)
 * first added to member i - p; then for each distance d = 1, 2, .. p/2 the
 * sums of i and i ^ d added (in either order: the same bits); the result
 * times 1/Σw on every member.
 */
static void pairs_group(struct mpsim *s, int k, float wsum)
{
	const size_t L = s->cfg.len;
	float *y = s->pairs, inv = 1.0f / wsum;
	int p = 1;

	while (p * 2 <= k)
		p *= 2;
	for (int i = 0; i < k; i++) {
		const float *xi = member_values(s, i);

		for (size_t e = 0; e < L; e++)
			y[(size_t)i * L + e] = s->gw[i] * xi[e];
	}
	for (int i = 0; i + p < k; i++)
		for (size_t e = 0; e < L; e++)
			y[(size_t)i * L + e] = y[(size_t)i * L + e] + y[(size_t)(i + p) * L + e];
	for (int d = 1; d < p; d *= 2)
		for (int i = 0; i < p; i++)
			if (i < (i ^ d))
				for (size_t e = 0; e < L; e++) {
					float v = y[(size_t)i * L + e] + y[(size_t)(i ^ d) * L + e];

					y[(size_t)i * L + e] = v;
					y[(size_t)(i ^ d) * L + e] = v;
				}
	for (int i = 0; i < k; i++) {
		float *xi = member_values(s, i);

		for (size_t e = 0; e < L; e++)
			xi[e] = y[(size_t)(i < p ? i : i - p) * L + e] * inv;
	}
}

/*
 * Average the present members among the n in s->members, as one group of
 * the library does: the reducer's weighted mean in member order, the same
 * result for every member, and each leaves with the mean weight Σw / count.
 */
static void average_group(struct mpsim *s, int n)
{
	const size_t L = s->cfg.len;
	float wsum = 0.0f;
	int k = 0;

	for (int i = 0; i < n; i++)
		if (s->alive[s->members[i]])
			s->members[k++] = s->members[i];
	if (k < 2)
		return;
	for (int i = 0; i < k; i++) {
		s->gw[i] = s->w[s->members[i]];
		wsum += s->gw[i];
	}
	float *first = member_values(s, 0);

	if (takes_pairs(s, k)) {
		pairs_group(s, k, wsum);
	} else {
		mp_k_wmean(first, k, s->gw, wsum, L, member_values, s);
		for (int i = 1; i < k; i++)
			memcpy(member_values(s, i), first, L * sizeof(float));
	}
	for (int i = 0; i < k; i++)
		s->w[s->members[i]] = wsum / (float)k;
}

/*
 * The matchmaker's next coordinate (take_roster in src/ctrl/matchmaker.c): the
 * members trade the coordinates they hold along the line, member i (in
 * coordinate order) taking that of member (i + id mod n) mod n. On a full
 * line that is the part index rotated by the group id. Every occupant of
 * the line takes part in the trade, those that sat the round out included,
 * so cells stay one peer each.
 */
static void recoordinate(struct mpsim *s, int n, uint32_t id)
{
	const struct mp_grid *g = &s->cfg.grid;
	int dim = (int)(s->round % (uint32_t)g->ndims);
	int coords[MP_MAX_GRID_DIMS], *held = s->held;

	for (int i = 0; i < n; i++) {
		mp_grid_coords(g, (uint64_t)s->cell_of[s->members[i]], coords);
		held[i] = coords[dim];
		s->peer_at[s->cell_of[s->members[i]]] = -1;
	}
	for (int i = 0; i < n; i++) {
		int p = s->members[i];

		mp_grid_coords(g, (uint64_t)s->cell_of[p], coords);
		coords[dim] = held[((uint32_t)i + id % (uint32_t)n) % (uint32_t)n];
		s->cell_of[p] = (int)mp_grid_cell(g, coords);
		s->peer_at[s->cell_of[p]] = p;
	}
}

static void moshpit_round(struct mpsim *s)
{
	const uint32_t mark = s->round + 1;

	for (int p = 0; p < s->cfg.peers; p++) {
		uint32_t id;
		int n;

		if (s->seen[p] == mark)
			continue;
		n = mp_grid_line(&s->cfg.grid, (uint64_t)s->cell_of[p], s->round, occupant, s,
				 s->members, &id);
		for (int i = 0; i < n; i++)
			s->seen[s->members[i]] = mark;
		if (s->cfg.coords == MPSIM_COORDS_MATCHMAKER)
			recoordinate(s, n, id);
		average_group(s, n);
	}
}

/* A fresh uniform partition of everyone into groups of M (the last one shorter). */
static void random_round(struct mpsim *s)
{
	const int N = s->cfg.peers, M = s->cfg.group;

	for (int i = N - 1; i > 0; i--) {
		int j = (int)below(&s->rng, (uint32_t)i + 1), t = s->order[i];

		s->order[i] = s->order[j];
		s->order[j] = t;
	}
	for (int start = 0; start < N; start += M) {
		int n = N - start < M ? N - start : M;

		memcpy(s->members, s->order + start, (size_t)n * sizeof(int));
		average_group(s, n);
	}
}

static void allreduce_round(struct mpsim *s)
{
	/* one exact average of everyone; a failure anywhere cancels it for all */
	if (s->nfailed)
		return;
	for (int i = 0; i < s->cfg.peers; i++)
		s->members[i] = i;
	average_group(s, s->cfg.peers);
}

/* Reads from nx, for the gossip average (contribution 0 is the new value itself). */
static float *gossip_values(void *arg, int i)
{
	struct mpsim *s = arg;

	return (i ? s->x : s->nx) + (size_t)s->members[i] * s->cfg.len;
}

/* Each present peer takes the plain mean of the present peers within K ring steps. */
static void gossip_round(struct mpsim *s)
{
	const int N = s->cfg.peers;
	const size_t L = s->cfg.len;
	int K = s->cfg.neighbors;

	if (2 * K + 1 > N)
		K = (N - 1) / 2;
	memcpy(s->nx, s->x, (size_t)N * L * sizeof(float));
	for (int i = 0; i < N; i++) {
		int k = 0;

		if (!s->alive[i])
			continue;
		/* itself first, then the neighbours left to right */
		s->members[k] = i;
		s->gw[k++] = 1.0f;
		for (int d = -K; d <= K; d++) {
			int j = ((i + d) % N + N) % N;

			if (d && s->alive[j]) {
				s->members[k] = j;
				s->gw[k++] = 1.0f;
			}
		}
		if (k > 1)
			mp_k_wmean(s->nx + (size_t)i * L, k, s->gw, (float)k, L, gossip_values, s);
	}
	float *t = s->x;

	s->x = s->nx;
	s->nx = t;
}

/*
 * Push-sum on the one-peer exponential graph: in round t each present peer
 * keeps half of (s, w) and pushes half to peer i + 2^(t mod ceil(log2 N)),
 * unless that peer sits the round out (then it keeps all). Σs and Σw are
 * kept; on N = 2^k peers without failures every s/w is exact after k rounds.
 */
static void pushsum_round(struct mpsim *s)
{
	const int N = s->cfg.peers;
	const size_t L = s->cfg.len;
	int tau = 0;

	while ((1LL << tau) < N)
		tau++;
	if (!tau)
		return;
	int hop = 1 << (s->round % (uint32_t)tau);

	memset(s->nx, 0, (size_t)N * L * sizeof(float));
	memset(s->nw, 0, (size_t)N * sizeof(float));
	for (int i = 0; i < N; i++) {
		int j = (i + hop) % N;
		float *xi = s->x + (size_t)i * L;

		if (s->alive[i] && s->alive[j]) {
			mp_k_axpy(s->nx + (size_t)i * L, xi, 0.5f, L);
			mp_k_axpy(s->nx + (size_t)j * L, xi, 0.5f, L);
			s->nw[i] += 0.5f * s->w[i];
			s->nw[j] += 0.5f * s->w[i];
		} else {
			mp_k_axpy(s->nx + (size_t)i * L, xi, 1.0f, L);
			s->nw[i] += s->w[i];
		}
	}
	float *t = s->x;

	s->x = s->nx;
	s->nx = t;
	t = s->w;
	s->w = s->nw;
	s->nw = t;
}

void mpsim_round(struct mpsim *s)
{
	s->nfailed = 0;
	for (int i = 0; i < s->cfg.peers; i++) {
		s->alive[i] = !(s->cfg.fail > 0.0 && uniform(&s->rng) < s->cfg.fail);
		s->nfailed += !s->alive[i];
	}
	switch (s->cfg.algo) {
	case MPSIM_MOSHPIT:
		moshpit_round(s);
		break;
	case MPSIM_RANDOM:
		random_round(s);
		break;
	case MPSIM_ALLREDUCE:
		allreduce_round(s);
		break;
	case MPSIM_GOSSIP:
		gossip_round(s);
		break;
	default:
		pushsum_round(s);
		break;
	}
	s->round++;
}

void mpsim_value(const struct mpsim *s, int i, double *out)
{
	const size_t L = s->cfg.len;
	const float *x = s->x + (size_t)i * L;
	double div = s->cfg.algo == MPSIM_PUSHSUM ? (double)s->w[i] : 1.0;

	for (size_t l = 0; l < L; l++)
		out[l] = (double)x[l] / div;
}

double mpsim_error(struct mpsim *s)
{
	const int N = s->cfg.peers;
	const size_t L = s->cfg.len;
	double err = 0.0;

	/* Push-sum needs s/w per peer; the others read the buffer straight. */
	memset(s->mean, 0, L * sizeof(double));
	for (int i = 0; i < N; i++) {
		const float *x = s->x + (size_t)i * L;
		double div = s->cfg.algo == MPSIM_PUSHSUM ? (double)s->w[i] : 1.0;

		for (size_t l = 0; l < L; l++)
			s->mean[l] += (double)x[l] / div;
	}
	for (size_t l = 0; l < L; l++)
		s->mean[l] /= N;
	for (int i = 0; i < N; i++) {
		const float *x = s->x + (size_t)i * L;
		double div = s->cfg.algo == MPSIM_PUSHSUM ? (double)s->w[i] : 1.0;

		for (size_t l = 0; l < L; l++) {
			double d = (double)x[l] / div - s->mean[l];

			err += d * d;
		}
	}
	return err / N;
}

void mpsim_global_mean(const struct mpsim *s, double *out)
{
	const size_t L = s->cfg.len;
	int pushsum = s->cfg.algo == MPSIM_PUSHSUM;
	double wsum = 0.0;

	memset(out, 0, L * sizeof(double));
	for (int i = 0; i < s->cfg.peers; i++) {
		const float *x = s->x + (size_t)i * L;
		double w = s->w[i];

		for (size_t l = 0; l < L; l++)
			out[l] += pushsum ? (double)x[l] : w * (double)x[l];
		wsum += w;
	}
	for (size_t l = 0; l < L; l++)
		out[l] /= wsum;
}

/*
 * One round of a uniformly random partition of n peers into groups, each
 * peer sitting out with probability p, from error e to the expected
 *
 *   e · (p + (Σ_g (1 - p^M_g) - (1 - p)) / (n - 1))
 *
 * A peer that sits out keeps its distance to the global mean (which stays
 * put): p·e. The present members of group g are a uniform random sample of
 * a_g peers, whose mean lies (n - a_g) / (a_g (n - 1)) · e from the global
 * mean squared, on average; summed over the a_g members and the groups with
 * anyone present that is (Σ_g [a_g > 0] n - Σ_g a_g) / (n - 1) · e / n. @live
 * is Σ_g P(a_g > 0) = Σ_g (1 - p^M_g). With p = 0: (r - 1) / (n - 1).
 */
static double partition_rate(double n, double p, double live)
{
	return p + (live - (1.0 - p)) / (n - 1.0);
}

static double lchoose(double n, double k)
{
	return lgamma(n + 1.0) - lgamma(k + 1.0) - lgamma(n - k + 1.0);
}

/*
 * The chance that nobody is present on a line of m of the grid's cells when
 * n peers sit on distinct random cells and each is absent with probability
 * p: E[p^j] for j, the line's occupants, hypergeometric (cells, n, m).
 */
static double nobody_present(double cells, double n, double m, double p)
{
	double sum = 0.0;

	for (double j = fmax(0.0, m - (cells - n)); j <= fmin(m, n); j++)
		sum += exp(lchoose(n, j) + lchoose(cells - n, m - j) - lchoose(cells, m)) *
		       (j > 0.0 ? pow(p, j) : 1.0);
	return sum;
}

double mpsim_theory_rate(const struct mpsim_cfg *cfg)
{
	const double n = cfg->peers, p = cfg->fail;

	if (cfg->peers < 2)
		return 0.0;
	if (cfg->algo == MPSIM_RANDOM) {
		double full = floor(n / cfg->group), rest = n - full * cfg->group;

		return partition_rate(n, p, full * (1.0 - pow(p, cfg->group)) +
					    (rest > 0.0 ? 1.0 - pow(p, rest) : 0.0));
	}
	if (cfg->algo != MPSIM_MOSHPIT)
		return -1.0;
	/* Round t's groups are the lines along dim t mod d. With the peers on
	 * uniformly random cells, round 0 is a random partition into the
	 * lines (of random sizes, some perhaps empty); later rounds cut across
	 * the earlier ones, which helps on a full grid and not on a sparse one. */
	double cells = (double)mp_grid_cells(&cfg->grid), logsum = 0.0;

	for (int k = 0; k < cfg->grid.ndims; k++) {
		double lines = cells / cfg->grid.dims[k];
		double rate = partition_rate(n, p, lines * (1.0 - nobody_present(cells, n, cfg->grid.dims[k], p)));

		if (rate <= 0.0)
			return 0.0;
		logsum += log(rate);
	}
	return exp(logsum / cfg->grid.ndims);
}

static int cfg_valid(const struct mpsim_cfg *c)
{
	uint64_t cells;

	if (c->peers < 1 || c->len < 1 || !(c->fail >= 0.0 && c->fail <= 1.0) || c->algo < 0 ||
	    c->algo >= MPSIM_NALGOS)
		return 0;
	if (c->algo == MPSIM_RANDOM && c->group < 1)
		return 0;
	if (c->algo == MPSIM_GOSSIP && c->neighbors < 0)
		return 0;
	if (c->algo != MPSIM_MOSHPIT)
		return 1;
	if (c->grid.ndims < 1 || c->grid.ndims > MP_MAX_GRID_DIMS)
		return 0;
	for (int k = 0; k < c->grid.ndims; k++)
		if (c->grid.dims[k] < 1)
			return 0;
	cells = mp_grid_cells(&c->grid);
	return cells <= MPSIM_MAX_CELLS && (uint64_t)c->peers <= cells;
}

/* Peers on distinct uniformly random cells: a partial Fisher-Yates over the cell table. */
static void place(struct mpsim *s)
{
	const uint32_t cells = (uint32_t)mp_grid_cells(&s->cfg.grid);

	for (uint32_t c = 0; c < cells; c++)
		s->peer_at[c] = (int)c;
	for (int i = 0; i < s->cfg.peers; i++) {
		uint32_t j = (uint32_t)i + below(&s->rng, cells - (uint32_t)i);
		int t = s->peer_at[i];

		s->peer_at[i] = s->peer_at[j];
		s->peer_at[j] = t;
		s->cell_of[i] = s->peer_at[i];
	}
	for (uint32_t c = 0; c < cells; c++)
		s->peer_at[c] = -1;
	for (int i = 0; i < s->cfg.peers; i++)
		s->peer_at[s->cell_of[i]] = i;
}

int mpsim_init(struct mpsim *s, const struct mpsim_cfg *cfg, uint64_t seed)
{
	size_t N, L, cap;

	memset(s, 0, sizeof(*s));
	if (!cfg || !cfg_valid(cfg))
		return -EINVAL;
	s->cfg = *cfg;
	N = (size_t)cfg->peers;
	L = cfg->len;
	cap = N;
	if (cfg->algo == MPSIM_MOSHPIT)
		for (int k = 0; k < cfg->grid.ndims; k++)
			cap = (size_t)cfg->grid.dims[k] > cap ? (size_t)cfg->grid.dims[k] : cap;
	mpsim_rng_seed(&s->rng, seed);
	s->x = malloc(N * L * sizeof(float));
	s->w = malloc(N * sizeof(float));
	s->mean = malloc(L * sizeof(double));
	s->alive = malloc(N);
	s->members = malloc(cap * sizeof(int));
	s->held = malloc(cap * sizeof(int));
	s->gw = malloc(cap * sizeof(float));
	if (!s->x || !s->w || !s->mean || !s->alive || !s->members || !s->held || !s->gw)
		goto nomem;
	if (cfg->direct_pairs && L * sizeof(float) <= MP_DIRECT_MAX_DEFAULT && cap >= 4) {
		s->pairs = malloc((cap < 64 ? cap : 64) * L * sizeof(float));
		if (!s->pairs)
			goto nomem;
	}
	if (cfg->algo == MPSIM_GOSSIP || cfg->algo == MPSIM_PUSHSUM) {
		s->nx = malloc(N * L * sizeof(float));
		s->nw = malloc(N * sizeof(float));
		if (!s->nx || !s->nw)
			goto nomem;
	}
	if (cfg->algo == MPSIM_RANDOM) {
		s->order = malloc(N * sizeof(int));
		if (!s->order)
			goto nomem;
		for (int i = 0; i < cfg->peers; i++)
			s->order[i] = i;
	}
	if (cfg->algo == MPSIM_MOSHPIT) {
		s->seen = calloc(N, sizeof(uint32_t));
		s->cell_of = malloc(N * sizeof(int));
		s->peer_at = malloc((size_t)mp_grid_cells(&cfg->grid) * sizeof(int));
		if (!s->seen || !s->cell_of || !s->peer_at)
			goto nomem;
	}
	for (size_t i = 0; i < N * L; i++)
		s->x[i] = (float)normal(&s->rng);
	for (size_t i = 0; i < N; i++)
		s->w[i] = 1.0f;
	if (cfg->algo == MPSIM_MOSHPIT)
		place(s);
	return 0;
nomem:
	mpsim_free(s);
	return -ENOMEM;
}

void mpsim_free(struct mpsim *s)
{
	free(s->x);
	free(s->w);
	free(s->nx);
	free(s->nw);
	free(s->mean);
	free(s->alive);
	free(s->members);
	free(s->held);
	free(s->gw);
	free(s->pairs);
	free(s->order);
	free(s->seen);
	free(s->cell_of);
	free(s->peer_at);
	memset(s, 0, sizeof(*s));
}
