/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * mp_last_error while the progress thread records errors. A context (rank 0
 * of 2, loop transport, butterfly) averages towards a peer nobody listens
 * for, so every operation fails on the progress thread after a short connect
 * timeout, and each failure writes the context's message. Meanwhile the
 * caller reads the message in a loop, as an application polling a request
 * would. Under ThreadSanitizer (tools/test.sh, build-tsan) an unguarded
 * message is a data race and the test fails; in any build, a string handed
 * out must stay as it was until the caller's next call on the context, and
 * no message read may be torn (half of one failure, half of the next).
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include <moshpit/moshpit.h>

#define N 256
#define OPS 8
/* What group_allreduce.c records when no member answered. */
#define FAILED "every other member failed: no values reached this peer"
#define DOWN "every other peer is down (probed in the background; the next average asks where the run is and rejoins it once one answers)"

static mp_ctx *lonely_ctx(void)
{
	struct mp_config cfg;
	mp_ctx *ctx = NULL;
	char self[MP_ADDR_STRLEN];
	const char *addrs[2];

	mp_config_init(&cfg);
	cfg.transport = "loop";
	cfg.run_name = "last-error";
	cfg.rank = 0;
	cfg.npeers = 2;
	cfg.algo = MP_ALGO_BUTTERFLY;
	/* Each failure is a connect timeout away: short, for many of them. */
	cfg.connect_timeout_ms = 20;
	cfg.round_timeout_ms = 20;
	/* A warning per failure is expected; keep the log for real surprises. */
	cfg.log_level = MP_LOG_NONE;
	assert_int_equal(mp_init(&cfg, &ctx), 0);
	assert_int_equal(mp_local_address(ctx, self, sizeof(self)), 0);
	addrs[0] = self;
	addrs[1] = "loop:last-error-nobody";
	assert_int_equal(mp_set_peers(ctx, addrs, 2), 0);
	return ctx;
}

/* A message read while errors come and go: none yet, or one whole failure. */
static void check_whole(const char *msg)
{
	unsigned round;
	char rest[256];

	if (!msg[0] || !strcmp(msg, DOWN))
		return;
	if (sscanf(msg, "round %u: %255[^\n]", &round, rest) != 2 || strcmp(rest, FAILED))
		fail_msg("torn or unexpected message: \"%s\"", msg);
}

static void read_while_failing(void **state)
{
	mp_ctx *ctx = lonely_ctx();
	float buf[N];
	long reads = 0;

	(void)state;
	memset(buf, 0, sizeof(buf));
	for (int op = 0; op < OPS; op++) {
		mp_request *req;
		int done = 0, rc = 0;

		assert_int_equal(mp_average_start(ctx, buf, N, 1.0f, NULL, &req), 0);
		while (!done) {
			/* Every byte of it is read, as printing it would. */
			check_whole(mp_last_error(ctx));
			reads++;
			rc = mp_test(req, &done, NULL);
			if (!done)
				assert_int_equal(rc, 0);
		}
		if (rc != -EHOSTUNREACH)
			fail_msg("op %d: %s, expected the unreachable peer's failure", op,
				 mp_strerror(rc));
		/* The first finds the peer unreachable; the others fail at once,
		 * as it is down (failure memory) and not yet answering probes. */
		if (op == 0 ? strcmp(mp_last_error(ctx), "round 0: " FAILED)
			    : strcmp(mp_last_error(ctx), DOWN))
			fail_msg("op %d: last error \"%s\"", op, mp_last_error(ctx));
	}
	print_message("%ld reads during %d failing operations\n", reads, OPS);
	mp_finalize(ctx);
}

/* The string handed out is the caller's until its next mp_last_error: a
 * failure recorded meanwhile by the progress thread does not change it.
 * (It is read before the second average starts, which, its peer down,
 * fails at once.) */
static void string_stays_until_next_call(void **state)
{
	mp_ctx *ctx = lonely_ctx();
	float buf[N];
	mp_request *req;
	char kept[256];

	(void)state;
	memset(buf, 0, sizeof(buf));
	assert_int_equal(mp_average(ctx, buf, N, 1.0f, NULL), -EHOSTUNREACH);
	const char *held = mp_last_error(ctx);
	snprintf(kept, sizeof(kept), "%s", held);
	assert_string_equal(kept, "round 0: " FAILED);
	assert_int_equal(mp_average_start(ctx, buf, N, 1.0f, NULL, &req), 0);
	/* mp_wait is a call on the request: the progress thread records the
	 * second failure (the peer is down now) while the caller still holds
	 * round 0's message. */
	assert_int_equal(mp_wait(req, -1, NULL), -EHOSTUNREACH);
	assert_string_equal(held, kept);
	assert_string_equal(mp_last_error(ctx), DOWN);
	mp_finalize(ctx);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(read_while_failing),
		cmocka_unit_test(string_stays_until_next_call),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
