/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Fuzz target for everything a received frame goes through before it may
 * touch memory: header validation, then the codec's decode and
 * decode-and-accumulate into a buffer sized from the header's own count.
 *
 * Built two ways: with clang -fsanitize=fuzzer it is a libFuzzer target
 * (-DMP_LIBFUZZER); otherwise main() below replays a deterministic stream of
 * mutated valid frames, so the suite runs it on every build (under ASan and
 * UBSan in tools/test.sh).
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec.h"
#include "wire.h"

#define RUN "fuzz-run"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static float acc[1 << 16];
	struct mp_wire_hdr h;
	enum mp_wire_reject why;
	int rc;

	rc = mp_wire_decode(data, size, mp_wire_run_id(RUN), mp_codec_count(), &h, &why);
	if (rc) {
		if (why == MP_REJ_NONE || why >= MP_REJ_MAX)
			abort(); /* every rejection must name its reason */
		return 0;
	}
	if (h.length != size - MP_WIRE_HDR_SIZE)
		abort(); /* decode promised the length matches the frame */
	const struct mp_codec_ops *c = mp_codec_by_id(h.codec);
	if (!c)
		abort();
	if (h.count > sizeof(acc) / sizeof(acc[0]))
		return 0; /* the engine bounds count by the chunk it expects */
	c->decode_acc(data + MP_WIRE_HDR_SIZE, h.length, acc, h.count, h.weight);
	c->decode(data + MP_WIRE_HDR_SIZE, h.length, acc, h.count);
	return 0;
}

#ifndef MP_LIBFUZZER
static uint64_t rng = 0x9E3779B97F4A7C15ull;

static uint64_t next(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return rng;
}

int main(int argc, char **argv)
{
	long iters = argc > 1 ? atol(argv[1]) : 200000;
	static uint8_t frame[MP_WIRE_HDR_SIZE + 4096], work[sizeof(frame)];
	long accepted = 0;

	for (long i = 0; i < iters; i++) {
		/* A valid frame of random shape, then a few random mutations. */
		struct mp_wire_hdr h = {
			.type = (uint8_t)(1 + next() % MP_MSG_TYPE_MAX),
			.codec = (uint8_t)(next() % mp_codec_count()),
			.flags = (uint8_t)(next() & 1),
			.run_id = mp_wire_run_id(RUN),
			.round = (uint32_t)next(),
			.sender = (uint32_t)(next() % 64),
			.count = (uint32_t)(next() % 512),
			.weight = 1.0f,
		};
		h.length = h.count * (h.codec ? 2u : 4u);
		for (size_t k = 0; k < h.length; k++)
			frame[MP_WIRE_HDR_SIZE + k] = (uint8_t)next();
		mp_wire_encode(&h, frame, frame + MP_WIRE_HDR_SIZE);
		size_t len = MP_WIRE_HDR_SIZE + h.length;
		memcpy(work, frame, len);
		int muts = (int)(next() % 4);
		for (int m = 0; m < muts; m++) {
			switch (next() % 4) {
			case 0:
				if (len)
					work[next() % len] ^= (uint8_t)(1u << (next() % 8));
				break;
			case 1: work[next() % MP_WIRE_HDR_SIZE] = (uint8_t)next(); break;
			case 2: len = (size_t)(next() % (len + 1)); break;
			default: len = len + (size_t)(next() % 16) < sizeof(work) ? len + (size_t)(next() % 16) : len;
			}
		}
		if (muts == 0)
			accepted++;
		LLVMFuzzerTestOneInput(work, len);
	}
	printf("fuzz_frame: %ld frames (%ld unmutated), no crash\n", iters, accepted);
	return 0;
}
#endif
