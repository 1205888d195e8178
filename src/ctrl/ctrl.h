/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Control messages between peers (JOIN, BEGIN, REJECT, BYE) on each pair's
 * control connection (connection index ctx->streams), apart from the data
 * streams so that a message never lands in a receive window of the engine.
 * Every control connection that is ready has one receive posted; arrived
 * messages are validated (wire.c, session token) and queued for the
 * matchmaker, except BYE, which is acted on here.
 */
#ifndef MP_CTRL_H
#define MP_CTRL_H

#include <moshpit/sdk/reqq.h>

#include "ctx.h"

#define MP_CTRL_PAYLOAD_MAX 16384

struct mp_ctrl_msg {
	int peer;                 /* peer-table index of the sender */
	struct mp_wire_hdr h;
	uint8_t *payload;         /* h.length bytes */
	struct mp_reqq_link link; /* the arrival queue, or a list the matchmaker keeps */
};

int mp_ctrl_init(struct mp_ctx *ctx);
void mp_ctrl_fini(struct mp_ctx *ctx);
/* Post receives, reap finished sends, queue arrivals. Never blocks. */
void mp_ctrl_poll(struct mp_ctx *ctx);

/*
 * A handler of one control message type: called from mp_ctrl_poll as the
 * message arrives from @peer (a validated header, h->length bytes of
 * payload), instead of queueing it. Return -EBADMSG to have it counted
 * and logged as refused.
 */
typedef int (*mp_ctrl_handler)(void *arg, int peer, const struct mp_wire_hdr *h,
			       const uint8_t *payload);
/* Register @fn for messages of @type (not BYE, which ctrl.c acts on itself);
 * @bad names a refused one in the log. -EINVAL for a type out of range. */
int mp_ctrl_on(struct mp_ctx *ctx, enum mp_msg_type type, mp_ctrl_handler fn, void *arg,
	       const char *bad);
/* Send @h (type, round, group_id, aux set by the caller) and @len bytes of
 * payload to @peer. 0, -EAGAIN while the control connection is not ready
 * (call again after polling), or a negative errno. */
int mp_ctrl_send(struct mp_ctx *ctx, int peer, struct mp_wire_hdr *h, const void *payload,
		 size_t len);
/* The same to every other peer not gone, but @skip (-1: none). Best effort:
 * a peer whose control connection is not ready misses it (a dial starts). */
void mp_ctrl_send_all(struct mp_ctx *ctx, struct mp_wire_hdr *h, const void *payload,
		      size_t len, int skip);
/* Oldest queued message, or NULL. Free it with mp_ctrl_msg_free. */
struct mp_ctrl_msg *mp_ctrl_take(struct mp_ctx *ctx);
void mp_ctrl_msg_free(struct mp_ctrl_msg *m);
/* Append @m to the queue: an arrival, or a later round's message put back. */
void mp_ctrl_requeue(struct mp_ctx *ctx, struct mp_ctrl_msg *m);
/* Tell every peer with a live control connection that we leave; waits a
 * bounded time for the messages to go out. */
void mp_ctrl_bye_all(struct mp_ctx *ctx);

#endif
