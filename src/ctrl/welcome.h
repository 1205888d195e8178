/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The welcome: a one-shot TCP exchange, on the port number of a peer's DHT
 * node, that hands a peer of the same run what that node knows of the run
 * (doc/protocol.md, "Welcome"). Both sides prove they hold the run key; the
 * payload is opaque here (rdv_dht.c fills and reads it) and covered by the
 * answer's MAC.
 */
#ifndef MP_WELCOME_H
#define MP_WELCOME_H

#include <stddef.h>
#include <stdint.h>

#include "auth.h"

/* The largest answer an asker accepts, and the largest thing it may give. */
#define MP_WELCOME_MAX (1u << 20)
#define MP_WELCOME_GIVE_MAX 512

struct mp_welcome;

/* An asker's verified gift (@in, @inlen bytes, maybe none) arrived: take it,
 * and write the answer into @out (at most @cap bytes); its length. Called
 * on the service's thread. */
typedef size_t (*mp_welcome_fill_fn)(void *arg, const uint8_t *in, size_t inlen, uint8_t *out,
				     size_t cap);

/*
 * Serve on TCP @port (0: any free one) of every IPv4 address, from a thread
 * of its own, until mp_welcome_stop. Askers are served one at a time, each
 * for at most half a second: a silent one holds the others up that long,
 * many silent ones longer (a joiner then reads the run from the DHT). 0,
 * or a negative errno (the port is taken: -EADDRINUSE) with nothing
 * started.
 */
int mp_welcome_start(const struct mp_auth *a, uint64_t run_id, unsigned port,
		     mp_welcome_fill_fn fill, void *arg, struct mp_welcome **out);
/* The TCP port it serves on. */
unsigned mp_welcome_port(const struct mp_welcome *w);
void mp_welcome_stop(struct mp_welcome *w);
/* Askers refused so far (no run key, another run, malformed). */
uint64_t mp_welcome_refused(struct mp_welcome *w);

/*
 * Ask the service at @addr ("host:port") within @timeout_ms, giving it @give
 * (@give_len bytes, at most MP_WELCOME_GIVE_MAX; may be 0). 0 with
 * *@payload (malloc'd, free it) and *@len, or: -ECONNREFUSED, -ETIMEDOUT, a
 * socket error, -EPROTO (not a welcome service, or another version),
 * -EACCES (refused, or the answer's MAC is wrong: not our run key),
 * -EMSGSIZE.
 */
int mp_welcome_ask(const struct mp_auth *a, uint64_t run_id, const char *addr, int timeout_ms,
		   const uint8_t *give, size_t give_len, uint8_t **payload, size_t *len);

/*
 * Internal: the exchange's two sides over any byte stream, so that a fuzz
 * target (tests/fuzz/fuzz_welcome.c) can play the other side from memory.
 * The service and mp_welcome_ask run them over their TCP socket.
 *
 * @xfer moves all @len bytes (send with @out, else receive) by @deadline
 * (mp_now_ms): 0, -ETIMEDOUT, -ECONNRESET (the other side closed), or
 * another negative errno.
 */
struct mp_welcome_io {
	int (*xfer)(void *ctx, void *buf, size_t len, uint64_t deadline, int out);
	void *ctx;
};

/* What the service's answer buffer holds: its header, then the payload. */
#define MP_WELCOME_BUF_LEN (4 + MP_MAC_BYTES + MP_WELCOME_MAX)

/*
 * Serve one asker over @io by @deadline, answering in @buf
 * (MP_WELCOME_BUF_LEN bytes); @fill is called only with a gift whose MAC
 * verified. NULL when served (or gone before it asked: nothing to refuse),
 * else why the asker is refused (a constant string).
 */
const char *mp_welcome_serve_io(const struct mp_auth *a, uint64_t run_id,
				mp_welcome_fill_fn fill, void *arg, uint8_t *buf,
				const struct mp_welcome_io *io, uint64_t deadline);

/* mp_welcome_ask's exchange over @io by @deadline, with its results and
 * errors but for the connection's own (-EINVAL for bad arguments). */
int mp_welcome_ask_io(const struct mp_auth *a, uint64_t run_id, const struct mp_welcome_io *io,
		      uint64_t deadline, const uint8_t *give, size_t give_len, uint8_t **payload,
		      size_t *len);

#endif
