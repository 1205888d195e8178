/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * mpbench's contribution-log replay (tools/mpbench/replay.c) on hand-written
 * logs: 4 peers over 2 rounds with a weighted member, an excluded contributor
 * and a reducer killed mid-round; client, aux and joining members; an
 * average given up and put back; logs that contradict each other or the
 * values the peers report.
 */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "replay.h"

#define A 0xaULL
#define B 0xbULL
#define C 0xcULL
#define D 0xdULL

/*
 * Round 0: groups {A, B} and {C, D}; A has weight 3. C's contribution to
 * part 1 of its group did not reach D, so D averaged that part alone.
 * Round 1: groups {A, C} and {B, D}. C was killed after logging its reduce
 * line: A kept its own values of C's part, and C's log ends in a cut line.
 */
static const char log_a[] =
	"begin round=0 group=00000001 self=000000000000000a index=0 size=2 weight=0x1.8p+1 "
	"roster=000000000000000a:2:n,000000000000000b:2:n\n"
	"reduce round=0 group=00000001 part=0 off=0 len=2 wsum=0x1p+2 "
	"contrib=000000000000000a:0x1.8p+1,000000000000000b:0x1p+0\n"
	"apply round=0 group=00000001 part=1 status=applied\n"
	"end round=0 group=00000001 weight=0x1p+1\n"
	"begin round=1 group=00000011 self=000000000000000a index=0 size=2 weight=0x1p+1 "
	"roster=000000000000000a:2:n,000000000000000c:2:n\n"
	"reduce round=1 group=00000011 part=0 off=0 len=2 wsum=0x1.8p+1 "
	"contrib=000000000000000a:0x1p+1,000000000000000c:0x1p+0\n"
	"apply round=1 group=00000011 part=1 status=own\n"
	"end round=1 group=00000011 weight=0x1.8p+0\n";

static const char log_b[] =
	"begin round=0 group=00000001 self=000000000000000b index=1 size=2 weight=0x1p+0 "
	"roster=000000000000000a:2:n,000000000000000b:2:n\n"
	"reduce round=0 group=00000001 part=1 off=2 len=2 wsum=0x1p+2 "
	"contrib=000000000000000a:0x1.8p+1,000000000000000b:0x1p+0\n"
	"apply round=0 group=00000001 part=0 status=applied\n"
	"end round=0 group=00000001 weight=0x1p+1\n"
	"begin round=1 group=00000012 self=000000000000000b index=0 size=2 weight=0x1p+1 "
	"roster=000000000000000b:2:n,000000000000000d:2:n\n"
	"reduce round=1 group=00000012 part=0 off=0 len=2 wsum=0x1.8p+1 "
	"contrib=000000000000000b:0x1p+1,000000000000000d:0x1p+0\n"
	"apply round=1 group=00000012 part=1 status=applied\n"
	"end round=1 group=00000012 weight=0x1.8p+0\n";

static const char log_c[] =
	"begin round=0 group=00000002 self=000000000000000c index=0 size=2 weight=0x1p+0 "
	"roster=000000000000000c:2:n,000000000000000d:2:n\n"
	"reduce round=0 group=00000002 part=0 off=0 len=2 wsum=0x1p+1 "
	"contrib=000000000000000c:0x1p+0,000000000000000d:0x1p+0\n"
	"apply round=0 group=00000002 part=1 status=applied\n"
	"end round=0 group=00000002 weight=0x1p+0\n"
	"begin round=1 group=00000011 self=000000000000000c index=1 size=2 weight=0x1p+0 "
	"roster=000000000000000a:2:n,000000000000000c:2:n\n"
	"reduce round=1 group=00000011 part=1 off=2 len=2 wsum=0x1.8p+1 "
	"contrib=000000000000000a:0x1p+1,000000000000000c:0x1p+0\n"
	"apply round=1 group=000";

/* D's round 0 reduce line, as logged and as a tampered copy. */
static const char d_reduce0[] =
	"reduce round=0 group=00000002 part=1 off=2 len=2 wsum=0x1p+0 "
	"contrib=000000000000000d:0x1p+0\n";
static const char d_reduce0_tampered[] =
	"reduce round=0 group=00000002 part=1 off=2 len=2 wsum=0x1p+1 "
	"contrib=000000000000000c:0x1p+0,000000000000000d:0x1p+0\n";

static const char log_d_rest[] =
	"apply round=0 group=00000002 part=0 status=applied\n"
	"end round=0 group=00000002 weight=0x1p+0\n"
	"begin round=1 group=00000012 self=000000000000000d index=1 size=2 weight=0x1p+0 "
	"roster=000000000000000b:2:n,000000000000000d:2:n\n"
	"reduce round=1 group=00000012 part=1 off=2 len=2 wsum=0x1.8p+1 "
	"contrib=000000000000000b:0x1p+1,000000000000000d:0x1p+0\n"
	"apply round=1 group=00000012 part=0 status=applied\n"
	"end round=1 group=00000012 weight=0x1.8p+0\n";

static const float x0_a[4] = { 1, 2, 3, 4 };
static const float x0_b[4] = { 5, 6, 7, 8 };
static const float x0_c[4] = { 0, 0, 0, 0 };
static const float x0_d[4] = { 2, 4, 6, 8 };

static struct replay *four_peers(int tampered)
{
	struct replay *rp = replay_new(4);
	char log_d[2048];

	assert_non_null(rp);
	snprintf(log_d, sizeof(log_d),
		 "begin round=0 group=00000002 self=000000000000000d index=1 size=2 "
		 "weight=0x1p+0 roster=000000000000000c:2:n,000000000000000d:2:n\n%s%s",
		 tampered ? d_reduce0_tampered : d_reduce0, log_d_rest);
	assert_int_equal(replay_add_peer(rp, A, x0_a), 0);
	assert_int_equal(replay_add_peer(rp, B, x0_b), 0);
	assert_int_equal(replay_add_peer(rp, C, x0_c), 0);
	assert_int_equal(replay_add_peer(rp, D, x0_d), 0);
	assert_int_equal(replay_add_peer(rp, D, x0_d), -EEXIST);
	assert_int_equal(replay_add_log(rp, A, log_a, strlen(log_a)), 0);
	assert_int_equal(replay_add_log(rp, B, log_b, strlen(log_b)), 0);
	assert_int_equal(replay_add_log(rp, C, log_c, strlen(log_c)), 0);
	assert_int_equal(replay_add_log(rp, D, log_d, strlen(log_d)), 0);
	assert_int_equal(replay_run(rp), 0);
	return rp;
}

/* The values every line implies, computed as the replay must: in double,
 * contributions summed in the listed order. */
static void expected_four(double a[4], double bd[4])
{
	/* Round 0: {A (w 3), B} -> A = B; {C, D} with C left out of part 1. */
	double ab0[4] = { (0.0 + 3.0 * 1 + 1.0 * 5) / 4, (0.0 + 3.0 * 2 + 1.0 * 6) / 4,
			  (0.0 + 3.0 * 3 + 1.0 * 7) / 4, (0.0 + 3.0 * 4 + 1.0 * 8) / 4 };
	double cd0[4] = { (0.0 + 0 + 2.0) / 2, (0.0 + 0 + 4.0) / 2, 6, 8 };

	/* Round 1: A reduces part 0 of {A (w 2), C}; C's part never came back. */
	a[0] = (0.0 + 2.0 * ab0[0] + 1.0 * cd0[0]) / 3;
	a[1] = (0.0 + 2.0 * ab0[1] + 1.0 * cd0[1]) / 3;
	a[2] = ab0[2];
	a[3] = ab0[3];
	/* {B (w 2), D}: both parts came back. */
	for (int i = 0; i < 4; i++)
		bd[i] = (0.0 + 2.0 * ab0[i] + 1.0 * cd0[i]) / 3;
}

static void to_float(const double *x, float *f, int n)
{
	for (int i = 0; i < n; i++)
		f[i] = (float)x[i];
}

static void test_four_peers(void **state)
{
	struct replay *rp = four_peers(0);
	double ea[4], ebd[4];
	const double *v;
	struct replay_cmp cmp;
	float f[4];

	(void)state;
	expected_four(ea, ebd);
	assert_int_equal(replay_problems(rp), 0);
	assert_string_equal(replay_first_problem(rp), "");
	assert_int_equal(replay_rounds(rp), 2);
	v = replay_values(rp, A);
	for (int i = 0; i < 4; i++)
		assert_true(v[i] == ea[i]);
	v = replay_values(rp, B);
	for (int i = 0; i < 4; i++)
		assert_true(v[i] == ebd[i]);
	v = replay_values(rp, D);
	for (int i = 0; i < 4; i++)
		assert_true(v[i] == ebd[i]);
	/* The dead reducer's values are unknown after its cut round. */
	v = replay_values(rp, C);
	for (int i = 0; i < 4; i++)
		assert_true(isnan(v[i]));
	assert_null(replay_values(rp, 0x99));

	/* The survivors' fp32 values match within the documented tolerance. */
	to_float(ea, f, 4);
	assert_int_equal(replay_compare(rp, A, f, 2e-5, 1e-6, &cmp), 0);
	assert_int_equal(cmp.wrong, 0);
	assert_int_equal(cmp.checked, 4);
	assert_true(cmp.max_err < 1e-6);
	to_float(ebd, f, 4);
	assert_int_equal(replay_compare(rp, D, f, 2e-5, 1e-6, &cmp), 0);
	assert_int_equal(cmp.wrong, 0);

	/* A value that is off is counted, and so is one against a NaN. */
	f[3] += 1e-3f;
	assert_int_equal(replay_compare(rp, B, f, 2e-5, 1e-6, &cmp), 0);
	assert_int_equal(cmp.wrong, 1);
	assert_true(cmp.max_err > 9e-4);
	assert_int_equal(replay_compare(rp, C, f, 2e-5, 1e-6, &cmp), 0);
	assert_int_equal(cmp.wrong, 4);
	assert_true(isinf(cmp.max_err));
	assert_int_equal(replay_compare(rp, 0x99, f, 2e-5, 1e-6, &cmp), -ENOENT);

	assert_int_equal(replay_groups(rp, A), 2);
	assert_int_equal(replay_groups(rp, C), 2);
	assert_true(replay_named_by_others(rp, C));
	replay_free(rp);
}

/* D's log claims C's contribution reached part 1; the values D reported say
 * otherwise: the check fails. */
static void test_wrong_result(void **state)
{
	struct replay *rp = four_peers(1);
	double ea[4], ebd[4];
	struct replay_cmp cmp;
	float f[4];

	(void)state;
	expected_four(ea, ebd);
	assert_int_equal(replay_problems(rp), 0);
	to_float(ebd, f, 4);
	assert_int_equal(replay_compare(rp, D, f, 2e-5, 1e-6, &cmp), 0);
	assert_true(cmp.wrong > 0);
	assert_int_equal(replay_compare(rp, B, f, 2e-5, 1e-6, &cmp), 0);
	assert_true(cmp.wrong > 0);
	/* A never met D's part: it is untouched by the false line. */
	to_float(ea, f, 4);
	assert_int_equal(replay_compare(rp, A, f, 2e-5, 1e-6, &cmp), 0);
	assert_int_equal(cmp.wrong, 0);
	replay_free(rp);
}

#define P 0x1001ULL
#define Q 0x1002ULL
#define X 0x1003ULL
#define J 0x1004ULL

/* A normal peer P, a client Q (no part), an aux X (reduces, contributes at
 * weight 0, takes the results like anyone); J joins in round 1 while Q and
 * X are alone. W is 2/3 in fp32: each of the three leaves round 0 with the
 * group's mean weight (1 + 1 + 0) / 3. */
#define W "0x1.555556p-1"
static void test_client_aux_joiner(void **state)
{
	static const char log_p[] =
		"begin round=0 group=00000021 self=0000000000001001 index=0 size=3 weight=0x1p+0 "
		"roster=0000000000001001:2:n,0000000000001002:0:c,0000000000001003:2:a\n"
		"reduce round=0 group=00000021 part=0 off=0 len=2 wsum=0x1p+1 "
		"contrib=0000000000001001:0x1p+0,0000000000001002:0x1p+0,0000000000001003:0x0p+0\n"
		"apply round=0 group=00000021 part=2 status=applied\n"
		"end round=0 group=00000021 weight=" W "\n"
		"begin round=1 group=00000022 self=0000000000001001 index=0 size=2 weight=" W " "
		"roster=0000000000001001:2:n,0000000000001004:2:n\n"
		"reduce round=1 group=00000022 part=0 off=0 len=2 wsum=0x1.555556p+0 "
		"contrib=0000000000001001:" W ",0000000000001004:" W "\n"
		"apply round=1 group=00000022 part=1 status=own\n"
		"end round=1 group=00000022 weight=" W "\n";
	static const char log_q[] =
		"begin round=0 group=00000021 self=0000000000001002 index=1 size=3 weight=0x1p+0 "
		"roster=0000000000001001:2:n,0000000000001002:0:c,0000000000001003:2:a\n"
		"apply round=0 group=00000021 part=0 status=applied\n"
		"apply round=0 group=00000021 part=2 status=applied\n"
		"end round=0 group=00000021 weight=" W "\n"
		"alone round=1\n";
	static const char log_x[] =
		"begin round=0 group=00000021 self=0000000000001003 index=2 size=3 weight=0x0p+0 "
		"roster=0000000000001001:2:n,0000000000001002:0:c,0000000000001003:2:a\n"
		"reduce round=0 group=00000021 part=2 off=2 len=2 wsum=0x1p+1 "
		"contrib=0000000000001001:0x1p+0,0000000000001002:0x1p+0,0000000000001003:0x0p+0\n"
		"apply round=0 group=00000021 part=0 status=applied\n"
		"end round=0 group=00000021 weight=" W "\n"
		"alone round=1\n";
	static const char log_j[] =
		"begin round=1 group=00000022 self=0000000000001004 index=1 size=2 weight=" W " "
		"roster=0000000000001001:2:n,0000000000001004:2:n\n"
		"reduce round=1 group=00000022 part=1 off=2 len=2 wsum=0x1.555556p+0 "
		"contrib=0000000000001001:" W ",0000000000001004:" W "\n"
		"apply round=1 group=00000022 part=0 status=applied\n"
		"end round=1 group=00000022 weight=" W "\n";
	/* Round 0: (1·1 + 1·3 + 0·9) / 2 = 2 everywhere, the aux's 9 left out
	 * and overwritten; round 1: P and J average 2 and 6 on part 0, and J's
	 * part 1 never reaches P. */
	static const float xp[4] = { 1, 1, 1, 1 }, xq[4] = { 3, 3, 3, 3 },
			   xx[4] = { 9, 9, 9, 9 }, xj[4] = { 6, 6, 6, 6 };
	static const double ep[4] = { 4, 4, 2, 2 }, eq[4] = { 2, 2, 2, 2 },
			    ex[4] = { 2, 2, 2, 2 }, ej[4] = { 4, 4, 4, 4 };
	struct replay *rp = replay_new(4);
	const double *v;

	(void)state;
	assert_non_null(rp);
	assert_int_equal(replay_add_peer(rp, P, xp), 0);
	assert_int_equal(replay_add_peer(rp, Q, xq), 0);
	assert_int_equal(replay_add_peer(rp, X, xx), 0);
	assert_int_equal(replay_add_peer(rp, J, xj), 0);
	assert_int_equal(replay_add_log(rp, P, log_p, strlen(log_p)), 0);
	assert_int_equal(replay_add_log(rp, Q, log_q, strlen(log_q)), 0);
	assert_int_equal(replay_add_log(rp, X, log_x, strlen(log_x)), 0);
	assert_int_equal(replay_add_log(rp, J, log_j, strlen(log_j)), 0);
	assert_int_equal(replay_run(rp), 0);
	assert_int_equal(replay_problems(rp), 0);
	v = replay_values(rp, P);
	for (int i = 0; i < 4; i++)
		assert_true(v[i] == ep[i]);
	v = replay_values(rp, Q);
	for (int i = 0; i < 4; i++)
		assert_true(v[i] == eq[i]);
	v = replay_values(rp, X);
	for (int i = 0; i < 4; i++)
		assert_true(v[i] == ex[i]);
	v = replay_values(rp, J);
	for (int i = 0; i < 4; i++)
		assert_true(v[i] == ej[i]);
	assert_int_equal(replay_groups(rp, J), 1);
	assert_int_equal(replay_groups(rp, Q), 1);
	assert_true(replay_named_by_others(rp, J));
	replay_free(rp);
}

/* Lines that do not add up make the affected values unknown (NaN) and are
 * reported: a part taken from a reducer that never reduced it, a stranger
 * among the contributions, a weight the contributor never had. */
static void test_inconsistent(void **state)
{
	static const char log_p[] =
		"begin round=0 group=00000031 self=0000000000001001 index=0 size=2 weight=0x1p+0 "
		"roster=0000000000001001:2:n,0000000000001002:2:n\n"
		"reduce round=0 group=00000031 part=0 off=0 len=2 wsum=0x1p+1 "
		"contrib=0000000000001001:0x1p+0,00000000deadbeef:0x1p+0\n"
		"apply round=0 group=00000031 part=1 status=applied\n"
		"end round=0 group=00000031 weight=0x1p+0\n"
		"this line is of no kind the replay knows\n";
	static const char log_q[] =
		"begin round=0 group=00000031 self=0000000000001002 index=1 size=2 weight=0x1p+0 "
		"roster=0000000000001001:2:n,0000000000001002:2:n\n"
		"apply round=0 group=00000031 part=0 status=applied\n"
		"end round=0 group=00000031 weight=0x1p+0\n"
		"begin round=1 group=00000032 self=0000000000001002 index=0 size=1 weight=0x1p+0 "
		"roster=0000000000001002:4:n\n"
		"reduce round=1 group=00000032 part=0 off=0 len=4 wsum=0x1p+2 "
		"contrib=0000000000001002:0x1p+2\n"
		"end round=1 group=00000032 weight=0x1p+0\n";
	static const float x[4] = { 1, 1, 1, 1 };
	struct replay *rp = replay_new(4);
	const double *v;

	(void)state;
	assert_non_null(rp);
	assert_int_equal(replay_add_peer(rp, P, x), 0);
	assert_int_equal(replay_add_peer(rp, Q, x), 0);
	assert_int_equal(replay_add_log(rp, P, log_p, strlen(log_p)), 0);
	assert_int_equal(replay_add_log(rp, Q, log_q, strlen(log_q)), 0);
	assert_int_equal(replay_run(rp), 0);
	/* The stranger's contribution; Q's missing reduce of part 1, which P
	 * took and Q holds; Q's weight 4 against its begin weight 1. */
	assert_int_equal(replay_problems(rp), 4);
	assert_non_null(strstr(replay_first_problem(rp), "deadbeef"));
	assert_true(replay_named_by_others(rp, 0xdeadbeefULL));
	v = replay_values(rp, P);
	for (int i = 0; i < 4; i++)
		assert_true(isnan(v[i]));
	v = replay_values(rp, Q);
	for (int i = 0; i < 4; i++)
		assert_true(isnan(v[i]));
	replay_free(rp);
}

/*
 * An average given up in a later round (-EBADE, -EMSGSIZE) puts its values
 * back ('restore'): P and Q average round 0; P's round 1 with R is given up
 * (begin and end, nothing reduced or applied) and both go back to their
 * values before round 0 (R sat round 0 out); Q is alone in round 1. Round 2
 * (the next average) pairs P, as it was, with Q, as round 0 left it.
 */
static void test_restore(void **state)
{
	static const char log_p[] =
		"begin round=0 group=00000041 self=0000000000001001 index=0 size=2 weight=0x1p+0 "
		"roster=0000000000001001:1:n,0000000000001002:1:n\n"
		"reduce round=0 group=00000041 part=0 off=0 len=1 wsum=0x1p+1 "
		"contrib=0000000000001001:0x1p+0,0000000000001002:0x1p+0\n"
		"apply round=0 group=00000041 part=1 status=applied\n"
		"end round=0 group=00000041 weight=0x1p+0\n"
		"begin round=1 group=00000042 self=0000000000001001 index=0 size=2 weight=0x1p+0 "
		"roster=0000000000001001:1:n,0000000000001003:1:n\n"
		"end round=1 group=00000042 weight=0x1p+0\n"
		"restore round=1 from=0\n"
		"begin round=2 group=00000043 self=0000000000001001 index=0 size=2 weight=0x1p+0 "
		"roster=0000000000001001:1:n,0000000000001002:1:n\n"
		"reduce round=2 group=00000043 part=0 off=0 len=1 wsum=0x1p+1 "
		"contrib=0000000000001001:0x1p+0,0000000000001002:0x1p+0\n"
		"apply round=2 group=00000043 part=1 status=applied\n"
		"end round=2 group=00000043 weight=0x1p+0\n";
	static const char log_q[] =
		"begin round=0 group=00000041 self=0000000000001002 index=1 size=2 weight=0x1p+0 "
		"roster=0000000000001001:1:n,0000000000001002:1:n\n"
		"reduce round=0 group=00000041 part=1 off=1 len=1 wsum=0x1p+1 "
		"contrib=0000000000001001:0x1p+0,0000000000001002:0x1p+0\n"
		"apply round=0 group=00000041 part=0 status=applied\n"
		"end round=0 group=00000041 weight=0x1p+0\n"
		"alone round=1\n"
		"begin round=2 group=00000043 self=0000000000001002 index=1 size=2 weight=0x1p+0 "
		"roster=0000000000001001:1:n,0000000000001002:1:n\n"
		"reduce round=2 group=00000043 part=1 off=1 len=1 wsum=0x1p+1 "
		"contrib=0000000000001001:0x1p+0,0000000000001002:0x1p+0\n"
		"apply round=2 group=00000043 part=0 status=applied\n"
		"end round=2 group=00000043 weight=0x1p+0\n";
	static const char log_r[] =
		"alone round=0\n"
		"begin round=1 group=00000042 self=0000000000001003 index=1 size=2 weight=0x1p+0 "
		"roster=0000000000001001:1:n,0000000000001003:1:n\n"
		"end round=1 group=00000042 weight=0x1p+0\n"
		"restore round=1 from=0\n";
	static const float p0[2] = { 1, 2 }, q0[2] = { 3, 4 }, r0[2] = { 5, 6 };
	struct replay *rp = replay_new(2);
	const double *v;

	(void)state;
	assert_non_null(rp);
	assert_int_equal(replay_add_peer(rp, P, p0), 0);
	assert_int_equal(replay_add_peer(rp, Q, q0), 0);
	assert_int_equal(replay_add_peer(rp, X, r0), 0);
	assert_int_equal(replay_add_log(rp, P, log_p, strlen(log_p)), 0);
	assert_int_equal(replay_add_log(rp, Q, log_q, strlen(log_q)), 0);
	assert_int_equal(replay_add_log(rp, X, log_r, strlen(log_r)), 0);
	assert_int_equal(replay_run(rp), 0);
	if (replay_problems(rp))
		fail_msg("%s", replay_first_problem(rp));
	/* Round 2: P {1, 2} with Q {2, 3}. */
	v = replay_values(rp, P);
	assert_true(v[0] == 1.5 && v[1] == 2.5);
	v = replay_values(rp, Q);
	assert_true(v[0] == 1.5 && v[1] == 2.5);
	v = replay_values(rp, X);
	assert_true(v[0] == 5 && v[1] == 6);
	replay_free(rp);
}

/* Logs come from files; a peer that never wrote one has an empty log. */
static void test_files(void **state)
{
	char dir[] = "/tmp/test_replay-XXXXXX", path[64];
	struct replay *rp = replay_new(4);
	const double *v;
	FILE *f;

	(void)state;
	assert_non_null(rp);
	assert_non_null(mkdtemp(dir));
	snprintf(path, sizeof(path), "%s/a.log", dir);
	f = fopen(path, "w");
	assert_non_null(f);
	fputs("begin round=0 group=00000001 self=000000000000000a index=0 size=1 "
	      "weight=0x1p+0 roster=000000000000000a:4:n\n"
	      "reduce round=0 group=00000001 part=0 off=0 len=4 wsum=0x1p+0 "
	      "contrib=000000000000000a:0x1p+0\n"
	      "end round=0 group=00000001 weight=0x1p+0\n"
	      "alone round=5\n", f);
	assert_int_equal(fclose(f), 0);
	assert_int_equal(replay_add_peer(rp, A, x0_a), 0);
	assert_int_equal(replay_add_peer(rp, B, x0_b), 0);
	assert_int_equal(replay_add_log_file(rp, A, path), 0);
	snprintf(path, sizeof(path), "%s/missing.log", dir);
	assert_int_equal(replay_add_log_file(rp, B, path), 0);
	assert_int_equal(replay_run(rp), 0);
	assert_int_equal(replay_problems(rp), 0);
	assert_int_equal(replay_rounds(rp), 6);
	assert_int_equal(replay_groups(rp, A), 0);
	v = replay_values(rp, A);
	for (int i = 0; i < 4; i++)
		assert_true(v[i] == x0_a[i]);
	v = replay_values(rp, B);
	for (int i = 0; i < 4; i++)
		assert_true(v[i] == x0_b[i]);
	snprintf(path, sizeof(path), "%s/a.log", dir);
	unlink(path);
	rmdir(dir);
	replay_free(rp);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_four_peers),
		cmocka_unit_test(test_wrong_result),
		cmocka_unit_test(test_client_aux_joiner),
		cmocka_unit_test(test_inconsistent),
		cmocka_unit_test(test_restore),
		cmocka_unit_test(test_files),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
