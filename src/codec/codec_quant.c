/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The quantising codecs: bf16 (wire id 2), uniform8 (3) and blockwise8 (4).
 * Stateless and lossy; the per-element work is in kernels/cpu/quant.c.
 *
 *  bf16        count x u16: the top half of the fp32, rounded to nearest
 *              even. Half the bytes of fp32 with fp32's range, so unlike
 *              fp16 it needs no scaling and does not saturate gradients
 *              (beyond +-3.39e38, where it clamps instead of making inf).
 *  uniform8    f32 table[256], then count x u8 codes. The range mean +- k
 *              stddev of the finite inputs is cut into 256 equal buckets;
 *              each code decodes to the mean of the sampled inputs (every
 *              MP_KQ_U8_SAMPLE-th element of the chunk) that fell in its
 *              bucket (a cheap Lloyd step: little bias inside a bucket), or
 *              to the bucket's centre if none did. Values outside the range
 *              land in the end buckets. The sample keeps the table's exact,
 *              element-ordered sums from costing more than the codes.
 *  blockwise8  u32 block B, ceil(count/B) x f32 step, count x i8. Each block
 *              of B values is scaled by its own absmax, so an outlier only
 *              costs precision in its own block.
 *
 * All fields little endian, no alignment assumed. Decoders check the exact
 * length and every table entry / step before writing anything; a decoder
 * needs nothing but the payload and the element count.
 *
 * The encode rules (summation order of the uniform8 statistics, rounding,
 * clamping, the treatment of NaN and inf) are fixed by the codec spec so
 * that every kernel variant, and the CUDA kernels, produce the same bytes.
 * Where the spec leaves a case open it is settled here:
 *  - uniform8: the range must be representable: if lo, or lo + 256 * step,
 *    is not a finite float (inputs near +-3.4e38), the encoding is the
 *    degenerate one (every code 128, every table entry mu), like sd == 0.
 *    Without that, empty buckets would get non-finite table entries that
 *    every decoder rejects. NaN inputs take the code of (float)mu, and
 *    floor((x - lo) * inv) is clamped to [0, 255] as a float, so that a
 *    difference that overflows to inf saturates instead of converting.
 *  - blockwise8: where 127/a overflows although s = a/127 does not (absmax
 *    below 127/FLT_MAX, about 3.7e-37), the block is scaled by 2^64 first,
 *    which gives the codes the formula means (see quant.c). Where 127 * s
 *    overflows (of all floats only for absmax = FLT_MAX), s is the next
 *    float toward zero, so that no code decodes to inf (codec spec). Decoders take
 *    a step of -0.0 as zero, not as negative.
 */
#include "codec.h"
#include "quant.h"

#include <moshpit/moshpit.h>

#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "codec_quant.c assumes a little-endian host; add byte swapping for this one"
#endif

static inline int f32_finite(float f)
{
	uint32_t u;

	memcpy(&u, &f, sizeof(u));
	return (u & 0x7fffffffu) < 0x7f800000u;
}

/*
 * Forces @v to be rounded to double here: a product passed through it cannot
 * be fused into the subtraction that follows (-ffp-contract=off is the
 * build's default, but a file compiled without it must give the same bytes).
 */
static inline double rounded(double v)
{
	volatile double t = v;

	return t;
}

/* ---- bf16 ---- */

static size_t bf16_max_encoded(const struct mp_codec_params *p, size_t count)
{
	(void)p;
	return count > SIZE_MAX / 2 ? SIZE_MAX : 2 * count;
}

/* bf16 has no settings: @p is not looked at (as for fp16). */
static int bf16_encode(const struct mp_codec_params *p, const float *src, float *residue, size_t count,
		       void *dst, size_t cap, size_t *len, void *scratch)
{
	(void)p;
	(void)residue;
	(void)scratch;
	if (count > SIZE_MAX / 2 || cap < 2 * count)
		return -ENOSPC;
	mp_kq_bf16_encode(dst, src, count);
	*len = 2 * count;
	return 0;
}

static int bf16_check(size_t len, size_t count)
{
	return count > SIZE_MAX / 2 || len != 2 * count ? -EBADMSG : 0;
}

static int bf16_decode(const void *src, size_t len, float *dst, size_t count)
{
	int r = bf16_check(len, count);

	if (r)
		return r;
	mp_kq_bf16_decode(dst, src, count);
	return 0;
}

static int bf16_decode_acc(const void *src, size_t len, float *acc, size_t count, float weight)
{
	int r = bf16_check(len, count);

	if (r)
		return r;
	mp_kq_bf16_decode_acc(acc, src, weight, count);
	return 0;
}

/* ---- uniform8 ---- */

#define U8_TABLE (256 * sizeof(float))

static size_t u8_max_encoded(const struct mp_codec_params *p, size_t count)
{
	(void)p;
	return count > SIZE_MAX - U8_TABLE ? SIZE_MAX : U8_TABLE + count;
}

static void u8_fill(float *table, float v, uint8_t *codes, size_t count)
{
	for (int b = 0; b < 256; b++)
		table[b] = v;
	if (count)
		memset(codes, 128, count);
}

static int u8_encode(const struct mp_codec_params *p, const float *src, float *residue, size_t count,
		     void *dst, size_t cap, size_t *len, void *scratch)
{
	unsigned char *out = dst;
	uint8_t *codes = out + U8_TABLE;
	float table[256];
	double sum, sumsq;
	size_t nfin;

	(void)residue;
	(void)scratch;
	if (mp_codec_params_check(p))
		return -EINVAL;
	if (count > SIZE_MAX - U8_TABLE || cap < U8_TABLE + count)
		return -ENOSPC;

	mp_kq_u8_moments(src, count, &sum, &sumsq, &nfin);
	if (nfin == 0) {
		u8_fill(table, 0.0f, codes, count);
	} else {
		double mu = sum / (double)nfin;
		double var = sumsq / (double)nfin - rounded(mu * mu);
		double sd = sqrt(var > 0.0 ? var : 0.0);
		double k = p->sigmas;
		/* Out-of-range doubles become +-inf here (IEEE conversion), caught below. */
		float lo = (float)(mu - rounded(k * sd));
		float step = (float)(2.0 * k * sd / 256.0);

		if (sd == 0.0 || !(step >= FLT_MIN && step <= FLT_MAX) || !f32_finite(lo) ||
		    !f32_finite((float)((double)lo + 256.0 * (double)step))) {
			u8_fill(table, (float)mu, codes, count);
		} else {
			struct mp_kq_u8_bucket hist[256] = {{0, 0}};

			mp_kq_u8_quantize(codes, hist, src, count, lo, 1.0f / step, (float)mu, nfin == count);
			for (int b = 0; b < 256; b++) {
				/* (b + 0.5) * step is exact in double: nothing to fuse. */
				if (hist[b].count > 0.0)
					table[b] = (float)(hist[b].sum / hist[b].count);
				else
					table[b] = (float)((double)lo + (b + 0.5) * (double)step);
			}
		}
	}
	memcpy(out, table, U8_TABLE);
	*len = U8_TABLE + count;
	return 0;
}

/* Checks the payload; on success @table holds its (finite) entries. */
static int u8_check(const void *src, size_t len, size_t count, float *table)
{
	if (count > SIZE_MAX - U8_TABLE || len != U8_TABLE + count)
		return -EBADMSG;
	memcpy(table, src, U8_TABLE);
	for (int b = 0; b < 256; b++)
		if (!f32_finite(table[b]))
			return -EBADMSG;
	return 0;
}

static int u8_decode(const void *src, size_t len, float *dst, size_t count)
{
	_Alignas(64) float table[256];
	int r = u8_check(src, len, count, table);

	if (r)
		return r;
	mp_kq_u8_decode(dst, (const uint8_t *)src + U8_TABLE, table, count);
	return 0;
}

static int u8_decode_acc(const void *src, size_t len, float *acc, size_t count, float weight)
{
	_Alignas(64) float table[256];
	int r = u8_check(src, len, count, table);

	if (r)
		return r;
	mp_kq_u8_decode_acc(acc, (const uint8_t *)src + U8_TABLE, table, weight, count);
	return 0;
}

/* ---- blockwise8 ---- */

#define BW8_MAX_BLOCK (1u << 24)

/* Payload bytes for @count values in blocks of @block; -1 if that overflows. */
static int bw8_size(size_t count, uint32_t block, size_t *size)
{
	size_t nb = count / block + (count % block != 0);

	if (count > SIZE_MAX - 4 || nb > (SIZE_MAX - 4 - count) / 4)
		return -1;
	*size = 4 + 4 * nb + count;
	return 0;
}

static size_t bw8_max_encoded(const struct mp_codec_params *p, size_t count)
{
	/* With unusable settings encode fails anyway; B = 1 bounds every block size. */
	uint32_t block = mp_codec_params_check(p) ? 1 : p->block;
	size_t size;

	return bw8_size(count, block, &size) ? SIZE_MAX : size;
}

static int bw8_encode(const struct mp_codec_params *p, const float *src, float *residue, size_t count,
		      void *dst, size_t cap, size_t *len, void *scratch)
{
	unsigned char *out = dst;
	size_t size;

	(void)residue;
	(void)scratch;
	if (mp_codec_params_check(p))
		return -EINVAL;
	if (bw8_size(count, p->block, &size) || cap < size)
		return -ENOSPC;
	mp_le_put32(out, p->block);
	mp_kq_bw8_encode(out + 4, out + size - count, src, count, p->block);
	*len = size;
	return 0;
}

/* Checks the payload; on success *block and *codes describe it. */
static int bw8_check(const void *src, size_t len, size_t count, uint32_t *block, const unsigned char **codes)
{
	const unsigned char *in = src;
	size_t size;

	if (len < 4)
		return -EBADMSG;
	*block = mp_le_get32(in);
	if (*block < 1 || *block > BW8_MAX_BLOCK || bw8_size(count, *block, &size) || len != size)
		return -EBADMSG;
	*codes = in + size - count;
	for (size_t b = 0; 4 + 4 * b < size - count; b++) {
		float v = mp_le_getf32(in + 4 + 4 * b);

		/* Negative (not -0.0, which is zero) or non-finite steps are
		 * malformed, and so is a step whose code 127 would decode to
		 * infinity: no encoder writes one (the spec keeps 127 * step
		 * finite), and taking it would put an infinity in the average. */
		if (!(v >= 0.0f) || !f32_finite(v) || !f32_finite(127.0f * v))
			return -EBADMSG;
		/* Code -128 is outside the spec; only where 128 * step overflows
		 * does it decode to -inf, and only such blocks (a step within a
		 * factor 128/127 of FLT_MAX) are scanned for it, so that the
		 * usual payload costs no second pass over its codes. */
		if (!f32_finite(128.0f * v)) {
			size_t lo = b * (size_t)*block, hi = count - lo < *block ? count : lo + *block;

			for (size_t i = lo; i < hi; i++)
				if ((*codes)[i] == 0x80)
					return -EBADMSG;
		}
	}
	return 0;
}

static int bw8_decode(const void *src, size_t len, float *dst, size_t count)
{
	const unsigned char *codes;
	uint32_t block;
	int r = bw8_check(src, len, count, &block, &codes);

	if (r)
		return r;
	mp_kq_bw8_decode(dst, (const unsigned char *)src + 4, codes, count, block);
	return 0;
}

static int bw8_decode_acc(const void *src, size_t len, float *acc, size_t count, float weight)
{
	const unsigned char *codes;
	uint32_t block;
	int r = bw8_check(src, len, count, &block, &codes);

	if (r)
		return r;
	mp_kq_bw8_decode_acc(acc, (const unsigned char *)src + 4, codes, weight, count, block);
	return 0;
}

/* ---- ops ---- */

const struct mp_codec_ops mp_codec_bf16 = {
	.id = MP_CODEC_BF16,
	.name = "bf16",
	.flags = MP_CODEC_F_LOSSY,
	.max_encoded = bf16_max_encoded,
	.scratch_size = NULL,
	.encode = bf16_encode,
	.decode = bf16_decode,
	.decode_acc = bf16_decode_acc,
};

const struct mp_codec_ops mp_codec_uniform8 = {
	.id = MP_CODEC_UNIFORM8,
	.name = "uniform8",
	.flags = MP_CODEC_F_LOSSY,
	.max_encoded = u8_max_encoded,
	.scratch_size = NULL,
	.encode = u8_encode,
	.decode = u8_decode,
	.decode_acc = u8_decode_acc,
};

const struct mp_codec_ops mp_codec_blockwise8 = {
	.id = MP_CODEC_BLOCKWISE8,
	.name = "blockwise8",
	.flags = MP_CODEC_F_LOSSY,
	.max_encoded = bw8_max_encoded,
	.scratch_size = NULL,
	.encode = bw8_encode,
	.decode = bw8_decode,
	.decode_acc = bw8_decode_acc,
};
