/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * DECL and PEER control messages as the matchmaker takes them
 * (mp_mm_on_decl, mp_mm_on_peer in src/matchmaker.c; formats in
 * doc/control-plane.md). A peer may declare only itself, in a line of our
 * grid with a coordinate that fits the round's dimension, or as placing
 * (in no line); it may declare another peer absent, never us. Anything
 * else is refused with -EBADMSG (ctrl.c counts it as rejected) and changes
 * nothing: no round learnt, nothing kept for later rounds, no peer taken as
 * dead, nothing passed to the rendezvous.
 *
 * The rendezvous here is a fake (a handful of held keys and call counts),
 * standing in for the DHT backend, which has tests of its own
 * (test_rdv_dht, test_welcome).
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <moshpit/sdk/le.h>

#include "grid.h"
#include "core.h"
#include "xfer.h"
#include "matchmaker.h"
#include "rdv.h"
#include "wire.h"

#define DECL_LEN 23 /* id 8, expires 8, mode 1, coord 2, line 4 */
#define ME 0x1111u
#define THEM 0x2222u   /* peer index 1: sends the messages */
#define OTHER 0x3333u  /* peer index 2 */

/* ---- the fake rendezvous ---- */

static struct {
	const char *held[4]; /* keys learn() accepts */
	int learnt;          /* learn() calls that took a declaration */
	int refused;         /* learn() calls for keys not held */
	char last_key[64];
	struct mp_decl last;
	int records;         /* learn_record() calls */
	int record_rc;
} fk;

static int fake_learn(void *st, const char *key, const struct mp_decl *d)
{
	(void)st;
	for (int i = 0; i < 4 && fk.held[i]; i++)
		if (!strcmp(fk.held[i], key)) {
			fk.learnt++;
			snprintf(fk.last_key, sizeof(fk.last_key), "%s", key);
			fk.last = *d;
			return 0;
		}
	fk.refused++;
	return -ENOENT;
}

static int fake_learn_record(void *st, const uint8_t *buf, size_t len)
{
	(void)st;
	(void)buf;
	(void)len;
	fk.records++;
	return fk.record_rc;
}

static const struct mp_rdv_ops fake_rdv = {
	.name = "fake",
	.learn = fake_learn,
	.learn_record = fake_learn_record,
};

/* ---- a context with three peers (us, THEM, OTHER) on a 4x4 grid ---- */

static struct mp_ctx *ctx_new(void)
{
	struct mp_ctx *ctx = calloc(1, sizeof(*ctx));

	assert_non_null(ctx);
	assert_int_equal(mp_grid_parse("4x4", &ctx->grid), 0);
	ctx->dynamic = 1;
	ctx->self_id = ME;
	ctx->rank = 0;
	ctx->npeers = 3;
	ctx->peers = calloc(3, sizeof(*ctx->peers));
	assert_non_null(ctx->peers);
	ctx->peers[0].id = ME;
	ctx->peers[1].id = THEM;
	ctx->peers[2].id = OTHER;
	ctx->dht = calloc(1, sizeof(*ctx->dht));
	assert_non_null(ctx->dht);
	ctx->dht->rdv = &fake_rdv;
	ctx->dht->mm_round = 10;
	ctx->dht->decl_round = 10;
	memset(&fk, 0, sizeof(fk));
	return ctx;
}

static void ctx_free(struct mp_ctx *ctx)
{
	free(ctx->dht->heard);
	free(ctx->dht);
	free(ctx->peers);
	free(ctx);
}

static void encode(uint8_t *p, uint64_t id, uint8_t mode, int16_t coord, uint32_t line)
{
	mp_le_put64(p, id);
	mp_le_put64(p + 8, 123456);
	p[16] = mode;
	mp_le_put16(p + 17, (uint16_t)coord);
	mp_le_put32(p + 19, line);
}

static int decl(struct mp_ctx *ctx, uint32_t round, uint64_t id, uint8_t mode, int16_t coord,
		uint32_t line)
{
	uint8_t p[DECL_LEN];
	struct mp_wire_hdr h = {.type = MP_MSG_DECL, .round = round, .length = DECL_LEN};

	encode(p, id, mode, coord, line);
	return mp_mm_on_decl(ctx, 1, &h, p);
}

/* Nothing learnt, kept, suspected or moved. */
static void unchanged(const struct mp_ctx *ctx)
{
	assert_int_equal(ctx->dht->decl_round, 10);
	assert_int_equal(ctx->dht->nheard, 0);
	assert_int_equal(fk.learnt + fk.refused, 0);
	for (int i = 0; i < ctx->npeers; i++)
		assert_int_equal(ctx->peers[i].failed_ns, 0);
	assert_int_equal(ctx->suspects, 0);
}

static void test_malformed_refused(void **state)
{
	struct mp_ctx *ctx = ctx_new();
	uint8_t p[DECL_LEN + 1] = {0};
	struct mp_wire_hdr h = {.type = MP_MSG_DECL, .round = 11};

	(void)state;
	/* Round 11 varies dimension 1: coordinates 0..3; lines are cells with y = 0. */
	for (uint32_t len = 0; len <= DECL_LEN + 1; len++) {
		if (len == DECL_LEN)
			continue;
		encode(p, THEM, MP_MODE_NORMAL, 1, 2);
		h.length = len;
		assert_int_equal(mp_mm_on_decl(ctx, 1, &h, p), -EBADMSG);
	}
	/* Another peer's declaration, sent by THEM. */
	assert_int_equal(decl(ctx, 11, OTHER, MP_MODE_NORMAL, 1, 2), -EBADMSG);
	assert_int_equal(decl(ctx, 11, ME, MP_MODE_NORMAL, 1, 2), -EBADMSG);
	/* Modes past moved-on. */
	assert_int_equal(decl(ctx, 11, THEM, MP_DECL_MOVED + 1, 1, UINT32_MAX), -EBADMSG);
	assert_int_equal(decl(ctx, 11, THEM, 255, 1, 2), -EBADMSG);
	/* A line outside the grid, a coordinate outside the dimension. */
	assert_int_equal(decl(ctx, 11, THEM, MP_MODE_NORMAL, 1, 16), -EBADMSG);
	assert_int_equal(decl(ctx, 11, THEM, MP_MODE_NORMAL, 1, UINT32_MAX), -EBADMSG);
	assert_int_equal(decl(ctx, 11, THEM, MP_MODE_NORMAL, 4, 2), -EBADMSG);
	assert_int_equal(decl(ctx, 11, THEM, MP_MODE_NORMAL, -1, 2), -EBADMSG);
	/* Placing and moving on are in no line, and only the peer's own. */
	assert_int_equal(decl(ctx, 11, THEM, MP_DECL_PLACING, 0, 2), -EBADMSG);
	assert_int_equal(decl(ctx, 11, THEM, MP_DECL_MOVED, 0, 2), -EBADMSG);
	assert_int_equal(decl(ctx, 11, OTHER, MP_DECL_MOVED, 0, UINT32_MAX), -EBADMSG);
	/* An absence names somebody, in no line, at coordinate 0. */
	assert_int_equal(decl(ctx, 11, 0, MP_DECL_ABSENT, 0, UINT32_MAX), -EBADMSG);
	assert_int_equal(decl(ctx, 11, OTHER, MP_DECL_ABSENT, 0, 3), -EBADMSG);
	assert_int_equal(decl(ctx, 11, OTHER, MP_DECL_ABSENT, 1, UINT32_MAX), -EBADMSG);
	unchanged(ctx);
	ctx_free(ctx);
}

/* We are not dead because a peer says so: its view of our connection is older. */
static void test_absence_of_self_ignored(void **state)
{
	struct mp_ctx *ctx = ctx_new();

	(void)state;
	assert_int_equal(decl(ctx, 10, ME, MP_DECL_ABSENT, 0, UINT32_MAX), -ESTALE);
	unchanged(ctx);
	ctx_free(ctx);
}

/* A member saw OTHER die: so do we, and the round's key takes the absence. */
static void test_absence_of_other_taken(void **state)
{
	struct mp_ctx *ctx = ctx_new();

	(void)state;
	fk.held[0] = "r10/all";
	assert_int_equal(decl(ctx, 10, OTHER, MP_DECL_ABSENT, 0, UINT32_MAX), 0);
	assert_true(ctx->peers[2].failed_ns > 0);
	assert_int_equal(ctx->peers[1].failed_ns, 0);
	assert_int_equal(fk.learnt, 1);
	assert_string_equal(fk.last_key, "r10/all");
	assert_int_equal(fk.last.id, OTHER);
	assert_int_equal(fk.last.mode, MP_DECL_ABSENT);
	/* An absence says nothing of where the run is. */
	assert_int_equal(ctx->dht->decl_round, 10);
	ctx_free(ctx);
}

/* THEM declares at (x=2, y=1) for round 11 (dimension 1 varies): line 2. */
static void test_own_declaration_taken(void **state)
{
	struct mp_ctx *ctx = ctx_new();

	(void)state;
	ctx->dht->mm_round = 11;
	fk.held[0] = "r11/all";
	fk.held[1] = "r11/d1/2.*";
	assert_int_equal(decl(ctx, 11, THEM, MP_MODE_NORMAL, 1, 2), 0);
	assert_int_equal(fk.learnt, 2);
	assert_int_equal(fk.refused, 0);
	assert_string_equal(fk.last_key, "r11/d1/2.*");
	assert_int_equal(fk.last.id, THEM);
	assert_int_equal(fk.last.coord, 1);
	assert_int_equal(fk.last.line, 2);
	assert_int_equal(fk.last.expires_ms, 123456);
	assert_int_equal(ctx->dht->decl_round, 11);
	assert_int_equal(ctx->dht->nheard, 0);
	ctx_free(ctx);
}

/*
 * THEM was placing itself in round 10 and moves on to a later one: the
 * round's key takes it (it replaces THEM's "placing" there, so that leaders
 * stop waiting, rdv_dht's decl_store), THEM is not taken as dead, and it
 * says nothing of where the run is.
 */
static void test_moved_on_taken(void **state)
{
	struct mp_ctx *ctx = ctx_new();

	(void)state;
	fk.held[0] = "r10/all";
	assert_int_equal(decl(ctx, 10, THEM, MP_DECL_MOVED, 0, UINT32_MAX), 0);
	assert_int_equal(fk.learnt, 1);
	assert_string_equal(fk.last_key, "r10/all");
	assert_int_equal(fk.last.id, THEM);
	assert_int_equal(fk.last.mode, MP_DECL_MOVED);
	assert_int_equal(ctx->peers[1].failed_ns, 0);
	assert_int_equal(ctx->suspects, 0);
	assert_int_equal(ctx->dht->decl_round, 10);
	ctx_free(ctx);
}

/* Declarations for rounds ahead wait for them, once per (round, id), newest kept. */
static void test_ahead_kept_once(void **state)
{
	struct mp_ctx *ctx = ctx_new();

	(void)state;
	assert_int_equal(decl(ctx, 12, THEM, MP_MODE_NORMAL, 3, 1), 0);
	assert_int_equal(decl(ctx, 12, THEM, MP_MODE_NORMAL, 2, 1), 0);
	assert_int_equal(ctx->dht->nheard, 1);
	assert_int_equal(ctx->dht->heard[0].round, 12);
	assert_int_equal(ctx->dht->heard[0].d.coord, 2);
	assert_int_equal(ctx->dht->decl_round, 12);
	/* A placing peer aims ahead: kept, but it does not move the run. */
	assert_int_equal(decl(ctx, 20, THEM, MP_DECL_PLACING, 0, UINT32_MAX), 0);
	assert_int_equal(ctx->dht->nheard, 2);
	assert_int_equal(ctx->dht->decl_round, 12);
	/* Rounds we are done with are forgotten. */
	assert_int_equal(decl(ctx, 9, THEM, MP_MODE_NORMAL, 0, 0), -ESTALE);
	assert_int_equal(ctx->dht->nheard, 2);
	/* Bounded: the oldest goes. */
	for (uint32_t r = 100; r < 100 + MP_HEARD_MAX; r++)
		assert_int_equal(decl(ctx, r, THEM, MP_MODE_NORMAL, 0, 0), 0);
	assert_int_equal(ctx->dht->nheard, MP_HEARD_MAX);
	assert_int_equal(ctx->dht->heard[0].round, 100);
	assert_int_equal(ctx->dht->heard[MP_HEARD_MAX - 1].round, 100 + MP_HEARD_MAX - 1);
	assert_int_equal(fk.learnt, 0);
	ctx_free(ctx);
}

/* PEER: the record goes to the rendezvous, whose refusal is the sender's fault. */
static void test_peer_record(void **state)
{
	struct mp_ctx *ctx = ctx_new();
	uint8_t rec[40] = {1, 2, 3};
	struct mp_wire_hdr h = {.type = MP_MSG_PEER, .round = 10, .length = sizeof(rec)};

	(void)state;
	assert_int_equal(mp_mm_on_peer(ctx, &h, rec), 0);
	assert_int_equal(fk.records, 1);
	fk.record_rc = -EACCES; /* a MAC that does not verify */
	assert_int_equal(mp_mm_on_peer(ctx, &h, rec), -EBADMSG);
	fk.record_rc = -EPROTO; /* another run's record */
	assert_int_equal(mp_mm_on_peer(ctx, &h, rec), -EBADMSG);
	assert_int_equal(fk.records, 3);
	/* A rendezvous that cannot take records (static runs). */
	ctx->dht->rdv = &mp_rdv_static_ops;
	assert_int_equal(mp_mm_on_peer(ctx, &h, rec), -ENOTSUP);
	assert_int_equal(fk.records, 3);
	ctx_free(ctx);
}

/* A placer's check that the line it is about to take went on without it:
 * a member of that line heard declaring in a line of a later round. */
static void test_line_went_on(void **state)
{
	struct mp_ctx *ctx = ctx_new();
	/* Round 10's declarations: THEM in line 4, OTHER in line 8. */
	const struct mp_decl all[] = {
		{.id = THEM, .mode = MP_MODE_NORMAL, .coord = 1, .line = 4},
		{.id = OTHER, .mode = MP_MODE_NORMAL, .coord = 2, .line = 8},
		{.id = ME, .mode = MP_MODE_NORMAL, .coord = 3, .line = 4},
	};

	(void)state;
	assert_false(mp_mm_line_went_on(ctx, 10, 4, all, 3));
	/* Placing itself in round 11, or moved on: in no line, not gone on. */
	assert_int_equal(decl(ctx, 11, THEM, MP_DECL_PLACING, 0, UINT32_MAX), 0);
	assert_false(mp_mm_line_went_on(ctx, 10, 4, all, 3));
	/* In a line of round 11: its line of round 10 went on. */
	assert_int_equal(decl(ctx, 11, THEM, MP_MODE_NORMAL, 1, 2), 0);
	assert_true(mp_mm_line_went_on(ctx, 10, 4, all, 3));
	assert_false(mp_mm_line_went_on(ctx, 10, 8, all, 3));
	assert_false(mp_mm_line_went_on(ctx, 11, 4, all, 3));
	assert_false(mp_mm_line_went_on(ctx, 10, 4, all, 0));
	ctx_free(ctx);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_line_went_on),
		cmocka_unit_test(test_malformed_refused),
		cmocka_unit_test(test_absence_of_self_ignored),
		cmocka_unit_test(test_absence_of_other_taken),
		cmocka_unit_test(test_own_declaration_taken),
		cmocka_unit_test(test_moved_on_taken),
		cmocka_unit_test(test_ahead_kept_once),
		cmocka_unit_test(test_peer_record),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
