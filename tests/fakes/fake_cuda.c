/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * A FAKE of the CUDA driver behind the core's host staging, for tests: see
 * fake_cuda.h for what it plays and how faithfully.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "fake_cuda.h"

struct fk_state fk = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER,
		      .gate_rank = -1};

static void fk_dev_start(void);

static void fk_protect(const struct fk_mem *m, int prot)
{
	/* Not a cmocka assertion: this runs on the library's threads too. */
	if (mprotect(m->base, m->maplen, prot))
		abort();
}

static void fk_check_range(const struct fk_mem *m, const void *p, size_t len)
{
	if ((const char *)p < m->base || (const char *)p + len > m->base + m->len)
		abort();
}

void fk_mem_init(int rank, size_t len)
{
	struct fk_mem *m = &fk.mem[rank];
	long pg = sysconf(_SC_PAGESIZE);

	m->maplen = (len + (size_t)pg - 1) & ~((size_t)pg - 1);
	m->base = mmap(NULL, m->maplen, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	assert_true(m->base != MAP_FAILED);
	m->len = len;
	m->rank = rank;
	m->in_calls = 0;
	m->n_in = calloc(len, 1);
	m->n_out = calloc(len, 1);
	assert_non_null(m->n_in);
	assert_non_null(m->n_out);
	pthread_mutex_lock(&fk.mu);
	fk_dev_start();
	pthread_mutex_unlock(&fk.mu);
}

void fk_mem_fini(int rank)
{
	struct fk_mem *m = &fk.mem[rank];

	munmap(m->base, m->maplen);
	free(m->n_in);
	free(m->n_out);
	memset(m, 0, sizeof(*m));
}

void fk_read(int rank, size_t off, void *dst, size_t len)
{
	struct fk_mem *m = &fk.mem[rank];

	pthread_mutex_lock(&fk.mu);
	fk_protect(m, PROT_READ);
	memcpy(dst, m->base + off, len);
	fk_protect(m, PROT_NONE);
	pthread_mutex_unlock(&fk.mu);
}

void fk_write(int rank, size_t off, const void *src, size_t len)
{
	struct fk_mem *m = &fk.mem[rank];

	pthread_mutex_lock(&fk.mu);
	fk_protect(m, PROT_READ | PROT_WRITE);
	memcpy(m->base + off, src, len);
	fk_protect(m, PROT_NONE);
	pthread_mutex_unlock(&fk.mu);
}

static int fk_query(void *ptr, size_t len, struct mp_stage_dev *d, char *why, size_t n)
{
	struct fk_mem *found = NULL;

	pthread_mutex_lock(&fk.mu);
	for (int r = 0; r < FK_MAXP; r++) {
		struct fk_mem *m = &fk.mem[r];
		if (m->base && (char *)ptr >= m->base && (char *)ptr + len <= m->base + m->len)
			found = m;
	}
	if (found)
		fk.queries++;
	pthread_mutex_unlock(&fk.mu);
	if (!found) {
		snprintf(why, n, "fake: %p is not device memory", ptr);
		return -EINVAL;
	}
	d->ctx = found;
	d->device = -1;
	return 0;
}

static void fk_release(struct mp_stage_dev *d)
{
	(void)d;
	pthread_mutex_lock(&fk.mu);
	fk.releases++;
	pthread_mutex_unlock(&fk.mu);
}

static int fk_host_alloc(const struct mp_stage_dev *d, size_t len, void **host)
{
	(void)d;
	*host = malloc(len);
	if (!*host)
		return -ENOMEM;
	pthread_mutex_lock(&fk.mu);
	fk.allocs++;
	pthread_mutex_unlock(&fk.mu);
	return 0;
}

static void fk_host_free(const struct mp_stage_dev *d, void *host)
{
	(void)d;
	free(host);
	pthread_mutex_lock(&fk.mu);
	fk.frees++;
	pthread_mutex_unlock(&fk.mu);
}

/* ---- the device: streams, events and their queues ---------------------- */

enum { OP_COPY_IN, OP_COPY_OUT, OP_RECORD, OP_WAIT_EVENT, OP_WAIT_VALUE, OP_WRITE, OP_PROBE,
       OP_HOLD };

struct fk_event {
	unsigned recorded, completed; /* records queued, and run */
	int refs;                     /* operations queued that name it */
	int dead;                     /* destroyed: freed with its last operation */
};

struct fk_op {
	int kind;
	struct timespec not_before;   /* CLOCK_MONOTONIC */
	struct fk_mem *m;
	int op;                       /* copies: the operation's index */
	char *dst;
	const char *src;
	size_t len;
	struct fk_event *ev;
	unsigned seq;
	const uint32_t *word;
	uint32_t value;
	void *buf;                    /* OP_WRITE: its bytes, owned */
	int *ran;
	const int *go;                /* OP_HOLD: runs once *go (under fk.mu) */
	struct fk_op *next;
};

struct fk_stream {
	struct fk_mem *ctx;           /* the context it belongs to; NULL: the legacy stream */
	struct fk_op *head, *tail;
	int dead;                     /* destroyed: freed once its queue is empty */
	struct fk_stream *next;       /* fk.all */
};

static struct fk_stream fk_legacy;
static int fk_legacy_listed;

static void fk_after_ms(struct timespec *t, int ms)
{
	clock_gettime(CLOCK_MONOTONIC, t);
	t->tv_sec += ms / 1000;
	t->tv_nsec += (long)(ms % 1000) * 1000000L;
	if (t->tv_nsec >= 1000000000L) {
		t->tv_sec++;
		t->tv_nsec -= 1000000000L;
	}
}

static void fk_event_put(struct fk_event *e)
{
	if (--e->refs == 0 && e->dead)
		free(e);
}

/* Under fk.mu: may @o run now? */
static int fk_ready(struct fk_op *o)
{
	struct timespec now;

	clock_gettime(CLOCK_MONOTONIC, &now);
	if (now.tv_sec < o->not_before.tv_sec ||
	    (now.tv_sec == o->not_before.tv_sec && now.tv_nsec < o->not_before.tv_nsec))
		return 0;
	switch (o->kind) {
	case OP_WAIT_EVENT:
		return (int)(o->ev->completed - o->seq) >= 0;
	case OP_WAIT_VALUE:
		return (int32_t)(__atomic_load_n(o->word, __ATOMIC_ACQUIRE) - o->value) >= 0;
	case OP_HOLD:
		return *o->go;
	case OP_COPY_OUT:
		if (o->m->rank == fk.gate_rank && o->op == fk.gate_op) {
			if (!fk.gate_entered) {
				fk.gate_entered = 1;
				pthread_cond_broadcast(&fk.cv);
			}
			return fk.gate_open;
		}
		return 1;
	default:
		return 1;
	}
}

/* Under fk.mu: run @o. */
static void fk_run(struct fk_op *o)
{
	struct fk_mem *m = o->m;

	switch (o->kind) {
	case OP_COPY_IN:
		fk_protect(m, PROT_READ);
		memcpy(o->dst, o->src, o->len);
		fk_protect(m, PROT_NONE);
		for (size_t i = 0; i < o->len; i++)
			m->n_in[(size_t)(o->src - m->base) + i]++;
		break;
	case OP_COPY_OUT:
		fk_protect(m, PROT_READ | PROT_WRITE);
		memcpy(o->dst, o->src, o->len);
		fk_protect(m, PROT_NONE);
		for (size_t i = 0; i < o->len; i++)
			m->n_out[(size_t)(o->dst - m->base) + i]++;
		break;
	case OP_RECORD:
		o->ev->completed = o->seq;
		fk_event_put(o->ev);
		break;
	case OP_WAIT_EVENT:
		fk_event_put(o->ev);
		break;
	case OP_WRITE:
		fk_protect(m, PROT_READ | PROT_WRITE);
		memcpy(o->dst, o->buf, o->len);
		fk_protect(m, PROT_NONE);
		break;
	case OP_PROBE:
		fk_protect(m, PROT_READ);
		memcpy(o->dst, o->src, o->len);
		fk_protect(m, PROT_NONE);
		*o->ran = 1;
		break;
	default:
		break;
	}
	free(o->buf);
}

/* The device: runs the head of every stream's queue once it is ready. */
static void *fk_device(void *arg)
{
	(void)arg;
	pthread_mutex_lock(&fk.mu);
	while (!fk.dev_stop) {
		int ran = 0;
		for (struct fk_stream **pp = &fk.all; *pp;) {
			struct fk_stream *s = *pp;
			while (s->head && fk_ready(s->head)) {
				struct fk_op *o = s->head;
				fk_run(o);
				s->head = o->next;
				if (!s->head)
					s->tail = NULL;
				free(o);
				ran = 1;
			}
			if (s->dead && !s->head) {
				*pp = s->next;
				free(s);
				continue;
			}
			pp = &s->next;
		}
		if (ran) {
			pthread_cond_broadcast(&fk.cv);
			continue;
		}
		/* Words of host memory change without telling: look again soon. */
		struct timespec dl;
		clock_gettime(CLOCK_REALTIME, &dl);
		dl.tv_nsec += 200000L;
		if (dl.tv_nsec >= 1000000000L) {
			dl.tv_sec++;
			dl.tv_nsec -= 1000000000L;
		}
		pthread_cond_timedwait(&fk.cv, &fk.mu, &dl);
	}
	pthread_mutex_unlock(&fk.mu);
	return NULL;
}

/* Under fk.mu: the device runs (started with the first device memory). */
static void fk_dev_start(void)
{
	if (fk.dev_started)
		return;
	fk.dev_stop = 0;
	if (pthread_create(&fk.dev, NULL, fk_device, NULL))
		abort();
	fk.dev_started = 1;
}

/* Under fk.mu: @s, NULL for the legacy stream, listed for the device. */
static struct fk_stream *fk_stream_of(void *s)
{
	if (s)
		return s;
	if (!fk_legacy_listed) {
		fk_legacy.next = fk.all;
		fk.all = &fk_legacy;
		fk_legacy_listed = 1;
	}
	return &fk_legacy;
}

/* Under fk.mu: queue @o (a copy of the caller's) on @s. */
static void fk_push(struct fk_stream *s, const struct fk_op *o)
{
	struct fk_op *n = malloc(sizeof(*n));

	if (!n)
		abort();
	*n = *o;
	n->next = NULL;
	if (s->tail)
		s->tail->next = n;
	else
		s->head = n;
	s->tail = n;
	pthread_cond_broadcast(&fk.cv);
}

/* A stream of another context than @d's memory: the driver refuses it. */
static int fk_wrong_ctx(const struct mp_stage_dev *d, const struct fk_stream *s, char *why,
			size_t n)
{
	if (s->ctx && s->ctx != d->ctx) {
		snprintf(why, n, "fake: the stream belongs to peer %d's context, the memory to peer %d's",
			 s->ctx->rank, ((const struct fk_mem *)d->ctx)->rank);
		return 1;
	}
	return 0;
}

static int fk_stream_create(const struct mp_stage_dev *d, void **stream)
{
	struct fk_stream *s = calloc(1, sizeof(*s));

	if (!s)
		return -EIO;
	s->ctx = d->ctx;
	pthread_mutex_lock(&fk.mu);
	s->next = fk.all;
	fk.all = s;
	fk.streams++;
	pthread_mutex_unlock(&fk.mu);
	*stream = s;
	return 0;
}

static void fk_stream_destroy(const struct mp_stage_dev *d, void *stream)
{
	struct fk_stream *s = stream;

	(void)d;
	pthread_mutex_lock(&fk.mu);
	s->dead = 1; /* the device frees it once its queue has run */
	fk.streams--;
	pthread_cond_broadcast(&fk.cv);
	pthread_mutex_unlock(&fk.mu);
}

static int fk_event_create(const struct mp_stage_dev *d, void **ev)
{
	struct fk_event *e = calloc(1, sizeof(*e));

	(void)d;
	if (!e)
		return -EIO;
	pthread_mutex_lock(&fk.mu);
	fk.events++;
	pthread_mutex_unlock(&fk.mu);
	*ev = e;
	return 0;
}

static void fk_event_destroy(const struct mp_stage_dev *d, void *ev)
{
	struct fk_event *e = ev;

	(void)d;
	pthread_mutex_lock(&fk.mu);
	fk.events--;
	e->dead = 1;
	e->refs++;
	fk_event_put(e);
	pthread_mutex_unlock(&fk.mu);
}

static int fk_event_record(const struct mp_stage_dev *d, void *ev, void *stream, char *why,
			   size_t n)
{
	struct fk_event *e = ev;
	int rc = 0;

	pthread_mutex_lock(&fk.mu);
	struct fk_stream *s = fk_stream_of(stream);
	if (fk_wrong_ctx(d, s, why, n)) {
		rc = -EINVAL;
	} else {
		struct fk_op o = {.kind = OP_RECORD, .ev = e, .seq = ++e->recorded};
		e->refs++;
		clock_gettime(CLOCK_MONOTONIC, &o.not_before);
		fk_push(s, &o);
	}
	pthread_mutex_unlock(&fk.mu);
	return rc;
}

static int fk_stream_wait_event(const struct mp_stage_dev *d, void *stream, void *ev)
{
	struct fk_event *e = ev;

	(void)d;
	pthread_mutex_lock(&fk.mu);
	/* As CUDA: the event's last record, if it has not completed yet. */
	if (e->completed != e->recorded) {
		struct fk_op o = {.kind = OP_WAIT_EVENT, .ev = e, .seq = e->recorded};
		e->refs++;
		clock_gettime(CLOCK_MONOTONIC, &o.not_before);
		fk_push(fk_stream_of(stream), &o);
	}
	pthread_mutex_unlock(&fk.mu);
	return 0;
}

static int fk_copy_async(const struct mp_stage_dev *d, void *dst, const void *src, size_t len,
			 int to_device, void *stream)
{
	struct fk_mem *m = d->ctx;
	int rc = 0;

	pthread_mutex_lock(&fk.mu);
	fk_check_range(m, to_device ? dst : src, len);
	/* The copy back belongs to the operation whose copy in came last. */
	int op = to_device ? m->in_calls - 1 : m->in_calls++;
	unsigned fail = op >= 0 && op < FK_MAXOPS ? (to_device ? fk.fail_out : fk.fail_in)[op] : 0;
	if (fail & (1u << m->rank)) {
		rc = -EIO;
	} else {
		struct fk_op o = {.kind = to_device ? OP_COPY_OUT : OP_COPY_IN, .m = m, .op = op,
				  .dst = dst, .src = src, .len = len};
		fk_after_ms(&o.not_before, fk.copy_delay_ms);
		fk_push(fk_stream_of(stream), &o);
	}
	pthread_mutex_unlock(&fk.mu);
	return rc;
}

static int fk_event_query(const struct mp_stage_dev *d, void *ev)
{
	struct fk_event *e = ev;
	int rc;

	(void)d;
	pthread_mutex_lock(&fk.mu);
	rc = e->completed == e->recorded ? 0 : -EAGAIN;
	pthread_mutex_unlock(&fk.mu);
	return rc;
}

static int fk_wait_value(const struct mp_stage_dev *d, void *stream, const uint32_t *word,
			 uint32_t value, char *why, size_t n)
{
	int rc = 0;

	pthread_mutex_lock(&fk.mu);
	struct fk_stream *s = fk_stream_of(stream);
	if (fk.no_memops) {
		snprintf(why, n, "fake: the device has no stream memory operations");
		rc = -ENOTSUP;
	} else if (fk_wrong_ctx(d, s, why, n)) {
		rc = -EINVAL;
	} else {
		struct fk_op o = {.kind = OP_WAIT_VALUE, .word = word, .value = value};
		clock_gettime(CLOCK_MONOTONIC, &o.not_before);
		fk_push(s, &o);
	}
	pthread_mutex_unlock(&fk.mu);
	return rc;
}

const struct mp_stage_dev_ops fk_ops = {
	.name = "CUDA",
	.query = fk_query,
	.release = fk_release,
	.host_alloc = fk_host_alloc,
	.host_free = fk_host_free,
	.stream_create = fk_stream_create,
	.stream_destroy = fk_stream_destroy,
	.event_create = fk_event_create,
	.event_destroy = fk_event_destroy,
	.event_record = fk_event_record,
	.stream_wait_event = fk_stream_wait_event,
	.copy_async = fk_copy_async,
	.event_query = fk_event_query,
	.wait_value = fk_wait_value,
};

/* ---- the application's side --------------------------------------------- */

struct fk_stream *fk_stream_new(int rank)
{
	struct fk_stream *s = calloc(1, sizeof(*s));

	assert_non_null(s);
	s->ctx = &fk.mem[rank];
	pthread_mutex_lock(&fk.mu);
	s->next = fk.all;
	fk.all = s;
	pthread_mutex_unlock(&fk.mu);
	return s;
}

int fk_stream_sync(struct fk_stream *s, int timeout_ms)
{
	struct timespec dl;
	int rc = 0;

	clock_gettime(CLOCK_REALTIME, &dl);
	dl.tv_sec += timeout_ms / 1000;
	dl.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
	if (dl.tv_nsec >= 1000000000L) {
		dl.tv_sec++;
		dl.tv_nsec -= 1000000000L;
	}
	pthread_mutex_lock(&fk.mu);
	s = fk_stream_of(s);
	while (s->head && !rc)
		rc = pthread_cond_timedwait(&fk.cv, &fk.mu, &dl) == ETIMEDOUT && s->head ? -ETIMEDOUT : 0;
	pthread_mutex_unlock(&fk.mu);
	return rc;
}

void fk_stream_free(struct fk_stream *s)
{
	pthread_mutex_lock(&fk.mu);
	s->dead = 1;
	pthread_cond_broadcast(&fk.cv);
	pthread_mutex_unlock(&fk.mu);
}

void fk_kernel_write(struct fk_stream *s, int rank, size_t off, const void *src, size_t len,
		     int delay_ms)
{
	struct fk_mem *m = &fk.mem[rank];
	struct fk_op o = {.kind = OP_WRITE, .m = m, .dst = m->base + off, .len = len};

	assert_true(off + len <= m->len);
	o.buf = malloc(len);
	assert_non_null(o.buf);
	memcpy(o.buf, src, len);
	fk_after_ms(&o.not_before, delay_ms);
	pthread_mutex_lock(&fk.mu);
	fk_push(fk_stream_of(s), &o);
	pthread_mutex_unlock(&fk.mu);
}

void fk_probe(struct fk_stream *s, int rank, size_t off, void *dst, size_t len, int *ran)
{
	struct fk_mem *m = &fk.mem[rank];
	struct fk_op o = {.kind = OP_PROBE, .m = m, .dst = dst, .src = m->base + off, .len = len,
			  .ran = ran};

	assert_true(off + len <= m->len);
	clock_gettime(CLOCK_MONOTONIC, &o.not_before);
	pthread_mutex_lock(&fk.mu);
	fk_push(fk_stream_of(s), &o);
	pthread_mutex_unlock(&fk.mu);
}

void fk_hold(struct fk_stream *s, const int *go)
{
	struct fk_op o = {.kind = OP_HOLD, .go = go};

	clock_gettime(CLOCK_MONOTONIC, &o.not_before);
	pthread_mutex_lock(&fk.mu);
	fk_push(fk_stream_of(s), &o);
	pthread_mutex_unlock(&fk.mu);
}

void fk_let_go(int *go)
{
	pthread_mutex_lock(&fk.mu);
	*go = 1;
	pthread_cond_broadcast(&fk.cv);
	pthread_mutex_unlock(&fk.mu);
}

void fk_shutdown(void)
{
	pthread_mutex_lock(&fk.mu);
	int started = fk.dev_started;
	fk.dev_stop = 1;
	pthread_cond_broadcast(&fk.cv);
	pthread_mutex_unlock(&fk.mu);
	if (started)
		pthread_join(fk.dev, NULL);
	fk.dev_started = 0;
	/* What never ran (a test that failed half way) goes too. */
	while (fk.all) {
		struct fk_stream *s = fk.all;
		fk.all = s->next;
		while (s->head) {
			struct fk_op *o = s->head;
			s->head = o->next;
			free(o->buf);
			free(o);
		}
		if (s != &fk_legacy)
			free(s);
	}
	fk_legacy_listed = 0;
}

void fk_reset(void)
{
	pthread_mutex_lock(&fk.mu);
	memset(fk.fail_in, 0, sizeof(fk.fail_in));
	memset(fk.fail_out, 0, sizeof(fk.fail_out));
	fk.gate_rank = fk.gate_op = -1;
	fk.gate_entered = fk.gate_open = 0;
	fk.copy_delay_ms = 0;
	fk.no_memops = 0;
	fk.queries = fk.releases = fk.allocs = fk.frees = 0;
	pthread_mutex_unlock(&fk.mu);
}
