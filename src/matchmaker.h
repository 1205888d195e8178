/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Decentralised rounds (dht rendezvous): membership from the rendezvous,
 * the peer's grid cell, and matchmaking of each round's group.
 */
#ifndef MP_MATCHMAKER_H
#define MP_MATCHMAKER_H

#include "internal.h"

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

#endif
