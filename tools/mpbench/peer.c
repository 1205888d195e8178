/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * One mpbench peer: initialise the library, exchange addresses, average every
 * size with timing, and check the results against the exact weighted mean.
 * A peer of a followed run (churn.c) instead averages one round per call and
 * reports each round.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "mpbench.h"
#include "dpdk_seg.h"

#define HEARTBEAT_S 1.0
/* Values generated per peer to check one size; above it every k-th element
 * is checked instead of all, so the check stays bounded. */
#ifndef CHECK_BUDGET
#define CHECK_BUDGET (1ULL << 28)
#endif

/* ------------------------------------------------------------------------ */
/* One peer: initialise, exchange addresses, benchmark every size            */

static void peer_heartbeat(struct peer *p)
{
	double t;

	if (!p->up)
		return;
	t = mp_now_s();
	if (t - p->last_hb < HEARTBEAT_S)
		return;
	p->last_hb = t;
	chan_send(p->up, MSG_HEARTBEAT, p->rank, NULL, 0, p->b->silence_ms);
}

__attribute__((format(printf, 2, 3)))
static void peer_fail(struct peer *p, const char *fmt, ...)
{
	char text[1024];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(text, sizeof(text), fmt, ap);
	va_end(ap);
	if (p->up)
		chan_send(p->up, MSG_ERROR, p->rank, text, (uint32_t)strlen(text),
			  p->b->silence_ms);
	else
		fprintf(stderr, PROG ": rank %d: %s\n", p->rank, text);
}

static void fill(struct peer *p, float *buf, size_t count, uint64_t key)
{
	const size_t block = (size_t)1 << 20;

	for (size_t i0 = 0; i0 < count; i0 += block) {
		size_t i1 = i0 + block < count ? i0 + block : count;

		for (size_t i = i0; i < i1; i++)
			buf[i] = gen_value(key, i);
		peer_heartbeat(p);
	}
}

/* Compare @out with the exact weighted mean of the inputs of @it of the
 * peers @in marks (every peer when @in is NULL). */
static void verify(struct peer *p, const float *out, size_t count, int it,
		   const unsigned char *in, struct size_result *r)
{
	const struct bench *b = p->b;
	const size_t block = (size_t)1 << 18;
	int n = p->npeers;
	uint64_t work = (uint64_t)count * (uint64_t)n;
	size_t stride = work > CHECK_BUDGET ? (size_t)((work + CHECK_BUDGET - 1) / CHECK_BUDGET) : 1;
	int64_t checked = 0;
	uint64_t *keys = xmalloc((size_t)n * sizeof(*keys));
	double *w = xmalloc((size_t)n * sizeof(*w));
	double wsum = 0.0, maxe = 0.0, sumsq = 0.0;
	int64_t wrong = 0;

	for (int q = 0; q < n; q++) {
		keys[q] = stream_key(b->seed, q, it);
		w[q] = in && !in[q] ? 0.0 : peer_weight(b, q);
		wsum += w[q];
	}
	for (size_t i0 = 0; i0 < count; i0 += block) {
		size_t i1 = i0 + block < count ? i0 + block : count;

		size_t first = (i0 + stride - 1) / stride * stride;

		for (size_t i = first; i < i1; i += stride) {
			double e = 0.0, d;

			for (int q = 0; q < n; q++)
				if (w[q] != 0.0)
					e += w[q] * gen_value(keys[q], i);
			e /= wsum;
			d = fabs((double)out[i] - e);
			if (isnan(d))
				d = INFINITY;
			if (!(d <= b->tol))
				wrong++;
			if (d > maxe)
				maxe = d;
			sumsq += d * d;
			checked++;
		}
		peer_heartbeat(p);
	}
	r->max_err = maxe;
	r->rms_err = checked ? sqrt(sumsq / (double)checked) : 0.0;
	r->checked = checked;
	r->wrong = b->exact ? wrong : -1;
	free(keys);
	free(w);
}

/*
 * Multi-host runs (one mpbench per host, no coordinator to follow them):
 * when this peer knows of peers that dropped out (bench_wan.sh --kill), the
 * mean of all N inputs is not what a correct survivor holds, so also say
 * how far its result of the last iteration lies from the weighted mean of
 * the inputs of the peers it still counts as live, and how many
 * contributions the library says reached it. Ring and butterfly owe that
 * mean exactly once the dead are known; Moshpit on a grid with an empty
 * cell does not (its rounds weigh the remaining members equally), and the
 * line shows by how much. One line on stdout per survivor and size.
 */
static void verify_survivors(struct peer *p, const float *out, size_t count, int it,
			     uint64_t bytes, const struct mp_result *last)
{
	int n = p->npeers, live = 0, got;
	struct mp_peer_info *t = xcalloc((size_t)n, sizeof(*t));
	unsigned char *in = xcalloc((size_t)n, 1);
	struct size_result r = { 0 };
	char list[256] = "";
	size_t off = 0;

	got = mp_peers_info(p->ctx, t, n, sizeof(*t));
	if (got < 0) {
		fprintf(stderr, PROG ": rank %d: mp_peers_info: %s\n", p->rank, mp_strerror(got));
		goto out;
	}
	for (int i = 0; i < got && i < n; i++) {
		int q = t[i].rank;

		if (q < 0 || q >= n || t[i].state == MP_PEER_DOWN || t[i].state == MP_PEER_GONE ||
		    (p->b->dead_mask && p->b->dead_mask[q]))
			continue;
		in[q] = 1;
	}
	for (int q = 0; q < n; q++) {
		if (in[q]) {
			live++;
			continue;
		}
		if (off < sizeof(list))
			off += (size_t)snprintf(list + off, sizeof(list) - off, "%s%d", off ? "," : "", q);
	}
	if (live == n)
		goto out; /* nobody dropped out: the all-N check above is the one */
	verify(p, out, count, it, in, &r);
	printf(PROG ": rank %d: survivors' check, %" PRIu64 " B, last iteration: %d live "
	       "peers (down: %s), %d contributions reached the result, wrong %" PRId64
	       " of %" PRId64 ", max_err %.3g\n", p->rank, bytes, live, list, last->peers,
	       r.wrong < 0 ? (int64_t)-1 : r.wrong, r.checked, r.max_err);
	fflush(stdout);
out:
	free(in);
	free(t);
}

/* The safety limit of a wait without a timeout: said, and the peer ends. */
static char alarm_text[256];
static size_t alarm_len;

static void on_alarm(int sig)
{
	ssize_t w = write(STDERR_FILENO, alarm_text, alarm_len);

	(void)sig;
	(void)w;
	_exit(3);
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

/* The median of @n > 0 values (sorted in place): the middle one, or the
 * mean of the two middle ones for even @n, as numpy's median. */
static double median(double *v, int n)
{
	qsort(v, (size_t)n, sizeof(*v), cmp_double);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2.0;
}

/* One average, bounded by the library's deadlines and our safety limit.
 * -ETIMEDOUT is that limit: the request is then still in flight.
 *
 * A peer that is a process of its own averages with the blocking call, as
 * an application would (mp_average_ex; the library finds the registration
 * @mr covers): the library then runs the average on this thread rather
 * than hand it to its progress thread and the result back, two thread
 * wake-ups that cost more than a short exchange on a host with fewer cores
 * than peers (doc/performance.md, "Short vectors"). Its safety limit is
 * then an alarm. Threads of one process (--transport=loop) keep the start
 * and the timed wait: an alarm is the process's. So does device memory
 * (--memory=cuda, @mr its registration): the blocking call takes no
 * registration, and without one the library reads the buffer as host
 * memory. */
static int peer_average(struct peer *p, float *buf, size_t count, float weight, mp_mr *mr,
			unsigned flags, struct mp_result *res, char *why, size_t whylen)
{
	mp_request *req = NULL;
	double t0;
	int rc;

	if (!p->b->loop && !(p->b->cuda && mr)) {
		int n = snprintf(alarm_text, sizeof(alarm_text),
				 PROG ": peer %d: no completion within the safety limit of %d s (the "
				 "library's own deadlines did not fire)\n", p->rank,
				 p->b->op_cap_ms / 1000);

		(void)mr;
		alarm_len = n > 0 && (size_t)n < sizeof(alarm_text) ? (size_t)n : 0;
		signal(SIGALRM, on_alarm);
		alarm((unsigned)((p->b->op_cap_ms + 999) / 1000));
		rc = mp_average_ex(p->ctx, buf, count, weight, flags, res);
		alarm(0);
		if (rc)
			snprintf(why, whylen, "mp_average: %s: %s", mp_strerror(rc),
				 mp_last_error(p->ctx));
		return rc;
	}
	rc = mp_average_start_ex(p->ctx, buf, count, weight, mr, flags, &req);
	if (rc) {
		snprintf(why, whylen, "mp_average_start: %s: %s", mp_strerror(rc),
			 mp_last_error(p->ctx));
		return rc;
	}
	t0 = mp_now_s();
	rc = mp_wait(req, p->b->op_cap_ms, res);
	if (rc == -ETIMEDOUT && mp_now_s() - t0 >= p->b->op_cap_ms * 1e-3 - 0.05) {
		snprintf(why, whylen, "no completion within the safety limit of %d s "
			 "(the library's own deadlines did not fire)", p->b->op_cap_ms / 1000);
		return rc;
	}
	if (rc)
		snprintf(why, whylen, "mp_wait: %s: %s", mp_strerror(rc), mp_last_error(p->ctx));
	return rc;
}

/*
 * --sync: every peer starts the timed average together, as nccl-tests'
 * and Gloo's barriers make theirs start. The refill of 64 MiB of test data
 * takes a peer tens of milliseconds of CPU, and eight of them share two
 * cores here: without it, the peer that finished its refill first would
 * time the others' refills too, and the slowest peer's time is reported.
 * The barrier is an average of one value, uncompressed (any codec), so
 * that every peer has sent to everyone, directly or through the grid's
 * rounds, before any leaves it; untimed and uncounted.
 */
static int peer_sync(struct peer *p, char *why, size_t whylen)
{
	float one = 1.0f;
	int rc = peer_average(p, &one, 1, 1.0f, NULL, MP_AVG_UNCOMPRESSED, NULL, why, whylen);

	return rc;
}

/*
 * Multi-host: the slowest and fastest rank's time of a size, so that rank 0
 * reports what nccl-tests does (the max over ranks), not its own time. The
 * ranks have only the library between them, so the times travel in an
 * average, sent uncompressed (MP_AVG_UNCOMPRESSED) whatever the codec, so
 * that no codec rounds them. Rank r puts the triple (mean time, median
 * time, 1) at indices 3r to 3r + 2 of a vector of zeros. Every average
 * is a weighted mean that treats all elements alike where no member fails,
 * so whatever the weights, groups and grid (a partial one included), rank
 * 0 ends with (c·mean, c·median, c) for each rank, c that rank's share: the
 * times are the ratios, to fp32 precision, and c = 0 says that the rank's
 * triple never reached rank 0 (it was down, or an aux peer still at weight
 * 0). A failure treats only the parts it touches otherwise (a part whose
 * reducer fails stays unaveraged), so a triple sits in adjacent elements,
 * which one part nearly always holds all of: only a failure in the gather
 * itself, at a part boundary among the three, could skew a ratio.
 *
 * An aux peer averages at weight 0 (moshpit.h), so its triple counts for
 * nothing in the first pass. After it, it holds the group's values and a
 * weight like any member: it writes its own pair into its slots (which only
 * it writes, so they are still 0) and averages on with the weight it was
 * left. Hence bench->gather_passes >= 2, so many that enough rounds follow
 * the first pass for its triple to spread (see gather_passes in launch.c).
 * Every rank runs every pass whatever fails, so that the ranks' calls stay
 * in step, and the ranks' weights follow mp_result.weight between passes.
 *
 * Sets r->time_us (max), r->time_min_us, r->time_median_us (max of the
 * ranks' medians) and r->time_ranks: the ranks whose
 * times they cover, this rank always (its own time needs no average).
 * Returns 0, or -ETIMEDOUT when a pass ran past the safety limit (that
 * average is still in flight: the run cannot go on); where a pass failed
 * otherwise, or ranks are missing, rank 0 says so on stderr.
 */
static int gather_times(struct peer *p, uint64_t bytes, struct size_result *r)
{
	const struct bench *b = p->b;
	const int n = p->npeers, me = p->rank, aux = b->cfg.mode == MP_MODE_AUX;
	const double own = r->time_us, own_med = r->time_median_us;
	float *v = xcalloc((size_t)3 * (size_t)n, sizeof(float));
	float w = aux ? 0.0f : 1.0f;
	char why[800] = "", missing[160] = "";
	size_t mlen = 0;
	int failed = 0, nmissing = 0;

	v[3 * me] = (float)own;
	v[3 * me + 1] = (float)own_med;
	v[3 * me + 2] = 1.0f;
	for (int k = 0; k < b->gather_passes; k++) {
		struct mp_result res;
		char w2[768];
		int rc;

		if (k == 1 && aux) {
			v[3 * me] = (float)own;
			v[3 * me + 1] = (float)own_med;
			v[3 * me + 2] = 1.0f;
		}
		memset(&res, 0, sizeof(res));
		rc = peer_average(p, v, (size_t)3 * (size_t)n, w, NULL, MP_AVG_UNCOMPRESSED, &res,
				  w2, sizeof(w2));
		if (rc == -ETIMEDOUT) {
			peer_fail(p, "size %" PRIu64 " B, gathering the ranks' times: %s", bytes, w2);
			free(v);
			return rc;
		}
		if (rc) {
			if (!failed++)
				snprintf(why, sizeof(why), "pass %d: %s", k + 1, w2);
			continue;
		}
		if (isfinite(res.weight) && res.weight > 0.0f)
			w = res.weight;
	}
	r->time_us = -INFINITY;
	r->time_min_us = INFINITY;
	r->time_median_us = -INFINITY;
	r->time_ranks = 0;
	for (int q = 0; q < n; q++) {
		double c = v[3 * q + 2];
		double t = q == me ? own : c > 0.0f ? (double)v[3 * q] / c : NAN;
		double tm = q == me ? own_med : c > 0.0f ? (double)v[3 * q + 1] / c : NAN;

		if (!(t >= 0.0) || !isfinite(t)) {
			if (nmissing++ < 8 && mlen < sizeof(missing))
				mlen += (size_t)snprintf(missing + mlen, sizeof(missing) - mlen, "%s%d",
							 nmissing > 1 ? ", " : "", q);
			continue;
		}
		r->time_us = t > r->time_us ? t : r->time_us;
		r->time_median_us = tm > r->time_median_us ? tm : r->time_median_us;
		r->time_min_us = t < r->time_min_us ? t : r->time_min_us;
		r->time_ranks++;
	}
	if (me == 0 && (nmissing || failed)) {
		fprintf(stderr, PROG ": warning: size %" PRIu64 ": time is the max over %d of %d ranks",
			bytes, r->time_ranks, n);
		if (nmissing)
			fprintf(stderr, "; no time from rank%s %s%s (down, aux, or its average did "
				"not reach rank 0)", nmissing > 1 ? "s" : "", missing,
				nmissing > 8 ? ", ..." : "");
		if (failed)
			fprintf(stderr, "; the gather failed in %d of %d passes, first %s", failed,
				b->gather_passes, why);
		fprintf(stderr, "\n");
	}
	free(v);
	return 0;
}

static void peer_report(struct peer *p, const struct size_result *r)
{
	if (p->up)
		chan_send(p->up, MSG_RESULT, p->rank, r, sizeof(*r), p->b->silence_ms);
	else
		agg_add(p->agg, r);
}

/* --peer-stats: this peer's table of its peers, to whoever prints it. */
static void peer_stats(struct peer *p)
{
	int n = mp_peers_info(p->ctx, NULL, 0, sizeof(struct mp_peer_info));
	struct mp_peer_info *t;

	if (n < 0) {
		fprintf(stderr, PROG ": rank %d: mp_peers_info: %s\n", p->rank, mp_strerror(n));
		return;
	}
	t = xcalloc((size_t)(n ? n : 1), sizeof(*t));
	/* The table may have grown since (dht): take what fits. */
	int got = mp_peers_info(p->ctx, t, n, sizeof(*t));
	if (got < n)
		n = got < 0 ? 0 : got;
	if (p->up)
		chan_send(p->up, MSG_PEER_STATS, p->rank, t, (uint32_t)((size_t)n * sizeof(*t)),
			  p->b->silence_ms);
	else
		agg_peer_stats(p->agg, p->rank, t, n);
	free(t);
}

/*
 * --memory=cuda: this peer's device. Local peers take rank mod the device
 * count; in a multi-host run, where the ranks of one host need not be
 * adjacent, the launcher's local rank (mpirun, srun), else device 0.
 */
static int device_index(const struct peer *p)
{
	static const char *const vars[] = { "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID",
					    "MPI_LOCALRANKID" };

	if (!p->b->multi)
		return p->rank;
	for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++) {
		const char *v = getenv(vars[i]);
		char *end;
		long r;

		if (!v || !*v)
			continue;
		r = strtol(v, &end, 10);
		if (!*end && r >= 0 && r < INT_MAX)
			return (int)r;
	}
	return 0;
}

/*
 * --memory=cuda: the peer's device buffer of @len bytes, registered as
 * MP_MEM_CUDA. 0, or -1 after peer_fail (nothing left to release but what
 * dev_close releases).
 */
static int peer_device_buffer(struct peer *p, size_t len, void **dbuf, mp_mr **mr)
{
	char why[512];
	int rc;

	if (dev_open(device_index(p), why, sizeof(why)) ||
	    dev_alloc(len, dbuf, why, sizeof(why))) {
		peer_fail(p, "--memory=cuda: %s", why);
		return -1;
	}
	rc = mp_mem_register(p->ctx, *dbuf, len, MP_MEM_CUDA, mr);
	if (rc) {
		peer_fail(p, "--memory=cuda: mp_mem_register(MP_MEM_CUDA, %zu bytes): %s: %s", len,
			  mp_strerror(rc), mp_last_error(p->ctx));
		dev_free(*dbuf);
		*dbuf = NULL;
		*mr = NULL;
		return -1;
	}
	return 0;
}

int peer_bench(struct peer *p)
{
	const struct bench *b = p->b;
	uint64_t maxb = b->sizes[b->nsizes - 1];
	size_t alloc = (size_t)((maxb + 4095) & ~(uint64_t)4095);
	float *buf = aligned_alloc(4096, alloc);
	/* --memory=cuda: the buffer averaged, in device memory; buf is then its
	 * host copy, where the data are made and the result is checked. */
	void *dbuf = NULL;
	float w = peer_weight(b, p->rank);
	mp_mr *mr = NULL;
	int rc = 0;

	if (!buf) {
		peer_fail(p, "cannot allocate %" PRIu64 " bytes", maxb);
		return -1;
	}
	memset(buf, 0, alloc);
	if (b->cuda) {
		if (peer_device_buffer(p, (size_t)maxb, &dbuf, &mr)) {
			dev_close();
			free(buf);
			return -1;
		}
		rc = 0;
	} else if ((rc = mp_mem_register(p->ctx, buf, (size_t)maxb, MP_MEM_HOST, &mr))) {
		if (p->rank == 0)
			fprintf(stderr, PROG ": warning: mp_mem_register: %s: %s (averaging "
				"unregistered memory)\n", mp_strerror(rc), mp_last_error(p->ctx));
		mr = NULL;
		rc = 0;
	}

	for (int s = 0; s < b->nsizes && rc == 0; s++) {
		uint64_t bytes = b->sizes[s];
		size_t count = (size_t)(bytes / 4);
		int total = b->warmup + b->iters;
		struct size_result r;
		double tsum = 0.0, sent = 0.0, recvd = 0.0, vals = 0.0;
		double *ts = xmalloc((size_t)b->iters * sizeof(double));
		struct mp_result last;

		memset(&r, 0, sizeof(r));
		memset(&last, 0, sizeof(last));
		r.mem_path = mr ? mp_mem_path(mr, NULL, 0) : MP_MEM_PATH_HOST;
		r.size_idx = (uint32_t)s;
		r.max_err = -1.0;
		r.rms_err = -1.0;
		r.wrong = -1;
		for (int it = 0; it < total; it++) {
			struct mp_result res;
			char why[768];
			double t0, t1;

			memset(&res, 0, sizeof(res));
			fill(p, buf, count, stream_key(b->seed, p->rank, it));
			if (dbuf && dev_htod(dbuf, buf, (size_t)bytes, why, sizeof(why))) {
				peer_fail(p, "size %" PRIu64 " B, iteration %d: --memory=cuda: %s",
					  bytes, it, why);
				rc = -EIO;
				break;
			}
			if (b->check && it == total - 1 && codec_sparse(b->cfg.codec)) {
				/* The checked iteration starts with no residue, so
				 * that after the flush below the exact mean is due
				 * (kept per buffer: the device buffer's with cuda). */
				int e = mp_feedback_reset(p->ctx, dbuf ? (float *)dbuf : buf);
				if (e && e != -ENOENT) {
					peer_fail(p, "mp_feedback_reset: %s", mp_strerror(e));
					rc = e;
					break;
				}
			}
			if (b->sync && (rc = peer_sync(p, why, sizeof(why)))) {
				peer_fail(p, "size %" PRIu64 " B, iteration %d: the start barrier: %s",
					  bytes, it, why);
				break;
			}
			t0 = mp_now_s();
			rc = peer_average(p, dbuf ? (float *)dbuf : buf, count, w, mr, 0, &res, why,
					  sizeof(why));
			t1 = mp_now_s();
			if (rc) {
				peer_fail(p, "size %" PRIu64 " B, iteration %d: %s", bytes, it, why);
				break;
			}
			peer_heartbeat(p);
			last = res;
			if (it >= b->warmup) {
				ts[it - b->warmup] = t1 - t0;
				tsum += t1 - t0;
				sent += (double)res.bytes_sent;
				recvd += (double)res.bytes_received;
				vals += (double)res.values_sent;
			}
			r.codec = res.codec;
			if (res.failed_peers > r.failed_peers)
				r.failed_peers = res.failed_peers;
			r.rounds = res.rounds;
			r.peers = res.peers;
		}
		if (rc) {
			free(ts);
			break;
		}
		r.time_us = tsum / b->iters * 1e6;
		r.time_min_us = r.time_us;
		r.time_median_us = median(ts, b->iters) * 1e6;
		free(ts);
		r.time_ranks = 1;
		if (!p->up && b->time_gathered && (rc = gather_times(p, bytes, &r)))
			break;
		r.bytes_sent = sent / b->iters;
		r.bytes_received = recvd / b->iters;
		r.values_sent = vals / b->iters;
		if (b->check && codec_sparse(b->cfg.codec)) {
			/* Deliver what error feedback held back: Σ w·(x + residue)
			 * is what every round conserves. */
			char why[768];
			struct mp_result fres;
			int e = peer_average(p, dbuf ? (float *)dbuf : buf, count, w, mr, MP_AVG_FLUSH,
					     &fres, why, sizeof(why));

			if (e) {
				peer_fail(p, "size %" PRIu64 " B, the flush (MP_AVG_FLUSH): %s", bytes,
					  why);
				rc = e;
				break;
			}
			r.flushed = 1;
		}
		if (b->check && dbuf) {
			/* The result is checked where the average left it: in
			 * device memory, copied back. */
			char why[512];

			if (dev_dtoh(buf, dbuf, (size_t)bytes, why, sizeof(why))) {
				peer_fail(p, "size %" PRIu64 " B: --memory=cuda: %s", bytes, why);
				rc = -EIO;
				break;
			}
		}
		if (b->check)
			verify(p, buf, count, total - 1, NULL, &r);
		if (b->check && !p->up)
			verify_survivors(p, buf, count, total - 1, bytes, &last);
		peer_report(p, &r);
	}
	if (mr)
		mp_mem_deregister(p->ctx, mr);
	if (dbuf) {
		dev_free(dbuf);
		dev_close();
	}
	free(buf);
	if (rc == 0 && b->peer_stats)
		peer_stats(p);
	return rc ? -1 : 0;
}

/* Split "a\nb\nc" in place into @n strings. */
static int split_lines(char *text, const char **out, int n)
{
	int k = 0;
	char *s = text;

	while (s && *s && k < n) {
		char *nl = strchr(s, '\n');

		if (nl)
			*nl = '\0';
		out[k++] = s;
		s = nl ? nl + 1 : NULL;
	}
	return k == n && (!s || !*s) ? 0 : -1;
}

/* A static local peer: send our address up, set every peer's address from
 * the list that comes back. 0, or negative after peer_fail. */
static int peer_exchange(struct peer *p)
{
	const struct bench *b = p->b;
	char addr[MP_ADDR_STRLEN];
	const char **addrs = NULL;
	struct msg m = { 0 };
	int rc;

	rc = mp_local_address(p->ctx, addr, sizeof(addr));
	if (rc) {
		peer_fail(p, "mp_local_address: %s: %s", mp_strerror(rc), mp_last_error(p->ctx));
		goto out;
	}
	rc = chan_send(p->up, MSG_ADDR, p->rank, addr, (uint32_t)strlen(addr), b->silence_ms);
	if (rc)
		goto out;
	p->last_hb = mp_now_s();

	rc = chan_recv(p->down, &m, clamp_ms((int64_t)b->silence_ms * 2));
	if (rc <= 0 || m.type != MSG_PEERS || !m.data) {
		peer_fail(p, "no peer list from the launcher (%s)",
			  rc == 0 ? "timed out" : rc < 0 ? strerror(-rc) : "unexpected message");
		rc = -1;
		goto out;
	}
	addrs = xcalloc((size_t)b->npeers, sizeof(*addrs));
	if (split_lines(m.data, addrs, b->npeers) < 0) {
		peer_fail(p, "malformed peer list from the launcher");
		rc = -1;
		goto out;
	}
	rc = mp_set_peers(p->ctx, addrs, b->npeers);
	if (rc)
		peer_fail(p, "mp_set_peers: %s: %s", mp_strerror(rc), mp_last_error(p->ctx));
out:
	free(addrs);
	free(m.data);
	return rc;
}

/* A local peer (child process or thread). 0 on success. */
int peer_main(const struct bench *b, int rank, const struct chan *up,
		     const struct chan *down)
{
	struct peer p = { .b = b, .rank = rank, .npeers = b->npeers, .up = up, .down = down };
	struct mp_config cfg = b->cfg;
	int rc;

	cfg.rank = rank;
	cfg.npeers = b->npeers;
	cfg.peers = NULL;
	cfg.hostfile = NULL;
	cfg.transport = b->transport;
	cfg.run_name = b->run;
	if (b->loop)
		cfg.listen = "loop:*";
	else if (strcmp(b->transport, "tcp") == 0)
		cfg.listen = "127.0.0.1:0";
	else
		cfg.listen = NULL;
	char dlisten[64];
	if (strcmp(b->transport, "dpdk") == 0) {
		if (dseg_enter(rank, dlisten, sizeof(dlisten))) {
			peer_fail(&p, "cannot join the dpdk segment");
			return -1;
		}
		cfg.listen = dlisten;
	}

	rc = mp_init(&cfg, &p.ctx);
	if (rc) {
		peer_fail(&p, "mp_init: %s: %s", mp_strerror(rc), mp_last_error(NULL));
		return -1;
	}
	if (rank == 0) {
		char detail[256];

		/* What the transport chose, for the JSON; peers of a run agree on
		 * the transport, so rank 0's stands for them. */
		if (mp_transport_detail(p.ctx, detail, sizeof(detail)) >= 0)
			chan_send(up, MSG_DETAIL, rank, detail, (uint32_t)strlen(detail),
				  b->silence_ms);
	}
	rc = peer_exchange(&p);
	if (rc == 0)
		rc = peer_bench(&p);
	mp_finalize(p.ctx);
	if (rc == 0)
		chan_send(up, MSG_DONE, rank, NULL, 0, b->silence_ms);
	return rc ? -1 : 0;
}

/* ------------------------------------------------------------------------ */
/* A peer of a followed run (see churn.c)                                    */

/* Peer ids of a dht run, from the seed and the spawn index: distinct (mix64
 * is a bijection) and never 0, so data and logs can be keyed by id. */
uint64_t peer_id_of(uint64_t seed, int idx)
{
	uint64_t id = mix64(seed ^ mix64(0x6d6f736870697421ULL + (uint64_t)(uint32_t)idx));

	return id ? id : 1;
}

/* A peer's values at the start: iteration 0's data of its spawn index;
 * intruders' are far off, so that any contribution of theirs shows. */
void follow_fill(const struct bench *b, const struct fspec *s, float *x, size_t count)
{
	uint64_t key = stream_key(b->seed, s->idx, 0);
	float shift = s->role == ROLE_INTRUDER ? 1000.0f : 0.0f;

	for (size_t i = 0; i < count; i++)
		x[i] = gen_value(key, i) + shift;
}

/* The peer's own contribution log, read as it grows. */
struct clog_tail {
	int fd;
	size_t len;
	char line[256]; /* the start of the line being read: "kind round=R ..." */
};

/* Highest round among the complete lines appended since the last call, or
 * -1 if none (no log yet, or a library that writes none). */
static int64_t clog_tail_round(struct clog_tail *t, const char *path)
{
	char buf[4096];
	int64_t best = -1;

	if (t->fd < 0)
		t->fd = open(path, O_RDONLY | O_CLOEXEC);
	if (t->fd < 0)
		return -1;
	for (;;) {
		ssize_t n = read(t->fd, buf, sizeof(buf));

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		for (ssize_t i = 0; i < n; i++) {
			const char *r;

			if (buf[i] != '\n') {
				if (t->len < sizeof(t->line) - 1)
					t->line[t->len++] = buf[i];
				continue;
			}
			t->line[t->len] = '\0';
			r = strstr(t->line, " round=");
			if (r) {
				long long v = strtoll(r + 7, NULL, 10);

				if (v > best)
					best = v;
			}
			t->len = 0;
		}
	}
	return best;
}

/* Whether the coordinator said stop (or is gone). */
static int stop_requested(const struct peer *p)
{
	struct msg m = { 0 };
	int rc = chan_recv(p->down, &m, 0);

	free(m.data);
	return rc < 0 || (rc > 0 && m.type == MSG_STOP);
}

/* Average round after round until the run's last one; report each. */
static int follow_rounds(struct peer *p, const struct fspec *s, struct summary *sum)
{
	const struct bench *b = p->b;
	size_t count = (size_t)(b->sizes[0] / 4);
	float *buf = xmalloc(count * sizeof(float));
	/* An aux peer's own values count for nothing: weight 0 until a round
	 * gives it the group's values (then carried like anyone's). */
	float w = s->role == ROLE_INTRUDER ? 1.0f : s->mode == MP_MODE_AUX ? 0.0f :
		  peer_weight(b, s->idx);
	int R = b->rounds_eff, T = b->total_rounds, timed = 0;
	int64_t last = -1;
	struct clog_tail tail = { .fd = -1 };
	struct size_result r;
	double tsum = 0.0, sent = 0.0, recvd = 0.0, vals = 0.0;
	int rc = 0;

	memset(&r, 0, sizeof(r));
	r.max_err = -1.0;
	r.rms_err = -1.0;
	r.wrong = -1;
	r.time_us = -1.0;
	r.time_median_us = NAN; /* rounds are timed, not whole averages */
	follow_fill(b, s, buf, count);
	/* Bounded: every call moves the round on by at least one. */
	for (int calls = 0; last < T - 1 && calls < T + R; calls++) {
		struct mp_result res;
		struct round_report rr = { 0 };
		char why[768];
		double t0, t1;
		int64_t g;

		if (stop_requested(p))
			break;
		memset(&res, 0, sizeof(res));
		t0 = mp_now_s();
		rc = peer_average(p, buf, count, w, NULL, 0, &res, why, sizeof(why));
		t1 = mp_now_s();
		/* A round whose whole group failed is not the end of the run;
		 * an intruder's refusals are what it is here for. */
		if (rc && rc != -EHOSTUNREACH && s->role != ROLE_INTRUDER) {
			peer_fail(p, "after round %lld: %s", (long long)last, why);
			break;
		}
		sum->calls++;
		g = clog_tail_round(&tail, s->log);
		if (g <= last)
			g = last + 1;
		rr.round = g;
		rr.rc = rc;
		rr.grouped = rc == 0 && res.rounds_alone == 0;
		rr.group_size = res.group_size;
		rr.failed = res.failed_peers;
		if (rc)
			sum->errors++;
		rc = 0;
		if (rr.grouped) {
			sum->grouped++;
			/* One round per call: carry the weight the round left us
			 * with into the next, as one call of R rounds would. */
			if (isfinite(res.weight) && res.weight >= 0)
				w = res.weight;
			if (g >= T - R)
				r.rounds++;
		}
		if (g >= (int64_t)b->warmup * R && g < T) {
			timed++;
			tsum += t1 - t0;
			sent += (double)res.bytes_sent;
			recvd += (double)res.bytes_received;
			vals += (double)res.values_sent;
		}
		r.codec = res.codec;
		r.peers = res.peers;
		if (res.failed_peers > r.failed_peers)
			r.failed_peers = res.failed_peers;
		last = g;
		if (chan_send(p->up, MSG_ROUND, p->rank, &rr, sizeof(rr), b->silence_ms))
			break;
		if (b->compute_ms > 0 && last < T - 1) {
			struct timespec ts = { b->compute_ms / 1000, (b->compute_ms % 1000) * 1000000L };

			while (nanosleep(&ts, &ts) && errno == EINTR)
				;
		}
	}
	if (tail.fd >= 0)
		close(tail.fd);
	if (rc == 0 && s->role != ROLE_INTRUDER) {
		/* Per average of R rounds, from the rounds timed. */
		if (timed) {
			r.time_us = tsum / timed * R * 1e6;
			r.time_min_us = r.time_us;
			r.bytes_sent = sent / timed * R;
			r.bytes_received = recvd / timed * R;
			r.values_sent = vals / timed * R;
		}
		if (b->check)
			rc = chan_send(p->up, MSG_VECTOR, p->rank, buf,
				       (uint32_t)(count * sizeof(float)), b->silence_ms);
		if (rc == 0)
			rc = chan_send(p->up, MSG_RESULT, p->rank, &r, sizeof(r), b->silence_ms);
	}
	free(buf);
	return rc ? -1 : 0;
}

/*
 * A standby, past mp_init (its DHT node up, welcomed, its record out as a
 * joiner's): wait for the coordinator's MSG_GO (1) or MSG_STOP (0), with a
 * heartbeat a second so that the wait does not read as a hang. Bounded by
 * the coordinator, whose end closes the pipe (-1).
 */
static int standby_wait(struct peer *p)
{
	double hb = mp_now_s();

	for (;;) {
		struct msg m = { 0 };
		int rc = chan_recv(p->down, &m, 200);

		free(m.data);
		if (rc < 0)
			return -1;
		if (rc > 0 && m.type == MSG_GO)
			return 1;
		if (rc > 0 && m.type == MSG_STOP)
			return 0;
		if (mp_now_s() - hb >= 1.0) {
			hb = mp_now_s();
			if (chan_send(p->up, MSG_HEARTBEAT, p->rank, NULL, 0, p->b->silence_ms))
				return -1;
		}
	}
}

/* A peer of a followed run (a child process). 0 on success. */
int follow_peer(const struct bench *b, const struct fspec *s, const struct chan *up,
		       const struct chan *down)
{
	struct peer p = { .b = b, .rank = s->idx, .npeers = b->npeers, .up = up, .down = down };
	struct mp_config cfg = b->cfg;
	struct summary sum = { 0 };
	struct hello h = { 0 };
	char key[160];
	int rc;

	cfg.rounds = 1;
	cfg.transport = b->transport;
	cfg.listen = "127.0.0.1:0";
	cfg.run_name = b->run;
	cfg.peers = NULL;
	cfg.hostfile = NULL;
	cfg.grid = b->cfg.grid;
	/* Faults and logs are per peer: MP_FAULT or MP_CONTRIB_LOG from the
	 * environment would hit every peer alike. */
	cfg.fault = s->fault[0] ? s->fault : NULL;
	cfg.contrib_log = s->log;
	cfg.mode = s->mode;
	if (s->role == ROLE_INTRUDER) {
		snprintf(key, sizeof(key), "not the key of %s", b->run);
		cfg.run_key = key;
		cfg.run_key_file = NULL;
	}
	if (b->dht) {
		cfg.rendezvous = "dht";
		cfg.bootstrap = s->bootstrap[0] ? s->bootstrap : NULL;
		cfg.dht_port = s->dht_port;
		cfg.npeers = s->npeers;
		cfg.peer_id = s->id;
		cfg.rank = -1;
	} else {
		cfg.rendezvous = "static";
		cfg.rank = s->idx;
		cfg.npeers = b->npeers;
	}
	rc = mp_init(&cfg, &p.ctx);
	if (rc && s->role == ROLE_INTRUDER) {
		sum.init_rc = rc;
		chan_send(up, MSG_SUMMARY, p.rank, &sum, sizeof(sum), b->silence_ms);
		chan_send(up, MSG_DONE, p.rank, NULL, 0, b->silence_ms);
		return 0;
	}
	if (rc) {
		peer_fail(&p, "mp_init: %s: %s", mp_strerror(rc), mp_last_error(NULL));
		return -1;
	}
	p.last_hb = mp_now_s();
	if (!b->dht)
		rc = peer_exchange(&p);
	if (rc == 0) {
		h.id = mp_peer_id(p.ctx);
		h.detail_known = mp_transport_detail(p.ctx, h.detail, sizeof(h.detail)) >= 0;
		if (b->dht && mp_dht_address(p.ctx, h.dht, sizeof(h.dht)))
			h.dht[0] = '\0';
		rc = chan_send(up, MSG_HELLO, p.rank, &h, sizeof(h), b->silence_ms);
	}
	if (rc == 0 && s->standby) {
		int go = standby_wait(&p);

		rc = go < 0 ? -1 : 0;
		if (go == 1)
			rc = follow_rounds(&p, s, &sum);
	} else if (rc == 0) {
		rc = follow_rounds(&p, s, &sum);
	}
	if (rc == 0) {
		struct mp_stats st;

		if (mp_stats(p.ctx, &st, sizeof(st)) == 0) {
			sum.peers_known = st.peers_known;
			sum.peers_held = st.peers_held;
		}
	}
	mp_finalize(p.ctx);
	if (rc == 0) {
		chan_send(up, MSG_SUMMARY, p.rank, &sum, sizeof(sum), b->silence_ms);
		chan_send(up, MSG_DONE, p.rank, NULL, 0, b->silence_ms);
	}
	return rc ? -1 : 0;
}
