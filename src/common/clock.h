/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The clocks of the library and its drivers: CLOCK_MONOTONIC for every
 * deadline and timeout, so that they survive a change of the wall clock, and
 * the wall clock for stamps that other machines read.
 */
#ifndef MP_CLOCK_H
#define MP_CLOCK_H

#include <stdint.h>
#include <time.h>

/* Nanoseconds since an arbitrary start (monotonic). */
static inline uint64_t mp_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* The same in milliseconds, and in seconds (for the tools' rates). */
static inline uint64_t mp_now_ms(void)
{
	return mp_now_ns() / 1000000u;
}

static inline double mp_now_s(void)
{
	return (double)mp_now_ns() * 1e-9;
}

/*
 * Wall-clock milliseconds since the epoch: only for what peers compare
 * across machines (record stamps), never for a timeout.
 */
static inline uint64_t mp_wall_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

#endif
