/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The built-in drivers. An explicit table rather than constructor-time
 * registration, because the static library would otherwise drop driver
 * objects nobody references.
 */
#include <string.h>

#include <stddef.h>

#include "core.h"
#include "log.h"
#include "mp_build_config.h"

extern const struct mp_driver_ops mp_tcp_driver_ops;
extern const struct mp_driver_ops mp_loop_driver_ops;
#ifdef MP_HAVE_DPDK
extern const struct mp_driver_ops mp_dpdk_driver_ops;
#endif
#ifdef MP_HAVE_VERBS
extern const struct mp_driver_ops mp_verbs_driver_ops;
#endif
#ifdef MP_HAVE_OFI
extern const struct mp_driver_ops mp_ofi_driver_ops;
#endif

static const struct mp_driver_ops *const builtin[] = {
	&mp_tcp_driver_ops,
	&mp_loop_driver_ops,
#ifdef MP_HAVE_DPDK
	&mp_dpdk_driver_ops,
#endif
#ifdef MP_HAVE_VERBS
	&mp_verbs_driver_ops,
#endif
#ifdef MP_HAVE_OFI
	&mp_ofi_driver_ops,
#endif
};

/*
 * A table the core can use: built for this ABI, at least as large as the
 * entries the core calls, and every one of them filled. (ABI 1 calls all of
 * them; later optional entries will be checked against size one by one.)
 */
static int usable(const struct mp_driver_ops *o)
{
	if (o->abi != MP_DRIVER_ABI || o->size < offsetof(struct mp_driver_ops, wake) + sizeof(o->wake))
		return 0;
	return o->init && o->fini && o->query && o->addr_parse && o->addr_format && o->listen &&
	       o->accept && o->close_listener && o->connect && o->close && o->reg_mr && o->dereg_mr &&
	       o->isend && o->irecv && o->test && o->progress && o->wake;
}

const struct mp_driver_ops *mp_driver_find(const char *name)
{
	for (size_t i = 0; i < sizeof(builtin) / sizeof(builtin[0]); i++)
		if (!strcmp(builtin[i]->name, name)) {
			if (usable(builtin[i]))
				return builtin[i];
			MP_WARN("driver %s: ops table of ABI %u, size %zu is not usable by this core (ABI %d)",
				name, builtin[i]->abi, builtin[i]->size, MP_DRIVER_ABI);
			return NULL;
		}
	return NULL;
}

const char *mp_driver_names(void)
{
	return "tcp, loop"
#ifdef MP_HAVE_DPDK
	       ", dpdk"
#endif
#ifdef MP_HAVE_VERBS
	       ", verbs"
#endif
#ifdef MP_HAVE_OFI
	       ", ofi"
#endif
		;
}
