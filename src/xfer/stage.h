/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Host staging of device memory (stage.c). The reducer and the codecs run on
 * the CPU, so a CUDA buffer is averaged through a pinned host copy that
 * belongs to its registration (mp_mem_register with MP_MEM_CUDA): copied in
 * before the operation, copied back once its result is final.
 *
 * The CUDA calls this needs sit behind a narrow table, struct
 * mp_stage_dev_ops, for the same reason as drivers/verbs/ibv.h: the staging
 * logic must be tested on machines without a GPU. The real table loads the
 * CUDA driver (libcuda.so.1) with dlopen at first use; a test points
 * mp_stage_dev_ops at a fake before it registers device memory. Each
 * registration keeps the table it was made with.
 */
#ifndef MP_STAGE_H
#define MP_STAGE_H

#include <stddef.h>

struct mp_ctx;
struct mp_drv_mr;

/* What the table learnt about a device allocation: which CUDA context the
 * copies must run in. Filled by query, handed back to the other entries. */
struct mp_stage_dev {
	void *ctx;  /* CUcontext the copies run in */
	int device; /* >= 0: ctx is this device's primary context, which query
	               retained and release gives back; -1: the memory's own context */
};

/* Every entry returns 0 or a negative errno. The copies are synchronous:
 * when they return, the destination holds the bytes. */
struct mp_stage_dev_ops {
	const char *name; /* for messages: "CUDA" */
	/* Check that [ptr, ptr + len) is device memory inside one allocation,
	 * and fill @d. -ENOTSUP: no CUDA driver, no GPU, or staging not built
	 * in; -EINVAL: host memory, an unknown pointer, or a range that leaves
	 * the allocation. The reason goes to @why (@n bytes, NUL-terminated)
	 * on failure. */
	int (*query)(void *ptr, size_t len, struct mp_stage_dev *d, char *why, size_t n);
	/* Give back what query took (the primary context it retained). */
	void (*release)(struct mp_stage_dev *d);
	/* @len bytes of pinned (page-locked) host memory: the copies then run
	 * at the bus's speed without an extra bounce inside the driver. -ENOMEM. */
	int (*host_alloc)(const struct mp_stage_dev *d, size_t len, void **host);
	void (*host_free)(const struct mp_stage_dev *d, void *host);
	/* Device to host and host to device, @len bytes; -EIO when the driver
	 * refuses (the details are logged). */
	int (*to_host)(const struct mp_stage_dev *d, void *host, const void *dev, size_t len);
	int (*to_device)(const struct mp_stage_dev *d, void *dev, const void *host, size_t len);
};

/* The CUDA driver, loaded on first use (or, with -Dcuda=disabled, a table
 * whose query says so). */
extern const struct mp_stage_dev_ops mp_stage_cuda_ops;
/* The table the next registration uses: &mp_stage_cuda_ops unless a test swaps it. */
extern const struct mp_stage_dev_ops *mp_stage_dev_ops;

/* A registration's host copy of its device memory. */
struct mp_stage {
	const struct mp_stage_dev_ops *ops;
	struct mp_stage_dev dev;
	void *dev_base;          /* the registered device memory */
	float *host;             /* its pinned copy, len bytes */
	size_t len;
	struct mp_drv_mr *dmr;   /* the copy's registration with the transport */
};

/*
 * Stage [dev, dev + len) for @ctx: check it, allocate the pinned copy and
 * register the copy with the transport as host memory. On failure the
 * context's error says why. Returns 0; -ENOTSUP, -EINVAL (see query);
 * -ENOMEM; or the transport's registration error.
 */
int mp_stage_open(struct mp_ctx *ctx, void *dev, size_t len, struct mp_stage **out);
/* Undo mp_stage_open. @s may be NULL. */
void mp_stage_close(struct mp_ctx *ctx, struct mp_stage *s);
/* Copy @bytes at offset @off of the device memory into the host copy, or
 * back. 0, or -EIO with the context's error set (the destination is then as
 * the table left it: the real driver writes nothing when it refuses a copy). */
int mp_stage_in(struct mp_ctx *ctx, struct mp_stage *s, size_t off, size_t bytes);
int mp_stage_out(struct mp_ctx *ctx, struct mp_stage *s, size_t off, size_t bytes);

#endif
