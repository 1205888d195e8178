/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The registry of drivers: the built-in ones, those an application
 * registers (mp_driver_register), and those of the plugins MP_DRIVER_PATH
 * names, loaded the first time anything looks for a driver.
 *
 * The built-ins are an explicit table rather than constructor-time
 * registration, because a program linked with the static library would
 * otherwise drop driver objects nobody references. Every table, built in
 * or not, passes the same checks before the core calls it.
 */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
#define NBUILTIN (sizeof(builtin) / sizeof(builtin[0]))

/* Registered tables; a handful in practice, and they are never removed. */
#define MAX_REGISTERED 32

static pthread_mutex_t reg_lock = PTHREAD_MUTEX_INITIALIZER;
static const struct mp_driver_ops *registered[MAX_REGISTERED];
static int nregistered;
static pthread_once_t plugins_once = PTHREAD_ONCE_INIT;
/*
 * Set while this thread loads the plugins: a plugin whose entry point
 * registers a table itself must not wait for its own loading to end.
 */
static _Thread_local int loading_plugins;

static void load_plugins(void);

/* MP_DRIVER_PATH is read once, before the registry answers anything. */
static void plugins_loaded(void)
{
	if (!loading_plugins)
		pthread_once(&plugins_once, load_plugins);
}

/* The size of a table that holds @entry and everything before it. */
#define OPS_END(entry) (offsetof(struct mp_driver_ops, entry) + \
			sizeof(((struct mp_driver_ops *)0)->entry))

/*
 * Why the core cannot use @o: NULL when it can, else the reason, and *err
 * the error. ABI 1 calls every entry up to wake, so all of them must be
 * there and set; entries after wake are optional (read through
 * mp_driver_default_listen and the like, which check size).
 */
static const char *unusable(const struct mp_driver_ops *o, int *err, char *why, size_t cap)
{
	*err = -EINVAL;
	if (!o)
		return "no table (NULL)";
	if (o->size < OPS_END(abi)) {
		snprintf(why, cap, "a table of %zu bytes is too short to say its ABI", o->size);
		return why;
	}
	if (o->abi != MP_DRIVER_ABI) {
		*err = -EPROTO;
		snprintf(why, cap, "built for driver ABI %u; this library has ABI %d", o->abi,
			 MP_DRIVER_ABI);
		return why;
	}
	if (o->size < OPS_END(wake)) {
		snprintf(why, cap, "a table of %zu bytes lacks entries of ABI %d (%zu bytes)",
			 o->size, MP_DRIVER_ABI, OPS_END(wake));
		return why;
	}
	if (!o->name || !*o->name)
		return "no name";
	size_t n = strlen(o->name);

	if (n > MP_DRIVER_NAME_MAX)
		return "name too long";
	for (size_t i = 0; i < n; i++) {
		char c = o->name[i];

		/* Users type it, logs and lists print it: plain ASCII, no separators. */
		if (!(c >= 'a' && c <= 'z') && !(c >= 'A' && c <= 'Z') && !(c >= '0' && c <= '9') &&
		    c != '_' && c != '-')
			return "name not made of [A-Za-z0-9_-]";
	}
#define NEED(e)                                                           \
	do {                                                              \
		if (!o->e)                                                \
			return "entry " #e " is NULL";                    \
	} while (0)
	NEED(init);
	NEED(fini);
	NEED(query);
	NEED(addr_parse);
	NEED(addr_format);
	NEED(listen);
	NEED(accept);
	NEED(close_listener);
	NEED(connect);
	NEED(close);
	NEED(reg_mr);
	NEED(dereg_mr);
	NEED(isend);
	NEED(irecv);
	NEED(test);
	NEED(progress);
	NEED(wake);
#undef NEED
	*err = 0;
	return NULL;
}

/* Under reg_lock: the registered table named @name, or NULL. */
static const struct mp_driver_ops *find_registered(const char *name)
{
	for (int i = 0; i < nregistered; i++)
		if (!strcmp(registered[i]->name, name))
			return registered[i];
	return NULL;
}

/* A built-in table is matched by name first and checked after, so that a broken one says so. */
static const struct mp_driver_ops *find_builtin(const char *name, int warn)
{
	for (size_t i = 0; i < NBUILTIN; i++) {
		char why[128];
		int err;

		if (strcmp(builtin[i]->name, name))
			continue;
		const char *bad = unusable(builtin[i], &err, why, sizeof(why));

		if (!bad)
			return builtin[i];
		if (warn)
			MP_WARN("driver %s: not usable by this core: %s", name, bad);
		return NULL;
	}
	return NULL;
}

/* @source names where the table came from, for messages. */
static int add(const struct mp_driver_ops *ops, const char *source)
{
	char why[128];
	const char *bad;
	int err;

	bad = unusable(ops, &err, why, sizeof(why));
	if (bad) {
		int named = ops && ops->size >= OPS_END(name) && ops->name && *ops->name;

		mp_set_init_error("%s: driver %s refused: %s", source, named ? ops->name : "(unnamed)",
				  bad);
		return err;
	}
	pthread_mutex_lock(&reg_lock);
	if (find_builtin(ops->name, 0) || find_registered(ops->name)) {
		err = -EEXIST;
	} else if (nregistered == MAX_REGISTERED) {
		err = -ENOSPC;
	} else {
		registered[nregistered++] = ops;
		err = 0;
	}
	pthread_mutex_unlock(&reg_lock);
	if (err == -EEXIST)
		mp_set_init_error("%s: driver %s refused: a driver of that name exists already",
				  source, ops->name);
	else if (err == -ENOSPC)
		mp_set_init_error("%s: driver %s refused: %d drivers are registered already",
				  source, ops->name, MAX_REGISTERED);
	else
		MP_INFO("%s: driver %s registered", source, ops->name);
	return err;
}

/* One MP_DRIVER_PATH entry; a plugin that fails is skipped, with a warning. */
static void load_plugin(const char *path)
{
	void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	void *sym;
	mp_driver_plugin_fn entry;
	const struct mp_driver_ops *ops;

	if (!h) {
		MP_WARN("MP_DRIVER_PATH: cannot load %s: %s", path, dlerror());
		return;
	}
	sym = dlsym(h, MP_DRIVER_PLUGIN_SYMBOL);
	if (!sym) {
		MP_WARN("MP_DRIVER_PATH: %s has no %s(): not a moshpit driver plugin", path,
			MP_DRIVER_PLUGIN_SYMBOL);
		dlclose(h);
		return;
	}
	/* POSIX: a function's address from dlsym has the representation of a data pointer. */
	memcpy(&entry, &sym, sizeof(entry));
	ops = entry();
	if (!ops) {
		MP_INFO("MP_DRIVER_PATH: %s declines to provide a driver", path);
		dlclose(h);
		return;
	}
	/* The table lives in the plugin: once registered, the plugin stays loaded. */
	if (add(ops, path))
		dlclose(h);
}

static void load_plugins(void)
{
	const char *env = getenv("MP_DRIVER_PATH");
	char *list, *save = NULL;

	if (!env || !*env)
		return;
	list = strdup(env);
	if (!list) {
		MP_WARN("MP_DRIVER_PATH: out of memory; no plugin loaded");
		return;
	}
	loading_plugins = 1;
	for (char *p = strtok_r(list, ":", &save); p; p = strtok_r(NULL, ":", &save))
		load_plugin(p);
	loading_plugins = 0;
	free(list);
}

int mp_driver_register(const struct mp_driver_ops *ops)
{
	/* Plugins first, whoever comes first: a name always means the same driver. */
	plugins_loaded();
	return add(ops, "mp_driver_register");
}

const struct mp_driver_ops *mp_driver_find(const char *name)
{
	const struct mp_driver_ops *o;

	plugins_loaded();
	o = find_builtin(name, 1);
	if (o)
		return o;
	pthread_mutex_lock(&reg_lock);
	o = find_registered(name);
	pthread_mutex_unlock(&reg_lock);
	return o;
}

void mp_driver_names(char *buf, size_t cap)
{
	size_t n = 0;

	if (!cap)
		return;
	buf[0] = '\0';
	plugins_loaded();
	pthread_mutex_lock(&reg_lock);
	for (size_t i = 0; i < NBUILTIN + (size_t)nregistered && n < cap; i++) {
		const struct mp_driver_ops *o = i < NBUILTIN ? builtin[i] : registered[i - NBUILTIN];
		char why[128];
		int err;

		if (unusable(o, &err, why, sizeof(why)))
			continue;
		n += (size_t)snprintf(buf + n, cap - n, "%s%s", n ? ", " : "", o->name);
	}
	pthread_mutex_unlock(&reg_lock);
}

const char *mp_driver_default_listen(const struct mp_driver_ops *o)
{
	return o->size >= OPS_END(default_listen) ? o->default_listen : NULL;
}

int mp_driver_setting_up(const struct mp_driver_ops *o, struct mp_drv *d)
{
	return o->size >= OPS_END(setting_up) && o->setting_up ? o->setting_up(d) : 0;
}

int mp_driver_describe(const struct mp_driver_ops *o, struct mp_drv *d, char *text, size_t cap)
{
	if (o->size < OPS_END(describe) || !o->describe) {
		text[0] = '\0';
		return 0;
	}
	return o->describe(d, text, cap);
}
