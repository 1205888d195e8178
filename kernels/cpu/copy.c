/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Streaming copy: dst = src with stores that bypass the caches.
 *
 * A receiver that lands a shard much larger than the last-level cache writes
 * every line of it to memory anyway; with ordinary stores each line is
 * first read in (read for ownership) and then pushed out by the next one,
 * evicting on its way the sender's buffer and the device rings that were
 * still warm. Non-temporal stores go to memory through write-combining
 * buffers instead: no read, no eviction. For data read back soon they are a
 * loss (the reader misses), so callers use them only above a size threshold
 * (the dpdk driver: a quarter of the LLC, doc/dpdk.md "Parameters").
 *
 * The stores are weakly ordered: mp_k_stream_fence() must run before
 * another thread is told that the data is there.
 *
 * The head up to the destination's first 64-byte boundary and the ragged
 * tail go through memcpy: non-temporal stores of whole lines only.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "mp_kernels.h"
#include "kernels_cpu.h"

void mp_kcpu_copy_stream_scalar(void *dst, const void *src, size_t n)
{
	memcpy(dst, src, n);
}

#ifdef MP_K_X86

/* memcpy up to the destination's first line boundary; moves the cursors past it. */
static inline void copy_head(uint8_t **d, const uint8_t **s, size_t *n)
{
	size_t h = (64 - ((uintptr_t)*d & 63)) & 63;

	if (h > *n)
		h = *n;
	memcpy(*d, *s, h);
	*d += h;
	*s += h;
	*n -= h;
}

__attribute__((target("avx2"))) void mp_kcpu_copy_stream_avx2(void *dst, const void *src,
							    size_t n)
{
	uint8_t *d = dst;
	const uint8_t *s = src;

	copy_head(&d, &s, &n);
	/* Four loads before four stores: two lines per step keep both load ports busy. */
	for (; n >= 128; n -= 128, d += 128, s += 128) {
		__m256i a = _mm256_loadu_si256((const __m256i *)s);
		__m256i b = _mm256_loadu_si256((const __m256i *)(s + 32));
		__m256i c = _mm256_loadu_si256((const __m256i *)(s + 64));
		__m256i e = _mm256_loadu_si256((const __m256i *)(s + 96));

		_mm256_stream_si256((__m256i *)d, a);
		_mm256_stream_si256((__m256i *)(d + 32), b);
		_mm256_stream_si256((__m256i *)(d + 64), c);
		_mm256_stream_si256((__m256i *)(d + 96), e);
	}
	for (; n >= 64; n -= 64, d += 64, s += 64) {
		__m256i a = _mm256_loadu_si256((const __m256i *)s);
		__m256i b = _mm256_loadu_si256((const __m256i *)(s + 32));

		_mm256_stream_si256((__m256i *)d, a);
		_mm256_stream_si256((__m256i *)(d + 32), b);
	}
	memcpy(d, s, n);
}

__attribute__((target("avx512f"))) void mp_kcpu_copy_stream_avx512(void *dst, const void *src,
								 size_t n)
{
	uint8_t *d = dst;
	const uint8_t *s = src;

	copy_head(&d, &s, &n);
	for (; n >= 256; n -= 256, d += 256, s += 256) {
		__m512i a = _mm512_loadu_si512(s);
		__m512i b = _mm512_loadu_si512(s + 64);
		__m512i c = _mm512_loadu_si512(s + 128);
		__m512i e = _mm512_loadu_si512(s + 192);

		_mm512_stream_si512((void *)d, a);
		_mm512_stream_si512((void *)(d + 64), b);
		_mm512_stream_si512((void *)(d + 128), c);
		_mm512_stream_si512((void *)(d + 192), e);
	}
	for (; n >= 64; n -= 64, d += 64, s += 64)
		_mm512_stream_si512((void *)d, _mm512_loadu_si512(s));
	memcpy(d, s, n);
}

#endif

void mp_k_stream_fence(void)
{
#ifdef MP_K_X86
	_mm_sfence();
#else
	/* The scalar copy's stores are ordinary; a full fence costs nothing here. */
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
#endif
}

/*
 * The kernel's sysfs first: it describes the cache this CPU shares with its
 * neighbours (a virtual machine's is what the hypervisor says), where
 * glibc's sysconf may report a whole socket's L3 (384 MiB for 32 MiB per
 * core complex on a Zen 5 guest here).
 */
size_t mp_k_llc_bytes(void)
{
	size_t best = 0;

	for (int i = 0; i < 8; i++) {
		char path[96], unit = 0;
		unsigned long level = 0, size = 0;
		FILE *f;

		snprintf(path, sizeof(path), "/sys/devices/system/cpu/cpu0/cache/index%d/level", i);
		f = fopen(path, "r");
		if (!f)
			break;
		if (fscanf(f, "%lu", &level) != 1)
			level = 0;
		fclose(f);
		snprintf(path, sizeof(path), "/sys/devices/system/cpu/cpu0/cache/index%d/size", i);
		f = fopen(path, "r");
		if (!f)
			continue;
		if (fscanf(f, "%lu%c", &size, &unit) < 1)
			size = 0;
		fclose(f);
		size *= unit == 'K' ? 1024ul : unit == 'M' ? 1024ul * 1024 : 1;
		if (level >= 2 && size > best) /* the last level is the largest */
			best = size;
	}
#ifdef _SC_LEVEL3_CACHE_SIZE
	if (!best) {
		long v = sysconf(_SC_LEVEL3_CACHE_SIZE);

		best = v > 0 ? (size_t)v : 0;
	}
#endif
	return best;
}

size_t mp_k_stream_min(void)
{
	size_t llc = mp_k_llc_bytes();

	return llc ? llc / 4 : (size_t)8 << 20;
}
