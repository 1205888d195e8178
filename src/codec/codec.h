/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Codec interface. A codec turns a run of fp32 values into bytes on the wire
 * and back. Payloads are self-describing: everything a decoder needs beyond
 * the element count (block size, bin size, number of kept values, scales)
 * travels in the payload, so peers with different encoder settings still
 * understand each other, and a decoder never consults local configuration.
 *
 * Contract for every codec (tests/unit/test_codec*.c hold them to it):
 *  - encode never writes past @cap and returns -ENOSPC rather than truncate;
 *    max_encoded(p, count) bytes are always enough.
 *  - decode / decode_acc check the payload completely before they write a
 *    single element: wrong total length, counts that do not fit, indices out
 *    of range or not strictly increasing, non-finite scales or table entries,
 *    over-long varints: -EBADMSG and the output is untouched.
 *  - No alignment is assumed for payloads (src of decode, dst of encode):
 *    scalars go through memcpy, vectors through unaligned loads.
 *  - Error feedback (sparse codecs): with @residue non-NULL the codec encodes
 *    p = src + residue and leaves residue = p - decode(payload), so "sent plus
 *    residue equals what was fed" holds to fp32 rounding. With @residue NULL
 *    it encodes src and keeps nothing. Stateless codecs ignore @residue.
 */
#ifndef MP_CODEC_H
#define MP_CODEC_H

#include <moshpit/sdk/le.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* Encoder settings, struct mp_codec_params (decoders never need them; see above). */
#include "mp_codec_params.h"

#define MP_CODEC_DEF_BLOCK 4096u
#define MP_CODEC_DEF_SIGMAS 6.0f
#define MP_CODEC_DEF_TOPK 0.01f
#define MP_CODEC_DEF_BIN_FC 500u
#define MP_CODEC_DEF_BIN_CONV 50u

/* Fill @p with the defaults above. */
void mp_codec_params_default(struct mp_codec_params *p);
/* 0 if every field is usable, else -EINVAL. */
int mp_codec_params_check(const struct mp_codec_params *p);

/* mp_codec_ops.flags */
#define MP_CODEC_F_LOSSY 1u    /* decode(encode(x)) may differ from x */
#define MP_CODEC_F_SPARSE 2u   /* sends a subset of the elements; uses error feedback */

struct mp_codec_ops {
	uint8_t id;       /* stable wire id (enum mp_codec) */
	const char *name;
	unsigned flags;
	/* Largest encoding of @count values under @p. */
	size_t (*max_encoded)(const struct mp_codec_params *p, size_t count);
	/* Scratch bytes encode needs for @count values (NULL: none). */
	size_t (*scratch_size)(const struct mp_codec_params *p, size_t count);
	/*
	 * Encode src[0..count) (plus *residue, see above) into dst[0..cap);
	 * *len gets the bytes written. @scratch holds scratch_size() bytes,
	 * 64-byte aligned. Returns 0, -ENOSPC or -EINVAL (bad params).
	 */
	int (*encode)(const struct mp_codec_params *p, const float *src, float *residue, size_t count,
		      void *dst, size_t cap, size_t *len, void *scratch);
	/* dst[0..count) = decode(src[0..len)); -EBADMSG if malformed. */
	int (*decode)(const void *src, size_t len, float *dst, size_t count);
	/* acc[i] += weight * decode(src)[i]; -EBADMSG if malformed. */
	int (*decode_acc)(const void *src, size_t len, float *acc, size_t count, float weight);
};

/* Number of wire ids known (valid ids are 0 .. mp_codec_count()-1). */
unsigned mp_codec_count(void);
/* Codec by wire id or NULL. */
const struct mp_codec_ops *mp_codec_by_id(unsigned id);
/* Codec by name or NULL ("auto" is a policy, not a codec: NULL). */
const struct mp_codec_ops *mp_codec_by_name(const char *name);

/* Name of an ::mp_codec value, "auto" included ("?" if unknown). */
const char *mp_codec_name(int codec);

/* The codecs of codec_quant.c and codec_sparse.c, registered by codec.c. */
extern const struct mp_codec_ops mp_codec_bf16;
extern const struct mp_codec_ops mp_codec_uniform8;
extern const struct mp_codec_ops mp_codec_blockwise8;
extern const struct mp_codec_ops mp_codec_topk;
extern const struct mp_codec_ops mp_codec_adacomp;

/* Bytes of the LEB128 varint of @v (1..5). */
static inline size_t mp_varint_len(uint32_t v)
{
	size_t n = 1;

	while (v >= 0x80u) {
		v >>= 7;
		n++;
	}
	return n;
}

/* Writes the LEB128 varint of @v at @p; returns its length. */
static inline size_t mp_varint_put(uint8_t *p, uint32_t v)
{
	size_t n = 0;

	while (v >= 0x80u) {
		p[n++] = (uint8_t)(v | 0x80u);
		v >>= 7;
	}
	p[n++] = (uint8_t)v;
	return n;
}

/*
 * Reads a varint from p[0..end); returns its length, or 0 if it runs past
 * @end, is longer than 5 bytes or does not fit 32 bits.
 */
static inline size_t mp_varint_get(const uint8_t *p, const uint8_t *end, uint32_t *v)
{
	uint32_t r = 0;

	for (size_t i = 0; i < 5 && p + i < end; i++) {
		uint32_t b = p[i];

		if (i == 4 && b > 0x0fu)
			return 0;
		r |= (b & 0x7fu) << (7 * i);
		if (!(b & 0x80u)) {
			*v = r;
			return i + 1;
		}
	}
	return 0;
}

/* Log once per process which kernel variant runs (and why MP_KERNELS was
 * not followed, if it was not). */
void mp_codec_log_kernels(void);

#endif
