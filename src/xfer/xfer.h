/* SPDX-License-Identifier: BSD-3-Clause */
/* The transfer engine and the algorithms that run on it (src/xfer). */
#ifndef MP_XFER_H
#define MP_XFER_H

#include "ctx.h"

/* ---- transfer engine (engine.c) ---------------------------------------- */

struct mp_chan;

/*
 * The payload of a message an algorithm produces. The engine alone turns it
 * into frame bytes (engine.c, put_payload), in one of two ways:
 *  - MP_PAYLOAD_VALUES: h->count fp32 values, which the engine encodes with
 *    the exchange's codec (a sparse codec with the peer's error feedback),
 *    or sends from the user's buffer as they are (codec none: zero copy).
 *  - MP_PAYLOAD_ENCODED: @len bytes the algorithm encoded already with the
 *    exchange's codec, copied as they are. A reducer's result goes to every
 *    member alike, so it is encoded once (and decoded back into the
 *    reducer's own values) rather than once per member. Not with codec
 *    none, whose send slots hold only the header.
 *  - MP_PAYLOAD_DEVICE: @len bytes, encoded already, in a ring slot's
 *    device twin (GPUDirect RDMA, devpath.h: mp_dev_payload), sent from
 *    there under the twins' registration; the engine gives @slot back to
 *    the device path once the send is done or cancelled.
 */
enum mp_payload_kind {
	MP_PAYLOAD_VALUES,
	MP_PAYLOAD_ENCODED,
	MP_PAYLOAD_NONE,       /* a header alone (RATE): count and length 0 */
	MP_PAYLOAD_DEVICE,
};
struct mp_ring_slot;
struct mp_payload {
	enum mp_payload_kind kind;
	const float *values;   /* VALUES */
	const uint8_t *bytes;  /* ENCODED; DEVICE: device memory */
	size_t len;            /* ENCODED, DEVICE: bytes */
	struct mp_ring_slot *slot;  /* DEVICE */
};

/* What an algorithm plugs into the engine for one exchange. */
struct mp_xfer_ops {
	/* Next message to send on @ch, if one is ready: fill @h (type, part,
	 * offset, count, weight, aux) and @p; return 1, else 0. The engine
	 * sets the rest of the header, the length included. */
	int (*produce)(void *op, struct mp_chan *ch, struct mp_wire_hdr *h, struct mp_payload *p);
	/* A validated frame arrived on @ch: check it is the expected one and apply
	 * it. Return 0, or -EPROTO for an unexpected frame (counted, peer dropped).
	 * With x->gdr set, @payload may be device memory: a ring slot's twin
	 * where the frame landed (mp_dev_arrived tells). */
	int (*consume)(void *op, struct mp_chan *ch, const struct mp_wire_hdr *h, const void *payload);
	/* Messages still expected on @ch (including those posted). */
	uint64_t (*recv_left)(void *op, struct mp_chan *ch);
	/* Messages still to send on @ch (including those in flight). */
	uint64_t (*send_left)(void *op, struct mp_chan *ch);
	/* A peer failed (error, bad frame or silence): stop expecting from it. */
	void (*peer_failed)(void *op, int peer);
	/* Optional: nonzero to drop @ch's peer now (fault injection: a cut connection). */
	int (*drop)(void *op, struct mp_chan *ch);
	/* Optional: every channel has had its OPEN, or failed: the lengths
	 * agree, and what waited on that may go on (the reducer's sum). */
	void (*opened)(void *op);
	/* Optional: nonzero when all that is still expected on @ch waits on
	 * other peers first (a result needs every contribution): silence there
	 * is not the peer's fault, and only the exchange's deadline applies. */
	int (*waits_on_others)(void *op, struct mp_chan *ch);
	/* Optional: once per pass of the engine, move work the algorithm runs
	 * beside the network (the device path's copies and kernels, devpath.h;
	 * the group all-reduce's sum of its part, a chunk a pass) and return
	 * nonzero while some is outstanding: the engine then polls
	 * the transport instead of sleeping in it, since nothing there will
	 * wake it when the device is done. */
	int (*pump)(void *op);
	/* Optional: nonzero when produce would give a frame on @ch now. With
	 * it, a channel's OPEN waits for its first frame while one is still
	 * to come, and both leave together: one system call, and one wake-up
	 * of the receiver instead of two (the pairwise exchange, whose later
	 * steps send long after the start). */
	int (*ready)(void *op, struct mp_chan *ch);
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
	/* measurement (mp_peer_measure): frame bytes completed, and the time
	 * from the channel's first post to its last completion */
	uint64_t m_sent, m_recv, m_first, m_last;
	int open_sent, open_got;         /* our OPEN produced; the peer's OPEN checked */
	int mismatch;                    /* its OPEN carried another plan: its frames are left
	                                    out, and it is dropped once our OPEN is out */
};

/*
 * This member's own throughput figure (ctx->self_Bps, sent in RATE frames
 * for MP_BALANCE=measured): the frame bytes it sent over its send-busy
 * time, the union over all its channels of the intervals while at least
 * one send was posted and not yet completed.
 *
 * Why not bytes over the whole exchange: in a butterfly every transfer
 * stays active until the slowest member is done, so every member's time is
 * about the same and a member with a larger part (more bytes) measured a
 * larger figure, which earned it a larger part next time (positive
 * feedback; doc/performance.md). A send in flight is a time the member's
 * link (or its peer's receiving side, pushing back) was moving its data;
 * the time it waits for others' contributions has no send in flight and
 * does not count, so on equal links the figure is the link's rate whatever
 * the part, and on a slower link it is lower. The union (one interval while
 * several channels send at once) makes it the member's link, not the sum of
 * its per-peer shares. Arrivals were tried and dropped: their rate over the
 * union of streaming times is held to the slowest sender's (on shaped links
 * every member measured the slow member's rate), and the sum of per-channel
 * arrival rates grew with the part (on loopback one member ended up with the
 * whole vector).
 *
 * Its limit: a send completes when the transport has taken it, and TCP's
 * socket buffers (MP_TCP_SOCKBUF, 4 MiB by default) take a part of a few
 * MiB at once, so a link only shows once a member's sends exceed them: on
 * shaped 1 Gbit/s links with one member at half, the figures at 4 MiB were
 * memory copies (GB/s, the slow member's no lower); at 32 MiB its figure
 * was about half the others' (doc/performance.md).
 *
 * Cheap: it uses the engine loop's timestamp (one per pass, which exists
 * anyway), so an interval is known to a pass of the loop: it may start
 * before the encoding of its first send, and a send that completes within
 * its post counts until the next pass.
 */
struct mp_busy {
	int n;          /* sends in flight now, all channels together */
	uint64_t since; /* start of the open busy interval (n > 0) */
	uint64_t ns;    /* closed busy intervals, summed */
	uint64_t bytes; /* frame bytes of the sends completed */
};

/* A send was posted at @now. */
static inline void mp_busy_post(struct mp_busy *b, uint64_t now)
{
	if (b->n++ == 0)
		b->since = now;
}

/* @k sends left flight at @now, having carried @bytes (0: failed or
 * cancelled; they still end their busy time). */
static inline void mp_busy_done(struct mp_busy *b, uint64_t now, int k, uint64_t bytes)
{
	b->bytes += bytes;
	if (k <= 0 || b->n <= 0)
		return;
	b->n = k < b->n ? b->n - k : 0;
	if (b->n == 0 && now > b->since)
		b->ns += now - b->since;
}

/* Bytes per second over the busy time so far (closed intervals); 0 when
 * nothing was measured. */
static inline double mp_busy_rate(const struct mp_busy *b)
{
	return b->ns && b->bytes ? (double)b->bytes * 1e9 / (double)b->ns : 0.0;
}

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
	int copy_values;           /* VALUES are copied into the frame even with codec none
	                              (the device path's chunks leave a ring slot at once) */
	int abort_err;             /* set by the algorithm: it failed on its own (the device
	                              path: -EIO); every channel closes, nobody is blamed, and
	                              mp_xfer_run returns it; nothing of the exchange may be
	                              applied */
	int no_rate;               /* a few header-only frames (RATE): their bytes are counted,
	                              but a rate from them would measure latency, not bandwidth */
	uint64_t total;            /* values the whole vector holds: every OPEN carries it */
	uint32_t plan;             /* the algorithm's plan of the exchange (mp_plan_hash; 0 for
	                              those without one): every OPEN carries it, so that both
	                              sides of a pair that plan otherwise see it there */
	int gate;                  /* hold every frame past the OPENs until all are in: for an
	                              algorithm that writes the buffer as frames arrive (ring) */
	struct mp_stage *gdr;      /* GPUDirect RDMA (devpath.h, mp_dev_gdr): the device path's
	                              stage, whose ring slots DEVICE payloads leave from, and
	                              where receives land when they fit its ring
	                              (MP_DEV_LAND_MAX) */
	/* engine-private */
	int unopened;              /* channels neither failed nor past their OPEN (read-only
	                              for algorithms) */
	int land;                  /* receives posted into x->gdr's twins, per channel */
	int fatal;                 /* the exchange was given up (-EBADE, -EMSGSIZE): nothing of
	                              it may be applied */
	int no_give_up;            /* an earlier round of the average wrote the buffer and
	                              nothing can put it back (struct mp_avg): a peer that
	                              disagrees is dropped, never a reason to give up */
	struct mp_busy busy;       /* this member's send-busy time: its own figure (measure) */
};

/* Largest frame this context must be able to receive (engine.c). */
size_t mp_frame_rx_max(const struct mp_ctx *ctx);

/*
 * Peer @peer plans the exchange @what of @round otherwise (plan @theirs,
 * ours @ours: another live set, or other part sizes): its values are never
 * combined with ours, and it is dropped from the exchange. It is alive:
 * in a static run the drop does not mark it down, and every peer is probed
 * once the average ends, so that the views agree again. Logs a WARN. The
 * engine calls it for an OPEN; an algorithm for a later frame that shows
 * another plan, before it refuses the frame.
 */
void mp_xfer_plans_otherwise(struct mp_ctx *ctx, const char *what, uint32_t round, int peer,
			     uint32_t theirs, uint32_t ours);

/*
 * Run an exchange until every channel is done or failed. Returns 0 when the
 * exchange finished (maybe with failed peers), or a negative errno: the
 * context is stopping (-ECANCELED), or the exchange was given up before any
 * frame reached the algorithm, because a peer's settings differ from ours
 * (-EBADE) or it averages another number of values (-EMSGSIZE, x->total
 * against its OPEN); mp_last_error names the peer and both values, and the
 * algorithm must apply nothing. With x->no_give_up such a peer is dropped
 * instead, like one that failed, and the exchange goes on without it.
 *
 * Every channel starts with an OPEN in each direction, which the engine
 * sends and checks itself before any other frame of that channel reaches
 * the algorithm. The algorithm writes the user's buffer only once every
 * channel has had its OPEN (x->unopened is 0, ops->opened is called): the
 * group all-reduce holds its sum until then, and for the ring (x->gate)
 * the engine holds every later frame until then.
 */
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
	struct mp_stage *dev; /* the device path (devpath.h): x is CUDA memory of this
	                         registration, reduced on the GPU; NULL: x is host memory */
	int x_is_copy;      /* x is staged CUDA memory's host copy: the caller's buffer is
	                       written from it only after a success */
	int irreversible;   /* an earlier round of this average wrote x (or the residue)
	                       and no copy can put them back: a disagreement met now
	                       drops the peer (mp_xfer.no_give_up) instead of failing
	                       with -EBADE or -EMSGSIZE (run_moshpit, context.c) */
};

/* Member @m's enum mp_mode in group @g: the roster's word in a matchmade
 * group, MP_MODE_NORMAL in a static one (grid.h, struct mp_group). One
 * lookup for the group all-reduce, which sizes no part for a client, and
 * the RATE exchange, which pairs no two clients: both must see the same
 * clients. */
static inline int mp_group_mode(const struct mp_group *g, int m)
{
	return g->mode ? g->mode[m] : MP_MODE_NORMAL;
}

/* One butterfly all-reduce in group @g (group_allreduce.c). */
int mp_group_allreduce(struct mp_ctx *ctx, const struct mp_group *g, uint32_t round,
		       struct mp_avg *a);
/*
 * MP_BALANCE=measured (rate.c): every member of group @g sends its measured
 * throughput to the others (RATE, header only) and takes theirs, within the
 * round timeout. @bw (g->size entries) is set from the figures: a member's
 * figure, or -1 (unknown: the mean of the known ones) for a member that sent
 * 0 or whose RATE did not come; clients keep 0. @failed[m] is set for the
 * members the exchange dropped. Returns 0, or -ECANCELED / -ENOMEM, or
 * -EBADE when a member's settings differ (unless @no_give_up: see
 * mp_xfer.no_give_up; the member is then dropped).
 */
int mp_rate_exchange(struct mp_ctx *ctx, const struct mp_group *g, uint32_t round,
		     struct mp_result *res, double *bw, uint8_t *failed, int no_give_up);
/*
 * Direct exchange (direct.c): whether the average @a takes it in group @g
 * (MP_DIRECT_MAX and the rules there; every member decides alike), and the
 * exchange itself. @strict (the ring): a peer that fails fails it with
 * -EHOSTUNREACH, the buffer unchanged; else members that failed are left
 * out, as in a group all-reduce, and the contribution log says so.
 */
int mp_direct_fits(const struct mp_ctx *ctx, const struct mp_group *g, const struct mp_avg *a);
int mp_direct_allreduce(struct mp_ctx *ctx, const struct mp_group *g, uint32_t round,
			struct mp_avg *a, int strict);
/*
 * What the direct and the pairwise exchange share (direct.c). The plan of
 * a short vector @a in @g: every member with the whole vector (@ids,
 * @lens and @modes get g->size entries), @salt telling the paths apart;
 * @lens is left as the contribution log's roster (our part the whole
 * vector). mp_short_failed sets the error of a ring that lost @lost peers,
 * or with @lost 0 of a member that nothing reached, and returns
 * -EHOSTUNREACH. mp_short_done: @alive members reached (us included)
 * multiply the influence, capped at the peers, and a round is counted.
 */
uint32_t mp_short_plan(const struct mp_ctx *ctx, const struct mp_group *g, const struct mp_avg *a,
		       uint32_t salt, uint64_t *ids, uint64_t *lens, uint8_t *modes);
int mp_short_failed(struct mp_ctx *ctx, uint32_t round, int lost);
void mp_short_done(const struct mp_ctx *ctx, struct mp_avg *a, uint64_t alive);
/*
 * Pairwise exchange (pairs.c): the direct exchange's path in groups of 4
 * and of 8 to 64 members, where the frame also has room for the set and
 * weights of a sum; mp_direct_allreduce takes it when it fits. Each member's result
 * holds its own set of contributions. In a static run it plans on the
 * group's configured line (mp_group.line) less the members its members
 * agreed to leave out, not on this peer's view.
 */
int mp_pairs_fits(const struct mp_ctx *ctx, const struct mp_group *g, const struct mp_avg *a);
int mp_pairs_allreduce(struct mp_ctx *ctx, const struct mp_group *g, uint32_t round,
		       struct mp_avg *a, int strict);
/*
 * A PAIR frame's payload (@len bytes): its set (*@mask, members within
 * @allowed only), the members its sum has heard are down (*@ss, within
 * @group only), the set's weights into @w (indexed by member, so room up
 * to @allowed's highest bit; finite, not negative) and @count values
 * decoded with @codec into @sum. Returns 0, or -EPROTO with *@mask and
 * *@ss untouched (@w and @sum may be written).
 */
int mp_pair_parse(const void *payload, size_t len, uint64_t allowed, uint64_t group,
		  size_t count, const struct mp_codec_ops *codec, uint64_t *mask, uint64_t *ss,
		  float *w, float *sum);
/* Ring all-reduce over all peers (ring.c). */
int mp_ring_allreduce(struct mp_ctx *ctx, uint32_t round, struct mp_avg *a);

/* Make sure the slab holds @bytes; returns it or NULL (-ENOMEM). */
uint8_t *mp_slab(struct mp_ctx *ctx, size_t bytes);
/* Unregistered scratch memory @which (MP_SCR_*) of at least @bytes, 64-byte
 * aligned, reused between rounds. */
void *mp_scratch(struct mp_ctx *ctx, int which, size_t bytes);

#endif
