/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Wire header encoding and validation. Every field is stored and loaded byte
 * by byte in little-endian order, so the format does not depend on the host's
 * endianness, alignment or struct padding.
 */
#include "wire.h"

#include <errno.h>
#include <math.h>
#include <string.h>
#include <moshpit/sdk/le.h>

/* Byte offsets within the header. */
enum {
	OFF_MAGIC = 0,
	OFF_VERSION = 4,
	OFF_TYPE = 5,
	OFF_CODEC = 6,
	OFF_FLAGS = 7,
	OFF_RUN_ID = 8,
	OFF_ROUND = 16,
	OFF_GROUP = 20,
	OFF_SENDER = 24,
	OFF_PART = 28,
	OFF_OFFSET = 32,
	OFF_COUNT = 40,
	OFF_LENGTH = 44,
	OFF_WEIGHT = 48,
	OFF_AUX = 52,
	OFF_TOKEN = 56,
	OFF_CRC = 60,
};

static const char *const reject_names[MP_REJ_MAX] = {
	[MP_REJ_NONE] = "none",
	[MP_REJ_TRUNCATED] = "truncated",
	[MP_REJ_MAGIC] = "magic",
	[MP_REJ_VERSION] = "version",
	[MP_REJ_TYPE] = "type",
	[MP_REJ_CODEC] = "codec",
	[MP_REJ_FLAGS] = "flags",
	[MP_REJ_LENGTH] = "length",
	[MP_REJ_CHECKSUM] = "checksum",
	[MP_REJ_FOREIGN_RUN] = "foreign-run",
	[MP_REJ_UNEXPECTED] = "unexpected",
	[MP_REJ_WEIGHT] = "weight",
	[MP_REJ_AUTH] = "auth",
	[MP_REJ_TOKEN] = "token",
	[MP_REJ_STALE] = "stale",
	[MP_REJ_SETTINGS] = "settings",
	[MP_REJ_COUNT] = "count",
};

const char *mp_wire_reject_name(enum mp_wire_reject why)
{
	if ((unsigned)why >= MP_REJ_MAX || !reject_names[why])
		return "unknown";
	return reject_names[why];
}

uint64_t mp_wire_run_id(const char *run_name)
{
	uint64_t h = 0xcbf29ce484222325ULL; /* FNV-1a 64 offset basis */

	if (!run_name)
		return h;
	for (const unsigned char *p = (const unsigned char *)run_name; *p; p++) {
		h ^= *p;
		h *= 0x100000001b3ULL; /* FNV-1a 64 prime */
	}
	return h;
}

void mp_wire_encode(const struct mp_wire_hdr *h, void *buf, const void *payload)
{
	unsigned char *b = buf;
	uint32_t wbits, crc;

	memcpy(&wbits, &h->weight, sizeof(wbits));
	mp_le_put32(b + OFF_MAGIC, MP_WIRE_MAGIC);
	b[OFF_VERSION] = MP_WIRE_VERSION;
	b[OFF_TYPE] = h->type;
	b[OFF_CODEC] = h->codec;
	b[OFF_FLAGS] = h->flags;
	mp_le_put64(b + OFF_RUN_ID, h->run_id);
	mp_le_put32(b + OFF_ROUND, h->round);
	mp_le_put32(b + OFF_GROUP, h->group_id);
	mp_le_put32(b + OFF_SENDER, h->sender);
	mp_le_put32(b + OFF_PART, h->part);
	mp_le_put64(b + OFF_OFFSET, h->offset);
	mp_le_put32(b + OFF_COUNT, h->count);
	mp_le_put32(b + OFF_LENGTH, h->length);
	mp_le_put32(b + OFF_WEIGHT, wbits);
	mp_le_put32(b + OFF_AUX, h->aux);
	mp_le_put32(b + OFF_TOKEN, h->token);

	crc = mp_crc32c(0, b, OFF_CRC);
	if ((h->flags & MP_WIRE_F_PAYLOAD_CRC) && h->length)
		crc = mp_crc32c(crc, payload, h->length);
	mp_le_put32(b + OFF_CRC, crc);
}

static int reject(enum mp_wire_reject *why, enum mp_wire_reject r, int err)
{
	if (why)
		*why = r;
	return err;
}

/* The frame's header at @buf, its payload at @payload (NULL: not at hand). */
static int decode(const void *buf, size_t len, const unsigned char *payload, uint64_t run_id,
		  unsigned ncodecs, struct mp_wire_hdr *h, enum mp_wire_reject *why)
{
	const unsigned char *b = buf;
	struct mp_wire_hdr t;
	size_t avail;
	uint32_t crc, wbits;

	if (len < MP_WIRE_HDR_SIZE)
		return reject(why, MP_REJ_TRUNCATED, -EMSGSIZE);
	/* Magic and version first: a stranger or a peer of another protocol
	 * version is worth a precise reason, and is not a corrupted frame. */
	if (mp_le_get32(b + OFF_MAGIC) != MP_WIRE_MAGIC)
		return reject(why, MP_REJ_MAGIC, -EBADMSG);
	if (b[OFF_VERSION] != MP_WIRE_VERSION)
		return reject(why, MP_REJ_VERSION, -EPROTO);

	/*
	 * Then the checksum, before any other field is believed. With the
	 * payload flag the sender covered its payload too; we cover the bytes
	 * we actually got, so a frame whose payload was cut short or padded
	 * fails here as well (nothing after the header is trusted yet, not
	 * even the length field, to choose how much to checksum).
	 */
	avail = len - MP_WIRE_HDR_SIZE;
	crc = mp_crc32c(0, b, OFF_CRC);
	if (b[OFF_FLAGS] & MP_WIRE_F_PAYLOAD_CRC) {
		if (!payload)
			return reject(why, MP_REJ_CHECKSUM, -EBADMSG); /* the caller must pass it */
		crc = mp_crc32c(crc, payload, avail);
	}
	if (crc != mp_le_get32(b + OFF_CRC))
		return reject(why, MP_REJ_CHECKSUM, -EBADMSG);

	t.type = b[OFF_TYPE];
	t.codec = b[OFF_CODEC];
	t.flags = b[OFF_FLAGS];
	t.run_id = mp_le_get64(b + OFF_RUN_ID);
	t.round = mp_le_get32(b + OFF_ROUND);
	t.group_id = mp_le_get32(b + OFF_GROUP);
	t.sender = mp_le_get32(b + OFF_SENDER);
	t.part = mp_le_get32(b + OFF_PART);
	t.offset = mp_le_get64(b + OFF_OFFSET);
	t.count = mp_le_get32(b + OFF_COUNT);
	t.length = mp_le_get32(b + OFF_LENGTH);
	wbits = mp_le_get32(b + OFF_WEIGHT);
	memcpy(&t.weight, &wbits, sizeof(t.weight));
	t.aux = mp_le_get32(b + OFF_AUX);
	t.token = mp_le_get32(b + OFF_TOKEN);

	if (t.type == 0 || t.type > MP_MSG_TYPE_MAX)
		return reject(why, MP_REJ_TYPE, -EPROTO);
	if (t.codec >= ncodecs)
		return reject(why, MP_REJ_CODEC, -EPROTO);
	if (t.flags & ~MP_WIRE_F_KNOWN)
		return reject(why, MP_REJ_FLAGS, -EPROTO);
	if (t.length > MP_WIRE_MAX_PAYLOAD)
		return reject(why, MP_REJ_LENGTH, -EMSGSIZE);
	if (avail < t.length)
		return reject(why, MP_REJ_TRUNCATED, -EMSGSIZE);
	if (avail > t.length)
		return reject(why, MP_REJ_LENGTH, -EMSGSIZE);
	/* The weight scales a peer's contribution: a NaN or negative one
	 * would poison or flip every sum it enters. -0.0 compares equal to 0
	 * and is harmless. */
	if (!isfinite(t.weight) || t.weight < 0.0f)
		return reject(why, MP_REJ_WEIGHT, -EPROTO);
	if (t.run_id != run_id)
		return reject(why, MP_REJ_FOREIGN_RUN, -EPROTO);

	if (h)
		*h = t;
	return reject(why, MP_REJ_NONE, 0);
}

int mp_wire_decode(const void *buf, size_t len, uint64_t run_id, unsigned ncodecs,
		   struct mp_wire_hdr *h, enum mp_wire_reject *why)
{
	const unsigned char *payload =
		len >= MP_WIRE_HDR_SIZE ? (const unsigned char *)buf + MP_WIRE_HDR_SIZE : NULL;

	return decode(buf, len, payload, run_id, ncodecs, h, why);
}

int mp_wire_decode_header(const void *hdr, size_t len, uint64_t run_id, unsigned ncodecs,
			  struct mp_wire_hdr *h, enum mp_wire_reject *why)
{
	return decode(hdr, len, NULL, run_id, ncodecs, h, why);
}

int mp_wire_covers_payload(const void *hdr)
{
	return (((const unsigned char *)hdr)[OFF_FLAGS] & MP_WIRE_F_PAYLOAD_CRC) != 0;
}
