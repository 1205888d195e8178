/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Codecs end to end, every peer a thread of this process (loop transport):
 * each lossy codec within its bound of the exact mean, the error-feedback
 * invariant of the sparse codecs (Σ w·(x + residue) is what every round
 * conserves), mp_average_flush delivering the exact mean, the feedback API,
 * "auto" choosing by size, and the ring refusing sparse codecs.
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

#include <moshpit/moshpit.h>

#define MAXP 16

struct job {
	const char *name;
	int npeers;
	const char *grid;
	int algo;
	const char *codec; /* mp_codec_parse spec */
	size_t count;
	int weighted;
	int steps;         /* averages of fresh data before the checks (>= 1) */
	int flush;         /* finish with mp_average_flush */
	unsigned flags;    /* mp_average_ex flags of every average of the steps */
};

struct shared {
	const struct job *j;
	pthread_barrier_t bar;
	char addr[MAXP][MP_ADDR_STRLEN];
	float *out[MAXP];      /* values after the last average */
	float *residue[MAXP];  /* residue after the last average (sparse codecs) */
	int have_residue[MAXP];
	float weight[MAXP];    /* weight after the last average of the steps */
	struct mp_result res[MAXP];
	int rc[MAXP];
	char why[MAXP][160];
};

struct arg {
	struct shared *sh;
	int rank;
};

/* Gradient-like values in about [-1, 1], exactly representable, distinct per peer and step. */
static float input(int rank, int step, size_t i)
{
	uint64_t h = ((uint64_t)rank * 0x9e3779b97f4a7c15ull) ^ ((uint64_t)step * 0xbf58476d1ce4e5b9ull) ^
		     ((uint64_t)(i + 1) * 0x94d049bb133111ebull);
	h ^= h >> 29;
	h *= 0xbf58476d1ce4e5b9ull;
	h ^= h >> 32;
	return (float)((int32_t)(h & 0xffff) - 32768) / 32768.0f;
}

static float weight_of(const struct job *j, int rank)
{
	return j->weighted ? (float)(rank + 1) : 1.0f;
}

static void fail_peer(struct shared *sh, int rank, int rc, const char *what)
{
	sh->rc[rank] = rc ? rc : -EPROTO;
	snprintf(sh->why[rank], sizeof(sh->why[rank]), "%s", what);
}

/*
 * Creates this peer's context for job @j and meets the others. Returns the
 * context with peers set (*rc = 0 or mp_set_peers' error), or NULL after a
 * failed init (recorded; the caller must only wait at the final barrier).
 */
static mp_ctx *join(struct shared *sh, int rank, size_t chunk_bytes, int *rc)
{
	const struct job *j = sh->j;
	struct mp_config cfg;
	mp_ctx *ctx = NULL;
	char run[64];

	snprintf(run, sizeof(run), "codec-%s-%d", j->name, j->steps);
	mp_config_init(&cfg);
	cfg.transport = "loop";
	cfg.run_name = run;
	cfg.rank = rank;
	cfg.npeers = j->npeers;
	cfg.grid = j->grid;
	cfg.algo = j->algo;
	cfg.chunk_bytes = chunk_bytes; /* several chunks per part */
	cfg.connect_timeout_ms = 10000;
	cfg.round_timeout_ms = 10000;
	*rc = mp_codec_parse(j->codec, &cfg);
	if (!*rc)
		*rc = mp_init(&cfg, &ctx);
	if (!*rc)
		mp_local_address(ctx, sh->addr[rank], MP_ADDR_STRLEN);
	pthread_barrier_wait(&sh->bar);
	if (*rc) {
		fail_peer(sh, rank, *rc, "init");
		return NULL;
	}
	const char *addrs[MAXP];
	for (int i = 0; i < j->npeers; i++)
		addrs[i] = sh->addr[i];
	*rc = mp_set_peers(ctx, addrs, j->npeers);
	return ctx;
}

static void *peer_main(void *p)
{
	struct arg *a = p;
	struct shared *sh = a->sh;
	const struct job *j = sh->j;
	int rc;
	mp_ctx *ctx = join(sh, a->rank, 16 * 1024, &rc);

	if (!ctx) {
		pthread_barrier_wait(&sh->bar);
		return NULL;
	}
	float *buf = sh->out[a->rank];
	for (int st = 0; st < j->steps && !rc; st++) {
		for (size_t i = 0; i < j->count; i++)
			buf[i] = input(a->rank, st, i);
		rc = mp_average_ex(ctx, buf, j->count, weight_of(j, a->rank), j->flags,
				   &sh->res[a->rank]);
		if (rc)
			fail_peer(sh, a->rank, rc, mp_last_error(ctx));
	}
	if (!rc) {
		sh->weight[a->rank] = sh->res[a->rank].weight;
		int g = mp_feedback_get(ctx, buf, j->count, sh->residue[a->rank]);
		if (g == 0)
			sh->have_residue[a->rank] = 1;
		else if (g != -ENOENT)
			fail_peer(sh, a->rank, g, "mp_feedback_get");
	}
	if (!rc && j->flush) {
		/* Odd ranks flush with the flag: the same average. */
		rc = a->rank % 2 ? mp_average_ex(ctx, buf, j->count, sh->weight[a->rank],
						 MP_AVG_FLUSH, NULL) :
				   mp_average_flush(ctx, buf, j->count, sh->weight[a->rank], NULL);
		if (rc)
			fail_peer(sh, a->rank, rc, mp_last_error(ctx));
		/* The flush empties the residue. */
		float one;
		if (!rc && sh->have_residue[a->rank] &&
		    (mp_feedback_get(ctx, buf, j->count, sh->residue[a->rank]) ||
		     (one = sh->residue[a->rank][j->count / 2]) != 0.0f))
			fail_peer(sh, a->rank, -EPROTO, "residue not empty after the flush");
	}
	pthread_barrier_wait(&sh->bar);
	mp_finalize(ctx);
	return NULL;
}

/* Runs @j; returns max |out - exact mean of the last step| over every peer. */
static double run_job(const struct job *j, struct shared **keep)
{
	struct shared *sh = calloc(1, sizeof(*sh));
	pthread_t th[MAXP];
	struct arg args[MAXP];
	double wsum = 0, maxerr = 0;

	assert_true(j->npeers <= MAXP && j->steps >= 1);
	sh->j = j;
	pthread_barrier_init(&sh->bar, NULL, (unsigned)j->npeers);
	for (int r = 0; r < j->npeers; r++) {
		sh->out[r] = malloc(j->count * sizeof(float));
		sh->residue[r] = calloc(j->count, sizeof(float));
		args[r] = (struct arg){sh, r};
		assert_int_equal(pthread_create(&th[r], NULL, peer_main, &args[r]), 0);
	}
	for (int r = 0; r < j->npeers; r++)
		pthread_join(th[r], NULL);
	for (int r = 0; r < j->npeers; r++) {
		if (sh->rc[r])
			fail_msg("%s: peer %d: %s: %s", j->name, r, mp_strerror(sh->rc[r]), sh->why[r]);
		assert_int_equal(sh->res[r].failed_peers, 0);
		assert_int_equal(sh->res[r].frames_rejected, 0);
		wsum += weight_of(j, r);
	}
	for (size_t i = 0; i < j->count; i++) {
		double m = 0;
		for (int r = 0; r < j->npeers; r++)
			m += weight_of(j, r) * input(r, j->steps - 1, i);
		m /= wsum;
		for (int r = 0; r < j->npeers; r++) {
			double e = fabs((double)sh->out[r][i] - m);
			if (!(e <= maxerr))
				maxerr = isnan(e) ? INFINITY : e;
		}
	}
	pthread_barrier_destroy(&sh->bar);
	if (keep) {
		*keep = sh;
		return maxerr;
	}
	for (int r = 0; r < j->npeers; r++) {
		free(sh->out[r]);
		free(sh->residue[r]);
	}
	free(sh);
	return maxerr;
}

static void free_shared(struct shared *sh)
{
	for (int r = 0; r < sh->j->npeers; r++) {
		free(sh->out[r]);
		free(sh->residue[r]);
	}
	free(sh);
}

/*
 * Bounds for data in [-1, 1] on a 2x2x2 grid: every value is encoded twice
 * per round (to the reducer and back), six times in all, and the errors of
 * one encoding are at most: fp16 2^-11, bf16 2^-8, blockwise8 absmax/254,
 * uniform8 one bucket (12 sd / 256, sd <= 0.58). Averaging only shrinks them.
 */
static void lossy_codecs_within_bounds(void **s)
{
	static const struct {
		const char *spec;
		double tol;
		int wire_id;
	} cases[] = {
		{"fp16", 6.0 / 2048, MP_CODEC_FP16},
		{"bf16", 6.0 / 256, MP_CODEC_BF16},
		{"blockwise8", 6.0 / 254, MP_CODEC_BLOCKWISE8},
		{"blockwise8:64", 6.0 / 254, MP_CODEC_BLOCKWISE8},
		{"uniform8", 6 * 12 * 0.58 / 256, MP_CODEC_UNIFORM8},
		{"uniform8:3", 6 * 6 * 0.58 / 256 + 0.05, MP_CODEC_UNIFORM8},
	};

	(void)s;
	for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
		struct job j = {.name = cases[c].spec, .npeers = 8, .grid = "2x2x2",
				.algo = MP_ALGO_MOSHPIT, .codec = cases[c].spec, .count = 20011,
				.steps = 1};
		struct shared *sh;
		double e = run_job(&j, &sh);

		print_message("%-14s max error %.3g (bound %.3g)\n", cases[c].spec, e, cases[c].tol);
		if (!(e <= cases[c].tol))
			fail_msg("%s: max error %g above %g", cases[c].spec, e, cases[c].tol);
		/* Lossy, so not exact: the check above is not vacuous. */
		assert_true(e > 1e-7);
		for (int r = 0; r < 8; r++) {
			assert_int_equal(sh->res[r].codec, cases[c].wire_id);
			assert_int_equal(sh->have_residue[r], 0); /* stateless */
			/* Compressed on the wire: fewer bytes than the fp32 values. */
			assert_true(sh->res[r].bytes_sent < 4 * sh->res[r].values_sent);
		}
		free_shared(sh);
	}
}

/* Σ_p w_p·(x_p + e_p) after the average equals Σ_p w0_p·x0_p to fp32 rounding. */
static void check_conservation(const struct job *j, const struct shared *sh)
{
	double maxd = 0, scale = 0;

	for (size_t i = 0; i < j->count; i++) {
		double before = 0, after = 0;
		for (int r = 0; r < j->npeers; r++) {
			before += weight_of(j, r) * input(r, j->steps - 1, i);
			after += sh->weight[r] * ((double)sh->out[r][i] + sh->residue[r][i]);
		}
		if (fabs(after - before) > maxd)
			maxd = fabs(after - before);
		if (fabs(before) > scale)
			scale = fabs(before);
	}
	print_message("%-10s conservation: max |after - before| %.3g (scale %.3g)\n", j->name, maxd, scale);
	/* A few dozen fp32 roundings of values up to the scale. */
	if (!(maxd <= 1e-4 * (scale + 1)))
		fail_msg("%s: Σ w(x + e) moved by %g", j->name, maxd);
}

static void sparse_codecs_conserve_and_flush(void **s)
{
	static const char *const specs[] = {"topk:0.05", "topk:0.3", "adacomp:conv", "adacomp:fc"};

	(void)s;
	for (size_t c = 0; c < sizeof(specs) / sizeof(specs[0]); c++) {
		for (int weighted = 0; weighted <= 1; weighted++) {
			struct job j = {.name = specs[c], .npeers = 8, .grid = "2x2x2",
					.algo = MP_ALGO_MOSHPIT, .codec = specs[c], .count = 12007,
					.weighted = weighted, .steps = 1};
			struct shared *sh;
			double e = run_job(&j, &sh);

			for (int r = 0; r < 8; r++)
				assert_int_equal(sh->have_residue[r], 1);
			/* Sparse: far from the mean before the flush, but nothing lost. */
			assert_true(e > 1e-3);
			check_conservation(&j, sh);
			free_shared(sh);

			/* Several steps of fresh data, then the flush: every peer
			 * holds the exact mean of the last step plus what earlier
			 * steps held back... so check the last step alone with
			 * steps = 1 and the flush. */
			j.flush = 1;
			e = run_job(&j, NULL);
			print_message("%-12s weighted %d: after flush max error %.3g\n", specs[c], weighted, e);
			if (!(e <= 1e-4))
				fail_msg("%s: after the flush max error %g", specs[c], e);
		}
	}
}

/*
 * Error feedback carries across calls: over several steps of fresh data,
 * Σ_t results + the final flush = Σ_t means, on average over the peers
 * (sparse results differ between groups: each reducer's encoding of its
 * part holds back something else).
 */

static void *multi_peer(void *p)
{
	struct arg *a = p;
	struct shared *sh = a->sh;
	const struct job *j = sh->j;
	int rc;
	mp_ctx *ctx = join(sh, a->rank, 8 * 1024, &rc);

	if (!ctx) {
		pthread_barrier_wait(&sh->bar);
		return NULL;
	}
	float *buf = malloc(j->count * sizeof(float));
	float *sum = sh->out[a->rank];
	memset(sum, 0, j->count * sizeof(float));
	for (int st = 0; st < j->steps && !rc; st++) {
		for (size_t i = 0; i < j->count; i++)
			buf[i] = input(a->rank, st, i);
		rc = mp_average(ctx, buf, j->count, 1.0f, NULL);
		for (size_t i = 0; !rc && i < j->count; i++)
			sum[i] += buf[i];
	}
	if (!rc) {
		/* What is still held back: average it to everyone. */
		memset(buf, 0, j->count * sizeof(float));
		rc = mp_average_flush(ctx, buf, j->count, 1.0f, NULL);
		for (size_t i = 0; !rc && i < j->count; i++)
			sum[i] += buf[i];
	}
	if (rc)
		fail_peer(sh, a->rank, rc, mp_last_error(ctx));
	free(buf);
	pthread_barrier_wait(&sh->bar);
	mp_finalize(ctx);
	return NULL;
}

static void feedback_persists_across_calls(void **s)
{
	static const char *const specs[] = {"topk:0.02", "adacomp"};

	(void)s;
	for (size_t c = 0; c < 2; c++) {
		struct job j = {.name = specs[c], .npeers = 4, .grid = "2x2", .codec = specs[c],
				.count = 5003, .steps = 6};
		struct shared *sh = calloc(1, sizeof(*sh));
		pthread_t th[MAXP];
		struct arg args[MAXP];
		double maxe = 0;

		sh->j = &j;
		pthread_barrier_init(&sh->bar, NULL, 4);
		for (int r = 0; r < 4; r++) {
			sh->out[r] = malloc(j.count * sizeof(float));
			args[r] = (struct arg){sh, r};
			assert_int_equal(pthread_create(&th[r], NULL, multi_peer, &args[r]), 0);
		}
		for (int r = 0; r < 4; r++)
			pthread_join(th[r], NULL);
		for (int r = 0; r < 4; r++)
			if (sh->rc[r])
				fail_msg("%s: peer %d: %s: %s", j.name, r, mp_strerror(sh->rc[r]), sh->why[r]);
		for (size_t i = 0; i < j.count; i++) {
			double m = 0, got = 0;
			for (int st = 0; st < j.steps; st++)
				for (int r = 0; r < 4; r++)
					m += input(r, st, i) / 4.0;
			for (int r = 0; r < 4; r++)
				got += sh->out[r][i] / 4.0;
			if (fabs(got - m) > maxe)
				maxe = fabs(got - m);
		}
		print_message("%-10s %d steps + flush: max |Σ results - Σ means| %.3g\n", specs[c], j.steps, maxe);
		if (!(maxe <= 1e-4))
			fail_msg("%s: running sums differ by %g", specs[c], maxe);
		pthread_barrier_destroy(&sh->bar);
		free_shared(sh);
	}
}

static void auto_picks_by_size(void **s)
{
	static const struct {
		size_t count;
		int codec;
	} cases[] = {
		{1000, MP_CODEC_NONE},            /* 4 KB: latency-bound */
		{64 * 1024, MP_CODEC_FP16},       /* 256 KiB */
		{512 * 1024, MP_CODEC_BLOCKWISE8}, /* 2 MiB */
	};

	(void)s;
	for (size_t c = 0; c < 3; c++) {
		struct job j = {.name = "auto", .npeers = 4, .grid = "2x2", .codec = "auto",
				.count = cases[c].count, .steps = 1};
		struct shared *sh;
		double e = run_job(&j, &sh);

		for (int r = 0; r < 4; r++)
			assert_int_equal(sh->res[r].codec, cases[c].codec);
		if (cases[c].codec == MP_CODEC_NONE)
			assert_true(e <= 1e-6);
		else
			assert_true(e <= 4.0 / 254);
		free_shared(sh);
	}
}

static void ring_and_butterfly(void **s)
{
	(void)s;
	/* The ring forwards partial sums, re-encoded at every hop. */
	struct job j = {.name = "ring-bf16", .npeers = 5, .algo = MP_ALGO_RING, .codec = "bf16",
			.count = 3001, .steps = 1};
	double e = run_job(&j, NULL);
	assert_true(e <= 6.0 / 256);
	j = (struct job){.name = "ring-b8", .npeers = 5, .algo = MP_ALGO_RING, .codec = "blockwise8",
			 .count = 3001, .steps = 1};
	e = run_job(&j, NULL);
	assert_true(e <= 6.0 * 5 / 254);
	j = (struct job){.name = "bfly-topk", .npeers = 4, .algo = MP_ALGO_BUTTERFLY,
			 .codec = "topk:0.1", .count = 3001, .steps = 1, .flush = 1};
	e = run_job(&j, NULL);
	assert_true(e <= 1e-4);

	/* Sparse codecs on the ring: refused at mp_init, clearly. */
	struct mp_config cfg;
	mp_ctx *ctx = (mp_ctx *)&cfg;
	mp_config_init(&cfg);
	cfg.transport = "loop";
	cfg.run_name = "codec-ring-topk";
	cfg.rank = 0;
	cfg.npeers = 2;
	cfg.algo = MP_ALGO_RING;
	assert_int_equal(mp_codec_parse("topk", &cfg), 0);
	assert_int_equal(mp_init(&cfg, &ctx), -EINVAL);
	assert_null(ctx);
	assert_non_null(strstr(mp_last_error(NULL), "ring"));
}

/*
 * MP_AVG_UNCOMPRESSED: with uniform8 configured, an average sent
 * uncompressed is the exact mean to the bit, on a 2x2 grid, the ring and
 * the butterfly alike. The inputs are multiples of 2^-15 and the weights
 * 1, so every sum and each halving is exact in fp32: any rounding of the
 * codec shows as a difference, and the same average without the flag shows
 * that it does round them. With topk configured, the uncompressed average
 * holds nothing back (no residue).
 */
static void uncompressed_flag_is_exact(void **s)
{
	static const struct {
		const char *name, *codec, *grid;
		int algo;
	} cases[] = {
		{"unc-moshpit", "uniform8", "2x2", MP_ALGO_MOSHPIT},
		{"unc-ring", "uniform8", NULL, MP_ALGO_RING},
		{"unc-butterfly", "uniform8", NULL, MP_ALGO_BUTTERFLY},
		{"unc-topk", "topk:0.1", "2x2", MP_ALGO_MOSHPIT},
	};

	(void)s;
	for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
		struct job j = {.name = cases[c].name, .npeers = 4, .grid = cases[c].grid,
				.algo = cases[c].algo, .codec = cases[c].codec, .count = 5003,
				.steps = 1, .flags = MP_AVG_UNCOMPRESSED};
		struct shared *sh;
		double e = run_job(&j, &sh);

		print_message("%-14s uncompressed: max error %.3g\n", cases[c].name, e);
		if (e != 0.0)
			fail_msg("%s: uncompressed average off the exact mean by %g", cases[c].name, e);
		for (int r = 0; r < 4; r++) {
			assert_int_equal(sh->res[r].codec, MP_CODEC_NONE);
			assert_int_equal(sh->have_residue[r], 0);
			/* fp32 on the wire: at least 4 bytes per value sent. */
			assert_true(sh->res[r].bytes_sent >= 4 * sh->res[r].values_sent);
		}
		free_shared(sh);
		j.flags = 0;
		e = run_job(&j, NULL);
		print_message("%-14s compressed:   max error %.3g\n", cases[c].name, e);
		assert_true(e > 1e-6);
	}
}

/* Residue of peer @rank set before the average in uncompressed_flag_leaves_residue. */
static float preset_residue(int rank, size_t i)
{
	return input(rank + 100, 0, i) / 8.0f;
}

static void *residue_peer(void *p)
{
	struct arg *a = p;
	struct shared *sh = a->sh;
	const struct job *j = sh->j;
	int rc;
	mp_ctx *ctx = join(sh, a->rank, 16 * 1024, &rc);
	float *buf = sh->out[a->rank], *pre = malloc(j->count * sizeof(float));

	if (!ctx) {
		pthread_barrier_wait(&sh->bar);
		free(pre);
		return NULL;
	}
	for (size_t i = 0; i < j->count; i++) {
		buf[i] = input(a->rank, 0, i);
		pre[i] = preset_residue(a->rank, i);
	}
	if (!rc)
		rc = mp_feedback_set(ctx, buf, j->count, pre);
	if (!rc)
		rc = mp_average_ex(ctx, buf, j->count, 1.0f, j->flags, &sh->res[a->rank]);
	if (!rc)
		rc = mp_feedback_get(ctx, buf, j->count, sh->residue[a->rank]);
	if (rc)
		fail_peer(sh, a->rank, rc, mp_last_error(ctx));
	free(pre);
	pthread_barrier_wait(&sh->bar);
	mp_finalize(ctx);
	return NULL;
}

/*
 * topk configured, every peer with a residue of its own: an uncompressed
 * average neither sends the residue nor changes it (the result is the
 * exact mean of the values alone), where a compressed one folds it in and
 * leaves another. An unknown flag bit is refused before anything is sent.
 */
static void uncompressed_flag_leaves_residue(void **s)
{
	(void)s;
	for (int flags = MP_AVG_UNCOMPRESSED; flags >= 0; flags--) {
		struct job j = {.name = "unc-residue", .npeers = 2, .codec = "topk:0.1",
				.count = 3001, .steps = 1, .flags = (unsigned)flags};
		struct shared *sh = calloc(1, sizeof(*sh));
		pthread_t th[2];
		struct arg args[2];
		int same = 1;
		double maxe = 0;

		sh->j = &j;
		pthread_barrier_init(&sh->bar, NULL, 2);
		for (int r = 0; r < 2; r++) {
			sh->out[r] = malloc(j.count * sizeof(float));
			sh->residue[r] = calloc(j.count, sizeof(float));
			args[r] = (struct arg){sh, r};
			assert_int_equal(pthread_create(&th[r], NULL, residue_peer, &args[r]), 0);
		}
		for (int r = 0; r < 2; r++)
			pthread_join(th[r], NULL);
		for (int r = 0; r < 2; r++) {
			if (sh->rc[r])
				fail_msg("flags %d: peer %d: %s: %s", flags, r, mp_strerror(sh->rc[r]),
					 sh->why[r]);
			assert_int_equal(sh->res[r].codec, flags ? MP_CODEC_NONE : MP_CODEC_TOPK);
			for (size_t i = 0; i < j.count; i++) {
				double m = (input(0, 0, i) + (double)input(1, 0, i)) / 2;
				double e = fabs(sh->out[r][i] - m);

				same &= sh->residue[r][i] == preset_residue(r, i);
				maxe = e > maxe ? e : maxe;
			}
		}
		print_message("flags %d: residue unchanged %d, max |x - mean of values| %.3g\n", flags,
			      same, maxe);
		if (flags) {
			assert_true(same);
			assert_true(maxe == 0.0);
		} else {
			assert_false(same);
			assert_true(maxe > 1e-3);
		}
		pthread_barrier_destroy(&sh->bar);
		free_shared(sh);
	}

	/* An unknown bit: -EINVAL, said, on one peer alone. */
	struct mp_config cfg;
	mp_ctx *ctx;
	char addr[MP_ADDR_STRLEN];
	const char *addrs[1];
	float buf[16] = {0};

	mp_config_init(&cfg);
	cfg.transport = "loop";
	cfg.run_name = "codec-unc-flags";
	cfg.rank = 0;
	cfg.npeers = 1;
	assert_int_equal(mp_init(&cfg, &ctx), 0);
	assert_int_equal(mp_local_address(ctx, addr, sizeof(addr)), 0);
	addrs[0] = addr;
	assert_int_equal(mp_set_peers(ctx, addrs, 1), 0);
	assert_int_equal(mp_average_ex(ctx, buf, 16, 1.0f, 0x6u, NULL), -EINVAL);
	assert_non_null(strstr(mp_last_error(ctx), "flags 0x6: unknown bits 0x4"));
	assert_int_equal(mp_average_ex(ctx, buf, 16, 1.0f, 0x84u, NULL), -EINVAL);
	assert_non_null(strstr(mp_last_error(ctx), "flags 0x84: unknown bits 0x84"));
	assert_int_equal(mp_finalize(ctx), 0);
}

static void feedback_api(void **s)
{
	struct mp_config cfg;
	mp_ctx *ctx;
	char addr[MP_ADDR_STRLEN];
	const char *addrs[1];
	float buf[100], res[100], got[100];
	mp_request *req;

	(void)s;
	mp_config_init(&cfg);
	cfg.transport = "loop";
	cfg.run_name = "codec-fbapi";
	cfg.rank = 0;
	cfg.npeers = 1;
	assert_int_equal(mp_codec_parse("topk:0.1", &cfg), 0);
	assert_int_equal(mp_init(&cfg, &ctx), 0);
	assert_int_equal(mp_local_address(ctx, addr, sizeof(addr)), 0);
	addrs[0] = addr;
	assert_int_equal(mp_set_peers(ctx, addrs, 1), 0);
	for (int i = 0; i < 100; i++) {
		buf[i] = (float)i;
		res[i] = (float)(i % 7) * 0.25f;
	}
	assert_int_equal(mp_feedback_get(ctx, buf, 100, got), -ENOENT);
	assert_int_equal(mp_feedback_reset(ctx, buf), -ENOENT);
	assert_int_equal(mp_feedback_get(ctx, NULL, 100, got), -EINVAL);
	assert_int_equal(mp_feedback_get(ctx, buf, 0, got), -EINVAL);
	assert_int_equal(mp_feedback_set(ctx, buf, 100, NULL), -EINVAL);
	/* Restore (checkpoint), read back. */
	assert_int_equal(mp_feedback_set(ctx, buf, 100, res), 0);
	assert_int_equal(mp_feedback_get(ctx, buf, 100, got), 0);
	assert_memory_equal(got, res, sizeof(res));
	/* Another length is another buffer. */
	assert_int_equal(mp_feedback_get(ctx, buf, 99, got), -ENOENT);
	/* Non-finite residues are refused and change nothing. */
	float bad[100];
	memcpy(bad, res, sizeof(bad));
	bad[50] = NAN;
	assert_int_equal(mp_feedback_set(ctx, buf, 100, bad), -EINVAL);
	assert_int_equal(mp_feedback_get(ctx, buf, 100, got), 0);
	assert_memory_equal(got, res, sizeof(res));
	/* While an average of the buffer is in flight, its residue is busy. */
	assert_int_equal(mp_average_start(ctx, buf, 100, 1.0f, NULL, &req), 0);
	assert_int_equal(mp_feedback_get(ctx, buf, 100, got), -EBUSY);
	assert_int_equal(mp_feedback_set(ctx, buf, 100, res), -EBUSY);
	assert_int_equal(mp_feedback_reset(ctx, buf), -EBUSY);
	assert_int_equal(mp_average_flush(ctx, buf, 100, 1.0f, NULL), -EBUSY);
	assert_int_equal(mp_wait(req, 10000, NULL), 0);
	/* One peer: its "group" is itself, so the values stay; the residue was
	 * folded into its own part (it reduces all of it) and is now zero. */
	assert_int_equal(mp_feedback_get(ctx, buf, 100, got), 0);
	/* Flush: buf + residue, then the residue is empty. */
	assert_int_equal(mp_feedback_set(ctx, buf, 100, res), 0);
	float before[100];
	memcpy(before, buf, sizeof(before));
	assert_int_equal(mp_average_flush(ctx, buf, 100, 1.0f, NULL), 0);
	for (int i = 0; i < 100; i++)
		assert_float_equal(buf[i], before[i] + res[i], 0.0f);
	assert_int_equal(mp_feedback_get(ctx, buf, 100, got), 0);
	for (int i = 0; i < 100; i++)
		assert_true(got[i] == 0.0f);
	assert_int_equal(mp_feedback_reset(ctx, buf), 0);
	assert_int_equal(mp_feedback_get(ctx, buf, 100, got), -ENOENT);
	assert_int_equal(mp_feedback_reset(ctx, NULL), 0);
	assert_int_equal(mp_finalize(ctx), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(feedback_api),
		cmocka_unit_test(lossy_codecs_within_bounds),
		cmocka_unit_test(sparse_codecs_conserve_and_flush),
		cmocka_unit_test(feedback_persists_across_calls),
		cmocka_unit_test(auto_picks_by_size),
		cmocka_unit_test(ring_and_butterfly),
		cmocka_unit_test(uncompressed_flag_is_exact),
		cmocka_unit_test(uncompressed_flag_leaves_residue),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
