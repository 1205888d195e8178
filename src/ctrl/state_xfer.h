/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * State download (doc/protocol.md, "State download"): a peer serves the
 * state it last published (a snapshot of buffers plus a metadata blob) to
 * peers that prove the run key, from threads of its own, over TCP, so its
 * averaging never waits for a download; a joiner asks every server it knows
 * for its version, fetches from the most advanced, checks the snapshot's
 * digest, and goes on with the next server when one dies mid-transfer
 * (resuming where it stopped when that server has the same snapshot).
 */
#ifndef MP_STATE_XFER_H
#define MP_STATE_XFER_H

#include <stddef.h>
#include <stdint.h>

#include <moshpit/moshpit.h> /* MP_STATE_MAX_ACTIVE, MP_ADDR_STRLEN */

#include "auth.h"

/* Bounds a client checks before it allocates anything for an answer. */
#define MP_STATE_MAX_BUFS 65536
#define MP_STATE_META_MAX (1u << 20)
#define MP_STATE_DIGEST_BYTES 32

/* A published state: immutable, reference-counted (the server's current
 * one, and one per download in progress). */
struct mp_state_snap;

/* Copy @n buffers (@lens bytes each) and @meta into a new snapshot with
 * one reference. 0, -EINVAL (bounds above, NULL with a length), -ENOMEM. */
int mp_state_snap_new(uint64_t version, const void *const *bufs, const size_t *lens, int n,
		      const void *meta, size_t meta_len, struct mp_state_snap **out);
void mp_state_snap_put(struct mp_state_snap *s);

struct mp_state_srv;

/* Serve on @listen ("host:port", port 0 for any) until mp_state_srv_stop,
 * each download at most @rate bytes per second (0: as fast as it goes).
 * A client silent for @stall_ms, or a download that moves nothing for it,
 * is dropped. 0 or a negative errno with nothing started. */
int mp_state_srv_start(const struct mp_auth *a, uint64_t run_id, const char *listen,
		       int stall_ms, uint64_t rate, struct mp_state_srv **out);
/* Stops accepting, ends the downloads in progress (at most @stall_ms
 * later), frees it. */
void mp_state_srv_stop(struct mp_state_srv *s);
/* "host:port" it listens on. */
const char *mp_state_srv_addr(const struct mp_state_srv *s);
/* Serve @snap from now on (a reference of the server's own is taken);
 * downloads in progress finish with the snapshot they began. */
void mp_state_srv_set(struct mp_state_srv *s, struct mp_state_snap *snap);

struct mp_state_srv_counts {
	uint64_t served;  /* downloads sent whole, and version queries answered */
	uint64_t refused; /* clients that did not prove the run key, or spoke nonsense */
	uint64_t busy;    /* closed at once: MP_STATE_MAX_ACTIVE were running */
	uint64_t cut;     /* downloads that ended early (client gone or stalled, stop) */
};
void mp_state_srv_counts(struct mp_state_srv *s, struct mp_state_srv_counts *out);

/* What a server says of its state (an answer's verified header). */
struct mp_state_head {
	int have;                /* 0: nothing published yet (the rest is zero) */
	uint64_t version;
	uint64_t total;          /* bytes of all buffers */
	uint64_t start;          /* where the data that follows starts */
	uint32_t nbufs;
	uint32_t meta_len;
	uint8_t digest[MP_STATE_DIGEST_BYTES]; /* BLAKE2b-256 of the buffers' bytes in order */
	uint64_t *lens;          /* nbufs (malloc'd) */
	uint8_t *meta;           /* meta_len (malloc'd) */
};
void mp_state_head_free(struct mp_state_head *h);

/* Where a download lands: the caller's buffers. */
struct mp_state_dest {
	void *const *bufs;
	const size_t *lens;
	int n;
};

/* The outcome of a search over several servers. */
struct mp_state_outcome {
	int src;            /* index of the server the state came from, -1 none */
	int tries;          /* servers a download was started with */
	uint64_t resumed;   /* bytes kept from a server that failed mid-transfer */
	char why[512];      /* on failure: each server's failure, in words */
};

/*
 * Ask each of @addrs for its version; then, with @d, download from the
 * most advanced whose buffer lengths equal @d's, falling back to the next
 * on any failure (resuming when it has the same snapshot), and check the
 * digest. Without @d, only the most advanced server's header is returned.
 * @best gets the header of what was downloaded (or found). Bounded by
 * @deadline (mp_now_ms clock); a connection by @connect_ms, a silence by
 * @stall_ms. 0; -ENOENT (no server has published anything); -EACCES
 * (every server refused us: another run key); -EMSGSIZE (those that have
 * a state have other buffer lengths); -ETIMEDOUT; else the last server's
 * failure (-ECONNRESET, -EBADMSG for a digest that did not match, ...).
 * On failure @d's buffers may hold part of a download.
 */
int mp_state_fetch_any(const struct mp_auth *a, uint64_t run_id, const char *const *addrs,
		       int naddrs, const struct mp_state_dest *d, int connect_ms, int stall_ms,
		       uint64_t deadline, struct mp_state_head *best,
		       struct mp_state_outcome *out);

/* The byte stream of one exchange: a socket, or memory in the fuzz target
 * (tests/fuzz/fuzz_state.c). Moves all @len bytes by @deadline: 0,
 * -ETIMEDOUT, -ECONNRESET (closed), or another negative errno. */
struct mp_state_io {
	int (*xfer)(void *ctx, void *buf, size_t len, uint64_t deadline, int out);
	void *ctx;
};

/* A client's request over @io: read the hello, send the ask (@kind 1 for a
 * version, 2 for a download from @offset of the snapshot whose digest is
 * @want, NULL none), read and verify the header into @h (freed on failure).
 * 0; -EPROTO (not a state service, or lengths that do not sum to the
 * total); -EMSGSIZE (past the bounds, before anything is allocated);
 * -EACCES (closed after our ask, or a header whose MAC is wrong); the
 * stream's error. */
int mp_state_ask_io(const struct mp_auth *a, uint64_t run_id, const struct mp_state_io *io,
		    int kind, uint64_t offset, const uint8_t *want, uint64_t deadline,
		    struct mp_state_head *h);

/* One download over @io into @d: mp_state_ask_io, then the data from the
 * header's start, each piece within @stall_ms, then the digest of all of
 * @d. *@got is how far @d holds the header's snapshot (when @h->
 * have is set, @h is the header, for the caller to free, also on failure). 0;
 * -ENOENT (nothing published); -EMSGSIZE (other lengths); -EPROTO (data
 * that would start elsewhere than 0 or the offset asked for, with @want);
 * -EBADMSG (the digest differs); mp_state_ask_io's and the stream's errors. */
int mp_state_download_io(const struct mp_auth *a, uint64_t run_id, const struct mp_state_io *io,
			 const struct mp_state_dest *d, uint64_t offset, const uint8_t *want,
			 int stall_ms, uint64_t deadline, struct mp_state_head *h, uint64_t *got);

#endif
