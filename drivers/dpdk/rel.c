/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Reliable, in-order message delivery over datagrams for the dpdk driver
 * (rel.h). Segment layout: doc/protocol.md, "DPDK segment format"; the
 * rules: doc/dpdk.md, "Reliable delivery".
 *
 * Per connection and direction the sender keeps a ring of `window` segment
 * records indexed by sequence number, and the receiver a bitmap of the same
 * size saying which sequence numbers beyond the cumulative ack it holds.
 * Both are addressed by seq & (window - 1), and SACK words on the wire are
 * aligned to absolute multiples of 64 sequence numbers, so turning an ACK
 * into state is word operations on the two bitmaps, never a scan of the
 * window. Every sent segment has a node in the instance's one timer wheel
 * (O(1) to arm and disarm); its expiry queues the segment for
 * retransmission.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <moshpit/driver_sdk.h>

#include "rel.h"

#include "mp_kernels.h"

#define REL_MAGIC 0x524Du /* bytes "MR" on the wire */
#define REL_VERSION 1
#define REL_HDR_LEN 32
#define REL_SACK_MAX 16
#define REL_F_PROBE 0x01u /* ACK: answer with an ACK now */
#define REL_F_ALL REL_F_PROBE

_Static_assert(REL_HDR_LEN + 12 == MP_REL_DATA_HDR_LEN, "data header = common + msg/off/mlen");
_Static_assert(REL_HDR_LEN + 8 * REL_SACK_MAX == MP_REL_HDR_MAX, "largest ACK");
_Static_assert(MP_REL_WINDOW_MAX == 64 * REL_SACK_MAX, "an ACK can describe a whole window");

enum seg_type { SEG_SYN = 1, SEG_SYNACK, SEG_DATA, SEG_ACK, SEG_FIN, SEG_RST, SEG_TYPE_END };

/* Segments sent per connection per poll pass, so that one busy connection
 * does not starve the others of the tx ring. */
#define REL_BURST 64
#define REQ_CHUNK 64 /* requests allocated at once */
/*
 * 2048 slots of rto_min / 8 (125 us by default) make one turn of 256 ms,
 * longer than rto_max and the keepalive (250 ms by default), and keep the
 * sentinels (40 bytes each, 80 KiB) under the 128 KiB where malloc, and
 * ASan's allocator, turn to mmap: with 4096 slots every instance's
 * creation faulted in fresh pages, and fuzz_dpdk_rel, which creates two
 * per input, took a minute under ASan.
 */
#define WHEEL_SLOTS 2048u

/* ---- timer wheel --------------------------------------------------------
 *
 * Hashed wheel of WHEEL_SLOTS slots of `tick` ns. A node due at time d sits
 * in slot ceil(d / tick) mod slots and fires once the clock has reached that
 * slot's start, so never early; nodes a whole turn or more ahead stay in
 * their slot until their turn comes. An occupancy bitmap makes skipping
 * empty slots (expiry, next deadline) word operations.
 */
struct tw_node {
	struct tw_node *next, *prev; /* NULL when not armed */
	uint64_t deadline;
	uint32_t slot;
	uint8_t kind;
};

enum { TK_RTO = 1, TK_DACK, TK_CTL };

struct tw {
	uint64_t tick;
	uint64_t cur; /* last tick processed */
	uint32_t mask;
	size_t count;
	struct tw_node *head; /* list sentinels */
	uint64_t *occ;
};

static int tw_init(struct tw *w, uint64_t tick, uint64_t now)
{
	w->tick = tick;
	w->cur = now / tick;
	w->mask = WHEEL_SLOTS - 1;
	w->count = 0;
	w->head = calloc(WHEEL_SLOTS, sizeof(*w->head));
	w->occ = calloc(WHEEL_SLOTS / 64, sizeof(*w->occ));
	if (!w->head || !w->occ)
		return -ENOMEM;
	for (uint32_t i = 0; i < WHEEL_SLOTS; i++)
		w->head[i].next = w->head[i].prev = &w->head[i];
	return 0;
}

static void tw_fini(struct tw *w)
{
	free(w->head);
	free(w->occ);
}

static inline bool tw_armed(const struct tw_node *n)
{
	return n->next != NULL;
}

static void tw_add(struct tw *w, struct tw_node *n, uint64_t deadline)
{
	uint64_t t = deadline / w->tick + (deadline % w->tick != 0);

	if (t <= w->cur)
		t = w->cur + 1;
	uint32_t s = (uint32_t)t & w->mask;
	struct tw_node *h = &w->head[s];

	n->deadline = deadline;
	n->slot = s;
	n->next = h->next;
	n->prev = h;
	h->next->prev = n;
	h->next = n;
	w->occ[s >> 6] |= 1ull << (s & 63);
	w->count++;
}

static void tw_del(struct tw *w, struct tw_node *n)
{
	if (!n->next)
		return;
	n->prev->next = n->next;
	n->next->prev = n->prev;
	if (w->head[n->slot].next == &w->head[n->slot])
		w->occ[n->slot >> 6] &= ~(1ull << (n->slot & 63));
	n->next = n->prev = NULL;
	w->count--;
}

static inline void tw_rearm(struct tw *w, struct tw_node *n, uint64_t deadline)
{
	tw_del(w, n);
	tw_add(w, n, deadline);
}

/* First occupied slot's tick in (cur, cur + slots], or 0 if none. */
static uint64_t tw_first(const struct tw *w, uint64_t from, uint64_t steps)
{
	for (uint64_t t = from + 1; t <= from + steps;) {
		uint32_t s = (uint32_t)t & w->mask;
		uint64_t bits = w->occ[s >> 6] >> (s & 63);

		if (!bits) {
			t += 64 - (s & 63);
			continue;
		}
		t += (uint64_t)__builtin_ctzll(bits);
		return t <= from + steps ? t : 0;
	}
	return 0;
}

struct mp_rel;
static void rel_fire(struct mp_rel *rel, struct tw_node *n);

static void tw_expire(struct tw *w, uint64_t now, struct mp_rel *rel)
{
	uint64_t nt = now / w->tick, from = w->cur, steps;

	if (nt <= from)
		return;
	steps = nt - from;
	if (steps > (uint64_t)w->mask + 1)
		steps = (uint64_t)w->mask + 1;
	w->cur = nt;
	/* Nodes re-added while firing land in slots after nt (or in a later
	 * turn of a slot), never in the list being walked. */
	for (uint64_t t = from; (t = tw_first(w, t, from + steps - t)) != 0;) {
		uint32_t s = (uint32_t)t & w->mask;
		struct tw_node *h = &w->head[s], tmp;

		tmp.next = h->next;
		tmp.prev = h->prev;
		tmp.next->prev = &tmp;
		tmp.prev->next = &tmp;
		h->next = h->prev = h;
		w->occ[s >> 6] &= ~(1ull << (s & 63));
		while (tmp.next != &tmp) {
			struct tw_node *n = tmp.next;

			n->prev->next = n->next;
			n->next->prev = n->prev;
			n->next = n->prev = NULL;
			w->count--;
			if (n->deadline <= now)
				rel_fire(rel, n);
			else
				tw_add(w, n, n->deadline);
		}
	}
}

static uint64_t tw_next(const struct tw *w)
{
	if (!w->count)
		return UINT64_MAX;
	uint64_t t = tw_first(w, w->cur, (uint64_t)w->mask + 1);

	return t ? t * w->tick : UINT64_MAX;
}

/* ---- state --------------------------------------------------------------- */

struct mp_rel_req {
	struct mp_reqq_req base; /* link: free list only; nbytes: message length */
	struct mp_rel *owner;
};

/* A posted send. Segments of message id m are first_seq .. first_seq+nseg-1. */
struct txmsg {
	struct mp_rel_req *req;
	struct mp_iov iov[MP_DRV_IOV_MAX];
	uint32_t len;
	uint32_t first_seq;
	uint32_t nseg;  /* set when its first segment is cut */
	uint32_t acked; /* segments acknowledged */
	bool done;
};

/* TS_TIMED: on the connection's timed list, iff INFL && !SACK && !LOSTQ. */
enum { TS_INFL = 1, TS_SACK = 2, TS_LOSTQ = 4, TS_FAST = 8, TS_TIMED = 16 };

/* A segment in flight (sender ring, indexed by seq & wmask). */
struct txseg {
	struct mp_rel_conn *c;
	/* Links in the retransmission queue (LOSTQ) or the timed list (TIMED),
	 * never both: a segment is timed until it is queued, and queued until
	 * it is resent. */
	struct txseg *qnext, *qprev;
	uint64_t due; /* its retransmission timeout, while TIMED */
	uint64_t sent_ns;
	uint32_t seq, msg, off, len;
	uint16_t retx;
	uint8_t flags;
};

enum { RX_POSTED = 1, RX_ACTIVE, RX_TOOBIG, RX_DONE };

/* A posted receive; message id = its posting index. */
struct rxslot {
	struct mp_rel_req *req;
	uint8_t *buf;
	size_t cap;
	uint32_t mlen, first_seq, nseg, got;
	uint8_t state;
	bool stream; /* copied with non-temporal stores (stream_min) */
};

enum conn_state { C_SYN_SENT = 1, C_OPEN, C_FAILED };

struct mp_rel_conn {
	struct mp_rel *rel;
	uint32_t id, peer_id, route, idx;
	int state;
	int err;
	bool active;     /* we sent the SYN */
	bool unaccepted; /* in the accept queue */
	void *user;
	uint32_t mss; /* agreed: min of both sides */
	uint64_t born_ns;

	/* sender */
	uint32_t snd_una, snd_nxt, high_sack; /* high_sack: 1 + highest SACKed seq */
	uint32_t peer_credit, peer_wnd_end;
	uint32_t tx_head, tx_seg, tx_tail, tx_off; /* message ids; tx_off in message tx_seg */
	struct txmsg *txm;
	struct txseg *txs;
	uint64_t *sacked;
	struct txseg *rq_head, *rq_tail;
	struct txseg *t_head, *t_tail; /* timed list; t_rto is due for t_head (or earlier) */
	struct tw_node t_rto;
	uint64_t rack_ts;
	struct mp_rel_rtt rtt;
	uint64_t rto;        /* from rtt (rto_min before the first sample), before backoff */
	uint32_t backoff;    /* timeouts since the last valid RTT sample */
	uint64_t hold_until; /* other segments wait for the one resent by a timeout */

	/* receiver */
	uint32_t rcv_nxt, rcv_high; /* rcv_high: 1 + highest seq held */
	uint32_t rx_head, rx_tail, credit_sent;
	struct rxslot *rxm;
	uint64_t *held;
	uint32_t unacked;
	bool ack_now, syn_due, synack_due, probe_due, heard;

	struct tw_node t_dack, t_ctl; /* delayed ack; SYN repeat or probe */
	uint32_t tries;               /* SYNs sent, or probes unanswered */

	struct mp_rel_conn *rnext, *rprev; /* ready list */
	bool ready;
	struct mp_reqq_link alink; /* accept queue */
};

struct mp_rel {
	struct mp_rel_params p;
	struct tw wheel;
	uint32_t wmask, pmask, hwords, ack_every;
	struct mp_rel_conn **conns;
	uint16_t *gen;
	uint32_t *free_idx, nfree;
	uint32_t backlog;
	struct mp_reqq aq; /* accept queue: connections from SYNs, oldest first */
	struct mp_rel_conn *rd_head, *rd_tail;
	struct mp_reqpool reqs;
	uint64_t now;
	uint64_t progress; /* bumped by every send and completion */
	struct mp_rel_stats st;
};

/* The default clock (the SDK's) behind the user-data signature of mp_rel_params.now_ns. */
static uint64_t clock_now(void *user)
{
	(void)user;
	return mp_now_ns();
}

static inline uint64_t rel_clock(struct mp_rel *rel)
{
	rel->now = rel->p.now_ns(rel->p.user);
	return rel->now;
}

static inline bool seq_lt(uint32_t a, uint32_t b)
{
	return (int32_t)(a - b) < 0;
}

/* Bits of the word starting at sequence wb that lie in [lo, hi). */
static uint64_t range_mask(uint32_t wb, uint32_t lo, uint32_t hi)
{
	int64_t a = (int32_t)(lo - wb), b = (int32_t)(hi - wb);

	if (a < 0)
		a = 0;
	if (b > 64)
		b = 64;
	if (b <= a)
		return 0;
	uint64_t m = b == 64 ? ~0ull : (1ull << b) - 1;

	return m & ~((1ull << a) - 1);
}

/* ---- requests ------------------------------------------------------------ */

static struct mp_rel_req *req_get(struct mp_rel *rel)
{
	struct mp_rel_req *r = mp_reqpool_get_entry(&rel->reqs, struct mp_rel_req, base.link);

	if (!r)
		return NULL;
	r->owner = rel;
	mp_reqq_req_post(&r->base);
	return r;
}

static void req_done(struct mp_rel *rel, struct mp_rel_req *r, int err, size_t nbytes)
{
	r->base.nbytes = nbytes;
	mp_reqq_req_complete(&r->base, err);
	rel->progress++;
}

int mp_rel_test(struct mp_rel_req *r, int *done, size_t *nbytes)
{
	if (!r || !done)
		return -EINVAL;
	return mp_reqq_req_test(&r->owner->reqs, &r->base, done, nbytes);
}

/* ---- lists --------------------------------------------------------------- */

/* Put @c on the ready list: at the back, or at the front when its turn was
 * cut short by a full tx ring. */
static void conn_ready_at(struct mp_rel_conn *c, bool front)
{
	struct mp_rel *rel = c->rel;

	if (c->ready || c->state == C_FAILED)
		return;
	c->ready = true;
	c->rprev = front ? NULL : rel->rd_tail;
	c->rnext = front ? rel->rd_head : NULL;
	if (c->rprev)
		c->rprev->rnext = c;
	else
		rel->rd_head = c;
	if (c->rnext)
		c->rnext->rprev = c;
	else
		rel->rd_tail = c;
}

static void conn_ready(struct mp_rel_conn *c)
{
	conn_ready_at(c, false);
}

static void conn_unready(struct mp_rel_conn *c)
{
	struct mp_rel *rel = c->rel;

	if (!c->ready)
		return;
	if (c->rprev)
		c->rprev->rnext = c->rnext;
	else
		rel->rd_head = c->rnext;
	if (c->rnext)
		c->rnext->rprev = c->rprev;
	else
		rel->rd_tail = c->rprev;
	c->ready = false;
	c->rnext = c->rprev = NULL;
}

/* Append @s to the list *@head .. *@tail (the retransmission queue or the timed list). */
static void seg_append(struct txseg **head, struct txseg **tail, struct txseg *s)
{
	s->qnext = NULL;
	s->qprev = *tail;
	if (*tail)
		(*tail)->qnext = s;
	else
		*head = s;
	*tail = s;
}

static void seg_unlink(struct txseg **head, struct txseg **tail, struct txseg *s)
{
	if (s->qprev)
		s->qprev->qnext = s->qnext;
	else
		*head = s->qnext;
	if (s->qnext)
		s->qnext->qprev = s->qprev;
	else
		*tail = s->qprev;
	s->qnext = s->qprev = NULL;
}

static void rq_push(struct mp_rel_conn *c, struct txseg *s, uint8_t why)
{
	s->flags |= TS_LOSTQ | why;
	seg_append(&c->rq_head, &c->rq_tail, s);
}

static void rq_unlink(struct mp_rel_conn *c, struct txseg *s)
{
	if (!(s->flags & TS_LOSTQ))
		return;
	seg_unlink(&c->rq_head, &c->rq_tail, s);
	s->flags &= (uint8_t)~(TS_LOSTQ | TS_FAST);
}

/*
 * Retransmission timing: one timer per connection, not one per segment.
 * The segments in flight sit in a list in the order they were (re)sent,
 * each with its own timeout, and the connection's timer is due for the
 * oldest. Sending appends and an acknowledgement unlinks, a few pointer
 * writes (a wheel node per segment cost a division and a slot's cache line
 * for every frame). The timer is moved lazily: when it fires for a head
 * since acknowledged, it re-arms for the new one. A later segment due
 * earlier than the head (the timeout shrank in between) waits for it, as
 * in TCP, which times the oldest segment only.
 */
static void seg_time(struct mp_rel_conn *c, struct txseg *s, uint64_t due)
{
	s->due = due;
	s->flags |= TS_TIMED;
	if (!c->t_head && (!tw_armed(&c->t_rto) || due < c->t_rto.deadline))
		tw_rearm(&c->rel->wheel, &c->t_rto, due);
	seg_append(&c->t_head, &c->t_tail, s);
}

static void seg_untime(struct mp_rel_conn *c, struct txseg *s)
{
	if (!(s->flags & TS_TIMED))
		return;
	s->flags &= (uint8_t)~TS_TIMED;
	seg_unlink(&c->t_head, &c->t_tail, s);
}

/* ---- segments out -------------------------------------------------------- */

static uint64_t rto_backoff(const struct mp_rel *rel, uint64_t base, uint32_t n)
{
	uint64_t v = base;

	for (uint32_t i = 0; i < n && v < rel->p.rto_max_ns; i++)
		v <<= 1;
	return v < rel->p.rto_max_ns ? v : rel->p.rto_max_ns;
}

/* The timeout of a segment sent now. */
static inline uint64_t cur_rto(const struct mp_rel_conn *c)
{
	return rto_backoff(c->rel, c->rto, c->backoff);
}

static void hdr_fill(const struct mp_rel_conn *c, uint8_t *h, unsigned type, unsigned flags)
{
	const struct mp_rel *rel = c->rel;

	mp_le_put16(h, REL_MAGIC);
	h[2] = REL_VERSION;
	h[3] = (uint8_t)type;
	h[4] = (uint8_t)flags;
	h[5] = 0;
	mp_le_put16(h + 6, 0);
	mp_le_put32(h + 8, type == SEG_SYN ? 0 : c->peer_id);
	mp_le_put32(h + 12, c->id);
	mp_le_put32(h + 16, 0);
	mp_le_put32(h + 20, c->rcv_nxt);
	mp_le_put32(h + 24, c->rx_tail);
	mp_le_put16(h + 28, (uint16_t)(rel->wmask + 1));
	mp_le_put16(h + 30, (uint16_t)rel->p.mss);
}

static int emit(struct mp_rel_conn *c, const uint8_t *h, size_t hlen, const struct mp_iov *iov, int n)
{
	struct mp_rel *rel = c->rel;
	int rc = rel->p.tx(rel->p.user, c->route, h, hlen, iov, n);

	if (rc == -EAGAIN) {
		rel->st.tx_again++;
		return -EAGAIN;
	}
	/* Other errors: the frame is as good as lost on the wire. */
	rel->st.seg_tx++;
	rel->progress++;
	return 0;
}

/* What went out carried our cumulative ack and credit. */
static void acked_out(struct mp_rel_conn *c)
{
	c->unacked = 0;
	c->credit_sent = c->rx_tail;
	if (c->rcv_high == c->rcv_nxt) /* no holes: no SACK owed */
		c->ack_now = false;
	tw_del(&c->rel->wheel, &c->t_dack);
}

/*
 * SACK words after the header at @h for what we hold beyond the cumulative
 * ack; sets nsack and returns how many were written.
 */
static unsigned sack_fill(const struct mp_rel_conn *c, uint8_t *h)
{
	const struct mp_rel *rel = c->rel;
	unsigned n = 0;

	if (c->rcv_high != c->rcv_nxt) {
		uint32_t wb0 = c->rcv_nxt & ~63u, hi = c->rcv_nxt + rel->wmask + 1;

		n = ((c->rcv_high - 1 - wb0) >> 6) + 1;
		if (n > REL_SACK_MAX)
			n = REL_SACK_MAX;
		for (unsigned k = 0; k < n; k++) {
			uint32_t wb = wb0 + 64 * k;
			uint64_t w = c->held[(wb >> 6) & (rel->hwords - 1)] &
				     range_mask(wb, c->rcv_nxt, hi);

			mp_le_put64(h + REL_HDR_LEN + 8 * k, w);
		}
		h[5] = (uint8_t)n;
	}
	return n;
}

static int send_ctl(struct mp_rel_conn *c, unsigned type)
{
	uint8_t h[MP_REL_HDR_MAX];
	unsigned n = 0;

	hdr_fill(c, h, type, 0);
	/* FIN and RST carry our acknowledgement in full, so that a peer whose
	 * last data we took before closing sees its sends complete. */
	if (type == SEG_FIN || type == SEG_RST)
		n = sack_fill(c, h);
	int rc = emit(c, h, REL_HDR_LEN + 8 * n, NULL, 0);

	if (!rc) {
		c->rel->st.ctl_tx++;
		acked_out(c);
	}
	return rc;
}

static int send_ack(struct mp_rel_conn *c, unsigned flags)
{
	struct mp_rel *rel = c->rel;
	uint8_t h[MP_REL_HDR_MAX];
	unsigned n;

	hdr_fill(c, h, SEG_ACK, flags);
	n = sack_fill(c, h);
	int rc = emit(c, h, REL_HDR_LEN + 8 * n, NULL, 0);

	if (!rc) {
		if (flags & REL_F_PROBE)
			rel->st.probe_tx++;
		else
			rel->st.ack_tx++;
		c->unacked = 0;
		c->credit_sent = c->rx_tail;
		c->ack_now = false;
		tw_del(&rel->wheel, &c->t_dack);
	}
	return rc;
}

static int send_data(struct mp_rel_conn *c, struct txseg *s)
{
	const struct txmsg *m = &c->txm[s->msg & c->rel->pmask];
	uint8_t h[MP_REL_DATA_HDR_LEN];
	struct mp_iov pl[MP_DRV_IOV_MAX];
	int n = 0;
	uint32_t off = s->off, left = s->len;

	hdr_fill(c, h, SEG_DATA, 0);
	mp_le_put16(h + 6, (uint16_t)s->len);
	mp_le_put32(h + 16, s->seq);
	mp_le_put32(h + 32, s->msg);
	mp_le_put32(h + 36, s->off);
	mp_le_put32(h + 40, m->len);
	for (int i = 0; i < MP_DRV_IOV_MAX && left; i++) {
		if (off >= m->iov[i].len) {
			off -= (uint32_t)m->iov[i].len;
			continue;
		}
		size_t take = m->iov[i].len - off < left ? m->iov[i].len - off : left;

		pl[n].base = (const uint8_t *)m->iov[i].base + off;
		pl[n].len = take;
		n++;
		left -= (uint32_t)take;
		off = 0;
	}
	int rc = emit(c, h, sizeof(h), pl, n);

	if (!rc)
		acked_out(c);
	return rc;
}

/* ---- completions and failure --------------------------------------------- */

static void tx_complete_head(struct mp_rel_conn *c)
{
	struct mp_rel *rel = c->rel;

	while (c->tx_head != c->tx_seg && c->txm[c->tx_head & rel->pmask].done) {
		struct txmsg *m = &c->txm[c->tx_head & rel->pmask];

		rel->st.bytes_tx += m->len;
		req_done(rel, m->req, 0, m->len);
		m->req = NULL;
		c->tx_head++;
	}
}

static void rx_complete_head(struct mp_rel_conn *c)
{
	struct mp_rel *rel = c->rel;

	while (c->rx_head != c->rx_tail && c->rxm[c->rx_head & rel->pmask].state == RX_DONE) {
		struct rxslot *x = &c->rxm[c->rx_head & rel->pmask];

		if (x->req) {
			rel->st.bytes_rx += x->mlen;
			req_done(rel, x->req, 0, x->mlen);
		}
		x->req = NULL;
		x->state = 0;
		c->rx_head++;
	}
}

/* Complete everything posted with @err and stop all activity. */
static void conn_abort(struct mp_rel_conn *c, int err)
{
	struct mp_rel *rel = c->rel;

	for (uint32_t i = c->tx_head; i != c->tx_tail; i++) {
		struct txmsg *m = &c->txm[i & rel->pmask];

		if (m->req)
			req_done(rel, m->req, err, 0);
		m->req = NULL;
	}
	c->tx_head = c->tx_seg = c->tx_tail;
	for (uint32_t i = c->rx_head; i != c->rx_tail; i++) {
		struct rxslot *x = &c->rxm[i & rel->pmask];

		if (x->req)
			req_done(rel, x->req, err, 0);
		x->req = NULL;
		x->state = 0;
	}
	c->rx_head = c->rx_tail;
	for (uint32_t s = c->snd_una; s != c->snd_nxt; s++) {
		struct txseg *t = &c->txs[s & rel->wmask];

		t->flags = 0;
	}
	c->rq_head = c->rq_tail = NULL;
	c->t_head = c->t_tail = NULL;
	tw_del(&rel->wheel, &c->t_rto);
	c->snd_una = c->snd_nxt;
	tw_del(&rel->wheel, &c->t_dack);
	tw_del(&rel->wheel, &c->t_ctl);
	conn_unready(c);
	c->state = C_FAILED;
	c->err = err;
}

static void conn_fail(struct mp_rel_conn *c, int err, bool rst)
{
	if (c->state == C_FAILED)
		return;
	if (rst && c->state == C_OPEN)
		send_ctl(c, SEG_RST); /* best effort: the peer may be gone */
	MP_INFO("dpdk rel: connection %08x (route %u) failed: %s", c->id, c->route,
		err == -ETIMEDOUT ? "peer silent" : err == -ECONNREFUSED ? "refused" : "reset by peer");
	c->rel->st.conns_failed++;
	conn_abort(c, err);
}

/* ---- acknowledgements in ------------------------------------------------- */

void mp_rel_rtt_sample(struct mp_rel_rtt *e, uint64_t r, uint64_t g, uint64_t lo, uint64_t hi)
{
	if (!e->srtt) {
		e->srtt = r ? r : 1;
		e->rttvar = r / 2;
	} else {
		uint64_t d = e->srtt > r ? e->srtt - r : r - e->srtt;

		e->rttvar = (3 * e->rttvar + d) / 4;
		e->srtt = (7 * e->srtt + r) / 8;
		if (!e->srtt)
			e->srtt = 1; /* 0 means "no sample yet" */
	}
	uint64_t v = 4 * e->rttvar > g ? 4 * e->rttvar : g;

	e->rto = e->srtt + v;
	if (e->rto < lo)
		e->rto = lo;
	if (e->rto > hi)
		e->rto = hi;
}

/* A valid sample (Karn: of a segment sent once) ends any timeout backoff. */
static void rtt_sample(struct mp_rel_conn *c, uint64_t r)
{
	const struct mp_rel *rel = c->rel;

	mp_rel_rtt_sample(&c->rtt, r, rel->wheel.tick, rel->p.rto_min_ns, rel->p.rto_max_ns);
	c->rto = c->rtt.rto;
	c->backoff = 0;
	c->hold_until = 0;
}

/*
 * Segment @s reached the peer; @rack collects the latest send time
 * delivered, @rtt_sent the latest of segments sent only once (one RTT
 * sample per ACK: RFC 6298 expects about one per round trip, and a sample
 * per segment would let a few segments' worth of history set the timeout).
 */
static void seg_acked(struct mp_rel_conn *c, struct txseg *s, uint64_t *rack, uint64_t *rtt_sent)
{
	struct mp_rel *rel = c->rel;
	struct txmsg *m = &c->txm[s->msg & rel->pmask];

	seg_untime(c, s);
	rq_unlink(c, s);
	if (!s->retx && s->sent_ns > *rtt_sent)
		*rtt_sent = s->sent_ns;
	if (s->sent_ns > *rack)
		*rack = s->sent_ns;
	if (++m->acked == m->nseg) {
		m->done = true;
		tx_complete_head(c);
	}
}

/* Process the ack fields of a validated segment (not stale). */
static bool on_ack(struct mp_rel_conn *c, uint32_t ack, uint32_t credit, uint32_t wnd,
		   const uint8_t *sack, unsigned nsack)
{
	struct mp_rel *rel = c->rel;
	uint32_t hmask = rel->hwords - 1;
	uint64_t rack = 0, rtt_sent = 0;
	bool moved = false;

	if (seq_lt(c->peer_credit, credit)) {
		c->peer_credit = credit;
		moved = true;
	}
	uint32_t end = ack + (wnd < rel->wmask + 1 ? wnd : rel->wmask + 1);

	if (seq_lt(c->peer_wnd_end, end)) {
		c->peer_wnd_end = end;
		moved = true;
	}
	while (c->snd_una != ack) {
		struct txseg *s = &c->txs[c->snd_una & rel->wmask];

		if (!(s->flags & TS_SACK))
			seg_acked(c, s, &rack, &rtt_sent);
		c->sacked[(c->snd_una >> 6) & hmask] &= ~(1ull << (c->snd_una & 63));
		s->flags = 0;
		c->snd_una++;
		moved = true;
	}
	if (seq_lt(c->high_sack, c->snd_una))
		c->high_sack = c->snd_una;
	for (unsigned k = 0; k < nsack; k++) {
		uint32_t wb = (ack & ~63u) + 64 * k;
		uint64_t *mine = &c->sacked[(wb >> 6) & hmask];
		uint64_t nw = mp_le_get64(sack + 8 * k) & range_mask(wb, c->snd_una, c->snd_nxt) & ~*mine;

		*mine |= nw;
		while (nw) {
			unsigned b = (unsigned)__builtin_ctzll(nw);
			struct txseg *s = &c->txs[(wb + b) & rel->wmask];

			nw &= nw - 1;
			s->flags |= TS_SACK;
			seg_acked(c, s, &rack, &rtt_sent);
			if (seq_lt(c->high_sack, wb + b + 1))
				c->high_sack = wb + b + 1;
			moved = true;
		}
	}
	if (rtt_sent)
		rtt_sample(c, rel->now - rtt_sent);
	/* Fast retransmit: a hole sent before something that was delivered is
	 * lost, give or take a quarter of the RTT of reordering. */
	if (rack > c->rack_ts) {
		c->rack_ts = rack;
		uint64_t reo = c->rtt.srtt / 4;

		for (uint32_t s = c->snd_una; seq_lt(s, c->high_sack);) {
			uint32_t wb = s & ~63u;
			uint64_t holes = range_mask(wb, s, c->high_sack) & ~c->sacked[(wb >> 6) & hmask];

			while (holes) {
				unsigned b = (unsigned)__builtin_ctzll(holes);
				struct txseg *t = &c->txs[(wb + b) & rel->wmask];

				holes &= holes - 1;
				if (!(t->flags & TS_LOSTQ) && t->sent_ns + reo < c->rack_ts) {
					seg_untime(c, t);
					rq_push(c, t, TS_FAST);
				}
			}
			s = wb + 64;
		}
	}
	if (moved)
		rel->st.ack_rx++;
	return moved;
}

/* ---- segments in --------------------------------------------------------- */

static inline void drop(struct mp_rel *rel, enum mp_rel_drop why)
{
	rel->st.drop[why]++;
}

static struct mp_rel_conn *conn_new(struct mp_rel *rel, uint32_t route)
{
	struct mp_rel_conn *c;
	uint32_t w = rel->wmask + 1, pn = rel->pmask + 1;

	if (!rel->nfree)
		return NULL;
	c = calloc(1, sizeof(*c));
	if (!c)
		return NULL;
	c->txm = calloc(pn, sizeof(*c->txm));
	c->txs = calloc(w, sizeof(*c->txs));
	c->sacked = calloc(rel->hwords, sizeof(*c->sacked));
	c->rxm = calloc(pn, sizeof(*c->rxm));
	c->held = calloc(rel->hwords, sizeof(*c->held));
	if (!c->txm || !c->txs || !c->sacked || !c->rxm || !c->held) {
		free(c->txm);
		free(c->txs);
		free(c->sacked);
		free(c->rxm);
		free(c->held);
		free(c);
		return NULL;
	}
	for (uint32_t i = 0; i < w; i++)
		c->txs[i].c = c;
	c->t_rto.kind = TK_RTO;
	c->t_dack.kind = TK_DACK;
	c->t_ctl.kind = TK_CTL;
	c->idx = rel->free_idx[--rel->nfree];
	if (++rel->gen[c->idx] == 0)
		rel->gen[c->idx] = 1;
	uint32_t gen = rel->gen[c->idx];

	if (rel->p.lanes > 1) /* the lane in the top 4 bits: see mp_rel_seg_lane */
		gen = (gen & 0x0fffu) | rel->p.lane << 12;
	c->id = gen << 16 | (c->idx + 1);
	c->rel = rel;
	c->route = route;
	c->rto = rel->p.rto_min_ns;
	c->born_ns = rel->now;
	rel->conns[c->idx] = c;
	return c;
}

static void conn_free(struct mp_rel_conn *c)
{
	struct mp_rel *rel = c->rel;

	rel->conns[c->idx] = NULL;
	rel->free_idx[rel->nfree++] = c->idx;
	free(c->txm);
	free(c->txs);
	free(c->sacked);
	free(c->rxm);
	free(c->held);
	free(c);
}

static void establish(struct mp_rel_conn *c, uint32_t peer_id, uint32_t peer_mss)
{
	c->peer_id = peer_id;
	c->mss = peer_mss < c->rel->p.mss ? peer_mss : c->rel->p.mss;
	c->state = C_OPEN;
	c->tries = 0;
	tw_del(&c->rel->wheel, &c->t_ctl);
}

static void on_syn(struct mp_rel *rel, uint32_t route, uint32_t src, uint32_t credit,
		   uint32_t wnd, uint32_t mss)
{
	struct mp_rel_conn *c = NULL;

	/* SYNs are rare (one per connection, plus repeats): a linear lookup of
	 * the connection a repeated SYN already created is fine here. */
	for (uint32_t i = 0; i < rel->p.max_conns; i++) {
		struct mp_rel_conn *x = rel->conns[i];

		if (x && !x->active && x->route == route && x->peer_id == src) {
			c = x;
			break;
		}
	}
	if (c) {
		if (c->state != C_OPEN) {
			drop(rel, MP_REL_DROP_STATE);
			return;
		}
		if (seq_lt(c->peer_credit, credit))
			c->peer_credit = credit;
		c->synack_due = true; /* our SYN-ACK was lost */
	} else {
		if ((uint32_t)rel->aq.n >= rel->backlog || !(c = conn_new(rel, route))) {
			drop(rel, MP_REL_DROP_LISTEN);
			return;
		}
		establish(c, src, mss);
		c->peer_credit = credit;
		c->peer_wnd_end = wnd < rel->wmask + 1 ? wnd : rel->wmask + 1;
		c->synack_due = true;
		c->unaccepted = true;
		mp_reqq_push(&rel->aq, &c->alink);
	}
	rel->st.seg_rx++;
	conn_ready(c);
}

/* Advance the cumulative ack over held sequence numbers, a word at a time. */
static void rcv_advance(struct mp_rel_conn *c)
{
	uint32_t hmask = c->rel->hwords - 1;

	for (;;) {
		uint32_t bit = c->rcv_nxt & 63;
		uint64_t *w = &c->held[(c->rcv_nxt >> 6) & hmask];
		uint64_t run = ~(*w >> bit);
		unsigned n = run ? (unsigned)__builtin_ctzll(run) : 64;

		if (n > 64 - bit)
			n = 64 - bit;
		if (!n)
			return;
		*w &= ~range_mask(c->rcv_nxt & ~63u, c->rcv_nxt, c->rcv_nxt + n);
		c->rcv_nxt += n;
		if (bit + n < 64)
			return;
	}
}

void mp_rel_input(struct mp_rel *rel, uint32_t route, const void *seg, size_t len)
{
	const uint8_t *b = seg;

	if (!rel)
		return;
	if (!b || len < REL_HDR_LEN) {
		drop(rel, MP_REL_DROP_SHORT);
		return;
	}
	if (mp_le_get16(b) != REL_MAGIC) {
		drop(rel, MP_REL_DROP_MAGIC);
		return;
	}
	if (b[2] != REL_VERSION) {
		drop(rel, MP_REL_DROP_VERSION);
		return;
	}
	unsigned type = b[3], flags = b[4], nsack = b[5], plen = mp_le_get16(b + 6);

	if (type == 0 || type >= SEG_TYPE_END || (flags & ~REL_F_ALL) || (flags && type != SEG_ACK)) {
		drop(rel, MP_REL_DROP_TYPE);
		return;
	}
	bool sacks = type == SEG_ACK || type == SEG_FIN || type == SEG_RST;
	size_t want = type == SEG_DATA ? MP_REL_DATA_HDR_LEN + (size_t)plen
		      : sacks ? REL_HDR_LEN + 8 * (size_t)nsack : REL_HDR_LEN;
	uint32_t dst = mp_le_get32(b + 8), src = mp_le_get32(b + 12), seq = mp_le_get32(b + 16);
	uint32_t ack = mp_le_get32(b + 20), credit = mp_le_get32(b + 24);
	uint32_t wnd = mp_le_get16(b + 28), mss = mp_le_get16(b + 30);

	if ((type != SEG_DATA && plen) || (!sacks && nsack) || nsack > REL_SACK_MAX ||
	    len != want || !mss || !wnd || !src || (type == SEG_SYN) != (dst == 0) ||
	    (type == SEG_DATA && plen > mss)) {
		drop(rel, MP_REL_DROP_LENGTH);
		return;
	}
	rel_clock(rel);
	if (type == SEG_SYN) {
		on_syn(rel, route, src, credit, wnd, mss);
		return;
	}

	uint32_t idx = (dst & 0xffff) - 1;
	struct mp_rel_conn *c = idx < rel->p.max_conns ? rel->conns[idx] : NULL;

	if (!c || c->id != dst || c->route != route ||
	    (c->state != C_SYN_SENT && c->peer_id && c->peer_id != src)) {
		drop(rel, MP_REL_DROP_CONN);
		return;
	}
	if (c->state == C_FAILED || (type == SEG_SYNACK && !c->active)) {
		drop(rel, MP_REL_DROP_STATE);
		return;
	}
	/* Everything is checked before anything changes. */
	bool stale = seq_lt(ack, c->snd_una);

	if (!stale && seq_lt(c->snd_nxt, ack)) {
		drop(rel, MP_REL_DROP_ACK);
		return;
	}
	if (type == SEG_RST || type == SEG_FIN) {
		rel->st.seg_rx++;
		/* A peer that closes right after taking our last data says so in
		 * this segment's ack: those sends are complete, not reset. */
		if (c->state == C_OPEN && !stale)
			on_ack(c, ack, credit, wnd, b + REL_HDR_LEN, nsack);
		conn_fail(c, c->state == C_SYN_SENT ? -ECONNREFUSED : -ECONNRESET, false);
		return;
	}
	bool dup = false;
	uint32_t seg_mss = c->state == C_SYN_SENT ? (mss < rel->p.mss ? mss : rel->p.mss) : c->mss;
	uint32_t msg = 0, off = 0, mlen = 0, wsz = rel->wmask + 1;
	struct rxslot *x = NULL;

	if (type == SEG_DATA) {
		msg = mp_le_get32(b + 32);
		off = mp_le_get32(b + 36);
		mlen = mp_le_get32(b + 40);
		if (seq - c->rcv_nxt >= wsz) {
			if (c->rcv_nxt - seq > wsz) {
				drop(rel, MP_REL_DROP_WINDOW);
				return;
			}
			dup = true;
		} else if (c->held[(seq >> 6) & (rel->hwords - 1)] >> (seq & 63) & 1) {
			dup = true;
		}
		if (!dup) {
			if (msg - c->rx_head >= c->rx_tail - c->rx_head) {
				drop(rel, MP_REL_DROP_WINDOW); /* no receive posted: beyond credit */
				return;
			}
			x = &c->rxm[msg & rel->pmask];
			bool shape = mlen == 0 ? off == 0 && plen == 0
					       : off < mlen && off % seg_mss == 0 &&
							 plen == (mlen - off < seg_mss ? mlen - off : seg_mss);
			if (!shape || (x->state != RX_POSTED &&
				       (x->mlen != mlen || x->first_seq != seq - off / seg_mss))) {
				drop(rel, MP_REL_DROP_LENGTH);
				return;
			}
		}
	}

	rel->st.seg_rx++;
	c->heard = true;
	if (c->state == C_SYN_SENT) {
		establish(c, src, mss);
		conn_ready(c); /* what waited for the handshake may go */
	}
	if (!stale && on_ack(c, ack, credit, wnd, b + REL_HDR_LEN, nsack))
		conn_ready(c);
	if (flags & REL_F_PROBE) {
		c->ack_now = true;
		conn_ready(c);
	}
	if (type != SEG_DATA)
		return;
	conn_ready(c);
	if (dup) {
		rel->st.dup_rx++;
		c->ack_now = true; /* our ack may have been lost */
		return;
	}
	if (x->state == RX_POSTED) {
		x->mlen = mlen;
		x->first_seq = seq - off / seg_mss;
		x->nseg = mlen ? (mlen + seg_mss - 1) / seg_mss : 1;
		x->got = 0;
		x->state = RX_ACTIVE;
		x->stream = rel->p.stream_min && mlen >= rel->p.stream_min;
		if (mlen > x->cap) {
			req_done(rel, x->req, -EMSGSIZE, mlen);
			x->req = NULL;
			x->state = RX_TOOBIG;
		}
	}
	if (x->state == RX_ACTIVE && plen) {
		if (x->stream)
			mp_k_copy_stream(x->buf + off, b + MP_REL_DATA_HDR_LEN, plen);
		else
			memcpy(x->buf + off, b + MP_REL_DATA_HDR_LEN, plen);
	}
	rel->st.data_rx++;
	c->held[(seq >> 6) & (rel->hwords - 1)] |= 1ull << (seq & 63);
	if (seq_lt(c->rcv_high, seq + 1))
		c->rcv_high = seq + 1;
	if (seq == c->rcv_nxt)
		rcv_advance(c);
	if (seq_lt(c->rcv_high, c->rcv_nxt))
		c->rcv_high = c->rcv_nxt;
	if (c->rcv_high != c->rcv_nxt)
		c->ack_now = true; /* holes: SACK at once so the sender repairs them */
	c->unacked++;
	if (++x->got == x->nseg) {
		if (x->state == RX_ACTIVE && x->stream) {
			mp_k_stream_fence(); /* the data before the completion others read */
			rel->st.stream_rx++;
		}
		x->state = RX_DONE;
		rx_complete_head(c);
		/*
		 * Acknowledge a whole message at once: the application may stop
		 * polling as soon as it sees its receives complete, and a
		 * delayed ACK would then wait for its next poll while the sender
		 * retransmits into a ring nobody reads (doc/dpdk.md,
		 * "Troubleshooting": the memif stall).
		 */
		c->ack_now = true;
	}
}

/* ---- timers -------------------------------------------------------------- */

static bool conn_needs_probe(const struct mp_rel_conn *c)
{
	return c->state == C_OPEN && c->snd_una == c->snd_nxt &&
	       (c->tx_head != c->tx_tail || c->rx_head != c->rx_tail);
}

static uint64_t probe_interval(const struct mp_rel_conn *c)
{
	/* Data waiting on the peer's window: a lost window update must not
	 * stall us for a keepalive period. */
	if (c->tx_seg != c->tx_tail)
		return rto_backoff(c->rel, c->rto, c->tries);
	return c->rel->p.keepalive_ns;
}

static void rel_fire(struct mp_rel *rel, struct tw_node *n)
{
	if (n->kind == TK_RTO) {
		struct mp_rel_conn *c = mp_container_of(n, struct mp_rel_conn, t_rto);
		struct txseg *s = c->t_head;

		if (!s)
			return;
		/* Armed for a head since acknowledged: wait for the new one. */
		if (s->due > rel->now) {
			tw_add(&rel->wheel, &c->t_rto, s->due);
			return;
		}
		/*
		 * As in TCP, one timeout resends one segment, and the other
		 * segments wait for its answer (and its backoff): a peer that
		 * was only slow (descheduled on a shared core) then costs one
		 * spurious retransmission, not a window of them. If it was a
		 * loss, the ACK of the resent segment makes fast retransmit
		 * repair the rest (they were sent before it).
		 */
		if (rel->now < c->hold_until) {
			tw_add(&rel->wheel, &c->t_rto, c->hold_until);
			return;
		}
		if (s->retx >= rel->p.max_retries || c->backoff >= rel->p.max_retries) {
			conn_fail(c, -ETIMEDOUT, true);
			return;
		}
		rel->st.rto_fired++;
		c->backoff++;
		c->hold_until = rel->now + cur_rto(c);
		seg_untime(c, s);
		rq_push(c, s, 0);
		conn_ready(c);
		if (c->t_head)
			tw_add(&rel->wheel, &c->t_rto,
			       c->t_head->due > c->hold_until ? c->t_head->due : c->hold_until);
	} else if (n->kind == TK_DACK) {
		struct mp_rel_conn *c = mp_container_of(n, struct mp_rel_conn, t_dack);

		c->ack_now = true;
		conn_ready(c);
	} else {
		struct mp_rel_conn *c = mp_container_of(n, struct mp_rel_conn, t_ctl);

		if (c->state == C_SYN_SENT) {
			uint64_t to = rel->p.connect_timeout_ns;

			if (to ? rel->now - c->born_ns >= to : c->tries > rel->p.max_retries) {
				conn_fail(c, -ETIMEDOUT, false);
				return;
			}
			c->syn_due = true;
			conn_ready(c);
			return;
		}
		if (!conn_needs_probe(c)) {
			c->tries = 0;
			return;
		}
		if (c->heard) {
			/* The peer spoke during the interval: it is alive. */
			c->heard = false;
			c->tries = 0;
			tw_add(&rel->wheel, &c->t_ctl, rel->now + probe_interval(c));
			return;
		}
		if (c->tries >= rel->p.max_retries) {
			conn_fail(c, -ETIMEDOUT, true);
			return;
		}
		c->tries++;
		c->probe_due = true;
		conn_ready(c);
		tw_add(&rel->wheel, &c->t_ctl, rel->now + probe_interval(c));
	}
}

/* ---- output -------------------------------------------------------------- */

static bool can_send_new(const struct mp_rel_conn *c)
{
	const struct mp_rel *rel = c->rel;

	return c->tx_seg != c->tx_tail && seq_lt(c->tx_seg, c->peer_credit) &&
	       c->snd_nxt - c->snd_una <= rel->wmask && seq_lt(c->snd_nxt, c->peer_wnd_end);
}

static int send_new(struct mp_rel_conn *c)
{
	struct mp_rel *rel = c->rel;
	struct txmsg *m = &c->txm[c->tx_seg & rel->pmask];
	struct txseg *s = &c->txs[c->snd_nxt & rel->wmask];

	if (!c->tx_off) {
		m->first_seq = c->snd_nxt;
		m->nseg = m->len ? (m->len + c->mss - 1) / c->mss : 1;
	}
	s->seq = c->snd_nxt;
	s->msg = c->tx_seg;
	s->off = c->tx_off;
	s->len = m->len - c->tx_off < c->mss ? m->len - c->tx_off : c->mss;
	s->retx = 0;
	s->flags = TS_INFL;
	int rc = send_data(c, s);

	if (rc) {
		s->flags = 0;
		return rc;
	}
	rel->st.data_tx++;
	s->sent_ns = rel->now;
	seg_time(c, s, rel->now + cur_rto(c));
	c->snd_nxt++;
	c->tx_off += s->len;
	if (c->tx_off >= m->len) {
		c->tx_seg++;
		c->tx_off = 0;
	}
	return 0;
}

static int send_rtx(struct mp_rel_conn *c)
{
	struct mp_rel *rel = c->rel;
	struct txseg *s = c->rq_head;
	bool fast = s->flags & TS_FAST;
	int rc = send_data(c, s);

	if (rc)
		return rc;
	rq_unlink(c, s);
	rel->st.data_rtx++;
	if (fast)
		rel->st.fast_rtx++;
	s->retx++;
	s->sent_ns = rel->now;
	seg_time(c, s, rel->now + cur_rto(c));
	return 0;
}

/* Send what @c may send, at most REL_BURST data segments. 1 = more left. */
static int conn_output(struct mp_rel_conn *c)
{
	struct mp_rel *rel = c->rel;
	int rc = 0, budget = REL_BURST;

	if (c->state == C_SYN_SENT) {
		if (c->syn_due) {
			if ((rc = send_ctl(c, SEG_SYN)))
				return rc;
			c->syn_due = false;
			uint64_t at = rel->now + rto_backoff(rel, rel->p.rto_min_ns, c->tries++);

			if (rel->p.connect_timeout_ns && at > c->born_ns + rel->p.connect_timeout_ns)
				at = c->born_ns + rel->p.connect_timeout_ns;
			tw_rearm(&rel->wheel, &c->t_ctl, at);
		}
		return 0;
	}
	if (c->state != C_OPEN)
		return 0;
	if (c->synack_due) {
		if ((rc = send_ctl(c, SEG_SYNACK)))
			return rc;
		c->synack_due = false;
	}
	while (budget > 0) {
		if (c->rq_head)
			rc = send_rtx(c);
		else if (can_send_new(c))
			rc = send_new(c);
		else
			break;
		if (rc)
			return rc;
		budget--;
	}
	if (c->probe_due) {
		if ((rc = send_ack(c, REL_F_PROBE)))
			return rc;
		c->probe_due = false;
	}
	if (c->ack_now || c->unacked >= rel->ack_every || c->credit_sent != c->rx_tail) {
		if ((rc = send_ack(c, 0)))
			return rc;
	} else if (c->unacked && !tw_armed(&c->t_dack)) {
		tw_add(&rel->wheel, &c->t_dack, rel->now + rel->p.ack_delay_ns);
	}
	if (!tw_armed(&c->t_ctl) && conn_needs_probe(c)) {
		c->heard = false;
		tw_add(&rel->wheel, &c->t_ctl, rel->now + probe_interval(c));
	}
	return budget == 0 && (c->rq_head || can_send_new(c));
}

int mp_rel_poll(struct mp_rel *rel)
{
	uint64_t before = rel->progress;
	struct mp_rel_conn *c, *last;

	rel_clock(rel);
	tw_expire(&rel->wheel, rel->now, rel);
	/* One pass over the connections ready now; those with more to send
	 * go to the back for the next pass. */
	last = rel->rd_tail;
	while ((c = rel->rd_head) != NULL) {
		bool end = c == last;

		conn_unready(c);
		int rc = conn_output(c);

		if (rc == -EAGAIN) {
			/* tx ring full: resume with this connection next time. */
			conn_ready_at(c, true);
			break;
		}
		if (rc > 0)
			conn_ready(c);
		if (end)
			break;
	}
	return rel->progress != before;
}

uint64_t mp_rel_next_deadline_ns(const struct mp_rel *rel)
{
	if (rel->rd_head)
		return 0;
	return tw_next(&rel->wheel);
}

/* ---- connections and requests -------------------------------------------- */

int mp_rel_listen(struct mp_rel *rel, uint32_t backlog)
{
	rel->backlog = backlog;
	if (!backlog) {
		struct mp_rel_conn *c;

		while ((c = mp_reqq_pop_entry(&rel->aq, struct mp_rel_conn, alink)) != NULL) {
			c->unaccepted = false;
			mp_rel_close(c);
		}
	}
	return 0;
}

int mp_rel_accept(struct mp_rel *rel, struct mp_rel_conn **out)
{
	struct mp_rel_conn *c = mp_reqq_pop_entry(&rel->aq, struct mp_rel_conn, alink);

	if (!c)
		return -EAGAIN;
	c->unaccepted = false;
	*out = c;
	return 0;
}

int mp_rel_connect(struct mp_rel *rel, uint32_t route, struct mp_rel_conn **out)
{
	struct mp_rel_conn *c;

	if (!out)
		return -EINVAL;
	if (!rel->nfree)
		return -ENOSPC;
	rel_clock(rel);
	c = conn_new(rel, route);
	if (!c)
		return -ENOMEM;
	c->active = true;
	c->state = C_SYN_SENT;
	c->mss = rel->p.mss;
	c->syn_due = true;
	conn_ready(c);
	*out = c;
	return 0;
}

void mp_rel_close(struct mp_rel_conn *c)
{
	struct mp_rel *rel;

	if (!c)
		return;
	rel = c->rel;
	rel_clock(rel);
	if (c->unaccepted)
		mp_reqq_remove(&rel->aq, &c->alink);
	if (c->state == C_OPEN)
		send_ctl(c, SEG_FIN); /* best effort; a peer that misses it times out */
	if (c->state != C_FAILED)
		conn_abort(c, -ECANCELED);
	conn_free(c);
}

uint64_t mp_rel_conn_rto_ns(const struct mp_rel_conn *c)
{
	return cur_rto(c);
}

uint32_t mp_rel_conn_route(const struct mp_rel_conn *c)
{
	return c->route;
}

int mp_rel_conn_status(const struct mp_rel_conn *c)
{
	return c->state == C_FAILED ? c->err : c->state == C_OPEN;
}

void mp_rel_conn_set_user(struct mp_rel_conn *c, void *user)
{
	c->user = user;
}

void *mp_rel_conn_user(const struct mp_rel_conn *c)
{
	return c->user;
}

/*
 * A request for one more post on @c, whose queue holds @queued already: the
 * connection's error once it failed, -EAGAIN when the queue is full.
 */
static int post_req(struct mp_rel_conn *c, uint32_t queued, struct mp_rel_req **r)
{
	if (c->state == C_FAILED)
		return c->err;
	if (queued > c->rel->pmask)
		return -EAGAIN;
	*r = req_get(c->rel);
	return *r ? 0 : -ENOMEM;
}

int mp_rel_send(struct mp_rel_conn *c, const struct mp_iov *iov, int iovcnt, struct mp_rel_req **out)
{
	struct mp_rel_req *r = NULL;
	int rc;
	uint64_t total = 0;

	if (!c || !out || !iov || iovcnt < 1 || iovcnt > MP_DRV_IOV_MAX)
		return -EINVAL;
	for (int i = 0; i < iovcnt; i++) {
		if (iov[i].len && !iov[i].base)
			return -EINVAL;
		total += iov[i].len;
	}
	if (total > UINT32_MAX)
		return -EINVAL;
	rc = post_req(c, c->tx_tail - c->tx_head, &r);
	if (rc)
		return rc;
	struct txmsg *m = &c->txm[c->tx_tail & c->rel->pmask];

	memset(m, 0, sizeof(*m));
	for (int i = 0; i < iovcnt; i++)
		m->iov[i] = iov[i];
	m->len = (uint32_t)total;
	m->req = r;
	c->tx_tail++;
	conn_ready(c);
	*out = r;
	return 0;
}

int mp_rel_recv(struct mp_rel_conn *c, void *buf, size_t cap, struct mp_rel_req **out)
{
	struct mp_rel_req *r = NULL;
	int rc;

	if (!c || !out || (!buf && cap))
		return -EINVAL;
	rc = post_req(c, c->rx_tail - c->rx_head, &r);
	if (rc)
		return rc;
	struct rxslot *x = &c->rxm[c->rx_tail & c->rel->pmask];

	memset(x, 0, sizeof(*x));
	x->req = r;
	x->buf = buf;
	x->cap = cap;
	x->state = RX_POSTED;
	c->rx_tail++;
	conn_ready(c); /* the credit goes out */
	*out = r;
	return 0;
}

/* ---- instance ------------------------------------------------------------ */

static bool pow2(uint32_t v)
{
	return v && !(v & (v - 1));
}

int mp_rel_create(const struct mp_rel_params *pin, struct mp_rel **out)
{
	struct mp_rel *rel;
	struct mp_rel_params p;

	if (!pin || !out || !pin->tx)
		return -EINVAL;
	p = *pin;
	if (!p.mss)
		p.mss = MP_REL_MSS_DEFAULT;
	if (!p.window)
		p.window = 256;
	if (!p.max_posted)
		p.max_posted = 64;
	if (!p.max_conns)
		p.max_conns = 256;
	if (!p.max_retries)
		p.max_retries = 15;
	if (!p.rto_min_ns)
		p.rto_min_ns = 1000000;
	if (!p.rto_max_ns)
		p.rto_max_ns = 250000000;
	if (!p.ack_delay_ns)
		p.ack_delay_ns = p.rto_min_ns / 8;
	if (!p.keepalive_ns)
		p.keepalive_ns = p.rto_max_ns;
	if (!p.now_ns)
		p.now_ns = clock_now;
	if (p.mss > MP_REL_MSS_MAX || !pow2(p.window) || p.window < 64 ||
	    p.window > MP_REL_WINDOW_MAX || !pow2(p.max_posted) || p.max_conns > 65535 ||
	    p.rto_max_ns < p.rto_min_ns || p.max_retries > 60 || p.lanes > 16 ||
	    (p.lanes > 1 && p.lane >= p.lanes))
		return -EINVAL;
	rel = calloc(1, sizeof(*rel));
	if (!rel)
		return -ENOMEM;
	rel->p = p;
	rel->wmask = p.window - 1;
	rel->pmask = p.max_posted - 1;
	rel->hwords = p.window / 64;
	/* Ack at least every 1/16 window: the sender's window keeps moving
	 * while the ack traffic stays a few percent of the data. */
	rel->ack_every = p.window / 16;
	rel->reqs = MP_REQPOOL(struct mp_rel_req, base.link, REQ_CHUNK);
	rel->conns = calloc(p.max_conns, sizeof(*rel->conns));
	rel->gen = calloc(p.max_conns, sizeof(*rel->gen));
	rel->free_idx = calloc(p.max_conns, sizeof(*rel->free_idx));
	rel_clock(rel);
	/* A tick of rto_min / 8 keeps timers within 13% of their time; the
	 * wheel's turn (4096 ticks) then spans 512 rto_min. */
	int rc = tw_init(&rel->wheel, p.rto_min_ns / 8 ? p.rto_min_ns / 8 : 1, rel->now);

	if (rc || !rel->conns || !rel->gen || !rel->free_idx) {
		tw_fini(&rel->wheel);
		free(rel->conns);
		free(rel->gen);
		free(rel->free_idx);
		free(rel);
		return -ENOMEM;
	}
	uint64_t seed = p.seed ? p.seed : rel->now ^ (uint64_t)(uintptr_t)rel;

	for (uint32_t i = 0; i < p.max_conns; i++) {
		seed = seed * 6364136223846793005ull + 1442695040888963407ull;
		rel->gen[i] = (uint16_t)(seed >> 48);
		rel->free_idx[i] = p.max_conns - 1 - i; /* index 0 first */
	}
	rel->nfree = p.max_conns;
	*out = rel;
	return 0;
}

void mp_rel_destroy(struct mp_rel *rel)
{
	if (!rel)
		return;
	mp_rel_listen(rel, 0);
	for (uint32_t i = 0; i < rel->p.max_conns; i++)
		if (rel->conns[i])
			mp_rel_close(rel->conns[i]);
	mp_reqpool_fini(&rel->reqs);
	tw_fini(&rel->wheel);
	free(rel->conns);
	free(rel->gen);
	free(rel->free_idx);
	free(rel);
}

void mp_rel_get_stats(const struct mp_rel *rel, struct mp_rel_stats *out)
{
	*out = rel->st;
}

int mp_rel_seg_lane(const void *seg, size_t len)
{
	const uint8_t *b = seg;

	if (!b || len < REL_HDR_LEN || mp_le_get16(b) != REL_MAGIC || b[2] != REL_VERSION ||
	    b[3] == SEG_SYN)
		return -1;
	return (int)(mp_le_get32(b + 8) >> 28);
}

struct mp_rel *mp_rel_conn_rel(const struct mp_rel_conn *c)
{
	return c->rel;
}

struct mp_rel *mp_rel_req_rel(const struct mp_rel_req *r)
{
	return r->owner;
}

void *mp_rel_user(const struct mp_rel *rel)
{
	return rel->p.user;
}

const char *mp_rel_drop_name(int why)
{
	static const char *const names[MP_REL_DROP_MAX] = {
		[MP_REL_DROP_SHORT] = "short",     [MP_REL_DROP_MAGIC] = "magic",
		[MP_REL_DROP_VERSION] = "version", [MP_REL_DROP_TYPE] = "type",
		[MP_REL_DROP_LENGTH] = "length",   [MP_REL_DROP_CONN] = "conn",
		[MP_REL_DROP_WINDOW] = "window",   [MP_REL_DROP_ACK] = "ack",
		[MP_REL_DROP_STATE] = "state",     [MP_REL_DROP_LISTEN] = "listen",
	};

	return why >= 0 && why < MP_REL_DROP_MAX ? names[why] : "?";
}
