/* SPDX-License-Identifier: BSD-3-Clause */
/* Internet addresses of the socket-based transports (inet.h). */
#include "inet.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <moshpit/sdk/clock.h>
#include "log.h"

/* Split "host:port" or "[v6]:port"; an empty host comes back as "". */
static int inet_split(const char *text, char *host, size_t hcap, unsigned *port)
{
	const char *h, *hend, *p;
	unsigned long v = 0;
	size_t len;

	if (!text)
		return -EINVAL;
	if (text[0] == '[') {
		h = text + 1;
		hend = strchr(h, ']');
		if (!hend || hend[1] != ':')
			return -EINVAL;
		p = hend + 2;
	} else {
		hend = strrchr(text, ':');
		/* A bare IPv6 literal is ambiguous ("::1:80"): brackets required. */
		if (!hend || memchr(text, ':', (size_t)(hend - text)))
			return -EINVAL;
		h = text;
		p = hend + 1;
	}
	len = (size_t)(hend - h);
	if (len >= hcap)
		return -EINVAL;
	if (!*p || strlen(p) > 5)
		return -EINVAL;
	for (const char *q = p; *q; q++) {
		if (*q < '0' || *q > '9')
			return -EINVAL;
		v = v * 10 + (unsigned long)(*q - '0');
	}
	if (v > 65535)
		return -EINVAL;
	memcpy(host, h, len);
	host[len] = '\0';
	*port = (unsigned)v;
	return 0;
}

/* Resolve text to a socket address; @passive lets an empty or "*" host mean any. */
int mp_inet_resolve(const char *text, int passive, struct sockaddr_storage *ss, socklen_t *sl)
{
	struct addrinfo hints, *res = NULL, *ai;
	char host[256], serv[8];
	unsigned port;
	int rc;

	rc = inet_split(text, host, sizeof(host), &port);
	if (rc)
		return rc;
	memset(ss, 0, sizeof(*ss));
	if (!host[0] || !strcmp(host, "*")) {
		struct sockaddr_in *sin = (struct sockaddr_in *)ss;

		if (!passive)
			return -EINVAL;
		sin->sin_family = AF_INET;
		sin->sin_port = htons((uint16_t)port);
		sin->sin_addr.s_addr = htonl(INADDR_ANY);
		*sl = sizeof(*sin);
		return 0;
	}
	snprintf(serv, sizeof(serv), "%u", port);
	memset(&hints, 0, sizeof(hints));
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	hints.ai_flags = AI_NUMERICSERV;
	rc = getaddrinfo(host, serv, &hints, &res);
	if (rc) {
		MP_INFO("cannot resolve '%s': %s", host, gai_strerror(rc));
		switch (rc) {
		case EAI_AGAIN:
			return -EAGAIN;
		case EAI_MEMORY:
			return -ENOMEM;
		case EAI_SYSTEM:
			return errno ? -errno : -EINVAL;
		default:
			return -EINVAL;
		}
	}
	rc = -EINVAL;
	for (ai = res; ai; ai = ai->ai_next) {
		if (ai->ai_family != AF_INET && ai->ai_family != AF_INET6)
			continue;
		if (ai->ai_addrlen > sizeof(*ss))
			continue;
		memcpy(ss, ai->ai_addr, ai->ai_addrlen);
		*sl = ai->ai_addrlen;
		rc = 0;
		break;
	}
	freeaddrinfo(res);
	return rc;
}

int mp_inet_to_blob(const struct sockaddr *sa, struct mp_inet_addr *a, size_t *len)
{
	memset(a, 0, sizeof(*a));
	if (sa->sa_family == AF_INET) {
		const struct sockaddr_in *sin = (const struct sockaddr_in *)sa;

		a->family = 4;
		memcpy(a->port, &sin->sin_port, 2);
		memcpy(a->ip, &sin->sin_addr, 4);
		*len = MP_INET_ADDR_LEN4;
		return 0;
	}
	if (sa->sa_family == AF_INET6) {
		const struct sockaddr_in6 *sin6 = (const struct sockaddr_in6 *)sa;

		memcpy(a->port, &sin6->sin6_port, 2);
		if (IN6_IS_ADDR_V4MAPPED(&sin6->sin6_addr)) {
			a->family = 4;
			memcpy(a->ip, &sin6->sin6_addr.s6_addr[12], 4);
			*len = MP_INET_ADDR_LEN4;
			return 0;
		}
		/* The scope id names a local interface: meaningless on another host. */
		if (sin6->sin6_scope_id) {
			MP_INFO("scoped (link-local) IPv6 addresses are not supported");
			return -EINVAL;
		}
		a->family = 6;
		memcpy(a->ip, &sin6->sin6_addr, 16);
		*len = MP_INET_ADDR_LEN6;
		return 0;
	}
	return -EAFNOSUPPORT;
}

int mp_inet_from_blob(const void *blob, size_t len, struct sockaddr_storage *ss, socklen_t *sl)
{
	struct mp_inet_addr a;

	if (!blob || len < MP_INET_ADDR_LEN4 || len > sizeof(a))
		return -EINVAL;
	memset(&a, 0, sizeof(a));
	memcpy(&a, blob, len);
	if (a.reserved)
		return -EINVAL;
	memset(ss, 0, sizeof(*ss));
	if (a.family == 4 && len == MP_INET_ADDR_LEN4) {
		struct sockaddr_in *sin = (struct sockaddr_in *)ss;

		sin->sin_family = AF_INET;
		memcpy(&sin->sin_port, a.port, 2);
		memcpy(&sin->sin_addr, a.ip, 4);
		*sl = sizeof(*sin);
		return 0;
	}
	if (a.family == 6 && len == MP_INET_ADDR_LEN6) {
		struct sockaddr_in6 *sin6 = (struct sockaddr_in6 *)ss;

		sin6->sin6_family = AF_INET6;
		memcpy(&sin6->sin6_port, a.port, 2);
		memcpy(&sin6->sin6_addr, a.ip, 16);
		*sl = sizeof(*sin6);
		return 0;
	}
	return -EINVAL;
}

int mp_inet_format(const struct sockaddr *sa, char *text, size_t cap)
{
	char ip[INET6_ADDRSTRLEN];
	int n;

	if (sa->sa_family == AF_INET) {
		const struct sockaddr_in *sin = (const struct sockaddr_in *)sa;

		if (!inet_ntop(AF_INET, &sin->sin_addr, ip, sizeof(ip)))
			return -EINVAL;
		n = snprintf(text, cap, "%s:%u", ip, (unsigned)ntohs(sin->sin_port));
	} else if (sa->sa_family == AF_INET6) {
		const struct sockaddr_in6 *sin6 = (const struct sockaddr_in6 *)sa;

		if (!inet_ntop(AF_INET6, &sin6->sin6_addr, ip, sizeof(ip)))
			return -EINVAL;
		n = snprintf(text, cap, "[%s]:%u", ip, (unsigned)ntohs(sin6->sin6_port));
	} else {
		return -EAFNOSUPPORT;
	}
	if (n < 0 || (size_t)n >= cap)
		return -ENOSPC;
	return 0;
}

/* Best-effort text for logs. */
void mp_inet_name(const struct sockaddr *sa, char *name, size_t cap)
{
	if (mp_inet_format(sa, name, cap))
		snprintf(name, cap, "?");
}

int mp_inet_addr_parse(struct mp_drv *d, const char *text, void *blob, size_t *len)
{
	struct sockaddr_storage ss;
	struct mp_inet_addr a;
	socklen_t sl;
	size_t n;
	int rc;

	(void)d;
	if (!blob || !len)
		return -EINVAL;
	rc = mp_inet_resolve(text, 0, &ss, &sl);
	if (rc)
		return rc;
	rc = mp_inet_to_blob((struct sockaddr *)&ss, &a, &n);
	if (rc)
		return rc == -EAFNOSUPPORT ? -EINVAL : rc;
	memcpy(blob, &a, n);
	*len = n;
	return 0;
}

int mp_inet_addr_format(struct mp_drv *d, const void *blob, size_t len, char *text, size_t cap)
{
	struct sockaddr_storage ss;
	socklen_t sl;
	int rc;

	(void)d;
	if (!text)
		return -EINVAL;
	rc = mp_inet_from_blob(blob, len, &ss, &sl);
	if (rc)
		return rc;
	return mp_inet_format((struct sockaddr *)&ss, text, cap);
}

int mp_inet_listen(const char *bind_text, int backlog, void (*tune)(void *arg, int fd),
		   void *arg, int *fd, struct mp_inet_addr *a, size_t *alen, char *name,
		   size_t cap)
{
	struct sockaddr_storage ss;
	socklen_t sl;
	int one = 1, s, rc = mp_inet_resolve(bind_text, 1, &ss, &sl);

	if (rc)
		return rc;
	s = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (s < 0)
		return -errno;
	/* Restarted peers must be able to rebind while old sockets sit in TIME_WAIT. */
	if (setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) < 0)
		MP_TRACE("SO_REUSEADDR: %s", strerror(errno));
	if (tune)
		tune(arg, s);
	if (bind(s, (struct sockaddr *)&ss, sl) < 0 || listen(s, backlog) < 0)
		goto fail;
	sl = sizeof(ss);
	if (getsockname(s, (struct sockaddr *)&ss, &sl) < 0)
		goto fail;
	rc = mp_inet_to_blob((struct sockaddr *)&ss, a, alen);
	if (rc) {
		close(s);
		return rc;
	}
	mp_inet_name((struct sockaddr *)&ss, name, cap);
	*fd = s;
	return 0;
fail:
	rc = -errno;
	close(s);
	return rc;
}

int mp_inet_xfer(int fd, void *buf, size_t len, uint64_t deadline, int out)
{
	uint8_t *p = buf;

	while (len) {
		ssize_t n = out ? send(fd, p, len, MSG_NOSIGNAL) : recv(fd, p, len, 0);
		uint64_t now;
		struct pollfd pfd = {.fd = fd, .events = out ? POLLOUT : POLLIN};

		if (n > 0) {
			p += n;
			len -= (size_t)n;
			continue;
		}
		if (n == 0)
			return -ECONNRESET;
		if (errno == EINTR)
			continue;
		if (errno != EAGAIN && errno != EWOULDBLOCK)
			return -errno;
		now = mp_now_ms();
		if (now >= deadline)
			return -ETIMEDOUT;
		if (poll(&pfd, 1, (int)(deadline - now)) < 0 && errno != EINTR)
			return -errno;
	}
	return 0;
}

int mp_inet_dial(const char *addr, uint64_t deadline, int *out)
{
	struct sockaddr_storage ss;
	socklen_t sl;
	int fd, rc, one = 1;

	if ((rc = mp_inet_resolve(addr, 0, &ss, &sl)))
		return rc;
	fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	if (connect(fd, (struct sockaddr *)&ss, sl) && errno != EINPROGRESS) {
		rc = -errno;
		close(fd);
		return rc;
	}
	for (;;) {
		struct pollfd pfd = {.fd = fd, .events = POLLOUT};
		uint64_t now = mp_now_ms();
		int err = 0;
		socklen_t el = sizeof(err);

		if (now >= deadline) {
			close(fd);
			return -ETIMEDOUT;
		}
		if (poll(&pfd, 1, (int)(deadline - now)) <= 0)
			continue;
		if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) || err) {
			close(fd);
			return err ? -err : -EIO;
		}
		*out = fd;
		return 0;
	}
}
