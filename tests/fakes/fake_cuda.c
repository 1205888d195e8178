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

static int fk_to_host(const struct mp_stage_dev *d, void *host, const void *dev, size_t len)
{
	struct fk_mem *m = d->ctx;
	int rc = 0;

	pthread_mutex_lock(&fk.mu);
	fk_check_range(m, dev, len);
	int op = m->in_calls++;
	if (op < FK_MAXOPS && (fk.fail_in[op] & (1u << m->rank))) {
		rc = -EIO;
	} else {
		size_t off = (size_t)((const char *)dev - m->base);
		fk_protect(m, PROT_READ);
		memcpy(host, dev, len);
		fk_protect(m, PROT_NONE);
		for (size_t i = 0; i < len; i++)
			m->n_in[off + i]++;
	}
	pthread_mutex_unlock(&fk.mu);
	return rc;
}

static int fk_to_device(const struct mp_stage_dev *d, void *dev, const void *host, size_t len)
{
	struct fk_mem *m = d->ctx;
	int rc = 0;

	pthread_mutex_lock(&fk.mu);
	fk_check_range(m, dev, len);
	/* The copy back belongs to the operation whose copy in came last. */
	int op = m->in_calls - 1;
	if (m->rank == fk.gate_rank && op == fk.gate_op) {
		struct timespec dl;
		clock_gettime(CLOCK_REALTIME, &dl);
		dl.tv_sec += 20;
		fk.gate_entered = 1;
		pthread_cond_broadcast(&fk.cv);
		while (!fk.gate_open)
			if (pthread_cond_timedwait(&fk.cv, &fk.mu, &dl))
				break;
	}
	if (op < FK_MAXOPS && (fk.fail_out[op] & (1u << m->rank))) {
		rc = -EIO;
	} else {
		size_t off = (size_t)((char *)dev - m->base);
		fk_protect(m, PROT_READ | PROT_WRITE);
		memcpy(dev, host, len);
		fk_protect(m, PROT_NONE);
		for (size_t i = 0; i < len; i++)
			m->n_out[off + i]++;
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
	.to_host = fk_to_host,
	.to_device = fk_to_device,
};

void fk_reset(void)
{
	pthread_mutex_lock(&fk.mu);
	memset(fk.fail_in, 0, sizeof(fk.fail_in));
	memset(fk.fail_out, 0, sizeof(fk.fail_out));
	fk.gate_rank = fk.gate_op = -1;
	fk.gate_entered = fk.gate_open = 0;
	fk.queries = fk.releases = fk.allocs = fk.frees = 0;
	pthread_mutex_unlock(&fk.mu);
}
