/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * How two peer processes on a memif pair leave without racing DPDK's memif
 * PMD. When one side stops its port, the other side's EAL interrupt thread
 * unmaps the shared rings at once (memif_disconnect), whatever that side's
 * polling thread is doing: a poll caught inside rx_burst or tx_burst then
 * dies of SIGSEGV (seen about once in 30 runs of dpdk_gpu_memif under
 * parallel load). So neither side polls while the other tears down:
 *
 *   - the side whose requests complete last (the sender, which waits for
 *     acknowledgements) marks DIR/sent once they have, stops polling, waits
 *     for DIR/quiet, then closes and finalises, and marks DIR/gone;
 *   - the other side polls until DIR/sent appears (its acknowledgements
 *     must get out), marks DIR/quiet, waits for DIR/gone and a moment for
 *     its interrupt thread to take the rings down, then finalises.
 *
 * Files in a directory both processes know, as their "ready" files are.
 */
#ifndef MP_TEST_MEMIF_END_H
#define MP_TEST_MEMIF_END_H

#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

#include <moshpit/driver.h>

static inline bool memif_end_seen(const char *dir, const char *name)
{
	char p[256];

	snprintf(p, sizeof(p), "%s/%s", dir, name);
	return access(p, F_OK) == 0;
}

static inline void memif_end_mark(const char *dir, const char *name)
{
	char p[256];
	int fd;

	snprintf(p, sizeof(p), "%s/%s", dir, name);
	fd = open(p, O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
	if (fd >= 0)
		close(fd);
}

/* Wait up to @ms for DIR/@name without polling the port; 0 once it is there, -1 if not. */
static inline int memif_end_wait(const char *dir, const char *name, int ms)
{
	for (int i = 0; i < ms; i++) {
		if (memif_end_seen(dir, name))
			return 0;
		usleep(1000);
	}
	return memif_end_seen(dir, name) ? 0 : -1;
}

/*
 * The side whose requests complete last, once they have: 0 once the other
 * side has stopped polling (it may close and finalise now), -1 if it never
 * said so. It marks "gone" after its finalisation.
 */
static inline int memif_end_first(const char *dir)
{
	memif_end_mark(dir, "sent");
	return memif_end_wait(dir, "quiet", 10000);
}

/*
 * The other side: progress on @d until "sent" appears (10 s at most), then
 * quiet until the first side is gone and a moment more for this process's
 * interrupt thread to take the rings down. 0 once it may finalise, -1 on a
 * timeout.
 */
static inline int memif_end_last(const char *dir, const struct mp_driver_ops *o, struct mp_drv *d)
{
	struct timespec t0, t;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	do {
		o->progress(d, 1);
		clock_gettime(CLOCK_MONOTONIC, &t);
	} while (!memif_end_seen(dir, "sent") && t.tv_sec - t0.tv_sec < 10);
	if (!memif_end_seen(dir, "sent"))
		return -1;
	memif_end_mark(dir, "quiet");
	if (memif_end_wait(dir, "gone", 10000))
		return -1;
	usleep(50000);
	return 0;
}

static inline void memif_end_unlink(const char *dir)
{
	static const char *const names[] = {"sent", "quiet", "gone"};
	char p[256];

	for (int i = 0; i < 3; i++) {
		snprintf(p, sizeof(p), "%s/%s", dir, names[i]);
		unlink(p);
	}
}

#endif
