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
#include <stdint.h>

struct mp_ctx;
struct mp_devpath;
struct mp_drv_mr;

/* What the table learnt about a device allocation: which CUDA context the
 * copies must run in. Filled by query, handed back to the other entries. */
struct mp_stage_dev {
	void *ctx;  /* CUcontext the copies run in */
	int device; /* >= 0: ctx is this device's primary context, which query
	               retained and release gives back; -1: the memory's own context */
};

/*
 * Every entry returns 0 or a negative errno. Copies are asynchronous: they
 * are queued on a stream, and an event recorded after them says when they
 * have run. Streams and events are opaque handles (CUstream, CUevent); a
 * NULL stream is the legacy default stream.
 */
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
	/* @len bytes of pinned (page-locked) host memory, mapped for the
	 * device: the copies then run at the bus's speed without an extra
	 * bounce inside the driver, and a stream can wait on a word of it
	 * (wait_value). -ENOMEM. */
	int (*host_alloc)(const struct mp_stage_dev *d, size_t len, void **host);
	void (*host_free)(const struct mp_stage_dev *d, void *host);
	/* A stream that does not synchronise with the legacy default stream
	 * (the copies' own), and its release, which does not wait for it. */
	int (*stream_create)(const struct mp_stage_dev *d, void **stream);
	void (*stream_destroy)(const struct mp_stage_dev *d, void *stream);
	/* An event without timing, and its release, which may come before
	 * the event completes. */
	int (*event_create)(const struct mp_stage_dev *d, void **ev);
	void (*event_destroy)(const struct mp_stage_dev *d, void *ev);
	/* Record @ev on @stream: it completes when the stream gets there.
	 * -EINVAL (why in @why) when @stream belongs to another CUDA context
	 * than the memory; -EIO when the driver refuses. */
	int (*event_record)(const struct mp_stage_dev *d, void *ev, void *stream, char *why, size_t n);
	/* Work queued on @stream from now on waits for @ev's last record. */
	int (*stream_wait_event)(const struct mp_stage_dev *d, void *stream, void *ev);
	/* Queue a copy of @len bytes on @stream: device to host, or host to
	 * device with @to_device. -EIO when the driver refuses (then nothing
	 * is queued; the details are logged). */
	int (*copy_async)(const struct mp_stage_dev *d, void *dst, const void *src, size_t len,
			  int to_device, void *stream);
	/* 0 once the work before @ev's last record has run; -EAGAIN before;
	 * -EIO when it failed. Never blocks. */
	int (*event_query)(const struct mp_stage_dev *d, void *ev);
	/* Work queued on @stream from now on waits (on the device) until
	 * (int32_t)(*word - value) >= 0; @word is in memory from host_alloc,
	 * which the host sets. -ENOTSUP (why in @why) where the device or the
	 * driver has no stream memory operations; -EINVAL: a stream of
	 * another context. */
	int (*wait_value)(const struct mp_stage_dev *d, void *stream, const uint32_t *word,
			  uint32_t value, char *why, size_t n);
	/* The device path (devk.h, group_allreduce.c) also needs these. */
	/* @len bytes of device memory in @d's context (cuMemAlloc), 256-byte
	 * aligned, and its release (which may come while nothing queued uses
	 * it any more). -ENOMEM. */
	int (*dev_alloc)(const struct mp_stage_dev *d, size_t len, void **dptr);
	void (*dev_free)(const struct mp_stage_dev *d, void *dptr);
	/* Queue a copy of @len bytes from device memory to device memory on
	 * @stream. -EIO as copy_async. */
	int (*copy_d2d)(const struct mp_stage_dev *d, void *dst, const void *src, size_t len,
			void *stream);
	/* Queue: @count 32-bit words at device address @dst set to @word
	 * (cuMemsetD32Async). -EIO. */
	int (*fill32)(const struct mp_stage_dev *d, void *dst, uint32_t word, size_t count,
		      void *stream);
	/* GPUDirect RDMA (devpath.h). Optional: NULL, as -ENOTSUP. What the
	 * GPU needs before work queued after a NIC's write into its memory
	 * completed can read what the NIC wrote: 0 nothing (it orders such
	 * writes for their owner itself), 1 an rdma_flush after each write;
	 * -ENOTSUP (why in @why) when it can do neither. */
	int (*rdma_order)(const struct mp_stage_dev *d, char *why, size_t n);
	/* Make the writes a NIC completed into @d's memory visible to the work
	 * queued from now on (cuFlushGPUDirectRDMAWrites). 0 or -EIO. */
	int (*rdma_flush)(const struct mp_stage_dev *d);
};

/* The CUDA driver, loaded on first use (or, with -Dcuda=disabled, a table
 * whose query says so). */
extern const struct mp_stage_dev_ops mp_stage_cuda_ops;
/* The table the next registration uses: &mp_stage_cuda_ops unless a test swaps it. */
extern const struct mp_stage_dev_ops *mp_stage_dev_ops;

/*
 * For the real kernel table (devk_cuda.c), whose CUDA runtime calls run in
 * the current context: make @d's context (from mp_stage_cuda_ops' query)
 * current on this thread, as every entry of that table does for its own
 * calls, until mp_stage_leave restores what the thread had. 0, or -EIO
 * (logged) when the driver refuses; -ENOTSUP with -Dcuda=disabled. Only
 * for memory the real table queried, never a fake's.
 */
int mp_stage_enter(const struct mp_stage_dev *d);
void mp_stage_leave(void);

/*
 * A registration's host copy of its device memory, and what orders the
 * copies: its own stream, on which every copy is queued, so that a copy
 * queued later runs after every earlier one, whatever became of the
 * requests they served; the event recorded after each copy, which the
 * progress thread polls; and the word that says which of the registration's
 * requests have ended (mp_stage_end), on which a caller's stream may wait
 * (mp_stage_stream_wait).
 */
struct mp_stage {
	const struct mp_stage_dev_ops *ops;
	struct mp_stage_dev dev;
	void *dev_base;          /* the registered device memory */
	float *host;             /* its pinned copy, len bytes, then the word */
	size_t len;
	struct mp_drv_mr *dmr;   /* the copy's registration with the transport */
	void *stream;            /* the copies' stream */
	void *done;              /* recorded after each copy */
	void *legacy;            /* recorded on the legacy default stream before a copy in
	                            that no caller's stream orders (mp_stage_in) */
	uint32_t *word;          /* pinned, after the copy: the ticket of the last request
	                            that ended; the device reads it */
	uint32_t tickets;        /* the last ticket handed out (the core's, under its mutex) */
	struct mp_devpath *dp;   /* the device path (devpath.h): reduced on the GPU, host holds
	                            a ring of chunks, not a copy; NULL: staged whole */
	/* The device path's own undoing (mp_dev_close), which mp_stage_close
	 * calls once nothing is queued: stage.c does not name the path above it. */
	void (*dp_close)(struct mp_ctx *ctx, struct mp_stage *s);
};

/* The device path's set-up (mp_dev_open, devpath.h), as mp_stage_open_dev
 * takes it: 0 with s->dp and s->dp_close set; -ENOTSUP (why in @why) when
 * the path does not take the memory; another negative errno with the
 * context's error set. */
typedef int (*mp_stage_dev_open_fn)(struct mp_ctx *ctx, struct mp_stage *s, char *why, size_t n);

/*
 * Stage [dev, dev + len) for @ctx: check it, allocate the pinned copy and
 * register the copy with the transport as host memory, and create the
 * copies' stream and events. On failure the context's error says why.
 * Returns 0; -ENOTSUP, -EINVAL (see query); -ENOMEM; -EIO; or the
 * transport's registration error.
 */
int mp_stage_open(struct mp_ctx *ctx, void *dev, size_t len, struct mp_stage **out);
/*
 * As mp_stage_open, but first offered to @dev_open (the device path,
 * mp_dev_open; NULL: none): when it takes the memory there is no host
 * copy, a ring of chunks. A registration it does not take is staged whole,
 * and @why (@n bytes) says why; *@device says which it got.
 */
int mp_stage_open_dev(struct mp_ctx *ctx, void *dev, size_t len, mp_stage_dev_open_fn dev_open,
		      int *device, char *why, size_t n, struct mp_stage **out);
/* Undo mp_stage_open, once the copies still queued have run (bounded by
 * the context's round timeout: past it the pinned copy is left allocated,
 * with a warning, since the device may still write it). @s may be NULL. */
void mp_stage_close(struct mp_ctx *ctx, struct mp_stage *s);
/* On the caller's thread, at the start of an operation: an event recorded
 * on @stream now, which the operation's copy in will wait for. 0, or
 * -EINVAL, -ENOMEM, -EIO with the context's error set. */
int mp_stage_mark(struct mp_ctx *ctx, struct mp_stage *s, void *stream, void **ev);
/* The device path's start of an operation: the registration's stream waits
 * for @ev (mp_stage_mark), or with @ev NULL for the work on the legacy
 * default stream so far, and so does the caller, polling, within the round
 * timeout. 0; -EIO (the operation did not start, the buffer is as it was)
 * or -ECANCELED with the context's error set. */
int mp_stage_order(struct mp_ctx *ctx, struct mp_stage *s, void *ev);
/* Wait, polling (20 us doubling to 1 ms), until the work before @ev's last
 * record on the registration's stream has run: the progress thread must not
 * block inside the driver, where nothing bounds the wait. 0; -EIO when it
 * failed; -ETIMEDOUT past the round timeout; with @stop, -ECANCELED when
 * the context stops meanwhile. */
int mp_stage_poll(struct mp_ctx *ctx, struct mp_stage *s, void *ev, int stop);
/* Release an event of mp_stage_mark. @ev may be NULL. */
void mp_stage_unmark(struct mp_stage *s, void *ev);
/*
 * Copy @bytes at offset @off of the device memory into the host copy, once
 * the work before @ev (mp_stage_mark) has run, or with @ev NULL the work on
 * the legacy default stream so far; or back (mp_stage_out). Each returns
 * once the copy has run: 0; -EIO (also a copy that did not run within the
 * context's round timeout) or, for the copy in only, -ECANCELED when the
 * context stops meanwhile; the context's error says why. A copy in that
 * did not run may still run later; it writes only the host copy, which no
 * one reads before the next copy in, queued after it, has run.
 */
int mp_stage_in(struct mp_ctx *ctx, struct mp_stage *s, size_t off, size_t bytes, void *ev);
int mp_stage_out(struct mp_ctx *ctx, struct mp_stage *s, size_t off, size_t bytes);
/* The request of ticket @ticket ended, whichever way: streams waiting for it
 * may go on. Tickets end in the order they were handed out. */
void mp_stage_end(struct mp_stage *s, uint32_t ticket);
/* Make @stream wait until the request of ticket @ticket has ended. 0;
 * -ENOTSUP or -EINVAL with the context's error set. */
int mp_stage_stream_wait(struct mp_ctx *ctx, struct mp_stage *s, void *stream, uint32_t ticket);

#endif
