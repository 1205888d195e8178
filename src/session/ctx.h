/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The context as the layers from the session up see it: configuration, the
 * transport instance, the peer table and its connections' handshake state,
 * and the frame memory. Its control-plane state is the control layer's
 * (src/ctrl), reached through opaque pointers; the request queue and the
 * progress thread are the core's (src/core), which alone touches them.
 */
#ifndef MP_CTX_H
#define MP_CTX_H

#include <pthread.h>
#include <stdint.h>
#include <moshpit/moshpit.h>
#include <moshpit/driver.h>

#include "auth.h"
#include "clock.h"
#include "codec.h"
#include "grid.h"
#include "reqq.h"
#include "wire.h"

struct mp_ctrl;
struct mp_fault;
struct mp_fb;
struct mp_heard;
struct mp_record;
struct mp_rdv_ops;
struct mp_request;

/* Handshake frames (doc/protocol.md, "Connection handshake"): HELLO carries
 * a nonce, the dialer's mode, bandwidth and NUL-terminated address; CHALLENGE
 * a nonce and a MAC; AUTH a MAC. */
#define MP_HELLO_FIXED (MP_NONCE_BYTES + 1 + 8)
#define MP_HELLO_MAX (MP_WIRE_HDR_SIZE + MP_HELLO_FIXED + MP_ADDR_STRLEN)
#define MP_CHALLENGE_LEN (MP_WIRE_HDR_SIZE + MP_NONCE_BYTES + MP_MAC_BYTES)
#define MP_AUTH_LEN (MP_WIRE_HDR_SIZE + MP_MAC_BYTES)

/* Handshake and session of one connection index to a peer (conn.c). */
struct mp_link {
	uint32_t token;             /* session token once ready (never 0), else 0 */
	uint64_t since_ns;          /* dialer: when the dial began (handshake deadline) */
	uint64_t retry_at_ns;       /* dialer: when to dial again after a failure */
	unsigned auth_fails;        /* dialer: CHALLENGEs refused in a row (log rate) */
	int err;                    /* dialer: last failure, until mp_conn_get reports it */
	struct mp_drv_req *sreq;    /* dialer: our HELLO, then our AUTH, in flight */
	struct mp_drv_req *rreq;    /* dialer: the CHALLENGE's receive */
	uint8_t nonce_d[MP_NONCE_BYTES];
	uint8_t sbuf[MP_HELLO_MAX];
	uint8_t rbuf[MP_CHALLENGE_LEN];
};

/* A peer as this context knows it. */
struct mp_peer {
	uint64_t id;                /* static: the rank; dht: from its record or HELLO */
	int mode;                   /* enum mp_mode */
	int gone;                   /* said BYE or its record expired: never dialled again */
	int bye_pending;            /* said BYE during an exchange: gone once it ends */
	uint64_t failed_ns;         /* when an exchange last dropped it (0 never): a suspect */
	uint64_t failed_wall_ms;    /* the same, wall clock: a record stamped later clears it */
	char addr[MP_ADDR_STRLEN];  /* "" when unknown (client peers) */
	uint8_t blob[MP_DRV_ADDR_MAX];
	size_t blob_len;
	double bandwidth;           /* part-size weight; < 0 unknown, 0 client */
	/* Per connection index (nconn: the data streams, then control). */
	struct mp_drv_conn **conns; /* NULL = none; dialer: set while the handshake runs */
	int *ready;                 /* handshake done (token known): usable */
	struct mp_link *links;
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
/* The peer left or died: close its connections; it is never dialled again. */
void mp_peer_gone(struct mp_ctx *ctx, int idx);
/* Take peer @idx as dead for now: an exchange dropped it, or (@why, logged)
 * its connection shows the process gone. The matchmaker stops counting on it
 * until a record stamped later, or for a record TTL. */
void mp_peer_suspect(struct mp_ctx *ctx, int idx, const char *why);

/* An accepted connection in its handshake: waiting for the HELLO, then (our
 * CHALLENGE sent) for the AUTH. */
struct mp_pending {
	struct mp_drv_conn *conn;
	struct mp_drv_req *req;     /* HELLO, then AUTH, receive */
	struct mp_drv_req *sreq;    /* CHALLENGE send */
	uint64_t since_ns;          /* accepted at; the whole handshake has the connect timeout */
	int got_hello;
	uint32_t idx;               /* from the HELLO: connection index */
	uint64_t id;                /* from the HELLO: the dialer's id, unproven until AUTH */
	int mode;
	double bandwidth;
	uint8_t nonce_d[MP_NONCE_BYTES], nonce_a[MP_NONCE_BYTES];
	char addr[MP_ADDR_STRLEN];
	/* MP_HELLO_MAX received, then MP_CHALLENGE_LEN sent: allocated apart,
	 * since the driver writes into it while ctx->pend may be reallocated */
	uint8_t *buf;
};
enum { MP_SCR_REDUCE, MP_SCR_ENCODE, MP_SCR_STAGE, MP_SCR_MAX };
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
	struct mp_fb *fbs;                 /* error-feedback residues (under mu) */
	struct mp_grid grid;
	struct mp_grid_grouping grouping_state;

	/* control plane */
	struct mp_auth auth;
	uint64_t self_id;
	int mode;                          /* own enum mp_mode */
	int dynamic;                       /* dht rendezvous: peers come and go */
	int nconn;                         /* connections per peer: streams, then control */
	int peers_cap;                     /* allocated entries of peers */
	const struct mp_rdv_ops *rdv;
	void *rdv_st;
	int coords[MP_MAX_GRID_DIMS];      /* dht: this peer's grid cell */
	int left;                          /* mp_leave was called */
	struct mp_ctrl *ctrl;              /* control messages (ctrl.c) */
	struct mp_record *recs;            /* dht: scratch for the rendezvous' member list */
	uint64_t published_ns;             /* dht: when the record was last republished */
	int placed;                        /* dht: has a grid cell (after the starting set) */
	int need_probe;                    /* dht: ask peers for the run's round */
	int synced;                        /* dht: a joiner asked before its first round */
	int displaced;                     /* dht: shares its cell; looks for a hole next round */
	uint32_t round_hint;               /* dht: the largest round a peer said it is at */
	uint32_t mm_round;                 /* dht: the round being matched or placed in; older
	                                      declarations over control connections are dropped */
	struct mp_heard *heard;            /* dht: declarations of rounds not started here yet */
	int nheard;
	uint32_t kept_round;               /* dht: 1 + the round whose key take_hole kept, or 0 */
	uint32_t decl_round;               /* dht: the largest round a DECL was heard for */
	uint32_t jumped_to;                /* dht: the round a round hint last moved us to */
	int suspects_new;                  /* dht: a connection showed a peer dead since the
	                                      matchmaker last told the round */
	int nrecs;                         /* dht: records in recs (the last sync) */
	int clog_fd;                       /* contribution log, or -1 */
	struct mp_fault *faults;           /* MP_FAULT actions (fault.c) */
	const struct mp_grouping_ops *grouping;
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
	struct mp_pending *pend;
	int npend, pend_cap;

	/* rounds */
	uint32_t round; /* global round number, agreed by all peers */

	/* scratch memory for frames, grown between operations, registered */
	uint8_t *slab;
	size_t slab_size;
	struct mp_drv_mr *slab_mr;

	/* reducer state (accumulators) and encoder scratch, kept between rounds:
	 * a fresh allocation of a large part every round costs a page fault
	 * per 4 KiB */
	void *scratch[MP_SCR_MAX];
	size_t scratch_size[MP_SCR_MAX];

	/* statistics of the context's life */
	uint64_t rejected[MP_REJ_MAX];
	struct mp_result *cur_res; /* counters of the operation running, or NULL */

	/* progress thread and its queue */
	pthread_t thread;
	int thread_started;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int stop;
	struct mp_reqq queue;
	struct mp_request *live;  /* released by mp_finalize if the caller never waited */

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

#endif
