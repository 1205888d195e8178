/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The dht rendezvous with real OpenDHT nodes: eight backends in this process
 * on loopback, the first one alone, the others bootstrapping from it.
 * Stages run in order on the same nodes: everyone sees everyone, one leaves,
 * one dies without a word, a stranger with another run key is refused,
 * membership holds across epoch changes (epochs shortened to 1 s) while each
 * epoch's key stays small, declarations meet under a group key, rounds 64
 * apart share a DHT key without seeing each other's declarations, and
 * values are dropped by their storing nodes after their type's lifetime.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <opendht/opendht_c.h>

#include "rdv.h"
#include "rdv_dht_life.h"

/* Protocol constant of rdv_dht.c, exported for this test only. */
extern uint64_t mp_dht_epoch_ms;

#define N 8
#define EPOCH_MS 1000
#define TTL_MS 1500
#define GKEY "round-1/dim-0/cell-0"
#define STRANGER_ID 0x5eedULL

static const struct mp_rdv_ops *ops;
static struct mp_auth auth, wrong_auth;
static char run[64];
static void *be[N];
static uint64_t ids[N];
static void *stranger;

static uint64_t mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void *start(const struct mp_auth *a, const char *boot, uint64_t id)
{
	struct mp_rdv_params p = {
		.run_name = run,
		.auth = a,
		.self_id = id,
		.port = 0,
		.bootstrap = boot,
		.host = "127.0.0.1",
		.ttl_ms = TTL_MS,
	};
	void *s = NULL;

	assert_int_equal(ops->init(&p, &s), 0);
	assert_non_null(s);
	return s;
}

static void publish(void *s, uint64_t id, int i)
{
	struct mp_record r;

	memset(&r, 0, sizeof(r));
	r.id = id;
	r.round = 3;
	r.ndims = 1;
	r.coords[0] = (int16_t)i;
	r.bandwidth = 1.0 + i;
	strcpy(r.transport, "tcp");
	snprintf(r.addr, sizeof(r.addr), "127.0.0.1:%d", 20000 + i);
	assert_int_equal(ops->publish(s, &r), 0);
}

/* Live members of @s: count, and whether @id is among them. */
static int members(void *s, uint64_t id, bool *has)
{
	struct mp_record r[N + 4];
	int n = ops->members(s, r, N + 4);

	assert_true(n >= 0);
	*has = false;
	for (int i = 0; i < n; i++)
		if (r[i].id == id)
			*has = true;
	return n;
}

/* A bare OpenDHT node with moshpit's value types, bootstrapped from @boot
 * (a runner) or else from be[0]. */
static dht_runner *raw_node(dht_runner *boot)
{
	dht_runner *r = dht_runner_new();
	dht_runner_config cfg;
	char addr[MP_ADDR_STRLEN], *colon;

	dht_runner_config_default(&cfg);
	assert_int_equal(dht_runner_run_config(r, 0, &cfg), 0);
	assert_int_equal(mp_dht_life_register(r), 0);
	if (boot) {
		snprintf(addr, sizeof(addr), "127.0.0.1:%u", dht_runner_get_bound_port(boot, AF_INET));
	} else {
		assert_int_equal(ops->address(be[0], addr, sizeof(addr)), 0);
	}
	colon = strrchr(addr, ':');
	*colon = '\0';
	dht_runner_bootstrap(r, addr, colon + 1);
	return r;
}

/* What one get of @key finds: values, and how many of each of our types. */
struct found {
	atomic_int n, done;
	atomic_int by_type[MP_DHT_LIFE_N + 1]; /* [MP_DHT_LIFE_N]: type 0 */
};

static bool found_value(const dht_value *v, void *arg)
{
	struct found *f = arg;
	uint16_t t = mp_dht_value_type(v);

	atomic_fetch_add(&f->n, 1);
	if (!t)
		atomic_fetch_add(&f->by_type[MP_DHT_LIFE_N], 1);
	else if (t >= MP_DHT_LIFE_BASE && t < MP_DHT_LIFE_BASE + MP_DHT_LIFE_N)
		atomic_fetch_add(&f->by_type[t - MP_DHT_LIFE_BASE], 1);
	return true;
}

static void found_done(bool ok, void *arg)
{
	(void)ok;
	atomic_store(&((struct found *)arg)->done, 1);
}

static void get_key(dht_runner *r, const char *key, struct found *f)
{
	dht_infohash h;
	uint64_t deadline = mono_ms() + 5000;

	memset(f, 0, sizeof(*f));
	dht_infohash_get_from_string(&h, key);
	dht_runner_get(r, &h, found_value, found_done, f);
	while (!atomic_load(&f->done) && mono_ms() < deadline)
		usleep(10000);
	assert_true(atomic_load(&f->done));
}

/*
 * Lifetimes (rdv_dht_life.h): a value of a type that lives 12 s is dropped
 * by the nodes that stored it once that has passed, while a value of
 * OpenDHT's default type, put at the same time under the same key, is still
 * served. Three nodes of their own, apart from the backends, so that every
 * node that may store the value knows the type, as every node of a run
 * knows moshpit's. setup puts both values and reads them back; the last
 * test, well over 12 s later, reads again. (OpenDHT's own margin makes types
 * of 10 s or less live on: rdv_dht_life.h.)
 */
#define TEST_TYPE 0x6d6f
#define TEST_LIFE_MS 12000
static dht_runner *life_net[3];
static uint64_t life_t0;
static char life_key[160];

static void lifetime_start(void)
{
	dht_runner_config cfg;
	dht_infohash h;
	struct found f;
	dht_value *v;

	life_net[0] = dht_runner_new();
	dht_runner_config_default(&cfg);
	assert_int_equal(dht_runner_run_config(life_net[0], 0, &cfg), 0);
	assert_int_equal(mp_dht_life_register(life_net[0]), 0);
	life_net[1] = raw_node(life_net[0]);
	life_net[2] = raw_node(life_net[0]);
	for (int i = 0; i < 3; i++)
		assert_int_equal(mp_dht_life_register_type(life_net[i], TEST_TYPE, TEST_LIFE_MS), 0);
	snprintf(life_key, sizeof(life_key), "moshpit/v1/%s/lifetime", run);
	dht_infohash_get_from_string(&h, life_key);
	usleep(300000); /* the routing tables fill */
	v = dht_value_new_from_string("short-lived");
	mp_dht_value_set_type(v, TEST_TYPE);
	assert_int_equal(mp_dht_value_type(v), TEST_TYPE);
	dht_runner_put(life_net[0], &h, v, NULL, NULL, false);
	dht_value_unref(v);
	v = dht_value_new_from_string("default type");
	dht_runner_put(life_net[0], &h, v, NULL, NULL, false);
	dht_value_unref(v);
	life_t0 = mono_ms();
	do {
		usleep(50000);
		get_key(life_net[1], life_key, &f);
	} while (atomic_load(&f.n) < 2 && mono_ms() - life_t0 < 3000);
	assert_int_equal(atomic_load(&f.n), 2);
	assert_int_equal(atomic_load(&f.by_type[MP_DHT_LIFE_N]), 1);
}

static void test_value_lifetime(void **state)
{
	struct found f;

	(void)state;
	while (mono_ms() < life_t0 + TEST_LIFE_MS + 1500)
		usleep(50000);
	get_key(life_net[2], life_key, &f);
	assert_int_equal(atomic_load(&f.n), 1);
	assert_int_equal(atomic_load(&f.by_type[MP_DHT_LIFE_N]), 1);
	for (int i = 0; i < 3; i++)
		dht_runner_delete(life_net[i]);
}

static int setup(void **state)
{
	char addr[MP_ADDR_STRLEN];

	(void)state;
	ops = mp_rdv_dht_ops;
	if (!ops)
		return -1;
	mp_dht_epoch_ms = EPOCH_MS;
	snprintf(run, sizeof(run), "rdv-dht-test-%d", (int)getpid());
	if (mp_auth_init(&auth, run, "the run key", NULL) ||
	    mp_auth_init(&wrong_auth, run, "another key", NULL))
		return -1;
	for (int i = 0; i < N; i++) {
		ids[i] = 0x1000u + (uint64_t)i;
		be[i] = start(&auth, i ? addr : NULL, ids[i]);
		if (!i)
			assert_int_equal(ops->address(be[0], addr, sizeof(addr)), 0);
	}
	for (int i = 0; i < N; i++)
		publish(be[i], ids[i], i);
	lifetime_start();
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	for (int i = 0; i < N; i++)
		if (be[i])
			ops->fini(be[i]);
	if (stranger)
		ops->fini(stranger);
	return 0;
}

static void test_address(void **state)
{
	char addr[MP_ADDR_STRLEN];
	unsigned port = 0;

	(void)state;
	assert_int_equal(ops->address(be[1], addr, sizeof(addr)), 0);
	assert_int_equal(sscanf(addr, "127.0.0.1:%u", &port), 1);
	assert_true(port > 0 && port < 65536);
	assert_int_equal(ops->address(be[1], addr, 5), -ENOSPC);
}

static void test_bad_params(void **state)
{
	char addr[MP_ADDR_STRLEN], *colon;
	struct mp_rdv_params p = { .run_name = run, .auth = &auth, .self_id = 77, .ttl_ms = TTL_MS };
	void *s = NULL;

	(void)state;
	p.self_id = 0;
	assert_int_equal(ops->init(&p, &s), -EINVAL);
	p.self_id = 77;
	p.ttl_ms = 0;
	assert_int_equal(ops->init(&p, &s), -EINVAL);
	p.ttl_ms = TTL_MS;
	p.bootstrap = "no-port-here";
	assert_int_equal(ops->init(&p, &s), -EINVAL);
	p.bootstrap = "127.0.0.1:12x";
	assert_int_equal(ops->init(&p, &s), -EINVAL);
	p.bootstrap = NULL;
	/* The UDP port of a running node is taken. */
	assert_int_equal(ops->address(be[0], addr, sizeof(addr)), 0);
	colon = strrchr(addr, ':');
	p.port = atoi(colon + 1);
	assert_true(ops->init(&p, &s) < 0);
	assert_null(s);
}

static void test_all_see_all(void **state)
{
	uint64_t t0 = mono_ms(), deadline = t0 + 15000;
	struct mp_record r[N + 4];
	bool done = false;
	int n;

	(void)state;
	while (!done && mono_ms() < deadline) {
		done = true;
		for (int i = 0; i < N && done; i++) {
			n = ops->members(be[i], r, N + 4);
			done = n == N;
		}
		if (!done)
			usleep(20000);
	}
	print_message("all %d backends list all %d members after %llu ms\n", N, N,
		      (unsigned long long)(mono_ms() - t0));
	assert_true(done);
	/* What each sees is what each published. */
	for (int i = 0; i < N; i++) {
		n = ops->members(be[i], r, N + 4);
		assert_int_equal(n, N);
		for (int k = 0; k < n; k++) {
			int j = (int)(r[k].id - 0x1000u);
			char want[MP_ADDR_STRLEN];

			assert_true(j >= 0 && j < N);
			snprintf(want, sizeof(want), "127.0.0.1:%d", 20000 + j);
			assert_string_equal(r[k].addr, want);
			assert_string_equal(r[k].transport, "tcp");
			assert_int_equal(r[k].ndims, 1);
			assert_int_equal(r[k].coords[0], j);
			assert_true(r[k].bandwidth == 1.0 + j);
			assert_int_equal(r[k].bye, 0);
			assert_true(r[k].expires_ms > mp_wall_ms());
		}
	}
	/* Nobody left yet. */
	for (int i = 0; i < N; i++) {
		uint64_t gone[N];

		assert_int_equal(ops->departed(be[i], gone, NULL, N), 0);
	}
	assert_int_equal(ops->members(be[0], r, 3), 3);
}

static uint64_t wall_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* Wait until backends [0, @upto) no longer list @id and each reported it
 * departed exactly once, with when it left: 0 for a bye (@bye), else its
 * record's expiry, past and within a TTL; returns the time it took. */
static uint64_t wait_departed(int upto, uint64_t id, bool bye, uint64_t limit_ms)
{
	uint64_t t0 = mono_ms();
	bool reported[N] = { false }, done = false;

	while (!done && mono_ms() < t0 + limit_ms) {
		done = true;
		for (int i = 0; i < upto; i++) {
			uint64_t gone[N], when[N];
			int n = ops->departed(be[i], gone, when, N);
			bool has;

			assert_true(n >= 0);
			for (int k = 0; k < n; k++) {
				uint64_t now = wall_ms();

				assert_int_equal(gone[k], id);
				if (bye)
					assert_int_equal(when[k], 0);
				else
					assert_true(when[k] <= now && when[k] + TTL_MS > now);
				assert_false(reported[i]);
				reported[i] = true;
			}
			members(be[i], id, &has);
			if (has || !reported[i])
				done = false;
		}
		if (!done)
			usleep(20000);
	}
	assert_true(done);
	return mono_ms() - t0;
}

static void test_leave(void **state)
{
	uint64_t ms, gone[N];
	bool has;

	(void)state;
	assert_int_equal(ops->leave(be[N - 1]), 0);
	/* Gone from its own list at once. */
	members(be[N - 1], ids[N - 1], &has);
	assert_false(has);
	ms = wait_departed(N - 1, ids[N - 1], true, 5000);
	print_message("a bye reached the other %d backends in %llu ms\n", N - 1,
		      (unsigned long long)ms);
	/* A bye travels as fast as any put, well before the TTL would have done it. */
	assert_true(ms < TTL_MS);
	for (int i = 0; i < N - 1; i++) {
		assert_int_equal(ops->departed(be[i], gone, NULL, N), 0);
		assert_int_equal(members(be[i], 0, &has), N - 1);
	}
	ops->fini(be[N - 1]);
	be[N - 1] = NULL;
}

static void test_crash(void **state)
{
	uint64_t ms, gone[N];
	bool has;

	(void)state;
	members(be[0], ids[N - 2], &has);
	assert_true(has);
	ops->fini(be[N - 2]);
	be[N - 2] = NULL;
	ms = wait_departed(N - 2, ids[N - 2], false, TTL_MS + 2000);
	print_message("a dead backend left the others' lists after %llu ms (TTL %d ms)\n",
		      (unsigned long long)ms, TTL_MS);
	assert_true(ms <= TTL_MS + 500);
	for (int i = 0; i < N - 2; i++) {
		assert_int_equal(ops->departed(be[i], gone, NULL, N), 0);
		assert_int_equal(members(be[i], 0, &has), N - 2);
	}
}

static void test_stranger_refused(void **state)
{
	char addr[MP_ADDR_STRLEN];
	uint64_t before[N], t0, deadline;
	struct mp_record r[N + 4];
	bool done = false, has;
	int n;

	(void)state;
	for (int i = 0; i < N - 2; i++)
		before[i] = ops->refused(be[i]);
	assert_int_equal(ops->address(be[0], addr, sizeof(addr)), 0);
	stranger = start(&wrong_auth, addr, STRANGER_ID);
	publish(stranger, STRANGER_ID, 42);
	t0 = mono_ms();
	deadline = t0 + 10000;
	while (!done && mono_ms() < deadline) {
		done = true;
		for (int i = 0; i < N - 2; i++) {
			assert_int_equal(members(be[i], STRANGER_ID, &has), N - 2);
			assert_false(has);
			if (ops->refused(be[i]) <= before[i])
				done = false;
		}
		if (!done)
			usleep(20000);
	}
	print_message("the stranger's record was refused by all after %llu ms\n",
		      (unsigned long long)(mono_ms() - t0));
	assert_true(done);
	/* And it refuses the run's records: it sees itself only. */
	deadline = mono_ms() + 5000;
	while (ops->refused(stranger) == 0 && mono_ms() < deadline)
		usleep(20000);
	assert_true(ops->refused(stranger) > 0);
	n = ops->members(stranger, r, N + 4);
	assert_int_equal(n, 1);
	assert_int_equal(r[0].id, STRANGER_ID);
	/* Refreshes of the stranger keep being refused, never listed. */
	usleep(2 * (TTL_MS / 3) * 1000);
	for (int i = 0; i < N - 2; i++) {
		assert_int_equal(members(be[i], STRANGER_ID, &has), N - 2);
		assert_false(has);
	}
}

/* Across three epoch changes, every backend lists exactly the live ones. */
static void test_epochs(void **state)
{
	uint64_t end = mono_ms() + 3 * EPOCH_MS + 200;
	int polls = 0;

	(void)state;
	while (mono_ms() < end) {
		for (int i = 0; i < N - 2; i++) {
			struct mp_record r[N + 4];
			int n = ops->members(be[i], r, N + 4);

			assert_int_equal(n, N - 2);
			for (int k = 0; k < n; k++)
				assert_true(r[k].id >= ids[0] && r[k].id <= ids[N - 3]);
		}
		polls++;
		usleep(10000);
	}
	assert_true(polls > 100);
}

static atomic_int values_seen, get_finished;

static bool count_value(const dht_value *v, void *arg)
{
	(void)v;
	(void)arg;
	atomic_fetch_add(&values_seen, 1);
	return true;
}

static void get_done(bool ok, void *arg)
{
	(void)ok;
	(void)arg;
	atomic_store(&get_finished, 1);
}

/*
 * What a key holds, asked from a node of our own: the last complete epoch's
 * key has at most (epoch / (ttl/3) + 2) values per publisher (six backends
 * and the stranger), where one key for the whole run would by now hold every
 * refresh since the start (a hundred or more).
 */
static void test_epoch_key_bounded(void **state)
{
	dht_runner *r = dht_runner_new();
	dht_runner_config cfg;
	char addr[MP_ADDR_STRLEN], key[128], *colon;
	uint64_t deadline;
	dht_infohash h;
	int n;

	(void)state;
	dht_runner_config_default(&cfg);
	assert_int_equal(dht_runner_run_config(r, 0, &cfg), 0);
	assert_int_equal(ops->address(be[0], addr, sizeof(addr)), 0);
	colon = strrchr(addr, ':');
	*colon = '\0';
	dht_runner_bootstrap(r, addr, colon + 1);
	snprintf(key, sizeof(key), "moshpit/v1/%s/members/%llu", run,
		 (unsigned long long)(mp_wall_ms() / EPOCH_MS - 1));
	dht_infohash_get_from_string(&h, key);
	dht_runner_get(r, &h, count_value, get_done, NULL);
	deadline = mono_ms() + 5000;
	while (!atomic_load(&get_finished) && mono_ms() < deadline)
		usleep(10000);
	n = atomic_load(&values_seen);
	print_message("the last epoch's key holds %d values\n", n);
	dht_runner_delete(r);
	assert_true(atomic_load(&get_finished));
	assert_true(n >= N - 1);
	assert_true(n <= (N - 1) * (EPOCH_MS / (TTL_MS / 3) + 2));
}

static bool decls_as_expected(void *s, const uint64_t *want_ids, const uint64_t *want_exp, int nw)
{
	struct mp_decl d[N + 4];
	int n = ops->declared(s, GKEY, d, N + 4);

	assert_true(n >= 0);
	if (n != nw)
		return false;
	for (int k = 0; k < n; k++)
		if (d[k].id != want_ids[k] || d[k].expires_ms != want_exp[k])
			return false;
	return true;
}

static bool wait_decls(const uint64_t *want_ids, const uint64_t *want_exp, int nw)
{
	uint64_t t0 = mono_ms();
	bool done = false;

	while (!done && mono_ms() < t0 + 10000) {
		done = true;
		for (int i = 0; i < 5; i++)
			if (!decls_as_expected(be[i], want_ids, want_exp, nw))
				done = false;
		if (!done)
			usleep(20000);
	}
	print_message("declarations settled on 5 backends after %llu ms\n",
		      (unsigned long long)(mono_ms() - t0));
	return done;
}

static void test_declarations(void **state)
{
	uint64_t base = mp_wall_ms() + 8000;
	/* Backends 0..3 declare; 0 and 2 share a deadline, as do 1 and 3:
	 * the order is by (expires, id). Backend 4 only reads. */
	uint64_t want_ids[4] = { ids[0], ids[2], ids[1], ids[3] };
	uint64_t want_exp[4] = { base, base, base + 100, base + 100 };
	struct mp_decl d, out[4];

	(void)state;
	/* The stranger's declaration would rank first if it were believed. */
	d = (struct mp_decl){ .id = STRANGER_ID, .expires_ms = base - 1000 };
	assert_int_equal(ops->declare(stranger, GKEY, &d), 0);
	/* Backend 4 listens before anyone declares. */
	assert_int_equal(ops->declared(be[4], GKEY, out, 4), 0);
	for (int i = 3; i >= 0; i--) {
		d = (struct mp_decl){ .id = ids[i], .expires_ms = base + (i % 2) * 100,
				      .mode = MP_MODE_NORMAL, .coord = (int16_t)i };
		assert_int_equal(ops->declare(be[i], GKEY, &d), 0);
	}
	assert_true(wait_decls(want_ids, want_exp, 4));
	/* A later declaration of the same id replaces the earlier one. */
	d = (struct mp_decl){ .id = ids[0], .expires_ms = base + 200, .coord = 0 };
	assert_int_equal(ops->declare(be[0], GKEY, &d), 0);
	want_ids[0] = ids[2];
	want_ids[1] = ids[1];
	want_ids[2] = ids[3];
	want_ids[3] = ids[0];
	want_exp[0] = base;
	want_exp[1] = base + 100;
	want_exp[2] = base + 100;
	want_exp[3] = base + 200;
	assert_true(wait_decls(want_ids, want_exp, 4));
	assert_int_equal(ops->declared(be[0], GKEY, out, 2), 2);
	assert_int_equal(out[0].id, ids[2]);
	assert_int_equal(out[1].id, ids[1]);
	assert_int_equal(ops->declared(be[1], GKEY, out, 4), 4);
	assert_int_equal(out[2].coord, 3);
	for (int i = 0; i < 5; i++)
		ops->forget(be[i], GKEY);
	/* Bad keys. */
	assert_int_equal(ops->declare(be[0], "", &d), -EINVAL);
	assert_int_equal(ops->declare(be[0], "tab\there", &d), -EINVAL);
	assert_int_equal(ops->declared(be[0], NULL, out, 4), -EINVAL);
}

static void test_declaration_expires(void **state)
{
	struct mp_decl d = { .id = ids[5], .expires_ms = mp_wall_ms() + 300 }, out[2];

	(void)state;
	assert_int_equal(ops->declare(be[5], "short", &d), 0);
	/* Our own declaration is there at once, without waiting for the DHT. */
	assert_int_equal(ops->declared(be[5], "short", out, 2), 1);
	assert_int_equal(out[0].id, ids[5]);
	usleep(400000);
	assert_int_equal(ops->declared(be[5], "short", out, 2), 0);
	ops->forget(be[5], "short");
	ops->forget(be[5], "never-used");
}

/*
 * @over, a peer's declaration in a line or its "moved on", outranks its
 * "placing" under the same key, whatever the deadlines and whichever
 * arrives first: a placing that came back into view would hide where the
 * peer went (and keep leaders waiting for it).
 */
static void placing_outranked_by(const char *key, const struct mp_decl *over)
{
	uint64_t now = mp_wall_ms();
	struct mp_decl placing = { .id = ids[5], .expires_ms = now + 6000, .mode = MP_DECL_PLACING,
				   .line = UINT32_MAX };
	struct mp_decl out[2];
	int n = 0;

	assert_int_equal(ops->declared(be[4], key, out, 2), 0);
	assert_int_equal(ops->declare(be[5], key, &placing), 0);
	assert_int_equal(ops->declared(be[5], key, out, 2), 1);
	assert_int_equal(out[0].mode, MP_DECL_PLACING);
	assert_int_equal(ops->declare(be[5], key, over), 0);
	/* A placing with a later deadline still does not replace it. */
	placing.expires_ms = now + 8000;
	assert_int_equal(ops->declare(be[5], key, &placing), 0);
	assert_int_equal(ops->declared(be[5], key, out, 2), 1);
	assert_int_equal(out[0].mode, over->mode);
	assert_int_equal(out[0].line, over->line);
	/* Another node gets all three values, in whatever order: the same. */
	for (uint64_t t0 = mono_ms(); mono_ms() - t0 < 5000; usleep(20000)) {
		n = ops->declared(be[4], key, out, 2);
		if (n == 1 && out[0].mode == over->mode)
			break;
	}
	assert_int_equal(n, 1);
	assert_int_equal(out[0].mode, over->mode);
	assert_int_equal(out[0].coord, over->coord);
	ops->forget(be[4], key);
	ops->forget(be[5], key);
}

static void test_placing_outranked(void **state)
{
	struct mp_decl line = { .id = ids[5], .expires_ms = mp_wall_ms() + 4000,
				.mode = MP_MODE_NORMAL, .coord = 2, .line = 7 };

	(void)state;
	placing_outranked_by("placing", &line);
}

static void test_placing_moved_on(void **state)
{
	struct mp_decl moved = { .id = ids[5], .expires_ms = mp_wall_ms() + 4000,
				 .mode = MP_DECL_MOVED, .line = UINT32_MAX };

	(void)state;
	placing_outranked_by("moved", &moved);
}

/*
 * Group keys r<round>/... of rounds 64 apart share one DHT key (rdv_dht.c,
 * "Round slots"): both declarations are stored there, yet each reader sees
 * only its own round's, and drops the other round's as stale.
 * Each value carries the lifetime type of its deadline plus the slack.
 */
static void test_round_slots(void **state)
{
	uint64_t now = mp_wall_ms();
	struct mp_decl a = { .id = ids[0], .expires_ms = now + 4000, .mode = MP_MODE_NORMAL,
			     .coord = 1, .line = 4 };
	struct mp_decl b = { .id = ids[1], .expires_ms = now + 4000, .mode = MP_MODE_NORMAL,
			     .coord = 2, .line = 4 };
	struct mp_decl out[4];
	char key[160];
	struct found f;
	dht_runner *raw = raw_node(NULL);
	uint64_t stale2 = mp_rdv_dht_stale(be[2]), stale3 = mp_rdv_dht_stale(be[3]);
	int n2 = 0, n3 = 0;

	(void)state;
	assert_int_equal(ops->declare(be[0], "r3/d0/*.1", &a), 0);
	assert_int_equal(ops->declare(be[1], "r67/d0/*.1", &b), 0);
	/* Both readers have had time to hear both values by the time each
	 * has its own. */
	for (uint64_t t0 = mono_ms(); mono_ms() - t0 < 5000; usleep(20000)) {
		n2 = ops->declared(be[2], "r3/d0/*.1", out, 4);
		n3 = ops->declared(be[3], "r67/d0/*.1", out + 2, 2);
		if (n2 == 1 && n3 == 1)
			break;
	}
	usleep(300000);
	assert_int_equal(ops->declared(be[2], "r3/d0/*.1", out, 2), 1);
	assert_int_equal(out[0].id, ids[0]);
	assert_int_equal(ops->declared(be[3], "r67/d0/*.1", out, 2), 1);
	assert_int_equal(out[0].id, ids[1]);
	/* Each reader got the other round's value under the shared DHT key
	 * and dropped it as stale, not as refused. */
	assert_true(mp_rdv_dht_stale(be[2]) > stale2);
	assert_true(mp_rdv_dht_stale(be[3]) > stale3);
	/* One DHT key holds both, each with the shortest type (4 s + 5 s). */
	snprintf(key, sizeof(key), "moshpit/v1/%s/mm/r3/d0/*.1", run);
	get_key(raw, key, &f);
	assert_int_equal(atomic_load(&f.n), 2);
	assert_int_equal(atomic_load(&f.by_type[0]), 2);
	snprintf(key, sizeof(key), "moshpit/v1/%s/mm/r67/d0/*.1", run);
	get_key(raw, key, &f);
	assert_int_equal(atomic_load(&f.n), 0);
	dht_runner_delete(raw);
	for (int i = 0; i < 4; i++) {
		ops->forget(be[i], "r3/d0/*.1");
		ops->forget(be[i], "r67/d0/*.1");
	}
	/* Which type keeps a value how long. */
	assert_int_equal(mp_dht_life_type(1), MP_DHT_LIFE_BASE);
	assert_int_equal(mp_dht_life_type(80000), MP_DHT_LIFE_BASE);
	assert_int_equal(mp_dht_life_type(80001), MP_DHT_LIFE_BASE + 1);
	assert_int_equal(mp_dht_life_type(320000), MP_DHT_LIFE_BASE + MP_DHT_LIFE_N - 1);
	assert_int_equal(mp_dht_life_type(320001), 0);
	assert_int_equal(mp_dht_life_ms(MP_DHT_LIFE_BASE + 1), 160000);
	assert_int_equal(mp_dht_life_ms(0), 600000);
	assert_int_equal(mp_dht_life_ms(7), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_address),
		cmocka_unit_test(test_bad_params),
		cmocka_unit_test(test_all_see_all),
		cmocka_unit_test(test_leave),
		cmocka_unit_test(test_crash),
		cmocka_unit_test(test_stranger_refused),
		cmocka_unit_test(test_epochs),
		cmocka_unit_test(test_epoch_key_bounded),
		cmocka_unit_test(test_declarations),
		cmocka_unit_test(test_declaration_expires),
		cmocka_unit_test(test_placing_outranked),
		cmocka_unit_test(test_placing_moved_on),
		cmocka_unit_test(test_round_slots),
		cmocka_unit_test(test_value_lifetime),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}
