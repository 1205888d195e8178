/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * A FAKE of the CUDA driver, for tests: a struct mp_stage_dev_ops
 * (src/xfer/stage.h) that stands in for libcuda.so.1 behind the core's host
 * staging of CUDA memory (point mp_stage_dev_ops at fk_ops). No GPU is
 * needed or touched.
 *
 * Its "device memory" (one buffer per peer, fk_mem_init) is host memory that
 * it maps with no access at all and opens only inside its own two copies,
 * so a read or write of it by the library anywhere else (the reducer, a
 * codec, a send) faults. It counts, per byte, the copies to the host and
 * back, can fail either copy for chosen peers and operations (fail_in,
 * fail_out), and can hold one peer's copy back until the test lets it go
 * (gate_rank, gate_op, gate_open). The library calls the table from its
 * progress threads: everything goes under fk.mu, and the table's checks
 * abort rather than use cmocka's asserts (only the test's own calls,
 * fk_mem_init and the like, use those).
 */
#ifndef MP_FAKE_CUDA_H
#define MP_FAKE_CUDA_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "stage.h"

#define FK_MAXP 4   /* device buffers: one per peer */
#define FK_MAXOPS 3 /* operations whose copies can be failed */

struct fk_mem {
	char *base;       /* mapped PROT_NONE except inside the fake's copies */
	size_t len, maplen;
	int rank;
	int in_calls;     /* to_host calls so far: the operation's index */
	uint8_t *n_in;    /* per byte: copies to the host */
	uint8_t *n_out;   /* per byte: copies back to the device */
};

/* The fake's state; fk_reset clears the failures, the gate and the counters. */
struct fk_state {
	pthread_mutex_t mu; /* everything here, and every access to fake device memory */
	pthread_cond_t cv;
	struct fk_mem mem[FK_MAXP];
	unsigned fail_in[FK_MAXOPS];  /* per operation: ranks whose copy in fails */
	unsigned fail_out[FK_MAXOPS]; /* per operation: ranks whose copy back fails */
	int gate_rank, gate_op;    /* this copy back waits for gate_open (-1: none) */
	int gate_entered, gate_open;
	int queries, releases, allocs, frees;
};
extern struct fk_state fk;

/* The table to point mp_stage_dev_ops at. */
extern const struct mp_stage_dev_ops fk_ops;

/* Device memory of @len bytes for peer @rank, and its release. */
void fk_mem_init(int rank, size_t len);
void fk_mem_fini(int rank);
/* The test's own look at device memory, as cudaMemcpy would give it. */
void fk_read(int rank, size_t off, void *dst, size_t len);
void fk_write(int rank, size_t off, const void *src, size_t len);
/* No failures, no gate, counters at 0. */
void fk_reset(void);

#endif
