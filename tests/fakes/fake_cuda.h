/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * A FAKE of the CUDA driver, for tests: a struct mp_stage_dev_ops
 * (src/xfer/stage.h) that stands in for libcuda.so.1 behind the core's host
 * staging of CUDA memory (point mp_stage_dev_ops at fk_ops). No GPU is
 * needed or touched.
 *
 * Its "device memory" (one buffer per peer, fk_mem_init) is host memory that
 * it maps with no access at all and opens only inside its own copies, so a
 * read or write of it by the library anywhere else (the reducer, a codec, a
 * send) faults.
 *
 * It models streams, events and asynchronous copies: a call that queues work
 * on a stream (a copy, an event's record, a wait for an event or for a word
 * of host memory) only queues it, and a "device" thread runs each stream's
 * queue in order, the streams side by side, an operation once what it waits
 * for has happened (its event completed, the word reached the value, its
 * start time came: fk.copy_delay_ms delays every copy). So a library that
 * reads its host copy before the copy's event completes reads stale bytes,
 * and one that forgets to order its copy after the caller's event copies the
 * values the caller's stream has not yet written. An event completes when
 * its stream reaches its last record; one never recorded is complete. The
 * NULL stream is one more stream (the legacy default stream, which here
 * does not synchronise with the others).
 *
 * The test plays the application: its own streams (fk_stream_new) carry
 * "kernels" that write device memory after a delay (fk_kernel_write) and
 * probes that read it when the stream gets there (fk_probe).
 *
 * It counts, per byte, the copies to the host and back (when they run), can
 * refuse either copy for chosen peers and operations (fail_in, fail_out:
 * the call returns -EIO and queues nothing), can hold one peer's copy back
 * on the device until the test lets it go (gate_rank, gate_op, gate_open),
 * and can say that the device has no stream memory operations (no_memops).
 * The library calls the table from its threads: everything goes under
 * fk.mu, and the table's checks abort rather than use cmocka's asserts
 * (only the test's own calls, fk_mem_init and the like, use those).
 *
 * The device path (devk.h): dev_alloc gives more fake device memory, mapped
 * and opened as the per-peer buffers are, and belonging to the peer whose
 * buffer the stage was queried on (d->ctx); copy_async (either way),
 * copy_d2d, fill32 and the kernels take either kind as device memory and
 * abort on a range that is neither (or on freeing an allocation that work
 * still queued names). fk_devk_ops runs the CPU codecs (src/codec) on the
 * device thread, in stream order with the copies, so its payloads and sums
 * are the CPU's bit for bit: encode gives the CPU encoder's bytes, decode
 * the CPU decoder's values, with @acc added as mp_k_axpy adds them. It
 * counts device allocations (live and peak) and the pinned host memory of
 * host_alloc (bytes live and peak), so a test can hold the host memory in
 * use to a few chunks; and can refuse, per peer, the Nth copy to the host
 * or the Nth kernel call (fail_d2h_after, fail_kernel_after).
 */
#ifndef MP_FAKE_CUDA_H
#define MP_FAKE_CUDA_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "devk.h"
#include "stage.h"

#define FK_MAXP 4   /* device buffers: one per peer */
#define FK_MAXOPS 3 /* operations whose copies can be failed */

struct fk_mem {
	char *base;       /* mapped PROT_NONE except inside the fake's copies */
	size_t len, maplen;
	int rank;
	int in_calls;     /* copies in queued so far: the operation's index */
	uint8_t *n_in;    /* per byte: copies to the host that ran */
	uint8_t *n_out;   /* per byte: copies back to the device that ran */
};

struct fk_stream;

/* The fake's state; fk_reset clears the failures, the gate and the counters. */
struct fk_state {
	pthread_mutex_t mu; /* everything here, and every access to fake device memory */
	pthread_cond_t cv;  /* something ran on the device, or the gate moved */
	struct fk_mem mem[FK_MAXP];
	unsigned fail_in[FK_MAXOPS];  /* per operation: ranks whose copy in is refused */
	unsigned fail_out[FK_MAXOPS]; /* per operation: ranks whose copy back is refused */
	int gate_rank, gate_op;    /* this copy back waits on the device for gate_open (-1: none) */
	int gate_entered, gate_open;
	int copy_delay_ms;         /* each copy runs no sooner than this after it was queued */
	int no_memops;             /* wait_value: -ENOTSUP */
	int queries, releases, allocs, frees;
	int streams, events;       /* the library's, alive */
	/* Pinned host memory (host_alloc), in bytes: allocated now, and the
	 * most at once (fk_reset brings the peak down to what is live). */
	size_t host_live, host_peak;
	/* The device path. Device allocations (dev_alloc): alive now, and the
	 * most at once (fk_reset: down to live), and their bytes alive. */
	int dev_live, dev_peak;
	size_t dev_bytes;
	int no_kernels;            /* fk_devk_ops.usable: -ENOTSUP, as a build without them */
	/* Per peer (the rank of the buffer the stage was queried on), counted
	 * from fk_reset: copy_async calls to the host (the staging's copies in
	 * and the device path's alike), and encode and decode calls of
	 * fk_devk_ops, the refused ones included. When a count reaches
	 * fail_d2h_after[rank] (fail_kernel_after[rank]), that one call returns
	 * -EIO and queues nothing; the calls before and after it are served.
	 * 0: never. fk_reset clears both. */
	unsigned d2h_calls[FK_MAXP], kernel_calls[FK_MAXP];
	/* Per peer, from fk_reset: bytes of the copy_async calls queued to the
	 * host and to the device (what crosses the bus through the host), and
	 * the longest single copy to the host. */
	size_t d2h_bytes[FK_MAXP], h2d_bytes[FK_MAXP], d2h_max[FK_MAXP];
	/* GPUDirect RDMA: what rdma_order returns (fk_reset: 1, a flush after
	 * each write of the NIC), and per peer the rdma_flush calls. */
	int rdma_order;
	unsigned rdma_flushes[FK_MAXP];
	unsigned fail_d2h_after[FK_MAXP], fail_kernel_after[FK_MAXP];
	/* Per peer, from fk_reset: decodes of a lossy codec with a status word;
	 * the one that reaches bad_decode_after[rank] takes its payload for
	 * malformed when it runs (the status word set, nothing written), as a
	 * payload the GPU rejects. 0: never. */
	unsigned decode_calls[FK_MAXP], bad_decode_after[FK_MAXP];
	struct fk_dalloc *dallocs; /* the allocations of dev_alloc */
	/* the device */
	struct fk_stream *all;     /* every stream with work, or alive */
	pthread_t dev;
	int dev_started, dev_stop;
};
extern struct fk_state fk;

/* The table to point mp_stage_dev_ops at. */
extern const struct mp_stage_dev_ops fk_ops;
/*
 * The table to point mp_devk_ops at: the CPU codecs on fake device memory.
 * usable: -ENOTSUP while fk.no_kernels is set. encode: a dense codec's
 * payload length is the CPU codec's max_encoded, known when the call
 * returns (the run aborts if the CPU encoder then writes another); a
 * sparse codec's is found when the stream gets there, with the residue
 * updated as the CPU codec does, and the call waits for it, as the real
 * kernels do (a residue with a dense codec: -EINVAL). decode takes every codec: what the real decoder checks
 * on the host (the length against @count; a status word where it needs
 * one) returns -EBADMSG or -EINVAL at once; when the stream gets there, a
 * nonzero *d_status writes nothing, and a payload the CPU decoder refuses
 * sets MP_DEVK_BAD in it and writes nothing either. enc_scratch is the CPU
 * codec's scratch_size (0 for all the non-sparse ones); the fake encodes
 * with scratch of its own. A stream of another peer's context: -EIO.
 */
extern const struct mp_devk_ops fk_devk_ops;

/* Device memory of @len bytes for peer @rank, and its release. */
void fk_mem_init(int rank, size_t len);
void fk_mem_fini(int rank);
/* The test's own look at device memory, as a synchronous cudaMemcpy would
 * give it (it does not wait for any stream). */
void fk_read(int rank, size_t off, void *dst, size_t len);
void fk_write(int rank, size_t off, const void *src, size_t len);
/* The same at any fake device address (a dev_alloc allocation or a peer's
 * buffer); aborts on anything else. */
void fk_dread(const void *dev, void *dst, size_t len);
void fk_dwrite(void *dev, const void *src, size_t len);
/* No failures, no gate, no delay, kernels back, counters at 0 (the peaks
 * at what is live). */
void fk_reset(void);
/* Stop the device thread (the end of the test program). */
void fk_shutdown(void);

/* The application's side. A stream of peer @rank's context. In the calls
 * below that take a stream, NULL is the legacy default stream. */
struct fk_stream *fk_stream_new(int rank);
/* Wait until everything queued on @s has run: 0, or -ETIMEDOUT after
 * @timeout_ms (then the work stays queued). Then free it (fk_stream_free). */
int fk_stream_sync(struct fk_stream *s, int timeout_ms);
void fk_stream_free(struct fk_stream *s);
/* A kernel on @s that writes @len bytes of @src (copied now) at @off of
 * @rank's device memory, @delay_ms after it is queued or the stream gets
 * there, whichever is later. */
void fk_kernel_write(struct fk_stream *s, int rank, size_t off, const void *src, size_t len,
		     int delay_ms);
/* A kernel on @s that copies @len bytes at @off of @rank's device memory to
 * @dst when the stream gets there, and then sets *@ran to 1 (read both under
 * fk.mu, or after fk_stream_sync). */
void fk_probe(struct fk_stream *s, int rank, size_t off, void *dst, size_t len, int *ran);
/* Hold @s until fk_let_go(@go): the work queued after waits (a kernel that
 * takes as long as the test says). */
void fk_hold(struct fk_stream *s, const int *go);
void fk_let_go(int *go);

#endif
