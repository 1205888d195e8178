/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The codec kernels of kernels/cuda behind struct mp_devk_ops (devk.h), for
 * the device path of the group all-reduce.
 *
 * The kernels use the CUDA runtime, which runs in whatever context is
 * current on the calling thread; the progress thread has none, so every
 * entry makes the memory's context current (mp_stage_enter, the staging
 * table's cuCtxPushCurrent) around its calls. The runtime then uses that
 * context, the memory's own or its device's primary one, rather than
 * creating its own. Built without nvcc, the table only says why it cannot
 * be used.
 */
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <moshpit/moshpit.h>

#include "codec.h"
#include "devk.h"
#include "log.h"
#include "mp_build_config.h"
#include "stage.h"

#ifdef MP_HAVE_CUDA
#include "mp_cuda_codecs.h"

/* A kernel call's error as the table returns it: what the contract names
 * (a malformed payload, a short buffer, bad settings) passes through; the
 * rest is the runtime's, logged with the call that failed. */
static int kerr(int rc, const char *call, int codec)
{
	if (!rc || rc == -EBADMSG || rc == -ENOSPC || rc == -EINVAL)
		return rc;
	MP_WARN("devk: %s(%s): %s", call, mp_codec_name(codec), mp_strerror(rc));
	return -EIO;
}

static int cuda_usable(const struct mp_stage_dev *d, int codec, char *why, size_t n)
{
	char msg[192] = "";
	int rc;

	if (!mp_cuda_codec_supported(codec)) {
		snprintf(why, n, "no CUDA kernels for codec %d", codec);
		return -ENOTSUP;
	}
	if (mp_stage_enter(d)) {
		snprintf(why, n, "the memory's CUDA context cannot be made current");
		return -ENOTSUP;
	}
	/* The device of the context just made current. */
	rc = mp_cuda_available(msg, sizeof(msg));
	mp_stage_leave();
	if (rc) {
		snprintf(why, n, "the CUDA kernels cannot run here: %s", msg);
		return -ENOTSUP;
	}
	return 0;
}

static size_t cuda_max_encoded(int codec, const struct mp_codec_params *p, size_t count)
{
	return mp_cuda_max_encoded(codec, p, count);
}

static size_t cuda_enc_scratch(int codec, const struct mp_codec_params *p, size_t count)
{
	return mp_cuda_scratch_size(codec, p, count);
}

static int cuda_encode(const struct mp_stage_dev *d, int codec, const struct mp_codec_params *p,
		       const float *d_src, float *d_residue, size_t count, void *d_dst, size_t cap,
		       size_t *len, void *d_scratch, size_t scratch_bytes, void *stream)
{
	int rc = mp_stage_enter(d);

	if (rc)
		return rc;
	/* topk and adacomp wait for the stream here, for the length. */
	rc = mp_cuda_encode(codec, p, d_src, d_residue, count, d_dst, cap, len, d_scratch,
			    scratch_bytes, stream);
	mp_stage_leave();
	return kerr(rc, "mp_cuda_encode", codec);
}

static size_t cuda_dec_scratch(int codec, size_t len, size_t count)
{
	return mp_cuda_decode_scratch_size(codec, len, count);
}

static int cuda_decode(const struct mp_stage_dev *d, int codec, const void *d_payload, size_t len,
		       float *d_dst, size_t count, float w, int acc, uint32_t *d_status,
		       void *d_scratch, size_t scratch_bytes, void *stream)
{
	int rc = mp_stage_enter(d);

	if (rc)
		return rc;
	rc = mp_cuda_decode_async(codec, d_payload, len, d_dst, count, w, acc, d_status, d_scratch,
				  scratch_bytes, stream);
	mp_stage_leave();
	return kerr(rc, "mp_cuda_decode_async", codec);
}

/* The two status bits must mean the same thing. */
static int cuda_nonfinite(const struct mp_stage_dev *d, const float *d_src, size_t count,
			  uint32_t *d_flag, void *stream)
{
	int rc = mp_stage_enter(d);

	if (rc)
		return rc;
	rc = mp_cuda_check_finite(d_src, count, d_flag, stream);
	mp_stage_leave();
	return kerr(rc, "mp_cuda_check_finite", MP_CODEC_NONE);
}

_Static_assert(MP_DEVK_BAD == MP_CUDA_BAD, "MP_DEVK_BAD");

const struct mp_devk_ops mp_devk_cuda_ops = {
	.name = "CUDA kernels",
	.usable = cuda_usable,
	.max_encoded = cuda_max_encoded,
	.enc_scratch = cuda_enc_scratch,
	.encode = cuda_encode,
	.dec_scratch = cuda_dec_scratch,
	.decode = cuda_decode,
	.nonfinite = cuda_nonfinite,
};
#else
/* Built without nvcc: the group all-reduce stages such memory through the
 * host instead, and says why once. */
static int off_usable(const struct mp_stage_dev *d, int codec, char *why, size_t n)
{
	(void)d, (void)codec;
	snprintf(why, n, "built without the CUDA kernels (nvcc was not found when the build was "
		 "configured)");
	return -ENOTSUP;
}

static size_t off_size(int codec, const struct mp_codec_params *p, size_t count)
{
	(void)codec, (void)p, (void)count;
	return 0;
}

static int off_encode(const struct mp_stage_dev *d, int codec, const struct mp_codec_params *p,
		      const float *d_src, size_t count, void *d_dst, size_t cap, size_t *len,
		      void *d_scratch, size_t scratch_bytes, void *stream)
{
	(void)d, (void)codec, (void)p, (void)d_src, (void)count, (void)d_dst, (void)cap;
	(void)d_scratch, (void)scratch_bytes, (void)stream;
	*len = 0;
	return -ENOTSUP;
}

static int off_nonfinite(const struct mp_stage_dev *d, const float *d_src, size_t count,
			 uint32_t *d_flag, void *stream)
{
	(void)d, (void)d_src, (void)count, (void)d_flag, (void)stream;
	return -ENOTSUP;
}

static size_t off_dec_scratch(int codec, size_t len, size_t count)
{
	(void)codec, (void)len, (void)count;
	return 0;
}

static int off_decode(const struct mp_stage_dev *d, int codec, const void *d_payload, size_t len,
		      float *d_dst, size_t count, float w, int acc, uint32_t *d_status,
		      void *d_scratch, size_t scratch_bytes, void *stream)
{
	(void)d, (void)codec, (void)d_payload, (void)len, (void)d_dst, (void)count, (void)w;
	(void)acc, (void)d_status, (void)d_scratch, (void)scratch_bytes, (void)stream;
	return -ENOTSUP;
}

const struct mp_devk_ops mp_devk_cuda_ops = {
	.name = "CUDA kernels",
	.usable = off_usable,
	.max_encoded = off_size,
	.enc_scratch = off_size,
	.encode = off_encode,
	.dec_scratch = off_dec_scratch,
	.decode = off_decode,
	.nonfinite = off_nonfinite,
};
#endif

const struct mp_devk_ops *mp_devk_ops = &mp_devk_cuda_ops;
