/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Hot loops of the sparse codecs (topk and adacomp, src/codec_sparse.c): a
 * scalar reference and AVX2 / AVX-512 versions, in a table of our own that
 * mp_k_level() indexes (dispatch.c decides the level, tests force it).
 *
 * Why every variant gives the same bits. Nothing here rounds in a way that
 * depends on the variant: each element sees the same single IEEE additions
 * (a + b, G + x) in every lane; maxima, magnitudes and comparisons are
 * exact; the one product (w * v in scatter_acc) is kept out of FMA
 * contraction with NOFUSE as in reduce.c. And the selections are defined by
 * value, not by the order of work: the k-th largest key is unique, ties at
 * it go to the lowest indices, and AdaComp's test is per element against
 * a per-bin maximum. So any variant that counts right picks the same set,
 * and the codec writes payload and residue from that set with shared code.
 *
 * Keys: a value's magnitude as a bit pattern (bits & 0x7fffffff). For
 * finite floats that orders exactly like |v| (+0 and -0 share key 0), and
 * integer compares are cheap in every lane width. Non-finite values are
 * replaced by +0 before anything else, so keys never exceed 0x7f7fffff and
 * are non-negative as int32 (AVX2's signed compares are fine).
 *
 * Top-k selection. The threshold t is the key of the k-th largest |p|,
 * and the set is {key > t} plus the lowest-indexed {key == t} up to k.
 * Found in one streaming pass when it can be: a fixed, strided sample of
 * the keys (same positions every call) gives a bound lo that sits about
 * four standard deviations of the sample's rank below t; the pass writes p
 * (into the residue) and lists the index and key of every element with
 * key >= lo, about 1.5 k of them; t comes from that short list. If the
 * sample misjudged (fewer than k listed, or more than the list holds), an
 * exact three-pass radix select over all n takes over: levels of 11, 10
 * and 10 key bits, each a streaming pass that counts only the keys under
 * the prefix found so far. Both give the same t, the unique k-th largest,
 * so the shortcut changes speed, never the result. The level-1 counts go to
 * four interleaved histograms: gradients crowd a few exponents, and back-
 * to-back increments of one counter would wait on each other.
 *
 * Compaction (indices of selected elements, with their values):
 * AVX-512 compresses in a register and stores the whole vector (a memory
 * destination VPCOMPRESSD is microcoded on some cores); AVX2 permutes with
 * an 8-bit-mask table. Both write up to a vector past the last entry
 * (MP_SP_SLACK). Popcounts come from a table, so no "popcnt" target is
 * needed beyond what dispatch.c checks.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "mp_kernels.h"
#include "kloop.h"
#include "sparse.h"

#define ABSM 0x7fffffffu
#define INF_BITS 0x7f800000u

/* p = a (+ b), non-finite -> +0. */
static inline float p_at(const float *a, const float *b, size_t i)
{
	return mp_sp_san(b ? a[i] + b[i] : a[i]);
}

static inline uint32_t key_at(const float *a, const float *b, size_t i)
{
	return f32_bits(p_at(a, b, i)) & ABSM;
}

/* ---- tables built by the preprocessor (constant, no init race) ---- */

#define BIT(m, b) (((m) >> (b)) & 1u)
#define POP4(m, b) (BIT(m, b) + BIT(m, (b) + 1) + BIT(m, (b) + 2) + BIT(m, (b) + 3))
#define POP8(m) (POP4(m, 0) + POP4(m, 4))
/* Lane b of a mask goes to output slot popcount(mask below b): one nibble per slot. */
#define PB(m, b) (BIT(m, b) * ((uint32_t)(b) << (4u * POP8((m) & ((1u << (b)) - 1u)))))
#define PERM(m) \
	(PB(m, 0) | PB(m, 1) | PB(m, 2) | PB(m, 3) | PB(m, 4) | PB(m, 5) | PB(m, 6) | PB(m, 7))
#define T4(f, m) f(m), f((m) + 1u), f((m) + 2u), f((m) + 3u)
#define T16(f, m) T4(f, m), T4(f, (m) + 4u), T4(f, (m) + 8u), T4(f, (m) + 12u)
#define T64(f, m) T16(f, m), T16(f, (m) + 16u), T16(f, (m) + 32u), T16(f, (m) + 48u)
#define T256(f) T64(f, 0u), T64(f, 64u), T64(f, 128u), T64(f, 192u)

static const uint8_t pop8[256] = {T256(POP8)};
#ifdef MP_K_X86
static const uint32_t perm8[256] = {T256(PERM)};
#endif

static inline unsigned pop16(unsigned m)
{
	return pop8[m & 0xffu] + pop8[(m >> 8) & 0xffu];
}

/*
 * Of the tied lanes in @e (lowest lane = lowest index), the ones still to be
 * taken: the lowest *eq of them.
 */
static inline unsigned take_eq(unsigned e, size_t *eq)
{
	unsigned c = pop16(e), r = 0;

	if (c <= *eq) {
		*eq -= c;
		return e;
	}
	for (; *eq; (*eq)--) {
		r |= e & -e;
		e &= e - 1;
	}
	return r;
}

/* ---- scalar reference ---- */

static inline void hist4(uint32_t *h, const uint32_t *bk, size_t k)
{
	for (size_t j = 0; j < k; j++)
		h[(j & (MP_SP_NSUB - 1)) * MP_SP_NB1 + bk[j]]++;
}

static void prep_scalar(const float *a, const float *b, float *out, size_t n, uint32_t *hist)
{
	uint32_t bk[16];
	size_t i = 0;

	while (i < n) {
		size_t m = n - i < 16 ? n - i : 16;

		for (size_t j = 0; j < m; j++) {
			float p = p_at(a, b, i + j);

			if (out)
				out[i + j] = p;
			bk[j] = (f32_bits(p) & ABSM) >> MP_SP_B1_SHIFT;
		}
		if (hist)
			hist4(hist, bk, m);
		i += m;
	}
}

static inline void hist_sub_tail(const float *a, const float *b, size_t i, size_t n, unsigned shift,
				 uint32_t prefix, uint32_t *hist)
{
	for (; i < n; i++) {
		uint32_t k = key_at(a, b, i);

		if (k >> (shift + 10) == prefix)
			hist[(k >> shift) & 1023u]++;
	}
}

static void hist_sub_scalar(const float *a, const float *b, size_t n, unsigned shift,
			    uint32_t prefix, uint32_t *hist)
{
	hist_sub_tail(a, b, 0, n, shift, prefix, hist);
}

/* The vector loops' count of the keys @kb[lane] for the lanes in @m. */
static inline void hist_sub_lanes(uint32_t *hist, const uint32_t *kb, unsigned m, unsigned shift)
{
	for (; m; m &= m - 1)
		hist[(kb[__builtin_ctz(m)] >> shift) & 1023u]++;
}

static inline size_t sift_tail(const float *a, const float *b, float *out, size_t i, size_t n,
			       uint32_t lo, size_t cap, uint32_t *idx, float *val, size_t c)
{
	for (; i < n; i++) {
		float p = p_at(a, b, i);

		if (out)
			out[i] = p;
		if ((f32_bits(p) & ABSM) >= lo) {
			if (c < cap) {
				idx[c] = (uint32_t)i;
				val[c] = p;
			}
			c++;
		}
	}
	return c;
}

static size_t sift_scalar(const float *a, const float *b, float *out, size_t n, uint32_t lo,
			  size_t cap, uint32_t *idx, float *val)
{
	return sift_tail(a, b, out, 0, n, lo, cap, idx, val, 0);
}

static inline size_t select_tail(const float *a, const float *b, size_t i, size_t n, uint32_t t,
				 size_t *eq, uint32_t *idx, size_t c)
{
	for (; i < n; i++) {
		uint32_t k = key_at(a, b, i);

		if (k > t) {
			idx[c++] = (uint32_t)i;
		} else if (k == t && *eq) {
			(*eq)--;
			idx[c++] = (uint32_t)i;
		}
	}
	return c;
}

static size_t select_scalar(const float *a, const float *b, size_t n, uint32_t t, size_t eq,
			    uint32_t *idx)
{
	return select_tail(a, b, 0, n, t, &eq, idx, 0);
}

static size_t ada_select_scalar(const float *x, float *r, int store, size_t n, size_t bin,
				uint32_t *idx, float *gv)
{
	size_t c = 0;

	for (size_t b0 = 0; b0 < n; b0 += bin) {
		size_t e = n - b0 < bin ? n : b0 + bin;
		float gmax = 0.0f;

		for (size_t i = b0; i < e; i++) {
			float m = __builtin_fabsf(p_at(x, r, i));

			if (m > gmax)
				gmax = m;
		}
		for (size_t i = b0; i < e; i++) {
			float g = p_at(x, r, i);
			float h = g + x[i];

			if (store)
				r[i] = g;

			if (g != 0.0f && __builtin_fabsf(h) >= gmax) {
				idx[c] = (uint32_t)i;
				gv[c++] = g;
			}
		}
	}
	return c;
}

static int finite_scalar(const void *v, size_t k)
{
	const unsigned char *p = v;
	uint32_t bad = 0;

	for (size_t j = 0; j < k; j++) {
		uint32_t u;

		memcpy(&u, p + 4 * j, 4);
		bad |= (uint32_t)((u & INF_BITS) == INF_BITS);
	}
	return !bad;
}

/*
 * acc[idx[j]] += w * v[j] for j in [@j, @k), the product rounded first: all
 * of the scalar version, and the vector versions' ends. (NOFUSE costs the
 * scalar loop nothing: an indexed update does not vectorise anyway.)
 */
static inline void scatter_acc_tail(float *acc, const uint32_t *idx, const float *v, float w, size_t j,
				    size_t k)
{
	for (; j < k; j++) {
		float p = w * v[j];

		NOFUSE(p);
		acc[idx[j]] = acc[idx[j]] + p;
	}
}

static void scatter_acc_scalar(float *acc, const uint32_t *idx, const float *v, float w, size_t k)
{
	scatter_acc_tail(acc, idx, v, w, 0, k);
}

#ifdef MP_K_X86

/* ---- AVX2 (no FMA in the target; nothing here multiplies but scatter_acc) ---- */

#define AVX2 __attribute__((target("avx2")))

AVX2 static inline __m256 p8(const float *a, const float *b, size_t i)
{
	__m256 p = _mm256_loadu_ps(a + i);

	if (b)
		p = _mm256_add_ps(p, _mm256_loadu_ps(b + i));
	return p;
}

/* Non-finite -> +0 (keys are non-negative int32, so the signed compare is exact). */
AVX2 static inline __m256 san8(__m256 p)
{
	__m256i k = _mm256_and_si256(_mm256_castps_si256(p), _mm256_set1_epi32((int)ABSM));
	__m256i fin = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)INF_BITS), k);

	return _mm256_and_ps(p, _mm256_castsi256_ps(fin));
}

AVX2 static inline __m256i key8(__m256 p)
{
	return _mm256_and_si256(_mm256_castps_si256(p), _mm256_set1_epi32((int)ABSM));
}

AVX2 static inline __m256i perm_of(unsigned m)
{
	__m256i sh = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
	__m256i pm = _mm256_srlv_epi32(_mm256_set1_epi32((int)perm8[m]), sh);

	return _mm256_and_si256(pm, _mm256_set1_epi32(15));
}

/* Stores the lanes of @v selected by the 8-bit mask @m, packed, at @out; returns how many. */
AVX2 static inline size_t compress8(uint32_t *out, unsigned m, __m256i v)
{
	_mm256_storeu_si256((__m256i *)out, _mm256_permutevar8x32_epi32(v, perm_of(m)));
	return pop8[m];
}

AVX2 static void prep_avx2(const float *a, const float *b, float *out, size_t n, uint32_t *hist)
{
	_Alignas(32) uint32_t bk[16];
	size_t i = 0;

	for (; i + 16 <= n; i += 16) {
		__m256 p0 = san8(p8(a, b, i));
		__m256 p1 = san8(p8(a, b, i + 8));

		if (out) {
			_mm256_storeu_ps(out + i, p0);
			_mm256_storeu_ps(out + i + 8, p1);
		}
		if (hist) {
			_mm256_store_si256((__m256i *)bk,
					   _mm256_srli_epi32(key8(p0), MP_SP_B1_SHIFT));
			_mm256_store_si256((__m256i *)(bk + 8),
					   _mm256_srli_epi32(key8(p1), MP_SP_B1_SHIFT));
			hist4(hist, bk, 16);
		}
	}
	prep_scalar(a + i, b ? b + i : NULL, out ? out + i : NULL, n - i, hist);
}

AVX2 static void hist_sub_avx2(const float *a, const float *b, size_t n, unsigned shift,
			       uint32_t prefix, uint32_t *hist)
{
	const __m256i vp = _mm256_set1_epi32((int)prefix);
	const __m128i sh = _mm_cvtsi32_si128((int)(shift + 10));
	_Alignas(32) uint32_t kb[8];
	size_t i = 0;

	for (; i + 8 <= n; i += 8) {
		__m256i k = key8(san8(p8(a, b, i)));
		__m256i eq = _mm256_cmpeq_epi32(_mm256_srl_epi32(k, sh), vp);
		unsigned m = (unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(eq));

		if (m) {
			_mm256_store_si256((__m256i *)kb, k);
			hist_sub_lanes(hist, kb, m, shift);
		}
	}
	hist_sub_tail(a, b, i, n, shift, prefix, hist);
}

AVX2 static size_t sift_avx2(const float *a, const float *b, float *out, size_t n, uint32_t lo,
			     size_t cap, uint32_t *idx, float *val)
{
	/* key >= lo as key > lo - 1 (lo >= 1 here; lo == 0 lists everything). */
	const __m256i vl = _mm256_set1_epi32((int)lo - 1);
	const __m256i v8 = _mm256_set1_epi32(8);
	__m256i vi = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
	size_t i = 0, c = 0;

	if (!lo)
		return sift_tail(a, b, out, 0, n, lo, cap, idx, val, 0);
	for (; i + 8 <= n; i += 8, vi = _mm256_add_epi32(vi, v8)) {
		__m256 p = san8(p8(a, b, i));
		__m256i k = key8(p);
		unsigned m = (unsigned)_mm256_movemask_ps(
			_mm256_castsi256_ps(_mm256_cmpgt_epi32(k, vl)));

		if (out)
			_mm256_storeu_ps(out + i, p);
		/* As in sift_avx512: no branch on m. */
		unsigned nm = pop8[m];

		if (c + nm <= cap) {
			__m256i pm = perm_of(m);

			_mm256_storeu_si256((__m256i *)(idx + c),
					    _mm256_permutevar8x32_epi32(vi, pm));
			_mm256_storeu_ps(val + c, _mm256_permutevar8x32_ps(p, pm));
		}
		c += nm;
	}
	return sift_tail(a, b, out, i, n, lo, cap, idx, val, c);
}

AVX2 static size_t select_avx2(const float *a, const float *b, size_t n, uint32_t t, size_t eq,
			       uint32_t *idx)
{
	const __m256i vt = _mm256_set1_epi32((int)t);
	const __m256i v8 = _mm256_set1_epi32(8);
	__m256i vi = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
	size_t i = 0, c = 0;

	for (; i + 8 <= n; i += 8, vi = _mm256_add_epi32(vi, v8)) {
		__m256i k = key8(san8(p8(a, b, i)));
		unsigned m = (unsigned)_mm256_movemask_ps(
			_mm256_castsi256_ps(_mm256_cmpgt_epi32(k, vt)));
		unsigned e = (unsigned)_mm256_movemask_ps(
			_mm256_castsi256_ps(_mm256_cmpeq_epi32(k, vt)));

		if (e)
			m |= take_eq(e, &eq);
		if (m)
			c += compress8(idx + c, m, vi);
	}
	return select_tail(a, b, i, n, t, &eq, idx, c);
}

/* Lanes below @k (0..8) all ones. */
AVX2 static inline __m256i lanes8(size_t k)
{
	return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)k),
				  _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

AVX2 static inline __m256 g8m(const float *x, const float *r, __m256i lm)
{
	__m256 g = _mm256_maskload_ps(x, lm);

	if (r)
		g = _mm256_add_ps(g, _mm256_maskload_ps(r, lm));
	return san8(g);
}

AVX2 static inline float hmax8(__m256 v)
{
	__m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));

	m = _mm_max_ps(m, _mm_movehl_ps(m, m));
	m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
	return _mm_cvtss_f32(m);
}

/* The selection mask of 8 elements: G != 0 and |G + x| >= gmax. */
AVX2 static inline unsigned ada_mask8(__m256 g, __m256 x, __m256 vg)
{
	const __m256 absm = _mm256_castsi256_ps(_mm256_set1_epi32((int)ABSM));
	__m256 h = _mm256_add_ps(g, x);
	__m256 s = _mm256_and_ps(_mm256_cmp_ps(_mm256_and_ps(h, absm), vg, _CMP_GE_OQ),
				 _mm256_cmp_ps(g, _mm256_setzero_ps(), _CMP_NEQ_OQ));

	return (unsigned)_mm256_movemask_ps(s);
}

/* Appends the lanes of @m: indices at + lane, and G. */
AVX2 static inline size_t ada_put8(uint32_t *idx, float *gv, unsigned m, size_t at, __m256 g)
{
	__m256i pm = perm_of(m);
	__m256i vi = _mm256_add_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
				      _mm256_set1_epi32((int)at));

	_mm256_storeu_si256((__m256i *)idx, _mm256_permutevar8x32_epi32(vi, pm));
	_mm256_storeu_ps(gv, _mm256_permutevar8x32_ps(g, pm));
	return pop8[m];
}

AVX2 static size_t ada_select_avx2(const float *x, float *r, int store, size_t n, size_t bin,
				   uint32_t *idx, float *gv)
{
	const __m256 absm = _mm256_castsi256_ps(_mm256_set1_epi32((int)ABSM));
	size_t c = 0;

	for (size_t b0 = 0; b0 < n; b0 += bin) {
		size_t len = n - b0 < bin ? n - b0 : bin, j;
		const float *xb = x + b0;
		float *rb = r ? r + b0 : NULL;
		__m256 vmax = _mm256_setzero_ps();

		for (j = 0; j + 8 <= len; j += 8)
			vmax = _mm256_max_ps(vmax, _mm256_and_ps(san8(p8(xb, rb, j)), absm));
		if (j < len) {
			__m256 g = g8m(xb + j, rb ? rb + j : NULL, lanes8(len - j));

			vmax = _mm256_max_ps(vmax, _mm256_and_ps(g, absm));
		}
		const __m256 vg = _mm256_set1_ps(hmax8(vmax));

		/* gmax == 0: nothing is selected (G == 0 never is), but G is still stored. */
		for (j = 0; j + 8 <= len; j += 8) {
			__m256 g = san8(p8(xb, rb, j));
			unsigned m = ada_mask8(g, _mm256_loadu_ps(xb + j), vg);

			if (store)
				_mm256_storeu_ps(rb + j, g);
			c += ada_put8(idx + c, gv + c, m, b0 + j, g); /* no branch on m (random) */
		}
		if (j < len) {
			__m256i lm = lanes8(len - j);
			__m256 g = g8m(xb + j, rb ? rb + j : NULL, lm);
			/* Lanes past the end load as 0: G == 0 is never selected. */
			unsigned m = ada_mask8(g, _mm256_maskload_ps(xb + j, lm), vg);

			if (store)
				_mm256_maskstore_ps(rb + j, lm, g);
			if (m)
				c += ada_put8(idx + c, gv + c, m, b0 + j, g);
		}
	}
	return c;
}

AVX2 static int finite_avx2(const void *v, size_t k)
{
	const unsigned char *p = v;
	const __m256i inf = _mm256_set1_epi32((int)INF_BITS);
	__m256i bad = _mm256_setzero_si256();
	size_t j = 0;

	for (; j + 8 <= k; j += 8) {
		__m256i u = _mm256_loadu_si256((const __m256i *)(p + 4 * j));

		bad = _mm256_or_si256(bad, _mm256_cmpeq_epi32(_mm256_and_si256(u, inf), inf));
	}
	return _mm256_testz_si256(bad, bad) && finite_scalar(p + 4 * j, k - j);
}

/* No scatter in AVX2: the products go 8 at a time, the adds one by one. */
AVX2 static void scatter_acc_avx2(float *acc, const uint32_t *idx, const float *v, float w,
				  size_t k)
{
	const __m256 vw = _mm256_set1_ps(w);
	_Alignas(32) float pr[8];
	size_t j = 0;

	for (; j + 8 <= k; j += 8) {
		__m256 p = _mm256_mul_ps(_mm256_loadu_ps(v + j), vw);

		NOFUSE_V(p);
		_mm256_store_ps(pr, p);
		for (size_t l = 0; l < 8; l++)
			acc[idx[j + l]] = acc[idx[j + l]] + pr[l];
	}
	scatter_acc_tail(acc, idx, v, w, j, k);
}

/* ---- AVX-512 (F, BW, VL, DQ as dispatch.c checks) ---- */

#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))

AVX512 static inline __mmask16 lanes16(size_t k)
{
	return k >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << k) - 1u);
}

AVX512 static inline __m512 san16(__m512 p)
{
	__m512i k = _mm512_and_si512(_mm512_castps_si512(p), _mm512_set1_epi32((int)ABSM));

	return _mm512_maskz_mov_ps(_mm512_cmplt_epu32_mask(k, _mm512_set1_epi32((int)INF_BITS)), p);
}

/* p = a (+ b) on the lanes of @lm (others 0), non-finite -> +0. */
AVX512 static inline __m512 p16m(const float *a, const float *b, __mmask16 lm)
{
	__m512 p = _mm512_maskz_loadu_ps(lm, a);

	if (b)
		p = _mm512_add_ps(p, _mm512_maskz_loadu_ps(lm, b));
	return san16(p);
}

AVX512 static inline __m512 p16(const float *a, const float *b)
{
	__m512 p = _mm512_loadu_ps(a);

	if (b)
		p = _mm512_add_ps(p, _mm512_loadu_ps(b));
	return san16(p);
}

AVX512 static inline __m512i key16(__m512 p)
{
	return _mm512_and_si512(_mm512_castps_si512(p), _mm512_set1_epi32((int)ABSM));
}

AVX512 static void prep_avx512(const float *a, const float *b, float *out, size_t n, uint32_t *hist)
{
	_Alignas(64) uint32_t bk[16];
	size_t i = 0;

	for (; i + 16 <= n; i += 16) {
		__m512 p = p16(a + i, b ? b + i : NULL);

		if (out)
			_mm512_storeu_ps(out + i, p);
		if (hist) {
			_mm512_store_si512(bk, _mm512_srli_epi32(key16(p), MP_SP_B1_SHIFT));
			hist4(hist, bk, 16);
		}
	}
	prep_scalar(a + i, b ? b + i : NULL, out ? out + i : NULL, n - i, hist);
}

AVX512 static void hist_sub_avx512(const float *a, const float *b, size_t n, unsigned shift,
				   uint32_t prefix, uint32_t *hist)
{
	const __m512i vp = _mm512_set1_epi32((int)prefix);
	const __m128i sh = _mm_cvtsi32_si128((int)(shift + 10));
	_Alignas(64) uint32_t kb[16];
	size_t i = 0;

	for (; i + 16 <= n; i += 16) {
		__m512i k = key16(p16(a + i, b ? b + i : NULL));
		unsigned m = _mm512_cmpeq_epi32_mask(_mm512_srl_epi32(k, sh), vp);

		if (m) {
			_mm512_store_si512(kb, k);
			hist_sub_lanes(hist, kb, m, shift);
		}
	}
	hist_sub_tail(a, b, i, n, shift, prefix, hist);
}

AVX512 static size_t sift_avx512(const float *a, const float *b, float *out, size_t n, uint32_t lo,
				 size_t cap, uint32_t *idx, float *val)
{
	const __m512i vl = _mm512_set1_epi32((int)lo);
	const __m512i v16 = _mm512_set1_epi32(16);
	__m512i vi = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
	size_t i = 0, c = 0;

	for (; i + 16 <= n; i += 16, vi = _mm512_add_epi32(vi, v16)) {
		__m512 p = p16(a + i, b ? b + i : NULL);
		__m512i k = key16(p);
		__mmask16 m = _mm512_cmpge_epu32_mask(k, vl);

		if (out)
			_mm512_storeu_ps(out + i, p);
		/*
		 * Stored whether or not any lane is in: which vectors hold one is
		 * random, a branch on it would mispredict. Once an entry did not
		 * fit, c stays > cap, so later ones cannot fit either.
		 */
		unsigned nm = pop16(m);

		if (c + nm <= cap) {
			_mm512_storeu_si512(idx + c, _mm512_maskz_compress_epi32(m, vi));
			_mm512_storeu_ps(val + c, _mm512_maskz_compress_ps(m, p));
		}
		c += nm;
	}
	return sift_tail(a, b, out, i, n, lo, cap, idx, val, c);
}

AVX512 static inline size_t select16(__m512i k, __mmask16 lm, __m512i vt, __m512i vi, size_t *eq,
				     uint32_t *out)
{
	unsigned m = _mm512_mask_cmpgt_epu32_mask(lm, k, vt);
	unsigned e = _mm512_mask_cmpeq_epu32_mask(lm, k, vt);

	if (e)
		m |= take_eq(e, eq);
	if (!m)
		return 0;
	_mm512_storeu_si512(out, _mm512_maskz_compress_epi32((__mmask16)m, vi));
	return pop16(m);
}

AVX512 static size_t select_avx512(const float *a, const float *b, size_t n, uint32_t t, size_t eq,
				   uint32_t *idx)
{
	const __m512i vt = _mm512_set1_epi32((int)t);
	const __m512i v16 = _mm512_set1_epi32(16);
	__m512i vi = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
	size_t i = 0, c = 0;

	for (; i + 16 <= n; i += 16, vi = _mm512_add_epi32(vi, v16))
		c += select16(key16(p16(a + i, b ? b + i : NULL)), 0xffff, vt, vi, &eq, idx + c);
	if (i < n) {
		__mmask16 lm = lanes16(n - i);

		c += select16(key16(p16m(a + i, b ? b + i : NULL, lm)), lm, vt, vi, &eq, idx + c);
	}
	return c;
}

/*
 * The selection mask of 16 elements (of @lm): G != 0 and |G + x| >= gmax,
 * as float compares: a NaN H (inf - inf, only where G is 0, which is out
 * anyway) compares false as in the scalar code; integer compares would call
 * it large.
 */
AVX512 static inline __mmask16 ada_mask16(__mmask16 lm, __m512 g, __m512 x, __m512 vg)
{
	__m512 h = _mm512_add_ps(g, x);
	__m512 ah = _mm512_castsi512_ps(key16(h));
	__mmask16 m = _mm512_mask_cmp_ps_mask(lm, ah, vg, _CMP_GE_OQ);

	return _mm512_mask_cmp_ps_mask(m, g, _mm512_setzero_ps(), _CMP_NEQ_OQ);
}

/* Appends the lanes of @m: indices at + lane, and G. */
AVX512 static inline size_t ada_put16(uint32_t *idx, float *gv, __mmask16 m, size_t at, __m512 g)
{
	const __m512i iota =
		_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
	__m512i vi = _mm512_add_epi32(iota, _mm512_set1_epi32((int)at));

	_mm512_storeu_si512(idx, _mm512_maskz_compress_epi32(m, vi));
	_mm512_storeu_ps(gv, _mm512_maskz_compress_ps(m, g));
	return pop16(m);
}

AVX512 static size_t ada_select_avx512(const float *x, float *r, int store, size_t n, size_t bin,
				       uint32_t *idx, float *gv)
{
	size_t c = 0;

	for (size_t b0 = 0; b0 < n; b0 += bin) {
		size_t len = n - b0 < bin ? n - b0 : bin, j;
		const float *xb = x + b0;
		float *rb = r ? r + b0 : NULL;
		/* Magnitudes compare as integers: the max of the bit patterns is the max. */
		__m512i vmax = _mm512_setzero_si512();

		for (j = 0; j + 16 <= len; j += 16)
			vmax = _mm512_max_epu32(vmax, key16(p16(xb + j, rb ? rb + j : NULL)));
		if (j < len)
			vmax = _mm512_max_epu32(
				vmax, key16(p16m(xb + j, rb ? rb + j : NULL, lanes16(len - j))));
		const __m512 vg =
			_mm512_castsi512_ps(_mm512_set1_epi32((int)_mm512_reduce_max_epu32(vmax)));

		/*
		 * G again (recomputed from the cached bin, cheaper than storing it
		 * on the first pass and loading it back), stored if asked.
		 * gmax == 0: nothing is selected (G == 0 never is).
		 */
		for (j = 0; j + 16 <= len; j += 16) {
			__m512 g = p16(xb + j, rb ? rb + j : NULL);
			__mmask16 m = ada_mask16(0xffff, g, _mm512_loadu_ps(xb + j), vg);

			if (store)
				_mm512_storeu_ps(rb + j, g);
			c += ada_put16(idx + c, gv + c, m, b0 + j, g); /* no branch on m (random) */
		}
		if (j < len) {
			__mmask16 lm = lanes16(len - j);
			__m512 g = p16m(xb + j, rb ? rb + j : NULL, lm);
			__mmask16 m = ada_mask16(lm, g, _mm512_maskz_loadu_ps(lm, xb + j), vg);

			if (store)
				_mm512_mask_storeu_ps(rb + j, lm, g);
			if (m)
				c += ada_put16(idx + c, gv + c, m, b0 + j, g);
		}
	}
	return c;
}

AVX512 static int finite_avx512(const void *v, size_t k)
{
	const unsigned char *p = v;
	const __m512i inf = _mm512_set1_epi32((int)INF_BITS);
	__mmask16 bad = 0;

	for (size_t j = 0; j < k; j += 16) {
		__mmask16 lm = lanes16(k - j);
		__m512i u = _mm512_maskz_loadu_epi32(lm, p + 4 * j);

		bad |= _mm512_mask_cmpeq_epi32_mask(lm, _mm512_and_si512(u, inf), inf);
	}
	return !bad;
}

/* Gather, add, scatter 8 at a time; 64-bit lane indices, as an index may pass 2^31. */
AVX512 static void scatter_acc_avx512(float *acc, const uint32_t *idx, const float *v, float w,
				      size_t k)
{
	const __m256 vw = _mm256_set1_ps(w);
	size_t j = 0;

	for (; j + 8 <= k; j += 8) {
		__m512i vi = _mm512_cvtepu32_epi64(_mm256_loadu_si256((const __m256i *)(idx + j)));
		__m256 p = _mm256_mul_ps(_mm256_loadu_ps(v + j), vw);

		NOFUSE_V(p);
		__m256 s = _mm256_add_ps(_mm512_i64gather_ps(vi, acc, 4), p);

		_mm512_i64scatter_ps(acc, vi, s, 4);
	}
	scatter_acc_tail(acc, idx, v, w, j, k);
}

#endif /* MP_K_X86 */

static const struct mp_sparse_kernels ktab[] = {
	[MP_K_SCALAR] = {
		.prep = prep_scalar,
		.hist_sub = hist_sub_scalar,
		.sift = sift_scalar,
		.select = select_scalar,
		.ada_select = ada_select_scalar,
		.finite = finite_scalar,
		.scatter_acc = scatter_acc_scalar,
	},
#ifdef MP_K_X86
	[MP_K_AVX2] = {
		.prep = prep_avx2,
		.hist_sub = hist_sub_avx2,
		.sift = sift_avx2,
		.select = select_avx2,
		.ada_select = ada_select_avx2,
		.finite = finite_avx2,
		.scatter_acc = scatter_acc_avx2,
	},
	[MP_K_AVX512] = {
		.prep = prep_avx512,
		.hist_sub = hist_sub_avx512,
		.sift = sift_avx512,
		.select = select_avx512,
		.ada_select = ada_select_avx512,
		.finite = finite_avx512,
		.scatter_acc = scatter_acc_avx512,
	},
#endif
};

const struct mp_sparse_kernels *mp_sparse_kernels(void)
{
	int l = mp_k_level();

	if (l < 0 || (size_t)l >= sizeof(ktab) / sizeof(ktab[0]))
		l = MP_K_SCALAR;
	return &ktab[l];
}

/* ---- top-k selection (shared by all variants) ---- */

/* The one-pass shortcut is tried from this many elements on, for k <= n / 8. */
#define FAST_MIN 16384u
/* Sample size: n / 32, at most this (it fits where the level-1 histograms go). */
#define SAMPLE_MAX (MP_SP_HIST_BYTES / sizeof(float))

/*
 * The bucket, scanning from the top, in which the @need-th largest lies;
 * *need becomes its rank within that bucket (1-based).
 */
static uint32_t pick(const uint32_t *h, uint32_t nb, size_t *need)
{
	for (uint32_t b = nb; b-- > 0;) {
		if (h[b] >= *need)
			return b;
		*need -= h[b];
	}
	return 0; /* not reached: callers ask for a rank within the total */
}

/*
 * The key of rank *need (1 = largest) among the keys of a list of values;
 * *need becomes its rank among the keys equal to it. Radix select, 11 + 10
 * + 10 bits.
 */
static uint32_t list_select(const float *v, size_t n, size_t *need)
{
	uint32_t h[MP_SP_NB1], b1, b2, b3;

	memset(h, 0, sizeof(h));
	for (size_t j = 0; j < n; j++)
		h[(f32_bits(v[j]) & ABSM) >> 20]++;
	b1 = pick(h, MP_SP_NB1, need);
	memset(h, 0, 1024 * sizeof(uint32_t));
	for (size_t j = 0; j < n; j++) {
		uint32_t k = f32_bits(v[j]) & ABSM;

		if (k >> 20 == b1)
			h[(k >> 10) & 1023u]++;
	}
	b2 = pick(h, 1024, need);
	memset(h, 0, 1024 * sizeof(uint32_t));
	for (size_t j = 0; j < n; j++) {
		uint32_t k = f32_bits(v[j]) & ABSM;

		if (k >> 10 == (b1 << 10 | b2))
			h[k & 1023u]++;
	}
	b3 = pick(h, 1024, need);
	return b1 << 20 | b2 << 10 | b3;
}

/*
 * Entries of the index and value lists: k plus twice the sample's margin
 * (see mp_sparse_topk), computed with q >= the sample stride, so that the
 * result only grows with n and k (scratch sized for a chunk then fits every
 * shorter one).
 */
static size_t list_cap(size_t n, size_t k)
{
	double q = (double)n / SAMPLE_MAX > 33.0 ? (double)n / SAMPLE_MAX : 33.0;
	double extra = ceil(8.0 * sqrt((double)k * q) + 16.0 * q);
	size_t c = k + (extra < (double)n ? (size_t)extra : n);

	return c < n ? c : n;
}

static size_t round64(size_t b)
{
	return (b + 63) & ~(size_t)63;
}

size_t mp_sparse_topk_scratch(size_t n, size_t k)
{
	return MP_SP_HIST_BYTES + 2 * round64((list_cap(n, k) + MP_SP_SLACK) * sizeof(uint32_t));
}

/* Position of sample @s: one per stride, at a scrambled offset (no aliasing with rows). */
static inline size_t sample_at(size_t s, size_t stride)
{
	return s * stride + (size_t)(((uint32_t)s * 0x9e3779b1u) >> 7) % stride;
}

uint32_t *mp_sparse_topk(const struct mp_sparse_kernels *kt, const float *src, const float *res,
			 float *out, size_t n, size_t k, void *scratch, float **valp)
{
	uint32_t *h = scratch;
	size_t cap = list_cap(n, k);
	uint32_t *idx = (uint32_t *)((unsigned char *)scratch + MP_SP_HIST_BYTES);
	float *val =
		(float *)(idx + round64((cap + MP_SP_SLACK) * sizeof(uint32_t)) / sizeof(uint32_t));
	size_t need;

	*valp = val;
	if (k == n) { /* everything goes */
		kt->prep(src, res, val, n, NULL);
		if (out)
			memcpy(out, val, n * sizeof(float));
		for (size_t i = 0; i < n; i++)
			idx[i] = (uint32_t)i;
		return idx;
	}
	if (n >= FAST_MIN && k <= n / 8) {
		/* The sample sits where the level-1 histograms would (8192 values fit). */
		float *smp = scratch;
		size_t ns = n / 32 < SAMPLE_MAX ? n / 32 : SAMPLE_MAX, stride = n / ns;
		/*
		 * About r = k * ns / n sample keys are >= t. Going r_lo = r +
		 * 4 sqrt(r) + 4 deep in the sample puts lo below t unless the
		 * sample holds four standard deviations more large keys than
		 * expected; the list then holds about k + (4 sqrt(r) + 4) * stride
		 * entries.
		 */
		double r = (double)k * (double)ns / (double)n;
		size_t rlo = (size_t)ceil(r + 4.0 * sqrt(r) + 4.0);

		if (rlo <= ns) {
			for (size_t s = 0; s < ns; s++)
				smp[s] = p_at(src, res, sample_at(s, stride));
			need = rlo;
			uint32_t lo = list_select(smp, ns, &need);
			/* lo == 0 (mostly zeros, say) would list all n: not worth a pass. */
			size_t c = lo ? kt->sift(src, res, out, n, lo, cap, idx, val) : SIZE_MAX;

			if (out && lo) { /* p is stored: read it from there now */
				src = out;
				res = NULL;
				out = NULL;
			}
			if (c >= k && c <= cap) {
				size_t m = 0;

				need = k;
				uint32_t t = list_select(val, c, &need);

				/* The lists hold every key >= t, in index order. */
				for (size_t j = 0; j < c; j++) {
					uint32_t kj = f32_bits(val[j]) & ABSM;

					if (kj > t || (kj == t && need)) {
						need -= kj == t;
						idx[m] = idx[j];
						val[m++] = val[j];
					}
				}
				return idx;
			}
		}
	}
	/* Exact radix select over all n: level 1 counts while p is formed (and stored). */
	need = k;
	memset(h, 0, MP_SP_HIST_BYTES);
	kt->prep(src, res, out, n, h);
	if (out) {
		src = out;
		res = NULL;
	}
	for (uint32_t s = 1; s < MP_SP_NSUB; s++)
		for (uint32_t b = 0; b < MP_SP_NB1; b++)
			h[b] += h[s * MP_SP_NB1 + b];
	uint32_t b1 = pick(h, MP_SP_NB1, &need);

	memset(h, 0, 1024 * sizeof(uint32_t));
	kt->hist_sub(src, res, n, 10, b1, h);
	uint32_t b2 = pick(h, 1024, &need);

	memset(h, 0, 1024 * sizeof(uint32_t));
	kt->hist_sub(src, res, n, 0, b1 << 10 | b2, h);
	uint32_t b3 = pick(h, 1024, &need);

	kt->select(src, res, n, b1 << 20 | b2 << 10 | b3, need, idx);
	for (size_t j = 0; j < k; j++)
		val[j] = p_at(src, res, idx[j]);
	return idx;
}
