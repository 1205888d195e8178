/* SPDX-License-Identifier: BSD-3-Clause */
/* The run-shared settings, their wire entries and their comparison (settings.h). */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <moshpit/sdk/le.h>

#include "settings.h"

/* Entry tags (doc/protocol.md, "Settings agreement"). Never reused. */
enum {
	T_ALGO = 1,     /* u8 */
	T_GRID = 2,     /* u8 ndims, then ndims u16 */
	T_ROUNDS = 3,   /* u32 */
	T_CODEC = 4,    /* u8 policy, u32 block, f32 sigmas, f32 topk ratio, u32 bin */
	T_CHUNK = 5,    /* u64 elements */
	T_STREAMS = 6,  /* u32 */
	T_NPEERS = 7,   /* u32, 0 unset */
	T_BW = 8,       /* u64 fingerprint, then the list as text (0..47 bytes) */
	T_MIN_PART = 9, /* u64 */
	T_FINITE = 10,  /* u8 */
	T_DYNAMIC = 11, /* u8: dht rendezvous */
	T_BALANCE = 12, /* u8: enum mp_balance */
	T_DIRECT = 13,  /* u64: MP_DIRECT_MAX, bytes */
	T_PAIRS = 14,   /* u8: MP_DIRECT_PAIRS */
};

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
	const uint8_t *b = p;

	for (size_t i = 0; i < n; i++) {
		h ^= b[i];
		h *= 0x100000001b3ull;
	}
	return h;
}

#define FNV_INIT 0xcbf29ce484222325ull

void mp_settings_make(struct mp_settings *s, const struct mp_config *cfg, const struct mp_grid *grid,
		      int streams, size_t chunk_elems, int c, const struct mp_codec_params *cp,
		      const double *bw, int npeers, int dynamic)
{
	memset(s, 0, sizeof(*s));
	s->algo = (uint8_t)cfg->algo;
	s->ndims = (uint8_t)grid->ndims;
	for (int i = 0; i < grid->ndims; i++)
		s->dims[i] = (uint16_t)grid->dims[i];
	s->rounds = (uint32_t)(cfg->rounds ? cfg->rounds : grid->ndims);
	s->codec = (uint8_t)c;
	/* Only the parameters of the codec in use: another codec's are inert.
	 * "auto" may pick blockwise8. */
	if (c == MP_CODEC_BLOCKWISE8 || c == MP_CODEC_AUTO)
		s->codec_block = cp->block;
	if (c == MP_CODEC_UNIFORM8)
		s->codec_sigmas = cp->sigmas;
	if (c == MP_CODEC_TOPK)
		s->topk_ratio = cp->topk_ratio;
	if (c == MP_CODEC_ADACOMP)
		s->adacomp_bin = cp->bin;
	s->chunk_elems = chunk_elems;
	s->streams = (uint32_t)streams;
	s->npeers = cfg->npeers > 0 ? (uint32_t)cfg->npeers : 0;
	s->min_part = cfg->min_part;
	s->check_finite = cfg->check_finite != 0;
	s->balance = (uint8_t)cfg->balance;
	s->dynamic = (uint8_t)(dynamic != 0);
	s->direct_max = cfg->direct_max;
	s->direct_pairs = cfg->direct_pairs != 0;
	if (!dynamic && bw) {
		/* Every rank's part weight, as each peer computes the split. */
		size_t off = 0;
		int fits = 1;

		s->bw_fp = FNV_INIT;
		for (int i = 0; i < npeers; i++) {
			double b = bw[i];
			char one[32];
			int n = snprintf(one, sizeof(one), "%s%g", i ? "," : "", b);

			s->bw_fp = fnv(s->bw_fp, &b, sizeof(b));
			if (fits && off + (size_t)n < sizeof(s->bw_text)) {
				memcpy(s->bw_text + off, one, (size_t)n + 1);
				off += (size_t)n;
			} else {
				fits = 0;
			}
		}
		if (!fits)
			s->bw_text[0] = 0;
	}
}

static uint8_t *entry(uint8_t *p, int tag, size_t len)
{
	p[0] = (uint8_t)tag;
	p[1] = (uint8_t)len;
	return p + 2;
}

static void put_f32(uint8_t *p, float f)
{
	uint32_t u;

	memcpy(&u, &f, sizeof(u));
	mp_le_put32(p, u);
}

static float get_f32(const uint8_t *p)
{
	uint32_t u = mp_le_get32(p);
	float f;

	memcpy(&f, &u, sizeof(f));
	return f;
}

size_t mp_settings_encode(const struct mp_settings *s, uint8_t *buf)
{
	uint8_t *p = buf, *v;
	size_t bl = strlen(s->bw_text);

	v = entry(p, T_ALGO, 1);
	v[0] = s->algo;
	p = v + 1;
	v = entry(p, T_GRID, 1 + 2 * (size_t)s->ndims);
	v[0] = s->ndims;
	for (int i = 0; i < s->ndims; i++)
		mp_le_put16(v + 1 + 2 * i, s->dims[i]);
	p = v + 1 + 2 * s->ndims;
	v = entry(p, T_ROUNDS, 4);
	mp_le_put32(v, s->rounds);
	p = v + 4;
	v = entry(p, T_CODEC, 17);
	v[0] = s->codec;
	mp_le_put32(v + 1, s->codec_block);
	put_f32(v + 5, s->codec_sigmas);
	put_f32(v + 9, s->topk_ratio);
	mp_le_put32(v + 13, s->adacomp_bin);
	p = v + 17;
	v = entry(p, T_CHUNK, 8);
	mp_le_put64(v, s->chunk_elems);
	p = v + 8;
	v = entry(p, T_STREAMS, 4);
	mp_le_put32(v, s->streams);
	p = v + 4;
	v = entry(p, T_NPEERS, 4);
	mp_le_put32(v, s->npeers);
	p = v + 4;
	v = entry(p, T_BW, 8 + bl);
	mp_le_put64(v, s->bw_fp);
	memcpy(v + 8, s->bw_text, bl);
	p = v + 8 + bl;
	v = entry(p, T_MIN_PART, 8);
	mp_le_put64(v, s->min_part);
	p = v + 8;
	v = entry(p, T_FINITE, 1);
	v[0] = s->check_finite;
	p = v + 1;
	v = entry(p, T_DYNAMIC, 1);
	v[0] = s->dynamic;
	p = v + 1;
	v = entry(p, T_BALANCE, 1);
	v[0] = s->balance;
	p = v + 1;
	v = entry(p, T_DIRECT, 8);
	mp_le_put64(v, s->direct_max);
	p = v + 8;
	v = entry(p, T_PAIRS, 1);
	v[0] = s->direct_pairs;
	p = v + 1;
	return (size_t)(p - buf);
}

int mp_settings_decode(const uint8_t *buf, size_t len, struct mp_settings *s)
{
	memset(s, 0, sizeof(*s));
	for (size_t o = 0; o < len;) {
		if (len - o < 2 || len - o - 2 < buf[o + 1])
			return -EBADMSG;
		int tag = buf[o];
		size_t n = buf[o + 1];
		const uint8_t *v = buf + o + 2;

		o += 2 + n;
		switch (tag) {
		case T_ALGO:
		case T_FINITE:
		case T_DYNAMIC:
		case T_BALANCE:
		case T_PAIRS:
			if (n != 1)
				return -EBADMSG;
			if (tag == T_ALGO)
				s->algo = v[0];
			else if (tag == T_FINITE)
				s->check_finite = v[0];
			else if (tag == T_PAIRS)
				s->direct_pairs = v[0];
			else if (tag == T_BALANCE)
				s->balance = v[0];
			else
				s->dynamic = v[0];
			break;
		case T_GRID:
			if (n < 1 || v[0] > MP_MAX_GRID_DIMS || n != 1 + 2 * (size_t)v[0])
				return -EBADMSG;
			s->ndims = v[0];
			for (int i = 0; i < s->ndims; i++)
				s->dims[i] = mp_le_get16(v + 1 + 2 * i);
			break;
		case T_ROUNDS:
		case T_STREAMS:
		case T_NPEERS:
			if (n != 4)
				return -EBADMSG;
			*(tag == T_ROUNDS ? &s->rounds : tag == T_STREAMS ? &s->streams : &s->npeers) =
				mp_le_get32(v);
			break;
		case T_CODEC:
			if (n != 17)
				return -EBADMSG;
			s->codec = v[0];
			s->codec_block = mp_le_get32(v + 1);
			s->codec_sigmas = get_f32(v + 5);
			s->topk_ratio = get_f32(v + 9);
			s->adacomp_bin = mp_le_get32(v + 13);
			break;
		case T_CHUNK:
		case T_MIN_PART:
		case T_DIRECT:
			if (n != 8)
				return -EBADMSG;
			*(tag == T_CHUNK ? &s->chunk_elems : tag == T_MIN_PART ? &s->min_part :
					   &s->direct_max) = mp_le_get64(v);
			break;
		case T_BW:
			if (n < 8 || n - 8 >= sizeof(s->bw_text))
				return -EBADMSG;
			s->bw_fp = mp_le_get64(v);
			memcpy(s->bw_text, v + 8, n - 8);
			s->bw_text[n - 8] = 0;
			/* Text is for messages only: keep it printable. */
			for (size_t i = 0; i < n - 8; i++)
				if (s->bw_text[i] < 0x20 || s->bw_text[i] > 0x7e)
					s->bw_text[i] = '?';
			break;
		default:
			/* A field a later version added: not ours to judge. */
			continue;
		}
		if (tag < 32)
			s->present |= 1u << tag;
	}
	return 0;
}

static void grid_text(const struct mp_settings *s, char *buf, size_t len)
{
	size_t o = 0;

	buf[0] = 0;
	for (int i = 0; i < s->ndims && o < len; i++)
		o += (size_t)snprintf(buf + o, len - o, "%s%u", i ? "x" : "", s->dims[i]);
	if (!s->ndims)
		snprintf(buf, len, "(none)");
}

static const char *algo_text(unsigned a)
{
	return a == MP_ALGO_MOSHPIT ? "moshpit" : a == MP_ALGO_RING ? "ring"
		: a == MP_ALGO_BUTTERFLY ? "butterfly" : "unknown";
}

static const char *codec_text(unsigned c)
{
	static const char *const names[] = {"none", "fp16", "bf16", "uniform8", "blockwise8",
					    "topk", "adacomp"};

	if (c == MP_CODEC_AUTO)
		return "auto";
	return c < sizeof(names) / sizeof(names[0]) ? names[c] : "unknown";
}

static int diff_msg(char *msg, size_t len, const char *field, const char *ours, const char *theirs)
{
	snprintf(msg, len, "%s differs: ours %s, theirs %s", field, ours, theirs);
	return -EBADE;
}

int mp_settings_diff(const struct mp_settings *a, const struct mp_settings *b, char *msg, size_t len)
{
	char x[96], y[96];

#define U(field, name)                                                                  \
	do {                                                                            \
		if (a->field != b->field) {                                             \
			snprintf(x, sizeof(x), "%" PRIu64, (uint64_t)a->field);         \
			snprintf(y, sizeof(y), "%" PRIu64, (uint64_t)b->field);         \
			return diff_msg(msg, len, name, x, y);                          \
		}                                                                       \
	} while (0)

	if (a->dynamic != b->dynamic)
		return diff_msg(msg, len, "rendezvous", a->dynamic ? "dht" : "static",
				b->dynamic ? "dht" : "static");
	if (a->algo != b->algo)
		return diff_msg(msg, len, "algorithm", algo_text(a->algo), algo_text(b->algo));
	if (a->ndims != b->ndims || memcmp(a->dims, b->dims, sizeof(a->dims[0]) * a->ndims)) {
		grid_text(a, x, sizeof(x));
		grid_text(b, y, sizeof(y));
		return diff_msg(msg, len, "grid", x, y);
	}
	U(rounds, "rounds");
	if (a->codec != b->codec)
		return diff_msg(msg, len, "codec", codec_text(a->codec), codec_text(b->codec));
	U(codec_block, "codec block (MP_CODEC_BLOCK)");
	if (a->codec_sigmas != b->codec_sigmas) {
		snprintf(x, sizeof(x), "%g", (double)a->codec_sigmas);
		snprintf(y, sizeof(y), "%g", (double)b->codec_sigmas);
		return diff_msg(msg, len, "codec sigmas (MP_CODEC_SIGMAS)", x, y);
	}
	if (a->topk_ratio != b->topk_ratio) {
		snprintf(x, sizeof(x), "%g", (double)a->topk_ratio);
		snprintf(y, sizeof(y), "%g", (double)b->topk_ratio);
		return diff_msg(msg, len, "topk ratio (MP_TOPK_RATIO)", x, y);
	}
	U(adacomp_bin, "adacomp bin (MP_ADACOMP_BIN)");
	if (a->chunk_elems != b->chunk_elems) {
		snprintf(x, sizeof(x), "%" PRIu64 " bytes", a->chunk_elems * 4);
		snprintf(y, sizeof(y), "%" PRIu64 " bytes", b->chunk_elems * 4);
		return diff_msg(msg, len, "chunk size (MP_CHUNK_BYTES)", x, y);
	}
	U(streams, "streams (MP_NSTREAMS)");
	if (a->npeers && b->npeers)
		U(npeers, "peer count");
	if (!a->dynamic && a->bw_fp != b->bw_fp) {
		snprintf(x, sizeof(x), "%s%s(fingerprint %016" PRIx64 ")", a->bw_text,
			 *a->bw_text ? " " : "", a->bw_fp);
		snprintf(y, sizeof(y), "%s%s(fingerprint %016" PRIx64 ")", b->bw_text,
			 *b->bw_text ? " " : "", b->bw_fp);
		return diff_msg(msg, len, "bandwidths (MP_BANDWIDTHS)", x, y);
	}
	U(min_part, "min part (MP_MIN_PART)");
	U(check_finite, "check finite (MP_CHECK_FINITE)");
	if (a->balance != b->balance)
		return diff_msg(msg, len, "balance (MP_BALANCE)",
				a->balance ? "measured" : "configured",
				b->balance ? "measured" : "configured");
	U(direct_max, "direct exchange limit (MP_DIRECT_MAX)");
	U(direct_pairs, "pairwise short vectors (MP_DIRECT_PAIRS)");
#undef U
	return 0;
}

uint64_t mp_settings_fingerprint(const struct mp_settings *s)
{
	struct mp_settings t = *s;
	uint8_t buf[MP_SETTINGS_MAX];
	uint64_t h;

	/* Per peer in a dht run: left out (settings.h). */
	t.npeers = 0;
	t.bw_fp = 0;
	t.bw_text[0] = 0;
	h = fnv(FNV_INIT, buf, mp_settings_encode(&t, buf));
	return h ? h : 1;
}
