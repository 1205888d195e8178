/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The welcome service (welcome.h). Why it exists: a new DHT node reads the
 * run's records through searches, and right after peers die those searches
 * wait for the dead nodes to time out, 1.2 to 1.5 s on loopback, several
 * rounds of a small run. The node a newcomer bootstraps from already holds
 * the records; the welcome hands them over in one round trip.
 *
 * The exchange, integers little-endian:
 *
 *   service: "MPWL", version 1, nonce_s (16 bytes)                  21 bytes
 *   asker:   nonce_c (16), gift length (u16), MAC(WELCOME_ASK: nonce_s,
 *            nonce_c, run id, gift length, gift), gift        50 + length
 *   service: length (u32), MAC(WELCOME_GIVE: nonce_c, nonce_s, run id,
 *            length, payload), payload                          36 + length
 *
 * A service that cannot verify the ask closes the connection and counts a
 * refusal: a stranger learns nothing and gives nothing. An asker checks
 * the answer's MAC, so a stranger cannot feed it either; what gift and
 * payload hold is verified again by their readers (records carry their
 * own MACs).
 */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <moshpit/sdk/le.h>

#include <moshpit/sdk/clock.h>
#include "inet.h"
#include "log.h"
#include "welcome.h"

#define MAGIC "MPWL"
#define VERSION 1
#define HELLO_LEN (4 + 1 + MP_NONCE_BYTES)
#define ASK_LEN (MP_NONCE_BYTES + 2 + MP_MAC_BYTES)
#define GIVE_HDR_LEN (4 + MP_MAC_BYTES)
/* An asker gets this long from accept to the last byte of the answer. */
#define SERVE_MS 500
/* The service's thread looks at its stop flag this often. */
#define STOP_POLL_MS 100
/* At most one line a second about refused askers. */
#define WARN_EVERY_MS 1000

struct mp_welcome {
	struct mp_auth auth;
	uint64_t run_id;
	mp_welcome_fill_fn fill;
	void *arg;
	int fd;
	unsigned port;
	pthread_t thread;
	int stop;          /* atomic */
	uint64_t refused;  /* atomic */
	uint64_t last_warn_ms;
	uint8_t *buf;      /* the answer: header then payload */
};

/* The socket *@ctx's side of struct mp_welcome_io. */
static int sock_xfer(void *ctx, void *buf, size_t len, uint64_t deadline, int out)
{
	return mp_inet_xfer(*(int *)ctx, buf, len, deadline, out);
}

static int xfer(const struct mp_welcome_io *io, void *buf, size_t len, uint64_t deadline, int out)
{
	return io->xfer(io->ctx, buf, len, deadline, out);
}

/*
 * The MAC of one step over (nonce @n1, nonce @n2, run id, the length field
 * @lenf of @lsize bytes, @body) into @mac; with @check, verify @mac instead
 * (0 or -EACCES). The ask (WELCOME_ASK) takes nonce_s first, a 2-byte
 * length and the gift; the answer (WELCOME_GIVE) nonce_c first, a 4-byte
 * length and the payload.
 */
static int step_mac(const struct mp_auth *a, enum mp_auth_domain d, const uint8_t *n1,
		    const uint8_t *n2, uint64_t run_id, const uint8_t *lenf, size_t lsize,
		    const uint8_t *body, size_t len, uint8_t mac[MP_MAC_BYTES], int check)
{
	uint8_t run[8];
	struct mp_auth_piece pc[5] = {{n1, MP_NONCE_BYTES}, {n2, MP_NONCE_BYTES},
				      {run, sizeof(run)}, {lenf, lsize}, {body, len}};

	mp_le_put64(run, run_id);
	if (check)
		return mp_auth_verify(a, d, pc, 5, mac);
	mp_auth_mac(a, d, pc, 5, mac);
	return 0;
}

static void refuse(struct mp_welcome *w, const struct sockaddr_storage *ss, const char *why)
{
	uint64_t n = __atomic_add_fetch(&w->refused, 1, __ATOMIC_RELAXED), now = mp_now_ms();
	char name[MP_ADDR_STRLEN];

	if (now - w->last_warn_ms < WARN_EVERY_MS && w->last_warn_ms)
		return;
	w->last_warn_ms = now;
	mp_inet_name((const struct sockaddr *)ss, name, sizeof(name));
	MP_WARN("welcome: refused %s: %s (%llu refused so far)", name, why, (unsigned long long)n);
}

const char *mp_welcome_serve_io(const struct mp_auth *a, uint64_t run_id,
				mp_welcome_fill_fn fill, void *arg, uint8_t *buf,
				const struct mp_welcome_io *io, uint64_t deadline)
{
	uint8_t hello[HELLO_LEN], ask[ASK_LEN], gift[MP_WELCOME_GIVE_MAX], *nonce_s = hello + 5;
	size_t len, glen;
	int rc;

	memcpy(hello, MAGIC, 4);
	hello[4] = VERSION;
	mp_auth_random(nonce_s, MP_NONCE_BYTES);
	if ((rc = xfer(io, hello, sizeof(hello), deadline, 1)))
		return NULL; /* gone before it asked: nothing to refuse */
	if ((rc = xfer(io, ask, sizeof(ask), deadline, 0)))
		return rc == -ETIMEDOUT ? "no ask in time" : "closed before asking";
	glen = mp_le_get16(ask + MP_NONCE_BYTES);
	/* Bounded before it is read: the gift lands on this stack. */
	if (glen > sizeof(gift))
		return "its gift is too long";
	if ((rc = xfer(io, gift, glen, deadline, 0)))
		return "closed before its gift";
	if (step_mac(a, MP_AUTH_WELCOME_ASK, nonce_s, ask, run_id, ask + MP_NONCE_BYTES, 2, gift,
		     glen, ask + MP_NONCE_BYTES + 2, 1))
		return "wrong MAC: another run key or another run";
	len = fill(arg, gift, glen, buf + GIVE_HDR_LEN, MP_WELCOME_MAX);
	mp_le_put32(buf, (uint32_t)len);
	step_mac(a, MP_AUTH_WELCOME_GIVE, ask, nonce_s, run_id, buf, 4, buf + GIVE_HDR_LEN, len,
		 buf + 4, 0);
	xfer(io, buf, GIVE_HDR_LEN + len, deadline, 1);
	return NULL;
}

static void serve(struct mp_welcome *w, int fd, const struct sockaddr_storage *ss)
{
	struct mp_welcome_io io = {sock_xfer, &fd};
	const char *why = mp_welcome_serve_io(&w->auth, w->run_id, w->fill, w->arg, w->buf, &io,
					      mp_now_ms() + SERVE_MS);

	if (why)
		refuse(w, ss, why);
}

static void *service(void *arg)
{
	struct mp_welcome *w = arg;

	while (!__atomic_load_n(&w->stop, __ATOMIC_ACQUIRE)) {
		struct pollfd pfd = {.fd = w->fd, .events = POLLIN};
		struct sockaddr_storage ss;
		socklen_t sl = sizeof(ss);
		int fd;

		if (poll(&pfd, 1, STOP_POLL_MS) <= 0)
			continue;
		fd = accept4(w->fd, (struct sockaddr *)&ss, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd < 0) {
			/* Out of descriptors: the connection stays queued and
			 * poll would return at once; wait instead of spinning. */
			if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)
				poll(NULL, 0, STOP_POLL_MS);
			continue;
		}
		serve(w, fd, &ss);
		close(fd);
	}
	return NULL;
}

int mp_welcome_start(const struct mp_auth *a, uint64_t run_id, unsigned port,
		     mp_welcome_fill_fn fill, void *arg, struct mp_welcome **out)
{
	struct mp_welcome *w;
	struct mp_inet_addr blob;
	size_t blen;
	char bind[32], name[MP_ADDR_STRLEN];
	int rc;

	if (!a || !fill || !out || port > 65535)
		return -EINVAL;
	w = calloc(1, sizeof(*w));
	if (!w)
		return -ENOMEM;
	w->buf = malloc(MP_WELCOME_BUF_LEN);
	if (!w->buf) {
		free(w);
		return -ENOMEM;
	}
	w->auth = *a;
	w->run_id = run_id;
	w->fill = fill;
	w->arg = arg;
	snprintf(bind, sizeof(bind), "0.0.0.0:%u", port);
	rc = mp_inet_listen(bind, 16, NULL, NULL, &w->fd, &blob, &blen, name, sizeof(name));
	if (!rc) {
		w->port = (unsigned)blob.port[0] << 8 | blob.port[1];
		rc = -pthread_create(&w->thread, NULL, service, w);
		if (rc)
			close(w->fd);
	}
	if (rc) {
		memset(&w->auth, 0, sizeof(w->auth));
		free(w->buf);
		free(w);
		return rc;
	}
	*out = w;
	return 0;
}

void mp_welcome_stop(struct mp_welcome *w)
{
	if (!w)
		return;
	__atomic_store_n(&w->stop, 1, __ATOMIC_RELEASE);
	pthread_join(w->thread, NULL);
	close(w->fd);
	memset(&w->auth, 0, sizeof(w->auth));
	free(w->buf);
	free(w);
}

unsigned mp_welcome_port(const struct mp_welcome *w)
{
	return w->port;
}

uint64_t mp_welcome_refused(struct mp_welcome *w)
{
	return w ? __atomic_load_n(&w->refused, __ATOMIC_RELAXED) : 0;
}

int mp_welcome_ask_io(const struct mp_auth *a, uint64_t run_id, const struct mp_welcome_io *io,
		      uint64_t deadline, const uint8_t *give, size_t give_len, uint8_t **payload,
		      size_t *len)
{
	uint8_t hello[HELLO_LEN], ask[ASK_LEN], hdr[GIVE_HDR_LEN], *buf = NULL;
	size_t n;
	int rc;

	if (!a || !io || !payload || !len || give_len > MP_WELCOME_GIVE_MAX || (give_len && !give))
		return -EINVAL;
	if ((rc = xfer(io, hello, sizeof(hello), deadline, 0)))
		return rc;
	if (memcmp(hello, MAGIC, 4) || hello[4] != VERSION)
		return -EPROTO;
	mp_auth_random(ask, MP_NONCE_BYTES);
	mp_le_put16(ask + MP_NONCE_BYTES, (uint16_t)give_len);
	step_mac(a, MP_AUTH_WELCOME_ASK, hello + 5, ask, run_id, ask + MP_NONCE_BYTES, 2, give,
		 give_len, ask + MP_NONCE_BYTES + 2, 0);
	if ((rc = xfer(io, ask, sizeof(ask), deadline, 1)) ||
	    (give_len && (rc = xfer(io, (void *)give, give_len, deadline, 1))))
		return rc;
	/* Closed right after our ask: it could not verify it. */
	if ((rc = xfer(io, hdr, sizeof(hdr), deadline, 0)))
		return rc == -ECONNRESET ? -EACCES : rc;
	n = mp_le_get32(hdr);
	/* Bounded before anything is allocated for it. */
	if (n > MP_WELCOME_MAX)
		return -EMSGSIZE;
	buf = malloc(n ? n : 1);
	if (!buf)
		return -ENOMEM;
	if ((rc = xfer(io, buf, n, deadline, 0)) ||
	    (rc = step_mac(a, MP_AUTH_WELCOME_GIVE, ask, hello + 5, run_id, hdr, 4, buf, n,
			   hdr + 4, 1))) {
		free(buf);
		return rc;
	}
	*payload = buf;
	*len = n;
	return 0;
}

int mp_welcome_ask(const struct mp_auth *a, uint64_t run_id, const char *addr, int timeout_ms,
		   const uint8_t *give, size_t give_len, uint8_t **payload, size_t *len)
{
	uint64_t deadline = mp_now_ms() + (uint64_t)(timeout_ms > 0 ? timeout_ms : 1);
	struct mp_welcome_io io;
	int fd = -1, rc;

	if (!a || !addr || !payload || !len || give_len > MP_WELCOME_GIVE_MAX ||
	    (give_len && !give))
		return -EINVAL;
	if ((rc = mp_inet_dial(addr, deadline, &fd)))
		return rc;
	io = (struct mp_welcome_io){sock_xfer, &fd};
	rc = mp_welcome_ask_io(a, run_id, &io, deadline, give, give_len, payload, len);
	close(fd);
	return rc;
}
