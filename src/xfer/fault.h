/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Fault injection for tests (MP_FAULT, cfg.fault): this peer dies, stops
 * sending or cuts its connections at a chosen point of a chosen round, so
 * that churn can be reproduced at will. Comma-separated actions:
 *
 *   kill:round=R[:until=E][:joined=J][:phase=match|scatter|gather][:after=N]
 *   stall:round=R[:until=E][:joined=J][:phase=scatter|gather][:peer=ID][:after=N]
 *   cut:round=R[:until=E][:joined=J][:phase=scatter|gather][:peer=ID][:after=N]
 *   delay:round=R[:until=E][:joined=J]:phase=announce:ms=M
 *
 * R is the global round; with until=E (> R) the action fires in the first
 * round in [R, E) in which this peer reaches that point (a peer alone in
 * round R, or not yet joined, meets it later), by default only in R; with
 * joined=J only if this peer's first round (the first it matchmade or
 * exchanged in) was J or earlier: a process that joins the run late (a
 * standby woken to replace a dead peer) skips the actions of rounds
 * before it came, whatever its plan says; phase defaults to scatter; N counts the frames of
 * that phase this peer has sent in round R (default 0: at the phase's first
 * frame); ID is a peer id in hex (static runs: the rank), default every peer.
 * A stall sends nothing more to those peers for the rest of the round but
 * keeps the connections open (they must time out); a cut closes them. A
 * delay holds a rejoining peer's announce (probe.c) for M ms (1 to 600000)
 * after it chose its join round, the round R to E stands for: the run may
 * pass that round first, as it does when the peer is descheduled there or
 * the run speeds up. Each action fires once.
 */
#ifndef MP_FAULT_H
#define MP_FAULT_H

#include <stdint.h>

struct mp_ctx;

enum mp_fault_kind { MP_FAULT_KILL, MP_FAULT_STALL, MP_FAULT_CUT, MP_FAULT_DELAY };
enum mp_fault_phase { MP_FAULT_MATCH, MP_FAULT_SCATTER, MP_FAULT_GATHER, MP_FAULT_ANNOUNCE };

struct mp_fault {
	int kind;           /* enum mp_fault_kind */
	int phase;          /* enum mp_fault_phase */
	uint32_t round;
	uint64_t until;     /* fires in a round in [round, until) */
	uint64_t after;     /* frames of the phase sent in the round before it fires */
	uint64_t joined;    /* only if this peer's first round was <= joined (default: any) */
	int all_peers;      /* stall/cut: every peer, else only @peer */
	uint64_t peer;
	uint32_t ms;        /* delay: how long */
	int fired;
	struct mp_fault *next;
};

/* mp_init: parse ctx->cfg.fault into ctx->faults (and forget the string,
 * which the caller owns). -EINVAL, with the bad action named in the init
 * error, for a spec that does not parse; -ENOMEM. */
int mp_fault_init(struct mp_ctx *ctx);
/* mp_finalize. */
void mp_fault_free(struct mp_ctx *ctx);

/* The matchmaker, before it matchmakes round @round: a kill at phase match
 * of this round raises SIGKILL here. Returns 0 otherwise. */
int mp_fault_match(struct mp_ctx *ctx, uint32_t round);

/*
 * The group all-reduce, before it sends a frame of @phase (scatter or
 * gather) in @round, having sent @sent of them in the round so far: the next
 * action due now, marked fired and logged, or NULL. A kill does not return
 * (SIGKILL); the caller applies a stall or cut, and asks again until NULL.
 */
const struct mp_fault *mp_fault_due(struct mp_ctx *ctx, uint32_t round, int phase, uint64_t sent);

/* A rejoining peer, between choosing join round @join and announcing it:
 * the milliseconds a delay due for @join holds the announce (marked fired
 * and logged), or 0. */
uint32_t mp_fault_announce(struct mp_ctx *ctx, uint32_t join);

#endif
