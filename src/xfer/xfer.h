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
 */
enum mp_payload_kind {
	MP_PAYLOAD_VALUES,
	MP_PAYLOAD_ENCODED,
	MP_PAYLOAD_NONE,       /* a header alone (RATE): count and length 0 */
};
struct mp_payload {
	enum mp_payload_kind kind;
	const float *values;   /* VALUES */
	const uint8_t *bytes;  /* ENCODED */
	size_t len;            /* ENCODED: bytes */
};

/* What an algorithm plugs into the engine for one exchange. */
struct mp_xfer_ops {
	/* Next message to send on @ch, if one is ready: fill @h (type, part,
	 * offset, count, weight, aux) and @p; return 1, else 0. The engine
	 * sets the rest of the header, the length included. */
	int (*produce)(void *op, struct mp_chan *ch, struct mp_wire_hdr *h, struct mp_payload *p);
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
	/* Optional: every channel has had its OPEN, or failed: the lengths
	 * agree, and what waited on that may go on (the reducer's sum). */
	void (*opened)(void *op);
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
	/* measurement (mp_peer_measure): frame bytes completed, and the time
	 * from the channel's first post to its last completion */
	uint64_t m_sent, m_recv, m_first, m_last;
	int open_sent, open_got;         /* our OPEN produced; the peer's OPEN checked */
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
	int no_rate;               /* a few header-only frames (RATE): their bytes are counted,
	                              but a rate from them would measure latency, not bandwidth */
	uint64_t total;            /* values the whole vector holds: every OPEN carries it */
	int gate;                  /* hold every frame past the OPENs until all are in: for an
	                              algorithm that writes the buffer as frames arrive (ring) */
	/* engine-private */
	int unopened;              /* channels neither failed nor past their OPEN (read-only
	                              for algorithms) */
	int fatal;                 /* the exchange was given up (-EBADE, -EMSGSIZE): nothing of
	                              it may be applied */
	int no_give_up;            /* an earlier round of the average wrote the buffer and
	                              nothing can put it back (struct mp_avg): a peer that
	                              disagrees is dropped, never a reason to give up */
};

/* Largest frame this context must be able to receive (engine.c). */
size_t mp_frame_rx_max(const struct mp_ctx *ctx);

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
/* Ring all-reduce over all peers (ring.c). */
int mp_ring_allreduce(struct mp_ctx *ctx, uint32_t round, struct mp_avg *a);

/* Make sure the slab holds @bytes; returns it or NULL (-ENOMEM). */
uint8_t *mp_slab(struct mp_ctx *ctx, size_t bytes);
/* Unregistered scratch memory @which (MP_SCR_*) of at least @bytes, 64-byte
 * aligned, reused between rounds. */
void *mp_scratch(struct mp_ctx *ctx, int which, size_t bytes);

#endif
