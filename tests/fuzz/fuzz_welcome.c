/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Fuzz target for the welcome exchange (src/ctrl/welcome.c), both sides,
 * over a memory stream (struct mp_welcome_io) in place of the socket.
 *
 * Input: one selector byte, then what the other side sends.
 *   bit 0   0: the service reads the bytes as an asker's (its nonce, gift
 *           length, MAC and gift; mp_welcome_serve_io); 1: an asker reads
 *           them as a service's (its HELLO, then the answer's header and
 *           payload; mp_welcome_ask_io)
 *   bit 1   1: the harness writes the MAC an honest peer of the same run
 *           key would (over the nonce the fuzzed side wrote first), so that
 *           mutations reach what lies behind the MAC check, which libFuzzer
 *           cannot forge
 *   bit 2   a read past the input's end: 0 -ECONNRESET (the peer closed),
 *           1 -ETIMEDOUT (a silent peer), as the socket would give
 *   bits 3-7  the asker's gift: that many times 16 bytes
 * The memory stream never blocks; writes always go through and are kept.
 *
 * Invariants besides no crash, sanitizer report or leak: the service calls
 * its fill only with a gift whose ask MAC verifies (checked here again, by
 * the harness's own MAC), of at most MP_WELCOME_GIVE_MAX bytes, and then
 * writes an answer whose MAC verifies; an ask it does not fill for is
 * refused with a reason. The asker returns 0 only with the payload the
 * input carries, of at most MP_WELCOME_MAX bytes, under a verifying MAC;
 * else one of mp_welcome_ask's documented errors. An honest peer (the
 * MACs fixed up, every byte there) is always served or answered.
 *
 * Built two ways, as fuzz_frame.c: libFuzzer with -DMP_LIBFUZZER, else
 * main() (fuzz_main.h) replays tests/fuzz/corpus/fuzz_welcome/ or a
 * deterministic stream of mutated honest exchanges.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <moshpit/sdk/le.h>

#include "auth.h"
#include "welcome.h"

#define RUN "fuzz-run"
#define RUN_ID 0x77656c636f6d6531ull
/* The exchange's layout (welcome.c's comment). */
#define HELLO_LEN (4 + 1 + MP_NONCE_BYTES)
#define ASK_LEN (MP_NONCE_BYTES + 2 + MP_MAC_BYTES)
#define GIVE_HDR_LEN (4 + MP_MAC_BYTES)
/* What the harness's fill answers at most (the gift, then 64 bytes): the
 * whole answer fits the kept writes. */
#define FILL_EXTRA 64
#define WROTE_MAX (HELLO_LEN + GIVE_HDR_LEN + MP_WELCOME_GIVE_MAX + FILL_EXTRA + ASK_LEN)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
#define FUZZ_SEED 0x452821E638D01377ull /* the deterministic stream's start */
#include "fuzz_main.h"

static struct mp_auth auth;
/* The service's answer buffer, MP_WELCOME_BUF_LEN bytes, made once. */
static uint8_t *answer;

static void init_once(void)
{
	static int done;

	if (!done) {
		if (mp_auth_init(&auth, RUN, "fuzz key", NULL))
			abort();
		answer = malloc(MP_WELCOME_BUF_LEN);
		if (!answer)
			abort();
		done = 1;
	}
}

/* The other side, played from memory. */
struct mem {
	uint8_t *in;   /* what it sends (a copy the fix-ups patch) */
	size_t len, pos;
	int past;      /* a read past the end: -ECONNRESET or -ETIMEDOUT */
	int client;    /* the fuzzed side is the asker */
	int fix;       /* fix the MACs up, as an honest peer */
	int reads;
	uint8_t wrote[WROTE_MAX]; /* what the fuzzed side wrote, as far as it fits */
	size_t wlen;
	int filled;    /* the service's fill was called */
};

static void run_le(uint8_t run[8])
{
	mp_le_put64(run, RUN_ID);
}

/* The ask's MAC (WELCOME_ASK: nonce_s, nonce_c, run id, gift length, gift)
 * over @ask and @gift into @mac, or, with @check, verified against it. */
static int ask_mac(const uint8_t *nonce_s, const uint8_t *ask, const uint8_t *gift, size_t glen,
		   uint8_t *mac, int check)
{
	uint8_t run[8];
	struct mp_auth_piece pc[5] = {{nonce_s, MP_NONCE_BYTES}, {ask, MP_NONCE_BYTES},
				      {run, 8}, {ask + MP_NONCE_BYTES, 2}, {gift, glen}};

	run_le(run);
	if (check)
		return mp_auth_verify(&auth, MP_AUTH_WELCOME_ASK, pc, 5, mac);
	mp_auth_mac(&auth, MP_AUTH_WELCOME_ASK, pc, 5, mac);
	return 0;
}

/* The answer's MAC (WELCOME_GIVE: nonce_c, nonce_s, run id, length,
 * payload) over the header @hdr and @payload, likewise. */
static int give_mac(const uint8_t *nonce_c, const uint8_t *nonce_s, const uint8_t *hdr,
		    const uint8_t *payload, size_t n, uint8_t *mac, int check)
{
	uint8_t run[8];
	struct mp_auth_piece pc[5] = {{nonce_c, MP_NONCE_BYTES}, {nonce_s, MP_NONCE_BYTES},
				      {run, 8}, {hdr, 4}, {payload, n}};

	run_le(run);
	if (check)
		return mp_auth_verify(&auth, MP_AUTH_WELCOME_GIVE, pc, 5, mac);
	mp_auth_mac(&auth, MP_AUTH_WELCOME_GIVE, pc, 5, mac);
	return 0;
}

/* Before the fuzzed side reads a MAC, write the one an honest peer would
 * have, over the nonce the fuzzed side wrote and whatever of the body the
 * input holds (a body cut short fails its read anyway). */
static void fix_up(struct mem *m)
{
	uint8_t *p = m->in + m->pos;
	size_t left = m->len - m->pos;

	if (!m->client && m->reads == 0 && left >= ASK_LEN && m->wlen >= HELLO_LEN) {
		size_t glen = mp_le_get16(p + MP_NONCE_BYTES);

		if (glen > left - ASK_LEN)
			glen = left - ASK_LEN;
		ask_mac(m->wrote + 5, p, p + ASK_LEN, glen, p + MP_NONCE_BYTES + 2, 0);
	} else if (m->client && m->reads == 1 && left >= GIVE_HDR_LEN && m->wlen >= ASK_LEN &&
		   m->pos == HELLO_LEN) {
		size_t n = mp_le_get32(p);

		if (n > left - GIVE_HDR_LEN)
			n = left - GIVE_HDR_LEN;
		give_mac(m->wrote, m->in + 5, p, p + GIVE_HDR_LEN, n, p + 4, 0);
	}
}

static int mem_xfer(void *ctx, void *buf, size_t len, uint64_t deadline, int out)
{
	struct mem *m = ctx;

	(void)deadline; /* never blocks: the input is all there is */
	if (out) {
		size_t k = len < WROTE_MAX - m->wlen ? len : WROTE_MAX - m->wlen;

		memcpy(m->wrote + m->wlen, buf, k);
		m->wlen += k;
		return 0;
	}
	if (m->fix)
		fix_up(m);
	m->reads++;
	if (len > m->len - m->pos) {
		/* What there is arrives, then the peer closes or goes silent. */
		memcpy(buf, m->in + m->pos, m->len - m->pos);
		m->pos = m->len;
		return m->past;
	}
	memcpy(buf, m->in + m->pos, len);
	m->pos += len;
	return 0;
}

/* The service's fill: it must see only a verified gift. The ask it read
 * is at the input's start, the gift behind it (the fix-up, if any, was
 * written there). Answers with the gift and FILL_EXTRA bytes more. */
static size_t fill(void *arg, const uint8_t *in, size_t inlen, uint8_t *out, size_t cap)
{
	struct mem *m = arg;

	if (m->filled++ || m->client || inlen > MP_WELCOME_GIVE_MAX || cap != MP_WELCOME_MAX ||
	    m->len < ASK_LEN + inlen || inlen != mp_le_get16(m->in + MP_NONCE_BYTES) ||
	    memcmp(in, m->in + ASK_LEN, inlen))
		abort();
	if (ask_mac(m->wrote + 5, m->in, in, inlen, m->in + MP_NONCE_BYTES + 2, 1))
		abort(); /* filled for an ask whose MAC does not verify */
	memcpy(out, in, inlen);
	memset(out + inlen, 0xa5, FILL_EXTRA);
	return inlen + FILL_EXTRA;
}

static void fuzz_server(struct mem *m)
{
	const char *why = mp_welcome_serve_io(&auth, RUN_ID, fill, m, answer,
					      &(struct mp_welcome_io){mem_xfer, m}, 1000);
	size_t glen = m->len >= ASK_LEN ? mp_le_get16(m->in + MP_NONCE_BYTES) : 0;
	int honest = m->fix && m->len >= ASK_LEN + glen && glen <= MP_WELCOME_GIVE_MAX;

	if (m->wlen < HELLO_LEN || memcmp(m->wrote, "MPWL\1", 5))
		abort();
	if (!m->filled) {
		if (!why || honest)
			abort(); /* neither served nor refused, or an honest asker refused */
		if (m->wlen != HELLO_LEN)
			abort(); /* a refused asker is given nothing */
		return;
	}
	if (why)
		abort();
	/* The answer: the gift and FILL_EXTRA bytes, under the give MAC. */
	{
		const uint8_t *hdr = m->wrote + HELLO_LEN;
		size_t n = glen + FILL_EXTRA;

		if (m->wlen != HELLO_LEN + GIVE_HDR_LEN + n || mp_le_get32(hdr) != n ||
		    memcmp(hdr + GIVE_HDR_LEN, m->in + ASK_LEN, glen) ||
		    give_mac(m->in, m->wrote + 5, hdr, hdr + GIVE_HDR_LEN, n, (uint8_t *)hdr + 4, 1))
			abort();
	}
}

static void fuzz_client(struct mem *m, size_t give_len)
{
	uint8_t give[MP_WELCOME_GIVE_MAX], *payload = NULL;
	size_t n = 0, plen = 0;
	int rc, honest = 0;

	for (size_t i = 0; i < give_len; i++)
		give[i] = (uint8_t)(i * 7 + 1);
	rc = mp_welcome_ask_io(&auth, RUN_ID, &(struct mp_welcome_io){mem_xfer, m}, 1000, give,
			       give_len, &payload, &plen);
	if (m->len >= HELLO_LEN + GIVE_HDR_LEN) {
		n = mp_le_get32(m->in + HELLO_LEN);
		honest = m->fix && !memcmp(m->in, "MPWL\1", 5) && n <= MP_WELCOME_MAX &&
			 m->len >= HELLO_LEN + GIVE_HDR_LEN + n;
	}
	/* Whatever came of it, an ask went out only after a good HELLO, and
	 * that ask is honest: its MAC verifies, its gift follows. */
	if (m->wlen) {
		if (m->len < HELLO_LEN || memcmp(m->in, "MPWL\1", 5) ||
		    m->wlen != ASK_LEN + give_len ||
		    mp_le_get16(m->wrote + MP_NONCE_BYTES) != give_len ||
		    memcmp(m->wrote + ASK_LEN, give, give_len) ||
		    ask_mac(m->in + 5, m->wrote, give, give_len, m->wrote + MP_NONCE_BYTES + 2, 1))
			abort();
	}
	if (rc) {
		if (payload || honest)
			abort(); /* an honest service's answer refused */
		if (rc != -ETIMEDOUT && rc != -ECONNRESET && rc != -EPROTO && rc != -EACCES &&
		    rc != -EMSGSIZE && rc != -ENOMEM)
			abort();
		return;
	}
	/* Taken: exactly the payload the input carries, under a MAC that
	 * verifies over the nonce this asker sent. */
	if (!payload || plen > MP_WELCOME_MAX || plen != n || !m->wlen ||
	    m->len < HELLO_LEN + GIVE_HDR_LEN + plen ||
	    memcmp(payload, m->in + HELLO_LEN + GIVE_HDR_LEN, plen) ||
	    give_mac(m->wrote, m->in + 5, m->in + HELLO_LEN, payload, plen, m->in + HELLO_LEN + 4, 1))
		abort();
	free(payload);
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
	m->client = data[0] & 1;
	m->fix = (data[0] >> 1) & 1;
	m->past = (data[0] & 4) ? -ETIMEDOUT : -ECONNRESET;
	if (m->client)
		fuzz_client(m, (size_t)(data[0] >> 3) * 16);
	else
		fuzz_server(m);
	free(m->in);
	free(m);
	return 0;
}

#ifndef MP_LIBFUZZER
static void fuzz_stream(long iters)
{
	static uint8_t in[1 + HELLO_LEN + GIVE_HDR_LEN + 4096 + 16];
	long taken = 0;

	init_once();
	for (long i = 0; i < iters; i++) {
		int client = (int)(next() & 1);
		size_t len;

		/* An honest peer's bytes, their MACs left to the fix-up (the
		 * fuzzed side's nonce is drawn afresh each time). */
		if (!client) {
			size_t glen = (next() & 3) ? (size_t)(next() % (MP_WELCOME_GIVE_MAX + 1)) : 0;

			for (size_t k = 0; k < MP_NONCE_BYTES; k++)
				in[1 + k] = (uint8_t)next();
			mp_le_put16(in + 1 + MP_NONCE_BYTES, (uint16_t)glen);
			memset(in + 1 + MP_NONCE_BYTES + 2, 0, MP_MAC_BYTES);
			for (size_t k = 0; k < glen; k++)
				in[1 + ASK_LEN + k] = (uint8_t)next();
			len = ASK_LEN + glen;
		} else {
			size_t n = (next() & 3) ? (size_t)(next() % 4097) : 0;

			memcpy(in + 1, "MPWL\1", 5);
			for (size_t k = 0; k < MP_NONCE_BYTES; k++)
				in[1 + 5 + k] = (uint8_t)next();
			mp_le_put32(in + 1 + HELLO_LEN, (uint32_t)n);
			memset(in + 1 + HELLO_LEN + 4, 0, MP_MAC_BYTES);
			for (size_t k = 0; k < n; k++)
				in[1 + HELLO_LEN + GIVE_HDR_LEN + k] = (uint8_t)next();
			len = HELLO_LEN + GIVE_HDR_LEN + n;
		}
		/* Mutations, then fixed up or not, closed or silent at the end. */
		int muts = fuzz_mutate(in + 1, &len, sizeof(in) - 1, 16);
		in[0] = (uint8_t)(client | ((next() & 31) << 3) | (next() & 4) |
				  ((seed_dir || (next() % 4)) ? 2 : 0));
		if (!muts)
			taken++;
		if (seed_dir)
			fuzz_seed(in, 1 + len);
		LLVMFuzzerTestOneInput(in, 1 + len);
	}
	printf("fuzz_welcome: %ld exchanges (%ld unmutated), no crash\n", iters, taken);
}
#endif
