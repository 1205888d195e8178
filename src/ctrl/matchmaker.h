/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Decentralised rounds (dht rendezvous): membership from the rendezvous,
 * the peer's grid cell, and matchmaking of each round's group.
 */
#ifndef MP_MATCHMAKER_H
#define MP_MATCHMAKER_H

#include "rdv.h"
#include "xfer.h"

/* Declarations heard of rounds not started here yet (mp_dht.heard): at most
 * MP_HEARD_MAX, the oldest dropped first. */
#define MP_HEARD_MAX 256
struct mp_heard {
	uint32_t round;
	struct mp_decl d;
};

/*
 * The state of a dht run, the control plane's own (ctx->dht): the
 * rendezvous, this peer's cell, and what the matchmaker carries from round
 * to round. Only src/ctrl and the core see inside it.
 */
struct mp_dht {
	struct mp_ctx *ctx;
	const struct mp_rdv_ops *rdv;
	void *rdv_st;
	int coords[MP_MAX_GRID_DIMS]; /* this peer's grid cell */
	struct mp_record *recs;       /* scratch for the rendezvous' member list */
	int nrecs;                    /* records in recs (the last sync) */
	uint64_t published_ns;        /* when the record was last republished */
	int placed;                   /* has a grid cell (after the starting set) */
	int need_probe;               /* ask peers for the run's round */
	int synced;                   /* a joiner asked before its first round */
	int displaced;                /* shares its cell; looks for a hole next round */
	uint32_t round_hint;          /* the largest round a peer said it is at */
	uint32_t mm_round;            /* the round being matched or placed in; older
	                                 declarations over control connections are dropped */
	struct mp_heard *heard;       /* declarations of rounds not started here yet */
	int nheard;
	uint32_t kept_round;          /* 1 + the round whose key take_hole kept, or 0 */
	uint32_t decl_round;          /* the largest round a DECL was heard for */
	uint32_t jumped_to;           /* the round a round hint last moved us to */
	int place_stay;               /* MP_DHT_PLACE_STAY=1: a placer stays for the lines
	                                 that wait for it (take_hole) */
	uint64_t suspects_seen;       /* ctx->suspects when the round was last told */
	double bw[MP_MAX_GROUP];      /* the roster of the group formed last */
	uint8_t mode[MP_MAX_GROUP];
	/* mp_rank and mp_npeers (atomic: set by whichever thread places the
	 * peer, read by the caller's): this peer's index among the sorted ids
	 * of the members seen when it placed itself, and their count; -1 and
	 * 0 until then. */
	int join_rank, join_npeers;
	/* Refusals seen above the rendezvous (mp_dht_count_refused), by enum
	 * mp_rdv_refusal; the join's error adds them to the rendezvous' own. */
	uint64_t refused_by[MP_RDV_REFUSED_N];
};

/* One member as JOIN and BEGIN describe it. */
struct mp_mm_entry {
	uint64_t id;
	double bw;
	int mode;
	int coord;
	char addr[MP_ADDR_STRLEN];
};

/*
 * The payload parsers of the matchmaking messages, apart from the handlers
 * that judge what they say against the run (exposed for tests/fuzz):
 * a JOIN's entry (bytes past it are ignored), a BEGIN's roster (u32 k in
 * [1, MP_MAX_GROUP], k entries, nothing after; @ro holds MP_MAX_GROUP), a
 * DECL's fields (exactly 23 bytes; the values are the handler's to check).
 * An entry has a non-zero id, a finite bandwidth, a mode <= MP_MODE_AUX and
 * an address shorter than MP_ADDR_STRLEN. 0 or -EBADMSG.
 */
int mp_mm_join_parse(const uint8_t *p, size_t len, struct mp_mm_entry *e);
int mp_mm_begin_parse(const uint8_t *p, size_t len, struct mp_mm_entry *ro, int *k);
int mp_mm_decl_parse(const uint8_t *p, size_t len, struct mp_decl *d);

/* The matchmaker as the context's grouping (ctx->grouping, state ctx->dht):
 * each round's group is matchmade through the rendezvous. */
extern const struct mp_grouping_ops mp_dht_grouping_ops;

/* mp_init, dht runs: start the rendezvous, publish this peer and make the
 * matchmaker the context's grouping. The first average then waits for
 * cfg.npeers peers, when set, and takes a cell. */
int mp_dht_start(struct mp_ctx *ctx);
/* mp_init, dht runs with cfg.npeers: wait until that many authenticated
 * peers are seen (or cfg.join_timeout_ms, with an error naming how many
 * were seen and how many records were refused, and why), then take a cell.
 * Without cfg.npeers the first average does this instead. */
int mp_dht_join(struct mp_ctx *ctx);
/* Count a refusal (enum mp_rdv_refusal) for the join's error message; for
 * checks above the rendezvous that refuse a peer's record or word. Thread
 * safe. */
void mp_dht_count_refused(struct mp_dht *dht, int reason);
/* mp_finalize: stop the rendezvous and free ctx->dht. */
void mp_dht_stop(struct mp_ctx *ctx);
/* The address others bootstrap from (mp_dht_address); -ENOTSUP if none. */
int mp_mm_address(struct mp_ctx *ctx, char *buf, size_t len);
/* mp_leave: say BYE to every peer and withdraw our record. */
void mp_mm_leave(struct mp_ctx *ctx);
/* A DECL control message from @peer (ctrl.c): its own declaration for
 * h->round, taken as if read under that round's key. Malformed ones, and
 * those of rounds past, are dropped (-EBADMSG, -ESTALE). */
int mp_mm_on_decl(struct mp_ctx *ctx, int peer, const struct mp_wire_hdr *h,
		  const uint8_t *payload);
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

/*
 * How long a peer may spend placing itself (take_hole), in ms: the
 * matchmaking time and the request timeout. Its "placing" declaration
 * lives as long, so that the other placers read it until it is done.
 */
uint64_t mp_mm_placing_ms(const struct mp_config *cfg);

/*
 * A peer placing itself in @round has heard members declare in round
 * @heard: has the run left @round behind it (its holes are no holes any
 * more), so that it should place in a later one? Not merely because @heard
 * is later: the lines of @round with a hole wait for a placer they heard
 * of, while full lines go on, and the lines of the rounds after them that
 * cross a waiting line wait in turn. On a grid of d dimensions every line
 * of round @round + d - 1 crosses one, so only a declaration of round
 * @round + d or later shows that the waiting lines went on without us.
 */
int mp_mm_round_left(const struct mp_grid *g, uint32_t round, uint32_t heard);

/*
 * Has a member that declared in line @line of @round (@all, the round's @n
 * declarations) been heard declaring for a later round (ctx->dht->heard)?
 * Then that line formed its group without us, and a placer about to take
 * a cell there moves on. Heard only over control connections (small runs
 * gossip every declaration); a larger run relies on mp_mm_round_left.
 */
int mp_mm_line_went_on(const struct mp_ctx *ctx, uint32_t round, uint32_t line,
		       const struct mp_decl *all, int n);

#endif
