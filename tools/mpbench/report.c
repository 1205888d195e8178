/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * mpbench's output: the nccl-tests style table (header, one row per size as
 * its reports come in, footer), progress lines, the JSON file, and the exit
 * status the results call for.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "mpbench.h"
#include "mpbench_vcs.h"
#include "dpdk_seg.h"

void agg_init(struct agg *a, const struct bench *b, int nrep, int print)
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
	a->path_min = a->path_max = -1;
}

/* mp_mem_path's value in words, as the JSON and the footer say it. */
static const char *path_name(int path)
{
	switch (path) {
	case MP_MEM_PATH_HOST:
		return "host";
	case MP_MEM_PATH_STAGED:
		return "staged";
	case MP_MEM_PATH_DEVICE:
		return "device";
	case MP_MEM_PATH_GPUDIRECT:
		return "gpudirect";
	default:
		return "unknown";
	}
}

void agg_free(struct agg *a)
{
	for (int r = 0; r < a->npstats_ranks; r++)
		free(a->pstats[r]);
	free(a->pstats);
	free(a->npstats);
	free(a->rows);
	free(a->count);
	free(a->algbw);
	free(a->busbw);
}

void show_progress(const struct agg *a)
{
	if (!a->print || a->next >= a->b->nsizes)
		return;
	fprintf(stderr, PROG ": size %" PRIu64 " (%d/%d) ...\n", a->b->sizes[a->next],
		a->next + 1, a->b->nsizes);
}

void print_header(const struct bench *b, const char *mode)
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
	if (b->cuda)
		printf("# memory cuda (%s): each peer's buffer in device memory (how the library "
		       "averaged it: \"Memory path\" below)\n", b->cuda_what);
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
			       "rounds to converge  join %d  standby %d\n", b->churn, b->churn_end - 1,
			       b->total_rounds - b->churn_end, b->join, b->standby);
	}
	if (c->algo == MP_ALGO_MOSHPIT && !b->grid.given && b->grid.ndims == 1) {
		char eg[48] = "";

		if (b->npeers >= 4)
			snprintf(eg, sizeof(eg), " (e.g. --grid=2x%d)", (b->npeers + 1) / 2);
		printf("# note: the automatic grid for %d peers is one group (8 peers or fewer): "
		       "Moshpit runs as one butterfly all-reduce; --grid=MxN%s or MP_GRID gives "
		       "a grid\n", b->npeers, eg);
	}
	if (!b->multi)
		printf("# time: the slowest peer's (max over the %d peers, as nccl-tests)%s\n",
		       b->npeers, b->minmax ? "; min_time and max_time: fastest and slowest" : "");
	else
		/* A row whose gather missed ranks says so on stderr, and in
		 * time_ranks and time_is in the JSON. */
		printf("# time: the slowest rank's (max over the %d ranks, as nccl-tests)%s\n",
		       b->npeers, b->minmax ? "; min_time and max_time: fastest and slowest" : "");
	if (!b->check)
		printf("# check off: max_err and #wrong are not computed\n");
	else if (b->exact && codec_sparse(c->codec))
		printf("# check: exact weighted mean after a flush (MP_AVG_FLUSH; error feedback), "
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
	       "%9s", "size", "count", "type", "codec", "algo", "peers", "rounds", "time",
	       "algbw", "busbw", "wire_bytes", "ratio", "max_err", "#wrong", "lost", "joined",
	       "rms_err");
	if (b->minmax)
		printf(" %10s %10s", "min_time", "max_time");
	printf("\n# %10s %12s %6s %10s %10s %6s %6s %10s %8s %8s %12s %6s %9s %7s %5s %6s "
	       "%9s", "(B)", "(elements)", "", "", "", "", "", "(us)", "(GB/s)", "(GB/s)",
	       "(B/peer)", "", "", "", "", "", "");
	if (b->minmax)
		printf(" %10s %10s", "(us)", "(us)");
	printf("\n");
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

void print_row(struct agg *a, int s)
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
	       "%6.2f %s %s %5d %6d %s",
	       bytes, bytes / 4, "float", codec_name(r->codec), algo_name(b->cfg.algo),
	       b->npeers, r->rounds, r->time_us, algbw, busbw, row_wire_bytes(a, r),
	       row_ratio(r), err, wrong, r->lost, r->joined, rms);
	if (b->minmax && isfinite(r->time_min_us))
		printf(" %10.1f %10.1f", r->time_min_us, r->time_us);
	else if (b->minmax)
		printf(" %10s %10s", "n/a", "n/a");
	printf("\n");
	fflush(stdout);
	if (r->failed_peers > 0)
		fprintf(stderr, PROG ": warning: size %" PRIu64 ": %d peer(s) dropped during the "
			"averages\n", bytes, r->failed_peers);
}

/* Fold one peer's report of one size in; print rows as they complete. */
void agg_add(struct agg *a, const struct size_result *in)
{
	uint32_t s = in->size_idx;
	struct size_result *r;

	if (s >= (uint32_t)a->b->nsizes)
		return;
	r = &a->rows[s];
	if (a->path_min < 0 || in->mem_path < a->path_min)
		a->path_min = in->mem_path;
	if (in->mem_path > a->path_max)
		a->path_max = in->mem_path;
	if (a->count[s]++ == 0) {
		*r = *in;
	} else {
		if (in->time_us > r->time_us)
			r->time_us = in->time_us;
		if (in->time_min_us < r->time_min_us)
			r->time_min_us = in->time_min_us;
		if (in->time_median_us > r->time_median_us || isnan(r->time_median_us))
			r->time_median_us = in->time_median_us;
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
		show_progress(a);
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
	/* The path the library took, as every peer's registration said it. */
	if (a->b->cuda && a->path_min == a->path_max)
		printf("# Memory path : %s\n", path_name(a->path_min));
	else if (a->b->cuda && a->path_min >= 0)
		printf("# Memory path : %s to %s (peers differ)\n", path_name(a->path_min),
		       path_name(a->path_max));
	printf("#\n");
	fflush(stdout);
}

void agg_peer_stats(struct agg *a, int rank, const struct mp_peer_info *t, int n)
{
	if (rank < 0 || n < 0)
		return;
	if (rank >= a->npstats_ranks) {
		int want = rank + 1 > a->b->npeers ? rank + 1 : a->b->npeers;

		a->pstats = realloc(a->pstats, (size_t)want * sizeof(*a->pstats));
		a->npstats = realloc(a->npstats, (size_t)want * sizeof(*a->npstats));
		if (!a->pstats || !a->npstats) {
			fprintf(stderr, PROG ": out of memory\n");
			exit(EXIT_FAIL);
		}
		for (int r = a->npstats_ranks; r < want; r++) {
			a->pstats[r] = NULL;
			a->npstats[r] = 0;
		}
		a->npstats_ranks = want;
	}
	free(a->pstats[rank]);
	a->pstats[rank] = xcalloc((size_t)(n ? n : 1), sizeof(*t));
	memcpy(a->pstats[rank], t, (size_t)n * sizeof(*t));
	a->npstats[rank] = n;
}

static const char *state_name(int st)
{
	switch (st) {
	case MP_PEER_LIVE: return "live";
	case MP_PEER_DOWN: return "down";
	case MP_PEER_GONE: return "gone";
	case MP_PEER_SELF: return "self";
	default: return "?";
	}
}

/* --peer-stats: every reporting rank's view of its peers, after the footer. */
static void print_peer_stats(const struct agg *a)
{
	int any = 0;

	for (int r = 0; r < a->npstats_ranks; r++)
		any |= a->pstats[r] != NULL;
	if (!any)
		return;
	printf("# Peer stats: each rank's view at the end (bandwidth and round trip measured on\n"
	       "# real exchanges, moving averages; self: this rank's own throughput)\n");
	printf("# %5s %5s %16s %-22s %5s %9s %10s %9s %12s %12s %5s %10s\n", "rank", "peer", "id",
	       "address", "state", "idle(s)", "bw(MB/s)", "rtt(ms)", "sent(B)", "recv(B)", "fail",
	       "rate(MB/s)");
	for (int r = 0; r < a->npstats_ranks; r++) {
		for (int i = 0; i < a->npstats[r]; i++) {
			const struct mp_peer_info *q = &a->pstats[r][i];

			printf("  %5d %5d %016" PRIx64 " %-22.22s %5s %9.3f %10.2f %9.3f %12" PRIu64
			       " %12" PRIu64 " %5d %10.2f\n", r, q->rank, q->id,
			       q->addr[0] ? q->addr : "-", state_name(q->state), q->since_progress_s,
			       q->bandwidth_Bps / 1e6, q->rtt_s * 1e3, q->bytes_sent,
			       q->bytes_received, q->failures, q->rate_Bps / 1e6);
		}
	}
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

/* The version of the JSON's layout: raised when a field changes meaning. */
#define JSON_SCHEMA_VERSION 4

/* A variable of the environment, or NULL (JSON null) when unset or empty. */
static const char *env_or_null(const char *name)
{
	const char *v = getenv(name);

	return v && *v ? v : NULL;
}

/*
 * The run's provenance: when, where, with which library build, and which
 * device or libfabric entry the transport chose. Host names: this
 * one, and in multi-host runs those of the peer list or hostfile.
 */
static void json_provenance(FILE *f, const struct agg *a)
{
	const struct bench *b = a->b;
	char host[256] = "", stamp[32] = "";
	time_t now = time(NULL);
	struct tm tm;

	if (gethostname(host, sizeof(host) - 1) != 0)
		host[0] = '\0';
	if (gmtime_r(&now, &tm))
		strftime(stamp, sizeof(stamp), "%Y-%m-%dT%H:%M:%SZ", &tm);
	fprintf(f, "  \"schema_version\": %d,\n  \"timestamp\": ", JSON_SCHEMA_VERSION);
	json_str(f, stamp);
	fprintf(f, ",\n  \"host\": ");
	json_str(f, host);
	fprintf(f, ",\n  \"peer_hosts\": ");
	json_str(f, b->multi ? (b->cfg.peers ? b->cfg.peers : b->cfg.hostfile) : NULL);
	fprintf(f, ",\n  \"library\": {\"version\": \"%d.%d.%d\", \"git_commit\": ",
		MP_VERSION_MAJOR, MP_VERSION_MINOR, MP_VERSION_PATCH);
	json_str(f, MPBENCH_GIT_COMMIT);
	fprintf(f, "},\n  \"transport_detail\": {\"name\": ");
	json_str(f, b->transport);
	/* What the driver chose (mp_transport_detail), each "key=value" as
	 * "<transport>_<key>": "value"; nothing more when no peer could say. */
	if (a->tdetail_known) {
		char words[sizeof(a->tdetail)], *save = NULL;

		memcpy(words, a->tdetail, sizeof(words));
		for (char *w = strtok_r(words, " ", &save); w; w = strtok_r(NULL, " ", &save)) {
			char *eq = strchr(w, '=');

			if (!eq)
				continue;
			char key[96];

			*eq = '\0';
			snprintf(key, sizeof(key), "%s_%s", b->transport, w);
			fprintf(f, ", ");
			json_str(f, key);
			fprintf(f, ": ");
			json_str(f, eq + 1);
		}
	}
	if (!strcmp(b->transport, "dpdk")) {
		fprintf(f, ", \"dpdk_eal\": ");
		json_str(f, env_or_null("MP_DPDK_EAL"));
	}
	fprintf(f, "},\n");
}

/* What the rows' times are the max of: every peer's in local runs (a row
 * waits for all), in multi-host runs the ranks gather_times reached. */
static const char *time_is(const struct agg *a)
{
	int all = 1, own = 1;

	if (!a->b->multi)
		return "max over peers";
	for (int s = 0; s < a->nrows; s++) {
		all &= a->rows[s].time_ranks >= a->b->npeers;
		own &= a->rows[s].time_ranks <= 1;
	}
	return all ? "max over ranks" : own ? "rank 0" : "max over the ranks that reported (time_ranks)";
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
	fprintf(f, "{\n");
	json_provenance(f, a);
	fprintf(f, "  \"settings\": {\n");
	fprintf(f, "    \"version\": \"%d.%d.%d\",\n", MP_VERSION_MAJOR, MP_VERSION_MINOR,
		MP_VERSION_PATCH);
	fprintf(f, "    \"mode\": ");
	json_str(f, mode);
	fprintf(f, ",\n    \"rank\": %d,\n    \"transport\": ", rank);
	json_str(f, b->transport);
	/* "memory_path": how the library averaged device memory (mp_mem_path:
	 * "staged", "device", "gpudirect"), the lowest of every peer's. */
	fprintf(f, ",\n    \"memory\": \"%s\",\n    \"memory_path\": ", b->cuda ? "cuda" : "host");
	json_str(f, b->cuda && a->path_min >= 0 ? path_name(a->path_min) : NULL);
	fprintf(f, ",\n    \"memory_device\": ");
	json_str(f, b->cuda ? b->cuda_what : NULL);
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
	fprintf(f, ",\n    \"time_is\": \"%s\",\n", time_is(a));
	fprintf(f, "    \"rendezvous\": \"%s\",\n    \"followed\": %s,\n",
		b->dht ? "dht" : "static", b->follow ? "true" : "false");
	fprintf(f, "    \"total_rounds\": %d,\n    \"churn\": ", b->follow ? b->total_rounds : 0);
	json_num(f, b->churn);
	fprintf(f, ",\n    \"churn_end\": %d,\n    \"join\": %d,\n    \"late\": %d,\n"
		"    \"intruders\": %d,\n    \"clients\": %d,\n    \"aux\": %d,\n"
		"    \"standby\": %d,\n    \"faults\": [", b->churn > 0 ? b->churn_end : 0, b->join > 0,
		b->late,
		b->intruders, b->clients, b->aux, b->standby);
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
		fprintf(f, ", \"time_min_us\": ");
		json_num(f, r->time_min_us);
		fprintf(f, ", \"time_median_us\": ");
		json_num(f, r->time_median_us);
		if (b->multi)
			fprintf(f, ", \"time_ranks\": %d", r->time_ranks);
		else
			fprintf(f, ", \"time_ranks\": null");
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
			"\"standby_woken\": %d, \"client_reduces\": %d}%s\n", r->failed_peers, r->lost,
			r->joined, r->woken,
			r->client_reduces, s + 1 < a->nrows ? "," : "");
	}
	fprintf(f, "  ],\n");
	if (b->peer_stats) {
		/* One object per rank, its peers as mp_peers_info lists them. */
		int first = 1;

		fprintf(f, "  \"peer_stats\": [");
		for (int r = 0; r < a->npstats_ranks; r++) {
			if (!a->pstats[r])
				continue;
			fprintf(f, "%s\n    {\"rank\": %d, \"peers\": [", first ? "" : ",", r);
			first = 0;
			for (int i = 0; i < a->npstats[r]; i++) {
				const struct mp_peer_info *q = &a->pstats[r][i];

				fprintf(f, "%s\n      {\"rank\": %d, \"id\": \"%016" PRIx64
					"\", \"addr\": ", i ? "," : "", q->rank, q->id);
				json_str(f, q->addr);
				fprintf(f, ", \"mode\": %d, \"state\": \"%s\", \"since_progress_s\": ",
					q->mode, state_name(q->state));
				json_num(f, q->since_progress_s);
				fprintf(f, ", \"bandwidth_Bps\": ");
				json_num(f, q->bandwidth_Bps);
				fprintf(f, ", \"rtt_s\": ");
				json_num(f, q->rtt_s);
				fprintf(f, ", \"bytes_sent\": %" PRIu64 ", \"bytes_received\": %" PRIu64
					", \"failures\": %d, \"rate_Bps\": ", q->bytes_sent,
					q->bytes_received, q->failures);
				json_num(f, q->rate_Bps);
				fprintf(f, "}");
			}
			fprintf(f, "]}");
		}
		fprintf(f, "\n  ],\n");
	}
	fprintf(f, "  \"avg_busbw_gbs\": ");
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

int report_finish(struct agg *a, const char *mode, int rank, int failed)
{
	const struct bench *b = a->b;
	int rc = failed ? EXIT_FAIL : EXIT_OK;

	if (a->print && !failed) {
		print_footer(a);
		print_peer_stats(a);
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
