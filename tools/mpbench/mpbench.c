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

/* ------------------------------------------------------------------------ */
/* Small helpers                                                             */

void die_oom(void)
{
	fprintf(stderr, PROG ": out of memory\n");
	fflush(NULL);
	_exit(EXIT_FAIL);
}

void *xmalloc(size_t n)
{
	void *p = malloc(n ? n : 1);

	if (!p)
		die_oom();
	return p;
}

void *xcalloc(size_t n, size_t sz)
{
	void *p = calloc(n ? n : 1, sz ? sz : 1);

	if (!p)
		die_oom();
	return p;
}

int clamp_ms(int64_t ms)
{
	if (ms > INT_MAX)
		return INT_MAX;
	if (ms < 0)
		return 0;
	return (int)ms;
}

int main(int argc, char **argv)
{
	struct bench b;
	int rank_opt, peers_opt, lrank = -1, lsize = 0, launched, rc;
	const char *lname = NULL, *run_env;
	char how[128];

	memset(&b, 0, sizeof(b));
	mp_config_init(&b.cfg);
	rc = mp_config_from_env(&b.cfg);
	if (rc) {
		fprintf(stderr, PROG ": bad MP_* environment variable: %s\n", mp_last_error(NULL));
		return EXIT_USAGE;
	}
	b.minbytes = 64ULL << 10;
	b.maxbytes = 16ULL << 20;
	b.stepfactor = 2;
	b.iters = 5;
	b.warmup = 1;
	b.check = 1;
	b.sync = 1;
	b.seed = 42;
	b.transport = b.cfg.transport && *b.cfg.transport ? b.cfg.transport : "tcp";
	b.join = -1;
	b.max_rms = -1.0;
	parse_options(&b, argc, argv, &rank_opt, &peers_opt);
	if (!b.rdv_static && b.cfg.rendezvous && strcmp(b.cfg.rendezvous, "dht") == 0)
		b.dht = 1;
	if (b.churn > 0 || b.late || b.intruders || (b.cfg.bootstrap && !b.rdv_static)) {
		if (b.rdv_static)
			usage_error("--churn, --late and --intruders need --rendezvous=dht");
		b.dht = 1;
	}
	if (b.join < 0)
		b.join = b.churn > 0;
	b.loop = strcmp(b.transport, "loop") == 0;
	signal(SIGPIPE, SIG_IGN);

	launched = launched_by(&lrank, &lsize, &lname);
	b.multi = b.cfg.hostfile || b.cfg.peers || rank_opt >= 0 || b.cfg.rank >= 0 ||
		  (launched && lsize > 1) || (b.dht && b.cfg.bootstrap);
	b.follow = !b.multi && (b.dht || b.nfaults || b.churn > 0 || b.late || b.intruders);
	if (b.dead && !b.multi)
		usage_error("--dead names ranks of a multi-host run (local runs kill with --fault)");
	if (b.dead) {
		const char *s = b.dead;

		/* Syntax now; the ranks' range once the peer count is known. */
		do {
			char *end;
			long v;

			errno = 0;
			v = strtol(s, &end, 10);
			if (end == s || errno || v < 0 || v >= 1 << 20 || (*end && *end != ','))
				usage_error("bad --dead '%s' (ranks, e.g. 7 or 3,5)", b.dead);
			s = *end ? end + 1 : end;
		} while (*s);
	}
	if (b.multi && (b.nfaults || b.churn > 0 || b.late || b.intruders))
		usage_error("--churn, --fault, --late and --intruders start local peers: they "
			    "cannot be used across hosts");
	if ((b.clients || b.aux) && (!b.dht || b.multi))
		usage_error("--clients and --aux give local peers of a --rendezvous=dht run their "
			    "DeDLOC modes");
	if ((b.keep || b.sample) && !b.follow)
		usage_error("--keep and --sample are for followed runs (--rendezvous=dht, --churn, "
			    "--fault)");
	if (b.compute_ms && !b.follow)
		usage_error("--compute-ms paces followed runs (--rendezvous=dht, --churn, --fault)");
	if (b.follow)
		follow_options(&b);
	if (strcmp(b.transport, "dpdk") == 0) {
		char v[32];

		if (b.follow)
			usage_error("--transport=dpdk runs static rounds: no --rendezvous=dht, "
				    "--churn or --fault");
		snprintf(v, sizeof(v), "%g", b.inject_loss);
		setenv("MP_DPDK_INJECT_LOSS", v, 1);
		snprintf(v, sizeof(v), "%" PRIu64, b.seed);
		setenv("MP_DPDK_INJECT_SEED", v, 0);
		if (b.multi && b.dpdk_args)
			setenv("MP_DPDK_EAL", b.dpdk_args, 1);
	} else if (b.dpdk_args || b.inject_loss > 0) {
		usage_error("--dpdk-args and --inject-loss are for --transport=dpdk");
	}
	make_sizes(&b);
	if (b.follow && b.check && b.maxbytes > (1u << 20))
		usage_error("--check with --rendezvous=dht, --churn or --fault sends every "
			    "peer's final values to the launcher: at most 1M (or --check=0)");
	if (b.cuda) {
		if (b.follow)
			usage_error("--memory=cuda runs static averages: no --rendezvous=dht, --churn, "
				    "--fault, --late or --intruders");
		if (codec_sparse(b.cfg.codec))
			usage_error("--memory=cuda with --codec=%s: its check needs mp_average_flush, "
				    "which averages host memory only", codec_name(b.cfg.codec));
		/* Before any peer starts, so that a machine without a GPU gets one
		 * line saying what is missing rather than one failure per peer. */
		if (dev_probe(b.cuda_what, sizeof(b.cuda_what))) {
			fprintf(stderr, PROG ": --memory=cuda: %s\n", b.cuda_what);
			free(b.sizes);
			free(b.faults);
			return EXIT_FAIL;
		}
	}
	if (!b.multi) {
		b.npeers = peers_opt ? peers_opt : b.cfg.npeers > 0 ? b.cfg.npeers : 8;
		if (b.keep >= b.npeers && b.churn > 0)
			usage_error("--keep=%d spares every one of the %d peers from --churn", b.keep,
				    b.npeers);
		if (b.clients + b.aux >= b.npeers)
			usage_error("--clients=%d and --aux=%d leave no normal peer of %d",
				    b.clients, b.aux, b.npeers);
		run_env = getenv("MP_RUN");
		if (b.run == NULL && run_env && *run_env)
			b.run = run_env;
		if (b.run == NULL) {
			snprintf(b.run_buf, sizeof(b.run_buf), PROG "-%ld", (long)getpid());
			b.run = b.run_buf;
		}
		if (b.follow) {
			for (int k = 0; k < b.nfaults; k++)
				if (b.faults[k].index >= b.npeers + b.late)
					usage_error("--fault=%d:...: peers are numbered 0 to %d",
						    b.faults[k].index, b.npeers + b.late - 1);
			follow_grid(&b);
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
		free(b.sizes);
		free(b.faults);
		return rc;
	}

	if (b.dht) {
		if (rank_opt < 0 && b.cfg.rank < 0 && !launched)
			usage_error("--rendezvous=dht across hosts needs --rank=R and --peers=N: "
				    "this process is peer R of N");
	} else if (!b.cfg.hostfile && !b.cfg.peers) {
		if (launched)
			usage_error("started by %s as rank %d of %d: multi-host mode needs "
				    "--hostfile=FILE (or MP_HOSTFILE / MP_PEERS)", lname, lrank,
				    lsize);
		usage_error("a rank was given: multi-host mode needs --hostfile=FILE "
			    "(or MP_HOSTFILE / MP_PEERS)");
	}
	if (b.loop)
		usage_error("--transport=loop runs every peer in one process; it cannot be "
			    "used across hosts");
	if (!b.run)
		b.run = b.cfg.run_name;
	if (rank_opt >= 0)
		b.cfg.rank = rank_opt;
	else if (b.cfg.rank < 0 && launched)
		b.cfg.rank = lrank;
	if (peers_opt)
		b.cfg.npeers = peers_opt;
	else if (b.cfg.npeers <= 0 && launched && (rank_opt < 0 || lrank == rank_opt))
		b.cfg.npeers = lsize;
	if (b.dht && b.cfg.npeers <= 0)
		usage_error("--rendezvous=dht across hosts needs --peers=N");
	if (b.dht)
		snprintf(how, sizeof(how), "dht, %s%s", b.cfg.bootstrap ? "bootstrap " : "first node",
			 b.cfg.bootstrap ? b.cfg.bootstrap : "");
	else
		snprintf(how, sizeof(how), "%s %s%s%s", b.cfg.hostfile ? "hostfile" : "peer list",
			 b.cfg.hostfile ? b.cfg.hostfile : "MP_PEERS", lname ? ", started by " : "",
			 lname ? lname : "");
	rc = run_multi(&b, how);
	free(b.sizes);
	return rc;
}
