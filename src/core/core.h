/* SPDX-License-Identifier: BSD-3-Clause */
/* Private to src/core: requests, registrations and configuration helpers. */
#ifndef MP_CORE_H
#define MP_CORE_H

#include "ctx.h"

/* The drivers (src/core/driver.c): built in, registered, or from MP_DRIVER_PATH. */
/* The usable driver named @name, or NULL (a broken built-in one says why in the log). */
const struct mp_driver_ops *mp_driver_find(const char *name);
/* The names of the usable drivers, comma-separated, for messages. */
void mp_driver_names(char *buf, size_t cap);
/* What @o listens on by default (its optional default_listen), or NULL. */
const char *mp_driver_default_listen(const struct mp_driver_ops *o);
/* @o's optional describe on @d, or "" (0) when it has none. */
int mp_driver_describe(const struct mp_driver_ops *o, struct mp_drv *d, char *text, size_t cap);
/* The transport's connections still in its own set-up (its optional
 * setting_up; 0 without it). */
int mp_driver_setting_up(const struct mp_driver_ops *o, struct mp_drv *d);

struct mp_stage;

struct mp_mr {
	void *buf;
	size_t len;
	enum mp_mem_kind kind;
	struct mp_drv_mr *dmr;    /* the transport's registration of buf; NULL for CUDA
	                             memory the transport cannot move */
	struct mp_stage *stage;   /* CUDA memory: its pinned host copy (stage.h) */
	int path;                 /* enum mp_mem_path */
	char why[512];            /* ... and why, as its INFO line says */
	int users;
	struct mp_mr *next;       /* the caller's host registrations (core->mrs, under mu) */
};

/* Error-feedback residue of one buffer (sparse codecs), kept across calls. */
struct mp_fb {
	const float *buf;
	size_t n;
	float *residue;    /* n values: host memory; device memory when ds is set */
	struct mp_stage *ds; /* CUDA memory on the device path: the residue lives on its GPU,
	                        allocated (zeroed) by the first average that needs it, and
	                        freed before the registration closes */
	int busy;          /* averages of the buffer in flight (under core->mu) */
	struct mp_fb *next;
};

struct mp_request {
	struct mp_ctx *ctx;
	const struct mp_codec_ops *codec; /* resolved ("auto" chosen; flush and
					     MP_AVG_UNCOMPRESSED forced to none) */
	struct mp_fb *fb;                 /* sparse codecs: the buffer's residue; with
					     flush_late, the residue to fold in */
	int flush_late;           /* MP_AVG_FLUSH on CUDA memory: the residue is folded into
	                             the buffer when the operation runs (run_average), on the
	                             device or in the host copy, not by the caller's thread */
	float *buf;
	float *x;                 /* where the operation runs: buf, or its place in
	                             the registration's host copy (staged CUDA memory) */
	size_t count;
	float weight;
	mp_mr *mr;
	int own_mr;               /* mr registered for this request only */
	int inl;                  /* run by the calling thread, not the progress thread */
	int found_mr;             /* mr is a registration of the caller's that covers buf */
	int state;                /* REQ_QUEUED, REQ_RUNNING, REQ_DONE */
	int status;
	struct mp_result res;
	struct mp_reqq_link qlink;      /* queue of the progress thread */
	struct mp_request *live_prev, *live_next; /* every request not yet released */
	/* Staged CUDA memory (stage.h): */
	void *in_ev;              /* recorded on the caller's stream (mp_average_start_stream):
	                             the copy in waits for it; NULL: the legacy default stream */
	uint32_t ticket;          /* this request's, of its registration's word */
};

enum { REQ_QUEUED, REQ_RUNNING, REQ_DONE };
/* Configuration helpers (config.c). */
int mp_config_resolve(const struct mp_config *in, struct mp_config *out, char ***peer_list,
		      int *npeers);
/* The encoder settings of a configuration. */
void mp_config_codec_params(const struct mp_config *cfg, struct mp_codec_params *p);
int mp_parse_doubles(const char *s, double *out, int n);
void mp_free_list(char **list, int n);

/*
 * The core's own part of a context, which no layer below sees: the progress
 * thread, its request queue, the requests not yet released and the error
 * feedback residues. mp_init allocates it with the context.
 */
struct mp_core {
	pthread_t thread;
	int thread_started;
	pthread_mutex_t mu;
	pthread_cond_t cv;        /* callers: a request is done */
	pthread_cond_t pcv;       /* the progress thread: a request is queued, or stop */
	struct mp_reqq queue;
	/* Who drives the transport (one thread at a time, under mu): the
	 * progress thread, running a request or its idle work (probes), or a
	 * caller that runs its blocking average itself (context.c, inline). */
	int running;
	int inline_busy;
	struct mp_request *live;  /* released by mp_finalize if the caller never waited */
	struct mp_fb *fbs;        /* error-feedback residues (under mu) */
	struct mp_mr *mrs;        /* registrations made with mp_mem_register (under mu): an
	                             average without a handle uses a host one that covers
	                             it; mp_finalize releases those left */
	/* State download (state.c): the service, started by mp_state_serve,
	 * and the last snapshot mp_state_publish made. */
	struct mp_state_srv *state_srv;
	struct mp_state_snap *state_snap;
};

/* Stop the state service and drop the snapshot (mp_finalize). */
void mp_state_fini(struct mp_ctx *ctx);

/* Failure memory of static runs (probe.c). */
void mp_fm_tick(struct mp_ctx *ctx);
void mp_fm_tick_probes(struct mp_ctx *ctx);
int mp_fm_busy(const struct mp_ctx *ctx);
int mp_fm_begin(struct mp_ctx *ctx, uint32_t rounds);
void mp_fm_end(struct mp_ctx *ctx, uint32_t base, uint32_t rounds);

#endif
