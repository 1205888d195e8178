/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The device path (devpath.c): a CUDA registration whose codec kernels can
 * run (devk.h) is reduced on the GPU by the group all-reduce, and only
 * encoded chunks cross the bus. What the host holds for it is a constant
 * ring of pinned chunk buffers, not a copy of the memory:
 *
 *  - each slot is a pinned host buffer of one encoded chunk, its device
 *    twin (where an encoded chunk lands from the host, or is encoded before
 *    it leaves) and an event recorded after the last work that uses it;
 *  - a message to send is encoded on the GPU into a slot's twin and copied
 *    into its pinned buffer, and goes once the event says so; a message
 *    received is copied into a slot, then to its twin, and decoded there
 *    into the round's device memory; its slot is free once the event says
 *    so. Copies and kernels all go to the registration's one stream, in
 *    order, so the host never waits for the device except for a slot or at
 *    the end of an exchange, and the network transfer of one chunk overlaps
 *    the copies and kernels of the next.
 *
 * GPUDirect RDMA (mp_dev_gdr): where the transport registered the twins as
 * device memory (verbs through dma-buf or nvidia-peermem), nothing of a
 * chunk crosses the bus through the host. A message to send is encoded
 * (or copied on the device) into a slot's twin and leaves from there, its
 * header from the engine's host slab; the slot stays held until the
 * transport has sent it. A message received lands, header and payload, in
 * a twin that the engine posted as the receive (mp_dev_land_try): the GPU
 * is made to see what the NIC wrote (rdma_flush, where it does not order
 * such writes itself), only its 64-byte header is read back to the host
 * (mp_dev_peek; the payload too when its sender checksums payloads), and
 * it is decoded where it lies.
 * Each twin and pinned buffer has MP_WIRE_HDR_SIZE bytes of room before
 * the chunk (sl->dev, sl->host point past it) for the frame's header.
 *
 * The round's device memory (contributions, sums, results) comes from
 * mp_dev_scratch, kept with the registration and grown on demand.
 */
#ifndef MP_DEVPATH_H
#define MP_DEVPATH_H

#include <stddef.h>
#include <stdint.h>

#include "devk.h"
#include "stage.h"

struct mp_ctx;
struct mp_payload;

/* Slots of a registration's ring: a window of sends and receives in flight
 * for a group of a few members, each of one chunk. */
#define MP_DEV_SLOTS 32
/* Pinned status words (decode's MP_DEVK_BAD), two per member at most. */
#define MP_DEV_NSTATUS 256
/* GPUDirect: receives an exchange may have posted into twins at once,
 * all channels together; the rest of the ring is for sends (half) and the
 * status words' slot. */
#define MP_DEV_LAND_MAX (MP_DEV_SLOTS / 2 - 1)

enum { MP_SLOT_FREE, MP_SLOT_HELD, MP_SLOT_PENDING };

struct mp_ring_slot {
	uint8_t *host; /* pinned, slot_bytes (a header's room before it) */
	uint8_t *dev;  /* its device twin, slot_bytes (the same room before it) */
	void *ev;      /* recorded after the last work queued with the slot */
	int state;     /* MP_SLOT_*: PENDING is free once ev has completed */
	int land;      /* HELD as a posted receive (GPUDirect): counted in landing */
};

struct mp_devpath {
	const struct mp_devk_ops *k;
	struct mp_ring_slot slot[MP_DEV_SLOTS];
	size_t slot_bytes;
	void *dring;          /* the twins, one allocation */
	uint32_t *hstatus;    /* MP_DEV_NSTATUS pinned words: status reads land here */
	void *dscr;           /* the round's device memory */
	size_t dscr_len;
	void *dundo;          /* run_moshpit's copy of the buffer, for an undo */
	size_t dundo_len;
	void *sync_ev;        /* for mp_dev_sync */
	int held;             /* slots HELD now for sends (made ready, or in flight) */
	/* GPUDirect RDMA: the transport registered the twins (mp_dev_gdr) */
	int flush;            /* rdma_flush before what landed is read (rdma_order) */
	struct mp_drv_mr *dring_mr;
	void *hstream, *hev;  /* header reads, beside the stream's kernels */
	int landing;          /* slots HELD as posted receives */
	struct mp_ring_slot *landed; /* the receive being delivered (mp_dev_arrived) */
	char nogdr[128];      /* why not GPUDirect, for the INFO line */
};

/*
 * Try to set up the device path for @s (queried, no host copy yet), for
 * the codec the context is configured with (MP_CODEC_AUTO: every codec it
 * may pick): the kernels' table must be usable there. Allocates the ring
 * (pinned slots with the status words and the stage's word after them,
 * their device twins, events) and registers the pinned part with the
 * transport (s->dmr); where the transport moves device memory and our
 * payloads carry no checksum, the twins too (GPUDirect, mp_dev_gdr), which
 * mp_dev_describe says (or why not). Returns 0; -ENOTSUP with the reason
 * in @why when the path is not for this registration (the caller stages
 * it whole instead); or another negative errno with the context's error
 * set.
 */
int mp_dev_open(struct mp_ctx *ctx, struct mp_stage *s, char *why, size_t n);
/* @s when its chunks move by GPUDirect RDMA (the transport registered its
 * twins), else NULL (also for a NULL @s: host memory). */
static inline struct mp_stage *mp_dev_gdr(struct mp_stage *s)
{
	return s && s->dp && s->dp->dring_mr ? s : NULL;
}
/* The INFO line's words on how chunks reach the GPU, for @s. */
void mp_dev_describe(const struct mp_ctx *ctx, const struct mp_stage *s, char *text, size_t n);
/* Undo mp_dev_open, once nothing is queued (the caller has synced). */
void mp_dev_close(struct mp_ctx *ctx, struct mp_stage *s);

/* A free slot, now HELD, or NULL when every slot is busy. Slots whose
 * event has completed become free on the way. */
struct mp_ring_slot *mp_dev_slot_try(struct mp_stage *s);
/* As mp_dev_slot_try, waiting for a busy slot if need be (polling, within
 * the round timeout): NULL with the context's error set on a device
 * failure or timeout. */
struct mp_ring_slot *mp_dev_slot_wait(struct mp_ctx *ctx, struct mp_stage *s);
/* The work of HELD slot @sl is queued: record its event; it stays HELD
 * (@keep: a send, whose bytes the caller takes once it is ready) or
 * becomes PENDING (a receive: free once the work has run). 0 or -EIO. */
int mp_dev_slot_queued(struct mp_stage *s, struct mp_ring_slot *sl, int keep);
/* 1 once the work queued with @sl has run, 0 before, -EIO when it failed. */
int mp_dev_slot_ready(struct mp_stage *s, struct mp_ring_slot *sl);
/* Give back a HELD slot. */
void mp_dev_slot_put(struct mp_stage *s, struct mp_ring_slot *sl);

/*
 * Queue @len bytes of device memory @src into slot @sl as a payload to
 * send: into its pinned bytes, or with GPUDirect into its twin (nothing
 * when @src is the twin). 0 or an errno.
 */
int mp_dev_stage_out(struct mp_stage *s, struct mp_ring_slot *sl, const void *src, size_t len);
/*
 * Slot @sl's message of @len bytes is ready (its event completed): the
 * payload for the engine. Pinned: its host bytes, which the engine copies
 * at once, and the slot is free again. GPUDirect: its twin, sent from
 * there; the engine gives the slot back once the send is done.
 */
void mp_dev_payload(struct mp_stage *s, struct mp_ring_slot *sl, size_t len,
		    struct mp_payload *pl);
/*
 * A payload of @len bytes that the engine handed the algorithm: where it
 * is on the device. GPUDirect: the twin it landed in (@payload is
 * sl->dev). Otherwise it is host memory, copied into a free slot's pinned
 * bytes and across the bus (queued). *@out is the slot (HELD: the caller
 * queues its decode, then mp_dev_slot_queued(.., 0)), or NULL with the
 * context's error set when none came free; returns 0 or the copy's errno
 * (the slot still to be queued).
 */
int mp_dev_arrived(struct mp_ctx *ctx, struct mp_stage *s, const void *payload, size_t len,
		   struct mp_ring_slot **out);
/* GPUDirect, for the engine: a free slot to post a receive into (its twin
 * from the header's room on, MP_WIRE_HDR_SIZE + slot_bytes), HELD as
 * landing; NULL when none is free or MP_DEV_LAND_MAX are posted. */
struct mp_ring_slot *mp_dev_land_try(struct mp_stage *s);
/*
 * GPUDirect, for the engine: a frame of @len bytes landed in @sl's twin.
 * Read its header into the room before sl->host, and the payload after
 * it too when the header's flags ask for a checksum over it, on a stream
 * of its own (the kernels queued before do not hold it up). 1: the whole
 * frame is on the host; 0: the header only; -EIO (with the context's
 * error) when the copy failed or did not get there.
 */
int mp_dev_peek(struct mp_ctx *ctx, struct mp_stage *s, struct mp_ring_slot *sl, size_t len);

/* @bytes of device memory for the round (64-byte aligned), kept between
 * rounds; NULL with the context's error set. Only once nothing queued uses
 * the old one (the caller has synced). */
void *mp_dev_scratch(struct mp_ctx *ctx, struct mp_stage *s, size_t bytes);
/* Device memory for run_moshpit's undo copy, as mp_dev_scratch. */
void *mp_dev_undo_mem(struct mp_ctx *ctx, struct mp_stage *s, size_t bytes);

/* Wait until everything queued on the registration's stream so far has run
 * (polling, within the round timeout). 0; -EIO with the context's error set
 * (naming @what) when the device failed or did not get there. */
int mp_dev_sync(struct mp_ctx *ctx, struct mp_stage *s, const char *what);
/* Queue a copy of @bytes (kind: 0 device to host, 1 host to device, 2
 * device to device) and wait for it, as mp_dev_sync. */
int mp_dev_copy_sync(struct mp_ctx *ctx, struct mp_stage *s, void *dst, const void *src,
		     size_t bytes, int kind, const char *what);

/*
 * Queue x[0..n) = w·x (device memory), rounded as mp_k_scale: through
 * @tmp (@tmp_elems floats of device memory) a piece at a time, each product
 * added to -0.0, which gives it exactly; @st: a status word the decodes of
 * fp32 leave 0. 0, or the failed call's errno.
 */
int mp_dev_scale(struct mp_stage *s, float *x, uint64_t n, float w, float *tmp, size_t tmp_elems,
		 uint32_t *st);

/*
 * Queue @count values of device memory @src into the host bytes of slot
 * @sl as a payload of @codec: as they are (none), else encoded on the GPU
 * into the slot's twin (a sparse codec with @residue, waiting for the
 * length) and copied over. *@len is the payload's length. 0 or an errno.
 */
int mp_dev_chunk_out(struct mp_stage *s, int codec, const struct mp_codec_params *p,
		     const float *src, float *residue, uint32_t count, struct mp_ring_slot *sl,
		     size_t *len, void *scratch, size_t scratch_bytes);

/* Queue y[0..n) += w·x (device memory), the product rounded before the
 * add as mp_k_axpy; @st: a status word the decodes of fp32 leave 0. */
int mp_dev_axpy(struct mp_stage *s, float *y, const float *x, uint64_t n, float w, uint32_t *st);
/* The round's device memory (mp_dev_scratch) cut into @n areas of @sz[i]
 * bytes, each 256-byte aligned, at *@at[i] (NULL for an empty one): 0, or
 * -ENOMEM with the context's error set. */
int mp_dev_carve(struct mp_ctx *ctx, struct mp_stage *s, const size_t *sz, void **const *at,
		 int n);

struct mp_group;
struct mp_avg;
/* mp_direct_allreduce (xfer.h) of @a, whose buffer is device memory
 * (a->dev): through one ring slot's pinned bytes, copied out and back. */
int mp_dev_direct(struct mp_ctx *ctx, const struct mp_group *g, uint32_t round, struct mp_avg *a,
		  int strict);

#endif
