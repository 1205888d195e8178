/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * One group all-reduce under churn: peers stall or cut their connections at
 * the scatter or the gather phase (MP_FAULT), one is killed outright (a
 * forked process), and clients and aux members take part (an aux member
 * contributes at the weight 0 it passes and takes the results like any
 * other member). Every survivor's
 * buffer is checked bit for bit, part by part, against a replay of the
 * contribution logs in fp32 with the library's summation order: a reduced
 * part is the weighted mean of exactly the contributions its reducer logged
 * (whose weights must be the contributors' own), an applied part is its
 * reducer's result, any other part the peer's own values. The scenarios
 * also pin down who must and who must not be among the contributions.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <moshpit/moshpit.h>

#include "core.h"
#include "xfer.h"
#include "proc_io.h"

#define MAXP 8
#define MAXR 4
#define CHUNK_BYTES 256 /* 64 values per chunk: several chunks per part */

/* ---- inputs ---------------------------------------------------------------- */

/* Values and weights with full mantissas, so that every sum rounds and a
 * different summation order would show. */
static float input(int rank, size_t i)
{
	uint64_t h = ((uint64_t)rank + 1) * 0x9e3779b97f4a7c15ull ^ ((uint64_t)i + 1) * 0xbf58476d1ce4e5b9ull;

	h ^= h >> 31;
	h *= 0x94d049bb133111ebull;
	h ^= h >> 29;
	return ((float)(h >> 40) / 16777216.0f - 0.5f) * 8.0f;
}

static float weight0(int rank)
{
	return 0.37f + 0.61f * (float)rank;
}

/* The weight a peer passes: an aux peer has no values of its own and must
 * pass 0 (MP_MODE_AUX in moshpit.h, doc/control-plane.md). */
static float weight_in(const uint8_t *modes, int rank)
{
	return modes && modes[rank] == MP_MODE_AUX ? 0.0f : weight0(rank);
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* ---- the contribution log, parsed strictly ---------------------------------- */

struct lmember {
	uint64_t id, len;
	char mode;
};

struct lround {
	int begun, alone, ended, reduced;
	uint32_t group;
	int index, size;
	float weight, end_weight, wsum;
	struct lmember ro[MAXP];
	uint64_t roff, rlen;
	int nc;
	uint64_t cid[MAXP];
	float cw[MAXP];
	int status[MAXP]; /* -1: no apply line, 0 own, 1 applied */
};

struct plog {
	int present;
	struct lround r[MAXR];
};

/* Each line is rebuilt with the documented format and must match exactly. */
static void same_line(const char *got, const char *rebuilt)
{
	if (strcmp(got, rebuilt))
		fail_msg("log line\n  %s\nis not in the documented format:\n  %s", got, rebuilt);
}

static float hexf(const char *s, char **end)
{
	double d = strtod(s, end);

	assert_true(*end != s);
	assert_true((double)(float)d == d);
	return (float)d;
}

static struct lround *round_of(struct plog *pl, unsigned rnd)
{
	assert_true(rnd < MAXR);
	return &pl->r[rnd];
}

static void parse_line(struct plog *pl, const char *l, uint64_t self)
{
	char rb[4096], *end;
	unsigned rnd, grp;
	unsigned long long a, b;
	int n = 0, i1, i2;
	size_t o;
	struct lround *lr;

	if (!strncmp(l, "begin ", 6)) {
		assert_int_equal(sscanf(l, "begin round=%u group=%x self=%llx index=%d size=%d weight=%n", &rnd,
					&grp, &a, &i1, &i2, &n),
				 5);
		lr = round_of(pl, rnd);
		assert_false(lr->begun);
		assert_true(a == self && i2 >= 2 && i2 <= MAXP && i1 >= 0 && i1 < i2);
		lr->begun = 1;
		lr->group = grp;
		lr->index = i1;
		lr->size = i2;
		lr->weight = hexf(l + n, &end);
		for (int m = 0; m < MAXP; m++)
			lr->status[m] = -1;
		assert_int_equal(strncmp(end, " roster=", 8), 0);
		const char *p = end + 8;
		o = (size_t)snprintf(rb, sizeof(rb), "begin round=%u group=%08x self=%016llx index=%d size=%d weight=%a roster=",
				     rnd, grp, a, i1, i2, (double)lr->weight);
		for (int m = 0; m < i2; m++) {
			char c;
			assert_int_equal(sscanf(p, "%llx:%llu:%c%n", &a, &b, &c, &n), 3);
			assert_true(c == 'n' || c == 'c' || c == 'a');
			lr->ro[m] = (struct lmember){a, b, c};
			p += n;
			if (m + 1 < i2)
				assert_true(*p++ == ',');
			o += (size_t)snprintf(rb + o, sizeof(rb) - o, "%s%016llx:%llu:%c", m ? "," : "", a, b, c);
		}
		same_line(l, rb);
	} else if (!strncmp(l, "reduce ", 7)) {
		assert_int_equal(sscanf(l, "reduce round=%u group=%x part=%d off=%llu len=%llu wsum=%n", &rnd, &grp,
					&i1, &a, &b, &n),
				 5);
		lr = round_of(pl, rnd);
		assert_true(lr->begun && !lr->reduced && grp == lr->group && i1 == lr->index);
		lr->reduced = 1;
		lr->roff = a;
		lr->rlen = b;
		lr->wsum = hexf(l + n, &end);
		assert_int_equal(strncmp(end, " contrib=", 9), 0);
		const char *p = end + 9;
		o = (size_t)snprintf(rb, sizeof(rb), "reduce round=%u group=%08x part=%d off=%llu len=%llu wsum=%a contrib=",
				     rnd, grp, i1, a, b, (double)lr->wsum);
		lr->nc = 0;
		while (*p) {
			assert_true(lr->nc < MAXP);
			assert_int_equal(sscanf(p, "%llx:%n", &a, &n), 1);
			lr->cid[lr->nc] = a;
			lr->cw[lr->nc] = hexf(p + n, &end);
			o += (size_t)snprintf(rb + o, sizeof(rb) - o, "%s%016llx:%a", lr->nc ? "," : "", a,
					      (double)lr->cw[lr->nc]);
			lr->nc++;
			p = end;
			if (*p)
				assert_true(*p++ == ',');
		}
		same_line(l, rb);
	} else if (!strncmp(l, "apply ", 6)) {
		char st[16];
		assert_int_equal(sscanf(l, "apply round=%u group=%x part=%d status=%15s", &rnd, &grp, &i1, st), 4);
		lr = round_of(pl, rnd);
		assert_true(lr->begun && !lr->ended && grp == lr->group && i1 >= 0 && i1 < lr->size);
		assert_true(lr->status[i1] == -1);
		assert_true(!strcmp(st, "applied") || !strcmp(st, "own"));
		lr->status[i1] = !strcmp(st, "applied");
		snprintf(rb, sizeof(rb), "apply round=%u group=%08x part=%d status=%s", rnd, grp, i1, st);
		same_line(l, rb);
	} else if (!strncmp(l, "end ", 4)) {
		assert_int_equal(sscanf(l, "end round=%u group=%x weight=%n", &rnd, &grp, &n), 2);
		lr = round_of(pl, rnd);
		assert_true(lr->begun && !lr->ended && grp == lr->group);
		lr->ended = 1;
		lr->end_weight = hexf(l + n, &end);
		snprintf(rb, sizeof(rb), "end round=%u group=%08x weight=%a", rnd, grp, (double)lr->end_weight);
		same_line(l, rb);
	} else {
		assert_int_equal(sscanf(l, "alone round=%u", &rnd), 1);
		lr = round_of(pl, rnd);
		assert_false(lr->begun || lr->alone);
		lr->alone = 1;
		snprintf(rb, sizeof(rb), "alone round=%u", rnd);
		same_line(l, rb);
	}
}

static void read_log(const char *path, struct plog *pl, uint64_t self)
{
	static char line[1 << 16];
	FILE *f = fopen(path, "r");

	memset(pl, 0, sizeof(*pl));
	if (!f)
		return;
	pl->present = 1;
	while (fgets(line, sizeof(line), f)) {
		size_t len = strlen(line);
		/* One write per line: never a partial one, even from a killed peer. */
		assert_true(len > 0 && line[len - 1] == '\n');
		line[len - 1] = '\0';
		parse_line(pl, line, self);
	}
	fclose(f);
}

/* ---- replay ------------------------------------------------------------------ */

struct world {
	int npeers;
	size_t count;
	const uint8_t *modes; /* NULL: every peer normal */
	int codec;            /* enum mp_codec of the run (0: none) */
	struct plog log[MAXP];
	float *x[MAXP], *nx[MAXP]; /* values at the start of the round being replayed, and after */
	float w[MAXP], nw[MAXP];
};

static int rank_of(const struct world *wd, uint64_t id)
{
	/* Static runs: the id is the rank. */
	assert_true(id < (uint64_t)wd->npeers);
	return (int)id;
}

static uint64_t part_off(const struct lround *lr, int j)
{
	uint64_t o = 0;

	for (int m = 0; m < j; m++)
		o += lr->ro[m].len;
	return o;
}

/* The result of reducer q's part in round t, from the values at the round's start. */
/* x through the run's codec and back (element by element for fp16, so
 * the values need not be cut into the run's chunks). */
static void through_codec(const struct world *wd, float *x, size_t len)
{
	const struct mp_codec_ops *c = mp_codec_by_id((unsigned)wd->codec);
	struct mp_codec_params cp;
	size_t cap, elen = 0;

	if (wd->codec == MP_CODEC_NONE)
		return;
	memset(&cp, 0, sizeof(cp));
	assert_non_null(c);
	assert_null(c->scratch_size);
	cap = c->max_encoded(&cp, len);
	void *e = malloc(cap);
	assert_non_null(e);
	assert_int_equal(c->encode(&cp, x, NULL, len, e, cap, &elen, NULL), 0);
	assert_int_equal(c->decode(e, elen, x, len), 0);
	free(e);
}

/* Contributor c's values of the part at @off as reducer q has them: its
 * own as they are, another's as the wire's codec brought them. */
static float *contribution_at(const struct world *wd, int q, int c, size_t off, size_t len)
{
	float *v = malloc(len * sizeof(float));

	assert_non_null(v);
	memcpy(v, wd->x[c] + off, len * sizeof(float));
	if (c != q)
		through_codec(wd, v, len);
	return v;
}

static void reduce_result(const struct world *wd, int q, int t, float *out)
{
	const struct lround *lr = &wd->log[q].r[t];
	const size_t off = lr->roff, len = lr->rlen;
	float wsum = 0.0f;
	float *v[MAXP];
	int last = -1, self_in = 0;

	assert_true(lr->reduced);
	assert_true(off == part_off(lr, lr->index) && len == lr->ro[lr->index].len);
	for (int i = 0; i < lr->nc; i++) {
		int c = rank_of(wd, lr->cid[i]), m = -1;
		for (int k = 0; k < lr->size; k++)
			if (lr->ro[k].id == lr->cid[i])
				m = k;
		/* A member of the group (an aux one too: it contributes at its
		 * own weight, 0 in its first round), in member order, with its
		 * own weight. */
		assert_true(m > last);
		last = m;
		self_in |= m == lr->index;
		if (memcmp(&lr->cw[i], &wd->w[c], sizeof(float)))
			fail_msg("round %d: reducer %d logged weight %a for peer %d, whose weight is %a", t, q,
				 (double)lr->cw[i], c, (double)wd->w[c]);
		wsum += lr->cw[i];
		v[i] = contribution_at(wd, q, c, off, len);
	}
	/* Every reducer, aux or not, counts its own contribution. */
	assert_true(self_in);
	assert_true(!memcmp(&wsum, &lr->wsum, sizeof(float)));
	if (wsum == 0.0f) {
		memcpy(out, wd->x[q] + off, len * sizeof(float));
	} else if (lr->nc == 1) {
		memcpy(out, v[0], len * sizeof(float));
	} else {
		/* fp32, rounding the product before the add, in member order. */
		float inv = 1.0f / wsum;
		for (size_t i = 0; i < len; i++) {
			volatile float acc = lr->cw[0] * v[0][i];
			for (int c = 1; c < lr->nc; c++) {
				volatile float p = lr->cw[c] * v[c][i];
				acc = acc + p;
			}
			out[i] = acc * inv;
		}
		/* A result that goes to other members is what they decode,
		 * and the reducer keeps that too. */
		through_codec(wd, out, len);
	}
	for (int i = 0; i < lr->nc; i++)
		free(v[i]);
}

/* Peer p's values and weight after round t. */
static void replay_peer(struct world *wd, int p, int t)
{
	const struct lround *lr = &wd->log[p].r[t];
	const int me = lr->index;
	int first = -1;

	memcpy(wd->nx[p], wd->x[p], wd->count * sizeof(float));
	wd->nw[p] = wd->w[p];
	if (lr->alone || !lr->begun)
		return;
	assert_true(lr->ended);
	assert_true(lr->ro[me].id == (uint64_t)p);
	assert_true(!memcmp(&lr->weight, &wd->w[p], sizeof(float)));
	uint64_t total = 0;
	for (int m = 0; m < lr->size; m++) {
		total += lr->ro[m].len;
		/* Every member logged the same roster for the group. */
		int q = rank_of(wd, lr->ro[m].id);
		const struct lround *lq = &wd->log[q].r[t];
		if (lq->begun) {
			assert_true(lq->group == lr->group && lq->size == lr->size && lq->index == m);
			for (int i = 0; i < lr->size; i++)
				assert_true(lq->ro[i].id == lr->ro[i].id && lq->ro[i].len == lr->ro[i].len &&
					    lq->ro[i].mode == lr->ro[i].mode);
		}
		if (lr->ro[m].mode == 'c')
			assert_true(lr->ro[m].len == 0);
	}
	assert_true(total == wd->count);
	assert_true(lr->reduced == (lr->ro[me].len > 0));
	/* Every mode takes the results, aux included. */
	if (lr->reduced)
		reduce_result(wd, p, t, wd->nx[p] + lr->roff);
	for (int j = 0; j < lr->size; j++) {
		int expect = j != me && lr->ro[j].len > 0;
		assert_true((lr->status[j] >= 0) == expect);
		if (lr->status[j] != 1)
			continue;
		int q = rank_of(wd, lr->ro[j].id);
		reduce_result(wd, q, t, wd->nx[p] + part_off(lr, j));
		if (first < 0)
			first = q;
	}
	if (lr->reduced && lr->nc)
		wd->nw[p] = lr->wsum / (float)lr->nc;
	else if (first >= 0)
		wd->nw[p] = wd->log[first].r[t].wsum / (float)wd->log[first].r[t].nc;
	if (memcmp(&wd->nw[p], &lr->end_weight, sizeof(float)))
		fail_msg("round %d: peer %d logged weight %a, expected %a", t, p, (double)lr->end_weight,
			 (double)wd->nw[p]);
}

/* Replay every round; then each survivor's buffer and weight must match bit for bit. */
static void replay_and_check(struct world *wd, float *const *out, const float *wout, const int *survivor)
{
	for (int p = 0; p < wd->npeers; p++) {
		wd->x[p] = malloc(wd->count * sizeof(float));
		wd->nx[p] = malloc(wd->count * sizeof(float));
		for (size_t i = 0; i < wd->count; i++)
			wd->x[p][i] = input(p, i);
		wd->w[p] = weight_in(wd->modes, p);
	}
	for (int t = 0; t < MAXR; t++) {
		/* The dead stay as they were (nobody can have used them later). */
		for (int p = 0; p < wd->npeers; p++)
			if (survivor[p])
				replay_peer(wd, p, t);
			else
				memcpy(wd->nx[p], wd->x[p], wd->count * sizeof(float));
		for (int p = 0; p < wd->npeers; p++) {
			float *tmp = wd->x[p];
			wd->x[p] = wd->nx[p];
			wd->nx[p] = tmp;
			wd->w[p] = wd->nw[p];
		}
	}
	for (int p = 0; p < wd->npeers; p++) {
		if (!survivor[p])
			continue;
		for (size_t i = 0; i < wd->count; i++) {
			assert_false(isnan(out[p][i]));
			if (memcmp(&out[p][i], &wd->x[p][i], sizeof(float)))
				fail_msg("peer %d value %zu: %a, replay says %a", p, i, (double)out[p][i],
					 (double)wd->x[p][i]);
		}
		if (memcmp(&wout[p], &wd->w[p], sizeof(float)))
			fail_msg("peer %d weight %a, replay says %a", p, (double)wout[p], (double)wd->w[p]);
	}
	for (int p = 0; p < wd->npeers; p++) {
		free(wd->x[p]);
		free(wd->nx[p]);
	}
}

/* Queries for the scenarios' own expectations (round t). */
static int used_by(const struct world *wd, int t, int reducer, int who)
{
	const struct lround *lr = &wd->log[reducer].r[t];

	assert_true(lr->reduced);
	for (int i = 0; i < lr->nc; i++)
		if (lr->cid[i] == (uint64_t)who)
			return 1;
	return 0;
}

/* Status of member q's part at peer p: 1 applied, 0 own. */
static int applied(const struct world *wd, int t, int p, int q)
{
	const struct lround *lr = &wd->log[p].r[t];

	for (int j = 0; j < lr->size; j++)
		if (lr->ro[j].id == (uint64_t)q) {
			assert_true(lr->status[j] >= 0);
			return lr->status[j];
		}
	fail_msg("peer %d is not in peer %d's group in round %d", q, p, t);
	return -1;
}

/* ---- threads on the loop transport -------------------------------------- */

struct scenario {
	const char *name;
	int npeers;
	const char *grid;
	size_t count;
	const char *fault[MAXP];
	int round_ms, deadline_ms;
	int deadline_extra_ms[MAXP]; /* per peer: added to deadline_ms */
	int connect_ms; /* 0: 5000 */
	int codec;      /* enum mp_codec: 0, none; else one the replay knows (fp16) */
	/* direct: one mp_group_allreduce with this roster (static runs cannot
	 * have client or aux peers: a roster can) */
	const uint8_t *modes;
	const double *bw;
};

struct shared {
	const struct scenario *sc;
	pthread_barrier_t bar;
	char dir[64];
	char addr[MAXP][MP_ADDR_STRLEN];
	float *out[MAXP];
	float wout[MAXP];
	struct mp_result res[MAXP];
	int rc[MAXP];
	double seconds[MAXP];
};

struct arg {
	struct shared *sh;
	int rank;
};

static void log_path(const char *dir, int rank, char *buf, size_t len)
{
	snprintf(buf, len, "%s/peer%d.log", dir, rank);
}

static int direct_round(mp_ctx *ctx, const struct scenario *sc, int rank, float *buf, struct mp_result *res,
			float *wout)
{
	int members[MAXP];
	mp_mr *mr;
	int rc;

	for (int m = 0; m < sc->npeers; m++)
		members[m] = m;
	struct mp_group g = {.id = 0x5eed0001u, .size = sc->npeers, .my_index = rank, .members = members,
			     .bw = sc->bw, .mode = sc->modes};
	rc = mp_mem_register(ctx, buf, sc->count * sizeof(float), MP_MEM_HOST, &mr);
	if (rc)
		return rc;
	struct mp_avg a = {.x = buf, .n = sc->count, .weight = weight_in(sc->modes, rank), .dmr = mr->dmr, .res = res,
			   .influence = 1, .codec = mp_codec_by_id(MP_CODEC_NONE)};
	/* The progress thread is idle: this thread runs the round in its place. */
	rc = mp_group_allreduce(ctx, &g, 0, &a);
	*wout = a.weight;
	mp_mem_deregister(ctx, mr);
	return rc;
}

static void *peer_main(void *p)
{
	struct arg *a = p;
	struct shared *sh = a->sh;
	const struct scenario *sc = sh->sc;
	struct mp_config cfg;
	mp_ctx *ctx = NULL;
	char run[64], path[128];
	int rc;

	snprintf(run, sizeof(run), "churn-%s", sc->name);
	log_path(sh->dir, a->rank, path, sizeof(path));
	mp_config_init(&cfg);
	cfg.transport = "loop";
	cfg.run_name = run;
	cfg.rank = a->rank;
	cfg.npeers = sc->npeers;
	cfg.grid = sc->grid;
	cfg.chunk_bytes = CHUNK_BYTES;
	cfg.connect_timeout_ms = sc->connect_ms ? sc->connect_ms : 5000;
	cfg.round_timeout_ms = sc->round_ms;
	cfg.allreduce_timeout_ms = sc->deadline_ms + sc->deadline_extra_ms[a->rank];
	cfg.contrib_log = path;
	cfg.fault = sc->fault[a->rank];
	cfg.codec = sc->codec;
	rc = mp_init(&cfg, &ctx);
	if (!rc)
		mp_local_address(ctx, sh->addr[a->rank], MP_ADDR_STRLEN);
	pthread_barrier_wait(&sh->bar);
	const char *addrs[MAXP];
	for (int i = 0; i < sc->npeers; i++)
		addrs[i] = sh->addr[i];
	if (!rc)
		rc = mp_set_peers(ctx, addrs, sc->npeers);
	float *buf = sh->out[a->rank];
	for (size_t i = 0; i < sc->count; i++)
		buf[i] = input(a->rank, i);
	double t0 = now_s();
	if (!rc && sc->modes)
		rc = direct_round(ctx, sc, a->rank, buf, &sh->res[a->rank], &sh->wout[a->rank]);
	else if (!rc) {
		rc = mp_average(ctx, buf, sc->count, weight_in(sc->modes, a->rank), &sh->res[a->rank]);
		sh->wout[a->rank] = sh->res[a->rank].weight;
	}
	sh->seconds[a->rank] = now_s() - t0;
	sh->rc[a->rank] = rc;
	/* Nobody leaves before everyone is done: a departure would look like
	 * a failure to the others. */
	pthread_barrier_wait(&sh->bar);
	mp_finalize(ctx);
	return NULL;
}

typedef void (*check_fn)(const struct scenario *sc, struct shared *sh, struct world *wd);

static void run(const struct scenario *sc, check_fn check)
{
	struct shared sh = {.sc = sc};
	struct world *wd = calloc(1, sizeof(*wd));
	pthread_t th[MAXP];
	struct arg args[MAXP];
	int survivor[MAXP];
	char path[128];

	assert_true(sc->npeers <= MAXP);
	snprintf(sh.dir, sizeof(sh.dir), "/tmp/mp-churn-XXXXXX");
	assert_non_null(mkdtemp(sh.dir));
	pthread_barrier_init(&sh.bar, NULL, (unsigned)sc->npeers);
	for (int r = 0; r < sc->npeers; r++) {
		sh.out[r] = malloc(sc->count * sizeof(float));
		args[r] = (struct arg){&sh, r};
		assert_int_equal(pthread_create(&th[r], NULL, peer_main, &args[r]), 0);
	}
	for (int r = 0; r < sc->npeers; r++)
		pthread_join(th[r], NULL);
	wd->npeers = sc->npeers;
	wd->count = sc->count;
	wd->modes = sc->modes;
	wd->codec = sc->codec;
	for (int r = 0; r < sc->npeers; r++) {
		/* Stalling or cutting peers survive too: they must hold the
		 * right values like everyone else. */
		if (sh.rc[r] && sh.rc[r] != -EHOSTUNREACH)
			fail_msg("%s: peer %d failed: %s", sc->name, r, mp_strerror(sh.rc[r]));
		survivor[r] = 1;
		log_path(sh.dir, r, path, sizeof(path));
		read_log(path, &wd->log[r], (uint64_t)r);
		assert_true(wd->log[r].present);
	}
	replay_and_check(wd, sh.out, sh.wout, survivor);
	if (check)
		check(sc, &sh, wd);
	for (int r = 0; r < sc->npeers; r++) {
		log_path(sh.dir, r, path, sizeof(path));
		unlink(path);
		free(sh.out[r]);
	}
	rmdir(sh.dir);
	pthread_barrier_destroy(&sh.bar);
	free(wd);
}

/* Reducers among @good (round t, one group) used every member of @good and
 * none of @excluded; each of @good applied the parts of the others in @good
 * and none of @lost's parts. Lists end with -1. */
static void expect_parts(const struct world *wd, int t, const int *good, const int *excluded, const int *lost)
{
	for (const int *r = good; *r >= 0; r++) {
		for (const int *c = good; *c >= 0; c++)
			if (!used_by(wd, t, *r, *c))
				fail_msg("round %d: reducer %d left out peer %d, which delivered", t, *r, *c);
		for (const int *c = excluded; *c >= 0; c++)
			if (used_by(wd, t, *r, *c))
				fail_msg("round %d: reducer %d used peer %d, which cannot have delivered", t, *r, *c);
		for (const int *q = good; *q >= 0; q++)
			if (*q != *r && !applied(wd, t, *r, *q))
				fail_msg("round %d: peer %d did not apply peer %d's part", t, *r, *q);
		for (const int *q = lost; *q >= 0; q++)
			if (applied(wd, t, *r, *q))
				fail_msg("round %d: peer %d applied peer %d's part, which cannot be whole", t, *r, *q);
	}
}

/* 4 peers, parts of 750 values (12 chunks): peer 2 stops sending after 3
 * contributions, so nobody counts it and nobody gets its part. */
static void check_stall_scatter(const struct scenario *sc, struct shared *sh, struct world *wd)
{
	(void)sc;
	expect_parts(wd, 0, (const int[]){0, 1, 3, -1}, (const int[]){2, -1}, (const int[]){2, -1});
	/* Its own part still got everyone's values. */
	for (int c = 0; c < 4; c++)
		assert_true(used_by(wd, 0, 2, c));
	assert_true(sh->res[0].failed_peers >= 1);
}

static void stall_at_scatter(void **s)
{
	(void)s;
	struct scenario sc = {.name = "stall-scatter", .npeers = 4, .grid = "4", .count = 3000,
			      .fault = {[2] = "stall:round=0:phase=scatter:after=3"}, .round_ms = 400,
			      .deadline_ms = 20000};
	run(&sc, check_stall_scatter);
}

/* Peer 1 cuts every connection after 2 result chunks of 12: its part is
 * nobody's; the others' parts are whole everywhere. */
static void check_cut_gather(const struct scenario *sc, struct shared *sh, struct world *wd)
{
	(void)sc;
	(void)sh;
	expect_parts(wd, 0, (const int[]){0, 2, 3, -1}, (const int[]){-1}, (const int[]){1, -1});
}

static void cut_at_gather(void **s)
{
	(void)s;
	struct scenario sc = {.name = "cut-gather", .npeers = 4, .grid = "4", .count = 3000,
			      .fault = {[1] = "cut:round=0:phase=gather:after=2"}, .round_ms = 400,
			      .deadline_ms = 20000};
	run(&sc, check_cut_gather);
}

/* The same with fp16: a lossy codec's results are decoded straight into
 * the buffer (group_allreduce.c, MP_SCR_STAGE), so the first chunks of
 * peer 1's part land there before the cut; peers 0, 2 and 3 must still end
 * with their own values of that part, bit for bit. */
static void cut_at_gather_fp16(void **s)
{
	(void)s;
	struct scenario sc = {.name = "cut-gather-fp16", .npeers = 4, .grid = "4", .count = 3000,
			      .fault = {[1] = "cut:round=0:phase=gather:after=2"}, .round_ms = 400,
			      .deadline_ms = 20000, .codec = MP_CODEC_FP16};
	run(&sc, check_cut_gather);
}

/* Peer 3 never sends to peer 0 (and only to it): 0 leaves 3 out and keeps
 * its own values of 3's part; 1 and 2 count 3 and take its part. */
static void check_stall_one_peer(const struct scenario *sc, struct shared *sh, struct world *wd)
{
	(void)sc;
	(void)sh;
	assert_false(used_by(wd, 0, 0, 3));
	assert_int_equal(applied(wd, 0, 0, 3), 0);
	expect_parts(wd, 0, (const int[]){1, 2, 3, -1}, (const int[]){-1}, (const int[]){-1});
	assert_true(used_by(wd, 0, 1, 0) && used_by(wd, 0, 2, 0));
	assert_int_equal(applied(wd, 0, 0, 1), 1);
	assert_int_equal(applied(wd, 0, 0, 2), 1);
}

static void stall_toward_one_peer(void **s)
{
	(void)s;
	struct scenario sc = {.name = "stall-peer", .npeers = 4, .grid = "4", .count = 3000,
			      .fault = {[3] = "stall:round=0:phase=scatter:peer=0"}, .round_ms = 400,
			      .deadline_ms = 20000};
	run(&sc, check_stall_one_peer);
}

/* 8 peers, parts of 375 values (6 chunks): peer 7 cuts everything after 4
 * contributions, peer 2 stalls after its first result chunk, so the members
 * wait for the rest of it until the deadline. A connection to the cutter
 * still in its handshake at the cut is never made: its dialer waits the
 * connect timeout, well within the deadline. */
static void check_two_faults(const struct scenario *sc, struct shared *sh, struct world *wd)
{
	(void)sc;
	(void)sh;
	expect_parts(wd, 0, (const int[]){0, 1, 3, 4, 5, 6, -1}, (const int[]){7, -1}, (const int[]){2, 7, -1});
}

static void two_faults_of_eight(void **s)
{
	(void)s;
	struct scenario sc = {.name = "two-of-eight", .npeers = 8, .grid = "8", .count = 3000,
			      .fault = {[2] = "stall:round=0:phase=gather:after=1",
					[7] = "cut:round=0:phase=scatter:after=4"},
			      .round_ms = 400, .deadline_ms = 2000, .connect_ms = 800};
	run(&sc, check_two_faults);
}

/* Two rounds on a 4x2 grid (groups {0..3}, {4..7}, then {r, r+4}) with
 * faults in the second, which starts from the first's results (replayed
 * too). Static rounds are not synchronised: a fault that held a group up
 * for a silence timeout would make its members look silent to their next
 * groups, so the faults come in the last round. */
static void check_two_rounds(const struct scenario *sc, struct shared *sh, struct world *wd)
{
	(void)sc;
	(void)sh;
	expect_parts(wd, 0, (const int[]){0, 1, 2, 3, -1}, (const int[]){-1}, (const int[]){-1});
	expect_parts(wd, 0, (const int[]){4, 5, 6, 7, -1}, (const int[]){-1}, (const int[]){-1});
	expect_parts(wd, 1, (const int[]){0, 4, -1}, (const int[]){-1}, (const int[]){-1});
	expect_parts(wd, 1, (const int[]){1, 5, -1}, (const int[]){-1}, (const int[]){-1});
	/* Peer 6 cut before its first result; peer 7 stalled after 3 of 16
	 * contributions, so peer 3 was alone in round 1. */
	assert_int_equal(applied(wd, 1, 2, 6), 0);
	assert_false(used_by(wd, 1, 3, 7));
	assert_int_equal(applied(wd, 1, 3, 7), 0);
	assert_true(used_by(wd, 1, 7, 3));
}

static void faults_over_two_rounds(void **s)
{
	(void)s;
	struct scenario sc = {.name = "two-rounds", .npeers = 8, .grid = "4x2", .count = 2000,
			      .fault = {[6] = "cut:round=1:phase=gather",
					[7] = "stall:round=1:phase=scatter:after=3"},
			      .round_ms = 400, .deadline_ms = 20000};
	run(&sc, check_two_rounds);
}

/* A silence timeout longer than the test: only the all-reduce deadline
 * ends the round. Every part waits for peer 1's contribution, so at the
 * deadline each reducer sums what it has (everyone but 1) and no result
 * can have left: every peer keeps its own values elsewhere. Peer 1's own
 * deadline comes 1.5 s later: were its deadline first, it would drop (and
 * close on) the others, who, told at once, would finish without it before
 * their own deadlines, a race of a few milliseconds that a loaded ASan run
 * once lost. */
static void check_deadline(const struct scenario *sc, struct shared *sh, struct world *wd)
{
	(void)sc;
	for (int r = 0; r < 4; r++) {
		if (r != 1) {
			for (int c = 0; c < 4; c++)
				assert_true(used_by(wd, 0, r, c) == (c != 1));
			assert_int_equal(sh->rc[r], 0);
		}
		for (int q = 0; q < 4; q++)
			if (q != r)
				assert_int_equal(applied(wd, 0, r, q), 0);
		if (sh->seconds[r] < 0.5 || sh->seconds[r] > 4.0)
			fail_msg("peer %d took %.2f s; the deadline is 0.6 s", r, sh->seconds[r]);
	}
}

static void deadline_ends_the_round(void **s)
{
	(void)s;
	struct scenario sc = {.name = "deadline", .npeers = 4, .grid = "4", .count = 3000,
			      .fault = {[1] = "stall:round=0:phase=scatter:after=2"}, .round_ms = 30000,
			      .deadline_ms = 600, .deadline_extra_ms = {[1] = 1500}};
	run(&sc, check_deadline);
}

/* ---- clients and aux members ------------------------------------------------ */

static const uint8_t modes4[] = {MP_MODE_NORMAL, MP_MODE_CLIENT, MP_MODE_AUX, MP_MODE_NORMAL};
static const double bw4[] = {1.0, 5.0, 1.0, 2.0};

/* The weighted mean of the non-aux peers' inputs (an aux peer passes
 * weight 0 and adds nothing), within fp32 rounding. */
static void expect_mean(const struct scenario *sc, struct shared *sh, const int *holders)
{
	double w = 0.0;

	for (int c = 0; c < sc->npeers; c++)
		w += weight_in(sc->modes, c);
	for (size_t i = 0; i < sc->count; i++) {
		double mean = 0.0;
		for (int c = 0; c < sc->npeers; c++)
			mean += weight_in(sc->modes, c) * (double)input(c, i);
		mean /= w;
		for (const int *p = holders; *p >= 0; p++)
			if (fabs(sh->out[*p][i] - mean) > 1e-5 * (1 + fabs(mean)))
				fail_msg("peer %d value %zu: %g, mean %g", *p, i, (double)sh->out[*p][i], mean);
	}
}

static void check_modes(const struct scenario *sc, struct shared *sh, struct world *wd)
{
	const struct lround *lr = &wd->log[0].r[0];
	uint64_t bytes[4], others = 0;

	/* The client reduces nothing despite its bandwidth; the aux reduces a
	 * part and began at weight 0. */
	assert_true(lr->ro[1].len == 0 && lr->ro[1].mode == 'c' && lr->ro[2].mode == 'a');
	assert_true(lr->ro[0].len > 0 && lr->ro[2].len > 0 && lr->ro[3].len > 0);
	assert_true(wd->log[2].r[0].weight == 0.0f && !signbit(wd->log[2].r[0].weight));
	for (int j = 0; j < 4; j++) {
		uint64_t frames = (lr->ro[j].len * sizeof(float) + CHUNK_BYTES - 1) / CHUNK_BYTES;
		bytes[j] = frames * MP_WIRE_HDR_SIZE + lr->ro[j].len * sizeof(float);
		others += bytes[j];
	}
	/* Every member, the aux one like the others, sends its values of
	 * every other part to its reducer and takes every other part's result
	 * back; a reducer takes three contributions to its part and returns
	 * three results. Every channel starts with an OPEN each way (a
	 * header): one from each of the three others. Nothing else either
	 * way. */
	for (int p = 0; p < 4; p++) {
		uint64_t expect = 3 * MP_WIRE_HDR_SIZE + (others - bytes[p]) + 3 * bytes[p];
		assert_int_equal(sh->res[p].bytes_received, expect);
		assert_int_equal(sh->res[p].bytes_sent, expect);
	}
	/* All four contributed to every part (the aux at weight 0), and every
	 * member applied every other part: the aux holds the group's values
	 * now, like the others. */
	expect_parts(wd, 0, (const int[]){0, 2, 3, -1}, (const int[]){-1}, (const int[]){-1});
	for (int r = 0; r < 4; r++) {
		if (r == 1)
			continue;
		assert_true(used_by(wd, 0, r, 1));
		assert_int_equal(wd->log[r].r[0].nc, 4);
	}
	for (int q = 0; q < 4; q++)
		if (q != 1)
			assert_int_equal(applied(wd, 0, 1, q), 1);
	/* Every peer, the aux too, leaves with the group's mean weight, Σ w in
	 * member order (the aux's 0 included) over four contributors. */
	volatile float wsum = weight0(0) + weight0(1);
	wsum = wsum + 0.0f;
	wsum = wsum + weight0(3);
	float wend = wsum / 4.0f;
	for (int p = 0; p < 4; p++)
		if (memcmp(&sh->wout[p], &wend, sizeof(float)))
			fail_msg("peer %d weight %a, the group's mean weight is %a", p, (double)sh->wout[p],
				 (double)wend);
	/* Every part is the exact weighted mean of the three peers with
	 * values (the aux's, at weight 0, add nothing), at every peer: the
	 * aux's buffer holds it too. */
	expect_mean(sc, sh, (const int[]){0, 1, 2, 3, -1});
	for (int p = 0; p < 4; p++)
		assert_int_equal(sh->rc[p], 0);
}

static void client_and_aux(void **s)
{
	(void)s;
	struct scenario sc = {.name = "modes", .npeers = 4, .count = 3001, .round_ms = 5000,
			      .deadline_ms = 20000, .modes = modes4, .bw = bw4};
	run(&sc, check_modes);
}

static const uint8_t modes6[] = {MP_MODE_NORMAL, MP_MODE_CLIENT, MP_MODE_AUX,
				 MP_MODE_NORMAL, MP_MODE_AUX,    MP_MODE_CLIENT};
static const double bw6[] = {1.0, 0.0, 3.0, 1.0, -1.0, 0.0};

/* Client 5 never sends anything: every reducer goes on without it, and it
 * keeps its own values and weight. The aux peers 2 and 4 contribute at
 * weight 0 and take the results like the others, so every peer but 5 ends
 * with the weighted mean of 0, 1 and 3. */
static void check_modes_fault(const struct scenario *sc, struct shared *sh, struct world *wd)
{
	const struct lround *lr = &wd->log[0].r[0];

	assert_true(lr->ro[2].mode == 'a' && lr->ro[4].mode == 'a');
	assert_true(lr->ro[1].len == 0 && lr->ro[5].len == 0);
	for (int r = 0; r < 5; r++)
		if (r != 1) {
			assert_true(lr->ro[r].len > 0);
			assert_false(used_by(wd, 0, r, 5));
			assert_true(used_by(wd, 0, r, 1));
			assert_int_equal(wd->log[r].r[0].nc, 5);
		}
	assert_true(wd->log[2].r[0].weight == 0.0f && wd->log[4].r[0].weight == 0.0f);
	expect_parts(wd, 0, (const int[]){0, 2, 3, 4, -1}, (const int[]){5, -1}, (const int[]){-1});
	for (int q = 0; q < 5; q++)
		if (q != 1) {
			assert_int_equal(applied(wd, 0, 1, q), 1);
			assert_int_equal(applied(wd, 0, 5, q), 0);
		}
	assert_int_equal(sh->rc[5], -EHOSTUNREACH);
	for (size_t i = 0; i < sc->count; i++)
		assert_true(sh->out[5][i] == input(5, i));
	assert_true(sh->wout[5] == weight0(5));
	/* Σ w in member order over the five that delivered, the aux's 0s
	 * included; every peer but 5 leaves with the mean of it. */
	volatile float wsum = weight0(0) + weight0(1);
	wsum = wsum + 0.0f;
	wsum = wsum + weight0(3);
	wsum = wsum + 0.0f;
	float wend = wsum / 5.0f;
	for (int p = 0; p < 5; p++)
		if (memcmp(&sh->wout[p], &wend, sizeof(float)))
			fail_msg("peer %d weight %a, the group's mean weight is %a", p, (double)sh->wout[p],
				 (double)wend);
	/* The mean of the peers with values that delivered: 0, 1, 3. */
	struct scenario without5 = *sc;
	without5.npeers = 5;
	expect_mean(&without5, sh, (const int[]){0, 1, 2, 3, 4, -1});
}

static void silent_client(void **s)
{
	(void)s;
	struct scenario sc = {.name = "modes-fault", .npeers = 6, .count = 2000, .round_ms = 400,
			      .deadline_ms = 20000, .modes = modes6, .bw = bw6,
			      .fault = {[5] = "stall:round=0:phase=scatter"}};
	run(&sc, check_modes_fault);
}

/* ---- a killed process (tcp) ------------------------------------------------ */

#define KILL_PEERS 4
#define KILL_COUNT 2000
#define KILLED 1

/* Child: averages once through the public API and writes its result. */
static int kill_child(const char *dir, int rank, int to_parent, int from_parent)
{
	struct mp_config cfg;
	mp_ctx *ctx;
	char run[64], path[128], addrs[KILL_PEERS][MP_ADDR_STRLEN];
	const char *ap[KILL_PEERS];
	struct mp_result res;
	static float buf[KILL_COUNT];

	snprintf(run, sizeof(run), "churn-kill-%d", (int)getppid());
	log_path(dir, rank, path, sizeof(path));
	mp_config_init(&cfg);
	cfg.transport = "tcp";
	cfg.run_name = run;
	cfg.rank = rank;
	cfg.npeers = KILL_PEERS;
	cfg.grid = "4";
	cfg.listen = "127.0.0.1:0";
	cfg.chunk_bytes = CHUNK_BYTES;
	/* A peer killed before a connection to it was up is refused until
	 * this timeout. */
	cfg.connect_timeout_ms = 1500;
	cfg.round_timeout_ms = 5000;
	cfg.contrib_log = path;
	cfg.fault = rank == KILLED ? "kill:round=0:phase=scatter:after=1" : NULL;
	if (mp_init(&cfg, &ctx))
		return 2;
	mp_local_address(ctx, addrs[rank], MP_ADDR_STRLEN);
	if (write_all(to_parent, addrs[rank], MP_ADDR_STRLEN) ||
	    read_all(from_parent, addrs, sizeof(addrs), 20000))
		return 2;
	for (int i = 0; i < KILL_PEERS; i++)
		ap[i] = addrs[i];
	if (mp_set_peers(ctx, ap, KILL_PEERS))
		return 2;
	for (size_t i = 0; i < KILL_COUNT; i++)
		buf[i] = input(rank, i);
	int rc = mp_average(ctx, buf, KILL_COUNT, weight0(rank), &res);
	snprintf(path, sizeof(path), "%s/out%d", dir, rank);
	FILE *f = fopen(path, "w");
	if (!f || fwrite(buf, sizeof(float), KILL_COUNT, f) != KILL_COUNT ||
	    fwrite(&res.weight, sizeof(float), 1, f) != 1 || fwrite(&rc, sizeof(int), 1, f) != 1)
		return 2;
	fclose(f);
	char b = 1;
	write_all(to_parent, &b, 1);
	read_all(from_parent, &b, 1, 30000);
	mp_finalize(ctx);
	return 0;
}

static void killed_at_scatter(void **s)
{
	char dir[64] = "/tmp/mp-churn-kill-XXXXXX", path[160];
	pid_t pid[KILL_PEERS];
	int up[KILL_PEERS], down[KILL_PEERS], ok = 1, st;
	char addrs[KILL_PEERS][MP_ADDR_STRLEN];

	(void)s;
	assert_non_null(mkdtemp(dir));
	for (int r = 0; r < KILL_PEERS; r++) {
		pid[r] = fork_piped(&up[r], &down[r]);
		assert_true(pid[r] >= 0);
		if (pid[r] == 0)
			_exit(kill_child(dir, r, up[r], down[r]));
	}
	for (int r = 0; r < KILL_PEERS && ok; r++)
		ok = !read_all(up[r], addrs[r], MP_ADDR_STRLEN, 20000);
	for (int r = 0; r < KILL_PEERS && ok; r++)
		ok = !write_all(down[r], addrs, sizeof(addrs));
	for (int r = 0; r < KILL_PEERS && ok; r++) {
		char b;
		if (r != KILLED)
			ok = !read_all(up[r], &b, 1, 30000);
	}
	for (int r = 0; r < KILL_PEERS; r++) {
		char b = 1;
		if (ok && r != KILLED)
			write_all(down[r], &b, 1);
		close(down[r]);
		close(up[r]);
	}
	int exited[KILL_PEERS];
	for (int r = 0; r < KILL_PEERS; r++) {
		if (!ok)
			kill(pid[r], SIGKILL);
		waitpid(pid[r], &st, 0);
		exited[r] = r == KILLED ? WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL
				       : WIFEXITED(st) && WEXITSTATUS(st) == 0;
	}
	assert_true(ok);
	for (int r = 0; r < KILL_PEERS; r++)
		if (!exited[r])
			fail_msg("peer %d: %s", r, r == KILLED ? "was not killed by its fault" : "failed");

	struct world *wd = calloc(1, sizeof(*wd));
	float *out[KILL_PEERS] = {0}, wout[KILL_PEERS] = {0};
	int survivor[KILL_PEERS];
	wd->npeers = KILL_PEERS;
	wd->count = KILL_COUNT;
	for (int r = 0; r < KILL_PEERS; r++) {
		log_path(dir, r, path, sizeof(path));
		read_log(path, &wd->log[r], (uint64_t)r);
		unlink(path);
		survivor[r] = r != KILLED;
		out[r] = calloc(KILL_COUNT, sizeof(float));
		if (!survivor[r])
			continue;
		int rc = 1;
		snprintf(path, sizeof(path), "%s/out%d", dir, r);
		FILE *f = fopen(path, "r");
		assert_non_null(f);
		assert_int_equal(fread(out[r], sizeof(float), KILL_COUNT, f), KILL_COUNT);
		assert_int_equal(fread(&wout[r], sizeof(float), 1, f), 1);
		assert_int_equal(fread(&rc, sizeof(int), 1, f), 1);
		fclose(f);
		unlink(path);
		assert_int_equal(rc, 0);
	}
	rmdir(dir);
	/* The dead peer got as far as its first contribution: logged its
	 * round's start, never its end. */
	assert_true(wd->log[KILLED].r[0].begun && !wd->log[KILLED].r[0].ended);
	replay_and_check(wd, out, wout, survivor);
	expect_parts(wd, 0, (const int[]){0, 2, 3, -1}, (const int[]){KILLED, -1}, (const int[]){KILLED, -1});
	for (int r = 0; r < KILL_PEERS; r++)
		free(out[r]);
	free(wd);
}

/* ---- the fault spec ------------------------------------------------------ */

static void fault_specs(void **s)
{
	static const struct {
		const char *spec;
		const char *named; /* in the error; NULL: accepted */
	} cases[] = {
		{"kill:round=3:phase=match,stall:round=1:peer=a:after=2,cut:round=0:phase=gather", NULL},
		{"", NULL},
		{"stall:round=x", "stall:round=x"},
		{"kill:round=1,boom:round=2", "boom:round=2"},
		{"cut:phase=gather", "cut:phase=gather"},
		{"kill:round=1:peer=3", "kill:round=1:peer=3"},
		{"stall:round=1:phase=match", "stall:round=1:phase=match"},
		{"cut:round=1:phase=later", "cut:round=1:phase=later"},
		{"stall:round=1:after=-1", "stall:round=1:after=-1"},
		{"stall:round=1:round=2", "stall:round=1:round=2"},
		{"stall:round=1:peer=zz", "stall:round=1:peer=zz"},
		{"stall:round=1:", "stall:round=1:"},
		{"kill:round=2:until=9:phase=gather:after=1", NULL},
		{"kill:round=2:until=2", "kill:round=2:until=2"},
		{"cut:round=2:until=x", "cut:round=2:until=x"},
		{"stall:round=1:until=3:until=4", "stall:round=1:until=3:until=4"},
	};
	(void)s;
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct mp_config cfg;
		mp_ctx *ctx = NULL;

		mp_config_init(&cfg);
		cfg.transport = "loop";
		cfg.run_name = "fault-spec";
		cfg.rank = 0;
		cfg.npeers = 2;
		cfg.fault = cases[i].spec;
		int rc = mp_init(&cfg, &ctx);
		if (!cases[i].named) {
			if (rc)
				fail_msg("\"%s\" refused: %s", cases[i].spec, mp_last_error(NULL));
			mp_finalize(ctx);
			continue;
		}
		assert_int_equal(rc, -EINVAL);
		if (!strstr(mp_last_error(NULL), cases[i].named))
			fail_msg("\"%s\": the error \"%s\" does not name \"%s\"", cases[i].spec,
				 mp_last_error(NULL), cases[i].named);
	}
}

int main(int argc, char **argv)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(fault_specs),
		cmocka_unit_test(stall_at_scatter),
		cmocka_unit_test(cut_at_gather),
		cmocka_unit_test(stall_toward_one_peer),
		cmocka_unit_test(cut_at_gather_fp16),
		cmocka_unit_test(two_faults_of_eight),
		cmocka_unit_test(faults_over_two_rounds),
		cmocka_unit_test(deadline_ends_the_round),
		cmocka_unit_test(client_and_aux),
		cmocka_unit_test(silent_client),
		cmocka_unit_test(killed_at_scatter),
	};
	signal(SIGPIPE, SIG_IGN);
	if (argc > 1)
		cmocka_set_test_filter(argv[1]);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
