/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The static rendezvous: the peer list given at start (MP_PEERS, a hostfile,
 * mpirun/srun with a hostfile, or mp_set_peers), in rank order. Records are
 * made up from it: id = rank, no expiry. Nobody declares: groups come from
 * the grid alone (grid.c), so a static run needs no matchmaking round trip.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "rdv.h"

struct st_static {
	char (*addrs)[MP_ADDR_STRLEN];
	int n;
};

static void st_fini(void *st)
{
	struct st_static *s = st;

	if (s)
		free(s->addrs);
	free(s);
}

static int st_init(const struct mp_rdv_params *p, void **out)
{
	struct st_static *s = calloc(1, sizeof(*s));

	if (!s)
		return -ENOMEM;
	s->addrs = calloc(p->naddrs > 0 ? (size_t)p->naddrs : 1, sizeof(*s->addrs));
	if (!s->addrs) {
		free(s);
		return -ENOMEM;
	}
	for (int i = 0; i < p->naddrs; i++) {
		if (!p->addrs[i] || strlen(p->addrs[i]) >= MP_ADDR_STRLEN) {
			st_fini(s);
			return -EINVAL;
		}
		strcpy(s->addrs[i], p->addrs[i]);
	}
	s->n = p->naddrs;
	*out = s;
	return 0;
}

static int st_members(void *st, struct mp_record *out, int max)
{
	struct st_static *s = st;
	int n = s->n < max ? s->n : max;

	for (int i = 0; i < n; i++) {
		memset(&out[i], 0, sizeof(out[i]));
		out[i].id = (uint64_t)i;
		out[i].expires_ms = UINT64_MAX;
		out[i].bandwidth = -1.0;
		strcpy(out[i].addr, s->addrs[i]);
	}
	return n;
}

static int st_none(void *st, uint64_t *out, uint64_t *when, int max)
{
	(void)st;
	(void)out;
	(void)when;
	(void)max;
	return 0;
}

static int st_unsupported_addr(void *st, char *buf, size_t len)
{
	(void)st;
	(void)buf;
	(void)len;
	return -ENOTSUP;
}

const struct mp_rdv_ops mp_rdv_static_ops = {
	.name = "static",
	.init = st_init,
	.fini = st_fini,
	.address = st_unsupported_addr,
	.members = st_members,
	.departed = st_none,
	/* publish, declare, declared, forget, leave, refused: a fixed list has
	 * nothing to announce or agree on; callers check for NULL. */
};
