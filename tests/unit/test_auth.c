/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Authenticated peers end to end: four peers, each a thread of this process
 * on the loop transport. With one run key (MP_RUN_KEY) they average to the
 * exact mean, and both ends of every connection hold the same non-zero
 * session token. When one peer holds another key, nobody adopts a connection
 * to it, the failed handshakes are counted, its average fails, and the others
 * average without it: their values owe nothing to it.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "conn.h"
#include "core.h"
#include "xfer.h"

#define NP 4
#define COUNT 4096
#define STREAMS 2

struct shared {
	const char *name;
	int algo;
	const char *grid;
	int bad;   /* rank that holds another key, or -1 */
	int env;   /* keys from MP_RUN_KEY (set by the test) instead of the config */
	pthread_barrier_t bar;
	char addr[NP][MP_ADDR_STRLEN];
	float *buf[NP];
	int rc[NP];
	double seconds[NP];
	struct mp_result res[NP];
	uint64_t rejected[NP][MP_REJ_MAX];
	int ready[NP][NP][STREAMS + 1];
	uint32_t token[NP][NP][STREAMS + 1];
};

struct arg {
	struct shared *sh;
	int rank;
};

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Integers: every partial mean of four of them is exact in fp32. */
static float input(const struct shared *sh, int rank, size_t i)
{
	if (sh->bad >= 0 && rank != sh->bad)
		return (float)((long)(i % 97) - 48); /* the good peers agree, whatever they average */
	return (float)((long)((rank * 7919 + (long)i * 104729) % 2001) - 1000);
}

static void *peer_main(void *p)
{
	struct arg *a = p;
	struct shared *sh = a->sh;
	const char *addrs[NP];
	struct mp_config cfg;
	mp_ctx *ctx = NULL;
	char run[64];
	int r = a->rank, rc;

	snprintf(run, sizeof(run), "auth-%s", sh->name);
	mp_config_init(&cfg);
	cfg.transport = "loop";
	cfg.run_name = run;
	cfg.rank = r;
	cfg.npeers = NP;
	cfg.algo = sh->algo;
	cfg.grid = sh->grid;
	cfg.streams = STREAMS;
	cfg.chunk_bytes = 1024; /* several chunks per part, on both streams */
	cfg.connect_timeout_ms = 1000;
	cfg.round_timeout_ms = 2000;
	if (!sh->env)
		cfg.run_key = r == sh->bad ? "a guess at the key" : "the run's key";
	rc = mp_init(&cfg, &ctx);
	if (!rc)
		mp_local_address(ctx, sh->addr[r], MP_ADDR_STRLEN);
	pthread_barrier_wait(&sh->bar);
	if (rc) {
		sh->rc[r] = rc;
		pthread_barrier_wait(&sh->bar);
		return NULL;
	}
	for (int i = 0; i < NP; i++)
		addrs[i] = sh->addr[i];
	rc = mp_set_peers(ctx, addrs, NP);
	for (size_t i = 0; i < COUNT; i++)
		sh->buf[r][i] = input(sh, r, i);
	double t0 = now_s();
	if (!rc)
		rc = mp_average(ctx, sh->buf[r], COUNT, 1.0f, &sh->res[r]);
	sh->seconds[r] = now_s() - t0;
	sh->rc[r] = rc;
	/* The operation is over, so the progress thread leaves the table alone. */
	memcpy(sh->rejected[r], ctx->rejected, sizeof(sh->rejected[r]));
	for (int q = 0; q < NP; q++)
		for (int c = 0; c < ctx->nconn && c < STREAMS + 1; c++) {
			sh->ready[r][q][c] = mp_conn_ready(ctx, q, c) != NULL;
			sh->token[r][q][c] = mp_conn_token(ctx, q, c);
		}
	/* Nobody leaves before everyone is done: a departure would look like
	 * a failure to the others. */
	pthread_barrier_wait(&sh->bar);
	mp_finalize(ctx);
	return NULL;
}

static void run(struct shared *sh)
{
	pthread_t th[NP];
	struct arg args[NP];

	pthread_barrier_init(&sh->bar, NULL, NP);
	for (int r = 0; r < NP; r++) {
		sh->buf[r] = malloc(COUNT * sizeof(float));
		assert_non_null(sh->buf[r]);
		args[r] = (struct arg){sh, r};
		assert_int_equal(pthread_create(&th[r], NULL, peer_main, &args[r]), 0);
	}
	for (int r = 0; r < NP; r++)
		pthread_join(th[r], NULL);
	pthread_barrier_destroy(&sh->bar);
}

static void release(struct shared *sh)
{
	for (int r = 0; r < NP; r++)
		free(sh->buf[r]);
}

/* The same MP_RUN_KEY everywhere: the exact mean, and matching tokens. */
static void same_key_exact_mean(void **s)
{
	struct shared sh = {.name = "same", .algo = MP_ALGO_MOSHPIT, .grid = "2x2", .bad = -1,
			    .env = 1};
	int pairs = 0;

	(void)s;
	assert_int_equal(setenv("MP_RUN_KEY", "one key for the whole run", 1), 0);
	run(&sh);
	unsetenv("MP_RUN_KEY");
	for (int r = 0; r < NP; r++) {
		if (sh.rc[r])
			fail_msg("peer %d failed: %s", r, mp_strerror(sh.rc[r]));
		assert_int_equal(sh.res[r].failed_peers, 0);
		assert_int_equal(sh.res[r].frames_rejected, 0);
		assert_int_equal(sh.res[r].peers, NP);
		assert_int_equal(sh.rejected[r][MP_REJ_AUTH], 0);
		assert_int_equal(sh.rejected[r][MP_REJ_TOKEN], 0);
		for (size_t i = 0; i < COUNT; i++) {
			double mean = 0;
			for (int q = 0; q < NP; q++)
				mean += input(&sh, q, i);
			if (sh.buf[r][i] != (float)(mean / NP))
				fail_msg("peer %d, element %zu: %g, mean %g", r, i, sh.buf[r][i], mean / NP);
		}
	}
	/* Each data connection: ready at both ends, one token, its own. */
	for (int r = 0; r < NP; r++)
		for (int q = r + 1; q < NP; q++) {
			if (!sh.ready[r][q][0])
				continue;
			pairs++;
			for (int c = 0; c < STREAMS; c++) {
				assert_true(sh.ready[r][q][c] && sh.ready[q][r][c]);
				assert_int_not_equal(sh.token[r][q][c], 0);
				assert_int_equal(sh.token[r][q][c], sh.token[q][r][c]);
			}
			assert_int_not_equal(sh.token[r][q][0], sh.token[r][q][1]);
		}
	/* A 2x2 grid: every peer meets two others. */
	assert_int_equal(pairs, 4);
	release(&sh);
}

/* Peer 2 holds another key: refused everywhere, and the others' values owe
 * nothing to it (they all start from the same values, peer 2 from others). */
static void other_key_refused(void **s)
{
	struct shared sh = {.name = "other", .algo = MP_ALGO_BUTTERFLY, .bad = 2};
	const int bad = 2;

	(void)s;
	unsetenv("MP_RUN_KEY");
	run(&sh);
	/* Its average fails: nobody it can reach. */
	assert_int_not_equal(sh.rc[bad], 0);
	assert_true(sh.seconds[bad] < 10.0);
	for (size_t i = 0; i < COUNT; i++)
		assert_true(sh.buf[bad][i] == input(&sh, bad, i));
	/* It dialled peer 3 and refused its CHALLENGE; peers 0 and 1 dialled
	 * it and refused its CHALLENGE. Peer 3 saw a dialer hang up, and may
	 * since have probed it (failure memory) and refused its answer too. */
	assert_true(sh.rejected[bad][MP_REJ_AUTH] >= 1);
	assert_true(sh.rejected[0][MP_REJ_AUTH] >= 1);
	assert_true(sh.rejected[1][MP_REJ_AUTH] >= 1);
	for (int r = 0; r < NP; r++)
		for (int c = 0; c < STREAMS + 1; c++) {
			assert_false(sh.ready[r][bad][c]);
			assert_false(sh.ready[bad][r][c]);
		}
	for (int r = 0; r < NP; r++) {
		if (r == bad)
			continue;
		if (sh.rc[r])
			fail_msg("peer %d failed: %s", r, mp_strerror(sh.rc[r]));
		assert_int_equal(sh.res[r].failed_peers, 1);
		assert_int_equal(sh.rejected[r][MP_REJ_TOKEN], 0);
		for (size_t i = 0; i < COUNT; i++)
			if (sh.buf[r][i] != input(&sh, r, i))
				fail_msg("peer %d, element %zu: %g, expected %g", r, i, sh.buf[r][i],
					 input(&sh, r, i));
		/* The good peers did average with each other. */
		for (int q = 0; q < NP; q++)
			if (q != r && q != bad)
				assert_true(sh.ready[r][q][0]);
	}
	release(&sh);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(same_key_exact_mean),
		cmocka_unit_test(other_key_refused),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
