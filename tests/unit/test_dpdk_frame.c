/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The dpdk driver's Ethernet/IPv4/UDP framing (drivers/dpdk/frame.c), without
 * DPDK: addresses, frames we build classify as ours with the payload intact,
 * every kind of frame that is not ours gets its own verdict, checksums are
 * right over pieces of any length, ARP requests get a correct reply, and
 * random bytes never crash the classifier nor pass as ours.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "drivers/dpdk/frame.h"

static const struct mp_dpdk_addr A = {{0x02, 0, 0, 0, 0, 1}, {10, 77, 0, 1}, {0x1b, 0x58}};
static const struct mp_dpdk_addr B = {{0x02, 0, 0, 0, 0, 2}, {10, 77, 0, 2}, {0x1b, 0x58}};

static size_t make(uint8_t *f, const struct mp_dpdk_addr *src, const struct mp_dpdk_addr *dst,
		   const uint8_t *pl, size_t n, int csum)
{
	mp_frame_build(f, src, dst, 7, n);
	memcpy(f + MP_FRAME_HDR_LEN, pl, n);
	if (csum)
		mp_frame_udp_csum(f, mp_csum_add(0, pl, n, 0));
	return MP_FRAME_HDR_LEN + n;
}

/* Recompute the IPv4 header checksum after editing the header. */
static void fix_ip(uint8_t *f)
{
	uint8_t *ip = f + MP_ETH_HDR_LEN;
	uint16_t c;

	ip[10] = ip[11] = 0;
	c = (uint16_t)~mp_csum_fold(mp_csum_add(0, ip, (size_t)(ip[0] & 0xf) * 4, 0));
	ip[10] = (uint8_t)(c >> 8);
	ip[11] = (uint8_t)c;
}

static void test_addr(void **state)
{
	struct mp_dpdk_addr a;
	char t[MP_DPDK_ADDR_STRLEN];

	(void)state;
	assert_int_equal(mp_dpdk_addr_parse("02:00:00:00:00:01/10.77.0.1:7000", &a), 0);
	assert_memory_equal(&a, &A, sizeof(a));
	assert_int_equal(mp_dpdk_addr_format(&a, t, sizeof(t)), 0);
	assert_string_equal(t, "02-00-00-00-00-01/10.77.0.1:7000");
	assert_int_equal(mp_dpdk_addr_parse(t, &a), 0);
	assert_memory_equal(&a, &A, sizeof(a));
	assert_int_equal(mp_dpdk_addr_parse("02:AB:cd:00:00:ff/255.0.0.9:65535", &a), 0);
	assert_int_equal(a.mac[1], 0xab);
	assert_int_equal(a.port[0], 0xff);
	assert_int_equal(mp_dpdk_addr_format(&a, t, 10), -ENOSPC);
	static const char *const bad[] = {
		"", "10.77.0.1:7000", "02:00:00:00:00:01", "02:00:00:00:00:01/10.77.0.1",
		"02:00:00:00:00:01/10.77.0.1:0", "02:00:00:00:00:01/10.77.0.1:65536",
		"02:00:00:00:00:01/10.77.0.256:7000", "02:00:00:00:00/10.77.0.1:7000",
		"02:00:00:00:00:0g/10.77.0.1:7000", "02:00:00:00:00:01/10.77.0.1:7000x",
		"02:00:00:00:00:01/10.77.0:7000", "02:00:00:00:00:01/10.77.0.1:-1",
		"02-00:00:00:00:01/10.77.0.1:7000", "02.00.00.00.00.01/10.77.0.1:7000",
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		assert_int_equal(mp_dpdk_addr_parse(bad[i], &a), -EINVAL);
}

static void test_ours(void **state)
{
	uint8_t f[2048], pl[1400];
	const uint8_t *p;
	size_t n, len;
	struct mp_dpdk_addr src;

	(void)state;
	for (size_t i = 0; i < sizeof(pl); i++)
		pl[i] = (uint8_t)(i * 7 + 3);
	for (int csum = 0; csum < 2; csum++)
		for (size_t k = 0; k <= sizeof(pl); k += 233) {
			len = make(f, &B, &A, pl, k, csum);
			assert_int_equal(mp_frame_classify(f, len, &A, &p, &n, &src), MP_FRAME_OURS);
			assert_int_equal(n, k);
			assert_memory_equal(p, pl, k);
			assert_memory_equal(&src, &B, sizeof(src));
			/* Ethernet pads short frames: trailing bytes are not payload. */
			assert_int_equal(mp_frame_classify(f, len + 20, &A, &p, &n, NULL),
					 MP_FRAME_OURS);
			assert_int_equal(n, k);
		}
}

static void test_verdicts(void **state)
{
	uint8_t f[256], g[256], pl[64] = {1, 2, 3};
	size_t len;

	(void)state;
	len = make(f, &B, &A, pl, sizeof(pl), 1);
#define CHECK(expr_len, want) assert_int_equal(mp_frame_classify(g, expr_len, &A, NULL, NULL, NULL), want)
	memcpy(g, f, len);
	CHECK(10, MP_FRAME_NOT_IP);
	g[0] = 0x04; /* another MAC */
	CHECK(len, MP_FRAME_NOT_FOR_US);
	memcpy(g, f, len);
	g[12] = 0x86, g[13] = 0xdd; /* IPv6 */
	CHECK(len, MP_FRAME_NOT_IP);
	memcpy(g, f, len);
	CHECK(MP_ETH_HDR_LEN + 10, MP_FRAME_BAD_IP);
	g[MP_ETH_HDR_LEN] = 0x65; /* version 6 */
	CHECK(len, MP_FRAME_BAD_IP);
	memcpy(g, f, len);
	g[MP_ETH_HDR_LEN + 10] ^= 1; /* header checksum */
	CHECK(len, MP_FRAME_BAD_IP);
	memcpy(g, f, len);
	g[MP_ETH_HDR_LEN + 2] = 4; /* total length beyond the frame */
	fix_ip(g);
	CHECK(len, MP_FRAME_BAD_IP);
	memcpy(g, f, len);
	g[MP_ETH_HDR_LEN + 6] = 0x20; /* more fragments */
	fix_ip(g);
	CHECK(len, MP_FRAME_FRAGMENT);
	memcpy(g, f, len);
	g[MP_ETH_HDR_LEN + 19] = 9; /* another IP */
	fix_ip(g);
	CHECK(len, MP_FRAME_NOT_FOR_US);
	memcpy(g, f, len);
	g[MP_ETH_HDR_LEN + 9] = 6; /* TCP */
	fix_ip(g);
	CHECK(len, MP_FRAME_NOT_UDP);
	memcpy(g, f, len);
	g[MP_ETH_HDR_LEN + MP_IP4_HDR_LEN + 3] ^= 1; /* another port */
	CHECK(len, MP_FRAME_OTHER_PORT);
	memcpy(g, f, len);
	g[MP_ETH_HDR_LEN + MP_IP4_HDR_LEN + 5] ^= 1; /* UDP length */
	CHECK(len, MP_FRAME_BAD_UDP);
	memcpy(g, f, len);
	g[len - 1] ^= 0x40; /* payload against its checksum */
	CHECK(len, MP_FRAME_BAD_UDP);
	g[MP_ETH_HDR_LEN + MP_IP4_HDR_LEN + 6] = 0; /* no checksum: accepted as is */
	g[MP_ETH_HDR_LEN + MP_IP4_HDR_LEN + 7] = 0;
	CHECK(len, MP_FRAME_OURS);
#undef CHECK
	for (int v = 0; v < MP_FRAME_NVERDICTS; v++)
		assert_string_not_equal(mp_frame_verdict_name(v), "?");
	assert_string_equal(mp_frame_verdict_name(MP_FRAME_NVERDICTS), "?");
}

static void test_arp(void **state)
{
	uint8_t req[60] = {0}, rep[MP_ARP_FRAME_LEN];
	static const uint8_t hdr[] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 2, 0, 0, 0, 0, 2,
				      0x08, 0x06, 0, 1, 0x08, 0, 6, 4, 0, 1};

	(void)state;
	memcpy(req, hdr, sizeof(hdr));
	memcpy(req + 22, B.mac, 6);
	memcpy(req + 28, B.ip, 4);
	memcpy(req + 38, A.ip, 4);
	assert_int_equal(mp_frame_classify(req, sizeof(req), &A, NULL, NULL, NULL),
			 MP_FRAME_ARP_REQUEST);
	mp_frame_arp_reply(rep, req, &A);
	assert_memory_equal(rep, B.mac, 6);
	assert_memory_equal(rep + 6, A.mac, 6);
	assert_int_equal(rep[21], 2);
	assert_memory_equal(rep + 22, A.mac, 6);
	assert_memory_equal(rep + 28, A.ip, 4);
	assert_memory_equal(rep + 32, B.mac, 6);
	assert_memory_equal(rep + 38, B.ip, 4);
	/* A reply is no request; a request for another IP is not for us. */
	assert_int_equal(mp_frame_classify(rep, sizeof(rep), &B, NULL, NULL, NULL),
			 MP_FRAME_NOT_FOR_US);
	req[41] = 9;
	assert_int_equal(mp_frame_classify(req, sizeof(req), &A, NULL, NULL, NULL),
			 MP_FRAME_NOT_FOR_US);
	assert_int_equal(mp_frame_classify(req, 30, &A, NULL, NULL, NULL), MP_FRAME_NOT_IP);
}

/* Sums over pieces that split anywhere equal the sum over the whole. */
static void test_csum_pieces(void **state)
{
	uint8_t buf[1001];
	uint32_t whole;

	(void)state;
	srand(5);
	for (size_t i = 0; i < sizeof(buf); i++)
		buf[i] = (uint8_t)rand();
	whole = mp_csum_fold(mp_csum_add(0, buf, sizeof(buf), 0));
	for (int t = 0; t < 500; t++) {
		size_t a = (size_t)rand() % sizeof(buf), b = (size_t)rand() % sizeof(buf);
		uint32_t s;

		if (a > b) {
			size_t x = a;

			a = b;
			b = x;
		}
		s = mp_csum_add(0, buf, a, 0);
		s = mp_csum_add(s, buf + a, b - a, a);
		s = mp_csum_add(s, buf + b, sizeof(buf) - b, b);
		assert_int_equal(mp_csum_fold(s), whole);
	}
}

/* RFC 1071 written the plain way: big-endian 16-bit words, one at a time. */
static uint16_t csum_ref(const uint8_t *p, size_t len)
{
	uint32_t s = 0;

	for (size_t i = 0; i < len; i += 2)
		s += (uint32_t)p[i] << 8 | (i + 1 < len ? p[i + 1] : 0);
	while (s >> 16)
		s = (s & 0xffff) + (s >> 16);
	return (uint16_t)s;
}

/* Every length and start address against the reference, with sums that carry. */
static void test_csum_reference(void **state)
{
	uint8_t buf[600];

	(void)state;
	srand(11);
	for (size_t i = 0; i < sizeof(buf); i++)
		buf[i] = (uint8_t)(i < 300 ? 0xff - (rand() & 1) : rand());
	for (size_t start = 0; start < 8; start++)
		for (size_t len = 0; start + len <= sizeof(buf); len++)
			assert_int_equal(mp_csum_fold(mp_csum_add(0, buf + start, len, 0)),
					 csum_ref(buf + start, len));
	/* A running sum folds in too, and 0xffff + 1 carries round. */
	assert_int_equal(mp_csum_fold(mp_csum_add(0xffff, (const uint8_t[]){0, 1}, 2, 0)), 1);
}

/* Built headers sum to all ones, carries included (high addresses and ids). */
static void test_ip_header_sum(void **state)
{
	static const struct mp_dpdk_addr hi = {{0x02, 0, 0, 0, 0, 3}, {255, 255, 255, 254}, {0xff, 0xff}};
	static const uint16_t ids[] = {0, 1, 0x7fff, 0xfffe, 0xffff};
	static const size_t lens[] = {0, 1, 1472, 8972, 65507};
	uint8_t f[MP_FRAME_HDR_LEN];

	(void)state;
	for (size_t i = 0; i < sizeof(ids) / sizeof(ids[0]); i++)
		for (size_t j = 0; j < sizeof(lens) / sizeof(lens[0]); j++) {
			mp_frame_build(f, &hi, &A, ids[i], lens[j]);
			assert_int_equal(csum_ref(f + MP_ETH_HDR_LEN, MP_IP4_HDR_LEN), 0xffff);
			mp_frame_build(f, &A, &hi, ids[i], lens[j]);
			assert_int_equal(csum_ref(f + MP_ETH_HDR_LEN, MP_IP4_HDR_LEN), 0xffff);
		}
}

static void test_random_bytes(void **state)
{
	uint8_t f[1600], good[256], pl[100] = {9};
	size_t glen;
	int ours = 0;

	(void)state;
	srand(11);
	glen = make(good, &B, &A, pl, sizeof(pl), 1);
	for (int t = 0; t < 200000; t++) {
		size_t len = (size_t)rand() % sizeof(f);
		const uint8_t *p = NULL;
		size_t n = 0;
		int v;

		if (t & 1) {
			/* A valid frame with a few random bytes changed. */
			memcpy(f, good, glen);
			len = glen;
			for (int k = rand() % 4 + 1; k; k--)
				f[(size_t)rand() % glen] = (uint8_t)rand();
		} else {
			for (size_t i = 0; i < len; i++)
				f[i] = (uint8_t)rand();
		}
		v = mp_frame_classify(f, len, &A, &p, &n, NULL);
		assert_true(v >= 0 && v < MP_FRAME_NVERDICTS);
		if (v == MP_FRAME_OURS) {
			assert_true(p >= f && p + n <= f + len);
			ours++;
		}
	}
	/* Changes to Ethernet bytes other than our fields may leave frames ours. */
	assert_true(ours < 100000);
}

/* A memif peer's BYE and its ACK: built, parsed back, and every malformed one refused. */
static void test_bye(void **state)
{
	uint8_t b[MP_BYE_LEN + 4], c[MP_BYE_LEN];
	uint32_t nonce = 0;
	int type = 0;

	(void)state;
	mp_bye_build(b, MP_BYE, 0xdeadbeefu);
	assert_int_equal(b[0], 'M');
	assert_int_equal(b[1], 'B');
	assert_int_equal(mp_bye_parse(b, MP_BYE_LEN, &type, &nonce), 0);
	assert_int_equal(type, MP_BYE);
	assert_int_equal(nonce, 0xdeadbeefu);
	mp_bye_build(b, MP_BYE_ACK, 7);
	assert_int_equal(mp_bye_parse(b, MP_BYE_LEN, &type, &nonce), 0);
	assert_int_equal(type, MP_BYE_ACK);
	assert_int_equal(nonce, 7);
	/* Not a BYE at all: rel's magic, or too short for a magic. */
	memcpy(c, "MR", 2);
	assert_int_equal(mp_bye_parse(c, sizeof(c), &type, &nonce), 1);
	assert_int_equal(mp_bye_parse(b, 1, &type, &nonce), 1);
	/* The magic with anything else wrong: refused, outputs untouched. */
	type = -1;
	nonce = 1;
	assert_int_equal(mp_bye_parse(b, MP_BYE_LEN - 1, &type, &nonce), -EPROTO);
	assert_int_equal(mp_bye_parse(b, MP_BYE_LEN + 1, &type, &nonce), -EPROTO);
	for (int i = 2; i < MP_BYE_LEN; i++) {
		if (i >= 4 && i < 8)
			continue; /* the nonce may be anything */
		memcpy(c, b, sizeof(c));
		c[i] ^= i == 3 ? 0x04 : 0x01; /* type 2 ^ 1 would be a BYE */
		assert_int_equal(mp_bye_parse(c, sizeof(c), &type, &nonce), -EPROTO);
	}
	memcpy(c, b, sizeof(c));
	c[3] = 0;
	assert_int_equal(mp_bye_parse(c, sizeof(c), &type, &nonce), -EPROTO);
	assert_int_equal(type, -1);
	assert_int_equal(nonce, 1);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_addr),
		cmocka_unit_test(test_ours),
		cmocka_unit_test(test_verdicts),
		cmocka_unit_test(test_arp),
		cmocka_unit_test(test_csum_pieces),
		cmocka_unit_test(test_csum_reference),
		cmocka_unit_test(test_ip_header_sum),
		cmocka_unit_test(test_random_bytes),
		cmocka_unit_test(test_bye),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
