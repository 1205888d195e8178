/* SPDX-License-Identifier: BSD-3-Clause */
/**
 * @file reqq.h
 * @brief Driver SDK: request pool and FIFO queues of posted requests.
 *
 * Request bookkeeping shared by the drivers: a pool of request objects and
 * FIFO queues of posted requests, both threaded through one link embedded
 * in the driver's own request struct (intrusive, container_of style). The
 * queues serve connection requests too: the connections that wait for
 * accept() (rdma, dpdk's reliable layer) queue on their own link.
 *
 * Why intrusive: a driver hands its request objects out as mp_drv_req
 * handles and keeps every field of them itself; the queues only need the
 * order, so they link the objects in place and never allocate. A request
 * sits on at most one list at a time (the pool's free list or one queue),
 * which is why one link serves both.
 *
 * Why a pool: requests are posted and tested at message rate; taking them
 * from blocks that live as long as the driver instance keeps malloc off the
 * data path, and keeps a tested (freed) handle pointing at memory the
 * driver still owns, so test() can refuse it instead of reading freed
 * memory.
 *
 * Type checks: mp_reqq_entry() does not compile unless the member it names
 * is a struct mp_reqq_link, so a link is never turned back into its object
 * through some other member. What it cannot check is that a queue only
 * ever holds one type; each driver keeps its queues and pool to itself.
 *
 * Locking is the caller's: the drivers serialise on their own (one thread
 * per instance, or the loop driver's global lock).
 *
 * Header only (static inline and macros): nothing here is part of
 * libmoshpit's ABI, so a driver built out of the tree carries its own copy
 * of the code and only the layout of its own structs matters. C11
 * (_Generic, max_align_t).
 */
#ifndef MOSHPIT_SDK_REQQ_H
#define MOSHPIT_SDK_REQQ_H

#include <errno.h>
#include <stddef.h>
#include <stdlib.h>

/** The link a driver embeds in each request (or connection) it queues. */
struct mp_reqq_link {
	struct mp_reqq_link *next; /**< NULL when last, or on no list */
};

/** A FIFO of requests; zero-initialised is empty. */
struct mp_reqq {
	struct mp_reqq_link *head;
	struct mp_reqq_link *tail;
	int n; /**< length: drivers bound what a connection may have posted */
};

/**
 * The object around @link, NULL for NULL. @off is the link's offset in it;
 * callers go through mp_reqq_entry(), which computes and checks it.
 */
static inline void *mp_reqq_obj_(struct mp_reqq_link *link, size_t off)
{
	return link ? (void *)((char *)link - off) : NULL;
}

/** Offset of @member in @type; a compile error unless it is a struct mp_reqq_link. */
#define MP_REQQ_OFF_(type, member) \
	(offsetof(type, member) + _Generic(((type *)0)->member, struct mp_reqq_link: 0))

/** The @type object whose @member is @link; NULL when @link is NULL. */
#define mp_reqq_entry(link, type, member) \
	((type *)mp_reqq_obj_((link), MP_REQQ_OFF_(type, member)))

/** Oldest request of @q, left in place; NULL when empty. */
#define mp_reqq_first(q, type, member) mp_reqq_entry((q)->head, type, member)

/** The request queued after @obj (a @type *), NULL at the end. */
#define mp_reqq_next(obj, type, member) mp_reqq_entry((obj)->member.next, type, member)

/** Take the oldest request off @q; NULL when empty. */
#define mp_reqq_pop_entry(q, type, member) mp_reqq_entry(mp_reqq_pop(q), type, member)

/** Queue @p link last on @p q. */
static inline void mp_reqq_push(struct mp_reqq *q, struct mp_reqq_link *link)
{
	link->next = NULL;
	if (q->tail)
		q->tail->next = link;
	else
		q->head = link;
	q->tail = link;
	q->n++;
}

/** Take the oldest link off @p q; NULL when empty. */
static inline struct mp_reqq_link *mp_reqq_pop(struct mp_reqq *q)
{
	struct mp_reqq_link *link = q->head;

	if (link) {
		q->head = link->next;
		if (!q->head)
			q->tail = NULL;
		q->n--;
		link->next = NULL;
	}
	return link;
}

/**
 * Take @link, which must be queued on @q, out of it. O(length): singly
 * linked keeps push and pop at one pointer each, and removal from the
 * middle is rare (closing a connection that waits to be accepted).
 */
static inline void mp_reqq_remove(struct mp_reqq *q, struct mp_reqq_link *link)
{
	struct mp_reqq_link **pp = &q->head, *prev = NULL;

	while (*pp != link) {
		prev = *pp;
		pp = &prev->next;
	}
	*pp = link->next;
	if (q->tail == link)
		q->tail = prev;
	q->n--;
	link->next = NULL;
}

/**
 * Complete every request of @q with @err, oldest first, through the
 * driver's own @complete (which does the driver's state, logging and
 * wake-ups). Each request is off the queue before @complete sees it, so
 * @complete may recycle it.
 */
static inline void mp_reqq_fail(struct mp_reqq *q, void (*complete)(struct mp_reqq_link *, int),
				int err)
{
	struct mp_reqq_link *link;

	while ((link = mp_reqq_pop(q)))
		complete(link, err);
}

/* ---- pool ------------------------------------------------------------- */

/** One allocation of a pool (internal to it). */
struct mp_reqpool_block {
	struct mp_reqpool_block *next;
	max_align_t objs[]; /**< per_block objects of `size` bytes */
};

/** Request objects of one type, carved @per_block at a time; MP_REQPOOL() sets one up. */
struct mp_reqpool {
	struct mp_reqq_link *free;
	struct mp_reqpool_block *blocks;
	size_t size;     /**< of one object */
	size_t link_off; /**< of its struct mp_reqq_link */
	unsigned per_block;
};

/** An empty pool of @type objects linked through @member, growing @n at a time. */
#define MP_REQPOOL(type, member, n) \
	((struct mp_reqpool){.size = sizeof(type), .link_off = MP_REQQ_OFF_(type, member), \
			     .per_block = (n)})

/**
 * A request object from @p, zeroed when new and as left by its last user
 * when recycled; NULL when memory runs out. Take it with
 * mp_reqpool_get_entry() for the type check.
 */
static inline struct mp_reqq_link *mp_reqpool_get(struct mp_reqpool *p)
{
	struct mp_reqq_link *link;

	if (!p->free) {
		struct mp_reqpool_block *b = calloc(1, sizeof(*b) + (size_t)p->per_block * p->size);

		if (!b)
			return NULL;
		b->next = p->blocks;
		p->blocks = b;
		/* Threaded backwards so that the block is handed out front to back. */
		for (unsigned i = p->per_block; i-- > 0;) {
			link = (struct mp_reqq_link *)(void *)((char *)b->objs + i * p->size +
							       p->link_off);
			link->next = p->free;
			p->free = link;
		}
	}
	link = p->free;
	p->free = link->next;
	link->next = NULL;
	return link;
}

/** ::mp_reqpool_get as a @p type object, with the type check of ::mp_reqq_entry. */
#define mp_reqpool_get_entry(p, type, member) mp_reqq_entry(mp_reqpool_get(p), type, member)

/** Give a request back to @p; its memory stays the pool's until mp_reqpool_fini(). */
static inline void mp_reqpool_put(struct mp_reqpool *p, struct mp_reqq_link *link)
{
	link->next = p->free;
	p->free = link;
}

/** Free every block: every request of @p, tested or not, is gone after this. */
static inline void mp_reqpool_fini(struct mp_reqpool *p)
{
	while (p->blocks) {
		struct mp_reqpool_block *b = p->blocks;

		p->blocks = b->next;
		free(b);
	}
	p->free = NULL;
}

/* ---- request life cycle ----------------------------------------------- */

/** Where a ::mp_reqq_req is in its life. */
enum mp_reqq_state {
	MP_REQQ_FREE = 0, /**< in the pool */
	MP_REQQ_POSTED,   /**< handed out, not finished */
	MP_REQQ_DONE,     /**< finished, not yet tested */
};

/**
 * The part of a request that every driver with a pool keeps the same way:
 * taken from the pool POSTED, marked DONE with a status by the driver's
 * completion, handed back by test() once it reports done, and FREE while in
 * the pool, so that testing a handle twice is refused rather than reading
 * the next user's result. A driver embeds it (as `base`) and names
 * base.link to the pool and queue macros. The loop driver keeps its own:
 * its test() polls an atomic done flag without taking the global lock.
 */
struct mp_reqq_req {
	struct mp_reqq_link link; /**< pool free list, or the queue it is posted on */
	enum mp_reqq_state state;
	int status;    /**< 0 or negative errno, final once DONE */
	size_t nbytes; /**< what test() reports; the driver's to set */
};

/** A request just taken from its pool: posted, no result yet. */
static inline void mp_reqq_req_post(struct mp_reqq_req *r)
{
	r->state = MP_REQQ_POSTED;
	r->status = 0;
	r->nbytes = 0;
}

/** Mark @r finished with @status (0 or negative errno); test() reports it. */
static inline void mp_reqq_req_complete(struct mp_reqq_req *r, int status)
{
	r->status = status;
	r->state = MP_REQQ_DONE;
}

/** Give @r back to @p, marked FREE so that a later test() of it is refused. */
static inline void mp_reqq_req_put(struct mp_reqpool *p, struct mp_reqq_req *r)
{
	r->state = MP_REQQ_FREE;
	mp_reqpool_put(p, &r->link);
}

/**
 * The drivers' test() on a non-NULL @r and @done, with @p the pool @r came
 * from: -EINVAL for a handle already handed back (*done untouched: some
 * callers promise that, others clear it first); 0 with *done = 0 while
 * posted; once done *done = 1, *@nbytes (may be NULL) = its byte count, @r
 * goes back to @p and its status is returned.
 */
static inline int mp_reqq_req_test(struct mp_reqpool *p, struct mp_reqq_req *r, int *done,
				   size_t *nbytes)
{
	if (r->state == MP_REQQ_FREE)
		return -EINVAL;
	if (r->state == MP_REQQ_POSTED) {
		*done = 0;
		return 0;
	}
	int status = r->status;

	*done = 1;
	if (nbytes)
		*nbytes = r->nbytes;
	mp_reqq_req_put(p, r);
	return status;
}

#endif /* MOSHPIT_SDK_REQQ_H */
