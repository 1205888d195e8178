/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * CRC32C (Castagnoli, reflected polynomial 0x82F63B78), as used by iSCSI,
 * ext4 and SSE4.2's crc32 instruction.
 *
 * Two implementations give bit-identical results: a portable slicing-by-8
 * table walk, and an SSE4.2 one that runs three independent streams over
 * adjacent blocks (the crc32 instruction has a latency of about three cycles
 * but a throughput of one, so one dependent chain leaves two thirds of the
 * unit idle) and merges them with a precomputed "append B zero bytes"
 * operator. The choice is made once, at first use, from CPUID.
 *
 * Internally everything works on the raw shift register; the public entry
 * points apply the customary pre/post inversion so that calls chain:
 * mp_crc32c(mp_crc32c(0, a), b) == mp_crc32c(0, a || b).
 */
#include "crc32c.h"

#include <pthread.h>
#include <stdint.h>
#include <string.h>

/* MP_CRC32C_NO_HW builds the portable path only (to test it on any host). */
#if !defined(MP_CRC32C_NO_HW) && defined(__x86_64__) && \
	(defined(__GNUC__) || defined(__clang__))
#define CRC_HAVE_HW 1
#include <nmmintrin.h>
#else
#define CRC_HAVE_HW 0
#endif

#define CRC32C_POLY 0x82f63b78u

/* Test hook: always the table implementation. */
uint32_t mp_crc32c_sw(uint32_t crc, const void *buf, size_t len);

typedef uint32_t (*crc_raw_fn)(uint32_t crc, const unsigned char *p, size_t len);

static uint32_t crc_tab[8][256];
static crc_raw_fn crc_impl;
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

static inline uint32_t load_le32(const unsigned char *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
	       (uint32_t)p[3] << 24;
}

/* Slicing-by-8: eight bytes per step through eight 256-entry tables. */
static uint32_t crc_sw_raw(uint32_t crc, const unsigned char *p, size_t len)
{
	while (len >= 8) {
		uint32_t lo = load_le32(p) ^ crc;
		uint32_t hi = load_le32(p + 4);

		crc = crc_tab[7][lo & 0xff] ^ crc_tab[6][(lo >> 8) & 0xff] ^
		      crc_tab[5][(lo >> 16) & 0xff] ^ crc_tab[4][lo >> 24] ^
		      crc_tab[3][hi & 0xff] ^ crc_tab[2][(hi >> 8) & 0xff] ^
		      crc_tab[1][(hi >> 16) & 0xff] ^ crc_tab[0][hi >> 24];
		p += 8;
		len -= 8;
	}
	while (len--)
		crc = (crc >> 8) ^ crc_tab[0][(crc ^ *p++) & 0xff];
	return crc;
}

#if CRC_HAVE_HW
/*
 * Block sizes of the three-stream loop. The long one amortises the merge;
 * the short one lets buffers of a few KiB (typical headers + small chunks)
 * use all three streams too.
 */
#define CRC_LONG_BLOCK 4096
#define CRC_SHORT_BLOCK 256

/*
 * shift_X.t[j][b] = (b << 8j) * x^(8X) mod P: the register after appending X
 * zero bytes is linear in the register, so four lookups apply the operator.
 */
struct crc_shift {
	uint32_t t[4][256];
};
static struct crc_shift shift_long, shift_short;

/* a * b mod P in the reflected domain (bit 31 is x^0). */
static uint32_t gf_mulmod(uint32_t a, uint32_t b)
{
	uint32_t prod = 0;

	for (int i = 0; i < 32; i++) {
		if (a & (0x80000000u >> i))
			prod ^= b;
		b = (b & 1) ? (b >> 1) ^ CRC32C_POLY : b >> 1;
	}
	return prod;
}

static void build_shift(struct crc_shift *sh, size_t nbytes)
{
	/* x^(8 nbytes): start from the polynomial 1 and append zero bytes. */
	uint32_t k = 0x80000000u;

	for (size_t i = 0; i < nbytes; i++)
		k = (k >> 8) ^ crc_tab[0][k & 0xff];
	for (int j = 0; j < 4; j++)
		for (uint32_t b = 0; b < 256; b++)
			sh->t[j][b] = gf_mulmod(b << (8 * j), k);
}

static inline uint32_t apply_shift(const struct crc_shift *sh, uint32_t crc)
{
	return sh->t[0][crc & 0xff] ^ sh->t[1][(crc >> 8) & 0xff] ^
	       sh->t[2][(crc >> 16) & 0xff] ^ sh->t[3][crc >> 24];
}

static inline uint64_t load_u64(const unsigned char *p)
{
	uint64_t v;

	/* memcpy: no alignment or aliasing assumptions; compiles to one load */
	memcpy(&v, p, sizeof(v));
	return v;
}

/*
 * CRC of 3 * @block bytes from @crc: streams 1 and 2 start from a zero
 * register, which is valid because the register is linear in its start value:
 * crc(s, A || B) = shift_|B|(crc(s, A)) ^ crc(0, B).
 */
__attribute__((target("sse4.2"))) static inline uint32_t
crc_hw_3way(uint32_t crc, const unsigned char *p, size_t block, const struct crc_shift *shift)
{
	uint64_t c0 = crc, c1 = 0, c2 = 0;
	const unsigned char *p1 = p + block, *p2 = p + 2 * block;

	for (size_t i = 0; i < block; i += 8) {
		c0 = _mm_crc32_u64(c0, load_u64(p + i));
		c1 = _mm_crc32_u64(c1, load_u64(p1 + i));
		c2 = _mm_crc32_u64(c2, load_u64(p2 + i));
	}
	crc = apply_shift(shift, (uint32_t)c0) ^ (uint32_t)c1;
	return apply_shift(shift, crc) ^ (uint32_t)c2;
}

__attribute__((target("sse4.2"))) static uint32_t
crc_hw_raw(uint32_t crc, const unsigned char *p, size_t len)
{
	uint64_t c;

	/* Align so that the 8-byte loads do not straddle cache lines. */
	while (len && ((uintptr_t)p & 7)) {
		crc = _mm_crc32_u8(crc, *p++);
		len--;
	}
	while (len >= 3 * CRC_LONG_BLOCK) {
		crc = crc_hw_3way(crc, p, CRC_LONG_BLOCK, &shift_long);
		p += 3 * CRC_LONG_BLOCK;
		len -= 3 * CRC_LONG_BLOCK;
	}
	while (len >= 3 * CRC_SHORT_BLOCK) {
		crc = crc_hw_3way(crc, p, CRC_SHORT_BLOCK, &shift_short);
		p += 3 * CRC_SHORT_BLOCK;
		len -= 3 * CRC_SHORT_BLOCK;
	}
	c = crc;
	while (len >= 8) {
		c = _mm_crc32_u64(c, load_u64(p));
		p += 8;
		len -= 8;
	}
	crc = (uint32_t)c;
	while (len--)
		crc = _mm_crc32_u8(crc, *p++);
	return crc;
}
#endif /* CRC_HAVE_HW */

static void crc_init(void)
{
	for (uint32_t i = 0; i < 256; i++) {
		uint32_t c = i;

		for (int k = 0; k < 8; k++)
			c = (c & 1) ? (c >> 1) ^ CRC32C_POLY : c >> 1;
		crc_tab[0][i] = c;
	}
	for (int t = 1; t < 8; t++)
		for (int i = 0; i < 256; i++)
			crc_tab[t][i] = (crc_tab[t - 1][i] >> 8) ^
					crc_tab[0][crc_tab[t - 1][i] & 0xff];

	crc_impl = crc_sw_raw;
#if CRC_HAVE_HW
	__builtin_cpu_init();
	if (__builtin_cpu_supports("sse4.2")) {
		build_shift(&shift_long, CRC_LONG_BLOCK);
		build_shift(&shift_short, CRC_SHORT_BLOCK);
		crc_impl = crc_hw_raw;
	}
#endif
}

uint32_t mp_crc32c(uint32_t crc, const void *buf, size_t len)
{
	pthread_once(&crc_once, crc_init);
	return ~crc_impl(~crc, buf, len);
}

uint32_t mp_crc32c_sw(uint32_t crc, const void *buf, size_t len)
{
	pthread_once(&crc_once, crc_init);
	return ~crc_sw_raw(~crc, buf, len);
}
