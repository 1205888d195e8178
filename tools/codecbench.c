/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * codecbench - how fast and how lossy each wire codec is, on one core.
 *
 * For every (codec, data set) pair it measures, single threaded:
 *
 *  - encode: the whole input, chunk by chunk as the library streams it, into
 *    one payload slot per chunk; GB/s of fp32 input;
 *  - decode_acc: every chunk's payload accumulated into an fp32 buffer with
 *    weight 0.5, which is what a reducer does with a received chunk; GB/s of
 *    fp32 output;
 *  - memcpy of the same byte count, timed right before the row, as the
 *    yardstick: a codec on the hot path should not be much slower than
 *    copying the data it replaces;
 *  - the compression ratio and the relative RMS error of one round trip.
 *
 * Each timing is the best of --iters runs after --warmup untimed ones: the
 * minimum is the run least disturbed by the rest of the machine, which is
 * what a throughput comparison between codecs wants.
 *
 * This tool sits on the internal codec interface (src/codec/codec.h), not the
 * public API: it links the library's core objects.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <sched.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "codec.h"
#include "cli.h"
#include <moshpit/sdk/clock.h>
#include "log.h"
#include "mp_kernels.h"

#define PROG "codecbench"

/* Exit statuses. */
#define EXIT_OK 0
#define EXIT_FAIL 1
#define EXIT_USAGE CLI_EXIT_USAGE

#define MAX_CODECS 64
/*
 * Payload slots start on 64-byte boundaries: on the wire a payload follows a
 * 64-byte frame header in a cache-aligned buffer, so this is the alignment
 * the codecs meet in the library (and the one their fast paths expect).
 */
#define SLOT_ALIGN 64

/* Library limits on chunk_bytes (src/core/config.c). */
#define CHUNK_MIN 4ULL
#define CHUNK_MAX (1ULL << 28)
/* A sanity bound, far above any memory this will run in. */
#define SIZE_MAX_BYTES (1ULL << 40)

/* "heavy" data: see doc/codecbench.1 for the exact recipe. */
#define HEAVY_ROW 512         /* elements sharing one log-normal scale */
#define HEAVY_SIGMA 1.0       /* sigma of the log of the row scale */
#define HEAVY_SPIKE_BITS 16   /* one element in 2^16 is a spike ... */
#define HEAVY_SPIKE_GAIN 100.0 /* ... this many times larger */

enum { DATA_GAUSS, DATA_HEAVY, NDATA };
static const char *const data_names[NDATA] = { "gauss", "heavy" };

/* Codecs --check holds to half of memcpy: the dense ones meant to be cheap. */
static const char *const checked_codecs[] = { "fp16", "bf16", "uniform8", "blockwise8" };

struct opts {
	const struct mp_codec_ops *codec[MAX_CODECS];
	int ncodecs;
	int data[NDATA];
	int ndata;
	uint64_t size, chunk, seed;
	int iters, warmup, check;
	struct mp_codec_params params;
	const char *kernels;
	const char *json;
};

/* Working memory, shared by every row. */
struct bench {
	const struct opts *o;
	size_t count;   /* floats of input */
	size_t per;     /* floats per chunk (the last chunk may be shorter) */
	size_t nchunks;
	float *in[NDATA]; /* generated on first use, kept */
	float *out;       /* decode / decode_acc target, memcpy destination */
	float *residue;   /* error feedback, for sparse codecs */
	unsigned char *payload;
	size_t payload_cap;
	size_t *off, *len; /* per chunk: slot offset and bytes encoded */
	void *scratch;
	size_t scratch_cap;
};

struct row {
	const struct mp_codec_ops *c;
	int data;
	double enc_gbs, dec_gbs, cpy_gbs;
	double ratio, rms_rel;
	uint64_t payload_bytes;
};

/* ------------------------------------------------------------------------ */
/* Small helpers                                                             */

/*
 * Tells the compiler that memory behind @p is read and written here, so a
 * timed memcpy whose result nobody reads in between is still done every time.
 */
static inline void clobber(void *p)
{
	__asm__ __volatile__("" : : "r"(p) : "memory");
}

static size_t round_up(size_t v, size_t a)
{
	return (v + a - 1) / a * a;
}

/* 64-byte aligned, touched once so that no timed loop pays for page faults. */
static void *alloc_touched(size_t bytes)
{
	size_t n = round_up(bytes ? bytes : 1, SLOT_ALIGN);
	void *p;

	if (n < bytes)
		return NULL;
	p = aligned_alloc(SLOT_ALIGN, n);
	if (p)
		memset(p, 0, n);
	return p;
}

static double gbs(uint64_t bytes, double s)
{
	return s > 0.0 ? (double)bytes / s * 1e-9 : NAN;
}

/* ------------------------------------------------------------------------ */
/* Test data                                                                 */

static inline uint64_t mix64(uint64_t z)
{
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

/* Draw @n of the stream @key: 64 random bits, counter based so any element
 * can be made on its own and the data do not depend on the chunking. */
static inline uint64_t draw(uint64_t key, uint64_t n)
{
	return mix64(key + (n + 1) * 0x9e3779b97f4a7c15ULL);
}

/* Uniform in (0, 1]: never 0, so that its logarithm is finite. */
static inline double unit(uint64_t key, uint64_t n)
{
	return (double)((draw(key, n) >> 11) + 1) * 0x1p-53;
}

/* Standard normal pair number @j of stream @key (Box-Muller). */
static void normal_pair(uint64_t key, uint64_t j, double *z0, double *z1)
{
	const double two_pi = 6.283185307179586476925;
	double r = sqrt(-2.0 * log(unit(key, 2 * j)));
	double a = two_pi * unit(key, 2 * j + 1);

	*z0 = r * cos(a);
	*z1 = r * sin(a);
}

static double normal(uint64_t key, uint64_t n)
{
	double z0, z1;

	normal_pair(key, n, &z0, &z1);
	return z0;
}

/*
 * gauss: x[i] = z[i], standard normal.
 * heavy: x[i] = z[i] * exp(HEAVY_SIGMA * g[i / HEAVY_ROW]) * (spike ? GAIN : 1),
 * with g standard normal per row (a log-normal scale per row, as gradients of
 * different layers or channels differ by orders of magnitude) and a spike
 * where a third stream's draw has its top HEAVY_SPIKE_BITS bits all zero.
 */
static void generate(float *x, size_t count, int kind, uint64_t seed)
{
	uint64_t kz = mix64(seed ^ 0x6761757373ULL);  /* element values */
	uint64_t kg = mix64(seed ^ 0x7363616c65ULL);  /* row scales */
	uint64_t ks = mix64(seed ^ 0x7370696b65ULL);  /* spikes */
	double scale = 1.0;

	for (size_t i = 0; i < count; i += 2) {
		double z[2];

		normal_pair(kz, i / 2, &z[0], &z[1]);
		for (size_t k = 0; k < 2 && i + k < count; k++) {
			size_t e = i + k;
			double v = z[k];

			if (kind == DATA_HEAVY) {
				if (e % HEAVY_ROW == 0)
					scale = exp(HEAVY_SIGMA * normal(kg, e / HEAVY_ROW));
				v *= scale;
				if (draw(ks, e) >> (64 - HEAVY_SPIKE_BITS) == 0)
					v *= HEAVY_SPIKE_GAIN;
			}
			x[e] = (float)v;
		}
	}
}

static const float *input(struct bench *b, int kind)
{
	if (!b->in[kind]) {
		b->in[kind] = alloc_touched(b->count * sizeof(float));
		if (!b->in[kind])
			return NULL;
		generate(b->in[kind], b->count, kind, b->o->seed);
	}
	return b->in[kind];
}

/* ------------------------------------------------------------------------ */
/* Measurements                                                              */

static size_t chunk_count(const struct bench *b, size_t i)
{
	size_t first = i * b->per;

	return b->count - first < b->per ? b->count - first : b->per;
}

static int usable(const struct mp_codec_ops *c)
{
	return c->max_encoded && c->encode && c->decode && c->decode_acc;
}

/* Slots for codec @c and its scratch; 0, or -1 after printing why. */
static int layout(struct bench *b, const struct mp_codec_ops *c)
{
	const struct mp_codec_params *p = &b->o->params;
	size_t total = 0, scratch = 0;

	for (size_t i = 0; i < b->nchunks; i++) {
		size_t n = chunk_count(b, i);
		size_t m = c->max_encoded(p, n);
		size_t slot = round_up(m, SLOT_ALIGN);

		if (m == SIZE_MAX || slot < m || total > SIZE_MAX - slot) {
			fprintf(stderr, PROG ": %s: payloads of %zu floats do not fit in memory\n",
				c->name, b->count);
			return -1;
		}
		b->off[i] = total;
		total += slot;
		/* Only the first and last chunk differ in length; ask for both. */
		if (c->scratch_size && (i == 0 || i + 1 == b->nchunks)) {
			size_t s = c->scratch_size(p, n);

			if (s > scratch)
				scratch = s;
		}
	}
	if (total > b->payload_cap) {
		free(b->payload);
		b->payload_cap = 0;
		b->payload = alloc_touched(total);
		if (!b->payload)
			goto oom;
		b->payload_cap = total;
	}
	if (scratch > b->scratch_cap) {
		free(b->scratch);
		b->scratch_cap = 0;
		b->scratch = alloc_touched(scratch);
		if (!b->scratch)
			goto oom;
		b->scratch_cap = scratch;
	}
	return 0;
oom:
	fprintf(stderr, PROG ": %s: out of memory for the payloads\n", c->name);
	return -1;
}

/* Encode all chunks of @x; @residue NULL or count floats. 0 or -1. */
static int encode_all(struct bench *b, const struct mp_codec_ops *c, const float *x,
		      float *residue)
{
	for (size_t i = 0; i < b->nchunks; i++) {
		size_t first = i * b->per, n = chunk_count(b, i);
		size_t cap = (i + 1 < b->nchunks ? b->off[i + 1] : b->payload_cap) - b->off[i];
		int rc = c->encode(&b->o->params, x + first, residue ? residue + first : NULL, n,
				   b->payload + b->off[i], cap, &b->len[i], b->scratch);

		if (rc) {
			fprintf(stderr, PROG ": %s: encode of chunk %zu (%zu floats) failed: %s\n",
				c->name, i, n, strerror(-rc));
			return -1;
		}
		if (b->len[i] > cap) {
			fprintf(stderr, PROG ": %s: encode of chunk %zu claims %zu bytes in a "
				"%zu-byte slot\n", c->name, i, b->len[i], cap);
			return -1;
		}
	}
	return 0;
}

/* @acc: decode_acc with weight 0.5 into out; else decode into out. 0 or -1. */
static int decode_all(struct bench *b, const struct mp_codec_ops *c, int acc)
{
	for (size_t i = 0; i < b->nchunks; i++) {
		size_t first = i * b->per, n = chunk_count(b, i);
		const void *src = b->payload + b->off[i];
		int rc = acc ? c->decode_acc(src, b->len[i], b->out + first, n, 0.5f)
			     : c->decode(src, b->len[i], b->out + first, n);

		if (rc) {
			fprintf(stderr, PROG ": %s: %s of chunk %zu failed: %s\n", c->name,
				acc ? "decode_acc" : "decode", i, strerror(-rc));
			return -1;
		}
	}
	return 0;
}

/*
 * The yardstick: memcpy of the input, in the same chunks the codecs see. One
 * big memcpy would switch to non-temporal stores past the cache size and so
 * measure a different access pattern from the chunked codec loops.
 */
static double time_memcpy(struct bench *b, const float *x)
{
	double best = INFINITY;

	for (int it = 0; it < b->o->warmup + b->o->iters; it++) {
		double t0 = mp_now_s(), t;

		for (size_t i = 0; i < b->nchunks; i++) {
			size_t first = i * b->per;

			memcpy(b->out + first, x + first, chunk_count(b, i) * sizeof(float));
		}
		clobber(b->out);
		t = mp_now_s() - t0;
		if (it >= b->o->warmup && t < best)
			best = t;
	}
	return best;
}

/* One row; 0, or -1 after printing why. */
static int measure(struct bench *b, const struct mp_codec_ops *c, int kind, struct row *r)
{
	const struct opts *o = b->o;
	const float *x = input(b, kind);
	uint64_t bytes = (uint64_t)b->count * sizeof(float);
	int sparse = (c->flags & MP_CODEC_F_SPARSE) != 0;
	double best, se = 0.0, sx = 0.0;

	memset(r, 0, sizeof(*r));
	r->c = c;
	r->data = kind;
	if (!x) {
		fprintf(stderr, PROG ": out of memory for the %s data\n", data_names[kind]);
		return -1;
	}
	if (layout(b, c) < 0)
		return -1;

	r->cpy_gbs = gbs(bytes, time_memcpy(b, x));

	/* Ratio and error: one plain round trip, no error feedback. */
	if (encode_all(b, c, x, NULL) < 0 || decode_all(b, c, 0) < 0)
		return -1;
	for (size_t i = 0; i < b->nchunks; i++)
		r->payload_bytes += b->len[i];
	for (size_t i = 0; i < b->count; i++) {
		double d = (double)b->out[i] - (double)x[i];

		se += d * d;
		sx += (double)x[i] * (double)x[i];
	}
	r->ratio = r->payload_bytes ? (double)bytes / (double)r->payload_bytes : NAN;
	r->rms_rel = sx > 0.0 ? sqrt(se / sx) : (se > 0.0 ? INFINITY : 0.0);

	/*
	 * Encode with error feedback for sparse codecs, as the library runs
	 * them; the residue starts from zero each time so that every repetition
	 * selects the same elements and does the same work.
	 */
	best = INFINITY;
	for (int it = 0; it < o->warmup + o->iters; it++) {
		double t0, t;

		if (sparse)
			memset(b->residue, 0, b->count * sizeof(float));
		t0 = mp_now_s();
		if (encode_all(b, c, x, sparse ? b->residue : NULL) < 0)
			return -1;
		t = mp_now_s() - t0;
		if (it >= o->warmup && t < best)
			best = t;
	}
	r->enc_gbs = gbs(bytes, best);

	/* The accumulator restarts from zero so that every repetition sees the same values. */
	best = INFINITY;
	for (int it = 0; it < o->warmup + o->iters; it++) {
		double t0, t;

		memset(b->out, 0, b->count * sizeof(float));
		t0 = mp_now_s();
		if (decode_all(b, c, 1) < 0)
			return -1;
		t = mp_now_s() - t0;
		if (it >= o->warmup && t < best)
			best = t;
	}
	r->dec_gbs = gbs(bytes, best);
	return 0;
}

/* ------------------------------------------------------------------------ */
/* Output                                                                    */

#define COLS "%10s %6s %13s %9s %9s %9s %7s %7s %8s %11s\n"

static void print_header(const struct opts *o, size_t per, int cpu)
{
	printf("# " PROG ": kernels %s, size %" PRIu64 " bytes (%" PRIu64 " floats), "
	       "chunk %zu bytes, iters %d, warmup %d, seed %" PRIu64 "\n", mp_k_variant(),
	       o->size, o->size / 4, per * sizeof(float), o->iters, o->warmup, o->seed);
	printf("# params: block %" PRIu32 ", sigmas %g, topk %g, bin %" PRIu32 "; ",
	       o->params.block, (double)o->params.sigmas, (double)o->params.topk_ratio,
	       o->params.bin);
	if (cpu >= 0)
		printf("one thread on cpu %d\n", cpu);
	else
		printf("one thread, not pinned\n");
	printf("# throughput in GB/s (10^9 bytes of fp32 per second); best of %d\n", o->iters);
	printf("#\n");
	printf("#" COLS, "codec", "data", "bytes", "encode", "dec_acc", "memcpy", "enc/cpy",
	       "dec/cpy", "ratio", "rms_rel_err");
	fflush(stdout);
}

static void print_row(const struct row *r, uint64_t bytes)
{
	printf(" %10s %6s %13" PRIu64 " %9.3f %9.3f %9.3f %7.2f %7.2f %8.3f %11.3e\n", r->c->name,
	       data_names[r->data], bytes, r->enc_gbs, r->dec_gbs, r->cpy_gbs,
	       r->enc_gbs / r->cpy_gbs, r->dec_gbs / r->cpy_gbs, r->ratio, r->rms_rel);
	fflush(stdout);
}

static void json_str(FILE *f, const char *s)
{
	fputc('"', f);
	for (; *s; s++) {
		unsigned char ch = (unsigned char)*s;

		if (ch == '"' || ch == '\\')
			fprintf(f, "\\%c", ch);
		else if (ch < 0x20)
			fprintf(f, "\\u%04x", ch);
		else
			fputc(ch, f);
	}
	fputc('"', f);
}

/* JSON has no NaN or infinity: what was not measured is null. */
static void json_num(FILE *f, const char *key, double v)
{
	fprintf(f, ", \"%s\": ", key);
	if (isfinite(v))
		fprintf(f, "%.6g", v);
	else
		fputs("null", f);
}

/* One object per line, so that grep and awk can read it without a JSON parser. */
static int write_json(const struct opts *o, size_t per, const struct row *rows, int nrows)
{
	FILE *f = fopen(o->json, "w");
	int bad;

	if (!f) {
		fprintf(stderr, PROG ": cannot write %s: %s\n", o->json, strerror(errno));
		return -1;
	}
	fputs("[\n", f);
	for (int i = 0; i < nrows; i++) {
		const struct row *r = &rows[i];

		fputs("  {\"codec\": ", f);
		json_str(f, r->c->name);
		fputs(", \"data\": ", f);
		json_str(f, data_names[r->data]);
		fputs(", \"kernels\": ", f);
		json_str(f, mp_k_variant());
		fprintf(f, ", \"bytes\": %" PRIu64 ", \"chunk\": %zu", o->size,
			per * sizeof(float));
		fprintf(f, ", \"iters\": %d, \"warmup\": %d", o->iters, o->warmup);
		json_num(f, "encode_gbs", r->enc_gbs);
		json_num(f, "decode_acc_gbs", r->dec_gbs);
		json_num(f, "memcpy_gbs", r->cpy_gbs);
		json_num(f, "encode_vs_memcpy", r->enc_gbs / r->cpy_gbs);
		json_num(f, "decode_acc_vs_memcpy", r->dec_gbs / r->cpy_gbs);
		json_num(f, "ratio", r->ratio);
		fprintf(f, ", \"payload_bytes\": %" PRIu64, r->payload_bytes);
		json_num(f, "rms_rel_err", r->rms_rel);
		fprintf(f, "}%s\n", i + 1 < nrows ? "," : "");
	}
	fputs("]\n", f);
	bad = ferror(f);
	if (fclose(f) != 0)
		bad = 1;
	if (bad) {
		fprintf(stderr, PROG ": cannot write %s\n", o->json);
		return -1;
	}
	return 0;
}

/* --check: 0 if every checked codec keeps up with half of memcpy. */
static int check_rows(const struct row *rows, int nrows)
{
	int bad = 0;

	for (int i = 0; i < nrows; i++) {
		const struct row *r = &rows[i];
		int checked = 0;

		for (size_t k = 0; k < sizeof(checked_codecs) / sizeof(checked_codecs[0]); k++)
			checked |= !strcmp(r->c->name, checked_codecs[k]);
		if (!checked)
			continue;
		/* Written so that a NaN speed fails too. */
		if (!(r->enc_gbs >= 0.5 * r->cpy_gbs)) {
			fprintf(stderr, PROG ": check: %s/%s encode %.3f GB/s is below half of "
				"memcpy (%.3f GB/s)\n", r->c->name, data_names[r->data], r->enc_gbs,
				r->cpy_gbs);
			bad = 1;
		}
		if (!(r->dec_gbs >= 0.5 * r->cpy_gbs)) {
			fprintf(stderr, PROG ": check: %s/%s decode_acc %.3f GB/s is below half of "
				"memcpy (%.3f GB/s)\n", r->c->name, data_names[r->data], r->dec_gbs,
				r->cpy_gbs);
			bad = 1;
		}
	}
	return bad ? -1 : 0;
}

/* ------------------------------------------------------------------------ */
/* Options                                                                   */

static void usage(FILE *f)
{
	fprintf(f,
		"Usage: " PROG " [OPTIONS]\n"
		"Measure encode and decode-and-accumulate throughput, compression ratio and\n"
		"error of the moshpit wire codecs on one core.\n"
		"\n"
		"  --codec=A,B,...      codecs to measure (default all: none, fp16, bf16,\n"
		"                       uniform8, blockwise8, topk, adacomp)\n"
		"  --data=A,B           data sets: gauss, heavy (default both)\n"
		"  --size=SIZE          bytes of fp32 input (default 64M)\n"
		"  --chunk=SIZE         bytes of fp32 per encoded chunk (default 256K)\n"
		"  --iters=N            timed repetitions, best one kept (default 5)\n"
		"  --warmup=N           untimed repetitions first (default 1)\n"
		"  --seed=S             seed of the data (default 1)\n"
		"  SIZE: digits, then optionally K, M or G (powers of 1024) and B, as in\n"
		"  4096, 64K or 1MB; a multiple of 4.\n"
		"\n"
		"Codec settings:\n"
		"  --block=N            blockwise8: floats per scale (default 4096)\n"
		"  --sigmas=K           uniform8: range mean +- K stddev (default 6)\n"
		"  --topk=FRACTION      topk: fraction of the floats kept (default 0.01)\n"
		"  --bin=L|conv|fc      adacomp: bin length (conv = 50, fc = 500, default fc)\n"
		"\n"
		"  --kernels=NAME       scalar, avx2, avx512 or auto (default: MP_KERNELS,\n"
		"                       else auto)\n"
		"  --json=FILE          also write the rows as a JSON list\n"
		"  --check              exit 1 if fp16, bf16, uniform8 or blockwise8 encodes\n"
		"                       or decodes slower than half of memcpy\n"
		"  -h, --help           show this help\n"
		"\n"
		"Exit status: 0 ok, 1 a failure (or --check failed), 2 bad usage.\n");
}

/* "256K", "64M", "1G", "4096" -> bytes (powers of 1024); a multiple of 4 in [lo, hi]. */
/* A byte count of whole floats. */
static uint64_t parse_floats(const char *opt, const char *s, uint64_t lo, uint64_t hi)
{
	uint64_t v = parse_size(opt, s, lo, hi);

	if (v % 4)
		usage_error("bad size '%s' for %s (a multiple of 4 bytes)", s, opt);
	return v;
}

static void add_codec(struct opts *o, const struct mp_codec_ops *c)
{
	for (int i = 0; i < o->ncodecs; i++)
		if (o->codec[i] == c)
			return; /* listed twice: measured once */
	if (o->ncodecs < MAX_CODECS)
		o->codec[o->ncodecs++] = c;
}

static void add_all_codecs(struct opts *o)
{
	for (unsigned id = 0; id < mp_codec_count(); id++) {
		const struct mp_codec_ops *c = mp_codec_by_id(id);

		if (c)
			add_codec(o, c);
	}
}

static void known_codecs(char *buf, size_t len)
{
	size_t off = 0;

	buf[0] = '\0';
	for (unsigned id = 0; id < mp_codec_count() && off < len; id++) {
		const struct mp_codec_ops *c = mp_codec_by_id(id);

		if (c)
			off += (size_t)snprintf(buf + off, len - off, "%s%s", off ? ", " : "",
						c->name);
	}
}

/* Comma-separated names; @codecs selects which list. */
static void parse_list(struct opts *o, const char *opt, const char *arg, int codecs)
{
	char *copy = strdup(arg), *save = NULL, *tok;
	char known[256];

	if (!copy) {
		fprintf(stderr, PROG ": out of memory\n");
		exit(EXIT_FAIL);
	}
	/* A later option replaces an earlier one rather than adding to it. */
	if (codecs)
		o->ncodecs = 0;
	else
		o->ndata = 0;
	if (!*arg || arg[strlen(arg) - 1] == ',' || *arg == ',' || strstr(arg, ",,"))
		usage_error("bad list '%s' for %s (names separated by single commas)", arg, opt);
	for (tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		if (codecs) {
			const struct mp_codec_ops *c = mp_codec_by_name(tok);

			if (!strcasecmp(tok, "all")) {
				add_all_codecs(o);
				continue;
			}
			if (!c) {
				known_codecs(known, sizeof(known));
				usage_error("unknown codec '%s' (known: %s, or all)", tok, known);
			}
			add_codec(o, c);
		} else {
			int k, dup = 0;

			for (k = 0; k < NDATA; k++)
				if (!strcasecmp(tok, data_names[k]))
					break;
			if (k == NDATA)
				usage_error("unknown data set '%s' (gauss or heavy)", tok);
			for (int i = 0; i < o->ndata; i++)
				dup |= o->data[i] == k;
			if (!dup)
				o->data[o->ndata++] = k;
		}
	}
	free(copy);
}

enum {
	OPT_CODEC = 256,
	OPT_DATA,
	OPT_SIZE,
	OPT_CHUNK,
	OPT_ITERS,
	OPT_WARMUP,
	OPT_SEED,
	OPT_BLOCK,
	OPT_SIGMAS,
	OPT_TOPK,
	OPT_BIN,
	OPT_KERNELS,
	OPT_JSON,
	OPT_CHECK,
};

static const struct option long_opts[] = {
	{ "codec", required_argument, NULL, OPT_CODEC },
	{ "data", required_argument, NULL, OPT_DATA },
	{ "size", required_argument, NULL, OPT_SIZE },
	{ "chunk", required_argument, NULL, OPT_CHUNK },
	{ "iters", required_argument, NULL, OPT_ITERS },
	{ "warmup", required_argument, NULL, OPT_WARMUP },
	{ "seed", required_argument, NULL, OPT_SEED },
	{ "block", required_argument, NULL, OPT_BLOCK },
	{ "sigmas", required_argument, NULL, OPT_SIGMAS },
	{ "topk", required_argument, NULL, OPT_TOPK },
	{ "bin", required_argument, NULL, OPT_BIN },
	{ "kernels", required_argument, NULL, OPT_KERNELS },
	{ "json", required_argument, NULL, OPT_JSON },
	{ "check", no_argument, NULL, OPT_CHECK },
	{ "help", no_argument, NULL, 'h' },
	{ NULL, 0, NULL, 0 },
};

static void parse_args(struct opts *o, int argc, char **argv)
{
	int ch;

	cli_init(PROG);
	memset(o, 0, sizeof(*o));
	o->size = 64ULL << 20;
	o->chunk = 256ULL << 10;
	o->iters = 5;
	o->warmup = 1;
	o->seed = 1;
	mp_codec_params_default(&o->params);

	opterr = 0; /* our own messages, with the usage */
	while ((ch = getopt_long(argc, argv, ":h", long_opts, NULL)) != -1) {
		switch (ch) {
		case OPT_CODEC:
			parse_list(o, "--codec", optarg, 1);
			break;
		case OPT_DATA:
			parse_list(o, "--data", optarg, 0);
			break;
		case OPT_SIZE:
			o->size = parse_floats("--size", optarg, 4, SIZE_MAX_BYTES);
			break;
		case OPT_CHUNK:
			o->chunk = parse_floats("--chunk", optarg, CHUNK_MIN, CHUNK_MAX);
			break;
		case OPT_ITERS:
			o->iters = (int)parse_int("--iters", optarg, 1, 1000000);
			break;
		case OPT_WARMUP:
			o->warmup = (int)parse_int("--warmup", optarg, 0, 1000000);
			break;
		case OPT_SEED:
			o->seed = parse_u64("--seed", optarg);
			break;
		case OPT_BLOCK:
			o->params.block = (uint32_t)parse_int("--block", optarg, 1, 1 << 24);
			break;
		case OPT_SIGMAS:
			o->params.sigmas = (float)parse_real("--sigmas", optarg, -HUGE_VAL, HUGE_VAL);
			if (!(o->params.sigmas > 0.0f && o->params.sigmas <= 64.0f))
				usage_error("--sigmas=%s must be above 0 and at most 64", optarg);
			break;
		case OPT_TOPK:
			o->params.topk_ratio = (float)parse_real("--topk", optarg, -HUGE_VAL, HUGE_VAL);
			if (!(o->params.topk_ratio > 0.0f && o->params.topk_ratio <= 1.0f))
				usage_error("--topk=%s must be above 0 and at most 1", optarg);
			break;
		case OPT_BIN:
			if (!strcasecmp(optarg, "conv"))
				o->params.bin = MP_CODEC_DEF_BIN_CONV;
			else if (!strcasecmp(optarg, "fc"))
				o->params.bin = MP_CODEC_DEF_BIN_FC;
			else
				o->params.bin = (uint32_t)parse_int("--bin", optarg, 1, 1 << 24);
			break;
		case OPT_KERNELS:
			o->kernels = optarg;
			break;
		case OPT_JSON:
			if (!*optarg)
				usage_error("empty --json");
			o->json = optarg;
			break;
		case OPT_CHECK:
			o->check = 1;
			break;
		case 'h':
			usage(stdout);
			exit(EXIT_OK);
		case ':':
			usage_error("%s needs a value", argv[optind - 1]);
		default:
			usage_error("unknown option '%s'", argv[optind - 1]);
		}
	}
	if (optind < argc)
		usage_error("unexpected argument '%s'", argv[optind]);
	if (!o->ncodecs)
		add_all_codecs(o);
	if (!o->ndata) {
		o->data[o->ndata++] = DATA_GAUSS;
		o->data[o->ndata++] = DATA_HEAVY;
	}
	if (mp_codec_params_check(&o->params))
		usage_error("codec settings out of range");
	mp_codec_log_kernels(); /* what became of MP_KERNELS, before --kernels overrides it */
	if (o->kernels) {
		int rc = mp_k_force(o->kernels);

		if (rc == -ENOTSUP)
			usage_error("--kernels=%s: this CPU or this build cannot run that variant "
				    "(try auto)", o->kernels);
		if (rc)
			usage_error("unknown kernel variant '%s' (scalar, avx2, avx512 or auto)",
				    o->kernels);
	}
}

/* ------------------------------------------------------------------------ */

/*
 * Stay on the CPU we started on: a migration in the middle of a timed loop
 * lands on cold caches. Best effort; returns the CPU or -1.
 */
static int pin_here(void)
{
#ifdef __linux__
	cpu_set_t set;
	int cpu = sched_getcpu();

	if (cpu < 0)
		return -1;
	CPU_ZERO(&set);
	CPU_SET(cpu, &set);
	if (sched_setaffinity(0, sizeof(set), &set))
		return -1;
	return cpu;
#else
	return -1;
#endif
}

int main(int argc, char **argv)
{
	struct opts o;
	struct bench b;
	struct row *rows;
	int nrows = 0, failed = 0, need_residue = 0, cpu;

	parse_args(&o, argc, argv);
	if (o.size / sizeof(float) > SIZE_MAX / sizeof(float)) {
		fprintf(stderr, PROG ": --size=%" PRIu64 " does not fit this address space\n",
			o.size);
		return EXIT_FAIL;
	}
	memset(&b, 0, sizeof(b));
	b.o = &o;
	b.count = (size_t)(o.size / sizeof(float));
	b.per = (size_t)(o.chunk / sizeof(float));
	if (b.per > b.count)
		b.per = b.count;
	b.nchunks = (b.count + b.per - 1) / b.per;

	for (int i = 0; i < o.ncodecs; i++)
		need_residue |= usable(o.codec[i]) && (o.codec[i]->flags & MP_CODEC_F_SPARSE);
	rows = calloc((size_t)o.ncodecs * NDATA, sizeof(*rows));
	b.off = calloc(b.nchunks, sizeof(size_t));
	b.len = calloc(b.nchunks, sizeof(size_t));
	b.out = alloc_touched(b.count * sizeof(float));
	if (need_residue)
		b.residue = alloc_touched(b.count * sizeof(float));
	if (!rows || !b.off || !b.len || !b.out || (need_residue && !b.residue)) {
		fprintf(stderr, PROG ": out of memory for %" PRIu64 " bytes of input\n", o.size);
		return EXIT_FAIL;
	}

	cpu = pin_here();
	print_header(&o, b.per, cpu);
	for (int i = 0; i < o.ncodecs; i++) {
		const struct mp_codec_ops *c = o.codec[i];

		if (!usable(c)) {
			/* Registered but not built yet: nothing to time. */
			fprintf(stderr, PROG ": note: codec %s has no encoder or decoder in this "
				"build; skipped\n", c->name);
			continue;
		}
		for (int d = 0; d < o.ndata; d++) {
			struct row *r = &rows[nrows];

			if (measure(&b, c, o.data[d], r) < 0) {
				failed = 1;
				break;
			}
			print_row(r, o.size);
			nrows++;
		}
	}
	if (o.json && write_json(&o, b.per, rows, nrows) < 0)
		failed = 1;
	if (o.check && check_rows(rows, nrows) < 0)
		failed = 1;

	for (int k = 0; k < NDATA; k++)
		free(b.in[k]);
	free(b.out);
	free(b.residue);
	free(b.payload);
	free(b.scratch);
	free(b.off);
	free(b.len);
	free(rows);
	return failed ? EXIT_FAIL : EXIT_OK;
}
