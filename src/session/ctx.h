/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The context as the layers from the session up see it: configuration, the
 * transport instance, the peer table (who the peers are: peers.c) and the
 * frame memory. The connections to the peers are conn.c's (conn.h). The
 * control plane's state is the control layer's (src/ctrl), reached through
 * opaque pointers; the request queue and the progress thread are the
 * core's (src/core), which alone touches them.
 */
#ifndef MP_CTX_H
#define MP_CTX_H

#include <pthread.h>
#include <stdint.h>
#include <moshpit/moshpit.h>
#include <moshpit/driver.h>
#include <moshpit/sdk/clock.h>
#include <moshpit/sdk/reqq.h>

#include "auth.h"
#include "codec.h"
#include "grid.h"
#include "settings.h"
#include "wire.h"

struct mp_core;
struct mp_ctrl;
struct mp_fault;
struct mp_dht;
struct mp_link;
struct mp_pending;
struct mp_peer_snap;

/* What real exchanges measured of a peer (engine.c, conn.c, peers.c):
 * mp_peers_info reports it, and MP_BALANCE=measured sizes parts from the
 * figures the members send (rate.c). */
struct mp_peer_meas {
	double bw_Bps;              /* moving average: bytes moved with it / time the transfer
	                               with it was active, per exchange; 0 not measured */
	double rtt_s;               /* moving average of handshake round trips; 0 not measured */
	uint64_t bytes_sent, bytes_received; /* frames with it, headers included, ever */
	uint64_t progress_ns;       /* last frame sent to it or received from it (0 never) */
	uint64_t rate_Bps;          /* the figure it sent in its last RATE (0 none) */
	int failures;               /* exchanges that dropped it */
};

/* Lengths remembered per peer (struct mp_peer, agreed): a few tensors
 * averaged in turn, each of its own length, take no copy. */
#define MP_AGREED_LENS 4

/* A peer as this context knows it. */
struct mp_peer {
	uint64_t id;                /* static: the rank; dht: from its record or HELLO */
	int mode;                   /* enum mp_mode */
	int gone;                   /* said BYE or its record expired: not dialled, its
	                               connections refused; for good after a BYE, until a
	                               record stamped after gone_wall_ms after an expiry */
	int gone_bye;               /* it said BYE: gone for good */
	uint64_t gone_wall_ms;      /* when it was taken for gone (wall clock) */
	uint64_t late_wall_ms;      /* its record expired while its control connection
	                               stayed open (wall clock; 0: not late): not gone
	                               yet (matchmaker.c, sync_members) */
	int bye_pending;            /* said BYE during an exchange: gone once it ends */
	uint64_t failed_ns;         /* when an exchange last dropped it (0 never): a suspect */
	uint64_t failed_wall_ms;    /* the same, wall clock: a record stamped later clears it */
	char addr[MP_ADDR_STRLEN];  /* "" when unknown (client peers) */
	uint8_t blob[MP_DRV_ADDR_MAX];
	size_t blob_len;
	double bandwidth;           /* part-size weight; < 0 unknown, 0 client */
	struct mp_peer_meas meas;   /* measured on exchanges: zero until then */
	/* Failure memory of a static run (peers.c; doc/design.md, "Failure
	 * memory"): a peer that failed is down, left out of averages and
	 * probed in the background until a handshake with it succeeds. */
	int down;
	uint64_t down_since_ns;     /* when it went down (0: live) */
	uint64_t next_probe_ns;     /* next background probe */
	uint32_t probe_ms;          /* backoff: doubles per failed probe, capped */
	uint32_t up_at_round;       /* live again from the average starting at this round (0: not yet) */
	uint8_t excused;            /* its next drop is not its failure (plan mismatch) */
	uint8_t pdrop;              /* left out of the pairwise exchange's lines: every
	                               member of one heard it failed (pairs.c) */
	uint8_t probe_failed;       /* the last probe of it failed */
	uint8_t owe_return;         /* our RETURN (ctx->ret_round) has yet to reach it */
	uint32_t answered_round;    /* the round of its last answer to our probe */
	uint32_t downs_us_from;     /* 1 + the round its last ALIVE probe of us came from (0:
	                               none): its averages from there on leave us out */
	/* The last lengths its OPEN agreed with ours on, each with the session
	 * token of its stream-0 connection then (engine.c): a length it
	 * averaged on the connection still open, which lets a Moshpit average
	 * skip its copy (run_moshpit). A new connection has a new token
	 * (conn.h, mp_conn_agreed_len). */
	struct {
		uint64_t n;
		uint32_t token;
	} agreed[MP_AGREED_LENS];
	uint8_t agreed_next;
};

/* Peer table (peers.c). Static runs: n entries, id = rank, fixed. DHT runs:
 * grows as records and HELLOs name new peers; an index never changes. Only
 * the progress thread (and mp_init before it starts) touches the table. */
int mp_peers_init(struct mp_ctx *ctx, int n);
void mp_peers_free(struct mp_ctx *ctx);
/* Index of the peer with @id, or -1. */
int mp_peer_find(const struct mp_ctx *ctx, uint64_t id);
/* Index of @id, added if new (dht runs only: -EPERM in a static run for an
 * id that is not a rank). Updates address, bandwidth and mode when given
 * (@addr NULL or "" keeps the known one). -EINVAL: @addr does not parse. */
int mp_peer_learn(struct mp_ctx *ctx, uint64_t id, const char *addr, double bandwidth, int mode);
/* Take peer @idx as dead for now: an exchange dropped it, or (@why, logged)
 * its connection shows the process gone. The matchmaker stops counting on it
 * until a record stamped later, or for a record TTL. */
void mp_peer_suspect(struct mp_ctx *ctx, int idx, const char *why);
/* Peer @idx as mp_peers_info reports it: MP_PEER_SELF, _GONE, _DOWN (an
 * exchange dropped it and nothing moved with it since) or _LIVE. */
int mp_peer_state(const struct mp_ctx *ctx, int idx);
/* One exchange's traffic with peer @idx: @sent and @received bytes over
 * @active_ns, the time from its first frame posted to its last completed.
 * Folds the rate into the peer's moving average. */
void mp_peer_measure(struct mp_ctx *ctx, int idx, uint64_t sent, uint64_t received,
		     uint64_t active_ns);
/* A handshake with peer @idx took @ns from our message to its answer. */
void mp_peer_rtt(struct mp_ctx *ctx, int idx, uint64_t ns);
/* Copy the table for mp_peers_info (any thread reads the copy, under a
 * lock; only the table's own thread publishes). 0 or -ENOMEM. */
int mp_peers_publish(struct mp_ctx *ctx);
/* Up to @max entries of the last published copy into @out, @elem bytes
 * apart, each its first @elem bytes; returns how many peers it holds. */
int mp_peers_snapshot(struct mp_ctx *ctx, void *out, int max, size_t elem);

/* Failure memory of a static run (peers.c). What other modules may read:
 * whether a peer is down, since when (mp_now_ns), and when it is probed
 * next. A dht run's peers are never down here (its matchmaker keeps
 * suspects). */
int mp_peer_is_down(const struct mp_ctx *ctx, int idx);
uint64_t mp_peer_down_since_ns(const struct mp_ctx *ctx, int idx);
uint64_t mp_peer_next_probe_ns(const struct mp_ctx *ctx, int idx);
/* A probe of @idx of @kind (MP_PROBE_*) ended: @err 0 (it answered, its
 * average starts at @round; @flag: the CHALLENGE's group id) or why not. */
void mp_peer_probe_done(struct mp_ctx *ctx, int idx, int kind, int err, uint32_t round,
			uint32_t flag);
/* Peer @idx probed us (an authenticated handshake): @kind MP_PROBE_*; an
 * announce says it takes part from the average that starts at @round. */
void mp_peer_probed_by(struct mp_ctx *ctx, int idx, int kind, uint32_t round);
/* Mark @idx down now (@why is logged). */
void mp_peer_mark_down(struct mp_ctx *ctx, int idx, const char *why);
/* Take a down peer back in for the average starting at @round when it is due. */
void mp_peers_apply_up(struct mp_ctx *ctx, uint32_t round);

/* What a probe asks (the HELLO's group id on the probe connection). */
/* ALIVE goes only to a peer the prober has down; SWEEP to every peer after
 * a plan mismatch; RETURN to every peer from a peer that an ALIVE probe
 * reached: those that have it down take it back at the round it names. */
enum {
	MP_PROBE_ALIVE = 1,
	MP_PROBE_QUERY = 2,
	MP_PROBE_ANNOUNCE = 3,
	MP_PROBE_SWEEP = 4,
	MP_PROBE_RETURN = 5,
};

/* MP_SCR_UNDO: a Moshpit average's copy of its buffer and residue, while a
 * later round may meet a peer not known to agree (run_moshpit). */
enum { MP_SCR_REDUCE, MP_SCR_ENCODE, MP_SCR_STAGE, MP_SCR_UNDO, MP_SCR_MAX };

/* A counter of the context that another thread may read (mp_stats). */
#define MP_STAT_ADD(field, n) ((void)__atomic_fetch_add(&(field), (n), __ATOMIC_RELAXED))

struct mp_ctx {
	/* configuration, with strings owned */
	struct mp_config cfg;
	char *run_name, *transport, *listen_addr;
	int rank, npeers;
	uint64_t run_id;
	int streams, window;
	int spin_us;            /* busy-poll this long after the last progress */
	size_t chunk_elems;
	int codec_cfg;                     /* configured ::mp_codec, MP_CODEC_AUTO included */
	struct mp_codec_params cparams;    /* encoder settings */
	size_t frame_rx_max;               /* largest frame any peer's settings can produce */
	struct mp_grid grid;
	struct mp_grid_grouping grid_grouping; /* the static grouping's state */
	struct mp_settings settings;       /* what every peer must share (settings.h), from mp_init */

	/* identity and session */
	struct mp_auth auth;
	uint64_t self_id;
	int mode;                          /* own enum mp_mode */
	int dynamic;                       /* dht rendezvous: peers come and go */
	int nconn;                         /* connections per peer: streams, then control */
	int peers_cap;                     /* allocated entries of peers */
	uint64_t suspects;                 /* peers taken as suspects so far (mp_peer_suspect):
	                                      the matchmaker tells its round when this moves */
	int left;                          /* mp_leave was called */

	/* The control plane's state (src/ctrl), opaque below it: control
	 * messages (ctrl.c) and, in a dht run, the rendezvous and the
	 * matchmaker (matchmaker.h). */
	struct mp_ctrl *ctrl;
	struct mp_dht *dht;

	int clog_fd;                       /* contribution log, or -1 */
	struct mp_fault *faults;           /* MP_FAULT actions (fault.c) */
	uint64_t fault_first;              /* fault.c: this peer's first round + 1; 0 before it */
	const struct mp_grouping_ops *grouping; /* the grid, or the dht matchmaker */
	void *grouping_st;
	/* Progress of the control plane that an exchange makes as it waits
	 * (ctrl.c registers it in dht runs), or NULL. */
	void (*exchange_hook)(struct mp_ctx *ctx);

	/* transport */
	const struct mp_driver_ops *ops;
	struct mp_drv *drv;
	struct mp_drv_caps caps;
	struct mp_drv_listener *listener;
	char local_addr[MP_ADDR_STRLEN];

	/* peers */
	struct mp_peer *peers;
	/* Dynamic runs: id -> index + 1 (0: empty slot), open addressing over
	 * peer_ix_mask + 1 slots, twice peers_cap (peers.c). NULL: a scan. */
	int *peer_ix;
	uint32_t peer_ix_mask;
	int peers_set;

	/* connections (conn.c): per peer index, its nconn connection slots
	 * (NULL until conn.c first needs them); accepted connections in their
	 * handshake */
	struct mp_link **links;
	int nlinks;
	struct mp_pending *pend;
	int npend, pend_cap;

	/* rounds */
	uint32_t round; /* global round number, agreed by all peers */

	/* Measured throughput (engine.c, measure): moving average over
	 * exchanges of the bytes this peer sent over the time it had a send
	 * in flight (struct mp_busy), the figure it sends in RATE under
	 * MP_BALANCE=measured; the exchanges measured so far; and the last
	 * figure it sent (0 none). */
	double self_Bps;
	uint64_t self_samples;
	uint64_t rate_sent;
	/* mp_peers_publish's copy of the table, under peers.c's lock */
	struct mp_peer_snap *snap;
	int nsnap, snap_cap;
	/* Failure memory of a static run (peers.c, src/core/probe.c): the live
	 * peers of the average that runs (ranks, ascending). */
	int *live;
	int nlive;
	uint32_t avg_round;     /* round at which the current or next average starts */
	uint32_t next_start;    /* round at which the next average will start */
	uint32_t seen_round;    /* largest average start a peer's handshake showed */
	int seen_down;          /* a peer answered our query: it has us down */
	int synced;             /* this peer's rounds are the run's (fresh peers learn them) */
	int sweep;              /* a plan mismatch: probe every peer once this average ends */
	int querying;           /* a fresh peer asks where the run is: failed probes mean nothing yet */
	int resync;             /* isolated, and a down peer answered a probe: ask where the run is */
	int returning;          /* an ALIVE probe reached us: the next average announces our return */
	int returns_owed;       /* peers whose owe_return is set */
	uint32_t ret_round;     /* the round our last return named */
	uint64_t begin_ns;      /* when the last average started (our pace) */
	uint64_t resync_ns;     /* when an isolated peer last asked */
	int ndown;

	/* scratch memory for frames, grown between operations, registered */
	uint8_t *slab;
	size_t slab_size;
	struct mp_drv_mr *slab_mr;

	/* reducer state (accumulators) and encoder scratch, kept between rounds:
	 * a fresh allocation of a large part every round costs a page fault
	 * per 4 KiB */
	void *scratch[MP_SCR_MAX];
	size_t scratch_size[MP_SCR_MAX];

	/* statistics of the context's life, read by mp_stats from any thread:
	 * updated with MP_STAT_ADD, read with __atomic_load_n */
	uint64_t rejected[MP_REJ_MAX];
	struct mp_conn_stats {
		uint64_t accepted;      /* incoming connections taken from the listener */
		uint64_t authenticated; /* ... that proved the run key */
		uint64_t refused;       /* closed for a bad handshake frame */
		uint64_t timed_out;     /* no whole handshake within the connect timeout */
		uint64_t evicted;       /* closed to make room (max_handshakes) */
		uint64_t hung_up;       /* closed by the other side before authenticating */
		uint64_t pending;       /* held in their handshake now */
		uint64_t pending_max;   /* most held at once */
		uint64_t peers_known;   /* entries of the peer table (ctx->npeers, for readers
		                           off the progress thread) */
		uint64_t peers_held;    /* peers with connection slots (conn.c, ctx->links) */
	} cstats;
	struct mp_result *cur_res; /* counters of the operation running, or NULL */

	/* set once mp_finalize stops the progress thread: what runs ends with
	 * -ECANCELED (read atomically) */
	int stop;
	/* the progress thread, its request queue and what only src/core
	 * touches (core.h) */
	struct mp_core *core;

	/* Last error message: written by the caller's thread and the progress
	 * thread, so only under error.c's lock (mp_set_error). err_shown is
	 * the copy mp_last_error handed out: the caller's until its next call. */
	char err[256];
	char err_shown[256];
};

/* Record a message as the context's last error (and log it at WARN); any
 * thread. Read it back with mp_last_error, never through ctx->err. */
void mp_set_error(struct mp_ctx *ctx, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Thread-local error of the last failed mp_init. */
void mp_set_init_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* As mp_set_init_error, without the log line: for parsers whose caller
 * reports (or not) the failure itself (mp_codec_parse). */
void mp_note_init_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
