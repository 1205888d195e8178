/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The quantising codecs bf16, uniform8 and blockwise8 (src/codec_quant.c,
 * kernels/cpu/quant.c).
 *
 * Every kernel variant this CPU runs (others are skipped with a message) must
 * produce exactly the payload of a plain reference encoder written here from
 * the codec spec, decode to exactly table[code] / q * step, accumulate
 * exactly acc + round(w * decoded), and stay within the error bounds the
 * formats promise. Malformed payloads must be refused before a single output
 * byte changes.
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
#include "kernels/cpu/quant.h"

/*
 * uniform8's table sample (codec spec): element i of a chunk feeds the
 * bucket means only if i % U8_SAMPLE == 0. Written out here from the spec;
 * the assertion only catches the kernels and the spec drifting apart.
 */
#define U8_SAMPLE 16
_Static_assert(U8_SAMPLE == MP_KQ_U8_SAMPLE, "uniform8 sample step differs from the spec");

static const char *const variants[] = {"scalar", "avx2", "avx512"};
#define NVAR (sizeof(variants) / sizeof(variants[0]))

/* Lengths that hit every vector tail and several chunk boundaries. */
static const size_t lengths[] = {0, 1, 15, 17, 4095, 4097, 100003};
#define NLEN (sizeof(lengths) / sizeof(lengths[0]))
#define MAXN 100003

static struct mp_codec_params P;

/* ---- helpers ---- */

static uint64_t rng_state = 0x853c49e6748fea9bull;

static uint64_t rnd64(void)
{
	rng_state ^= rng_state >> 12;
	rng_state ^= rng_state << 25;
	rng_state ^= rng_state >> 27;
	return rng_state * 0x2545f4914f6cdd1dull;
}

static uint32_t rnd32(void)
{
	return (uint32_t)(rnd64() >> 32);
}

/* Uniform in [0, 1). */
static double rndu(void)
{
	return (double)(rnd64() >> 11) * 0x1p-53;
}

static float gauss(void)
{
	double u = rndu() + 0x1p-60, v = rndu();

	return (float)(sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v));
}

static uint32_t f32_bits(float f)
{
	uint32_t u;

	memcpy(&u, &f, sizeof(u));
	return u;
}

static float bits_f32(uint32_t u)
{
	float f;

	memcpy(&f, &u, sizeof(f));
	return f;
}

/* Forces a product to be rounded on its own (no fused multiply-add). */
static float rounded_f(float v)
{
	volatile float t = v;

	return t;
}

static double rounded_d(double v)
{
	volatile double t = v;

	return t;
}

/* Switches to @v; 0 with a message if this CPU cannot run it. */
static int use_variant(const char *v)
{
	int r = mp_k_force(v);

	if (r == -ENOTSUP) {
		print_message("[  SKIP    ] kernel variant %s: not supported by this CPU\n", v);
		return 0;
	}
	assert_int_equal(r, 0);
	return 1;
}

static void *xmalloc(size_t n)
{
	void *p = malloc(n ? n : 1);

	assert_non_null(p);
	return p;
}

/*
 * Input kinds. Heavy-tailed data puts nearly every value into one or two
 * uniform8 buckets, which takes the encoder's other histogram loop; the
 * second heavy kind adds non-finite values to it (some at sampled indices).
 */
enum kind { K_GAUSS, K_UNIFORM, K_HEAVY, K_SPECIAL, K_HEAVY_NF, K_NKIND };

static void fill(float *x, size_t n, enum kind k)
{
	for (size_t i = 0; i < n; i++) {
		switch (k) {
		case K_GAUSS:
			x[i] = gauss() * 3.0f + 0.5f;
			break;
		case K_UNIFORM:
			x[i] = (float)(rndu() * 2.0 - 1.0) * 1e-3f;
			break;
		case K_HEAVY:
			x[i] = i % 997 == 5 ? 1e5f : gauss();
			break;
		case K_HEAVY_NF:
			x[i] = i % 997 == 5 ? 1e5f : i % 113 == 0 ? NAN : i % 367 == 7 ? -INFINITY : gauss();
			break;
		default: {
			uint32_t r = rnd32() % 64;

			x[i] = r == 0 ? NAN : r == 1 ? INFINITY : r == 2 ? -INFINITY : r == 3 ? 1e30f
			     : r == 4 ? bits_f32(rnd32() & 0x807fffffu) /* subnormal or zero */
			     : r == 5 ? -0.0f : gauss();
			break;
		}
		}
	}
}

/* ---- reference encoders, written from the spec ---- */

/* Value of a non-NaN bf16 pattern, with 0x7f80 taken as 2^128 (the next step up). */
static double bf16_value(uint32_t h)
{
	double s = h & 0x8000u ? -1.0 : 1.0;

	if ((h & 0x7fffu) == 0x7f80u)
		return s * 0x1p128;
	return (double)bits_f32(h << 16);
}

/* Nearest bf16 by comparing the two neighbours (not by the bit trick the kernels use). */
static uint16_t ref_bf16(float x)
{
	uint32_t u = f32_bits(x);
	uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);

	if (isnan(x))
		return (uint16_t)((u >> 16) | 0x0040u);
	if (isinf(x))
		return (uint16_t)(sign | 0x7f7fu);
	uint32_t t = u >> 16; /* toward zero */
	double dlo = fabs((double)x - bf16_value(t)), dhi = fabs(bf16_value(t + 1) - (double)x);
	uint32_t r = dlo < dhi ? t : dhi < dlo ? t + 1 : (t & 1u) ? t + 1 : t;

	if ((r & 0x7fffu) == 0x7f80u) /* rounded to inf: clamp */
		return (uint16_t)(sign | 0x7f7fu);
	return (uint16_t)r;
}

struct u8_ref {
	float lo, step, mu;
	int degenerate; /* every code 128 */
};

/* uniform8 per the spec (and the two readings documented in codec_quant.c). */
static void ref_uniform8(const float *x, size_t n, float k, unsigned char *out, struct u8_ref *info)
{
	double s[16] = {0}, q[16] = {0};
	size_t nf = 0;
	float table[256];
	unsigned char *codes = out + 1024;

	for (size_t i = 0; i < n; i++) {
		if (isfinite(x[i])) {
			s[i % 16] += (double)x[i];
			q[i % 16] += (double)x[i] * (double)x[i];
			nf++;
		}
	}
	for (int w = 8; w >= 1; w /= 2) {
		for (int j = 0; j < w; j++) {
			s[j] += s[j + w];
			q[j] += q[j + w];
		}
	}
	memset(info, 0, sizeof(*info));
	info->degenerate = 1;
	if (nf == 0) {
		for (int b = 0; b < 256; b++)
			table[b] = 0.0f;
		memset(codes, 128, n);
		memcpy(out, table, 1024);
		return;
	}
	double mu = s[0] / (double)nf;
	double var = q[0] / (double)nf - rounded_d(mu * mu);
	double sd = sqrt(var > 0.0 ? var : 0.0);
	float lo = (float)(mu - rounded_d((double)k * sd));
	float step = (float)(2.0 * (double)k * sd / 256.0);

	info->mu = (float)mu;
	info->lo = lo;
	info->step = step;
	if (sd == 0.0 || !isnormal(step) || !isfinite(lo) || !isfinite((float)((double)lo + 256.0 * step))) {
		for (int b = 0; b < 256; b++)
			table[b] = (float)mu;
		memset(codes, 128, n);
		memcpy(out, table, 1024);
		return;
	}
	info->degenerate = 0;
	float inv = 1.0f / step;
	static double hs[256];
	static size_t hc[256];

	memset(hs, 0, sizeof(hs));
	memset(hc, 0, sizeof(hc));
	for (size_t i = 0; i < n; i++) {
		float v = isnan(x[i]) ? (float)mu : x[i];
		float t = floorf(rounded_f(v - lo) * inv);
		int c = t < 0.0f ? 0 : t > 255.0f ? 255 : (int)t;

		codes[i] = (unsigned char)c;
		if (i % U8_SAMPLE == 0 && isfinite(x[i])) {
			hs[c] += (double)x[i];
			hc[c]++;
		}
	}
	for (int b = 0; b < 256; b++) {
		if (hc[b])
			table[b] = (float)(hs[b] / (double)hc[b]);
		else
			table[b] = (float)((double)lo + (b + 0.5) * (double)step);
	}
	memcpy(out, table, 1024);
}

/* The spec's blockwise8 step for absmax a > 0: a/127, one float lower if 127 * s overflows. */
static float ref_bw8_step(float a)
{
	float s = a / 127.0f;

	if (isinf(rounded_f(127.0f * s)))
		s = nextafterf(s, 0.0f);
	return s;
}

/* blockwise8 per the spec (with the 2^64 rescaling of codec_quant.c for tiny blocks). */
static size_t ref_blockwise8(const float *x, size_t n, uint32_t B, unsigned char *out)
{
	size_t nb = (n + B - 1) / B;
	unsigned char *codes = out + 4 + 4 * nb;

	memcpy(out, &B, 4);
	for (size_t b = 0; b < nb; b++) {
		size_t i0 = b * B, i1 = i0 + B < n ? i0 + B : n;
		float a = 0.0f;

		for (size_t i = i0; i < i1; i++)
			if (isfinite(x[i]) && fabsf(x[i]) > a)
				a = fabsf(x[i]);
		float s = ref_bw8_step(a);

		if (a == 0.0f || s == 0.0f) {
			s = 0.0f;
			memset(codes + i0, 0, i1 - i0);
		} else {
			/* Each quotient rounded through memory: GCC 13.3 -O3 took
			 * isinf(127 / a) to mean a == 0 and folded the line below
			 * to inf (mp_codec_params.h), on the reference too. */
			float f = 1.0f, inv = rounded_f(127.0f / a);

			if (isinf(inv)) {
				f = 0x1p64f;
				inv = rounded_f(127.0f / rounded_f(a * f));
			}
			for (size_t i = i0; i < i1; i++) {
				float t = rounded_f(x[i] * f) * inv;
				int8_t c;

				if (isnan(t))
					c = 0;
				else
					c = (int8_t)fmaxf(-127.0f, fminf(127.0f, rintf(t)));
				memcpy(codes + i, &c, 1);
			}
		}
		memcpy(out + 4 + 4 * b, &s, 4);
	}
	return 4 + 4 * nb + n;
}

/* ---- registry ---- */

static void test_registry(void **state)
{
	(void)state;
	assert_ptr_equal(mp_codec_by_id(MP_CODEC_BF16), &mp_codec_bf16);
	assert_ptr_equal(mp_codec_by_id(MP_CODEC_UNIFORM8), &mp_codec_uniform8);
	assert_ptr_equal(mp_codec_by_id(MP_CODEC_BLOCKWISE8), &mp_codec_blockwise8);
	assert_int_equal(mp_codec_bf16.id, 2);
	assert_int_equal(mp_codec_uniform8.id, 3);
	assert_int_equal(mp_codec_blockwise8.id, 4);
	assert_string_equal(mp_codec_bf16.name, "bf16");
	assert_string_equal(mp_codec_uniform8.name, "uniform8");
	assert_string_equal(mp_codec_blockwise8.name, "blockwise8");
	assert_ptr_equal(mp_codec_by_name("BF16"), &mp_codec_bf16);
	assert_ptr_equal(mp_codec_by_name("uniform8"), &mp_codec_uniform8);
	assert_ptr_equal(mp_codec_by_name("blockwise8"), &mp_codec_blockwise8);
	const struct mp_codec_ops *all[3] = {&mp_codec_bf16, &mp_codec_uniform8, &mp_codec_blockwise8};

	for (int c = 0; c < 3; c++) {
		assert_int_equal(all[c]->flags, MP_CODEC_F_LOSSY);
		assert_null(all[c]->scratch_size);
		assert_non_null(all[c]->max_encoded);
		assert_non_null(all[c]->encode);
		assert_non_null(all[c]->decode);
		assert_non_null(all[c]->decode_acc);
	}
	assert_int_equal(mp_codec_bf16.max_encoded(&P, 1000), 2000);
	assert_int_equal(mp_codec_uniform8.max_encoded(&P, 1000), 2024);
	assert_int_equal(mp_codec_uniform8.max_encoded(&P, 0), 1024);
	assert_int_equal(mp_codec_blockwise8.max_encoded(&P, 0), 4);
	assert_int_equal(mp_codec_blockwise8.max_encoded(&P, 4096), 4 + 4 + 4096);
	assert_int_equal(mp_codec_blockwise8.max_encoded(&P, 4097), 4 + 8 + 4097);
	assert_int_equal(mp_codec_bf16.max_encoded(&P, SIZE_MAX), SIZE_MAX);
	assert_int_equal(mp_codec_uniform8.max_encoded(&P, SIZE_MAX - 10), SIZE_MAX);
	assert_int_equal(mp_codec_blockwise8.max_encoded(&P, SIZE_MAX - 10), SIZE_MAX);
}

/* ---- bf16 ---- */

/* Every one of the 65536 codes decodes to its bits shifted left by 16, in every variant. */
static void test_bf16_decode_exhaustive(void **state)
{
	enum { N = 65536 };
	unsigned char *wire = xmalloc(2 * N + 1);
	float *out = xmalloc((N + 1) * sizeof(float));

	(void)state;
	for (size_t v = 0; v < NVAR; v++) {
		if (!use_variant(variants[v]))
			continue;
		for (int off = 0; off < 2; off++) {
			for (uint32_t h = 0; h < N; h++) {
				wire[off + 2 * h] = (unsigned char)(h & 0xff);
				wire[off + 2 * h + 1] = (unsigned char)(h >> 8);
			}
			assert_int_equal(mp_codec_bf16.decode(wire + off, 2 * N, out + off, N), 0);
			for (uint32_t h = 0; h < N; h++)
				assert_int_equal(f32_bits(out[off + h]), h << 16);
		}
	}
	assert_int_equal(mp_k_force("auto"), 0);
	free(wire);
	free(out);
}

/* Encode matches the neighbour-comparing oracle on random bit patterns and the edge cases. */
static void test_bf16_encode_oracle(void **state)
{
	enum { N = 200003 };
	float *x = xmalloc(N * sizeof(float));
	unsigned char *wire = xmalloc(2 * N + 3);
	size_t len;
	static const uint32_t edge[] = {
		0x00000000, 0x80000000, 0x00000001, 0x00008000, 0x00018000, 0x0000ffff, 0x007fffff,
		0x00800000, 0x3f800000, 0x3f808000, 0x3f818000, 0x3f807fff, 0x3f80ffff, 0x7f7f0000,
		0x7f7f7fff, 0x7f7f8000, 0x7f7fffff, 0x7f800000, 0xff800000, 0x7f800001, 0x7fc00000,
		0xffc00000, 0x7f810000, 0x7fffffff, 0xff800001, 0xff7fffff, 0x7effffff, 0x7f000000,
	};
	const size_t NE = sizeof(edge) / sizeof(edge[0]);

	(void)state;
	for (size_t i = 0; i < N; i++)
		x[i] = bits_f32(i < NE ? edge[i] : rnd32());
	for (size_t v = 0; v < NVAR; v++) {
		if (!use_variant(variants[v]))
			continue;
		for (int off = 0; off < 3; off++) {
			/* src misaligned by one float as well, with a ragged length. */
			size_t n = N - 1 - (size_t)off;

			unsigned char *pl = wire + off;

			memset(wire, 0xa5, 2 * N + 3);
			assert_int_equal(mp_codec_bf16.encode(&P, x + 1, NULL, n, pl, 2 * n, &len, NULL), 0);
			assert_int_equal(len, 2 * n);
			for (size_t i = 0; i < n; i++) {
				uint16_t h = (uint16_t)(pl[2 * i] | pl[2 * i + 1] << 8);
				uint16_t r = ref_bf16(x[i + 1]);

				if (h != r)
					fail_msg("%s: bf16(%08x) = %04x, want %04x", variants[v],
						 f32_bits(x[i + 1]), h, r);
			}
			/* Nothing written past the payload. */
			assert_int_equal(wire[off + 2 * n], 0xa5);
		}
	}
	assert_int_equal(mp_k_force("auto"), 0);
	free(x);
	free(wire);
}

/*
 * Round trip: |x - bf16(x)| <= 2^-8 |x| for normal x below the clamp
 * threshold (8 significant bits, so half an ulp is at most 2^-8 of the
 * value); clamped values come back as +-0x7f7f; NaN stays NaN with its sign.
 */
static void test_bf16_roundtrip_bound(void **state)
{
	enum { N = 50021 };
	float *x = xmalloc(N * sizeof(float)), *y = xmalloc(N * sizeof(float));
	unsigned char *wire = xmalloc(2 * N);
	size_t len;

	(void)state;
	for (size_t i = 0; i < N; i++) {
		float m = ldexpf(1.0f + (float)rndu(), (int)(rnd32() % 254) - 126);

		x[i] = rnd32() & 1 ? -m : m;
	}
	x[0] = FLT_MAX;
	x[1] = -FLT_MAX;
	x[2] = INFINITY;
	x[3] = -NAN;
	x[4] = FLT_MIN;
	x[5] = -0.0f;
	for (size_t v = 0; v < NVAR; v++) {
		if (!use_variant(variants[v]))
			continue;
		assert_int_equal(mp_codec_bf16.encode(&P, x, NULL, N, wire, 2 * N, &len, NULL), 0);
		assert_int_equal(mp_codec_bf16.decode(wire, len, y, N), 0);
		for (size_t i = 0; i < N; i++) {
			if (isnan(x[i])) {
				assert_true(isnan(y[i]));
				assert_int_equal(!!signbit(y[i]), !!signbit(x[i]));
			} else if ((f32_bits(x[i]) & 0x7fffffffu) >= 0x7f7f8000u) {
				assert_true(fabsf(y[i]) == bits_f32(0x7f7f0000u));
				assert_int_equal(!!signbit(y[i]), !!signbit(x[i]));
			} else if (isnormal(x[i])) {
				assert_true(fabsf(y[i] - x[i]) <= 0x1p-8f * fabsf(x[i]));
			} else {
				assert_true(y[i] == x[i]); /* zeros */
			}
		}
	}
	assert_int_equal(mp_k_force("auto"), 0);
	free(x);
	free(y);
	free(wire);
}

/* ---- generic: every variant equals the reference, misaligned, awkward lengths ---- */

typedef size_t (*ref_fn)(const float *x, size_t n, unsigned char *out, void *info);

static size_t ref_bf16_payload(const float *x, size_t n, unsigned char *out, void *info)
{
	(void)info;
	for (size_t i = 0; i < n; i++) {
		uint16_t h = ref_bf16(x[i]);

		memcpy(out + 2 * i, &h, 2);
	}
	return 2 * n;
}

static size_t ref_u8_payload(const float *x, size_t n, unsigned char *out, void *info)
{
	ref_uniform8(x, n, P.sigmas, out, info);
	return 1024 + n;
}

static size_t ref_bw8_payload(const float *x, size_t n, unsigned char *out, void *info)
{
	(void)info;
	return ref_blockwise8(x, n, P.block, out);
}

/* Decoded value of element i of a reference payload (from its parts, not through the codec). */
static float ref_decoded(const struct mp_codec_ops *c, const unsigned char *pl, size_t n, size_t i)
{
	if (c == &mp_codec_bf16) {
		uint16_t h;

		memcpy(&h, pl + 2 * i, 2);
		return bits_f32((uint32_t)h << 16);
	}
	if (c == &mp_codec_uniform8) {
		float t;

		memcpy(&t, pl + 4 * (size_t)pl[1024 + i], 4);
		return t;
	}
	uint32_t B;
	float s;

	memcpy(&B, pl, 4);
	size_t nb = (n + B - 1) / B;

	memcpy(&s, pl + 4 + 4 * (i / B), 4);
	return (float)(int8_t)pl[4 + 4 * nb + i] * s;
}

/*
 * One encode / decode / decode_acc round of check_codec, the payload at
 * wire + off: compares with the reference payload @want of @wl bytes.
 * @y and @acc have room for n + 2 floats and are used from index 1.
 */
static void check_one(const struct mp_codec_ops *c, const char *vn, size_t n, const float *x,
		      const float *acc0, const unsigned char *want, size_t wl, unsigned char *wire, int off,
		      float *y, float *acc, int kind)
{
	const float w = -0.375f;
	unsigned char *pl = wire + off;
	size_t len = 0;

	memset(wire, 0x5a, wl + 8);
	assert_int_equal(c->encode(&P, x, NULL, n, pl, wl, &len, NULL), 0);
	assert_int_equal(len, wl);
	if (memcmp(pl, want, wl)) {
		size_t d = 0;

		while (pl[d] == want[d])
			d++;
		fail_msg("%s/%s n=%zu kind=%d: payload byte %zu is %02x, want %02x", c->name, vn, n, kind, d,
			 pl[d], want[d]);
	}
	assert_int_equal(pl[wl], 0x5a);

	/* decode into a destination one float off alignment */
	memset(y, 0xa5, (n + 2) * sizeof(float));
	assert_int_equal(c->decode(pl, len, y + 1, n), 0);
	for (size_t i = 0; i < n; i++) {
		float r = ref_decoded(c, want, n, i);

		if (f32_bits(y[1 + i]) != f32_bits(r))
			fail_msg("%s/%s n=%zu: decoded[%zu] = %a, want %a", c->name, vn, n, i,
				 (double)y[1 + i], (double)r);
	}
	if (f32_bits(y[1 + n]) != 0xa5a5a5a5u)
		fail_msg("%s/%s n=%zu off=%d: decode wrote past the end", c->name, vn, n, off);

	memcpy(acc + 1, acc0, n * sizeof(float));
	acc[1 + n] = 7.0f;
	assert_int_equal(c->decode_acc(pl, len, acc + 1, n, w), 0);
	for (size_t i = 0; i < n; i++) {
		float e = acc0[i] + rounded_f(w * y[1 + i]);

		if (f32_bits(acc[1 + i]) != f32_bits(e))
			fail_msg("%s/%s n=%zu: acc[%zu] = %a, want %a", c->name, vn, n, i, (double)acc[1 + i],
				 (double)e);
	}
	assert_true(acc[1 + n] == 7.0f);
}

/*
 * For @c on every variant and length: the payload equals the reference
 * byte for byte (so all variants agree), decode gives the reference values,
 * decode_acc gives acc + round(w * value) exactly, with src, payload and
 * destination all misaligned.
 */
static void check_codec(const struct mp_codec_ops *c, ref_fn ref, enum kind kind)
{
	float *x = xmalloc((MAXN + 1) * sizeof(float));
	float *y = xmalloc((MAXN + 2) * sizeof(float));
	float *acc = xmalloc((MAXN + 2) * sizeof(float));
	float *acc0 = xmalloc(MAXN * sizeof(float));
	size_t cap = c->max_encoded(&P, MAXN) + 8;
	unsigned char *want = xmalloc(cap), *wire = xmalloc(cap + 8);
	struct u8_ref info;

	for (size_t li = 0; li < NLEN; li++) {
		size_t n = lengths[li], wl;

		fill(x + 1, n, kind);
		for (size_t i = 0; i < n; i++)
			acc0[i] = gauss();
		wl = ref(x + 1, n, want, &info);
		assert_int_equal(wl, c->max_encoded(&P, n));
		for (size_t v = 0; v < NVAR; v++) {
			if (!use_variant(variants[v]))
				continue;
			for (int off = 0; off < 4; off += 3)
				check_one(c, variants[v], n, x + 1, acc0, want, wl, wire, off, y, acc,
					  (int)kind);
		}
	}
	assert_int_equal(mp_k_force("auto"), 0);
	free(x);
	free(y);
	free(acc);
	free(acc0);
	free(want);
	free(wire);
}

static void test_bf16_variants(void **state)
{
	(void)state;
	for (int k = 0; k < K_NKIND; k++)
		check_codec(&mp_codec_bf16, ref_bf16_payload, (enum kind)k);
}

static void test_uniform8_variants(void **state)
{
	(void)state;
	for (int k = 0; k < K_NKIND; k++)
		check_codec(&mp_codec_uniform8, ref_u8_payload, (enum kind)k);
	P.sigmas = 2.5f;
	check_codec(&mp_codec_uniform8, ref_u8_payload, K_GAUSS);
	P.sigmas = 64.0f;
	check_codec(&mp_codec_uniform8, ref_u8_payload, K_HEAVY);
	mp_codec_params_default(&P);
	/* The AVX2 statistics without FMA, where this CPU has it. */
	mp_kq_avoid_fma = 1;
	check_codec(&mp_codec_uniform8, ref_u8_payload, K_GAUSS);
	check_codec(&mp_codec_uniform8, ref_u8_payload, K_SPECIAL);
	mp_kq_avoid_fma = 0;
}

static void test_blockwise8_variants(void **state)
{
	static const uint32_t blocks[] = {4096, 1, 7, 16, 33, 1u << 24};

	(void)state;
	for (size_t b = 0; b < sizeof(blocks) / sizeof(blocks[0]); b++) {
		P.block = blocks[b];
		for (int k = 0; k < K_NKIND; k++)
			check_codec(&mp_codec_blockwise8, ref_bw8_payload, (enum kind)k);
	}
	mp_codec_params_default(&P);
}

/* ---- error bounds ---- */

/*
 * blockwise8: with a = absmax of the block, s = fl(a/127), inv = fl(127/a):
 * t = fl(x * inv) differs from x/s by at most 3 roundings of 2^-24 relative
 * on |t| <= 127 (< 2.3e-5), rounding t costs 1/2, clamping at +-127 only
 * moves t by the same 2.3e-5, and decoding q * s rounds once more (<= 127 s *
 * 2^-24). So |x - y| <= s (1/2 + 2^-14) for normal s. Where s is subnormal
 * or zero its own rounding error (<= 2^-150) is multiplied by |q| <= 127,
 * hence the absolute 2^-142 on top. For a = FLT_MAX the spec sends the float
 * below fl(a/127): one more ulp of s times |q| <= 127 (< 1.6e-5 s), still
 * inside the 2^-14 (test_special_values checks that case).
 */
static void test_blockwise8_bound(void **state)
{
	enum { N = 30011 };
	float *x = xmalloc(N * sizeof(float)), *y = xmalloc(N * sizeof(float));
	float *amax = xmalloc(N * sizeof(float));
	unsigned char *wire = xmalloc(5 * N + 8); /* enough for any block size */
	static const uint32_t blocks[] = {4096, 64, 5};
	size_t len;

	(void)state;
	for (size_t bi = 0; bi < 3; bi++) {
		size_t nb = (N + blocks[bi] - 1) / blocks[bi];

		P.block = blocks[bi];
		/* Each block at its own scale, from subnormals up to FLT_MAX. */
		for (size_t i = 0; i < N; i++) {
			int e = (int)((i / blocks[bi]) * 37 % 280) - 150;

			float r = (float)(rndu() * 2 - 1);

			x[i] = e > 127 ? r * FLT_MAX : ldexpf(r, e);
		}
		for (size_t b = 0; b < nb; b++) {
			amax[b] = 0.0f;
			for (size_t j = b * P.block; j < N && j < (b + 1) * P.block; j++)
				amax[b] = fmaxf(amax[b], fabsf(x[j]));
		}
		for (size_t v = 0; v < NVAR; v++) {
			if (!use_variant(variants[v]))
				continue;
			int r = mp_codec_blockwise8.encode(&P, x, NULL, N, wire, 5 * N + 8, &len, NULL);

			assert_int_equal(r, 0);
			assert_int_equal(mp_codec_blockwise8.decode(wire, len, y, N), 0);
			for (size_t i = 0; i < N; i++) {
				float s;
				size_t b = i / P.block;

				memcpy(&s, wire + 4 + 4 * b, 4);
				assert_true(s == (amax[b] > 0.0f ? ref_bw8_step(amax[b]) : 0.0f));
				assert_true(isfinite(y[i]));
				double err = fabs((double)x[i] - (double)y[i]);

				if (!(err <= (double)s * (0.5 + 0x1p-14) + 0x1p-142))
					fail_msg("%s B=%u: x=%a y=%a s=%a", variants[v], P.block,
						 (double)x[i], (double)y[i], (double)s);
			}
		}
	}
	mp_codec_params_default(&P);
	assert_int_equal(mp_k_force("auto"), 0);
	free(x);
	free(y);
	free(amax);
	free(wire);
}

/*
 * uniform8, two properties.
 *
 * Each table entry is the mean of the sampled finite inputs coded to it
 * (index a multiple of U8_SAMPLE), so it lies between their smallest and
 * largest (the double sum is exact enough, and rounding the mean to float
 * cannot cross a float bound); a bucket without such an input holds its
 * centre, (float)(lo + (b + 0.5) step), even if unsampled inputs use it.
 *
 * For x in [lo, lo + 256 step) whose code b is 1..254: every finite input
 * coded b has t = fl(fl(x - lo) * inv) in [b, b + 1), so its true
 * (x - lo) / step lies in [b, b + 1) up to three roundings of 2^-24 relative
 * on values up to 256, plus the absolute rounding of x - lo (half an ulp of
 * the larger of |x|, |lo|, |lo + 256 step|). The bucket therefore spans less
 * than step (1 + 2^-10) + 2 ulp. Its entry is the mean of some of its own
 * inputs, or its centre (rounded once more, by at most half such an ulp):
 * both inside the bucket, so |x - table[b]| stays within that bound. Codes
 * 0 and 255 also collect the inputs clamped from outside the range, so
 * their means can sit further out: for those only the first property holds.
 * (The spec's "|err| <= step inside the range" is true for the interior
 * codes only.)
 */
static void test_uniform8_bound(void **state)
{
	enum { N = 70001 };
	float *x = xmalloc(N * sizeof(float)), *y = xmalloc(N * sizeof(float));
	unsigned char *wire = xmalloc(1024 + N), *want = xmalloc(1024 + N);
	static const float sig[] = {6.0f, 3.0f, 1.0f, 20.0f};
	float bmin[256], bmax[256], table[256];
	size_t used[256], centred = 0;
	struct u8_ref info;
	size_t len;

	(void)state;
	for (int shape = 0; shape < 3; shape++) {
		for (size_t i = 0; i < N; i++)
			x[i] = shape == 0 ? gauss() : shape == 1 ? (float)rndu() * 100.0f - 20.0f
							       : gauss() * gauss() * 1e-20f;
		for (size_t si = 0; si < sizeof(sig) / sizeof(sig[0]); si++) {
			P.sigmas = sig[si];
			ref_uniform8(x, N, P.sigmas, want, &info);
			assert_false(info.degenerate);
			float hi = (float)((double)info.lo + 256.0 * info.step);
			size_t inside = 0;

			for (size_t v = 0; v < NVAR; v++) {
				if (!use_variant(variants[v]))
					continue;
				int r = mp_codec_uniform8.encode(&P, x, NULL, N, wire, 1024 + N, &len, NULL);

				assert_int_equal(r, 0);
				assert_int_equal(mp_codec_uniform8.decode(wire, len, y, N), 0);
				memcpy(table, wire, 1024);
				for (int b = 0; b < 256; b++) {
					bmin[b] = INFINITY;
					bmax[b] = -INFINITY;
					used[b] = 0;
				}
				for (size_t i = 0; i < N; i++) {
					unsigned b = wire[1024 + i];

					used[b]++;
					if (i % U8_SAMPLE)
						continue;
					bmin[b] = fminf(bmin[b], x[i]);
					bmax[b] = fmaxf(bmax[b], x[i]);
				}
				/* Buckets without a sample have bmin > bmax: their centre. */
				for (int b = 0; b < 256; b++) {
					float ctr = (float)((double)info.lo + (b + 0.5) * (double)info.step);

					if (bmin[b] > bmax[b]) {
						assert_true(table[b] == ctr);
						centred += used[b] > 0;
					} else {
						assert_true(table[b] >= bmin[b] && table[b] <= bmax[b]);
					}
				}
				for (size_t i = 0; i < N; i++) {
					unsigned b = wire[1024 + i];

					if (!(x[i] >= info.lo && x[i] < hi) || b == 0 || b == 255)
						continue;
					inside++;
					float m = fmaxf(fabsf(x[i]), fmaxf(fabsf(info.lo), fabsf(hi)));
					double ulp = (double)(nextafterf(m, INFINITY) - m);
					double err = fabs((double)x[i] - (double)y[i]);

					if (!(err <= (double)info.step * (1.0 + 0x1p-10) + 2.0 * ulp))
						fail_msg("%s k=%g: x=%a y=%a step=%a", variants[v],
							 (double)P.sigmas, (double)x[i], (double)y[i],
							 (double)info.step);
				}
			}
			assert_true(inside > 0);
		}
	}
	/* Some buckets were used by unsampled inputs only: the bound held for their centres. */
	assert_true(centred > 0);
	mp_codec_params_default(&P);
	assert_int_equal(mp_k_force("auto"), 0);
	free(x);
	free(y);
	free(wire);
	free(want);
}

/* ---- blockwise8's thresholds ---- */

/*
 * The step's cases are decided on the absmax's bits (mp_codec_params.h): each
 * threshold must be where the float arithmetic turns (checked here with
 * every operation rounded through memory, which no range analysis can fold),
 * and the encoder must give the reference's bytes on both sides of each, in
 * every variant.
 */
static void test_blockwise8_thresholds(void **state)
{
	const uint32_t edges[] = {MP_BW8_ZERO_STEP_MAX, MP_BW8_PRESCALE_MAX, MP_BW8_STEP_DOWN};
	enum { N = 16 };
	float x[N];
	unsigned char got[4 + 4 + N], want[4 + 4 + N];
	size_t len;

	(void)state;
	assert_true(rounded_f(bits_f32(MP_BW8_ZERO_STEP_MAX) / 127.0f) == 0.0f);
	assert_true(rounded_f(bits_f32(MP_BW8_ZERO_STEP_MAX + 1) / 127.0f) > 0.0f);
	assert_true(isinf(rounded_f(127.0f / bits_f32(MP_BW8_PRESCALE_MAX))));
	assert_true(isfinite(rounded_f(127.0f / bits_f32(MP_BW8_PRESCALE_MAX + 1))));
	assert_true(isinf(rounded_f(127.0f * rounded_f(bits_f32(MP_BW8_STEP_DOWN) / 127.0f))));
	assert_true(isfinite(rounded_f(127.0f * rounded_f(bits_f32(MP_BW8_STEP_DOWN - 1) / 127.0f))));
	mp_codec_params_default(&P);
	P.block = N;
	for (size_t v = 0; v < NVAR; v++) {
		if (!use_variant(variants[v]))
			continue;
		for (size_t e = 0; e < sizeof(edges) / sizeof(edges[0]); e++) {
			for (int d = -1; d <= 1; d++) {
				uint32_t ab = edges[e] + (uint32_t)d;

				if (ab >= 0x7f800000u)
					continue;
				float a = bits_f32(ab);

				/* a, -a and values below it, down to subnormal quotients. */
				for (size_t i = 0; i < N; i++)
					x[i] = rounded_f(a * ((float)((int)i - 7) / 8.0f));
				x[0] = -a;
				x[15] = a;
				assert_int_equal(mp_codec_blockwise8.encode(&P, x, NULL, N, got, sizeof(got), &len,
									   NULL),
						 0);
				assert_int_equal(len, ref_blockwise8(x, N, N, want));
				if (memcmp(got, want, len)) {
					print_error("%s: a bits 0x%08x: payload differs from the reference\n",
						    variants[v], (unsigned)ab);
					fail();
				}
			}
		}
	}
	mp_codec_params_default(&P);
}

/* ---- special values ---- */

static void encode_ok(const struct mp_codec_ops *c, const float *x, size_t n, unsigned char *wire,
		      size_t *len)
{
	assert_int_equal(c->encode(&P, x, NULL, n, wire, c->max_encoded(&P, n), len, NULL), 0);
	assert_int_equal(*len, c->max_encoded(&P, n));
}

static void test_special_values(void **state)
{
	enum { N = 300 };
	float x[N], y[N];
	unsigned char wire[1024 + 4 * N + 64];
	float table[256], s;
	size_t len;

	(void)state;
	for (size_t v = 0; v < NVAR; v++) {
		if (!use_variant(variants[v]))
			continue;

		/* uniform8: NaN takes mu's code, +-inf the end codes; nothing decodes non-finite. */
		for (size_t i = 0; i < N; i++)
			x[i] = (float)(i % 50) - 24.5f;
		x[7] = NAN;
		x[8] = INFINITY;
		x[9] = -INFINITY;
		x[10] = -NAN;
		encode_ok(&mp_codec_uniform8, x, N, wire, &len);
		memcpy(table, wire, 1024);
		for (int b = 0; b < 256; b++)
			assert_true(isfinite(table[b]));
		assert_int_equal(wire[1024 + 8], 255);
		assert_int_equal(wire[1024 + 9], 0);
		assert_int_equal(wire[1024 + 7], wire[1024 + 10]);
		/* mu of the finite values is about 0: NaN sits mid-range. */
		assert_true(wire[1024 + 7] >= 120 && wire[1024 + 7] <= 136);
		assert_int_equal(mp_codec_uniform8.decode(wire, len, y, N), 0);
		for (size_t i = 0; i < N; i++)
			assert_true(isfinite(y[i]));

		/* uniform8 degenerate: all equal, all zero, all NaN, no finite value at all. */
		for (int t = 0; t < 4; t++) {
			float val = t == 0 ? 3.25f : t == 1 ? 0.0f : NAN;

			for (size_t i = 0; i < N; i++)
				x[i] = t == 3 ? (i & 1 ? INFINITY : -INFINITY) : val;
			if (t == 0)
				x[3] = NAN; /* ignored by the statistics */
			encode_ok(&mp_codec_uniform8, x, N, wire, &len);
			memcpy(table, wire, 1024);
			for (size_t i = 0; i < N; i++)
				assert_int_equal(wire[1024 + i], 128);
			for (int b = 0; b < 256; b++)
				assert_true(table[b] == (t == 0 ? 3.25f : 0.0f));
		}
		/* Subnormals only: the step underflows, so degenerate (table = mu). */
		for (size_t i = 0; i < N; i++)
			x[i] = bits_f32((uint32_t)i * 977u % 0x7fffffu);
		encode_ok(&mp_codec_uniform8, x, N, wire, &len);
		for (size_t i = 0; i < N; i++)
			assert_int_equal(wire[1024 + i], 128);
		/* Huge values: the range would not fit in a float, so degenerate, still finite. */
		for (size_t i = 0; i < N; i++)
			x[i] = i & 1 ? 3e38f : -3e38f;
		encode_ok(&mp_codec_uniform8, x, N, wire, &len);
		memcpy(table, wire, 1024);
		for (int b = 0; b < 256; b++)
			assert_true(isfinite(table[b]));
		assert_int_equal(mp_codec_uniform8.decode(wire, len, y, N), 0);
		/* Huge but narrow: the table tops out below FLT_MAX. */
		for (size_t i = 0; i < N; i++)
			x[i] = 3e38f + (float)(i % 7) * 1e31f;
		encode_ok(&mp_codec_uniform8, x, N, wire, &len);
		memcpy(table, wire, 1024);
		for (int b = 0; b < 256; b++)
			assert_true(isfinite(table[b]));

		/* blockwise8: NaN -> 0, +-inf -> +-127 with the step of the finite values. */
		P.block = 16;
		for (size_t i = 0; i < 32; i++)
			x[i] = (float)i - 8.0f;
		x[2] = NAN;
		x[3] = INFINITY;
		x[4] = -INFINITY;
		encode_ok(&mp_codec_blockwise8, x, 32, wire, &len);
		memcpy(&s, wire + 4, 4);
		assert_true(s == 8.0f / 127.0f); /* |-8| is the largest finite value of block 0 */
		assert_int_equal((int8_t)wire[12 + 2], 0);
		assert_int_equal((int8_t)wire[12 + 3], 127);
		assert_int_equal((int8_t)wire[12 + 4], -127);
		assert_int_equal((int8_t)wire[12 + 0], -127);
		/* A block of only non-finite values: step 0, codes 0. */
		for (size_t i = 16; i < 32; i++)
			x[i] = i & 1 ? NAN : -INFINITY;
		encode_ok(&mp_codec_blockwise8, x, 32, wire, &len);
		memcpy(&s, wire + 8, 4);
		assert_true(s == 0.0f);
		for (size_t i = 16; i < 32; i++)
			assert_int_equal(wire[12 + i], 0);
		/* All zero, and -0.0: step 0, codes 0, decode +-0 exactly 0. */
		for (size_t i = 0; i < 32; i++)
			x[i] = i & 1 ? -0.0f : 0.0f;
		encode_ok(&mp_codec_blockwise8, x, 32, wire, &len);
		assert_int_equal(mp_codec_blockwise8.decode(wire, len, y, 32), 0);
		for (size_t i = 0; i < 32; i++)
			assert_true(y[i] == 0.0f);
		/*
		 * Absmax near FLT_MAX: fl(a / 127) can round up so far that
		 * 127 * s overflows (for a = FLT_MAX only); the spec then sends
		 * the next float below, so +-a come back finite and within the
		 * bound. Floats from FLT_MAX down to 0.99 FLT_MAX, so that both
		 * steps are taken.
		 */
		int bumped = 0, plain = 0;

		for (uint32_t ab = f32_bits(FLT_MAX); bits_f32(ab) >= 0.99f * FLT_MAX; ab -= 1u + (ab & 0x3fff)) {
			float a = bits_f32(ab), fs = a / 127.0f;

			for (size_t i = 0; i < 32; i++)
				x[i] = (float)i - 8.0f;
			x[0] = a;
			x[1] = -a;
			encode_ok(&mp_codec_blockwise8, x, 32, wire, &len);
			memcpy(&s, wire + 4, 4);
			assert_true(s == ref_bw8_step(a));
			assert_true(s == fs || s == nextafterf(fs, 0.0f));
			bumped += s != fs;
			plain += s == fs;
			assert_int_equal((int8_t)wire[12], 127);
			assert_int_equal((int8_t)wire[13], -127);
			assert_int_equal(mp_codec_blockwise8.decode(wire, len, y, 32), 0);
			assert_true(y[0] == rounded_f(127.0f * s) && y[1] == -y[0]);
			assert_true(isfinite(y[0]));
			assert_true(s == fs || y[0] <= a); /* the lower step never overshoots */
			assert_true(fabs((double)a - (double)y[0]) <= (double)s * (0.5 + 0x1p-14));
		}
		assert_true(bumped > 0 && plain > 0);
		/* Tiny blocks, where 127/a overflows: codes still follow x/s. */
		for (size_t i = 0; i < 32; i++)
			x[i] = bits_f32((uint32_t)(i * 1000u + 1u)); /* subnormals */
		encode_ok(&mp_codec_blockwise8, x, 32, wire, &len);
		assert_int_equal((int8_t)wire[12 + 15], 127);
		assert_int_equal((int8_t)wire[12 + 0], 0);
		assert_int_equal((int8_t)wire[12 + 7], (int)lrint(7001.0 / 15001.0 * 127.0));
		mp_codec_params_default(&P);

		/* bf16 specials go through the oracle in test_bf16_encode_oracle; decode of NaN keeps it. */
		const float bs[6] = {NAN, -INFINITY, 3.4e38f, -FLT_TRUE_MIN, 1e-40f, -0.0f};

		encode_ok(&mp_codec_bf16, bs, 6, wire, &len);
		assert_int_equal(mp_codec_bf16.decode(wire, len, y, 6), 0);
		assert_true(isnan(y[0]));
		assert_true(y[1] == -bits_f32(0x7f7f0000u));
		assert_true(y[2] == bits_f32(0x7f7f0000u));
		assert_true(y[3] == 0.0f && signbit(y[3]));
		assert_true(y[4] == bits_f32(0x00010000u)); /* 1e-40 = 0x000116c2 -> 0x0001 */
		assert_true(y[5] == 0.0f && signbit(y[5]));
	}
	assert_int_equal(mp_k_force("auto"), 0);
}

/*
 * uniform8's table comes from the elements at multiples of U8_SAMPLE only.
 * (1) Swapping unsampled elements of the same statistics lane (i and i + 16)
 * keeps the statistics exactly (the values are multiples of 1/64, so every
 * sum is exact), moves codes, and must leave the table as it was. (2) With
 * every sampled element 1.0 and the others +-2, the table holds 1.0 for the
 * bucket of 1.0 and the bare centres for the buckets of +-2, which the
 * unsampled values still decode to within a step.
 */
static void test_uniform8_sample(void **state)
{
	enum { N = 64 * U8_SAMPLE * 4 + 5 };
	float *x = xmalloc(N * sizeof(float)), *y = xmalloc(N * sizeof(float));
	unsigned char *w1 = xmalloc(1024 + N), *w2 = xmalloc(1024 + N), *want = xmalloc(1024 + N);
	struct u8_ref info;
	size_t len, moved = 0;

	(void)state;
	for (size_t i = 0; i < N; i++)
		x[i] = (float)(int)(gauss() * 64.0f) / 64.0f;
	for (size_t v = 0; v < NVAR; v++) {
		if (!use_variant(variants[v]))
			continue;
		encode_ok(&mp_codec_uniform8, x, N, w1, &len);
		for (size_t i = 0; i + 16 < N; i++) {
			if (i % 32 >= 1 && i % 32 < 16) {
				float t = x[i];

				x[i] = x[i + 16];
				x[i + 16] = t;
			}
		}
		encode_ok(&mp_codec_uniform8, x, N, w2, &len);
		assert_memory_equal(w1, w2, 1024);
		moved += memcmp(w1 + 1024, w2 + 1024, N) != 0;
	}
	assert_true(moved > 0);

	for (size_t i = 0; i < N; i++)
		x[i] = i % U8_SAMPLE == 0 ? 1.0f : i & 1 ? 2.0f : -2.0f;
	ref_uniform8(x, N, P.sigmas, want, &info);
	assert_false(info.degenerate);
	for (size_t v = 0; v < NVAR; v++) {
		if (!use_variant(variants[v]))
			continue;
		float table[256];

		encode_ok(&mp_codec_uniform8, x, N, w1, &len);
		assert_memory_equal(w1, want, len);
		memcpy(table, w1, 1024);
		assert_true(table[w1[1024]] == 1.0f);
		for (int k = 1; k <= 2; k++) {
			unsigned b = w1[1024 + k];
			float ctr = (float)((double)info.lo + (b + 0.5) * (double)info.step);

			assert_true(b != w1[1024]);
			assert_true(table[b] == ctr);
		}
		assert_int_equal(mp_codec_uniform8.decode(w1, len, y, N), 0);
		for (size_t i = 0; i < N; i++)
			assert_true(fabsf(y[i] - x[i]) <= info.step);
	}
	assert_int_equal(mp_k_force("auto"), 0);
	free(x);
	free(y);
	free(w1);
	free(w2);
	free(want);
}

/* ---- malformed payloads ---- */

#define SENTINEL 0xa5

/* Decode and decode_acc both refuse with -EBADMSG and leave the output alone. */
static void expect_bad(const struct mp_codec_ops *c, const void *pl, size_t len, size_t count)
{
	static float out[512];
	unsigned char ref[sizeof(out)];

	memset(out, SENTINEL, sizeof(out));
	memset(ref, SENTINEL, sizeof(ref));
	if (c->decode(pl, len, out, count) != -EBADMSG)
		fail_msg("%s: decode accepted len %zu count %zu", c->name, len, count);
	assert_memory_equal(out, ref, sizeof(out));
	if (c->decode_acc(pl, len, out, count, 1.0f) != -EBADMSG)
		fail_msg("%s: decode_acc accepted len %zu count %zu", c->name, len, count);
	assert_memory_equal(out, ref, sizeof(out));
}

static void expect_good(const struct mp_codec_ops *c, const void *pl, size_t len, size_t count)
{
	static float out[512];

	assert_int_equal(c->decode(pl, len, out, count), 0);
	assert_int_equal(c->decode_acc(pl, len, out, count, 1.0f), 0);
}

static void test_malformed(void **state)
{
	enum { N = 37 };
	const struct mp_codec_ops *all[3] = {&mp_codec_bf16, &mp_codec_uniform8, &mp_codec_blockwise8};
	float x[N];
	unsigned char *wire = xmalloc(4096), *bad = xmalloc(4096);
	size_t len;

	(void)state;
	memset(wire, 0, 4096);
	for (size_t i = 0; i < N; i++)
		x[i] = gauss();
	P.block = 8; /* 5 blocks */
	for (size_t v = 0; v < NVAR; v++) {
		if (!use_variant(variants[v]))
			continue;
		for (int c = 0; c < 3; c++) {
			assert_int_equal(all[c]->encode(&P, x, NULL, N, wire, 4096, &len, NULL), 0);
			expect_good(all[c], wire, len, N);
			/* Every wrong length up to 8 past the right one (same bytes, from offset 1 too). */
			for (size_t l = 0; l <= len + 8; l++) {
				if (l == len)
					continue;
				expect_bad(all[c], wire, l, N);
				memcpy(bad + 1, wire, len + 8);
				expect_bad(all[c], bad + 1, l, N);
			}
			/* Counts that cannot fit, with lengths that overflow when computed naively. */
			expect_bad(all[c], wire, len, SIZE_MAX);
			expect_bad(all[c], wire, len, SIZE_MAX / 2 + 1);
			expect_bad(all[c], wire, len, SIZE_MAX / 4 + 1);
			expect_bad(all[c], wire, len, N + 1);
			expect_bad(all[c], wire, len, N - 1);
		}

		/* uniform8: non-finite table entries anywhere; truncated tables. */
		assert_int_equal(mp_codec_uniform8.encode(&P, x, NULL, N, wire, 4096, &len, NULL), 0);
		static const int where[] = {0, 1, 127, 254, 255};
		const float nonfinite[4] = {NAN, -NAN, INFINITY, -INFINITY};

		for (int wi = 0; wi < 5; wi++) {
			for (int k = 0; k < 4; k++) {
				memcpy(bad, wire, len);
				memcpy(bad + 4 * where[wi], &nonfinite[k], 4);
				expect_bad(&mp_codec_uniform8, bad, len, N);
			}
			/* A signalling-NaN pattern too. */
			memcpy(bad, wire, len);
			memcpy(bad + 4 * where[wi], &(uint32_t){0x7f800001u}, 4);
			expect_bad(&mp_codec_uniform8, bad, len, N);
		}
		expect_bad(&mp_codec_uniform8, wire, 0, 0);
		expect_bad(&mp_codec_uniform8, wire, 1020, 0);
		expect_bad(&mp_codec_uniform8, wire, 1023, 0);
		expect_good(&mp_codec_uniform8, wire, 1024, 0);
		memcpy(bad, wire, 1024);
		memcpy(bad + 1020, &(float){INFINITY}, 4);
		expect_bad(&mp_codec_uniform8, bad, 1024, 0); /* checked even when nothing is decoded */

		/* blockwise8: block out of range, bad steps. */
		assert_int_equal(mp_codec_blockwise8.encode(&P, x, NULL, N, wire, 4096, &len, NULL), 0);
		assert_int_equal(len, 4 + 4 * 5 + N);
		static const uint32_t badB[] = {0, (1u << 24) + 1, 0xffffffffu, 0x80000000u};

		for (size_t k = 0; k < sizeof(badB) / sizeof(badB[0]); k++) {
			memcpy(bad, wire, len);
			memcpy(bad, &badB[k], 4);
			expect_bad(&mp_codec_blockwise8, bad, len, N);
		}
		/* A different valid B changes the block count, so the length no longer fits. */
		memcpy(bad, wire, len);
		memcpy(bad, &(uint32_t){7}, 4);
		expect_bad(&mp_codec_blockwise8, bad, len, N);
		memcpy(bad, &(uint32_t){1u << 24}, 4);
		expect_bad(&mp_codec_blockwise8, bad, len, N);
		const float badstep[] = {
			NAN, -NAN, INFINITY, -INFINITY, -1.0f, -FLT_MIN, -FLT_TRUE_MIN, -FLT_MAX,
		};

		for (size_t b = 0; b < 5; b++) {
			for (size_t k = 0; k < sizeof(badstep) / sizeof(badstep[0]); k++) {
				memcpy(bad, wire, len);
				memcpy(bad + 4 + 4 * b, &badstep[k], 4);
				expect_bad(&mp_codec_blockwise8, bad, len, N);
			}
		}
		/* Steps of 0 and -0.0 are zero, not negative: accepted. */
		memcpy(bad, wire, len);
		memcpy(bad + 8, &(float){0.0f}, 4);
		memcpy(bad + 12, &(float){-0.0f}, 4);
		expect_good(&mp_codec_blockwise8, bad, len, N);
		/* Code -128 is never produced; with an ordinary step it decodes to
		 * a finite value and is taken. */
		bad[len - 1] = 0x80;
		expect_good(&mp_codec_blockwise8, bad, len, N);
		/* The largest step an encoder writes (a = FLT_MAX) is taken, and
		 * code 127 decodes to a finite value; the next step up, or the
		 * 7.1e36 libFuzzer found, would decode 127 to infinity: refused.
		 * Code -128 under a step where 128 * step overflows would decode to
		 * -inf: refused too, in the last block and in the first. */
		{
			const float smax = ref_bw8_step(FLT_MAX);
			const size_t last = 4 + 4 * 4, c0 = 4 + 4 * 5; /* block 4's step, block 0's codes */
			static float out[N];

			assert_true(isinf(128.0f * smax) && !isinf(127.0f * smax));
			memcpy(bad, wire, len);
			memcpy(bad + last, &smax, 4);
			bad[len - 1] = 127;
			assert_int_equal(mp_codec_blockwise8.decode(bad, len, out, N), 0);
			assert_true(isfinite(out[N - 1]) && out[N - 1] == 127.0f * smax);
			bad[len - 1] = 0x80;
			expect_bad(&mp_codec_blockwise8, bad, len, N);
			memcpy(bad + last, &(float){nextafterf(smax, INFINITY)}, 4);
			bad[len - 1] = 127;
			expect_bad(&mp_codec_blockwise8, bad, len, N);
			memcpy(bad + last, &(float){7.1e36f}, 4);
			expect_bad(&mp_codec_blockwise8, bad, len, N);
			memcpy(bad, wire, len);
			memcpy(bad + 4, &smax, 4);
			bad[c0 + 7] = 0x80; /* the last code of block 0 */
			expect_bad(&mp_codec_blockwise8, bad, len, N);
			bad[c0 + 8] = 0x80; /* block 1's first code, its step ordinary */
			bad[c0 + 7] = 0;
			expect_good(&mp_codec_blockwise8, bad, len, N);
		}
		memcpy(bad, wire, len);
		/* count == 0: exactly the block field. */
		memcpy(bad, &(uint32_t){4096}, 4);
		expect_good(&mp_codec_blockwise8, bad, 4, 0);
		expect_bad(&mp_codec_blockwise8, bad, 8, 0);
		expect_bad(&mp_codec_blockwise8, bad, 3, 0);
		memcpy(bad, &(uint32_t){0}, 4);
		expect_bad(&mp_codec_blockwise8, bad, 4, 0);
		/* bf16: count 0 takes exactly 0 bytes. */
		expect_good(&mp_codec_bf16, wire, 0, 0);
		expect_bad(&mp_codec_bf16, wire, 1, 0);
		expect_bad(&mp_codec_bf16, wire, 2, 0);
	}
	mp_codec_params_default(&P);
	assert_int_equal(mp_k_force("auto"), 0);
	free(wire);
	free(bad);
}

/* ---- encode: -ENOSPC and -EINVAL ---- */

static void test_encode_errors(void **state)
{
	enum { N = 1000 };
	const struct mp_codec_ops *all[3] = {&mp_codec_bf16, &mp_codec_uniform8, &mp_codec_blockwise8};
	float x[N];
	unsigned char *wire = xmalloc(8192);
	size_t len;

	(void)state;
	for (size_t i = 0; i < N; i++)
		x[i] = gauss();
	for (int c = 0; c < 3; c++) {
		size_t need = all[c]->max_encoded(&P, N);

		assert_true(need + 16 <= 8192);
		for (size_t cap = 0; cap < need; cap += cap < 16 || cap + 16 > need ? 1 : 97) {
			memset(wire, SENTINEL, 8192);
			len = 12345;
			assert_int_equal(all[c]->encode(&P, x, NULL, N, wire, cap, &len, NULL), -ENOSPC);
			/* Nothing at all written, so certainly nothing past cap. */
			for (size_t i = 0; i < 8192; i++)
				assert_int_equal(wire[i], SENTINEL);
		}
		memset(wire, SENTINEL, 8192);
		assert_int_equal(all[c]->encode(&P, x, NULL, N, wire, need, &len, NULL), 0);
		assert_int_equal(len, need);
		assert_int_equal(wire[need], SENTINEL);
	}
	/* Unusable settings: -EINVAL from the codecs that have settings. */
	struct mp_codec_params bp;
	const struct mp_codec_ops *with[2] = {&mp_codec_uniform8, &mp_codec_blockwise8};

	for (int c = 0; c < 2; c++) {
		for (int k = 0; k < 6; k++) {
			mp_codec_params_default(&bp);
			switch (k) {
			case 0: bp.block = 0; break;
			case 1: bp.block = (1u << 24) + 1; break;
			case 2: bp.sigmas = 0.0f; break;
			case 3: bp.sigmas = NAN; break;
			case 4: bp.sigmas = -1.0f; break;
			default: bp.topk_ratio = 2.0f; break;
			}
			memset(wire, SENTINEL, 8192);
			assert_int_equal(with[c]->encode(&bp, x, NULL, N, wire, 8192, &len, NULL), -EINVAL);
			for (size_t i = 0; i < 8192; i++)
				assert_int_equal(wire[i], SENTINEL);
		}
		assert_int_equal(with[c]->encode(NULL, x, NULL, N, wire, 8192, &len, NULL), -EINVAL);
	}
	/* bf16 has no settings and does not look at them (like fp16). */
	assert_int_equal(mp_codec_bf16.encode(NULL, x, NULL, N, wire, 8192, &len, NULL), 0);
	/* The largest and smallest block sizes work. */
	mp_codec_params_default(&bp);
	bp.block = 1u << 24;
	assert_int_equal(mp_codec_blockwise8.encode(&bp, x, NULL, N, wire, 8192, &len, NULL), 0);
	assert_int_equal(len, 4 + 4 + N);
	bp.block = 1;
	assert_int_equal(mp_codec_blockwise8.max_encoded(&bp, N), 4 + 5 * N);
	free(wire);
}

static int setup(void **state)
{
	(void)state;
	mp_codec_params_default(&P);
	return 0;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_registry),
		cmocka_unit_test(test_bf16_decode_exhaustive),
		cmocka_unit_test(test_bf16_encode_oracle),
		cmocka_unit_test(test_bf16_roundtrip_bound),
		cmocka_unit_test(test_bf16_variants),
		cmocka_unit_test(test_uniform8_variants),
		cmocka_unit_test(test_blockwise8_variants),
		cmocka_unit_test(test_blockwise8_bound),
		cmocka_unit_test(test_blockwise8_thresholds),
		cmocka_unit_test(test_uniform8_bound),
		cmocka_unit_test(test_special_values),
		cmocka_unit_test(test_uniform8_sample),
		cmocka_unit_test(test_malformed),
		cmocka_unit_test(test_encode_errors),
	};

	return cmocka_run_group_tests(tests, setup, NULL);
}
