/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Launching mpbench's peers: local peers as child processes or threads,
 * driven by a coordinator that relays their addresses, collects their
 * results and notices when one dies or falls silent; or this process as one
 * peer of a multi-host run (hostfile, mpirun, PMI, srun, or the DHT).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#include "mpbench.h"

/* ------------------------------------------------------------------------ */
/* Coordinator of local peers                                                */

struct coord {
	int n;
	struct mq *upq;    /* threads: one queue shared by all peers */
	int *up_fd;        /* processes: one pipe per peer, -1 once closed */
	struct chan *down; /* per peer */
	pid_t *pid;        /* processes; 0 once reaped */
	int rr;
};

/* 1 with a message (MSG_EOF when a pipe closed), 0 on timeout, < 0 on error. */
static int coord_recv(struct coord *c, struct msg *m, int timeout_ms)
{
	struct pollfd *pfd;
	int *who, np = 0, rc;

	if (c->upq)
		return mq_get(c->upq, m, timeout_ms);
	pfd = xcalloc((size_t)c->n, sizeof(*pfd));
	who = xcalloc((size_t)c->n, sizeof(*who));
	for (int k = 0; k < c->n; k++) {
		int r = (c->rr + k) % c->n;

		if (c->up_fd[r] < 0)
			continue;
		pfd[np].fd = c->up_fd[r];
		pfd[np].events = POLLIN;
		who[np++] = r;
	}
	rc = poll(pfd, (nfds_t)np, np ? timeout_ms : 0);
	if (rc <= 0) {
		rc = rc < 0 && errno != EINTR ? -errno : 0;
		goto out;
	}
	for (int k = 0; k < np; k++) {
		int r = who[k];

		if (!pfd[k].revents)
			continue;
		c->rr = (r + 1) % c->n;
		rc = fd_recv_msg(c->up_fd[r], m, 5000);
		if (rc <= 0) {
			/* EOF or a broken pipe: the peer is gone. */
			close(c->up_fd[r]);
			c->up_fd[r] = -1;
			memset(m, 0, sizeof(*m));
			m->type = MSG_EOF;
		}
		m->rank = r;
		rc = 1;
		goto out;
	}
	rc = 0;
out:
	free(pfd);
	free(who);
	return rc;
}

void describe_status(int status, char *buf, size_t len)
{
	if (WIFEXITED(status))
		snprintf(buf, len, "exited with status %d", WEXITSTATUS(status));
	else if (WIFSIGNALED(status))
		snprintf(buf, len, "was killed by signal %d (%s)", WTERMSIG(status),
			 strsignal(WTERMSIG(status)));
	else
		snprintf(buf, len, "stopped (status 0x%x)", status);
}

static void peer_name(const struct coord *c, int r, char *buf, size_t len)
{
	if (c->pid && c->pid[r] > 0)
		snprintf(buf, len, "peer %d (pid %ld)", r, (long)c->pid[r]);
	else
		snprintf(buf, len, "peer %d", r);
}

/* Kill and reap every child still around. */
static void coord_kill_all(struct coord *c)
{
	int64_t deadline;

	if (!c->pid)
		return;
	for (int r = 0; r < c->n; r++)
		if (c->pid[r] > 0)
			kill(c->pid[r], SIGKILL);
	deadline = (int64_t)mp_now_ms() + 5000;
	for (int r = 0; r < c->n; r++) {
		while (c->pid[r] > 0) {
			pid_t w = waitpid(c->pid[r], NULL, WNOHANG);

			if (w == c->pid[r] || (w < 0 && errno != EINTR) || (int64_t)mp_now_ms() > deadline) {
				c->pid[r] = 0;
				break;
			}
			usleep(2000);
		}
	}
}

/* A peer's pipe closed before it said it was done: say how it ended. */
static void report_eof(struct coord *c, int r)
{
	char name[64], how[96];
	int status = 0;
	int64_t deadline = (int64_t)mp_now_ms() + 2000;
	pid_t w = 0;

	peer_name(c, r, name, sizeof(name));
	while (c->pid && c->pid[r] > 0) {
		w = waitpid(c->pid[r], &status, WNOHANG);
		if (w != 0 || (int64_t)mp_now_ms() > deadline)
			break;
		usleep(2000);
	}
	if (w > 0) {
		describe_status(status, how, sizeof(how));
		c->pid[r] = 0;
		fprintf(stderr, PROG ": %s %s without finishing the benchmark\n", name, how);
	} else {
		fprintf(stderr, PROG ": %s closed its pipe without finishing the benchmark\n",
			name);
	}
}

/*
 * Drive the local peers: relay addresses, collect results into @a, wait for
 * everyone to finish. 0, or -1 after a clear message on stderr.
 */
static int coordinate(const struct bench *b, struct coord *c, struct agg *a)
{
	int n = c->n;
	char (*addrs)[MP_ADDR_STRLEN] = xcalloc((size_t)n, sizeof(*addrs));
	int64_t *seen = xcalloc((size_t)n, sizeof(*seen));
	char *done = xcalloc((size_t)n, 1);
	char *have_addr = xcalloc((size_t)n, 1);
	int naddr = 0, ndone = 0, sent_peers = 0, rc = -1;
	char name[64];

	for (int r = 0; r < n; r++)
		seen[r] = (int64_t)mp_now_ms();
	while (ndone < n) {
		struct msg m = { 0 };
		int got = coord_recv(c, &m, 1000);
		int64_t t = (int64_t)mp_now_ms();

		if (got < 0) {
			fprintf(stderr, PROG ": waiting for peers: %s\n", strerror(-got));
			goto out;
		}
		if (got > 0 && (m.rank < 0 || m.rank >= n)) {
			fprintf(stderr, PROG ": message from unknown peer %d\n", m.rank);
			free(m.data);
			goto out;
		}
		if (got > 0) {
			int r = m.rank;

			seen[r] = t;
			peer_name(c, r, name, sizeof(name));
			switch (m.type) {
			case MSG_ADDR:
				if (have_addr[r] || !m.data || m.len >= MP_ADDR_STRLEN) {
					fprintf(stderr, PROG ": %s sent a bad address\n", name);
					free(m.data);
					goto out;
				}
				memcpy(addrs[r], m.data, m.len + 1);
				have_addr[r] = 1;
				naddr++;
				break;
			case MSG_RESULT: {
				struct size_result sr;

				if (!msg_copy(&m, &sr, sizeof(sr))) {
					fprintf(stderr, PROG ": %s sent a malformed result\n", name);
					free(m.data);
					goto out;
				}
				agg_add(a, &sr);
				break;
			}
			case MSG_HEARTBEAT:
				break;
			case MSG_DETAIL:
				if (m.len >= sizeof(a->tdetail)) {
					fprintf(stderr, PROG ": %s sent a bad transport detail\n", name);
					free(m.data);
					goto out;
				}
				if (m.len)
					memcpy(a->tdetail, m.data, m.len);
				a->tdetail[m.len] = '\0';
				a->tdetail_known = 1;
				break;
			case MSG_PEER_STATS:
				if (m.len % sizeof(struct mp_peer_info)) {
					fprintf(stderr, PROG ": %s sent a malformed peer table\n", name);
					free(m.data);
					goto out;
				}
				agg_peer_stats(a, r, (const struct mp_peer_info *)(void *)m.data,
					       (int)(m.len / sizeof(struct mp_peer_info)));
				break;
			case MSG_ERROR:
				fprintf(stderr, PROG ": %s: %s\n", name, m.data ? m.data : "failed");
				free(m.data);
				goto out;
			case MSG_DONE:
				done[r] = 1;
				ndone++;
				break;
			case MSG_EOF:
				if (done[r])
					break; /* exited after saying it is done */
				report_eof(c, r);
				goto out;
			default:
				fprintf(stderr, PROG ": %s sent unknown message %u\n", name, m.type);
				free(m.data);
				goto out;
			}
			free(m.data);
		}
		if (naddr == n && !sent_peers) {
			size_t len = 0;
			char *list = xmalloc((size_t)n * MP_ADDR_STRLEN + 1);

			for (int r = 0; r < n; r++)
				len += (size_t)sprintf(list + len, "%s%s", r ? "\n" : "", addrs[r]);
			for (int r = 0; r < n; r++) {
				int e = chan_send(&c->down[r], MSG_PEERS, -1, list, (uint32_t)len,
						  b->silence_ms);

				if (e) {
					peer_name(c, r, name, sizeof(name));
					fprintf(stderr, PROG ": cannot send the peer list to %s: %s\n",
						name, strerror(-e));
					free(list);
					goto out;
				}
			}
			free(list);
			sent_peers = 1;
		}
		for (int r = 0; r < n; r++) {
			if (done[r] || t - seen[r] <= b->silence_ms)
				continue;
			peer_name(c, r, name, sizeof(name));
			fprintf(stderr, PROG ": %s has been silent for %d s (%s); giving up\n", name,
				(int)((t - seen[r]) / 1000),
				have_addr[r] ? "stuck in the benchmark" : "stuck in mp_init");
			goto out;
		}
	}
	rc = 0;
out:
	free(addrs);
	free(seen);
	free(done);
	free(have_addr);
	return rc;
}

/* Reap children that said they are done; 0 if all exited cleanly. */
static int reap_children(const struct bench *b, struct coord *c)
{
	int64_t deadline = (int64_t)mp_now_ms() + 10000 + (b->cfg.connect_timeout_ms > 0 ?
					     b->cfg.connect_timeout_ms : 10000);
	int rc = 0;

	for (int r = 0; r < c->n; r++) {
		char name[64], how[96];
		int status = 0;

		peer_name(c, r, name, sizeof(name));
		while (c->pid[r] > 0) {
			pid_t w = waitpid(c->pid[r], &status, WNOHANG);

			if (w == c->pid[r]) {
				c->pid[r] = 0;
				if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
					describe_status(status, how, sizeof(how));
					fprintf(stderr, PROG ": %s %s after finishing\n", name, how);
					rc = -1;
				}
				break;
			}
			if (w < 0 && errno != EINTR) {
				c->pid[r] = 0;
				break;
			}
			if ((int64_t)mp_now_ms() > deadline) {
				fprintf(stderr, PROG ": %s did not exit after finishing; killing it\n",
					name);
				rc = -1;
				coord_kill_all(c);
				break;
			}
			usleep(2000);
		}
	}
	return rc;
}

/*
 * Fork a peer process joined to this one by a pipe each way; @what names it
 * in the message when that fails. In the parent: the child's pid, with
 * @fds[0] reading what the child sends up and @fds[1] (non-blocking)
 * writing down to it. In the child, which dies with its parent: 0, with
 * @fds[0] (non-blocking) writing up and @fds[1] reading down; it must close
 * what the parent holds for other peers, then _exit. -1 after a message.
 */
pid_t fork_peer(const char *what, int fds[2])
{
	pid_t self = getpid(), pid;
	int up[2], down[2];

	if (pipe(up) < 0) {
		fprintf(stderr, PROG ": pipe: %s\n", strerror(errno));
		return -1;
	}
	if (pipe(down) < 0) {
		fprintf(stderr, PROG ": pipe: %s\n", strerror(errno));
		close(up[0]);
		close(up[1]);
		return -1;
	}
	fflush(NULL);
	pid = fork();
	if (pid < 0) {
		fprintf(stderr, PROG ": cannot start %s: fork: %s\n", what, strerror(errno));
		close(up[0]);
		close(up[1]);
		close(down[0]);
		close(down[1]);
		return -1;
	}
	if (pid == 0) {
#ifdef __linux__
		prctl(PR_SET_PDEATHSIG, SIGKILL);
#endif
		if (getppid() != self)
			_exit(EXIT_FAIL);
		close(up[0]);
		close(down[1]);
		set_nonblock(up[1]);
		fds[0] = up[1];
		fds[1] = down[0];
		return 0;
	}
	close(up[1]);
	close(down[0]);
	set_nonblock(down[1]);
	fds[0] = up[0];
	fds[1] = down[1];
	return pid;
}

static int run_local_procs(const struct bench *b, struct agg *a)
{
	int n = b->npeers;
	struct coord c = { .n = n };
	int rc;

	c.up_fd = xcalloc((size_t)n, sizeof(int));
	c.down = xcalloc((size_t)n, sizeof(struct chan));
	c.pid = xcalloc((size_t)n, sizeof(pid_t));
	for (int r = 0; r < n; r++) {
		c.up_fd[r] = -1;
		c.down[r].fd = -1;
	}
	for (int k = 0; k < n; k++) {
		char what[32];
		int fds[2];
		pid_t pid;

		snprintf(what, sizeof(what), "peer %d", k);
		pid = fork_peer(what, fds);
		if (pid < 0)
			goto fail;
		if (pid == 0) {
			struct chan cu = { .fd = fds[0] }, cd = { .fd = fds[1] };

			for (int j = 0; j < k; j++) {
				close(c.up_fd[j]);
				close(c.down[j].fd);
			}
			_exit(peer_main(b, k, &cu, &cd) ? EXIT_FAIL : EXIT_OK);
		}
		c.up_fd[k] = fds[0];
		c.down[k].fd = fds[1];
		c.pid[k] = pid;
	}
	rc = coordinate(b, &c, a);
	if (rc == 0)
		rc = reap_children(b, &c);
	else
		coord_kill_all(&c);
	goto out;
fail:
	coord_kill_all(&c);
	rc = -1;
out:
	for (int r = 0; r < n; r++) {
		if (c.up_fd[r] >= 0)
			close(c.up_fd[r]);
		if (c.down[r].fd >= 0)
			close(c.down[r].fd);
	}
	free(c.up_fd);
	free(c.down);
	free(c.pid);
	return rc;
}

struct loop_arg {
	const struct bench *b;
	int rank;
	struct chan up, down;
};

static void *loop_thread(void *arg)
{
	struct loop_arg *la = arg;

	/* On failure peer_main has sent MSG_ERROR, which stops the coordinator. */
	peer_main(la->b, la->rank, &la->up, &la->down);
	return NULL;
}

/* Peers as threads of this process. On failure the caller exits at once
 * (threads may still be inside the library). */
static int run_local_threads(const struct bench *b, struct agg *a)
{
	int n = b->npeers;
	struct mq upq;
	struct mq *downq = xcalloc((size_t)n, sizeof(*downq));
	struct chan *down = xcalloc((size_t)n, sizeof(*down));
	struct loop_arg *la = xcalloc((size_t)n, sizeof(*la));
	pthread_t *th = xcalloc((size_t)n, sizeof(*th));
	struct coord c = { .n = n, .upq = &upq, .down = down };
	int rc;

	if (mq_init(&upq)) {
		fprintf(stderr, PROG ": cannot create a message queue\n");
		return -1;
	}
	for (int r = 0; r < n; r++) {
		if (mq_init(&downq[r])) {
			fprintf(stderr, PROG ": cannot create a message queue\n");
			return -1;
		}
		down[r].fd = -1;
		down[r].q = &downq[r];
		la[r].b = b;
		la[r].rank = r;
		la[r].up.fd = -1;
		la[r].up.q = &upq;
		la[r].down = down[r];
	}
	for (int r = 0; r < n; r++) {
		int e = pthread_create(&th[r], NULL, loop_thread, &la[r]);

		if (e) {
			fprintf(stderr, PROG ": cannot start peer %d: pthread_create: %s\n", r,
				strerror(e));
			return -1;
		}
	}
	rc = coordinate(b, &c, a);
	if (rc)
		return rc;
	for (int r = 0; r < n; r++) {
		struct timespec dl;
		int e;

		clock_gettime(CLOCK_REALTIME, &dl);
		dl.tv_sec += 10;
		e = pthread_timedjoin_np(th[r], NULL, &dl);
		if (e) {
			fprintf(stderr, PROG ": peer %d did not finish: %s\n", r, strerror(e));
			return -1;
		}
	}
	free(downq);
	free(down);
	free(la);
	free(th);
	return 0;
}

/* ------------------------------------------------------------------------ */
/* Modes                                                                     */

int run_local(struct bench *b)
{
	struct agg a;
	char mode[64];
	int rc;

	/* bench_derive ran in mpbench_parse, for b->npeers. */
	snprintf(mode, sizeof(mode), "local, %d %s", b->npeers,
		 b->loop ? "threads" : "processes");
	print_header(b, mode);
	agg_init(&a, b, b->npeers, 1);
	show_progress(&a);
	rc = b->loop ? run_local_threads(b, &a) : run_local_procs(b, &a);
	if (rc && b->loop) {
		/* Peer threads may still be inside the library. */
		fflush(NULL);
		_exit(EXIT_FAIL);
	}
	rc = report_finish(&a, b->loop ? "local-threads" : "local-processes", 0, rc != 0);
	agg_free(&a);
	return rc;
}

/*
 * How many averages one gather of the ranks' times takes (gather_times,
 * peer.c): the same on every rank, as it follows from run-shared settings
 * only (algorithm, grid, rounds, peer count). An aux rank's pair enters
 * after the first; the ring and the butterfly then spread it to everyone
 * in one more, a Moshpit grid of d dimensions in d rounds, at rounds_eff
 * rounds per average. A partial grid gets 2d: its holes can keep a rank's
 * values from others for a while (rank 0 names any rank still missing).
 */
static int gather_passes(const struct bench *b)
{
	int d = b->grid.ndims > 0 ? b->grid.ndims : 1;
	int R = b->rounds_eff > 0 ? b->rounds_eff : 1;

	if (b->cfg.algo != MP_ALGO_MOSHPIT)
		return 2;
	if (b->grid.cells != (uint64_t)b->npeers)
		d *= 2;
	return 1 + (d + R - 1) / R;
}

int run_multi(struct bench *b, const char *how)
{
	struct mp_config cfg = b->cfg;
	struct peer p = { .b = b };
	struct agg a;
	char mode[256];
	int rc;

	if (b->run)
		cfg.run_name = b->run;
	cfg.transport = b->transport;
	if (b->dht) {
		/* Ranks only number the data and weights; ids follow from them. */
		cfg.rendezvous = "dht";
		cfg.peer_id = peer_id_of(b->seed, cfg.rank);
		p.rank = cfg.rank;
		p.npeers = cfg.npeers;
		cfg.rank = -1;
	}
	rc = mp_init(&cfg, &p.ctx);
	if (rc) {
		if (cfg.rank >= 0)
			fprintf(stderr, PROG ": rank %d: mp_init: %s: %s\n", cfg.rank,
				mp_strerror(rc), mp_last_error(NULL));
		else
			fprintf(stderr, PROG ": mp_init: %s: %s\n", mp_strerror(rc),
				mp_last_error(NULL));
		return EXIT_FAIL;
	}
	if (b->dht) {
		char dht[MP_ADDR_STRLEN];

		if (mp_dht_address(p.ctx, dht, sizeof(dht)) == 0)
			fprintf(stderr, PROG ": rank %d: DHT node at %s\n", p.rank, dht);
	} else {
		p.rank = mp_rank(p.ctx);
		p.npeers = mp_npeers(p.ctx);
	}
	/* The one check of the options that waits for the run: the grid's
	 * cells against the peer count mp_init found. */
	{
		size_t errlen = 256 + (b->cfg.grid ? strlen(b->cfg.grid) : 0);
		char *err = xmalloc(errlen);

		if (bench_derive(b, p.npeers, err, errlen))
			usage_error("%s", err);
		free(err);
	}
	if (b->dead) {
		const char *s = b->dead;

		b->dead_mask = xcalloc((size_t)p.npeers, 1);
		for (;;) {
			char *end;
			long v = strtol(s, &end, 10);

			if (v >= p.npeers || v == p.rank) {
				fprintf(stderr, PROG ": rank %d: --dead=%s: rank %ld %s\n", p.rank, b->dead,
					v, v == p.rank ? "is this process" : "is not a rank of this run");
				free(b->dead_mask);
				b->dead_mask = NULL;
				mp_finalize(p.ctx);
				return 2;
			}
			b->dead_mask[v] = 1;
			if (!*end)
				break;
			s = end + 1;
		}
	}
	b->time_gathered = p.npeers > 1;
	b->gather_passes = gather_passes(b);
	snprintf(mode, sizeof(mode), "multi-host (%s), rank %d of %d; errors are this rank's own",
		 how, p.rank, p.npeers);
	agg_init(&a, b, 1, p.rank == 0);
	a.tdetail_known = mp_transport_detail(p.ctx, a.tdetail, sizeof(a.tdetail)) >= 0;
	p.agg = &a;
	if (a.print) {
		print_header(b, mode);
		show_progress(&a);
	}
	rc = peer_bench(&p);
	mp_finalize(p.ctx);
	rc = report_finish(&a, "multi-host", p.rank, rc != 0);
	agg_free(&a);
	free(b->dead_mask);
	b->dead_mask = NULL;
	return rc;
}
