/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * mpsim - how fast Moshpit, random groups, all-reduce, gossip and push-sum
 * bring N virtual peers to their mean, with peers failing at random.
 *
 * Every combination of the --algo, --peers and --fail lists is one
 * configuration; each runs --restarts times from seeds derived from --seed
 * (restart r uses the same seed in every configuration, so configurations
 * are compared on the same draws). A run stops at the first round whose
 * error (the mean squared distance of the peers' values from their mean)
 * is below --eps, or after --max-rounds rounds, which is then its count.
 *
 * The engine (mpsim_core.c) forms Moshpit's groups with the library's grid
 * code and averages every group with the library's reducer arithmetic; this
 * file is the command line, the table, the JSON and the CSV. It links the
 * library's core objects (internal grid and kernel interfaces).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include <moshpit/sdk/clock.h>
#include "mpsim_core.h"

#define PROG "mpsim"
#define MAX_LIST 64
/* Values held at once (peers × length), 4 bytes each: 4 GiB. */
#define MAX_VALUES (1ULL << 30)

struct opts {
	int algo[MAX_LIST], nalgo;
	int peers[MAX_LIST], npeers;
	double fail[MAX_LIST];
	int nfail;
	struct mp_grid grid;
	const char *grid_arg; /* NULL: the library's choice for each N */
	int group;            /* random; 0: the grid's first side */
	int neighbors;
	enum mpsim_coords coords;
	size_t len;
	int restarts;
	uint64_t seed;
	double eps;
	int max_rounds;
	const char *json, *csv;
};

struct result {
	struct mpsim_cfg cfg;
	char grid[64];       /* moshpit: the grid used, else "" */
	double mean_rounds, std_rounds;
	int capped;          /* restarts that never got below eps */
	double rate;         /* mean per-round contraction measured */
	double theory;       /* random groups of that size, or < 0 */
	double drift;        /* largest |change of the global mean| seen */
};

static void usage(FILE *f)
{
	fprintf(f,
		"Usage: " PROG " [options]\n"
		"Simulate averaging across N virtual peers with libmoshpit's grid and\n"
		"reduction code; print, per configuration, the rounds until the peers'\n"
		"mean squared distance from their mean falls below --eps.\n"
		"\n"
		"Configurations (comma-separated lists; every combination runs):\n"
		"      --algo=LIST          moshpit, random, allreduce, gossip, pushsum or all\n"
		"                           (default moshpit)\n"
		"      --peers=LIST         number of peers (default 1024)\n"
		"      --fail=LIST          probability that a peer sits out a round, in [0, 1]\n"
		"                           (default 0)\n"
		"\n"
		"Algorithms:\n"
		"      --grid=MxMx...       moshpit grid (default: the library's near-cubic grid\n"
		"                           for N); N may not exceed its cells\n"
		"      --coords=RULE        moshpit after a round: fixed (default: peers keep\n"
		"                           their random cells) or matchmaker (coordinate t mod d\n"
		"                           becomes the part index rotated by the group id)\n"
		"      --group=M            random: group size (default: the grid's first side)\n"
		"      --neighbors=K        gossip: ring neighbours on each side (default 1)\n"
		"\n"
		"Runs:\n"
		"      --length=L, --dim=L  values per peer (default 1), each drawn from N(0,1)\n"
		"      --restarts=R         runs per configuration (default 1)\n"
		"      --seed=S             seed of every run (default 1)\n"
		"      --eps=E              target mean squared distance (default 1e-9)\n"
		"      --max-rounds=T       rounds at most; a run that never reaches --eps\n"
		"                           counts T (default 50)\n"
		"\n"
		"Output:\n"
		"      --json=FILE          settings and one result per configuration\n"
		"      --csv=FILE           the error after every round of every run\n"
		"  -h, --help               show this help\n"
		"\n"
		"Exit status: 0 ok, 1 a failure (memory, files), 2 bad usage.\n");
}

/* Split a comma-separated list in place into @items: at most MAX_LIST, none empty. */
static int split_list(const char *opt, char *s, char **items)
{
	int n = 0;

	for (char *p = s;; p++) {
		char *comma = strchr(p, ',');

		if (n == MAX_LIST)
			usage_error("%s: at most %d values", opt, MAX_LIST);
		if (comma)
			*comma = '\0';
		if (!*p)
			usage_error("%s: empty value in the list", opt);
		items[n++] = p;
		if (!comma)
			return n;
		p = comma;
	}
}

enum {
	OPT_ALGO = 256,
	OPT_PEERS,
	OPT_FAIL,
	OPT_GRID,
	OPT_COORDS,
	OPT_GROUP,
	OPT_NEIGHBORS,
	OPT_LENGTH,
	OPT_RESTARTS,
	OPT_SEED,
	OPT_EPS,
	OPT_MAX_ROUNDS,
	OPT_JSON,
	OPT_CSV,
};

static void parse_args(int argc, char **argv, struct opts *o)
{
	static const struct option longopts[] = {
		{ "algo", required_argument, NULL, OPT_ALGO },
		{ "peers", required_argument, NULL, OPT_PEERS },
		{ "fail", required_argument, NULL, OPT_FAIL },
		{ "grid", required_argument, NULL, OPT_GRID },
		{ "coords", required_argument, NULL, OPT_COORDS },
		{ "group", required_argument, NULL, OPT_GROUP },
		{ "neighbors", required_argument, NULL, OPT_NEIGHBORS },
		{ "length", required_argument, NULL, OPT_LENGTH },
		{ "dim", required_argument, NULL, OPT_LENGTH },
		{ "restarts", required_argument, NULL, OPT_RESTARTS },
		{ "seed", required_argument, NULL, OPT_SEED },
		{ "eps", required_argument, NULL, OPT_EPS },
		{ "max-rounds", required_argument, NULL, OPT_MAX_ROUNDS },
		{ "json", required_argument, NULL, OPT_JSON },
		{ "csv", required_argument, NULL, OPT_CSV },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	char *items[MAX_LIST];
	int c, n;

	cli_init(PROG);
	while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
		switch (c) {
		case OPT_ALGO:
			n = split_list("--algo", optarg, items);
			o->nalgo = 0;
			for (int i = 0; i < n; i++) {
				if (!strcmp(items[i], "all")) {
					for (int a = 0; a < MPSIM_NALGOS && o->nalgo < MAX_LIST; a++)
						o->algo[o->nalgo++] = a;
					continue;
				}
				int a = mpsim_algo_from_name(items[i]);

				if (a < 0)
					usage_error("unknown --algo '%s' (moshpit, random, allreduce, "
						    "gossip, pushsum or all)", items[i]);
				if (o->nalgo == MAX_LIST)
					usage_error("--algo: at most %d values", MAX_LIST);
				o->algo[o->nalgo++] = a;
			}
			break;
		case OPT_PEERS:
			o->npeers = split_list("--peers", optarg, items);
			for (int i = 0; i < o->npeers; i++)
				o->peers[i] = (int)parse_int("--peers", items[i], 1, 100000000);
			break;
		case OPT_FAIL:
			o->nfail = split_list("--fail", optarg, items);
			for (int i = 0; i < o->nfail; i++)
				o->fail[i] = parse_real("--fail", items[i], 0.0, 1.0);
			break;
		case OPT_GRID:
			if (mp_grid_parse(optarg, &o->grid))
				usage_error("bad --grid '%s' (sides of at least 1 joined by x, "
					    "at most %d of them, e.g. 32x32)", optarg, MP_MAX_GRID_DIMS);
			o->grid_arg = optarg;
			break;
		case OPT_COORDS:
			if (!strcmp(optarg, "fixed"))
				o->coords = MPSIM_COORDS_FIXED;
			else if (!strcmp(optarg, "matchmaker"))
				o->coords = MPSIM_COORDS_MATCHMAKER;
			else
				usage_error("unknown --coords '%s' (fixed or matchmaker)", optarg);
			break;
		case OPT_GROUP:
			o->group = (int)parse_int("--group", optarg, 1, 100000000);
			break;
		case OPT_NEIGHBORS:
			o->neighbors = (int)parse_int("--neighbors", optarg, 1, 50000000);
			break;
		case OPT_LENGTH:
			o->len = (size_t)parse_int("--length", optarg, 1, 1 << 24);
			break;
		case OPT_RESTARTS:
			o->restarts = (int)parse_int("--restarts", optarg, 1, 1000000);
			break;
		case OPT_SEED:
			o->seed = (uint64_t)parse_int("--seed", optarg, 0, INT64_MAX);
			break;
		case OPT_EPS:
			o->eps = parse_real("--eps", optarg, 0.0, 1e300);
			break;
		case OPT_MAX_ROUNDS:
			o->max_rounds = (int)parse_int("--max-rounds", optarg, 1, 1000000);
			break;
		case OPT_JSON:
			o->json = optarg;
			break;
		case OPT_CSV:
			o->csv = optarg;
			break;
		case 'h':
			usage(stdout);
			exit(0);
		default:
			usage_error("unknown option");
		}
	}
	if (optind < argc)
		usage_error("unexpected argument '%s'", argv[optind]);
}

/* The configuration of (algo, peers, fail), checked; exits 2 if it cannot run. */
static void make_cfg(const struct opts *o, int algo, int peers, double fail, struct mpsim_cfg *c,
		     char *grid, size_t glen)
{
	struct mp_grid g = o->grid;
	uint64_t cells;

	memset(c, 0, sizeof(*c));
	c->algo = algo;
	c->peers = peers;
	c->fail = fail;
	c->len = o->len;
	c->coords = o->coords;
	c->neighbors = o->neighbors;
	c->direct_pairs = 1; /* the library's default, MP_DIRECT_PAIRS=1 */
	if (!o->grid_arg)
		mp_grid_auto(peers, &g);
	c->grid = g;
	c->group = o->group ? o->group : g.dims[0];
	if ((uint64_t)peers * o->len > MAX_VALUES)
		usage_error("%d peers of %zu values are more than %llu values in all", peers,
			    o->len, (unsigned long long)MAX_VALUES);
	grid[0] = '\0';
	if (algo != MPSIM_MOSHPIT)
		return;
	mp_grid_format(&g, grid, glen);
	cells = mp_grid_cells(&g);
	if (cells > MPSIM_MAX_CELLS)
		usage_error("grid %s has %llu cells; mpsim holds at most %llu", grid,
			    (unsigned long long)cells, (unsigned long long)MPSIM_MAX_CELLS);
	if ((uint64_t)peers > cells)
		usage_error("%d peers do not fit grid %s (%llu cells): moshpit puts each peer "
			    "on a cell of its own", peers, grid, (unsigned long long)cells);
}

/* Largest |a - b| over @n values. */
static double max_diff(const double *a, const double *b, size_t n)
{
	double m = 0.0;

	for (size_t i = 0; i < n; i++)
		m = fabs(a[i] - b[i]) > m ? fabs(a[i] - b[i]) : m;
	return m;
}

/* algo,peers,grid,group,fail,restart,round,error (grid: moshpit; group: random) */
static void csv_row(FILE *f, const struct result *res, int restart, int round, double err)
{
	const struct mpsim_cfg *c = &res->cfg;

	fprintf(f, "%s,%d,%s,", mpsim_algo_name(c->algo), c->peers, res->grid);
	if (c->algo == MPSIM_RANDOM)
		fprintf(f, "%d", c->group);
	fprintf(f, ",%g,%d,%d,%.6e\n", c->fail, restart, round, err);
}

static int run_config(const struct opts *o, struct result *res, FILE *csv)
{
	const struct mpsim_cfg *c = &res->cfg;
	uint64_t seeds = o->seed;
	double sum = 0.0, sumsq = 0.0, ratesum = 0.0;
	double *m0 = malloc(c->len * sizeof(double)), *m1 = malloc(c->len * sizeof(double));
	int rc = 0;

	if (!m0 || !m1) {
		rc = -ENOMEM;
		goto out;
	}
	res->capped = 0;
	res->drift = 0.0;
	for (int r = 0; r < o->restarts; r++) {
		struct mpsim s;
		int rounds = o->max_rounds;
		double e0, e;

		rc = mpsim_init(&s, c, mpsim_splitmix(&seeds));
		if (rc)
			goto out;
		e0 = e = mpsim_error(&s);
		mpsim_global_mean(&s, m0);
		if (csv)
			csv_row(csv, res, r, 0, e);
		if (e < o->eps)
			rounds = 0;
		for (int t = 1; rounds && t <= o->max_rounds; t++) {
			mpsim_round(&s);
			e = mpsim_error(&s);
			if (csv)
				csv_row(csv, res, r, t, e);
			if (e < o->eps) {
				rounds = t;
				break;
			}
		}
		if (rounds == o->max_rounds && !(e < o->eps))
			res->capped++;
		mpsim_global_mean(&s, m1);
		res->drift = fmax(res->drift, max_diff(m0, m1, c->len));
		/* per-round contraction: the geometric mean over the rounds run */
		if (e > 0.0 && e0 > 0.0 && s.round)
			ratesum += pow(e / e0, 1.0 / s.round);
		sum += rounds;
		sumsq += (double)rounds * rounds;
		mpsim_free(&s);
	}
	res->mean_rounds = sum / o->restarts;
	res->std_rounds = o->restarts > 1 ?
		sqrt(fmax(0.0, (sumsq - sum * sum / o->restarts) / (o->restarts - 1))) : 0.0;
	res->rate = ratesum / o->restarts;
	res->theory = mpsim_theory_rate(c);
out:
	free(m0);
	free(m1);
	return rc;
}

static void json_num(FILE *f, double v)
{
	if (isfinite(v))
		fprintf(f, "%.6g", v);
	else
		fputs("null", f);
}

/* One result per line, like mpbench's JSON. */
static int write_json(const struct opts *o, const struct result *res, int n)
{
	FILE *f = fopen(o->json, "w");

	if (!f) {
		fprintf(stderr, PROG ": cannot write %s: %s\n", o->json, strerror(errno));
		return -1;
	}
	fprintf(f, "{\n  \"settings\": {\n    \"version\": \"%d.%d.%d\",\n", MP_VERSION_MAJOR,
		MP_VERSION_MINOR, MP_VERSION_PATCH);
	fprintf(f, "    \"restarts\": %d,\n    \"seed\": %" PRIu64 ",\n    \"eps\": ", o->restarts,
		o->seed);
	json_num(f, o->eps);
	fprintf(f, ",\n    \"max_rounds\": %d,\n    \"length\": %zu,\n    \"coords\": \"%s\",\n"
		"    \"neighbors\": %d\n  },\n  \"results\": [\n", o->max_rounds, o->len,
		o->coords == MPSIM_COORDS_FIXED ? "fixed" : "matchmaker", o->neighbors);
	for (int i = 0; i < n; i++) {
		const struct result *r = &res[i];

		fprintf(f, "    {\"algo\": \"%s\", \"peers\": %d, \"grid\": ",
			mpsim_algo_name(r->cfg.algo), r->cfg.peers);
		if (r->grid[0])
			fprintf(f, "\"%s\"", r->grid);
		else
			fputs("null", f);
		fprintf(f, ", \"group\": ");
		if (r->cfg.algo == MPSIM_RANDOM)
			fprintf(f, "%d", r->cfg.group);
		else
			fputs("null", f);
		fprintf(f, ", \"fail\": ");
		json_num(f, r->cfg.fail);
		fprintf(f, ", \"restarts\": %d, \"mean_rounds\": ", o->restarts);
		json_num(f, r->mean_rounds);
		fprintf(f, ", \"std_rounds\": ");
		json_num(f, r->std_rounds);
		fprintf(f, ", \"capped\": %d, \"rate\": ", r->capped);
		json_num(f, r->rate);
		fprintf(f, ", \"theory_rate\": ");
		json_num(f, r->theory >= 0.0 ? r->theory : NAN);
		fprintf(f, ", \"mean_drift\": ");
		json_num(f, r->drift);
		fprintf(f, "}%s\n", i + 1 < n ? "," : "");
	}
	fprintf(f, "  ]\n}\n");
	if (fclose(f) != 0) {
		fprintf(stderr, PROG ": cannot write %s: %s\n", o->json, strerror(errno));
		return -1;
	}
	return 0;
}

static void print_row(const struct result *r)
{
	char group[16] = "-", theory[16] = "-";

	if (r->cfg.algo == MPSIM_RANDOM)
		snprintf(group, sizeof(group), "%d", r->cfg.group);
	if (r->theory >= 0.0)
		snprintf(theory, sizeof(theory), "%.4g", r->theory);
	printf("%10s %9d %10s %6s %7g %12.2f %11.2f %7d %10.4g %10s\n", mpsim_algo_name(r->cfg.algo),
	       r->cfg.peers, r->grid[0] ? r->grid : "-", group, r->cfg.fail, r->mean_rounds,
	       r->std_rounds, r->capped, r->rate, theory);
	fflush(stdout);
}

int main(int argc, char **argv)
{
	struct opts o = {
		.algo = { MPSIM_MOSHPIT }, .nalgo = 1,
		.peers = { 1024 }, .npeers = 1,
		.fail = { 0.0 }, .nfail = 1,
		.neighbors = 1,
		.coords = MPSIM_COORDS_FIXED,
		.len = 1,
		.restarts = 1,
		.seed = 1,
		.eps = 1e-9,
		.max_rounds = 50,
	};
	struct result *res;
	FILE *csv = NULL;
	int n = 0, rc = 0;
	double t0;

	parse_args(argc, argv, &o);
	res = calloc((size_t)o.nalgo * (size_t)o.npeers * (size_t)o.nfail, sizeof(*res));
	if (!res) {
		fprintf(stderr, PROG ": out of memory\n");
		return 1;
	}
	/* Every configuration is checked before the first one runs. */
	for (int a = 0; a < o.nalgo; a++)
		for (int p = 0; p < o.npeers; p++)
			for (int f = 0; f < o.nfail; f++, n++)
				make_cfg(&o, o.algo[a], o.peers[p], o.fail[f], &res[n].cfg, res[n].grid,
					 sizeof(res[n].grid));
	if (o.csv) {
		csv = fopen(o.csv, "w");
		if (!csv) {
			fprintf(stderr, PROG ": cannot write %s: %s\n", o.csv, strerror(errno));
			free(res);
			return 1;
		}
		fprintf(csv, "algo,peers,grid,group,fail,restart,round,error\n");
	}
	printf("# mpsim %d.%d.%d: %d restart%s from seed %" PRIu64 ", eps %g, at most %d rounds, "
	       "%zu value%s per peer, moshpit coords %s\n", MP_VERSION_MAJOR, MP_VERSION_MINOR,
	       MP_VERSION_PATCH, o.restarts, o.restarts == 1 ? "" : "s", o.seed, o.eps, o.max_rounds,
	       o.len, o.len == 1 ? "" : "s", o.coords == MPSIM_COORDS_FIXED ? "fixed" : "matchmaker");
	printf("# %8s %9s %10s %6s %7s %12s %11s %7s %10s %10s\n", "algo", "peers", "grid", "group",
	       "fail", "mean_rounds", "std_rounds", "capped", "rate", "theory");
	t0 = mp_now_s();
	for (int i = 0; i < n; i++) {
		rc = run_config(&o, &res[i], csv);
		if (rc) {
			fprintf(stderr, PROG ": %s with %d peers: %s\n", mpsim_algo_name(res[i].cfg.algo),
				res[i].cfg.peers, strerror(-rc));
			break;
		}
		print_row(&res[i]);
	}
	if (!rc) {
		printf("# rate: per-round contraction of the error measured (geometric mean over a\n"
		       "# run's rounds, averaged over the runs); theory: expected contraction per\n"
		       "# round of r random groups, (r-1)/(N-1) without failures, else\n"
		       "# p + (sum_g (1-p^M_g) - 1 + p)/(N-1) (moshpit: the grid's lines along\n"
		       "# each dim as the groups, geometric mean over the dims)\n");
		printf("# %d configuration%s in %.2f s\n", n, n == 1 ? "" : "s", mp_now_s() - t0);
	}
	if (csv && fclose(csv) != 0 && !rc) {
		fprintf(stderr, PROG ": cannot write %s: %s\n", o.csv, strerror(errno));
		rc = -EIO;
	}
	if (!rc && o.json && write_json(&o, res, n))
		rc = -EIO;
	free(res);
	return rc ? 1 : 0;
}
