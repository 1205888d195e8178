/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The vector kernels of quant.c, written once for both widths: quant.c
 * includes this file once with KV_W 8 (AVX2) and once with KV_W 16
 * (AVX-512), which makes bf16_enc_avx2 and bf16_enc_avx512 and so on
 * (kloop.h's kv layer). So no include guard. Why each kernel gives the
 * scalar code's bits is at the top of quant.c.
 *
 * No FMA in the AVX2 target on purpose (see reduce.c). AVX-512F brings it
 * along: the one product that is added, kl_widen's KL_AXPY, is kept from
 * fusing by a barrier (NOFUSE_V).
 */

/* ---- bf16 ---- */

/* The bf16 of each float (as bits) of @u, in the low half of its lane. */
KV_TARGET static inline kv_i KV_FN(bf16_lanes)(kv_i u)
{
	const kv_i hi = kv_srli_i(u, 16);
	const kv_i a = kv_and_i(u, kv_set1_i(0x7fffffff));
	const kv_i lsb = kv_and_i(hi, kv_set1_i(1));
	const kv_i bias = kv_add_i(kv_set1_i(0x7fff), lsb); /* ties to even */
	kv_i r = kv_srli_i(kv_add_i(u, bias), 16);
	kv_m big = kv_gt_key(a, kv_set1_i(0x7f7f7fff));
	kv_m nan = kv_gt_key(a, kv_set1_i(0x7f800000));
	kv_i sat = kv_or_i(kv_and_i(hi, kv_set1_i(0x8000)), kv_set1_i(0x7f7f));
	kv_i qnan = kv_or_i(hi, kv_set1_i(0x0040));

	r = kv_blend_i(r, sat, big);
	return kv_blend_i(r, qnan, nan);
}

KV_TARGET static inline kv_i KV_FN(bf16_nstep)(const void *c, kv_f x)
{
	(void)c;
	return KV_FN(bf16_lanes)(kv_ftoi(x));
}

KV_TARGET static void KV_FN(bf16_enc)(unsigned char *dst, const float *src, size_t n)
{
	kv_narrow(dst, KL_U16, src, n, KV_FN(bf16_nstep), NULL);
}

KV_TARGET static inline kv_f KV_FN(bf16_step)(const kv_c *c, const void *p, kv_m m, int full)
{
	(void)c;
	return kv_itof(kv_slli_i(kv_load_u16(p, m, full), 16));
}

KV_TARGET static void KV_FN(bf16_dec)(float *dst, const unsigned char *src, size_t n)
{
	const kv_c c = {0};

	kv_widen(dst, src, 2, n, 32 / KV_W, KV_FN(bf16_step), &c, KL_STORE);
}

KV_TARGET static void KV_FN(bf16_acc)(float *acc, const unsigned char *src, float w, size_t n)
{
	const kv_c c = {.w = kv_set1_f(w)};

	kv_widen(acc, src, 2, n, 32 / KV_W, KV_FN(bf16_step), &c, KL_AXPY);
}

/* ---- uniform8 ---- */

/* Vectors of doubles that hold the spec's 16 lanes: 4 of AVX2, 2 of AVX-512. */
#define KV_ND (16 / (KV_W / 2))

/* The lane sums, s[v] and q[v] holding lanes v * KV_W / 2 on: kept in registers. */
struct KV_FN(lanes) {
	kv_d s[KV_ND], q[KV_ND];
};

/*
 * Adds the 16 elements at @p to the lanes, a non-finite one as +0; returns
 * how many of them were finite. Unless @full (a constant), only the first
 * @k are there: the others are neither read nor counted.
 */
KV_TARGET MP_K_INLINE size_t KV_FN(lanes16)(struct KV_FN(lanes) *l, const float *p, size_t k, int full)
{
	size_t cnt = 0;

	_Pragma("GCC unroll 2") for (unsigned v = 0; v < 16 / KV_W; v++) {
		kv_m lm = kv_lanes(k > v * KV_W ? k - v * KV_W : 0);
		kv_f x = full ? kv_loadu_f(p + v * KV_W) : kv_maskz_loadu_f(lm, p + v * KV_W);
		kv_m fin = full ? kv_finite(x) : kv_mand(kv_finite(x), lm);

		x = kv_maskz_f(fin, x);
		kv_d d0 = kv_cvt_lo_d(x);
		kv_d d1 = kv_cvt_hi_d(x);

		l->s[2 * v] = kv_add_d(l->s[2 * v], d0);
		l->s[2 * v + 1] = kv_add_d(l->s[2 * v + 1], d1);
		/* d*d is exact in double: fused or not, the sums round the same. */
		l->q[2 * v] = kv_add_d(l->q[2 * v], kv_mul_d(d0, d0));
		l->q[2 * v + 1] = kv_add_d(l->q[2 * v + 1], kv_mul_d(d1, d1));
		cnt += (size_t)__builtin_popcount(kv_bits(fin));
	}
	return cnt;
}

/* q + d * d, as a separate multiply and add. */
KV_TARGET static inline kv_d KV_FN(sq_add)(kv_d q, kv_d d)
{
	return kv_add_d(q, kv_mul_d(d, d));
}

/* Adds src[i..end), all finite, to the lanes: no masking (see u8_lanes). */
KV_TARGET MP_K_INLINE void KV_FN(lanes_fin_body)(struct KV_FN(lanes) *l, const float *src, size_t i,
						 size_t end, kv_d (*sq)(kv_d q, kv_d d))
{
	struct KV_FN(lanes) r = *l;

	for (; i < end; i += 16) {
		_Pragma("GCC unroll 4") for (unsigned v = 0; v < KV_ND; v++) {
			kv_d d = kv_load_cvt_d(src + i + v * (KV_W / 2));

			r.s[v] = kv_add_d(r.s[v], d);
			r.q[v] = sq(r.q[v], d);
		}
	}
	*l = r;
}

KV_TARGET static void KV_FN(lanes_fin)(struct KV_FN(lanes) *l, const float *src, size_t i, size_t end)
{
	KV_FN(lanes_fin_body)(l, src, i, end, KV_FN(sq_add));
}

#if KV_W == 8
/*
 * The same with the add fused, where the CPU has FMA (not part of the
 * "avx2" level). d * d is exact in double, so the fused add rounds exactly
 * as the separate one: the same bits. It takes the squares' additions off
 * the two FADD pipes, which the conversions and the other sums keep busy
 * (a third faster on Zen 5). (The AVX-512 loop keeps the separate ones.)
 */
__attribute__((target("avx2,fma"))) static inline __m256d sq_fma(__m256d q, __m256d d)
{
	return _mm256_fmadd_pd(d, d, q);
}

__attribute__((target("avx2,fma"))) static void lanes_fin_avx2fma(struct lanes_avx2 *l, const float *src,
								 size_t i, size_t end)
{
	lanes_fin_body_avx2(l, src, i, end, sq_fma);
}
#endif

/*
 * Blocks of LANES_BLOCK elements first go through the unmasked loop, which
 * is all the statistics pass has to do for finite data. A sum of finite
 * floats (or of their squares) cannot overflow a double, so a lane sum that
 * is no longer finite means the block held an inf or a NaN: the lanes are
 * then put back and the block done again with the masked loop (from L1).
 * For an all-finite block both loops make the same additions.
 */
KV_TARGET static void KV_FN(u8_lanes)(const float *src, size_t n, double *s, double *q, size_t *nfin)
{
	void (*fin)(struct KV_FN(lanes) *, const float *, size_t, size_t) = KV_FN(lanes_fin);
	struct KV_FN(lanes) l;
	size_t cnt = 0, i = 0;

#if KV_W == 8
	if (__builtin_cpu_supports("fma") && !mp_kq_avoid_fma)
		fin = lanes_fin_avx2fma;
#endif
	for (unsigned v = 0; v < KV_ND; v++)
		l.s[v] = l.q[v] = kv_zero_d();
	/* Element i always lands in lane i % 16: no alignment peeling here. */
	while (i + 16 <= n) {
		size_t end = n - i >= LANES_BLOCK ? i + LANES_BLOCK : i + (n - i) / 16 * 16;
		struct KV_FN(lanes) saved = l;
		unsigned bad = 0;

		fin(&l, src, i, end);
		for (unsigned v = 0; v < KV_ND; v++)
			bad |= kv_nonfinite_d(l.s[v]);
		if (!bad) {
			cnt += end - i;
		} else {
			l = saved;
			for (size_t j = i; j < end; j += 16)
				cnt += KV_FN(lanes16)(&l, src + j, 16, 1);
		}
		i = end;
	}
	/* The missing elements are not read, and add +0.0 uncounted. */
	if (i < n)
		cnt += KV_FN(lanes16)(&l, src + i, n - i, 0);
	for (unsigned v = 0; v < KV_ND; v++) {
		kv_storeu_d(s + v * (KV_W / 2), l.s[v]);
		kv_storeu_d(q + v * (KV_W / 2), l.q[v]);
	}
	*nfin = cnt;
}

#undef KV_ND

/* The uniform8 parameters, broadcast. */
struct KV_FN(u8k) {
	kv_f lo, inv, nan_as;
};

/*
 * The codes of @x as int32, before KL_U8 takes the negative ones to 0;
 * @nan: x may hold NaN (a constant in every caller, so the test folds away).
 */
KV_TARGET MP_K_INLINE kv_i KV_FN(u8_code)(const struct KV_FN(u8k) *k, kv_f x, int nan)
{
	if (nan)
		x = kv_blend_f(x, k->nan_as, kv_unord_f(x, x));
	kv_f t = kv_mul_f(kv_sub_f(x, k->lo), k->inv);

	/*
	 * t is never NaN here (x is not, lo and inv are finite and inv > 0).
	 * Only the top is clamped here (+inf and t >= 2^31 would convert to
	 * INT_MIN); the result is floor(t) for 0 <= t <= 255 and some
	 * negative number or 0 for t < 0 (truncation), and KL_U8 makes
	 * those 0: the code of floor, then clamp.
	 */
	return kv_cvtt_i(kv_min_f(t, kv_set1_f(255.0f)));
}

KV_TARGET static inline kv_i KV_FN(u8_nstep_fin)(const void *k, kv_f x)
{
	return KV_FN(u8_code)(k, x, 0);
}

KV_TARGET static inline kv_i KV_FN(u8_nstep_nan)(const void *k, kv_f x)
{
	return KV_FN(u8_code)(k, x, 1);
}

KV_TARGET static void KV_FN(u8_codes)(uint8_t *codes, const float *src, size_t n, float lo, float inv,
				      float nan_as, int finite)
{
	const struct KV_FN(u8k) k = {kv_set1_f(lo), kv_set1_f(inv), kv_set1_f(nan_as)};

	/* Two loops, so that the finite one has no NaN test at all. */
	if (finite)
		kv_narrow(codes, KL_U8, src, n, KV_FN(u8_nstep_fin), &k);
	else
		kv_narrow(codes, KL_U8, src, n, KV_FN(u8_nstep_nan), &k);
}

/* ---- blockwise8 ---- */

/* The bits of |x| where x is finite, else 0. */
KV_TARGET static inline kv_i KV_FN(absfin)(kv_f x)
{
	kv_i a = kv_absbits(x);

	return kv_maskz_i(kv_gt_key(kv_set1_i(0x7f800000), a), a);
}

KV_TARGET static uint32_t KV_FN(bw8_absmax)(const float *src, size_t n)
{
	kv_i m0 = kv_zero_i(), m1 = m0, m2 = m0, m3 = m0;
	size_t i = 0;

	for (; i + 4 * KV_W <= n; i += 4 * KV_W) {
		m0 = kv_max_u32(m0, KV_FN(absfin)(kv_loadu_f(src + i)));
		m1 = kv_max_u32(m1, KV_FN(absfin)(kv_loadu_f(src + i + KV_W)));
		m2 = kv_max_u32(m2, KV_FN(absfin)(kv_loadu_f(src + i + 2 * KV_W)));
		m3 = kv_max_u32(m3, KV_FN(absfin)(kv_loadu_f(src + i + 3 * KV_W)));
	}
	for (; i + KV_W <= n; i += KV_W)
		m0 = kv_max_u32(m0, KV_FN(absfin)(kv_loadu_f(src + i)));
	/* The lanes past the end load as +0, which cannot raise a max of |x|. */
	if (i < n)
		m1 = kv_max_u32(m1, KV_FN(absfin)(kv_maskz_loadu_f(kv_lanes(n - i), src + i)));
	m0 = kv_max_u32(kv_max_u32(m0, m1), kv_max_u32(m2, m3));
	return kv_hmax_u32(m0);
}

KV_TARGET static inline kv_i KV_FN(bw8_code)(kv_f x, kv_f f, kv_f inv)
{
	kv_f t = kv_mul_f(kv_mul_f(x, f), inv);

	t = kv_maskz_f(kv_ord_f(t, t), t); /* NaN -> +0 */
	t = kv_min_f(kv_max_f(t, kv_set1_f(-127.0f)), kv_set1_f(127.0f));
	return kv_cvt_rne_i(t);
}

/* The blockwise8 multipliers of a block, broadcast. */
struct KV_FN(bw8k) {
	kv_f f, inv;
};

KV_TARGET static inline kv_i KV_FN(bw8_nstep)(const void *c, kv_f x)
{
	const struct KV_FN(bw8k) *k = c;

	return KV_FN(bw8_code)(x, k->f, k->inv);
}

KV_TARGET static void KV_FN(bw8_quant)(uint8_t *codes, const float *src, size_t n, float f, float inv)
{
	const struct KV_FN(bw8k) k = {kv_set1_f(f), kv_set1_f(inv)};

	kv_narrow(codes, KL_I8, src, n, KV_FN(bw8_nstep), &k);
}

KV_TARGET static inline kv_f KV_FN(bw8_step)(const kv_c *c, const void *p, kv_m m, int full)
{
	return kv_mul_f(kv_cvt_f(kv_load_i8(p, m, full)), c->s);
}

KV_TARGET static void KV_FN(bw8_dec)(float *dst, const uint8_t *codes, float s, size_t n)
{
	const kv_c c = {.s = kv_set1_f(s)};

	kv_widen(dst, codes, 1, n, 32 / KV_W, KV_FN(bw8_step), &c, KL_STORE);
}

KV_TARGET static void KV_FN(bw8_acc)(float *acc, const uint8_t *codes, float s, float w, size_t n)
{
	const kv_c c = {.s = kv_set1_f(s), .w = kv_set1_f(w)};

	kv_widen(acc, codes, 1, n, 32 / KV_W, KV_FN(bw8_step), &c, KL_AXPY);
}
