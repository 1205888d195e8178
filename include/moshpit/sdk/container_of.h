/* SPDX-License-Identifier: BSD-3-Clause */
/**
 * @file container_of.h
 * @brief Driver SDK: from an embedded member back to its object.
 *
 * Drivers embed the core's handles (struct mp_drv first in their instance)
 * and the SDK's links in their own structs, and get back to those structs
 * from the handles. Header only.
 */
#ifndef MOSHPIT_SDK_CONTAINER_OF_H
#define MOSHPIT_SDK_CONTAINER_OF_H

#include <stddef.h>

/**
 * The @p type object whose member @p member is at @p ptr. The pointer
 * comparison, never evaluated, makes a @p ptr of another type than the
 * member a diagnostic (an error with -Werror), which a plain cast would
 * hide.
 */
#define mp_container_of(ptr, type, member)                                 \
	((type *)(void *)((char *)(ptr) - offsetof(type, member) -        \
			  0 * sizeof((ptr) == &((type *)0)->member)))

#endif /* MOSHPIT_SDK_CONTAINER_OF_H */
