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

/*
 * ---- Vector kernels: sparse_vec.h, once per width; these are the kv
 * operations it needs beyond kloop.h's ----
 */

/* How many lanes the mask @m (kv_bits) holds. */
static inline unsigned kv8_pop(unsigned m)
{
	return pop8[m];
}

static inline unsigned kv16_pop(unsigned m)
{
	return pop16(m);
}

KL_AVX2 static inline __m256i perm_of(unsigned m)
{
	__m256i sh = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
	__m256i pm = _mm256_srlv_epi32(_mm256_set1_epi32((int)perm8[m]), sh);

	return _mm256_and_si256(pm, _mm256_set1_epi32(15));
}

/*
 * The lanes of @v in the mask @m, packed, at @out: a whole vector is
 * written (MP_SP_SLACK). AVX2 permutes by the mask's entry in perm8;
 * AVX-512 compresses in a register (see the top of the file).
 */
KL_AVX2 static inline void kv8_compress_i(uint32_t *out, unsigned m, __m256i v)
{
	_mm256_storeu_si256((__m256i *)out, _mm256_permutevar8x32_epi32(v, perm_of(m)));
}

KL_AVX2 static inline void kv8_compress_f(float *out, unsigned m, __m256 v)
{
	_mm256_storeu_ps(out, _mm256_permutevar8x32_ps(v, perm_of(m)));
}

KV_TARGET_16 static inline void kv16_compress_i(uint32_t *out, unsigned m, __m512i v)
{
	_mm512_storeu_si512(out, _mm512_maskz_compress_epi32((__mmask16)m, v));
}

KV_TARGET_16 static inline void kv16_compress_f(float *out, unsigned m, __m512 v)
{
	_mm512_storeu_ps(out, _mm512_maskz_compress_ps((__mmask16)m, v));
}

#define kv_pop kv_(pop)
#define kv_compress_i kv_(compress_i)
#define kv_compress_f kv_(compress_f)

/* No FMA in either target: nothing there multiplies. */
#define KV_W 8
#include "sparse_vec.h"
#undef KV_W
#define KV_W 16
#include "sparse_vec.h"
#undef KV_W

/*
 * scatter_acc, the one kernel that is not the same algorithm at both
 * widths: AVX2 has no scatter, so the products go 8 at a time and the adds
 * one by one.
 */
KL_AVX2 static void scatter_acc_avx2(float *acc, const uint32_t *idx, const float *v, float w,
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

/* Gather, add, scatter 8 at a time; 64-bit lane indices, as an index may pass 2^31. */
KV_TARGET_16 static void scatter_acc_avx512(float *acc, const uint32_t *idx, const float *v, float w,
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
