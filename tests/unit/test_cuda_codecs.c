/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The CUDA codec kernels (kernels/cuda) against the CPU codecs, which are
 * the reference:
 *  - encode: the same payload, byte for byte, for none, fp16, bf16,
 *    blockwise8 and topk (and topk's residue bit for bit); uniform8 within
 *    the stated bound (codes differ by at most 1, decoded values by at most
 *    two steps); adacomp with the same selection, signs and indices and a
 *    scale within one ulp (the residue follows the scale).
 *  - decode and decode_acc of any payload, valid or not: the same verdict
 *    as the CPU, the same values bit for bit (NaN compares as NaN: the GPU
 *    returns a canonical NaN where x86 keeps the payload), and an output
 *    left untouched on -EBADMSG.
 * Random data of awkward sizes with NaN, inf, subnormals and ties; payloads
 * and accumulators at misaligned device addresses; tight and too-small
 * capacities for the sparse codecs.
 *
 * Without a usable GPU: prints why and exits 77 (skipped).
 * `test_cuda_codecs --bench [count] [--json FILE]`: encode and
 * decode-and-accumulate GB/s per codec beside a device-to-device cudaMemcpy
 * of the same bytes, measured in the same run, and each as a percentage of
 * that copy (the copy's time over the kernel's); --json also writes them to
 * FILE (tools/gpu_check.sh reads it).
 */
#include <cuda_runtime_api.h>

#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <moshpit/moshpit.h>
#include "codec.h"
#include "mp_cuda_codecs.h"

static int failures;
static int verbose;

#define CHECK(cond, ...)                                                        \
	do {                                                                    \
		if (!(cond)) {                                                  \
			if (++failures <= 40) {                                 \
				printf("FAIL %s:%d: ", __FILE__, __LINE__);     \
				printf(__VA_ARGS__);                            \
				printf("\n");                                   \
			}                                                       \
		}                                                               \
	} while (0)

#define CU(call)                                                                              \
	do {                                                                                  \
		cudaError_t e_ = (call);                                                      \
		if (e_ != cudaSuccess) {                                                      \
			printf("CUDA error: %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, \
			       __LINE__);                                                     \
			exit(1);                                                              \
		}                                                                             \
	} while (0)

static const char *const names[] = {"none", "fp16", "bf16", "uniform8", "blockwise8", "topk",
				    "adacomp"};

/* ---- random numbers (fixed seed: a failure replays) ---- */

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static uint32_t rnd(void)
{
	rng ^= rng >> 12;
	rng ^= rng << 25;
	rng ^= rng >> 27;
	return (uint32_t)((rng * 0x2545f4914f6cdd1dull) >> 32);
}

static float unif(void)
{
	return (float)((rnd() >> 8) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}

static float gauss(void)
{
	double u = ((rnd() >> 8) + 0.5) / 16777216.0, v = (rnd() >> 8) / 16777216.0;

	return (float)(sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v));
}

static uint32_t f2u(float f)
{
	uint32_t u;

	memcpy(&u, &f, 4);
	return u;
}

static float u2f(uint32_t u)
{
	float f;

	memcpy(&f, &u, 4);
	return f;
}

enum kind { K_GAUSS, K_SPECIAL, K_CONST, K_TIES, K_TINY, K_HEAVY, K_NAN, NKINDS };

static const char *const kind_names[] = {"gauss", "special", "const", "ties", "tiny", "heavy", "nan"};

static void gen(float *x, size_t n, enum kind k)
{
	static const float specials[] = {0.0f, -0.0f, 65504.0f, -65520.0f, 70000.0f, 3.0e38f,
					 -3.4028235e38f, 1e-40f, -1e-45f, 6e-8f, 3e-5f, 1.0f};

	for (size_t i = 0; i < n; i++) {
		switch (k) {
		case K_GAUSS:
			x[i] = gauss();
			break;
		case K_SPECIAL: {
			uint32_t r = rnd() % 64;

			if (r == 0)
				x[i] = NAN;
			else if (r == 1)
				x[i] = u2f(0xffc12345u); /* negative NaN with a payload */
			else if (r == 2)
				x[i] = INFINITY;
			else if (r == 3)
				x[i] = -INFINITY;
			else if (r < 8)
				x[i] = specials[rnd() % (sizeof(specials) / sizeof(specials[0]))];
			else
				x[i] = unif() * 4.0f;
			break;
		}
		case K_CONST:
			x[i] = 0.3f;
			break;
		case K_TIES:
			x[i] = (float)((int)(rnd() % 9) - 4) * 0.25f;
			break;
		case K_TINY:
			x[i] = gauss() * 1e-38f; /* subnormals; blockwise8's 2^64 prescale */
			break;
		case K_HEAVY: {
			float g = gauss();

			x[i] = g * g * g * 10.0f;
			break;
		}
		default:
			x[i] = (rnd() & 1) ? NAN : INFINITY;
			break;
		}
	}
}

/* ---- device buffers ---- */

static void *dalloc(size_t bytes)
{
	void *p = NULL;

	CU(cudaMalloc(&p, bytes ? bytes : 1));
	return p;
}

static void h2d(void *d, const void *h, size_t bytes)
{
	if (bytes)
		CU(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
}

static void d2h(void *h, const void *d, size_t bytes)
{
	if (bytes)
		CU(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost));
}

static void *xmalloc(size_t bytes)
{
	void *p = malloc(bytes ? bytes : 1);

	if (!p) {
		printf("out of memory\n");
		exit(1);
	}
	return p;
}

/* Same value, NaN-aware: the GPU's NaN results are canonical. */
static int same_f(float a, float b)
{
	return f2u(a) == f2u(b) || (a != a && b != b);
}

/* ---- decoding: the GPU must agree with the CPU on every payload ---- */

static size_t n_decodes, n_rejects;

/*
 * Decodes @pl (len bytes, count n) on both sides, accumulating into a copy
 * of @acc0 with weight @w and (when @plain) decoding into a filled buffer.
 * The GPU payload sits @poff bytes into its buffer, the output @aoff floats.
 */
static void cmp_decode(int codec, const uint8_t *pl, size_t len, size_t n, const float *acc0, float w,
		       size_t poff, size_t aoff, int plain, const char *what)
{
	const struct mp_codec_ops *ops = mp_codec_by_id((unsigned)codec);
	float *ac = xmalloc(n * 4), *ag = xmalloc(n * 4);
	uint8_t *dp = dalloc(len + poff);
	float *da = dalloc((n + aoff) * 4);
	int rc, rg;

	h2d(dp + poff, pl, len);
	memcpy(ac, acc0, n * 4);
	h2d(da + aoff, acc0, n * 4);
	rc = ops->decode_acc(pl, len, ac, n, w);
	rg = mp_cuda_decode_acc(codec, dp + poff, len, da + aoff, n, w, NULL);
	CU(cudaDeviceSynchronize());
	d2h(ag, da + aoff, n * 4);
	n_decodes++;
	n_rejects += rc != 0;
	CHECK(rc == rg, "%s %s decode_acc n=%zu len=%zu: cpu %d gpu %d", names[codec], what, n, len,
	      rc, rg);
	for (size_t i = 0; i < n; i++) {
		int ok = rc ? f2u(ag[i]) == f2u(acc0[i]) : same_f(ac[i], ag[i]);

		if (!ok) {
			CHECK(0, "%s %s decode_acc n=%zu [%zu]: cpu %a gpu %a (acc0 %a, rc %d)", names[codec],
			      what, n, i, ac[i], ag[i], acc0[i], rc);
			break;
		}
	}
	if (plain) {
		for (size_t i = 0; i < n; i++)
			ac[i] = ag[i] = u2f(0x7fa5a5a5u); /* a pattern no decoder writes */
		h2d(da + aoff, ag, n * 4);
		rc = ops->decode(pl, len, ac, n);
		rg = mp_cuda_decode(codec, dp + poff, len, da + aoff, n, NULL);
		CU(cudaDeviceSynchronize());
		d2h(ag, da + aoff, n * 4);
		CHECK(rc == rg, "%s %s decode n=%zu: cpu %d gpu %d", names[codec], what, n, rc, rg);
		for (size_t i = 0; i < n; i++) {
			if (f2u(ac[i]) != f2u(ag[i])) {
				CHECK(0, "%s %s decode n=%zu [%zu]: cpu %a gpu %a", names[codec], what, n, i,
				      ac[i], ag[i]);
				break;
			}
		}
	}
	CU(cudaFree(dp));
	CU(cudaFree(da));
	free(ac);
	free(ag);
}

/* ---- malformed payloads ---- */

static void put32(uint8_t *p, uint32_t v)
{
	memcpy(p, &v, 4);
}

static uint32_t get32(const uint8_t *p)
{
	uint32_t v;

	memcpy(&v, p, 4);
	return v;
}

/* Runs cmp_decode on @pl with bytes [at, at + k) replaced by @rep (k' bytes). */
static void splice(int codec, const uint8_t *pl, size_t len, size_t at, size_t k, const uint8_t *rep,
		   size_t kr, size_t n, const float *acc0, const char *what)
{
	size_t nl = len - k + kr;
	uint8_t *b = xmalloc(nl);

	memcpy(b, pl, at);
	memcpy(b + at, rep, kr);
	memcpy(b + at + kr, pl + at + k, len - at - k);
	cmp_decode(codec, b, nl, n, acc0, 0.75f, rnd() % 5, rnd() % 2, 0, what);
	free(b);
}

static void set_word(int codec, const uint8_t *pl, size_t len, size_t at, uint32_t v, size_t n,
		     const float *acc0, const char *what)
{
	uint8_t w[4];

	if (at + 4 > len)
		return;
	put32(w, v);
	splice(codec, pl, len, at, 4, w, 4, n, acc0, what);
}

/* Start of the varints of a valid sparse payload. */
static size_t varint_start(int codec, const uint8_t *pl)
{
	if (codec == MP_CODEC_TOPK)
		return 4 + 4 * (size_t)get32(pl);
	return 12 + ((size_t)get32(pl + 8) + 7) / 8;
}

static void malformed(int codec, const uint8_t *pl, size_t len, size_t n, const float *acc0)
{
	uint8_t z[8] = {0};

	/* Lengths: one short, one or four long, every prefix of a short payload. */
	if (len)
		cmp_decode(codec, pl, len - 1, n, acc0, 0.5f, 1, 0, 1, "cut1");
	splice(codec, pl, len, len, 0, z, 1, n, acc0, "+1");
	splice(codec, pl, len, len, 0, z, 4, n, acc0, "+4");
	if (len <= 40)
		for (size_t l = 0; l + 1 < len; l++)
			cmp_decode(codec, pl, l, n, acc0, 0.5f, 0, 0, 0, "prefix");
	/* Random bytes. */
	for (int r = 0; r < 24 && len; r++) {
		uint8_t b = (uint8_t)(r % 3 == 0 ? 0x80 : r % 3 == 1 ? 0x00 : rnd());

		splice(codec, pl, len, rnd() % len, 1, &b, 1, n, acc0, "byte");
	}
	switch (codec) {
	case MP_CODEC_UNIFORM8:
		set_word(codec, pl, len, 4 * (rnd() % 256), 0x7fc00000u, n, acc0, "table NaN");
		set_word(codec, pl, len, 4 * (rnd() % 256), 0xff800000u, n, acc0, "table -inf");
		break;
	case MP_CODEC_BLOCKWISE8: {
		uint32_t B = get32(pl);
		size_t nb = (len - 4 - n) / 4;

		set_word(codec, pl, len, 0, 0, n, acc0, "B 0");
		set_word(codec, pl, len, 0, (1u << 24) + 1, n, acc0, "B big");
		set_word(codec, pl, len, 0, B + 1, n, acc0, "B+1");
		set_word(codec, pl, len, 0, B > 1 ? B - 1 : 2, n, acc0, "B-1");
		if (nb) {
			size_t at = 4 + 4 * (rnd() % nb);

			set_word(codec, pl, len, at, f2u(-1.0f), n, acc0, "step -1");
			set_word(codec, pl, len, at, 0x7fc00000u, n, acc0, "step NaN");
			set_word(codec, pl, len, at, 0x7f800000u, n, acc0, "step inf");
			set_word(codec, pl, len, at, 0x80000000u, n, acc0, "step -0");
			/* The largest step an encoder writes is taken; above it code 127
			 * would decode to inf (the 7.1e36 libFuzzer found): refused. */
			float smax = FLT_MAX / 127.0f;

			if (isinf(127.0f * smax))
				smax = nextafterf(smax, 0.0f);

			set_word(codec, pl, len, at, f2u(smax), n, acc0, "step max");
			set_word(codec, pl, len, at, f2u(nextafterf(smax, INFINITY)), n, acc0, "step max+");
			set_word(codec, pl, len, at, f2u(7.1e36f), n, acc0, "step 7.1e36");
			/* Code -128 under block 0's step of smax would decode to -inf: refused. */
			if (n && len >= 8) {
				uint8_t *b = xmalloc(len);

				memcpy(b, pl, len);
				put32(b + 4, f2u(smax));
				b[4 + 4 * nb] = 0x80;
				cmp_decode(codec, b, len, n, acc0, 0.75f, 0, 0, 0, "step max, code -128");
				free(b);
			}
		}
		break;
	}
	case MP_CODEC_TOPK:
	case MP_CODEC_ADACOMP: {
		size_t vs = varint_start(codec, pl);
		uint32_t k = get32(pl + (codec == MP_CODEC_TOPK ? 0 : 8));
		static const uint8_t over5[] = {0x80, 0x80, 0x80, 0x80, 0x10};
		static const uint8_t ok5[] = {0x80, 0x80, 0x80, 0x80, 0x00};
		static const uint8_t run6[] = {0x81, 0x80, 0x80, 0x80, 0x80, 0x01};
		static const uint8_t noncanon[] = {0x80, 0x00};
		uint8_t big[5];
		size_t nb = 0;
		uint32_t v = (uint32_t)n;

		do { /* the varint of n: one past the last index */
			big[nb++] = (uint8_t)(v | (v >= 0x80 ? 0x80 : 0));
			v >>= 7;
		} while (v);
		if (codec == MP_CODEC_TOPK) {
			set_word(codec, pl, len, 0, k + 1, n, acc0, "K+1");
			set_word(codec, pl, len, 0, (uint32_t)n + 1, n, acc0, "K>n");
			if (k)
				set_word(codec, pl, len, 4 + 4 * (rnd() % k), 0xff800000u, n, acc0,
					 "value -inf");
		} else {
			set_word(codec, pl, len, 0, 0, n, acc0, "bin 0");
			set_word(codec, pl, len, 0, (1u << 24) + 1, n, acc0, "bin big");
			set_word(codec, pl, len, 4, 0x7fc00000u, n, acc0, "scale NaN");
			set_word(codec, pl, len, 4, f2u(-1.0f), n, acc0, "scale -1");
			set_word(codec, pl, len, 4, 0x7f800000u, n, acc0, "scale inf");
			set_word(codec, pl, len, 4, 0x80000000u, n, acc0, "scale -0");
			set_word(codec, pl, len, 8, k + 1, n, acc0, "nsel+1");
			set_word(codec, pl, len, 8, (uint32_t)n + 1, n, acc0, "nsel>n");
			if (k % 8) {
				uint8_t b = (uint8_t)(pl[vs - 1] | 0x80);

				splice(codec, pl, len, vs - 1, 1, &b, 1, n, acc0, "padding bit");
			}
		}
		if (len > vs) {
			/* Replace the first varint (its length: bytes up to the first terminator). */
			size_t f = 0;

			while (vs + f < len && (pl[vs + f] & 0x80))
				f++;
			f++;
			splice(codec, pl, len, vs, f, over5, sizeof(over5), n, acc0, "5th byte > 0x0f");
			splice(codec, pl, len, vs, f, ok5, sizeof(ok5), n, acc0, "5-byte zero");
			splice(codec, pl, len, vs, f, run6, sizeof(run6), n, acc0, "6-byte run");
			splice(codec, pl, len, vs, f, noncanon, sizeof(noncanon), n, acc0, "non-canonical");
			splice(codec, pl, len, vs, f, big, nb, n, acc0, "index n");
			big[0] ^= 1; /* n - 1 or n + 1 */
			splice(codec, pl, len, vs, f, big, nb, n, acc0, "index n+-1");
			uint8_t c = (uint8_t)(pl[len - 1] | 0x80);

			splice(codec, pl, len, len - 1, 1, &c, 1, n, acc0, "last continues");
			c = 0x80; /* all K varints intact, then a cut-off one */
			splice(codec, pl, len, len, 0, &c, 1, n, acc0, "trailing 0x80");
			splice(codec, pl, len, len - 1, 1, z, 0, n, acc0, "last dropped");
		}
		break;
	}
	default:
		break;
	}
}

/* ---- encode comparisons ---- */

static void first_diff(const char *what, const uint8_t *a, const uint8_t *b, size_t len)
{
	for (size_t i = 0; i < len; i++) {
		if (a[i] != b[i]) {
			printf("  %s: first difference at byte %zu: cpu %02x gpu %02x\n", what, i, a[i], b[i]);
			return;
		}
	}
}

static size_t u8_code_diffs, u8_payloads_exact, u8_payloads;

static void cmp_uniform8(const float *x, size_t n, const uint8_t *cp, const uint8_t *gp, float sigmas,
			 const char *tag)
{
	float tc[256], tg[256];
	double s = 0, q = 0;
	size_t nf = 0, diff = 0;

	memcpy(tc, cp, 1024);
	memcpy(tg, gp, 1024);
	for (size_t i = 0; i < n; i++) {
		if (isfinite(x[i])) {
			s += x[i];
			q += (double)x[i] * x[i];
			nf++;
		}
	}
	double mu = nf ? s / (double)nf : 0.0, var = nf ? q / (double)nf - mu * mu : 0.0;
	double step = 2.0 * sigmas * sqrt(var > 0 ? var : 0) / 256.0;

	for (size_t i = 0; i < n; i++) {
		int a = cp[1024 + i], b = gp[1024 + i];
		float dc = tc[a], dg = tg[b];
		double lim = 2.0 * step * 1.0001 + 1e-6 * fmax(fabs(dc), fabs(dg));

		if (a != b)
			diff++;
		if (abs(a - b) > 1) {
			CHECK(0, "uniform8 %s n=%zu [%zu]: codes cpu %d gpu %d", tag, n, i, a, b);
			break;
		}
		if ((a == b || (a > 0 && a < 255 && b > 0 && b < 255)) && fabs((double)dc - dg) > lim) {
			CHECK(0, "uniform8 %s n=%zu [%zu]: decoded cpu %a gpu %a (codes %d %d, step %g)", tag,
			      n, i, dc, dg, a, b, step);
			break;
		}
	}
	u8_code_diffs += diff;
	u8_payloads++;
	u8_payloads_exact += !diff && !memcmp(cp, gp, 1024);
}

static size_t ada_scale_exact, ada_payloads;

static void cmp_adacomp(const uint8_t *cp, const uint8_t *gp, size_t len, const float *rc,
			const float *rg, size_t n, const char *tag)
{
	uint32_t sc = get32(cp + 4), sg = get32(gp + 4);
	int64_t d = (int64_t)sc - (int64_t)sg;
	float ds = fabsf(u2f(sc) - u2f(sg));

	CHECK(!memcmp(cp, gp, 4) && !memcmp(cp + 8, gp + 8, len - 8),
	      "adacomp %s n=%zu: selection, signs or indices differ", tag, n);
	CHECK(d >= -1 && d <= 1, "adacomp %s n=%zu: scale cpu %a gpu %a", tag, n, u2f(sc), u2f(sg));
	ada_payloads++;
	ada_scale_exact += sc == sg;
	if (!rc)
		return;
	for (size_t i = 0; i < n; i++) {
		if (f2u(rc[i]) == f2u(rg[i]))
			continue;
		if (sc == sg || fabsf(rc[i] - rg[i]) > 2.0f * ds + 1e-6f * fabsf(rc[i])) {
			CHECK(0, "adacomp %s n=%zu: residue [%zu] cpu %a gpu %a", tag, n, i, rc[i], rg[i]);
			break;
		}
	}
}

struct tcase {
	int codec;
	struct mp_codec_params prm;
	size_t n;
	enum kind kind;
	int with_res;  /* residue for topk / adacomp */
	int tight;     /* cap = the CPU's length exactly (sparse: the not-in-place path) */
	size_t poff;   /* device payload offset (bytes) */
	size_t aoff;   /* device accumulator offset (floats) */
	int mutate;
};

/* Encodes on both sides and compares; returns 0 if both encoders succeeded. */
static int cmp_encode(const struct tcase *tc, const float *x, const float *r0, float *rc, uint8_t *cp,
		      size_t cap, size_t *clen, uint8_t *gp, size_t *glen, const char *tag)
{
	const struct mp_codec_ops *ops = mp_codec_by_id((unsigned)tc->codec);
	const size_t n = tc->n;
	size_t cs = ops->scratch_size ? ops->scratch_size(&tc->prm, n) : 0;
	size_t gs = mp_cuda_scratch_size(tc->codec, &tc->prm, n);
	void *cscr = aligned_alloc(64, (cs + 63) / 64 * 64 + 64);
	float *res = tc->with_res ? rc : NULL, *rg = xmalloc(n * 4);
	float *dx = dalloc(n * 4), *dr = dalloc(n * 4);
	uint8_t *dp = dalloc(cap + 16);
	void *ds = dalloc(gs);
	int rcpu, rgpu = -1;

	memcpy(rc, r0, n * 4);
	rcpu = ops->encode(&tc->prm, x, res, n, cp, cap, clen, cscr);
	CHECK(rcpu == 0, "%s %s cpu encode n=%zu: %d", names[tc->codec], tag, n, rcpu);
	h2d(dx, x, n * 4);
	h2d(dr, r0, n * 4);
	/* A capacity one short must fail cleanly and leave the residue alone. */
	if (!rcpu && tc->tight && *clen) {
		int r = mp_cuda_encode(tc->codec, &tc->prm, dx, tc->with_res ? dr : NULL, n, dp + tc->poff,
				       *clen - 1, glen, ds, gs, NULL);

		CU(cudaDeviceSynchronize());
		CHECK(r == -ENOSPC, "%s %s n=%zu: cap len-1 gave %d", names[tc->codec], tag, n, r);
		d2h(rg, dr, n * 4);
		CHECK(!memcmp(rg, r0, n * 4), "%s %s n=%zu: residue changed by a failed encode",
		      names[tc->codec], tag, n);
	}
	if (!rcpu) {
		rgpu = mp_cuda_encode(tc->codec, &tc->prm, dx, tc->with_res ? dr : NULL, n, dp + tc->poff,
				      tc->tight ? *clen : cap, glen, ds, gs, NULL);
		CU(cudaDeviceSynchronize());
		CHECK(rgpu == 0, "%s %s gpu encode n=%zu: %d", names[tc->codec], tag, n, rgpu);
	}
	if (!rgpu) {
		CHECK(*glen == *clen, "%s %s n=%zu: length cpu %zu gpu %zu", names[tc->codec], tag, n,
		      *clen, *glen);
		d2h(gp, dp + tc->poff, *glen < cap ? *glen : cap);
		d2h(rg, dr, n * 4);
	}
	if (!rgpu && *glen == *clen) {
		switch (tc->codec) {
		case MP_CODEC_UNIFORM8:
			cmp_uniform8(x, n, cp, gp, tc->prm.sigmas, tag);
			break;
		case MP_CODEC_ADACOMP:
			cmp_adacomp(cp, gp, *clen, res, tc->with_res ? rg : NULL, n, tag);
			break;
		default:
			if (memcmp(cp, gp, *clen)) {
				CHECK(0, "%s %s n=%zu: payloads differ", names[tc->codec], tag, n);
				first_diff(names[tc->codec], cp, gp, *clen);
			}
			break;
		}
		/* topk's residue is exact; the dense codecs must leave it alone, as the CPU does. */
		if (tc->codec != MP_CODEC_ADACOMP && tc->with_res)
			CHECK(!memcmp(rc, rg, n * 4), "%s %s n=%zu: residues differ", names[tc->codec], tag,
			      n);
		/* The CPU must accept what the GPU wrote. */
		CHECK(ops->decode(gp, *glen, rg, n) == 0, "%s %s n=%zu: cpu rejects the gpu payload",
		      names[tc->codec], tag, n);
	}
	CU(cudaFree(dx));
	CU(cudaFree(dr));
	CU(cudaFree(dp));
	CU(cudaFree(ds));
	free(cscr);
	free(rg);
	return rcpu || rgpu;
}

static void run_case(const struct tcase *tc)
{
	const struct mp_codec_ops *ops = mp_codec_by_id((unsigned)tc->codec);
	const size_t n = tc->n;
	float *x = xmalloc(n * 4), *r0 = xmalloc(n * 4), *rc = xmalloc(n * 4), *acc0 = xmalloc(n * 4);
	size_t cap = ops->max_encoded(&tc->prm, n), clen = 0, glen = 0;
	uint8_t *cp = xmalloc(cap), *gp = xmalloc(cap);
	char tag[96];

	snprintf(tag, sizeof(tag), "%s/%s%s%s", kind_names[tc->kind], tc->with_res ? "res" : "nores",
		 tc->tight ? "/tight" : "", tc->poff ? "/misaligned" : "");
	gen(x, n, tc->kind);
	for (size_t i = 0; i < n; i++) {
		r0[i] = (rnd() % 4) ? unif() * 0.01f : 0.0f;
		acc0[i] = unif();
	}
	CHECK(mp_cuda_max_encoded(tc->codec, &tc->prm, n) == cap, "%s max_encoded n=%zu: %zu vs %zu",
	      names[tc->codec], n, mp_cuda_max_encoded(tc->codec, &tc->prm, n), cap);
	if (!cmp_encode(tc, x, r0, rc, cp, cap, &clen, gp, &glen, tag)) {
		/* Decoding the CPU's payload, and (where it differs) the GPU's. */
		cmp_decode(tc->codec, cp, clen, n, acc0, -0.625f, tc->poff, tc->aoff, 1, tag);
		if (glen == clen && memcmp(cp, gp, clen))
			cmp_decode(tc->codec, gp, glen, n, acc0, 1.5f, 0, 0, 1, tag);
		if (tc->mutate)
			malformed(tc->codec, cp, clen, n, acc0);
	}
	free(x);
	free(r0);
	free(rc);
	free(acc0);
	free(cp);
	free(gp);
}

/* One status word guards several payloads: after a bad one, nothing is written. */
static void test_async_status(void)
{
	const size_t n = 1000;
	uint8_t *bad = xmalloc(1024 + n);
	uint16_t *h = xmalloc(2 * n);
	float *a0 = xmalloc(4 * n), *a1 = xmalloc(4 * n);
	uint8_t *dbad = dalloc(1024 + n), *dh = dalloc(2 * n);
	float *da = dalloc(4 * n);
	uint32_t *dst = dalloc(4), st = 0;

	memset(bad, 0, 1024 + n);
	put32(bad + 4 * 17, 0x7fc00000u); /* a NaN table entry */
	for (size_t i = 0; i < n; i++) {
		h[i] = 0x3c00; /* 1.0 */
		a0[i] = (float)i;
	}
	h2d(dbad, bad, 1024 + n);
	h2d(dh, h, 2 * n);
	h2d(da, a0, 4 * n);
	CU(cudaMemset(dst, 0, 4));
	CHECK(mp_cuda_decode_async(MP_CODEC_UNIFORM8, dbad, 1024 + n, da, n, 1.0f, 1, dst, NULL, 0, NULL) ==
		      0,
	      "async uniform8 queue");
	CHECK(mp_cuda_decode_async(MP_CODEC_FP16, dh, 2 * n, da, n, 1.0f, 1, dst, NULL, 0, NULL) == 0,
	      "async fp16 queue");
	CU(cudaDeviceSynchronize());
	d2h(&st, dst, 4);
	d2h(a1, da, 4 * n);
	CHECK(st == MP_CUDA_BAD, "async status %u", st);
	CHECK(!memcmp(a0, a1, 4 * n), "async: a guarded decode wrote after a bad payload");
	CHECK(mp_cuda_decode_async(MP_CODEC_FP16, dh, 2 * n - 1, da, n, 1.0f, 1, dst, NULL, 0, NULL) ==
		      -EBADMSG,
	      "async length check");
	CHECK(mp_cuda_decode_acc(99, dh, 2 * n, da, n, 1.0f, NULL) == -EINVAL, "unknown codec");
	CU(cudaFree(dbad));
	CU(cudaFree(dh));
	CU(cudaFree(da));
	CU(cudaFree(dst));
	free(bad);
	free(h);
	free(a0);
	free(a1);
}

static int run_tests(void)
{
	static const size_t sizes[] = {0,  1,   2,    3,    7,    8,    15,    16,    17,    31,
				       33, 255, 1000, 4095, 4096, 4097, 12345, 65537, 300001};
	static const uint32_t blocks[] = {1, 3, 4, 16, 17, 100, 256, 1000, 4096, 4097, 10000, 65536};
	static const uint32_t bins[] = {1, 7, 50, 500, 4096, 5000, 100000};
	static const float ratios[] = {0.001f, 0.01f, 0.3f, 1.0f};
	struct tcase tc;

	test_async_status();
	for (int codec = 0; codec <= MP_CODEC_ADACOMP; codec++) {
		size_t before = (size_t)failures;
		unsigned variants = codec == MP_CODEC_BLOCKWISE8 ? 12 : codec >= MP_CODEC_TOPK ? 8 : 2;

		for (size_t si = 0; si < sizeof(sizes) / sizeof(sizes[0]); si++) {
			for (unsigned v = 0; v < variants; v++) {
				memset(&tc, 0, sizeof(tc));
				mp_codec_params_default(&tc.prm);
				tc.codec = codec;
				tc.n = sizes[si];
				tc.kind = (enum kind)((si + v) % NKINDS);
				tc.prm.block = blocks[(si + v) % (sizeof(blocks) / sizeof(blocks[0]))];
				tc.prm.bin = bins[(si * 3 + v) % (sizeof(bins) / sizeof(bins[0]))];
				tc.prm.topk_ratio = ratios[(si + v) % (sizeof(ratios) / sizeof(ratios[0]))];
				tc.prm.sigmas = (v & 1) ? 3.0f : 6.0f;
				tc.with_res = (v & 1) == 0;
				tc.tight = codec >= MP_CODEC_TOPK && (v & 2);
				tc.poff = (v % 3 == 2) ? 1 + rnd() % 3 : 0;
				tc.aoff = (v % 4 == 3) ? 1 : 0;
				tc.mutate = v < 2 && tc.n <= 4097;
				if (verbose)
					printf("  %s n=%zu kind=%s\n", names[codec], tc.n, kind_names[tc.kind]);
				run_case(&tc);
			}
		}
		printf("%-10s %s\n", names[codec], (size_t)failures == before ? "ok" : "FAILED");
	}
	printf("decodes compared: %zu (%zu rejected by both)\n", n_decodes, n_rejects);
	printf("uniform8: %zu/%zu payloads identical to the cpu's, %zu codes off by one\n",
	       u8_payloads_exact, u8_payloads, u8_code_diffs);
	printf("adacomp: %zu/%zu scales identical to the cpu's\n", ada_scale_exact, ada_payloads);
	return failures ? 1 : 0;
}

/* ---- throughput ---- */

static double elapsed_ms(cudaEvent_t a, cudaEvent_t b)
{
	float ms = 0;

	CU(cudaEventElapsedTime(&ms, a, b));
	return ms;
}

static int run_bench(size_t n, const char *json)
{
	FILE *jf = NULL;
	int first = 1;
	const int iters = 20;
	float *hx = xmalloc(n * 4);
	float *dx, *dr, *da;
	uint8_t *dp;
	cudaEvent_t e0, e1;
	struct mp_codec_params prm;
	double gb = (double)n * 4 / 1e9;

	mp_codec_params_default(&prm);
	for (size_t i = 0; i < n; i++)
		hx[i] = gauss();
	dx = dalloc(n * 4);
	dr = dalloc(n * 4);
	da = dalloc(n * 4);
	dp = dalloc(n * 4 + 4096);
	h2d(dx, hx, n * 4);
	CU(cudaMemset(dr, 0, n * 4));
	CU(cudaMemset(da, 0, n * 4));
	CU(cudaEventCreate(&e0));
	CU(cudaEventCreate(&e1));

	CU(cudaMemcpy(da, dx, n * 4, cudaMemcpyDeviceToDevice));
	CU(cudaEventRecord(e0, NULL));
	for (int i = 0; i < iters; i++)
		CU(cudaMemcpy(da, dx, n * 4, cudaMemcpyDeviceToDevice));
	CU(cudaEventRecord(e1, NULL));
	CU(cudaEventSynchronize(e1));
	double t = elapsed_ms(e0, e1) / iters;

	if (json && !(jf = fopen(json, "w"))) {
		printf("cannot write %s: %s\n", json, strerror(errno));
		return 1;
	}
	printf("count %zu (%.0f MiB of fp32)\n", n, n * 4 / 1048576.0);
	printf("cudaMemcpy D2D of the same bytes: %.1f GB/s copied (%.1f GB/s read + write)\n",
	       gb / (t / 1e3), 2 * gb / (t / 1e3));
	printf("GB/s below: fp32 values in (encode) or out (decode_acc) per second; \"moved\" counts\n"
	       "what decode_acc reads and writes (payload + accumulator twice). Sparse encodes\n"
	       "include their wait for the length; decodes are queued back to back. %% of copy:\n"
	       "the time of the D2D copy of the same fp32 bytes over the kernel's time.\n");
	printf("%-10s %12s %12s %8s %14s %8s %14s\n", "codec", "bytes/value", "encode GB/s",
	       "% copy", "dec_acc GB/s", "% copy", "dec_acc moved");
	if (jf)
		fprintf(jf, "{\n  \"count\": %zu,\n  \"bytes\": %zu,\n  \"iters\": %d,\n"
			"  \"d2d_copy_ms\": %.6f,\n  \"d2d_copy_gbs\": %.3f,\n"
			"  \"d2d_copy_rw_gbs\": %.3f,\n  \"codecs\": [\n", n, n * 4, iters, t,
			gb / (t / 1e3), 2 * gb / (t / 1e3));
	for (int c = 0; c <= MP_CODEC_ADACOMP; c++) {
		size_t gs = mp_cuda_scratch_size(c, &prm, n), len = 0;
		void *ds = dalloc(gs);
		float *res = c >= MP_CODEC_TOPK ? dr : NULL;
		size_t cap = mp_cuda_max_encoded(c, &prm, n);
		int r = mp_cuda_encode(c, &prm, dx, res, n, dp, cap, &len, ds, gs, NULL);

		CU(cudaDeviceSynchronize());
		if (r) {
			printf("%-10s encode failed: %d\n", names[c], r);
			if (jf) {
				fprintf(jf, "%s    {\"codec\": \"%s\", \"error\": %d}", first ? "" : ",\n",
					names[c], r);
				first = 0;
			}
			CU(cudaFree(ds));
			continue;
		}
		CU(cudaEventRecord(e0, NULL));
		for (int i = 0; i < iters; i++)
			mp_cuda_encode(c, &prm, dx, res, n, dp, cap, &len, ds, gs, NULL);
		CU(cudaEventRecord(e1, NULL));
		CU(cudaEventSynchronize(e1));
		double te = elapsed_ms(e0, e1) / iters;

		/* The queue-only decoder with its status word and scratch set up once: kernel time. */
		size_t dsz = mp_cuda_decode_scratch_size(c, len, n);
		void *dds = dalloc(dsz);
		uint32_t *dst = dalloc(4), st = 0;

		CU(cudaMemset(dst, 0, 4));
		CU(cudaEventRecord(e0, NULL));
		for (int i = 0; i < iters; i++)
			mp_cuda_decode_async(c, dp, len, da, n, 1e-3f, 1, dst, dds, dsz, NULL);
		CU(cudaEventRecord(e1, NULL));
		CU(cudaEventSynchronize(e1));
		double td = elapsed_ms(e0, e1) / iters;

		d2h(&st, dst, 4);
		if (st)
			printf("%-10s decode rejected its own payload\n", names[c]);
		CU(cudaFree(dds));
		CU(cudaFree(dst));

		/* GB/s of fp32 values in (encode) / out (decode); "moved": payload + acc read + write. */
		printf("%-10s %12.3f %12.1f %7.0f%% %14.1f %7.0f%% %14.1f\n", names[c], (double)len / n,
		       gb / (te / 1e3), 100.0 * t / te, gb / (td / 1e3), 100.0 * t / td,
		       ((double)len / 1e9 + 2 * gb) / (td / 1e3));
		if (jf) {
			fprintf(jf, "%s    {\"codec\": \"%s\", \"bytes_per_value\": %.4f, "
				"\"encode_ms\": %.6f, \"encode_gbs\": %.3f, \"encode_pct_of_copy\": %.1f, "
				"\"decode_acc_ms\": %.6f, \"decode_acc_gbs\": %.3f, "
				"\"decode_acc_pct_of_copy\": %.1f, \"decode_rejected\": %s}",
				first ? "" : ",\n", names[c], (double)len / n, te, gb / (te / 1e3),
				100.0 * t / te, td, gb / (td / 1e3), 100.0 * t / td, st ? "true" : "false");
			first = 0;
		}
		CU(cudaFree(ds));
	}
	CU(cudaFree(dx));
	CU(cudaFree(dr));
	CU(cudaFree(da));
	CU(cudaFree(dp));
	free(hx);
	if (jf) {
		fprintf(jf, "\n  ]\n}\n");
		if (fclose(jf)) {
			printf("cannot write %s: %s\n", json, strerror(errno));
			return 1;
		}
	}
	return 0;
}

int main(int argc, char **argv)
{
	char why[256];

	if (mp_cuda_available(why, sizeof(why))) {
		printf("skipped: %s\n", why);
		return 77;
	}
	if (argc > 1 && !strcmp(argv[1], "--bench")) {
		size_t count = (size_t)64 << 20;
		const char *json = NULL;

		for (int i = 2; i < argc; i++) {
			if (!strcmp(argv[i], "--json") && i + 1 < argc)
				json = argv[++i];
			else if (argv[i][0] >= '1' && argv[i][0] <= '9')
				count = (size_t)strtoull(argv[i], NULL, 0);
			else {
				printf("usage: test_cuda_codecs [-v] | --bench [count] [--json FILE]\n");
				return 2;
			}
		}
		return run_bench(count, json);
	}
	verbose = argc > 1 && !strcmp(argv[1], "-v");
	return run_tests();
}
