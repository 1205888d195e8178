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

#endif
