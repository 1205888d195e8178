/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Process-wide logging, NCCL style: "host:pid:rank [moshpit] LEVEL message".
 * The macros and the entry points are the driver SDK's (<moshpit/sdk/log.h>),
 * so the library and every driver, in the tree or not, write one log; what
 * only the library calls is here.
 */
#ifndef MP_LOG_H
#define MP_LOG_H

#include <moshpit/sdk/log.h>

/* Reads MP_DEBUG and MP_DEBUG_FILE once per process; cheap to call often. */
void mp_log_init(void);
/* Tags this thread's log lines with a peer rank (-1 = none). */
void mp_log_set_rank(int rank);
/*
 * The message of this thread's last WARN line ("" after a clear or when
 * none was written): how the reason a driver logged, such as the verbs
 * driver's "no RDMA device ...; looked for ...", reaches mp_last_error when
 * the driver's init fails. Lines the level dropped (MP_DEBUG=NONE) never
 * reach mp_log, so they are not recorded.
 */
const char *mp_log_last_warn(void);
void mp_log_last_warn_clear(void);

#endif
