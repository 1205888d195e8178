/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Fuzz target for the payloads of the control messages of a dht run
 * (src/ctrl/matchmaker.c): a JOIN's entry, a BEGIN's roster, a DECL's
 * fields, as mp_mm_join_parse, mp_mm_begin_parse and mp_mm_decl_parse
 * read them before the handlers judge them against the run. (A PEER
 * carries a record: fuzz_record. ACCEPT, REJECT and BYE carry no payload;
 * the header is fuzz_frame's.)
 *
 * Input: one selector byte (% 3: JOIN, BEGIN, DECL), then the payload.
 * Invariants: no crash or sanitizer report; every entry taken has a
 * non-zero id, a finite bandwidth, a mode <= MP_MODE_AUX and a terminated
 * address; a JOIN's entry lies within the payload; a BEGIN's roster of 1 to
 * MP_MAX_GROUP entries fills it exactly; a DECL is exactly 23 bytes.
 *
 * Built two ways, as fuzz_frame.c: libFuzzer with -DMP_LIBFUZZER, else
 * main() (fuzz_main.h) replays tests/fuzz/corpus/fuzz_ctrl/ or a
 * deterministic stream of mutated valid payloads (written here by hand
 * after matchmaker.c's put_entry: id u64, bandwidth f64, mode u8, coord
 * u16, address length u8 and bytes, all little-endian).
 */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <moshpit/moshpit.h>
#include <moshpit/sdk/le.h>

#include "matchmaker.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
#define FUZZ_SEED 0x452821E638D01377ull /* the deterministic stream's start */
#include "fuzz_main.h"

#define ENTRY_FIXED 20 /* id, bandwidth, mode, coord, address length */

static size_t entry_ok(const struct mp_mm_entry *e)
{
	size_t alen = strnlen(e->addr, MP_ADDR_STRLEN);

	if (!e->id || !isfinite(e->bw) || e->mode < 0 || e->mode > MP_MODE_AUX ||
	    alen == MP_ADDR_STRLEN || e->coord < INT16_MIN || e->coord > INT16_MAX)
		abort();
	return ENTRY_FIXED + alen;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static struct mp_mm_entry ro[MP_MAX_GROUP];
	struct mp_mm_entry e;
	struct mp_decl d;
	uint8_t *b;
	size_t n;
	int k = -1, rc;

	if (size < 1)
		return 0;
	n = size - 1;
	/* A copy of exactly the payload's size, so that ASan sees any overread. */
	b = malloc(n ? n : 1);
	if (!b)
		abort();
	memcpy(b, data + 1, n);
	switch (data[0] % 3) {
	case 0:
		rc = mp_mm_join_parse(b, n, &e);
		if ((rc && rc != -EBADMSG) || (!rc && entry_ok(&e) > n))
			abort();
		break;
	case 1:
		rc = mp_mm_begin_parse(b, n, ro, &k);
		if (rc && rc != -EBADMSG)
			abort();
		if (!rc) {
			size_t used = 4;

			if (k < 1 || k > MP_MAX_GROUP)
				abort();
			for (int i = 0; i < k; i++)
				used += entry_ok(&ro[i]);
			if (used != n)
				abort(); /* taken, yet not filled exactly */
		}
		break;
	default:
		rc = mp_mm_decl_parse(b, n, &d);
		if ((rc && rc != -EBADMSG) || (!rc && n != 23) || (rc && n == 23))
			abort();
	}
	free(b);
	return 0;
}

#ifndef MP_LIBFUZZER
static size_t put_entry(uint8_t *p)
{
	double bw = (double)(next() % 100000) / 3.0;
	uint64_t bits;
	size_t alen = (size_t)(next() % 40);

	mp_le_put64(p, next() | 1);
	memcpy(&bits, &bw, sizeof(bits));
	mp_le_put64(p + 8, bits);
	p[16] = (uint8_t)(next() % (MP_MODE_AUX + 1));
	mp_le_put16(p + 17, (uint16_t)(next() % 16));
	p[19] = (uint8_t)alen;
	for (size_t i = 0; i < alen; i++)
		p[ENTRY_FIXED + i] = (uint8_t)('0' + next() % 10);
	return ENTRY_FIXED + alen;
}

static void fuzz_stream(long iters)
{
	static uint8_t in[1 + 4 + MP_MAX_GROUP * (ENTRY_FIXED + 255) + 64];

	for (long i = 0; i < iters; i++) {
		int kind = (int)(next() % 3);
		size_t len = 0;

		if (kind == 0) {
			len = put_entry(in + 1);
		} else if (kind == 1) {
			uint32_t k = 1 + (uint32_t)(next() % 8);
			mp_le_put32(in + 1, k);
			len = 4;
			for (uint32_t j = 0; j < k; j++)
				len += put_entry(in + 1 + len);
		} else {
			mp_le_put64(in + 1, next());
			mp_le_put64(in + 9, next());
			in[17] = (uint8_t)(next() % 6);
			mp_le_put16(in + 18, (uint16_t)next());
			mp_le_put32(in + 20, (uint32_t)next());
			len = 23;
		}
		(void)fuzz_mutate(in + 1, &len, sizeof(in) - 1, 16);
		in[0] = (uint8_t)kind;
		if (seed_dir)
			fuzz_seed(in, 1 + len);
		LLVMFuzzerTestOneInput(in, 1 + len);
	}
	printf("fuzz_ctrl: %ld payloads, no crash\n", iters);
}
#endif
