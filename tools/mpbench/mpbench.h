/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * What the files of mpbench share; everything else in them is static.
 *
 *   mpbench.c   main: parse, then run the mode
 *   options.c   the command line and the environment, every check of the
 *               options (mpbench_parse, which returns: fuzz_mpbench_opts),
 *               and the settings that follow from them
 *   util.c      small helpers: out of memory, clamping
 *   chan.c      messages between the peers and their coordinator
 *   launch.c    local peers as processes or threads; a multi-host peer
 *   peer.c      one peer: the timed averages and the check of the results
 *   churn.c     followed runs: rendezvous, churn, faults, joiners, intruders
 *   report.c    the table, the JSON file and the exit status
 *   replay.c    replay of the contribution logs (replay.h)
 *   dpdk_seg.c  the virtual segment of --transport=dpdk (dpdk_seg.h)
 *   cuda.c      --memory=cuda: the CUDA driver, loaded at run time
 */
#ifndef MPBENCH_H
#define MPBENCH_H

#include <limits.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdint.h>
#include <sys/types.h>

#include <moshpit/moshpit.h>
#include "cli.h"
#include <moshpit/sdk/clock.h>

#define PROG "mpbench"

/* Exit statuses. */
#define EXIT_OK 0
#define EXIT_FAIL 1
#define EXIT_USAGE CLI_EXIT_USAGE

/* Most peers --peers takes. */
#define MPBENCH_MAX_PEERS (1 << 20)

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
	MSG_PEER_STATS = 13, /* peer -> coord: its struct mp_peer_info table (--peer-stats) */
	MSG_DETAIL = 14,   /* peer -> coord: mp_transport_detail (text; rank 0, after mp_init) */
	MSG_GO = 15,       /* coord -> standby: replace a dead peer, start averaging */
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
	double time_min_us;   /* the same, min over peers (--minmax) */
	double time_median_us; /* median of the timed iterations (max over peers); NaN where
	                          not measured per iteration (followed runs) */
	double max_err;       /* max |out - exact|; < 0 = not checked */
	double rms_err;       /* rms of out - exact; < 0 = not checked */
	double bytes_sent;    /* per operation (summed over peers) */
	double bytes_received;
	double values_sent;   /* fp32 values carried per operation (summed over peers) */
	int32_t codec;        /* codec the library used ("auto" resolved) */
	int32_t flushed;      /* checked after a flush, MP_AVG_FLUSH (sparse codecs) */
	int32_t lost;         /* followed runs: peers that died */
	int32_t joined;       /* followed runs: peers that joined later and took part */
	int32_t woken;        /* --standby: standbys woken to replace a dead peer */
	int32_t client_reduces; /* --clients: parts client peers reduced (0 is right) */
	int32_t time_ranks;   /* multi-host: ranks whose times time_us is the max of
	                         (npeers when every rank's arrived; 1: rank 0's own) */
	int32_t mem_path;     /* how the library averaged the buffer (mp_mem_path) */
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
	int sync;           /* --sync: a 4-byte average before each iteration (a barrier) */
	uint64_t seed;
	double tol;
	int tol_set;
	const char *json;
	int minmax;         /* --minmax: the fastest and slowest peer's time per row */
	int time_gathered;  /* multi-host: the ranks' times travel to rank 0 (gather_times) */
	int gather_passes;  /* multi-host: uncompressed averages per gather (launch.c) */
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
	int keep;           /* --keep: the first K initial peers never die of --churn */
	int catchup;        /* --churn-catchup: a planned death not met in its round
	                       fires in the peer's next one, until the churn ends */
	int standby;        /* --standby: replacements started ahead, past mp_init,
	                       woken when a peer dies */
	int sample;         /* --sample: every this many rounds, the resources of the
	                       running initial peers (0: never) */
	int intruders;      /* peers with another run key */
	int clients, aux;   /* DeDLOC modes: the last initial peers (aux last) */
	struct fault_opt {
		int index;
		const char *spec;
	} *faults;
	int nfaults;
	double max_rms;     /* fail when rms_err exceeds it (< 0: no limit) */
	const char *logdir; /* --logs: keep the contribution logs here */
	const char *dead;   /* --dead: multi-host ranks the harness killed (text) */
	unsigned char *dead_mask; /* the same per rank, once npeers is known (NULL: none) */
	int follow;         /* local peers followed round by round */
	int size_given;     /* -b or -e was given */
	char grid_buf[96];  /* followed runs: the grid every peer is given */
	int total_rounds;   /* followed runs: rounds of the run, warmup included */
	int churn_end;      /* --churn: deaths fall in rounds [0, churn_end) */
	int compute_ms;     /* followed runs: a peer's pause between its rounds */
	/* What mpbench_parse found besides the settings above. */
	int help;           /* --help: print bench_usage, nothing else was parsed */
	int rank_opt;       /* --rank (-1: not given) */
	int peers_opt;      /* --peers (0: not given) */
	int launched;       /* started by mpirun, PMI or srun (lname) as lrank of lsize */
	int lrank, lsize;
	const char *lname;
	/* --transport=dpdk (dpdk_seg.c builds the local segment) */
	const char *dpdk_args; /* --dpdk-args: EAL arguments instead of a made-up segment */
	double inject_loss;    /* --inject-loss: fraction of received frames dropped */
	int peer_stats;        /* --peer-stats: each peer's mp_peers_info at the end */
	/* --memory=cuda: each peer's buffer in CUDA device memory (cuda.c) */
	int cuda;
	char cuda_what[256];   /* what the probe found: "N devices, device 0: NAME" */
};

/* ------------------------------------------------------------------------ */
/* Test data: a cheap counter-based generator                                */

static inline uint64_t mix64(uint64_t z)
{
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

/* Key of the input of peer @rank in iteration @it. */
static inline uint64_t stream_key(uint64_t seed, int rank, int it)
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

static inline float peer_weight(const struct bench *b, int rank)
{
	return b->weighted ? (float)(rank + 1) : 1.0f;
}

/* ------------------------------------------------------------------------ */
/* Messages between the peers and their coordinator (chan.c)                 */

/* In-memory message queues (loop transport: peers are threads). */
struct qmsg;

struct mq {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct qmsg *head, *tail;
};

/* A one-way channel: a pipe end (fd >= 0) or a queue. */
struct chan {
	int fd;
	struct mq *q;
};

int set_nonblock(int fd);
int fd_send_msg(int fd, uint32_t type, int rank, const void *data, uint32_t len,
		int timeout_ms);
int fd_recv_msg(int fd, struct msg *m, int timeout_ms);
int msg_copy(const struct msg *m, void *out, size_t len);
int mq_init(struct mq *q);
int mq_get(struct mq *q, struct msg *m, int timeout_ms);
int chan_send(const struct chan *c, uint32_t type, int rank, const void *data,
	      uint32_t len, int timeout_ms);
int chan_recv(const struct chan *c, struct msg *m, int timeout_ms);

/* ------------------------------------------------------------------------ */
/* Output (report.c)                                                         */

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
	int path_min, path_max; /* mem_path over every peer's rows (-1: no row yet) */
	double rms_worst; /* largest rms_err of the rows; < 0 when one was not measured */
	/* Followed runs: what the footer and JSON add. */
	int intruders_refused;
	int64_t replay_problems;
	/* --peer-stats: each rank's table (NULL until it reports) */
	struct mp_peer_info **pstats;
	int *npstats, npstats_ranks;
	/* mp_transport_detail of a peer (rank 0's), "key=value ..." */
	char tdetail[256];
	int tdetail_known;
};

void agg_init(struct agg *a, const struct bench *b, int nrep, int print);
void agg_free(struct agg *a);
void show_progress(const struct agg *a);
void print_header(const struct bench *b, const char *mode);
void print_row(struct agg *a, int s);
void agg_add(struct agg *a, const struct size_result *in);
int report_finish(struct agg *a, const char *mode, int rank, int failed);
/* --peer-stats: rank @rank's table of @n peers (copied). */
void agg_peer_stats(struct agg *a, int rank, const struct mp_peer_info *t, int n);

/* ------------------------------------------------------------------------ */
/* One peer (peer.c)                                                         */

struct peer {
	const struct bench *b;
	int rank, npeers;
	mp_ctx *ctx;
	const struct chan *up;   /* to the coordinator; NULL in multi-host mode */
	const struct chan *down; /* from the coordinator */
	struct agg *agg;         /* multi-host mode: results go here directly */
	double last_hb;
};

int peer_bench(struct peer *p);
int peer_main(const struct bench *b, int rank, const struct chan *up,
	      const struct chan *down);

/* ------------------------------------------------------------------------ */
/* Followed runs: the peers (peer.c) and their coordinator (churn.c)         */

enum { ROLE_INITIAL, ROLE_LATE, ROLE_INTRUDER, ROLE_REPLACEMENT };

struct hello {
	uint64_t id;
	char dht[MP_ADDR_STRLEN]; /* "" in static runs */
	int detail_known;
	char detail[256];         /* mp_transport_detail */
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
	/* mp_stats at the end, before mp_finalize (--sample prints them) */
	uint64_t peers_known, peers_held;
};

/* What a peer of a followed run is, fixed before it is forked. */
struct fspec {
	int idx, role;
	uint64_t id;
	int npeers;    /* dht: peers mp_init waits for; 0 joins a running run */
	int dht_port;  /* dht: 0 = any */
	int kill;      /* a kill is planned: its death is a loss, not a failure */
	int mode;      /* enum mp_mode */
	int standby;   /* a replacement started ahead: waits for MSG_GO after mp_init */
	char bootstrap[MP_ADDR_STRLEN];
	char fault[4096];
	char log[PATH_MAX];
};

uint64_t peer_id_of(uint64_t seed, int idx);
void follow_fill(const struct bench *b, const struct fspec *s, float *x, size_t count);
int follow_peer(const struct bench *b, const struct fspec *s, const struct chan *up,
		const struct chan *down);
int run_follow(struct bench *b);

/* ------------------------------------------------------------------------ */
/* Settings (options.c)                                                      */

const char *algo_name(int a);
const char *codec_name(int c);
int codec_sparse(int c);
int follow_exact(const struct bench *b);
double replay_rtol(const struct bench *b);
double replay_atol(const struct bench *b);
void grid_format(const struct gridinfo *g, char *buf, size_t len);

/*
 * The settings before the command line: zeroes, the MP_* environment
 * (mp_config_from_env) and mpbench's defaults. Returns mp_config_from_env's
 * result: nonzero for a bad variable, named by mp_last_error.
 */
int bench_init(struct bench *b);

/*
 * The command line over bench_init's settings, and every check of the
 * options and their combinations: the mode (local, followed or
 * multi-host), the sizes, and in local runs the peers, the run name, the
 * grid and what bench_derive derives. Returns 0, with b->help set for
 * --help (nothing after it parsed), or -EINVAL with the message that
 * mpbench prints after "mpbench: " in @err (@errlen bytes; cut to fit).
 *
 * It reads, besides @argv: MP_RUN, the launchers' rank and size variables
 * (OMPI_COMM_WORLD_*, PMI_*, SLURM_PROCID/NTASKS) and, through
 * mp_transport_available, MP_DRIVER_PATH's plugins (loaded once per
 * process); no file, no network, no child. The hostfile is only named
 * here: mp_init reads it. It can be called again and again in one process
 * (it restarts getopt_long) on settings from bench_init; on failure it
 * frees what it allocated, on success bench_free does. @argv is permuted
 * as getopt_long does; the settings point into its strings.
 */
int mpbench_parse(int argc, char **argv, struct bench *b, char *err, size_t errlen);

/* What mpbench_parse and the run allocated in @b. */
void bench_free(struct bench *b);

/* The whole --help text. */
void bench_usage(FILE *f);

/*
 * What depends on the peer count (grid, exactness, tolerance, bus factor,
 * safety limits): 0, or -EINVAL when the grid has fewer cells than
 * @npeers, with the message in @err. mpbench_parse calls it for local
 * runs; run_multi once mp_init knows the peer count.
 */
int bench_derive(struct bench *b, int npeers, char *err, size_t errlen);

/* ------------------------------------------------------------------------ */
/* Launching (launch.c)                                                      */

void describe_status(int status, char *buf, size_t len);
pid_t fork_peer(const char *what, int fds[2]);
int run_local(struct bench *b);
int run_multi(struct bench *b, const char *how);

/* ------------------------------------------------------------------------ */
/* CUDA device memory (cuda.c): 0, or -1 with the reason in @why            */

/* Whether CUDA is usable, found by a child process (the caller never
 * initialises CUDA, so that the peers it forks can): 0 with what was found
 * in @what, or -1 with what is missing. */
int dev_probe(char *what, size_t n);
/* This thread's device: @index mod the device count, made current. */
int dev_open(int index, char *why, size_t n);
void dev_close(void);
int dev_alloc(size_t len, void **p, char *why, size_t n);
void dev_free(void *p);
int dev_htod(void *dst, const void *src, size_t len, char *why, size_t n);
int dev_dtoh(void *dst, const void *src, size_t len, char *why, size_t n);

/* ------------------------------------------------------------------------ */
/* Small helpers (util.c)                                                    */

void die_oom(void);
void *xmalloc(size_t n);
void *xcalloc(size_t n, size_t sz);
int clamp_ms(int64_t ms);

#endif
