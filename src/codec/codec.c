/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Codec registry: wire id 0 "none" (fp32 little endian) and 1 "fp16" (IEEE
 * half, little endian, round to nearest even, clamped to +-65504).
 *
 * Both are stateless. Decoders insist on the exact payload length for the
 * element count the header announces: the count comes from a validated
 * header, so any other length is a malformed frame (-EBADMSG), never
 * something to read past.
 *
 * Payloads sit wherever the transport put them (after a 64-byte header, at
 * the start of a chunk); if one is not aligned for its element type it goes
 * through a small bounce buffer rather than through a misaligned pointer.
 */
#include "codec.h"
#include "log.h"
#include "mp_kernels.h"

#include <moshpit/moshpit.h>

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "codec.c assumes a little-endian host; add byte swapping for this one"
#endif

/* Elements per bounce-buffer step for misaligned payloads (16 KiB of fp32). */
#define BOUNCE 4096

static inline int aligned(const void *p, size_t a)
{
	return ((uintptr_t)p & (a - 1)) == 0;
}

/* ---- none: raw fp32 ---- */

static size_t none_max_encoded(const struct mp_codec_params *p, size_t count)
{
	(void)p;
	return count > SIZE_MAX / sizeof(float) ? SIZE_MAX : count * sizeof(float);
}

static int none_encode(const struct mp_codec_params *p, const float *src, float *residue,
		       size_t count, void *dst, size_t cap, size_t *len, void *scratch)
{
	(void)p;
	(void)residue;
	(void)scratch;
	if (count > SIZE_MAX / sizeof(float) || cap < count * sizeof(float))
		return -ENOSPC;
	if (count)
		memcpy(dst, src, count * sizeof(float));
	*len = count * sizeof(float);
	return 0;
}

/*
 * Every decoder is "apply a kernel to the payload's elements": in place when
 * the payload is aligned for its element type, else through a bounce buffer
 * in steps. @w is the weight for accumulating kernels.
 */
typedef void (*payload_fn)(float *out, const void *elems, float w, size_t n);

static void apply_payload(const void *src, size_t esize, size_t count, float *out, float w,
			  payload_fn fn)
{
	if (aligned(src, esize)) {
		fn(out, src, w, count);
		return;
	}
	_Alignas(16) unsigned char tmp[BOUNCE * sizeof(float)];
	const unsigned char *p = src;

	for (size_t i = 0; i < count; i += BOUNCE) {
		size_t k = count - i < BOUNCE ? count - i : BOUNCE;

		memcpy(tmp, p + i * esize, k * esize);
		fn(out + i, tmp, w, k);
	}
}

static void f32_copy(float *out, const void *e, float w, size_t n)
{
	(void)w;
	if (n)
		memcpy(out, e, n * sizeof(float));
}

static void f32_acc(float *out, const void *e, float w, size_t n)
{
	mp_k_axpy(out, e, w, n);
}

static void f16_copy(float *out, const void *e, float w, size_t n)
{
	(void)w;
	mp_k_f16_to_f32(out, e, n);
}

static void f16_acc(float *out, const void *e, float w, size_t n)
{
	mp_k_f16_axpy(out, e, w, n);
}

static int none_decode(const void *src, size_t len, float *dst, size_t count)
{
	if (count > SIZE_MAX / sizeof(float) || len != count * sizeof(float))
		return -EBADMSG;
	/* memcpy needs no alignment: no bounce. */
	f32_copy(dst, src, 0.0f, count);
	return 0;
}

static int none_decode_acc(const void *src, size_t len, float *acc, size_t count, float weight)
{
	if (count > SIZE_MAX / sizeof(float) || len != count * sizeof(float))
		return -EBADMSG;
	apply_payload(src, sizeof(float), count, acc, weight, f32_acc);
	return 0;
}

/* ---- fp16 ---- */

static size_t fp16_max_encoded(const struct mp_codec_params *p, size_t count)
{
	(void)p;
	return count > SIZE_MAX / sizeof(uint16_t) ? SIZE_MAX : count * sizeof(uint16_t);
}

static int fp16_encode(const struct mp_codec_params *p, const float *src, float *residue,
		       size_t count, void *dst, size_t cap, size_t *len, void *scratch)
{
	(void)p;
	(void)residue;
	(void)scratch;
	if (count > SIZE_MAX / sizeof(uint16_t) || cap < count * sizeof(uint16_t))
		return -ENOSPC;
	if (aligned(dst, _Alignof(uint16_t))) {
		mp_k_f32_to_f16((uint16_t *)dst, src, count);
	} else {
		uint16_t tmp[BOUNCE];
		unsigned char *p = dst;

		for (size_t i = 0; i < count; i += BOUNCE) {
			size_t k = count - i < BOUNCE ? count - i : BOUNCE;

			mp_k_f32_to_f16(tmp, src + i, k);
			memcpy(p + i * sizeof(uint16_t), tmp, k * sizeof(uint16_t));
		}
	}
	*len = count * sizeof(uint16_t);
	return 0;
}

static int fp16_decode(const void *src, size_t len, float *dst, size_t count)
{
	if (count > SIZE_MAX / sizeof(uint16_t) || len != count * sizeof(uint16_t))
		return -EBADMSG;
	apply_payload(src, sizeof(uint16_t), count, dst, 0.0f, f16_copy);
	return 0;
}

static int fp16_decode_acc(const void *src, size_t len, float *acc, size_t count, float weight)
{
	if (count > SIZE_MAX / sizeof(uint16_t) || len != count * sizeof(uint16_t))
		return -EBADMSG;
	apply_payload(src, sizeof(uint16_t), count, acc, weight, f16_acc);
	return 0;
}

/* ---- registry, indexed by wire id ---- */

static const struct mp_codec_ops codec_none = {
	.id = MP_CODEC_NONE,
	.name = "none",
	.flags = 0,
	.max_encoded = none_max_encoded,
	.encode = none_encode,
	.decode = none_decode,
	.decode_acc = none_decode_acc,
};

static const struct mp_codec_ops codec_fp16 = {
	.id = MP_CODEC_FP16,
	.name = "fp16",
	.flags = MP_CODEC_F_LOSSY,
	.max_encoded = fp16_max_encoded,
	.encode = fp16_encode,
	.decode = fp16_decode,
	.decode_acc = fp16_decode_acc,
};

static const struct mp_codec_ops *const codecs[] = {
	[MP_CODEC_NONE] = &codec_none,
	[MP_CODEC_FP16] = &codec_fp16,
	[MP_CODEC_BF16] = &mp_codec_bf16,
	[MP_CODEC_UNIFORM8] = &mp_codec_uniform8,
	[MP_CODEC_BLOCKWISE8] = &mp_codec_blockwise8,
	[MP_CODEC_TOPK] = &mp_codec_topk,
	[MP_CODEC_ADACOMP] = &mp_codec_adacomp,
};
#define NCODECS (sizeof(codecs) / sizeof(codecs[0]))

unsigned mp_codec_count(void)
{
	return (unsigned)NCODECS;
}

const struct mp_codec_ops *mp_codec_by_id(unsigned id)
{
	return id < NCODECS ? codecs[id] : NULL;
}

/* Names are matched without regard to case: MP_CODEC=FP16 should just work. */
const struct mp_codec_ops *mp_codec_by_name(const char *name)
{
	if (!name)
		return NULL;
	for (size_t i = 0; i < NCODECS; i++)
		if (!strcasecmp(codecs[i]->name, name))
			return codecs[i];
	return NULL;
}

void mp_codec_params_default(struct mp_codec_params *p)
{
	p->block = MP_CODEC_DEF_BLOCK;
	p->sigmas = MP_CODEC_DEF_SIGMAS;
	p->topk_ratio = MP_CODEC_DEF_TOPK;
	p->bin = MP_CODEC_DEF_BIN_FC;
}

int mp_codec_params_check(const struct mp_codec_params *p)
{
	/* The rules live with the struct: the CUDA encoders apply them too. */
	return mp_codec_params_ok(p) ? 0 : -EINVAL;
}

int mp_codec_from_name(const char *s)
{
	const struct mp_codec_ops *c = mp_codec_by_name(s);

	if (s && !strcasecmp(s, "auto"))
		return MP_CODEC_AUTO;
	return c ? (int)c->id : -EINVAL;
}

const char *mp_codec_name(int codec)
{
	const struct mp_codec_ops *c = codec >= 0 ? mp_codec_by_id((unsigned)codec) : NULL;

	if (codec == MP_CODEC_AUTO)
		return "auto";
	return c ? c->name : "?";
}

/*
 * The kernels choose their variant silently (kernels/ logs nothing): their
 * user says once per process which one runs, and why MP_KERNELS was not
 * followed.
 */
static void log_kernels(void)
{
	const char *env;
	int rc = mp_k_env_status(&env);
	const char *v = mp_k_variant();

	if (rc == -EINVAL)
		MP_WARN("MP_KERNELS=%s not understood (scalar, avx2, avx512); using %s", env, v);
	else if (rc)
		MP_WARN("MP_KERNELS=%s: this CPU cannot run it; using %s", env, v);
	MP_INFO("CPU kernels: %s", v);
}

void mp_codec_log_kernels(void)
{
	static pthread_once_t once = PTHREAD_ONCE_INIT;

	mp_log_init(); /* so that MP_DEBUG is known before the first message */
	pthread_once(&once, log_kernels);
}
