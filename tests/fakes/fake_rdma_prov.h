/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * A FAKE RDMA provider, for tests: a struct mp_rdma_prov_ops (drivers/rdma/
 * prov.h) that stands in for the verbs and libfabric providers, so the
 * clear-to-send protocol (drivers/rdma/rdma.c) runs with no RDMA device and
 * no libfabric. Nothing here touches a device.
 *
 * Each provider instance has one completion queue and a table of
 * registrations; endpoints find each other through a process-wide table of
 * ids (the 8-byte blob the protocol ships over its side channel: FK_BLOB_MAGIC
 * then the id). A posted write waits in its endpoint's send queue
 * (FK_SQ_DEPTH deep, so the protocol meets -EAGAIN) and is carried out, in
 * posting order, when its provider is polled: copied into the target's
 * memory only if the key and the bounds match a registration there, else the
 * writer gets -EACCES. A send-queue slot is released only by a later
 * signalled write, as on hardware. After any error the endpoint flushes what
 * follows with -ECANCELED. A write aimed at a destroyed endpoint places
 * nothing (as after ibv_destroy_qp or fi_close): it is counted as a late
 * write and fails -ETIMEDOUT at the writer. Tests inject one completion
 * error on the next write from one instance to another (inject_to,
 * inject_status). One lock covers every entry, so instances driven by
 * threads of one process (peers of a library test) write into each other
 * safely; its asserts are cmocka's. GPUDirect: see fk_rdma_dma.
 */
#ifndef MP_FAKE_RDMA_PROV_H
#define MP_FAKE_RDMA_PROV_H

#include <stdint.h>

#include "drivers/rdma/prov.h"

#define FK_SQ_DEPTH 48      /* below rdma.c's 128 writes in flight: it must see -EAGAIN */
#define FK_CQ_CAP 8192
#define FK_INLINE 64
#define FK_MAX_EPS 16384   /* ids are not reused: a test may make thousands */
#define FK_BLOB_MAGIC 0x454b4146u /* "FAKE" */

struct fk_prov;

struct fk_wr {
	const unsigned char *src;
	unsigned char inl[FK_INLINE];
	size_t len;
	uint64_t raddr, rkey, wr_id;
	uint32_t imm;
	unsigned flags;
	int src_dev;            /* the source is device memory (fk_rdma_dma reads it) */
};

struct fk_ep {
	struct fk_prov *pv;
	uint32_t id;
	uint32_t peer;          /* 0 until connected */
	int error;              /* after an error everything flushes */
	struct fk_wr sq[FK_SQ_DEPTH];
	uint64_t posted;        /* writes posted */
	uint64_t executed;      /* of those, carried out */
	uint64_t retired;       /* of those, whose send-queue slot is free again */
};

struct fk_mr {
	struct mp_rdma_mr pub; /* first: the protocol holds &pub */
	struct fk_mr *next;
};

struct fk_prov {
	struct fk_mr *mrs;
	uint64_t next_key;
	struct mp_rdma_cqe cq[FK_CQ_CAP];
	int cq_head, cq_n;
	/* an injected error for the next write towards @inject_to */
	struct fk_prov *inject_to;
	int inject_status;
	/* what happened, for assertions */
	int live_eps, live_mrs;
	unsigned cts_in;        /* clear-to-send immediates that landed here */
	unsigned data_in;       /* message immediates that landed here */
	unsigned eagain;        /* writes refused for a full send queue */
	unsigned errors_out;    /* error completions raised on our writes */
};

/* Writes aimed at destroyed endpoints (they placed nothing); tests reset it. */
extern unsigned fk_late_writes;
/* The instance the latest open made. */
extern struct fk_prov *fk_last_open;

/* The provider table. */
extern const struct mp_rdma_prov_ops fk_rdma_ops;
/*
 * GPUDirect: while a test sets it, registrations of MP_MEM_CUDA are
 * accepted (else -ENOTSUP, as a NIC without peer memory), and a write whose
 * source or target lies in one is carried out by this call, as the NIC's
 * DMA to and from the GPU (the test reads and writes its fake device
 * memory). @dst_dev, @src_dev: that side is device memory.
 */
typedef void (*fk_rdma_dma_fn)(void *dst, int dst_dev, const void *src, int src_dev, size_t len);
extern fk_rdma_dma_fn fk_rdma_dma;
/* Endpoints created and not destroyed yet (0 once every instance closed). */
int fk_live_eps(void);

#endif
