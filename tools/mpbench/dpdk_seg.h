/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * mpbench --transport=dpdk on one machine without a DPDK NIC: the virtual
 * Ethernet segment its local peers share (doc/dpdk.md, "mpbench").
 *
 *  - 2 peers: a memif pair (peer 0 server, peer 1 client) on an abstract
 *    socket; nothing in the kernel to create or remove.
 *  - 3..DSEG_MAX_PEERS peers: a Linux bridge and one veth pair per peer; the
 *    peer's end lives in a network namespace "mpb-<pid>-<i>" and the peer
 *    process enters it (setns) before EAL starts, then uses net_af_packet on
 *    it. Everything is removed by dseg_teardown, which also runs at exit and
 *    on SIGINT/SIGTERM/SIGHUP.
 *
 * Each peer gets MAC 02:00:00:00:<pid-bits>:<i+1>, IP 10.77.0.<i+1> and UDP
 * port 7000; a peer is told them through MP_DPDK_VDEV, MP_DPDK_IP and its
 * listen address, so the library's own defaults (doc/dpdk.md) do the rest.
 */
#ifndef MPBENCH_DPDK_SEG_H
#define MPBENCH_DPDK_SEG_H

#include <stddef.h>

#define DSEG_MAX_PEERS 64

/*
 * Build the segment for @npeers local peers (as root). @eal_args, if not
 * NULL, replaces the made-up segment: every peer gets it as MP_DPDK_EAL with
 * "{rank}" replaced by its rank, and must be told its address by the user.
 * @stats_dir, when not NULL, is where peers leave their counters. Returns 0,
 * or -1 with a message on stderr (and nothing left behind).
 */
int dseg_setup(int npeers, const char *eal_args, int verbose);
/* In peer @rank's process, before mp_init: enter its namespace, set its
 * environment, and write its listen address into @listen (may stay empty). */
int dseg_enter(int rank, char *listen, size_t cap);
/* Remove what dseg_setup made; safe to call twice and from a signal handler. */
void dseg_teardown(void);
/* One line describing the segment, for the output header. */
const char *dseg_describe(void);
/* Sum the peers' counter files and print them as a "# dpdk counters" line. */
void dseg_report(void);

#endif
