/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Byte counts on tool command lines: "4096", "256K", "64M", "1G" (powers of
 * 1024, an optional trailing B). Header-only, so that the MPI reference,
 * built by mpicc without the library, shares it with mpbench and codecbench.
 */
#ifndef MP_TOOLS_SIZE_ARG_H
#define MP_TOOLS_SIZE_ARG_H

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>

/* 0 and *out = bytes, or -1 if @s is not such a count (or overflows). */
static inline int mp_size_arg(const char *s, uint64_t *out)
{
	char *end;
	unsigned long long v;
	uint64_t mul = 1;

	if (!s || *s < '0' || *s > '9')
		return -1;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno)
		return -1;
	switch (*end) {
	case 'k': case 'K': mul = 1ULL << 10; end++; break;
	case 'm': case 'M': mul = 1ULL << 20; end++; break;
	case 'g': case 'G': mul = 1ULL << 30; end++; break;
	default: break;
	}
	if (*end == 'b' || *end == 'B')
		end++;
	if (*end || v > UINT64_MAX / mul)
		return -1;
	*out = (uint64_t)v * mul;
	return 0;
}

#endif
