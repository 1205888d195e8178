/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Matchmaking, as in Moshpit SGD and hivemind, over the rendezvous and the
 * control connections:
 *
 *   1. In round t a peer varies grid dimension t mod d. It declares itself
 *      under the group key (run, t, its coordinates except that dimension)
 *      with an expiration E = now + matchmaking time.
 *   2. Of the live declarations under the key, the one with the smallest
 *      (E, id) that is not a client leads: it came first, so every peer that
 *      can see it agrees. A peer that leads collects JOINs; the others send
 *      JOIN to it over the control connection and wait for its answer.
 *   3. The leader starts once the group reaches the target size, or at E
 *      with at least the minimum size: it sends BEGIN with a fresh group id
 *      and the roster (ids, addresses, bandwidths, modes, coordinates) to
 *      every follower. Below the minimum it disbands (REJECT) and everybody
 *      keeps its values for this round.
 *   4. A follower refused, or left unanswered for the request timeout, tries
 *      the next candidate. A leader that has no follower yet steps down when
 *      an earlier declaration shows up late.
 *
 * The roster is ordered by (coordinate in the varied dimension, id), which is
 * also the part order; afterwards each member takes its part index as its
 * new coordinate, so groupmates separate in the next rounds (on a full grid
 * the order is the coordinates themselves and nobody moves).
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <moshpit/sdk/le.h>

#include "clog.h"
#include "conn.h"
#include "ctrl.h"
#include "fault.h"
#include "log.h"
#include "matchmaker.h"

#define MAX_RECORDS 4096
/* How often a leader reads the round's key while it waits. */
#define ROUND_READ_NS (10ull * 1000 * 1000)
#define MAX_DECLS 256
#define POLL_MS 2
/* Members are read from the rendezvous at most this often while waiting. */
#define SYNC_NS (50ull * 1000 * 1000)

/* REJECT reasons; REJ_WITHDRAW goes the other way, from a follower that
 * gives up on its leader, so that the leader does not start with it. */
enum { REJ_BUSY = 1, REJ_DISBAND = 2, REJ_STALE = 3, REJ_FULL = 4, REJ_REDIRECT = 5,
       REJ_WITHDRAW = 6 };
/* A peer that refused our JOIN as busy (it follows another) is asked again
 * after this long while we have no followers: its own leader may be dead,
 * and then it leads, and nobody it refused joins it. */
#define BUSY_RETRY_NS (100ull * 1000 * 1000)
/* Hand-overs a leader makes per round, so views that keep changing cannot
 * bounce a group between leaders until its deadline. */
#define MAX_REDIRECTS 2
/* JOIN aux: a probe, answered with REJECT(REJ_STALE) carrying the round the
 * answering peer is at. */
#define JOIN_PROBE 1u
/* Peers a probe asks. */
#define PROBES 2
/* The round in the record of a peer that joins a running run until it
 * knows the run's round: no round waits for it. */
#define ROUND_JOINING UINT32_MAX
/* Member reads in a row with the same count before a joiner trusts it. */
#define STEADY_SYNCS 3
/* ... and how long that count must hold when it places itself: a new DHT
 * node learns the network (and so finds the nodes that hold the run's
 * keys) over a few hundred milliseconds, and a count that held for a few
 * reads only may be that of a node that knows few others yet. */
#define PLACE_STEADY_NS (250ull * 1000 * 1000)
/* take_hole: how many members may still be missing from a round's
 * declarations that stopped changing this long, when it places anyway. */
#define PLACING_MISSING 2
#define PLACING_QUIET_NS (1000ull * 1000 * 1000)
/* How many times a placing peer moves on to a later round the run reached. */
#define MAX_RETARGETS 2
/* Runs of at most this many records also pass declarations and new records
 * straight to every peer (DECL, PEER); larger ones rely on the DHT alone. */
#define GOSSIP_MAX_RECORDS 64
/* A DECL's payload: id, expires_ms, mode, coord, line. */
#define DECL_MSG_LEN 23

/* ---- bounded cursors over little-endian payloads (le.h's byte order) ---- */

struct wbuf {
	uint8_t *p;
	size_t len, cap;
	int err;
};

static void put_bytes(struct wbuf *w, const void *src, size_t n)
{
	if (w->len + n > w->cap) {
		w->err = 1;
		return;
	}
	memcpy(w->p + w->len, src, n);
	w->len += n;
}

/* The low @n bytes of @v: little endian puts them first. */
static void put_u(struct wbuf *w, uint64_t v, int n)
{
	uint8_t b[8];

	mp_le_put64(b, v);
	put_bytes(w, b, (size_t)n);
}

static void put_f64(struct wbuf *w, double d)
{
	uint64_t v;
	memcpy(&v, &d, sizeof(v));
	put_u(w, v, 8);
}

static void put_str(struct wbuf *w, const char *s)
{
	size_t n = strlen(s);
	if (n >= MP_ADDR_STRLEN) {
		w->err = 1;
		return;
	}
	put_u(w, n, 1);
	put_bytes(w, s, n);
}

struct rbuf {
	const uint8_t *p;
	size_t len, off;
	int err;
};

static uint64_t get_u(struct rbuf *r, int n)
{
	uint8_t b[8] = {0};

	if (r->off + (size_t)n > r->len) {
		r->err = 1;
		return 0;
	}
	memcpy(b, r->p + r->off, (size_t)n);
	r->off += (size_t)n;
	return mp_le_get64(b);
}

static double get_f64(struct rbuf *r)
{
	uint64_t v = get_u(r, 8);
	double d;
	memcpy(&d, &v, sizeof(d));
	return d;
}

static void get_str(struct rbuf *r, char *out)
{
	size_t n = (size_t)get_u(r, 1);
	/* No NUL inside: put_str never writes one, and the text would end
	 * there, short of the length the sender gave (fuzz_ctrl). */
	if (r->err || n >= MP_ADDR_STRLEN || r->off + n > r->len || memchr(r->p + r->off, 0, n)) {
		r->err = 1;
		out[0] = 0;
		return;
	}
	memcpy(out, r->p + r->off, n);
	out[n] = 0;
	r->off += n;
}

static void put_entry(struct wbuf *w, const struct mp_mm_entry *e)
{
	put_u(w, e->id, 8);
	put_f64(w, e->bw);
	put_u(w, (uint64_t)e->mode, 1);
	put_u(w, (uint16_t)(int16_t)e->coord, 2);
	put_str(w, e->addr);
}

static int get_entry(struct rbuf *r, struct mp_mm_entry *e)
{
	e->id = get_u(r, 8);
	e->bw = get_f64(r);
	e->mode = (int)get_u(r, 1);
	e->coord = (int16_t)(uint16_t)get_u(r, 2);
	get_str(r, e->addr);
	if (r->err || !e->id || !isfinite(e->bw) || e->mode > MP_MODE_AUX)
		return -EBADMSG;
	return 0;
}

int mp_mm_join_parse(const uint8_t *p, size_t len, struct mp_mm_entry *e)
{
	struct rbuf r = {.p = p, .len = len};

	return get_entry(&r, e);
}

int mp_mm_begin_parse(const uint8_t *p, size_t len, struct mp_mm_entry *ro, int *k)
{
	struct rbuf r = {.p = p, .len = len};
	uint64_t n = get_u(&r, 4);

	if (r.err || n < 1 || n > MP_MAX_GROUP)
		return -EBADMSG;
	for (uint64_t i = 0; i < n; i++)
		if (get_entry(&r, &ro[i]))
			return -EBADMSG;
	if (r.off != r.len)
		return -EBADMSG;
	*k = (int)n;
	return 0;
}

int mp_mm_decl_parse(const uint8_t *p, size_t len, struct mp_decl *d)
{
	if (len != DECL_MSG_LEN)
		return -EBADMSG;
	d->id = mp_le_get64(p);
	d->expires_ms = mp_le_get64(p + 8);
	d->mode = p[16];
	d->coord = (int16_t)mp_le_get16(p + 17);
	d->line = mp_le_get32(p + 19);
	return 0;
}

/* ---- membership ---------------------------------------------------------- */

static struct mp_mm_entry self_entry(const struct mp_ctx *ctx, int dim)
{
	struct mp_mm_entry e = {.id = ctx->self_id, .bw = ctx->mode == MP_MODE_CLIENT ? 0.0 :
					ctx->cfg.bandwidth, .mode = ctx->mode,
				.coord = dim >= 0 ? ctx->dht->coords[dim] : 0};

	snprintf(e.addr, sizeof(e.addr), "%s", ctx->mode == MP_MODE_CLIENT ? "" : ctx->local_addr);
	return e;
}

static int publish_self(struct mp_ctx *ctx)
{
	/* A joiner names its first round once catch_up found it. */
	uint32_t round = ctx->cfg.npeers || ctx->dht->synced ? ctx->round : ROUND_JOINING;
	struct mp_record r = {.id = ctx->self_id, .round = round, .mode = (uint8_t)ctx->mode,
			      .ndims = (uint8_t)ctx->grid.ndims,
			      .bandwidth = ctx->mode == MP_MODE_CLIENT ? 0.0 : ctx->cfg.bandwidth};

	for (int i = 0; i < ctx->grid.ndims; i++)
		r.coords[i] = (int16_t)ctx->dht->coords[i];
	snprintf(r.transport, sizeof(r.transport), "%s", ctx->transport);
	snprintf(r.addr, sizeof(r.addr), "%s", ctx->mode == MP_MODE_CLIENT ? "" : ctx->local_addr);
	return ctx->dht->rdv->publish(ctx->dht->rdv_st, &r);
}

/*
 * Rounds can be much shorter than a record's refresh period, and every
 * publish is a new DHT value (rdv_dht.c), so the round in the record is
 * republished at most once per refresh period. A peer that reads a stale
 * round finds the current one by probing (see probe()).
 */
static void publish_round(struct mp_ctx *ctx)
{
	uint64_t now = mp_now_ns();

	if (ctx->dht->published_ns &&
	    now - ctx->dht->published_ns < (uint64_t)ctx->cfg.record_ttl_ms * 1000000ull / 3)
		return;
	ctx->dht->published_ns = now;
	publish_self(ctx);
}

static int cmp_u32_desc(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
	return x > y ? -1 : x < y;
}

/*
 * The round the run is at, from @n records: the largest that a quarter of
 * them (at least two) have reached. Not simply the largest: a joiner's
 * record names the round it aims at, two past the front, and every peer
 * would jump there (skipping a round the others are matching).
 */
static uint32_t front_round(const struct mp_record *recs, int n)
{
	uint32_t *r = malloc((size_t)(n > 0 ? n : 1) * sizeof(*r));
	uint32_t front = 0;
	int k = 0;

	if (!r)
		return 0;
	for (int i = 0; i < n; i++)
		if (recs[i].round != ROUND_JOINING)
			r[k++] = recs[i].round;
	if (k) {
		int q = n / 4 > 2 ? n / 4 : 2;
		qsort(r, (size_t)k, sizeof(*r), cmp_u32_desc);
		front = r[(q < k ? q : k) - 1];
	}
	free(r);
	return front;
}

/* Small runs also pass declarations and records over the control
 * connections (DECL, PEER); larger ones rely on the DHT alone. */
static int gossiping(const struct mp_ctx *ctx)
{
	return ctx->dht->nrecs <= GOSSIP_MAX_RECORDS;
}

/*
 * A peer new to us: pass its record on to every other peer (a PEER control
 * message), once. A joiner's record reaches the DHT's readers only after its
 * new node's first searches, seconds after deaths; the peer that welcomed it
 * has it at once, and through it everyone does, so that they connect to it
 * and send it their declarations. Records carry their own MACs.
 */
static void relay(struct mp_ctx *ctx, const struct mp_record *r, int idx)
{
	struct mp_wire_hdr h = {.type = MP_MSG_PEER};
	uint8_t buf[MP_RECORD_WIRE_MAX];
	size_t len;

	if (gossiping(ctx) && ctx->dht->rdv->learn_record &&
	    !mp_record_encode(&ctx->auth, ctx->run_name, r, buf, sizeof(buf), &len))
		mp_ctrl_send_all(ctx, &h, buf, len, idx);
}

/* Our own record, as just published, to every peer: a joiner's first record
 * names no round, and leaders count on it only once they read the one that
 * does (the DHT takes seconds to bring it). */
static void announce(struct mp_ctx *ctx)
{
	struct mp_wire_hdr h = {.type = MP_MSG_PEER};
	uint8_t buf[MP_RECORD_WIRE_MAX];
	size_t len;

	if (gossiping(ctx) && ctx->dht->rdv->self_record &&
	    !ctx->dht->rdv->self_record(ctx->dht->rdv_st, buf, sizeof(buf), &len))
		mp_ctrl_send_all(ctx, &h, buf, len, -1);
}

int mp_mm_on_peer(struct mp_ctx *ctx, const struct mp_wire_hdr *h, const uint8_t *payload)
{
	if (!ctx->dht->rdv || !ctx->dht->rdv->learn_record)
		return -ENOTSUP;
	return ctx->dht->rdv->learn_record(ctx->dht->rdv_st, payload, h->length) ? -EBADMSG : 0;
}

/* Is peer @idx, whose record expired at @expired_ms, late rather than gone
 * at @now: its control connection up, less than a TTL since? */
static int still_late(const struct mp_ctx *ctx, int idx, uint64_t expired_ms, uint64_t now)
{
	return !ctx->peers[idx].gone && mp_conn_ready(ctx, idx, ctx->streams) &&
	       now - expired_ms < (uint64_t)ctx->cfg.record_ttl_ms;
}

/*
 * Peer @idx said BYE (@expired_ms 0) or its record expired at @expired_ms
 * (wall clock). A process that died has its kernel close its sockets, and
 * its control connection shows it at once (a reset: suspect, dropped); one
 * whose control connection is still up is alive, and only its record is
 * late (its refresher starved on a loaded machine). Taking such a peer for
 * gone closed its connections, the peer then took us for gone in turn and
 * refused our dials, and a machine under load lost rounds to a cascade of
 * "left" and "is back" (doc/control-plane.md, "Late, not gone"). So it is
 * only late: out of the members until a record comes (the matchmaker counts
 * live records only), its connections kept, and gone once its connection
 * closes or a TTL has passed since its record expired, which bounds how long
 * a host that vanished without a reset is waited for.
 */
static void record_expired(struct mp_ctx *ctx, int idx, uint64_t expired_ms)
{
	struct mp_peer *p = &ctx->peers[idx];

	if (p->gone)
		return;
	if (!expired_ms || !still_late(ctx, idx, expired_ms, mp_wall_ms())) {
		p->late_wall_ms = 0;
		mp_conn_peer_gone(ctx, idx);
		return;
	}
	if (!p->late_wall_ms)
		MP_INFO("peer %016" PRIx64 ": its record expired, its control connection is up: "
			"late, not gone (for up to %d ms)", p->id, ctx->cfg.record_ttl_ms);
	p->late_wall_ms = expired_ms;
}

/* Late peers whose connection closed, or whose record did not come within
 * a TTL of its expiry, are gone. */
static void late_expire(struct mp_ctx *ctx)
{
	uint64_t now = mp_wall_ms();

	for (int i = 0; i < ctx->npeers; i++) {
		struct mp_peer *p = &ctx->peers[i];

		if (!p->late_wall_ms || i == ctx->rank || still_late(ctx, i, p->late_wall_ms, now))
			continue;
		p->late_wall_ms = 0;
		mp_conn_peer_gone(ctx, i);
	}
}

/* Bring the peer table up to date with the rendezvous; returns the number of
 * live records (self included) or a negative errno. *front gets the round
 * the run is at (front_round). */
static int sync_members(struct mp_ctx *ctx, uint32_t *front)
{
	uint64_t gone[64], when[64];
	int n, ng;

	n = ctx->dht->rdv->members(ctx->dht->rdv_st, ctx->dht->recs, MAX_RECORDS);
	if (n < 0)
		return n;
	if (front)
		*front = front_round(ctx->dht->recs, n);
	for (int i = 0; i < n; i++) {
		const struct mp_record *r = &ctx->dht->recs[i];
		if (r->id == ctx->self_id || strcmp(r->transport, ctx->transport))
			continue;
		int idx = mp_peer_find(ctx, r->id), err;
		if (idx >= 0 && ctx->peers[idx].gone) {
			struct mp_peer *g = &ctx->peers[idx];

			/* Its record expired, but it was only late (a refresher
			 * starved on a loaded machine): a live record stamped
			 * after we took it for gone shows it running. Left out
			 * for good, it would be a hole in every round of ours
			 * while it counts on us in its own. A peer that said
			 * BYE stays gone: it stopped refreshing before. */
			if (g->gone_bye || r->seq / 1000 <= g->gone_wall_ms)
				continue;
			MP_INFO("peer %016" PRIx64 " is back: its record was late, not its last",
				r->id);
			g->gone = 0;
		}
		if (idx >= 0 && ctx->peers[idx].late_wall_ms) {
			MP_INFO("peer %016" PRIx64 " is on time again: its record was late, "
				"its connection up", r->id);
			ctx->peers[idx].late_wall_ms = 0;
		}
		int known = idx >= 0;
		idx = mp_peer_learn(ctx, r->id, r->addr, r->bandwidth, r->mode);
		if (idx < 0) {
			MP_WARN("peer %016" PRIx64 ": unusable address \"%s\"", r->id, r->addr);
			continue;
		}
		if (!known)
			relay(ctx, r, idx);
		/* A record stamped after an exchange dropped the peer shows it
		 * alive (it was late, or in a roster it had left): count on it
		 * again rather than start rounds without it for a whole TTL. */
		struct mp_peer *pe = &ctx->peers[idx];
		if (pe->failed_ns && r->seq / 1000 > pe->failed_wall_ms) {
			MP_TRACE("peer %016" PRIx64 " is alive after all", r->id);
			pe->failed_ns = 0;
		}
		/* Open the control connection to a new peer now when this side
		 * dials: only the dialer can, and a peer that just joined needs
		 * one to ask the others which round the run is at. */
		if (!known && ctx->dht->placed)
			mp_conn_get(ctx, idx, ctx->streams, &err);
	}
	while ((ng = ctx->dht->rdv->departed(ctx->dht->rdv_st, gone, when, 64)) > 0) {
		for (int i = 0; i < ng; i++) {
			int idx = mp_peer_find(ctx, gone[i]);
			if (idx >= 0)
				record_expired(ctx, idx, when[i]);
		}
		if (ng < 64)
			break;
	}
	late_expire(ctx);
	ctx->dht->nrecs = n;
	return n;
}

/* Has an exchange dropped peer @id lately, or has it left? */
static int dropped(const struct mp_ctx *ctx, uint64_t id, uint64_t now)
{
	int idx = mp_peer_find(ctx, id);
	uint64_t ttl_ns = (uint64_t)ctx->cfg.record_ttl_ms * 1000000ull;

	if (idx < 0)
		return 0;
	uint64_t f = ctx->peers[idx].failed_ns;
	return ctx->peers[idx].gone || (f && now - f < ttl_ns);
}

/*
 * Does the peer of record @r take part in @round, as far as we know? Not a
 * peer that joins the run later (its record names a later round, or none
 * yet), nor one an exchange dropped lately (a SIGKILLed peer's record
 * outlives it by up to its TTL).
 */
static int takes_part(const struct mp_ctx *ctx, const struct mp_record *r, uint32_t round,
		      uint64_t now)
{
	if (r->round > round || strcmp(r->transport, ctx->transport))
		return 0;
	return mp_peer_find(ctx, r->id) >= 0 && !dropped(ctx, r->id, now);
}

/*
 * Has this peer lately taken others for gone without a goodbye (a record
 * that expired, a connection closed without BYE)? Then it may be the one
 * that was cut off: the others took it for gone and closed its connections.
 */
static int lost_company(const struct mp_ctx *ctx)
{
	uint64_t wall = mp_wall_ms(), window = 2ull * (uint64_t)ctx->cfg.record_ttl_ms;

	for (int i = 0; i < ctx->npeers; i++) {
		const struct mp_peer *p = &ctx->peers[i];

		if (p->id != ctx->self_id && p->gone && !p->gone_bye && wall - p->gone_wall_ms < window)
			return 1;
	}
	return 0;
}

static int cmp_decl_id(const void *a, const void *b)
{
	uint64_t x = ((const struct mp_decl *)a)->id, y = ((const struct mp_decl *)b)->id;
	return x < y ? -1 : x > y;
}

/*
 * How many other members that take part in @round have neither declared
 * for it in a line nor been reported absent: @d (n of them, reordered by id
 * here) are the round's declarations. A peer placing itself (@placer) counts
 * those that declared they are placing themselves as declared: they do the
 * same as it, and waiting for each other would hold both up to their
 * timeouts. For everyone else they are missing, even while their records
 * do not name the round yet (a joiner's does not until it has placed
 * itself): its line is short until it comes. @fresh, if not NULL, counts
 * the missing members whose records were refreshed lately.
 */
static int missing(const struct mp_ctx *ctx, uint32_t round, struct mp_decl *d, int n,
		   uint64_t *one, int placer, int *fresh)
{
	uint64_t now = mp_now_ns(), wall = mp_wall_ms();
	uint64_t half_ttl = (uint64_t)ctx->cfg.record_ttl_ms / 2;
	int miss = 0;

	qsort(d, (size_t)n, sizeof(*d), cmp_decl_id);
	for (int i = 0; i < ctx->dht->nrecs; i++) {
		const struct mp_record *r = &ctx->dht->recs[i];
		struct mp_decl key = {.id = r->id}, *f;
		if (r->id == ctx->self_id || !takes_part(ctx, r, round, now))
			continue;
		f = bsearch(&key, d, (size_t)n, sizeof(*d), cmp_decl_id);
		if (!f || (f->mode == MP_DECL_PLACING && !placer)) {
			if (one)
				*one = r->id;
			miss++;
			/* Refreshed within half a TTL (live peers refresh every
			 * third): alive, only late. */
			if (fresh && r->expires_ms > wall + half_ttl)
				(*fresh)++;
		}
	}
	for (int i = 0; i < n && !placer; i++) {
		int counted = 0;
		if (d[i].mode != MP_DECL_PLACING || d[i].id == ctx->self_id)
			continue;
		for (int j = 0; j < ctx->dht->nrecs && !counted; j++)
			counted = ctx->dht->recs[j].id == d[i].id &&
				  takes_part(ctx, &ctx->dht->recs[j], round, now);
		if (!counted && !dropped(ctx, d[i].id, now)) {
			if (one)
				*one = d[i].id;
			miss++;
		}
	}
	return miss;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

/*
 * The first npeers peers of a run take the cells 0..npeers-1 in the order of
 * their ids, which they all see alike. A peer that joins later takes the
 * first cell no live record occupies (or, on a full grid, a cell picked by
 * its id), so the grid stays as full as it can be.
 */
static void take_cell(struct mp_ctx *ctx, int n)
{
	uint64_t cells = mp_grid_cells(&ctx->grid), cell = 0;

	if (ctx->cfg.npeers > 0) {
		uint64_t *ids = malloc((size_t)n * sizeof(*ids));
		if (ids) {
			for (int i = 0; i < n; i++)
				ids[i] = ctx->dht->recs[i].id;
			qsort(ids, (size_t)n, sizeof(*ids), cmp_u64);
			for (int i = 0; i < n; i++)
				if (ids[i] == ctx->self_id)
					cell = (uint64_t)i % cells;
			free(ids);
		}
	} else {
		uint8_t *used = calloc((size_t)cells, 1);
		cell = ctx->self_id % cells;
		if (used) {
			for (int i = 0; i < n; i++) {
				const struct mp_record *r = &ctx->dht->recs[i];
				int c[MP_MAX_GRID_DIMS] = {0};
				if (r->id == ctx->self_id || r->ndims != ctx->grid.ndims)
					continue;
				for (int d = 0; d < r->ndims; d++)
					c[d] = r->coords[d] < 0 || r->coords[d] >= ctx->grid.dims[d] ? 0 :
					       r->coords[d];
				used[mp_grid_cell(&ctx->grid, c)] = 1;
			}
			for (uint64_t c = 0; c < cells; c++)
				if (!used[c]) {
					cell = c;
					break;
				}
			free(used);
		}
	}
	mp_grid_coords(&ctx->grid, cell, ctx->dht->coords);
}

/* DECL and PEER as they arrive on control connections (ctrl.c). */
static int on_decl_msg(void *arg, int peer, const struct mp_wire_hdr *h, const uint8_t *payload)
{
	return mp_mm_on_decl(arg, peer, h, payload);
}

static int on_peer_msg(void *arg, int peer, const struct mp_wire_hdr *h, const uint8_t *payload)
{
	(void)peer;
	return mp_mm_on_peer(arg, h, payload);
}

int mp_dht_start(struct mp_ctx *ctx)
{
	char host[MP_ADDR_STRLEN];
	struct mp_rdv_params p = {.run_name = ctx->run_name, .auth = &ctx->auth,
				  .self_id = ctx->self_id, .port = ctx->cfg.dht_port,
				  .bootstrap = ctx->cfg.bootstrap, .ttl_ms = ctx->cfg.record_ttl_ms};
	int rc;

	if (!mp_rdv_dht_ops) {
		mp_set_init_error("this libmoshpit is built without OpenDHT (the dht rendezvous)");
		return -ENOTSUP;
	}
	ctx->dht = calloc(1, sizeof(*ctx->dht));
	if (!ctx->dht)
		return -ENOMEM;
	ctx->dht->ctx = ctx;
	ctx->dht->rdv = mp_rdv_dht_ops;
	ctx->dht->join_rank = -1;
	const char *stay = getenv("MP_DHT_PLACE_STAY");
	ctx->dht->place_stay = stay && !strcmp(stay, "1");
	ctx->grouping = &mp_dht_grouping_ops;
	ctx->grouping_st = ctx->dht;
	/* Others bootstrap from the host our data plane listens on. */
	snprintf(host, sizeof(host), "%s", ctx->local_addr);
	char *colon = strrchr(host, ':');
	if (colon && ctx->mode != MP_MODE_CLIENT) {
		*colon = 0;
		p.host = host;
	}
	ctx->dht->recs = calloc(MAX_RECORDS, sizeof(*ctx->dht->recs));
	if (!ctx->dht->recs)
		return -ENOMEM;
	mp_ctrl_on(ctx, MP_MSG_DECL, on_decl_msg, ctx, "malformed declaration");
	mp_ctrl_on(ctx, MP_MSG_PEER, on_peer_msg, ctx, "malformed or refused record");
	rc = ctx->dht->rdv->init(&p, &ctx->dht->rdv_st);
	if (rc) {
		mp_set_init_error("dht rendezvous: cannot start a node (port %d, bootstrap %s): %s",
				  ctx->cfg.dht_port, ctx->cfg.bootstrap ? ctx->cfg.bootstrap : "none",
				  mp_strerror(rc));
		return rc;
	}
	rc = publish_self(ctx);
	if (rc) {
		mp_set_init_error("dht rendezvous: cannot publish this peer: %s", mp_strerror(rc));
		return rc;
	}
	MP_INFO("dht: peer %016" PRIx64 " published (%s)", ctx->self_id,
		ctx->mode == MP_MODE_CLIENT ? "client" : ctx->mode == MP_MODE_AUX ? "aux" : "normal");
	return 0;
}

void mp_dht_count_refused(struct mp_dht *dht, int reason)
{
	if (dht && reason >= 0 && reason < MP_RDV_REFUSED_N)
		__atomic_add_fetch(&dht->refused_by[reason], 1, __ATOMIC_RELAXED);
}

/* "; refused 6 record(s): 6 not made with this run's key (...)", or "" when
 * nothing was refused: what a join that saw too few peers tells the user. */
static void refusals_text(struct mp_ctx *ctx, char *buf, size_t len)
{
	static const char *const why[MP_RDV_REFUSED_N] = {
		[MP_RDV_REFUSED_KEY] = "not made with this run's key (the MAC does not verify: "
				       "another MP_RUN_KEY?)",
		[MP_RDV_REFUSED_RUN] = "of another run",
		[MP_RDV_REFUSED_SETTINGS] = "with other settings than this peer's",
		[MP_RDV_REFUSED_MALFORMED] = "malformed",
		[MP_RDV_REFUSED_WELCOME] = "from askers of this peer's welcome without the run's key",
	};
	uint64_t by[MP_RDV_REFUSED_N] = {0}, total = 0;
	size_t off;

	if (ctx->dht->rdv->refusals)
		ctx->dht->rdv->refusals(ctx->dht->rdv_st, by);
	for (int i = 0; i < MP_RDV_REFUSED_N; i++) {
		by[i] += __atomic_load_n(&ctx->dht->refused_by[i], __ATOMIC_RELAXED);
		total += by[i];
	}
	buf[0] = 0;
	if (!total) {
		snprintf(buf, len, "; no record was refused");
		return;
	}
	off = (size_t)snprintf(buf, len, "; refused %" PRIu64 " record(s):", total);
	for (int i = 0, n = 0; i < MP_RDV_REFUSED_N && off < len; i++)
		if (by[i])
			off += (size_t)snprintf(buf + off, len - off, "%s %" PRIu64 " %s", n++ ? "," : "",
						by[i], why[i]);
}

/* Index of this peer's id among the sorted ids of the @n records seen. */
static int rank_among(const struct mp_ctx *ctx, int n)
{
	int below = 0;

	for (int i = 0; i < n; i++)
		below += ctx->dht->recs[i].id < ctx->self_id;
	return below;
}

/*
 * Before the first round: wait to see the whole starting set (cfg.npeers),
 * so that everybody places it alike, then take a cell. With cfg.npeers,
 * mp_init does this (mp_dht_join), so that mp_rank and mp_npeers mean
 * something when it returns; a launcher that must read the first peer's
 * DHT address before the others exist gives it MP_DHT_PORT. Without, the
 * first average does it, on the progress thread, and mp_init returns at
 * once.
 */
static int place(struct mp_ctx *ctx)
{
	uint64_t start = mp_now_ns(), until = start + (uint64_t)ctx->cfg.join_timeout_ms * 1000000ull;
	uint64_t since = start;
	int n = 0, rc, seen = -1;

	for (;;) {
		n = ctx->dht->rdv->members(ctx->dht->rdv_st, ctx->dht->recs, MAX_RECORDS);
		if (n < 0) {
			mp_set_error(ctx, "dht rendezvous: %s", mp_strerror(n));
			return n;
		}
		/* A peer joining a running run (npeers 0) waits until its new
		 * DHT node has learnt the members: the count held for a while.
		 * One that bootstraps from others is never alone: seeing only
		 * itself means its node has not reached them yet. Without a
		 * bootstrap it starts the run, after the request timeout. */
		uint64_t now = mp_now_ns();
		if (n != seen)
			since = now;
		seen = n;
		/* Others that are joining too do not count: two new nodes can
		 * find each other's records before either finds the run's, and
		 * would place themselves on a grid of two. */
		int running = 0;
		for (int i = 0; i < n; i++)
			running += ctx->dht->recs[i].id != ctx->self_id && ctx->dht->recs[i].round != ROUND_JOINING;
		/* A welcome brought the members at once: no need to wait. */
		int welcomed = ctx->dht->rdv->welcomed && ctx->dht->rdv->welcomed(ctx->dht->rdv_st);
		int learnt = (now - since >= PLACE_STEADY_NS || welcomed) &&
			     (running > 0 || (!ctx->cfg.bootstrap &&
					      now - start >= (uint64_t)ctx->cfg.request_timeout_ms * 1000000ull));
		if ((ctx->cfg.npeers ? n >= ctx->cfg.npeers : learnt) || mp_now_ns() >= until ||
		    __atomic_load_n(&ctx->stop, __ATOMIC_ACQUIRE))
			break;
		struct timespec ts = {0, 20 * 1000 * 1000};
		nanosleep(&ts, NULL);
	}
	if (n < ctx->cfg.npeers) {
		char why[512];

		refusals_text(ctx, why, sizeof(why));
		mp_set_error(ctx, "dht rendezvous: saw %d of the %d peers (MP_NPEERS) within %d ms "
			     "(MP_JOIN_TIMEOUT_MS; bootstrap %s)%s", n, ctx->cfg.npeers,
			     ctx->cfg.join_timeout_ms, ctx->cfg.bootstrap ? ctx->cfg.bootstrap : "none",
			     why);
		MP_WARN("%s", mp_last_error(ctx));
		return -ETIMEDOUT;
	}
	take_cell(ctx, n);
	__atomic_store_n(&ctx->dht->join_npeers, n, __ATOMIC_RELEASE);
	__atomic_store_n(&ctx->dht->join_rank, rank_among(ctx, n), __ATOMIC_RELEASE);
	uint32_t r = 0;
	sync_members(ctx, &r);
	ctx->round = r;
	ctx->dht->placed = 1;
	/* A peer joining a running run learns its round from the others. */
	ctx->dht->need_probe = ctx->cfg.npeers == 0;
	rc = publish_self(ctx);
	if (rc)
		return rc;
	char cbuf[64];
	int len = 0;
	for (int i = 0; i < ctx->grid.ndims; i++)
		len += snprintf(cbuf + len, sizeof(cbuf) - (size_t)len, i ? ",%d" : "%d", ctx->dht->coords[i]);
	MP_INFO("dht: sees %d peer(s); rank %d, cell (%s), round %u", n, ctx->dht->join_rank, cbuf,
		ctx->round);
	return 0;
}

int mp_dht_join(struct mp_ctx *ctx)
{
	return place(ctx);
}

void mp_dht_stop(struct mp_ctx *ctx)
{
	if (!ctx->dht)
		return;
	if (ctx->dht->rdv_st) {
		ctx->dht->rdv->fini(ctx->dht->rdv_st);
		ctx->dht->rdv_st = NULL;
	}
	free(ctx->dht->recs);
	ctx->dht->recs = NULL;
	free(ctx->dht->heard);
	free(ctx->dht);
	ctx->dht = NULL;
}

int mp_mm_address(struct mp_ctx *ctx, char *buf, size_t len)
{
	if (!ctx->dht || !ctx->dht->rdv_st)
		return -ENOTSUP;
	return ctx->dht->rdv->address(ctx->dht->rdv_st, buf, len);
}

void mp_mm_leave(struct mp_ctx *ctx)
{
	if (!ctx->dht || !ctx->dht->rdv_st)
		return;
	mp_ctrl_bye_all(ctx);
	if (ctx->dht->rdv->leave)
		ctx->dht->rdv->leave(ctx->dht->rdv_st);
	MP_INFO("left the run");
}

/* ---- one round's matchmaking --------------------------------------------- */

enum { SEEK, LEAD, FOLLOW };

struct mm {
	struct mp_ctx *ctx;
	uint32_t round;
	int dim;
	char key[160];
	int state;
	int leader;               /* FOLLOW: peer index of the leader */
	uint64_t leader_exp;      /* FOLLOW: the leader's declared expiration (wall ms) */
	uint64_t join_at;         /* FOLLOW: when the JOIN went out (0 = not yet) */
	uint64_t follow_at;       /* FOLLOW: when we chose the leader */
	int accepted;             /* FOLLOW: the leader took our JOIN */
	uint64_t excluded[MAX_DECLS];
	uint64_t excl_until[MAX_DECLS]; /* busy: asked again from then (ns); 0: for good */
	int nexcl;
	struct mp_mm_entry fol[MP_MAX_GROUP]; /* LEAD: followers */
	int fol_peer[MP_MAX_GROUP];
	int nfol;
	int target, minsz;
	struct mp_decl decls[MAX_DECLS];
	struct mp_reqq later;     /* messages of future rounds */
	int company;              /* a live peer besides us declared under the key */
	int ndecl;                /* live declarations under the key, own included */
	int nlive;                /* those of them not from peers taken for gone or dropped */
	char rkey[32];            /* the round's key (round_key) */
	struct mp_decl *all;      /* scratch: declarations under rkey */
	int nround;               /* live declarations under rkey, own included */
	int nmissing;             /* members of the round not among them (missing()) */
	uint64_t missing_id;      /* one of them, for the log */
	/* For the log of a round that waited out its matchmaking time: the
	 * counts as last read before our declaration expired. Read at the
	 * end, every declaration of the round has expired with ours, and the
	 * counts say nothing of what was waited for. */
	int seen_ndecl, seen_nlive, seen_missing;
	uint64_t seen_missing_id;
	uint32_t line;            /* our line (line_of) */
	int next;                 /* once in a group: our next coordinate */
	uint64_t round_at;        /* when rkey was last read */
	struct mp_decl self;      /* our declaration */
	int redirects;            /* followers handed over to an earlier leader */
};

/*
 * Ask a few live peers which round they are at; their answers raise
 * ctx->dht->round_hint while we matchmake. Used by a peer that joined a running
 * run, and by one that found nobody under its key (it has fallen behind, or
 * the others are ahead).
 */
static void probe(struct mp_ctx *ctx)
{
	int asked = 0, start = 0;

	if (ctx->npeers > 1) {
		uint32_t r;
		mp_auth_random(&r, sizeof(r));
		start = (int)(r % (uint32_t)ctx->npeers);
	}
	for (int i = 0; i < ctx->npeers && asked < PROBES; i++) {
		int p = (start + i) % ctx->npeers;
		struct mp_peer *pe = &ctx->peers[p];
		struct mp_wire_hdr h = {.type = MP_MSG_JOIN, .aux = JOIN_PROBE};
		int err;

		if (p == ctx->rank || pe->gone || pe->mode == MP_MODE_CLIENT || !pe->addr[0])
			continue;
		if (!mp_conn_get(ctx, p, ctx->streams, &err) && err == -ENOTCONN)
			continue;
		/* Not connected yet: the send is retried by the next probe. */
		if (!mp_ctrl_send(ctx, p, &h, NULL, 0))
			asked++;
	}
}

/* "r<round>/d<dim>/<c0>.*.<c2>": the round and every coordinate but the varied one. */
static void group_key(const struct mp_ctx *ctx, uint32_t round, const int *coords, char *key,
		      size_t cap)
{
	int dim = (int)(round % (uint32_t)ctx->grid.ndims);
	int len = snprintf(key, cap, "r%u/d%d/", round, dim);

	for (int i = 0; i < ctx->grid.ndims && len > 0 && (size_t)len < cap; i++) {
		if (i == dim)
			len += snprintf(key + len, cap - (size_t)len, i ? ".*" : "*");
		else
			len += snprintf(key + len, cap - (size_t)len, i ? ".%d" : "%d", coords[i]);
	}
}

/* "r<round>/all": every peer of the round declares here too, so that a
 * leader can tell when nobody else is coming and a joiner can find holes. */
static void round_key(uint32_t round, char *key, size_t cap)
{
	snprintf(key, cap, "r%u/all", round);
}

/* The line of @coords along @dim: its cell index with that coordinate 0. */
static uint32_t line_of(const struct mp_ctx *ctx, const int *coords, int dim)
{
	int c[MP_MAX_GRID_DIMS];

	memcpy(c, coords, sizeof(c));
	c[dim] = 0;
	return (uint32_t)mp_grid_cell(&ctx->grid, c);
}

/*
 * Declarations over control connections. A declaration reaches the others
 * through the DHT, where a key's values can take seconds to reach a
 * listener: a new node's first searches, or any search through the nodes
 * of peers that just died. A small run also sends each one over the control
 * connections; the DHT stays the authority and this only brings it sooner.
 * What arrives is taken under the keys it belongs to when this peer holds
 * them (rdv learn), else kept in ctx->dht->heard until the round starts here.
 */
static void gossip(struct mp_ctx *ctx, uint32_t round, const struct mp_decl *d)
{
	struct mp_wire_hdr h = {.type = MP_MSG_DECL, .round = round};
	uint8_t p[DECL_MSG_LEN];

	if (!gossiping(ctx) || !ctx->dht->rdv->learn)
		return;
	mp_le_put64(p, d->id);
	mp_le_put64(p + 8, d->expires_ms);
	p[16] = d->mode;
	mp_le_put16(p + 17, (uint16_t)d->coord);
	mp_le_put32(p + 19, d->line);
	mp_ctrl_send_all(ctx, &h, p, sizeof(p), -1); /* who misses it reads the DHT */
}

/* Take @d of @round under the round's key and, a declaration in a line,
 * under that line's group key too; those this peer does not hold are skipped.
 * 0 when both were taken. */
static int learn(struct mp_ctx *ctx, uint32_t round, const struct mp_decl *d)
{
	char key[160];
	int c[MP_MAX_GRID_DIMS] = {0}, rc;

	round_key(round, key, sizeof(key));
	rc = ctx->dht->rdv->learn(ctx->dht->rdv_st, key, d);
	if (d->mode >= MP_DECL_ABSENT) /* absent, placing or moved on: in no line */
		return rc;
	mp_grid_coords(&ctx->grid, d->line, c);
	group_key(ctx, round, c, key, sizeof(key));
	return ctx->dht->rdv->learn(ctx->dht->rdv_st, key, d) ? -ENOENT : rc;
}

/* A new round starts here: what was heard for it is taken now that its keys
 * are held; what was heard for rounds before it is dropped. */
static void heard_replay(struct mp_ctx *ctx, uint32_t round)
{
	int j = 0;

	ctx->dht->mm_round = round;
	for (int i = 0; i < ctx->dht->nheard; i++) {
		if (ctx->dht->heard[i].round == round)
			learn(ctx, round, &ctx->dht->heard[i].d);
		if (ctx->dht->heard[i].round > round)
			ctx->dht->heard[j++] = ctx->dht->heard[i];
	}
	ctx->dht->nheard = j;
}

int mp_mm_on_decl(struct mp_ctx *ctx, int peer, const struct mp_wire_hdr *h,
		  const uint8_t *payload)
{
	struct mp_decl d;

	if (mp_mm_decl_parse(payload, h->length, &d))
		return -EBADMSG;
	/* Its own, in a line of our grid, placing itself or moved on to a
	 * later round; or another peer's absence (a member it saw die),
	 * never ours. */
	if (d.mode == MP_DECL_ABSENT) {
		if (!d.id || d.line != UINT32_MAX || d.coord)
			return -EBADMSG;
		if (d.id == ctx->self_id)
			return -ESTALE; /* it saw our connection close: we know better */
		/* A member saw it die: so do we, until a newer record of it
		 * (an exchange waiting to connect to it gives up at once). */
		int idx = mp_peer_find(ctx, d.id);
		if (idx >= 0)
			mp_peer_suspect(ctx, idx, NULL);
	} else if (d.id != ctx->peers[peer].id || d.mode > MP_DECL_MOVED ||
	    (d.mode >= MP_DECL_PLACING ? d.line != UINT32_MAX :
	     d.line >= mp_grid_cells(&ctx->grid) || d.coord < 0 ||
	     d.coord >= ctx->grid.dims[h->round % (uint32_t)ctx->grid.ndims]))
		return -EBADMSG;
	/* Members declare in their lines as their rounds start: a joiner
	 * learns where the run is (catch_up) from these as well as from the
	 * answers to its probes. Not from placing peers: they aim ahead. */
	if (d.mode < MP_DECL_ABSENT && h->round > ctx->dht->decl_round)
		ctx->dht->decl_round = h->round;
	if (!ctx->dht->rdv || !ctx->dht->rdv->learn || h->round < ctx->dht->mm_round)
		return -ESTALE; /* a round we are done with: its keys are forgotten */
	if (h->round == ctx->dht->mm_round && !learn(ctx, h->round, &d))
		return 0;
	/* Ahead of us, or a key not held yet: kept for heard_replay. The
	 * oldest goes when full. */
	for (int i = 0; i < ctx->dht->nheard; i++)
		if (ctx->dht->heard[i].round == h->round && ctx->dht->heard[i].d.id == d.id) {
			ctx->dht->heard[i].d = d;
			return 0;
		}
	if (!ctx->dht->heard && !(ctx->dht->heard = malloc(MP_HEARD_MAX * sizeof(*ctx->dht->heard))))
		return -ENOMEM;
	if (ctx->dht->nheard == MP_HEARD_MAX)
		memmove(ctx->dht->heard, ctx->dht->heard + 1, (MP_HEARD_MAX - 1) * sizeof(*ctx->dht->heard));
	else
		ctx->dht->nheard++;
	ctx->dht->heard[ctx->dht->nheard - 1] = (struct mp_heard){.round = h->round, .d = d};
	return 0;
}

static void prewarm(struct mp_ctx *ctx, uint32_t round)
{
	char key[160];
	struct mp_decl d;

	group_key(ctx, round, ctx->dht->coords, key, sizeof(key));
	ctx->dht->rdv->declared(ctx->dht->rdv_st, key, &d, 1);
	round_key(round, key, sizeof(key));
	ctx->dht->rdv->declared(ctx->dht->rdv_st, key, &d, 1);
}

/*
 * How many members the leader waits for: the target, or everyone who has
 * declared under the key when that is more. On a full grid a peer that
 * joins the run shares a cell, and so a line, with another; with a strict
 * target one of the two would be left out of every round.
 */
static int want(const struct mm *m)
{
	int w = m->nlive > m->target ? m->nlive : m->target;
	return w < MP_MAX_GROUP ? w : MP_MAX_GROUP;
}

static void send_reject(struct mm *m, int peer, int why)
{
	struct mp_wire_hdr h = {.type = MP_MSG_REJECT, .round = m->round, .aux = (uint32_t)why};
	mp_ctrl_send(m->ctx, peer, &h, NULL, 0);
}

static int excl_index(const struct mm *m, uint64_t id)
{
	for (int i = 0; i < m->nexcl; i++)
		if (m->excluded[i] == id)
			return i;
	return -1;
}

/*
 * Not to be followed this round. A peer excluded as busy is followed again
 * once BUSY_RETRY_NS have passed, but only by a peer without followers (a
 * leader with some would hand them over to it, busy or not). Excluded for
 * good, a peer that was still following a dead leader when we asked kept
 * us apart after it took the lead: two leaders in one line, each waiting
 * for the other's members until the matchmaking time was up.
 */
static int excluded(const struct mm *m, uint64_t id)
{
	int i = excl_index(m, id);

	if (i < 0)
		return 0;
	return !m->excl_until[i] || m->nfol || mp_now_ns() < m->excl_until[i];
}

/* @busy: the peer refused us as busy (REJ_BUSY). */
static void exclude_as(struct mm *m, uint64_t id, int busy)
{
	int i = excl_index(m, id);

	if (i < 0) {
		if (m->nexcl >= MAX_DECLS)
			return;
		i = m->nexcl++;
	} else if (!m->excl_until[i]) {
		return; /* for good already */
	}
	m->excluded[i] = id;
	m->excl_until[i] = busy ? mp_now_ns() + BUSY_RETRY_NS : 0;
}

static void exclude(struct mm *m, uint64_t id)
{
	exclude_as(m, id, 0);
}

static void on_join(struct mm *m, struct mp_ctrl_msg *msg)
{
	struct mp_ctx *ctx = m->ctx;
	struct mp_mm_entry e;

	if (mp_mm_join_parse(msg->payload, msg->h.length, &e) ||
	    e.id != ctx->peers[msg->peer].id) {
		MP_WARN("round %u: malformed JOIN from peer %016" PRIx64, m->round,
			ctx->peers[msg->peer].id);
		MP_STAT_ADD(ctx->rejected[MP_REJ_UNEXPECTED], 1);
		return;
	}
	if (ctx->mode == MP_MODE_CLIENT || m->state == FOLLOW) {
		send_reject(m, msg->peer, REJ_BUSY);
		return;
	}
	for (int i = 0; i < m->nfol; i++)
		if (m->fol[i].id == e.id)
			return; /* a repeated JOIN */
	if (m->nfol + 1 >= want(m)) {
		send_reject(m, msg->peer, REJ_FULL);
		return;
	}
	mp_peer_learn(ctx, e.id, e.addr, e.bw, e.mode);
	struct mp_wire_hdr ack = {.type = MP_MSG_ACCEPT, .round = m->round};
	mp_ctrl_send(ctx, msg->peer, &ack, NULL, 0);
	m->fol[m->nfol] = e;
	m->fol_peer[m->nfol++] = msg->peer;
	m->state = LEAD;
	MP_TRACE("round %u: %016" PRIx64 " joins us (%d of %d)", m->round, e.id, m->nfol + 1,
		 m->target);
}

static int cmp_entry(const void *a, const void *b)
{
	const struct mp_mm_entry *x = a, *y = b;
	if (x->coord != y->coord)
		return x->coord < y->coord ? -1 : 1;
	return x->id < y->id ? -1 : x->id > y->id;
}

/*
 * Member @me's coordinate after the round: that of member (me + gid mod k)
 * mod k, as take_roster says. Two peers can come to hold one cell, when a
 * joiner reads the round's declarations before the last of them arrives;
 * trading keeps that cell doubly held, and another line one short, for ever
 * (a group only permutes the coordinates it holds). So the later of two
 * members that come out with one coordinate is displaced: before its next
 * round it looks for the hole (take_hole). It does not simply take a value
 * the group does not hold: that may be the cell of a line member that is
 * only missing from this round. Every member computes the same from the
 * roster.
 */
static int next_coord(struct mp_ctx *ctx, uint32_t round, const struct mp_mm_entry *ro, int k,
		      uint32_t gid, int me)
{
	uint8_t taken[MP_MAX_GROUP] = {0};
	int mine = -1;

	for (int i = 0; i < k; i++) {
		int c = ro[(uint32_t)(i + (int)(gid % (uint32_t)k)) % (uint32_t)k].coord;
		if (i == me) {
			mine = c;
			if (c < MP_MAX_GROUP && taken[c]) {
				MP_INFO("round %u: our next cell is another member's too; looking for "
					"a hole before the next round", round);
				ctx->dht->displaced = 1;
			}
		}
		if (c < MP_MAX_GROUP)
			taken[c] = 1;
	}
	return mine;
}

/*
 * Fill @g from a roster; 0, or -EBADMSG if it does not describe a group with
 * us. It also sets our next coordinate: the members trade the coordinates
 * they hold in the varied dimension, member i (roster order, which is also
 * the part index) taking that of member (i + gid mod k) mod k.
 *
 *  - On a full line the held coordinates are 0..M-1, so member i moves to
 *    (i + gid) mod M: groupmates separate, and on a full grid each line of
 *    the next round holds one member of every group of this one (the exact
 *    mean after d rounds). The offset from the group id keeps a short group
 *    from packing its members into the low coordinates round after round.
 *  - A group never takes a cell it does not hold, so a member that is
 *    missing (dead, late, alone, skipping a round) finds its cell free when
 *    it comes back, and a joiner that takes a hole (take_hole) keeps it: two
 *    peers never come to share a cell, and a line never holds more than M.
 */
static int take_roster(struct mm *m, struct mp_mm_entry *ro, int k, uint32_t gid,
		       struct mp_group *g, double *bw, uint8_t *mode)
{
	struct mp_ctx *ctx = m->ctx;
	int me = -1;

	for (int i = 0; i < k; i++) {
		for (int j = 0; j < i; j++)
			if (ro[j].id == ro[i].id)
				return -EBADMSG;
		if (ro[i].id == ctx->self_id) {
			me = i;
			g->members[i] = ctx->rank;
		} else {
			int idx = mp_peer_learn(ctx, ro[i].id, ro[i].addr, ro[i].bw, ro[i].mode);
			if (idx < 0)
				return -EBADMSG;
			g->members[i] = idx;
		}
		bw[i] = ro[i].mode == MP_MODE_CLIENT ? 0.0 : ro[i].bw;
		mode[i] = (uint8_t)ro[i].mode;
	}
	if (me < 0)
		return -EBADMSG;
	/* Members of the group trade cells (see above). */
	int dims = ctx->grid.dims[m->dim];
	for (int i = 0; i < k; i++)
		if (ro[i].coord < 0 || ro[i].coord >= dims)
			return -EBADMSG;
	m->next = next_coord(ctx, m->round, ro, k, gid, me);
	g->id = gid;
	g->size = k;
	g->my_index = me;
	g->bw = bw;
	g->mode = mode;
	return 0;
}

static int on_begin(struct mm *m, struct mp_ctrl_msg *msg, struct mp_group *g, double *bw,
		    uint8_t *mode)
{
	struct mp_ctx *ctx = m->ctx;
	struct mp_mm_entry *ro = calloc(MP_MAX_GROUP, sizeof(*ro));
	int k = 0, rc, has_leader = 0;

	if (!ro)
		return -ENOMEM;
	rc = mp_mm_begin_parse(msg->payload, msg->h.length, ro, &k);
	for (int i = 0; i < k && !rc; i++)
		has_leader |= ro[i].id == ctx->peers[msg->peer].id;
	if (!rc && (!has_leader || !msg->h.group_id))
		rc = -EBADMSG;
	if (!rc)
		rc = take_roster(m, ro, k, msg->h.group_id, g, bw, mode);
	free(ro);
	if (rc) {
		MP_WARN("round %u: malformed BEGIN from peer %016" PRIx64, m->round,
			ctx->peers[msg->peer].id);
		MP_STAT_ADD(ctx->rejected[MP_REJ_UNEXPECTED], 1);
	}
	return rc;
}

/* The leader starts the group: roster, BEGIN to every follower, our view. */
static int begin(struct mm *m, struct mp_group *g, double *bw, uint8_t *mode)
{
	struct mp_ctx *ctx = m->ctx;
	struct mp_mm_entry ro[MP_MAX_GROUP];
	uint8_t *buf = malloc(MP_CTRL_PAYLOAD_MAX);
	struct wbuf w = {.p = buf, .cap = MP_CTRL_PAYLOAD_MAX};
	uint32_t gid = 0;
	int k = 0, rc;

	if (!buf)
		return -ENOMEM;
	ro[k++] = self_entry(ctx, m->dim);
	for (int i = 0; i < m->nfol; i++)
		if (!ctx->peers[m->fol_peer[i]].gone)
			ro[k++] = m->fol[i];
	qsort(ro, (size_t)k, sizeof(ro[0]), cmp_entry);
	while (!gid)
		mp_auth_random(&gid, sizeof(gid));
	put_u(&w, (uint64_t)k, 4);
	for (int i = 0; i < k; i++)
		put_entry(&w, &ro[i]);
	rc = w.err ? -EMSGSIZE : 0;
	for (int i = 0; i < m->nfol && !rc; i++) {
		struct mp_wire_hdr h = {.type = MP_MSG_BEGIN, .round = m->round, .group_id = gid};
		if (ctx->peers[m->fol_peer[i]].gone)
			continue;
		/* A follower we cannot tell is missing from the round: the
		 * all-reduce drops it at its timeouts. */
		if (mp_ctrl_send(ctx, m->fol_peer[i], &h, buf, w.len))
			MP_WARN("round %u: BEGIN to %016" PRIx64 " failed", m->round, m->fol[i].id);
	}
	free(buf);
	if (!rc)
		rc = take_roster(m, ro, k, gid, g, bw, mode);
	return rc;
}

static void send_join(struct mm *m)
{
	struct mp_ctx *ctx = m->ctx;
	struct mp_mm_entry e = self_entry(ctx, m->dim);
	uint8_t buf[256];
	struct wbuf w = {.p = buf, .cap = sizeof(buf)};
	struct mp_wire_hdr h = {.type = MP_MSG_JOIN, .round = m->round};
	int rc;

	put_entry(&w, &e);
	rc = mp_ctrl_send(ctx, m->leader, &h, buf, w.len);
	if (!rc) {
		m->join_at = mp_now_ns();
		MP_TRACE("round %u: JOIN sent to %016" PRIx64, m->round, ctx->peers[m->leader].id);
	}
	else if (rc != -EAGAIN) {
		exclude(m, ctx->peers[m->leader].id);
		m->state = SEEK;
	}
}

/*
 * Stop following our leader. One that has our JOIN hears that we withdraw,
 * so that it does not start with us in its roster: a member that never
 * comes costs the group its timeouts, and us a round as a suspect.
 */
static void give_up(struct mm *m)
{
	if (m->join_at)
		send_reject(m, m->leader, REJ_WITHDRAW);
	exclude(m, m->ctx->peers[m->leader].id);
	m->state = SEEK;
}

/* The leader's side of REJ_WITHDRAW: forget the follower. */
static void on_withdraw(struct mm *m, int peer)
{
	for (int i = 0; i < m->nfol; i++)
		if (m->fol_peer[i] == peer) {
			MP_TRACE("round %u: %016" PRIx64 " withdraws", m->round, m->fol[i].id);
			m->fol[i] = m->fol[m->nfol - 1];
			m->fol_peer[i] = m->fol_peer[m->nfol - 1];
			m->nfol--;
			return;
		}
}

/* Are the round's declarations still live (ours, and so those made
 * before it), with a margin for the DHT's own expiry? */
static int before_expiry(const struct mm *m)
{
	return mp_wall_ms() + 100 < m->self.expires_ms;
}

/*
 * Has every live member of the run declared for this round? Then nobody
 * else can come, and a leader need not wait for its deadline.
 */
static int everyone(struct mm *m, uint64_t now)
{
	struct mp_ctx *ctx = m->ctx;

	if (!m->all)
		return 0;
	if (!m->round_at || now - m->round_at >= ROUND_READ_NS) {
		int n = ctx->dht->rdv->declared(ctx->dht->rdv_st, m->rkey, m->all, MAX_RECORDS);
		if (n >= 0) {
			m->nround = n;
			m->nmissing = missing(ctx, m->round, m->all, n, &m->missing_id, 0, NULL);
			if (before_expiry(m)) {
				m->seen_missing = m->nmissing;
				m->seen_missing_id = m->missing_id;
			}
		}
		m->round_at = now;
	}
	return !m->nmissing;
}

/* Tell the round that the peers an exchange dropped lately will not come
 * (their records may live on for up to a TTL). */
static void declare_absent(struct mm *m, uint64_t expires_ms)
{
	struct mp_ctx *ctx = m->ctx;
	uint64_t now = mp_now_ns(), ttl_ns = (uint64_t)ctx->cfg.record_ttl_ms * 1000000ull;

	for (int i = 0; i < ctx->npeers; i++) {
		const struct mp_peer *pe = &ctx->peers[i];
		struct mp_decl d = {.id = pe->id, .expires_ms = expires_ms, .mode = MP_DECL_ABSENT,
				    .line = UINT32_MAX};
		if (i == ctx->rank || pe->gone || !pe->failed_ns || now - pe->failed_ns >= ttl_ns)
			continue;
		ctx->dht->rdv->declare(ctx->dht->rdv_st, m->rkey, &d);
		gossip(ctx, m->round, &d);
	}
}

/*
 * Our line's declarations: those under its key and, since the two keys
 * travel through the DHT apart, those of the round's key that name our
 * line; sorted by (expiration, id).
 */
static int line_decls(struct mm *m, uint64_t now)
{
	struct mp_ctx *ctx = m->ctx;
	int n = ctx->dht->rdv->declared(ctx->dht->rdv_st, m->key, m->decls, MAX_DECLS), k;

	if (n < 0)
		n = 0;
	/* An absence or a placing belongs under the round's key only. */
	k = 0;
	for (int i = 0; i < n; i++)
		if (m->decls[i].mode < MP_DECL_ABSENT)
			m->decls[k++] = m->decls[i];
	n = k;
	everyone(m, now);
	for (int i = 0; i < m->nround && k < MAX_DECLS; i++) {
		const struct mp_decl *d = &m->all[i];
		int dup = d->line != m->line || d->mode >= MP_DECL_ABSENT;
		for (int j = 0; j < n && !dup; j++)
			dup = m->decls[j].id == d->id;
		if (!dup)
			m->decls[k++] = *d;
	}
	if (k > n)
		qsort(m->decls, (size_t)k, sizeof(m->decls[0]), mp_decl_cmp);
	return k;
}

/* Pick whom to follow (or lead) from the declarations. */
static void choose(struct mm *m)
{
	struct mp_ctx *ctx = m->ctx;
	uint64_t now = mp_now_ns();
	int n = line_decls(m, now);
	int ci = ctx->streams, err;

	if (n > m->ndecl) {
		MP_TRACE("round %u: %d declaration(s) under %s", m->round, n, m->key);
	}
	m->ndecl = n;
	m->nlive = 0;
	for (int i = 0; i < n; i++) {
		const struct mp_decl *d = &m->decls[i];
		int idx = d->id == ctx->self_id ? ctx->rank : mp_peer_find(ctx, d->id);

		/* A peer that died after declaring leaves its declaration
		 * under the key until it expires, at the end of the
		 * matchmaking time: counted, it held its line's leader to
		 * that end (3 s, ten rounds) with everyone else there. */
		if (d->id == ctx->self_id || !dropped(ctx, d->id, now))
			m->nlive++;
		/* Connect early to everyone who may end up in the group: whoever
		 * is the dialer of a pair must start, or a JOIN could wait on it. */
		if (idx >= 0 && idx != ctx->rank && !ctx->peers[idx].gone)
			mp_conn_get(ctx, idx, ci, &err);
	}
	if (before_expiry(m)) {
		m->seen_ndecl = n;
		m->seen_nlive = m->nlive;
	}
	/* Company is a live peer: a peer cut off from the others (they took
	 * it for gone) reads their declarations too, and must still wait for
	 * them to take it back (lost_company). */
	if (m->nlive > 1)
		m->company = 1;
	if (m->state == FOLLOW)
		return;
	if (m->state == LEAD && m->nfol) {
		/* A leader with followers hands them over to an earlier
		 * declaration that shows up late (its own came through the DHT
		 * first): one group, not two halves of one. */
		const struct mp_decl *best = NULL;
		for (int i = 0; i < n && !best; i++)
			if (m->decls[i].mode != MP_MODE_CLIENT && !excluded(m, m->decls[i].id))
				best = &m->decls[i];
		/* Only to one that is really earlier: once our own declaration
		 * has expired (we came early, and waited) it is missing from the
		 * list, and a later one would look first. */
		int idx = best && best->id != ctx->self_id && mp_decl_cmp(best, &m->self) < 0 ?
			  mp_peer_find(ctx, best->id) : -1;
		if (idx < 0 || ctx->peers[idx].gone || m->redirects >= MAX_REDIRECTS)
			return;
		MP_TRACE("round %u: handing %d follower(s) over to %016" PRIx64, m->round, m->nfol,
			 best->id);
		for (int i = 0; i < m->nfol; i++)
			send_reject(m, m->fol_peer[i], REJ_REDIRECT);
		m->nfol = 0;
		m->redirects++;
	}
	for (int i = 0; i < n; i++) {
		const struct mp_decl *d = &m->decls[i];
		if (d->mode == MP_MODE_CLIENT || excluded(m, d->id))
			continue;
		if (d->id == ctx->self_id) {
			if (m->state != LEAD)
				MP_TRACE("round %u: leading", m->round);
			m->state = LEAD;
			return;
		}
		int idx = mp_peer_find(ctx, d->id);
		if (idx < 0 || ctx->peers[idx].gone)
			continue; /* no record of it yet, or gone: not worth waiting on */
		if (m->state != FOLLOW || m->leader != idx)
			MP_TRACE("round %u: following %016" PRIx64, m->round, d->id);
		m->state = FOLLOW;
		m->leader = idx;
		m->leader_exp = d->expires_ms;
		m->join_at = 0;
		m->accepted = 0;
		m->follow_at = mp_now_ns();
		return;
	}
	/* Nobody to follow: lead, unless we cannot accept anyone. */
	m->state = ctx->mode == MP_MODE_CLIENT ? SEEK : LEAD;
}

static void defer(struct mm *m, struct mp_ctrl_msg *msg)
{
	mp_reqq_push(&m->later, &msg->link);
}

/*
 * Matchmake round @round. Returns 0 with @g filled, or -EHOSTUNREACH when no
 * group formed (the peer keeps its values this round), or -EAGAIN when none
 * formed because the run is at a later round (round_hint).
 */
static int match(struct mp_ctx *ctx, uint32_t round, struct mp_group *g, double *bw,
		 uint8_t *mode, int *next)
{
	struct mm *m = calloc(1, sizeof(*m));
	uint64_t start = mp_now_ns(), last_sync = 0, wall = mp_wall_ms();
	uint64_t mm_ns = (uint64_t)ctx->cfg.matchmaking_ms * 1000000ull;
	uint64_t req_ns = (uint64_t)ctx->cfg.request_timeout_ms * 1000000ull;
	int rc = -EHOSTUNREACH;

	if (!m)
		return -ENOMEM;
	m->ctx = ctx;
	m->round = round;
	m->dim = (int)(round % (uint32_t)ctx->grid.ndims);
	m->target = ctx->cfg.group_size ? ctx->cfg.group_size : ctx->grid.dims[m->dim];
	if (m->target > MP_MAX_GROUP)
		m->target = MP_MAX_GROUP;
	m->minsz = ctx->cfg.min_group_size < m->target ? ctx->cfg.min_group_size : m->target;
	group_key(ctx, round, ctx->dht->coords, m->key, sizeof(m->key));
	struct mp_decl self = {.id = ctx->self_id, .expires_ms = wall + (uint64_t)ctx->cfg.matchmaking_ms,
			       .mode = (uint8_t)ctx->mode, .coord = (int16_t)ctx->dht->coords[m->dim],
			       .line = line_of(ctx, ctx->dht->coords, m->dim)};
	m->self = self;
	rc = ctx->dht->rdv->declare(ctx->dht->rdv_st, m->key, &self);
	if (rc) {
		MP_WARN("round %u: cannot declare under %s: %s", round, m->key, mp_strerror(rc));
		free(m);
		return -EHOSTUNREACH;
	}
	/* Without the round's key (no memory, a failed put) leaders wait for
	 * their deadlines: slower, still correct. */
	round_key(round, m->rkey, sizeof(m->rkey));
	m->line = self.line;
	m->all = malloc(MAX_RECORDS * sizeof(*m->all));
	if (m->all && (rc = ctx->dht->rdv->declare(ctx->dht->rdv_st, m->rkey, &self))) {
		MP_WARN("round %u: cannot declare under %s: %s", round, m->rkey, mp_strerror(rc));
		free(m->all);
		m->all = NULL;
	}
	if (m->all)
		declare_absent(m, self.expires_ms);
	/* take_hole kept its round's key for us; one of a round skipped since
	 * is of no use. */
	if (ctx->dht->kept_round && ctx->dht->kept_round - 1 != round) {
		char kept[32];
		round_key(ctx->dht->kept_round - 1, kept, sizeof(kept));
		ctx->dht->rdv->forget(ctx->dht->rdv_st, kept);
	}
	ctx->dht->kept_round = 0;
	heard_replay(ctx, round);
	gossip(ctx, round, &self);
	rc = -EHOSTUNREACH;
	MP_TRACE("round %u: looking for a group under %s (target %d, min %d)", round, m->key,
		 m->target, m->minsz);
	uint64_t probe_at = ctx->dht->need_probe ? start : UINT64_MAX;
	for (;;) {
		uint64_t now = mp_now_ns();
		struct mp_ctrl_msg *msg;
		int started = 0;

		if (__atomic_load_n(&ctx->stop, __ATOMIC_ACQUIRE)) {
			rc = -ECANCELED;
			break;
		}
		mp_ctrl_poll(ctx);
		if (ctx->suspects != ctx->dht->suspects_seen && m->all) {
			/* A connection showed a peer dead: tell the round now,
			 * not at the next one. */
			ctx->dht->suspects_seen = ctx->suspects;
			declare_absent(m, m->self.expires_ms);
		}
		if (now - last_sync > SYNC_NS) {
			sync_members(ctx, NULL);
			last_sync = now;
		}
		if (now >= probe_at) {
			/* Again a little later: the first may find no connection. */
			probe(ctx);
			probe_at = now + SYNC_NS * 4;
		}
		if (ctx->dht->round_hint > round && !m->nfol) {
			MP_INFO("round %u: the run is at round %u; catching up", round, ctx->dht->round_hint);
			if (m->state == FOLLOW)
				give_up(m);
			rc = -EAGAIN;
			break;
		}
		while (!started && (msg = mp_ctrl_take(ctx))) {
			if (msg->h.type == MP_MSG_JOIN && msg->h.aux == JOIN_PROBE) {
				/* The round we are at, no more: a peer that is behind
				 * jumps to what it hears, so an answer ahead of the truth
				 * would feed on itself from peer to peer. */
				struct mp_wire_hdr h = {.type = MP_MSG_REJECT, .round = round,
							.aux = REJ_STALE};
				mp_ctrl_send(ctx, msg->peer, &h, NULL, 0);
				mp_ctrl_msg_free(msg);
				continue;
			}
			if (msg->h.type == MP_MSG_REJECT && msg->h.aux == REJ_STALE) {
				/* We are behind: the answer says where the run is. */
				if (msg->h.round > ctx->dht->round_hint)
					ctx->dht->round_hint = msg->h.round;
				if (m->state == FOLLOW && msg->peer == m->leader) {
					exclude(m, ctx->peers[m->leader].id);
					m->state = SEEK;
				}
				mp_ctrl_msg_free(msg);
				continue;
			}
			if (msg->h.round > round) {
				defer(m, msg);
				continue;
			}
			if (msg->h.round < round) {
				if (msg->h.type == MP_MSG_JOIN)
					send_reject(m, msg->peer, REJ_STALE);
			} else if (msg->h.type == MP_MSG_JOIN) {
				on_join(m, msg);
			} else if (msg->h.type == MP_MSG_BEGIN) {
				/* From our leader, or from one we gave up on while we
				 * have no followers of our own: either way a confirmed
				 * place, and refusing it would leave a hole in a group
				 * that has started. A leader we follow now is told. */
				if (!m->nfol && !on_begin(m, msg, g, bw, mode)) {
					if (m->state == FOLLOW && msg->peer != m->leader)
						give_up(m);
					rc = 0;
					started = 1;
				}
			} else if (msg->h.type == MP_MSG_ACCEPT) {
				if (m->state == FOLLOW && msg->peer == m->leader)
					m->accepted = 1;
			} else if (msg->h.type == MP_MSG_REJECT && msg->h.aux == REJ_WITHDRAW) {
				on_withdraw(m, msg->peer);
			} else if (msg->h.type == MP_MSG_REJECT && m->state == FOLLOW &&
				   msg->peer == m->leader) {
				MP_TRACE("round %u: %016" PRIx64 " refused us (%u)", round,
					 ctx->peers[m->leader].id, msg->h.aux);
				exclude_as(m, ctx->peers[m->leader].id, msg->h.aux == REJ_BUSY);
				m->state = SEEK;
			}
			mp_ctrl_msg_free(msg);
		}
		if (started)
			break;
		if (m->state == FOLLOW && ctx->peers[m->leader].gone) {
			exclude(m, ctx->peers[m->leader].id);
			m->state = SEEK;
		}
		choose(m);
		if (m->state == FOLLOW) {
			/* A leader that is still matchmaking ACCEPTs at once, then
			 * answers at the latest at its expiration, when it starts or
			 * disbands. No ACCEPT within the request timeout: it has
			 * started without us (it is busy in its all-reduce) or is
			 * gone. A broken control connection: not coming back. */
			if (!m->join_at && now > m->follow_at &&
			    now - m->follow_at > (uint64_t)ctx->cfg.connect_timeout_ms * 1000000ull) {
				MP_TRACE("round %u: cannot reach %016" PRIx64, round,
					 ctx->peers[m->leader].id);
				exclude(m, ctx->peers[m->leader].id);
				m->state = SEEK;
			} else if (!m->join_at)
				send_join(m);
			else if ((!m->accepted && now > m->join_at && now - m->join_at > req_ns) ||
				 mp_wall_ms() > m->leader_exp + (uint64_t)ctx->cfg.request_timeout_ms ||
				 (now > m->join_at && now - m->join_at > mm_ns + req_ns) ||
				 !mp_conn_open(ctx, m->leader, ctx->streams)) {
				MP_TRACE("round %u: no answer from %016" PRIx64, round,
					 ctx->peers[m->leader].id);
				give_up(m);
			}
		}
		if (m->state == LEAD) {
			/* Short of the target, a leader starts once every live
			 * member of the run has declared for this round and all of
			 * its line has joined: nobody else can come. Starting
			 * earlier, when the line merely went quiet, left out members
			 * that were only late (their last group lost someone), and
			 * the rounds after fell out of step with them. */
			int done = m->nfol + 1 >= m->nlive && everyone(m, now);

			/* Nobody else can come, but only because we took the
			 * others for gone without a goodbye: more likely they took
			 * us for gone (our record reached them late) and closed our
			 * connections. Disbanding at once made such a round alone
			 * last microseconds: a replacement in a 200-round soak ran
			 * 90 of them in 0.3 s, published the round it reached, and
			 * the others jumped to it and fell apart into rounds alone
			 * for the rest of the run. Wait for company until the
			 * request timeout: a newer record brings them back. */
			if (done && !m->nfol && !m->company && now - start < req_ns && lost_company(ctx))
				done = 0;
			if (m->nfol + 1 >= want(m) ||
			    (m->nfol + 1 >= m->minsz && (done || now - start >= mm_ns))) {
				if (m->nfol + 1 < m->target && done)
					MP_INFO("round %u: starting %d of %d under %s (nobody else "
						"declared for the round)", round, m->nfol + 1, m->target,
						m->key);
				else if (m->nfol + 1 < m->target)
					MP_INFO("round %u: starting %d of %d under %s (matchmaking time "
						"is up; before the declarations expired %d had declared "
						"in the line, %d of them live, and %d member(s) of the "
						"run had not declared: %016" PRIx64 "%s)", round,
						m->nfol + 1, m->target, m->key, m->seen_ndecl,
						m->seen_nlive, m->seen_missing,
						m->seen_missing ? m->seen_missing_id : 0,
						m->seen_missing > 1 ? ", ..." : "");
				rc = begin(m, g, bw, mode);
				break;
			}
			if (now - start >= mm_ns || done) {
				for (int i = 0; i < m->nfol; i++)
					send_reject(m, m->fol_peer[i], REJ_DISBAND);
				MP_INFO("round %u: group under %s disbanded: %d of the %d members needed",
					round, m->key, m->nfol + 1, m->minsz);
				/* Nobody else came because the others' records
				 * name later rounds: we are behind, and the
				 * round loop matches theirs in this call. */
				uint32_t at = 0;
				if (sync_members(ctx, &at) > 0 && at > round) {
					MP_INFO("round %u: the run is at round %u; catching up", round, at);
					if (at > ctx->dht->round_hint)
						ctx->dht->round_hint = at;
					rc = -EAGAIN;
				}
				break;
			}
		}
		/* A follower its leader has accepted waits for the leader's
		 * deadline (checked above), which is later than ours when the
		 * leader declared after us; bounded all the same. */
		uint64_t limit = mm_ns + req_ns;
		if (m->state == FOLLOW && m->accepted)
			limit *= 2;
		if (now - start >= limit) {
			MP_INFO("round %u: no group under %s within %d ms", round, m->key,
				(int)(limit / 1000000));
			if (m->state == FOLLOW)
				give_up(m);
			break;
		}
		ctx->ops->progress(ctx->drv, POLL_MS);
	}
	/* Messages of later rounds wait for them, in order. */
	for (struct mp_ctrl_msg *msg; (msg = mp_reqq_pop_entry(&m->later, struct mp_ctrl_msg, link));)
		mp_ctrl_requeue(ctx, msg);
	if (!rc)
		*next = m->next;
	ctx->dht->rdv->forget(ctx->dht->rdv_st, m->key);
	ctx->dht->rdv->forget(ctx->dht->rdv_st, m->rkey);
	free(m->all);
	/* Alone under the key: probably behind the others, or they ahead. */
	ctx->dht->need_probe = rc == -EHOSTUNREACH && !m->company;
	free(m);
	return rc;
}

/*
 * A peer that joins a running run asks where the run is before its first
 * round, rather than spend a round alone under a key the others have left.
 * Waits at most the request timeout; other control messages stay queued.
 */
static void catch_up(struct mp_ctx *ctx)
{
	uint64_t start = mp_now_ns(), last = 0;
	/* The others must learn our record before they take our connections. */
	uint64_t limit = (uint64_t)(ctx->cfg.matchmaking_ms + ctx->cfg.request_timeout_ms) *
			 1000000ull;
	struct mp_reqq keep = {0};
	struct mp_ctrl_msg *msg;
	uint32_t at = 0;

	while (!ctx->dht->round_hint && mp_now_ns() - start < limit &&
	       !__atomic_load_n(&ctx->stop, __ATOMIC_ACQUIRE)) {
		uint64_t now = mp_now_ns();
		/* Declarations of a round say the run is at it, as an answer
		 * would. */
		if (ctx->dht->decl_round) {
			ctx->dht->round_hint = ctx->dht->decl_round;
			break;
		}
		if (now - last > SYNC_NS) {
			sync_members(ctx, &at);
			probe(ctx);
			last = now;
		}
		mp_ctrl_poll(ctx);
		while ((msg = mp_ctrl_take(ctx))) {
			if (msg->h.type == MP_MSG_REJECT && msg->h.aux == REJ_STALE) {
				if (msg->h.round > ctx->dht->round_hint)
					ctx->dht->round_hint = msg->h.round;
				mp_ctrl_msg_free(msg);
				continue;
			}
			mp_reqq_push(&keep, &msg->link);
		}
		ctx->ops->progress(ctx->drv, POLL_MS);
	}
	while ((msg = mp_reqq_pop_entry(&keep, struct mp_ctrl_msg, link)))
		mp_ctrl_requeue(ctx, msg);
	if (!ctx->dht->round_hint && at > ctx->dht->round_hint) {
		/* Nobody answered: the records' rounds, which lag by up to a
		 * refresh period, are the best guess. */
		MP_INFO("no peer said which round the run is at; the records say %u", at);
		ctx->dht->round_hint = at;
	}
	if (ctx->dht->round_hint >= ctx->round) {
		/* That round's groups are forming as we hear of it and would be
		 * gone by the time we declare: the next one (take_hole starts the
		 * search for its key now). Aiming two rounds ahead, to give a new
		 * DHT node's search more time, lost a round for every joiner: a
		 * replacement of a death late in a run never mixed in (and it
		 * made the others skip a round, see front_round). */
		MP_INFO("the run is at round %u; joining at %u", ctx->dht->round_hint, ctx->dht->round_hint + 1);
		ctx->round = ctx->dht->round_hint + 1;
	}
	ctx->dht->need_probe = 0;
	ctx->dht->synced = 1;
}

/* Emptiest line first, then by line and coordinate: an order every placer
 * computes alike from the same declarations. A line where nobody declared
 * comes last, whatever its count: a peer there would average alone that
 * round, and lines look empty when part of the round was not read yet. */
static int cmp_hole(const void *a, const void *b)
{
	const struct mp_hole *x = a, *y = b;

	if (!x->count != !y->count)
		return !x->count ? 1 : -1;
	if (x->count != y->count)
		return x->count < y->count ? -1 : 1;
	if (x->line != y->line)
		return x->line < y->line ? -1 : 1;
	return (x->coord > y->coord) - (x->coord < y->coord);
}

int mp_mm_holes(const struct mp_grid *g, uint64_t self, uint32_t round, const struct mp_decl *all,
		int n, struct mp_hole *h, uint32_t *count, uint8_t *used)
{
	int dim = (int)(round % (uint32_t)g->ndims), nh = 0, c[MP_MAX_GRID_DIMS];
	uint64_t cells = mp_grid_cells(g);

	for (int i = 0; i < n; i++) {
		if (all[i].line >= cells || all[i].id == self || all[i].mode >= MP_DECL_ABSENT)
			continue;
		count[all[i].line]++;
		if (all[i].coord < 0 || all[i].coord >= g->dims[dim])
			continue;
		mp_grid_coords(g, all[i].line, c);
		c[dim] = all[i].coord;
		used[mp_grid_cell(g, c)] = 1;
	}
	for (uint64_t l = 0; l < cells; l++) {
		mp_grid_coords(g, l, c);
		if (c[dim])
			continue;
		for (int v = 0; v < g->dims[dim]; v++) {
			c[dim] = v;
			if (!used[mp_grid_cell(g, c)])
				h[nh++] = (struct mp_hole){.line = (uint32_t)l, .count = count[l], .coord = v};
		}
	}
	qsort(h, (size_t)nh, sizeof(*h), cmp_hole);
	return nh;
}

int mp_mm_round_left(const struct mp_grid *g, uint32_t round, uint32_t heard)
{
	return (uint64_t)heard >= (uint64_t)round + (uint64_t)(g->ndims > 0 ? g->ndims : 1);
}

/*
 * Leave @round (its key @key) for a later one: our "placing" there would
 * keep the round's leaders waiting for us until it expired (a matchmaking
 * timeout: 3 s of a churn test's rounds of 0.3), so it is replaced by
 * "moved on", under the key and over the control connections, before the
 * key is forgotten.
 */
static void moved_on(struct mp_ctx *ctx, uint32_t round, const char *key, const struct mp_decl *pd)
{
	struct mp_decl moved = *pd;
	int rc;

	moved.mode = MP_DECL_MOVED;
	if ((rc = ctx->dht->rdv->declare(ctx->dht->rdv_st, key, &moved)))
		MP_WARN("round %u: cannot say we place ourselves later: %s", round, mp_strerror(rc));
	gossip(ctx, round, &moved);
	ctx->dht->rdv->forget(ctx->dht->rdv_st, key);
}

int mp_mm_line_went_on(const struct mp_ctx *ctx, uint32_t round, uint32_t line,
		       const struct mp_decl *all, int n)
{
	for (int i = 0; i < n; i++) {
		if (all[i].line != line || all[i].mode >= MP_DECL_ABSENT || all[i].id == ctx->self_id)
			continue;
		for (int j = 0; j < ctx->dht->nheard; j++) {
			const struct mp_heard *hd = &ctx->dht->heard[j];

			if (hd->round > round && hd->d.id == all[i].id && hd->d.mode < MP_DECL_ABSENT)
				return 1;
		}
	}
	return 0;
}

uint64_t mp_mm_placing_ms(const struct mp_config *cfg)
{
	return (uint64_t)cfg->matchmaking_ms + (uint64_t)cfg->request_timeout_ms;
}

/*
 * A peer that joins a running run, or one displaced from a cell it shared,
 * moves into a free cell of its round: where a peer died its line is one
 * short, and filling it keeps the grid full (on a full grid, d rounds give
 * the exact mean). It first declares under the round's key that it is
 * placing itself (MP_DECL_PLACING): leaders of the round wait for it, and
 * peers placing themselves at once see each other. Once all the others have
 * declared, the placers, in the order of their ids, take the holes in order
 * (cmp_hole): placers that read the same declarations take different cells
 * (by chance they would often crowd into one, and a shared cell costs both
 * a round). Without a whole view within the matchmaking and request
 * timeouts it keeps its cell.
 */
static void take_hole(struct mp_ctx *ctx)
{
	uint32_t round = ctx->round;
	int dim;
	uint64_t cells = mp_grid_cells(&ctx->grid), start = mp_now_ns(), last = 0;
	uint64_t limit = mp_mm_placing_ms(&ctx->cfg) * 1000000ull;
	int seen, steady, whole = 0, nlast, n = 0, rc, mlast = -2, retargets = 0;
	/* A welcome brought the members at once: their count need not settle. */
	int settle = ctx->dht->rdv->welcomed && ctx->dht->rdv->welcomed(ctx->dht->rdv_st) ? 1 : STEADY_SYNCS;
	uint64_t nsince;
	struct mp_decl *all = malloc(MAX_RECORDS * sizeof(*all));
	uint32_t *count = calloc((size_t)cells, sizeof(*count));
	uint8_t *used = calloc((size_t)cells, 1);
	struct mp_hole *holes = malloc((size_t)cells * sizeof(*holes));
	/* Our "placing" lives as long as we may place: placers rank
	 * themselves among those they read, and one that outlived its
	 * declaration (it lived only the matchmaking time) was read by none
	 * of the others: each counted one placer, itself, and two took the
	 * same cell (doc/reliability.md, "Late records are not deaths"). */
	struct mp_decl pd = {.id = ctx->self_id, .mode = MP_DECL_PLACING, .line = UINT32_MAX,
			     .expires_ms = mp_wall_ms() + mp_mm_placing_ms(&ctx->cfg)};
	char key[32];

	if (!all || !count || !used || !holes)
		goto out;
again:
	/* A round to place in, from the start: nothing read of it yet. */
	dim = (int)(round % (uint32_t)ctx->grid.ndims);
	steady = whole = 0;
	seen = nlast = -1;
	nsince = mp_now_ns();
	memset(count, 0, (size_t)cells * sizeof(*count));
	memset(used, 0, (size_t)cells);
	round_key(round, key, sizeof(key));
	if ((rc = ctx->dht->rdv->declare(ctx->dht->rdv_st, key, &pd)))
		MP_WARN("round %u: cannot say we are placing ourselves: %s", round, mp_strerror(rc));
	heard_replay(ctx, round);
	gossip(ctx, round, &pd);
	while (mp_now_ns() - start < limit && !__atomic_load_n(&ctx->stop, __ATOMIC_ACQUIRE)) {
		uint64_t now = mp_now_ns();
		mp_ctrl_poll(ctx); /* declarations come over control connections too */
		/* Staying for the lines that wait (MP_DHT_PLACE_STAY=1) got
		 * replacements in rounds sooner on an idle machine, and later
		 * under ASan on 2 cores, where a placer can wait seconds for a
		 * whole view while the run goes on: off by default until that
		 * is understood (doc/reliability.md). */
		uint32_t heard = ctx->dht->decl_round;
		if ((ctx->dht->place_stay ? mp_mm_round_left(&ctx->grid, round, heard) : heard > round) &&
		    retargets < MAX_RETARGETS) {
			/* Others declare for a later round (by default), or for
			 * one so late that the lines waiting for us went on too
			 * (staying): this one's groups have formed without us,
			 * and its holes, read now, would be no holes at all.
			 * Place in the next one; not for ever, when rounds are
			 * shorter than our reads. */
			retargets++;
			MP_INFO("round %u: the run is at round %u; placing in %u", round,
				ctx->dht->decl_round, ctx->dht->decl_round + 1);
			moved_on(ctx, round, key, &pd);
			round = ctx->round = ctx->dht->decl_round + 1;
			goto again;
		}
		if (now - last > SYNC_NS) {
			/* A new DHT node learns the records over a while: trust
			 * the count once it held for a few reads. */
			int k = sync_members(ctx, NULL);
			steady = k == seen ? steady + 1 : 0;
			seen = k;
			last = now;
		}
		n = ctx->dht->rdv->declared(ctx->dht->rdv_st, key, all, MAX_RECORDS);
		if (n != nlast)
			nsince = now;
		nlast = n;
		uint64_t one = 0;
		int fresh = 0, miss = n > 0 ? missing(ctx, round, all, n, &one, 1, &fresh) : -1;
		if (miss != mlast)
			MP_TRACE("round %u: placing: %d declaration(s), %d member(s) missing (%016llx), "
				 "%d fresh", round, n, miss, (unsigned long long)one, fresh);
		mlast = miss;
		/* Whole: everyone who takes part has declared. Or nearly, and
		 * settled: the one or two still missing are dead (their records
		 * linger) or placing themselves too, with their "placing" not
		 * read yet. Not a member that is only late: its cell would look
		 * like a hole, and taking it costs both of us a round. */
		if (steady >= settle && n > 1 &&
		    (!miss || (miss <= PLACING_MISSING && !fresh && now - nsince >= PLACING_QUIET_NS))) {
			whole = 1;
			break;
		}
		ctx->ops->progress(ctx->drv, POLL_MS);
	}
	if (!whole) {
		/* Holes read from part of the round would be no holes at all:
		 * several joiners would crowd into one cell. */
		MP_INFO("round %u: saw %d declaration(s), not the whole round; keeping cell", round, n);
		goto out;
	}
	int nh = mp_mm_holes(&ctx->grid, ctx->self_id, round, all, n, holes, count, used);
	/* Our rank among the placers: those still placing, and us. */
	int rank = 0, placers = 1;
	uint64_t now = mp_now_ns();
	for (int i = 0; i < n; i++)
		if (all[i].mode == MP_DECL_PLACING && all[i].id != ctx->self_id &&
		    !dropped(ctx, all[i].id, now)) {
			placers++;
			rank += all[i].id < ctx->self_id;
		}
	if (!nh) {
		MP_INFO("round %u: no free cell (%d declaration(s)); keeping cell", round, n);
		goto out;
	}
	/* More placers than holes: crowd in; a shared cell is found out and
	 * left in the next round (next_coord). */
	const struct mp_hole *h = &holes[rank % nh];
	if (ctx->dht->place_stay && mp_mm_line_went_on(ctx, round, h->line, all, n) &&
	    retargets < MAX_RETARGETS) {
		/* Its line formed its group without us (we stayed for the lines
		 * that wait, mp_mm_round_left, and this one did not): alone
		 * there, we would come out a round behind. */
		retargets++;
		MP_INFO("round %u: line %u went on without us; the run is at round %u, placing in %u",
			round, h->line, ctx->dht->decl_round, ctx->dht->decl_round + 1);
		moved_on(ctx, round, key, &pd);
		round = ctx->round = ctx->dht->decl_round + 1;
		goto again;
	}
	int c[MP_MAX_GRID_DIMS];
	mp_grid_coords(&ctx->grid, h->line, c);
	c[dim] = h->coord;
	MP_INFO("round %u: taking cell %d of line %u (%u member(s) declared there, %d free cell(s), "
		"%d placer(s), %d declaration(s) in the round)", round, h->coord, h->line, h->count,
		nh, placers, n);
	memcpy(ctx->dht->coords, c, sizeof(c));
out:
	/* match() reads the round's key next, with what it holds by then. */
	ctx->dht->kept_round = round + 1;
	free(holes);
	free(used);
	free(count);
	free(all);
}

/* ---- the matchmaker as the context's grouping -------------------------- */

/* Before an operation's rounds: a place on the grid, and for a joiner the
 * run's round. */
static int dht_begin(void *state)
{
	struct mp_ctx *ctx = ((struct mp_dht *)state)->ctx;
	int rc;

	if (ctx->left) {
		mp_set_error(ctx, "this peer has left the run");
		return -ESHUTDOWN;
	}
	if (!ctx->dht->placed && (rc = place(ctx)))
		return rc;
	if (!ctx->cfg.npeers && !ctx->dht->synced) {
		catch_up(ctx);
		take_hole(ctx);
		/* Only now does our record name the round: leaders would wait for
		 * us meanwhile, and take_hole can take seconds on a new DHT node.
		 * If they start just before it reaches them, we miss one round. */
		ctx->dht->published_ns = mp_now_ns();
		if (!publish_self(ctx))
			announce(ctx);
	}
	return 0;
}

/* The round to match next: the context's, or the run's when we fell behind. */
static uint32_t dht_next_round(void *state, uint32_t round)
{
	struct mp_ctx *ctx = ((struct mp_dht *)state)->ctx;
	uint32_t at = 0;

	ctx->round = round;
	/* Catch up with the run. Peers drift by one round (a fast group
	 * starts the next round while a slow one finishes), so only a peer
	 * two or more rounds behind (it sat rounds out, or its view was
	 * stale) jumps, to one behind the front. */
	if (sync_members(ctx, &at) > 0 && at > ctx->round + 1)
		ctx->round = at - 1;
	if (ctx->dht->round_hint > ctx->round) {
		/* The hinted round is being matched as we hear of it.
		 * Having jumped to such a round once and found the run
		 * gone on again, we would keep arriving late: wait at the
		 * round after it instead. */
		uint32_t r = ctx->dht->round_hint;
		if (ctx->dht->jumped_to && ctx->dht->jumped_to == ctx->round) {
			MP_INFO("round %u: behind again; waiting for the run at round %u",
				ctx->round, r + 1);
			r++;
		}
		ctx->round = ctx->dht->jumped_to = r;
	} else {
		ctx->dht->jumped_to = 0;
	}
	if (ctx->dht->displaced) {
		ctx->dht->displaced = 0;
		take_hole(ctx);
	}
	publish_round(ctx);
	return ctx->round;
}

/* Matchmake @round's group; -EHOSTUNREACH when none formed. */
static int dht_form(void *state, uint32_t round, int rank, struct mp_group *g)
{
	struct mp_dht *d = state;
	struct mp_ctx *ctx = d->ctx;
	int next = 0, rc;

	(void)rank;
	mp_fault_match(ctx, round);
	rc = match(ctx, round, g, d->bw, d->mode, &next);
	if (rc)
		return rc;
	/* The next coordinate depends on the roster alone, so our next
	 * key is known now: listen to it while the all-reduce runs, since
	 * a new key costs the DHT a search. */
	ctx->dht->coords[round % (uint32_t)ctx->grid.ndims] = next;
	prewarm(ctx, round + 1);
	return 0;
}

static void dht_end(void *state)
{
	publish_round(((struct mp_dht *)state)->ctx);
}

/* Groups are matchmade round by round (no lookahead), and the cell moves
 * in form() already, from the roster. */
const struct mp_grouping_ops mp_dht_grouping_ops = {
	.name = "dht",
	.begin = dht_begin,
	.next_round = dht_next_round,
	.form = dht_form,
	.end = dht_end,
};
