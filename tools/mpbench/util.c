/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Small helpers of every mpbench file, apart from main (mpbench.c), so that
 * the fuzz target of the options (tests/fuzz/fuzz_mpbench_opts.c) links
 * options.c without the program.
 */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "mpbench.h"

void die_oom(void)
{
	fprintf(stderr, PROG ": out of memory\n");
	fflush(NULL);
	_exit(EXIT_FAIL);
}

void *xmalloc(size_t n)
{
	void *p = malloc(n ? n : 1);

	if (!p)
		die_oom();
	return p;
}

void *xcalloc(size_t n, size_t sz)
{
	void *p = calloc(n ? n : 1, sz ? sz : 1);

	if (!p)
		die_oom();
	return p;
}

int clamp_ms(int64_t ms)
{
	if (ms > INT_MAX)
		return INT_MAX;
	if (ms < 0)
		return 0;
	return (int)ms;
}
