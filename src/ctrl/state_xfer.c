/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * State download (state_xfer.h). The exchange, integers little-endian:
 *
 *   server: "MPST", version 1, nonce_s (16)                            21 bytes
 *   client: nonce_c (16), kind (u8: 1 version, 2 download), offset (u64),
 *           want (32: the digest it has part of, zeros for none),
 *           MAC(STATE_ASK: nonce_s, nonce_c, run id, kind..want)        89 bytes
 *   server: have (u8), version (u64), total (u64), start (u64), nbufs
 *           (u32), meta length (u32), digest (32), the lengths (u64 each),
 *           the metadata, MAC(STATE_GIVE: nonce_c, nonce_s, run id, all
 *           of it)                                           97 + 8 nbufs + meta
 *   server (download): the buffers' bytes from start to total.
 *
 * start is the client's offset when want is the digest of what the server
 * serves, else 0. The data carries no MAC of its own: the client hashes
 * the whole download and compares with the digest the header's MAC
 * covers, so bytes a stranger or a faulty server changed are found before
 * the call returns. A client that cannot prove the run key gets the
 * server's nonce and nothing else.
 *
 * Why threads of its own and plain TCP: a download of a model is hundreds
 * of megabytes; the progress thread would either stall its averaging for
 * it or interleave it chunk by chunk with the exchanges. A server thread
 * per download (at most MP_STATE_MAX_ACTIVE) sends from an immutable
 * snapshot while the application and the progress thread go on.
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <moshpit/sdk/clock.h>
#include <moshpit/sdk/le.h>
#include <moshpit/moshpit.h>

#include "inet.h"
#include "log.h"
#include "state_xfer.h"

#define MAGIC "MPST"
#define VERSION 1
#define HELLO_LEN (4 + 1 + MP_NONCE_BYTES)
#define ASK_BODY (1 + 8 + MP_STATE_DIGEST_BYTES)
#define ASK_LEN (MP_NONCE_BYTES + ASK_BODY + MP_MAC_BYTES)
#define HEAD_FIXED (1 + 8 + 8 + 8 + 4 + 4 + MP_STATE_DIGEST_BYTES)
#define KIND_VERSION 1
#define KIND_DOWNLOAD 2
/* Bytes moved per deadline: a stall is a piece that does not move within it. */
#define PIECE (1u << 20)
#define STOP_POLL_MS 100
#define WARN_EVERY_MS 1000

struct mp_state_snap {
	int refs; /* atomic */
	uint64_t version;
	uint64_t total;
	uint32_t nbufs;
	uint32_t meta_len;
	uint64_t *lens;
	uint8_t *meta;
	uint8_t *data;
	/* The digest is computed by the first download that needs it, on a
	 * server thread, not by mp_state_publish on the application's. */
	pthread_mutex_t lock;
	int hashed;
	uint8_t digest[MP_STATE_DIGEST_BYTES];
};

struct slot {
	pthread_t thread;
	int used;
	int done; /* atomic */
	int fd;
	struct mp_state_srv *srv;
};

struct mp_state_srv {
	struct mp_auth auth;
	uint64_t run_id;
	int stall_ms;
	uint64_t rate; /* bytes per second per download, 0 unlimited */
	int fd;
	char addr[MP_ADDR_STRLEN];
	pthread_t thread;
	int stop; /* atomic */
	pthread_mutex_t lock;
	struct mp_state_snap *cur; /* under lock */
	struct slot slots[MP_STATE_MAX_ACTIVE];
	struct mp_state_srv_counts n; /* atomic fields */
	uint64_t last_warn_ms; /* atomic: workers refuse in parallel */
};

/* ------------------------------------------------------------ snapshots */

int mp_state_snap_new(uint64_t version, const void *const *bufs, const size_t *lens, int n,
		      const void *meta, size_t meta_len, struct mp_state_snap **out)
{
	struct mp_state_snap *s;
	uint64_t total = 0, off = 0;

	if (!out || n < 0 || n > MP_STATE_MAX_BUFS || (n && (!bufs || !lens)) ||
	    meta_len > MP_STATE_META_MAX || (meta_len && !meta))
		return -EINVAL;
	for (int i = 0; i < n; i++) {
		if (lens[i] && !bufs[i])
			return -EINVAL;
		if (lens[i] > UINT64_MAX - total)
			return -EINVAL;
		total += lens[i];
	}
	if (total > SIZE_MAX)
		return -ENOMEM;
	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->lens = malloc(sizeof(*s->lens) * (size_t)(n ? n : 1));
	s->meta = malloc(meta_len ? meta_len : 1);
	s->data = malloc(total ? (size_t)total : 1);
	if (!s->lens || !s->meta || !s->data) {
		free(s->lens);
		free(s->meta);
		free(s->data);
		free(s);
		return -ENOMEM;
	}
	for (int i = 0; i < n; i++) {
		s->lens[i] = lens[i];
		if (lens[i])
			memcpy(s->data + off, bufs[i], lens[i]);
		off += lens[i];
	}
	if (meta_len)
		memcpy(s->meta, meta, meta_len);
	s->refs = 1;
	s->version = version;
	s->total = total;
	s->nbufs = (uint32_t)n;
	s->meta_len = (uint32_t)meta_len;
	pthread_mutex_init(&s->lock, NULL);
	*out = s;
	return 0;
}

static struct mp_state_snap *snap_get(struct mp_state_snap *s)
{
	if (s)
		__atomic_add_fetch(&s->refs, 1, __ATOMIC_RELAXED);
	return s;
}

void mp_state_snap_put(struct mp_state_snap *s)
{
	if (!s || __atomic_sub_fetch(&s->refs, 1, __ATOMIC_ACQ_REL))
		return;
	pthread_mutex_destroy(&s->lock);
	free(s->lens);
	free(s->meta);
	free(s->data);
	free(s);
}

/* BLAKE2b-256 over the bytes of @n pieces (@bufs, @lens) in order. */
static void digest_of(void *const *bufs, const size_t *lens, size_t n,
		      uint8_t out[MP_STATE_DIGEST_BYTES])
{
	crypto_generichash_state st;

	crypto_generichash_init(&st, NULL, 0, MP_STATE_DIGEST_BYTES);
	for (size_t i = 0; i < n; i++)
		if (lens[i])
			crypto_generichash_update(&st, bufs[i], lens[i]);
	crypto_generichash_final(&st, out, MP_STATE_DIGEST_BYTES);
}

static void snap_digest(struct mp_state_snap *s, uint8_t out[MP_STATE_DIGEST_BYTES])
{
	pthread_mutex_lock(&s->lock);
	if (!s->hashed) {
		void *b = s->data;
		size_t l = (size_t)s->total;

		digest_of(&b, &l, 1, s->digest);
		s->hashed = 1;
	}
	memcpy(out, s->digest, MP_STATE_DIGEST_BYTES);
	pthread_mutex_unlock(&s->lock);
}

/* ------------------------------------------------------------ the MACs */

static void ask_mac(const struct mp_auth *a, const uint8_t *nonce_s, const uint8_t *ask,
		    uint64_t run_id, uint8_t mac[MP_MAC_BYTES])
{
	uint8_t run[8];
	struct mp_auth_piece pc[4] = {{nonce_s, MP_NONCE_BYTES}, {ask, MP_NONCE_BYTES},
				      {run, 8}, {ask + MP_NONCE_BYTES, ASK_BODY}};

	mp_le_put64(run, run_id);
	mp_auth_mac(a, MP_AUTH_STATE_ASK, pc, 4, mac);
}

static void head_mac(const struct mp_auth *a, const uint8_t *nonce_c, const uint8_t *nonce_s,
		     uint64_t run_id, const uint8_t *fixed, const void *lens, size_t lens_len,
		     const uint8_t *meta, size_t meta_len, uint8_t mac[MP_MAC_BYTES])
{
	uint8_t run[8];
	struct mp_auth_piece pc[6] = {{nonce_c, MP_NONCE_BYTES}, {nonce_s, MP_NONCE_BYTES},
				      {run, 8}, {fixed, HEAD_FIXED}, {lens, lens_len},
				      {meta, meta_len}};

	mp_le_put64(run, run_id);
	mp_auth_mac(a, MP_AUTH_STATE_GIVE, pc, 6, mac);
}

/* ------------------------------------------------------------ server */

static void refuse(struct mp_state_srv *s, int fd, const char *why)
{
	uint64_t n = __atomic_add_fetch(&s->n.refused, 1, __ATOMIC_RELAXED), now = mp_now_ms();
	uint64_t last = __atomic_load_n(&s->last_warn_ms, __ATOMIC_RELAXED);
	struct sockaddr_storage ss;
	socklen_t sl = sizeof(ss);
	char name[MP_ADDR_STRLEN] = "?";

	if (last && now - last < WARN_EVERY_MS)
		return;
	__atomic_store_n(&s->last_warn_ms, now, __ATOMIC_RELAXED);
	if (!getpeername(fd, (struct sockaddr *)&ss, &sl))
		mp_inet_name((struct sockaddr *)&ss, name, sizeof(name));
	MP_WARN("state: refused %s: %s (%llu refused so far)", name, why, (unsigned long long)n);
}

/* Send @len bytes of @p, a piece at a time, each within the stall limit,
 * until done or the server stops. With a rate, a piece leaves no earlier
 * than the rate allows since @t0 (the download's start, mp_now_ns clock),
 * *@sent bytes having left before it. */
static int send_all(struct mp_state_srv *s, int fd, const uint8_t *p, size_t len, uint64_t t0,
		    uint64_t *sent)
{
	size_t piece = PIECE;

	/* Smaller pieces under a rate: smoother, and the stop flag is seen sooner. */
	if (s->rate && s->rate / 16 < piece)
		piece = s->rate / 16 ? (size_t)(s->rate / 16) : 1;
	while (len) {
		size_t k = len < piece ? len : piece;
		int rc;

		if (__atomic_load_n(&s->stop, __ATOMIC_ACQUIRE))
			return -ECANCELED;
		if (s->rate) {
			double due = (double)*sent / (double)s->rate * 1e9;
			uint64_t now = mp_now_ns();

			if (t0 + (uint64_t)due > now) {
				uint64_t wait = t0 + (uint64_t)due - now;
				struct timespec ts = {(time_t)(wait / 1000000000u),
						      (long)(wait % 1000000000u)};

				nanosleep(&ts, NULL);
			}
		}
		rc = mp_inet_xfer(fd, (void *)p, k, mp_now_ms() + (uint64_t)s->stall_ms, 1);
		if (rc)
			return rc;
		p += k;
		len -= k;
		*sent += k;
	}
	return 0;
}

static void serve(struct mp_state_srv *s, int fd)
{
	uint8_t hello[HELLO_LEN], ask[ASK_LEN], mac[MP_MAC_BYTES], fixed[HEAD_FIXED] = {0};
	uint8_t digest[MP_STATE_DIGEST_BYTES] = {0}, *lens = NULL, *nonce_s = hello + 5;
	uint64_t deadline = mp_now_ms() + (uint64_t)s->stall_ms, offset, start = 0;
	struct mp_state_snap *snap;
	int kind, rc;

	memcpy(hello, MAGIC, 4);
	hello[4] = VERSION;
	mp_auth_random(nonce_s, MP_NONCE_BYTES);
	if (mp_inet_xfer(fd, hello, sizeof(hello), deadline, 1))
		return; /* gone before it asked: nothing to refuse */
	if ((rc = mp_inet_xfer(fd, ask, sizeof(ask), deadline, 0))) {
		refuse(s, fd, rc == -ETIMEDOUT ? "no ask in time" : "closed before asking");
		return;
	}
	ask_mac(&s->auth, nonce_s, ask, s->run_id, mac);
	if (sodium_memcmp(mac, ask + MP_NONCE_BYTES + ASK_BODY, MP_MAC_BYTES)) {
		refuse(s, fd, "wrong MAC: another run key or another run");
		return;
	}
	kind = ask[MP_NONCE_BYTES];
	offset = mp_le_get64(ask + MP_NONCE_BYTES + 1);
	if (kind != KIND_VERSION && kind != KIND_DOWNLOAD) {
		refuse(s, fd, "unknown request");
		return;
	}
	pthread_mutex_lock(&s->lock);
	snap = snap_get(s->cur);
	pthread_mutex_unlock(&s->lock);
	if (snap) {
		snap_digest(snap, digest);
		if (kind == KIND_DOWNLOAD && offset <= snap->total &&
		    !memcmp(digest, ask + MP_NONCE_BYTES + 9, MP_STATE_DIGEST_BYTES))
			start = offset;
		fixed[0] = 1;
		mp_le_put64(fixed + 1, snap->version);
		mp_le_put64(fixed + 9, snap->total);
		mp_le_put64(fixed + 17, start);
		mp_le_put32(fixed + 25, snap->nbufs);
		mp_le_put32(fixed + 29, snap->meta_len);
		memcpy(fixed + 33, digest, MP_STATE_DIGEST_BYTES);
		lens = malloc(8 * (size_t)snap->nbufs + 1);
		if (!lens) {
			mp_state_snap_put(snap);
			return;
		}
		for (uint32_t i = 0; i < snap->nbufs; i++)
			mp_le_put64(lens + 8 * (size_t)i, snap->lens[i]);
	}
	head_mac(&s->auth, ask, nonce_s, s->run_id, fixed, lens, snap ? 8 * (size_t)snap->nbufs : 0,
		 snap ? snap->meta : NULL, snap ? snap->meta_len : 0, mac);
	uint64_t t0 = mp_now_ns(), sent = 0;
	rc = send_all(s, fd, fixed, sizeof(fixed), t0, &sent);
	if (!rc && snap)
		rc = send_all(s, fd, lens, 8 * (size_t)snap->nbufs, t0, &sent);
	if (!rc && snap)
		rc = send_all(s, fd, snap->meta, snap->meta_len, t0, &sent);
	if (!rc)
		rc = send_all(s, fd, mac, sizeof(mac), t0, &sent);
	if (!rc && snap && kind == KIND_DOWNLOAD)
		rc = send_all(s, fd, snap->data + start, (size_t)(snap->total - start), t0, &sent);
	__atomic_add_fetch(rc ? &s->n.cut : &s->n.served, 1, __ATOMIC_RELAXED);
	free(lens);
	mp_state_snap_put(snap);
}

static void *worker(void *arg)
{
	struct slot *sl = arg;

	serve(sl->srv, sl->fd);
	close(sl->fd);
	__atomic_store_n(&sl->done, 1, __ATOMIC_RELEASE);
	return NULL;
}

/* Join the workers that have ended; with @all, wait for every one. */
static void reap(struct mp_state_srv *s, int all)
{
	for (int i = 0; i < MP_STATE_MAX_ACTIVE; i++) {
		struct slot *sl = &s->slots[i];

		if (sl->used && (all || __atomic_load_n(&sl->done, __ATOMIC_ACQUIRE))) {
			pthread_join(sl->thread, NULL);
			sl->used = 0;
		}
	}
}

static void *service(void *arg)
{
	struct mp_state_srv *s = arg;

	while (!__atomic_load_n(&s->stop, __ATOMIC_ACQUIRE)) {
		struct pollfd pfd = {.fd = s->fd, .events = POLLIN};
		struct slot *free_slot = NULL;
		int fd;

		reap(s, 0);
		if (poll(&pfd, 1, STOP_POLL_MS) <= 0)
			continue;
		fd = accept4(s->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd < 0) {
			/* Out of descriptors: the connection stays queued and
			 * poll would return at once; wait instead of spinning. */
			if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)
				poll(NULL, 0, STOP_POLL_MS);
			continue;
		}
		reap(s, 0);
		for (int i = 0; i < MP_STATE_MAX_ACTIVE && !free_slot; i++)
			if (!s->slots[i].used)
				free_slot = &s->slots[i];
		if (!free_slot) {
			/* The client sees the connection close before the hello
			 * and asks the next server. */
			__atomic_add_fetch(&s->n.busy, 1, __ATOMIC_RELAXED);
			close(fd);
			continue;
		}
		*free_slot = (struct slot){.used = 1, .fd = fd, .srv = s};
		if (pthread_create(&free_slot->thread, NULL, worker, free_slot)) {
			free_slot->used = 0;
			__atomic_add_fetch(&s->n.busy, 1, __ATOMIC_RELAXED);
			close(fd);
		}
	}
	reap(s, 1);
	return NULL;
}

int mp_state_srv_start(const struct mp_auth *a, uint64_t run_id, const char *listen,
		       int stall_ms, uint64_t rate, struct mp_state_srv **out)
{
	struct mp_state_srv *s;
	struct mp_inet_addr blob;
	size_t blen;
	int rc;

	if (!a || !listen || !out || stall_ms < 1)
		return -EINVAL;
	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->auth = *a;
	s->run_id = run_id;
	s->stall_ms = stall_ms;
	s->rate = rate;
	pthread_mutex_init(&s->lock, NULL);
	rc = mp_inet_listen(listen, 16, NULL, NULL, &s->fd, &blob, &blen, s->addr, sizeof(s->addr));
	if (!rc) {
		rc = -pthread_create(&s->thread, NULL, service, s);
		if (rc)
			close(s->fd);
	}
	if (rc) {
		pthread_mutex_destroy(&s->lock);
		sodium_memzero(&s->auth, sizeof(s->auth));
		free(s);
		return rc;
	}
	*out = s;
	return 0;
}

void mp_state_srv_stop(struct mp_state_srv *s)
{
	if (!s)
		return;
	__atomic_store_n(&s->stop, 1, __ATOMIC_RELEASE);
	pthread_join(s->thread, NULL);
	close(s->fd);
	mp_state_snap_put(s->cur);
	pthread_mutex_destroy(&s->lock);
	sodium_memzero(&s->auth, sizeof(s->auth));
	free(s);
}

const char *mp_state_srv_addr(const struct mp_state_srv *s)
{
	return s->addr;
}

void mp_state_srv_set(struct mp_state_srv *s, struct mp_state_snap *snap)
{
	struct mp_state_snap *old;

	snap_get(snap);
	pthread_mutex_lock(&s->lock);
	old = s->cur;
	s->cur = snap;
	pthread_mutex_unlock(&s->lock);
	mp_state_snap_put(old);
}

void mp_state_srv_counts(struct mp_state_srv *s, struct mp_state_srv_counts *out)
{
	memset(out, 0, sizeof(*out));
	if (!s)
		return;
	out->served = __atomic_load_n(&s->n.served, __ATOMIC_RELAXED);
	out->refused = __atomic_load_n(&s->n.refused, __ATOMIC_RELAXED);
	out->busy = __atomic_load_n(&s->n.busy, __ATOMIC_RELAXED);
	out->cut = __atomic_load_n(&s->n.cut, __ATOMIC_RELAXED);
}

/* ------------------------------------------------------------ client */

void mp_state_head_free(struct mp_state_head *h)
{
	if (!h)
		return;
	free(h->lens);
	free(h->meta);
	memset(h, 0, sizeof(*h));
}

/*
 * Connect to @addr, ask (@kind, @offset, @want), read and verify the
 * header into @h. On success *@fd is the connection, positioned at the
 * data of a download. 0, -EACCES (closed after our ask: it could not
 * verify it, or a header whose MAC is wrong), -EPROTO, -EMSGSIZE (a header
 * past the bounds), or the socket's error.
 */
#define XF(buf, len, out) io->xfer(io->ctx, (buf), (len), deadline, (out))

int mp_state_ask_io(const struct mp_auth *a, uint64_t run_id, const struct mp_state_io *io,
		    int kind, uint64_t offset, const uint8_t *want, uint64_t deadline,
		    struct mp_state_head *h)
{
	uint8_t hello[HELLO_LEN], q[ASK_LEN] = {0}, fixed[HEAD_FIXED], mac[MP_MAC_BYTES];
	uint8_t want_mac[MP_MAC_BYTES], *lens = NULL;
	int rc;

	memset(h, 0, sizeof(*h));
	if ((rc = XF(hello, sizeof(hello), 0)))
		goto fail;
	if (memcmp(hello, MAGIC, 4) || hello[4] != VERSION) {
		rc = -EPROTO;
		goto fail;
	}
	mp_auth_random(q, MP_NONCE_BYTES);
	q[MP_NONCE_BYTES] = (uint8_t)kind;
	mp_le_put64(q + MP_NONCE_BYTES + 1, offset);
	if (want)
		memcpy(q + MP_NONCE_BYTES + 9, want, MP_STATE_DIGEST_BYTES);
	ask_mac(a, hello + 5, q, run_id, q + MP_NONCE_BYTES + ASK_BODY);
	if ((rc = XF(q, sizeof(q), 1)))
		goto fail;
	/* Closed right after our ask: it could not verify it. */
	if ((rc = XF(fixed, sizeof(fixed), 0))) {
		rc = rc == -ECONNRESET ? -EACCES : rc;
		goto fail;
	}
	h->have = fixed[0];
	h->version = mp_le_get64(fixed + 1);
	h->total = mp_le_get64(fixed + 9);
	h->start = mp_le_get64(fixed + 17);
	h->nbufs = mp_le_get32(fixed + 25);
	h->meta_len = mp_le_get32(fixed + 29);
	memcpy(h->digest, fixed + 33, MP_STATE_DIGEST_BYTES);
	/* Bounded before anything is allocated for them. */
	if (h->have > 1 || h->nbufs > MP_STATE_MAX_BUFS || h->meta_len > MP_STATE_META_MAX ||
	    h->start > h->total) {
		rc = -EMSGSIZE;
		goto fail;
	}
	lens = malloc(8 * (size_t)h->nbufs + 1);
	h->lens = malloc(sizeof(*h->lens) * (size_t)h->nbufs + 1);
	h->meta = malloc((size_t)h->meta_len + 1);
	if (!lens || !h->lens || !h->meta) {
		rc = -ENOMEM;
		goto fail;
	}
	if ((rc = XF(lens, 8 * (size_t)h->nbufs, 0)) ||
	    (rc = XF(h->meta, h->meta_len, 0)) ||
	    (rc = XF(mac, sizeof(mac), 0)))
		goto fail;
	head_mac(a, q, hello + 5, run_id, fixed, lens, 8 * (size_t)h->nbufs, h->meta, h->meta_len,
		 want_mac);
	if (sodium_memcmp(mac, want_mac, MP_MAC_BYTES)) {
		rc = -EACCES;
		goto fail;
	}
	uint64_t sum = 0;
	for (uint32_t i = 0; i < h->nbufs; i++) {
		h->lens[i] = mp_le_get64(lens + 8 * (size_t)i);
		sum += h->lens[i];
	}
	if (sum != h->total) {
		rc = -EPROTO;
		goto fail;
	}
	free(lens);
	return 0;
fail:
	free(lens);
	mp_state_head_free(h);
	return rc;
}

static int sock_xfer(void *ctx, void *buf, size_t len, uint64_t deadline, int out)
{
	return mp_inet_xfer(*(int *)ctx, buf, len, deadline, out);
}

/* mp_state_ask_io over a new connection to @addr, left open in *@fd. */
static int ask(const struct mp_auth *a, uint64_t run_id, const char *addr, int kind,
	       uint64_t offset, const uint8_t *want, uint64_t deadline, int *fd,
	       struct mp_state_head *h)
{
	int c, rc = mp_inet_dial(addr, deadline, &c);

	memset(h, 0, sizeof(*h));
	if (rc)
		return rc;
	rc = mp_state_ask_io(a, run_id, &(struct mp_state_io){sock_xfer, &c}, kind, offset, want,
			     deadline, h);
	if (rc) {
		close(c);
		return rc;
	}
	*fd = c;
	return 0;
}


#undef XF

static int lens_match(const struct mp_state_head *h, const struct mp_state_dest *d)
{
	if (h->nbufs != (uint32_t)d->n)
		return 0;
	for (int i = 0; i < d->n; i++)
		if (h->lens[i] != d->lens[i])
			return 0;
	return 1;
}

/* Receive the data from @h->start on into @d, advancing *@got. */
static int receive(const struct mp_state_io *io, const struct mp_state_head *h,
		   const struct mp_state_dest *d, int stall_ms, uint64_t deadline, uint64_t *got)
{
	uint64_t base = 0;

	*got = h->start;
	for (int i = 0; i < d->n; i++) {
		uint64_t end = base + d->lens[i];

		while (*got < end) {
			uint64_t off = *got - base, k = end - *got, now = mp_now_ms();
			uint64_t lim = now + (uint64_t)stall_ms;
			int rc;

			if (now >= deadline)
				return -ETIMEDOUT;
			if (k > PIECE)
				k = PIECE;
			rc = io->xfer(io->ctx, (uint8_t *)d->bufs[i] + off, (size_t)k,
				      lim < deadline ? lim : deadline, 0);
			if (rc)
				return rc;
			*got += k;
		}
		base = end;
	}
	return 0;
}

int mp_state_download_io(const struct mp_auth *a, uint64_t run_id, const struct mp_state_io *io,
			 const struct mp_state_dest *d, uint64_t offset, const uint8_t *want,
			 int stall_ms, uint64_t deadline, struct mp_state_head *h, uint64_t *got)
{
	uint8_t dg[MP_STATE_DIGEST_BYTES];
	int rc;

	*got = 0;
	rc = mp_state_ask_io(a, run_id, io, KIND_DOWNLOAD, offset, want, deadline, h);
	if (rc)
		return rc;
	if (!h->have)
		return -ENOENT;
	if (!lens_match(h, d))
		return -EMSGSIZE;
	/* The data starts at 0, or where we asked when we hold part of the
	 * same snapshot: anything else would leave bytes of ours in place that
	 * the server never sent (found by fuzz_state). */
	if (h->start && (h->start != offset || !want ||
			 memcmp(h->digest, want, MP_STATE_DIGEST_BYTES)))
		return -EPROTO;
	rc = receive(io, h, d, stall_ms, deadline, got);
	if (rc)
		return rc;
	digest_of(d->bufs, d->lens, (size_t)d->n, dg);
	return memcmp(dg, h->digest, sizeof(dg)) ? -EBADMSG : 0;
}

static void note(struct mp_state_outcome *o, const char *addr, const char *what, int rc)
{
	size_t l = strlen(o->why);

	if (l + 1 < sizeof(o->why))
		snprintf(o->why + l, sizeof(o->why) - l, "%s%s: %s%s%s", l ? "; " : "", addr, what,
			 rc ? " " : "", rc ? strerror(-rc) : "");
}

int mp_state_fetch_any(const struct mp_auth *a, uint64_t run_id, const char *const *addrs,
		       int naddrs, const struct mp_state_dest *d, int connect_ms, int stall_ms,
		       uint64_t deadline, struct mp_state_head *best, struct mp_state_outcome *out)
{
	struct mp_state_head *heads;
	int *order, norder = 0, refused = 0, empty = 0, mismatch = 0, last = -ENOENT;
	uint8_t have_digest[MP_STATE_DIGEST_BYTES];
	uint64_t got = 0;

	memset(out, 0, sizeof(*out));
	out->src = -1;
	memset(best, 0, sizeof(*best));
	if (!a || !addrs || naddrs < 1 || connect_ms < 1 || stall_ms < 1)
		return -EINVAL;
	heads = calloc((size_t)naddrs, sizeof(*heads));
	order = calloc((size_t)naddrs, sizeof(*order));
	if (!heads || !order) {
		free(heads);
		free(order);
		return -ENOMEM;
	}
	/* Versions first: the most advanced server is tried first. */
	for (int i = 0; i < naddrs; i++) {
		uint64_t now = mp_now_ms(), lim = now + (uint64_t)connect_ms + (uint64_t)stall_ms;
		int fd, rc;

		if (now >= deadline) {
			note(out, addrs[i], "not asked: out of time", 0);
			last = -ETIMEDOUT;
			continue;
		}
		rc = ask(a, run_id, addrs[i], KIND_VERSION, 0, NULL, lim < deadline ? lim : deadline,
			 &fd, &heads[i]);
		if (rc) {
			note(out, addrs[i], rc == -EACCES ? "refused us (another run key?)" : "version query:",
			     rc == -EACCES ? 0 : rc);
			refused += rc == -EACCES;
			last = rc;
			continue;
		}
		close(fd);
		if (!heads[i].have) {
			note(out, addrs[i], "has published nothing", 0);
			empty++;
			continue;
		}
		if (d && !lens_match(&heads[i], d)) {
			note(out, addrs[i], "its buffers have other lengths", 0);
			mismatch++;
			continue;
		}
		int j = norder++;
		while (j > 0 && heads[order[j - 1]].version < heads[i].version) {
			order[j] = order[j - 1];
			j--;
		}
		order[j] = i;
	}
	if (!norder) {
		int rc = refused == naddrs ? -EACCES : mismatch ? -EMSGSIZE
				: empty + refused == naddrs ? -ENOENT : last;
		for (int i = 0; i < naddrs; i++)
			mp_state_head_free(&heads[i]);
		free(heads);
		free(order);
		return rc;
	}
	if (!d) {
		*best = heads[order[0]];
		memset(&heads[order[0]], 0, sizeof(heads[0]));
		out->src = order[0];
		last = 0;
		goto done;
	}
	memset(have_digest, 0, sizeof(have_digest));
	last = -ETIMEDOUT;
	for (int k = 0; k < norder; k++) {
		int i = order[k], fd, rc;
		struct mp_state_head h;
		uint64_t now = mp_now_ms(), lim = now + (uint64_t)connect_ms + (uint64_t)stall_ms;

		if (now >= deadline) {
			note(out, addrs[i], "not tried: out of time", 0);
			last = -ETIMEDOUT;
			break;
		}
		out->tries++;
		rc = mp_inet_dial(addrs[i], lim < deadline ? lim : deadline, &fd);
		if (rc) {
			note(out, addrs[i], "download:", rc);
			last = rc;
			continue;
		}
		uint64_t kept = got;
		rc = mp_state_download_io(a, run_id, &(struct mp_state_io){sock_xfer, &fd}, d, got,
					  got ? have_digest : NULL, stall_ms, deadline, &h, &got);
		close(fd);
		if (rc == -ENOENT || rc == -EMSGSIZE) {
			/* Published again meanwhile, with other buffers, or none. */
			note(out, addrs[i], "its state changed to other lengths", 0);
			mp_state_head_free(&h);
			got = kept;
			last = -EMSGSIZE;
			continue;
		}
		if (h.have) { /* a header came: the data that follows was its snapshot's */
			if (h.start && kept)
				out->resumed += h.start;
			memcpy(have_digest, h.digest, sizeof(have_digest));
		} else {
			got = kept; /* nothing of this server's: what we had stands */
		}
		if (rc == -EBADMSG) {
			note(out, addrs[i], "the data does not match its digest", 0);
			mp_state_head_free(&h);
			got = 0;
			last = rc;
			continue;
		}
		if (rc) {
			note(out, addrs[i], h.have ? "cut mid-transfer:" : "download:", rc);
			mp_state_head_free(&h);
			last = rc;
			continue;
		}
		*best = h;
		out->src = i;
		last = 0;
		break;
	}
done:
	for (int i = 0; i < naddrs; i++)
		mp_state_head_free(&heads[i]);
	free(heads);
	free(order);
	return last;
}
