/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Followed runs of mpbench: dht rendezvous, churn, faults, joiners, intruders.
 *
 * Every local peer averages one Moshpit round per call (cfg.rounds = 1) and
 * reports each round, so that the coordinator follows the run: it starts
 * late peers after round 1, notices deaths (pipe EOF, then waitpid) and
 * starts replacements. A peer learns the global round of each call from the
 * tail of its own contribution log, since a joiner starts at whatever round
 * the run is at. The vector is generated once and averaged through every
 * iteration, so a joiner's values do not depend on when it joins; the
 * survivors send their final values up and the coordinator checks them
 * against a replay of every log (replay.c).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <dirent.h>
#include <unistd.h>

#include "mpbench.h"
#include "replay.h"

static const char *const role_names[] = { "peer", "late peer", "intruder", "replacement" };

/* The coordinator's view of one peer. */
struct fpeer {
	struct fspec s;
	pid_t pid;            /* 0 once reaped */
	int up_fd, down_fd;   /* -1 once closed */
	int64_t seen;         /* last message, ms */
	int have_addr, hello, done, lost, stopped;
	uint64_t id;
	char addr[MP_ADDR_STRLEN]; /* static: data-plane address */
	char dht[MP_ADDR_STRLEN];
	int64_t last_round;   /* -1 before its first */
	int woken;            /* a standby that was sent MSG_GO */
	int grouped;          /* rounds in a group, as it reported them */
	float *vec;           /* final values (--check) */
	struct size_result res;
	int have_res;
	struct summary sum;
	int have_sum;
};

struct fcoord {
	const struct bench *b;
	struct fpeer *p;
	int n, cap;
	char logdir[PATH_MAX / 2]; /* room for "/<id>.log" in fspec.log */
	int own_logdir;       /* a temporary directory of ours */
	char boot[MP_ADDR_STRLEN]; /* peer 0's DHT node */
	char tdetail[256];         /* the first hello's mp_transport_detail */
	int tdetail_known;
	char bootlist[MP_ADDR_STRLEN]; /* fboot's answer */
	int rr;
	int64_t next_sample;  /* --sample: the round of the next one */
};

static void fpeer_name(const struct fpeer *fp, char *buf, size_t len)
{
	if (fp->pid > 0)
		snprintf(buf, len, "%s%s %d (id %016llx, pid %ld)", fp->s.standby ? "standby " : "",
			 role_names[fp->s.role],
			 fp->s.idx, (unsigned long long)fp->s.id, (long)fp->pid);
	else
		snprintf(buf, len, "%s%s %d (id %016llx)", fp->s.standby ? "standby " : "",
			 role_names[fp->s.role], fp->s.idx,
			 (unsigned long long)fp->s.id);
}

static int fpeer_running(const struct fpeer *fp)
{
	return !fp->done && !fp->lost;
}

/* Append @fmt to the peer's fault spec, comma-separated. */
__attribute__((format(printf, 2, 3)))
static void fault_add(struct fspec *s, const char *fmt, ...)
{
	size_t off = strlen(s->fault);
	va_list ap;

	if (off && off + 1 < sizeof(s->fault))
		s->fault[off++] = ',';
	va_start(ap, fmt);
	vsnprintf(s->fault + off, sizeof(s->fault) - off, fmt, ap);
	va_end(ap);
}

/*
 * The peer's faults: --fault for its index, and with --churn its death: in
 * each round from @from on (before churn_end) it dies with probability
 * --churn, drawn from its own seeded generator; it is killed (SIGKILL) in
 * the scatter or gather phase, after 0 or 1 frames of it.
 */
static void plan_faults(const struct bench *b, struct fspec *s, int64_t from)
{
	uint64_t st = mix64(b->seed ^ 0x636875726e000000ULL ^ mix64((uint64_t)s->idx + 1));

	s->fault[0] = '\0';
	for (int k = 0; k < b->nfaults; k++) {
		if (b->faults[k].index != s->idx)
			continue;
		fault_add(s, "%s", b->faults[k].spec);
		if (strncmp(b->faults[k].spec, "kill", 4) == 0 || strstr(b->faults[k].spec, ",kill"))
			s->kill = 1;
	}
	if (b->churn <= 0 || s->role == ROLE_INTRUDER ||
	    (s->role == ROLE_INITIAL && s->idx < b->keep))
		return;
	/* A standby does not know the round it will be woken in: it gets a
	 * death for every round the draw picks, each only for a peer there by
	 * then (joined=), so that it dies in the first drawn round from the
	 * one it joins in, as a replacement planned from that round would. */
	for (int64_t r = from < 0 || s->standby ? 0 : from; r < b->churn_end; r++) {
		uint64_t h;
		char joined[32] = "";

		st = mix64(st + 0x9e3779b97f4a7c15ULL);
		if ((double)(st >> 11) * 0x1p-53 >= b->churn)
			continue;
		h = mix64(st ^ 0x5bd1e995ULL);
		/* --churn-catchup: a peer alone in round r, or a replacement
		 * that has not joined by then, dies in its first round after it
		 * instead of living on; never in the rounds after the churn.
		 * Without it (the default, as the suite's churn tests were
		 * measured) the death comes in round r or not at all. */
		if (s->standby)
			snprintf(joined, sizeof(joined), ":joined=%lld", (long long)r);
		fault_add(s, "kill:round=%lld:until=%lld:phase=%s:after=%d%s", (long long)r,
			  (long long)(b->catchup ? b->churn_end : r + 1), (h & 1) ? "gather" : "scatter",
			  (int)((h >> 1) & 1), joined);
		s->kill = 1;
		if (!s->standby)
			break;
	}
}

/* --clients, --aux: the last initial peers of a followed run, aux last. */
static int peer_mode(const struct bench *b, int role, int idx)
{
	if (role != ROLE_INITIAL)
		return MP_MODE_NORMAL;
	if (idx >= b->npeers - b->aux)
		return MP_MODE_AUX;
	return idx >= b->npeers - b->aux - b->clients ? MP_MODE_CLIENT : MP_MODE_NORMAL;
}

/* Start a peer of @role. 0, or -1 after a message. */
static int fspawn(struct fcoord *fc, int role, int npeers, const char *bootstrap, int dht_port,
		  int64_t from_round, int standby)
{
	const struct bench *b = fc->b;
	struct fpeer *fp;
	char what[64];
	int fds[2];
	pid_t pid;

	if (fc->n == fc->cap) {
		fc->cap = fc->cap ? fc->cap * 2 : 32;
		fc->p = realloc(fc->p, (size_t)fc->cap * sizeof(*fc->p));
		if (!fc->p)
			die_oom();
	}
	fp = &fc->p[fc->n];
	memset(fp, 0, sizeof(*fp));
	fp->up_fd = fp->down_fd = -1;
	fp->last_round = -1;
	fp->s.idx = fc->n;
	fp->s.role = role;
	fp->s.id = b->dht ? peer_id_of(b->seed, fp->s.idx) : (uint64_t)fp->s.idx;
	fp->s.npeers = npeers;
	fp->s.dht_port = dht_port;
	fp->s.mode = peer_mode(b, role, fp->s.idx);
	snprintf(fp->s.bootstrap, sizeof(fp->s.bootstrap), "%s", bootstrap ? bootstrap : "");
	fp->s.standby = standby;
	plan_faults(b, &fp->s, from_round);
	if (strlen(fp->s.fault) + 1 >= sizeof(fp->s.fault)) {
		fprintf(stderr, PROG ": the faults planned for %s %d do not fit in %zu bytes "
			"(fewer rounds of --churn)\n", role_names[role], fp->s.idx, sizeof(fp->s.fault));
		return -1;
	}
	snprintf(fp->s.log, sizeof(fp->s.log), "%s/%016llx.log", fc->logdir,
		 (unsigned long long)fp->s.id);
	unlink(fp->s.log); /* a kept directory from an earlier run */
	fp->id = fp->s.id;
	fp->seen = (int64_t)mp_now_ms();

	snprintf(what, sizeof(what), "%s %d", role_names[role], fp->s.idx);
	pid = fork_peer(what, fds);
	if (pid < 0)
		return -1;
	if (pid == 0) {
		struct chan cu = { .fd = fds[0] }, cd = { .fd = fds[1] };

		for (int j = 0; j < fc->n; j++) {
			if (fc->p[j].up_fd >= 0)
				close(fc->p[j].up_fd);
			if (fc->p[j].down_fd >= 0)
				close(fc->p[j].down_fd);
		}
		_exit(follow_peer(b, &fp->s, &cu, &cd) ? EXIT_FAIL : EXIT_OK);
	}
	fp->up_fd = fds[0];
	fp->down_fd = fds[1];
	fp->pid = pid;
	fc->n++;
	return 0;
}

/* 1 with a message (MSG_EOF when a pipe closed), 0 on timeout, < 0 on error. */
static int frecv(struct fcoord *fc, struct msg *m, int timeout_ms)
{
	struct pollfd *pfd = xcalloc((size_t)fc->n, sizeof(*pfd));
	int *who = xcalloc((size_t)fc->n, sizeof(*who));
	int np = 0, rc;

	for (int k = 0; k < fc->n; k++) {
		int r = (fc->rr + k) % fc->n;

		if (fc->p[r].up_fd < 0)
			continue;
		pfd[np].fd = fc->p[r].up_fd;
		pfd[np].events = POLLIN;
		who[np++] = r;
	}
	rc = np ? poll(pfd, (nfds_t)np, timeout_ms) : 0;
	if (!np)
		usleep((useconds_t)timeout_ms * 1000);
	if (rc <= 0) {
		rc = rc < 0 && errno != EINTR ? -errno : 0;
		goto out;
	}
	rc = 0;
	for (int k = 0; k < np; k++) {
		struct fpeer *fp = &fc->p[who[k]];

		if (!pfd[k].revents)
			continue;
		fc->rr = (who[k] + 1) % fc->n;
		if (fd_recv_msg(fp->up_fd, m, 5000) <= 0) {
			close(fp->up_fd);
			fp->up_fd = -1;
			memset(m, 0, sizeof(*m));
			m->type = MSG_EOF;
		}
		m->rank = who[k];
		rc = 1;
		break;
	}
out:
	free(pfd);
	free(who);
	return rc;
}

/* Wait up to @ms for the peer to exit; 1 with its status, else 0. */
static int freap(struct fpeer *fp, int ms, int *status)
{
	int64_t deadline = (int64_t)mp_now_ms() + ms;

	while (fp->pid > 0) {
		pid_t w = waitpid(fp->pid, status, WNOHANG);

		if (w == fp->pid) {
			fp->pid = 0;
			return 1;
		}
		if ((w < 0 && errno != EINTR) || (int64_t)mp_now_ms() > deadline)
			return 0;
		usleep(2000);
	}
	return 0;
}

static void fkill_all(struct fcoord *fc)
{
	int status;

	for (int k = 0; k < fc->n; k++)
		if (fc->p[k].pid > 0)
			kill(fc->p[k].pid, SIGKILL);
	for (int k = 0; k < fc->n; k++)
		freap(&fc->p[k], 5000, &status);
}

/* Whether a UDP socket is bound to @port (Linux: /proc/net/udp, udp6). */
static int udp_port_bound(int port)
{
	static const char *const files[] = { "/proc/net/udp", "/proc/net/udp6" };

	for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
		FILE *f = fopen(files[i], "r");
		char line[512];

		if (!f)
			continue;
		while (fgets(line, sizeof(line), f)) {
			unsigned lport;

			if (sscanf(line, " %*d: %*[0-9A-Fa-f]:%x", &lport) == 1 &&
			    lport == (unsigned)port) {
				fclose(f);
				return 1;
			}
		}
		fclose(f);
	}
	return 0;
}

/* A UDP port free right now, for peer 0's DHT node: the others bootstrap
 * from it while peer 0 is still in mp_init, which waits for them. */
static int free_udp_port(void)
{
	struct sockaddr_in a = { .sin_family = AF_INET };
	socklen_t len = sizeof(a);
	int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0), port = -1;

	if (fd < 0)
		return -1;
	a.sin_addr.s_addr = htonl(INADDR_ANY);
	if (bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
	    getsockname(fd, (struct sockaddr *)&a, &len) == 0)
		port = ntohs(a.sin_port);
	close(fd);
	return port;
}

/* DHT address of a live peer to bootstrap from (peer 0's node if none said). */
static const char *fboot(struct fcoord *fc)
{
	size_t len = 0;
	int n = 0;

	/* A few running peers, not one: a new DHT node learns the network
	 * through its bootstrap contacts, and with several its puts and
	 * listens find the nodes that hold the run's keys sooner. */
	for (int k = 0; k < fc->n && n < 3; k++) {
		const struct fpeer *fp = &fc->p[k];

		if (fp->s.role == ROLE_INTRUDER || !fp->hello || !fpeer_running(fp) || !fp->dht[0] ||
		    len + strlen(fp->dht) + 2 > sizeof(fc->bootlist))
			continue;
		len += (size_t)snprintf(fc->bootlist + len, sizeof(fc->bootlist) - len, "%s%s",
					n++ ? "," : "", fp->dht);
	}
	return n ? fc->bootlist : fc->boot;
}

/* The round the run is at: the highest any running peer finished. */
static int64_t fround(const struct fcoord *fc)
{
	int64_t r = -1;

	for (int k = 0; k < fc->n; k++)
		if (fpeer_running(&fc->p[k]) && fc->p[k].s.role != ROLE_INTRUDER &&
		    fc->p[k].last_round > r)
			r = fc->p[k].last_round;
	return r;
}

/* VmRSS (kB) and Threads of process @pid, from /proc; -1 where unknown. */
static void proc_status(pid_t pid, long *rss_kb, long *threads)
{
	char path[64], line[256];
	FILE *f;

	*rss_kb = *threads = -1;
	snprintf(path, sizeof(path), "/proc/%ld/status", (long)pid);
	f = fopen(path, "r");
	if (!f)
		return;
	while (fgets(line, sizeof(line), f)) {
		sscanf(line, "VmRSS: %ld kB", rss_kb);
		sscanf(line, "Threads: %ld", threads);
	}
	fclose(f);
}

/* Open descriptors of process @pid; -1 where unknown. */
static long proc_fds(pid_t pid)
{
	char path[64];
	struct dirent *e;
	long n = 0;
	DIR *d;

	snprintf(path, sizeof(path), "/proc/%ld/fd", (long)pid);
	d = opendir(path);
	if (!d)
		return -1;
	while ((e = readdir(d)))
		n += e->d_name[0] != '.';
	closedir(d);
	return n;
}

/*
 * --sample: what the running initial peers hold at round @round (the
 * soak's question: do memory, descriptors or threads grow with the rounds
 * a process has run?). One line each on stdout.
 */
static void fsample(const struct fcoord *fc, int64_t round)
{
	for (int k = 0; k < fc->n; k++) {
		const struct fpeer *fp = &fc->p[k];
		long rss, threads, fds;

		if (fp->s.role != ROLE_INITIAL || !fpeer_running(fp))
			continue;
		proc_status(fp->pid, &rss, &threads);
		fds = proc_fds(fp->pid);
		if (rss < 0 || fds < 0)
			continue; /* it just died */
		printf("# sample round %lld: peer %d (pid %ld): rss_kb %ld fds %ld threads %ld\n",
		       (long long)round, fp->s.idx, (long)fp->pid, rss, fds, threads);
	}
	fflush(stdout);
}

/* --standby: the oldest standby not woken yet (its MSG_GO waits in its pipe
 * if it is still in mp_init), or NULL. */
static struct fpeer *fstandby(struct fcoord *fc)
{
	for (int k = 0; k < fc->n; k++) {
		struct fpeer *fp = &fc->p[k];

		if (fp->s.standby && !fp->woken && fpeer_running(fp) && fp->down_fd >= 0)
			return fp;
	}
	return NULL;
}

/* A peer's pipe closed before MSG_DONE: a planned death is a loss, anything
 * else a failure. 0 or -1. */
static int fpeer_gone(struct fcoord *fc, struct fpeer *fp)
{
	const struct bench *b = fc->b;
	char name[160], how[96];
	int status = 0;

	fpeer_name(fp, name, sizeof(name));
	if (!freap(fp, 5000, &status)) {
		fprintf(stderr, PROG ": %s closed its pipe without finishing\n", name);
		return -1;
	}
	if (!(fp->s.kill && WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)) {
		describe_status(status, how, sizeof(how));
		fprintf(stderr, PROG ": %s %s without finishing the benchmark\n", name, how);
		return -1;
	}
	fp->lost = 1;
	if (fp->last_round < 0)
		fprintf(stderr, PROG ": %s died as planned (%s) before finishing a round\n", name,
			fp->s.fault);
	else
		fprintf(stderr, PROG ": %s died as planned (%s) after round %lld\n", name,
			fp->s.fault, (long long)fp->last_round);
	/* A replacement for every death of the churn rounds: the rounds
	 * after them (2d + 2) are enough to average it in, and a full grid
	 * gives the exact mean. */
	if (b->churn > 0 && b->join > 0 && fround(fc) < b->churn_end) {
		int64_t from = fround(fc) + 1;
		struct fpeer *sb = fstandby(fc);

		if (sb) {
			/* Woken, it joins at once: its process, DHT node and
			 * welcome are done. Another takes its place. */
			if (fd_send_msg(sb->down_fd, MSG_GO, -1, NULL, 0, 1000)) {
				fprintf(stderr, PROG ": cannot wake standby %d\n", sb->s.idx);
				return -1;
			}
			sb->woken = 1;
			fpeer_name(sb, name, sizeof(name));
			fprintf(stderr, PROG ": %s woken\n", name);
			return fspawn(fc, ROLE_REPLACEMENT, 0, fboot(fc), 0, 0, 1);
		}
		if (fspawn(fc, ROLE_REPLACEMENT, 0, fboot(fc), 0, from, 0))
			return -1;
		fpeer_name(&fc->p[fc->n - 1], name, sizeof(name));
		fprintf(stderr, PROG ": %s started\n", name);
	}
	return 0;
}

/* One message of peer @fp. 0, or -1 after a message (the run fails). */
static int fhandle(struct fcoord *fc, struct fpeer *fp, struct msg *m)
{
	const struct bench *b = fc->b;
	size_t vbytes = (size_t)(b->sizes[0] / 4) * sizeof(float);
	char name[160];

	fp->seen = (int64_t)mp_now_ms();
	fpeer_name(fp, name, sizeof(name));
	switch (m->type) {
	case MSG_ADDR:
		if (fp->have_addr || !m->data || m->len >= MP_ADDR_STRLEN)
			break;
		memcpy(fp->addr, m->data, m->len + 1);
		fp->have_addr = 1;
		return 0;
	case MSG_HELLO: {
		struct hello h;

		if (!msg_copy(m, &h, sizeof(h)))
			break;
		h.dht[sizeof(h.dht) - 1] = '\0';
		fp->id = h.id;
		memcpy(fp->dht, h.dht, sizeof(fp->dht));
		h.detail[sizeof(h.detail) - 1] = '\0';
		if (h.detail_known && !fc->tdetail_known) {
			memcpy(fc->tdetail, h.detail, sizeof(fc->tdetail));
			fc->tdetail_known = 1;
		}
		fp->hello = 1;
		return 0;
	}
	case MSG_ROUND: {
		struct round_report rr;

		if (!msg_copy(m, &rr, sizeof(rr)))
			break;
		fp->last_round = rr.round;
		fp->grouped += rr.grouped != 0;
		return 0;
	}
	case MSG_VECTOR:
		if (m->len != vbytes || fp->vec)
			break;
		fp->vec = xmalloc(vbytes);
		memcpy(fp->vec, m->data, vbytes);
		return 0;
	case MSG_RESULT:
		if (!msg_copy(m, &fp->res, sizeof(fp->res)))
			break;
		fp->have_res = 1;
		return 0;
	case MSG_SUMMARY:
		if (!msg_copy(m, &fp->sum, sizeof(fp->sum)))
			break;
		fp->have_sum = 1;
		/* The soak's other question: does a long-lived peer hold state
		 * for the peers that left? */
		if (fc->b->sample && fp->s.role == ROLE_INITIAL)
			printf("# state peer %d (pid %ld): peers known %llu, held %llu\n", fp->s.idx,
			       (long)fp->pid, (unsigned long long)fp->sum.peers_known,
			       (unsigned long long)fp->sum.peers_held);
		return 0;
	case MSG_HEARTBEAT:
		return 0;
	case MSG_DONE:
		fp->done = 1;
		return 0;
	case MSG_ERROR:
		fprintf(stderr, PROG ": %s: %s\n", name, m->data ? m->data : "failed");
		return -1;
	case MSG_EOF:
		return fp->done ? 0 : fpeer_gone(fc, fp);
	default:
		break;
	}
	fprintf(stderr, PROG ": %s sent a malformed or unexpected message %u\n", name, m->type);
	return -1;
}

/* Static runs: once every peer's address is in, send them the list. */
static int fsend_peers(struct fcoord *fc)
{
	const struct bench *b = fc->b;
	char *list = xmalloc((size_t)b->npeers * MP_ADDR_STRLEN + 1);
	size_t len = 0;
	int rc = 0;

	for (int k = 0; k < b->npeers; k++)
		len += (size_t)sprintf(list + len, "%s%s", k ? "\n" : "", fc->p[k].addr);
	for (int k = 0; k < b->npeers && rc == 0; k++) {
		rc = fd_send_msg(fc->p[k].down_fd, MSG_PEERS, -1, list, (uint32_t)len,
				 b->silence_ms);
		if (rc)
			fprintf(stderr, PROG ": cannot send the peer list to peer %d: %s\n", k,
				strerror(-rc));
	}
	free(list);
	return rc ? -1 : 0;
}

/*
 * Start the peers and follow the run until every peer finished or died.
 * 0, or -1 after a message.
 */
static int fdrive(struct fcoord *fc)
{
	const struct bench *b = fc->b;
	int N = b->npeers, sent_peers = 0, late_done = 0, intruders_done = 0, standby_done = 0;

	if (b->dht) {
		int port = free_udp_port(), status;
		int64_t deadline;

		if (port <= 0) {
			fprintf(stderr, PROG ": no free UDP port for the first DHT node\n");
			return -1;
		}
		snprintf(fc->boot, sizeof(fc->boot), "127.0.0.1:%d", port);
		if (fspawn(fc, ROLE_INITIAL, N, NULL, port, 0, 0))
			return -1;
		/* The others bootstrap from peer 0's node: wait until it is up
		 * (bounded; they retry bootstrapping anyway). */
		deadline = (int64_t)mp_now_ms() + 5000;
		while (!udp_port_bound(port) && (int64_t)mp_now_ms() < deadline) {
			if (freap(&fc->p[0], 0, &status)) {
				fprintf(stderr, PROG ": peer 0 exited before its DHT node was up\n");
				return -1;
			}
			usleep(10000);
		}
		for (int k = 1; k < N; k++)
			if (fspawn(fc, ROLE_INITIAL, N, fc->boot, 0, 0, 0))
				return -1;
	} else {
		for (int k = 0; k < N; k++)
			if (fspawn(fc, ROLE_INITIAL, N, NULL, 0, 0, 0))
				return -1;
	}

	for (;;) {
		struct msg m = { 0 };
		int got = frecv(fc, &m, 200), running = 0, initial_running = 0, started = 1,
		    past1 = 1, any_done = 0;
		int64_t t = (int64_t)mp_now_ms();

		if (got < 0) {
			fprintf(stderr, PROG ": waiting for peers: %s\n", strerror(-got));
			return -1;
		}
		if (got > 0) {
			int rc = fhandle(fc, &fc->p[m.rank], &m);

			free(m.data);
			if (rc)
				return -1;
		}
		for (int k = 0; k < fc->n; k++) {
			struct fpeer *fp = &fc->p[k];

			if (fp->s.role == ROLE_INITIAL && !fp->lost && !fp->hello)
				started = 0;
			if (fp->s.role == ROLE_INITIAL && fpeer_running(fp)) {
				initial_running++;
				if (fp->last_round < 1)
					past1 = 0;
			}
			if (fp->done && fp->s.role != ROLE_INTRUDER)
				any_done = 1;
			if (!fpeer_running(fp))
				continue;
			running++;
			if (t - fp->seen > b->silence_ms) {
				char name[160];

				fpeer_name(fp, name, sizeof(name));
				fprintf(stderr, PROG ": %s has been silent for %d s; giving up\n", name,
					(int)((t - fp->seen) / 1000));
				return -1;
			}
		}
		if (!running)
			return 0;
		/* Not once the last round is done: the peers are finishing. */
		if (b->sample && fround(fc) >= fc->next_sample &&
		    fround(fc) < (int64_t)b->total_rounds - 1) {
			fsample(fc, fround(fc));
			fc->next_sample = (fround(fc) / b->sample + 1) * b->sample;
		}
		if (!b->dht && !sent_peers) {
			int have = 0;

			for (int k = 0; k < N; k++)
				have += fc->p[k].have_addr;
			if (have == N) {
				if (fsend_peers(fc))
					return -1;
				sent_peers = 1;
			}
		}
		if (started && !standby_done) {
			/* Ahead of the first death, from the running peers. */
			for (int k = 0; k < b->standby; k++)
				if (fspawn(fc, ROLE_REPLACEMENT, 0, fboot(fc), 0, 0, 1))
					return -1;
			standby_done = 1;
		}
		if (started && !intruders_done) {
			for (int k = 0; k < b->intruders; k++)
				if (fspawn(fc, ROLE_INTRUDER, 0, fboot(fc), 0, 0, 0))
					return -1;
			intruders_done = 1;
		}
		if (started && past1 && initial_running && !late_done) {
			for (int k = 0; k < b->late; k++)
				if (fspawn(fc, ROLE_LATE, 0, fboot(fc), 0, fround(fc) + 1, 0))
					return -1;
			late_done = 1;
		}
		/* The initial peers are through: whoever still averages would
		 * only find itself alone. */
		if (!initial_running && any_done) {
			for (int k = 0; k < fc->n; k++) {
				struct fpeer *fp = &fc->p[k];

				if (fpeer_running(fp) && !fp->stopped && fp->down_fd >= 0) {
					fd_send_msg(fp->down_fd, MSG_STOP, -1, NULL, 0, 1000);
					fp->stopped = 1;
				}
			}
		}
	}
}

/* Remove the logs (and our temporary directory) of a run that passed. */
static void fclean_logs(struct fcoord *fc)
{
	for (int k = 0; k < fc->n; k++)
		unlink(fc->p[k].s.log);
	if (fc->own_logdir)
		rmdir(fc->logdir);
}

/* Parts a peer reduced, from its contribution log (0 when there is none). */
static int count_reduces(const char *path)
{
	char line[256];
	int n = 0, start = 1;
	FILE *f = fopen(path, "r");

	if (!f)
		return 0;
	/* Lines are long; only their starts matter. */
	while (fgets(line, sizeof(line), f)) {
		n += start && strncmp(line, "reduce ", 7) == 0;
		start = line[strlen(line) - 1] == '\n';
	}
	fclose(f);
	return n;
}

/*
 * The row of a followed run: times, bytes and rounds of the survivors'
 * reports; losses and joins; consensus (rms_err) and the checks. Returns
 * the number of things that failed beyond wrong values (a late peer that
 * never averaged, an intruder let in).
 */
static int fevaluate(struct fcoord *fc, struct agg *a, struct size_result *row)
{
	const struct bench *b = fc->b;
	size_t count = (size_t)(b->sizes[0] / 4);
	struct replay *rp = NULL;
	int nsurv = 0, fails = 0, first = 1, idle = 0;
	float **vecs = xcalloc((size_t)fc->n, sizeof(*vecs));
	int nvec = 0;

	memset(row, 0, sizeof(*row));
	row->max_err = -1.0;
	row->rms_err = -1.0;
	row->wrong = -1;
	row->time_us = 0.0;
	row->time_min_us = INFINITY;
	for (int k = 0; k < fc->n; k++) {
		const struct fpeer *fp = &fc->p[k];

		/* A standby never woken was never a member: nothing to count. */
		if (fp->s.role == ROLE_INTRUDER || (fp->s.standby && !fp->woken))
			continue;
		if (fp->lost)
			row->lost++;
		if ((fp->s.role == ROLE_LATE || fp->s.role == ROLE_REPLACEMENT) && fp->grouped)
			row->joined++;
		row->woken += fp->woken;
		if (fp->s.mode == MP_MODE_CLIENT)
			row->client_reduces += count_reduces(fp->s.log);
		if (!fp->done || !fp->have_res)
			continue;
		nsurv++;
		if (fp->res.time_us > row->time_us)
			row->time_us = fp->res.time_us;
		if (fp->res.time_us < row->time_min_us)
			row->time_min_us = fp->res.time_us;
		row->bytes_sent += fp->res.bytes_sent;
		row->bytes_received += fp->res.bytes_received;
		row->values_sent += fp->res.values_sent;
		row->codec = fp->res.codec;
		if (fp->res.failed_peers > row->failed_peers)
			row->failed_peers = fp->res.failed_peers;
		if (first || fp->res.rounds < row->rounds)
			row->rounds = fp->res.rounds;
		if (first || fp->res.peers < row->peers)
			row->peers = fp->res.peers;
		first = 0;
		/* An aux peer holds the run's values like anyone. A
		 * replacement that never got into a group started after the
		 * run's last round (rounds can take milliseconds, a new process
		 * a few hundred): it never became a member of the run. */
		if (fp->s.role == ROLE_REPLACEMENT && !fp->grouped) {
			idle++;
			continue;
		}
		if (fp->vec)
			vecs[nvec++] = fp->vec;
	}
	a->nrep = nsurv;
	if (idle)
		fprintf(stderr, PROG ": %d replacement(s) took part in no round (the run ended "
			"first): left out of rms_err\n", idle);

	if (b->check && nvec > 0) {
		/* Consensus: every survivor against the survivors' mean. */
		double sumsq = 0.0;

		for (size_t i = 0; i < count; i++) {
			double mean = 0.0;

			for (int v = 0; v < nvec; v++)
				mean += vecs[v][i];
			mean /= nvec;
			for (int v = 0; v < nvec; v++)
				sumsq += (vecs[v][i] - mean) * (vecs[v][i] - mean);
		}
		row->rms_err = sqrt(sumsq / ((double)count * nvec));
	}

	if (b->check) {
		float *x0 = xmalloc(count * sizeof(float));
		int rc;

		rp = replay_new(count);
		if (!rp)
			die_oom();
		for (int k = 0; k < fc->n; k++) {
			const struct fpeer *fp = &fc->p[k];

			/* Intruders are strangers to the replay: anything they
			 * got into a group would come out unknown, hence wrong. */
			if (fp->s.role == ROLE_INTRUDER)
				continue;
			follow_fill(b, &fp->s, x0, count);
			rc = replay_add_peer(rp, fp->id, x0);
			if (rc == 0)
				rc = replay_add_log_file(rp, fp->id, fp->s.log);
			if (rc) {
				fprintf(stderr, PROG ": %016llx: cannot replay %s: %s\n",
					(unsigned long long)fp->id, fp->s.log, strerror(-rc));
				fails++;
			}
		}
		free(x0);
		if (replay_run(rp))
			die_oom();
		a->replay_problems = replay_problems(rp);
		if (a->replay_problems)
			fprintf(stderr, PROG ": %" PRId64 " inconsistencies in the contribution logs; "
				"first: %s\n", a->replay_problems, replay_first_problem(rp));
		row->wrong = 0;
		row->max_err = 0.0;
		for (int k = 0; k < fc->n; k++) {
			const struct fpeer *fp = &fc->p[k];
			struct replay_cmp cmp;

			if (fp->s.role == ROLE_INTRUDER || !fp->vec)
				continue;
			replay_compare(rp, fp->id, fp->vec, replay_rtol(b), replay_atol(b), &cmp);
			if (cmp.wrong) {
				char name[160];

				fpeer_name(fp, name, sizeof(name));
				fprintf(stderr, PROG ": %s: %" PRId64 " value(s) differ from the replay "
					"of the logs (largest by %g)\n", name, cmp.wrong, cmp.max_err);
			}
			row->wrong += cmp.wrong;
			row->checked += cmp.checked;
			if (cmp.max_err > row->max_err)
				row->max_err = cmp.max_err;
		}
	}

	/* No churn on a full grid: the exact mean of the initial peers is due. */
	if (b->check && follow_exact(b)) {
		double *mean = xcalloc(count, sizeof(double));
		float *x0 = xmalloc(count * sizeof(float));
		double wsum = 0.0;

		for (int k = 0; k < fc->n; k++) {
			const struct fpeer *fp = &fc->p[k];
			/* An auxiliary peer's own values count for nothing (weight 0). */
			double w = fp->s.mode == MP_MODE_AUX ? 0.0 : peer_weight(b, fp->s.idx);

			if (fp->s.role != ROLE_INITIAL)
				continue;
			follow_fill(b, &fp->s, x0, count);
			for (size_t i = 0; i < count; i++)
				mean[i] += w * x0[i];
			wsum += w;
		}
		for (int k = 0; k < fc->n; k++) {
			const struct fpeer *fp = &fc->p[k];
			int64_t wrong = 0;

			/* Aux peers included: they hold the mean too. */
			if (fp->s.role == ROLE_INTRUDER || !fp->vec)
				continue;
			for (size_t i = 0; i < count; i++) {
				double d = fabs((double)fp->vec[i] - mean[i] / wsum);

				if (isnan(d))
					d = INFINITY;
				if (!(d <= b->tol))
					wrong++;
				if (d > row->max_err)
					row->max_err = d;
			}
			if (wrong) {
				char name[160];

				fpeer_name(fp, name, sizeof(name));
				fprintf(stderr, PROG ": %s: %" PRId64 " value(s) off the exact mean\n",
					name, wrong);
			}
			row->wrong += wrong;
		}
		free(mean);
		free(x0);
	}

	for (int role = ROLE_LATE; role <= ROLE_INTRUDER; role++) {
		int want = role == ROLE_LATE ? b->late : b->intruders, have = 0;

		for (int k = 0; k < fc->n; k++)
			have += fc->p[k].s.role == role;
		if (have < want) {
			fprintf(stderr, PROG ": %d %s(s) never started: the run ended first\n",
				want - have, role_names[role]);
			fails++;
		}
	}
	for (int k = 0; k < fc->n; k++) {
		const struct fpeer *fp = &fc->p[k];
		char name[160];

		fpeer_name(fp, name, sizeof(name));
		if (fp->s.role == ROLE_LATE && !fp->grouped && !(rp && replay_groups(rp, fp->id))) {
			fprintf(stderr, PROG ": %s never took part in a group\n", name);
			fails++;
		}
		if (fp->s.role == ROLE_INTRUDER) {
			int in = !fp->have_sum || fp->sum.grouped > 0 ||
				 (rp && replay_named_by_others(rp, fp->id));

			if (in)
				fprintf(stderr, PROG ": %s was let into a group\n", name);
			else
				a->intruders_refused++;
			fails += in;
		}
	}
	replay_free(rp);
	free(vecs);
	return fails;
}

/* Local peers followed round by round (dht rendezvous, churn, faults). */
int run_follow(struct bench *b)
{
	struct fcoord fc = { .b = b, .next_sample = b->sample };
	struct size_result row;
	struct agg a;
	char mode[96];
	int rc, fails = 0;

	/* mpbench_parse derived the grid, total_rounds and churn_end (the
	 * last rounds free of deaths) and checked them. */
	snprintf(mode, sizeof(mode), "local, %d processes, followed round by round", b->npeers);
	print_header(b, mode);
	agg_init(&a, b, b->npeers, 1);
	if (b->logdir) {
		if (strlen(b->logdir) >= sizeof(fc.logdir)) {
			fprintf(stderr, PROG ": --logs: path too long\n");
			agg_free(&a);
			return EXIT_FAIL;
		}
		if (mkdir(b->logdir, 0755) < 0 && errno != EEXIST) {
			fprintf(stderr, PROG ": cannot create %s: %s\n", b->logdir, strerror(errno));
			agg_free(&a);
			return EXIT_FAIL;
		}
		snprintf(fc.logdir, sizeof(fc.logdir), "%s", b->logdir);
	} else {
		snprintf(fc.logdir, sizeof(fc.logdir), "%s/mpbench-XXXXXX",
			 getenv("TMPDIR") && *getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
		if (!mkdtemp(fc.logdir)) {
			fprintf(stderr, PROG ": cannot create a directory for the logs: %s\n",
				strerror(errno));
			agg_free(&a);
			return EXIT_FAIL;
		}
		fc.own_logdir = 1;
	}
	fprintf(stderr, PROG ": size %" PRIu64 ", %d rounds ...\n", b->sizes[0], b->total_rounds);

	rc = fdrive(&fc);
	if (rc) {
		fkill_all(&fc);
	} else {
		/* Everyone said done or died: reap the rest. */
		for (int k = 0; k < fc.n; k++) {
			int status;

			if (fc.p[k].pid > 0 && !freap(&fc.p[k], 10000, &status)) {
				fprintf(stderr, PROG ": %s %d did not exit after finishing\n",
					role_names[fc.p[k].s.role], k);
				fkill_all(&fc);
				rc = -1;
			}
		}
		fails = fevaluate(&fc, &a, &row);
		a.rows[0] = row;
		print_row(&a, 0);
		a.next = 1;
	}
	memcpy(a.tdetail, fc.tdetail, sizeof(a.tdetail));
	a.tdetail_known = fc.tdetail_known;
	rc = report_finish(&a, "local-processes-followed", 0, rc != 0);
	if (fails)
		rc = EXIT_FAIL;
	if (rc == EXIT_OK && !b->logdir)
		fclean_logs(&fc);
	else if (rc != EXIT_OK || b->logdir)
		fprintf(stderr, PROG ": contribution logs are in %s\n", fc.logdir);
	for (int k = 0; k < fc.n; k++) {
		if (fc.p[k].up_fd >= 0)
			close(fc.p[k].up_fd);
		if (fc.p[k].down_fd >= 0)
			close(fc.p[k].down_fd);
		free(fc.p[k].vec);
	}
	free(fc.p);
	agg_free(&a);
	return rc;
}
