/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The run's secret and the keyed MACs made from it (libsodium). Every peer of
 * a run holds the same 32-byte key; a peer proves it holds the key by a MAC
 * over fresh nonces (connection handshake) and signs what it publishes on the
 * rendezvous (DHT records, matchmaking declarations). Each use has its own
 * domain byte, so a MAC made for one purpose is never valid for another.
 */
#ifndef MP_AUTH_H
#define MP_AUTH_H

#include <stddef.h>
#include <stdint.h>

#define MP_KEY_BYTES 32
#define MP_MAC_BYTES 32
#define MP_NONCE_BYTES 16

/* What a MAC is for. */
enum mp_auth_domain {
	MP_AUTH_CHALLENGE = 1, /* acceptor's answer to a HELLO */
	MP_AUTH_RESPONSE = 2,  /* dialer's answer to the CHALLENGE */
	MP_AUTH_TOKEN = 3,     /* session token of a connection */
	MP_AUTH_RECORD = 4,    /* a membership record on the rendezvous */
	MP_AUTH_DECL = 5,      /* a matchmaking declaration */
	MP_AUTH_LOCATOR = 6,   /* DHT keys of the run (not secret-free: see rdv_dht.c) */
	MP_AUTH_WELCOME_ASK = 7,  /* a new peer asking a member for the run (welcome.c) */
	MP_AUTH_WELCOME_GIVE = 8, /* the member's answer */
	MP_AUTH_STATE_ASK = 9,    /* a state download's request (state_xfer.c) */
	MP_AUTH_STATE_GIVE = 10,  /* the server's header */
};

struct mp_auth {
	uint8_t key[MP_KEY_BYTES];
	/* 1 when no secret was given and the key comes from the run name:
	 * anyone who knows the name can join, and the log says so. */
	int from_name;
	char source[64]; /* "MP_RUN_KEY", "file /path", "run name" (for logs) */
	/* Fingerprint of the settings every peer of a dht run must share
	 * (mp_settings_fingerprint), set by mp_init: membership records carry
	 * it, and a record with another one is refused (-EBADE) like one
	 * under another key. 0: not checked (tests that build records alone). */
	uint64_t settings_fp;
};

/*
 * Derive the run key: from @key_text (a passphrase or hex, as given), else
 * from the file @key_file (its contents, trailing whitespace removed), else
 * from @run_name. Returns 0, -ENOENT/-EACCES (file), -EINVAL (empty secret),
 * -EIO (libsodium could not start).
 */
int mp_auth_init(struct mp_auth *a, const char *run_name, const char *key_text,
		 const char *key_file);

/* MAC of (@domain, the @n pieces) under the run key. */
struct mp_auth_piece {
	const void *p;
	size_t len;
};
void mp_auth_mac(const struct mp_auth *a, enum mp_auth_domain domain,
		 const struct mp_auth_piece *pieces, int n, uint8_t mac[MP_MAC_BYTES]);
/* 0 if @mac is right, else -EACCES. Constant time. */
int mp_auth_verify(const struct mp_auth *a, enum mp_auth_domain domain,
		   const struct mp_auth_piece *pieces, int n, const uint8_t mac[MP_MAC_BYTES]);

/* Cryptographically random bytes (nonces, peer ids). */
void mp_auth_random(void *buf, size_t len);

#endif
