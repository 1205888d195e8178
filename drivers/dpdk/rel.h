/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Reliable, in-order delivery of messages over an unreliable datagram path:
 * the transport-protocol core of the dpdk driver. Nothing here needs DPDK;
 * the port layer (drivers/dpdk/dpdk.c) moves the segments this module
 * produces and consumes, and tests/unit/test_dpdk_rel.c drives it over a
 * simulated link with a virtual clock.
 *
 * SEAM STABILITY: the dpdk port layer codes against this header. After its
 * first version it changes only additively (new functions, new fields at
 * the end of structs, new enum values before the *_MAX sentinels).
 *
 * Model (byte layout in doc/protocol.md, "DPDK segment format"; behaviour
 * in doc/dpdk.md, "Reliable delivery"):
 *  - A message is cut into segments of at most `mss` payload bytes; each
 *    segment has a per-connection sequence number and names its message id,
 *    byte offset and message length. A message of 0 bytes is one segment.
 *  - The receiver acknowledges cumulatively (next expected sequence number)
 *    plus a SACK bitmap of the segments it holds beyond that; the sender
 *    retransmits a segment when its retransmission timer (one timer wheel per
 *    instance) expires, or at once when later-sent segments were delivered
 *    and it was not (SACK holes: fast retransmit).
 *  - Flow control is receiver-driven: a segment is sent only if its sequence
 *    number is below ack + advertised segment window AND its message has a
 *    posted receive on the other side (message credit). So there is no
 *    staging buffer anywhere: every accepted segment is copied once, from the
 *    received datagram straight to its offset in the posted receive buffer.
 *  - Connections: the connecting side sends SYN carrying its connection id;
 *    a listening instance creates a connection on the first SYN (duplicate
 *    SYNs are answered again, never create a second one) and queues it for
 *    mp_rel_accept. mp_rel_close sends FIN; a connection that fails sends RST.
 *  - A peer that stops answering is detected: a segment retransmitted
 *    `max_retries` times without being acknowledged, or `max_retries`
 *    unanswered probes while requests are outstanding, fail the connection:
 *    all its posted requests complete with -ETIMEDOUT (-ECONNRESET after the
 *    peer's FIN or RST). Nothing waits forever.
 *  - Segments that are malformed or foreign (short, bad magic or version,
 *    bad lengths, unknown connection id or wrong route, out of window, an
 *    acknowledgement of data never sent) are dropped, counted by reason in
 *    struct mp_rel_stats, and change nothing else.
 *
 * Threading: an instance and everything it owns is used by one thread at a
 * time (the lcore that polls its queue); no locks inside.
 *
 * Output: `tx` is called only from mp_rel_poll, mp_rel_close and
 * mp_rel_destroy; mp_rel_input, mp_rel_send and mp_rel_recv only queue
 * work, so acknowledgements for a whole receive burst leave as one segment.
 * The usual loop is: rx burst -> mp_rel_input for each UDP payload ->
 * mp_rel_poll -> flush the tx burst.
 */
#ifndef MP_DPDK_REL_H
#define MP_DPDK_REL_H

#include <stddef.h>
#include <stdint.h>

#include <moshpit/driver.h> /* struct mp_iov */

#ifdef __cplusplus
extern "C" {
#endif

/** Header of a DATA segment; mss = path MTU - IPv4 (20) - UDP (8) - this. */
#define MP_REL_DATA_HDR_LEN 44
/** Largest header of any segment (an ACK with the most SACK words). */
#define MP_REL_HDR_MAX 160
/** Largest payload of one segment (the 16-bit length field). */
#define MP_REL_MSS_MAX 65535u
/** Largest segment window (the SACK bitmap an ACK can carry: 16 x 64 bits). */
#define MP_REL_WINDOW_MAX 1024u
/** Default mss: a 1500-byte MTU. */
#define MP_REL_MSS_DEFAULT (1500u - 20u - 8u - MP_REL_DATA_HDR_LEN)

struct mp_rel;      /**< one protocol instance (one per polling thread) */
struct mp_rel_conn; /**< one connection */
struct mp_rel_req;  /**< one posted send or receive */

/**
 * Emit one segment: @p hdr (@p hdr_len bytes, at most ::MP_REL_HDR_MAX)
 * followed by the @p n (0..2) payload pieces, as the UDP payload of one
 * frame to @p route. The header bytes are valid only during the call (copy
 * them into the frame); the payload pieces point into the posted send
 * buffer, which stays valid until that send completes, so they can be
 * attached zero-copy as an external buffer.
 * @return 0 once the frame is queued for the wire (it may still be lost);
 *         -EAGAIN if the tx ring is full: rel keeps the segment and offers it
 *         again on a later mp_rel_poll. Any other negative errno counts as a
 *         frame lost on the wire (retransmission recovers it).
 */
typedef int (*mp_rel_tx_fn)(void *user, uint32_t route, const void *hdr, size_t hdr_len,
			    const struct mp_iov *payload, int n);
/** Monotonic time in nanoseconds (tests inject a virtual clock). */
typedef uint64_t (*mp_rel_now_fn)(void *user);

/** Instance parameters; a zero field takes the default shown. */
struct mp_rel_params {
	uint32_t mss;           /**< payload bytes per segment (::MP_REL_MSS_DEFAULT); the
				     connection uses the smaller of both sides' values */
	uint32_t window;        /**< segments in flight per connection and direction: a
				     power of two, 64..::MP_REL_WINDOW_MAX (256) */
	uint32_t max_posted;    /**< posted sends, and posted receives, per connection:
				     a power of two (64); more gives -EAGAIN */
	uint32_t max_conns;     /**< connections per instance, open or not yet
				     closed, 1..65535 (256) */
	uint32_t max_retries;   /**< retransmissions of one segment, or unanswered
				     probes, before the connection fails (15) */
	uint64_t rto_min_ns;    /**< retransmission timeout floor (1 ms) */
	uint64_t rto_max_ns;    /**< retransmission timeout ceiling, after backoff (250 ms) */
	uint64_t ack_delay_ns;  /**< longest an acknowledgement waits to be
				     piggy-backed or batched (rto_min / 8) */
	uint64_t keepalive_ns;  /**< probe interval while requests are outstanding
				     and the peer is silent (rto_max) */
	uint64_t seed;          /**< varies connection ids between instances
				     (0: from the clock and the instance address) */
	mp_rel_tx_fn tx;        /**< segment output (required) */
	mp_rel_now_fn now_ns;   /**< clock (NULL: CLOCK_MONOTONIC) */
	void *user;             /**< passed to tx and now_ns */
	uint64_t connect_timeout_ns; /**< how long SYNs are repeated before a connect
				     fails with -ETIMEDOUT (0: max_retries SYNs, with
				     the same backoff as data) */
	uint32_t lanes;         /**< instances the port layer runs side by side, one per
				     queue (0 or 1: just this one), at most 16 */
	uint32_t lane;          /**< this instance's index among them: written into
				     the top 4 bits of every connection id it makes,
				     so mp_rel_seg_lane finds the instance a segment
				     is for */
	size_t stream_min;      /**< messages of at least this many bytes are written
				     into their receive buffers with non-temporal
				     stores (mp_k_copy_stream), which spare the caches
				     a shard too large to stay in them (0: never) */
};

/** Why a received segment was dropped (struct mp_rel_stats::drop). */
enum mp_rel_drop {
	MP_REL_DROP_SHORT = 0, /**< shorter than its fixed header */
	MP_REL_DROP_MAGIC,     /**< not our magic */
	MP_REL_DROP_VERSION,   /**< our magic, another protocol version */
	MP_REL_DROP_TYPE,      /**< unknown segment type or flags */
	MP_REL_DROP_LENGTH,    /**< length fields inconsistent with the datagram, or
				    offset/length not what the message's segmentation gives */
	MP_REL_DROP_CONN,      /**< no such connection id here, or from another route */
	MP_REL_DROP_WINDOW,    /**< sequence number beyond the window, or message
				    without a posted receive (beyond credit) */
	MP_REL_DROP_ACK,       /**< acknowledges data never sent */
	MP_REL_DROP_STATE,     /**< not valid in the connection's state (data before
				    the connection is established, after it failed) */
	MP_REL_DROP_LISTEN,    /**< SYN while not listening or with the backlog full */
	MP_REL_DROP_MAX
};

/** Counters of one instance, summed over its connections. */
struct mp_rel_stats {
	uint64_t seg_tx;          /**< segments handed to tx (all types, retransmissions too) */
	uint64_t data_tx;         /**< data segments sent for the first time */
	uint64_t data_rtx;        /**< data segments sent again (timeout or fast retransmit) */
	uint64_t rto_fired;       /**< retransmission timeouts */
	uint64_t fast_rtx;        /**< retransmissions triggered by SACK (of data_rtx) */
	uint64_t ack_tx;          /**< pure acknowledgements sent (probes answered too) */
	uint64_t probe_tx;        /**< probes sent (window closed or peer silent) */
	uint64_t ctl_tx;          /**< SYN, SYN-ACK, FIN and RST sent */
	uint64_t tx_again;        /**< tx returned -EAGAIN */
	uint64_t seg_rx;          /**< segments accepted (valid for a connection) */
	uint64_t data_rx;         /**< new data segments placed in a receive buffer */
	uint64_t dup_rx;          /**< data segments already held (duplicates) */
	uint64_t ack_rx;          /**< segments whose acknowledgement advanced,
				       SACKed something or opened the window */
	uint64_t drop[MP_REL_DROP_MAX]; /**< dropped segments by reason */
	uint64_t bytes_tx;        /**< message bytes of completed sends */
	uint64_t bytes_rx;        /**< message bytes of completed receives */
	uint64_t stream_rx;       /**< receives written with non-temporal stores
				       (struct mp_rel_params::stream_min) */
	uint64_t conns_failed;    /**< connections failed by timeout, FIN or RST */
};

/**
 * Create an instance.
 * @return 0; -EINVAL for out-of-range parameters or no tx; -ENOMEM.
 */
int mp_rel_create(const struct mp_rel_params *p, struct mp_rel **out);
/**
 * Destroy an instance: every connection is closed as by mp_rel_close
 * (FIN sent) and every request, tested or not, is released.
 */
void mp_rel_destroy(struct mp_rel *rel);

/**
 * Accept connections from SYNs: at most @p backlog created but not yet
 * taken by mp_rel_accept (SYNs beyond are dropped, the peer retries).
 * @p backlog 0 stops listening and closes connections not yet accepted.
 * Not listening is the initial state. @return 0.
 */
int mp_rel_listen(struct mp_rel *rel, uint32_t backlog);
/** Take one connection created by a SYN. @return 0; -EAGAIN if none. */
int mp_rel_accept(struct mp_rel *rel, struct mp_rel_conn **out);
/**
 * Start a connection to @p route (the port layer's opaque handle of a peer;
 * the same value comes back to tx). Requests may be posted at once; data
 * leaves once the peer answered. If it never answers, the connection fails
 * with -ETIMEDOUT (after connect_timeout_ns, or max_retries SYNs).
 * @return 0; -ENOSPC if max_conns are open; -ENOMEM.
 */
int mp_rel_connect(struct mp_rel *rel, uint32_t route, struct mp_rel_conn **out);
/**
 * Close a connection: its posted requests complete with -ECANCELED (they
 * stay valid until mp_rel_test reports them done), FIN goes to the peer, and
 * the handle is invalid on return.
 */
void mp_rel_close(struct mp_rel_conn *c);
/** The route a connection talks to. */
uint32_t mp_rel_conn_route(const struct mp_rel_conn *c);
/** 1 established, 0 still connecting, or the negative errno it failed with. */
int mp_rel_conn_status(const struct mp_rel_conn *c);
/** A pointer the caller keeps with the connection (NULL initially). */
void mp_rel_conn_set_user(struct mp_rel_conn *c, void *user);
void *mp_rel_conn_user(const struct mp_rel_conn *c);

/**
 * Post a send of @p iovcnt (1..::MP_DRV_IOV_MAX) pieces as one message,
 * up to UINT32_MAX bytes. The pieces are read (zero-copy) until the request
 * completes.
 * @return 0; -EAGAIN if max_posted sends are outstanding; -EINVAL;
 *         the connection's error if it failed.
 */
int mp_rel_send(struct mp_rel_conn *c, const struct mp_iov *iov, int iovcnt,
		struct mp_rel_req **out);
/**
 * Post a receive of the next message into @p buf of @p cap bytes. Messages
 * match receives in posting order; a shorter message completes with its
 * length, a longer one fails this receive with -EMSGSIZE (and is consumed).
 * @return 0; -EAGAIN if max_posted receives are outstanding; the
 *         connection's error if it failed.
 */
int mp_rel_recv(struct mp_rel_conn *c, void *buf, size_t cap, struct mp_rel_req **out);
/**
 * Check a request. Once *@p done is set the request is released (do not use
 * it again). @p nbytes (may be NULL) gets the message length.
 * @return 0, or the request's negative errno once done and failed
 *         (-EMSGSIZE, -ECANCELED, -ETIMEDOUT, -ECONNRESET).
 */
int mp_rel_test(struct mp_rel_req *r, int *done, size_t *nbytes);

/**
 * Feed one received UDP payload from @p route (Ethernet, IP and UDP already
 * validated and stripped). Data is copied straight into posted receive
 * buffers; @p seg is not kept after the call. Never calls tx.
 */
void mp_rel_input(struct mp_rel *rel, uint32_t route, const void *seg, size_t len);
/**
 * Run due timers (retransmissions, delayed acknowledgements, probes) and
 * send what is pending (data the windows allow, acknowledgements, control
 * segments).
 * @return 1 if it did something (sent or completed anything), else 0.
 */
int mp_rel_poll(struct mp_rel *rel);
/**
 * When mp_rel_poll next has timed work: a time on the now_ns clock, a time
 * already past if work is pending now, or UINT64_MAX if nothing is armed.
 * May be early (a wheel slot's start), never late.
 */
uint64_t mp_rel_next_deadline_ns(const struct mp_rel *rel);

/** Copy the counters. */
void mp_rel_get_stats(const struct mp_rel *rel, struct mp_rel_stats *out);

/**
 * The lane (mp_rel_params::lane) of the connection a received segment is
 * addressed to, read from its destination id without validating the rest;
 * -1 for a SYN (any instance may take it) or something that is not a
 * segment (the instance that got it drops it).
 */
int mp_rel_seg_lane(const void *seg, size_t len);
/** The instance a connection or a request belongs to, and its params' user. */
struct mp_rel *mp_rel_conn_rel(const struct mp_rel_conn *c);
struct mp_rel *mp_rel_req_rel(const struct mp_rel_req *r);
void *mp_rel_user(const struct mp_rel *rel);

/**
 * Round-trip estimator of one connection (RFC 6298): smoothed RTT, its mean
 * deviation and the retransmission timeout they give. All 0 before the
 * first sample.
 */
struct mp_rel_rtt {
	uint64_t srtt, rttvar, rto;
};
/**
 * Fold one RTT sample @p r (ns) into @p e: the first sets srtt = r and
 * rttvar = r / 2, later ones rttvar = 3/4 rttvar + 1/4 |srtt - r| and
 * srtt = 7/8 srtt + 1/8 r; then rto = srtt + max(@p g, 4 rttvar), clamped to
 * [@p lo, @p hi]. @p g is the clock granularity (rel passes its timer tick).
 * Samples come only from segments sent once (Karn), at most one per ACK.
 */
void mp_rel_rtt_sample(struct mp_rel_rtt *e, uint64_t r, uint64_t g, uint64_t lo, uint64_t hi);
/**
 * The retransmission timeout a segment sent now on @p c would get: the
 * estimator's (rto_min_ns before the first sample), doubled for each timeout
 * since the last valid sample, at most rto_max_ns.
 */
uint64_t mp_rel_conn_rto_ns(const struct mp_rel_conn *c);
/** Name of a drop reason ("short", "magic", ...), "?" if out of range. */
const char *mp_rel_drop_name(int why);

#ifdef __cplusplus
}
#endif
#endif /* MP_DPDK_REL_H */
