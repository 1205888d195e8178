/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * What peers of a dht run put on the rendezvous: membership records and
 * matchmaking declarations, fixed layouts, all integers little-endian.
 *
 * Record (kind 1), 250 bytes:
 *
 *   off  size  field
 *     0     1  magic 0x6d ('m')
 *     1     1  version 4
 *     2     1  kind 1
 *     3     1  mode (enum mp_mode, <= MP_MODE_AUX)
 *     4     1  bye (0 or 1)
 *     5     1  ndims (<= MP_MAX_GRID_DIMS)
 *     6     8  run id: 64-bit FNV-1a of the run name (mp_wire_run_id)
 *    14     8  id (never 0)
 *    22     8  seq
 *    30     8  expires_ms (wall clock)
 *    38     4  round
 *    42    16  coords: MP_MAX_GRID_DIMS int16, those past ndims are 0
 *    58     8  bandwidth: IEEE-754 binary64 bits, finite
 *    66    16  transport: NUL-terminated, zero-padded
 *    82   128  addr: NUL-terminated, zero-padded
 *   210     8  settings: fingerprint of the run-shared settings (settings.h)
 *   218    32  MAC = mp_auth_mac(MP_AUTH_RECORD, bytes 0..217)
 *
 * Declaration (kind 2), 62 bytes:
 *
 *     0     1  magic 0x6d
 *     1     1  version 4
 *     2     1  kind 2
 *     3     1  mode (<= MP_MODE_AUX, MP_DECL_ABSENT, MP_DECL_PLACING or MP_DECL_MOVED)
 *     4     2  coord (int16)
 *     6     4  line (uint32)
 *    10     8  id (never 0)
 *    18     8  expires_ms (wall clock)
 *    26     4  round: the round of its group key (0 for a key without one)
 *    30    32  MAC = mp_auth_mac(MP_AUTH_DECL, bytes 0..29, group key)
 *
 * The group key is a second MAC piece, not stored: a declaration copied
 * under another key does not verify there. The round is stored because
 * the dht rendezvous keeps the declarations of rounds ROUND_SLOTS apart
 * under one DHT key (rdv_dht.c, "Round slots"): a reader tells another
 * round's declaration (-ESTALE, not verified, not a refusal) from a forged
 * one by it. Decoding checks length, magic, version and kind (-EBADMSG),
 * a declaration's round (-ESTALE), then the MAC (-EACCES), then the run id of a
 * record (-EPROTO: a peer holding the key but in another run), then its
 * settings fingerprint against the reader's (-EBADE: a peer of this run
 * configured otherwise, which no handshake with it would accept; the
 * reader counts it), then every field, padding included (-EBADMSG), so that
 * one value has one encoding.
 */
#include <errno.h>
#include <math.h>
#include <string.h>
#include <time.h>
#include <moshpit/sdk/le.h>

#include "mp_build_config.h"
#include "rdv.h"
#include "wire.h"

#define MAGIC 0x6d
#define VERSION 4
#define KIND_RECORD 1
#define KIND_DECL 2

#define R_MODE 3
#define R_BYE 4
#define R_NDIMS 5
#define R_RUN 6
#define R_ID 14
#define R_SEQ 22
#define R_EXPIRES 30
#define R_ROUND 38
#define R_COORDS 42
#define R_BW (R_COORDS + 2 * MP_MAX_GRID_DIMS)
#define R_TRANSPORT (R_BW + 8)
#define TRANSPORT_LEN 16
#define R_ADDR (R_TRANSPORT + TRANSPORT_LEN)
#define R_SETTINGS (R_ADDR + MP_ADDR_STRLEN)
#define R_MAC (R_SETTINGS + 8)
#define RECORD_LEN (R_MAC + MP_MAC_BYTES)

#define D_MODE 3
#define D_COORD 4
#define D_LINE 6
#define D_ID 10
#define D_EXPIRES 18
#define D_ROUND 26
#define D_MAC 30
#define DECL_LEN (D_MAC + MP_MAC_BYTES)

_Static_assert(RECORD_LEN == 250, "record layout as documented");
_Static_assert(RECORD_LEN <= MP_RECORD_WIRE_MAX, "a record fits MP_RECORD_WIRE_MAX");
_Static_assert(DECL_LEN <= MP_RECORD_WIRE_MAX, "a declaration fits MP_RECORD_WIRE_MAX");
_Static_assert(sizeof(((struct mp_record *)0)->transport) == TRANSPORT_LEN, "transport field");
_Static_assert(sizeof(((struct mp_record *)0)->addr) == MP_ADDR_STRLEN, "addr field");

#ifndef MP_HAVE_DHT
const struct mp_rdv_ops *const mp_rdv_dht_ops = NULL;
#endif

/* Copy string @s into a zero-padded field of @len bytes; -EINVAL if it does
 * not fit with its NUL. */
static int put_str(uint8_t *p, size_t len, const char *s)
{
	size_t n = strnlen(s, len);

	if (n == len)
		return -EINVAL;
	memset(p, 0, len);
	memcpy(p, s, n);
	return 0;
}

/* A field written by put_str: a NUL within it and nothing but NULs after. */
static int get_str(const uint8_t *p, size_t len, char *s)
{
	size_t n = strnlen((const char *)p, len);

	if (n == len)
		return -EBADMSG;
	for (size_t i = n; i < len; i++)
		if (p[i])
			return -EBADMSG;
	memcpy(s, p, n + 1);
	return 0;
}

int mp_record_encode(const struct mp_auth *a, const char *run_name, const struct mp_record *r,
		     uint8_t *buf, size_t cap, size_t *len)
{
	uint64_t bw;

	if (!r->id || r->mode > MP_MODE_AUX || r->bye > 1 || r->ndims > MP_MAX_GRID_DIMS ||
	    !isfinite(r->bandwidth))
		return -EINVAL;
	if (cap < RECORD_LEN)
		return -ENOSPC;
	memset(buf, 0, RECORD_LEN);
	buf[0] = MAGIC;
	buf[1] = VERSION;
	buf[2] = KIND_RECORD;
	buf[R_MODE] = r->mode;
	buf[R_BYE] = r->bye;
	buf[R_NDIMS] = r->ndims;
	mp_le_put64(buf + R_RUN, mp_wire_run_id(run_name));
	mp_le_put64(buf + R_ID, r->id);
	mp_le_put64(buf + R_SEQ, r->seq);
	mp_le_put64(buf + R_EXPIRES, r->expires_ms);
	mp_le_put32(buf + R_ROUND, r->round);
	for (int i = 0; i < r->ndims; i++)
		mp_le_put16(buf + R_COORDS + 2 * i, (uint16_t)r->coords[i]);
	memcpy(&bw, &r->bandwidth, sizeof(bw));
	mp_le_put64(buf + R_BW, bw);
	/* The writer's settings: its own, not the record's (a record passed
	 * on keeps the fingerprint it was signed with). */
	mp_le_put64(buf + R_SETTINGS, r->settings ? r->settings : a->settings_fp);
	if (put_str(buf + R_TRANSPORT, TRANSPORT_LEN, r->transport) ||
	    put_str(buf + R_ADDR, MP_ADDR_STRLEN, r->addr))
		return -EINVAL;
	mp_auth_mac(a, MP_AUTH_RECORD, &(struct mp_auth_piece){ buf, R_MAC }, 1, buf + R_MAC);
	*len = RECORD_LEN;
	return 0;
}

int mp_record_decode(const struct mp_auth *a, const char *run_name, const uint8_t *buf,
		     size_t len, struct mp_record *out)
{
	struct mp_record r;
	uint64_t bw;

	if (len != RECORD_LEN || buf[0] != MAGIC || buf[1] != VERSION || buf[2] != KIND_RECORD)
		return -EBADMSG;
	if (mp_auth_verify(a, MP_AUTH_RECORD, &(struct mp_auth_piece){ buf, R_MAC }, 1,
			   buf + R_MAC))
		return -EACCES;
	if (mp_le_get64(buf + R_RUN) != mp_wire_run_id(run_name))
		return -EPROTO;
	if (a->settings_fp && mp_le_get64(buf + R_SETTINGS) != a->settings_fp)
		return -EBADE;
	memset(&r, 0, sizeof(r));
	r.settings = mp_le_get64(buf + R_SETTINGS);
	r.mode = buf[R_MODE];
	r.bye = buf[R_BYE];
	r.ndims = buf[R_NDIMS];
	r.id = mp_le_get64(buf + R_ID);
	r.seq = mp_le_get64(buf + R_SEQ);
	r.expires_ms = mp_le_get64(buf + R_EXPIRES);
	r.round = mp_le_get32(buf + R_ROUND);
	if (!r.id || r.mode > MP_MODE_AUX || r.bye > 1 || r.ndims > MP_MAX_GRID_DIMS)
		return -EBADMSG;
	for (int i = 0; i < MP_MAX_GRID_DIMS; i++) {
		uint16_t c = mp_le_get16(buf + R_COORDS + 2 * i);

		if (i >= r.ndims && c)
			return -EBADMSG;
		r.coords[i] = (int16_t)c;
	}
	bw = mp_le_get64(buf + R_BW);
	memcpy(&r.bandwidth, &bw, sizeof(bw));
	if (!isfinite(r.bandwidth) || get_str(buf + R_TRANSPORT, TRANSPORT_LEN, r.transport) ||
	    get_str(buf + R_ADDR, MP_ADDR_STRLEN, r.addr))
		return -EBADMSG;
	*out = r;
	return 0;
}

int mp_decl_cmp(const void *a, const void *b)
{
	const struct mp_decl *x = a, *y = b;

	if (x->expires_ms != y->expires_ms)
		return x->expires_ms < y->expires_ms ? -1 : 1;
	return x->id < y->id ? -1 : x->id > y->id;
}

int mp_decl_encode(const struct mp_auth *a, const char *key, uint32_t round,
		   const struct mp_decl *d, uint8_t *buf, size_t cap, size_t *len)
{
	struct mp_auth_piece pieces[2];

	if (!key || !d->id || d->mode > MP_DECL_MOVED)
		return -EINVAL;
	if (cap < DECL_LEN)
		return -ENOSPC;
	buf[0] = MAGIC;
	buf[1] = VERSION;
	buf[2] = KIND_DECL;
	buf[D_MODE] = d->mode;
	mp_le_put16(buf + D_COORD, (uint16_t)d->coord);
	mp_le_put32(buf + D_LINE, d->line);
	mp_le_put64(buf + D_ID, d->id);
	mp_le_put64(buf + D_EXPIRES, d->expires_ms);
	mp_le_put32(buf + D_ROUND, round);
	pieces[0] = (struct mp_auth_piece){ buf, D_MAC };
	pieces[1] = (struct mp_auth_piece){ key, strlen(key) };
	mp_auth_mac(a, MP_AUTH_DECL, pieces, 2, buf + D_MAC);
	*len = DECL_LEN;
	return 0;
}

int mp_decl_decode(const struct mp_auth *a, const char *key, uint32_t round, const uint8_t *buf,
		   size_t len, struct mp_decl *out)
{
	struct mp_auth_piece pieces[2];
	struct mp_decl d;

	if (!key)
		return -EINVAL;
	if (len != DECL_LEN || buf[0] != MAGIC || buf[1] != VERSION || buf[2] != KIND_DECL)
		return -EBADMSG;
	if (mp_le_get32(buf + D_ROUND) != round)
		return -ESTALE;
	pieces[0] = (struct mp_auth_piece){ buf, D_MAC };
	pieces[1] = (struct mp_auth_piece){ key, strlen(key) };
	if (mp_auth_verify(a, MP_AUTH_DECL, pieces, 2, buf + D_MAC))
		return -EACCES;
	memset(&d, 0, sizeof(d));
	d.mode = buf[D_MODE];
	d.coord = (int16_t)mp_le_get16(buf + D_COORD);
	d.line = mp_le_get32(buf + D_LINE);
	d.id = mp_le_get64(buf + D_ID);
	d.expires_ms = mp_le_get64(buf + D_EXPIRES);
	if (!d.id || d.mode > MP_DECL_MOVED)
		return -EBADMSG;
	*out = d;
	return 0;
}
