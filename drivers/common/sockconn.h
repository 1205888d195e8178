/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Sockets under one epoll set, as the socket-driven transports use them: the
 * tcp driver's connections and the TCP side channel of the rdma protocol
 * (verbs, ofi). Written once so that both set up, watch and tear down their
 * sockets the same way: non-blocking, close-on-exec, TCP_NODELAY, listeners
 * edge-triggered, connects completed through EPOLLOUT.
 *
 * Every registration's epoll data points at a struct mp_sock_ep, whose kind
 * tells the driver's progress() what an event is for; the driver embeds the
 * structs below in its own objects and gets back to those with
 * container_of. The poll also keeps the instance's listeners and
 * connections in lists (the drivers walk them for deadlines and lookups,
 * fini closes what is left), so that no driver keeps lists of its own.
 * Logs start with the transport's name, as the driver's own did.
 *
 * Errors are negative errnos; what the helpers log is said with each.
 */
#ifndef MP_SOCKCONN_H
#define MP_SOCKCONN_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#define MP_SOCK_NAME_MAX 64 /* "[v6]:port" for logs */

/* What an epoll event's data.ptr points at. */
enum mp_sock_kind {
	MP_SOCK_WAKE,
	MP_SOCK_LISTENER,
	MP_SOCK_CONN,
};

struct mp_sock_ep {
	enum mp_sock_kind kind;
};

/* A place in one of the poll's lists; NULL ends a list. */
struct mp_sock_link {
	struct mp_sock_link *prev, *next;
};

/* A listening socket and its bound address as text. */
struct mp_sock_listener {
	struct mp_sock_ep ep;
	int fd;
	struct mp_sock_link link;
	char name[MP_SOCK_NAME_MAX];
};

/*
 * A connection: its socket (-1 once closed) and its place in the poll's
 * list, which it keeps from mp_sock_add to mp_sock_remove, socket or not.
 */
struct mp_sock_conn {
	struct mp_sock_ep ep;
	int fd;
	uint32_t events; /* epoll interest currently registered */
	struct mp_sock_link link;
	char name[MP_SOCK_NAME_MAX]; /* the peer, for logs */
};

/* The epoll set of a driver instance, the eventfd wake() bumps, and what is under it. */
struct mp_sock_poll {
	int epfd;
	int wakefd;
	struct mp_sock_ep wake;
	const char *tname; /* transport name, first in every log line */
	struct mp_sock_link *listeners; /* newest first */
	struct mp_sock_link *conns;     /* newest first */
};

/*
 * Create the epoll set with the eventfd in it (level-triggered: a pending
 * wake ends every wait until mp_sock_wake_ack), and empty lists. @tname
 * must outlive @p. 0, or a negative errno with nothing left open (not
 * logged).
 */
int mp_sock_poll_open(struct mp_sock_poll *p, const char *tname);
/* Close both descriptors; the listeners and connections must be gone already. */
void mp_sock_poll_close(struct mp_sock_poll *p);
/* Make a wait end; safe from any thread, concurrently with the rest. */
void mp_sock_wake(struct mp_sock_poll *p);
/* The wake's event came: reset the counter. */
void mp_sock_wake_ack(struct mp_sock_poll *p);

/*
 * Listen on @bind_text through mp_inet_listen (@backlog, @tune and @arg as
 * there), register the socket edge-triggered and put @l on the list. @blob
 * (may be NULL) gets the bound address, *@len (may be NULL) its length. On
 * failure logs "cannot listen on" and leaves nothing open.
 */
int mp_sock_listen(struct mp_sock_poll *p, const char *bind_text, int backlog,
		   void (*tune)(void *arg, int fd), void *arg, struct mp_sock_listener *l,
		   void *blob, size_t *len);
/*
 * Take the next arrived connection: *@fd gets its socket (non-blocking,
 * TCP_NODELAY), @peer its address. -EAGAIN when none waits; another
 * negative errno is logged.
 */
int mp_sock_accept(struct mp_sock_poll *p, struct mp_sock_listener *l, int *fd,
		   struct sockaddr_storage *peer);
/* Unregister and close the listening socket; @l leaves the list. */
void mp_sock_unlisten(struct mp_sock_poll *p, struct mp_sock_listener *l);

/*
 * A socket (TCP_NODELAY, then @tune when not NULL) for connecting to the
 * address blob @blob (inet.h); @ss and *@sl get the address. The socket,
 * or a negative errno (-EINVAL for a bad blob; a failing socket() is
 * logged).
 */
int mp_sock_open(struct mp_sock_poll *p, const void *blob, size_t len,
		 void (*tune)(void *arg, int fd), void *arg, struct sockaddr_storage *ss,
		 socklen_t *sl);
/*
 * Register @fd, a connection to @peer, with interest @events (0 still sees
 * errors and hang-ups), take it into @s and put @s on the list. On failure
 * logs the epoll_ctl error, and @fd stays the caller's.
 */
int mp_sock_add(struct mp_sock_poll *p, struct mp_sock_conn *s, int fd, uint32_t events,
		const struct sockaddr *peer);
/*
 * Start connecting @s to @sa: 1 when connected at once, 0 when it goes on
 * in the background (EPOLLOUT ends it, see mp_sock_connected), or a
 * negative errno, logged.
 */
int mp_sock_connect(struct mp_sock_poll *p, struct mp_sock_conn *s, const struct sockaddr *sa,
		    socklen_t sl);
/*
 * The outcome of a background connect, given the events @ev of @s: 0 while
 * they do not end it, 1 when connected, or a negative errno, logged.
 */
int mp_sock_connected(struct mp_sock_poll *p, struct mp_sock_conn *s, uint32_t ev);
/* The socket's pending error (SO_ERROR), a positive errno or 0. */
int mp_sock_error(int fd);
/*
 * Set @s's epoll interest to @want; nothing to do when it is already that
 * or the socket is closed. A failure is logged; the caller fails @s.
 */
int mp_sock_arm(struct mp_sock_poll *p, struct mp_sock_conn *s, uint32_t want);
/* Unregister and close @s's socket, if still open; @s stays on the list. */
void mp_sock_close(struct mp_sock_poll *p, struct mp_sock_conn *s);
/* mp_sock_close, and @s leaves the list. */
void mp_sock_remove(struct mp_sock_poll *p, struct mp_sock_conn *s);

#endif
