/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Real processes averaging over TCP on loopback, through the public API
 * only. The parent forks the peers, passes addresses around over pipes (the
 * out-of-band exchange a launcher or control plane would do), and each child
 * checks its own result against the exact weighted mean it computes itself.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <moshpit/moshpit.h>
#include "proc_io.h"

#define MAXP 16

struct job {
	const char *name;
	int npeers;
	const char *grid;
	int algo;
	int streams;
	size_t count;
	int expect_rounds;
	int dead_rank;    /* -1, or a rank that exits before averaging */
};

static float input(int rank, size_t i)
{
	return (float)((int)((rank * 31 + (int)i * 17) % 4001) - 2000) / 32.0f;
}

/* Child: returns the exit status (0 ok, 1 wrong, 2 error). */
static int child(const struct job *j, int rank, int to_parent, int from_parent)
{
	struct mp_config cfg;
	mp_ctx *ctx;
	char run[64], addrs[MAXP][MP_ADDR_STRLEN];
	const char *ap[MAXP];
	struct mp_result res;
	int rc;

	snprintf(run, sizeof(run), "mp-%s-%d", j->name, (int)getppid());
	mp_config_init(&cfg);
	cfg.transport = "tcp";
	cfg.run_name = run;
	cfg.rank = rank;
	cfg.npeers = j->npeers;
	cfg.grid = j->grid;
	cfg.algo = j->algo;
	cfg.streams = j->streams;
	cfg.listen = "127.0.0.1:0";
	cfg.chunk_bytes = 16384;
	cfg.connect_timeout_ms = 2000;
	cfg.round_timeout_ms = 5000;
	rc = mp_init(&cfg, &ctx);
	if (rc) {
		fprintf(stderr, "rank %d: mp_init: %s: %s\n", rank, mp_strerror(rc), mp_last_error(NULL));
		return 2;
	}
	mp_local_address(ctx, addrs[rank], MP_ADDR_STRLEN);
	if (write_all(to_parent, addrs[rank], MP_ADDR_STRLEN) ||
	    read_all(from_parent, addrs, sizeof(addrs[0]) * (size_t)j->npeers, 20000))
		return 2;
	if (rank == j->dead_rank) {
		/* Gone before the first round: its listener closes with it. */
		mp_finalize(ctx);
		return 0;
	}
	for (int i = 0; i < j->npeers; i++)
		ap[i] = addrs[i];
	if (mp_set_peers(ctx, ap, j->npeers))
		return 2;
	float *buf = malloc(j->count * sizeof(float));
	for (size_t i = 0; i < j->count; i++)
		buf[i] = input(rank, i);
	rc = mp_average(ctx, buf, j->count, (float)(rank % 3 + 1), &res);
	if (j->dead_rank >= 0) {
		/* With a dead peer the average must end, with the peer named as
		 * failed, well within the timeouts (checked by the parent). */
		int mate = __builtin_popcount((unsigned)(rank ^ j->dead_rank)) == 1;
		int ok = mate ? res.failed_peers >= 1 && (rc == 0 || rc == -EHOSTUNREACH)
			      : rc == 0 && res.failed_peers == 0;
		if (!ok)
			fprintf(stderr, "rank %d: rc %d, %d failed peers (groupmate of the dead: %d)\n", rank,
				rc, res.failed_peers, mate);
		/* Everyone waits for the slowest to finish before leaving. */
		char b = 1;
		write_all(to_parent, &b, 1);
		read_all(from_parent, &b, 1, 30000);
		mp_finalize(ctx);
		free(buf);
		return ok ? 0 : 1;
	}
	if (rc) {
		fprintf(stderr, "rank %d: average failed: %s: %s\n", rank, mp_strerror(rc), mp_last_error(ctx));
		return 2;
	}
	double wsum = 0;
	for (int r = 0; r < j->npeers; r++)
		wsum += r % 3 + 1;
	double maxerr = 0;
	for (size_t i = 0; i < j->count; i++) {
		double m = 0;
		for (int r = 0; r < j->npeers; r++)
			m += (r % 3 + 1) * (double)input(r, i);
		double e = fabs(buf[i] - m / wsum);
		if (e > maxerr)
			maxerr = e;
	}
	int bad = maxerr > 1e-4 || res.rounds != j->expect_rounds || res.peers != j->npeers ||
		  res.failed_peers || res.frames_rejected;
	if (bad)
		fprintf(stderr, "rank %d: max error %g, rounds %d, peers %d, failed %d, rejected %llu\n", rank,
			maxerr, res.rounds, res.peers, res.failed_peers,
			(unsigned long long)res.frames_rejected);
	char b = 1;
	write_all(to_parent, &b, 1);
	read_all(from_parent, &b, 1, 30000);
	mp_finalize(ctx);
	free(buf);
	return bad ? 1 : 0;
}

static void launch(const struct job *j, double max_seconds)
{
	pid_t pid[MAXP];
	int up[MAXP], down[MAXP];
	char addrs[MAXP][MP_ADDR_STRLEN];
	struct timespec t0, t1;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (int r = 0; r < j->npeers; r++) {
		pid[r] = fork_piped(&up[r], &down[r]);
		assert_true(pid[r] >= 0);
		if (pid[r] == 0)
			_exit(child(j, r, up[r], down[r]));
	}
	int ok = 1;
	for (int r = 0; r < j->npeers && ok; r++)
		ok = !read_all(up[r], addrs[r], MP_ADDR_STRLEN, 20000);
	for (int r = 0; r < j->npeers && ok; r++)
		ok = !write_all(down[r], addrs, sizeof(addrs[0]) * (size_t)j->npeers);
	/* Done markers, then release everyone together. */
	for (int r = 0; r < j->npeers && ok; r++) {
		char b;
		if (r == j->dead_rank)
			continue;
		ok = !read_all(up[r], &b, 1, 60000);
	}
	for (int r = 0; r < j->npeers; r++) {
		char b = 1;
		if (ok)
			write_all(down[r], &b, 1);
		close(down[r]);
		close(up[r]);
	}
	int failed = 0;
	for (int r = 0; r < j->npeers; r++) {
		int st;
		if (!ok)
			kill(pid[r], SIGKILL);
		waitpid(pid[r], &st, 0);
		if (!WIFEXITED(st) || WEXITSTATUS(st)) {
			fprintf(stderr, "%s: rank %d exited with %d\n", j->name, r,
				WIFEXITED(st) ? WEXITSTATUS(st) : -1);
			failed++;
		}
	}
	clock_gettime(CLOCK_MONOTONIC, &t1);
	double sec = (double)(t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9;
	if (!ok)
		fail_msg("%s: a peer stopped answering the launcher", j->name);
	if (failed)
		fail_msg("%s: %d peer(s) failed", j->name, failed);
	if (sec > max_seconds)
		fail_msg("%s: took %.1f s, more than %.0f s", j->name, sec, max_seconds);
}

static void moshpit_8_on_2x2x2(void **s)
{
	(void)s;
	struct job j = {"m222", 8, "2x2x2", MP_ALGO_MOSHPIT, 0, 100000, 3, -1};
	launch(&j, 60);
}

static void moshpit_16_on_4x4(void **s)
{
	(void)s;
	struct job j = {"m44", 16, "4x4", MP_ALGO_MOSHPIT, 0, 50000, 2, -1};
	launch(&j, 60);
}

static void ring_8(void **s)
{
	(void)s;
	struct job j = {"ring8", 8, NULL, MP_ALGO_RING, 0, 100003, 1, -1};
	launch(&j, 60);
}

static void ring_8_two_streams(void **s)
{
	(void)s;
	struct job j = {"ring8s2", 8, NULL, MP_ALGO_RING, 2, 70001, 1, -1};
	launch(&j, 60);
}

static void butterfly_8(void **s)
{
	(void)s;
	struct job j = {"bf8", 8, NULL, MP_ALGO_BUTTERFLY, 0, 100000, 1, -1};
	launch(&j, 60);
}

static void dead_peer_is_reported_not_hung(void **s)
{
	(void)s;
	/* Rank 5 leaves before the first round: its three groupmates (one per
	 * round) see a refused peer and finish that round without it after the
	 * connect timeout (2 s); everyone else is untouched. */
	struct job j = {"dead", 8, "2x2x2", MP_ALGO_MOSHPIT, 0, 4096, 3, 5};
	launch(&j, 30);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(moshpit_8_on_2x2x2),
		cmocka_unit_test(moshpit_16_on_4x4),
		cmocka_unit_test(ring_8),
		cmocka_unit_test(ring_8_two_streams),
		cmocka_unit_test(butterfly_8),
		cmocka_unit_test(dead_peer_is_reported_not_hung),
	};
	signal(SIGPIPE, SIG_IGN);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
