/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Fuzz target for mpbench's command line (tools/mpbench/options.c,
 * mpbench_parse): getopt_long over every option, each value's check, and
 * every check of their combinations, through the mode (local, followed,
 * multi-host), the sizes, and in local runs the peers, the grid and what
 * bench_derive derives from them.
 *
 * Input: the arguments after argv[0] = "mpbench", split on NUL bytes (at
 * most MAX_ARGS; an empty input is no argument). Each is copied into a
 * buffer of its exact length, so that a read past its end is ASan's.
 *
 * The environment: every MP_* variable, the launchers' (OMPI_*, PMI_*,
 * SLURM_*) and POSIXLY_CORRECT are unset once, before the first input, so
 * that the settings come from the arguments alone and mp_transport_available
 * loads no MP_DRIVER_PATH plugin. mpbench_parse reads no file otherwise (the
 * hostfile is only named; mp_init reads it).
 *
 * Invariants: the parse returns 0 or -EINVAL. On -EINVAL the message is one
 * non-empty line, it fits its buffer (mpbench sizes it the same way, so it
 * is never cut), and every byte of it outside printable ASCII is one the
 * arguments hold (a value echoed back); nothing stays allocated. On 0 the
 * settings are what the rest of mpbench takes for granted (check_settings).
 * The same arguments parsed again give the same result, bit for bit: no
 * state survives a call (getopt_long's included).
 *
 * Built two ways, as fuzz_frame.c: libFuzzer with -DMP_LIBFUZZER, else
 * main() (fuzz_main.h) replays tests/fuzz/corpus/fuzz_mpbench_opts/ or a
 * deterministic stream of mutated command lines.
 */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpbench.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
#define FUZZ_SEED 0x5D1B0A7C3E9F2461ull /* the deterministic stream's start */
#include "fuzz_main.h"

#define MAX_ARGS 32

extern char **environ;

/* Fails loudly with the line, in either build (assert is gone in release). */
#define CHECK(cond)                                                                    \
	do {                                                                           \
		if (!(cond)) {                                                         \
			fprintf(stderr, "fuzz_mpbench_opts: %s:%d: %s\n", __FILE__, __LINE__, \
				#cond);                                                \
			abort();                                                       \
		}                                                                      \
	} while (0)

static void setup_once(void)
{
	static int done;
	int again = 1;

	if (done)
		return;
	done = 1;
	/* Unset one at a time, rescanning: unsetenv moves environ's entries. */
	while (again) {
		again = 0;
		for (char **e = environ; *e; e++) {
			const char *eq = strchr(*e, '=');
			char name[256];

			if (!eq || (size_t)(eq - *e) >= sizeof(name))
				continue;
			if (strncmp(*e, "MP_", 3) && strncmp(*e, "OMPI_", 5) && strncmp(*e, "PMI_", 4) &&
			    strncmp(*e, "SLURM_", 6) && strncmp(*e, "POSIXLY_CORRECT=", 16))
				continue;
			memcpy(name, *e, (size_t)(eq - *e));
			name[eq - *e] = '\0';
			unsetenv(name);
			again = 1;
			break;
		}
	}
	mp_log_set_level(MP_LOG_NONE);
}

/* What the rest of mpbench relies on once mpbench_parse said yes. */
static void check_settings(const struct bench *b)
{
	const struct mp_config *c = &b->cfg;
	int sparse = codec_sparse(c->codec);

	if (b->help)
		return;
	/* Sizes: positive multiples of 4 from min to max by the factor. */
	CHECK(b->stepfactor >= 2 && b->stepfactor <= 1 << 20);
	CHECK(b->minbytes > 0 && b->minbytes % 4 == 0);
	CHECK(b->maxbytes >= b->minbytes && b->maxbytes % 4 == 0 && b->maxbytes <= SIZE_MAX / 2);
	CHECK(b->nsizes >= 1 && b->sizes && b->sizes[0] == b->minbytes);
	for (int i = 1; i < b->nsizes; i++)
		CHECK(b->sizes[i] == b->sizes[i - 1] * b->stepfactor);
	CHECK(b->sizes[b->nsizes - 1] <= b->maxbytes);
	CHECK(b->sizes[b->nsizes - 1] > b->maxbytes / b->stepfactor); /* none left out */
	/* Iterations and switches. */
	CHECK(b->iters >= 1 && b->iters <= INT_MAX / 2);
	CHECK(b->warmup >= 0 && b->warmup <= INT_MAX / 2);
	CHECK((b->check | b->sync | b->join | b->catchup) <= 1);
	CHECK(b->check >= 0 && b->sync >= 0 && b->join >= 0 && b->catchup >= 0);
	CHECK(!b->tol_set || (isfinite(b->tol) && b->tol >= 0));
	CHECK(b->churn >= 0 && b->churn <= 0.5 && b->inject_loss >= 0 && b->inject_loss <= 0.5);
	CHECK(b->max_rms == -1.0 || (b->max_rms >= 0 && isfinite(b->max_rms)));
	CHECK(b->late >= 0 && b->late <= 1024 && b->intruders >= 0 && b->intruders <= 1024);
	CHECK(b->clients >= 0 && b->aux >= 0 && b->keep >= 0 && b->sample >= 0);
	CHECK(b->compute_ms >= 0 && b->compute_ms <= 60000);
	/* The library's settings as mpbench hands them over. */
	CHECK(strcmp(algo_name(c->algo), "?") != 0);
	CHECK(strcmp(codec_name(c->codec), "?") != 0);
	CHECK(c->chunk_bytes > 0 && c->chunk_bytes % 4 == 0);
	CHECK(c->connect_timeout_ms > 0 && c->round_timeout_ms > 0);
	CHECK(c->rounds >= 0 && c->rounds <= 1 << 16 && c->streams >= 0 && c->streams <= 1024);
	CHECK(c->dht_port >= 0 && c->dht_port <= 65535);
	CHECK(c->codec_block >= 1 && c->topk_ratio > 0 && c->topk_ratio <= 1 &&
	      c->codec_sigmas > 0);
	CHECK(b->transport && *b->transport && mp_transport_available(b->transport));
	/* Combinations refused. */
	CHECK(!(b->dht && b->rdv_static));
	CHECK(!(c->algo == MP_ALGO_RING && sparse));
	CHECK(!b->cuda || !b->follow);
	if (strcmp(b->transport, "dpdk") == 0)
		CHECK(!b->follow);
	else
		CHECK(!b->dpdk_args && b->inject_loss == 0);
	CHECK(b->follow || (!b->keep && !b->sample && !b->compute_ms));
	CHECK(!(b->clients || b->aux) || (b->dht && !b->multi));
	CHECK(!b->dead || b->multi);
	CHECK(b->loop == (strcmp(b->transport, "loop") == 0));
	if (b->follow) {
		CHECK(!b->multi && !b->loop && c->algo == MP_ALGO_MOSHPIT && !sparse);
		CHECK(b->nsizes == 1 && b->minbytes == b->maxbytes);
		CHECK(!b->check || b->maxbytes <= 1u << 20);
	}
	if (b->multi) {
		CHECK(!b->nfaults && b->churn == 0 && !b->late && !b->intruders && !b->loop);
		if (b->dht)
			CHECK(c->npeers > 0 && c->rank >= 0);
		else
			CHECK(c->hostfile || c->peers);
		CHECK(b->run && *b->run);
		return;
	}
	/* Local: the peers, the run and the grid bench_derive derived. */
	CHECK(b->npeers >= 1 && b->npeers <= MPBENCH_MAX_PEERS);
	CHECK(b->run && *b->run);
	CHECK(b->clients + b->aux < b->npeers);
	CHECK(b->churn == 0 || b->keep < b->npeers);
	CHECK(b->grid.ndims >= 1 && b->grid.ndims <= MP_MAX_GRID_DIMS);
	{
		uint64_t cells = 1;

		for (int i = 0; i < b->grid.ndims; i++) {
			CHECK(b->grid.dims[i] >= 1);
			cells *= (uint64_t)b->grid.dims[i];
		}
		CHECK(cells == b->grid.cells && cells >= (uint64_t)b->npeers);
	}
	CHECK(b->grid.given == (c->grid != NULL));
	CHECK(b->rounds_eff >= 1);
	CHECK(b->op_cap_ms > 0 && b->silence_ms >= b->op_cap_ms);
	CHECK(isfinite(b->tol) && b->tol >= 0 && isfinite(b->bus_factor) && b->bus_factor >= 0);
	CHECK(!b->exact || c->algo != MP_ALGO_MOSHPIT || b->grid.cells == (uint64_t)b->npeers);
	if (b->follow) {
		CHECK(c->grid != NULL);
		CHECK((uint64_t)b->npeers + (uint64_t)b->late <= b->grid.cells);
		for (int k = 0; k < b->nfaults; k++)
			CHECK(b->faults[k].index >= 0 && b->faults[k].index < b->npeers + b->late &&
			      b->faults[k].spec && *b->faults[k].spec);
		CHECK(b->total_rounds == (int64_t)(b->warmup + b->iters) * b->rounds_eff);
		CHECK(b->churn_end >= 0 && b->churn_end < b->total_rounds);
		CHECK(b->churn == 0 || b->churn_end > 0);
	}
}

/* The settings of two parses, compared after their own pointers are set
 * aside: the sizes and faults by content, the grid and run name by which
 * of the settings' own buffers they name. */
static void check_same(const struct bench *x, const struct bench *y)
{
	struct bench a = *x, b = *y;

	CHECK(a.nsizes == b.nsizes && a.nfaults == b.nfaults);
	CHECK(!a.nsizes || !memcmp(a.sizes, b.sizes, (size_t)a.nsizes * sizeof(*a.sizes)));
	for (int k = 0; k < a.nfaults; k++)
		CHECK(a.faults[k].index == b.faults[k].index && a.faults[k].spec == b.faults[k].spec);
	CHECK((a.cfg.grid == x->grid_buf) == (b.cfg.grid == y->grid_buf));
	CHECK((a.run == x->run_buf) == (b.run == y->run_buf));
	a.sizes = b.sizes = NULL;
	a.faults = b.faults = NULL;
	if (a.cfg.grid == x->grid_buf)
		a.cfg.grid = b.cfg.grid = NULL;
	if (a.run == x->run_buf)
		a.run = b.run = NULL;
	CHECK(memcmp(&a, &b, sizeof(a)) == 0);
}

/* A refusal's message: one line, whole, made of mpbench's printable text
 * and the bytes of the arguments it echoes. */
static void check_message(const char *err, size_t errlen, const uint8_t *data, size_t size)
{
	size_t n = strnlen(err, errlen);

	CHECK(n > 0 && n + 1 < errlen);
	for (size_t i = 0; i < n; i++) {
		unsigned char ch = (unsigned char)err[i];

		if (ch >= 0x20 && ch < 0x7f)
			continue;
		CHECK(memchr(data, ch, size) != NULL);
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char *args[MAX_ARGS + 2], *argv1[MAX_ARGS + 2], *argv2[MAX_ARGS + 2];
	/* As mpbench's main sizes it (err_room): whole messages only. */
	size_t errlen = 4096 + 2 * size;
	char *err1, *err2;
	struct bench b1, b2;
	int argc = 1, rc1, rc2;

	setup_once();
	args[0] = strdup("mpbench");
	CHECK(args[0]);
	for (size_t o = 0; o < size && argc <= MAX_ARGS;) {
		const uint8_t *nul = memchr(data + o, 0, size - o);
		size_t len = nul ? (size_t)(nul - (data + o)) : size - o;

		args[argc] = malloc(len + 1);
		CHECK(args[argc]);
		memcpy(args[argc], data + o, len);
		args[argc][len] = '\0';
		argc++;
		o += len + 1;
	}
	args[argc] = NULL;
	memcpy(argv1, args, sizeof(args));
	memcpy(argv2, args, sizeof(args));
	err1 = calloc(1, errlen);
	err2 = calloc(1, errlen);
	CHECK(err1 && err2);

	CHECK(bench_init(&b1) == 0);
	rc1 = mpbench_parse(argc, argv1, &b1, err1, errlen);
	CHECK(rc1 == 0 || rc1 == -EINVAL);
	if (rc1) {
		check_message(err1, errlen, data, size);
		CHECK(!b1.sizes && !b1.faults && !b1.dead_mask);
	} else {
		check_settings(&b1);
	}

	/* Again, from the arguments in their first order (getopt_long
	 * permuted argv1): the same answer, the same settings. */
	CHECK(bench_init(&b2) == 0);
	rc2 = mpbench_parse(argc, argv2, &b2, err2, errlen);
	CHECK(rc2 == rc1);
	if (rc1)
		CHECK(strcmp(err1, err2) == 0);
	else
		check_same(&b1, &b2);

	bench_free(&b1);
	bench_free(&b2);
	free(err1);
	free(err2);
	for (int i = 0; i < argc; i++)
		free(args[i]);
	return 0;
}

#ifndef MP_LIBFUZZER
/* Arguments users write, right and wrong, with and without their values. */
static const char *const words[] = {
	"--peers=4", "--peers=8", "--peers=1", "--peers=0", "--peers=1048577", "--peers", "16",
	"-b", "-e", "64K", "4K", "1M", "3", "0", "18014398509482048K", "-f", "4", "1",
	"-n", "-w", "-c", "5", "-1", "--iters=2", "--warmup_iters=0", "--check=0", "--sync=0",
	"--algo=ring", "--algo=butterfly", "--algo=moshpit", "--algo=tree", "--grid=2x2",
	"--grid=2x2x2", "--grid=4x4", "--grid=2xx2", "--rounds=1", "--rounds=12",
	"--codec=fp16", "--codec=topk:0.05", "--codec=adacomp:fc", "--codec=uniform8:6",
	"--codec=blockwise8:4096", "--codec=auto", "--codec=zip", "--weighted", "--seed=7",
	"--seed=0x1f", "--chunk=64K", "--chunk=6", "--streams=2", "--timeout=2000",
	"--memory=cuda", "--memory=host", "--transport=loop", "--transport=tcp",
	"--transport=dpdk", "--transport=smoke", "--run=exp1", "--hostfile=hosts", "--rank=0",
	"--rank=1", "--dead=3,5", "--dead=x", "--dpdk-args=-l 0", "--inject-loss=0.01",
	"--rendezvous=dht", "--rendezvous=static", "--bootstrap=node1:4222", "--dht-port=4222",
	"--churn=0.05", "--churn=0.6", "--join=0", "--keep=2", "--churn-catchup=1",
	"--sample=10", "--compute-ms=5", "--fault=1:kill:round=1:phase=gather", "--fault=x",
	"--late=1", "--intruders=1", "--clients=1", "--aux=1", "--max-rms=1e-6", "--logs=d",
	"--json=out.json", "--peer-stats", "--minmax", "--tol=1e-3", "-g", "-t", "-d", "-o",
	"float", "avg", "sum", "--help", "-h", "--bogus", "extra", "--", "-",
};
#define NWORDS (sizeof(words) / sizeof(words[0]))

static void fuzz_stream(long iters)
{
	uint8_t in[2048];

	setup_once();
	for (long i = 0; i < iters; i++) {
		int n = (int)(next() % 9);
		size_t len = 0;

		for (int k = 0; k < n; k++) {
			const char *w = words[next() % NWORDS];
			size_t wl = strlen(w);

			if (len + wl + 1 >= sizeof(in) - 64)
				break;
			if (k)
				in[len++] = 0;
			memcpy(in + len, w, wl);
			len += wl;
		}
		fuzz_mutate(in, &len, sizeof(in), 16);
		if (seed_dir)
			fuzz_seed(in, len);
		LLVMFuzzerTestOneInput(in, len);
	}
	printf("fuzz_mpbench_opts: %ld inputs, no crash\n", iters);
}
#endif
