/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Fuzz target for a state download's client side (src/ctrl/state_xfer.c,
 * mp_state_download_io and mp_state_ask_io), over a memory stream in place
 * of the socket: the input is what a server sends.
 *
 * Input: one selector byte, then the server's bytes (hello, header, buffer
 * lengths, metadata, MAC, data: doc/control-plane.md, "State download").
 *   bit 0   1: the harness writes the header MAC an honest server of the
 *           same run key would (over the nonce the client wrote), so that
 *           mutations reach what lies behind the MAC check
 *   bit 1   a read past the input's end: 0 -ECONNRESET, 1 -ETIMEDOUT
 *   bit 2   1: a version query (mp_state_ask_io, kind 1) instead of a
 *           download into two buffers of 48 and 80 bytes
 *
 * Invariants besides no crash, sanitizer report or leak: the client's ask
 * is well formed and its MAC verifies; it returns 0 only for a header whose
 * MAC verifies, and for a download only with the input's data in its
 * buffers and their digest equal to the header's; an honest server (the MAC
 * fixed up, every byte there, the right digest) is always taken; failures
 * are among the documented errors.
 *
 * Built two ways, as fuzz_welcome.c: libFuzzer with -DMP_LIBFUZZER, else
 * main() (fuzz_main.h) replays tests/fuzz/corpus/fuzz_state/ or a
 * deterministic stream of mutated honest answers.
 */
#include <errno.h>
#include <sodium.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <moshpit/sdk/le.h>

#include "auth.h"
#include "state_xfer.h"

#define RUN "fuzz-run"
#define RUN_ID 0x7374617465303031ull
/* The exchange's layout (state_xfer.c's comment). */
#define HELLO_LEN (4 + 1 + MP_NONCE_BYTES)
#define ASK_LEN (MP_NONCE_BYTES + 1 + 8 + 32 + MP_MAC_BYTES)
#define FIXED 65
#define L0 48
#define L1 80
/* Deadlines: the memory stream never waits, but the download checks the
 * clock between pieces. */
#define NEVER (UINT64_MAX / 2)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
#define FUZZ_SEED 0x243F6A8885A308D3ull /* the deterministic stream's start */
#include "fuzz_main.h"

static struct mp_auth auth;

static void init_once(void)
{
	static int done;

	if (!done) {
		if (mp_auth_init(&auth, RUN, "fuzz key", NULL) || sodium_init() < 0)
			abort();
		done = 1;
	}
}

struct mem {
	uint8_t *in; /* what the server sends (a copy the fix-up patches) */
	size_t len, pos;
	int past;
	int fix;
	uint8_t wrote[ASK_LEN];
	size_t wlen;
};

/* Where the header's MAC starts in the input, if the header is there and
 * within the bounds; else 0. */
static size_t mac_at(const struct mem *m)
{
	const uint8_t *f = m->in + HELLO_LEN;
	uint64_t nb, ml;

	if (m->len < HELLO_LEN + FIXED)
		return 0;
	nb = mp_le_get32(f + 25);
	ml = mp_le_get32(f + 29);
	if (nb > MP_STATE_MAX_BUFS || ml > MP_STATE_META_MAX)
		return 0;
	return HELLO_LEN + FIXED + 8 * nb + ml;
}

static void head_mac(const struct mem *m, size_t at, uint8_t *mac)
{
	uint8_t run[8];
	const uint8_t *f = m->in + HELLO_LEN;
	size_t lens = 8 * (size_t)mp_le_get32(f + 25);
	struct mp_auth_piece pc[6] = {{m->wrote, MP_NONCE_BYTES}, {m->in + 5, MP_NONCE_BYTES},
				      {run, 8}, {f, FIXED}, {f + FIXED, lens},
				      {f + FIXED + lens, at - HELLO_LEN - FIXED - lens}};

	mp_le_put64(run, RUN_ID);
	mp_auth_mac(&auth, MP_AUTH_STATE_GIVE, pc, 6, mac);
}

static int mem_xfer(void *ctx, void *buf, size_t len, uint64_t deadline, int out)
{
	struct mem *m = ctx;
	size_t at;

	(void)deadline; /* never blocks: the input is all there is */
	if (out) {
		size_t k = len < sizeof(m->wrote) - m->wlen ? len : sizeof(m->wrote) - m->wlen;

		memcpy(m->wrote + m->wlen, buf, k);
		m->wlen += k;
		return 0;
	}
	if (m->fix && m->wlen == ASK_LEN && (at = mac_at(m)) && m->pos == at &&
	    len == MP_MAC_BYTES && m->len >= at + MP_MAC_BYTES)
		head_mac(m, at, m->in + at);
	if (len > m->len - m->pos) {
		memcpy(buf, m->in + m->pos, m->len - m->pos);
		m->pos = m->len;
		return m->past;
	}
	memcpy(buf, m->in + m->pos, len);
	m->pos += len;
	return 0;
}

static void check_ask(const struct mem *m, int kind)
{
	uint8_t run[8], mac[MP_MAC_BYTES];
	struct mp_auth_piece pc[4] = {{m->in + 5, MP_NONCE_BYTES}, {m->wrote, MP_NONCE_BYTES},
				      {run, 8}, {m->wrote + MP_NONCE_BYTES, 41}};

	if (!m->wlen)
		return; /* no good hello: nothing was asked */
	if (m->wlen != ASK_LEN || m->len < HELLO_LEN || memcmp(m->in, "MPST\1", 5) ||
	    m->wrote[MP_NONCE_BYTES] != kind) {
		abort();
	}
	mp_le_put64(run, RUN_ID);
	mp_auth_mac(&auth, MP_AUTH_STATE_ASK, pc, 4, mac);
	if (memcmp(mac, m->wrote + MP_NONCE_BYTES + 41, MP_MAC_BYTES)) {
		abort();
	}
}

static void fuzz_once(struct mem *m, int query)
{
	uint8_t b0[L0], b1[L1];
	void *bufs[2] = {b0, b1};
	size_t lens[2] = {L0, L1};
	struct mp_state_dest d = {bufs, lens, 2};
	struct mp_state_head h;
	uint64_t got = 0;
	size_t at = 0;
	int rc, honest = 0, mac_ok = 0;

	memset(b0, 0, sizeof(b0));
	memset(b1, 0, sizeof(b1));
	if (query)
		rc = mp_state_ask_io(&auth, RUN_ID, &(struct mp_state_io){mem_xfer, m}, 1, 0, NULL,
				     NEVER, &h);
	else
		rc = mp_state_download_io(&auth, RUN_ID, &(struct mp_state_io){mem_xfer, m}, &d, 0,
					  NULL, 1000, NEVER, &h, &got);
	check_ask(m, query ? 1 : 2);
	if (m->wlen == ASK_LEN && (at = mac_at(m)) && m->len >= at + MP_MAC_BYTES) {
		uint8_t mac[MP_MAC_BYTES];

		head_mac(m, at, mac);
		mac_ok = !memcmp(mac, m->in + at, MP_MAC_BYTES);
	}
	if (mac_ok && m->in[HELLO_LEN] <= 1) {
		const uint8_t *f = m->in + HELLO_LEN;
		uint64_t sum = 0, nb = mp_le_get32(f + 25), total = mp_le_get64(f + 9);

		for (uint64_t i = 0; i < nb; i++)
			sum += mp_le_get64(f + FIXED + 8 * i);
		honest = m->fix && sum == total && mp_le_get64(f + 17) <= total;
		if (!query) {
			uint8_t dg[32];

			honest = honest && f[0] == 1 && nb == 2 && mp_le_get64(f + FIXED) == L0 &&
				 mp_le_get64(f + FIXED + 8) == L1 && mp_le_get64(f + 17) == 0 &&
				 m->len >= at + MP_MAC_BYTES + L0 + L1;
			if (honest) {
				crypto_generichash(dg, 32, m->in + at + MP_MAC_BYTES, L0 + L1, NULL, 0);
				honest = !memcmp(dg, f + 33, 32);
			}
		}
	}
	if (rc) {
		if (honest)
			abort(); /* an honest server's answer refused */
		if (rc != -ETIMEDOUT && rc != -ECONNRESET && rc != -EPROTO && rc != -EACCES &&
		    rc != -EMSGSIZE && rc != -ENOMEM && rc != -ENOENT && rc != -EBADMSG)
			abort();
	} else {
		if (!mac_ok)
			abort(); /* taken under a MAC that does not verify */
		if (!query) {
			uint8_t dg[32];

			if (got != L0 + L1 || memcmp(b0, m->in + at + MP_MAC_BYTES, L0) ||
			    memcmp(b1, m->in + at + MP_MAC_BYTES + L0, L1))
				abort();
			crypto_generichash(dg, 32, m->in + at + MP_MAC_BYTES, L0 + L1, NULL, 0);
			if (memcmp(dg, h.digest, 32))
				abort();
		}
	}
	mp_state_head_free(&h);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct mem *m;

	if (size < 1)
		return 0;
	init_once();
	m = calloc(1, sizeof(*m));
	if (!m)
		abort();
	m->len = size - 1;
	/* A copy of exactly the input's size, so that ASan sees any overread. */
	m->in = malloc(m->len ? m->len : 1);
	if (!m->in)
		abort();
	memcpy(m->in, data + 1, m->len);
	m->fix = data[0] & 1;
	m->past = (data[0] & 2) ? -ETIMEDOUT : -ECONNRESET;
	fuzz_once(m, (data[0] >> 2) & 1);
	free(m->in);
	free(m);
	return 0;
}

#ifndef MP_LIBFUZZER
static void fuzz_stream(long iters)
{
	static uint8_t in[1 + HELLO_LEN + FIXED + 16 + 64 + MP_MAC_BYTES + L0 + L1 + 64];
	long taken = 0;

	init_once();
	for (long i = 0; i < iters; i++) {
		uint8_t *p = in + 1, *f = p + HELLO_LEN;
		size_t ml = (next() & 1) ? (size_t)(next() % 65) : 0, len;

		/* An honest server's answer, its MAC left to the fix-up. */
		memcpy(p, "MPST\1", 5);
		for (size_t k = 0; k < MP_NONCE_BYTES; k++)
			p[5 + k] = (uint8_t)next();
		memset(f, 0, FIXED);
		f[0] = 1;
		mp_le_put64(f + 1, next() % 1000);
		mp_le_put64(f + 9, L0 + L1);
		mp_le_put32(f + 25, 2);
		mp_le_put32(f + 29, (uint32_t)ml);
		mp_le_put64(f + FIXED, L0);
		mp_le_put64(f + FIXED + 8, L1);
		for (size_t k = 0; k < ml; k++)
			f[FIXED + 16 + k] = (uint8_t)next();
		uint8_t *mac = f + FIXED + 16 + ml, *dat = mac + MP_MAC_BYTES;
		memset(mac, 0, MP_MAC_BYTES);
		for (size_t k = 0; k < L0 + L1; k++)
			dat[k] = (uint8_t)next();
		crypto_generichash(f + 33, 32, dat, L0 + L1, NULL, 0);
		len = (size_t)(dat + L0 + L1 - p);
		int muts = fuzz_mutate(p, &len, sizeof(in) - 1, 16);
		in[0] = (uint8_t)(((seed_dir || (next() % 4)) ? 1 : 0) | (next() & 2) |
				  ((next() % 4) ? 0 : 4));
		if (!muts)
			taken++;
		if (seed_dir)
			fuzz_seed(in, 1 + len);
		LLVMFuzzerTestOneInput(in, 1 + len);
	}
	printf("fuzz_state: %ld answers (%ld unmutated), no crash\n", iters, taken);
}
#endif
