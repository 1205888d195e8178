/* SPDX-License-Identifier: BSD-3-Clause */
/* Codec registry, the "none" and "fp16" codecs, and their length checks. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <moshpit/moshpit.h>
#include "codec.h"
#include "mp_kernels.h"

static const char *const variants[] = {"scalar", "avx2", "avx512"};
#define NVAR (sizeof(variants) / sizeof(variants[0]))

static uint64_t rng_state = 0x243f6a8885a308d3ull;

static uint32_t rnd32(void)
{
	rng_state ^= rng_state >> 12;
	rng_state ^= rng_state << 25;
	rng_state ^= rng_state >> 27;
	return (uint32_t)((rng_state * 0x2545f4914f6cdd1dull) >> 32);
}

/* Uniform in [-r, r). */
static float rndf(float r)
{
	return ((float)rnd32() / 4294967296.0f * 2.0f - 1.0f) * r;
}

static const struct mp_codec_params P = {
	.block = MP_CODEC_DEF_BLOCK, .sigmas = MP_CODEC_DEF_SIGMAS,
	.topk_ratio = MP_CODEC_DEF_TOPK, .bin = MP_CODEC_DEF_BIN_FC,
};

static void test_registry(void **state)
{
	static const char *const names[] = {"none", "fp16", "bf16", "uniform8", "blockwise8",
					    "topk", "adacomp"};
	struct mp_codec_params d;

	(void)state;
	assert_int_equal(mp_codec_count(), 7);
	for (unsigned i = 0; i < mp_codec_count(); i++) {
		const struct mp_codec_ops *c = mp_codec_by_id(i);

		assert_non_null(c);
		assert_int_equal(c->id, i);
		assert_string_equal(c->name, names[i]);
		assert_ptr_equal(mp_codec_by_name(c->name), c);
		assert_int_equal(mp_codec_from_name(c->name), (int)i);
		assert_string_equal(mp_codec_name((int)i), names[i]);
		assert_non_null(c->max_encoded);
		assert_non_null(c->encode);
		assert_non_null(c->decode);
		assert_non_null(c->decode_acc);
		/* Only the sparse codecs keep error feedback; all but none are lossy. */
		assert_int_equal(!!(c->flags & MP_CODEC_F_SPARSE),
				 i == MP_CODEC_TOPK || i == MP_CODEC_ADACOMP);
		assert_int_equal(!!(c->flags & MP_CODEC_F_LOSSY), i != MP_CODEC_NONE);
	}
	assert_null(mp_codec_by_id(7));
	assert_null(mp_codec_by_id(255));
	assert_ptr_equal(mp_codec_by_name("FP16"), mp_codec_by_id(MP_CODEC_FP16));
	assert_null(mp_codec_by_name("fp8"));
	assert_null(mp_codec_by_name("auto")); /* a policy, not a wire codec */
	assert_null(mp_codec_by_name(""));
	assert_null(mp_codec_by_name(NULL));
	assert_int_equal(mp_codec_from_name("auto"), MP_CODEC_AUTO);
	assert_int_equal(mp_codec_from_name("AUTO"), MP_CODEC_AUTO);
	assert_string_equal(mp_codec_name(MP_CODEC_AUTO), "auto");
	assert_string_equal(mp_codec_name(77), "?");
	assert_string_equal(mp_codec_name(-1), "?");
	assert_int_equal(mp_codec_from_name("fp8"), -EINVAL);
	assert_int_equal(mp_codec_from_name(""), -EINVAL);
	assert_int_equal(mp_codec_from_name(NULL), -EINVAL);
	assert_int_equal(mp_codec_by_id(MP_CODEC_NONE)->max_encoded(&P, 1000), 4000);
	assert_int_equal(mp_codec_by_id(MP_CODEC_FP16)->max_encoded(&P, 1000), 2000);
	assert_int_equal(mp_codec_by_id(MP_CODEC_NONE)->max_encoded(&P, 0), 0);

	mp_codec_params_default(&d);
	assert_int_equal(mp_codec_params_check(&d), 0);
	assert_int_equal(d.block, 4096);
	assert_int_equal(d.bin, 500);
	d.topk_ratio = 0.0f;
	assert_int_equal(mp_codec_params_check(&d), -EINVAL);
	d.topk_ratio = NAN;
	assert_int_equal(mp_codec_params_check(&d), -EINVAL);
	d.topk_ratio = 1.0f;
	assert_int_equal(mp_codec_params_check(&d), 0);
	d.block = 0;
	assert_int_equal(mp_codec_params_check(&d), -EINVAL);
	d.block = 1;
	d.sigmas = -1.0f;
	assert_int_equal(mp_codec_params_check(&d), -EINVAL);
	d.sigmas = 3.0f;
	d.bin = (1u << 24) + 1;
	assert_int_equal(mp_codec_params_check(&d), -EINVAL);
	assert_int_equal(mp_codec_params_check(NULL), -EINVAL);
}

static void test_varint(void **state)
{
	static const uint32_t vals[] = {0, 1, 127, 128, 16383, 16384, 2097151, 2097152,
					268435455, 268435456, UINT32_MAX};
	uint8_t b[8];
	uint32_t v;

	(void)state;
	for (size_t i = 0; i < sizeof(vals) / sizeof(vals[0]); i++) {
		size_t n = mp_varint_put(b, vals[i]);

		assert_int_equal(n, mp_varint_len(vals[i]));
		assert_int_equal(mp_varint_get(b, b + n, &v), n);
		assert_int_equal(v, vals[i]);
		/* Truncated: never read past the end. */
		assert_int_equal(mp_varint_get(b, b + n - 1, &v), 0);
	}
	/* Six bytes, or a fifth byte with bits beyond 32: malformed. */
	memset(b, 0xff, sizeof(b));
	assert_int_equal(mp_varint_get(b, b + 8, &v), 0);
	b[4] = 0x10;
	assert_int_equal(mp_varint_get(b, b + 8, &v), 0);
	b[4] = 0x0f;
	assert_int_equal(mp_varint_get(b, b + 8, &v), 5);
	assert_int_equal(v, UINT32_MAX);
}

static void test_none_roundtrip(void **state)
{
	enum { N = 1031 };
	const struct mp_codec_ops *c = mp_codec_by_id(MP_CODEC_NONE);
	float src[N], dst[N];
	unsigned char wire[4 * N + 8];
	size_t len = 0;

	(void)state;
	for (size_t i = 0; i < N; i++) {
		uint32_t u = rnd32();

		memcpy(&src[i], &u, 4);
	}
	/* Stateless codecs ignore the residue. */
	assert_int_equal(c->encode(&P, src, NULL, N, wire, sizeof(wire), &len, NULL), 0);
	assert_int_equal(len, 4 * N);
	assert_memory_equal(wire, src, 4 * N); /* little-endian fp32 == host bytes here */
	assert_int_equal(c->decode(wire, len, dst, N), 0);
	assert_memory_equal(dst, src, sizeof(src));
	assert_int_equal(c->encode(&P, src, NULL, N, wire, 4 * N - 1, &len, NULL), -ENOSPC);

	/* Misaligned payloads decode the same. */
	memmove(wire + 1, wire, 4 * N);
	memset(dst, 0, sizeof(dst));
	assert_int_equal(c->decode(wire + 1, 4 * N, dst, N), 0);
	assert_memory_equal(dst, src, sizeof(src));
	assert_int_equal(c->encode(&P, src, NULL, N, wire + 3, 4 * N, &len, NULL), 0);
	assert_memory_equal(wire + 3, src, 4 * N);
	/* Empty runs are fine. */
	assert_int_equal(c->encode(&P, src, NULL, 0, wire, 0, &len, NULL), 0);
	assert_int_equal(len, 0);
	assert_int_equal(c->decode(wire, 0, dst, 0), 0);
	assert_int_equal(c->decode_acc(wire, 0, dst, 0, 1.0f), 0);
}

static void test_none_decode_acc(void **state)
{
	enum { N = 5000 }; /* more than one bounce-buffer step */
	const struct mp_codec_ops *c = mp_codec_by_id(MP_CODEC_NONE);
	static float src[N], acc[N], acc0[N];
	static unsigned char wire[4 * N + 4];
	size_t len;

	(void)state;
	for (size_t i = 0; i < N; i++) {
		src[i] = rndf(100.0f);
		acc0[i] = rndf(100.0f);
	}
	for (int off = 0; off < 4; off++) {
		assert_int_equal(c->encode(&P, src, NULL, N, wire + off, 4 * N, &len, NULL), 0);
		memcpy(acc, acc0, sizeof(acc));
		assert_int_equal(c->decode_acc(wire + off, len, acc, N, 0.25f), 0);
		for (size_t i = 0; i < N; i++) {
			/* Same operations as the kernel: product rounded, then the add. */
			volatile float p = 0.25f * src[i];
			float want = acc0[i] + p;

			assert_true(acc[i] == want);
		}
	}
}

static void test_fp16_roundtrip_bound(void **state)
{
	enum { N = 20011 };
	const struct mp_codec_ops *c = mp_codec_by_id(MP_CODEC_FP16);
	static float src[N], dst[N], ref[N];
	static unsigned char wire[2 * N + 2];
	size_t len = 0;

	(void)state;
	for (size_t i = 0; i < N; i++) {
		/* Log-uniform magnitudes across the normal fp16 range. */
		float m = ldexpf(1.0f + rndf(1.0f) * 0.5f + 0.5f, (int)(rnd32() % 29) - 14);

		src[i] = (rnd32() & 1) ? -m : m;
	}
	for (size_t v = 0; v < NVAR; v++) {
		if (mp_k_force(variants[v]))
			continue;
		for (int off = 0; off < 2; off++) {
			assert_int_equal(c->encode(&P, src, NULL, N, wire + off, sizeof(wire) - off, &len, NULL), 0);
			assert_int_equal(len, 2 * N);
			assert_int_equal(c->decode(wire + off, len, dst, N), 0);
			for (size_t i = 0; i < N; i++) {
				float a = fabsf(src[i]);

				if (a > 65504.0f) {
					assert_true(fabsf(dst[i]) == 65504.0f);
					continue;
				}
				/* Relative error at most 2^-11 (half an fp16 ulp) within range. */
				assert_true(fabsf(dst[i] - src[i]) <= a * 0x1p-11f);
			}
			if (v == 0 && off == 0)
				memcpy(ref, dst, sizeof(ref));
			else
				assert_memory_equal(dst, ref, sizeof(ref));
		}
	}
	assert_int_equal(mp_k_force("auto"), 0);

	/* Clamping, NaN and signed zero through the codec. */
	const float special[6] = {1e6f, -1e6f, INFINITY, -INFINITY, NAN, -0.0f};
	float out[6];
	uint16_t w16[6];

	assert_int_equal(c->encode(&P, special, NULL, 6, w16, sizeof(w16), &len, NULL), 0);
	assert_int_equal(c->decode(w16, len, out, 6), 0);
	assert_true(out[0] == 65504.0f && out[1] == -65504.0f);
	assert_true(out[2] == 65504.0f && out[3] == -65504.0f);
	assert_true(isnan(out[4]));
	assert_true(out[5] == 0.0f && signbit(out[5]));
	/* Little-endian on the wire: 1.0 is 0x3c00 -> bytes 00 3c. */
	const float one = 1.0f;
	unsigned char b[2];

	assert_int_equal(c->encode(&P, &one, NULL, 1, b, 2, &len, NULL), 0);
	assert_int_equal(b[0], 0x00);
	assert_int_equal(b[1], 0x3c);
	assert_int_equal(c->encode(&P, src, NULL, 10, wire, 19, &len, NULL), -ENOSPC);
}

static void test_fp16_decode_acc(void **state)
{
	enum { N = 9001 };
	const struct mp_codec_ops *c = mp_codec_by_id(MP_CODEC_FP16);
	static float src[N], dec[N], acc[N], acc0[N];
	static unsigned char wire[2 * N + 2];
	size_t len;

	(void)state;
	for (size_t i = 0; i < N; i++) {
		src[i] = rndf(1000.0f);
		acc0[i] = rndf(1000.0f);
	}
	for (int off = 0; off < 2; off++) {
		assert_int_equal(c->encode(&P, src, NULL, N, wire + off, 2 * N, &len, NULL), 0);
		assert_int_equal(c->decode(wire + off, len, dec, N), 0);
		memcpy(acc, acc0, sizeof(acc));
		assert_int_equal(c->decode_acc(wire + off, len, acc, N, -0.5f), 0);
		for (size_t i = 0; i < N; i++) {
			volatile float p = -0.5f * dec[i];
			float want = acc0[i] + p;

			assert_true(acc[i] == want);
		}
	}
}

static void test_bad_lengths(void **state)
{
	float acc[8] = {0}, dst[8];
	unsigned char wire[64] = {0};

	(void)state;
	/* The dense codecs of this file; the others have their own tests. */
	for (unsigned id = 0; id <= MP_CODEC_FP16; id++) {
		const struct mp_codec_ops *c = mp_codec_by_id(id);
		size_t good = c->max_encoded(&P, 8);

		assert_int_equal(c->decode(wire, good, dst, 8), 0);
		assert_int_equal(c->decode_acc(wire, good, acc, 8, 1.0f), 0);
		const size_t bad[] = {0, 1, good - 1, good + 1, 2 * good, SIZE_MAX};

		for (size_t k = 0; k < sizeof(bad) / sizeof(bad[0]); k++) {
			assert_int_equal(c->decode(wire, bad[k], dst, 8), -EBADMSG);
			assert_int_equal(c->decode_acc(wire, bad[k], acc, 8, 1.0f), -EBADMSG);
		}
		/* A count whose size overflows size_t must not wrap around to "fits". */
		assert_int_equal(c->decode(wire, 0, dst, SIZE_MAX / 2 + 1), -EBADMSG);
		assert_int_equal(c->decode_acc(wire, 0, acc, SIZE_MAX / 2 + 1, 1.0f), -EBADMSG);
		assert_int_equal(c->decode(wire, 4, dst, 0), -EBADMSG);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_registry),
		cmocka_unit_test(test_varint),
		cmocka_unit_test(test_none_roundtrip),
		cmocka_unit_test(test_none_decode_acc),
		cmocka_unit_test(test_fp16_roundtrip_bound),
		cmocka_unit_test(test_fp16_decode_acc),
		cmocka_unit_test(test_bad_lengths),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
