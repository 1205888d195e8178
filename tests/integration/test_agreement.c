/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Agreement between peers, with real processes over TCP on loopback (as in
 * test_multiproc.c): peers whose run-shared settings differ refuse each
 * other at connect, and every average that needs the other fails with
 * -EBADE, its message naming the field and both values, the buffer as it
 * was; peers that average different lengths fail with -EMSGSIZE, naming both
 * counts; either error leaves buffer, weight and error-feedback residue as
 * they were passed, also when only a later Moshpit round meets the other
 * peer (and without the copy that takes, in the steady state, such a peer
 * is dropped instead); a bad weight is -EINVAL before anything is sent. Each child
 * reports its return code, its message and whether its buffer is unchanged
 * to the parent, which judges them all.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <moshpit/moshpit.h>
#include "proc_io.h"

#define MAXP 8
#define MSG 256

/* One peer's configuration, beyond what every peer shares. */
struct peer_cfg {
	const char *grid;
	int algo;
	int rounds;
	int codec;
	unsigned codec_block;
	size_t chunk_bytes;
	int streams;
	int npeers;        /* 0: the job's */
	const char *bandwidths;
	uint64_t min_part;
	int check_finite;
	int direct_pairs;
	size_t count;      /* 0: the job's */
	float weight;      /* 0: rank + 1 */
	unsigned flags;    /* mp_average_ex flags */
	unsigned mean_of;  /* bit r set: the result must be the exact weighted mean of these
	                      ranks' inputs (report.exact); 0: not checked */
};

struct job {
	const char *name;
	int npeers;
	size_t count;
	struct peer_cfg base;
	struct peer_cfg odd[MAXP]; /* per rank: fields set here replace base's */
	int odd_set[MAXP];
	int nan_rank;      /* check_finite job: this rank's value 0 is NaN (part 0); 0: none */
	int nan_whole;     /* ... and the direct exchange leaves all its values out, not part 0's */
	int round_timeout_ms; /* 0: 5000 */
	int connect_timeout_ms; /* 0: 3000 */
	int warm;          /* every peer first averages j->count values once, all agreeing:
	                      the average judged runs on connections already agreed */
};

/* What a child reports. */
struct report {
	int rc;
	int unchanged;     /* the buffer holds its inputs bit for bit */
	int failed_peers;
	int peers;
	int exact;         /* check_finite job: the result is the exact mean of the finite
	                      contributions, part by part; mean_of job: of those ranks */
	int residue_zero;  /* the error-feedback residue (mp_feedback_get) is all zeros, or
	                      there is none */
	float weight;      /* mp_result.weight */
	char err[MSG];
};

static float input(int rank, size_t i)
{
	return (float)((int)((rank * 37 + (int)i * 11) % 2001) - 1000) / 16.0f;
}

static struct peer_cfg merged(const struct job *j, int rank)
{
	struct peer_cfg c = j->base;
	const struct peer_cfg *o = &j->odd[rank];

	if (!j->odd_set[rank])
		return c;
#define TAKE(f)            \
	if (o->f)          \
		c.f = o->f;
	TAKE(grid) TAKE(algo) TAKE(rounds) TAKE(codec) TAKE(codec_block) TAKE(chunk_bytes)
	TAKE(streams) TAKE(npeers) TAKE(bandwidths) TAKE(min_part) TAKE(check_finite)
	TAKE(direct_pairs) TAKE(count) TAKE(weight) TAKE(flags) TAKE(mean_of)
#undef TAKE
	return c;
}

static int child(const struct job *j, int rank, int to_parent, int from_parent)
{
	struct peer_cfg pc = merged(j, rank);
	int np = pc.npeers ? pc.npeers : j->npeers;
	size_t count = pc.count ? pc.count : j->count;
	struct mp_config cfg;
	struct mp_result res;
	struct report rep;
	char run[64], addrs[MAXP][MP_ADDR_STRLEN];
	const char *ap[MAXP];
	mp_ctx *ctx;
	int rc;

	memset(&rep, 0, sizeof(rep));
	snprintf(run, sizeof(run), "agree-%s-%d", j->name, (int)getppid());
	mp_config_init(&cfg);
	cfg.transport = "tcp";
	cfg.run_name = run;
	cfg.rank = rank;
	cfg.npeers = np;
	cfg.grid = pc.grid;
	cfg.algo = pc.algo;
	cfg.rounds = pc.rounds;
	cfg.codec = pc.codec;
	if (pc.codec_block)
		cfg.codec_block = pc.codec_block;
	cfg.chunk_bytes = pc.chunk_bytes ? pc.chunk_bytes : 4096;
	cfg.streams = pc.streams;
	cfg.bandwidths = pc.bandwidths;
	cfg.min_part = pc.min_part;
	cfg.check_finite = pc.check_finite;
	cfg.direct_pairs = pc.direct_pairs;
	cfg.listen = "127.0.0.1:0";
	cfg.connect_timeout_ms = j->connect_timeout_ms ? j->connect_timeout_ms : 3000;
	cfg.round_timeout_ms = j->round_timeout_ms ? j->round_timeout_ms : 5000;
	rc = mp_init(&cfg, &ctx);
	if (rc) {
		fprintf(stderr, "rank %d: mp_init: %s: %s\n", rank, mp_strerror(rc), mp_last_error(NULL));
		return 2;
	}
	mp_local_address(ctx, addrs[rank], MP_ADDR_STRLEN);
	if (write_all(to_parent, addrs[rank], MP_ADDR_STRLEN) ||
	    read_all(from_parent, addrs, sizeof(addrs[0]) * (size_t)j->npeers, 20000))
		return 2;
	for (int i = 0; i < np; i++)
		ap[i] = i < j->npeers ? addrs[i] : "127.0.0.1:1"; /* a rank nobody runs */
	if (mp_set_peers(ctx, ap, np))
		return 2;
	float *buf = malloc((count > j->count ? count : j->count) * sizeof(float));
	if (j->warm && mp_average(ctx, buf, j->count, 1.0f, NULL)) {
		fprintf(stderr, "rank %d: the warm-up average failed: %s\n", rank, mp_last_error(ctx));
		return 2;
	}
	for (size_t i = 0; i < count; i++)
		buf[i] = input(rank, i);
	if (j->nan_rank && rank == j->nan_rank)
		buf[0] = NAN;
	memset(&res, 0, sizeof(res));
	rc = mp_average_ex(ctx, buf, count, pc.weight != 0.0f ? pc.weight : (float)(rank + 1),
			   pc.flags, &res);
	rep.rc = rc;
	rep.unchanged = 1;
	for (size_t i = 0; i < count; i++)
		rep.unchanged &= memcmp(&buf[i], &(float){input(rank, i)}, sizeof(float)) == 0;
	rep.failed_peers = res.failed_peers;
	rep.peers = res.peers;
	rep.weight = res.weight;
	{
		/* Sparse codecs: nothing held back yet, or as it was (zero). */
		float *e = calloc(count, sizeof(float));
		int frc = mp_feedback_get(ctx, buf, count, e);
		rep.residue_zero = frc == -ENOENT;
		if (!frc) {
			rep.residue_zero = 1;
			for (size_t i = 0; i < count; i++)
				rep.residue_zero &= e[i] == 0.0f;
		}
		free(e);
	}
	snprintf(rep.err, sizeof(rep.err), "%s", mp_last_error(ctx));
	if (j->nan_rank) {
		/* Equal parts of count / npeers; part 0 (rank 0 reduces it)
		 * leaves the NaN's sender out, the others take everyone. */
		double maxerr = 0;
		for (size_t i = 0; i < count; i++) {
			double m = 0, w = 0;
			for (int q = 0; q < j->npeers; q++) {
				if (q == j->nan_rank && (j->nan_whole || i < count / (size_t)j->npeers))
					continue;
				m += (q + 1) * (double)input(q, i);
				w += q + 1;
			}
			double e = fabs(buf[i] - m / w);
			maxerr = e > maxerr || isnan(e) ? e : maxerr;
		}
		rep.exact = maxerr < 1e-4 && !isnan(maxerr);
	}
	if (pc.mean_of) {
		double maxerr = 0;
		for (size_t i = 0; i < count; i++) {
			double m = 0, w = 0;
			for (int q = 0; q < j->npeers; q++) {
				if (!(pc.mean_of >> q & 1))
					continue;
				m += (q + 1) * (double)input(q, i);
				w += q + 1;
			}
			double e = fabs(buf[i] - m / w);
			maxerr = e > maxerr || isnan(e) ? e : maxerr;
		}
		rep.exact = maxerr < 1e-4 && !isnan(maxerr);
	}
	write_all(to_parent, &rep, sizeof(rep));
	/* Everyone leaves together: a peer gone early would fail the others
	 * for another reason. */
	char b;
	read_all(from_parent, &b, 1, 60000);
	mp_finalize(ctx);
	free(buf);
	return 0;
}

static void launch(const struct job *j, struct report *out)
{
	pid_t pid[MAXP];
	int up[MAXP], down[MAXP];
	char addrs[MAXP][MP_ADDR_STRLEN];

	for (int r = 0; r < j->npeers; r++) {
		pid[r] = fork_piped(&up[r], &down[r]);
		assert_true(pid[r] >= 0);
		if (pid[r] == 0)
			_exit(child(j, r, up[r], down[r]));
	}
	for (int r = 0; r < j->npeers; r++)
		assert_int_equal(read_all(up[r], addrs[r], MP_ADDR_STRLEN, 20000), 0);
	for (int r = 0; r < j->npeers; r++)
		assert_int_equal(write_all(down[r], addrs, sizeof(addrs[0]) * (size_t)j->npeers), 0);
	for (int r = 0; r < j->npeers; r++)
		if (read_all(up[r], &out[r], sizeof(out[r]), 60000)) {
			for (int k = 0; k < j->npeers; k++)
				kill(pid[k], SIGKILL);
			fail_msg("%s: rank %d reported nothing within 60 s", j->name, r);
		}
	char b = 1;
	for (int r = 0; r < j->npeers; r++)
		write_all(down[r], &b, 1);
	for (int r = 0; r < j->npeers; r++) {
		int st;
		waitpid(pid[r], &st, 0);
		assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
		close(up[r]);
		close(down[r]);
	}
}

/* Two peers, rank 1 configured apart in one field: both refuse with
 * -EBADE, each naming the field with its own value first, neither buffer
 * changed. */
static void two_differ(const char *name, struct peer_cfg odd, const char *msg0, const char *msg1)
{
	struct job j = {.name = name, .npeers = 2, .count = 1000};
	struct report rep[2];

	if (odd.npeers)
		j.base.grid = "4"; /* the same grid for both, or the grid differs first */
	j.odd[1] = odd;
	j.odd_set[1] = 1;
	launch(&j, rep);
	for (int r = 0; r < 2; r++) {
		const char *want = r ? msg1 : msg0;
		if (rep[r].rc != -EBADE)
			fail_msg("%s: rank %d: rc %d (%s), expected -EBADE; \"%s\"", name, r, rep[r].rc,
				 mp_strerror(rep[r].rc), rep[r].err);
		if (!strstr(rep[r].err, want))
			fail_msg("%s: rank %d: \"%s\" does not say \"%s\"", name, r, rep[r].err, want);
		if (!rep[r].unchanged)
			fail_msg("%s: rank %d: buffer changed", name, r);
	}
}

static void differ_algorithm(void **s)
{
	(void)s;
	two_differ("algo", (struct peer_cfg){.algo = MP_ALGO_BUTTERFLY},
		   "algorithm differs: ours moshpit, theirs butterfly",
		   "algorithm differs: ours butterfly, theirs moshpit");
}

static void differ_grid(void **s)
{
	(void)s;
	two_differ("grid", (struct peer_cfg){.grid = "2x1"}, "grid differs: ours 2, theirs 2x1",
		   "grid differs: ours 2x1, theirs 2");
}

static void differ_rounds(void **s)
{
	(void)s;
	two_differ("rounds", (struct peer_cfg){.rounds = 3}, "rounds differs: ours 1, theirs 3",
		   "rounds differs: ours 3, theirs 1");
}

static void differ_codec(void **s)
{
	(void)s;
	two_differ("codec", (struct peer_cfg){.codec = MP_CODEC_FP16},
		   "codec differs: ours none, theirs fp16", "codec differs: ours fp16, theirs none");
}

static void differ_codec_parameter(void **s)
{
	struct job j = {.name = "block", .npeers = 2, .count = 1000,
			.base = {.codec = MP_CODEC_BLOCKWISE8}};
	struct report rep[2];

	(void)s;
	j.odd[1] = (struct peer_cfg){.codec_block = 256};
	j.odd_set[1] = 1;
	launch(&j, rep);
	for (int r = 0; r < 2; r++) {
		assert_int_equal(rep[r].rc, -EBADE);
		assert_non_null(strstr(rep[r].err, r ? "codec block (MP_CODEC_BLOCK) differs: ours 256, theirs 4096"
						      : "codec block (MP_CODEC_BLOCK) differs: ours 4096, theirs 256"));
		assert_true(rep[r].unchanged);
	}
}

static void differ_chunk(void **s)
{
	(void)s;
	two_differ("chunk", (struct peer_cfg){.chunk_bytes = 8192},
		   "chunk size (MP_CHUNK_BYTES) differs: ours 4096 bytes, theirs 8192 bytes",
		   "chunk size (MP_CHUNK_BYTES) differs: ours 8192 bytes, theirs 4096 bytes");
}

static void differ_streams(void **s)
{
	(void)s;
	two_differ("streams", (struct peer_cfg){.streams = 2},
		   "streams (MP_NSTREAMS) differs: ours 1, theirs 2",
		   "streams (MP_NSTREAMS) differs: ours 2, theirs 1");
}

static void differ_npeers(void **s)
{
	(void)s;
	/* Rank 1 thinks there are 3 (its third is nobody); both on grid 4. */
	two_differ("npeers", (struct peer_cfg){.npeers = 3, .grid = "4"},
		   "peer count differs: ours 2, theirs 3", "peer count differs: ours 3, theirs 2");
}

static void differ_bandwidths(void **s)
{
	(void)s;
	two_differ("bandwidths", (struct peer_cfg){.bandwidths = "1,2"},
		   "bandwidths (MP_BANDWIDTHS) differs: ours 1,1 (fingerprint ",
		   "bandwidths (MP_BANDWIDTHS) differs: ours 1,2 (fingerprint ");
}

static void differ_min_part(void **s)
{
	(void)s;
	two_differ("min_part", (struct peer_cfg){.min_part = 16},
		   "min part (MP_MIN_PART) differs: ours 0, theirs 16",
		   "min part (MP_MIN_PART) differs: ours 16, theirs 0");
}

static void differ_check_finite(void **s)
{
	(void)s;
	two_differ("finite", (struct peer_cfg){.check_finite = 1},
		   "check finite (MP_CHECK_FINITE) differs: ours 0, theirs 1",
		   "check finite (MP_CHECK_FINITE) differs: ours 1, theirs 0");
}

static void differ_direct_pairs(void **s)
{
	(void)s;
	two_differ("pairs", (struct peer_cfg){.direct_pairs = 1},
		   "pairwise short vectors (MP_DIRECT_PAIRS) differs: ours 0, theirs 1",
		   "pairwise short vectors (MP_DIRECT_PAIRS) differs: ours 1, theirs 0");
}

/*
 * The issue's case: 4 peers, rank 0 with MP_GRID=4, the others 2x2. Rank 0
 * (one group of all four) and rank 1 (its groupmate in round 0) refuse each
 * other at once; rank 2 meets rank 0 in round 1 and fails -EBADE too, after
 * round 0 with rank 3: its buffer is put back as it was (doc/design.md, "Two
 * disagreements"). Rank 3 meets rank 1, who gave up in round 0, in round 1:
 * it keeps round 0's mean with rank 2 (2 peers), rank 1 dropped silent.
 */
static void issue_grid_4_against_2x2(void **s)
{
	struct job j = {.name = "issue-grid", .npeers = 4, .count = 1000,
			.base = {.grid = "2x2", .mean_of = 1u << 2 | 1u << 3}, .round_timeout_ms = 2500};
	struct report rep[4];

	(void)s;
	j.odd[0] = (struct peer_cfg){.grid = "4"};
	j.odd_set[0] = 1;
	launch(&j, rep);
	for (int r = 0; r < 4; r++)
		fprintf(stderr, "rank %d: rc %d, peers %d, \"%s\"\n", r, rep[r].rc, rep[r].peers,
			rep[r].err);
	for (int r = 0; r < 3; r++) {
		assert_int_equal(rep[r].rc, -EBADE);
		assert_non_null(strstr(rep[r].err, r ? "grid differs: ours 2x2, theirs 4"
						      : "grid differs: ours 4, theirs 2x2"));
		assert_true(rep[r].unchanged);
	}
	assert_non_null(strstr(rep[2].err, "round 1: peer 0 "));
	assert_int_equal(rep[3].rc, 0);
	assert_int_equal(rep[3].peers, 2);
	assert_int_equal(rep[3].failed_peers, 1);
	assert_true(rep[3].exact);
}

/* Rank @r failed with @rc and left buffer, residue and weight as passed. */
static void refused_untouched(const struct report *rep, int r, int rc)
{
	if (rep[r].rc != rc || !rep[r].unchanged || !rep[r].residue_zero ||
	    rep[r].weight != (float)(r + 1))
		fail_msg("rank %d: rc %d (want %d), unchanged %d, residue zero %d, weight %g: \"%s\"",
			 r, rep[r].rc, rc, rep[r].unchanged, rep[r].residue_zero,
			 (double)rep[r].weight, rep[r].err);
}

/*
 * 2x2 grid: rounds 0 group {0,1} and {2,3}, round 1 {0,2} and {1,3}
 * (MP_DEBUG=TRACE, "round N: group"). A disagreement that only a later round
 * meets must leave every buffer that round 0 already averaged as it was
 * passed in: -EBADE (resp. -EMSGSIZE) means nothing changed.
 *
 * Rank 3 alone with another MP_MIN_PART: rank 2 refuses it in round 0; rank
 * 1 averages round 0 with rank 0 and meets rank 3 in round 1: -EBADE, its
 * buffer put back. Rank 0 never meets rank 3: round 0 with rank 1, then its
 * round-1 groupmate rank 2 has given up and stays silent (dropped at the
 * round timeout), so it returns 0 with the exact mean of ranks 0 and 1:
 * peers 2, one failed peer, weight (1 + 2) / 2.
 */
static void later_round_settings_one_peer(void **s)
{
	struct job j = {.name = "later-one", .npeers = 4, .count = 1000,
			.base = {.grid = "2x2", .mean_of = 1u << 0 | 1u << 1}, .round_timeout_ms = 2500};
	struct report rep[4];

	(void)s;
	j.odd[3] = (struct peer_cfg){.min_part = 16};
	j.odd_set[3] = 1;
	launch(&j, rep);
	for (int r = 0; r < 4; r++)
		fprintf(stderr, "rank %d: rc %d, peers %d, failed %d, unchanged %d, \"%s\"\n", r,
			rep[r].rc, rep[r].peers, rep[r].failed_peers, rep[r].unchanged, rep[r].err);
	for (int r = 1; r < 4; r++) {
		if (rep[r].rc != -EBADE || !rep[r].unchanged)
			fail_msg("rank %d: rc %d, unchanged %d, \"%s\"", r, rep[r].rc, rep[r].unchanged,
				 rep[r].err);
		assert_true(rep[r].weight == (float)(r + 1));
	}
	assert_non_null(strstr(rep[1].err, "group all-reduce round 1: peer 3 ("));
	assert_non_null(strstr(rep[1].err, "min part (MP_MIN_PART) differs: ours 0, theirs 16"));
	assert_non_null(strstr(rep[2].err, "group all-reduce round 0: peer 3 ("));
	assert_non_null(strstr(rep[3].err, "group all-reduce round 0: peer 2 ("));
	assert_non_null(strstr(rep[3].err, "min part (MP_MIN_PART) differs: ours 16, theirs 0"));
	assert_int_equal(rep[0].rc, 0);
	assert_int_equal(rep[0].peers, 2);
	assert_int_equal(rep[0].failed_peers, 1);
	assert_true(rep[0].exact);
	assert_true(rep[0].weight == 1.5f);
}

/*
 * Ranks 2 and 3 with another MP_MIN_PART, everyone on topk (error
 * feedback): round 0 averages {0,1} and {2,3}, so every buffer and every
 * residue has moved; round 1 pairs each with one of the others, and all
 * four fail -EBADE with buffer, weight and residue as they were passed in.
 */
static void later_round_settings_all(void **s)
{
	struct job j = {.name = "later-all", .npeers = 4, .count = 1000,
			.base = {.grid = "2x2", .codec = MP_CODEC_TOPK}};
	struct report rep[4];

	(void)s;
	j.odd[2] = j.odd[3] = (struct peer_cfg){.min_part = 16};
	j.odd_set[2] = j.odd_set[3] = 1;
	launch(&j, rep);
	for (int r = 0; r < 4; r++) {
		refused_untouched(rep, r, -EBADE);
		assert_non_null(strstr(rep[r].err, "group all-reduce round 1: peer "));
		assert_non_null(strstr(rep[r].err, r < 2 ? "ours 0, theirs 16" : "ours 16, theirs 0"));
	}
}

/*
 * Ranks 2 and 3 average 2048 values, ranks 0 and 1 1024, all on topk: round
 * 0 agrees in both groups and averages; round 1's OPENs differ in each, and
 * all four fail -EMSGSIZE, naming both counts, buffer, weight and residue
 * as they were passed in.
 */
static void later_round_count(void **s)
{
	struct job j = {.name = "later-count", .npeers = 4, .count = 1024,
			.base = {.grid = "2x2", .codec = MP_CODEC_TOPK}};
	struct report rep[4];

	(void)s;
	j.odd[2] = j.odd[3] = (struct peer_cfg){.count = 2048};
	j.odd_set[2] = j.odd_set[3] = 1;
	launch(&j, rep);
	for (int r = 0; r < 4; r++) {
		refused_untouched(rep, r, -EMSGSIZE);
	}
	assert_non_null(strstr(rep[0].err, "round 1: peer 2 (127.0.0.1:"));
	assert_non_null(strstr(rep[0].err, "peer 2 averages 2048 values, this peer 1024"));
	assert_non_null(strstr(rep[1].err, "peer 3 averages 2048 values, this peer 1024"));
	assert_non_null(strstr(rep[2].err, "peer 0 averages 1024 values, this peer 2048"));
	assert_non_null(strstr(rep[3].err, "peer 1 averages 1024 values, this peer 2048"));
}

/* Lengths differ: -EMSGSIZE on both, both counts named, buffers unchanged. */
static void count_mismatch(int algo, const char *name)
{
	struct job j = {.name = name, .npeers = 2, .count = 1024, .base = {.algo = algo}};
	struct report rep[2];

	j.odd[1] = (struct peer_cfg){.count = 2048};
	j.odd_set[1] = 1;
	launch(&j, rep);
	for (int r = 0; r < 2; r++) {
		if (rep[r].rc != -EMSGSIZE)
			fail_msg("%s: rank %d: rc %d (%s), expected -EMSGSIZE; \"%s\"", name, r,
				 rep[r].rc, mp_strerror(rep[r].rc), rep[r].err);
		assert_non_null(strstr(rep[r].err, r ? "peer 0 averages 1024 values, this peer 2048"
						      : "peer 1 averages 2048 values, this peer 1024"));
		assert_true(rep[r].unchanged);
	}
}

static void count_differs_moshpit(void **s)
{
	(void)s;
	count_mismatch(MP_ALGO_MOSHPIT, "count-moshpit");
}

/* The same on topk: the SCATTER frames that left with the OPENs took
 * their part of the residue as they were encoded; giving up puts it back. */
static void count_differs_topk(void **s)
{
	struct job j = {.name = "count-topk", .npeers = 2, .count = 1024,
			.base = {.codec = MP_CODEC_TOPK}};
	struct report rep[2];

	(void)s;
	j.odd[1] = (struct peer_cfg){.count = 2048};
	j.odd_set[1] = 1;
	launch(&j, rep);
	for (int r = 0; r < 2; r++) {
		if (rep[r].rc != -EMSGSIZE || !rep[r].unchanged || !rep[r].residue_zero)
			fail_msg("rank %d: rc %d, unchanged %d, residue zero %d, \"%s\"", r, rep[r].rc,
				 rep[r].unchanged, rep[r].residue_zero, rep[r].err);
	}
}

static void count_differs_ring(void **s)
{
	(void)s;
	count_mismatch(MP_ALGO_RING, "count-ring");
}

/* Three in one group, one with another length: all three fail -EMSGSIZE
 * (each of the two others meets the odd one directly), nothing written. */
static void count_differs_in_a_group_of_three(void **s)
{
	struct job j = {.name = "count-3", .npeers = 3, .count = 3000};
	struct report rep[3];

	(void)s;
	j.odd[2] = (struct peer_cfg){.count = 2999};
	j.odd_set[2] = 1;
	launch(&j, rep);
	for (int r = 0; r < 3; r++) {
		if (rep[r].rc != -EMSGSIZE)
			fail_msg("rank %d: rc %d, \"%s\"", r, rep[r].rc, rep[r].err);
		assert_true(rep[r].unchanged);
	}
	assert_non_null(strstr(rep[0].err, "peer 2 averages 2999 values, this peer 3000"));
}

/*
 * One peer averages uncompressed (MP_AVG_UNCOMPRESSED), the other with the
 * configured uniform8: -EBADE on both, each naming the other's way and its
 * own, buffers unchanged; never a result that leaves the other out.
 */
static void flags_mismatch(int algo, int npeers, const char *name)
{
	struct job j = {.name = name, .npeers = npeers, .count = 1000,
			.base = {.algo = algo, .codec = MP_CODEC_UNIFORM8}};
	struct report rep[MAXP];

	j.odd[1] = (struct peer_cfg){.flags = MP_AVG_UNCOMPRESSED};
	j.odd_set[1] = 1;
	launch(&j, rep);
	for (int r = 0; r < npeers; r++) {
		/* Rank 1 names the first other peer whose OPEN it met. */
		const char *want = r == 1 ? " averages with uniform8, this peer uncompressed "
					    "(codec none) (MP_AVG_UNCOMPRESSED, MP_AVG_FLUSH or "
					    "mp_average_flush on one side only)"
					  : "peer 1 averages uncompressed (codec none), this peer with "
					    "uniform8";
		if (rep[r].rc != -EBADE)
			fail_msg("%s: rank %d: rc %d (%s), expected -EBADE; \"%s\"", name, r,
				 rep[r].rc, mp_strerror(rep[r].rc), rep[r].err);
		if (!strstr(rep[r].err, want))
			fail_msg("%s: rank %d: \"%s\" does not say \"%s\"", name, r, rep[r].err, want);
		assert_true(rep[r].unchanged);
	}
}

static void flags_differ_moshpit(void **s)
{
	(void)s;
	flags_mismatch(MP_ALGO_MOSHPIT, 2, "flags-moshpit");
}

static void flags_differ_ring(void **s)
{
	(void)s;
	flags_mismatch(MP_ALGO_RING, 2, "flags-ring");
}

/* Four in one butterfly group, rank 1 uncompressed: all four fail. */
static void flags_differ_in_a_group_of_four(void **s)
{
	(void)s;
	flags_mismatch(MP_ALGO_BUTTERFLY, 4, "flags-4");
}

/* Every peer uncompressed against a uniform8 configuration: they agree. */
static void flags_alike_average(void **s)
{
	struct job j = {.name = "flags-alike", .npeers = 2, .count = 1000,
			.base = {.codec = MP_CODEC_UNIFORM8, .flags = MP_AVG_UNCOMPRESSED,
				 .weight = 1.0f}};
	struct report rep[2];

	(void)s;
	launch(&j, rep);
	for (int r = 0; r < 2; r++) {
		assert_int_equal(rep[r].rc, 0);
		assert_int_equal(rep[r].peers, 2);
		assert_false(rep[r].unchanged);
	}
}

/* A weight that is NaN, infinite or negative: -EINVAL before anything is
 * sent, said in mp_last_error, the buffer as it was. The other peer, left
 * alone, fails as a static run without its peer does. */
static void bad_weight(float w, const char *name, const char *said)
{
	/* Rank 1 only has to fail: rank 0 never exchanges, and rank 1 gives up
	 * reaching it after its connect timeouts (1 s rather than 3: three
	 * cases, three builds). */
	struct job j = {.name = name, .npeers = 2, .count = 100, .round_timeout_ms = 1000,
			.connect_timeout_ms = 1000};
	struct report rep[2];

	j.odd[0] = (struct peer_cfg){.weight = w};
	j.odd_set[0] = 1;
	launch(&j, rep);
	assert_int_equal(rep[0].rc, -EINVAL);
	assert_non_null(strstr(rep[0].err, said));
	assert_true(rep[0].unchanged);
	assert_true(rep[1].rc != 0);
	assert_true(rep[1].unchanged);
}

static void weight_nan(void **s)
{
	(void)s;
	bad_weight(NAN, "w-nan", "weight nan: must be finite and >= 0");
}

static void weight_inf(void **s)
{
	(void)s;
	bad_weight(INFINITY, "w-inf", "weight inf: must be finite and >= 0");
}

static void weight_negative(void **s)
{
	(void)s;
	bad_weight(-1.0f, "w-neg", "weight -1: must be finite and >= 0");
}

/* Three or more peers, rank 2 with a NaN: every rank returns 0 with the
 * exact mean the job describes, and rank 2's mp_last_error says @said. */
static void nonfinite_job(struct job *j, const char *said)
{
	struct report rep[MAXP];

	launch(j, rep);
	for (int r = 0; r < j->npeers; r++) {
		if (rep[r].rc || !rep[r].exact)
			fail_msg("rank %d: rc %d, exact %d, \"%s\"", r, rep[r].rc, rep[r].exact, rep[r].err);
	}
	assert_non_null(strstr(rep[2].err, said));
}

/*
 * MP_CHECK_FINITE=1, three peers in one group, rank 2 with a NaN in part 0:
 * rank 0, part 0's reducer, leaves rank 2's contribution to it out and
 * tells rank 2; every peer, rank 2 included, holds the exact weighted mean
 * of the finite contributions (part 0 of ranks 0 and 1, the rest of all
 * three), and rank 2's mp_last_error says its contribution was left out.
 */
static void nonfinite_left_out(void **s)
{
	/* 1 KiB chunks: 999 values are more than one, so no direct exchange. */
	struct job j = {.name = "finite", .npeers = 3, .count = 999,
			.base = {.check_finite = 1, .chunk_bytes = 1024}, .nan_rank = 2};

	(void)s;
	nonfinite_job(&j, "contribution was left out of the average by its reducers: it holds "
			  "NaN or infinity (MP_CHECK_FINITE)");
}

/*
 * The same through the direct exchange (999 values in one 4 KiB chunk):
 * every member, rank 2 itself included, leaves all of rank 2's values out
 * and holds the exact weighted mean of ranks 0 and 1; rank 2 is told why.
 */
static void nonfinite_left_out_direct(void **s)
{
	struct job j = {.name = "finite-d", .npeers = 3, .count = 999, .base = {.check_finite = 1},
			.nan_rank = 2, .nan_whole = 1};

	(void)s;
	nonfinite_job(&j, "contribution was left out of the average by every member (direct "
			  "exchange): it holds NaN or infinity");
}

/* The same through the pairwise exchange (4 peers, MP_DIRECT_PAIRS=1):
 * rank 2 sends an empty sum, so every member holds the mean of the others. */
static void nonfinite_left_out_pairs(void **s)
{
	struct job j = {.name = "finite-p", .npeers = 4, .count = 999,
			.base = {.check_finite = 1, .direct_pairs = 1}, .nan_rank = 2, .nan_whole = 1};

	(void)s;
	nonfinite_job(&j, "contribution was left out of the average by every member (pairwise "
			  "exchange): it holds NaN or infinity");
}

/* The same harness with nothing apart: every peer averages. */
static void agreeing_peers_average(void **s)
{
	struct job j = {.name = "agree", .npeers = 4, .count = 1000, .base = {.grid = "2x2"}};
	struct report rep[4];

	(void)s;
	launch(&j, rep);
	for (int r = 0; r < 4; r++) {
		assert_int_equal(rep[r].rc, 0);
		assert_int_equal(rep[r].peers, 4);
		assert_false(rep[r].unchanged);
	}
}

/*
 * The price of not copying every time (context.c, undo_copy_needed): an
 * average takes no copy of its buffer once every later groupmate's
 * handshake agreed and its OPEN agreed on this same length over the same
 * connection; a groupmate that alone changed its length then cannot end the
 * average with the buffer as it was. After a warm-up average of 1024
 * values that every peer agrees on, ranks 2 and 3 average 2048 and ranks 0
 * and 1 1024 again. Round 0 averages both pairs. In round 1, ranks 0 and 1
 * (no copy: 1024 agreed before) drop their groupmate as a failed peer and
 * return 0 with their pair's exact mean (peers 2, one failed peer); ranks 2
 * and 3 (2048 is new: copied) fail -EMSGSIZE with their buffers as passed.
 * Nobody returns -EMSGSIZE over a changed buffer.
 */
static void later_round_count_warm(void **s)
{
	struct job j = {.name = "later-warm", .npeers = 4, .count = 1024, .warm = 1,
			.base = {.grid = "2x2", .mean_of = 1u << 0 | 1u << 1}};
	struct report rep[4];

	(void)s;
	j.odd[2] = j.odd[3] = (struct peer_cfg){.count = 2048};
	j.odd_set[2] = j.odd_set[3] = 1;
	launch(&j, rep);
	for (int r = 0; r < 4; r++)
		fprintf(stderr, "rank %d: rc %d, peers %d, failed %d, exact %d, unchanged %d, \"%s\"\n",
			r, rep[r].rc, rep[r].peers, rep[r].failed_peers, rep[r].exact,
			rep[r].unchanged, rep[r].err);
	for (int r = 0; r < 2; r++) {
		assert_int_equal(rep[r].rc, 0);
		assert_int_equal(rep[r].peers, 2);
		assert_int_equal(rep[r].failed_peers, 1);
		assert_true(rep[r].exact);
		/* Its round's only other member (the WARN line says why it was
		 * dropped): round 3 reached nobody, the average stands on round 2
		 * (rounds 0 and 1 were the warm-up's). */
		assert_string_equal(rep[r].err, "round 3: every other member failed: no values "
						"reached this peer");
	}
	for (int r = 2; r < 4; r++) {
		assert_int_equal(rep[r].rc, -EMSGSIZE);
		assert_true(rep[r].unchanged);
		assert_non_null(strstr(rep[r].err, "group all-reduce round 3: peer "));
		assert_non_null(strstr(rep[r].err, "averages 1024 values, this peer 2048"));
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(agreeing_peers_average),
		cmocka_unit_test(differ_algorithm),
		cmocka_unit_test(differ_grid),
		cmocka_unit_test(differ_rounds),
		cmocka_unit_test(differ_codec),
		cmocka_unit_test(differ_codec_parameter),
		cmocka_unit_test(differ_chunk),
		cmocka_unit_test(differ_streams),
		cmocka_unit_test(differ_npeers),
		cmocka_unit_test(differ_bandwidths),
		cmocka_unit_test(differ_min_part),
		cmocka_unit_test(differ_check_finite),
		cmocka_unit_test(differ_direct_pairs),
		cmocka_unit_test(issue_grid_4_against_2x2),
		cmocka_unit_test(later_round_settings_one_peer),
		cmocka_unit_test(later_round_settings_all),
		cmocka_unit_test(later_round_count),
		cmocka_unit_test(later_round_count_warm),
		cmocka_unit_test(count_differs_moshpit),
		cmocka_unit_test(count_differs_topk),
		cmocka_unit_test(count_differs_ring),
		cmocka_unit_test(count_differs_in_a_group_of_three),
		cmocka_unit_test(flags_differ_moshpit),
		cmocka_unit_test(flags_differ_ring),
		cmocka_unit_test(flags_differ_in_a_group_of_four),
		cmocka_unit_test(flags_alike_average),
		cmocka_unit_test(weight_nan),
		cmocka_unit_test(weight_inf),
		cmocka_unit_test(weight_negative),
		cmocka_unit_test(nonfinite_left_out),
		cmocka_unit_test(nonfinite_left_out_direct),
		cmocka_unit_test(nonfinite_left_out_pairs),
	};
	signal(SIGPIPE, SIG_IGN);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
