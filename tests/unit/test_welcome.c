/* SPDX-License-Identifier: BSD-3-Clause */
/* The welcome exchange (welcome.c) on loopback: a real service, fake
 * services written here, and askers that hold the wrong key or stall. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "auth.h"
#include "welcome.h"
#include "wire.h"

#define RUN "run"
#define ASK_MS 2000
#define PAYLOAD_LEN 1000
#define GIFT_LEN 100
/* The exchange's sizes (welcome.c): what a fake service sends and reads. */
#define HELLO_LEN 21
#define ASK_LEN 50

static struct mp_auth auth, other;
static uint64_t run_id;

/* What the service's fill callback saw. */
struct seen {
	int calls; /* atomic */
	uint8_t gift[MP_WELCOME_GIVE_MAX];
	size_t gift_len;
};

static uint8_t payload_byte(size_t i)
{
	return (uint8_t)(i * 7 + 3);
}

static uint8_t gift_byte(size_t i)
{
	return (uint8_t)(i * 13 + 1);
}

static size_t fill(void *arg, const uint8_t *in, size_t inlen, uint8_t *out, size_t cap)
{
	struct seen *s = arg;
	size_t i;

	/* On the service's thread, where cmocka cannot fail a test: a wrong
	 * length shows as a gift_len the test does not expect. */
	if (inlen > sizeof(s->gift) || cap < PAYLOAD_LEN) {
		s->gift_len = SIZE_MAX;
		__atomic_add_fetch(&s->calls, 1, __ATOMIC_RELEASE);
		return 0;
	}
	memcpy(s->gift, in, inlen);
	s->gift_len = inlen;
	for (i = 0; i < PAYLOAD_LEN; i++)
		out[i] = payload_byte(i);
	__atomic_add_fetch(&s->calls, 1, __ATOMIC_RELEASE);
	return PAYLOAD_LEN;
}

static double now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static int setup(void **state)
{
	(void)state;
	if (mp_auth_init(&auth, RUN, "key text", NULL) ||
	    mp_auth_init(&other, RUN, "another key text", NULL))
		return -1;
	run_id = mp_wire_run_id(RUN);
	return 0;
}

static struct mp_welcome *start(struct seen *s, char *addr, size_t cap)
{
	struct mp_welcome *w = NULL;

	memset(s, 0, sizeof(*s));
	assert_int_equal(mp_welcome_start(&auth, run_id, 0, fill, s, &w), 0);
	assert_non_null(w);
	assert_true(mp_welcome_port(w) > 0 && mp_welcome_port(w) <= 65535);
	snprintf(addr, cap, "127.0.0.1:%u", mp_welcome_port(w));
	return w;
}

/* The service counts a refusal on its own thread: wait for @want, bounded. */
static uint64_t refused_by(struct mp_welcome *w, uint64_t want)
{
	double end = now_ms() + 2000;

	while (mp_welcome_refused(w) < want && now_ms() < end)
		usleep(5000);
	return mp_welcome_refused(w);
}

static void check_payload(const uint8_t *p, size_t len)
{
	size_t i;

	assert_int_equal(len, PAYLOAD_LEN);
	for (i = 0; i < len; i++)
		if (p[i] != payload_byte(i))
			fail_msg("payload byte %zu is %u, not %u", i, p[i], payload_byte(i));
}

static void test_right_key(void **state)
{
	struct seen s;
	char addr[32];
	struct mp_welcome *w = start(&s, addr, sizeof(addr));
	uint8_t gift[MP_WELCOME_GIVE_MAX], *p = NULL;
	size_t len = 0, i;

	(void)state;
	for (i = 0; i < sizeof(gift); i++)
		gift[i] = gift_byte(i);

	assert_int_equal(mp_welcome_ask(&auth, run_id, addr, ASK_MS, gift, GIFT_LEN, &p, &len), 0);
	check_payload(p, len);
	free(p);
	assert_int_equal(__atomic_load_n(&s.calls, __ATOMIC_ACQUIRE), 1);
	assert_int_equal(s.gift_len, GIFT_LEN);
	assert_memory_equal(s.gift, gift, GIFT_LEN);

	/* No gift at all. */
	p = NULL;
	assert_int_equal(mp_welcome_ask(&auth, run_id, addr, ASK_MS, NULL, 0, &p, &len), 0);
	check_payload(p, len);
	free(p);
	assert_int_equal(__atomic_load_n(&s.calls, __ATOMIC_ACQUIRE), 2);
	assert_int_equal(s.gift_len, 0);

	/* The largest gift. */
	p = NULL;
	assert_int_equal(mp_welcome_ask(&auth, run_id, addr, ASK_MS, gift, MP_WELCOME_GIVE_MAX,
					&p, &len), 0);
	check_payload(p, len);
	free(p);
	assert_int_equal(__atomic_load_n(&s.calls, __ATOMIC_ACQUIRE), 3);
	assert_int_equal(s.gift_len, MP_WELCOME_GIVE_MAX);
	assert_memory_equal(s.gift, gift, MP_WELCOME_GIVE_MAX);

	assert_int_equal(mp_welcome_refused(w), 0);
	mp_welcome_stop(w);
}

static void test_wrong_key(void **state)
{
	struct seen s;
	char addr[32];
	struct mp_welcome *w = start(&s, addr, sizeof(addr));
	uint8_t gift[GIFT_LEN] = {1, 2, 3}, *p = NULL;
	size_t len = 0;

	(void)state;
	assert_int_equal(mp_welcome_ask(&other, run_id, addr, ASK_MS, gift, sizeof(gift), &p, &len),
			 -EACCES);
	assert_null(p);
	assert_int_equal(refused_by(w, 1), 1);
	assert_int_equal(__atomic_load_n(&s.calls, __ATOMIC_ACQUIRE), 0);
	mp_welcome_stop(w);
}

static void test_other_run(void **state)
{
	struct seen s;
	char addr[32];
	struct mp_welcome *w = start(&s, addr, sizeof(addr));
	uint8_t *p = NULL;
	size_t len = 0;

	(void)state;
	assert_int_equal(mp_welcome_ask(&auth, mp_wire_run_id("another run"), addr, ASK_MS, NULL, 0,
					&p, &len), -EACCES);
	assert_null(p);
	assert_int_equal(refused_by(w, 1), 1);
	assert_int_equal(__atomic_load_n(&s.calls, __ATOMIC_ACQUIRE), 0);
	mp_welcome_stop(w);
}

/* A fake service: one connection, answered as @mode says. */
enum fake_mode { FAKE_BAD_MAC, FAKE_HTTP, FAKE_SILENT };

struct fake {
	enum fake_mode mode;
	int lfd;
	unsigned port;
	pthread_t thread;
	int served; /* set once it accepted */
};

static int listen_loopback(unsigned *port)
{
	struct sockaddr_in sin = {.sin_family = AF_INET};
	socklen_t sl = sizeof(sin);
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	assert_true(fd >= 0);
	sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	assert_int_equal(bind(fd, (struct sockaddr *)&sin, sizeof(sin)), 0);
	assert_int_equal(getsockname(fd, (struct sockaddr *)&sin, &sl), 0);
	*port = ntohs(sin.sin_port);
	return fd;
}

/* On the fake's thread: a short send shows in the asker's result. */
static void send_all(int fd, const void *buf, size_t len)
{
	if (send(fd, buf, len, MSG_NOSIGNAL) != (ssize_t)len)
		fprintf(stderr, "fake service: short send\n");
}

static void recv_all(int fd, void *buf, size_t len)
{
	uint8_t *p = buf;

	while (len) {
		ssize_t n = recv(fd, p, len, 0);

		if (n <= 0)
			break;
		p += n;
		len -= (size_t)n;
	}
}

static void *fake_main(void *arg)
{
	struct fake *f = arg;
	struct timeval tv = {.tv_sec = 3};
	uint8_t buf[256];
	int fd = accept(f->lfd, NULL, NULL);

	if (fd < 0)
		return NULL;
	__atomic_store_n(&f->served, 1, __ATOMIC_RELEASE);
	/* Every read bounded: a stuck asker cannot hang the test. */
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	if (f->mode == FAKE_BAD_MAC) {
		uint8_t hello[HELLO_LEN] = {'M', 'P', 'W', 'L', 1}, hdr[4 + MP_MAC_BYTES + 10];

		mp_auth_random(hello + 5, MP_NONCE_BYTES);
		send_all(fd, hello, sizeof(hello));
		recv_all(fd, buf, ASK_LEN);
		memset(hdr, 0xa5, sizeof(hdr));
		hdr[0] = 10; /* u32 length 10, then a garbage MAC, then 10 bytes */
		hdr[1] = hdr[2] = hdr[3] = 0;
		send_all(fd, hdr, sizeof(hdr));
	} else if (f->mode == FAKE_HTTP) {
		static const char http[] = "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n";

		send_all(fd, http, sizeof(http) - 1);
	}
	/* Wait for the asker to hang up. */
	while (recv(fd, buf, sizeof(buf), 0) > 0)
		;
	close(fd);
	return NULL;
}

static void fake_start(struct fake *f, enum fake_mode mode)
{
	memset(f, 0, sizeof(*f));
	f->mode = mode;
	f->lfd = listen_loopback(&f->port);
	assert_int_equal(listen(f->lfd, 4), 0);
	assert_int_equal(pthread_create(&f->thread, NULL, fake_main, f), 0);
}

static int fake_ask(enum fake_mode mode, int timeout_ms, double *elapsed)
{
	struct fake f;
	char addr[32];
	uint8_t *p = NULL;
	size_t len = 0;
	double t0;
	int rc;

	fake_start(&f, mode);
	snprintf(addr, sizeof(addr), "127.0.0.1:%u", f.port);
	t0 = now_ms();
	rc = mp_welcome_ask(&auth, run_id, addr, timeout_ms, NULL, 0, &p, &len);
	*elapsed = now_ms() - t0;
	assert_null(p);
	pthread_join(f.thread, NULL);
	assert_int_equal(__atomic_load_n(&f.served, __ATOMIC_ACQUIRE), 1);
	close(f.lfd);
	return rc;
}

static void test_fake_services(void **state)
{
	double ms;

	(void)state;
	assert_int_equal(fake_ask(FAKE_BAD_MAC, ASK_MS, &ms), -EACCES);
	assert_int_equal(fake_ask(FAKE_HTTP, ASK_MS, &ms), -EPROTO);
	assert_int_equal(fake_ask(FAKE_SILENT, 300, &ms), -ETIMEDOUT);
	assert_true(ms >= 250 && ms < 2000);
}

static void test_nothing_listening(void **state)
{
	unsigned port;
	int fd = listen_loopback(&port);
	char addr[32];
	uint8_t *p = NULL;
	size_t len = 0;

	(void)state;
	close(fd);
	snprintf(addr, sizeof(addr), "127.0.0.1:%u", port);
	assert_int_equal(mp_welcome_ask(&auth, run_id, addr, ASK_MS, NULL, 0, &p, &len),
			 -ECONNREFUSED);
	assert_null(p);
}

static void test_bad_args(void **state)
{
	uint8_t gift[MP_WELCOME_GIVE_MAX + 1] = {0}, *p = NULL;
	size_t len = 0;

	(void)state;
	/* Checked before dialing: the port need not exist. */
	assert_int_equal(mp_welcome_ask(&auth, run_id, "127.0.0.1:9", ASK_MS, gift, sizeof(gift),
					&p, &len), -EINVAL);
	assert_int_equal(mp_welcome_ask(&auth, run_id, NULL, ASK_MS, NULL, 0, &p, &len), -EINVAL);
	assert_null(p);
}

static void test_slow_asker(void **state)
{
	struct seen s;
	char addr[32];
	struct mp_welcome *w = start(&s, addr, sizeof(addr));
	struct sockaddr_in sin = {.sin_family = AF_INET};
	struct timeval tv = {.tv_sec = 2};
	uint8_t hello[HELLO_LEN], *p = NULL;
	size_t len = 0;
	double t0, ms;
	int slow = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	(void)state;
	assert_true(slow >= 0);
	sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	sin.sin_port = htons((uint16_t)mp_welcome_port(w));
	assert_int_equal(connect(slow, (struct sockaddr *)&sin, sizeof(sin)), 0);
	setsockopt(slow, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	/* Its hello: the service is now serving the slow asker, which says nothing. */
	assert_int_equal(recv(slow, hello, sizeof(hello), MSG_WAITALL), sizeof(hello));
	assert_memory_equal(hello, "MPWL\1", 5);

	t0 = now_ms();
	assert_int_equal(mp_welcome_ask(&auth, run_id, addr, 1500, NULL, 0, &p, &len), 0);
	ms = now_ms() - t0;
	check_payload(p, len);
	free(p);
	/* It waited for the slow asker's time to run out (500 ms from accept). */
	assert_true(ms >= 250 && ms < 1500);
	assert_int_equal(mp_welcome_refused(w), 1);
	assert_int_equal(__atomic_load_n(&s.calls, __ATOMIC_ACQUIRE), 1);
	close(slow);
	mp_welcome_stop(w);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_right_key),
		cmocka_unit_test(test_wrong_key),
		cmocka_unit_test(test_other_run),
		cmocka_unit_test(test_fake_services),
		cmocka_unit_test(test_nothing_listening),
		cmocka_unit_test(test_bad_args),
		cmocka_unit_test(test_slow_asker),
	};

	return cmocka_run_group_tests(tests, setup, NULL);
}
