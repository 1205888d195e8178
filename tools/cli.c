/* SPDX-License-Identifier: BSD-3-Clause */
#include "cli.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

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

int cli_fail(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;

	if (err && errlen) {
		va_start(ap, fmt);
		vsnprintf(err, errlen, fmt, ap);
		va_end(ap);
	}
	return -EINVAL;
}

int cli_int(const char *opt, const char *s, int64_t lo, int64_t hi, int64_t *v, char *err,
	    size_t errlen)
{
	char *end;
	long long x;

	errno = 0;
	x = strtoll(s, &end, 10);
	if (errno || end == s || *end || x < lo || x > hi)
		return cli_fail(err, errlen, "bad value '%s' for %s (an integer from %lld to %lld)",
				s, opt, (long long)lo, (long long)hi);
	*v = x;
	return 0;
}

int cli_real(const char *opt, const char *s, double lo, double hi, double *v, char *err,
	     size_t errlen)
{
	char *end;
	double x;

	errno = 0;
	x = strtod(s, &end);
	if (errno || end == s || *end || !isfinite(x) || !(x >= lo && x <= hi)) {
		if (isinf(lo) && isinf(hi))
			return cli_fail(err, errlen, "bad value '%s' for %s (a finite number)", s,
					opt);
		return cli_fail(err, errlen, "bad value '%s' for %s (a number from %g to %g)", s,
				opt, lo, hi);
	}
	*v = x;
	return 0;
}

int cli_u64(const char *opt, const char *s, uint64_t *v, char *err, size_t errlen)
{
	int hex = s[0] == '0' && (s[1] == 'x' || s[1] == 'X');
	const char *digits = hex ? s + 2 : s;
	char *end;
	unsigned long long x;

	/* strtoull would take a sign, spaces, or a leading 0 as octal. */
	if (!(hex ? isxdigit((unsigned char)*digits) : isdigit((unsigned char)*digits)))
		return cli_fail(err, errlen, "bad value '%s' for %s (a non-negative integer)", s,
				opt);
	errno = 0;
	x = strtoull(digits, &end, hex ? 16 : 10);
	if (errno || *end)
		return cli_fail(err, errlen, "bad value '%s' for %s (a non-negative integer)", s,
				opt);
	*v = x;
	return 0;
}

int cli_size(const char *opt, const char *s, uint64_t lo, uint64_t hi, uint64_t *v, char *err,
	     size_t errlen)
{
	uint64_t x;
	int rc = mp_parse_size(s, &x);

	if (rc == -EINVAL)
		return cli_fail(err, errlen, "bad size '%s' for %s (a whole number, optionally "
				"followed by K, M or G and B)", s, opt);
	/* -ERANGE: beyond 2^64 - 1 bytes, hence beyond @hi too. */
	if (rc || x < lo || x > hi)
		return cli_fail(err, errlen, "bad size '%s' for %s (from %llu to %llu bytes)", s,
				opt, (unsigned long long)lo, (unsigned long long)hi);
	*v = x;
	return 0;
}

/*
 * The exiting forms. The check runs once without a buffer; only a refusal
 * runs it again into one sized for the value and the option named, so
 * that a long value is printed whole, as usage_error would.
 */
#define CLI_REFUSE(call_with_buf)                                         \
	do {                                                              \
		size_t errlen = strlen(s) + strlen(opt) + 256;           \
		char *err = malloc(errlen);                               \
									  \
		if (!err) {                                               \
			fprintf(stderr, "%s: out of memory\n", cli_prog); \
			exit(1);                                          \
		}                                                         \
		call_with_buf;                                            \
		usage_error("%s", err);                                   \
	} while (0)

int64_t parse_int(const char *opt, const char *s, int64_t lo, int64_t hi)
{
	int64_t v = 0;

	if (cli_int(opt, s, lo, hi, &v, NULL, 0))
		CLI_REFUSE(cli_int(opt, s, lo, hi, &v, err, errlen));
	return v;
}

double parse_real(const char *opt, const char *s, double lo, double hi)
{
	double v = 0.0;

	if (cli_real(opt, s, lo, hi, &v, NULL, 0))
		CLI_REFUSE(cli_real(opt, s, lo, hi, &v, err, errlen));
	return v;
}

uint64_t parse_u64(const char *opt, const char *s)
{
	uint64_t v = 0;

	if (cli_u64(opt, s, &v, NULL, 0))
		CLI_REFUSE(cli_u64(opt, s, &v, err, errlen));
	return v;
}

uint64_t parse_size(const char *opt, const char *s, uint64_t lo, uint64_t hi)
{
	uint64_t v = 0;

	if (cli_size(opt, s, lo, hi, &v, NULL, 0))
		CLI_REFUSE(cli_size(opt, s, lo, hi, &v, err, errlen));
	return v;
}
