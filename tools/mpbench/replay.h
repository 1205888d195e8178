/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Replay of contribution logs (MP_CONTRIB_LOG, doc/control-plane.md): from
 * every peer's initial values and its log, recompute in double precision what
 * each peer must hold after every round, so that a run with churn can be
 * checked element by element.
 *
 * A reducer's result for part i of a group is sum(w * x) / sum(w) over the
 * contributors its 'reduce' line lists, with their values at the start of
 * the round; every member that logged 'apply ... status=applied' for the part
 * takes it, 'own' keeps its values, and the reducer holds the result of its
 * own part. Aux members change nothing. A value that cannot be derived (an
 * unknown contributor, a missing reduce line, a peer that logged a round it
 * did not finish) is NaN, so it never matches a peer's value.
 *
 * Logs may end early: a peer killed mid-round leaves a 'begin' without an
 * 'end'; it is dead from then on. An unterminated last line is ignored.
 */
#ifndef MPBENCH_REPLAY_H
#define MPBENCH_REPLAY_H

#include <stddef.h>
#include <stdint.h>

struct replay;

/* Element-wise comparison of a peer's values with the replay. */
struct replay_cmp {
	int64_t wrong;   /* elements beyond the tolerance (NaN counts) */
	int64_t checked; /* elements compared */
	double max_err;  /* largest |x - replay| (infinity when one is NaN) */
};

/* A replay of vectors of @count values; NULL when out of memory. */
struct replay *replay_new(size_t count);
void replay_free(struct replay *rp);

/* Initial values of peer @id (@count floats), held until its first round.
 * -EEXIST if @id was added before, -ENOMEM. */
int replay_add_peer(struct replay *rp, uint64_t id, const float *x0);

/*
 * The contribution log of peer @id (the text of its file). Lines of unknown
 * kinds and unknown fields are skipped; malformed lines are counted as
 * problems. 0, or -ENOMEM.
 */
int replay_add_log(struct replay *rp, uint64_t id, const char *text, size_t len);

/* The same from a file; a missing file is an empty log. 0 or negative errno. */
int replay_add_log_file(struct replay *rp, uint64_t id, const char *path);

/* Replay every round, in order. 0, or -ENOMEM. Call once, after every
 * peer and log was added. */
int replay_run(struct replay *rp);

/* Values of @id after its last logged round (NaN where unknown); NULL for a
 * peer never added. */
const double *replay_values(const struct replay *rp, uint64_t id);

/*
 * Compare @x (@count floats, the values peer @id reported) with the replay:
 * an element is wrong when |x - r| > max(atol, rtol * |r|) or either is NaN.
 * -ENOENT for a peer never added.
 */
int replay_compare(const struct replay *rp, uint64_t id, const float *x, double rtol,
		   double atol, struct replay_cmp *out);

/* Rounds in which @id's own log shows it in a group of two or more. */
int replay_groups(const struct replay *rp, uint64_t id);

/* Whether another peer's log names @id in a roster or among contributions. */
int replay_named_by_others(const struct replay *rp, uint64_t id);

/* One more than the highest round in any log (0 with no rounds). */
uint32_t replay_rounds(const struct replay *rp);

/* Inconsistencies found (lines that contradict each other or are malformed),
 * and the first one in words ("" when none). */
int64_t replay_problems(const struct replay *rp);
const char *replay_first_problem(const struct replay *rp);

#endif
