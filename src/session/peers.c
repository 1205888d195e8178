/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The peer table. A static run knows every peer from the start (index =
 * rank = id); a DHT run learns peers from rendezvous records and from HELLOs
 * and appends them. Indices never change, so groups, channels and logs can
 * hold them; a peer that leaves is marked gone, not removed.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctx.h"
#include "log.h"

/* ---- id -> index, for runs whose peers come from the rendezvous ----
 *
 * A DHT run's peers are found by id for every record, HELLO and declaration
 * it takes; with thousands of peers a scan of the table per lookup made each
 * membership refresh quadratic. Peers are only ever appended (indices never
 * change, departures are marks), so the index needs no deletion: linear
 * probing in a table at most half full, rebuilt when the peer table grows.
 */
static uint32_t ix_home(uint64_t id, uint32_t mask)
{
	/* Ids are random, or ranks 0..n-1 in tests: Fibonacci hashing spreads both. */
	return (uint32_t)((id * 0x9E3779B97F4A7C15ull) >> 32) & mask;
}

static void ix_put(struct mp_ctx *ctx, int idx)
{
	uint32_t m = ctx->peer_ix_mask, s = ix_home(ctx->peers[idx].id, m);

	if (!ctx->peer_ix)
		return;
	while (ctx->peer_ix[s])
		s = (s + 1) & m;
	ctx->peer_ix[s] = idx + 1;
}

/* An index of 2 x peers_cap slots (a power of two: peers_cap is one) for the first npeers. */
static int ix_rebuild(struct mp_ctx *ctx)
{
	size_t slots = 2 * (size_t)ctx->peers_cap;
	int *ix = calloc(slots, sizeof(*ix));

	if (!ix)
		return -ENOMEM;
	free(ctx->peer_ix);
	ctx->peer_ix = ix;
	ctx->peer_ix_mask = (uint32_t)(slots - 1);
	for (int i = 0; i < ctx->npeers; i++)
		ix_put(ctx, i);
	return 0;
}

static int grow(struct mp_ctx *ctx, int want)
{
	struct mp_peer *np;
	int cap = ctx->peers_cap ? ctx->peers_cap : 8;

	if (want <= ctx->peers_cap)
		return 0;
	while (cap < want)
		cap *= 2;
	np = realloc(ctx->peers, (size_t)cap * sizeof(*np));
	if (!np)
		return -ENOMEM;
	memset(np + ctx->peers_cap, 0, (size_t)(cap - ctx->peers_cap) * sizeof(*np));
	ctx->peers = np;
	ctx->peers_cap = cap;
	if (ctx->dynamic && ix_rebuild(ctx)) {
		/* Without memory for a larger index, lookups scan (mp_peer_find). */
		free(ctx->peer_ix);
		ctx->peer_ix = NULL;
	}
	return 0;
}

int mp_peers_init(struct mp_ctx *ctx, int n)
{
	int rc;

	ctx->npeers = 0; /* mp_init left the configured count here */
	rc = grow(ctx, n > 0 ? n : 1);

	if (rc)
		return rc;
	for (int i = 0; i < n; i++) {
		struct mp_peer *p = &ctx->peers[i];
		p->id = (uint64_t)i;
		p->bandwidth = 1.0;
		p->mode = MP_MODE_NORMAL;
	}
	ctx->npeers = n;
	__atomic_store_n(&ctx->cstats.peers_known, (uint64_t)n, __ATOMIC_RELAXED);
	return 0;
}

void mp_peers_free(struct mp_ctx *ctx)
{
	free(ctx->snap);
	ctx->snap = NULL;
	ctx->nsnap = ctx->snap_cap = 0;
	if (!ctx->peers)
		return;
	free(ctx->peers);
	ctx->peers = NULL;
	ctx->peers_cap = 0;
	free(ctx->peer_ix);
	ctx->peer_ix = NULL;
}

int mp_peer_find(const struct mp_ctx *ctx, uint64_t id)
{
	if (!ctx->dynamic)
		return id < (uint64_t)ctx->npeers ? (int)id : -1;
	if (ctx->peer_ix) {
		uint32_t m = ctx->peer_ix_mask, s = ix_home(id, m);

		/* At most half full: a free slot ends the probe (the bound is a guard). */
		for (uint32_t k = 0; k <= m && ctx->peer_ix[s]; k++, s = (s + 1) & m)
			if (ctx->peers[ctx->peer_ix[s] - 1].id == id)
				return ctx->peer_ix[s] - 1;
		return -1;
	}
	/* A table built by hand (unit tests) has no index. */
	for (int i = 0; i < ctx->npeers; i++)
		if (ctx->peers[i].id == id)
			return i;
	return -1;
}

static int set_addr(struct mp_ctx *ctx, struct mp_peer *p, const char *addr)
{
	uint8_t blob[MP_DRV_ADDR_MAX];
	size_t blen = sizeof(blob);

	if (!addr || !*addr || !strcmp(addr, p->addr))
		return 0;
	if (strlen(addr) >= sizeof(p->addr) || ctx->ops->addr_parse(ctx->drv, addr, blob, &blen))
		return -EINVAL;
	memcpy(p->blob, blob, blen);
	p->blob_len = blen;
	strcpy(p->addr, addr);
	return 0;
}

int mp_peer_learn(struct mp_ctx *ctx, uint64_t id, const char *addr, double bandwidth, int mode)
{
	int idx = mp_peer_find(ctx, id), rc;
	struct mp_peer *p;

	if (idx < 0) {
		if (!ctx->dynamic)
			return -EPERM;
		rc = grow(ctx, ctx->npeers + 1);
		if (rc)
			return rc;
		p = &ctx->peers[ctx->npeers];
		memset(p, 0, sizeof(*p));
		p->id = id;
		idx = ctx->npeers++;
		MP_STAT_ADD(ctx->cstats.peers_known, 1);
		ix_put(ctx, idx);
		MP_INFO("learned peer %016llx%s%s", (unsigned long long)id, addr && *addr ? " at " : "",
			addr ? addr : "");
	}
	p = &ctx->peers[idx];
	rc = set_addr(ctx, p, addr);
	if (rc)
		return rc;
	if (ctx->dynamic) {
		p->bandwidth = bandwidth;
		p->mode = mode;
	}
	return idx;
}

/*
 * Failure memory (static runs): backoff of the background probes, from
 * MP_PROBE_MIN_MS doubling to MP_PROBE_MAX_MS (mp_config_resolve checked
 * 10 <= min <= max <= 3600000). Local settings, left out of those peers
 * must share (settings.c): a peer that probes less often only takes a peer
 * back later than the others do (one that comes back without restarting,
 * or a restarted one whose announce came too late; the announce itself
 * waits for no probe), and until then the plan hash keeps their parts
 * apart, as after any difference of views.
 */
static uint32_t probe_min_ms(const struct mp_ctx *ctx)
{
	return (uint32_t)ctx->cfg.probe_min_ms;
}

static uint32_t probe_max_ms(const struct mp_ctx *ctx)
{
	return (uint32_t)ctx->cfg.probe_max_ms;
}

/* @ms as the WARN line says it: whole seconds as "30 s", else "250 ms". */
static const char *ms_text(uint32_t ms, char *buf, size_t len)
{
	if (ms % 1000)
		snprintf(buf, len, "%u ms", ms);
	else
		snprintf(buf, len, "%u s", ms / 1000);
	return buf;
}

/* Peer @idx is down from now on: left out of the averages that start later,
 * probed after probe_min_ms, then less and less often. */
static void mark_down(struct mp_ctx *ctx, int idx, const char *why)
{
	struct mp_peer *p = &ctx->peers[idx];
	char lo[24], hi[24];

	/* A take-back for a round ahead of this average's (an announce that
	 * came while an exchange still counted on the peer, and which that
	 * exchange now drops) stands: forgetting it, we would take the peer
	 * back by probe at a round of our own. */
	if (!p->down || p->up_at_round <= ctx->avg_round)
		p->up_at_round = 0;
	if (p->down)
		return;
	p->down = 1;
	p->down_since_ns = mp_now_ns();
	p->probe_ms = probe_min_ms(ctx);
	p->next_probe_ns = p->down_since_ns + (uint64_t)p->probe_ms * 1000000ull;
	ctx->ndown++;
	ms_text(probe_min_ms(ctx), lo, sizeof(lo));
	ms_text(probe_max_ms(ctx), hi, sizeof(hi));
	if (probe_max_ms(ctx) > probe_min_ms(ctx))
		MP_WARN("peer %d (%s) is down (%s): left out of later averages, probed in the "
			"background every %s doubling to %s", idx, p->addr, why, lo, hi);
	else
		MP_WARN("peer %d (%s) is down (%s): left out of later averages, probed in the "
			"background every %s", idx, p->addr, why, lo);
}

static void mark_up(struct mp_ctx *ctx, int idx, const char *why)
{
	struct mp_peer *p = &ctx->peers[idx];

	if (!p->down)
		return;
	p->down = 0;
	p->pdrop = 0;
	p->down_since_ns = 0;
	p->up_at_round = 0;
	p->probe_ms = 0;
	ctx->ndown--;
	MP_INFO("peer %d (%s) is back (%s): it takes part from this average on", idx, p->addr, why);
}

void mp_peer_mark_down(struct mp_ctx *ctx, int idx, const char *why)
{
	if (!ctx->dynamic && idx != ctx->rank && !ctx->peers[idx].gone)
		mark_down(ctx, idx, why);
}

int mp_peer_is_down(const struct mp_ctx *ctx, int idx)
{
	return ctx->peers[idx].down;
}

uint64_t mp_peer_down_since_ns(const struct mp_ctx *ctx, int idx)
{
	return ctx->peers[idx].down_since_ns;
}

uint64_t mp_peer_next_probe_ns(const struct mp_ctx *ctx, int idx)
{
	return ctx->peers[idx].down ? ctx->peers[idx].next_probe_ns : 0;
}

/* A return (RETURN) names @round: a peer we have down comes back there,
 * unless a later take-back stands. */
static void take_back_at(struct mp_ctx *ctx, int idx, uint32_t round, const char *how)
{
	struct mp_peer *p = &ctx->peers[idx];

	if (p->down && p->up_at_round < round) {
		p->up_at_round = round;
		MP_INFO("peer %d (%s) %s: live from round %u", idx, p->addr, how, round);
	}
}

void mp_peer_probe_done(struct mp_ctx *ctx, int idx, int kind, int err, uint32_t round,
			uint32_t flag)
{
	struct mp_peer *p = &ctx->peers[idx];

	if (ctx->dynamic || idx == ctx->rank)
		return;
	p->probe_failed = err != 0;
	if (!err)
		p->answered_round = round;
	if (kind == MP_PROBE_RETURN && !err) {
		/* Our return reached it before its averages passed the round
		 * (else it ignored it, and probes us again if it has us down):
		 * if we have it down, it comes back at that round too, as we
		 * do for it. */
		if (round < ctx->ret_round)
			take_back_at(ctx, idx, ctx->ret_round, "answered this peer's return");
		return;
	}
	if (err && ctx->querying)
		return; /* at a start, peers not up yet are no news */
	if (err) {
		if (!p->down) {
			/* A sweep after a plan mismatch: a peer we counted on is gone. */
			mark_down(ctx, idx, mp_strerror(err));
			return;
		}
		if (p->probe_ms < probe_max_ms(ctx))
			p->probe_ms = p->probe_ms * 2 > probe_max_ms(ctx) ? probe_max_ms(ctx)
									  : p->probe_ms * 2;
		p->next_probe_ns = mp_now_ns() + (uint64_t)p->probe_ms * 1000000ull;
		MP_TRACE("probe of peer %d (%s) failed: %s; next in %u ms", idx, p->addr,
			 mp_strerror(err), p->probe_ms);
		return;
	}
	/* An answer to our question where the run is (a return's, a
	 * rejoin's) takes no peer back: it says where the run is, and the
	 * return or the announce that follows names the round. */
	if (!p->down || p->up_at_round || kind == MP_PROBE_QUERY)
		return;
	if (ctx->nlive == 1 && ctx->synced) {
		/* Every other peer is down for us: the next average asks where
		 * the run is and rejoins it (probe.c), rather than taking peers
		 * back one by one at rounds that are ours. */
		ctx->resync = 1;
		p->next_probe_ns = mp_now_ns() + (uint64_t)p->probe_ms * 1000000ull;
		return;
	}
	if (round < ctx->avg_round) {
		/* It answers, but its averages are behind ours: restarted. It
		 * learns the run's round and announces when it rejoins. */
		p->next_probe_ns = mp_now_ns() + (uint64_t)p->probe_ms * 1000000ull;
		return;
	}
	if (kind == MP_PROBE_ALIVE && flag) {
		/* It averages, and at its next average it names a round to
		 * every peer (RETURN): every peer that has it down takes it
		 * back there, together. Taken back here, at a round of ours,
		 * each prober would take it back at its own, and the views
		 * would differ until the last did. */
		p->next_probe_ns = mp_now_ns() + (uint64_t)p->probe_ms * 1000000ull;
		MP_TRACE("peer %d (%s) answers: it announces its return", idx, p->addr);
		return;
	}
	/* Alive and in step: back from the next average that starts, or
	 * from the round it answered from if that is later (a peer that
	 * jumped ahead to rejoin starts there). */
	p->up_at_round = round > ctx->next_start ? round : ctx->next_start;
	MP_INFO("peer %d (%s) answers again: live from round %u", idx, p->addr, p->up_at_round);
}

void mp_peer_probed_by(struct mp_ctx *ctx, int idx, int kind, uint32_t round)
{
	struct mp_peer *p = &ctx->peers[idx];

	if (ctx->dynamic || idx == ctx->rank)
		return;
	if (kind == MP_PROBE_RETURN) {
		/* The same process, back in step: only a peer that has it down
		 * changes anything, and takes it back at that round. */
		take_back_at(ctx, idx, round, "returns");
		return;
	}
	if (kind != MP_PROBE_ANNOUNCE)
		return;
	/* A restarted peer: what we held of its old process is dead. Every
	 * peer takes it back at the round it announced, all at once. */
	MP_INFO("peer %d (%s) announces it rejoins at round %u", idx, p->addr, round);
	if (!p->down)
		mark_down(ctx, idx, "restarted");
	p->up_at_round = round;
}

void mp_peers_apply_up(struct mp_ctx *ctx, uint32_t round)
{
	for (int i = 0; i < ctx->npeers && ctx->ndown; i++)
		if (ctx->peers[i].down && ctx->peers[i].up_at_round && round >= ctx->peers[i].up_at_round)
			mark_up(ctx, i, "its probe succeeded");
}

void mp_peer_suspect(struct mp_ctx *ctx, int idx, const char *why)
{
	struct mp_peer *p = &ctx->peers[idx];

	if (p->gone || idx == ctx->rank)
		return;
	if (!ctx->dynamic) {
		/* Static runs remember failures (mark_down); a drop for a plan
		 * mismatch is not one: the peer is alive, its view differs. */
		if (p->excused)
			p->excused = 0;
		else
			mark_down(ctx, idx, why ? why : "dropped from an exchange");
		return;
	}
	if (why && !p->failed_ns) {
		MP_INFO("peer %016llx (%s) %s: taken as gone until a newer record",
			(unsigned long long)p->id, p->addr, why);
		ctx->suspects++;
	}
	p->failed_ns = mp_now_ns();
	p->failed_wall_ms = mp_wall_ms();
}

/* ---- measurements and the copy that mp_peers_info reads ---- */

/* Moving averages weigh the newest sample a quarter: a link that changes
 * shows within a few exchanges, one odd exchange moves it little. */
#define MEAS_ALPHA 0.25

static double ema(double old, double sample)
{
	return old > 0.0 ? old + MEAS_ALPHA * (sample - old) : sample;
}

int mp_peer_state(const struct mp_ctx *ctx, int idx)
{
	const struct mp_peer *p = &ctx->peers[idx];

	if (idx == ctx->rank)
		return MP_PEER_SELF;
	if (p->gone)
		return MP_PEER_GONE;
	/* Down: a static run's failure memory has it down (probed in the
	 * background), or, in a dht run, the last thing that happened with it
	 * was a failure. */
	if (mp_peer_is_down(ctx, idx))
		return MP_PEER_DOWN;
	if (p->failed_ns && p->meas.progress_ns <= p->failed_ns)
		return MP_PEER_DOWN;
	return MP_PEER_LIVE;
}

void mp_peer_measure(struct mp_ctx *ctx, int idx, uint64_t sent, uint64_t received,
		     uint64_t active_ns)
{
	struct mp_peer_meas *m = &ctx->peers[idx].meas;

	m->bytes_sent += sent;
	m->bytes_received += received;
	if (active_ns && sent + received)
		m->bw_Bps = ema(m->bw_Bps, (double)(sent + received) * 1e9 / (double)active_ns);
}

void mp_peer_rtt(struct mp_ctx *ctx, int idx, uint64_t ns)
{
	struct mp_peer_meas *m = &ctx->peers[idx].meas;

	m->rtt_s = ema(m->rtt_s, (double)ns / 1e9);
}

/* The published copy of one peer; since_progress_s is computed when read. */
struct mp_peer_snap {
	struct mp_peer_info info;
	uint64_t progress_ns;
};

/*
 * The table grows (realloc) and its fields change on the progress thread,
 * while mp_peers_info may be called from the application's thread at any
 * time: it reads this copy instead, which the progress thread refreshes at
 * the end of every exchange (and every 100 ms within one). One lock for all
 * contexts, as error.c's: a leaf, held for a copy of the table only.
 */
static pthread_mutex_t snap_mu = PTHREAD_MUTEX_INITIALIZER;

static void snap_fill(const struct mp_ctx *ctx, int i, struct mp_peer_snap *s)
{
	const struct mp_peer *p = &ctx->peers[i];
	struct mp_peer_info *o = &s->info;
	int self = i == ctx->rank;

	memset(s, 0, sizeof(*s));
	o->id = self ? ctx->self_id : p->id;
	o->rank = ctx->dynamic ? -1 : i;
	o->mode = self ? ctx->mode : p->mode;
	o->state = mp_peer_state(ctx, i);
	o->failures = p->meas.failures;
	strcpy(o->addr, self ? ctx->local_addr : p->addr);
	o->bandwidth_Bps = self ? ctx->self_Bps : p->meas.bw_Bps;
	o->rtt_s = p->meas.rtt_s;
	o->bytes_sent = p->meas.bytes_sent;
	o->bytes_received = p->meas.bytes_received;
	o->rate_Bps = (double)(self ? ctx->rate_sent : p->meas.rate_Bps);
	o->weight = p->bandwidth;
	s->progress_ns = p->meas.progress_ns;
}

int mp_peers_publish(struct mp_ctx *ctx)
{
	int n = ctx->npeers, rc = 0;

	pthread_mutex_lock(&snap_mu);
	if (n > ctx->snap_cap) {
		int cap = ctx->peers_cap > n ? ctx->peers_cap : n;
		struct mp_peer_snap *ns = realloc(ctx->snap, (size_t)cap * sizeof(*ns));
		if (ns) {
			ctx->snap = ns;
			ctx->snap_cap = cap;
		} else {
			/* Keep the last copy: stale beats wrong. */
			n = ctx->nsnap;
			rc = -ENOMEM;
		}
	}
	for (int i = 0; i < n && i < ctx->npeers; i++)
		snap_fill(ctx, i, &ctx->snap[i]);
	ctx->nsnap = n;
	pthread_mutex_unlock(&snap_mu);
	return rc;
}

int mp_peers_snapshot(struct mp_ctx *ctx, void *out, int max, size_t elem)
{
	uint64_t now = mp_now_ns();
	size_t take = elem < sizeof(struct mp_peer_info) ? elem : sizeof(struct mp_peer_info);
	int n;

	pthread_mutex_lock(&snap_mu);
	n = ctx->nsnap;
	for (int i = 0; i < n && i < max; i++) {
		struct mp_peer_info o = ctx->snap[i].info;
		uint64_t t = ctx->snap[i].progress_ns;

		o.since_progress_s = t ? (double)(now - t) / 1e9 : -1.0;
		memcpy((char *)out + (size_t)i * elem, &o, take);
	}
	pthread_mutex_unlock(&snap_mu);
	return n;
}
