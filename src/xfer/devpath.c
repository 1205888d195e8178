/* SPDX-License-Identifier: BSD-3-Clause */
/* The device path's ring and device memory (devpath.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "devpath.h"
#include "log.h"
#include "wire.h"
#include "xfer.h"

/* A slot's bytes: a frame header's room, then one encoded chunk. */
static size_t stride(size_t slot_bytes)
{
	return MP_WIRE_HDR_SIZE + slot_bytes;
}

/* The codecs an average of this context may use. */
static int codecs_of(const struct mp_ctx *ctx, int *ids)
{
	if (ctx->codec_cfg != MP_CODEC_AUTO) {
		/* And none, for MP_AVG_UNCOMPRESSED. */
		ids[0] = ctx->codec_cfg;
		ids[1] = MP_CODEC_NONE;
		return ctx->codec_cfg == MP_CODEC_NONE ? 1 : 2;
	}
	/* resolve_codec (context.c) picks among these by size. */
	ids[0] = MP_CODEC_NONE;
	ids[1] = MP_CODEC_FP16;
	ids[2] = MP_CODEC_BLOCKWISE8;
	return 3;
}

/* Where the stage's word sits in the pinned allocation: after the slots
 * and the status words, on its own cache line. */
static size_t word_at(size_t slot_bytes)
{
	return MP_DEV_SLOTS * stride(slot_bytes) + MP_DEV_NSTATUS * sizeof(uint32_t);
}

/*
 * GPUDirect RDMA for @s: the transport registers the twins as device
 * memory, and a stream of their own reads the headers of what lands
 * there. Our own payloads must not need the host: a checksum over them
 * (MP_CHECKSUM=payload) is computed there. The GPU must order what the
 * NIC writes, or flush it (rdma_order). dp->dring_mr, or why not in
 * dp->nogdr.
 */
static void gdr_open(struct mp_ctx *ctx, struct mp_stage *s)
{
	struct mp_devpath *dp = s->dp;
	const struct mp_stage_dev_ops *ops = s->ops;
	int rc;

	if (!(ctx->caps.flags & MP_DRV_CAP_DEVICE_MEM)) {
		snprintf(dp->nogdr, sizeof(dp->nogdr), "transport %s cannot move device memory",
			 ctx->transport);
		return;
	}
	if (!(ctx->caps.flags & MP_DRV_CAP_DEVICE_DMA)) {
		/* dpdk's gpudev: receives are copied through a CPU mapping of
		 * the GPU's memory, which the pinned ring's copies beat. */
		snprintf(dp->nogdr, sizeof(dp->nogdr), "transport %s's NIC does not read and write "
			 "device memory itself", ctx->transport);
		return;
	}
	if (ctx->cfg.checksum_payload) {
		snprintf(dp->nogdr, sizeof(dp->nogdr), "MP_CHECKSUM=payload checksums payloads on "
			 "the host");
		return;
	}
	dp->flush = ops->rdma_order ? ops->rdma_order(&s->dev, dp->nogdr, sizeof(dp->nogdr)) :
				      -ENOTSUP;
	if (dp->flush < 0) {
		if (!ops->rdma_order)
			snprintf(dp->nogdr, sizeof(dp->nogdr), "the %s table cannot order a NIC's "
				 "writes", ops->name);
		return;
	}
	rc = ctx->ops->reg_mr(ctx->drv, (uint8_t *)dp->dring, MP_DEV_SLOTS * stride(dp->slot_bytes),
			      MP_MEM_CUDA, &dp->dring_mr);
	if (rc) {
		dp->dring_mr = NULL;
		snprintf(dp->nogdr, sizeof(dp->nogdr), "transport %s cannot register device memory "
			 "(%s)", ctx->transport, mp_strerror(rc));
		return;
	}
	rc = ops->stream_create(&s->dev, &dp->hstream);
	if (!rc)
		rc = ops->event_create(&s->dev, &dp->hev);
	if (rc) {
		snprintf(dp->nogdr, sizeof(dp->nogdr), "no %s stream for the headers (%s)", ops->name,
			 mp_strerror(rc));
		if (dp->hstream)
			ops->stream_destroy(&s->dev, dp->hstream);
		dp->hstream = NULL;
		ctx->ops->dereg_mr(ctx->drv, dp->dring_mr);
		dp->dring_mr = NULL;
	}
}

void mp_dev_describe(const struct mp_ctx *ctx, const struct mp_stage *s, char *text, size_t n)
{
	const struct mp_devpath *dp = s->dp;

	if (dp->dring_mr)
		snprintf(text, n, "chunks move between the NIC and GPU memory (transport %s "
			 "registered its %d chunk buffers of %zu bytes: GPUDirect RDMA)", ctx->transport,
			 MP_DEV_SLOTS, dp->slot_bytes);
	else
		snprintf(text, n, "%d pinned chunk buffers of %zu bytes cross the bus (no GPUDirect "
			 "RDMA: %s)", MP_DEV_SLOTS, dp->slot_bytes, dp->nogdr);
}

int mp_dev_open(struct mp_ctx *ctx, struct mp_stage *s, char *why, size_t n)
{
	const struct mp_devk_ops *k = mp_devk_ops;
	const struct mp_stage_dev_ops *ops = s->ops;
	struct mp_devpath *dp;
	int ids[3], nid = codecs_of(ctx, ids), rc = 0;
	size_t sb = ctx->chunk_elems * sizeof(float);
	void *host = NULL;

	if (!ops->dev_alloc || !ops->copy_d2d || !ops->fill32) {
		snprintf(why, n, "the %s table has no device allocations", ops->name);
		return -ENOTSUP;
	}
	for (int i = 0; i < nid; i++) {
		rc = k->usable(&s->dev, ids[i], why, n);
		if (rc)
			return rc;
		size_t e = k->max_encoded(ids[i], &ctx->cparams, ctx->chunk_elems);
		sb = e > sb ? e : sb;
	}
	sb = (sb + 255) & ~(size_t)255;
	dp = calloc(1, sizeof(*dp));
	if (!dp)
		return -ENOMEM;
	dp->k = k;
	dp->slot_bytes = sb;
	rc = ops->host_alloc(&s->dev, word_at(sb) + 64, &host);
	if (rc) {
		mp_set_error(ctx, "no %zu bytes of pinned host memory for the device path of %s memory "
			     "%p: %s", word_at(sb) + 64, ops->name, s->dev_base, mp_strerror(rc));
		free(dp);
		return rc;
	}
	s->host = host;
	s->word = (uint32_t *)((char *)host + word_at(sb));
	dp->hstatus = (uint32_t *)((char *)host + MP_DEV_SLOTS * stride(sb));
	rc = ops->dev_alloc(&s->dev, MP_DEV_SLOTS * stride(sb), &dp->dring);
	for (int i = 0; !rc && i < MP_DEV_SLOTS; i++) {
		dp->slot[i].host = (uint8_t *)host + (size_t)i * stride(sb) + MP_WIRE_HDR_SIZE;
		dp->slot[i].dev = (uint8_t *)dp->dring + (size_t)i * stride(sb) + MP_WIRE_HDR_SIZE;
		rc = ops->event_create(&s->dev, &dp->slot[i].ev);
	}
	if (!rc)
		rc = ops->event_create(&s->dev, &dp->sync_ev);
	if (rc) {
		mp_set_error(ctx, "no %s device memory or events for the device path of memory %p: %s",
			     ops->name, s->dev_base, mp_strerror(rc));
		goto fail;
	}
	/* The pinned slots take part in no transfer of their own (the engine
	 * copies payloads into its slab), but a direct exchange runs in one. */
	rc = ctx->ops->reg_mr(ctx->drv, host, MP_DEV_SLOTS * stride(sb), MP_MEM_HOST, &s->dmr);
	if (rc) {
		mp_set_error(ctx, "transport %s cannot register the pinned ring of %s memory %p: %s",
			     ctx->transport, ops->name, s->dev_base, mp_strerror(rc));
		s->dmr = NULL;
		goto fail;
	}
	s->dp = dp;
	s->dp_close = mp_dev_close;
	gdr_open(ctx, s);
	return 0;
fail:
	for (int i = 0; i < MP_DEV_SLOTS; i++)
		if (dp->slot[i].ev)
			ops->event_destroy(&s->dev, dp->slot[i].ev);
	if (dp->sync_ev)
		ops->event_destroy(&s->dev, dp->sync_ev);
	if (dp->dring)
		ops->dev_free(&s->dev, dp->dring);
	ops->host_free(&s->dev, host);
	s->host = NULL;
	s->word = NULL;
	free(dp);
	return rc;
}

void mp_dev_close(struct mp_ctx *ctx, struct mp_stage *s)
{
	struct mp_devpath *dp = s->dp;
	const struct mp_stage_dev_ops *ops = s->ops;

	if (!dp)
		return;
	if (dp->dring_mr)
		ctx->ops->dereg_mr(ctx->drv, dp->dring_mr);
	if (dp->hev)
		ops->event_destroy(&s->dev, dp->hev);
	if (dp->hstream)
		ops->stream_destroy(&s->dev, dp->hstream);
	for (int i = 0; i < MP_DEV_SLOTS; i++)
		ops->event_destroy(&s->dev, dp->slot[i].ev);
	ops->event_destroy(&s->dev, dp->sync_ev);
	ops->dev_free(&s->dev, dp->dring);
	if (dp->dscr)
		ops->dev_free(&s->dev, dp->dscr);
	if (dp->dundo)
		ops->dev_free(&s->dev, dp->dundo);
	free(dp);
	s->dp = NULL;
}

/* @sl, HELD, is no longer counted as a send's or a receive's. */
static void unhold(struct mp_devpath *dp, struct mp_ring_slot *sl)
{
	if (sl->state != MP_SLOT_HELD)
		return;
	if (sl->land)
		dp->landing--;
	else
		dp->held--;
	sl->land = 0;
}

struct mp_ring_slot *mp_dev_slot_try(struct mp_stage *s)
{
	struct mp_devpath *dp = s->dp;
	struct mp_ring_slot *pick = NULL;

	for (int i = 0; i < MP_DEV_SLOTS; i++) {
		struct mp_ring_slot *sl = &dp->slot[i];
		/* A failed event frees its slot too: the failure shows in the
		 * exchange's sync, which every device error reaches. */
		if (sl->state == MP_SLOT_PENDING && s->ops->event_query(&s->dev, sl->ev) != -EAGAIN)
			sl->state = MP_SLOT_FREE;
		if (sl->state == MP_SLOT_FREE && !pick)
			pick = sl;
	}
	if (pick) {
		pick->state = MP_SLOT_HELD;
		dp->held++;
	}
	return pick;
}

struct mp_ring_slot *mp_dev_slot_wait(struct mp_ctx *ctx, struct mp_stage *s)
{
	struct mp_ring_slot *sl = mp_dev_slot_try(s);
	int rc;

	if (sl)
		return sl;
	/* Every slot busy: the oldest work is queued first, so waiting for the
	 * stream frees every pending slot at once. */
	rc = mp_dev_sync(ctx, s, "a free chunk buffer");
	return rc ? NULL : mp_dev_slot_try(s);
}

int mp_dev_slot_queued(struct mp_stage *s, struct mp_ring_slot *sl, int keep)
{
	char why[256] = "";
	int rc = s->ops->event_record(&s->dev, sl->ev, s->stream, why, sizeof(why));

	if (rc) {
		MP_WARN("devpath: recording a chunk's event: %s", why);
		return -EIO;
	}
	if (!keep) {
		unhold(s->dp, sl);
		sl->state = MP_SLOT_PENDING;
	}
	return 0;
}

int mp_dev_slot_ready(struct mp_stage *s, struct mp_ring_slot *sl)
{
	int rc = s->ops->event_query(&s->dev, sl->ev);

	return rc == -EAGAIN ? 0 : rc ? -EIO : 1;
}

void mp_dev_slot_put(struct mp_stage *s, struct mp_ring_slot *sl)
{
	unhold(s->dp, sl);
	sl->state = MP_SLOT_FREE;
}

struct mp_ring_slot *mp_dev_land_try(struct mp_stage *s)
{
	struct mp_devpath *dp = s->dp;
	struct mp_ring_slot *sl;

	if (dp->landing >= MP_DEV_LAND_MAX || !(sl = mp_dev_slot_try(s)))
		return NULL;
	dp->held--;
	dp->landing++;
	sl->land = 1;
	return sl;
}

int mp_dev_peek(struct mp_ctx *ctx, struct mp_stage *s, struct mp_ring_slot *sl, size_t len)
{
	struct mp_devpath *dp = s->dp;
	uint8_t *h = sl->host - MP_WIRE_HDR_SIZE;
	const uint8_t *d = sl->dev - MP_WIRE_HDR_SIZE;
	size_t first = len < MP_WIRE_HDR_SIZE ? len : MP_WIRE_HDR_SIZE;
	int whole = len <= MP_WIRE_HDR_SIZE, rc;

	/* What the NIC wrote, visible to the reads and kernels queued next. */
	if (dp->flush && s->ops->rdma_flush(&s->dev)) {
		mp_set_error(ctx, "%s memory %p: flushing what the NIC wrote into it failed (the log "
			     "names the call)", s->ops->name, s->dev_base);
		return -EIO;
	}
	for (int pass = 0; pass < 2; pass++) {
		char why[256] = "";
		size_t off = pass ? first : 0, n = pass ? len - first : first;

		rc = s->ops->copy_async(&s->dev, h + off, d + off, n, 0, dp->hstream);
		if (!rc)
			rc = s->ops->event_record(&s->dev, dp->hev, dp->hstream, why, sizeof(why));
		if (!rc)
			rc = mp_stage_poll(ctx, s, dp->hev, 0);
		if (rc) {
			mp_set_error(ctx, "%s memory %p: reading a received frame's header from the "
				     "device failed (%s; %s)", s->ops->name, s->dev_base, mp_strerror(rc),
				     why[0] ? why : "the log names the call");
			return -EIO;
		}
		/* The sender covered its payload with the checksum: to check it,
		 * the payload comes over too (the flags are checked with it). */
		if (pass || whole || !mp_wire_covers_payload(h))
			break;
		whole = 1;
	}
	return whole;
}

int mp_dev_stage_out(struct mp_stage *s, struct mp_ring_slot *sl, const void *src, size_t len)
{
	if (!s->dp->dring_mr)
		return s->ops->copy_async(&s->dev, sl->host, src, len, 0, s->stream);
	return src == sl->dev || !len ? 0 : s->ops->copy_d2d(&s->dev, sl->dev, src, len, s->stream);
}

void mp_dev_payload(struct mp_stage *s, struct mp_ring_slot *sl, size_t len, struct mp_payload *pl)
{
	if (s->dp->dring_mr) {
		*pl = (struct mp_payload){.kind = MP_PAYLOAD_DEVICE, .bytes = sl->dev, .len = len,
					  .slot = sl};
		return;
	}
	*pl = (struct mp_payload){.kind = MP_PAYLOAD_ENCODED, .bytes = sl->host, .len = len};
	mp_dev_slot_put(s, sl);
}

int mp_dev_arrived(struct mp_ctx *ctx, struct mp_stage *s, const void *payload, size_t len,
		   struct mp_ring_slot **out)
{
	struct mp_devpath *dp = s->dp;
	struct mp_ring_slot *sl = dp->landed;

	if (sl && payload == sl->dev) {
		/* Where the NIC put it: the decode reads it there. */
		dp->landed = NULL;
		*out = sl;
		return 0;
	}
	sl = mp_dev_slot_wait(ctx, s);
	*out = sl;
	if (!sl)
		return -EIO;
	memcpy(sl->host, payload, len);
	return s->ops->copy_async(&s->dev, sl->dev, sl->host, len, 1, s->stream);
}

static void *grow(struct mp_ctx *ctx, struct mp_stage *s, void **mem, size_t *len, size_t bytes,
		  const char *what)
{
	int rc;

	if (*len >= bytes && *mem)
		return *mem;
	if (*mem)
		s->ops->dev_free(&s->dev, *mem);
	*mem = NULL;
	*len = 0;
	rc = s->ops->dev_alloc(&s->dev, bytes ? bytes : 64, mem);
	if (rc) {
		mp_set_error(ctx, "no %zu bytes of %s device memory for %s: %s", bytes, s->ops->name,
			     what, mp_strerror(rc));
		*mem = NULL;
		return NULL;
	}
	*len = bytes;
	return *mem;
}

void *mp_dev_scratch(struct mp_ctx *ctx, struct mp_stage *s, size_t bytes)
{
	return grow(ctx, s, &s->dp->dscr, &s->dp->dscr_len, bytes, "the round's reduction");
}

void *mp_dev_undo_mem(struct mp_ctx *ctx, struct mp_stage *s, size_t bytes)
{
	return grow(ctx, s, &s->dp->dundo, &s->dp->dundo_len, bytes, "the copy of the buffer");
}

int mp_dev_sync(struct mp_ctx *ctx, struct mp_stage *s, const char *what)
{
	char why[256] = "";
	int rc = s->ops->event_record(&s->dev, s->dp->sync_ev, s->stream, why, sizeof(why));

	if (!rc)
		rc = mp_stage_poll(ctx, s, s->dp->sync_ev, 0);
	else
		MP_WARN("devpath: %s", why);
	if (rc) {
		mp_set_error(ctx, "%s memory %p: waiting for %s on the device failed (%s%s)", s->ops->name,
			     s->dev_base, what, mp_strerror(rc),
			     rc == -ETIMEDOUT ? " within round_timeout_ms" : "; the log names the call");
		return -EIO;
	}
	for (int i = 0; i < MP_DEV_SLOTS; i++)
		if (s->dp->slot[i].state == MP_SLOT_PENDING)
			s->dp->slot[i].state = MP_SLOT_FREE;
	return 0;
}

int mp_dev_copy_sync(struct mp_ctx *ctx, struct mp_stage *s, void *dst, const void *src,
		     size_t bytes, int kind, const char *what)
{
	int rc = !bytes ? 0 :
		 kind == 2 ? s->ops->copy_d2d(&s->dev, dst, src, bytes, s->stream) :
			     s->ops->copy_async(&s->dev, dst, src, bytes, kind, s->stream);

	if (rc) {
		mp_set_error(ctx, "%s memory %p: queueing %s failed (%s; the log names the call)",
			     s->ops->name, s->dev_base, what, mp_strerror(rc));
		return -EIO;
	}
	return mp_dev_sync(ctx, s, what);
}

/*
 * A direct exchange (short vectors: at most one chunk) of device memory:
 * every member decides alike whether to take it, whatever its memory, so
 * the device path takes it too, on the host, through a ring slot's pinned
 * bytes: still a chunk, not the buffer.
 */
int mp_dev_direct(struct mp_ctx *ctx, const struct mp_group *g, uint32_t round, struct mp_avg *a,
		  int strict)
{
	struct mp_stage *s = a->dev;
	struct mp_ring_slot *sl = mp_dev_slot_wait(ctx, s);
	size_t bytes = a->n * sizeof(float);
	struct mp_avg h = *a;
	int rc;

	if (!sl)
		return -EIO;
	if (bytes > s->dp->slot_bytes) {
		mp_dev_slot_put(s, sl);
		mp_set_error(ctx, "round %u: a direct exchange of %zu bytes does not fit a chunk buffer "
			     "of %zu", round, bytes, s->dp->slot_bytes);
		return -EMSGSIZE;
	}
	rc = mp_dev_copy_sync(ctx, s, sl->host, a->x, bytes, 0, "a short vector's copy to the host");
	if (!rc) {
		h.x = (float *)sl->host;
		h.dev = NULL;
		h.dmr = s->dmr;
		rc = mp_direct_allreduce(ctx, g, round, &h, strict);
		/* Whatever the exchange wrote, as it would have in host memory. */
		if (rc != -ECANCELED) {
			int wr = mp_dev_copy_sync(ctx, s, a->x, sl->host, bytes, 1,
						  "a short vector's copy back");
			rc = rc ? rc : wr;
		}
		a->weight = h.weight;
		a->influence = h.influence;
	}
	mp_dev_slot_put(s, sl);
	return rc;
}

int mp_dev_scale(struct mp_stage *s, float *x, uint64_t n, float w, float *tmp, size_t tmp_elems,
		 uint32_t *st)
{
	int rc = 0;

	for (uint64_t o = 0; !rc && o < n; o += tmp_elems) {
		size_t m = n - o < tmp_elems ? (size_t)(n - o) : tmp_elems;

		rc = s->ops->copy_d2d(&s->dev, tmp, x + o, m * sizeof(float), s->stream);
		if (!rc)
			rc = s->ops->fill32(&s->dev, x + o, 0x80000000u, m, s->stream);
		if (!rc)
			rc = mp_dev_axpy(s, x + o, tmp, m, w, st);
	}
	return rc;
}

int mp_dev_chunk_out(struct mp_stage *s, int codec, const struct mp_codec_params *p,
		     const float *src, float *residue, uint32_t count, struct mp_ring_slot *sl,
		     size_t *len, void *scratch, size_t scratch_bytes)
{
	int rc;

	if (codec == MP_CODEC_NONE) {
		*len = (size_t)count * sizeof(float);
		return mp_dev_stage_out(s, sl, src, *len);
	}
	rc = s->dp->k->encode(&s->dev, codec, p, src, residue, count, sl->dev, s->dp->slot_bytes, len,
			      scratch, scratch_bytes, s->stream);
	return rc ? rc : mp_dev_stage_out(s, sl, sl->dev, *len);
}

int mp_dev_axpy(struct mp_stage *s, float *y, const float *x, uint64_t n, float w, uint32_t *st)
{
	return s->dp->k->decode(&s->dev, MP_CODEC_NONE, x, n * sizeof(float), y, n, w, 1, st, NULL,
				0, s->stream);
}

int mp_dev_carve(struct mp_ctx *ctx, struct mp_stage *s, const size_t *sz, void **const *at,
		 int n)
{
	size_t total = 0;
	uint8_t *base;

	for (int i = 0; i < n; i++)
		total += (sz[i] + 255) & ~(size_t)255;
	base = mp_dev_scratch(ctx, s, total);
	if (!base)
		return -ENOMEM;
	for (int i = 0; i < n; i++) {
		*at[i] = sz[i] ? base : NULL;
		base += (sz[i] + 255) & ~(size_t)255;
	}
	return 0;
}
