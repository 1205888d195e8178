/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Replay of contribution logs: see replay.h for what is computed and
 * doc/control-plane.md for the log format. Lines look like
 *
 *   begin round=3 group=0badcafe self=<id> index=1 size=4 weight=0x1p+0
 *         roster=<id>:<len>:n,<id>:<len>:c,...
 *   reduce round=3 group=0badcafe part=1 off=256 len=256 wsum=0x1.8p+1
 *         contrib=<id>:0x1p+0,...
 *   apply round=3 group=0badcafe part=0 status=applied
 *   end round=3 group=0badcafe weight=0x1p+0
 *   alone round=4
 *   restore round=5 from=4
 *
 * with ids in hexadecimal and weights in any form strtod reads (C99 %a).
 * Everything is first collected, then replayed round by round: the results
 * of a round are computed from the values at its start, then applied.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include "replay.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { ST_NONE = -1, ST_OWN = 0, ST_APPLIED = 1 };

struct member {
	uint64_t id;
	uint64_t len;
	char mode; /* 'n' normal, 'c' client, 'a' aux */
};

struct begin_ev {
	uint32_t round, group;
	uint64_t peer;
	int index, size;
	double weight;
	struct member *roster;
	int nroster;
	signed char *apply; /* per part: ST_* */
	int ended;
	int restored;       /* a restore line followed: the round settles nothing */
};

/* An average given up in @round whose values went back to those before
 * round @from ('restore'). */
struct restore_ev {
	uint64_t peer;
	uint32_t round, from;
	double *saved;      /* the peer's values before @from, once the replay is there */
	int done;
};

struct contrib {
	uint64_t id;
	double w;
};

struct reduce_ev {
	uint32_t round, group;
	uint64_t reducer;
	int part;
	uint64_t off, len;
	double wsum;
	struct contrib *c;
	int nc;
	double *result; /* len values once computed; NULL when they cannot be */
};

struct rpeer {
	uint64_t id;
	double *x;
	int groups;
	int named;
};

struct replay {
	size_t count;
	struct rpeer *peers;
	int npeers, peers_cap;
	struct begin_ev *begins;
	size_t nbegins, begins_cap;
	struct reduce_ev *reduces;
	size_t nreduces, reduces_cap;
	struct restore_ev *restores;
	size_t nrestores, restores_cap;
	uint32_t rounds; /* highest round seen + 1 */
	int64_t problems;
	char first[256];
	int ran;
};

__attribute__((format(printf, 2, 3)))
static void problem(struct replay *rp, const char *fmt, ...)
{
	va_list ap;

	if (rp->problems++ == 0) {
		va_start(ap, fmt);
		vsnprintf(rp->first, sizeof(rp->first), fmt, ap);
		va_end(ap);
	}
}

static int grow(void **arr, size_t *cap, size_t need, size_t elem)
{
	size_t n;
	void *p;

	if (need <= *cap)
		return 0;
	n = *cap ? *cap * 2 : 16;
	while (n < need)
		n *= 2;
	p = realloc(*arr, n * elem);
	if (!p)
		return -ENOMEM;
	*arr = p;
	*cap = n;
	return 0;
}

struct replay *replay_new(size_t count)
{
	struct replay *rp = calloc(1, sizeof(*rp));

	if (rp)
		rp->count = count;
	return rp;
}

void replay_free(struct replay *rp)
{
	if (!rp)
		return;
	for (int i = 0; i < rp->npeers; i++)
		free(rp->peers[i].x);
	for (size_t i = 0; i < rp->nbegins; i++) {
		free(rp->begins[i].roster);
		free(rp->begins[i].apply);
	}
	for (size_t i = 0; i < rp->nreduces; i++) {
		free(rp->reduces[i].c);
		free(rp->reduces[i].result);
	}
	for (size_t i = 0; i < rp->nrestores; i++)
		free(rp->restores[i].saved);
	free(rp->peers);
	free(rp->begins);
	free(rp->reduces);
	free(rp->restores);
	free(rp);
}

static struct rpeer *find_peer(const struct replay *rp, uint64_t id)
{
	for (int i = 0; i < rp->npeers; i++)
		if (rp->peers[i].id == id)
			return &rp->peers[i];
	return NULL;
}

/* The peer @id, added with unknown (NaN) values if new. */
static struct rpeer *get_peer(struct replay *rp, uint64_t id)
{
	struct rpeer *p = find_peer(rp, id);
	size_t cap = (size_t)rp->peers_cap;

	if (p)
		return p;
	if (grow((void **)&rp->peers, &cap, (size_t)rp->npeers + 1, sizeof(*rp->peers)))
		return NULL;
	rp->peers_cap = (int)cap;
	p = &rp->peers[rp->npeers];
	memset(p, 0, sizeof(*p));
	p->id = id;
	p->x = malloc((rp->count ? rp->count : 1) * sizeof(double));
	if (!p->x)
		return NULL;
	for (size_t i = 0; i < rp->count; i++)
		p->x[i] = NAN;
	rp->npeers++;
	return p;
}

int replay_add_peer(struct replay *rp, uint64_t id, const float *x0)
{
	struct rpeer *p;

	if (find_peer(rp, id))
		return -EEXIST;
	p = get_peer(rp, id);
	if (!p)
		return -ENOMEM;
	for (size_t i = 0; i < rp->count; i++)
		p->x[i] = x0[i];
	return 0;
}

/* ---- parsing ------------------------------------------------------------ */

static int parse_hex64(const char *s, uint64_t *v)
{
	char *end;

	errno = 0;
	*v = strtoull(s, &end, 16);
	return errno || end == s || *end ? -1 : 0;
}

static int parse_dec(const char *s, uint64_t max, uint64_t *v)
{
	char *end;

	errno = 0;
	*v = strtoull(s, &end, 10);
	return errno || end == s || *end || *v > max || *s == '-' ? -1 : 0;
}

static int parse_real(const char *s, double *v)
{
	char *end;

	errno = 0;
	*v = strtod(s, &end);
	return errno || end == s || *end || !isfinite(*v) ? -1 : 0;
}

/* Split "id:len:mode,..." into a roster. */
static int parse_roster(char *s, struct member **out, int *n)
{
	int cap = 0, k = 0;
	struct member *m = NULL;

	for (char *save = NULL, *tok = strtok_r(s, ",", &save); tok;
	     tok = strtok_r(NULL, ",", &save)) {
		char *c1 = strchr(tok, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;

		if (!c2 || c2[1] == '\0' || c2[2] != '\0')
			goto bad;
		*c1 = *c2 = '\0';
		if (k == cap) {
			struct member *t = realloc(m, (size_t)(cap = cap ? cap * 2 : 8) * sizeof(*m));

			if (!t)
				goto bad;
			m = t;
		}
		if (parse_hex64(tok, &m[k].id) || parse_dec(c1 + 1, UINT64_MAX, &m[k].len))
			goto bad;
		m[k].mode = c2[1];
		if (m[k].mode != 'n' && m[k].mode != 'c' && m[k].mode != 'a')
			goto bad;
		k++;
	}
	*out = m;
	*n = k;
	return 0;
bad:
	free(m);
	return -1;
}

/* Split "id:w,..." into contributions. */
static int parse_contribs(char *s, struct contrib **out, int *n)
{
	int cap = 0, k = 0;
	struct contrib *c = NULL;

	for (char *save = NULL, *tok = strtok_r(s, ",", &save); tok;
	     tok = strtok_r(NULL, ",", &save)) {
		char *colon = strchr(tok, ':');

		if (!colon)
			goto bad;
		*colon = '\0';
		if (k == cap) {
			struct contrib *t = realloc(c, (size_t)(cap = cap ? cap * 2 : 8) * sizeof(*c));

			if (!t)
				goto bad;
			c = t;
		}
		if (parse_hex64(tok, &c[k].id) || parse_real(colon + 1, &c[k].w))
			goto bad;
		k++;
	}
	*out = c;
	*n = k;
	return 0;
bad:
	free(c);
	return -1;
}

/* Fields of one line; a field absent from the line is NULL. */
struct fields {
	char *round, *group, *self, *index, *size, *weight, *roster, *part, *off, *len, *wsum,
		*contrib, *status, *from;
};

static void split_fields(char *line, struct fields *f)
{
	static const struct {
		const char *key;
		size_t off;
	} keys[] = {
		{ "round", offsetof(struct fields, round) },
		{ "group", offsetof(struct fields, group) },
		{ "self", offsetof(struct fields, self) },
		{ "index", offsetof(struct fields, index) },
		{ "size", offsetof(struct fields, size) },
		{ "weight", offsetof(struct fields, weight) },
		{ "roster", offsetof(struct fields, roster) },
		{ "part", offsetof(struct fields, part) },
		{ "off", offsetof(struct fields, off) },
		{ "len", offsetof(struct fields, len) },
		{ "wsum", offsetof(struct fields, wsum) },
		{ "contrib", offsetof(struct fields, contrib) },
		{ "status", offsetof(struct fields, status) },
		{ "from", offsetof(struct fields, from) },
	};

	memset(f, 0, sizeof(*f));
	for (char *save = NULL, *tok = strtok_r(line, " \t", &save); tok;
	     tok = strtok_r(NULL, " \t", &save)) {
		char *eq = strchr(tok, '=');

		if (!eq)
			continue;
		*eq = '\0';
		for (size_t k = 0; k < sizeof(keys) / sizeof(keys[0]); k++)
			if (strcmp(tok, keys[k].key) == 0)
				*(char **)((char *)f + keys[k].off) = eq + 1;
	}
}

/* State of the log being read: its peer and its last 'begin'. */
struct logstate {
	uint64_t id;
	long cur;     /* index of the peer's last begin in rp->begins, -1 none */
	int stalled;  /* the last begin has no end yet */
};

static void note_round(struct replay *rp, uint32_t r)
{
	if (r + 1 > rp->rounds)
		rp->rounds = r + 1;
}

/* A line for round @r arrived: an unfinished earlier round is a problem. */
static void check_continues(struct replay *rp, struct logstate *ls, uint32_t r)
{
	if (ls->stalled && rp->begins[ls->cur].round != r) {
		problem(rp, "peer %016" PRIx64 ": round %u has no end but the log goes on",
			ls->id, rp->begins[ls->cur].round);
		ls->stalled = 0;
	}
}

static int parse_begin(struct replay *rp, struct logstate *ls, const struct fields *f)
{
	struct begin_ev b = { 0 };
	uint64_t v, self;
	char *roster;

	if (!f->round || !f->group || !f->self || !f->index || !f->size || !f->weight ||
	    !f->roster || parse_dec(f->round, UINT32_MAX, &v))
		return 1;
	b.round = (uint32_t)v;
	if (parse_hex64(f->group, &v) || v > UINT32_MAX)
		return 1;
	b.group = (uint32_t)v;
	if (parse_hex64(f->self, &self))
		return 1;
	if (parse_dec(f->index, INT32_MAX, &v))
		return 1;
	b.index = (int)v;
	if (parse_dec(f->size, INT32_MAX, &v))
		return 1;
	b.size = (int)v;
	if (parse_real(f->weight, &b.weight))
		return 1;
	roster = strdup(f->roster);
	if (!roster)
		return -ENOMEM;
	if (parse_roster(roster, &b.roster, &b.nroster)) {
		free(roster);
		return 1;
	}
	free(roster);
	check_continues(rp, ls, b.round);
	if (self != ls->id)
		problem(rp, "log of %016" PRIx64 " has a begin of %016" PRIx64, ls->id, self);
	b.peer = ls->id;
	b.apply = malloc((size_t)(b.nroster ? b.nroster : 1));
	if (!b.apply) {
		free(b.roster);
		return -ENOMEM;
	}
	memset(b.apply, ST_NONE, (size_t)(b.nroster ? b.nroster : 1));
	if (grow((void **)&rp->begins, &rp->begins_cap, rp->nbegins + 1, sizeof(b))) {
		free(b.roster);
		free(b.apply);
		return -ENOMEM;
	}
	rp->begins[rp->nbegins] = b;
	ls->cur = (long)rp->nbegins++;
	ls->stalled = 1;
	note_round(rp, b.round);
	return 0;
}

static int parse_reduce(struct replay *rp, struct logstate *ls, const struct fields *f)
{
	struct reduce_ev e = { 0 };
	uint64_t v;
	char *contrib;

	if (!f->round || !f->group || !f->part || !f->off || !f->len || !f->wsum ||
	    !f->contrib || parse_dec(f->round, UINT32_MAX, &v))
		return 1;
	e.round = (uint32_t)v;
	if (parse_hex64(f->group, &v) || v > UINT32_MAX)
		return 1;
	e.group = (uint32_t)v;
	if (parse_dec(f->part, INT32_MAX, &v))
		return 1;
	e.part = (int)v;
	if (parse_dec(f->off, UINT64_MAX, &e.off) || parse_dec(f->len, UINT64_MAX, &e.len) ||
	    parse_real(f->wsum, &e.wsum))
		return 1;
	contrib = strdup(f->contrib);
	if (!contrib)
		return -ENOMEM;
	if (parse_contribs(contrib, &e.c, &e.nc)) {
		free(contrib);
		return 1;
	}
	free(contrib);
	check_continues(rp, ls, e.round);
	e.reducer = ls->id;
	if (grow((void **)&rp->reduces, &rp->reduces_cap, rp->nreduces + 1, sizeof(e))) {
		free(e.c);
		return -ENOMEM;
	}
	rp->reduces[rp->nreduces++] = e;
	note_round(rp, e.round);
	return 0;
}

/* The peer's last begin when it is of round @r and group @g, else NULL. */
static struct begin_ev *current_begin(struct replay *rp, struct logstate *ls, uint32_t r,
				      uint32_t g)
{
	struct begin_ev *b = ls->cur >= 0 ? &rp->begins[ls->cur] : NULL;

	return b && b->round == r && b->group == g ? b : NULL;
}

static int parse_apply_end(struct replay *rp, struct logstate *ls, const struct fields *f,
			   int is_end)
{
	struct begin_ev *b;
	uint64_t r, g, part = 0; /* set unless is_end, which returns before its use */

	if (!f->round || !f->group || parse_dec(f->round, UINT32_MAX, &r) ||
	    parse_hex64(f->group, &g) || g > UINT32_MAX)
		return 1;
	if (!is_end && (!f->part || !f->status || parse_dec(f->part, INT32_MAX, &part)))
		return 1;
	if (!is_end && strcmp(f->status, "applied") != 0 && strcmp(f->status, "own") != 0)
		return 1;
	note_round(rp, (uint32_t)r);
	b = current_begin(rp, ls, (uint32_t)r, (uint32_t)g);
	if (!b) {
		problem(rp, "peer %016" PRIx64 ": %s of round %" PRIu64 " group %08" PRIx64
			" without its begin", ls->id, is_end ? "end" : "apply", r, g);
		return 0;
	}
	if (is_end) {
		b->ended = 1;
		ls->stalled = 0;
		return 0;
	}
	if (part >= (uint64_t)b->nroster) {
		problem(rp, "peer %016" PRIx64 ": round %" PRIu64 " applies part %" PRIu64
			" of a group of %d", ls->id, r, part, b->nroster);
		return 0;
	}
	if (b->apply[part] != ST_NONE)
		problem(rp, "peer %016" PRIx64 ": round %" PRIu64 " applies part %" PRIu64
			" twice", ls->id, r, part);
	b->apply[part] = strcmp(f->status, "applied") == 0 ? ST_APPLIED : ST_OWN;
	return 0;
}

static int parse_alone(struct replay *rp, struct logstate *ls, const struct fields *f)
{
	uint64_t r;

	if (!f->round || parse_dec(f->round, UINT32_MAX, &r))
		return 1;
	check_continues(rp, ls, (uint32_t)r);
	note_round(rp, (uint32_t)r);
	return 0;
}

/* The average that ended in round R went back to its values before round
 * F: round R's begin (if it is the last one) settles nothing. */
static int parse_restore(struct replay *rp, struct logstate *ls, const struct fields *f)
{
	struct restore_ev e = { .peer = ls->id };
	uint64_t r, from;

	if (!f->round || !f->from || parse_dec(f->round, UINT32_MAX, &r) ||
	    parse_dec(f->from, UINT32_MAX, &from))
		return 1;
	if (from > r) {
		problem(rp, "peer %016" PRIx64 ": restore in round %" PRIu64 " to round %" PRIu64
			", which is later", ls->id, r, from);
		return 0;
	}
	check_continues(rp, ls, (uint32_t)r);
	note_round(rp, (uint32_t)r);
	if (ls->cur >= 0 && rp->begins[ls->cur].round == r)
		rp->begins[ls->cur].restored = 1;
	e.round = (uint32_t)r;
	e.from = (uint32_t)from;
	if (grow((void **)&rp->restores, &rp->restores_cap, rp->nrestores + 1, sizeof(e)))
		return -ENOMEM;
	rp->restores[rp->nrestores++] = e;
	return 0;
}

/* One line (NUL-terminated, writable): 0, or -ENOMEM. */
static int parse_line(struct replay *rp, struct logstate *ls, char *line)
{
	struct fields f;
	char *kind = line, *rest;
	int rc;

	while (*kind == ' ' || *kind == '\t')
		kind++;
	if (*kind == '\0' || *kind == '#')
		return 0;
	rest = kind + strcspn(kind, " \t");
	if (*rest)
		*rest++ = '\0';
	split_fields(rest, &f);
	if (strcmp(kind, "begin") == 0)
		rc = parse_begin(rp, ls, &f);
	else if (strcmp(kind, "reduce") == 0)
		rc = parse_reduce(rp, ls, &f);
	else if (strcmp(kind, "apply") == 0)
		rc = parse_apply_end(rp, ls, &f, 0);
	else if (strcmp(kind, "end") == 0)
		rc = parse_apply_end(rp, ls, &f, 1);
	else if (strcmp(kind, "alone") == 0)
		rc = parse_alone(rp, ls, &f);
	else if (strcmp(kind, "restore") == 0)
		rc = parse_restore(rp, ls, &f);
	else
		return 0; /* a kind this replay does not need */
	if (rc > 0)
		problem(rp, "peer %016" PRIx64 ": malformed %s line", ls->id, kind);
	return rc < 0 ? rc : 0;
}

int replay_add_log(struct replay *rp, uint64_t id, const char *text, size_t len)
{
	struct logstate ls = { .id = id, .cur = -1 };
	size_t pos = 0;
	char *line = NULL;
	size_t line_cap = 0;
	int rc = 0;

	if (!get_peer(rp, id))
		return -ENOMEM;
	while (pos < len) {
		const char *nl = memchr(text + pos, '\n', len - pos);
		size_t n;

		if (!nl)
			break; /* a line cut short: the writer died before its end */
		n = (size_t)(nl - (text + pos));
		if (grow((void **)&line, &line_cap, n + 1, 1)) {
			rc = -ENOMEM;
			break;
		}
		memcpy(line, text + pos, n);
		line[n] = '\0';
		rc = parse_line(rp, &ls, line);
		if (rc)
			break;
		pos += n + 1;
	}
	free(line);
	return rc;
}

int replay_add_log_file(struct replay *rp, uint64_t id, const char *path)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	char *buf = NULL;
	size_t len = 0, cap = 0;
	int rc;

	if (fd < 0)
		return errno == ENOENT ? (get_peer(rp, id) ? 0 : -ENOMEM) : -errno;
	for (;;) {
		ssize_t n;

		if (grow((void **)&buf, &cap, len + 65536, 1)) {
			close(fd);
			free(buf);
			return -ENOMEM;
		}
		n = read(fd, buf + len, cap - len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			rc = -errno;
			close(fd);
			free(buf);
			return rc;
		}
		if (n == 0)
			break;
		len += (size_t)n;
	}
	close(fd);
	rc = replay_add_log(rp, id, buf ? buf : "", len);
	free(buf);
	return rc;
}

/* ---- replay ------------------------------------------------------------- */

static int cmp_begin(const void *a, const void *b)
{
	const struct begin_ev *x = a, *y = b;

	if (x->round != y->round)
		return x->round < y->round ? -1 : 1;
	if (x->peer != y->peer)
		return x->peer < y->peer ? -1 : 1;
	return 0;
}

static int cmp_reduce(const void *a, const void *b)
{
	const struct reduce_ev *x = a, *y = b;

	if (x->round != y->round)
		return x->round < y->round ? -1 : 1;
	if (x->group != y->group)
		return x->group < y->group ? -1 : 1;
	if (x->reducer != y->reducer)
		return x->reducer < y->reducer ? -1 : 1;
	if (x->part != y->part)
		return x->part < y->part ? -1 : 1;
	return 0;
}

static struct begin_ev *find_begin(const struct replay *rp, uint32_t round, uint64_t peer)
{
	struct begin_ev key = { .round = round, .peer = peer };

	return bsearch(&key, rp->begins, rp->nbegins, sizeof(key), cmp_begin);
}

static struct reduce_ev *find_reduce(const struct replay *rp, uint32_t round, uint32_t group,
				     uint64_t reducer, int part)
{
	struct reduce_ev key = { .round = round, .group = group, .reducer = reducer, .part = part };

	return bsearch(&key, rp->reduces, rp->nreduces, sizeof(key), cmp_reduce);
}

static int weights_differ(double a, double b)
{
	return fabs(a - b) > 1e-6 * fmax(1.0, fmax(fabs(a), fabs(b)));
}

/* The result of @e from the values at the start of its round; stays NULL
 * (NaN) when the lines do not add up. */
static int compute_reduce(struct replay *rp, struct reduce_ev *e)
{
	const struct begin_ev *rb = find_begin(rp, e->round, e->reducer);
	const struct rpeer *reducer = find_peer(rp, e->reducer);
	const double **src;
	double wsum = 0.0;

	if (!rb || rb->group != e->group || rb->index != e->part) {
		problem(rp, "round %u: %016" PRIx64 " reduced part %d of group %08x, which "
			"its begin does not give it", e->round, e->reducer, e->part, e->group);
		return 0;
	}
	if (e->off > rp->count || e->len > rp->count - e->off) {
		problem(rp, "round %u: %016" PRIx64 " reduced [%" PRIu64 ", +%" PRIu64
			") of %zu values", e->round, e->reducer, e->off, e->len, rp->count);
		return 0;
	}
	for (int k = 0; k < e->nc; k++) {
		const struct begin_ev *cb = find_begin(rp, e->round, e->c[k].id);

		if (!find_peer(rp, e->c[k].id) || !cb || cb->group != e->group) {
			problem(rp, "round %u: %016" PRIx64 " reduced a contribution of %016" PRIx64
				", not a member of group %08x", e->round, e->reducer, e->c[k].id,
				e->group);
			return 0;
		}
		if (weights_differ(cb->weight, e->c[k].w)) {
			problem(rp, "round %u: %016" PRIx64 " used weight %a for %016" PRIx64
				", which began the round with %a", e->round, e->reducer, e->c[k].w,
				e->c[k].id, cb->weight);
			return 0;
		}
		wsum += e->c[k].w;
	}
	if (weights_differ(wsum, e->wsum)) {
		problem(rp, "round %u: %016" PRIx64 " part %d: wsum %a, contributions sum to %a",
			e->round, e->reducer, e->part, e->wsum, wsum);
		return 0;
	}
	e->result = malloc((e->len ? e->len : 1) * sizeof(double));
	if (!e->result)
		return -ENOMEM;
	if (wsum == 0.0) {
		/* Nothing to average: the reducer's values stand (design.md). */
		memcpy(e->result, reducer->x + e->off, e->len * sizeof(double));
		return 0;
	}
	src = malloc((size_t)e->nc * sizeof(*src));
	if (!src)
		return -ENOMEM;
	for (int k = 0; k < e->nc; k++)
		src[k] = find_peer(rp, e->c[k].id)->x + e->off;
	for (uint64_t i = 0; i < e->len; i++) {
		double s = 0.0;

		for (int k = 0; k < e->nc; k++)
			s += e->c[k].w * src[k][i];
		e->result[i] = s / wsum;
	}
	free(src);
	return 0;
}

static void set_nan(double *x, uint64_t n)
{
	for (uint64_t i = 0; i < n; i++)
		x[i] = NAN;
}

/* Take part @j's result (or NaN) into @x at the offset @p's roster gives it. */
static void take(struct replay *rp, const struct begin_ev *b, int j, uint64_t off, double *x)
{
	const struct reduce_ev *e = find_reduce(rp, b->round, b->group, b->roster[j].id, j);

	if (!e || e->off != off || e->len != b->roster[j].len) {
		problem(rp, "round %u: %016" PRIx64 " took part %d of group %08x, which %s",
			b->round, b->peer, j, b->group,
			e ? "its reducer logged with another offset or length" :
			    "its reducer never logged reducing");
		set_nan(x + off, b->roster[j].len);
		return;
	}
	if (e->result)
		memcpy(x + off, e->result, e->len * sizeof(double));
	else
		set_nan(x + off, e->len);
}

/* What member @b's peer holds after its round. */
static void settle(struct replay *rp, const struct begin_ev *b)
{
	struct rpeer *p = find_peer(rp, b->peer);
	uint64_t off = 0, total = 0;

	for (int j = 0; j < b->nroster; j++)
		total += b->roster[j].len;
	if (b->nroster != b->size || b->index < 0 || b->index >= b->nroster ||
	    b->roster[b->index].id != b->peer || total != rp->count) {
		problem(rp, "round %u: %016" PRIx64 " logged an inconsistent roster", b->round,
			b->peer);
		set_nan(p->x, rp->count);
		return;
	}
	if (b->restored)
		return; /* given up: the values go back right after the round */
	if (!b->ended) {
		/* Killed in this round (or its log ends here): its values are
		 * unknown from now on. */
		set_nan(p->x, rp->count);
		return;
	}
	/* Every mode takes the results: an aux member too (it contributed at
	 * weight 0 in its first round), so that its cell holds values later. */
	for (int j = 0; j < b->nroster; off += b->roster[j].len, j++) {
		if (b->roster[j].len == 0)
			continue;
		if (j == b->index) {
			take(rp, b, j, off, p->x);
			continue;
		}
		if (b->apply[j] == ST_APPLIED) {
			take(rp, b, j, off, p->x);
		} else if (b->apply[j] == ST_NONE) {
			problem(rp, "round %u: %016" PRIx64 " ended without saying what it did "
				"with part %d", b->round, b->peer, j);
			set_nan(p->x + off, b->roster[j].len);
		}
	}
}

/* Keep the values of every peer that will restore to a round <= @r. */
static int save_restores(struct replay *rp, uint32_t r)
{
	for (size_t i = 0; i < rp->nrestores; i++) {
		struct restore_ev *e = &rp->restores[i];
		const struct rpeer *p = find_peer(rp, e->peer);

		if (e->saved || e->from > r)
			continue;
		e->saved = malloc((rp->count ? rp->count : 1) * sizeof(double));
		if (!e->saved)
			return -ENOMEM;
		memcpy(e->saved, p->x, rp->count * sizeof(double));
	}
	return 0;
}

/* Put back the values of the averages given up in a round before @end. */
static void apply_restores(struct replay *rp, uint64_t end)
{
	for (size_t i = 0; i < rp->nrestores; i++) {
		struct restore_ev *e = &rp->restores[i];

		if (e->done || e->round >= end || !e->saved)
			continue;
		memcpy(find_peer(rp, e->peer)->x, e->saved, rp->count * sizeof(double));
		e->done = 1;
	}
}

int replay_run(struct replay *rp)
{
	size_t bi = 0, ri = 0;

	if (rp->ran)
		return 0;
	rp->ran = 1;
	qsort(rp->begins, rp->nbegins, sizeof(*rp->begins), cmp_begin);
	qsort(rp->reduces, rp->nreduces, sizeof(*rp->reduces), cmp_reduce);
	for (size_t i = 1; i < rp->nbegins; i++)
		if (cmp_begin(&rp->begins[i - 1], &rp->begins[i]) == 0)
			problem(rp, "round %u: %016" PRIx64 " began two groups",
				rp->begins[i].round, rp->begins[i].peer);
	for (size_t i = 1; i < rp->nreduces; i++)
		if (cmp_reduce(&rp->reduces[i - 1], &rp->reduces[i]) == 0)
			problem(rp, "round %u: %016" PRIx64 " reduced part %d twice",
				rp->reduces[i].round, rp->reduces[i].reducer, rp->reduces[i].part);

	/* Statistics: groups per peer, and who is named by whom. */
	for (size_t i = 0; i < rp->nbegins; i++) {
		const struct begin_ev *b = &rp->begins[i];
		struct rpeer *p = find_peer(rp, b->peer);

		if (b->nroster >= 2)
			p->groups++;
		for (int j = 0; j < b->nroster; j++) {
			/* Unknown ids become peers with unknown values. */
			struct rpeer *q;

			if (b->roster[j].id == b->peer)
				continue;
			q = get_peer(rp, b->roster[j].id);
			if (!q)
				return -ENOMEM;
			q->named = 1;
		}
	}

	while (bi < rp->nbegins || ri < rp->nreduces) {
		uint32_t r = UINT32_MAX;

		if (bi < rp->nbegins)
			r = rp->begins[bi].round;
		if (ri < rp->nreduces && rp->reduces[ri].round < r)
			r = rp->reduces[ri].round;
		/* Values an average given up later goes back to: those at the
		 * start of its first round (no round between moved them). */
		if (save_restores(rp, r))
			return -ENOMEM;
		apply_restores(rp, r);
		/* First every result of the round, from the values at its start... */
		for (; ri < rp->nreduces && rp->reduces[ri].round == r; ri++) {
			int rc = compute_reduce(rp, &rp->reduces[ri]);

			if (rc)
				return rc;
		}
		/* ...then what each member keeps. */
		for (; bi < rp->nbegins && rp->begins[bi].round == r; bi++)
			settle(rp, &rp->begins[bi]);
		apply_restores(rp, (uint64_t)r + 1);
	}
	if (save_restores(rp, UINT32_MAX))
		return -ENOMEM;
	apply_restores(rp, UINT64_MAX);
	return 0;
}

const double *replay_values(const struct replay *rp, uint64_t id)
{
	const struct rpeer *p = find_peer(rp, id);

	return p ? p->x : NULL;
}

int replay_compare(const struct replay *rp, uint64_t id, const float *x, double rtol,
		   double atol, struct replay_cmp *out)
{
	const struct rpeer *p = find_peer(rp, id);

	memset(out, 0, sizeof(*out));
	if (!p)
		return -ENOENT;
	for (size_t i = 0; i < rp->count; i++) {
		double ref = p->x[i], d = fabs((double)x[i] - ref);

		if (isnan(d))
			d = INFINITY;
		if (!(d <= fmax(atol, rtol * fabs(ref))))
			out->wrong++;
		if (d > out->max_err)
			out->max_err = d;
		out->checked++;
	}
	return 0;
}

int replay_groups(const struct replay *rp, uint64_t id)
{
	const struct rpeer *p = find_peer(rp, id);

	return p ? p->groups : 0;
}

int replay_named_by_others(const struct replay *rp, uint64_t id)
{
	const struct rpeer *p = find_peer(rp, id);

	if (p && p->named)
		return 1;
	for (size_t i = 0; i < rp->nreduces; i++)
		for (int k = 0; k < rp->reduces[i].nc; k++)
			if (rp->reduces[i].c[k].id == id && rp->reduces[i].reducer != id)
				return 1;
	return 0;
}

uint32_t replay_rounds(const struct replay *rp)
{
	return rp->rounds;
}

int64_t replay_problems(const struct replay *rp)
{
	return rp->problems;
}

const char *replay_first_problem(const struct replay *rp)
{
	return rp->first;
}
