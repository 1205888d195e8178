/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Kernels of the quantising codecs: bf16 (wire id 2), uniform8 (3) and
 * blockwise8 (4). The formats and encode rules are in the codec spec and in
 * src/codec_quant.c; this file only does the per-element work, in a scalar
 * reference and in AVX2 and AVX-512 versions that give the same bits.
 *
 * Why each variant is exact (bit-identical to the scalar code):
 *  - bf16 encode is integer arithmetic on the fp32 bit pattern (add the
 *    rounding bias, shift, then select the clamped / NaN forms), the same
 *    operations in every variant; decode is a 16-bit shift.
 *  - uniform8 statistics: each of the 16 lanes adds its elements (i % 16) in
 *    element order in double, in every variant; a vector register simply
 *    holds several lanes side by side. x*x of a float is exact in double, so
 *    whether the square is fused into the add (explicitly, in the AVX2 loop
 *    where the CPU has FMA) makes no difference. Non-finite elements and the
 *    padding of ragged ends add +0.0, which leaves a sum that started at
 *    +0.0 unchanged (under round to nearest such a sum is never -0.0); the
 *    vector loops first try a block without that masking and redo it masked
 *    only if a lane sum came out non-finite, which finite data cannot do. The
 *    lanes are then combined by one shared scalar function in the spec's
 *    fixed tree order.
 *  - uniform8 and blockwise8 codes: one subtract and one multiply (uniform8)
 *    or two multiplies (blockwise8), each rounded once in fp32 as in the
 *    scalar code. blockwise8 then rounds half-even with the rounding fixed in
 *    the instruction; uniform8 clamps t to at most 255 and truncates, and the
 *    saturating packs turn negative results into 0, which is floor, then
 *    clamping to [0, 255] (the scalar code does floor and clamp literally,
 *    without libm and without depending on the rounding mode).
 *  - Decoding is a table lookup or (float)q * step; accumulation rounds the
 *    product before the add (NOFUSE), as reduce.c does.
 *  - Per-block absmax is an integer max over the bit patterns of |x|, which
 *    for non-negative floats orders them like their values: associative, so
 *    the vector order does not matter.
 * The uniform8 bucket means are a histogram of double sums, in element
 * order, of every MP_KQ_U8_SAMPLE-th element; that loop is scalar and shared
 * by all variants, and runs over cache-sized blocks right after their codes.
 *
 * Ragged ends go through the same vector code: masked on AVX-512, and on
 * AVX2 too where the elements are floats (VMASKMOV), else through a small
 * stack buffer. Wire-side pointers (bf16 payloads, codes, steps) may have
 * any alignment: the vector code uses unaligned accesses and the scalar code
 * memcpy.
 *
 * The AVX2 and AVX-512 kernels are each written once, in quant_vec.h, but
 * for the uniform8 table lookups, which are two algorithms.
 */
#include <float.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "mp_codec_params.h"
#include "mp_kernels.h"
#include "kernels_cpu.h"
#include "kloop.h"
#include "quant.h"

/* Elements per uniform8 quantise block: codes and floats stay in L1 for the histogram. */
#define U8_CHUNK 2048

/* Elements per block of the unmasked statistics loop (a multiple of 16, in L1). */
#define LANES_BLOCK 2048

int mp_kq_avoid_fma;

/* ================================ scalar ================================ */

/* ---- bf16 ---- */

static inline uint16_t bf16_1(float f)
{
	uint32_t u = f32_bits(f);
	uint32_t a = u & 0x7fffffffu;

	if (a > 0x7f800000u) /* NaN: sign and top 7 payload bits kept, made quiet */
		return (uint16_t)((u >> 16) | 0x0040u);
	if (a >= 0x7f7f8000u) /* would round to inf, or is inf: saturate */
		return (uint16_t)(((u >> 16) & 0x8000u) | 0x7f7fu);
	/* Round half to even on the low 16 bits; a carry bumps the exponent. */
	return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static inline float bf16_to_f32_1(const unsigned char *p)
{
	uint16_t h;

	memcpy(&h, p, sizeof(h));
	return bits_f32((uint32_t)h << 16);
}

static void bf16_enc_scalar(unsigned char *dst, const float *src, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		uint16_t h = bf16_1(src[i]);

		memcpy(dst + 2 * i, &h, sizeof(h));
	}
}

static void bf16_dec_scalar(float *dst, const unsigned char *src, size_t n)
{
	/* Through the bits, not a float conversion: signalling NaNs stay as they are. */
	for (size_t i = 0; i < n; i++) {
		uint16_t h;
		uint32_t u;

		memcpy(&h, src + 2 * i, sizeof(h));
		u = (uint32_t)h << 16;
		memcpy(dst + i, &u, sizeof(u));
	}
}

static void bf16_acc_scalar(float *acc, const unsigned char *src, float w, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		float p = w * bf16_to_f32_1(src + 2 * i);

		NOFUSE_SCALAR(p);
		acc[i] = acc[i] + p;
	}
}

/* ---- uniform8 ---- */

static void u8_lanes_scalar(const float *src, size_t n, double *s, double *q, size_t *nfin)
{
	size_t cnt = 0;

	for (int j = 0; j < 16; j++)
		s[j] = q[j] = 0.0;
	for (size_t i = 0; i < n; i++) {
		int fin = (f32_bits(src[i]) & 0x7fffffffu) < 0x7f800000u;
		/* Non-finite elements add +0.0, exactly as the vector code does. */
		double d = fin ? (double)src[i] : 0.0;

		cnt += (size_t)fin;
		s[i & 15] += d;
		q[i & 15] += d * d;
	}
	*nfin = cnt;
}

/* floor without libm: exact for every float, whatever the rounding mode. */
static inline float floor_exact(float t)
{
	if (!(t > -8388608.0f && t < 8388608.0f)) /* |t| >= 2^23 (already integral), inf, NaN */
		return t;
	float r = (float)(int32_t)t; /* truncation, exact here */

	return r - (float)(r > t); /* no branch: the sign of t is data */
}

static inline uint8_t u8_code_1(float x, float lo, float inv, float nan_as)
{
	if (x != x)
		x = nan_as;
	/* (x - lo) * inv is not of the a*b+c form: nothing to contract. */
	float t = floor_exact((x - lo) * inv);

	/* Clamped as a float, so that +-inf and overflowed differences convert safely. */
	if (t < 0.0f)
		t = 0.0f;
	if (t > 255.0f)
		t = 255.0f;
	return (uint8_t)(int)t;
}

/* @finite is only a hint for the vector code: the NaN test costs little here. */
static void u8_codes_scalar(uint8_t *codes, const float *src, size_t n, float lo, float inv,
			    float nan_as, int finite)
{
	(void)finite;
	for (size_t i = 0; i < n; i++)
		codes[i] = u8_code_1(src[i], lo, inv, nan_as);
}

/*
 * Bucket sums of the sampled elements (i % SAMPLE == 0), in element order.
 * The histogram is the one scalar part of the encoder: a bucket's sum must
 * see its elements one after another, so each sample is a read-modify-write,
 * whatever the vector width; every variant runs the same per-sample step
 * (u8_sample) in element order, so all get the same bits. A bucket keeps
 * {sum, count} side by side and one 128-bit add updates both (the count, a
 * double, is exact up to 2^53). Non-finite samples go to an extra bucket that
 * is thrown away, so the loops have no data-dependent branch.
 *
 * This scatter is fast while neighbouring samples fall in different
 * buckets, but when most share a bucket or two (heavy-tailed data: the
 * outliers stretch the range) each sample waits on a store-to-load round
 * trip. Such blocks take the hot loop instead (see u8_hist_hot), which keeps
 * the two most common buckets in registers.
 */
#define SAMPLE MP_KQ_U8_SAMPLE
#define TRASH 256 /* non-finite samples */
_Static_assert(U8_CHUNK % SAMPLE == 0, "blocks must start on sampled elements");

typedef double u8_hist[TRASH + 1][2];

static inline int finite_bits(float x)
{
	return (f32_bits(x) & 0x7fffffffu) < 0x7f800000u;
}

#ifdef __SSE2__
static inline void bucket_add(double (*h)[2], unsigned c, __m128d v)
{
	_mm_storeu_pd(h[c], _mm_add_pd(_mm_loadu_pd(h[c]), v));
}

/* {(double)x, 1.0} */
static inline __m128d sample_pair(float x)
{
	/*
	 * One CVTPS2PD of {x, 1.0f}, which writes the whole register: a
	 * CVTSS2SD would merge into the register's old value, and compilers do
	 * not always break that false dependency, which then chains every
	 * sample to the previous one's bucket update.
	 */
	return _mm_cvtps_pd(_mm_unpacklo_ps(_mm_set_ss(x), _mm_set_ss(1.0f)));
}

/* One sample: its bucket (@c) gets {x, 1}; @finite: x is known to be finite. */
static inline void u8_sample(double (*h)[2], unsigned c, float x, int finite)
{
	bucket_add(h, finite || finite_bits(x) ? c : TRASH, sample_pair(x));
}
#else
static inline void u8_sample(double (*h)[2], unsigned c, float x, int finite)
{
	c = finite || finite_bits(x) ? c : TRASH;
	h[c][0] += (double)x;
	h[c][1] += 1.0;
}
#endif

/*
 * The samples of codes/src[0..n), n a multiple of SAMPLE or the end of the
 * data. @finite: a constant in every caller, so that the all-finite loop
 * (the common one) has no test at all.
 */
static inline __attribute__((always_inline)) void u8_samples(double (*h)[2], const uint8_t *codes,
							     const float *src, size_t n, int finite)
{
	for (size_t i = 0; i < n; i += SAMPLE)
		u8_sample(h, codes[i], src[i], finite);
}

static void u8_dec_scalar(float *dst, const uint8_t *codes, const float *table, size_t n)
{
	for (size_t i = 0; i < n; i++)
		dst[i] = table[codes[i]];
}

/* @wtable holds w * table[b], each product already rounded. */
static void u8_add_scalar(float *acc, const uint8_t *codes, const float *wtable, size_t n)
{
	for (size_t i = 0; i < n; i++)
		acc[i] = acc[i] + wtable[codes[i]];
}

/* ---- blockwise8 ---- */

/* Bits of the largest finite |x| (0 if none). */
static uint32_t bw8_absmax_scalar(const float *src, size_t n)
{
	uint32_t m = 0;

	for (size_t i = 0; i < n; i++) {
		uint32_t a = f32_bits(src[i]) & 0x7fffffffu;

		if (a < 0x7f800000u && a > m)
			m = a;
	}
	return m;
}

/* Round half to even of |t| <= 127 without the rounding mode's help. */
static inline int rne_small(float t)
{
	int i = (int)t;         /* truncation */
	float d = t - (float)i; /* exact: same binade or smaller */
	/* Bitwise, not short-circuit: the branches would follow random data. */
	int up = (d > 0.5f) | ((d == 0.5f) & i);
	int down = (d < -0.5f) | ((d == -0.5f) & i);

	return i + (up & 1) - (down & 1);
}

static inline int8_t bw8_code_1(float x, float f, float inv)
{
	float t = (x * f) * inv;

	if (t != t) /* NaN input */
		return 0;
	if (t < -127.0f)
		t = -127.0f;
	if (t > 127.0f)
		t = 127.0f;
	return (int8_t)rne_small(t);
}

static void bw8_quant_scalar(uint8_t *codes, const float *src, size_t n, float f, float inv)
{
	for (size_t i = 0; i < n; i++) {
		int8_t q = bw8_code_1(src[i], f, inv);

		memcpy(codes + i, &q, 1);
	}
}

static void bw8_dec_scalar(float *dst, const uint8_t *codes, float s, size_t n)
{
	for (size_t i = 0; i < n; i++)
		dst[i] = (float)(int8_t)codes[i] * s;
}

static void bw8_acc_scalar(float *acc, const uint8_t *codes, float s, float w, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		float x = (float)(int8_t)codes[i] * s;
		float p = w * x;

		NOFUSE_SCALAR(p);
		acc[i] = acc[i] + p;
	}
}

#ifdef MP_K_X86

/* The vector kernels that are one algorithm at both widths (kloop.h's kv layer). */
#define KV_W 8
#include "quant_vec.h"
#undef KV_W
#define KV_W 16
#include "quant_vec.h"
#undef KV_W

/* ---- uniform8 table lookups: the one kernel that is two algorithms ---- */

/*
 * Table lookups: eight scalar loads assembled into a vector, which took
 * two thirds of VPGATHERDD's time on the core measured (Zen 5); gathers are
 * slower still where the "gather data sampling" microcode is in force. The
 * lookup is pure data movement, so it cannot round.
 */
KL_AVX2 MP_K_INLINE __m256 u8_step8(const struct kl8 *c, const void *p, __m256i m, int full)
{
	const float *table = c->data;
	uint64_t k;

	(void)m;
	(void)full;
	memcpy(&k, p, sizeof(k));
	__m128 lo = _mm_setr_ps(table[k & 255], table[(k >> 8) & 255], table[(k >> 16) & 255],
				table[(k >> 24) & 255]);
	__m128 hi = _mm_setr_ps(table[(k >> 32) & 255], table[(k >> 40) & 255], table[(k >> 48) & 255],
				table[k >> 56]);

	return _mm256_insertf128_ps(_mm256_castps128_ps256(lo), hi, 1);
}

KL_AVX2 static void u8_dec_avx2(float *dst, const uint8_t *codes, const float *table, size_t n)
{
	const struct kl8 c = {.data = table};

	kl_widen8(dst, codes, 1, n, 4, u8_step8, &c, KL_STORE);
}

KL_AVX2 static void u8_add_avx2(float *acc, const uint8_t *codes, const float *wtable, size_t n)
{
	const struct kl8 c = {.data = wtable};

	kl_widen8(acc, codes, 1, n, 4, u8_step8, &c, KL_ADD);
}

/*
 * 256-entry table in 16 registers: VPERMT2PS looks up 32 entries by the low
 * five index bits, and bits 5..7 pick one of the eight results. Pure data
 * movement, so the lookup cannot round; it avoids the gather unit, which is
 * slow on many cores (and microcoded where "gather data sampling" is
 * mitigated).
 */
struct lut512 {
	__m512 t[16];
};

KV_TARGET_16 static inline void lut512_load(struct lut512 *l, const float *table)
{
	for (int k = 0; k < 16; k++)
		l->t[k] = _mm512_loadu_ps(table + 16 * k);
}

KV_TARGET_16 static inline __m512 lut512_get(const struct lut512 *l, __m512i idx)
{
	__m512 r0 = _mm512_permutex2var_ps(l->t[0], idx, l->t[1]);
	__m512 r1 = _mm512_permutex2var_ps(l->t[2], idx, l->t[3]);
	__m512 r2 = _mm512_permutex2var_ps(l->t[4], idx, l->t[5]);
	__m512 r3 = _mm512_permutex2var_ps(l->t[6], idx, l->t[7]);
	__m512 r4 = _mm512_permutex2var_ps(l->t[8], idx, l->t[9]);
	__m512 r5 = _mm512_permutex2var_ps(l->t[10], idx, l->t[11]);
	__m512 r6 = _mm512_permutex2var_ps(l->t[12], idx, l->t[13]);
	__m512 r7 = _mm512_permutex2var_ps(l->t[14], idx, l->t[15]);
	__mmask16 b5 = _mm512_test_epi32_mask(idx, _mm512_set1_epi32(32));
	__mmask16 b6 = _mm512_test_epi32_mask(idx, _mm512_set1_epi32(64));
	__mmask16 b7 = _mm512_test_epi32_mask(idx, _mm512_set1_epi32(128));

	r0 = _mm512_mask_blend_ps(b5, r0, r1);
	r2 = _mm512_mask_blend_ps(b5, r2, r3);
	r4 = _mm512_mask_blend_ps(b5, r4, r5);
	r6 = _mm512_mask_blend_ps(b5, r6, r7);
	r0 = _mm512_mask_blend_ps(b6, r0, r2);
	r4 = _mm512_mask_blend_ps(b6, r4, r6);
	return _mm512_mask_blend_ps(b7, r0, r4);
}

KV_TARGET_16 static inline __m512 u8_step16(const struct kl16 *c, const void *p, __mmask16 m, int full)
{
	__m128i b = full ? _mm_loadu_si128((const __m128i *)p) : _mm_maskz_loadu_epi8(m, p);

	return lut512_get(c->data, _mm512_cvtepu8_epi32(b));
}

KV_TARGET_16 static void u8_dec_avx512(float *dst, const uint8_t *codes, const float *table, size_t n)
{
	struct lut512 l;

	lut512_load(&l, table);
	const struct kl16 c = {.data = &l};

	kl_widen16(dst, codes, 1, n, 2, u8_step16, &c, KL_STORE);
}

KV_TARGET_16 static void u8_add_avx512(float *acc, const uint8_t *codes, const float *wtable, size_t n)
{
	struct lut512 l;

	lut512_load(&l, wtable);
	const struct kl16 c = {.data = &l};

	kl_widen16(acc, codes, 1, n, 2, u8_step16, &c, KL_ADD);
}

#endif /* MP_K_X86 */

/* ============================ variant table ============================ */

struct qvariant {
	void (*bf16_enc)(unsigned char *dst, const float *src, size_t n);
	void (*bf16_dec)(float *dst, const unsigned char *src, size_t n);
	void (*bf16_acc)(float *acc, const unsigned char *src, float w, size_t n);
	void (*u8_lanes)(const float *src, size_t n, double *s, double *q, size_t *nfin);
	void (*u8_codes)(uint8_t *codes, const float *src, size_t n, float lo, float inv, float nan_as,
			 int finite);
	void (*u8_dec)(float *dst, const uint8_t *codes, const float *table, size_t n);
	void (*u8_add)(float *acc, const uint8_t *codes, const float *wtable, size_t n);
	uint32_t (*bw8_absmax)(const float *src, size_t n);
	void (*bw8_quant)(uint8_t *codes, const float *src, size_t n, float f, float inv);
	void (*bw8_dec)(float *dst, const uint8_t *codes, float s, size_t n);
	void (*bw8_acc)(float *acc, const uint8_t *codes, float s, float w, size_t n);
};

#define QV(sfx)                                                                                      \
	{                                                                                            \
		bf16_enc_##sfx, bf16_dec_##sfx, bf16_acc_##sfx, u8_lanes_##sfx, u8_codes_##sfx,      \
			u8_dec_##sfx, u8_add_##sfx, bw8_absmax_##sfx, bw8_quant_##sfx, bw8_dec_##sfx, \
			bw8_acc_##sfx                                                                \
	}

/* Indexed by mp_k_level(); dispatch.c only reports levels this CPU runs. */
static const struct qvariant qvariants[] = {
	[MP_K_SCALAR] = QV(scalar),
#ifdef MP_K_X86
	[MP_K_AVX2] = QV(avx2),
	[MP_K_AVX512] = QV(avx512),
#else
	[MP_K_AVX2] = QV(scalar),
	[MP_K_AVX512] = QV(scalar),
#endif
};

static inline const struct qvariant *qv(void)
{
	unsigned l = (unsigned)mp_k_level();

	return &qvariants[l < sizeof(qvariants) / sizeof(qvariants[0]) ? l : MP_K_SCALAR];
}

/* ============================== entry points ============================== */

void mp_kq_bf16_encode(void *dst, const float *src, size_t n)
{
	qv()->bf16_enc(dst, src, n);
}

void mp_kq_bf16_decode(float *dst, const void *src, size_t n)
{
	qv()->bf16_dec(dst, src, n);
}

void mp_kq_bf16_decode_acc(float *acc, const void *src, float w, size_t n)
{
	qv()->bf16_acc(acc, src, w, n);
}

/*
 * The spec's combination of the 16 lanes: 0+8, 1+9, ..., 7+15, then 0+4 ..
 * 3+7, then 0+2, 1+3, then 0+1. Shared by all variants.
 */
static double lanes_combine(double *l)
{
	for (int w = 8; w >= 1; w /= 2)
		for (int j = 0; j < w; j++)
			l[j] = l[j] + l[j + w];
	return l[0];
}

void mp_kq_u8_moments(const float *src, size_t n, double *sum, double *sumsq, size_t *nfinite)
{
	double s[16], q[16];

	qv()->u8_lanes(src, n, s, q, nfinite);
	*sum = lanes_combine(s);
	*sumsq = lanes_combine(q);
}

/*
 * The hot loop: the same additions as u8_samples, in the same order, with
 * buckets @a != @b kept in registers. Every sample is added to both, masked
 * to +0.0 where it does not belong; adding +0.0 leaves these sums unchanged
 * (they start at +0.0 and cannot become -0.0 under round to nearest). The
 * few other samples still go to memory.
 */
#ifdef __SSE2__
static inline __attribute__((always_inline)) void u8_hist_hot(double (*h)[2], const uint8_t *codes,
							      const float *src, size_t n, unsigned a,
							      unsigned b, int finite)
{
	const __m128i va = _mm_set1_epi32((int)a), vb = _mm_set1_epi32((int)b);
	__m128d ha = _mm_loadu_pd(h[a]), hb = _mm_loadu_pd(h[b]);

	for (size_t i = 0; i < n; i += SAMPLE) {
		float x = src[i];
		/* A non-finite sample's bucket is TRASH: neither a nor b. */
		unsigned c = finite || finite_bits(x) ? codes[i] : TRASH;
		__m128d v = sample_pair(x);
		__m128i vc = _mm_set1_epi32((int)c);
		/* Masks, not branches: samples of a and of b interleave at random. */
		__m128d ma = _mm_castsi128_pd(_mm_cmpeq_epi32(vc, va));
		__m128d mb = _mm_castsi128_pd(_mm_cmpeq_epi32(vc, vb));

		ha = _mm_add_pd(ha, _mm_and_pd(v, ma));
		hb = _mm_add_pd(hb, _mm_and_pd(v, mb));
		/*
		 * One branch on "neither": rare by the choice of a and b, so it
		 * predicts well.
		 */
		if (!_mm_movemask_pd(_mm_or_pd(ma, mb)))
			bucket_add(h, c, v);
	}
	_mm_storeu_pd(h[a], ha);
	_mm_storeu_pd(h[b], hb);
}
#define HAVE_HOT 1
#else
#define HAVE_HOT 0
#endif

/*
 * Whether the hot loop pays for a block, guessed from 16 of its codes (every
 * 128th of a full block): @a is the first, @b the first that differs from
 * it, and the hot loop is taken when these two make 7/8 of the codes looked
 * at. No branches and no table: the guess runs for every block, and a wrong
 * guess only costs time, never changes the sums.
 */
static int pick_hot(const uint8_t *codes, size_t k, unsigned *a, unsigned *b)
{
	unsigned ca = codes[0], cb = ca ^ 1u, have_b = 0, hits = 0, tried = 0;

	for (size_t j = 0; j < k; j += U8_CHUNK / 16, tried++) {
		unsigned c = codes[j];
		unsigned take = !have_b & (c != ca);

		cb = take ? c : cb;
		have_b |= take;
		hits += (c == ca) | (c == cb);
	}
	*a = ca;
	*b = cb;
	return 8 * hits >= 7 * tried;
}

/* The samples of one block, by the loop that suits it; @finite as in u8_samples. */
static inline __attribute__((always_inline)) void u8_block_samples(double (*h)[2], const uint8_t *codes,
								   const float *src, size_t k, int finite)
{
#if HAVE_HOT
	unsigned a, b;

	if (pick_hot(codes, k, &a, &b)) {
		u8_hist_hot(h, codes, src, k, a, b, finite);
		return;
	}
#else
	(void)pick_hot;
#endif
	u8_samples(h, codes, src, k, finite);
}

static void u8_block_samples_fin(double (*h)[2], const uint8_t *codes, const float *src, size_t k)
{
	u8_block_samples(h, codes, src, k, 1);
}

static void u8_block_samples_any(double (*h)[2], const uint8_t *codes, const float *src, size_t k)
{
	u8_block_samples(h, codes, src, k, 0);
}

void mp_kq_u8_quantize(uint8_t *codes, struct mp_kq_u8_bucket hist[256], const float *src, size_t n,
		       float lo, float inv, float nan_as, int finite)
{
	const struct qvariant *v = qv();
	_Alignas(16) u8_hist h = {{0}};

	for (int b = 0; b < 256; b++) {
		h[b][0] = hist[b].sum;
		h[b][1] = hist[b].count;
	}
	/*
	 * One pass over the data in blocks of U8_CHUNK, each started on a
	 * sampled index: the codes of a block (vector), then the samples of the
	 * block before it, still in L1. The lag of one block lets the sample
	 * loop read codes whose stores have long completed: read right after
	 * the vector stores, they wait on store forwarding. (Taking the samples
	 * inside the vector code loop, even a few groups behind, measured no
	 * faster on Zen 5: the two do not overlap better than this.)
	 */
	for (size_t i = 0, k, prev = 0, pk = 0;; i += k) {
		k = n - i < U8_CHUNK ? n - i : U8_CHUNK;
		if (k)
			v->u8_codes(codes + i, src + i, k, lo, inv, nan_as, finite);
		if (pk)
			(finite ? u8_block_samples_fin : u8_block_samples_any)(h, codes + prev, src + prev, pk);
		if (!k)
			break;
		prev = i;
		pk = k;
	}
	for (int b = 0; b < 256; b++) {
		hist[b].sum = h[b][0];
		hist[b].count = h[b][1];
	}
}

void mp_kq_u8_decode(float *dst, const uint8_t *codes, const float table[256], size_t n)
{
	qv()->u8_dec(dst, codes, table, n);
}

void mp_kq_u8_decode_acc(float *acc, const uint8_t *codes, const float table[256], float w, size_t n)
{
	/*
	 * w * table[c] rounded once per entry is the product every element
	 * would round to: the lookup then only has the add left.
	 */
	_Alignas(64) float wt[256];

	for (int b = 0; b < 256; b++)
		wt[b] = w * table[b];
	qv()->u8_add(acc, codes, wt, n);
}

/*
 * Step and multiplier of one block: the spec's s = a/127 and inv = 127/a.
 * For a below 127/FLT_MAX (about 3.7e-37) 127/a overflows although s is
 * representable; there the block's values are first scaled by 2^64 (exact
 * for values this small) and inv = 127/(a * 2^64), which gives every code the
 * value the formula has without the overflow.
 *
 * Where 127 * s overflows (a/127 rounds up, and 127 s lands past FLT_MAX:
 * of all floats only for a = FLT_MAX), a finite input would decode as inf.
 * The spec then takes the next float below s, for which 127 * s < a (one
 * step is enough: it moves 127 s down by about two ulps of FLT_MAX, rounding
 * had moved it up by at most one), so no code decodes past FLT_MAX. The
 * codes stay those of 127/a. Shared scalar code: every variant sends the
 * same step. The cases are told apart on @abits (mp_codec_params.h says why).
 */
static float bw8_block_params(uint32_t abits, float *f, float *inv)
{
	const float a = bits_f32(abits);
	float s = a / 127.0f;

	if (abits <= MP_BW8_ZERO_STEP_MAX)
		return 0.0f;
	if (abits == MP_BW8_STEP_DOWN)
		s = bits_f32(f32_bits(s) - 1u); /* s > 0: the next float toward zero */
	*f = 1.0f;
	*inv = 127.0f / a;
	if (abits <= MP_BW8_PRESCALE_MAX) {
		*f = 0x1p64f;
		*inv = 127.0f / (a * 0x1p64f);
	}
	return s;
}

void mp_kq_bw8_encode(void *steps, void *codes, const float *src, size_t n, uint32_t block)
{
	const struct qvariant *v = qv();
	unsigned char *sp = steps;
	uint8_t *cp = codes;

	for (size_t i = 0, k; i < n; i += k, sp += 4) {
		float f, inv;

		k = n - i < block ? n - i : block;
		float s = bw8_block_params(v->bw8_absmax(src + i, k), &f, &inv);

		if (s == 0.0f)
			memset(cp + i, 0, k);
		else
			v->bw8_quant(cp + i, src + i, k, f, inv);
		memcpy(sp, &s, sizeof(s));
	}
}

/* Each block's codes decoded with its step: into @dst, or added to it with weight @w if @acc. */
static void bw8_blocks(float *dst, const void *steps, const void *codes, size_t n, uint32_t block,
		       float w, int acc)
{
	const struct qvariant *v = qv();
	const unsigned char *sp = steps;
	const uint8_t *cp = codes;

	for (size_t i = 0, k; i < n; i += k, sp += 4) {
		float s;

		k = n - i < block ? n - i : block;
		memcpy(&s, sp, sizeof(s));
		if (acc)
			v->bw8_acc(dst + i, cp + i, s, w, k);
		else
			v->bw8_dec(dst + i, cp + i, s, k);
	}
}

void mp_kq_bw8_decode(float *dst, const void *steps, const void *codes, size_t n, uint32_t block)
{
	bw8_blocks(dst, steps, codes, n, block, 0.0f, 0);
}

void mp_kq_bw8_decode_acc(float *acc, const void *steps, const void *codes, float w, size_t n,
			  uint32_t block)
{
	bw8_blocks(acc, steps, codes, n, block, w, 1);
}
