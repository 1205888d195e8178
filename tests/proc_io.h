/* SPDX-License-Identifier: BSD-3-Clause */
/* Pipe I/O between a test and the peer processes it forks: whole buffers,
 * reads bounded by a timeout. */
#ifndef MP_TEST_PROC_IO_H
#define MP_TEST_PROC_IO_H

#include <errno.h>
#include <poll.h>
#include <stddef.h>
#include <unistd.h>

static inline int write_all(int fd, const void *p, size_t n)
{
	const char *c = p;
	while (n) {
		ssize_t w = write(fd, c, n);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return -1;
		c += w;
		n -= (size_t)w;
	}
	return 0;
}

static inline int read_all(int fd, void *p, size_t n, int timeout_ms)
{
	char *c = p;
	while (n) {
		struct pollfd pf = {fd, POLLIN, 0};
		if (poll(&pf, 1, timeout_ms) <= 0)
			return -1;
		ssize_t r = read(fd, c, n);
		if (r <= 0)
			return -1;
		c += r;
		n -= (size_t)r;
	}
	return 0;
}

#endif
