/* SPDX-License-Identifier: BSD-3-Clause */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "settings.h"
#include "wire.h"

/* Table implementation, exported by crc32c.c for this comparison. */
extern uint32_t mp_crc32c_sw(uint32_t crc, const void *buf, size_t len);

#define NCODECS 2
#define RUN "test-run"

/* Deterministic xorshift so failures reproduce. */
static uint64_t rng_state = 0x9e3779b97f4a7c15ULL;

static uint64_t rng(void)
{
	rng_state ^= rng_state << 13;
	rng_state ^= rng_state >> 7;
	rng_state ^= rng_state << 17;
	return rng_state;
}

static void fill_random(unsigned char *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (unsigned char)rng();
}

static struct mp_wire_hdr sample_hdr(uint32_t length, uint8_t flags)
{
	struct mp_wire_hdr h;

	memset(&h, 0, sizeof(h));
	h.type = MP_MSG_SCATTER;
	h.codec = 1;
	h.flags = flags;
	h.run_id = mp_wire_run_id(RUN);
	h.round = 0x01020304u;
	h.group_id = 0xdeadbeefu;
	h.sender = 77;
	h.part = 3;
	h.offset = 0x0123456789abcdefULL;
	h.count = 1000;
	h.length = length;
	h.weight = 2.5f;
	h.aux = 0xa5a5a5a5u;
	h.token = 0x11223344u;
	return h;
}

static void put32(unsigned char *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (unsigned char)(v >> (8 * i));
}

static uint32_t get32(const unsigned char *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
	       (uint32_t)p[3] << 24;
}

/* Fix the header CRC after a deliberate edit, so that the intended check
 * (not the checksum) is what rejects the frame. */
static void reseal(unsigned char *buf, size_t len)
{
	uint32_t crc = mp_crc32c(0, buf, 60);

	if (buf[7] & MP_WIRE_F_PAYLOAD_CRC)
		crc = mp_crc32c(crc, buf + 64, len - 64);
	put32(buf + 60, crc);
}

static void expect_reject(const unsigned char *buf, size_t len, int err,
			  enum mp_wire_reject reason)
{
	struct mp_wire_hdr h;
	enum mp_wire_reject why = MP_REJ_NONE;

	assert_int_equal(mp_wire_decode(buf, len, mp_wire_run_id(RUN), NCODECS, &h, &why), err);
	assert_int_equal(why, reason);
}

static void test_crc_vectors(void **st)
{
	static const unsigned char zeros[32], ones[32] = {
		0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
		0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
		0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
	};
	unsigned char inc[32];

	(void)st;
	for (int i = 0; i < 32; i++)
		inc[i] = (unsigned char)i;
	/* check value from the CRC catalogue and RFC 3720 B.4 vectors */
	assert_int_equal(mp_crc32c(0, "123456789", 9), 0xe3069283u);
	assert_int_equal(mp_crc32c_sw(0, "123456789", 9), 0xe3069283u);
	assert_int_equal(mp_crc32c(0, zeros, 32), 0x8a9136aau);
	assert_int_equal(mp_crc32c(0, ones, 32), 0x62a8ab43u);
	assert_int_equal(mp_crc32c(0, inc, 32), 0x46dd794eu);
	assert_int_equal(mp_crc32c_sw(0, zeros, 32), 0x8a9136aau);
	assert_int_equal(mp_crc32c_sw(0, inc, 32), 0x46dd794eu);
	assert_int_equal(mp_crc32c(0, NULL, 0), 0);
	/* chaining */
	assert_int_equal(mp_crc32c(mp_crc32c(0, "1234", 4), "56789", 5), 0xe3069283u);
	assert_int_equal(mp_crc32c_sw(mp_crc32c_sw(0, "12345", 5), "6789", 4), 0xe3069283u);
}

/* Hardware (when present) and table paths agree for every length and
 * alignment, including the three-stream blocks and their seams. */
static void test_crc_hw_equals_sw(void **st)
{
	const size_t big = (1u << 20) + 64;
	unsigned char *buf = malloc(big + 16);

	(void)st;
	assert_non_null(buf);
	fill_random(buf, big + 16);
	for (size_t len = 0; len <= 4100; len++) {
		size_t off = len % 8;
		uint32_t seed = (uint32_t)rng();

		assert_int_equal(mp_crc32c(0, buf + off, len), mp_crc32c_sw(0, buf + off, len));
		assert_int_equal(mp_crc32c(seed, buf + off + 1, len),
				 mp_crc32c_sw(seed, buf + off + 1, len));
	}
	/* lengths around multiples of 3 * 4096 and 3 * 256, and large ones */
	static const size_t lens[] = { 767, 768, 769, 12287, 12288, 12289, 13057,
				       24576 + 7, 65536, 100003, (1u << 20) };
	for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++)
		for (size_t off = 0; off < 16; off += 3)
			assert_int_equal(mp_crc32c(0, buf + off, lens[i]),
					 mp_crc32c_sw(0, buf + off, lens[i]));
	/* chaining over an arbitrary split of a large buffer */
	for (int i = 0; i < 50; i++) {
		size_t cut = (size_t)(rng() % big);

		assert_int_equal(mp_crc32c(mp_crc32c(0, buf, cut), buf + cut, big - cut),
				 mp_crc32c_sw(0, buf, big));
	}
	free(buf);
}

static void test_run_id(void **st)
{
	(void)st;
	/* FNV-1a 64 reference values */
	assert_true(mp_wire_run_id("") == 0xcbf29ce484222325ULL);
	assert_true(mp_wire_run_id("a") == 0xaf63dc4c8601ec8cULL);
	assert_true(mp_wire_run_id("foobar") == 0x85944171f73967e8ULL);
	assert_true(mp_wire_run_id("run-a") != mp_wire_run_id("run-b"));
}

static void test_reject_names(void **st)
{
	(void)st;
	for (int r = 0; r < MP_REJ_MAX; r++) {
		assert_non_null(mp_wire_reject_name((enum mp_wire_reject)r));
		assert_string_not_equal(mp_wire_reject_name((enum mp_wire_reject)r), "unknown");
	}
	assert_string_equal(mp_wire_reject_name(MP_REJ_CHECKSUM), "checksum");
	assert_string_equal(mp_wire_reject_name(MP_REJ_WEIGHT), "weight");
	assert_string_equal(mp_wire_reject_name(MP_REJ_MAX), "unknown");
}

static void round_trip(uint8_t flags, uint32_t length)
{
	unsigned char *buf = malloc(64 + length + 1);
	struct mp_wire_hdr h = sample_hdr(length, flags), out;
	enum mp_wire_reject why = MP_REJ_MAX;

	assert_non_null(buf);
	fill_random(buf + 64, length);
	mp_wire_encode(&h, buf, buf + 64);
	assert_int_equal(get32(buf), MP_WIRE_MAGIC);
	assert_memory_equal(buf, "MSPH", 4);
	assert_int_equal(buf[4], MP_WIRE_VERSION);
	memset(&out, 0xee, sizeof(out));
	assert_int_equal(mp_wire_decode(buf, 64 + length, h.run_id, NCODECS, &out, &why), 0);
	assert_int_equal(why, MP_REJ_NONE);
	assert_int_equal(out.type, h.type);
	assert_int_equal(out.codec, h.codec);
	assert_int_equal(out.flags, h.flags);
	assert_true(out.run_id == h.run_id);
	assert_int_equal(out.round, h.round);
	assert_int_equal(out.group_id, h.group_id);
	assert_int_equal(out.sender, h.sender);
	assert_int_equal(out.part, h.part);
	assert_true(out.offset == h.offset);
	assert_int_equal(out.count, h.count);
	assert_int_equal(out.length, h.length);
	assert_true(out.weight == h.weight);
	assert_int_equal(out.aux, h.aux);
	assert_int_equal(out.token, h.token);
	free(buf);
}

static void test_round_trip(void **st)
{
	(void)st;
	round_trip(0, 0);
	round_trip(0, 100);
	round_trip(MP_WIRE_F_PAYLOAD_CRC, 0);
	round_trip(MP_WIRE_F_PAYLOAD_CRC, 4097);
}

/* Byte layout is fixed little-endian, whatever the host. */
static void test_layout(void **st)
{
	static const unsigned char expect[60] = {
		0x4d, 0x53, 0x50, 0x48, 0x08, 0x02, 0x01, 0x00,             /* magic ver type codec flags */
		0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,             /* run_id (patched below) */
		0x04, 0x03, 0x02, 0x01, 0xef, 0xbe, 0xad, 0xde,             /* round group */
		0x4d, 0x00, 0x00, 0x00, 0x03, 0x00, 0x00, 0x00,             /* sender part */
		0xef, 0xcd, 0xab, 0x89, 0x67, 0x45, 0x23, 0x01,             /* offset */
		0xe8, 0x03, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,             /* count length */
		0x00, 0x00, 0x20, 0x40, 0xa5, 0xa5, 0xa5, 0xa5,             /* weight 2.5f, aux */
		0x44, 0x33, 0x22, 0x11,                                     /* token */
	};
	unsigned char buf[64], want[60];
	struct mp_wire_hdr h = sample_hdr(0, 0);

	(void)st;
	memcpy(want, expect, sizeof(want));
	for (int i = 0; i < 8; i++)
		want[8 + i] = (unsigned char)(h.run_id >> (8 * i));
	mp_wire_encode(&h, buf, NULL);
	assert_memory_equal(buf, want, 60);
	assert_int_equal(get32(buf + 60), mp_crc32c(0, buf, 60));
}

static void encode_into(unsigned char *buf, uint32_t length, uint8_t flags)
{
	struct mp_wire_hdr h = sample_hdr(length, flags);

	fill_random(buf + 64, length);
	mp_wire_encode(&h, buf, buf + 64);
}

static void test_truncated(void **st)
{
	unsigned char buf[64 + 32];

	(void)st;
	encode_into(buf, 32, 0);
	for (size_t len = 0; len < 64; len++)
		expect_reject(buf, len, -EMSGSIZE, MP_REJ_TRUNCATED);
	/* header complete, payload short */
	expect_reject(buf, 64, -EMSGSIZE, MP_REJ_TRUNCATED);
	expect_reject(buf, 64 + 31, -EMSGSIZE, MP_REJ_TRUNCATED);
	/* with the payload checksum, a cut payload fails the checksum */
	encode_into(buf, 32, MP_WIRE_F_PAYLOAD_CRC);
	expect_reject(buf, 64 + 31, -EBADMSG, MP_REJ_CHECKSUM);
}

static void test_magic(void **st)
{
	unsigned char buf[64];

	(void)st;
	encode_into(buf, 0, 0);
	buf[0] ^= 0x20;
	reseal(buf, 64);
	expect_reject(buf, 64, -EBADMSG, MP_REJ_MAGIC);
}

static void test_version(void **st)
{
	unsigned char buf[64];

	(void)st;
	encode_into(buf, 0, 0);
	for (int v = 0; v < 256; v++) {
		if (v == MP_WIRE_VERSION)
			continue;
		buf[4] = (unsigned char)v;
		reseal(buf, 64);
		expect_reject(buf, 64, -EPROTO, MP_REJ_VERSION);
	}
	/* an unsealed version change still reads as a version problem: a
	 * version 1 peer is told apart from a corrupted frame */
	encode_into(buf, 0, 0);
	buf[4] = 1;
	expect_reject(buf, 64, -EPROTO, MP_REJ_VERSION);
}

static void test_type(void **st)
{
	unsigned char buf[64];

	(void)st;
	encode_into(buf, 0, 0);
	for (int t = 0; t < 256; t++) {
		struct mp_wire_hdr h;
		enum mp_wire_reject why;
		int rc;

		buf[5] = (unsigned char)t;
		reseal(buf, 64);
		rc = mp_wire_decode(buf, 64, mp_wire_run_id(RUN), NCODECS, &h, &why);
		if (t >= 1 && t <= MP_MSG_TYPE_MAX) {
			assert_int_equal(rc, 0);
			assert_int_equal(h.type, t);
		} else {
			assert_int_equal(rc, -EPROTO);
			assert_int_equal(why, MP_REJ_TYPE);
		}
	}
}

static void test_codec(void **st)
{
	unsigned char buf[64];
	struct mp_wire_hdr h;
	enum mp_wire_reject why;

	(void)st;
	encode_into(buf, 0, 0);
	for (int c = NCODECS; c < 256; c++) {
		buf[6] = (unsigned char)c;
		reseal(buf, 64);
		expect_reject(buf, 64, -EPROTO, MP_REJ_CODEC);
	}
	buf[6] = NCODECS - 1;
	reseal(buf, 64);
	assert_int_equal(mp_wire_decode(buf, 64, mp_wire_run_id(RUN), NCODECS, &h, &why), 0);
	/* the limit is the caller's */
	assert_int_equal(mp_wire_decode(buf, 64, mp_wire_run_id(RUN), 1, &h, &why), -EPROTO);
	assert_int_equal(why, MP_REJ_CODEC);
}

static void test_flags(void **st)
{
	unsigned char buf[64];

	(void)st;
	for (int bit = 2; bit < 8; bit++) {
		/* (bit 1: MP_WIRE_F_NONFINITE, known since version 3) */
		encode_into(buf, 0, 0);
		buf[7] = (unsigned char)(1u << bit);
		reseal(buf, 64);
		expect_reject(buf, 64, -EPROTO, MP_REJ_FLAGS);
	}
}

/* Version 2: bytes 56-59 are the session token, any value, carried as is
 * (judging it is the connection's business, not the decoder's). */
static void test_token(void **st)
{
	static const uint32_t tokens[] = {0, 1, 0x80000000u, 0xffffffffu, 0x5a5aa5a5u};
	unsigned char buf[64 + 8];
	struct mp_wire_hdr h, out;
	enum mp_wire_reject why;

	(void)st;
	for (size_t i = 0; i < sizeof(tokens) / sizeof(tokens[0]); i++) {
		h = sample_hdr(8, MP_WIRE_F_PAYLOAD_CRC);
		h.token = tokens[i];
		fill_random(buf + 64, 8);
		mp_wire_encode(&h, buf, buf + 64);
		assert_int_equal(get32(buf + 56), tokens[i]);
		assert_int_equal(mp_wire_decode(buf, sizeof(buf), h.run_id, NCODECS, &out, &why), 0);
		assert_int_equal(out.token, tokens[i]);
	}
	/* a token edited in transit fails the checksum ... */
	buf[57] ^= 0x01;
	expect_reject(buf, sizeof(buf), -EBADMSG, MP_REJ_CHECKSUM);
	/* ... and an edit resealed is just another token */
	reseal(buf, sizeof(buf));
	assert_int_equal(mp_wire_decode(buf, sizeof(buf), h.run_id, NCODECS, &out, &why), 0);
	assert_int_equal(out.token, tokens[4] ^ 0x100u);
}

/*
 * The HELLO example of doc/protocol.md, byte for byte: peer 0 opens data
 * stream 1 to peer 1 in a static run of 8 peers, run "moshpit", codec none,
 * nonce 00 01 .. 0f, mode normal, bandwidth unknown (-1.0), settings of a
 * 2x2x2 moshpit run (3 rounds, 256 KiB chunks, 2 streams, 8 peers, equal
 * bandwidths, balance configured), listening on 10.0.0.1:29500.
 */
static void test_hello_golden(void **st)
{
	static const unsigned char golden[64 + 27 + 116 + 15] = {
		0x4d, 0x53, 0x50, 0x48, 0x08, 0x01, 0x00, 0x01, 0xa7, 0xf7, 0x9f, 0xd3, 0x4c, 0xef, 0x70, 0xcb,
		0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
		0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x08, 0x00, 0x00, 0x00, 0x9e, 0x00, 0x00, 0x00,
		0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x2b, 0x21, 0x40, 0xe1,
		0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0a, 0x0b, 0x0c, 0x0d, 0x0e, 0x0f,
		0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xf0, 0xbf,
		0x74, 0x00, /* settings: 116 bytes of entries (tag, length, value) */
		0x01, 0x01, 0x00,                                     /* algorithm moshpit */
		0x02, 0x07, 0x03, 0x02, 0x00, 0x02, 0x00, 0x02, 0x00, /* grid 2x2x2 */
		0x03, 0x04, 0x03, 0x00, 0x00, 0x00,                   /* rounds 3 */
		0x04, 0x11, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
		0x00, 0x00, 0x00, 0x00,                               /* codec none, no parameters */
		0x05, 0x08, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, /* chunk 65536 values */
		0x06, 0x04, 0x02, 0x00, 0x00, 0x00,                   /* streams 2 */
		0x07, 0x04, 0x08, 0x00, 0x00, 0x00,                   /* peers 8 */
		0x08, 0x17, 0xa5, 0xbb, 0xb0, 0xd3, 0x26, 0x4f, 0x25, 0x01, /* bandwidths: fingerprint, */
		'1', ',', '1', ',', '1', ',', '1', ',', '1', ',', '1', ',', '1', ',', '1', /* text */
		0x09, 0x08, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, /* min part 0 */
		0x0a, 0x01, 0x00,                                     /* check finite 0 */
		0x0b, 0x01, 0x00,                                     /* rendezvous static */
		0x0c, 0x01, 0x00,                                     /* balance configured */
		0x0d, 0x08, 0x00, 0x40, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, /* direct limit 16 KiB */
		0x0e, 0x01, 0x00,                                     /* direct pairs 0 */
		'1', '0', '.', '0', '.', '0', '.', '1', ':', '2', '9', '5', '0', '0', 0x00,
	};
	unsigned char buf[sizeof(golden)];
	double bw = -1.0, one = 1.0;
	struct mp_wire_hdr h, out;
	struct mp_settings s, back;

	(void)st;
	memset(&s, 0, sizeof(s));
	s.ndims = 3;
	s.dims[0] = s.dims[1] = s.dims[2] = 2;
	s.rounds = 3;
	s.chunk_elems = 65536;
	s.streams = 2;
	s.npeers = 8;
	/* FNV-1a 64 over the 8 bandwidths' binary64 bytes, rank order. */
	s.bw_fp = 0xcbf29ce484222325ull;
	for (int i = 0; i < 8; i++)
		for (int k = 0; k < 8; k++) {
			s.bw_fp ^= ((const unsigned char *)&one)[k];
			s.bw_fp *= 0x100000001b3ull;
		}
	strcpy(s.bw_text, "1,1,1,1,1,1,1,1");
	s.direct_max = 16384;
	memset(&h, 0, sizeof(h));
	h.type = MP_MSG_HELLO;
	h.codec = 0;
	h.flags = MP_WIRE_F_PAYLOAD_CRC;
	h.run_id = mp_wire_run_id("moshpit");
	h.sender = 0;
	h.offset = 0;
	h.count = 8;
	h.aux = 1;
	h.length = 27 + 116 + 15;
	for (int i = 0; i < 16; i++)
		buf[64 + i] = (unsigned char)i;
	buf[64 + 16] = 0;
	memcpy(buf + 64 + 17, &bw, 8); /* little-endian host: the codec code insists on it */
	assert_int_equal(mp_settings_encode(&s, buf + 64 + 27), 116);
	buf[64 + 25] = 116;
	buf[64 + 26] = 0;
	memcpy(buf + 64 + 143, "10.0.0.1:29500", 15);
	mp_wire_encode(&h, buf, buf + 64);
	assert_memory_equal(buf, golden, sizeof(golden));
	assert_int_equal(mp_wire_decode(buf, sizeof(buf), h.run_id, NCODECS, &out, NULL), 0);
	assert_int_equal(out.token, 0);
	assert_int_equal(mp_settings_decode(golden + 64 + 27, 116, &back), 0);
	s.present = back.present;
	assert_memory_equal(&s, &back, sizeof(s));
}

/* Settings: each field that differs is named with both values; unknown
 * entries (a later version's) are skipped; a run over the end is refused. */
static void test_settings_diff(void **st)
{
	struct mp_settings a, b;
	char msg[200];
	uint8_t buf[MP_SETTINGS_MAX + 8];
	size_t n;

	(void)st;
	memset(&a, 0, sizeof(a));
	a.ndims = 1;
	a.dims[0] = 4;
	a.rounds = 1;
	a.chunk_elems = 1024;
	a.streams = 1;
	a.npeers = 4;
	b = a;
	assert_int_equal(mp_settings_diff(&a, &b, msg, sizeof(msg)), 0);
	b.ndims = 2;
	b.dims[0] = b.dims[1] = 2;
	assert_int_equal(mp_settings_diff(&a, &b, msg, sizeof(msg)), -EBADE);
	assert_string_equal(msg, "grid differs: ours 4, theirs 2x2");
	b = a;
	b.streams = 2;
	assert_int_equal(mp_settings_diff(&a, &b, msg, sizeof(msg)), -EBADE);
	assert_string_equal(msg, "streams (MP_NSTREAMS) differs: ours 1, theirs 2");
	b = a;
	b.npeers = 0; /* not set (a dht peer): not compared */
	assert_int_equal(mp_settings_diff(&a, &b, msg, sizeof(msg)), 0);
	b = a;
	b.bw_fp = 7;
	assert_int_equal(mp_settings_diff(&a, &b, msg, sizeof(msg)), -EBADE);
	assert_non_null(strstr(msg, "bandwidths (MP_BANDWIDTHS) differs"));
	b.dynamic = 1;
	assert_int_equal(mp_settings_diff(&a, &b, msg, sizeof(msg)), -EBADE);
	assert_string_equal(msg, "rendezvous differs: ours static, theirs dht");
	a.dynamic = 1; /* dht: each peer announces its own bandwidth */
	assert_int_equal(mp_settings_diff(&a, &b, msg, sizeof(msg)), 0);
	assert_int_equal(mp_settings_fingerprint(&a), mp_settings_fingerprint(&b));
	b.topk_ratio = 0.5f;
	assert_true(mp_settings_fingerprint(&a) != mp_settings_fingerprint(&b));

	n = mp_settings_encode(&a, buf);
	buf[n] = 200; /* an entry of a later version */
	buf[n + 1] = 2;
	buf[n + 2] = buf[n + 3] = 0xee;
	assert_int_equal(mp_settings_decode(buf, n + 4, &b), 0);
	assert_int_equal(mp_settings_diff(&a, &b, msg, sizeof(msg)), 0);
	assert_int_equal(mp_settings_decode(buf, n + 3, &b), -EBADMSG);
}

static void test_length(void **st)
{
	unsigned char buf[64 + 64];

	(void)st;
	/* frame longer than the length field says */
	encode_into(buf, 16, 0);
	expect_reject(buf, 64 + 17, -EMSGSIZE, MP_REJ_LENGTH);
	expect_reject(buf, 64 + 64, -EMSGSIZE, MP_REJ_LENGTH);
	/* length field larger than the frame */
	encode_into(buf, 16, 0);
	put32(buf + 44, 17);
	reseal(buf, 64 + 16);
	expect_reject(buf, 64 + 16, -EMSGSIZE, MP_REJ_TRUNCATED);
	/* field smaller than the frame */
	put32(buf + 44, 15);
	reseal(buf, 64 + 16);
	expect_reject(buf, 64 + 16, -EMSGSIZE, MP_REJ_LENGTH);
	/* too large, even if the caller's buffer claims to hold it */
	put32(buf + 44, MP_WIRE_MAX_PAYLOAD + 1);
	reseal(buf, 64 + 16);
	expect_reject(buf, 64 + 16, -EMSGSIZE, MP_REJ_LENGTH);
	put32(buf + 44, 0xffffffffu);
	reseal(buf, 64 + 16);
	expect_reject(buf, 64 + 16, -EMSGSIZE, MP_REJ_LENGTH);
}

static void test_checksum(void **st)
{
	unsigned char buf[64 + 100];

	(void)st;
	/* header bit flip outside magic/version */
	encode_into(buf, 100, 0);
	buf[30] ^= 0x04;
	expect_reject(buf, sizeof(buf), -EBADMSG, MP_REJ_CHECKSUM);
	/* payload bit flip: unseen without the flag ... */
	encode_into(buf, 100, 0);
	buf[64 + 50] ^= 0x80;
	expect_reject(buf, sizeof(buf), 0, MP_REJ_NONE);
	/* ... caught with it */
	for (size_t i = 64; i < sizeof(buf); i += 7) {
		encode_into(buf, 100, MP_WIRE_F_PAYLOAD_CRC);
		expect_reject(buf, sizeof(buf), 0, MP_REJ_NONE);
		buf[i] ^= (unsigned char)(1u << (i % 8));
		expect_reject(buf, sizeof(buf), -EBADMSG, MP_REJ_CHECKSUM);
	}
	/* a flip in the stored CRC itself */
	encode_into(buf, 100, 0);
	buf[63] ^= 1;
	expect_reject(buf, sizeof(buf), -EBADMSG, MP_REJ_CHECKSUM);
}

static void test_weight(void **st)
{
	static const float bad[] = { -1.0f, -1e-30f, INFINITY, -INFINITY, NAN };
	unsigned char buf[64];
	struct mp_wire_hdr h;

	(void)st;
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		h = sample_hdr(0, 0);
		h.weight = bad[i];
		mp_wire_encode(&h, buf, NULL);
		expect_reject(buf, 64, -EPROTO, MP_REJ_WEIGHT);
	}
	h = sample_hdr(0, 0);
	h.weight = 0.0f;
	mp_wire_encode(&h, buf, NULL);
	expect_reject(buf, 64, 0, MP_REJ_NONE);
	h.weight = -0.0f;
	mp_wire_encode(&h, buf, NULL);
	expect_reject(buf, 64, 0, MP_REJ_NONE);
}

static void test_foreign_run(void **st)
{
	unsigned char buf[64];
	struct mp_wire_hdr h = sample_hdr(0, 0);
	enum mp_wire_reject why;

	(void)st;
	h.run_id = mp_wire_run_id("another-run");
	mp_wire_encode(&h, buf, NULL);
	expect_reject(buf, 64, -EPROTO, MP_REJ_FOREIGN_RUN);
	assert_int_equal(mp_wire_decode(buf, 64, h.run_id, NCODECS, NULL, &why), 0);
	assert_int_equal(mp_wire_decode(buf, 64, h.run_id, NCODECS, NULL, NULL), 0);
}

/* No single-bit error anywhere in a valid header (or its payload, with the
 * flag) may produce a frame that decodes. */
static void test_every_bit_flip(void **st)
{
	unsigned char buf[64 + 24];
	struct mp_wire_hdr h;
	enum mp_wire_reject why;

	(void)st;
	for (int pass = 0; pass < 2; pass++) {
		uint8_t flags = pass ? MP_WIRE_F_PAYLOAD_CRC : 0;
		size_t nbits = pass ? sizeof(buf) * 8 : 64 * 8;

		encode_into(buf, 24, flags);
		for (size_t bit = 0; bit < nbits; bit++) {
			buf[bit / 8] ^= (unsigned char)(1u << (bit % 8));
			assert_int_not_equal(mp_wire_decode(buf, sizeof(buf), mp_wire_run_id(RUN),
							    NCODECS, &h, &why), 0);
			assert_int_not_equal(why, MP_REJ_NONE);
			buf[bit / 8] ^= (unsigned char)(1u << (bit % 8));
		}
		assert_int_equal(mp_wire_decode(buf, sizeof(buf), mp_wire_run_id(RUN), NCODECS,
						&h, &why), 0);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_crc_vectors),
		cmocka_unit_test(test_crc_hw_equals_sw),
		cmocka_unit_test(test_run_id),
		cmocka_unit_test(test_reject_names),
		cmocka_unit_test(test_round_trip),
		cmocka_unit_test(test_layout),
		cmocka_unit_test(test_truncated),
		cmocka_unit_test(test_magic),
		cmocka_unit_test(test_version),
		cmocka_unit_test(test_type),
		cmocka_unit_test(test_codec),
		cmocka_unit_test(test_flags),
		cmocka_unit_test(test_token),
		cmocka_unit_test(test_hello_golden),
		cmocka_unit_test(test_settings_diff),
		cmocka_unit_test(test_length),
		cmocka_unit_test(test_checksum),
		cmocka_unit_test(test_weight),
		cmocka_unit_test(test_foreign_run),
		cmocka_unit_test(test_every_bit_flip),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
