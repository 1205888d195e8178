/* SPDX-License-Identifier: BSD-3-Clause */
/* Rendezvous record and declaration encodings (rdv_record.c). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <math.h>
#include <string.h>
#include <time.h>

#include "mp_build_config.h"
#include "rdv.h"

#define RUN "test-run"
#define GKEY "round-7/dim-1/cell-3"
#define RECORD_LEN 250
#define REC_MAC 218
#define DECL_LEN 62
#define DECL_MAC 30
#define GROUND 7 /* the round of GKEY's declarations */

static struct mp_auth auth, other;

static int setup(void **state)
{
	(void)state;
	if (mp_auth_init(&auth, RUN, "secret one", NULL) || mp_auth_init(&other, RUN, "secret two", NULL))
		return -1;
	return 0;
}

static struct mp_record sample_record(void)
{
	struct mp_record r;

	memset(&r, 0, sizeof(r));
	r.id = 0x1122334455667788ULL;
	r.seq = 1700000000000123ULL;
	r.expires_ms = 1700000015000ULL;
	r.round = 0xa1b2c3d4u;
	r.mode = MP_MODE_AUX;
	r.bye = 1;
	r.ndims = 3;
	r.coords[0] = 5;
	r.coords[1] = -2;
	r.coords[2] = 32767;
	r.bandwidth = 12.5;
	strcpy(r.transport, "tcp");
	strcpy(r.addr, "10.1.2.3:29500");
	return r;
}

static void assert_record_equal(const struct mp_record *a, const struct mp_record *b)
{
	assert_int_equal(a->id, b->id);
	assert_int_equal(a->seq, b->seq);
	assert_int_equal(a->expires_ms, b->expires_ms);
	assert_int_equal(a->round, b->round);
	assert_int_equal(a->mode, b->mode);
	assert_int_equal(a->bye, b->bye);
	assert_int_equal(a->ndims, b->ndims);
	for (int i = 0; i < MP_MAX_GRID_DIMS; i++)
		assert_int_equal(a->coords[i], b->coords[i]);
	assert_memory_equal(&a->bandwidth, &b->bandwidth, sizeof(double));
	assert_string_equal(a->transport, b->transport);
	assert_string_equal(a->addr, b->addr);
}

static void test_record_round_trip(void **state)
{
	const double bws[] = { 12.5, -1.0, 0.0, 1e300 };
	uint8_t buf[MP_RECORD_WIRE_MAX];
	struct mp_record r = sample_record(), out;
	size_t len = 0;

	(void)state;
	for (size_t k = 0; k < sizeof(bws) / sizeof(bws[0]); k++) {
		r.bandwidth = bws[k];
		r.ndims = (uint8_t)k;
		memset(r.coords + k, 0, sizeof(r.coords) - k * sizeof(r.coords[0]));
		assert_int_equal(mp_record_encode(&auth, RUN, &r, buf, sizeof(buf), &len), 0);
		assert_int_equal(len, RECORD_LEN);
		memset(&out, 0xee, sizeof(out));
		assert_int_equal(mp_record_decode(&auth, RUN, buf, len, &out), 0);
		assert_record_equal(&r, &out);
	}
	/* Longest strings that fit, and a full grid. */
	r = sample_record();
	r.ndims = MP_MAX_GRID_DIMS;
	for (int i = 0; i < MP_MAX_GRID_DIMS; i++)
		r.coords[i] = (int16_t)(-1000 * i);
	memset(r.transport, 't', sizeof(r.transport) - 1);
	memset(r.addr, 'a', sizeof(r.addr) - 1);
	assert_int_equal(mp_record_encode(&auth, RUN, &r, buf, sizeof(buf), &len), 0);
	assert_int_equal(mp_record_decode(&auth, RUN, buf, len, &out), 0);
	assert_record_equal(&r, &out);
}

static void test_record_layout(void **state)
{
	uint8_t buf[MP_RECORD_WIRE_MAX], mac[MP_MAC_BYTES];
	struct mp_record r = sample_record();
	size_t len;

	(void)state;
	assert_int_equal(mp_record_encode(&auth, RUN, &r, buf, sizeof(buf), &len), 0);
	assert_int_equal(buf[0], 0x6d);
	assert_int_equal(buf[1], 4);
	assert_int_equal(buf[2], 1);
	assert_int_equal(buf[3], MP_MODE_AUX);
	assert_int_equal(buf[4], 1);
	assert_int_equal(buf[5], 3);
	assert_int_equal(buf[14], 0x88); /* id, little-endian */
	assert_int_equal(buf[21], 0x11);
	assert_int_equal(buf[38], 0xd4); /* round */
	assert_int_equal(buf[44], 0xfe); /* coords[1] = -2 */
	assert_int_equal(buf[45], 0xff);
	assert_int_equal(buf[48], 0);    /* coords past ndims */
	assert_memory_equal(buf + 66, "tcp\0\0", 5);
	assert_memory_equal(buf + 82, "10.1.2.3:29500", 15);
	mp_auth_mac(&auth, MP_AUTH_RECORD, &(struct mp_auth_piece){ buf, REC_MAC }, 1, mac);
	assert_memory_equal(buf + REC_MAC, mac, MP_MAC_BYTES);
}

/* Every byte changed in three ways: a bad MAC or a malformed header. */
static void test_record_tamper(void **state)
{
	const uint8_t masks[] = { 0x01, 0x80, 0xff };
	uint8_t buf[MP_RECORD_WIRE_MAX], t[MP_RECORD_WIRE_MAX];
	struct mp_record r = sample_record(), out;
	size_t len;

	(void)state;
	assert_int_equal(mp_record_encode(&auth, RUN, &r, buf, sizeof(buf), &len), 0);
	for (size_t i = 0; i < len; i++) {
		for (size_t k = 0; k < sizeof(masks); k++) {
			int rc;

			memcpy(t, buf, len);
			t[i] ^= masks[k];
			rc = mp_record_decode(&auth, RUN, t, len, &out);
			assert_int_equal(rc, i < 3 ? -EBADMSG : -EACCES);
		}
	}
}

/* A record signed under the run key but with other settings is refused
 * with its own reason (-EBADE), before any field is believed. */
static void test_record_other_settings(void **state)
{
	uint8_t buf[MP_RECORD_WIRE_MAX];
	struct mp_record r = sample_record(), out;
	struct mp_auth writer = auth, reader = auth;
	size_t len;

	(void)state;
	writer.settings_fp = 0x1111;
	reader.settings_fp = 0x2222;
	assert_int_equal(mp_record_encode(&writer, RUN, &r, buf, sizeof(buf), &len), 0);
	assert_int_equal(buf[210], 0x11); /* the fingerprint, little-endian */
	assert_int_equal(buf[211], 0x11);
	assert_int_equal(mp_record_decode(&reader, RUN, buf, len, &out), -EBADE);
	reader.settings_fp = 0x1111;
	assert_int_equal(mp_record_decode(&reader, RUN, buf, len, &out), 0);
	assert_true(out.settings == 0x1111);
}

static void test_record_wrong_key_and_run(void **state)
{
	uint8_t buf[MP_RECORD_WIRE_MAX];
	struct mp_record r = sample_record(), out;
	size_t len;

	(void)state;
	assert_int_equal(mp_record_encode(&other, RUN, &r, buf, sizeof(buf), &len), 0);
	assert_int_equal(mp_record_decode(&auth, RUN, buf, len, &out), -EACCES);
	/* Right key, another run's name: refused all the same. */
	assert_int_equal(mp_record_encode(&auth, "another-run", &r, buf, sizeof(buf), &len), 0);
	assert_int_equal(mp_record_decode(&auth, RUN, buf, len, &out), -EPROTO);
	assert_int_equal(mp_record_decode(&auth, "another-run", buf, len, &out), 0);
}

static void test_record_lengths(void **state)
{
	uint8_t buf[MP_RECORD_WIRE_MAX + 8];
	struct mp_record r = sample_record(), out;
	size_t len;

	(void)state;
	assert_int_equal(mp_record_encode(&auth, RUN, &r, buf, RECORD_LEN - 1, &len), -ENOSPC);
	assert_int_equal(mp_record_encode(&auth, RUN, &r, buf, sizeof(buf), &len), 0);
	buf[len] = 0;
	for (size_t n = 0; n < len; n += 7)
		assert_int_equal(mp_record_decode(&auth, RUN, buf, n, &out), -EBADMSG);
	assert_int_equal(mp_record_decode(&auth, RUN, buf, len - 1, &out), -EBADMSG);
	assert_int_equal(mp_record_decode(&auth, RUN, buf, len + 1, &out), -EBADMSG);
	assert_int_equal(mp_record_decode(&auth, RUN, buf, sizeof(buf), &out), -EBADMSG);
	/* A declaration is not a record, and the other way round. */
	{
		struct mp_decl d = { .id = 9, .expires_ms = 1, .mode = 0, .coord = 0 };
		struct mp_decl dout;

		assert_int_equal(mp_decl_encode(&auth, GKEY, GROUND, &d, buf, sizeof(buf), &len), 0);
		assert_int_equal(mp_record_decode(&auth, RUN, buf, len, &out), -EBADMSG);
		assert_int_equal(mp_record_encode(&auth, RUN, &r, buf, sizeof(buf), &len), 0);
		assert_int_equal(mp_decl_decode(&auth, GKEY, GROUND, buf, len, &dout), -EBADMSG);
	}
}

static void test_record_encode_rejects(void **state)
{
	uint8_t buf[MP_RECORD_WIRE_MAX];
	struct mp_record r;
	size_t len;

	(void)state;
	r = sample_record();
	r.id = 0;
	assert_int_equal(mp_record_encode(&auth, RUN, &r, buf, sizeof(buf), &len), -EINVAL);
	r = sample_record();
	r.ndims = MP_MAX_GRID_DIMS + 1;
	assert_int_equal(mp_record_encode(&auth, RUN, &r, buf, sizeof(buf), &len), -EINVAL);
	r = sample_record();
	r.mode = MP_MODE_AUX + 1;
	assert_int_equal(mp_record_encode(&auth, RUN, &r, buf, sizeof(buf), &len), -EINVAL);
	r = sample_record();
	r.bye = 2;
	assert_int_equal(mp_record_encode(&auth, RUN, &r, buf, sizeof(buf), &len), -EINVAL);
	r = sample_record();
	r.bandwidth = NAN;
	assert_int_equal(mp_record_encode(&auth, RUN, &r, buf, sizeof(buf), &len), -EINVAL);
	r.bandwidth = -INFINITY;
	assert_int_equal(mp_record_encode(&auth, RUN, &r, buf, sizeof(buf), &len), -EINVAL);
	r = sample_record();
	memset(r.transport, 'x', sizeof(r.transport));
	assert_int_equal(mp_record_encode(&auth, RUN, &r, buf, sizeof(buf), &len), -EINVAL);
	r = sample_record();
	memset(r.addr, 'x', sizeof(r.addr));
	assert_int_equal(mp_record_encode(&auth, RUN, &r, buf, sizeof(buf), &len), -EINVAL);
}

/* Change byte @off of a valid record to @v and sign it again: the MAC holds,
 * so only the field checks stand between it and the caller. */
static int decode_resigned(size_t off, uint8_t v)
{
	uint8_t buf[MP_RECORD_WIRE_MAX];
	struct mp_record r = sample_record(), out;
	size_t len;

	assert_int_equal(mp_record_encode(&auth, RUN, &r, buf, sizeof(buf), &len), 0);
	buf[off] = v;
	mp_auth_mac(&auth, MP_AUTH_RECORD, &(struct mp_auth_piece){ buf, REC_MAC }, 1,
		    buf + REC_MAC);
	return mp_record_decode(&auth, RUN, buf, len, &out);
}

static void test_record_decode_validates(void **state)
{
	(void)state;
	assert_int_equal(decode_resigned(1, 1), -EBADMSG);                  /* version */
	assert_int_equal(decode_resigned(3, MP_MODE_AUX + 1), -EBADMSG);    /* mode */
	assert_int_equal(decode_resigned(4, 2), -EBADMSG);                  /* bye */
	assert_int_equal(decode_resigned(5, MP_MAX_GRID_DIMS + 1), -EBADMSG); /* ndims */
	assert_int_equal(decode_resigned(48, 1), -EBADMSG);                 /* coord past ndims */
	{
		/* bandwidth +inf, then NaN: exponent all ones */
		uint8_t buf[MP_RECORD_WIRE_MAX];
		struct mp_record r = sample_record(), out;
		size_t len;

		assert_int_equal(mp_record_encode(&auth, RUN, &r, buf, sizeof(buf), &len), 0);
		memset(buf + 58, 0, 8);
		buf[64] = 0xf0;
		buf[65] = 0x7f;
		mp_auth_mac(&auth, MP_AUTH_RECORD, &(struct mp_auth_piece){ buf, REC_MAC }, 1,
			    buf + REC_MAC);
		assert_int_equal(mp_record_decode(&auth, RUN, buf, len, &out), -EBADMSG);
		buf[58] = 1;
		mp_auth_mac(&auth, MP_AUTH_RECORD, &(struct mp_auth_piece){ buf, REC_MAC }, 1,
			    buf + REC_MAC);
		assert_int_equal(mp_record_decode(&auth, RUN, buf, len, &out), -EBADMSG);
	}
	assert_int_equal(decode_resigned(66 + 15, 'x'), -EBADMSG);         /* transport unterminated */
	assert_int_equal(decode_resigned(66 + 10, 'x'), -EBADMSG);         /* bytes after its NUL */
	assert_int_equal(decode_resigned(82 + 127, 'x'), -EBADMSG);        /* addr unterminated */
	assert_int_equal(decode_resigned(82 + 20, 'x'), -EBADMSG);         /* bytes after its NUL */
	{
		/* id 0 */
		uint8_t buf[MP_RECORD_WIRE_MAX];
		struct mp_record r = sample_record(), out;
		size_t len;

		assert_int_equal(mp_record_encode(&auth, RUN, &r, buf, sizeof(buf), &len), 0);
		memset(buf + 14, 0, 8);
		mp_auth_mac(&auth, MP_AUTH_RECORD, &(struct mp_auth_piece){ buf, REC_MAC }, 1,
			    buf + REC_MAC);
		assert_int_equal(mp_record_decode(&auth, RUN, buf, len, &out), -EBADMSG);
	}
}

static void test_decl_round_trip(void **state)
{
	struct mp_decl d = { .id = 0xfedcba9876543210ULL, .expires_ms = 1700000005000ULL,
			     .mode = MP_MODE_CLIENT, .coord = -3, .line = 0x01020304 };
	struct mp_decl out;
	uint8_t buf[MP_RECORD_WIRE_MAX], mac[MP_MAC_BYTES];
	struct mp_auth_piece pieces[2];
	size_t len;

	(void)state;
	assert_int_equal(mp_decl_encode(&auth, GKEY, GROUND, &d, buf, sizeof(buf), &len), 0);
	assert_int_equal(len, DECL_LEN);
	assert_int_equal(buf[0], 0x6d);
	assert_int_equal(buf[2], 2);
	assert_int_equal(buf[3], MP_MODE_CLIENT);
	assert_int_equal(buf[4], 0xfd);
	assert_int_equal(buf[6], 0x04);
	assert_int_equal(buf[9], 0x01);
	assert_int_equal(buf[10], 0x10);
	assert_int_equal(buf[26], GROUND);
	assert_int_equal(buf[29], 0);
	pieces[0] = (struct mp_auth_piece){ buf, DECL_MAC };
	pieces[1] = (struct mp_auth_piece){ GKEY, strlen(GKEY) };
	mp_auth_mac(&auth, MP_AUTH_DECL, pieces, 2, mac);
	assert_memory_equal(buf + DECL_MAC, mac, MP_MAC_BYTES);
	memset(&out, 0, sizeof(out));
	assert_int_equal(mp_decl_decode(&auth, GKEY, GROUND, buf, len, &out), 0);
	assert_int_equal(out.id, d.id);
	assert_int_equal(out.expires_ms, d.expires_ms);
	assert_int_equal(out.mode, d.mode);
	assert_int_equal(out.coord, d.coord);
	assert_int_equal(out.line, d.line);
	/* Another round's under a shared DHT key: told apart before the MAC,
	 * so that a reader neither verifies it nor counts it as refused. */
	memset(&out, 0, sizeof(out));
	assert_int_equal(mp_decl_decode(&auth, GKEY, GROUND + 64, buf, len, &out), -ESTALE);
	assert_int_equal(out.id, 0);
	assert_int_equal(mp_decl_encode(&auth, GKEY, GROUND, &d, buf, DECL_LEN - 1, &len), -ENOSPC);
}

static void test_decl_rejects(void **state)
{
	struct mp_decl d = { .id = 42, .expires_ms = 1700000005000ULL, .mode = 0, .coord = 1 };
	struct mp_decl out;
	uint8_t buf[MP_RECORD_WIRE_MAX], t[MP_RECORD_WIRE_MAX];
	struct mp_auth_piece pieces[2];
	size_t len;

	(void)state;
	assert_int_equal(mp_decl_encode(&auth, GKEY, GROUND, &d, buf, sizeof(buf), &len), 0);
	/* Replayed under another group key, or checked with another run key. */
	assert_int_equal(mp_decl_decode(&auth, GKEY "x", GROUND, buf, len, &out), -EACCES);
	assert_int_equal(mp_decl_decode(&auth, "round-7/dim-1/cell-4", GROUND, buf, len, &out), -EACCES);
	assert_int_equal(mp_decl_decode(&other, GKEY, GROUND, buf, len, &out), -EACCES);
	/* Every byte changed. */
	for (size_t i = 0; i < len; i++) {
		memcpy(t, buf, len);
		t[i] ^= 0x40;
		assert_int_equal(mp_decl_decode(&auth, GKEY, GROUND, t, len, &out),
				 i < 3 ? -EBADMSG : i >= 26 && i < 30 ? -ESTALE : -EACCES);
	}
	/* Lengths. */
	assert_int_equal(mp_decl_decode(&auth, GKEY, GROUND, buf, len - 1, &out), -EBADMSG);
	assert_int_equal(mp_decl_decode(&auth, GKEY, GROUND, buf, 0, &out), -EBADMSG);
	buf[len] = 0;
	assert_int_equal(mp_decl_decode(&auth, GKEY, GROUND, buf, len + 1, &out), -EBADMSG);
	/* Signed but out of range: mode, id 0. */
	pieces[0] = (struct mp_auth_piece){ buf, DECL_MAC };
	pieces[1] = (struct mp_auth_piece){ GKEY, strlen(GKEY) };
	buf[3] = MP_DECL_MOVED + 1;
	mp_auth_mac(&auth, MP_AUTH_DECL, pieces, 2, buf + DECL_MAC);
	assert_int_equal(mp_decl_decode(&auth, GKEY, GROUND, buf, len, &out), -EBADMSG);
	/* An absence (another member's word that the peer will not come), a
	 * peer's word that it is placing itself, and that it moved on. */
	buf[3] = MP_DECL_ABSENT;
	mp_auth_mac(&auth, MP_AUTH_DECL, pieces, 2, buf + DECL_MAC);
	assert_int_equal(mp_decl_decode(&auth, GKEY, GROUND, buf, len, &out), 0);
	assert_int_equal(out.mode, MP_DECL_ABSENT);
	buf[3] = MP_DECL_PLACING;
	mp_auth_mac(&auth, MP_AUTH_DECL, pieces, 2, buf + DECL_MAC);
	assert_int_equal(mp_decl_decode(&auth, GKEY, GROUND, buf, len, &out), 0);
	assert_int_equal(out.mode, MP_DECL_PLACING);
	buf[3] = MP_DECL_MOVED;
	mp_auth_mac(&auth, MP_AUTH_DECL, pieces, 2, buf + DECL_MAC);
	assert_int_equal(mp_decl_decode(&auth, GKEY, GROUND, buf, len, &out), 0);
	assert_int_equal(out.mode, MP_DECL_MOVED);
	buf[3] = 0;
	memset(buf + 10, 0, 8);
	mp_auth_mac(&auth, MP_AUTH_DECL, pieces, 2, buf + DECL_MAC);
	assert_int_equal(mp_decl_decode(&auth, GKEY, GROUND, buf, len, &out), -EBADMSG);
	/* Encoding checks the same. */
	d.id = 0;
	assert_int_equal(mp_decl_encode(&auth, GKEY, GROUND, &d, buf, sizeof(buf), &len), -EINVAL);
	d.id = 1;
	d.mode = MP_DECL_MOVED + 1;
	assert_int_equal(mp_decl_encode(&auth, GKEY, GROUND, &d, buf, sizeof(buf), &len), -EINVAL);
}

static void test_wall_ms_and_ops(void **state)
{
	uint64_t t = (uint64_t)time(NULL) * 1000u, w = mp_wall_ms();

	(void)state;
	assert_true(w + 2000 >= t && w <= t + 2000);
#ifdef MP_HAVE_DHT
	assert_non_null(mp_rdv_dht_ops);
	assert_string_equal(mp_rdv_dht_ops->name, "dht");
#else
	assert_null(mp_rdv_dht_ops);
#endif
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_record_round_trip),
		cmocka_unit_test(test_record_layout),
		cmocka_unit_test(test_record_tamper),
		cmocka_unit_test(test_record_wrong_key_and_run),
		cmocka_unit_test(test_record_other_settings),
		cmocka_unit_test(test_record_lengths),
		cmocka_unit_test(test_record_encode_rejects),
		cmocka_unit_test(test_record_decode_validates),
		cmocka_unit_test(test_decl_round_trip),
		cmocka_unit_test(test_decl_rejects),
		cmocka_unit_test(test_wall_ms_and_ops),
	};

	return cmocka_run_group_tests(tests, setup, NULL);
}
