/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The libfabric provider of the RDMA seam (drivers/rdma/prov.h): reliable
 * datagram endpoints (FI_EP_RDM) with RMA writes, the immediate carried as
 * remote CQ data by fi_writedata semantics (fi_writemsg with
 * FI_REMOTE_CQ_DATA).
 *
 * Each seam endpoint is one fi_endpoint with its own completion queue and a
 * one-entry address vector: remote CQ data completions name no context, so
 * the queue they arrive on is what tells the endpoints apart. poll() reads
 * every endpoint's queue, which is also what drives providers with manual
 * progress (tcp;ofi_rxm).
 *
 * Closing: libfabric 1.17's tcp provider (alone or under ofi_rxm) crashes
 * in fi_cq_read or fi_close, handling a connection event of an RDM
 * endpoint closed earlier while peers died (reproduced here under fault
 * injection, most often under ASan). So there ep_destroy only parks an
 * endpoint: it is no longer polled or written through, and is closed with
 * the instance; it keeps its sockets until then.
 *
 * Parking must not let a late write through: a peer that still holds a
 * clear-to-send record for a failed connection may write into a receive
 * buffer the protocol has handed back (rdma.c relies on ep_destroy to stop
 * that). A registration key cannot guard it: the key is checked when a
 * write's header arrives, and the rest of the write still lands after the
 * key is revoked. What guards it is progress. In 1.17, tcp places incoming
 * data only while the completion queue its endpoint is bound to is read
 * (tcpx_cq_progress walks that queue's endpoints only), ofi_rxm reads an
 * endpoint's queue only from that endpoint's own progress, and with
 * FI_PROGRESS_MANUAL (requested below) and no FI_ATOMIC it starts no thread
 * of its own. Every endpoint here has its own queue and a parked one is
 * never read again, so its late writes stay in the kernel's socket buffer
 * and are never placed. That holds for 1.17 only: from 1.18 tcp progresses
 * every endpoint of a domain whenever any of its queues is read, and
 * hardware providers place data with no progress at all. So anywhere else
 * (another version or provider, or FI_OFI_RXM_DATA_AUTO_PROGRESS set),
 * ep_destroy closes the endpoint at once (ofi_can_park).
 *
 * Memory keys: with FI_MR_PROV_KEY the provider picks them; otherwise we
 * request unique ones. Without FI_MR_VIRT_ADDR a target address is an
 * offset into the region, while the protocol names remote memory by its
 * virtual address; so in that mode we request keys whose low 48 bits are
 * the region's start, and the writer subtracts them from the address.
 *
 * Environment:
 *   MP_OFI_PROVIDER  libfabric provider (default "net" where listed, as on
 *                    libfabric 1.17, else "tcp;ofi_rxm")
 *   MP_OFI_DOMAIN    domain (interface) name, e.g. "lo" or "eth0" (default:
 *                    the provider's first)
 *
 * Both select among fi_getinfo's entries by name (ofi_pick), rather than
 * only hinting: libfabric 1.17's ofi_rxm ignores the domain hint, so the
 * first entry would be some other interface or device. A name that matches
 * no entry fails the driver's start, listing the names there are.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

#include <moshpit/driver_sdk.h>

#include "mp_build_config.h"
#include "../rdma/rdma.h"
#include "ofi.h"

/*
 * Without MP_OFI_PROVIDER, the first of these that fi_getinfo lists. "net"
 * is libfabric 1.17's native TCP provider of RDM endpoints (it is "tcp" from
 * 1.18 on). It comes first because 1.17's tcp;ofi_rxm crashes inside
 * libfabric when a peer dies: 3 of 5 runs of the mpbench_ofi_kills command
 * under ASan crashed there (rxm reads an error completion whose buffer it
 * had freed), against 0 of 4 with net (doc/rdma.md, "Known problems").
 */
static const char *const ofi_default_providers[] = {"net", "tcp;ofi_rxm"};
#define OFI_CQ_SIZE 1024
#define OFI_KEY_ADDR_BITS 48
#define OFI_KEY_ADDR_MASK (((uint64_t)1 << OFI_KEY_ADDR_BITS) - 1)

/* Write ids travel as the operation context. */
_Static_assert(sizeof(void *) >= sizeof(uint64_t), "wr_id must fit a context pointer");

struct ofi_ep;

struct ofi_prov {
	struct fi_info *info;
	struct fid_fabric *fabric;
	struct fid_domain *domain;
	int virt_addr;    /* remote addresses are virtual, not offsets */
	int prov_key;     /* the provider picks keys */
	int park;         /* ep_destroy parks rather than closes: see the file comment */
	uint64_t next_key;
	int rank;
	struct ofi_ep *eps;
	struct ofi_ep *parked; /* destroyed by the protocol, closed with the instance */
	struct ofi_ep *cursor; /* where the next poll starts: fairness across endpoints */
	struct ofi_mr *mrs;
};

struct ofi_ep {
	struct ofi_prov *pv;
	struct ofi_ep *prev, *next;
	struct fid_ep *ep;
	struct fid_cq *cq;
	struct fid_av *av;
	fi_addr_t peer;
	int connected;
};

struct ofi_mr {
	struct mp_rdma_mr pub; /* first: the seam hands us &pub */
	struct ofi_mr *prev, *next;
	struct fid_mr *mr;
};

static inline struct ofi_prov *prov_of(struct mp_rdma_prov *p)
{
	return (struct ofi_prov *)(void *)p;
}

static inline struct ofi_ep *ep_of(struct mp_rdma_ep *e)
{
	return (struct ofi_ep *)(void *)e;
}

/* libfabric's errors are errno values or FI_E* beyond them. */
static int ofi_errno(int fi_err)
{
	int e = fi_err < 0 ? -fi_err : fi_err;

	switch (e) {
	case FI_EKEYREJECTED:
	case EPERM:
		return -EACCES;
	case FI_ETRUNC:
	case FI_EOVERRUN:
	case FI_EOTHER:
		return -EIO;
	default:
		return e > 0 && e < 256 ? -e : -EIO;
	}
}

static void ofi_close(struct mp_rdma_prov *p);

/*
 * Whether destroyed endpoints may be parked: only where closing them
 * crashes (1.17, tcp under ofi_rxm) and where a parked endpoint provably
 * places nothing (see the file comment). The version is the library's at
 * run time, not the header's.
 */
static int ofi_can_park(const struct fi_info *fi)
{
	const char *force = getenv("FI_OFI_RXM_DATA_AUTO_PROGRESS");
	uint32_t v = fi_version();

	return FI_MAJOR(v) == 1 && FI_MINOR(v) == 17 && fi->fabric_attr->prov_name &&
	       !strcmp(fi->fabric_attr->prov_name, "tcp;ofi_rxm") &&
	       fi->domain_attr->data_progress == FI_PROGRESS_MANUAL && !(fi->caps & FI_ATOMIC) &&
	       (!force || !*force || !strcmp(force, "0"));
}

/* Append @name to the ", "-separated list @buf unless it is there already. */
static void name_list_add(char *buf, size_t len, const char *name)
{
	size_t off = strlen(buf), n;
	const char *p = buf;

	if (!name)
		name = "(unnamed)";
	n = strlen(name);
	while ((p = strstr(p, name))) {
		if ((p == buf || p[-1] == ' ') && (p[n] == ',' || p[n] == '\0'))
			return;
		p += n;
	}
	if (off + n + 3 < len)
		snprintf(buf + off, len - off, "%s%s", off ? ", " : "", name);
	else if (off + 5 < len && !strstr(buf, "..."))
		snprintf(buf + off, len - off, ", ...");
}

/*
 * Whether provider name @have answers @want: the same name, or @want is one
 * of its layers ("tcp" for "tcp;ofi_rxm", as fi_getinfo's own hint takes it).
 */
static int prov_matches(const char *have, const char *want)
{
	size_t n = strlen(want);
	const char *p = have;

	if (!have)
		return 0;
	if (!strcasecmp(have, want))
		return 1;
	while (p && *p) {
		if (!strncasecmp(p, want, n) && (p[n] == ';' || p[n] == '\0'))
			return 1;
		p = strchr(p, ';');
		if (p)
			p++;
	}
	return 0;
}

/*
 * The entry of @list to use: the first whose provider is @want (exactly,
 * or else as one of its layers) and, when @dom is set, whose domain is named
 * @dom. NULL with the reason logged (and so in mp_last_error): the names of
 * the providers, or of @want's domains, that there are.
 */
static struct fi_info *ofi_pick(struct fi_info *list, const char *want, const char *dom)
{
	char names[384] = "";
	struct fi_info *fi, *exact = NULL, *layer = NULL;
	int exact_prov = 0;

	/* A provider named exactly wins over one that only has it as a layer. */
	for (fi = list; fi; fi = fi->next)
		if (fi->fabric_attr->prov_name && !strcasecmp(fi->fabric_attr->prov_name, want))
			exact_prov = 1;
	for (fi = list; fi; fi = fi->next) {
		const char *pn = fi->fabric_attr->prov_name;

		if (exact_prov ? !(pn && !strcasecmp(pn, want)) : !prov_matches(pn, want))
			continue;
		if (dom && (!fi->domain_attr->name || strcmp(fi->domain_attr->name, dom)))
			continue;
		if (exact_prov)
			exact = exact ? exact : fi;
		else
			layer = layer ? layer : fi;
	}
	if (exact || layer)
		return exact ? exact : layer;
	for (fi = list; fi; fi = fi->next) {
		const char *pn = fi->fabric_attr->prov_name;

		if (exact_prov ? (pn && !strcasecmp(pn, want)) : prov_matches(pn, want))
			name_list_add(names, sizeof(names), fi->domain_attr->name);
	}
	if (names[0]) {
		MP_WARN("ofi: MP_OFI_DOMAIN=%s is not a domain of provider %s; its domains are: %s",
			dom, want, names);
		return NULL;
	}
	for (fi = list; fi; fi = fi->next)
		name_list_add(names, sizeof(names), fi->fabric_attr->prov_name);
	MP_WARN("ofi: no libfabric provider \"%s\" with RMA writes, remote CQ data and ordered "
		"writes on FI_EP_RDM endpoints; set MP_OFI_PROVIDER to one that has them: %s", want,
		names[0] ? names : "(none on this host)");
	return NULL;
}

/* The provider to use when MP_OFI_PROVIDER is unset (ofi_default_providers). */
static const char *ofi_default_provider(const struct fi_info *list)
{
	size_t n = sizeof(ofi_default_providers) / sizeof(ofi_default_providers[0]);

	for (size_t i = 0; i + 1 < n; i++)
		for (const struct fi_info *fi = list; fi; fi = fi->next)
			if (fi->fabric_attr->prov_name &&
			    !strcmp(fi->fabric_attr->prov_name, ofi_default_providers[i]))
				return ofi_default_providers[i];
	return ofi_default_providers[n - 1];
}

static int ofi_open(const struct mp_rdma_params *params, struct mp_rdma_prov **out)
{
	const char *want = getenv("MP_OFI_PROVIDER");
	const char *dom = getenv("MP_OFI_DOMAIN");
	struct fi_info *hints, *list = NULL, *fi;
	struct ofi_prov *pv;
	int rc;

	if (dom && !*dom)
		dom = NULL;
	hints = fi_allocinfo();
	if (!hints)
		return -ENOMEM;
	hints->caps = FI_RMA | FI_WRITE | FI_REMOTE_WRITE;
	hints->ep_attr->type = FI_EP_RDM;
	/* The registration modes we can live with; FI_MR_ENDPOINT is not among them. */
	hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED |
				      FI_MR_PROV_KEY;
	hints->domain_attr->cq_data_size = 4;
	/* We progress every live endpoint ourselves; no provider thread may (ofi_can_park). */
	hints->domain_attr->data_progress = FI_PROGRESS_MANUAL;
	/* The immediate completes a message: earlier writes must have landed. */
	hints->tx_attr->msg_order = FI_ORDER_WAW;
	hints->rx_attr->msg_order = FI_ORDER_WAW;
	hints->mode = 0;
	/* No provider or domain hint: every entry comes back, and ofi_pick
	 * chooses by name (or names the ones there are). */
	rc = fi_getinfo(FI_VERSION(FI_MAJOR_VERSION, FI_MINOR_VERSION), NULL, NULL, 0, hints, &list);
	fi_freeinfo(hints);
	if (rc && rc != -FI_ENODATA) {
		MP_WARN("ofi: fi_getinfo: %s", fi_strerror(-rc));
		return -ENODEV;
	}
	if (!want || !*want)
		want = ofi_default_provider(rc ? NULL : list);
	fi = ofi_pick(rc ? NULL : list, want, dom);
	if (!fi) {
		fi_freeinfo(list);
		return -ENODEV;
	}
	pv = calloc(1, sizeof(*pv));
	if (!pv) {
		fi_freeinfo(list);
		return -ENOMEM;
	}
	pv->rank = params ? params->rank : -1;
	pv->info = fi_dupinfo(fi); /* that entry alone */
	fi_freeinfo(list);
	if (!pv->info) {
		free(pv);
		return -ENOMEM;
	}
	pv->virt_addr = !!(pv->info->domain_attr->mr_mode & FI_MR_VIRT_ADDR);
	pv->prov_key = !!(pv->info->domain_attr->mr_mode & FI_MR_PROV_KEY);
	pv->park = ofi_can_park(pv->info);
	if (!pv->virt_addr && (pv->prov_key || pv->info->domain_attr->mr_key_size < 8)) {
		MP_WARN("ofi: provider %s uses offset addressing with keys we cannot choose; "
			"not supported", pv->info->fabric_attr->prov_name);
		ofi_close((struct mp_rdma_prov *)(void *)pv);
		return -ENODEV;
	}
	rc = fi_fabric(pv->info->fabric_attr, &pv->fabric, NULL);
	if (!rc)
		rc = fi_domain(pv->fabric, pv->info, &pv->domain, NULL);
	if (rc) {
		MP_WARN("ofi: cannot open %s fabric/domain %s: %s", pv->info->fabric_attr->prov_name,
			pv->info->domain_attr->name, fi_strerror(-rc));
		ofi_close((struct mp_rdma_prov *)(void *)pv);
		return -ENODEV;
	}
	MP_INFO("ofi: provider %s, domain %s, fabric %s, mr_mode 0x%x (%s addresses, %s keys), "
		"inject %zu, libfabric %u.%u; failed endpoints are %s", pv->info->fabric_attr->prov_name,
		pv->info->domain_attr->name, pv->info->fabric_attr->name,
		(unsigned)pv->info->domain_attr->mr_mode, pv->virt_addr ? "virtual" : "offset",
		pv->prov_key ? "provider" : "our", pv->info->tx_attr->inject_size,
		FI_MAJOR(fi_version()), FI_MINOR(fi_version()),
		pv->park ? "parked until the instance closes" : "closed at once");
	*out = (struct mp_rdma_prov *)(void *)pv;
	return 0;
}

static void ofi_ep_destroy(struct mp_rdma_ep *e);
static void ep_teardown(struct ofi_ep *e);
static void ofi_dereg(struct mp_rdma_prov *p, struct mp_rdma_mr *m);

static void ofi_close(struct mp_rdma_prov *p)
{
	struct ofi_prov *pv = prov_of(p);

	if (!pv)
		return;
	while (pv->eps)
		ofi_ep_destroy((struct mp_rdma_ep *)(void *)pv->eps);
	while (pv->parked) {
		struct ofi_ep *e = pv->parked;

		pv->parked = e->next;
		ep_teardown(e);
	}
	while (pv->mrs)
		ofi_dereg(p, &pv->mrs->pub);
	if (pv->domain)
		fi_close(&pv->domain->fid);
	if (pv->fabric)
		fi_close(&pv->fabric->fid);
	fi_freeinfo(pv->info);
	free(pv);
}

/* Close what ep_create opened, in reverse order. */
static void ep_teardown(struct ofi_ep *e)
{
	/* The endpoint first: closing it drops its outstanding writes. */
	if (e->ep)
		fi_close(&e->ep->fid);
	if (e->av)
		fi_close(&e->av->fid);
	if (e->cq)
		fi_close(&e->cq->fid);
	free(e);
}

static int ofi_ep_create(struct mp_rdma_prov *p, void *blob, size_t *len, struct mp_rdma_ep **out)
{
	struct ofi_prov *pv = prov_of(p);
	struct fi_cq_attr cqa = {.format = FI_CQ_FORMAT_DATA, .size = OFI_CQ_SIZE,
				 .wait_obj = FI_WAIT_NONE};
	struct fi_av_attr ava = {.type = FI_AV_TABLE, .count = 1};
	struct ofi_ep *e;
	const char *what;
	int rc;

	if (!blob || !len || !out)
		return -EINVAL;
	e = calloc(1, sizeof(*e));
	if (!e)
		return -ENOMEM;
	e->pv = pv;
	what = "fi_endpoint";
	rc = fi_endpoint(pv->domain, pv->info, &e->ep, NULL);
	if (rc)
		goto err;
	what = "fi_cq_open";
	rc = fi_cq_open(pv->domain, &cqa, &e->cq, NULL);
	if (rc)
		goto err;
	what = "fi_av_open";
	rc = fi_av_open(pv->domain, &ava, &e->av, NULL);
	if (rc)
		goto err;
	/*
	 * Selective on the transmit side only: signalled writes complete (errors
	 * always do); on the receive side it would hide remote CQ data.
	 */
	what = "fi_ep_bind";
	rc = fi_ep_bind(e->ep, &e->cq->fid, FI_TRANSMIT | FI_SELECTIVE_COMPLETION);
	if (!rc)
		rc = fi_ep_bind(e->ep, &e->cq->fid, FI_RECV);
	if (!rc)
		rc = fi_ep_bind(e->ep, &e->av->fid, 0);
	if (rc)
		goto err;
	what = "fi_enable";
	rc = fi_enable(e->ep);
	if (rc)
		goto err;
	what = "fi_getname";
	rc = fi_getname(&e->ep->fid, blob, len);
	if (rc)
		goto err;
	e->next = pv->eps;
	if (pv->eps)
		pv->eps->prev = e;
	pv->eps = e;
	*out = (struct mp_rdma_ep *)(void *)e;
	return 0;
err:
	MP_WARN("ofi: %s: %s", what, fi_strerror(-rc));
	ep_teardown(e);
	return rc == -FI_ETOOSMALL ? -ENOSPC : ofi_errno(rc);
}

static int ofi_ep_connect(struct mp_rdma_ep *ep, const void *blob, size_t len)
{
	struct ofi_ep *e = ep_of(ep);
	int n;

	if (!e || !blob || !len)
		return -EINVAL;
	if (e->connected)
		return -EISCONN;
	n = fi_av_insert(e->av, blob, 1, &e->peer, 0, NULL);
	if (n != 1) {
		MP_INFO("ofi: fi_av_insert of the peer's address failed (%d)", n);
		return n < 0 ? ofi_errno(n) : -EINVAL;
	}
	e->connected = 1;
	return 0;
}

static void ofi_ep_destroy(struct mp_rdma_ep *ep)
{
	struct ofi_ep *e = ep_of(ep);
	struct ofi_prov *pv;

	if (!e)
		return;
	pv = e->pv;
	if (pv->cursor == e)
		pv->cursor = e->next;
	if (e->prev)
		e->prev->next = e->next;
	else
		pv->eps = e->next;
	if (e->next)
		e->next->prev = e->prev;
	if (!pv->park) {
		ep_teardown(e);
		return;
	}
	/* Parked, not closed, and never read again: see the file comment. */
	e->prev = NULL;
	e->next = pv->parked;
	pv->parked = e;
}

static int ofi_reg(struct mp_rdma_prov *p, void *addr, size_t len, enum mp_mem_kind kind,
		   struct mp_rdma_mr **out)
{
	struct ofi_prov *pv = prov_of(p);
	uint64_t key = 0;
	struct ofi_mr *m;
	int rc;

	if (!addr || !len || !out)
		return -EINVAL;
	if (kind != MP_MEM_HOST)
		return -ENOTSUP; /* device memory through libfabric (FI_HMEM) is not wired up */
	if (!pv->prov_key) {
		/* Unique per domain; see the file comment for offset mode. */
		pv->next_key++;
		if (pv->virt_addr) {
			key = pv->next_key;
		} else {
			if ((uintptr_t)addr > OFI_KEY_ADDR_MASK)
				return -EFAULT;
			key = (uint64_t)(uintptr_t)addr |
			      (pv->next_key & 0xffff) << OFI_KEY_ADDR_BITS;
		}
	}
	m = calloc(1, sizeof(*m));
	if (!m)
		return -ENOMEM;
	m->pub.addr = addr;
	m->pub.len = len;
	m->pub.kind = kind;
	rc = fi_mr_reg(pv->domain, addr, len, FI_WRITE | FI_REMOTE_WRITE, 0, key, 0, &m->mr, NULL);
	if (rc) {
		MP_INFO("ofi: fi_mr_reg of %zu bytes: %s", len, fi_strerror(-rc));
		free(m);
		return ofi_errno(rc);
	}
	m->pub.rkey = fi_mr_key(m->mr);
	m->pub.desc = fi_mr_desc(m->mr);
	m->next = pv->mrs;
	if (pv->mrs)
		pv->mrs->prev = m;
	pv->mrs = m;
	*out = &m->pub;
	return 0;
}

static void ofi_dereg(struct mp_rdma_prov *p, struct mp_rdma_mr *mr)
{
	struct ofi_prov *pv = prov_of(p);
	struct ofi_mr *m = (struct ofi_mr *)(void *)mr;

	if (!m)
		return;
	fi_close(&m->mr->fid);
	if (m->prev)
		m->prev->next = m->next;
	else
		pv->mrs = m->next;
	if (m->next)
		m->next->prev = m->prev;
	free(m);
}

static int ofi_write(struct mp_rdma_ep *ep, const void *src, size_t len, struct mp_rdma_mr *mr,
		     uint64_t raddr, uint64_t rkey, uint32_t imm, unsigned flags, uint64_t wr_id)
{
	struct ofi_ep *e = ep_of(ep);
	struct ofi_prov *pv;
	struct iovec iov = {.iov_base = (void *)(uintptr_t)src, .iov_len = len};
	void *desc = NULL;
	struct fi_rma_iov riov;
	struct fi_msg_rma msg;
	uint64_t fl = 0;
	ssize_t rc;

	if (!e || !e->connected)
		return -ENOTCONN;
	pv = e->pv;
	if (flags & MP_RDMA_WR_INLINE) {
		if (len > pv->info->tx_attr->inject_size)
			return -EINVAL;
		fl |= FI_INJECT;
	} else if (len) {
		if (!mr)
			return -EINVAL;
		desc = mr->desc;
	}
	if (flags & MP_RDMA_WR_IMM)
		fl |= FI_REMOTE_CQ_DATA;
	if (flags & MP_RDMA_WR_SIGNAL)
		fl |= FI_COMPLETION;
	riov.addr = pv->virt_addr ? raddr : raddr - (rkey & OFI_KEY_ADDR_MASK);
	riov.len = len;
	riov.key = rkey;
	memset(&msg, 0, sizeof(msg));
	msg.msg_iov = &iov;
	msg.desc = &desc;
	msg.iov_count = 1;
	msg.addr = e->peer;
	msg.rma_iov = &riov;
	msg.rma_iov_count = 1;
	msg.context = (void *)(uintptr_t)wr_id;
	msg.data = imm;
	rc = fi_writemsg(e->ep, &msg, fl);
	if (rc == -FI_EAGAIN)
		return -EAGAIN;
	if (rc) {
		MP_INFO("ofi: fi_writemsg: %s", fi_strerror((int)-rc));
		return ofi_errno((int)rc);
	}
	return 0;
}

static size_t ofi_max_inline(struct mp_rdma_prov *p)
{
	return prov_of(p)->info->tx_attr->inject_size;
}

/* One endpoint's completions into @out; returns how many or a negative errno. */
static int ofi_poll_ep(struct ofi_ep *e, struct mp_rdma_cqe *out, int max)
{
	struct fi_cq_data_entry ent[16];
	ssize_t n;
	int k = 0;

	if (max > 16)
		max = 16;
	n = fi_cq_read(e->cq, ent, (size_t)max);
	if (n == -FI_EAGAIN)
		return 0;
	if (n == -FI_EAVAIL) {
		struct fi_cq_err_entry ee;
		char buf[128];

		memset(&ee, 0, sizeof(ee));
		if (fi_cq_readerr(e->cq, &ee, 0) != 1)
			return 0;
		memset(out, 0, sizeof(*out));
		out->op = ee.flags & FI_REMOTE_CQ_DATA ? MP_RDMA_CQE_IMM : MP_RDMA_CQE_WRITE;
		out->status = ofi_errno(ee.err ? ee.err : FI_EOTHER);
		out->ep = (struct mp_rdma_ep *)(void *)e;
		out->wr_id = (uint64_t)(uintptr_t)ee.op_context;
		MP_INFO("ofi: completion error: %s (%s)", fi_strerror(ee.err),
			fi_cq_strerror(e->cq, ee.prov_errno, ee.err_data, buf, sizeof(buf)));
		return 1;
	}
	if (n < 0) {
		/* The queue itself broke: fail the endpoint, not the whole instance. */
		MP_WARN("ofi: fi_cq_read: %s", fi_strerror((int)-n));
		memset(out, 0, sizeof(*out));
		out->op = MP_RDMA_CQE_WRITE;
		out->status = ofi_errno((int)n);
		out->ep = (struct mp_rdma_ep *)(void *)e;
		return 1;
	}
	for (ssize_t i = 0; i < n; i++) {
		struct mp_rdma_cqe *c = &out[k];

		memset(c, 0, sizeof(*c));
		c->ep = (struct mp_rdma_ep *)(void *)e;
		if (ent[i].flags & FI_REMOTE_CQ_DATA) {
			c->op = MP_RDMA_CQE_IMM;
			c->imm = (uint32_t)ent[i].data;
			c->len = ent[i].len; /* 0 for tcp;ofi_rxm: the protocol does not rely on it */
		} else {
			c->op = MP_RDMA_CQE_WRITE;
			c->wr_id = (uint64_t)(uintptr_t)ent[i].op_context;
		}
		k++;
	}
	return k;
}

static int ofi_poll(struct mp_rdma_prov *p, struct mp_rdma_cqe *out, int max)
{
	struct ofi_prov *pv = prov_of(p);
	struct ofi_ep *e, *start;
	int got = 0;

	if (!pv->eps || max <= 0)
		return 0;
	/* Every endpoint once per call, starting where the last call stopped. */
	start = pv->cursor ? pv->cursor : pv->eps;
	e = start;
	do {
		got += ofi_poll_ep(e, out + got, max - got);
		e = e->next ? e->next : pv->eps;
		if (got == max)
			break;
	} while (e != start);
	pv->cursor = e;
	return got;
}

/* Words with spaces (a domain or fabric name could hold some) get '_'. */
static size_t put_word(char *text, size_t cap, size_t off, const char *key, const char *val)
{
	int n;

	if (off >= cap)
		return off;
	n = snprintf(text + off, cap - off, "%s%s=", off ? " " : "", key);
	if (n < 0)
		return cap;
	off += (size_t)n;
	for (; val && *val && off < cap; val++)
		text[off++] = *val == ' ' ? '_' : *val;
	if (off < cap)
		text[off] = '\0';
	return off;
}

static int ofi_describe(struct mp_rdma_prov *p, char *text, size_t cap)
{
	struct ofi_prov *pv = prov_of(p);
	size_t off = 0;

	off = put_word(text, cap, off, "provider", pv->info->fabric_attr->prov_name);
	off = put_word(text, cap, off, "domain", pv->info->domain_attr->name);
	off = put_word(text, cap, off, "fabric", pv->info->fabric_attr->name);
	if (off >= cap) {
		text[0] = '\0';
		return -ENOSPC;
	}
	return (int)off;
}

const struct mp_rdma_prov_ops mp_rdma_ofi_prov = {
	.name = "ofi",
	.open = ofi_open,
	.close = ofi_close,
	.ep_create = ofi_ep_create,
	.ep_connect = ofi_ep_connect,
	.ep_destroy = ofi_ep_destroy,
	.reg = ofi_reg,
	.dereg = ofi_dereg,
	.write = ofi_write,
	.max_inline = ofi_max_inline,
	.poll = ofi_poll,
	.describe = ofi_describe,
};

/* The ofi transport: the clear-to-send protocol on this provider. */
static int ofi_init(const struct mp_drv_params *p, struct mp_drv **out)
{
	return mp_rdma_init(&mp_ofi_driver_ops, &mp_rdma_ofi_prov, 0, p, out);
}

const struct mp_driver_ops mp_ofi_driver_ops = {
	MP_RDMA_DRIVER_OPS,
	.name = "ofi",
	.init = ofi_init,
};
