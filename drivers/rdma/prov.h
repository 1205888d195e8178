/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The RDMA-provider seam: what the clear-to-send protocol (drivers/rdma/)
 * needs from a fabric, and nothing more.
 *
 * The protocol - rings of clear-to-send records, slots, completion by
 * immediate, failure of a peer on a completion error - is written once,
 * against this table. Two providers fill it: ibverbs (drivers/verbs/, RC
 * queue pairs) and libfabric (drivers/ofi/, FI_EP_RDM endpoints with
 * fi_writedata). Tests fill it a third time with an in-process fake. Each
 * declares its own table and passes it to the protocol (rdma.h).
 *
 * Model:
 *  - A provider instance owns one device/domain, one protection domain and
 *    one completion queue; everything completes through `poll`.
 *  - An endpoint is one reliable, connected, ordered channel to one remote
 *    endpoint. `ep_create` gives a blob that describes it (QP number, GID,
 *    PSN for verbs; the fi_getname address for ofi); the protocol ships the
 *    blob to the peer over its own side channel and hands the peer's blob
 *    to `ep_connect`. Writes posted on one endpoint are placed in the
 *    remote memory in posting order, and a write's immediate completes at
 *    the target only after the data of every earlier write on that endpoint
 *    is visible (RC ordering; FI_ORDER_* for ofi).
 *  - Memory is registered once and named by (addr, rkey) remotely and by
 *    `desc` locally.
 *  - `write` posts an RDMA WRITE; with MP_RDMA_WR_IMM the target also gets
 *    an MP_RDMA_CQE_IMM completion carrying @imm and the length written.
 *    The provider keeps whatever the target needs to take immediates
 *    (posted receives for verbs) topped up by itself.
 *  - Every error on a posted operation comes back as a completion with a
 *    negative errno status (retry exceeded, remote access, flush), never as
 *    a crash or a hang; the protocol turns it into a failed peer.
 * All entries return 0 or a negative errno unless noted.
 */
#ifndef MP_RDMA_PROV_H
#define MP_RDMA_PROV_H

#include <stddef.h>
#include <stdint.h>
#include <moshpit/moshpit.h>

/** Largest endpoint blob a provider may produce. */
#define MP_RDMA_EP_BLOB_MAX 96

struct mp_rdma_prov; /* provider instance; providers embed it first in their own state */
struct mp_rdma_ep;   /* provider endpoint */

/** A registration: local descriptor plus what a remote peer needs to write into it. */
struct mp_rdma_mr {
	void *addr;         /**< start of the registered range */
	size_t len;         /**< bytes */
	uint64_t rkey;      /**< remote key (verbs rkey, fi_mr_key) */
	void *desc;         /**< local descriptor (verbs lkey as pointer-sized, fi_mr_desc) */
	enum mp_mem_kind kind;
};

/** Flags for write. */
enum mp_rdma_wr_flags {
	MP_RDMA_WR_IMM = 1u << 0,    /**< WRITE with immediate: the target gets a completion */
	MP_RDMA_WR_INLINE = 1u << 1, /**< small payload copied at post time; source may be reused */
	MP_RDMA_WR_SIGNAL = 1u << 2, /**< the initiator gets a completion (errors always complete) */
};

/** Completion kinds. */
enum mp_rdma_cqe_op {
	MP_RDMA_CQE_WRITE = 1, /**< a signalled (or failed) write of ours finished */
	MP_RDMA_CQE_IMM = 2,   /**< a peer's write with immediate landed in our memory */
};

/** One completion. */
struct mp_rdma_cqe {
	enum mp_rdma_cqe_op op;
	int status;               /**< 0, or negative errno (-ETIMEDOUT retry exceeded, -EACCES remote access, -ECANCELED flushed, -EIO other) */
	struct mp_rdma_ep *ep;    /**< endpoint it belongs to */
	uint64_t wr_id;           /**< the caller's id (MP_RDMA_CQE_WRITE) */
	uint32_t imm;             /**< immediate (MP_RDMA_CQE_IMM) */
	size_t len;               /**< bytes written by that write (MP_RDMA_CQE_IMM) */
};

/** Parameters for a provider instance. */
struct mp_rdma_params {
	int rank;                 /**< for logs */
	int max_eps;              /**< endpoints it should be sized for */
	int max_outstanding;      /**< writes in flight per endpoint */
	int timeout_ms;           /**< how long a silent peer may take before its writes fail */
};

/** The provider table. */
struct mp_rdma_prov_ops {
	const char *name; /**< "verbs", "ofi", or a fake's name */

	/** Open the device/domain; -ENODEV with a logged reason when there is none. */
	int (*open)(const struct mp_rdma_params *p, struct mp_rdma_prov **out);
	/** Close; destroys endpoints and registrations still open. */
	void (*close)(struct mp_rdma_prov *pv);

	/** Create an endpoint; its description comes back in @p blob (*len in: cap, out: used). */
	int (*ep_create)(struct mp_rdma_prov *pv, void *blob, size_t *len, struct mp_rdma_ep **out);
	/** Connect it to the remote endpoint that @p blob describes; usable for writes after. */
	int (*ep_connect)(struct mp_rdma_ep *ep, const void *blob, size_t len);
	/**
	 * Destroy; its outstanding writes complete with -ECANCELED or are dropped.
	 * From its return nothing more is placed in local memory through it,
	 * whatever the peer still writes: the protocol hands the connection's
	 * receive buffers back right after.
	 */
	void (*ep_destroy)(struct mp_rdma_ep *ep);

	/** Register memory for local and remote access. */
	int (*reg)(struct mp_rdma_prov *pv, void *addr, size_t len, enum mp_mem_kind kind,
		   struct mp_rdma_mr **out);
	/** Release a registration. */
	void (*dereg)(struct mp_rdma_prov *pv, struct mp_rdma_mr *mr);

	/**
	 * Post an RDMA WRITE of @p len bytes from @p src (inside @p mr, or any
	 * memory with MP_RDMA_WR_INLINE) to @p raddr/@p rkey of the remote
	 * endpoint. -EAGAIN when the send queue is full: poll and post again.
	 */
	int (*write)(struct mp_rdma_ep *ep, const void *src, size_t len, struct mp_rdma_mr *mr,
		     uint64_t raddr, uint64_t rkey, uint32_t imm, unsigned flags, uint64_t wr_id);
	/** Largest payload MP_RDMA_WR_INLINE accepts. */
	size_t (*max_inline)(struct mp_rdma_prov *pv);

	/** Reap up to @p max completions; returns how many (0 = none), or a negative errno. */
	int (*poll)(struct mp_rdma_prov *pv, struct mp_rdma_cqe *out, int max);

	/** Optional: what open chose, as struct mp_driver_ops::describe words it. */
	int (*describe)(struct mp_rdma_prov *pv, char *text, size_t cap);
};

#endif /* MP_RDMA_PROV_H */
