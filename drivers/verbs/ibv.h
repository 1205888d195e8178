/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Every call the verbs provider (verbs.c) makes into libibverbs, and the one
 * it makes into the CUDA driver for GPUDirect, as a table of function
 * pointers.
 *
 * Why a table: the provider's own logic - device, port and GID selection,
 * the queue-pair state machine, the registration cache, selective
 * signalling, the mapping of completion errors - must be tested on machines
 * without an RDMA NIC or a GPU. A test points mp_verbs_ibv at an in-process
 * fake before it opens a provider; each instance keeps the table it was
 * opened with. Several verbs are static inline functions or macros in
 * <infiniband/verbs.h> (ibv_post_send, ibv_poll_cq, ibv_query_port,
 * ibv_reg_mr), so the real table holds small wrappers rather than the
 * library's symbols.
 *
 * The entries mirror libibverbs: NULL or -1/errno as the library reports
 * failures (pointer-returning calls set errno), except cuda_dmabuf_fd,
 * which returns 0 or a negative errno. The pure string lookups
 * (ibv_wc_status_str, ibv_port_state_str) touch no device and are called
 * directly.
 */
#ifndef MP_VERBS_IBV_H
#define MP_VERBS_IBV_H

#include <stddef.h>
#include <stdint.h>
#include <infiniband/verbs.h>

#include "mp_build_config.h"

struct mp_driver_ops;
struct mp_rdma_prov_ops;

struct mp_verbs_ibv {
	struct ibv_device **(*get_device_list)(int *num);
	void (*free_device_list)(struct ibv_device **list);
	const char *(*get_device_name)(struct ibv_device *dev);
	struct ibv_context *(*open_device)(struct ibv_device *dev);
	int (*close_device)(struct ibv_context *ctx);
	int (*query_device)(struct ibv_context *ctx, struct ibv_device_attr *attr);
	int (*query_port)(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *attr);
	/* GID and its type (IB, RoCE v1, RoCE v2); an error for an empty entry. */
	int (*query_gid_ex)(struct ibv_context *ctx, uint32_t port, uint32_t index,
			    struct ibv_gid_entry *entry);

	struct ibv_pd *(*alloc_pd)(struct ibv_context *ctx);
	int (*dealloc_pd)(struct ibv_pd *pd);
	struct ibv_cq *(*create_cq)(struct ibv_context *ctx, int cqe);
	/* To at least @cqe entries, completions already in it kept; cq->cqe says the size got. */
	int (*resize_cq)(struct ibv_cq *cq, int cqe);
	int (*destroy_cq)(struct ibv_cq *cq);
	struct ibv_qp *(*create_qp)(struct ibv_pd *pd, struct ibv_qp_init_attr *attr);
	int (*modify_qp)(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask);
	int (*destroy_qp)(struct ibv_qp *qp);

	struct ibv_mr *(*reg_mr)(struct ibv_pd *pd, void *addr, size_t len, int access);
	struct ibv_mr *(*reg_dmabuf_mr)(struct ibv_pd *pd, uint64_t offset, size_t len,
					uint64_t iova, int fd, int access);
	int (*dereg_mr)(struct ibv_mr *mr);

	int (*post_send)(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad);
	int (*post_recv)(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad);
	int (*poll_cq)(struct ibv_cq *cq, int n, struct ibv_wc *wc);

#ifdef MP_HAVE_CUDA
	/*
	 * A dma-buf file descriptor for the CUDA allocation range [base, base +
	 * len), both page aligned (cuMemGetHandleForAddressRange). The caller
	 * closes it once the registration holds its own reference.
	 */
	int (*cuda_dmabuf_fd)(void *base, size_t len, int *fd);
#endif
};

/* The provider (verbs.c), and the transport made of it with the RDMA protocol. */
extern const struct mp_rdma_prov_ops mp_rdma_verbs_prov;
extern const struct mp_driver_ops mp_verbs_driver_ops;

/* libibverbs itself (and the CUDA driver, loaded on first use). */
extern const struct mp_verbs_ibv mp_verbs_ibv_real;
/* The table the next mp_rdma_verbs_prov.open uses; &mp_verbs_ibv_real unless a test swaps it. */
extern const struct mp_verbs_ibv *mp_verbs_ibv;

#endif /* MP_VERBS_IBV_H */
