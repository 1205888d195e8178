/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The clear-to-send protocol as a driver (rdma.c), for the providers that
 * make a transport of it (verbs, ofi) and for tests that run it on a fake.
 *
 * A provider's driver table is the protocol's entries plus its own name and
 * init, and that init passes the provider in:
 *
 *	static int verbs_init(const struct mp_drv_params *p, struct mp_drv **out)
 *	{
 *		return mp_rdma_init(&mp_verbs_driver_ops, &mp_rdma_verbs_prov, 0, p, out);
 *	}
 *	const struct mp_driver_ops mp_verbs_driver_ops = {
 *		MP_RDMA_DRIVER_OPS,
 *		.name = "verbs",
 *		.init = verbs_init,
 *	};
 *
 * so the protocol keeps no list of providers, and a new one is a new table
 * in the provider's own file (and an entry of the core's built-in list).
 */
#ifndef MP_RDMA_H
#define MP_RDMA_H

#include <moshpit/driver.h>

#include "inet.h"
#include "prov.h"

/*
 * Create an instance of the protocol on @prov; @self is the table the core
 * found the transport by (its name appears in logs). @caps_extra is ORed
 * into the capabilities query reports (MP_DRV_CAP_DEVICE_MEM |
 * MP_DRV_CAP_DEVICE_DMA for providers that register device memory: the
 * protocol writes into and from registrations by RDMA alone, so their NIC
 * reaches it by DMA both ways).
 */
int mp_rdma_init(const struct mp_driver_ops *self, const struct mp_rdma_prov_ops *prov,
		 uint32_t caps_extra, const struct mp_drv_params *p, struct mp_drv **out);

/* The protocol's entries, whatever the provider (struct mp_driver_ops documents them). */
void mp_rdma_fini(struct mp_drv *d);
int mp_rdma_describe(struct mp_drv *d, char *text, size_t cap);
int mp_rdma_setting_up(struct mp_drv *d);
int mp_rdma_query(struct mp_drv *d, struct mp_drv_caps *caps);
int mp_rdma_listen(struct mp_drv *d, const char *bind_text, void *blob, size_t *len,
		   struct mp_drv_listener **out);
int mp_rdma_accept(struct mp_drv_listener *l, struct mp_drv_conn **out);
void mp_rdma_close_listener(struct mp_drv_listener *l);
int mp_rdma_connect(struct mp_drv *d, const void *blob, size_t len, struct mp_drv_conn **out);
void mp_rdma_close(struct mp_drv_conn *c);
int mp_rdma_reg_mr(struct mp_drv *d, void *buf, size_t len, enum mp_mem_kind kind,
		   struct mp_drv_mr **out);
void mp_rdma_dereg_mr(struct mp_drv *d, struct mp_drv_mr *mr);
int mp_rdma_isend(struct mp_drv_conn *c, const struct mp_iov *iov, int iovcnt,
		  struct mp_drv_mr *mr, struct mp_drv_req **out);
int mp_rdma_irecv(struct mp_drv_conn *c, void *buf, size_t cap, struct mp_drv_mr *mr,
		  struct mp_drv_req **out);
int mp_rdma_test(struct mp_drv_req *r, int *done, size_t *nbytes);
int mp_rdma_progress(struct mp_drv *d, int timeout_ms);
void mp_rdma_wake(struct mp_drv *d);

/*
 * Every entry of a provider's table but name and init. The address is the
 * TCP side channel's "host:port", so the default is tcp's.
 */
#define MP_RDMA_DRIVER_OPS                             \
	.size = sizeof(struct mp_driver_ops),          \
	.abi = MP_DRIVER_ABI,                          \
	.fini = mp_rdma_fini,                          \
	.query = mp_rdma_query,                        \
	.addr_parse = mp_inet_addr_parse,              \
	.addr_format = mp_inet_addr_format,            \
	.listen = mp_rdma_listen,                      \
	.accept = mp_rdma_accept,                      \
	.close_listener = mp_rdma_close_listener,      \
	.connect = mp_rdma_connect,                    \
	.close = mp_rdma_close,                        \
	.reg_mr = mp_rdma_reg_mr,                      \
	.dereg_mr = mp_rdma_dereg_mr,                  \
	.isend = mp_rdma_isend,                        \
	.irecv = mp_rdma_irecv,                        \
	.test = mp_rdma_test,                          \
	.progress = mp_rdma_progress,                  \
	.wake = mp_rdma_wake,                          \
	.default_listen = "127.0.0.1:0",               \
	.describe = mp_rdma_describe,                  \
	.setting_up = mp_rdma_setting_up

#endif /* MP_RDMA_H */
