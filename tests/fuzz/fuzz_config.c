/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Fuzz target for what a peer reads from its environment and files before
 * mp_init: every MP_* variable (src/core/config.c, mp_config_from_env), the
 * checks of mp_config_resolve with the peer list (MP_PEERS) it splits, the
 * hostfile it reads, the grid (MP_GRID, mp_grid_parse) and the bandwidth
 * list (MP_BANDWIDTHS, mp_parse_doubles).
 *
 * Input: one selector byte, then the text.
 *   selector bit 0 clear: environment. Lines split by '\n'; a line's first
 *     byte picks the variable (from the list below, modulo its length), the
 *     rest is the value (up to a NUL). Every listed variable is unset first.
 *   set: a hostfile's contents, written to a scratch file (unlinked, read
 *     through /proc/self/fd) that mp_config_resolve reads (static
 *     rendezvous, rank 0).
 * Invariants: no crash or sanitizer report; a static configuration that
 * resolves has a peer count of at least 1 and a rank inside it, its list
 * that many non-empty addresses, and each address a hostfile gave ends in
 * a port in [0, 65535] (its parser writes them); a dht one has rank 0, no
 * list and a peer count of at least 0.
 *
 * Built two ways, as fuzz_frame.c: libFuzzer with -DMP_LIBFUZZER, else
 * main() (fuzz_main.h) replays tests/fuzz/corpus/fuzz_config/ or a
 * deterministic stream of mutated valid settings.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <moshpit/moshpit.h>

#include "core.h"
#include "grid.h"
#include "log.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
#define FUZZ_SEED 0x082EFA98EC4E6C89ull /* the deterministic stream's start */
#include "fuzz_main.h"

/* Every variable mp_config_from_env reads but MP_HOSTFILE (the hostfile
 * is the other mode: a fuzzed path would open any file), and the
 * launchers' rank and size. */
static const char *const vars[] = {
	"MP_ADACOMP_BIN", "MP_ALGO", "MP_ALLREDUCE_TIMEOUT_MS", "MP_BALANCE", "MP_BANDWIDTH",
	"MP_BANDWIDTHS", "MP_BOOTSTRAP", "MP_CHECKSUM", "MP_CHECK_FINITE", "MP_CHUNK_BYTES",
	"MP_CHUNK_TIMEOUT_MS", "MP_CODEC", "MP_CODEC_BLOCK", "MP_CODEC_SIGMAS",
	"MP_CONNECT_TIMEOUT_MS", "MP_CONTRIB_LOG", "MP_DHT_PORT", "MP_DIRECT_MAX",
	"MP_DIRECT_PAIRS", "MP_FAULT", "MP_GRID", "MP_GROUP_SIZE", "MP_JOIN_TIMEOUT_MS",
	"MP_LISTEN", "MP_MATCHMAKING_MS",
	"MP_MAX_HANDSHAKES", "MP_MIN_GROUP_SIZE", "MP_MIN_PART", "MP_MODE", "MP_NPEERS",
	"MP_NSTREAMS", "MP_PEERS", "MP_PEER_ID", "MP_PROBE_MAX_MS", "MP_PROBE_MIN_MS", "MP_RANK",
	"MP_RECORD_TTL_MS", "MP_RENDEZVOUS", "MP_REQUEST_TIMEOUT_MS", "MP_ROUNDS",
	"MP_ROUND_TIMEOUT_MS", "MP_RUN", "MP_RUN_KEY", "MP_RUN_KEY_FILE", "MP_SPIN_US",
	"MP_TOPK_RATIO", "MP_TRANSPORT", "MP_WINDOW", "OMPI_COMM_WORLD_RANK",
	"OMPI_COMM_WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS",
};
#define NVARS (sizeof(vars) / sizeof(vars[0]))

static char hostfile[64];
static int hostfile_fd = -1;

static void setup_once(void)
{
	static int done;
	char tmp[] = "/tmp/mp-fuzz-hostfile-XXXXXX";

	if (done)
		return;
	done = 1;
	/* Errors are expected by the million: keep them out of the output. */
	mp_log_set_level(MP_LOG_NONE);
	unsetenv("MP_HOSTFILE");
	/* The hostfile: an unlinked file (in memory where there is memfd),
	 * rewritten for each input and read through /proc/self/fd, so that no
	 * run, however it ends (libFuzzer leaves by _exit), leaves one behind. */
	hostfile_fd = memfd_create("mp-fuzz-hostfile", 0);
	if (hostfile_fd < 0 && (hostfile_fd = mkstemp(tmp)) >= 0)
		unlink(tmp);
	if (hostfile_fd < 0) {
		perror("hostfile");
		abort();
	}
	snprintf(hostfile, sizeof(hostfile), "/proc/self/fd/%d", hostfile_fd);
}

static void check_resolved(const struct mp_config *in, int from_hostfile)
{
	struct mp_config out;
	char **list = NULL;
	int n = 0;

	if (mp_config_resolve(in, &out, &list, &n))
		return;
	if (!strcmp(out.rendezvous, "dht")) {
		/* Peers find each other: npeers is how many to wait for, if any. */
		if (out.npeers < 0 || out.rank || list)
			abort();
		return;
	}
	if (out.npeers < 1 || out.rank < 0 || out.rank >= out.npeers || (list && n != out.npeers))
		abort();
	for (int i = 0; list && i < n; i++) {
		const char *colon = strrchr(list[i], ':');
		char *end;
		long port = colon ? strtol(colon + 1, &end, 10) : -1;

		/* MP_PEERS entries are the driver's to judge (mp_init hands them to
		 * its addr_parse); the hostfile parser writes the port itself. */
		if (!*list[i] || strlen(list[i]) >= MP_ADDR_STRLEN + 16)
			abort();
		if (from_hostfile && (!colon || *end || port < 0 || port > 65535))
			abort(); /* a port no socket can have */
	}
	mp_free_list(list, n);
}

static void env_mode(const uint8_t *p, size_t n)
{
	struct mp_config cfg;

	for (size_t i = 0; i < NVARS; i++)
		unsetenv(vars[i]);
	for (size_t o = 0; o < n;) {
		const uint8_t *nl = memchr(p + o, '\n', n - o);
		size_t len = nl ? (size_t)(nl - (p + o)) : n - o;

		if (len) {
			char *v = strndup((const char *)p + o + 1, len - 1);
			if (!v)
				abort();
			setenv(vars[p[o] % NVARS], v, 1);
			free(v);
		}
		o += len + 1;
	}
	mp_config_init(&cfg);
	if (mp_config_from_env(&cfg))
		return;
	cfg.hostfile = NULL;
	check_resolved(&cfg, 0);
	/* What mp_init parses next (context.c). */
	if (cfg.grid) {
		struct mp_grid g;

		if (!mp_grid_parse(cfg.grid, &g) && (g.ndims < 1 || g.ndims > MP_MAX_GRID_DIMS))
			abort();
	}
	if (cfg.bandwidths) {
		double bw[64];

		for (int k = 1; k <= 64; k *= 4)
			mp_parse_doubles(cfg.bandwidths, bw, k);
	}
}

static void hostfile_mode(const uint8_t *p, size_t n)
{
	struct mp_config cfg;

	if (ftruncate(hostfile_fd, 0) || pwrite(hostfile_fd, p, n, 0) != (ssize_t)n)
		abort();
	mp_config_init(&cfg);
	cfg.rendezvous = "static";
	cfg.run_name = "fuzz";
	cfg.rank = 0;
	cfg.hostfile = hostfile;
	check_resolved(&cfg, 1);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1)
		return 0;
	setup_once();
	if (data[0] & 1)
		hostfile_mode(data + 1, size - 1);
	else
		env_mode(data + 1, size - 1);
	return 0;
}

#ifndef MP_LIBFUZZER
/* Values a user might write, right and wrong. */
static const char *const values[] = {
	"4", "0", "-1", "16K", "1G", "99999999999999999999", "4x4", "2x2x2", "8", "x", "0x4",
	"1.5,2,3", "1e309", "nan", "topk:0.05", "adacomp:fc", "uniform8", "auto", "moshpit", "ring",
	"client", "aux", "measured", "payload", "10.0.0.1:29500,10.0.0.2:29500", "[::1]:7,h:8",
	"dht", "static", "", "ffffffffffffffff", "0.5", "conv", "3M", "1KB",
};

static void fuzz_stream(long iters)
{
	static const char *const hosts[] = {
		"node1 slots=2\n", "10.0.0.1:29500\n", "# comment\n", "[::1]:7000 slots=3\n",
		"h:65535 slots=2\n", "host slots=0\n", "a\n", "  \n", "h:99999999999999999999\n",
	};
	char text[1024];

	setup_once();
	for (long i = 0; i < iters; i++) {
		size_t n = 1;

		text[0] = (char)(next() & 1);
		int lines = 1 + (int)(next() % 6);
		for (int l = 0; l < lines; l++) {
			const char *s;
			if (text[0] & 1) {
				s = hosts[next() % (sizeof(hosts) / sizeof(hosts[0]))];
				n += (size_t)snprintf(text + n, sizeof(text) - n, "%s", s);
			} else {
				s = values[next() % (sizeof(values) / sizeof(values[0]))];
				n += (size_t)snprintf(text + n, sizeof(text) - n, "%c%s\n",
						      (char)(next() % NVARS), s);
			}
			if (n >= sizeof(text) - 64)
				break;
		}
		if (!seed_dir && next() % 4 == 0 && n > 1)
			text[1 + next() % (n - 1)] = (char)next();
		if (seed_dir)
			fuzz_seed((const uint8_t *)text, n);
		LLVMFuzzerTestOneInput((const uint8_t *)text, n);
	}
	printf("fuzz_config: %ld inputs, no crash\n", iters);
}
#endif

