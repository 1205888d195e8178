/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Fuzz target for what the dpdk driver reads before its reliable delivery
 * (fuzz_dpdk_rel) sees a byte (drivers/dpdk/frame.c): the Ethernet, ARP,
 * IPv4 and UDP headers of every received frame, the BYE of a memif pair,
 * and the "MAC/IPV4:PORT" address text of MP_PEERS and records. Plain C,
 * no DPDK headers: built whether or not DPDK was found.
 *
 * Input: one selector byte, then the bytes.
 *   selector % 4 = 0: a frame, classified as it came
 *                  1: a frame whose IPv4 header checksum the harness fixes
 *                     (and whose UDP checksum it clears, meaning "none"),
 *                     so that mutations get past the IP header check
 *                  2: a BYE payload (mp_bye_parse)
 *                  3: an address text (mp_dpdk_addr_parse)
 * Invariants: no crash or sanitizer report; a frame classified ours has its
 * payload inside the frame, where the UDP length says; an ARP request
 * answers; a BYE that parses is what mp_bye_build writes; an address that
 * parses formats and parses back to the same bytes.
 *
 * Built two ways, as fuzz_frame.c: libFuzzer with -DMP_LIBFUZZER, else
 * main() (fuzz_main.h) replays tests/fuzz/corpus/fuzz_dpdk_frame/ or a
 * deterministic stream of mutated valid frames.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "drivers/dpdk/frame.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
#define FUZZ_SEED 0xA4093822299F31D0ull /* the deterministic stream's start */
#include "fuzz_main.h"

static const struct mp_dpdk_addr self = {
	.mac = { 0x02, 0, 0, 0, 0, 0x01 }, .ip = { 10, 0, 0, 1 }, .port = { 0x73, 0x3c },
};
static const struct mp_dpdk_addr peer = {
	.mac = { 0x02, 0, 0, 0, 0, 0x02 }, .ip = { 10, 0, 0, 2 }, .port = { 0x73, 0x3d },
};

static void frame(const uint8_t *f, size_t len)
{
	const uint8_t *pl = NULL;
	size_t plen = 0;
	struct mp_dpdk_addr src;
	int v = mp_frame_classify(f, len, &self, &pl, &plen, &src);

	if (v < 0 || v >= MP_FRAME_NVERDICTS || !mp_frame_verdict_name(v))
		abort();
	if (v == MP_FRAME_OURS &&
	    (pl < f + MP_FRAME_HDR_LEN || plen > len || pl + plen > f + len ||
	     plen + MP_UDP_HDR_LEN != (size_t)(pl[-4] << 8 | pl[-3])))
		abort(); /* the payload lies outside the frame or its UDP length */
	if (v == MP_FRAME_ARP_REQUEST) {
		uint8_t reply[MP_ARP_FRAME_LEN];

		mp_frame_arp_reply(reply, f, &self);
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	uint8_t *b;
	size_t n;

	if (size < 1)
		return 0;
	n = size - 1;
	/* A copy of exactly the input's size (plus a NUL for text), so that
	 * ASan sees any overread. */
	b = malloc(n + 1);
	if (!b)
		abort();
	memcpy(b, data + 1, n);
	b[n] = 0;
	switch (data[0] % 4) {
	case 1:
		if (n >= MP_ETH_HDR_LEN + MP_IP4_HDR_LEN) {
			uint8_t *ip = b + MP_ETH_HDR_LEN;
			size_t ihl = (size_t)(ip[0] & 0xf) * 4;

			if (ihl >= MP_IP4_HDR_LEN && MP_ETH_HDR_LEN + ihl <= n) {
				ip[10] = ip[11] = 0;
				uint16_t c = (uint16_t)~mp_csum_fold(mp_csum_add(0, ip, ihl, 0));
				ip[10] = (uint8_t)(c >> 8);
				ip[11] = (uint8_t)c;
				if (MP_ETH_HDR_LEN + ihl + MP_UDP_HDR_LEN <= n)
					ip[ihl + 6] = ip[ihl + 7] = 0;
			}
		}
		/* fall through */
	case 0:
		frame(b, n);
		break;
	case 2: {
		int type = 0;
		uint32_t nonce = 0;
		int rc = mp_bye_parse(b, n, &type, &nonce);
		uint8_t again[MP_BYE_LEN];

		if (rc && rc != 1 && rc != -EPROTO)
			abort();
		if (!rc) {
			mp_bye_build(again, type, nonce);
			if (n != MP_BYE_LEN || memcmp(again, b, MP_BYE_LEN))
				abort();
		}
		break;
	}
	default: {
		struct mp_dpdk_addr a, back;
		char text[MP_DPDK_ADDR_STRLEN];

		if (!mp_dpdk_addr_parse((const char *)b, &a) &&
		    (mp_dpdk_addr_format(&a, text, sizeof(text)) || mp_dpdk_addr_parse(text, &back) ||
		     memcmp(&a, &back, sizeof(a))))
			abort();
	}
	}
	free(b);
	return 0;
}

#ifndef MP_LIBFUZZER
static void fuzz_stream(long iters)
{
	static uint8_t in[1 + 2048];
	long ours = 0;

	for (long i = 0; i < iters; i++) {
		size_t len, plen = (size_t)(next() % 1400);
		int kind = (int)(next() % 4);

		if (kind < 2) {
			/* A real frame from the peer to us, checksummed or not. */
			mp_frame_build(in + 1, &peer, &self, (uint16_t)next(), plen);
			for (size_t k = 0; k < plen; k++)
				in[1 + MP_FRAME_HDR_LEN + k] = (uint8_t)next();
			if (next() & 1)
				mp_frame_udp_csum(in + 1, mp_csum_add(0, in + 1 + MP_FRAME_HDR_LEN, plen, 0));
			len = MP_FRAME_HDR_LEN + plen;
		} else if (kind == 2) {
			mp_bye_build(in + 1, 1 + (int)(next() & 1), (uint32_t)next());
			len = MP_BYE_LEN;
		} else {
			struct mp_dpdk_addr a;

			for (int k = 0; k < 12; k++)
				((uint8_t *)&a)[k] = (uint8_t)next();
			if (mp_dpdk_addr_format(&a, (char *)in + 1, sizeof(in) - 1))
				abort();
			len = strlen((char *)in + 1);
		}
		int muts = seed_dir ? 0 : (int)(next() % 4);
		for (int m = 0; m < muts && len; m++) {
			switch (next() % 3) {
			case 0: in[1 + next() % len] ^= (uint8_t)(1u << (next() % 8)); break;
			case 1: in[1 + next() % (len < 64 ? len : 64)] = (uint8_t)next(); break;
			default:
				if (next() & 1)
					len = (size_t)(next() % (len + 1));
				else if (len + 16 < sizeof(in) - 1)
					len += (size_t)(next() % 16);
			}
		}
		in[0] = (uint8_t)kind;
		if (!muts && kind < 2) {
			/* Untouched: a frame the driver itself builds is ours. */
			const uint8_t *pl;
			size_t got;
			if (mp_frame_classify(in + 1, len, &self, &pl, &got, NULL) != MP_FRAME_OURS ||
			    got != plen)
				abort();
			ours++;
		}
		if (seed_dir)
			fuzz_seed(in, 1 + len);
		LLVMFuzzerTestOneInput(in, 1 + len);
	}
	printf("fuzz_dpdk_frame: %ld inputs (%ld unmutated frames), no crash\n", iters, ours);
}
#endif

