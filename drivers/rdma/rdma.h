/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The clear-to-send protocol as a driver (rdma.c), for the tables built on
 * it (verbs, ofi) and for tests that run it on a fake provider.
 */
#ifndef MP_RDMA_H
#define MP_RDMA_H

#include <moshpit/driver.h>

#include "prov.h"

/*
 * Every entry of an RDMA driver table except name and init, which bind a
 * provider. A table for another provider copies it and sets those two.
 */
extern const struct mp_driver_ops mp_rdma_base_ops;

/*
 * Create an instance of the protocol on @prov; @self is the table the core
 * found the transport by (its name appears in logs). @caps_extra is ORed
 * into the capabilities query reports (MP_DRV_CAP_DEVICE_MEM for providers
 * that register device memory).
 */
int mp_rdma_init(const struct mp_driver_ops *self, const struct mp_rdma_prov_ops *prov,
		 uint32_t caps_extra, const struct mp_drv_params *p, struct mp_drv **out);

#endif /* MP_RDMA_H */
