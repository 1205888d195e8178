/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The vector kernels of sparse.c, written once for both widths: sparse.c
 * includes this file once with KV_W 8 (AVX2) and once with KV_W 16
 * (AVX-512), which makes prep_avx2 and prep_avx512 and so on (kloop.h's kv
 * layer). So no include guard. Why every variant gives the same bits, and
 * the helpers used here, are in sparse.c.
 */

/* p = a (+ b) at [i, i + KV_W), non-finite -> +0. */
KV_TARGET static inline kv_f KV_FN(p_at)(const float *a, const float *b, size_t i)
{
	kv_f p = kv_loadu_f(a + i);

	if (b)
		p = kv_add_f(p, kv_loadu_f(b + i));
	return kv_maskz_f(kv_finite(p), p);
}

/* The same on the lanes of @lm, with 0 (not read) in the others. */
KV_TARGET static inline kv_f KV_FN(p_atm)(const float *a, const float *b, size_t i, kv_m lm)
{
	kv_f p = kv_maskz_loadu_f(lm, a + i);

	if (b)
		p = kv_add_f(p, kv_maskz_loadu_f(lm, b + i));
	return kv_maskz_f(kv_finite(p), p);
}

KV_TARGET static void KV_FN(prep)(const float *a, const float *b, float *out, size_t n, uint32_t *hist)
{
	_Alignas(64) uint32_t bk[16];
	size_t i = 0;

	/* hist4 takes the 16 buckets of two vectors (AVX2) or one (AVX-512). */
	for (; i + 16 <= n; i += 16) {
		_Pragma("GCC unroll 2") for (size_t v = 0; v < 16; v += KV_W) {
			kv_f p = KV_FN(p_at)(a, b, i + v);

			if (out)
				kv_storeu_f(out + i + v, p);
			if (hist)
				kv_store_i(bk + v, kv_srli_i(kv_absbits(p), MP_SP_B1_SHIFT));
		}
		if (hist)
			hist4(hist, bk, 16);
	}
	prep_scalar(a + i, b ? b + i : NULL, out ? out + i : NULL, n - i, hist);
}

KV_TARGET static void KV_FN(hist_sub)(const float *a, const float *b, size_t n, unsigned shift,
				      uint32_t prefix, uint32_t *hist)
{
	const kv_i vp = kv_set1_i((int)prefix);
	const __m128i sh = _mm_cvtsi32_si128((int)(shift + 10));
	_Alignas(64) uint32_t kb[KV_W];
	size_t i = 0;

	for (; i + KV_W <= n; i += KV_W) {
		kv_i k = kv_absbits(KV_FN(p_at)(a, b, i));
		unsigned m = kv_bits(kv_eq_i(kv_srl_i(k, sh), vp));

		if (m) {
			kv_store_i(kb, k);
			hist_sub_lanes(hist, kb, m, shift);
		}
	}
	hist_sub_tail(a, b, i, n, shift, prefix, hist);
}

KV_TARGET static size_t KV_FN(sift)(const float *a, const float *b, float *out, size_t n, uint32_t lo,
				    size_t cap, uint32_t *idx, float *val)
{
	/* key >= lo as key > lo - 1 (lo >= 1 here; lo == 0 lists everything). */
	const kv_i vl = kv_set1_i((int)lo - 1);
	const kv_i vw = kv_set1_i(KV_W);
	kv_i vi = kv_iota();
	size_t i = 0, c = 0;

	if (!lo)
		return sift_tail(a, b, out, 0, n, lo, cap, idx, val, 0);
	for (; i + KV_W <= n; i += KV_W, vi = kv_add_i(vi, vw)) {
		kv_f p = KV_FN(p_at)(a, b, i);
		unsigned m = kv_bits(kv_gt_key(kv_absbits(p), vl));

		if (out)
			kv_storeu_f(out + i, p);
		/*
		 * Stored whether or not any lane is in: which vectors hold one is
		 * random, a branch on it would mispredict. Once an entry did not
		 * fit, c stays > cap, so later ones cannot fit either.
		 */
		unsigned nm = kv_pop(m);

		if (c + nm <= cap) {
			kv_compress_i(idx + c, m, vi);
			kv_compress_f(val + c, m, p);
		}
		c += nm;
	}
	return sift_tail(a, b, out, i, n, lo, cap, idx, val, c);
}

KV_TARGET static size_t KV_FN(select)(const float *a, const float *b, size_t n, uint32_t t, size_t eq,
				      uint32_t *idx)
{
	const kv_i vt = kv_set1_i((int)t);
	const kv_i vw = kv_set1_i(KV_W);
	kv_i vi = kv_iota();
	size_t i = 0, c = 0;

	for (; i + KV_W <= n; i += KV_W, vi = kv_add_i(vi, vw)) {
		kv_i k = kv_absbits(KV_FN(p_at)(a, b, i));
		unsigned m = kv_bits(kv_gt_key(k, vt));
		unsigned e = kv_bits(kv_eq_i(k, vt));

		if (e)
			m |= take_eq(e, &eq);
		if (m) {
			kv_compress_i(idx + c, m, vi);
			c += kv_pop(m);
		}
	}
	return select_tail(a, b, i, n, t, &eq, idx, c);
}

/*
 * The selection mask of a vector: G != 0 and |G + x| >= gmax, as float
 * compares: a NaN H (inf - inf, only where G is 0, which is out anyway)
 * compares false as in the scalar code; integer compares would call it
 * large.
 */
KV_TARGET static inline unsigned KV_FN(ada_mask)(kv_f g, kv_f x, kv_f vg)
{
	kv_f h = kv_add_f(g, x);

	return kv_bits(kv_mand(kv_ge_f(kv_abs_f(h), vg), kv_neq_f(g, kv_zero_f())));
}

/* Appends the lanes of @m: indices at + lane, and G. */
KV_TARGET static inline size_t KV_FN(ada_put)(uint32_t *idx, float *gv, unsigned m, size_t at, kv_f g)
{
	kv_compress_i(idx, m, kv_add_i(kv_iota(), kv_set1_i((int)at)));
	kv_compress_f(gv, m, g);
	return kv_pop(m);
}

KV_TARGET static size_t KV_FN(ada_select)(const float *x, float *r, int store, size_t n, size_t bin,
					  uint32_t *idx, float *gv)
{
	size_t c = 0;

	for (size_t b0 = 0; b0 < n; b0 += bin) {
		size_t len = n - b0 < bin ? n - b0 : bin, j;
		const float *xb = x + b0;
		float *rb = r ? r + b0 : NULL;
		/* Magnitudes compare as integers: the max of the bit patterns is the max. */
		kv_i vmax = kv_zero_i();

		for (j = 0; j + KV_W <= len; j += KV_W)
			vmax = kv_max_u32(vmax, kv_absbits(KV_FN(p_at)(xb, rb, j)));
		if (j < len)
			vmax = kv_max_u32(vmax, kv_absbits(KV_FN(p_atm)(xb, rb, j, kv_lanes(len - j))));
		const kv_f vg = kv_itof(kv_set1_i((int)kv_hmax_u32(vmax)));

		/*
		 * G again (recomputed from the cached bin, cheaper than storing it
		 * on the first pass and loading it back), stored if asked.
		 * gmax == 0: nothing is selected (G == 0 never is).
		 */
		for (j = 0; j + KV_W <= len; j += KV_W) {
			kv_f g = KV_FN(p_at)(xb, rb, j);
			unsigned m = KV_FN(ada_mask)(g, kv_loadu_f(xb + j), vg);

			if (store)
				kv_storeu_f(rb + j, g);
			c += KV_FN(ada_put)(idx + c, gv + c, m, b0 + j, g); /* no branch on m (random) */
		}
		if (j < len) {
			kv_m lm = kv_lanes(len - j);
			kv_f g = KV_FN(p_atm)(xb, rb, j, lm);
			/* Lanes past the end load as 0: G == 0 is never selected. */
			unsigned m = KV_FN(ada_mask)(g, kv_maskz_loadu_f(lm, xb + j), vg);

			if (store)
				kv_mask_storeu_f(rb + j, lm, g);
			if (m)
				c += KV_FN(ada_put)(idx + c, gv + c, m, b0 + j, g);
		}
	}
	return c;
}

KV_TARGET static int KV_FN(finite)(const void *v, size_t k)
{
	const unsigned char *p = v;
	const kv_i inf = kv_set1_i((int)INF_BITS);
	kv_m bad = kv_mzero();
	size_t j = 0;

	for (; j + KV_W <= k; j += KV_W) {
		kv_i u = kv_loadu_i(p + 4 * j);

		bad = kv_mor(bad, kv_eq_i(kv_and_i(u, inf), inf));
	}
	return !kv_bits(bad) && finite_scalar(p + 4 * j, k - j);
}
