/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Butterfly all-reduce inside one group of k peers (the Moshpit round and the
 * `butterfly` baseline). The vector is cut into k parts, sized from the
 * members' bandwidths by DeDLOC's linear program (mp_balance_parts); member i
 * reduces part i. Every part streams in chunks:
 *
 *   reduce-scatter  each contributing member sends chunk c of part j to
 *                   member j (SCATTER); the reducer decodes it into that
 *                   member's own slot
 *   all-gather      once every contributing member has delivered its whole
 *                   part or failed, the reducer sums the complete
 *                   contributions and sends the result back (GATHER)
 *
 * Chunk c of any part travels on stream c mod S, so both ends know which
 * frame comes next on each connection and can check it exactly.
 *
 * Parts are atomic under churn. A reducer counts a member only if it
 * delivered every chunk of the part; the sum then runs in member order, so
 * the result does not depend on arrival order or timing. A member applies a
 * part only if every chunk of its result arrived; otherwise the part keeps
 * this peer's values from the start of the round. No peer ever holds half a
 * part, and the contribution log (clog.h) names exactly which contributions
 * each part holds.
 *
 * Modes (DeDLOC): a client member reduces nothing (bandwidth 0, no part) but
 * contributes and takes the results. An aux member is, inside a group, a
 * member like any other: it averages at weight 0 (moshpit.h), so what it
 * sends in its first round counts for nothing, and what it holds after a
 * round weighs like anyone's. Were it to keep its buffer
 * instead (DeDLOC's one all-reduce), its cell would be a hole in every later
 * round, and a grid with aux peers would not reach the exact mean in d
 * rounds. Every member derives the same plan from the roster.
 *
 * Weights: a part's result is Σ w·x / Σ w over its contributions, and each
 * member leaves with the mean weight Σ w / contributors of its own part if
 * it reduced one, else of the lowest part it applied. Averaging the pairs
 * (w·x, w) like this keeps the totals Σ w·x and Σ w over all peers unchanged,
 * so repeated rounds converge to the exact weighted global mean on any grid,
 * and a full grid without failures reaches it after d rounds.
 *
 * Memory, beyond the engine's slots (both in mp_scratch, kept between
 * rounds):
 *  - MP_SCR_REDUCE: the reducer keeps each other contributor's decoded part
 *    until the part is complete, (contributors - 1) × its part length: for
 *    equal parts (k-1)/k of the vector; more for a reducer whose bandwidth
 *    earns it a larger part.
 *  - MP_SCR_STAGE: the vector less its own part. With codec none a member
 *    decodes the results into it and copies each complete part into the
 *    buffer at the end of the round: its zero-copy sends read the buffer
 *    itself. With the other codecs a send is encoded into a slot as it is
 *    made, and the member saves its values of each chunk there as it sends
 *    it; a result that comes only after all of ours to its reducer went
 *    (always, but for a peer out of protocol) is decoded straight into the
 *    buffer, and the saved values go back over any part not applied. The
 *    copy is then made while the link carries the contributions, not after
 *    the last result, when every member of the group makes it at once.
 *    Sparse codecs also save the residue of the parts sent (the same size
 *    again), to restore it for a part that is not applied.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "clog.h"
#include "devpath.h"
#include "fault.h"
#include "xfer.h"
#include "mp_kernels.h"
#include "log.h"

struct gchan {
	int j;                 /* member index of the channel's peer */
	uint64_t scat_next;    /* next chunk of part j we send (SCATTER) */
	uint64_t gath_next;    /* next chunk of our part we return (GATHER) */
	uint64_t rscat_next;   /* next chunk of our part expected from j */
	uint64_t rgath_next;   /* next chunk of part j expected back from j */
	/* the device path: the message being made ready in a ring slot */
	struct mp_ring_slot *prep;
	struct mp_wire_hdr ph; /* its header, as produce will return it */
	size_t plen;           /* its payload's length */
};

struct gmember {
	uint64_t off, len, nch; /* its part */
	uint64_t got;           /* chunks of our part it delivered */
	uint64_t gotg;          /* chunks of its part's result it returned */
	float w;                /* the weight its contribution carries */
	float gw;               /* its result: Σ w ... */
	uint32_t gn;            /* ... over this many contributions, */
	uint32_t gl;            /* ... this many more left out as non-finite */
	int slot;               /* its contribution's slot in cbuf, or -1 */
	uint8_t mode;           /* enum mp_mode, as agreed in the roster */
	uint8_t failed;
	uint8_t stalled, cut;   /* fault injection: send nothing more / drop it */
	uint8_t nonfinite;      /* MP_CHECK_FINITE: its contribution to our part held NaN or
	                           infinity, and is left out; its results say so */
	uint8_t malformed;      /* the device path: a payload of its contribution to our part
	                           failed to decode on the device */
	uint8_t bad_result;     /* ... a payload of its part's result did */
	uint8_t direct;         /* its part's result is decoded into the buffer, ours saved in
	                           stage (in_place) */
};

struct gar {
	struct mp_ctx *ctx;
	const struct mp_xfer *x;
	const struct mp_group *g;
	struct mp_avg *a;
	uint32_t round;
	int k, me, S;
	size_t C;
	struct gmember *mb;    /* per member */
	struct gchan *gc;      /* per channel */
	struct mp_chan *ch;
	uint32_t ncontributors; /* members that contribute: all of them (aux at weight 0) */
	uint32_t plan;         /* plan hash: SCATTER's aux (mp_plan_hash) */
	/* our part */
	float *cbuf;           /* slots of len[me] values, one per other contributor */
	int *who;              /* contributions used, member order */
	float *whow;           /* ... and their weights */
	int nused;
	int nleft;             /* contributions left out as non-finite (MP_CHECK_FINITE) */
	float wsum;
	int done;              /* reduced (the device path), or the contributions chosen (the host
	                          path): the results may go */
	uint64_t red_next;     /* the host path: chunks of our part summed so far (reduce_upto) */
	int recipients;        /* ... members that take our result */
	int folded;            /* our residue went into the part (sparse codecs) */
	uint8_t *enc;          /* lossy codecs: each chunk of the result, encoded once for all */
	uint32_t *enc_len;
	size_t enc_cap;
	float *rtmp;           /* sparse codecs: what the result's encoding held back */
	/* the others' parts */
	float *stage;          /* their results, compact (our part left out) */
	float *esave;          /* sparse codecs: residue of the parts we send, as it was */
	/* fault injection: frames sent in this round, per phase (scatter, gather) */
	uint64_t sent[2];
	int refused;           /* a reducer left our contribution out as non-finite */
	int unseen;            /* members some reducer dropped that we kept (finish) */
	/* the device path (a->dev, devpath.h): the round's device memory */
	struct mp_stage *ds;
	struct mp_xfer *xw;    /* the exchange, to abort it on a device failure */
	float *dcb;            /* as cbuf */
	float *dsum, *dres;    /* our part's weighted sum, and its result */
	uint8_t *denc;         /* our result, encoded, chunk c at c * enc_cap */
	float *dstage;         /* as stage */
	uint32_t *dstat;       /* decode status: member m's contribution at m, its result at k + m */
	void *dscr_enc, *dscr_dec;
	size_t enc_scr, dec_scr;
	/* sparse codecs: a->residue is device memory too */
	float *dfold;          /* our contribution with its residue folded in */
	float *drt;            /* what the result's encoding held back, our part */
	float *desave;         /* as esave */
	float *dtmp;           /* one chunk, for dev_scale */
	int refilled;          /* drt holds what goes back into our residue */
	struct mp_ring_slot *stat_slot; /* the status words on their way to the host */
	int reducing;          /* every contribution is in: the status read is queued */
	int dev_err;           /* a device call failed: the exchange is aborted */
};

/* Chunks at or after @next on the stream of @next's residue. */
static uint64_t left_from(uint64_t nch, uint64_t next, int S)
{
	return nch > next ? (nch - next + (uint64_t)S - 1) / (uint64_t)S : 0;
}

static uint32_t chunk_count(const struct gar *r, int member, uint64_t c)
{
	uint64_t start = c * r->C;
	uint64_t n = r->mb[member].len - start;
	return (uint32_t)(n < r->C ? n : r->C);
}

/* We send our values of part j to its reducer j and take its result back. */
static int sends_to(const struct gar *r, int j)
{
	return j != r->me && r->mb[j].len > 0;
}

/* Member m sends us its values of our part and takes our result back. */
static int serves(const struct gar *r, int m)
{
	return m != r->me && r->mb[r->me].len > 0;
}

/* Part j's result reached us whole and well: it is applied. */
static int applied(const struct gar *r, int j)
{
	const struct gmember *mj = &r->mb[j];

	return sends_to(r, j) && mj->gotg == mj->nch && !mj->bad_result;
}

/* Results decoded straight into the buffer (MP_SCR_STAGE above). */
static int in_place(const struct gar *r)
{
	return !r->ds && r->a->codec->id != MP_CODEC_NONE;
}

/* Every chunk of our values of part j has gone to its reducer (been
 * encoded, and saved). */
static int all_sent_to(const struct gar *r, int j)
{
	for (int i = 0; i < r->x->nch; i++)
		if (r->gc[i].j == j && r->gc[i].scat_next < r->mb[j].nch)
			return 0;
	return 1;
}

/* Where part j sits in the compact staging (everything but our own part). */
static uint64_t stage_off(const struct gar *r, int j)
{
	return r->mb[j].off - (j > r->me ? r->mb[r->me].len : 0);
}

/*
 * Part j ends the round applied or not. The staging holds what the buffer
 * must then hold exactly when that differs from where the results went:
 * the results, staged (codec none), of a part applied; our saved values
 * of a part whose results were decoded in place but that is not applied.
 */
static void settle_part(struct gar *r, int j, int apply)
{
	const struct gmember *mj = &r->mb[j];

	if (apply != mj->direct)
		memcpy(r->a->x + mj->off, r->stage + stage_off(r, j), mj->len * sizeof(float));
}

static uint64_t member_id(const struct gar *r, int m)
{
	return m == r->me ? r->ctx->self_id : r->ctx->peers[r->g->members[m]].id;
}

/* Contribution of member m to our part: our own values, or its slot. */
static float *contribution(struct gar *r, int m)
{
	if (m == r->me)
		return r->a->x + r->mb[m].off;
	return r->cbuf + (size_t)r->mb[m].slot * r->mb[r->me].len;
}

/* The contributions our part's result counts, in member order (r->who,
 * r->whow, r->nused, r->wsum); returns the members that take the result. */
static int select_contributions(struct gar *r)
{
	struct mp_ctx *ctx = r->ctx;
	const int me = r->me;
	const uint64_t nc = r->mb[me].nch;
	int recipients = 0;

	r->nused = 0;
	r->nleft = 0;
	r->wsum = 0.0f;
	for (int m = 0; m < r->k; m++) {
		if (m != me && (!serves(r, m) || r->mb[m].got < nc))
			continue;
		if (r->mb[m].nonfinite || r->mb[m].malformed) {
			/* A malformed payload is a bad frame: its member counts as
			 * dropped in the results, not as left out by choice. */
			r->nleft += !r->mb[m].malformed;
			/* Left out, not poisoning every member's result. */
			MP_WARN("round %u: left out peer %d's contribution to part %d: %s", r->round,
				m == me ? ctx->rank : r->g->members[m], me,
				r->mb[m].malformed ? "a payload of it failed to decode on the device" :
						     "it holds NaN or infinity (MP_CHECK_FINITE)");
			continue;
		}
		r->who[r->nused] = m;
		r->whow[r->nused] = m == me ? r->a->weight : r->mb[m].w;
		r->wsum += r->whow[r->nused];
		r->nused++;
		recipients += m != me && !r->mb[m].failed;
	}
	return recipients;
}

/* A GATHER's aux: the contributions our part's result holds, and above
 * bit 16 those left out as non-finite, so that a member can tell the ones
 * we dropped (protocol.md, "SCATTER and GATHER"). */
static uint32_t gather_aux(const struct gar *r)
{
	return (uint32_t)r->nused | (uint32_t)r->nleft << 16;
}

static void dev_begin_reduce(struct gar *r);

/* The i-th contribution the reducer uses, from the chunk at @off on. */
struct used_at {
	struct gar *r;
	uint64_t off;
};

static float *used_contribution_at(void *arg, int i)
{
	struct used_at *u = arg;

	return contribution(u->r, u->r->who[i]) + u->off;
}

/*
 * Every contributor has delivered our whole part or failed: decide which
 * contributions the result holds (in member order) and log it. The sum
 * itself runs a chunk at a time (reduce_upto), as the results leave:
 * the first result goes out after one chunk's sum and encoding, not the
 * whole part's, and the rest is summed while the link carries the chunks
 * before it. Every kernel here works element by element, so the bits are
 * those of one sum over the whole part.
 */
static void reduce_begin(struct gar *r)
{
	struct mp_ctx *ctx = r->ctx;
	const int me = r->me;
	const uint64_t L = r->mb[me].len, o = r->mb[me].off;
	const float *x = r->a->x + o;

	if (ctx->cfg.check_finite)
		for (uint64_t i = 0; i < L && !r->mb[me].nonfinite; i++)
			r->mb[me].nonfinite = !isfinite(x[i]);
	r->recipients = select_contributions(r);
	/* Our own contribution reaches the result without the wire: it
	 * carries its held-back residue along in full (mass moves, none is
	 * lost); reduce_upto folds it in chunk by chunk. */
	r->folded = r->nused > 1 && r->a->residue;
	r->red_next = 0;
	/* Logged before the first result can leave. */
	mp_clog_reduce(ctx, r->round, r->g, o, L, r->wsum, r->nused, r->who, r->whow);
	r->done = 1;
}

/*
 * Sum chunks of our part up to and including @upto (reduce_begin chose
 * the contributions): the weighted mean in member order, Σ w·x / Σ w. The
 * sum of one contribution is its values as they are, and a part with
 * Σ w = 0 keeps our own values, so a peer nobody reached keeps its values
 * bit for bit.
 */
static void reduce_upto(struct gar *r, uint64_t upto)
{
	struct mp_ctx *ctx = r->ctx;
	struct mp_avg *a = r->a;
	const struct mp_codec_ops *codec = a->codec;
	const int me = r->me;
	const uint64_t o = r->mb[me].off, nc = r->mb[me].nch;
	int lossy = codec->id != MP_CODEC_NONE && r->recipients;
	int refill = (codec->flags & MP_CODEC_F_SPARSE) && a->residue;
	void *scr = NULL;

	if (!nc)
		return;
	if (upto >= nc)
		upto = nc - 1;
	if (lossy && codec->scratch_size)
		scr = mp_scratch(ctx, MP_SCR_ENCODE, codec->scratch_size(&ctx->cparams, ctx->chunk_elems));
	for (; r->done && r->red_next <= upto; r->red_next++) {
		const uint64_t c = r->red_next;
		const uint32_t n = chunk_count(r, me, c);
		float *xc = a->x + o + c * r->C;
		struct used_at u = {.r = r, .off = c * r->C};

		if (r->folded) {
			mp_k_axpy(xc, a->residue + o + c * r->C, 1.0f, n);
			memset(a->residue + o + c * r->C, 0, n * sizeof(float));
		}
		if (r->wsum > 0.0f && r->nused > 1) {
			/* Accumulated in place in the first contribution (ours is
			 * in the buffer, which takes the result anyway). */
			mp_k_wmean(xc, r->nused, r->whow, r->wsum, n, used_contribution_at, &u);
		} else if (r->wsum > 0.0f && r->who[0] != me) {
			memcpy(xc, used_contribution_at(&u, 0), n * sizeof(float));
		}
		if (!lossy)
			continue;
		/*
		 * Members receive the encoded result; the reducer keeps exactly
		 * what they decode, so the whole group holds identical values.
		 * Encoded once here and sent to every member as it is.
		 *
		 * Sparse codecs: what the result's encoding leaves out is lost to
		 * all nused members that take it, each with weight wsum/nused.
		 * The reducer keeps that whole mass in its own residue (nused
		 * times the difference, at its new weight), so Σ w·(x + residue)
		 * over all peers is unchanged by the round (doc/codecs.md).
		 */
		uint8_t *e = r->enc + c * r->enc_cap;
		float *res = refill ? r->rtmp : NULL;
		size_t len = 0;

		if (res)
			memset(res, 0, n * sizeof(float));
		if ((codec->scratch_size && !scr) ||
		    codec->encode(&ctx->cparams, xc, res, n, e, r->enc_cap, &len, scr) ||
		    codec->decode(e, len, xc, n)) {
			/* Cannot happen with a buffer of max_encoded bytes; if
			 * it does, members get a frame they will reject, not
			 * garbage. */
			MP_WARN("round %u: encoding a reduced chunk failed", r->round);
			len = 0;
		}
		r->enc_len[c] = (uint32_t)len;
		if (res)
			mp_k_axpy(a->residue + o + c * r->C, res, (float)r->nused, n);
	}
}

static void try_reduce(struct gar *r)
{
	/* Not before every member's OPEN has shown that it averages our
	 * length: the sum is written into the buffer. */
	if (r->done || r->reducing || !r->mb[r->me].len || r->x->unopened > 0 || r->x->fatal)
		return;
	for (int m = 0; m < r->k; m++)
		if (serves(r, m) && !r->mb[m].failed && r->mb[m].got < r->mb[r->me].nch)
			return;
	if (r->ds)
		dev_begin_reduce(r);
	else
		reduce_begin(r);
}

static struct gchan *gchan_of(struct gar *r, struct mp_chan *ch)
{
	return &r->gc[ch - r->ch];
}

/* Fault injection: apply what is due before a frame of @phase goes out. */
static void faults_due(struct gar *r, int phase)
{
	const struct mp_fault *f;

	if (!r->ctx->faults)
		return;
	while ((f = mp_fault_due(r->ctx, r->round, phase, r->sent[phase - MP_FAULT_SCATTER])))
		for (int m = 0; m < r->k; m++)
			if (m != r->me && (f->all_peers || member_id(r, m) == f->peer)) {
				if (f->kind == MP_FAULT_STALL)
					r->mb[m].stalled = 1;
				else
					r->mb[m].cut = 1;
			}
}

/* ---- the device path (a->dev, devpath.h) --------------------------------
 *
 * The same exchange, with the round's memory on the GPU: contributions are
 * decoded there as they land (a ring slot carries each payload across the
 * bus), the sum runs there in member order with the same roundings as
 * mp_k_wmean (so the result is the CPU's bit for bit: a sum starts from
 * -0.0, to which adding any value gives that value exactly, and the
 * division is the product with 1/Σw), the result is encoded there once,
 * and each message to send is encoded (or taken as it is) into a ring slot
 * and copied to the host, where the engine takes it once it is there. The
 * buffer is written only in finish, as in the host path.
 *
 * A payload the device finds malformed cannot be refused when it arrives
 * (the decode has not run yet): the decode writes nothing and sets its
 * member's status word, which the host reads before the sum (contribution
 * left out, with a warning) and before the results are applied (that part
 * not applied). Any failed device call aborts the exchange (-EIO): the
 * buffer is as the round found it.
 */

static void dev_fail(struct gar *r, int rc, const char *what)
{
	if (r->dev_err)
		return;
	r->dev_err = rc ? rc : -EIO;
	mp_set_error(r->ctx, "round %u: %s memory %p: %s failed on the device (%s): this peer "
		     "leaves the round, its buffer as the round found it", r->round,
		     r->ds->ops->name, r->ds->dev_base, what, mp_strerror(r->dev_err));
	r->xw->abort_err = -EIO;
}

/* A payload found malformed on the device: a rejected frame. */
static void dev_rejected(struct gar *r)
{
	MP_STAT_ADD(r->ctx->rejected[MP_REJ_UNEXPECTED], 1);
	r->a->res->frames_rejected++;
}

/* Status words: contributions at m, results at k + m, our own result's
 * check at 2k, one that stays 0 (sums of fp32) at 2k + 1, and with
 * MP_CHECK_FINITE member m's contribution holding NaN or infinity at
 * 2k + 2 + m. */
static size_t dev_nstat(const struct gar *r)
{
	return (size_t)(3 * r->k + 2);
}

static uint32_t *dev_finite_flag(const struct gar *r, int m)
{
	return r->dstat + 2 * r->k + 2 + m;
}

static uint32_t *dev_zero(const struct gar *r)
{
	return r->dstat + 2 * r->k + 1;
}

/* Every contribution is in: bring the status words to the host, then sum. */
static void dev_begin_reduce(struct gar *r)
{
	struct mp_stage *s = r->ds;
	struct mp_ring_slot *sl;

	if (r->reducing || r->dev_err)
		return;
	r->reducing = 1;
	sl = mp_dev_slot_wait(r->ctx, s);
	if (!sl) {
		dev_fail(r, -EIO, "waiting for a chunk buffer");
		return;
	}
	r->stat_slot = sl;
	if (r->ctx->cfg.check_finite &&
	    s->dp->k->nonfinite(&s->dev, r->a->x + r->mb[r->me].off, r->mb[r->me].len,
				dev_finite_flag(r, r->me), s->stream)) {
		dev_fail(r, -EIO, "checking this peer's part for NaN and infinity");
		return;
	}
	if (s->ops->copy_async(&s->dev, s->dp->hstatus, r->dstat, dev_nstat(r) * sizeof(uint32_t), 0,
			       s->stream) ||
	    mp_dev_slot_queued(s, sl, 1))
		dev_fail(r, -EIO, "reading the contributions' status");
}

/* Queue the sum of our part (the statuses are on the host). */
static void dev_reduce(struct gar *r)
{
	struct mp_ctx *ctx = r->ctx;
	struct mp_stage *s = r->ds;
	const struct mp_stage_dev_ops *o = s->ops;
	const struct mp_devk_ops *k = s->dp->k;
	const int me = r->me, codec = (int)r->a->codec->id;
	const uint64_t L = r->mb[me].len, off = r->mb[me].off, nc = r->mb[me].nch;
	float *xo = r->a->x + off;
	int rc = 0, recipients;

	for (int m = 0; m < r->k; m++) {
		if (m != me && serves(r, m) && r->mb[m].got == nc && s->dp->hstatus[m]) {
			/* Counted as the host path counts a frame it cannot decode. */
			r->mb[m].malformed = 1;
			dev_rejected(r);
		}
		if (s->dp->hstatus[2 * r->k + 2 + m])
			r->mb[m].nonfinite = 1;
	}
	mp_dev_slot_put(s, r->stat_slot);
	r->stat_slot = NULL;
	recipients = select_contributions(r);
	const float *own = xo;
	if (r->nused > 1 && r->a->residue) {
		/* As reduce_part: our residue joins our contribution (the
		 * buffer and the residue are written in dev_apply). */
		rc = o->copy_d2d(&s->dev, r->dfold, xo, L * sizeof(float), s->stream);
		if (!rc)
			rc = mp_dev_axpy(s, r->dfold, r->a->residue + off, L, 1.0f, dev_zero(r));
		own = r->dfold;
		r->folded = 1;
	}
	if (!rc && r->wsum > 0.0f && r->nused > 1) {
		rc = o->fill32(&s->dev, r->dsum, 0x80000000u, L, s->stream);
		for (int i = 0; !rc && i < r->nused; i++) {
			int m = r->who[i];
			const float *c = m == me ? own : r->dcb + (size_t)r->mb[m].slot * L;
			rc = mp_dev_axpy(s, r->dsum, c, L, r->whow[i], dev_zero(r));
		}
		if (!rc)
			rc = o->fill32(&s->dev, r->dres, 0x80000000u, L, s->stream);
		if (!rc)
			rc = mp_dev_axpy(s, r->dres, r->dsum, L, 1.0f / r->wsum, dev_zero(r));
	} else if (!rc) {
		/* One contribution, or Σ w = 0: ours, kept bit for bit. */
		const float *c = r->wsum > 0.0f && r->who[0] != me ?
			r->dcb + (size_t)r->mb[r->who[0]].slot * L : xo;
		rc = o->copy_d2d(&s->dev, r->dres, c, L * sizeof(float), s->stream);
	}
	if (!rc && codec != MP_CODEC_NONE && recipients) {
		/* As reduce_part: encoded once, and kept as members decode it;
		 * a sparse codec's leftover goes back into our residue (dev_apply). */
		r->refilled = r->drt != NULL;
		for (uint64_t c = 0; !rc && c < nc; c++) {
			uint32_t n = chunk_count(r, me, c);
			uint8_t *e = r->denc + c * r->enc_cap;
			float *rt = r->drt ? r->drt + c * r->C : NULL;
			size_t len = 0;

			if (rt)
				rc = o->fill32(&s->dev, rt, 0, n, s->stream);
			if (!rc)
				rc = k->encode(&s->dev, codec, &ctx->cparams, r->dres + c * r->C, rt, n,
					       e, r->enc_cap, &len, r->dscr_enc, r->enc_scr, s->stream);
			if (!rc)
				rc = k->decode(&s->dev, codec, e, len, r->dres + c * r->C, n, 0.0f, 0,
					       r->dstat + 2 * r->k, r->dscr_dec, r->dec_scr, s->stream);
			r->enc_len[c] = (uint32_t)len;
		}
	}
	if (rc) {
		dev_fail(r, rc, "the sum of this peer's part");
		return;
	}
	mp_clog_reduce(ctx, r->round, r->g, off, L, r->wsum, r->nused, r->who, r->whow);
	r->done = 1;
}

static int g_pump(void *op)
{
	struct gar *r = op;
	int busy = 0;

	if (!r->ds) {
		/* A chunk summed ahead of the results that wait for it. */
		if (!r->done || r->red_next >= r->mb[r->me].nch)
			return 0;
		reduce_upto(r, r->red_next);
		return r->red_next < r->mb[r->me].nch;
	}
	if (r->dev_err)
		return 0;
	if (r->reducing && !r->done) {
		int rc = mp_dev_slot_ready(r->ds, r->stat_slot);
		if (rc < 0)
			dev_fail(r, rc, "reading the contributions' status");
		else if (rc)
			dev_reduce(r);
		else
			busy = 1;
	}
	for (int i = 0; i < r->x->nch && !busy; i++)
		busy = r->gc[i].prep != NULL;
	return busy;
}

/* A payload arrived for @dst (device memory, @count values): in a ring
 * slot's twin (landed there, or across the bus), decoded there under
 * status word @st. -EBADMSG for a length the codec refuses (nothing
 * written); -EIO after dev_fail. */
static int dev_land(struct gar *r, const void *payload, size_t len, float *dst, uint32_t count,
		    uint32_t *st, uint32_t *finite)
{
	struct mp_stage *s = r->ds;
	struct mp_ring_slot *sl;
	int rc;

	if (r->dev_err)
		return -EIO;
	if (len > s->dp->slot_bytes)
		return -EBADMSG;
	rc = mp_dev_arrived(r->ctx, s, payload, len, &sl);
	if (!sl) {
		dev_fail(r, -EIO, "waiting for a chunk buffer");
		return -EIO;
	}
	if (!rc)
		rc = s->dp->k->decode(&s->dev, (int)r->a->codec->id, sl->dev, len, dst, count, 0.0f, 0,
				      st, r->dscr_dec, r->dec_scr, s->stream);
	if (!rc && finite)
		rc = s->dp->k->nonfinite(&s->dev, dst, count, finite, s->stream);
	/* The copy may be queued even when the decode was refused: the slot's
	 * host bytes stay busy until it has run. */
	if (mp_dev_slot_queued(s, sl, 0) && !rc)
		rc = -EIO;
	if (rc && rc != -EBADMSG)
		dev_fail(r, rc, "taking a chunk to the device");
	return rc;
}

/*
 * The device path's produce: the message chosen as the host path chooses
 * it, made ready in a ring slot first. Returns 1 with @h and @pl once it is
 * on the host (the engine copies it into its frame at once, so the slot is
 * free again), else 0.
 */
static int dev_produce(struct gar *r, struct gchan *gc, struct mp_wire_hdr *h,
		       struct mp_payload *pl)
{
	struct mp_stage *s = r->ds;
	const int codec = (int)r->a->codec->id;
	int me = r->me, j = gc->j, rc;

	if (r->dev_err)
		return 0;
	if (gc->prep) {
		rc = mp_dev_slot_ready(s, gc->prep);
		if (rc < 0)
			dev_fail(r, rc, "copying a chunk to the host");
		if (rc <= 0)
			return 0;
		*h = gc->ph;
		mp_dev_payload(s, gc->prep, gc->plen, pl);
		gc->prep = NULL;
		return 1;
	}
	int gather = r->done && serves(r, j) && gc->gath_next < r->mb[me].nch;
	int scatter = !gather && sends_to(r, j) && gc->scat_next < r->mb[j].nch;
	int phase = gather ? MP_FAULT_GATHER : MP_FAULT_SCATTER;
	struct mp_ring_slot *sl;

	if (!gather && !scatter)
		return 0;
	/* Half the ring at most for sends: receives must find slots. */
	if (s->dp->held >= MP_DEV_SLOTS / 2)
		return 0;
	faults_due(r, phase);
	if (r->mb[j].stalled || r->mb[j].cut)
		return 0;
	sl = mp_dev_slot_try(s);
	if (!sl)
		return 0;
	r->sent[phase - MP_FAULT_SCATTER]++;
	memset(&gc->ph, 0, sizeof(gc->ph));
	if (gather) {
		uint64_t c = gc->gath_next;
		gc->ph.type = MP_MSG_GATHER;
		gc->ph.part = (uint32_t)me;
		gc->ph.offset = r->mb[me].off + c * r->C;
		gc->ph.count = chunk_count(r, me, c);
		gc->ph.weight = r->wsum;
		gc->ph.aux = gather_aux(r);
		if (r->mb[j].nonfinite)
			gc->ph.flags = MP_WIRE_F_NONFINITE; /* the member learns why */
		gc->gath_next += (uint64_t)r->S;
		if (codec != MP_CODEC_NONE) {
			gc->plen = r->enc_len[c];
			rc = mp_dev_stage_out(s, sl, r->denc + c * r->enc_cap, gc->plen);
		} else {
			gc->plen = (size_t)gc->ph.count * sizeof(float);
			rc = mp_dev_stage_out(s, sl, r->dres + c * r->C, gc->plen);
		}
	} else {
		uint64_t c = gc->scat_next;
		gc->ph.type = MP_MSG_SCATTER;
		gc->ph.part = (uint32_t)j;
		gc->ph.offset = r->mb[j].off + c * r->C;
		gc->ph.count = chunk_count(r, j, c);
		gc->ph.weight = r->a->weight;
		gc->ph.aux = r->plan;
		gc->scat_next += (uint64_t)r->S;
		/* A sparse codec takes our error feedback of these values. */
		rc = mp_dev_chunk_out(s, codec, &r->ctx->cparams, r->a->x + gc->ph.offset,
				      r->a->residue ? r->a->residue + gc->ph.offset : NULL,
				      gc->ph.count, sl, &gc->plen, r->dscr_enc, r->enc_scr);
	}
	if (!rc)
		rc = mp_dev_slot_queued(s, sl, 1);
	if (rc) {
		mp_dev_slot_put(s, sl);
		dev_fail(r, rc, "making a chunk ready to send");
		return 0;
	}
	gc->prep = sl;
	return 0;
}

/* Nothing of the round is applied (given up, or the device failed): the
 * residue of the parts we sent goes back as it was, as the host path's
 * does. 0, or -EIO. */
static int dev_unsend(struct gar *r)
{
	struct mp_stage *s = r->ds;
	int rc = 0;

	for (int j = 0; !rc && j < r->k; j++)
		if (sends_to(r, j) && r->mb[j].len)
			rc = s->ops->copy_d2d(&s->dev, r->a->residue + r->mb[j].off,
					      r->desave + stage_off(r, j),
					      r->mb[j].len * sizeof(float), s->stream);
	return rc || mp_dev_sync(r->ctx, s, "the error feedback put back") ? -EIO : 0;
}

/* The round's device memory: 0, or -ENOMEM with the context's error set. */
static int dev_setup(struct gar *r, int nslots)
{
	struct mp_ctx *ctx = r->ctx;
	struct mp_stage *s = r->ds;
	const struct mp_devk_ops *k = s->dp->k;
	const int codec = (int)r->a->codec->id;
	const uint64_t L = r->mb[r->me].len, nc = r->mb[r->me].nch, rest = r->a->n - L;
	const int fb = r->a->residue != NULL; /* sparse codecs: error feedback */
	size_t sz[12];

	r->enc_scr = (k->enc_scratch(codec, &ctx->cparams, r->C) + 255) & ~(size_t)255;
	r->dec_scr = (k->dec_scratch(codec, s->dp->slot_bytes, r->C) + 255) & ~(size_t)255;
	sz[0] = (size_t)nslots * L * sizeof(float);                  /* dcb */
	sz[1] = L * sizeof(float);                                   /* dsum */
	sz[2] = L * sizeof(float);                                   /* dres */
	sz[3] = codec != MP_CODEC_NONE ? nc * r->enc_cap : 0;        /* denc */
	sz[4] = rest * sizeof(float);                                /* dstage */
	sz[5] = dev_nstat(r) * sizeof(uint32_t);                     /* dstat */
	sz[6] = r->enc_scr;
	sz[7] = r->dec_scr;
	sz[8] = fb ? L * sizeof(float) : 0;                          /* dfold */
	sz[9] = fb ? L * sizeof(float) : 0;                          /* drt */
	sz[10] = fb ? rest * sizeof(float) : 0;                      /* desave */
	sz[11] = fb ? r->C * sizeof(float) : 0;                      /* dtmp */
	void **at[12] = {(void **)&r->dcb, (void **)&r->dsum, (void **)&r->dres, (void **)&r->denc,
			 (void **)&r->dstage, (void **)&r->dstat, &r->dscr_enc, &r->dscr_dec,
			 (void **)&r->dfold, (void **)&r->drt, (void **)&r->desave,
			 (void **)&r->dtmp};
	if (mp_dev_carve(ctx, s, sz, at, 12))
		return -ENOMEM;
	int rc = s->ops->fill32(&s->dev, r->dstat, 0, dev_nstat(r), s->stream);
	/* As setup_memory: the residue of the parts we send, as it was. */
	for (int j = 0; !rc && r->desave && j < r->k; j++)
		if (sends_to(r, j) && r->mb[j].len)
			rc = s->ops->copy_d2d(&s->dev, r->desave + stage_off(r, j),
					      r->a->residue + r->mb[j].off,
					      r->mb[j].len * sizeof(float), s->stream);
	if (rc) {
		mp_set_error(ctx, "round %u: %s memory %p: setting the round up on the device failed",
			     r->round, s->ops->name, s->dev_base);
		return -EIO;
	}
	return 0;
}

/* After the exchange (not aborted): the statuses of the results to the
 * host, then the parts that arrived whole and well into the buffer. 0, or
 * -EIO with the context's error set (the buffer may then hold some parts). */
static int dev_apply(struct gar *r)
{
	struct mp_ctx *ctx = r->ctx;
	struct mp_stage *s = r->ds;
	const int me = r->me;
	const size_t nst = dev_nstat(r);
	int rc;

	rc = s->ops->copy_async(&s->dev, s->dp->hstatus, r->dstat, nst * sizeof(uint32_t), 0,
				s->stream) ? -EIO : 0;
	if (!rc)
		rc = mp_dev_sync(ctx, s, "the round's results");
	if (rc)
		return -EIO;
	/* Our own encoded result, decoded back so that we keep what members
	 * decode: a decode that fails writes nothing, so we keep the unrounded
	 * mean, as the host path does when its own encoding fails. */
	if (r->done && r->mb[me].len && s->dp->hstatus[2 * r->k])
		MP_WARN("round %u: this peer's own result of part %d failed to decode on the device: "
			"it keeps the unrounded mean there", r->round, me);
	for (int j = 0; j < r->k; j++) {
		struct gmember *mj = &r->mb[j];
		if (sends_to(r, j) && mj->gotg == mj->nch && s->dp->hstatus[r->k + j]) {
			MP_WARN("round %u: the result of part %d from peer %d failed to decode on the "
				"device: not applied", r->round, j, r->g->members[j]);
			mj->bad_result = 1;
			dev_rejected(r);
		}
	}
	for (int j = 0; !rc && j < r->k; j++) {
		const struct gmember *mj = &r->mb[j];
		if (applied(r, j))
			rc = s->ops->copy_d2d(&s->dev, r->a->x + mj->off, r->dstage + stage_off(r, j),
					      mj->len * sizeof(float), s->stream);
	}
	if (!rc && r->done && r->mb[me].len)
		rc = s->ops->copy_d2d(&s->dev, r->a->x + r->mb[me].off, r->dres,
				      r->mb[me].len * sizeof(float), s->stream);
	/* The error feedback, as reduce_part and finish leave it on the host:
	 * the parts not applied keep the residue they had; our own part's,
	 * folded into the sum, is what its result's encoding held back. */
	for (int j = 0; !rc && r->desave && j < r->k; j++)
		if (sends_to(r, j) && !applied(r, j))
			rc = s->ops->copy_d2d(&s->dev, r->a->residue + r->mb[j].off,
					      r->desave + stage_off(r, j),
					      r->mb[j].len * sizeof(float), s->stream);
	if (!rc && r->done && r->folded)
		rc = s->ops->fill32(&s->dev, r->a->residue + r->mb[me].off, 0, r->mb[me].len,
				    s->stream);
	if (!rc && r->done && r->refilled)
		rc = mp_dev_axpy(s, r->a->residue + r->mb[me].off, r->drt, r->mb[me].len,
				 (float)r->nused, dev_zero(r));
	if (!rc)
		rc = mp_dev_sync(ctx, s, "the round's results written to the buffer");
	else
		mp_set_error(ctx, "round %u: %s memory %p: queueing the copy of the results into the "
			     "buffer failed: it may hold some of this round's parts", r->round,
			     s->ops->name, s->dev_base);
	return rc ? -EIO : 0;
}

static int g_produce(void *op, struct mp_chan *ch, struct mp_wire_hdr *h, struct mp_payload *pl)
{
	struct gar *r = op;
	struct gchan *gc = gchan_of(r, ch);
	int me = r->me, j = gc->j;
	/* Results first: other members are waiting on them. */
	int gather = r->done && serves(r, j) && gc->gath_next < r->mb[me].nch;
	int scatter = !gather && sends_to(r, j) && gc->scat_next < r->mb[j].nch;
	int phase = gather ? MP_FAULT_GATHER : MP_FAULT_SCATTER;

	if (r->ds)
		return dev_produce(r, gc, h, pl);
	if (!gather && !scatter)
		return 0;
	faults_due(r, phase);
	if (r->mb[j].stalled || r->mb[j].cut)
		return 0;
	r->sent[phase - MP_FAULT_SCATTER]++;
	if (gather) {
		uint64_t c = gc->gath_next;
		reduce_upto(r, c);
		h->type = MP_MSG_GATHER;
		h->part = (uint32_t)me;
		h->offset = r->mb[me].off + c * r->C;
		h->count = chunk_count(r, me, c);
		h->weight = r->wsum;
		h->aux = gather_aux(r);
		if (r->mb[j].nonfinite)
			h->flags = MP_WIRE_F_NONFINITE; /* the member learns why */
		gc->gath_next += (uint64_t)r->S;
		if (r->a->codec->id != MP_CODEC_NONE) {
			/* Encoded once in reduce_part, for every member alike. */
			*pl = (struct mp_payload){.kind = MP_PAYLOAD_ENCODED,
						 .bytes = r->enc + c * r->enc_cap,
						 .len = r->enc_len[c]};
			return 1;
		}
		*pl = (struct mp_payload){.kind = MP_PAYLOAD_VALUES, .values = r->a->x + h->offset};
		return 1;
	}
	uint64_t c = gc->scat_next;
	h->type = MP_MSG_SCATTER;
	h->part = (uint32_t)j;
	h->offset = r->mb[j].off + c * r->C;
	h->count = chunk_count(r, j, c);
	h->weight = r->a->weight;
	h->aux = r->plan;
	*pl = (struct mp_payload){.kind = MP_PAYLOAD_VALUES, .values = r->a->x + h->offset};
	if (in_place(r))
		/* Encoded into the slot as soon as we return: our values of
		 * the chunk are saved, should its result not be applied. */
		memcpy(r->stage + stage_off(r, j) + c * r->C, r->a->x + h->offset,
		       h->count * sizeof(float));
	gc->scat_next += (uint64_t)r->S;
	return 1;
}

static int g_consume(void *op, struct mp_chan *ch, const struct mp_wire_hdr *h, const void *payload)
{
	struct gar *r = op;
	struct gchan *gc = gchan_of(r, ch);
	int me = r->me, j = gc->j;
	struct gmember *mj = &r->mb[j];

	if (r->dev_err)
		return 0; /* aborted: the engine closes every channel next */
	if (h->type == MP_MSG_SCATTER) {
		uint64_t c = gc->rscat_next;
		if (h->aux != r->plan && serves(r, j)) {
			/* The OPEN carries the plan too; this is the check
			 * of every contribution. */
			mp_xfer_plans_otherwise(r->ctx, "group all-reduce", r->round,
						r->g->members[j], h->aux, r->plan);
			return -EPROTO;
		}
		if (!serves(r, j) || c >= r->mb[me].nch || h->part != (uint32_t)me ||
		    h->offset != r->mb[me].off + c * r->C || h->count != chunk_count(r, me, c))
			return -EPROTO;
		/* A member has one weight in a round: all its chunks carry it. */
		if (mj->got && h->weight != mj->w)
			return -EPROTO;
		const size_t at = (size_t)mj->slot * r->mb[me].len + c * r->C;
		if (r->ds) {
			/* Decoded on the device; a malformed payload shows in its
			 * status word, before the sum. */
			int rc = dev_land(r, payload, h->length, r->dcb + at, h->count, &r->dstat[j],
					  r->ctx->cfg.check_finite ? dev_finite_flag(r, j) : NULL);
			if (rc)
				return rc == -EBADMSG ? -EPROTO : 0;
		} else {
			float *dst = r->cbuf + at;
			if (r->a->codec->decode(payload, h->length, dst, h->count))
				return -EPROTO;
			if (r->ctx->cfg.check_finite)
				for (uint32_t i = 0; i < h->count && !mj->nonfinite; i++)
					mj->nonfinite = !isfinite(dst[i]);
		}
		mj->w = h->weight;
		mj->got++;
		gc->rscat_next += (uint64_t)r->S;
		if (mj->got == r->mb[me].nch)
			try_reduce(r);
		return 0;
	}
	if (h->type == MP_MSG_GATHER) {
		uint64_t c = gc->rgath_next;
		uint32_t n = h->aux & 0xffffu, nl = h->aux >> 16;
		if (!sends_to(r, j) || c >= mj->nch || h->part != (uint32_t)j ||
		    h->offset != mj->off + c * r->C || h->count != chunk_count(r, j, c) || n < 1 ||
		    n + nl > r->ncontributors)
			return -EPROTO;
		/* One result: every chunk carries the same Σ w and counts. */
		if (mj->gotg && (h->weight != mj->gw || n != mj->gn || nl != mj->gl))
			return -EPROTO;
		/* Validated; staged until the whole part is in. */
		if (r->ds) {
			int rc = dev_land(r, payload, h->length, r->dstage + stage_off(r, j) + c * r->C,
					  h->count, &r->dstat[r->k + j], NULL);
			if (rc)
				return rc == -EBADMSG ? -EPROTO : 0;
		} else {
			if (!mj->gotg)
				mj->direct = in_place(r) && all_sent_to(r, j);
			float *dst = mj->direct ? r->a->x + mj->off : r->stage + stage_off(r, j);
			if (r->a->codec->decode(payload, h->length, dst + c * r->C, h->count))
				return -EPROTO;
		}
		mj->gw = h->weight;
		mj->gn = n;
		mj->gl = nl;
		mj->gotg++;
		r->refused |= (h->flags & MP_WIRE_F_NONFINITE) != 0;
		gc->rgath_next += (uint64_t)r->S;
		return 0;
	}
	return -EPROTO;
}

static uint64_t g_recv_left(void *op, struct mp_chan *ch)
{
	struct gar *r = op;
	struct gchan *gc = gchan_of(r, ch);
	int j = gc->j;

	return (serves(r, j) ? left_from(r->mb[r->me].nch, gc->rscat_next, r->S) : 0) +
	       (sends_to(r, j) ? left_from(r->mb[j].nch, gc->rgath_next, r->S) : 0);
}

static uint64_t g_send_left(void *op, struct mp_chan *ch)
{
	struct gar *r = op;
	struct gchan *gc = gchan_of(r, ch);
	int j = gc->j;

	/* The device path counts a message as sent once it is being made
	 * ready (gc->prep): until produce hands it over, it is still to send. */
	return (serves(r, j) ? left_from(r->mb[r->me].nch, gc->gath_next, r->S) : 0) +
	       (sends_to(r, j) ? left_from(r->mb[j].nch, gc->scat_next, r->S) : 0) +
	       (gc->prep != NULL);
}

static void g_peer_failed(void *op, int peer)
{
	struct gar *r = op;

	for (int m = 0; m < r->k; m++)
		if (m != r->me && r->g->members[m] == peer)
			r->mb[m].failed = 1;
	try_reduce(r);
}

static void g_opened(void *op)
{
	try_reduce(op);
}

static int g_drop(void *op, struct mp_chan *ch)
{
	struct gar *r = op;

	return r->mb[gchan_of(r, ch)->j].cut;
}

/*
 * A result cannot start before every contribution to its part is in, so a
 * member that owes us only its result (and waits for us to finish ours) may
 * be waiting on a third, silent member, which the reducer times out first.
 * What it can send on its own — its contribution, the rest of a result
 * under way — is due within the silence timeout.
 */
static int g_waits_on_others(void *op, struct mp_chan *ch)
{
	struct gar *r = op;
	struct gchan *gc = gchan_of(r, ch);
	int j = gc->j;

	if (serves(r, j) && gc->rscat_next < r->mb[r->me].nch)
		return 0;
	if (sends_to(r, j) && gc->scat_next < r->mb[j].nch)
		return 0;
	return !(sends_to(r, j) && r->mb[j].gotg && gc->rgath_next < r->mb[j].nch);
}

static const struct mp_xfer_ops gar_ops = {
	.produce = g_produce,
	.consume = g_consume,
	.recv_left = g_recv_left,
	.send_left = g_send_left,
	.peer_failed = g_peer_failed,
	.opened = g_opened,
	.drop = g_drop,
	.waits_on_others = g_waits_on_others,
	.pump = g_pump,
};

/* Part sizes from the roster's bandwidths (clients: none), then offsets. */
static int plan_parts(struct gar *r)
{
	struct mp_ctx *ctx = r->ctx;
	const struct mp_group *g = r->g;
	int k = r->k, rc;
	double *bw = malloc((size_t)k * sizeof(double));
	uint64_t *len = malloc((size_t)k * sizeof(uint64_t));

	rc = bw && len ? 0 : -ENOMEM;
	for (int m = 0; !rc && m < k; m++) {
		r->mb[m].mode = (uint8_t)mp_group_mode(g, m);
		bw[m] = g->bw ? g->bw[m] : ctx->peers[g->members[m]].bandwidth;
		if (r->mb[m].mode == MP_MODE_CLIENT)
			bw[m] = 0.0;
	}
	if (!rc && ctx->cfg.balance == MP_BALANCE_MEASURED) {
		/* The members' measured figures replace the configured ones
		 * (rate.c); a member dropped meanwhile is failed from the start. */
		uint8_t *lost = calloc((size_t)k, 1);
		rc = lost ? mp_rate_exchange(ctx, g, r->round, r->a->res, bw, lost,
					     r->a->irreversible) : -ENOMEM;
		for (int m = 0; !rc && m < k; m++)
			r->mb[m].failed = lost[m];
		free(lost);
	}
	if (!rc) {
		rc = mp_balance_parts(r->a->n, bw, k, ctx->cfg.min_part, len);
		if (rc)
			mp_set_error(ctx, "round %u: cannot split %zu values over the group's bandwidths",
				     r->round, r->a->n);
	}
	for (int m = 0; !rc && m < k; m++) {
		r->mb[m].len = len[m];
		r->mb[m].off = m ? r->mb[m - 1].off + r->mb[m - 1].len : 0;
		r->mb[m].nch = (len[m] + r->C - 1) / r->C;
		r->ncontributors++;
	}
	if (!rc) {
		/* Ids and modes reuse the bandwidth array's room. */
		uint64_t *ids = (uint64_t *)bw;
		uint8_t modes[MP_MAX_GROUP], *md = k <= MP_MAX_GROUP ? modes : NULL;

		for (int m = 0; m < k; m++) {
			ids[m] = member_id(r, m);
			if (md)
				md[m] = r->mb[m].mode;
		}
		r->plan = mp_plan_hash(g->id, k, ids, md, len);
	}
	free(bw);
	free(len);
	return rc;
}

/* The round's scratch memory (see the top comment): 0 or -ENOMEM. */
static int setup_memory(struct gar *r)
{
	struct mp_ctx *ctx = r->ctx;
	struct mp_avg *a = r->a;
	const int me = r->me;
	const uint64_t L = r->mb[me].len, nc = r->mb[me].nch;
	int lossy = a->codec->id != MP_CODEC_NONE;
	int sparse = (a->codec->flags & MP_CODEC_F_SPARSE) != 0;
	int nslots = 0;

	for (int m = 0; m < r->k; m++) {
		r->mb[m].slot = serves(r, m) ? nslots : -1;
		nslots += serves(r, m);
	}
	/* Layout: cbuf | enc_len | rtmp | who | whow | enc (64-aligned) */
	r->enc_cap = lossy ? (a->codec->max_encoded(&ctx->cparams, r->C) + 63) & ~(size_t)63 : 0;
	if (r->ds) {
		/* The device path: on the host, only what the host decides with. */
		size_t hb = nc * sizeof(uint32_t) + (size_t)r->k * (sizeof(int) + sizeof(float));
		r->cbuf = mp_scratch(ctx, MP_SCR_REDUCE, hb);
		if (!r->cbuf)
			return -ENOMEM;
		r->enc_len = (uint32_t *)r->cbuf;
		r->who = (int *)(r->enc_len + nc);
		r->whow = (float *)(r->who + r->k);
		r->cbuf = NULL;
		return dev_setup(r, nslots);
	}
	size_t fixed = (size_t)nslots * L * sizeof(float) + nc * sizeof(uint32_t) +
		       (sparse ? r->C * sizeof(float) : 0) + (size_t)r->k * (sizeof(int) + sizeof(float));
	fixed = (fixed + 63) & ~(size_t)63;
	r->cbuf = mp_scratch(ctx, MP_SCR_REDUCE, fixed + nc * r->enc_cap);
	if (!r->cbuf)
		return -ENOMEM;
	r->enc_len = (uint32_t *)(r->cbuf + (size_t)nslots * L);
	r->rtmp = (float *)(r->enc_len + nc);
	r->who = (int *)(r->rtmp + (sparse ? r->C : 0));
	r->whow = (float *)(r->who + r->k);
	r->enc = (uint8_t *)r->cbuf + fixed;

	/* Layout: stage | esave */
	uint64_t rest = a->n - L;
	uint64_t saved = a->residue ? rest : 0;
	r->stage = mp_scratch(ctx, MP_SCR_STAGE, (rest + saved) * sizeof(float));
	if (!r->stage)
		return -ENOMEM;
	r->esave = saved ? r->stage + rest : NULL;
	if (r->esave)
		for (int j = 0; j < r->k; j++)
			if (sends_to(r, j))
				memcpy(r->esave + stage_off(r, j), a->residue + r->mb[j].off,
				       r->mb[j].len * sizeof(float));
	return 0;
}

/*
 * A reducer that dropped a member we kept (only their pair's connection
 * failed) returns a part over fewer contributions than ours: the vector
 * is then no one set of peers' mean. A GATHER says how many contributions
 * its part holds and how many were left out as non-finite, so the rest
 * were dropped; more drops than our own mean members only the reducer
 * dropped. They count as failed peers, so that a result that says it
 * lost nobody holds every part over the same contributors.
 */
static void count_unseen_drops(struct gar *r)
{
	int ours = 0, worst = 0, by = -1;

	for (int m = 0; m < r->k; m++)
		ours += m != r->me && r->mb[m].failed;
	for (int j = 0; j < r->k; j++) {
		const struct gmember *mj = &r->mb[j];
		int dropped = (int)r->ncontributors - (int)mj->gn - (int)mj->gl;
		if (applied(r, j) && dropped > worst) {
			worst = dropped;
			by = j;
		}
	}
	if (worst <= ours)
		return;
	r->unseen = worst - ours;
	MP_WARN("round %u: peer %d reduced part %d without %d contribution%s that this peer kept "
		"(%u of %u in, %u left out as non-finite): the result mixes parts over different "
		"peers, counted as %d failed peer%s", r->round, r->g->members[by], by, worst,
		worst == 1 ? "" : "s", r->mb[by].gn, r->ncontributors, r->mb[by].gl, r->unseen,
		r->unseen == 1 ? "" : "s");
	r->a->res->failed_peers += r->unseen;
}

/*
 * After the exchange: apply the parts whose results arrived whole, keep our
 * values (and residue) for the others, settle the weight. Returns whether
 * any other member's values reached us.
 */
static int finish(struct gar *r)
{
	struct mp_avg *a = r->a;
	const int me = r->me;
	int first = -1, reached = r->done && r->nused > 1;

	if (r->ds && dev_apply(r))
		return -EIO;
	for (int j = 0; j < r->k; j++) {
		if (!sends_to(r, j))
			continue;
		const struct gmember *mj = &r->mb[j];
		int whole = applied(r, j);
		if (whole && r->ds) {
			if (first < 0)
				first = j;
		} else if (whole) {
			settle_part(r, j, 1);
			if (first < 0)
				first = j;
		} else {
			/* Not applied: the values stay ours (saved, if part of
			 * the result was decoded over them), and so does the
			 * residue they had, neither lost nor counted twice (the
			 * device path: in dev_apply). */
			settle_part(r, j, 0);
			if (r->esave)
				memcpy(a->residue + mj->off, r->esave + stage_off(r, j),
				       mj->len * sizeof(float));
		}
		mp_clog_apply(r->ctx, r->round, r->g, j, whole);
	}
	reached |= first >= 0;
	count_unseen_drops(r);
	float wold = a->weight;
	if (r->done && r->nused)
		a->weight = r->wsum / (float)r->nused;
	else if (first >= 0)
		a->weight = r->mb[first].gw / (float)r->mb[first].gn;
	if (a->residue && a->weight > 0.0f && a->weight != wold) {
		/* What the residue holds back counts at this peer's weight: keep
		 * its mass w·e as the weight changes. Our own part's residue, if
		 * it went into the part, was refilled at the new weight already. */
		float f = wold / a->weight;
		uint64_t o = r->folded ? r->mb[me].off : a->n, l = r->folded ? r->mb[me].len : 0;
		if (r->ds) {
			struct mp_stage *s = r->ds;
			int rc = mp_dev_scale(s, a->residue, o, f, r->dtmp, r->C, dev_zero(r));
			if (!rc)
				rc = mp_dev_scale(s, a->residue + o + l, a->n - o - l, f, r->dtmp, r->C,
						  dev_zero(r));
			if (rc || mp_dev_sync(r->ctx, s, "the error feedback at the new weight")) {
				mp_set_error(r->ctx, "round %u: %s memory %p: the error feedback could "
					     "not be brought to the new weight on the device", r->round,
					     s->ops->name, s->dev_base);
				return -EIO;
			}
		} else {
			mp_k_scale(a->residue, a->residue, f, o);
			mp_k_scale(a->residue + o + l, a->residue + o + l, f, a->n - o - l);
		}
	}
	return reached;
}

int mp_group_allreduce(struct mp_ctx *ctx, const struct mp_group *g, uint32_t round,
		       struct mp_avg *a)
{
	struct gar r = {.ctx = ctx, .g = g, .a = a, .round = round, .k = g->size,
			.me = g->my_index, .S = ctx->streams, .C = ctx->chunk_elems};
	struct mp_xfer x = {.ctx = ctx, .xops = &gar_ops, .op = &r, .round = round,
			    .group_id = g->id, .user_mr = a->dmr, .res = a->res,
			    .what = "group all-reduce", .codec = a->codec,
			    .residue = a->dev ? NULL : a->residue, /* device memory: never the engine's */
			    .deadline_ms = ctx->cfg.allreduce_timeout_ms, .total = a->n,
			    .no_give_up = a->irreversible, .copy_values = a->dev != NULL};
	int rc = -ENOMEM, k = g->size;

	r.ds = a->dev;
	r.xw = &x;
	x.gdr = mp_dev_gdr(r.ds);

	a->res->group_size = k;
	if (k < 2) {
		/* Alone on its line of the grid (partial grids): nothing to average. */
		mp_clog_alone(ctx, round);
		a->res->rounds++;
		return 0;
	}
	if (mp_direct_fits(ctx, g, a))
		return a->dev ? mp_dev_direct(ctx, g, round, a, 0) :
				mp_direct_allreduce(ctx, g, round, a, 0);
	r.mb = calloc((size_t)k, sizeof(*r.mb));
	if (!r.mb)
		goto out;
	rc = plan_parts(&r);
	if (rc)
		goto out;
	x.plan = r.plan;
	/* Channels only to the members we exchange anything with (two clients
	 * have nothing to say to each other, and may not reach each other). */
	int npair = 0;
	for (int m = 0; m < k; m++)
		npair += sends_to(&r, m) || serves(&r, m);
	x.nch = npair * r.S;
	x.ch = calloc((size_t)x.nch + 1, sizeof(*x.ch));
	r.gc = calloc((size_t)x.nch + 1, sizeof(*r.gc));
	rc = x.ch && r.gc ? setup_memory(&r) : -ENOMEM;
	if (rc)
		goto out;
	r.ch = x.ch;
	r.x = &x;
	for (int m = 0, i = 0; m < k; m++) {
		if (!sends_to(&r, m) && !serves(&r, m))
			continue;
		for (int s = 0; s < r.S; s++, i++) {
			x.ch[i].peer = g->members[m];
			x.ch[i].stream = s;
			x.ch[i].failed = r.mb[m].failed ? -ETIMEDOUT : 0;
			r.gc[i].j = m;
			r.gc[i].scat_next = r.gc[i].gath_next = (uint64_t)s;
			r.gc[i].rscat_next = r.gc[i].rgath_next = (uint64_t)s;
		}
	}
	uint8_t *modes = malloc((size_t)k);
	uint64_t *lens = malloc((size_t)k * sizeof(uint64_t));
	if (modes && lens) {
		for (int m = 0; m < k; m++) {
			modes[m] = r.mb[m].mode;
			lens[m] = r.mb[m].len;
		}
		mp_clog_begin(ctx, round, g, a->weight, lens, modes);
	}
	free(modes);
	free(lens);

	/* A part nobody else contributes to is complete already. */
	try_reduce(&r);
	rc = mp_xfer_run(&x);
	/* Every contributor has delivered or failed now, unless cancelled. */
	if (!rc)
		try_reduce(&r);
	/* Our part is summed whole whatever became of the results (the
	 * buffer takes it: no part is ever half reduced). */
	if (!r.ds && r.done)
		reduce_upto(&r, r.mb[r.me].nch);
	if (r.ds && !rc && !r.dev_err && r.reducing && !r.done) {
		/* Nobody waited for our result (every member failed): the sum
		 * still decides our own part. */
		if (mp_dev_sync(ctx, r.ds, "the contributions' status"))
			dev_fail(&r, -EIO, "reading the contributions' status");
		else
			dev_reduce(&r);
	}
	if (r.ds) {
		/* Messages made ready for channels that failed meanwhile. */
		for (int i = 0; i < x.nch; i++)
			if (r.gc[i].prep)
				mp_dev_slot_put(r.ds, r.gc[i].prep);
		if (r.stat_slot)
			mp_dev_slot_put(r.ds, r.stat_slot);
		if (r.dev_err || rc || x.fatal) {
			/* Nothing may still run on the round's memory. */
			int ws = mp_dev_sync(ctx, r.ds, "the round's work");
			if (r.dev_err || (ws && !rc))
				rc = -EIO;
		}
		if (r.desave && (x.fatal || rc == -EIO) && dev_unsend(&r))
			MP_WARN("round %u: %s memory %p: the error feedback of the parts sent could not "
				"be put back", round, r.ds->ops->name, r.ds->dev_base);
	}
	/* Given up (a peer's settings or length differ): no frame reached us,
	 * and nothing of the round is applied; the buffer is as it was, and so
	 * is the residue: the SCATTER frames that went out with the OPENs took
	 * theirs from it as they were encoded. */
	if (x.fatal && r.esave)
		for (int j = 0; j < r.k; j++)
			if (sends_to(&r, j))
				memcpy(a->residue + r.mb[j].off, r.esave + stage_off(&r, j),
				       r.mb[j].len * sizeof(float));
	if (x.fatal || rc == -EIO)
		/* Nothing of the round is applied: results decoded in place
		 * give way to our values again. */
		for (int j = 0; r.mb && j < r.k; j++)
			if (sends_to(&r, j))
				settle_part(&r, j, 0);
	int reached = x.fatal || rc == -EIO ? 0 : finish(&r);
	if (reached < 0) {
		rc = reached;
		reached = 0;
	}
	if (r.refused || (r.mb && r.mb[r.me].nonfinite))
		mp_set_error(ctx, "round %u: this peer's contribution was left out of %s: it holds NaN "
			     "or infinity (MP_CHECK_FINITE)", round,
			     r.refused ? "the average by its reducers" : "its own part");
	mp_clog_end(ctx, round, g, a->weight);
	if (rc)
		goto out;
	if (!reached) {
		mp_set_error(ctx, "round %u: every other member failed: no values reached this peer", round);
		rc = -EHOSTUNREACH;
		goto out;
	}
	/* Each round on a grid joins disjoint sets, so the sets multiply; the
	 * count is capped at the number of peers. */
	uint64_t alive = 1;
	for (int m = 0; m < k; m++)
		alive += m != r.me && !r.mb[m].failed;
	alive = alive > (uint64_t)r.unseen ? alive - (uint64_t)r.unseen : 1;
	a->influence *= alive;
	/* (Static runs with peers down: the live ones.) */
	int cap = !ctx->dynamic && ctx->nlive > 0 ? ctx->nlive : ctx->npeers;
	if (a->influence > (uint64_t)cap)
		a->influence = (uint64_t)cap;
	a->res->rounds++;
out:
	free(r.gc);
	free(x.ch);
	free(r.mb);
	return rc;
}
