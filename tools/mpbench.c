/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * mpbench - run and benchmark Moshpit All-Reduce (and the ring and butterfly
 * baselines) through the public libmoshpit API, with nccl-tests-like output.
 *
 * Three ways to run:
 *
 *  - local, one process per peer (default, --transport=tcp): the parent forks
 *    N children; each listens on 127.0.0.1:0 and sends its address up a pipe,
 *    the parent sends the full list back down, and the children report one
 *    result per size. The parent prints the table.
 *  - local, one thread per peer (--transport=loop): the same, with the peers
 *    as threads of this process and the pipes replaced by in-memory queues.
 *  - multi-host (--hostfile, MP_HOSTFILE or MP_PEERS, with a rank from
 *    --rank, MP_RANK, mpirun, PMI or srun; or --rendezvous=dht with a rank
 *    and --bootstrap): this process is one peer; the library finds the
 *    others; rank 0 prints its own measurements.
 *
 * With the DHT rendezvous or any churn (--rendezvous=dht, --churn, --fault,
 * --late, --intruders) local peers average one round per call and are
 * followed round by round: they may die, join or be refused, and the
 * survivors' values are checked against a replay of every peer's
 * contribution log (replay.c).
 *
 * Every wait is bounded: pipe and queue reads poll with a deadline, every
 * average waits at most a safety limit on top of the library's own
 * deadlines, and a peer that stays silent too long is reported and killed.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#include <moshpit/moshpit.h>
#include "dpdk_seg.h"
#include "replay.h"
#include "cli.h"

#define PROG "mpbench"

/* Exit statuses. */
#define EXIT_OK 0
#define EXIT_FAIL 1
#define EXIT_USAGE CLI_EXIT_USAGE

/* Messages between a peer and the coordinator (parent process or main thread). */
enum {
	MSG_ADDR = 1,      /* peer -> coord: listening address (text) */
	MSG_PEERS = 2,     /* coord -> peer: every address, '\n'-separated, rank order */
	MSG_RESULT = 3,    /* peer -> coord: struct size_result */
	MSG_HEARTBEAT = 4, /* peer -> coord: still busy */
	MSG_ERROR = 5,     /* peer -> coord: what went wrong (text); the peer stops */
	MSG_DONE = 6,      /* peer -> coord: finished and finalized */
	MSG_EOF = 7,       /* made up by the coordinator: the peer's pipe closed */
	/* Followed runs (dht rendezvous, churn) only: */
	MSG_HELLO = 8,     /* peer -> coord: struct hello, after mp_init */
	MSG_ROUND = 9,     /* peer -> coord: struct round_report, after each round */
	MSG_VECTOR = 10,   /* peer -> coord: its final values (--check) */
	MSG_SUMMARY = 11,  /* peer -> coord: struct summary, before MSG_DONE */
	MSG_STOP = 12,     /* coord -> peer: the run is over, stop averaging */
};

#define MSG_MAX_LEN (1u << 24)
#define HEARTBEAT_S 1.0
/* Values generated per peer to check one size; above it every k-th element
 * is checked instead of all, so the check stays bounded. */
#ifndef CHECK_BUDGET
#define CHECK_BUDGET (1ULL << 28)
#endif

struct msg_hdr {
	uint32_t type;
	int32_t rank;
	uint32_t len;
};

struct msg {
	uint32_t type;
	int rank;
	uint32_t len;
	char *data; /* len bytes plus a NUL; malloc'd, NULL when len is 0 */
};

/* One peer's measurement of one size, and (combined) one table row. */
struct size_result {
	uint32_t size_idx;
	int32_t rounds;       /* rounds completed (min over peers) */
	int32_t peers;        /* contributions that reached the result (min over peers) */
	int32_t failed_peers; /* peers dropped (max over iterations and peers) */
	int64_t wrong;        /* elements beyond the tolerance; -1 = not counted */
	int64_t checked;      /* elements compared with the exact mean (per peer) */
	double time_us;       /* mean time per timed iteration (max over peers) */
	double max_err;       /* max |out - exact|; < 0 = not checked */
	double rms_err;       /* rms of out - exact; < 0 = not checked */
	double bytes_sent;    /* per operation (summed over peers) */
	double bytes_received;
	double values_sent;   /* fp32 values carried per operation (summed over peers) */
	int32_t codec;        /* codec the library used ("auto" resolved) */
	int32_t flushed;      /* checked after mp_average_flush (sparse codecs) */
	int32_t lost;         /* followed runs: peers that died */
	int32_t joined;       /* followed runs: peers that joined later and took part */
	int32_t client_reduces; /* --clients: parts client peers reduced (0 is right) */
};

struct gridinfo {
	int ndims;
	int dims[MP_MAX_GRID_DIMS];
	uint64_t cells;
	int given; /* from --grid / MP_GRID, not guessed */
};

/* Settings, fixed before any peer starts (children and threads only read it). */
struct bench {
	struct mp_config cfg; /* after MP_* environment and options */
	uint64_t *sizes;
	int nsizes;
	uint64_t minbytes, maxbytes, stepfactor;
	int iters, warmup, check, weighted;
	uint64_t seed;
	double tol;
	int tol_set;
	const char *json;
	const char *transport;
	const char *run;
	char run_buf[64];
	int multi;  /* multi-host mode */
	int loop;   /* local mode with threads */
	int npeers; /* local mode: peers to start; multi-host: known after mp_init */
	/* Derived by bench_derive once npeers is known. */
	struct gridinfo grid;
	int rounds_eff; /* Moshpit rounds per average */
	int exact;      /* the result must equal the exact weighted mean */
	char inexact_why[128];
	double bus_factor;
	int op_cap_ms;  /* safety limit on one average */
	int silence_ms; /* longest silence the coordinator tolerates from a peer */
	/* Control plane: rendezvous, churn, faults, joiners, intruders. */
	int dht;            /* --rendezvous=dht */
	int rdv_static;     /* --rendezvous=static given explicitly */
	double churn;       /* probability that a peer dies in a round */
	int join;           /* replace peers that died (-1: default) */
	int late;           /* peers that start after round 1 */
	int intruders;      /* peers with another run key */
	int clients, aux;   /* DeDLOC modes: the last initial peers (aux last) */
	struct fault_opt {
		int index;
		const char *spec;
	} *faults;
	int nfaults;
	double max_rms;     /* fail when rms_err exceeds it (< 0: no limit) */
	const char *logdir; /* --logs: keep the contribution logs here */
	int follow;         /* local peers followed round by round */
	int size_given;     /* -b or -e was given */
	char grid_buf[96];  /* followed runs: the grid every peer is given */
	int total_rounds;   /* followed runs: rounds of the run, warmup included */
	int churn_end;      /* --churn: deaths fall in rounds [0, churn_end) */
	int compute_ms;     /* followed runs: a peer's pause between its rounds */
	/* --transport=dpdk (dpdk_seg.c builds the local segment) */
	const char *dpdk_args; /* --dpdk-args: EAL arguments instead of a made-up segment */
	double inject_loss;    /* --inject-loss: fraction of received frames dropped */
};

static const char *const algo_names[] = { "moshpit", "ring", "butterfly" };
static const char *const codec_names[] = { "none", "fp16", "bf16", "uniform8", "blockwise8",
					   "topk", "adacomp" };
#define NCODEC_NAMES ((int)(sizeof(codec_names) / sizeof(codec_names[0])))

static const char *algo_name(int a)
{
	return a >= 0 && a < 3 ? algo_names[a] : "?";
}

static const char *codec_name(int c)
{
	if (c == MP_CODEC_AUTO)
		return "auto";
	return c >= 0 && c < NCODEC_NAMES ? codec_names[c] : "?";
}

/* Sparse codecs hold values back (error feedback): checked after a flush. */
static int codec_sparse(int c)
{
	return c == MP_CODEC_TOPK || c == MP_CODEC_ADACOMP;
}

/*
 * Largest error of one encoding of data in [-1, 1) (doc/codecs.md):
 * fp16 half an ulp at 1 (2^-11), bf16 2^-8, blockwise8 half a step of
 * absmax/127, uniform8 one bucket (mean +- 6 sd of U(-1,1) over 256 buckets:
 * 12 * 0.577 / 256 = 0.027; the bucket mean can sit anywhere in the bucket).
 * Sparse codecs are checked after mp_average_flush, where only fp32
 * rounding remains.
 */
static double codec_step_err(int c)
{
	switch (c) {
	case MP_CODEC_FP16: return 1.0 / 2048;
	case MP_CODEC_BF16: return 1.0 / 256;
	case MP_CODEC_BLOCKWISE8: return 1.0 / 254;
	case MP_CODEC_UNIFORM8: return 0.028;
	default: return 0.0;
	}
}

/* Followed runs where the exact mean is due as well: no churn, no faults,
 * no late peers, on a full grid (bench_derive's exact). */
static int follow_exact(const struct bench *b)
{
	return b->follow && b->exact && b->churn <= 0 && b->nfaults == 0 && b->late == 0;
}

/*
 * Tolerance of the replay check of followed runs: an element is wrong when it
 * lies further than max(atol, rtol * |replay|) from the replay. The library
 * sums in fp32 and the replay in double: rtol is 1e-5 per round of the run,
 * atol 1e-6 for data in [-1, 1), plus two codec steps per round for a lossy
 * codec (each value is encoded on its way to the reducer and back).
 */
static double replay_rtol(const struct bench *b)
{
	return 1e-5 * (b->total_rounds > 0 ? b->total_rounds : 1);
}

static double replay_atol(const struct bench *b)
{
	int c = b->cfg.codec == MP_CODEC_AUTO ? MP_CODEC_BLOCKWISE8 : b->cfg.codec;

	return 1e-6 + 2.0 * codec_step_err(c) * b->total_rounds;
}

/* ------------------------------------------------------------------------ */
/* Small helpers                                                             */

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void die_oom(void)
{
	fprintf(stderr, PROG ": out of memory\n");
	fflush(NULL);
	_exit(EXIT_FAIL);
}

static void *xmalloc(size_t n)
{
	void *p = malloc(n ? n : 1);

	if (!p)
		die_oom();
	return p;
}

static void *xcalloc(size_t n, size_t sz)
{
	void *p = calloc(n ? n : 1, sz ? sz : 1);

	if (!p)
		die_oom();
	return p;
}

static int clamp_ms(int64_t ms)
{
	if (ms > INT_MAX)
		return INT_MAX;
	if (ms < 0)
		return 0;
	return (int)ms;
}

/* ------------------------------------------------------------------------ */
/* Test data: a cheap counter-based generator                                */

static inline uint64_t mix64(uint64_t z)
{
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

/* Key of the input of peer @rank in iteration @it. */
static uint64_t stream_key(uint64_t seed, int rank, int it)
{
	uint64_t k = ((uint64_t)(uint32_t)rank << 32) | (uint32_t)it;

	return mix64(seed ^ mix64(k + 0x9e3779b97f4a7c15ULL));
}

/* Element @i of a stream: a float in [-1, 1), exact in fp32 (24-bit grid). */
static inline float gen_value(uint64_t key, uint64_t i)
{
	uint64_t h = mix64(key + (i + 1) * 0x9e3779b97f4a7c15ULL);

	return (float)(int32_t)(h >> 40) * (1.0f / 8388608.0f) - 1.0f;
}

static float peer_weight(const struct bench *b, int rank)
{
	return b->weighted ? (float)(rank + 1) : 1.0f;
}


/* ------------------------------------------------------------------------ */
/* Pipes with deadlines                                                      */

static int set_nonblock(int fd)
{
	int fl = fcntl(fd, F_GETFL);

	if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
		return -errno;
	return 0;
}

/* Write all of @buf to non-blocking @fd within @timeout_ms. */
static int fd_write_all(int fd, const void *buf, size_t len, int timeout_ms)
{
	const char *p = buf;
	int64_t deadline = now_ms() + timeout_ms;

	while (len > 0) {
		ssize_t n = write(fd, p, len);

		if (n > 0) {
			p += n;
			len -= (size_t)n;
			continue;
		}
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
			return -errno;

		int64_t left = deadline - now_ms();
		struct pollfd pfd = { .fd = fd, .events = POLLOUT };

		if (left <= 0)
			return -ETIMEDOUT;
		int rc = poll(&pfd, 1, clamp_ms(left));

		if (rc < 0 && errno != EINTR)
			return -errno;
		if (rc > 0 && !(pfd.revents & POLLOUT) && (pfd.revents & (POLLERR | POLLHUP)))
			return -EPIPE;
	}
	return 0;
}

/* Read exactly @len bytes within @timeout_ms: 1, 0 on EOF before the first byte,
 * -EPIPE on EOF midway, -ETIMEDOUT or another negative errno. */
static int fd_read_all(int fd, void *buf, size_t len, int timeout_ms)
{
	char *p = buf;
	size_t got = 0;
	int64_t deadline = now_ms() + timeout_ms;

	while (got < len) {
		int64_t left = deadline - now_ms();
		struct pollfd pfd = { .fd = fd, .events = POLLIN };
		int rc = poll(&pfd, 1, clamp_ms(left));

		if (rc < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (rc == 0)
			return -ETIMEDOUT;

		ssize_t n = read(fd, p + got, len - got);

		if (n < 0) {
			if (errno == EINTR || errno == EAGAIN)
				continue;
			return -errno;
		}
		if (n == 0)
			return got ? -EPIPE : 0;
		got += (size_t)n;
	}
	return 1;
}

static int fd_send_msg(int fd, uint32_t type, int rank, const void *data, uint32_t len,
		       int timeout_ms)
{
	struct msg_hdr h = { .type = type, .rank = rank, .len = len };
	size_t total = sizeof(h) + len;
	char stackbuf[1024];
	char *buf = total <= sizeof(stackbuf) ? stackbuf : xmalloc(total);
	int rc;

	/* One write: messages up to PIPE_BUF reach the pipe whole. */
	memcpy(buf, &h, sizeof(h));
	if (len)
		memcpy(buf + sizeof(h), data, len);
	rc = fd_write_all(fd, buf, total, timeout_ms);
	if (buf != stackbuf)
		free(buf);
	return rc;
}

/* 1 with a message, 0 on a clean EOF, negative errno otherwise. */
static int fd_recv_msg(int fd, struct msg *m, int timeout_ms)
{
	struct msg_hdr h;
	int rc = fd_read_all(fd, &h, sizeof(h), timeout_ms);

	if (rc <= 0)
		return rc;
	if (h.len > MSG_MAX_LEN)
		return -EPROTO;
	m->type = h.type;
	m->rank = h.rank;
	m->len = h.len;
	m->data = NULL;
	if (h.len) {
		m->data = xmalloc((size_t)h.len + 1);
		rc = fd_read_all(fd, m->data, h.len, timeout_ms);
		if (rc <= 0) {
			free(m->data);
			m->data = NULL;
			return rc == 0 ? -EPIPE : rc;
		}
		m->data[h.len] = '\0';
	}
	return 1;
}

/* A fixed-size message body: copied into @out when @m is exactly @len bytes long (1), else 0. */
static int msg_copy(const struct msg *m, void *out, size_t len)
{
	if (m->len != len)
		return 0;
	memcpy(out, m->data, len);
	return 1;
}

/* ------------------------------------------------------------------------ */
/* In-memory message queues (loop transport: peers are threads)              */

struct qmsg {
	struct qmsg *next;
	struct msg m;
};

struct mq {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct qmsg *head, *tail;
};

static int mq_init(struct mq *q)
{
	pthread_condattr_t ca;

	memset(q, 0, sizeof(*q));
	if (pthread_mutex_init(&q->mu, NULL))
		return -ENOMEM;
	if (pthread_condattr_init(&ca))
		return -ENOMEM;
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	if (pthread_cond_init(&q->cv, &ca)) {
		pthread_condattr_destroy(&ca);
		return -ENOMEM;
	}
	pthread_condattr_destroy(&ca);
	return 0;
}

static int mq_put(struct mq *q, uint32_t type, int rank, const void *data, uint32_t len)
{
	struct qmsg *e = xcalloc(1, sizeof(*e));

	e->m.type = type;
	e->m.rank = rank;
	e->m.len = len;
	if (len) {
		e->m.data = xmalloc((size_t)len + 1);
		memcpy(e->m.data, data, len);
		e->m.data[len] = '\0';
	}
	pthread_mutex_lock(&q->mu);
	if (q->tail)
		q->tail->next = e;
	else
		q->head = e;
	q->tail = e;
	pthread_cond_signal(&q->cv);
	pthread_mutex_unlock(&q->mu);
	return 0;
}

/* 1 with a message, 0 on timeout. */
static int mq_get(struct mq *q, struct msg *m, int timeout_ms)
{
	struct timespec dl;
	struct qmsg *e;

	clock_gettime(CLOCK_MONOTONIC, &dl);
	dl.tv_sec += timeout_ms / 1000;
	dl.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
	if (dl.tv_nsec >= 1000000000L) {
		dl.tv_sec++;
		dl.tv_nsec -= 1000000000L;
	}
	pthread_mutex_lock(&q->mu);
	while (!q->head) {
		int rc = pthread_cond_timedwait(&q->cv, &q->mu, &dl);

		if (rc == ETIMEDOUT && !q->head) {
			pthread_mutex_unlock(&q->mu);
			return 0;
		}
	}
	e = q->head;
	q->head = e->next;
	if (!q->head)
		q->tail = NULL;
	pthread_mutex_unlock(&q->mu);
	*m = e->m;
	free(e);
	return 1;
}

/* A one-way channel: a pipe end (fd >= 0) or a queue. */
struct chan {
	int fd;
	struct mq *q;
};

static int chan_send(const struct chan *c, uint32_t type, int rank, const void *data,
		     uint32_t len, int timeout_ms)
{
	if (c->q)
		return mq_put(c->q, type, rank, data, len);
	return fd_send_msg(c->fd, type, rank, data, len, timeout_ms);
}

/* 1 with a message, 0 on timeout, -EPIPE when the other side is gone. */
static int chan_recv(const struct chan *c, struct msg *m, int timeout_ms)
{
	int rc;

	if (c->q)
		return mq_get(c->q, m, timeout_ms);
	rc = fd_recv_msg(c->fd, m, timeout_ms);
	if (rc == 0)
		return -EPIPE;
	if (rc == -ETIMEDOUT)
		return 0;
	return rc;
}

/* ------------------------------------------------------------------------ */
/* Grid, exactness and bus bandwidth                                         */

/* The grid the library will use: the one given, or its automatic choice. */
static int grid_from_library(const char *spec, int n, struct gridinfo *g)
{
	int nd;

	memset(g, 0, sizeof(*g));
	nd = mp_grid_shape(spec, n, g->dims, MP_MAX_GRID_DIMS);
	if (nd < 0)
		return -1;
	g->ndims = nd;
	g->given = spec != NULL;
	g->cells = 1;
	for (int i = 0; i < nd; i++)
		g->cells *= (uint64_t)g->dims[i];
	return 0;
}

static void grid_format(const struct gridinfo *g, char *buf, size_t len)
{
	size_t off = 0;

	buf[0] = '\0';
	for (int i = 0; i < g->ndims && off < len; i++)
		off += (size_t)snprintf(buf + off, len - off, "%s%d", i ? "x" : "", g->dims[i]);
}

/*
 * Everything that depends on the peer count: the grid, whether the result
 * must be the exact weighted mean, the bus bandwidth factor, the tolerance
 * and the safety limits. All knowledge of the library's grid choice is here.
 *
 * Exact: ring and butterfly always; Moshpit when every grid cell holds a
 * peer (no partial grid) and it runs at least one round per dimension. The
 * grid comes from the library (mp_grid_shape), so tool and library agree.
 */
static void bench_derive(struct bench *b, int npeers)
{
	const struct mp_config *c = &b->cfg;
	int64_t cto = c->connect_timeout_ms > 0 ? c->connect_timeout_ms : 10000;
	int64_t rto = c->round_timeout_ms > 0 ? c->round_timeout_ms : 10000;
	int64_t cap;

	b->npeers = npeers;
	if (grid_from_library(c->grid, npeers, &b->grid) < 0)
		usage_error("grid %s has fewer cells than the %d peers", c->grid, npeers);
	b->rounds_eff = c->rounds > 0 ? c->rounds : b->grid.ndims;
	if (c->algo == MP_ALGO_RING && codec_sparse(c->codec))
		usage_error("--codec=%s needs --algo=moshpit or butterfly (the ring forwards "
			    "partial sums, with no place for error feedback)", codec_name(c->codec));

	b->exact = 1;
	b->inexact_why[0] = '\0';
	if (c->algo != MP_ALGO_MOSHPIT) {
		/* ring and butterfly reduce over every peer */
	} else if (b->grid.cells != (uint64_t)npeers) {
		b->exact = 0;
		snprintf(b->inexact_why, sizeof(b->inexact_why),
			 "partial grid, %d peers on %" PRIu64 " cells", npeers, b->grid.cells);
	} else if (b->rounds_eff < b->grid.ndims) {
		b->exact = 0;
		snprintf(b->inexact_why, sizeof(b->inexact_why),
			 "%d round(s) on a %d-dimensional grid", b->rounds_eff, b->grid.ndims);
	}

	b->bus_factor = 0.0;
	if (c->algo == MP_ALGO_MOSHPIT) {
		for (int t = 0; t < b->rounds_eff; t++) {
			int k = b->grid.dims[t % b->grid.ndims];

			b->bus_factor += 2.0 * (k - 1) / k;
		}
	} else if (npeers > 0) {
		b->bus_factor = 2.0 * (npeers - 1) / npeers;
	}

	if (!b->tol_set) {
		/* Each value is encoded twice per group all-reduce (to the reducer
		 * and back), once per ring hop; errors add up at worst. "auto"
		 * may pick blockwise8, the coarsest of its codecs. */
		int cc = c->codec == MP_CODEC_AUTO ? MP_CODEC_BLOCKWISE8 : c->codec;
		double encodes = c->algo == MP_ALGO_RING ? npeers + 1.0 :
				 c->algo == MP_ALGO_BUTTERFLY ? 2.0 : 2.0 * b->rounds_eff;
		double e = codec_step_err(cc) * encodes;

		b->tol = e > 0 ? e : codec_sparse(cc) ? 1e-4 : 1e-5;
	}

	/* Safety net only: the library's deadlines should fire long before. */
	cap = 30000 + cto + rto * (int64_t)(b->rounds_eff + 4) + (int64_t)(b->maxbytes / 1000);
	if (b->dht)
		cap += (int64_t)(b->rounds_eff + 1) *
		       ((c->matchmaking_ms > 0 ? c->matchmaking_ms : 5000) +
			(c->request_timeout_ms > 0 ? c->request_timeout_ms : 3000) +
			(c->allreduce_timeout_ms > 0 ? c->allreduce_timeout_ms : 60000));
	b->op_cap_ms = clamp_ms(cap);
	b->silence_ms = clamp_ms(cap + 30000);
}

/* ------------------------------------------------------------------------ */
/* Output: table, progress, JSON                                             */

struct agg {
	const struct bench *b;
	int nrep;   /* reports per size */
	int print;  /* this process prints the table */
	struct size_result *rows;
	int *count;
	double *algbw, *busbw;
	int next;   /* next row to print */
	double busbw_sum;
	int nrows;
	int64_t wrong_total;
	int counted; /* rows whose wrong values were counted */
	double rms_worst; /* largest rms_err of the rows; < 0 when one was not measured */
	/* Followed runs: what the footer and JSON add. */
	int intruders_refused;
	int64_t replay_problems;
};

static void agg_init(struct agg *a, const struct bench *b, int nrep, int print)
{
	memset(a, 0, sizeof(*a));
	a->b = b;
	a->nrep = nrep;
	a->print = print;
	a->rows = xcalloc((size_t)b->nsizes, sizeof(*a->rows));
	a->count = xcalloc((size_t)b->nsizes, sizeof(*a->count));
	a->algbw = xcalloc((size_t)b->nsizes, sizeof(double));
	a->busbw = xcalloc((size_t)b->nsizes, sizeof(double));
	a->rms_worst = 0.0;
}

static void agg_free(struct agg *a)
{
	free(a->rows);
	free(a->count);
	free(a->algbw);
	free(a->busbw);
}

static void progress(const struct agg *a)
{
	if (!a->print || a->next >= a->b->nsizes)
		return;
	fprintf(stderr, PROG ": size %" PRIu64 " (%d/%d) ...\n", a->b->sizes[a->next],
		a->next + 1, a->b->nsizes);
}

static void print_header(const struct bench *b, const char *mode)
{
	const struct mp_config *c = &b->cfg;
	char g[96], gdesc[128];

	grid_format(&b->grid, g, sizeof(g));
	if (c->algo != MP_ALGO_MOSHPIT)
		snprintf(gdesc, sizeof(gdesc), "-  rounds -");
	else if (b->grid.given)
		snprintf(gdesc, sizeof(gdesc), "%s  rounds %d", g, b->rounds_eff);
	else
		snprintf(gdesc, sizeof(gdesc), "auto (%s)  rounds %d", g, b->rounds_eff);
	printf("# " PROG " %d.%d.%d: %s\n", MP_VERSION_MAJOR, MP_VERSION_MINOR,
	       MP_VERSION_PATCH, mode);
	printf("# transport %s  peers %d  algo %s  grid %s  codec %s\n", b->transport,
	       b->npeers, algo_name(c->algo), gdesc, codec_name(c->codec));
	printf("# minBytes %" PRIu64 "  maxBytes %" PRIu64 "  step %" PRIu64
	       " (factor)  iters %d  warmup %d  check %d  weighted %d  seed %" PRIu64 "\n",
	       b->minbytes, b->maxbytes, b->stepfactor, b->iters, b->warmup, b->check,
	       b->weighted, b->seed);
	printf("# chunk %zu  streams %d  timeouts %d/%d ms (connect/round)  run %s\n",
	       c->chunk_bytes, c->streams, c->connect_timeout_ms, c->round_timeout_ms,
	       b->run ? b->run : "(default)");
	if (strcmp(b->transport, "dpdk") == 0)
		printf("# dpdk segment: %s  injected loss %g of received frames\n",
		       b->multi ? "this host's (MP_DPDK_*)" : dseg_describe(), b->inject_loss);
	if (b->follow) {
		printf("# rendezvous %s  one round per call, %d rounds in all, %d ms between  late %d  "
		       "intruders %d  faults %d  clients %d  aux %d\n", b->dht ? "dht" : "static",
		       b->total_rounds, b->compute_ms, b->late, b->intruders, b->nfaults, b->clients,
		       b->aux);
		if (b->churn > 0)
			printf("# churn %g per peer and round, deaths in rounds 0..%d, then %d "
			       "rounds to converge  join %d\n", b->churn, b->churn_end - 1,
			       b->total_rounds - b->churn_end, b->join);
	}
	if (!b->check)
		printf("# check off: max_err and #wrong are not computed\n");
	else if (b->exact && codec_sparse(c->codec))
		printf("# check: exact weighted mean after mp_average_flush (error feedback), "
		       "tolerance %g\n", b->tol);
	else if (follow_exact(b))
		printf("# check: replay of the contribution logs, tolerance max(%g, %g |x|); "
		       "and the exact weighted mean, tolerance %g\n", replay_atol(b),
		       replay_rtol(b), b->tol);
	else if (b->follow)
		printf("# check: replay of the contribution logs, tolerance max(%g, %g |x|)\n",
		       replay_atol(b), replay_rtol(b));
	else if (b->exact)
		printf("# check: exact weighted mean, tolerance %g\n", b->tol);
	else
		printf("# check: approximate by design (%s): errors shown, #wrong n/a\n",
		       b->inexact_why);
	printf("#\n");
	printf("# %10s %12s %6s %10s %10s %6s %6s %10s %8s %8s %12s %6s %9s %7s %5s %6s "
	       "%9s\n", "size", "count", "type", "codec", "algo", "peers", "rounds", "time",
	       "algbw", "busbw", "wire_bytes", "ratio", "max_err", "#wrong", "lost", "joined",
	       "rms_err");
	printf("# %10s %12s %6s %10s %10s %6s %6s %10s %8s %8s %12s %6s %9s %7s %5s %6s "
	       "%9s\n", "(B)", "(elements)", "", "", "", "", "", "(us)", "(GB/s)", "(GB/s)",
	       "(B/peer)", "", "", "", "", "", "");
	fflush(stdout);
}

/* Bytes one peer put on the wire per operation (mean over the peers). */
static double row_wire_bytes(const struct agg *a, const struct size_result *r)
{
	return a->nrep > 0 ? r->bytes_sent / a->nrep : 0.0;
}

/* fp32 bytes the frames carried over the bytes sent, headers included. */
static double row_ratio(const struct size_result *r)
{
	return r->bytes_sent > 0 ? 4.0 * r->values_sent / r->bytes_sent : 0.0;
}

static void print_row(struct agg *a, int s)
{
	const struct bench *b = a->b;
	const struct size_result *r = &a->rows[s];
	uint64_t bytes = b->sizes[s];
	double algbw = r->time_us > 0 ? (double)bytes / r->time_us / 1e3 : 0.0;
	double busbw = algbw * b->bus_factor;
	char err[32], wrong[32], rms[32];

	a->algbw[s] = algbw;
	a->busbw[s] = busbw;
	a->busbw_sum += busbw;
	a->nrows++;
	if (r->wrong >= 0) {
		a->wrong_total += r->wrong;
		a->counted++;
	}
	if (r->rms_err < 0 || a->rms_worst < 0)
		a->rms_worst = -1.0;
	else if (r->rms_err > a->rms_worst)
		a->rms_worst = r->rms_err;
	if (!a->print)
		return;
	if (r->max_err >= 0)
		snprintf(err, sizeof(err), "%9.2e", r->max_err);
	else
		snprintf(err, sizeof(err), "%9s", "n/a");
	if (r->wrong >= 0)
		snprintf(wrong, sizeof(wrong), "%7" PRId64, r->wrong);
	else
		snprintf(wrong, sizeof(wrong), "%7s", "n/a");
	if (r->rms_err >= 0)
		snprintf(rms, sizeof(rms), "%9.2e", r->rms_err);
	else
		snprintf(rms, sizeof(rms), "%9s", "n/a");
	printf("  %10" PRIu64 " %12" PRIu64 " %6s %10s %10s %6d %6d %10.1f %8.3f %8.3f %12.0f "
	       "%6.2f %s %s %5d %6d %s\n",
	       bytes, bytes / 4, "float", codec_name(r->codec), algo_name(b->cfg.algo),
	       b->npeers, r->rounds, r->time_us, algbw, busbw, row_wire_bytes(a, r),
	       row_ratio(r), err, wrong, r->lost, r->joined, rms);
	fflush(stdout);
	if (r->failed_peers > 0)
		fprintf(stderr, PROG ": warning: size %" PRIu64 ": %d peer(s) dropped during the "
			"averages\n", bytes, r->failed_peers);
}

/* Fold one peer's report of one size in; print rows as they complete. */
static void agg_add(struct agg *a, const struct size_result *in)
{
	uint32_t s = in->size_idx;
	struct size_result *r;

	if (s >= (uint32_t)a->b->nsizes)
		return;
	r = &a->rows[s];
	if (a->count[s]++ == 0) {
		*r = *in;
	} else {
		if (in->time_us > r->time_us)
			r->time_us = in->time_us;
		if (in->max_err > r->max_err)
			r->max_err = in->max_err;
		if (in->rms_err > r->rms_err)
			r->rms_err = in->rms_err;
		if (in->wrong < 0 || r->wrong < 0)
			r->wrong = -1;
		else
			r->wrong += in->wrong;
		if (in->rounds < r->rounds)
			r->rounds = in->rounds;
		if (in->peers < r->peers)
			r->peers = in->peers;
		if (in->failed_peers > r->failed_peers)
			r->failed_peers = in->failed_peers;
		if (in->checked > r->checked)
			r->checked = in->checked;
		r->bytes_sent += in->bytes_sent;
		r->bytes_received += in->bytes_received;
		r->values_sent += in->values_sent;
	}
	while (a->next < a->b->nsizes && a->count[a->next] == a->nrep) {
		print_row(a, a->next);
		a->next++;
		progress(a);
	}
}

static void print_footer(const struct agg *a)
{
	printf("# Avg bus bandwidth : %g\n", a->nrows ? a->busbw_sum / a->nrows : 0.0);
	if (!a->counted)
		printf("# Out of bounds values : n/a\n");
	else
		printf("# Out of bounds values : %" PRId64 " %s\n", a->wrong_total,
		       a->wrong_total ? "FAILED" : "OK");
	if (a->b->follow && a->b->intruders)
		printf("# Intruders refused : %d of %d %s\n", a->intruders_refused,
		       a->b->intruders, a->intruders_refused == a->b->intruders ? "OK" : "FAILED");
	if (a->b->follow && a->b->check)
		printf("# Log inconsistencies : %" PRId64 "\n", a->replay_problems);
	printf("#\n");
	fflush(stdout);
}

static void json_str(FILE *f, const char *s)
{
	/* The characters with a short escape, and the letter each takes after '\\'. */
	static const char esc_from[] = "\"\\\n\r\t", esc_to[] = "\"\\nrt";

	if (!s) {
		fputs("null", f);
		return;
	}
	fputc('"', f);
	for (; *s; s++) {
		unsigned char ch = (unsigned char)*s;
		const char *e = strchr(esc_from, ch);

		if (e) {
			fputc('\\', f);
			fputc(esc_to[e - esc_from], f);
		} else if (ch < 0x20) {
			fprintf(f, "\\u%04x", ch);
		} else {
			fputc(ch, f);
		}
	}
	fputc('"', f);
}

static void json_num(FILE *f, double v)
{
	if (isfinite(v))
		fprintf(f, "%.6g", v);
	else
		fputs("null", f);
}

/* Results are written one object per line (bench_vs_mpi.sh relies on it). */
static int write_json(const struct agg *a, const char *mode, int rank)
{
	const struct bench *b = a->b;
	const struct mp_config *c = &b->cfg;
	char g[96];
	FILE *f = fopen(b->json, "w");

	if (!f) {
		fprintf(stderr, PROG ": cannot write %s: %s\n", b->json, strerror(errno));
		return -1;
	}
	grid_format(&b->grid, g, sizeof(g));
	fprintf(f, "{\n  \"settings\": {\n");
	fprintf(f, "    \"version\": \"%d.%d.%d\",\n", MP_VERSION_MAJOR, MP_VERSION_MINOR,
		MP_VERSION_PATCH);
	fprintf(f, "    \"mode\": ");
	json_str(f, mode);
	fprintf(f, ",\n    \"rank\": %d,\n    \"transport\": ", rank);
	json_str(f, b->transport);
	fprintf(f, ",\n    \"peers\": %d,\n    \"algo\": ", b->npeers);
	json_str(f, algo_name(c->algo));
	fprintf(f, ",\n    \"grid\": ");
	json_str(f, b->grid.given ? c->grid : NULL);
	fprintf(f, ",\n    \"grid_assumed\": ");
	json_str(f, g);
	fprintf(f, ",\n    \"rounds\": %d,\n    \"rounds_effective\": %d,\n    \"codec\": ",
		c->rounds, c->algo == MP_ALGO_MOSHPIT ? b->rounds_eff : 0);
	json_str(f, codec_name(c->codec));
	fprintf(f, ",\n    \"minbytes\": %" PRIu64 ",\n    \"maxbytes\": %" PRIu64
		",\n    \"stepfactor\": %" PRIu64 ",\n", b->minbytes, b->maxbytes, b->stepfactor);
	fprintf(f, "    \"iters\": %d,\n    \"warmup_iters\": %d,\n    \"check\": %d,\n",
		b->iters, b->warmup, b->check);
	fprintf(f, "    \"weighted\": %s,\n    \"seed\": %" PRIu64 ",\n    \"run\": ",
		b->weighted ? "true" : "false", b->seed);
	json_str(f, b->run);
	fprintf(f, ",\n    \"hostfile\": ");
	json_str(f, c->hostfile);
	fprintf(f, ",\n    \"chunk_bytes\": %zu,\n    \"streams\": %d,\n", c->chunk_bytes,
		c->streams);
	fprintf(f, "    \"connect_timeout_ms\": %d,\n    \"round_timeout_ms\": %d,\n",
		c->connect_timeout_ms, c->round_timeout_ms);
	fprintf(f, "    \"exact\": %s,\n    \"tolerance\": ", b->exact ? "true" : "false");
	json_num(f, b->tol);
	fprintf(f, ",\n    \"rendezvous\": \"%s\",\n    \"followed\": %s,\n",
		b->dht ? "dht" : "static", b->follow ? "true" : "false");
	fprintf(f, "    \"total_rounds\": %d,\n    \"churn\": ", b->follow ? b->total_rounds : 0);
	json_num(f, b->churn);
	fprintf(f, ",\n    \"churn_end\": %d,\n    \"join\": %d,\n    \"late\": %d,\n"
		"    \"intruders\": %d,\n    \"clients\": %d,\n    \"aux\": %d,\n"
		"    \"faults\": [", b->churn > 0 ? b->churn_end : 0, b->join > 0, b->late,
		b->intruders, b->clients, b->aux);
	for (int k = 0; k < b->nfaults; k++) {
		char spec[640];

		snprintf(spec, sizeof(spec), "%d:%s", b->faults[k].index, b->faults[k].spec);
		fprintf(f, "%s", k ? ", " : "");
		json_str(f, spec);
	}
	fprintf(f, "],\n    \"max_rms\": ");
	json_num(f, b->max_rms >= 0 ? b->max_rms : NAN);
	if (b->follow)
		fprintf(f, ",\n    \"replay_rtol\": %g,\n    \"replay_atol\": %g", replay_rtol(b),
			replay_atol(b));
	fprintf(f, "\n  },\n  \"results\": [\n");
	for (int s = 0; s < a->nrows; s++) {
		const struct size_result *r = &a->rows[s];

		fprintf(f, "    {\"bytes\": %" PRIu64 ", \"count\": %" PRIu64 ", \"codec\": ",
			b->sizes[s], b->sizes[s] / 4);
		json_str(f, codec_name(r->codec));
		fprintf(f, ", \"algo\": ");
		json_str(f, algo_name(c->algo));
		fprintf(f, ", \"peers\": %d, \"rounds\": %d, \"time_us\": ", b->npeers, r->rounds);
		json_num(f, r->time_us);
		fprintf(f, ", \"algbw_gbs\": ");
		json_num(f, a->algbw[s]);
		fprintf(f, ", \"busbw_gbs\": ");
		json_num(f, a->busbw[s]);
		fprintf(f, ", \"max_err\": ");
		json_num(f, r->max_err >= 0 ? r->max_err : NAN);
		fprintf(f, ", \"rms_err\": ");
		json_num(f, r->rms_err >= 0 ? r->rms_err : NAN);
		if (r->wrong >= 0)
			fprintf(f, ", \"wrong\": %" PRId64, r->wrong);
		else
			fprintf(f, ", \"wrong\": null");
		fprintf(f, ", \"bytes_sent\": ");
		json_num(f, r->bytes_sent);
		fprintf(f, ", \"bytes_received\": ");
		json_num(f, r->bytes_received);
		fprintf(f, ", \"wire_bytes\": ");
		json_num(f, row_wire_bytes(a, r));
		fprintf(f, ", \"ratio\": ");
		json_num(f, row_ratio(r));
		fprintf(f, ", \"checked\": %" PRId64 ", \"checked_after_flush\": %s", r->checked,
			r->flushed ? "true" : "false");
		fprintf(f, ", \"failed_peers\": %d, \"peers_lost\": %d, \"peers_joined\": %d, "
			"\"client_reduces\": %d}%s\n", r->failed_peers, r->lost, r->joined,
			r->client_reduces, s + 1 < a->nrows ? "," : "");
	}
	fprintf(f, "  ],\n  \"avg_busbw_gbs\": ");
	json_num(f, a->nrows ? a->busbw_sum / a->nrows : 0.0);
	if (b->follow)
		fprintf(f, ",\n  \"intruders_refused\": %d,\n  \"log_inconsistencies\": %" PRId64,
			a->intruders_refused, a->replay_problems);
	if (a->counted)
		fprintf(f, ",\n  \"out_of_bounds\": %" PRId64 "\n}\n", a->wrong_total);
	else
		fprintf(f, ",\n  \"out_of_bounds\": null\n}\n");
	if (fclose(f) != 0) {
		fprintf(stderr, PROG ": cannot write %s: %s\n", b->json, strerror(errno));
		return -1;
	}
	return 0;
}

/* ------------------------------------------------------------------------ */
/* One peer: initialise, exchange addresses, benchmark every size            */

struct peer {
	const struct bench *b;
	int rank, npeers;
	mp_ctx *ctx;
	const struct chan *up;   /* to the coordinator; NULL in multi-host mode */
	const struct chan *down; /* from the coordinator */
	struct agg *agg;         /* multi-host mode: results go here directly */
	double last_hb;
};

static void peer_heartbeat(struct peer *p)
{
	double t;

	if (!p->up)
		return;
	t = now_s();
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

/* Compare @out with the exact weighted mean of every peer's input of @it. */
static void verify(struct peer *p, const float *out, size_t count, int it,
		   struct size_result *r)
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
		w[q] = peer_weight(b, q);
		wsum += w[q];
	}
	for (size_t i0 = 0; i0 < count; i0 += block) {
		size_t i1 = i0 + block < count ? i0 + block : count;

		size_t first = (i0 + stride - 1) / stride * stride;

		for (size_t i = first; i < i1; i += stride) {
			double e = 0.0, d;

			for (int q = 0; q < n; q++)
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

/* One average, bounded by the library's deadlines and our safety limit. */
static int peer_average(struct peer *p, float *buf, size_t count, float weight, mp_mr *mr,
			struct mp_result *res, char *why, size_t whylen)
{
	mp_request *req = NULL;
	double t0;
	int rc;

	rc = mp_average_start(p->ctx, buf, count, weight, mr, &req);
	if (rc) {
		snprintf(why, whylen, "mp_average_start: %s: %s", mp_strerror(rc),
			 mp_last_error(p->ctx));
		return rc;
	}
	t0 = now_s();
	rc = mp_wait(req, p->b->op_cap_ms, res);
	if (rc == -ETIMEDOUT && now_s() - t0 >= p->b->op_cap_ms * 1e-3 - 0.05) {
		snprintf(why, whylen, "no completion within the safety limit of %d s "
			 "(the library's own deadlines did not fire)", p->b->op_cap_ms / 1000);
		return rc;
	}
	if (rc)
		snprintf(why, whylen, "mp_wait: %s: %s", mp_strerror(rc), mp_last_error(p->ctx));
	return rc;
}

static void peer_report(struct peer *p, const struct size_result *r)
{
	if (p->up)
		chan_send(p->up, MSG_RESULT, p->rank, r, sizeof(*r), p->b->silence_ms);
	else
		agg_add(p->agg, r);
}

static int peer_bench(struct peer *p)
{
	const struct bench *b = p->b;
	uint64_t maxb = b->sizes[b->nsizes - 1];
	size_t alloc = (size_t)((maxb + 4095) & ~(uint64_t)4095);
	float *buf = aligned_alloc(4096, alloc);
	float w = peer_weight(b, p->rank);
	mp_mr *mr = NULL;
	int rc = 0;

	if (!buf) {
		peer_fail(p, "cannot allocate %" PRIu64 " bytes", maxb);
		return -1;
	}
	memset(buf, 0, alloc);
	rc = mp_mem_register(p->ctx, buf, (size_t)maxb, MP_MEM_HOST, &mr);
	if (rc) {
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

		memset(&r, 0, sizeof(r));
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
			if (b->check && it == total - 1 && codec_sparse(b->cfg.codec)) {
				/* The checked iteration starts with no residue, so
				 * that after the flush below the exact mean is due. */
				int e = mp_feedback_reset(p->ctx, buf);
				if (e && e != -ENOENT) {
					peer_fail(p, "mp_feedback_reset: %s", mp_strerror(e));
					rc = e;
					break;
				}
			}
			t0 = now_s();
			rc = peer_average(p, buf, count, w, mr, &res, why, sizeof(why));
			t1 = now_s();
			if (rc) {
				peer_fail(p, "size %" PRIu64 " B, iteration %d: %s", bytes, it, why);
				break;
			}
			peer_heartbeat(p);
			if (it >= b->warmup) {
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
		if (rc)
			break;
		r.time_us = tsum / b->iters * 1e6;
		r.bytes_sent = sent / b->iters;
		r.bytes_received = recvd / b->iters;
		r.values_sent = vals / b->iters;
		if (b->check && codec_sparse(b->cfg.codec)) {
			/* Deliver what error feedback held back: Σ w·(x + residue)
			 * is what every round conserves. */
			char why[768];
			struct mp_result fres;
			int e = mp_average_flush(p->ctx, buf, count, w, &fres);

			if (e) {
				snprintf(why, sizeof(why), "%s: %s", mp_strerror(e),
					 mp_last_error(p->ctx));
				peer_fail(p, "size %" PRIu64 " B, mp_average_flush: %s", bytes, why);
				rc = e;
				break;
			}
			r.flushed = 1;
		}
		if (b->check)
			verify(p, buf, count, total - 1, &r);
		peer_report(p, &r);
	}
	if (mr)
		mp_mem_deregister(p->ctx, mr);
	free(buf);
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
	p->last_hb = now_s();

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
static int peer_main(const struct bench *b, int rank, const struct chan *up,
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
	rc = peer_exchange(&p);
	if (rc == 0)
		rc = peer_bench(&p);
	mp_finalize(p.ctx);
	if (rc == 0)
		chan_send(up, MSG_DONE, rank, NULL, 0, b->silence_ms);
	return rc ? -1 : 0;
}

/* ------------------------------------------------------------------------ */
/* Coordinator of local peers                                                */

struct coord {
	int n;
	struct mq *upq;    /* threads: one queue shared by all peers */
	int *up_fd;        /* processes: one pipe per peer, -1 once closed */
	struct chan *down; /* per peer */
	pid_t *pid;        /* processes; 0 once reaped */
	int rr;
};

/* 1 with a message (MSG_EOF when a pipe closed), 0 on timeout, < 0 on error. */
static int coord_recv(struct coord *c, struct msg *m, int timeout_ms)
{
	struct pollfd *pfd;
	int *who, np = 0, rc;

	if (c->upq)
		return mq_get(c->upq, m, timeout_ms);
	pfd = xcalloc((size_t)c->n, sizeof(*pfd));
	who = xcalloc((size_t)c->n, sizeof(*who));
	for (int k = 0; k < c->n; k++) {
		int r = (c->rr + k) % c->n;

		if (c->up_fd[r] < 0)
			continue;
		pfd[np].fd = c->up_fd[r];
		pfd[np].events = POLLIN;
		who[np++] = r;
	}
	rc = poll(pfd, (nfds_t)np, np ? timeout_ms : 0);
	if (rc <= 0) {
		rc = rc < 0 && errno != EINTR ? -errno : 0;
		goto out;
	}
	for (int k = 0; k < np; k++) {
		int r = who[k];

		if (!pfd[k].revents)
			continue;
		c->rr = (r + 1) % c->n;
		rc = fd_recv_msg(c->up_fd[r], m, 5000);
		if (rc <= 0) {
			/* EOF or a broken pipe: the peer is gone. */
			close(c->up_fd[r]);
			c->up_fd[r] = -1;
			memset(m, 0, sizeof(*m));
			m->type = MSG_EOF;
		}
		m->rank = r;
		rc = 1;
		goto out;
	}
	rc = 0;
out:
	free(pfd);
	free(who);
	return rc;
}

static void describe_status(int status, char *buf, size_t len)
{
	if (WIFEXITED(status))
		snprintf(buf, len, "exited with status %d", WEXITSTATUS(status));
	else if (WIFSIGNALED(status))
		snprintf(buf, len, "was killed by signal %d (%s)", WTERMSIG(status),
			 strsignal(WTERMSIG(status)));
	else
		snprintf(buf, len, "stopped (status 0x%x)", status);
}

static void peer_name(const struct coord *c, int r, char *buf, size_t len)
{
	if (c->pid && c->pid[r] > 0)
		snprintf(buf, len, "peer %d (pid %ld)", r, (long)c->pid[r]);
	else
		snprintf(buf, len, "peer %d", r);
}

/* Kill and reap every child still around. */
static void coord_kill_all(struct coord *c)
{
	int64_t deadline;

	if (!c->pid)
		return;
	for (int r = 0; r < c->n; r++)
		if (c->pid[r] > 0)
			kill(c->pid[r], SIGKILL);
	deadline = now_ms() + 5000;
	for (int r = 0; r < c->n; r++) {
		while (c->pid[r] > 0) {
			pid_t w = waitpid(c->pid[r], NULL, WNOHANG);

			if (w == c->pid[r] || (w < 0 && errno != EINTR) || now_ms() > deadline) {
				c->pid[r] = 0;
				break;
			}
			usleep(2000);
		}
	}
}

/* A peer's pipe closed before it said it was done: say how it ended. */
static void report_eof(struct coord *c, int r)
{
	char name[64], how[96];
	int status = 0;
	int64_t deadline = now_ms() + 2000;
	pid_t w = 0;

	peer_name(c, r, name, sizeof(name));
	while (c->pid && c->pid[r] > 0) {
		w = waitpid(c->pid[r], &status, WNOHANG);
		if (w != 0 || now_ms() > deadline)
			break;
		usleep(2000);
	}
	if (w > 0) {
		describe_status(status, how, sizeof(how));
		c->pid[r] = 0;
		fprintf(stderr, PROG ": %s %s without finishing the benchmark\n", name, how);
	} else {
		fprintf(stderr, PROG ": %s closed its pipe without finishing the benchmark\n",
			name);
	}
}

/*
 * Drive the local peers: relay addresses, collect results into @a, wait for
 * everyone to finish. 0, or -1 after a clear message on stderr.
 */
static int coordinate(const struct bench *b, struct coord *c, struct agg *a)
{
	int n = c->n;
	char (*addrs)[MP_ADDR_STRLEN] = xcalloc((size_t)n, sizeof(*addrs));
	int64_t *seen = xcalloc((size_t)n, sizeof(*seen));
	char *done = xcalloc((size_t)n, 1);
	char *have_addr = xcalloc((size_t)n, 1);
	int naddr = 0, ndone = 0, sent_peers = 0, rc = -1;
	char name[64];

	for (int r = 0; r < n; r++)
		seen[r] = now_ms();
	while (ndone < n) {
		struct msg m = { 0 };
		int got = coord_recv(c, &m, 1000);
		int64_t t = now_ms();

		if (got < 0) {
			fprintf(stderr, PROG ": waiting for peers: %s\n", strerror(-got));
			goto out;
		}
		if (got > 0 && (m.rank < 0 || m.rank >= n)) {
			fprintf(stderr, PROG ": message from unknown peer %d\n", m.rank);
			free(m.data);
			goto out;
		}
		if (got > 0) {
			int r = m.rank;

			seen[r] = t;
			peer_name(c, r, name, sizeof(name));
			switch (m.type) {
			case MSG_ADDR:
				if (have_addr[r] || !m.data || m.len >= MP_ADDR_STRLEN) {
					fprintf(stderr, PROG ": %s sent a bad address\n", name);
					free(m.data);
					goto out;
				}
				memcpy(addrs[r], m.data, m.len + 1);
				have_addr[r] = 1;
				naddr++;
				break;
			case MSG_RESULT: {
				struct size_result sr;

				if (!msg_copy(&m, &sr, sizeof(sr))) {
					fprintf(stderr, PROG ": %s sent a malformed result\n", name);
					free(m.data);
					goto out;
				}
				agg_add(a, &sr);
				break;
			}
			case MSG_HEARTBEAT:
				break;
			case MSG_ERROR:
				fprintf(stderr, PROG ": %s: %s\n", name, m.data ? m.data : "failed");
				free(m.data);
				goto out;
			case MSG_DONE:
				done[r] = 1;
				ndone++;
				break;
			case MSG_EOF:
				if (done[r])
					break; /* exited after saying it is done */
				report_eof(c, r);
				goto out;
			default:
				fprintf(stderr, PROG ": %s sent unknown message %u\n", name, m.type);
				free(m.data);
				goto out;
			}
			free(m.data);
		}
		if (naddr == n && !sent_peers) {
			size_t len = 0;
			char *list = xmalloc((size_t)n * MP_ADDR_STRLEN + 1);

			for (int r = 0; r < n; r++)
				len += (size_t)sprintf(list + len, "%s%s", r ? "\n" : "", addrs[r]);
			for (int r = 0; r < n; r++) {
				int e = chan_send(&c->down[r], MSG_PEERS, -1, list, (uint32_t)len,
						  b->silence_ms);

				if (e) {
					peer_name(c, r, name, sizeof(name));
					fprintf(stderr, PROG ": cannot send the peer list to %s: %s\n",
						name, strerror(-e));
					free(list);
					goto out;
				}
			}
			free(list);
			sent_peers = 1;
		}
		for (int r = 0; r < n; r++) {
			if (done[r] || t - seen[r] <= b->silence_ms)
				continue;
			peer_name(c, r, name, sizeof(name));
			fprintf(stderr, PROG ": %s has been silent for %d s (%s); giving up\n", name,
				(int)((t - seen[r]) / 1000),
				have_addr[r] ? "stuck in the benchmark" : "stuck in mp_init");
			goto out;
		}
	}
	rc = 0;
out:
	free(addrs);
	free(seen);
	free(done);
	free(have_addr);
	return rc;
}

/* Reap children that said they are done; 0 if all exited cleanly. */
static int reap_children(const struct bench *b, struct coord *c)
{
	int64_t deadline = now_ms() + 10000 + (b->cfg.connect_timeout_ms > 0 ?
					     b->cfg.connect_timeout_ms : 10000);
	int rc = 0;

	for (int r = 0; r < c->n; r++) {
		char name[64], how[96];
		int status = 0;

		peer_name(c, r, name, sizeof(name));
		while (c->pid[r] > 0) {
			pid_t w = waitpid(c->pid[r], &status, WNOHANG);

			if (w == c->pid[r]) {
				c->pid[r] = 0;
				if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
					describe_status(status, how, sizeof(how));
					fprintf(stderr, PROG ": %s %s after finishing\n", name, how);
					rc = -1;
				}
				break;
			}
			if (w < 0 && errno != EINTR) {
				c->pid[r] = 0;
				break;
			}
			if (now_ms() > deadline) {
				fprintf(stderr, PROG ": %s did not exit after finishing; killing it\n",
					name);
				rc = -1;
				coord_kill_all(c);
				break;
			}
			usleep(2000);
		}
	}
	return rc;
}

/*
 * Fork a peer process joined to this one by a pipe each way; @what names it
 * in the message when that fails. In the parent: the child's pid, with
 * @fds[0] reading what the child sends up and @fds[1] (non-blocking)
 * writing down to it. In the child, which dies with its parent: 0, with
 * @fds[0] (non-blocking) writing up and @fds[1] reading down; it must close
 * what the parent holds for other peers, then _exit. -1 after a message.
 */
static pid_t fork_peer(const char *what, int fds[2])
{
	pid_t self = getpid(), pid;
	int up[2], down[2];

	if (pipe(up) < 0) {
		fprintf(stderr, PROG ": pipe: %s\n", strerror(errno));
		return -1;
	}
	if (pipe(down) < 0) {
		fprintf(stderr, PROG ": pipe: %s\n", strerror(errno));
		close(up[0]);
		close(up[1]);
		return -1;
	}
	fflush(NULL);
	pid = fork();
	if (pid < 0) {
		fprintf(stderr, PROG ": cannot start %s: fork: %s\n", what, strerror(errno));
		close(up[0]);
		close(up[1]);
		close(down[0]);
		close(down[1]);
		return -1;
	}
	if (pid == 0) {
#ifdef __linux__
		prctl(PR_SET_PDEATHSIG, SIGKILL);
#endif
		if (getppid() != self)
			_exit(EXIT_FAIL);
		close(up[0]);
		close(down[1]);
		set_nonblock(up[1]);
		fds[0] = up[1];
		fds[1] = down[0];
		return 0;
	}
	close(up[1]);
	close(down[0]);
	set_nonblock(down[1]);
	fds[0] = up[0];
	fds[1] = down[1];
	return pid;
}

static int run_local_procs(const struct bench *b, struct agg *a)
{
	int n = b->npeers;
	struct coord c = { .n = n };
	int rc;

	c.up_fd = xcalloc((size_t)n, sizeof(int));
	c.down = xcalloc((size_t)n, sizeof(struct chan));
	c.pid = xcalloc((size_t)n, sizeof(pid_t));
	for (int r = 0; r < n; r++) {
		c.up_fd[r] = -1;
		c.down[r].fd = -1;
	}
	for (int k = 0; k < n; k++) {
		char what[32];
		int fds[2];
		pid_t pid;

		snprintf(what, sizeof(what), "peer %d", k);
		pid = fork_peer(what, fds);
		if (pid < 0)
			goto fail;
		if (pid == 0) {
			struct chan cu = { .fd = fds[0] }, cd = { .fd = fds[1] };

			for (int j = 0; j < k; j++) {
				close(c.up_fd[j]);
				close(c.down[j].fd);
			}
			_exit(peer_main(b, k, &cu, &cd) ? EXIT_FAIL : EXIT_OK);
		}
		c.up_fd[k] = fds[0];
		c.down[k].fd = fds[1];
		c.pid[k] = pid;
	}
	rc = coordinate(b, &c, a);
	if (rc == 0)
		rc = reap_children(b, &c);
	else
		coord_kill_all(&c);
	goto out;
fail:
	coord_kill_all(&c);
	rc = -1;
out:
	for (int r = 0; r < n; r++) {
		if (c.up_fd[r] >= 0)
			close(c.up_fd[r]);
		if (c.down[r].fd >= 0)
			close(c.down[r].fd);
	}
	free(c.up_fd);
	free(c.down);
	free(c.pid);
	return rc;
}

struct loop_arg {
	const struct bench *b;
	int rank;
	struct chan up, down;
};

static void *loop_thread(void *arg)
{
	struct loop_arg *la = arg;

	/* On failure peer_main has sent MSG_ERROR, which stops the coordinator. */
	peer_main(la->b, la->rank, &la->up, &la->down);
	return NULL;
}

/* Peers as threads of this process. On failure the caller exits at once
 * (threads may still be inside the library). */
static int run_local_threads(const struct bench *b, struct agg *a)
{
	int n = b->npeers;
	struct mq upq;
	struct mq *downq = xcalloc((size_t)n, sizeof(*downq));
	struct chan *down = xcalloc((size_t)n, sizeof(*down));
	struct loop_arg *la = xcalloc((size_t)n, sizeof(*la));
	pthread_t *th = xcalloc((size_t)n, sizeof(*th));
	struct coord c = { .n = n, .upq = &upq, .down = down };
	int rc;

	if (mq_init(&upq)) {
		fprintf(stderr, PROG ": cannot create a message queue\n");
		return -1;
	}
	for (int r = 0; r < n; r++) {
		if (mq_init(&downq[r])) {
			fprintf(stderr, PROG ": cannot create a message queue\n");
			return -1;
		}
		down[r].fd = -1;
		down[r].q = &downq[r];
		la[r].b = b;
		la[r].rank = r;
		la[r].up.fd = -1;
		la[r].up.q = &upq;
		la[r].down = down[r];
	}
	for (int r = 0; r < n; r++) {
		int e = pthread_create(&th[r], NULL, loop_thread, &la[r]);

		if (e) {
			fprintf(stderr, PROG ": cannot start peer %d: pthread_create: %s\n", r,
				strerror(e));
			return -1;
		}
	}
	rc = coordinate(b, &c, a);
	if (rc)
		return rc;
	for (int r = 0; r < n; r++) {
		struct timespec dl;
		int e;

		clock_gettime(CLOCK_REALTIME, &dl);
		dl.tv_sec += 10;
		e = pthread_timedjoin_np(th[r], NULL, &dl);
		if (e) {
			fprintf(stderr, PROG ": peer %d did not finish: %s\n", r, strerror(e));
			return -1;
		}
	}
	free(downq);
	free(down);
	free(la);
	free(th);
	return 0;
}

/* ------------------------------------------------------------------------ */
/* Followed runs: dht rendezvous, churn, faults, joiners, intruders          */

/*
 * Every local peer averages one Moshpit round per call (cfg.rounds = 1) and
 * reports each round, so that the coordinator follows the run: it starts
 * late peers after round 1, notices deaths (pipe EOF, then waitpid) and
 * starts replacements. A peer learns the global round of each call from the
 * tail of its own contribution log, since a joiner starts at whatever round
 * the run is at. The vector is generated once and averaged through every
 * iteration, so a joiner's values do not depend on when it joins; the
 * survivors send their final values up and the coordinator checks them
 * against a replay of every log (replay.c).
 */

enum { ROLE_INITIAL, ROLE_LATE, ROLE_INTRUDER, ROLE_REPLACEMENT };

static const char *const role_names[] = { "peer", "late peer", "intruder", "replacement" };

struct hello {
	uint64_t id;
	char dht[MP_ADDR_STRLEN]; /* "" in static runs */
};

struct round_report {
	int64_t round;
	int32_t grouped; /* a group formed */
	int32_t group_size;
	int32_t failed;
	int32_t rc;
};

struct summary {
	int32_t init_rc; /* intruders: mp_init's refusal, else 0 */
	int32_t grouped; /* rounds spent in a group */
	int32_t errors;  /* calls that failed (intruders; -EHOSTUNREACH) */
	int32_t calls;
};

/* What a peer of a followed run is, fixed before it is forked. */
struct fspec {
	int idx, role;
	uint64_t id;
	int npeers;    /* dht: peers mp_init waits for; 0 joins a running run */
	int dht_port;  /* dht: 0 = any */
	int kill;      /* a kill is planned: its death is a loss, not a failure */
	int mode;      /* enum mp_mode */
	char bootstrap[MP_ADDR_STRLEN];
	char fault[1024];
	char log[PATH_MAX];
};

/* Peer ids of a dht run, from the seed and the spawn index: distinct (mix64
 * is a bijection) and never 0, so data and logs can be keyed by id. */
static uint64_t peer_id_of(uint64_t seed, int idx)
{
	uint64_t id = mix64(seed ^ mix64(0x6d6f736870697421ULL + (uint64_t)(uint32_t)idx));

	return id ? id : 1;
}

/* A peer's values at the start: iteration 0's data of its spawn index;
 * intruders' are far off, so that any contribution of theirs shows. */
static void follow_fill(const struct bench *b, const struct fspec *s, float *x, size_t count)
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
	float w = s->role == ROLE_INTRUDER ? 1.0f : peer_weight(b, s->idx);
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
		t0 = now_s();
		rc = peer_average(p, buf, count, w, NULL, &res, why, sizeof(why));
		t1 = now_s();
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

/* A peer of a followed run (a child process). 0 on success. */
static int follow_peer(const struct bench *b, const struct fspec *s, const struct chan *up,
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
	p.last_hb = now_s();
	if (!b->dht)
		rc = peer_exchange(&p);
	if (rc == 0) {
		h.id = mp_peer_id(p.ctx);
		if (b->dht && mp_dht_address(p.ctx, h.dht, sizeof(h.dht)))
			h.dht[0] = '\0';
		rc = chan_send(up, MSG_HELLO, p.rank, &h, sizeof(h), b->silence_ms);
	}
	if (rc == 0)
		rc = follow_rounds(&p, s, &sum);
	mp_finalize(p.ctx);
	if (rc == 0) {
		chan_send(up, MSG_SUMMARY, p.rank, &sum, sizeof(sum), b->silence_ms);
		chan_send(up, MSG_DONE, p.rank, NULL, 0, b->silence_ms);
	}
	return rc ? -1 : 0;
}

/* The coordinator's view of one peer. */
struct fpeer {
	struct fspec s;
	pid_t pid;            /* 0 once reaped */
	int up_fd, down_fd;   /* -1 once closed */
	int64_t seen;         /* last message, ms */
	int have_addr, hello, done, lost, stopped;
	uint64_t id;
	char addr[MP_ADDR_STRLEN]; /* static: data-plane address */
	char dht[MP_ADDR_STRLEN];
	int64_t last_round;   /* -1 before its first */
	int grouped;          /* rounds in a group, as it reported them */
	float *vec;           /* final values (--check) */
	struct size_result res;
	int have_res;
	struct summary sum;
	int have_sum;
};

struct fcoord {
	const struct bench *b;
	struct fpeer *p;
	int n, cap;
	char logdir[PATH_MAX / 2]; /* room for "/<id>.log" in fspec.log */
	int own_logdir;       /* a temporary directory of ours */
	char boot[MP_ADDR_STRLEN]; /* peer 0's DHT node */
	char bootlist[MP_ADDR_STRLEN]; /* fboot's answer */
	int rr;
};

static void fpeer_name(const struct fpeer *fp, char *buf, size_t len)
{
	if (fp->pid > 0)
		snprintf(buf, len, "%s %d (id %016llx, pid %ld)", role_names[fp->s.role],
			 fp->s.idx, (unsigned long long)fp->s.id, (long)fp->pid);
	else
		snprintf(buf, len, "%s %d (id %016llx)", role_names[fp->s.role], fp->s.idx,
			 (unsigned long long)fp->s.id);
}

static int fpeer_running(const struct fpeer *fp)
{
	return !fp->done && !fp->lost;
}

/* Append @fmt to the peer's fault spec, comma-separated. */
__attribute__((format(printf, 2, 3)))
static void fault_add(struct fspec *s, const char *fmt, ...)
{
	size_t off = strlen(s->fault);
	va_list ap;

	if (off && off + 1 < sizeof(s->fault))
		s->fault[off++] = ',';
	va_start(ap, fmt);
	vsnprintf(s->fault + off, sizeof(s->fault) - off, fmt, ap);
	va_end(ap);
}

/*
 * The peer's faults: --fault for its index, and with --churn its death: in
 * each round from @from on (before churn_end) it dies with probability
 * --churn, drawn from its own seeded generator; it is killed (SIGKILL) in
 * the scatter or gather phase, after 0 or 1 frames of it.
 */
static void plan_faults(const struct bench *b, struct fspec *s, int64_t from)
{
	uint64_t st = mix64(b->seed ^ 0x636875726e000000ULL ^ mix64((uint64_t)s->idx + 1));

	s->fault[0] = '\0';
	for (int k = 0; k < b->nfaults; k++) {
		if (b->faults[k].index != s->idx)
			continue;
		fault_add(s, "%s", b->faults[k].spec);
		if (strncmp(b->faults[k].spec, "kill", 4) == 0 || strstr(b->faults[k].spec, ",kill"))
			s->kill = 1;
	}
	if (b->churn <= 0 || s->role == ROLE_INTRUDER)
		return;
	for (int64_t r = from < 0 ? 0 : from; r < b->churn_end; r++) {
		uint64_t h;

		st = mix64(st + 0x9e3779b97f4a7c15ULL);
		if ((double)(st >> 11) * 0x1p-53 >= b->churn)
			continue;
		h = mix64(st ^ 0x5bd1e995ULL);
		fault_add(s, "kill:round=%lld:phase=%s:after=%d", (long long)r,
			  (h & 1) ? "gather" : "scatter", (int)((h >> 1) & 1));
		s->kill = 1;
		break;
	}
}

/* --clients, --aux: the last initial peers of a followed run, aux last. */
static int peer_mode(const struct bench *b, int role, int idx)
{
	if (role != ROLE_INITIAL)
		return MP_MODE_NORMAL;
	if (idx >= b->npeers - b->aux)
		return MP_MODE_AUX;
	return idx >= b->npeers - b->aux - b->clients ? MP_MODE_CLIENT : MP_MODE_NORMAL;
}

/* Start a peer of @role. 0, or -1 after a message. */
static int fspawn(struct fcoord *fc, int role, int npeers, const char *bootstrap, int dht_port,
		  int64_t from_round)
{
	const struct bench *b = fc->b;
	struct fpeer *fp;
	char what[64];
	int fds[2];
	pid_t pid;

	if (fc->n == fc->cap) {
		fc->cap = fc->cap ? fc->cap * 2 : 32;
		fc->p = realloc(fc->p, (size_t)fc->cap * sizeof(*fc->p));
		if (!fc->p)
			die_oom();
	}
	fp = &fc->p[fc->n];
	memset(fp, 0, sizeof(*fp));
	fp->up_fd = fp->down_fd = -1;
	fp->last_round = -1;
	fp->s.idx = fc->n;
	fp->s.role = role;
	fp->s.id = b->dht ? peer_id_of(b->seed, fp->s.idx) : (uint64_t)fp->s.idx;
	fp->s.npeers = npeers;
	fp->s.dht_port = dht_port;
	fp->s.mode = peer_mode(b, role, fp->s.idx);
	snprintf(fp->s.bootstrap, sizeof(fp->s.bootstrap), "%s", bootstrap ? bootstrap : "");
	plan_faults(b, &fp->s, from_round);
	snprintf(fp->s.log, sizeof(fp->s.log), "%s/%016llx.log", fc->logdir,
		 (unsigned long long)fp->s.id);
	unlink(fp->s.log); /* a kept directory from an earlier run */
	fp->id = fp->s.id;
	fp->seen = now_ms();

	snprintf(what, sizeof(what), "%s %d", role_names[role], fp->s.idx);
	pid = fork_peer(what, fds);
	if (pid < 0)
		return -1;
	if (pid == 0) {
		struct chan cu = { .fd = fds[0] }, cd = { .fd = fds[1] };

		for (int j = 0; j < fc->n; j++) {
			if (fc->p[j].up_fd >= 0)
				close(fc->p[j].up_fd);
			if (fc->p[j].down_fd >= 0)
				close(fc->p[j].down_fd);
		}
		_exit(follow_peer(b, &fp->s, &cu, &cd) ? EXIT_FAIL : EXIT_OK);
	}
	fp->up_fd = fds[0];
	fp->down_fd = fds[1];
	fp->pid = pid;
	fc->n++;
	return 0;
}

/* 1 with a message (MSG_EOF when a pipe closed), 0 on timeout, < 0 on error. */
static int frecv(struct fcoord *fc, struct msg *m, int timeout_ms)
{
	struct pollfd *pfd = xcalloc((size_t)fc->n, sizeof(*pfd));
	int *who = xcalloc((size_t)fc->n, sizeof(*who));
	int np = 0, rc;

	for (int k = 0; k < fc->n; k++) {
		int r = (fc->rr + k) % fc->n;

		if (fc->p[r].up_fd < 0)
			continue;
		pfd[np].fd = fc->p[r].up_fd;
		pfd[np].events = POLLIN;
		who[np++] = r;
	}
	rc = np ? poll(pfd, (nfds_t)np, timeout_ms) : 0;
	if (!np)
		usleep((useconds_t)timeout_ms * 1000);
	if (rc <= 0) {
		rc = rc < 0 && errno != EINTR ? -errno : 0;
		goto out;
	}
	rc = 0;
	for (int k = 0; k < np; k++) {
		struct fpeer *fp = &fc->p[who[k]];

		if (!pfd[k].revents)
			continue;
		fc->rr = (who[k] + 1) % fc->n;
		if (fd_recv_msg(fp->up_fd, m, 5000) <= 0) {
			close(fp->up_fd);
			fp->up_fd = -1;
			memset(m, 0, sizeof(*m));
			m->type = MSG_EOF;
		}
		m->rank = who[k];
		rc = 1;
		break;
	}
out:
	free(pfd);
	free(who);
	return rc;
}

/* Wait up to @ms for the peer to exit; 1 with its status, else 0. */
static int freap(struct fpeer *fp, int ms, int *status)
{
	int64_t deadline = now_ms() + ms;

	while (fp->pid > 0) {
		pid_t w = waitpid(fp->pid, status, WNOHANG);

		if (w == fp->pid) {
			fp->pid = 0;
			return 1;
		}
		if ((w < 0 && errno != EINTR) || now_ms() > deadline)
			return 0;
		usleep(2000);
	}
	return 0;
}

static void fkill_all(struct fcoord *fc)
{
	int status;

	for (int k = 0; k < fc->n; k++)
		if (fc->p[k].pid > 0)
			kill(fc->p[k].pid, SIGKILL);
	for (int k = 0; k < fc->n; k++)
		freap(&fc->p[k], 5000, &status);
}

/* Whether a UDP socket is bound to @port (Linux: /proc/net/udp, udp6). */
static int udp_port_bound(int port)
{
	static const char *const files[] = { "/proc/net/udp", "/proc/net/udp6" };

	for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
		FILE *f = fopen(files[i], "r");
		char line[512];

		if (!f)
			continue;
		while (fgets(line, sizeof(line), f)) {
			unsigned lport;

			if (sscanf(line, " %*d: %*[0-9A-Fa-f]:%x", &lport) == 1 &&
			    lport == (unsigned)port) {
				fclose(f);
				return 1;
			}
		}
		fclose(f);
	}
	return 0;
}

/* A UDP port free right now, for peer 0's DHT node: the others bootstrap
 * from it while peer 0 is still in mp_init, which waits for them. */
static int free_udp_port(void)
{
	struct sockaddr_in a = { .sin_family = AF_INET };
	socklen_t len = sizeof(a);
	int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0), port = -1;

	if (fd < 0)
		return -1;
	a.sin_addr.s_addr = htonl(INADDR_ANY);
	if (bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
	    getsockname(fd, (struct sockaddr *)&a, &len) == 0)
		port = ntohs(a.sin_port);
	close(fd);
	return port;
}

/* DHT address of a live peer to bootstrap from (peer 0's node if none said). */
static const char *fboot(struct fcoord *fc)
{
	size_t len = 0;
	int n = 0;

	/* A few running peers, not one: a new DHT node learns the network
	 * through its bootstrap contacts, and with several its puts and
	 * listens find the nodes that hold the run's keys sooner. */
	for (int k = 0; k < fc->n && n < 3; k++) {
		const struct fpeer *fp = &fc->p[k];

		if (fp->s.role == ROLE_INTRUDER || !fp->hello || !fpeer_running(fp) || !fp->dht[0] ||
		    len + strlen(fp->dht) + 2 > sizeof(fc->bootlist))
			continue;
		len += (size_t)snprintf(fc->bootlist + len, sizeof(fc->bootlist) - len, "%s%s",
					n++ ? "," : "", fp->dht);
	}
	return n ? fc->bootlist : fc->boot;
}

/* The round the run is at: the highest any running peer finished. */
static int64_t fround(const struct fcoord *fc)
{
	int64_t r = -1;

	for (int k = 0; k < fc->n; k++)
		if (fpeer_running(&fc->p[k]) && fc->p[k].s.role != ROLE_INTRUDER &&
		    fc->p[k].last_round > r)
			r = fc->p[k].last_round;
	return r;
}

/* A peer's pipe closed before MSG_DONE: a planned death is a loss, anything
 * else a failure. 0 or -1. */
static int fpeer_gone(struct fcoord *fc, struct fpeer *fp)
{
	const struct bench *b = fc->b;
	char name[160], how[96];
	int status = 0;

	fpeer_name(fp, name, sizeof(name));
	if (!freap(fp, 5000, &status)) {
		fprintf(stderr, PROG ": %s closed its pipe without finishing\n", name);
		return -1;
	}
	if (!(fp->s.kill && WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)) {
		describe_status(status, how, sizeof(how));
		fprintf(stderr, PROG ": %s %s without finishing the benchmark\n", name, how);
		return -1;
	}
	fp->lost = 1;
	if (fp->last_round < 0)
		fprintf(stderr, PROG ": %s died as planned (%s) before finishing a round\n", name,
			fp->s.fault);
	else
		fprintf(stderr, PROG ": %s died as planned (%s) after round %lld\n", name,
			fp->s.fault, (long long)fp->last_round);
	/* A replacement for every death of the churn rounds: the rounds
	 * after them (2d + 2) are enough to average it in, and a full grid
	 * gives the exact mean. */
	if (b->churn > 0 && b->join > 0 && fround(fc) < b->churn_end) {
		int64_t from = fround(fc) + 1;

		if (fspawn(fc, ROLE_REPLACEMENT, 0, fboot(fc), 0, from))
			return -1;
		fpeer_name(&fc->p[fc->n - 1], name, sizeof(name));
		fprintf(stderr, PROG ": %s started\n", name);
	}
	return 0;
}

/* One message of peer @fp. 0, or -1 after a message (the run fails). */
static int fhandle(struct fcoord *fc, struct fpeer *fp, struct msg *m)
{
	const struct bench *b = fc->b;
	size_t vbytes = (size_t)(b->sizes[0] / 4) * sizeof(float);
	char name[160];

	fp->seen = now_ms();
	fpeer_name(fp, name, sizeof(name));
	switch (m->type) {
	case MSG_ADDR:
		if (fp->have_addr || !m->data || m->len >= MP_ADDR_STRLEN)
			break;
		memcpy(fp->addr, m->data, m->len + 1);
		fp->have_addr = 1;
		return 0;
	case MSG_HELLO: {
		struct hello h;

		if (!msg_copy(m, &h, sizeof(h)))
			break;
		h.dht[sizeof(h.dht) - 1] = '\0';
		fp->id = h.id;
		memcpy(fp->dht, h.dht, sizeof(fp->dht));
		fp->hello = 1;
		return 0;
	}
	case MSG_ROUND: {
		struct round_report rr;

		if (!msg_copy(m, &rr, sizeof(rr)))
			break;
		fp->last_round = rr.round;
		fp->grouped += rr.grouped != 0;
		return 0;
	}
	case MSG_VECTOR:
		if (m->len != vbytes || fp->vec)
			break;
		fp->vec = xmalloc(vbytes);
		memcpy(fp->vec, m->data, vbytes);
		return 0;
	case MSG_RESULT:
		if (!msg_copy(m, &fp->res, sizeof(fp->res)))
			break;
		fp->have_res = 1;
		return 0;
	case MSG_SUMMARY:
		if (!msg_copy(m, &fp->sum, sizeof(fp->sum)))
			break;
		fp->have_sum = 1;
		return 0;
	case MSG_HEARTBEAT:
		return 0;
	case MSG_DONE:
		fp->done = 1;
		return 0;
	case MSG_ERROR:
		fprintf(stderr, PROG ": %s: %s\n", name, m->data ? m->data : "failed");
		return -1;
	case MSG_EOF:
		return fp->done ? 0 : fpeer_gone(fc, fp);
	default:
		break;
	}
	fprintf(stderr, PROG ": %s sent a malformed or unexpected message %u\n", name, m->type);
	return -1;
}

/* Static runs: once every peer's address is in, send them the list. */
static int fsend_peers(struct fcoord *fc)
{
	const struct bench *b = fc->b;
	char *list = xmalloc((size_t)b->npeers * MP_ADDR_STRLEN + 1);
	size_t len = 0;
	int rc = 0;

	for (int k = 0; k < b->npeers; k++)
		len += (size_t)sprintf(list + len, "%s%s", k ? "\n" : "", fc->p[k].addr);
	for (int k = 0; k < b->npeers && rc == 0; k++) {
		rc = fd_send_msg(fc->p[k].down_fd, MSG_PEERS, -1, list, (uint32_t)len,
				 b->silence_ms);
		if (rc)
			fprintf(stderr, PROG ": cannot send the peer list to peer %d: %s\n", k,
				strerror(-rc));
	}
	free(list);
	return rc ? -1 : 0;
}

/*
 * Start the peers and follow the run until every peer finished or died.
 * 0, or -1 after a message.
 */
static int fdrive(struct fcoord *fc)
{
	const struct bench *b = fc->b;
	int N = b->npeers, sent_peers = 0, late_done = 0, intruders_done = 0;

	if (b->dht) {
		int port = free_udp_port(), status;
		int64_t deadline;

		if (port <= 0) {
			fprintf(stderr, PROG ": no free UDP port for the first DHT node\n");
			return -1;
		}
		snprintf(fc->boot, sizeof(fc->boot), "127.0.0.1:%d", port);
		if (fspawn(fc, ROLE_INITIAL, N, NULL, port, 0))
			return -1;
		/* The others bootstrap from peer 0's node: wait until it is up
		 * (bounded; they retry bootstrapping anyway). */
		deadline = now_ms() + 5000;
		while (!udp_port_bound(port) && now_ms() < deadline) {
			if (freap(&fc->p[0], 0, &status)) {
				fprintf(stderr, PROG ": peer 0 exited before its DHT node was up\n");
				return -1;
			}
			usleep(10000);
		}
		for (int k = 1; k < N; k++)
			if (fspawn(fc, ROLE_INITIAL, N, fc->boot, 0, 0))
				return -1;
	} else {
		for (int k = 0; k < N; k++)
			if (fspawn(fc, ROLE_INITIAL, N, NULL, 0, 0))
				return -1;
	}

	for (;;) {
		struct msg m = { 0 };
		int got = frecv(fc, &m, 200), running = 0, initial_running = 0, started = 1,
		    past1 = 1, any_done = 0;
		int64_t t = now_ms();

		if (got < 0) {
			fprintf(stderr, PROG ": waiting for peers: %s\n", strerror(-got));
			return -1;
		}
		if (got > 0) {
			int rc = fhandle(fc, &fc->p[m.rank], &m);

			free(m.data);
			if (rc)
				return -1;
		}
		for (int k = 0; k < fc->n; k++) {
			struct fpeer *fp = &fc->p[k];

			if (fp->s.role == ROLE_INITIAL && !fp->lost && !fp->hello)
				started = 0;
			if (fp->s.role == ROLE_INITIAL && fpeer_running(fp)) {
				initial_running++;
				if (fp->last_round < 1)
					past1 = 0;
			}
			if (fp->done && fp->s.role != ROLE_INTRUDER)
				any_done = 1;
			if (!fpeer_running(fp))
				continue;
			running++;
			if (t - fp->seen > b->silence_ms) {
				char name[160];

				fpeer_name(fp, name, sizeof(name));
				fprintf(stderr, PROG ": %s has been silent for %d s; giving up\n", name,
					(int)((t - fp->seen) / 1000));
				return -1;
			}
		}
		if (!running)
			return 0;
		if (!b->dht && !sent_peers) {
			int have = 0;

			for (int k = 0; k < N; k++)
				have += fc->p[k].have_addr;
			if (have == N) {
				if (fsend_peers(fc))
					return -1;
				sent_peers = 1;
			}
		}
		if (started && !intruders_done) {
			for (int k = 0; k < b->intruders; k++)
				if (fspawn(fc, ROLE_INTRUDER, 0, fboot(fc), 0, 0))
					return -1;
			intruders_done = 1;
		}
		if (started && past1 && initial_running && !late_done) {
			for (int k = 0; k < b->late; k++)
				if (fspawn(fc, ROLE_LATE, 0, fboot(fc), 0, fround(fc) + 1))
					return -1;
			late_done = 1;
		}
		/* The initial peers are through: whoever still averages would
		 * only find itself alone. */
		if (!initial_running && any_done) {
			for (int k = 0; k < fc->n; k++) {
				struct fpeer *fp = &fc->p[k];

				if (fpeer_running(fp) && !fp->stopped && fp->down_fd >= 0) {
					fd_send_msg(fp->down_fd, MSG_STOP, -1, NULL, 0, 1000);
					fp->stopped = 1;
				}
			}
		}
	}
}

/* Remove the logs (and our temporary directory) of a run that passed. */
static void fclean_logs(struct fcoord *fc)
{
	for (int k = 0; k < fc->n; k++)
		unlink(fc->p[k].s.log);
	if (fc->own_logdir)
		rmdir(fc->logdir);
}

/* Parts a peer reduced, from its contribution log (0 when there is none). */
static int count_reduces(const char *path)
{
	char line[256];
	int n = 0, start = 1;
	FILE *f = fopen(path, "r");

	if (!f)
		return 0;
	/* Lines are long; only their starts matter. */
	while (fgets(line, sizeof(line), f)) {
		n += start && strncmp(line, "reduce ", 7) == 0;
		start = line[strlen(line) - 1] == '\n';
	}
	fclose(f);
	return n;
}

/*
 * The row of a followed run: times, bytes and rounds of the survivors'
 * reports; losses and joins; consensus (rms_err) and the checks. Returns
 * the number of things that failed beyond wrong values (a late peer that
 * never averaged, an intruder let in).
 */
static int fevaluate(struct fcoord *fc, struct agg *a, struct size_result *row)
{
	const struct bench *b = fc->b;
	size_t count = (size_t)(b->sizes[0] / 4);
	struct replay *rp = NULL;
	int nsurv = 0, fails = 0, first = 1, idle = 0;
	float **vecs = xcalloc((size_t)fc->n, sizeof(*vecs));
	int nvec = 0;

	memset(row, 0, sizeof(*row));
	row->max_err = -1.0;
	row->rms_err = -1.0;
	row->wrong = -1;
	row->time_us = 0.0;
	for (int k = 0; k < fc->n; k++) {
		const struct fpeer *fp = &fc->p[k];

		if (fp->s.role == ROLE_INTRUDER)
			continue;
		if (fp->lost)
			row->lost++;
		if ((fp->s.role == ROLE_LATE || fp->s.role == ROLE_REPLACEMENT) && fp->grouped)
			row->joined++;
		if (fp->s.mode == MP_MODE_CLIENT)
			row->client_reduces += count_reduces(fp->s.log);
		if (!fp->done || !fp->have_res)
			continue;
		nsurv++;
		if (fp->res.time_us > row->time_us)
			row->time_us = fp->res.time_us;
		row->bytes_sent += fp->res.bytes_sent;
		row->bytes_received += fp->res.bytes_received;
		row->values_sent += fp->res.values_sent;
		row->codec = fp->res.codec;
		if (fp->res.failed_peers > row->failed_peers)
			row->failed_peers = fp->res.failed_peers;
		if (first || fp->res.rounds < row->rounds)
			row->rounds = fp->res.rounds;
		if (first || fp->res.peers < row->peers)
			row->peers = fp->res.peers;
		first = 0;
		/* An aux peer keeps its own values: no consensus to hold. A
		 * replacement that never got into a group started after the
		 * run's last round (rounds can take milliseconds, a new process
		 * a few hundred): it never became a member of the run. */
		if (fp->s.role == ROLE_REPLACEMENT && !fp->grouped) {
			idle++;
			continue;
		}
		if (fp->vec && fp->s.mode != MP_MODE_AUX)
			vecs[nvec++] = fp->vec;
	}
	a->nrep = nsurv;
	if (idle)
		fprintf(stderr, PROG ": %d replacement(s) took part in no round (the run ended "
			"first): left out of rms_err\n", idle);

	if (b->check && nvec > 0) {
		/* Consensus: every survivor against the survivors' mean. */
		double sumsq = 0.0;

		for (size_t i = 0; i < count; i++) {
			double mean = 0.0;

			for (int v = 0; v < nvec; v++)
				mean += vecs[v][i];
			mean /= nvec;
			for (int v = 0; v < nvec; v++)
				sumsq += (vecs[v][i] - mean) * (vecs[v][i] - mean);
		}
		row->rms_err = sqrt(sumsq / ((double)count * nvec));
	}

	if (b->check) {
		float *x0 = xmalloc(count * sizeof(float));
		int rc;

		rp = replay_new(count);
		if (!rp)
			die_oom();
		for (int k = 0; k < fc->n; k++) {
			const struct fpeer *fp = &fc->p[k];

			/* Intruders are strangers to the replay: anything they
			 * got into a group would come out unknown, hence wrong. */
			if (fp->s.role == ROLE_INTRUDER)
				continue;
			follow_fill(b, &fp->s, x0, count);
			rc = replay_add_peer(rp, fp->id, x0);
			if (rc == 0)
				rc = replay_add_log_file(rp, fp->id, fp->s.log);
			if (rc) {
				fprintf(stderr, PROG ": %016llx: cannot replay %s: %s\n",
					(unsigned long long)fp->id, fp->s.log, strerror(-rc));
				fails++;
			}
		}
		free(x0);
		if (replay_run(rp))
			die_oom();
		a->replay_problems = replay_problems(rp);
		if (a->replay_problems)
			fprintf(stderr, PROG ": %" PRId64 " inconsistencies in the contribution logs; "
				"first: %s\n", a->replay_problems, replay_first_problem(rp));
		row->wrong = 0;
		row->max_err = 0.0;
		for (int k = 0; k < fc->n; k++) {
			const struct fpeer *fp = &fc->p[k];
			struct replay_cmp cmp;

			if (fp->s.role == ROLE_INTRUDER || !fp->vec)
				continue;
			replay_compare(rp, fp->id, fp->vec, replay_rtol(b), replay_atol(b), &cmp);
			if (cmp.wrong) {
				char name[160];

				fpeer_name(fp, name, sizeof(name));
				fprintf(stderr, PROG ": %s: %" PRId64 " value(s) differ from the replay "
					"of the logs (largest by %g)\n", name, cmp.wrong, cmp.max_err);
			}
			row->wrong += cmp.wrong;
			row->checked += cmp.checked;
			if (cmp.max_err > row->max_err)
				row->max_err = cmp.max_err;
		}
	}

	/* No churn on a full grid: the exact mean of the initial peers is due. */
	if (b->check && follow_exact(b)) {
		double *mean = xcalloc(count, sizeof(double));
		float *x0 = xmalloc(count * sizeof(float));
		double wsum = 0.0;

		for (int k = 0; k < fc->n; k++) {
			const struct fpeer *fp = &fc->p[k];
			/* An auxiliary peer reduces but contributes nothing. */
			double w = fp->s.mode == MP_MODE_AUX ? 0.0 : peer_weight(b, fp->s.idx);

			if (fp->s.role != ROLE_INITIAL)
				continue;
			follow_fill(b, &fp->s, x0, count);
			for (size_t i = 0; i < count; i++)
				mean[i] += w * x0[i];
			wsum += w;
		}
		for (int k = 0; k < fc->n; k++) {
			const struct fpeer *fp = &fc->p[k];
			int64_t wrong = 0;

			if (fp->s.role == ROLE_INTRUDER || fp->s.mode == MP_MODE_AUX || !fp->vec)
				continue;
			for (size_t i = 0; i < count; i++) {
				double d = fabs((double)fp->vec[i] - mean[i] / wsum);

				if (isnan(d))
					d = INFINITY;
				if (!(d <= b->tol))
					wrong++;
				if (d > row->max_err)
					row->max_err = d;
			}
			if (wrong) {
				char name[160];

				fpeer_name(fp, name, sizeof(name));
				fprintf(stderr, PROG ": %s: %" PRId64 " value(s) off the exact mean\n",
					name, wrong);
			}
			row->wrong += wrong;
		}
		free(mean);
		free(x0);
	}

	for (int role = ROLE_LATE; role <= ROLE_INTRUDER; role++) {
		int want = role == ROLE_LATE ? b->late : b->intruders, have = 0;

		for (int k = 0; k < fc->n; k++)
			have += fc->p[k].s.role == role;
		if (have < want) {
			fprintf(stderr, PROG ": %d %s(s) never started: the run ended first\n",
				want - have, role_names[role]);
			fails++;
		}
	}
	for (int k = 0; k < fc->n; k++) {
		const struct fpeer *fp = &fc->p[k];
		char name[160];

		fpeer_name(fp, name, sizeof(name));
		if (fp->s.role == ROLE_LATE && !fp->grouped && !(rp && replay_groups(rp, fp->id))) {
			fprintf(stderr, PROG ": %s never took part in a group\n", name);
			fails++;
		}
		if (fp->s.role == ROLE_INTRUDER) {
			int in = !fp->have_sum || fp->sum.grouped > 0 ||
				 (rp && replay_named_by_others(rp, fp->id));

			if (in)
				fprintf(stderr, PROG ": %s was let into a group\n", name);
			else
				a->intruders_refused++;
			fails += in;
		}
	}
	replay_free(rp);
	free(vecs);
	return fails;
}

/* ------------------------------------------------------------------------ */
/* Options                                                                   */

static void usage(FILE *f)
{
	fprintf(f,
		"Usage: " PROG " [OPTIONS]\n"
		"Benchmark Moshpit All-Reduce (libmoshpit) in the style of nccl-tests.\n"
		"\n"
		"Sizes and iterations:\n"
		"  -b, --minbytes=SIZE      smallest message (default 64K)\n"
		"  -e, --maxbytes=SIZE      largest message (default 16M)\n"
		"  -f, --stepfactor=F       multiply the size by F each step (default 2)\n"
		"  -n, --iters=N            timed iterations per size (default 5)\n"
		"  -w, --warmup_iters=N     untimed iterations per size (default 1)\n"
		"  -c, --check=0|1          compare with the exact mean (default 1)\n"
		"      --tol=X              error above which an element is wrong\n"
		"                           (default: 1e-5, or the codec's bound; see mpbench(1))\n"
		"  SIZE takes K, M or G (powers of 1024) and must be a multiple of 4.\n"
		"\n"
		"Averaging:\n"
		"      --algo=NAME          moshpit (default), ring or butterfly\n"
		"      --grid=MxNx...       Moshpit grid (default: the library's choice)\n"
		"      --rounds=R           Moshpit rounds per average (0 = grid dimensions)\n"
		"      --codec=NAME[:P]     none (default), fp16, bf16, uniform8[:SIGMAS],\n"
		"                           blockwise8[:BLOCK], topk[:FRACTION],\n"
		"                           adacomp[:conv|fc|BIN] or auto\n"
		"      --weighted           peer r averages with weight r+1 instead of 1\n"
		"      --seed=S             seed of the test data (default 42)\n"
		"      --chunk=SIZE         bytes per streamed chunk\n"
		"      --streams=N          connections per peer pair (0 = transport default)\n"
		"      --timeout=MS         connect and round timeouts in milliseconds\n"
		"\n"
		"Peers:\n"
		"      --transport=NAME     tcp (default), loop (threads of one process), dpdk,\n"
		"                           ofi (libfabric) or verbs (RDMA verbs)\n"
		"      --peers=N            number of peers (default 8 when run locally)\n"
		"      --run=NAME           run name (default mpbench-<pid> locally)\n"
		"      --hostfile=FILE      multi-host: one host[:port] per line, rank order\n"
		"      --rank=R             multi-host: this process's rank (else from\n"
		"                           MP_RANK, mpirun, PMI or srun)\n"
		"      --dpdk-args=ARGS     dpdk: EAL arguments (MP_DPDK_EAL); locally\n"
		"                           \"{rank}\" becomes each peer's rank. Without it\n"
		"                           local peers get a memif pair (2 peers) or a\n"
		"                           bridge of veths in namespaces (3-64 peers)\n"
		"      --inject-loss=P      dpdk: drop a fraction P of received frames\n"
		"\n"
		"Control plane (local peers are then followed round by round):\n"
		"      --rendezvous=NAME    static (default: a peer list) or dht (OpenDHT)\n"
		"      --bootstrap=H:P      dht across hosts: a running peer's DHT node; this\n"
		"                           process is peer --rank of --peers\n"
		"      --dht-port=P         dht across hosts: UDP port of this peer's DHT node\n"
		"      --churn=P            each peer dies (SIGKILL mid-round) with probability\n"
		"                           P in each round of the first part of the run\n"
		"      --join=0|1           replace peers that died (default 1 with --churn)\n"
		"      --compute-ms=MS      followed runs: each peer pauses MS between its rounds,\n"
		"                           as a training step's compute would (default 0)\n"
		"      --fault=I:SPEC       MP_FAULT SPEC for the peer of spawn index I\n"
		"                           (repeatable), e.g. 3:kill:round=1:phase=gather\n"
		"      --late=K             K more peers start once the others finished round 1\n"
		"      --intruders=K        K more peers with another run key try to join\n"
		"      --clients=K          dht: the last K initial peers are clients (no inbound\n"
		"                           connections, they reduce nothing)\n"
		"      --aux=K              dht: the last K initial peers are auxiliary (they\n"
		"                           reduce but contribute weight 0)\n"
		"      --max-rms=X          fail if rms_err exceeds X\n"
		"      --logs=DIR           keep the contribution logs in DIR\n"
		"\n"
		"Output:\n"
		"      --json=FILE          also write settings and results as JSON\n"
		"  -h, --help               show this help\n"
		"\n"
		"Every MP_* variable of libmoshpit applies; options override them.\n"
		"Exit status: 0 ok, 1 wrong results or a failure, 2 bad usage.\n");
}

__attribute__((format(printf, 1, 2), noreturn))
enum {
	OPT_TRANSPORT = 256,
	OPT_PEERS,
	OPT_ALGO,
	OPT_GRID,
	OPT_ROUNDS,
	OPT_CODEC,
	OPT_JSON,
	OPT_HOSTFILE,
	OPT_RANK,
	OPT_RUN,
	OPT_CHUNK,
	OPT_STREAMS,
	OPT_TIMEOUT,
	OPT_WEIGHTED,
	OPT_SEED,
	OPT_TOL,
	OPT_RENDEZVOUS,
	OPT_BOOTSTRAP,
	OPT_DHT_PORT,
	OPT_CHURN,
	OPT_JOIN,
	OPT_FAULT,
	OPT_LATE,
	OPT_INTRUDERS,
	OPT_CLIENTS,
	OPT_AUX,
	OPT_MAX_RMS,
	OPT_COMPUTE_MS,
	OPT_LOGS,
	OPT_DPDK_ARGS,
	OPT_INJECT_LOSS,
};

static const struct option long_opts[] = {
	{ "minbytes", required_argument, NULL, 'b' },
	{ "maxbytes", required_argument, NULL, 'e' },
	{ "stepfactor", required_argument, NULL, 'f' },
	{ "iters", required_argument, NULL, 'n' },
	{ "warmup_iters", required_argument, NULL, 'w' },
	{ "check", required_argument, NULL, 'c' },
	{ "transport", required_argument, NULL, OPT_TRANSPORT },
	{ "peers", required_argument, NULL, OPT_PEERS },
	{ "algo", required_argument, NULL, OPT_ALGO },
	{ "grid", required_argument, NULL, OPT_GRID },
	{ "rounds", required_argument, NULL, OPT_ROUNDS },
	{ "codec", required_argument, NULL, OPT_CODEC },
	{ "json", required_argument, NULL, OPT_JSON },
	{ "hostfile", required_argument, NULL, OPT_HOSTFILE },
	{ "rank", required_argument, NULL, OPT_RANK },
	{ "run", required_argument, NULL, OPT_RUN },
	{ "chunk", required_argument, NULL, OPT_CHUNK },
	{ "streams", required_argument, NULL, OPT_STREAMS },
	{ "timeout", required_argument, NULL, OPT_TIMEOUT },
	{ "weighted", no_argument, NULL, OPT_WEIGHTED },
	{ "seed", required_argument, NULL, OPT_SEED },
	{ "tol", required_argument, NULL, OPT_TOL },
	{ "rendezvous", required_argument, NULL, OPT_RENDEZVOUS },
	{ "bootstrap", required_argument, NULL, OPT_BOOTSTRAP },
	{ "dht-port", required_argument, NULL, OPT_DHT_PORT },
	{ "churn", required_argument, NULL, OPT_CHURN },
	{ "join", required_argument, NULL, OPT_JOIN },
	{ "fault", required_argument, NULL, OPT_FAULT },
	{ "late", required_argument, NULL, OPT_LATE },
	{ "intruders", required_argument, NULL, OPT_INTRUDERS },
	{ "clients", required_argument, NULL, OPT_CLIENTS },
	{ "aux", required_argument, NULL, OPT_AUX },
	{ "max-rms", required_argument, NULL, OPT_MAX_RMS },
	{ "compute-ms", required_argument, NULL, OPT_COMPUTE_MS },
	{ "logs", required_argument, NULL, OPT_LOGS },
	{ "dpdk-args", required_argument, NULL, OPT_DPDK_ARGS },
	{ "inject-loss", required_argument, NULL, OPT_INJECT_LOSS },
	{ "help", no_argument, NULL, 'h' },
	{ NULL, 0, NULL, 0 },
};

/* Launcher environment: 1 with rank and size when run by mpirun, PMI or srun. */
static int launcher_env(int *rank, int *size, const char **name)
{
	static const char *const vars[][3] = {
		{ "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "mpirun" },
		{ "PMI_RANK", "PMI_SIZE", "PMI" },
		{ "SLURM_PROCID", "SLURM_NTASKS", "srun" },
	};

	for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++) {
		const char *r = getenv(vars[i][0]), *s = getenv(vars[i][1]);
		char *e1, *e2;
		long rv, sv;

		if (!r || !s)
			continue;
		rv = strtol(r, &e1, 10);
		sv = strtol(s, &e2, 10);
		if (*r && *s && !*e1 && !*e2 && rv >= 0 && sv > rv && sv <= INT_MAX) {
			*rank = (int)rv;
			*size = (int)sv;
			*name = vars[i][2];
			return 1;
		}
	}
	return 0;
}

/* An option whose value is only checked, then stored in its variable. */
struct field_opt {
	int opt;
	const char *name; /* in messages */
	enum { FIELD_INT, FIELD_REAL, FIELD_TEXT } kind;
	void *field;      /* an int, a double or a const char * (not empty) */
	double lo, hi;    /* the range of FIELD_INT (exact in a double) and FIELD_REAL */
};

/* 1 when @o is in @f (its value stored), 0 when it is not. */
static int set_field_opt(const struct field_opt *f, size_t n, int o, const char *arg)
{
	for (; n > 0; f++, n--) {
		if (f->opt != o)
			continue;
		switch (f->kind) {
		case FIELD_INT:
			*(int *)f->field = (int)parse_int(f->name, arg, (int64_t)f->lo,
							  (int64_t)f->hi);
			break;
		case FIELD_REAL:
			*(double *)f->field = parse_real(f->name, arg, f->lo, f->hi);
			break;
		case FIELD_TEXT:
			if (!*arg)
				usage_error("empty %s", f->name);
			*(const char **)f->field = arg;
			break;
		}
		return 1;
	}
	return 0;
}

static void parse_options(struct bench *b, int argc, char **argv, int *rank_opt,
			  int *peers_opt)
{
	struct mp_config *c = &b->cfg;
	const struct field_opt fields[] = {
		{ 'n', "--iters", FIELD_INT, &b->iters, 1, INT_MAX / 2 },
		{ 'w', "--warmup_iters", FIELD_INT, &b->warmup, 0, INT_MAX / 2 },
		{ 'c', "--check", FIELD_INT, &b->check, 0, 1 },
		{ OPT_PEERS, "--peers", FIELD_INT, peers_opt, 1, 1 << 20 },
		{ OPT_RANK, "--rank", FIELD_INT, rank_opt, 0, INT_MAX - 1 },
		{ OPT_ROUNDS, "--rounds", FIELD_INT, &c->rounds, 0, 1 << 16 },
		{ OPT_STREAMS, "--streams", FIELD_INT, &c->streams, 0, 1024 },
		{ OPT_DHT_PORT, "--dht-port", FIELD_INT, &c->dht_port, 0, 65535 },
		{ OPT_JOIN, "--join", FIELD_INT, &b->join, 0, 1 },
		{ OPT_LATE, "--late", FIELD_INT, &b->late, 0, 1024 },
		{ OPT_INTRUDERS, "--intruders", FIELD_INT, &b->intruders, 0, 1024 },
		{ OPT_CLIENTS, "--clients", FIELD_INT, &b->clients, 0, 1024 },
		{ OPT_AUX, "--aux", FIELD_INT, &b->aux, 0, 1024 },
		{ OPT_COMPUTE_MS, "--compute-ms", FIELD_INT, &b->compute_ms, 0, 60000 },
		{ OPT_INJECT_LOSS, "--inject-loss", FIELD_REAL, &b->inject_loss, 0.0, 0.5 },
		{ OPT_CHURN, "--churn", FIELD_REAL, &b->churn, 0.0, 0.5 },
		{ OPT_MAX_RMS, "--max-rms", FIELD_REAL, &b->max_rms, 0.0, HUGE_VAL },
		{ OPT_JSON, "--json", FIELD_TEXT, &b->json, 0, 0 },
		{ OPT_HOSTFILE, "--hostfile", FIELD_TEXT, &c->hostfile, 0, 0 },
		{ OPT_RUN, "--run", FIELD_TEXT, &b->run, 0, 0 },
		{ OPT_LOGS, "--logs", FIELD_TEXT, &b->logdir, 0, 0 },
	};
	int o;

	cli_init(PROG, usage);
	*rank_opt = -1;
	*peers_opt = 0;
	opterr = 0;
	while ((o = getopt_long(argc, argv, ":b:e:f:n:w:c:h", long_opts, NULL)) != -1) {
		const char *name = optind > 0 && optind <= argc ? argv[optind - 1] : "option";

		if (set_field_opt(fields, sizeof(fields) / sizeof(fields[0]), o, optarg))
			continue;
		switch (o) {
		case 'b':
			b->minbytes = parse_size("--minbytes", optarg, 0, UINT64_MAX);
			b->size_given |= 1;
			break;
		case 'e':
			b->maxbytes = parse_size("--maxbytes", optarg, 0, UINT64_MAX);
			b->size_given |= 2;
			break;
		case 'f':
			b->stepfactor = (uint64_t)parse_int("--stepfactor", optarg, 2, 1 << 20);
			break;
		case OPT_TRANSPORT:
			if (!mp_transport_available(optarg))
				usage_error("--transport=%s: not built into this library, registered "
					    "or in MP_DRIVER_PATH", optarg);
			b->transport = optarg;
			break;
		case OPT_DPDK_ARGS:
			b->dpdk_args = optarg;
			break;
		case OPT_ALGO: {
			int v = mp_algo_from_name(optarg);

			if (v < 0)
				usage_error("unknown --algo '%s' (moshpit, ring or butterfly)",
					    optarg);
			c->algo = v;
			break;
		}
		case OPT_GRID: {
			struct gridinfo g;

			/* Syntax only here: the cell count is checked once the
			 * number of peers is known. */
			if (grid_from_library(optarg, 1, &g) < 0)
				usage_error("bad --grid '%s' (like 4x4 or 2x2x2, at most %d "
					    "dimensions)", optarg, MP_MAX_GRID_DIMS);
			c->grid = optarg;
			break;
		}
		case OPT_CODEC: {
			if (mp_codec_parse(optarg, c))
				usage_error("bad --codec '%s' (none, fp16, bf16, uniform8[:SIGMAS], "
					    "blockwise8[:BLOCK], topk[:FRACTION], "
					    "adacomp[:conv|fc|BIN] or auto)", optarg);
			break;
		}
		case OPT_CHUNK: {
			uint64_t v = parse_size("--chunk", optarg, 0, UINT64_MAX);

			if (v == 0 || v % 4 || v > SIZE_MAX / 2)
				usage_error("bad --chunk '%s' (a positive multiple of 4 bytes)",
					    optarg);
			c->chunk_bytes = (size_t)v;
			break;
		}
		case OPT_TIMEOUT: {
			int v = (int)parse_int("--timeout", optarg, 1, INT_MAX / 64);

			c->connect_timeout_ms = v;
			c->round_timeout_ms = v;
			break;
		}
		case OPT_WEIGHTED:
			b->weighted = 1;
			break;
		case OPT_SEED:
			b->seed = parse_u64("--seed", optarg);
			break;
		case OPT_TOL: {
			char *end;
			double v;

			errno = 0;
			v = strtod(optarg, &end);
			if (errno || end == optarg || *end || !(v >= 0) || !isfinite(v))
				usage_error("bad --tol '%s' (a non-negative number)", optarg);
			b->tol = v;
			b->tol_set = 1;
			break;
		}
		case OPT_RENDEZVOUS:
			if (strcmp(optarg, "dht") == 0)
				b->dht = 1;
			else if (strcmp(optarg, "static") == 0)
				b->rdv_static = 1;
			else
				usage_error("unknown --rendezvous '%s' (static or dht)", optarg);
			if (b->dht && b->rdv_static)
				usage_error("--rendezvous given as both static and dht");
			break;
		case OPT_BOOTSTRAP:
			if (!*optarg || !strchr(optarg, ':'))
				usage_error("bad --bootstrap '%s' (host:port[,host:port...])", optarg);
			c->bootstrap = optarg;
			break;
		case OPT_FAULT: {
			char *end;
			long idx;

			errno = 0;
			idx = strtol(optarg, &end, 10);
			if (errno || end == optarg || *end != ':' || !end[1] || idx < 0 ||
			    idx > INT_MAX)
				usage_error("bad --fault '%s' (INDEX:SPEC, e.g. "
					    "3:kill:round=1:phase=gather)", optarg);
			b->faults = realloc(b->faults, (size_t)(b->nfaults + 1) * sizeof(*b->faults));
			if (!b->faults)
				die_oom();
			b->faults[b->nfaults].index = (int)idx;
			b->faults[b->nfaults].spec = end + 1;
			b->nfaults++;
			break;
		}
		case 'h':
			usage(stdout);
			exit(EXIT_OK);
		case ':':
			usage_error("%s needs a value", name);
		case '?':
		default:
			usage_error("unknown or malformed option '%s'", name);
		}
	}
	if (optind < argc)
		usage_error("unexpected argument '%s'", argv[optind]);
}

/*
 * Followed runs: one vector size for the whole run (a joiner's buffer must
 * match the others' at whatever round it arrives), one process per peer
 * (tcp, ofi, verbs: a fault kills its process), and the codecs the replay
 * can follow.
 */
static void follow_options(struct bench *b)
{
	if (b->loop)
		usage_error("--rendezvous=dht, --churn and --fault need a process per peer: "
			    "--transport=tcp, ofi or verbs (a fault kills its whole process)");
	if (b->cfg.algo != MP_ALGO_MOSHPIT)
		usage_error("--rendezvous=dht, --churn and --fault need --algo=moshpit");
	if (codec_sparse(b->cfg.codec))
		usage_error("--codec=%s holds values back (error feedback), which the replay "
			    "of the logs cannot follow", codec_name(b->cfg.codec));
	if (b->size_given == 3 && b->minbytes != b->maxbytes)
		usage_error("--rendezvous=dht, --churn and --fault run one size: give -b or -e");
	if (b->size_given == 1)
		b->maxbytes = b->minbytes;
	else if (b->size_given == 2)
		b->minbytes = b->maxbytes;
	else
		b->minbytes = b->maxbytes = 256u << 10;
}

/* Every peer of a followed run, joiners included, gets the same grid: the
 * one given, or the library's choice for the peers and the late peers. */
static void follow_grid(struct bench *b)
{
	struct gridinfo g;

	if (b->cfg.grid)
		return;
	if (grid_from_library(NULL, b->npeers + b->late, &g) < 0)
		usage_error("no grid for %d peers", b->npeers + b->late);
	grid_format(&g, b->grid_buf, sizeof(b->grid_buf));
	b->cfg.grid = b->grid_buf;
}

/* Sizes from min to max, multiplying by the step factor. */
static void make_sizes(struct bench *b)
{
	int cap = 0;

	if (b->minbytes == 0 || b->minbytes % 4)
		usage_error("--minbytes %" PRIu64 " is not a positive multiple of 4 bytes (fp32)",
			    b->minbytes);
	if (b->maxbytes == 0 || b->maxbytes % 4)
		usage_error("--maxbytes %" PRIu64 " is not a positive multiple of 4 bytes (fp32)",
			    b->maxbytes);
	if (b->minbytes > b->maxbytes)
		usage_error("--minbytes %" PRIu64 " is larger than --maxbytes %" PRIu64,
			    b->minbytes, b->maxbytes);
	if (b->maxbytes > SIZE_MAX / 2)
		usage_error("--maxbytes %" PRIu64 " is too large", b->maxbytes);
	for (uint64_t s = b->minbytes; s <= b->maxbytes; s *= b->stepfactor) {
		if (b->nsizes == cap) {
			cap = cap ? cap * 2 : 16;
			b->sizes = realloc(b->sizes, (size_t)cap * sizeof(*b->sizes));
			if (!b->sizes)
				die_oom();
		}
		b->sizes[b->nsizes++] = s;
		if (s > UINT64_MAX / b->stepfactor)
			break;
	}
}

/* ------------------------------------------------------------------------ */
/* Modes                                                                     */

static int finish(struct agg *a, const char *mode, int rank, int failed)
{
	const struct bench *b = a->b;
	int rc = failed ? EXIT_FAIL : EXIT_OK;

	if (a->print && !failed) {
		print_footer(a);
		if (b->json && write_json(a, mode, rank) < 0)
			rc = EXIT_FAIL;
	}
	if (b->max_rms >= 0 && a->nrows > 0 && !(a->rms_worst >= 0 && a->rms_worst <= b->max_rms)) {
		if (a->rms_worst < 0)
			fprintf(stderr, PROG ": rms_err was not measured (--max-rms needs --check=1)\n");
		else
			fprintf(stderr, PROG ": rms_err %g exceeds --max-rms=%g\n", a->rms_worst,
				b->max_rms);
		rc = EXIT_FAIL;
	}
	if (a->wrong_total > 0) {
		if (a->print)
			fprintf(stderr, PROG ": %" PRId64 " value(s) out of bounds (tolerance %g)\n",
				a->wrong_total, b->tol);
		else
			fprintf(stderr, PROG ": rank %d: %" PRId64 " value(s) out of bounds "
				"(tolerance %g)\n", rank, a->wrong_total, b->tol);
		rc = EXIT_FAIL;
	}
	return rc;
}

static int run_local(struct bench *b)
{
	struct agg a;
	char mode[64];
	int rc;

	bench_derive(b, b->npeers);
	snprintf(mode, sizeof(mode), "local, %d %s", b->npeers,
		 b->loop ? "threads" : "processes");
	print_header(b, mode);
	agg_init(&a, b, b->npeers, 1);
	progress(&a);
	rc = b->loop ? run_local_threads(b, &a) : run_local_procs(b, &a);
	if (rc && b->loop) {
		/* Peer threads may still be inside the library. */
		fflush(NULL);
		_exit(EXIT_FAIL);
	}
	rc = finish(&a, b->loop ? "local-threads" : "local-processes", 0, rc != 0);
	agg_free(&a);
	return rc;
}

/* Local peers followed round by round (dht rendezvous, churn, faults). */
static int run_follow(struct bench *b)
{
	struct fcoord fc = { .b = b };
	struct size_result row;
	struct agg a;
	char mode[96];
	int rc, fails = 0;

	bench_derive(b, b->npeers);
	if ((uint64_t)b->npeers + (uint64_t)b->late > b->grid.cells)
		usage_error("--late=%d needs free grid cells: grid %s has %" PRIu64 " cells for %d "
			    "peers", b->late, b->cfg.grid, b->grid.cells, b->npeers);
	b->total_rounds = (b->warmup + b->iters) * b->rounds_eff;
	/* The last rounds are free of deaths, so that the survivors and any
	 * replacement can reach consensus: rms_err measures whether they do. */
	b->churn_end = b->total_rounds - 2 * b->grid.ndims - 2;
	if (b->churn_end < 0)
		b->churn_end = 0;
	if (b->churn > 0 && b->churn_end == 0)
		usage_error("--churn: %d rounds leave none for deaths (the last 2 x %d + 2 "
			    "converge); raise --rounds or --iters", b->total_rounds, b->grid.ndims);
	snprintf(mode, sizeof(mode), "local, %d processes, followed round by round", b->npeers);
	print_header(b, mode);
	agg_init(&a, b, b->npeers, 1);
	if (b->logdir) {
		if (strlen(b->logdir) >= sizeof(fc.logdir)) {
			fprintf(stderr, PROG ": --logs: path too long\n");
			agg_free(&a);
			return EXIT_FAIL;
		}
		if (mkdir(b->logdir, 0755) < 0 && errno != EEXIST) {
			fprintf(stderr, PROG ": cannot create %s: %s\n", b->logdir, strerror(errno));
			agg_free(&a);
			return EXIT_FAIL;
		}
		snprintf(fc.logdir, sizeof(fc.logdir), "%s", b->logdir);
	} else {
		snprintf(fc.logdir, sizeof(fc.logdir), "%s/mpbench-XXXXXX",
			 getenv("TMPDIR") && *getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
		if (!mkdtemp(fc.logdir)) {
			fprintf(stderr, PROG ": cannot create a directory for the logs: %s\n",
				strerror(errno));
			agg_free(&a);
			return EXIT_FAIL;
		}
		fc.own_logdir = 1;
	}
	fprintf(stderr, PROG ": size %" PRIu64 ", %d rounds ...\n", b->sizes[0], b->total_rounds);

	rc = fdrive(&fc);
	if (rc) {
		fkill_all(&fc);
	} else {
		/* Everyone said done or died: reap the rest. */
		for (int k = 0; k < fc.n; k++) {
			int status;

			if (fc.p[k].pid > 0 && !freap(&fc.p[k], 10000, &status)) {
				fprintf(stderr, PROG ": %s %d did not exit after finishing\n",
					role_names[fc.p[k].s.role], k);
				fkill_all(&fc);
				rc = -1;
			}
		}
		fails = fevaluate(&fc, &a, &row);
		a.rows[0] = row;
		print_row(&a, 0);
		a.next = 1;
	}
	rc = finish(&a, "local-processes-followed", 0, rc != 0);
	if (fails)
		rc = EXIT_FAIL;
	if (rc == EXIT_OK && !b->logdir)
		fclean_logs(&fc);
	else if (rc != EXIT_OK || b->logdir)
		fprintf(stderr, PROG ": contribution logs are in %s\n", fc.logdir);
	for (int k = 0; k < fc.n; k++) {
		if (fc.p[k].up_fd >= 0)
			close(fc.p[k].up_fd);
		if (fc.p[k].down_fd >= 0)
			close(fc.p[k].down_fd);
		free(fc.p[k].vec);
	}
	free(fc.p);
	agg_free(&a);
	return rc;
}

static int run_multi(struct bench *b, const char *how)
{
	struct mp_config cfg = b->cfg;
	struct peer p = { .b = b };
	struct agg a;
	char mode[256];
	int rc;

	if (b->run)
		cfg.run_name = b->run;
	cfg.transport = b->transport;
	if (b->dht) {
		/* Ranks only number the data and weights; ids follow from them. */
		cfg.rendezvous = "dht";
		cfg.peer_id = peer_id_of(b->seed, cfg.rank);
		p.rank = cfg.rank;
		p.npeers = cfg.npeers;
		cfg.rank = -1;
	}
	rc = mp_init(&cfg, &p.ctx);
	if (rc) {
		if (cfg.rank >= 0)
			fprintf(stderr, PROG ": rank %d: mp_init: %s: %s\n", cfg.rank,
				mp_strerror(rc), mp_last_error(NULL));
		else
			fprintf(stderr, PROG ": mp_init: %s: %s\n", mp_strerror(rc),
				mp_last_error(NULL));
		return EXIT_FAIL;
	}
	if (b->dht) {
		char dht[MP_ADDR_STRLEN];

		if (mp_dht_address(p.ctx, dht, sizeof(dht)) == 0)
			fprintf(stderr, PROG ": rank %d: DHT node at %s\n", p.rank, dht);
	} else {
		p.rank = mp_rank(p.ctx);
		p.npeers = mp_npeers(p.ctx);
	}
	bench_derive(b, p.npeers);
	snprintf(mode, sizeof(mode), "multi-host (%s), rank %d of %d; errors are this rank's own",
		 how, p.rank, p.npeers);
	agg_init(&a, b, 1, p.rank == 0);
	p.agg = &a;
	if (a.print) {
		print_header(b, mode);
		progress(&a);
	}
	rc = peer_bench(&p);
	mp_finalize(p.ctx);
	rc = finish(&a, "multi-host", p.rank, rc != 0);
	agg_free(&a);
	return rc;
}

int main(int argc, char **argv)
{
	struct bench b;
	int rank_opt, peers_opt, lrank = -1, lsize = 0, launched, rc;
	const char *lname = NULL, *run_env;
	char how[128];

	memset(&b, 0, sizeof(b));
	mp_config_init(&b.cfg);
	rc = mp_config_from_env(&b.cfg);
	if (rc) {
		fprintf(stderr, PROG ": bad MP_* environment variable: %s (set MP_DEBUG=WARN "
			"for details)\n", mp_strerror(rc));
		return EXIT_USAGE;
	}
	b.minbytes = 64ULL << 10;
	b.maxbytes = 16ULL << 20;
	b.stepfactor = 2;
	b.iters = 5;
	b.warmup = 1;
	b.check = 1;
	b.seed = 42;
	b.transport = b.cfg.transport && *b.cfg.transport ? b.cfg.transport : "tcp";
	b.join = -1;
	b.max_rms = -1.0;
	parse_options(&b, argc, argv, &rank_opt, &peers_opt);
	if (!b.rdv_static && b.cfg.rendezvous && strcmp(b.cfg.rendezvous, "dht") == 0)
		b.dht = 1;
	if (b.churn > 0 || b.late || b.intruders || (b.cfg.bootstrap && !b.rdv_static)) {
		if (b.rdv_static)
			usage_error("--churn, --late and --intruders need --rendezvous=dht");
		b.dht = 1;
	}
	if (b.join < 0)
		b.join = b.churn > 0;
	b.loop = strcmp(b.transport, "loop") == 0;
	signal(SIGPIPE, SIG_IGN);

	launched = launcher_env(&lrank, &lsize, &lname);
	b.multi = b.cfg.hostfile || b.cfg.peers || rank_opt >= 0 || b.cfg.rank >= 0 ||
		  (launched && lsize > 1) || (b.dht && b.cfg.bootstrap);
	b.follow = !b.multi && (b.dht || b.nfaults || b.churn > 0 || b.late || b.intruders);
	if (b.multi && (b.nfaults || b.churn > 0 || b.late || b.intruders))
		usage_error("--churn, --fault, --late and --intruders start local peers: they "
			    "cannot be used across hosts");
	if ((b.clients || b.aux) && (!b.dht || b.multi))
		usage_error("--clients and --aux give local peers of a --rendezvous=dht run their "
			    "DeDLOC modes");
	if (b.compute_ms && !b.follow)
		usage_error("--compute-ms paces followed runs (--rendezvous=dht, --churn, --fault)");
	if (b.follow)
		follow_options(&b);
	if (strcmp(b.transport, "dpdk") == 0) {
		char v[32];

		if (b.follow)
			usage_error("--transport=dpdk runs static rounds: no --rendezvous=dht, "
				    "--churn or --fault");
		snprintf(v, sizeof(v), "%g", b.inject_loss);
		setenv("MP_DPDK_INJECT_LOSS", v, 1);
		snprintf(v, sizeof(v), "%" PRIu64, b.seed);
		setenv("MP_DPDK_INJECT_SEED", v, 0);
		if (b.multi && b.dpdk_args)
			setenv("MP_DPDK_EAL", b.dpdk_args, 1);
	} else if (b.dpdk_args || b.inject_loss > 0) {
		usage_error("--dpdk-args and --inject-loss are for --transport=dpdk");
	}
	make_sizes(&b);
	if (b.follow && b.check && b.maxbytes > (1u << 20))
		usage_error("--check with --rendezvous=dht, --churn or --fault sends every "
			    "peer's final values to the launcher: at most 1M (or --check=0)");
	if (!b.multi) {
		b.npeers = peers_opt ? peers_opt : b.cfg.npeers > 0 ? b.cfg.npeers : 8;
		if (b.clients + b.aux >= b.npeers)
			usage_error("--clients=%d and --aux=%d leave no normal peer of %d",
				    b.clients, b.aux, b.npeers);
		run_env = getenv("MP_RUN");
		if (b.run == NULL && run_env && *run_env)
			b.run = run_env;
		if (b.run == NULL) {
			snprintf(b.run_buf, sizeof(b.run_buf), PROG "-%ld", (long)getpid());
			b.run = b.run_buf;
		}
		if (b.follow) {
			for (int k = 0; k < b.nfaults; k++)
				if (b.faults[k].index >= b.npeers + b.late)
					usage_error("--fault=%d:...: peers are numbered 0 to %d",
						    b.faults[k].index, b.npeers + b.late - 1);
			follow_grid(&b);
			rc = run_follow(&b);
		} else if (strcmp(b.transport, "dpdk") == 0) {
			if (dseg_setup(b.npeers, b.dpdk_args, 0))
				return EXIT_FAIL;
			rc = run_local(&b);
			dseg_report();
			dseg_teardown();
		} else {
			rc = run_local(&b);
		}
		free(b.sizes);
		free(b.faults);
		return rc;
	}

	if (b.dht) {
		if (rank_opt < 0 && b.cfg.rank < 0 && !launched)
			usage_error("--rendezvous=dht across hosts needs --rank=R and --peers=N: "
				    "this process is peer R of N");
	} else if (!b.cfg.hostfile && !b.cfg.peers) {
		if (launched)
			usage_error("started by %s as rank %d of %d: multi-host mode needs "
				    "--hostfile=FILE (or MP_HOSTFILE / MP_PEERS)", lname, lrank,
				    lsize);
		usage_error("a rank was given: multi-host mode needs --hostfile=FILE "
			    "(or MP_HOSTFILE / MP_PEERS)");
	}
	if (b.loop)
		usage_error("--transport=loop runs every peer in one process; it cannot be "
			    "used across hosts");
	if (!b.run)
		b.run = b.cfg.run_name;
	if (rank_opt >= 0)
		b.cfg.rank = rank_opt;
	else if (b.cfg.rank < 0 && launched)
		b.cfg.rank = lrank;
	if (peers_opt)
		b.cfg.npeers = peers_opt;
	else if (b.cfg.npeers <= 0 && launched && (rank_opt < 0 || lrank == rank_opt))
		b.cfg.npeers = lsize;
	if (b.dht && b.cfg.npeers <= 0)
		usage_error("--rendezvous=dht across hosts needs --peers=N");
	if (b.dht)
		snprintf(how, sizeof(how), "dht, %s%s", b.cfg.bootstrap ? "bootstrap " : "first node",
			 b.cfg.bootstrap ? b.cfg.bootstrap : "");
	else
		snprintf(how, sizeof(how), "%s %s%s%s", b.cfg.hostfile ? "hostfile" : "peer list",
			 b.cfg.hostfile ? b.cfg.hostfile : "MP_PEERS", lname ? ", started by " : "",
			 lname ? lname : "");
	rc = run_multi(&b, how);
	free(b.sizes);
	return rc;
}
