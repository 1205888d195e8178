/* SPDX-License-Identifier: BSD-3-Clause */
/**
 * @file log.h
 * @brief Driver SDK: the library's log, for drivers in and out of the tree.
 *
 * A driver's lines go where the library's go (stderr, or MP_DEBUG_FILE), in
 * its format ("host:pid:rank [moshpit] LEVEL message"), and are filtered by
 * the one level that MP_DEBUG or ::mp_log_set_level sets, so that a user
 * reads one log whatever transport runs. Use the macros: they skip the
 * formatting of a line the level drops, and TRACE lines carry their
 * source file and line.
 */
#ifndef MOSHPIT_SDK_LOG_H
#define MOSHPIT_SDK_LOG_H

#include <moshpit/moshpit.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__) || defined(__clang__)
#define MP_PRINTF_(f, a) __attribute__((format(printf, f, a)))
#else
#define MP_PRINTF_(f, a)
#endif

/**
 * The current log level (::mp_log_level); MP_DEBUG is read on the first
 * call of any log function.
 * @return ::MP_LOG_NONE .. ::MP_LOG_TRACE
 */
MP_API int mp_log_get_level(void);

/**
 * Write one log line, whatever the level: callers filter first (the
 * macros below do). One write per line, so lines of concurrent threads
 * never interleave; a line longer than about 1 KiB is cut.
 * @param level ::mp_log_level of the line (WARN, INFO or TRACE)
 * @param file source file (__FILE__), shown on TRACE lines
 * @param line source line (__LINE__), shown on TRACE lines
 * @param fmt printf format, without a trailing newline
 */
MP_API void mp_log(int level, const char *file, int line, const char *fmt, ...) MP_PRINTF_(4, 5);

/** Log at @p lvl when the level lets it through; then a printf format and its values. */
#define MP_LOG(lvl, ...)                                                  \
	do {                                                              \
		if ((lvl) <= mp_log_get_level())                          \
			mp_log((lvl), __FILE__, __LINE__, __VA_ARGS__);   \
	} while (0)
/** Something went wrong that the user should see (the default level). */
#define MP_WARN(...) MP_LOG(MP_LOG_WARN, __VA_ARGS__)
/** Set-up and teardown, once per instance or connection. */
#define MP_INFO(...) MP_LOG(MP_LOG_INFO, __VA_ARGS__)
/** Per-message detail, for debugging. */
#define MP_TRACE(...) MP_LOG(MP_LOG_TRACE, __VA_ARGS__)

#ifdef __cplusplus
}
#endif
#endif /* MOSHPIT_SDK_LOG_H */
