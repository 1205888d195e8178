/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Connections between peers (conn.c). A pair of peers has ctx->nconn
 * connections: data streams 0..streams-1, used by the engine, and the control
 * connection, index ctx->streams, used by ctrl.c only. Each is authenticated
 * with the run key before it is handed out, and has a session token.
 */
#ifndef MP_CONN_H
#define MP_CONN_H

#include "ctx.h"

/*
 * The connection @idx to @peer if it is ready, else NULL. When this side
 * dials (a client always, else the lower id), it dials and moves the
 * handshake on here: call it again until it gives a connection. When the
 * peer dials, NULL until mp_conn_poll has adopted the peer's connection.
 * *err: the last connection error (0 if none): -ENOTCONN at once when the
 * two can never connect (both clients) or the peer is gone; -EACCES when the
 * peer failed authentication (retried after a pause, like a refused dial);
 * -EBADE while the peer's settings differ from ours (mp_conn_settings_diff;
 * dialled again every second, in case it was restarted with the right ones).
 */
struct mp_drv_conn *mp_conn_get(struct mp_ctx *ctx, int peer, int idx, int *err);
/* The connection @idx to @peer if it is ready, else NULL; never dials. */
struct mp_drv_conn *mp_conn_ready(const struct mp_ctx *ctx, int peer, int idx);
/* 1 if connection @idx to @peer exists, ready or still in its handshake. */
int mp_conn_open(const struct mp_ctx *ctx, int peer, int idx);
/* Session token of connection @idx to @peer (0 while it is not ready). */
uint32_t mp_conn_token(struct mp_ctx *ctx, int peer, int idx);
/* @peer's OPEN agreed on @n values (n > 0): remembered with the session of
 * its stream-0 connection, among its last MP_AGREED_LENS lengths. */
void mp_conn_agreed_note(struct mp_ctx *ctx, int peer, uint64_t n);
/* 1 if @peer's OPEN agreed on @n values on the stream-0 connection still
 * open, with every data stream ready now (its handshakes agreed): an
 * exchange with it can differ neither in settings nor in length unless it
 * restarts or changes its length. */
int mp_conn_agreed_len(const struct mp_ctx *ctx, int peer, uint64_t n);
/* How @peer's settings differ from ours ("grid differs: ours 4, theirs 2x2"),
 * while its last handshake on connection @idx was refused for them; else
 * NULL. mp_conn_get reports such a peer with -EBADE. */
const char *mp_conn_settings_diff(const struct mp_ctx *ctx, int peer, int idx);
/* Move every handshake on: our own dials (so that they complete while an
 * exchange waits for other peers) and accepted connections, adopted once
 * their AUTH checks out. */
void mp_conn_poll(struct mp_ctx *ctx);
/* Close one connection (its posted requests are cancelled). */
void mp_conn_drop(struct mp_ctx *ctx, int peer, int idx);
void mp_conn_close_all(struct mp_ctx *ctx);
/* mp_finalize: close everything and free the connection slots. */
void mp_conn_fini(struct mp_ctx *ctx);
/* The peer left or died: mark it gone in the table and close its
 * connections; it is never dialled again. */
void mp_conn_peer_gone(struct mp_ctx *ctx, int idx);
/*
 * Static runs' failure memory: probe @peer with a handshake on the probe
 * slot (index nconn), dialled from either side, closed once authenticated.
 * Its HELLO asks @kind (MP_PROBE_*) and carries @round. The outcome goes to
 * mp_peer_probe_done; the peer sees mp_peer_probed_by. -EBUSY: a probe is
 * under way; -ENOTCONN: no address.
 */
int mp_conn_probe(struct mp_ctx *ctx, int peer, int kind, uint32_t round);
/* 1 while a probe of @peer is under way. */
int mp_conn_probing(const struct mp_ctx *ctx, int peer);
/* 1 while a connection of ours is in its handshake: one accepted and not
 * through it yet, or one we dialled that is not ready. */
int mp_conn_handshaking(const struct mp_ctx *ctx);
/* Release a request whose connection was closed (it completes with
 * -ECANCELED; bounded, in case a driver needs a progress call for it). */
void mp_reap(struct mp_ctx *ctx, struct mp_drv_req *req);

#endif
