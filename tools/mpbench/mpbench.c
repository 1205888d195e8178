/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * mpbench - run and benchmark Moshpit All-Reduce (and the ring and butterfly
 * baselines) through the public libmoshpit API, with nccl-tests-like output.
 *
 * Three ways to run:
 *
 *  - local, one process per peer (default, --transport=tcp): the parent forks
 *    N children; each listens on 127.0.0.1:0 and sends its address up a pipe,
 *    the parent sends the full list back down, and the children report one
 *    result per size. The parent prints the table.
 *  - local, one thread per peer (--transport=loop): the same, with the peers
 *    as threads of this process and the pipes replaced by in-memory queues.
 *  - multi-host (--hostfile, MP_HOSTFILE or MP_PEERS, with a rank from
 *    --rank, MP_RANK, mpirun, PMI or srun; or --rendezvous=dht with a rank
 *    and --bootstrap): this process is one peer; the library finds the
 *    others; rank 0 prints its own measurements.
 *
 * With the DHT rendezvous or any churn (--rendezvous=dht, --churn, --fault,
 * --late, --intruders) local peers average one round per call and are
 * followed round by round: they may die, join or be refused, and the
 * survivors' values are checked against a replay of every peer's
 * contribution log (replay.c).
 *
 * Every wait is bounded: pipe and queue reads poll with a deadline, every
 * average waits at most a safety limit on top of the library's own
 * deadlines, and a peer that stays silent too long is reported and killed.
 *
 * One file per concern: mpbench.h lists them.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "mpbench.h"
#include "dpdk_seg.h"

/*
 * Room for any message of mpbench_parse: each names at most two values of
 * the command line or MP_GRID (and a library message, under 1 KiB), so
 * that a long value is printed whole, as before the parse returned.
 */
static size_t err_room(int argc, char **argv)
{
	const char *grid = getenv("MP_GRID");
	size_t n = 4096 + 2 * (grid ? strlen(grid) : 0);

	for (int i = 0; i < argc; i++)
		n += 2 * strlen(argv[i]);
	return n;
}

int main(int argc, char **argv)
{
	struct bench b;
	size_t errlen = err_room(argc, argv);
	char how[128], *err;
	int rc;

	cli_init(PROG);
	if (bench_init(&b)) {
		fprintf(stderr, PROG ": bad MP_* environment variable: %s\n", mp_last_error(NULL));
		return EXIT_USAGE;
	}
	/* After bench_init: its refusal returns, and LeakSanitizer counts a
	 * buffer that main still held then as leaked. */
	err = xmalloc(errlen);
	if (mpbench_parse(argc, argv, &b, err, errlen))
		usage_error("%s", err);
	free(err);
	if (b.help) {
		bench_usage(stdout);
		return EXIT_OK;
	}
	signal(SIGPIPE, SIG_IGN);
	if (strcmp(b.transport, "dpdk") == 0) {
		char v[32];

		snprintf(v, sizeof(v), "%g", b.inject_loss);
		setenv("MP_DPDK_INJECT_LOSS", v, 1);
		snprintf(v, sizeof(v), "%" PRIu64, b.seed);
		setenv("MP_DPDK_INJECT_SEED", v, 0);
		if (b.multi && b.dpdk_args)
			setenv("MP_DPDK_EAL", b.dpdk_args, 1);
	}
	/* Before any peer starts, so that a machine without a GPU gets one
	 * line saying what is missing rather than one failure per peer. */
	if (b.cuda && dev_probe(b.cuda_what, sizeof(b.cuda_what))) {
		fprintf(stderr, PROG ": --memory=cuda: %s\n", b.cuda_what);
		bench_free(&b);
		return EXIT_FAIL;
	}
	if (!b.multi) {
		if (b.follow) {
			rc = run_follow(&b);
		} else if (strcmp(b.transport, "dpdk") == 0) {
			if (dseg_setup(b.npeers, b.dpdk_args, 0))
				return EXIT_FAIL;
			rc = run_local(&b);
			dseg_report();
			dseg_teardown();
		} else {
			rc = run_local(&b);
		}
		bench_free(&b);
		return rc;
	}

	if (b.dht)
		snprintf(how, sizeof(how), "dht, %s%s", b.cfg.bootstrap ? "bootstrap " : "first node",
			 b.cfg.bootstrap ? b.cfg.bootstrap : "");
	else
		snprintf(how, sizeof(how), "%s %s%s%s", b.cfg.hostfile ? "hostfile" : "peer list",
			 b.cfg.hostfile ? b.cfg.hostfile : "MP_PEERS", b.lname ? ", started by " : "",
			 b.lname ? b.lname : "");
	rc = run_multi(&b, how);
	bench_free(&b);
	return rc;
}
