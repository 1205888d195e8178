/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Internet addresses of the socket-based transports (tcp, and the side
 * channel of verbs and ofi): "host:port" or "[v6]:port" text, and the
 * driver address blob they share (struct mp_inet_addr).
 */
#ifndef MP_INET_H
#define MP_INET_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

/* The blob: family 4 or 6, a zero byte, the port big-endian, then 4 or 16
 * bytes of address (the blob's length says which). */
struct mp_inet_addr {
	uint8_t family;   /* 4 or 6 */
	uint8_t reserved; /* zero */
	uint8_t port[2];  /* big-endian */
	uint8_t ip[16];   /* 4 bytes used for IPv4 */
};
#define MP_INET_ADDR_LEN4 (offsetof(struct mp_inet_addr, ip) + 4)
#define MP_INET_ADDR_LEN6 (offsetof(struct mp_inet_addr, ip) + 16)
_Static_assert(sizeof(struct mp_inet_addr) == 20, "mp_inet_addr must stay packed");

/* Text to a socket address; @passive lets an empty or "*" host mean any.
 * -EINVAL when malformed or unknown, -EAGAIN when the resolver is busy. */
int mp_inet_resolve(const char *text, int passive, struct sockaddr_storage *ss, socklen_t *sl);
/* Socket address to blob (a v4-mapped IPv6 address becomes IPv4);
 * -EAFNOSUPPORT for another family, -EINVAL for a scoped IPv6 address. */
int mp_inet_to_blob(const struct sockaddr *sa, struct mp_inet_addr *a, size_t *len);
/* Blob to socket address; -EINVAL when malformed. */
int mp_inet_from_blob(const void *blob, size_t len, struct sockaddr_storage *ss, socklen_t *sl);
/* Socket address to text; -ENOSPC if @cap is too small. */
int mp_inet_format(const struct sockaddr *sa, char *text, size_t cap);
/* The same, for logs: "?" when it cannot be formatted. */
void mp_inet_name(const struct sockaddr *sa, char *name, size_t cap);

/* A non-blocking listening socket on @bind_text ("host:port", port 0 for
 * any): SO_REUSEADDR, then @tune (may be NULL; options accepted sockets
 * inherit), bind, listen(@backlog). *@fd gets it, @a and *@alen the bound
 * address as a blob, @name (@cap bytes) the same as text. 0, or a negative
 * errno with nothing left open. */
int mp_inet_listen(const char *bind_text, int backlog, void (*tune)(void *arg, int fd),
		   void *arg, int *fd, struct mp_inet_addr *a, size_t *alen, char *name,
		   size_t cap);

/* The driver ops addr_parse and addr_format of these transports (the
 * instance is not needed: the blob is the same for all). */
struct mp_drv;
int mp_inet_addr_parse(struct mp_drv *d, const char *text, void *blob, size_t *len);
int mp_inet_addr_format(struct mp_drv *d, const void *blob, size_t len, char *text, size_t cap);

/* Move all @len bytes over the non-blocking socket @fd (send with @out,
 * else receive) by @deadline (mp_now_ms clock): 0, -ETIMEDOUT,
 * -ECONNRESET (the other side closed), or a socket error. */
int mp_inet_xfer(int fd, void *buf, size_t len, uint64_t deadline, int out);

/* A connected non-blocking TCP socket (TCP_NODELAY) to "host:port" @addr
 * by @deadline (mp_now_ms clock) into *@out, or a negative errno. */
int mp_inet_dial(const char *addr, uint64_t deadline, int *out);

#endif
