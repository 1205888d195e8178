/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The memif control relay (relay.c): this process's memif port talks to its
 * peer through a relay thread of ours, so that we learn of the peer's end
 * before DPDK's memif does.
 *
 * Why: DPDK 22.11's net_memif unmaps the regions a pair shares from its EAL
 * interrupt thread as soon as the control connection ends (the peer stopped
 * its port, or died), without an event a driver can act on first and
 * without waiting for the threads in rx/tx bursts on those regions; a burst
 * caught in between dies of SIGSEGV (doc/dpdk.md, "Leaving a memif pair").
 * With the relay between the two, the peer's end (its DISCONNECT message,
 * or its socket closing, as when it is killed) reaches the relay first: it
 * calls the driver's hook, which stops the bursts and waits until none is in
 * flight, and only then passes the end on to our memif, which unmaps.
 *
 * How: the port's devargs get socket=<a private abstract name>; the relay
 * listens on the name the user gave (memif server) or on the private one
 * (memif client, which dials it) and copies every message both ways,
 * control messages with the file descriptors they carry included. The
 * peer, moshpit or any other memif, sees the same socket and protocol.
 */
#ifndef MP_DPDK_RELAY_H
#define MP_DPDK_RELAY_H

#include <stdbool.h>
#include <stddef.h>

/*
 * Called from the relay thread when the peer's control connection ends,
 * twice: with @done false before our memif can hear of it (it unmaps the
 * shared regions once it does), then with @done true once it has been let
 * hear (its end closed, or the peer's DISCONNECT passed on). @said: the
 * peer sent DISCONNECT (it stopped its port) rather than vanishing.
 */
typedef void (*mp_memif_relay_gone_fn)(void *arg, bool said, bool done);

/*
 * If @vdev (a --vdev value) is a net_memif device, start a relay for it and
 * write the devargs memif must get instead to @out (at most @cap bytes).
 * Returns 1 with a relay started, 0 when @vdev is not memif (@out is a copy
 * of it), or a negative errno (@out is a copy: memif runs without a relay).
 * The relay runs until the process ends, as EAL and the port do.
 */
int mp_memif_relay_start(const char *vdev, char *out, size_t cap, mp_memif_relay_gone_fn gone,
			 void *arg);

/*
 * The devargs' parts that matter here, exposed for tests: role (true when
 * role=client), the socket name (memif's default when absent) and whether
 * it is abstract (socket-abstract, default yes). 0, or -EINVAL.
 */
int mp_memif_devargs_parse(const char *vdev, bool *client, char *sock, size_t cap,
			   bool *abstract);

#endif
