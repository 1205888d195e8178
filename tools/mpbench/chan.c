/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Messages between mpbench's local peers and their coordinator: over pipes
 * (peers are processes) or in-memory queues (peers are threads), every read
 * and write bounded by a deadline.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "mpbench.h"

#define MSG_MAX_LEN (1u << 24)

struct msg_hdr {
	uint32_t type;
	int32_t rank;
	uint32_t len;
};

/* ------------------------------------------------------------------------ */
/* Pipes with deadlines                                                      */

int set_nonblock(int fd)
{
	int fl = fcntl(fd, F_GETFL);

	if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
		return -errno;
	return 0;
}

/* Write all of @buf to non-blocking @fd within @timeout_ms. */
static int fd_write_all(int fd, const void *buf, size_t len, int timeout_ms)
{
	const char *p = buf;
	int64_t deadline = (int64_t)mp_now_ms() + timeout_ms;

	while (len > 0) {
		ssize_t n = write(fd, p, len);

		if (n > 0) {
			p += n;
			len -= (size_t)n;
			continue;
		}
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
			return -errno;

		int64_t left = deadline - (int64_t)mp_now_ms();
		struct pollfd pfd = { .fd = fd, .events = POLLOUT };

		if (left <= 0)
			return -ETIMEDOUT;
		int rc = poll(&pfd, 1, clamp_ms(left));

		if (rc < 0 && errno != EINTR)
			return -errno;
		if (rc > 0 && !(pfd.revents & POLLOUT) && (pfd.revents & (POLLERR | POLLHUP)))
			return -EPIPE;
	}
	return 0;
}

/* Read exactly @len bytes within @timeout_ms: 1, 0 on EOF before the first byte,
 * -EPIPE on EOF midway, -ETIMEDOUT or another negative errno. */
static int fd_read_all(int fd, void *buf, size_t len, int timeout_ms)
{
	char *p = buf;
	size_t got = 0;
	int64_t deadline = (int64_t)mp_now_ms() + timeout_ms;

	while (got < len) {
		int64_t left = deadline - (int64_t)mp_now_ms();
		struct pollfd pfd = { .fd = fd, .events = POLLIN };
		int rc = poll(&pfd, 1, clamp_ms(left));

		if (rc < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (rc == 0)
			return -ETIMEDOUT;

		ssize_t n = read(fd, p + got, len - got);

		if (n < 0) {
			if (errno == EINTR || errno == EAGAIN)
				continue;
			return -errno;
		}
		if (n == 0)
			return got ? -EPIPE : 0;
		got += (size_t)n;
	}
	return 1;
}

int fd_send_msg(int fd, uint32_t type, int rank, const void *data, uint32_t len,
		       int timeout_ms)
{
	struct msg_hdr h = { .type = type, .rank = rank, .len = len };
	size_t total = sizeof(h) + len;
	char stackbuf[1024];
	char *buf = total <= sizeof(stackbuf) ? stackbuf : xmalloc(total);
	int rc;

	/* One write: messages up to PIPE_BUF reach the pipe whole. */
	memcpy(buf, &h, sizeof(h));
	if (len)
		memcpy(buf + sizeof(h), data, len);
	rc = fd_write_all(fd, buf, total, timeout_ms);
	if (buf != stackbuf)
		free(buf);
	return rc;
}

/* 1 with a message, 0 on a clean EOF, negative errno otherwise. */
int fd_recv_msg(int fd, struct msg *m, int timeout_ms)
{
	struct msg_hdr h;
	int rc = fd_read_all(fd, &h, sizeof(h), timeout_ms);

	if (rc <= 0)
		return rc;
	if (h.len > MSG_MAX_LEN)
		return -EPROTO;
	m->type = h.type;
	m->rank = h.rank;
	m->len = h.len;
	m->data = NULL;
	if (h.len) {
		m->data = xmalloc((size_t)h.len + 1);
		rc = fd_read_all(fd, m->data, h.len, timeout_ms);
		if (rc <= 0) {
			free(m->data);
			m->data = NULL;
			return rc == 0 ? -EPIPE : rc;
		}
		m->data[h.len] = '\0';
	}
	return 1;
}

/* A fixed-size message body: copied into @out when @m is exactly @len bytes long (1), else 0. */
int msg_copy(const struct msg *m, void *out, size_t len)
{
	if (m->len != len)
		return 0;
	memcpy(out, m->data, len);
	return 1;
}

/* ------------------------------------------------------------------------ */
/* In-memory message queues (loop transport: peers are threads)              */

struct qmsg {
	struct qmsg *next;
	struct msg m;
};

int mq_init(struct mq *q)
{
	pthread_condattr_t ca;

	memset(q, 0, sizeof(*q));
	if (pthread_mutex_init(&q->mu, NULL))
		return -ENOMEM;
	if (pthread_condattr_init(&ca))
		return -ENOMEM;
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	if (pthread_cond_init(&q->cv, &ca)) {
		pthread_condattr_destroy(&ca);
		return -ENOMEM;
	}
	pthread_condattr_destroy(&ca);
	return 0;
}

static int mq_put(struct mq *q, uint32_t type, int rank, const void *data, uint32_t len)
{
	struct qmsg *e = xcalloc(1, sizeof(*e));

	e->m.type = type;
	e->m.rank = rank;
	e->m.len = len;
	if (len) {
		e->m.data = xmalloc((size_t)len + 1);
		memcpy(e->m.data, data, len);
		e->m.data[len] = '\0';
	}
	pthread_mutex_lock(&q->mu);
	if (q->tail)
		q->tail->next = e;
	else
		q->head = e;
	q->tail = e;
	pthread_cond_signal(&q->cv);
	pthread_mutex_unlock(&q->mu);
	return 0;
}

/* 1 with a message, 0 on timeout. */
int mq_get(struct mq *q, struct msg *m, int timeout_ms)
{
	struct timespec dl;
	struct qmsg *e;

	clock_gettime(CLOCK_MONOTONIC, &dl);
	dl.tv_sec += timeout_ms / 1000;
	dl.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
	if (dl.tv_nsec >= 1000000000L) {
		dl.tv_sec++;
		dl.tv_nsec -= 1000000000L;
	}
	pthread_mutex_lock(&q->mu);
	while (!q->head) {
		int rc = pthread_cond_timedwait(&q->cv, &q->mu, &dl);

		if (rc == ETIMEDOUT && !q->head) {
			pthread_mutex_unlock(&q->mu);
			return 0;
		}
	}
	e = q->head;
	q->head = e->next;
	if (!q->head)
		q->tail = NULL;
	pthread_mutex_unlock(&q->mu);
	*m = e->m;
	free(e);
	return 1;
}

/* ------------------------------------------------------------------------ */
/* Channels                                                                  */

int chan_send(const struct chan *c, uint32_t type, int rank, const void *data,
		     uint32_t len, int timeout_ms)
{
	if (c->q)
		return mq_put(c->q, type, rank, data, len);
	return fd_send_msg(c->fd, type, rank, data, len, timeout_ms);
}

/* 1 with a message, 0 on timeout, -EPIPE when the other side is gone. */
int chan_recv(const struct chan *c, struct msg *m, int timeout_ms)
{
	int rc;

	if (c->q)
		return mq_get(c->q, m, timeout_ms);
	rc = fd_recv_msg(c->fd, m, timeout_ms);
	if (rc == 0)
		return -EPIPE;
	if (rc == -ETIMEDOUT)
		return 0;
	return rc;
}
