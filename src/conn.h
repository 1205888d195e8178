/* SPDX-License-Identifier: BSD-3-Clause */
#ifndef MP_CONN_H
#define MP_CONN_H

#include "internal.h"

/* The connection to (peer, stream) if it is ready, else NULL; dials when it
 * is this side's turn. *err gets the last connection error (0 if none). */
struct mp_drv_conn *mp_conn_get(struct mp_ctx *ctx, int peer, int stream, int *err);
/* Accept arrivals and check their HELLOs. */
void mp_conn_poll(struct mp_ctx *ctx);
/* Close one connection (its posted requests are cancelled). */
void mp_conn_drop(struct mp_ctx *ctx, int peer, int stream);
void mp_conn_close_all(struct mp_ctx *ctx);
/* Release a request whose connection was closed (it completes with
 * -ECANCELED; bounded, in case a driver needs a progress call for it). */
void mp_reap(struct mp_ctx *ctx, struct mp_drv_req *req);

#endif
