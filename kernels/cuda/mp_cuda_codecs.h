/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The wire codecs on device memory (kernels/cuda). Same payloads as the CPU
 * codecs of src/codec*.c, byte for byte where the format allows it:
 *
 *  - none, fp16, bf16, blockwise8, topk: encode gives the CPU's bytes
 *    exactly (and topk the CPU's residue exactly).
 *  - uniform8: the statistics (mean, stddev) and the bucket means are sums
 *    whose order the spec fixes for a CPU; the GPU sums in a different, but
 *    also fixed, order (so its result is still deterministic). When the
 *    rounded range (lo, step) comes out the same, which is nearly always,
 *    the codes are the CPU's; otherwise a code differs by at most 1 where
 *    an element lies within rounding of a bucket edge. Bucket means (of
 *    the spec's 1-in-16 sample) agree to float rounding for the same set
 *    of members.
 *  - adacomp: the selection, the signs and the indices are the CPU's
 *    exactly; the scale is a mean of |G| summed in another fixed order, so
 *    it may differ in the last bit (and the residue of the sent elements
 *    with it).
 *  - Every decoder gives exactly the CPU decoder's values for every payload
 *    the CPU accepts, and rejects exactly what the CPU rejects (-EBADMSG)
 *    without writing a single element.
 *
 * Pointers named d_* are device memory of the current device. Float arrays
 * need natural float alignment; payloads may have any alignment (16-byte
 * aligned ones take the vector paths). All work goes to @stream (a
 * cudaStream_t; NULL is the legacy default stream), and a call returns once
 * its result is known to the host:
 *  - encode of none/fp16/bf16/uniform8/blockwise8 and decode(_acc) of
 *    none/fp16/bf16 return right after queueing (lengths are known on the
 *    host): the stream carries the work.
 *  - encode of topk/adacomp (the length is found on the device) and decode
 *    of uniform8/blockwise8/topk/adacomp (payloads are validated on the
 *    device) wait for the stream. The _async decoder below does not.
 *
 * Errors are negative errno values: -EINVAL (bad codec id or settings,
 * misaligned scratch), -ENOSPC (@cap too small; nothing written past @cap,
 * and a residue is left as it was), -EBADMSG (malformed payload; the output
 * is untouched), -ENODEV / -EIO / -ENOMEM (from the CUDA runtime).
 *
 * Scratch areas and status words belong to one call at a time: calls on
 * different streams need their own. Nothing here keeps global state, so
 * the functions are thread-safe otherwise.
 *
 * No CUDA header is needed to include this one: streams are void *.
 */
#ifndef MP_CUDA_CODECS_H
#define MP_CUDA_CODECS_H

#include <stddef.h>
#include <stdint.h>

#include "mp_codec_params.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * 0 if the current device can run these kernels (compute capability 8.0 or
 * newer), else -ENODEV with a reason in @why (NUL-terminated, @n bytes).
 */
int mp_cuda_available(char *why, size_t n);

/* 1 if @codec (wire id) has CUDA kernels here, else 0. */
int mp_cuda_codec_supported(int codec);

/* Largest payload encode can produce, as the CPU codec's max_encoded(). */
size_t mp_cuda_max_encoded(int codec, const struct mp_codec_params *p, size_t count);

/* Device scratch bytes encode needs for @count values under @p (0: none). */
size_t mp_cuda_scratch_size(int codec, const struct mp_codec_params *p, size_t count);

/*
 * Encode d_src[0..count) (plus d_residue for topk/adacomp, which is updated
 * as the CPU codec does) into d_dst[0..cap); *len gets the payload length.
 * @d_scratch: mp_cuda_scratch_size() bytes of device memory, 16-byte
 * aligned (cudaMalloc gives 256); may be NULL when that size is 0.
 */
int mp_cuda_encode(int codec, const struct mp_codec_params *p, const float *d_src,
		   float *d_residue, size_t count, void *d_dst, size_t cap, size_t *len,
		   void *d_scratch, size_t scratch_bytes, void *stream);

/* d_dst[0..count) = decode(d_payload[0..len)). */
int mp_cuda_decode(int codec, const void *d_payload, size_t len, float *d_dst, size_t count,
		   void *stream);

/* d_acc[i] += w * decode(d_payload)[i], each product rounded before the add. */
int mp_cuda_decode_acc(int codec, const void *d_payload, size_t len, float *d_acc, size_t count,
		       float w, void *stream);

/* Device scratch bytes mp_cuda_decode_acc_async() needs for a payload of @len bytes. */
size_t mp_cuda_decode_scratch_size(int codec, size_t len, size_t count);

/*
 * As mp_cuda_decode_acc (or, with @acc_mode 0, mp_cuda_decode), without
 * waiting: what the host can check (codec, length) is returned at once;
 * what only the device can check sets MP_CUDA_BAD in *d_status (device
 * memory, zeroed by the caller). Nothing is written to d_acc while
 * *d_status is nonzero, so one status word can guard several payloads:
 * after the first bad one, the rest of them leave d_acc alone too.
 * @d_scratch: mp_cuda_decode_scratch_size() bytes, 16-byte aligned.
 */
#define MP_CUDA_BAD 1u
int mp_cuda_decode_async(int codec, const void *d_payload, size_t len, float *d_acc,
			 size_t count, float w, int acc_mode, uint32_t *d_status, void *d_scratch,
			 size_t scratch_bytes, void *stream);

/*
 * Set *d_flag (device memory) nonzero when any of d_src[0..count) is NaN or
 * infinite (MP_CHECK_FINITE on the device); leave it alone otherwise.
 * Returns after queueing.
 */
int mp_cuda_check_finite(const float *d_src, size_t count, uint32_t *d_flag, void *stream);

#ifdef __cplusplus
}
#endif

#endif
