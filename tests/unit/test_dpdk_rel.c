/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Reliable delivery of the dpdk driver (drivers/dpdk/rel.c) without DPDK:
 * instances joined by a simulated link that loses, duplicates and reorders
 * frames with seeded probabilities, on a virtual clock. Every wait is bounded
 * in virtual time.
 *
 * The link also checks the protocol from outside: a DATA segment whose
 * sequence number is beyond what its receiver ever advertised (ack +
 * window), or whose message is beyond the receiver's credit, counts as an
 * overrun; every test asserts there were none.
 *
 * `test_dpdk_rel --bench [MiB]` pushes 1 GiB (or MiB) through a lossless
 * link and prints MB/s beside memcpy of the same bytes (meson benchmark).
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <moshpit/sdk/le.h>

#include "drivers/dpdk/rel.h"

#define NI 3             /* instances */
#define MSS 1000         /* test mss: a 1 MiB message is 1049 segments */
#define MIB (1u << 20)
#define SEC 1000000000ull
#define MS 1000000ull
#define US 1000ull

/* ---- simulated link ------------------------------------------------------ */

struct frame {
	uint64_t at, order;
	int src, dst;
	size_t len;
	struct frame *next; /* free list */
	uint8_t data[];
};

/* What one connection id ever advertised: ack + window, credit. */
struct adv {
	uint32_t id;
	uint32_t end, credit;
	bool set;
};

struct sim {
	uint64_t now;
	uint64_t rng;
	struct mp_rel *rel[NI];
	int idx[NI];
	/* link behaviour */
	double loss, dup, reorder;
	uint64_t delay, jitter;
	bool cut[NI];       /* vanished: frames to and from it are lost */
	int tx_budget;      /* frames accepted per step before -EAGAIN (0: no limit) */
	int tx_used[NI];
	/* in flight: a binary heap on (at, order) */
	struct frame **heap;
	size_t nheap, capheap;
	struct frame *free_frames;
	size_t frame_cap;
	uint64_t order;
	/* checks */
	struct adv adv[64];
	uint64_t overrun;
	uint64_t data_frames[NI];
	uint64_t drop_nth[NI]; /* lose the DATA frame that makes data_frames[src] this */
	/* last segment of each type from each instance, for crafting */
	uint8_t last[NI][8][MP_REL_HDR_MAX + MSS];
	size_t last_len[NI][8];
};

static struct sim S;

static uint64_t rnd(void)
{
	S.rng ^= S.rng << 13;
	S.rng ^= S.rng >> 7;
	S.rng ^= S.rng << 17;
	return S.rng;
}

static double rndf(void)
{
	return (double)(rnd() >> 11) / (double)(1ull << 53);
}

static bool frame_before(const struct frame *a, const struct frame *b)
{
	return a->at < b->at || (a->at == b->at && a->order < b->order);
}

static void heap_push(struct frame *f)
{
	if (S.nheap == S.capheap) {
		S.capheap = S.capheap ? 2 * S.capheap : 1024;
		S.heap = realloc(S.heap, S.capheap * sizeof(*S.heap));
		assert_non_null(S.heap);
	}
	size_t i = S.nheap++;

	while (i && frame_before(f, S.heap[(i - 1) / 2])) {
		S.heap[i] = S.heap[(i - 1) / 2];
		i = (i - 1) / 2;
	}
	S.heap[i] = f;
}

static struct frame *heap_pop(void)
{
	struct frame *top = S.heap[0], *last = S.heap[--S.nheap];
	size_t i = 0;

	for (;;) {
		size_t l = 2 * i + 1, m = i;

		if (l >= S.nheap)
			break;
		m = l + 1 < S.nheap && frame_before(S.heap[l + 1], S.heap[l]) ? l + 1 : l;
		if (!frame_before(S.heap[m], last))
			break;
		S.heap[i] = S.heap[m];
		i = m;
	}
	if (S.nheap)
		S.heap[i] = last;
	return top;
}

static struct frame *frame_get(void)
{
	struct frame *f = S.free_frames;

	if (f) {
		S.free_frames = f->next;
		return f;
	}
	f = malloc(sizeof(*f) + S.frame_cap);
	assert_non_null(f);
	return f;
}

static void frame_put(struct frame *f)
{
	f->next = S.free_frames;
	S.free_frames = f;
}

static struct adv *adv_of(uint32_t id)
{
	struct adv *free_slot = NULL;

	for (size_t i = 0; i < sizeof(S.adv) / sizeof(S.adv[0]); i++) {
		if (S.adv[i].set && S.adv[i].id == id)
			return &S.adv[i];
		if (!S.adv[i].set && !free_slot)
			free_slot = &S.adv[i];
	}
	assert_non_null(free_slot);
	free_slot->set = true;
	free_slot->id = id;
	return free_slot;
}

static bool seq_lt(uint32_t a, uint32_t b)
{
	return (int32_t)(a - b) < 0;
}

/* Watch what a segment advertises and whether a DATA segment respects it. */
static void check_segment(int src, const uint8_t *h)
{
	unsigned type = h[3];
	uint32_t dst = mp_le_get32(h + 8), self = mp_le_get32(h + 12);
	uint32_t ack = mp_le_get32(h + 20), credit = mp_le_get32(h + 24);
	uint32_t wnd = mp_le_get16(h + 28);
	struct adv *a = adv_of(self);

	if (!a->credit || seq_lt(a->credit, credit))
		a->credit = credit;
	if (!a->end || seq_lt(a->end, ack + wnd))
		a->end = ack + wnd;
	if (type == 3) {
		struct adv *r = adv_of(dst);
		uint32_t seq = mp_le_get32(h + 16), msg = mp_le_get32(h + 32);

		S.data_frames[src]++;
		if (!seq_lt(seq, r->end) || !seq_lt(msg, r->credit))
			S.overrun++;
	}
}

static int sim_tx(void *user, uint32_t route, const void *hdr, size_t hlen, const struct mp_iov *pl,
		  int n)
{
	int src = *(int *)user;
	size_t len = hlen;

	assert_true(hlen <= MP_REL_HDR_MAX);
	assert_true(route < NI);
	if (S.tx_budget && S.tx_used[src] >= S.tx_budget)
		return -EAGAIN;
	S.tx_used[src]++;
	for (int i = 0; i < n; i++)
		len += pl[i].len;
	assert_true(len <= S.frame_cap);
	check_segment(src, hdr);
	struct frame *f = frame_get();

	memcpy(f->data, hdr, hlen);
	len = hlen;
	for (int i = 0; i < n; i++) {
		memcpy(f->data + len, pl[i].base, pl[i].len);
		len += pl[i].len;
	}
	f->len = len;
	unsigned type = ((const uint8_t *)hdr)[3];

	if (type < 8 && len <= sizeof(S.last[0][0])) {
		memcpy(S.last[src][type], f->data, len);
		S.last_len[src][type] = len;
	}
	f->src = src;
	f->dst = (int)route;
	bool drop = type == 3 && S.drop_nth[src] && S.data_frames[src] == S.drop_nth[src];

	if (drop || S.cut[src] || S.cut[route] || rndf() < S.loss) {
		frame_put(f);
		return 0;
	}
	f->at = S.now + S.delay + (rndf() < S.reorder ? rnd() % (S.jitter + 1) : 0);
	f->order = S.order++;
	if (rndf() < S.dup) {
		struct frame *g = frame_get();

		memcpy(g, f, sizeof(*f) + len);
		g->at += rnd() % (S.jitter + 1);
		g->order = S.order++;
		heap_push(g);
	}
	heap_push(f);
	return 0;
}

static uint64_t sim_now(void *user)
{
	(void)user;
	return S.now;
}

/* base_params' stream_min (0: never), set by test_stream_copy. */
static size_t stream_min;

static struct mp_rel_params base_params(int i)
{
	struct mp_rel_params p = {
		.stream_min = stream_min,
		.mss = MSS,
		.window = 256,
		.max_posted = 16,
		.rto_min_ns = 200 * US,
		.rto_max_ns = 20 * MS,
		.max_retries = 8,
		.keepalive_ns = 20 * MS,
		/* Under 20% loss each way, 9 SYNs all fail about once in 10^4
		 * connects: keep trying for a second, as a driver would. */
		.connect_timeout_ns = 1 * SEC,
		.seed = 1000 + (uint64_t)i,
		.tx = sim_tx,
		.now_ns = sim_now,
		.user = &S.idx[i],
	};
	return p;
}

static void sim_init(uint64_t seed, const struct mp_rel_params *p)
{
	memset(&S, 0, sizeof(S));
	S.rng = seed * 0x9E3779B97F4A7C15ull + 1;
	S.now = 1 * SEC;
	S.delay = 20 * US;
	S.jitter = 40 * US;
	S.frame_cap = MP_REL_HDR_MAX + (p ? p->mss : MSS);
	for (int i = 0; i < NI; i++) {
		struct mp_rel_params q = p ? *p : base_params(i);

		S.idx[i] = i;
		q.user = &S.idx[i];
		q.seed = 1000 + (uint64_t)i;
		assert_int_equal(mp_rel_create(&q, &S.rel[i]), 0);
	}
}

static void sim_fini(void)
{
	for (int i = 0; i < NI; i++)
		mp_rel_destroy(S.rel[i]);
	while (S.nheap)
		frame_put(heap_pop());
	while (S.free_frames) {
		struct frame *f = S.free_frames;

		S.free_frames = f->next;
		free(f);
	}
	free(S.heap);
	S.heap = NULL;
}

typedef bool (*step_fn)(void *arg); /* app work; returns true when finished */

/*
 * Run the instances and the link until @done says finished or @limit of
 * virtual time passed (then the test fails). Returns the virtual time taken.
 */
static uint64_t run(step_fn done, void *arg, uint64_t limit)
{
	uint64_t start = S.now;

	for (;;) {
		bool work = false;

		memset(S.tx_used, 0, sizeof(S.tx_used));
		if (done(arg))
			return S.now - start;
		assert_true(S.now - start <= limit);
		for (int i = 0; i < NI; i++)
			work |= mp_rel_poll(S.rel[i]) != 0;
		while (S.nheap && S.heap[0]->at <= S.now) {
			struct frame *f = heap_pop();

			if (!S.cut[f->dst])
				mp_rel_input(S.rel[f->dst], (uint32_t)f->src, f->data, f->len);
			frame_put(f);
			work = true;
		}
		if (work)
			continue;
		uint64_t next = S.nheap ? S.heap[0]->at : UINT64_MAX;

		for (int i = 0; i < NI; i++) {
			uint64_t d = mp_rel_next_deadline_ns(S.rel[i]);

			if (d < next)
				next = d;
		}
		if (next == UINT64_MAX || next <= S.now)
			next = S.now + 10 * US;
		if (next > start + limit + 1)
			next = start + limit + 1;
		S.now = next;
	}
}

/* Run for @span of virtual time regardless of anything. */
static void run_for(uint64_t span)
{
	uint64_t end = S.now + span;

	while (S.now < end) {
		for (int i = 0; i < NI; i++)
			mp_rel_poll(S.rel[i]);
		while (S.nheap && S.heap[0]->at <= S.now) {
			struct frame *f = heap_pop();

			if (!S.cut[f->dst])
				mp_rel_input(S.rel[f->dst], (uint32_t)f->src, f->data, f->len);
			frame_put(f);
		}
		S.now += 10 * US;
	}
}

/* ---- connections --------------------------------------------------------- */

struct pairc {
	struct mp_rel_conn *a, *b; /* a on instance ia connected to b on ib */
	int ia, ib;
};

static bool accepted(void *arg)
{
	struct pairc *pc = arg;

	if (!pc->b && mp_rel_accept(S.rel[pc->ib], &pc->b) == 0)
		assert_int_equal(mp_rel_conn_route(pc->b), (uint32_t)pc->ia);
	return pc->b && mp_rel_conn_status(pc->a) == 1;
}

static struct pairc connect_pair(int ia, int ib)
{
	struct pairc pc = { .ia = ia, .ib = ib };

	assert_int_equal(mp_rel_listen(S.rel[ib], 4), 0);
	assert_int_equal(mp_rel_connect(S.rel[ia], (uint32_t)ib, &pc.a), 0);
	assert_int_equal(mp_rel_conn_status(pc.a), 0);
	run(accepted, &pc, 2 * SEC);
	assert_int_equal(mp_rel_conn_status(pc.b), 1);
	return pc;
}

static void stats(int i, struct mp_rel_stats *st)
{
	mp_rel_get_stats(S.rel[i], st);
}

/* ---- message flows ------------------------------------------------------- */

#define QMAX 64

/* One direction of one connection: messages of sizes[k % nsizes], k < nmsg. */
struct flow {
	struct mp_rel_conn *tx, *rx;
	const size_t *sizes;
	int nsizes, nmsg, tag;
	size_t extra;      /* receive buffers this much longer (shorter messages) */
	int psend, dsend, precv, drecv;
	struct mp_rel_req *sreq[QMAX], *rreq[QMAX];
	uint8_t *sbuf[QMAX], *rbuf[QMAX];
	/* A buffer whose post was refused (-EAGAIN), kept for the next try of
	 * the same message: allocating and freeing a 1 MiB buffer on every
	 * step of the simulation cost an mmap and a munmap each under ASan
	 * (minutes of system time). */
	uint8_t *sspare, *rspare;
};

static void fill(uint8_t *p, size_t n, uint64_t seed)
{
	uint64_t x = seed * 0x9E3779B97F4A7C15ull | 1;
	size_t i = 0;

	for (; i + 8 <= n; i += 8) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		memcpy(p + i, &x, 8);
	}
	for (; i < n; i++)
		p[i] = (uint8_t)(x >> (8 * (i & 7)));
}

static size_t flow_size(const struct flow *f, int k)
{
	return f->sizes[k % f->nsizes];
}

static bool flow_step(struct flow *f)
{
	int rc, done;
	size_t nb;

	while (f->psend < f->nmsg && f->psend - f->dsend < QMAX) {
		int k = f->psend, q = k % QMAX;
		size_t n = flow_size(f, k);
		uint8_t *b = f->sspare ? f->sspare : malloc(n ? n : 1);

		f->sspare = NULL;
		assert_non_null(b);
		/* Two pieces for odd messages: segments straddle them. */
		struct mp_iov iov[2] = { { b, n / 3 }, { b + n / 3, n - n / 3 } };

		rc = mp_rel_send(f->tx, (k & 1) ? iov : &(struct mp_iov){ b, n }, (k & 1) ? 2 : 1,
				 &f->sreq[q]);
		if (rc == -EAGAIN) {
			f->sspare = b;
			break;
		}
		assert_int_equal(rc, 0);
		/* Filled after posting: rel reads it only from the next poll on
		 * (and a refused post costs no fill). */
		fill(b, n, (uint64_t)f->tag << 32 | (uint64_t)k);
		f->sbuf[q] = b;
		f->psend++;
	}
	while (f->precv < f->nmsg && f->precv - f->drecv < QMAX) {
		int k = f->precv, q = k % QMAX;
		size_t cap = flow_size(f, k) + (k % 3 == 0 ? f->extra : 0);

		f->rbuf[q] = f->rspare ? f->rspare : malloc(cap ? cap : 1);
		f->rspare = NULL;
		assert_non_null(f->rbuf[q]);
		rc = mp_rel_recv(f->rx, f->rbuf[q], cap, &f->rreq[q]);
		if (rc == -EAGAIN) {
			f->rspare = f->rbuf[q];
			f->rbuf[q] = NULL;
			break;
		}
		assert_int_equal(rc, 0);
		f->precv++;
	}
	while (f->dsend < f->psend) {
		int q = f->dsend % QMAX;

		rc = mp_rel_test(f->sreq[q], &done, &nb);
		if (!done)
			break;
		assert_int_equal(rc, 0);
		assert_int_equal(nb, flow_size(f, f->dsend));
		free(f->sbuf[q]);
		f->dsend++;
	}
	while (f->drecv < f->precv) {
		int k = f->drecv, q = k % QMAX;
		size_t n = flow_size(f, k);

		rc = mp_rel_test(f->rreq[q], &done, &nb);
		if (!done)
			break;
		assert_int_equal(rc, 0);
		assert_int_equal(nb, n);
		uint8_t *want = malloc(n ? n : 1);

		assert_non_null(want);
		fill(want, n, (uint64_t)f->tag << 32 | (uint64_t)k);
		assert_memory_equal(f->rbuf[q], want, n);
		free(want);
		free(f->rbuf[q]);
		f->drecv++;
	}
	return f->dsend == f->nmsg && f->drecv == f->nmsg;
}

struct flows {
	struct flow *f;
	int n;
};

static bool flows_step(void *arg)
{
	struct flows *fs = arg;
	bool all = true;

	for (int i = 0; i < fs->n; i++)
		all &= flow_step(&fs->f[i]);
	return all;
}

static const size_t sizes[] = { 0, 1, MSS - 1, MSS, MSS + 1, MIB, 3, 7 * MSS + 5 };
#define NSIZES (sizeof(sizes) / sizeof(sizes[0]))

/*
 * Three instances, a connection between each pair, messages both ways on
 * each, all at once: byte-exact, in order, every length reported.
 */
static void transfer(double loss, double dup, double reorder, int reps, uint64_t seed,
		     struct mp_rel_stats *sum)
{
	sim_init(seed, NULL);
	S.loss = loss;
	S.dup = dup;
	S.reorder = reorder;
	S.tx_budget = 48; /* the tx ring fills now and then */
	struct pairc pc[3] = { connect_pair(0, 1), connect_pair(0, 2), connect_pair(1, 2) };
	struct flow f[6];

	for (int i = 0; i < 3; i++) {
		f[2 * i] = (struct flow){ .tx = pc[i].a, .rx = pc[i].b, .sizes = sizes,
					  .nsizes = NSIZES, .nmsg = reps * (int)NSIZES,
					  .tag = 2 * i, .extra = 100 };
		f[2 * i + 1] = (struct flow){ .tx = pc[i].b, .rx = pc[i].a, .sizes = sizes + 3,
					      .nsizes = NSIZES - 3, .nmsg = reps * (int)NSIZES,
					      .tag = 2 * i + 1, .extra = 1 };
	}
	struct flows fs = { f, 6 };

	run(flows_step, &fs, 60 * SEC);
	assert_int_equal(S.overrun, 0);
	memset(sum, 0, sizeof(*sum));
	for (int i = 0; i < NI; i++) {
		struct mp_rel_stats st;

		stats(i, &st);
		sum->data_tx += st.data_tx;
		sum->data_rtx += st.data_rtx;
		sum->fast_rtx += st.fast_rtx;
		sum->dup_rx += st.dup_rx;
		sum->data_rx += st.data_rx;
		sum->conns_failed += st.conns_failed;
		sum->tx_again += st.tx_again;
		sum->stream_rx += st.stream_rx;
		for (int d = 0; d < MP_REL_DROP_MAX; d++)
			sum->drop[d] += st.drop[d];
	}
	assert_int_equal(sum->conns_failed, 0);
	/* Every data segment was placed exactly once: as many as were cut. */
	assert_int_equal(sum->data_rx, sum->data_tx);
	print_message("loss %.0f%%: %llu data segments, %llu retransmitted (%llu fast), %llu dups, "
		      "%llu tx full\n",
		      loss * 100, (unsigned long long)sum->data_tx, (unsigned long long)sum->data_rtx,
		      (unsigned long long)sum->fast_rtx, (unsigned long long)sum->dup_rx,
		      (unsigned long long)sum->tx_again);
	sim_fini();
}

static void test_clean_link(void **state)
{
	struct mp_rel_stats sum;

	(void)state;
	transfer(0, 0, 0, 3, 1, &sum);
	assert_int_equal(sum.data_rtx, 0);
	assert_int_equal(sum.dup_rx, 0);
	assert_true(sum.tx_again > 0);
	for (int d = 0; d < MP_REL_DROP_MAX; d++)
		assert_int_equal(sum.drop[d], 0);
}

static void test_loss_5(void **state)
{
	struct mp_rel_stats sum;

	(void)state;
	transfer(0.05, 0.05, 0.05, 3, 2, &sum);
	assert_true(sum.data_rtx > 0);
	assert_true(sum.fast_rtx > 0);
	assert_true(sum.dup_rx > 0);
}

/*
 * Messages from MSS + 1 bytes on are written with non-temporal stores, into
 * malloc'd buffers at any alignment, under loss, duplication and
 * reordering: still byte-exact (transfer checks every byte), and exactly
 * the long ones went that way.
 */
static void test_stream_copy(void **state)
{
	struct mp_rel_stats sum;
	const int reps = 3;
	uint64_t want = 0;

	(void)state;
	stream_min = MSS + 1;
	transfer(0.05, 0.05, 0.05, reps, 7, &sum);
	stream_min = 0;
	/* transfer's flows: each of 3 pairs sends sizes[] one way, sizes + 3 the other. */
	for (int k = 0; k < reps * (int)NSIZES; k++)
		want += 3u * ((sizes[k % NSIZES] > MSS) + (sizes[3 + k % (NSIZES - 3)] > MSS));
	assert_true(want > 0);
	assert_int_equal(sum.stream_rx, want);
	assert_true(sum.dup_rx > 0);
}

static void test_loss_20(void **state)
{
	struct mp_rel_stats sum;

	(void)state;
	transfer(0.20, 0.20, 0.20, 2, 3, &sum);
	assert_true(sum.data_rtx > 0);
	assert_true(sum.dup_rx > 0);
}

/* ---- flow control -------------------------------------------------------- */

struct reqwait {
	struct mp_rel_req *r;
	int rc, done;
	size_t nb;
};

static bool req_finished(void *arg)
{
	struct reqwait *w = arg;

	if (!w->done)
		w->rc = mp_rel_test(w->r, &w->done, &w->nb);
	return w->done;
}

static void test_flow_control(void **state)
{
	static uint8_t src[3][MIB / 2], dst[MIB / 2];
	struct mp_rel_req *s[3];
	struct mp_rel_stats st;

	(void)state;
	sim_init(4, NULL);
	/* The receiver's window is smaller than the sender's: the sender keeps
	 * to what is advertised (the link counts overruns). */
	struct mp_rel_params p1 = base_params(1);

	mp_rel_destroy(S.rel[1]);
	p1.window = 64;
	assert_int_equal(mp_rel_create(&p1, &S.rel[1]), 0);
	struct pairc pc = connect_pair(0, 1);

	for (int i = 0; i < 3; i++) {
		fill(src[i], sizeof(src[i]), 77 + (uint64_t)i);
		assert_int_equal(mp_rel_send(pc.a, &(struct mp_iov){ src[i], sizeof(src[i]) }, 1, &s[i]), 0);
	}
	/* No receive posted on b: nothing may leave a, for as long as we wait. */
	run_for(200 * MS);
	stats(0, &st);
	assert_int_equal(st.data_tx, 0);
	assert_int_equal(S.data_frames[0], 0);
	/* One receive: exactly that message's segments flow, no more. */
	struct reqwait w = { 0 };

	assert_int_equal(mp_rel_recv(pc.b, dst, sizeof(dst), &w.r), 0);
	run(req_finished, &w, 2 * SEC);
	assert_int_equal(w.rc, 0);
	assert_int_equal(w.nb, sizeof(dst));
	assert_memory_equal(dst, src[0], sizeof(dst));
	run_for(50 * MS);
	stats(0, &st);
	assert_int_equal(st.data_tx, (sizeof(dst) + MSS - 1) / MSS);
	int done;

	assert_int_equal(mp_rel_test(s[1], &done, NULL), 0);
	assert_int_equal(done, 0);
	/* The rest, one receive at a time. */
	for (int i = 1; i < 3; i++) {
		w = (struct reqwait){ 0 };
		assert_int_equal(mp_rel_recv(pc.b, dst, sizeof(dst), &w.r), 0);
		run(req_finished, &w, 2 * SEC);
		assert_int_equal(w.rc, 0);
		assert_memory_equal(dst, src[i], sizeof(dst));
	}
	for (int i = 0; i < 3; i++) {
		w = (struct reqwait){ .r = s[i] };
		run(req_finished, &w, 1 * SEC);
		assert_int_equal(w.rc, 0);
	}
	stats(1, &st);
	assert_int_equal(st.drop[MP_REL_DROP_WINDOW], 0);
	assert_int_equal(S.overrun, 0);
	sim_fini();
}

/* Posting beyond max_posted is back-pressure, not an error. */
static void test_post_limits(void **state)
{
	static uint8_t buf[16];
	struct mp_rel_req *rr[17], *r[17];
	int done;

	(void)state;
	sim_init(5, NULL);
	struct pairc pc = connect_pair(0, 1);

	for (int i = 0; i < 16; i++)
		assert_int_equal(mp_rel_recv(pc.b, buf, sizeof(buf), &rr[i]), 0);
	assert_int_equal(mp_rel_recv(pc.b, buf, sizeof(buf), &rr[16]), -EAGAIN);
	for (int i = 0; i < 16; i++)
		assert_int_equal(mp_rel_send(pc.a, &(struct mp_iov){ buf, 0 }, 1, &r[i]), 0);
	assert_int_equal(mp_rel_send(pc.a, &(struct mp_iov){ buf, 0 }, 1, &r[16]), -EAGAIN);
	assert_int_equal(mp_rel_send(pc.a, &(struct mp_iov){ NULL, 4 }, 1, &r[16]), -EINVAL);
	assert_int_equal(mp_rel_send(pc.a, &(struct mp_iov){ buf, 0 }, 3, &r[16]), -EINVAL);
	struct reqwait w = { .r = r[15] };

	run(req_finished, &w, SEC);
	assert_int_equal(w.rc, 0);
	for (int i = 0; i < 15; i++) {
		assert_int_equal(mp_rel_test(r[i], &done, NULL), 0);
		assert_int_equal(done, 1);
	}
	w = (struct reqwait){ .r = rr[15] };
	run(req_finished, &w, SEC);
	assert_int_equal(w.rc, 0);
	assert_int_equal(w.nb, 0);
	for (int i = 0; i < 15; i++) {
		assert_int_equal(mp_rel_test(rr[i], &done, NULL), 0);
		assert_int_equal(done, 1);
	}
	sim_fini();
}

/* ---- errors -------------------------------------------------------------- */

static void test_msgsize(void **state)
{
	static uint8_t m0[100], m1[5000], m2[10], r0[100], r1[4000], r2[50];
	struct reqwait ws[3], wr[3];

	(void)state;
	sim_init(6, NULL);
	S.loss = 0.1;
	struct pairc pc = connect_pair(0, 1);

	fill(m0, sizeof(m0), 1);
	fill(m1, sizeof(m1), 2);
	fill(m2, sizeof(m2), 3);
	memset(r1, 0xEE, sizeof(r1));
	assert_int_equal(mp_rel_send(pc.a, &(struct mp_iov){ m0, sizeof(m0) }, 1, &ws[0].r), 0);
	assert_int_equal(mp_rel_send(pc.a, &(struct mp_iov){ m1, sizeof(m1) }, 1, &ws[1].r), 0);
	assert_int_equal(mp_rel_send(pc.a, &(struct mp_iov){ m2, sizeof(m2) }, 1, &ws[2].r), 0);
	assert_int_equal(mp_rel_recv(pc.b, r0, sizeof(r0), &wr[0].r), 0);
	assert_int_equal(mp_rel_recv(pc.b, r1, sizeof(r1), &wr[1].r), 0);
	assert_int_equal(mp_rel_recv(pc.b, r2, sizeof(r2), &wr[2].r), 0);
	for (int i = 0; i < 3; i++) {
		ws[i].done = wr[i].done = 0;
		run(req_finished, &wr[i], 2 * SEC);
		run(req_finished, &ws[i], 2 * SEC);
		assert_int_equal(ws[i].rc, 0); /* the sender does not know */
	}
	assert_int_equal(wr[0].rc, 0);
	assert_memory_equal(r0, m0, sizeof(m0));
	assert_int_equal(wr[1].rc, -EMSGSIZE);
	for (size_t i = 0; i < sizeof(r1); i++)
		assert_int_equal(r1[i], 0xEE); /* refused, not written */
	assert_int_equal(wr[2].rc, 0);
	assert_int_equal(wr[2].nb, sizeof(m2));
	assert_memory_equal(r2, m2, sizeof(m2));
	sim_fini();
}

static void test_close_cancels(void **state)
{
	static uint8_t buf[4 * MSS];
	struct reqwait s = { 0 }, r = { 0 }, rb = { 0 };
	struct mp_rel_req *x;

	(void)state;
	sim_init(7, NULL);
	struct pairc pc = connect_pair(0, 1);

	/* b posts nothing, so a's send stays pending; a's receive too. */
	assert_int_equal(mp_rel_send(pc.a, &(struct mp_iov){ buf, sizeof(buf) }, 1, &s.r), 0);
	assert_int_equal(mp_rel_recv(pc.a, buf, sizeof(buf), &r.r), 0);
	run_for(5 * MS);
	assert_int_equal(mp_rel_test(s.r, &s.done, NULL), 0);
	assert_int_equal(s.done, 0);
	/* b waits for a message, and a closes before it could send one. */
	assert_int_equal(mp_rel_recv(pc.b, buf, 1, &rb.r), 0);
	mp_rel_close(pc.a);
	s.rc = mp_rel_test(s.r, &s.done, NULL);
	r.rc = mp_rel_test(r.r, &r.done, NULL);
	assert_int_equal(s.done, 1);
	assert_int_equal(s.rc, -ECANCELED);
	assert_int_equal(r.done, 1);
	assert_int_equal(r.rc, -ECANCELED);
	/* b hears the FIN: its receive fails, and so do later posts. */
	run(req_finished, &rb, SEC);
	assert_int_equal(rb.rc, -ECONNRESET);
	assert_int_equal(mp_rel_conn_status(pc.b), -ECONNRESET);
	assert_int_equal(mp_rel_recv(pc.b, buf, 1, &x), -ECONNRESET);
	mp_rel_close(pc.b);
	sim_fini();
}

/* Deliver every frame due by now, without polling anyone (so no reply leaves). */
static void deliver_due(void)
{
	while (S.nheap && S.heap[0]->at <= S.now) {
		struct frame *f = heap_pop();

		if (!S.cut[f->dst])
			mp_rel_input(S.rel[f->dst], (uint32_t)f->src, f->data, f->len);
		frame_put(f);
	}
}

/*
 * A peer that takes our last data and closes at once acknowledges it only
 * in its FIN: the send completes with 0, and only what is still open fails
 * with -ECONNRESET. The FIN also carries SACK words for what the closing
 * side held beyond a hole.
 */
static void test_fin_carries_ack(void **state)
{
	static uint8_t big[3 * MSS], rb[3 * MSS];
	struct reqwait s = { 0 }, r = { 0 }, s1 = { 0 }, s2 = { 0 };
	struct mp_rel_stats before, after;
	struct mp_rel_req *x;

	(void)state;
	sim_init(12, NULL);
	struct pairc pc = connect_pair(0, 1);

	/* 1: b receives all of a's message and closes before it could ack it. */
	fill(big, sizeof(big), 9);
	assert_int_equal(mp_rel_recv(pc.b, rb, sizeof(rb), &r.r), 0);
	run_for(1 * MS); /* b's credit reaches a */
	assert_int_equal(mp_rel_send(pc.a, &(struct mp_iov){ big, sizeof(big) }, 1, &s.r), 0);
	mp_rel_poll(S.rel[0]);
	S.now += S.delay;
	deliver_due();
	assert_int_equal(mp_rel_test(r.r, &r.done, &r.nb), 0);
	assert_int_equal(r.done, 1);
	assert_int_equal(r.nb, sizeof(big));
	assert_memory_equal(rb, big, sizeof(big));
	mp_rel_close(pc.b);
	run(req_finished, &s, SEC);
	assert_int_equal(s.rc, 0);
	assert_int_equal(s.nb, sizeof(big));
	assert_int_equal(mp_rel_conn_status(pc.a), -ECONNRESET);
	assert_int_equal(mp_rel_send(pc.a, &(struct mp_iov){ big, 1 }, 1, &x), -ECONNRESET);
	mp_rel_close(pc.a);

	/* 2: the first segment of a's first message is lost; b holds the rest
	 * and closes: its FIN's SACK covers them, nothing is resent, and both
	 * sends (incomplete) fail with -ECONNRESET. */
	pc = connect_pair(0, 1);
	assert_int_equal(mp_rel_recv(pc.b, rb, sizeof(rb), &r.r), 0);
	assert_int_equal(mp_rel_recv(pc.b, rb, sizeof(rb), &r.r), 0);
	run_for(1 * MS);
	assert_int_equal(mp_rel_send(pc.a, &(struct mp_iov){ big, sizeof(big) }, 1, &s1.r), 0);
	assert_int_equal(mp_rel_send(pc.a, &(struct mp_iov){ big, sizeof(big) }, 1, &s2.r), 0);
	S.tx_budget = 1;
	S.loss = 1;
	memset(S.tx_used, 0, sizeof(S.tx_used));
	mp_rel_poll(S.rel[0]);
	S.tx_budget = 0;
	S.loss = 0;
	mp_rel_poll(S.rel[0]);
	S.now += S.delay;
	deliver_due();
	stats(0, &before);
	mp_rel_close(pc.b);
	S.now += S.delay;
	deliver_due();
	stats(0, &after);
	assert_int_equal(after.seg_rx, before.seg_rx + 1);
	assert_int_equal(after.ack_rx, before.ack_rx + 1); /* only the SACK words moved */
	assert_int_equal(after.drop[MP_REL_DROP_LENGTH], before.drop[MP_REL_DROP_LENGTH]);
	assert_int_equal(after.data_rtx, before.data_rtx);
	assert_int_equal(mp_rel_test(s1.r, &s1.done, NULL), -ECONNRESET);
	assert_int_equal(mp_rel_test(s2.r, &s2.done, NULL), -ECONNRESET);
	assert_int_equal(s1.done + s2.done, 2);
	mp_rel_close(pc.a);
	assert_int_equal(S.overrun, 0);
	sim_fini();
}

/*
 * A receiver that stops polling once its receive completed (an application
 * done with its round) has acknowledged the whole message in the poll that
 * completed it: the sender's send completes without it.
 */
static void test_complete_acks_at_once(void **state)
{
	static uint8_t big[3 * MSS], rb[3 * MSS];
	struct reqwait s = { 0 }, r = { 0 };

	(void)state;
	sim_init(15, NULL);
	S.jitter = 0;
	struct pairc pc = connect_pair(0, 1);

	fill(big, sizeof(big), 6);
	assert_int_equal(mp_rel_recv(pc.b, rb, sizeof(rb), &r.r), 0);
	run_for(1 * MS);
	assert_int_equal(mp_rel_send(pc.a, &(struct mp_iov){ big, sizeof(big) }, 1, &s.r), 0);
	mp_rel_poll(S.rel[0]);
	S.now += S.delay;
	deliver_due();
	assert_int_equal(mp_rel_test(r.r, &r.done, NULL), 0);
	assert_int_equal(r.done, 1);
	mp_rel_poll(S.rel[1]); /* b's last poll */
	for (uint64_t end = S.now + 50 * MS; !s.done && S.now < end; S.now += 10 * US) {
		mp_rel_poll(S.rel[0]);
		while (S.nheap && S.heap[0]->at <= S.now) {
			struct frame *f = heap_pop();

			if (f->dst == 0)
				mp_rel_input(S.rel[0], (uint32_t)f->src, f->data, f->len);
			frame_put(f);
		}
		req_finished(&s);
	}
	assert_int_equal(s.done, 1);
	assert_int_equal(s.rc, 0);
	mp_rel_close(pc.a);
	mp_rel_close(pc.b);
	sim_fini();
}

/*
 * Instances run side by side as lanes put their lane in their connection
 * ids: mp_rel_seg_lane finds it in every segment addressed to them.
 */
static void test_lanes(void **state)
{
	static uint8_t buf[2 * MSS], rb[2 * MSS];
	struct reqwait s = { 0 }, r = { 0 };
	struct mp_rel_params p0 = base_params(0), p1 = base_params(1);
	struct mp_rel *bad;
	const uint8_t junk[40] = { 1, 2, 3 };

	(void)state;
	sim_init(16, NULL);
	p1.lanes = 4;
	p1.lane = 4;
	assert_int_equal(mp_rel_create(&p1, &bad), -EINVAL);
	p1.lanes = 17;
	p1.lane = 0;
	assert_int_equal(mp_rel_create(&p1, &bad), -EINVAL);
	/* instance 0 is lane 2 of 4, instance 1 lane 3 of 4 */
	mp_rel_destroy(S.rel[0]);
	mp_rel_destroy(S.rel[1]);
	p0.lanes = p1.lanes = 4;
	p0.lane = 2;
	p1.lane = 3;
	assert_int_equal(mp_rel_create(&p0, &S.rel[0]), 0);
	assert_int_equal(mp_rel_create(&p1, &S.rel[1]), 0);
	assert_ptr_equal(mp_rel_user(S.rel[1]), p1.user);
	struct pairc pc = connect_pair(0, 1);

	assert_ptr_equal(mp_rel_conn_rel(pc.b), S.rel[1]);
	fill(buf, sizeof(buf), 8);
	assert_int_equal(mp_rel_recv(pc.b, rb, sizeof(rb), &r.r), 0);
	assert_ptr_equal(mp_rel_req_rel(r.r), S.rel[1]);
	assert_int_equal(mp_rel_send(pc.a, &(struct mp_iov){ buf, sizeof(buf) }, 1, &s.r), 0);
	run(req_finished, &r, SEC);
	run(req_finished, &s, SEC);
	assert_int_equal(r.rc, 0);
	assert_memory_equal(rb, buf, sizeof(buf));
	/* what each sent last: a SYN is anyone's; the rest name the receiver's lane */
	assert_int_equal(mp_rel_seg_lane(S.last[0][1], S.last_len[0][1]), -1);
	assert_int_equal(mp_rel_seg_lane(S.last[0][3], S.last_len[0][3]), 3);
	assert_int_equal(mp_rel_seg_lane(S.last[1][2], S.last_len[1][2]), 2);
	assert_int_equal(mp_rel_seg_lane(S.last[1][4], S.last_len[1][4]), 2);
	assert_int_equal(mp_rel_seg_lane(junk, sizeof(junk)), -1);
	assert_int_equal(mp_rel_seg_lane(S.last[1][4], 31), -1);
	mp_rel_close(pc.a);
	mp_rel_close(pc.b);
	sim_fini();
}

/* The RFC 6298 arithmetic, sample by sample. */
static void test_rtt_estimator(void **state)
{
	struct mp_rel_rtt e = { 0 };

	(void)state;
	/* First sample: srtt = r, rttvar = r / 2, rto = r + 4 rttvar. */
	mp_rel_rtt_sample(&e, 100 * US, 1 * US, 0, SEC);
	assert_int_equal(e.srtt, 100 * US);
	assert_int_equal(e.rttvar, 50 * US);
	assert_int_equal(e.rto, 300 * US);
	/* rttvar = 3/4 * 50 + 1/4 * |100 - 200| = 62.5; srtt = 7/8 * 100 + 1/8 * 200. */
	mp_rel_rtt_sample(&e, 200 * US, 1 * US, 0, SEC);
	assert_int_equal(e.rttvar, 62500);
	assert_int_equal(e.srtt, 112500);
	assert_int_equal(e.rto, 112500 + 4 * 62500);
	/* A steady RTT: the deviation decays and the granularity is the margin. */
	for (int i = 0; i < 200; i++)
		mp_rel_rtt_sample(&e, 100 * US, 7 * US, 0, SEC);
	assert_true(e.srtt >= 100 * US && e.srtt < 101 * US);
	assert_true(e.rttvar < 1 * US);
	assert_int_equal(e.rto, e.srtt + 7 * US);
	/* Clamped to the floor and to the ceiling. */
	mp_rel_rtt_sample(&e, 100 * US, 7 * US, 1 * MS, SEC);
	assert_int_equal(e.rto, 1 * MS);
	mp_rel_rtt_sample(&e, 900 * MS, 7 * US, 1 * MS, 250 * MS);
	assert_int_equal(e.rto, 250 * MS);
	/* A zero sample (same clock tick) still counts as a sample. */
	e = (struct mp_rel_rtt){ 0 };
	mp_rel_rtt_sample(&e, 0, 5 * US, 0, SEC);
	assert_true(e.srtt > 0);
	assert_int_equal(e.rto, e.srtt + 5 * US);
}

/*
 * A path far slower than the floor (2 ms each way, floor 200 us): the
 * first timeouts are spurious, but each resends one segment, Karn's rule
 * keeps the backoff until a segment sent once is acknowledged, and from
 * then on the timeout follows the measured RTT. (Without Karn, the ack of
 * the original would be taken for one of the resend: a 1 ms sample.)
 */
static void test_rto_follows_rtt(void **state)
{
	static uint8_t big[MIB], rb[MIB];
	struct reqwait s = { 0 }, r = { 0 };
	struct mp_rel_stats st;
	struct mp_rel_params p = base_params(0);

	(void)state;
	p.rto_max_ns = 100 * MS;
	sim_init(13, &p);
	S.delay = 2 * MS;
	S.jitter = 0;
	struct pairc pc = connect_pair(0, 1);

	/* One segment: its ack answers the original, after 4 timeouts (0.2,
	 * 0.4, 0.8, 1.6 ms) resent it: no sample (Karn), backoff kept. */
	fill(big, sizeof(big), 3);
	assert_int_equal(mp_rel_recv(pc.b, rb, 10, &r.r), 0);
	assert_int_equal(mp_rel_send(pc.a, &(struct mp_iov){ big, 10 }, 1, &s.r), 0);
	run(req_finished, &s, SEC);
	assert_int_equal(s.rc, 0);
	stats(0, &st);
	assert_int_equal(st.rto_fired, 4);
	assert_int_equal(st.data_rtx, 4);
	assert_int_equal(mp_rel_conn_rto_ns(pc.a), 200 * US << 4);
	/* The next segment gets the backed-off 3.2 ms, still short of the RTT:
	 * one more timeout and still no sample; the one after gets 6.4 ms. */
	for (int k = 0; k < 2; k++) {
		s = (struct reqwait){ 0 };
		r = (struct reqwait){ 0 };
		assert_int_equal(mp_rel_recv(pc.b, rb, 10, &r.r), 0);
		run_for(5 * MS);
		assert_int_equal(mp_rel_send(pc.a, &(struct mp_iov){ big, 10 }, 1, &s.r), 0);
		run(req_finished, &s, SEC);
		assert_int_equal(s.rc, 0);
		stats(0, &st);
		assert_int_equal(st.data_rtx, 5);
		if (!k)
			assert_int_equal(mp_rel_conn_rto_ns(pc.a), 200 * US << 5);
	}
	/* That segment was sent once: a valid sample of about 4 ms ends the
	 * backoff, rto = 3 * sample. */
	uint64_t rto = mp_rel_conn_rto_ns(pc.a);

	assert_true(rto >= 12 * MS && rto <= 12500 * US);
	/* Bulk: 1 MiB, a window of segments per round trip; nothing resent. */
	s = (struct reqwait){ 0 };
	r = (struct reqwait){ 0 };
	assert_int_equal(mp_rel_recv(pc.b, rb, sizeof(rb), &r.r), 0);
	run_for(5 * MS);
	assert_int_equal(mp_rel_send(pc.a, &(struct mp_iov){ big, sizeof(big) }, 1, &s.r), 0);
	run(req_finished, &r, 2 * SEC);
	run(req_finished, &s, SEC);
	assert_int_equal(r.rc, 0);
	assert_memory_equal(rb, big, sizeof(big));
	stats(0, &st);
	assert_int_equal(st.data_rtx, 5);
	rto = mp_rel_conn_rto_ns(pc.a);
	assert_true(rto >= 4 * MS && rto <= 30 * MS);
	assert_int_equal(S.overrun, 0);
	mp_rel_close(pc.a);
	mp_rel_close(pc.b);
	sim_fini();
}

/*
 * The peer stops answering for 20 ms (descheduled) with a window in
 * flight: one timeout episode resends one segment per backoff step, not
 * the window, and nothing fails.
 */
static void test_peer_pause(void **state)
{
	static uint8_t big[MIB], rb[MIB];
	struct reqwait s = { 0 }, r = { 0 };
	struct mp_rel_stats st;

	(void)state;
	sim_init(14, NULL);
	S.jitter = 0;
	struct pairc pc = connect_pair(0, 1);

	fill(big, sizeof(big), 4);
	assert_int_equal(mp_rel_recv(pc.b, rb, sizeof(rb), &r.r), 0);
	run_for(1 * MS);
	assert_int_equal(mp_rel_send(pc.a, &(struct mp_iov){ big, sizeof(big) }, 1, &s.r), 0);
	run_for(200 * US);
	/* b is frozen: frames to it wait in the heap (like a full rx ring). */
	uint64_t thaw = S.now + 20 * MS;

	while (S.now < thaw) {
		mp_rel_poll(S.rel[0]);
		while (S.nheap && S.heap[0]->at <= S.now && S.heap[0]->dst != 1) {
			struct frame *f = heap_pop();

			mp_rel_input(S.rel[f->dst], (uint32_t)f->src, f->data, f->len);
			frame_put(f);
		}
		if (S.nheap && S.heap[0]->at <= S.now && S.heap[0]->dst == 1) {
			/* hold b's frames: push them past the thaw */
			struct frame *f = heap_pop();

			f->at = thaw;
			heap_push(f);
		}
		S.now += 10 * US;
	}
	run(req_finished, &r, 2 * SEC);
	run(req_finished, &s, SEC);
	assert_int_equal(r.rc, 0);
	assert_int_equal(s.rc, 0);
	assert_memory_equal(rb, big, sizeof(big));
	stats(0, &st);
	/* 200 us floor, doubling: 0.2 + 0.4 + ... < 20 ms is 6 timeouts, plus
	 * the one running at the thaw. */
	assert_true(st.rto_fired >= 5 && st.rto_fired <= 8);
	assert_int_equal(st.data_rtx, st.rto_fired);
	assert_int_equal(st.conns_failed, 0);
	mp_rel_close(pc.a);
	mp_rel_close(pc.b);
	sim_fini();
}

/*
 * The last segment sent is lost, and nothing sent after it can show the
 * hole: only the retransmission timer recovers it. The connection has one
 * timer, armed for its oldest segment in flight. Here that is a message
 * sent earlier and since acknowledged, so the timer has to move on to the
 * lost segment and fire at its own timeout: once, not early, not late.
 */
static void test_tail_loss(void **state)
{
	static uint8_t big[10 * MSS], rb[10 * MSS];
	struct reqwait s1 = { 0 }, r1 = { 0 }, s2 = { 0 }, r2 = { 0 };
	struct mp_rel_stats st0, st;
	const uint64_t tick = base_params(0).rto_min_ns / 8; /* the wheel's */

	(void)state;
	sim_init(15, NULL);
	S.jitter = 0;
	struct pairc pc = connect_pair(0, 1);

	fill(big, sizeof(big), 5);
	assert_int_equal(mp_rel_recv(pc.b, rb, 9 * MSS, &r1.r), 0);
	assert_int_equal(mp_rel_recv(pc.b, rb + 9 * MSS, MSS, &r2.r), 0);
	run_for(1 * MS);
	stats(0, &st0);
	assert_int_equal(mp_rel_send(pc.a, &(struct mp_iov){ big, 9 * MSS }, 1, &s1.r), 0);
	run(req_finished, &s1, SEC);
	/* Sent well after the first message, acknowledged by now: the timer
	 * still waits for the first's timeout. */
	uint64_t rto = mp_rel_conn_rto_ns(pc.a);

	S.drop_nth[0] = S.data_frames[0] + 1;
	assert_int_equal(mp_rel_send(pc.a, &(struct mp_iov){ big + 9 * MSS, MSS }, 1, &s2.r), 0);
	uint64_t took = run(req_finished, &r2, SEC);

	run(req_finished, &s2, SEC);
	assert_int_equal(r1.rc, 0);
	assert_int_equal(r2.rc, 0);
	assert_int_equal(s2.rc, 0);
	assert_memory_equal(rb, big, sizeof(big));
	stats(0, &st);
	assert_int_equal(st.data_tx - st0.data_tx, 10);
	assert_int_equal(st.rto_fired - st0.rto_fired, 1);
	assert_int_equal(st.data_rtx - st0.data_rtx, 1);
	assert_int_equal(st.fast_rtx - st0.fast_rtx, 0);
	/* Resent at its timeout (rounded up to the wheel's tick), then one
	 * link delay to the receiver. */
	assert_true(took >= rto + S.delay);
	assert_true(took <= rto + tick + S.delay);
	assert_int_equal(S.overrun, 0);
	mp_rel_close(pc.a);
	mp_rel_close(pc.b);
	sim_fini();
}

/* Bounded time to failure: rto_max per try after backoff, plus slack. */
#define FAIL_BOUND(p) ((uint64_t)((p).max_retries + 2) * (p).rto_max_ns + 100 * MS)

static void test_peer_vanishes(void **state)
{
	static uint8_t buf[64 * MSS], rbuf[16];
	struct reqwait s = { 0 }, r = { 0 };
	struct mp_rel_params p = base_params(0);

	(void)state;
	sim_init(8, NULL);
	S.loss = 0.05;
	struct pairc pc = connect_pair(0, 1);

	/* Something crosses first; b posts another receive (its credit
	 * reaches a), then vanishes without a word. */
	assert_int_equal(mp_rel_recv(pc.b, buf, sizeof(buf), &r.r), 0);
	assert_int_equal(mp_rel_send(pc.a, &(struct mp_iov){ rbuf, sizeof(rbuf) }, 1, &s.r), 0);
	run(req_finished, &r, SEC);
	assert_int_equal(r.rc, 0);
	s = (struct reqwait){ 0 };
	r = (struct reqwait){ 0 };
	assert_int_equal(mp_rel_recv(pc.b, buf, sizeof(buf), &r.r), 0);
	run_for(2 * MS);
	S.cut[1] = true;
	/* a's data goes into the void: retransmission timeouts give up. */
	assert_int_equal(mp_rel_send(pc.a, &(struct mp_iov){ buf, sizeof(buf) }, 1, &s.r), 0);
	struct reqwait ra = { 0 };

	assert_int_equal(mp_rel_recv(pc.a, rbuf, sizeof(rbuf), &ra.r), 0);
	uint64_t t = run(req_finished, &s, FAIL_BOUND(p));

	assert_int_equal(s.rc, -ETIMEDOUT);
	assert_true(t > p.rto_max_ns); /* it did try for a while */
	ra.rc = mp_rel_test(ra.r, &ra.done, NULL);
	assert_int_equal(ra.done, 1);
	assert_int_equal(ra.rc, -ETIMEDOUT);
	assert_int_equal(mp_rel_conn_status(pc.a), -ETIMEDOUT);
	/* b, cut off too, only has a receive posted: its probes go unanswered. */
	S.cut[1] = false;
	S.cut[0] = true;
	t = run(req_finished, &r, FAIL_BOUND(p) + p.keepalive_ns + p.rto_max_ns);
	assert_int_equal(r.rc, -ETIMEDOUT);
	struct mp_rel_stats st;

	stats(1, &st);
	assert_true(st.probe_tx >= p.max_retries);
	sim_fini();
}

/* A live peer that simply has nothing to say is not declared dead. */
static void test_idle_peer_alive(void **state)
{
	static uint8_t buf[16];
	struct reqwait r = { 0 };
	struct mp_rel_params p = base_params(0);
	struct mp_rel_stats st;

	(void)state;
	sim_init(9, NULL);
	S.loss = 0.2;
	struct pairc pc = connect_pair(0, 1);

	assert_int_equal(mp_rel_recv(pc.a, buf, sizeof(buf), &r.r), 0);
	run_for(3 * FAIL_BOUND(p));
	assert_int_equal(mp_rel_test(r.r, &r.done, NULL), 0);
	assert_int_equal(r.done, 0);
	assert_int_equal(mp_rel_conn_status(pc.a), 1);
	stats(0, &st);
	assert_true(st.probe_tx > 0);
	mp_rel_close(pc.a);
	mp_rel_close(pc.b);
	sim_fini();
}

static bool conn_settled(void *arg)
{
	return mp_rel_conn_status(arg) != 0;
}

static void test_connect_unanswered(void **state)
{
	struct mp_rel_conn *c;
	struct mp_rel_params p = base_params(0);
	struct mp_rel_stats st;

	(void)state;
	sim_init(10, NULL);
	/* 1 does not listen: SYNs are dropped and counted, 0 gives up after
	 * max_retries repeats. */
	mp_rel_destroy(S.rel[0]);
	p.connect_timeout_ns = 0;
	assert_int_equal(mp_rel_create(&p, &S.rel[0]), 0);
	assert_int_equal(mp_rel_connect(S.rel[0], 1, &c), 0);
	run(conn_settled, c, FAIL_BOUND(p));
	assert_int_equal(mp_rel_conn_status(c), -ETIMEDOUT);
	stats(1, &st);
	assert_int_equal(st.drop[MP_REL_DROP_LISTEN], p.max_retries + 1);
	stats(0, &st);
	assert_int_equal(st.ctl_tx, p.max_retries + 1);
	mp_rel_close(c);
	/* With a connect timeout, sooner. */
	mp_rel_destroy(S.rel[0]);
	p.connect_timeout_ns = 3 * MS;
	assert_int_equal(mp_rel_create(&p, &S.rel[0]), 0);
	assert_int_equal(mp_rel_connect(S.rel[0], 1, &c), 0);
	uint64_t t = run(conn_settled, c, SEC);

	assert_int_equal(mp_rel_conn_status(c), -ETIMEDOUT);
	assert_true(t >= 3 * MS && t < 4 * MS);
	sim_fini();
}

/* ---- malformed and foreign segments -------------------------------------- */

static void snapshot_check(int i, const struct mp_rel_stats *before, int reason)
{
	struct mp_rel_stats now, want = *before;

	stats(i, &now);
	want.drop[reason]++;
	for (int d = 0; d < MP_REL_DROP_MAX; d++)
		if (now.drop[d] != want.drop[d])
			fail_msg("drop %s: %llu, want %llu", mp_rel_drop_name(d),
				 (unsigned long long)now.drop[d], (unsigned long long)want.drop[d]);
	assert_memory_equal(&now, &want, sizeof(now));
}

static void test_malformed(void **state)
{
	static uint8_t big[4 * MSS], rb[4 * MSS], seg[MP_REL_HDR_MAX + MSS];
	struct reqwait s = { 0 }, r = { 0 }, r2 = { 0 };
	struct mp_rel_stats before;
	size_t len;

	(void)state;
	sim_init(11, NULL);
	struct pairc pc = connect_pair(0, 1);

	/* A message crosses so that real DATA and ACK segments were seen. */
	fill(big, sizeof(big), 5);
	assert_int_equal(mp_rel_recv(pc.b, rb, sizeof(rb), &r.r), 0);
	assert_int_equal(mp_rel_send(pc.a, &(struct mp_iov){ big, sizeof(big) }, 1, &s.r), 0);
	run(req_finished, &r, SEC);
	run(req_finished, &s, SEC);
	assert_int_equal(r.rc, 0);
	run_for(5 * MS);
	assert_int_equal(mp_rel_recv(pc.b, rb, sizeof(rb), &r2.r), 0);
	run_for(5 * MS);
	assert_true(S.last_len[0][3] == MP_REL_DATA_HDR_LEN + MSS);
	const uint8_t *data = S.last[0][3];
	size_t dlen = S.last_len[0][3];

	/* Each crafted segment is dropped for exactly its reason, and nothing
	 * else moves: not one counter beside that reason. */
#define CRAFT(reason, ...)                                            \
	do {                                                          \
		memcpy(seg, data, dlen);                              \
		len = dlen;                                           \
		__VA_ARGS__;                                          \
		stats(1, &before);                                    \
		mp_rel_input(S.rel[1], 0, seg, len);                  \
		snapshot_check(1, &before, reason);                   \
	} while (0)

	CRAFT(MP_REL_DROP_SHORT, len = 31);
	CRAFT(MP_REL_DROP_SHORT, len = 0);
	CRAFT(MP_REL_DROP_MAGIC, seg[0] ^= 1);
	CRAFT(MP_REL_DROP_VERSION, seg[2] = 2);
	CRAFT(MP_REL_DROP_TYPE, seg[3] = 9);
	CRAFT(MP_REL_DROP_TYPE, seg[4] = 0x80);
	CRAFT(MP_REL_DROP_LENGTH, len -= 1);
	CRAFT(MP_REL_DROP_LENGTH, mp_le_put16(seg + 6, MSS - 1));
	CRAFT(MP_REL_DROP_LENGTH, seg[5] = 1);
	/* the next segment's number, with an offset its segmentation cannot have */
	CRAFT(MP_REL_DROP_LENGTH, mp_le_put32(seg + 16, mp_le_get32(seg + 16) + 1);
	      mp_le_put32(seg + 32, mp_le_get32(seg + 32) + 1); mp_le_put32(seg + 36, 17));
	CRAFT(MP_REL_DROP_CONN, mp_le_put32(seg + 8, mp_le_get32(seg + 8) ^ 0x10000));
	CRAFT(MP_REL_DROP_CONN, mp_le_put32(seg + 8, 7));
	CRAFT(MP_REL_DROP_CONN, mp_le_put32(seg + 12, mp_le_get32(seg + 12) + 1));
	/* from another route than the connection's */
	memcpy(seg, data, dlen);
	stats(1, &before);
	mp_rel_input(S.rel[1], 2, seg, dlen);
	snapshot_check(1, &before, MP_REL_DROP_CONN);
	CRAFT(MP_REL_DROP_WINDOW, mp_le_put32(seg + 16, mp_le_get32(seg + 16) + 5000));
	CRAFT(MP_REL_DROP_WINDOW, mp_le_put32(seg + 16, mp_le_get32(seg + 16) - 5000));
	/* in the window, but for a message with no receive posted */
	CRAFT(MP_REL_DROP_WINDOW, mp_le_put32(seg + 16, mp_le_get32(seg + 16) + 1);
	      mp_le_put32(seg + 32, mp_le_get32(seg + 32) + 5); mp_le_put32(seg + 36, 0));
	CRAFT(MP_REL_DROP_ACK, mp_le_put32(seg + 20, mp_le_get32(seg + 20) + 1000));
	/* SYN-ACK to the accepting side */
	CRAFT(MP_REL_DROP_STATE, len = 32; seg[3] = 2; mp_le_put16(seg + 6, 0));
	/* SYN while not listening */
	mp_rel_listen(S.rel[1], 0);
	CRAFT(MP_REL_DROP_LISTEN, len = 32; seg[3] = 1; mp_le_put16(seg + 6, 0);
	      mp_le_put32(seg + 8, 0); mp_le_put32(seg + 12, 0x12345));
	/* the connection still works, and got exactly what was sent */
	r2.done = 0;
	assert_int_equal(mp_rel_send(pc.a, &(struct mp_iov){ big + 1, 999 }, 1, &s.r), 0);
	run(req_finished, &r2, SEC);
	assert_int_equal(r2.rc, 0);
	assert_int_equal(r2.nb, 999);
	assert_memory_equal(rb, big + 1, 999);
	assert_int_equal(S.overrun, 0);
	sim_fini();
}

/* Random bytes and mutated real segments: no crash, and random bytes are
 * all dropped. */
static void test_fuzz_input(void **state)
{
	static uint8_t big[8 * MSS], rb[8 * MSS], seg[MP_REL_HDR_MAX + MSS + 64];
	struct reqwait s = { 0 }, r = { 0 };
	struct mp_rel_stats a, b;

	(void)state;
	sim_init(12, NULL);
	struct pairc pc = connect_pair(0, 1);

	assert_int_equal(mp_rel_recv(pc.b, rb, sizeof(rb), &r.r), 0);
	assert_int_equal(mp_rel_send(pc.a, &(struct mp_iov){ big, sizeof(big) }, 1, &s.r), 0);
	run(req_finished, &r, SEC);
	stats(1, &a);
	for (int i = 0; i < 200000; i++) {
		size_t len = rnd() % sizeof(seg);

		for (size_t k = 0; k < len; k++)
			seg[k] = (uint8_t)rnd();
		mp_rel_input(S.rel[1], (uint32_t)(rnd() % NI), seg, len);
	}
	stats(1, &b);
	uint64_t drops = 0;

	for (int d = 0; d < MP_REL_DROP_MAX; d++)
		drops += b.drop[d] - a.drop[d];
	assert_int_equal(drops, 200000);
	assert_int_equal(b.seg_rx, a.seg_rx);
	/* Mutations of real segments of every type, to both sides. */
	for (int i = 0; i < 200000; i++) {
		int from = (int)(rnd() % 2), type = 1 + (int)(rnd() % 6);
		size_t len = S.last_len[from][type];

		if (!len)
			continue;
		memcpy(seg, S.last[from][type], len);
		for (int m = (int)(rnd() % 4); m >= 0; m--) {
			switch (len ? rnd() % 3 : 2) {
			case 0: seg[rnd() % len] ^= (uint8_t)(1u << (rnd() % 8)); break;
			case 1: seg[rnd() % 44 % len] = (uint8_t)rnd(); break;
			default: len = rnd() % (len + 16);
			}
		}
		mp_rel_input(S.rel[1 - from], (uint32_t)from, seg, len);
		if (i % 64 == 0) {
			mp_rel_poll(S.rel[0]);
			mp_rel_poll(S.rel[1]);
		}
	}
	sim_fini();
}

/* ---- benchmark ----------------------------------------------------------- */

struct bench {
	struct mp_rel_conn *tx, *rx;
	uint8_t *src, *dst;
	size_t msg;
	uint64_t left_tx, left_rx;
	struct mp_rel_req *s, *r;
};

static bool bench_step(void *arg)
{
	struct bench *b = arg;
	int done;

	if (!b->s && b->left_tx) {
		assert_int_equal(mp_rel_send(b->tx, &(struct mp_iov){ b->src, b->msg }, 1, &b->s), 0);
		b->left_tx--;
	}
	if (!b->r && b->left_rx)
		assert_int_equal(mp_rel_recv(b->rx, b->dst, b->msg, &b->r), 0);
	if (b->s) {
		mp_rel_test(b->s, &done, NULL);
		if (done)
			b->s = NULL;
	}
	if (b->r) {
		assert_int_equal(mp_rel_test(b->r, &done, NULL), 0);
		if (done) {
			b->r = NULL;
			b->left_rx--;
		}
	}
	return !b->left_rx && !b->s;
}

static double secs(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int bench(size_t mib)
{
	const size_t msg = 4 * MIB;
	uint64_t n = (mib * MIB + msg - 1) / msg;
	struct mp_rel_params p = base_params(0);

	p.window = 1024;
	p.mss = MP_REL_MSS_DEFAULT;
	p.rto_min_ns = 1 * MS;
	p.rto_max_ns = 100 * MS;
	sim_init(99, &p);
	S.delay = 2 * US;
	struct pairc pc = connect_pair(0, 1);
	struct bench b = { pc.a, pc.b, malloc(msg), malloc(msg), msg, n, n, NULL, NULL };

	assert_non_null(b.src);
	assert_non_null(b.dst);
	fill(b.src, msg, 3);
	memset(b.dst, 0, msg);
	double t0 = secs();

	run(bench_step, &b, 3600 * SEC);
	double t1 = secs();
	struct mp_rel_stats st;

	stats(1, &st);
	assert_int_equal(st.bytes_rx, (uint64_t)n * msg);
	assert_memory_equal(b.src, b.dst, msg);
	/* The same bytes through memcpy, in the same chunks. */
	double t2 = secs();

	for (uint64_t i = 0; i < n; i++) {
		memcpy(b.dst, b.src, msg);
		__asm__ volatile("" ::"r"(b.dst) : "memory");
	}
	double t3 = secs();
	double bytes = (double)n * (double)msg, rel_mbs = bytes / (t1 - t0) / 1e6,
	       cpy_mbs = bytes / (t3 - t2) / 1e6;

	printf("dpdk rel bench: %.0f MiB in %llu segments of %zu bytes over a lossless simulated "
	       "link: %.0f MB/s; memcpy %.0f MB/s; ratio %.3f\n"
	       "  (the link copies each segment once into its frame, rel once out of it)\n",
	       bytes / MIB, (unsigned long long)st.data_rx, (size_t)p.mss, rel_mbs, cpy_mbs,
	       rel_mbs / cpy_mbs);
	free(b.src);
	free(b.dst);
	sim_fini();
	return 0;
}

int main(int argc, char **argv)
{
	if (argc > 1 && !strcmp(argv[1], "--bench"))
		return bench(argc > 2 ? (size_t)atol(argv[2]) : 1024);
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_clean_link),
		cmocka_unit_test(test_loss_5),
		cmocka_unit_test(test_stream_copy),
		cmocka_unit_test(test_loss_20),
		cmocka_unit_test(test_flow_control),
		cmocka_unit_test(test_post_limits),
		cmocka_unit_test(test_msgsize),
		cmocka_unit_test(test_close_cancels),
		cmocka_unit_test(test_fin_carries_ack),
		cmocka_unit_test(test_complete_acks_at_once),
		cmocka_unit_test(test_lanes),
		cmocka_unit_test(test_rtt_estimator),
		cmocka_unit_test(test_rto_follows_rtt),
		cmocka_unit_test(test_peer_pause),
		cmocka_unit_test(test_tail_loss),
		cmocka_unit_test(test_peer_vanishes),
		cmocka_unit_test(test_idle_peer_alive),
		cmocka_unit_test(test_connect_unanswered),
		cmocka_unit_test(test_malformed),
		cmocka_unit_test(test_fuzz_input),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
