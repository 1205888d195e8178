/* SPDX-License-Identifier: BSD-3-Clause */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "ctx.h"
#include "log.h"

static _Thread_local char init_err[256];

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
	default: return err < 0 ? strerror(-err) : "not an error code";
	}
}

void mp_set_error(struct mp_ctx *ctx, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(ctx->err, sizeof(ctx->err), fmt, ap);
	va_end(ap);
	MP_WARN("%s", ctx->err);
}

void mp_set_init_error(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(init_err, sizeof(init_err), fmt, ap);
	va_end(ap);
	MP_WARN("%s", init_err);
}

const char *mp_last_error(const mp_ctx *ctx)
{
	return ctx ? ctx->err : init_err;
}
