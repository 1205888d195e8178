/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * A FAKE of libibverbs and of the RDMA NIC behind it, for tests: it stands in
 * for the real library through drivers/verbs/ibv.h's table (point
 * mp_verbs_ibv at fk_ibv), so the verbs provider (drivers/verbs/) runs on a
 * machine without an RDMA device. Nothing here touches a device.
 *
 * The fake keeps a little world of devices, queue pairs, memory regions and
 * completion queues. A queue pair must go RESET -> INIT -> RTR -> RTS with
 * the attributes RC needs; RDMA WRITE (with immediate) is carried out when
 * any completion queue is polled: it needs a connected peer whose receive
 * PSN, QP number and address vector match, and it is copied into the
 * peer's memory region only if the rkey and bounds allow, else the writer
 * gets IBV_WC_REM_ACCESS_ERR. Errors move the queue pair to the error
 * state, which flushes everything behind them, as hardware does. Tests can
 * hold execution (to keep writes outstanding) and inject a completion error.
 * A completion queue has a depth: it can be resized (or refuse to be), and
 * the fake counts both completions that found it full and queue pairs
 * whose work requests, with those of the others on it, exceed its depth.
 * With MP_HAVE_CUDA it also plays the CUDA driver's dma-buf export for
 * GPUDirect: [devmem, devmem + devmem_len) is its device memory.
 *
 * Every object it hands out is counted while it lives (fk.ctxs, fk.pds,
 * ...), so a test can check that the provider gave each back. Its asserts
 * are cmocka's: it runs on the test's thread.
 */
#ifndef MP_FAKE_IBVERBS_H
#define MP_FAKE_IBVERBS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "mp_build_config.h"
#include "drivers/verbs/ibv.h"

#define FK_NGID 8
#define FK_MAX_WR 1024
#define FK_MAX_INLINE 256
#define FK_MAX_CQE (1 << 16)

struct fk_port {
	enum ibv_port_state state;
	uint8_t link;
	enum ibv_mtu mtu;
	uint16_t lid;
	int ngid;
	struct ibv_gid_entry gid[FK_NGID];
	bool gid_ok[FK_NGID];
};

struct fk_dev {
	struct ibv_device dev;
	char name[32];
	int nports;
	struct fk_port port[2];
};

struct fk_cq {
	struct ibv_cq cq;
	struct ibv_wc *wc;
	int cap, head, count;
};

struct fk_swr {
	uint64_t wr_id;
	enum ibv_wr_opcode op;
	unsigned flags;
	uint32_t imm; /* as posted: big-endian */
	uint64_t raddr;
	uint32_t rkey;
	const void *src;
	uint32_t len;
	uint32_t lkey;
	uint8_t inl[FK_MAX_INLINE];
};

struct fk_qp {
	struct ibv_qp qp;
	struct ibv_pd *pd;
	struct fk_cq *cq;
	enum ibv_qp_state st;
	struct ibv_qp_cap cap;
	uint8_t port;
	int access;
	uint32_t dest_qpn, rq_psn, sq_psn;
	struct ibv_ah_attr ah;
	enum ibv_mtu mtu;
	uint8_t timeout, retry, rnr;
	struct fk_swr *sq;
	int sq_head, sq_count;
	uint64_t *rq;
	int rq_head, rq_count;
	struct fk_qp *next;
};

struct fk_mr {
	struct ibv_mr mr;
	struct ibv_pd *pd;
	char *addr;
	size_t len;
	int access;
	struct fk_mr *next;
};

/* The fake's whole world; fk_reset empties it. Tests set and read it directly. */
struct fk_world {
	int ndev;
	struct fk_dev dev[2];
	struct ibv_device *list[3];
	int list_errno; /* get_device_list fails with it */
	int lists_out, ctxs, pds, cqs, qps, mrs;
	struct fk_qp *qp_list;
	struct fk_mr *mr_list;
	uint32_t next_qpn, next_key;
	bool hold;                  /* posted sends wait */
	enum ibv_wc_status inject;  /* the next send executed completes with this */
	int reg_mr_calls, dereg_mr_calls, dmabuf_calls, cq_overflow;
	struct fk_cq *last_cq;      /* the latest created */
	int resize_errno;           /* resize_cq fails with it */
	int resize_calls;
	int cq_overcommit;          /* queue pairs created beyond their CQ's depth */
	/* CUDA: [devmem, devmem + devmem_len) plays device memory. */
	char *devmem;
	size_t devmem_len;
	bool dmabuf_ok, peermem_ok;
	int cuda_fd_rc, last_fd;
	size_t last_fd_len;
	uint64_t last_off, last_iova;
};
extern struct fk_world fk;

/* The table to point mp_verbs_ibv at. */
extern const struct mp_verbs_ibv fk_ibv;

/* An empty world with fresh counters, then fk_world_ib's. */
void fk_reset(void);
/* One InfiniBand HCA with an active port. */
void fk_world_ib(void);
/* A RoCE NIC with a GID table as mlx5 lists it, and a two-port IB device
 * whose port 1 is down. */
void fk_world_roce(void);
/* The queue pair numbered @n, or NULL. */
struct fk_qp *fk_qp_by_num(uint32_t n);
/* Carry out the posted sends that can go (none while fk.hold). */
void fk_run(void);

#endif
