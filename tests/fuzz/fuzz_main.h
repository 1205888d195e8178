/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The main() of a fuzz target built without libFuzzer (the suite's build):
 *
 *   TARGET DIR     replay every file of DIR through LLVMFuzzerTestOneInput
 *                  (the seed corpus tests/fuzz/corpus/TARGET/ and the crash
 *                  inputs kept there as regressions);
 *   TARGET [N]     run the target's own deterministic stream of N inputs
 *                  (fuzz_stream, defined by the target);
 *   TARGET --seeds DIR N
 *                  write the first N inputs of that stream, unmutated (valid
 *                  inputs made by the library's own encoders), into DIR as
 *                  seed-NNN: how tests/fuzz/corpus/TARGET/ was made.
 *
 * A target defines FUZZ_SEED, includes this once, and defines
 * LLVMFuzzerTestOneInput and fuzz_stream (which draws from next()). Under libFuzzer (-DMP_LIBFUZZER) libFuzzer brings main().
 */
#ifndef MP_FUZZ_MAIN_H
#define MP_FUZZ_MAIN_H

#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#ifndef MP_LIBFUZZER
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static void fuzz_stream(long iters);

/* The deterministic stream's generator (xorshift64), from the target's own
 * FUZZ_SEED, defined before this header is included. */
static uint64_t rng = FUZZ_SEED;

static uint64_t next(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return rng;
}

/* Set by --seeds: the stream mutates nothing and hands every input to
 * fuzz_seed as well. */
static const char *seed_dir;

/*
 * Up to three random mutations of the @*len bytes at @p (room for @cap):
 * a bit flipped, a byte replaced, or the input cut or grown by less than
 * @grow bytes; none with --seeds. Returns how many it drew.
 */
static inline int fuzz_mutate(uint8_t *p, size_t *len, size_t cap, unsigned grow)
{
	int muts = seed_dir ? 0 : (int)(next() % 4);

	for (int m = 0; m < muts && *len; m++) {
		switch (next() % 3) {
		case 0: p[next() % *len] ^= (uint8_t)(1u << (next() % 8)); break;
		case 1: p[next() % *len] = (uint8_t)next(); break;
		default:
			if (next() & 1)
				*len = (size_t)(next() % (*len + 1));
			else if (*len + grow < cap)
				*len += (size_t)(next() % grow);
		}
	}
	return muts;
}

static void fuzz_seed(const uint8_t *in, size_t len)
{
	static int n;
	char path[4096];
	FILE *f;

	snprintf(path, sizeof(path), "%s/seed-%03d", seed_dir, n++);
	f = fopen(path, "wb");
	if (!f || fwrite(in, 1, len, f) != len || fclose(f)) {
		perror(path);
		exit(1);
	}
}

/* Feeds every regular file of @dir to the target, each in a buffer of its
 * exact size (so that ASan sees a read past its end); the count, or -1. */
static long fuzz_replay_dir(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	long n = 0;

	if (!d) {
		perror(dir);
		return -1;
	}
	while ((e = readdir(d))) {
		char path[4096];
		struct stat st;
		FILE *f;

		snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
		if (stat(path, &st) || !S_ISREG(st.st_mode))
			continue;
		/* Exactly the file's size: a read past its end is ASan's to see. */
		uint8_t *buf = malloc(st.st_size ? (size_t)st.st_size : 1);
		if (!buf || !(f = fopen(path, "rb"))) {
			free(buf);
			closedir(d);
			return -1;
		}
		size_t got = fread(buf, 1, (size_t)st.st_size, f);
		fclose(f);
		if (got != (size_t)st.st_size) {
			fprintf(stderr, "%s: short read\n", path);
			free(buf);
			closedir(d);
			return -1;
		}
		LLVMFuzzerTestOneInput(buf, got);
		free(buf);
		n++;
	}
	closedir(d);
	return n;
}

int main(int argc, char **argv)
{
	struct stat st;
	const char *name = strrchr(argv[0], '/') ? strrchr(argv[0], '/') + 1 : argv[0];

	if (argc == 4 && !strcmp(argv[1], "--seeds")) {
		seed_dir = argv[2];
		fuzz_stream(atol(argv[3]));
		return 0;
	}
	if (argc > 1 && !stat(argv[1], &st) && S_ISDIR(st.st_mode)) {
		long n = fuzz_replay_dir(argv[1]);

		if (n < 1) {
			fprintf(stderr, "%s: no inputs replayed from %s\n", name, argv[1]);
			return 1;
		}
		printf("%s: %ld corpus inputs from %s, no crash\n", name, n, argv[1]);
		return 0;
	}
	fuzz_stream(argc > 1 ? atol(argv[1]) : 100000);
	return 0;
}
#endif
#endif
