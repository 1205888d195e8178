/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The memif control relay: see relay.h for why. One thread per memif device,
 * blocked in poll() on its listener and the pairs of sockets it joins; it
 * never touches the shared regions, only the control messages (128 bytes
 * each, SOCK_SEQPACKET, with at most one file descriptor) that set a pair
 * up and take it down.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <moshpit/driver_sdk.h>

#include "relay.h"

#define RELAY_PAIRS 4   /* control connections at once (a memif port has one; more are refused by memif) */
#define RELAY_FDS 4     /* descriptors one message may carry (memif sends one) */
#define RELAY_MSG 512   /* memif's messages are 128 bytes */
/* memif's DISCONNECT (memif_msg_type_t in DPDK's drivers/net/memif/memif.h; the
 * first 16 bits of every message are its type). */
#define MEMIF_MSG_DISCONNECT 8
/* memif's socket when devargs name none (ETH_MEMIF_DEFAULT_SOCKET_FILENAME) */
#define MEMIF_DEFAULT_SOCKET "/run/memif.sock"

struct relay_pair {
	int mine;   /* our memif's end */
	int theirs; /* the peer's */
	bool told;  /* the driver heard of the peer's end already */
};

struct relay {
	bool client;        /* our memif dials (role=client) */
	bool abstract;      /* the public name is in the abstract namespace */
	char pub[108];      /* the socket the user named: where the peer is or dials */
	char priv[108];     /* our memif's, abstract */
	int lfd;
	struct relay_pair p[RELAY_PAIRS];
	mp_memif_relay_gone_fn gone;
	void *arg;
	pthread_t thread;
};

/* The address of @name as memif forms it (its memif_socket_create / memif_connect_client). */
static socklen_t un_addr(struct sockaddr_un *un, const char *name, bool abstract)
{
	memset(un, 0, sizeof(*un));
	un->sun_family = AF_UNIX;
	if (abstract) {
		size_t n = strnlen(name, sizeof(un->sun_path) - 1);

		memcpy(un->sun_path + 1, name, n);
		return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n);
	}
	snprintf(un->sun_path, sizeof(un->sun_path), "%s", name);
	return sizeof(*un);
}

static int dial(const char *name, bool abstract)
{
	struct sockaddr_un un;
	socklen_t len = un_addr(&un, name, abstract);
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);

	if (fd >= 0 && connect(fd, (struct sockaddr *)&un, len)) {
		close(fd);
		fd = -1;
	}
	return fd;
}

/* End pair @p; @theirs_first: the peer's end went first, so the driver hears of it first. */
static void end_pair(struct relay *r, struct relay_pair *p, bool theirs_first)
{
	bool tell = theirs_first && !p->told;

	if (tell)
		r->gone(r->arg, false, false);
	close(p->mine);
	if (tell)
		r->gone(r->arg, false, true);
	close(p->theirs);
	p->mine = p->theirs = -1;
	p->told = false;
}

/* One message from one end of @p to the other, with the descriptors it carries. */
static void pass(struct relay *r, struct relay_pair *p, bool from_theirs)
{
	int from = from_theirs ? p->theirs : p->mine, to = from_theirs ? p->mine : p->theirs;
	union {
		char b[CMSG_SPACE(RELAY_FDS * sizeof(int)) + CMSG_SPACE(sizeof(struct ucred))];
		struct cmsghdr align;
	} ctl;
	uint8_t buf[RELAY_MSG];
	struct iovec iov = {buf, sizeof(buf)};
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.b,
			    .msg_controllen = sizeof(ctl.b)};
	int fds[RELAY_FDS], nfd = 0;
	ssize_t n = recvmsg(from, &mh, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);

	if (n < 0 && (errno == EAGAIN || errno == EINTR))
		return;
	for (struct cmsghdr *c = n >= 0 ? CMSG_FIRSTHDR(&mh) : NULL; c; c = CMSG_NXTHDR(&mh, c))
		if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS)
			for (size_t k = 0; k < (c->cmsg_len - CMSG_LEN(0)) / sizeof(int); k++) {
				int fd;

				memcpy(&fd, CMSG_DATA(c) + k * sizeof(int), sizeof(fd));
				if (nfd < RELAY_FDS)
					fds[nfd++] = fd;
				else
					close(fd); /* more than memif ever sends */
			}
	if (n <= 0) {
		/* The peer is gone (closed, killed) or our memif closed its end. */
		for (int k = 0; k < nfd; k++)
			close(fds[k]);
		end_pair(r, p, from_theirs);
		return;
	}
	/* Our memif tears down at DISCONNECT too: the driver stops its bursts first. */
	bool tell = from_theirs && !p->told && n >= 2 &&
		    (buf[0] | buf[1] << 8) == MEMIF_MSG_DISCONNECT;

	if (tell) {
		p->told = true;
		r->gone(r->arg, true, false);
	}
	union {
		char b[CMSG_SPACE(RELAY_FDS * sizeof(int))];
		struct cmsghdr align;
	} out;
	struct msghdr om = {.msg_iov = &iov, .msg_iovlen = 1};

	iov.iov_len = (size_t)n;
	if (nfd) {
		struct cmsghdr *c;

		memset(&out, 0, sizeof(out));
		om.msg_control = out.b;
		om.msg_controllen = CMSG_SPACE((size_t)nfd * sizeof(int));
		c = CMSG_FIRSTHDR(&om);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN((size_t)nfd * sizeof(int));
		memcpy(CMSG_DATA(c), fds, (size_t)nfd * sizeof(int));
	}
	ssize_t s = sendmsg(to, &om, MSG_NOSIGNAL);

	for (int k = 0; k < nfd; k++)
		close(fds[k]); /* the receiver has its own copies now */
	if (tell)
		r->gone(r->arg, true, true);
	if (s != n)
		end_pair(r, p, !from_theirs); /* the receiving end is gone */
}

/* A connection on our listener: join it to the other end. */
static void join(struct relay *r)
{
	int a = accept4(r->lfd, NULL, NULL, SOCK_CLOEXEC), o = -1;
	struct relay_pair *p = NULL;

	if (a < 0)
		return;
	for (int i = 0; i < RELAY_PAIRS && !p; i++)
		if (r->p[i].mine < 0)
			p = &r->p[i];
	if (!p) {
		close(a);
		return;
	}
	if (r->client) {
		/*
		 * Our memif dialled: dial the peer. If it is not there, our memif
		 * sees its connection end, its link stays down and the driver
		 * redials (port_start), as without the relay.
		 */
		o = dial(r->pub, r->abstract);
		if (o < 0)
			MP_TRACE("dpdk: memif relay: the peer at %s is not there: %s", r->pub,
				 strerror(errno));
		p->mine = a;
		p->theirs = o;
	} else {
		/* The peer dialled: dial our memif's listener (at most 2 s while EAL comes up). */
		for (int k = 0; k < 200 && (o = dial(r->priv, true)) < 0; k++)
			usleep(10000);
		p->mine = o;
		p->theirs = a;
	}
	if (o < 0) {
		close(a);
		p->mine = p->theirs = -1;
	}
}

static void *relay_main(void *arg)
{
	struct relay *r = arg;

	for (;;) {
		struct pollfd pf[1 + 2 * RELAY_PAIRS];
		int who[1 + 2 * RELAY_PAIRS], n = 1;

		pf[0] = (struct pollfd){.fd = r->lfd, .events = POLLIN};
		for (int i = 0; i < RELAY_PAIRS; i++)
			if (r->p[i].mine >= 0) {
				pf[n] = (struct pollfd){.fd = r->p[i].theirs, .events = POLLIN};
				who[n++] = 2 * i + 1;
				pf[n] = (struct pollfd){.fd = r->p[i].mine, .events = POLLIN};
				who[n++] = 2 * i;
			}
		if (poll(pf, (nfds_t)n, -1) < 0) {
			if (errno != EINTR)
				usleep(10000);
			continue;
		}
		for (int k = 1; k < n; k++) {
			struct relay_pair *p = &r->p[who[k] / 2];

			/* pass() reads the end (or its hang-up) and may end the pair. */
			if (pf[k].revents && p->mine >= 0)
				pass(r, p, who[k] & 1);
		}
		if (pf[0].revents & POLLIN)
			join(r);
	}
	return NULL;
}

int mp_memif_devargs_parse(const char *vdev, bool *client, char *sock, size_t cap,
			   bool *abstract)
{
	const char *c = vdev ? strchr(vdev, ',') : NULL;

	if (!vdev || strncmp(vdev, "net_memif", 9) || cap < 2)
		return -EINVAL;
	*client = false;
	*abstract = true; /* memif's default in 22.11 */
	snprintf(sock, cap, "%s", MEMIF_DEFAULT_SOCKET);
	while (c && *c) {
		const char *k = c + 1, *e = strchr(k, ','), *v = strchr(k, '=');
		size_t klen, vlen;

		if (!e)
			e = k + strlen(k);
		c = *e ? e : NULL;
		if (!v || v > e)
			continue;
		klen = (size_t)(v - k);
		vlen = (size_t)(e - v - 1);
		v++;
		if (klen == 4 && !strncmp(k, "role", 4)) {
			*client = vlen == 6 && !strncmp(v, "client", 6);
		} else if (klen == 6 && !strncmp(k, "socket", 6)) {
			if (!vlen || vlen >= cap)
				return -EINVAL;
			memcpy(sock, v, vlen);
			sock[vlen] = 0;
		} else if (klen == 15 && !strncmp(k, "socket-abstract", 15)) {
			*abstract = !(vlen == 2 && !strncmp(v, "no", 2));
		}
	}
	return 0;
}

/* @vdev with socket= and socket-abstract= replaced by @priv (abstract), into @out. */
static int rewrite(const char *vdev, const char *priv, char *out, size_t cap)
{
	const char *c = strchr(vdev, ',');
	size_t n = c ? (size_t)(c - vdev) : strlen(vdev);
	int w;

	if (n >= cap)
		return -ENAMETOOLONG;
	memcpy(out, vdev, n);
	out[n] = 0;
	while (c && *c) {
		const char *k = c + 1, *e = strchr(k, ',');

		if (!e)
			e = k + strlen(k);
		c = *e ? e : NULL;
		if (!strncmp(k, "socket=", 7) || !strncmp(k, "socket-abstract=", 16) || e == k)
			continue;
		w = snprintf(out + n, cap - n, ",%.*s", (int)(e - k), k);
		if (w < 0 || (size_t)w >= cap - n)
			return -ENAMETOOLONG;
		n += (size_t)w;
	}
	w = snprintf(out + n, cap - n, ",socket=%s,socket-abstract=yes", priv);
	return w < 0 || (size_t)w >= cap - n ? -ENAMETOOLONG : 0;
}

int mp_memif_relay_start(const char *vdev, char *out, size_t cap, mp_memif_relay_gone_fn gone,
			 void *arg)
{
	static atomic_uint seq;
	struct relay *r;
	struct sockaddr_un un;
	socklen_t len;
	int rc;

	if (!vdev || !out || !cap || !gone)
		return -EINVAL;
	snprintf(out, cap, "%s", vdev);
	if (strncmp(vdev, "net_memif", 9))
		return 0;
	r = calloc(1, sizeof(*r));
	if (!r)
		return -ENOMEM;
	r->gone = gone;
	r->arg = arg;
	r->lfd = -1;
	for (int i = 0; i < RELAY_PAIRS; i++)
		r->p[i].mine = r->p[i].theirs = -1;
	rc = mp_memif_devargs_parse(vdev, &r->client, r->pub, sizeof(r->pub), &r->abstract);
	if (rc)
		goto fail;
	/*
	 * A server's public socket in the file system would be ours to bind,
	 * and after a SIGKILL its stale file would refuse the next bind: those
	 * run without a relay (doc/dpdk.md).
	 */
	if (!r->client && !r->abstract) {
		rc = -ENOTSUP;
		goto fail;
	}
	snprintf(r->priv, sizeof(r->priv), "mp-memif-relay.%ld.%u", (long)getpid(),
		 atomic_fetch_add(&seq, 1));
	rc = rewrite(vdev, r->priv, out, cap);
	if (rc)
		goto fail;
	r->lfd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	len = un_addr(&un, r->client ? r->priv : r->pub, r->client ? true : r->abstract);
	if (r->lfd < 0 || bind(r->lfd, (struct sockaddr *)&un, len) || listen(r->lfd, 4)) {
		rc = -errno;
		goto fail;
	}
	rc = -pthread_create(&r->thread, NULL, relay_main, r);
	if (rc)
		goto fail;
	pthread_setname_np(r->thread, "mp-memif-relay");
	pthread_detach(r->thread);
	MP_INFO("dpdk: memif relay: %s %s%s, our memif on @%s", r->client ? "dialling" : "listening on",
		r->abstract ? "@" : "", r->pub, r->priv);
	return 1;
fail:
	if (r->lfd >= 0)
		close(r->lfd);
	free(r);
	snprintf(out, cap, "%s", vdev);
	return rc;
}
