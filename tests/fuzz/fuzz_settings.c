/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Fuzz target for the run-shared settings a HELLO carries
 * (src/session/settings.c, mp_settings_decode), read from every stranger
 * that dials before it has proven anything, and the comparison that names
 * the first field that differs.
 *
 * Input: the encoded settings, as they follow a HELLO's fixed part.
 * Invariants: no crash or sanitizer report; settings that decode compare
 * equal to themselves (NaN floats aside: they differ from everything, so a
 * peer that sends them is refused), have a non-zero fingerprint, and
 * encode into at most MP_SETTINGS_MAX bytes that decode to the same
 * settings.
 *
 * Built two ways, as fuzz_frame.c: libFuzzer with -DMP_LIBFUZZER, else
 * main() (fuzz_main.h) replays tests/fuzz/corpus/fuzz_settings/ or a
 * deterministic stream of mutated valid encodings.
 */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "settings.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
#define FUZZ_SEED 0x13198A2E03707344ull /* the deterministic stream's start */
#include "fuzz_main.h"

/* A plausible peer's settings: the other side of every comparison. */
static const struct mp_settings ours = {
	.algo = 0, .ndims = 2, .dims = { 4, 4 }, .rounds = 2, .codec = 4, .codec_block = 4096,
	.codec_sigmas = 6.0f, .topk_ratio = 0.01f, .adacomp_bin = 50, .chunk_elems = 1u << 18,
	.streams = 2, .npeers = 16, .bw_fp = 1, .bw_text = "1,2,3", .min_part = 1024,
};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct mp_settings s, t;
	uint8_t enc[MP_SETTINGS_MAX];
	char msg[256];
	size_t n;

	if (mp_settings_decode(data, size, &s))
		return 0;
	int nan = isnan(s.codec_sigmas) || isnan(s.topk_ratio);
	if (mp_settings_diff(&s, &s, msg, sizeof(msg)) != (nan ? -EBADE : 0))
		abort();
	int d1 = mp_settings_diff(&ours, &s, msg, sizeof(msg));
	int d2 = mp_settings_diff(&s, &ours, msg, sizeof(msg));
	if ((d1 && d1 != -EBADE) || (d2 && d2 != -EBADE) || (d1 && !strstr(msg, "differs")))
		abort();
	if (!mp_settings_fingerprint(&s))
		abort();
	n = mp_settings_encode(&s, enc);
	if (n > MP_SETTINGS_MAX || mp_settings_decode(enc, n, &t))
		abort();
	/* Same fields (present tells what the input held, not the value). */
	t.present = s.present;
	if (!nan && (mp_settings_diff(&s, &t, msg, sizeof(msg)) ||
		     mp_settings_fingerprint(&s) != mp_settings_fingerprint(&t)))
		abort();
	return 0;
}

#ifndef MP_LIBFUZZER
static void fuzz_stream(long iters)
{
	uint8_t buf[MP_SETTINGS_MAX + 64];

	for (long i = 0; i < iters; i++) {
		struct mp_settings s = ours;

		s.algo = (uint8_t)(next() % 3);
		s.ndims = (uint8_t)(next() % (MP_MAX_GRID_DIMS + 1));
		for (int k = 0; k < s.ndims; k++)
			s.dims[k] = (uint16_t)next();
		s.codec = (uint8_t)next();
		s.codec_sigmas = (float)(next() % 64);
		s.npeers = (uint32_t)next();
		snprintf(s.bw_text, sizeof(s.bw_text), "%u,%u", (unsigned)next(), (unsigned)next());
		s.direct_max = next();
		size_t len = mp_settings_encode(&s, buf);
		if (len > MP_SETTINGS_MAX)
			abort();
		int muts = seed_dir ? 0 : (int)(next() % 4);
		for (int m = 0; m < muts; m++) {
			switch (next() % 3) {
			case 0: buf[next() % len] ^= (uint8_t)(1u << (next() % 8)); break;
			case 1: buf[next() % len] = (uint8_t)next(); break;
			default:
				if (next() & 1)
					len = (size_t)(next() % (len + 1));
				else if (len + 16 < sizeof(buf))
					len += (size_t)(next() % 16);
			}
			if (!len)
				break;
		}
		if (seed_dir)
			fuzz_seed(buf, len);
		LLVMFuzzerTestOneInput(buf, len);
	}
	printf("fuzz_settings: %ld encodings, no crash\n", iters);
}
#endif

