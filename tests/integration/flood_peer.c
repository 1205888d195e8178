/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * One peer of the flood test (flood.py), a process of its own over TCP on
 * loopback, through the public API only: it averages ITERS times, a short
 * vector (4 KiB: the direct exchange) and a long one (64 KiB: butterfly) in
 * turn, with PAUSE_MS between averages so that the run lasts while
 * flood.py attacks its port, and checks every result bit for bit: the
 * inputs are whole numbers and the peers 4, so the mean is exact in fp32.
 *
 *   flood_peer RANK ITERS PAUSE_MS      (MP_PEERS, MP_RUN, ... from flood.py)
 *
 * Prints "ready" after its first average, then at the end one line:
 *   flood_peer rank R: averages N wrong W failed F rss_kb FIRST LAST
 *     accepted .. authenticated .. refused .. timed_out .. evicted ..
 *     hung_up .. pending .. handshakes_max .. frames_rejected ..
 * and exits 0, or 1 at the first average that fails (with the error).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <moshpit/moshpit.h>

#define NP 4
#define LONG_N 16384 /* 64 KiB: above MP_DIRECT_MAX, a butterfly */
#define SHORT_N 1024 /* 4 KiB: the direct exchange */

static float input(int rank, int it, size_t i)
{
	return (float)((rank + 1) * (int)(i % 97) + it % 13);
}

static long rss_kb(void)
{
	char line[256];
	long kb = -1;
	FILE *f = fopen("/proc/self/status", "r");

	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "VmRSS: %ld kB", &kb) == 1)
			break;
	fclose(f);
	return kb;
}

int main(int argc, char **argv)
{
	struct mp_config cfg;
	struct mp_stats st;
	mp_ctx *ctx = NULL;
	float *x;
	int rank, iters, pause_ms, rc;
	long wrong = 0, first_rss = -1;
	int failed = 0, done = 0;

	if (argc != 4) {
		fprintf(stderr, "usage: flood_peer RANK ITERS PAUSE_MS\n");
		return 2;
	}
	rank = atoi(argv[1]);
	iters = atoi(argv[2]);
	pause_ms = atoi(argv[3]);
	setvbuf(stdout, NULL, _IOLBF, 0);
	mp_config_init(&cfg);
	if ((rc = mp_config_from_env(&cfg)) != 0) {
		fprintf(stderr, "flood_peer %d: environment: %s\n", rank, mp_last_error(NULL));
		return 1;
	}
	cfg.rank = rank;
	cfg.npeers = NP;
	cfg.algo = MP_ALGO_BUTTERFLY;
	if ((rc = mp_init(&cfg, &ctx)) != 0) {
		fprintf(stderr, "flood_peer %d: mp_init: %s: %s\n", rank, mp_strerror(rc),
			mp_last_error(NULL));
		return 1;
	}
	x = malloc(LONG_N * sizeof(*x));
	if (!x)
		return 1;
	for (int it = 0; it < iters; it++) {
		size_t n = it % 2 ? SHORT_N : LONG_N;
		struct mp_result res;

		for (size_t i = 0; i < n; i++)
			x[i] = input(rank, it, i);
		rc = mp_average(ctx, x, n, 1.0f, &res);
		if (rc) {
			fprintf(stderr, "flood_peer %d: average %d (%zu values): %s: %s\n", rank, it,
				n, mp_strerror(rc), mp_last_error(ctx));
			break;
		}
		failed += res.failed_peers;
		for (size_t i = 0; i < n; i++) {
			float want = 0.0f;

			for (int r = 0; r < NP; r++)
				want += input(r, it, i);
			want /= NP;
			if (memcmp(&x[i], &want, sizeof(want)))
				wrong++;
		}
		done++;
		if (it == 0) {
			first_rss = rss_kb();
			printf("ready\n");
		}
		if (pause_ms > 0)
			nanosleep(&(struct timespec){ .tv_sec = pause_ms / 1000,
						      .tv_nsec = (long)(pause_ms % 1000) * 1000000L },
				  NULL);
	}
	if (mp_stats(ctx, &st, sizeof(st)) != 0) {
		fprintf(stderr, "flood_peer %d: mp_stats failed\n", rank);
		rc = -EINVAL;
	}
	printf("flood_peer rank %d: averages %d wrong %ld failed %d rss_kb %ld %ld accepted %" PRIu64
	       " authenticated %" PRIu64 " refused %" PRIu64 " timed_out %" PRIu64
	       " evicted %" PRIu64 " hung_up %" PRIu64 " pending %" PRIu64
	       " handshakes_max %" PRIu64 " frames_rejected %" PRIu64 "\n",
	       rank, done, wrong, failed, first_rss, rss_kb(), st.conns_accepted,
	       st.conns_authenticated, st.conns_refused, st.conns_timed_out, st.conns_evicted,
	       st.conns_hung_up, st.handshakes_pending, st.handshakes_max, st.frames_rejected);
	free(x);
	mp_finalize(ctx);
	return rc || wrong ? 1 : 0;
}
