/* SPDX-License-Identifier: BSD-3-Clause */
/* Configuration: defaults, MP_* environment variables, peer lists. */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core.h"
#include "log.h"
#include "size.h"

#define MP_DEFAULT_PORT 29500

/* Backoff of a static run's background probes of a down peer (peers.c):
 * defaults and the range of both ends. An hour at most: a peer probed less
 * often than that is as good as forgotten, and twice the longest interval
 * stays far inside the uint32_t that holds it. */
#define MP_PROBE_DEF_MIN_MS 1000
#define MP_PROBE_DEF_MAX_MS 30000
#define MP_PROBE_LO_MS 10
#define MP_PROBE_HI_MS 3600000

void mp_config_init(struct mp_config *cfg)
{
	memset(cfg, 0, sizeof(*cfg));
	cfg->size = sizeof(*cfg);
	cfg->rank = -1;
	cfg->run_name = "moshpit";
	cfg->transport = "tcp";
	cfg->algo = MP_ALGO_MOSHPIT;
	cfg->codec = MP_CODEC_NONE;
	cfg->chunk_bytes = 256 * 1024;
	cfg->window = 4;
	cfg->connect_timeout_ms = 10000;
	cfg->round_timeout_ms = 10000;
	cfg->spin_us = 0;
	cfg->log_level = -1;
	cfg->codec_block = MP_CODEC_DEF_BLOCK;
	cfg->codec_sigmas = MP_CODEC_DEF_SIGMAS;
	cfg->topk_ratio = MP_CODEC_DEF_TOPK;
	cfg->adacomp_bin = MP_CODEC_DEF_BIN_FC;
	cfg->rendezvous = "static";
	cfg->mode = MP_MODE_NORMAL;
	cfg->bandwidth = -1.0;
	cfg->min_group_size = 2;
	cfg->matchmaking_ms = 5000;
	cfg->request_timeout_ms = 3000;
	cfg->allreduce_timeout_ms = 60000;
	cfg->record_ttl_ms = 15000;
	cfg->join_timeout_ms = 30000;
	cfg->probe_min_ms = MP_PROBE_DEF_MIN_MS;
	cfg->probe_max_ms = MP_PROBE_DEF_MAX_MS;
	cfg->direct_max = MP_DIRECT_MAX_DEFAULT;
	cfg->direct_pairs = 1;
	cfg->max_handshakes = MP_MAX_HANDSHAKES_DEFAULT;
}

int mp_mode_from_name(const char *s)
{
	if (!s)
		return -EINVAL;
	if (!strcasecmp(s, "normal"))
		return MP_MODE_NORMAL;
	if (!strcasecmp(s, "client"))
		return MP_MODE_CLIENT;
	if (!strcasecmp(s, "aux") || !strcasecmp(s, "auxiliary"))
		return MP_MODE_AUX;
	return -EINVAL;
}

void mp_config_codec_params(const struct mp_config *cfg, struct mp_codec_params *p)
{
	*p = (struct mp_codec_params){.block = cfg->codec_block, .sigmas = cfg->codec_sigmas,
				      .topk_ratio = cfg->topk_ratio, .bin = cfg->adacomp_bin};
}

static int parse_float(const char *s, float lo, float hi, float *out)
{
	char *end;
	double v;
	float f;

	if (!s || !*s)
		return -EINVAL;
	errno = 0;
	v = strtod(s, &end);
	if (errno || end == s || *end || !(v > lo && v <= hi))
		return -EINVAL;
	/* The float stored must be in range too: a double such as 5e-73 is
	 * above 0 and rounds to 0.0f, which mp_config_resolve then refused at
	 * mp_init (found by fuzz_mpbench_opts through mpbench --codec). */
	f = (float)v;
	if (!(f > lo && f <= hi))
		return -EINVAL;
	*out = f;
	return 0;
}

static int parse_uint(const char *s, unsigned lo, unsigned hi, unsigned *out)
{
	char *end;
	unsigned long v;

	if (!s || !*s || !isdigit((unsigned char)*s))
		return -EINVAL;
	errno = 0;
	v = strtoul(s, &end, 10);
	if (errno || *end || v < lo || v > hi)
		return -EINVAL;
	*out = (unsigned)v;
	return 0;
}

/* "conv" / "fc" / a number. */
static int parse_bin(const char *s, unsigned *out)
{
	if (s && !strcasecmp(s, "conv")) {
		*out = MP_CODEC_DEF_BIN_CONV;
		return 0;
	}
	if (s && !strcasecmp(s, "fc")) {
		*out = MP_CODEC_DEF_BIN_FC;
		return 0;
	}
	return parse_uint(s, 1, 1u << 24, out);
}

/* The codec names mp_codec_parse knows, for messages. */
#define CODEC_NAMES "none, fp16, bf16, uniform8, blockwise8, topk, adacomp or auto"

/*
 * mp_codec_parse with its reason: on -EINVAL @why says what was wrong and,
 * for a parameter, its range ("topk ratio 5 out of range (0, 1]"), so that
 * every caller (MP_CODEC, mpbench --codec, an integrator) can name it.
 */
static int codec_parse_why(const char *spec, struct mp_config *cfg, char *why, size_t whylen)
{
	char name[32];
	const char *colon, *arg;
	size_t len;
	int id;

	if (!spec || !cfg) {
		snprintf(why, whylen, "no codec specification or no configuration");
		return -EINVAL;
	}
	colon = strchr(spec, ':');
	len = colon ? (size_t)(colon - spec) : strlen(spec);
	if (len >= sizeof(name)) {
		snprintf(why, whylen, "unknown codec \"%.*s...\" (" CODEC_NAMES ")", 16, spec);
		return -EINVAL;
	}
	memcpy(name, spec, len);
	name[len] = 0;
	id = mp_codec_from_name(name);
	if (id < 0) {
		snprintf(why, whylen, "unknown codec \"%s\" (" CODEC_NAMES ")", name);
		return -EINVAL;
	}
	if (!colon) {
		cfg->codec = id;
		return 0;
	}
	arg = colon + 1;
	/* Parse into a local first: nothing changes on error. */
	switch (id) {
	case MP_CODEC_BLOCKWISE8: {
		unsigned b;
		if (parse_uint(arg, 1, 1u << 24, &b)) {
			snprintf(why, whylen, "blockwise8 block \"%s\" out of range: a whole number "
				 "in [1, 16777216]", arg);
			return -EINVAL;
		}
		cfg->codec_block = b;
		break;
	}
	case MP_CODEC_UNIFORM8: {
		float k;
		if (parse_float(arg, 0.0f, 64.0f, &k)) {
			snprintf(why, whylen, "uniform8 sigmas %s out of range (0, 64]", arg);
			return -EINVAL;
		}
		cfg->codec_sigmas = k;
		break;
	}
	case MP_CODEC_TOPK: {
		float r;
		if (parse_float(arg, 0.0f, 1.0f, &r)) {
			snprintf(why, whylen, "topk ratio %s out of range (0, 1]", arg);
			return -EINVAL;
		}
		cfg->topk_ratio = r;
		break;
	}
	case MP_CODEC_ADACOMP: {
		unsigned b;
		if (parse_bin(arg, &b)) {
			snprintf(why, whylen, "adacomp bin \"%s\": expected conv, fc or a length in "
				 "[1, 16777216]", arg);
			return -EINVAL;
		}
		cfg->adacomp_bin = b;
		break;
	}
	default:
		/* this codec takes no parameter */
		snprintf(why, whylen, "codec %s takes no parameter (got \":%s\"; only uniform8, "
			 "blockwise8, topk and adacomp do)", name, arg);
		return -EINVAL;
	}
	cfg->codec = id;
	return 0;
}

int mp_codec_parse(const char *spec, struct mp_config *cfg)
{
	char why[200];
	int rc = codec_parse_why(spec, cfg, why, sizeof(why));

	/* Not logged: the caller decides (mp_config_from_env logs MP_CODEC's). */
	if (rc)
		mp_note_init_error("codec: %s", why);
	return rc;
}

int mp_algo_from_name(const char *s)
{
	if (!s)
		return -EINVAL;
	if (!strcasecmp(s, "moshpit"))
		return MP_ALGO_MOSHPIT;
	if (!strcasecmp(s, "ring"))
		return MP_ALGO_RING;
	if (!strcasecmp(s, "butterfly"))
		return MP_ALGO_BUTTERFLY;
	return -EINVAL;
}

/*
 * One bad variable of mp_config_from_env: logged at WARN like every other,
 * and the first one is what mp_last_error(NULL) says, whatever MP_DEBUG is
 * (a user who silenced the log must still learn which variable was wrong).
 */
static void env_bad(int *bad, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void env_bad(int *bad, const char *fmt, ...)
{
	char msg[256];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (!*bad)
		mp_set_init_error("%s", msg);
	else
		MP_WARN("%s", msg);
	(*bad)++;
}

/*
 * A number in [@min, @max] in the size grammar (size.h: digits, then
 * optionally K, M or G and B), for every numeric variable read here: 1 with
 * *@out set, 0 when the variable is unset or empty, -EINVAL (counted in
 * *@bad, see env_bad) otherwise. None of them takes a negative value, so no
 * sign is accepted.
 */
static int env_int(const char *name, uint64_t min, uint64_t max, uint64_t *out, int *bad)
{
	const char *v = getenv(name);
	uint64_t x;
	int rc;

	if (!v || !*v)
		return 0;
	rc = mp_parse_size(v, &x);
	if (rc == -EINVAL) {
		env_bad(bad, "%s=%s: expected a whole number in [%llu, %llu], optionally followed "
			"by K, M or G (powers of 1024) and B", name, v, (unsigned long long)min,
			(unsigned long long)max);
		return -EINVAL;
	}
	if (rc || x < min || x > max) {
		env_bad(bad, "%s=%s is out of range [%llu, %llu]", name, v, (unsigned long long)min,
			(unsigned long long)max);
		return -EINVAL;
	}
	*out = x;
	return 1;
}

static const char *env_str(const char *name)
{
	const char *v = getenv(name);

	return v && *v ? v : NULL;
}

int mp_config_from_env(struct mp_config *cfg)
{
	uint64_t v;
	const char *s;
	int rc, bad = 0;

	mp_log_init();
#define INT_VAR(var, field, lo, hi)                          \
	rc = env_int(var, lo, hi, &v, &bad);                \
	if (rc > 0)                                         \
		cfg->field = (__typeof__(cfg->field))v;
	INT_VAR("MP_RANK", rank, 0, 1 << 24)
	INT_VAR("MP_NPEERS", npeers, 1, 1 << 24)
	INT_VAR("MP_ROUNDS", rounds, 0, 1 << 20)
	INT_VAR("MP_CHUNK_BYTES", chunk_bytes, 4, 1LL << 28)
	INT_VAR("MP_NSTREAMS", streams, 0, 64)
	INT_VAR("MP_WINDOW", window, 1, 1024)
	INT_VAR("MP_CONNECT_TIMEOUT_MS", connect_timeout_ms, 1, 1 << 30)
	INT_VAR("MP_ROUND_TIMEOUT_MS", round_timeout_ms, 1, 1 << 30)
	INT_VAR("MP_SPIN_US", spin_us, 0, 1000000)
	/* The per-chunk timeout under its control-plane name. */
	INT_VAR("MP_CHUNK_TIMEOUT_MS", round_timeout_ms, 1, 1 << 30)
	INT_VAR("MP_DHT_PORT", dht_port, 0, 65535)
	INT_VAR("MP_GROUP_SIZE", group_size, 0, 1 << 20)
	INT_VAR("MP_MIN_GROUP_SIZE", min_group_size, 1, 1 << 20)
	INT_VAR("MP_MATCHMAKING_MS", matchmaking_ms, 1, 1 << 30)
	INT_VAR("MP_REQUEST_TIMEOUT_MS", request_timeout_ms, 1, 1 << 30)
	INT_VAR("MP_ALLREDUCE_TIMEOUT_MS", allreduce_timeout_ms, 1, 1 << 30)
	INT_VAR("MP_RECORD_TTL_MS", record_ttl_ms, 100, 1 << 30)
	INT_VAR("MP_JOIN_TIMEOUT_MS", join_timeout_ms, 0, 1 << 30)
	INT_VAR("MP_MIN_PART", min_part, 0, 1LL << 40)
	INT_VAR("MP_CHECK_FINITE", check_finite, 0, 1)
	INT_VAR("MP_PROBE_MIN_MS", probe_min_ms, MP_PROBE_LO_MS, MP_PROBE_HI_MS)
	INT_VAR("MP_PROBE_MAX_MS", probe_max_ms, MP_PROBE_LO_MS, MP_PROBE_HI_MS)
	INT_VAR("MP_DIRECT_MAX", direct_max, 0, 1u << 28)
	INT_VAR("MP_DIRECT_PAIRS", direct_pairs, 0, 1)
	INT_VAR("MP_MAX_HANDSHAKES", max_handshakes, 1, 65536)
	INT_VAR("MP_CUDA_STAGE", cuda_stage, 0, 1)
	INT_VAR("MP_STATE_RATE", state_rate, 0, 1LL << 40)
#undef INT_VAR
	/* The backoff's ends in order, once the environment set either (the
	 * other may be the caller's or the default). Neither is moved to fit
	 * the other: a longest interval below the first is refused, never
	 * raised. mp_config_resolve checks the struct the same way. */
	if ((env_str("MP_PROBE_MIN_MS") || env_str("MP_PROBE_MAX_MS")) &&
	    cfg->probe_max_ms < cfg->probe_min_ms)
		env_bad(&bad, "MP_PROBE_MAX_MS (%d) is below MP_PROBE_MIN_MS (%d): the backoff goes "
			"from MP_PROBE_MIN_MS up to MP_PROBE_MAX_MS, both in [%d, %d]",
			cfg->probe_max_ms, cfg->probe_min_ms, MP_PROBE_LO_MS, MP_PROBE_HI_MS);
	if ((s = env_str("MP_RENDEZVOUS")))
		cfg->rendezvous = s;
	if ((s = env_str("MP_BOOTSTRAP")))
		cfg->bootstrap = s;
	if ((s = env_str("MP_RUN_KEY")))
		cfg->run_key = s;
	if ((s = env_str("MP_RUN_KEY_FILE")))
		cfg->run_key_file = s;
	if ((s = env_str("MP_CONTRIB_LOG")))
		cfg->contrib_log = s;
	if ((s = env_str("MP_FAULT")))
		cfg->fault = s;
	if ((s = env_str("MP_MODE"))) {
		rc = mp_mode_from_name(s);
		if (rc < 0) {
			env_bad(&bad, "MP_MODE=%s: expected normal, client or aux", s);
		} else {
			cfg->mode = rc;
		}
	}
	if ((s = env_str("MP_BANDWIDTH"))) {
		char *end;
		double b;
		errno = 0;
		b = strtod(s, &end);
		if (errno || end == s || *end || !isfinite(b)) {
			env_bad(&bad, "MP_BANDWIDTH=%s: expected a number (< 0 unknown, 0 client)", s);
		} else {
			cfg->bandwidth = b;
		}
	}
	if ((s = env_str("MP_PEER_ID"))) {
		char *end;
		unsigned long long id;
		errno = 0;
		id = strtoull(s, &end, 16);
		if (errno || end == s || *end || !id) {
			env_bad(&bad, "MP_PEER_ID=%s: expected a non-zero hexadecimal id", s);
		} else {
			cfg->peer_id = id;
		}
	}
	if ((s = env_str("MP_PEERS")))
		cfg->peers = s;
	if ((s = env_str("MP_HOSTFILE")))
		cfg->hostfile = s;
	if ((s = env_str("MP_LISTEN")))
		cfg->listen = s;
	if ((s = env_str("MP_RUN")))
		cfg->run_name = s;
	if ((s = env_str("MP_TRANSPORT")))
		cfg->transport = s;
	if ((s = env_str("MP_GRID")))
		cfg->grid = s;
	if ((s = env_str("MP_BANDWIDTHS")))
		cfg->bandwidths = s;
	if ((s = env_str("MP_BALANCE"))) {
		if (!strcasecmp(s, "configured"))
			cfg->balance = MP_BALANCE_CONFIGURED;
		else if (!strcasecmp(s, "measured"))
			cfg->balance = MP_BALANCE_MEASURED;
		else
			env_bad(&bad, "MP_BALANCE=%s: expected configured or measured", s);
	}
	if ((s = env_str("MP_ALGO"))) {
		rc = mp_algo_from_name(s);
		if (rc < 0) {
			env_bad(&bad, "MP_ALGO=%s: expected moshpit, ring or butterfly", s);
		} else {
			cfg->algo = rc;
		}
	}
	rc = env_int("MP_CODEC_BLOCK", 1, 1 << 24, &v, &bad);
	if (rc > 0)
		cfg->codec_block = (unsigned)v;
	if ((s = env_str("MP_CODEC_SIGMAS")) && parse_float(s, 0.0f, 64.0f, &cfg->codec_sigmas)) {
		env_bad(&bad, "MP_CODEC_SIGMAS=%s: expected a number in (0, 64]", s);
	}
	if ((s = env_str("MP_TOPK_RATIO")) && parse_float(s, 0.0f, 1.0f, &cfg->topk_ratio)) {
		env_bad(&bad, "MP_TOPK_RATIO=%s: expected a fraction in (0, 1]", s);
	}
	if ((s = env_str("MP_ADACOMP_BIN")) && parse_bin(s, &cfg->adacomp_bin)) {
		env_bad(&bad, "MP_ADACOMP_BIN=%s: expected conv, fc or a length in [1, 16777216]", s);
	}
	/* After the parameter variables: "topk:0.05" in MP_CODEC wins. */
	if ((s = env_str("MP_CODEC"))) {
		char why[200];

		if (codec_parse_why(s, cfg, why, sizeof(why)))
			env_bad(&bad, "MP_CODEC=%s: %s; the form is name[:parameter], as in topk:0.05",
				s, why);
	}
	if ((s = env_str("MP_CHECKSUM"))) {
		if (!strcasecmp(s, "payload"))
			cfg->checksum_payload = 1;
		else if (!strcasecmp(s, "header"))
			cfg->checksum_payload = 0;
		else {
			env_bad(&bad, "MP_CHECKSUM=%s: expected header or payload", s);
		}
	}
	/* MP_DEBUG is applied process-wide by the logger itself. */
	if (bad > 1) {
		char first[256];

		snprintf(first, sizeof(first), "%s", mp_last_error(NULL));
		mp_note_init_error("%.200s (and %d more bad MP_* variable%s: see the log)", first,
				   bad - 1, bad > 2 ? "s" : "");
	}
	return bad ? -EINVAL : 0;
}

void mp_free_list(char **list, int n)
{
	if (!list)
		return;
	for (int i = 0; i < n; i++)
		free(list[i]);
	free(list);
}

static int list_push(char ***list, int *n, int *cap, const char *s, size_t len)
{
	if (*n == *cap) {
		int nc = *cap ? *cap * 2 : 16;
		char **nl = realloc(*list, (size_t)nc * sizeof(*nl));
		if (!nl)
			return -ENOMEM;
		*list = nl;
		*cap = nc;
	}
	(*list)[*n] = strndup(s, len);
	if (!(*list)[*n])
		return -ENOMEM;
	(*n)++;
	return 0;
}

/* "a:1,b:2" -> list of addresses. */
static int split_peers(const char *s, char ***list, int *n)
{
	int cap = 0, rc;

	*list = NULL;
	*n = 0;
	while (*s) {
		const char *e = strchr(s, ',');
		size_t len = e ? (size_t)(e - s) : strlen(s);
		while (len && isspace((unsigned char)*s)) {
			s++;
			len--;
		}
		while (len && isspace((unsigned char)s[len - 1]))
			len--;
		if (!len || len >= MP_ADDR_STRLEN) {
			mp_set_init_error("peer list: empty or overlong entry %d", *n);
			mp_free_list(*list, *n);
			return -EINVAL;
		}
		rc = list_push(list, n, &cap, s, len);
		if (rc) {
			mp_free_list(*list, *n);
			return rc;
		}
		s += len;
		while (*s && *s != ',')
			s++;
		if (*s == ',')
			s++;
	}
	return 0;
}

/*
 * Hostfile: one "host[:port]" per line in rank order; '#' starts a comment;
 * "slots=N" after the host (OpenMPI style) repeats the host N times. A
 * missing port is 29500 plus the number of earlier entries on that host, so
 * several local ranks on one machine get distinct ports. A port, given or
 * counted, past 65535 is refused.
 */
static int read_hostfile(const char *path, char ***list, int *n)
{
	FILE *f = fopen(path, "r");
	char line[512];
	int cap = 0, rc = 0, lineno = 0;

	*list = NULL;
	*n = 0;
	if (!f) {
		rc = -errno;
		mp_set_init_error("hostfile %s: %s", path, strerror(errno));
		return rc;
	}
	while (fgets(line, sizeof(line), f)) {
		char host[MP_ADDR_STRLEN], addr[MP_ADDR_STRLEN + 16];
		char *p = line, *hash = strchr(line, '#');
		long slots = 1;

		lineno++;
		if (hash)
			*hash = '\0';
		while (isspace((unsigned char)*p))
			p++;
		if (!*p)
			continue;
		size_t hl = strcspn(p, " \t\r\n");
		if (hl >= sizeof(host)) {
			mp_set_init_error("hostfile %s:%d: host too long", path, lineno);
			rc = -EINVAL;
			break;
		}
		memcpy(host, p, hl);
		host[hl] = '\0';
		char *sl = strstr(p + hl, "slots=");
		if (sl) {
			slots = strtol(sl + 6, NULL, 10);
			if (slots < 1 || slots > 4096) {
				mp_set_init_error("hostfile %s:%d: bad slots", path, lineno);
				rc = -EINVAL;
				break;
			}
		}
		/* A port is present if the text after the last ':' is all digits
		 * and the host is not a bare IPv6 address. */
		const char *colon = strrchr(host, ':');
		int has_port = colon && colon[1] && strspn(colon + 1, "0123456789") == strlen(colon + 1) &&
			       (host[0] == '[' || strchr(host, ':') == colon);
		long port;
		if (has_port) {
			/* "host:port slots=N": N ranks on consecutive ports. (Checked
			 * before the slots are added: strtol saturates, the sum would
			 * overflow.) */
			port = strtol(colon + 1, NULL, 10);
		} else {
			/* Counted once a line, not once a slot: "h slots=4096" on
			 * many lines was quadratic in the slots. */
			int same = 0;
			for (int i = 0; i < *n; i++)
				if (!strncmp((*list)[i], host, hl) && (*list)[i][hl] == ':')
					same++;
			port = MP_DEFAULT_PORT + same;
		}
		if (port > 65535 - (slots - 1)) {
			mp_set_init_error("hostfile %s:%d: port out of range", path, lineno);
			rc = -EINVAL;
			break;
		}
		for (long s = 0; s < slots && !rc; s++) {
			if (has_port)
				snprintf(addr, sizeof(addr), "%.*s:%d", (int)(colon - host), host, (int)(port + s));
			else
				snprintf(addr, sizeof(addr), "%s:%d", host, (int)(port + s));
			rc = list_push(list, n, &cap, addr, strlen(addr));
		}
		if (rc)
			break;
	}
	fclose(f);
	if (!rc && *n == 0) {
		mp_set_init_error("hostfile %s lists no hosts", path);
		rc = -EINVAL;
	}
	if (rc) {
		mp_free_list(*list, *n);
		*list = NULL;
		*n = 0;
	}
	return rc;
}

/* Rank and size from mpirun (OpenMPI, PMI) or srun. */
static void launcher_env(int *rank, int *size)
{
	static const char *pairs[][2] = {
		{"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"},
		{"PMI_RANK", "PMI_SIZE"},
		{"SLURM_PROCID", "SLURM_NTASKS"},
	};
	for (size_t i = 0; i < sizeof(pairs) / sizeof(pairs[0]); i++) {
		const char *r = getenv(pairs[i][0]), *s = getenv(pairs[i][1]);
		if (r && s) {
			*rank = atoi(r);
			*size = atoi(s);
			return;
		}
	}
}

int mp_parse_doubles(const char *s, double *out, int n)
{
	for (int i = 0; i < n; i++) {
		char *end;
		errno = 0;
		out[i] = strtod(s, &end);
		if (errno || end == s || !isfinite(out[i]))
			return -EINVAL;
		s = end;
		if (i + 1 < n) {
			if (*s != ',')
				return -EINVAL;
			s++;
		}
	}
	return *s ? -EINVAL : 0;
}

/*
 * Turn the user's configuration into a checked one: rank and peer count
 * settled, peer addresses listed when known (NULL list = set later with
 * mp_set_peers).
 */
int mp_config_resolve(const struct mp_config *in, struct mp_config *out, char ***peer_list,
		      int *npeers)
{
	int rc;

	if (!in || in->size < offsetof(struct mp_config, log_level) + sizeof(int)) {
		mp_set_init_error("config: not initialised with mp_config_init");
		return -EINVAL;
	}
	/* A caller built against an older, shorter struct gets defaults for
	 * the fields it does not know. */
	mp_config_init(out);
	memcpy(out, in, in->size < sizeof(*out) ? in->size : sizeof(*out));
	out->size = sizeof(*out);
	*peer_list = NULL;
	*npeers = 0;
	if (!out->rendezvous || (strcmp(out->rendezvous, "static") && strcmp(out->rendezvous, "dht"))) {
		mp_set_init_error("config: rendezvous \"%s\" is not static or dht",
				  out->rendezvous ? out->rendezvous : "(null)");
		return -EINVAL;
	}
	if (out->mode < MP_MODE_NORMAL || out->mode > MP_MODE_AUX || !isfinite(out->bandwidth) ||
	    out->min_group_size < 1 || out->group_size < 0 || out->matchmaking_ms < 1 ||
	    out->request_timeout_ms < 1 || out->allreduce_timeout_ms < 1 ||
	    out->record_ttl_ms < 100 || out->join_timeout_ms < 0 || out->dht_port < 0 ||
	    out->dht_port > 65535) {
		mp_set_init_error("config: mode, bandwidth, group sizes or a control-plane timeout "
				  "out of range");
		return -EINVAL;
	}
	if (!strcmp(out->rendezvous, "dht")) {
		/* Peers find each other: no list, no rank. npeers, when given, is
		 * how many to wait for before the first round. */
		if (out->peers || out->hostfile) {
			mp_set_init_error("config: the dht rendezvous takes no peer list or hostfile "
					  "(use bootstrap)");
			return -EINVAL;
		}
		if (out->algo != MP_ALGO_MOSHPIT) {
			mp_set_init_error("config: the dht rendezvous runs the moshpit algorithm only");
			return -EINVAL;
		}
		if (out->npeers < 0) {
			mp_set_init_error("config: npeers %d < 0", out->npeers);
			return -EINVAL;
		}
		out->rank = 0;
		goto common;
	}
	if (out->mode == MP_MODE_CLIENT) {
		/* Every member must know a client's mode (it reduces nothing and
		 * accepts no connection): records carry it. An aux peer needs no
		 * such word: it only starts at weight 0. */
		mp_set_init_error("config: client mode needs the dht rendezvous");
		return -EINVAL;
	}
	if (out->rank < 0 || out->npeers == 0) {
		int r = -1, s = 0;
		launcher_env(&r, &s);
		if (out->rank < 0)
			out->rank = r;
		if (out->npeers == 0)
			out->npeers = s;
	}
	if (out->peers) {
		rc = split_peers(out->peers, peer_list, npeers);
		if (rc)
			return rc;
	} else if (out->hostfile) {
		rc = read_hostfile(out->hostfile, peer_list, npeers);
		if (rc)
			return rc;
	}
	if (*peer_list) {
		if (out->npeers && out->npeers != *npeers) {
			mp_set_init_error("config: npeers %d but the peer list has %d entries", out->npeers,
					  *npeers);
			goto bad;
		}
		out->npeers = *npeers;
	}
	if (out->npeers < 1) {
		mp_set_init_error("config: peer count unknown (set npeers/MP_NPEERS, a peer list, "
				  "a hostfile, or run under mpirun/srun)");
		goto bad;
	}
	if (out->rank < 0 || out->rank >= out->npeers) {
		mp_set_init_error("config: rank %d is not in [0, %d) (set rank/MP_RANK)", out->rank,
				  out->npeers);
		goto bad;
	}
common:
	if (!out->run_name || !*out->run_name || strlen(out->run_name) > 200) {
		mp_set_init_error("config: run name must be 1 to 200 characters");
		goto bad;
	}
	if (out->balance != MP_BALANCE_CONFIGURED && out->balance != MP_BALANCE_MEASURED) {
		mp_set_init_error("config: balance %d is not configured (0) or measured (1)",
				  out->balance);
		goto bad;
	}
	if (out->algo < MP_ALGO_MOSHPIT || out->algo > MP_ALGO_BUTTERFLY) {
		mp_set_init_error("config: unknown algorithm %d", out->algo);
		goto bad;
	}
	if (!mp_codec_by_id((unsigned)out->codec) && out->codec != MP_CODEC_AUTO) {
		mp_set_init_error("config: unknown codec %d", out->codec);
		goto bad;
	}
	struct mp_codec_params cp;
	mp_config_codec_params(out, &cp);
	if (mp_codec_params_check(&cp)) {
		/* Name the one that is out, with its range (the rules of mp_codec_params_ok). */
		if (!(cp.block >= 1 && cp.block <= (1u << 24)))
			mp_set_init_error("config: codec_block %u out of range [1, 16777216]", cp.block);
		else if (!(cp.sigmas > 0.0f && cp.sigmas <= 64.0f))
			mp_set_init_error("config: codec_sigmas %g out of range (0, 64]",
					  (double)cp.sigmas);
		else if (!mp_codec_topk_ratio_ok(&cp))
			mp_set_init_error("config: topk_ratio %g out of range (0, 1]",
					  (double)cp.topk_ratio);
		else
			mp_set_init_error("config: adacomp_bin %u out of range [1, 16777216]", cp.bin);
		goto bad;
	}
	if (out->algo == MP_ALGO_RING && out->codec != MP_CODEC_AUTO &&
	    (mp_codec_by_id((unsigned)out->codec)->flags & MP_CODEC_F_SPARSE)) {
		/* The ring forwards partial sums: a sparse codec would drop some of
		 * them on every hop, with nowhere to keep the error feedback. */
		mp_set_init_error("config: codec %s needs the moshpit or butterfly algorithm, not ring",
				  mp_codec_by_id((unsigned)out->codec)->name);
		goto bad;
	}
	if (out->check_finite && out->algo == MP_ALGO_RING) {
		/* The ring forwards partial sums: a contribution cannot be left
		 * out of them once it is in. */
		mp_set_init_error("config: check_finite (MP_CHECK_FINITE=1) needs the moshpit or "
				  "butterfly algorithm, not ring");
		goto bad;
	}
	if (out->chunk_bytes < 4 || out->chunk_bytes > (1u << 28) || out->chunk_bytes % 4) {
		mp_set_init_error("config: chunk_bytes %zu must be a multiple of 4 in [4, 256 MiB]",
				  out->chunk_bytes);
		goto bad;
	}
	if (out->cuda_stage < 0 || out->cuda_stage > 1) {
		mp_set_init_error("config: cuda_stage %d is not 0 or 1", out->cuda_stage);
		return -EINVAL;
	}
	if (out->max_handshakes < 1 || out->max_handshakes > 65536) {
		mp_set_init_error("config: max_handshakes %d out of range [1, 65536]",
				  out->max_handshakes);
		goto bad;
	}
	if (out->direct_max > (1u << 28)) {
		mp_set_init_error("config: direct_max %zu out of range [0, 256 MiB]", out->direct_max);
		goto bad;
	}
	if (out->direct_pairs < 0 || out->direct_pairs > 1) {
		mp_set_init_error("config: direct_pairs %d is not 0 or 1", out->direct_pairs);
		goto bad;
	}
	if (out->probe_min_ms < MP_PROBE_LO_MS || out->probe_min_ms > MP_PROBE_HI_MS) {
		mp_set_init_error("config: probe_min_ms %d out of range [%d, %d]", out->probe_min_ms,
				  MP_PROBE_LO_MS, MP_PROBE_HI_MS);
		goto bad;
	}
	if (out->probe_max_ms < out->probe_min_ms || out->probe_max_ms > MP_PROBE_HI_MS) {
		mp_set_init_error("config: probe_max_ms %d out of range [probe_min_ms = %d, %d]",
				  out->probe_max_ms, out->probe_min_ms, MP_PROBE_HI_MS);
		goto bad;
	}
	if (out->window < 1 || out->window > 1024 || out->streams < 0 || out->streams > 64 ||
	    out->rounds < 0 || out->connect_timeout_ms < 1 || out->round_timeout_ms < 1 ||
	    out->spin_us < 0 || out->spin_us > 1000000) {
		mp_set_init_error("config: window, streams, rounds or a timeout out of range");
		goto bad;
	}
	return 0;
bad:
	mp_free_list(*peer_list, *npeers);
	*peer_list = NULL;
	*npeers = 0;
	return -EINVAL;
}
