/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The state download API (moshpit.h, "State download") on the service and
 * client of src/ctrl/state_xfer.c. Nothing here touches the progress
 * thread: the service has threads of its own, and a fetch runs on the
 * caller's thread.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <moshpit/sdk/clock.h>

#include "core.h"
#include "ctx.h"
#include "inet.h"
#include "log.h"
#include "state_xfer.h"

void mp_state_fini(struct mp_ctx *ctx)
{
	mp_state_srv_stop(ctx->core->state_srv);
	ctx->core->state_srv = NULL;
	mp_state_snap_put(ctx->core->state_snap);
	ctx->core->state_snap = NULL;
}

/* The host of this peer's address when it is an IP address, with port 0. */
static void default_listen(const struct mp_ctx *ctx, char *out, size_t cap)
{
	struct sockaddr_storage ss;
	socklen_t sl;
	char host[MP_ADDR_STRLEN - 8]; /* room for ":0" in @out */
	const char *colon = strrchr(ctx->local_addr, ':');
	size_t hl = colon ? (size_t)(colon - ctx->local_addr) : 0;

	snprintf(out, cap, "127.0.0.1:0");
	if (!colon || hl >= sizeof(host))
		return;
	memcpy(host, ctx->local_addr, hl);
	host[hl] = 0;
	if (mp_inet_resolve(ctx->local_addr, 0, &ss, &sl) || !strcmp(host, "0.0.0.0") ||
	    !strcmp(host, "[::]"))
		return;
	snprintf(out, cap, "%s:0", host);
}

int mp_state_serve(mp_ctx *ctx, const char *listen)
{
	char def[MP_ADDR_STRLEN];
	int rc;

	if (!ctx)
		return -EINVAL;
	if (ctx->core->state_srv) {
		mp_set_error(ctx, "state: already serving on %s",
			     mp_state_srv_addr(ctx->core->state_srv));
		return -EBUSY;
	}
	if (!listen) {
		default_listen(ctx, def, sizeof(def));
		listen = def;
	}
	rc = mp_state_srv_start(&ctx->auth, ctx->run_id, listen, ctx->cfg.round_timeout_ms,
				ctx->cfg.state_rate, &ctx->core->state_srv);
	if (rc) {
		mp_set_error(ctx, "state: cannot listen on %s: %s", listen, strerror(-rc));
		return rc;
	}
	if (ctx->core->state_snap)
		mp_state_srv_set(ctx->core->state_srv, ctx->core->state_snap);
	MP_INFO("state: serving on %s", mp_state_srv_addr(ctx->core->state_srv));
	return 0;
}

int mp_state_address(mp_ctx *ctx, char *buf, size_t len)
{
	if (!ctx || !buf)
		return -EINVAL;
	if (!ctx->core->state_srv)
		return -ENOTCONN;
	if (strlen(mp_state_srv_addr(ctx->core->state_srv)) >= len)
		return -ENOSPC;
	strcpy(buf, mp_state_srv_addr(ctx->core->state_srv));
	return 0;
}

int mp_state_publish(mp_ctx *ctx, uint64_t version, const void *const *bufs,
		     const size_t *lens, int n, const void *meta, size_t meta_len)
{
	struct mp_state_snap *s;
	int rc;

	if (!ctx)
		return -EINVAL;
	rc = mp_state_snap_new(version, bufs, lens, n, meta, meta_len, &s);
	if (rc) {
		mp_set_error(ctx, rc == -EINVAL ? "state: publish: bad arguments (%d buffers, at "
				  "most 65536; %zu bytes of metadata, at most 1 MiB; NULL with a "
				  "length)" : "state: publish: no memory for %d buffers and %zu "
				  "bytes of metadata", n, meta_len);
		return rc;
	}
	if (ctx->core->state_srv)
		mp_state_srv_set(ctx->core->state_srv, s);
	mp_state_snap_put(ctx->core->state_snap);
	ctx->core->state_snap = s;
	return 0;
}

static void fill_info(struct mp_state_info *info, const struct mp_state_head *h,
		      const struct mp_state_outcome *o)
{
	if (!info)
		return;
	memset(info, 0, sizeof(*info));
	info->version = h->version;
	info->bytes = h->total;
	info->nbufs = (int)h->nbufs;
	info->meta_len = h->meta_len;
	info->source = o->src;
	info->tries = o->tries;
	info->resumed = o->resumed;
}

static int run(mp_ctx *ctx, const char *what, const char *const *addrs, int naddrs,
	       const struct mp_state_dest *d, struct mp_state_head *h,
	       struct mp_state_outcome *o, int timeout_ms)
{
	int rc;

	if (!ctx || !addrs || naddrs < 1 || timeout_ms < 1) {
		if (ctx)
			mp_set_error(ctx, "state: %s: no server addresses, or no time", what);
		return -EINVAL;
	}
	for (int i = 0; i < naddrs; i++)
		if (!addrs[i]) {
			mp_set_error(ctx, "state: %s: address %d is NULL", what, i);
			return -EINVAL;
		}
	rc = mp_state_fetch_any(&ctx->auth, ctx->run_id, addrs, naddrs, d,
				ctx->cfg.connect_timeout_ms, ctx->cfg.round_timeout_ms,
				mp_now_ms() + (uint64_t)timeout_ms, h, o);
	if (rc)
		mp_set_error(ctx, "state: %s: %s (%s)", what, strerror(-rc), o->why);
	return rc;
}

int mp_state_query(mp_ctx *ctx, const char *const *addrs, int naddrs,
		   struct mp_state_info *info, size_t *lens, int max_lens, void *meta,
		   size_t meta_cap, int timeout_ms)
{
	struct mp_state_head h;
	struct mp_state_outcome o;
	int rc;

	if (max_lens < 0 || (max_lens && !lens) || (meta_cap && !meta)) {
		if (ctx)
			mp_set_error(ctx, "state: query: NULL room with a capacity");
		return -EINVAL;
	}
	rc = run(ctx, "query", addrs, naddrs, NULL, &h, &o, timeout_ms);
	if (rc)
		return rc;
	fill_info(info, &h, &o);
	for (int i = 0; i < max_lens && i < (int)h.nbufs; i++)
		lens[i] = (size_t)h.lens[i];
	if (meta_cap)
		memcpy(meta, h.meta, h.meta_len < meta_cap ? h.meta_len : meta_cap);
	mp_state_head_free(&h);
	return 0;
}

int mp_state_fetch(mp_ctx *ctx, const char *const *addrs, int naddrs, void *const *bufs,
		   const size_t *lens, int n, void *meta, size_t meta_cap,
		   struct mp_state_info *info, int timeout_ms)
{
	struct mp_state_dest d = {bufs, lens, n};
	struct mp_state_head h;
	struct mp_state_outcome o;
	int rc;

	if (n < 0 || n > MP_STATE_MAX_BUFS || (n && (!bufs || !lens)) || (meta_cap && !meta)) {
		if (ctx)
			mp_set_error(ctx, "state: fetch: bad buffers (%d; NULL with a length?)", n);
		return -EINVAL;
	}
	for (int i = 0; i < n; i++)
		if (lens[i] && !bufs[i]) {
			mp_set_error(ctx, "state: fetch: buffer %d is NULL", i);
			return -EINVAL;
		}
	rc = run(ctx, "fetch", addrs, naddrs, &d, &h, &o, timeout_ms);
	if (rc)
		return rc;
	fill_info(info, &h, &o);
	if (meta_cap)
		memcpy(meta, h.meta, h.meta_len < meta_cap ? h.meta_len : meta_cap);
	MP_INFO("state: fetched version %llu, %llu bytes, from %s (%d tried, %llu bytes resumed)",
		(unsigned long long)h.version, (unsigned long long)h.total, addrs[o.src], o.tries,
		(unsigned long long)o.resumed);
	mp_state_head_free(&h);
	return 0;
}
