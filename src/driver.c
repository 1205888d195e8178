/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The built-in drivers. An explicit table rather than constructor-time
 * registration, because the static library would otherwise drop driver
 * objects nobody references.
 */
#include <string.h>

#include "internal.h"

extern const struct mp_driver_ops mp_tcp_driver_ops;
extern const struct mp_driver_ops mp_loop_driver_ops;

static const struct mp_driver_ops *const builtin[] = {
	&mp_tcp_driver_ops,
	&mp_loop_driver_ops,
};

const struct mp_driver_ops *mp_driver_find(const char *name)
{
	for (size_t i = 0; i < sizeof(builtin) / sizeof(builtin[0]); i++)
		if (!strcmp(builtin[i]->name, name))
			return builtin[i];
	return NULL;
}

const char *mp_driver_names(void)
{
	return "tcp, loop";
}
