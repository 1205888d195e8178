/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Views that differ in a static run (doc/design.md, "Agreeing on the
 * plan"), three peers in threads over tcp on loopback, through the public
 * API. A plan mismatch is no death: the two sides of a pair that plan an
 * exchange otherwise each drop the other from it, and neither marks the
 * other down. Before the plan rode in the OPEN, the side that read the
 * other's first SCATTER closed the connection, and the other, in the middle
 * of a frame, took the reset for a death: a live peer marked down, views
 * further apart (the training study at 1 Gbit/s under kills).
 *
 * plan_mismatch_is_no_death: rank 0 stalls its sends to rank 2 in the
 * first average (MP_FAULT), so ranks 0 and 2 time out on each other and
 * mark each other down, and rank 1 has both up. In the second average rank
 * 1 plans a group of 3, ranks 0 and 2 groups of 2 with rank 1: two pairs
 * that plan otherwise, and rank 1 sends rank 0 its OPEN but no SCATTER
 * (MP_FAULT again: a slow link's first frame still on its way). After it
 * nobody has rank 1 down, and rank 1 has nobody down; each pair's drop is
 * counted in failed_peers. With the plan in SCATTERs only, rank 0 saw rank
 * 1 close on it and marked it down (checked by taking the OPEN's plan out).
 *
 * reducer_drop_is_counted: the first average of that test alone. Rank 1
 * drops nobody, but rank 2 reduced its part without rank 0: rank 1's
 * result mixes parts over different peers and must count that in
 * failed_peers (checked by taking the count out).
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <moshpit/moshpit.h>

#define NP 3
#define COUNT (1u << 20) /* 4 MiB: several chunks */

struct shared {
	const char *fault[NP];
	int naverages;
	pthread_barrier_t bar;
	char addr[NP][MP_ADDR_STRLEN];
	int rc[NP][2];
	struct mp_result res[NP][2];
	float first[NP], last[NP]; /* the first and the last value after the last average */
	int state[NP][NP]; /* after the last average: rank r's view of rank q */
};

struct arg {
	struct shared *sh;
	int rank;
};

static void *peer_main(void *p)
{
	struct arg *a = p;
	struct shared *sh = a->sh;
	struct mp_config cfg;
	mp_ctx *ctx = NULL;
	char run[64];
	int rc;

	snprintf(run, sizeof(run), "view-split-%d", (int)getpid());
	mp_config_init(&cfg);
	cfg.transport = "tcp";
	cfg.run_name = run;
	cfg.rank = a->rank;
	cfg.npeers = NP;
	cfg.listen = "127.0.0.1:0";
	cfg.grid = "3";
	cfg.chunk_bytes = 1u << 20;
	cfg.connect_timeout_ms = 2000;
	cfg.round_timeout_ms = 1000;
	/* No take-back by probe within the test. */
	cfg.probe_min_ms = cfg.probe_max_ms = 60000;
	cfg.fault = sh->fault[a->rank];
	rc = mp_init(&cfg, &ctx);
	assert_int_equal(rc, 0);
	mp_local_address(ctx, sh->addr[a->rank], MP_ADDR_STRLEN);
	pthread_barrier_wait(&sh->bar);
	const char *addrs[NP];
	for (int i = 0; i < NP; i++)
		addrs[i] = sh->addr[i];
	assert_int_equal(mp_set_peers(ctx, addrs, NP), 0);
	float *buf = malloc(COUNT * sizeof(float));
	assert_non_null(buf);
	for (int avg = 0; avg < sh->naverages; avg++) {
		for (size_t i = 0; i < COUNT; i++)
			buf[i] = (float)(a->rank + 1);
		sh->rc[a->rank][avg] = mp_average(ctx, buf, COUNT, 1.0f, &sh->res[a->rank][avg]);
		/* Each average starts together, with the views the last left. */
		pthread_barrier_wait(&sh->bar);
	}
	sh->first[a->rank] = buf[0];
	sh->last[a->rank] = buf[COUNT - 1];
	struct mp_peer_info info[NP];
	int n = mp_peers_info(ctx, info, NP, sizeof(info[0]));
	assert_int_equal(n, NP);
	for (int q = 0; q < NP; q++)
		sh->state[a->rank][q] = info[q].state;
	pthread_barrier_wait(&sh->bar);
	mp_finalize(ctx);
	free(buf);
	return NULL;
}

static void run_peers(struct shared *shp)
{
	struct shared sh = *shp;
	pthread_t th[NP];
	struct arg args[NP];

	pthread_barrier_init(&sh.bar, NULL, NP);
	for (int r = 0; r < NP; r++) {
		args[r] = (struct arg){&sh, r};
		assert_int_equal(pthread_create(&th[r], NULL, peer_main, &args[r]), 0);
	}
	for (int r = 0; r < NP; r++)
		pthread_join(th[r], NULL);
	pthread_barrier_destroy(&sh.bar);
	for (int r = 0; r < NP; r++) {
		fprintf(stderr, "rank %d: averages rc %d, %d (failed peers %d, %d; peers %d, %d); "
			"values %g .. %g; sees", r, sh.rc[r][0], sh.rc[r][1],
			sh.res[r][0].failed_peers, sh.res[r][1].failed_peers, sh.res[r][0].peers,
			sh.res[r][1].peers, sh.first[r], sh.last[r]);
		for (int q = 0; q < NP; q++)
			fprintf(stderr, " %d:%s", q,
				sh.state[r][q] == MP_PEER_DOWN ? "down" :
				sh.state[r][q] == MP_PEER_SELF ? "self" : "live");
		fprintf(stderr, "\n");
	}
	*shp = sh;
}

static void plan_mismatch_is_no_death(void **s)
{
	struct shared sh = {.naverages = 2};
	(void)s;

	sh.fault[0] = "stall:round=0:phase=scatter:peer=2";
	/* In the second average rank 1's OPEN to rank 0 goes out, its
	 * SCATTERs do not: rank 0 learns of the mismatch from the OPEN or not
	 * at all (as on a slow link, where rank 1's first frame to it is
	 * still on its way when rank 1 reads rank 0's). */
	sh.fault[1] = "stall:round=1:phase=scatter:peer=0";
	run_peers(&sh);
	/* The first average: ranks 0 and 2 met a stalled exchange. */
	assert_true(sh.res[2][0].failed_peers >= 1);
	/* The second: the pairs (0, 1) and (1, 2) planned otherwise, and
	 * each side dropped the other, as a mismatch, not a death. */
	assert_int_equal(sh.res[1][1].failed_peers, 2);
	assert_true(sh.res[0][1].failed_peers >= 1 && sh.res[2][1].failed_peers >= 1);
	assert_int_equal(sh.state[1][0], MP_PEER_LIVE);
	assert_int_equal(sh.state[1][2], MP_PEER_LIVE);
	assert_int_equal(sh.state[0][1], MP_PEER_LIVE);
	assert_int_equal(sh.state[2][1], MP_PEER_LIVE);
	/* What made the views differ stays: rank 2 has rank 0 down. */
	assert_int_equal(sh.state[2][0], MP_PEER_DOWN);
}

/*
 * One pair's connection fails, both peers alive: rank 0's sends to rank 2
 * stall, so rank 2 reduces its part without rank 0, while rank 0 reduces
 * its own with rank 2's values and rank 1 drops nobody. Rank 1 then holds
 * parts 0 and 1 over all three peers and part 2 over ranks 1 and 2: no
 * one set's mean, and it must say so. Before GATHERs told the dropped
 * contributions apart, it returned failed_peers 0 and peers 3.
 */
static void reducer_drop_is_counted(void **s)
{
	struct shared sh = {.naverages = 1};
	(void)s;

	sh.fault[0] = "stall:round=0:phase=scatter:peer=2";
	run_peers(&sh);
	assert_int_equal(sh.rc[1][0], 0);
	/* The mix is real: part 0 is the mean of 1, 2 and 3; part 2 of 2
	 * and 3. */
	assert_true(sh.first[1] == 2.0f);
	assert_true(sh.last[1] == 2.5f);
	assert_int_equal(sh.res[1][0].failed_peers, 1);
	assert_int_equal(sh.res[1][0].peers, 2);
	/* Rank 2 dropped rank 0 itself: its own part and every part it
	 * applied leave rank 0 out. */
	assert_true(sh.res[2][0].failed_peers >= 1);
	assert_true(sh.last[2] == 2.5f);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(plan_mismatch_is_no_death),
		cmocka_unit_test(reducer_drop_is_counted),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
