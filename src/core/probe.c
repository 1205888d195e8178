/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Failure memory of a static run (doc/design.md, "Failure memory"): which
 * peers an average counts on, the background probes of the down ones, and
 * how a restarted peer gets back in step with the run.
 *
 * A peer that failed is down (peers.c): the averages that start later leave
 * it out. Moshpit keeps the configured grid with the dead peer's cell
 * empty, so only its groupmates' groups change: peers whose views differ
 * (one has met the death, another not yet) still form the same groups and
 * never wait on each other. (A grid of the live peers alone would make the
 * survivors' average exact, but every group of it would change with the
 * view, and peers that learnt of the death at different averages would
 * wait on each other in groups the others were not in, time out and mark
 * live peers down, spreading one death through the run.) The progress
 * thread probes it between and during averages, with a handshake on the
 * probe slot (conn.c), MP_PROBE_MIN_MS (1 s) after the failure, then
 * doubling to MP_PROBE_MAX_MS (30 s) (peers.c).
 *
 * A restarted process starts with round 0, and its peers have it down.
 * Before its first average it asks the next rank where the run is (a
 * QUERY probe, answered in the CHALLENGE's round and whether that peer has
 * it down; every peer if that one does not answer or is ahead). It was
 * left behind only if a peer has it down. If the run is ahead, it asks
 * again 100 ms later to see how fast the run goes, then announces to every
 * peer the round it takes part from (an ANNOUNCE probe), far enough ahead
 * that no peer passes it first: each peer takes it back at that same
 * round, so the views agree, and it starts its own averages there.
 *
 * A live peer that others have down, and that has peers down itself (a
 * failure between live peers: each side has the other down), answers
 * their probes that it will name its return: at its next average it sends
 * every peer a RETURN probe with a round a little ahead, at which each
 * that has it down takes it back, as it takes back those it has down that
 * answer (announce_return).
 */
#include <errno.h>
#include <stdlib.h>

#include "conn.h"
#include "core.h"
#include "fault.h"
#include "log.h"

static int static_run(const struct mp_ctx *ctx)
{
	return !ctx->dynamic && ctx->npeers > 1 && ctx->peers_set;
}

/* Our return to the peers it has not reached yet, while its round is
 * ahead of our averages: a peer whose probe slot is busy gets it later. */
static void send_returns(struct mp_ctx *ctx)
{
	for (int i = 0; i < ctx->npeers && ctx->returns_owed; i++) {
		struct mp_peer *p = &ctx->peers[i];

		if (!p->owe_return || mp_conn_probing(ctx, i))
			continue;
		if (ctx->ret_round <= ctx->avg_round ||
		    mp_conn_probe(ctx, i, MP_PROBE_RETURN, ctx->ret_round) != -EBUSY) {
			p->owe_return = 0;
			ctx->returns_owed--;
		}
	}
}

/* Start the probes that are due: our return, down peers on their backoff,
 * and every peer after a plan mismatch (a sweep). */
void mp_fm_tick_probes(struct mp_ctx *ctx)
{
	uint64_t now = mp_now_ns();
	int sweep = ctx->sweep;

	if (!static_run(ctx))
		return;
	send_returns(ctx);
	ctx->sweep = 0;
	for (int i = 0; i < ctx->npeers && (ctx->ndown || sweep); i++) {
		struct mp_peer *p = &ctx->peers[i];

		if (i == ctx->rank || mp_conn_probing(ctx, i) || p->up_at_round)
			continue;
		if (p->down && now >= p->next_probe_ns)
			mp_conn_probe(ctx, i, MP_PROBE_ALIVE, ctx->avg_round);
		else if (sweep && !p->down)
			mp_conn_probe(ctx, i, MP_PROBE_SWEEP, ctx->avg_round);
	}
}

/* Background work between averages: due probes, then the connections move on. */
void mp_fm_tick(struct mp_ctx *ctx)
{
	if (!static_run(ctx))
		return;
	mp_fm_tick_probes(ctx);
	mp_conn_poll(ctx);
	ctx->ops->progress(ctx->drv, 0);
}

/* 1 while the progress thread has background work (probes to make or
 * finish, handshakes under way, the transport's or ours): it then wakes
 * up every few milliseconds. */
int mp_fm_busy(const struct mp_ctx *ctx)
{
	if (!static_run(ctx))
		return 0;
	if (ctx->ndown || ctx->sweep || ctx->returns_owed)
		return 1;
	/* Handshakes move a step per call on each side: over the RDMA
	 * protocol (its own set-up, then ours) some ten steps, which at 50 ms
	 * a tick made a peer back from a failure miss the next average. */
	if (mp_driver_setting_up(ctx->ops, ctx->drv) > 0 || mp_conn_handshaking(ctx))
		return 1;
	for (int i = 0; i < ctx->npeers; i++)
		if (mp_conn_probing(ctx, i))
			return 1;
	return 0;
}

/* Probe every other peer with @kind (or only @only, when >= 0) and wait
 * until each answered or failed (or the connect timeout). */
static void probe_some(struct mp_ctx *ctx, int kind, uint32_t round, int only)
{
	uint64_t end = mp_now_ns() + (uint64_t)ctx->cfg.connect_timeout_ms * 1000000ull;
	int open;

	for (int i = 0; i < ctx->npeers; i++)
		if (i != ctx->rank && (only < 0 || i == only))
			mp_conn_probe(ctx, i, kind, round);
	do {
		mp_conn_poll(ctx);
		ctx->ops->progress(ctx->drv, 1);
		open = 0;
		for (int i = 0; i < ctx->npeers; i++)
			open += mp_conn_probing(ctx, i);
	} while (open && mp_now_ns() < end && !__atomic_load_n(&ctx->stop, __ATOMIC_ACQUIRE));
}

static void probe_all(struct mp_ctx *ctx, int kind, uint32_t round)
{
	probe_some(ctx, kind, round, -1);
}

/* Where is the run? A QUERY of every other peer (or only @only, when >= 0);
 * peers that do not answer are no news here. */
static void query(struct mp_ctx *ctx, int only)
{
	ctx->querying = 1;
	/* Our averages' round, not a join round chosen and not reached:
	 * a fellow joiner takes what it hears for where the run is. */
	probe_some(ctx, MP_PROBE_QUERY, ctx->avg_round, only);
	ctx->querying = 0;
}

/* The median round of the peers that answered the last query (0: none):
 * where the run is. The largest would do for a peer behind the run, but
 * not against a peer whose averages fail at once, which runs its rounds
 * ahead of the run's. */
static int cmp_round(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;

	return (x > y) - (x < y);
}

static uint32_t run_round(const struct mp_ctx *ctx)
{
	uint32_t *r = malloc((size_t)ctx->npeers * sizeof(*r)), med = 0;
	int n = 0;

	if (!r)
		return ctx->seen_round;
	for (int i = 0; i < ctx->npeers; i++)
		if (i != ctx->rank && !ctx->peers[i].probe_failed && !ctx->peers[i].gone)
			r[n++] = ctx->peers[i].answered_round;
	qsort(r, (size_t)n, sizeof(*r), cmp_round);
	if (n)
		med = r[(n - 1) / 2];
	free(r);
	return med;
}

/* Answer handshakes and move connections on until @until (mp_now_ns). */
static void poll_until(struct mp_ctx *ctx, uint64_t until)
{
	while (mp_now_ns() < until && !__atomic_load_n(&ctx->stop, __ATOMIC_ACQUIRE)) {
		mp_conn_poll(ctx);
		ctx->ops->progress(ctx->drv, 1);
	}
}

/*
 * Announce a round the run has not reached (nor we): each peer takes us
 * back there, all at once, and we start our averages there. How far
 * ahead: four averages, plus what the run does in 250 ms at the rate two
 * queries 100 ms apart show, so that no peer passes it before our announce
 * reaches it. A peer that has passed it ignores the announce (its
 * CHALLENGE tells us its round), and would take us for a restarted peer at
 * every probe: so an announce that came too late for any peer is made
 * again, from the round it answered, 250 ms plus twice as long as the
 * announce took ahead at the measured rate (three tries). Peers that
 * answered neither query are down; those we had down that answered come
 * back at that round too (an isolated peer, mp_fm_begin).
 */
static void rejoin(struct mp_ctx *ctx, uint32_t R, uint32_t run)
{
	uint32_t seen1 = run ? run : ctx->seen_round, join, from;
	uint64_t t1 = mp_now_ns(), t2;
	double rate, ahead = 0.25;

	/* The announce takes us back everywhere: no return to name. */
	ctx->returning = 0;
	poll_until(ctx, t1 + 100000000ull);
	if (run)
		ctx->seen_round = 0;
	query(ctx, -1);
	t2 = mp_now_ns();
	for (int i = 0; i < ctx->npeers; i++)
		if (i != ctx->rank && ctx->peers[i].probe_failed)
			mp_peer_mark_down(ctx, i, "no answer when this peer rejoined");
	if (run) {
		/* Our rounds are not the run's (announce_return): from the
		 * median answer, ahead of ours or behind. */
		uint32_t now_at = run_round(ctx);
		rate = now_at > run ? (double)(now_at - run) * 1e9 / (double)(t2 - t1) : 0.0;
		from = now_at > run ? now_at : run;
	} else {
		rate = (double)(ctx->seen_round - seen1) * 1e9 / (double)(t2 - t1);
		from = ctx->seen_round > ctx->round ? ctx->seen_round : ctx->round;
	}
	for (int tries = 1;; tries++) {
		uint64_t t0 = mp_now_ns();
		uint32_t hold;
		double took;

		join = from + 4 * R + (uint32_t)(rate * ahead / R + 1.0) * R;
		/* Not avg_round: until our first average there, we answer
		 * from where our averages were (a fellow joiner restarted with
		 * us must not take our join round for the run's, nor find its
		 * own announce late for us); mp_fm_begin moves it. */
		ctx->round = ctx->next_start = join;
		for (int i = 0; i < ctx->npeers; i++)
			if (i != ctx->rank && ctx->peers[i].down && !ctx->peers[i].probe_failed)
				ctx->peers[i].up_at_round = join;
		hold = mp_fault_announce(ctx, join);
		if (hold)
			poll_until(ctx, t0 + (uint64_t)hold * 1000000ull);
		probe_all(ctx, MP_PROBE_ANNOUNCE, join);
		if (ctx->seen_round < join)
			break;
		if (tries == 3) {
			MP_WARN("rejoining at round %u, but a peer answered from round %u (third "
				"announce): it takes this peer back when this peer is next "
				"isolated and rejoins", join, ctx->seen_round);
			break;
		}
		took = (double)(mp_now_ns() - t0) / 1e9;
		MP_INFO("the announce of round %u came too late: a peer answered from round %u, "
			"%.0f ms after it was chosen; announcing a later round", join,
			ctx->seen_round, took * 1e3);
		/* The rate stays the one measured: a round seen now may be
		 * another joiner's join round, far ahead of where the run is,
		 * not a sign that the run sped up. */
		ahead = 0.25 + 2.0 * took;
		from = ctx->seen_round;
	}
	MP_INFO("rejoins at round %u (the run does %.0f rounds/s)", join, rate);
	/*
	 * Our first exchange counts its timeouts from its start, and the run
	 * reaches the join round only when it does: started now, it would
	 * time out on peers still on their way (at 1 Gbit/s with
	 * round_timeout_ms 1000, or when the run stalled while we measured
	 * its rate), and they on it. So ask one peer that answered where it
	 * is, every 20 ms, until it is one average short of the join round,
	 * for at most twice the round timeout and twice the time we put the
	 * join round ahead.
	 */
	int ask = -1;
	for (int k = 1; k < ctx->npeers && ask < 0; k++) {
		int i = (ctx->rank + k) % ctx->npeers;
		if (!ctx->peers[i].probe_failed)
			ask = i;
	}
	uint64_t until = mp_now_ns() + 2ull * (uint64_t)ctx->cfg.round_timeout_ms * 1000000ull +
			 (uint64_t)(2e9 * ahead);
	while (ask >= 0 && ctx->seen_round + R < join && mp_now_ns() < until &&
	       !__atomic_load_n(&ctx->stop, __ATOMIC_ACQUIRE)) {
		uint64_t next = mp_now_ns() + 20000000ull;

		query(ctx, ask);
		poll_until(ctx, next);
	}
}

/*
 * Every other peer is down for us: either they are, or this peer was cut
 * off (stopped, or its rounds timed out on all of them) and they have it
 * down. Ask where the run is, as a fresh peer does; if a peer that answers
 * has us down, we rejoin by announce, and take back those that answered
 * at that round. At most once per MP_PROBE_MIN_MS, or sooner when a
 * background probe was answered. Without this an isolated peer would take
 * peers back one by one at rounds that are its own, failing each average
 * at once and moving its rounds on, while the others took it back at
 * theirs: views that never meet again.
 */
static void resync_isolated(struct mp_ctx *ctx, uint32_t R)
{
	uint64_t now = mp_now_ns();
	int answered = 0;

	if (!ctx->resync && now - ctx->resync_ns < (uint64_t)ctx->cfg.probe_min_ms * 1000000ull)
		return;
	ctx->resync = 0;
	ctx->seen_round = 0;
	ctx->seen_down = 0;
	query(ctx, -1);
	ctx->resync_ns = mp_now_ns();
	for (int i = 0; i < ctx->npeers; i++)
		answered += i != ctx->rank && !ctx->peers[i].probe_failed;
	/* Only a peer that has us down left us behind. Peers that answer and
	 * do not (restarted ones, fresh, or peers whose averages still count
	 * on us) take no announce from us: a restarted one announces its own
	 * join round, which we take; the others mark us down at their next
	 * timeout, and the next ask finds it. */
	if (!answered || !ctx->seen_down)
		return;
	MP_INFO("every other peer is down for this peer at round %u, and %d answer (the run is at "
		"round %u): it rejoins", ctx->round, answered, ctx->seen_round);
	rejoin(ctx, R, 0);
	ctx->resync_ns = mp_now_ns();
}

/*
 * A peer that has us down probed us (ALIVE) while we average: name every
 * peer a round a little ahead (RETURN), at which each that has us down
 * takes us back, and at which we take back those we have down that answer
 * it. Taken back by each prober at a round of its own, the views differed
 * until the last one did, and each average between was a plan mismatch for
 * every group with us (the training study at 1 Gbit/s: peers dropped and
 * taken back in turn for 15 averages). First we ask every peer where the
 * run is: if none has us down any more, there is nothing to name; if the
 * median answer is more than four averages from our round, our rounds are
 * not the run's (restarted together with the rank we asked at the start,
 * held up past the others' timeouts, or averages that failed at once and
 * ran our rounds ahead), and we rejoin by announce from there instead. How
 * far ahead a return is: two averages, plus what we do in 250 ms at the
 * pace of our last average (at most 1000). A peer whose averages passed it
 * first ignores it and probes us again, and we name a later round then.
 */
static void announce_return(struct mp_ctx *ctx, uint32_t R)
{
	uint64_t now;
	uint32_t run, ahead = 2;

	ctx->returning = 0;
	ctx->seen_down = 0;
	query(ctx, -1);
	if (!ctx->seen_down) {
		MP_INFO("a peer that had this peer down probed it, and none has it down now: no "
			"return to name");
		return;
	}
	run = run_round(ctx);
	if (run > ctx->round + 4 * R || run + 4 * R < ctx->round) {
		MP_INFO("a peer has this peer down, and the run is at round %u, this peer at %u: it "
			"rejoins", run, ctx->round);
		rejoin(ctx, R, run);
		return;
	}
	if (!ctx->ndown) {
		/* We count on every peer: each that has us down takes us back
		 * at its next average, as our answer to its probe said. */
		MP_INFO("a peer has this peer down, and it has none down: it is taken back at "
			"the next average of each");
		return;
	}
	now = mp_now_ns();
	if (ctx->begin_ns && now > ctx->begin_ns) {
		double more = 0.25e9 / (double)(now - ctx->begin_ns);
		ahead += more < 1000.0 ? (uint32_t)(more + 0.999) : 1000;
	}
	ctx->ret_round = (run > ctx->round ? run : ctx->round) + ahead * R;
	for (int i = 0; i < ctx->npeers; i++)
		if (i != ctx->rank && !ctx->peers[i].owe_return) {
			ctx->peers[i].owe_return = 1;
			ctx->returns_owed++;
		}
	MP_INFO("a peer has this peer down: it returns at round %u (named to every peer; this "
		"average starts at %u)", ctx->ret_round, ctx->round);
	send_returns(ctx);
}

/* The average starts at ctx->round: peers due come back, and the live
 * ones are listed (ctx->live); returns how many. */
static int start_at(struct mp_ctx *ctx, uint32_t R)
{
	int n = 0;

	ctx->avg_round = ctx->round;
	ctx->next_start = ctx->round + R;
	mp_peers_apply_up(ctx, ctx->round);
	for (int i = 0; i < ctx->npeers; i++)
		if (!ctx->peers[i].down)
			ctx->live[n++] = i;
	return n;
}

/*
 * Before an average of a static run that advances the round by @R: a
 * fresh peer finds the run's round (and rejoins it), due peers come back,
 * and the live set is fixed for the average. Returns 0 or -ENOMEM.
 */
int mp_fm_begin(struct mp_ctx *ctx, uint32_t R)
{
	int n = 0;

	if (ctx->dynamic)
		return 0;
	if (!ctx->synced && ctx->npeers > 1) {
		/*
		 * Where is the run? One peer's answer says it: ask the next rank
		 * first, and every peer only when it does not answer. At the
		 * start of a run every peer asks, and asking all would open
		 * n(n-1) connections at once, each pair dialling both ways
		 * (libfabric's tcp provider then misses its connect timeouts).
		 * (A next rank restarted with us answers from round 0 too, and
		 * we start over at round 0 until the others' probes show the
		 * run's round: announce_return then rejoins. Asking the ranks
		 * after it in turn made every start slower, and a slow starter
		 * then met peers that had dropped it.)
		 */
		int next = (ctx->rank + 1) % ctx->npeers;

		query(ctx, next);
		/* No answer, or the run is ahead: did anyone leave us behind? */
		if (ctx->peers[next].probe_failed || ctx->seen_round > ctx->round)
			query(ctx, -1);
		/*
		 * Ahead is not enough: in a Moshpit run a group that does not
		 * need this peer finishes its rounds while this peer starts,
		 * and the groups that need it wait for it. Only a peer that
		 * has it down has left it behind.
		 */
		if (ctx->seen_round > ctx->round && !ctx->seen_down)
			MP_INFO("the run is at round %u and this peer at %u, but no peer has it down: "
				"it starts late, at round %u", ctx->seen_round, ctx->round, ctx->round);
		if (ctx->seen_round > ctx->round && ctx->seen_down) {
			MP_INFO("the run is at round %u and this peer at %u: it was restarted, and "
				"rejoins", ctx->seen_round, ctx->round);
			rejoin(ctx, R, 0);
		}
		ctx->synced = 1;
	}
	if (!ctx->live) {
		ctx->live = malloc((size_t)ctx->npeers * sizeof(int));
		if (!ctx->live)
			return -ENOMEM;
	}
	n = start_at(ctx, R);
	if (n == 1 && ctx->npeers > 1 && static_run(ctx)) {
		/* Alone, we keep no one in step: a peer that announced its
		 * return (a restarted one) is met at its round at once. */
		uint32_t meet = 0;
		for (int i = 0; i < ctx->npeers; i++) {
			uint32_t up = ctx->peers[i].up_at_round;
			if (ctx->peers[i].down && up > ctx->round && (!meet || up < meet))
				meet = up;
		}
		if (meet)
			ctx->round = meet;
		else
			resync_isolated(ctx, R);
		n = start_at(ctx, R);
	}
	if (ctx->returning && n > 1 && static_run(ctx)) {
		/* (Alone, we rejoin by announce above when a peer answers.) */
		announce_return(ctx, R);
		n = start_at(ctx, R);
	}
	ctx->begin_ns = mp_now_ns();
	ctx->nlive = n;
	return mp_grid_grouping_set_live(&ctx->grid_grouping, n < ctx->npeers ? ctx->live : NULL, n);
}

/* After an average of a static run that started at @base: the round moves
 * on by @R however the average ended (given up early, or with every other
 * peer down and no round run), so that peers whose views differed stay in
 * step. */
void mp_fm_end(struct mp_ctx *ctx, uint32_t base, uint32_t R)
{
	if (ctx->dynamic)
		return;
	ctx->round = base + R;
	ctx->avg_round = ctx->next_start = ctx->round;
}
