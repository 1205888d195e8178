/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * State download (mp_state_*): servers and joiners as contexts of this
 * process, their state services on loopback TCP. The kill of a server
 * process mid-transfer is tests/python/test_state.py's.
 */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>
#include <sodium.h>
#include <sys/socket.h>
#include <moshpit/moshpit.h>
#include <moshpit/sdk/clock.h>
#include <moshpit/sdk/le.h>

#include "auth.h"
#include "inet.h"
#include "state_xfer.h"

static mp_ctx *mk(const char *key, uint64_t rate)
{
	struct mp_config cfg;
	mp_ctx *ctx;

	mp_config_init(&cfg);
	cfg.transport = "loop";
	cfg.run_name = "state";
	cfg.run_key = key;
	cfg.npeers = 1;
	cfg.rank = 0;
	cfg.state_rate = rate;
	cfg.round_timeout_ms = 2000;
	cfg.connect_timeout_ms = 2000;
	cfg.log_level = MP_LOG_NONE;
	assert_int_equal(mp_init(&cfg, &ctx), 0);
	return ctx;
}

static void addr_of(mp_ctx *c, char *buf)
{
	assert_int_equal(mp_state_address(c, buf, MP_ADDR_STRLEN), 0);
}

static void fill(uint8_t *p, size_t n, unsigned seed)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (uint8_t)(i * 31 + seed * 7 + (i >> 9));
}

static void test_query_and_fetch(void **st)
{
	(void)st;
	mp_ctx *srv = mk("k1", 0), *cli = mk("k1", 0);
	float w[1000];
	uint8_t b[333], meta_in[] = "step=42";
	const void *bufs[] = {w, b};
	size_t lens[] = {sizeof(w), sizeof(b)}, qlens[4] = {0};
	char a[MP_ADDR_STRLEN], meta[64] = {0};
	struct mp_state_info info;
	struct mp_stats stats;

	for (int i = 0; i < 1000; i++)
		w[i] = (float)i * 0.5f;
	fill(b, sizeof(b), 1);
	assert_int_equal(mp_state_address(srv, a, sizeof(a)), -ENOTCONN);
	assert_int_equal(mp_state_serve(srv, NULL), 0);
	assert_int_equal(mp_state_serve(srv, NULL), -EBUSY);
	addr_of(srv, a);
	assert_int_equal(strncmp(a, "127.0.0.1:", 10), 0); /* the loop transport has no IP */
	const char *addrs[] = {a};

	/* Serving before publishing: nothing to fetch. */
	assert_int_equal(mp_state_query(cli, addrs, 1, &info, NULL, 0, NULL, 0, 5000), -ENOENT);
	assert_non_null(strstr(mp_last_error(cli), "has published nothing"));

	assert_int_equal(mp_state_publish(srv, 42, bufs, lens, 2, meta_in, sizeof(meta_in)), 0);
	assert_int_equal(mp_state_query(cli, addrs, 1, &info, qlens, 4, meta, sizeof(meta), 5000), 0);
	assert_int_equal(info.version, 42);
	assert_int_equal(info.nbufs, 2);
	assert_int_equal(info.bytes, sizeof(w) + sizeof(b));
	assert_int_equal(info.meta_len, sizeof(meta_in));
	assert_int_equal(qlens[0], sizeof(w));
	assert_int_equal(qlens[1], sizeof(b));
	assert_string_equal(meta, "step=42");

	float w2[1000] = {0};
	uint8_t b2[333] = {0};
	void *dst[] = {w2, b2};
	memset(meta, 0, sizeof(meta));
	/* The server's buffers change after the publish: the snapshot does not. */
	w[7] = -1;
	assert_int_equal(mp_state_fetch(cli, addrs, 1, dst, lens, 2, meta, sizeof(meta), &info, 5000),
			 0);
	w[7] = 3.5f;
	assert_memory_equal(w2, w, sizeof(w));
	assert_memory_equal(b2, b, sizeof(b));
	assert_string_equal(meta, "step=42");
	assert_int_equal(info.source, 0);
	assert_int_equal(info.tries, 1);
	assert_int_equal(info.resumed, 0);
	assert_int_equal(mp_stats(srv, &stats, sizeof(stats)), 0);
	assert_int_equal(stats.state_served, 4); /* three answers (one "nothing"), a download */
	assert_int_equal(stats.state_refused, 0);
	mp_finalize(cli);
	mp_finalize(srv);
}

static void test_most_advanced_wins(void **st)
{
	(void)st;
	mp_ctx *s[4] = {mk("k2", 0), mk("k2", 0), mk("k2", 0), mk("k2", 0)}, *cli = mk("k2", 0);
	uint64_t versions[4] = {3, 9, 5, 0};
	char a[4][MP_ADDR_STRLEN];
	const char *addrs[4];
	uint32_t v[256], got[256];
	size_t len = sizeof(v);
	struct mp_state_info info;

	for (int i = 0; i < 4; i++) {
		assert_int_equal(mp_state_serve(s[i], "127.0.0.1:0"), 0);
		addr_of(s[i], a[i]);
		addrs[i] = a[i];
		if (i == 3)
			continue; /* serves, but has published nothing */
		for (int j = 0; j < 256; j++)
			v[j] = (uint32_t)(versions[i] * 1000 + (uint64_t)j);
		const void *b[] = {v};
		assert_int_equal(mp_state_publish(s[i], versions[i], b, &len, 1, NULL, 0), 0);
	}
	void *d[] = {got};
	assert_int_equal(mp_state_fetch(cli, addrs, 4, d, &len, 1, NULL, 0, &info, 5000), 0);
	assert_int_equal(info.version, 9);
	assert_int_equal(info.source, 1);
	for (int j = 0; j < 256; j++)
		assert_int_equal(got[j], 9000 + j);
	for (int i = 0; i < 4; i++)
		mp_finalize(s[i]);
	mp_finalize(cli);
}

static void test_stranger_gets_nothing(void **st)
{
	(void)st;
	mp_ctx *srv = mk("the-key", 0), *x = mk("another-key", 0);
	char a[MP_ADDR_STRLEN], meta[16];
	uint8_t secret[4096], got[4096];
	size_t len = sizeof(secret);
	const void *b[] = {secret};
	void *d[] = {got};
	struct mp_stats stats;
	struct mp_state_info info;

	fill(secret, sizeof(secret), 3);
	memset(got, 0xee, sizeof(got));
	assert_int_equal(mp_state_serve(srv, "127.0.0.1:0"), 0);
	addr_of(srv, a);
	const char *addrs[] = {a};
	assert_int_equal(mp_state_publish(srv, 1, b, &len, 1, "m", 1), 0);
	assert_int_equal(mp_state_fetch(x, addrs, 1, d, &len, 1, meta, sizeof(meta), &info, 5000),
			 -EACCES);
	assert_non_null(strstr(mp_last_error(x), "refused us"));
	assert_int_equal(mp_state_query(x, addrs, 1, &info, NULL, 0, NULL, 0, 5000), -EACCES);
	for (size_t i = 0; i < sizeof(got); i++)
		assert_int_equal(got[i], 0xee);
	assert_int_equal(mp_stats(srv, &stats, sizeof(stats)), 0);
	assert_int_equal(stats.state_refused, 2);
	assert_int_equal(stats.state_served, 0);
	mp_finalize(x);
	mp_finalize(srv);
}

static void test_other_lengths_and_bad_arguments(void **st)
{
	(void)st;
	mp_ctx *srv = mk("k3", 0), *cli = mk("k3", 0);
	char a[MP_ADDR_STRLEN], dead[MP_ADDR_STRLEN];
	uint8_t buf[100], got[99];
	size_t len = sizeof(buf), glen = sizeof(got);
	const void *b[] = {buf};
	void *d[] = {got};
	uint64_t t0;

	memset(buf, 1, sizeof(buf));
	assert_int_equal(mp_state_serve(srv, "127.0.0.1:0"), 0);
	addr_of(srv, a);
	assert_int_equal(mp_state_publish(srv, 1, b, &len, 1, NULL, 0), 0);
	const char *addrs[] = {a};
	assert_int_equal(mp_state_fetch(cli, addrs, 1, d, &glen, 1, NULL, 0, NULL, 5000), -EMSGSIZE);
	assert_non_null(strstr(mp_last_error(cli), "other lengths"));

	assert_int_equal(mp_state_publish(srv, 1, b, &len, -1, NULL, 0), -EINVAL);
	assert_int_equal(mp_state_publish(srv, 1, NULL, &len, 1, NULL, 0), -EINVAL);
	assert_int_equal(mp_state_publish(srv, 1, b, &len, 1, NULL, 5), -EINVAL);
	assert_int_equal(mp_state_fetch(cli, NULL, 1, d, &glen, 1, NULL, 0, NULL, 5000), -EINVAL);
	assert_int_equal(mp_state_fetch(cli, addrs, 1, d, &glen, 1, NULL, 0, NULL, 0), -EINVAL);
	/* The failed publishes changed nothing: the state is still served. */
	glen = sizeof(buf);
	uint8_t again[100] = {0};
	void *d2[] = {again};
	assert_int_equal(mp_state_fetch(cli, addrs, 1, d2, &glen, 1, NULL, 0, NULL, 5000), 0);
	assert_memory_equal(again, buf, sizeof(buf));

	/* A server that is gone: refused at once, and the call says so. */
	mp_ctx *gone = mk("k3", 0);
	assert_int_equal(mp_state_serve(gone, "127.0.0.1:0"), 0);
	addr_of(gone, dead);
	mp_finalize(gone);
	const char *dead_addrs[] = {dead};
	t0 = mp_now_ms();
	assert_int_equal(mp_state_fetch(cli, dead_addrs, 1, d2, &glen, 1, NULL, 0, NULL, 5000),
			 -ECONNREFUSED);
	assert_true(mp_now_ms() - t0 < 3000);
	assert_non_null(strstr(mp_last_error(cli), dead));
	mp_finalize(cli);
	mp_finalize(srv);
}

struct bg_fetch {
	mp_ctx *cli;
	const char *const *addrs;
	int naddrs;
	void *buf;
	size_t len;
	struct mp_state_info info;
	int rc;
};

static void *bg(void *arg)
{
	struct bg_fetch *f = arg;
	void *d[] = {f->buf};

	f->rc = mp_state_fetch(f->cli, f->addrs, f->naddrs, d, &f->len, 1, NULL, 0, &f->info,
			       20000);
	return NULL;
}

/* Wait until @p[at] is no longer zero: the download has passed it. The
 * read races with the download's recv by design (it only watches the
 * progress), so ThreadSanitizer is told not to look at it. */
__attribute__((no_sanitize("thread"))) static void wait_past(volatile uint8_t *p, size_t at)
{
	uint64_t end = mp_now_ms() + 10000;

	while (!p[at]) {
		assert_true(mp_now_ms() < end);
		usleep(500);
	}
}

static void test_publish_during_download_keeps_the_snapshot(void **st)
{
	(void)st;
	/* 2 MiB at 8 MiB/s: a quarter of a second in which to publish again. */
	mp_ctx *srv = mk("k4", 8 << 20), *cli = mk("k4", 0);
	size_t n = 2 << 20;
	uint8_t *v1 = malloc(n), *v2 = malloc(n), *got = calloc(1, n);
	char a[MP_ADDR_STRLEN];
	const void *b1[] = {v1}, *b2[] = {v2};
	pthread_t t;

	fill(v1, n, 5);
	fill(v2, n, 6);
	for (size_t i = 0; i < n; i++)
		v1[i] |= 1; /* no zero byte: wait_past sees the download arrive */
	assert_int_equal(mp_state_serve(srv, "127.0.0.1:0"), 0);
	addr_of(srv, a);
	assert_int_equal(mp_state_publish(srv, 1, b1, &n, 1, NULL, 0), 0);
	const char *addrs[] = {a};
	struct bg_fetch f = {.cli = cli, .addrs = addrs, .naddrs = 1, .buf = got, .len = n};
	assert_int_equal(pthread_create(&t, NULL, bg, &f), 0);
	wait_past(got, n / 8);
	assert_int_equal(mp_state_publish(srv, 2, b2, &n, 1, NULL, 0), 0);
	pthread_join(t, NULL);
	assert_int_equal(f.rc, 0);
	assert_int_equal(f.info.version, 1);
	assert_memory_equal(got, v1, n);
	free(v1);
	free(v2);
	free(got);
	mp_finalize(cli);
	mp_finalize(srv);
}

static void test_server_gone_mid_transfer_resumes_on_the_next(void **st)
{
	(void)st;
	/* Two servers with the same snapshot; the first, slow one stops
	 * mid-transfer and the download resumes on the second. */
	mp_ctx *slow = mk("k5", 4 << 20), *fast = mk("k5", 0), *cli = mk("k5", 0);
	size_t n = 4 << 20;
	uint8_t *v = malloc(n), *got = calloc(1, n);
	char a[2][MP_ADDR_STRLEN];
	const void *b[] = {v};
	pthread_t t;

	fill(v, n, 9);
	for (size_t i = 0; i < n; i++)
		v[i] |= 0x80;
	assert_int_equal(mp_state_serve(slow, "127.0.0.1:0"), 0);
	assert_int_equal(mp_state_serve(fast, "127.0.0.1:0"), 0);
	addr_of(slow, a[0]);
	addr_of(fast, a[1]);
	assert_int_equal(mp_state_publish(slow, 7, b, &n, 1, NULL, 0), 0);
	assert_int_equal(mp_state_publish(fast, 7, b, &n, 1, NULL, 0), 0);
	const char *addrs[] = {a[0], a[1]};
	struct bg_fetch f = {.cli = cli, .addrs = addrs, .naddrs = 2, .buf = got, .len = n};
	assert_int_equal(pthread_create(&t, NULL, bg, &f), 0);
	wait_past(got, n / 4);
	mp_finalize(slow); /* its service stops: the download is cut */
	pthread_join(t, NULL);
	assert_int_equal(f.rc, 0);
	assert_int_equal(f.info.source, 1);
	assert_int_equal(f.info.tries, 2);
	assert_true(f.info.resumed >= n / 4);
	assert_true(f.info.resumed < n);
	assert_memory_equal(got, v, n);
	free(v);
	free(got);
	mp_finalize(cli);
	mp_finalize(fast);
}


/*
 * A hostile server, written from doc/control-plane.md's table: it proves
 * the key (so the client reads on) and then lies in one way.
 */
enum lie { LIE_NONE, LIE_MAC, LIE_NBUFS, LIE_SUM, LIE_DATA, LIE_SHORT };

struct hostile {
	struct mp_auth auth;
	uint64_t run_id;
	enum lie lie;
	int fd;
	char addr[MP_ADDR_STRLEN];
	const uint8_t *data;
	size_t len;
	pthread_t t;
	int stop; /* atomic */
};

static int put_all(int fd, const void *p, size_t n)
{
	return mp_inet_xfer(fd, (void *)p, n, mp_now_ms() + 5000, 1);
}

static void *hostile_run(void *arg)
{
	struct hostile *h = arg;

	for (int k = 0; k < 2; k++) { /* a version query, then a download */
		uint8_t hello[21] = "MPST", ask[89], fixed[65] = {0}, lens[8], mac[32], run[8];
		uint8_t digest[32];
		int c = -1;

		for (uint64_t end = mp_now_ms() + 5000; c < 0 && mp_now_ms() < end &&
		     !__atomic_load_n(&h->stop, __ATOMIC_ACQUIRE);)
			if ((c = accept4(h->fd, NULL, NULL, SOCK_NONBLOCK)) < 0)
				usleep(1000);
		if (c < 0)
			return NULL;
		hello[4] = 1;
		mp_auth_random(hello + 5, 16);
		put_all(c, hello, sizeof(hello));
		if (mp_inet_xfer(c, ask, sizeof(ask), mp_now_ms() + 5000, 0)) {
			close(c);
			return NULL;
		}
		crypto_generichash(digest, 32, h->data, h->len, NULL, 0);
		fixed[0] = 1;
		mp_le_put64(fixed + 1, 99);
		mp_le_put64(fixed + 9, h->len);
		mp_le_put32(fixed + 25, h->lie == LIE_NBUFS ? MP_STATE_MAX_BUFS + 1 : 1);
		memcpy(fixed + 33, digest, 32);
		mp_le_put64(lens, h->lie == LIE_SUM ? h->len + 1 : h->len);
		mp_le_put64(run, h->run_id);
		struct mp_auth_piece pc[6] = {{ask, 16}, {hello + 5, 16}, {run, 8}, {fixed, 65},
					      {lens, 8}, {NULL, 0}};
		mp_auth_mac(&h->auth, MP_AUTH_STATE_GIVE, pc, 6, mac);
		if (h->lie == LIE_MAC)
			mac[3] ^= 1;
		put_all(c, fixed, sizeof(fixed));
		put_all(c, lens, sizeof(lens));
		put_all(c, mac, sizeof(mac));
		if (ask[16] == 2) {
			uint8_t *bad = malloc(h->len);

			memcpy(bad, h->data, h->len);
			if (h->lie == LIE_DATA)
				bad[h->len / 2] ^= 0x40;
			put_all(c, bad, h->lie == LIE_SHORT ? h->len / 2 : h->len);
			free(bad);
		}
		close(c);
	}
	return NULL;
}

static void hostile_start(struct hostile *h, enum lie lie, const uint8_t *data, size_t len)
{
	struct mp_inet_addr blob;
	size_t blen;

	memset(h, 0, sizeof(*h));
	memset(h->auth.key, 0x5a, sizeof(h->auth.key));
	h->run_id = 0x1234;
	h->lie = lie;
	h->data = data;
	h->len = len;
	assert_int_equal(mp_inet_listen("127.0.0.1:0", 4, NULL, NULL, &h->fd, &blob, &blen,
				       h->addr, sizeof(h->addr)), 0);
	assert_int_equal(pthread_create(&h->t, NULL, hostile_run, h), 0);
}

static void hostile_stop(struct hostile *h)
{
	__atomic_store_n(&h->stop, 1, __ATOMIC_RELEASE);
	pthread_join(h->t, NULL);
	close(h->fd);
}

static void test_hostile_servers_are_caught(void **st)
{
	(void)st;
	static const struct {
		enum lie lie;
		int rc;
		const char *why;
	} cases[] = {
		{LIE_NONE, 0, NULL},
		{LIE_MAC, -EACCES, "refused us"},
		{LIE_NBUFS, -EMSGSIZE, "version query: Message too long"},
		{LIE_SUM, -EPROTO, "version query: Protocol error"},
		{LIE_DATA, -EBADMSG, "does not match its digest"},
		{LIE_SHORT, -ECONNRESET, "cut mid-transfer"},
	};
	uint8_t data[4096], got[4096];
	size_t len = sizeof(data);
	void *d[] = {got};
	struct mp_state_dest dest = {d, &len, 1};

	fill(data, sizeof(data), 11);
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct hostile h;
		struct mp_state_head head;
		struct mp_state_outcome o;
		int rc;

		hostile_start(&h, cases[i].lie, data, sizeof(data));
		const char *addrs[] = {h.addr};
		memset(got, 0, sizeof(got));
		rc = mp_state_fetch_any(&h.auth, h.run_id, addrs, 1, &dest, 2000, 2000,
					mp_now_ms() + 10000, &head, &o);
		hostile_stop(&h);
		print_message("lie %d: rc %d: %s\n", (int)cases[i].lie, rc, o.why);
		assert_int_equal(rc, cases[i].rc);
		if (cases[i].why)
			assert_non_null(strstr(o.why, cases[i].why));
		if (!rc)
			assert_memory_equal(got, data, sizeof(data));
		mp_state_head_free(&head);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_query_and_fetch),
		cmocka_unit_test(test_most_advanced_wins),
		cmocka_unit_test(test_stranger_gets_nothing),
		cmocka_unit_test(test_other_lengths_and_bad_arguments),
		cmocka_unit_test(test_publish_during_download_keeps_the_snapshot),
		cmocka_unit_test(test_server_gone_mid_transfer_resumes_on_the_next),
		cmocka_unit_test(test_hostile_servers_are_caught),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
