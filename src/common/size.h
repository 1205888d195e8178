/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Byte counts: one grammar for the library's MP_* variables and for the
 * tools' options (README.md, "Environment variables"; mpbench(1)).
 *
 *   size := digits [ K | M | G ] [ B ]
 *
 * Decimal digits (a leading 0 is not octal), then optionally K, M or G for
 * 2^10, 2^20 or 2^30 (either case), then optionally B: "4096", "64K",
 * "64k", "1M", "1MB", "4096B". Nothing else: no sign, no blanks, no
 * fraction, no hexadecimal, no empty string. A count beyond 2^64 - 1 bytes
 * is refused, never wrapped; the caller checks its own range.
 *
 * Header-only, so that tools/mpi_allreduce_ref.c, built by mpicc without
 * the library, shares it.
 */
#ifndef MP_COMMON_SIZE_H
#define MP_COMMON_SIZE_H

#include <errno.h>
#include <stdint.h>

/*
 * 0 with *@out set; -EINVAL when @s does not follow the grammar, -ERANGE
 * when it does but the count exceeds UINT64_MAX. *@out is left alone on
 * failure.
 */
static inline int mp_parse_size(const char *s, uint64_t *out)
{
	uint64_t v = 0, unit = 1;
	int over = 0;

	if (!s || *s < '0' || *s > '9')
		return -EINVAL;
	for (; *s >= '0' && *s <= '9'; s++) {
		unsigned d = (unsigned)(*s - '0');

		/* Checked before multiplying, which would wrap silently; the
		 * digits are still read, so that a bad suffix is -EINVAL. */
		if (v > (UINT64_MAX - d) / 10)
			over = 1;
		else
			v = v * 10 + d;
	}
	switch (*s) {
	case 'k': case 'K': unit = 1ULL << 10; s++; break;
	case 'm': case 'M': unit = 1ULL << 20; s++; break;
	case 'g': case 'G': unit = 1ULL << 30; s++; break;
	default: break;
	}
	if (*s == 'b' || *s == 'B')
		s++;
	if (*s)
		return -EINVAL;
	if (over || v > UINT64_MAX / unit)
		return -ERANGE;
	*out = v * unit;
	return 0;
}

#endif
