/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The dpdk driver on a real (virtual) segment, with foreign frames thrown at
 * it: two peer processes, each in its own network namespace on a veth pair
 * joined by a bridge, run the driver's ops table over net_af_packet. Peer 1
 * sends messages of many sizes to peer 0, which checks every byte. Meanwhile
 * this process sends, from a raw socket on peer 0's veth, K frames of each kind
 * that is not ours (another UDP port, bad IPv4 checksum, TCP, a bad UDP
 * length, our port with a payload that is not a segment, a memif BYE, which
 * only a memif peer may send, and a malformed one) and an ARP request
 * for peer 0's address (sent again every 500 ms until answered, 5 s at most). (Fragments are left to test_dpdk_frame: the kernel
 * here did not pass raw IPv4 fragments through a veth to the packet socket.)
 *
 * Asserted: every message arrives intact; peer 0's counters show exactly K
 * frames for each of those verdicts (and rel's own drop for the non-segment
 * payloads, bye_bad for the BYEs); the ARP request gets a correct reply,
 * and peer 0 counts one reply per request at most.
 *
 * Skips (77) without root, network namespaces or an EAL that starts.
 *
 * `test_dpdk_frames --stream [SIZE_KiB [COUNT]]` is a benchmark instead: the
 * driver's one-way throughput between two processes on a memif pair
 * (tools/bench_dpdk.sh puts it beside dpdk-testpmd's raw rate);
 * `--pingpong [SIZE_KiB [COUNT]]` the time of a message and its answer;
 * `--copy [SIZE_KiB [COUNT]]` the stream's memcpy baseline (copy_main).
 * `--leave` and `--kill [RUNS]` are tests of a memif pair's end: peers that
 * leave (leave_main) and a peer SIGKILLed under its partner (kill_main).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <arpa/inet.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <errno.h>
#include <execinfo.h>
#include <fcntl.h>
#include <linux/if_ether.h>
#include <linux/if_packet.h>
#include <net/if.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <moshpit/driver.h>

#include "drivers/dpdk/frame.h"
#include "drivers/dpdk/rel.h"
#include "mp_kernels.h"

#define SKIP 77
#define K 5          /* frames of each foreign kind */
#define NMSG 60      /* messages from peer 1 to peer 0 */
#define MSG_MAX (200 * 1024)

extern const struct mp_driver_ops mp_dpdk_driver_ops;

static pid_t owner;
static char br[16], stats[64];

static int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int sh(const char *fmt, ...)
{
	char cmd[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(cmd, sizeof(cmd), fmt, ap);
	va_end(ap);
	return system(cmd) == 0 ? 0 : -1;
}

static void cleanup(void)
{
	if (getpid() != owner)
		return;
	for (int i = 0; i < 2; i++)
		sh("ip netns del mpt-%ld-%d 2>/dev/null", (long)owner, i);
	sh("ip link del %s 2>/dev/null", br);
	if (stats[0])
		sh("rm -rf %s", stats);
}

static void on_signal(int sig)
{
	cleanup();
	signal(sig, SIG_DFL);
	raise(sig);
}

static uint8_t pattern(int msg, size_t i)
{
	return (uint8_t)(msg * 31 + i * 7 + (i >> 9));
}

static size_t msg_len(int m)
{
	static const size_t sizes[] = {0, 1, 1399, 1400, 1401, 4096, 65536, 199999};

	return sizes[m % 8] + (size_t)(m / 8) * 13 % 1000;
}

static int enter_ns(int i)
{
	char path[96];
	int fd;

	snprintf(path, sizeof(path), "/run/netns/mpt-%ld-%d", (long)owner, i);
	fd = open(path, O_RDONLY);
	if (fd < 0 || setns(fd, CLONE_NEWNET)) {
		perror("setns");
		return -1;
	}
	close(fd);
	return 0;
}

static void pump(const struct mp_driver_ops *o, struct mp_drv *d, int ms)
{
	struct timespec t0, t;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	do {
		o->progress(d, 1);
		clock_gettime(CLOCK_MONOTONIC, &t);
	} while ((t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000 < ms);
}

/* One peer. Writes 'R' on @up once listening, reads 'G' from @down when the
 * foreign frames are out (peer 0). Exit 0 = all good, 77 = EAL would not start. */
static int peer(int rank, int up, int down)
{
	const struct mp_driver_ops *o = &mp_dpdk_driver_ops;
	struct mp_drv_params p = {.size = sizeof(p), .run_name = "t", .rank = rank,
				  .connect_timeout_ms = 10000};
	struct mp_drv *d;
	struct mp_drv_listener *l;
	struct mp_drv_conn *c = NULL;
	uint8_t blob[MP_DRV_ADDR_MAX];
	size_t blen = sizeof(blob);
	char vdev[128], ip[32], peer_addr[64], bind[64];
	uint8_t *buf = malloc(MSG_MAX);
	int rc, bad = 0;
	time_t deadline = time(NULL) + 20;

	if (!buf || enter_ns(rank))
		return 1;
	snprintf(vdev, sizeof(vdev), "net_af_packet0,iface=mptn%d", rank);
	snprintf(ip, sizeof(ip), "10.78.0.%d", rank + 1);
	setenv("MP_DPDK_VDEV", vdev, 1);
	setenv("MP_DPDK_IP", ip, 1);
	setenv("MP_DPDK_MEM_MB", "128", 1);
	snprintf(bind, sizeof(bind), "%s:7000", ip);
	if (sh("ip link set mptn%d up", rank))
		return 1;
	rc = o->init(&p, &d);
	if (rc) {
		fprintf(stderr, "peer %d: dpdk init: %s\n", rank, strerror(-rc));
		return SKIP;
	}
	rc = o->listen(d, bind, blob, &blen, &l);
	if (rc || write(up, "R", 1) != 1)
		return 1;
	if (rank == 1) {
		struct mp_drv_req *r[NMSG];
		int done = 0;

		snprintf(peer_addr, sizeof(peer_addr), "02:00:00:00:78:01/10.78.0.1:7000");
		blen = sizeof(blob);
		if (o->addr_parse(d, peer_addr, blob, &blen) || o->connect(d, blob, blen, &c))
			return 1;
		for (size_t i = 0; i < MSG_MAX; i++)
			buf[i] = 0;
		/* Every message reads from its own slice pattern: build them once. */
		uint8_t **m = calloc(NMSG, sizeof(*m));

		for (int k = 0; k < NMSG; k++) {
			size_t n = msg_len(k);
			struct mp_iov v[2];

			m[k] = malloc(n + 1);
			for (size_t i = 0; i < n; i++)
				m[k][i] = pattern(k, i);
			v[0].base = m[k];
			v[0].len = n / 3;
			v[1].base = m[k] + n / 3;
			v[1].len = n - n / 3;
			while ((rc = o->isend(c, v, 2, NULL, &r[k])) == -EAGAIN)
				o->progress(d, 1);
			if (rc)
				return 1;
		}
		while (done < NMSG && time(NULL) < deadline) {
			o->progress(d, 1);
			for (int k = 0; k < NMSG; k++) {
				int fin = 0;

				if (!r[k])
					continue;
				rc = o->test(r[k], &fin, NULL);
				if (fin) {
					r[k] = NULL;
					done++;
					if (rc) {
						fprintf(stderr, "peer 1: send %d: %s\n", k, strerror(-rc));
						bad++;
					}
				}
			}
		}
		/* Peer 0 closes first; give its last acknowledgements time to arrive. */
		pump(o, d, 300);
		if (done < NMSG)
			bad++;
	} else {
		char go;

		while (o->accept(l, &c) == -EAGAIN && time(NULL) < deadline)
			o->progress(d, 1);
		for (int k = 0; c && k < NMSG && !bad; k++) {
			struct mp_drv_req *r;
			size_t n = 0;
			int fin = 0;

			if (o->irecv(c, buf, MSG_MAX, NULL, &r))
				return 1;
			while (!fin && time(NULL) < deadline) {
				o->progress(d, 1);
				rc = o->test(r, &fin, &n);
			}
			if (!fin || rc || n != msg_len(k)) {
				fprintf(stderr, "peer 0: message %d: %s, %zu bytes, want %zu\n", k,
					fin ? strerror(-rc) : "timed out", n, msg_len(k));
				bad++;
				break;
			}
			for (size_t i = 0; i < n; i++)
				if (buf[i] != pattern(k, i)) {
					fprintf(stderr, "peer 0: message %d byte %zu differs\n", k, i);
					bad++;
					break;
				}
		}
		/* Keep polling until the foreign frames are out, then drain them. */
		for (;;) {
			struct pollfd pf = {.fd = down, .events = POLLIN};

			o->progress(d, 1);
			if (poll(&pf, 1, 0) == 1 || time(NULL) >= deadline)
				break;
		}
		if (read(down, &go, 1) != 1)
			bad++;
		pump(o, d, 300);
	}
	if (!c)
		bad++;
	o->close(c);
	o->close_listener(l);
	o->fini(d);
	return bad ? 1 : 0;
}

/* Send @len bytes as one frame on @ifindex. */
static void put(int s, int ifindex, const uint8_t *f, size_t len)
{
	struct sockaddr_ll a = {.sll_family = AF_PACKET, .sll_ifindex = ifindex, .sll_halen = 6};

	memcpy(a.sll_addr, f, 6);
	if (sendto(s, f, len, 0, (struct sockaddr *)&a, sizeof(a)) != (ssize_t)len)
		perror("sendto");
}

static void fix_ip(uint8_t *f)
{
	uint8_t *ip = f + MP_ETH_HDR_LEN;
	uint16_t c;

	ip[10] = ip[11] = 0;
	c = (uint16_t)~mp_csum_fold(mp_csum_add(0, ip, MP_IP4_HDR_LEN, 0));
	ip[10] = (uint8_t)(c >> 8);
	ip[11] = (uint8_t)c;
}

/* ARP requests sent to peer 0 (foreign_frames): each may be answered. */
static int arp_sent;

/* K frames of each foreign kind to peer 0, then an ARP request; 0 if the reply came. */
static int inject(void)
{
	struct mp_dpdk_addr me = {{0x02, 0, 0, 0, 0x78, 0x09}, {10, 78, 0, 9}, {0x1b, 0x58}};
	struct mp_dpdk_addr p0 = {{0x02, 0, 0, 0, 0x78, 0x01}, {10, 78, 0, 1}, {0x1b, 0x58}};
	uint8_t f[256], pl[64];
	char dev[IF_NAMESIZE];
	int s = socket(AF_PACKET, SOCK_RAW, htons(ETH_P_ALL)), ifx;

	/*
	 * Straight into peer 0's veth, not through the bridge: a bridge may hand
	 * IPv4 to the host's netfilter, whose defragmentation keeps fragments.
	 */
	snprintf(dev, sizeof(dev), "mpth%ld0", (long)owner % 100000);
	ifx = (int)if_nametoindex(dev);
	size_t len;

	if (s < 0 || !ifx)
		return -1;
	memset(pl, 0xa5, sizeof(pl));
	for (int k = 0; k < K; k++) {
		len = MP_FRAME_HDR_LEN + sizeof(pl);
		mp_frame_build(f, &me, &p0, (uint16_t)k, sizeof(pl));
		memcpy(f + MP_FRAME_HDR_LEN, pl, sizeof(pl));
		f[MP_ETH_HDR_LEN + MP_IP4_HDR_LEN + 3] ^= 1; /* another UDP port */
		put(s, ifx, f, len);
		f[MP_ETH_HDR_LEN + MP_IP4_HDR_LEN + 3] ^= 1;
		f[MP_ETH_HDR_LEN + 10] ^= 0x10; /* IPv4 header checksum */
		put(s, ifx, f, len);
		f[MP_ETH_HDR_LEN + 9] = 6; /* TCP */
		fix_ip(f);
		put(s, ifx, f, len);
		f[MP_ETH_HDR_LEN + 9] = 17;
		fix_ip(f);
		f[MP_ETH_HDR_LEN + MP_IP4_HDR_LEN + 5] += 2; /* UDP length */
		put(s, ifx, f, len);
		f[MP_ETH_HDR_LEN + MP_IP4_HDR_LEN + 5] -= 2;
		put(s, ifx, f, len); /* our port, but not a segment */
		/* A BYE, well formed but not on memif (anyone could send it here),
		 * and one of another version: both dropped, neither answered. */
		mp_frame_build(f, &me, &p0, (uint16_t)k, MP_BYE_LEN);
		mp_bye_build(f + MP_FRAME_HDR_LEN, MP_BYE, 1u + (uint32_t)k);
		put(s, ifx, f, 60);
		f[MP_FRAME_HDR_LEN + 2] = 2;
		put(s, ifx, f, 60);
	}
	/* ARP who-has 10.78.0.1 tell 10.78.0.9 */
	static const uint8_t arp[] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 2, 0, 0, 0, 0x78, 9,
				      8, 6, 0, 1, 8, 0, 6, 4, 0, 1, 2, 0, 0, 0, 0x78, 9,
				      10, 78, 0, 9, 0, 0, 0, 0, 0, 0, 10, 78, 0, 1};
	memset(f, 0, 60);
	memcpy(f, arp, sizeof(arp));
	put(s, ifx, f, 60);
	arp_sent = 1;
	/* The socket sees every frame on the bridge, our own included, so the
	 * wait is bounded by time (5 s), not by frames read. The request goes
	 * again every 500 ms, as an ARP client's does: the burst above can
	 * fill peer 0's receive ring on a loaded machine, and one request
	 * dropped there once failed this test. */
	struct timespec t0, t;
	long last = 0;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (;;) {
		struct pollfd pf = {.fd = s, .events = POLLIN};
		uint8_t r[128];
		ssize_t n;

		clock_gettime(CLOCK_MONOTONIC, &t);
		long ms = (t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000;
		if (ms > 5000)
			break;
		if (ms - last >= 500) {
			last = ms;
			put(s, ifx, f, 60);
			arp_sent++;
		}
		if (poll(&pf, 1, 20) != 1)
			continue;
		n = recv(s, r, sizeof(r), 0);
		if (n >= MP_ARP_FRAME_LEN && r[21] == 2 && !memcmp(r, me.mac, 6) &&
		    !memcmp(r + 22, p0.mac, 6) && !memcmp(r + 28, p0.ip, 4)) {
			close(s);
			return 0;
		}
	}
	close(s);
	fprintf(stderr, "no ARP reply from peer 0\n");
	return -1;
}

/* The value of @key in peer @rank's counter file (any line) as a word in @out; 0 if found. */
static int counter_word(int rank, const char *key, char *out, size_t cap)
{
	char cmd[256], line[4096];
	int rc = -1;
	FILE *f;

	snprintf(cmd, sizeof(cmd), "cat %s/dpdk.%d.*.stats 2>/dev/null", stats, rank);
	f = popen(cmd, "r");
	while (f && rc && fgets(line, sizeof(line), f)) {
		char want[64], *p;

		snprintf(want, sizeof(want), " %s=", key);
		p = strstr(line, want);
		if (!p && !strncmp(line, want + 1, strlen(want + 1)))
			p = line - 1;
		if (p) {
			p += strlen(want);
			snprintf(out, cap, "%.*s", (int)strcspn(p, " \n"), p);
			rc = 0;
		}
	}
	if (f)
		pclose(f);
	return rc;
}

/* The value of @key in peer @rank's counter file, or -1. */
static long long counter(int rank, const char *key)
{
	char w[64];

	return counter_word(rank, key, w, sizeof(w)) ? -1 : strtoll(w, NULL, 10);
}

/* ---- --stream: the driver's own one-way throughput on a memif pair ---- */

#define STREAM_WIN_MAX 32 /* most receives posted at once (env_win) */

static double mono_s(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int pingpong; /* --pingpong: message and answer, one at a time */

/*
 * --kill: both peers stream until the parent has SIGKILLed one of them
 * (file "killed" in the stats directory); the partner polls on for
 * KILL_POLL_S after that, then finalises. Each peer creates "flow.RANK" once
 * messages move, so that the kill lands while both are busy in their bursts.
 */
static int kill_mode;
#define KILL_POLL_S 0.15

/* --kill: a partner's fault, with its address and stack, before it dies of it. */
static void kill_fault(int sig, siginfo_t *si, void *ctx)
{
	char line[96];
	void *bt[32];
	int n = snprintf(line, sizeof(line), "kill: pid %ld: signal %d at address %p; stack:\n",
			 (long)getpid(), sig, si->si_addr);

	(void)ctx;
	if (write(2, line, (size_t)n) < 0)
		_exit(1);
	backtrace_symbols_fd(bt, backtrace(bt, 32), 2);
	/* SA_RESETHAND: returning faults again, and the default action kills. */
}

/* --leave: which side of the memif pair leaves while the other polls */
enum { LEAVE_SERVER_FIRST = 1, LEAVE_CLIENT_FIRST, LEAVE_BOTH };
static int leave_mode;

/* Wait (at most 20 s) for request @r; 0 if it completed with @size bytes. */
static int pp_wait(const struct mp_driver_ops *o, struct mp_drv *d, struct mp_drv_req *r,
		   size_t size)
{
	double deadline = mono_s() + 20;
	size_t n = 0;
	int fin = 0, rc = 0;

	for (unsigned spin = 0; !fin && (++spin % 4096 || mono_s() < deadline);) {
		o->progress(d, 0);
		rc = o->test(r, &fin, &n);
	}
	return fin && !rc && n == size ? 0 : 1;
}

/*
 * The end of a stream or ping-pong peer: each side finalises as soon as its
 * own requests are done. The driver's BYE keeps the other side, which may
 * still be polling, clear of DPDK's memif unmapping their shared rings
 * (doc/dpdk.md, "Leaving a memif pair"; --leave tests it).
 */
static int peer_end(const struct mp_driver_ops *o, struct mp_drv *d, struct mp_drv_conn *c,
		    struct mp_drv_listener *l, struct mp_drv_mr *mr, uint8_t *buf)
{
	o->close(c);
	o->close_listener(l);
	o->dereg_mr(d, mr);
	o->fini(d);
	free(buf);
	return 0;
}

/*
 * The end of a --leave peer (rank 1 is the memif server, rank 0 the client).
 * The side that stays polls until the leaver has finalised (its file
 * "gone.RANK") and 100 ms more: it is in its poll loop when the leaver's port
 * stops, the moment DPDK's memif would crash it without the driver's BYE.
 * With LEAVE_BOTH neither waits.
 */
static int leave_end(const struct mp_driver_ops *o, struct mp_drv *d, struct mp_drv_conn *c,
		     struct mp_drv_listener *l, struct mp_drv_mr *mr, uint8_t *buf, int rank)
{
	bool server = rank == 1;
	bool first = leave_mode == LEAVE_BOTH || (leave_mode == LEAVE_SERVER_FIRST) == server;
	char gone[128];

	if (!first) {
		double until = mono_s() + 10, after = 0;

		snprintf(gone, sizeof(gone), "%s/gone.%d", stats, !rank);
		while (mono_s() < until && (!after || mono_s() < after)) {
			o->progress(d, 0);
			if (!after && !access(gone, F_OK))
				after = mono_s() + 0.1;
		}
		if (!after) {
			fprintf(stderr, "leave: peer %d: peer %d never left\n", rank, !rank);
			return 1;
		}
	}
	peer_end(o, d, c, l, mr, buf);
	snprintf(gone, sizeof(gone), "%s/gone.%d", stats, rank);
	close(open(gone, O_CREAT | O_WRONLY | O_CLOEXEC, 0600));
	return 0;
}

/*
 * Ping-pong: rank 1 sends @size bytes, rank 0 sends them back, @count times;
 * rank 1 reports the time per round trip. Each side posts its next receive
 * before it sends, as an application exchanging would.
 */
static int pingpong_run(const struct mp_driver_ops *o, struct mp_drv *d, struct mp_drv_conn *c,
			struct mp_drv_listener *l, struct mp_drv_mr *mr, uint8_t *buf, size_t size,
			int count, int rank, int report)
{
	struct mp_drv_req *rr, *sr;
	struct mp_iov v = {buf, size};
	double t0 = 0;

	for (int k = 0; k < count; k++) {
		if (k == 1)
			t0 = mono_s(); /* the first exchange pays for the connection */
		if (o->irecv(c, buf + size, size, mr, &rr))
			return 1;
		if (rank) {
			if (o->isend(c, &v, 1, mr, &sr) || pp_wait(o, d, sr, size) ||
			    pp_wait(o, d, rr, size))
				return 1;
		} else {
			if (pp_wait(o, d, rr, size) || o->isend(c, &v, 1, mr, &sr) ||
			    pp_wait(o, d, sr, size))
				return 1;
		}
	}
	if (report && rank) {
		printf("pingpong: %zu-byte messages x %d: %.1f us per round trip\n", size, count - 1,
		       (mono_s() - t0) / (count - 1) * 1e6);
		fflush(stdout); /* the peer leaves with _exit */
	}
	return leave_mode ? leave_end(o, d, c, l, mr, buf, rank) : peer_end(o, d, c, l, mr, buf);
}

/*
 * Receives posted at once: MP_STREAM_WIN, else about 4 MiB of them (2 to 8
 * messages). Posted buffers are where the receiver's copy writes: the
 * fewer bytes they span, the more of its writes stay in cache (1 MiB x 8
 * ran at 37-38 GB/s against 39-40 for 1 MiB x 4, zero-copy receiver).
 */
/* The MTU of the stream and the frame baselines: MP_DPDK_MTU, else jumbo frames. */
static long env_mtu(void)
{
	const char *m = getenv("MP_DPDK_MTU");

	return m ? strtol(m, NULL, 10) : 9000;
}

static int env_win(size_t size)
{
	size_t dflt = ((size_t)4 << 20) / size;
	int w = dflt < 2 ? 2 : dflt > 8 ? 8 : (int)dflt;

	if (getenv("MP_STREAM_WIN"))
		w = atoi(getenv("MP_STREAM_WIN"));

	return w < 1 ? 1 : w > STREAM_WIN_MAX ? STREAM_WIN_MAX : w;
}

/*
 * One side of the stream: rank 1 (the memif server) sends @count messages of
 * @size bytes from a registered buffer (attached, not copied, on send), rank
 * 0 (the client, so that MP_DPDK_MEMIF_ARGS=",zero-copy=yes" makes the
 * receiving side zero-copy) receives them into env_win() posted buffers and
 * reports the rate over the messages after the first tenth: those warm
 * memif's rings and the mbufs up (their pages fault in), as testpmd's rate
 * leaves its first seconds out. Each peer is pinned to a CPU of its own, as
 * testpmd pins its forwarding lcores. Returns 0, 1 on failure, SKIP without
 * EAL.
 */
static int stream_peer(int rank, size_t size, int count, const char *sock, int report)
{
	const struct mp_driver_ops *o = &mp_dpdk_driver_ops;
	struct mp_drv_params p = {.size = sizeof(p), .run_name = "s", .rank = rank,
				  .connect_timeout_ms = 10000};
	struct mp_drv *d;
	struct mp_drv_listener *l;
	struct mp_drv_conn *c = NULL;
	struct mp_drv_mr *mr;
	struct mp_drv_req *r[STREAM_WIN_MAX] = {0};
	const int win = env_win(size);
	uint8_t blob[MP_DRV_ADDR_MAX];
	size_t blen = sizeof(blob), bufsz = pingpong ? 2 * size : rank ? size : size * (size_t)win;
	char vdev[256], ip[32], bind[64], ready[96];
	long mtu = env_mtu();
	uint8_t *buf = aligned_alloc(4096, (bufsz + 4095) / 4096 * 4096);
	int posted = 0, done = 0, rc;
	double t0 = 0, deadline = mono_s() + 120;
	int warm = pingpong ? 0 : count / 10; /* messages before the clock starts */
	const char *more = getenv("MP_DPDK_MEMIF_ARGS");
	cpu_set_t cpus, one;

	if (!buf)
		return 1;
	if (kill_mode) {
		struct sigaction sa = {.sa_sigaction = kill_fault,
				       .sa_flags = SA_SIGINFO | SA_RESETHAND};

		sigaction(SIGSEGV, &sa, NULL);
		sigaction(SIGBUS, &sa, NULL);
	}
	if (!sched_getaffinity(0, sizeof(cpus), &cpus) && CPU_COUNT(&cpus) >= 2)
		for (int c = 0, k = 0; c < CPU_SETSIZE; c++)
			if (CPU_ISSET(c, &cpus) && k++ == rank) {
				CPU_ZERO(&one);
				CPU_SET(c, &one);
				sched_setaffinity(0, sizeof(one), &one);
				break;
			}
	memset(buf, rank ? 0x5a : 0, bufsz);
	snprintf(ready, sizeof(ready), "%s/ready", stats); /* removed with the directory */
	snprintf(vdev, sizeof(vdev), "net_memif0,role=%s,id=0,socket=%s,mac=02:00:00:00:79:0%d,"
		 "bsize=%ld%s", rank ? "server" : "client", sock, rank + 1,
		 (mtu + 14 + 127) / 128 * 128, !rank && more ? more : "");
	snprintf(ip, sizeof(ip), "10.79.1.%d", rank + 1);
	snprintf(bind, sizeof(bind), "%s:7000", ip);
	setenv("MP_DPDK_VDEV", vdev, 1);
	setenv("MP_DPDK_IP", ip, 1);
	if (!getenv("MP_DPDK_MTU")) {
		snprintf(ip, sizeof(ip), "%ld", mtu);
		setenv("MP_DPDK_MTU", ip, 1);
	}
	if (rank == 1)
		setenv("MP_DPDK_READY_FILE", ready, 1);
	else
		for (int i = 0; i < 2000 && access(ready, F_OK); i++)
			usleep(10000);
	rc = o->init(&p, &d);
	if (rc) {
		fprintf(stderr, "stream peer %d: dpdk init: %s\n", rank, strerror(-rc));
		return SKIP;
	}
	blen = sizeof(blob);
	if (o->listen(d, bind, blob, &blen, &l) || o->reg_mr(d, buf, bufsz, MP_MEM_HOST, &mr))
		return 1;
	if (rank == 1) {
		blen = sizeof(blob);
		if (o->addr_parse(d, "02-00-00-00-79-01/10.79.1.1:7000", blob, &blen) ||
		    o->connect(d, blob, blen, &c))
			return 1;
	} else {
		while (o->accept(l, &c) == -EAGAIN && mono_s() < deadline)
			o->progress(d, 1);
		if (!c)
			return 1;
	}
	if (pingpong)
		return pingpong_run(o, d, c, l, mr, buf, size, count, rank, report);
	double kill_after = 0; /* --kill: when the partner stops polling */
	bool flowing = false, broken = false;

	for (unsigned spin = 0; done < count && (++spin % 4096 || mono_s() < deadline);) {
		if (kill_mode && !(spin % 256)) {
			char f[128];

			if (!flowing && done >= 2) {
				snprintf(f, sizeof(f), "%s/flow.%d", stats, rank);
				close(open(f, O_CREAT | O_WRONLY | O_CLOEXEC, 0600));
				flowing = true;
			}
			snprintf(f, sizeof(f), "%s/killed", stats);
			if (!kill_after && !access(f, F_OK))
				kill_after = mono_s() + KILL_POLL_S;
			if (kill_after && mono_s() > kill_after)
				return peer_end(o, d, c, l, mr, buf); /* survived the peer's death */
		}
		/* --kill: a request the dead peer failed ends the posting, not the polling. */
		while (!broken && posted < count && posted - done < win) {
			struct mp_drv_req **q = &r[posted % win];

			if (rank) {
				struct mp_iov v = {buf, size};

				rc = o->isend(c, &v, 1, mr, q);
			} else {
				rc = o->irecv(c, buf + (size_t)(posted % win) * size, size, mr, q);
			}
			if (rc == -EAGAIN)
				break;
			if (rc && kill_mode) {
				broken = true;
				break;
			}
			if (rc)
				return 1;
			posted++;
		}
		o->progress(d, 0);
		for (int fin = 1; !broken && fin && done < posted;) {
			size_t n = 0;

			fin = 0;
			rc = o->test(r[done % win], &fin, &n);
			if (!fin)
				break;
			if (kill_mode && (rc || n != size)) {
				broken = true;
				break;
			}
			if (rc || n != size) {
				fprintf(stderr, "stream peer %d: message %d: %s, %zu bytes\n", rank, done,
					strerror(-rc), n);
				return 1;
			}
			if (done++ == warm)
				t0 = mono_s();
		}
	}
	double t = mono_s() - t0;

	if (kill_mode)
		fprintf(stderr, "kill: peer %d: nobody was killed within the deadline\n", rank);
	if (done < count || kill_mode)
		return 1;
	if (!rank && buf[size - 1] != 0x5a)
		return 1;
	if (report && !rank)
		printf("stream: %zu-byte messages x %d, MTU %ld: %.0f MB/s\n", size, count - 1 - warm,
		       mtu, (double)size * (count - 1 - warm) / t / 1e6);
	fflush(stdout); /* the peer leaves with _exit */
	return peer_end(o, d, c, l, mr, buf);
}

/*
 * test_dpdk_frames --copy [SIZE_KiB [COUNT]]: the stream's memcpy baseline.
 * One process on one CPU copies COUNT messages of SIZE bytes from one buffer
 * into env_win(SIZE) buffers in turn, as the stream's receiver lands them,
 * with the same warm-up rule, twice: with memcpy, and with non-temporal
 * stores (mp_k_copy_stream, what the driver uses for large shards). The
 * better of the two is what a core that writes each shard to memory can do
 * at best for that footprint, with no device in the way. Then the sender's
 * copy of the same bytes into a ring (ring_rate).
 */
static double copy_rate(uint8_t *dst, const uint8_t *src, size_t size, int count, int win,
			bool stream)
{
	int warm = count / 10;
	double t0 = 0;

	memset(dst, 0, size * (size_t)win);
	for (int i = 0; i < count; i++) {
		if (i == warm)
			t0 = mono_s();
		if (stream)
			mp_k_copy_stream(dst + (size_t)(i % win) * size, src, size);
		else
			memcpy(dst + (size_t)(i % win) * size, src, size);
		__asm__ volatile("" : : "r"(dst) : "memory"); /* every copy happens */
	}
	if (stream)
		mp_k_stream_fence();
	double t = mono_s() - t0;

	return dst[size - 1] == src[size - 1] ? (double)size * (count - warm) / t / 1e6 : 0;
}

/*
 * The ring the two frame baselines copy into, shaped as memif's zero-copy
 * receiver's (zero-copy=yes,rsize=8): 256 buffers, each frame's payload
 * after the mbuf's headroom and our headers.
 */
enum { RING_SLOTS = 256, RING_SLOT = 9216, RING_AT = 128 + MP_FRAME_HDR_LEN + MP_REL_DATA_HDR_LEN };

/* Payload bytes of the frame at @off of a @size-byte message cut every @mss. */
static size_t frame_len(size_t size, size_t off, size_t mss)
{
	return size - off < mss ? size - off : mss;
}

/*
 * The sender's side of it: COUNT messages of SIZE bytes cut into frames of
 * @mss payload bytes, each copied to where memif's copy puts it: into the
 * next of a ring's 256 buffers (zero-copy=yes,rsize=8), after the mbuf's
 * headroom and our 86 bytes of headers. glibc's copy, which is faster than
 * the SSE rte_memcpy of a generic DPDK build: a bound, not a forecast.
 */
static double ring_rate(const uint8_t *src, size_t size, int count, size_t mss)
{
	uint8_t *ring = aligned_alloc(4096, (size_t)RING_SLOTS * RING_SLOT);
	int warm = count / 10;
	size_t k = 0;
	double t0 = 0, t;

	if (!ring || mss > RING_SLOT - RING_AT) {
		free(ring);
		return 0;
	}
	memset(ring, 0, (size_t)RING_SLOTS * RING_SLOT);
	for (int i = 0; i < count; i++) {
		if (i == warm)
			t0 = mono_s();
		for (size_t off = 0; off < size; off += mss, k++)
			memcpy(ring + (k % RING_SLOTS) * RING_SLOT + RING_AT, src + off,
			       frame_len(size, off, mss));
		__asm__ volatile("" : : "r"(ring) : "memory"); /* every copy happens */
	}
	t = mono_s() - t0;
	free(ring);
	return (double)size * (count - warm) / t / 1e6;
}

/*
 * Both sides at once, with no device and no protocol: a child process on
 * @cpu copies the frames into a 256-buffer ring in memory shared with this
 * one, which copies each out into @dst's buffers in turn, as the stream's
 * two peers do through memif. What two processes can move through shared
 * memory here; it also shows the machine's slow mode (performance.md),
 * which memif's streams share. 0 on failure or timeout.
 */
static double pipe_rate(uint8_t *dst, const uint8_t *src, size_t size, int count, int win,
			size_t mss, int cpu)
{
	/* The consumer copies as the driver's receiver does (MP_DPDK_STREAM_MIN). */
	size_t nt_min = mp_k_stream_min();
	bool nt;
	struct pipe_hdr {
		_Atomic uint64_t w, r; /* frames written, frames read */
		_Atomic int stop;
	} *h;
	size_t per = (size + mss - 1) / mss, shm = 4096 + (size_t)RING_SLOTS * RING_SLOT;
	uint64_t total = per * (uint64_t)count, warm = per * (uint64_t)(count / 10), r = 0;
	double t0 = 0, t = 0, deadline = mono_s() + 60;
	pid_t kid;
	int st;

	if (mss > RING_SLOT - RING_AT || (h = mmap(NULL, shm, PROT_READ | PROT_WRITE,
					 MAP_SHARED | MAP_ANONYMOUS, -1, 0)) == MAP_FAILED)
		return 0;
	uint8_t *ring = (uint8_t *)h + 4096;

	if (getenv("MP_DPDK_STREAM_MIN"))
		nt_min = strtoull(getenv("MP_DPDK_STREAM_MIN"), NULL, 0);
	nt = nt_min && size >= nt_min;
	memset(ring, 0, (size_t)RING_SLOTS * RING_SLOT);
	fflush(stdout);
	kid = fork();
	if (kid == 0) {
		cpu_set_t one;

		CPU_ZERO(&one);
		CPU_SET(cpu, &one);
		sched_setaffinity(0, sizeof(one), &one);
		for (uint64_t w = 0; w < total && !atomic_load(&h->stop); w++) {
			size_t off = (size_t)(w % per) * mss;

			while (w - atomic_load_explicit(&h->r, memory_order_acquire) >= RING_SLOTS)
				if (atomic_load(&h->stop))
					_exit(0);
			memcpy(ring + (w % RING_SLOTS) * RING_SLOT + RING_AT, src + off,
			       frame_len(size, off, mss));
			atomic_store_explicit(&h->w, w + 1, memory_order_release);
		}
		_exit(0);
	}
	for (unsigned spin = 0; kid > 0 && r < total; r++) {
		size_t off = (size_t)(r % per) * mss;

		if (r == warm)
			t0 = mono_s();
		while (atomic_load_explicit(&h->w, memory_order_acquire) <= r)
			if (!(++spin % 65536) && mono_s() > deadline)
				goto out; /* the child died or stalled: no rate */
		uint8_t *to = dst + (size_t)((r / per) % (uint64_t)win) * size + off;
		const uint8_t *from = ring + (r % RING_SLOTS) * RING_SLOT + RING_AT;
		size_t n = frame_len(size, off, mss);

		if (nt)
			mp_k_copy_stream(to, from, n);
		else
			memcpy(to, from, n);
		atomic_store_explicit(&h->r, r + 1, memory_order_release);
	}
	if (nt)
		mp_k_stream_fence();
	t = mono_s() - t0;
out:
	atomic_store(&h->stop, 1);
	if (kid > 0)
		waitpid(kid, &st, 0);
	munmap(h, shm);
	return r == total && t > 0 ? (double)(total - warm) * (double)size / (double)per / t / 1e6
				    : 0;
}

static int copy_main(int argc, char **argv)
{
	size_t size = (argc > 2 ? strtoul(argv[2], NULL, 10) : 1024) * 1024;
	int count = argc > 3 ? atoi(argv[3]) : 200, win;
	uint8_t *src, *dst;
	cpu_set_t one, all;
	double plain, nt;
	int other;

	if (!size || count < 2)
		return 1;
	win = env_win(size);
	src = aligned_alloc(4096, (size + 4095) / 4096 * 4096);
	dst = aligned_alloc(4096, (size * (size_t)win + 4095) / 4096 * 4096);
	if (!src || !dst) {
		free(src);
		free(dst);
		return 1;
	}
	other = -1;
	if (!sched_getaffinity(0, sizeof(all), &all))
		for (int c = 0; c < CPU_SETSIZE && other < 0; c++)
			if (CPU_ISSET(c, &all) && c != sched_getcpu())
				other = c;
	CPU_ZERO(&one);
	CPU_SET(sched_getcpu(), &one);
	sched_setaffinity(0, sizeof(one), &one);
	memset(src, 0x5a, size);
	plain = copy_rate(dst, src, size, count, win, false);
	nt = copy_rate(dst, src, size, count, win, true);
	if (plain > 0 && nt > 0) {
		long mtu = env_mtu();
		size_t hdrs = MP_IP4_HDR_LEN + MP_UDP_HDR_LEN + MP_REL_DATA_HDR_LEN;
		size_t mss = mtu > (long)hdrs ? (size_t)mtu - hdrs : MP_REL_MSS_DEFAULT;

		printf("copy: %zu-byte messages x %d into %d buffers: memcpy %.0f, non-temporal "
		       "stores %.0f; the better: %.0f MB/s\n",
		       size, count - count / 10, win, plain, nt, plain > nt ? plain : nt);
		printf("copy-ring: the same cut into %zu-byte frames, into a 256-buffer ring: "
		       "%.0f MB/s\n", mss, ring_rate(src, size, count, mss));
		if (other >= 0)
			printf("copy-pipe: the frames through that ring, shared by two processes (one "
			       "copies in, one out): %.0f MB/s\n",
			       pipe_rate(dst, src, size, count, win, mss, other));
	}
	free(src);
	free(dst);
	return plain > 0 && nt > 0 ? 0 : 1;
}

/*
 * Both peers of a stream, ping-pong or --leave run (stream_peer) as child
 * processes, waited for. The number that failed, a signal included, each
 * reported under @what; *skipped when one exited SKIP (EAL would not start).
 */
static int run_pair(size_t size, int count, const char *sock, int report, const char *what,
		    bool *skipped)
{
	pid_t pid[2];
	int fails = 0, st;

	fflush(NULL);
	for (int i = 0; i < 2; i++) {
		pid[i] = fork();
		if (pid[i] == 0)
			_exit(stream_peer(i, size, count, sock, report));
	}
	for (int i = 0; i < 2; i++) {
		waitpid(pid[i], &st, 0);
		if (WIFEXITED(st) && WEXITSTATUS(st) == SKIP) {
			*skipped = true;
		} else if (!WIFEXITED(st) || WEXITSTATUS(st)) {
			fprintf(stderr, "%s: peer %d failed (status %#x%s)\n", what, i, st,
				WIFSIGNALED(st) ? ", killed by a signal" : "");
			fails++;
		}
	}
	return fails;
}

/* test_dpdk_frames --stream|--pingpong [SIZE_KiB [COUNT]]: see stream_peer (a benchmark). */
static int stream_main(int argc, char **argv)
{
	size_t size = (argc > 2 ? strtoul(argv[2], NULL, 10) : 1024) * 1024;
	int count = argc > 3 ? atoi(argv[3]) : 200;
	char sock[64], tmpl[] = "/tmp/mpt-stream-XXXXXX";
	bool skipped = false;

	if (!size || count < 2 || !mkdtemp(tmpl))
		return 1;
	owner = getpid();
	snprintf(stats, sizeof(stats), "%s", tmpl);
	atexit(cleanup);
	snprintf(sock, sizeof(sock), "/mpt-stream-%ld.sock", (long)owner);
	return run_pair(size, count, sock, 1, "stream", &skipped) || skipped ? 1 : 0;
}

/*
 * test_dpdk_frames --leave: memif peers leave without racing DPDK's memif
 * (doc/dpdk.md, "Leaving a memif pair"). Each run, two peers exchange a few
 * messages, then the server leaves while the client polls, the client while
 * the server polls, or both at once; LEAVE_REPS runs of each. Asserted from
 * the peers' counter files: the leaver's BYE was answered (never a timeout),
 * the side that stayed answered exactly one BYE, and no BYE was malformed;
 * when both leave, one side's BYE is answered and the other yields.
 */
#define LEAVE_REPS 3

static int leave_main(void)
{
	static const struct {
		int mode;
		const char *name;
	} sc[] = {{LEAVE_SERVER_FIRST, "server leaves first"},
		  {LEAVE_CLIENT_FIRST, "client leaves first"},
		  {LEAVE_BOTH, "both leave at once"}};
	char tmpl[] = "/tmp/mpt-leave-XXXXXX", sock[64];
	int fails = 0;

	if (!mkdtemp(tmpl))
		return 1;
	owner = getpid();
	snprintf(stats, sizeof(stats), "%s", tmpl);
	atexit(cleanup);
	setenv("MP_DPDK_STATS", stats, 1);
	pingpong = 1;
	for (int run = 0; run < LEAVE_REPS * 3; run++) {
		char b0[32] = "", b1[32] = "";
		bool skipped = false;
		int bad;

		leave_mode = sc[run % 3].mode;
		sh("rm -f %s/dpdk.* %s/gone.* %s/ready", stats, stats, stats);
		snprintf(sock, sizeof(sock), "/mpt-leave-%ld-%d.sock", (long)owner, run);
		bad = run_pair(64 * 1024, 3, sock, 0, sc[run % 3].name, &skipped);
		if (skipped && run == 0) {
			printf("SKIP: EAL or the memif port would not start here\n");
			return SKIP;
		}
		bad += skipped;
		counter_word(0, "bye", b0, sizeof(b0));
		counter_word(1, "bye", b1, sizeof(b1));
		long long rx0 = counter(0, "bye_rx"), rx1 = counter(1, "bye_rx");
		long long bad0 = counter(0, "bye_bad"), bad1 = counter(1, "bye_bad");
		bool s_ans = !strcmp(b1, "answered"), c_ans = !strcmp(b0, "answered");
		/* The side that stayed: still quiet at its own end, or its link already down. */
		bool s_stayed = !strcmp(b1, "peer_left_first") || !strcmp(b1, "peer_gone");
		bool c_stayed = !strcmp(b0, "peer_left_first") || !strcmp(b0, "peer_gone");

		switch (leave_mode) {
		case LEAVE_SERVER_FIRST:
			bad += !s_ans || !c_stayed || rx0 != 1 || rx1 != 0;
			break;
		case LEAVE_CLIENT_FIRST:
			bad += !c_ans || !s_stayed || rx1 != 1 || rx0 != 0;
			break;
		default:
			/* The client yields to the server, or one was quicker. */
			bad += !((s_ans && (!strcmp(b0, "yielded") || c_stayed) && rx0 == 1 && rx1 == 0) ||
				 (c_ans && s_stayed && rx1 == 1 && rx0 == 0));
		}
		bad += bad0 != 0 || bad1 != 0;
		printf("leave: %s: server bye=%s bye_rx=%lld, client bye=%s bye_rx=%lld%s\n",
		       sc[run % 3].name, b1, rx1, b0, rx0, bad ? ": WRONG" : "");
		fails += bad != 0;
	}
	return fails ? 1 : 0;
}

/*
 * test_dpdk_frames --kill [RUNS]: a memif peer killed with SIGKILL while
 * both stream must not take its partner with it (doc/dpdk.md, "Leaving a
 * memif pair"). Each run starts a pair streaming 256 KiB messages (server
 * to client), waits until messages move on both sides, SIGKILLs one side
 * (the server in even runs, the client in odd ones) after 0-4 ms more, and
 * lets the partner poll KILL_POLL_S longer before it finalises. Counted: the
 * partners that died of a signal (DPDK's memif unmapping the rings under a
 * burst), and the partners whose counters say the relay saw the peer's
 * control connection end (peer_lost). Exit 0 only with no crash, no other
 * failure and peer_lost=1 at every partner; with MP_KILL_COUNT_ONLY=1 the
 * figures are printed and only a setup failure fails.
 */
static int kill_main(int runs)
{
	char tmpl[] = "/tmp/mpt-kill-XXXXXX", sock[64];
	int crashes[2] = {0, 0}, other = 0, lost = 0, done = 0;
	bool count_only = getenv("MP_KILL_COUNT_ONLY") && atoi(getenv("MP_KILL_COUNT_ONLY"));

	if (runs < 1 || !mkdtemp(tmpl))
		return 1;
	owner = getpid();
	snprintf(stats, sizeof(stats), "%s", tmpl);
	atexit(cleanup);
	setenv("MP_DPDK_STATS", stats, 1);
	kill_mode = 1;
	srand((unsigned)owner);
	for (int run = 0; run < runs; run++) {
		int victim = run % 2 == 0 ? 1 : 0, partner = !victim, st[2] = {0, 0};
		double until = mono_s() + 20;
		char f[2][128];
		pid_t pid[2];

		sh("rm -f %s/dpdk.* %s/flow.* %s/killed %s/ready", stats, stats, stats, stats);
		snprintf(sock, sizeof(sock), "/mpt-kill-%ld-%d.sock", (long)owner, run);
		fflush(NULL);
		for (int i = 0; i < 2; i++) {
			pid[i] = fork();
			if (pid[i] == 0)
				_exit(stream_peer(i, 256 * 1024, 1 << 30, sock, 0));
		}
		for (int i = 0; i < 2; i++)
			snprintf(f[i], sizeof(f[i]), "%s/flow.%d", stats, i);
		for (siginfo_t si = {.si_pid = 0};
		     mono_s() < until && (access(f[0], F_OK) || access(f[1], F_OK)) &&
		     !waitid(P_ALL, 0, &si, WEXITED | WNOHANG | WNOWAIT) && !si.si_pid;)
			usleep(1000); /* both move, or one ended early (its status is kept) */
		bool flowing = !access(f[0], F_OK) && !access(f[1], F_OK);

		usleep((useconds_t)(rand() % 5000));
		kill(pid[victim], SIGKILL);
		sh("touch %s/killed", stats);
		waitpid(pid[victim], &st[victim], 0);
		waitpid(pid[partner], &st[partner], 0);
		if (WIFEXITED(st[partner]) && WEXITSTATUS(st[partner]) == SKIP && run == 0) {
			printf("SKIP: EAL or the memif port would not start here\n");
			return SKIP;
		}
		long long pl = counter(partner, "peer_lost");

		if (WIFSIGNALED(st[partner])) {
			crashes[partner]++;
			printf("kill: run %d: the %s partner died of signal %d (%s)\n", run,
			       partner ? "server" : "client", WTERMSIG(st[partner]),
			       strsignal(WTERMSIG(st[partner])));
		} else if (!flowing || !WIFEXITED(st[partner]) || WEXITSTATUS(st[partner])) {
			other++;
			printf("kill: run %d: %s, the %s partner exited with %d\n", run,
			       flowing ? "flowing" : "never flowing", partner ? "server" : "client",
			       WIFEXITED(st[partner]) ? WEXITSTATUS(st[partner]) : -1);
		} else {
			done++;
		}
		lost += pl == 1;
	}
	printf("kill: %d runs (%d servers killed, %d clients): partners crashed %d (server %d, "
	       "client %d), other failures %d, survived %d, peer_lost=1 at %d\n",
	       runs, (runs + 1) / 2, runs / 2, crashes[0] + crashes[1], crashes[1], crashes[0],
	       other, done, lost);
	if (count_only)
		return other ? 1 : 0;
	return crashes[0] + crashes[1] || other || lost != runs ? 1 : 0;
}

int main(int argc, char **argv)
{
	int up[2][2], down[2][2], fails = 0, skipped = 0;
	pid_t pid[2];
	char tmpl[] = "/tmp/mpt-dpdk-XXXXXX";

	if (argc > 1 && !strcmp(argv[1], "--copy"))
		return copy_main(argc, argv);
	if (argc > 1 && !strcmp(argv[1], "--leave"))
		return leave_main();
	if (argc > 1 && !strcmp(argv[1], "--kill"))
		return kill_main(argc > 2 ? atoi(argv[2]) : 20);
	if (argc > 1 && (!strcmp(argv[1], "--stream") || !strcmp(argv[1], "--pingpong"))) {
		pingpong = !strcmp(argv[1], "--pingpong");
		return stream_main(argc, argv);
	}
	if (geteuid() != 0) {
		printf("SKIP: needs root for network namespaces and raw sockets\n");
		return SKIP;
	}
	owner = getpid();
	snprintf(br, sizeof(br), "mpt%ldb", (long)owner % 100000);
	atexit(cleanup);
	signal(SIGINT, on_signal);
	signal(SIGTERM, on_signal);
	if (sh("ip netns add mpt-%ld-0 && ip netns add mpt-%ld-1", (long)owner, (long)owner)) {
		printf("SKIP: cannot create network namespaces\n");
		return SKIP;
	}
	if (!mkdtemp(tmpl))
		return 1;
	snprintf(stats, sizeof(stats), "%s", tmpl);
	setenv("MP_DPDK_STATS", stats, 1);
	if (sh("ip link add %s type bridge && ip link set %s up", br, br))
		return 1;
	for (int i = 0; i < 2; i++)
		if (sh("ip link add mpth%ld%d type veth peer name mptn%d netns mpt-%ld-%d && "
		       "ip -n mpt-%ld-%d link set mptn%d address 02:00:00:00:78:0%d && "
		       "ip link set mpth%ld%d master %s up", (long)owner % 100000, i, i, (long)owner,
		       i, (long)owner, i, i, i + 1, (long)owner % 100000, i, br))
			return 1;
	fflush(NULL);
	for (int i = 0; i < 2; i++) {
		if (pipe(up[i]) || pipe(down[i]))
			return 1;
		pid[i] = fork();
		if (pid[i] == 0)
			_exit(peer(i, up[i][1], down[i][0]));
	}
	for (int i = 0; i < 2; i++) {
		struct pollfd pf = {.fd = up[i][0], .events = POLLIN};
		char ok;

		if (poll(&pf, 1, 20000) != 1 || read(up[i][0], &ok, 1) != 1) {
			fprintf(stderr, "peer %d did not start\n", i);
			fails++;
		}
	}
	if (!fails && inject())
		fails++;
	if (write(down[0][1], "G", 1) != 1)
		fails++;
	for (int i = 0; i < 2; i++) {
		int st;

		waitpid(pid[i], &st, 0);
		if (WIFEXITED(st) && WEXITSTATUS(st) == SKIP)
			skipped++;
		else if (!WIFEXITED(st) || WEXITSTATUS(st)) {
			fprintf(stderr, "peer %d failed (status %d)\n", i, st);
			fails++;
		}
	}
	if (skipped) {
		printf("SKIP: EAL or the af_packet port would not start here\n");
		return SKIP;
	}
	static const char *const keys[] = {"frame_other_port", "frame_bad_ip", "frame_not_udp",
					   "frame_bad_udp", "rel_drop_magic"};
	for (size_t k = 0; k < sizeof(keys) / sizeof(keys[0]); k++) {
		long long v = counter(0, keys[k]);

		printf("%s peer 0: %s=%lld (want %d)\n", v == K ? "ok" : "FAIL", keys[k], v, K);
		fails += v != K;
	}
	long long bye = counter(0, "bye_bad");

	printf("%s peer 0: bye_bad=%lld (want %d)\n", bye == 2 * K ? "ok" : "FAIL", bye, 2 * K);
	fails += bye != 2 * K;
	long long arp = counter(0, "arp_replies");

	/* One reply a request that reached it, and at least one. */
	int arp_ok = arp >= 1 && arp <= arp_sent;
	printf("%s peer 0: arp_replies=%lld (want 1 to %d, the requests sent)\n",
	       arp_ok ? "ok" : "FAIL", arp, arp_sent);
	fails += !arp_ok;
	printf("%s\n", fails ? "FAIL" : "PASS");
	return fails ? 1 : 0;
}
