/* SPDX-License-Identifier: BSD-3-Clause */
/**
 * @file driver_sdk.h
 * @brief Everything a moshpit driver includes, in the tree or out of it.
 *
 * The seam itself (<moshpit/driver.h>: the ops table, registration,
 * plugins) and the helpers the in-tree drivers use too, one copy of each:
 *
 *  - <moshpit/sdk/log.h>: MP_WARN, MP_INFO, MP_TRACE into the library's log;
 *  - <moshpit/sdk/clock.h>: the one monotonic clock (mp_now_ns, mp_now_ms);
 *  - <moshpit/sdk/reqq.h>: the request pool and FIFO queues of posted
 *    requests, with the posted/done/free life cycle and test();
 *  - <moshpit/sdk/le.h>: little-endian fields for wire blobs;
 *  - <moshpit/sdk/container_of.h>: mp_container_of.
 *
 * Only the log functions, ::mp_driver_register and the public API of
 * moshpit.h are functions of libmoshpit; the rest is static inline or
 * macros, built into the driver. A driver out of the tree builds with
 * `pkg-config --cflags --libs moshpit`, in C11 with POSIX 2008
 * (_GNU_SOURCE or _POSIX_C_SOURCE=200809L). doc/design.md, "Adding a
 * driver", walks through one.
 */
#ifndef MOSHPIT_DRIVER_SDK_H
#define MOSHPIT_DRIVER_SDK_H

#include <moshpit/driver.h>
#include <moshpit/sdk/clock.h>
#include <moshpit/sdk/container_of.h>
#include <moshpit/sdk/le.h>
#include <moshpit/sdk/log.h>
#include <moshpit/sdk/reqq.h>

#endif /* MOSHPIT_DRIVER_SDK_H */
