/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Option parsing shared by mpbench, mpsim and codecbench: one way to refuse
 * a bad value, so that every tool says the same thing and exits 2.
 *
 * Each check comes twice: cli_int, cli_real, cli_u64 and cli_size return
 * -EINVAL with the message in a buffer (mpbench's parse, which its fuzz
 * target calls a million times in one process); parse_int, parse_real,
 * parse_u64 and parse_size print that same message and exit.
 */
#ifndef MP_TOOLS_CLI_H
#define MP_TOOLS_CLI_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* Exit status of a bad command line, in every tool. */
#define CLI_EXIT_USAGE 2

/* Name the tool; before any other call. */
void cli_init(const char *prog);

/* "PROG: <message>" and one usage line pointing to --help on stderr; exit 2. */
void usage_error(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));

/* The message of a refusal into @err (@errlen bytes, cut to fit, always
 * terminated; nothing written when @errlen is 0): returns -EINVAL. */
int cli_fail(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* The checks below: 0 with the value in @*v, or -EINVAL with the message. */
int cli_int(const char *opt, const char *s, int64_t lo, int64_t hi, int64_t *v, char *err,
	    size_t errlen);
int cli_real(const char *opt, const char *s, double lo, double hi, double *v, char *err,
	     size_t errlen);
int cli_u64(const char *opt, const char *s, uint64_t *v, char *err, size_t errlen);
int cli_size(const char *opt, const char *s, uint64_t lo, uint64_t hi, uint64_t *v, char *err,
	     size_t errlen);

/* A decimal integer in [@lo, @hi] (a leading 0 is not octal). */
int64_t parse_int(const char *opt, const char *s, int64_t lo, int64_t hi);

/* A finite number in [@lo, @hi]; infinite bounds mean none. */
double parse_real(const char *opt, const char *s, double lo, double hi);

/* A non-negative integer, decimal or 0x hexadecimal (seeds, ids). */
uint64_t parse_u64(const char *opt, const char *s);

/* A byte count in [@lo, @hi], in the grammar of src/common/size.h ("4096",
 * "64K", "16M", "1GB": powers of 1024). */
uint64_t parse_size(const char *opt, const char *s, uint64_t lo, uint64_t hi);

#endif
