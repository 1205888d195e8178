/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * mp_init when the memory for a static run's part weights runs out: the
 * weights go into the settings every peer must share (settings.c), so
 * mp_init fails with -ENOMEM, says so in mp_last_error(NULL), and frees
 * what it made (the ASan build's leak check sees that). It used to make
 * the settings without the weights and carry on, so that its handshakes
 * disagreed with every peer that had had the memory.
 *
 * The test is linked with -Wl,--wrap=malloc: every malloc of the library's
 * objects comes here first. The one that fails is the malloc of npeers
 * doubles called from mp_init itself (dladdr names the caller: the test
 * is linked with -rdynamic, and mp_init is public).
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dlfcn.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <moshpit/moshpit.h>

#define NP 5

void *__real_malloc(size_t size);
void *__wrap_malloc(size_t size);

static int armed;  /* fail the next malloc of NP doubles from mp_init */
static int failed; /* how many this test failed */

void *__wrap_malloc(size_t size)
{
	if (armed && size == NP * sizeof(double)) {
		Dl_info info;

		if (dladdr(__builtin_return_address(0), &info) && info.dli_sname &&
		    !strcmp(info.dli_sname, "mp_init")) {
			armed = 0;
			failed++;
			return NULL;
		}
	}
	return __real_malloc(size);
}

static void config(struct mp_config *cfg, const char *run)
{
	mp_config_init(cfg);
	cfg->transport = "loop";
	cfg->run_name = run;
	cfg->rank = 0;
	cfg->npeers = NP;
	cfg->log_level = MP_LOG_NONE;
}

static void weights_out_of_memory(void **s)
{
	struct mp_config cfg;
	static char junk;
	mp_ctx *ctx = (mp_ctx *)&junk; /* mp_init must set it to NULL */

	(void)s;
	config(&cfg, "nomem");
	armed = 1;
	failed = 0;
	assert_int_equal(mp_init(&cfg, &ctx), -ENOMEM);
	armed = 0;
	assert_int_equal(failed, 1);
	assert_null(ctx);
	if (!strstr(mp_last_error(NULL), "out of memory for the part weights of 5 peers"))
		fail_msg("mp_last_error(NULL) is \"%s\"", mp_last_error(NULL));

	/* With the memory, the same configuration starts (the wrapper failed
	 * nothing else). */
	assert_int_equal(mp_init(&cfg, &ctx), 0);
	assert_non_null(ctx);
	assert_int_equal(failed, 1);
	mp_finalize(ctx);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(weights_out_of_memory),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
