/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * A peer killed mid-run spoils only its groups (doc/design.md, "Failure
 * memory"): 8 processes of a static run on a 2x2x2 grid over TCP on
 * loopback, through the public API only. Rank 7 SIGKILLs itself in the
 * middle of average 1 (MP_FAULT kill:round=4:phase=gather, in its round
 * with rank 5). Every survivor then goes on averaging:
 *  - none of its averages fails, and it completes all AVGS of them within
 *    the bound;
 *  - from average 2 on, each takes far less than the 2 s timeouts (nobody
 *    waits for anyone) and holds exactly what the grid's groups make of
 *    the 7 survivors' inputs: rank 7's cell is empty, its partners (6, 5
 *    and 3) are alone in one round each, every other group is as before.
 * Average 0 is the exact weighted mean of all 8. Average 1, the one that
 * meets the death, must only succeed.
 *
 * Before the fix, a peer that met the death regrouped the survivors on a
 * grid of their own while the others kept the full grid: they waited on
 * each other in groups the others were not in, timed out, marked live
 * peers down, and 5 of 7 failed with "no round could reach any group
 * member" (doc/wan.md, "Faults: --kill").
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

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

#define NP 8
#define DEAD 7
#define AVGS 30
#define COUNT 30011 /* several chunks, parts of unequal length */
#define TIMEOUT_MS 2000
/* Far below the timeouts: an average that waited for anyone took longer. */
#define QUICK_S 1.0
/* Every survivor's AVGS averages, with the start, well within this. */
#define BOUND_S 20.0

enum { HELD_ERROR = 0, HELD_ALL = 1, HELD_HOLES = 2, HELD_OTHER = 3 };

struct rec {
	int held;
	int rc, failed;
	double secs;
};

static float input(int rank, size_t i)
{
	return (float)((int)((rank * 31 + (int)i * 17) % 4001) - 2000) / 32.0f;
}

static float weight(int rank)
{
	return (float)(rank % 3 + 1);
}

static double now_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/*
 * What @rank holds after the 3 rounds of one average on 2x2x2 with the
 * ranks in @live (a mask): in round t the pair r, r ^ 2^t takes its
 * weighted mean and leaves with its mean weight (design.md, "The weight
 * rule"); a rank whose partner is not live keeps its values and weight.
 */
static void expected(unsigned live, int rank, double *out)
{
	double *x = malloc((size_t)NP * COUNT * sizeof(double)), w[NP];

	for (int r = 0; r < NP; r++) {
		w[r] = weight(r);
		for (size_t i = 0; i < COUNT; i++)
			x[(size_t)r * COUNT + i] = input(r, i);
	}
	for (int t = 0; t < 3; t++)
		for (int r = 0; r < NP; r++) {
			int p = r ^ (1 << t);
			if (p < r || !(live >> r & 1) || !(live >> p & 1))
				continue;
			double *a = x + (size_t)r * COUNT, *b = x + (size_t)p * COUNT;
			for (size_t i = 0; i < COUNT; i++)
				a[i] = b[i] = (w[r] * a[i] + w[p] * b[i]) / (w[r] + w[p]);
			w[r] = w[p] = (w[r] + w[p]) / 2;
		}
	memcpy(out, x + (size_t)rank * COUNT, COUNT * sizeof(double));
	free(x);
}

static int holds(const float *x, const double *want)
{
	for (size_t i = 0; i < COUNT; i++)
		if (fabs(x[i] - want[i]) > 1e-4 * (1.0 + fabs(want[i])))
			return 0;
	return 1;
}

/* A peer: AVGS averages, a record each, then waits for the parent's stop
 * (leaving earlier would break its groupmates' last rounds). */
static int child(const char *run, int rank, int to_parent, int from_parent)
{
	struct mp_config cfg;
	mp_ctx *ctx;
	char addrs[NP][MP_ADDR_STRLEN], stop;
	const char *ap[NP];
	double *all = malloc(COUNT * sizeof(double)), *holes = malloc(COUNT * sizeof(double));
	float *buf = malloc(COUNT * sizeof(float));
	int rc;

	if (!all || !holes || !buf)
		return 2;
	expected(0xffu, rank, all);
	expected(0xffu & ~(1u << DEAD), rank, holes);
	mp_config_init(&cfg);
	if (rank == DEAD)
		cfg.fault = "kill:round=4:phase=gather";
	cfg.transport = "tcp";
	cfg.run_name = run;
	cfg.rank = rank;
	cfg.npeers = NP;
	cfg.grid = "2x2x2";
	cfg.listen = "127.0.0.1:0";
	cfg.chunk_bytes = 16384;
	cfg.connect_timeout_ms = TIMEOUT_MS;
	cfg.round_timeout_ms = TIMEOUT_MS;
	rc = mp_init(&cfg, &ctx);
	if (rc) {
		fprintf(stderr, "rank %d: mp_init: %s: %s\n", rank, mp_strerror(rc), mp_last_error(NULL));
		return 2;
	}
	mp_local_address(ctx, addrs[rank], MP_ADDR_STRLEN);
	if (write_all(to_parent, addrs[rank], MP_ADDR_STRLEN) ||
	    read_all(from_parent, addrs, sizeof(addrs), 20000))
		return 2;
	for (int i = 0; i < NP; i++)
		ap[i] = addrs[i];
	if (mp_set_peers(ctx, ap, NP))
		return 2;
	for (int n = 0; n < AVGS; n++) {
		struct mp_result res;
		struct rec r = {0};

		for (size_t i = 0; i < COUNT; i++)
			buf[i] = input(rank, i);
		double t0 = now_s();
		r.rc = mp_average(ctx, buf, COUNT, weight(rank), &res);
		r.secs = now_s() - t0;
		r.failed = res.failed_peers;
		if (r.rc) {
			fprintf(stderr, "rank %d average %d: %s: %s\n", rank, n, mp_strerror(r.rc),
				mp_last_error(ctx));
			r.held = HELD_ERROR;
		} else {
			r.held = holds(buf, all) ? HELD_ALL : holds(buf, holes) ? HELD_HOLES : HELD_OTHER;
		}
		if (write_all(to_parent, &r, sizeof(r)))
			break;
	}
	read_all(from_parent, &stop, 1, 60000);
	mp_finalize(ctx);
	free(buf);
	free(all);
	free(holes);
	return 0;
}

static void survivors_go_on(void **s)
{
	(void)s;
	pid_t pid[NP];
	int up[NP], down[NP], n[NP] = {0}, bad = 0, slow = 0, st;
	struct rec recs[NP][AVGS];
	char addrs[NP][MP_ADDR_STRLEN], run[64];
	double t0 = now_s(), end = t0 + BOUND_S;

	snprintf(run, sizeof(run), "gridkill-%d", (int)getpid());
	for (int r = 0; r < NP; r++) {
		pid[r] = fork_piped(&up[r], &down[r]);
		assert_true(pid[r] >= 0);
		if (pid[r] == 0)
			_exit(child(run, r, up[r], down[r]));
	}
	for (int r = 0; r < NP; r++)
		assert_int_equal(read_all(up[r], addrs[r], MP_ADDR_STRLEN, 20000), 0);
	for (int r = 0; r < NP; r++)
		assert_int_equal(write_all(down[r], addrs, sizeof(addrs)), 0);

	/* Every survivor's records, until each has AVGS or the bound passes. */
	for (;;) {
		struct pollfd pf[NP];
		int done = 1;

		for (int r = 0; r < NP; r++) {
			pf[r] = (struct pollfd){r != DEAD && n[r] < AVGS ? up[r] : -1, POLLIN, 0};
			done &= r == DEAD || n[r] == AVGS;
		}
		if (done || now_s() > end)
			break;
		if (poll(pf, NP, 200) <= 0)
			continue;
		for (int r = 0; r < NP; r++)
			if ((pf[r].revents & (POLLIN | POLLHUP)) &&
			    read_all(up[r], &recs[r][n[r]], sizeof(struct rec), 1000) == 0)
				n[r]++;
	}
	double took = now_s() - t0;

	for (int r = 0; r < NP; r++) {
		char b = 1;
		if (r != DEAD)
			write_all(down[r], &b, 1);
	}
	double wait_end = now_s() + 10;
	for (int r = 0; r < NP; r++) {
		while (waitpid(pid[r], &st, WNOHANG) == 0 && now_s() < wait_end)
			usleep(20000);
		if (now_s() >= wait_end) {
			kill(pid[r], SIGKILL);
			waitpid(pid[r], &st, 0);
		}
		if (r == DEAD && !(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL)) {
			fprintf(stderr, "rank %d was not killed by its fault (status %#x)\n", r, st);
			bad++;
		} else if (r != DEAD && !(WIFEXITED(st) && WEXITSTATUS(st) == 0)) {
			fprintf(stderr, "rank %d exited with status %#x\n", r, st);
			bad++;
		}
		close(up[r]);
		close(down[r]);
	}

	for (int r = 0; r < NP; r++) {
		if (r == DEAD)
			continue;
		if (n[r] < AVGS) {
			fprintf(stderr, "rank %d: %d of %d averages within %.0f s\n", r, n[r], AVGS,
				BOUND_S);
			bad++;
		}
		for (int i = 0; i < n[r]; i++) {
			const struct rec *x = &recs[r][i];
			int want = i == 0 ? HELD_ALL : i >= 2 ? HELD_HOLES : -1;

			if (x->rc || (want >= 0 && x->held != want)) {
				fprintf(stderr, "rank %d average %d: rc %d, held %d (want %d), %d failed, "
					"%.3f s\n", r, i, x->rc, x->held, want, x->failed, x->secs);
				bad++;
			}
			if (i >= 2 && x->secs > QUICK_S) {
				fprintf(stderr, "rank %d average %d took %.3f s\n", r, i, x->secs);
				slow++;
			}
		}
	}
	fprintf(stderr, "7 survivors, %d averages each, in %.2f s\n", AVGS, took);
	assert_int_equal(bad, 0);
	assert_int_equal(slow, 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(survivors_go_on),
	};
	signal(SIGPIPE, SIG_IGN);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
