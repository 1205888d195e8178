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

#endif
