/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The dense codecs on the GPU (none, fp16, bf16, uniform8, blockwise8) and
 * the public entry points of mp_cuda_codecs.h, which dispatch to these and
 * to the sparse codecs of sparse.cu.
 *
 * Element-wise codecs (none, fp16, bf16 and both decoders of the 8-bit
 * ones) are grid-stride loops over units of 4 or 8 elements with 16-byte
 * loads and stores when the pointers allow it; a payload that is not
 * aligned takes byte accesses (same results, more instructions). The
 * conversions are integer code on the bit patterns, exactly the CPU's: the
 * hardware's fp16 conversion would return a canonical NaN where the format
 * keeps the payload.
 *
 * uniform8 encode: a statistics pass (tiles -> partial sums), one block that
 * combines them in a fixed order and derives lo/step as codec_quant.c does,
 * a pass that writes the codes and the bucket sums of the 1-in-16 sample,
 * and one block for the table. The bucket sums are exact integers: each
 * sampled finite value is rounded to a multiple of 2^e chosen so that no sum
 * can overflow 63 bits (e from the largest |x| and the count), then added
 * with 64-bit atomics, which are exact in any order. So the table does not
 * depend on scheduling; it differs from the CPU's element-order double sums
 * only in the last bits of a sum, far below a float's precision except for
 * buckets whose mean is very close to 0.
 *
 * blockwise8 encode: for B <= MPC_TILE one pass: a group of G threads holds
 * a block's values in registers (16 each), takes the group's absmax and
 * writes the codes. Larger blocks: one pass for the absmax (atomicMax on the
 * bit patterns: exact in any order), one to quantise.
 */
#include <float.h>
#include <stdio.h>
#include <string.h>

#include "common.cuh"

/* ================================ host helpers ================================ */

int mpc_err(cudaError_t e)
{
	switch (e) {
	case cudaSuccess:
		return 0;
	case cudaErrorMemoryAllocation:
		return -ENOMEM;
	case cudaErrorInvalidValue:
	case cudaErrorInvalidDevicePointer:
		return -EINVAL;
	case cudaErrorNoDevice:
	case cudaErrorInsufficientDriver:
	case cudaErrorNoKernelImageForDevice:
		return -ENODEV;
	default:
		return -EIO;
	}
}

unsigned mpc_gs_grid(size_t units)
{
	int dev = 0, sms = 0;
	size_t want = mpc_div_up(units, MPC_TPB), cap;

	if (cudaGetDevice(&dev) != cudaSuccess ||
	    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
	    sms <= 0)
		sms = 16;
	/* Enough threads per SM to keep the loads in flight (common.cuh says how many). */
	cap = (size_t)sms * MPC_BLOCKS_PER_SM;
	if (want > cap)
		want = cap;
	return want ? (unsigned)want : 1u;
}

int mpc_tmp_alloc(void **p, size_t bytes, cudaStream_t s, int *pooled)
{
	int dev = 0, pools = 0;

	*p = NULL;
	if (cudaGetDevice(&dev) == cudaSuccess &&
	    cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, dev) == cudaSuccess &&
	    pools && cudaMallocAsync(p, bytes, s) == cudaSuccess) {
		*pooled = 1;
		return 0;
	}
	(void)cudaGetLastError();
	*pooled = 0;
	return mpc_err(cudaMalloc(p, bytes));
}

void mpc_tmp_free(void *p, cudaStream_t s, int pooled)
{
	if (!p)
		return;
	if (pooled)
		(void)cudaFreeAsync(p, s);
	else
		(void)cudaFree(p);
}

/* 0 after launches that queued fine, else the runtime's error as errno. */
static int launched(void)
{
	return mpc_err(cudaGetLastError());
}

static __global__ void k_put_u32(uint8_t *dst, uint32_t v)
{
	st_u32(dst, v);
}

/* ================================ fp16 / bf16 ================================ */

static __device__ __forceinline__ uint16_t f32_to_f16(float f)
{
	uint32_t u = __float_as_uint(f);
	uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;

	if (a > 0x7f800000u) /* NaN: quiet, top 10 payload bits kept */
		return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
	if (a >= 0x477fe000u) /* 65504 and up, inf too: saturate */
		return (uint16_t)(sign | 0x7bffu);
	if (a >= 0x38800000u) { /* normal half: rebias, round half even on 13 bits */
		uint32_t r = a - 0x38000000u;

		r += 0x0fffu + ((r >> 13) & 1u);
		return (uint16_t)(sign | (r >> 13));
	}
	uint32_t e = a >> 23;

	if (e < 102) /* below 2^-25 (and 2^-25 itself, a tie to even 0) */
		return (uint16_t)sign;
	/* Subnormal half: the mantissa with its implicit bit, shifted by 14..24 with RNE. */
	uint32_t m = (a & 0x7fffffu) | 0x800000u;
	unsigned sh = 126u - e;
	uint32_t q = m >> sh, rem = m & ((1u << sh) - 1u), half = 1u << (sh - 1);

	if (rem > half || (rem == half && (q & 1u)))
		q++;
	return (uint16_t)(sign | q);
}

static __device__ __forceinline__ float f16_to_f32(uint32_t h)
{
	uint32_t sign = (h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;

	if (e == 0x1fu) /* inf, or NaN made quiet */
		return __uint_as_float(sign | 0x7f800000u | (m << 13) | (m ? 0x400000u : 0u));
	if (e == 0) {
		if (!m)
			return __uint_as_float(sign);
		/* Normalise: shift the leading one up to bit 10. */
		unsigned sh = (unsigned)__clz((int)m) - 21u;

		m <<= sh;
		return __uint_as_float(sign | ((113u - sh) << 23) | ((m & 0x3ffu) << 13));
	}
	return __uint_as_float(sign | ((e + 112u) << 23) | (m << 13));
}

static __device__ __forceinline__ uint16_t f32_to_bf16(float f)
{
	uint32_t u = __float_as_uint(f), a = u & 0x7fffffffu;

	if (a > 0x7f800000u) /* NaN: sign and top 7 payload bits, made quiet */
		return (uint16_t)((u >> 16) | 0x0040u);
	if (a >= 0x7f7f8000u) /* rounds to inf, or is inf: largest finite */
		return (uint16_t)(((u >> 16) & 0x8000u) | 0x7f7fu);
	return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

template <int C> static __device__ __forceinline__ uint32_t enc16(float f)
{
	return C == MPC_FP16 ? f32_to_f16(f) : f32_to_bf16(f);
}

template <int C> static __device__ __forceinline__ float dec16(uint32_t h)
{
	return C == MPC_FP16 ? f16_to_f32(h) : __uint_as_float(h << 16);
}

/* Units of 8 elements: two float4 in, one uint4 out when @vec (both 16-byte aligned). */
template <int C> static __global__ void k_enc16(const float *__restrict__ src, uint8_t *__restrict__ dst,
						size_t n, bool vec)
{
	const size_t units = n / 8 + (n % 8 != 0);

	for (size_t u = blockIdx.x * (size_t)blockDim.x + threadIdx.x; u < units;
	     u += (size_t)gridDim.x * blockDim.x) {
		size_t i = u * 8;

		if (vec && i + 8 <= n) {
			float4 a = __ldg((const float4 *)(src + i)), b = __ldg((const float4 *)(src + i + 4));
			uint4 o;

			o.x = enc16<C>(a.x) | enc16<C>(a.y) << 16;
			o.y = enc16<C>(a.z) | enc16<C>(a.w) << 16;
			o.z = enc16<C>(b.x) | enc16<C>(b.y) << 16;
			o.w = enc16<C>(b.z) | enc16<C>(b.w) << 16;
			*(uint4 *)(dst + 2 * i) = o;
		} else {
			for (size_t k = i; k < n && k < i + 8; k++)
				st_u16(dst + 2 * k, (uint16_t)enc16<C>(src[k]));
		}
	}
}

/* True when a status word is given and set: a guarded decode writes nothing then. */
static __device__ __forceinline__ bool stopped(const uint32_t *status)
{
	return status && *(volatile const uint32_t *)status;
}

/* out = decode, or out += w * decode when ACC. */
template <int C, bool ACC>
static __global__ void k_dec16(const uint8_t *__restrict__ src, float *__restrict__ out, size_t n,
			       float w, bool vec, const uint32_t *status)
{
	if (stopped(status))
		return;
	const size_t units = n / 8 + (n % 8 != 0);

	for (size_t u = blockIdx.x * (size_t)blockDim.x + threadIdx.x; u < units;
	     u += (size_t)gridDim.x * blockDim.x) {
		size_t i = u * 8;

		if (vec && i + 8 <= n) {
			uint4 h = __ldg((const uint4 *)(src + 2 * i));
			float4 a, b;

			if (ACC) {
				a = *(const float4 *)(out + i);
				b = *(const float4 *)(out + i + 4);
				a.x = axpy1(a.x, w, dec16<C>(h.x & 0xffffu));
				a.y = axpy1(a.y, w, dec16<C>(h.x >> 16));
				a.z = axpy1(a.z, w, dec16<C>(h.y & 0xffffu));
				a.w = axpy1(a.w, w, dec16<C>(h.y >> 16));
				b.x = axpy1(b.x, w, dec16<C>(h.z & 0xffffu));
				b.y = axpy1(b.y, w, dec16<C>(h.z >> 16));
				b.z = axpy1(b.z, w, dec16<C>(h.w & 0xffffu));
				b.w = axpy1(b.w, w, dec16<C>(h.w >> 16));
			} else {
				a = make_float4(dec16<C>(h.x & 0xffffu), dec16<C>(h.x >> 16),
						dec16<C>(h.y & 0xffffu), dec16<C>(h.y >> 16));
				b = make_float4(dec16<C>(h.z & 0xffffu), dec16<C>(h.z >> 16),
						dec16<C>(h.w & 0xffffu), dec16<C>(h.w >> 16));
			}
			*(float4 *)(out + i) = a;
			*(float4 *)(out + i + 4) = b;
		} else {
			for (size_t k = i; k < n && k < i + 8; k++) {
				float x = dec16<C>(ld_u16(src + 2 * k));

				out[k] = ACC ? axpy1(out[k], w, x) : x;
			}
		}
	}
}

/* "none": units of 4 fp32. */
template <bool ACC>
static __global__ void k_dec32(const uint8_t *__restrict__ src, float *__restrict__ out, size_t n,
			       float w, bool vec, const uint32_t *status)
{
	if (stopped(status))
		return;
	const size_t units = n / 4 + (n % 4 != 0);

	for (size_t u = blockIdx.x * (size_t)blockDim.x + threadIdx.x; u < units;
	     u += (size_t)gridDim.x * blockDim.x) {
		size_t i = u * 4;

		if (vec && i + 4 <= n) {
			float4 x = __ldg((const float4 *)(src + 4 * i));

			if (ACC) {
				float4 a = *(const float4 *)(out + i);

				x.x = axpy1(a.x, w, x.x);
				x.y = axpy1(a.y, w, x.y);
				x.z = axpy1(a.z, w, x.z);
				x.w = axpy1(a.w, w, x.w);
			}
			*(float4 *)(out + i) = x;
		} else {
			for (size_t k = i; k < n && k < i + 4; k++) {
				float x = ld_f32(src + 4 * k);

				out[k] = ACC ? axpy1(out[k], w, x) : x;
			}
		}
	}
}

/* ================================ uniform8 ================================ */

#define U8_TABLE 1024u
/* Element i of a chunk feeds the table iff i % U8_SAMPLE == 0 (spec; every encoder uses 16). */
#define U8_SAMPLE 16u

/* Partial statistics of one tile. */
struct u8_part {
	double s, q;
	unsigned long long nf;
	uint32_t mx, pad;
};

struct u8_state {
	unsigned long long hsum[256]; /* two's complement sums of round(x * 2^-e) */
	unsigned long long hcnt[256];
	double mu, qscale, qunit;     /* 2^-e, 2^e */
	float lo, inv, step, fill;
	int degenerate;               /* every code 128, every entry @fill */
};

static __device__ __forceinline__ uint32_t u8_code(float x, float lo, float inv, float nan_as)
{
	if (x != x)
		x = nan_as;
	float t = floorf(__fmul_rn(__fsub_rn(x, lo), inv));

	/* Clamped as a float, so +-inf and huge quotients convert safely. */
	t = fminf(fmaxf(t, 0.0f), 255.0f);
	return (uint32_t)t;
}

/* Tile layout shared by the two uniform8 passes: 4 x float4 per thread, strided for coalescing. */
static __global__ void k_u8_stats(const float *__restrict__ src, size_t n, bool vec, struct u8_part *part)
{
	const size_t t0 = (size_t)blockIdx.x * MPC_TILE;
	double s = 0.0, q = 0.0;
	uint32_t nf = 0, mx = 0;

	for (int j = 0; j < MPC_PER / 4; j++) {
		size_t e = t0 + ((size_t)j * MPC_TPB + threadIdx.x) * 4;
		float4 v = ld4(src, e, n, vec);

		for (int k = 0; k < 4; k++) {
			float x = f4get(v, k);

			if (e + k < n && finite32(x)) {
				double d = (double)x;

				s = __dadd_rn(s, d);
				q = __dadd_rn(q, __dmul_rn(d, d));
				nf++;
				mx = max(mx, __float_as_uint(x) & 0x7fffffffu);
			}
		}
	}
	s = block_sum_fixed(s);
	q = block_sum_fixed(q);
	nf = block_sum(nf);
	mx = block_max_u32(mx);
	if (threadIdx.x == 0) {
		part[blockIdx.x].s = s;
		part[blockIdx.x].q = q;
		part[blockIdx.x].nf = nf;
		part[blockIdx.x].mx = mx;
	}
}

static __device__ __forceinline__ double pow2d(int e)
{
	return __longlong_as_double((long long)(1023 + e) << 52);
}

/* One block: combine the tiles in order, then codec_quant.c's range rules. */
static __global__ void k_u8_final(const struct u8_part *part, size_t ntiles, size_t n, float sigmas,
				  struct u8_state *st)
{
	double s = 0.0, q = 0.0;
	unsigned long long nf = 0;
	uint32_t mx = 0;

	for (size_t t = threadIdx.x; t < ntiles; t += blockDim.x) {
		s = __dadd_rn(s, part[t].s);
		q = __dadd_rn(q, part[t].q);
		nf += part[t].nf;
		mx = max(mx, part[t].mx);
	}
	s = block_sum_fixed(s);
	q = block_sum_fixed(q);
	nf = block_sum(nf);
	mx = block_max_u32(mx);
	for (unsigned b = threadIdx.x; b < 256; b += blockDim.x)
		st->hsum[b] = st->hcnt[b] = 0;
	if (threadIdx.x)
		return;
	st->degenerate = 1;
	st->fill = 0.0f;
	if (!nf)
		return;
	double mu = __ddiv_rn(s, (double)nf);
	double var = __dsub_rn(__ddiv_rn(q, (double)nf), __dmul_rn(mu, mu));
	double sd = __dsqrt_rn(var > 0.0 ? var : 0.0);
	double k = (double)sigmas;
	float lo = __double2float_rn(__dsub_rn(mu, __dmul_rn(k, sd)));
	float step = __double2float_rn(__ddiv_rn(__dmul_rn(__dmul_rn(2.0, k), sd), 256.0));
	float hi = __double2float_rn(__dadd_rn((double)lo, __dmul_rn(256.0, (double)step)));

	st->mu = mu;
	st->fill = __double2float_rn(mu);
	if (sd == 0.0 || !(step >= FLT_MIN && step <= FLT_MAX) || !finite32(lo) || !finite32(hi))
		return;
	st->degenerate = 0;
	st->lo = lo;
	st->step = step;
	st->inv = __fdiv_rn(1.0f, step);
	/*
	 * Fixed point for the bucket sums: |x| < 2^E for every finite x, and
	 * fewer than 2^L elements are sampled, so with e = E + L - 62 no sum of
	 * round(x / 2^e) reaches 2^63. (The price of exact sums: a bucket whose
	 * values are ~2^40 times smaller than the chunk's largest |x| loses
	 * bits of its mean; that needs data spanning ~2^60 around a step so
	 * wide that the mean hardly matters, and stays within the one-step
	 * bound of the spec.)
	 */
	uint32_t ef = mx >> 23;
	int E = ef ? (int)ef - 126 : -126;
	int L = 64 - __clzll((long long)(n / U8_SAMPLE + 1));
	int e = E + L - 62;

	st->qscale = pow2d(-e);
	st->qunit = pow2d(e);
}

static __global__ void k_u8_codes(const float *__restrict__ src, size_t n, bool vec,
				  struct u8_state *st, uint8_t *__restrict__ codes, bool codes_al4)
{
	__shared__ unsigned long long hs[256], hc[256];
	const size_t t0 = (size_t)blockIdx.x * MPC_TILE;
	const bool deg = st->degenerate;
	const float lo = st->lo, inv = st->inv, nan_as = st->fill;
	const double qs = st->qscale;

	for (unsigned b = threadIdx.x; b < 256; b += blockDim.x)
		hs[b] = hc[b] = 0;
	__syncthreads();
	for (int j = 0; j < MPC_PER / 4; j++) {
		size_t e = t0 + ((size_t)j * MPC_TPB + threadIdx.x) * 4;

		if (e >= n)
			break;
		float4 v = ld4(src, e, n, vec);
		uint32_t word = 0;

		for (int k = 0; k < 4; k++) {
			float x = f4get(v, k);
			uint32_t c = 128;

			if (!deg && e + k < n) {
				c = u8_code(x, lo, inv, nan_as);
				/* Only a 1-in-U8_SAMPLE sample feeds the table (part of the format). */
				if ((e + k) % U8_SAMPLE == 0 && finite32(x)) {
					long long fx = __double2ll_rn(__dmul_rn((double)x, qs));

					atomicAdd(&hs[c], (unsigned long long)fx);
					atomicAdd(&hc[c], 1ull);
				}
			}
			word |= c << (8 * k);
		}
		if (codes_al4 && e + 4 <= n) {
			*(uint32_t *)(codes + e) = word;
		} else {
			for (int k = 0; k < 4 && e + k < n; k++)
				codes[e + k] = (uint8_t)(word >> (8 * k));
		}
	}
	__syncthreads();
	if (deg)
		return;
	for (unsigned b = threadIdx.x; b < 256; b += blockDim.x) {
		if (hc[b]) {
			atomicAdd(&st->hcnt[b], hc[b]);
			atomicAdd(&st->hsum[b], hs[b]);
		}
	}
}

static __global__ void k_u8_table(const struct u8_state *st, uint8_t *dst)
{
	const unsigned b = threadIdx.x;
	float v = st->fill;

	if (b >= 256)
		return;
	if (!st->degenerate) {
		unsigned long long c = st->hcnt[b];

		if (c) {
			double sum = __dmul_rn((double)(long long)st->hsum[b], st->qunit);

			v = __double2float_rn(__ddiv_rn(sum, (double)c));
		} else {
			/* Empty bucket: its centre, as the CPU writes it (never referenced). */
			double mid = __dmul_rn((double)b + 0.5, (double)st->step);

			v = __double2float_rn(__dadd_rn((double)st->lo, mid));
		}
	}
	st_u32(dst + 4 * b, __float_as_uint(v));
}

/*
 * Decode: every block loads and checks the whole table first, so either all
 * blocks write or none does (block 0 reports). Units of 4 codes.
 */
template <bool ACC>
static __global__ void k_u8_dec(const uint8_t *__restrict__ pl, float *__restrict__ out, size_t n,
				float w, bool vec, uint32_t *status)
{
	__shared__ float t[256];
	const uint8_t *codes = pl + U8_TABLE;
	int bad = 0;

	if (block_stopped(status))
		return;
	for (unsigned b = threadIdx.x; b < 256; b += blockDim.x) {
		float v = ld_f32(pl + 4 * b);

		bad |= !finite32(v);
		/* w * table[c] rounded once per entry is what every element would round to. */
		t[b] = ACC ? __fmul_rn(w, v) : v;
	}
	if (__syncthreads_or(bad)) {
		if (blockIdx.x == 0 && threadIdx.x == 0)
			atomicOr(status, MP_CUDA_BAD);
		return;
	}
	const size_t units = n / 4 + (n % 4 != 0);

	for (size_t u = blockIdx.x * (size_t)blockDim.x + threadIdx.x; u < units;
	     u += (size_t)gridDim.x * blockDim.x) {
		size_t i = u * 4;

		if (vec && i + 4 <= n) {
			uint32_t c = __ldg((const uint32_t *)(codes + i));
			float4 a;

			if (ACC) {
				a = *(const float4 *)(out + i);
				a.x = __fadd_rn(a.x, t[c & 0xff]);
				a.y = __fadd_rn(a.y, t[(c >> 8) & 0xff]);
				a.z = __fadd_rn(a.z, t[(c >> 16) & 0xff]);
				a.w = __fadd_rn(a.w, t[c >> 24]);
			} else {
				a = make_float4(t[c & 0xff], t[(c >> 8) & 0xff], t[(c >> 16) & 0xff], t[c >> 24]);
			}
			*(float4 *)(out + i) = a;
		} else {
			for (size_t k = i; k < n && k < i + 4; k++) {
				float x = t[__ldg(codes + k)];

				out[k] = ACC ? __fadd_rn(out[k], x) : x;
			}
		}
	}
}

static size_t u8_scratch(size_t n)
{
	return mpc_round_up(sizeof(struct u8_state)) +
	       mpc_round_up(mpc_div_up(n, MPC_TILE) * sizeof(struct u8_part));
}

static int u8_encode(const struct mp_codec_params *p, const float *src, size_t n, uint8_t *dst,
		     size_t cap, size_t *len, void *scratch, size_t sbytes, cudaStream_t s)
{
	if (!mp_codec_params_ok(p))
		return -EINVAL;
	if (n > SIZE_MAX - U8_TABLE || cap < U8_TABLE + n)
		return -ENOSPC;
	if (sbytes < u8_scratch(n) || !scratch)
		return -EINVAL;
	struct mpc_carve c = {(unsigned char *)scratch, 0};
	struct u8_state *st = (struct u8_state *)mpc_take(&c, sizeof(struct u8_state));
	size_t ntiles = mpc_div_up(n, MPC_TILE);
	struct u8_part *part = (struct u8_part *)mpc_take(&c, ntiles * sizeof(struct u8_part));
	bool vec = mpc_aligned(src, 16);

	if (n)
		k_u8_stats<<<(unsigned)ntiles, MPC_TPB, 0, s>>>(src, n, vec, part);
	k_u8_final<<<1, MPC_SCAN_TPB, 0, s>>>(part, ntiles, n, p->sigmas, st);
	if (n)
		k_u8_codes<<<(unsigned)ntiles, MPC_TPB, 0, s>>>(src, n, vec, st, dst + U8_TABLE,
							       mpc_aligned(dst, 4));
	k_u8_table<<<1, 256, 0, s>>>(st, dst);
	*len = U8_TABLE + n;
	return launched();
}

/* ================================ blockwise8 ================================ */

#define BW8_MAX_BLOCK (1u << 24)

struct bw8p {
	float s, f, inv;
};

/*
 * s = a/127 and inv = 127/a; where 127/a overflows although s does not,
 * values are first scaled by 2^64, as quant.c does, which gives the codes
 * the formula means. The cases are told apart on the bits of a, as the CPU
 * encoder does (mp_codec_params.h says why).
 */
static __device__ __forceinline__ struct bw8p bw8_params(uint32_t abits)
{
	float a = __uint_as_float(abits);
	struct bw8p r;

	r.s = __fdiv_rn(a, 127.0f);
	r.f = 1.0f;
	r.inv = 0.0f;
	if (abits <= MP_BW8_ZERO_STEP_MAX) {
		r.s = 0.0f;
		return r;
	}
	/* a = FLT_MAX: 127 * s would decode to inf; the next float down does not (spec). */
	if (abits == MP_BW8_STEP_DOWN)
		r.s = __uint_as_float(__float_as_uint(r.s) - 1u);
	r.inv = __fdiv_rn(127.0f, a);
	if (abits <= MP_BW8_PRESCALE_MAX) {
		r.f = 18446744073709551616.0f; /* 2^64 */
		r.inv = __fdiv_rn(127.0f, __fmul_rn(a, r.f));
	}
	return r;
}

static __device__ __forceinline__ uint32_t bw8_code(float x, const struct bw8p &p)
{
	if (p.s == 0.0f)
		return 0;
	float t = __fmul_rn(__fmul_rn(x, p.f), p.inv);

	if (t != t) /* NaN input */
		return 0;
	t = fminf(fmaxf(t, -127.0f), 127.0f);
	return (uint32_t)(int)rintf(t) & 0xffu; /* round half even, as the CPU */
}

static __device__ __forceinline__ uint32_t absbits_finite(float x)
{
	uint32_t a = __float_as_uint(x) & 0x7fffffffu;

	return a < 0x7f800000u ? a : 0u;
}

/* Writes 4 codes packed in @word at codes[e..], the ones below @end. */
static __device__ __forceinline__ void put_codes4(uint8_t *codes, size_t e, size_t end, uint32_t word,
						  bool al4)
{
	if (al4 && e + 4 <= end) {
		*(uint32_t *)(codes + e) = word;
		return;
	}
	for (int k = 0; k < 4 && e + k < end; k++)
		codes[e + k] = (uint8_t)(word >> (8 * k));
}

/*
 * One block of B <= 16 * GS values per group of GS threads, in registers.
 * VEC: B % 4 == 0 and src 16-byte aligned, so each thread takes float4s.
 */
template <int GS, bool VEC>
static __global__ void __launch_bounds__(MPC_TPB)
	k_bw8_group(const float *__restrict__ src, size_t n, uint32_t B, size_t nb, uint8_t *__restrict__ steps,
		    uint8_t *__restrict__ codes, bool codes_al4)
{
	const int t = (int)(threadIdx.x % GS);
	const size_t seg = (size_t)blockIdx.x * (MPC_TPB / GS) + threadIdx.x / GS;
	const size_t s0 = seg * B;
	const size_t s1 = seg < nb ? min_sz(s0 + B, n) : s0;
	float v[MPC_PER];
	uint32_t m = 0;

	for (int j = 0; j < MPC_PER / 4; j++) {
		if (VEC) {
			float4 q = ld4(src, s0 + ((size_t)j * GS + t) * 4, s1, true);

			v[4 * j] = q.x;
			v[4 * j + 1] = q.y;
			v[4 * j + 2] = q.z;
			v[4 * j + 3] = q.w;
		} else {
			for (int k = 0; k < 4; k++) {
				size_t e = s0 + (size_t)(4 * j + k) * GS + t;

				v[4 * j + k] = e < s1 ? src[e] : 0.0f;
			}
		}
	}
	for (int j = 0; j < MPC_PER; j++)
		m = max(m, absbits_finite(v[j]));
	m = group_max<GS>(m);
	if (seg >= nb)
		return;
	const struct bw8p p = bw8_params(m);

	if (VEC) {
		for (int j = 0; j < MPC_PER / 4; j++) {
			size_t e = s0 + ((size_t)j * GS + t) * 4;

			if (e >= s1)
				break;
			uint32_t w = bw8_code(v[4 * j], p) | bw8_code(v[4 * j + 1], p) << 8 |
				     bw8_code(v[4 * j + 2], p) << 16 | bw8_code(v[4 * j + 3], p) << 24;

			put_codes4(codes, e, s1, w, codes_al4);
		}
	} else {
		for (int j = 0; j < MPC_PER; j++) {
			size_t e = s0 + (size_t)j * GS + t;

			if (e < s1)
				codes[e] = (uint8_t)bw8_code(v[j], p);
		}
	}
	if (t == 0)
		st_u32(steps + 4 * seg, __float_as_uint(p.s));
}

/* B > MPC_TILE: a tile meets at most two blocks, A (where it starts) and A + 1. */
static __global__ void k_bw8_absmax(const float *__restrict__ src, size_t n, size_t B, bool vec,
				    uint32_t *gmax)
{
	const size_t t0 = (size_t)blockIdx.x * MPC_TILE;
	const size_t sa = t0 / B, bnd = (sa + 1) * B;
	uint32_t ma = 0, mb = 0;

	for (int j = 0; j < MPC_PER / 4; j++) {
		size_t e = t0 + ((size_t)j * MPC_TPB + threadIdx.x) * 4;
		float4 v = ld4(src, e, n, vec);

		for (int k = 0; k < 4; k++) {
			uint32_t a = absbits_finite(f4get(v, k));

			if (e + k < bnd)
				ma = max(ma, a);
			else
				mb = max(mb, a);
		}
	}
	ma = block_max_u32(ma);
	mb = block_max_u32(mb);
	if (threadIdx.x == 0) {
		atomicMax(&gmax[sa], ma);
		if (bnd < min_sz(t0 + MPC_TILE, n))
			atomicMax(&gmax[sa + 1], mb);
	}
}

static __global__ void k_bw8_quant(const float *__restrict__ src, size_t n, size_t B, bool vec,
				   const uint32_t *__restrict__ gmax, uint8_t *__restrict__ steps,
				   uint8_t *__restrict__ codes, bool codes_al4)
{
	const size_t t0 = (size_t)blockIdx.x * MPC_TILE, tend = min_sz(t0 + MPC_TILE, n);
	const size_t sa = t0 / B, bnd = (sa + 1) * B;
	const bool has_b = bnd < tend;
	const struct bw8p pa = bw8_params(gmax[sa]);
	const struct bw8p pb = bw8_params(has_b ? gmax[sa + 1] : 0u);

	for (int j = 0; j < MPC_PER / 4; j++) {
		size_t e = t0 + ((size_t)j * MPC_TPB + threadIdx.x) * 4;

		if (e >= n)
			break;
		float4 v = ld4(src, e, n, vec);
		uint32_t w = 0;

		for (int k = 0; k < 4; k++)
			w |= bw8_code(f4get(v, k), e + k < bnd ? pa : pb) << (8 * k);
		put_codes4(codes, e, n, w, codes_al4);
	}
	/* Each block's step is written by the tile its first element lies in. */
	if (threadIdx.x == 0) {
		if (sa * B == t0)
			st_u32(steps + 4 * sa, __float_as_uint(pa.s));
		if (has_b)
			st_u32(steps + 4 * (sa + 1), __float_as_uint(pb.s));
	}
}

/* Payload checks only the device can make: B in range and consistent with @nb, steps. */
static __global__ void k_bw8_check(const uint8_t *__restrict__ pl, size_t n, size_t nb, uint32_t *status)
{
	int bad = 0;

	if (blockIdx.x == 0 && threadIdx.x == 0) {
		uint32_t B = ld_u32(pl);

		bad = B < 1 || B > BW8_MAX_BLOCK || mpc_div_up(n, B) != nb;
	}
	for (size_t j = blockIdx.x * (size_t)blockDim.x + threadIdx.x; j < nb;
	     j += (size_t)gridDim.x * blockDim.x) {
		float v = ld_f32(pl + 4 + 4 * j);

		/* -0.0 is a zero step, not a negative one; 127 * step must stay
		 * finite, and where 128 * step does not, code -128 (outside the
		 * spec) would decode to -inf: the rules of codec_quant.c. */
		bad |= !(v >= 0.0f) || !finite32(v) || !finite32(__fmul_rn(127.0f, v));
		if (!bad && !finite32(__fmul_rn(128.0f, v))) {
			const uint32_t B = ld_u32(pl);
			const uint8_t *codes = pl + 4 + 4 * nb;
			/* Only thread 0 checked B against nb: stay inside the codes. */
			size_t lo = j * B, hi = lo < n && n - lo < B ? n : lo + B;

			for (size_t i = lo; i < hi && i < n && !bad; i++)
				bad = codes[i] == 0x80;
		}
	}
	if (bad)
		atomicOr(status, MP_CUDA_BAD);
}

template <bool ACC>
static __global__ void k_bw8_dec(const uint8_t *__restrict__ pl, size_t nb, float *__restrict__ out,
				 size_t n, float w, bool vec, const uint32_t *status)
{
	if (stopped(status))
		return;
	const size_t B = ld_u32(pl);
	const uint8_t *steps = pl + 4, *codes = pl + 4 + 4 * nb;
	const bool narrow = n <= UINT32_MAX; /* 32-bit divisions are several times cheaper */
	/* A power-of-two block (the default, 4096) takes a shift: no division at all. */
	const int shift = B && !(B & (B - 1)) ? __ffsll((long long)B) - 1 : -1;
	const size_t units = n / 4 + (n % 4 != 0);

	for (size_t u = blockIdx.x * (size_t)blockDim.x + threadIdx.x; u < units;
	     u += (size_t)gridDim.x * blockDim.x) {
		size_t i = u * 4;
		size_t b0 = shift >= 0 ? i >> shift : narrow ? (size_t)((uint32_t)i / (uint32_t)B) : i / B;
		size_t bnd = (b0 + 1) * B;
		float s0 = ld_f32(steps + 4 * b0), s1 = s0;

		/* B >= 4: at most one block boundary in a unit; smaller B: rare, divide. */
		if (bnd < i + 4 && bnd < n && B >= 4)
			s1 = ld_f32(steps + 4 * (b0 + 1));
		if (vec && i + 4 <= n) {
			uint32_t c = __ldg((const uint32_t *)(codes + i));
			float4 a = ACC ? *(const float4 *)(out + i) : make_float4(0, 0, 0, 0);

			for (int k = 0; k < 4; k++) {
				float s = B >= 4 ? (i + k < bnd ? s0 : s1) : ld_f32(steps + 4 * ((i + k) / B));
				float x = __fmul_rn((float)(int8_t)(c >> (8 * k)), s);

				f4set(a, k, ACC ? axpy1(f4get(a, k), w, x) : x);
			}
			*(float4 *)(out + i) = a;
		} else {
			for (size_t k = i; k < n && k < i + 4; k++) {
				float s = B >= 4 ? (k < bnd ? s0 : s1) : ld_f32(steps + 4 * (k / B));
				float x = __fmul_rn((float)(int8_t)__ldg(codes + k), s);

				out[k] = ACC ? axpy1(out[k], w, x) : x;
			}
		}
	}
}

static size_t bw8_nb(size_t n, uint32_t B)
{
	return n / B + (n % B != 0);
}

static size_t bw8_scratch(const struct mp_codec_params *p, size_t n)
{
	if (!mp_codec_params_ok(p) || p->block <= MPC_TILE)
		return 0;
	return mpc_round_up(bw8_nb(n, p->block) * sizeof(uint32_t));
}

template <int GS>
static void bw8_group_launch(const float *src, size_t n, uint32_t B, size_t nb, uint8_t *steps,
			     uint8_t *codes, cudaStream_t s)
{
	unsigned grid = (unsigned)mpc_div_up(nb, MPC_TPB / GS);
	bool al4 = mpc_aligned(codes, 4);

	if (B % 4 == 0 && mpc_aligned(src, 16))
		k_bw8_group<GS, true><<<grid, MPC_TPB, 0, s>>>(src, n, B, nb, steps, codes, al4);
	else
		k_bw8_group<GS, false><<<grid, MPC_TPB, 0, s>>>(src, n, B, nb, steps, codes, al4);
}

static int bw8_encode(const struct mp_codec_params *p, const float *src, size_t n, uint8_t *dst,
		      size_t cap, size_t *len, void *scratch, size_t sbytes, cudaStream_t s)
{
	if (!mp_codec_params_ok(p))
		return -EINVAL;
	const uint32_t B = p->block;
	size_t nb = bw8_nb(n, B);

	if (n > SIZE_MAX - 4 || nb > (SIZE_MAX - 4 - n) / 4 || cap < 4 + 4 * nb + n)
		return -ENOSPC;
	if (sbytes < bw8_scratch(p, n) || (bw8_scratch(p, n) && !scratch))
		return -EINVAL;
	uint8_t *steps = dst + 4, *codes = dst + 4 + 4 * nb;

	k_put_u32<<<1, 1, 0, s>>>(dst, B);
	if (n && B <= MPC_TILE) {
		switch (mpc_group_size(B)) {
		case 1: bw8_group_launch<1>(src, n, B, nb, steps, codes, s); break;
		case 2: bw8_group_launch<2>(src, n, B, nb, steps, codes, s); break;
		case 4: bw8_group_launch<4>(src, n, B, nb, steps, codes, s); break;
		case 8: bw8_group_launch<8>(src, n, B, nb, steps, codes, s); break;
		case 16: bw8_group_launch<16>(src, n, B, nb, steps, codes, s); break;
		case 32: bw8_group_launch<32>(src, n, B, nb, steps, codes, s); break;
		case 64: bw8_group_launch<64>(src, n, B, nb, steps, codes, s); break;
		case 128: bw8_group_launch<128>(src, n, B, nb, steps, codes, s); break;
		default: bw8_group_launch<256>(src, n, B, nb, steps, codes, s); break;
		}
	} else if (n) {
		uint32_t *gmax = (uint32_t *)scratch;
		unsigned ntiles = (unsigned)mpc_div_up(n, MPC_TILE);
		bool vec = mpc_aligned(src, 16);

		int r = mpc_err(cudaMemsetAsync(gmax, 0, nb * sizeof(uint32_t), s));

		if (r)
			return r;
		k_bw8_absmax<<<ntiles, MPC_TPB, 0, s>>>(src, n, B, vec, gmax);
		k_bw8_quant<<<ntiles, MPC_TPB, 0, s>>>(src, n, B, vec, gmax, steps, codes,
						       mpc_aligned(codes, 4));
	}
	*len = 4 + 4 * nb + n;
	return launched();
}

/* ================================ public entry points ================================ */

extern "C" int mp_cuda_available(char *why, size_t n)
{
	int count = 0, dev = 0, major = 0;
	cudaError_t e = cudaGetDeviceCount(&count);
	char msg[160];

	if (e != cudaSuccess) {
		snprintf(msg, sizeof(msg), "CUDA runtime: %s", cudaGetErrorString(e));
		(void)cudaGetLastError();
	} else if (count == 0) {
		snprintf(msg, sizeof(msg), "no CUDA device");
	} else if ((e = cudaGetDevice(&dev)) != cudaSuccess ||
		   (e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev)) !=
			   cudaSuccess) {
		snprintf(msg, sizeof(msg), "CUDA device query: %s", cudaGetErrorString(e));
		(void)cudaGetLastError();
	} else if (major < 8) {
		snprintf(msg, sizeof(msg), "device %d has compute capability %d.x; these kernels need 8.0",
			 dev, major);
	} else {
		if (why && n)
			why[0] = '\0';
		return 0;
	}
	if (why && n)
		snprintf(why, n, "%s", msg);
	return -ENODEV;
}

/* Sets *flag when any of src[0..n) is NaN or infinite: one word written by
 * at most one thread per block, after a block-wide vote. */
static __global__ void k_nonfinite(const float *__restrict__ src, size_t n, uint32_t *flag)
{
	int bad = 0;

	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n && !bad;
	     i += (size_t)gridDim.x * blockDim.x)
		bad = !isfinite(src[i]);
	if (__syncthreads_or(bad) && threadIdx.x == 0)
		atomicOr(flag, 1u);
}

extern "C" int mp_cuda_check_finite(const float *d_src, size_t count, uint32_t *d_flag,
				    void *stream)
{
	if (!d_flag || !mpc_aligned(d_src, 4))
		return -EINVAL;
	if (!count)
		return 0;
	k_nonfinite<<<mpc_gs_grid(count), MPC_TPB, 0, (cudaStream_t)stream>>>(d_src, count, d_flag);
	return launched();
}

extern "C" int mp_cuda_codec_supported(int codec)
{
	return codec >= MPC_NONE && codec <= MPC_ADACOMP;
}

extern "C" size_t mp_cuda_max_encoded(int codec, const struct mp_codec_params *p, size_t count)
{
	switch (codec) {
	case MPC_NONE:
		return count > SIZE_MAX / 4 ? SIZE_MAX : 4 * count;
	case MPC_FP16:
	case MPC_BF16:
		return count > SIZE_MAX / 2 ? SIZE_MAX : 2 * count;
	case MPC_UNIFORM8:
		return count > SIZE_MAX - U8_TABLE ? SIZE_MAX : U8_TABLE + count;
	case MPC_BLOCKWISE8: {
		size_t nb = bw8_nb(count, mp_codec_params_ok(p) ? p->block : 1u);

		if (count > SIZE_MAX - 4 || nb > (SIZE_MAX - 4 - count) / 4)
			return SIZE_MAX;
		return 4 + 4 * nb + count;
	}
	case MPC_TOPK:
		return mpc_topk_max(p, count);
	case MPC_ADACOMP:
		return mpc_ada_max(count);
	default:
		return 0;
	}
}

extern "C" size_t mp_cuda_scratch_size(int codec, const struct mp_codec_params *p, size_t count)
{
	switch (codec) {
	case MPC_UNIFORM8:
		return u8_scratch(count);
	case MPC_BLOCKWISE8:
		return bw8_scratch(p, count);
	case MPC_TOPK:
		return mpc_topk_scratch(p, count);
	case MPC_ADACOMP:
		return mpc_ada_scratch(p, count);
	default:
		return 0;
	}
}

extern "C" int mp_cuda_encode(int codec, const struct mp_codec_params *p, const float *d_src,
			      float *d_residue, size_t count, void *d_dst, size_t cap, size_t *len,
			      void *d_scratch, size_t scratch_bytes, void *stream)
{
	cudaStream_t s = (cudaStream_t)stream;
	uint8_t *dst = (uint8_t *)d_dst;

	if (!len || !mpc_aligned(d_src, 4) || !mpc_aligned(d_residue, 4) ||
	    !mpc_aligned(d_scratch, MPC_SCRATCH_ALIGN))
		return -EINVAL;
	switch (codec) {
	case MPC_NONE:
		if (count > SIZE_MAX / 4 || cap < 4 * count)
			return -ENOSPC;
		*len = 4 * count;
		return count ? mpc_err(cudaMemcpyAsync(dst, d_src, 4 * count, cudaMemcpyDeviceToDevice, s))
			     : 0;
	case MPC_FP16:
	case MPC_BF16: {
		if (count > SIZE_MAX / 2 || cap < 2 * count)
			return -ENOSPC;
		if (count) {
			unsigned g = mpc_gs_grid(mpc_div_up(count, 8));
			bool vec = mpc_aligned(d_src, 16) && mpc_aligned(dst, 16);

			if (codec == MPC_FP16)
				k_enc16<MPC_FP16><<<g, MPC_TPB, 0, s>>>(d_src, dst, count, vec);
			else
				k_enc16<MPC_BF16><<<g, MPC_TPB, 0, s>>>(d_src, dst, count, vec);
		}
		*len = 2 * count;
		return launched();
	}
	case MPC_UNIFORM8:
		return u8_encode(p, d_src, count, dst, cap, len, d_scratch, scratch_bytes, s);
	case MPC_BLOCKWISE8:
		return bw8_encode(p, d_src, count, dst, cap, len, d_scratch, scratch_bytes, s);
	case MPC_TOPK:
		return mpc_topk_encode(p, d_src, d_residue, count, dst, cap, len, d_scratch,
				       scratch_bytes, s);
	case MPC_ADACOMP:
		return mpc_ada_encode(p, d_src, d_residue, count, dst, cap, len, d_scratch,
				      scratch_bytes, s);
	default:
		return -EINVAL;
	}
}

extern "C" size_t mp_cuda_decode_scratch_size(int codec, size_t len, size_t count)
{
	(void)count;
	if (codec == MPC_TOPK || codec == MPC_ADACOMP)
		return mpc_sparse_dec_scratch(len);
	return 0;
}

extern "C" int mp_cuda_decode_async(int codec, const void *d_payload, size_t len, float *d_acc,
				    size_t count, float w, int acc_mode, uint32_t *d_status,
				    void *d_scratch, size_t scratch_bytes, void *stream)
{
	cudaStream_t s = (cudaStream_t)stream;
	const uint8_t *pl = (const uint8_t *)d_payload;
	const bool acc = acc_mode != 0;

	if (!mpc_aligned(d_acc, 4) || !mpc_aligned(d_scratch, MPC_SCRATCH_ALIGN))
		return -EINVAL;
	switch (codec) {
	case MPC_NONE:
		if (count > SIZE_MAX / 4 || len != 4 * count)
			return -EBADMSG;
		if (!count)
			return 0;
		if (!acc && !d_status)
			return mpc_err(cudaMemcpyAsync(d_acc, pl, 4 * count, cudaMemcpyDeviceToDevice, s));
		if (acc)
			k_dec32<true><<<mpc_gs_grid(mpc_div_up(count, 4)), MPC_TPB, 0, s>>>(
				pl, d_acc, count, w, mpc_aligned(pl, 16) && mpc_aligned(d_acc, 16), d_status);
		else
			k_dec32<false><<<mpc_gs_grid(mpc_div_up(count, 4)), MPC_TPB, 0, s>>>(
				pl, d_acc, count, w, mpc_aligned(pl, 16) && mpc_aligned(d_acc, 16), d_status);
		return launched();
	case MPC_FP16:
	case MPC_BF16: {
		if (count > SIZE_MAX / 2 || len != 2 * count)
			return -EBADMSG;
		if (!count)
			return 0;
		unsigned g = mpc_gs_grid(mpc_div_up(count, 8));
		bool vec = mpc_aligned(pl, 16) && mpc_aligned(d_acc, 16);

		if (codec == MPC_FP16 && acc)
			k_dec16<MPC_FP16, true><<<g, MPC_TPB, 0, s>>>(pl, d_acc, count, w, vec, d_status);
		else if (codec == MPC_FP16)
			k_dec16<MPC_FP16, false><<<g, MPC_TPB, 0, s>>>(pl, d_acc, count, w, vec, d_status);
		else if (acc)
			k_dec16<MPC_BF16, true><<<g, MPC_TPB, 0, s>>>(pl, d_acc, count, w, vec, d_status);
		else
			k_dec16<MPC_BF16, false><<<g, MPC_TPB, 0, s>>>(pl, d_acc, count, w, vec, d_status);
		return launched();
	}
	case MPC_UNIFORM8: {
		if (count > SIZE_MAX - U8_TABLE || len != U8_TABLE + count)
			return -EBADMSG;
		if (!d_status)
			return -EINVAL;
		/* At least one block even for count 0: the table is checked all the same. */
		unsigned g = mpc_gs_grid(mpc_div_up(count, 4));
		bool vec = mpc_aligned(pl + U8_TABLE, 4) && mpc_aligned(d_acc, 16);

		if (acc)
			k_u8_dec<true><<<g, MPC_TPB, 0, s>>>(pl, d_acc, count, w, vec, d_status);
		else
			k_u8_dec<false><<<g, MPC_TPB, 0, s>>>(pl, d_acc, count, w, vec, d_status);
		return launched();
	}
	case MPC_BLOCKWISE8: {
		if (count > SIZE_MAX - 4 || len < 4 + count || (len - 4 - count) % 4)
			return -EBADMSG;
		if (!d_status)
			return -EINVAL;
		size_t nb = (len - 4 - count) / 4;

		k_bw8_check<<<mpc_gs_grid(nb), MPC_TPB, 0, s>>>(pl, count, nb, d_status);
		if (count) {
			unsigned g = mpc_gs_grid(mpc_div_up(count, 4));
			bool vec = mpc_aligned(pl + 4 + 4 * nb, 4) && mpc_aligned(d_acc, 16);

			if (acc)
				k_bw8_dec<true><<<g, MPC_TPB, 0, s>>>(pl, nb, d_acc, count, w, vec, d_status);
			else
				k_bw8_dec<false><<<g, MPC_TPB, 0, s>>>(pl, nb, d_acc, count, w, vec, d_status);
		}
		return launched();
	}
	case MPC_TOPK:
	case MPC_ADACOMP:
		if (len < (codec == MPC_TOPK ? 4u : 12u))
			return -EBADMSG;
		if (!d_status || (!d_scratch && mpc_sparse_dec_scratch(len)) ||
		    scratch_bytes < mpc_sparse_dec_scratch(len))
			return -EINVAL;
		return mpc_sparse_decode(codec, pl, len, d_acc, count, w, acc, d_status, d_scratch, s);
	default:
		return -EINVAL;
	}
}

/* Status word plus whatever the decoder needs, in one temporary allocation. */
static int decode_sync(int codec, const void *d_payload, size_t len, float *d_out, size_t count,
		       float w, int acc, void *stream)
{
	cudaStream_t s = (cudaStream_t)stream;
	size_t need;
	void *tmp = NULL;
	int pooled = 0, r;
	uint32_t status = 0;

	if (codec == MPC_NONE || codec == MPC_FP16 || codec == MPC_BF16)
		return mp_cuda_decode_async(codec, d_payload, len, d_out, count, w, acc, NULL, NULL, 0,
					    stream);
	if (codec < 0 || codec > MPC_ADACOMP)
		return -EINVAL;
	need = MPC_SALIGN + mp_cuda_decode_scratch_size(codec, len, count);
	r = mpc_tmp_alloc(&tmp, need, s, &pooled);
	if (r)
		return r;
	r = mpc_err(cudaMemsetAsync(tmp, 0, sizeof(uint32_t), s));
	if (!r)
		r = mp_cuda_decode_async(codec, d_payload, len, d_out, count, w, acc, (uint32_t *)tmp,
					 (unsigned char *)tmp + MPC_SALIGN, need - MPC_SALIGN, stream);
	if (!r)
		r = mpc_err(cudaMemcpyAsync(&status, tmp, sizeof(status), cudaMemcpyDeviceToHost, s));
	if (!r)
		r = mpc_err(cudaStreamSynchronize(s));
	mpc_tmp_free(tmp, s, pooled);
	if (!r && status)
		r = -EBADMSG;
	return r;
}

extern "C" int mp_cuda_decode(int codec, const void *d_payload, size_t len, float *d_dst, size_t count,
			      void *stream)
{
	return decode_sync(codec, d_payload, len, d_dst, count, 0.0f, 0, stream);
}

extern "C" int mp_cuda_decode_acc(int codec, const void *d_payload, size_t len, float *d_acc,
				  size_t count, float w, void *stream)
{
	return decode_sync(codec, d_payload, len, d_acc, count, w, 1, stream);
}
