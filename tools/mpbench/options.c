/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * mpbench's settings: the command line over the MP_* environment, and what
 * follows from them once the number of peers is known (grid, exactness,
 * tolerances, bus bandwidth factor, safety limits).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mpbench.h"

static const char *const algo_names[] = { "moshpit", "ring", "butterfly" };
static const char *const codec_names[] = { "none", "fp16", "bf16", "uniform8", "blockwise8",
					   "topk", "adacomp" };
#define NCODEC_NAMES ((int)(sizeof(codec_names) / sizeof(codec_names[0])))

const char *algo_name(int a)
{
	return a >= 0 && a < 3 ? algo_names[a] : "?";
}

const char *codec_name(int c)
{
	if (c == MP_CODEC_AUTO)
		return "auto";
	return c >= 0 && c < NCODEC_NAMES ? codec_names[c] : "?";
}

/* Sparse codecs hold values back (error feedback): checked after a flush. */
int codec_sparse(int c)
{
	return c == MP_CODEC_TOPK || c == MP_CODEC_ADACOMP;
}

/*
 * Largest error of one encoding of data in [-1, 1) (doc/codecs.md):
 * fp16 half an ulp at 1 (2^-11), bf16 2^-8, blockwise8 half a step of
 * absmax/127, uniform8 one bucket (mean +- 6 sd of U(-1,1) over 256 buckets:
 * 12 * 0.577 / 256 = 0.027; the bucket mean can sit anywhere in the bucket).
 * Sparse codecs are checked after a flush (MP_AVG_FLUSH), where only fp32
 * rounding remains.
 */
static double codec_step_err(int c)
{
	switch (c) {
	case MP_CODEC_FP16: return 1.0 / 2048;
	case MP_CODEC_BF16: return 1.0 / 256;
	case MP_CODEC_BLOCKWISE8: return 1.0 / 254;
	case MP_CODEC_UNIFORM8: return 0.028;
	default: return 0.0;
	}
}

/* Followed runs where the exact mean is due as well: no churn, no faults,
 * no late peers, on a full grid (bench_derive's exact). */
int follow_exact(const struct bench *b)
{
	return b->follow && b->exact && b->churn <= 0 && b->nfaults == 0 && b->late == 0;
}

/*
 * Tolerance of the replay check of followed runs: an element is wrong when it
 * lies further than max(atol, rtol * |replay|) from the replay. The library
 * sums in fp32 and the replay in double: rtol is 1e-5 per round of the run,
 * atol 1e-6 for data in [-1, 1), plus two codec steps per round for a lossy
 * codec (each value is encoded on its way to the reducer and back).
 */
double replay_rtol(const struct bench *b)
{
	return 1e-5 * (b->total_rounds > 0 ? b->total_rounds : 1);
}

double replay_atol(const struct bench *b)
{
	int c = b->cfg.codec == MP_CODEC_AUTO ? MP_CODEC_BLOCKWISE8 : b->cfg.codec;

	return 1e-6 + 2.0 * codec_step_err(c) * b->total_rounds;
}

/* ------------------------------------------------------------------------ */
/* Grid, exactness and bus bandwidth                                         */

/* The grid the library will use: the one given, or its automatic choice. */
static int grid_from_library(const char *spec, int n, struct gridinfo *g)
{
	int nd;

	memset(g, 0, sizeof(*g));
	nd = mp_grid_shape(spec, n, g->dims, MP_MAX_GRID_DIMS);
	if (nd < 0)
		return -1;
	g->ndims = nd;
	g->given = spec != NULL;
	g->cells = 1;
	for (int i = 0; i < nd; i++)
		g->cells *= (uint64_t)g->dims[i];
	return 0;
}

void grid_format(const struct gridinfo *g, char *buf, size_t len)
{
	size_t off = 0;

	buf[0] = '\0';
	for (int i = 0; i < g->ndims && off < len; i++)
		off += (size_t)snprintf(buf + off, len - off, "%s%d", i ? "x" : "", g->dims[i]);
}

/*
 * Everything that depends on the peer count: the grid, whether the result
 * must be the exact weighted mean, the bus bandwidth factor, the tolerance
 * and the safety limits. All knowledge of the library's grid choice is here.
 *
 * Exact: ring and butterfly always; Moshpit when every grid cell holds a
 * peer (no partial grid) and it runs at least one round per dimension. The
 * grid comes from the library (mp_grid_shape), so tool and library agree.
 *
 * -EINVAL when the grid has fewer cells than @npeers: mpbench_parse finds
 * that of a local run; a multi-host run learns its peer count from mp_init.
 */
int bench_derive(struct bench *b, int npeers, char *err, size_t errlen)
{
	const struct mp_config *c = &b->cfg;
	int64_t cto = c->connect_timeout_ms > 0 ? c->connect_timeout_ms : 10000;
	int64_t rto = c->round_timeout_ms > 0 ? c->round_timeout_ms : 10000;
	int64_t cap;

	b->npeers = npeers;
	if (grid_from_library(c->grid, npeers, &b->grid) < 0)
		return cli_fail(err, errlen, "grid %s has fewer cells than the %d peers", c->grid,
				npeers);
	b->rounds_eff = c->rounds > 0 ? c->rounds : b->grid.ndims;

	b->exact = 1;
	b->inexact_why[0] = '\0';
	if (c->algo != MP_ALGO_MOSHPIT) {
		/* ring and butterfly reduce over every peer */
	} else if (b->grid.cells != (uint64_t)npeers) {
		b->exact = 0;
		snprintf(b->inexact_why, sizeof(b->inexact_why),
			 "partial grid, %d peers on %" PRIu64 " cells", npeers, b->grid.cells);
	} else if (b->rounds_eff < b->grid.ndims) {
		b->exact = 0;
		snprintf(b->inexact_why, sizeof(b->inexact_why),
			 "%d round(s) on a %d-dimensional grid", b->rounds_eff, b->grid.ndims);
	}

	b->bus_factor = 0.0;
	if (c->algo == MP_ALGO_MOSHPIT) {
		for (int t = 0; t < b->rounds_eff; t++) {
			int k = b->grid.dims[t % b->grid.ndims];

			b->bus_factor += 2.0 * (k - 1) / k;
		}
	} else if (npeers > 0) {
		b->bus_factor = 2.0 * (npeers - 1) / npeers;
	}

	if (!b->tol_set) {
		/* Each value is encoded twice per group all-reduce (to the reducer
		 * and back), once per ring hop; errors add up at worst. "auto"
		 * may pick blockwise8, the coarsest of its codecs. */
		int cc = c->codec == MP_CODEC_AUTO ? MP_CODEC_BLOCKWISE8 : c->codec;
		double encodes = c->algo == MP_ALGO_RING ? npeers + 1.0 :
				 c->algo == MP_ALGO_BUTTERFLY ? 2.0 : 2.0 * b->rounds_eff;
		double e = codec_step_err(cc) * encodes;

		b->tol = e > 0 ? e : codec_sparse(cc) ? 1e-4 : 1e-5;
	}

	/* Safety net only: the library's deadlines should fire long before. */
	cap = 30000 + cto + rto * (int64_t)(b->rounds_eff + 4) + (int64_t)(b->maxbytes / 1000);
	if (b->dht)
		cap += (int64_t)(b->rounds_eff + 1) *
		       ((c->matchmaking_ms > 0 ? c->matchmaking_ms : 5000) +
			(c->request_timeout_ms > 0 ? c->request_timeout_ms : 3000) +
			(c->allreduce_timeout_ms > 0 ? c->allreduce_timeout_ms : 60000));
	b->op_cap_ms = clamp_ms(cap);
	b->silence_ms = clamp_ms(cap + 30000);
	return 0;
}

/* ------------------------------------------------------------------------ */
/* Options                                                                   */

void bench_usage(FILE *f)
{
	fprintf(f,
		"Usage: " PROG " [OPTIONS]\n"
		"Benchmark Moshpit All-Reduce (libmoshpit) in the style of nccl-tests.\n"
		"\n"
		"Sizes and iterations:\n"
		"  -b, --minbytes=SIZE      smallest message (default 64K)\n"
		"  -e, --maxbytes=SIZE      largest message (default 16M)\n"
		"  -f, --stepfactor=F       multiply the size by F each step (default 2)\n"
		"  -n, --iters=N            timed iterations per size (default 5)\n"
		"  -w, --warmup_iters=N     untimed iterations per size (default 1)\n"
		"  -c, --check=0|1          compare with the exact mean (default 1)\n"
		"      --sync=0|1           start every iteration together: a 4-byte average\n"
		"                           after the refill, untimed (default 1)\n"
		"      --tol=X              error above which an element is wrong\n"
		"                           (default: 1e-5, or the codec's bound; see mpbench(1))\n"
		"  SIZE: digits, then optionally K, M or G (powers of 1024) and B, as in\n"
		"  4096, 64K or 1MB; a multiple of 4.\n"
		"\n"
		"Averaging:\n"
		"      --algo=NAME          moshpit (default), ring or butterfly\n"
		"      --grid=MxNx...       Moshpit grid (default: the library's choice)\n"
		"      --rounds=R           Moshpit rounds per average (0 = grid dimensions)\n"
		"      --codec=NAME[:P]     none (default), fp16, bf16, uniform8[:SIGMAS],\n"
		"                           blockwise8[:BLOCK], topk[:FRACTION],\n"
		"                           adacomp[:conv|fc|BIN] or auto\n"
		"      --weighted           peer r averages with weight r+1 instead of 1\n"
		"      --seed=S             seed of the test data (default 42)\n"
		"      --chunk=SIZE         bytes per streamed chunk\n"
		"      --streams=N          connections per peer pair (0 = transport default)\n"
		"      --timeout=MS         connect and round timeouts in milliseconds\n"
		"      --memory=KIND        where each peer's buffer lives: host (default) or\n"
		"                           cuda (device memory, loaded from libcuda.so.1;\n"
		"                           averaged through a pinned host copy today)\n"
		"\n"
		"Peers:\n"
		"      --transport=NAME     tcp (default), loop (threads of one process), dpdk,\n"
		"                           ofi (libfabric) or verbs (RDMA verbs)\n"
		"      --peers=N            number of peers (default 8 when run locally)\n"
		"      --run=NAME           run name (default mpbench-<pid> locally)\n"
		"      --hostfile=FILE      multi-host: one host[:port] per line, rank order\n"
		"      --rank=R             multi-host: this process's rank (else from\n"
		"                           MP_RANK, mpirun, PMI or srun)\n"
		"      --dead=R[,R...]      multi-host: ranks that will be killed; the check\n"
		"                           compares survivors with the others' mean too\n"
		"      --dpdk-args=ARGS     dpdk: EAL arguments (MP_DPDK_EAL); locally\n"
		"                           \"{rank}\" becomes each peer's rank. Without it\n"
		"                           local peers get a memif pair (2 peers) or a\n"
		"                           bridge of veths in namespaces (3-64 peers)\n"
		"      --inject-loss=P      dpdk: drop a fraction P of received frames\n"
		"\n"
		"Control plane (local peers are then followed round by round):\n"
		"      --rendezvous=NAME    static (default: a peer list) or dht (OpenDHT)\n"
		"      --bootstrap=H:P      dht across hosts: a running peer's DHT node; this\n"
		"                           process is peer --rank of --peers\n"
		"      --dht-port=P         dht across hosts: UDP port of this peer's DHT node\n"
		"      --churn=P            each peer dies (SIGKILL mid-round) with probability\n"
		"                           P in each round of the first part of the run\n"
		"      --join=0|1           replace peers that died (default 1 with --churn)\n"
		"      --keep=K             the first K initial peers never die of --churn\n"
		"      --churn-catchup=0|1  1: a planned death its peer misses (alone, not yet\n"
		"                           joined) comes in its next round (default 0)\n"
		"      --standby=N          keep N replacements started ahead (past mp_init,\n"
		"                           on the DHT); a death wakes one (default 0: start\n"
		"                           a new process per death)\n"
		"      --sample=R           every R rounds, print the RSS, open descriptors\n"
		"                           and threads of the running initial peers\n"
		"      --compute-ms=MS      followed runs: each peer pauses MS between its rounds,\n"
		"                           as a training step's compute would (default 0)\n"
		"      --fault=I:SPEC       MP_FAULT SPEC for the peer of spawn index I\n"
		"                           (repeatable), e.g. 3:kill:round=1:phase=gather\n"
		"      --late=K             K more peers start once the others finished round 1\n"
		"      --intruders=K        K more peers with another run key try to join\n"
		"      --clients=K          dht: the last K initial peers are clients (no inbound\n"
		"                           connections, they reduce nothing)\n"
		"      --aux=K              dht: the last K initial peers are auxiliary (they\n"
		"                           reduce but contribute weight 0)\n"
		"      --max-rms=X          fail if rms_err exceeds X\n"
		"      --logs=DIR           keep the contribution logs in DIR\n"
		"\n"
		"Output:\n"
		"      --json=FILE          also write settings and results as JSON\n"
		"      --peer-stats         at the end, each peer's table of its peers: state,\n"
		"                           measured bandwidth and round trip (also in --json)\n"
		"      --minmax             add the fastest and slowest peer's time per row\n"
		"                           (time is always the slowest peer's, as in nccl-tests)\n"
		"  -h, --help               show this help\n"
		"\n"
		"nccl-tests options that mpbench does not take, as each names something it has\n"
		"no choice of: -g (GPUs per thread) and -t (threads per process): every peer is\n"
		"one process (one thread with --transport=loop), so use --peers=N; -d (data\n"
		"type): values are float (fp32), and --codec sets what goes on the wire; -o\n"
		"(reduction): the result is the (weighted) mean. The values that say just that\n"
		"(-g 1, -t 1, -d float, -o avg) are accepted.\n"
		"\n"
		"Every MP_* variable of libmoshpit applies; options override them.\n"
		"Exit status: 0 ok, 1 wrong results or a failure, 2 bad usage.\n");
}

enum {
	OPT_TRANSPORT = 256,
	OPT_PEERS,
	OPT_ALGO,
	OPT_GRID,
	OPT_ROUNDS,
	OPT_CODEC,
	OPT_JSON,
	OPT_HOSTFILE,
	OPT_RANK,
	OPT_RUN,
	OPT_CHUNK,
	OPT_STREAMS,
	OPT_TIMEOUT,
	OPT_WEIGHTED,
	OPT_SEED,
	OPT_TOL,
	OPT_RENDEZVOUS,
	OPT_BOOTSTRAP,
	OPT_DHT_PORT,
	OPT_CHURN,
	OPT_JOIN,
	OPT_FAULT,
	OPT_LATE,
	OPT_INTRUDERS,
	OPT_CLIENTS,
	OPT_AUX,
	OPT_MAX_RMS,
	OPT_COMPUTE_MS,
	OPT_LOGS,
	OPT_DPDK_ARGS,
	OPT_INJECT_LOSS,
	OPT_PEER_STATS,
	OPT_MINMAX,
	OPT_SYNC,
	OPT_KEEP,
	OPT_CATCHUP,
	OPT_STANDBY,
	OPT_SAMPLE,
	OPT_DEAD,
	OPT_MEMORY,
};

static const struct option long_opts[] = {
	{ "minbytes", required_argument, NULL, 'b' },
	{ "maxbytes", required_argument, NULL, 'e' },
	{ "stepfactor", required_argument, NULL, 'f' },
	{ "iters", required_argument, NULL, 'n' },
	{ "warmup_iters", required_argument, NULL, 'w' },
	{ "check", required_argument, NULL, 'c' },
	{ "transport", required_argument, NULL, OPT_TRANSPORT },
	{ "peers", required_argument, NULL, OPT_PEERS },
	{ "algo", required_argument, NULL, OPT_ALGO },
	{ "grid", required_argument, NULL, OPT_GRID },
	{ "rounds", required_argument, NULL, OPT_ROUNDS },
	{ "codec", required_argument, NULL, OPT_CODEC },
	{ "json", required_argument, NULL, OPT_JSON },
	{ "hostfile", required_argument, NULL, OPT_HOSTFILE },
	{ "rank", required_argument, NULL, OPT_RANK },
	{ "run", required_argument, NULL, OPT_RUN },
	{ "chunk", required_argument, NULL, OPT_CHUNK },
	{ "streams", required_argument, NULL, OPT_STREAMS },
	{ "timeout", required_argument, NULL, OPT_TIMEOUT },
	{ "weighted", no_argument, NULL, OPT_WEIGHTED },
	{ "peer-stats", no_argument, NULL, OPT_PEER_STATS },
	{ "seed", required_argument, NULL, OPT_SEED },
	{ "tol", required_argument, NULL, OPT_TOL },
	{ "rendezvous", required_argument, NULL, OPT_RENDEZVOUS },
	{ "bootstrap", required_argument, NULL, OPT_BOOTSTRAP },
	{ "dht-port", required_argument, NULL, OPT_DHT_PORT },
	{ "churn", required_argument, NULL, OPT_CHURN },
	{ "join", required_argument, NULL, OPT_JOIN },
	{ "fault", required_argument, NULL, OPT_FAULT },
	{ "late", required_argument, NULL, OPT_LATE },
	{ "intruders", required_argument, NULL, OPT_INTRUDERS },
	{ "clients", required_argument, NULL, OPT_CLIENTS },
	{ "aux", required_argument, NULL, OPT_AUX },
	{ "max-rms", required_argument, NULL, OPT_MAX_RMS },
	{ "compute-ms", required_argument, NULL, OPT_COMPUTE_MS },
	{ "logs", required_argument, NULL, OPT_LOGS },
	{ "dpdk-args", required_argument, NULL, OPT_DPDK_ARGS },
	{ "inject-loss", required_argument, NULL, OPT_INJECT_LOSS },
	{ "minmax", no_argument, NULL, OPT_MINMAX },
	{ "sync", required_argument, NULL, OPT_SYNC },
	{ "keep", required_argument, NULL, OPT_KEEP },
	{ "churn-catchup", required_argument, NULL, OPT_CATCHUP },
	{ "standby", required_argument, NULL, OPT_STANDBY },
	{ "sample", required_argument, NULL, OPT_SAMPLE },
	{ "dead", required_argument, NULL, OPT_DEAD },
	{ "memory", required_argument, NULL, OPT_MEMORY },
	/* nccl-tests' names, to say why they do not apply (nccl_flag) */
	{ "ngpus", required_argument, NULL, 'g' },
	{ "nthreads", required_argument, NULL, 't' },
	{ "datatype", required_argument, NULL, 'd' },
	{ "op", required_argument, NULL, 'o' },
	{ "help", no_argument, NULL, 'h' },
	{ NULL, 0, NULL, 0 },
};

/* Launcher environment: 1 with rank and size when run by mpirun, PMI or srun. */
static int launched_by(int *rank, int *size, const char **name)
{
	static const char *const vars[][3] = {
		{ "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "mpirun" },
		{ "PMI_RANK", "PMI_SIZE", "PMI" },
		{ "SLURM_PROCID", "SLURM_NTASKS", "srun" },
	};

	for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++) {
		const char *r = getenv(vars[i][0]), *s = getenv(vars[i][1]);
		char *e1, *e2;
		long rv, sv;

		if (!r || !s)
			continue;
		rv = strtol(r, &e1, 10);
		sv = strtol(s, &e2, 10);
		if (*r && *s && !*e1 && !*e2 && rv >= 0 && sv > rv && sv <= INT_MAX) {
			*rank = (int)rv;
			*size = (int)sv;
			*name = vars[i][2];
			return 1;
		}
	}
	return 0;
}
/*
 * nccl-tests' -g, -t, -d and -o choose what mpbench has no choice of: the
 * value that describes what it does anyway is accepted, any other is a
 * usage error that says why, so that a command line copied from nccl-tests
 * either means the same here or fails saying what differs.
 */
static int nccl_flag(int o, const char *arg, char *err, size_t errlen)
{
	switch (o) {
	case 'g':
		if (strcmp(arg, "1"))
			return cli_fail(err, errlen, "-g %s (GPUs per thread, from nccl-tests) is not "
					"taken: every mpbench peer is one process with one buffer; "
					"use --peers=N", arg);
		break;
	case 't':
		if (strcmp(arg, "1"))
			return cli_fail(err, errlen, "-t %s (threads per process, from nccl-tests) is "
					"not taken: every peer is one process (one thread of one "
					"process with --transport=loop); use --peers=N", arg);
		break;
	case 'd':
		if (strcmp(arg, "float") && strcmp(arg, "fp32") && strcmp(arg, "float32"))
			return cli_fail(err, errlen, "-d %s (data type, from nccl-tests) is not taken: "
					"libmoshpit averages float (fp32) only; --codec sets what "
					"goes on the wire", arg);
		break;
	case 'o':
		if (strcmp(arg, "avg") && strcmp(arg, "mean"))
			return cli_fail(err, errlen, "-o %s (reduction, from nccl-tests) is not taken: "
					"libmoshpit computes the (weighted) mean only (-o avg)", arg);
		break;
	}
	return 0;
}

/* An option whose value is only checked, then stored in its variable. */
struct field_opt {
	int opt;
	const char *name; /* in messages */
	enum { FIELD_INT, FIELD_REAL, FIELD_TEXT } kind;
	void *field;      /* an int, a double or a const char * (not empty) */
	double lo, hi;    /* the range of FIELD_INT (exact in a double) and FIELD_REAL */
};

/* 1 when @o is in @f (its value stored), 0 when it is not, -EINVAL when its
 * value is bad. */
static int set_field_opt(const struct field_opt *f, size_t n, int o, const char *arg, char *err,
			 size_t errlen)
{
	for (; n > 0; f++, n--) {
		int64_t iv;
		double dv;

		if (f->opt != o)
			continue;
		switch (f->kind) {
		case FIELD_INT:
			if (cli_int(f->name, arg, (int64_t)f->lo, (int64_t)f->hi, &iv, err, errlen))
				return -EINVAL;
			*(int *)f->field = (int)iv;
			break;
		case FIELD_REAL:
			if (cli_real(f->name, arg, f->lo, f->hi, &dv, err, errlen))
				return -EINVAL;
			*(double *)f->field = dv;
			break;
		case FIELD_TEXT:
			if (!*arg)
				return cli_fail(err, errlen, "empty %s", f->name);
			*(const char **)f->field = arg;
			break;
		}
		return 1;
	}
	return 0;
}

/* --fault=I:SPEC, appended to b->faults (the spec points into @arg). */
static int add_fault(struct bench *b, const char *arg, char *err, size_t errlen)
{
	struct fault_opt *f;
	char *end;
	long idx;

	errno = 0;
	idx = strtol(arg, &end, 10);
	if (errno || end == arg || *end != ':' || !end[1] || idx < 0 || idx > INT_MAX)
		return cli_fail(err, errlen, "bad --fault '%s' (INDEX:SPEC, e.g. "
				"3:kill:round=1:phase=gather)", arg);
	f = realloc(b->faults, (size_t)(b->nfaults + 1) * sizeof(*b->faults));
	if (!f)
		die_oom();
	b->faults = f;
	b->faults[b->nfaults].index = (int)idx;
	b->faults[b->nfaults].spec = end + 1;
	b->nfaults++;
	return 0;
}

/*
 * The options one by one, over the settings in @b; every value is checked
 * here, their combinations by mpbench_parse. getopt_long keeps its place
 * in globals: optind = 0 makes glibc's start over (and read
 * POSIXLY_CORRECT again), so that each call parses its @argv from the
 * start, whatever an earlier call left. 1 for --help (stop there).
 */
static int parse_argv(struct bench *b, int argc, char **argv, char *err, size_t errlen)
{
	struct mp_config *c = &b->cfg;
	const struct field_opt fields[] = {
		{ 'n', "--iters", FIELD_INT, &b->iters, 1, INT_MAX / 2 },
		{ 'w', "--warmup_iters", FIELD_INT, &b->warmup, 0, INT_MAX / 2 },
		{ 'c', "--check", FIELD_INT, &b->check, 0, 1 },
		{ OPT_SYNC, "--sync", FIELD_INT, &b->sync, 0, 1 },
		{ OPT_PEERS, "--peers", FIELD_INT, &b->peers_opt, 1, MPBENCH_MAX_PEERS },
		{ OPT_RANK, "--rank", FIELD_INT, &b->rank_opt, 0, INT_MAX - 1 },
		{ OPT_ROUNDS, "--rounds", FIELD_INT, &c->rounds, 0, 1 << 16 },
		{ OPT_STREAMS, "--streams", FIELD_INT, &c->streams, 0, 1024 },
		{ OPT_DHT_PORT, "--dht-port", FIELD_INT, &c->dht_port, 0, 65535 },
		{ OPT_JOIN, "--join", FIELD_INT, &b->join, 0, 1 },
		{ OPT_LATE, "--late", FIELD_INT, &b->late, 0, 1024 },
		{ OPT_INTRUDERS, "--intruders", FIELD_INT, &b->intruders, 0, 1024 },
		{ OPT_CLIENTS, "--clients", FIELD_INT, &b->clients, 0, 1024 },
		{ OPT_AUX, "--aux", FIELD_INT, &b->aux, 0, 1024 },
		{ OPT_COMPUTE_MS, "--compute-ms", FIELD_INT, &b->compute_ms, 0, 60000 },
		{ OPT_KEEP, "--keep", FIELD_INT, &b->keep, 0, 1 << 20 },
		{ OPT_CATCHUP, "--churn-catchup", FIELD_INT, &b->catchup, 0, 1 },
		{ OPT_STANDBY, "--standby", FIELD_INT, &b->standby, 0, 64 },
		{ OPT_SAMPLE, "--sample", FIELD_INT, &b->sample, 0, 1 << 20 },
		{ OPT_INJECT_LOSS, "--inject-loss", FIELD_REAL, &b->inject_loss, 0.0, 0.5 },
		{ OPT_CHURN, "--churn", FIELD_REAL, &b->churn, 0.0, 0.5 },
		{ OPT_MAX_RMS, "--max-rms", FIELD_REAL, &b->max_rms, 0.0, HUGE_VAL },
		{ OPT_JSON, "--json", FIELD_TEXT, &b->json, 0, 0 },
		{ OPT_HOSTFILE, "--hostfile", FIELD_TEXT, &c->hostfile, 0, 0 },
		{ OPT_RUN, "--run", FIELD_TEXT, &b->run, 0, 0 },
		{ OPT_LOGS, "--logs", FIELD_TEXT, &b->logdir, 0, 0 },
		{ OPT_DEAD, "--dead", FIELD_TEXT, &b->dead, 0, 0 },
	};
	int o, rc;

	b->rank_opt = -1;
	b->peers_opt = 0;
	opterr = 0;
	optind = 0;
	while ((o = getopt_long(argc, argv, ":b:e:f:n:w:c:g:t:d:o:h", long_opts, NULL)) != -1) {
		const char *name = optind > 0 && optind <= argc ? argv[optind - 1] : "option";
		int64_t iv;

		rc = set_field_opt(fields, sizeof(fields) / sizeof(fields[0]), o, optarg, err,
				   errlen);
		if (rc < 0)
			return rc;
		if (rc)
			continue;
		switch (o) {
		case 'b':
			if (cli_size("--minbytes", optarg, 0, UINT64_MAX, &b->minbytes, err, errlen))
				return -EINVAL;
			b->size_given |= 1;
			break;
		case 'e':
			if (cli_size("--maxbytes", optarg, 0, UINT64_MAX, &b->maxbytes, err, errlen))
				return -EINVAL;
			b->size_given |= 2;
			break;
		case 'f':
			if (cli_int("--stepfactor", optarg, 2, 1 << 20, &iv, err, errlen))
				return -EINVAL;
			b->stepfactor = (uint64_t)iv;
			break;
		case OPT_TRANSPORT:
			if (!mp_transport_available(optarg))
				return cli_fail(err, errlen, "--transport=%s: not built into this library, "
						"registered or in MP_DRIVER_PATH", optarg);
			b->transport = optarg;
			break;
		case OPT_DPDK_ARGS:
			b->dpdk_args = optarg;
			break;
		case OPT_ALGO: {
			int v = mp_algo_from_name(optarg);

			if (v < 0)
				return cli_fail(err, errlen, "unknown --algo '%s' (moshpit, ring or "
						"butterfly)", optarg);
			c->algo = v;
			break;
		}
		case OPT_GRID: {
			struct gridinfo g;

			/* Syntax only here: the cell count is checked once the
			 * number of peers is known. */
			if (grid_from_library(optarg, 1, &g) < 0)
				return cli_fail(err, errlen, "bad --grid '%s' (like 4x4 or 2x2x2, at most "
						"%d dimensions)", optarg, MP_MAX_GRID_DIMS);
			c->grid = optarg;
			break;
		}
		case OPT_CODEC: {
			if (mp_codec_parse(optarg, c))
				return cli_fail(err, errlen, "bad --codec '%s': %s (the form: none, fp16, "
						"bf16, uniform8[:SIGMAS], blockwise8[:BLOCK], "
						"topk[:FRACTION], adacomp[:conv|fc|BIN] or auto)",
						optarg, mp_last_error(NULL));
			break;
		}
		case OPT_CHUNK: {
			uint64_t v;

			if (cli_size("--chunk", optarg, 0, UINT64_MAX, &v, err, errlen))
				return -EINVAL;
			if (v == 0 || v % 4 || v > SIZE_MAX / 2)
				return cli_fail(err, errlen, "bad --chunk '%s' (a positive multiple of 4 "
						"bytes)", optarg);
			c->chunk_bytes = (size_t)v;
			break;
		}
		case OPT_TIMEOUT:
			if (cli_int("--timeout", optarg, 1, INT_MAX / 64, &iv, err, errlen))
				return -EINVAL;
			c->connect_timeout_ms = (int)iv;
			c->round_timeout_ms = (int)iv;
			break;
		case OPT_WEIGHTED:
			b->weighted = 1;
			break;
		case OPT_PEER_STATS:
			b->peer_stats = 1;
			break;
		case OPT_SEED:
			if (cli_u64("--seed", optarg, &b->seed, err, errlen))
				return -EINVAL;
			break;
		case OPT_TOL: {
			char *end;
			double v;

			errno = 0;
			v = strtod(optarg, &end);
			if (errno || end == optarg || *end || !(v >= 0) || !isfinite(v))
				return cli_fail(err, errlen, "bad --tol '%s' (a non-negative number)",
						optarg);
			b->tol = v;
			b->tol_set = 1;
			break;
		}
		case OPT_RENDEZVOUS:
			if (strcmp(optarg, "dht") == 0)
				b->dht = 1;
			else if (strcmp(optarg, "static") == 0)
				b->rdv_static = 1;
			else
				return cli_fail(err, errlen, "unknown --rendezvous '%s' (static or dht)",
						optarg);
			if (b->dht && b->rdv_static)
				return cli_fail(err, errlen, "--rendezvous given as both static and dht");
			break;
		case OPT_BOOTSTRAP:
			if (!*optarg || !strchr(optarg, ':'))
				return cli_fail(err, errlen, "bad --bootstrap '%s' (host:port[,host:port...])",
						optarg);
			c->bootstrap = optarg;
			break;
		case OPT_FAULT:
			if (add_fault(b, optarg, err, errlen))
				return -EINVAL;
			break;
		case 'g':
		case 't':
		case 'd':
		case 'o':
			if (nccl_flag(o, optarg, err, errlen))
				return -EINVAL;
			break;
		case OPT_MINMAX:
			b->minmax = 1;
			break;
		case OPT_MEMORY:
			if (strcmp(optarg, "cuda") == 0)
				b->cuda = 1;
			else if (strcmp(optarg, "host") == 0)
				b->cuda = 0;
			else
				return cli_fail(err, errlen, "unknown --memory '%s' (host or cuda)", optarg);
			break;
		case 'h':
			return 1;
		case ':':
			return cli_fail(err, errlen, "%s needs a value", name);
		case '?':
		default:
			return cli_fail(err, errlen, "unknown or malformed option '%s'", name);
		}
	}
	if (optind < argc)
		return cli_fail(err, errlen, "unexpected argument '%s'", argv[optind]);
	return 0;
}

/*
 * Followed runs: one vector size for the whole run (a joiner's buffer must
 * match the others' at whatever round it arrives), one process per peer
 * (tcp, ofi, verbs: a fault kills its process), and the codecs the replay
 * can follow.
 */
static int follow_options(struct bench *b, char *err, size_t errlen)
{
	if (b->loop)
		return cli_fail(err, errlen, "--rendezvous=dht, --churn and --fault need a process "
				"per peer: --transport=tcp, ofi or verbs (a fault kills its whole "
				"process)");
	if (b->cfg.algo != MP_ALGO_MOSHPIT)
		return cli_fail(err, errlen, "--rendezvous=dht, --churn and --fault need "
				"--algo=moshpit");
	if (codec_sparse(b->cfg.codec))
		return cli_fail(err, errlen, "--codec=%s holds values back (error feedback), which "
				"the replay of the logs cannot follow", codec_name(b->cfg.codec));
	if (b->size_given == 3 && b->minbytes != b->maxbytes)
		return cli_fail(err, errlen, "--rendezvous=dht, --churn and --fault run one size: "
				"give -b or -e");
	/* The size asked for is the size run: -b alone, -e alone or both equal. */
	if (b->size_given == 1)
		b->maxbytes = b->minbytes;
	else if (b->size_given == 2)
		b->minbytes = b->maxbytes;
	else if (b->size_given == 0)
		b->minbytes = b->maxbytes = 256u << 10;
	return 0;
}

/* Every peer of a followed run, joiners included, gets the same grid: the
 * one given, or the library's choice for the peers and the late peers. */
static int follow_grid(struct bench *b, char *err, size_t errlen)
{
	struct gridinfo g;

	if (b->cfg.grid)
		return 0;
	if (grid_from_library(NULL, b->npeers + b->late, &g) < 0)
		return cli_fail(err, errlen, "no grid for %d peers", b->npeers + b->late);
	grid_format(&g, b->grid_buf, sizeof(b->grid_buf));
	b->cfg.grid = b->grid_buf;
	return 0;
}

/*
 * A followed run's rounds, once bench_derive knows the grid: the late peers
 * need free cells, and --churn rounds to kill in. The last rounds are free
 * of deaths, so that the survivors and any replacement can reach
 * consensus: rms_err measures whether they do.
 */
static int follow_rounds(struct bench *b, char *err, size_t errlen)
{
	/* -n and -w take up to INT_MAX / 2 each, --rounds 65536: their
	 * product overflowed an int (fuzz_mpbench_opts, regress-total-rounds). */
	int64_t total = (int64_t)(b->warmup + b->iters) * b->rounds_eff;

	if ((uint64_t)b->npeers + (uint64_t)b->late > b->grid.cells)
		return cli_fail(err, errlen, "--late=%d needs free grid cells: grid %s has %" PRIu64
				" cells for %d peers", b->late, b->cfg.grid, b->grid.cells,
				b->npeers);
	if (total > INT_MAX)
		return cli_fail(err, errlen, "-w %d and -n %d of %d round(s) make %" PRId64 " rounds: "
				"a followed run (--rendezvous=dht, --churn, --fault) runs at most %d",
				b->warmup, b->iters, b->rounds_eff, total, INT_MAX);
	b->total_rounds = (int)total;
	b->churn_end = b->total_rounds - 2 * b->grid.ndims - 2;
	if (b->churn_end < 0)
		b->churn_end = 0;
	if (b->churn > 0 && b->churn_end == 0)
		return cli_fail(err, errlen, "--churn: %d rounds leave none for deaths (the last 2 x "
				"%d + 2 converge); raise --rounds or --iters", b->total_rounds,
				b->grid.ndims);
	return 0;
}

/* Sizes from min to max, multiplying by the step factor. */
static int make_sizes(struct bench *b, char *err, size_t errlen)
{
	int cap = 0;

	if (b->minbytes == 0 || b->minbytes % 4)
		return cli_fail(err, errlen, "--minbytes %" PRIu64 " is not a positive multiple of 4 "
				"bytes (fp32)", b->minbytes);
	if (b->maxbytes == 0 || b->maxbytes % 4)
		return cli_fail(err, errlen, "--maxbytes %" PRIu64 " is not a positive multiple of 4 "
				"bytes (fp32)", b->maxbytes);
	if (b->minbytes > b->maxbytes)
		return cli_fail(err, errlen, "--minbytes %" PRIu64 " is larger than --maxbytes %"
				PRIu64, b->minbytes, b->maxbytes);
	if (b->maxbytes > SIZE_MAX / 2)
		return cli_fail(err, errlen, "--maxbytes %" PRIu64 " is too large", b->maxbytes);
	for (uint64_t s = b->minbytes; s <= b->maxbytes; s *= b->stepfactor) {
		if (b->nsizes == cap) {
			uint64_t *p;

			cap = cap ? cap * 2 : 16;
			p = realloc(b->sizes, (size_t)cap * sizeof(*b->sizes));
			if (!p)
				die_oom();
			b->sizes = p;
		}
		b->sizes[b->nsizes++] = s;
		if (s > UINT64_MAX / b->stepfactor)
			break;
	}
	return 0;
}

/* --dead's syntax; the ranks' range once the peer count is known (launch.c). */
static int dead_syntax(const char *dead, char *err, size_t errlen)
{
	const char *s = dead;

	do {
		char *end;
		long v;

		errno = 0;
		v = strtol(s, &end, 10);
		if (end == s || errno || v < 0 || v >= 1 << 20 || (*end && *end != ','))
			return cli_fail(err, errlen, "bad --dead '%s' (ranks, e.g. 7 or 3,5)", dead);
		s = *end ? end + 1 : end;
	} while (*s);
	return 0;
}

/* The ring forwards partial sums: no place for a sparse codec's error
 * feedback. */
static int ring_sparse(const struct bench *b, char *err, size_t errlen)
{
	if (b->cfg.algo == MP_ALGO_RING && codec_sparse(b->cfg.codec))
		return cli_fail(err, errlen, "--codec=%s needs --algo=moshpit or butterfly (the ring "
				"forwards partial sums, with no place for error feedback)",
				codec_name(b->cfg.codec));
	return 0;
}

int bench_init(struct bench *b)
{
	int rc;

	memset(b, 0, sizeof(*b));
	mp_config_init(&b->cfg);
	rc = mp_config_from_env(&b->cfg);
	b->minbytes = 64ULL << 10;
	b->maxbytes = 16ULL << 20;
	b->stepfactor = 2;
	b->iters = 5;
	b->warmup = 1;
	b->check = 1;
	b->sync = 1;
	b->seed = 42;
	b->transport = b->cfg.transport && *b->cfg.transport ? b->cfg.transport : "tcp";
	b->join = -1;
	b->max_rms = -1.0;
	b->rank_opt = -1;
	b->lrank = -1;
	return rc;
}

void bench_free(struct bench *b)
{
	free(b->sizes);
	free(b->faults);
	free(b->dead_mask);
	b->sizes = NULL;
	b->faults = NULL;
	b->dead_mask = NULL;
	b->nsizes = 0;
	b->nfaults = 0;
}

/* mpbench_parse, but what it allocated stays in @b on failure too. */
static int parse_checked(int argc, char **argv, struct bench *b, char *err, size_t errlen)
{
	int rc;

	rc = parse_argv(b, argc, argv, err, errlen);
	if (rc < 0)
		return rc;
	if (rc) {
		b->help = 1;
		return 0;
	}
	if (!b->rdv_static && b->cfg.rendezvous && strcmp(b->cfg.rendezvous, "dht") == 0)
		b->dht = 1;
	if (b->churn > 0 || b->late || b->intruders || (b->cfg.bootstrap && !b->rdv_static)) {
		if (b->rdv_static)
			return cli_fail(err, errlen, "--churn, --late and --intruders need "
					"--rendezvous=dht");
		b->dht = 1;
	}
	if (b->join < 0)
		b->join = b->churn > 0;
	b->loop = strcmp(b->transport, "loop") == 0;

	b->launched = launched_by(&b->lrank, &b->lsize, &b->lname);
	b->multi = b->cfg.hostfile || b->cfg.peers || b->rank_opt >= 0 || b->cfg.rank >= 0 ||
		   (b->launched && b->lsize > 1) || (b->dht && b->cfg.bootstrap);
	b->follow = !b->multi && (b->dht || b->nfaults || b->churn > 0 || b->late || b->intruders);
	if (b->dead && !b->multi)
		return cli_fail(err, errlen, "--dead names ranks of a multi-host run (local runs kill "
				"with --fault)");
	if (b->dead && dead_syntax(b->dead, err, errlen))
		return -EINVAL;
	if (b->multi && (b->nfaults || b->churn > 0 || b->late || b->intruders))
		return cli_fail(err, errlen, "--churn, --fault, --late and --intruders start local "
				"peers: they cannot be used across hosts");
	if ((b->clients || b->aux) && (!b->dht || b->multi))
		return cli_fail(err, errlen, "--clients and --aux give local peers of a "
				"--rendezvous=dht run their DeDLOC modes");
	if (b->standby && !(b->follow && b->churn > 0 && b->join))
		return cli_fail(err, errlen, "--standby keeps replacements for --churn (with --join=1)");
	if ((b->keep || b->sample) && !b->follow)
		return cli_fail(err, errlen, "--keep and --sample are for followed runs "
				"(--rendezvous=dht, --churn, --fault)");
	if (b->compute_ms && !b->follow)
		return cli_fail(err, errlen, "--compute-ms paces followed runs (--rendezvous=dht, "
				"--churn, --fault)");
	if (b->follow && follow_options(b, err, errlen))
		return -EINVAL;
	if (strcmp(b->transport, "dpdk") == 0) {
		if (b->follow)
			return cli_fail(err, errlen, "--transport=dpdk runs static rounds: no "
					"--rendezvous=dht, --churn or --fault");
	} else if (b->dpdk_args || b->inject_loss > 0) {
		return cli_fail(err, errlen, "--dpdk-args and --inject-loss are for --transport=dpdk");
	}
	if (make_sizes(b, err, errlen))
		return -EINVAL;
	if (b->follow && b->check && b->maxbytes > (1u << 20))
		return cli_fail(err, errlen, "--check with --rendezvous=dht, --churn or --fault sends "
				"every peer's final values to the launcher: at most 1M (or --check=0)");
	if (b->cuda) {
		if (b->follow)
			return cli_fail(err, errlen, "--memory=cuda runs static averages: no "
					"--rendezvous=dht, --churn, --fault, --late or --intruders");
	}
	if (!b->multi) {
		const char *run_env;

		b->npeers = b->peers_opt ? b->peers_opt : b->cfg.npeers > 0 ? b->cfg.npeers : 8;
		if (b->keep >= b->npeers && b->churn > 0)
			return cli_fail(err, errlen, "--keep=%d spares every one of the %d peers from "
					"--churn", b->keep, b->npeers);
		if (b->clients + b->aux >= b->npeers)
			return cli_fail(err, errlen, "--clients=%d and --aux=%d leave no normal peer "
					"of %d", b->clients, b->aux, b->npeers);
		run_env = getenv("MP_RUN");
		if (b->run == NULL && run_env && *run_env)
			b->run = run_env;
		if (b->run == NULL) {
			snprintf(b->run_buf, sizeof(b->run_buf), PROG "-%ld", (long)getpid());
			b->run = b->run_buf;
		}
		if (b->follow) {
			for (int k = 0; k < b->nfaults; k++)
				if (b->faults[k].index >= b->npeers + b->late)
					return cli_fail(err, errlen, "--fault=%d:...: peers are numbered 0 "
							"to %d", b->faults[k].index,
							b->npeers + b->late - 1);
			if (follow_grid(b, err, errlen))
				return -EINVAL;
		}
		/* bench_derive's and run_follow's checks, which ran after these
		 * (their messages come in the same order). */
		if (bench_derive(b, b->npeers, err, errlen) || ring_sparse(b, err, errlen))
			return -EINVAL;
		if (b->follow && follow_rounds(b, err, errlen))
			return -EINVAL;
		return 0;
	}

	if (b->dht) {
		if (b->rank_opt < 0 && b->cfg.rank < 0 && !b->launched)
			return cli_fail(err, errlen, "--rendezvous=dht across hosts needs --rank=R and "
					"--peers=N: this process is peer R of N");
	} else if (!b->cfg.hostfile && !b->cfg.peers) {
		if (b->launched)
			return cli_fail(err, errlen, "started by %s as rank %d of %d: multi-host mode "
					"needs --hostfile=FILE (or MP_HOSTFILE / MP_PEERS)", b->lname,
					b->lrank, b->lsize);
		return cli_fail(err, errlen, "a rank was given: multi-host mode needs --hostfile=FILE "
				"(or MP_HOSTFILE / MP_PEERS)");
	}
	if (b->loop)
		return cli_fail(err, errlen, "--transport=loop runs every peer in one process; it "
				"cannot be used across hosts");
	if (!b->run)
		b->run = b->cfg.run_name;
	if (b->rank_opt >= 0)
		b->cfg.rank = b->rank_opt;
	else if (b->cfg.rank < 0 && b->launched)
		b->cfg.rank = b->lrank;
	if (b->peers_opt)
		b->cfg.npeers = b->peers_opt;
	else if (b->cfg.npeers <= 0 && b->launched && (b->rank_opt < 0 || b->lrank == b->rank_opt))
		b->cfg.npeers = b->lsize;
	if (b->dht && b->cfg.npeers <= 0)
		return cli_fail(err, errlen, "--rendezvous=dht across hosts needs --peers=N");
	/* Before mp_init now, which the peer count of bench_derive waits for. */
	return ring_sparse(b, err, errlen);
}

int mpbench_parse(int argc, char **argv, struct bench *b, char *err, size_t errlen)
{
	int rc = parse_checked(argc, argv, b, err, errlen);

	if (rc)
		bench_free(b);
	return rc;
}
