/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Codec interface. A codec turns a run of fp32 values into bytes on the wire
 * and back. Encoded sizes may vary per chunk (sparse codecs), per-buffer state
 * (error feedback) lives in struct mp_codec_state, and the reducer's hot path
 * is the fused decode-and-accumulate.
 */
#ifndef MP_CODEC_H
#define MP_CODEC_H

#include <stddef.h>
#include <stdint.h>

struct mp_codec_state {
	const struct mp_codec_ops *ops;
	size_t count;   /* elements of the buffer this state follows */
	float *residue; /* error feedback, count elements (NULL for stateless codecs) */
};

struct mp_codec_ops {
	uint8_t id;       /* stable wire id (enum mp_codec) */
	const char *name;
	int stateful;     /* needs an error-feedback residue */
	/* Largest encoding of @count values. */
	size_t (*max_encoded)(size_t count);
	/*
	 * Encode src[0..count) into dst (cap bytes); *len gets the bytes written.
	 * @st may be NULL for stateless codecs; @offset is the position of src[0]
	 * in the buffer @st follows. Returns 0 or -ENOSPC.
	 */
	int (*encode)(struct mp_codec_state *st, size_t offset, const float *src, size_t count,
		      void *dst, size_t cap, size_t *len);
	/* dst[0..count) = decode(src); -EBADMSG if len does not fit count. */
	int (*decode)(const void *src, size_t len, float *dst, size_t count);
	/* acc[i] += weight * decode(src)[i]; -EBADMSG if len does not fit count. */
	int (*decode_acc)(const void *src, size_t len, float *acc, size_t count, float weight);
};

/* Number of wire ids known (valid ids are 0 .. mp_codec_count()-1). */
unsigned mp_codec_count(void);
/* Codec by wire id or NULL. */
const struct mp_codec_ops *mp_codec_by_id(unsigned id);
/* Codec by name or NULL. */
const struct mp_codec_ops *mp_codec_by_name(const char *name);

int mp_codec_state_init(struct mp_codec_state *st, const struct mp_codec_ops *ops, size_t count);
void mp_codec_state_fini(struct mp_codec_state *st);

#endif
