/* SPDX-License-Identifier: BSD-3-Clause */
/**
 * @file clock.h
 * @brief Driver SDK: the clocks of the library and its drivers.
 *
 * CLOCK_MONOTONIC for every deadline and timeout, so that they survive a
 * change of the wall clock, and the wall clock only for stamps that other
 * machines read. One clock for the core and every driver: a driver's
 * connect deadline and the core's chunk timeout are on the same time line.
 * (A driver that reads the time per packet may keep a cheaper clock of its
 * own, as the dpdk driver does with the TSC, anchored to this one.) Static
 * inline: nothing here is part of libmoshpit's ABI.
 */
#ifndef MOSHPIT_SDK_CLOCK_H
#define MOSHPIT_SDK_CLOCK_H

#include <stdint.h>
#include <time.h>

#ifndef CLOCK_MONOTONIC
/* Said here rather than as an undeclared clock_gettime further down. */
#error "moshpit/sdk/clock.h: define _GNU_SOURCE or _POSIX_C_SOURCE=200809L first"
#endif

/** Nanoseconds since an arbitrary start (CLOCK_MONOTONIC). */
static inline uint64_t mp_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/** Milliseconds on the same clock as ::mp_now_ns: for deadlines kept in ms. */
static inline uint64_t mp_now_ms(void)
{
	return mp_now_ns() / 1000000u;
}

/** Seconds on the same clock, as a double: for rates in the tools. */
static inline double mp_now_s(void)
{
	return (double)mp_now_ns() * 1e-9;
}

/**
 * Wall-clock milliseconds since the epoch: only for what peers compare
 * across machines (record stamps), never for a timeout.
 */
static inline uint64_t mp_wall_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

#endif /* MOSHPIT_SDK_CLOCK_H */
