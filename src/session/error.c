/* SPDX-License-Identifier: BSD-3-Clause */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "ctx.h"
#include "log.h"

/* Long enough for a driver's advice with the names it found (mp_init). */
static _Thread_local char init_err[768];

const char *mp_strerror(int err)
{
	switch (-err) {
	case 0: return "success";
	case EINVAL: return "invalid argument";
	case ENOMEM: return "out of memory";
	case ENOENT: return "not found";
	case ENOTSUP: return "not supported";
	case ETIMEDOUT: return "timed out";
	case ECONNREFUSED: return "connection refused";
	case ECONNRESET: return "connection reset by peer";
	case EPROTO: return "protocol error";
	case EBADMSG: return "malformed message";
	case EMSGSIZE: return "message too long";
	case ECANCELED: return "cancelled";
	case ENOTCONN: return "peers not set";
	case EBUSY: return "busy";
	case EADDRINUSE: return "address in use";
	case EAGAIN: return "try again";
	case ENOSPC: return "buffer too small";
	case EHOSTUNREACH: return "peer unreachable";
	case EBADE: return "settings differ from a peer's";
	default: return err < 0 ? strerror(-err) : "not an error code";
	}
}

/*
 * A context's message is written by whichever thread fails: the caller's in
 * argument checks, the progress thread during an operation, while the caller
 * may read it at any time (to poll a request, or to log). So ctx->err is
 * only touched under err_mu, and mp_last_error hands out a copy in
 * ctx->err_shown, which the progress thread never writes. One lock for every
 * context: failures and reads of them are rare, and a static lock needs no
 * set-up, so contexts that tests build by hand are covered too. It is a leaf
 * lock: nothing else is taken under it, not even the log's.
 */
static pthread_mutex_t err_mu = PTHREAD_MUTEX_INITIALIZER;

void mp_set_error(struct mp_ctx *ctx, const char *fmt, ...)
{
	char msg[sizeof(ctx->err)];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	pthread_mutex_lock(&err_mu);
	memcpy(ctx->err, msg, sizeof(msg));
	pthread_mutex_unlock(&err_mu);
	MP_WARN("%s", msg);
}

void mp_set_init_error(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(init_err, sizeof(init_err), fmt, ap);
	va_end(ap);
	MP_WARN("%s", init_err);
}

void mp_note_init_error(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(init_err, sizeof(init_err), fmt, ap);
	va_end(ap);
}

const char *mp_last_error(const mp_ctx *cctx)
{
	/* The copy is kept in the context, as a cache: the const is the API's
	 * promise that the context's state does not change, and it does not
	 * (mp_init allocates every context, so writing the copy is sound). */
	struct mp_ctx *ctx = (struct mp_ctx *)cctx;

	if (!ctx)
		return init_err;
	pthread_mutex_lock(&err_mu);
	memcpy(ctx->err_shown, ctx->err, sizeof(ctx->err_shown));
	pthread_mutex_unlock(&err_mu);
	return ctx->err_shown;
}
