/* SPDX-License-Identifier: BSD-3-Clause */
/* Configuration: defaults, MP_* environment variables, hostfiles, launchers. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/wait.h>

#include "core.h"
#include "xfer.h"
#include "size.h"
#include <moshpit/sdk/log.h>

static void clear_env(void)
{
	static const char *vars[] = {"MP_RANK", "MP_NPEERS", "MP_PEERS", "MP_HOSTFILE", "MP_LISTEN",
				     "MP_RUN", "MP_TRANSPORT", "MP_GRID", "MP_BANDWIDTHS", "MP_ALGO",
				     "MP_ROUNDS", "MP_CODEC", "MP_CHUNK_BYTES", "MP_NSTREAMS", "MP_WINDOW",
				     "MP_CONNECT_TIMEOUT_MS", "MP_ROUND_TIMEOUT_MS", "MP_CHECKSUM",
				     "MP_CODEC_BLOCK", "MP_CODEC_SIGMAS", "MP_TOPK_RATIO", "MP_ADACOMP_BIN",
				     "MP_MIN_PART", "MP_MODE", "MP_PEER_ID", "MP_BANDWIDTH",
				     "MP_PROBE_MIN_MS", "MP_PROBE_MAX_MS", "MP_BALANCE", "MP_MAX_HANDSHAKES",
				     "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE",
				     "SLURM_PROCID", "SLURM_NTASKS"};
	for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++)
		unsetenv(vars[i]);
}

static void defaults(void **s)
{
	struct mp_config c;

	(void)s;
	mp_config_init(&c);
	assert_int_equal(c.size, sizeof(c));
	assert_int_equal(c.rank, -1);
	assert_string_equal(c.transport, "tcp");
	assert_int_equal(c.algo, MP_ALGO_MOSHPIT);
	assert_int_equal(c.codec, MP_CODEC_NONE);
	assert_int_equal(c.chunk_bytes, 256 * 1024);
	assert_true(c.connect_timeout_ms > 0 && c.round_timeout_ms > 0);
}

static void every_field_from_env(void **s)
{
	struct mp_config c;

	(void)s;
	clear_env();
	setenv("MP_RANK", "3", 1);
	setenv("MP_NPEERS", "8", 1);
	setenv("MP_PEERS", "a:1,b:2", 1);
	setenv("MP_HOSTFILE", "/tmp/hf", 1);
	setenv("MP_LISTEN", "0.0.0.0:7000", 1);
	setenv("MP_RUN", "exp42", 1);
	setenv("MP_TRANSPORT", "loop", 1);
	setenv("MP_GRID", "2x4", 1);
	setenv("MP_BANDWIDTHS", "1,2", 1);
	setenv("MP_ALGO", "ring", 1);
	setenv("MP_ROUNDS", "5", 1);
	setenv("MP_CODEC", "fp16", 1);
	setenv("MP_CHUNK_BYTES", "64K", 1);
	setenv("MP_NSTREAMS", "2", 1);
	setenv("MP_WINDOW", "8", 1);
	setenv("MP_CONNECT_TIMEOUT_MS", "1500", 1);
	setenv("MP_ROUND_TIMEOUT_MS", "2500", 1);
	setenv("MP_CHECKSUM", "payload", 1);
	mp_config_init(&c);
	assert_int_equal(mp_config_from_env(&c), 0);
	assert_int_equal(c.rank, 3);
	assert_int_equal(c.npeers, 8);
	assert_string_equal(c.peers, "a:1,b:2");
	assert_string_equal(c.hostfile, "/tmp/hf");
	assert_string_equal(c.listen, "0.0.0.0:7000");
	assert_string_equal(c.run_name, "exp42");
	assert_string_equal(c.transport, "loop");
	assert_string_equal(c.grid, "2x4");
	assert_string_equal(c.bandwidths, "1,2");
	assert_int_equal(c.algo, MP_ALGO_RING);
	assert_int_equal(c.rounds, 5);
	assert_int_equal(c.codec, MP_CODEC_FP16);
	assert_int_equal(c.chunk_bytes, 65536);
	assert_int_equal(c.streams, 2);
	assert_int_equal(c.window, 8);
	assert_int_equal(c.connect_timeout_ms, 1500);
	assert_int_equal(c.round_timeout_ms, 2500);
	assert_int_equal(c.checksum_payload, 1);
	clear_env();
}

static void bad_env_values(void **s)
{
	struct mp_config c;
	static const char *cases[][2] = {
		{"MP_RANK", "x"}, {"MP_NPEERS", "0"}, {"MP_ALGO", "tree"}, {"MP_CODEC", "zip"},
		{"MP_CHUNK_BYTES", "12Q"}, {"MP_WINDOW", "-1"}, {"MP_CHECKSUM", "maybe"},
		{"MP_CODEC", "topk:0"}, {"MP_CODEC", "topk:1.5"}, {"MP_CODEC", "fp16:2"},
		{"MP_CODEC", "blockwise8:0"}, {"MP_CODEC", "adacomp:big"}, {"MP_CODEC_BLOCK", "0"},
		{"MP_CODEC_SIGMAS", "nan"}, {"MP_TOPK_RATIO", "0"}, {"MP_TOPK_RATIO", "2"},
		{"MP_ADACOMP_BIN", "-5"}, {"MP_ADACOMP_BIN", "0"},
		/* Above 0 as doubles, 0.0f as the floats stored. */
		{"MP_CODEC", "topk:5e-73"}, {"MP_TOPK_RATIO", "1e-46"},
		{"MP_CODEC", "uniform8:1e-50"}, {"MP_CODEC_SIGMAS", "1e-46"},
	};

	(void)s;
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		clear_env();
		setenv(cases[i][0], cases[i][1], 1);
		mp_config_init(&c);
		if (mp_config_from_env(&c) != -EINVAL)
			fail_msg("%s=%s accepted", cases[i][0], cases[i][1]);
	}
	clear_env();
}

/* 1 when mp_last_error(NULL) contains @want. */
static int init_error_says(const char *want)
{
	const char *e = mp_last_error(NULL);

	if (strstr(e, want))
		return 1;
	print_error("mp_last_error(NULL) is \"%s\", wanted \"%s\" in it\n", e, want);
	return 0;
}

/*
 * Every failure of mp_config_from_env says what was wrong in
 * mp_last_error(NULL), with the log silenced (MP_DEBUG=NONE): the variable,
 * its value, and the range of a parameter.
 */
static void bad_env_named(void **s)
{
	struct mp_config c;
	static const char *cases[][3] = {
		{"MP_CODEC", "nonsense", "MP_CODEC=nonsense: unknown codec \"nonsense\" (none, "},
		{"MP_CODEC", "topk:5", "MP_CODEC=topk:5: topk ratio 5 out of range (0, 1]"},
		{"MP_CODEC", "uniform8:65", "uniform8 sigmas 65 out of range (0, 64]"},
		{"MP_CODEC", "blockwise8:0", "blockwise8 block \"0\" out of range: a whole number "
					     "in [1, 16777216]"},
		{"MP_CODEC", "adacomp:big", "adacomp bin \"big\": expected conv, fc or a length"},
		{"MP_CODEC", "fp16:2", "codec fp16 takes no parameter"},
		{"MP_RANK", "x", "MP_RANK=x: expected a whole number in [0, 16777216]"},
		{"MP_NPEERS", "0", "MP_NPEERS=0 is out of range [1, 16777216]"},
		{"MP_ALGO", "tree", "MP_ALGO=tree: expected moshpit, ring or butterfly"},
		{"MP_CHECKSUM", "maybe", "MP_CHECKSUM=maybe: expected header or payload"},
		{"MP_TOPK_RATIO", "2", "MP_TOPK_RATIO=2: expected a fraction in (0, 1]"},
		{"MP_MODE", "boss", "MP_MODE=boss: expected normal, client or aux"},
		{"MP_PEER_ID", "xyz", "MP_PEER_ID=xyz: expected a non-zero hexadecimal id"},
		{"MP_BANDWIDTH", "fast", "MP_BANDWIDTH=fast: expected a number"},
		{"MP_BALANCE", "fastest", "MP_BALANCE=fastest: expected configured or measured"},
	};
	int level = mp_log_get_level();

	(void)s;
	mp_log_set_level(MP_LOG_NONE);
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		clear_env();
		setenv(cases[i][0], cases[i][1], 1);
		mp_note_init_error("%s", "");
		mp_config_init(&c);
		assert_int_equal(mp_config_from_env(&c), -EINVAL);
		if (!init_error_says(cases[i][2]))
			fail_msg("%s=%s: not named", cases[i][0], cases[i][1]);
	}
	/* Two bad variables: the first is named, the other counted. */
	clear_env();
	setenv("MP_ALGO", "tree", 1);
	setenv("MP_CHECKSUM", "maybe", 1);
	mp_config_init(&c);
	assert_int_equal(mp_config_from_env(&c), -EINVAL);
	assert_true(init_error_says("MP_ALGO=tree: expected moshpit, ring or butterfly (and 1 "
				    "more bad MP_* variable: see the log)"));
	clear_env();
	mp_log_set_level(level);
}

/* The size grammar itself (src/common/size.h), shared with the tools. */
static void size_grammar(void **s)
{
	static const struct {
		const char *text;
		uint64_t want;
	} ok[] = {
		{"0", 0}, {"4096", 4096}, {"0064", 64}, {"64K", 64 << 10}, {"64k", 64 << 10},
		{"1M", 1 << 20}, {"1MB", 1 << 20}, {"1mb", 1 << 20}, {"1G", 1 << 30},
		{"4096B", 4096}, {"18446744073709551615", UINT64_MAX},
		{"17179869183G", 17179869183ULL << 30},
	};
	/* Not the grammar: -EINVAL, whatever the digits. */
	static const char *syntax[] = {"", "K", "B", "-1", "-0", "+1", " 1", "1 ", "1 K", "1.5M",
				       "0x10", "1KK", "1BB", "1KiB", "1T", "12Q", "64K\n",
				       "99999999999999999999Q"};
	/* The grammar, but more than 2^64 - 1 bytes: -ERANGE, never wrapped. */
	static const char *range[] = {"18446744073709551616", "99999999999999999999",
				      "17179869184G", "99999999999999999G", "9223372036854775807K",
				      "18014398509482048K"};
	uint64_t v;

	(void)s;
	for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
		v = 7;
		if (mp_parse_size(ok[i].text, &v) != 0 || v != ok[i].want)
			fail_msg("\"%s\" gave %llu", ok[i].text, (unsigned long long)v);
	}
	for (size_t i = 0; i < sizeof(syntax) / sizeof(syntax[0]); i++) {
		v = 7;
		if (mp_parse_size(syntax[i], &v) != -EINVAL || v != 7)
			fail_msg("\"%s\" not refused as a syntax error", syntax[i]);
	}
	for (size_t i = 0; i < sizeof(range) / sizeof(range[0]); i++) {
		v = 7;
		if (mp_parse_size(range[i], &v) != -ERANGE || v != 7)
			fail_msg("\"%s\" not refused as too large", range[i]);
	}
	assert_int_equal(mp_parse_size(NULL, &v), -EINVAL);
}

/* mp_config_from_env into @c with @name=@value set: its result, and in @log
 * what it logged (on stderr, where warnings go). */
static int from_env_logged(struct mp_config *c, const char *name, const char *value, char *log,
			   size_t len)
{
	FILE *tmp = tmpfile();
	int saved = dup(2), rc;
	size_t n;

	assert_non_null(tmp);
	assert_true(saved >= 0);
	setenv(name, value, 1);
	fflush(stderr);
	assert_true(dup2(fileno(tmp), 2) >= 0);
	rc = mp_config_from_env(c);
	fflush(stderr);
	assert_true(dup2(saved, 2) >= 0);
	close(saved);
	unsetenv(name);
	rewind(tmp);
	n = fread(log, 1, len - 1, tmp);
	log[n] = '\0';
	fclose(tmp);
	return rc;
}

/* Every numeric variable takes the size grammar. */
static void size_values(void **s)
{
	static const struct {
		const char *var, *val;
		uint64_t want;
	} ok[] = {
		{"MP_CHUNK_BYTES", "4096", 4096}, {"MP_CHUNK_BYTES", "64K", 64 << 10},
		{"MP_CHUNK_BYTES", "64k", 64 << 10}, {"MP_CHUNK_BYTES", "1M", 1 << 20},
		{"MP_CHUNK_BYTES", "1MB", 1 << 20}, {"MP_CHUNK_BYTES", "4096B", 4096},
		{"MP_CHUNK_BYTES", "4", 4}, {"MP_CHUNK_BYTES", "256M", 256 << 20},
		{"MP_MIN_PART", "0", 0}, {"MP_MIN_PART", "1024G", 1ULL << 40},
	};
	struct mp_config c, unset;
	char log[1024];

	(void)s;
	for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
		uint64_t got;

		clear_env();
		mp_config_init(&c);
		if (from_env_logged(&c, ok[i].var, ok[i].val, log, sizeof(log)) != 0 || log[0])
			fail_msg("%s=%s refused: %s", ok[i].var, ok[i].val, log);
		got = strcmp(ok[i].var, "MP_MIN_PART") ? (uint64_t)c.chunk_bytes : c.min_part;
		if (got != ok[i].want)
			fail_msg("%s=%s gave %llu", ok[i].var, ok[i].val, (unsigned long long)got);
	}
	/* Empty is unset, as for every MP_* variable; the grammar has no "". */
	clear_env();
	mp_config_init(&unset);
	assert_int_equal(mp_config_from_env(&unset), 0);
	mp_config_init(&c);
	assert_int_equal(from_env_logged(&c, "MP_CHUNK_BYTES", "", log, sizeof(log)), 0);
	assert_string_equal(log, "");
	assert_memory_equal(&c, &unset, sizeof(c));
}

/*
 * Values refused with a warning that names the variable and says why,
 * changing nothing. The library used to multiply by the suffix in a signed
 * long long before its range check, which overflowed (undefined behaviour):
 * 18014398509482048K wrapped to 64K and 17179869185G to 1G, and both were
 * taken.
 */
static void size_rejects(void **s)
{
	static const struct {
		const char *var, *val, *why;
	} bad[] = {
		{"MP_CHUNK_BYTES", "18014398509482048K", "out of range"},
		{"MP_MIN_PART", "17179869185G", "out of range"},
		{"MP_CHUNK_BYTES", "99999999999999999G", "out of range"},
		{"MP_CHUNK_BYTES", "9223372036854775807K", "out of range"},
		{"MP_CHUNK_BYTES", "18446744073709551616", "out of range"},
		{"MP_CHUNK_BYTES", "257M", "out of range"},
		{"MP_CHUNK_BYTES", "2", "out of range"},
		{"MP_MIN_PART", "1025G", "out of range"},
		{"MP_CHUNK_BYTES", "12Q", "expected a whole number"},
		{"MP_CHUNK_BYTES", "-1", "expected a whole number"},
		{"MP_CHUNK_BYTES", "-64K", "expected a whole number"},
		{"MP_CHUNK_BYTES", "+64K", "expected a whole number"},
		{"MP_CHUNK_BYTES", " 64K", "expected a whole number"},
		{"MP_CHUNK_BYTES", "1.5M", "expected a whole number"},
		{"MP_CHUNK_BYTES", "0x100", "expected a whole number"},
		{"MP_CHUNK_BYTES", "64KiB", "expected a whole number"},
		/* No variable read here is signed: no sign, even where 0 is allowed. */
		{"MP_NSTREAMS", "-1", "expected a whole number"},
		{"MP_RANK", "-1", "expected a whole number"},
		{"MP_MIN_PART", "-0", "expected a whole number"},
	};
	struct mp_config c, unset;
	char log[1024];

	(void)s;
	/* Warnings are what this checks, whatever MP_DEBUG says. */
	mp_log_set_level(MP_LOG_WARN);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		char head[160];

		clear_env();
		mp_config_init(&unset);
		assert_int_equal(mp_config_from_env(&unset), 0);
		mp_config_init(&c);
		if (from_env_logged(&c, bad[i].var, bad[i].val, log, sizeof(log)) != -EINVAL)
			fail_msg("%s=%s accepted", bad[i].var, bad[i].val);
		snprintf(head, sizeof(head), "%s=%s", bad[i].var, bad[i].val);
		if (!strstr(log, head) || !strstr(log, bad[i].why))
			fail_msg("%s: warning \"%s\", want one naming it with \"%s\"", head, log,
				 bad[i].why);
		if (memcmp(&c, &unset, sizeof(c)))
			fail_msg("%s changed the config", head);
	}
	clear_env();
}

static void codec_specs(void **s)
{
	struct mp_config c, before;

	(void)s;
	clear_env();
	mp_config_init(&c);
	assert_int_equal(c.codec_block, 4096);
	assert_true(c.codec_sigmas == 6.0f);
	assert_true(c.topk_ratio == 0.01f);
	assert_int_equal(c.adacomp_bin, 500);
	assert_int_equal(mp_codec_parse("topk:0.05", &c), 0);
	assert_int_equal(c.codec, MP_CODEC_TOPK);
	assert_true(c.topk_ratio == 0.05f);
	assert_int_equal(mp_codec_parse("blockwise8:1024", &c), 0);
	assert_int_equal(c.codec, MP_CODEC_BLOCKWISE8);
	assert_int_equal(c.codec_block, 1024);
	assert_int_equal(mp_codec_parse("uniform8:3", &c), 0);
	assert_true(c.codec_sigmas == 3.0f);
	assert_int_equal(mp_codec_parse("adacomp:conv", &c), 0);
	assert_int_equal(c.adacomp_bin, 50);
	assert_int_equal(mp_codec_parse("AdaComp:fc", &c), 0);
	assert_int_equal(c.adacomp_bin, 500);
	assert_int_equal(mp_codec_parse("adacomp:200", &c), 0);
	assert_int_equal(c.adacomp_bin, 200);
	assert_int_equal(mp_codec_parse("auto", &c), 0);
	assert_int_equal(c.codec, MP_CODEC_AUTO);
	assert_int_equal(mp_codec_parse("bf16", &c), 0);
	assert_int_equal(c.codec, MP_CODEC_BF16);

	/* Errors change nothing. */
	static const char *bad[] = {"", ":", "zip", "topk:", "topk:0", "topk:-0.1", "topk:1.01",
				    "topk:nan", "topk:0.1x", "bf16:2", "none:1", "auto:1",
				    "blockwise8:0", "blockwise8:16777217", "blockwise8:-3",
				    "uniform8:0", "uniform8:65", "adacomp:0", "adacomp:fcc",
				    "averyveryverylongcodecnamethatdoesnotexist:1"};
	before = c;
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		if (mp_codec_parse(bad[i], &c) != -EINVAL)
			fail_msg("\"%s\" accepted", bad[i]);
		assert_memory_equal(&c, &before, sizeof(c));
	}
	/* What was wrong is in mp_last_error(NULL), with the range. */
	assert_int_equal(mp_codec_parse("topk:5", &c), -EINVAL);
	assert_true(init_error_says("codec: topk ratio 5 out of range (0, 1]"));
	assert_int_equal(mp_codec_parse("zip", &c), -EINVAL);
	assert_true(init_error_says("codec: unknown codec \"zip\" (none, fp16, bf16, uniform8, "
				    "blockwise8, topk, adacomp or auto)"));
	assert_int_equal(mp_codec_parse(NULL, &c), -EINVAL);
	assert_int_equal(mp_codec_parse("none", NULL), -EINVAL);

	/* Environment: parameter variables, then MP_CODEC's own parameter wins. */
	setenv("MP_CODEC_BLOCK", "512", 1);
	setenv("MP_CODEC_SIGMAS", "4", 1);
	setenv("MP_TOPK_RATIO", "0.2", 1);
	setenv("MP_ADACOMP_BIN", "conv", 1);
	setenv("MP_CODEC", "topk:0.3", 1);
	mp_config_init(&c);
	assert_int_equal(mp_config_from_env(&c), 0);
	assert_int_equal(c.codec, MP_CODEC_TOPK);
	assert_int_equal(c.codec_block, 512);
	assert_true(c.codec_sigmas == 4.0f);
	assert_true(c.topk_ratio == 0.3f);
	assert_int_equal(c.adacomp_bin, 50);
	clear_env();
}

static void resolve_codec_rules(void **s)
{
	struct mp_config c, out;
	char **list;
	int n;

	(void)s;
	clear_env();
	mp_config_init(&c);
	c.npeers = 2;
	c.rank = 0;
	c.peers = "a:1,b:2";
	c.codec = MP_CODEC_AUTO;
	assert_int_equal(mp_config_resolve(&c, &out, &list, &n), 0);
	mp_free_list(list, n);
	/* The ring forwards partial sums: sparse codecs are refused there. */
	c.algo = MP_ALGO_RING;
	c.codec = MP_CODEC_TOPK;
	assert_int_equal(mp_config_resolve(&c, &out, &list, &n), -EINVAL);
	c.codec = MP_CODEC_ADACOMP;
	assert_int_equal(mp_config_resolve(&c, &out, &list, &n), -EINVAL);
	c.codec = MP_CODEC_BLOCKWISE8;
	assert_int_equal(mp_config_resolve(&c, &out, &list, &n), 0);
	mp_free_list(list, n);
	c.algo = MP_ALGO_BUTTERFLY;
	c.codec = MP_CODEC_TOPK;
	assert_int_equal(mp_config_resolve(&c, &out, &list, &n), 0);
	mp_free_list(list, n);
	/* Parameters set directly in the struct are checked too. */
	c.topk_ratio = 0.0f;
	assert_int_equal(mp_config_resolve(&c, &out, &list, &n), -EINVAL);
	assert_true(init_error_says("config: topk_ratio 0 out of range (0, 1]"));
	c.topk_ratio = 0.5f;
	c.codec_block = 0;
	assert_int_equal(mp_config_resolve(&c, &out, &list, &n), -EINVAL);
	assert_true(init_error_says("config: codec_block 0 out of range [1, 16777216]"));
	c.codec_block = 64;
	/* A caller built against the shorter struct of version 0.1 gets the
	 * defaults of the fields it does not know. */
	c.size = offsetof(struct mp_config, codec_block);
	c.codec_block = 0;
	assert_int_equal(mp_config_resolve(&c, &out, &list, &n), 0);
	assert_int_equal(out.codec_block, 4096);
	assert_true(out.topk_ratio == 0.01f);
	mp_free_list(list, n);
}

/*
 * MP_MAX_HANDSHAKES: the connections held before they authenticate; default
 * 256, 1 to 65536 from the environment and the struct, anything else
 * refused with the range named and nothing taken.
 */
static void max_handshakes_knob(void **s)
{
	struct mp_config c, out;
	char **list;
	int n, level = mp_log_get_level();

	(void)s;
	clear_env();
	mp_config_init(&c);
	assert_int_equal(c.max_handshakes, MP_MAX_HANDSHAKES_DEFAULT);
	assert_int_equal(MP_MAX_HANDSHAKES_DEFAULT, 256);
	setenv("MP_MAX_HANDSHAKES", "1", 1);
	assert_int_equal(mp_config_from_env(&c), 0);
	assert_int_equal(c.max_handshakes, 1);
	setenv("MP_MAX_HANDSHAKES", "64K", 1);
	assert_int_equal(mp_config_from_env(&c), 0);
	assert_int_equal(c.max_handshakes, 65536);
	mp_log_set_level(MP_LOG_NONE);
	static const char *bad[][2] = {
		{"0", "MP_MAX_HANDSHAKES=0 is out of range [1, 65536]"},
		{"65537", "MP_MAX_HANDSHAKES=65537 is out of range [1, 65536]"},
		{"-3", "MP_MAX_HANDSHAKES=-3: expected a whole number in [1, 65536]"},
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		clear_env();
		setenv("MP_MAX_HANDSHAKES", bad[i][0], 1);
		mp_note_init_error("%s", "");
		mp_config_init(&c);
		if (mp_config_from_env(&c) != -EINVAL)
			fail_msg("MP_MAX_HANDSHAKES=%s accepted", bad[i][0]);
		if (!init_error_says(bad[i][1]))
			fail_msg("MP_MAX_HANDSHAKES=%s: not named", bad[i][0]);
		assert_int_equal(c.max_handshakes, MP_MAX_HANDSHAKES_DEFAULT);
	}
	clear_env();
	mp_config_init(&c);
	c.npeers = 2;
	c.rank = 0;
	c.peers = "a:1,b:2";
	c.max_handshakes = 0;
	assert_int_equal(mp_config_resolve(&c, &out, &list, &n), -EINVAL);
	assert_true(init_error_says("config: max_handshakes 0 out of range [1, 65536]"));
	c.max_handshakes = 7;
	assert_int_equal(mp_config_resolve(&c, &out, &list, &n), 0);
	assert_int_equal(out.max_handshakes, 7);
	mp_free_list(list, n);
	mp_log_set_level(level);
}

/*
 * MP_PROBE_MIN_MS / MP_PROBE_MAX_MS, the backoff of a static run's probes
 * of a down peer: defaults 1 s and 30 s, each in [10, 3600000] with the
 * longest interval no shorter than the first; anything else refused with
 * the range in mp_last_error(NULL), from the environment and from the
 * struct alike, and a value out of range never taken.
 */
static void probe_backoff_knobs(void **s)
{
	struct mp_config c, out, before;
	char **list;
	int n, level = mp_log_get_level();

	(void)s;
	clear_env();
	mp_config_init(&c);
	assert_int_equal(c.probe_min_ms, 1000);
	assert_int_equal(c.probe_max_ms, 30000);

	/* Parsed like every *_MS variable, size grammar included. */
	setenv("MP_PROBE_MIN_MS", "200", 1);
	setenv("MP_PROBE_MAX_MS", "4K", 1);
	assert_int_equal(mp_config_from_env(&c), 0);
	assert_int_equal(c.probe_min_ms, 200);
	assert_int_equal(c.probe_max_ms, 4096);
	/* Both ends of the range, and a constant interval (min = max). */
	clear_env();
	mp_config_init(&c);
	setenv("MP_PROBE_MIN_MS", "10", 1);
	setenv("MP_PROBE_MAX_MS", "10", 1);
	assert_int_equal(mp_config_from_env(&c), 0);
	assert_int_equal(c.probe_min_ms, 10);
	assert_int_equal(c.probe_max_ms, 10);
	setenv("MP_PROBE_MIN_MS", "3600000", 1);
	setenv("MP_PROBE_MAX_MS", "3600000", 1);
	assert_int_equal(mp_config_from_env(&c), 0);
	assert_int_equal(c.probe_min_ms, 3600000);
	assert_int_equal(c.probe_max_ms, 3600000);

	static const char *bad[][3] = {
		{"MP_PROBE_MIN_MS", "9", "MP_PROBE_MIN_MS=9 is out of range [10, 3600000]"},
		{"MP_PROBE_MIN_MS", "3600001", "MP_PROBE_MIN_MS=3600001 is out of range [10, 3600000]"},
		{"MP_PROBE_MIN_MS", "0", "MP_PROBE_MIN_MS=0 is out of range [10, 3600000]"},
		{"MP_PROBE_MAX_MS", "4G", "MP_PROBE_MAX_MS=4G is out of range [10, 3600000]"},
		{"MP_PROBE_MIN_MS", "-5", "MP_PROBE_MIN_MS=-5: expected a whole number in [10, 3600000]"},
		/* Alone above the default longest interval: refused, not raised. */
		{"MP_PROBE_MIN_MS", "60000", "MP_PROBE_MAX_MS (30000) is below MP_PROBE_MIN_MS (60000)"},
		{"MP_PROBE_MAX_MS", "999", "MP_PROBE_MAX_MS (999) is below MP_PROBE_MIN_MS (1000)"},
	};
	mp_log_set_level(MP_LOG_NONE);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		clear_env();
		setenv(bad[i][0], bad[i][1], 1);
		mp_note_init_error("%s", "");
		mp_config_init(&c);
		if (mp_config_from_env(&c) != -EINVAL)
			fail_msg("%s=%s accepted", bad[i][0], bad[i][1]);
		if (!init_error_says(bad[i][2]))
			fail_msg("%s=%s: not named", bad[i][0], bad[i][1]);
		/* An out-of-range value is not taken (the order check of a
		 * value in range leaves it set, and the result says -EINVAL). */
		if (strstr(bad[i][2], "out of range") || strstr(bad[i][2], "expected")) {
			assert_int_equal(c.probe_min_ms, 1000);
			assert_int_equal(c.probe_max_ms, 30000);
		}
	}
	mp_log_set_level(level);
	clear_env();

	/* Set in the struct: mp_config_resolve checks them the same way. */
	mp_config_init(&c);
	c.npeers = 2;
	c.rank = 0;
	c.peers = "a:1,b:2";
	c.probe_min_ms = 250;
	c.probe_max_ms = 250;
	assert_int_equal(mp_config_resolve(&c, &out, &list, &n), 0);
	assert_int_equal(out.probe_min_ms, 250);
	assert_int_equal(out.probe_max_ms, 250);
	mp_free_list(list, n);
	mp_log_set_level(MP_LOG_NONE);
	before = c;
	c.probe_min_ms = 9;
	assert_int_equal(mp_config_resolve(&c, &out, &list, &n), -EINVAL);
	assert_true(init_error_says("config: probe_min_ms 9 out of range [10, 3600000]"));
	c.probe_min_ms = 3600001;
	assert_int_equal(mp_config_resolve(&c, &out, &list, &n), -EINVAL);
	assert_true(init_error_says("config: probe_min_ms 3600001 out of range [10, 3600000]"));
	c = before;
	c.probe_max_ms = 249;
	assert_int_equal(mp_config_resolve(&c, &out, &list, &n), -EINVAL);
	assert_true(init_error_says("config: probe_max_ms 249 out of range [probe_min_ms = 250, "
				    "3600000]"));
	c.probe_max_ms = 3600001;
	assert_int_equal(mp_config_resolve(&c, &out, &list, &n), -EINVAL);
	assert_true(init_error_says("config: probe_max_ms 3600001 out of range"));
	mp_log_set_level(level);
	/* A caller built against the struct before these fields gets the
	 * defaults for them, whatever lies beyond its size. */
	c = before;
	c.size = offsetof(struct mp_config, probe_min_ms);
	c.probe_min_ms = c.probe_max_ms = 0;
	assert_int_equal(mp_config_resolve(&c, &out, &list, &n), 0);
	assert_int_equal(out.probe_min_ms, 1000);
	assert_int_equal(out.probe_max_ms, 30000);
	mp_free_list(list, n);
}

static void hostfile_and_launcher(void **s)
{
	char path[] = "/tmp/mp-hostfile-XXXXXX";
	int fd = mkstemp(path);
	struct mp_config c, out;
	char **list;
	int n;

	(void)s;
	clear_env();
	assert_true(fd >= 0);
	const char *text = "# cluster\nnode1 slots=2\nnode2:4000 slots=2\n\n[::1]:5000  # v6\nnode3\n";
	assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
	close(fd);
	setenv("OMPI_COMM_WORLD_RANK", "4", 1);
	setenv("OMPI_COMM_WORLD_SIZE", "6", 1);
	mp_config_init(&c);
	c.hostfile = path;
	assert_int_equal(mp_config_resolve(&c, &out, &list, &n), 0);
	assert_int_equal(n, 6);
	assert_int_equal(out.rank, 4);
	assert_int_equal(out.npeers, 6);
	assert_string_equal(list[0], "node1:29500");
	assert_string_equal(list[1], "node1:29501");
	assert_string_equal(list[2], "node2:4000");
	assert_string_equal(list[3], "node2:4001");
	assert_string_equal(list[4], "[::1]:5000");
	assert_string_equal(list[5], "node3:29500");
	mp_free_list(list, n);

	/* The launcher's size must match the hostfile. */
	setenv("OMPI_COMM_WORLD_SIZE", "7", 1);
	assert_int_equal(mp_config_resolve(&c, &out, &list, &n), -EINVAL);
	clear_env();
	setenv("SLURM_PROCID", "1", 1);
	setenv("SLURM_NTASKS", "2", 1);
	mp_config_init(&c);
	c.peers = "h1:1, h2:2";
	assert_int_equal(mp_config_resolve(&c, &out, &list, &n), 0);
	assert_int_equal(out.rank, 1);
	assert_string_equal(list[1], "h2:2");
	mp_free_list(list, n);
	clear_env();
	unlink(path);
	c.hostfile = "/nonexistent/hostfile";
	c.peers = NULL;
	c.rank = 0;
	assert_int_equal(mp_config_resolve(&c, &out, &list, &n), -ENOENT);
}

/* Resolves @text as a hostfile (static, rank 0): its return, the list in
 * *list (*n entries) on success. */
static int resolve_hostfile(const char *text, char ***list, int *n)
{
	char path[] = "/tmp/mp-hostfile-XXXXXX";
	int fd = mkstemp(path);
	struct mp_config c, out;
	size_t len = strlen(text);

	assert_true(fd >= 0);
	assert_int_equal(write(fd, text, len), (ssize_t)len);
	close(fd);
	mp_config_init(&c);
	c.hostfile = path;
	c.rank = 0;
	int rc = mp_config_resolve(&c, &out, list, n);
	unlink(path);
	return rc;
}

/* Ports past 65535 are refused, written or counted (fuzz_config found
 * both: "h:<20 digits> slots=2" overflowed a long, 36036 slots of one host
 * without a port were given "h:65536" and up). */
static void hostfile_port_range(void **s)
{
	char **list;
	int n;

	(void)s;
	clear_env();
	assert_int_equal(resolve_hostfile("h:65534 slots=2\n", &list, &n), 0);
	assert_int_equal(n, 2);
	assert_string_equal(list[1], "h:65535");
	mp_free_list(list, n);
	assert_int_equal(resolve_hostfile("h:65535 slots=2\n", &list, &n), -EINVAL);
	assert_int_equal(resolve_hostfile("h:99999999999999999999 slots=2\n", &list, &n), -EINVAL);
	assert_int_equal(resolve_hostfile("h:99999999999999999999\n", &list, &n), -EINVAL);
	/* Default ports: 29500 + earlier entries of the host, up to 65535. */
	char text[1024] = "";
	for (int i = 0; i < 8; i++)
		strcat(text, "h slots=4096\n");
	strcat(text, "h slots=3268\n"); /* 29500 + 36035 = 65535 */
	assert_int_equal(resolve_hostfile(text, &list, &n), 0);
	assert_int_equal(n, 36036);
	assert_string_equal(list[n - 1], "h:65535");
	assert_string_equal(list[4096], "h:33596");
	mp_free_list(list, n);
	strcat(text, "h\n");
	assert_int_equal(resolve_hostfile(text, &list, &n), -EINVAL);
	assert_non_null(strstr(mp_last_error(NULL), "port out of range"));
}

static void resolve_rejects(void **s)
{
	struct mp_config c, out;
	char **list;
	int n;

	(void)s;
	clear_env();
	mp_config_init(&c);
	assert_int_equal(mp_config_resolve(&c, &out, &list, &n), -EINVAL); /* no peer count */
	c.npeers = 4;
	c.rank = 4;
	assert_int_equal(mp_config_resolve(&c, &out, &list, &n), -EINVAL);
	c.rank = 0;
	c.peers = "a:1,,b:2";
	assert_int_equal(mp_config_resolve(&c, &out, &list, &n), -EINVAL);
	c.peers = "a:1,b:2";
	assert_int_equal(mp_config_resolve(&c, &out, &list, &n), -EINVAL); /* 4 peers, 2 listed */
	c.peers = NULL;
	c.run_name = "";
	assert_int_equal(mp_config_resolve(&c, &out, &list, &n), -EINVAL);
	c.run_name = "x";
	c.codec = 77;
	assert_int_equal(mp_config_resolve(&c, &out, &list, &n), -EINVAL);
	c.codec = 0;
	c.size = 8; /* not from mp_config_init */
	assert_int_equal(mp_config_resolve(&c, &out, &list, &n), -EINVAL);
}

/* In a child (the log is set up once per process): MP_DEBUG_FILE=@path,
 * one warning logged. Its stderr into @err (@n bytes); the exit status. */
static int log_child(const char *path, char *err, size_t n)
{
	int fd[2], status = -1;
	ssize_t got = 0, r;
	pid_t pid;

	assert_int_equal(pipe(fd), 0);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		/* A fresh process: this one set its logging up long ago. */
		dup2(fd[1], 2);
		close(fd[0]);
		setenv("MP_DEBUG_FILE", path, 1);
		setenv("MP_DEBUG", "WARN", 1);
		execl("/proc/self/exe", "test_config", "--log-child", (char *)NULL);
		_exit(127);
	}
	close(fd[1]);
	while ((size_t)got < n - 1 && (r = read(fd[0], err + got, n - 1 - (size_t)got)) > 0)
		got += r;
	err[got < 0 ? 0 : got] = '\0';
	close(fd[0]);
	waitpid(pid, &status, 0);
	return status;
}

/*
 * MP_DEBUG_FILE: %h and %p expanded in full; a path whose expansion does not
 * fit the library's 511 bytes is refused with a warning and the lines go to
 * stderr (it used to write past the buffer, or open a path cut short).
 */
static void debug_file_path(void **s)
{
	char err[4096], longp[700];
	int st;

	(void)s;
	st = log_child("/tmp/mp_test_log.%h.%p", err, sizeof(err));
	assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	assert_null(strstr(err, "log-child-line")); /* it went to the file */
	{
		/* The child's pid is not known here: find the file by its host. */
		char host[256] = "", cmd[1024];

		gethostname(host, sizeof(host) - 1);
		snprintf(cmd, sizeof(cmd), "grep -l log-child-line /tmp/mp_test_log.%s.[0-9]* "
			 ">/dev/null 2>&1 && rm -f /tmp/mp_test_log.%s.[0-9]*", host, host);
		if (system(cmd) != 0)
			fail_msg("no /tmp/mp_test_log.%s.<pid> with the line", host);
	}
	memset(longp, 'a', sizeof(longp) - 1);
	memcpy(longp, "/tmp/", 5);
	longp[sizeof(longp) - 1] = '\0';
	st = log_child(longp, err, sizeof(err));
	assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	if (!strstr(err, "the expanded path is longer than 511 bytes; logging to stderr") ||
	    !strstr(err, "log-child-line"))
		fail_msg("long MP_DEBUG_FILE: stderr was \"%s\"", err);
	/* %p near the end: one byte short of room for the pid. */
	memset(longp, 'b', 509);
	memcpy(longp, "/tmp/", 5);
	strcpy(longp + 509, "%p");
	st = log_child(longp, err, sizeof(err));
	assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	assert_non_null(strstr(err, "logging to stderr"));
}

int main(int argc, char **argv)
{
	if (argc == 2 && !strcmp(argv[1], "--log-child")) {
		mp_log_set_level(MP_LOG_WARN);
		mp_log(MP_LOG_WARN, __FILE__, __LINE__, "%s", "log-child-line");
		return 0;
	}
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(defaults),
		cmocka_unit_test(every_field_from_env),
		cmocka_unit_test(bad_env_values),
		cmocka_unit_test(bad_env_named),
		cmocka_unit_test(size_grammar),
		cmocka_unit_test(size_values),
		cmocka_unit_test(size_rejects),
		cmocka_unit_test(hostfile_and_launcher),
		cmocka_unit_test(hostfile_port_range),
		cmocka_unit_test(resolve_rejects),
		cmocka_unit_test(codec_specs),
		cmocka_unit_test(resolve_codec_rules),
		cmocka_unit_test(probe_backoff_knobs),
		cmocka_unit_test(max_handshakes_knob),
		cmocka_unit_test(debug_file_path),
	};

	/* size_rejects reads the warnings on stderr, not in a log file. */
	unsetenv("MP_DEBUG_FILE");
	return cmocka_run_group_tests(tests, NULL, NULL);
}
