/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Rendezvous: how peers of a run find each other and meet for a round.
 *
 *   static  the peer list is fixed (hostfile, MP_PEERS, mpirun/srun); groups
 *           come from the grid alone (grid.c), no declarations.
 *   dht     every peer runs an OpenDHT node, publishes a signed membership
 *           record under the run's key and refreshes it before its TTL runs
 *           out; matchmaking declarations go under per-round group keys.
 *
 * Records and declarations carry a MAC under the run key (auth.h): readers
 * drop anything that does not verify, so a stranger can neither add nor
 * replace a member. Times on the rendezvous are wall-clock milliseconds
 * (CLOCK_REALTIME), since peers on different hosts compare them.
 *
 * Thread safety: a backend is called from the context's progress thread and
 * from mp_init/mp_finalize only; it may run threads of its own (OpenDHT
 * does) and must lock what they share.
 */
#ifndef MP_RDV_H
#define MP_RDV_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <moshpit/moshpit.h>
#include <moshpit/sdk/clock.h>

#include "auth.h"

/* A peer's membership record. */
struct mp_record {
	uint64_t id;          /* peer id, never 0 */
	uint64_t seq;         /* a record with a larger seq replaces one with a smaller */
	uint64_t expires_ms;  /* wall-clock ms after which the record is dead */
	uint32_t round;       /* the next round the peer will take part in */
	uint8_t mode;         /* enum mp_mode */
	uint8_t bye;          /* 1: the peer left; drop it at once */
	uint8_t ndims;        /* grid coordinates that follow */
	int16_t coords[MP_MAX_GRID_DIMS];
	double bandwidth;     /* < 0 unknown, 0 client */
	char transport[16];   /* "tcp", ... */
	char addr[MP_ADDR_STRLEN]; /* data-plane address; "" for client peers */
	uint64_t settings;    /* fingerprint of its settings (settings.h); 0 on encode: the
	                         encoder's own (mp_auth.settings_fp) */
};

/* Declaration mode past enum mp_mode: "peer id will not come to this
 * round" (its groupmates saw it fail), declared under a round's key by
 * another member, so that nobody waits for a dead peer's lingering record. */
#define MP_DECL_ABSENT 3
/* ... and "peer id takes part in this round and is choosing its cell"
 * (a joiner, or a peer displaced from a shared cell), declared by the peer
 * itself under the round's key: leaders wait for it, and peers placing
 * themselves at once share out the holes instead of waiting for each
 * other. Its declaration in a line replaces it. */
#define MP_DECL_PLACING 4
/* ... and "peer id was placing itself in this round, and now places itself
 * in a later one" (it saw the round's groups form without it), declared by
 * the peer itself under the round's key. It replaces its "placing": the
 * round's leaders stop waiting for it at once instead of until that
 * declaration expires. */
#define MP_DECL_MOVED 5

/* A matchmaking declaration: "I am looking for a group under this key". */
struct mp_decl {
	uint64_t id;
	uint64_t expires_ms;  /* the declarer's matchmaking deadline */
	uint8_t mode;         /* enum mp_mode (client peers never lead), MP_DECL_ABSENT or
			       * MP_DECL_PLACING */
	int16_t coord;        /* the declarer's coordinate in the varied dimension */
	uint32_t line;        /* its line: the cell index with the varied coordinate 0 */
};

struct mp_rdv_params {
	const char *run_name;
	const struct mp_auth *auth;
	uint64_t self_id;
	int port;              /* dht: UDP port of the node, 0 = any */
	const char *bootstrap; /* dht: "host:port[,host:port...]" or NULL (first node) */
	const char *host;      /* dht: address others reach this node at (for mp_dht_address) */
	int ttl_ms;            /* dht: record lifetime; refreshed every ttl/3 */
	/* static: the peer list, in rank order */
	const char *const *addrs;
	int naddrs;
};

struct mp_rdv_ops {
	const char *name;
	int (*init)(const struct mp_rdv_params *p, void **st);
	void (*fini)(void *st);
	/* "host:port" others can bootstrap from; -ENOTSUP where there is none. */
	int (*address)(void *st, char *buf, size_t len);
	/* Set (and publish now) this peer's record; the backend keeps it alive
	 * until leave or fini. seq is assigned by the backend. */
	int (*publish)(void *st, const struct mp_record *self);
	/* Copy up to @max live records (newest per id, not expired, not bye),
	 * this peer's own included; returns the count or a negative errno. */
	int (*members)(void *st, struct mp_record *out, int max);
	/* Ids that said bye or whose record expired since the last call; to
	 * @when (may be NULL) the wall-clock ms its record expired at, 0 for
	 * a bye. */
	int (*departed)(void *st, uint64_t *out, uint64_t *when, int max);
	/* Declare under @key (a printable string) until d->expires_ms. */
	int (*declare)(void *st, const char *key, const struct mp_decl *d);
	/* Live declarations under @key, own included, sorted by (expires_ms, id). */
	int (*declared)(void *st, const char *key, struct mp_decl *out, int max);
	/* Take @d as if read under @key, without putting it anywhere (it came
	 * over a control connection): -ENOENT unless @key is held (declared
	 * or read, not forgotten). May be NULL. */
	int (*learn)(void *st, const char *key, const struct mp_decl *d);
	/* Take an encoded record (@len bytes) as if read from the rendezvous:
	 * one passed on over a control connection. 0, or the decode error
	 * (-EACCES, -EBADMSG, -EPROTO). May be NULL. */
	int (*learn_record)(void *st, const uint8_t *buf, size_t len);
	/* This peer's record as last published, encoded (@cap bytes at @buf,
	 * length in *@len), to pass on over control connections. May be NULL. */
	int (*self_record)(void *st, uint8_t *buf, size_t cap, size_t *len);
	/* Done with @key: stop listening, free its cache. */
	void (*forget)(void *st, const char *key);
	/* Publish a bye record (the peer is gone at once for every reader). */
	int (*leave)(void *st);
	/* Records, declarations and welcome askers refused (bad MAC, malformed,
	 * foreign run). */
	uint64_t (*refused)(void *st);
	/* The same, by reason: @by gets MP_RDV_REFUSED_N counts (enum
	 * mp_rdv_refusal). May be NULL. */
	void (*refusals)(void *st, uint64_t *by);
	/* 1 when init already learnt the run's members from a peer (dht: its
	 * bootstrap peer's welcome), so the view need not settle first. May be
	 * NULL. */
	int (*welcomed)(void *st);
};

/*
 * Why a record or declaration was refused, for the join's error message
 * (mp_init, dht runs: "refused 6 records: 6 not made with this run's key").
 * mp_rdv_refusal_of maps a decode's error to its reason; a check that
 * refuses for another reason (the settings a run's peers must share) adds
 * its errno there.
 */
enum mp_rdv_refusal {
	MP_RDV_REFUSED_KEY,       /* -EACCES: the MAC does not verify (another run key) */
	MP_RDV_REFUSED_RUN,       /* -EPROTO: a record of another run */
	MP_RDV_REFUSED_SETTINGS,  /* settings that differ from this peer's */
	MP_RDV_REFUSED_MALFORMED, /* anything else: cut, or fields out of range */
	MP_RDV_REFUSED_WELCOME,   /* an asker of our welcome (no key, another run) */
	MP_RDV_REFUSED_N
};

static inline int mp_rdv_refusal_of(int rc)
{
	switch (rc) {
	case -EACCES:
		return MP_RDV_REFUSED_KEY;
	case -EPROTO:
		return MP_RDV_REFUSED_RUN;
	default:
		return MP_RDV_REFUSED_MALFORMED;
	}
}

extern const struct mp_rdv_ops mp_rdv_static_ops;
/* NULL when the library is built without OpenDHT. */
extern const struct mp_rdv_ops *const mp_rdv_dht_ops;

/* Record and declaration encodings (rdv_record.c; exposed for tests). Encoded
 * values carry the MAC; decode verifies it and returns -EACCES on a bad MAC,
 * -EBADMSG when malformed, -EPROTO for another run's record, -EBADE for a
 * record whose settings fingerprint is not the reader's (mp_auth.settings_fp). @key binds a
 * declaration to its group key. */
#define MP_RECORD_WIRE_MAX 256
int mp_record_encode(const struct mp_auth *a, const char *run_name, const struct mp_record *r,
		     uint8_t *buf, size_t cap, size_t *len);
int mp_record_decode(const struct mp_auth *a, const char *run_name, const uint8_t *buf,
		     size_t len, struct mp_record *r);
int mp_decl_encode(const struct mp_auth *a, const char *key, uint32_t round,
		   const struct mp_decl *d, uint8_t *buf, size_t cap, size_t *len);
/* -ESTALE (before the MAC) when the declaration is of another round than
 * @round: one of the rounds that share its DHT key (rdv_dht.c). */
int mp_decl_decode(const struct mp_auth *a, const char *key, uint32_t round, const uint8_t *buf,
		   size_t len, struct mp_decl *d);

/* Declarations a dht backend dropped as another round's under a shared
 * DHT key (rdv_dht.c, "Round slots"); for tests. */
uint64_t mp_rdv_dht_stale(void *st);

/* qsort order of declarations: by (expires_ms, id), the order in which a
 * key's leader is chosen. */
int mp_decl_cmp(const void *a, const void *b);

#endif
