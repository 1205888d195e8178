/* SPDX-License-Identifier: BSD-3-Clause */
/* Splitting a vector into per-member parts. */
#ifndef MP_PARTS_H
#define MP_PARTS_H

#include <stdint.h>

/*
 * Split @total elements into @n parts proportional to @weights (NULL = equal),
 * deterministically (largest remainder, ties to the lower index) so every
 * member computes the same split. Weight 0 gives an empty part; a negative
 * weight means unknown and counts as the mean of the known positive ones.
 * Returns 0, or -EINVAL (n < 1, NaN/inf weight, or no positive weight).
 */
int mp_parts_split(uint64_t total, const double *weights, int n, uint64_t *parts);

#endif
