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
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <moshpit/moshpit.h>

#include "codec.h"
#include "fake_cuda.h"
#include "mp_kernels.h"

struct fk_state fk = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER,
		      .rdma_order = 1,
		      .gate_rank = -1};

static void fk_dev_start(void);

static void fk_protect(const struct fk_mem *m, int prot)
{
	/* Not a cmocka assertion: this runs on the library's threads too. */
	if (mprotect(m->base, m->maplen, prot))
		abort();
}

/* An allocation of dev_alloc: fake device memory as a peer's buffer is. */
struct fk_dalloc {
	char *base;
	size_t len, maplen;
	int rank;
	struct fk_dalloc *next;
};

static int fk_inside(const char *base, size_t blen, const void *p, size_t len)
{
	const char *c = p;

	return base && c >= base && (size_t)(c - base) <= blen && len <= blen - (size_t)(c - base);
}

/* Under fk.mu: the mapping of the fake device memory that holds
 * [p, p + len), a peer's buffer or an allocation; 0 if none does. */
static int fk_region(const void *p, size_t len, char **base, size_t *maplen)
{
	for (int r = 0; r < FK_MAXP; r++) {
		if (fk_inside(fk.mem[r].base, fk.mem[r].len, p, len)) {
			*base = fk.mem[r].base;
			*maplen = fk.mem[r].maplen;
			return 1;
		}
	}
	for (struct fk_dalloc *a = fk.dallocs; a; a = a->next) {
		if (fk_inside(a->base, a->len, p, len)) {
			*base = a->base;
			*maplen = a->maplen;
			return 1;
		}
	}
	return 0;
}

/* Under fk.mu: [p, p + len) must be fake device memory (an empty range
 * names none: the real calls take any pointer with nothing to do). */
static void fk_check_dev(const void *p, size_t len, const char *what)
{
	char *b;
	size_t ml;

	if (len && !fk_region(p, len, &b, &ml)) {
		fprintf(stderr, "fake_cuda: %s: %p (%zu bytes) is not fake device memory\n", what, p,
			len);
		abort();
	}
}

static int fk_overlaps(const char *base, size_t blen, const void *p, size_t len)
{
	const char *c = p;

	return base && len && c < base + blen && c + len > base;
}

/* Under fk.mu: [p, p + len) must not touch fake device memory. */
static void fk_check_host(const void *p, size_t len, const char *what)
{
	int bad = 0;

	for (int r = 0; r < FK_MAXP; r++)
		bad |= fk_overlaps(fk.mem[r].base, fk.mem[r].maplen, p, len);
	for (struct fk_dalloc *a = fk.dallocs; a; a = a->next)
		bad |= fk_overlaps(a->base, a->maplen, p, len);
	if (bad) {
		fprintf(stderr, "fake_cuda: %s: host side %p (%zu bytes) is fake device memory\n",
			what, p, len);
		abort();
	}
}

/* Under fk.mu: open (or close, PROT_NONE) the device memory of [p, p + len). */
static void fk_open(const void *p, size_t len, int prot)
{
	char *b;
	size_t ml;

	if (!len)
		return;
	if (!fk_region(p, len, &b, &ml) || mprotect(b, ml, prot))
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

void fk_dread(const void *dev, void *dst, size_t len)
{
	pthread_mutex_lock(&fk.mu);
	fk_check_dev(dev, len, "fk_dread");
	fk_open(dev, len, PROT_READ);
	memcpy(dst, dev, len);
	fk_open(dev, len, PROT_NONE);
	pthread_mutex_unlock(&fk.mu);
}

void fk_dwrite(void *dev, const void *src, size_t len)
{
	pthread_mutex_lock(&fk.mu);
	fk_check_dev(dev, len, "fk_dwrite");
	fk_open(dev, len, PROT_READ | PROT_WRITE);
	memcpy(dev, src, len);
	fk_open(dev, len, PROT_NONE);
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

/* Pinned host memory: its length sits in a header before it, for the
 * counts of bytes in use; 64-byte aligned, as a cache line. */
#define FK_HOST_HDR 64

static int fk_host_alloc(const struct mp_stage_dev *d, size_t len, void **host)
{
	void *p = NULL;

	(void)d;
	if (len > SIZE_MAX - FK_HOST_HDR || posix_memalign(&p, 64, FK_HOST_HDR + len))
		return -ENOMEM;
	memcpy(p, &len, sizeof(len));
	*host = (char *)p + FK_HOST_HDR;
	pthread_mutex_lock(&fk.mu);
	fk.allocs++;
	fk.host_live += len;
	if (fk.host_live > fk.host_peak)
		fk.host_peak = fk.host_live;
	pthread_mutex_unlock(&fk.mu);
	return 0;
}

static void fk_host_free(const struct mp_stage_dev *d, void *host)
{
	char *p = (char *)host - FK_HOST_HDR;
	size_t len;

	(void)d;
	if (!host)
		return;
	memcpy(&len, p, sizeof(len));
	free(p);
	pthread_mutex_lock(&fk.mu);
	fk.frees++;
	fk.host_live -= len;
	pthread_mutex_unlock(&fk.mu);
}

/* ---- the device: streams, events and their queues ---------------------- */

enum { OP_COPY_IN, OP_COPY_OUT, OP_RECORD, OP_WAIT_EVENT, OP_WAIT_VALUE, OP_WRITE, OP_PROBE,
       OP_HOLD, OP_D2D, OP_FILL32, OP_ENCODE, OP_DECODE, OP_NONFINITE };

struct fk_event {
	unsigned recorded, completed; /* records queued, and run */
	int refs;                     /* operations queued that name it */
	int dead;                     /* destroyed: freed with its last operation */
};

struct fk_op {
	int kind;
	struct timespec not_before;   /* CLOCK_MONOTONIC */
	struct fk_mem *m;             /* copies: the peer's buffer staged (NULL: device path) */
	int op;                       /* copies: the operation's index */
	/* The device memory it uses: opened while it runs; dev_free refuses
	 * an allocation that one still queued names. */
	struct {
		const void *p;
		size_t len;
	} dr[4];
	int ndr;
	int codec;                    /* the kernels */
	struct mp_codec_params prm;
	size_t count;
	float w;
	int acc;
	int malformed;      /* decode: taken as malformed (fk.bad_decode_after) */
	char *res;          /* encode of a sparse codec: the residue (error feedback) */
	size_t *outlen;     /* ... and where its length goes, *ran set with it */
	uint32_t *status;
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
		if (o->m && o->m->rank == fk.gate_rank && o->op == fk.gate_op) {
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

/* Under fk.mu: @o's device memory opened with @prot, or closed (PROT_NONE). */
static void fk_open_op(const struct fk_op *o, int prot)
{
	for (int i = 0; i < o->ndr; i++)
		fk_open(o->dr[i].p, o->dr[i].len, prot);
}

/* The CPU encoder on the opened memory: the length was promised when the
 * call returned. */
static void fk_run_encode(struct fk_op *o)
{
	const struct mp_codec_ops *c = mp_codec_by_id((unsigned)o->codec);
	size_t sb = c->scratch_size ? c->scratch_size(&o->prm, o->count) : 0, got = 0;
	void *scratch = NULL;

	if (sb && posix_memalign(&scratch, 64, sb))
		abort();
	int rc = c->encode(&o->prm, (const float *)o->src, (float *)o->res, o->count, o->dst, o->len,
			   &got, scratch);
	free(scratch);
	if (o->outlen) {
		/* Sparse: the length is found here, and the caller waits for it. */
		if (rc) {
			fprintf(stderr, "fake_cuda: %s encode of %zu values: %d\n", c->name, o->count, rc);
			abort();
		}
		*o->outlen = got;
		*o->ran = 1;
		return;
	}
	if (rc || got != o->len) {
		fprintf(stderr, "fake_cuda: %s encode of %zu values: %d, %zu bytes where %zu were "
			"promised\n", c->name, o->count, rc, got, o->len);
		abort();
	}
}

/* The CPU decoder into a temporary, then to the destination as the real
 * kernels write it, unless the status word says a payload was bad. */
static void fk_run_decode(struct fk_op *o)
{
	const struct mp_codec_ops *c = mp_codec_by_id((unsigned)o->codec);
	float *tmp;

	if (o->status && *o->status)
		return;
	tmp = malloc(o->count ? o->count * sizeof(float) : 1);
	if (!tmp)
		abort();
	if (o->malformed || c->decode(o->src, o->len, tmp, o->count)) {
		if (!o->status)
			abort(); /* only codecs whose length says all are decoded without one */
		*o->status |= MP_DEVK_BAD;
	} else if (o->acc) {
		mp_k_axpy((float *)o->dst, tmp, o->w, o->count);
	} else if (o->count) {
		memcpy(o->dst, tmp, o->count * sizeof(float));
	}
	free(tmp);
}

/* Under fk.mu: run @o. */
static void fk_run(struct fk_op *o)
{
	struct fk_mem *m = o->m;

	switch (o->kind) {
	case OP_COPY_IN:
		fk_open_op(o, PROT_READ);
		memcpy(o->dst, o->src, o->len);
		fk_open_op(o, PROT_NONE);
		for (size_t i = 0; m && i < o->len; i++)
			m->n_in[(size_t)(o->src - m->base) + i]++;
		break;
	case OP_COPY_OUT:
		fk_open_op(o, PROT_READ | PROT_WRITE);
		memcpy(o->dst, o->src, o->len);
		fk_open_op(o, PROT_NONE);
		for (size_t i = 0; m && i < o->len; i++)
			m->n_out[(size_t)(o->dst - m->base) + i]++;
		break;
	case OP_D2D:
		fk_open_op(o, PROT_READ | PROT_WRITE);
		memmove(o->dst, o->src, o->len);
		fk_open_op(o, PROT_NONE);
		break;
	case OP_FILL32:
		fk_open_op(o, PROT_READ | PROT_WRITE);
		for (size_t i = 0; i < o->count; i++)
			memcpy(o->dst + 4 * i, &o->value, 4);
		fk_open_op(o, PROT_NONE);
		break;
	case OP_ENCODE:
		fk_open_op(o, PROT_READ | PROT_WRITE);
		fk_run_encode(o);
		fk_open_op(o, PROT_NONE);
		break;
	case OP_DECODE:
		fk_open_op(o, PROT_READ | PROT_WRITE);
		fk_run_decode(o);
		fk_open_op(o, PROT_NONE);
		break;
	case OP_NONFINITE:
		fk_open_op(o, PROT_READ | PROT_WRITE);
		for (size_t i = 0; i < o->count; i++) {
			float v;
			memcpy(&v, o->src + 4 * i, 4);
			if (!isfinite(v)) {
				*o->status |= 1u;
				break;
			}
		}
		fk_open_op(o, PROT_NONE);
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

/* Under fk.mu: queue @o (a copy of the caller's) on @s, to run no sooner
 * than @delay_ms from now. */
static void fk_push(struct fk_stream *s, const struct fk_op *o, int delay_ms)
{
	struct fk_op *n = malloc(sizeof(*n));

	if (!n)
		abort();
	*n = *o;
	fk_after_ms(&n->not_before, delay_ms);
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
		fk_push(s, &o, 0);
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
		fk_push(fk_stream_of(stream), &o, 0);
	}
	pthread_mutex_unlock(&fk.mu);
	return 0;
}

static int fk_copy_async(const struct mp_stage_dev *d, void *dst, const void *src, size_t len,
			 int to_device, void *stream)
{
	struct fk_mem *m = d->ctx;
	const void *dev = to_device ? dst : src;
	int rc = 0, op = -1;

	pthread_mutex_lock(&fk.mu);
	fk_check_dev(dev, len, "copy_async");
	fk_check_host(to_device ? src : dst, len, "copy_async");
	/* The staging's copies are those of the peer's own buffer; the
	 * device path's, of its allocations, belong to no operation. */
	int staged = fk_inside(m->base, m->len, dev, len);
	if (staged) {
		/* The copy back belongs to the operation whose copy in came last. */
		op = to_device ? m->in_calls - 1 : m->in_calls++;
		unsigned fail = op >= 0 && op < FK_MAXOPS ? (to_device ? fk.fail_out : fk.fail_in)[op] : 0;
		if (fail & (1u << m->rank))
			rc = -EIO;
	}
	if (!to_device && ++fk.d2h_calls[m->rank] == fk.fail_d2h_after[m->rank])
		rc = -EIO;
	if (!rc) {
		struct fk_op o = {.kind = to_device ? OP_COPY_OUT : OP_COPY_IN, .m = staged ? m : NULL,
				  .op = op, .dst = dst, .src = src, .len = len, .ndr = 1};
		o.dr[0].p = dev;
		o.dr[0].len = len;
		fk_push(fk_stream_of(stream), &o, fk.copy_delay_ms);
		(to_device ? fk.h2d_bytes : fk.d2h_bytes)[m->rank] += len;
		if (!to_device && len > fk.d2h_max[m->rank])
			fk.d2h_max[m->rank] = len;
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
		fk_push(s, &o, 0);
	}
	pthread_mutex_unlock(&fk.mu);
	return rc;
}

/* ---- the device path: allocations, device copies, fills ---------------- */

static int fk_dev_alloc(const struct mp_stage_dev *d, size_t len, void **dptr)
{
	struct fk_dalloc *a;
	long pg = sysconf(_SC_PAGESIZE);

	if (!len)
		return -ENOMEM; /* cuMemAlloc refuses 0 bytes */
	a = calloc(1, sizeof(*a));
	if (!a)
		return -ENOMEM;
	a->maplen = (len + (size_t)pg - 1) & ~((size_t)pg - 1);
	/* Page aligned: more than cuMemAlloc's 256 bytes. */
	a->base = mmap(NULL, a->maplen, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (a->base == MAP_FAILED) {
		free(a);
		return -ENOMEM;
	}
	a->len = len;
	a->rank = ((const struct fk_mem *)d->ctx)->rank;
	pthread_mutex_lock(&fk.mu);
	fk_dev_start();
	a->next = fk.dallocs;
	fk.dallocs = a;
	fk.dev_bytes += len;
	if (++fk.dev_live > fk.dev_peak)
		fk.dev_peak = fk.dev_live;
	pthread_mutex_unlock(&fk.mu);
	*dptr = a->base;
	return 0;
}

/* Under fk.mu: does work still queued name [base, base + len)? */
static int fk_queued_use(const char *base, size_t len)
{
	for (struct fk_stream *s = fk.all; s; s = s->next)
		for (struct fk_op *o = s->head; o; o = o->next)
			for (int i = 0; i < o->ndr; i++)
				if (fk_overlaps(base, len, o->dr[i].p, o->dr[i].len))
					return 1;
	return 0;
}

static void fk_dev_free(const struct mp_stage_dev *d, void *dptr)
{
	struct fk_dalloc **pp, *a = NULL;

	(void)d;
	if (!dptr)
		return;
	pthread_mutex_lock(&fk.mu);
	for (pp = &fk.dallocs; *pp; pp = &(*pp)->next)
		if ((*pp)->base == dptr) {
			a = *pp;
			break;
		}
	if (!a) {
		fprintf(stderr, "fake_cuda: dev_free(%p): not an allocation of dev_alloc\n", dptr);
		abort();
	}
	/* The contract: freed once nothing queued uses it. The real driver
	 * might let the work run on freed memory, or not: the fake says so. */
	if (fk_queued_use(a->base, a->len)) {
		fprintf(stderr, "fake_cuda: dev_free(%p): work still queued uses it\n", dptr);
		abort();
	}
	*pp = a->next;
	fk.dev_live--;
	fk.dev_bytes -= a->len;
	pthread_mutex_unlock(&fk.mu);
	munmap(a->base, a->maplen);
	free(a);
}

/* Under fk.mu: a stream of another peer's context than @d's memory, on
 * which a kernel or a device copy fails at launch as on the driver. */
static int fk_foreign(const struct mp_stage_dev *d, const struct fk_stream *s, const char *what)
{
	char why[160];

	if (fk_wrong_ctx(d, s, why, sizeof(why))) {
		fprintf(stderr, "fake_cuda: %s: %s\n", what, why);
		return 1;
	}
	return 0;
}

static int fk_copy_d2d(const struct mp_stage_dev *d, void *dst, const void *src, size_t len,
		       void *stream)
{
	int rc = 0;

	pthread_mutex_lock(&fk.mu);
	fk_check_dev(dst, len, "copy_d2d");
	fk_check_dev(src, len, "copy_d2d");
	struct fk_stream *s = fk_stream_of(stream);
	if (fk_foreign(d, s, "copy_d2d")) {
		rc = -EIO;
	} else {
		struct fk_op o = {.kind = OP_D2D, .dst = dst, .src = src, .len = len, .ndr = 2};
		o.dr[0].p = dst;
		o.dr[0].len = len;
		o.dr[1].p = src;
		o.dr[1].len = len;
		fk_push(s, &o, fk.copy_delay_ms);
	}
	pthread_mutex_unlock(&fk.mu);
	return rc;
}

static int fk_fill32(const struct mp_stage_dev *d, void *dst, uint32_t word, size_t count,
		     void *stream)
{
	int rc = 0;

	if (count > SIZE_MAX / 4 || (uintptr_t)dst % 4)
		return -EIO; /* cuMemsetD32 wants 4-byte alignment */
	pthread_mutex_lock(&fk.mu);
	fk_check_dev(dst, 4 * count, "fill32");
	struct fk_stream *s = fk_stream_of(stream);
	if (fk_foreign(d, s, "fill32")) {
		rc = -EIO;
	} else {
		struct fk_op o = {.kind = OP_FILL32, .dst = dst, .count = count, .value = word,
				  .ndr = 1};
		o.dr[0].p = dst;
		o.dr[0].len = 4 * count;
		fk_push(s, &o, 0);
	}
	pthread_mutex_unlock(&fk.mu);
	return rc;
}

/* GPUDirect RDMA: what fk.rdma_order says; each flush is counted. */
static int fk_rdma_order(const struct mp_stage_dev *d, char *why, size_t n)
{
	int rc;

	(void)d;
	pthread_mutex_lock(&fk.mu);
	rc = fk.rdma_order;
	pthread_mutex_unlock(&fk.mu);
	if (rc < 0)
		snprintf(why, n, "the fake GPU neither orders a NIC's writes nor can flush them");
	return rc;
}

static int fk_rdma_flush(const struct mp_stage_dev *d)
{
	struct fk_mem *m = d->ctx;

	pthread_mutex_lock(&fk.mu);
	fk.rdma_flushes[m->rank]++;
	pthread_mutex_unlock(&fk.mu);
	return 0;
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
	.dev_alloc = fk_dev_alloc,
	.dev_free = fk_dev_free,
	.copy_d2d = fk_copy_d2d,
	.fill32 = fk_fill32,
	.rdma_order = fk_rdma_order,
	.rdma_flush = fk_rdma_flush,
};

/* ---- the device path: the CPU codecs as kernels ------------------------- */

static const struct mp_codec_ops *fk_codec(int codec)
{
	return codec >= 0 ? mp_codec_by_id((unsigned)codec) : NULL;
}

static int fk_k_usable(const struct mp_stage_dev *d, int codec, char *why, size_t n)
{
	const struct mp_codec_ops *c = fk_codec(codec);
	int off;

	(void)d;
	pthread_mutex_lock(&fk.mu);
	off = fk.no_kernels;
	pthread_mutex_unlock(&fk.mu);
	if (off) {
		snprintf(why, n, "fake: no kernels (fk.no_kernels)");
		return -ENOTSUP;
	}
	if (!c) {
		snprintf(why, n, "fake: no codec %d", codec);
		return -ENOTSUP;
	}
	return 0;
}

/* The settings the CPU codec runs with: @p, or the defaults. */
static struct mp_codec_params fk_params(const struct mp_codec_params *p)
{
	struct mp_codec_params q;

	if (p)
		return *p;
	mp_codec_params_default(&q);
	return q;
}

static size_t fk_k_max_encoded(int codec, const struct mp_codec_params *p, size_t count)
{
	const struct mp_codec_ops *c = fk_codec(codec);
	struct mp_codec_params q = fk_params(p);

	return c ? c->max_encoded(&q, count) : 0;
}

static size_t fk_k_enc_scratch(int codec, const struct mp_codec_params *p, size_t count)
{
	const struct mp_codec_ops *c = fk_codec(codec);
	struct mp_codec_params q = fk_params(p);

	return c && c->scratch_size ? c->scratch_size(&q, count) : 0;
}

static size_t fk_k_dec_scratch(int codec, size_t len, size_t count)
{
	(void)codec, (void)len, (void)count;
	return 0;
}

/* Under fk.mu: count a kernel call of @d's peer; 1 if it is the one to refuse. */
static int fk_k_refused(const struct mp_stage_dev *d)
{
	int r = ((const struct fk_mem *)d->ctx)->rank;

	return ++fk.kernel_calls[r] == fk.fail_kernel_after[r];
}

static int fk_k_encode(const struct mp_stage_dev *d, int codec, const struct mp_codec_params *p,
		       const float *d_src, float *d_residue, size_t count, void *d_dst, size_t cap,
		       size_t *len, void *d_scratch, size_t scratch_bytes, void *stream)
{
	const struct mp_codec_ops *c = fk_codec(codec);
	struct mp_codec_params q = fk_params(p);
	int rc = 0;

	pthread_mutex_lock(&fk.mu);
	int refused = fk_k_refused(d);
	pthread_mutex_unlock(&fk.mu);
	if (refused)
		return -EIO;
	int sparse = c && (c->flags & MP_CODEC_F_SPARSE);
	if (!c || mp_codec_params_check(&q) || count > SIZE_MAX / sizeof(float) ||
	    (d_residue && !sparse))
		return -EINVAL;
	size_t need = c->max_encoded(&q, count);
	size_t sb = c->scratch_size ? c->scratch_size(&q, count) : 0;
	if (sb && (!d_scratch || scratch_bytes < sb))
		return -EINVAL;
	pthread_mutex_lock(&fk.mu);
	fk_check_dev(d_src, count * sizeof(float), "encode (source)");
	fk_check_dev(d_dst, cap, "encode (destination)");
	if (d_scratch && scratch_bytes)
		fk_check_dev(d_scratch, scratch_bytes, "encode (scratch)");
	struct fk_stream *s = fk_stream_of(stream);
	if (fk_foreign(d, s, "encode")) {
		rc = -EIO;
	} else if (cap < need) {
		rc = -ENOSPC;
	} else {
		size_t got = 0;
		int done = 0;
		struct fk_op o = {.kind = OP_ENCODE, .codec = codec, .prm = q, .src = (const char *)d_src,
				  .count = count, .dst = d_dst, .len = need, .ndr = 2};
		o.dr[0].p = d_src;
		o.dr[0].len = count * sizeof(float);
		o.dr[1].p = d_dst;
		o.dr[1].len = need;
		if (sparse) {
			/* As the real kernels: the length is known on the device,
			 * and encode waits for the stream to get there. */
			if (d_residue) {
				fk_check_dev(d_residue, count * sizeof(float), "encode (residue)");
				o.res = (char *)d_residue;
				o.dr[o.ndr].p = d_residue;
				o.dr[o.ndr++].len = count * sizeof(float);
			}
			if (d_scratch && scratch_bytes) {
				o.dr[o.ndr].p = d_scratch;
				o.dr[o.ndr++].len = scratch_bytes;
			}
			o.outlen = &got;
			o.ran = &done;
		}
		fk_push(s, &o, 0);
		struct timespec until;
		clock_gettime(CLOCK_REALTIME, &until);
		until.tv_sec += 10;
		while (sparse && !done && !rc)
			if (pthread_cond_timedwait(&fk.cv, &fk.mu, &until) == ETIMEDOUT && !done)
				rc = -EIO; /* the stream never got there */
		*len = sparse ? got : need;
	}
	pthread_mutex_unlock(&fk.mu);
	return rc;
}

/*
 * What mp_cuda_decode_async checks on the host: the payload's length
 * against @count (-EBADMSG), and a status word for the codecs whose
 * payloads only the device can check (-EINVAL).
 */
static int fk_k_host_check(int codec, size_t len, size_t count, const uint32_t *d_status)
{
	switch (codec) {
	case MP_CODEC_NONE:
		return count > SIZE_MAX / 4 || len != 4 * count ? -EBADMSG : 0;
	case MP_CODEC_FP16:
	case MP_CODEC_BF16:
		return count > SIZE_MAX / 2 || len != 2 * count ? -EBADMSG : 0;
	case MP_CODEC_UNIFORM8:
		if (count > SIZE_MAX - 1024 || len != 1024 + count) /* the table, then a code each */
			return -EBADMSG;
		break;
	case MP_CODEC_BLOCKWISE8:
		/* The block size, a scale per block, a code each. */
		if (count > SIZE_MAX - 4 || len < 4 + count || (len - 4 - count) % 4)
			return -EBADMSG;
		break;
	case MP_CODEC_TOPK:
	case MP_CODEC_ADACOMP:
		if (len < (codec == MP_CODEC_TOPK ? 4u : 12u))
			return -EBADMSG;
		break;
	default:
		return -EINVAL;
	}
	return d_status ? 0 : -EINVAL;
}

static int fk_k_decode(const struct mp_stage_dev *d, int codec, const void *d_payload, size_t len,
		       float *d_dst, size_t count, float w, int acc, uint32_t *d_status,
		       void *d_scratch, size_t scratch_bytes, void *stream)
{
	int rc = 0;

	pthread_mutex_lock(&fk.mu);
	if (fk_k_refused(d)) {
		pthread_mutex_unlock(&fk.mu);
		return -EIO;
	}
	rc = fk_k_host_check(codec, len, count, d_status);
	if (rc) {
		pthread_mutex_unlock(&fk.mu);
		return rc;
	}
	fk_check_dev(d_payload, len, "decode (payload)");
	fk_check_dev(d_dst, count * sizeof(float), "decode (destination)");
	if (d_status)
		fk_check_dev(d_status, sizeof(*d_status), "decode (status)");
	if (d_scratch && scratch_bytes)
		fk_check_dev(d_scratch, scratch_bytes, "decode (scratch)");
	struct fk_stream *s = fk_stream_of(stream);
	if (fk_foreign(d, s, "decode")) {
		rc = -EIO;
	} else {
		int r = ((const struct fk_mem *)d->ctx)->rank;
		struct fk_op o = {.kind = OP_DECODE, .codec = codec, .src = d_payload, .len = len,
				  .dst = (char *)d_dst, .count = count, .w = w, .acc = acc,
				  .status = d_status, .ndr = d_status ? 3 : 2};
		/* Only a decode with a status word can report a bad payload. */
		o.malformed = d_status && codec != MP_CODEC_NONE &&
			      ++fk.decode_calls[r] == fk.bad_decode_after[r];
		o.dr[0].p = d_payload;
		o.dr[0].len = len;
		o.dr[1].p = d_dst;
		o.dr[1].len = count * sizeof(float);
		o.dr[2].p = d_status;
		o.dr[2].len = sizeof(*d_status);
		fk_push(s, &o, 0);
	}
	pthread_mutex_unlock(&fk.mu);
	return rc;
}

static int fk_k_nonfinite(const struct mp_stage_dev *d, const float *d_src, size_t count,
			  uint32_t *d_flag, void *stream)
{
	int rc = 0;

	pthread_mutex_lock(&fk.mu);
	if (fk_k_refused(d)) {
		pthread_mutex_unlock(&fk.mu);
		return -EIO;
	}
	fk_check_dev(d_src, count * sizeof(float), "nonfinite (source)");
	fk_check_dev(d_flag, sizeof(*d_flag), "nonfinite (flag)");
	struct fk_stream *s = fk_stream_of(stream);
	if (fk_foreign(d, s, "nonfinite")) {
		rc = -EIO;
	} else {
		struct fk_op o = {.kind = OP_NONFINITE, .src = (const char *)d_src, .count = count,
				  .status = d_flag, .ndr = 2};
		o.dr[0].p = d_src;
		o.dr[0].len = count * sizeof(float);
		o.dr[1].p = d_flag;
		o.dr[1].len = sizeof(*d_flag);
		fk_push(s, &o, 0);
	}
	pthread_mutex_unlock(&fk.mu);
	return rc;
}

const struct mp_devk_ops fk_devk_ops = {
	.name = "CUDA kernels (fake: the CPU codecs)",
	.usable = fk_k_usable,
	.max_encoded = fk_k_max_encoded,
	.enc_scratch = fk_k_enc_scratch,
	.encode = fk_k_encode,
	.dec_scratch = fk_k_dec_scratch,
	.decode = fk_k_decode,
	.nonfinite = fk_k_nonfinite,
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
	pthread_mutex_lock(&fk.mu);
	fk_push(fk_stream_of(s), &o, delay_ms);
	pthread_mutex_unlock(&fk.mu);
}

void fk_probe(struct fk_stream *s, int rank, size_t off, void *dst, size_t len, int *ran)
{
	struct fk_mem *m = &fk.mem[rank];
	struct fk_op o = {.kind = OP_PROBE, .m = m, .dst = dst, .src = m->base + off, .len = len,
			  .ran = ran};

	assert_true(off + len <= m->len);
	pthread_mutex_lock(&fk.mu);
	fk_push(fk_stream_of(s), &o, 0);
	pthread_mutex_unlock(&fk.mu);
}

void fk_hold(struct fk_stream *s, const int *go)
{
	struct fk_op o = {.kind = OP_HOLD, .go = go};

	pthread_mutex_lock(&fk.mu);
	fk_push(fk_stream_of(s), &o, 0);
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
	/* Allocations a failed test left. */
	while (fk.dallocs) {
		struct fk_dalloc *a = fk.dallocs;
		fk.dallocs = a->next;
		munmap(a->base, a->maplen);
		free(a);
	}
	fk.dev_live = 0;
	fk.dev_bytes = 0;
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
	fk.host_peak = fk.host_live;
	fk.dev_peak = fk.dev_live;
	fk.no_kernels = 0;
	memset(fk.d2h_calls, 0, sizeof(fk.d2h_calls));
	memset(fk.d2h_bytes, 0, sizeof(fk.d2h_bytes));
	memset(fk.h2d_bytes, 0, sizeof(fk.h2d_bytes));
	memset(fk.d2h_max, 0, sizeof(fk.d2h_max));
	memset(fk.rdma_flushes, 0, sizeof(fk.rdma_flushes));
	fk.rdma_order = 1;
	memset(fk.kernel_calls, 0, sizeof(fk.kernel_calls));
	memset(fk.fail_d2h_after, 0, sizeof(fk.fail_d2h_after));
	memset(fk.fail_kernel_after, 0, sizeof(fk.fail_kernel_after));
	memset(fk.decode_calls, 0, sizeof(fk.decode_calls));
	memset(fk.bad_decode_after, 0, sizeof(fk.bad_decode_after));
	pthread_mutex_unlock(&fk.mu);
}
