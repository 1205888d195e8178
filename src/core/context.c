/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The peer context: configuration, transport, peers, and the progress thread
 * that runs averaging operations one after another while the caller computes.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clog.h"
#include "conn.h"
#include "ctrl.h"
#include "fault.h"
#include "mp_kernels.h"
#include "core.h"
#include "log.h"
#include "matchmaker.h"
#include "stage.h"
#include "devpath.h"

/* Rounds an operation may sit out to catch up with a run that is ahead. */
#define MAX_BEHIND 2

static char *dup_or_null(const char *s)
{
	return s ? strdup(s) : NULL;
}

static int choose_grid(struct mp_ctx *ctx)
{
	char buf[64];
	int rc;

	if (ctx->cfg.grid) {
		rc = mp_grid_parse(ctx->cfg.grid, &ctx->grid);
		if (rc) {
			mp_set_init_error("grid \"%s\" is not M1xM2x... with each M >= 1", ctx->cfg.grid);
			return rc;
		}
	} else {
		mp_grid_auto(ctx->npeers, &ctx->grid);
	}
	if (ctx->dynamic) {
		/* Peers come and go: the grid is a space of cells, not a roster. */
		if (!ctx->cfg.grid && ctx->npeers < 1) {
			mp_set_init_error("the dht rendezvous needs a grid (MP_GRID) or npeers");
			return -EINVAL;
		}
		return 0;
	}
	if (mp_grid_cells(&ctx->grid) < (uint64_t)ctx->npeers) {
		mp_grid_format(&ctx->grid, buf, sizeof(buf));
		mp_set_init_error("grid %s has %llu cells, fewer than the %d peers", buf,
				  (unsigned long long)mp_grid_cells(&ctx->grid), ctx->npeers);
		return -EINVAL;
	}
	rc = mp_grid_grouping_init(&ctx->grid_grouping, &ctx->grid, ctx->npeers);
	if (rc)
		return rc;
	/* A dht run's matchmaker takes over in mp_dht_start. */
	ctx->grouping = &mp_grid_grouping_ops;
	ctx->grouping_st = &ctx->grid_grouping;
	return 0;
}

/* Static runs: per-rank bandwidths from MP_BANDWIDTHS. */
static int static_bandwidths(struct mp_ctx *ctx)
{
	int n = ctx->npeers;
	double *bw;

	if (!ctx->cfg.bandwidths)
		return 0;
	bw = malloc((size_t)n * sizeof(double));
	if (!bw)
		return -ENOMEM;
	if (mp_parse_doubles(ctx->cfg.bandwidths, bw, n)) {
		free(bw);
		mp_set_init_error("bandwidths \"%s\": expected %d comma-separated numbers",
				  ctx->cfg.bandwidths, n);
		return -EINVAL;
	}
	for (int i = 0; i < n; i++)
		ctx->peers[i].bandwidth = bw[i];
	free(bw);
	return 0;
}

static void *progress_main(void *arg);

/* Static runs: while an exchange waits, due probes of down peers go out too
 * (the engine calls this in place of mp_conn_poll). */
static void fm_exchange_hook(struct mp_ctx *ctx)
{
	mp_fm_tick_probes(ctx);
	mp_conn_poll(ctx);
}

int mp_init(const struct mp_config *cfg_in, mp_ctx **out)
{
	struct mp_config cfg;
	struct mp_ctx *ctx;
	char **list = NULL;
	int nlist = 0, rc;

	mp_log_init();
	if (!out)
		return -EINVAL;
	*out = NULL;
	rc = mp_config_resolve(cfg_in, &cfg, &list, &nlist);
	if (rc)
		return rc;
	if (cfg.log_level >= 0)
		mp_log_set_level(cfg.log_level);
	mp_codec_log_kernels();
	/* The core's part lives with the context, behind ctx->core. */
	struct ctx_box {
		struct mp_ctx ctx; /* first: free(ctx) frees the box */
		struct mp_core core;
	} *box = calloc(1, sizeof(*box));
	if (!box) {
		mp_free_list(list, nlist);
		return -ENOMEM;
	}
	ctx = &box->ctx;
	ctx->core = &box->core;
	ctx->clog_fd = -1; /* before any failure: mp_finalize closes it */
	ctx->cfg = cfg;
	ctx->rank = cfg.rank;
	ctx->npeers = cfg.npeers;
	mp_log_set_rank(ctx->rank);
	ctx->run_name = strdup(cfg.run_name);
	ctx->transport = strdup(cfg.transport ? cfg.transport : "tcp");
	ctx->listen_addr = dup_or_null(cfg.listen);
	/* Borrowed strings of the caller must not outlive this call. */
	ctx->cfg.run_name = ctx->run_name;
	ctx->cfg.transport = ctx->transport;
	ctx->cfg.listen = ctx->listen_addr;
	ctx->cfg.peers = ctx->cfg.hostfile = NULL;
	ctx->cfg.grid = NULL;
	pthread_mutex_init(&ctx->core->mu, NULL);
	pthread_cond_init(&ctx->core->cv, NULL);
	pthread_cond_init(&ctx->core->pcv, NULL);
	if (!ctx->run_name || !ctx->transport || (cfg.listen && !ctx->listen_addr)) {
		rc = -ENOMEM;
		goto fail;
	}
	ctx->run_id = mp_wire_run_id(ctx->run_name);
	ctx->mode = cfg.mode;
	ctx->dynamic = !strcmp(cfg.rendezvous, "dht");
	ctx->self_id = ctx->dynamic ? cfg.peer_id : (uint64_t)ctx->rank;
	rc = mp_auth_init(&ctx->auth, ctx->run_name, cfg.run_key, cfg.run_key_file);
	if (rc) {
		mp_set_init_error("run key: cannot use %s: %s",
				  cfg.run_key ? "MP_RUN_KEY" : cfg.run_key_file, mp_strerror(rc));
		goto fail;
	}
	if (ctx->auth.from_name)
		MP_INFO("no run key (MP_RUN_KEY or MP_RUN_KEY_FILE): the key derives from the run "
			"name, so anyone who knows \"%s\" can join", ctx->run_name);
	ctx->cfg.run_key = ctx->cfg.run_key_file = NULL;
	rc = mp_clog_open(ctx);
	if (!rc)
		rc = mp_fault_init(ctx);
	if (rc)
		goto fail;
	ctx->codec_cfg = cfg.codec;
	mp_config_codec_params(&cfg, &ctx->cparams);
	ctx->chunk_elems = cfg.chunk_bytes / sizeof(float);
	ctx->frame_rx_max = mp_frame_rx_max(ctx);
	ctx->window = cfg.window;
	ctx->spin_us = cfg.spin_us;

	ctx->ops = mp_driver_find(ctx->transport);
	if (!ctx->ops) {
		char names[256];

		mp_driver_names(names, sizeof(names));
		mp_set_init_error("transport \"%s\" is neither built in nor registered (have: %s)",
				  ctx->transport, names);
		rc = -ENOENT;
		goto fail;
	}
	struct mp_drv_params dp = {.size = sizeof(dp), .run_name = ctx->run_name, .rank = ctx->rank,
				   .connect_timeout_ms = cfg.connect_timeout_ms};
	mp_log_last_warn_clear();
	rc = ctx->ops->init(&dp, &ctx->drv);
	if (rc) {
		/* The driver logged what it looked for: that is the advice the
		 * user needs, so it ends the message rather than stays above it. */
		const char *why = mp_log_last_warn();

		mp_set_init_error("transport %s: initialisation failed: %s%s%s", ctx->transport,
				  mp_strerror(rc), *why ? ": " : "", why);
		goto fail;
	}
	ctx->ops->query(ctx->drv, &ctx->caps);
	ctx->streams = cfg.streams ? cfg.streams : (ctx->caps.default_streams > 0 ? ctx->caps.default_streams : 1);
	if (cfg.chunk_bytes + 4096 > ctx->caps.max_msg) {
		mp_set_init_error("chunk of %zu bytes exceeds the %s transport's largest message",
				  cfg.chunk_bytes, ctx->transport);
		rc = -EINVAL;
		goto fail;
	}

	/* grid */
	ctx->cfg.grid = cfg.grid;
	rc = choose_grid(ctx);
	ctx->cfg.grid = NULL;
	if (rc)
		goto fail;
	ctx->nconn = ctx->streams + 1;
	rc = mp_peers_init(ctx, ctx->dynamic ? 0 : ctx->npeers);
	if (!rc && !ctx->dynamic)
		rc = static_bandwidths(ctx);
	ctx->cfg.bandwidths = NULL;
	if (rc)
		goto fail;
	/* What every peer must share, fixed from here on: handshakes and
	 * records carry it (settings.h). A static run's cover every rank's
	 * part weight: made without them (bws NULL), they would say that no
	 * weights were set and disagree with the peers that had the memory,
	 * so a failed allocation fails mp_init. */
	double *bws = NULL;
	if (!ctx->dynamic) {
		bws = malloc((size_t)ctx->npeers * sizeof(double));
		if (!bws) {
			mp_set_init_error("out of memory for the part weights of %d peers (the settings "
					  "every peer must share)", ctx->npeers);
			rc = -ENOMEM;
			goto fail;
		}
		for (int i = 0; i < ctx->npeers; i++)
			bws[i] = ctx->peers[i].bandwidth;
	}
	mp_settings_make(&ctx->settings, &ctx->cfg, &ctx->grid, ctx->streams, ctx->chunk_elems,
			 ctx->codec_cfg, &ctx->cparams, bws, ctx->npeers, ctx->dynamic);
	free(bws);
	ctx->auth.settings_fp = mp_settings_fingerprint(&ctx->settings);
	rc = mp_ctrl_init(ctx);
	if (rc)
		goto fail;
	if (!ctx->dynamic && !ctx->exchange_hook)
		ctx->exchange_hook = fm_exchange_hook;

	/* listen (client peers are unreachable by definition: they only dial) */
	const char *bind = ctx->listen_addr;
	if (!bind && list)
		bind = list[ctx->rank];
	if (!bind)
		bind = mp_driver_default_listen(ctx->ops);
	if (ctx->mode != MP_MODE_CLIENT) {
		if (!bind) {
			mp_set_init_error("transport %s has no default address to listen on: set "
					  "MP_LISTEN", ctx->transport);
			rc = -EINVAL;
			goto fail;
		}
		uint8_t blob[MP_DRV_ADDR_MAX];
		size_t blen = sizeof(blob);
		rc = ctx->ops->listen(ctx->drv, bind, blob, &blen, &ctx->listener);
		if (rc) {
			mp_set_init_error("cannot listen on %s: %s", bind, mp_strerror(rc));
			goto fail;
		}
		rc = ctx->ops->addr_format(ctx->drv, blob, blen, ctx->local_addr,
					   sizeof(ctx->local_addr));
		if (rc)
			goto fail;
	}
	if (ctx->dynamic) {
		if (!ctx->self_id)
			while (!ctx->self_id)
				mp_auth_random(&ctx->self_id, sizeof(ctx->self_id));
		rc = mp_peer_learn(ctx, ctx->self_id, ctx->local_addr, cfg.bandwidth, ctx->mode);
		if (rc < 0)
			goto fail;
		ctx->rank = rc;
		rc = mp_dht_start(ctx);
		if (rc)
			goto fail;
		ctx->peers_set = 1;
		/* With MP_NPEERS, the starting set is known when mp_init returns,
		 * and so are mp_rank and mp_npeers (before the progress thread
		 * exists: place() has the context to itself). */
		if (cfg.npeers > 0 && (rc = mp_dht_join(ctx))) {
			mp_set_init_error("%s", mp_last_error(ctx));
			goto fail;
		}
		if (cfg.npeers > 0)
			mp_log_set_rank(mp_rank(ctx)); /* log lines tell the peers apart */
	}

	rc = pthread_create(&ctx->core->thread, NULL, progress_main, ctx);
	if (rc) {
		rc = -rc;
		goto fail;
	}
	ctx->core->thread_started = 1;
	if (list) {
		rc = mp_set_peers(ctx, (const char *const *)list, nlist);
		if (rc) {
			mp_set_init_error("%s", mp_last_error(ctx));
			goto fail;
		}
	}
	mp_free_list(list, nlist);
	/* The progress thread waits for its first request: the table is ours. */
	mp_peers_publish(ctx);
	char gbuf[64];
	mp_grid_format(&ctx->grid, gbuf, sizeof(gbuf));
	if (ctx->dynamic)
		MP_INFO("peer %016llx (rank %d of %d), run %s, rendezvous dht, transport %s, listening "
			"on %s, grid %s, codec %s, %d stream(s)", (unsigned long long)ctx->self_id,
			mp_rank(ctx), mp_npeers(ctx), ctx->run_name,
			ctx->transport, ctx->local_addr[0] ? ctx->local_addr : "(client: none)", gbuf,
			mp_codec_name(ctx->codec_cfg), ctx->streams);
	else
		MP_INFO("rank %d of %d, run %s, transport %s, listening on %s, grid %s, codec %s, "
			"%d stream(s)", ctx->rank, ctx->npeers, ctx->run_name, ctx->transport,
			ctx->local_addr, gbuf, mp_codec_name(ctx->codec_cfg), ctx->streams);
	*out = ctx;
	return 0;
fail:
	mp_free_list(list, nlist);
	mp_finalize(ctx);
	return rc;
}

int mp_local_address(mp_ctx *ctx, char *buf, size_t len)
{
	if (!ctx || !buf)
		return -EINVAL;
	if (strlen(ctx->local_addr) >= len)
		return -ENOSPC;
	strcpy(buf, ctx->local_addr);
	return 0;
}

int mp_transport_detail(mp_ctx *ctx, char *buf, size_t len)
{
	int rc;

	if (!ctx || !buf || !len)
		return -EINVAL;
	rc = mp_driver_describe(ctx->ops, ctx->drv, buf, len);
	if (rc < 0 || (size_t)rc >= len) {
		buf[0] = '\0';
		return rc < 0 ? rc : -ENOSPC;
	}
	return rc;
}

int mp_set_peers(mp_ctx *ctx, const char *const *addrs, int n)
{
	int rc;

	if (!ctx || !addrs)
		return -EINVAL;
	if (ctx->peers_set) {
		mp_set_error(ctx, "peers already set");
		return -EBUSY;
	}
	if (n != ctx->npeers) {
		mp_set_error(ctx, "%d peer addresses given for %d peers", n, ctx->npeers);
		return -EINVAL;
	}
	if (ctx->dynamic) {
		mp_set_error(ctx, "peers come from the dht rendezvous, not a list");
		return -EINVAL;
	}
	for (int i = 0; i < n; i++)
		if (!addrs[i] || strlen(addrs[i]) >= MP_ADDR_STRLEN) {
			mp_set_error(ctx, "peer %d: missing or overlong address", i);
			return -EINVAL;
		}
	/* The list goes behind the rendezvous interface like any membership. */
	struct mp_rdv_params rp = {.run_name = ctx->run_name, .auth = &ctx->auth, .addrs = addrs,
				   .naddrs = n};
	struct mp_record *recs = calloc((size_t)n, sizeof(*recs));
	if (!recs)
		return -ENOMEM;
	const struct mp_rdv_ops *rdv = &mp_rdv_static_ops;
	void *rdv_st = NULL;
	rc = rdv->init(&rp, &rdv_st);
	if (!rc)
		rc = rdv->members(rdv_st, recs, n) == n ? 0 : -EINVAL;
	if (rdv_st)
		rdv->fini(rdv_st);
	for (int i = 0; i < n && !rc; i++) {
		rc = mp_peer_learn(ctx, recs[i].id, recs[i].addr, recs[i].bandwidth, recs[i].mode);
		if (rc < 0)
			mp_set_error(ctx, "peer %d: \"%s\" is not a %s address", i, recs[i].addr,
				     ctx->transport);
		rc = rc < 0 ? -EINVAL : 0;
	}
	free(recs);
	if (rc)
		return rc;
	mp_peers_publish(ctx);
	pthread_mutex_lock(&ctx->core->mu);
	ctx->peers_set = 1;
	/* Static runs: the progress thread now answers handshakes and probes
	 * between averages, also when every average runs inline. */
	pthread_cond_signal(&ctx->core->pcv);
	pthread_mutex_unlock(&ctx->core->mu);
	return 0;
}

int mp_grid_shape(const char *grid, int npeers, int *dims, int max)
{
	struct mp_grid g;

	if (npeers < 1 || !dims || max < 1)
		return -EINVAL;
	if (grid ? mp_grid_parse(grid, &g) : mp_grid_auto(npeers, &g))
		return -EINVAL;
	if (g.ndims > max || mp_grid_cells(&g) < (uint64_t)npeers)
		return -EINVAL;
	memcpy(dims, g.dims, (size_t)g.ndims * sizeof(int));
	return g.ndims;
}

int mp_transport_available(const char *name)
{
	return name && mp_driver_find(name) != NULL;
}

uint64_t mp_peer_id(const mp_ctx *ctx)
{
	return ctx->self_id;
}

int mp_dht_address(mp_ctx *ctx, char *buf, size_t len)
{
	if (!ctx || !buf)
		return -EINVAL;
	if (!ctx->dynamic)
		return -ENOTSUP;
	return mp_mm_address(ctx, buf, len);
}

/* Tell the others we go; the caller makes sure no operation runs. */
static void leave_now(struct mp_ctx *ctx)
{
	if (ctx->left)
		return;
	ctx->left = 1;
	if (ctx->dynamic)
		mp_mm_leave(ctx);
}

int mp_leave(mp_ctx *ctx)
{
	if (!ctx)
		return -EINVAL;
	pthread_mutex_lock(&ctx->core->mu);
	if (ctx->core->queue.n || ctx->core->live) {
		pthread_mutex_unlock(&ctx->core->mu);
		mp_set_error(ctx, "mp_leave: operations are still in flight");
		return -EBUSY;
	}
	pthread_mutex_unlock(&ctx->core->mu);
	/* The progress thread is idle (waiting for work), so the driver is ours. */
	leave_now(ctx);
	return 0;
}

/* dht runs: ctx->rank and ctx->npeers are the peer table's (this peer is
 * entry 0, and the table grows as peers are learnt); the caller gets the
 * index among the members seen at the join, and their count (matchmaker.h),
 * or 0 and 1 (this peer alone) before it placed itself. */
int mp_rank(const mp_ctx *ctx)
{
	if (ctx->dynamic && ctx->dht) {
		int r = __atomic_load_n(&ctx->dht->join_rank, __ATOMIC_ACQUIRE);
		return r >= 0 ? r : 0;
	}
	return ctx->rank;
}

int mp_npeers(const mp_ctx *ctx)
{
	if (ctx->dynamic && ctx->dht) {
		int n = __atomic_load_n(&ctx->dht->join_npeers, __ATOMIC_ACQUIRE);
		return n > 0 ? n : 1;
	}
	return ctx->npeers;
}

/*
 * CUDA memory. Where the codec kernels can run on its device, the group
 * all-reduce reduces it on the GPU and only encoded chunks cross the bus,
 * through a small ring of pinned buffers (the device path, devpath.h);
 * so does the ring algorithm, with every codec. A transport that moves
 * device memory registers that ring's device side (GPUDirect RDMA), and
 * the chunks go between the NIC and GPU memory with no host copy. Otherwise (no usable
 * kernels, or MP_CUDA_STAGE=1), averaging goes through a pinned host copy
 * of the whole registration (stage.c) on every transport.
 * Staged whole, a transport that can move device memory registers the
 * buffer as well, through its own ladder (dma-buf, then nvidia-peermem),
 * and logs which path it took; when it cannot (-EOPNOTSUPP, or any other
 * refusal), the host copy is all there is. One INFO line says which path
 * the buffer takes, and why.
 */
static int register_cuda(struct mp_ctx *ctx, void *buf, size_t len, mp_mr **out)
{
	struct mp_mr *mr = calloc(1, sizeof(*mr));
	char why[160], whyd[256] = "";
	int rc, device = 0;

	if (!mr)
		return -ENOMEM;
	if (ctx->cfg.cuda_stage)
		snprintf(whyd, sizeof(whyd), "MP_CUDA_STAGE=1");
	rc = mp_stage_open_dev(ctx, buf, len, whyd[0] ? NULL : mp_dev_open, &device, whyd,
			       sizeof(whyd), &mr->stage);
	if (rc) {
		free(mr);
		return rc;
	}
	if (device) {
		mp_dev_describe(ctx, mr->stage, mr->why, sizeof(mr->why));
		mr->path = mp_dev_gdr(mr->stage) ? MP_MEM_PATH_GPUDIRECT : MP_MEM_PATH_DEVICE;
		MP_INFO("CUDA memory %p (%zu bytes) is averaged on the GPU (%s); %s", buf, len,
			mr->stage->dp->k->name, mr->why);
	} else if (!(ctx->caps.flags & MP_DRV_CAP_DEVICE_MEM)) {
		snprintf(why, sizeof(why), "transport %s cannot move device memory", ctx->transport);
	} else if ((rc = ctx->ops->reg_mr(ctx->drv, buf, len, MP_MEM_CUDA, &mr->dmr))) {
		mr->dmr = NULL;
		snprintf(why, sizeof(why), "transport %s cannot register it (%s)", ctx->transport,
			 mp_strerror(rc));
	} else {
		snprintf(why, sizeof(why), "the reducer reads host memory (transport %s registered "
			 "the device memory too)", ctx->transport);
	}
	if (!device) {
		mr->path = MP_MEM_PATH_STAGED;
		snprintf(mr->why, sizeof(mr->why), "%s (no device path: %s)", why, whyd);
		MP_INFO("CUDA memory %p (%zu bytes) is staged through host memory: %s", buf, len,
			mr->why);
	}
	mr->buf = buf;
	mr->len = len;
	mr->kind = MP_MEM_CUDA;
	*out = mr;
	return 0;
}

static int mem_register(mp_ctx *ctx, void *buf, size_t len, enum mp_mem_kind kind, mp_mr **out)
{
	struct mp_mr *mr;
	int rc;

	if (!ctx || !buf || !len || !out)
		return -EINVAL;
	if (kind != MP_MEM_HOST && kind != MP_MEM_CUDA && kind != MP_MEM_DMABUF)
		return -EINVAL;
	if (kind == MP_MEM_CUDA)
		return register_cuda(ctx, buf, len, out);
	if (kind == MP_MEM_DMABUF && !(ctx->caps.flags & MP_DRV_CAP_DEVICE_MEM)) {
		/* Staging needs a way to copy out of the memory; a dma-buf is
		 * only a file descriptor's worth of pages to us. */
		mp_set_error(ctx, "transport %s cannot move dma-buf memory", ctx->transport);
		return -ENOTSUP;
	}
	mr = calloc(1, sizeof(*mr));
	if (!mr)
		return -ENOMEM;
	rc = ctx->ops->reg_mr(ctx->drv, buf, len, kind, &mr->dmr);
	if (rc) {
		free(mr);
		mp_set_error(ctx, "transport %s cannot register %zu bytes: %s", ctx->transport, len,
			     mp_strerror(rc));
		return rc;
	}
	mr->buf = buf;
	mr->len = len;
	mr->kind = kind;
	*out = mr;
	return 0;
}

int mp_mem_path(const mp_mr *mr, char *why, size_t len)
{
	if (!mr)
		return -EINVAL;
	if (why && len)
		snprintf(why, len, "%s", mr->path == MP_MEM_PATH_HOST ? "host memory" : mr->why);
	return mr->path;
}

int mp_mem_register(mp_ctx *ctx, void *buf, size_t len, enum mp_mem_kind kind, mp_mr **out)
{
	int rc = mem_register(ctx, buf, len, kind, out);

	/* Listed for find_mr (host memory) and for mp_finalize (all). */
	if (!rc) {
		pthread_mutex_lock(&ctx->core->mu);
		(*out)->next = ctx->core->mrs;
		ctx->core->mrs = *out;
		pthread_mutex_unlock(&ctx->core->mu);
	}
	return rc;
}

/* Under mu: a host registration of the caller's that covers [buf, buf + n). */
static struct mp_mr *find_mr(struct mp_ctx *ctx, const float *buf, size_t n)
{
	for (struct mp_mr *m = ctx->core->mrs; m; m = m->next)
		if (m->kind == MP_MEM_HOST && (const char *)buf >= (const char *)m->buf &&
		    (size_t)((const char *)buf - (const char *)m->buf) <= m->len &&
		    n * sizeof(float) <= m->len - (size_t)((const char *)buf - (const char *)m->buf))
			return m;
	return NULL;
}

static void fb_drop_dev(struct mp_ctx *ctx, const struct mp_stage *s);

int mp_mem_deregister(mp_ctx *ctx, mp_mr *mr)
{
	int users;

	if (!ctx || !mr)
		return 0;
	pthread_mutex_lock(&ctx->core->mu);
	users = mr->users;
	if (!users) {
		/* Out of the list in the same hold: no average can pick it up now. */
		for (struct mp_mr **pp = &ctx->core->mrs; *pp; pp = &(*pp)->next)
			if (*pp == mr) {
				*pp = mr->next;
				break;
			}
	}
	pthread_mutex_unlock(&ctx->core->mu);
	if (users)
		return -EBUSY;
	if (mr->dmr)
		ctx->ops->dereg_mr(ctx->drv, mr->dmr);
	fb_drop_dev(ctx, mr->stage);
	mp_stage_close(ctx, mr->stage);
	free(mr);
	return 0;
}

/* ---- averaging ---------------------------------------------------------- */

/*
 * Start dialling the members of a group. Before the first round, for the
 * groups of the first rounds when the grouping knows them ahead: a peer held
 * up in an early round (say, by a dead groupmate) has then already connected
 * to its later groupmates, who would otherwise give up on it at their
 * connect timeout and spread one failure down the rounds.
 */
static void dial_ahead(struct mp_ctx *ctx, const int *peers, int n)
{
	int err;

	for (int i = 0; i < n; i++)
		for (int s = 0; s < ctx->streams && peers[i] != ctx->rank; s++)
			mp_conn_get(ctx, peers[i], s, &err);
}

/*
 * Whether this average copies its buffer (and residue) before its first
 * round, so that a disagreement met in a later round can put them back:
 * -EBADE or -EMSGSIZE must leave the caller's buffer as it was (design.md,
 * "Two disagreements"). The first round that exchanges needs no copy:
 * nothing of a given-up exchange is applied. A later one does, since the
 * rounds before wrote the whole vector.
 *
 * The copy is one pass over the vector, and memory to hold it, per average:
 * small next to a round's own copies and reductions, but not free on a fast
 * network. So it is taken only where a later round may meet a peer not
 * known to agree: a groupmate of a later round without a ready connection
 * on every stream (handshakes agree on the settings), or whose OPEN has not
 * yet agreed on this length over the stream-0 connection still open
 * (conn.h, mp_conn_agreed_len); and any peer when the grouping cannot say
 * ahead who the later rounds meet (the dht matchmaker, whose rounds wait
 * for matchmaking anyway). The first average of a length copies, as does
 * the first after a peer restarted or reconnected; the steady state, the
 * same lengths on the same connections, does not.
 *
 * Without the copy, a peer that disagrees anyway in a later round (it
 * restarted with other settings during the average, or alone changed the
 * length it averages) is dropped from that round as a failed peer
 * (mp_avg.irreversible): the average goes on without it, as without a dead
 * peer, and returns neither error. (The peer itself, and the groupmates for
 * which the length is new, still fail loudly.) Verifying every round's
 * groupmates before any data moves would cost a round trip per average
 * instead; copying every time, a pass over the vector per average.
 */
static int undo_copy_needed(struct mp_ctx *ctx, const struct mp_grouping_ops *go, void *st,
			    int rounds, int *members, uint64_t n)
{
	int first = 1;

	if (!go->lookahead)
		return rounds > 1;
	for (int t = 0; t < rounds; t++) {
		struct mp_group g = {.members = members};

		if (go->form(st, ctx->round + (uint32_t)t, ctx->rank, &g) || g.size < 2)
			continue;
		if (first) {
			first = 0;
			continue;
		}
		for (int m = 0; m < g.size; m++) {
			int p = g.members[m];

			/* Two clients never connect, nor exchange anything. */
			if (p == ctx->rank ||
			    (ctx->mode == MP_MODE_CLIENT && ctx->peers[p].mode == MP_MODE_CLIENT))
				continue;
			if (!mp_conn_agreed_len(ctx, p, n))
				return 1;
		}
	}
	return 0;
}

/*
 * Moshpit rounds, static and dht alike: the grouping (ctx->grouping, the
 * grid or the matchmaker) forms each round's group, the group all-reduce
 * averages in it.
 */
static int run_moshpit(struct mp_ctx *ctx, struct mp_avg *a)
{
	const struct mp_grouping_ops *go = ctx->grouping;
	void *st = ctx->grouping_st;
	/* Static runs with peers down keep the configured grid, their cells
	 * empty (probe.c): the same rounds and groups for every view. */
	const struct mp_grid *grid = &ctx->grid;
	int rounds = ctx->cfg.rounds ? ctx->cfg.rounds : grid->ndims;
	int cap = ctx->npeers > MP_MAX_GROUP ? ctx->npeers : MP_MAX_GROUP;
	int *members = malloc((size_t)cap * sizeof(int) * 2);
	int *line = members ? members + cap : NULL;
	int rc = 0, ok_rounds = 0, wrote = 0, undo = 0;
	const uint32_t end_round = ctx->round + (uint32_t)rounds;
	uint32_t first_round = 0, last_round = 0;
	const float w0 = a->weight;
	float *save = NULL;
	size_t nsave = 0;

	if (!members)
		return -ENOMEM;
	if (go->begin && (rc = go->begin(st)))
		goto out;
	/* Decided before round 0 writes anything. */
	undo = undo_copy_needed(ctx, go, st, rounds, members, a->n);
	if (undo) {
		/* Staged CUDA memory is copied back only after a success: its
		 * device buffer needs no copy of ours. */
		nsave = a->dev ? 0 : (a->x_is_copy ? 0 : a->n) + (a->residue ? a->n : 0);
		if (a->dev) {
			/* The device path: the copy stays on the device, the
			 * residue's after the buffer's. */
			size_t b = a->n * sizeof(float);
			float *u = mp_dev_undo_mem(ctx, a->dev, a->residue ? 2 * b : b);
			rc = u ? mp_dev_copy_sync(ctx, a->dev, u, a->x, b, 2,
						  "the copy of the buffer before the rounds") : -ENOMEM;
			if (!rc && a->residue)
				rc = mp_dev_copy_sync(ctx, a->dev, u + a->n, a->residue, b, 2,
						      "the copy of the error feedback before the rounds");
			if (rc)
				goto end;
		}
		if (nsave) {
			save = mp_scratch(ctx, MP_SCR_UNDO, nsave * sizeof(float));
			if (!save) {
				rc = -ENOMEM;
				goto end;
			}
			if (!a->x_is_copy)
				memcpy(save, a->x, a->n * sizeof(float));
			if (a->residue)
				memcpy(save + nsave - a->n, a->residue, a->n * sizeof(float));
			MP_TRACE("copied the buffer before round %u: a later round may meet a peer "
				 "not known to agree", ctx->round);
		}
	} else if (ctx->scratch[MP_SCR_UNDO]) {
		/* Every later groupmate is known to agree: the copy's memory goes
		 * back until an average needs it again. */
		free(ctx->scratch[MP_SCR_UNDO]);
		ctx->scratch[MP_SCR_UNDO] = NULL;
		ctx->scratch_size[MP_SCR_UNDO] = 0;
	}
	for (int t = 0; go->lookahead && t < rounds && t < grid->ndims; t++) {
		struct mp_group g = {.members = members};
		if (!go->form(st, ctx->round + (uint32_t)t, ctx->rank, &g))
			dial_ahead(ctx, g.members, g.size);
	}
	for (int t = 0, behind = 0; t < rounds; t++) {
		struct mp_group g = {.members = members};
		uint32_t round = go->next_round ? go->next_round(st, ctx->round) : ctx->round;

		if (!t && !behind)
			first_round = round;
		last_round = round;
		ctx->round = round + 1;
		rc = go->form(st, round, ctx->rank, &g);
		if (rc == -EAGAIN && go->next_round && behind < MAX_BEHIND) {
			/* The run is at a later round: sit this one out and
			 * match the run's in this operation. Ending it instead
			 * brought the peer back a round late again at its next
			 * call, with the others one ahead: a joiner that heard
			 * of the run's round a round late chased it, call after
			 * call, to the end of the run. */
			a->res->rounds_alone++;
			mp_clog_alone(ctx, round);
			behind++;
			t--;
			rc = 0;
			continue;
		}
		if (rc == -EAGAIN)
			rc = -EHOSTUNREACH;
		if (rc == -EHOSTUNREACH) {
			/* No group this round: our values stay as they are. */
			a->res->rounds_alone++;
			mp_clog_alone(ctx, round);
			rc = 0;
			continue;
		}
		if (rc)
			break;
		if (go->line) {
			/* The configured line: the pairwise exchange plans on it. */
			int n = go->line(st, round, ctx->rank, line);

			g.line = n > 0 ? line : NULL;
			g.line_size = n > 0 ? n : 0;
		}
		MP_TRACE("round %u: group %08x of %d, part %d", round, g.id, g.size, g.my_index);
		a->res->group_size = g.size;
		dial_ahead(ctx, g.members, g.size);
		/* A disagreement may end the average only while the buffer can
		 * still be what the caller passed: before anything was written,
		 * or with the copy to put back. */
		a->irreversible = wrote && !undo && (!a->x_is_copy || a->residue);
		rc = mp_group_allreduce(ctx, &g, round, a);
		wrote |= g.size > 1 && rc != -EBADE && rc != -EMSGSIZE;
		if (go->after_round)
			go->after_round(st, round, &g);
		if (rc == -EHOSTUNREACH) {
			/* An isolated round leaves our values as they were; other
			 * rounds' groups may still be reachable. */
			a->res->rounds_alone++;
			rc = 0;
			continue;
		}
		if (rc)
			break;
		ok_rounds++;
	}
end:
	if (go->end)
		go->end(st);
	if ((rc == -EBADE || rc == -EMSGSIZE) && wrote && undo) {
		/* The disagreement ends the average as if it had met it first:
		 * the buffer, residue and weight as the caller passed them. */
		if (a->dev) {
			const float *u = a->dev->dp->dundo;
			int ru = mp_dev_copy_sync(ctx, a->dev, a->x, u, a->n * sizeof(float), 2,
						  "putting the buffer back");
			if (!ru && a->residue)
				ru = mp_dev_copy_sync(ctx, a->dev, a->residue, u + a->n,
						      a->n * sizeof(float), 2,
						      "putting the error feedback back");
			if (ru)
				MP_WARN("round %u: the buffer could not be put back: it holds the "
					"earlier rounds' values", last_round);
		} else if (!a->x_is_copy) {
			memcpy(a->x, save, a->n * sizeof(float));
		}
		if (a->residue && !a->dev)
			memcpy(a->residue, save + nsave - a->n, a->n * sizeof(float));
		a->weight = w0;
		a->influence = 1;
		mp_clog_restore(ctx, last_round, first_round);
		MP_INFO("round %u: %s: the buffer is put back as it was before round %u",
			last_round, rc == -EBADE ? "a peer's settings differ" : "a peer averages "
			"another length", first_round);
	}
	/* An average given up (settings or length differ from a peer's) still
	 * spends its rounds: a static run counts them locally, and its next
	 * average must meet its peers' in the same round. */
	if (rc && !go->next_round && (int32_t)(end_round - ctx->round) > 0)
		ctx->round = end_round;
	/* A static peer that reached nobody is cut off from a fixed membership;
	 * in a dht run, rounds alone are churn, counted in rounds_alone. */
	if (!rc && !ok_rounds && rounds > 0 && ctx->npeers > 1 && !ctx->dynamic) {
		mp_set_error(ctx, "no round could reach any group member");
		rc = -EHOSTUNREACH;
	}
out:
	free(members);
	return rc;
}

static int run_butterfly(struct mp_ctx *ctx, struct mp_avg *a)
{
	int *members = malloc((size_t)ctx->npeers * sizeof(int) * 2);
	struct mp_group g = {.members = members, .size = ctx->npeers, .my_index = ctx->rank};
	uint32_t round = ctx->round++;
	int rc;

	if (!members)
		return -ENOMEM;
	for (int i = 0; i < ctx->npeers; i++)
		members[i] = members[ctx->npeers + i] = i;
	if (!ctx->dynamic) {
		/* Every peer, down or not: the pairwise exchange plans on it. */
		g.line = members + ctx->npeers;
		g.line_size = ctx->npeers;
	}
	if (ctx->live && ctx->nlive < ctx->npeers) {
		/* One group of the live peers (failure memory). */
		g.size = ctx->nlive;
		for (int i = 0; i < ctx->nlive; i++) {
			members[i] = ctx->live[i];
			if (members[i] == ctx->rank)
				g.my_index = i;
		}
	}
	dial_ahead(ctx, members, g.size);
	g.id = round * 2654435761u;
	rc = mp_group_allreduce(ctx, &g, round, a);
	free(members);
	return rc;
}

/* MP_AVG_FLUSH on CUDA memory: the residue into the buffer, once the
 * buffer is where the operation reads it (the host copy, staged, or the
 * device), and zeroed; the average that follows takes no residue. */
static int flush_late(struct mp_ctx *ctx, struct mp_request *req, struct mp_stage *s)
{
	struct mp_fb *f = req->fb;
	int rc;

	if (!f->residue)
		return 0; /* a device residue no average allocated: nothing held back */
	if (!f->ds) {
		mp_k_axpy(req->x, f->residue, 1.0f, req->count);
		memset(f->residue, 0, req->count * sizeof(float));
		return 0;
	}
	rc = mp_dev_axpy(s, req->x, f->residue, req->count, 1.0f, NULL);
	if (!rc)
		rc = s->ops->fill32(&s->dev, f->residue, 0, req->count, s->stream);
	if (rc)
		mp_set_error(ctx, "%s memory %p: folding the error feedback into the buffer failed "
			     "on the device (%s)", s->ops->name, (void *)req->buf, mp_strerror(rc));
	return rc ? -EIO : mp_dev_sync(ctx, s, "the error feedback folded into the buffer");
}

/* A device residue for @f, held busy by the caller (so nothing else reads
 * the field): zeroed with @zero, else to be written whole. 0 or an errno,
 * with the context's error set. */
static int fb_dev_alloc(struct mp_ctx *ctx, struct mp_fb *f, int zero)
{
	struct mp_stage *ds = f->ds;
	void *p = NULL;
	int rc = ds->ops->dev_alloc(&ds->dev, f->n * sizeof(float), &p);

	if (rc) {
		mp_set_error(ctx, "no %zu bytes of %s device memory for the error feedback of %p: %s",
			     f->n * sizeof(float), ds->ops->name, (const void *)f->buf,
			     mp_strerror(rc));
		return rc;
	}
	if (zero && ds->ops->fill32(&ds->dev, p, 0, f->n, ds->stream)) {
		mp_set_error(ctx, "%s memory %p: zeroing the error feedback failed", ds->ops->name,
			     (const void *)f->buf);
		rc = -EIO;
	} else if (zero) {
		rc = mp_dev_sync(ctx, ds, "zeroing the error feedback");
	}
	if (rc) {
		ds->ops->dev_free(&ds->dev, p);
		return -EIO;
	}
	f->residue = p;
	return 0;
}

/* The device residue of @req's error feedback, zeroed, at its first average. */
static int dev_residue(struct mp_ctx *ctx, struct mp_request *req)
{
	if (!req->fb || !req->fb->ds || req->fb->residue || req->flush_late)
		return 0;
	return fb_dev_alloc(ctx, req->fb, 1);
}

static int run_average(struct mp_ctx *ctx, struct mp_request *req)
{
	struct mp_stage *s = req->mr->stage;
	struct mp_avg a = {.x = req->x, .n = req->count, .weight = req->weight,
			   .dmr = s ? s->dmr : req->mr->dmr, .res = &req->res, .codec = req->codec,
			   .dev = s && s->dp ? s : NULL, .x_is_copy = s && !s->dp};
	int rc = req->flush_late ? flush_late(ctx, req, s) : dev_residue(ctx, req);

	if (rc)
		return rc;
	/* Set now: the first average of a device residue allocates it. */
	a.residue = req->fb && !req->flush_late ? req->fb->residue : NULL;
	req->res.codec = req->codec->id;
	a.influence = 1;
	/* Static runs: the round moves on by the same count in every average,
	 * and the live set is fixed for this one (probe.c). */
	uint32_t R = ctx->cfg.algo == MP_ALGO_MOSHPIT ?
		(uint32_t)(ctx->cfg.rounds ? ctx->cfg.rounds : ctx->grid.ndims) : 1;
	/* Handshakes refused before the first exchange count in this result. */
	ctx->cur_res = &req->res;
	rc = mp_fm_begin(ctx, R);
	ctx->cur_res = NULL;
	if (rc)
		return rc;
	uint32_t base = ctx->round;
	if (!ctx->dynamic && ctx->npeers > 1 && ctx->nlive == 1) {
		/* Averaging alone is no average: say so, and keep the values. */
		mp_set_error(ctx, "every other peer is down (probed in the background; the next "
			     "average asks where the run is and rejoins it once one answers)");
		/* No exchange ran: the round stays, so that failing again and
		 * again does not carry this peer's rounds away from the run's. */
		mp_fm_end(ctx, base, 0);
		req->res.weight = a.weight;
		req->res.peers = 1;
		return -EHOSTUNREACH;
	}
	switch (ctx->cfg.algo) {
	case MP_ALGO_RING:
		rc = mp_ring_allreduce(ctx, ctx->round++, &a);
		break;
	case MP_ALGO_BUTTERFLY:
		rc = run_butterfly(ctx, &a);
		break;
	default:
		rc = run_moshpit(ctx, &a);
		break;
	}
	mp_fm_end(ctx, base, R);
	req->res.weight = a.weight;
	req->res.peers = (int)a.influence;
	return rc;
}

/*
 * Staged CUDA memory is averaged in its registration's host copy: copied in
 * right before the operation runs, copied back once its result is final.
 * Both copies run here, on the progress thread, with the memory's own CUDA
 * context pushed around each (stage.c), rather than in the caller's thread:
 * mp_average_start then costs what it costs for host memory, so the caller
 * overlaps the copy in with its compute as it does the averaging itself; a
 * request completes only once the result is back in device memory, so
 * mp_test and mp_wait need no CUDA calls and may run on any thread, current
 * context or not; and the device buffer is written once, with the final
 * result, and not at all when the operation fails or is cancelled.
 */
static int run_request(struct mp_ctx *ctx, struct mp_request *req)
{
	struct mp_stage *s = req->mr->stage;
	size_t off, bytes = req->count * sizeof(float);
	int rc;

	if (!s)
		return run_average(ctx, req);
	if (s->dp) {
		/* The device path reads the buffer on the registration's stream:
		 * it waits for the caller's work there, bounded as the copy in. */
		rc = mp_stage_order(ctx, s, req->in_ev);
		mp_stage_unmark(s, req->in_ev);
		req->in_ev = NULL;
		return rc ? rc : run_average(ctx, req);
	}
	off = (size_t)((char *)req->buf - (char *)req->mr->buf);
	rc = mp_stage_in(ctx, s, off, bytes, req->in_ev);
	/* Waited for (or given up on): the stream's wait holds what it needs. */
	mp_stage_unmark(s, req->in_ev);
	req->in_ev = NULL;
	if (!rc)
		rc = run_average(ctx, req);
	if (!rc)
		rc = mp_stage_out(ctx, s, off, bytes);
	return rc;
}

/*
 * Before the transport is left alone (the caller computes, the progress
 * thread sleeps): a driver may hold sends until its next progress (tcp
 * gathers a connection's queued frames into one system call there), and a
 * control message sent last, a matchmaker's declaration for the next round,
 * must not wait for the next average to leave.
 */
static void flush_sends(struct mp_ctx *ctx)
{
	if (ctx->ops && ctx->drv)
		ctx->ops->progress(ctx->drv, 0);
}

static void *progress_main(void *arg)
{
	struct mp_ctx *ctx = arg;

	mp_log_set_rank(ctx->rank);
	pthread_mutex_lock(&ctx->core->mu);
	for (;;) {
		struct mp_request *req;

		while ((!ctx->core->queue.n || ctx->core->inline_busy) && !ctx->stop) {
			if (ctx->dynamic || !ctx->peers_set) {
				pthread_cond_wait(&ctx->core->pcv, &ctx->core->mu);
				continue;
			}
			/* Static runs: between averages the thread probes down
			 * peers and answers others' handshakes (probe.c): every
			 * 5 ms while probes are due or under way, else 50 ms. */
			struct timespec dl;
			long ns = !ctx->core->inline_busy && mp_fm_busy(ctx) ? 5000000L : 50000000L;
			clock_gettime(CLOCK_REALTIME, &dl);
			dl.tv_nsec += ns;
			if (dl.tv_nsec >= 1000000000L) {
				dl.tv_sec++;
				dl.tv_nsec -= 1000000000L;
			}
			pthread_cond_timedwait(&ctx->core->pcv, &ctx->core->mu, &dl);
			/* A caller running its own average owns the transport:
			 * no probes meanwhile (its exchange answers handshakes). */
			if (ctx->core->inline_busy)
				continue;
			if (ctx->core->queue.n || ctx->stop)
				break;
			ctx->core->running = 1;
			pthread_mutex_unlock(&ctx->core->mu);
			mp_fm_tick(ctx);
			pthread_mutex_lock(&ctx->core->mu);
			ctx->core->running = 0;
		}
		if (ctx->stop)
			break;
		req = mp_reqq_pop_entry(&ctx->core->queue, struct mp_request, qlink);
		req->state = REQ_RUNNING;
		ctx->core->running = 1;
		pthread_mutex_unlock(&ctx->core->mu);

		int rc = run_request(ctx, req);
		/* States set between exchanges (matchmaking, BYE) show too. */
		mp_peers_publish(ctx);
		flush_sends(ctx);
		/* Before the request can be released (and its registration with
		 * it): streams that wait for it go on, whatever its end. */
		if (req->mr->stage)
			mp_stage_end(req->mr->stage, req->ticket);

		pthread_mutex_lock(&ctx->core->mu);
		ctx->core->running = 0;
		req->status = rc;
		req->state = REQ_DONE;
		pthread_cond_broadcast(&ctx->core->cv);
	}
	/* Finalizing: what never started is cancelled. */
	for (struct mp_request *r; (r = mp_reqq_pop_entry(&ctx->core->queue, struct mp_request, qlink));) {
		if (r->mr->stage)
			mp_stage_end(r->mr->stage, r->ticket);
		r->status = -ECANCELED;
		r->state = REQ_DONE;
	}
	pthread_cond_broadcast(&ctx->core->cv);
	pthread_mutex_unlock(&ctx->core->mu);
	return NULL;
}

/* Sizes at or above which "auto" compresses, and more strongly (doc/codecs.md). */
#define AUTO_FP16_BYTES (64u * 1024)
#define AUTO_8BIT_BYTES (1024u * 1024)

static const struct mp_codec_ops *resolve_codec(const struct mp_ctx *ctx, size_t count)
{
	size_t bytes = count * sizeof(float);

	if (ctx->codec_cfg != MP_CODEC_AUTO)
		return mp_codec_by_id((unsigned)ctx->codec_cfg);
	/* Small buffers are latency-bound: compressing them saves nothing. */
	if (bytes < AUTO_FP16_BYTES)
		return mp_codec_by_id(MP_CODEC_NONE);
	if (bytes < AUTO_8BIT_BYTES)
		return mp_codec_by_id(MP_CODEC_FP16);
	return mp_codec_by_id(MP_CODEC_BLOCKWISE8);
}

/* The residue of (@buf, @count); created zeroed if @create: in host
 * memory, or with @ds (CUDA memory on the device path) on its GPU at the
 * first average (run_average). Under ctx->core->mu. */
static struct mp_fb *fb_find(struct mp_ctx *ctx, const float *buf, size_t count, int create,
			     struct mp_stage *ds)
{
	struct mp_fb *f;

	for (f = ctx->core->fbs; f; f = f->next)
		if (f->buf == buf && f->n == count)
			return f;
	if (!create)
		return NULL;
	f = calloc(1, sizeof(*f));
	if (!f)
		return NULL;
	/* Error feedback starts at zero: nothing has been held back yet. */
	f->ds = ds;
	f->residue = ds ? NULL : calloc(count, sizeof(float));
	if (!ds && !f->residue) {
		free(f);
		return NULL;
	}
	f->buf = buf;
	f->n = count;
	f->next = ctx->core->fbs;
	ctx->core->fbs = f;
	return f;
}

static void fb_free(struct mp_fb *f)
{
	if (f->ds && f->residue)
		f->ds->ops->dev_free(&f->ds->dev, f->residue);
	else if (!f->ds)
		free(f->residue);
	free(f);
}

/* Before @s closes: the residues on its GPU go with it (no average uses
 * the registration, so none uses them). */
static void fb_drop_dev(struct mp_ctx *ctx, const struct mp_stage *s)
{
	if (!s)
		return;
	pthread_mutex_lock(&ctx->core->mu);
	for (struct mp_fb **pp = &ctx->core->fbs; *pp;) {
		struct mp_fb *f = *pp;
		if (f->ds != s) {
			pp = &f->next;
			continue;
		}
		*pp = f->next;
		fb_free(f);
	}
	pthread_mutex_unlock(&ctx->core->mu);
}

/* The device-path registration whose memory holds @buf, if any (under mu). */
static struct mp_stage *dev_stage_of(struct mp_ctx *ctx, const float *buf)
{
	for (struct mp_mr *m = ctx->core->mrs; m; m = m->next)
		if (m->kind == MP_MEM_CUDA && m->stage && m->stage->dp &&
		    (const char *)buf >= (const char *)m->buf &&
		    (const char *)buf < (const char *)m->buf + m->len)
			return m->stage;
	return NULL;
}

/*
 * Queue an average of @buf. @force overrides the configured codec; with
 * @flush the buffer's residue is first folded into it (once nothing can fail
 * any more, so an error changes nothing).
 */
/*
 * Queue an average for the progress thread; or, with @inl (a blocking call)
 * when the progress thread is idle and nothing is queued, mark it to run on
 * the caller's thread (req->inl; run_inline). Staged CUDA memory always
 * goes to the progress thread (run_request says why). With @use_stream
 * (mp_average_start_stream), its copy in waits for the work queued on
 * @stream so far: an event recorded on it here, on the caller's thread,
 * since "so far" is now.
 */
static int start_op(mp_ctx *ctx, float *buf, size_t count, float weight, mp_mr *mr,
		    const struct mp_codec_ops *force, int flush, int inl, int use_stream,
		    void *stream, mp_request **out)
{
	struct mp_request *req;
	int rc;

	if (!ctx || !buf || !count || !out)
		return -EINVAL;
	*out = NULL;
	if (!isfinite(weight) || weight < 0.0f) {
		/* Checked before anything is sent: a peer's weight scales its
		 * whole contribution, and NaN would poison every result. */
		mp_set_error(ctx, "weight %g: must be finite and >= 0", (double)weight);
		return -EINVAL;
	}
	if (count > (size_t)UINT32_MAX * ctx->chunk_elems || count > SIZE_MAX / sizeof(float)) {
		mp_set_error(ctx, "%zu values are more than one operation can carry", count);
		return -EINVAL;
	}
	if (mr && ((const char *)buf < (const char *)mr->buf ||
		   (const char *)(buf + count) > (const char *)mr->buf + mr->len)) {
		mp_set_error(ctx, "the registration does not cover the buffer");
		return -EINVAL;
	}
	if (!ctx->peers_set) {
		mp_set_error(ctx, "peers are not set: call mp_set_peers first");
		return -ENOTCONN;
	}
	if (ctx->left) {
		mp_set_error(ctx, "this peer has left the run");
		return -ESHUTDOWN;
	}
	if (mr && mr->kind != MP_MEM_HOST && !mr->stage) {
		/* The reducer reads host memory, and only CUDA memory has a host copy. */
		mp_set_error(ctx, "averaging dma-buf memory needs a device reducer (not built)");
		return -ENOTSUP;
	}
	if (use_stream && (!mr || !mr->stage)) {
		/* Host memory has no stream to wait for: the caller's values are
		 * there when it calls. */
		mp_set_error(ctx, "a CUDA stream is only for buffers of an MP_MEM_CUDA registration "
			     "(passed in mr)");
		return -EINVAL;
	}
	if (mr && mr->stage && ((const char *)buf - (const char *)mr->buf) % sizeof(float)) {
		/* The host copy is page-aligned where the registration may not be:
		 * the buffer's floats would be misaligned in it. */
		mp_set_error(ctx, "the buffer is not float-aligned within its CUDA registration");
		return -EINVAL;
	}
	req = calloc(1, sizeof(*req));
	if (!req)
		return -ENOMEM;
	req->codec = force ? force : resolve_codec(ctx, count);
	if (!mr) {
		/* A registration of the caller's that covers the buffer serves,
		 * counted as used at once so that it stays (mp_mem_deregister):
		 * registering anew costs a verbs transport a pinning per call. */
		pthread_mutex_lock(&ctx->core->mu);
		mr = find_mr(ctx, buf, count);
		if (mr)
			mr->users++;
		pthread_mutex_unlock(&ctx->core->mu);
		req->found_mr = mr != NULL;
	}
	if (!mr) {
		rc = mem_register(ctx, buf, count * sizeof(float), MP_MEM_HOST, &mr);
		if (rc) {
			free(req);
			return rc;
		}
		req->own_mr = 1;
	}
	req->ctx = ctx;
	req->buf = buf;
	/* Staged whole: the host copy. The device path reads the buffer itself. */
	req->x = mr->stage && !mr->stage->dp ?
		(float *)((char *)mr->stage->host + ((char *)buf - (char *)mr->buf)) : buf;
	req->count = count;
	req->weight = weight;
	req->mr = mr;
	if (use_stream) {
		rc = mp_stage_mark(ctx, mr->stage, stream, &req->in_ev);
		if (rc) {
			free(req);
			return rc;
		}
	}
	pthread_mutex_lock(&ctx->core->mu);
	if (flush) {
		struct mp_fb *f = fb_find(ctx, buf, count, 0, NULL);

		if (f && f->busy) {
			rc = -EBUSY;
			goto undo;
		}
		if (f && mr->stage) {
			/* CUDA memory: not the caller's to touch here; folded when
			 * the operation runs, the residue held busy till then. */
			req->fb = f;
			req->flush_late = 1;
			f->busy++;
		} else if (f) {
			mp_k_axpy(buf, f->residue, 1.0f, count);
			memset(f->residue, 0, count * sizeof(float));
		}
	}
	if (req->codec->flags & MP_CODEC_F_SPARSE) {
		struct mp_stage *ds = mr->stage && mr->stage->dp ? mr->stage : NULL;

		req->fb = fb_find(ctx, buf, count, 1, ds);
		if (!req->fb) {
			rc = -ENOMEM;
			goto undo;
		}
		if (req->fb->ds != ds) {
			mp_set_error(ctx, "the error feedback of this buffer is kept in %s memory, and "
				     "this average would keep it in %s memory: reset it first "
				     "(mp_feedback_reset)", req->fb->ds ? "device" : "host",
				     ds ? "device" : "host");
			req->fb = NULL;
			rc = -EINVAL;
			goto undo;
		}
		req->fb->busy++;
	}
	if (!req->found_mr)
		mr->users++;
	req->live_next = ctx->core->live;
	if (ctx->core->live)
		ctx->core->live->live_prev = req;
	ctx->core->live = req;
	if (inl && !mr->stage && !ctx->core->queue.n && !ctx->core->running &&
	    !ctx->core->inline_busy && !ctx->stop) {
		/* A blocking call with nothing ahead of it runs on the caller's
		 * thread (run_inline): two thread switches fewer per average. */
		ctx->core->inline_busy = 1;
		req->inl = 1;
		req->state = REQ_RUNNING;
	} else {
		req->state = REQ_QUEUED;
		/* Tickets in queue order: the one progress thread ends the
		 * requests of a registration in that order (mp_stage_end). */
		if (mr->stage)
			req->ticket = ++mr->stage->tickets;
		mp_reqq_push(&ctx->core->queue, &req->qlink);
		pthread_cond_signal(&ctx->core->pcv);
	}
	pthread_mutex_unlock(&ctx->core->mu);
	*out = req;
	return 0;
undo:
	if (req->found_mr)
		mr->users--;
	pthread_mutex_unlock(&ctx->core->mu);
	if (rc == -EBUSY)
		mp_set_error(ctx, "flush: an average of this buffer is still in flight");
	if (mr->stage)
		mp_stage_unmark(mr->stage, req->in_ev);
	if (req->own_mr)
		mp_mem_deregister(ctx, mr);
	free(req);
	return rc;
}

int mp_average_start(mp_ctx *ctx, float *buf, size_t count, float weight, mp_mr *mr,
		     mp_request **out)
{
	return start_op(ctx, buf, count, weight, mr, NULL, 0, 0, 0, NULL, out);
}

/* The codec @flags force (NULL: the run's), or -EINVAL in @rc. */
#define MP_AVG_KNOWN (MP_AVG_UNCOMPRESSED | MP_AVG_FLUSH)

static const struct mp_codec_ops *flags_codec(mp_ctx *ctx, unsigned flags, int *rc)
{
	*rc = 0;
	if (ctx && (flags & ~MP_AVG_KNOWN)) {
		/* A bit this library does not know may ask for something the
		 * peers would then disagree on: refused before anything is sent. */
		mp_set_error(ctx, "flags 0x%x: unknown bits 0x%x", flags, flags & ~MP_AVG_KNOWN);
		*rc = -EINVAL;
		return NULL;
	}
	/* Codec none for this call only: every OPEN of the exchange says so,
	 * and a peer that averages with the configured codec refuses it. A
	 * flush too, so that nothing is held back again. */
	return (flags & MP_AVG_KNOWN) ? mp_codec_by_id(MP_CODEC_NONE) : NULL;
}

int mp_average_start_ex(mp_ctx *ctx, float *buf, size_t count, float weight, mp_mr *mr,
			unsigned flags, mp_request **out)
{
	int rc;
	const struct mp_codec_ops *force = flags_codec(ctx, flags, &rc);

	return rc ? rc : start_op(ctx, buf, count, weight, mr, force, !!(flags & MP_AVG_FLUSH), 0, 0,
				  NULL, out);
}

int mp_average_start_stream(mp_ctx *ctx, float *buf, size_t count, float weight, mp_mr *mr,
			    unsigned flags, void *stream, mp_request **out)
{
	int rc;
	const struct mp_codec_ops *force = flags_codec(ctx, flags, &rc);

	return rc ? rc : start_op(ctx, buf, count, weight, mr, force, !!(flags & MP_AVG_FLUSH), 0, 1,
				  stream, out);
}

int mp_request_stream_wait(mp_request *req, void *stream)
{
	if (!req)
		return -EINVAL;
	if (!req->mr->stage) {
		mp_set_error(req->ctx, "only the average of an MP_MEM_CUDA registration can be waited "
			     "for on a CUDA stream");
		return -EINVAL;
	}
	/* The ticket was set before the caller had the request; the word may
	 * be past it already, and then the stream does not wait. */
	return mp_stage_stream_wait(req->ctx, req->mr->stage, stream, req->ticket);
}

/*
 * A blocking average on the caller's thread, which owns the transport
 * meanwhile (inline_busy keeps the progress thread off it). With eight
 * peers on two cores, handing each average to the progress thread and the
 * result back costs two wake-ups of threads that wait for a core, each as
 * long as a short exchange (doc/performance.md).
 */
static void run_inline(struct mp_ctx *ctx, struct mp_request *req)
{
	int rc = run_request(ctx, req);

	mp_peers_publish(ctx);
	flush_sends(ctx);
	pthread_mutex_lock(&ctx->core->mu);
	ctx->core->inline_busy = 0;
	req->status = rc;
	req->state = REQ_DONE;
	/* Another thread may have queued meanwhile, or waits for this one. */
	if (ctx->core->queue.n)
		pthread_cond_signal(&ctx->core->pcv);
	pthread_cond_broadcast(&ctx->core->cv);
	pthread_mutex_unlock(&ctx->core->mu);
}

/* mp_average and its kin: start, run inline when it may, wait. */
static int average_now(mp_ctx *ctx, float *buf, size_t count, float weight,
		       const struct mp_codec_ops *force, int flush, struct mp_result *res)
{
	mp_request *req;
	int rc = start_op(ctx, buf, count, weight, NULL, force, flush, 1, 0, NULL, &req);

	if (rc)
		return rc;
	if (req->inl)
		run_inline(ctx, req);
	return mp_wait(req, -1, res);
}

/* Called with ctx->core->mu held and req done: copy out and release. */
static int finish_request(struct mp_request *req, struct mp_result *res)
{
	struct mp_ctx *ctx = req->ctx;
	int status = req->status;

	if (res)
		*res = req->res;
	req->mr->users--;
	if (req->fb)
		req->fb->busy--;
	if (req->live_prev)
		req->live_prev->live_next = req->live_next;
	else
		ctx->core->live = req->live_next;
	if (req->live_next)
		req->live_next->live_prev = req->live_prev;
	pthread_mutex_unlock(&ctx->core->mu);
	if (req->own_mr)
		mp_mem_deregister(ctx, req->mr);
	free(req);
	return status;
}

int mp_test(mp_request *req, int *done, struct mp_result *res)
{
	struct mp_ctx *ctx;

	if (!req || !done)
		return -EINVAL;
	ctx = req->ctx;
	pthread_mutex_lock(&ctx->core->mu);
	if (req->state != REQ_DONE) {
		pthread_mutex_unlock(&ctx->core->mu);
		*done = 0;
		return 0;
	}
	*done = 1;
	return finish_request(req, res);
}

int mp_wait(mp_request *req, int timeout_ms, struct mp_result *res)
{
	struct mp_ctx *ctx;
	struct timespec dl;

	if (!req)
		return -EINVAL;
	ctx = req->ctx;
	clock_gettime(CLOCK_REALTIME, &dl);
	if (timeout_ms >= 0) {
		dl.tv_sec += timeout_ms / 1000;
		dl.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
		if (dl.tv_nsec >= 1000000000L) {
			dl.tv_sec++;
			dl.tv_nsec -= 1000000000L;
		}
	}
	pthread_mutex_lock(&ctx->core->mu);
	while (req->state != REQ_DONE) {
		if (timeout_ms < 0 && req->state == REQ_QUEUED && !req->mr->stage &&
		    ctx->core->queue.head == &req->qlink && !ctx->core->running &&
		    !ctx->core->inline_busy && !ctx->stop) {
			/* Not started yet and next in line: a wait without a
			 * timeout runs it itself, as a blocking call would. */
			mp_reqq_pop(&ctx->core->queue);
			ctx->core->inline_busy = 1;
			req->inl = 1;
			req->state = REQ_RUNNING;
			pthread_mutex_unlock(&ctx->core->mu);
			run_inline(ctx, req);
			pthread_mutex_lock(&ctx->core->mu);
			continue;
		}
		if (timeout_ms < 0) {
			pthread_cond_wait(&ctx->core->cv, &ctx->core->mu);
		} else if (pthread_cond_timedwait(&ctx->core->cv, &ctx->core->mu, &dl) == ETIMEDOUT &&
			   req->state != REQ_DONE) {
			pthread_mutex_unlock(&ctx->core->mu);
			return -ETIMEDOUT;
		}
	}
	return finish_request(req, res);
}

int mp_average(mp_ctx *ctx, float *buf, size_t count, float weight, struct mp_result *res)
{
	return average_now(ctx, buf, count, weight, NULL, 0, res);
}

int mp_average_ex(mp_ctx *ctx, float *buf, size_t count, float weight, unsigned flags,
		  struct mp_result *res)
{
	int rc;
	const struct mp_codec_ops *force = flags_codec(ctx, flags, &rc);

	return rc ? rc : average_now(ctx, buf, count, weight, force, !!(flags & MP_AVG_FLUSH), res);
}

int mp_average_flush(mp_ctx *ctx, float *buf, size_t count, float weight, struct mp_result *res)
{
	/* Uncompressed, so that nothing is held back again. */
	return average_now(ctx, buf, count, weight, mp_codec_by_id(MP_CODEC_NONE), 1, res);
}

/*
 * A copy between a device residue and the caller's host array (@to_device:
 * into the residue), on a stream of its own (the registration's belongs to
 * the progress thread, which may be averaging another buffer of it),
 * waited for within round_timeout_ms. The caller holds the residue busy,
 * so no average of the buffer starts meanwhile. 0, or -EIO with the error
 * set (past the timeout the copy may still run: the array is not to be
 * trusted then).
 */
static int fb_dev_copy(struct mp_ctx *ctx, struct mp_fb *f, float *host, int to_device,
		       const char *what)
{
	struct mp_stage *s = f->ds;
	const struct mp_stage_dev_ops *o = s->ops;
	void *st = NULL, *ev = NULL;
	char why[256] = "";
	int rc = o->stream_create(&s->dev, &st);

	if (!rc)
		rc = o->event_create(&s->dev, &ev);
	if (!rc)
		rc = to_device ? o->copy_async(&s->dev, f->residue, host, f->n * sizeof(float), 1, st) :
				 o->copy_async(&s->dev, host, f->residue, f->n * sizeof(float), 0, st);
	if (!rc)
		rc = o->event_record(&s->dev, ev, st, why, sizeof(why));
	if (!rc)
		rc = mp_stage_poll(ctx, s, ev, 0);
	if (ev)
		o->event_destroy(&s->dev, ev);
	if (st)
		o->stream_destroy(&s->dev, st);
	if (rc)
		mp_set_error(ctx, "%s: %s memory %p: the copy of its residue failed on the device "
			     "(%s%s%s)", what, o->name, (const void *)f->buf, mp_strerror(rc),
			     why[0] ? ": " : "", why);
	return rc ? -EIO : 0;
}

int mp_feedback_get(mp_ctx *ctx, const float *buf, size_t count, float *residue)
{
	struct mp_fb *f;
	int rc = 0;

	if (!ctx || !buf || !count || !residue)
		return -EINVAL;
	pthread_mutex_lock(&ctx->core->mu);
	f = fb_find(ctx, buf, count, 0, NULL);
	if (!f)
		rc = -ENOENT;
	else if (f->busy)
		rc = -EBUSY;
	else if (f->ds && !f->residue)
		memset(residue, 0, count * sizeof(float)); /* no average held anything back yet */
	else if (f->ds)
		f->busy++; /* copied below, outside the lock */
	else
		memcpy(residue, f->residue, count * sizeof(float));
	pthread_mutex_unlock(&ctx->core->mu);
	if (!rc && f->ds && f->residue) {
		rc = fb_dev_copy(ctx, f, residue, 0, "mp_feedback_get");
		pthread_mutex_lock(&ctx->core->mu);
		f->busy--;
		pthread_mutex_unlock(&ctx->core->mu);
	}
	return rc;
}

int mp_feedback_set(mp_ctx *ctx, const float *buf, size_t count, const float *residue)
{
	struct mp_fb *f;
	struct mp_stage *ds;
	int rc = 0;

	if (!ctx || !buf || !count || !residue)
		return -EINVAL;
	for (size_t i = 0; i < count; i++)
		if (!isfinite(residue[i]))
			return -EINVAL;
	pthread_mutex_lock(&ctx->core->mu);
	/* CUDA memory on the device path keeps its residue on the GPU. */
	ds = dev_stage_of(ctx, buf);
	f = fb_find(ctx, buf, count, 1, ds);
	if (!f)
		rc = -ENOMEM;
	else if (f->busy)
		rc = -EBUSY;
	else if (f->ds != ds)
		rc = -EINVAL;
	else if (f->ds)
		f->busy++; /* copied below, outside the lock */
	else
		memcpy(f->residue, residue, count * sizeof(float));
	if (rc == -EINVAL)
		mp_set_error(ctx, "mp_feedback_set: the residue of this buffer is kept in %s memory, "
			     "and its registration now averages it in %s memory: reset it first "
			     "(mp_feedback_reset)", f->ds ? "device" : "host", ds ? "device" : "host");
	pthread_mutex_unlock(&ctx->core->mu);
	if (rc || !f->ds)
		return rc;
	if (!f->residue)
		rc = fb_dev_alloc(ctx, f, 0); /* its first: allocated here, as an average would */
	if (!rc)
		rc = fb_dev_copy(ctx, f, (float *)residue, 1, "mp_feedback_set");
	pthread_mutex_lock(&ctx->core->mu);
	f->busy--;
	pthread_mutex_unlock(&ctx->core->mu);
	return rc;
}

int mp_feedback_reset(mp_ctx *ctx, const float *buf)
{
	int rc = buf ? -ENOENT : 0;

	if (!ctx)
		return -EINVAL;
	pthread_mutex_lock(&ctx->core->mu);
	for (struct mp_fb **pp = &ctx->core->fbs; *pp;) {
		struct mp_fb *f = *pp;
		if (buf && f->buf != buf) {
			pp = &f->next;
			continue;
		}
		if (f->busy) {
			rc = -EBUSY;
			pp = &f->next;
			continue;
		}
		*pp = f->next;
		fb_free(f);
		if (buf)
			rc = 0;
	}
	pthread_mutex_unlock(&ctx->core->mu);
	return rc;
}

int mp_finalize(mp_ctx *ctx)
{
	if (!ctx)
		return 0;
	if (ctx->core->thread_started) {
		pthread_mutex_lock(&ctx->core->mu);
		__atomic_store_n(&ctx->stop, 1, __ATOMIC_RELEASE);
		pthread_cond_broadcast(&ctx->core->cv);
		pthread_cond_broadcast(&ctx->core->pcv);
		pthread_mutex_unlock(&ctx->core->mu);
		if (ctx->ops && ctx->drv)
			ctx->ops->wake(ctx->drv);
		pthread_join(ctx->core->thread, NULL);
	}
	/* Requests the caller never completed are cancelled and released here;
	 * their handles are invalid from now on. */
	while (ctx->core->live) {
		struct mp_request *req = ctx->core->live;
		ctx->core->live = req->live_next;
		if (req->mr->stage)
			mp_stage_unmark(req->mr->stage, req->in_ev);
		if (req->own_mr && ctx->ops && ctx->drv)
			ctx->ops->dereg_mr(ctx->drv, req->mr->dmr);
		if (req->own_mr)
			free(req->mr);
		free(req);
	}
	/* Registrations left, also those that the requests released above
	 * held (the caller could not deregister them: -EBUSY). */
	while (ctx->core->mrs) {
		struct mp_mr *mr = ctx->core->mrs;
		ctx->core->mrs = mr->next;
		if (mr->dmr && ctx->ops && ctx->drv)
			ctx->ops->dereg_mr(ctx->drv, mr->dmr);
		fb_drop_dev(ctx, mr->stage);
		mp_stage_close(ctx, mr->stage);
		free(mr);
	}
	if (ctx->drv && ctx->ctrl)
		leave_now(ctx);
	if (ctx->drv) {
		mp_conn_close_all(ctx);
		mp_ctrl_fini(ctx);
		if (ctx->listener)
			ctx->ops->close_listener(ctx->listener);
		if (ctx->slab_mr)
			ctx->ops->dereg_mr(ctx->drv, ctx->slab_mr);
		ctx->ops->fini(ctx->drv);
	}
	free(ctx->slab);
	for (int i = 0; i < MP_SCR_MAX; i++)
		free(ctx->scratch[i]);
	while (ctx->core->fbs) {
		struct mp_fb *f = ctx->core->fbs;
		ctx->core->fbs = f->next;
		fb_free(f);
	}
	mp_state_fini(ctx);
	mp_dht_stop(ctx);
	mp_conn_fini(ctx);
	free(ctx->live);
	mp_peers_free(ctx);
	pthread_cond_destroy(&ctx->core->cv);
	pthread_cond_destroy(&ctx->core->pcv);
	pthread_mutex_destroy(&ctx->core->mu);
	free(ctx->run_name);
	free(ctx->transport);
	free(ctx->listen_addr);
	mp_clog_close(ctx);
	mp_fault_free(ctx);
	free(ctx);
	return 0;
}
