/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * How long the nodes of a dht run keep moshpit's values: value types with
 * lifetimes, through OpenDHT's C++ API (rdv_dht_life.cc), for rdv_dht.c.
 *
 * OpenDHT's C API puts every value with the default type, which every
 * storing node keeps for 10 minutes, whatever the value says of itself. A
 * record is of no use past its TTL, a declaration past its deadline: a
 * thousand-round run left each node holding megabytes of them
 * (doc/reliability.md, "Soak"). Every node registers the types below; a
 * value put with one is dropped by its storing nodes after that type's
 * lifetime. A storing node that lacks a type (not a moshpit node) keeps the
 * value the default 10 minutes, as before.
 */
#ifndef MP_RDV_DHT_LIFE_H
#define MP_RDV_DHT_LIFE_H

#include <stdint.h>

#include <opendht/opendht_c.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Type ids MP_DHT_LIFE_BASE + k keep a value 80 s << k, k < MP_DHT_LIFE_N
 * (80 s to 320 s): part of the protocol, the same on every node. None is
 * shorter. OpenDHT 2.4 schedules an announce's refresh its type's lifetime
 * less 10 s (Dht::REANNOUNCE_MARGIN) after it: with types of 10 s or less,
 * four nodes putting every 500 ms, listeners missed a third of the values,
 * and a 2 s value lived on while it was read. With 20 s, the churn run of
 * doc/reliability.md ("Churn with no pause") met 1e-6 in 0 and 2 of 10
 * where it met 3 and 4 of 10 with the default type, and 4 and 5 of 10
 * with 80 s, all in one session. */
#define MP_DHT_LIFE_BASE 0x6d70
#define MP_DHT_LIFE_N 3

/* Register the lifetime types on @r, a running runner; 0 or -ENOMEM. */
int mp_dht_life_register(dht_runner *r);
/* Register one type, @type, that keeps a value @ms (a test's short one). */
int mp_dht_life_register_type(dht_runner *r, uint16_t type, uint64_t ms);
/* The type that keeps a value at least @ms: the shortest such lifetime, or
 * 0 (OpenDHT's default type, 10 minutes) past the longest. */
uint16_t mp_dht_life_type(uint64_t ms);
/* That type's lifetime in ms (600000 for type 0); 0 for a type not ours. */
uint64_t mp_dht_life_ms(uint16_t type);
/* Give @v the type @type before it is put. */
void mp_dht_value_set_type(dht_value *v, uint16_t type);
/* The type of @v (to test what was put). */
uint16_t mp_dht_value_type(const dht_value *v);

#ifdef __cplusplus
}
#endif

#endif
