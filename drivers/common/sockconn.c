/* SPDX-License-Identifier: BSD-3-Clause */
/* Sockets under one epoll set, for the socket-driven transports (sockconn.h). */
/* accept4, also when the build does not ask for it. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif
#include "sockconn.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>
#include <moshpit/sdk/log.h>

#include "inet.h"

int mp_sock_poll_open(struct mp_sock_poll *p, const char *tname)
{
	struct epoll_event ev;
	int rc;

	p->tname = tname;
	p->listeners = NULL;
	p->conns = NULL;
	p->wake.kind = MP_SOCK_WAKE;
	p->wakefd = -1;
	p->epfd = epoll_create1(EPOLL_CLOEXEC);
	if (p->epfd < 0)
		return -errno;
	p->wakefd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (p->wakefd < 0)
		goto fail;
	memset(&ev, 0, sizeof(ev));
	ev.events = EPOLLIN;
	ev.data.ptr = &p->wake;
	if (epoll_ctl(p->epfd, EPOLL_CTL_ADD, p->wakefd, &ev) < 0)
		goto fail;
	return 0;
fail:
	rc = -errno;
	mp_sock_poll_close(p);
	return rc;
}

static void sock_link(struct mp_sock_link **head, struct mp_sock_link *n)
{
	n->prev = NULL;
	n->next = *head;
	if (*head)
		(*head)->prev = n;
	*head = n;
}

static void sock_unlink(struct mp_sock_link **head, struct mp_sock_link *n)
{
	if (n->prev)
		n->prev->next = n->next;
	else
		*head = n->next;
	if (n->next)
		n->next->prev = n->prev;
	n->prev = n->next = NULL;
}

void mp_sock_poll_close(struct mp_sock_poll *p)
{
	if (p->wakefd >= 0)
		close(p->wakefd);
	if (p->epfd >= 0)
		close(p->epfd);
	p->wakefd = p->epfd = -1;
}

void mp_sock_wake(struct mp_sock_poll *p)
{
	uint64_t one = 1;
	ssize_t rc;

	/* Only a counter bump: safe against a concurrent progress(). */
	rc = write(p->wakefd, &one, sizeof(one));
	(void)rc; /* EAGAIN: the counter is saturated, a wake is pending anyway */
}

void mp_sock_wake_ack(struct mp_sock_poll *p)
{
	uint64_t v;
	ssize_t rc = read(p->wakefd, &v, sizeof(v));

	(void)rc; /* EAGAIN: someone else drained it; fine */
}

/* Small messages (frame headers, handshakes) must not wait behind Nagle. */
static void sock_nodelay(struct mp_sock_poll *p, int fd)
{
	int one = 1;

	if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) < 0)
		MP_TRACE("%s: TCP_NODELAY: %s", p->tname, strerror(errno));
}

int mp_sock_listen(struct mp_sock_poll *p, const char *bind_text, int backlog,
		   void (*tune)(void *arg, int fd), void *arg, struct mp_sock_listener *l,
		   void *blob, size_t *len)
{
	struct epoll_event ev;
	struct mp_inet_addr a;
	size_t alen;
	int rc;

	l->ep.kind = MP_SOCK_LISTENER;
	rc = mp_inet_listen(bind_text, backlog, tune, arg, &l->fd, &a, &alen, l->name,
			    sizeof(l->name));
	if (rc)
		goto fail;
	/*
	 * Edge-triggered: a new arrival ends a progress() wait once, but a
	 * backlog the core does not accept yet cannot make it spin.
	 */
	memset(&ev, 0, sizeof(ev));
	ev.events = EPOLLIN | EPOLLET;
	ev.data.ptr = &l->ep;
	if (epoll_ctl(p->epfd, EPOLL_CTL_ADD, l->fd, &ev) < 0) {
		rc = -errno;
		close(l->fd);
		goto fail;
	}
	if (blob)
		memcpy(blob, &a, alen);
	if (len)
		*len = alen;
	sock_link(&p->listeners, &l->link);
	return 0;
fail:
	MP_WARN("%s: cannot listen on %s: %s", p->tname, bind_text, strerror(-rc));
	return rc;
}

int mp_sock_accept(struct mp_sock_poll *p, struct mp_sock_listener *l, int *fd,
		   struct sockaddr_storage *peer)
{
	socklen_t sl;
	int s, rc;

	for (;;) {
		sl = sizeof(*peer);
		s = accept4(l->fd, (struct sockaddr *)peer, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (s >= 0)
			break;
		switch (errno) {
		case EAGAIN:
#if EWOULDBLOCK != EAGAIN
		case EWOULDBLOCK:
#endif
			return -EAGAIN;
		/* The connection died in the backlog (see accept(2)): take the next. */
		case EINTR:
		case ECONNABORTED:
		case EPROTO:
		case ENETDOWN:
		case ENOPROTOOPT:
		case EHOSTDOWN:
		case ENONET:
		case EHOSTUNREACH:
		case ENETUNREACH:
			continue;
		default:
			rc = -errno;
			MP_WARN("%s: accept on %s: %s", p->tname, l->name, strerror(-rc));
			return rc;
		}
	}
	/* Buffer sizes come from the listener; NODELAY is not inherited everywhere. */
	sock_nodelay(p, s);
	*fd = s;
	return 0;
}

void mp_sock_unlisten(struct mp_sock_poll *p, struct mp_sock_listener *l)
{
	epoll_ctl(p->epfd, EPOLL_CTL_DEL, l->fd, NULL);
	close(l->fd);
	l->fd = -1;
	sock_unlink(&p->listeners, &l->link);
}

int mp_sock_open(struct mp_sock_poll *p, const void *blob, size_t len,
		 void (*tune)(void *arg, int fd), void *arg, struct sockaddr_storage *ss,
		 socklen_t *sl)
{
	int fd, rc = mp_inet_from_blob(blob, len, ss, sl);

	if (rc)
		return rc;
	fd = socket(ss->ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		rc = -errno;
		MP_WARN("%s: socket: %s", p->tname, strerror(-rc));
		return rc;
	}
	sock_nodelay(p, fd);
	if (tune)
		tune(arg, fd);
	return fd;
}

int mp_sock_add(struct mp_sock_poll *p, struct mp_sock_conn *s, int fd, uint32_t events,
		const struct sockaddr *peer)
{
	struct epoll_event ev;
	int rc;

	s->ep.kind = MP_SOCK_CONN;
	mp_inet_name(peer, s->name, sizeof(s->name));
	memset(&ev, 0, sizeof(ev));
	ev.events = events;
	ev.data.ptr = &s->ep;
	if (epoll_ctl(p->epfd, EPOLL_CTL_ADD, fd, &ev) < 0) {
		rc = -errno;
		MP_WARN("%s: epoll_ctl: %s", p->tname, strerror(-rc));
		s->fd = -1;
		return rc;
	}
	s->fd = fd;
	s->events = events;
	sock_link(&p->conns, &s->link);
	return 0;
}

int mp_sock_connect(struct mp_sock_poll *p, struct mp_sock_conn *s, const struct sockaddr *sa,
		    socklen_t sl)
{
	int e;

	if (connect(s->fd, sa, sl) == 0)
		return 1;
	/* EINTR: the connection still completes asynchronously. */
	if (errno == EINPROGRESS || errno == EINTR)
		return 0;
	e = errno == EAGAIN ? EADDRNOTAVAIL : errno; /* out of local ports */
	MP_INFO("%s: connect to %s: %s", p->tname, s->name, strerror(e));
	return -e;
}

int mp_sock_connected(struct mp_sock_poll *p, struct mp_sock_conn *s, uint32_t ev)
{
	int e;

	if (!(ev & (EPOLLOUT | EPOLLERR | EPOLLHUP)))
		return 0;
	e = mp_sock_error(s->fd);
	if (e || (ev & (EPOLLERR | EPOLLHUP))) {
		MP_INFO("%s: connect to %s: %s", p->tname, s->name, strerror(e ? e : ECONNREFUSED));
		return e ? -e : -ECONNREFUSED;
	}
	return 1;
}

int mp_sock_error(int fd)
{
	int e = 0;
	socklen_t sl = sizeof(e);

	if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &sl) < 0)
		return errno;
	return e;
}

int mp_sock_arm(struct mp_sock_poll *p, struct mp_sock_conn *s, uint32_t want)
{
	struct epoll_event ev;
	int rc;

	if (s->fd < 0 || want == s->events)
		return 0;
	memset(&ev, 0, sizeof(ev));
	ev.events = want;
	ev.data.ptr = &s->ep;
	if (epoll_ctl(p->epfd, EPOLL_CTL_MOD, s->fd, &ev) < 0) {
		rc = -errno;
		MP_WARN("%s: %s: epoll_ctl: %s", p->tname, s->name, strerror(-rc));
		return rc;
	}
	s->events = want;
	return 0;
}

void mp_sock_close(struct mp_sock_poll *p, struct mp_sock_conn *s)
{
	if (s->fd < 0)
		return;
	epoll_ctl(p->epfd, EPOLL_CTL_DEL, s->fd, NULL);
	close(s->fd);
	s->fd = -1;
	s->events = 0;
}

void mp_sock_remove(struct mp_sock_poll *p, struct mp_sock_conn *s)
{
	mp_sock_close(p, s);
	sock_unlink(&p->conns, &s->link);
}
