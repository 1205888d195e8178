/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Sparse codecs with error feedback: "topk" (wire id 5) and "adacomp" (6).
 * Hot loops live in kernels/cpu/sparse.c; this file owns the wire format.
 *
 *  topk     u32 K, K x f32 values, K LEB128 varints of the indices (the first
 *           index, then each gap minus one), filling the payload exactly.
 *           Sends the K = clamp(llround(ratio * count), 1, count) largest
 *           |p|, p = src + residue, exactly; ties go to lower indices.
 *  adacomp  u32 bin L, f32 scale, u32 nsel, ceil(nsel/8) sign bytes (bit i%8
 *           of byte i/8, 1 = negative, padding 0), nsel index varints as in
 *           topk. Each selected element decodes to +-scale.
 *           AdaComp (Chen et al., AAAI 2018): G = residue + x, H = G + x;
 *           per bin of L, gmax = max |G|; element i goes if |H_i| >= gmax;
 *           scale = mean |G| of those sent; the residue keeps G - sent.
 *
 * Both codecs drop non-finite inputs (NaN, +-inf become 0 before anything
 * else: never sent, never kept), so one bad gradient cannot poison the
 * residue for every later step.
 *
 * Error feedback: with a residue, encode leaves residue = p - decode(payload)
 * (topk: exactly, the sent values are zeroed; adacomp: G - sent rounded
 * once). An encode that fails (-ENOSPC) leaves the residue as it was, so
 * nothing fed in is lost: when @cap may be too small the residue is only
 * written after the payload is known to fit (which costs one more pass;
 * with cap >= max_encoded, as the engine gives, p goes straight into it).
 *
 * Where the layout notes leave room, this is what the code does:
 *  - K is llround(ratio * count) in double precision, then clamped.
 *  - AdaComp never selects an element whose G is zero (+0 or -0). The paper
 *    sends sign(G) * scale, which for G = 0 is 0, i.e. nothing; the wire has
 *    only +-scale, so sending it would inject scale into a residue that had
 *    nothing to give. Such an element needs |x| >= gmax with r = -x: rare.
 *    It follows that a non-finite x (G zeroed) is never selected either,
 *    whatever the non-finite H = 0 + x compares as.
 *  - scale is the mean |G| over the elements sent, summed in double in
 *    index order (the same sum in every variant).
 *  - Decoders take only canonical varints: a multi-byte varint that ends in
 *    a zero byte is -EBADMSG, so each index set has exactly one encoding.
 *  - Scale -0.0 passes "scale >= 0" and is accepted.
 *
 * Indices are u32 on the wire: more than UINT32_MAX elements is -EINVAL.
 */
#include "codec.h"
#include "mp_kernels.h"
#include "sparse.h"

#include <moshpit/moshpit.h>

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

/* Elements decoded per step into stack buffers for the accumulate kernel. */
#define CHUNK 256

#define ADA_HDR 12u
#define ADA_MAX_BIN (1u << 24)
/* Most elements per payload: u32 indices, and sizes that cannot wrap a size_t. */
#define MAX_COUNT ((size_t)UINT32_MAX < SIZE_MAX / 8 ? (size_t)UINT32_MAX : SIZE_MAX / 8)

/*
 * Most varint bytes @k strictly increasing indices below @count can take.
 * The gaps d_j >= 0 sum to at most count - k, and a varint grows by a byte
 * at 2^7, 2^14, 2^21 and 2^28. Each extra byte costs gap; the cheapest ones
 * (raising a gap 0 -> 128) come first, and a gap can reach the next length
 * only from the previous one, so filling the levels in order is the best any
 * index set can do: this is the exact maximum, not just a bound.
 */
static size_t varint_max(size_t count, size_t k)
{
	uint64_t bytes = k, budget = count - k, have = k, prev = 0;

	for (unsigned s = 7; s <= 28; s += 7) {
		uint64_t cost = (1ull << s) - prev;
		uint64_t e = budget / cost;

		if (e > have)
			e = have;
		bytes += e;
		budget -= e * cost;
		have = e;
		prev = 1ull << s;
	}
	return (size_t)bytes;
}

/* Varint bytes of the index list @idx (strictly increasing). */
static size_t varint_bytes(const uint32_t *idx, size_t k)
{
	size_t n = 0;
	uint32_t next = 0;

	for (size_t j = 0; j < k; j++) {
		n += mp_varint_len(idx[j] - next);
		next = idx[j] + 1;
	}
	return n;
}

static uint8_t *varint_write(uint8_t *p, const uint32_t *idx, size_t k)
{
	uint32_t next = 0;

	for (size_t j = 0; j < k; j++) {
		p += mp_varint_put(p, idx[j] - next);
		next = idx[j] + 1;
	}
	return p;
}

/*
 * Checks that exactly @k canonical varints fill [p, end) and code strictly
 * increasing indices below @count. Canonical: a multi-byte varint may not
 * end in a zero byte (no encoder writes one, and so every index set has
 * exactly one encoding).
 */
static int indices_ok(const uint8_t *p, const uint8_t *end, size_t k, size_t count)
{
	uint64_t next = 0;

	for (size_t j = 0; j < k; j++) {
		uint32_t d;
		size_t n = mp_varint_get(p, end, &d);

		if (!n || (n > 1 && p[n - 1] == 0))
			return 0;
		if (next + d >= count)
			return 0;
		next += (uint64_t)d + 1;
		p += n;
	}
	return p == end;
}

/* Reads the next index of a list indices_ok() accepted (so no bounds checks). */
static inline uint32_t index_next(const uint8_t **p, uint32_t *next)
{
	const uint8_t *q = *p;
	uint32_t d = 0, b, i;
	unsigned sh = 0;

	do {
		b = *q++;
		d |= (b & 0x7fu) << sh;
		sh += 7;
	} while (b & 0x80u);
	*p = q;
	i = *next + d;
	*next = i + 1;
	return i;
}

/* ---- topk ---- */

static size_t topk_max(size_t count, size_t k)
{
	return 4 + 4 * k + varint_max(count, k);
}

/* Unusable params: the largest any valid ratio can need (ratio 1). */
static size_t topk_max_encoded(const struct mp_codec_params *p, size_t count)
{
	if (count > MAX_COUNT)
		return SIZE_MAX;
	return topk_max(count,
			mp_codec_topk_ratio_ok(p) ? mp_codec_topk_k(p->topk_ratio, count) : count);
}

static size_t topk_scratch_size(const struct mp_codec_params *p, size_t count)
{
	if (count > MAX_COUNT)
		return SIZE_MAX;
	if (!count)
		return 0;
	return mp_sparse_topk_scratch(count, mp_codec_topk_ratio_ok(p) ?
						     mp_codec_topk_k(p->topk_ratio, count) : count);
}

static int topk_encode(const struct mp_codec_params *prm, const float *src, float *residue,
		       size_t count, void *dst, size_t cap, size_t *len, void *scratch)
{
	uint8_t *out = dst;

	if (!mp_codec_topk_ratio_ok(prm) || count > MAX_COUNT || (count && !scratch))
		return -EINVAL;
	size_t k = mp_codec_topk_k(prm->topk_ratio, count);

	/* Every kept value takes 4 bytes and at least one index byte. */
	if (cap < 4 + 5 * k)
		return -ENOSPC;
	if (!count) {
		mp_le_put32(out, 0);
		*len = 4;
		return 0;
	}
	const struct mp_sparse_kernels *kt = mp_sparse_kernels();
	/* Room for any payload: p goes straight into the residue, no length check. */
	int fits = cap >= topk_max(count, k);
	float *val;
	uint32_t *idx =
		mp_sparse_topk(kt, src, residue, fits ? residue : NULL, count, k, scratch, &val);

	if (!fits) {
		if (4 + 4 * k + varint_bytes(idx, k) > cap)
			return -ENOSPC;
		if (residue)
			kt->prep(src, residue, residue, count, NULL);
	}
	mp_le_put32(out, (uint32_t)k);
	memcpy(out + 4, val, 4 * k);
	if (residue)
		for (size_t j = 0; j < k; j++)
			residue[idx[j]] = 0.0f;
	*len = (size_t)(varint_write(out + 4 + 4 * k, idx, k) - out);
	return 0;
}

/* Validates a topk payload; *k gets K. */
static int topk_check(const uint8_t *s, size_t len, size_t count, size_t *k)
{
	if (len < 4)
		return -EBADMSG;
	uint32_t kk = mp_le_get32(s);

	if (kk > count || (len - 4) / 4 < kk)
		return -EBADMSG;
	if (!mp_sparse_kernels()->finite(s + 4, kk))
		return -EBADMSG;
	if (!indices_ok(s + 4 + 4 * (size_t)kk, s + len, kk, count))
		return -EBADMSG;
	*k = kk;
	return 0;
}

static int topk_decode(const void *src, size_t len, float *dst, size_t count)
{
	const uint8_t *s = src, *ip;
	size_t k;
	uint32_t next = 0;
	int rc = topk_check(s, len, count, &k);

	if (rc)
		return rc;
	if (count)
		memset(dst, 0, count * sizeof(float));
	ip = s + 4 + 4 * k;
	for (size_t j = 0; j < k; j++)
		dst[index_next(&ip, &next)] = mp_le_getf32(s + 4 + 4 * j);
	return 0;
}

static int topk_decode_acc(const void *src, size_t len, float *acc, size_t count, float weight)
{
	const uint8_t *s = src, *ip;
	size_t k;
	uint32_t next = 0, ib[CHUNK];
	float vb[CHUNK];
	int rc = topk_check(s, len, count, &k);

	if (rc)
		return rc;
	const struct mp_sparse_kernels *kt = mp_sparse_kernels();

	ip = s + 4 + 4 * k;
	for (size_t j = 0; j < k; j += CHUNK) {
		size_t c = k - j < CHUNK ? k - j : CHUNK;

		memcpy(vb, s + 4 + 4 * j, c * sizeof(float));
		for (size_t l = 0; l < c; l++)
			ib[l] = index_next(&ip, &next);
		kt->scatter_acc(acc, ib, vb, weight, c);
	}
	return 0;
}

/* ---- adacomp ---- */

static int ada_bin_ok(const struct mp_codec_params *p)
{
	return p && p->bin >= 1 && p->bin <= ADA_MAX_BIN;
}

/*
 * Largest payload: every element selected (all gaps 0, one byte each).
 * Leaving m elements out saves m index bytes and about m/8 sign bytes, and
 * the larger gaps it allows add at most m/127 bytes (varint_max), so fewer
 * never takes more.
 */
static size_t ada_max(size_t count)
{
	return ADA_HDR + (count + 7) / 8 + count;
}

static size_t ada_max_encoded(const struct mp_codec_params *p, size_t count)
{
	(void)p;
	return count > MAX_COUNT ? SIZE_MAX : ada_max(count);
}

/* Bytes of one list of @count entries (index or value) with its slack. */
static size_t ada_list(size_t count)
{
	return ((count + MP_SP_SLACK) * sizeof(uint32_t) + 63) & ~(size_t)63;
}

/* The selected elements' indices and G (any number of them may go). */
static size_t ada_scratch_size(const struct mp_codec_params *p, size_t count)
{
	(void)p;
	if (count > MAX_COUNT)
		return SIZE_MAX;
	return count ? 2 * ada_list(count) : 0;
}

static int ada_encode(const struct mp_codec_params *prm, const float *src, float *residue,
		      size_t count, void *dst, size_t cap, size_t *len, void *scratch)
{
	uint8_t *out = dst;

	if (!ada_bin_ok(prm) || count > MAX_COUNT || (count && !scratch))
		return -EINVAL;
	if (cap < ADA_HDR)
		return -ENOSPC;
	const struct mp_sparse_kernels *kt = mp_sparse_kernels();
	/* Room for any payload: G goes straight into the residue, no length check. */
	int fits = cap >= ada_max(count);
	uint32_t *idx = scratch;
	float *gv = count ? (float *)((unsigned char *)scratch + ada_list(count)) : NULL;
	size_t nsel =
		count ? kt->ada_select(src, residue, fits && residue, count, prm->bin, idx, gv) : 0;
	size_t sb = (nsel + 7) / 8;

	if (!fits) {
		if (ADA_HDR + sb + varint_bytes(idx, nsel) > cap)
			return -ENOSPC;
		if (residue)
			kt->prep(src, residue, residue, count, NULL);
	}
	/* The sum is a chain of dependent adds (the format fixes index order); signs ride along. */
	uint8_t *sg = out + ADA_HDR;
	double sum = 0.0;

	memset(sg, 0, sb);
	for (size_t j = 0; j < nsel; j++) {
		uint32_t u;

		memcpy(&u, &gv[j], 4);
		sum += fabs((double)gv[j]);
		sg[j / 8] |= (uint8_t)((u >> 31) << (j % 8));
	}
	float scale = nsel ? (float)(sum / (double)nsel) : 0.0f;

	mp_le_put32(out, prm->bin);
	mp_le_putf32(out + 4, scale);
	mp_le_put32(out + 8, (uint32_t)nsel);
	/* sent = sign(G) * scale; G is never 0 here, and copysign keeps it branch-free. */
	if (residue)
		for (size_t j = 0; j < nsel; j++)
			residue[idx[j]] = gv[j] - copysignf(scale, gv[j]);
	*len = (size_t)(varint_write(sg + sb, idx, nsel) - out);
	return 0;
}

/* Validates an adacomp payload; *nsel and *scale get its fields. */
static int ada_check(const uint8_t *s, size_t len, size_t count, size_t *nsel, float *scale)
{
	if (len < ADA_HDR)
		return -EBADMSG;
	uint32_t bin = mp_le_get32(s), n = mp_le_get32(s + 8);
	float sc = mp_le_getf32(s + 4);

	if (bin < 1 || bin > ADA_MAX_BIN || !isfinite(sc) || !(sc >= 0.0f) || n > count)
		return -EBADMSG;
	size_t sb = ((size_t)n + 7) / 8;

	if (len - ADA_HDR < sb)
		return -EBADMSG;
	if ((n % 8) && (s[ADA_HDR + sb - 1] >> (n % 8)))
		return -EBADMSG;
	if (!indices_ok(s + ADA_HDR + sb, s + len, n, count))
		return -EBADMSG;
	*nsel = n;
	*scale = sc;
	return 0;
}

/* +-scale by sign bit j, without a branch (the signs are coin flips). */
static inline float ada_value(const uint8_t *sg, size_t j, float scale)
{
	uint32_t u;
	float v;

	memcpy(&u, &scale, 4);
	u ^= (uint32_t)((sg[j / 8] >> (j % 8)) & 1u) << 31;
	memcpy(&v, &u, 4);
	return v;
}

static int ada_decode(const void *src, size_t len, float *dst, size_t count)
{
	const uint8_t *s = src, *sg = s + ADA_HDR, *ip;
	size_t n;
	float scale;
	uint32_t next = 0;
	int rc = ada_check(s, len, count, &n, &scale);

	if (rc)
		return rc;
	if (count)
		memset(dst, 0, count * sizeof(float));
	ip = sg + (n + 7) / 8;
	for (size_t j = 0; j < n; j++)
		dst[index_next(&ip, &next)] = ada_value(sg, j, scale);
	return 0;
}

static int ada_decode_acc(const void *src, size_t len, float *acc, size_t count, float weight)
{
	const uint8_t *s = src, *sg = s + ADA_HDR, *ip;
	size_t n;
	float scale, vb[CHUNK];
	uint32_t next = 0, ib[CHUNK];
	int rc = ada_check(s, len, count, &n, &scale);

	if (rc)
		return rc;
	const struct mp_sparse_kernels *kt = mp_sparse_kernels();

	ip = sg + (n + 7) / 8;
	for (size_t j = 0; j < n; j += CHUNK) {
		size_t c = n - j < CHUNK ? n - j : CHUNK;

		for (size_t l = 0; l < c; l++) {
			ib[l] = index_next(&ip, &next);
			vb[l] = ada_value(sg, j + l, scale);
		}
		kt->scatter_acc(acc, ib, vb, weight, c);
	}
	return 0;
}

const struct mp_codec_ops mp_codec_topk = {
	.id = MP_CODEC_TOPK,
	.name = "topk",
	.flags = MP_CODEC_F_LOSSY | MP_CODEC_F_SPARSE,
	.max_encoded = topk_max_encoded,
	.scratch_size = topk_scratch_size,
	.encode = topk_encode,
	.decode = topk_decode,
	.decode_acc = topk_decode_acc,
};

const struct mp_codec_ops mp_codec_adacomp = {
	.id = MP_CODEC_ADACOMP,
	.name = "adacomp",
	.flags = MP_CODEC_F_LOSSY | MP_CODEC_F_SPARSE,
	.max_encoded = ada_max_encoded,
	.scratch_size = ada_scratch_size,
	.encode = ada_encode,
	.decode = ada_decode,
	.decode_acc = ada_decode_acc,
};
