/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Ethernet/IPv4/UDP framing for the dpdk driver, on plain bytes: building
 * the 42-byte header in front of a reliable-delivery segment, classifying a
 * received frame (ours, an ARP request to answer, or dropped for a counted
 * reason) and building the ARP reply. Nothing here needs DPDK, so the rules
 * are unit-tested without EAL (tests/unit/test_dpdk_frame.c).
 *
 * Addresses: a peer is a MAC, an IPv4 address and a UDP port. The driver's
 * address blob is struct mp_dpdk_addr; its text form is "MAC/IPV4:PORT",
 * e.g. "02-00-00-00-00-01/10.77.0.1:7000". The MAC is written with dashes
 * because hostfile lines with more than one ':' read as IPv6 hosts; colons
 * are accepted too.
 */
#ifndef MP_DPDK_FRAME_H
#define MP_DPDK_FRAME_H

#include <stddef.h>
#include <stdint.h>

#define MP_ETH_HDR_LEN 14
#define MP_IP4_HDR_LEN 20
#define MP_UDP_HDR_LEN 8
/* Header of every frame we send: Ethernet + IPv4 (no options) + UDP. */
#define MP_FRAME_HDR_LEN (MP_ETH_HDR_LEN + MP_IP4_HDR_LEN + MP_UDP_HDR_LEN)
#define MP_ARP_FRAME_LEN (MP_ETH_HDR_LEN + 28)
#define MP_DPDK_ADDR_STRLEN 40

/* Address blob: moved between hosts, so byte arrays only (network order). */
struct mp_dpdk_addr {
	uint8_t mac[6];
	uint8_t ip[4];
	uint8_t port[2];
};
_Static_assert(sizeof(struct mp_dpdk_addr) == 12, "mp_dpdk_addr must stay packed");

/* Why a received frame was not handed to reliable delivery. */
enum mp_frame_verdict {
	MP_FRAME_OURS = 0,     /* UDP to our IP and port: payload goes to rel */
	MP_FRAME_ARP_REQUEST,  /* ARP who-has our IP: answer it */
	MP_FRAME_NOT_FOR_US,   /* another destination MAC or IP (or an ARP not for us) */
	MP_FRAME_NOT_IP,       /* neither IPv4 nor ARP (IPv6, LLDP, VLAN-tagged...) */
	MP_FRAME_BAD_IP,       /* truncated, bad version/IHL/length, bad header checksum */
	MP_FRAME_FRAGMENT,     /* IPv4 fragment: we never send them, so not ours */
	MP_FRAME_NOT_UDP,      /* another IP protocol */
	MP_FRAME_OTHER_PORT,   /* UDP to another port of our address */
	MP_FRAME_BAD_UDP,      /* UDP length inconsistent or checksum wrong */
	MP_FRAME_NVERDICTS
};

/* Names of the verdicts, for logs and the stats file ("ours", "arp_request", ...). */
const char *mp_frame_verdict_name(int v);

/* Parse "MAC/IPV4:PORT" (MAC bytes split by '-' or ':', port 1..65535). 0 or -EINVAL. */
int mp_dpdk_addr_parse(const char *text, struct mp_dpdk_addr *a);
/* Format as "MAC/IPV4:PORT" with a dashed MAC; -ENOSPC if @cap is too small. */
int mp_dpdk_addr_format(const struct mp_dpdk_addr *a, char *text, size_t cap);

/*
 * Write the Ethernet/IPv4/UDP header for @payload_len bytes from @src to
 * @dst into @hdr (MP_FRAME_HDR_LEN bytes). The IPv4 header checksum is
 * always filled; the UDP checksum is left 0 ("none", valid for IPv4) and
 * mp_frame_udp_csum fills it when the driver is asked to.
 */
void mp_frame_build(uint8_t *hdr, const struct mp_dpdk_addr *src, const struct mp_dpdk_addr *dst,
		    uint16_t ip_id, size_t payload_len);

/*
 * Add @len bytes that start @offset bytes into the checksummed stream to a
 * running one's-complement sum (start with 0). Pieces may have any length:
 * one that starts at an odd offset is byte-swapped into place.
 */
uint32_t mp_csum_add(uint32_t sum, const void *data, size_t len, size_t offset);
/* Fold a running sum into the 16-bit one's complement (not inverted). */
uint16_t mp_csum_fold(uint32_t sum);
/*
 * Fill the UDP checksum of a frame header built by mp_frame_build, given the
 * running sum over the payload bytes (mp_csum_add from 0, offsets counted
 * from the first payload byte).
 */
void mp_frame_udp_csum(uint8_t *hdr, uint32_t payload_sum);

/*
 * Classify a received frame of @len bytes addressed to @self. On
 * MP_FRAME_OURS *payload / *payload_len give the UDP payload and *src the
 * sender's MAC, IP and UDP port. A non-zero UDP checksum is verified
 * (a zero one means "none").
 */
int mp_frame_classify(const uint8_t *frame, size_t len, const struct mp_dpdk_addr *self,
		      const uint8_t **payload, size_t *payload_len, struct mp_dpdk_addr *src);

/*
 * Build into @out (MP_ARP_FRAME_LEN bytes) the ARP reply from @self to the
 * request @req (classified MP_FRAME_ARP_REQUEST).
 */
void mp_frame_arp_reply(uint8_t *out, const uint8_t *req, const struct mp_dpdk_addr *self);

/*
 * Leaving a memif pair (doc/dpdk.md, "Leaving a memif pair"; doc/protocol.md):
 * the UDP payload of a BYE and of its acknowledgement. 12 bytes: magic
 * 0x424d (the bytes "MB"; rel's segments start "MR"), version 1, type,
 * the BYE's nonce (echoed by its ACK), 4 bytes that must be 0.
 */
#define MP_BYE_LEN 12
enum { MP_BYE = 1, MP_BYE_ACK = 2 };

void mp_bye_build(uint8_t *p, int type, uint32_t nonce);
/*
 * 1: @p is not a BYE (another magic, or too short to carry one); 0: a valid
 * BYE or ACK, *type and *nonce set; -EPROTO: the magic with another version,
 * type, length or non-zero reserved bytes (dropped and counted).
 */
int mp_bye_parse(const uint8_t *p, size_t len, int *type, uint32_t *nonce);

#endif
