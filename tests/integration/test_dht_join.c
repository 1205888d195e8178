/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The dht rendezvous' join, with real processes over TCP on loopback and
 * the public API only, configured from the environment as the README's
 * example is: MP_NPEERS=N makes mp_init wait for N authenticated peers, and
 * mp_rank and mp_npeers are then distinct ranks 0..N-1 and N; the README's
 * computation (each peer averages rank + 1) gives exactly 2.5 on 4 peers; a
 * stranger with another run key neither counts nor holds the honest peers
 * up, and its own mp_init fails naming the records it refused; a join that
 * times out says how many peers it saw and that nothing was refused.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <moshpit/moshpit.h>
#include "proc_io.h"

#define MAXP 8
#define COUNT 1024

/* What a child reports over its pipe. */
struct report {
	int init_rc, avg_rc, rank, npeers;
	float x0, xmin, xmax;
	double join_s;           /* mp_init's duration */
	int gone;                /* peers mp_peers_info shows gone after the average */
	double avg_s;            /* the last mp_average's duration */
	int grouped;             /* ... and whether it averaged in a group */
	char err[400];
};

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* A UDP port free now, for the first peer's DHT node. */
static int free_udp_port(void)
{
	struct sockaddr_in a = {.sin_family = AF_INET};
	socklen_t len = sizeof(a);
	int fd = socket(AF_INET, SOCK_DGRAM, 0), port = -1;

	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
	    getsockname(fd, (struct sockaddr *)&a, &len) == 0)
		port = ntohs(a.sin_port);
	if (fd >= 0)
		close(fd);
	return port;
}

/* Whether something listens on UDP @port (the first DHT node is up). */
static int udp_port_taken(int port)
{
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	int fd = socket(AF_INET, SOCK_DGRAM, 0), taken;

	a.sin_addr.s_addr = htonl(INADDR_ANY);
	taken = bind(fd, (struct sockaddr *)&a, sizeof(a)) != 0 && errno == EADDRINUSE;
	close(fd);
	return taken;
}

struct peer_env {
	const char *key;
	int npeers, dht_port, join_timeout_ms;
	const char *bootstrap;
	int record_ttl_ms; /* 0: the default */
	int more;          /* after the first report, average again on each 'a' from the
	                      parent (values 10 (rank + 1)) until an 'x' */
	const char *grid;  /* MP_GRID, or NULL for the default */
};

/* Every value @scale (rank + 1), averaged; what came of it into @rep. */
static void average_into(mp_ctx *ctx, float *x, float scale, struct report *rep)
{
	struct mp_result res;

	double t0 = now_s();

	for (int i = 0; i < COUNT; i++)
		x[i] = scale * (float)(mp_rank(ctx) + 1);
	rep->avg_rc = mp_average(ctx, x, COUNT, 1.0f, &res);
	rep->avg_s = now_s() - t0;
	rep->grouped = res.group_size > 1;
	rep->err[0] = '\0';
	if (rep->avg_rc)
		snprintf(rep->err, sizeof(rep->err), "%s", mp_last_error(ctx));
	rep->x0 = rep->xmin = rep->xmax = x[0];
	for (int i = 0; i < COUNT; i++) {
		rep->xmin = x[i] < rep->xmin ? x[i] : rep->xmin;
		rep->xmax = x[i] > rep->xmax ? x[i] : rep->xmax;
	}
}

/* Child: the README's program, with the environment of @e. */
static void child(const struct peer_env *e, int to_parent, int from_parent)
{
	struct report rep = {0};
	struct mp_config cfg;
	mp_ctx *ctx = NULL;
	char buf[64];
	float x[COUNT];
	double t0;

	setenv("MP_RENDEZVOUS", "dht", 1);
	setenv("MP_LISTEN", "127.0.0.1:0", 1);
	snprintf(buf, sizeof(buf), "dht-join-%d", (int)getppid());
	setenv("MP_RUN", buf, 1);
	setenv("MP_RUN_KEY", e->key, 1);
	snprintf(buf, sizeof(buf), "%d", e->npeers);
	setenv("MP_NPEERS", buf, 1);
	snprintf(buf, sizeof(buf), "%d", e->join_timeout_ms);
	setenv("MP_JOIN_TIMEOUT_MS", buf, 1);
	snprintf(buf, sizeof(buf), "%d", e->dht_port);
	setenv("MP_DHT_PORT", buf, 1);
	if (e->bootstrap)
		setenv("MP_BOOTSTRAP", e->bootstrap, 1);
	else
		unsetenv("MP_BOOTSTRAP");
	unsetenv("MP_PEERS");
	unsetenv("MP_RANK");
	if (e->grid)
		setenv("MP_GRID", e->grid, 1);
	else
		unsetenv("MP_GRID");
	/* TEST_DEBUG=TRACE shows what the peers did, timestamped. */
	setenv("MP_DEBUG", getenv("TEST_DEBUG") ? getenv("TEST_DEBUG") : "WARN", 1);
	setenv("MP_DEBUG_TIMESTAMP", "1", 1);
	if (e->record_ttl_ms) {
		snprintf(buf, sizeof(buf), "%d", e->record_ttl_ms);
		setenv("MP_RECORD_TTL_MS", buf, 1);
		/* A dead groupmate costs a round seconds, not the default 10+. */
		setenv("MP_MATCHMAKING_MS", "3000", 1);
		setenv("MP_REQUEST_TIMEOUT_MS", "1000", 1);
		setenv("MP_CONNECT_TIMEOUT_MS", "2000", 1);
		setenv("MP_CHUNK_TIMEOUT_MS", "1000", 1);
	}

	mp_config_init(&cfg);
	rep.init_rc = mp_config_from_env(&cfg);
	t0 = now_s();
	if (!rep.init_rc)
		rep.init_rc = mp_init(&cfg, &ctx);
	rep.join_s = now_s() - t0;
	if (rep.init_rc) {
		snprintf(rep.err, sizeof(rep.err), "%s", mp_last_error(NULL));
		write_all(to_parent, &rep, sizeof(rep));
		_exit(0);
	}
	rep.rank = mp_rank(ctx);
	rep.npeers = mp_npeers(ctx);
	average_into(ctx, x, 1.0f, &rep);
	write_all(to_parent, &rep, sizeof(rep));
	/* Nobody leaves before everyone has reported. */
	while (e->more && read_all(from_parent, buf, 1, 120000) == 0 && buf[0] == 'a') {
		average_into(ctx, x, 10.0f, &rep);
		struct mp_peer_info pi[64];
		int np = mp_peers_info(ctx, pi, 64, sizeof(pi[0]));

		rep.gone = 0;
		for (int i = 0; i < np && i < 64; i++)
			rep.gone += pi[i].state == MP_PEER_GONE;
		write_all(to_parent, &rep, sizeof(rep));
	}
	if (!e->more)
		read_all(from_parent, buf, 1, 60000);
	mp_finalize(ctx);
	_exit(0);
}

struct kid {
	pid_t pid;
	int up, down;
};

static void spawn(struct kid *k, const struct peer_env *e)
{
	int up[2], down[2];

	assert_int_equal(pipe(up), 0);
	assert_int_equal(pipe(down), 0);
	k->pid = fork();
	assert_true(k->pid >= 0);
	if (k->pid == 0) {
		close(up[0]);
		close(down[1]);
		child(e, up[1], down[0]);
	}
	close(up[1]);
	close(down[0]);
	k->up = up[0];
	k->down = down[1];
}

static void collect(struct kid *k, struct report *r)
{
	memset(r, 0, sizeof(*r));
	if (read_all(k->up, r, sizeof(*r), 90000)) {
		kill(k->pid, SIGKILL);
		fail_msg("a peer sent no report within 90 s");
	}
}

/* Everyone finalizes at once: mp_finalize waits up to 1 s for its bye to
 * reach the DHT (one that was left by the peers before it), and one peer at
 * a time made that seconds per test. */
static void release(struct kid *k, int n)
{
	for (int i = 0; i < n; i++) {
		write_all(k[i].down, "x", 1);
		close(k[i].down);
		close(k[i].up);
	}
	for (int i = 0; i < n; i++) {
		int st;

		waitpid(k[i].pid, &st, 0);
	}
}

/* Start the first peer and wait until its DHT node is up. */
static void spawn_first(struct kid *k, struct peer_env *e, char *boot, size_t len)
{
	int port = free_udp_port();
	double until;

	assert_true(port > 0);
	e->dht_port = port;
	e->bootstrap = NULL;
	spawn(k, e);
	until = now_s() + 10.0;
	while (!udp_port_taken(port) && now_s() < until)
		usleep(10000);
	snprintf(boot, len, "127.0.0.1:%d", port);
}

/*
 * N honest peers, and optionally a stranger with another key started among
 * them (@stranger 1) or first, so that every honest peer bootstraps from
 * its DHT node and asks it for the welcome (@stranger 2): distinct ranks
 * 0..N-1, npeers N, every value the exact mean of rank + 1, and each honest
 * join done well before its timeout.
 */
static void honest_join(int n, int stranger)
{
	struct kid k[MAXP + 1];
	struct report r[MAXP + 1];
	char key[64], boot[64];
	struct peer_env e = {.key = key, .npeers = n, .join_timeout_ms = 30000};
	struct peer_env se = {.key = "not this run's key", .npeers = n,
			      .join_timeout_ms = 3000};
	int seen[MAXP] = {0}, total = n + (stranger != 0);
	float mean = (float)(n + 1) / 2.0f;

	snprintf(key, sizeof(key), "run key %d", (int)getpid());
	if (stranger == 2)
		spawn_first(&k[n], &se, boot, sizeof(boot));
	else
		spawn_first(&k[0], &e, boot, sizeof(boot));
	e.bootstrap = boot;
	e.dht_port = 0;
	se.bootstrap = boot;
	se.dht_port = 0;
	for (int i = stranger == 2 ? 0 : 1; i < n; i++) {
		if (stranger == 1 && i == 1)
			spawn(&k[n], &se); /* among the first, so that it is there throughout */
		spawn(&k[i], &e);
	}
	for (int i = 0; i < total; i++)
		collect(&k[i], &r[i]);
	for (int i = 0; i < n; i++) {
		if (r[i].init_rc || r[i].avg_rc)
			fail_msg("peer %d: mp_init %d, mp_average %d: %s", i, r[i].init_rc, r[i].avg_rc,
				 r[i].err);
		assert_int_equal(r[i].npeers, n);
		assert_true(r[i].rank >= 0 && r[i].rank < n);
		assert_int_equal(seen[r[i].rank], 0);
		seen[r[i].rank] = 1;
		/* The exact mean: every rank + 1 is a small integer, so the
		 * float sums are exact. */
		if (r[i].xmin != mean || r[i].xmax != mean)
			fail_msg("peer %d (rank %d): values in [%g, %g], want %g", i, r[i].rank,
				 (double)r[i].xmin, (double)r[i].xmax, (double)mean);
		/* The join is done long before its 30 s timeout, stranger or
		 * not: loopback and a loaded machine take seconds at most. */
		if (r[i].join_s > 15.0)
			fail_msg("peer %d: mp_init took %.1f s", i, r[i].join_s);
	}
	double slowest = 0.0;
	for (int i = 0; i < n; i++)
		slowest = r[i].join_s > slowest ? r[i].join_s : slowest;
	printf("%d honest peers%s: the slowest mp_init took %.2f s\n", n,
	       stranger == 2 ? ", a stranger first" : stranger ? ", a stranger among them" : "",
	       slowest);
	if (stranger) {
		const struct report *s = &r[n];
		char want[64];

		snprintf(want, sizeof(want), "saw 1 of the %d peers", n);
		assert_int_equal(s->init_rc, -ETIMEDOUT);
		if (!strstr(s->err, want) || !strstr(s->err, "not made with this run's key"))
			fail_msg("the stranger's error does not say what it saw and refused: %s",
				 s->err);
		printf("stranger: %s\n", s->err);
	}
	release(k, total);
}

/* The README's example under MP_RENDEZVOUS=dht: 4 peers print 2.5. */
static void readme_example_4_peers(void **s)
{
	(void)s;
	honest_join(4, 0);
}

static void ranks_of_8_peers(void **s)
{
	(void)s;
	honest_join(8, 0);
}

static void stranger_does_not_hold_up_the_join(void **s)
{
	(void)s;
	honest_join(4, 1);
}

/* The stranger is the node everyone bootstraps from: its welcome refuses
 * them, and they meet through the DHT. */
static void stranger_as_bootstrap_does_not_hold_up_the_join(void **s)
{
	(void)s;
	honest_join(4, 2);
}

/* Alone with MP_NPEERS=3: the join times out, saying what it saw. */
static void join_timeout_names_the_counts(void **s)
{
	struct kid k;
	struct report r;
	char key[64], boot[64];
	struct peer_env e = {.key = key, .npeers = 3, .join_timeout_ms = 1500};

	(void)s;
	snprintf(key, sizeof(key), "run key %d", (int)getpid());
	spawn_first(&k, &e, boot, sizeof(boot));
	collect(&k, &r);
	assert_int_equal(r.init_rc, -ETIMEDOUT);
	if (!strstr(r.err, "saw 1 of the 3 peers") || !strstr(r.err, "1500 ms") ||
	    !strstr(r.err, "no record was refused"))
		fail_msg("unexpected join error: %s", r.err);
	assert_true(r.join_s >= 1.4);
	release(&k, 1);
}

/*
 * Four peers average once; peer 3 is stopped (SIGSTOP) past its 2 s TTL and
 * the other three average again, each seeing exactly one peer gone. The
 * peers' key and bootstrap live in @key and @boot.
 */
/* Four peers with records of @ttl_ms on @grid (NULL: the default) join and
 * average once, exactly. */
static void four_average_once(struct kid k[4], struct report r[4], char *key, size_t keylen,
			      char *boot, size_t bootlen, int ttl_ms, const char *grid)
{
	struct peer_env e = {.key = key, .npeers = 4, .join_timeout_ms = 30000,
			     .record_ttl_ms = ttl_ms, .more = 1, .grid = grid};

	snprintf(key, keylen, "run key %d", (int)getpid());
	spawn_first(&k[0], &e, boot, bootlen);
	e.bootstrap = boot;
	e.dht_port = 0;
	for (int i = 1; i < 4; i++)
		spawn(&k[i], &e);
	for (int i = 0; i < 4; i++) {
		collect(&k[i], &r[i]);
		if (r[i].init_rc || r[i].avg_rc || r[i].xmin != 2.5f || r[i].xmax != 2.5f)
			fail_msg("peer %d before the stop: mp_init %d, mp_average %d, [%g, %g]: %s", i,
				 r[i].init_rc, r[i].avg_rc, (double)r[i].xmin, (double)r[i].xmax,
				 r[i].err);
	}
}

static void four_then_stop_peer_3(struct kid k[4], struct report r[4], char *key, size_t keylen,
				  char *boot, size_t bootlen)
{
	four_average_once(k, r, key, keylen, boot, bootlen, 2000, NULL);
	/* Past its TTL, then an average of the others, which see it gone. */
	assert_int_equal(kill(k[3].pid, SIGSTOP), 0);
	usleep(3 * 2000 * 1000);
	for (int i = 0; i < 3; i++)
		write_all(k[i].down, "a", 1);
	for (int i = 0; i < 3; i++) {
		collect(&k[i], &r[i]);
		if (r[i].gone != 1)
			fail_msg("peer %d with peer 3 stopped: %d peer(s) gone, want 1", i, r[i].gone);
	}
}

/*
 * A peer that was only late is taken back. Peer 3 is stopped (SIGSTOP)
 * past its record's TTL while the others average, so they take it for
 * gone (mp_peers_info says so); once it runs again, its refreshed record,
 * stamped after that, must bring it back: after their next average none of
 * them shows a peer gone. Left out for good, it would be a hole in every
 * round of theirs while it counted on them in its own, which is what a
 * refresher starved on a loaded machine used to do to a whole run.
 * (Whether peer 3 then averages with them at once: one a round behind does,
 * behind_peer_catches_up_in_the_same_call.)
 */
static void late_peer_is_taken_back(void **s)
{
	struct kid k[4];
	struct report r[4];
	char key[64], boot[64];

	(void)s;
	four_then_stop_peer_3(k, r, key, sizeof(key), boot, sizeof(boot));
	assert_int_equal(kill(k[3].pid, SIGCONT), 0);
	/* A refresh (every TTL/3) reaches them well within a TTL. */
	usleep(2 * 2000 * 1000);
	for (int t = 0; t < 4; t++) {
		for (int i = 0; i < 4; i++)
			write_all(k[i].down, "a", 1);
		for (int i = 0; i < 4; i++)
			collect(&k[i], &r[i]);
		for (int i = 0; i < 3; i++)
			if (r[i].gone != 0)
				fail_msg("peer %d, average %d after peer 3 ran again: %d peer(s) gone, "
					 "want 0", i, t + 1, r[i].gone);
	}
	release(k, 4); /* its 'x' ends their loops */
}

/*
 * Four peers on @grid with 3 s records average once; peer 3 is stopped
 * (SIGSTOP) for 3.5 s, so that its record has expired in the others' views,
 * while they average (reports in r[0..2]); then it runs again.
 */
static void four_with_peer_3_late(struct kid k[4], struct report r[4], char *key, size_t keylen,
				  char *boot, size_t bootlen, const char *grid)
{
	four_average_once(k, r, key, keylen, boot, bootlen, 3000, grid);
	assert_int_equal(kill(k[3].pid, SIGSTOP), 0);
	usleep(3500 * 1000);
	for (int i = 0; i < 3; i++)
		write_all(k[i].down, "a", 1);
	for (int i = 0; i < 3; i++)
		collect(&k[i], &r[i]);
	/* Running again before any check: a failed test leaves no stopped child. */
	assert_int_equal(kill(k[3].pid, SIGCONT), 0);
}

/*
 * A record that is only late is not a death while the connection is up.
 * Peer 3 is stopped (SIGSTOP) for 3.5 s with a 3 s TTL, refreshed every
 * 1 s: its record has expired in the others' views (at 2 to 3 s) when they
 * average, but less than a TTL ago, and its control connections are open
 * (a stopped process's sockets stay up; a killed one's are reset). They must
 * not take it for gone, nor close its connections: once it runs again, it
 * must not take them for gone either (their records expired in its view
 * while it was stopped), and all four must average on with nobody gone.
 * Taking such a peer for gone at once, as before, made a loaded machine
 * lose rounds to a cascade of closed connections and refused dials
 * (doc/control-plane.md, "Gone, and back"). Past another TTL it is gone
 * (four_then_stop_peer_3: 6 s with a 2 s TTL).
 */
static void late_record_is_not_a_death(void **s)
{
	struct kid k[4];
	struct report r[4];
	char key[64], boot[64];

	(void)s;
	four_with_peer_3_late(k, r, key, sizeof(key), boot, sizeof(boot), NULL);
	for (int i = 0; i < 3; i++)
		if (r[i].avg_rc || r[i].gone != 0)
			fail_msg("peer %d with peer 3 stopped 3.5 s (TTL 3 s): mp_average %d, %d peer(s) "
				 "gone, want 0 and none: %s", i, r[i].avg_rc, r[i].gone, r[i].err);
	usleep(1500 * 1000);
	for (int t = 0; t < 4; t++) {
		for (int i = 0; i < 4; i++)
			write_all(k[i].down, "a", 1);
		for (int i = 0; i < 4; i++)
			collect(&k[i], &r[i]);
		for (int i = 0; i < 4; i++)
			if (r[i].avg_rc || r[i].gone != 0)
				fail_msg("peer %d, average %d after peer 3 ran again: mp_average %d, %d "
					 "peer(s) gone, want 0 and none: %s", i, t + 1, r[i].avg_rc,
					 r[i].gone, r[i].err);
	}
	release(k, 4);
}

/*
 * A peer the others took for gone (stopped past its TTL) finds, when it runs
 * again, every control connection closed without a BYE, and takes the others
 * for gone in turn. It must not then run rounds alone back to back: each
 * ended in microseconds, and in a soak such a peer ran 90 of them in 0.3 s,
 * published the round it reached, and the whole run jumped there and fell
 * apart into rounds alone. Each of its rounds alone now waits the request
 * timeout (1 s here) for company, or until newer records of the others
 * bring them back.
 */
static void cut_off_peer_does_not_race(void **s)
{
	struct kid k[4];
	struct report r[4];
	char key[64], boot[64];

	(void)s;
	four_then_stop_peer_3(k, r, key, sizeof(key), boot, sizeof(boot));
	assert_int_equal(kill(k[3].pid, SIGCONT), 0);
	/* Peer 3 alone averages 3 times; the others do not average. */
	for (int t = 0; t < 3; t++) {
		write_all(k[3].down, "a", 1);
		collect(&k[3], &r[3]);
		if (r[3].grouped)
			fail_msg("peer 3, average %d: in a group while the others were idle", t + 1);
		/* Ending sooner is right once newer records have brought the
		 * others back (none gone): they are alive, only idle. */
		if (r[3].avg_s < 0.9 && r[3].gone > 0)
			fail_msg("peer 3, average %d after it ran again: alone in %.3f s with %d "
				 "peer(s) gone, want it to wait the request timeout (1 s) for "
				 "company", t + 1, r[3].avg_s, r[3].gone);
	}
	/* And the run is whole again. */
	usleep(2 * 2000 * 1000);
	for (int i = 0; i < 4; i++)
		write_all(k[i].down, "a", 1);
	for (int i = 0; i < 4; i++)
		collect(&k[i], &r[i]);
	for (int i = 0; i < 4; i++)
		if (r[i].avg_rc)
			fail_msg("peer %d after peer 3 came back: mp_average %d: %s", i, r[i].avg_rc,
				 r[i].err);
	release(k, 4);
}

/*
 * Collect peers @from..@to-1 after an average of 10 (rank + 1) each that
 * they should have made in one group (@what says when): each must hold the
 * group's mean, to float rounding.
 */
static void collect_group_mean(struct kid *k, struct report *r, int from, int to, const char *what)
{
	float sum = 0.0f, want;

	for (int i = from; i < to; i++) {
		collect(&k[i], &r[i]);
		sum += 10.0f * (float)(r[i].rank + 1);
	}
	want = sum / (float)(to - from);
	for (int i = from; i < to; i++)
		if (r[i].avg_rc || !r[i].grouped || fabsf(r[i].xmin - want) > 1e-5f * want ||
		    fabsf(r[i].xmax - want) > 1e-5f * want)
			fail_msg("peer %d, %s: mp_average %d, %s, values in [%g, %g], want the mean "
				 "of %d, %g: %s", i, what, r[i].avg_rc, r[i].grouped ? "grouped" : "alone",
				 (double)r[i].xmin, (double)r[i].xmax, to - from, (double)want, r[i].err);
}

/*
 * A line's leader that dies after declaring does not hold the line up. Four
 * peers on one line (grid 4, matchmaking time 3 s): peer 0 starts a round
 * first, so it leads; peers 1 and 2 follow it 0.3 s later; peer 0 is killed
 * (SIGKILL) at 0.6 s, and peer 3 comes at 1 s. Its declaration stays under
 * the line's key until it expires, at the end of peer 0's matchmaking time:
 * counted as a member still to join, it held the new leader to then (peer 3
 * waited 2 s, with every live member there). The three must average among
 * themselves, exactly, as soon as peer 3 has joined.
 */
static void dead_leader_does_not_hold_its_line(void **s)
{
	struct kid k[4];
	struct report r[4];
	char key[64], boot[64];

	(void)s;
	four_average_once(k, r, key, sizeof(key), boot, sizeof(boot), 3000, "4");
	write_all(k[0].down, "a", 1);
	usleep(300 * 1000);
	write_all(k[1].down, "a", 1);
	write_all(k[2].down, "a", 1);
	usleep(300 * 1000);
	assert_int_equal(kill(k[0].pid, SIGKILL), 0);
	usleep(400 * 1000);
	write_all(k[3].down, "a", 1);
	collect_group_mean(k, r, 1, 4, "with the leader killed");
	printf("peer 3 averaged in %.3f s, with the line's first leader dead\n", r[3].avg_s);
	if (r[3].avg_s > 1.0)
		fail_msg("peer 3 took %.3f s to average with the two live members of its line, "
			 "want under 1 s (the dead leader's declaration expired at 2 s)", r[3].avg_s);
	release(k, 4);
}

/*
 * A peer a round behind catches up within its call. Four peers on one line
 * (grid 4) average once; peer 3 is stopped (SIGSTOP) past its 3 s TTL, so
 * the others, not waiting for a late peer, average without it and are a
 * round ahead. Peer 3 runs again, and once its record is back they all
 * average: peer 3 at its own round, the one they have left. It hears that
 * the run is a round on (their answers, their records) and must sit that
 * round out and match theirs in the same call: all four in one group, the
 * exact mean of the four. Ending the call there, as before, left it a round
 * behind at every later call (the others wait for it, then go on without
 * it: the mean of three).
 */
static void behind_peer_catches_up_in_the_same_call(void **s)
{
	struct kid k[4];
	struct report r[4];
	char key[64], boot[64];

	(void)s;
	four_with_peer_3_late(k, r, key, sizeof(key), boot, sizeof(boot), "4");
	for (int i = 0; i < 3; i++)
		if (r[i].avg_rc || !r[i].grouped)
			fail_msg("peer %d with peer 3 stopped: mp_average %d, %s: %s", i, r[i].avg_rc,
				 r[i].grouped ? "grouped" : "alone", r[i].err);
	/* Its refreshed record (every 1 s) reaches them first: a member
	 * again, waited for in their next round. */
	usleep(1500 * 1000);
	for (int i = 0; i < 4; i++)
		write_all(k[i].down, "a", 1);
	collect_group_mean(k, r, 0, 4, "peer 3 a round behind");
	printf("peer 3, a round behind, averaged with the others in %.3f s\n", r[3].avg_s);
	release(k, 4);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(readme_example_4_peers),
		cmocka_unit_test(ranks_of_8_peers),
		cmocka_unit_test(stranger_does_not_hold_up_the_join),
		cmocka_unit_test(stranger_as_bootstrap_does_not_hold_up_the_join),
		cmocka_unit_test(join_timeout_names_the_counts),
		cmocka_unit_test(late_peer_is_taken_back),
		cmocka_unit_test(late_record_is_not_a_death),
		cmocka_unit_test(cut_off_peer_does_not_race),
		cmocka_unit_test(dead_leader_does_not_hold_its_line),
		cmocka_unit_test(behind_peer_catches_up_in_the_same_call),
	};

	signal(SIGPIPE, SIG_IGN);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
