/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The peer table (src/peers.c). A static run's peers are ranks; a DHT run
 * appends the peers it learns and finds them by id through a hash index.
 * Checked against a plain scan: every learnt id found at the index it got,
 * ids never learnt not found, a second learn of an id changes nothing, and
 * indices stay put while the table and its index grow.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "xfer.h"

/*
 * The k-th of a sequence of distinct ids that look random: an odd
 * multiplier is a bijection of the 64-bit integers. k % 3 == 0 gives small
 * consecutive ids instead (ranks, as tests and static runs use).
 */
static uint64_t id_of(int k)
{
	return k % 3 ? (uint64_t)(k + 1) * 0x9E3779B97F4A7C15ull : 0x1000 + (uint64_t)k;
}

static int scan(const struct mp_ctx *ctx, uint64_t id)
{
	for (int i = 0; i < ctx->npeers; i++)
		if (ctx->peers[i].id == id)
			return i;
	return -1;
}

static struct mp_ctx *dyn_ctx(void)
{
	struct mp_ctx *ctx = calloc(1, sizeof(*ctx));

	assert_non_null(ctx);
	ctx->dynamic = 1;
	ctx->nconn = 2;
	/* As mp_init leaves it: the configured peer count (more than the
	 * table's first 8 entries), then an empty table. */
	ctx->npeers = 16;
	assert_int_equal(mp_peers_init(ctx, 0), 0);
	assert_int_equal(ctx->npeers, 0);
	assert_int_equal(mp_peer_find(ctx, 0), -1);
	return ctx;
}

static void test_dynamic_index(void **state)
{
	enum { N = 5000 };
	struct mp_ctx *ctx = dyn_ctx();
	uint64_t *ids = malloc(N * sizeof(*ids));

	(void)state;
	assert_non_null(ids);
	for (int i = 0; i < N; i++) {
		ids[i] = id_of(i);
		assert_int_equal(mp_peer_learn(ctx, ids[i], NULL, 2.0, MP_MODE_NORMAL), i);
		assert_int_equal(ctx->npeers, i + 1);
		/* At most half full, so probes end. */
		assert_non_null(ctx->peer_ix);
		assert_true((uint64_t)ctx->peer_ix_mask + 1 >= 2 * (uint64_t)ctx->npeers);
	}
	for (int i = 0; i < N; i++) {
		assert_int_equal(mp_peer_find(ctx, ids[i]), i);
		assert_int_equal(ctx->peers[i].id, ids[i]);
	}
	/* Ids never learnt: later ones of the sequence, and their neighbours. */
	for (int k = N; k < 4 * N; k++) {
		assert_int_equal(mp_peer_find(ctx, id_of(k)), -1);
		assert_int_equal(mp_peer_find(ctx, id_of(k) + 1), scan(ctx, id_of(k) + 1));
	}
	/* Learning a known id again keeps its index and the count. */
	assert_int_equal(mp_peer_learn(ctx, ids[1234], NULL, 3.0, MP_MODE_CLIENT), 1234);
	assert_int_equal(ctx->npeers, N);
	assert_true(ctx->peers[1234].bandwidth == 3.0);
	assert_int_equal(ctx->peers[1234].mode, MP_MODE_CLIENT);
	mp_peers_free(ctx);
	assert_null(ctx->peer_ix);
	assert_null(ctx->peers);
	free(ids);
	free(ctx);
}

/* A table built by hand (as test_decl builds one) has no index: found by a scan. */
static void test_dynamic_unindexed(void **state)
{
	struct mp_ctx ctx = {.dynamic = 1, .npeers = 3};
	struct mp_peer p[3] = {{.id = 77}, {.id = 5}, {.id = 901}};

	(void)state;
	ctx.peers = p;
	assert_int_equal(mp_peer_find(&ctx, 5), 1);
	assert_int_equal(mp_peer_find(&ctx, 901), 2);
	assert_int_equal(mp_peer_find(&ctx, 6), -1);
}

/* A static run: index = rank = id; nothing is learnt. */
static void test_static(void **state)
{
	struct mp_ctx *ctx = calloc(1, sizeof(*ctx));

	(void)state;
	assert_non_null(ctx);
	ctx->nconn = 2;
	assert_int_equal(mp_peers_init(ctx, 6), 0);
	assert_null(ctx->peer_ix);
	for (int i = 0; i < 6; i++)
		assert_int_equal(mp_peer_find(ctx, (uint64_t)i), i);
	assert_int_equal(mp_peer_find(ctx, 6), -1);
	assert_int_equal(mp_peer_find(ctx, UINT64_MAX), -1);
	assert_int_equal(mp_peer_learn(ctx, 9, NULL, 1.0, MP_MODE_NORMAL), -EPERM);
	assert_int_equal(ctx->npeers, 6);
	mp_peers_free(ctx);
	free(ctx);
}

/*
 * A down peer's probe backoff (peers.c) follows the context's
 * probe_min_ms / probe_max_ms: first probe that long after the failure,
 * then twice as long after each failed probe, capped at the longest. The
 * clock is read around each step, so the checks are exact whatever the
 * machine's speed.
 */
static void backoff_of(int min_ms, int max_ms, const uint32_t *want, int nwant)
{
	struct mp_ctx *ctx = calloc(1, sizeof(*ctx));
	uint64_t t0, t1, next;

	assert_non_null(ctx);
	mp_config_init(&ctx->cfg);
	if (min_ms)
		ctx->cfg.probe_min_ms = min_ms;
	if (max_ms)
		ctx->cfg.probe_max_ms = max_ms;
	ctx->nconn = 2;
	ctx->rank = 0;
	assert_int_equal(mp_peers_init(ctx, 3), 0);
	t0 = mp_now_ns();
	mp_peer_mark_down(ctx, 2, "test");
	t1 = mp_now_ns();
	assert_true(mp_peer_is_down(ctx, 2));
	assert_int_equal(ctx->ndown, 1);
	next = mp_peer_next_probe_ns(ctx, 2);
	assert_int_equal(next - mp_peer_down_since_ns(ctx, 2), (uint64_t)want[0] * 1000000u);
	assert_true(next >= t0 + (uint64_t)want[0] * 1000000u);
	assert_true(next <= t1 + (uint64_t)want[0] * 1000000u);
	for (int i = 1; i < nwant; i++) {
		t0 = mp_now_ns();
		mp_peer_probe_done(ctx, 2, MP_PROBE_ALIVE, -ECONNREFUSED, 0, 0);
		t1 = mp_now_ns();
		next = mp_peer_next_probe_ns(ctx, 2);
		if (ctx->peers[2].probe_ms != want[i] || next < t0 + (uint64_t)want[i] * 1000000u ||
		    next > t1 + (uint64_t)want[i] * 1000000u)
			fail_msg("min %d max %d: failed probe %d: next in %u ms, want %u", min_ms, max_ms,
				 i, ctx->peers[2].probe_ms, want[i]);
	}
	assert_true(mp_peer_is_down(ctx, 2));
	assert_false(mp_peer_is_down(ctx, 1));
	mp_peers_free(ctx);
	free(ctx);
}

static void test_probe_backoff(void **state)
{
	/* The defaults: 1 s doubling to 30 s. */
	static const uint32_t def[] = {1000, 2000, 4000, 8000, 16000, 30000, 30000};
	/* A cap that is no power of two times the first interval. */
	static const uint32_t odd[] = {300, 600, 1000, 1000};
	/* A constant interval: min = max. */
	static const uint32_t flat[] = {200, 200, 200};
	/* The range's ends. */
	static const uint32_t ends[] = {10, 20, 40, 80, 160, 320, 640, 1280, 2560, 5120, 10240,
					20480, 40960, 81920, 163840, 327680, 655360, 1310720,
					2621440, 3600000, 3600000};

	(void)state;
	backoff_of(0, 0, def, 7);
	backoff_of(300, 1000, odd, 4);
	backoff_of(200, 200, flat, 3);
	backoff_of(10, 3600000, ends, (int)(sizeof(ends) / sizeof(ends[0])));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_dynamic_index),
		cmocka_unit_test(test_dynamic_unindexed),
		cmocka_unit_test(test_static),
		cmocka_unit_test(test_probe_backoff),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
