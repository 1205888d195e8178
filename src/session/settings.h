/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The settings that the peers of a run must share (doc/protocol.md,
 * "Settings agreement"): they decide how a vector is cut into parts, chunks
 * and streams, which rounds run, and how values are encoded. Two peers that
 * differ in any of them compute different plans, and every frame between
 * them would be refused as unexpected, or worse, accepted into the wrong
 * place. So each connection's handshake carries this peer's settings (HELLO
 * and CHALLENGE), both sides compare them before anything else is done, and
 * a difference is refused on both sides with the field named.
 *
 * What only paces this peer is not here: the timeouts, and the backoff of
 * the failure memory's probes (MP_PROBE_MIN_MS, MP_PROBE_MAX_MS; peers.c
 * says why a peer may probe less often than the others).
 *
 * On the wire the settings are a list of entries (tag u8, length u8, value),
 * so that a field can be added (the failure-memory work adds the sender's
 * current round) without breaking the others: a reader skips tags it does
 * not know, and compares only the fields the table in settings.c marks as
 * shared.
 */
#ifndef MP_SETTINGS_H
#define MP_SETTINGS_H

#include <stddef.h>
#include <stdint.h>
#include <moshpit/moshpit.h>

#include "codec.h"
#include "grid.h"

/* Most bytes the encoded settings take (the handshake reserves this). */
#define MP_SETTINGS_MAX 192
/* A bandwidth list short enough to be carried (and named) as text. */
#define MP_SETTINGS_BW_TEXT 48

struct mp_settings {
	uint8_t algo;            /* enum mp_algo */
	uint8_t ndims;           /* effective grid: MP_GRID, or chosen from npeers */
	uint16_t dims[MP_MAX_GRID_DIMS];
	uint32_t rounds;         /* effective: MP_ROUNDS, or the grid's dims */
	uint8_t codec;           /* configured policy: a wire id, or 255 for auto */
	uint32_t codec_block;    /* the parameters of that codec (0 where it has none) */
	float codec_sigmas;
	float topk_ratio;
	uint32_t adacomp_bin;
	uint64_t chunk_elems;
	uint32_t streams;
	uint32_t npeers;         /* 0: not set (dht runs) */
	uint64_t bw_fp;          /* static runs: fingerprint of MP_BANDWIDTHS per rank */
	char bw_text[MP_SETTINGS_BW_TEXT]; /* the list itself when short, else "" */
	uint64_t min_part;
	uint8_t check_finite;
	uint8_t balance;         /* enum mp_balance: measured parts need every member's figures */
	uint8_t dynamic;         /* dht rendezvous: npeers and bandwidths may differ */
	uint64_t direct_max;     /* MP_DIRECT_MAX: which vectors take the direct exchange */
	uint8_t direct_pairs;    /* MP_DIRECT_PAIRS: groups of 4-64 exchange sums in pairs */
	uint32_t present;        /* bit per tag (1 << tag) decoded */
};

/* A context's settings, from its resolved configuration @cfg and what
 * mp_init derived from it (once the grid and the bandwidths are known):
 * the grid, the streams, the chunk length, the codec policy and its
 * parameters, and in a static run (@bw non-NULL) every rank's bandwidth. */
void mp_settings_make(struct mp_settings *s, const struct mp_config *cfg, const struct mp_grid *grid,
		      int streams, size_t chunk_elems, int codec, const struct mp_codec_params *cp,
		      const double *bw, int npeers, int dynamic);

/* Encode @s into @buf (at most MP_SETTINGS_MAX bytes); returns the length. */
size_t mp_settings_encode(const struct mp_settings *s, uint8_t *buf);

/* Decode @len bytes; unknown tags are skipped. 0 or -EBADMSG (an entry runs
 * past the end, or a known tag has the wrong length). */
int mp_settings_decode(const uint8_t *buf, size_t len, struct mp_settings *s);

/*
 * Compare ours with theirs. 0 when they agree; else -EBADE with @msg set to
 * "<field> differs: ours <value>, theirs <value>" for the first field that
 * differs. npeers is compared only when both set it, bandwidths only in
 * static runs (in a dht run each peer announces its own).
 */
int mp_settings_diff(const struct mp_settings *ours, const struct mp_settings *theirs, char *msg,
		     size_t len);

/* 64-bit fingerprint of the fields every peer of a dht run must share (npeers
 * and bandwidths left out), for the rendezvous records. Never 0. */
uint64_t mp_settings_fingerprint(const struct mp_settings *s);

#endif
