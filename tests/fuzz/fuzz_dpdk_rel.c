/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Fuzz target for the dpdk driver's reliable delivery input path
 * (drivers/dpdk/rel.c): segments fed to a live connection in every state
 * the set-up below reaches (handshake done, a message half delivered,
 * receives posted, data in flight both ways).
 *
 * Input: a sequence of [u8 to][u16 len LE][len bytes]; `to` bit 0 picks
 * the instance. Invariants: no crash or sanitizer report, and every segment
 * fed is either accepted or dropped for one counted reason, exactly once.
 *
 * Built two ways: with clang -fsanitize=fuzzer it is a libFuzzer target
 * (-DMP_LIBFUZZER); otherwise main() (fuzz_main.h) replays the seed corpus
 * tests/fuzz/corpus/fuzz_dpdk_rel/ or a deterministic stream of mutated
 * real segments, so the suite runs it on every build.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "drivers/dpdk/rel.h"

#define MSS 512
#define QMAX 256
#define FRAME (MP_REL_HDR_MAX + MSS)

struct frame {
	int dst;
	size_t len;
	uint8_t b[FRAME];
};

static struct frame q[QMAX];
static unsigned qn;
static uint64_t vnow;
static int ids[2] = { 0, 1 };
/* Last segment of each type each side sent: seeds for the replay. */
static uint8_t seen[2][8][FRAME];
static size_t seen_len[2][8];

static int tx(void *user, uint32_t route, const void *hdr, size_t hlen, const struct mp_iov *pl, int n)
{
	int src = *(int *)user;
	struct frame *f;
	size_t len = hlen;

	if (qn == QMAX)
		return -EAGAIN;
	f = &q[qn];
	memcpy(f->b, hdr, hlen);
	for (int i = 0; i < n; i++) {
		memcpy(f->b + len, pl[i].base, pl[i].len);
		len += pl[i].len;
	}
	if (len > FRAME || route > 1)
		abort();
	f->len = len;
	f->dst = (int)route;
	qn++;
	unsigned type = f->b[3];

	if (type < 8) {
		memcpy(seen[src][type], f->b, len);
		seen_len[src][type] = len;
	}
	return 0;
}

static uint64_t clk(void *user)
{
	(void)user;
	return vnow;
}

static struct mp_rel *rel[2];

static void deliver(int rounds)
{
	for (int r = 0; r < rounds; r++) {
		static struct frame cur[QMAX];
		unsigned n;

		mp_rel_poll(rel[0]);
		mp_rel_poll(rel[1]);
		n = qn;
		memcpy(cur, q, n * sizeof(q[0]));
		qn = 0;
		for (unsigned i = 0; i < n; i++)
			mp_rel_input(rel[cur[i].dst], (uint32_t)(1 - cur[i].dst), cur[i].b, cur[i].len);
		vnow += 20000;
	}
}

static uint8_t sbuf[2][4 * MSS + 7], rbuf[2][3][4 * MSS];

/* Two instances, one connection, a message each way half delivered. */
static void world_up(void)
{
	struct mp_rel_conn *c[2] = { NULL, NULL };
	struct mp_rel_req *r;

	qn = 0;
	vnow = 1000000000ull;
	for (int i = 0; i < 2; i++) {
		struct mp_rel_params p = {
			.mss = MSS, .window = 64, .max_posted = 4, .max_conns = 4,
			.rto_min_ns = 100000, .rto_max_ns = 1000000, .max_retries = 3,
			.seed = 7 + (uint64_t)i, .tx = tx, .now_ns = clk, .user = &ids[i],
			/* Instance 1 lands every message with non-temporal stores (its
			 * first is too long for its buffer: only the 3-byte one lands). */
			.stream_min = i ? 1 : 0,
		};
		if (mp_rel_create(&p, &rel[i]))
			abort();
	}
	mp_rel_listen(rel[1], 2);
	if (mp_rel_connect(rel[0], 1, &c[0]))
		abort();
	deliver(3);
	if (mp_rel_accept(rel[1], &c[1]))
		abort();
	for (int i = 0; i < 2; i++) {
		for (int k = 0; k < 3; k++)
			if (mp_rel_recv(c[i], rbuf[i][k], sizeof(rbuf[i][k]), &r))
				abort();
		if (mp_rel_send(c[i], &(struct mp_iov){ sbuf[i], sizeof(sbuf[i]) }, 1, &r) ||
		    mp_rel_send(c[i], &(struct mp_iov){ sbuf[i], 3 }, 1, &r))
			abort();
	}
	/* Polls only: the data is queued on the link, not yet delivered. */
	mp_rel_poll(rel[0]);
	mp_rel_poll(rel[1]);
	qn = qn > 2 ? qn - 2 : 0; /* and the last two frames are lost */
	deliver(1);
}

static void world_down(void)
{
	mp_rel_destroy(rel[0]);
	mp_rel_destroy(rel[1]);
}

static uint64_t counted(struct mp_rel *r)
{
	struct mp_rel_stats st;
	uint64_t n;

	mp_rel_get_stats(r, &st);
	n = st.seg_rx;
	for (int d = 0; d < MP_REL_DROP_MAX; d++)
		n += st.drop[d];
	return n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
#define FUZZ_SEED 0x2545F4914F6CDD1Dull /* the deterministic stream's start */
#include "fuzz_main.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	world_up();
	while (size >= 3) {
		int to = data[0] & 1;
		size_t len = (size_t)data[1] | (size_t)data[2] << 8;

		data += 3;
		size -= 3;
		if (len > size)
			len = size;
		uint64_t before = counted(rel[to]);

		mp_rel_input(rel[to], (uint32_t)(1 - to), data, len);
		if (counted(rel[to]) != before + 1)
			abort(); /* every segment accepted or dropped, once */
		data += len;
		size -= len;
		mp_rel_poll(rel[0]);
		mp_rel_poll(rel[1]);
	}
	deliver(4);
	world_down();
	return 0;
}

#ifndef MP_LIBFUZZER
static void fuzz_stream(long iters)
{
	static uint8_t in[4 * (3 + FRAME + 16)];

	/* Learn real segments of every type the set-up produces. */
	world_up();
	deliver(4);
	world_down();
	for (long i = 0; i < iters; i++) {
		size_t n = 0;

		for (int k = 1 + (int)(next() % 4); k > 0; k--) {
			int from = (int)(next() & 1), type = 1 + (int)(next() % 6);
			size_t len = seen_len[from][type];
			uint8_t *s = in + n + 3;

			memcpy(s, seen[from][type], len);
			for (int m = seed_dir ? 0 : (int)(next() % 4); m > 0; m--) {
				switch (len ? next() % 3 : 2) {
				case 0: s[next() % len] ^= (uint8_t)(1u << (next() % 8)); break;
				case 1: s[next() % 44 % len] = (uint8_t)next(); break;
				default: len = (size_t)(next() % (len + 16));
				}
			}
			in[n] = (uint8_t)(1 - from);
			in[n + 1] = (uint8_t)len;
			in[n + 2] = (uint8_t)(len >> 8);
			n += 3 + len;
		}
		if (seed_dir)
			fuzz_seed(in, n);
		LLVMFuzzerTestOneInput(in, n);
	}
	printf("fuzz_dpdk_rel: %ld inputs, no crash, every segment counted once\n", iters);
}
#endif

