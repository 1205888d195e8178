/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * A FAKE of libibverbs and of an RDMA NIC, for the verbs provider's tests:
 * see fake_ibverbs.h for what it plays and how faithfully.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fake_ibverbs.h"

struct fk_world fk;

/*
 * Every object the fake hands out (context, protection domain, completion
 * queue, queue pair, memory region) is counted while it lives in its own
 * counter of fk, so teardown can check that the provider gave each back.
 */
static void *fk_new(size_t size, int *live)
{
	void *o = calloc(1, size);
	assert_non_null(o);
	(*live)++;
	return o;
}

/* 0: what the verbs destroy calls return on success. */
static int fk_delete(void *o, int *live)
{
	free(o);
	(*live)--;
	return 0;
}

/*
 * The fake's contexts and protection domains are the plain ibv structs: what
 * they belong to (ctx->device, pd->context) is all they hold. The fake device
 * a context was opened on:
 */
static struct fk_dev *fk_dev_of(struct ibv_context *ctx)
{
	return (struct fk_dev *)(void *)ctx->device;
}

struct fk_qp *fk_qp_by_num(uint32_t n)
{
	for (struct fk_qp *q = fk.qp_list; q; q = q->next)
		if (q->qp.qp_num == n)
			return q;
	return NULL;
}

static struct fk_mr *fk_mr_by_key(uint32_t key)
{
	for (struct fk_mr *m = fk.mr_list; m; m = m->next)
		if (m->mr.rkey == key)
			return m;
	return NULL;
}

static void fk_push(struct fk_cq *cq, const struct ibv_wc *wc)
{
	if (cq->count == cq->cap) {
		fk.cq_overflow++;
		return;
	}
	cq->wc[(cq->head + cq->count) % cq->cap] = *wc;
	cq->count++;
}

static void fk_complete(struct fk_qp *q, uint64_t wr_id, enum ibv_wc_status st,
			enum ibv_wc_opcode op)
{
	struct ibv_wc wc;
	memset(&wc, 0, sizeof(wc));
	wc.wr_id = wr_id;
	wc.status = st;
	wc.opcode = op;
	wc.qp_num = q->qp.qp_num;
	fk_push(q->cq, &wc);
}

/* The error state: everything outstanding completes with a flush error. */
static void fk_qp_error(struct fk_qp *q)
{
	q->st = IBV_QPS_ERR;
	while (q->sq_count) {
		fk_complete(q, q->sq[q->sq_head].wr_id, IBV_WC_WR_FLUSH_ERR, IBV_WC_RDMA_WRITE);
		q->sq_head = (q->sq_head + 1) % (int)q->cap.max_send_wr;
		q->sq_count--;
	}
	while (q->rq_count) {
		fk_complete(q, q->rq[q->rq_head], IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV);
		q->rq_head = (q->rq_head + 1) % (int)q->cap.max_recv_wr;
		q->rq_count--;
	}
}

static struct fk_port *fk_port_of(struct fk_qp *q)
{
	return &fk_dev_of(q->qp.context)->port[q->port - 1];
}

/* Would the requester's packets reach the responder, as its address vector says? */
static bool fk_route_ok(struct fk_qp *q, struct fk_qp *r)
{
	struct fk_port *qp = fk_port_of(q), *rp = fk_port_of(r);
	if (q->ah.port_num != q->port || q->mtu > qp->mtu || q->mtu > rp->mtu)
		return false;
	if (qp->link == IBV_LINK_LAYER_ETHERNET) {
		if (!q->ah.is_global)
			return false;
		for (int i = 0; i < rp->ngid; i++)
			if (rp->gid_ok[i] && !memcmp(rp->gid[i].gid.raw, q->ah.grh.dgid.raw, 16))
				return qp->gid_ok[q->ah.grh.sgid_index];
		return false;
	}
	return q->ah.dlid == rp->lid;
}

/* Carries out the oldest send of @p q; false when it must wait (receiver not ready). */
static bool fk_exec(struct fk_qp *q)
{
	struct fk_swr *w = &q->sq[q->sq_head];
	struct fk_qp *r = fk_qp_by_num(q->dest_qpn);
	enum ibv_wc_status st = IBV_WC_SUCCESS;

	if (fk.inject) {
		st = fk.inject;
		fk.inject = 0;
	} else if (!r || (r->st != IBV_QPS_RTR && r->st != IBV_QPS_RTS) ||
		   r->dest_qpn != q->qp.qp_num || r->rq_psn != q->sq_psn || !fk_route_ok(q, r)) {
		st = IBV_WC_RETRY_EXC_ERR;
	} else {
		struct fk_mr *m = fk_mr_by_key(w->rkey);
		struct fk_mr *l = fk_mr_by_key(w->lkey);
		if (w->len && (!m || m->pd != r->pd || !(m->access & IBV_ACCESS_REMOTE_WRITE) ||
			       w->raddr < (uintptr_t)m->addr ||
			       w->raddr + w->len > (uintptr_t)m->addr + m->len)) {
			st = IBV_WC_REM_ACCESS_ERR;
		} else if (w->len && !(w->flags & IBV_SEND_INLINE) &&
			   (!l || l->pd != q->pd || (const char *)w->src < l->addr ||
			    (const char *)w->src + w->len > l->addr + l->len)) {
			st = IBV_WC_LOC_PROT_ERR;
		} else if (w->op == IBV_WR_RDMA_WRITE_WITH_IMM && r->rq_count == 0) {
			return false;
		} else {
			if (w->len)
				memcpy((void *)(uintptr_t)w->raddr,
				       (w->flags & IBV_SEND_INLINE) ? w->inl : w->src, w->len);
			if (w->op == IBV_WR_RDMA_WRITE_WITH_IMM) {
				struct ibv_wc wc;
				memset(&wc, 0, sizeof(wc));
				wc.wr_id = r->rq[r->rq_head];
				r->rq_head = (r->rq_head + 1) % (int)r->cap.max_recv_wr;
				r->rq_count--;
				wc.status = IBV_WC_SUCCESS;
				wc.opcode = IBV_WC_RECV_RDMA_WITH_IMM;
				wc.wc_flags = IBV_WC_WITH_IMM;
				wc.imm_data = w->imm;
				wc.byte_len = w->len;
				wc.qp_num = r->qp.qp_num;
				fk_push(r->cq, &wc);
			}
			r->rq_psn = (r->rq_psn + 1) & 0xffffff;
		}
	}
	uint64_t wr_id = w->wr_id;
	unsigned flags = w->flags;
	q->sq_head = (q->sq_head + 1) % (int)q->cap.max_send_wr;
	q->sq_count--;
	if (st != IBV_WC_SUCCESS) {
		fk_complete(q, wr_id, st, IBV_WC_RDMA_WRITE);
		fk_qp_error(q);
		return true;
	}
	q->sq_psn = (q->sq_psn + 1) & 0xffffff;
	if (flags & IBV_SEND_SIGNALED)
		fk_complete(q, wr_id, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE);
	return true;
}

void fk_run(void)
{
	if (fk.hold)
		return;
	for (struct fk_qp *q = fk.qp_list; q; q = q->next)
		while (q->st == IBV_QPS_RTS && q->sq_count && fk_exec(q))
			;
}

static struct ibv_device **fk_get_device_list(int *num)
{
	if (fk.list_errno) {
		errno = fk.list_errno;
		return NULL;
	}
	for (int i = 0; i < fk.ndev; i++)
		fk.list[i] = &fk.dev[i].dev;
	fk.list[fk.ndev] = NULL;
	*num = fk.ndev;
	fk.lists_out++;
	return fk.list;
}

static void fk_free_device_list(struct ibv_device **list)
{
	assert_ptr_equal(list, fk.list);
	fk.lists_out--;
}

static const char *fk_get_device_name(struct ibv_device *dev)
{
	return ((struct fk_dev *)(void *)dev)->name;
}

static struct ibv_context *fk_open_device(struct ibv_device *dev)
{
	struct ibv_context *c = fk_new(sizeof(*c), &fk.ctxs);
	c->device = dev;
	return c;
}

static int fk_close_device(struct ibv_context *ctx)
{
	return fk_delete(ctx, &fk.ctxs);
}

static int fk_query_device(struct ibv_context *ctx, struct ibv_device_attr *a)
{
	memset(a, 0, sizeof(*a));
	a->phys_port_cnt = (uint8_t)fk_dev_of(ctx)->nports;
	a->max_qp_wr = FK_MAX_WR;
	a->max_cqe = FK_MAX_CQE;
	return 0;
}

static int fk_query_port(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *a)
{
	struct fk_dev *d = fk_dev_of(ctx);
	if (port < 1 || port > d->nports)
		return EINVAL;
	struct fk_port *p = &d->port[port - 1];
	memset(a, 0, sizeof(*a));
	a->state = p->state;
	a->max_mtu = IBV_MTU_4096;
	a->active_mtu = p->mtu;
	a->gid_tbl_len = p->ngid;
	a->lid = p->lid;
	a->link_layer = p->link;
	a->max_msg_sz = 1u << 30;
	return 0;
}

static int fk_query_gid_ex(struct ibv_context *ctx, uint32_t port, uint32_t index,
			   struct ibv_gid_entry *e)
{
	struct fk_dev *d = fk_dev_of(ctx);
	if (port < 1 || port > (uint32_t)d->nports)
		return EINVAL;
	struct fk_port *p = &d->port[port - 1];
	if (index >= (uint32_t)p->ngid || !p->gid_ok[index])
		return ENODATA;
	*e = p->gid[index];
	return 0;
}

static struct ibv_pd *fk_alloc_pd(struct ibv_context *ctx)
{
	struct ibv_pd *pd = fk_new(sizeof(*pd), &fk.pds);
	pd->context = ctx;
	return pd;
}

static int fk_dealloc_pd(struct ibv_pd *pd)
{
	return fk_delete(pd, &fk.pds);
}

static struct ibv_cq *fk_create_cq(struct ibv_context *ctx, int cqe)
{
	if (cqe < 1 || cqe > FK_MAX_CQE) {
		errno = EINVAL;
		return NULL;
	}
	struct fk_cq *cq = fk_new(sizeof(*cq), &fk.cqs);
	cq->cap = cqe;
	cq->wc = calloc((size_t)cqe, sizeof(*cq->wc));
	assert_non_null(cq->wc);
	cq->cq.context = ctx;
	cq->cq.cqe = cqe;
	fk.last_cq = cq;
	return &cq->cq;
}

/* As the kernel: never below the completions it holds nor above the device's limit; they stay, in order. */
static int fk_resize_cq(struct ibv_cq *c, int cqe)
{
	struct fk_cq *cq = (struct fk_cq *)(void *)c;
	fk.resize_calls++;
	if (fk.resize_errno)
		return fk.resize_errno;
	if (cqe < 1 || cqe < cq->count || cqe > FK_MAX_CQE)
		return EINVAL;
	struct ibv_wc *wc = calloc((size_t)cqe, sizeof(*wc));
	assert_non_null(wc);
	for (int i = 0; i < cq->count; i++)
		wc[i] = cq->wc[(cq->head + i) % cq->cap];
	free(cq->wc);
	cq->wc = wc;
	cq->head = 0;
	cq->cap = cqe;
	cq->cq.cqe = cqe;
	return 0;
}

static int fk_destroy_cq(struct ibv_cq *c)
{
	struct fk_cq *cq = (struct fk_cq *)(void *)c;
	free(cq->wc);
	return fk_delete(cq, &fk.cqs);
}

static struct ibv_qp *fk_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *a)
{
	if (a->qp_type != IBV_QPT_RC || a->cap.max_send_wr > FK_MAX_WR ||
	    a->cap.max_recv_wr > FK_MAX_WR || a->cap.max_send_sge > 1 || a->cap.max_recv_sge > 1 ||
	    a->cap.max_inline_data > FK_MAX_INLINE || a->send_cq != a->recv_cq) {
		errno = EINVAL;
		return NULL;
	}
	struct fk_qp *q = fk_new(sizeof(*q), &fk.qps);
	q->pd = pd;
	q->cq = (struct fk_cq *)(void *)a->send_cq;
	/* Every work request of every queue pair may complete before anyone polls. */
	long wrs = (long)a->cap.max_send_wr + a->cap.max_recv_wr;
	for (struct fk_qp *o = fk.qp_list; o; o = o->next)
		if (o->cq == q->cq)
			wrs += (long)o->cap.max_send_wr + o->cap.max_recv_wr;
	if (wrs > q->cq->cap)
		fk.cq_overcommit++;
	q->cap = a->cap;
	q->sq = calloc(a->cap.max_send_wr, sizeof(*q->sq));
	q->rq = calloc(a->cap.max_recv_wr, sizeof(*q->rq));
	assert_true(q->sq && q->rq);
	q->qp.qp_num = fk.next_qpn++;
	q->qp.context = pd->context;
	q->st = IBV_QPS_RESET;
	q->next = fk.qp_list;
	fk.qp_list = q;
	return &q->qp;
}

/* The moves RC allows towards RTS: the state each starts from and the attributes it needs. */
static const struct {
	enum ibv_qp_state from;
	int need;
} fk_qp_move[] = {
	[IBV_QPS_INIT] = {.from = IBV_QPS_RESET,
			  .need = IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS},
	[IBV_QPS_RTR] = {.from = IBV_QPS_INIT,
			 .need = IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
				 IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER},
	[IBV_QPS_RTS] = {.from = IBV_QPS_RTR,
			 .need = IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
				 IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC},
};

static int fk_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *a, int mask)
{
	struct fk_qp *q = (struct fk_qp *)(void *)qp;
	if (!(mask & IBV_QP_STATE))
		return EINVAL;
	if (a->qp_state == IBV_QPS_ERR) {
		fk_qp_error(q);
		return 0;
	}
	if (a->qp_state < IBV_QPS_INIT || a->qp_state > IBV_QPS_RTS)
		return EINVAL;
	int need = fk_qp_move[a->qp_state].need;
	if (q->st != fk_qp_move[a->qp_state].from || (mask & need) != need)
		return EINVAL;
	switch (a->qp_state) {
	case IBV_QPS_INIT:
		if (a->port_num < 1 || a->port_num > fk_dev_of(qp->context)->nports)
			return EINVAL;
		q->port = a->port_num;
		q->access = (int)a->qp_access_flags;
		break;
	case IBV_QPS_RTR:
		q->ah = a->ah_attr;
		q->mtu = a->path_mtu;
		q->dest_qpn = a->dest_qp_num;
		q->rq_psn = a->rq_psn;
		break;
	default: /* IBV_QPS_RTS */
		q->timeout = a->timeout;
		q->retry = a->retry_cnt;
		q->rnr = a->rnr_retry;
		q->sq_psn = a->sq_psn;
		break;
	}
	q->st = a->qp_state;
	return 0;
}

static int fk_destroy_qp(struct ibv_qp *qp)
{
	struct fk_qp *q = (struct fk_qp *)(void *)qp;
	struct fk_qp **pp = &fk.qp_list;
	while (*pp != q)
		pp = &(*pp)->next;
	*pp = q->next;
	free(q->sq);
	free(q->rq);
	return fk_delete(q, &fk.qps);
}

static struct fk_mr *fk_new_mr(struct ibv_pd *pd, char *addr, size_t len, int access)
{
	struct fk_mr *m = fk_new(sizeof(*m), &fk.mrs);
	m->pd = pd;
	m->addr = addr;
	m->len = len;
	m->access = access;
	m->mr.lkey = m->mr.rkey = fk.next_key;
	fk.next_key += 0x100;
	m->mr.addr = addr;
	m->mr.length = len;
	m->next = fk.mr_list;
	fk.mr_list = m;
	return m;
}

static struct ibv_mr *fk_reg_mr(struct ibv_pd *pd, void *addr, size_t len, int access)
{
	fk.reg_mr_calls++;
	char *a = addr;
	if (fk.devmem && a >= fk.devmem && a < fk.devmem + fk.devmem_len && !fk.peermem_ok) {
		errno = EFAULT; /* what the kernel says of device memory without a peer-memory client */
		return NULL;
	}
	return &fk_new_mr(pd, a, len, access)->mr;
}

static struct ibv_mr *fk_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t len,
				       uint64_t iova, int fd, int access)
{
	fk.dmabuf_calls++;
	fk.last_off = offset;
	fk.last_iova = iova;
	assert_int_equal(fd, fk.last_fd);
	assert_int_not_equal(fcntl(fd, F_GETFD), -1);
	if (!fk.dmabuf_ok) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	return &fk_new_mr(pd, (char *)(uintptr_t)iova, len, access)->mr;
}

static int fk_dereg_mr(struct ibv_mr *mr)
{
	struct fk_mr *m = (struct fk_mr *)(void *)mr;
	struct fk_mr **pp = &fk.mr_list;
	while (*pp != m)
		pp = &(*pp)->next;
	*pp = m->next;
	fk.dereg_mr_calls++;
	return fk_delete(m, &fk.mrs);
}

/* As hardware: a work request posted to a queue pair in the error state completes flushed. */
static bool fk_flushed(struct fk_qp *q, uint64_t wr_id, enum ibv_wc_opcode op)
{
	if (q->st != IBV_QPS_ERR)
		return false;
	fk_complete(q, wr_id, IBV_WC_WR_FLUSH_ERR, op);
	return true;
}

static int fk_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
	struct fk_qp *q = (struct fk_qp *)(void *)qp;
	for (; wr; wr = wr->next) {
		if (fk_flushed(q, wr->wr_id, IBV_WC_RDMA_WRITE))
			continue;
		uint32_t len = wr->num_sge ? wr->sg_list[0].length : 0;
		int rc = 0;
		if (q->st != IBV_QPS_RTS || wr->num_sge > 1 ||
		    (wr->opcode != IBV_WR_RDMA_WRITE && wr->opcode != IBV_WR_RDMA_WRITE_WITH_IMM) ||
		    ((wr->send_flags & IBV_SEND_INLINE) && len > q->cap.max_inline_data))
			rc = EINVAL;
		else if (q->sq_count == (int)q->cap.max_send_wr)
			rc = ENOMEM;
		if (rc) {
			*bad = wr;
			return rc;
		}
		struct fk_swr *w = &q->sq[(q->sq_head + q->sq_count) % (int)q->cap.max_send_wr];
		memset(w, 0, offsetof(struct fk_swr, inl));
		w->wr_id = wr->wr_id;
		w->op = wr->opcode;
		w->flags = wr->send_flags;
		w->imm = wr->imm_data;
		w->raddr = wr->wr.rdma.remote_addr;
		w->rkey = wr->wr.rdma.rkey;
		w->len = len;
		if (len) {
			w->src = (const void *)(uintptr_t)wr->sg_list[0].addr;
			w->lkey = wr->sg_list[0].lkey;
			if (wr->send_flags & IBV_SEND_INLINE)
				memcpy(w->inl, w->src, len);
		}
		q->sq_count++;
	}
	return 0;
}

static int fk_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
	struct fk_qp *q = (struct fk_qp *)(void *)qp;
	for (; wr; wr = wr->next) {
		if (fk_flushed(q, wr->wr_id, IBV_WC_RECV))
			continue;
		if (q->st == IBV_QPS_RESET || q->rq_count == (int)q->cap.max_recv_wr) {
			*bad = wr;
			return q->st == IBV_QPS_RESET ? EINVAL : ENOMEM;
		}
		q->rq[(q->rq_head + q->rq_count) % (int)q->cap.max_recv_wr] = wr->wr_id;
		q->rq_count++;
	}
	return 0;
}

static int fk_poll_cq(struct ibv_cq *c, int n, struct ibv_wc *wc)
{
	struct fk_cq *cq = (struct fk_cq *)(void *)c;
	fk_run();
	int got = 0;
	while (got < n && cq->count) {
		wc[got++] = cq->wc[cq->head];
		cq->head = (cq->head + 1) % cq->cap;
		cq->count--;
	}
	return got;
}

#ifdef MP_HAVE_CUDA
static int fk_cuda_dmabuf_fd(void *base, size_t len, int *fd)
{
	assert_int_equal((uintptr_t)base % 4096, 0);
	assert_int_equal(len % 4096, 0);
	if (fk.cuda_fd_rc)
		return fk.cuda_fd_rc;
	fk.last_fd_len = len;
	*fd = fk.last_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
	return *fd < 0 ? -errno : 0;
}
#endif

const struct mp_verbs_ibv fk_ibv = {
	.get_device_list = fk_get_device_list,
	.free_device_list = fk_free_device_list,
	.get_device_name = fk_get_device_name,
	.open_device = fk_open_device,
	.close_device = fk_close_device,
	.query_device = fk_query_device,
	.query_port = fk_query_port,
	.query_gid_ex = fk_query_gid_ex,
	.alloc_pd = fk_alloc_pd,
	.dealloc_pd = fk_dealloc_pd,
	.create_cq = fk_create_cq,
	.resize_cq = fk_resize_cq,
	.destroy_cq = fk_destroy_cq,
	.create_qp = fk_create_qp,
	.modify_qp = fk_modify_qp,
	.destroy_qp = fk_destroy_qp,
	.reg_mr = fk_reg_mr,
	.reg_dmabuf_mr = fk_reg_dmabuf_mr,
	.dereg_mr = fk_dereg_mr,
	.post_send = fk_post_send,
	.post_recv = fk_post_recv,
	.poll_cq = fk_poll_cq,
#ifdef MP_HAVE_CUDA
	.cuda_dmabuf_fd = fk_cuda_dmabuf_fd,
#endif
};

static void fk_gid(struct fk_port *p, int i, const char *text, uint32_t type)
{
	assert_int_equal(inet_pton(AF_INET6, text, p->gid[i].gid.raw), 1);
	p->gid[i].gid_index = (uint32_t)i;
	p->gid[i].gid_type = type;
	p->gid_ok[i] = true;
}

/* One InfiniBand HCA with an active port. */
void fk_world_ib(void)
{
	struct fk_dev *d = &fk.dev[0];
	snprintf(d->name, sizeof(d->name), "fake_ib0");
	d->nports = 1;
	d->port[0] = (struct fk_port){.state = IBV_PORT_ACTIVE, .link = IBV_LINK_LAYER_INFINIBAND,
				      .mtu = IBV_MTU_4096, .lid = 7, .ngid = 4};
	fk_gid(&d->port[0], 0, "fe80::2:c903:1:7", IBV_GID_TYPE_IB);
	fk.ndev = 1;
}

/*
 * A RoCE NIC whose GID table holds, as mlx5 lists them, link-local v1 and
 * v2 entries and then v1 and v2 entries for an IPv4 address; two entries
 * of the table of 6 are empty. Then a second, two-port device whose port 1
 * is down.
 */
void fk_world_roce(void)
{
	struct fk_dev *d = &fk.dev[0];
	snprintf(d->name, sizeof(d->name), "fake_roce0");
	d->nports = 1;
	d->port[0] = (struct fk_port){.state = IBV_PORT_ACTIVE, .link = IBV_LINK_LAYER_ETHERNET,
				      .mtu = IBV_MTU_1024, .ngid = 6};
	fk_gid(&d->port[0], 0, "fe80::a00:27ff:fe00:1", IBV_GID_TYPE_ROCE_V1);
	fk_gid(&d->port[0], 1, "fe80::a00:27ff:fe00:1", IBV_GID_TYPE_ROCE_V2);
	fk_gid(&d->port[0], 2, "::ffff:10.0.0.1", IBV_GID_TYPE_ROCE_V1);
	fk_gid(&d->port[0], 3, "::ffff:10.0.0.1", IBV_GID_TYPE_ROCE_V2);
	d = &fk.dev[1];
	snprintf(d->name, sizeof(d->name), "fake_ib1");
	d->nports = 2;
	d->port[0] = (struct fk_port){.state = IBV_PORT_DOWN, .link = IBV_LINK_LAYER_INFINIBAND,
				      .mtu = IBV_MTU_4096, .lid = 0, .ngid = 1};
	d->port[1] = (struct fk_port){.state = IBV_PORT_ACTIVE, .link = IBV_LINK_LAYER_INFINIBAND,
				      .mtu = IBV_MTU_2048, .lid = 9, .ngid = 1};
	fk_gid(&d->port[1], 0, "fe80::2:c903:1:9", IBV_GID_TYPE_IB);
	fk.ndev = 2;
}

void fk_reset(void)
{
	memset(&fk, 0, sizeof(fk));
	fk.next_qpn = 0x120;
	fk.next_key = 0x1000;
	fk.last_fd = -1;
	fk_world_ib();
}
