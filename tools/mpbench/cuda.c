/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * --memory=cuda: each peer's buffer in CUDA device memory, as an application
 * that averages its gradients in place would hold it (nccl-tests averages
 * device buffers too).
 *
 * The CUDA driver (libcuda.so.1) is loaded with dlopen and called through
 * its driver API, as the library's own staging does (src/xfer/stage.c): it
 * comes with the NVIDIA kernel driver, not with the toolkit, so mpbench
 * builds and runs without either, and says what is missing instead of
 * failing to load. The few types used are those of the driver's ABI, which
 * has kept them since CUDA 3.2 (the _v2 entry points, 64-bit CUdeviceptr).
 *
 * Forked peers must not inherit an initialised driver: CUDA does not
 * survive fork(), and a child of a process that called cuInit gets errors
 * from every call. So the launcher never calls cuInit itself: dev_probe
 * does it in a short-lived child, and each peer opens the driver anew.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "mpbench.h"

typedef int cu_result;                /* CUresult; CUDA_SUCCESS is 0 */
typedef unsigned long long cu_ptr;    /* CUdeviceptr on 64-bit hosts */
typedef struct CUctx_st *cu_ctx;      /* CUcontext */
typedef int cu_device;                /* CUdevice */

#define CU_ERROR_NO_DEVICE 100

static struct {
	cu_result (*init)(unsigned flags);
	cu_result (*error_name)(cu_result r, const char **name);
	cu_result (*device_count)(int *n);
	cu_result (*device_get)(cu_device *dev, int ordinal);
	cu_result (*device_name)(char *name, int len, cu_device dev);
	cu_result (*primary_retain)(cu_ctx *c, cu_device dev);
	cu_result (*primary_release)(cu_device dev);
	cu_result (*set_current)(cu_ctx c);
	cu_result (*mem_alloc)(cu_ptr *p, size_t len);
	cu_result (*mem_free)(cu_ptr p);
	cu_result (*htod)(cu_ptr dst, const void *src, size_t len);
	cu_result (*dtoh)(void *dst, cu_ptr src, size_t len);
} cu;

static pthread_once_t cu_once = PTHREAD_ONCE_INIT;
static char cu_why[320]; /* why the driver cannot be used; "" when it can */

/* Per thread (--transport=loop runs peers as threads of one process). */
static _Thread_local cu_device my_dev = -1;

static const char *cu_name(cu_result r)
{
	static _Thread_local char buf[32];
	const char *s = NULL;

	if (cu.error_name && !cu.error_name(r, &s) && s)
		return s;
	snprintf(buf, sizeof(buf), "CUresult %d", r);
	return buf;
}

static void cu_load(void)
{
	static const struct {
		const char *sym;
		size_t off;
	} syms[] = {
#define E(field, name) { name, offsetof(__typeof__(cu), field) }
		E(init, "cuInit"),
		E(error_name, "cuGetErrorName"),
		E(device_count, "cuDeviceGetCount"),
		E(device_get, "cuDeviceGet"),
		E(device_name, "cuDeviceGetName"),
		E(primary_retain, "cuDevicePrimaryCtxRetain"),
		E(primary_release, "cuDevicePrimaryCtxRelease_v2"),
		E(set_current, "cuCtxSetCurrent"),
		E(mem_alloc, "cuMemAlloc_v2"),
		E(mem_free, "cuMemFree_v2"),
		E(htod, "cuMemcpyHtoD_v2"),
		E(dtoh, "cuMemcpyDtoH_v2"),
#undef E
	};
	void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	cu_result r;

	if (!h) {
		/* dlerror names the file and the reason, e.g. "libcuda.so.1:
		 * cannot open shared object file: No such file or directory". */
		snprintf(cu_why, sizeof(cu_why), "%s (no CUDA driver on this machine)", dlerror());
		return;
	}
	for (size_t i = 0; i < sizeof(syms) / sizeof(syms[0]); i++) {
		void *f = dlsym(h, syms[i].sym);

		if (!f) {
			snprintf(cu_why, sizeof(cu_why), "libcuda.so.1 lacks %s (a CUDA driver "
				 "older than CUDA 11)", syms[i].sym);
			return;
		}
		/* All entries are function pointers of one size and representation. */
		memcpy((char *)&cu + syms[i].off, &f, sizeof(f));
	}
	r = cu.init(0);
	if (r) {
		snprintf(cu_why, sizeof(cu_why), "%s (cuInit: %s)",
			 r == CU_ERROR_NO_DEVICE ? "no CUDA device" :
			 "the CUDA driver refuses to start", cu_name(r));
		return;
	}
	cu_why[0] = '\0';
}

/* Load and initialise the driver (once per process); 0 and the device
 * count, or -1 with the reason in @why. */
static int cu_ready(int *count, char *why, size_t n)
{
	cu_result r;

	pthread_once(&cu_once, cu_load);
	if (cu_why[0]) {
		snprintf(why, n, "%s", cu_why);
		return -1;
	}
	*count = 0;
	r = cu.device_count(count);
	if (r || *count <= 0) {
		snprintf(why, n, "no CUDA device (cuDeviceGetCount: %s, %d devices)",
			 r ? cu_name(r) : "CUDA_SUCCESS", *count);
		return -1;
	}
	return 0;
}

/*
 * A child process loads the driver, initialises it and names the devices;
 * the caller stays uninitialised, so that the peers it forks next can use
 * CUDA (see the top of the file). A probe that only dlopen'ed in the parent
 * would miss a driver without a device, which is what a container without
 * its GPU looks like, and every peer would then fail on its own.
 */
int dev_probe(char *what, size_t n)
{
	int fds[2], status = 0;
	char buf[512];
	ssize_t got = 0;
	pid_t pid;

	if (pipe(fds)) {
		snprintf(what, n, "pipe: %s", strerror(errno));
		return -1;
	}
	fflush(NULL);
	pid = fork();
	if (pid < 0) {
		snprintf(what, n, "fork: %s", strerror(errno));
		close(fds[0]);
		close(fds[1]);
		return -1;
	}
	if (pid == 0) {
		char line[512], name[128] = "?";
		int count = 0, ok;
		cu_device d;

		close(fds[0]);
		ok = cu_ready(&count, line, sizeof(line)) == 0;
		if (ok) {
			if (cu.device_get(&d, 0) || cu.device_name(name, (int)sizeof(name), d))
				snprintf(name, sizeof(name), "?");
			snprintf(line, sizeof(line), "%d device%s, device 0: %s", count,
				 count > 1 ? "s" : "", name);
		}
		if (write(fds[1], line, strlen(line)) < 0)
			ok = 0;
		_exit(ok ? 0 : 1);
	}
	close(fds[1]);
	while (got < (ssize_t)sizeof(buf) - 1) {
		ssize_t k = read(fds[0], buf + got, sizeof(buf) - 1 - (size_t)got);

		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			break;
		got += k;
	}
	buf[got] = '\0';
	close(fds[0]);
	while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
		;
	if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
		snprintf(what, n, "%s", buf);
		return 0;
	}
	if (got > 0) {
		snprintf(what, n, "%s", buf);
	} else {
		char d[64];

		describe_status(status, d, sizeof(d));
		snprintf(what, n, "the probe of the CUDA driver %s", d);
	}
	return -1;
}

/* This thread's device: @index mod the device count, its primary context
 * made current. 0, or -1 with the reason in @why. */
int dev_open(int index, char *why, size_t n)
{
	cu_ctx c = NULL;
	cu_device d;
	cu_result r;
	int count;

	if (cu_ready(&count, why, n))
		return -1;
	r = cu.device_get(&d, (index < 0 ? 0 : index) % count);
	if (!r)
		r = cu.primary_retain(&c, d);
	if (r) {
		snprintf(why, n, "CUDA device %d of %d: %s", index % count, count, cu_name(r));
		return -1;
	}
	r = cu.set_current(c);
	if (r) {
		cu.primary_release(d);
		snprintf(why, n, "cuCtxSetCurrent: %s", cu_name(r));
		return -1;
	}
	my_dev = d;
	return 0;
}

void dev_close(void)
{
	if (my_dev < 0)
		return;
	cu.set_current(NULL);
	cu.primary_release(my_dev);
	my_dev = -1;
}

int dev_alloc(size_t len, void **p, char *why, size_t n)
{
	cu_ptr d = 0;
	cu_result r = cu.mem_alloc(&d, len);

	if (r) {
		snprintf(why, n, "cuMemAlloc of %zu bytes: %s", len, cu_name(r));
		return -1;
	}
	*p = (void *)(uintptr_t)d;
	return 0;
}

void dev_free(void *p)
{
	if (p)
		cu.mem_free((cu_ptr)(uintptr_t)p);
}

int dev_htod(void *dst, const void *src, size_t len, char *why, size_t n)
{
	cu_result r = cu.htod((cu_ptr)(uintptr_t)dst, src, len);

	if (r)
		snprintf(why, n, "cuMemcpyHtoD of %zu bytes: %s", len, cu_name(r));
	return r ? -1 : 0;
}

int dev_dtoh(void *dst, const void *src, size_t len, char *why, size_t n)
{
	cu_result r = cu.dtoh(dst, (cu_ptr)(uintptr_t)src, len);

	if (r)
		snprintf(why, n, "cuMemcpyDtoH of %zu bytes: %s", len, cu_name(r));
	return r ? -1 : 0;
}
