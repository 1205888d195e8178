/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Codec kernels on device memory, for the device path of the group
 * all-reduce (group_allreduce.c): a CUDA registration whose kernels can run
 * is reduced on the GPU, and only encoded chunks cross the bus, through a
 * small ring of pinned host buffers (stage.h, struct mp_stage_ring).
 *
 * A narrow table, as struct mp_stage_dev_ops, so that the path is tested
 * without a GPU: the real table (devk_cuda.c) calls the kernels of
 * kernels/cuda (mp_cuda_codecs.h) in the memory's CUDA context; a test
 * points mp_devk_ops at a fake that runs the CPU codecs on its fake device
 * memory (tests/fakes/fake_cuda.c).
 *
 * Every entry that takes a stream only queues its work there, in stream
 * order with the copies of struct mp_stage_dev_ops; lengths that the host
 * needs (an encoded payload's) are known when the call returns. Pointers
 * named d_* are device memory. Returns 0 or a negative errno; -EIO names
 * the failed CUDA call in the log.
 */
#ifndef MP_DEVK_H
#define MP_DEVK_H

#include <stddef.h>
#include <stdint.h>

#include "mp_codec_params.h"
#include "stage.h"

/* Set in *d_status by a decode that found its payload malformed. */
#define MP_DEVK_BAD 1u

struct mp_devk_ops {
	const char *name; /* for messages: "CUDA kernels" */
	/* 0 if the kernels can run on the device of @d for codec @codec (a
	 * wire id); else -ENOTSUP with the reason in @why (@n bytes): not
	 * built with the kernels, or a GPU older than they need. */
	int (*usable)(const struct mp_stage_dev *d, int codec, char *why, size_t n);
	/* As the CPU codec's max_encoded(): the largest payload of @count values. */
	size_t (*max_encoded)(int codec, const struct mp_codec_params *p, size_t count);
	/* Device scratch bytes encode needs for @count values (0: none). */
	size_t (*enc_scratch)(int codec, const struct mp_codec_params *p, size_t count);
	/* Queue the encoding of d_src[0..count) into d_dst[0..cap); *len is the
	 * payload's length, the CPU codec's bytes (uniform8: see
	 * mp_cuda_codecs.h). -ENOSPC when @cap is too small. The sparse codecs
	 * take d_residue[0..count) (error feedback, updated as the CPU codec
	 * does; NULL: none) and find the length on the device: their encode
	 * waits for the stream before it returns. */
	int (*encode)(const struct mp_stage_dev *d, int codec, const struct mp_codec_params *p,
		      const float *d_src, float *d_residue, size_t count, void *d_dst, size_t cap,
		      size_t *len, void *d_scratch, size_t scratch_bytes, void *stream);
	/* Device scratch bytes decode needs for a payload of @len bytes. */
	size_t (*dec_scratch)(int codec, size_t len, size_t count);
	/*
	 * Queue the decoding of d_payload[0..len) into d_dst[0..count):
	 * with @acc, d_dst[i] += w * value[i] (the product rounded before the
	 * add, as mp_k_axpy); else d_dst[i] = value[i]. A payload the CPU
	 * codec would reject sets MP_DEVK_BAD in *d_status (device memory,
	 * zeroed by the caller), and nothing is written to d_dst while
	 * *d_status is nonzero. What the host can check (the length against
	 * @count) returns -EBADMSG at once, with nothing queued.
	 */
	int (*decode)(const struct mp_stage_dev *d, int codec, const void *d_payload, size_t len,
		      float *d_dst, size_t count, float w, int acc, uint32_t *d_status,
		      void *d_scratch, size_t scratch_bytes, void *stream);
	/* Queue: *d_flag set nonzero when any of d_src[0..count) is NaN or
	 * infinite, left alone otherwise (MP_CHECK_FINITE). */
	int (*nonfinite)(const struct mp_stage_dev *d, const float *d_src, size_t count,
			 uint32_t *d_flag, void *stream);
};

/* The kernels of kernels/cuda (or, built without them, a table whose
 * usable() says so). */
extern const struct mp_devk_ops mp_devk_cuda_ops;
/* The table the next registration uses: &mp_devk_cuda_ops unless a test swaps it. */
extern const struct mp_devk_ops *mp_devk_ops;

#endif
