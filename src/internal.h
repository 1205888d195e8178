/* SPDX-License-Identifier: BSD-3-Clause */
/* Private to src/: the context, the transfer engine and the algorithms. */
#ifndef MP_INTERNAL_H
#define MP_INTERNAL_H

#include <pthread.h>
#include <stdint.h>
#include <moshpit/moshpit.h>
#include <moshpit/driver.h>

#include "auth.h"
#include "codec.h"
#include "grid.h"
#include "rdv.h"
#include "reqq.h"
#include "wire.h"

/* Built-in drivers (src/driver.c). */
const struct mp_driver_ops *mp_driver_find(const char *name);
/* Comma-separated list of built-in driver names, for messages. */
const char *mp_driver_names(void);

uint64_t mp_now_ns(void);

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

struct mp_stage;

struct mp_mr {
	void *buf;
	size_t len;
	enum mp_mem_kind kind;
	struct mp_drv_mr *dmr;    /* the transport's registration of buf; NULL for CUDA
	                             memory the transport cannot move */
	struct mp_stage *stage;   /* CUDA memory: its pinned host copy (stage.h) */
	int users;
};

/* Error-feedback residue of one buffer (sparse codecs), kept across calls. */
struct mp_fb {
	const float *buf;
	size_t n;
	float *residue;    /* n values */
	int busy;          /* averages of the buffer in flight (under ctx->mu) */
	struct mp_fb *next;
};

struct mp_request {
	struct mp_ctx *ctx;
	const struct mp_codec_ops *codec; /* resolved ("auto" chosen, flush forced to none) */
	struct mp_fb *fb;                 /* sparse codecs: the buffer's residue */
	float *buf;
	float *x;                 /* where the operation runs: buf, or its place in
	                             the registration's host copy (staged CUDA memory) */
	size_t count;
	float weight;
	mp_mr *mr;
	int own_mr;               /* mr registered for this request only */
	int state;                /* REQ_QUEUED, REQ_RUNNING, REQ_DONE */
	int status;
	struct mp_result res;
	struct mp_reqq_link qlink;      /* queue of the progress thread */
	struct mp_request *live_prev, *live_next; /* every request not yet released */
};

enum { REQ_QUEUED, REQ_RUNNING, REQ_DONE };

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
	int in_exchange;                   /* the engine polls control connections: a BYE waits */
	int suspects_new;                  /* dht: a connection showed a peer dead since the
	                                      matchmaker last told the round */
	int nrecs;                         /* dht: records in recs (the last sync) */
	int clog_fd;                       /* contribution log, or -1 */
	struct mp_fault *faults;           /* MP_FAULT actions (fault.c) */
	const struct mp_grouping_ops *grouping;

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

	char err[256];
};

/* Record a message as the context's last error (and log it at WARN). */
void mp_set_error(struct mp_ctx *ctx, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Thread-local error of the last failed mp_init. */
void mp_set_init_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Configuration helpers (config.c). */
int mp_config_resolve(const struct mp_config *in, struct mp_config *out, char ***peer_list,
		      int *npeers);
/* The encoder settings of a configuration. */
void mp_config_codec_params(const struct mp_config *cfg, struct mp_codec_params *p);
int mp_parse_doubles(const char *s, double *out, int n);
void mp_free_list(char **list, int n);

/* ---- transfer engine (engine.c) ---------------------------------------- */

struct mp_chan;

/* What an algorithm plugs into the engine for one exchange. */
struct mp_xfer_ops {
	/* Next message to send on @ch, if one is ready: fill @h (type, part,
	 * offset, count, weight, aux) and the fp32 source; return 1, else 0.
	 * Return 2 instead for a payload the algorithm encoded itself: *src then
	 * points at h->length bytes of it (cast), sent as they are. */
	int (*produce)(void *op, struct mp_chan *ch, struct mp_wire_hdr *h, const float **src);
	/* A validated frame arrived on @ch: check it is the expected one and apply
	 * it. Return 0, or -EPROTO for an unexpected frame (counted, peer dropped). */
	int (*consume)(void *op, struct mp_chan *ch, const struct mp_wire_hdr *h, const void *payload);
	/* Messages still expected on @ch (including those posted). */
	uint64_t (*recv_left)(void *op, struct mp_chan *ch);
	/* Messages still to send on @ch (including those in flight). */
	uint64_t (*send_left)(void *op, struct mp_chan *ch);
	/* A peer failed (error, bad frame or silence): stop expecting from it. */
	void (*peer_failed)(void *op, int peer);
	/* Optional: nonzero to drop @ch's peer now (fault injection: a cut connection). */
	int (*drop)(void *op, struct mp_chan *ch);
	/* Optional: nonzero when all that is still expected on @ch waits on
	 * other peers first (a result needs every contribution): silence there
	 * is not the peer's fault, and only the exchange's deadline applies. */
	int (*waits_on_others)(void *op, struct mp_chan *ch);
};

/* One connection of an exchange: (peer, stream). */
struct mp_chan {
	int peer;
	int stream;
	int failed;
	uint64_t sent, received;         /* messages */
	uint64_t send_posted, recv_posted;
	void *user;                      /* algorithm's per-channel state */
	/* engine-private */
	struct mp_xslot *ss, *rs;        /* window send / receive slots */
	int s_head, s_n, r_head, r_n;
	int staged;                      /* a produced message waits in the next send slot */
	int defer_err;                   /* post failed; completions will tell why */
};

struct mp_xfer {
	struct mp_ctx *ctx;
	const struct mp_xfer_ops *xops;
	void *op;
	uint32_t round, group_id;
	struct mp_chan *ch;
	int nch;
	struct mp_drv_mr *user_mr; /* registration of the user's buffer (zero-copy sends) */
	const struct mp_codec_ops *codec;
	float *residue;            /* error feedback of the whole buffer (sparse codecs), or NULL */
	void *enc_scratch;         /* the codec's encoder scratch (engine-private) */
	struct mp_result *res;
	const char *what;          /* for messages: "group all-reduce", "ring" */
	int deadline_ms;           /* the whole exchange; members still missing then are dropped (0 = none) */
};

/* Largest frame this context must be able to receive (engine.c). */
size_t mp_frame_rx_max(const struct mp_ctx *ctx);

/* Run an exchange until every channel is done or failed. Returns 0 when the
 * exchange finished (maybe with failed peers), or a negative errno when the
 * context is stopping (-ECANCELED). */
int mp_xfer_run(struct mp_xfer *x);

/* ---- algorithms ---------------------------------------------------------- */

struct mp_avg {
	float *x;
	size_t n;
	float weight;
	struct mp_drv_mr *dmr;
	struct mp_result *res;
	uint64_t influence; /* peers whose values can have reached ours (see mp_result.peers) */
	const struct mp_codec_ops *codec;
	float *residue;     /* n values of error feedback (sparse codecs), or NULL */
};

/* One butterfly all-reduce in group @g (group_allreduce.c). */
int mp_group_allreduce(struct mp_ctx *ctx, const struct mp_group *g, uint32_t round,
		       struct mp_avg *a);
/* Ring all-reduce over all peers (ring.c). */
int mp_ring_allreduce(struct mp_ctx *ctx, uint32_t round, struct mp_avg *a);

/* Make sure the slab holds @bytes; returns it or NULL (-ENOMEM). */
uint8_t *mp_slab(struct mp_ctx *ctx, size_t bytes);
/* Unregistered scratch memory @which (MP_SCR_*) of at least @bytes, 64-byte
 * aligned, reused between rounds. */
void *mp_scratch(struct mp_ctx *ctx, int which, size_t bytes);

#endif
