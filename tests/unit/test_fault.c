/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Fault injection's plan (src/xfer/fault.c, MP_FAULT): which action is due
 * in which round, and joined=J, the key that makes a standby process (one
 * started ahead and woken to replace a dead peer, mpbench --standby) skip
 * the actions of rounds before it came, and delay, which holds a rejoining
 * peer's announce. Kills run in a child process and
 * are read back from its exit status.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core.h"
#include "fault.h"

static struct mp_ctx *ctx_with(const char *spec, int *rc)
{
	struct mp_ctx *ctx = calloc(1, sizeof(*ctx));

	assert_non_null(ctx);
	ctx->cfg.fault = spec;
	*rc = mp_fault_init(ctx);
	return ctx;
}

static void ctx_free(struct mp_ctx *ctx)
{
	mp_fault_free(ctx);
	free(ctx);
}

/* A bad joined= is refused with the key named; nothing is kept. */
static void joined_must_be_a_round(void **state)
{
	static const char *const bad[] = {"kill:round=3:joined=x", "kill:round=3:joined=",
					  "kill:round=3:joined=-1", "kill:round=3:joined=1:joined=2",
					  "kill:round=3:joined=4294967296"};
	(void)state;
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		int rc;
		struct mp_ctx *ctx = ctx_with(bad[i], &rc);

		assert_int_equal(rc, -EINVAL);
		assert_null(ctx->faults);
		assert_non_null(strstr(mp_last_error(NULL), "joined"));
		ctx_free(ctx);
	}
}

/* A stall with joined=2: due in [2, 5) for a peer whose first round was 2
 * or earlier, never for one that came in round 3. */
static void stall_skipped_by_a_later_joiner(void **state)
{
	const char *spec = "stall:round=2:until=5:joined=2";
	int rc;
	(void)state;

	struct mp_ctx *early = ctx_with(spec, &rc);
	assert_int_equal(rc, 0);
	assert_null(mp_fault_due(early, 0, MP_FAULT_SCATTER, 0)); /* first round 0 */
	assert_null(mp_fault_due(early, 1, MP_FAULT_SCATTER, 0));
	const struct mp_fault *f = mp_fault_due(early, 3, MP_FAULT_SCATTER, 0);
	assert_non_null(f);
	assert_int_equal(f->kind, MP_FAULT_STALL);
	assert_null(mp_fault_due(early, 4, MP_FAULT_SCATTER, 0)); /* fired once */
	ctx_free(early);

	struct mp_ctx *ontime = ctx_with(spec, &rc);
	assert_non_null(mp_fault_due(ontime, 2, MP_FAULT_SCATTER, 0));
	ctx_free(ontime);

	struct mp_ctx *late = ctx_with(spec, &rc);
	for (uint32_t r = 3; r < 8; r++)
		assert_null(mp_fault_due(late, r, MP_FAULT_SCATTER, 0));
	ctx_free(late);

	/* Without joined=, a late peer meets it in its first round in [2, 5). */
	struct mp_ctx *plain = ctx_with("stall:round=2:until=5", &rc);
	assert_null(mp_fault_due(plain, 1, MP_FAULT_SCATTER, 0));
	ctx_free(plain);
	plain = ctx_with("stall:round=2:until=5", &rc);
	assert_non_null(mp_fault_due(plain, 4, MP_FAULT_SCATTER, 0));
	ctx_free(plain);
}

/*
 * delay:...:phase=announce:ms=M holds a rejoin's announce once, for a join
 * round in [round, until), and is never a frame action; the specs that mix
 * it up are refused with the rule named, and keep nothing.
 */
static void delay_holds_one_announce(void **state)
{
	static const char *const bad[] = {
		"delay:round=0",                         /* no phase=announce */
		"delay:round=0:phase=announce",          /* no ms= */
		"delay:round=0:phase=scatter:ms=5",      /* a frame phase */
		"stall:round=0:phase=announce",          /* only delay announces */
		"kill:round=0:phase=announce",
		"stall:round=0:ms=5",                    /* only delay takes ms= */
		"delay:round=0:phase=announce:ms=5:peer=1",
		"delay:round=0:phase=announce:ms=5:after=2",
		"delay:round=0:phase=announce:ms=0",
		"delay:round=0:phase=announce:ms=600001",
		"delay:round=0:phase=announce:ms=5:ms=6",
	};
	int rc;
	(void)state;

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		struct mp_ctx *ctx = ctx_with(bad[i], &rc);

		assert_int_equal(rc, -EINVAL);
		assert_null(ctx->faults);
		assert_non_null(strstr(mp_last_error(NULL), bad[i]));
		ctx_free(ctx);
	}
	struct mp_ctx *ctx = ctx_with("delay:round=100:until=200:phase=announce:ms=400", &rc);
	assert_int_equal(rc, 0);
	/* Not a frame action: no round's frames meet it. */
	assert_null(mp_fault_due(ctx, 150, MP_FAULT_SCATTER, 0));
	assert_null(mp_fault_due(ctx, 150, MP_FAULT_GATHER, 0));
	assert_int_equal(mp_fault_announce(ctx, 99), 0);
	assert_int_equal(mp_fault_announce(ctx, 200), 0);
	assert_int_equal(mp_fault_announce(ctx, 150), 400);
	assert_int_equal(mp_fault_announce(ctx, 150), 0); /* fired once */
	ctx_free(ctx);
}

/* Run @spec's matchmaking from round @first to @last in a child; the round it
 * died in (SIGKILL), or -1 if it lived. */
static int dies_in(const char *spec, uint32_t first, uint32_t last)
{
	int fds[2], status;
	pid_t pid;
	uint32_t r = UINT32_MAX;

	assert_int_equal(pipe(fds), 0);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		int rc;
		struct mp_ctx *ctx = ctx_with(spec, &rc);

		close(fds[0]);
		if (rc)
			_exit(2);
		for (uint32_t k = first; k <= last; k++) {
			/* The round about to be matchmade, for the parent. */
			if (write(fds[1], &k, sizeof(k)) != (ssize_t)sizeof(k))
				_exit(3);
			mp_fault_match(ctx, k);
		}
		_exit(0);
	}
	close(fds[1]);
	for (uint32_t k; read(fds[0], &k, sizeof(k)) == (ssize_t)sizeof(k);)
		r = k;
	close(fds[0]);
	assert_int_equal(waitpid(pid, &status, 0), pid);
	if (WIFEXITED(status)) {
		assert_int_equal(WEXITSTATUS(status), 0);
		return -1;
	}
	assert_true(WIFSIGNALED(status));
	assert_int_equal(WTERMSIG(status), SIGKILL);
	return (int)r;
}

/*
 * mpbench's plan for a standby: one kill per round the churn draws for it,
 * each with until= the end of the churn and joined= its own round. Woken
 * in round a, it dies in the first drawn round at or after a, as a
 * replacement planned from round a would; the draws before a are skipped.
 */
static void standby_dies_in_its_first_drawn_round(void **state)
{
	const char *plan = "kill:round=2:until=9:joined=2:phase=match,"
			   "kill:round=5:until=9:joined=5:phase=match";
	(void)state;

	assert_int_equal(dies_in(plan, 0, 11), 2);
	assert_int_equal(dies_in(plan, 2, 11), 2);
	assert_int_equal(dies_in(plan, 3, 11), 5);
	assert_int_equal(dies_in(plan, 5, 11), 5);
	assert_int_equal(dies_in(plan, 6, 11), -1);
	/* Without joined=, the first action is overdue for a late joiner and
	 * fires in its first round. */
	assert_int_equal(dies_in("kill:round=2:until=9:phase=match,kill:round=5:until=9:phase=match",
				 3, 11), 3);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(joined_must_be_a_round),
		cmocka_unit_test(stall_skipped_by_a_later_joiner),
		cmocka_unit_test(standby_dies_in_its_first_drawn_round),
		cmocka_unit_test(delay_holds_one_announce),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
