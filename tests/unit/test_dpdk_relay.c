/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The memif control relay (drivers/dpdk/relay.c), without DPDK: this test
 * plays both memifs on abstract sockets. Checked: the devargs are parsed
 * and rewritten (socket= to the relay's private name, the rest kept);
 * messages and the descriptors they carry pass both ways; and the point of
 * it all, the driver's hook runs BEFORE our memif can see the peer's end,
 * both when the peer's socket closes (a SIGKILLed peer: said=false) and
 * when it sends DISCONNECT (said=true): inside the hook our end has nothing
 * to read yet, after it our end reads the DISCONNECT, or end of file.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cmocka.h>

#include "drivers/dpdk/relay.h"

static socklen_t addr(struct sockaddr_un *un, const char *name)
{
	memset(un, 0, sizeof(*un));
	un->sun_family = AF_UNIX;
	memcpy(un->sun_path + 1, name, strlen(name));
	return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + strlen(name));
}

static int listen_on(const char *name)
{
	struct sockaddr_un un;
	socklen_t len = addr(&un, name);
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);

	assert_true(fd >= 0);
	assert_int_equal(bind(fd, (struct sockaddr *)&un, len), 0);
	assert_int_equal(listen(fd, 4), 0);
	return fd;
}

static int dial(const char *name)
{
	struct sockaddr_un un;
	socklen_t len = addr(&un, name);
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);

	assert_true(fd >= 0);
	assert_int_equal(connect(fd, (struct sockaddr *)&un, len), 0);
	return fd;
}

/* What the hook saw: calls before and after, the last @said, whether our end could read then. */
static struct {
	_Atomic int calls, dones;
	bool said;
	int mine;          /* our memif's end, polled inside the hook */
	bool mine_readable, mine_readable_done;
} hook;

static void gone(void *arg, bool said, bool done)
{
	struct pollfd p = {.fd = hook.mine, .events = POLLIN};

	(void)arg;
	if (done) {
		/* paired with a call before it, and by now our memif can hear */
		assert_int_equal(hook.dones + 1, hook.calls);
		assert_int_equal(said, hook.said);
		hook.dones++;
		hook.mine_readable_done = poll(&p, 1, 0) > 0;
		return;
	}
	hook.calls++;
	hook.said = said;
	/* Give a relay that passed the end on first the time to show it. */
	usleep(50000);
	hook.mine_readable = poll(&p, 1, 0) > 0;
}

/* A 128-byte memif message of @type, with descriptor @fd (or none). */
static void send_msg(int s, uint16_t type, int fd)
{
	uint8_t m[128] = {(uint8_t)type, (uint8_t)(type >> 8)};
	union {
		char b[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} ctl;
	struct iovec iov = {m, sizeof(m)};
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};

	if (fd >= 0) {
		memset(&ctl, 0, sizeof(ctl));
		mh.msg_control = ctl.b;
		mh.msg_controllen = sizeof(ctl.b);
		struct cmsghdr *c = CMSG_FIRSTHDR(&mh);

		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(c), &fd, sizeof(int));
	}
	assert_int_equal(sendmsg(s, &mh, 0), (ssize_t)sizeof(m));
}

/* Receive a message on @s: its type, or -1 at end of file; *fd the descriptor it carried. */
static int recv_msg(int s, int *fd)
{
	uint8_t m[256];
	union {
		char b[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} ctl;
	struct iovec iov = {m, sizeof(m)};
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.b,
			    .msg_controllen = sizeof(ctl.b)};
	struct pollfd p = {.fd = s, .events = POLLIN};
	ssize_t n;

	*fd = -1;
	assert_int_equal(poll(&p, 1, 2000), 1);
	n = recvmsg(s, &mh, MSG_CMSG_CLOEXEC);
	if (n <= 0)
		return -1;
	assert_int_equal(n, 128);
	for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c))
		if (c->cmsg_type == SCM_RIGHTS)
			memcpy(fd, CMSG_DATA(c), sizeof(int));
	return m[0] | m[1] << 8;
}

static void test_devargs(void **state)
{
	bool client, abstract;
	char sock[108];

	(void)state;
	assert_int_equal(mp_memif_devargs_parse("net_memif0,role=client,id=0,socket=/a.sock,"
						"bsize=9088", &client, sock, sizeof(sock), &abstract), 0);
	assert_true(client);
	assert_true(abstract);
	assert_string_equal(sock, "/a.sock");
	assert_int_equal(mp_memif_devargs_parse("net_memif1", &client, sock, sizeof(sock),
						&abstract), 0);
	assert_false(client);
	assert_string_equal(sock, "/run/memif.sock");
	assert_int_equal(mp_memif_devargs_parse("net_memif0,socket-abstract=no,role=server",
						&client, sock, sizeof(sock), &abstract), 0);
	assert_false(abstract);
	assert_false(client);
	assert_int_equal(mp_memif_devargs_parse("net_af_packet0,iface=x", &client, sock,
						sizeof(sock), &abstract), -EINVAL);
}

/* A client relay between "our memif" (this test) and a "peer" server (this test too). */
static void test_relay(void **state)
{
	char pub[64], vdev[160], out[512], priv[108];
	bool client, abstract;
	int lis, mine, theirs, fd, p[2];

	(void)state;
	snprintf(pub, sizeof(pub), "mpt-relay-%ld", (long)getpid());
	lis = listen_on(pub);
	snprintf(vdev, sizeof(vdev), "net_memif0,role=client,id=3,socket=%s,bsize=9088,"
		 "socket-abstract=yes", pub);
	assert_int_equal(mp_memif_relay_start(vdev, out, sizeof(out), gone, NULL), 1);
	/* memif gets the private name, everything else as it was */
	assert_non_null(strstr(out, "net_memif0,role=client,id=3,bsize=9088,socket=mp-memif-relay."));
	assert_null(strstr(out, pub));
	assert_int_equal(mp_memif_devargs_parse(out, &client, priv, sizeof(priv), &abstract), 0);
	assert_true(client && abstract);
	/* not memif: copied, no relay */
	assert_int_equal(mp_memif_relay_start("net_af_packet0,iface=x", out, sizeof(out), gone,
					      NULL), 0);
	assert_string_equal(out, "net_af_packet0,iface=x");

	for (int round = 0; round < 2; round++) {
		bool disconnect = round == 1;

		/* our memif dials the relay, which dials the peer */
		mine = dial(priv);
		theirs = accept(lis, NULL, NULL);
		assert_true(theirs >= 0);
		hook.mine = mine;
		hook.calls = hook.dones = 0;
		/* both ways, a descriptor along (memif's regions and eventfds travel so) */
		assert_int_equal(pipe(p), 0);
		send_msg(theirs, 2 /* HELLO */, p[1]);
		assert_int_equal(recv_msg(mine, &fd), 2);
		assert_true(fd >= 0);
		assert_int_equal(write(fd, "x", 1), 1);
		char c = 0;

		assert_int_equal(read(p[0], &c, 1), 1);
		assert_int_equal(c, 'x');
		close(fd);
		close(p[0]);
		close(p[1]);
		send_msg(mine, 3 /* INIT */, -1);
		assert_int_equal(recv_msg(theirs, &fd), 3);
		assert_int_equal(fd, -1);
		assert_int_equal(hook.calls, 0);

		/* the peer's end: the hook first, with nothing for our memif to read yet */
		if (disconnect)
			send_msg(theirs, 8 /* DISCONNECT */, -1);
		close(theirs);
		/* Read our end only after the hook's second call: it polls our
		 * end for the DISCONNECT the relay just passed, which a read
		 * racing with it would take first (seen under ASan). */
		for (int k = 0; k < 2000 && hook.dones < 1; k++)
			usleep(1000);
		assert_int_equal(hook.calls, 1);
		assert_int_equal(hook.dones, 1);
		int got = recv_msg(mine, &fd);

		assert_int_equal(hook.said, disconnect);
		assert_false(hook.mine_readable);
		assert_true(hook.mine_readable_done);
		assert_int_equal(got, disconnect ? 8 : -1);
		if (disconnect)
			assert_int_equal(recv_msg(mine, &fd), -1);
		close(mine);
	}

	/* our memif's own end (its port stopped): the peer sees it, the hook does not run */
	mine = dial(priv);
	theirs = accept(lis, NULL, NULL);
	assert_true(theirs >= 0);
	hook.calls = hook.dones = 0;
	close(mine);
	assert_int_equal(recv_msg(theirs, &fd), -1);
	assert_int_equal(hook.calls, 0);
	close(theirs);
	close(lis);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_devargs),
		cmocka_unit_test(test_relay),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
