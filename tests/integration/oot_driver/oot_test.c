/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * A driver out of the tree (sockpair.c), built by tests/integration/oot_driver/run.sh
 * against the installed headers and `pkg-config moshpit` only:
 *
 *   oot_test register   registers sockpair_driver_ops with
 *                       mp_driver_register, after checking that bad tables
 *                       are refused with the right error and change nothing;
 *   oot_test plugin     finds "sockpair_so" through MP_DRIVER_PATH, which
 *                       also names a missing file and a plugin of another
 *                       ABI ("sockpair_bad") that must be skipped.
 *
 * Either way 4 peers (contexts on 4 threads) average through the driver on
 * a 2x2 grid, and every peer must hold the exact mean: the inputs are
 * multiples of 0.25, so every sum and halving on the way is exact.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <moshpit/driver_sdk.h>

#define NPEERS 4
#define COUNT 5000 /* values: parts of 1250, chunks of 256 */

extern const struct mp_driver_ops sockpair_driver_ops;

static const char *transport;
static char addrs[NPEERS][MP_ADDR_STRLEN];
static pthread_barrier_t bar;
static float vals[NPEERS][COUNT];
static struct mp_result res[NPEERS];
static int failures;

#define CHECK(cond, ...)                                                   \
	do {                                                               \
		if (!(cond)) {                                             \
			printf("FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
			printf(__VA_ARGS__);                               \
			printf("\n");                                      \
			failures++;                                        \
		}                                                          \
	} while (0)

static float input(int rank, int i)
{
	return (float)(rank * 4 + i % 7 - 3) * 0.25f;
}

static void *peer(void *arg)
{
	int rank = (int)(long)arg;
	struct mp_config cfg;
	mp_ctx *ctx;
	int rc;

	mp_config_init(&cfg);
	cfg.transport = transport;
	cfg.run_name = "oot";
	cfg.rank = rank;
	cfg.npeers = NPEERS;
	cfg.grid = "2x2";
	cfg.chunk_bytes = 1024;
	rc = mp_init(&cfg, &ctx);
	pthread_barrier_wait(&bar);
	if (rc) {
		printf("peer %d: mp_init: %s (%s)\n", rank, mp_strerror(rc), mp_last_error(NULL));
		pthread_barrier_wait(&bar);
		pthread_barrier_wait(&bar);
		return (void *)1;
	}
	mp_local_address(ctx, addrs[rank], sizeof(addrs[rank]));
	if (rank == 0) {
		char d[64], small[8];
		int n = mp_transport_detail(ctx, d, sizeof(d));

		/* The driver's describe entry, through the public call. */
		CHECK(n > 0 && (size_t)n == strlen(d) && !strncmp(d, "pairs=socketpair name=", 22),
		      "mp_transport_detail: %d \"%s\"", n, n >= 0 ? d : "");
		memset(small, 'x', sizeof(small));
		CHECK(mp_transport_detail(ctx, small, sizeof(small)) == -ENOSPC && !small[0],
		      "mp_transport_detail into 8 bytes: not -ENOSPC with \"\"");
		CHECK(mp_transport_detail(ctx, NULL, 8) == -EINVAL &&
			      mp_transport_detail(NULL, d, sizeof(d)) == -EINVAL &&
			      mp_transport_detail(ctx, d, 0) == -EINVAL,
		      "mp_transport_detail: bad arguments not -EINVAL");
	}
	pthread_barrier_wait(&bar);
	const char *list[NPEERS];

	for (int r = 0; r < NPEERS; r++)
		list[r] = addrs[r];
	rc = mp_set_peers(ctx, list, NPEERS);
	if (!rc)
		rc = mp_average(ctx, vals[rank], COUNT, 1.0f, &res[rank]);
	if (rc)
		printf("peer %d: %s (%s)\n", rank, mp_strerror(rc), mp_last_error(ctx));
	/* Nobody leaves before everybody has its result. */
	pthread_barrier_wait(&bar);
	mp_finalize(ctx);
	return (void *)(long)(rc != 0);
}

static void average(void)
{
	pthread_t t[NPEERS];
	void *rc[NPEERS];

	for (int r = 0; r < NPEERS; r++)
		for (int i = 0; i < COUNT; i++)
			vals[r][i] = input(r, i);
	pthread_barrier_init(&bar, NULL, NPEERS);
	for (long r = 0; r < NPEERS; r++)
		pthread_create(&t[r], NULL, peer, (void *)r);
	for (int r = 0; r < NPEERS; r++)
		pthread_join(t[r], &rc[r]);
	pthread_barrier_destroy(&bar);
	for (int r = 0; r < NPEERS; r++) {
		CHECK(!rc[r], "peer %d failed", r);
		if (rc[r])
			continue;
		CHECK(res[r].rounds == 2 && res[r].peers == NPEERS && !res[r].failed_peers,
		      "peer %d: %d rounds, %d peers, %d failed", r, res[r].rounds, res[r].peers,
		      res[r].failed_peers);
		int wrong = 0;

		for (int i = 0; i < COUNT; i++) {
			/* The mean of rank*4 over ranks 0..3 is 6. */
			float want = (float)(6 + i % 7 - 3) * 0.25f;

			if (vals[r][i] != want && !wrong++)
				printf("peer %d [%d]: %.9g, want %.9g\n", r, i, vals[r][i], want);
		}
		CHECK(!wrong, "peer %d: %d of %d values not the exact mean", r, wrong, COUNT);
	}
	printf("%s: %d peers averaged %d values to the exact mean\n", transport, NPEERS, COUNT);
}

static int always_fails(const struct mp_drv_params *p, struct mp_drv **out)
{
	(void)p;
	(void)out;
	return -EIO;
}

/* Register @t, expect @err and @why in the message; the registry must not know @t's name after. */
static void refused(const struct mp_driver_ops *t, const char *name, int err, const char *why)
{
	int rc = mp_driver_register(t);

	CHECK(rc == err, "%s: %d (%s), want %d", name, rc, mp_strerror(rc), err);
	CHECK(strstr(mp_last_error(NULL), why), "%s: message \"%s\" lacks \"%s\"", name,
	      mp_last_error(NULL), why);
	if (name)
		CHECK(!mp_transport_available(name), "%s is available after a refusal", name);
}

static void bad_tables(const struct mp_driver_ops *good, const char *taken)
{
	struct mp_driver_ops t;

	refused(NULL, NULL, -EINVAL, "NULL");
	t = *good;
	t.name = "sp_abi";
	t.abi = MP_DRIVER_ABI + 1;
	refused(&t, t.name, -EPROTO, "ABI");
	t = *good;
	t.name = "sp_short";
	t.size = offsetof(struct mp_driver_ops, init); /* the header of a table and no entries */
	refused(&t, t.name, -EINVAL, "lacks entries");
	t.size = sizeof(size_t);
	refused(&t, t.name, -EINVAL, "too short");
	t = *good;
	t.name = "sp_null";
	t.isend = NULL;
	refused(&t, t.name, -EINVAL, "isend is NULL");
	t = *good;
	t.name = "";
	refused(&t, NULL, -EINVAL, "no name");
	t.name = "sp,comma";
	refused(&t, t.name, -EINVAL, "[A-Za-z0-9_-]");
	/* A built-in name, and one already registered (or loaded): the first table stays. */
	t = *good;
	t.name = "tcp";
	refused(&t, NULL, -EEXIST, "exists already");
	t = *good;
	t.name = taken;
	t.init = always_fails;
	refused(&t, NULL, -EEXIST, "exists already");
	CHECK(mp_transport_available(taken), "%s lost by a refused duplicate", taken);
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: %s register|plugin\n", argv[0]);
		return 2;
	}
	if (!strcmp(argv[1], "register")) {
		transport = sockpair_driver_ops.name;
		CHECK(!mp_transport_available(transport), "%s available before it registered",
		      transport);
		CHECK(mp_driver_register(&sockpair_driver_ops) == 0, "%s", mp_last_error(NULL));
		CHECK(mp_transport_available(transport), "%s not available once registered",
		      transport);
	} else if (!strcmp(argv[1], "plugin")) {
		transport = "sockpair_so";
		CHECK(mp_transport_available(transport), "plugin %s not loaded from MP_DRIVER_PATH=%s",
		      transport, getenv("MP_DRIVER_PATH") ? getenv("MP_DRIVER_PATH") : "(unset)");
		CHECK(!mp_transport_available("sockpair_bad"), "a plugin of another ABI was loaded");
	} else {
		fprintf(stderr, "usage: %s register|plugin\n", argv[0]);
		return 2;
	}
	bad_tables(&sockpair_driver_ops, transport);
	/* The registered driver is the one mp_init uses, not the refused duplicate. */
	if (!failures)
		average();
	if (failures)
		printf("%d failure(s)\n", failures);
	return failures ? 1 : 0;
}
