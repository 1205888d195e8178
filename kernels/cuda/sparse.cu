/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The sparse codecs on the GPU: topk (wire id 5) and adacomp (6), encode
 * with error feedback and the validating decoders. Formats and rules are
 * those of src/codec_sparse.c; the comments here are about the GPU side.
 *
 * Both encoders end in the same back half: an ordered compaction of the
 * selected elements (tile counts, one scan over the tiles, then each tile
 * writes its elements at their ranks), the varint lengths of the index gaps
 * summed per tile of ranks and scanned, a verdict (does it fit @cap?), and
 * the writes. Everything stays on the device; the host reads one small
 * result at the end (status and length), which is the one wait.
 *
 * topk selection is a radix select on the key bits(|p|), 11 + 10 + 10 bits
 * as on the CPU: a histogram pass per level (shared-memory counts, flushed
 * with integer atomics: exact in any order), and one block that finds the
 * bucket holding the K-th largest. The result (threshold t, and how many of
 * the keys equal to t are taken, lowest indices first) is a property of the
 * data, so the selected set is the CPU's exactly.
 *
 * In place or not (as on the CPU): when @cap can hold the largest payload
 * of K values, p goes straight into the residue in the first pass and the
 * sent entries are zeroed during compaction. Otherwise nothing touches the
 * residue until the device has decided the payload fits, and two gated
 * passes then write it. Either way a -ENOSPC leaves the residue as it was.
 *
 * Decoding parses all varints in parallel: a byte with the high bit clear
 * ends a varint, so each tile of payload bytes counts its varints and the
 * sum of (gap + 1) they code; one scan over the tiles gives every varint its
 * rank and its index. The malformations the CPU rejects are all local (a
 * run of 5 continuation bytes, a fifth byte above 0x0f, a multi-byte varint
 * ending in 0x00, a last byte that continues) or totals (the number of
 * varints, the last index), so the verdict is the CPU's.
 */
#include <float.h>
#include <math.h>
#include <string.h>

#include "common.cuh"

#define SP_NB1 2048u /* level-1 buckets: key >> 20 */
#define ADA_HDR 12u
#define ADA_MAX_BIN (1u << 24)

/* What the host reads back after an encode: one 16-byte copy. */
struct sp_result {
	uint32_t status;
	uint32_t pad;
	unsigned long long len;
};

struct sp_state {
	struct sp_result res;
	unsigned long long vtotal; /* varint bytes */
	uint32_t need;             /* topk: rank still sought; then: ties to take */
	uint32_t b1, b2, t;        /* topk: buckets found, then the threshold key */
	uint32_t nsel;             /* adacomp: elements selected */
	float scale;               /* adacomp */
	uint32_t h1[SP_NB1], h2[1024], h3[1024];
};

static __device__ __forceinline__ uint32_t key_of(float p)
{
	return __float_as_uint(p) & 0x7fffffffu;
}

static __device__ __forceinline__ uint32_t varint_len(uint32_t v)
{
	return v < (1u << 7) ? 1 : v < (1u << 14) ? 2 : v < (1u << 21) ? 3 : v < (1u << 28) ? 4 : 5;
}

/* p = a (+ b), non-finite -> +0; lanes at or past @n are 0. */
static __device__ __forceinline__ float4 p_ld4(const float *a, const float *b, size_t i, size_t n,
					       bool vec)
{
	float4 x = ld4(a, i, n, vec);

	if (b) {
		float4 y = ld4(b, i, n, vec);

		x.x = __fadd_rn(x.x, y.x);
		x.y = __fadd_rn(x.y, y.y);
		x.z = __fadd_rn(x.z, y.z);
		x.w = __fadd_rn(x.w, y.w);
	}
	x.x = san(x.x);
	x.y = san(x.y);
	x.z = san(x.z);
	x.w = san(x.w);
	return x;
}

/* The device's verdict said no (or an earlier step failed): write nothing. Not block-uniform. */
static __device__ __forceinline__ bool failed(const struct sp_state *st)
{
	return *(volatile const uint32_t *)&st->res.status != 0;
}

/* ================================ shared back half ================================ */

/* Varint bytes of the gaps of idx[0..K) per tile of MPC_TILE ranks (K from *kdev if set). */
static __global__ void k_vlen(const uint32_t *__restrict__ idx, uint32_t kh, const uint32_t *kdev,
			      unsigned long long *ksum)
{
	const size_t K = kdev ? *kdev : kh;
	const size_t j0 = (size_t)blockIdx.x * MPC_TILE + (size_t)threadIdx.x * MPC_PER;
	unsigned long long l = 0;

	for (int k = 0; k < MPC_PER; k++) {
		size_t j = j0 + k;

		if (j < K)
			l += varint_len(idx[j] - (j ? idx[j - 1] + 1 : 0u));
	}
	l = block_sum(l);
	if (threadIdx.x == 0)
		ksum[blockIdx.x] = l;
}

/* Writes the varints at dst + vs, each tile of ranks at its scanned offset. */
static __global__ void k_vwrite(const uint32_t *__restrict__ idx, uint32_t kh, const uint32_t *kdev,
				const unsigned long long *__restrict__ ksum, int ada,
				const struct sp_state *st, uint8_t *__restrict__ dst)
{
	if (block_stopped(&st->res.status))
		return;
	const size_t K = kdev ? *kdev : kh;
	const size_t vs = ada ? ADA_HDR + (K + 7) / 8 : 4 + 4 * K;
	const size_t j0 = (size_t)blockIdx.x * MPC_TILE + (size_t)threadIdx.x * MPC_PER;
	unsigned long long l = 0, tot;

	if ((size_t)blockIdx.x * MPC_TILE >= K)
		return; /* the whole block leaves: no scan to join */
	for (int k = 0; k < MPC_PER; k++) {
		size_t j = j0 + k;

		if (j < K)
			l += varint_len(idx[j] - (j ? idx[j - 1] + 1 : 0u));
	}
	unsigned long long off = ksum[blockIdx.x] + block_excl_scan(l, &tot);
	uint8_t *p = dst + vs + off;

	for (int k = 0; k < MPC_PER; k++) {
		size_t j = j0 + k;

		if (j >= K)
			break;
		uint32_t v = idx[j] - (j ? idx[j - 1] + 1 : 0u);

		while (v >= 0x80u) {
			*p++ = (uint8_t)(v | 0x80u);
			v >>= 7;
		}
		*p++ = (uint8_t)v;
	}
}

/* Total length, the fit test, and the header (within @cap: checked on the host). */
static __global__ void k_verdict(struct sp_state *st, int ada, uint32_t kh, size_t cap, uint8_t *dst,
				 uint32_t bin)
{
	const size_t K = ada ? st->nsel : kh;
	const size_t total = (ada ? ADA_HDR + (K + 7) / 8 : 4 + 4 * K) + st->vtotal;

	if (total > cap)
		st->res.status |= MPC_NOSPC;
	st->res.len = total;
	if (ada) {
		st_u32(dst, bin);
		st_u32(dst + 4, __float_as_uint(st->scale));
		st_u32(dst + 8, (uint32_t)K);
	} else {
		st_u32(dst, (uint32_t)K);
	}
}

/* residue = p (recomputed from src and the old residue), once the payload is known to fit. */
static __global__ void k_res_full(const float *__restrict__ src, float *r, size_t n, bool vec,
				  const struct sp_state *st)
{
	if (failed(st))
		return;
	const size_t units = n / 4 + (n % 4 != 0);

	for (size_t u = blockIdx.x * (size_t)blockDim.x + threadIdx.x; u < units;
	     u += (size_t)gridDim.x * blockDim.x)
		st4(r, 4 * u, n, vec, p_ld4(src, r, 4 * u, n, vec));
}

/* Host side of the back half, after the compaction wrote idx[0..K). */
static void back_half(struct sp_state *st, const uint32_t *idx, uint32_t kh, const uint32_t *kdev,
		      size_t kmax, unsigned long long *ksum, int ada, size_t cap, uint8_t *dst,
		      uint32_t bin, cudaStream_t s)
{
	unsigned nkt = (unsigned)mpc_div_up(kmax, MPC_TILE);

	if (nkt) {
		k_vlen<<<nkt, MPC_TPB, 0, s>>>(idx, kh, kdev, ksum);
		k_scan_excl<unsigned long long><<<1, MPC_SCAN_TPB, 0, s>>>(ksum, nkt, &st->vtotal);
	}
	k_verdict<<<1, 1, 0, s>>>(st, ada, kh, cap, dst, bin);
	if (nkt)
		k_vwrite<<<nkt, MPC_TPB, 0, s>>>(idx, kh, kdev, ksum, ada, st, dst);
}

/* Waits for the stream and turns the device's verdict into a return value. */
static int finish(struct sp_state *st, size_t *len, cudaStream_t s)
{
	struct sp_result res;
	int r = mpc_err(cudaGetLastError());

	if (!r)
		r = mpc_err(cudaMemcpyAsync(&res, &st->res, sizeof(res), cudaMemcpyDeviceToHost, s));
	if (!r)
		r = mpc_err(cudaStreamSynchronize(s));
	if (r)
		return r;
	if (res.status & MPC_NOSPC)
		return -ENOSPC;
	*len = (size_t)res.len;
	return 0;
}

static __global__ void k_sp_init(struct sp_state *st, uint32_t need)
{
	for (unsigned i = threadIdx.x; i < SP_NB1; i += blockDim.x)
		st->h1[i] = 0;
	for (unsigned i = threadIdx.x; i < 1024; i += blockDim.x)
		st->h2[i] = st->h3[i] = 0;
	if (threadIdx.x == 0) {
		st->res.status = 0;
		st->res.len = 0;
		st->vtotal = 0;
		st->need = need;
		st->nsel = 0;
		st->scale = 0.0f;
	}
}

/* Payloads of zero elements: topk is K = 0; adacomp is L, scale 0, nsel 0. */
static __global__ void k_put_empty(uint8_t *dst, int ada, uint32_t bin)
{
	if (ada) {
		st_u32(dst, bin);
		st_u32(dst + 4, 0u);
		st_u32(dst + 8, 0u);
	} else {
		st_u32(dst, 0u);
	}
}

/* ================================ topk ================================ */

/* Level 1 over all of p; with @out, p is also stored there (the in-place residue). */
static __global__ void k_tk_hist1(const float *a, const float *b, float *out, size_t n, bool vec,
				  uint32_t *gh)
{
	__shared__ uint32_t h[SP_NB1];
	const size_t units = n / 4 + (n % 4 != 0);

	for (unsigned i = threadIdx.x; i < SP_NB1; i += blockDim.x)
		h[i] = 0;
	__syncthreads();
	for (size_t u = blockIdx.x * (size_t)blockDim.x + threadIdx.x; u < units;
	     u += (size_t)gridDim.x * blockDim.x) {
		size_t i = 4 * u;
		float4 p = p_ld4(a, b, i, n, vec);

		if (out)
			st4(out, i, n, vec, p);
		for (int k = 0; k < 4; k++)
			if (i + k < n)
				atomicAdd(&h[key_of(f4get(p, k)) >> 20], 1u);
	}
	__syncthreads();
	for (unsigned i = threadIdx.x; i < SP_NB1; i += blockDim.x)
		if (h[i])
			atomicAdd(&gh[i], h[i]);
}

/* Levels 2 and 3: only the keys inside the bucket found so far. */
static __global__ void k_tk_hist23(const float *a, const float *b, size_t n, bool vec, int level,
				   struct sp_state *st)
{
	__shared__ uint32_t h[1024];
	const uint32_t pre = level == 2 ? st->b1 : (st->b1 << 10 | st->b2);
	const unsigned shift = level == 2 ? 20 : 10;
	const size_t units = n / 4 + (n % 4 != 0);
	uint32_t *gh = level == 2 ? st->h2 : st->h3;

	for (unsigned i = threadIdx.x; i < 1024; i += blockDim.x)
		h[i] = 0;
	__syncthreads();
	for (size_t u = blockIdx.x * (size_t)blockDim.x + threadIdx.x; u < units;
	     u += (size_t)gridDim.x * blockDim.x) {
		size_t i = 4 * u;
		float4 p = p_ld4(a, b, i, n, vec);

		for (int k = 0; k < 4; k++) {
			uint32_t key = key_of(f4get(p, k));

			if (i + k < n && key >> shift == pre)
				atomicAdd(&h[level == 2 ? (key >> 10) & 1023u : key & 1023u], 1u);
		}
	}
	__syncthreads();
	for (unsigned i = threadIdx.x; i < 1024; i += blockDim.x)
		if (h[i])
			atomicAdd(&gh[i], h[i]);
}

/*
 * One block of MPC_SCAN_TPB: the bucket, counting from the top, that holds
 * rank st->need; need becomes the rank inside it. Thread t owns buckets in
 * descending order, so an exclusive scan gives each the count above it.
 */
static __global__ void k_tk_pick(struct sp_state *st, int level)
{
	const uint32_t *h = level == 1 ? st->h1 : level == 2 ? st->h2 : st->h3;
	const unsigned nb = level == 1 ? SP_NB1 : 1024u, per = nb / blockDim.x;
	const uint32_t need = st->need;
	uint32_t v[SP_NB1 / MPC_SCAN_TPB], sum = 0, tot;

	for (unsigned k = 0; k < per; k++) {
		v[k] = h[nb - 1 - (threadIdx.x * per + k)];
		sum += v[k];
	}
	uint32_t above = block_excl_scan(sum, &tot);

	for (unsigned k = 0; k < per; k++) {
		uint32_t bkt = nb - 1 - (threadIdx.x * per + k);

		if (above < need && need <= above + v[k]) {
			st->need = need - above;
			if (level == 1)
				st->b1 = bkt;
			else if (level == 2)
				st->b2 = bkt;
			else
				st->t = st->b1 << 20 | st->b2 << 10 | bkt;
		}
		above += v[k];
	}
}

/*
 * Per tile: how many keys are above t and how many equal it, packed as
 * gt | eq << 16 (a tile has 4096 elements, so neither overflows).
 */
static __device__ __forceinline__ void tk_load16(const float *a, const float *b, size_t i0, size_t n,
						 bool vec, float p[MPC_PER])
{
	for (int j = 0; j < MPC_PER / 4; j++) {
		float4 q = p_ld4(a, b, i0 + 4 * j, n, vec);

		p[4 * j] = q.x;
		p[4 * j + 1] = q.y;
		p[4 * j + 2] = q.z;
		p[4 * j + 3] = q.w;
	}
}

static __global__ void k_tk_count(const float *a, const float *b, size_t n, bool vec,
				  const struct sp_state *st, uint32_t *tgt, uint32_t *teq)
{
	const uint32_t t = st->t;
	const size_t i0 = (size_t)blockIdx.x * MPC_TILE + (size_t)threadIdx.x * MPC_PER;
	float p[MPC_PER];
	uint32_t c = 0;

	tk_load16(a, b, i0, n, vec, p);
	for (int k = 0; k < MPC_PER; k++) {
		uint32_t key = key_of(p[k]);

		if (i0 + k < n)
			c += (key > t) + ((uint32_t)(key == t) << 16);
	}
	c = block_sum(c);
	if (threadIdx.x == 0) {
		tgt[blockIdx.x] = c & 0xffffu;
		teq[blockIdx.x] = c >> 16;
	}
}

/*
 * Element i with key > t, or key == t and fewer than `need` ties before it,
 * goes to rank gt_before + min(eq_before, need). Writes its value into the
 * payload, its index into idx[], and (in place) zero into the residue.
 */
static __global__ void k_tk_compact(const float *a, const float *b, size_t n, bool vec,
				    const struct sp_state *st, const uint32_t *__restrict__ tgt,
				    const uint32_t *__restrict__ teq, uint8_t *__restrict__ vals,
				    uint32_t *__restrict__ idx, float *zero_res)
{
	const uint32_t t = st->t, need = st->need;
	const size_t i0 = (size_t)blockIdx.x * MPC_TILE + (size_t)threadIdx.x * MPC_PER;
	float p[MPC_PER];
	uint32_t c = 0, tot;

	tk_load16(a, b, i0, n, vec, p);
	for (int k = 0; k < MPC_PER; k++) {
		uint32_t key = key_of(p[k]);

		if (i0 + k < n)
			c += (key > t) + ((uint32_t)(key == t) << 16);
	}
	uint32_t ex = block_excl_scan(c, &tot);
	uint32_t gt = tgt[blockIdx.x] + (ex & 0xffffu), eq = teq[blockIdx.x] + (ex >> 16);

	for (int k = 0; k < MPC_PER && i0 + k < n; k++) {
		uint32_t key = key_of(p[k]);
		bool sel = false;
		uint32_t j = 0;

		if (key > t) {
			sel = true;
			j = gt + min(eq, need);
			gt++;
		} else if (key == t) {
			sel = eq < need;
			j = gt + eq;
			eq++;
		}
		if (sel) {
			st_u32(vals + 4 * (size_t)j, __float_as_uint(p[k]));
			idx[j] = (uint32_t)(i0 + k);
			if (zero_res)
				zero_res[i0 + k] = 0.0f;
		}
	}
}

static __global__ void k_tk_res_zero(const uint32_t *__restrict__ idx, uint32_t K, float *r,
				     const struct sp_state *st)
{
	if (failed(st))
		return;
	for (size_t j = blockIdx.x * (size_t)blockDim.x + threadIdx.x; j < K;
	     j += (size_t)gridDim.x * blockDim.x)
		r[idx[j]] = 0.0f;
}

/*
 * Most varint bytes k strictly increasing indices below @count can take:
 * k bytes, plus one more for each gap that reaches 2^7, 2^14, 2^21, 2^28.
 * Gaps sum to at most count - k; raising a gap from one length to the next
 * costs the difference of the thresholds, and the cheapest raises come
 * first, so filling the levels in order gives the maximum.
 */
static size_t varint_max(size_t count, size_t k)
{
	uint64_t bytes = k, budget = count - k, room = k, prev = 0;

	for (unsigned sh = 7; sh <= 28; sh += 7) {
		uint64_t cost = (1ull << sh) - prev, e = budget / cost;

		if (e > room)
			e = room;
		bytes += e;
		budget -= e * cost;
		room = e;
		prev = 1ull << sh;
	}
	return (size_t)bytes;
}

size_t mpc_topk_max(const struct mp_codec_params *p, size_t count)
{
	if (count > UINT32_MAX)
		return SIZE_MAX;
	size_t k = mp_codec_topk_ratio_ok(p) ? mp_codec_topk_k(p->topk_ratio, count) : count;

	return 4 + 4 * k + varint_max(count, k);
}

struct tk_layout {
	struct sp_state *st;
	uint32_t *tgt, *teq, *idx;
	unsigned long long *ksum;
	size_t bytes;
};

static struct tk_layout tk_carve(void *base, size_t n, size_t k)
{
	struct mpc_carve c = {(unsigned char *)base, 0};
	struct tk_layout l;
	size_t ntiles = mpc_div_up(n, MPC_TILE);

	l.st = (struct sp_state *)mpc_take(&c, sizeof(struct sp_state));
	l.tgt = (uint32_t *)mpc_take(&c, ntiles * sizeof(uint32_t));
	l.teq = (uint32_t *)mpc_take(&c, ntiles * sizeof(uint32_t));
	l.idx = (uint32_t *)mpc_take(&c, k * sizeof(uint32_t));
	l.ksum = (unsigned long long *)mpc_take(&c, mpc_div_up(k, MPC_TILE) * sizeof(unsigned long long));
	l.bytes = c.used;
	return l;
}

size_t mpc_topk_scratch(const struct mp_codec_params *p, size_t count)
{
	if (count > UINT32_MAX)
		return SIZE_MAX;
	if (!count)
		return 0;
	size_t k = mp_codec_topk_ratio_ok(p) ? mp_codec_topk_k(p->topk_ratio, count) : count;

	return tk_carve(NULL, count, k).bytes;
}

int mpc_topk_encode(const struct mp_codec_params *prm, const float *src, float *res, size_t n,
		    uint8_t *dst, size_t cap, size_t *len, void *scratch, size_t sbytes, cudaStream_t s)
{
	if (!mp_codec_topk_ratio_ok(prm) || n > UINT32_MAX || (n && !scratch))
		return -EINVAL;
	const size_t K = mp_codec_topk_k(prm->topk_ratio, n);
	struct tk_layout l = tk_carve(scratch, n, K);

	if (n && sbytes < l.bytes)
		return -EINVAL;
	/* Every kept value takes 4 bytes and at least one index byte. */
	if (cap < 4 + 5 * K)
		return -ENOSPC;
	if (!n) {
		k_put_empty<<<1, 1, 0, s>>>(dst, 0, 0);
		*len = 4;
		return mpc_err(cudaGetLastError());
	}
	const bool inplace = res && cap >= 4 + 4 * K + varint_max(n, K);
	const unsigned ntiles = (unsigned)mpc_div_up(n, MPC_TILE);
	const unsigned g = mpc_gs_grid(mpc_div_up(n, 4));
	const float *a = src, *b = res;
	bool vec = mpc_aligned(src, 16) && mpc_aligned(res, 16);

	k_sp_init<<<1, MPC_SCAN_TPB, 0, s>>>(l.st, (uint32_t)K);
	k_tk_hist1<<<g, MPC_TPB, 0, s>>>(a, b, inplace ? res : NULL, n, vec, l.st->h1);
	if (inplace) {
		/* From here on p is read back from the residue, as the CPU does. */
		a = res;
		b = NULL;
	}
	k_tk_pick<<<1, MPC_SCAN_TPB, 0, s>>>(l.st, 1);
	k_tk_hist23<<<g, MPC_TPB, 0, s>>>(a, b, n, vec, 2, l.st);
	k_tk_pick<<<1, MPC_SCAN_TPB, 0, s>>>(l.st, 2);
	k_tk_hist23<<<g, MPC_TPB, 0, s>>>(a, b, n, vec, 3, l.st);
	k_tk_pick<<<1, MPC_SCAN_TPB, 0, s>>>(l.st, 3);
	k_tk_count<<<ntiles, MPC_TPB, 0, s>>>(a, b, n, vec, l.st, l.tgt, l.teq);
	k_scan_excl<uint32_t><<<1, MPC_SCAN_TPB, 0, s>>>(l.tgt, ntiles, (uint32_t *)NULL);
	k_scan_excl<uint32_t><<<1, MPC_SCAN_TPB, 0, s>>>(l.teq, ntiles, (uint32_t *)NULL);
	k_tk_compact<<<ntiles, MPC_TPB, 0, s>>>(a, b, n, vec, l.st, l.tgt, l.teq, dst + 4, l.idx,
						inplace ? res : NULL);
	back_half(l.st, l.idx, (uint32_t)K, NULL, K, l.ksum, 0, cap, dst, 0, s);
	if (res && !inplace) {
		k_res_full<<<g, MPC_TPB, 0, s>>>(src, res, n, vec, l.st);
		k_tk_res_zero<<<mpc_gs_grid(K), MPC_TPB, 0, s>>>(l.idx, (uint32_t)K, res, l.st);
	}
	return finish(l.st, len, s);
}

/* ================================ adacomp ================================ */

/*
 * Bin maxima for L <= MPC_TILE: a group of GS threads per bin, 16 values
 * each; G = x (+ r), made finite, also stored into r when @store.
 */
template <int GS, bool VEC>
static __global__ void __launch_bounds__(MPC_TPB)
	k_ada_gmax_group(const float *__restrict__ x, float *r, bool store, size_t n, uint32_t L,
			 size_t nbins, uint32_t *__restrict__ gmax)
{
	const int t = (int)(threadIdx.x % GS);
	const size_t bin = (size_t)blockIdx.x * (MPC_TPB / GS) + threadIdx.x / GS;
	const size_t s0 = bin * L;
	const size_t s1 = bin < nbins ? min_sz(s0 + L, n) : s0;
	uint32_t m = 0;

	for (int j = 0; j < MPC_PER / 4; j++) {
		if (VEC) {
			size_t e = s0 + ((size_t)j * GS + t) * 4;
			float4 g = p_ld4(x, r, e, s1, true);

			if (store && e < s1)
				st4(r, e, s1, true, g);
			m = max(m, max(max(key_of(g.x), key_of(g.y)), max(key_of(g.z), key_of(g.w))));
		} else {
			for (int k = 0; k < 4; k++) {
				size_t e = s0 + (size_t)(4 * j + k) * GS + t;

				if (e < s1) {
					float g = san(r ? __fadd_rn(x[e], r[e]) : x[e]);

					if (store)
						r[e] = g;
					m = max(m, key_of(g));
				}
			}
		}
	}
	m = group_max<GS>(m);
	if (bin < nbins && t == 0)
		gmax[bin] = m;
}

/* L > MPC_TILE: a tile meets at most two bins; maxima by atomicMax (exact). */
static __global__ void k_ada_gmax_tile(const float *__restrict__ x, float *r, bool store, size_t n,
				       size_t L, bool vec, uint32_t *gmax)
{
	const size_t t0 = (size_t)blockIdx.x * MPC_TILE;
	const size_t ba = t0 / L, bnd = (ba + 1) * L;
	uint32_t ma = 0, mb = 0;

	for (int j = 0; j < MPC_PER / 4; j++) {
		size_t e = t0 + ((size_t)j * MPC_TPB + threadIdx.x) * 4;
		float4 g = p_ld4(x, r, e, n, vec);

		if (store && e < n)
			st4(r, e, n, vec, g);
		for (int k = 0; k < 4; k++) {
			uint32_t a = e + k < n ? key_of(f4get(g, k)) : 0u;

			if (e + k < bnd)
				ma = max(ma, a);
			else
				mb = max(mb, a);
		}
	}
	ma = block_max_u32(ma);
	mb = block_max_u32(mb);
	if (threadIdx.x == 0) {
		atomicMax(&gmax[ba], ma);
		if (bnd < min_sz(t0 + MPC_TILE, n))
			atomicMax(&gmax[ba + 1], mb);
	}
}

/*
 * The 16 elements a tile thread owns, with their G and whether they are
 * sent: gmax > 0, G != 0 and |G + x| >= gmax (NaN compares false).
 * @gin: G is already in r (in place); else G = x (+ r), made finite.
 */
static __device__ __forceinline__ uint32_t ada_sel16(const float *x, const float *r, bool gin,
						     size_t i0, size_t n, size_t L, bool vec,
						     const uint32_t *gmax, float g[MPC_PER])
{
	uint32_t mask = 0;
	/* The bin of i0, then walk: one division per thread, not per element. */
	size_t bin = i0 < n ? i0 / L : 0, bnd = (bin + 1) * L;
	float gm = i0 < n ? __uint_as_float(gmax[bin]) : 0.0f;

	for (int j = 0; j < MPC_PER / 4; j++) {
		float4 xv = ld4(x, i0 + 4 * j, n, vec);
		float4 gv = gin ? ld4(r, i0 + 4 * j, n, vec) : p_ld4(x, r, i0 + 4 * j, n, vec);

		for (int k = 0; k < 4; k++) {
			g[4 * j + k] = f4get(gv, k);
			f4set(xv, k, __fadd_rn(f4get(gv, k), f4get(xv, k))); /* H */
		}
		for (int k = 0; k < 4; k++) {
			size_t i = i0 + 4 * j + k;

			if (i >= n)
				break;
			while (i >= bnd) {
				bin++;
				bnd += L;
				gm = __uint_as_float(gmax[bin]);
			}
			if (gm > 0.0f && g[4 * j + k] != 0.0f && fabsf(f4get(xv, k)) >= gm)
				mask |= 1u << (4 * j + k);
		}
	}
	return mask;
}

static __global__ void k_ada_count(const float *x, const float *r, bool gin, size_t n, size_t L,
				   bool vec, const uint32_t *__restrict__ gmax, uint32_t *tcnt,
				   double *tsum)
{
	const size_t i0 = (size_t)blockIdx.x * MPC_TILE + (size_t)threadIdx.x * MPC_PER;
	float g[MPC_PER];
	uint32_t m = ada_sel16(x, r, gin, i0, n, L, vec, gmax, g);
	double sum = 0.0;

	/* In element order within the thread; then the fixed tree. */
	for (int k = 0; k < MPC_PER; k++)
		if (m >> k & 1u)
			sum = __dadd_rn(sum, fabs((double)g[k]));
	uint32_t c = block_sum((uint32_t)__popc(m));

	sum = block_sum_fixed(sum);
	if (threadIdx.x == 0) {
		tcnt[blockIdx.x] = c;
		tsum[blockIdx.x] = sum;
	}
}

/* One block: the total of |G| over the tiles in order, and the scale. */
static __global__ void k_ada_scale(const double *tsum, size_t ntiles, struct sp_state *st)
{
	double s = 0.0;

	for (size_t t = threadIdx.x; t < ntiles; t += blockDim.x)
		s = __dadd_rn(s, tsum[t]);
	s = block_sum_fixed(s);
	if (threadIdx.x == 0)
		st->scale = st->nsel ? __double2float_rn(__ddiv_rn(s, (double)st->nsel)) : 0.0f;
}

static __global__ void k_ada_compact(const float *x, float *r, bool gin, size_t n, size_t L, bool vec,
				     const uint32_t *__restrict__ gmax, const uint32_t *__restrict__ tcnt,
				     const struct sp_state *st, uint32_t *__restrict__ idx,
				     uint8_t *__restrict__ sgn)
{
	const size_t i0 = (size_t)blockIdx.x * MPC_TILE + (size_t)threadIdx.x * MPC_PER;
	const float scale = st->scale;
	float g[MPC_PER];
	uint32_t m = ada_sel16(x, r, gin, i0, n, L, vec, gmax, g), tot;
	uint32_t j = tcnt[blockIdx.x] + block_excl_scan((uint32_t)__popc(m), &tot);

	for (int k = 0; k < MPC_PER; k++) {
		if (!(m >> k & 1u))
			continue;
		size_t i = i0 + k;
		bool neg = signbit(g[k]);

		idx[j] = (uint32_t)i;
		sgn[j] = neg;
		/* In place, r holds G: keep G - sent. */
		if (gin)
			r[i] = neg ? __fadd_rn(g[k], scale) : __fsub_rn(g[k], scale);
		j++;
	}
}

static __global__ void k_ada_signs(const uint8_t *__restrict__ sgn, const struct sp_state *st,
				   uint8_t *__restrict__ dst)
{
	if (failed(st))
		return;
	const size_t K = st->nsel, nbytes = (K + 7) / 8;

	for (size_t bi = blockIdx.x * (size_t)blockDim.x + threadIdx.x; bi < nbytes;
	     bi += (size_t)gridDim.x * blockDim.x) {
		uint32_t v = 0;

		for (int k = 0; k < 8 && 8 * bi + k < K; k++)
			v |= (uint32_t)sgn[8 * bi + k] << k;
		dst[ADA_HDR + bi] = (uint8_t)v;
	}
}

/* Not in place: r already holds G (k_res_full); the sent ones keep G - sent. */
static __global__ void k_ada_res_sel(const uint32_t *__restrict__ idx, const uint8_t *__restrict__ sgn,
				     float *r, const struct sp_state *st)
{
	if (failed(st))
		return;
	const size_t K = st->nsel;
	const float scale = st->scale;

	for (size_t j = blockIdx.x * (size_t)blockDim.x + threadIdx.x; j < K;
	     j += (size_t)gridDim.x * blockDim.x) {
		float g = r[idx[j]];

		r[idx[j]] = sgn[j] ? __fadd_rn(g, scale) : __fsub_rn(g, scale);
	}
}

size_t mpc_ada_max(size_t count)
{
	return count > UINT32_MAX ? SIZE_MAX : ADA_HDR + (count + 7) / 8 + count;
}

struct ada_layout {
	struct sp_state *st;
	uint32_t *gmax, *tcnt, *idx;
	double *tsum;
	uint8_t *sgn;
	unsigned long long *ksum;
	size_t bytes;
};

static struct ada_layout ada_carve(void *base, size_t n, size_t L)
{
	struct mpc_carve c = {(unsigned char *)base, 0};
	struct ada_layout l;
	size_t ntiles = mpc_div_up(n, MPC_TILE);

	l.st = (struct sp_state *)mpc_take(&c, sizeof(struct sp_state));
	l.gmax = (uint32_t *)mpc_take(&c, mpc_div_up(n, L) * sizeof(uint32_t));
	l.tcnt = (uint32_t *)mpc_take(&c, ntiles * sizeof(uint32_t));
	l.tsum = (double *)mpc_take(&c, ntiles * sizeof(double));
	l.idx = (uint32_t *)mpc_take(&c, n * sizeof(uint32_t));
	l.sgn = (uint8_t *)mpc_take(&c, n);
	l.ksum = (unsigned long long *)mpc_take(&c, ntiles * sizeof(unsigned long long));
	l.bytes = c.used;
	return l;
}

size_t mpc_ada_scratch(const struct mp_codec_params *p, size_t count)
{
	if (count > UINT32_MAX)
		return SIZE_MAX;
	if (!count)
		return 0;
	/* The bin maxima are the only part that depends on L; L = 1 bounds them. */
	size_t L = p && p->bin >= 1 && p->bin <= ADA_MAX_BIN ? p->bin : 1;

	return ada_carve(NULL, count, L).bytes;
}

template <int GS>
static void ada_group_launch(const float *x, float *r, bool store, size_t n, uint32_t L, size_t nbins,
			     uint32_t *gmax, cudaStream_t s)
{
	unsigned grid = (unsigned)mpc_div_up(nbins, MPC_TPB / GS);

	if (L % 4 == 0 && mpc_aligned(x, 16) && mpc_aligned(r, 16))
		k_ada_gmax_group<GS, true><<<grid, MPC_TPB, 0, s>>>(x, r, store, n, L, nbins, gmax);
	else
		k_ada_gmax_group<GS, false><<<grid, MPC_TPB, 0, s>>>(x, r, store, n, L, nbins, gmax);
}

int mpc_ada_encode(const struct mp_codec_params *prm, const float *src, float *res, size_t n,
		   uint8_t *dst, size_t cap, size_t *len, void *scratch, size_t sbytes, cudaStream_t s)
{
	if (!prm || prm->bin < 1 || prm->bin > ADA_MAX_BIN || n > UINT32_MAX || (n && !scratch))
		return -EINVAL;
	const uint32_t L = prm->bin;
	struct ada_layout l = ada_carve(scratch, n, L);

	if (n && sbytes < l.bytes)
		return -EINVAL;
	if (cap < ADA_HDR)
		return -ENOSPC;
	if (!n) {
		k_put_empty<<<1, 1, 0, s>>>(dst, 1, L);
		*len = ADA_HDR;
		return mpc_err(cudaGetLastError());
	}
	const bool inplace = res && cap >= mpc_ada_max(n);
	const size_t nbins = mpc_div_up(n, L);
	const unsigned ntiles = (unsigned)mpc_div_up(n, MPC_TILE);
	const bool vec = mpc_aligned(src, 16) && mpc_aligned(res, 16);

	k_sp_init<<<1, MPC_SCAN_TPB, 0, s>>>(l.st, 0);
	if (L <= MPC_TILE) {
		switch (mpc_group_size(L)) {
		case 1: ada_group_launch<1>(src, res, inplace, n, L, nbins, l.gmax, s); break;
		case 2: ada_group_launch<2>(src, res, inplace, n, L, nbins, l.gmax, s); break;
		case 4: ada_group_launch<4>(src, res, inplace, n, L, nbins, l.gmax, s); break;
		case 8: ada_group_launch<8>(src, res, inplace, n, L, nbins, l.gmax, s); break;
		case 16: ada_group_launch<16>(src, res, inplace, n, L, nbins, l.gmax, s); break;
		case 32: ada_group_launch<32>(src, res, inplace, n, L, nbins, l.gmax, s); break;
		case 64: ada_group_launch<64>(src, res, inplace, n, L, nbins, l.gmax, s); break;
		case 128: ada_group_launch<128>(src, res, inplace, n, L, nbins, l.gmax, s); break;
		default: ada_group_launch<256>(src, res, inplace, n, L, nbins, l.gmax, s); break;
		}
	} else {
		cudaMemsetAsync(l.gmax, 0, nbins * sizeof(uint32_t), s);
		k_ada_gmax_tile<<<ntiles, MPC_TPB, 0, s>>>(src, res, inplace, n, L, vec, l.gmax);
	}
	k_ada_count<<<ntiles, MPC_TPB, 0, s>>>(src, res, inplace, n, L, vec, l.gmax, l.tcnt, l.tsum);
	k_scan_excl<uint32_t><<<1, MPC_SCAN_TPB, 0, s>>>(l.tcnt, ntiles, &l.st->nsel);
	k_ada_scale<<<1, MPC_SCAN_TPB, 0, s>>>(l.tsum, ntiles, l.st);
	k_ada_compact<<<ntiles, MPC_TPB, 0, s>>>(src, res, inplace, n, L, vec, l.gmax, l.tcnt, l.st,
						 l.idx, l.sgn);
	back_half(l.st, l.idx, 0, &l.st->nsel, n, l.ksum, 1, cap, dst, L, s);
	k_ada_signs<<<mpc_gs_grid(mpc_div_up(n, 8)), MPC_TPB, 0, s>>>(l.sgn, l.st, dst);
	if (res && !inplace) {
		unsigned g = mpc_gs_grid(mpc_div_up(n, 4));

		k_res_full<<<g, MPC_TPB, 0, s>>>(src, res, n, vec, l.st);
		k_ada_res_sel<<<mpc_gs_grid(n), MPC_TPB, 0, s>>>(l.idx, l.sgn, res, l.st);
	}
	return finish(l.st, len, s);
}

/* ================================ decoding ================================ */

struct sp_hdr {
	size_t vs;     /* first varint byte */
	uint32_t k;    /* values / selected */
	float scale;   /* adacomp */
	int bad;
};

/* The header checks of codec_sparse.c's topk_check / ada_check. */
static __device__ struct sp_hdr sp_header(int codec, const uint8_t *pl, size_t len, size_t n)
{
	struct sp_hdr h;

	h.bad = 0;
	h.scale = 0.0f;
	if (codec == MPC_TOPK) {
		h.k = ld_u32(pl);
		h.bad = h.k > n || (len - 4) / 4 < h.k;
		h.vs = 4 + 4 * (size_t)h.k;
	} else {
		uint32_t bin = ld_u32(pl);

		h.scale = ld_f32(pl + 4);
		h.k = ld_u32(pl + 8);
		size_t sb = ((size_t)h.k + 7) / 8;

		h.bad = bin < 1 || bin > ADA_MAX_BIN || !finite32(h.scale) || !(h.scale >= 0.0f) ||
			h.k > n || len - ADA_HDR < sb;
		/* Padding bits of the last sign byte must be 0. */
		if (!h.bad && (h.k % 8) && (pl[ADA_HDR + sb - 1] >> (h.k % 8)))
			h.bad = 1;
		h.vs = ADA_HDR + sb;
	}
	if (h.bad) {
		h.vs = len;
		h.k = 0;
	}
	return h;
}

/*
 * The varint ending at byte p (high bit clear): its continuation bytes are
 * the run right before p, at most 4 long in a valid payload. Returns the
 * value; *err for the local malformations.
 */
static __device__ __forceinline__ uint32_t varint_at(const uint8_t *pl, size_t vs, size_t p, uint32_t b,
						     int *err)
{
	unsigned r = 0;

	while (r < 4 && p > vs + r && (pl[p - r - 1] & 0x80u))
		r++;
	if ((r == 4 && b > 0x0fu) || (r && b == 0))
		*err = 1; /* fifth byte too big; multi-byte varint ending in 0x00 */
	uint32_t d = b << (7 * r);

	for (unsigned i = 0; i < r; i++)
		d |= (uint32_t)(pl[p - r + i] & 0x7fu) << (7 * i);
	return d;
}

/* Per tile of payload bytes: varints that end here, and the sum of their (gap + 1). */
static __global__ void k_sp_scan1(int codec, const uint8_t *__restrict__ pl, size_t len, size_t n,
				  uint32_t *tcnt, unsigned long long *tsum, uint32_t *status)
{
	__shared__ struct sp_hdr sh;
	int bad = 0;

	if (threadIdx.x == 0)
		sh = sp_header(codec, pl, len, n);
	__syncthreads();
	const struct sp_hdr h = sh;

	if (h.bad) {
		if (threadIdx.x == 0) {
			tcnt[blockIdx.x] = 0;
			tsum[blockIdx.x] = 0;
			if (blockIdx.x == 0)
				atomicOr(status, MP_CUDA_BAD);
		}
		return;
	}
	/* The tiles together cover len / 4 >= K values: 1024 per tile. */
	if (codec == MPC_TOPK) {
		for (int q = 0; q < MPC_TILE / 4 / MPC_TPB; q++) {
			size_t j = (size_t)blockIdx.x * (MPC_TILE / 4) + (size_t)q * MPC_TPB + threadIdx.x;

			if (j < h.k && !finite32(ld_f32(pl + 4 + 4 * j)))
				bad = 1;
		}
	}
	const size_t p0 = (size_t)blockIdx.x * MPC_TILE + (size_t)threadIdx.x * MPC_PER;
	uint32_t cnt = 0;
	unsigned long long sum = 0;

	for (int q = 0; q < MPC_PER; q++) {
		size_t p = p0 + q;

		if (p < h.vs || p >= len)
			continue;
		uint32_t b = pl[p];

		if (b & 0x80u) {
			/* A fifth continuation byte, or a varint cut off by the end. */
			if ((p >= h.vs + 4 && (pl[p - 1] & pl[p - 2] & pl[p - 3] & pl[p - 4] & 0x80u)) ||
			    p == len - 1)
				bad = 1;
			continue;
		}
		sum += (unsigned long long)varint_at(pl, h.vs, p, b, &bad) + 1;
		cnt++;
	}
	cnt = block_sum(cnt);
	sum = block_sum(sum);
	if (threadIdx.x == 0) {
		tcnt[blockIdx.x] = cnt;
		tsum[blockIdx.x] = sum;
	}
	if (bad)
		atomicOr(status, MP_CUDA_BAD);
}

/* The totals: exactly K varints, and the last index (sum of gap + 1, minus 1) below n. */
static __global__ void k_sp_final(int codec, const uint8_t *pl, size_t len, size_t n,
				  const uint32_t *cnt, const unsigned long long *sum, uint32_t *status)
{
	struct sp_hdr h = sp_header(codec, pl, len, n);

	if (!h.bad && (*cnt != h.k || *sum > n))
		atomicOr(status, MP_CUDA_BAD);
}

static __global__ void k_zero_gated(float *dst, size_t n, const uint32_t *status)
{
	if (*(volatile const uint32_t *)status)
		return;
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x)
		dst[i] = 0.0f;
}

static __global__ void k_sp_apply(int codec, const uint8_t *__restrict__ pl, size_t len, size_t n,
				  const uint32_t *__restrict__ tcnt,
				  const unsigned long long *__restrict__ tsum, float *out, float w,
				  bool acc, const uint32_t *status)
{
	__shared__ struct sp_hdr sh;

	if (block_stopped(status))
		return;
	if (threadIdx.x == 0)
		sh = sp_header(codec, pl, len, n);
	__syncthreads();
	const struct sp_hdr h = sh;
	const size_t p0 = (size_t)blockIdx.x * MPC_TILE + (size_t)threadIdx.x * MPC_PER;
	uint32_t d[MPC_PER], cnt = 0, ctot;
	unsigned long long sum = 0, stot;
	int ignored = 0;

	for (int q = 0; q < MPC_PER; q++) {
		size_t p = p0 + q;

		if (p < h.vs || p >= len)
			continue;
		uint32_t b = pl[p];

		if (b & 0x80u)
			continue;
		d[cnt] = varint_at(pl, h.vs, p, b, &ignored);
		sum += (unsigned long long)d[cnt] + 1;
		cnt++;
	}
	size_t j = tcnt[blockIdx.x] + block_excl_scan(cnt, &ctot);
	unsigned long long next = tsum[blockIdx.x] + block_excl_scan(sum, &stot);

	for (uint32_t q = 0; q < cnt; q++, j++) {
		size_t i = (size_t)(next + d[q]);
		float v;

		next += (unsigned long long)d[q] + 1;
		if (codec == MPC_TOPK)
			v = ld_f32(pl + 4 + 4 * j);
		else
			v = (pl[ADA_HDR + j / 8] >> (j % 8)) & 1u ? -h.scale : h.scale;
		out[i] = acc ? axpy1(out[i], w, v) : v;
	}
}

size_t mpc_sparse_dec_scratch(size_t len)
{
	size_t nt = mpc_div_up(len, MPC_TILE);

	return mpc_round_up(2 * sizeof(unsigned long long)) + mpc_round_up(nt * sizeof(uint32_t)) +
	       mpc_round_up(nt * sizeof(unsigned long long));
}

int mpc_sparse_decode(int codec, const uint8_t *pl, size_t len, float *out, size_t n, float w, int acc,
		      uint32_t *status, void *scratch, cudaStream_t s)
{
	struct mpc_carve c = {(unsigned char *)scratch, 0};
	const unsigned nt = (unsigned)mpc_div_up(len, MPC_TILE);
	unsigned long long *tot = (unsigned long long *)mpc_take(&c, 2 * sizeof(unsigned long long));
	uint32_t *cnt = (uint32_t *)(tot + 1);
	uint32_t *tcnt = (uint32_t *)mpc_take(&c, nt * sizeof(uint32_t));
	unsigned long long *tsum = (unsigned long long *)mpc_take(&c, nt * sizeof(unsigned long long));

	k_sp_scan1<<<nt, MPC_TPB, 0, s>>>(codec, pl, len, n, tcnt, tsum, status);
	k_scan_excl<uint32_t><<<1, MPC_SCAN_TPB, 0, s>>>(tcnt, nt, cnt);
	k_scan_excl<unsigned long long><<<1, MPC_SCAN_TPB, 0, s>>>(tsum, nt, tot);
	k_sp_final<<<1, 1, 0, s>>>(codec, pl, len, n, cnt, tot, status);
	if (!acc && n)
		k_zero_gated<<<mpc_gs_grid(n), MPC_TPB, 0, s>>>(out, n, status);
	k_sp_apply<<<nt, MPC_TPB, 0, s>>>(codec, pl, len, n, tcnt, tsum, out, w, acc != 0, status);
	return mpc_err(cudaGetLastError());
}
