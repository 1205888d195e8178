/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Averaging end to end with every peer a thread of this process (loop
 * transport): Moshpit on full and partial grids, ring, butterfly, weights,
 * fp16, several streams, the asynchronous API and argument checking.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <time.h>

#include <moshpit/moshpit.h>

#define MAXP 32

struct scenario {
	const char *name;
	int npeers;
	const char *grid;
	int algo;
	int rounds;
	int codec;
	int streams;
	size_t chunk_bytes;
	size_t count;
	int weighted;
	double tol;        /* max |out - mean| allowed */
	int async;
	int expect_rounds; /* 0 = do not check */
	int expect_peers;  /* 0 = do not check */
	const char *bandwidths;
	int naux;          /* the last naux ranks are aux peers (MP_MODE_AUX) */
	int late_ms;       /* rank 1 starts its average this much later */
	int64_t expect_sent; /* bytes every peer sends per average; 0 = do not check;
			      * -k: the pairwise exchange's in groups of k (pairs_sent) */
};

/*
 * Bytes member @me of a group of @k sends in one pairwise exchange
 * (pairs.c), from the protocol: to each partner an OPEN and a PAIR frame
 * (64-byte headers), the PAIR with its set and its down members (8 bytes
 * each), a weight per member of the set and the n values. The group's
 * first p = 2^m members step with i ^ 2^s; each of the other k - p first
 * sends its values to member i - p, which sends it the whole group's sum
 * at the end, and so does member (i - p) ^ 1 (the extra's OPEN to that one
 * goes alone: it sends it nothing else).
 */
static int64_t pairs_sent(int k, int me, size_t n)
{
	const int64_t frame = 64 + 64 + 16 + 4 * (int64_t)n;
	int64_t b = 0;
	int p = 1;

	while (p * 2 <= k)
		p *= 2;
	if (me >= p)
		return frame + 4 + 64;
	for (int s = 1; s < p; s *= 2) {
		int set = 0;
		/* Before the step with distance s: the block of s members. */
		for (int c = 0; c < p; c++)
			if (c / s == me / s)
				set += 1 + (c + p < k);
		b += frame + 4 * set;
	}
	if (me + p < k)
		b += frame + 4 * k;
	if ((me ^ 1) + p < k)
		b += frame + 4 * k;
	return b;
}

/* mp_config::direct_pairs of every peer of the scenarios run now. */
static int direct_pairs;

struct shared {
	const struct scenario *sc;
	pthread_barrier_t bar;
	char addr[MAXP][MP_ADDR_STRLEN];
	float *out[MAXP];
	struct mp_result res[MAXP];
	int rc[MAXP];
};

struct arg {
	struct shared *sh;
	int rank;
};

static float input(int rank, size_t i)
{
	/* Distinct, exactly representable values so the mean is known precisely. */
	return (float)((long)(((long)rank * 7919 + (long)i * 104729) % 2001) - 1000) / 64.0f;
}

static int is_aux(const struct scenario *sc, int rank)
{
	return rank >= sc->npeers - sc->naux;
}

/* An aux peer's values count for nothing: it averages at weight 0. */
static float weight_of(const struct scenario *sc, int rank)
{
	if (is_aux(sc, rank))
		return 0.0f;
	return sc->weighted ? (float)(rank + 1) : 1.0f;
}

static void *peer_main(void *p)
{
	struct arg *a = p;
	struct shared *sh = a->sh;
	const struct scenario *sc = sh->sc;
	struct mp_config cfg;
	mp_ctx *ctx = NULL;
	char run[64];
	int rc;

	snprintf(run, sizeof(run), "loop-%s", sc->name);
	mp_config_init(&cfg);
	cfg.transport = "loop";
	cfg.run_name = run;
	cfg.rank = a->rank;
	cfg.npeers = sc->npeers;
	cfg.grid = sc->grid;
	cfg.algo = sc->algo;
	cfg.rounds = sc->rounds;
	cfg.codec = sc->codec;
	cfg.streams = sc->streams;
	cfg.connect_timeout_ms = 5000;
	cfg.round_timeout_ms = 5000;
	cfg.direct_pairs = direct_pairs;
	cfg.bandwidths = sc->bandwidths;
	if (is_aux(sc, a->rank))
		cfg.mode = MP_MODE_AUX;
	if (sc->chunk_bytes)
		cfg.chunk_bytes = sc->chunk_bytes;
	rc = mp_init(&cfg, &ctx);
	if (!rc)
		mp_local_address(ctx, sh->addr[a->rank], MP_ADDR_STRLEN);
	pthread_barrier_wait(&sh->bar);
	if (rc) {
		sh->rc[a->rank] = rc;
		pthread_barrier_wait(&sh->bar);
		return NULL;
	}
	const char *addrs[MAXP];
	for (int i = 0; i < sc->npeers; i++)
		addrs[i] = sh->addr[i];
	rc = mp_set_peers(ctx, addrs, sc->npeers);
	float *buf = sh->out[a->rank];
	for (size_t i = 0; i < sc->count; i++)
		buf[i] = input(a->rank, i);
	if (!rc && sc->async) {
		mp_request *req;
		int done = 0;
		rc = mp_average_start(ctx, buf, sc->count, weight_of(sc, a->rank), NULL, &req);
		if (!rc) {
			for (int k = 0; k < 20000 && !done && !rc; k++) {
				rc = mp_test(req, &done, &sh->res[a->rank]);
				if (!done)
					rc = rc ? rc : 0;
			}
			if (!done && !rc)
				rc = mp_wait(req, 20000, &sh->res[a->rank]);
		}
	} else if (!rc) {
		if (a->rank == 1 && sc->late_ms)
			usleep((useconds_t)sc->late_ms * 1000);
		rc = mp_average(ctx, buf, sc->count, weight_of(sc, a->rank), &sh->res[a->rank]);
	}
	sh->rc[a->rank] = rc;
	/* Nobody leaves before everyone is done: a peer's departure would look
	 * like a failure to the others. */
	pthread_barrier_wait(&sh->bar);
	mp_finalize(ctx);
	return NULL;
}

static double run_err(const struct scenario *sc)
{
	struct shared sh = {.sc = sc};
	pthread_t th[MAXP];
	struct arg args[MAXP];
	double *mean = calloc(sc->count, sizeof(double));
	double wsum = 0;

	assert_true(sc->npeers <= MAXP);
	pthread_barrier_init(&sh.bar, NULL, (unsigned)sc->npeers);
	for (int r = 0; r < sc->npeers; r++) {
		sh.out[r] = malloc(sc->count * sizeof(float));
		args[r] = (struct arg){&sh, r};
		assert_int_equal(pthread_create(&th[r], NULL, peer_main, &args[r]), 0);
	}
	for (int r = 0; r < sc->npeers; r++)
		pthread_join(th[r], NULL);
	for (int r = 0; r < sc->npeers; r++) {
		double w = weight_of(sc, r);
		wsum += w;
		for (size_t i = 0; i < sc->count; i++)
			mean[i] += w * input(r, i);
	}
	double maxerr = 0;
	for (int r = 0; r < sc->npeers; r++) {
		if (sh.rc[r])
			fail_msg("%s: peer %d failed: %s", sc->name, r, mp_strerror(sh.rc[r]));
		for (size_t i = 0; i < sc->count; i++) {
			double e = fabs(sh.out[r][i] - mean[i] / wsum);
			if (e > maxerr)
				maxerr = e;
		}
		if (sc->expect_rounds)
			assert_int_equal(sh.res[r].rounds, sc->expect_rounds);
		if (sc->expect_peers)
			assert_int_equal(sh.res[r].peers, sc->expect_peers);
		assert_int_equal(sh.res[r].failed_peers, 0);
		assert_int_equal(sh.res[r].frames_rejected, 0);
		int64_t want = sc->expect_sent >= 0 ? sc->expect_sent :
			       sc->expect_rounds * pairs_sent((int)-sc->expect_sent,
							      r % (int)-sc->expect_sent, sc->count);
		if (want && (int64_t)sh.res[r].bytes_sent != want)
			fail_msg("%s: peer %d sent %llu bytes, expected %lld", sc->name, r,
				 (unsigned long long)sh.res[r].bytes_sent, (long long)want);
		if (sc->npeers > 1)
			assert_true(sh.res[r].bytes_sent > 0 && sh.res[r].bytes_received > 0);
		if ((sc->weighted || sc->naux) && sc->expect_peers == sc->npeers)
			assert_float_equal(sh.res[r].weight, wsum / sc->npeers, 1e-4);
	}
	if (sc->bandwidths) {
		/* "1,0,2,1": peer 1 is a client and reduces nothing, so it only
		 * gets results back (n values). mp_balance_parts gives peers 2, 0
		 * and 3 the shares 3/4, 1/8 and 1/8 (xi = 5/4: (1 + 2w)/b equal
		 * for all three), so peer 2 takes three contributions to its 3n/4
		 * plus the other n/4 of results: 2.5n values. */
		double r = (double)sh.res[2].bytes_received / (double)sh.res[1].bytes_received;
		if (r < 2.4 || r > 2.6)
			fail_msg("%s: received bytes of peer 2 / peer 1 = %.3f, expected ~2.5", sc->name, r);
	}
	for (int r = 0; r < sc->npeers; r++)
		free(sh.out[r]);
	free(mean);
	pthread_barrier_destroy(&sh.bar);
	return maxerr;
}

static void run(const struct scenario *sc)
{
	double maxerr = run_err(sc);

	if (maxerr > sc->tol)
		fail_msg("%s: max error %g above %g", sc->name, maxerr, sc->tol);
}

static void moshpit_2x2x2(void **s)
{
	(void)s;
	struct scenario sc = {"m222", 8, "2x2x2", MP_ALGO_MOSHPIT, 0, 0, 0, 0, 10000, 0, 1e-5, 0, 3, 8, NULL, 0, 0, 0};
	run(&sc);
}

static void moshpit_4x4(void **s)
{
	(void)s;
	struct scenario sc = {"m44", 16, "4x4", MP_ALGO_MOSHPIT, 0, 0, 0, 4096, 12345, 0, 1e-5, 0, 2, 16, NULL, 0, 0, 0};
	run(&sc);
}

static void moshpit_one_round_is_not_the_mean(void **s)
{
	/* One round of a 2x2x2 grid averages pairs only: the peers must still
	 * differ from the global mean, or the check above proves nothing. */
	(void)s;
	struct scenario sc = {"m222r1", 8, "2x2x2", MP_ALGO_MOSHPIT, 1, 0, 0, 0, 1000, 0, 1e-5, 0, 1, 2, NULL, 0, 0, 0};
	assert_true(run_err(&sc) > 1.0);
}

/*
 * Rank 1 starts late, while the pairs that do not need it (2-3, 4-5, 6-7)
 * finish their one round: the run looks ahead of it, but nobody left it
 * behind, so it averages round 0 with rank 0, who waits for it. (Failure
 * memory once took "the run is ahead" for "restarted" and jumped it ahead,
 * alone.)
 */
/*
 * Short vectors (MP_DIRECT_MAX, 16 KiB by default): the exact weighted mean
 * for every algorithm, from one value up, odd counts, odd peer counts and a
 * partial grid, up to the limit and one past it. Within the limit each peer
 * of a group of 2 or 3 sends one OPEN and one DIRECT frame (64-byte headers,
 * the whole vector) to each other member; in a group of 4 or more, the
 * pairwise exchange's frames (pairs_sent), powers of two or not. Exactly:
 * the bytes prove the path.
 */
static void short_sizes_exact(int pairs)
{
	static const size_t counts[] = {1, 2, 3, 5, 17, 255, 1000, 4096, 4097};
	static const struct {
		int algo, npeers, rounds, group;
		const char *grid;
	} cases[] = {
		{MP_ALGO_RING, 8, 0, 8, NULL},
		{MP_ALGO_RING, 5, 0, 5, NULL},
		{MP_ALGO_BUTTERFLY, 8, 0, 8, NULL},
		{MP_ALGO_BUTTERFLY, 3, 0, 3, NULL},
		{MP_ALGO_BUTTERFLY, 4, 0, 4, NULL},
		{MP_ALGO_BUTTERFLY, 6, 0, 6, NULL},
		{MP_ALGO_RING, 7, 0, 7, NULL},
		{MP_ALGO_BUTTERFLY, 10, 0, 10, NULL}, /* pairwise with two extras */
		{MP_ALGO_MOSHPIT, 8, 0, 2, "2x2x2"},
		{MP_ALGO_MOSHPIT, 9, 0, 3, "3x3"},
		/* 6 of 8 cells: exact only after many rounds (mean-preserving) */
		{MP_ALGO_MOSHPIT, 6, 60, 0, "2x2x2"},
	};

	for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
		for (size_t i = 0; i < sizeof(counts) / sizeof(counts[0]); i++) {
			size_t n = counts[i];
			int direct = n * sizeof(float) <= MP_DIRECT_MAX_DEFAULT;
			int rounds = cases[c].rounds ? cases[c].rounds :
				     cases[c].algo == MP_ALGO_MOSHPIT ? (cases[c].npeers == 8 ? 3 : 2) : 1;
			struct scenario sc = {"direct", cases[c].npeers, cases[c].grid, cases[c].algo,
					      cases[c].rounds, 0, 0, 0, n, 1, cases[c].rounds ? 1e-4 : 1e-5,
					      0, rounds, cases[c].rounds ? 0 : cases[c].npeers, NULL, 0, 0,
					      0};
			int g = cases[c].group;

			/* pairs.c: 4 to 64 members, a power of two or 8 and more */
			if (direct && pairs && g >= 4 && (!(g & (g - 1)) || g >= 8))
				sc.expect_sent = -cases[c].group;
			else if (direct && cases[c].group)
				sc.expect_sent = (int64_t)rounds * (cases[c].group - 1) *
						 (int64_t)(64 + 64 + n * sizeof(float));
			run(&sc);
		}
	}
}

static void direct_sizes_exact(void **s)
{
	(void)s;
	short_sizes_exact(0);
}

/* The same with direct_pairs (MP_DIRECT_PAIRS=1) on every peer: the groups
 * of 4, 8 and 10 take the pairwise exchange, the others stay direct. */
static void pairs_sizes_exact(void **s)
{
	(void)s;
	direct_pairs = 1;
	short_sizes_exact(1);
	direct_pairs = 0;
}

static void moshpit_late_starter_in_step(void **s)
{
	(void)s;
	struct scenario sc = {"m222late", 8, "2x2x2", MP_ALGO_MOSHPIT, 1, 0, 0, 0, 1000, 0, 1e-5, 0, 1, 2,
			      NULL, 0, 600, 0};
	/* One round averages pairs: far from the global mean, and run_err
	 * has checked every peer's rounds, peers and failures. */
	assert_true(run_err(&sc) > 1.0);
}

static void moshpit_weighted(void **s)
{
	(void)s;
	struct scenario sc = {"m222w", 8, "2x2x2", MP_ALGO_MOSHPIT, 0, 0, 0, 0, 5000, 1, 1e-5, 0, 3, 8, NULL, 0, 0, 0};
	run(&sc);
}

static void moshpit_partial_grid_converges(void **s)
{
	(void)s;
	/* 6 peers on 8 cells: never exact in d rounds, but mean-preserving, so
	 * enough rounds reach the exact mean to float precision. */
	struct scenario sc = {"m6", 6, "2x2x2", MP_ALGO_MOSHPIT, 60, 0, 0, 0, 777, 0, 1e-4, 0, 60, 0, NULL, 0, 0, 0};
	run(&sc);
}

static void moshpit_streams_small_chunks(void **s)
{
	(void)s;
	struct scenario sc = {"m222s3", 8, "2x2x2", MP_ALGO_MOSHPIT, 0, 0, 3, 64, 1001, 0, 1e-5, 0, 3, 8, NULL, 0, 0, 0};
	run(&sc);
}

/*
 * Aux peers (DeDLOC) on static grids: weight 0 at first, then members like
 * any other, so the grid has no holes and d rounds give the exact mean of
 * the others, aux peers included. The two aux of 4x4 share a line (ranks
 * 14 and 15), the worst case: before, that line's cells were holes in the
 * next round, and the result was off by whole units.
 */
static void moshpit_4x4_aux(void **s)
{
	(void)s;
	struct scenario sc = {"m44aux", 16, "4x4", MP_ALGO_MOSHPIT, 0, 0, 0, 0, 5003, 1, 1e-5, 0, 2,
			      16, NULL, 2, 0, 0};
	run(&sc);
}

static void moshpit_3x3x3_aux(void **s)
{
	(void)s;
	struct scenario sc = {"m333aux", 27, "3x3x3", MP_ALGO_MOSHPIT, 0, 0, 0, 0, 2001, 0, 1e-5, 0,
			      3, 27, NULL, 3, 0, 0};
	run(&sc);
}

/* A partial grid with an aux peer: mean-preserving, so it converges to the
 * others' exact mean as a partial grid of normal peers does. */
static void moshpit_partial_grid_aux(void **s)
{
	(void)s;
	struct scenario sc = {"m6aux", 6, "2x2x2", MP_ALGO_MOSHPIT, 60, 0, 0, 0, 777, 0, 1e-4, 0, 60,
			      0, NULL, 1, 0, 0};
	run(&sc);
}

static void ring_8(void **s)
{
	(void)s;
	struct scenario sc = {"ring8", 8, NULL, MP_ALGO_RING, 0, 0, 0, 1024, 10007, 1, 1e-5, 0, 1, 8, NULL, 0, 0, 0};
	run(&sc);
}

static void ring_3_streams(void **s)
{
	(void)s;
	struct scenario sc = {"ring3", 3, NULL, MP_ALGO_RING, 0, 0, 2, 256, 999, 0, 1e-5, 0, 1, 3, NULL, 0, 0, 0};
	run(&sc);
}

static void ring_fewer_values_than_peers(void **s)
{
	(void)s;
	struct scenario sc = {"ring5of8", 8, NULL, MP_ALGO_RING, 0, 0, 0, 0, 5, 0, 1e-5, 0, 1, 8, NULL, 0, 0, 0};
	run(&sc);
}

static void ring_2(void **s)
{
	(void)s;
	struct scenario sc = {"ring2", 2, NULL, MP_ALGO_RING, 0, 0, 0, 128, 1000, 1, 1e-5, 0, 1, 2, NULL, 0, 0, 0};
	run(&sc);
}

static void butterfly_8(void **s)
{
	(void)s;
	struct scenario sc = {"bf8", 8, NULL, MP_ALGO_BUTTERFLY, 0, 0, 0, 0, 10000, 1, 1e-5, 1, 1, 8, NULL, 0, 0, 0};
	run(&sc);
}

static void butterfly_tiny(void **s)
{
	(void)s;
	struct scenario sc = {"bf3of8", 8, NULL, MP_ALGO_BUTTERFLY, 0, 0, 0, 0, 3, 0, 1e-5, 0, 1, 8, NULL, 0, 0, 0};
	run(&sc);
}

static void butterfly_fp16(void **s)
{
	(void)s;
	/* Inputs within ±16: fp16 keeps 11 significant bits, so each peer's
	 * contribution and the returned mean are off by at most 2^-7 each. */
	struct scenario sc = {"bf16", 4, NULL, MP_ALGO_BUTTERFLY, 0, MP_CODEC_FP16, 0, 1024, 5000, 0,
			      2.0 / 128, 0, 1, 4, NULL, 0, 0, 0};
	run(&sc);
}

static void butterfly_bandwidth_weighted_parts(void **s)
{
	(void)s;
	struct scenario sc = {"bfbw", 4, NULL, MP_ALGO_BUTTERFLY, 0, 0, 0, 4096, 40000, 1, 1e-5, 0, 1, 4,
			      "1,0,2,1", 0, 0, 0};
	run(&sc);
}

static void single_peer(void **s)
{
	(void)s;
	struct scenario sc = {"solo", 1, NULL, MP_ALGO_MOSHPIT, 0, 0, 0, 0, 100, 0, 0, 0, 0, 1, NULL, 0, 0, 0};
	run(&sc);
}

static void bad_arguments(void **s)
{
	struct mp_config cfg;
	mp_ctx *ctx = NULL;
	mp_mr *mr;
	float buf[4] = {0};

	(void)s;
	mp_config_init(&cfg);
	cfg.transport = "loop";
	cfg.npeers = 2;
	cfg.rank = 5;
	assert_int_equal(mp_init(&cfg, &ctx), -EINVAL);
	assert_null(ctx);
	assert_true(strlen(mp_last_error(NULL)) > 0);
	cfg.rank = 0;
	cfg.transport = "carrier-pigeon";
	assert_int_equal(mp_init(&cfg, &ctx), -ENOENT);
	cfg.transport = "loop";
	cfg.grid = "1x1";
	assert_int_equal(mp_init(&cfg, &ctx), -EINVAL);
	cfg.grid = "2xq";
	assert_int_equal(mp_init(&cfg, &ctx), -EINVAL);
	cfg.grid = NULL;
	cfg.chunk_bytes = 6;
	assert_int_equal(mp_init(&cfg, &ctx), -EINVAL);
	cfg.chunk_bytes = 4096;
	cfg.bandwidths = "1,x";
	assert_int_equal(mp_init(&cfg, &ctx), -EINVAL);
	cfg.bandwidths = NULL;
	cfg.run_name = "bad-args";
	assert_int_equal(mp_init(&cfg, &ctx), 0);
	/* Before peers are known, averaging is refused, not hung. */
	mp_request *req;
	assert_int_equal(mp_average_start(ctx, buf, 4, 1.0f, NULL, &req), -ENOTCONN);
	const char *bad[] = {"loop:a", "tcp:nope"};
	assert_int_equal(mp_set_peers(ctx, bad, 1), -EINVAL);
	assert_int_equal(mp_set_peers(ctx, bad, 2), -EINVAL);
	const char *good[] = {"loop:a", "loop:b"};
	assert_int_equal(mp_set_peers(ctx, good, 2), 0);
	assert_int_equal(mp_set_peers(ctx, good, 2), -EBUSY);
	assert_int_equal(mp_average_start(ctx, buf, 0, 1.0f, NULL, &req), -EINVAL);
	assert_int_equal(mp_average_start(ctx, NULL, 4, 1.0f, NULL, &req), -EINVAL);
	assert_int_equal(mp_average_start(ctx, buf, 4, NAN, NULL, &req), -EINVAL);
	assert_int_equal(mp_average_start(ctx, buf, 4, -1.0f, NULL, &req), -EINVAL);
	/* Host memory registered as CUDA memory: no CUDA driver here (-ENOTSUP),
	 * or the driver says it is not device memory (-EINVAL). */
	int crc = mp_mem_register(ctx, buf, sizeof(buf), MP_MEM_CUDA, &mr);
	assert_true(crc == -ENOTSUP || crc == -EINVAL);
	assert_int_equal(mp_mem_register(ctx, buf, 0, MP_MEM_HOST, &mr), -EINVAL);
	assert_int_equal(mp_mem_register(ctx, buf, 2 * sizeof(float), MP_MEM_HOST, &mr), 0);
	/* A registration that does not cover the buffer is refused. */
	assert_int_equal(mp_average_start(ctx, buf, 4, 1.0f, mr, &req), -EINVAL);
	assert_int_equal(mp_mem_deregister(ctx, mr), 0);
	assert_string_equal(mp_strerror(-ETIMEDOUT), "timed out");
	assert_int_equal(mp_algo_from_name("ring"), MP_ALGO_RING);
	assert_int_equal(mp_algo_from_name("tree"), -EINVAL);
	mp_finalize(ctx);
}

static void unreachable_peer_times_out(void **s)
{
	/* Peer 1 never exists: the average must end with an error after the
	 * connect timeout, not hang. */
	struct mp_config cfg;
	mp_ctx *ctx;
	struct mp_result res;
	float buf[16] = {0};

	(void)s;
	mp_config_init(&cfg);
	cfg.transport = "loop";
	cfg.run_name = "unreachable";
	cfg.npeers = 2;
	cfg.rank = 0;
	cfg.algo = MP_ALGO_BUTTERFLY;
	cfg.connect_timeout_ms = 300;
	assert_int_equal(mp_init(&cfg, &ctx), 0);
	const char *addrs[] = {"loop:unreachable-0", "loop:nobody-listens-here"};
	assert_int_equal(mp_set_peers(ctx, addrs, 2), 0);
	int rc = mp_average(ctx, buf, 16, 1.0f, &res);
	assert_int_equal(rc, -EHOSTUNREACH);
	assert_int_equal(res.failed_peers, 1);
	assert_true(strstr(mp_last_error(ctx), "failed") != NULL);
	for (int i = 0; i < 16; i++)
		assert_true(buf[i] == 0.0f);
	mp_finalize(ctx);
}

static void finalize_cancels_outstanding(void **s)
{
	/* A request left running is cancelled and released by mp_finalize,
	 * promptly (the peer would otherwise be waited for 60 s); ASan checks
	 * that nothing leaks. */
	struct mp_config cfg;
	mp_ctx *ctx;
	mp_request *req;
	float buf[64] = {0};
	struct timespec t0, t1;

	(void)s;
	mp_config_init(&cfg);
	cfg.transport = "loop";
	cfg.run_name = "finalize";
	cfg.npeers = 2;
	cfg.rank = 0;
	cfg.connect_timeout_ms = 60000;
	assert_int_equal(mp_init(&cfg, &ctx), 0);
	const char *addrs[] = {"loop:finalize-0", "loop:finalize-absent"};
	assert_int_equal(mp_set_peers(ctx, addrs, 2), 0);
	assert_int_equal(mp_average_start(ctx, buf, 64, 1.0f, NULL, &req), 0);
	assert_int_equal(mp_average_start(ctx, buf, 64, 1.0f, NULL, &req), 0);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	assert_int_equal(mp_finalize(ctx), 0);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	assert_true(t1.tv_sec - t0.tv_sec < 5);
}

/*
 * An average passed no handle uses a registration of the caller's that
 * covers its buffer (registering anew would pin the memory again on every
 * call with verbs): while the average is in flight, that registration is
 * in use and cannot be deregistered; once it is done, it can.
 */
static void average_uses_callers_registration(void **s)
{
	struct mp_config cfg;
	mp_ctx *ctx[2];
	mp_mr *mr;
	mp_request *req;
	char addr[2][MP_ADDR_STRLEN];
	const char *addrs[2] = {addr[0], addr[1]};
	float buf0[256], buf1[256];

	(void)s;
	for (int r = 0; r < 2; r++) {
		mp_config_init(&cfg);
		cfg.transport = "loop";
		cfg.run_name = "reuse-mr";
		cfg.npeers = 2;
		cfg.rank = r;
		assert_int_equal(mp_init(&cfg, &ctx[r]), 0);
		assert_int_equal(mp_local_address(ctx[r], addr[r], sizeof(addr[r])), 0);
	}
	for (int r = 0; r < 2; r++)
		assert_int_equal(mp_set_peers(ctx[r], addrs, 2), 0);
	for (int i = 0; i < 256; i++) {
		buf0[i] = (float)i;
		buf1[i] = (float)(3 * i);
	}
	assert_int_equal(mp_mem_register(ctx[0], buf0, sizeof(buf0), MP_MEM_HOST, &mr), 0);
	/* Part of the registered range, no handle; rank 1 has not started. */
	assert_int_equal(mp_average_start(ctx[0], buf0 + 16, 200, 1.0f, NULL, &req), 0);
	assert_int_equal(mp_mem_deregister(ctx[0], mr), -EBUSY);
	assert_int_equal(mp_average(ctx[1], buf1 + 16, 200, 1.0f, NULL), 0);
	assert_int_equal(mp_wait(req, 10000, NULL), 0);
	for (int i = 16; i < 216; i++)
		assert_true(buf0[i] == (float)(2 * i) && buf1[i] == (float)(2 * i));
	assert_int_equal(mp_mem_deregister(ctx[0], mr), 0);
	mp_finalize(ctx[0]);
	mp_finalize(ctx[1]);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(moshpit_2x2x2),
		cmocka_unit_test(moshpit_4x4),
		cmocka_unit_test(moshpit_one_round_is_not_the_mean),
		cmocka_unit_test(moshpit_late_starter_in_step),
		cmocka_unit_test(direct_sizes_exact),
		cmocka_unit_test(pairs_sizes_exact),
		cmocka_unit_test(average_uses_callers_registration),
		cmocka_unit_test(moshpit_weighted),
		cmocka_unit_test(moshpit_partial_grid_converges),
		cmocka_unit_test(moshpit_streams_small_chunks),
		cmocka_unit_test(moshpit_4x4_aux),
		cmocka_unit_test(moshpit_3x3x3_aux),
		cmocka_unit_test(moshpit_partial_grid_aux),
		cmocka_unit_test(ring_8),
		cmocka_unit_test(ring_3_streams),
		cmocka_unit_test(ring_fewer_values_than_peers),
		cmocka_unit_test(ring_2),
		cmocka_unit_test(butterfly_8),
		cmocka_unit_test(butterfly_tiny),
		cmocka_unit_test(butterfly_fp16),
		cmocka_unit_test(butterfly_bandwidth_weighted_parts),
		cmocka_unit_test(single_peer),
		cmocka_unit_test(bad_arguments),
		cmocka_unit_test(unreachable_peer_times_out),
		cmocka_unit_test(finalize_cancels_outstanding),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
