/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Fuzz target for what a dht run reads off the rendezvous and off control
 * connections (MP_MSG_PEER passes a record on): membership records and
 * matchmaking declarations (src/ctrl/rdv_record.c).
 *
 * Input: one selector byte, then the encoded value.
 *   bit 0   0: a record (mp_record_decode), 1: a declaration (mp_decl_decode)
 *   bit 1   1: the harness signs the bytes first (writes the MAC the run key
 *           gives them, where the layout keeps it), so that mutations reach
 *           the field checks behind the MAC, which libFuzzer cannot forge
 *   bit 2   1: the reader checks a settings fingerprint (records)
 * Invariants: no crash or sanitizer report; every refusal is one of the
 * documented errors; a value that decodes encodes back to exactly the bytes
 * it came from ("one value has one encoding", rdv_record.c).
 *
 * Built two ways, as fuzz_frame.c: libFuzzer with -DMP_LIBFUZZER, else
 * main() (fuzz_main.h) replays tests/fuzz/corpus/fuzz_record/ or a
 * deterministic stream of mutated valid values.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "auth.h"
#include "rdv.h"

#define RUN "fuzz-run"
#define KEY "rdv/7/line/3"  /* a declaration's group key, as matchmaker.c forms them */
#define SETTINGS_FP 0x5eed5eed5eed5eedull
/* Where rdv_record.c keeps the MAC (its layout comment): the bytes before it are signed. */
#define RECORD_LEN 250
#define RECORD_MAC 218
#define DECL_LEN 62
#define DECL_MAC 30
#define ROUND 7   /* the round of KEY */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
#define FUZZ_SEED 0x243F6A8885A308D3ull /* the deterministic stream's start */
#include "fuzz_main.h"

static struct mp_auth auth;

static void auth_once(void)
{
	static int done;

	if (!done) {
		if (mp_auth_init(&auth, RUN, "fuzz key", NULL))
			abort();
		done = 1;
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	uint8_t out[MP_RECORD_WIRE_MAX];
	size_t n, len = 0;
	uint8_t *b;
	int rc;

	if (size < 1)
		return 0;
	auth_once();
	n = size - 1;
	/* A copy of exactly the value's size, so that ASan sees any overread. */
	b = malloc(n ? n : 1);
	if (!b)
		abort();
	memcpy(b, data + 1, n);
	auth.settings_fp = (data[0] & 4) ? SETTINGS_FP : 0;
	if (!(data[0] & 1)) {
		struct mp_record r;

		if ((data[0] & 2) && n == RECORD_LEN)
			mp_auth_mac(&auth, MP_AUTH_RECORD, &(struct mp_auth_piece){ b, RECORD_MAC }, 1,
				    b + RECORD_MAC);
		rc = mp_record_decode(&auth, RUN, b, n, &r);
		if (rc && rc != -EBADMSG && rc != -EACCES && rc != -EPROTO && rc != -EBADE)
			abort();
		if (!rc && (mp_record_encode(&auth, RUN, &r, out, sizeof(out), &len) || len != n ||
			    memcmp(out, b, n)))
			abort(); /* taken, yet not what its encoder writes */
	} else {
		struct mp_decl d;

		if ((data[0] & 2) && n == DECL_LEN)
			mp_auth_mac(&auth, MP_AUTH_DECL,
				    (struct mp_auth_piece[]){ { b, DECL_MAC }, { KEY, strlen(KEY) } }, 2,
				    b + DECL_MAC);
		rc = mp_decl_decode(&auth, KEY, ROUND, b, n, &d);
		if (rc && rc != -EBADMSG && rc != -EACCES && rc != -ESTALE)
			abort();
		if (!rc && (mp_decl_encode(&auth, KEY, ROUND, &d, out, sizeof(out), &len) || len != n ||
			    memcmp(out, b, n)))
			abort();
	}
	free(b);
	return 0;
}

#ifndef MP_LIBFUZZER
static void fuzz_stream(long iters)
{
	uint8_t in[1 + MP_RECORD_WIRE_MAX + 8];
	long taken = 0;

	auth_once();
	for (long i = 0; i < iters; i++) {
		size_t len = 0;
		int decl = (int)(next() & 1);

		auth.settings_fp = 0;
		if (!decl) {
			struct mp_record r = {
				.id = next() | 1, .seq = next(), .expires_ms = next(),
				.round = (uint32_t)next(), .mode = (uint8_t)(next() % 3),
				.bye = (uint8_t)(next() & 1), .ndims = (uint8_t)(next() % (MP_MAX_GRID_DIMS + 1)),
				.bandwidth = (double)(next() % 100000) / 7.0, .transport = "tcp",
				.settings = (next() & 1) ? SETTINGS_FP : 0,
			};
			for (int k = 0; k < r.ndims; k++)
				r.coords[k] = (int16_t)next();
			snprintf(r.addr, sizeof(r.addr), "10.0.%u.%u:%u", (unsigned)(next() % 256),
				 (unsigned)(next() % 256), (unsigned)(next() % 65536));
			if (mp_record_encode(&auth, RUN, &r, in + 1, sizeof(in) - 1, &len))
				abort();
		} else {
			struct mp_decl d = {
				.id = next() | 1, .expires_ms = next(), .mode = (uint8_t)(next() % 6),
				.coord = (int16_t)next(), .line = (uint32_t)next(),
			};
			if (mp_decl_encode(&auth, KEY, ROUND, &d, in + 1, sizeof(in) - 1, &len))
				abort();
		}
		/* Mutations, then signed again or not, a reader's fingerprint or not. */
		int muts = fuzz_mutate(in + 1, &len, sizeof(in) - 1, 8);
		in[0] = (uint8_t)(decl | (next() & 6));
		if (!muts)
			taken++;
		if (seed_dir)
			fuzz_seed(in, 1 + len);
		LLVMFuzzerTestOneInput(in, 1 + len);
	}
	printf("fuzz_record: %ld values (%ld unmutated), no crash\n", iters, taken);
}
#endif

