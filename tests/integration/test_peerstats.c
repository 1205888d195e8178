/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * mp_peers_info and MP_BALANCE=measured with real processes over TCP on
 * loopback, through the public API only: after some averages every peer sees
 * the others live, with a measured bandwidth and round trip; a peer killed
 * with SIGKILL shows down at the survivors after their next average; and
 * parts sized from the measured figures give the exact mean, with the part
 * lengths every member logged equal to DeDLOC's split of the figures the
 * members sent.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <moshpit/moshpit.h>
#include "proc_io.h"

#define NP 4
#define COUNT 60000
#define ITERS 4

struct job {
	const char *name;
	int balance;  /* enum mp_balance */
	int kill;     /* SIGKILL the last rank after the averages, then one more */
};

static float input(int rank, int it, size_t i)
{
	return (float)((int)((rank * 31 + it * 7 + (int)i * 17) % 4001) - 2000) / 32.0f;
}

static float weight_of(int rank)
{
	return (float)(rank % 3 + 1);
}

__attribute__((format(printf, 2, 3))) static int complain(int rank, const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "rank %d: ", rank);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	return 1;
}

/* One average of iteration @it among @live ranks (a mask), checked exactly. */
static int average_checked(mp_ctx *ctx, int rank, int it, float *buf, struct mp_result *res)
{
	double wsum = 0, maxerr = 0;
	int rc;

	for (size_t i = 0; i < COUNT; i++)
		buf[i] = input(rank, it, i);
	rc = mp_average(ctx, buf, COUNT, weight_of(rank), res);
	if (rc)
		return complain(rank, "average %d: %s: %s", it, mp_strerror(rc), mp_last_error(ctx));
	for (int r = 0; r < NP; r++)
		wsum += weight_of(r);
	for (size_t i = 0; i < COUNT; i++) {
		double m = 0;
		for (int r = 0; r < NP; r++)
			m += weight_of(r) * (double)input(r, it, i);
		double e = fabs(buf[i] - m / wsum);
		maxerr = e > maxerr ? e : maxerr;
	}
	if (maxerr > 1e-4 || res->failed_peers || res->peers != NP)
		return complain(rank, "average %d: max error %g, %d failed, %d peers", it, maxerr,
			    res->failed_peers, res->peers);
	return 0;
}

/* Every peer but us live and measured. */
static int check_live(int rank, const struct mp_peer_info *t, int n)
{
	if (n != NP)
		return complain(rank, "%d peers listed, %d expected", n, NP);
	for (int i = 0; i < n; i++) {
		const struct mp_peer_info *q = &t[i];
		if (q->rank != i || q->id != (uint64_t)i || !q->addr[0])
			return complain(rank, "entry %d: rank %d id %" PRIu64 " addr '%s'", i, q->rank,
				    q->id, q->addr);
		if (i == rank) {
			if (q->state != MP_PEER_SELF || !(q->bandwidth_Bps > 0))
				return complain(rank, "own entry: state %d, throughput %g", q->state,
					    q->bandwidth_Bps);
			continue;
		}
		if (q->state != MP_PEER_LIVE || !(q->bandwidth_Bps > 0) || !(q->rtt_s > 0) ||
		    q->rtt_s > 10 || q->bytes_sent < COUNT || q->bytes_received < COUNT ||
		    q->failures || !(q->since_progress_s >= 0 && q->since_progress_s < 60))
			return complain(rank, "peer %d: state %d bw %g rtt %g sent %" PRIu64 " recv %" PRIu64
				    " failures %d idle %g", i, q->state, q->bandwidth_Bps, q->rtt_s,
				    q->bytes_sent, q->bytes_received, q->failures,
				    q->since_progress_s);
	}
	return 0;
}

/* The part lengths of the last "begin" line of our contribution log, by rank. */
static int last_roster(const char *path, uint64_t *lens)
{
	char line[4096], last[4096] = "";
	FILE *f = fopen(path, "r");

	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (!strncmp(line, "begin ", 6))
			strcpy(last, line);
	fclose(f);
	char *p = strstr(last, "roster=");
	if (!p)
		return -1;
	p += 7;
	for (int m = 0; m < NP; m++) {
		unsigned long long id, len;
		char mode;
		int used;
		if (sscanf(p, "%llx:%llu:%c%n", &id, &len, &mode, &used) != 3 || id >= NP)
			return -1;
		lens[id] = len;
		p += used + 1;
	}
	return 0;
}

static int child(const struct job *j, int rank, int to_parent, int from_parent)
{
	struct mp_config cfg;
	mp_ctx *ctx;
	char run[64], logp[128], addrs[NP][MP_ADDR_STRLEN];
	const char *ap[NP];
	struct mp_peer_info t[NP + 1];
	struct mp_result res;
	int rc, n;
	char b = 'A';

	snprintf(run, sizeof(run), "ps-%s-%d", j->name, (int)getppid());
	snprintf(logp, sizeof(logp), "/tmp/mp-peerstats-%d-%d.log", (int)getppid(), rank);
	unlink(logp);
	mp_config_init(&cfg);
	cfg.transport = "tcp";
	cfg.run_name = run;
	cfg.rank = rank;
	cfg.npeers = NP;
	cfg.algo = MP_ALGO_BUTTERFLY;
	cfg.listen = "127.0.0.1:0";
	cfg.chunk_bytes = 16384;
	cfg.connect_timeout_ms = 5000;
	cfg.round_timeout_ms = 10000;
	cfg.balance = j->balance;
	cfg.contrib_log = logp;
	rc = mp_init(&cfg, &ctx);
	if (rc)
		return complain(rank, "mp_init: %s: %s", mp_strerror(rc), mp_last_error(NULL)) + 1;
	mp_local_address(ctx, addrs[rank], MP_ADDR_STRLEN);
	if (write_all(to_parent, addrs[rank], MP_ADDR_STRLEN) ||
	    read_all(from_parent, addrs, sizeof(addrs), 30000))
		return 2;
	for (int i = 0; i < NP; i++)
		ap[i] = addrs[i];
	if (mp_set_peers(ctx, ap, NP))
		return 2;
	/* Before any average: every peer listed, nothing measured yet. */
	n = mp_peers_info(ctx, t, NP + 1, sizeof(t[0]));
	if (n != NP || t[rank].state != MP_PEER_SELF || t[(rank + 1) % NP].bandwidth_Bps != 0)
		return complain(rank, "before averaging: %d peers listed", n);
	float *buf = malloc(COUNT * sizeof(float));
	int bad = 0;
	for (int it = 0; it < ITERS && !bad; it++)
		bad = average_checked(ctx, rank, it, buf, &res);
	if (!bad) {
		n = mp_peers_info(ctx, t, NP + 1, sizeof(t[0]));
		bad = check_live(rank, t, n);
	}
	if (!bad && j->balance == MP_BALANCE_MEASURED) {
		/* The last average's parts are DeDLOC's split of the figures the
		 * members sent for it (unknown ones: -1), which every member holds. */
		double bw[NP];
		uint64_t want[NP], got[NP];
		int measured = 0;
		for (int m = 0; m < NP; m++) {
			bw[m] = t[m].rate_Bps > 0 ? t[m].rate_Bps : -1.0;
			measured += t[m].rate_Bps > 0;
		}
		if (measured < NP)
			bad = complain(rank, "only %d of %d members sent a measured figure", measured, NP);
		else if (mp_balance_parts(COUNT, bw, NP, 0, want) || last_roster(logp, got))
			bad = complain(rank, "cannot split the figures, or read %s", logp);
		for (int m = 0; m < NP && !bad; m++)
			if (want[m] != got[m])
				bad = complain(rank, "part %d: %" PRIu64 " values, the figures give %" PRIu64,
					   m, got[m], want[m]);
		/* The parent checks that every member logged the same parts. */
		if (!bad && write_all(to_parent, got, sizeof(got)))
			bad = 1;
	}
	b = bad ? 'F' : 'A';
	write_all(to_parent, &b, 1);
	if (!bad && j->kill) {
		/* The parent kills the last rank now; the others average once more. */
		if (read_all(from_parent, &b, 1, 60000))
			return 2;
		if (rank == NP - 1)
			pause();
		for (size_t i = 0; i < COUNT; i++)
			buf[i] = input(rank, 9, i);
		rc = mp_average(ctx, buf, COUNT, weight_of(rank), &res);
		n = mp_peers_info(ctx, t, NP + 1, sizeof(t[0]));
		if (rc || res.failed_peers < 1)
			bad = complain(rank, "average with a dead peer: %s, %d failed", mp_strerror(rc),
				   res.failed_peers);
		else if (n != NP || t[NP - 1].state != MP_PEER_DOWN || t[NP - 1].failures < 1)
			bad = complain(rank, "the killed peer shows state %d, %d failures", t[NP - 1].state,
				   t[NP - 1].failures);
		for (int i = 0; i < NP - 1 && !bad; i++)
			if (t[i].state != (i == rank ? MP_PEER_SELF : MP_PEER_LIVE))
				bad = complain(rank, "peer %d shows state %d", i, t[i].state);
		b = bad ? 'F' : 'A';
		write_all(to_parent, &b, 1);
	}
	/* Everyone waits for the slowest before leaving. */
	read_all(from_parent, &b, 1, 60000);
	mp_finalize(ctx);
	free(buf);
	unlink(logp);
	return bad;
}

static void launch(const struct job *j)
{
	pid_t pid[NP];
	int up[NP], down[NP], ok = 1, failed = 0;
	char addrs[NP][MP_ADDR_STRLEN], b;
	uint64_t lens[NP][NP];

	for (int r = 0; r < NP; r++) {
		pid[r] = fork_piped(&up[r], &down[r]);
		assert_true(pid[r] >= 0);
		if (pid[r] == 0)
			_exit(child(j, r, up[r], down[r]));
	}
	for (int r = 0; r < NP && ok; r++)
		ok = !read_all(up[r], addrs[r], MP_ADDR_STRLEN, 30000);
	for (int r = 0; r < NP && ok; r++)
		ok = !write_all(down[r], addrs, sizeof(addrs));
	for (int r = 0; r < NP && ok; r++) {
		if (j->balance == MP_BALANCE_MEASURED && read_all(up[r], lens[r], sizeof(lens[r]), 120000))
			ok = 0;
		ok = ok && !read_all(up[r], &b, 1, 120000) && b == 'A';
	}
	for (int r = 1; r < NP && ok && j->balance == MP_BALANCE_MEASURED; r++)
		if (memcmp(lens[r], lens[0], sizeof(lens[0]))) {
			fprintf(stderr, "%s: rank %d logged other parts than rank 0\n", j->name, r);
			ok = 0;
		}
	if (ok && j->kill) {
		kill(pid[NP - 1], SIGKILL);
		waitpid(pid[NP - 1], NULL, 0);
		pid[NP - 1] = -1;
		for (int r = 0; r < NP - 1; r++)
			write_all(down[r], "K", 1);
		for (int r = 0; r < NP - 1 && ok; r++)
			ok = !read_all(up[r], &b, 1, 120000) && b == 'A';
	}
	for (int r = 0; r < NP; r++) {
		if (ok && pid[r] > 0)
			write_all(down[r], "E", 1);
		close(down[r]);
		close(up[r]);
	}
	for (int r = 0; r < NP; r++) {
		int st;
		if (pid[r] <= 0)
			continue;
		if (!ok)
			kill(pid[r], SIGKILL);
		waitpid(pid[r], &st, 0);
		if (ok && (!WIFEXITED(st) || WEXITSTATUS(st))) {
			fprintf(stderr, "%s: rank %d exited with %d\n", j->name, r,
				WIFEXITED(st) ? WEXITSTATUS(st) : -1);
			failed++;
		}
	}
	if (!ok)
		fail_msg("%s: a peer failed its checks (see above)", j->name);
	if (failed)
		fail_msg("%s: %d peer(s) failed", j->name, failed);
}

static void stats_live_then_killed_down(void **s)
{
	(void)s;
	struct job j = {"kill", MP_BALANCE_CONFIGURED, 1};
	launch(&j);
}

static void measured_parts_exact(void **s)
{
	(void)s;
	struct job j = {"measured", MP_BALANCE_MEASURED, 0};
	launch(&j);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(stats_live_then_killed_down),
		cmocka_unit_test(measured_parts_exact),
	};
	signal(SIGPIPE, SIG_IGN);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
