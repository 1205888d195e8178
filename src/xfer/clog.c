/* SPDX-License-Identifier: BSD-3-Clause */
/* The contribution log (see clog.h for the format). */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "clog.h"
#include "xfer.h"
#include "log.h"

/* One line, built in memory so that it leaves in one write(2). */
struct line {
	char *buf;
	size_t len, cap;
	int err;
	char stack[512];
};

static void line_init(struct line *l)
{
	l->buf = l->stack;
	l->len = 0;
	l->cap = sizeof(l->stack);
	l->err = 0;
}

static void add(struct line *l, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void add(struct line *l, const char *fmt, ...)
{
	va_list ap;
	int n;

	if (l->err)
		return;
	va_start(ap, fmt);
	n = vsnprintf(l->buf + l->len, l->cap - l->len, fmt, ap);
	va_end(ap);
	if (n < 0) {
		l->err = 1;
		return;
	}
	if ((size_t)n >= l->cap - l->len) {
		size_t cap = (l->len + (size_t)n + 1) * 2;
		char *nb = l->buf == l->stack ? malloc(cap) : realloc(l->buf, cap);
		if (!nb) {
			l->err = 1;
			return;
		}
		if (l->buf == l->stack)
			memcpy(nb, l->stack, l->len);
		l->buf = nb;
		l->cap = cap;
		va_start(ap, fmt);
		vsnprintf(l->buf + l->len, l->cap - l->len, fmt, ap);
		va_end(ap);
	}
	l->len += (size_t)n;
}

/* Append the line with a single write: O_APPEND places it whole at the end,
 * and no signal of our own can cut it (faults fire on this thread). */
static void emit(struct mp_ctx *ctx, struct line *l)
{
	ssize_t w;

	add(l, "\n");
	if (l->err) {
		MP_WARN("contribution log: a line could not be built (out of memory)");
	} else {
		do
			w = write(ctx->clog_fd, l->buf, l->len);
		while (w < 0 && errno == EINTR);
		if (w != (ssize_t)l->len)
			MP_WARN("contribution log: write failed: %s",
				w < 0 ? strerror(errno) : "short write (disk full?)");
	}
	if (l->buf != l->stack)
		free(l->buf);
}

static unsigned long long member_id(const struct mp_ctx *ctx, const struct mp_group *g, int m)
{
	return m == g->my_index ? ctx->self_id : ctx->peers[g->members[m]].id;
}

int mp_clog_open(struct mp_ctx *ctx)
{
	const char *path = ctx->cfg.contrib_log;

	ctx->cfg.contrib_log = NULL;
	ctx->clog_fd = -1;
	if (!path || !*path)
		return 0;
	ctx->clog_fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
	if (ctx->clog_fd < 0) {
		int rc = -errno;
		mp_set_init_error("contribution log %s: %s", path, strerror(-rc));
		return rc;
	}
	return 0;
}

void mp_clog_close(struct mp_ctx *ctx)
{
	if (ctx->clog_fd >= 0)
		close(ctx->clog_fd);
	ctx->clog_fd = -1;
}

void mp_clog_begin(struct mp_ctx *ctx, uint32_t round, const struct mp_group *g, float weight,
		   const uint64_t *lens, const uint8_t *modes)
{
	static const char mode_char[] = {'n', 'c', 'a'};
	struct line l;

	if (ctx->clog_fd < 0)
		return;
	line_init(&l);
	add(&l, "begin round=%u group=%08x self=%016llx index=%d size=%d weight=%a roster=", round, g->id,
	    (unsigned long long)ctx->self_id, g->my_index, g->size, (double)weight);
	for (int m = 0; m < g->size; m++)
		add(&l, "%s%016llx:%llu:%c", m ? "," : "", member_id(ctx, g, m),
		    (unsigned long long)lens[m], mode_char[modes ? modes[m] : MP_MODE_NORMAL]);
	emit(ctx, &l);
}

void mp_clog_reduce(struct mp_ctx *ctx, uint32_t round, const struct mp_group *g, uint64_t off,
		    uint64_t len, float wsum, int n, const int *who, const float *w)
{
	struct line l;

	if (ctx->clog_fd < 0)
		return;
	line_init(&l);
	add(&l, "reduce round=%u group=%08x part=%d off=%llu len=%llu wsum=%a contrib=", round, g->id,
	    g->my_index, (unsigned long long)off, (unsigned long long)len, (double)wsum);
	for (int i = 0; i < n; i++)
		add(&l, "%s%016llx:%a", i ? "," : "", member_id(ctx, g, who[i]), (double)w[i]);
	emit(ctx, &l);
}

void mp_clog_apply(struct mp_ctx *ctx, uint32_t round, const struct mp_group *g, int part,
		   int applied)
{
	struct line l;

	if (ctx->clog_fd < 0)
		return;
	line_init(&l);
	add(&l, "apply round=%u group=%08x part=%d status=%s", round, g->id, part,
	    applied ? "applied" : "own");
	emit(ctx, &l);
}

void mp_clog_end(struct mp_ctx *ctx, uint32_t round, const struct mp_group *g, float weight)
{
	struct line l;

	if (ctx->clog_fd < 0)
		return;
	line_init(&l);
	add(&l, "end round=%u group=%08x weight=%a", round, g->id, (double)weight);
	emit(ctx, &l);
}

void mp_clog_alone(struct mp_ctx *ctx, uint32_t round)
{
	struct line l;

	if (ctx->clog_fd < 0)
		return;
	line_init(&l);
	add(&l, "alone round=%u", round);
	emit(ctx, &l);
}

void mp_clog_restore(struct mp_ctx *ctx, uint32_t round, uint32_t from)
{
	struct line l;

	if (ctx->clog_fd < 0)
		return;
	line_init(&l);
	add(&l, "restore round=%u from=%u", round, from);
	emit(ctx, &l);
}
