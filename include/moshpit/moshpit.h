/* SPDX-License-Identifier: BSD-3-Clause */
/**
 * @file moshpit.h
 * @brief libmoshpit public API: average float vectors across unreliable peers
 *        with Moshpit All-Reduce.
 *
 * A peer creates one context (::mp_ctx) from a configuration, tells it where
 * its peers are, then averages buffers with ::mp_average (blocking) or
 * ::mp_average_start / ::mp_test / ::mp_wait (asynchronous, so training can
 * overlap compute with averaging).
 *
 * Every call that can fail returns 0 (or a count) on success and a negative
 * errno value on failure; ::mp_strerror names the code and ::mp_last_error
 * gives the context's last message in words.
 *
 * Thread safety: a context may be used from one application thread at a time
 * (calls on one context must be serialised by the caller); distinct contexts
 * are fully independent and may be driven from different threads of one
 * process (this is how the `loop` transport simulates many peers). Each
 * context runs one private progress thread that performs the averaging, so an
 * operation started with ::mp_average_start advances while the caller
 * computes. A request may be tested or waited on from any one thread.
 * ::mp_last_error may be called while the progress thread runs (it records
 * the failures of operations meanwhile): the message is copied under a lock.
 */
#ifndef MOSHPIT_MOSHPIT_H
#define MOSHPIT_MOSHPIT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/**
 * Marks a function that libmoshpit.so exports. The library is built with
 * hidden visibility, so only what a public header declares with MP_API
 * leaves the shared object; src/libmoshpit.map then gives each a version
 * node, as liburing's and DPDK's version scripts do. (A version script
 * alone would hide the rest at link time too, but the compiler would still
 * have to treat every internal function as interposable and call it
 * through the PLT; hidden by default lets it bind them directly.)
 */
#if defined(__GNUC__) || defined(__clang__)
#define MP_API __attribute__((visibility("default")))
#else
#define MP_API
#endif

/** Library version, major part. */
#define MP_VERSION_MAJOR 0
/** Library version, minor part. */
#define MP_VERSION_MINOR 1
/** Library version, patch part. */
#define MP_VERSION_PATCH 0

/** Largest number of grid dimensions. */
#define MP_MAX_GRID_DIMS 8
/** Longest textual peer address ("host:port"), including the terminating NUL. */
#define MP_ADDR_STRLEN 128

/** Opaque peer context: one per participating process (or per simulated peer). */
typedef struct mp_ctx mp_ctx;
/** Opaque handle of a registered memory region. */
typedef struct mp_mr mp_mr;
/** Opaque handle of an asynchronous averaging operation. */
typedef struct mp_request mp_request;

/** Where a buffer lives. Transports advertise which kinds they can move. */
enum mp_mem_kind {
	MP_MEM_HOST = 0,   /**< ordinary host memory */
	MP_MEM_CUDA = 1,   /**< CUDA device memory: reduced on the GPU where the codec
	                        kernels can run, else averaged through a pinned host
	                        copy (see ::mp_mem_register) */
	MP_MEM_DMABUF = 2, /**< memory exported as a dma-buf (not supported yet: -ENOTSUP) */
};

/** Averaging algorithm. */
enum mp_algo {
	MP_ALGO_MOSHPIT = 0,   /**< Moshpit All-Reduce on a virtual grid (default) */
	MP_ALGO_RING = 1,      /**< baseline: ring all-reduce over all peers */
	MP_ALGO_BUTTERFLY = 2, /**< baseline: one butterfly group of all peers */
};

/** Codec used on the wire; the values are the stable wire ids. */
enum mp_codec {
	MP_CODEC_NONE = 0,       /**< fp32, uncompressed */
	MP_CODEC_FP16 = 1,       /**< IEEE half precision, round to nearest even, clamped */
	MP_CODEC_BF16 = 2,       /**< bfloat16, round to nearest even, clamped */
	MP_CODEC_UNIFORM8 = 3,   /**< 8-bit, 256 levels over mean ± k·stddev, table of bucket means */
	MP_CODEC_BLOCKWISE8 = 4, /**< 8-bit, one absmax scale per block (default 4096 values) */
	MP_CODEC_TOPK = 5,       /**< the largest fraction of values, with error feedback */
	MP_CODEC_ADACOMP = 6,    /**< AdaComp: per-bin adaptive selection, error feedback */
	MP_CODEC_AUTO = 255,     /**< policy, never on the wire: by buffer size (see doc/codecs.md) */
};

/** A peer's role (DeDLOC). */
enum mp_mode {
	MP_MODE_NORMAL = 0, /**< sends its values and reduces a part */
	MP_MODE_CLIENT = 1, /**< behind NAT: dials out only, sends its values, reduces nothing */
	MP_MODE_AUX = 2,    /**< no values of its own: averages at weight 0 (pass 0), reduces a
			         part, and then holds the group's values like any member */
};

/** Log verbosity, as set by MP_DEBUG=WARN|INFO|TRACE. */
enum mp_log_level {
	MP_LOG_NONE = 0,
	MP_LOG_WARN = 1,
	MP_LOG_INFO = 2,
	MP_LOG_TRACE = 3,
};

/**
 * Peer configuration. Initialise with ::mp_config_init (defaults), optionally
 * apply ::mp_config_from_env, then override fields. Strings are copied by
 * ::mp_init; the caller keeps ownership.
 *
 * Each field names the environment variable that can set it.
 */
struct mp_config {
	size_t size;            /**< sizeof(struct mp_config); set by ::mp_config_init */
	int rank;               /**< MP_RANK: this peer's index in the peer list; -1 = from mpirun/srun */
	int npeers;             /**< MP_NPEERS: number of peers; 0 = from list, hostfile or mpirun/srun */
	const char *peers;      /**< MP_PEERS: comma-separated addresses in rank order ("host:port,...") */
	const char *hostfile;   /**< MP_HOSTFILE: file with one "host[:port]" per line, in rank order */
	const char *listen;     /**< MP_LISTEN: address to listen on; NULL = own entry of the list, or
	                             the transport's default when there is none ("127.0.0.1:0"
	                             for tcp, "loop:*" for loop) */
	const char *run_name;   /**< MP_RUN: run name; peers of another run are rejected */
	const char *transport;  /**< MP_TRANSPORT: "tcp" (default), "loop", another built-in
	                             transport, or a driver registered or loaded from
	                             MP_DRIVER_PATH (moshpit/driver.h) */
	const char *grid;       /**< MP_GRID: "M1xM2x...", NULL = chosen from npeers */
	const char *bandwidths; /**< MP_BANDWIDTHS: comma-separated per-rank part weights; NULL = equal */
	int algo;               /**< MP_ALGO: ::mp_algo ("moshpit", "ring", "butterfly") */
	int rounds;             /**< MP_ROUNDS: Moshpit rounds per average; 0 = number of grid dims */
	int codec;              /**< MP_CODEC: ::mp_codec by name ("none", "fp16", "bf16",
	                             "uniform8", "blockwise8", "topk", "adacomp", "auto"), optionally
	                             with its parameter: "topk:0.05" (see ::mp_codec_parse) */
	size_t chunk_bytes;     /**< MP_CHUNK_BYTES: fp32 bytes per streamed chunk (default 256 KiB) */
	int streams;            /**< MP_NSTREAMS: connections per peer pair; 0 = transport default */
	int window;             /**< MP_WINDOW: chunks in flight per connection and direction (default 4) */
	int connect_timeout_ms; /**< MP_CONNECT_TIMEOUT_MS: give up on an unreachable peer (default 10000) */
	int round_timeout_ms;   /**< MP_ROUND_TIMEOUT_MS: longest silence from a peer within a round (default 10000) */
	int checksum_payload;   /**< MP_CHECKSUM=payload: CRC32C also covers payloads (default header only) */
	int spin_us;            /**< MP_SPIN_US: busy-poll this long after the last progress before
	                             sleeping in the transport (default 0: on shared or oversubscribed
	                             hosts spinning steals the cores peers need) */
	int log_level;          /**< MP_DEBUG: ::mp_log_level; -1 = leave the process-wide level alone */
	unsigned codec_block;   /**< MP_CODEC_BLOCK: blockwise8 values per absmax scale (default 4096) */
	float codec_sigmas;     /**< MP_CODEC_SIGMAS: uniform8 range, mean ± this many standard
	                             deviations (default 6) */
	float topk_ratio;       /**< MP_TOPK_RATIO: fraction of the values topk sends, (0, 1]
	                             (default 0.01) */
	unsigned adacomp_bin;   /**< MP_ADACOMP_BIN: AdaComp bin length L_T; "conv" = 50,
	                             "fc" = 500 (default) */
	/* Control plane (doc/control-plane.md). */
	const char *rendezvous; /**< MP_RENDEZVOUS: "static" (peer list, hostfile, mpirun/srun;
	                             the default) or "dht" (OpenDHT: no list needed) */
	const char *bootstrap;  /**< MP_BOOTSTRAP: dht: "host:port[,host:port...]" of any running
	                             peers' DHT nodes; NULL = this peer starts the run */
	int dht_port;           /**< MP_DHT_PORT: dht: UDP port of this peer's DHT node (0 = any) */
	int mode;               /**< MP_MODE: ::mp_mode ("normal", "client", "aux") */
	double bandwidth;       /**< MP_BANDWIDTH: this peer's bandwidth in any unit the run shares
	                             (say Mbit/s), sizing its part; < 0 unknown (default) */
	const char *run_key;    /**< MP_RUN_KEY: the run's secret; peers without it are refused */
	const char *run_key_file; /**< MP_RUN_KEY_FILE: file holding the secret (used when run_key
	                             is NULL). With neither, the key derives from the run name and
	                             the run is open to anyone who knows it (logged) */
	uint64_t peer_id;       /**< MP_PEER_ID: this peer's id (hex); 0 = random (dht) or the rank */
	int group_size;         /**< MP_GROUP_SIZE: target group size; 0 = the grid's size along the
	                             varied dimension */
	int min_group_size;     /**< MP_MIN_GROUP_SIZE: smallest group a leader starts (default 2) */
	int matchmaking_ms;     /**< MP_MATCHMAKING_MS: a declaration's lifetime: how long a leader
	                             waits for its group to fill (default 5000) */
	int request_timeout_ms; /**< MP_REQUEST_TIMEOUT_MS: a follower's wait for the leader's answer
	                             (default 3000) */
	int allreduce_timeout_ms; /**< MP_ALLREDUCE_TIMEOUT_MS: longest group all-reduce; members
	                             still missing are dropped (default 60000) */
	int record_ttl_ms;      /**< MP_RECORD_TTL_MS: dht: membership record lifetime, refreshed
	                             every third of it; a dead peer vanishes within it (default 15000) */
	int join_timeout_ms;    /**< MP_JOIN_TIMEOUT_MS: dht: how long ::mp_init waits to see npeers
	                             peers when npeers is set (default 30000) */
	uint64_t min_part;      /**< MP_MIN_PART: smallest part (values) a reducer gets; smaller parts
	                             go to the others (default 0) */
	const char *contrib_log;/**< MP_CONTRIB_LOG: file this peer appends its rounds to: groups,
	                             contributions reduced, parts applied (doc/control-plane.md) */
	const char *fault;      /**< MP_FAULT: fault injection for tests (doc/control-plane.md) */
	int balance;            /**< MP_BALANCE: ::mp_balance, where part sizes come from
	                             ("configured", the default, or "measured") */
	int check_finite;       /**< MP_CHECK_FINITE=1: a reducer leaves out of its part a
	                             contribution that holds NaN or infinity (its sender is told,
	                             see ::mp_average); in a direct exchange (direct_max) every
	                             member leaves out such a sender's whole vector, and the
	                             sender its own; moshpit and butterfly only; every peer of a
	                             run must set it alike (default 0). Added at the end: the
	                             struct only grows, and ::mp_config_init sets size */
	int probe_min_ms;       /**< MP_PROBE_MIN_MS: static runs: a down peer is probed in the
	                             background this long after it failed, then after twice as
	                             long per failed probe (doc/design.md, "Failure memory");
	                             10 to 3600000 (default 1000). A local setting: peers of a
	                             run need not agree on it (a peer may probe less often) */
	int probe_max_ms;       /**< MP_PROBE_MAX_MS: the longest interval the probes of a down
	                             peer back off to; probe_min_ms to 3600000 (default 30000).
	                             Local, as probe_min_ms */
	size_t direct_max;      /**< MP_DIRECT_MAX: vectors of at most this many bytes (and at most
	                             one chunk) are averaged by a direct exchange inside each group
	                             (ring and butterfly: among all peers): every member sends its
	                             whole vector to every other and sums what it receives, one hop
	                             instead of two or 2(N-1); codec none only, not in runs with a
	                             sparse codec, not in groups with clients (doc/design.md,
	                             "Short vectors"). 0 switches it off; at most 256 MiB (default
	                             MP_DIRECT_MAX_DEFAULT). Every peer of a run must set it alike */
	int max_handshakes;     /**< MP_MAX_HANDSHAKES: incoming connections this peer holds at
	                             once before they authenticate (1 to 65536, default
	                             MP_MAX_HANDSHAKES_DEFAULT). One more closes the oldest of
	                             them, first among those that have not sent a whole HELLO,
	                             so that connections opened and held, or fed a byte at a time,
	                             by a stranger cost at most this many slots (each a HELLO
	                             buffer and the transport's per-connection buffer: 33 KiB
	                             with tcp) and never shut a peer out; each is also closed at
	                             connect_timeout_ms. Counted in ::mp_stats. Local: peers of a
	                             run need not agree */
	int cuda_stage;         /**< MP_CUDA_STAGE=1: stage CUDA memory whole through pinned host
	                             memory even where the device path could reduce it on the GPU
	                             (see ::mp_mem_register): to compare the two, or to step
	                             around the device path. Local: peers need not agree
	                             (default 0) */
	uint64_t state_rate;    /**< MP_STATE_RATE: the most bytes per second this peer's state
	                             service (::mp_state_serve) sends to each download (K, M, G
	                             suffixes: powers of 1024), so that joiners leave its
	                             averaging the bandwidth it needs; 0 unlimited (default).
	                             Local: peers need not agree */
	int direct_pairs;       /**< MP_DIRECT_PAIRS: in groups of 4 and of 8 to 64 members, the short
	                             vectors of direct_max go by a pairwise exchange (recursive
	                             doubling) instead of the direct exchange: log2(k) frames
	                             and waits per member instead of k-1, about 40% less time
	                             on hosts with fewer cores than peers (doc/performance.md).
	                             A member that dies mid-exchange leaves out of a survivor's
	                             result the members whose sums it held, for that average
	                             and, in a static run, the next one or two, after which its
	                             line's members agree to leave it out (doc/design.md,
	                             "Short vectors"). 0 or 1 (default 1). Every peer of a run
	                             must set it alike */
};

/** Default of ::mp_config::max_handshakes: a run's own peers dialling at
 * once (a few connections per peer) stay well within it. */
#define MP_MAX_HANDSHAKES_DEFAULT 256

/** Default of ::mp_config::direct_max, in bytes. */
#define MP_DIRECT_MAX_DEFAULT (16u * 1024)

/** Where a group's part sizes come from (MP_BALANCE). */
enum mp_balance {
	MP_BALANCE_CONFIGURED = 0, /**< MP_BANDWIDTHS / MP_BANDWIDTH (equal parts without them) */
	MP_BALANCE_MEASURED = 1,   /**< the throughput each member measured on earlier
	                                exchanges (bytes sent over the time it had a send in
	                                flight), which it sends its group (RATE) before
	                                every group all-reduce: DeDLOC's balancer fed at run
	                                time (doc/design.md) */
};

/** Counters of one averaging operation. */
struct mp_result {
	int rounds;              /**< rounds (group all-reduces or ring passes) completed */
	int peers;               /**< peers whose contributions reached this result: exact for ring and
	                              butterfly and for d rounds on a full grid; in general the product of
	                              the live group sizes of the rounds, capped at the peer count */
	float weight;            /**< this peer's weight after averaging (Σw of its last group / its size) */
	uint64_t bytes_sent;     /**< payload and header bytes this peer sent */
	uint64_t bytes_received; /**< payload and header bytes this peer received */
	uint64_t frames_rejected;/**< malformed, foreign or unexpected frames dropped */
	int failed_peers;        /**< peers dropped in this operation (timeouts, errors, bad frames),
	                              and those a reducer dropped from a part this peer applied
	                              while this peer kept them: 0 means every part of the result
	                              is over the same contributors */
	int codec;               /**< ::mp_codec the operation used (what "auto" chose) */
	uint64_t values_sent;    /**< fp32 values carried by the frames this peer sent: the
	                              compression ratio on the wire is
	                              4 * values_sent / bytes_sent (headers included) */
	int rounds_alone;        /**< rounds in which no group formed (values kept as they were),
	                              including those a dht peer sat out to catch up with a run
	                              that was ahead (at most 2 more than MP_ROUNDS a call) */
	int group_size;          /**< members of the last round's group (this peer included) */
};

/**
 * Fill @p cfg with defaults: tcp, Moshpit, automatic grid, codec none,
 * rank -1, run "moshpit", 256 KiB chunks, 10 s timeouts.
 * @param cfg configuration to initialise (not NULL)
 */
MP_API void mp_config_init(struct mp_config *cfg);

/**
 * Override fields of @p cfg from MP_* environment variables that are set.
 * String fields then point into the environment (valid while it is unchanged).
 * @param cfg configuration initialised by ::mp_config_init
 * @return 0, or -EINVAL if a variable has an unparsable or out-of-range
 *         value: every one is logged at WARN, and ::mp_last_error (NULL)
 *         names the first (variable, value and what was expected, as in
 *         "MP_CODEC=topk:5: topk ratio 5 out of range (0, 1]") whatever
 *         MP_DEBUG is
 */
MP_API int mp_config_from_env(struct mp_config *cfg);

/**
 * Create a peer context: checks the configuration, starts the transport and
 * listens. When the configuration names all peers (peers, hostfile, or an
 * mpirun/srun rank with a hostfile) the peer list is set as well; otherwise
 * call ::mp_set_peers before averaging.
 * @param cfg configuration (not NULL)
 * @param[out] out new context
 * @return 0; -EINVAL for a bad configuration; -ENOENT for an unknown transport;
 *         -EADDRINUSE / other negative errno from the transport; -ENOMEM
 */
MP_API int mp_init(const struct mp_config *cfg, mp_ctx **out);

/**
 * This peer's listening address as text, to hand to the other peers out of
 * band (for example through mpbench's launcher, a file, or a control plane).
 * @param ctx context
 * @param buf destination
 * @param len size of @p buf; ::MP_ADDR_STRLEN always suffices
 * @return 0, or -ENOSPC if @p buf is too small
 */
MP_API int mp_local_address(mp_ctx *ctx, char *buf, size_t len);

/**
 * What the transport chose where the configuration left it a choice, as
 * space-separated `key=value` pairs, for logs and reports: for `ofi`
 * "provider=net domain=lo fabric=127.0.0.1/32", for `verbs`
 * "device=mlx5_0 port=1 link=RoCE gid_index=3", for `dpdk`
 * "port=0 driver=net_memif queues=1 mtu=1500". Values hold no spaces.
 * Empty for transports with nothing to choose (`tcp`, `loop`).
 * Thread-safe; valid from ::mp_init to ::mp_finalize.
 * @param ctx context
 * @param buf destination
 * @param len size of @p buf; 256 always suffices for the built-in transports
 * @return the length written (without the NUL), -EINVAL for a NULL
 *         argument or @p len 0, -ENOSPC if @p buf is too small (it then
 *         holds "")
 */
MP_API int mp_transport_detail(mp_ctx *ctx, char *buf, size_t len);

/**
 * Set the addresses of all peers, in rank order (this peer's own entry included).
 * May be called once, before the first average.
 * @param ctx context
 * @param addrs @p n addresses as produced by ::mp_local_address
 * @param n number of peers; must equal the configured npeers when that was set
 * @return 0; -EINVAL (bad count or address); -EBUSY if already set
 */
MP_API int mp_set_peers(mp_ctx *ctx, const char *const *addrs, int n);

/**
 * This peer's rank. Static runs: its place in the peer list. Dht runs: the
 * index of its id among the sorted ids of the members it saw when it
 * placed itself, which with npeers (MP_NPEERS) is in ::mp_init, so that the
 * starting set has the distinct ranks 0..npeers-1; without npeers it is 0
 * until the first average places the peer. A peer that joins later gets its
 * index among the members it sees then, which may repeat a rank: use
 * ::mp_peer_id for identity. It does not change as peers come and go.
 * @param ctx context @return rank (>= 0)
 */
MP_API int mp_rank(const mp_ctx *ctx);
/**
 * Number of peers. Static runs: the list's length. Dht runs: the members
 * seen when this peer placed itself (see ::mp_rank; 1 before that), not
 * updated as peers come and go.
 * @param ctx context @return peer count (>= 1)
 */
MP_API int mp_npeers(const mp_ctx *ctx);

/**
 * Stop the progress thread, close connections, free everything. Operations
 * still in flight are cancelled, and requests not yet completed with
 * ::mp_test or ::mp_wait are released: their handles are invalid afterwards.
 * So are registrations not released with ::mp_mem_deregister: they are
 * released here (CUDA streams that wait for a request with
 * ::mp_request_stream_wait are let go first).
 * @param ctx context, or NULL (no-op)
 * @return 0
 */
MP_API int mp_finalize(mp_ctx *ctx);

/**
 * Register a buffer with the transport (pins, or creates an RDMA memory
 * region). Averaging a registered buffer avoids per-call registration:
 * pass the handle, or none: an average passed no handle uses a host
 * registration of this function's that covers its buffer (and keeps it from
 * ::mp_mem_deregister, -EBUSY, while it runs).
 *
 * CUDA device memory (::MP_MEM_CUDA) takes one of two paths, and one INFO
 * line says which, and why:
 *  - The device path, where the library was built with the CUDA kernels
 *    and they run on the memory's GPU, for every algorithm and codec
 *    (the sparse ones keep their error feedback on the GPU too;
 *    ::mp_config::check_finite included: the check runs on the GPU):
 *    chunks are encoded, decoded and
 *    reduced on the GPU, and only encoded chunks cross the bus, through a
 *    ring of 32 pinned host buffers of one encoded chunk each
 *    (::mp_config::chunk_bytes), whatever @p len. Results are the host
 *    path's bit for bit for none, fp16, bf16 and blockwise8; uniform8's
 *    GPU encoder sums its statistics in another fixed order, so a code may
 *    differ by one next to a bucket edge (doc/design.md, "The device
 *    path"). Short vectors (::mp_config::direct_max) are averaged in one of
 *    those buffers. A transport that moves device memory (verbs, through
 *    dma-buf or nvidia-peermem) registers the device side of that ring,
 *    and the chunks then go between the NIC and GPU memory with no host
 *    copy (GPUDirect RDMA; not with ::mp_config::checksum_payload).
 *  - Otherwise the memory is staged whole through host memory, because the
 *    reducer then runs on the CPU: the registration allocates a pinned
 *    host copy of @p len bytes and registers the copy with the transport.
 *    A transport that can move device memory (verbs with GPUDirect RDMA)
 *    also registers the device memory itself. The CUDA driver (libcuda.so.1)
 * is loaded at the first such registration; the library does not link it.
 * The memory must stay allocated, in a live CUDA context, until
 * ::mp_mem_deregister. ::mp_mem_path says which way the registration took,
 * and its INFO line why.
 * @param ctx context
 * @param buf start of the region
 * @param len length in bytes (> 0)
 * @param kind where the memory lives
 * @param[out] out handle
 * @return 0; -EINVAL (also ::MP_MEM_CUDA for memory that CUDA does not know
 *         as device memory, or a range that leaves its allocation); -ENOTSUP
 *         for ::MP_MEM_CUDA when the CUDA driver (libcuda.so.1) cannot be
 *         loaded or finds no GPU, or in a build configured with
 *         -Dcuda=disabled, and for ::MP_MEM_DMABUF (taken by no transport
 *         today); -ENOMEM (also: no pinned memory for the host copy). On
 *         failure ::mp_last_error says why.
 */
MP_API int mp_mem_register(mp_ctx *ctx, void *buf, size_t len, enum mp_mem_kind kind, mp_mr **out);

/** How the averages of a registration move and reduce its memory (::mp_mem_path). */
enum mp_mem_path {
	MP_MEM_PATH_HOST = 0,      /**< host memory, read and written in place */
	MP_MEM_PATH_STAGED = 1,    /**< device memory copied whole to a pinned host copy and
	                                back, reduced by the CPU (no usable kernels, or
	                                MP_CUDA_STAGE=1) */
	MP_MEM_PATH_DEVICE = 2,    /**< reduced on the GPU; encoded chunks cross the bus
	                                through a few pinned host buffers */
	MP_MEM_PATH_GPUDIRECT = 3, /**< reduced on the GPU; chunks move between the NIC and
	                                GPU memory with no host copy (GPUDirect RDMA) */
};

/**
 * Which way the averages of a registration go, as its INFO line at
 * ::mp_mem_register says (NCCL's users read "via GDRDMA" the same way).
 * @param mr handle from ::mp_mem_register
 * @param[out] why where there is a choice, the reason in words, NUL-terminated
 *             (the INFO line's: "transport tcp cannot move device memory");
 *             may be NULL
 * @param len bytes at @p why
 * @return an ::mp_mem_path, or -EINVAL for a NULL @p mr
 */
MP_API int mp_mem_path(const mp_mr *mr, char *why, size_t len);

/**
 * Release a registration. The buffer must not be in use by an operation.
 * For ::MP_MEM_CUDA memory it first waits for a copy still queued on the
 * registration's stream (the copy in of an average that gave up waiting for
 * the caller's stream, see ::mp_average_start_stream), at most
 * ::mp_config::round_timeout_ms; past that the pinned host copy is left
 * allocated, with a warning, since the device may still write it.
 * @param ctx context
 * @param mr handle from ::mp_mem_register, or NULL (no-op)
 * @return 0, or -EBUSY while an operation uses it
 */
MP_API int mp_mem_deregister(mp_ctx *ctx, mp_mr *mr);

/**
 * Start averaging @p count fp32 values in place with weight @p weight. All
 * peers must average buffers of the same count in the same order. The buffer
 * must not be touched until the request completes.
 *
 * CUDA memory is averaged only with its ::MP_MEM_CUDA registration in @p mr
 * (with @p mr NULL the buffer is taken for host memory). Its values must be
 * ready when the operation starts: the copy out of device memory waits for
 * the work queued on the legacy default stream by then, as a copy on that
 * stream would, which includes work on blocking streams but not work on
 * non-blocking ones (PyTorch's streams are non-blocking: give the stream to
 * ::mp_average_start_stream instead). On the device path the progress
 * thread waits for that work when the operation starts (polling, at most
 * ::mp_config::round_timeout_ms: past it -EIO, the buffer as it was), then
 * reads and writes the device buffer on the registration's own stream: it
 * is written at the end of each round, as host memory would be, so a
 * failure keeps the rounds completed before it (after -EBADE and
 * -EMSGSIZE the buffer is put back, as host memory's is), and a device
 * failure fails the operation with -EIO, naming what failed, with the
 * buffer as the failing round found it. When staged whole, the progress
 * thread queues the copy of
 * the values into the registration's host copy when the operation starts,
 * and of the result back when it ends, each time on the registration's own
 * CUDA stream in the memory's own CUDA context, and waits for each (polling,
 * at most ::mp_config::round_timeout_ms: past it the operation fails with
 * -EIO); the request completes after the copy back: when ::mp_test or
 * ::mp_wait reports it, the result is in device memory. The device buffer is
 * written only then; an operation that fails leaves it as it was (host
 * memory, in contrast, may keep the rounds completed before the failure,
 * except after -EBADE and -EMSGSIZE: see ::mp_wait), unless the copy back is
 * what failed (-EIO): CUDA does not say how much of the buffer it wrote.
 * @param ctx context
 * @param buf values, replaced with the (weighted) average
 * @param count number of floats (> 0)
 * @param weight this peer's weight (>= 0, finite; 1 for a plain mean): NaN,
 *        infinite or negative is -EINVAL before anything is sent, said in
 *        ::mp_last_error
 * @param mr registration covering @p buf, or NULL (a host registration of
 *        ::mp_mem_register's that covers it, else registered internally)
 * @param[out] req request to test or wait on
 * @return 0; -EINVAL (also a buffer that is not float-aligned within its CUDA
 *         registration); -ENOTCONN if peers are not set; -ENOTSUP for a
 *         dma-buf registration (no device reducer); -ENOMEM
 *
 * NaN and infinity in @p buf are not checked by default: they are averaged
 * like any value, so one peer's NaN reaches every result its values reach
 * (the mean of a part holding it is NaN). With ::mp_config::check_finite
 * (MP_CHECK_FINITE=1) a reducer leaves such a contribution out instead.
 */
MP_API int mp_average_start(mp_ctx *ctx, float *buf, size_t count, float weight, mp_mr *mr,
			    mp_request **req);

/**
 * Check a request without blocking. When it is done the request is released
 * and must not be used again.
 * @param req request
 * @param[out] done set to 1 when complete
 * @param[out] res counters of the operation (may be NULL); filled when done
 * @return 0 while running or on success; a negative errno if the operation
 *         failed (-ETIMEDOUT, -ECONNREFUSED, -EPROTO, -ECANCELED, -EIO when a
 *         copy of staged CUDA memory failed or did not run within
 *         ::mp_config::round_timeout_ms, ...); -EBADE when a peer it needed
 *         runs with other run-shared settings (grid, codec, ...: refused at
 *         connect) or sends this average otherwise (::MP_AVG_UNCOMPRESSED on
 *         one side only), -EMSGSIZE when a peer averages another number of
 *         values: ::mp_last_error names the peer, the field or the counts and
 *         both values, and nothing of the exchange that met it was applied
 *         (see ::mp_wait)
 */
MP_API int mp_test(mp_request *req, int *done, struct mp_result *res);

/**
 * Wait for a request to complete, then release it.
 * @param req request
 * @param timeout_ms longest wait; negative = the context's own deadlines only,
 *        and a request not started yet (nothing queued ahead of it, the
 *        progress thread idle) is then run by the waiting thread itself
 * @param[out] res counters of the operation (may be NULL)
 * @return 0; -ETIMEDOUT if @p timeout_ms passed (the request stays valid;
 *         operations themselves never fail with -ETIMEDOUT: a peer that times
 *         out is dropped and counted in mp_result::failed_peers); or the
 *         operation's negative errno. -EBADE (mp_strerror: "settings differ
 *         from a peer's", also a peer that sends this average uncompressed
 *         where this one compresses it, or the reverse: ::MP_AVG_UNCOMPRESSED)
 *         and -EMSGSIZE (another length) end the average at
 *         the exchange that meets the peer, with nothing of that exchange
 *         applied, and the buffer, its error-feedback residue and the
 *         result's weight as they were passed, also when a later moshpit
 *         round meets the peer: such an average copies the buffer before
 *         its first round while a later groupmate has not yet agreed on the
 *         settings and this length over the connection still open, and
 *         puts it back. Without that copy (the steady state), a groupmate
 *         that disagrees in a later round anyway is dropped from the round
 *         like a failed peer and the average does not fail (doc/design.md,
 *         "Two disagreements")
 */
MP_API int mp_wait(mp_request *req, int timeout_ms, struct mp_result *res);

/**
 * Blocking convenience: ::mp_average_start then ::mp_wait, for host memory
 * (CUDA memory needs its registration: ::mp_average_start). With nothing
 * queued and the progress thread idle, the average runs on the calling
 * thread: two thread hand-offs fewer per call (doc/design.md).
 * @param ctx context
 * @param buf values, replaced with the average
 * @param count number of floats
 * @param weight this peer's weight
 * @param[out] res counters (may be NULL)
 * @return as ::mp_average_start and ::mp_wait
 */
MP_API int mp_average(mp_ctx *ctx, float *buf, size_t count, float weight, struct mp_result *res);

/**
 * Flag of ::mp_average_start_ex and ::mp_average_ex: send this average
 * uncompressed (codec none), whatever codec the context is configured with,
 * "auto" included, for this call only. Exact to fp32 where the codec would
 * round, at the codec's bandwidth saving: for small side averages that must
 * be exact (counters, one-hot vectors), not for the training tensors. The
 * buffer's error-feedback residue (sparse codecs) is neither used nor
 * changed.
 *
 * Peers must agree per average: each channel's OPEN frame carries the codec
 * the average sends (doc/protocol.md), so a peer that averages compressed
 * against one that averages uncompressed fails with -EBADE on both sides,
 * ::mp_last_error naming the peer and both ways ("peer 1 averages
 * uncompressed (codec none), this peer with uniform8"), and nothing of that
 * exchange is applied, as for a length that differs (see ::mp_wait). Where
 * the configured codec is none, or "auto" picks none for the length, the
 * flag changes nothing and peers that differ in it agree.
 */
#define MP_AVG_UNCOMPRESSED 0x1u

/**
 * Flag of ::mp_average_start_ex, ::mp_average_start_stream and
 * ::mp_average_ex: as ::mp_average_flush, with a registration and without
 * blocking. The
 * buffer's error-feedback residue (sparse codecs) is added to it and
 * cleared, and the average is sent uncompressed (so all peers flush
 * together, as ::MP_AVG_UNCOMPRESSED). For host memory the residue is
 * added when the call returns; for CUDA memory (an ::MP_MEM_CUDA
 * registration), when the operation runs: on the GPU where the residue
 * lives there (the device path), else in the pinned host copy. A buffer
 * with no residue is averaged uncompressed as it is. -EBUSY while another
 * average of the buffer is in flight.
 */
#define MP_AVG_FLUSH 0x2u

/**
 * ::mp_average_start with flags.
 * @param ctx context
 * @param buf values, replaced with the (weighted) average
 * @param count number of floats (> 0)
 * @param weight this peer's weight (as ::mp_average_start)
 * @param mr registration covering @p buf, or NULL
 * @param flags 0 (then exactly ::mp_average_start), ::MP_AVG_UNCOMPRESSED
 *        or ::MP_AVG_FLUSH
 * @param[out] req request to test or wait on
 * @return as ::mp_average_start; -EINVAL also for an unknown flag bit (said
 *         in ::mp_last_error), before anything is sent
 */
MP_API int mp_average_start_ex(mp_ctx *ctx, float *buf, size_t count, float weight, mp_mr *mr,
			       unsigned flags, mp_request **req);

/**
 * ::mp_average_start_ex for CUDA memory whose values a CUDA stream is still
 * computing: the average reads the buffer only once the work queued on
 * @p stream before this call has run, so the caller need not synchronise
 * the stream first (PyTorch: pass torch.cuda.current_stream().cuda_stream).
 * An event is recorded on @p stream here, on the calling thread, in the
 * memory's CUDA context; the copy into the host copy is queued, when the
 * operation starts, on the registration's own stream behind a wait for that
 * event. Work queued on @p stream after this call does not wait for the
 * average: it must leave the buffer alone until the request completes, or
 * wait for it with ::mp_request_stream_wait. Everything else is as for
 * ::mp_average_start: the progress thread waits for the copy at most
 * ::mp_config::round_timeout_ms (then -EIO, the buffer as it was: the other
 * peers have dropped this one by then), the device buffer is written once,
 * with the result, and not on failure.
 * @param ctx context
 * @param buf values in CUDA memory, replaced with the (weighted) average
 * @param count number of floats (> 0)
 * @param weight this peer's weight (as ::mp_average_start)
 * @param mr the ::MP_MEM_CUDA registration covering @p buf (required)
 * @param flags 0, ::MP_AVG_UNCOMPRESSED or ::MP_AVG_FLUSH (as ::mp_average_start_ex)
 * @param stream the CUstream or cudaStream_t, cast to void *, that computes
 *        the buffer: of the memory's CUDA context (for the runtime, the
 *        device's primary context); NULL is the legacy default stream
 * @param[out] req request to test or wait on
 * @return as ::mp_average_start_ex; -EINVAL also without an ::MP_MEM_CUDA
 *         registration in @p mr, or for a stream of another CUDA context
 *         (said in ::mp_last_error; nothing is started)
 */
MP_API int mp_average_start_stream(mp_ctx *ctx, float *buf, size_t count, float weight, mp_mr *mr,
				   unsigned flags, void *stream, mp_request **req);

/**
 * Make a CUDA stream wait, on the device and without blocking the calling
 * thread, until an average of CUDA memory has ended: work queued on
 * @p stream after this call runs once the result is in the device buffer,
 * or once the average failed or was cancelled (then the buffer is as
 * ::mp_average_start says, and ::mp_wait or ::mp_test reports the error).
 * The stream waits on a word of pinned host memory (cuStreamWaitValue32)
 * that the library sets when the request ends, every way it can end,
 * ::mp_finalize included. The request must still be completed with
 * ::mp_test or ::mp_wait, which releases it; call this before then, as many
 * times as there are streams to hold. The registration must stay
 * registered until @p stream has passed the wait (for instance, until an
 * event recorded after it completes): the word belongs to it.
 * @param req a request of ::mp_average_start, ::mp_average_start_ex or
 *        ::mp_average_start_stream on an ::MP_MEM_CUDA registration, not
 *        yet released
 * @param stream the CUstream or cudaStream_t, cast to void *, of the
 *        memory's CUDA context; NULL is the legacy default stream
 * @return 0; -EINVAL for NULL, a request of host memory or a stream of
 *         another context; -ENOTSUP where the device or the CUDA driver has
 *         no stream memory operations (CUDA 11 drivers without
 *         NVreg_EnableStreamMemOPs=1, drivers before 11.7): wait with
 *         ::mp_wait or ::mp_test instead; -EIO when the driver refuses.
 *         ::mp_last_error says why; the request is unchanged.
 */
MP_API int mp_request_stream_wait(mp_request *req, void *stream);

/**
 * ::mp_average with flags: ::mp_average_start_ex then ::mp_wait.
 * @param ctx context
 * @param buf values, replaced with the average
 * @param count number of floats
 * @param weight this peer's weight
 * @param flags 0, ::MP_AVG_UNCOMPRESSED or ::MP_AVG_FLUSH
 * @param[out] res counters (may be NULL); mp_result::codec says what the
 *        average sent (none with ::MP_AVG_UNCOMPRESSED and ::MP_AVG_FLUSH)
 * @return as ::mp_average_start_ex and ::mp_wait
 */
MP_API int mp_average_ex(mp_ctx *ctx, float *buf, size_t count, float weight, unsigned flags,
			 struct mp_result *res);

/**
 * Split @p total values into parts for @p n reducers by bandwidth, as
 * DeDLOC's linear program does: minimise the largest time any peer spends,
 * (1 + (n-2)·w_i)/b_i for shares w_i that sum to 1, with w_i = 0 for client
 * peers (bandwidth 0). Parts below @p min_part are dropped and the rest solved
 * again, one peer at a time, slowest first (the fastest is never dropped).
 * Deterministic: the same inputs give the same parts on every host.
 * @param total values to split
 * @param bandwidth @p n bandwidths: > 0 known, 0 client (no part), < 0
 *        unknown (the mean of the known ones; all unknown: equal parts)
 * @param n number of peers (>= 1)
 * @param min_part smallest part worth giving (0 = any)
 * @param[out] parts @p n part sizes, summing to @p total
 * @return 0; -EINVAL (bad arguments, NaN or infinite bandwidth, or every
 *         peer a client while @p total > 0); -ENOMEM
 */
MP_API int mp_balance_parts(uint64_t total, const double *bandwidth, int n, uint64_t min_part,
			    uint64_t *parts);

/** A peer's state as ::mp_peers_info reports it. */
enum mp_peer_state {
	MP_PEER_LIVE = 0, /**< nothing failed with it since it last made progress (or never tried) */
	MP_PEER_DOWN = 1, /**< the last exchange with it dropped it (refused, timed out, cut)
	                       and nothing has moved with it since */
	MP_PEER_GONE = 2, /**< said BYE, or its record expired (dht): never dialled again */
	MP_PEER_SELF = 3, /**< this peer */
};

/**
 * One peer as this context knows it (::mp_peers_info). Fields are only ever
 * appended: a program built against an older header passes its own
 * sizeof(struct mp_peer_info) and gets the fields it knows.
 */
struct mp_peer_info {
	uint64_t id;               /**< the rank in a static run; the peer id with the dht */
	int rank;                  /**< static runs: its rank; -1 with the dht rendezvous */
	int mode;                  /**< ::mp_mode */
	int state;                 /**< ::mp_peer_state */
	int failures;              /**< exchanges that dropped it so far */
	char addr[MP_ADDR_STRLEN]; /**< its address ("" unknown, e.g. a client) */
	double since_progress_s;   /**< seconds since a frame last moved with it; -1 never */
	double bandwidth_Bps;      /**< bytes moved with it per second while a transfer with it
	                                was active, moving average over exchanges; for
	                                ::MP_PEER_SELF the bytes this peer sent over the time
	                                it had a send in flight (its own throughput, the
	                                figure of MP_BALANCE=measured; sends only, weighted
	                                1/16); 0 not measured yet */
	double rtt_s;              /**< handshake round trip (our message to its answer),
	                                moving average over connections; 0 not measured yet */
	uint64_t bytes_sent;       /**< bytes of frames sent to it (headers included) */
	uint64_t bytes_received;   /**< bytes of frames received from it */
	double rate_Bps;           /**< MP_BALANCE=measured: the throughput it sent in its last
	                                RATE, which sized its part; for ::MP_PEER_SELF the one
	                                this peer sent; 0 none */
	double weight;             /**< its configured part weight (MP_BANDWIDTHS, MP_BANDWIDTH);
	                                < 0 unknown, 0 client */
};

/**
 * List the peers with their state and what real exchanges measured of
 * them, in peer-table order (static runs: rank order; this peer included).
 * Safe while an operation runs: it reads a copy that the progress thread
 * refreshes at the end of every exchange and every 100 ms within one, so
 * figures may be that old (since_progress_s is computed at the call).
 * @param ctx context
 * @param[out] out room for @p max entries, @p elem_size bytes apart (NULL if
 *        @p max is 0)
 * @param max entries @p out can hold (>= 0)
 * @param elem_size sizeof(struct mp_peer_info) as the caller knows it (at
 *        least up to and including @c addr)
 * @return the number of peers known, which may exceed @p max (then only
 *         @p max are written); -EINVAL for bad arguments
 */
MP_API int mp_peers_info(mp_ctx *ctx, struct mp_peer_info *out, int max, size_t elem_size);

/**
 * Counters of a context since ::mp_init (::mp_stats): what strangers and
 * misbehaving peers cost it. Fields are only ever appended.
 */
struct mp_stats {
	uint64_t frames_rejected;      /**< frames dropped as malformed, foreign, stale or
	                                    unexpected, handshakes included (the sum of every
	                                    operation's mp_result::frames_rejected and those
	                                    met between operations) */
	uint64_t conns_accepted;       /**< incoming connections taken from the listener */
	uint64_t conns_authenticated;  /**< ... that proved the run key */
	uint64_t conns_refused;        /**< ... closed for a bad handshake frame (malformed,
	                                    another run, a wrong MAC: a replayed AUTH) */
	uint64_t conns_timed_out;      /**< ... closed with no whole handshake within
	                                    mp_config::connect_timeout_ms (held open, or fed
	                                    slowly) */
	uint64_t conns_evicted;        /**< ... closed to make room: mp_config::max_handshakes
	                                    were already in their handshake */
	uint64_t conns_hung_up;        /**< ... closed by the other side before authenticating,
	                                    or broken before it could (a receive or send that
	                                    failed to start, no memory for its handshake): every
	                                    accepted connection ends under one of these five */
	uint64_t handshakes_pending;   /**< connections in their handshake now */
	uint64_t handshakes_max;       /**< the most in their handshake at once (at most
	                                    mp_config::max_handshakes) */
	uint64_t peers_known;          /**< peers this context has learned, itself included
	                                    (a dht run keeps every one it ever learned: a
	                                    table entry of a few hundred bytes each) */
	uint64_t peers_held;           /**< peers it holds connection state for now (their
	                                    connection slots, and while a control connection
	                                    is up its receive buffer): those that left or
	                                    whose record expired hold none */
	uint64_t state_served;         /**< state service (::mp_state_serve): version queries
	                                    answered and downloads sent whole */
	uint64_t state_refused;        /**< ... clients refused: they did not prove the run
	                                    key (they got a nonce and nothing else), or sent
	                                    nonsense */
	uint64_t state_cut;            /**< ... downloads that ended early: the client went
	                                    away or stalled, or the service stopped */
	uint64_t state_busy;           /**< ... connections closed at once because
	                                    MP_STATE_MAX_ACTIVE downloads were running */
};

/**
 * Read the context's counters. Safe from any thread while operations run.
 * @param ctx context
 * @param[out] out filled with up to @p size bytes
 * @param size sizeof(struct mp_stats) as the caller knows it (at least up to
 *        and including @c conns_accepted)
 * @return 0; -EINVAL for bad arguments
 */
MP_API int mp_stats(mp_ctx *ctx, struct mp_stats *out, size_t size);

/**
 * This peer's id: the rank in a static run, random (or MP_PEER_ID) with the
 * DHT rendezvous. @param ctx context @return id
 */
MP_API uint64_t mp_peer_id(const mp_ctx *ctx);

/**
 * Address of this peer's DHT node, "host:port", for other peers'
 * --bootstrap / MP_BOOTSTRAP.
 * @return 0; -ENOTSUP without the dht rendezvous; -ENOSPC if @p len is too small
 */
MP_API int mp_dht_address(mp_ctx *ctx, char *buf, size_t len);

/**
 * Leave the run in an orderly way: tell connected peers (BYE) and the
 * rendezvous (a bye record), so that nobody waits for this peer. Averaging
 * afterwards fails with -ESHUTDOWN; ::mp_finalize calls it if needed.
 * @return 0
 */
MP_API int mp_leave(mp_ctx *ctx);

/**
 * Parse a mode name. @param s "normal", "client" or "aux"
 * @return ::mp_mode value, or -EINVAL
 */
MP_API int mp_mode_from_name(const char *s);

/**
 * Name of a negative errno returned by this library.
 * @param err negative errno
 * @return static string
 */
MP_API const char *mp_strerror(int err);

/**
 * The context's last error message in words (empty if none).
 *
 * Thread safety: the progress thread records the failures of operations as
 * they happen, so this may be called at any time, also while an operation
 * runs (say between two ::mp_test calls): the message is copied under a lock
 * into a string of the context's that only this function writes, so it never
 * changes under the caller and is never half of one message and half of the
 * next. Like every call on one context, calls must not overlap in several
 * threads.
 * @param ctx context, or NULL for the calling thread's last failure of
 *            ::mp_init (or of mp_driver_register)
 * @return string valid until the next call on @p ctx (::mp_test and
 *         ::mp_wait, calls on a request, leave it as it is); with NULL, the
 *         calling thread's own (no other thread writes it)
 */
MP_API const char *mp_last_error(const mp_ctx *ctx);

/**
 * Set process-wide logging (also read once from MP_DEBUG and MP_DEBUG_FILE).
 * @param level ::mp_log_level
 */
MP_API void mp_log_set_level(int level);

/**
 * The grid a context would use: @p grid parsed, or when NULL the automatic
 * choice for @p npeers peers (one dimension up to 8 peers, near-square up to
 * 256, near-cubic above). Lets tools and launchers agree with the library.
 * @param grid "M1xM2x..." or NULL
 * @param npeers number of peers (>= 1)
 * @param[out] dims sizes of the dimensions
 * @param max capacity of @p dims (::MP_MAX_GRID_DIMS always suffices)
 * @return number of dimensions, or -EINVAL (malformed, too few cells for
 *         @p npeers, or more than @p max dimensions)
 */
MP_API int mp_grid_shape(const char *grid, int npeers, int *dims, int max);

/**
 * Whether a transport can be used: built into this library, registered
 * with mp_driver_register (moshpit/driver.h), or loaded from MP_DRIVER_PATH.
 * @param name "tcp", "loop", ...
 * @return 1 if available, 0 if not
 */
MP_API int mp_transport_available(const char *name);

/**
 * Parse an algorithm name. @param s "moshpit", "ring" or "butterfly"
 * @return ::mp_algo value, or -EINVAL
 */
MP_API int mp_algo_from_name(const char *s);

/**
 * Parse a codec name.
 * @param s "none", "fp16", "bf16", "uniform8", "blockwise8", "topk", "adacomp" or "auto"
 * @return ::mp_codec value, or -EINVAL
 */
MP_API int mp_codec_from_name(const char *s);

/**
 * Set the codec and, optionally, its parameter from "name[:param]":
 * "blockwise8:1024" (block), "uniform8:3" (range in standard deviations),
 * "topk:0.05" (fraction kept), "adacomp:conv" / "adacomp:fc" / "adacomp:200"
 * (bin length). Nothing is changed on error.
 * @param spec codec specification
 * @param cfg configuration to update
 * @return 0, or -EINVAL (unknown codec, a parameter out of range, or a
 *         parameter for a codec that takes none); ::mp_last_error (NULL)
 *         then says which, with the range ("topk ratio 5 out of range
 *         (0, 1]"). Nothing is logged: the caller reports it.
 */
MP_API int mp_codec_parse(const char *spec, struct mp_config *cfg);

/**
 * Error feedback. Sparse codecs (topk, adacomp) keep, per averaged buffer
 * (keyed by its address and length), the part of the values they have not
 * sent yet, and add it to the next average of that buffer. These calls let an
 * integrator checkpoint, restore and drop that state, and
 * ::mp_average_flush delivers it at the end of training.
 */

/**
 * Copy the residue of buffer @p buf (@p count values) into @p residue (host
 * memory). The residue of CUDA memory averaged on the GPU lives there and
 * is copied on a stream of its own, waited for (within
 * ::mp_config::round_timeout_ms).
 * @return 0, -ENOENT if the buffer has none, -EBUSY while an average of it
 *         is in flight, -EINVAL on bad arguments, -EIO when the device copy
 *         failed (said in ::mp_last_error)
 */
MP_API int mp_feedback_get(mp_ctx *ctx, const float *buf, size_t count, float *residue);

/**
 * Set (restore) the residue of buffer @p buf from @p residue (host memory;
 * for CUDA memory averaged on the GPU, copied there, as for
 * ::mp_feedback_get).
 * @return 0, -EBUSY while an average of it is in flight, -ENOMEM, -EINVAL
 *         (also for a residue kept in host memory of a buffer now averaged
 *         on the GPU, or the reverse: reset it first), -EIO when the device
 *         copy failed
 */
MP_API int mp_feedback_set(mp_ctx *ctx, const float *buf, size_t count, const float *residue);

/**
 * Drop the residue of @p buf (NULL: of every buffer).
 * @return 0, -ENOENT if @p buf has none, -EBUSY while an average of it is in flight
 */
MP_API int mp_feedback_reset(mp_ctx *ctx, const float *buf);

/**
 * Average @p buf plus its residue uncompressed (codec none) and clear the
 * residue: nothing the sparse codecs held back is lost. Every peer must call
 * it for the same operation, like ::mp_average (a peer that averages with the
 * codec meanwhile fails with -EBADE, as for ::MP_AVG_UNCOMPRESSED).
 * @return as ::mp_average; -EBUSY while another average of @p buf is in flight
 */
MP_API int mp_average_flush(mp_ctx *ctx, float *buf, size_t count, float weight,
			    struct mp_result *res);

/**
 * State download: a peer that joins a running job gets the current model
 * from the peers already training, without stopping them
 * (doc/control-plane.md, "State download"; doc/protocol.md).
 *
 * A server calls ::mp_state_serve once and ::mp_state_publish whenever its
 * buffers are consistent (say after each optimizer step, or every few): a
 * publish copies them, so downloads read a snapshot while training goes on,
 * from threads of the service's own, never the progress thread. A joiner
 * calls ::mp_state_query to learn the sizes (and the metadata, where a
 * framework keeps its layout), then ::mp_state_fetch. Both sides prove the
 * run key (::mp_config::run_key) on every connection; the downloaded bytes
 * are checked against the snapshot's BLAKE2b digest, which the server's
 * authenticated header carries.
 */

/** Most downloads one server runs at once; one more is closed at once and
 * its client asks the next server. */
#define MP_STATE_MAX_ACTIVE 4

/** What ::mp_state_query found or ::mp_state_fetch downloaded. Fields are
 * only ever appended. */
struct mp_state_info {
	uint64_t version;   /**< the version the server published (say, the step) */
	uint64_t bytes;     /**< the buffers' total length */
	int nbufs;          /**< number of buffers */
	size_t meta_len;    /**< the metadata's length (may exceed what the caller's room took) */
	int source;         /**< index in the address list of the server it came from */
	int tries;          /**< ::mp_state_fetch: servers a download was started with */
	uint64_t resumed;   /**< ::mp_state_fetch: bytes kept from a server that failed
	                         mid-transfer, the next one having the same snapshot */
};

/**
 * Start this peer's state service, a TCP listener served by threads of its
 * own until ::mp_finalize. Until the first ::mp_state_publish it answers
 * that it has nothing.
 * @param ctx context
 * @param listen "host:port" to listen on (port 0: any free one); NULL: the
 *        host of this peer's own address where that is an IP address (tcp),
 *        else 127.0.0.1, with any port. ::mp_state_address says which.
 * @return 0; -EBUSY if already serving; -EADDRINUSE, -EINVAL (an
 *         unparsable address) or another socket error, with
 *         ::mp_last_error saying which
 */
MP_API int mp_state_serve(mp_ctx *ctx, const char *listen);

/**
 * The "host:port" of this peer's state service, for joiners.
 * @return 0; -ENOTCONN if ::mp_state_serve was not called; -ENOSPC if
 *         @p len is too small (::MP_ADDR_STRLEN always suffices)
 */
MP_API int mp_state_address(mp_ctx *ctx, char *buf, size_t len);

/**
 * Publish @p n buffers and a metadata blob as this peer's state, with a
 * version (a step count: joiners take the highest). The bytes are copied
 * now: the caller may change the buffers as soon as this returns, and
 * downloads in progress finish with the snapshot they began. May be called
 * before ::mp_state_serve and from any thread that does not overlap another
 * call on @p ctx; it does not wait for the progress thread.
 * @param ctx context
 * @param version the state's version
 * @param bufs @p n buffers (host memory)
 * @param lens their lengths in bytes (0 allowed)
 * @param n number of buffers, 0 to 65536
 * @param meta metadata (may be NULL when @p meta_len is 0)
 * @param meta_len its length, at most 1 MiB
 * @return 0; -EINVAL (bounds, NULL with a length); -ENOMEM (nothing
 *         changed: the previous state is still served)
 */
MP_API int mp_state_publish(mp_ctx *ctx, uint64_t version, const void *const *bufs,
			    const size_t *lens, int n, const void *meta, size_t meta_len);

/**
 * Ask each server of @p addrs for its state's version and describe the
 * most advanced one: its sizes, its metadata. Nothing is downloaded.
 * @param ctx context (its run key proves us to the servers)
 * @param addrs @p naddrs state service addresses (::mp_state_address)
 * @param naddrs number of addresses (>= 1)
 * @param[out] info what was found (may be NULL)
 * @param[out] lens room for @p max_lens buffer lengths (may be NULL)
 * @param max_lens its capacity; info->nbufs says how many there are
 * @param[out] meta room for the metadata (may be NULL)
 * @param meta_cap its capacity; info->meta_len says how long it is
 * @param timeout_ms longest time for the whole call (> 0)
 * @return 0; -ENOENT (no server has published a state); -EACCES (every
 *         server refused us: another run key); -ETIMEDOUT, or another
 *         server's failure; ::mp_last_error names each server's failure
 */
MP_API int mp_state_query(mp_ctx *ctx, const char *const *addrs, int naddrs,
			  struct mp_state_info *info, size_t *lens, int max_lens, void *meta,
			  size_t meta_cap, int timeout_ms);

/**
 * Download the most advanced state among @p addrs into @p bufs, whose
 * lengths must equal the server's (servers with other lengths are passed
 * over). When a server fails mid-transfer (dies, stalls for
 * ::mp_config::round_timeout_ms, or sends bytes that do not match its
 * snapshot's digest), the next server is tried, resuming where the
 * transfer stopped when it serves the same snapshot; the result is always
 * one server's snapshot whole, checked against its digest.
 * @param ctx context
 * @param addrs @p naddrs state service addresses
 * @param naddrs number of addresses (>= 1)
 * @param bufs @p n buffers to fill (host memory)
 * @param lens their lengths in bytes
 * @param n number of buffers
 * @param[out] meta room for the metadata (may be NULL)
 * @param meta_cap its capacity (info->meta_len says how long it is)
 * @param[out] info what was downloaded, from where (may be NULL)
 * @param timeout_ms longest time for the whole call (> 0)
 * @return 0; -ENOENT (no server has a state); -EACCES (every server
 *         refused us); -EMSGSIZE (no server has buffers of these lengths:
 *         ::mp_last_error gives theirs); -EBADMSG (the data did not match
 *         the digest); -ETIMEDOUT; or the last server's failure, with
 *         ::mp_last_error naming each server's. On failure @p bufs may
 *         hold part of a download.
 */
MP_API int mp_state_fetch(mp_ctx *ctx, const char *const *addrs, int naddrs, void *const *bufs,
			  const size_t *lens, int n, void *meta, size_t meta_cap,
			  struct mp_state_info *info, int timeout_ms);

#ifdef __cplusplus
}
#endif
#endif /* MOSHPIT_MOSHPIT_H */
