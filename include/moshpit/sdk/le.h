/* SPDX-License-Identifier: BSD-3-Clause */
/**
 * @file le.h
 * @brief Driver SDK: little-endian fields, stored and loaded byte by byte.
 *
 * For wire headers, control-plane records and the blobs a driver ships to
 * its peers: independent of the host's byte order and of alignment, so a
 * field may sit at any offset of a byte buffer. The library's own headers
 * and records use the same helpers, and so do the codecs' payloads (a
 * compiler makes each of these one load or store on a little-endian host).
 * All static inline: they add nothing to libmoshpit's ABI.
 */
#ifndef MOSHPIT_SDK_LE_H
#define MOSHPIT_SDK_LE_H

#include <stdint.h>
#include <string.h>

/** Store @p v at @p p as 2 little-endian bytes. */
static inline void mp_le_put16(uint8_t *p, uint16_t v)
{
	p[0] = (uint8_t)v;
	p[1] = (uint8_t)(v >> 8);
}

/** Store @p v at @p p as 4 little-endian bytes. */
static inline void mp_le_put32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

/** Store @p v at @p p as 8 little-endian bytes. */
static inline void mp_le_put64(uint8_t *p, uint64_t v)
{
	mp_le_put32(p, (uint32_t)v);
	mp_le_put32(p + 4, (uint32_t)(v >> 32));
}

/** The 2 little-endian bytes at @p p. */
static inline uint16_t mp_le_get16(const uint8_t *p)
{
	return (uint16_t)(p[0] | p[1] << 8);
}

/** The 4 little-endian bytes at @p p. */
static inline uint32_t mp_le_get32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/** The 8 little-endian bytes at @p p. */
static inline uint64_t mp_le_get64(const uint8_t *p)
{
	return (uint64_t)mp_le_get32(p) | (uint64_t)mp_le_get32(p + 4) << 32;
}

/** Store @p v at @p p as the 4 little-endian bytes of its IEEE 754 binary32 form. */
static inline void mp_le_putf32(uint8_t *p, float v)
{
	uint32_t u;

	memcpy(&u, &v, sizeof(u));
	mp_le_put32(p, u);
}

/** The binary32 float in the 4 little-endian bytes at @p p. */
static inline float mp_le_getf32(const uint8_t *p)
{
	uint32_t u = mp_le_get32(p);
	float v;

	memcpy(&v, &u, sizeof(v));
	return v;
}

#endif /* MOSHPIT_SDK_LE_H */
