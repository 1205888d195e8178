/* SPDX-License-Identifier: BSD-3-Clause */
/* The libfabric provider of the RDMA seam (ofi.c), and the transport made of it. */
#ifndef MP_OFI_H
#define MP_OFI_H

#include <moshpit/driver.h>

#include "../rdma/prov.h"

extern const struct mp_rdma_prov_ops mp_rdma_ofi_prov;
extern const struct mp_driver_ops mp_ofi_driver_ops;

#endif /* MP_OFI_H */
