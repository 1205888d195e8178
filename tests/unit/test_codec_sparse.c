/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The sparse codecs, topk and adacomp (src/codec_sparse.c, kernels/cpu/sparse.c):
 * selection against a sorting reference, error-feedback conservation,
 * AdaComp's compression ratio on synthetic gradients, bit-identity of the
 * CPU variants, malformed payloads, -ENOSPC and decode_acc.
 *
 * Payloads are read back here by a parser of our own, written from the wire
 * layout (doc: codec_spec), so the tests check the format, not just that
 * decode undoes encode.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <moshpit/moshpit.h>
#include "codec.h"
#include "mp_kernels.h"
#include "kernels/cpu/sparse.h"

static const char *const variants[] = {"scalar", "avx2", "avx512"};
#define NVAR (sizeof(variants) / sizeof(variants[0]))

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint32_t rnd32(void)
{
	rng_state ^= rng_state >> 12;
	rng_state ^= rng_state << 25;
	rng_state ^= rng_state >> 27;
	return (uint32_t)((rng_state * 0x2545f4914f6cdd1dull) >> 32);
}

/* Uniform in (0, 1]. */
static double u01(void)
{
	return ((double)rnd32() + 1.0) / 4294967296.0;
}

/* Uniform in [-r, r). */
static float rndf(float r)
{
	return (float)(((double)rnd32() / 4294967296.0 * 2.0 - 1.0) * r);
}

static double gauss(void)
{
	return sqrt(-2.0 * log(u01())) * cos(6.283185307179586 * u01());
}

static float bits_f(uint32_t u)
{
	float f;

	memcpy(&f, &u, 4);
	return f;
}

static uint32_t f_bits(float f)
{
	uint32_t u;

	memcpy(&u, &f, 4);
	return u;
}

static float san(float v)
{
	return isfinite(v) ? v : 0.0f;
}

static void *scratch_for(const struct mp_codec_ops *c, const struct mp_codec_params *p, size_t n)
{
	size_t sz = c->scratch_size(p, n);
	void *s = aligned_alloc(64, sz ? (sz + 63) & ~(size_t)63 : 64);

	assert_non_null(s);
	/* Garbage, so nothing can rely on zeroed scratch. */
	memset(s, 0xa5, sz);
	return s;
}

static struct mp_codec_params params(float ratio, uint32_t bin)
{
	struct mp_codec_params p;

	mp_codec_params_default(&p);
	p.topk_ratio = ratio;
	p.bin = bin;
	return p;
}

/*
 * Test data of a few kinds. 0: uniform; 1: small integers (many ties, zeros,
 * negatives); 2: mixed scales, -0, subnormals, and NaN / +-inf sprinkled in;
 * 3: Gaussian; 4: 99.5% zeros (an embedding's gradient), the rest Gaussian.
 */
#define NKIND 5
static void fill(float *x, size_t n, int kind)
{
	for (size_t i = 0; i < n; i++) {
		switch (kind) {
		case 0:
			x[i] = rndf(1.0f);
			break;
		case 1:
			x[i] = (float)((int)(rnd32() % 7) - 3);
			break;
		case 2: {
			uint32_t r = rnd32() % 16;

			if (r == 0)
				x[i] = -0.0f;
			else if (r == 1)
				x[i] = bits_f(rnd32() & 0x807fffffu); /* subnormal or zero */
			else if (r == 2)
				x[i] = (rnd32() & 1) ? NAN : ((rnd32() & 1) ? INFINITY : -INFINITY);
			else if (r == 3)
				x[i] = 3.0e38f * rndf(1.0f); /* sums of two may overflow */
			else
				x[i] = rndf(1.0f) * exp2f((float)((int)(rnd32() % 40) - 20));
			break;
		}
		case 4:
			x[i] = rnd32() % 200 ? 0.0f : (float)gauss();
			break;
		default:
			x[i] = (float)gauss();
			break;
		}
	}
}

/* ---- independent payload readers ---- */

static size_t get_varint(const uint8_t *p, const uint8_t *end, uint32_t *v)
{
	uint64_t r = 0;

	for (size_t i = 0; p + i < end && i < 5; i++) {
		r |= (uint64_t)(p[i] & 0x7f) << (7 * i);
		if (!(p[i] & 0x80)) {
			*v = (uint32_t)r;
			return i + 1;
		}
	}
	fail_msg("bad varint in a payload the encoder wrote");
	return 0;
}

/* Reads @k gap-coded indices from [p, end), which they must fill. */
static void read_indices(const uint8_t *p, const uint8_t *end, size_t k, uint32_t *idx)
{
	uint64_t next = 0;

	for (size_t j = 0; j < k; j++) {
		uint32_t d = 0;

		p += get_varint(p, end, &d);
		idx[j] = (uint32_t)(next + d);
		next += (uint64_t)d + 1;
	}
	assert_ptr_equal(p, end);
}

/* topk payload -> K, values, indices. */
static size_t read_topk(const uint8_t *s, size_t len, float *val, uint32_t *idx)
{
	uint32_t k;

	assert_true(len >= 4);
	memcpy(&k, s, 4);
	assert_true(len >= 4 + 4 * (size_t)k);
	memcpy(val, s + 4, 4 * (size_t)k);
	read_indices(s + 4 + 4 * (size_t)k, s + len, k, idx);
	return k;
}

/* adacomp payload -> nsel, scale, signs (1 = negative), indices. */
static size_t read_ada(const uint8_t *s, size_t len, uint32_t *bin, float *scale, uint8_t *neg,
		       uint32_t *idx)
{
	uint32_t n;

	assert_true(len >= 12);
	memcpy(bin, s, 4);
	memcpy(scale, s + 4, 4);
	memcpy(&n, s + 8, 4);
	size_t sb = ((size_t)n + 7) / 8;

	assert_true(len >= 12 + sb);
	for (size_t j = 0; j < n; j++)
		neg[j] = (s[12 + j / 8] >> (j % 8)) & 1;
	read_indices(s + 12 + sb, s + len, n, idx);
	return n;
}

/* ---- registry and sizes ---- */

static void test_registry(void **state)
{
	(void)state;
	assert_ptr_equal(mp_codec_by_id(MP_CODEC_TOPK), &mp_codec_topk);
	assert_ptr_equal(mp_codec_by_id(MP_CODEC_ADACOMP), &mp_codec_adacomp);
	assert_ptr_equal(mp_codec_by_name("topk"), &mp_codec_topk);
	assert_ptr_equal(mp_codec_by_name("AdaComp"), &mp_codec_adacomp);
	assert_int_equal(mp_codec_topk.id, 5);
	assert_int_equal(mp_codec_adacomp.id, 6);
	assert_int_equal(mp_codec_topk.flags, MP_CODEC_F_LOSSY | MP_CODEC_F_SPARSE);
	assert_int_equal(mp_codec_adacomp.flags, MP_CODEC_F_LOSSY | MP_CODEC_F_SPARSE);

	struct mp_codec_params p = params(0.01f, 500);

	/* K = 10 of 1000: 4 + 40 + 10 one-byte gaps, plus one byte per gap of 128 or more. */
	assert_int_equal(mp_codec_topk.max_encoded(&p, 1000), 4 + 40 + 10 + 7);
	assert_int_equal(mp_codec_topk.max_encoded(&p, 0), 4);
	assert_int_equal(mp_codec_adacomp.max_encoded(&p, 0), 12);
	assert_int_equal(mp_codec_adacomp.max_encoded(&p, 1000), 12 + 125 + 1000);
	assert_int_equal(mp_codec_adacomp.max_encoded(&p, 1001), 12 + 126 + 1001);
	/* Unusable params: the bound for the largest ratio. */
	p.topk_ratio = 0.0f;
	assert_int_equal(mp_codec_topk.max_encoded(&p, 100), 4 + 500);
	assert_int_equal(mp_codec_topk.max_encoded(NULL, 100), 4 + 500);
}

static void test_bad_params(void **state)
{
	enum { N = 100 };
	float x[N], r[N];
	uint8_t buf[2048];
	size_t len;
	struct mp_codec_params p = params(0.1f, 50);
	void *s = scratch_for(&mp_codec_topk, &p, N);
	const float bad_ratio[] = {0.0f, -0.1f, 1.5f, NAN};
	const uint32_t bad_bin[] = {0, (1u << 24) + 1};

	(void)state;
	fill(x, N, 0);
	memset(r, 0, sizeof(r));
	for (size_t i = 0; i < sizeof(bad_ratio) / sizeof(bad_ratio[0]); i++) {
		p.topk_ratio = bad_ratio[i];
		assert_int_equal(mp_codec_topk.encode(&p, x, r, N, buf, sizeof(buf), &len, s),
				 -EINVAL);
	}
	p.topk_ratio = 0.1f;
	for (size_t i = 0; i < sizeof(bad_bin) / sizeof(bad_bin[0]); i++) {
		p.bin = bad_bin[i];
		assert_int_equal(mp_codec_adacomp.encode(&p, x, r, N, buf, sizeof(buf), &len, s),
				 -EINVAL);
	}
	assert_int_equal(mp_codec_topk.encode(NULL, x, r, N, buf, sizeof(buf), &len, s), -EINVAL);
	assert_int_equal(mp_codec_adacomp.encode(NULL, x, r, N, buf, sizeof(buf), &len, s),
			 -EINVAL);
	p.bin = 1u << 24; /* largest valid bin */
	assert_int_equal(mp_codec_adacomp.encode(&p, x, r, N, buf, sizeof(buf), &len, s), 0);
	free(s);
}

/*
 * max_encoded is the exact worst case: a dynamic program over gap sums finds
 * the most varint bytes K indices below n can take, and an input built to
 * space the selected elements that way hits max_encoded to the byte.
 */
static void test_max_encoded_exact(void **state)
{
	enum { NMAX = 700 };
	static int best[NMAX + 1][NMAX + 1]; /* best[k][b]: most bytes of k gaps summing to <= b */

	(void)state;
	/*
	 * A gap only needs to be tried at the lengths' thresholds (0, 128; the
	 * next is past NMAX): lowering a gap to the threshold below it keeps its
	 * length and leaves more budget, and best[][] grows with the budget.
	 */
	for (int b = 0; b <= NMAX; b++)
		best[0][b] = 0;
	for (int k = 1; k <= NMAX; k++)
		for (int b = 0; b <= NMAX; b++) {
			int m = best[k - 1][b] + 1;

			if (b >= 128 && best[k - 1][b - 128] + 2 > m)
				m = best[k - 1][b - 128] + 2;
			best[k][b] = m;
		}
	const size_t ns[] = {1, 2, 127, 128, 129, 130, 255, 256, 300, 513, 700};

	for (size_t a = 0; a < sizeof(ns) / sizeof(ns[0]); a++) {
		size_t n = ns[a];

		for (size_t k = 1; k <= n; k++) {
			float ratio = (float)k / (float)n;
			struct mp_codec_params p = params(ratio, 50);
			size_t kk = (size_t)llround((double)ratio * (double)n);

			if (kk != k)
				continue;
			assert_int_equal(mp_codec_topk.max_encoded(&p, n),
					 4 + 4 * k + (size_t)best[k][n - k]);
		}
	}
	/* adacomp: the worst nsel is nsel = count. */
	for (size_t n = 1; n <= NMAX; n += 37) {
		size_t m = 0;

		for (size_t k = 0; k <= n; k++) {
			size_t v = 12 + (k + 7) / 8 + (size_t)best[k][n - k];

			if (v > m)
				m = v;
		}
		assert_int_equal(mp_codec_adacomp.max_encoded(NULL, n), m);
	}

	/*
	 * Hit it: n = 100000, K = 100. The gaps may sum to 99900: all 100 can be
	 * two bytes (gap 128, 12800 in all), and the 87100 left raise five of them
	 * to three bytes (gap 16384): 4 + 400 + 100 + 100 + 5 bytes.
	 */
	enum { N = 100000 };
	float *x = calloc(N, sizeof(float));
	struct mp_codec_params p = params(0.001f, 50);
	size_t cap = mp_codec_topk.max_encoded(&p, N), len, at = 0;
	uint8_t *buf = malloc(cap);
	void *s = scratch_for(&mp_codec_topk, &p, N);

	assert_non_null(x);
	assert_non_null(buf);
	assert_int_equal(cap, 4 + 400 + 100 + 100 + 5);
	for (size_t j = 0; j < 100; j++) {
		at += (j < 5 ? 16384 : 128) + (j > 0);
		x[at] = 1.0f + (float)j;
	}
	assert_int_equal(mp_codec_topk.encode(&p, x, NULL, N, buf, cap, &len, s), 0);
	assert_int_equal(len, cap);
	free(s);
	free(buf);
	free(x);
}

/* ---- (1) topk picks the true top-k ---- */

static const float *cmp_p;

/* By |p| descending, then index ascending. */
static int cmp_mag(const void *a, const void *b)
{
	uint32_t i = *(const uint32_t *)a, j = *(const uint32_t *)b;
	float x = fabsf(cmp_p[i]), y = fabsf(cmp_p[j]);

	if (x != y)
		return x > y ? -1 : 1;
	return i < j ? -1 : (i > j);
}

static int cmp_u32(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;

	return x < y ? -1 : (x > y);
}

static void check_topk_one(size_t n, float ratio, int kind, int with_res)
{
	struct mp_codec_params prm = params(ratio, 50);
	float *x = malloc(n * sizeof(float)), *r = malloc(n * sizeof(float));
	float *p = malloc(n * sizeof(float)), *val = malloc(n * sizeof(float));
	uint32_t *idx = malloc(n * sizeof(uint32_t)), *ord = malloc(n * sizeof(uint32_t));
	size_t cap = mp_codec_topk.max_encoded(&prm, n), len = 0;
	uint8_t *buf = malloc(cap);
	void *s = scratch_for(&mp_codec_topk, &prm, n);

	assert_non_null(x);
	assert_non_null(r);
	assert_non_null(p);
	assert_non_null(val);
	assert_non_null(idx);
	assert_non_null(ord);
	assert_non_null(buf);
	fill(x, n, kind);
	fill(r, n, kind == 2 ? 0 : kind); /* residues are finite in real use */
	for (size_t i = 0; i < n; i++) {
		p[i] = san(with_res ? x[i] + r[i] : x[i]);
		ord[i] = (uint32_t)i;
	}
	size_t k = (size_t)llround((double)ratio * (double)n);

	k = k < 1 ? 1 : (k > n ? n : k);
	cmp_p = p;
	qsort(ord, n, sizeof(uint32_t), cmp_mag);
	qsort(ord, k, sizeof(uint32_t), cmp_u32);

	assert_int_equal(mp_codec_topk.encode(&prm, x, with_res ? r : NULL, n, buf, cap, &len, s),
			 0);
	assert_int_equal(read_topk(buf, len, val, idx), k);
	for (size_t j = 0; j < k; j++) {
		if (idx[j] != ord[j])
			fail_msg("n %zu ratio %g kind %d: pick %zu is index %u, want %u", n,
				 (double)ratio, kind, j, idx[j], ord[j]);
		assert_int_equal(f_bits(val[j]), f_bits(p[idx[j]])); /* sent exactly */
	}
	if (with_res) {
		/* residue = p with the sent entries zeroed, bit for bit */
		for (size_t j = 0; j < k; j++)
			p[idx[j]] = 0.0f;
		assert_memory_equal(r, p, n * sizeof(float));
	}
	free(s);
	free(buf);
	free(ord);
	free(idx);
	free(val);
	free(p);
	free(r);
	free(x);
}

/* Forces variant @v for the reference tests; 0 if this CPU lacks it. */
static int use_variant(size_t v)
{
	int rc = mp_k_force(variants[v]);

	if (rc == -ENOTSUP)
		print_message("variant %s: not supported on this CPU, skipped\n", variants[v]);
	else
		assert_int_equal(rc, 0);
	return rc == 0;
}

static void test_topk_selection(void **state)
{
	const size_t ns[] = {1, 7, 1000, 65536 + 3};
	const float ratios[] = {0.001f, 0.01f, 0.1f, 0.37f, 1.0f};
	const char *orig = mp_k_variant();

	(void)state;
	for (size_t v = 0; v < NVAR; v++) {
		if (!use_variant(v))
			continue;
		for (size_t a = 0; a < sizeof(ns) / sizeof(ns[0]); a++)
			for (size_t b = 0; b < sizeof(ratios) / sizeof(ratios[0]); b++)
				for (int kind = 0; kind < NKIND; kind++)
					for (int res = 0; res < 2; res++)
						check_topk_one(ns[a], ratios[b], kind, res);
		/* Past 2^18 elements the sample stops growing (8192 keys). */
		for (int kind = 3; kind < NKIND; kind++) {
			check_topk_one(300007, 0.01f, kind, 1);
			check_topk_one(300007, 0.001f, kind, 0);
		}
	}
	assert_int_equal(mp_k_force(orig), 0);
	/* All equal: ties everywhere, the lowest indices go. */
	enum { N = 999 };
	float x[N], val[N];
	uint32_t idx[N];
	uint8_t buf[8192];
	size_t len;
	struct mp_codec_params p = params(0.1f, 50);
	void *s = scratch_for(&mp_codec_topk, &p, N);

	for (size_t i = 0; i < N; i++)
		x[i] = (i & 1) ? -2.5f : 2.5f;
	assert_int_equal(mp_codec_topk.encode(&p, x, NULL, N, buf, sizeof(buf), &len, s), 0);
	assert_int_equal(read_topk(buf, len, val, idx), 100);
	for (uint32_t j = 0; j < 100; j++) {
		assert_int_equal(idx[j], j);
		assert_true(val[j] == x[j]);
	}
	/* Empty input: K = 0. */
	assert_int_equal(mp_codec_topk.encode(&p, x, NULL, 0, buf, sizeof(buf), &len, s), 0);
	assert_int_equal(len, 4);
	assert_int_equal(mp_le_get32(buf), 0);
	free(s);
}

/* Non-finite inputs are dropped: never sent, never kept. */
static void test_nonfinite_dropped(void **state)
{
	enum { N = 64 };
	float x[N], r[N], out[N], val[N], scale;
	uint32_t idx[N], bin;
	uint8_t neg[N], buf[4096];
	size_t len;
	struct mp_codec_params p = params(0.5f, 8);
	void *s = scratch_for(&mp_codec_topk, &p, N);

	(void)state;
	for (size_t i = 0; i < N; i++) {
		x[i] = (i % 3 == 0) ? NAN : (i % 3 == 1 ? INFINITY : 1.0f);
		r[i] = (i % 5 == 0) ? 1.0f : 0.0f;
	}
	assert_int_equal(mp_codec_topk.encode(&p, x, r, N, buf, sizeof(buf), &len, s), 0);
	size_t k = read_topk(buf, len, val, idx);

	assert_int_equal(k, 32);
	for (size_t j = 0; j < k; j++)
		assert_true(isfinite(val[j]));
	for (size_t i = 0; i < N; i++)
		assert_true(isfinite(r[i]));
	/* The 21 finite p (1 or 2) all go; the other 11 picks are zeros. */
	assert_int_equal(mp_codec_topk.decode(buf, len, out, N), 0);
	for (size_t i = 0; i < N; i++) {
		assert_true(out[i] == (i % 3 == 2 ? (i % 5 == 0 ? 2.0f : 1.0f) : 0.0f));
		assert_true(r[i] == 0.0f);
	}

	for (size_t i = 0; i < N; i++)
		r[i] = (i % 5 == 0) ? 1.0f : 0.0f;
	assert_int_equal(mp_codec_adacomp.encode(&p, x, r, N, buf, sizeof(buf), &len, s), 0);
	size_t n = read_ada(buf, len, &bin, &scale, neg, idx);

	assert_true(isfinite(scale));
	for (size_t j = 0; j < n; j++)
		assert_int_equal(idx[j] % 3, 2);
	for (size_t i = 0; i < N; i++) {
		assert_true(isfinite(r[i]));
		if (i % 3 != 2)
			assert_true(r[i] == 0.0f);
	}
	free(s);
}

/* ---- AdaComp against a direct transcription of the rule ---- */

static void check_ada_one(size_t n, uint32_t binlen, int kind, int with_res)
{
	struct mp_codec_params prm = params(0.01f, binlen);
	float *x = malloc(n * sizeof(float)), *r = malloc(n * sizeof(float));
	float *g = malloc(n * sizeof(float)), *want = malloc(n * sizeof(float));
	uint32_t *idx = malloc((n + 1) * sizeof(uint32_t)),
		 *ref = malloc((n + 1) * sizeof(uint32_t));
	uint8_t *neg = malloc(n + 1);
	size_t cap = mp_codec_adacomp.max_encoded(&prm, n), len = 0, nref = 0;
	uint8_t *buf = malloc(cap);
	void *s = scratch_for(&mp_codec_adacomp, &prm, n);
	uint32_t bin;
	float scale;
	double sum = 0.0;

	assert_non_null(x);
	assert_non_null(r);
	assert_non_null(g);
	assert_non_null(want);
	assert_non_null(idx);
	assert_non_null(ref);
	assert_non_null(neg);
	assert_non_null(buf);
	fill(x, n, kind);
	fill(r, n, kind == 2 ? 0 : kind);
	for (size_t i = 0; i < n; i++)
		g[i] = san(with_res ? r[i] + x[i] : x[i]);
	for (size_t b0 = 0; b0 < n; b0 += binlen) {
		size_t e = b0 + binlen < n ? b0 + binlen : n;
		float gmax = 0.0f;

		for (size_t i = b0; i < e; i++)
			gmax = fmaxf(gmax, fabsf(g[i]));
		for (size_t i = b0; i < e; i++) {
			float h = g[i] + x[i];

			/* G == 0 has no sign to send: never selected (see codec_sparse.c). */
			if (gmax > 0.0f && g[i] != 0.0f && fabsf(h) >= gmax) {
				ref[nref++] = (uint32_t)i;
				sum += fabs((double)g[i]);
			}
		}
	}
	float sc = nref ? (float)(sum / (double)nref) : 0.0f;

	assert_int_equal(
		mp_codec_adacomp.encode(&prm, x, with_res ? r : NULL, n, buf, cap, &len, s), 0);
	assert_int_equal(read_ada(buf, len, &bin, &scale, neg, idx), nref);
	assert_int_equal(bin, binlen);
	assert_int_equal(f_bits(scale), f_bits(sc));
	memcpy(want, g, n * sizeof(float));
	for (size_t j = 0; j < nref; j++) {
		assert_int_equal(idx[j], ref[j]);
		assert_int_equal(neg[j], signbit(g[ref[j]]) ? 1 : 0);
		want[ref[j]] = g[ref[j]] - (neg[j] ? -sc : sc);
	}
	if (with_res)
		assert_memory_equal(r, want, n * sizeof(float));
	free(s);
	free(buf);
	free(neg);
	free(ref);
	free(idx);
	free(want);
	free(g);
	free(r);
	free(x);
}

static void test_adacomp_rule(void **state)
{
	const size_t ns[] = {1, 7, 50, 1000, 65536 + 3};
	const uint32_t bins[] = {1, 3, 16, 50, 500};
	const char *orig = mp_k_variant();

	(void)state;
	for (size_t v = 0; v < NVAR; v++) {
		if (!use_variant(v))
			continue;
		for (size_t a = 0; a < sizeof(ns) / sizeof(ns[0]); a++)
			for (size_t b = 0; b < sizeof(bins) / sizeof(bins[0]); b++)
				for (int kind = 0; kind < NKIND; kind++)
					for (int res = 0; res < 2; res++)
						check_ada_one(ns[a], bins[b], kind, res);
	}
	assert_int_equal(mp_k_force(orig), 0);
}

/* ---- (2) error feedback conserves what was fed in ---- */

/*
 * Over T steps, sum_t decode(payload_t) + residue_T must equal sum_t x_t up
 * to fp32 rounding. Per step and element the codec rounds at most:
 *   topk:    p = fl(x + r), then sent + r' = p exactly -> error <= u |p|
 *            with |p| = |sent| + |r'| (one of the two is 0);
 *   adacomp: G = fl(r + x) (error <= u |G|) and r' = fl(G - sent) (error
 *            <= u |r'|), with |G| <= |sent| + |r'| / (1 - u), so in all
 *            <= 2u (|sent| + |r'|)(1 + u).
 * (Round to nearest: |fl(y) - y| <= u |fl(y)|.) u = 2^-24 = FLT_EPSILON / 2,
 * so both stay within
 *   FLT_EPSILON * (|sent| + |r'|) * (1 + FLT_EPSILON)
 * per step; the bound sums that over the steps, per element (the brief form
 * "steps * eps * max|p|" is its upper bound). The test's own double sums add
 * at most T * DBL_EPSILON * (running sums of magnitudes), also allowed for.
 */
static void check_conservation(const struct mp_codec_ops *c, struct mp_codec_params prm)
{
	enum { N = 10007, T = 200 };
	float *x = malloc(N * sizeof(float)), *r = calloc(N, sizeof(float));
	float *d = malloc(N * sizeof(float));
	double *in = calloc(N, sizeof(double)), *outs = calloc(N, sizeof(double));
	double *bound = calloc(N, sizeof(double)), *mag = calloc(N, sizeof(double));
	size_t cap = c->max_encoded(&prm, N), len;
	uint8_t *buf = malloc(cap);
	void *s = scratch_for(c, &prm, N);
	double worst = 0.0, maxerr = 0.0;

	rng_state = 0x14057b7ef767814full;
	assert_non_null(x);
	assert_non_null(r);
	assert_non_null(d);
	assert_non_null(in);
	assert_non_null(outs);
	assert_non_null(bound);
	assert_non_null(mag);
	assert_non_null(buf);
	for (int t = 0; t < T; t++) {
		/* Gaussian, a scale that changes per step, and a steady bias. */
		float sc = (float)exp2(gauss() * 2.0);

		for (size_t i = 0; i < N; i++)
			x[i] = (float)(gauss() * sc + 0.01 * (double)(i % 13));
		assert_int_equal(c->encode(&prm, x, r, N, buf, cap, &len, s), 0);
		assert_int_equal(c->decode(buf, len, d, N), 0);
		for (size_t i = 0; i < N; i++) {
			in[i] += x[i];
			outs[i] += d[i];
			mag[i] += fabs(x[i]) + fabs(d[i]);
			bound[i] += FLT_EPSILON * (fabs(d[i]) + fabs(r[i])) * (1.0 + FLT_EPSILON);
		}
	}
	for (size_t i = 0; i < N; i++) {
		double err = fabs(outs[i] + r[i] - in[i]);
		double b = bound[i] + 4.0 * T * DBL_EPSILON * (mag[i] + fabs(r[i]));

		if (err > b)
			fail_msg("%s: element %zu off by %g, bound %g", c->name, i, err, b);
		if (b > 0 && err / b > worst)
			worst = err / b;
		if (err > maxerr)
			maxerr = err;
	}
	print_message(
		"%s conservation over %d steps: max |error| %.3g, at most %.2f of the bound\n",
		c->name, T, maxerr, worst);
	free(s);
	free(buf);
	free(mag);
	free(bound);
	free(outs);
	free(in);
	free(d);
	free(r);
	free(x);
}

static void test_conservation(void **state)
{
	(void)state;
	check_conservation(&mp_codec_topk, params(0.01f, 50));
	check_conservation(&mp_codec_topk, params(0.3f, 50));
	check_conservation(&mp_codec_adacomp, params(0.01f, 50));
	check_conservation(&mp_codec_adacomp, params(0.01f, 500));
}

/* ---- (3) AdaComp's compression ratio on synthetic gradients ---- */

/*
 * Synthetic layer gradients, all from this file's fixed-seed generator:
 *  - the layer is @rows rows of @rowlen (conv: 64 output channels of
 *    64 x 3 x 3 weights; FC: 256 x 1024), each row with its own scale
 *    s_c = exp(0.5 N(0,1)) (log-normal, fixed for the run);
 *  - element i at step t is s_c * (0.3 * m_i * (1 + 0.5 sin(2 pi t / 25))
 *    + N(0,1) * exp(0.3 N(0,1))): a slowly varying component along a fixed
 *    direction m_i ~ N(0,1) (what the residue accumulates until it is sent)
 *    plus heavy-tailed noise (a Gaussian times a per-element log-normal);
 *  - 50 steps with error feedback; the first 10 fill the residue, and the
 *    ratio (fp32 input bytes / payload bytes) is averaged over steps 10..49.
 * The paper reports ~40x for conv layers (L_T = 50) and ~200x for FC
 * (L_T = 500); ours count every payload byte (12-byte header, sign bits,
 * varint indices).
 */
static double ada_ratio(size_t rows, size_t rowlen, uint32_t binlen)
{
	size_t n = rows * rowlen;
	float *x = malloc(n * sizeof(float)), *r = calloc(n, sizeof(float));
	float *m = malloc(n * sizeof(float)), *sc = malloc(rows * sizeof(float));
	struct mp_codec_params p = params(0.01f, binlen);
	size_t cap = mp_codec_adacomp.max_encoded(&p, n), len;
	uint8_t *buf = malloc(cap);
	void *s = scratch_for(&mp_codec_adacomp, &p, n);
	double acc = 0.0;
	int cnt = 0;

	rng_state = 0x5851f42d4c957f2dull; /* the same data whatever ran before */
	assert_non_null(x);
	assert_non_null(r);
	assert_non_null(m);
	assert_non_null(sc);
	assert_non_null(buf);
	for (size_t c = 0; c < rows; c++)
		sc[c] = (float)exp(0.5 * gauss());
	for (size_t i = 0; i < n; i++)
		m[i] = (float)gauss();
	for (int t = 0; t < 50; t++) {
		double ph = 1.0 + 0.5 * sin(6.283185307179586 * t / 25.0);

		for (size_t i = 0; i < n; i++)
			x[i] = (float)(sc[i / rowlen] *
				       (0.3 * ph * m[i] + gauss() * exp(0.3 * gauss())));
		assert_int_equal(mp_codec_adacomp.encode(&p, x, r, n, buf, cap, &len, s), 0);
		if (t >= 10) {
			acc += 4.0 * (double)n / (double)len;
			cnt++;
		}
	}
	free(s);
	free(buf);
	free(sc);
	free(m);
	free(r);
	free(x);
	return acc / cnt;
}

static void test_adacomp_ratio(void **state)
{
	(void)state;
	double conv = ada_ratio(64, 64 * 9, 50);
	double fc = ada_ratio(256, 1024, 500);

	print_message("adacomp ratio: conv-like (L=50) %.1fx, FC-like (L=500) %.1fx\n", conv, fc);
	assert_true(conv >= 20.0 && conv <= 80.0);
	assert_true(fc >= 100.0 && fc <= 400.0);
}

/* ---- (4) every variant gives the same bits ---- */

struct enc_out {
	uint8_t *buf0; /* encoded without a residue */
	size_t len0;
	uint8_t *buf;
	size_t len;
	float *res;
	float *acc;
};

/*
 * Encodes with the current variant at the given offsets (misaligning src,
 * residue and payload), decodes into acc, and keeps what came out.
 * @tight: cap = the exact length (the path that writes the residue last).
 */
static void run_one(const struct mp_codec_ops *c, const struct mp_codec_params *p, const float *x,
		    const float *r0, size_t n, size_t xo, size_t po, int tight, struct enc_out *o)
{
	size_t cap = c->max_encoded(p, n);
	float *xs = malloc((n + 4) * sizeof(float)), *rs = malloc((n + 4) * sizeof(float));
	uint8_t *pb = malloc(cap + 8);
	void *s = scratch_for(c, p, n);

	assert_non_null(xs);
	assert_non_null(rs);
	assert_non_null(pb);
	memcpy(xs + xo, x, n * sizeof(float));
	memcpy(rs + (3 - xo), r0, n * sizeof(float));
	/* Without a residue first (kept too), then with one. */
	assert_int_equal(c->encode(p, xs + xo, NULL, n, pb + po, cap, &o->len0, s), 0);
	o->buf0 = malloc(o->len0 + 1);
	assert_non_null(o->buf0);
	memcpy(o->buf0, pb + po, o->len0);
	if (tight) {
		/* The exact length, from an encode on a copy of the residue. */
		float *tmp = malloc((n + 1) * sizeof(float));

		assert_non_null(tmp);
		memcpy(tmp, r0, n * sizeof(float));
		assert_int_equal(c->encode(p, xs + xo, tmp, n, pb + po, cap, &cap, s), 0);
		free(tmp);
	}
	assert_int_equal(c->encode(p, xs + xo, rs + (3 - xo), n, pb + po, cap, &o->len, s), 0);
	o->buf = malloc(o->len + 1);
	o->res = malloc((n + 1) * sizeof(float));
	o->acc = malloc((n + 1) * sizeof(float));
	assert_non_null(o->buf);
	assert_non_null(o->res);
	assert_non_null(o->acc);
	memcpy(o->buf, pb + po, o->len);
	memcpy(o->res, rs + (3 - xo), n * sizeof(float));
	for (size_t i = 0; i < n; i++)
		o->acc[i] = (float)i * 0.25f - 3.0f;
	/* Decode from the misaligned payload too. */
	assert_int_equal(c->decode_acc(pb + po, o->len, o->acc, n, 0.37f), 0);
	free(s);
	free(pb);
	free(rs);
	free(xs);
}

static void free_out(struct enc_out *o)
{
	free(o->buf0);
	free(o->buf);
	free(o->res);
	free(o->acc);
}

static int same_out(const struct enc_out *o, const struct enc_out *ref, size_t n)
{
	return o->len == ref->len && !memcmp(o->buf, ref->buf, o->len) &&
	       o->len0 == ref->len0 && !memcmp(o->buf0, ref->buf0, o->len0) &&
	       !memcmp(o->res, ref->res, n * sizeof(float)) &&
	       !memcmp(o->acc, ref->acc, n * sizeof(float));
}

/*
 * One codec and setting on one input: every variant the CPU has, with and
 * without room to spare (the in-place and the careful path), against the
 * first run (scalar, room to spare). Offsets vary with @salt. Marks in @ran
 * the variants that ran.
 */
static void variants_agree(const struct mp_codec_ops *c, const struct mp_codec_params *p,
			   const float *x, const float *r, size_t n, size_t salt, int *ran)
{
	struct enc_out ref = {0};
	int have_ref = 0;

	for (size_t v = 0; v < NVAR; v++) {
		if (mp_k_force(variants[v]) != 0)
			continue;
		ran[v] = 1;
		for (int tight = 0; tight < 2; tight++) {
			struct enc_out o;
			size_t xo = (salt + v + (size_t)tight) % 4;

			run_one(c, p, x, r, n, xo, (xo * 3 + 1) % 8, tight, &o);
			if (!have_ref) {
				ref = o;
				have_ref = 1;
				continue;
			}
			if (!same_out(&o, &ref, n))
				fail_msg("%s n %zu ratio %g bin %u: %s (tight %d) differs",
					 c->name, n, (double)p->topk_ratio, p->bin, variants[v],
					 tight);
			free_out(&o);
		}
	}
	free_out(&ref);
}

static void test_variants_identical(void **state)
{
	const size_t ns[] = {0, 1, 5, 15, 16, 17, 31, 33, 100, 1000, 4099, 65536 + 3};
	const float ratios[] = {0.01f, 0.2f, 1.0f};
	const uint32_t bins[] = {1, 7, 16, 50, 500};
	const char *orig = mp_k_variant();
	int ran[NVAR] = {0};

	(void)state;
	for (size_t a = 0; a < sizeof(ns) / sizeof(ns[0]); a++) {
		size_t n = ns[a];
		float *x = malloc((n + 1) * sizeof(float)), *r = malloc((n + 1) * sizeof(float));

		assert_non_null(x);
		assert_non_null(r);
		for (int kind = 0; kind < NKIND; kind++) {
			fill(x, n, kind);
			fill(r, n, kind == 2 ? 3 : kind);
			for (size_t q = 0; q < 3; q++) {
				struct mp_codec_params p = params(ratios[q], 50);

				variants_agree(&mp_codec_topk, &p, x, r, n, a + q, ran);
			}
			for (size_t q = 0; q < 5; q++) {
				struct mp_codec_params p = params(0.01f, bins[q]);

				variants_agree(&mp_codec_adacomp, &p, x, r, n, a + q, ran);
			}
		}
		free(r);
		free(x);
	}
	for (size_t v = 0; v < NVAR; v++)
		if (!ran[v])
			print_message("variant %s: not supported on this CPU, skipped\n",
				      variants[v]);
	assert_int_equal(mp_k_force(orig), 0);
}

/*
 * The kernels' own contracts, variant against variant: sift lists every key
 * >= lo in order while they fit and returns > cap exactly when they did not;
 * hist_sub counts under a prefix.
 */
static void test_kernels_direct(void **state)
{
	enum { N = 5000 };
	const char *orig = mp_k_variant();
	float *a = malloc(N * sizeof(float)), *b = malloc(N * sizeof(float));
	float *o = malloc(N * sizeof(float)), *o0 = malloc(N * sizeof(float));
	float *v = malloc((N + 16) * sizeof(float)), *v0 = malloc((N + 16) * sizeof(float));
	uint32_t *ix = malloc((N + 16) * sizeof(uint32_t)),
		 *ix0 = malloc((N + 16) * sizeof(uint32_t));
	uint32_t h[1024], h0[1024];
	const size_t caps[] = {0, 1, 15, 16, 17, 100, N};

	(void)state;
	assert_non_null(a);
	assert_non_null(b);
	assert_non_null(o);
	assert_non_null(o0);
	assert_non_null(v);
	assert_non_null(v0);
	assert_non_null(ix);
	assert_non_null(ix0);
	fill(a, N, 2);
	fill(b, N, 3);
	for (size_t n = 0; n <= N; n += (n < 40 ? 1 : 997)) {
		for (size_t ci = 0; ci < sizeof(caps) / sizeof(caps[0]); ci++) {
			for (uint32_t lo = 0; lo < 0x7f800000u; lo += 0x0fc00001u) {
				size_t c0 = 0;

				for (size_t vi = 0; vi < NVAR; vi++) {
					if (mp_k_force(variants[vi]) != 0)
						continue;
					const struct mp_sparse_kernels *k = mp_sparse_kernels();
					size_t cap = caps[ci] < n ? caps[ci] : n;
					size_t c = k->sift(a, b, o, n, lo, cap, ix, v);
					size_t want = 0;

					for (size_t i = 0; i < n; i++)
						want += (f_bits(san(a[i] + b[i])) & 0x7fffffffu) >=
							lo;
					assert_int_equal(c, want);
					for (size_t i = 0; i < n; i++)
						assert_int_equal(f_bits(o[i]),
								 f_bits(san(a[i] + b[i])));
					if (vi == 0) {
						c0 = c;
						memcpy(ix0, ix,
						       c <= cap ? c * sizeof(uint32_t) : 0);
						memcpy(v0, v, c <= cap ? c * sizeof(float) : 0);
						memcpy(o0, o, n * sizeof(float));
					} else if (c <= cap) {
						assert_int_equal(c, c0);
						assert_memory_equal(ix, ix0, c * sizeof(uint32_t));
						assert_memory_equal(v, v0, c * sizeof(float));
					}
				}
			}
		}
		for (unsigned shift = 0; shift <= 10; shift += 10) {
			uint32_t pre = shift ? 0x3f8u : 0x3f8u << 10 | 0x100u; /* around 1.0 */

			for (size_t vi = 0; vi < NVAR; vi++) {
				if (mp_k_force(variants[vi]) != 0)
					continue;
				memset(h, 0, sizeof(h));
				mp_sparse_kernels()->hist_sub(a, b, n, shift, pre, h);
				if (vi == 0)
					memcpy(h0, h, sizeof(h));
				else
					assert_memory_equal(h, h0, sizeof(h));
			}
		}
	}
	assert_int_equal(mp_k_force(orig), 0);
	free(ix0);
	free(ix);
	free(v0);
	free(v);
	free(o0);
	free(o);
	free(b);
	free(a);
}

/*
 * The one-pass shortcut's fallback: a sift that claims too few entries (the
 * sample put lo above t) or too many (the list overflowed) must leave the
 * result exactly as an honest one gives it, p stored included.
 */
static const struct mp_sparse_kernels *honest;
static int liar_mode;
static size_t liar_k;

static size_t sift_liar(const float *a, const float *b, float *out, size_t n, uint32_t lo,
			size_t cap, uint32_t *idx, float *val)
{
	size_t c = honest->sift(a, b, out, n, lo, cap, idx, val);

	return liar_mode == 1 ? liar_k - 1 : (liar_mode == 2 ? cap + 1 : c);
}

static void test_topk_fallback(void **state)
{
	enum { N = 65539 };
	const char *orig = mp_k_variant();
	const size_t ks[] = {1, 655, N / 8};
	float *x = malloc(N * sizeof(float)), *r = malloc(N * sizeof(float));
	float *o1 = malloc(N * sizeof(float)), *o2 = malloc(N * sizeof(float));
	float *v1 = malloc(N * sizeof(float));
	uint32_t *i1 = malloc(N * sizeof(uint32_t));

	(void)state;
	assert_non_null(x);
	assert_non_null(r);
	assert_non_null(o1);
	assert_non_null(o2);
	assert_non_null(v1);
	assert_non_null(i1);
	fill(x, N, 3);
	fill(r, N, 0);
	for (size_t vi = 0; vi < NVAR; vi++) {
		if (mp_k_force(variants[vi]) != 0)
			continue;
		honest = mp_sparse_kernels();
		struct mp_sparse_kernels liar = *honest;

		liar.sift = sift_liar;
		for (size_t a = 0; a < sizeof(ks) / sizeof(ks[0]); a++) {
			size_t k = ks[a], sz = mp_sparse_topk_scratch(N, k);
			void *s1 = aligned_alloc(64, (sz + 63) & ~(size_t)63);
			float *val;

			assert_non_null(s1);
			liar_k = k;
			liar_mode = 0;
			uint32_t *idx = mp_sparse_topk(&liar, x, r, o1, N, k, s1, &val);

			memcpy(i1, idx, k * sizeof(uint32_t));
			memcpy(v1, val, k * sizeof(float));
			for (liar_mode = 1; liar_mode <= 2; liar_mode++) {
				memset(o2, 0xee, N * sizeof(float));
				idx = mp_sparse_topk(&liar, x, r, o2, N, k, s1, &val);
				assert_memory_equal(idx, i1, k * sizeof(uint32_t));
				assert_memory_equal(val, v1, k * sizeof(float));
				assert_memory_equal(o2, o1, N * sizeof(float));
				/* and without storing p */
				idx = mp_sparse_topk(&liar, x, r, NULL, N, k, s1, &val);
				assert_memory_equal(idx, i1, k * sizeof(uint32_t));
				assert_memory_equal(val, v1, k * sizeof(float));
			}
			free(s1);
		}
	}
	assert_int_equal(mp_k_force(orig), 0);
	free(i1);
	free(v1);
	free(o2);
	free(o1);
	free(r);
	free(x);
}

/* ---- (5) malformed payloads ---- */

#define SENT 0x7fc0dead /* a NaN no decoder writes */

/* Both decoders reject @len bytes at @s for @n elements and write nothing. */
static void expect_bad(const struct mp_codec_ops *c, const uint8_t *s, size_t len, size_t n,
		       const char *what)
{
	float *out = malloc((n + 1) * sizeof(float));

	assert_non_null(out);
	for (size_t i = 0; i <= n; i++)
		memcpy(&out[i], &(uint32_t){SENT}, 4);
	int rc1 = c->decode(s, len, out, n);
	int rc2 = c->decode_acc(s, len, out, n, 1.0f);

	if (rc1 != -EBADMSG || rc2 != -EBADMSG)
		fail_msg("%s %s: decode %d, decode_acc %d, want -EBADMSG", c->name, what, rc1, rc2);
	for (size_t i = 0; i <= n; i++)
		if (f_bits(out[i]) != SENT)
			fail_msg("%s %s: element %zu written", c->name, what, i);
	free(out);
}

static size_t build_topk(uint8_t *b, uint32_t k, const float *val, const uint8_t *vi, size_t vlen)
{
	mp_le_put32(b, k);
	memcpy(b + 4, val, 4 * (size_t)k);
	if (vlen)
		memcpy(b + 4 + 4 * (size_t)k, vi, vlen);
	return 4 + 4 * (size_t)k + vlen;
}

static size_t build_ada(uint8_t *b, uint32_t bin, float scale, uint32_t n, const uint8_t *sg,
			const uint8_t *vi, size_t vlen)
{
	size_t sb = ((size_t)n + 7) / 8;

	mp_le_put32(b, bin);
	mp_le_putf32(b + 4, scale);
	mp_le_put32(b + 8, n);
	if (sb)
		memcpy(b + 12, sg, sb);
	if (vlen)
		memcpy(b + 12 + sb, vi, vlen);
	return 12 + sb + vlen;
}

static void expect_good(const struct mp_codec_ops *c, const uint8_t *s, size_t len, size_t n)
{
	float out[64];

	assert_true(n <= 64);
	assert_int_equal(c->decode(s, len, out, n), 0);
	assert_int_equal(c->decode_acc(s, len, out, n, 1.0f), 0);
}

static void test_malformed(void **state)
{
	const struct mp_codec_ops *tk = &mp_codec_topk, *ad = &mp_codec_adacomp;
	const float v3[3] = {1.0f, -2.0f, 3.0f};
	uint8_t b[256];
	size_t l;

	(void)state;
	/* A valid topk payload: indices 0, 5, 40 of 50 -> varints 0, 4, 34. */
	l = build_topk(b, 3, v3, (const uint8_t[]){0, 4, 34}, 3);
	expect_good(tk, b, l, 50);
	expect_bad(tk, b, l, 40, "index >= count");
	expect_bad(tk, b, l, 2, "K > count");
	expect_bad(tk, b, 3, 50, "no K");
	l = build_topk(b, 3, v3, (const uint8_t[]){0, 4, 34, 0}, 4);
	expect_bad(tk, b, l, 50, "trailing varint byte");
	l = build_topk(b, 3, v3, (const uint8_t[]){0, 4}, 2);
	expect_bad(tk, b, l, 50, "varints short");
	l = build_topk(b, 3, v3, (const uint8_t[]){0, 4, 0x80}, 3);
	expect_bad(tk, b, l, 50, "truncated varint");
	l = build_topk(b, 3, v3, (const uint8_t[]){0, 4, 0x80, 0x00}, 4);
	expect_bad(tk, b, l, 50, "non-minimal varint");
	l = build_topk(b, 2, v3, (const uint8_t[]){0, 0x80, 0x80, 0x80, 0x80, 0x80, 0x00}, 7);
	expect_bad(tk, b, l, 50, "six-byte varint");
	l = build_topk(b, 2, v3, (const uint8_t[]){0, 0xff, 0xff, 0xff, 0xff, 0x1f}, 6);
	expect_bad(tk, b, l, 50, "varint over 32 bits");
	/* Gaps that pass 2^32: the index would wrap to a small, "increasing" one. */
	l = build_topk(b, 2, v3, (const uint8_t[]){0xfe, 0xff, 0xff, 0xff, 0x0f, 0x02}, 6);
	expect_bad(tk, b, l, 50, "index wraps past 2^32");
	l = build_topk(b, 3, (const float[]){1.0f, NAN, 3.0f}, (const uint8_t[]){0, 4, 34}, 3);
	expect_bad(tk, b, l, 50, "NaN value");
	l = build_topk(b, 3, (const float[]){1.0f, 2.0f, -INFINITY}, (const uint8_t[]){0, 4, 34},
		       3);
	expect_bad(tk, b, l, 50, "inf value");
	l = build_topk(b, 0, v3, NULL, 0);
	expect_good(tk, b, l, 0);
	expect_good(tk, b, l, 10);
	expect_bad(tk, b, 5, 10, "K = 0 with a byte after it");
	l = build_topk(b, 1, v3, (const uint8_t[]){9}, 1);
	expect_bad(tk, b, l, 0, "an index for count 0");
	/* K larger than the payload could hold (must not overflow 4K). */
	mp_le_put32(b, 0xffffffffu);
	expect_bad(tk, b, 8, 64, "huge K");

	/* A valid adacomp payload: nsel 3, signs 0b101, indices 1, 2, 49. */
	l = build_ada(b, 50, 0.5f, 3, (const uint8_t[]){0x05}, (const uint8_t[]){1, 0, 46}, 3);
	expect_good(ad, b, l, 50);
	expect_bad(ad, b, l, 49, "index >= count");
	expect_bad(ad, b, l, 2, "nsel > count");
	b[12] = 0x0d;
	expect_bad(ad, b, l, 50, "padding bit set");
	b[12] = 0x85;
	expect_bad(ad, b, l, 50, "top padding bit set");
	l = build_ada(b, 0, 0.5f, 3, (const uint8_t[]){0x05}, (const uint8_t[]){1, 0, 46}, 3);
	expect_bad(ad, b, l, 50, "bin 0");
	l = build_ada(b, (1u << 24) + 1, 0.5f, 3, (const uint8_t[]){0x05},
		      (const uint8_t[]){1, 0, 46}, 3);
	expect_bad(ad, b, l, 50, "bin > 2^24");
	l = build_ada(b, 1u << 24, 0.5f, 3, (const uint8_t[]){0x05}, (const uint8_t[]){1, 0, 46},
		      3);
	expect_good(ad, b, l, 50);
	const float bad_scales[] = {NAN, INFINITY, -INFINITY, -1.0f, -FLT_MIN};

	for (size_t i = 0; i < sizeof(bad_scales) / sizeof(bad_scales[0]); i++) {
		l = build_ada(b, 50, bad_scales[i], 3, (const uint8_t[]){0x05},
			      (const uint8_t[]){1, 0, 46}, 3);
		expect_bad(ad, b, l, 50, "bad scale");
	}
	l = build_ada(b, 50, 0.5f, 3, (const uint8_t[]){0x05}, (const uint8_t[]){1, 0, 46, 0}, 4);
	expect_bad(ad, b, l, 50, "trailing byte");
	l = build_ada(b, 50, 0.5f, 3, (const uint8_t[]){0x05}, (const uint8_t[]){1, 0x80, 0x00, 46},
		      4);
	expect_bad(ad, b, l, 50, "non-minimal varint");
	l = build_ada(b, 50, 0.5f, 3, (const uint8_t[]){0x05}, (const uint8_t[]){1, 0, 0x80}, 3);
	expect_bad(ad, b, l, 50, "truncated varint");
	l = build_ada(b, 50, 0.0f, 0, NULL, NULL, 0);
	expect_good(ad, b, l, 10);
	expect_bad(ad, b, l + 1, 10, "byte after an empty selection");
	/* nsel too large for the payload (sign bytes alone do not fit). */
	l = build_ada(b, 50, 0.5f, 0, NULL, NULL, 0);
	mp_le_put32(b + 8, 0xffffffffu);
	expect_bad(ad, b, l, 64, "huge nsel");

	/* Every truncation and one-byte extension of real payloads. */
	enum { N = 3000 };
	float *x = malloc(N * sizeof(float));
	uint8_t *buf = malloc(65536);
	struct mp_codec_params p = params(0.02f, 50);
	void *s = scratch_for(&mp_codec_topk, &p, N);

	assert_non_null(x);
	assert_non_null(buf);
	fill(x, N, 3);
	x[2999] = 100.0f; /* a gap needing a multi-byte varint at the very end */
	for (int ci = 0; ci < 2; ci++) {
		const struct mp_codec_ops *c = ci ? ad : tk;
		size_t len;

		assert_int_equal(c->encode(&p, x, NULL, N, buf, 65536, &len, s), 0);
		for (size_t cut = 0; cut < len; cut++)
			expect_bad(c, buf, cut, N, "truncated");
		buf[len] = 0;
		expect_bad(c, buf, len + 1, N, "extended");
		buf[len] = 0x81;
		expect_bad(c, buf, len + 1, N, "extended by a continuation byte");
	}
	free(s);
	free(buf);
	free(x);
}

/* ---- (6) -ENOSPC: nothing written past cap, residue untouched ---- */

static void test_enospc(void **state)
{
	enum { N = 2000, GUARD = 64 };
	float x[N], r[N], r0[N], r1[N];
	uint8_t *buf = malloc(20000 + GUARD), *ok = malloc(20000);
	/* K = 8 of 2000: gaps past 127 take two bytes, so some caps fail only after selection. */
	struct mp_codec_params p = params(0.004f, 50);
	void *s = scratch_for(&mp_codec_topk, &p, N);

	(void)state;
	assert_non_null(buf);
	assert_non_null(ok);
	fill(x, N, 3);
	fill(r0, N, 3);
	for (int ci = 0; ci < 2; ci++) {
		const struct mp_codec_ops *c = ci ? &mp_codec_adacomp : &mp_codec_topk;
		size_t len, l2;

		memcpy(r1, r0, sizeof(r0));
		assert_int_equal(c->encode(&p, x, r1, N, ok, 20000, &len, s), 0);
		/* so that the caps below test the careful path */
		assert_true(len < c->max_encoded(&p, N));
		for (size_t cap = 0; cap < len; cap += (cap < 64 || cap + 64 > len) ? 1 : 7) {
			memcpy(r, r0, sizeof(r0));
			memset(buf, 0xee, len + GUARD);
			if (c->encode(&p, x, r, N, buf, cap, &l2, s) != -ENOSPC)
				fail_msg("%s cap %zu of %zu: not -ENOSPC", c->name, cap, len);
			/* The contract is "nothing past cap"; these codecs write nothing at all. */
			for (size_t i = 0; i < len + GUARD; i++)
				if (buf[i] != 0xee)
					fail_msg("%s cap %zu: byte %zu written", c->name, cap, i);
			assert_memory_equal(r, r0, sizeof(r0));
		}
		/* The exact length is enough, and gives the same payload and residue. */
		memcpy(r, r0, sizeof(r0));
		memset(buf, 0xee, len + GUARD);
		assert_int_equal(c->encode(&p, x, r, N, buf, len, &l2, s), 0);
		assert_int_equal(l2, len);
		assert_memory_equal(buf, ok, len);
		assert_memory_equal(r, r1, sizeof(r1));
		for (size_t i = len; i < len + GUARD; i++)
			assert_int_equal(buf[i], 0xee);
	}
	free(s);
	free(ok);
	free(buf);
}

/* ---- (7) decode_acc == acc + w * decode ---- */

static void test_decode_acc(void **state)
{
	enum { N = 5003 };
	const float ws[] = {1.0f, -0.5f, 3.7f, 1e-3f};
	float x[N], d[N], acc[N], want[N];
	uint8_t *buf = malloc(40000);
	void *s;

	(void)state;
	assert_non_null(buf);
	for (int ci = 0; ci < 2; ci++) {
		const struct mp_codec_ops *c = ci ? &mp_codec_adacomp : &mp_codec_topk;
		struct mp_codec_params p = params(0.1f, 50);
		size_t len;

		s = scratch_for(c, &p, N);
		for (int kind = 0; kind < NKIND; kind++) {
			fill(x, N, kind);
			assert_int_equal(c->encode(&p, x, NULL, N, buf, 40000, &len, s), 0);
			assert_int_equal(c->decode(buf, len, d, N), 0);
			for (size_t wi = 0; wi < sizeof(ws) / sizeof(ws[0]); wi++) {
				for (size_t i = 0; i < N; i++) {
					/* never 0, so acc + w * 0 is acc bit for bit */
					acc[i] = rndf(2.0f) + 4.0f;
					volatile float prod = ws[wi] * d[i];

					want[i] = acc[i] + prod;
				}
				assert_int_equal(c->decode_acc(buf, len, acc, N, ws[wi]), 0);
				assert_memory_equal(acc, want, sizeof(acc));
			}
		}
		free(s);
	}
	free(buf);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_registry),
		cmocka_unit_test(test_bad_params),
		cmocka_unit_test(test_max_encoded_exact),
		cmocka_unit_test(test_topk_selection),
		cmocka_unit_test(test_nonfinite_dropped),
		cmocka_unit_test(test_adacomp_rule),
		cmocka_unit_test(test_conservation),
		cmocka_unit_test(test_adacomp_ratio),
		cmocka_unit_test(test_variants_identical),
		cmocka_unit_test(test_kernels_direct),
		cmocka_unit_test(test_topk_fallback),
		cmocka_unit_test(test_malformed),
		cmocka_unit_test(test_enospc),
		cmocka_unit_test(test_decode_acc),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
