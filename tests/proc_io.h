/* SPDX-License-Identifier: BSD-3-Clause */
/* Pipe I/O between a test and the peer processes it forks: a fork with a
 * pipe each way, whole buffers, reads bounded by a timeout. */
#ifndef MP_TEST_PROC_IO_H
#define MP_TEST_PROC_IO_H

#include <errno.h>
#include <poll.h>
#include <stddef.h>
#include <sys/types.h>
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

/*
 * Fork with a pipe each way. In the parent: returns the child's pid, *up
 * reads from the child and *down writes to it. In the child: returns 0, *up
 * writes to the parent and *down reads from it. -1 if a pipe or the fork
 * failed.
 */
static inline pid_t fork_piped(int *up, int *down)
{
	int u[2], d[2];
	pid_t pid;

	if (pipe(u))
		return -1;
	if (pipe(d)) {
		close(u[0]);
		close(u[1]);
		return -1;
	}
	pid = fork();
	if (pid < 0) {
		close(u[0]);
		close(u[1]);
		close(d[0]);
		close(d[1]);
		return -1;
	}
	close(pid ? u[1] : u[0]);
	close(pid ? d[0] : d[1]);
	*up = pid ? u[0] : u[1];
	*down = pid ? d[1] : d[0];
	return pid;
}

#endif
