/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The ibverbs provider of the RDMA protocol (drivers/rdma/prov.h): one
 * device port, one protection domain and one polled completion queue per
 * instance, and a reliable-connected queue pair per endpoint (doc/rdma.md).
 * The completion queue always has room for every work request of every
 * endpoint; it starts small and grows as endpoints are created.
 *
 * Endpoint blob (32 bytes, little-endian), exchanged by the protocol over
 * its side channel:
 *   u8 magic 'V', u8 version 1, u8 link layer (IBV_LINK_LAYER_*),
 *   u8 active MTU (enum ibv_mtu), u32 QP number, u32 first PSN, u16 LID,
 *   u8 port, u8 GID index, u8 GID[16]
 * The port and GID index are the sender's own and only go to logs.
 *
 * Completions: every work request carries a wr_id that names its endpoint by
 * slot and generation rather than by pointer, so completions that a queue
 * pair leaves in the shared CQ after it was destroyed are recognised and
 * dropped instead of read through freed memory:
 *   bit 63 receive, bits 48-62 endpoint slot, bits 32-47 generation,
 *   bits 0-31 index into the endpoint's send ring.
 * Sends are signalled only when the caller asks, and every
 * max_outstanding/2-th one besides, which is enough to learn how far the
 * send queue has drained (RC completes in order). A failed work request is
 * always completed by the hardware, signalled or not, so every error still
 * reaches the caller with the caller's wr_id.
 *
 * Immediates need a posted receive on the target; each endpoint keeps
 * 2 x max_outstanding zero-length receives posted and replaces each one as
 * its completion is polled. Receiver-not-ready is retried forever
 * (rnr_retry 7), so a target slow to poll stalls the writer, never fails it.
 *
 * Environment (read at open):
 *   MP_IB_HCA        device, or device:port (default: the first device
 *                    with an active port)
 *   MP_IB_GID_INDEX  GID table index (default: on RoCE the first RoCE v2
 *                    GID that maps an IPv4 address, else 0)
 *   MP_IB_TIMEOUT    local ACK timeout exponent, 1..31: 4.096 us x 2^value
 *                    per attempt (default: the largest value up to 18 whose
 *                    attempts fit in the protocol's timeout, at least 12)
 *   MP_IB_RETRY_CNT  retransmissions before a write fails with -ETIMEDOUT,
 *                    0..7 (default 7)
 *
 * Threading: an instance is driven by one thread at a time.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>
#include <infiniband/verbs.h>
#include <moshpit/driver_sdk.h>

#include "mp_build_config.h"
#include "../rdma/rdma.h"
#include "ibv.h"

#define VB_BLOB_MAGIC 0x56 /* 'V' */
#define VB_BLOB_VERSION 1
#define VB_BLOB_LEN 32
#define VB_INLINE 64            /* inline bytes asked of every queue pair */
#define VB_DEF_EPS 64           /* params->max_eps when 0 */
#define VB_CQ_START_EPS 4       /* endpoints the first completion queue is sized for */
#define VB_DEF_OUTSTANDING 64   /* params->max_outstanding when 0 */
#define VB_MAX_EPS 0x7fff       /* slot field of the wr_id */
#define VB_POLL_BATCH 32
#define VB_DRAIN_MS 1000        /* a flush takes microseconds; this is a backstop */
#define VB_DEF_TIMEOUT 18       /* NCCL's: about 1.07 s per attempt */
#define VB_MIN_TIMEOUT 12       /* about 17 ms: shorter fails on ordinary congestion */
#define VB_DEF_RETRY 7
#define VB_RNR_RETRY 7          /* 7 = retry forever */
#define VB_MIN_RNR_TIMER 12     /* 0.64 ms before a receiver-not-ready is retried */

#define VB_WR_RECV (1ull << 63)

enum vb_ep_state {
	VB_EP_INIT,   /* created, receives posted, waiting for the peer's blob */
	VB_EP_RTS,    /* connected */
	VB_EP_FAILED, /* a completion error moved the queue pair to the error state */
};

/* One posted send, by its index in the endpoint's ring. */
struct vb_swr {
	uint64_t seq;   /* position in the endpoint's send sequence */
	uint64_t wr_id; /* the caller's */
	bool report;    /* the caller asked for a completion */
	bool marker;    /* the flush marker of ep_destroy */
};

struct vb_prov;

struct vb_ep {
	struct vb_prov *pv;
	struct ibv_qp *qp;
	uint32_t slot;
	uint16_t gen;
	enum vb_ep_state state;
	uint32_t psn;
	uint32_t remote_qpn;
	struct vb_swr *swr;   /* sq_depth entries */
	uint64_t sq_posted;   /* sends posted */
	uint64_t sq_done;     /* sends known complete */
	uint32_t rq_posted;   /* receives posted and not yet completed */
	bool error_logged;
	bool draining;        /* ep_destroy waits for its marker */
};

/* One ibv_mr, shared by every registration of a range inside it. */
struct vb_mrent {
	struct vb_mrent *next;
	struct ibv_mr *mr;
	char *addr;
	size_t len;
	enum mp_mem_kind kind;
	int refs;
};

/* What reg hands out: one per call, so that each dereg releases one reference. */
struct vb_mr {
	struct mp_rdma_mr pub;
	struct vb_mrent *ent;
	struct vb_mr *prev, *next;
};

struct vb_slot {
	struct vb_ep *ep;
	uint16_t gen;
};

struct vb_prov {
	const struct mp_verbs_ibv *ibv;
	char dev_name[IBV_SYSFS_NAME_MAX];
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	uint8_t port;
	uint8_t link_layer;     /* IBV_LINK_LAYER_INFINIBAND or _ETHERNET */
	enum ibv_mtu mtu;
	uint16_t lid;
	uint8_t gid_index;
	union ibv_gid gid;
	uint32_t max_msg;
	uint8_t timeout;
	uint8_t retry_cnt;
	uint32_t max_outstanding;
	uint32_t sq_depth;
	uint32_t rq_depth;
	uint32_t sig_every;
	int max_eps;
	int neps;
	long per_ep;            /* CQ entries one endpoint may fill: sq_depth + rq_depth */
	struct vb_slot *slots;  /* max_eps */
	struct vb_mrent *mrents;
	struct vb_mr *handles;
	struct mp_rdma_cqe *backlog; /* completions reaped while draining an endpoint */
	int bl_head, bl_count, bl_cap;
};

static struct vb_prov *to_vb(struct mp_rdma_prov *pv)
{
	return (struct vb_prov *)(void *)pv;
}

static struct vb_ep *to_ep(struct mp_rdma_ep *ep)
{
	return (struct vb_ep *)(void *)ep;
}

static struct mp_rdma_ep *from_ep(struct vb_ep *ep)
{
	return (struct mp_rdma_ep *)(void *)ep;
}

/* ---- configuration ---------------------------------------------------- */

struct vb_cfg {
	char hca[IBV_SYSFS_NAME_MAX]; /* "" = any */
	int port;                     /* 0 = any */
	int gid_index;                /* -1 = choose */
	int timeout;                  /* -1 = derive */
	int retry_cnt;
};

/* 0 when unset (out untouched), 1 when set and valid, -EINVAL otherwise. */
static int vb_env_int(const char *name, long lo, long hi, int *out)
{
	const char *s = getenv(name);
	if (!s || !*s)
		return 0;
	char *end;
	errno = 0;
	long v = strtol(s, &end, 10);
	if (errno || end == s || *end || v < lo || v > hi) {
		MP_WARN("verbs: %s=%s is not an integer from %ld to %ld", name, s, lo, hi);
		return -EINVAL;
	}
	*out = (int)v;
	return 1;
}

static int vb_read_env(struct vb_cfg *c)
{
	memset(c, 0, sizeof(*c));
	c->gid_index = -1;
	c->timeout = -1;
	c->retry_cnt = VB_DEF_RETRY;

	const char *hca = getenv("MP_IB_HCA");
	if (hca && *hca) {
		const char *colon = strchr(hca, ':');
		size_t n = colon ? (size_t)(colon - hca) : strlen(hca);
		if (n == 0 || n >= sizeof(c->hca)) {
			MP_WARN("verbs: MP_IB_HCA=%s: expected a device name (as ibv_devinfo prints it), "
				"optionally followed by :port", hca);
			return -EINVAL;
		}
		memcpy(c->hca, hca, n);
		c->hca[n] = '\0';
		if (colon) {
			char *end;
			errno = 0;
			long port = strtol(colon + 1, &end, 10);
			if (errno || end == colon + 1 || *end || port < 1 || port > 255) {
				MP_WARN("verbs: MP_IB_HCA=%s: port must be a number from 1 to 255", hca);
				return -EINVAL;
			}
			c->port = (int)port;
		}
	}
	/* The GID index goes into an 8-bit field of the address vector. */
	if (vb_env_int("MP_IB_GID_INDEX", 0, 255, &c->gid_index) < 0)
		return -EINVAL;
	/* 0 would mean "wait forever": a dead peer would hang its writes. */
	if (vb_env_int("MP_IB_TIMEOUT", 1, 31, &c->timeout) < 0)
		return -EINVAL;
	if (vb_env_int("MP_IB_RETRY_CNT", 0, 7, &c->retry_cnt) < 0)
		return -EINVAL;
	return 0;
}

/* Milliseconds an RC write keeps trying an unresponsive peer: (retries + 1) attempts. */
static double vb_give_up_ms(int timeout, int retry_cnt)
{
	return 4.096e-3 * (double)(1ull << timeout) * (retry_cnt + 1);
}

/*
 * Without MP_IB_TIMEOUT: the protocol's timeout_ms says how long a silent
 * peer may take, so take the longest attempt (up to NCCL's 18) whose retries
 * still fit in it, but not so short that congestion alone trips it.
 */
static int vb_pick_timeout(int timeout_ms, int retry_cnt)
{
	if (timeout_ms <= 0)
		return VB_DEF_TIMEOUT;
	int t = VB_DEF_TIMEOUT;
	while (t > VB_MIN_TIMEOUT && vb_give_up_ms(t, retry_cnt) > timeout_ms)
		t--;
	return t;
}

/* ---- device, port and GID -------------------------------------------- */

static bool vb_gid_is_ipv4(const union ibv_gid *g)
{
	static const uint8_t prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
	return memcmp(g->raw, prefix, sizeof(prefix)) == 0;
}

static bool vb_gid_is_zero(const union ibv_gid *g)
{
	static const uint8_t zero[16];
	return memcmp(g->raw, zero, sizeof(zero)) == 0;
}

static void vb_gid_str(const union ibv_gid *g, char *buf, size_t cap)
{
	if (!inet_ntop(AF_INET6, g->raw, buf, (socklen_t)cap))
		snprintf(buf, cap, "?");
}

static const char *vb_gid_type_str(uint32_t type)
{
	switch (type) {
	case IBV_GID_TYPE_IB:
		return "IB";
	case IBV_GID_TYPE_ROCE_V1:
		return "RoCE v1";
	case IBV_GID_TYPE_ROCE_V2:
		return "RoCE v2";
	default:
		return "unknown";
	}
}

/* Picks and checks the GID: the configured index, or the default rule of the file comment. */
static int vb_pick_gid(struct vb_prov *pv, const struct vb_cfg *c, int gid_tbl_len,
		       uint32_t *type)
{
	const struct mp_verbs_ibv *ibv = pv->ibv;
	struct ibv_gid_entry e;

	if (c->gid_index >= 0) {
		if (c->gid_index >= gid_tbl_len) {
			MP_WARN("verbs: MP_IB_GID_INDEX=%d is out of range: %s port %u has %d GIDs "
				"(show_gids or ibv_devinfo -v lists them)",
				c->gid_index, pv->dev_name, pv->port, gid_tbl_len);
			return -EINVAL;
		}
		memset(&e, 0, sizeof(e));
		if (ibv->query_gid_ex(pv->ctx, pv->port, (uint32_t)c->gid_index, &e) != 0 ||
		    vb_gid_is_zero(&e.gid)) {
			MP_WARN("verbs: MP_IB_GID_INDEX=%d: GID %d of %s port %u is empty", c->gid_index,
				c->gid_index, pv->dev_name, pv->port);
			return -EINVAL;
		}
		pv->gid_index = (uint8_t)c->gid_index;
		pv->gid = e.gid;
		*type = e.gid_type;
		return 0;
	}

	if (pv->link_layer == IBV_LINK_LAYER_ETHERNET) {
		/*
		 * RoCE v2 rides on UDP/IP and crosses routers; a v1 or an IPv6
		 * link-local GID would only reach the local segment.
		 */
		for (int i = 0; i < gid_tbl_len && i <= 255; i++) {
			memset(&e, 0, sizeof(e));
			if (ibv->query_gid_ex(pv->ctx, pv->port, (uint32_t)i, &e) != 0)
				continue;
			if (e.gid_type == IBV_GID_TYPE_ROCE_V2 && vb_gid_is_ipv4(&e.gid)) {
				pv->gid_index = (uint8_t)i;
				pv->gid = e.gid;
				*type = e.gid_type;
				return 0;
			}
		}
	}
	memset(&e, 0, sizeof(e));
	if (ibv->query_gid_ex(pv->ctx, pv->port, 0, &e) != 0 || vb_gid_is_zero(&e.gid)) {
		if (pv->link_layer == IBV_LINK_LAYER_ETHERNET) {
			MP_WARN("verbs: %s port %u has no usable GID: does its network interface "
				"have an IP address?", pv->dev_name, pv->port);
			return -ENODEV;
		}
		/* InfiniBand addresses by LID; the GID only matters across subnets. */
		memset(&e, 0, sizeof(e));
		e.gid_type = IBV_GID_TYPE_IB;
	}
	pv->gid_index = 0;
	pv->gid = e.gid;
	*type = e.gid_type;
	return 0;
}

/* Opens the device and port that the configuration names, or the first active one. */
static int vb_pick_device(struct vb_prov *pv, const struct vb_cfg *c, struct ibv_port_attr *pa)
{
	const struct mp_verbs_ibv *ibv = pv->ibv;
	int n = 0;

	errno = 0;
	struct ibv_device **list = ibv->get_device_list(&n);
	if (!list || n <= 0) {
		char why[96];
		if (!list)
			snprintf(why, sizeof(why), "ibv_get_device_list: %s",
				 strerror(errno ? errno : ENODEV));
		else
			snprintf(why, sizeof(why), "ibv_get_device_list found none");
		if (c->hca[0])
			MP_WARN("verbs: no RDMA device (%s); looked for MP_IB_HCA=%s%s%.0d; is "
				"rdma-core's provider for the NIC installed (ibverbs-providers) "
				"and the NIC's kernel driver loaded? (ibv_devinfo, doc/rdma.md)",
				why, c->hca, c->port ? ":" : "", c->port);
		else
			MP_WARN("verbs: no RDMA device (%s); looked for any device with an "
				"active port (MP_IB_HCA unset); is rdma-core's provider for the "
				"NIC installed (ibverbs-providers) and the NIC's kernel driver "
				"loaded? (ibv_devinfo, doc/rdma.md)", why);
		if (list)
			ibv->free_device_list(list);
		return -ENODEV;
	}

	char seen[256] = "";
	size_t used = 0;
	bool named = false; /* the device MP_IB_HCA names exists */
	int rc = -ENODEV;
	for (int i = 0; i < n && rc == -ENODEV; i++) {
		const char *name = ibv->get_device_name(list[i]);
		if (!name)
			continue;
		if (used < sizeof(seen))
			used += (size_t)snprintf(seen + used, sizeof(seen) - used, "%s%s",
						 used ? " " : "", name);
		if (c->hca[0] && strcmp(name, c->hca) != 0)
			continue;
		named = true;
		errno = 0;
		struct ibv_context *ctx = ibv->open_device(list[i]);
		if (!ctx) {
			MP_WARN("verbs: cannot open %s: %s", name, strerror(errno ? errno : EIO));
			continue;
		}
		struct ibv_device_attr da;
		memset(&da, 0, sizeof(da));
		if (ibv->query_device(ctx, &da) != 0) {
			MP_WARN("verbs: cannot query %s", name);
			ibv->close_device(ctx);
			continue;
		}
		if (c->port > da.phys_port_cnt) {
			MP_WARN("verbs: MP_IB_HCA=%s:%d: %s has ports 1 to %u", c->hca, c->port, name,
				da.phys_port_cnt);
			ibv->close_device(ctx);
			rc = -EINVAL;
			break;
		}
		int first = c->port ? c->port : 1, last = c->port ? c->port : da.phys_port_cnt;
		for (int port = first; port <= last; port++) {
			memset(pa, 0, sizeof(*pa));
			if (ibv->query_port(ctx, (uint8_t)port, pa) != 0)
				continue;
			if (pa->state == IBV_PORT_ACTIVE) {
				snprintf(pv->dev_name, sizeof(pv->dev_name), "%s", name);
				pv->ctx = ctx;
				pv->port = (uint8_t)port;
				rc = 0;
				break;
			}
			if (c->port)
				MP_WARN("verbs: MP_IB_HCA=%s:%d: the port is %s, not ACTIVE", c->hca,
					c->port, ibv_port_state_str(pa->state));
		}
		if (rc != 0) {
			if (!c->port && c->hca[0])
				MP_WARN("verbs: MP_IB_HCA=%s: no port of %s is ACTIVE", c->hca, name);
			ibv->close_device(ctx);
			if (c->hca[0])
				break;
		}
	}
	ibv->free_device_list(list);
	if (rc == -ENODEV && c->hca[0] && !named)
		MP_WARN("verbs: MP_IB_HCA=%s: no such device; found: %s", c->hca, seen);
	else if (rc == -ENODEV && !c->hca[0])
		MP_WARN("verbs: no RDMA device has an active port (found: %s); check the cable "
			"or the subnet manager (ibstat)", seen);
	return rc;
}

/* ---- open / close ------------------------------------------------------ */

static void vb_close(struct mp_rdma_prov *p);

static int vb_open(const struct mp_rdma_params *p, struct mp_rdma_prov **out)
{
	struct vb_cfg cfg;
	int rc = vb_read_env(&cfg);
	if (rc)
		return rc;
	if (!p || !out || p->max_eps < 0 || p->max_eps > VB_MAX_EPS || p->max_outstanding < 0)
		return -EINVAL;

	struct vb_prov *pv = calloc(1, sizeof(*pv));
	if (!pv)
		return -ENOMEM;
	pv->ibv = mp_verbs_ibv;

	struct ibv_port_attr pa;
	rc = vb_pick_device(pv, &cfg, &pa);
	if (rc) {
		free(pv);
		return rc;
	}
	pv->link_layer = pa.link_layer == IBV_LINK_LAYER_ETHERNET ? IBV_LINK_LAYER_ETHERNET
								   : IBV_LINK_LAYER_INFINIBAND;
	pv->mtu = pa.active_mtu;
	pv->lid = pa.lid;
	pv->max_msg = pa.max_msg_sz ? pa.max_msg_sz : UINT32_MAX;
	uint32_t gid_type;
	rc = vb_pick_gid(pv, &cfg, pa.gid_tbl_len, &gid_type);
	if (rc)
		goto fail;

	struct ibv_device_attr da;
	memset(&da, 0, sizeof(da));
	if (pv->ibv->query_device(pv->ctx, &da) != 0) {
		rc = -EIO;
		goto fail;
	}
	/* Queue depths within what the device allows; one send slot stays free for the flush marker. */
	uint32_t max_wr = da.max_qp_wr > 2 ? (uint32_t)da.max_qp_wr : 2;
	pv->max_outstanding = p->max_outstanding ? (uint32_t)p->max_outstanding : VB_DEF_OUTSTANDING;
	if (pv->max_outstanding > max_wr - 1)
		pv->max_outstanding = max_wr - 1;
	pv->sq_depth = pv->max_outstanding + 1;
	pv->rq_depth = 2 * pv->max_outstanding < max_wr ? 2 * pv->max_outstanding : max_wr;
	pv->sig_every = pv->max_outstanding / 2 ? pv->max_outstanding / 2 : 1;
	pv->max_eps = p->max_eps ? p->max_eps : VB_DEF_EPS;
	/* Every work request of every endpoint may sit in the CQ at once; it must never overflow. */
	long per_ep = (long)pv->sq_depth + pv->rq_depth;
	long max_cqe = da.max_cqe > 0 ? da.max_cqe : INT_MAX;
	pv->per_ep = per_ep;
	if ((long)pv->max_eps * per_ep > max_cqe) {
		pv->max_eps = (int)(max_cqe / per_ep);
		MP_INFO("verbs: %s completion queues hold %d entries: room for %d endpoints",
			pv->dev_name, da.max_cqe, pv->max_eps);
		if (pv->max_eps < 1) {
			rc = -ENOMEM;
			goto fail;
		}
	}
	pv->retry_cnt = (uint8_t)cfg.retry_cnt;
	pv->timeout = (uint8_t)(cfg.timeout > 0 ? cfg.timeout
						: vb_pick_timeout(p->timeout_ms, cfg.retry_cnt));

	pv->slots = calloc((size_t)pv->max_eps, sizeof(*pv->slots));
	if (!pv->slots) {
		rc = -ENOMEM;
		goto fail;
	}
	errno = 0;
	pv->pd = pv->ibv->alloc_pd(pv->ctx);
	if (!pv->pd) {
		rc = -(errno ? errno : ENOMEM);
		MP_WARN("verbs: ibv_alloc_pd on %s: %s", pv->dev_name, strerror(-rc));
		goto fail;
	}
	/*
	 * The CQ is pinned memory (64 bytes an entry on mlx5): sized for all
	 * of max_eps at once it would take 25 MB for the protocol's 1024
	 * endpoints of 128 writes. It starts with room for a few endpoints
	 * and vb_cq_reserve grows it as endpoints are created.
	 */
	long first = (pv->max_eps < VB_CQ_START_EPS ? pv->max_eps : VB_CQ_START_EPS) * per_ep;
	errno = 0;
	pv->cq = pv->ibv->create_cq(pv->ctx, (int)first);
	if (!pv->cq) {
		rc = -(errno ? errno : ENOMEM);
		MP_WARN("verbs: ibv_create_cq(%ld) on %s: %s", first, pv->dev_name, strerror(-rc));
		goto fail;
	}

	char gs[INET6_ADDRSTRLEN];
	vb_gid_str(&pv->gid, gs, sizeof(gs));
	MP_INFO("verbs: %s port %u, %s, GID %u %s (%s), LID %u, MTU %d, timeout %u retry %u "
		"(a silent peer fails writes after about %.0f ms)",
		pv->dev_name, pv->port,
		pv->link_layer == IBV_LINK_LAYER_ETHERNET ? "RoCE" : "InfiniBand", pv->gid_index,
		gs, vb_gid_type_str(gid_type), pv->lid, 128 << pv->mtu, pv->timeout, pv->retry_cnt,
		vb_give_up_ms(pv->timeout, pv->retry_cnt));
	if (pv->link_layer == IBV_LINK_LAYER_ETHERNET && gid_type != IBV_GID_TYPE_ROCE_V2)
		MP_INFO("verbs: GID %u is %s: traffic stays on the local segment; set "
			"MP_IB_GID_INDEX to a RoCE v2 GID to cross routers", pv->gid_index,
			vb_gid_type_str(gid_type));
	*out = (struct mp_rdma_prov *)(void *)pv;
	return 0;

fail:
	vb_close((struct mp_rdma_prov *)(void *)pv);
	return rc;
}

/* ---- completions ------------------------------------------------------- */

static int vb_status(enum ibv_wc_status s)
{
	switch (s) {
	case IBV_WC_SUCCESS:
		return 0;
	case IBV_WC_RETRY_EXC_ERR:
		return -ETIMEDOUT;
	case IBV_WC_REM_ACCESS_ERR:
		return -EACCES;
	case IBV_WC_WR_FLUSH_ERR:
		return -ECANCELED;
	default:
		return -EIO;
	}
}

static uint64_t vb_wr_id(const struct vb_ep *ep, uint32_t idx)
{
	return ((uint64_t)ep->slot << 48) | ((uint64_t)ep->gen << 32) | idx;
}

static void vb_ep_error(struct vb_ep *ep, const struct ibv_wc *wc, const char *what)
{
	if (ep->state == VB_EP_RTS)
		ep->state = VB_EP_FAILED;
	if (wc->status == IBV_WC_WR_FLUSH_ERR || ep->error_logged)
		return;
	ep->error_logged = true;
	const char *hint = "";
	if (wc->status == IBV_WC_RETRY_EXC_ERR)
		hint = ": the peer did not answer (gone, unreachable, or on RoCE a wrong GID "
		       "index; MP_IB_TIMEOUT/MP_IB_RETRY_CNT set the patience)";
	else if (wc->status == IBV_WC_REM_ACCESS_ERR)
		hint = ": the peer refused the address or key";
	MP_WARN("verbs: %s on %s to QP 0x%x failed: %s (vendor error 0x%x)%s", what, ep->pv->dev_name,
		ep->remote_qpn, ibv_wc_status_str(wc->status), wc->vendor_err, hint);
}

/* Keeps the endpoint's receive queue full, so that every immediate finds a receive. */
static int vb_top_up(struct vb_ep *ep)
{
	struct vb_prov *pv = ep->pv;
	if (ep->state == VB_EP_FAILED)
		return 0;
	while (ep->rq_posted < pv->rq_depth) {
		struct ibv_recv_wr wr[16];
		uint32_t k = pv->rq_depth - ep->rq_posted;
		if (k > 16)
			k = 16;
		memset(wr, 0, sizeof(wr));
		for (uint32_t i = 0; i < k; i++) {
			/* Zero-length: a write with immediate only needs the work request itself. */
			wr[i].wr_id = VB_WR_RECV | vb_wr_id(ep, 0);
			wr[i].next = i + 1 < k ? &wr[i + 1] : NULL;
		}
		struct ibv_recv_wr *bad = NULL;
		int rc = pv->ibv->post_recv(ep->qp, wr, &bad);
		if (rc) {
			ep->rq_posted += bad ? (uint32_t)(bad - wr) : 0;
			MP_WARN("verbs: posting receives on %s: %s", pv->dev_name, strerror(rc));
			return -rc;
		}
		ep->rq_posted += k;
	}
	return 0;
}

/* Turns one work completion into at most one of ours; returns 1 when @p cqe was filled. */
static int vb_wc(struct vb_prov *pv, const struct ibv_wc *wc, struct mp_rdma_cqe *cqe)
{
	uint32_t slot = (uint32_t)(wc->wr_id >> 48) & VB_MAX_EPS;
	uint16_t gen = (uint16_t)(wc->wr_id >> 32);
	if ((int)slot >= pv->max_eps || !pv->slots[slot].ep || pv->slots[slot].gen != gen) {
		MP_TRACE("verbs: completion of a destroyed endpoint dropped (%s)",
			 ibv_wc_status_str(wc->status));
		return 0;
	}
	struct vb_ep *ep = pv->slots[slot].ep;
	memset(cqe, 0, sizeof(*cqe));
	cqe->ep = from_ep(ep);

	if (wc->wr_id & VB_WR_RECV) {
		if (ep->rq_posted)
			ep->rq_posted--;
		if (wc->status != IBV_WC_SUCCESS) {
			vb_ep_error(ep, wc, "a peer's write");
			/* Flushes follow an error already reported, or a destroy. */
			if (wc->status == IBV_WC_WR_FLUSH_ERR)
				return 0;
			cqe->op = MP_RDMA_CQE_IMM;
			cqe->status = vb_status(wc->status);
			return 1;
		}
		vb_top_up(ep);
		if (wc->opcode != IBV_WC_RECV_RDMA_WITH_IMM) {
			MP_WARN("verbs: unexpected receive (opcode %d) from QP 0x%x ignored",
				(int)wc->opcode, ep->remote_qpn);
			return 0;
		}
		cqe->op = MP_RDMA_CQE_IMM;
		cqe->imm = ntohl(wc->imm_data);
		cqe->len = wc->byte_len;
		return 1;
	}

	uint32_t idx = (uint32_t)wc->wr_id;
	if (idx >= pv->sq_depth)
		return 0;
	struct vb_swr *s = &ep->swr[idx];
	/* RC completes in order: everything posted before this one is done too. */
	if (s->seq + 1 > ep->sq_done)
		ep->sq_done = s->seq + 1;
	if (s->marker) {
		ep->draining = false;
		return 0;
	}
	if (wc->status != IBV_WC_SUCCESS)
		vb_ep_error(ep, wc, "a write");
	else if (!s->report)
		return 0;
	cqe->op = MP_RDMA_CQE_WRITE;
	cqe->status = vb_status(wc->status);
	cqe->wr_id = s->wr_id;
	return 1;
}

static int vb_backlog_push(struct vb_prov *pv, const struct mp_rdma_cqe *c)
{
	if (pv->bl_count == pv->bl_cap) {
		int cap = pv->bl_cap ? 2 * pv->bl_cap : 64;
		struct mp_rdma_cqe *nb = malloc((size_t)cap * sizeof(*nb));
		if (!nb)
			return -ENOMEM;
		for (int i = 0; i < pv->bl_count; i++)
			nb[i] = pv->backlog[(pv->bl_head + i) % pv->bl_cap];
		free(pv->backlog);
		pv->backlog = nb;
		pv->bl_cap = cap;
		pv->bl_head = 0;
	}
	pv->backlog[(pv->bl_head + pv->bl_count) % pv->bl_cap] = *c;
	pv->bl_count++;
	return 0;
}

/*
 * Moves the queue pair to the error state, which flushes its outstanding
 * writes, and reaps the CQ until a marker posted behind them comes back:
 * the writes then complete with -ECANCELED (other endpoints' completions
 * found on the way wait in the backlog for the next poll).
 */
static void vb_drain(struct vb_ep *ep)
{
	struct vb_prov *pv = ep->pv;
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_ERR;
	int rc = pv->ibv->modify_qp(ep->qp, &a, IBV_QP_STATE);
	if (rc) {
		MP_WARN("verbs: cannot move QP 0x%x to the error state: %s; its writes are dropped",
			ep->qp->qp_num, strerror(rc));
		return;
	}
	ep->state = VB_EP_FAILED;

	/* The ring keeps one slot beyond max_outstanding for this marker. */
	uint32_t idx = (uint32_t)(ep->sq_posted % pv->sq_depth);
	ep->swr[idx] = (struct vb_swr){.seq = ep->sq_posted, .marker = true};
	struct ibv_send_wr wr, *bad = NULL;
	memset(&wr, 0, sizeof(wr));
	wr.wr_id = vb_wr_id(ep, idx);
	wr.opcode = IBV_WR_RDMA_WRITE;
	wr.send_flags = IBV_SEND_SIGNALED;
	rc = pv->ibv->post_send(ep->qp, &wr, &bad);
	if (rc) {
		MP_WARN("verbs: cannot post the flush marker on QP 0x%x: %s; its writes are dropped",
			ep->qp->qp_num, strerror(rc));
		return;
	}
	ep->sq_posted++;
	ep->draining = true;
	uint64_t deadline = mp_now_ms() + VB_DRAIN_MS;
	while (ep->draining) {
		struct ibv_wc wc[VB_POLL_BATCH];
		int got = pv->ibv->poll_cq(pv->cq, VB_POLL_BATCH, wc);
		if (got < 0)
			break;
		for (int i = 0; i < got; i++) {
			struct mp_rdma_cqe c;
			if (vb_wc(pv, &wc[i], &c) && vb_backlog_push(pv, &c) != 0)
				MP_WARN("verbs: out of memory: a completion was lost");
		}
		if (got == 0 && mp_now_ms() > deadline) {
			MP_WARN("verbs: QP 0x%x did not flush within %d ms; its writes are dropped",
				ep->qp->qp_num, VB_DRAIN_MS);
			break;
		}
	}
}

static void vb_ep_free(struct vb_ep *ep)
{
	struct vb_prov *pv = ep->pv;
	if (ep->sq_posted != ep->sq_done)
		vb_drain(ep);
	int rc = pv->ibv->destroy_qp(ep->qp);
	if (rc)
		MP_WARN("verbs: ibv_destroy_qp: %s", strerror(rc));
	/* A new generation: completions the QP left in the CQ no longer match. */
	pv->slots[ep->slot].ep = NULL;
	pv->slots[ep->slot].gen++;
	pv->neps--;
	free(ep->swr);
	free(ep);
}

/* ---- endpoints --------------------------------------------------------- */

/* A random first PSN, so that a stale packet of an earlier QP with the same number is refused. */
static uint32_t vb_psn(uint32_t slot)
{
	uint32_t r;
	if (getrandom(&r, sizeof(r), GRND_NONBLOCK) != (ssize_t)sizeof(r))
		r = (uint32_t)time(NULL) ^ (uint32_t)getpid() ^ (slot * 2654435761u);
	return r & 0xffffff;
}

/*
 * Makes the CQ hold every work request of @neps endpoints, so that it can
 * never overflow (an overrun CQ is an asynchronous error that takes every
 * queue pair on it down). It grows by doubling, up to max_eps endpoints'
 * worth, so that a run that opens endpoints one by one resizes only a
 * logarithmic number of times; it does not shrink when endpoints go, as
 * the next ones would only grow it again.
 */
static int vb_cq_reserve(struct vb_prov *pv, int neps)
{
	long need = neps * pv->per_ep;
	if (pv->cq->cqe >= need)
		return 0;
	long limit = pv->max_eps * pv->per_ep;
	long want = 2L * pv->cq->cqe;
	if (want > limit)
		want = limit;
	if (want < need)
		want = need;
	int old = pv->cq->cqe;
	int rc = pv->ibv->resize_cq(pv->cq, (int)want);
	/* A provider may round the size up, never down; a smaller one is refused as well. */
	if (rc == 0 && pv->cq->cqe < need)
		rc = ENOSPC;
	if (rc) {
		MP_WARN("verbs: %s: cannot grow the completion queue from %d to %ld entries to "
			"make room for %d endpoints (ibv_resize_cq: %s); the new endpoint is not "
			"created", pv->dev_name, old, want, neps, strerror(rc));
		return -rc;
	}
	MP_INFO("verbs: %s: completion queue grown from %d to %d entries for %d endpoints",
		pv->dev_name, old, pv->cq->cqe, neps);
	return 0;
}

static int vb_ep_create(struct mp_rdma_prov *p, void *blob, size_t *len, struct mp_rdma_ep **out)
{
	struct vb_prov *pv = to_vb(p);
	if (!pv || !blob || !len || !out)
		return -EINVAL;
	if (*len < VB_BLOB_LEN)
		return -ENOSPC;
	if (pv->neps >= pv->max_eps) {
		MP_WARN("verbs: %s: all %d endpoints in use (mp_rdma_params.max_eps)", pv->dev_name,
			pv->max_eps);
		return -ENOSPC;
	}
	int rc = vb_cq_reserve(pv, pv->neps + 1);
	if (rc)
		return rc;
	int slot = 0;
	while (pv->slots[slot].ep)
		slot++;

	struct vb_ep *ep = calloc(1, sizeof(*ep));
	if (!ep)
		return -ENOMEM;
	ep->swr = calloc(pv->sq_depth, sizeof(*ep->swr));
	if (!ep->swr) {
		free(ep);
		return -ENOMEM;
	}
	ep->pv = pv;
	ep->slot = (uint32_t)slot;
	ep->gen = pv->slots[slot].gen;

	struct ibv_qp_init_attr ia;
	memset(&ia, 0, sizeof(ia));
	ia.send_cq = pv->cq;
	ia.recv_cq = pv->cq;
	ia.qp_type = IBV_QPT_RC;
	ia.cap.max_send_wr = pv->sq_depth;
	ia.cap.max_recv_wr = pv->rq_depth;
	ia.cap.max_send_sge = 1;
	ia.cap.max_recv_sge = 1;
	ia.cap.max_inline_data = VB_INLINE;
	errno = 0;
	ep->qp = pv->ibv->create_qp(pv->pd, &ia);
	if (!ep->qp) {
		rc = -(errno ? errno : ENOMEM);
		MP_WARN("verbs: ibv_create_qp on %s (%u sends, %u receives, %d inline bytes): %s",
			pv->dev_name, pv->sq_depth, pv->rq_depth, VB_INLINE, strerror(-rc));
		free(ep->swr);
		free(ep);
		return rc;
	}
	pv->slots[slot].ep = ep;
	pv->neps++;

	struct ibv_qp_attr a;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_INIT;
	a.pkey_index = 0;
	a.port_num = pv->port;
	a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
	rc = pv->ibv->modify_qp(ep->qp, &a,
				IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
	if (rc) {
		MP_WARN("verbs: QP 0x%x to INIT: %s", ep->qp->qp_num, strerror(rc));
		vb_ep_free(ep);
		return -rc;
	}
	/* Receives before the peer can write: a write with immediate must find one. */
	rc = vb_top_up(ep);
	if (rc) {
		vb_ep_free(ep);
		return rc;
	}
	ep->psn = vb_psn(ep->slot);

	uint8_t *b = blob;
	memset(b, 0, VB_BLOB_LEN);
	b[0] = VB_BLOB_MAGIC;
	b[1] = VB_BLOB_VERSION;
	b[2] = pv->link_layer;
	b[3] = (uint8_t)pv->mtu;
	mp_le_put32(b + 4, ep->qp->qp_num);
	mp_le_put32(b + 8, ep->psn);
	mp_le_put16(b + 12, pv->lid);
	b[14] = pv->port;
	b[15] = pv->gid_index;
	memcpy(b + 16, pv->gid.raw, 16);
	*len = VB_BLOB_LEN;
	*out = from_ep(ep);
	return 0;
}

static int vb_ep_connect(struct mp_rdma_ep *e, const void *blob, size_t len)
{
	struct vb_ep *ep = to_ep(e);
	if (!ep || !blob)
		return -EINVAL;
	struct vb_prov *pv = ep->pv;
	if (ep->state != VB_EP_INIT)
		return -EISCONN;
	const uint8_t *b = blob;
	if (len != VB_BLOB_LEN || b[0] != VB_BLOB_MAGIC || b[1] != VB_BLOB_VERSION) {
		MP_WARN("verbs: the peer's endpoint description is not a verbs one (%zu bytes)", len);
		return -EINVAL;
	}
	if (b[2] != pv->link_layer) {
		MP_WARN("verbs: the peer is on %s, this port on %s: they cannot connect",
			b[2] == IBV_LINK_LAYER_ETHERNET ? "RoCE" : "InfiniBand",
			pv->link_layer == IBV_LINK_LAYER_ETHERNET ? "RoCE" : "InfiniBand");
		return -EINVAL;
	}
	enum ibv_mtu rmtu = (enum ibv_mtu)b[3];
	uint32_t rqpn = mp_le_get32(b + 4) & 0xffffff;
	uint32_t rpsn = mp_le_get32(b + 8) & 0xffffff;
	uint16_t rlid = mp_le_get16(b + 12);
	union ibv_gid rgid;
	memcpy(rgid.raw, b + 16, 16);
	if (rmtu < IBV_MTU_256 || rmtu > IBV_MTU_4096) {
		MP_WARN("verbs: the peer's endpoint description has a bad MTU (%d)", (int)rmtu);
		return -EINVAL;
	}

	struct ibv_qp_attr a;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = rmtu < pv->mtu ? rmtu : pv->mtu;
	a.dest_qp_num = rqpn;
	a.rq_psn = rpsn;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = VB_MIN_RNR_TIMER;
	a.ah_attr.port_num = pv->port;
	a.ah_attr.dlid = rlid;
	/*
	 * RoCE always routes by GID; InfiniBand by LID, with a global route
	 * header only towards another subnet.
	 */
	if (pv->link_layer == IBV_LINK_LAYER_ETHERNET ||
	    (!vb_gid_is_zero(&rgid) &&
	     rgid.global.subnet_prefix != pv->gid.global.subnet_prefix)) {
		a.ah_attr.is_global = 1;
		a.ah_attr.grh.dgid = rgid;
		a.ah_attr.grh.sgid_index = pv->gid_index;
		a.ah_attr.grh.hop_limit = 255;
	}
	int rc = pv->ibv->modify_qp(ep->qp, &a,
				    IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
				    IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
	if (rc) {
		char gs[INET6_ADDRSTRLEN];
		vb_gid_str(&rgid, gs, sizeof(gs));
		MP_WARN("verbs: QP 0x%x to RTR towards QP 0x%x (LID %u, GID %s): %s", ep->qp->qp_num,
			rqpn, rlid, gs, strerror(rc));
		return -rc;
	}
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = pv->timeout;
	a.retry_cnt = pv->retry_cnt;
	a.rnr_retry = VB_RNR_RETRY;
	a.sq_psn = ep->psn;
	a.max_rd_atomic = 1;
	rc = pv->ibv->modify_qp(ep->qp, &a,
				IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
				IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
	if (rc) {
		MP_WARN("verbs: QP 0x%x to RTS: %s", ep->qp->qp_num, strerror(rc));
		return -rc;
	}
	ep->remote_qpn = rqpn;
	ep->state = VB_EP_RTS;
	MP_TRACE("verbs: QP 0x%x connected to QP 0x%x (LID %u, MTU %d)", ep->qp->qp_num, rqpn, rlid,
		 128 << a.path_mtu);
	return 0;
}

static void vb_ep_destroy(struct mp_rdma_ep *e)
{
	if (e)
		vb_ep_free(to_ep(e));
}

/* ---- memory registration ----------------------------------------------- */

#define VB_ACCESS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE)

/*
 * GPUDirect RDMA: the dma-buf of the allocation first (upstream kernels,
 * no extra module), then ibv_reg_mr on the device pointer (which works when
 * nvidia-peermem is loaded), else -EOPNOTSUPP: the protocol then stages the
 * data through registered host memory. The path taken is logged at INFO.
 */
static int vb_reg_cuda(struct vb_prov *pv, void *addr, size_t len, struct ibv_mr **mr)
{
#ifdef MP_HAVE_CUDA
	char why[128];
	long pg = sysconf(_SC_PAGESIZE);
	if (pg <= 0)
		pg = 4096;
	/* cuMemGetHandleForAddressRange takes page-aligned ranges; the MR covers only ours. */
	uintptr_t base = (uintptr_t)addr & ~(uintptr_t)(pg - 1);
	uintptr_t end = ((uintptr_t)addr + len + (uintptr_t)pg - 1) & ~(uintptr_t)(pg - 1);
	int fd = -1;
	int rc = pv->ibv->cuda_dmabuf_fd((void *)base, end - base, &fd);
	if (rc == 0) {
		errno = 0;
		*mr = pv->ibv->reg_dmabuf_mr(pv->pd, (uint64_t)((uintptr_t)addr - base), len,
					     (uint64_t)(uintptr_t)addr, fd, VB_ACCESS);
		int e = errno;
		/* The registration holds its own reference to the dma-buf. */
		close(fd);
		if (*mr) {
			MP_INFO("verbs: CUDA memory %p (%zu bytes) registered through dma-buf "
				"(ibv_reg_dmabuf_mr): GPUDirect RDMA", addr, len);
			return 0;
		}
		snprintf(why, sizeof(why), "ibv_reg_dmabuf_mr: %s", strerror(e ? e : EIO));
	} else {
		snprintf(why, sizeof(why), "no dma-buf from CUDA: %s", strerror(-rc));
	}
	errno = 0;
	*mr = pv->ibv->reg_mr(pv->pd, addr, len, VB_ACCESS);
	if (*mr) {
		MP_INFO("verbs: CUDA memory %p (%zu bytes) registered through nvidia-peermem "
			"(ibv_reg_mr; %s): GPUDirect RDMA", addr, len, why);
		return 0;
	}
	int e = errno;
	MP_INFO("verbs: CUDA memory %p (%zu bytes) cannot be registered (%s; ibv_reg_mr: %s): "
		"staged through host memory", addr, len, why, strerror(e ? e : EIO));
	return -EOPNOTSUPP;
#else
	(void)pv;
	*mr = NULL;
	MP_INFO("verbs: built without CUDA: CUDA memory %p (%zu bytes) is staged through host "
		"memory", addr, len);
	return -EOPNOTSUPP;
#endif
}

static int vb_reg(struct mp_rdma_prov *p, void *addr, size_t len, enum mp_mem_kind kind,
		  struct mp_rdma_mr **out)
{
	struct vb_prov *pv = to_vb(p);
	if (!pv || !addr || !len || !out)
		return -EINVAL;
	if (kind != MP_MEM_HOST && kind != MP_MEM_CUDA) {
		/* A dma-buf needs its file descriptor, which this entry does not take. */
		MP_INFO("verbs: memory of kind %d is staged through host memory", (int)kind);
		return -EOPNOTSUPP;
	}
	struct vb_mr *h = calloc(1, sizeof(*h));
	if (!h)
		return -ENOMEM;

	/* The cache: a range inside one already registered shares its ibv_mr. */
	struct vb_mrent *ent = pv->mrents;
	while (ent && !(ent->kind == kind && ent->addr <= (char *)addr &&
			(char *)addr + len <= ent->addr + ent->len))
		ent = ent->next;
	if (!ent) {
		ent = calloc(1, sizeof(*ent));
		if (!ent) {
			free(h);
			return -ENOMEM;
		}
		int rc = 0;
		if (kind == MP_MEM_CUDA) {
			rc = vb_reg_cuda(pv, addr, len, &ent->mr);
		} else {
			errno = 0;
			ent->mr = pv->ibv->reg_mr(pv->pd, addr, len, VB_ACCESS);
			if (!ent->mr) {
				rc = -(errno ? errno : ENOMEM);
				MP_WARN("verbs: ibv_reg_mr(%p, %zu) on %s: %s%s", addr, len, pv->dev_name,
					strerror(-rc),
					rc == -ENOMEM || rc == -EPERM
						? " (raise the locked-memory limit: ulimit -l unlimited, "
						  "or LimitMEMLOCK=infinity for a service)"
						: "");
			}
		}
		if (rc) {
			free(ent);
			free(h);
			return rc;
		}
		ent->addr = addr;
		ent->len = len;
		ent->kind = kind;
		ent->next = pv->mrents;
		pv->mrents = ent;
	}
	ent->refs++;
	h->ent = ent;
	h->pub.addr = addr;
	h->pub.len = len;
	h->pub.rkey = ent->mr->rkey;
	h->pub.desc = (void *)(uintptr_t)ent->mr->lkey;
	h->pub.kind = kind;
	h->next = pv->handles;
	if (pv->handles)
		pv->handles->prev = h;
	pv->handles = h;
	*out = &h->pub;
	return 0;
}

static void vb_mrent_put(struct vb_prov *pv, struct vb_mrent *ent)
{
	if (--ent->refs > 0)
		return;
	struct vb_mrent **pp = &pv->mrents;
	while (*pp != ent)
		pp = &(*pp)->next;
	*pp = ent->next;
	int rc = pv->ibv->dereg_mr(ent->mr);
	if (rc)
		MP_WARN("verbs: ibv_dereg_mr: %s", strerror(rc));
	free(ent);
}

static void vb_dereg(struct mp_rdma_prov *p, struct mp_rdma_mr *mr)
{
	struct vb_prov *pv = to_vb(p);
	if (!pv || !mr)
		return;
	struct vb_mr *h = (struct vb_mr *)(void *)((char *)mr - offsetof(struct vb_mr, pub));
	if (h->prev)
		h->prev->next = h->next;
	else
		pv->handles = h->next;
	if (h->next)
		h->next->prev = h->prev;
	vb_mrent_put(pv, h->ent);
	free(h);
}

/* ---- data path --------------------------------------------------------- */

static int vb_write(struct mp_rdma_ep *e, const void *src, size_t len, struct mp_rdma_mr *mr,
		    uint64_t raddr, uint64_t rkey, uint32_t imm, unsigned flags, uint64_t wr_id)
{
	struct vb_ep *ep = to_ep(e);
	if (!ep || (len && !src) || rkey > UINT32_MAX)
		return -EINVAL;
	struct vb_prov *pv = ep->pv;
	if (ep->state != VB_EP_RTS)
		return ep->state == VB_EP_FAILED ? -ECONNRESET : -ENOTCONN;
	bool inl = flags & MP_RDMA_WR_INLINE;
	if (inl && len > VB_INLINE)
		return -EMSGSIZE;
	if (!inl && len && (!mr || (const char *)src < (const char *)mr->addr ||
			    (const char *)src + len > (const char *)mr->addr + mr->len))
		return -EINVAL;
	if (len > pv->max_msg)
		return -EMSGSIZE;
	if (ep->sq_posted - ep->sq_done >= pv->max_outstanding)
		return -EAGAIN;

	uint32_t idx = (uint32_t)(ep->sq_posted % pv->sq_depth);
	ep->swr[idx] = (struct vb_swr){
		.seq = ep->sq_posted,
		.wr_id = wr_id,
		.report = (flags & MP_RDMA_WR_SIGNAL) != 0,
	};
	struct ibv_sge sge = {
		.addr = (uintptr_t)src,
		.length = (uint32_t)len,
		.lkey = inl || !len ? 0 : (uint32_t)(uintptr_t)mr->desc,
	};
	struct ibv_send_wr wr, *bad = NULL;
	memset(&wr, 0, sizeof(wr));
	wr.wr_id = vb_wr_id(ep, idx);
	wr.sg_list = len ? &sge : NULL;
	wr.num_sge = len ? 1 : 0;
	wr.opcode = (flags & MP_RDMA_WR_IMM) ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE;
	/* Signalled on request, and periodically so that the send ring's progress is known. */
	if ((flags & MP_RDMA_WR_SIGNAL) || (ep->sq_posted + 1) % pv->sig_every == 0)
		wr.send_flags |= IBV_SEND_SIGNALED;
	if (inl)
		wr.send_flags |= IBV_SEND_INLINE;
	wr.imm_data = htonl(imm);
	wr.wr.rdma.remote_addr = raddr;
	wr.wr.rdma.rkey = (uint32_t)rkey;
	int rc = pv->ibv->post_send(ep->qp, &wr, &bad);
	if (rc)
		return rc == ENOMEM ? -EAGAIN : -rc;
	ep->sq_posted++;
	return 0;
}

static size_t vb_max_inline(struct mp_rdma_prov *p)
{
	(void)p;
	return VB_INLINE;
}

static int vb_poll(struct mp_rdma_prov *p, struct mp_rdma_cqe *out, int max)
{
	struct vb_prov *pv = to_vb(p);
	if (!pv || !out || max < 0)
		return -EINVAL;
	int n = 0;
	while (n < max && pv->bl_count) {
		out[n++] = pv->backlog[pv->bl_head];
		pv->bl_head = (pv->bl_head + 1) % pv->bl_cap;
		pv->bl_count--;
	}
	while (n < max) {
		struct ibv_wc wc[VB_POLL_BATCH];
		int want = max - n < VB_POLL_BATCH ? max - n : VB_POLL_BATCH;
		int got = pv->ibv->poll_cq(pv->cq, want, wc);
		if (got < 0) {
			MP_WARN("verbs: ibv_poll_cq on %s failed (%d)", pv->dev_name, got);
			return n ? n : -EIO;
		}
		for (int i = 0; i < got; i++)
			n += vb_wc(pv, &wc[i], &out[n]);
		if (got < want)
			break;
	}
	return n;
}

static void vb_close(struct mp_rdma_prov *p)
{
	struct vb_prov *pv = to_vb(p);
	if (!pv)
		return;
	for (int i = 0; pv->slots && i < pv->max_eps; i++)
		if (pv->slots[i].ep)
			vb_ep_free(pv->slots[i].ep);
	while (pv->handles) {
		struct vb_mr *h = pv->handles;
		pv->handles = h->next;
		free(h);
	}
	while (pv->mrents) {
		struct vb_mrent *ent = pv->mrents;
		pv->mrents = ent->next;
		pv->ibv->dereg_mr(ent->mr);
		free(ent);
	}
	free(pv->backlog);
	free(pv->slots);
	if (pv->cq)
		pv->ibv->destroy_cq(pv->cq);
	if (pv->pd)
		pv->ibv->dealloc_pd(pv->pd);
	if (pv->ctx)
		pv->ibv->close_device(pv->ctx);
	free(pv);
}

static int vb_describe(struct mp_rdma_prov *p, char *text, size_t cap)
{
	struct vb_prov *pv = to_vb(p);
	int n = snprintf(text, cap, "device=%s port=%u link=%s gid_index=%u", pv->dev_name,
			 (unsigned)pv->port,
			 pv->link_layer == IBV_LINK_LAYER_ETHERNET ? "RoCE" : "InfiniBand",
			 (unsigned)pv->gid_index);

	if (n < 0 || (size_t)n >= cap) {
		text[0] = '\0';
		return -ENOSPC;
	}
	return n;
}

const struct mp_rdma_prov_ops mp_rdma_verbs_prov = {
	.name = "verbs",
	.open = vb_open,
	.close = vb_close,
	.ep_create = vb_ep_create,
	.ep_connect = vb_ep_connect,
	.ep_destroy = vb_ep_destroy,
	.reg = vb_reg,
	.dereg = vb_dereg,
	.write = vb_write,
	.max_inline = vb_max_inline,
	.poll = vb_poll,
	.describe = vb_describe,
};

/*
 * The verbs transport: the clear-to-send protocol on this provider. With
 * CUDA it registers device memory too (GPUDirect), which the core learns
 * from the capabilities.
 */
static int verbs_init(const struct mp_drv_params *p, struct mp_drv **out)
{
#ifdef MP_HAVE_CUDA
	return mp_rdma_init(&mp_verbs_driver_ops, &mp_rdma_verbs_prov,
			    MP_DRV_CAP_DEVICE_MEM | MP_DRV_CAP_DEVICE_DMA, p, out);
#else
	return mp_rdma_init(&mp_verbs_driver_ops, &mp_rdma_verbs_prov, 0, p, out);
#endif
}

const struct mp_driver_ops mp_verbs_driver_ops = {
	MP_RDMA_DRIVER_OPS,
	.name = "verbs",
	.init = verbs_init,
};
