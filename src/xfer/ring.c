/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Ring all-reduce over all peers: the bandwidth-optimal baseline that MPI and
 * NCCL use. N parts; N-1 reduce-scatter steps pass partial sums Σ w·x to the
 * right neighbour, then N-1 all-gather steps pass the finished means on.
 * Chunk c of every part travels on stream c mod S and frames on a stream come
 * in (step, chunk) order, so chunk c of step t can leave as soon as chunk c of
 * step t-1 has arrived: the steps pipeline.
 *
 * The ring is not fault tolerant, by design of the algorithm: if any peer
 * fails, the operation fails with -EHOSTUNREACH and the buffer is undefined.
 * An exchange given up at its start (a neighbour's settings or length
 * differ, found before any frame is applied) leaves the buffer as it was.
 *
 * CUDA memory with the device path (a->dev, devpath.h) runs the same ring
 * on the GPU: a received chunk crosses the bus in a ring slot and is
 * decoded there into the buffer, a chunk to send is encoded there (or
 * taken as it is) into a slot and copied to the host, and the finished
 * means are divided and rounded through the codec there, all in stream
 * order, with the roundings of the host path (dev_scale), so the result is
 * the host path's bit for bit.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "devpath.h"
#include "xfer.h"
#include "mp_kernels.h"
#include "log.h"
#include "parts.h"

struct ring {
	struct mp_ctx *ctx;
	struct mp_avg *a;
	int N, r, left, right, S, steps;
	size_t C;
	uint64_t *off, *len, *nch, *base; /* per part; base = first global chunk id */
	float *wsum;                       /* per global chunk */
	int *sst, *rst;                    /* per stream: step cursors */
	uint64_t *sc, *rc;                 /* per stream: chunk cursors */
	uint64_t *sleft, *rleft;           /* per stream: messages left */
	uint8_t *enc;
	size_t enc_cap;
	void *scr;       /* encoder scratch */
	int broken;
	/* the device path (a->dev): the buffer is device memory */
	struct mp_stage *ds;
	struct mp_xfer *xw;               /* the exchange, to abort it on a device failure */
	struct mp_ring_slot **prep;       /* per stream: the message being made ready */
	struct mp_wire_hdr *ph;           /* ... its header, as produce will return it */
	size_t *plen;                     /* ... its payload's length */
	float *dtmp;                      /* one chunk, for dev_scale */
	uint8_t *denc;                    /* one chunk encoded: a finished chunk's round trip */
	uint32_t *dstat;                  /* decode status: [0] what the left neighbour sent,
	                                     [1] our finished chunks' round trips, [2] stays 0 */
	void *dscr_enc, *dscr_dec;
	size_t enc_scr, dec_scr;
	int dev_err;                      /* a device call failed: the exchange is aborted */
	int ended;                        /* dev_end ran */
};

static int mod(int a, int n)
{
	return ((a % n) + n) % n;
}

static int part_sent(const struct ring *g, int st)
{
	return st < g->N - 1 ? mod(g->r - st, g->N) : mod(g->r + 1 - (st - (g->N - 1)), g->N);
}

static int part_recv(const struct ring *g, int st)
{
	return st < g->N - 1 ? mod(g->r - st - 1, g->N) : mod(g->r - (st - (g->N - 1)), g->N);
}

/* Skip steps whose part has no chunk on stream @s. */
static void normalize(const struct ring *g, int (*pf)(const struct ring *, int), int s, int *st,
		      uint64_t *c)
{
	while (*st < g->steps && *c >= g->nch[pf(g, *st)]) {
		(*st)++;
		*c = (uint64_t)s;
	}
}

static uint32_t count_of(const struct ring *g, int p, uint64_t c)
{
	uint64_t n = g->len[p] - c * g->C;
	return (uint32_t)(n < g->C ? n : g->C);
}

/* The next message on stream @s to the right neighbour, if it may go now:
 * fill @h and count it as sent; 1, else 0. */
/* Whether stream @s has a message for the right neighbour now. */
static int send_ready(const struct ring *g, int s)
{
	int st = g->sst[s];

	if (st >= g->steps)
		return 0;
	/* Chunk c of step st carries what arrived as chunk c of step st-1. */
	return st == 0 || g->rst[s] > st - 1 || (g->rst[s] == st - 1 && g->rc[s] > g->sc[s]);
}

static int next_send(struct ring *g, int s, struct mp_wire_hdr *h)
{
	int st = g->sst[s];
	uint64_t c = g->sc[s];

	if (!send_ready(g, s))
		return 0;
	int p = part_sent(g, st);
	h->type = st < g->N - 1 ? MP_MSG_RING_RS : MP_MSG_RING_AG;
	h->part = (uint32_t)st;
	h->offset = g->off[p] + c * g->C;
	h->count = count_of(g, p, c);
	h->weight = st == 0 ? g->a->weight : g->wsum[g->base[p] + c];
	h->aux = st < g->N - 1 ? (uint32_t)(st + 1) : (uint32_t)g->N;
	g->sc[s] = c + (uint64_t)g->S;
	normalize(g, part_sent, s, &g->sst[s], &g->sc[s]);
	g->sleft[s]--;
	return 1;
}

static int dev_produce(struct ring *g, int s, struct mp_wire_hdr *h, struct mp_payload *pl);

static int r_produce(void *op, struct mp_chan *ch, struct mp_wire_hdr *h, struct mp_payload *pl)
{
	struct ring *g = op;

	if (g->broken || ch->peer != g->right)
		return 0;
	if (g->ds)
		return dev_produce(g, ch->stream, h, pl);
	if (!next_send(g, ch->stream, h))
		return 0;
	*pl = (struct mp_payload){.kind = MP_PAYLOAD_VALUES, .values = g->a->x + h->offset};
	return 1;
}

static void finish_chunk(struct ring *g, float *x, uint32_t n, float w)
{
	const struct mp_codec_ops *codec = g->a->codec;

	if (w > 0.0f)
		mp_k_scale(x, x, 1.0f / w, n);
	if (codec->id != MP_CODEC_NONE) {
		/* Keep what the others will decode. */
		size_t len;
		if (!codec->encode(&g->ctx->cparams, x, NULL, n, g->enc, g->enc_cap, &len, g->scr))
			codec->decode(g->enc, len, x, n);
	}
}

static int dev_consume(struct ring *g, const struct mp_wire_hdr *h, const void *payload, float *x,
		       int rs, int last, float w);

static int r_consume(void *op, struct mp_chan *ch, const struct mp_wire_hdr *h, const void *payload)
{
	struct ring *g = op;
	const struct mp_codec_ops *codec = g->a->codec;
	int s = ch->stream, st = g->rst[s];
	uint64_t c = g->rc[s];

	if (ch->peer != g->left || st >= g->steps)
		return -EPROTO;
	int p = part_recv(g, st);
	int rs = st < g->N - 1;
	if (h->type != (rs ? MP_MSG_RING_RS : MP_MSG_RING_AG) || h->part != (uint32_t)st ||
	    h->offset != g->off[p] + c * g->C || h->count != count_of(g, p, c))
		return -EPROTO;
	float *x = g->a->x + h->offset;
	/* A partial sum carries its weights' sum; a finished mean, its own. */
	const float w = rs ? h->weight + g->a->weight : h->weight;
	const int last = rs && st == g->N - 2;
	if (g->ds) {
		int rc = dev_consume(g, h, payload, x, rs, last, w);
		if (rc)
			return rc;
	} else if (rs) {
		/* Our own contribution joins the partial sum as it passes. */
		if (g->a->weight != 1.0f)
			mp_k_scale(x, x, g->a->weight, h->count);
		if (codec->decode_acc(payload, h->length, x, h->count, 1.0f))
			return -EPROTO;
		if (last)
			finish_chunk(g, x, h->count, w);
	} else if (codec->decode(payload, h->length, x, h->count)) {
		return -EPROTO;
	}
	g->wsum[g->base[p] + c] = w;
	g->rc[s] = c + (uint64_t)g->S;
	normalize(g, part_recv, s, &g->rst[s], &g->rc[s]);
	g->rleft[s]--;
	return 0;
}

static uint64_t r_recv_left(void *op, struct mp_chan *ch)
{
	struct ring *g = op;

	return g->broken || ch->peer != g->left ? 0 : g->rleft[ch->stream];
}

static uint64_t r_send_left(void *op, struct mp_chan *ch)
{
	struct ring *g = op;

	/* The device path counts a message as sent once it is being made
	 * ready (prep): until produce hands it over, it is still to send. */
	return g->broken || ch->peer != g->right ? 0 :
	       g->sleft[ch->stream] + (g->prep && g->prep[ch->stream]);
}

static void r_peer_failed(void *op, int peer)
{
	struct ring *g = op;

	(void)peer;
	g->broken = 1;
}

/* ---- the device path (a->dev, devpath.h) --------------------------------
 *
 * Message for message the host path's ring; only the values live on the
 * GPU. A payload that arrives is copied into a ring slot, across the bus,
 * and decoded there into the buffer; the next message to send is encoded
 * there from the buffer (or taken as it is) into a slot's device twin,
 * copied to its pinned bytes and handed to the engine once it is there.
 * All of it is queued on the registration's one stream in the order the
 * host path runs it, so a chunk leaves only after what it carries arrived.
 *
 * A payload the GPU finds malformed cannot be refused when it arrives: its
 * decode writes nothing and marks a status word. The word travels to the
 * host with every message made ready after it, and one that sees it set
 * is not sent: the exchange ends there, its channels closed, so that no
 * peer goes on with a sum that lacks a part, and the average fails as a
 * rejected frame fails the host ring (-EHOSTUNREACH, the buffer
 * undefined); the end of the exchange reads it too. A failed device call
 * aborts the exchange with -EIO.
 */

static void dev_fail(struct ring *g, int rc, const char *what)
{
	if (g->dev_err)
		return;
	g->dev_err = rc < 0 ? rc : -EIO;
	mp_set_error(g->ctx, "ring all-reduce round %u: %s memory %p: %s failed on the device (%s)",
		     g->xw->round, g->ds->ops->name, g->ds->dev_base, what,
		     mp_strerror(g->dev_err));
	g->xw->abort_err = -EIO;
}

/* x[0..n) = w·x on the device, rounded as mp_k_scale. */
static int dev_scale(struct ring *g, float *x, uint64_t n, float w)
{
	return mp_dev_scale(g->ds, x, n, w, g->dtmp, g->C, g->dstat + 2);
}

/* As finish_chunk. */
static int dev_finish_chunk(struct ring *g, float *x, uint32_t n, float w)
{
	struct mp_stage *s = g->ds;
	const int codec = (int)g->a->codec->id;
	int rc = w > 0.0f ? dev_scale(g, x, n, 1.0f / w) : 0;
	size_t len = 0;

	if (!rc && codec != MP_CODEC_NONE)
		rc = s->dp->k->encode(&s->dev, codec, &g->ctx->cparams, x, NULL, n, g->denc, g->enc_cap, &len,
				      g->dscr_enc, g->enc_scr, s->stream);
	if (!rc && codec != MP_CODEC_NONE)
		rc = s->dp->k->decode(&s->dev, codec, g->denc, len, x, n, 0.0f, 0, g->dstat + 1,
				      g->dscr_dec, g->dec_scr, s->stream);
	return rc;
}

static int dev_consume(struct ring *g, const struct mp_wire_hdr *h, const void *payload, float *x,
		       int rs, int last, float w)
{
	struct mp_stage *s = g->ds;
	struct mp_ring_slot *sl;
	int rc;

	if (g->dev_err)
		return 0; /* aborted: nobody is blamed */
	if (h->length > s->dp->slot_bytes)
		return -EPROTO;
	rc = mp_dev_arrived(g->ctx, s, payload, h->length, &sl);
	if (!sl) {
		dev_fail(g, -EIO, "waiting for a chunk buffer");
		return 0;
	}
	/* Our own contribution joins the partial sum as it passes. */
	if (!rc && rs && g->a->weight != 1.0f)
		rc = dev_scale(g, x, h->count, g->a->weight);
	if (!rc)
		rc = s->dp->k->decode(&s->dev, (int)g->a->codec->id, sl->dev, h->length, x, h->count,
				      1.0f, rs, g->dstat, g->dscr_dec, g->dec_scr, s->stream);
	/* The copy may be queued even when the decode was refused: the slot's
	 * host bytes stay busy until it has run. */
	if (mp_dev_slot_queued(s, sl, 0) && !rc)
		rc = -EIO;
	if (!rc && last)
		rc = dev_finish_chunk(g, x, h->count, w);
	if (rc == -EBADMSG)
		return -EPROTO;
	if (rc)
		dev_fail(g, rc, "taking a chunk to the device");
	return 0;
}

/* Pinned: the decode status as stream @s's message made ready saw it
 * (the ring's words of the status area: 0-2 at the end, then one a stream). */
static uint32_t *dev_seen(const struct ring *g, int s)
{
	return g->ds->dp->hstatus + 4 + s;
}

/* The device path's produce: the host path's next message, made ready in a
 * ring slot first; 1 with @h and @pl once it is on the host (the engine
 * copies it into its frame at once, and the slot is free again), else 0. */
static int dev_produce(struct ring *g, int s, struct mp_wire_hdr *h, struct mp_payload *pl)
{
	struct mp_stage *ds = g->ds;
	const int codec = (int)g->a->codec->id;
	struct mp_ring_slot *sl;
	int rc;

	if (g->dev_err)
		return 0;
	if (g->prep[s]) {
		rc = mp_dev_slot_ready(ds, g->prep[s]);
		if (rc < 0)
			dev_fail(g, rc, "copying a chunk to the host");
		if (rc <= 0)
			return 0;
		if (*dev_seen(g, s)) {
			/* It would carry what a malformed payload left undone:
			 * the ring ends here, for its peers too (dev_end says why). */
			g->xw->abort_err = -EHOSTUNREACH;
			return 0;
		}
		*h = g->ph[s];
		mp_dev_payload(ds, g->prep[s], g->plen[s], pl);
		g->prep[s] = NULL;
		return 1;
	}
	/* Half the ring at most for sends: receives must find slots. */
	if (!send_ready(g, s) || ds->dp->held >= MP_DEV_SLOTS / 2 || !(sl = mp_dev_slot_try(ds)))
		return 0;
	memset(&g->ph[s], 0, sizeof(g->ph[s]));
	next_send(g, s, &g->ph[s]);
	rc = mp_dev_chunk_out(ds, codec, &g->ctx->cparams, g->a->x + g->ph[s].offset, NULL,
			      g->ph[s].count, sl, &g->plen[s], g->dscr_enc, g->enc_scr);
	/* With it, the status of every payload decoded so far. */
	if (!rc)
		rc = ds->ops->copy_async(&ds->dev, dev_seen(g, s), g->dstat, sizeof(uint32_t), 0,
					 ds->stream);
	if (!rc)
		rc = mp_dev_slot_queued(ds, sl, 1);
	if (rc) {
		mp_dev_slot_put(ds, sl);
		dev_fail(g, rc, "making a chunk ready to send");
		return 0;
	}
	g->prep[s] = sl;
	return 0;
}

static int r_pump(void *op)
{
	struct ring *g = op;

	if (!g->ds || g->dev_err)
		return 0;
	for (int s = 0; s < g->S; s++)
		if (g->prep[s])
			return 1;
	return 0;
}

/* The exchange's device memory and per-stream state: 0, or a negative
 * errno with the context's error set. */
static int dev_setup(struct ring *g)
{
	struct mp_ctx *ctx = g->ctx;
	struct mp_stage *s = g->ds;
	const struct mp_devk_ops *k = s->dp->k;
	const int codec = (int)g->a->codec->id;
	size_t sz[5];

	g->prep = calloc((size_t)g->S, sizeof(*g->prep));
	g->ph = calloc((size_t)g->S, sizeof(*g->ph));
	g->plen = calloc((size_t)g->S, sizeof(*g->plen));
	if (!g->prep || !g->ph || !g->plen)
		return -ENOMEM;
	g->enc_scr = (k->enc_scratch(codec, &ctx->cparams, g->C) + 255) & ~(size_t)255;
	g->dec_scr = (k->dec_scratch(codec, s->dp->slot_bytes, g->C) + 255) & ~(size_t)255;
	sz[0] = g->C * sizeof(float);                              /* dtmp */
	sz[1] = codec != MP_CODEC_NONE ? g->enc_cap : 0;           /* denc */
	sz[2] = 3 * sizeof(uint32_t);                              /* dstat */
	sz[3] = g->enc_scr;
	sz[4] = g->dec_scr;
	void **at[5] = {(void **)&g->dtmp, (void **)&g->denc, (void **)&g->dstat, &g->dscr_enc,
			&g->dscr_dec};
	if (mp_dev_carve(ctx, s, sz, at, 5))
		return -ENOMEM;
	if (s->ops->fill32(&s->dev, g->dstat, 0, 3, s->stream)) {
		mp_set_error(ctx, "ring all-reduce: %s memory %p: clearing the status words failed",
			     s->ops->name, s->dev_base);
		return -EIO;
	}
	return 0;
}

/* After the exchange: nothing of it still runs on the device, and the
 * status words are read. Returns @rc, or the error they show. */
static int dev_end(struct ring *g, int rc)
{
	struct mp_ctx *ctx = g->ctx;
	struct mp_stage *s = g->ds;

	g->ended = 1;
	for (int i = 0; g->prep && i < g->S; i++)
		if (g->prep[i])
			mp_dev_slot_put(s, g->prep[i]);
	if (!g->dstat)
		return rc;
	int ws = mp_dev_copy_sync(ctx, s, s->dp->hstatus, g->dstat, 3 * sizeof(uint32_t), 0,
				  "the ring's work");
	if (g->dev_err || (ws && !rc))
		return -EIO;
	if (!ws && s->dp->hstatus[0]) {
		/* As the host path counts a frame it cannot decode. */
		MP_STAT_ADD(ctx->rejected[MP_REJ_UNEXPECTED], 1);
		g->a->res->frames_rejected++;
		mp_set_error(ctx, "ring all-reduce round %u failed: a payload from peer %d failed to "
			     "decode on the device (the ring cannot finish without every peer's "
			     "values; the buffer is undefined)", g->xw->round, g->left);
		return -EHOSTUNREACH;
	}
	if (!rc && s->dp->hstatus[1])
		MP_WARN("ring all-reduce round %u: a finished chunk of this peer failed to decode "
			"back on the device: it keeps the unrounded mean there", g->xw->round);
	return rc;
}

static const struct mp_xfer_ops ring_ops = {
	.produce = r_produce,
	.consume = r_consume,
	.recv_left = r_recv_left,
	.send_left = r_send_left,
	.peer_failed = r_peer_failed,
	.pump = r_pump,
};

int mp_ring_allreduce(struct mp_ctx *ctx, uint32_t round, struct mp_avg *a)
{
	int N = ctx->npeers, S = ctx->streams, rc = -ENOMEM;
	struct ring g = {.ctx = ctx, .a = a, .N = N, .r = ctx->rank, .S = S,
			 .steps = 2 * (N - 1), .C = ctx->chunk_elems};
	struct mp_xfer x = {.ctx = ctx, .xops = &ring_ops, .op = &g, .round = round, .group_id = 0,
			    .user_mr = a->dmr, .res = a->res, .what = "ring all-reduce",
			    .codec = a->codec, .total = a->n, .gate = 1, .copy_values = a->dev != NULL};
	float *own = NULL, *down = NULL;

	g.ds = a->dev;
	g.xw = &x;
	x.gdr = mp_dev_gdr(g.ds);

	/* Failure memory (static runs): the ring closes over the live peers,
	 * in rank order, so a down peer is skipped, not waited for. */
	if (ctx->live && ctx->nlive < ctx->npeers) {
		N = g.N = ctx->nlive;
		g.steps = 2 * (N - 1);
		for (int i = 0; i < N; i++)
			if (ctx->live[i] == ctx->rank)
				g.r = i;
	}
	if (N < 2) {
		a->res->rounds++;
		return 0;
	}
	{
		/* Short vectors: one direct exchange among the ring's peers. */
		int *members = malloc((size_t)N * sizeof(int));
		struct mp_group dg = {.members = members, .size = N, .my_index = g.r, .id = 0};

		if (!members)
			return -ENOMEM;
		for (int i = 0; i < N; i++)
			members[i] = ctx->live && ctx->nlive < ctx->npeers ? ctx->live[i] : i;
		if (mp_direct_fits(ctx, &dg, a)) {
			rc = a->dev ? mp_dev_direct(ctx, &dg, round, a, 1) :
				      mp_direct_allreduce(ctx, &dg, round, a, 1);
			free(members);
			return rc;
		}
		free(members);
	}
	g.left = ctx->live && ctx->nlive < ctx->npeers ? ctx->live[mod(g.r - 1, N)] : mod(g.r - 1, N);
	g.right = ctx->live && ctx->nlive < ctx->npeers ? ctx->live[mod(g.r + 1, N)] : mod(g.r + 1, N);
	g.off = calloc((size_t)N * 4, sizeof(uint64_t));
	g.sst = calloc((size_t)S * 2, sizeof(int));
	g.sc = calloc((size_t)S * 4, sizeof(uint64_t));
	x.nch = g.left == g.right ? S : 2 * S;
	x.ch = calloc((size_t)x.nch, sizeof(*x.ch));
	/* Never a sparse codec here: mp_config_resolve refuses them for the
	 * ring, "auto" never picks one, and a flush runs uncompressed. */
	g.enc_cap = g.ds ? g.ds->dp->k->max_encoded((int)a->codec->id, &ctx->cparams, g.C) :
			   a->codec->max_encoded(&ctx->cparams, g.C);
	size_t scr = a->codec->scratch_size ? a->codec->scratch_size(&ctx->cparams, g.C) : 0;
	g.enc = malloc(g.enc_cap + 64);
	g.scr = scr ? aligned_alloc(64, (scr + 63) & ~(size_t)63) : NULL;
	if (!g.off || !g.sst || !g.sc || !x.ch || !g.enc || (scr && !g.scr))
		goto out;
	if (g.ds && (rc = dev_setup(&g)))
		goto out;
	g.len = g.off + N;
	g.nch = g.len + N;
	g.base = g.nch + N;
	g.rst = g.sst + S;
	g.rc = g.sc + S;
	g.sleft = g.rc + S;
	g.rleft = g.sleft + S;
	rc = mp_parts_split(a->n, NULL, N, g.len);
	if (rc)
		goto out;
	uint64_t total = 0;
	for (int p = 0; p < N; p++) {
		g.off[p] = p ? g.off[p - 1] + g.len[p - 1] : 0;
		g.nch[p] = (g.len[p] + g.C - 1) / g.C;
		g.base[p] = total;
		total += g.nch[p];
	}
	g.wsum = calloc(total ? total : 1, sizeof(float));
	if (!g.wsum) {
		rc = -ENOMEM;
		goto out;
	}
	for (int s = 0; s < S; s++) {
		g.sc[s] = g.rc[s] = (uint64_t)s;
		normalize(&g, part_sent, s, &g.sst[s], &g.sc[s]);
		normalize(&g, part_recv, s, &g.rst[s], &g.rc[s]);
		for (int st = 0; st < g.steps; st++) {
			uint64_t ns = g.nch[part_sent(&g, st)], nr = g.nch[part_recv(&g, st)];
			g.sleft[s] += ns > (uint64_t)s ? (ns - (uint64_t)s + (uint64_t)S - 1) / (uint64_t)S : 0;
			g.rleft[s] += nr > (uint64_t)s ? (nr - (uint64_t)s + (uint64_t)S - 1) / (uint64_t)S : 0;
		}
		x.ch[s].peer = g.right;
		x.ch[s].stream = s;
		if (g.left != g.right) {
			x.ch[S + s].peer = g.left;
			x.ch[S + s].stream = s;
		}
	}
	if (a->weight != 1.0f && g.ds) {
		/* As below, the copy kept on the device. */
		down = mp_dev_undo_mem(ctx, g.ds, g.len[g.r] * sizeof(float) + 4);
		if (!down) {
			rc = dev_end(&g, -ENOMEM);
			free(g.wsum);
			goto out;
		}
		if (g.ds->ops->copy_d2d(&g.ds->dev, down, a->x + g.off[g.r],
					g.len[g.r] * sizeof(float), g.ds->stream) ||
		    dev_scale(&g, a->x + g.off[g.r], g.len[g.r], a->weight)) {
			dev_fail(&g, -EIO, "weighing this peer's part");
			rc = dev_end(&g, -EIO);
			free(g.wsum);
			goto out;
		}
	} else if (a->weight != 1.0f) {
		/* Our part goes out as w·x; kept as it was, for an exchange given
		 * up before anything arrived (the engine's OPEN check). */
		own = malloc(g.len[g.r] * sizeof(float) + 1);
		if (!own) {
			free(g.wsum);
			rc = -ENOMEM;
			goto out;
		}
		memcpy(own, a->x + g.off[g.r], g.len[g.r] * sizeof(float));
		mp_k_scale(a->x + g.off[g.r], a->x + g.off[g.r], a->weight, g.len[g.r]);
	}
	rc = mp_xfer_run(&x);
	if (x.fatal && own)
		memcpy(a->x + g.off[g.r], own, g.len[g.r] * sizeof(float));
	if (x.fatal && down && !g.dev_err &&
	    g.ds->ops->copy_d2d(&g.ds->dev, a->x + g.off[g.r], down, g.len[g.r] * sizeof(float),
				g.ds->stream))
		dev_fail(&g, -EIO, "putting this peer's part back");
	if (g.ds)
		rc = dev_end(&g, rc);
	if (!rc && g.broken) {
		mp_set_error(ctx, "ring all-reduce round %u failed: a peer dropped out (the ring cannot "
			     "finish without every peer; the buffer is undefined)", round);
		rc = -EHOSTUNREACH;
	}
	if (!rc) {
		a->influence = (uint64_t)N;
		if (total)
			a->weight = g.wsum[0] / (float)N;
		a->res->rounds++;
	}
	free(g.wsum);
out:
	if (g.ds && !g.ended)
		dev_end(&g, rc); /* what dev_setup queued */
	free(g.prep);
	free(g.ph);
	free(g.plen);
	free(own);
	free(g.enc);
	free(g.scr);
	free(x.ch);
	free(g.sc);
	free(g.sst);
	free(g.off);
	return rc;
}
