/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Host staging of CUDA memory (src/xfer/stage.c) against the FAKE of the
 * CUDA driver in tests/fakes/fake_cuda.c, swapped in through
 * src/xfer/stage.h: no GPU is needed or touched. The fake's device memory
 * faults on any access outside its own copies, which it counts per byte.
 *
 * Peers are threads over the loop transport (and tcp and ofi on loopback
 * for the plain average). Checked: exact averages;
 * every byte of the buffer copied device->host once and host->device once
 * per average, and no byte around it; the device buffer unchanged until the
 * copy back, and the request not complete before it; a failed copy in (on
 * every peer) and a failed copy back (on one peer): -EIO, the buffer as it
 * was, a message, and the next average exact again; pinned copies freed and
 * contexts released; the INFO line that says why the buffer is staged.
 * With the real table on a host without the CUDA driver (this one),
 * registering CUDA memory fails with the documented -ENOTSUP and says why.
 *
 * Streams (mp_average_start_stream, mp_request_stream_wait), over loop and
 * tcp, with the fake's device running the copies 5-10 ms after they are
 * queued: the caller's kernel writes the values 40 ms after the call over
 * stale ones, and the average is of the kernel's values; the caller's
 * stream, told to wait for the request, reads the buffer after it and sees
 * the final bytes. It goes on also when the copy in or the copy back fails,
 * when a peer left before the average, and when mp_finalize cancels a
 * request waiting for its copy in and one queued behind it (then nothing is
 * copied back, and the registration is released once its copy in ran).
 * A caller's stream that does not get to the average within
 * round_timeout_ms: -EIO, the buffer as it was, and the next average, whose
 * copy in is queued behind the one given up on, is of the values the late
 * kernel wrote. mp_average_start without a stream waits for the legacy
 * default stream's work (a kernel there).
 * Bad arguments (a host or no registration, NULL req, a stream of another
 * context, a request of host memory) give -EINVAL and copy nothing; a
 * device without stream memory operations gives -ENOTSUP, and mp_wait
 * still completes the request.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <moshpit/moshpit.h>

#include "mp_build_config.h"
#include "stage.h"
#include "fake_cuda.h"

#define MAXP FK_MAXP
#define MAXOPS FK_MAXOPS

/* Built with ThreadSanitizer (gcc says so one way, clang another)? */
#if defined(__SANITIZE_THREAD__)
#define UNDER_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define UNDER_TSAN 1
#endif
#endif

/* ---- peers ------------------------------------------------------------- */

static char log_path[64];

struct scenario {
	const char *name;
	const char *transport;
	int npeers;
	const char *grid;
	int nops;
	size_t count;  /* floats averaged */
	size_t off;    /* floats into the registration where they start */
	size_t len;    /* registration, floats (>= off + count) */
	/* mp_average_start_stream: a kernel on the caller's stream writes the
	 * values this long after the call, over stale ones, and the stream
	 * then waits for the request (mp_request_stream_wait) and reads the
	 * buffer (fk_probe) */
	int stream_ms;
	int dies;      /* 1 + the rank that leaves without averaging; 0: none */
};

struct shared {
	const struct scenario *sc;
	pthread_barrier_t bar;
	char addr[MAXP][MP_ADDR_STRLEN];
	int rc[MAXP][MAXOPS];
	struct mp_result res[MAXP][MAXOPS];
	char err[MAXP][MAXOPS][256];   /* mp_last_error after a failed operation */
	float *after[MAXP][MAXOPS];    /* device values after each operation */
	char fail[MAXP][160];          /* first thing that went wrong on a peer's thread */
	/* stream_ms: */
	float *probe[MAXP][MAXOPS];    /* what the caller's stream read after its wait */
	int ran[MAXP][MAXOPS];         /* ... if it got there */
	int synced[MAXP][MAXOPS];      /* fk_stream_sync after mp_wait */
};

struct arg {
	struct shared *sh;
	int rank;
};

/* Distinct multiples of 1/64 within ±16: sums and halvings stay exact. */
static float input(int rank, int op, size_t i)
{
	return (float)((long)(((long)rank * 7919 + (long)op * 31 + (long)i * 104729) % 2001) - 1000) /
	       64.0f;
}

/* What the device buffer holds before the caller's kernel writes the input. */
static float stale(int rank, int op, size_t i)
{
	return input(rank, op + 5, i);
}

/* What the registration holds around the buffer: never to be copied. */
#define SENTINEL (-12345.0f)

static void note(struct shared *sh, int rank, const char *what)
{
	if (!sh->fail[rank][0])
		snprintf(sh->fail[rank], sizeof(sh->fail[rank]), "%s", what);
}

/* Peer @rank's side of the gated operation: the copy back is held, so the
 * exchange is over; the device buffer must still hold the input, and the
 * request must not be complete. Returns 1 if mp_test completed (and
 * released) the request all the same, its status in *rc. */
static int gated_wait(struct shared *sh, int rank, int op, mp_request *req, int *rc)
{
	const struct scenario *sc = sh->sc;
	float *now = malloc(sc->count * sizeof(float));
	struct timespec dl;
	int done = -1;

	pthread_mutex_lock(&fk.mu);
	clock_gettime(CLOCK_REALTIME, &dl);
	dl.tv_sec += 20;
	while (!fk.gate_entered)
		if (pthread_cond_timedwait(&fk.cv, &fk.mu, &dl))
			break;
	int entered = fk.gate_entered;
	pthread_mutex_unlock(&fk.mu);
	if (!entered)
		note(sh, rank, "the copy back never started");
	fk_read(rank, sc->off * sizeof(float), now, sc->count * sizeof(float));
	for (size_t i = 0; i < sc->count; i++)
		if (now[i] != input(rank, op, i)) {
			note(sh, rank, "device buffer written before the copy back");
			break;
		}
	*rc = mp_test(req, &done, NULL);
	if (*rc || done != 0)
		note(sh, rank, "request complete before its copy back");
	pthread_mutex_lock(&fk.mu);
	fk.gate_open = 1;
	pthread_cond_broadcast(&fk.cv);
	pthread_mutex_unlock(&fk.mu);
	free(now);
	return done != 0;
}

static void *peer_main(void *p)
{
	struct arg *a = p;
	struct shared *sh = a->sh;
	const struct scenario *sc = sh->sc;
	const int r = a->rank;
	struct mp_config cfg;
	mp_ctx *ctx = NULL;
	mp_mr *mr = NULL;
	char run[64];
	int rc;

	snprintf(run, sizeof(run), "stage-%s", sc->name);
	mp_config_init(&cfg);
	cfg.transport = sc->transport;
	cfg.run_name = run;
	cfg.rank = r;
	cfg.npeers = sc->npeers;
	cfg.grid = sc->grid;
	cfg.chunk_bytes = 1024; /* several chunks per part */
	/* A peer that left is given up on sooner. */
	cfg.connect_timeout_ms = sc->dies ? 1000 : 5000;
	cfg.round_timeout_ms = sc->dies ? 1000 : 5000;
	rc = mp_init(&cfg, &ctx);
	if (!rc)
		mp_local_address(ctx, sh->addr[r], MP_ADDR_STRLEN);
	pthread_barrier_wait(&sh->bar);
	if (rc) {
		/* Keep step with the others: their waits are bounded, barriers not. */
		note(sh, r, "mp_init failed");
		for (int op = 0; op <= sc->nops; op++)
			pthread_barrier_wait(&sh->bar);
		return NULL;
	}
	const char *addrs[MAXP];
	for (int i = 0; i < sc->npeers; i++)
		addrs[i] = sh->addr[i];
	if (mp_set_peers(ctx, addrs, sc->npeers))
		note(sh, r, "mp_set_peers failed");
	if (sc->dies == r + 1) {
		/* This peer leaves before the first average. */
		mp_finalize(ctx);
		for (int op = 0; op <= sc->nops; op++)
			pthread_barrier_wait(&sh->bar);
		return NULL;
	}
	float *dev = (float *)fk.mem[r].base;
	struct fk_stream *cs = sc->stream_ms ? fk_stream_new(r) : NULL;
	const size_t boff = sc->off * sizeof(float), bytes = sc->count * sizeof(float);
	if (mp_mem_register(ctx, dev, sc->len * sizeof(float), MP_MEM_CUDA, &mr))
		note(sh, r, "mp_mem_register failed");
	for (int op = 0; op < sc->nops; op++) {
		/* The application writes this operation's values into device
		 * memory: now, or with a kernel on its stream, over stale ones. */
		float *v = malloc(bytes);
		for (size_t i = 0; i < sc->count; i++)
			v[i] = cs ? stale(r, op, i) : input(r, op, i);
		fk_write(r, boff, v, bytes);
		/* Everyone's values are in place before anyone starts. */
		pthread_barrier_wait(&sh->bar);
		mp_request *req;
		if (cs) {
			for (size_t i = 0; i < sc->count; i++)
				v[i] = input(r, op, i);
			fk_kernel_write(cs, r, boff, v, bytes, sc->stream_ms);
			rc = mr ? mp_average_start_stream(ctx, dev + sc->off, sc->count, 1.0f, mr, 0, cs,
							  &req) : -ENOENT;
			sh->probe[r][op] = calloc(sc->count, sizeof(float));
			if (!rc && mp_request_stream_wait(req, cs))
				note(sh, r, "mp_request_stream_wait failed");
			if (!rc)
				fk_probe(cs, r, boff, sh->probe[r][op], bytes, &sh->ran[r][op]);
		} else {
			rc = mr ? mp_average_start(ctx, dev + sc->off, sc->count, 1.0f, mr, &req) : -ENOENT;
		}
		free(v);
		if (!rc && !(r == fk.gate_rank && op == fk.gate_op && gated_wait(sh, r, op, req, &rc)))
			rc = mp_wait(req, 20000, &sh->res[r][op]);
		if (cs)
			sh->synced[r][op] = fk_stream_sync(cs, 5000);
		sh->rc[r][op] = rc;
		if (rc)
			snprintf(sh->err[r][op], sizeof(sh->err[r][op]), "%s", mp_last_error(ctx));
		sh->after[r][op] = malloc(sc->count * sizeof(float));
		fk_read(r, sc->off * sizeof(float), sh->after[r][op], sc->count * sizeof(float));
	}
	if (mp_mem_deregister(ctx, mr))
		note(sh, r, "mp_mem_deregister failed");
	if (cs)
		fk_stream_free(cs);
	/* Nobody leaves before everyone is done: a departure looks like a failure. */
	pthread_barrier_wait(&sh->bar);
	mp_finalize(ctx);
	return NULL;
}

static void run_peers(struct shared *sh)
{
	const struct scenario *sc = sh->sc;
	pthread_t th[MAXP];
	struct arg args[MAXP];

	assert_true(sc->npeers <= MAXP && sc->nops <= MAXOPS);
	assert_true(sc->off + sc->count <= sc->len);
	for (int r = 0; r < sc->npeers; r++) {
		fk_mem_init(r, sc->len * sizeof(float));
		float *s = malloc(sc->len * sizeof(float));
		for (size_t i = 0; i < sc->len; i++)
			s[i] = SENTINEL;
		fk_write(r, 0, s, sc->len * sizeof(float));
		free(s);
	}
	pthread_barrier_init(&sh->bar, NULL, (unsigned)sc->npeers);
	for (int r = 0; r < sc->npeers; r++) {
		args[r] = (struct arg){sh, r};
		assert_int_equal(pthread_create(&th[r], NULL, peer_main, &args[r]), 0);
	}
	for (int r = 0; r < sc->npeers; r++)
		pthread_join(th[r], NULL);
	pthread_barrier_destroy(&sh->bar);
	for (int r = 0; r < sc->npeers; r++)
		if (sh->fail[r][0])
			fail_msg("%s: peer %d: %s", sc->name, r, sh->fail[r]);
}

/*
 * Peer @r's device values after operation @op: the mean of every peer's
 * input when it succeeded, its own input when it failed. Also the bytes
 * around the buffer kept their sentinel, and each byte of the buffer went
 * in once per operation whose copy in worked and came back once per
 * operation that succeeded.
 */
static void check_peer(struct shared *sh, int r, const int *expect_rc)
{
	const struct scenario *sc = sh->sc;
	int ins = 0, outs = 0;

	for (int op = 0; op < sc->nops; op++) {
		int rc = sh->rc[r][op];
		if (rc != expect_rc[op])
			fail_msg("%s: peer %d, operation %d: %s, expected %s (%s)", sc->name, r, op,
				 mp_strerror(rc), mp_strerror(expect_rc[op]), sh->err[r][op]);
		for (size_t i = 0; i < sc->count; i++) {
			float want = input(r, op, i);
			if (!rc) {
				float sum = 0.0f;
				for (int q = 0; q < sc->npeers; q++)
					sum += input(q, op, i);
				want = sum / (float)sc->npeers;
			}
			if (sh->after[r][op][i] != want)
				fail_msg("%s: peer %d, operation %d, value %zu: %.9g, expected %.9g",
					 sc->name, r, op, i, sh->after[r][op][i], want);
		}
		if (!rc) {
			assert_int_equal(sh->res[r][op].failed_peers, 0);
			assert_int_equal(sh->res[r][op].frames_rejected, 0);
			assert_int_equal(sh->res[r][op].peers, sc->npeers);
		}
		if (sc->stream_ms) {
			/* The caller's stream went on after the request ended (the
			 * word was set), and not before: it read what the buffer
			 * holds at the end. */
			if (sh->synced[r][op] || !sh->ran[r][op])
				fail_msg("%s: peer %d, operation %d: the caller's stream never got past "
					 "its wait for the request (%s)", sc->name, r, op,
					 mp_strerror(sh->synced[r][op]));
			for (size_t i = 0; i < sc->count; i++)
				if (sh->probe[r][op][i] != sh->after[r][op][i])
					fail_msg("%s: peer %d, operation %d, value %zu: the caller's "
						 "stream read %.9g after its wait, the buffer ends with "
						 "%.9g", sc->name, r, op, i, sh->probe[r][op][i],
						 sh->after[r][op][i]);
			free(sh->probe[r][op]);
		}
		ins += !(fk.fail_in[op] & (1u << r));
		outs += !rc;
		free(sh->after[r][op]);
	}
	const struct fk_mem *m = &fk.mem[r];
	size_t lo = sc->off * sizeof(float), hi = (sc->off + sc->count) * sizeof(float);
	for (size_t b = 0; b < m->len; b++) {
		int in_buf = b >= lo && b < hi;
		if (m->n_in[b] != (in_buf ? ins : 0) || m->n_out[b] != (in_buf ? outs : 0))
			fail_msg("%s: peer %d, byte %zu: copied in %d and out %d times, expected %d and %d",
				 sc->name, r, b, m->n_in[b], m->n_out[b], in_buf ? ins : 0,
				 in_buf ? outs : 0);
	}
	float around[2] = {SENTINEL, SENTINEL};
	if (sc->off)
		fk_read(r, 0, &around[0], sizeof(float));
	if (sc->off + sc->count < sc->len)
		fk_read(r, m->len - sizeof(float), &around[1], sizeof(float));
	assert_true(around[0] == SENTINEL && around[1] == SENTINEL);
}

/* Every pinned copy freed, every context released, every stream and
 * event of the library's destroyed. */
static void check_released(int npeers)
{
	assert_int_equal(fk.streams, 0);
	assert_int_equal(fk.events, 0);
	assert_int_equal(fk.queries, npeers);
	assert_int_equal(fk.releases, npeers);
	assert_int_equal(fk.allocs, npeers);
	assert_int_equal(fk.frees, npeers);
}

/* Lines of the log file that contain @s. */
static int log_count(const char *s)
{
	char line[1200];
	int n = 0;
	FILE *f = fopen(log_path, "r");

	assert_non_null(f);
	while (fgets(line, sizeof(line), f))
		n += strstr(line, s) != NULL;
	fclose(f);
	return n;
}

/* A context of one peer, its own list set. */
static mp_ctx *solo(const char *run)
{
	struct mp_config cfg;
	mp_ctx *ctx;
	char addr[MP_ADDR_STRLEN];
	const char *addrs[1] = {addr};

	mp_config_init(&cfg);
	cfg.transport = "loop";
	cfg.run_name = run;
	cfg.npeers = 1;
	cfg.rank = 0;
	assert_int_equal(mp_init(&cfg, &ctx), 0);
	assert_int_equal(mp_local_address(ctx, addr, sizeof(addr)), 0);
	assert_int_equal(mp_set_peers(ctx, addrs, 1), 0);
	return ctx;
}

/* ---- tests ------------------------------------------------------------- */

/*
 * 4 peers on a 2x2 grid (two rounds: the exact mean), two averages in a
 * row, the buffer 5 floats into its registration. Peer 0's first copy back
 * is held until the test has looked at its buffer.
 */
static void exact_average(const char *transport)
{
	const struct scenario sc = {transport, transport, 4, "2x2", 2, 3000, 5, 3010, 0, 0};
	static const int ok[MAXOPS] = {0, 0, 0};
	struct shared *sh = calloc(1, sizeof(*sh));

	if (!mp_transport_available(transport))
		skip(); /* not built here */
	fk_reset();
	fk.gate_rank = 0;
	fk.gate_op = 0;
	sh->sc = &sc;
	run_peers(sh);
	for (int r = 0; r < sc.npeers; r++)
		check_peer(sh, r, ok);
	check_released(sc.npeers);
	assert_int_equal(fk.gate_entered, 1);
	/* One INFO line per registration, saying why. */
	for (int r = 0; r < sc.npeers; r++) {
		char want[200];
		snprintf(want, sizeof(want), "CUDA memory %p (%zu bytes) is staged through host memory: "
			 "transport %s cannot move device memory", (void *)fk.mem[r].base,
			 sc.len * sizeof(float), transport);
		assert_int_equal(log_count(want), 1);
		fk_mem_fini(r);
	}
	free(sh);
}

/* Staging is the core's: every transport averages the host copy as host
 * memory. dpdk (root, namespaces) and verbs (an RDMA NIC) are left out. */
static void stage_exact_average_loop(void **state)
{
	(void)state;
	exact_average("loop");
}

static void stage_exact_average_tcp(void **state)
{
	(void)state;
	exact_average("tcp");
}

static void stage_exact_average_ofi(void **state)
{
	(void)state;
#ifdef UNDER_TSAN
	/* libfabric is not built with ThreadSanitizer, and under it four
	 * tcp;ofi_rxm instances in one process take longer than the 5 s
	 * connect timeout to connect; loop and tcp stage the same way. */
	skip();
#endif
	exact_average("ofi");
}

static void stage_copy_failures(void **state)
{
	/* Operation 0: the copy in fails on both peers, so neither starts;
	 * operation 1: peer 1's copy back fails after a complete exchange;
	 * operation 2: everything works again. */
	static const struct scenario sc = {"fail", "loop", 2, NULL, 3, 1000, 3, 1010, 0, 0};
	static const int rc0[MAXOPS] = {-EIO, 0, 0}, rc1[MAXOPS] = {-EIO, -EIO, 0};
	struct shared *sh = calloc(1, sizeof(*sh));

	(void)state;
	fk_reset();
	fk.fail_in[0] = 3;
	fk.fail_out[1] = 2;
	sh->sc = &sc;
	run_peers(sh);
	check_peer(sh, 0, rc0);
	check_peer(sh, 1, rc1);
	for (int r = 0; r < 2; r++)
		if (!strstr(sh->err[r][0], "to the host failed") ||
		    !strstr(sh->err[r][0], "the buffer is as it was"))
			fail_msg("peer %d: copy in failed with \"%s\"", r, sh->err[r][0]);
	if (!strstr(sh->err[1][1], "copying the 4000-byte result back to CUDA memory"))
		fail_msg("peer 1: copy back failed with \"%s\"", sh->err[1][1]);
	check_released(sc.npeers);
	for (int r = 0; r < sc.npeers; r++)
		fk_mem_fini(r);
	free(sh);
}

static void stage_refusals(void **state)
{
	/* Memory the fake does not know as device memory, a buffer that is not
	 * float-aligned within its registration, and a registration that does
	 * not cover the buffer. */
	mp_ctx *ctx;
	mp_mr *mr;
	mp_request *req;
	float host[8] = {0};

	(void)state;
	fk_reset();
	fk_mem_init(0, 64 * sizeof(float));
	ctx = solo("stage-refusals");
	assert_int_equal(mp_mem_register(ctx, host, sizeof(host), MP_MEM_CUDA, &mr), -EINVAL);
	assert_non_null(strstr(mp_last_error(ctx), "is not device memory"));
	/* The range must stay inside the allocation. */
	assert_int_equal(mp_mem_register(ctx, fk.mem[0].base, 65 * sizeof(float), MP_MEM_CUDA, &mr),
			 -EINVAL);
	char *base = fk.mem[0].base;
	assert_int_equal(mp_mem_register(ctx, base + 2, 32 * sizeof(float), MP_MEM_CUDA, &mr), 0);
	assert_int_equal(mp_average_start(ctx, (float *)(base + 4), 4, 1.0f, mr, &req), -EINVAL);
	assert_non_null(strstr(mp_last_error(ctx), "not float-aligned"));
	assert_int_equal(mp_average_start(ctx, (float *)(base + 32 * sizeof(float)), 4, 1.0f, mr, &req),
			 -EINVAL);
	assert_int_equal(mp_mem_deregister(ctx, mr), 0);
	mp_finalize(ctx);
	check_released(1);
	fk_mem_fini(0);
}

/*
 * mp_average_start_stream and mp_request_stream_wait: each peer's kernel
 * writes its values on its stream 40 ms after the call, over stale ones;
 * the copies take 10 ms on the fake device. The average must see the
 * kernel's values (its copy in waits for the caller's stream), and the
 * stream's next kernel (a probe) must run after the result is in.
 */
static void stream_order(const char *transport)
{
	const struct scenario sc = {transport, transport, 2, NULL, 2, 2000, 3, 2010, 40, 0};
	static const int ok[MAXOPS] = {0, 0, 0};
	struct shared *sh = calloc(1, sizeof(*sh));

	fk_reset();
	fk.copy_delay_ms = 10;
	sh->sc = &sc;
	run_peers(sh);
	for (int r = 0; r < sc.npeers; r++)
		check_peer(sh, r, ok);
	check_released(sc.npeers);
	for (int r = 0; r < sc.npeers; r++)
		fk_mem_fini(r);
	free(sh);
}

static void stage_stream_order_loop(void **state)
{
	(void)state;
	stream_order("loop");
}

static void stage_stream_order_tcp(void **state)
{
	(void)state;
	stream_order("tcp");
}

static void stage_stream_failures(void **state)
{
	/* As stage_copy_failures, on the caller's stream: operation 0's copy
	 * in is refused on both peers, operation 1's copy back on peer 1,
	 * operation 2 works. The caller's stream goes on after each (the
	 * word is set on failure too) and reads the buffer as documented. */
	static const struct scenario sc = {"stream-fail", "loop", 2, NULL, 3, 1000, 3, 1010, 20, 0};
	static const int rc0[MAXOPS] = {-EIO, 0, 0}, rc1[MAXOPS] = {-EIO, -EIO, 0};
	struct shared *sh = calloc(1, sizeof(*sh));

	(void)state;
	fk_reset();
	fk.copy_delay_ms = 5;
	fk.fail_in[0] = 3;
	fk.fail_out[1] = 2;
	sh->sc = &sc;
	run_peers(sh);
	check_peer(sh, 0, rc0);
	check_peer(sh, 1, rc1);
	check_released(sc.npeers);
	for (int r = 0; r < sc.npeers; r++)
		fk_mem_fini(r);
	free(sh);
}

static void stage_stream_peer_dies(void **state)
{
	/* Peer 1 leaves before the average: peer 0's average ends without it
	 * (alone: its own values, or an error and the buffer as it was; the
	 * same bytes), and its stream goes on. */
	static const struct scenario sc = {"stream-dies", "loop", 2, NULL, 1, 500, 0, 500, 10, 2};
	struct shared *sh = calloc(1, sizeof(*sh));

	(void)state;
	fk_reset();
	fk.copy_delay_ms = 5;
	sh->sc = &sc;
	run_peers(sh);
	if (sh->synced[0][0] || !sh->ran[0][0])
		fail_msg("peer 0: the caller's stream never got past its wait (average: %s)",
			 mp_strerror(sh->rc[0][0]));
	for (size_t i = 0; i < sc.count; i++)
		if (sh->after[0][0][i] != input(0, 0, i) || sh->probe[0][0][i] != input(0, 0, i))
			fail_msg("value %zu: %.9g at the end, %.9g read by the stream, expected %.9g (%s)",
				 i, sh->after[0][0][i], sh->probe[0][0][i], input(0, 0, i),
				 mp_strerror(sh->rc[0][0]));
	/* Today: -EHOSTUNREACH ("peer unreachable"). */
	if (sh->rc[0][0] == 0)
		assert_int_equal(sh->res[0][0].failed_peers, 1);
	else
		assert_int_equal(sh->rc[0][0], -EHOSTUNREACH);
	free(sh->after[0][0]);
	free(sh->probe[0][0]);
	check_released(1);
	for (int r = 0; r < sc.npeers; r++)
		fk_mem_fini(r);
	free(sh);
}

static void *let_go_later(void *go)
{
	usleep(100000);
	fk_let_go(go);
	return NULL;
}

static void stage_stream_finalize(void **state)
{
	/*
	 * mp_finalize with a request waiting for its copy in (the caller's
	 * stream is held until the test lets it go, 100 ms into mp_finalize)
	 * and one queued behind it: both end, the stream that waits for them
	 * goes on, nothing is copied back, and the registration they held is
	 * released once its copy in has run.
	 */
	const size_t n = 256, bytes = n * sizeof(float);
	float *v = malloc(bytes), *seen = calloc(n, sizeof(float)), *now = malloc(bytes);
	mp_request *req[2];
	mp_mr *mr;
	int ran = 0, go = 0;
	struct timespec t0, t1;
	pthread_t th;

	(void)state;
	fk_reset();
	fk_mem_init(0, bytes);
	for (size_t i = 0; i < n; i++)
		v[i] = stale(0, 0, i);
	fk_write(0, 0, v, bytes);
	mp_ctx *ctx = solo("stage-stream-fin");
	struct fk_stream *a = fk_stream_new(0), *b = fk_stream_new(0);
	assert_int_equal(mp_mem_register(ctx, fk.mem[0].base, bytes, MP_MEM_CUDA, &mr), 0);
	for (size_t i = 0; i < n; i++)
		v[i] = input(0, 0, i);
	fk_hold(a, &go);
	fk_kernel_write(a, 0, 0, v, bytes, 0);
	for (int k = 0; k < 2; k++) {
		assert_int_equal(mp_average_start_stream(ctx, (float *)fk.mem[0].base, n, 1.0f, mr, 0,
							 a, &req[k]), 0);
		assert_int_equal(mp_request_stream_wait(req[k], b), 0);
	}
	fk_probe(b, 0, 0, seen, bytes, &ran);
	usleep(30000);
	pthread_mutex_lock(&fk.mu);
	assert_int_equal(ran, 0); /* b waits */
	pthread_mutex_unlock(&fk.mu);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	assert_int_equal(pthread_create(&th, NULL, let_go_later, &go), 0);
	mp_finalize(ctx);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	pthread_join(th, NULL);
	/* b went on (the requests ended, in any case before the registration
	 * was released: the word is in its pinned memory). */
	assert_int_equal(fk_stream_sync(b, 2000), 0);
	assert_int_equal(ran, 1);
	/* The registration was released once the queued copy in had run (the
	 * kernel first), and not after 10 s (round_timeout_ms's default). */
	assert_int_equal(fk_stream_sync(a, 2000), 0);
	double ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6;
	assert_true(ms >= 100 && ms < 5000);
	fk_read(0, 0, now, bytes);
	for (size_t i = 0; i < n; i++)
		assert_true(now[i] == input(0, 0, i)); /* the kernel's, not an average's */
	for (size_t b2 = 0; b2 < bytes; b2++) {
		assert_int_equal(fk.mem[0].n_out[b2], 0);
		assert_int_equal(fk.mem[0].n_in[b2], 1);
	}
	check_released(1);
	fk_stream_free(a);
	fk_stream_free(b);
	fk_mem_fini(0);
	free(v);
	free(seen);
	free(now);
}

static void stage_legacy_stream(void **state)
{
	/*
	 * mp_average_start, no stream given: the copy in waits for the work
	 * queued on the legacy default stream when the operation starts (a
	 * kernel there writes the values 40 ms later, over stale ones; alone,
	 * the average is those values); and a stream can wait for such a
	 * request too.
	 */
	const size_t n = 128, bytes = n * sizeof(float);
	float v[128], seen[128], now[128];
	mp_request *req;
	mp_mr *mr;
	int ran = 0;

	(void)state;
	fk_reset();
	fk.copy_delay_ms = 5;
	fk_mem_init(0, bytes);
	for (size_t i = 0; i < n; i++)
		v[i] = stale(0, 0, i);
	fk_write(0, 0, v, bytes);
	mp_ctx *ctx = solo("stage-legacy");
	struct fk_stream *b = fk_stream_new(0);
	assert_int_equal(mp_mem_register(ctx, fk.mem[0].base, bytes, MP_MEM_CUDA, &mr), 0);
	for (size_t i = 0; i < n; i++)
		v[i] = input(0, 0, i);
	fk_kernel_write(NULL, 0, 0, v, bytes, 40);
	assert_int_equal(mp_average_start(ctx, (float *)fk.mem[0].base, n, 1.0f, mr, &req), 0);
	assert_int_equal(mp_request_stream_wait(req, b), 0);
	fk_probe(b, 0, 0, seen, bytes, &ran);
	assert_int_equal(mp_wait(req, 20000, NULL), 0);
	assert_int_equal(fk_stream_sync(b, 2000), 0);
	assert_int_equal(ran, 1);
	fk_read(0, 0, now, bytes);
	assert_memory_equal(now, v, bytes);
	assert_memory_equal(seen, v, bytes);
	for (size_t k = 0; k < bytes; k++)
		assert_true(fk.mem[0].n_in[k] == 1 && fk.mem[0].n_out[k] == 1);
	assert_int_equal(mp_mem_deregister(ctx, mr), 0);
	mp_finalize(ctx);
	check_released(1);
	fk_stream_free(b);
	fk_mem_fini(0);
}

static void stage_stream_timeout(void **state)
{
	/*
	 * The caller's stream does not get to the average's event within
	 * round_timeout_ms (300 ms here; it is held until the test lets it go): -EIO,
	 * said, the buffer as it was, the stream let go. The copy in stays
	 * queued on the registration's stream, so the next average's copy in,
	 * queued behind it, runs after it and after the kernel: that average
	 * is of the kernel's values.
	 */
	const size_t n = 128, bytes = n * sizeof(float);
	float v[128], now[128];
	struct mp_config cfg;
	char addr[MP_ADDR_STRLEN];
	const char *addrs[1] = {addr};
	mp_request *req;
	mp_ctx *ctx;
	mp_mr *mr;
	int go = 0;

	(void)state;
	fk_reset();
	fk_mem_init(0, bytes);
	for (size_t i = 0; i < n; i++)
		v[i] = stale(0, 0, i);
	fk_write(0, 0, v, bytes);
	mp_config_init(&cfg);
	cfg.transport = "loop";
	cfg.run_name = "stage-timeout";
	cfg.npeers = 1;
	cfg.rank = 0;
	cfg.round_timeout_ms = 300;
	assert_int_equal(mp_init(&cfg, &ctx), 0);
	assert_int_equal(mp_local_address(ctx, addr, sizeof(addr)), 0);
	assert_int_equal(mp_set_peers(ctx, addrs, 1), 0);
	struct fk_stream *a = fk_stream_new(0), *b = fk_stream_new(0);
	assert_int_equal(mp_mem_register(ctx, fk.mem[0].base, bytes, MP_MEM_CUDA, &mr), 0);
	for (size_t i = 0; i < n; i++)
		v[i] = input(0, 0, i);
	fk_hold(a, &go);
	fk_kernel_write(a, 0, 0, v, bytes, 0);
	assert_int_equal(mp_average_start_stream(ctx, (float *)fk.mem[0].base, n, 1.0f, mr, 0, a,
						 &req), 0);
	assert_int_equal(mp_request_stream_wait(req, b), 0);
	assert_int_equal(mp_wait(req, 20000, NULL), -EIO);
	const char *e = mp_last_error(ctx);
	if (!strstr(e, "to the host failed (not completed: timed out within "
		    "round_timeout_ms") || !strstr(e, "the buffer is as it was"))
		fail_msg("message: \"%s\"", e);
	assert_int_equal(fk_stream_sync(b, 2000), 0); /* let go, a still held */
	fk_read(0, 0, now, bytes);
	for (size_t i = 0; i < n; i++)
		assert_true(now[i] == stale(0, 0, i));
	/* The next average, its copy in queued behind the first; then the
	 * caller's kernel runs. */
	assert_int_equal(mp_average_start(ctx, (float *)fk.mem[0].base, n, 1.0f, mr, &req), 0);
	usleep(20000);
	fk_let_go(&go);
	assert_int_equal(mp_wait(req, 20000, NULL), 0);
	fk_read(0, 0, now, bytes);
	assert_memory_equal(now, v, bytes);
	for (size_t k = 0; k < bytes; k++)
		assert_true(fk.mem[0].n_in[k] == 2 && fk.mem[0].n_out[k] == 1);
	assert_int_equal(fk_stream_sync(a, 2000), 0);
	assert_int_equal(mp_mem_deregister(ctx, mr), 0);
	mp_finalize(ctx);
	check_released(1);
	fk_stream_free(a);
	fk_stream_free(b);
	fk_mem_fini(0);
}

static void stage_stream_refusals(void **state)
{
	/* Bad arguments change nothing: no copy, no request, the buffer and
	 * the caller's stream as they were. */
	const size_t n = 64, bytes = n * sizeof(float);
	float host[64], v[64], now[64];
	mp_mr *mr, *hmr;
	mp_request *req = NULL, *hreq;

	(void)state;
	fk_reset();
	fk_mem_init(0, bytes);
	fk_mem_init(1, bytes);
	for (size_t i = 0; i < n; i++)
		host[i] = v[i] = input(0, 0, i);
	fk_write(0, 0, v, bytes);
	mp_ctx *ctx = solo("stage-stream-refusals");
	struct fk_stream *mine = fk_stream_new(0), *other = fk_stream_new(1);
	float *dev = (float *)fk.mem[0].base;
	assert_int_equal(mp_mem_register(ctx, dev, bytes, MP_MEM_CUDA, &mr), 0);
	assert_int_equal(mp_mem_register(ctx, host, sizeof(host), MP_MEM_HOST, &hmr), 0);
	/* A host registration, or none. */
	assert_int_equal(mp_average_start_stream(ctx, host, n, 1.0f, hmr, 0, mine, &req), -EINVAL);
	assert_non_null(strstr(mp_last_error(ctx), "only for buffers of an MP_MEM_CUDA registration"));
	assert_null(req);
	assert_int_equal(mp_average_start_stream(ctx, dev, n, 1.0f, NULL, 0, mine, &req), -EINVAL);
	assert_null(req);
	/* No request to return. */
	assert_int_equal(mp_average_start_stream(ctx, dev, n, 1.0f, mr, 0, mine, NULL), -EINVAL);
	/* An unknown flag. */
	assert_int_equal(mp_average_start_stream(ctx, dev, n, 1.0f, mr, 0x80, mine, &req), -EINVAL);
	/* A stream of another context. */
	assert_int_equal(mp_average_start_stream(ctx, dev, n, 1.0f, mr, 0, other, &req), -EINVAL);
	assert_non_null(strstr(mp_last_error(ctx), "cannot wait for stream"));
	assert_non_null(strstr(mp_last_error(ctx), "belongs to peer 1's context"));
	assert_null(req);
	assert_int_equal(mp_request_stream_wait(NULL, mine), -EINVAL);
	/* A request of host memory. */
	assert_int_equal(mp_average_start(ctx, host, n, 1.0f, hmr, &hreq), 0);
	assert_int_equal(mp_request_stream_wait(hreq, mine), -EINVAL);
	assert_non_null(strstr(mp_last_error(ctx), "only the average of an MP_MEM_CUDA registration"));
	assert_int_equal(mp_wait(hreq, 20000, NULL), 0);
	/* Nothing was copied, the device buffer is as it was. */
	for (size_t b = 0; b < bytes; b++)
		assert_true(fk.mem[0].n_in[b] == 0 && fk.mem[0].n_out[b] == 0);
	fk_read(0, 0, now, bytes);
	assert_memory_equal(now, v, bytes);
	/* A device without stream memory operations: -ENOTSUP, said, and
	 * the request still completes through mp_wait (alone: the values stay). */
	fk.no_memops = 1;
	assert_int_equal(mp_average_start_stream(ctx, dev, n, 1.0f, mr, 0, mine, &req), 0);
	assert_int_equal(mp_request_stream_wait(req, mine), -ENOTSUP);
	assert_non_null(strstr(mp_last_error(ctx), "no stream memory operations"));
	assert_int_equal(mp_request_stream_wait(req, other), -ENOTSUP);
	assert_int_equal(mp_wait(req, 20000, NULL), 0);
	fk_read(0, 0, now, bytes);
	assert_memory_equal(now, v, bytes);
	assert_int_equal(fk_stream_sync(mine, 2000), 0);
	assert_int_equal(mp_mem_deregister(ctx, mr), 0);
	assert_int_equal(mp_mem_deregister(ctx, hmr), 0);
	mp_finalize(ctx);
	check_released(1);
	fk_stream_free(mine);
	fk_stream_free(other);
	fk_mem_fini(0);
	fk_mem_fini(1);
}

static void stage_without_cuda_driver(void **state)
{
	/* The real table on a host without libcuda.so.1: the documented error,
	 * and a message that names what is missing. */
	mp_ctx *ctx;
	mp_mr *mr = NULL;
	float host[8] = {1, 2, 3, 4, 5, 6, 7, 8};

	(void)state;
	void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	if (h) {
		dlclose(h);
		skip(); /* a CUDA driver is installed: this is not the host for the check */
	}
	mp_stage_dev_ops = &mp_stage_cuda_ops;
	ctx = solo("stage-nodriver");
	assert_int_equal(mp_mem_register(ctx, host, sizeof(host), MP_MEM_CUDA, &mr), -ENOTSUP);
	assert_null(mr);
	const char *e = mp_last_error(ctx);
#ifdef MP_HAVE_CUDA_STAGE
	if (!strstr(e, "cannot be staged through host memory: the CUDA driver cannot be loaded") ||
	    !strstr(e, "libcuda.so.1"))
		fail_msg("message: \"%s\"", e);
#else
	if (!strstr(e, "-Dcuda=disabled"))
		fail_msg("message: \"%s\"", e);
#endif
	/* Host memory still averages (alone: the values stay). */
	assert_int_equal(mp_average(ctx, host, 8, 1.0f, NULL), 0);
	assert_true(host[0] == 1.0f && host[7] == 8.0f);
	mp_finalize(ctx);
	mp_stage_dev_ops = &fk_ops;
}

int main(void)
{
	/* Logs go to a file the tests read (INFO: the staging line). */
	snprintf(log_path, sizeof(log_path), "/tmp/test_stage_fake.%d.log", (int)getpid());
	setenv("MP_DEBUG", "INFO", 1);
	setenv("MP_DEBUG_FILE", log_path, 1);
	mp_stage_dev_ops = &fk_ops;

	const struct CMUnitTest tests[] = {
		cmocka_unit_test(stage_exact_average_loop),
		cmocka_unit_test(stage_exact_average_tcp),
		cmocka_unit_test(stage_exact_average_ofi),
		cmocka_unit_test(stage_copy_failures),
		cmocka_unit_test(stage_refusals),
		cmocka_unit_test(stage_stream_order_loop),
		cmocka_unit_test(stage_stream_order_tcp),
		cmocka_unit_test(stage_stream_failures),
		cmocka_unit_test(stage_stream_peer_dies),
		cmocka_unit_test(stage_stream_finalize),
		cmocka_unit_test(stage_legacy_stream),
		cmocka_unit_test(stage_stream_timeout),
		cmocka_unit_test(stage_stream_refusals),
		cmocka_unit_test(stage_without_cuda_driver),
	};
	int rc = cmocka_run_group_tests(tests, NULL, NULL);
	fk_shutdown();
	unlink(log_path);
	return rc;
}
