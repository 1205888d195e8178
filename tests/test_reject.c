/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Bad input on a real TCP connection. A real context (rank 1 of 2, butterfly)
 * averages while a hand-driven peer (rank 0) built on the tcp driver sends it
 * crafted frames. Each malformed, foreign or unexpected frame must be
 * rejected and counted, must drop the peer without hanging the round, and
 * must leave the user's buffer untouched. A well-formed exchange through the
 * same harness proves the harness can pass.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <moshpit/driver.h>
#include <moshpit/moshpit.h>

#include "wire.h"

extern const struct mp_driver_ops mp_tcp_driver_ops;

#define N 64    /* floats: part 0 = [0,32) reduced by the fake, part 1 = [32,64) by the context */
#define HALF 32

struct fake {
	const struct mp_driver_ops *ops;
	struct mp_drv *drv;
	struct mp_drv_conn *conn;
};

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void fake_send(struct fake *f, const void *buf, size_t len)
{
	struct mp_iov iov = {buf, len};
	struct mp_drv_req *req;
	int done = 0;

	assert_int_equal(f->ops->isend(f->conn, &iov, 1, NULL, &req), 0);
	for (int i = 0; i < 5000 && !done; i++) {
		f->ops->test(req, &done, NULL);
		if (!done)
			f->ops->progress(f->drv, 1);
	}
	assert_true(done);
}

static struct mp_wire_hdr base_hdr(uint64_t run_id, uint8_t type)
{
	struct mp_wire_hdr h = {
		.type = type,
		.codec = MP_CODEC_NONE,
		.run_id = run_id,
		.round = 0,
		.group_id = 0, /* butterfly group of round 0 */
		.sender = 0,
		.weight = 1.0f,
	};
	return h;
}

static size_t frame(const struct mp_wire_hdr *h, const float *vals, uint8_t *out)
{
	memcpy(out + MP_WIRE_HDR_SIZE, vals, h->length);
	mp_wire_encode(h, out, out + MP_WIRE_HDR_SIZE);
	return MP_WIRE_HDR_SIZE + h->length;
}

enum mutation {
	M_NONE,
	M_MAGIC,
	M_VERSION,
	M_BITFLIP,
	M_FOREIGN_RUN,
	M_ROUND,
	M_GROUP,
	M_SENDER,
	M_OFFSET,
	M_COUNT,
	M_TYPE,
	M_CODEC,
	M_LENGTH,
	M_WEIGHT,
	M_OVERSIZE,
	M_GARBAGE,
	M_TRUNCATED,
	M_FOREIGN_HELLO,
	M_HELLO_CODEC,
	M_HELLO_AUTO,
};

struct outcome {
	int rc;
	struct mp_result res;
	float buf[N];
	float orig[N];
	float fake_vals[N];
	double seconds;
};

static void exchange(enum mutation m, struct outcome *o)
{
	struct mp_config cfg;
	mp_ctx *ctx;
	mp_request *req;
	char addr[MP_ADDR_STRLEN];
	struct fake f = {.ops = &mp_tcp_driver_ops};
	struct mp_drv_params dp = {.size = sizeof(dp), .run_name = "fake", .rank = 0,
				   .connect_timeout_ms = 2000};
	uint8_t blob[MP_DRV_ADDR_MAX], *fr = calloc(1, 1 << 20);
	size_t blen = sizeof(blob), len;
	uint64_t run_id = mp_wire_run_id("reject-test");

	mp_config_init(&cfg);
	cfg.transport = "tcp";
	cfg.run_name = "reject-test";
	cfg.rank = 1;
	cfg.npeers = 2;
	cfg.algo = MP_ALGO_BUTTERFLY;
	cfg.listen = "127.0.0.1:0";
	cfg.connect_timeout_ms = 1000;
	cfg.round_timeout_ms = 1000;
	assert_int_equal(mp_init(&cfg, &ctx), 0);
	assert_int_equal(mp_local_address(ctx, addr, sizeof(addr)), 0);
	const char *addrs[] = {"127.0.0.1:1", addr};
	assert_int_equal(mp_set_peers(ctx, addrs, 2), 0);
	for (int i = 0; i < N; i++) {
		o->orig[i] = o->buf[i] = (float)(i + 1);
		o->fake_vals[i] = (float)(-3 * i);
	}
	double t0 = now_s();
	assert_int_equal(mp_average_start(ctx, o->buf, N, 1.0f, NULL, &req), 0);

	/* The fake dials (rank 0 < 1) and introduces itself. */
	assert_int_equal(f.ops->init(&dp, &f.drv), 0);
	assert_int_equal(f.ops->addr_parse(f.drv, addr, blob, &blen), 0);
	assert_int_equal(f.ops->connect(f.drv, blob, blen, &f.conn), 0);
	struct mp_wire_hdr h = base_hdr(m == M_FOREIGN_HELLO ? mp_wire_run_id("other-run") : run_id,
					MP_MSG_HELLO);
	h.count = 2;
	h.weight = 0.0f;
	if (m == M_HELLO_CODEC) {
		h.codec = MP_CODEC_FP16; /* the context runs codec none */
		h.part = MP_CODEC_FP16;
	}
	if (m == M_HELLO_AUTO)
		h.part = MP_CODEC_AUTO; /* frames start as none, but the policy differs */
	mp_wire_encode(&h, fr, NULL);
	fake_send(&f, fr, MP_WIRE_HDR_SIZE);

	/* Its contribution to part 1, maybe spoiled. */
	h = base_hdr(run_id, MP_MSG_SCATTER);
	h.part = 1;
	h.offset = HALF;
	h.count = HALF;
	h.length = HALF * sizeof(float);
	switch (m) {
	case M_FOREIGN_RUN: h.run_id ^= 1; break;
	case M_ROUND: h.round = 7; break;
	case M_GROUP: h.group_id = 12345; break;
	case M_SENDER: h.sender = 1; break;
	case M_OFFSET: h.offset = HALF + 1; break;
	case M_COUNT: h.count = HALF - 1; h.length = (HALF - 1) * sizeof(float); break;
	case M_TYPE: h.type = 9; break;
	case M_CODEC: h.codec = 200; break;
	case M_WEIGHT: h.weight = -1.0f; break;
	default: break;
	}
	len = frame(&h, o->fake_vals + HALF, fr);
	switch (m) {
	case M_MAGIC: fr[0] ^= 0xff; break;
	case M_VERSION: fr[4] = 99; break;
	case M_BITFLIP: fr[33] ^= 0x10; break;
	case M_LENGTH: len -= 8; break; /* header promises 8 more bytes than sent */
	case M_OVERSIZE: len = 1 << 20; break;
	case M_GARBAGE:
		for (size_t i = 0; i < 200; i++)
			fr[i] = (uint8_t)(i * 37 + 11);
		len = 200;
		break;
	case M_TRUNCATED: len = 40; break;
	default: break;
	}
	if (m != M_FOREIGN_HELLO && m != M_HELLO_CODEC && m != M_HELLO_AUTO)
		fake_send(&f, fr, len);
	if (m == M_NONE) {
		/* The fake reduces part 0: it returns values of its choosing. */
		h = base_hdr(run_id, MP_MSG_GATHER);
		h.part = 0;
		h.count = HALF;
		h.length = HALF * sizeof(float);
		h.weight = 2.0f;
		h.aux = 2;
		len = frame(&h, o->fake_vals, fr);
		fake_send(&f, fr, len);
	}
	o->rc = mp_wait(req, 20000, &o->res);
	o->seconds = now_s() - t0;
	f.ops->close(f.conn);
	f.ops->fini(f.drv);
	mp_finalize(ctx);
	free(fr);
}

static void well_formed_exchange_completes(void **s)
{
	struct outcome o;

	(void)s;
	exchange(M_NONE, &o);
	assert_int_equal(o.rc, 0);
	assert_int_equal(o.res.frames_rejected, 0);
	assert_int_equal(o.res.failed_peers, 0);
	assert_int_equal(o.res.peers, 2);
	for (int i = 0; i < HALF; i++)
		assert_true(o.buf[i] == o.fake_vals[i]);
	for (int i = HALF; i < N; i++)
		assert_true(o.buf[i] == (o.orig[i] + o.fake_vals[i]) / 2);
}

static void check_rejected(enum mutation m, const char *what)
{
	struct outcome o;

	exchange(m, &o);
	if (o.rc != -EHOSTUNREACH)
		fail_msg("%s: rc %d (%s), expected -EHOSTUNREACH", what, o.rc, mp_strerror(o.rc));
	if (o.res.frames_rejected != 1)
		fail_msg("%s: %llu frames rejected, expected 1", what,
			 (unsigned long long)o.res.frames_rejected);
	assert_int_equal(o.res.failed_peers, 1);
	assert_true(o.seconds < 5.0);
	for (int i = 0; i < N; i++)
		if (o.buf[i] != o.orig[i])
			fail_msg("%s: buffer changed at %d", what, i);
}

#define REJECT_TEST(fn, m)                    \
	static void fn(void **s)              \
	{                                     \
		(void)s;                      \
		check_rejected(m, #m);        \
	}
REJECT_TEST(bad_magic, M_MAGIC)
REJECT_TEST(wrong_version, M_VERSION)
REJECT_TEST(corrupted_header, M_BITFLIP)
REJECT_TEST(foreign_run_frame, M_FOREIGN_RUN)
REJECT_TEST(wrong_round, M_ROUND)
REJECT_TEST(wrong_group, M_GROUP)
REJECT_TEST(wrong_sender, M_SENDER)
REJECT_TEST(wrong_offset, M_OFFSET)
REJECT_TEST(wrong_count, M_COUNT)
REJECT_TEST(unknown_type, M_TYPE)
REJECT_TEST(unknown_codec, M_CODEC)
REJECT_TEST(length_mismatch, M_LENGTH)
REJECT_TEST(negative_weight, M_WEIGHT)
REJECT_TEST(oversized_message, M_OVERSIZE)
REJECT_TEST(garbage_bytes, M_GARBAGE)
REJECT_TEST(truncated_frame, M_TRUNCATED)
REJECT_TEST(foreign_run_hello, M_FOREIGN_HELLO)
REJECT_TEST(other_codec_hello, M_HELLO_CODEC)
REJECT_TEST(other_codec_policy_hello, M_HELLO_AUTO)

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(well_formed_exchange_completes),
		cmocka_unit_test(bad_magic),
		cmocka_unit_test(wrong_version),
		cmocka_unit_test(corrupted_header),
		cmocka_unit_test(foreign_run_frame),
		cmocka_unit_test(wrong_round),
		cmocka_unit_test(wrong_group),
		cmocka_unit_test(wrong_sender),
		cmocka_unit_test(wrong_offset),
		cmocka_unit_test(wrong_count),
		cmocka_unit_test(unknown_type),
		cmocka_unit_test(unknown_codec),
		cmocka_unit_test(length_mismatch),
		cmocka_unit_test(negative_weight),
		cmocka_unit_test(oversized_message),
		cmocka_unit_test(garbage_bytes),
		cmocka_unit_test(truncated_frame),
		cmocka_unit_test(foreign_run_hello),
		cmocka_unit_test(other_codec_hello),
		cmocka_unit_test(other_codec_policy_hello),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
