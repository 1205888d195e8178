/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The contribution log (MP_CONTRIB_LOG, cfg.contrib_log): one line per event
 * of this peer's rounds, appended with a single write(2) each (O_APPEND), so
 * a killed peer never leaves half a line and the rounds can be replayed
 * exactly. Ids are %016llx, weights and sums C99 hex floats (%a) of the fp32
 * values used:
 *
 *   begin round=R group=G self=ID index=I size=K weight=W roster=ID:LEN:M,...
 *   reduce round=R group=G part=I off=O len=L wsum=S contrib=ID:W,...
 *   apply round=R group=G part=J status=applied|own
 *   end round=R group=G weight=W
 *   alone round=R
 *   restore round=R from=F
 *
 * G is %08x; the roster lists the members in part order with their part
 * lengths and modes (n normal, c client, a aux). A reducer writes "reduce"
 * once its part is summed, before the first result leaves, listing the
 * contributions used, in member order (its own included). "apply" comes at
 * the end of the round for every part this peer expected a result for.
 * "restore" follows the last round of an average given up in round R
 * (-EBADE, -EMSGSIZE) after earlier rounds wrote the buffer: the values and
 * the weight are back to what they were before round F, the average's
 * first; round R's own begin and end then say nothing of its parts.
 */
#ifndef MP_CLOG_H
#define MP_CLOG_H

#include <stdint.h>

struct mp_ctx;
struct mp_group;

/* mp_init: open cfg.contrib_log for appending when set (and forget the
 * string, which the caller owns); ctx->clog_fd stays -1 otherwise.
 * Returns 0, or a negative errno with the init error set. */
int mp_clog_open(struct mp_ctx *ctx);
/* mp_finalize. */
void mp_clog_close(struct mp_ctx *ctx);

/* A group all-reduce starts: @lens and @modes (NULL: all normal) per member. */
void mp_clog_begin(struct mp_ctx *ctx, uint32_t round, const struct mp_group *g, float weight,
		   const uint64_t *lens, const uint8_t *modes);
/* Our part [@off, @off + @len) is reduced from the @n contributions of
 * members @who (member indices, ascending) with weights @w, Σ @wsum. */
void mp_clog_reduce(struct mp_ctx *ctx, uint32_t round, const struct mp_group *g, uint64_t off,
		    uint64_t len, float wsum, int n, const int *who, const float *w);
/* Part @part: its result applied, or our own values kept. */
void mp_clog_apply(struct mp_ctx *ctx, uint32_t round, const struct mp_group *g, int part,
		   int applied);
void mp_clog_end(struct mp_ctx *ctx, uint32_t round, const struct mp_group *g, float weight);
/* No group formed in @round: values and weight kept. */
void mp_clog_alone(struct mp_ctx *ctx, uint32_t round);
/* The average was given up in @round and its values and weight are put back
 * as they were before round @from, its first. */
void mp_clog_restore(struct mp_ctx *ctx, uint32_t round, uint32_t from);

#endif
