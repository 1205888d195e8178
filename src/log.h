/* SPDX-License-Identifier: BSD-3-Clause */
/* Process-wide logging, NCCL style: "host:pid:rank [moshpit] LEVEL message". */
#ifndef MP_LOG_H
#define MP_LOG_H

#include <moshpit/moshpit.h>

/* Current level; read once from MP_DEBUG (WARN, INFO, TRACE; default WARN). */
extern int mp_log_level;

/* Reads MP_DEBUG and MP_DEBUG_FILE once per process; cheap to call often. */
void mp_log_init(void);
/*
 * The CPU kernels choose their variant silently (kernels/ logs nothing):
 * says once per process which one runs, and why MP_KERNELS was not followed.
 */
void mp_log_kernels(void);
/* Tags this thread's log lines with a peer rank (-1 = none). */
void mp_log_set_rank(int rank);
void mp_log_emit(int level, const char *file, int line, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

#define MP_LOG(lvl, ...)                                                  \
	do {                                                              \
		if ((lvl) <= mp_log_level)                                \
			mp_log_emit((lvl), __FILE__, __LINE__, __VA_ARGS__); \
	} while (0)
#define MP_WARN(...) MP_LOG(MP_LOG_WARN, __VA_ARGS__)
#define MP_INFO(...) MP_LOG(MP_LOG_INFO, __VA_ARGS__)
#define MP_TRACE(...) MP_LOG(MP_LOG_TRACE, __VA_ARGS__)

#endif
