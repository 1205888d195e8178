/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Decentralised rounds (dht rendezvous): membership from the rendezvous,
 * the peer's grid cell, and matchmaking of each round's group.
 */
#ifndef MP_MATCHMAKER_H
#define MP_MATCHMAKER_H

#include "rdv.h"
#include "xfer.h"

/* Largest group a roster can describe. */
#define MP_MAX_GROUP 64

/* mp_init, dht runs: start the rendezvous and publish this peer. The first
 * average then waits for cfg.npeers peers, when set, and takes a cell. */
int mp_dht_start(struct mp_ctx *ctx);
/* mp_finalize: leave (if not yet) and stop the rendezvous. */
void mp_dht_stop(struct mp_ctx *ctx);
/* cfg.rounds Moshpit rounds of @a, each matchmade (the first call places
 * the peer on the grid first). */
int mp_dht_moshpit(struct mp_ctx *ctx, struct mp_avg *a);
/* A DECL control message from @peer (ctrl.c): its own declaration for
 * h->round, taken as if read under that round's key. Malformed ones, and
 * those of rounds past, are dropped (-EBADMSG, -ESTALE). */
int mp_mm_on_decl(struct mp_ctx *ctx, int peer, const struct mp_wire_hdr *h,
		  const uint8_t *payload);
/* Declarations heard of rounds not started here yet (ctx->heard): at most
 * MP_HEARD_MAX, the oldest dropped first. */
#define MP_HEARD_MAX 256
struct mp_heard {
	uint32_t round;
	struct mp_decl d;
};
/* A PEER control message (ctrl.c): a record passed on by a peer that just
 * learnt it, taken as if read from the rendezvous (-EBADMSG when it does
 * not verify). */
int mp_mm_on_peer(struct mp_ctx *ctx, const struct mp_wire_hdr *h, const uint8_t *payload);

/* A free cell of a round: its line (the cell with the varied coordinate 0),
 * how many members declared in that line, and the free coordinate. */
struct mp_hole {
	uint32_t line, count;
	int coord;
};
/*
 * The holes of @round on grid @g from the round's @n declarations @all (those
 * of @self, absences and placings do not hold a cell), into @h (room for
 * every cell), emptiest line first but lines nobody declared in last, then
 * by line and coordinate: every
 * placer that reads the same declarations gets the same list, and placers
 * take its entries in the order of their ids (take_hole). @count and @used
 * are zeroed scratch of one entry per cell. Returns how many.
 */
int mp_mm_holes(const struct mp_grid *g, uint64_t self, uint32_t round, const struct mp_decl *all,
		int n, struct mp_hole *h, uint32_t *count, uint8_t *used);

#endif
