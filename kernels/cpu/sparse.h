/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Private to the sparse codecs (src/codec_sparse.c): the hot loops of topk
 * and adacomp, one table per CPU variant, chosen by mp_k_level(). Every
 * variant returns the same bits (see sparse.c).
 *
 * Common ground of all entry points:
 *  - "p = a (+ b)": p[i] = a[i] + b[i] in fp32, or a[i] when b is NULL (no
 *    add, so the sign of a zero survives), and then a non-finite p[i]
 *    becomes +0 (the codecs drop NaN and inf: never sent, never kept).
 *  - The key of a value is its magnitude's bit pattern (bits & 0x7fffffff):
 *    for finite values it orders exactly like |v|.
 *  - Index lists are written a whole vector at a time, so their buffers need
 *    MP_SP_SLACK entries of room past the last one written.
 *  - n <= UINT32_MAX (indices are u32 on the wire).
 */
#ifndef MP_KERNELS_SPARSE_H
#define MP_KERNELS_SPARSE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "kernels_cpu.h"

/* Level-1 radix buckets of the top-k select: key >> 20 (exponent + 3 bits). */
#define MP_SP_B1_SHIFT 20
#define MP_SP_NB1 2048u
/* The level-1 count is spread over this many histograms (see sparse.c). */
#define MP_SP_NSUB 4u
/* Bytes of histogram at the start of the top-k scratch. */
#define MP_SP_HIST_BYTES (MP_SP_NSUB * MP_SP_NB1 * sizeof(uint32_t))
/* Room an index or value list needs past its last entry. */
#define MP_SP_SLACK 16u

struct mp_sparse_kernels {
	/*
	 * p = a (+ b); out[i] = p[i] if @out (which may be @b, never @a);
	 * hist[s * MP_SP_NB1 + (key(p[i]) >> 20)]++ for some s < MP_SP_NSUB if
	 * @hist (zeroed by the caller).
	 */
	void (*prep)(const float *a, const float *b, float *out, size_t n, uint32_t *hist);
	/*
	 * Over the keys of p = a (+ b) with key >> (@shift + 10) == @prefix:
	 * hist[(key >> @shift) & 1023]++ (1024 counters, zeroed by the caller).
	 */
	void (*hist_sub)(const float *a, const float *b, size_t n, unsigned shift, uint32_t prefix,
			 uint32_t *hist);
	/*
	 * p = a (+ b); out[i] = p[i] if @out (may be @b). Lists, in index order,
	 * the index and the value of every element with key >= @lo, while they
	 * fit in @cap entries (after that it only counts). Returns how many
	 * there are in all (> @cap: the lists are incomplete).
	 */
	size_t (*sift)(const float *a, const float *b, float *out, size_t n, uint32_t lo,
		       size_t cap, uint32_t *idx, float *val);
	/*
	 * Writes, in increasing order, the indices i whose key(p[i]) > @t, and
	 * the first @eq (lowest) indices whose key == @t; returns how many.
	 */
	size_t (*select)(const float *a, const float *b, size_t n, uint32_t t, size_t eq,
			 uint32_t *idx);
	/*
	 * AdaComp selection over bins of @bin elements: G = x (+ r), H = G + x;
	 * per bin gmax = max |G|; lists the indices (and G) of the elements with
	 * G != 0 and |H| >= gmax, in increasing order; returns how many. With
	 * @store (r non-NULL), r[i] = G[i] on the way.
	 */
	size_t (*ada_select)(const float *x, float *r, int store, size_t n, size_t bin,
			     uint32_t *idx, float *gv);
	/* 1 if all @k fp32 values at @v (any alignment) are finite, else 0. */
	int (*finite)(const void *v, size_t k);
	/* acc[idx[j]] += w * v[j]; idx strictly increasing. */
	void (*scatter_acc)(float *acc, const uint32_t *idx, const float *v, float w, size_t k);
};

/* The table for mp_k_level(). */
MP_K_HIDDEN const struct mp_sparse_kernels *mp_sparse_kernels(void);

/* Scratch bytes mp_sparse_topk needs for (@n, @k); never decreases as either grows. */
MP_K_HIDDEN size_t mp_sparse_topk_scratch(size_t n, size_t k);

/*
 * Top-k selection of p = src (+ res), 1 <= k <= n: the indices of the k
 * largest |p| (ties to the lower index), in increasing order, and their p,
 * in two lists inside @scratch (64-byte aligned, mp_sparse_topk_scratch(n,
 * k) bytes). Returns the index list; *val gets the value list. If @out (may
 * be @res, never @src), out = p as well.
 */
MP_K_HIDDEN uint32_t *mp_sparse_topk(const struct mp_sparse_kernels *kt, const float *src,
				     const float *res, float *out, size_t n, size_t k,
				     void *scratch, float **val);

/* The scalar form of "non-finite becomes +0". */
static inline float mp_sp_san(float v)
{
	uint32_t u;

	memcpy(&u, &v, sizeof(u));
	return (u & 0x7fffffffu) < 0x7f800000u ? v : 0.0f;
}

#endif
