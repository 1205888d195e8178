/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * mp_peers_info through the public API, with every peer a thread of this
 * process (loop transport): arguments, counts, the struct-size contract, and
 * reads from another thread while averages run (the tsan suite runs it).
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>

#include <moshpit/moshpit.h>

#define NP 3
#define COUNT 20000
#define ITERS 5

struct shared {
	pthread_barrier_t bar;
	char addr[NP][MP_ADDR_STRLEN];
	mp_ctx *ctx[NP];
	int rc[NP];
	int stop;   /* the poller's end (atomic) */
	int polls;  /* mp_peers_info calls that listed NP peers (atomic) */
};

struct arg {
	struct shared *sh;
	int rank;
};

static mp_ctx *make_ctx(int rank, int npeers, const char *run)
{
	struct mp_config cfg;
	mp_ctx *ctx = NULL;

	mp_config_init(&cfg);
	cfg.transport = "loop";
	cfg.run_name = run;
	cfg.rank = rank;
	cfg.npeers = npeers;
	cfg.algo = MP_ALGO_BUTTERFLY;
	cfg.chunk_bytes = 8192;
	cfg.connect_timeout_ms = 5000;
	cfg.round_timeout_ms = 5000;
	assert_int_equal(mp_init(&cfg, &ctx), 0);
	return ctx;
}

static void bad_arguments(void **st)
{
	struct mp_peer_info t[2];
	mp_ctx *ctx;
	const char *addr[1];
	char a[MP_ADDR_STRLEN];

	(void)st;
	ctx = make_ctx(0, 1, "pi-args");
	mp_local_address(ctx, a, sizeof(a));
	addr[0] = a;
	assert_int_equal(mp_set_peers(ctx, addr, 1), 0);
	/* loop has nothing to choose: no describe entry, an empty detail. */
	memset(a, 'x', sizeof(a));
	assert_int_equal(mp_transport_detail(ctx, a, sizeof(a)), 0);
	assert_string_equal(a, "");
	assert_int_equal(mp_transport_detail(ctx, a, 0), -EINVAL);
	assert_int_equal(mp_transport_detail(NULL, a, sizeof(a)), -EINVAL);
	assert_int_equal(mp_local_address(ctx, a, sizeof(a)), 0);
	assert_int_equal(mp_peers_info(NULL, t, 2, sizeof(t[0])), -EINVAL);
	assert_int_equal(mp_peers_info(ctx, t, -1, sizeof(t[0])), -EINVAL);
	assert_int_equal(mp_peers_info(ctx, NULL, 1, sizeof(t[0])), -EINVAL);
	/* Smaller than the identity every version has. */
	assert_int_equal(mp_peers_info(ctx, t, 2, offsetof(struct mp_peer_info, addr)), -EINVAL);
	/* A count alone, then the one entry: this peer. */
	assert_int_equal(mp_peers_info(ctx, NULL, 0, sizeof(t[0])), 1);
	memset(t, 0x5a, sizeof(t));
	assert_int_equal(mp_peers_info(ctx, t, 2, sizeof(t[0])), 1);
	assert_int_equal(t[0].state, MP_PEER_SELF);
	assert_int_equal(t[0].rank, 0);
	assert_int_equal((int)t[0].id, 0);
	assert_string_equal(t[0].addr, a);
	assert_true(t[0].since_progress_s == -1.0);
	assert_int_equal(t[0].failures, 0);
	/* The second entry is not written. */
	assert_int_equal(((unsigned char *)&t[1])[0], 0x5a);
	mp_finalize(ctx);
}

static void *poller(void *p)
{
	struct shared *sh = p;
	struct mp_peer_info t[NP];

	while (!__atomic_load_n(&sh->stop, __ATOMIC_ACQUIRE)) {
		int n = mp_peers_info(sh->ctx[0], t, NP, sizeof(t[0]));
		if (n == NP)
			__atomic_fetch_add(&sh->polls, 1, __ATOMIC_RELEASE);
	}
	return NULL;
}

static void *peer(void *p)
{
	struct arg *a = p;
	struct shared *sh = a->sh;
	float buf[COUNT];
	const char *addrs[NP];
	int rc = 0;

	sh->ctx[a->rank] = make_ctx(a->rank, NP, "pi-loop");
	mp_local_address(sh->ctx[a->rank], sh->addr[a->rank], MP_ADDR_STRLEN);
	pthread_barrier_wait(&sh->bar);
	for (int i = 0; i < NP; i++)
		addrs[i] = sh->addr[i];
	rc = mp_set_peers(sh->ctx[a->rank], addrs, NP);
	pthread_barrier_wait(&sh->bar); /* the poller starts on ctx 0 */
	/* ... and reads once before the averages start: on a loaded machine
	 * they were all done before it first ran (polls 0 in a suite). */
	for (int spin = 0; spin < 10000000 && !__atomic_load_n(&sh->polls, __ATOMIC_ACQUIRE);
	     spin++)
		sched_yield();
	for (int it = 0; it < ITERS && !rc; it++) {
		for (int i = 0; i < COUNT; i++)
			buf[i] = (float)(a->rank * 3 + it + i % 7);
		rc = mp_average(sh->ctx[a->rank], buf, COUNT, 1.0f, NULL);
		/* The mean of rank * 3 + it + i % 7 over ranks 0..2: 3 + it + i % 7. */
		for (int i = 0; i < COUNT && !rc; i++)
			if (buf[i] != (float)(3 + it + i % 7))
				rc = -EDOM;
	}
	sh->rc[a->rank] = rc;
	pthread_barrier_wait(&sh->bar);
	return NULL;
}

static void read_while_averaging(void **st)
{
	static struct shared sh;
	struct arg args[NP];
	pthread_t th[NP], pt;
	struct mp_peer_info t[NP + 2];

	(void)st;
	memset(&sh, 0, sizeof(sh));
	pthread_barrier_init(&sh.bar, NULL, NP + 1);
	for (int r = 0; r < NP; r++) {
		args[r] = (struct arg){&sh, r};
		assert_int_equal(pthread_create(&th[r], NULL, peer, &args[r]), 0);
	}
	pthread_barrier_wait(&sh.bar);
	pthread_barrier_wait(&sh.bar);
	assert_int_equal(pthread_create(&pt, NULL, poller, &sh), 0);
	pthread_barrier_wait(&sh.bar); /* the averages are done */
	__atomic_store_n(&sh.stop, 1, __ATOMIC_RELEASE);
	pthread_join(pt, NULL);
	for (int r = 0; r < NP; r++)
		assert_int_equal(sh.rc[r], 0);
	assert_true(sh.polls > 0);

	for (int r = 0; r < NP; r++) {
		int n = mp_peers_info(sh.ctx[r], t, NP + 2, sizeof(t[0]));
		assert_int_equal(n, NP);
		for (int i = 0; i < NP; i++) {
			assert_int_equal(t[i].rank, i);
			assert_int_equal(t[i].state, i == r ? MP_PEER_SELF : MP_PEER_LIVE);
			assert_true(t[i].bandwidth_Bps > 0);
			if (i == r)
				continue;
			assert_true(t[i].rtt_s > 0);
			assert_true(t[i].bytes_sent > 0 && t[i].bytes_received > 0);
			assert_int_equal(t[i].failures, 0);
			assert_true(t[i].since_progress_s >= 0 && t[i].since_progress_s < 60);
		}
		/* A caller built against an older, shorter struct gets the fields
		 * it knows, and nothing is written past them. */
		size_t old = offsetof(struct mp_peer_info, rate_Bps);
		unsigned char raw[NP * sizeof(struct mp_peer_info)];
		memset(raw, 0x5a, sizeof(raw));
		assert_int_equal(mp_peers_info(sh.ctx[r], (struct mp_peer_info *)(void *)raw, NP, old), NP);
		for (int i = 0; i < NP; i++) {
			struct mp_peer_info q;
			memcpy(&q, raw + (size_t)i * old, old);
			assert_int_equal(q.rank, i);
			assert_int_equal(q.bytes_sent, t[i].bytes_sent);
		}
		for (size_t b = (size_t)NP * old; b < sizeof(raw); b++)
			assert_int_equal(raw[b], 0x5a);
	}
	for (int r = 0; r < NP; r++)
		mp_finalize(sh.ctx[r]);
	for (int r = 0; r < NP; r++)
		pthread_join(th[r], NULL);
	pthread_barrier_destroy(&sh.bar);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(bad_arguments),
		cmocka_unit_test(read_while_averaging),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
