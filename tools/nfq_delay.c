/*
 * nfq_delay: a fixed one-way delay on an NFQUEUE queue, for the WAN test bed
 * (tools/wan_bed.sh) on kernels without netem.
 *
 * It binds queue --queue=N, notes each packet's id and arrival time, and
 * gives it the verdict NF_ACCEPT --delay later. The delay is the same for
 * every packet, so release order is arrival order: the held packets are a
 * FIFO (a ring of ids and deadlines), and one batch verdict (every id up to
 * the newest due one) releases all that are due. Only metadata is copied to
 * user space (NFQNL_COPY_META); the packets themselves stay in the kernel.
 *
 * Memory is bounded: at most --limit packets are held. A packet that arrives
 * when --limit are held gets NF_DROP at once (a full router queue drops; a
 * fail-open pass would silently skip the delay) and is counted in
 * dropped_full. The kernel's own queue is sized 2 x --limit so that our
 * count, not the kernel's silent one, is the one that fires; the kernel's
 * counters (queue_dropped, user_dropped) are printed too.
 *
 * SIGTERM or SIGINT: every held packet is accepted at once (connections are
 * not left stalled), the queue is unbound, and the counters are printed on
 * stderr. See doc/nfq_delay.1.
 */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
/* netinet/in.h before any linux/ header, or their structs collide. */
#include <netinet/in.h>
#include <linux/netfilter.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <libnetfilter_queue/libnetfilter_queue.h>

struct held {
	uint32_t id;
	int64_t due_ns;
};

struct state {
	struct nfq_q_handle *qh;
	int64_t delay_ns;
	struct held *ring;
	size_t cap, head, len;
	/* counters */
	uint64_t packets, accepted, on_time, flushed, dropped_full, verdict_calls, enobufs, verdict_err;
	size_t held_max;
	int64_t late_max_ns;
	double late_sum_ns;
};

static volatile sig_atomic_t stop_flag;

static void on_signal(int sig)
{
	(void)sig;
	stop_flag = 1;
}

static int64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* "10ms", "250us", "1s", "5000ns"; a bare number is milliseconds. */
static int parse_duration_ns(const char *s, int64_t *out)
{
	char *end;
	errno = 0;
	double v = strtod(s, &end);
	if (errno || end == s || v < 0)
		return -EINVAL;
	double mul = 1e6;
	if (*end == '\0' || strcmp(end, "ms") == 0)
		mul = 1e6;
	else if (strcmp(end, "us") == 0)
		mul = 1e3;
	else if (strcmp(end, "ns") == 0)
		mul = 1;
	else if (strcmp(end, "s") == 0)
		mul = 1e9;
	else
		return -EINVAL;
	if (v * mul > 60e9) /* a minute is no WAN */
		return -ERANGE;
	*out = (int64_t)(v * mul + 0.5);
	return 0;
}

static int parse_uint(const char *s, unsigned long lo, unsigned long hi, unsigned long *out)
{
	char *end;
	errno = 0;
	unsigned long v = strtoul(s, &end, 10);
	if (errno || end == s || *end || v < lo || v > hi)
		return -EINVAL;
	*out = v;
	return 0;
}

/* Accept every held packet whose deadline is at or before now (every one
 * when flush, at exit, without counting them as late), in one batch verdict
 * up to the newest of them. */
static void release_due(struct state *st, int64_t now, bool flush)
{
	size_t n = 0;
	uint32_t last = 0;
	while (st->len > 0) {
		struct held *h = &st->ring[st->head];
		if (h->due_ns > now && !flush)
			break;
		if (flush) {
			st->flushed++;
		} else {
			int64_t late = now - h->due_ns;
			if (late > st->late_max_ns)
				st->late_max_ns = late;
			st->late_sum_ns += (double)late;
			st->on_time++;
		}
		last = h->id;
		st->head = (st->head + 1) % st->cap;
		st->len--;
		n++;
	}
	if (n == 0)
		return;
	st->verdict_calls++;
	if (nfq_set_verdict_batch(st->qh, last, NF_ACCEPT) < 0)
		st->verdict_err++;
	st->accepted += n;
}

static int on_packet(struct nfq_q_handle *qh, struct nfgenmsg *msg, struct nfq_data *nfa,
	void *data)
{
	(void)msg;
	struct state *st = data;
	struct nfqnl_msg_packet_hdr *ph = nfq_get_msg_packet_hdr(nfa);
	if (!ph)
		return 0;
	uint32_t id = ntohl(ph->packet_id);
	st->packets++;
	if (st->len == st->cap) {
		st->dropped_full++;
		if (nfq_set_verdict(qh, id, NF_DROP, 0, NULL) < 0)
			st->verdict_err++;
		return 0;
	}
	struct held *h = &st->ring[(st->head + st->len) % st->cap];
	h->id = id;
	h->due_ns = now_ns() + st->delay_ns;
	st->len++;
	if (st->len > st->held_max)
		st->held_max = st->len;
	return 0;
}

/* The kernel's counters for queue qnum (this network namespace's
 * /proc/net/netfilter/nfnetlink_queue): packets it dropped because its queue
 * was full, and because a message to us failed. -1 when not found. */
static void kernel_drops(unsigned qnum, long long *queue_dropped, long long *user_dropped)
{
	*queue_dropped = *user_dropped = -1;
	FILE *f = fopen("/proc/net/netfilter/nfnetlink_queue", "r");
	if (!f)
		return;
	unsigned q, pid, mode, range, total;
	long long qtotal, qd, ud, idseq;
	char line[256];
	while (fgets(line, sizeof line, f)) {
		/* queue portid total copy_mode copy_range queue_dropped user_dropped id_sequence 1 */
		if (sscanf(line, "%u %u %lld %u %u %lld %lld %lld %u", &q, &pid, &qtotal, &mode, &range,
			    &qd, &ud, &idseq, &total) >= 7 &&
			q == qnum) {
			*queue_dropped = qd;
			*user_dropped = ud;
		}
	}
	fclose(f);
}

static void usage(FILE *f)
{
	fprintf(f, "usage: nfq_delay [--queue=N] [--delay=10ms] [--limit=PACKETS]\n"
		   "  --queue=N        NFQUEUE queue number to bind (default 0)\n"
		   "  --delay=D        fixed delay per packet: ns, us, ms (default), s\n"
		   "  --limit=P        packets held at most; beyond it NF_DROP (default 16384)\n"
		   "Runs until SIGTERM/SIGINT, then accepts what it holds and prints counters.\n");
}

int main(int argc, char **argv)
{
	unsigned long qnum = 0, limit = 16384;
	int64_t delay_ns = 10 * 1000000LL;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		unsigned long v;
		if (strncmp(a, "--queue=", 8) == 0 && parse_uint(a + 8, 0, 65535, &v) == 0) {
			qnum = v;
		} else if (strncmp(a, "--delay=", 8) == 0 && parse_duration_ns(a + 8, &delay_ns) == 0) {
			;
		} else if (strncmp(a, "--limit=", 8) == 0 &&
			   parse_uint(a + 8, 1, 1UL << 20, &v) == 0) {
			limit = v;
		} else if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
			usage(stdout);
			return 0;
		} else {
			fprintf(stderr, "nfq_delay: bad argument '%s'\n", a);
			usage(stderr);
			return 2;
		}
	}

	struct state st = {.delay_ns = delay_ns, .cap = limit};
	st.ring = calloc(limit, sizeof *st.ring);
	if (!st.ring) {
		fprintf(stderr, "nfq_delay: out of memory for %lu slots\n", limit);
		return 1;
	}
	/* Deadlines are met to within the timer slack: ask for 1 us, not 50. */
	prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);

	/* Signals stay blocked except inside ppoll, so a SIGTERM between the
	 * flag test and the wait cannot be lost. */
	sigset_t block, orig;
	sigemptyset(&block);
	sigaddset(&block, SIGTERM);
	sigaddset(&block, SIGINT);
	sigprocmask(SIG_BLOCK, &block, &orig);
	struct sigaction sa = {.sa_handler = on_signal};
	sigemptyset(&sa.sa_mask);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	sigset_t waitmask = orig;
	sigdelset(&waitmask, SIGTERM);
	sigdelset(&waitmask, SIGINT);

	struct nfq_handle *h = nfq_open();
	if (!h) {
		fprintf(stderr, "nfq_delay: nfq_open: %s (root? nfnetlink_queue?)\n", strerror(errno));
		return 1;
	}
	st.qh = nfq_create_queue(h, (uint16_t)qnum, on_packet, &st);
	if (!st.qh) {
		fprintf(stderr, "nfq_delay: cannot bind queue %lu: %s (already bound?)\n", qnum,
			strerror(errno));
		nfq_close(h);
		return 1;
	}
	if (nfq_set_mode(st.qh, NFQNL_COPY_META, 0) < 0) {
		fprintf(stderr, "nfq_delay: nfq_set_mode: %s\n", strerror(errno));
		return 1;
	}
	/* Room in the kernel for twice what we hold (see the top comment). */
	uint32_t kmax = limit * 2 > UINT32_MAX ? UINT32_MAX : (uint32_t)(limit * 2);
	if (nfq_set_queue_maxlen(st.qh, kmax) < 0)
		fprintf(stderr, "nfq_delay: nfq_set_queue_maxlen: %s (kernel default kept)\n",
			strerror(errno));
	/* GSO packets whole: one message per 64 KiB super-packet, not per
	 * segment (only metadata is read, so checksums do not matter). */
	if (nfq_set_queue_flags(st.qh, NFQA_CFG_F_GSO, NFQA_CFG_F_GSO) < 0)
		fprintf(stderr, "nfq_delay: no NFQA_CFG_F_GSO: %s (segments queued one by one)\n",
			strerror(errno));
	/* Messages are small (metadata); a large buffer rides out a late wake-up. */
	nfnl_rcvbufsiz(nfq_nfnlh(h), 8u << 20);
	int fd = nfq_fd(h);
	fprintf(stderr, "nfq_delay: queue %lu bound, delay %" PRId64 " us, limit %lu packets\n", qnum,
		delay_ns / 1000, limit);
	fflush(stderr);

	static char buf[65536] __attribute__((aligned));
	while (!stop_flag) {
		int64_t now = now_ns();
		release_due(&st, now, false);
		struct timespec ts, *tsp = NULL;
		if (st.len > 0) {
			int64_t wait = st.ring[st.head].due_ns - now;
			if (wait < 0)
				wait = 0;
			ts.tv_sec = wait / 1000000000;
			ts.tv_nsec = wait % 1000000000;
			tsp = &ts;
		}
		struct pollfd pfd = {.fd = fd, .events = POLLIN};
		int r = ppoll(&pfd, 1, tsp, &waitmask);
		if (r < 0) {
			if (errno == EINTR)
				continue;
			fprintf(stderr, "nfq_delay: ppoll: %s\n", strerror(errno));
			break;
		}
		if (r == 0)
			continue;
		for (;;) {
			ssize_t n = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
			if (n < 0) {
				if (errno == ENOBUFS) {
					/* Messages lost: their packets are released by the
					 * next batch verdict, which covers every lower id. */
					st.enobufs++;
					continue;
				}
				break;
			}
			if (n == 0)
				break;
			nfq_handle_packet(h, buf, (int)n);
		}
	}
	/* Leave nothing stalled: accept all that is held, now. */
	release_due(&st, now_ns(), true);
	long long kqd, kud;
	kernel_drops((unsigned)qnum, &kqd, &kud);
	nfq_destroy_queue(st.qh);
	nfq_close(h);
	fprintf(stderr,
		"nfq_delay: queue=%lu delay_us=%" PRId64 " packets=%" PRIu64 " accepted=%" PRIu64
		" flushed_at_exit=%" PRIu64 " dropped_full=%" PRIu64 " held_max=%zu verdicts=%" PRIu64 " verdict_err=%" PRIu64
		" enobufs=%" PRIu64 " late_max_us=%.1f late_mean_us=%.1f kernel_queue_dropped=%lld"
		" kernel_user_dropped=%lld\n",
		qnum, delay_ns / 1000, st.packets, st.accepted, st.flushed, st.dropped_full, st.held_max,
		st.verdict_calls, st.verdict_err, st.enobufs, st.late_max_ns / 1e3,
		st.on_time ? st.late_sum_ns / (double)st.on_time / 1e3 : 0.0, kqd, kud);
	free(st.ring);
	return 0;
}
