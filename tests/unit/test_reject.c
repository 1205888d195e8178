/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Bad input on a real TCP connection. A real context (rank 1 of 2, butterfly)
 * averages while a hand-driven peer (rank 0) built on the tcp driver dials it,
 * goes through the handshake (HELLO, CHALLENGE, AUTH) and sends it crafted
 * frames. Each malformed, foreign or unexpected frame must be rejected and
 * counted, must drop the peer without hanging the round, and must leave the
 * user's buffer untouched. A frame with a wrong session token is dropped and
 * counted, but the exchange goes on. A dialer with another run key is
 * refused before anything is adopted; so, by a real dialer (rank 0), is an
 * acceptor with another key. A well-formed exchange through the same harness,
 * in both directions, proves the harness can pass.
 *
 * The fake computes the handshake's MACs and token on its own, from
 * doc/protocol.md, so the test also pins down the wire format of version 3:
 * the settings each side carries in HELLO and CHALLENGE (a dialer whose
 * codec differs is refused with -EBADE, naming the codec), and the OPEN that
 * starts every channel of an exchange.
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

#include "auth.h"
#include "conn.h"
#include "settings.h"
#include "core.h"
#include "xfer.h"
#include "wire.h"

extern const struct mp_driver_ops mp_tcp_driver_ops;

#define N 64    /* floats: part 0 = [0,32) reduced by rank 0, part 1 = [32,64) by rank 1 */
#define HALF 32
#define RUN "reject-test"
#define KEY "the run's secret"
#define HS_BUF 512

struct fake {
	const struct mp_driver_ops *ops;
	struct mp_drv *drv;
	struct mp_drv_conn *conn;
	struct mp_auth auth; /* the key the fake holds */
	uint32_t token;      /* session token, once the handshake is through */
};

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void fake_init(struct fake *f, int rank, const char *key)
{
	struct mp_drv_params dp = {.size = sizeof(dp), .run_name = "fake", .rank = rank,
				   .connect_timeout_ms = 2000};

	memset(f, 0, sizeof(*f));
	f->ops = &mp_tcp_driver_ops;
	assert_int_equal(f->ops->init(&dp, &f->drv), 0);
	assert_int_equal(mp_auth_init(&f->auth, RUN, key, NULL), 0);
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

/* Receive one message (up to 5 s). Returns the request's status; *len its size. */
static int fake_recv(struct fake *f, void *buf, size_t cap, size_t *len)
{
	struct mp_drv_req *req;
	double t0 = now_s();
	int done = 0, rc = 0;

	assert_int_equal(f->ops->irecv(f->conn, buf, cap, NULL, &req), 0);
	while (!done && now_s() - t0 < 5.0) {
		rc = f->ops->test(req, &done, len);
		if (!done)
			f->ops->progress(f->drv, 1);
	}
	if (!done) {
		/* Closing cancels the receive; release it before giving up. */
		f->ops->close(f->conn);
		f->conn = NULL;
		for (int i = 0; i < 1000 && !done; i++) {
			f->ops->test(req, &done, NULL);
			f->ops->progress(f->drv, 0);
		}
		fail_msg("no message within 5 s");
	}
	return rc;
}

static void le(uint8_t *b, uint64_t v, int n)
{
	for (int i = 0; i < n; i++)
		b[i] = (uint8_t)(v >> (8 * i));
}

/* MAC_challenge over (nonce_d, dialer id, acceptor id, index, run id,
 * the acceptor's settings). */
static void mac_challenge(const struct mp_auth *a, const uint8_t *nd, uint64_t dialer,
			  uint64_t acceptor, uint32_t idx, const uint8_t *set, size_t slen,
			  uint8_t out[MP_MAC_BYTES])
{
	uint8_t d[8], ac[8], ix[4], run[8];
	struct mp_auth_piece pc[6] = {{nd, MP_NONCE_BYTES}, {d, 8}, {ac, 8}, {ix, 4}, {run, 8},
				      {set, slen}};

	le(d, dialer, 8);
	le(ac, acceptor, 8);
	le(ix, idx, 4);
	le(run, mp_wire_run_id(RUN), 8);
	mp_auth_mac(a, MP_AUTH_CHALLENGE, pc, 6, out);
}

/* MAC_response over (nonce_a, nonce_d, dialer id, acceptor id, index, the
 * dialer's settings). */
static void mac_response(const struct mp_auth *a, const uint8_t *na, const uint8_t *nd,
			 uint64_t dialer, uint64_t acceptor, uint32_t idx, const uint8_t *set,
			 size_t slen, uint8_t out[MP_MAC_BYTES])
{
	uint8_t d[8], ac[8], ix[4];
	struct mp_auth_piece pc[6] = {{na, MP_NONCE_BYTES}, {nd, MP_NONCE_BYTES}, {d, 8}, {ac, 8},
				      {ix, 4}, {set, slen}};

	le(d, dialer, 8);
	le(ac, acceptor, 8);
	le(ix, idx, 4);
	mp_auth_mac(a, MP_AUTH_RESPONSE, pc, 6, out);
}

/* The plan hash of the butterfly of round 0: ranks 0 and 1, halves. */
static uint32_t plan0(void)
{
	const uint64_t ids[2] = {0, 1}, lens[2] = {HALF, HALF};
	const uint8_t modes[2] = {MP_MODE_NORMAL, MP_MODE_NORMAL};

	return mp_plan_hash(0, 2, ids, modes, lens);
}

/* The OPEN that starts each channel: the length of the whole vector, and
 * the plan. */
static size_t open_frame(uint64_t run_id, uint64_t sender, uint32_t token, uint8_t *out)
{
	struct mp_wire_hdr h = {.type = MP_MSG_OPEN, .codec = MP_CODEC_NONE, .run_id = run_id,
				.sender = (uint32_t)sender, .offset = N, .aux = plan0(),
				.token = token};

	mp_wire_encode(&h, out, NULL);
	return MP_WIRE_HDR_SIZE;
}

static uint32_t token_of(const struct mp_auth *a, const uint8_t *nd, const uint8_t *na)
{
	struct mp_auth_piece pc[2] = {{nd, MP_NONCE_BYTES}, {na, MP_NONCE_BYTES}};
	uint8_t mac[MP_MAC_BYTES];
	uint32_t t;

	mp_auth_mac(a, MP_AUTH_TOKEN, pc, 2, mac);
	t = (uint32_t)mac[0] | (uint32_t)mac[1] << 8 | (uint32_t)mac[2] << 16 |
	    (uint32_t)mac[3] << 24;
	return t ? t : 1;
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
	if (type == MP_MSG_SCATTER)
		h.aux = plan0();
	return h;
}

/* A handshake frame from @id: header @h (type, codec fields set) and @plen payload bytes. */
static size_t hs_frame(struct mp_wire_hdr *h, uint64_t id, const void *pl, uint32_t plen,
		       uint8_t *out)
{
	h->weight = 0.0f;
	h->sender = (uint32_t)id;
	h->offset = id;
	h->length = plen;
	memcpy(out + MP_WIRE_HDR_SIZE, pl, plen);
	mp_wire_encode(h, out, out + MP_WIRE_HDR_SIZE);
	return MP_WIRE_HDR_SIZE + plen;
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
	M_WRONG_KEY,  /* the fake dials with another run key */
	M_TOKEN,      /* a frame with a wrong token precedes the good ones */
};

struct outcome {
	int rc;
	struct mp_result res;
	uint64_t rejected[MP_REJ_MAX];
	int adopted;  /* the context holds a ready connection to the fake */
	char err[256];
	float buf[N];
	float orig[N];
	float fake_vals[N];
	double seconds;
};

/* What the context knows once its operation is over (its thread is idle). */
static void observe(mp_ctx *ctx, int fake_rank, struct outcome *o)
{
	memcpy(o->rejected, ctx->rejected, sizeof(o->rejected));
	o->adopted = 0;
	snprintf(o->err, sizeof(o->err), "%s", mp_last_error(ctx));
	for (int i = 0; i < ctx->nconn; i++)
		o->adopted |= mp_conn_ready(ctx, fake_rank, i) != NULL;
}

static mp_ctx *start_ctx(int rank, const char *fake_addr, struct outcome *o, mp_request **req)
{
	struct mp_config cfg;
	char addr[MP_ADDR_STRLEN];
	mp_ctx *ctx;

	mp_config_init(&cfg);
	cfg.transport = "tcp";
	cfg.run_name = RUN;
	cfg.run_key = KEY;
	cfg.rank = rank;
	cfg.npeers = 2;
	cfg.algo = MP_ALGO_BUTTERFLY;
	/* The butterfly's frames (SCATTER, GATHER), not the direct exchange's. */
	cfg.direct_max = 0;
	cfg.listen = "127.0.0.1:0";
	cfg.connect_timeout_ms = 1000;
	cfg.round_timeout_ms = 1000;
	assert_int_equal(mp_init(&cfg, &ctx), 0);
	assert_int_equal(mp_local_address(ctx, addr, sizeof(addr)), 0);
	const char *addrs[2] = {rank ? fake_addr : addr, rank ? addr : fake_addr};
	assert_int_equal(mp_set_peers(ctx, addrs, 2), 0);
	for (int i = 0; i < N; i++) {
		o->orig[i] = o->buf[i] = (float)(i + 1);
		o->fake_vals[i] = (float)(-3 * i);
	}
	assert_int_equal(mp_average_start(ctx, o->buf, N, 1.0f, NULL, req), 0);
	return ctx;
}

/* The fake (rank 0) dials the context and runs the handshake; HELLO
 * mutations stop after the HELLO. */
static void fake_dial(struct fake *f, const char *addr, enum mutation m, uint64_t run_id,
		      const struct mp_settings *ours)
{
	uint8_t blob[MP_DRV_ADDR_MAX], pl[HS_BUF], nd[MP_NONCE_BYTES], out[HS_BUF], in[HS_BUF];
	size_t blen = sizeof(blob), len = 0, slen;
	struct mp_settings st = *ours;
	struct mp_wire_hdr h;
	enum mp_wire_reject why;

	assert_int_equal(f->ops->addr_parse(f->drv, addr, blob, &blen), 0);
	assert_int_equal(f->ops->connect(f->drv, blob, blen, &f->conn), 0);

	/* HELLO: nonce, mode normal, bandwidth unknown (-1), the settings (a
	 * rank 0 of the same run has the context's), no address. */
	mp_auth_random(nd, sizeof(nd));
	memcpy(pl, nd, MP_NONCE_BYTES);
	pl[16] = MP_MODE_NORMAL;
	le(pl + 17, 0xbff0000000000000ull, 8);
	h = base_hdr(m == M_FOREIGN_HELLO ? mp_wire_run_id("other-run") : run_id, MP_MSG_HELLO);
	h.count = 2;
	if (m == M_HELLO_CODEC) {
		h.codec = MP_CODEC_FP16; /* the context runs codec none */
		h.part = MP_CODEC_FP16;
		st.codec = MP_CODEC_FP16;
	}
	if (m == M_HELLO_AUTO) {
		h.part = MP_CODEC_AUTO; /* frames start as none, but the policy differs */
		st.codec = MP_CODEC_AUTO;
	}
	slen = mp_settings_encode(&st, pl + 27);
	le(pl + 25, slen, 2);
	pl[27 + slen] = 0;
	fake_send(f, out, hs_frame(&h, 0, pl, (uint32_t)(27 + slen + 1), out));
	if (m == M_FOREIGN_HELLO)
		return;

	/* CHALLENGE from rank 1: its nonce, MAC over ours, its settings. */
	assert_int_equal(fake_recv(f, in, sizeof(in), &len), 0);
	assert_int_equal(mp_wire_decode(in, len, run_id, mp_codec_count(), &h, &why), 0);
	assert_int_equal(h.type, MP_MSG_CHALLENGE);
	const uint8_t *na = in + MP_WIRE_HDR_SIZE;
	size_t alen = (size_t)na[48] | (size_t)na[49] << 8;
	assert_int_equal(h.length, MP_NONCE_BYTES + MP_MAC_BYTES + 2 + alen);
	assert_true(h.offset == 1 && h.sender == 1 && h.aux == 0 && h.token == 0);
	uint8_t mac[MP_MAC_BYTES];
	mac_challenge(&f->auth, nd, 0, 1, 0, na + 50, alen, mac);
	/* Only a holder of the same key makes this MAC. */
	if (m == M_WRONG_KEY)
		assert_memory_not_equal(mac, na + MP_NONCE_BYTES, MP_MAC_BYTES);
	else
		assert_memory_equal(mac, na + MP_NONCE_BYTES, MP_MAC_BYTES);

	/* AUTH: our MAC over both nonces and our settings (a wrong one with
	 * the wrong key). */
	mac_response(&f->auth, na, nd, 0, 1, 0, pl + 27, slen, mac);
	h = base_hdr(run_id, MP_MSG_AUTH);
	fake_send(f, out, hs_frame(&h, 0, mac, MP_MAC_BYTES, out));
	f->token = token_of(&f->auth, nd, na);
}

static void exchange(enum mutation m, struct outcome *o)
{
	struct fake f;
	mp_ctx *ctx;
	mp_request *req;
	char addr[MP_ADDR_STRLEN];
	uint8_t *fr = calloc(1, 1 << 20);
	size_t len;
	uint64_t run_id = mp_wire_run_id(RUN);

	fake_init(&f, 0, m == M_WRONG_KEY ? "not the run's secret" : KEY);
	ctx = start_ctx(1, "127.0.0.1:1", o, &req);
	assert_int_equal(mp_local_address(ctx, addr, sizeof(addr)), 0);
	double t0 = now_s();

	/* The fake dials (rank 0 < 1) and introduces itself. */
	fake_dial(&f, addr, m, run_id, &ctx->settings);
	if (m != M_FOREIGN_HELLO && m != M_HELLO_CODEC && m != M_HELLO_AUTO && m != M_WRONG_KEY)
		fake_send(&f, fr, open_frame(run_id, 0, f.token, fr));

	if (m == M_TOKEN) {
		/* Values that must never arrive, under another session's token. */
		float poison[HALF];
		struct mp_wire_hdr h = base_hdr(run_id, MP_MSG_SCATTER);
		for (int i = 0; i < HALF; i++)
			poison[i] = 1e6f;
		h.part = 1;
		h.offset = HALF;
		h.count = HALF;
		h.length = HALF * sizeof(float);
		h.token = f.token ^ 0x5a5a5a5au;
		fake_send(&f, fr, frame(&h, poison, fr));
	}

	/* Its contribution to part 1, maybe spoiled. */
	struct mp_wire_hdr h = base_hdr(run_id, MP_MSG_SCATTER);
	h.part = 1;
	h.offset = HALF;
	h.count = HALF;
	h.length = HALF * sizeof(float);
	h.token = f.token;
	switch (m) {
	case M_FOREIGN_RUN: h.run_id ^= 1; break;
	case M_ROUND: h.round = 7; break;
	case M_GROUP: h.group_id = 12345; break;
	case M_SENDER: h.sender = 1; break;
	case M_OFFSET: h.offset = HALF + 1; break;
	case M_COUNT: h.count = HALF - 1; h.length = (HALF - 1) * sizeof(float); break;
	case M_TYPE: h.type = 99; break;
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
	if (m != M_FOREIGN_HELLO && m != M_HELLO_CODEC && m != M_HELLO_AUTO && m != M_WRONG_KEY)
		fake_send(&f, fr, len);
	if (m == M_NONE || m == M_TOKEN) {
		/* The fake reduces part 0: it returns values of its choosing. */
		h = base_hdr(run_id, MP_MSG_GATHER);
		h.part = 0;
		h.count = HALF;
		h.length = HALF * sizeof(float);
		h.weight = 2.0f;
		h.aux = 2;
		h.token = f.token;
		len = frame(&h, o->fake_vals, fr);
		fake_send(&f, fr, len);
	}
	o->rc = mp_wait(req, 20000, &o->res);
	o->seconds = now_s() - t0;
	observe(ctx, 0, o);
	if (f.conn)
		f.ops->close(f.conn);
	f.ops->fini(f.drv);
	mp_finalize(ctx);
	free(fr);
}

static void check_average(const struct outcome *o)
{
	for (int i = 0; i < HALF; i++)
		assert_true(o->buf[i] == o->fake_vals[i]);
	for (int i = HALF; i < N; i++)
		assert_true(o->buf[i] == (o->orig[i] + o->fake_vals[i]) / 2);
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
	assert_true(o.adopted);
	check_average(&o);
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

/* A dialer whose codec differs completes the handshake (its settings are
 * its own word then), and is refused: -EBADE, the field and both values in
 * mp_last_error, counted as settings, the buffer as it was. */
static void check_settings_refused(enum mutation m, const char *differ)
{
	struct outcome o;

	exchange(m, &o);
	if (o.rc != -EBADE)
		fail_msg("rc %d (%s), expected -EBADE", o.rc, mp_strerror(o.rc));
	assert_int_equal(o.rejected[MP_REJ_SETTINGS], 1);
	assert_int_equal(o.res.failed_peers, 1);
	assert_false(o.adopted);
	assert_true(o.seconds < 5.0);
	if (!strstr(o.err, differ))
		fail_msg("mp_last_error \"%s\" does not say \"%s\"", o.err, differ);
	for (int i = 0; i < N; i++)
		assert_true(o.buf[i] == o.orig[i]);
}

static void other_codec_hello(void **s)
{
	(void)s;
	check_settings_refused(M_HELLO_CODEC, "codec differs: ours none, theirs fp16");
}

static void other_codec_policy_hello(void **s)
{
	(void)s;
	check_settings_refused(M_HELLO_AUTO, "codec differs: ours none, theirs auto");
}

/* A dialer with another run key: its AUTH fails, it is never adopted. */
static void dialer_with_wrong_key_refused(void **s)
{
	struct outcome o;

	(void)s;
	exchange(M_WRONG_KEY, &o);
	assert_int_equal(o.rc, -EHOSTUNREACH);
	assert_int_equal(o.rejected[MP_REJ_AUTH], 1);
	assert_int_equal(o.res.frames_rejected, 1);
	assert_int_equal(o.res.failed_peers, 1);
	assert_false(o.adopted);
	assert_true(o.seconds < 5.0);
	for (int i = 0; i < N; i++)
		assert_true(o.buf[i] == o.orig[i]);
}

/* A frame under a wrong token is dropped and counted; the peer's good frames
 * still complete the average, unchanged by it. */
static void wrong_token_dropped(void **s)
{
	struct outcome o;

	(void)s;
	exchange(M_TOKEN, &o);
	assert_int_equal(o.rc, 0);
	assert_int_equal(o.res.frames_rejected, 1);
	assert_int_equal(o.rejected[MP_REJ_TOKEN], 1);
	assert_int_equal(o.res.failed_peers, 0);
	assert_int_equal(o.res.peers, 2);
	check_average(&o);
}

/*
 * The context (rank 0) dials a fake acceptor (rank 1). With the run key the
 * fake answers the HELLO, checks the context's AUTH and the token of its
 * frames, and completes the average; with another key, the context must
 * refuse the CHALLENGE, send no AUTH and count it.
 */
static void dialled(int right_key, struct outcome *o)
{
	struct fake f;
	struct mp_drv_listener *lis;
	mp_ctx *ctx;
	mp_request *req;
	char faddr[MP_ADDR_STRLEN], caddr[MP_ADDR_STRLEN];
	uint8_t blob[MP_DRV_ADDR_MAX], in[HS_BUF], out[HS_BUF], pl[HS_BUF], na[MP_NONCE_BYTES];
	uint8_t mac[MP_MAC_BYTES];
	size_t blen = sizeof(blob), len = 0;
	uint64_t run_id = mp_wire_run_id(RUN);
	struct mp_wire_hdr h;
	enum mp_wire_reject why;
	double t0;
	int rc = -EAGAIN;

	fake_init(&f, 1, right_key ? KEY : "not the run's secret");
	assert_int_equal(f.ops->listen(f.drv, "127.0.0.1:0", blob, &blen, &lis), 0);
	assert_int_equal(f.ops->addr_format(f.drv, blob, blen, faddr, sizeof(faddr)), 0);
	ctx = start_ctx(0, faddr, o, &req);
	assert_int_equal(mp_local_address(ctx, caddr, sizeof(caddr)), 0);
	t0 = now_s();
	for (;;) {
		rc = -EAGAIN;
		while (rc && now_s() - t0 < 5.0) {
			rc = f.ops->accept(lis, &f.conn);
			if (rc)
				f.ops->progress(f.drv, 1);
		}
		assert_int_equal(rc, 0);
		assert_int_equal(fake_recv(&f, in, sizeof(in), &len), 0);
		assert_int_equal(mp_wire_decode(in, len, run_id, mp_codec_count(), &h, &why), 0);
		/* A fresh context first asks its peers where the run is, on the
		 * probe index (streams + 1 = 2): not answered here, which it
		 * takes as "not up yet". */
		if (h.aux != 2)
			break;
		f.ops->close(f.conn);
		f.conn = NULL;
	}

	/* The context's HELLO, as doc/protocol.md lays it out. */
	assert_int_equal(h.type, MP_MSG_HELLO);
	assert_true(h.sender == 0 && h.offset == 0 && h.count == 2 && h.aux == 0 && h.token == 0);
	const uint8_t *nd = in + MP_WIRE_HDR_SIZE;
	size_t dlen = (size_t)nd[25] | (size_t)nd[26] << 8;
	assert_int_equal(h.length, MP_NONCE_BYTES + 1 + 8 + 2 + dlen + strlen(caddr) + 1);
	assert_int_equal(nd[16], MP_MODE_NORMAL);
	uint64_t bw = 0;
	for (int i = 7; i >= 0; i--)
		bw = bw << 8 | nd[17 + i];
	assert_true(bw == 0xbff0000000000000ull); /* -1.0: bandwidth not given */
	struct mp_settings got;
	assert_int_equal(mp_settings_decode(nd + 27, dlen, &got), 0);
	assert_int_equal(got.npeers, 2);
	assert_int_equal(got.algo, MP_ALGO_BUTTERFLY);
	assert_string_equal((const char *)nd + 27 + dlen, caddr);

	/* CHALLENGE under the fake's key, with the same settings. */
	for (int i = 0; i < MP_NONCE_BYTES; i++)
		na[i] = (uint8_t)(i * 13 + 5);
	memcpy(pl, na, MP_NONCE_BYTES);
	size_t alen = mp_settings_encode(&ctx->settings, pl + 50);
	mac_challenge(&f.auth, nd, 0, 1, 0, pl + 50, alen, pl + MP_NONCE_BYTES);
	pl[48] = (uint8_t)alen;
	pl[49] = (uint8_t)(alen >> 8);
	h = base_hdr(run_id, MP_MSG_CHALLENGE);
	fake_send(&f, out, hs_frame(&h, 1, pl, (uint32_t)(50 + alen), out));

	rc = fake_recv(&f, in + 256, 256, &len);
	if (!right_key) {
		/* Refused: the dialer hangs up instead of answering. */
		assert_int_not_equal(rc, 0);
	} else {
		assert_int_equal(rc, 0);
		assert_int_equal(mp_wire_decode(in + 256, len, run_id, mp_codec_count(), &h, &why), 0);
		assert_int_equal(h.type, MP_MSG_AUTH);
		assert_true(h.offset == 0 && h.aux == 0 && h.token == 0 && h.length == MP_MAC_BYTES);
		mac_response(&f.auth, na, nd, 0, 1, 0, nd + 27, dlen, mac);
		assert_memory_equal(mac, in + 256 + MP_WIRE_HDR_SIZE, MP_MAC_BYTES);
		f.token = token_of(&f.auth, nd, na);

		/* Rank 1 reduces part 1: the context's OPEN, then its SCATTER,
		 * carry the token. */
		uint8_t *fr = calloc(1, 4096);
		assert_int_equal(fake_recv(&f, fr, 4096, &len), 0);
		assert_int_equal(mp_wire_decode(fr, len, run_id, mp_codec_count(), &h, &why), 0);
		assert_true(h.type == MP_MSG_OPEN && h.offset == N && h.count == 0 && h.length == 0 &&
			    h.aux == plan0() && h.token == f.token);
		fake_send(&f, fr, open_frame(run_id, 1, f.token, fr));
		assert_int_equal(fake_recv(&f, fr, 4096, &len), 0);
		assert_int_equal(mp_wire_decode(fr, len, run_id, mp_codec_count(), &h, &why), 0);
		assert_true(h.type == MP_MSG_SCATTER && h.token == f.token && h.sender == 0);
		/* Its contribution to part 0, then part 1's result. */
		h = base_hdr(run_id, MP_MSG_SCATTER);
		h.sender = 1;
		h.count = HALF;
		h.length = HALF * sizeof(float);
		h.token = f.token;
		fake_send(&f, fr, frame(&h, o->fake_vals, fr));
		h = base_hdr(run_id, MP_MSG_GATHER);
		h.sender = 1;
		h.part = 1;
		h.offset = HALF;
		h.count = HALF;
		h.length = HALF * sizeof(float);
		h.weight = 2.0f;
		h.aux = 2;
		h.token = f.token;
		fake_send(&f, fr, frame(&h, o->fake_vals + HALF, fr));
		free(fr);
	}
	o->rc = mp_wait(req, 20000, &o->res);
	o->seconds = now_s() - t0;
	observe(ctx, 1, o);
	if (f.conn)
		f.ops->close(f.conn);
	f.ops->close_listener(lis);
	f.ops->fini(f.drv);
	mp_finalize(ctx);
}

static void acceptor_with_key_answers(void **s)
{
	struct outcome o;

	(void)s;
	dialled(1, &o);
	assert_int_equal(o.rc, 0);
	assert_int_equal(o.res.frames_rejected, 0);
	assert_int_equal(o.res.failed_peers, 0);
	assert_true(o.adopted);
	/* Part 0 reduced here from both, part 1 as the fake returned it. */
	for (int i = 0; i < HALF; i++)
		assert_true(o.buf[i] == (o.orig[i] + o.fake_vals[i]) / 2);
	for (int i = HALF; i < N; i++)
		assert_true(o.buf[i] == o.fake_vals[i]);
}

static void acceptor_with_wrong_key_refused(void **s)
{
	struct outcome o;

	(void)s;
	dialled(0, &o);
	assert_int_equal(o.rc, -EHOSTUNREACH);
	/* One CHALLENGE answered: later dials wait for one in vain. */
	assert_int_equal(o.rejected[MP_REJ_AUTH], 1);
	assert_int_equal(o.res.frames_rejected, 1);
	assert_int_equal(o.res.failed_peers, 1);
	assert_false(o.adopted);
	assert_true(o.seconds < 5.0);
	for (int i = 0; i < N; i++)
		assert_true(o.buf[i] == o.orig[i]);
}

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
		cmocka_unit_test(dialer_with_wrong_key_refused),
		cmocka_unit_test(wrong_token_dropped),
		cmocka_unit_test(acceptor_with_key_answers),
		cmocka_unit_test(acceptor_with_wrong_key_refused),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
