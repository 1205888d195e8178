/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Wire format: every message starts with a 64-byte little-endian header
 * (doc/protocol.md). Decoding validates every field before anything else
 * looks at the frame, so a bad frame can never reach a user buffer.
 */
#ifndef MP_WIRE_H
#define MP_WIRE_H

#include "crc32c.h"
#include <stddef.h>
#include <stdint.h>

#define MP_WIRE_MAGIC 0x4850534dU /* bytes "MSPH" on the wire */
#define MP_WIRE_VERSION 8
#define MP_WIRE_HDR_SIZE 64
#define MP_WIRE_MAX_PAYLOAD (1u << 30)

enum mp_msg_type {
	MP_MSG_HELLO = 1,   /* first message of a connection: run, sender, stream */
	MP_MSG_SCATTER = 2, /* a contribution to the receiver's part (reduce-scatter) */
	MP_MSG_GATHER = 3,  /* a reduced chunk of the sender's part (all-gather) */
	MP_MSG_RING_RS = 4, /* ring all-reduce, reduce-scatter step */
	MP_MSG_RING_AG = 5, /* ring all-reduce, all-gather step */
	MP_MSG_BYE = 6,     /* orderly leave (control connection) */
	MP_MSG_CHALLENGE = 7, /* acceptor's answer to HELLO: its nonce and MAC */
	MP_MSG_AUTH = 8,    /* dialer's answer to CHALLENGE: its MAC */
	MP_MSG_JOIN = 9,    /* matchmaking: follower asks the leader for a place */
	MP_MSG_BEGIN = 10,  /* matchmaking: leader's confirmed roster, group id */
	MP_MSG_REJECT = 11, /* matchmaking: leader refuses or disbands (aux: reason) */
	MP_MSG_ACCEPT = 12, /* matchmaking: leader took the JOIN; BEGIN follows by its deadline */
	MP_MSG_DECL = 13,   /* matchmaking: a declaration for a round, as on the DHT */
	MP_MSG_PEER = 14,   /* membership: a new peer's record, as on the DHT, passed on */
	MP_MSG_OPEN = 15,   /* first frame on each channel of an exchange: the element count */
	MP_MSG_RATE = 16,   /* MP_BALANCE=measured: a member's throughput (offset, B/s) */
	MP_MSG_DIRECT = 17, /* direct exchange (short vectors): a member's whole vector */
	MP_MSG_PAIR = 18,   /* pairwise exchange (short vectors): a sum, its set and weights */
	MP_MSG_TYPE_MAX = MP_MSG_PAIR,
};

#define MP_WIRE_F_PAYLOAD_CRC 0x01u /* checksum covers the payload too */
/* GATHER: the reducer left the receiver's contribution out, as it held NaN
 * or infinity (MP_CHECK_FINITE); OPEN: the sender holds such values. */
#define MP_WIRE_F_NONFINITE 0x02u
#define MP_WIRE_F_KNOWN (MP_WIRE_F_PAYLOAD_CRC | MP_WIRE_F_NONFINITE)

/* Host view of the header. Byte offsets on the wire are given per field. */
struct mp_wire_hdr {
	/*  0 u32 magic, 4 u8 version: implied */
	uint8_t type;     /*  5 */
	uint8_t codec;    /*  6 wire id of the payload's codec */
	uint8_t flags;    /*  7 */
	uint64_t run_id;  /*  8 hash of the run name */
	uint32_t round;   /* 16 global round number */
	uint32_t group_id;/* 20 */
	uint32_t sender;  /* 24 sender's rank */
	uint32_t part;    /* 28 part index (ring: step) */
	uint64_t offset;  /* 32 first element of the chunk, within the whole vector */
	uint32_t count;   /* 40 fp32 elements the payload encodes */
	uint32_t length;  /* 44 payload bytes after the header */
	float weight;     /* 48 weight of the contribution (gather/ring: total weight) */
	uint32_t aux;     /* 52 type-specific: HELLO stream index; GATHER/RING contributors */
	uint32_t token;   /* 56 session token of the connection (0 during the handshake) */
	/* 60 u32 CRC32C of bytes 0..59 (+ payload) */
};

/* Why a frame was rejected; each has a counter. */
enum mp_wire_reject {
	MP_REJ_NONE = 0,
	MP_REJ_TRUNCATED,   /* shorter than a header, or than header + length */
	MP_REJ_MAGIC,
	MP_REJ_VERSION,
	MP_REJ_TYPE,
	MP_REJ_CODEC,
	MP_REJ_FLAGS,       /* unknown flag bits or reserved field not zero */
	MP_REJ_LENGTH,      /* length too large or not matching the frame */
	MP_REJ_CHECKSUM,
	MP_REJ_FOREIGN_RUN,
	MP_REJ_UNEXPECTED,  /* valid frame, but not what this connection expects now */
	MP_REJ_WEIGHT,      /* weight negative, NaN or infinite */
	MP_REJ_AUTH,        /* handshake MAC wrong: the peer lacks the run key */
	MP_REJ_TOKEN,       /* frame with another connection's session token */
	MP_REJ_STALE,       /* frame of an exchange this peer has left (an earlier round) */
	MP_REJ_SETTINGS,    /* handshake: the peer's run-shared settings differ from ours */
	MP_REJ_COUNT,       /* OPEN: the peer averages another number of values */
	MP_REJ_MAX,
};

/* Name of a reject reason, for logs. */
const char *mp_wire_reject_name(enum mp_wire_reject why);

/* Run name to run id (64-bit FNV-1a). */
uint64_t mp_wire_run_id(const char *run_name);

/*
 * Write the header for @h into @buf (MP_WIRE_HDR_SIZE bytes). If h->flags has
 * MP_WIRE_F_PAYLOAD_CRC, @payload (h->length bytes) is included in the CRC.
 */
void mp_wire_encode(const struct mp_wire_hdr *h, void *buf, const void *payload);

/*
 * Validate the frame in @buf (@len bytes: header then payload) and fill @h.
 * Checks magic, version, type, codec (< @ncodecs), flags, reserved, length ==
 * len - header, checksum, then run id against @run_id.
 * Returns 0, or -EBADMSG / -EPROTO / -EMSGSIZE with *why set.
 */
int mp_wire_decode(const void *buf, size_t len, uint64_t run_id, unsigned ncodecs,
		   struct mp_wire_hdr *h, enum mp_wire_reject *why);
/*
 * As mp_wire_decode, for a frame of @len bytes whose payload is not at
 * hand (it landed in device memory): @hdr holds its header alone. A frame
 * whose checksum covers its payload is refused (MP_REJ_CHECKSUM): pass
 * that one whole to mp_wire_decode.
 */
int mp_wire_decode_header(const void *hdr, size_t len, uint64_t run_id, unsigned ncodecs,
			  struct mp_wire_hdr *h, enum mp_wire_reject *why);
/* Whether the header at @hdr (MP_WIRE_HDR_SIZE bytes, not yet validated)
 * asks for its payload to be checksummed too: then the payload must be at
 * hand for mp_wire_decode. */
int mp_wire_covers_payload(const void *hdr);

#endif
