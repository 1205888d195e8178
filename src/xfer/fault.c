/* SPDX-License-Identifier: BSD-3-Clause */
/* Fault injection (see fault.h for the spec). */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fault.h"
#include "xfer.h"
#include "log.h"

static const char *const kind_names[] = {"kill", "stall", "cut", "delay"};
static const char *const phase_names[] = {"match", "scatter", "gather", "announce"};

static int name_index(const char *s, size_t len, const char *const *names, int n)
{
	for (int i = 0; i < n; i++)
		if (strlen(names[i]) == len && !memcmp(s, names[i], len))
			return i;
	return -1;
}

/* A whole number in @base from s[0..len): digits only, no sign or spaces. */
static int parse_u64(const char *s, size_t len, int base, uint64_t max, uint64_t *out)
{
	char buf[24], *end;

	if (!len || len >= sizeof(buf))
		return -EINVAL;
	memcpy(buf, s, len);
	buf[len] = '\0';
	for (size_t i = 0; i < len; i++)
		if (!(base == 16 ? strchr("0123456789abcdefABCDEF", buf[i]) : strchr("0123456789", buf[i])))
			return -EINVAL;
	errno = 0;
	unsigned long long v = strtoull(buf, &end, base);
	if (errno || *end || v > max)
		return -EINVAL;
	*out = v;
	return 0;
}

/* One action, s[0..len): fills @f or names the problem in @why. */
static int parse_action(const char *s, size_t len, struct mp_fault *f, const char **why)
{
	const char *end = s + len, *p = memchr(s, ':', len);
	size_t klen = p ? (size_t)(p - s) : len;
	int have_round = 0, have_phase = 0, have_peer = 0, have_after = 0, have_until = 0;
	int have_joined = 0, have_ms = 0;

	memset(f, 0, sizeof(*f));
	f->kind = name_index(s, klen, kind_names, 4);
	if (f->kind < 0) {
		*why = "the action is not kill, stall, cut or delay";
		return -EINVAL;
	}
	f->phase = MP_FAULT_SCATTER;
	f->all_peers = 1;
	f->joined = UINT64_MAX;
	while (p && p < end) {
		const char *key = p + 1, *next = memchr(key, ':', (size_t)(end - key));
		const char *stop = next ? next : end, *eq = memchr(key, '=', (size_t)(stop - key));
		uint64_t v;

		if (!eq) {
			*why = "expected key=value after ':'";
			return -EINVAL;
		}
		size_t kl = (size_t)(eq - key), vl = (size_t)(stop - eq - 1);
		const char *val = eq + 1;
		if (kl == 5 && !memcmp(key, "round", 5) && !have_round) {
			if (parse_u64(val, vl, 10, UINT32_MAX, &v)) {
				*why = "round must be a round number";
				return -EINVAL;
			}
			f->round = (uint32_t)v;
			have_round = 1;
		} else if (kl == 5 && !memcmp(key, "phase", 5) && !have_phase) {
			f->phase = name_index(val, vl, phase_names, 4);
			if (f->phase < 0) {
				*why = "phase must be match, scatter, gather or announce";
				return -EINVAL;
			}
			have_phase = 1;
		} else if (kl == 4 && !memcmp(key, "peer", 4) && !have_peer) {
			if (parse_u64(val, vl, 16, UINT64_MAX, &f->peer)) {
				*why = "peer must be a peer id in hex";
				return -EINVAL;
			}
			f->all_peers = 0;
			have_peer = 1;
		} else if (kl == 5 && !memcmp(key, "until", 5) && !have_until) {
			if (parse_u64(val, vl, 10, (uint64_t)UINT32_MAX + 1, &v)) {
				*why = "until must be a round number";
				return -EINVAL;
			}
			f->until = v;
			have_until = 1;
		} else if (kl == 6 && !memcmp(key, "joined", 6) && !have_joined) {
			if (parse_u64(val, vl, 10, UINT32_MAX, &f->joined)) {
				*why = "joined must be a round number";
				return -EINVAL;
			}
			have_joined = 1;
		} else if (kl == 5 && !memcmp(key, "after", 5) && !have_after) {
			if (parse_u64(val, vl, 10, UINT64_MAX, &f->after)) {
				*why = "after must be a frame count";
				return -EINVAL;
			}
			have_after = 1;
		} else if (kl == 2 && !memcmp(key, "ms", 2) && !have_ms) {
			if (parse_u64(val, vl, 10, 600000, &v) || !v) {
				*why = "ms must be a number of milliseconds in [1, 600000]";
				return -EINVAL;
			}
			f->ms = (uint32_t)v;
			have_ms = 1;
		} else {
			*why = "unknown or repeated key (round, until, joined, phase, peer, after, ms)";
			return -EINVAL;
		}
		p = next;
	}
	if (!have_round) {
		*why = "round= is missing";
		return -EINVAL;
	}
	if (!have_until)
		f->until = (uint64_t)f->round + 1;
	else if (f->until <= f->round) {
		*why = "until must be after round";
		return -EINVAL;
	}
	if (f->kind == MP_FAULT_KILL && have_peer) {
		*why = "kill takes no peer";
		return -EINVAL;
	}
	if (f->phase == MP_FAULT_MATCH && (f->kind != MP_FAULT_KILL || have_after)) {
		/* The matchmaker only asks whether to die; it counts no frames. */
		*why = "phase match takes kill without after=";
		return -EINVAL;
	}
	/* A delay holds an announce, which is not a frame of a round. */
	if ((f->kind == MP_FAULT_DELAY) != (f->phase == MP_FAULT_ANNOUNCE) ||
	    (f->kind == MP_FAULT_DELAY && (have_peer || have_after || !have_ms)) ||
	    (f->kind != MP_FAULT_DELAY && have_ms)) {
		*why = "delay goes with phase=announce and ms=, without peer= or after=; only delay takes ms=";
		return -EINVAL;
	}
	return 0;
}

int mp_fault_init(struct mp_ctx *ctx)
{
	const char *s = ctx->cfg.fault;
	struct mp_fault **tail = &ctx->faults;

	ctx->cfg.fault = NULL;
	while (s && *s) {
		const char *comma = strchr(s, ',');
		size_t len = comma ? (size_t)(comma - s) : strlen(s);
		const char *why = NULL;
		struct mp_fault f, *nf;

		if (parse_action(s, len, &f, &why)) {
			mp_set_init_error("fault \"%.*s\": %s", (int)len, s, why);
			mp_fault_free(ctx);
			return -EINVAL;
		}
		nf = malloc(sizeof(*nf));
		if (!nf) {
			mp_fault_free(ctx);
			return -ENOMEM;
		}
		*nf = f;
		*tail = nf;
		tail = &nf->next;
		s = comma ? comma + 1 : NULL;
	}
	return 0;
}

void mp_fault_free(struct mp_ctx *ctx)
{
	while (ctx->faults) {
		struct mp_fault *f = ctx->faults;
		ctx->faults = f->next;
		free(f);
	}
}

static void fire(struct mp_fault *f, uint32_t round, uint64_t sent)
{
	char whom[40] = "every peer";

	f->fired = 1;
	if (!f->all_peers)
		snprintf(whom, sizeof(whom), "peer %016llx", (unsigned long long)f->peer);
	if (f->kind == MP_FAULT_KILL) {
		MP_WARN("fault: killing self at round %u %s after %llu frames", round,
			phase_names[f->phase], (unsigned long long)sent);
		raise(SIGKILL);
	}
	MP_WARN("fault: %s %s at round %u %s after %llu frames",
		f->kind == MP_FAULT_STALL ? "stalling sends to" : "cutting the connections to", whom,
		round, phase_names[f->phase], (unsigned long long)sent);
}

/* This peer's first round: the first one asked about. */
static void note_round(struct mp_ctx *ctx, uint32_t round)
{
	if (!ctx->fault_first)
		ctx->fault_first = (uint64_t)round + 1;
}

/* In [round, until): the first such round this peer's rounds reach, for a
 * peer that was there by @joined. */
static int due_round(const struct mp_ctx *ctx, const struct mp_fault *f, uint32_t round)
{
	return round >= f->round && (uint64_t)round < f->until && ctx->fault_first - 1 <= f->joined;
}

uint32_t mp_fault_announce(struct mp_ctx *ctx, uint32_t join)
{
	for (struct mp_fault *f = ctx->faults; f; f = f->next)
		if (!f->fired && f->phase == MP_FAULT_ANNOUNCE && due_round(ctx, f, join)) {
			f->fired = 1;
			MP_WARN("fault: delaying the announce of round %u by %u ms", join, f->ms);
			return f->ms;
		}
	return 0;
}

int mp_fault_match(struct mp_ctx *ctx, uint32_t round)
{
	note_round(ctx, round);
	for (struct mp_fault *f = ctx->faults; f; f = f->next)
		if (!f->fired && f->phase == MP_FAULT_MATCH && due_round(ctx, f, round))
			fire(f, round, 0);
	return 0;
}

const struct mp_fault *mp_fault_due(struct mp_ctx *ctx, uint32_t round, int phase, uint64_t sent)
{
	note_round(ctx, round);
	for (struct mp_fault *f = ctx->faults; f; f = f->next)
		if (!f->fired && f->phase == phase && due_round(ctx, f, round) && sent >= f->after) {
			fire(f, round, sent);
			return f;
		}
	return NULL;
}
