/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * dpdk transport: messages in Ethernet/IPv4/UDP frames on one DPDK port,
 * made reliable and ordered by the rel core (rel.h), with no kernel on the
 * data path (doc/dpdk.md).
 *
 * Layers
 *  - EAL: initialised once per process, from MP_DPDK_EAL (split on spaces)
 *    or, without it, a local default (--no-huge -m <sized from the frame
 *    pool> --no-pci --no-shconf plus MP_DPDK_VDEV). DPDK cannot initialise EAL twice in a process, so
 *    EAL stays up after the last instance is gone and a later instance
 *    reuses it and the port; two live instances at once are refused.
 *  - Port: one ethdev port with MP_DPDK_QUEUES queue pairs, two mempools
 *    (frames; and data-less mbufs that carry registered shard memory as
 *    external buffers) sized from MP_DPDK_MBUFS.
 *  - Framing (frame.c): every segment of rel becomes one Ethernet/IPv4/UDP
 *    frame from our MAC/IP/port to the peer's. Received frames are
 *    classified; those not for our IP and UDP port, not IPv4/UDP or failing
 *    validation are dropped and counted by reason. ARP requests for our IP
 *    are answered, so ordinary hosts and switches can reach us.
 *  - Lanes: queue pair q is served by lane q, with its own rel instance,
 *    routes and tx burst. rel names peers by a 32-bit route; here a route is
 *    an index into the lane's table of peer MAC/IP/port, found by IP and
 *    port through a small open-addressing hash. Routes are made by connect
 *    (from the address blob) and by frames from new senders (a SYN from a
 *    peer that dials us). Connections go to the lanes in turn; a segment
 *    that arrives on another lane's queue is handed to its lane (the lane
 *    is in the destination connection id) through that lane's ring.
 *  - Run to completion: a pass polls the lane's rx queue in a burst, feeds
 *    each UDP payload to rel, runs rel's timers and flushes the tx burst.
 *    With one queue pair, progress() does it in the calling thread, which
 *    registers with EAL on its first call so that mempool caches work; with
 *    several, each lane has a polling thread and the ops take the lane's
 *    ticket lock. When idle a poller spins MP_DPDK_SPIN_US, then naps in
 *    short sleeps until its timeout, rel's next deadline or wake().
 *  - Zero copy on send: when the port takes chained mbufs, payload pieces
 *    that lie in memory registered with reg_mr are attached to mbufs as
 *    external buffers behind a small header mbuf instead of being copied.
 *    rel keeps the send buffer valid until the whole message is
 *    acknowledged, which is after the frame left.
 *  - Fault injection for tests: MP_DPDK_INJECT_LOSS / _DUP / _REORDER drop,
 *    duplicate or delay that fraction of our received frames (seeded by
 *    MP_DPDK_INJECT_SEED), before rel sees them.
 *
 * Threading: an instance is driven by one thread at a time, like every
 * driver (plus its own lane threads with several queues); wake() may come
 * from any thread, and reg_mr/dereg_mr from the application's thread (the
 * registry has its own lock).
 */
/* rte_dev_dma_map/unmap (DMA mappings of external memory) are experimental in 22.11. */
#define ALLOW_EXPERIMENTAL_API 1
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <rte_alarm.h>
#include <rte_bus.h>
#include <rte_cycles.h>
#include <rte_devargs.h>
#include <rte_eal.h>
#include <rte_errno.h>
#include <rte_ethdev.h>
#include <rte_lcore.h>
#include <rte_log.h>
#include <rte_malloc.h>
#include <rte_mbuf.h>
#include <rte_memory.h>
#include <rte_pause.h>
#include <rte_random.h>
#include <rte_ring.h>
#include <rte_ticketlock.h>

#include <moshpit/driver_sdk.h>

#include "frame.h"
#include "gpu.h"
#include "mp_kernels.h"
#include "mp_build_config.h"
#include "rel.h"
#include "relay.h"

extern const struct mp_driver_ops mp_dpdk_driver_ops;

#define DPDK_BURST 32
#define DPDK_MAX_QUEUES 16
#define DPDK_MAX_MSG ((size_t)1 << 30)
#define DPDK_DEFAULT_UDP_PORT 7000
#define DPDK_DEFAULT_MTU 1500
/*
 * The largest MP_DPDK_MTU: a frame must fit one mbuf, whose data room
 * (headroom + frame rounded up to 128) is a 16-bit length. Ethernet NICs
 * stop near 9600; memif carries what its buffers (bsize, 16 bits) hold.
 */
#define DPDK_MAX_MTU 65000
#define DPDK_DEFAULT_RING 1024
#define DPDK_DEFAULT_SPIN_US 200
#define DPDK_NAP_US 50
#define DPDK_ROUTES_MAX 4096  /* peers one instance can know */
#define DPDK_HASH_SLOTS 8192  /* twice the routes: short probes */
#define DPDK_BACKLOG 1024
#define DPDK_ZC_MIN 256       /* smaller pieces are cheaper to copy than to attach */
#define DPDK_MR_MAX 64

/* Counters of the port layer, beside rel's (printed together at fini). */
struct dpdk_stats {
	uint64_t rx_frames;
	uint64_t verdict[MP_FRAME_NVERDICTS]; /* [MP_FRAME_OURS] = handed to rel */
	uint64_t rx_no_route;   /* from a new sender with the route table full */
	uint64_t rx_multiseg;   /* chained frames copied flat before parsing */
	uint64_t rx_steered;    /* received on one queue, handed to the lane of another */
	uint64_t rx_steer_full; /* that lane's inbox was full: dropped, rel resends */
	uint64_t arp_replies;
	uint64_t inj_loss, inj_dup, inj_reorder;
	uint64_t tx_frames;
	uint64_t tx_zc_pieces;  /* payload pieces sent as external buffers */
	uint64_t tx_nombuf;     /* no mbuf: the segment counts as lost */
	uint64_t tx_again;      /* tx ring full: rel retries */
};

struct dpdk_route {
	struct mp_dpdk_addr a;
};

struct mp_drv_mr {
	uintptr_t lo, hi;   /* registered range [lo, hi) */
	bool zc;            /* payload from here may be attached, not copied */
	bool extmem;        /* rte_extmem_register succeeded: unregister at dereg */
	uintptr_t ext_lo;   /* the page-rounded range registered with EAL */
	size_t ext_len;
	bool device;        /* MP_MEM_CUDA, registered through gpu.c (-Ddpdk_gpudev) */
	struct mp_dpdk_gpu_reg gpu;
	struct mp_drv_mr *next;
};

struct dpdk_txq {
	uint16_t n;
	struct rte_mbuf *m[DPDK_BURST];
};

struct dpdk_listener {
	struct dpdk_drv *d;
};

/*
 * One queue pair and what serves it: lane q receives on rx queue q, sends on
 * tx queue q, and has its own rel instance (whose connection ids carry q,
 * see mp_rel_seg_lane), routes and fault injection. With one lane, the
 * core's progress thread polls it; with several, each has a polling thread
 * and the ops take the lane's lock (its thread holds it for one pass).
 */
struct dpdk_lane {
	struct dpdk_drv *d;
	struct mp_rel *rel;
	uint16_t q;
	bool link_up;       /* as of the last poll */
	uint16_t ip_id;
	uint64_t burst_ns;  /* rel's clock while a receive burst is fed to it, else 0 */
	rte_ticketlock_t lock;
	struct rte_ring *inbox;       /* frames other lanes received for this one */
	pthread_t thread;
	bool thread_up;
	/* fault injection */
	uint64_t rng;
	struct rte_mbuf *held;        /* reordering: delivered after the next frame */
	uint32_t held_route;
	const uint8_t *held_payload;
	size_t held_len;
	/* routes */
	uint32_t nroutes;
	struct dpdk_route *routes;
	int32_t *hash;                /* route index + 1, 0 = empty */
	struct dpdk_txq txq;
	/* mbufs for frames and attached pieces, taken from the pools a burst at a time */
	struct rte_mbuf *hstash[DPDK_BURST], *zstash[DPDK_BURST];
	uint16_t hn, zn;
	const struct mp_drv_mr *zc_last; /* the registration the last piece came from, */
	uintptr_t zc_lo, zc_hi;          /* its range (read without touching it), */
	unsigned zc_gen;                 /* and d->mr_gen when it was found */
	struct dpdk_stats st;
	uint8_t flat[RTE_ETHER_MAX_JUMBO_FRAME_LEN]; /* chained rx frames, copied flat */
};

struct dpdk_drv {
	struct mp_drv base; /* first: the core sees a struct mp_drv * */
	struct mp_dpdk_addr self;
	bool have_ip;
	int rank;
	bool listening;
	bool zc;            /* port takes chained mbufs and MP_DPDK_ZC is not 0 */
	bool udp_csum;
	atomic_int woken;
	uint64_t spin_ns;
	double loss, dup, reorder;
	uint16_t nlanes;
	bool threaded;      /* lanes have their own polling threads */
	struct dpdk_lane *lanes[DPDK_MAX_QUEUES];
	atomic_uint next_lane;        /* connections are spread over lanes in turn */
	unsigned accept_next;
	atomic_ullong events;         /* passes of lane threads that did something */
	atomic_bool stop;
	struct dpdk_listener listener;
	pthread_mutex_t mr_lock;
	struct mp_drv_mr *mrs;
	atomic_uint mr_gen;           /* bumped by every dereg: lanes' zc_last is stale */
};

/* Process-wide: EAL and the port outlive instances (EAL cannot restart). */
static struct {
	pthread_mutex_t lock;
	int eal;               /* 0 not tried, 1 up, < 0: rte_eal_init failed with this */
	bool port_ready;       /* configured and pools made */
	bool started;
	uint16_t port;
	uint16_t nq;
	uint16_t mtu;
	bool multiseg;
	bool pci;              /* a bus device that needs DMA mappings for external memory */
	bool dials;            /* starting the port dials its peer (memif client) */
	bool memif_zc;         /* memif zero-copy client: every frame must sit in EAL memory */
	bool memif;            /* the port is net_memif: its peer leaves with a BYE */
	char driver[32];       /* the port's PMD (rte_eth_dev_info.driver_name) */
	atomic_bool quiet;     /* the memif peer said BYE: no bursts until the link went down */
	atomic_uint bye_rx;    /* BYEs answered (the peer left while we ran) */
	atomic_uint bye_bad;   /* malformed, or on a port that is not memif */
	/*
	 * The memif relay (relay.h) saw the peer's control connection end:
	 * no bursts until the link went down (our memif unmaps the regions
	 * in between). Set by the relay thread once no burst is in flight.
	 */
	atomic_bool gone;
	atomic_uint peer_lost; /* ... without DISCONNECT: the peer died (SIGKILL, crash) */
	atomic_uint peer_left; /* ... after DISCONNECT: the peer stopped its port */
	/*
	 * Held around every start and stop of the port, and by the relay's
	 * hook from before it lets our memif hear of the peer's end until
	 * memif has disconnected (memif_peer_end); guards g.started.
	 */
	pthread_mutex_t stop_lock;
	bool relay_held;       /* memif_peer_end set gone this time (under stop_lock) */
	struct rte_ether_addr mac;
	struct rte_mempool *pool, *zpool;
	struct dpdk_drv *live; /* the one instance allowed at a time */
} g = {.lock = PTHREAD_MUTEX_INITIALIZER, .stop_lock = PTHREAD_MUTEX_INITIALIZER};

/*
 * Bursts in flight on each queue, for the relay to wait on: a burst counts
 * itself in, then reads g.gone (both sequentially consistent, against the
 * relay's store of gone and its reads of these), so that either the burst
 * sees gone and does not start, or the relay sees it and waits for its end.
 * One cache line per queue: each is written by its own lane's thread.
 */
static struct {
	atomic_uint n;
} __rte_cache_aligned bursting[DPDK_MAX_QUEUES];

static bool burst_enter(uint16_t q)
{
	atomic_fetch_add(&bursting[q].n, 1);
	if (!atomic_load(&g.gone))
		return true;
	atomic_fetch_sub_explicit(&bursting[q].n, 1, memory_order_release);
	return false;
}

static void burst_leave(uint16_t q)
{
	/* release: the burst's accesses to the regions come before the relay's wait ends */
	atomic_fetch_sub_explicit(&bursting[q].n, 1, memory_order_release);
}

/* Every burst on the port goes through these two: none once the relay said gone. */
static uint16_t port_rx(uint16_t q, struct rte_mbuf **b, uint16_t n)
{
	if (!burst_enter(q))
		return 0;
	n = rte_eth_rx_burst(g.port, q, b, n);
	burst_leave(q);
	return n;
}

static uint16_t port_tx(uint16_t q, struct rte_mbuf **b, uint16_t n)
{
	if (!burst_enter(q))
		return 0;
	n = rte_eth_tx_burst(g.port, q, b, n);
	burst_leave(q);
	return n;
}

static bool port_link_raw(void);
static atomic_bool disc_marked;

static void disc_mark(void *arg)
{
	(void)arg;
	atomic_store(&disc_marked, true);
}

/*
 * After the relay let our memif hear of the peer's end: wait (2 s at most)
 * until DPDK's memif_disconnect, in the EAL interrupt thread, has returned.
 * It takes the link down first; an EAL alarm's callback runs in the same
 * thread, so once one set after that has run, the disconnect is over.
 */
static bool memif_disconnected(void)
{
	uint64_t until = mp_now_ns() + 2000000000ull;

	while (port_link_raw() && mp_now_ns() < until)
		usleep(100);
	atomic_store(&disc_marked, false);
	if (port_link_raw() || rte_eal_alarm_set(1, disc_mark, NULL))
		return false;
	while (!atomic_load(&disc_marked) && mp_now_ns() < until)
		usleep(100);
	if (atomic_load(&disc_marked))
		return true;
	rte_eal_alarm_cancel(disc_mark, NULL);
	return false;
}

/*
 * The relay's hook (relay thread): the memif peer's control connection
 * ended. Before our memif hears of it (@done false): no new bursts, and wait
 * for those in flight, since it unmaps the shared regions as soon as it
 * hears. Bounded, in case a lane is stuck elsewhere inside a burst: 10 s,
 * then our memif is let go anyway. Once it has heard (@done true): wait
 * for its disconnect to be over, then let bursts go again (the link is
 * down, or up with a new peer's regions). g.stop_lock is held all along,
 * so that no stop of the port runs DPDK's memif_disconnect beside the
 * interrupt thread's: the two freed the regions twice ("EAL: Error:
 * Invalid memory", seen when a peer died while the partner was leaving).
 */
static void memif_peer_end(void *arg, bool said, bool done)
{
	const char *dev = arg; /* the memif device the relay serves */
	char name[RTE_ETH_NAME_MAX_LEN];
	uint64_t t0 = mp_now_ns();

	if (done) {
		/* If the wait fails, gone stays set until a lane sees the link down. */
		if (g.relay_held && memif_disconnected())
			atomic_store(&g.gone, false);
		else if (g.relay_held)
			MP_WARN("dpdk: memif did not finish disconnecting within 2 s");
		g.relay_held = false;
		pthread_mutex_unlock(&g.stop_lock);
		return;
	}
	pthread_mutex_lock(&g.stop_lock);
	/*
	 * Another memif device than our port (EAL may have several) unmaps
	 * nothing under our bursts; a port not started has no bursts (and
	 * its stop cut our memif's end already).
	 */
	if (!g.started || rte_eth_dev_get_name_by_port(g.port, name) || strcmp(name, dev)) {
		MP_INFO("dpdk: the peer of %s left; our port is stopped or another one", dev);
		return;
	}
	atomic_store(&g.gone, true);
	g.relay_held = true;
	atomic_fetch_add(said ? &g.peer_left : &g.peer_lost, 1);
	for (unsigned q = 0; q < DPDK_MAX_QUEUES; q++)
		while (atomic_load(&bursting[q].n)) {
			if (mp_now_ns() - t0 > 10000000000ull) {
				MP_WARN("dpdk: a burst on queue %u did not end within 10 s; the memif "
					"peer's rings go now", q);
				break;
			}
			sched_yield();
		}
	if (said)
		MP_INFO("dpdk: the memif peer stopped its port: no bursts until our memif let go of it");
	else
		MP_WARN("dpdk: the memif peer's control connection ended without a word (killed?): "
			"no bursts until our memif let go of it; its connections fail as any dead "
			"peer's");
}

/* ---- configuration from the environment ---- */

static long env_long(const char *name, long def, long lo, long hi)
{
	const char *s = getenv(name);
	char *end;
	long v;

	if (!s || !*s)
		return def;
	errno = 0;
	v = strtol(s, &end, 0);
	if (errno || *end || v < lo || v > hi) {
		MP_WARN("dpdk: %s=%s is not a number in [%ld, %ld]; using %ld", name, s, lo, hi, def);
		return def;
	}
	return v;
}

static double env_prob(const char *name)
{
	const char *s = getenv(name);
	char *end;
	double v;

	if (!s || !*s)
		return 0;
	v = strtod(s, &end);
	if (*end || !(v >= 0 && v < 1)) {
		MP_WARN("dpdk: %s=%s is not a probability in [0, 1); ignored", name, s);
		return 0;
	}
	return v;
}

/*
 * rel reads the clock for every segment it takes in and every poll: the
 * TSC (a few cycles) instead of clock_gettime (tens of ns, 5% of a core at
 * memif rates), anchored to CLOCK_MONOTONIC when EAL came up.
 */
static struct {
	uint64_t tsc0, ns0;
	double ns_per_tsc; /* 0: no usable TSC rate, use clock_gettime */
} clk;

static void clock_setup(void)
{
	uint64_t hz = rte_get_tsc_hz();

	clk.tsc0 = rte_get_tsc_cycles();
	clk.ns0 = mp_now_ns();
	clk.ns_per_tsc = hz ? 1e9 / (double)hz : 0;
}

static uint64_t fast_ns(void)
{
	if (clk.ns_per_tsc == 0)
		return mp_now_ns();
	return clk.ns0 + (uint64_t)((double)(rte_get_tsc_cycles() - clk.tsc0) * clk.ns_per_tsc);
}

/* Within a receive burst every segment gets the time read once for the burst. */
static uint64_t rel_clock(void *user)
{
	const struct dpdk_lane *l = user;

	return l->burst_ns ? l->burst_ns : fast_ns();
}

/* xorshift64*: the injection decisions, reproducible from the seed. */
static double rnd(struct dpdk_lane *l)
{
	uint64_t x = l->rng;

	x ^= x >> 12;
	x ^= x << 25;
	x ^= x >> 27;
	l->rng = x;
	return (double)((x * 0x2545F4914F6CDD1DULL) >> 11) / 9007199254740992.0;
}

/* ---- EAL ---- */

/* What rte_eal_init's rte_errno means for a user (doc/dpdk.md has the long form). */
static const char *eal_hint(int e)
{
	switch (e) {
	case EACCES:
		return "permission denied, or no hugepages at all: run as root or give the user "
		       "access to hugepages, /dev/vfio and the NIC, and reserve hugepages";
	case EAGAIN:
		return "not enough memory: reserve hugepages (dpdk-hugepages.py) or run with "
		       "--no-huge -m <MB>";
	case EALREADY:
		return "EAL was initialised already in this process, not by moshpit";
	case EFAULT:
		return "the EAL tailq configuration is corrupt (mismatched DPDK libraries?)";
	case ENODEV:
		return "memory or devices could not be set up: check hugepages, --file-prefix "
		       "collisions with another DPDK process, and IOMMU/VFIO";
	case ENOTSUP:
		return "this CPU or kernel lacks something EAL needs";
	case EPROTO:
		return "a service core could not be set up";
	case ENOEXEC:
		return "a driver plugin (-d) could not be loaded";
	case EINVAL:
		return "invalid EAL arguments in MP_DPDK_EAL / --dpdk-args";
	default:
		return "see the lines EAL printed above";
	}
}

/*
 * "--lcores=0@(cpus)": EAL pins the thread that calls rte_eal_init to its
 * main lcore; mapping lcore 0 to every CPU we may run on keeps the
 * application's scheduling as it was.
 */
static void lcores_arg(char *buf, size_t cap)
{
	cpu_set_t set;
	size_t n = (size_t)snprintf(buf, cap, "--lcores=0@(");
	bool first = true;

	if (sched_getaffinity(0, sizeof(set), &set)) {
		snprintf(buf, cap, "-l 0");
		return;
	}
	for (int c = 0; c < CPU_SETSIZE && n + 8 < cap; c++)
		if (CPU_ISSET(c, &set)) {
			n += (size_t)snprintf(buf + n, cap - n, "%s%d", first ? "" : ",", c);
			first = false;
		}
	snprintf(buf + n, cap - n, ")");
}

/* Split @s on blanks into a NULL-terminated argv (argv[0] = "moshpit"). */
static char **split_args(const char *s, int *argc)
{
	size_t cap = 8;
	int n = 0;
	char **v = malloc(cap * sizeof(*v));
	char *copy = strdup(s ? s : ""), *save = NULL;

	if (!v || !copy) {
		free(v);
		free(copy);
		return NULL;
	}
	v[n++] = "moshpit";
	for (char *t = strtok_r(copy, " \t\n", &save); t; t = strtok_r(NULL, " \t\n", &save)) {
		if ((size_t)n + 2 > cap) {
			char **nv = realloc(v, 2 * cap * sizeof(*v));

			if (!nv) {
				free(v);
				free(copy);
				return NULL;
			}
			v = nv;
			cap *= 2;
		}
		v[n++] = t;
	}
	v[n] = NULL;
	*argc = n;
	/* EAL may keep pointers into argv: the strings live as long as the process. */
	return v;
}

/* HugePages_Free of /proc/meminfo (pages of the default size), or -1. */
static long free_hugepages(void)
{
	FILE *f = fopen("/proc/meminfo", "r");
	char line[128];
	long n = -1;

	if (!f)
		return -1;
	while (n < 0 && fgets(line, sizeof(line), f))
		if (sscanf(line, "HugePages_Free: %ld", &n) != 1)
			n = -1;
	fclose(f);
	return n;
}

/* An mbuf's data room: headroom plus the largest frame, rounded up to 128. */
static unsigned frame_room(uint16_t mtu)
{
	unsigned room = RTE_PKTMBUF_HEADROOM + RTE_ALIGN_CEIL(mtu + RTE_ETHER_HDR_LEN, 128u);

	return room < RTE_MBUF_DEFAULT_BUF_SIZE ? RTE_MBUF_DEFAULT_BUF_SIZE : room;
}

/*
 * EAL's memory (-m) when MP_DPDK_MEM_MB does not say: what the frame pool
 * takes (with the defaults, MTU 1500: 14 MiB; 9000: 56; 32000: 190), a
 * quarter more and 64 MiB for the attach pool and the rest; at least 128
 * MiB, which the defaults up to MTU 9000 fit with room to spare.
 */
static long eal_mem_default(uint16_t mtu, unsigned mbufs)
{
	long pool_mb = (long)(((uint64_t)mbufs * (frame_room(mtu) + 256u)) >> 20);
	long need = 64 + pool_mb + pool_mb / 4;

	return need > 128 ? need : 128;
}

/*
 * A --vdev value as memif gets it: through a relay (relay.h), unless
 * MP_DPDK_MEMIF_RELAY=0 or it cannot be had. The returned string lives as
 * long as the process (EAL may keep pointers into its arguments).
 */
static char *vdev_arg(const char *vdev)
{
	char out[1024];
	int rc = 0;

	if (!strncmp(vdev, "net_memif", 9) && env_long("MP_DPDK_MEMIF_RELAY", 1, 0, 1)) {
		/* The device's name, as its ethdev is called: memif_peer_end's argument. */
		char *dev = strndup(vdev, strcspn(vdev, ","));

		if (!dev)
			return NULL;
		rc = mp_memif_relay_start(vdev, out, sizeof(out), memif_peer_end, dev);
		if (rc <= 0) {
			free(dev);
			MP_WARN("dpdk: no memif relay for %s: %s; a memif peer that dies may crash "
				"this process (doc/dpdk.md)", vdev, strerror(-rc));
		}
	}
	return strdup(rc > 0 ? out : vdev);
}

static int eal_up(uint16_t mtu, unsigned mbufs)
{
	const char *user = getenv("MP_DPDK_EAL");
	char args[1024], lc[512];
	char **argv;
	int argc, rc;
	bool huge = false;
	long mem_mb = env_long("MP_DPDK_MEM_MB", eal_mem_default(mtu, mbufs), 16, 1 << 20);

	if (g.eal)
		return g.eal > 0 ? 0 : g.eal;
	if (user && *user) {
		snprintf(args, sizeof(args), "%s", user);
	} else {
		const char *vdev = getenv("MP_DPDK_VDEV");
		/* memif's zero-copy client shares its memory as one file per list. */
		bool one_file = vdev && strstr(vdev, "zero-copy=yes");
		/*
		 * Hugepages on request, in memory only: no files in hugetlbfs
		 * outlive the process (a peer killed with SIGKILL included).
		 */
		huge = env_long("MP_DPDK_HUGEPAGES", 0, 0, 1);

		lcores_arg(lc, sizeof(lc));
		snprintf(args, sizeof(args),
			 "%s %s%s -m %ld --no-pci --no-shconf --no-telemetry --file-prefix=mp%ld "
			 "--log-level=%s%s%s",
			 lc, huge ? "--in-memory" : "--no-huge", one_file ? " --single-file-segments" : "",
			 mem_mb, (long)getpid(),
			 mp_log_get_level() >= MP_LOG_TRACE ? "info" : "warning",
			 vdev && *vdev ? " --vdev=" : "",
			 vdev && *vdev ? vdev : "");
	}
	argv = split_args(args, &argc);
	if (!argv)
		return -ENOMEM;
	MP_INFO("dpdk: EAL arguments: %s", args);
	/* memif devices get a relay for their control connection (memif_peer_end). */
	for (int i = 1; i < argc; i++) {
		bool eq = !strncmp(argv[i], "--vdev=", 7);
		bool sep = !strcmp(argv[i], "--vdev") && i + 1 < argc;
		char *v;

		if (!eq && !sep)
			continue;
		i += sep;
		v = vdev_arg(eq ? argv[i] + 7 : argv[i]);
		if (!v)
			return -ENOMEM;
		if (eq) {
			char *a = malloc(strlen(v) + 8);

			if (!a)
				return -ENOMEM;
			sprintf(a, "--vdev=%s", v);
			free(v);
			v = a;
		}
		argv[i] = v;
	}
	rc = rte_eal_init(argc, argv);
	if (rc < 0) {
		int e = rte_errno;

		MP_WARN("dpdk: EAL initialisation failed: %s (%s); arguments: %s", rte_strerror(e),
			eal_hint(e), args);
		if (huge)
			MP_WARN("dpdk: MP_DPDK_HUGEPAGES=1 wants %ld MB of hugepages and %ld pages are "
				"free (/proc/meminfo): reserve more, e.g. echo 256 > "
				"/proc/sys/vm/nr_hugepages, or leave MP_DPDK_HUGEPAGES unset",
				mem_mb, free_hugepages());
		g.eal = -(e ? e : EINVAL);
		return g.eal;
	}
	g.eal = 1;
	clock_setup();
	MP_INFO("dpdk: EAL up: %s, IOVA as %s", rte_eal_has_hugepages() ? "hugepages" : "no hugepages",
		rte_eal_iova_mode() == RTE_IOVA_VA ? "VA" : "PA");
	/* With --no-shconf EAL leaves its runtime directory empty: do not litter /var/run. */
	if (rmdir(rte_eal_get_runtime_dir()) == 0)
		MP_TRACE("dpdk: removed the empty EAL runtime directory");
	return 0;
}

/* ---- port ---- */

static int port_setup(uint16_t nq, uint16_t mtu, unsigned mbufs, uint16_t ring)
{
	struct rte_eth_conf conf;
	struct rte_eth_dev_info info;
	uint16_t port = (uint16_t)env_long("MP_DPDK_PORT", 0, 0, RTE_MAX_ETHPORTS - 1);
	unsigned room;
	char name[RTE_MEMPOOL_NAMESIZE];
	int rc;

	if (!rte_eth_dev_is_valid_port(port)) {
		MP_WARN("dpdk: no port %u (%u port(s) available): give a NIC bound to a DPDK driver "
			"or a --vdev in MP_DPDK_EAL, or MP_DPDK_VDEV", port,
			rte_eth_dev_count_avail());
		return -ENODEV;
	}
	rc = rte_eth_dev_info_get(port, &info);
	if (rc)
		return rc;
	if (nq > info.max_rx_queues || nq > info.max_tx_queues) {
		MP_WARN("dpdk: port %u (%s) has at most %u rx / %u tx queues, MP_DPDK_QUEUES=%u",
			port, info.driver_name, info.max_rx_queues, info.max_tx_queues, nq);
		return -EINVAL;
	}
	memset(&conf, 0, sizeof(conf));
	g.multiseg = (info.tx_offload_capa & RTE_ETH_TX_OFFLOAD_MULTI_SEGS) != 0;
	if (g.multiseg)
		conf.txmode.offloads |= RTE_ETH_TX_OFFLOAD_MULTI_SEGS;
	if (nq > 1 && (info.flow_type_rss_offloads & RTE_ETH_RSS_NONFRAG_IPV4_UDP)) {
		/* Spread peers over the rx queues by address and port. */
		conf.rxmode.mq_mode = RTE_ETH_MQ_RX_RSS;
		conf.rx_adv_conf.rss_conf.rss_hf = RTE_ETH_RSS_NONFRAG_IPV4_UDP;
	}
	rc = rte_eth_dev_configure(port, nq, nq, &conf);
	if (rc) {
		MP_WARN("dpdk: configuring port %u (%s) with %u queue pair(s): %s", port,
			info.driver_name, nq, rte_strerror(-rc));
		return rc;
	}
	/*
	 * A frame copied into one mbuf: headroom plus the largest frame, rounded
	 * up to 128. memif takes its fast receive path (one mbuf per ring
	 * buffer, allocated in bulk) only if the data room holds a whole ring
	 * buffer (bsize): for MTU 9000 its slow path cost 30 us per round trip.
	 */
	room = frame_room(mtu);
	snprintf(name, sizeof(name), "mp_frames_%u", port);
	g.pool = rte_pktmbuf_pool_create(name, mbufs, 256, 0, (uint16_t)room, (int)rte_socket_id());
	/* Attached mbufs need no data room; the shared info sits in what they have. */
	snprintf(name, sizeof(name), "mp_attach_%u", port);
	g.zpool = g.multiseg ? rte_pktmbuf_pool_create(name, mbufs, 256, 0,
						      sizeof(struct rte_mbuf_ext_shared_info) + 64,
						      (int)rte_socket_id())
			     : NULL;
	if (!g.pool || (g.multiseg && !g.zpool)) {
		MP_WARN("dpdk: cannot create %u mbufs of %u bytes: %s (MP_DPDK_MBUFS, or more "
			"memory: -m / hugepages)", mbufs, room, rte_strerror(rte_errno));
		return -ENOMEM;
	}
	for (uint16_t q = 0; q < nq; q++) {
		rc = rte_eth_rx_queue_setup(port, q, ring, rte_eth_dev_socket_id(port), NULL, g.pool);
		if (!rc)
			rc = rte_eth_tx_queue_setup(port, q, ring, rte_eth_dev_socket_id(port), NULL);
		if (rc) {
			MP_WARN("dpdk: queue %u of port %u: %s", q, port, rte_strerror(-rc));
			return rc;
		}
	}
	/* Virtual devices often have no MTU to set; frames are sized by us anyway. */
	rc = rte_eth_dev_set_mtu(port, mtu);
	if (rc)
		MP_INFO("dpdk: port %u (%s): MTU %u not set (%s); make sure the path carries it",
			port, info.driver_name, mtu, rte_strerror(-rc));
	rte_eth_macaddr_get(port, &g.mac);
	g.pci = info.device && strcmp(rte_bus_name(rte_dev_bus(info.device)), "vdev") != 0;
	if (info.device && !strcmp(info.driver_name, "net_memif")) {
		const struct rte_devargs *da = rte_dev_devargs(info.device);

		g.memif = true;
		g.dials = da && da->args && strstr(da->args, "role=client");
		g.memif_zc = g.dials && strstr(da->args, "zero-copy=yes");
	}
	g.port = port;
	g.nq = nq;
	g.mtu = mtu;
	snprintf(g.driver, sizeof(g.driver), "%s", info.driver_name ? info.driver_name : "unknown");
	g.port_ready = true;
	MP_INFO("dpdk: port %u (%s), %u queue pair(s) of %u descriptors, MTU %u, %u mbufs, "
		"chained tx %s", port, info.driver_name, nq, ring, mtu, mbufs,
		g.multiseg ? "yes" : "no");
	return 0;
}

/* The port's link as it is now (memif: a peer that left takes it down). */
static bool port_link_raw(void)
{
	struct rte_eth_link link;

	memset(&link, 0, sizeof(link));
	rte_eth_link_get_nowait(g.port, &link);
	return link.link_status == RTE_ETH_LINK_UP;
}

/*
 * Whether bursts may touch the port: its link is up and no memif peer that
 * said BYE is still leaving. Once that peer's link went down, its rings are
 * gone from our side too and a new peer may connect.
 */
static bool port_link_up(void)
{
	if (atomic_load_explicit(&g.gone, memory_order_acquire)) {
		if (port_link_raw())
			return false;
		/* Our memif took the link down (and unmapped) after the relay let it. */
		atomic_store_explicit(&g.gone, false, memory_order_release);
		MP_INFO("dpdk: the memif peer that ended its connection is gone");
		return false;
	}
	if (atomic_load_explicit(&g.quiet, memory_order_acquire)) {
		if (port_link_raw())
			return false;
		atomic_store_explicit(&g.quiet, false, memory_order_release);
		MP_INFO("dpdk: the memif peer that said BYE is gone");
		return false;
	}
	return port_link_raw();
}

/* Start the port and wait (bounded) for its link: memif has none until its peer came. */
static int port_start(int wait_ms)
{
	uint64_t until = mp_now_ns() + (uint64_t)wait_ms * 1000000u;
	int rc;

	if (!g.started) {
		pthread_mutex_lock(&g.stop_lock);
		rc = rte_eth_dev_start(g.port);
		g.started = rc == 0;
		pthread_mutex_unlock(&g.stop_lock);
		if (rc) {
			MP_WARN("dpdk: starting port %u: %s", g.port, rte_strerror(-rc));
			return rc;
		}
		/* Frames to our address; af_packet and memif deliver everything anyway. */
		rte_eth_promiscuous_disable(g.port);
		/*
		 * A memif server must be started before its client dials, or the
		 * two sides disagree about the link: launchers wait for this file.
		 */
		const char *ready = getenv("MP_DPDK_READY_FILE");

		if (ready && *ready) {
			FILE *f = fopen(ready, "w");

			if (f)
				fclose(f);
		}
	}
	for (uint64_t redial = mp_now_ns() + 500000000u;;) {
		if (port_link_raw())
			return 0;
		if (mp_now_ns() >= until)
			break;
		/*
		 * A memif client that dialled before its server was ready is not
		 * retried by the PMD: restarting the port dials again.
		 */
		if (g.dials && mp_now_ns() >= redial) {
			redial = mp_now_ns() + 500000000u;
			pthread_mutex_lock(&g.stop_lock);
			if (rte_eth_dev_stop(g.port) == 0 && rte_eth_dev_start(g.port) != 0)
				MP_TRACE("dpdk: memif server not there yet");
			pthread_mutex_unlock(&g.stop_lock);
		}
		usleep(1000);
	}
	MP_WARN("dpdk: port %u link still down after %d ms; frames wait for retransmission",
		g.port, wait_ms);
	return 0;
}

/* ---- routes ---- */

static uint32_t route_hash(const uint8_t ip[4], const uint8_t port[2])
{
	uint64_t k = (uint64_t)ip[0] << 40 | (uint64_t)ip[1] << 32 | (uint64_t)ip[2] << 24 |
		     (uint64_t)ip[3] << 16 | (uint64_t)port[0] << 8 | port[1];

	k *= 0x9E3779B97F4A7C15ULL;
	return (uint32_t)(k >> 40) & (DPDK_HASH_SLOTS - 1);
}

/* The route of @a (by IP and port) in @l, made if new; -ENOSPC when the table is full. */
static int64_t route_get(struct dpdk_lane *l, const struct mp_dpdk_addr *a)
{
	uint32_t h = route_hash(a->ip, a->port);

	for (;; h = (h + 1) & (DPDK_HASH_SLOTS - 1)) {
		int32_t e = l->hash[h];

		if (!e)
			break;
		struct dpdk_route *r = &l->routes[e - 1];

		if (!memcmp(r->a.ip, a->ip, 4) && !memcmp(r->a.port, a->port, 2))
			return e - 1;
	}
	if (l->nroutes == DPDK_ROUTES_MAX)
		return -ENOSPC;
	l->routes[l->nroutes].a = *a;
	l->hash[h] = (int32_t)++l->nroutes;
	return l->nroutes - 1;
}

/* ---- transmit ---- */

static uint16_t txq_flush(struct dpdk_lane *l)
{
	struct dpdk_txq *t = &l->txq;
	uint16_t sent;

	/*
	 * Nothing goes to a port whose link is down: memif tears its rings
	 * down when the peer leaves, and a burst into them can crash.
	 */
	/* quiet is set with every lane's lock held (bye_answer): ours orders it. */
	if (!t->n || !l->link_up || atomic_load_explicit(&g.quiet, memory_order_relaxed))
		return 0;
	sent = port_tx(l->q, t->m, t->n);
	if (sent < t->n)
		memmove(t->m, t->m + sent, (size_t)(t->n - sent) * sizeof(t->m[0]));
	t->n = (uint16_t)(t->n - sent);
	l->st.tx_frames += sent;
	return sent;
}

/*
 * The registration holding [p, p + len) that may be attached; NULL = copy.
 * A lane remembers the last one it found: a message's segments come from
 * the same registration, and taking the lock for each of them cost a one-way
 * stream about 2% of its rate. mr_gen tells it when a deregistration may
 * have freed what it remembers; the range is copied so that checking it
 * never reads a registration another thread is freeing.
 */
static const struct mp_drv_mr *zc_find(struct dpdk_lane *l, const void *p, size_t len)
{
	struct dpdk_drv *d = l->d;
	uintptr_t a = (uintptr_t)p;
	unsigned gen = atomic_load_explicit(&d->mr_gen, memory_order_acquire);
	const struct mp_drv_mr *found = NULL;

	if (l->zc_last && l->zc_gen == gen && a >= l->zc_lo && a + len <= l->zc_hi)
		return l->zc_last;
	pthread_mutex_lock(&d->mr_lock);
	for (struct mp_drv_mr *m = d->mrs; m; m = m->next)
		if (m->zc && a >= m->lo && a + len <= m->hi) {
			found = m;
			break;
		}
	gen = atomic_load_explicit(&d->mr_gen, memory_order_relaxed);
	pthread_mutex_unlock(&d->mr_lock);
	l->zc_last = found;
	if (found) {
		l->zc_lo = found->lo;
		l->zc_hi = found->hi;
	}
	l->zc_gen = gen;
	return found;
}

/*
 * An mbuf of @mp from a lane's stash @st of *@n, refilled a burst at a time.
 * Two mbufs a frame (headers, attached payload) one by one were the sender's
 * largest cost after memif's copy; in bulk the pool's cache is looked up
 * once a burst. NULL when the pool is empty.
 */
static inline struct rte_mbuf *stash_get(struct rte_mempool *mp, struct rte_mbuf **st, uint16_t *n)
{
	if (!*n) {
		if (rte_pktmbuf_alloc_bulk(mp, st, DPDK_BURST))
			return rte_pktmbuf_alloc(mp); /* fewer than a burst left */
		*n = DPDK_BURST;
	}
	return st[--*n];
}

static void ext_free_noop(void *addr, void *opaque)
{
	/* The memory is the application's; rel tells it when the send is done. */
	(void)addr;
	(void)opaque;
}

/* An mbuf carrying @len bytes at @p as an external buffer, or NULL. */
static struct rte_mbuf *attach_piece(struct dpdk_lane *l, const void *p, size_t len)
{
	struct rte_mbuf *m = stash_get(g.zpool, l->zstash, &l->zn);
	struct rte_mbuf_ext_shared_info *sh;

	if (!m)
		return NULL;
	/* The mbuf's own data room is unused while attached: the shared info lives there. */
	sh = (struct rte_mbuf_ext_shared_info *)RTE_PTR_ALIGN_CEIL(m->buf_addr, 8);
	sh->free_cb = ext_free_noop;
	sh->fcb_opaque = NULL;
	rte_mbuf_ext_refcnt_set(sh, 1);
	/*
	 * The IOVA is the address: reg_mr maps registered memory for a NIC's
	 * DMA at IOVA = VA, and virtual devices copy with the CPU. (Asking EAL,
	 * rte_mem_virt2iova, reads /proc/self/pagemap in IOVA-as-PA mode:
	 * with hugepages that was a system call per segment and cut the rate
	 * ten-fold.)
	 */
	rte_pktmbuf_attach_extbuf(m, (void *)(uintptr_t)p, (rte_iova_t)(uintptr_t)p,
				  (uint16_t)len, sh);
	m->data_off = 0;
	m->data_len = (uint16_t)len;
	m->pkt_len = (uint32_t)len;
	return m;
}

/* rel's output: one segment, one frame, on the lane's tx queue. */
static int tx_segment(void *user, uint32_t route, const void *hdr, size_t hdr_len,
		      const struct mp_iov *payload, int n)
{
	struct dpdk_lane *l = user;
	struct dpdk_drv *d = l->d;
	struct dpdk_route *r;
	struct dpdk_txq *t = &l->txq;
	struct rte_mbuf *m, *last;
	size_t plen = hdr_len, off;
	uint8_t *p;
	uint32_t sum = 0;

	if (route >= l->nroutes)
		return -EINVAL;
	r = &l->routes[route];
	if (t->n == DPDK_BURST && !txq_flush(l)) {
		l->st.tx_again++;
		return -EAGAIN;
	}
	for (int i = 0; i < n; i++)
		plen += payload[i].len;
	if (MP_FRAME_HDR_LEN + plen > (size_t)g.mtu + RTE_ETHER_HDR_LEN)
		return -EMSGSIZE;
	m = stash_get(g.pool, l->hstash, &l->hn);
	if (!m) {
		l->st.tx_nombuf++;
		return -ENOBUFS;
	}
	p = rte_pktmbuf_mtod(m, uint8_t *);
	mp_frame_build(p, &d->self, &r->a, l->ip_id++, plen);
	memcpy(p + MP_FRAME_HDR_LEN, hdr, hdr_len);
	m->data_len = (uint16_t)(MP_FRAME_HDR_LEN + hdr_len);
	m->pkt_len = m->data_len;
	if (d->udp_csum)
		sum = mp_csum_add(0, hdr, hdr_len, 0);
	off = hdr_len;
	last = m;
	for (int i = 0; i < n; i++) {
		const struct mp_iov *v = &payload[i];
		const struct mp_drv_mr *z;
		struct rte_mbuf *x = NULL;

		if (!v->len)
			continue;
		z = d->zc ? zc_find(l, v->base, v->len) : NULL;
		if (d->udp_csum)
			sum = mp_csum_add(sum, v->base, v->len, off);
		off += v->len;
		/*
		 * Small pieces are cheaper to copy, but device memory a NIC
		 * reads by DMA is attached whatever its size: the CPU cannot
		 * read it (reg_device leaves such pieces at their GPU address).
		 */
		if (z && (v->len >= DPDK_ZC_MIN || z->device))
			x = attach_piece(l, v->base, v->len);
		if (!x && z && z->device) {
			rte_pktmbuf_free(m);
			l->st.tx_nombuf++;
			return -ENOBUFS;
		}
		if (x) {
			last->next = x;
			last = x;
			m->nb_segs++;
			m->pkt_len += (uint32_t)v->len;
			l->st.tx_zc_pieces++;
			continue;
		}
		/* Copy into the last mbuf when it is ours, else into a fresh one. */
		if (last != m || rte_pktmbuf_tailroom(m) < v->len) {
			x = stash_get(g.pool, l->hstash, &l->hn);
			if (!x) {
				rte_pktmbuf_free(m);
				l->st.tx_nombuf++;
				return -ENOBUFS;
			}
			x->data_len = 0;
			last->next = x;
			last = x;
			m->nb_segs++;
		}
		memcpy(rte_pktmbuf_mtod_offset(last, uint8_t *, last->data_len), v->base, v->len);
		last->data_len = (uint16_t)(last->data_len + v->len);
		m->pkt_len += (uint32_t)v->len;
	}
	if (d->udp_csum)
		mp_frame_udp_csum(p, sum);
	t->m[t->n++] = m;
	return 0;
}

static void send_arp_reply(struct dpdk_lane *l, const uint8_t *req)
{
	struct rte_mbuf *m = rte_pktmbuf_alloc(g.pool);
	struct dpdk_txq *t = &l->txq;

	if (!m) {
		l->st.tx_nombuf++;
		return;
	}
	if (t->n == DPDK_BURST && !txq_flush(l)) {
		rte_pktmbuf_free(m);
		return;
	}
	/* Padded to the 60-byte minimum frame. */
	memset(rte_pktmbuf_mtod(m, uint8_t *), 0, 60);
	mp_frame_arp_reply(rte_pktmbuf_mtod(m, uint8_t *), req, &l->d->self);
	m->data_len = 60;
	m->pkt_len = 60;
	t->m[t->n++] = m;
	l->st.arp_replies++;
}

/* ---- leaving a memif pair ----
 *
 * When one side of a memif pair stops its port, DPDK's memif on the other
 * side unmaps the shared rings from its interrupt thread at once, whatever
 * that side's pollers are doing: one caught inside a burst dies of SIGSEGV.
 * So a side that leaves says BYE first and stops its port only once the
 * other has answered, and the other answers only once none of its lanes is
 * in a burst and none will start one (quiet) until the link has gone down.
 * If both leave at once, the client yields: it answers the server's BYE and
 * waits for the link to go down instead of waiting for an answer to its own.
 * A peer that does not answer within MP_DPDK_BYE_MS is left anyway (it was
 * not polling, or it is gone). doc/dpdk.md, "Leaving a memif pair".
 */

/* Send a BYE or its ACK to @to on queue @q, bypassing quiet; 0 once it is out. */
static int bye_send(uint16_t q, const struct mp_dpdk_addr *self, const struct mp_dpdk_addr *to,
		    int type, uint32_t nonce)
{
	struct rte_mbuf *m = rte_pktmbuf_alloc(g.pool);
	uint8_t *p;

	if (!m)
		return -ENOBUFS;
	p = rte_pktmbuf_mtod(m, uint8_t *);
	memset(p, 0, 60); /* padded to the 60-byte minimum frame */
	mp_frame_build(p, self, to, 0, MP_BYE_LEN);
	mp_bye_build(p + MP_FRAME_HDR_LEN, type, nonce);
	m->data_len = 60;
	m->pkt_len = 60;
	for (int k = 0; k < 100; k++) {
		if (port_tx(q, &m, 1) == 1)
			return 0;
		usleep(10);
	}
	rte_pktmbuf_free(m);
	return -EAGAIN;
}

/* Answer the BYE with @nonce from @to on queue @q (the port is quiet by now). */
static void bye_ack(uint16_t q, const struct mp_dpdk_addr *self, const struct mp_dpdk_addr *to,
		    uint32_t nonce)
{
	if (bye_send(q, self, to, MP_BYE_ACK, nonce))
		MP_WARN("dpdk: could not answer the memif peer's BYE; it leaves after MP_DPDK_BYE_MS");
	else
		atomic_fetch_add(&g.bye_rx, 1);
}

/*
 * The peer at @from says BYE on lane @l: make every lane quiet, then answer.
 * Runs inside @l's poll with its lock held; the other lanes' locks are taken
 * in turn (each lane takes only its own otherwise), so that a lane in a burst
 * finishes it first and the next poll of each sees quiet.
 */
static void bye_answer(struct dpdk_lane *l, const struct mp_dpdk_addr *from, uint32_t nonce)
{
	struct dpdk_drv *d = l->d;

	atomic_store(&g.quiet, true);
	for (uint16_t i = 0; i < d->nlanes; i++)
		if (i != l->q && d->lanes[i]) {
			rte_ticketlock_lock(&d->lanes[i]->lock);
			rte_ticketlock_unlock(&d->lanes[i]->lock);
		}
	bye_ack(l->q, &d->self, from, nonce);
	MP_INFO("dpdk: the memif peer is leaving: no bursts until its link goes down");
}

#define BYE_TO_MAX 8 /* peers a leaving side says BYE to (a memif pair has one) */

/* The counter file of this process (MP_DPDK_STATS), or NULL when there is none. */
static const char *stats_path(const struct dpdk_drv *d, char *path, size_t cap)
{
	const char *dir = getenv("MP_DPDK_STATS");

	if (!dir || !*dir)
		return NULL;
	snprintf(path, cap, "%s/dpdk.%d.%ld.stats", dir, d->rank, (long)getpid());
	return path;
}

/* How our leaving went, after the counters (written before it): a line of its own. */
static void bye_note(const struct dpdk_drv *d, const char *how)
{
	char path[512];
	FILE *f;

	MP_INFO("dpdk: leaving: bye=%s bye_rx=%u peer_lost=%u peer_left=%u", how,
		atomic_load(&g.bye_rx), atomic_load(&g.peer_lost), atomic_load(&g.peer_left));
	if (!stats_path(d, path, sizeof(path)) || !(f = fopen(path, "a")))
		return;
	/* One word, for the key=value readers: "peer left first" -> peer_left_first. */
	fprintf(f, "bye=");
	for (const char *c = how; *c; c++)
		fputc(*c == ' ' ? '_' : *c, f);
	fprintf(f, " bye_rx=%u peer_lost=%u peer_left=%u\n", atomic_load(&g.bye_rx),
		atomic_load(&g.peer_lost), atomic_load(&g.peer_left));
	fclose(f);
}

/*
 * dpdk_fini's BYE to the peers in @to (the routes its lanes knew), before the
 * port stops: wait (MP_DPDK_BYE_MS) for an answer, or as the client of two
 * leaving at once, answer the server and wait for its link to go down.
 */
static void bye_leave(struct dpdk_drv *d, const struct mp_dpdk_addr *to, unsigned n)
{
	long ms = env_long("MP_DPDK_BYE_MS", 1000, 0, 600000);
	uint64_t t0 = mp_now_ns(), until = t0 + (uint64_t)ms * 1000000u;
	const char *how;
	bool yielded = false, acked = false;
	uint32_t mine;
	unsigned sent = 0;

	if (!g.memif || !g.started)
		return;
	if (atomic_load(&g.quiet)) {
		/*
		 * We answered the peer's BYE: it may still be polling for that
		 * answer, and stopping our port would unmap the rings under it.
		 * It stops first; then our link goes down.
		 */
		while (port_link_raw() && mp_now_ns() < until)
			usleep(100);
		bye_note(d, port_link_raw() ? "timeout" : "peer left first");
		return;
	}
	if (!port_link_raw() || atomic_load(&g.gone)) {
		bye_note(d, "peer gone"); /* nobody polls the rings (or our memif is about to drop them) */
		return;
	}
	if (!n || !ms) {
		bye_note(d, !ms ? "off" : "no peer"); /* MP_DPDK_BYE_MS=0, or nobody to say it to */
		return;
	}
	mine = (uint32_t)rte_rand() | 1u; /* its ACK echoes it */
	for (unsigned i = 0; i < n; i++)
		sent += bye_send(0, &d->self, &to[i], MP_BYE, mine) == 0;
	while (sent && !acked && mp_now_ns() < until && port_link_raw() && !atomic_load(&g.gone)) {
		struct rte_mbuf *b[DPDK_BURST];

		if (yielded) {
			usleep(100); /* we answered the server's BYE: it stops first */
			continue;
		}
		for (uint16_t q = 0; q < g.nq && !yielded; q++) {
			uint16_t k = port_rx(q, b, DPDK_BURST);

			for (uint16_t i = 0; i < k; i++) {
				const uint8_t *f = rte_pktmbuf_mtod(b[i], const uint8_t *), *pl;
				size_t plen;
				struct mp_dpdk_addr src;
				uint32_t nonce;
				int bt;

				if (b[i]->nb_segs == 1 &&
				    mp_frame_classify(f, rte_pktmbuf_data_len(b[i]), &d->self, &pl, &plen,
						      &src) == MP_FRAME_OURS &&
				    mp_bye_parse(pl, plen, &bt, &nonce) == 0) {
					if (bt == MP_BYE_ACK && nonce == mine) {
						acked = true;
					} else if (bt == MP_BYE && g.dials && !yielded) {
						/* Both leave: the client answers, then polls no more. */
						yielded = true;
						atomic_store(&g.quiet, true);
						bye_ack(q, &d->self, &src, nonce);
					}
				}
				rte_pktmbuf_free(b[i]); /* rel is gone: anything else is too late */
			}
		}
	}
	bool timeout = sent && !acked && port_link_raw() && !atomic_load(&g.gone);

	how = !sent ? "not sent" : acked ? "answered" : timeout ? "timeout" :
	      yielded ? "yielded" : "peer gone";
	if (!timeout)
		MP_INFO("dpdk: BYE to the memif peer: %s after %.1f ms", how,
			(double)(mp_now_ns() - t0) / 1e6);
	else
		MP_WARN("dpdk: the memif peer did not answer BYE within %ld ms (MP_DPDK_BYE_MS); "
			"leaving anyway (a peer with the memif relay stops its bursts first; one "
			"without it may crash if it polls now)", ms);
	bye_note(d, how);
}

/* ---- receive ---- */

static void deliver_held(struct dpdk_lane *l)
{
	if (!l->held)
		return;
	mp_rel_input(l->rel, l->held_route, l->held_payload, l->held_len);
	rte_pktmbuf_free(l->held);
	l->held = NULL;
}

/* One received frame; @steered: another lane received it for this one (counted there). */
static void rx_frame(struct dpdk_lane *l, struct rte_mbuf *m, bool steered)
{
	struct dpdk_drv *d = l->d;
	const uint8_t *f = rte_pktmbuf_mtod(m, const uint8_t *), *pl;
	size_t len = rte_pktmbuf_data_len(m), plen;
	struct mp_dpdk_addr src;
	int64_t route;
	int v;

	if (!steered)
		l->st.rx_frames++;
	if (m->nb_segs > 1) {
		if (m->pkt_len > sizeof(l->flat)) {
			l->st.verdict[MP_FRAME_BAD_IP]++;
			rte_pktmbuf_free(m);
			return;
		}
		f = rte_pktmbuf_read(m, 0, m->pkt_len, l->flat);
		len = m->pkt_len;
		if (!steered)
			l->st.rx_multiseg++;
	}
	v = mp_frame_classify(f, len, &d->self, &pl, &plen, &src);
	if (!steered)
		l->st.verdict[v]++;
	if (v == MP_FRAME_ARP_REQUEST)
		send_arp_reply(l, f);
	if (v != MP_FRAME_OURS) {
		rte_pktmbuf_free(m);
		return;
	}
	int bt;
	uint32_t nonce;
	int br = mp_bye_parse(pl, plen, &bt, &nonce);

	if (br != 1) {
		/* Only a memif peer leaves this way (a frame on a shared segment could
		 * come from anyone); an ACK matters only while we leave (bye_leave). */
		if (br || !g.memif)
			atomic_fetch_add(&g.bye_bad, 1);
		else if (bt == MP_BYE && l->q == 0 && !atomic_load(&g.quiet))
			bye_answer(l, &src, nonce); /* lane 0 only: one lane takes the others' locks */
		rte_pktmbuf_free(m);
		return;
	}
	if (!steered && d->nlanes > 1) {
		/* A segment for a connection of another lane goes to that lane. */
		int ln = mp_rel_seg_lane(pl, plen);

		if (ln >= 0 && ln < d->nlanes && ln != l->q) {
			if (rte_ring_enqueue(d->lanes[ln]->inbox, m) == 0) {
				l->st.rx_steered++;
			} else {
				l->st.rx_steer_full++;
				rte_pktmbuf_free(m);
			}
			return;
		}
	}
	route = route_get(l, &src);
	if (route < 0) {
		l->st.rx_no_route++;
		rte_pktmbuf_free(m);
		return;
	}
	if (d->loss > 0 && rnd(l) < d->loss) {
		l->st.inj_loss++;
		rte_pktmbuf_free(m);
		return;
	}
	if (d->dup > 0 && rnd(l) < d->dup) {
		l->st.inj_dup++;
		mp_rel_input(l->rel, (uint32_t)route, pl, plen);
	}
	/* A held frame goes after this one; a flat copy cannot be held (l->flat is reused). */
	if (d->reorder > 0 && !l->held && f != l->flat && rnd(l) < d->reorder) {
		l->st.inj_reorder++;
		l->held = m;
		l->held_route = (uint32_t)route;
		l->held_payload = pl;
		l->held_len = plen;
		return;
	}
	mp_rel_input(l->rel, (uint32_t)route, pl, plen);
	rte_pktmbuf_free(m);
	deliver_held(l);
}

/* One pass over a lane: receive, run rel, send. Returns whether anything happened. */
static bool poll_once(struct dpdk_lane *l)
{
	struct rte_mbuf *burst[DPDK_BURST];
	bool work = false;
	uint16_t n = 0;

	l->link_up = port_link_up();
	if (l->link_up)
		n = port_rx(l->q, burst, DPDK_BURST);
	if (n)
		l->burst_ns = fast_ns();
	for (uint16_t i = 0; i < n; i++) {
		/*
		 * The next frame's headers were written by the other side's
		 * core: ask for them while this frame's payload is copied.
		 */
		if (i + 1 < n) {
			const uint8_t *next = rte_pktmbuf_mtod(burst[i + 1], const uint8_t *);

			rte_prefetch0(next);
			rte_prefetch0(next + RTE_CACHE_LINE_SIZE);
		}
		rx_frame(l, burst[i], false);
	}
	if (l->inbox) {
		unsigned k = rte_ring_dequeue_burst(l->inbox, (void **)burst, DPDK_BURST, NULL);

		if (k && !l->burst_ns)
			l->burst_ns = fast_ns();
		for (unsigned i = 0; i < k; i++)
			rx_frame(l, burst[i], true);
		n = (uint16_t)(n + k);
	}
	l->burst_ns = 0;
	work = n > 0;
	/* A frame held for reordering never waits more than one pass. */
	if (l->held && !work) {
		deliver_held(l);
		work = true;
	}
	work |= mp_rel_poll(l->rel) != 0;
	work |= txq_flush(l) > 0;
	return work;
}

/*
 * A lane's polling thread (several lanes): run to completion, spin
 * MP_DPDK_SPIN_US when idle, then nap until rel's next timer (at most 50 us).
 */
static void *lane_main(void *arg)
{
	struct dpdk_lane *l = arg;
	struct dpdk_drv *d = l->d;
	uint64_t idle_since = fast_ns();

	/* Mempool caches are per lcore: this thread gets an lcore id. */
	if (rte_thread_register())
		MP_TRACE("dpdk: lane %u: rte_thread_register: %s", l->q, rte_strerror(rte_errno));
	while (!atomic_load(&d->stop)) {
		uint64_t next, t;
		bool work;

		rte_ticketlock_lock(&l->lock);
		work = poll_once(l);
		next = work ? 0 : mp_rel_next_deadline_ns(l->rel);
		rte_ticketlock_unlock(&l->lock);
		t = fast_ns();
		if (work) {
			atomic_fetch_add(&d->events, 1);
			idle_since = t;
			continue;
		}
		if (t - idle_since >= d->spin_ns && next > t) {
			uint64_t nap = DPDK_NAP_US * 1000u;
			struct timespec ts = {.tv_sec = 0};

			if (next - t < nap)
				nap = next - t;
			ts.tv_nsec = (long)nap;
			nanosleep(&ts, NULL);
		}
	}
	rte_thread_unregister();
	return NULL;
}

/* ---- ops ---- */

static void write_stats(struct dpdk_drv *d)
{
	struct mp_rel_stats rs, x;
	struct dpdk_stats st;
	char line[2048], path[512];
	size_t n = 0;
	FILE *f;

	memset(&rs, 0, sizeof(rs));
	memset(&st, 0, sizeof(st));
	for (uint16_t i = 0; i < d->nlanes; i++) {
		if (!d->lanes[i] || !d->lanes[i]->rel)
			continue; /* init failed half-way */
		const struct dpdk_stats *s = &d->lanes[i]->st;

		mp_rel_get_stats(d->lanes[i]->rel, &x);
		rs.seg_tx += x.seg_tx;
		rs.data_tx += x.data_tx;
		rs.data_rtx += x.data_rtx;
		rs.fast_rtx += x.fast_rtx;
		rs.rto_fired += x.rto_fired;
		rs.seg_rx += x.seg_rx;
		rs.data_rx += x.data_rx;
		rs.dup_rx += x.dup_rx;
		rs.conns_failed += x.conns_failed;
		rs.stream_rx += x.stream_rx;
		for (int w = 0; w < MP_REL_DROP_MAX; w++)
			rs.drop[w] += x.drop[w];
		st.rx_frames += s->rx_frames;
		for (int v = 0; v < MP_FRAME_NVERDICTS; v++)
			st.verdict[v] += s->verdict[v];
		st.rx_no_route += s->rx_no_route;
		st.rx_multiseg += s->rx_multiseg;
		st.rx_steered += s->rx_steered;
		st.rx_steer_full += s->rx_steer_full;
		st.arp_replies += s->arp_replies;
		st.inj_loss += s->inj_loss;
		st.inj_dup += s->inj_dup;
		st.inj_reorder += s->inj_reorder;
		st.tx_frames += s->tx_frames;
		st.tx_zc_pieces += s->tx_zc_pieces;
		st.tx_nombuf += s->tx_nombuf;
		st.tx_again += s->tx_again;
	}
	n += (size_t)snprintf(line + n, sizeof(line) - n,
			      "rx_frames=%llu tx_frames=%llu tx_zc_pieces=%llu tx_nombuf=%llu "
			      "tx_again=%llu arp_replies=%llu rx_no_route=%llu rx_multiseg=%llu "
			      "inj_loss=%llu inj_dup=%llu inj_reorder=%llu bye_bad=%u",
			      (unsigned long long)st.rx_frames, (unsigned long long)st.tx_frames,
			      (unsigned long long)st.tx_zc_pieces, (unsigned long long)st.tx_nombuf,
			      (unsigned long long)st.tx_again, (unsigned long long)st.arp_replies,
			      (unsigned long long)st.rx_no_route, (unsigned long long)st.rx_multiseg,
			      (unsigned long long)st.inj_loss, (unsigned long long)st.inj_dup,
			      (unsigned long long)st.inj_reorder, atomic_load(&g.bye_bad));
	for (int v = 0; v < MP_FRAME_NVERDICTS && n < sizeof(line); v++)
		n += (size_t)snprintf(line + n, sizeof(line) - n, " frame_%s=%llu",
				      mp_frame_verdict_name(v), (unsigned long long)st.verdict[v]);
	if (n < sizeof(line))
		n += (size_t)snprintf(line + n, sizeof(line) - n,
				      " seg_tx=%llu data_tx=%llu data_rtx=%llu fast_rtx=%llu "
				      "rto_fired=%llu seg_rx=%llu data_rx=%llu dup_rx=%llu "
				      "conns_failed=%llu stream_rx=%llu",
				      (unsigned long long)rs.seg_tx, (unsigned long long)rs.data_tx,
				      (unsigned long long)rs.data_rtx, (unsigned long long)rs.fast_rtx,
				      (unsigned long long)rs.rto_fired, (unsigned long long)rs.seg_rx,
				      (unsigned long long)rs.data_rx, (unsigned long long)rs.dup_rx,
				      (unsigned long long)rs.conns_failed, (unsigned long long)rs.stream_rx);
	for (int w = 0; w < MP_REL_DROP_MAX && n < sizeof(line); w++)
		n += (size_t)snprintf(line + n, sizeof(line) - n, " rel_drop_%s=%llu",
				      mp_rel_drop_name(w), (unsigned long long)rs.drop[w]);
	if (d->nlanes > 1 && n < sizeof(line)) {
		n += (size_t)snprintf(line + n, sizeof(line) - n, " rx_steered=%llu rx_steer_full=%llu",
				      (unsigned long long)st.rx_steered,
				      (unsigned long long)st.rx_steer_full);
		/* Each lane's data segments: how the connections spread over the queues. */
		for (uint16_t i = 0; i < d->nlanes && n < sizeof(line); i++) {
			if (!d->lanes[i] || !d->lanes[i]->rel)
				continue;
			mp_rel_get_stats(d->lanes[i]->rel, &x);
			n += (size_t)snprintf(line + n, sizeof(line) - n, " lane%u_data_rx=%llu", i,
					      (unsigned long long)x.data_rx);
		}
	}
	MP_INFO("dpdk: counters: %s", line);
	if (!stats_path(d, path, sizeof(path)))
		return;
	f = fopen(path, "w");
	if (!f) {
		MP_WARN("dpdk: MP_DPDK_STATS: cannot write %s", path);
		return;
	}
	fprintf(f, "%s\n", line);
	fclose(f);
}

static void lane_free(struct dpdk_lane *l)
{
	void *m;

	for (uint16_t i = 0; i < l->txq.n; i++)
		rte_pktmbuf_free(l->txq.m[i]);
	rte_pktmbuf_free_bulk(l->hstash, l->hn);
	rte_pktmbuf_free_bulk(l->zstash, l->zn);
	while (l->inbox && rte_ring_dequeue(l->inbox, &m) == 0)
		rte_pktmbuf_free(m);
	rte_ring_free(l->inbox);
	free(l->routes);
	free(l->hash);
	rte_free(l);
}

/* ---- registrations ---- */

/* Put @m on the instance's list (tx_segment looks pieces up there) and hand it out. */
static int mr_add(struct dpdk_drv *d, struct mp_drv_mr *m, struct mp_drv_mr **out)
{
	pthread_mutex_lock(&d->mr_lock);
	m->next = d->mrs;
	d->mrs = m;
	pthread_mutex_unlock(&d->mr_lock);
	*out = m;
	return 0;
}

/* Undo a registration taken off the list: DMA mapping, EAL, gpudev. */
static void mr_free(struct mp_drv_mr *m)
{
	if (m->extmem) {
		struct rte_eth_dev_info info;

		if (rte_eth_dev_info_get(g.port, &info) == 0)
			rte_dev_dma_unmap(info.device, (void *)m->ext_lo, m->ext_lo, m->ext_len);
		rte_extmem_unregister((void *)m->ext_lo, m->ext_len);
	}
#ifdef MP_HAVE_DPDK_GPUDEV
	if (m->device)
		mp_dpdk_gpu_dereg(&m->gpu);
#endif
	free(m);
}

static void dpdk_fini(struct mp_drv *dd)
{
	struct dpdk_drv *d = (struct dpdk_drv *)dd;
	bool stats = false;

	if (!d)
		return;
	atomic_store(&d->stop, true);
	for (uint16_t i = 0; i < d->nlanes; i++)
		if (d->lanes[i] && d->lanes[i]->thread_up)
			pthread_join(d->lanes[i]->thread, NULL);
	for (uint16_t i = 0; i < d->nlanes; i++)
		if (d->lanes[i] && d->lanes[i]->rel) {
			deliver_held(d->lanes[i]);
			stats = true;
		}
	if (stats)
		write_stats(d);
	struct mp_dpdk_addr bye_to[BYE_TO_MAX];
	unsigned nbye = 0;

	for (uint16_t i = 0; i < d->nlanes; i++) {
		struct dpdk_lane *l = d->lanes[i];

		if (!l)
			continue;
		for (uint32_t r = 0; r < l->nroutes; r++) {
			unsigned k = 0;

			while (k < nbye && memcmp(&bye_to[k], &l->routes[r].a, sizeof(bye_to[k])))
				k++;
			if (k == nbye && nbye < BYE_TO_MAX)
				bye_to[nbye++] = l->routes[r].a;
		}
		if (l->rel) {
			/* FINs for what is still open, flushed while the port still runs. */
			mp_rel_destroy(l->rel);
			for (int k = 0; k < 100 && g.started && l->txq.n; k++) {
				/* Not the last poll's view: a memif peer may have left since. */
				l->link_up = port_link_up();
				txq_flush(l);
				if (l->txq.n)
					usleep(100);
			}
		}
		lane_free(l);
		d->lanes[i] = NULL;
	}
	while (d->mrs) {
		struct mp_drv_mr *m = d->mrs;

		d->mrs = m->next;
		mr_free(m);
	}
	pthread_mutex_destroy(&d->mr_lock);
	pthread_mutex_lock(&g.lock);
	if (g.live == d) {
		bye_leave(d, bye_to, nbye);
		/* EAL stays up (it cannot be initialised twice); the port is stopped for the next one. */
		pthread_mutex_lock(&g.stop_lock);
		if (g.started && rte_eth_dev_stop(g.port) == 0)
			g.started = false;
		atomic_store(&g.quiet, false); /* a later instance starts the port afresh */
		atomic_store(&g.gone, false);
		pthread_mutex_unlock(&g.stop_lock);
		g.live = NULL;
	}
	pthread_mutex_unlock(&g.lock);
	free(d);
}

/* Lane @q of @d, with its rel instance; the caller has checked the parameters' ranges. */
static int lane_new(struct dpdk_drv *d, uint16_t q, const struct mp_rel_params *base,
		    uint64_t seed)
{
	struct dpdk_lane *l = rte_zmalloc("mp_dpdk_lane", sizeof(*l), RTE_CACHE_LINE_SIZE);
	struct mp_rel_params rp = *base;
	char name[RTE_RING_NAMESIZE];
	int rc;

	if (!l)
		return -ENOMEM;
	d->lanes[q] = l;
	l->d = d;
	l->q = q;
	rte_ticketlock_init(&l->lock);
	l->routes = calloc(DPDK_ROUTES_MAX, sizeof(*l->routes));
	l->hash = calloc(DPDK_HASH_SLOTS, sizeof(*l->hash));
	if (!l->routes || !l->hash)
		return -ENOMEM;
	if (d->nlanes > 1) {
		/* Any lane may hand frames to this one; only this one takes them. */
		snprintf(name, sizeof(name), "mp_lane_%d_%u", (int)getpid() % 100000, q);
		l->inbox = rte_ring_create(name, 1024, (int)rte_socket_id(), RING_F_SC_DEQ);
		if (!l->inbox)
			return -ENOMEM;
	}
	l->rng = seed * 2654435761u + (uint64_t)(d->rank + 1) * 0x9E3779B97F4A7C15ULL +
		 (uint64_t)q * 0xD1B54A32D192ED03ULL;
	if (!l->rng)
		l->rng = 1;
	rp.user = l;
	rp.lanes = d->nlanes;
	rp.lane = q;
	rc = mp_rel_create(&rp, &l->rel);
	if (rc)
		MP_WARN("dpdk: reliable delivery: %s (MP_DPDK_WINDOW must be a power of two in "
			"64..%u)", strerror(-rc), MP_REL_WINDOW_MAX);
	return rc;
}

static int dpdk_init(const struct mp_drv_params *p, struct mp_drv **out)
{
	struct dpdk_drv *d;
	struct mp_rel_params rp;
	uint16_t nq = (uint16_t)env_long("MP_DPDK_QUEUES", 1, 1, DPDK_MAX_QUEUES);
	uint16_t mtu = (uint16_t)env_long("MP_DPDK_MTU", DPDK_DEFAULT_MTU, 576, DPDK_MAX_MTU);
	uint16_t ring = (uint16_t)env_long("MP_DPDK_RING", DPDK_DEFAULT_RING, 64, 16384);
	unsigned mbufs = (unsigned)env_long("MP_DPDK_MBUFS", 2L * nq * ring * 2 + 2047, 1023,
					    1 << 24);
	int timeout = 10000, rc;

	if (!out)
		return -EINVAL;
	if (p && p->size >= offsetof(struct mp_drv_params, connect_timeout_ms) +
				    sizeof(p->connect_timeout_ms) && p->connect_timeout_ms > 0)
		timeout = p->connect_timeout_ms;
	d = calloc(1, sizeof(*d));
	if (!d)
		return -ENOMEM;
	d->base.ops = &mp_dpdk_driver_ops;
	d->rank = p && p->size >= offsetof(struct mp_drv_params, rank) + sizeof(p->rank) ? p->rank
											 : -1;
	pthread_mutex_init(&d->mr_lock, NULL);

	pthread_mutex_lock(&g.lock);
	if (g.live) {
		pthread_mutex_unlock(&g.lock);
		MP_WARN("dpdk: one dpdk context per process (EAL and the port are process-wide); "
			"finalize the other one first");
		rc = -EBUSY;
		goto fail;
	}
	rc = eal_up(mtu, mbufs);
	if (!rc && !g.port_ready)
		rc = port_setup(nq, mtu, mbufs, ring);
	else if (!rc && (g.nq != nq || g.mtu != mtu))
		MP_WARN("dpdk: the port keeps the %u queue pair(s) and MTU %u it was set up with",
			g.nq, g.mtu);
	if (!rc)
		rc = port_start((int)env_long("MP_DPDK_LINK_WAIT_MS", timeout, 0, 600000));
	if (!rc) {
		g.live = d;
		atomic_store(&g.bye_rx, 0);
		atomic_store(&g.bye_bad, 0);
		atomic_store(&g.peer_lost, 0);
		atomic_store(&g.peer_left, 0);
	}
	pthread_mutex_unlock(&g.lock);
	if (rc)
		goto fail;

	memcpy(d->self.mac, g.mac.addr_bytes, 6);
	d->self.port[0] = (uint8_t)(env_long("MP_DPDK_UDP_PORT", DPDK_DEFAULT_UDP_PORT, 1, 65535) >> 8);
	d->self.port[1] = (uint8_t)env_long("MP_DPDK_UDP_PORT", DPDK_DEFAULT_UDP_PORT, 1, 65535);
	{
		const char *ip = getenv("MP_DPDK_IP");
		unsigned b[4];
		int k = 0;

		if (ip && *ip) {
			if (sscanf(ip, "%3u.%3u.%3u.%3u%n", &b[0], &b[1], &b[2], &b[3], &k) == 4 &&
			    !ip[k] && b[0] < 256 && b[1] < 256 && b[2] < 256 && b[3] < 256) {
				for (int i = 0; i < 4; i++)
					d->self.ip[i] = (uint8_t)b[i];
				d->have_ip = true;
			} else {
				MP_WARN("dpdk: MP_DPDK_IP=%s is not an IPv4 address", ip);
			}
		}
	}
	d->zc = g.multiseg && env_long("MP_DPDK_ZC", 1, 0, 1);
	if (d->zc && g.memif_zc) {
		/*
		 * A zero-copy memif client hands the server offsets into its EAL
		 * memory, so an mbuf attached to application memory would name
		 * bytes the server cannot see: sends are copied into mbufs instead
		 * (the server copies them out, as it would with its own ring).
		 */
		MP_INFO("dpdk: memif zero-copy client: sends are copied into mbufs, not attached");
		d->zc = false;
	}
	d->udp_csum = env_long("MP_DPDK_UDP_CSUM", 0, 0, 1);
	d->spin_ns = (uint64_t)env_long("MP_DPDK_SPIN_US", DPDK_DEFAULT_SPIN_US, 0, 10000000) * 1000;
	d->loss = env_prob("MP_DPDK_INJECT_LOSS");
	d->dup = env_prob("MP_DPDK_INJECT_DUP");
	d->reorder = env_prob("MP_DPDK_INJECT_REORDER");
	if (d->loss > 0 || d->dup > 0 || d->reorder > 0)
		MP_INFO("dpdk: injecting faults into received frames: loss %g, duplication %g, "
			"reordering %g", d->loss, d->dup, d->reorder);

	memset(&rp, 0, sizeof(rp));
	rp.mss = (uint32_t)(g.mtu - MP_IP4_HDR_LEN - MP_UDP_HDR_LEN - MP_REL_DATA_HDR_LEN);
	rp.window = (uint32_t)env_long("MP_DPDK_WINDOW", 0, 0, MP_REL_WINDOW_MAX);
	/* 0 keeps rel's defaults; shared or oversubscribed cores want a longer floor. */
	rp.rto_min_ns = (uint64_t)env_long("MP_DPDK_RTO_MIN_US", 0, 0, 10000000) * 1000u;
	rp.rto_max_ns = (uint64_t)env_long("MP_DPDK_RTO_MAX_US", 0, 0, 60000000) * 1000u;
	rp.tx = tx_segment;
	rp.now_ns = rel_clock;
	/*
	 * Shards beyond a quarter of the LLC cannot stay in it beside the
	 * sender's buffer and the rings: write them past the caches
	 * (kernels/cpu/copy.c; doc/dpdk.md, "Large shards past the caches").
	 */
	rp.stream_min = (size_t)env_long("MP_DPDK_STREAM_MIN", (long)mp_k_stream_min(), 0, LONG_MAX);
	/* One lane per queue pair the port has (a reused port keeps its count). */
	d->nlanes = g.nq;
	for (uint16_t q = 0; q < d->nlanes; q++) {
		rc = lane_new(d, q, &rp,
			      (uint64_t)env_long("MP_DPDK_INJECT_SEED", 1, LONG_MIN, LONG_MAX));
		if (rc)
			goto fail;
	}
	if (d->nlanes > 1) {
		for (uint16_t q = 0; q < d->nlanes; q++) {
			struct dpdk_lane *l = d->lanes[q];
			char name[16];

			rc = -pthread_create(&l->thread, NULL, lane_main, l);
			if (rc) {
				MP_WARN("dpdk: cannot start the polling thread of queue %u: %s", q,
					strerror(-rc));
				goto fail;
			}
			l->thread_up = true;
			snprintf(name, sizeof(name), "mp-dpdk-q%u", q);
			pthread_setname_np(l->thread, name);
		}
		d->threaded = true;
		MP_INFO("dpdk: %u queue pairs, each polled by its own thread", d->nlanes);
	}
	*out = &d->base;
	return 0;
fail:
	dpdk_fini(&d->base);
	return rc;
}

static int dpdk_query(struct mp_drv *dd, struct mp_drv_caps *caps)
{
	struct dpdk_drv *d = (struct dpdk_drv *)dd;

	if (!d || !caps)
		return -EINVAL;
	caps->flags = MP_DRV_CAP_ORDERED | (d->zc ? MP_DRV_CAP_ZERO_COPY : 0);
#ifdef MP_HAVE_DPDK_GPUDEV
	int16_t gpu;

	/* With a gpudev device in EAL, reg_mr takes MP_MEM_CUDA memory. */
	if (mp_dpdk_gpu_pick(true, &gpu) == 0)
		caps->flags |= MP_DRV_CAP_DEVICE_MEM;
#endif
	caps->max_msg = DPDK_MAX_MSG;
	caps->default_streams = d->nlanes; /* a connection per lane and peer */
	return 0;
}

static int dpdk_addr_parse(struct mp_drv *d, const char *text, void *blob, size_t *len)
{
	(void)d;
	if (!blob || !len || *len < sizeof(struct mp_dpdk_addr))
		return -EINVAL;
	if (mp_dpdk_addr_parse(text, blob))
		return -EINVAL;
	*len = sizeof(struct mp_dpdk_addr);
	return 0;
}

static int dpdk_addr_format(struct mp_drv *d, const void *blob, size_t len, char *text,
			    size_t cap)
{
	(void)d;
	if (!blob || len != sizeof(struct mp_dpdk_addr))
		return -EINVAL;
	return mp_dpdk_addr_format(blob, text, cap);
}

/*
 * Bind forms: "MAC/IP:PORT" (the MAC must be the port's), "IP:PORT" (the
 * port's MAC), port 0 = MP_DPDK_UDP_PORT. The core's default "127.0.0.1:0"
 * (nothing configured) and 0.0.0.0 take the IP from MP_DPDK_IP.
 */
static int parse_bind(struct dpdk_drv *d, const char *bind)
{
	struct mp_dpdk_addr a;
	unsigned b[4], port;
	int k = 0;

	if (bind && mp_dpdk_addr_parse(bind, &a) == 0) {
		if (memcmp(a.mac, d->self.mac, 6)) {
			char want[MP_DPDK_ADDR_STRLEN];

			mp_dpdk_addr_format(&d->self, want, sizeof(want));
			MP_WARN("dpdk: cannot listen on %s: the port's MAC is %.17s", bind, want);
			return -EADDRNOTAVAIL;
		}
		d->self = a;
		d->have_ip = true;
		return 0;
	}
	if (bind && *bind) {
		if (sscanf(bind, "%3u.%3u.%3u.%3u:%u%n", &b[0], &b[1], &b[2], &b[3], &port, &k) != 5 ||
		    bind[k] || b[0] > 255 || b[1] > 255 || b[2] > 255 || b[3] > 255 || port > 65535)
			return -EINVAL;
		if (port) {
			d->self.port[0] = (uint8_t)(port >> 8);
			d->self.port[1] = (uint8_t)port;
		}
		if (b[0] != 127 && (b[0] | b[1] | b[2] | b[3])) {
			for (int i = 0; i < 4; i++)
				d->self.ip[i] = (uint8_t)b[i];
			d->have_ip = true;
		}
	}
	if (!d->have_ip) {
		MP_WARN("dpdk: no IPv4 address for this peer: listen on IP:PORT or MAC/IP:PORT "
			"(MP_LISTEN, the hostfile) or set MP_DPDK_IP");
		return -EADDRNOTAVAIL;
	}
	return 0;
}

static int dpdk_listen(struct mp_drv *dd, const char *bind, void *blob, size_t *len,
		       struct mp_drv_listener **out)
{
	struct dpdk_drv *d = (struct dpdk_drv *)dd;
	char text[MP_DPDK_ADDR_STRLEN];
	int rc;

	if (!d || !out)
		return -EINVAL;
	if (d->listening)
		return -EADDRINUSE; /* one UDP port, one listener */
	rc = parse_bind(d, bind);
	if (rc)
		return rc;
	/* A SYN creates its connection in the lane of the queue it came in on. */
	for (uint16_t i = 0; i < d->nlanes; i++) {
		rte_ticketlock_lock(&d->lanes[i]->lock);
		mp_rel_listen(d->lanes[i]->rel, DPDK_BACKLOG);
		rte_ticketlock_unlock(&d->lanes[i]->lock);
	}
	d->listening = true;
	d->listener.d = d;
	if (blob && len) {
		if (*len < sizeof(d->self))
			return -ENOSPC;
		memcpy(blob, &d->self, sizeof(d->self));
		*len = sizeof(d->self);
	}
	mp_dpdk_addr_format(&d->self, text, sizeof(text));
	MP_INFO("dpdk: listening on %s (port %u)", text, g.port);
	*out = (struct mp_drv_listener *)&d->listener;
	return 0;
}

static int dpdk_accept(struct mp_drv_listener *l, struct mp_drv_conn **out)
{
	struct dpdk_listener *dl = (struct dpdk_listener *)l;
	struct dpdk_drv *d;
	struct mp_rel_conn *c;

	if (!dl || !out)
		return -EINVAL;
	d = dl->d;
	/* The lanes in turn, starting after the one that gave the last connection. */
	for (uint16_t k = 0; k < d->nlanes; k++) {
		struct dpdk_lane *ln = d->lanes[(d->accept_next + k) % d->nlanes];
		int rc;

		rte_ticketlock_lock(&ln->lock);
		rc = mp_rel_accept(ln->rel, &c);
		rte_ticketlock_unlock(&ln->lock);
		if (!rc) {
			d->accept_next = (d->accept_next + k + 1) % d->nlanes;
			*out = (struct mp_drv_conn *)c;
			return 0;
		}
	}
	return -EAGAIN;
}

static void dpdk_close_listener(struct mp_drv_listener *l)
{
	struct dpdk_listener *dl = (struct dpdk_listener *)l;

	if (!dl || !dl->d->listening)
		return;
	for (uint16_t i = 0; i < dl->d->nlanes; i++) {
		rte_ticketlock_lock(&dl->d->lanes[i]->lock);
		mp_rel_listen(dl->d->lanes[i]->rel, 0);
		rte_ticketlock_unlock(&dl->d->lanes[i]->lock);
	}
	dl->d->listening = false;
}

/* The lane a connection or a request lives in. */
static struct dpdk_lane *conn_lane(struct mp_drv_conn *c)
{
	return mp_rel_user(mp_rel_conn_rel((struct mp_rel_conn *)c));
}

static int dpdk_connect(struct mp_drv *dd, const void *blob, size_t len, struct mp_drv_conn **out)
{
	struct dpdk_drv *d = (struct dpdk_drv *)dd;
	struct dpdk_lane *l;
	struct mp_rel_conn *c;
	int64_t route;
	int rc;

	if (!d || !out || !blob || len != sizeof(struct mp_dpdk_addr))
		return -EINVAL;
	if (!d->have_ip) {
		MP_WARN("dpdk: cannot dial without our own IPv4 address: set MP_DPDK_IP");
		return -EADDRNOTAVAIL;
	}
	/* Connections are spread over the lanes in turn, so several streams to
	 * one peer use several queues. */
	l = d->lanes[atomic_fetch_add(&d->next_lane, 1) % d->nlanes];
	rte_ticketlock_lock(&l->lock);
	route = route_get(l, blob);
	rc = route < 0 ? (int)route : mp_rel_connect(l->rel, (uint32_t)route, &c);
	rte_ticketlock_unlock(&l->lock);
	if (!rc)
		*out = (struct mp_drv_conn *)c;
	return rc;
}

static void dpdk_close(struct mp_drv_conn *c)
{
	struct dpdk_lane *l;

	if (!c)
		return;
	l = conn_lane(c);
	rte_ticketlock_lock(&l->lock);
	mp_rel_close((struct mp_rel_conn *)c);
	rte_ticketlock_unlock(&l->lock);
}

#ifdef MP_HAVE_DPDK_GPUDEV
/*
 * MP_MEM_CUDA memory through gpudev (gpu.c). Send pieces from it are
 * attached only where a NIC reads them by DMA (IOVA as VA: the mapping's
 * IOVA is the address) and the CPU does not read them (no software UDP
 * checksum); everything else the CPU does with it, copying sends for a
 * virtual device and every receive, goes through its CPU mapping.
 */
static int reg_device(struct dpdk_drv *d, void *buf, size_t len, struct mp_drv_mr **out)
{
	struct mp_drv_mr *m = calloc(1, sizeof(*m));
	struct rte_eth_dev_info info;
	struct rte_device *nic = NULL;
	int rc;

	if (!m)
		return -ENOMEM;
	if (g.pci && d->zc && !d->udp_csum && rte_eal_iova_mode() == RTE_IOVA_VA &&
	    rte_eth_dev_info_get(g.port, &info) == 0)
		nic = info.device;
	rc = mp_dpdk_gpu_reg(&m->gpu, buf, len, nic);
	if (rc) {
		free(m);
		return rc;
	}
	m->device = true;
	m->lo = (uintptr_t)buf;
	m->hi = (uintptr_t)buf + len;
	m->zc = nic != NULL;
	return mr_add(d, m, out);
}
#endif

static int dpdk_reg_mr(struct mp_drv *dd, void *buf, size_t len, enum mp_mem_kind kind,
		       struct mp_drv_mr **out)
{
	struct dpdk_drv *d = (struct dpdk_drv *)dd;
	struct mp_drv_mr *m;

	if (!d || !out || (!buf && len))
		return -EINVAL;
#ifdef MP_HAVE_DPDK_GPUDEV
	if (kind == MP_MEM_CUDA)
		return reg_device(d, buf, len, out);
#endif
	if (kind != MP_MEM_HOST)
		return -ENOTSUP; /* device memory: doc/dpdk.md, "GPU memory" */
	m = calloc(1, sizeof(*m));
	if (!m)
		return -ENOMEM;
	m->lo = (uintptr_t)buf;
	m->hi = (uintptr_t)buf + len;
	m->zc = d->zc && len > 0;
	if (m->zc && g.pci) {
		/*
		 * A NIC reads the memory by DMA: it must be known to EAL and mapped
		 * for the device. EAL takes whole pages; pages another registration
		 * holds already make this fail, and then the sends are copied.
		 */
		size_t pg = (size_t)sysconf(_SC_PAGESIZE);
		struct rte_eth_dev_info info;

		m->ext_lo = m->lo & ~(uintptr_t)(pg - 1);
		m->ext_len = ((m->hi + pg - 1) & ~(uintptr_t)(pg - 1)) - m->ext_lo;
		if (rte_extmem_register((void *)m->ext_lo, m->ext_len, NULL, 0, pg) == 0) {
			m->extmem = true;
			if (rte_eth_dev_info_get(g.port, &info) ||
			    rte_dev_dma_map(info.device, (void *)m->ext_lo, m->ext_lo, m->ext_len)) {
				MP_INFO("dpdk: DMA mapping of %zu bytes failed (%s); sends from it are "
					"copied", m->ext_len, rte_strerror(rte_errno));
				m->zc = false;
			}
		} else {
			MP_INFO("dpdk: registering %zu bytes with EAL failed (%s); sends from it are "
				"copied", m->ext_len, rte_strerror(rte_errno));
			m->zc = false;
		}
	}
	return mr_add(d, m, out);
}

static void dpdk_dereg_mr(struct mp_drv *dd, struct mp_drv_mr *mr)
{
	struct dpdk_drv *d = (struct dpdk_drv *)dd;

	if (!d || !mr)
		return;
	pthread_mutex_lock(&d->mr_lock);
	for (struct mp_drv_mr **pp = &d->mrs; *pp; pp = &(*pp)->next)
		if (*pp == mr) {
			*pp = mr->next;
			break;
		}
	atomic_fetch_add_explicit(&d->mr_gen, 1, memory_order_release);
	pthread_mutex_unlock(&d->mr_lock);
	mr_free(mr);
}

/*
 * Where the CPU reads or writes [p, p + len) of @mr: device memory through
 * its CPU mapping, except send pieces a NIC reads itself (reg_device); else
 * @p. Device memory is only ever reached through the registration the op
 * names.
 */
static void *cpu_addr(const struct mp_drv_mr *mr, const void *p, size_t len, bool send)
{
	uintptr_t a = (uintptr_t)p;

	if (mr && mr->device && !(send && mr->zc) && len && a >= mr->lo && a + len <= mr->hi)
		return mp_dpdk_gpu_cpu_addr(&mr->gpu, p);
	return (void *)(uintptr_t)p;
}

static int dpdk_isend(struct mp_drv_conn *c, const struct mp_iov *iov, int iovcnt,
		      struct mp_drv_mr *mr, struct mp_drv_req **out)
{
	struct mp_iov v[MP_DRV_IOV_MAX];
	struct dpdk_lane *l;
	struct mp_rel_req *r;
	int rc;

	/* tx_segment finds the registration of each piece it attaches itself. */
	if (!c || !out || !iov || iovcnt < 1 || iovcnt > MP_DRV_IOV_MAX)
		return -EINVAL;
	for (int i = 0; i < iovcnt; i++) {
		v[i].base = cpu_addr(mr, iov[i].base, iov[i].len, true);
		v[i].len = iov[i].len;
	}
	l = conn_lane(c);
	rte_ticketlock_lock(&l->lock);
	rc = mp_rel_send((struct mp_rel_conn *)c, v, iovcnt, &r);
	rte_ticketlock_unlock(&l->lock);
	if (!rc)
		*out = (struct mp_drv_req *)r;
	return rc;
}

static int dpdk_irecv(struct mp_drv_conn *c, void *buf, size_t cap, struct mp_drv_mr *mr,
		      struct mp_drv_req **out)
{
	struct dpdk_lane *l;
	struct mp_rel_req *r;
	int rc;

	if (!c || !out)
		return -EINVAL;
	/* rel copies received payload with the CPU: into device memory through its mapping. */
	buf = cpu_addr(mr, buf, cap, false);
	l = conn_lane(c);
	rte_ticketlock_lock(&l->lock);
	rc = mp_rel_recv((struct mp_rel_conn *)c, buf, cap, &r);
	rte_ticketlock_unlock(&l->lock);
	if (!rc)
		*out = (struct mp_drv_req *)r;
	return rc;
}

static int dpdk_test(struct mp_drv_req *r, int *done, size_t *nbytes)
{
	struct dpdk_lane *l;
	int rc;

	if (!r || !done)
		return -EINVAL;
	l = mp_rel_user(mp_rel_req_rel((struct mp_rel_req *)r));
	rte_ticketlock_lock(&l->lock);
	rc = mp_rel_test((struct mp_rel_req *)r, done, nbytes);
	rte_ticketlock_unlock(&l->lock);
	return rc;
}

/*
 * timeout_ms < 0 waits until something happens or wake(). With one lane the
 * calling thread polls it; with several, the lanes' threads do, and this
 * waits for one of them to have done something.
 */
static int dpdk_progress(struct mp_drv *dd, int timeout_ms)
{
	struct dpdk_drv *d = (struct dpdk_drv *)dd;
	struct dpdk_lane *l;
	uint64_t start, until, idle_since, seen;
	bool work;

	if (!d)
		return -EINVAL;
	l = d->lanes[0];
	seen = atomic_load(&d->events);
	if (!d->threaded) {
		/* Mempool caches are per lcore: the polling thread gets an lcore id once. */
		if (rte_lcore_id() == LCORE_ID_ANY && rte_thread_register())
			MP_TRACE("dpdk: rte_thread_register: %s (mempools without per-thread cache)",
				 rte_strerror(rte_errno));
		rte_ticketlock_lock(&l->lock);
		work = poll_once(l);
		rte_ticketlock_unlock(&l->lock);
		if (work)
			return 0;
	}
	if (timeout_ms == 0)
		return 0;
	start = idle_since = fast_ns();
	until = timeout_ms < 0 ? UINT64_MAX : start + (uint64_t)timeout_ms * 1000000u;
	for (;;) {
		uint64_t t, next;

		if (atomic_exchange(&d->woken, 0))
			return 0;
		if (d->threaded && atomic_load(&d->events) != seen)
			return 0;
		t = fast_ns();
		if (t >= until)
			return 0;
		if (t - idle_since >= d->spin_ns) {
			/* Idle: nap, but not past the timeout or rel's next timer. */
			uint64_t nap = DPDK_NAP_US * 1000u;

			next = d->threaded ? UINT64_MAX : mp_rel_next_deadline_ns(l->rel);
			if (next > t && next - t < nap)
				nap = next - t;
			if (until - t < nap)
				nap = until - t;
			if (next > t) {
				struct timespec ts = {.tv_sec = 0, .tv_nsec = (long)nap};

				nanosleep(&ts, NULL);
			}
		}
		if (d->threaded) {
			rte_pause();
			continue;
		}
		rte_ticketlock_lock(&l->lock);
		work = poll_once(l);
		rte_ticketlock_unlock(&l->lock);
		if (work)
			return 0;
	}
}

static void dpdk_wake(struct mp_drv *dd)
{
	struct dpdk_drv *d = (struct dpdk_drv *)dd;

	if (d)
		atomic_store(&d->woken, 1);
}

/* The port is configured once per process (port_setup) before any instance
 * is handed out, and never changes after. */
static int dpdk_describe(struct mp_drv *d, char *text, size_t cap)
{
	const struct dpdk_drv *dd = (const struct dpdk_drv *)(void *)d;
	int n = snprintf(text, cap, "port=%u driver=%s queues=%u mtu=%u lanes=%u", (unsigned)g.port,
			 g.driver, (unsigned)g.nq, (unsigned)g.mtu, (unsigned)dd->nlanes);

	if (n < 0 || (size_t)n >= cap) {
		text[0] = '\0';
		return -ENOSPC;
	}
	return n;
}

const struct mp_driver_ops mp_dpdk_driver_ops = {
	.size = sizeof(struct mp_driver_ops),
	.abi = MP_DRIVER_ABI,
	.name = "dpdk",
	.init = dpdk_init,
	.fini = dpdk_fini,
	.query = dpdk_query,
	.addr_parse = dpdk_addr_parse,
	.addr_format = dpdk_addr_format,
	.listen = dpdk_listen,
	.accept = dpdk_accept,
	.close_listener = dpdk_close_listener,
	.connect = dpdk_connect,
	.close = dpdk_close,
	.reg_mr = dpdk_reg_mr,
	.dereg_mr = dpdk_dereg_mr,
	.isend = dpdk_isend,
	.irecv = dpdk_irecv,
	.test = dpdk_test,
	.progress = dpdk_progress,
	.wake = dpdk_wake,
	/* No address of its own: the IP comes from MP_DPDK_IP (parse_bind). */
	.default_listen = "0.0.0.0:0",
	.describe = dpdk_describe,
};
