/* SPDX-License-Identifier: BSD-3-Clause */
#include "cli.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>

#include "size.h"

static const char *cli_prog = "moshpit";

void cli_init(const char *prog)
{
	cli_prog = prog;
}

/*
 * One line of usage, not the whole help: the message is what the user must
 * read, and a screenful of options after it would push it out of sight.
 */
void usage_error(const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "%s: ", cli_prog);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, "\nusage: %s [OPTIONS]; see %s --help\n", cli_prog, cli_prog);
	exit(CLI_EXIT_USAGE);
}

int64_t parse_int(const char *opt, const char *s, int64_t lo, int64_t hi)
{
	char *end;
	long long v;

	errno = 0;
	v = strtoll(s, &end, 10);
	if (errno || end == s || *end || v < lo || v > hi)
		usage_error("bad value '%s' for %s (an integer from %lld to %lld)", s, opt,
			    (long long)lo, (long long)hi);
	return v;
}

double parse_real(const char *opt, const char *s, double lo, double hi)
{
	char *end;
	double v;

	errno = 0;
	v = strtod(s, &end);
	if (errno || end == s || *end || !isfinite(v) || !(v >= lo && v <= hi)) {
		if (isinf(lo) && isinf(hi))
			usage_error("bad value '%s' for %s (a finite number)", s, opt);
		usage_error("bad value '%s' for %s (a number from %g to %g)", s, opt, lo, hi);
	}
	return v;
}

uint64_t parse_u64(const char *opt, const char *s)
{
	int hex = s[0] == '0' && (s[1] == 'x' || s[1] == 'X');
	const char *digits = hex ? s + 2 : s;
	char *end;
	unsigned long long v;

	/* strtoull would take a sign, spaces, or a leading 0 as octal. */
	if (!(hex ? isxdigit((unsigned char)*digits) : isdigit((unsigned char)*digits)))
		usage_error("bad value '%s' for %s (a non-negative integer)", s, opt);
	errno = 0;
	v = strtoull(digits, &end, hex ? 16 : 10);
	if (errno || *end)
		usage_error("bad value '%s' for %s (a non-negative integer)", s, opt);
	return v;
}

uint64_t parse_size(const char *opt, const char *s, uint64_t lo, uint64_t hi)
{
	uint64_t v;
	int rc = mp_parse_size(s, &v);

	if (rc == -EINVAL)
		usage_error("bad size '%s' for %s (a whole number, optionally followed by K, M "
			    "or G and B)", s, opt);
	/* -ERANGE: beyond 2^64 - 1 bytes, hence beyond @hi too. */
	if (rc || v < lo || v > hi)
		usage_error("bad size '%s' for %s (from %llu to %llu bytes)", s, opt,
			    (unsigned long long)lo, (unsigned long long)hi);
	return v;
}
