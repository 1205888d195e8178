/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * A FAKE RDMA provider for the clear-to-send protocol's tests: see
 * fake_rdma_prov.h for what it plays and how faithfully.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "fake_rdma_prov.h"

/* Endpoints by id; a destroyed one leaves FK_DEAD so writes to it are seen as late. */
static struct fk_ep *fk_eps[FK_MAX_EPS];
static struct fk_ep fk_dead;
#define FK_DEAD (&fk_dead)
static uint32_t fk_next_id;
unsigned fk_late_writes;
struct fk_prov *fk_last_open;
fk_rdma_dma_fn fk_rdma_dma;
/* Every entry holds it: instances of several threads write into each
 * other's memory and completion queues. */
static pthread_mutex_t fk_mu = PTHREAD_MUTEX_INITIALIZER;
#define FK_LOCKED(call)                          \
	do {                                     \
		pthread_mutex_lock(&fk_mu);      \
		call;                            \
		pthread_mutex_unlock(&fk_mu);    \
	} while (0)

static struct fk_prov *fk_prov_of(struct mp_rdma_prov *p)
{
	return (struct fk_prov *)(void *)p;
}

static struct fk_ep *fk_ep_of(struct mp_rdma_ep *e)
{
	return (struct fk_ep *)(void *)e;
}

static int fk_open_l(const struct mp_rdma_params *p, struct mp_rdma_prov **out)
{
	struct fk_prov *pv = calloc(1, sizeof(*pv));

	(void)p;
	if (!pv)
		return -ENOMEM;
	fk_last_open = pv;
	*out = (struct mp_rdma_prov *)(void *)pv;
	return 0;
}

static void fk_cq_push(struct fk_prov *pv, const struct mp_rdma_cqe *e)
{
	assert_true(pv->cq_n < FK_CQ_CAP);
	pv->cq[(pv->cq_head + pv->cq_n) % FK_CQ_CAP] = *e;
	pv->cq_n++;
}

static void fk_ep_destroy_l(struct mp_rdma_ep *ep)
{
	struct fk_ep *e = fk_ep_of(ep);
	struct fk_prov *pv = e->pv;
	int n = pv->cq_n;

	/* Completions of a destroyed endpoint leave the queue with it. */
	pv->cq_n = 0;
	for (int i = 0; i < n; i++) {
		struct mp_rdma_cqe c = pv->cq[(pv->cq_head + i) % FK_CQ_CAP];

		if (c.ep != ep)
			pv->cq[(pv->cq_head + pv->cq_n++) % FK_CQ_CAP] = c;
	}
	fk_eps[e->id] = FK_DEAD;
	pv->live_eps--;
	free(e);
}

static void fk_dereg_l(struct mp_rdma_prov *p, struct mp_rdma_mr *mr);

static void fk_close_l(struct mp_rdma_prov *p)
{
	struct fk_prov *pv = fk_prov_of(p);

	for (uint32_t i = 1; i <= fk_next_id && i < FK_MAX_EPS; i++)
		if (fk_eps[i] && fk_eps[i] != FK_DEAD && fk_eps[i]->pv == pv)
			fk_ep_destroy_l((struct mp_rdma_ep *)(void *)fk_eps[i]);
	while (pv->mrs)
		fk_dereg_l(p, &pv->mrs->pub);
	if (fk_last_open == pv)
		fk_last_open = NULL;
	free(pv);
}

static int fk_ep_create_l(struct mp_rdma_prov *p, void *blob, size_t *len, struct mp_rdma_ep **out)
{
	struct fk_prov *pv = fk_prov_of(p);
	struct fk_ep *e;
	uint32_t v[2];

	if (*len < sizeof(v) || fk_next_id + 1 >= FK_MAX_EPS)
		return -ENOSPC;
	e = calloc(1, sizeof(*e));
	if (!e)
		return -ENOMEM;
	e->pv = pv;
	e->id = ++fk_next_id;
	fk_eps[e->id] = e;
	pv->live_eps++;
	v[0] = FK_BLOB_MAGIC;
	v[1] = e->id;
	memcpy(blob, v, sizeof(v));
	*len = sizeof(v);
	*out = (struct mp_rdma_ep *)(void *)e;
	return 0;
}

static int fk_ep_connect_l(struct mp_rdma_ep *ep, const void *blob, size_t len)
{
	struct fk_ep *e = fk_ep_of(ep);
	uint32_t v[2];

	if (len != sizeof(v))
		return -EINVAL;
	memcpy(v, blob, sizeof(v));
	if (v[0] != FK_BLOB_MAGIC || !v[1] || v[1] >= FK_MAX_EPS || !fk_eps[v[1]] ||
	    fk_eps[v[1]] == FK_DEAD)
		return -EINVAL;
	e->peer = v[1];
	return 0;
}

static int fk_reg_l(struct mp_rdma_prov *p, void *addr, size_t len, enum mp_mem_kind kind,
		  struct mp_rdma_mr **out)
{
	struct fk_prov *pv = fk_prov_of(p);
	struct fk_mr *m;

	if (!addr || !len)
		return -EINVAL;
	if (kind != MP_MEM_HOST && !(kind == MP_MEM_CUDA && fk_rdma_dma))
		return -ENOTSUP;
	m = calloc(1, sizeof(*m));
	if (!m)
		return -ENOMEM;
	m->pub.addr = addr;
	m->pub.len = len;
	m->pub.kind = kind;
	m->pub.rkey = 0x5a00000000000000ull | ++pv->next_key;
	m->pub.desc = m;
	m->next = pv->mrs;
	pv->mrs = m;
	pv->live_mrs++;
	*out = &m->pub;
	return 0;
}

static void fk_dereg_l(struct mp_rdma_prov *p, struct mp_rdma_mr *mr)
{
	struct fk_prov *pv = fk_prov_of(p);

	for (struct fk_mr **pp = &pv->mrs; *pp; pp = &(*pp)->next)
		if (&(*pp)->pub == mr) {
			struct fk_mr *m = *pp;

			*pp = m->next;
			free(m);
			pv->live_mrs--;
			return;
		}
	fail_msg("dereg of a registration the fake never made");
}

static int fk_write_l(struct mp_rdma_ep *ep, const void *src, size_t len, struct mp_rdma_mr *mr,
		    uint64_t raddr, uint64_t rkey, uint32_t imm, unsigned flags, uint64_t wr_id)
{
	struct fk_ep *e = fk_ep_of(ep);
	struct fk_wr *w;

	if (!e->peer)
		return -ENOTCONN;
	if (e->posted - e->retired >= FK_SQ_DEPTH) {
		e->pv->eagain++;
		return -EAGAIN;
	}
	w = &e->sq[e->posted % FK_SQ_DEPTH];
	memset(w, 0, offsetof(struct fk_wr, len));
	w->src_dev = 0;
	if (flags & MP_RDMA_WR_INLINE) {
		if (len > FK_INLINE)
			return -EINVAL;
		if (len)
			memcpy(w->inl, src, len);
		w->src = w->inl;
	} else if (len) {
		/* The source must lie inside the registration the protocol named. */
		struct fk_mr *m = (struct fk_mr *)(void *)mr;
		uintptr_t a = (uintptr_t)src, b = m ? (uintptr_t)m->pub.addr : 0;

		if (!m || m->pub.desc != m || a < b || len > m->pub.len || a - b > m->pub.len - len)
			return -EINVAL;
		w->src = src;
		w->src_dev = m->pub.kind == MP_MEM_CUDA;
	}
	w->len = len;
	w->raddr = raddr;
	w->rkey = rkey;
	w->imm = imm;
	w->flags = flags;
	w->wr_id = wr_id;
	e->posted++;
	return 0;
}

static size_t fk_max_inline(struct mp_rdma_prov *p)
{
	(void)p;
	return FK_INLINE;
}

/* Where [raddr, raddr + len) lands in @pv under @rkey, or NULL; *@dev:
 * in device memory. */
static unsigned char *fk_target(struct fk_prov *pv, uint64_t raddr, uint64_t rkey, size_t len,
				int *dev)
{
	for (struct fk_mr *m = pv->mrs; m; m = m->next) {
		uintptr_t b = (uintptr_t)m->pub.addr;

		if (m->pub.rkey != rkey)
			continue;
		if (raddr < b || len > m->pub.len || raddr - b > m->pub.len - len)
			return NULL;
		*dev = m->pub.kind == MP_MEM_CUDA;
		return (unsigned char *)(uintptr_t)raddr;
	}
	return NULL;
}

static void fk_fail_wr(struct fk_ep *e, const struct fk_wr *w, int status)
{
	struct mp_rdma_cqe c = {.op = MP_RDMA_CQE_WRITE, .status = status,
				.ep = (struct mp_rdma_ep *)(void *)e, .wr_id = w->wr_id};

	e->error = 1;
	e->pv->errors_out++;
	fk_cq_push(e->pv, &c);
}

/* Carry out @e's posted writes in order. */
static void fk_execute(struct fk_ep *e)
{
	while (e->executed < e->posted) {
		struct fk_wr *w = &e->sq[e->executed % FK_SQ_DEPTH];
		struct fk_ep *t = fk_eps[e->peer];
		unsigned char *dst;
		int dst_dev = 0;

		e->executed++;
		if (e->error) {
			fk_fail_wr(e, w, -ECANCELED);
			e->retired = e->executed;
			continue;
		}
		if (t != FK_DEAD && e->pv->inject_to && t->pv == e->pv->inject_to) {
			fk_fail_wr(e, w, e->pv->inject_status);
			e->pv->inject_to = NULL;
			e->retired = e->executed;
			continue;
		}
		if (t == FK_DEAD) {
			fk_late_writes++; /* nobody answers: retries run out */
			fk_fail_wr(e, w, -ETIMEDOUT);
			e->retired = e->executed;
			continue;
		}
		dst = fk_target(t->pv, w->raddr, w->rkey, w->len, &dst_dev);
		if (!dst && w->len) {
			fk_fail_wr(e, w, -EACCES);
			e->retired = e->executed;
			continue;
		}
		if (w->len && (dst_dev || w->src_dev))
			fk_rdma_dma(dst, dst_dev, w->src, w->src_dev, w->len);
		else if (w->len)
			memcpy(dst, w->src, w->len);
		if (w->flags & MP_RDMA_WR_IMM) {
			struct mp_rdma_cqe c = {.op = MP_RDMA_CQE_IMM, .imm = w->imm, .len = w->len,
						.ep = (struct mp_rdma_ep *)(void *)t};

			if (w->imm & (1u << 31))
				t->pv->cts_in++;
			else
				t->pv->data_in++;
			fk_cq_push(t->pv, &c);
		}
		if (w->flags & MP_RDMA_WR_SIGNAL) {
			struct mp_rdma_cqe c = {.op = MP_RDMA_CQE_WRITE, .wr_id = w->wr_id,
						.ep = (struct mp_rdma_ep *)(void *)e};

			fk_cq_push(e->pv, &c);
			e->retired = e->executed; /* a signalled completion retires those before it */
		}
	}
}

static int fk_poll_l(struct mp_rdma_prov *p, struct mp_rdma_cqe *out, int max)
{
	struct fk_prov *pv = fk_prov_of(p);
	int n = 0;

	for (uint32_t i = 1; i <= fk_next_id && i < FK_MAX_EPS; i++)
		if (fk_eps[i] && fk_eps[i] != FK_DEAD && fk_eps[i]->pv == pv)
			fk_execute(fk_eps[i]);
	while (n < max && pv->cq_n) {
		out[n++] = pv->cq[pv->cq_head];
		pv->cq_head = (pv->cq_head + 1) % FK_CQ_CAP;
		pv->cq_n--;
	}
	return n;
}

static int fk_open(const struct mp_rdma_params *p, struct mp_rdma_prov **out)
{
	int rc;

	FK_LOCKED(rc = fk_open_l(p, out));
	return rc;
}

static void fk_close(struct mp_rdma_prov *p)
{
	FK_LOCKED(fk_close_l(p));
}

static int fk_ep_create(struct mp_rdma_prov *p, void *blob, size_t *len, struct mp_rdma_ep **out)
{
	int rc;

	FK_LOCKED(rc = fk_ep_create_l(p, blob, len, out));
	return rc;
}

static int fk_ep_connect(struct mp_rdma_ep *ep, const void *blob, size_t len)
{
	int rc;

	FK_LOCKED(rc = fk_ep_connect_l(ep, blob, len));
	return rc;
}

static void fk_ep_destroy(struct mp_rdma_ep *ep)
{
	FK_LOCKED(fk_ep_destroy_l(ep));
}

static int fk_reg(struct mp_rdma_prov *p, void *addr, size_t len, enum mp_mem_kind kind,
		  struct mp_rdma_mr **out)
{
	int rc;

	FK_LOCKED(rc = fk_reg_l(p, addr, len, kind, out));
	return rc;
}

static void fk_dereg(struct mp_rdma_prov *p, struct mp_rdma_mr *mr)
{
	FK_LOCKED(fk_dereg_l(p, mr));
}

static int fk_write(struct mp_rdma_ep *ep, const void *src, size_t len, struct mp_rdma_mr *mr,
		    uint64_t raddr, uint64_t rkey, uint32_t imm, unsigned flags, uint64_t wr_id)
{
	int rc;

	FK_LOCKED(rc = fk_write_l(ep, src, len, mr, raddr, rkey, imm, flags, wr_id));
	return rc;
}

static int fk_poll(struct mp_rdma_prov *p, struct mp_rdma_cqe *out, int max)
{
	int rc;

	FK_LOCKED(rc = fk_poll_l(p, out, max));
	return rc;
}

const struct mp_rdma_prov_ops fk_rdma_ops = {
	.name = "fake",
	.open = fk_open,
	.close = fk_close,
	.ep_create = fk_ep_create,
	.ep_connect = fk_ep_connect,
	.ep_destroy = fk_ep_destroy,
	.reg = fk_reg,
	.dereg = fk_dereg,
	.write = fk_write,
	.max_inline = fk_max_inline,
	.poll = fk_poll,
};

int fk_live_eps(void)
{
	int n = 0;

	pthread_mutex_lock(&fk_mu);
	for (uint32_t i = 1; i <= fk_next_id && i < FK_MAX_EPS; i++)
		n += fk_eps[i] && fk_eps[i] != FK_DEAD;
	pthread_mutex_unlock(&fk_mu);
	return n;
}
