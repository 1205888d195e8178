/* SPDX-License-Identifier: BSD-3-Clause */
/* The virtual Ethernet segment of mpbench --transport=dpdk (dpdk_seg.h). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include "dpdk_seg.h"

#include <dirent.h>
#include <net/if.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define UDP_PORT 7000

enum { SEG_NONE, SEG_MEMIF, SEG_BRIDGE, SEG_USER };

static struct {
	int mode;
	int n;
	pid_t owner;        /* the process that built it (children never tear down) */
	char stats[64];     /* directory of counter files */
	const char *eal;    /* --dpdk-args */
	char desc[256];
} S;

/* Run a command; 0 when it exited 0. Only async-signal-safe calls. */
static int run(char *const argv[], int quiet)
{
	pid_t pid = fork();
	int st;

	if (pid < 0)
		return -1;
	if (pid == 0) {
		if (quiet) {
			int fd = open("/dev/null", O_WRONLY);

			if (fd >= 0) {
				dup2(fd, 1);
				dup2(fd, 2);
			}
		}
		execvp(argv[0], argv);
		_exit(127);
	}
	while (waitpid(pid, &st, 0) < 0)
		if (errno != EINTR)
			return -1;
	return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -1;
}

static void ns_name(char *buf, size_t cap, int i)
{
	snprintf(buf, cap, "mpb-%ld-%d", (long)S.owner, i);
}

/* Interface names stay within IFNAMSIZ (15): "mpb<pid>{h,n}<i>", "mpb<pid>br". */
static void if_name(char *buf, size_t cap, char side, int i)
{
	snprintf(buf, cap, "mpb%ld%c%d", (long)S.owner % 10000000, side, i);
}

static void mac_of(char *buf, size_t cap, int i)
{
	snprintf(buf, cap, "02:00:%02x:%02x:%02x:%02x", (unsigned)(S.owner >> 16) & 0xff,
		 (unsigned)(S.owner >> 8) & 0xff, (unsigned)S.owner & 0xff, (unsigned)(i + 1));
}

static void no_ipv6(const char *ifname)
{
	char path[128];
	int fd;

	/* Router solicitations and DAD would be the only other frames on the segment. */
	snprintf(path, sizeof(path), "/proc/sys/net/ipv6/conf/%s/disable_ipv6", ifname);
	fd = open(path, O_WRONLY);
	if (fd >= 0) {
		if (write(fd, "1", 1) != 1)
			(void)0; /* no IPv6 in this kernel: nothing to silence */
		close(fd);
	}
}

/* Set @ifname up (in this process's namespace). */
static int link_up(const char *ifname)
{
	struct ifreq r;
	int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0), rc = -1;

	if (fd < 0)
		return -1;
	memset(&r, 0, sizeof(r));
	if (strlen(ifname) >= sizeof(r.ifr_name)) {
		close(fd);
		errno = ENAMETOOLONG;
		return -1;
	}
	memcpy(r.ifr_name, ifname, strlen(ifname) + 1);
	if (ioctl(fd, SIOCGIFFLAGS, &r) == 0) {
		r.ifr_flags |= IFF_UP;
		rc = ioctl(fd, SIOCSIFFLAGS, &r);
	}
	close(fd);
	return rc;
}

void dseg_teardown(void)
{
	char ns[64], br[32], h[32];

	if (S.mode == SEG_NONE || getpid() != S.owner)
		return;
	if (S.mode == SEG_BRIDGE) {
		for (int i = 0; i < S.n; i++) {
			ns_name(ns, sizeof(ns), i);
			if_name(h, sizeof(h), 'h', i);
			/* The namespace takes its veth end, and the pair, with it. */
			run((char *[]){"ip", "netns", "del", ns, NULL}, 1);
			run((char *[]){"ip", "link", "del", h, NULL}, 1);
		}
		if_name(br, sizeof(br), 'b', 0);
		run((char *[]){"ip", "link", "del", br, NULL}, 1);
	}
	if (S.stats[0]) {
		DIR *d = opendir(S.stats);
		struct dirent *e;

		while (d && (e = readdir(d))) {
			char p[sizeof(S.stats) + 300];

			if (e->d_name[0] == '.')
				continue;
			snprintf(p, sizeof(p), "%s/%s", S.stats, e->d_name);
			unlink(p);
		}
		if (d)
			closedir(d);
		rmdir(S.stats);
		S.stats[0] = '\0';
	}
	S.mode = SEG_NONE;
}

static void on_signal(int sig)
{
	dseg_teardown();
	signal(sig, SIG_DFL);
	raise(sig);
}

static int build_bridge(void)
{
	char br[32], h[32], n[32], ns[64];

	if_name(br, sizeof(br), 'b', 0);
	if (run((char *[]){"ip", "link", "add", br, "type", "bridge", NULL}, 0))
		return -1;
	no_ipv6(br);
	if (run((char *[]){"ip", "link", "set", br, "up", NULL}, 0))
		return -1;
	for (int i = 0; i < S.n; i++) {
		char mac[32];

		ns_name(ns, sizeof(ns), i);
		if_name(h, sizeof(h), 'h', i);
		if_name(n, sizeof(n), 'n', i);
		mac_of(mac, sizeof(mac), i);
		/* The peer's end stays down until the peer turned IPv6 off on it. */
		if (run((char *[]){"ip", "netns", "add", ns, NULL}, 0) ||
		    run((char *[]){"ip", "link", "add", h, "type", "veth", "peer", "name", n, NULL}, 0))
			return -1;
		no_ipv6(h);
		if (run((char *[]){"ip", "link", "set", n, "address", mac, "netns", ns, NULL}, 0) ||
		    run((char *[]){"ip", "link", "set", h, "master", br, "up", NULL}, 0))
			return -1;
	}
	return 0;
}

/*
 * The PMD on the veths of a bridge segment: MP_DPDK_BRIDGE_PMD, af_packet (a
 * PACKET_MMAP socket, the default) or af_xdp (an AF_XDP socket and the XDP
 * program the PMD loads); NULL for anything else.
 */
static const char *bridge_pmd(void)
{
	const char *e = getenv("MP_DPDK_BRIDGE_PMD");

	if (!e || !*e || !strcmp(e, "af_packet"))
		return "af_packet";
	return strcmp(e, "af_xdp") ? NULL : "af_xdp";
}

int dseg_setup(int npeers, const char *eal_args, int verbose)
{
	char tmpl[] = "/tmp/mpb-dpdk-XXXXXX";

	S.owner = getpid();
	S.n = npeers;
	S.eal = eal_args;
	if (!mkdtemp(tmpl)) {
		fprintf(stderr, "mpbench: dpdk: cannot make a counters directory: %s\n",
			strerror(errno));
		return -1;
	}
	snprintf(S.stats, sizeof(S.stats), "%s", tmpl);
	setenv("MP_DPDK_STATS", S.stats, 1);
	atexit(dseg_teardown);
	signal(SIGINT, on_signal);
	signal(SIGTERM, on_signal);
	signal(SIGHUP, on_signal);
	if (eal_args) {
		S.mode = SEG_USER;
		snprintf(S.desc, sizeof(S.desc), "EAL arguments from --dpdk-args");
		return 0;
	}
	if (npeers == 2) {
		S.mode = SEG_MEMIF;
		/*
		 * memif carries frames of any size (one ring buffer each, see
		 * memif_bsize): jumbo frames cut the per-frame costs six-fold.
		 */
		setenv("MP_DPDK_MTU", "9000", 0);
		snprintf(S.desc, sizeof(S.desc), "net_memif pair on abstract socket mpb-%ld.sock",
			 (long)S.owner);
		return 0;
	}
	if (npeers > DSEG_MAX_PEERS) {
		fprintf(stderr, "mpbench: dpdk: a local segment takes at most %d peers\n",
			DSEG_MAX_PEERS);
		return -1;
	}
	if (geteuid() != 0) {
		fprintf(stderr, "mpbench: dpdk: %d local peers need a bridge and network namespaces: "
			"run as root (2 peers use memif and need nothing)\n", npeers);
		return -1;
	}
	if (!bridge_pmd()) {
		fprintf(stderr, "mpbench: dpdk: MP_DPDK_BRIDGE_PMD=%s: give af_packet or af_xdp\n",
			getenv("MP_DPDK_BRIDGE_PMD"));
		return -1;
	}
	S.mode = SEG_BRIDGE;
	if (build_bridge()) {
		fprintf(stderr, "mpbench: dpdk: could not build the bridge and veth pairs (ip "
			"failed, see above); removing what was made\n");
		dseg_teardown();
		return -1;
	}
	snprintf(S.desc, sizeof(S.desc), "bridge mpb%ldb0, %d veth pairs in namespaces mpb-%ld-*, "
		 "net_%s", (long)S.owner % 10000000, npeers, (long)S.owner, bridge_pmd());
	if (verbose)
		fprintf(stderr, "mpbench: dpdk: %s\n", S.desc);
	return 0;
}

/*
 * Both memif peers busy-poll: left to the scheduler they sometimes share one
 * CPU and take turns by time slice. Peer r gets the r-th CPU this process
 * may use (as dpdk-testpmd pins its forwarding lcores), when there are two;
 * MP_DPDK_PIN=0 leaves them unpinned.
 */
static void pin_peer(int rank)
{
	const char *e = getenv("MP_DPDK_PIN");
	cpu_set_t set, one;
	int k = 0;

	if ((e && !strcmp(e, "0")) || sched_getaffinity(0, sizeof(set), &set) ||
	    CPU_COUNT(&set) < 2)
		return;
	for (int c = 0; c < CPU_SETSIZE; c++)
		if (CPU_ISSET(c, &set) && k++ == rank) {
			CPU_ZERO(&one);
			CPU_SET(c, &one);
			if (sched_setaffinity(0, sizeof(one), &one))
				fprintf(stderr, "mpbench: dpdk: peer %d not pinned to CPU %d: %s\n",
					rank, c, strerror(errno));
			return;
		}
}

/*
 * memif's packet buffer size: the largest frame of MP_DPDK_MTU, rounded up
 * to 128. An MTU the driver refuses (above 65000) falls back to 1500 there.
 */
static long memif_bsize(void)
{
	const char *m = getenv("MP_DPDK_MTU");
	long mtu = m && *m ? strtol(m, NULL, 10) : 0;

	if (mtu < 1500 || mtu > 65000)
		mtu = 1500;
	return (mtu + 14 + 127) / 128 * 128;
}

int dseg_enter(int rank, char *listen, size_t cap)
{
	char ip[32], vdev[256], mac[32], n[32], ns[64], path[96];

	listen[0] = '\0';
	snprintf(ip, sizeof(ip), "10.77.%d.%d", (rank + 1) / 256, (rank + 1) % 256);
	setenv("MP_DPDK_IP", ip, 1);
	snprintf(listen, cap, "%s:%d", ip, UDP_PORT);
	mac_of(mac, sizeof(mac), rank);
	switch (S.mode) {
	case SEG_USER: {
		/* "{rank}" in the user's arguments becomes this peer's rank. */
		char eal[2048];
		const char *s = S.eal, *k;
		size_t o = 0;

		while ((k = strstr(s, "{rank}")) && o < sizeof(eal)) {
			o += (size_t)snprintf(eal + o, sizeof(eal) - o, "%.*s%d", (int)(k - s), s, rank);
			s = k + 6;
		}
		if (o < sizeof(eal))
			snprintf(eal + o, sizeof(eal) - o, "%s", s);
		setenv("MP_DPDK_EAL", eal, 1);
		return 0;
	}
	case SEG_MEMIF: {
		/*
		 * One ring buffer per frame (bsize): the PMD then fills one mbuf
		 * per frame. The client is zero-copy unless MP_DPDK_MEMIF_ARGS
		 * gives its own devargs (empty: plain memif): the server's copy
		 * then lands straight in the client's mbufs, one copy less toward
		 * it, and a 1 MiB average ran 4.2 -> 6.8 GB/s (medians of six
		 * alternated runs; performance.md). Its rings hold about 2 MiB
		 * (256 slots up to jumbo frames, 64 at MTU 32000): the client
		 * keeps a whole ring of mbufs posted, and the sender's copy
		 * writes all over them (1024 slots of 9 KiB swung 6-30 GB/s).
		 */
		char zc[48];
		long bs = memif_bsize();
		int rsize = 8;

		while (rsize > 5 && (1L << rsize) * bs > 3L << 20)
			rsize--;
		snprintf(zc, sizeof(zc), ",zero-copy=yes,rsize=%d", rsize);
		snprintf(vdev, sizeof(vdev),
			 "net_memif0,role=%s,id=0,socket=/mpb-%ld.sock,mac=%s,bsize=%ld%s",
			 rank ? "client" : "server", (long)S.owner, mac, bs,
			 !rank ? ""
			 : getenv("MP_DPDK_MEMIF_ARGS") ? getenv("MP_DPDK_MEMIF_ARGS")
							: zc);
		pin_peer(rank);
		/* The client dials once the server's port runs (MP_DPDK_READY_FILE). */
		snprintf(path, sizeof(path), "%s/memif-ready", S.stats);
		if (!rank) {
			setenv("MP_DPDK_READY_FILE", path, 1);
		} else {
			for (int i = 0; i < 2000 && access(path, F_OK); i++)
				usleep(10000);
			if (access(path, F_OK))
				fprintf(stderr, "mpbench: dpdk: the memif server did not start within "
					"20 s; dialling anyway\n");
		}
		break;
	}
	case SEG_BRIDGE: {
		const char *q;
		int fd;

		ns_name(ns, sizeof(ns), rank);
		if_name(n, sizeof(n), 'n', rank);
		snprintf(path, sizeof(path), "/run/netns/%s", ns);
		fd = open(path, O_RDONLY | O_CLOEXEC);
		if (fd < 0 || setns(fd, CLONE_NEWNET)) {
			fprintf(stderr, "mpbench: dpdk: peer %d cannot enter namespace %s: %s\n", rank,
				ns, strerror(errno));
			if (fd >= 0)
				close(fd);
			return -1;
		}
		close(fd);
		no_ipv6(n);
		if (link_up(n)) {
			fprintf(stderr, "mpbench: dpdk: peer %d cannot bring %s up: %s\n", rank, n,
				strerror(errno));
			return -1;
		}
		/* A veth has one queue: af_xdp takes it; af_packet opens qpairs sockets on it. */
		q = getenv("MP_DPDK_QUEUES") ? getenv("MP_DPDK_QUEUES") : "1";
		if (!strcmp(bridge_pmd(), "af_xdp"))
			snprintf(vdev, sizeof(vdev), "net_af_xdp0,iface=%s,start_queue=0,queue_count=%s",
				 n, q);
		else
			snprintf(vdev, sizeof(vdev), "net_af_packet0,iface=%s,qpairs=%s,framecnt=4096",
				 n, q);
		break;
	}
	default:
		return -1;
	}
	setenv("MP_DPDK_VDEV", vdev, 1);
	return 0;
}

const char *dseg_describe(void)
{
	return S.desc;
}

void dseg_report(void)
{
	/* Key order of the first file; numeric values summed over all peers and lines. */
	char keys[64][48];
	unsigned long long sum[64] = {0};
	int nk = 0, files = 0;
	DIR *d = S.stats[0] ? opendir(S.stats) : NULL;
	struct dirent *e;

	while (d && (e = readdir(d))) {
		char p[sizeof(S.stats) + 300], line[4096], *save = NULL;
		FILE *f;

		if (e->d_name[0] == '.')
			continue;
		snprintf(p, sizeof(p), "%s/%s", S.stats, e->d_name);
		f = fopen(p, "r");
		if (!f)
			continue;
		/* A peer's counter file; its other files (memif-ready) are empty. */
		for (bool first = true; fgets(line, sizeof(line), f); first = false) {
			files += first;
			for (char *t = strtok_r(line, " \n", &save); t; t = strtok_r(NULL, " \n", &save)) {
				char *eq = strchr(t, '=');
				int k;

				/* Words ("bye=answered", the leaving's line) are not summed. */
				if (!eq || eq[1] < '0' || eq[1] > '9')
					continue;
				*eq = '\0';
				for (k = 0; k < nk && strcmp(keys[k], t); k++)
					;
				if (k == nk) {
					if (nk == 64)
						continue;
					snprintf(keys[nk++], sizeof(keys[0]), "%s", t);
				}
				sum[k] += strtoull(eq + 1, NULL, 10);
			}
		}
		fclose(f);
	}
	if (d)
		closedir(d);
	if (!files)
		return;
	printf("# dpdk counters (%d peers):", files);
	for (int k = 0; k < nk; k++)
		printf(" %s=%llu", keys[k], sum[k]);
	printf("\n");
	fflush(stdout);
}
