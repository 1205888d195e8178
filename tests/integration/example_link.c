/* SPDX-License-Identifier: BSD-3-Clause */
/* Built by tests/integration/pkgconfig.sh against an installed libmoshpit through
 * pkg-config, as an integrator would: two peers (threads, loop transport)
 * average {1,2,3} and {3,4,5}. */
#define _GNU_SOURCE
#include <moshpit/moshpit.h>
#include <pthread.h>
#include <stdio.h>

static char addrs[2][MP_ADDR_STRLEN];
static pthread_barrier_t bar;
static float out[2][3];

static void *peer(void *arg)
{
	int rank = (int)(long)arg;
	struct mp_config cfg;
	mp_ctx *ctx;

	mp_config_init(&cfg);
	cfg.transport = "loop";
	cfg.run_name = "example";
	cfg.rank = rank;
	cfg.npeers = 2;
	if (mp_init(&cfg, &ctx))
		return (void *)1;
	mp_local_address(ctx, addrs[rank], sizeof(addrs[rank]));
	pthread_barrier_wait(&bar);
	const char *list[2] = {addrs[0], addrs[1]};
	mp_set_peers(ctx, list, 2);
	for (int i = 0; i < 3; i++)
		out[rank][i] = (float)(1 + i + 2 * rank);
	int rc = mp_average(ctx, out[rank], 3, 1.0f, NULL);
	pthread_barrier_wait(&bar);
	mp_finalize(ctx);
	return (void *)(long)(rc != 0);
}

int main(void)
{
	pthread_t t[2];
	void *rc[2];

	pthread_barrier_init(&bar, NULL, 2);
	for (long r = 0; r < 2; r++)
		pthread_create(&t[r], NULL, peer, (void *)r);
	for (int r = 0; r < 2; r++)
		pthread_join(t[r], &rc[r]);
	for (int r = 0; r < 2; r++)
		for (int i = 0; i < 3; i++)
			if (rc[r] || out[r][i] != (float)(2 + i)) {
				printf("wrong result at peer %d [%d]: %g\n", r, i, out[r][i]);
				return 1;
			}
	printf("2 peers averaged to {%g, %g, %g}\n", out[0][0], out[0][1], out[0][2]);
	return 0;
}
