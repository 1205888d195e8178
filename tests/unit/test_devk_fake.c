/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The device path's seams against the FAKE of tests/fakes/fake_cuda.c, no
 * GPU needed: its device allocations, device copies and fills
 * (struct mp_stage_dev_ops, stage.h) and its kernels (fk_devk_ops, struct
 * mp_devk_ops of devk.h), which run the CPU codecs on the fake's device
 * thread. The tables are called directly, as the group all-reduce will.
 *
 * Checked: for none, fp16, bf16, uniform8 and blockwise8, the payload
 * encode leaves in device memory is the CPU encoder's byte for byte, with
 * its length known when the call returns; decode gives the CPU decoder's
 * values bit for bit, and decode with @acc the CPU decode plus mp_k_axpy.
 * A payload the CPU refuses sets MP_DEVK_BAD and leaves the destination as
 * it was, and a good payload decoded under the same status word writes
 * nothing; a length that does not match the count returns -EBADMSG with
 * nothing queued. fill32 and copy_d2d write exactly their ranges. Stream
 * order: a decode queued after a (delayed) copy to the device reads the
 * copied bytes, and a copy back to the host queued after it the decoded
 * values, not before. The per-peer fault counters refuse exactly the Nth
 * copy to the host or kernel call of that peer, and nothing is queued for
 * it. Pinned host memory and device allocations are counted, live and at
 * their peak. usable refuses the sparse codecs and a build without
 * kernels; the real table (mp_devk_cuda_ops) refuses on a host without a
 * CUDA driver, and says why.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dlfcn.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <moshpit/moshpit.h>

#include "codec.h"
#include "devk.h"
#include "fake_cuda.h"
#include "mp_build_config.h"
#include "mp_kernels.h"
#include "stage.h"

#define N 3001 /* not a multiple of the block: a short last block */
#define SYNC_MS 5000

static const struct mp_stage_dev_ops *dev = &fk_ops;
static const struct mp_devk_ops *k = &fk_devk_ops;

/* Peer @rank's buffer queried as the staging would: the context the
 * allocations and streams below belong to. */
static struct mp_stage_dev peer(int rank)
{
	struct mp_stage_dev d;
	char why[128];

	assert_int_equal(dev->query(fk.mem[rank].base, fk.mem[rank].len, &d, why, sizeof(why)), 0);
	return d;
}

/* Device allocations before the test (a failed one may leave some). */
static int live0;

static int setup(void **state)
{
	(void)state;
	fk_mem_init(0, 1 << 16);
	fk_mem_init(1, 1 << 16);
	fk_reset();
	live0 = fk.dev_live;
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	assert_int_equal(fk.dev_live, live0); /* every test frees what it allocated */
	fk_mem_fini(0);
	fk_mem_fini(1);
	return 0;
}

/* Values of several scales and signs, the same every run. */
static void fill(float *x, size_t n, uint32_t seed)
{
	for (size_t i = 0; i < n; i++) {
		seed = seed * 1664525u + 1013904223u;
		x[i] = ((float)(seed >> 8) / 16777216.0f - 0.5f) * (i % 7 == 0 ? 40.0f : 1.5f);
	}
}

static void *dalloc(const struct mp_stage_dev *d, size_t len)
{
	void *p = NULL;

	assert_int_equal(dev->dev_alloc(d, len, &p), 0);
	assert_non_null(p);
	return p;
}

static uint32_t read_status(const uint32_t *d_status)
{
	uint32_t s;

	fk_dread(d_status, &s, sizeof(s));
	return s;
}

static void one_codec(int codec)
{
	struct mp_stage_dev d = peer(0);
	const struct mp_codec_ops *c = mp_codec_by_id((unsigned)codec);
	struct mp_codec_params p;
	static float src[N], got[N], want[N], acc0[N];
	char why[128] = "";
	void *st = NULL;

	mp_codec_params_default(&p);
	p.block = 256;
	assert_non_null(c);
	assert_int_equal(k->usable(&d, codec, why, sizeof(why)), 0);
	size_t max = k->max_encoded(codec, &p, N);
	assert_int_equal(max, c->max_encoded(&p, N));
	assert_int_equal(k->enc_scratch(codec, &p, N), 0);
	assert_int_equal(k->dec_scratch(codec, max, N), 0);

	fill(src, N, 7u + (uint32_t)codec);
	fill(acc0, N, 99u);
	float *d_src = dalloc(&d, sizeof(src)), *d_dst = dalloc(&d, sizeof(src));
	void *d_pl = dalloc(&d, max);
	uint32_t *d_status = dalloc(&d, 4);
	fk_dwrite(d_src, src, sizeof(src));
	assert_int_equal(dev->stream_create(&d, &st), 0);

	/* Encode: the CPU's bytes, the length known at once. */
	size_t len = 0;
	assert_int_equal(k->encode(&d, codec, &p, d_src, NULL, N, d_pl, max - 1, &len, NULL, 0, st),
			 -ENOSPC);
	assert_int_equal(k->encode(&d, codec, &p, d_src, NULL, N, d_pl, max, &len, NULL, 0, st), 0);
	assert_int_equal(len, max);
	unsigned char *cpu = malloc(max), *gpu = malloc(max);
	size_t cpu_len = 0;
	assert_non_null(cpu);
	assert_non_null(gpu);
	assert_int_equal(c->encode(&p, src, NULL, N, cpu, max, &cpu_len, NULL), 0);
	assert_int_equal(cpu_len, len);
	assert_int_equal(fk_stream_sync(st, SYNC_MS), 0);
	fk_dread(d_pl, gpu, len);
	assert_memory_equal(gpu, cpu, len);

	/* Decode: the CPU decoder's values, bit for bit. */
	assert_int_equal(dev->fill32(&d, d_status, 0, 1, st), 0);
	assert_int_equal(k->decode(&d, codec, d_pl, len, d_dst, N, 0.0f, 0, d_status, NULL, 0, st), 0);
	assert_int_equal(fk_stream_sync(st, SYNC_MS), 0);
	assert_int_equal(read_status(d_status), 0);
	fk_dread(d_dst, got, sizeof(got));
	assert_int_equal(c->decode(cpu, len, want, N), 0);
	assert_memory_equal(got, want, sizeof(got));

	/* With acc: the CPU decode, added as mp_k_axpy adds it; the same
	 * bits as the CPU's own decode_acc. */
	const float w = 0.3711f;
	fk_dwrite(d_dst, acc0, sizeof(acc0));
	assert_int_equal(k->decode(&d, codec, d_pl, len, d_dst, N, w, 1, d_status, NULL, 0, st), 0);
	assert_int_equal(fk_stream_sync(st, SYNC_MS), 0);
	assert_int_equal(read_status(d_status), 0);
	fk_dread(d_dst, got, sizeof(got));
	memcpy(want, acc0, sizeof(want));
	static float tmp[N];
	assert_int_equal(c->decode(cpu, len, tmp, N), 0);
	mp_k_axpy(want, tmp, w, N);
	assert_memory_equal(got, want, sizeof(got));
	memcpy(tmp, acc0, sizeof(tmp));
	assert_int_equal(c->decode_acc(cpu, len, tmp, N, w), 0);
	assert_memory_equal(got, tmp, sizeof(got));
	/* And not the plain values: the sum did happen. */
	assert_true(memcmp(got, acc0, sizeof(got)) != 0);

	dev->stream_destroy(&d, st);
	dev->dev_free(&d, d_src);
	dev->dev_free(&d, d_dst);
	dev->dev_free(&d, d_pl);
	dev->dev_free(&d, d_status);
	free(cpu);
	free(gpu);
}

static void kernels_match_cpu(void **state)
{
	(void)state;
	one_codec(MP_CODEC_NONE);
	one_codec(MP_CODEC_FP16);
	one_codec(MP_CODEC_BF16);
	one_codec(MP_CODEC_UNIFORM8);
	one_codec(MP_CODEC_BLOCKWISE8);
	/* Four buffers a codec, all freed. */
	assert_int_equal(fk.dev_peak, live0 + 4);
}

/*
 * The sparse codecs: encode takes the residue on the device and updates it
 * as the CPU codec updates its own, gives the CPU's bytes, and returns
 * their length, which only the device knew, once the stream got there.
 */
static void sparse_codecs(void **state)
{
	static const int codecs[] = {MP_CODEC_TOPK, MP_CODEC_ADACOMP};
	struct mp_stage_dev d = peer(0);
	static float src[N], res[N], res_cpu[N], got[N];
	struct mp_codec_params p;
	void *st = NULL;

	(void)state;
	mp_codec_params_default(&p);
	assert_int_equal(dev->stream_create(&d, &st), 0);
	for (int i = 0; i < 2; i++) {
		const struct mp_codec_ops *c = mp_codec_by_id((unsigned)codecs[i]);
		size_t max = k->max_encoded(codecs[i], &p, N), len = 0, cpu_len = 0;
		size_t sb = k->enc_scratch(codecs[i], &p, N);
		float *d_src = dalloc(&d, sizeof(src)), *d_res = dalloc(&d, sizeof(res));
		void *d_pl = dalloc(&d, max), *d_scr = sb ? dalloc(&d, sb) : NULL;
		unsigned char *cpu = malloc(max), *gpu = malloc(max);
		void *scr = NULL;

		assert_non_null(cpu);
		assert_non_null(gpu);
		fill(src, N, 11u + (uint32_t)i);
		fill(res, N, 23u + (uint32_t)i);
		fk_dwrite(d_src, src, sizeof(src));
		fk_dwrite(d_res, res, sizeof(res));
		assert_int_equal(k->encode(&d, codecs[i], &p, d_src, d_res, N, d_pl, max, &len, d_scr,
					   sb, st), 0);
		memcpy(res_cpu, res, sizeof(res));
		if (c->scratch_size)
			assert_int_equal(posix_memalign(&scr, 64, c->scratch_size(&p, N) + 64), 0);
		assert_int_equal(c->encode(&p, src, res_cpu, N, cpu, max, &cpu_len, scr), 0);
		assert_int_equal(len, cpu_len);
		assert_true(len < max);
		fk_dread(d_pl, gpu, len);
		assert_memory_equal(gpu, cpu, len);
		fk_dread(d_res, got, sizeof(got));
		assert_memory_equal(got, res_cpu, sizeof(got));
		assert_true(memcmp(res_cpu, res, sizeof(res)) != 0);
		free(scr);
		free(cpu);
		free(gpu);
		dev->dev_free(&d, d_src);
		dev->dev_free(&d, d_res);
		dev->dev_free(&d, d_pl);
		if (d_scr)
			dev->dev_free(&d, d_scr);
	}
	dev->stream_destroy(&d, st);
}

/* A bad payload sets the status and writes nothing, and so does every
 * payload decoded under that status after it; lengths are checked at once. */
static void bad_payload(void **state)
{
	struct mp_stage_dev d = peer(1);
	const struct mp_codec_ops *c = mp_codec_by_id(MP_CODEC_UNIFORM8);
	struct mp_codec_params p;
	static float src[N], acc0[N], got[N];
	void *st = NULL;

	(void)state;
	mp_codec_params_default(&p);
	size_t max = c->max_encoded(&p, N), len = 0;
	unsigned char *good = malloc(max), *bad = malloc(max);
	assert_non_null(good);
	assert_non_null(bad);
	fill(src, N, 5);
	fill(acc0, N, 6);
	assert_int_equal(c->encode(&p, src, NULL, N, good, max, &len, NULL), 0);
	memcpy(bad, good, len);
	const float nan = NAN;
	memcpy(bad + 4 * 17, &nan, 4); /* a table entry: not finite */
	assert_int_equal(c->decode(bad, len, got, N), -EBADMSG);

	void *d_good = dalloc(&d, len), *d_bad = dalloc(&d, len);
	float *d_dst = dalloc(&d, sizeof(acc0));
	uint32_t *d_status = dalloc(&d, 4);
	fk_dwrite(d_good, good, len);
	fk_dwrite(d_bad, bad, len);
	fk_dwrite(d_dst, acc0, sizeof(acc0));
	assert_int_equal(dev->stream_create(&d, &st), 0);

	/* Lengths the host can check: -EBADMSG, and nothing queued (a
	 * queued decode of a short payload would have set the status). */
	assert_int_equal(dev->fill32(&d, d_status, 0, 1, st), 0);
	assert_int_equal(k->decode(&d, MP_CODEC_UNIFORM8, d_good, len - 1, d_dst, N, 1.0f, 1,
				   d_status, NULL, 0, st), -EBADMSG);
	assert_int_equal(k->decode(&d, MP_CODEC_UNIFORM8, d_good, len, d_dst, N + 1, 1.0f, 1,
				   d_status, NULL, 0, st), -EBADMSG);
	assert_int_equal(k->decode(&d, MP_CODEC_NONE, d_good, 4 * 10 + 1, d_dst, 10, 1.0f, 1,
				   d_status, NULL, 0, st), -EBADMSG);
	assert_int_equal(k->decode(&d, MP_CODEC_BLOCKWISE8, d_good, 4 + 10 + 3, d_dst, 10, 1.0f, 1,
				   d_status, NULL, 0, st), -EBADMSG);
	/* uniform8 is checked on the device: it needs a status word. */
	assert_int_equal(k->decode(&d, MP_CODEC_UNIFORM8, d_good, len, d_dst, N, 1.0f, 1, NULL,
				   NULL, 0, st), -EINVAL);
	assert_int_equal(fk_stream_sync(st, SYNC_MS), 0);
	assert_int_equal(read_status(d_status), 0);
	fk_dread(d_dst, got, sizeof(got));
	assert_memory_equal(got, acc0, sizeof(got));

	/* The bad one, then a good one under the same word. */
	assert_int_equal(k->decode(&d, MP_CODEC_UNIFORM8, d_bad, len, d_dst, N, 1.0f, 1, d_status,
				   NULL, 0, st), 0);
	assert_int_equal(k->decode(&d, MP_CODEC_UNIFORM8, d_good, len, d_dst, N, 1.0f, 0, d_status,
				   NULL, 0, st), 0);
	assert_int_equal(fk_stream_sync(st, SYNC_MS), 0);
	assert_int_equal(read_status(d_status), MP_DEVK_BAD);
	fk_dread(d_dst, got, sizeof(got));
	assert_memory_equal(got, acc0, sizeof(got));

	/* Status cleared: the good one decodes. */
	assert_int_equal(dev->fill32(&d, d_status, 0, 1, st), 0);
	assert_int_equal(k->decode(&d, MP_CODEC_UNIFORM8, d_good, len, d_dst, N, 1.0f, 0, d_status,
				   NULL, 0, st), 0);
	assert_int_equal(fk_stream_sync(st, SYNC_MS), 0);
	assert_int_equal(read_status(d_status), 0);
	fk_dread(d_dst, got, sizeof(got));
	assert_int_equal(c->decode(good, len, acc0, N), 0);
	assert_memory_equal(got, acc0, sizeof(got));

	dev->stream_destroy(&d, st);
	dev->dev_free(&d, d_good);
	dev->dev_free(&d, d_bad);
	dev->dev_free(&d, d_dst);
	dev->dev_free(&d, d_status);
	free(good);
	free(bad);
}

static void fill_and_copy(void **state)
{
	struct mp_stage_dev d = peer(0);
	uint32_t words[130], got[130];
	unsigned char bytes[1000], gotb[1000];
	void *st = NULL;

	(void)state;
	for (size_t i = 0; i < 130; i++)
		words[i] = 0x01010101u * (uint32_t)i;
	uint32_t *a = dalloc(&d, sizeof(words));
	fk_dwrite(a, words, sizeof(words));
	assert_int_equal(dev->stream_create(&d, &st), 0);
	/* Words 3..102 only. */
	assert_int_equal(dev->fill32(&d, a + 3, 0xdeadbeefu, 100, st), 0);
	assert_int_equal(fk_stream_sync(st, SYNC_MS), 0);
	fk_dread(a, got, sizeof(got));
	for (size_t i = 0; i < 130; i++)
		assert_int_equal(got[i], i >= 3 && i < 103 ? 0xdeadbeefu : words[i]);

	/* Device to device: allocation to allocation, and out of the peer's
	 * own buffer (staged memory is device memory too). */
	for (size_t i = 0; i < sizeof(bytes); i++)
		bytes[i] = (unsigned char)(i * 7 + 1);
	unsigned char *b = dalloc(&d, sizeof(bytes)), *e = dalloc(&d, sizeof(bytes));
	fk_dwrite(b, bytes, sizeof(bytes));
	memset(gotb, 0xee, sizeof(gotb));
	fk_dwrite(e, gotb, sizeof(gotb));
	assert_int_equal(dev->copy_d2d(&d, e + 10, b + 20, 500, st), 0);
	fk_write(0, 100, bytes, sizeof(bytes));
	assert_int_equal(dev->copy_d2d(&d, e + 600, fk.mem[0].base + 100, 300, st), 0);
	assert_int_equal(fk_stream_sync(st, SYNC_MS), 0);
	fk_dread(e, gotb, sizeof(gotb));
	for (size_t i = 0; i < sizeof(gotb); i++) {
		unsigned char want = i >= 10 && i < 510 ? bytes[i + 10] :
				     i >= 600 && i < 900 ? bytes[i - 600] : 0xee;
		assert_int_equal(gotb[i], want);
	}
	dev->stream_destroy(&d, st);
	dev->dev_free(&d, a);
	dev->dev_free(&d, b);
	dev->dev_free(&d, e);
}

/* Under fk.mu, as the device thread writes it. */
static float host_at(const float *h, size_t i)
{
	float v;

	pthread_mutex_lock(&fk.mu);
	v = h[i];
	pthread_mutex_unlock(&fk.mu);
	return v;
}

/* The work of a stream runs in order: a decode after a late copy to the
 * device reads its bytes, a copy back after the decode its values. */
static void stream_order(void **state)
{
	struct mp_stage_dev d = peer(1);
	enum { n = 1000 };
	float src[n], want[n], sentinel = -12345.0f;
	void *st = NULL, *pin = NULL, *pout = NULL;

	(void)state;
	fill(src, n, 3);
	const struct mp_codec_ops *c = mp_codec_by_id(MP_CODEC_FP16);
	size_t len = c->max_encoded(NULL, n), l = 0;
	assert_int_equal(dev->host_alloc(&d, len, &pin), 0);
	assert_int_equal(dev->host_alloc(&d, sizeof(want), &pout), 0);
	assert_int_equal(c->encode(NULL, src, NULL, n, pin, len, &l, NULL), 0);
	assert_int_equal(c->decode(pin, len, want, n), 0);
	for (size_t i = 0; i < n; i++)
		((float *)pout)[i] = sentinel;

	void *d_pl = dalloc(&d, len);
	float *d_dst = dalloc(&d, sizeof(want));
	uint32_t *d_status = dalloc(&d, 4);
	assert_int_equal(dev->stream_create(&d, &st), 0);
	pthread_mutex_lock(&fk.mu);
	fk.copy_delay_ms = 50;
	pthread_mutex_unlock(&fk.mu);
	assert_int_equal(dev->fill32(&d, d_status, 0, 1, st), 0);
	assert_int_equal(dev->copy_async(&d, d_pl, pin, len, 1, st), 0);
	assert_int_equal(k->decode(&d, MP_CODEC_FP16, d_pl, len, d_dst, n, 0.0f, 0, d_status, NULL,
				   0, st), 0);
	assert_int_equal(dev->copy_async(&d, pout, d_dst, sizeof(want), 0, st), 0);
	/* Queued, not run: the copies wait 50 ms. */
	assert_true(host_at(pout, 0) == sentinel && host_at(pout, n - 1) == sentinel);
	assert_int_equal(fk_stream_sync(st, SYNC_MS), 0);
	assert_int_equal(read_status(d_status), 0);
	assert_memory_equal(pout, want, sizeof(want));

	/* Across streams, an event orders them as well: the decode on st2
	 * waits for the copy on st. */
	void *st2 = NULL, *ev = NULL;
	char why[128];
	for (size_t i = 0; i < n; i++)
		((float *)pout)[i] = sentinel;
	assert_int_equal(dev->stream_create(&d, &st2), 0);
	assert_int_equal(dev->event_create(&d, &ev), 0);
	assert_int_equal(c->encode(NULL, want, NULL, n, pin, len, &l, NULL), 0);
	assert_int_equal(dev->fill32(&d, d_dst, 0, n, st), 0);
	assert_int_equal(dev->copy_async(&d, d_pl, pin, len, 1, st), 0);
	assert_int_equal(dev->event_record(&d, ev, st, why, sizeof(why)), 0);
	assert_int_equal(dev->stream_wait_event(&d, st2, ev), 0);
	assert_int_equal(k->decode(&d, MP_CODEC_FP16, d_pl, len, d_dst, n, 2.0f, 1, d_status, NULL,
				   0, st2), 0);
	assert_int_equal(dev->copy_async(&d, pout, d_dst, sizeof(want), 0, st2), 0);
	assert_int_equal(fk_stream_sync(st2, SYNC_MS), 0);
	for (size_t i = 0; i < n; i++)
		assert_true(((float *)pout)[i] == 2.0f * want[i]); /* fp16 of fp16 values: exact */

	pthread_mutex_lock(&fk.mu);
	fk.copy_delay_ms = 0;
	pthread_mutex_unlock(&fk.mu);
	dev->event_destroy(&d, ev);
	dev->stream_destroy(&d, st2);
	dev->stream_destroy(&d, st);
	dev->dev_free(&d, d_pl);
	dev->dev_free(&d, d_dst);
	dev->dev_free(&d, d_status);
	dev->host_free(&d, pin);
	dev->host_free(&d, pout);
}

/* fail_d2h_after and fail_kernel_after: exactly the Nth call of that peer. */
static void fault_counters(void **state)
{
	struct mp_stage_dev d0 = peer(0), d1 = peer(1);
	float x[64], y[64];
	void *st0 = NULL, *st1 = NULL, *h = NULL;

	(void)state;
	fill(x, 64, 11);
	assert_int_equal(dev->host_alloc(&d1, sizeof(x), &h), 0);
	float *a0 = dalloc(&d0, sizeof(x)), *a1 = dalloc(&d1, sizeof(x));
	void *pl = dalloc(&d0, sizeof(x));
	uint32_t *status = dalloc(&d0, 4);
	fk_dwrite(a0, x, sizeof(x));
	fk_dwrite(a1, x, sizeof(x));
	assert_int_equal(dev->stream_create(&d0, &st0), 0);
	assert_int_equal(dev->stream_create(&d1, &st1), 0);

	pthread_mutex_lock(&fk.mu);
	fk.fail_d2h_after[1] = 2;
	fk.fail_kernel_after[0] = 2;
	pthread_mutex_unlock(&fk.mu);

	/* Peer 1's copies to the host: the second is refused, and queued nothing. */
	for (int i = 1; i <= 3; i++) {
		memset(h, 0, sizeof(x));
		assert_int_equal(dev->copy_async(&d1, h, a1, sizeof(x), 0, st1), i == 2 ? -EIO : 0);
		assert_int_equal(fk_stream_sync(st1, SYNC_MS), 0);
		memcpy(y, h, sizeof(y));
		if (i == 2) {
			for (int j = 0; j < 64; j++)
				assert_true(y[j] == 0.0f);
		} else {
			assert_memory_equal(y, x, sizeof(x));
		}
	}
	/* Peer 0's are its own count; copies to the device are not counted. */
	assert_int_equal(dev->copy_async(&d0, h, a0, sizeof(x), 0, st0), 0);
	assert_int_equal(dev->copy_async(&d0, a0, h, sizeof(x), 1, st0), 0);
	assert_int_equal(dev->copy_async(&d0, h, a0, sizeof(x), 0, st0), 0);
	assert_int_equal(fk_stream_sync(st0, SYNC_MS), 0);

	/* Peer 0's kernel calls: the second (an encode here) is refused. */
	size_t len = 0;
	unsigned char zero[256] = {0}, got[256];
	fk_dwrite(pl, zero, sizeof(x));
	assert_int_equal(dev->fill32(&d0, status, 0, 1, st0), 0);
	assert_int_equal(k->decode(&d0, MP_CODEC_NONE, a0, sizeof(x), a0, 64, 0.0f, 0, status, NULL,
				   0, st0), 0);
	assert_int_equal(k->encode(&d0, MP_CODEC_NONE, NULL, a0, NULL, 64, pl, sizeof(x), &len, NULL, 0,
				   st0), -EIO);
	assert_int_equal(fk_stream_sync(st0, SYNC_MS), 0);
	fk_dread(pl, got, sizeof(x));
	assert_memory_equal(got, zero, sizeof(x)); /* nothing was queued */
	assert_int_equal(k->encode(&d0, MP_CODEC_NONE, NULL, a0, NULL, 64, pl, sizeof(x), &len, NULL, 0,
				   st0), 0);
	assert_int_equal(fk_stream_sync(st0, SYNC_MS), 0);
	fk_dread(pl, got, sizeof(x));
	assert_memory_equal(got, x, sizeof(x));
	/* Peer 1's kernels are not peer 0's. */
	assert_int_equal(k->decode(&d1, MP_CODEC_NONE, a1, sizeof(x), a1, 64, 0.0f, 0, NULL, NULL, 0,
				   st1), 0);
	assert_int_equal(fk_stream_sync(st1, SYNC_MS), 0);

	pthread_mutex_lock(&fk.mu);
	assert_int_equal(fk.d2h_calls[1], 3);
	assert_int_equal(fk.d2h_calls[0], 2);
	assert_int_equal(fk.kernel_calls[0], 3);
	assert_int_equal(fk.kernel_calls[1], 1);
	pthread_mutex_unlock(&fk.mu);
	fk_reset();
	assert_int_equal(fk.d2h_calls[1] + fk.kernel_calls[0] + fk.fail_d2h_after[1] +
			 fk.fail_kernel_after[0], 0);

	dev->stream_destroy(&d0, st0);
	dev->stream_destroy(&d1, st1);
	dev->dev_free(&d0, a0);
	dev->dev_free(&d1, a1);
	dev->dev_free(&d0, pl);
	dev->dev_free(&d0, status);
	dev->host_free(&d1, h);
}

static void pinned_accounting(void **state)
{
	struct mp_stage_dev d = peer(0);
	void *h[4] = {NULL}, *a = NULL, *b = NULL;

	(void)state;
	fk_reset();
	size_t base = fk.host_live;
	assert_int_equal(fk.host_peak, base);
	assert_int_equal(dev->host_alloc(&d, 1000, &h[0]), 0);
	assert_int_equal(dev->host_alloc(&d, 2000, &h[1]), 0);
	assert_int_equal(dev->host_alloc(&d, 3000, &h[2]), 0);
	assert_int_equal(fk.host_live, base + 6000);
	assert_int_equal(fk.host_peak, base + 6000);
	dev->host_free(&d, h[1]);
	assert_int_equal(dev->host_alloc(&d, 1500, &h[3]), 0);
	assert_int_equal(fk.host_live, base + 5500);
	assert_int_equal(fk.host_peak, base + 6000);
	fk_reset(); /* the peak comes down to what is live */
	assert_int_equal(fk.host_peak, base + 5500);
	dev->host_free(&d, h[0]);
	dev->host_free(&d, h[2]);
	dev->host_free(&d, h[3]);
	assert_int_equal(fk.host_live, base);
	assert_int_equal(fk.host_peak, base + 5500);
	assert_int_equal(fk.allocs, 0); /* counted from fk_reset */
	assert_int_equal(fk.frees, 3);

	/* Device allocations: live, peak and bytes. */
	int live = fk.dev_live;
	assert_int_equal(dev->dev_alloc(&d, 0, &a), -ENOMEM);
	assert_int_equal(dev->dev_alloc(&d, 100, &a), 0);
	assert_int_equal(dev->dev_alloc(&d, 5000, &b), 0);
	assert_int_equal((uintptr_t)a % 256, 0);
	assert_int_equal((uintptr_t)b % 256, 0);
	assert_int_equal(fk.dev_live, live + 2);
	size_t bytes = fk.dev_bytes;
	dev->dev_free(&d, a);
	assert_int_equal(bytes - fk.dev_bytes, 100);
	assert_int_equal(dev->dev_alloc(&d, 100, &a), 0);
	dev->dev_free(&d, a);
	dev->dev_free(&d, NULL);
	assert_int_equal(fk.dev_live, live + 1);
	assert_int_equal(fk.dev_peak, live + 2);
	dev->dev_free(&d, b);
	assert_int_equal(fk.dev_live, live);
}

static void usable_refusals(void **state)
{
	struct mp_stage_dev d = peer(0);
	char why[256] = "";
	size_t len = 0;

	(void)state;
	assert_int_equal(k->usable(&d, MP_CODEC_TOPK, why, sizeof(why)), 0);
	assert_int_equal(k->usable(&d, MP_CODEC_ADACOMP, why, sizeof(why)), 0);
	float *a = dalloc(&d, 4096);
	/* A residue is for the sparse codecs only. */
	assert_int_equal(k->encode(&d, MP_CODEC_FP16, NULL, a, a + 16, 16, a + 32, 512, &len, NULL, 0,
				   NULL), -EINVAL);
	pthread_mutex_lock(&fk.mu);
	fk.no_kernels = 1;
	pthread_mutex_unlock(&fk.mu);
	why[0] = '\0';
	assert_int_equal(k->usable(&d, MP_CODEC_FP16, why, sizeof(why)), -ENOTSUP);
	assert_non_null(strstr(why, "no kernels"));
	fk_reset();
	assert_int_equal(k->usable(&d, MP_CODEC_FP16, why, sizeof(why)), 0);
	dev->dev_free(&d, a);

	/* The real table is the default, and the one this host cannot use. */
	assert_ptr_equal(mp_devk_ops, &mp_devk_cuda_ops);
	assert_true(mp_devk_cuda_ops.usable(&d, MP_CODEC_TOPK, why, sizeof(why)) == -ENOTSUP);
#ifdef MP_HAVE_CUDA
	void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	if (h) {
		dlclose(h);
		return; /* a CUDA driver: d is no context of its */
	}
	why[0] = '\0';
	assert_int_equal(mp_devk_cuda_ops.usable(&d, MP_CODEC_FP16, why, sizeof(why)), -ENOTSUP);
	assert_non_null(strstr(why, "context cannot be made current"));
#else
	assert_non_null(strstr(why, "built without the CUDA kernels"));
	assert_int_equal(mp_devk_cuda_ops.encode(&d, MP_CODEC_FP16, NULL, NULL, NULL, 0, NULL, 0,
						 &len, NULL, 0, NULL), -ENOTSUP);
#endif
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(kernels_match_cpu, setup, teardown),
		cmocka_unit_test_setup_teardown(bad_payload, setup, teardown),
		cmocka_unit_test_setup_teardown(fill_and_copy, setup, teardown),
		cmocka_unit_test_setup_teardown(stream_order, setup, teardown),
		cmocka_unit_test_setup_teardown(fault_counters, setup, teardown),
		cmocka_unit_test_setup_teardown(pinned_accounting, setup, teardown),
		cmocka_unit_test_setup_teardown(usable_refusals, setup, teardown),
		cmocka_unit_test_setup_teardown(sparse_codecs, setup, teardown),
	};
	int rc = cmocka_run_group_tests(tests, NULL, NULL);
	fk_shutdown();
	return rc;
}
