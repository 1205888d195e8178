/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Fuzz target for everything a received frame goes through before it may
 * touch memory: header validation, then the codec's decode and
 * decode-and-accumulate into a buffer sized from the header's own count,
 * and for a PAIR frame the pairwise exchange's payload (mp_pair_parse).
 * A payload a decoder refuses must leave the buffer exactly as it was; one
 * a decoder takes must decode to finite values where the codec's checks
 * promise it (uniform8, topk, adacomp), to no NaN in blockwise8 (see
 * promises() below).
 *
 * Input: one selector byte, then the frame. Selector bit 0 clear: the
 * harness first writes into the frame the length field and the CRC32C that
 * the other bytes imply, as an honest sender would (libFuzzer cannot guess
 * a checksum, and without this it never gets past mp_wire_decode's checksum
 * to the decoders); set: the frame as given, checksum and all.
 *
 * Built two ways: with clang -fsanitize=fuzzer it is a libFuzzer target
 * (-DMP_LIBFUZZER, tools/fuzz.sh); otherwise main() (fuzz_main.h) replays
 * the seed corpus tests/fuzz/corpus/fuzz_frame/ or a deterministic stream
 * of mutated valid frames, so the suite runs it on every build (under ASan
 * and UBSan in tools/test.sh).
 */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <moshpit/sdk/le.h>

#include "codec.h"
#include "crc32c.h"
#include "wire.h"
#include "xfer.h"

#define RUN "fuzz-run"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
#define FUZZ_SEED 0x9E3779B97F4A7C15ull /* the deterministic stream's start */
#include "fuzz_main.h"

/*
 * Whether a payload a codec takes decodes to finite values only (uniform8: finite table entries; blockwise8: steps whose 127 times stay
 * finite, and no code -128 where 128 times the step does not; topk: finite
 * values; adacomp: a finite scale); none, fp16 and bf16 carry NaN and inf as
 * they are.
 */
static int promises_finite(unsigned id)
{
	const struct mp_codec_ops *c = mp_codec_by_id(id);

	return c == &mp_codec_uniform8 || c == &mp_codec_blockwise8 || c == &mp_codec_topk ||
	       c == &mp_codec_adacomp;
}

/* One frame of @size bytes, as the engine would see it arrive. */
static int check_frame(const uint8_t *data, size_t size)
{
	static float acc[1 << 16], before[1 << 16];
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
	/* Keep the buffer finite, so that "unchanged" can be compared bytewise. */
	for (uint32_t i = 0; i < h.count; i++)
		if (!(acc[i] == acc[i]) || acc[i] > 1e30f || acc[i] < -1e30f)
			acc[i] = 0.0f;
	memcpy(before, acc, h.count * sizeof(float));
	if (c->decode_acc(data + MP_WIRE_HDR_SIZE, h.length, acc, h.count, h.weight) &&
	    memcmp(before, acc, h.count * sizeof(float)))
		abort(); /* refused, yet written */
	memcpy(before, acc, h.count * sizeof(float));
	rc = c->decode(data + MP_WIRE_HDR_SIZE, h.length, acc, h.count);
	if (rc && memcmp(before, acc, h.count * sizeof(float)))
		abort();
	if (!rc && promises_finite(h.codec))
		for (uint32_t i = 0; i < h.count; i++)
			if (!isfinite(acc[i]))
				abort(); /* a payload the codec never writes, yet taken */
	if (h.type == MP_MSG_PAIR) {
		/* The pairwise exchange's payload (src/xfer/pairs.c), with the
		 * members the sender may hold taken from the offset field and
		 * the group's size from the aux field. */
		static float w[64];
		uint64_t unset = 0x5a5a5a5a5a5a5a5aull, mask = unset, ss = unset;
		uint64_t group = ~0ull >> (h.aux & 63);

		rc = mp_pair_parse(data + MP_WIRE_HDR_SIZE, h.length, h.offset, group, h.count, c,
				   &mask, &ss, w, acc);
		if (rc && (mask != unset || ss != unset))
			abort(); /* refused, yet a set taken */
		if (!rc) {
			if (mask & ~h.offset)
				abort(); /* a member the stage cannot hold */
			if (ss & ~group)
				abort(); /* a down member outside the group */
			for (int i = 0; i < 64; i++)
				if (mask >> i & 1 && (!isfinite(w[i]) || w[i] < 0.0f))
					abort();
		}
	}
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	uint8_t *f;
	size_t n;

	if (size < 1)
		return 0;
	n = size - 1;
	if (data[0] & 1 || n < MP_WIRE_HDR_SIZE)
		return check_frame(data + 1, n);
	/* A copy of exactly the frame's size, so that ASan sees any overread. */
	f = malloc(n);
	if (!f)
		abort();
	memcpy(f, data + 1, n);
	mp_le_put32(f + 44, (uint32_t)(n - MP_WIRE_HDR_SIZE)); /* length */
	uint32_t crc = mp_crc32c(0, f, 60);
	if (f[7] & MP_WIRE_F_PAYLOAD_CRC)
		crc = mp_crc32c(crc, f + MP_WIRE_HDR_SIZE, n - MP_WIRE_HDR_SIZE);
	mp_le_put32(f + 60, crc);
	check_frame(f, n);
	free(f);
	return 0;
}

#ifndef MP_LIBFUZZER
static void fuzz_stream(long iters)
{
	static uint8_t frame[MP_WIRE_HDR_SIZE + 8192], work[sizeof(frame)];
	static float vals[512], residue[512];
	static _Alignas(64) uint8_t scratch[1 << 20];
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
		/* The payload: a real encoding by that codec, of random values
		 * (some special) under random encoder settings. */
		const struct mp_codec_ops *c = mp_codec_by_id(h.codec);
		struct mp_codec_params p = {
			.block = 1 + (uint32_t)(next() % 600),
			.sigmas = 0.5f + (float)(next() % 16),
			.topk_ratio = (float)(1 + next() % 100) / 100.0f,
			.bin = 1 + (uint32_t)(next() % 120),
		};
		for (uint32_t k = 0; k < h.count; k++) {
			uint64_t r = next();
			vals[k] = (float)(int32_t)(r >> 32) / (float)(1u << (r & 31));
			residue[k] = (float)(int16_t)(r >> 8) / 1024.0f;
			if ((r & 0xff) == 7)
				vals[k] = (r & 0x100) ? 1.0f / 0.0f : 0.0f / 0.0f;
		}
		size_t plen = 0;
		size_t need = c->scratch_size ? c->scratch_size(&p, h.count) : 0;
		if (need > sizeof(scratch) ||
		    c->encode(&p, vals, (next() & 1) ? residue : NULL, h.count, frame + MP_WIRE_HDR_SIZE,
			      sizeof(frame) - MP_WIRE_HDR_SIZE, &plen, scratch))
			abort(); /* a valid input always encodes */
		h.length = (uint32_t)plen;
		mp_wire_encode(&h, frame, frame + MP_WIRE_HDR_SIZE);
		size_t len = MP_WIRE_HDR_SIZE + h.length;
		memcpy(work, frame, len);
		int muts = seed_dir ? 0 : (int)(next() % 4);
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
		if (muts == 0) {
			/* Untouched: what the encoder wrote must decode. */
			static float out[512];
			if (c->decode(work + MP_WIRE_HDR_SIZE, h.length, out, h.count))
				abort();
			accepted++;
		}
		check_frame(work, len);
		/* And through the entry libFuzzer uses, checksum fixed up, so
		 * that mutated payloads reach the decoders here too. */
		static uint8_t sel[1 + sizeof(work)];
		sel[0] = 0;
		memcpy(sel + 1, work, len);
		if (seed_dir)
			fuzz_seed(sel, len + 1);
		LLVMFuzzerTestOneInput(sel, len + 1);
	}
	printf("fuzz_frame: %ld frames (%ld unmutated), no crash\n", iters, accepted);
}
#endif

