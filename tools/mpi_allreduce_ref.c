/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * mpi_allreduce_ref - MPI_Allreduce (MPI_FLOAT, MPI_SUM) timings to set
 * mpbench's numbers against. Same size options as mpbench:
 *
 *   mpirun -np 8 mpi_allreduce_ref -b 1K -e 64M -f 4 -n 5 -w 2
 *
 * Rank 0 prints one line per size, "bytes time_us median_us", where
 * time_us is the largest (over ranks) mean time of one MPI_Allreduce and
 * median_us the largest (over ranks) median of the iterations' times, as
 * mpbench's time_us and time_median_us. Lines starting with '#' are
 * comments.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mpi.h>
#include "size.h" /* src/common: the library's size grammar, header-only */

#define PROG "mpi_allreduce_ref"

static int rank;

static void usage(FILE *f)
{
	fprintf(f,
		"Usage: " PROG " [-b MINBYTES] [-e MAXBYTES] [-f STEPFACTOR] [-n ITERS] "
		"[-w WARMUP]\n"
		"  -b SIZE  smallest message (default 64K)\n"
		"  -e SIZE  largest message (default 16M)\n"
		"  -f F     multiply the size by F each step (default 2)\n"
		"  -n N     timed iterations per size (default 5)\n"
		"  -w N     untimed iterations per size (default 1)\n"
		"SIZE: digits, then optionally K, M or G (powers of 1024) and B, as in\n"
		"4096, 64K or 1MB; a multiple of 4.\n");
}

static void bad_usage(const char *what, const char *val)
{
	if (rank == 0) {
		fprintf(stderr, PROG ": bad %s '%s'\n", what, val);
		usage(stderr);
	}
	MPI_Finalize();
	exit(2);
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

static uint64_t parse_size(const char *what, const char *s)
{
	uint64_t v;

	if (mp_parse_size(s, &v))
		bad_usage(what, s);
	return v;
}

static long parse_long(const char *what, const char *s, long lo, long hi)
{
	char *end;
	long v;

	errno = 0;
	v = strtol(s, &end, 10);
	if (errno || end == s || *end || v < lo || v > hi)
		bad_usage(what, s);
	return v;
}

int main(int argc, char **argv)
{
	uint64_t minb = 64ULL << 10, maxb = 16ULL << 20, step = 2;
	long iters = 5, warmup = 1;
	int nranks, o;
	float *sendbuf, *recvbuf;
	double *times;
	size_t maxcount;

	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &nranks);

	opterr = 0;
	while ((o = getopt(argc, argv, "b:e:f:n:w:h")) != -1) {
		switch (o) {
		case 'b':
			minb = parse_size("-b", optarg);
			break;
		case 'e':
			maxb = parse_size("-e", optarg);
			break;
		case 'f':
			step = (uint64_t)parse_long("-f", optarg, 2, 1 << 20);
			break;
		case 'n':
			iters = parse_long("-n", optarg, 1, 1L << 30);
			break;
		case 'w':
			warmup = parse_long("-w", optarg, 0, 1L << 30);
			break;
		case 'h':
			if (rank == 0)
				usage(stdout);
			MPI_Finalize();
			return 0;
		default:
			bad_usage("option", argv[optind - 1]);
		}
	}
	if (optind < argc)
		bad_usage("argument", argv[optind]);
	if (minb == 0 || minb % 4 || maxb % 4 || minb > maxb)
		bad_usage("size range (positive multiples of 4, -b <= -e)", argv[0]);
	if (maxb / 4 > (uint64_t)INT32_MAX)
		bad_usage("-e (more than 2^31-1 floats)", argv[0]);

	maxcount = (size_t)(maxb / 4);
	sendbuf = malloc(maxcount * sizeof(float));
	recvbuf = malloc(maxcount * sizeof(float));
	times = malloc((size_t)iters * sizeof(double));
	if (!sendbuf || !recvbuf || !times) {
		fprintf(stderr, PROG ": rank %d: cannot allocate 2 x %" PRIu64 " bytes\n", rank,
			maxb);
		MPI_Abort(MPI_COMM_WORLD, 1);
	}
	for (size_t i = 0; i < maxcount; i++)
		sendbuf[i] = (float)((i * 2654435761u + (size_t)rank) % 2048) / 1024.0f - 1.0f;

	if (rank == 0) {
		printf("# " PROG ": MPI_Allreduce(MPI_FLOAT, MPI_SUM), %d ranks, iters %ld, "
		       "warmup %ld\n# bytes time_us median_us\n", nranks, iters, warmup);
		fflush(stdout);
	}
	for (uint64_t bytes = minb; bytes <= maxb; bytes *= step) {
		int count = (int)(bytes / 4);
		double t0, mean, med, worst[2] = {0.0, 0.0}, mine[2];

		for (long it = 0; it < warmup; it++)
			MPI_Allreduce(sendbuf, recvbuf, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
		MPI_Barrier(MPI_COMM_WORLD);
		t0 = MPI_Wtime();
		for (long it = 0; it < iters; it++) {
			double t = MPI_Wtime();

			MPI_Allreduce(sendbuf, recvbuf, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
			times[it] = MPI_Wtime() - t;
		}
		mean = (MPI_Wtime() - t0) / (double)iters * 1e6;
		qsort(times, (size_t)iters, sizeof(double), cmp_double);
		med = (iters % 2 ? times[iters / 2] : (times[iters / 2 - 1] + times[iters / 2]) / 2.0) * 1e6;
		mine[0] = mean;
		mine[1] = med;
		MPI_Reduce(mine, worst, 2, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
		if (rank == 0) {
			printf("%" PRIu64 " %.1f %.1f\n", bytes, worst[0], worst[1]);
			fflush(stdout);
		}
		if (bytes > UINT64_MAX / step)
			break;
	}
	free(sendbuf);
	free(recvbuf);
	free(times);
	MPI_Finalize();
	return 0;
}
