/* SPDX-License-Identifier: BSD-3-Clause */
/**
 * @file driver.h
 * @brief Driver SDK: the seam every moshpit transport fills.
 *
 * This header is for transport drivers, in the tree (drivers/<name>/) or
 * out of it, not for applications; <moshpit/driver_sdk.h> adds the helpers
 * a driver needs (log, clock, request pool, little-endian fields). A driver
 * fills one `static const struct mp_driver_ops` with designated
 * initializers. The table starts with its own size and ABI so that entries
 * can be appended without breaking drivers built against an older header.
 * The entries of ABI 1 up to `wake` are mandatory: the core refuses a table
 * of another ABI, one smaller than they need, or one with a NULL among
 * them. Entries appended after them are optional: one beyond `size`, or
 * NULL, counts as not implemented.
 *
 * The core finds drivers by name: its built-in ones, those registered with
 * ::mp_driver_register, and those of the plugins that MP_DRIVER_PATH names
 * (see ::MP_DRIVER_PLUGIN).
 *
 * The model is non-blocking and completion based, like NCCL's net plugins:
 *
 *  - Addresses are opaque blobs of at most ::MP_DRV_ADDR_MAX bytes that the
 *    core moves between peers out of band; drivers convert them to and from
 *    text for hostfiles and logs.
 *  - `connect` returns a connection at once; the transfer of posted sends
 *    starts when the connection is established. `accept` hands over
 *    connections as they arrive, or -EAGAIN.
 *  - Messages are posted (`isend`, `irecv`) and complete later; the core
 *    calls `test` on each posted request. Messages on one connection match
 *    receives in posting order, and a received message may be shorter than
 *    the posted buffer (its length is reported); a longer one fails the
 *    receive with -EMSGSIZE.
 *  - -EAGAIN from `isend`/`irecv` is back-pressure, not an error: post again
 *    after `progress`.
 *  - `progress` moves bytes and may wait up to its timeout for something to
 *    happen; `wake` interrupts that wait from another thread. A driver may
 *    hold posted sends until its next `progress` (tcp gathers a
 *    connection's queued messages into one system call there): the core
 *    calls `progress` before it leaves the transport alone, at the end of
 *    every average.
 *
 * How the transports map onto this: tcp posts frames on non-blocking sockets
 * driven by epoll; dpdk segments messages into UDP frames with its own
 * sequence numbers, acknowledgements and retransmission inside the driver;
 * verbs turns a posted receive into a clear-to-send record written into the
 * sender's ring and the send into an RDMA WRITE with immediate, completed from
 * the completion queue. See doc/design.md.
 */
#ifndef MOSHPIT_DRIVER_H
#define MOSHPIT_DRIVER_H

#include <stddef.h>
#include <stdint.h>
#include <moshpit/moshpit.h>

#ifdef __cplusplus
extern "C" {
#endif

/** ABI generation of this header; bumped on incompatible changes. */
#define MP_DRIVER_ABI 1
/** Largest opaque address blob. */
#define MP_DRV_ADDR_MAX 128
/** Largest scatter list accepted by isend. */
#define MP_DRV_IOV_MAX 2

/** Capability flags (struct mp_drv_caps::flags). */
enum mp_drv_cap {
	MP_DRV_CAP_ORDERED = 1u << 0,    /**< messages of a connection arrive in posting order */
	MP_DRV_CAP_RDMA_WRITE = 1u << 1, /**< one-sided writes into registered remote memory */
	/** can register ::MP_MEM_CUDA / ::MP_MEM_DMABUF memory with `reg_mr`;
	 * a piece of an `isend` and the buffer of an `irecv` may then lie in
	 * it, and the driver never reads or writes it through the pointer
	 * itself (no inline copy, no bounce buffer): by DMA, or through a
	 * mapping it made for the registration (dpdk's gpudev CPU mapping) */
	MP_DRV_CAP_DEVICE_MEM = 1u << 2,
	MP_DRV_CAP_ZERO_COPY = 1u << 3,  /**< sends leave from registered memory without a copy */
	MP_DRV_CAP_INPROC = 1u << 4,     /**< all peers live in one process */
	/** with ::MP_DRV_CAP_DEVICE_MEM: the NIC itself reads and writes such
	 * memory by DMA, both ways (GPUDirect RDMA: verbs), so the device path
	 * sends and receives its chunks in GPU memory (doc/design.md) */
	MP_DRV_CAP_DEVICE_DMA = 1u << 5,
};

/** What a driver instance can do. */
struct mp_drv_caps {
	uint32_t flags;           /**< ::mp_drv_cap bits */
	size_t max_msg;           /**< largest message one isend may carry */
	int default_streams;      /**< connections per peer pair that suit this transport */
};

/** Parameters for a driver instance. */
struct mp_drv_params {
	size_t size;              /**< sizeof(struct mp_drv_params) */
	const char *run_name;     /**< run name (the loop driver keys its registry on it) */
	int rank;                 /**< owning peer's rank, for logs */
	int connect_timeout_ms;   /**< how long connection attempts may take */
};

/** A scatter list element for isend. */
struct mp_iov {
	const void *base; /**< start */
	size_t len;       /**< bytes */
};

/** Driver instance; drivers embed it as the first member of their own state. */
struct mp_drv {
	const struct mp_driver_ops *ops; /**< the driver's table */
};
struct mp_drv_listener; /**< driver-defined listening endpoint */
struct mp_drv_conn;     /**< driver-defined connection */
struct mp_drv_mr;       /**< driver-defined memory registration */
struct mp_drv_req;      /**< driver-defined posted operation */

/** The ops table. Every entry returns 0 or a negative errno unless noted. */
struct mp_driver_ops {
	size_t size;      /**< sizeof(struct mp_driver_ops) the driver was built with */
	unsigned abi;     /**< ::MP_DRIVER_ABI the driver was built with */
	const char *name; /**< transport name as users type it ("tcp") */

	/** Create an instance. */
	int (*init)(const struct mp_drv_params *p, struct mp_drv **out);
	/** Destroy an instance; closes everything it still owns. */
	void (*fini)(struct mp_drv *d);
	/** Report capabilities. */
	int (*query)(struct mp_drv *d, struct mp_drv_caps *caps);

	/** Text ("host:port") to blob; -EINVAL if malformed. */
	int (*addr_parse)(struct mp_drv *d, const char *text, void *blob, size_t *len);
	/** Blob to text; -ENOSPC if @p cap is too small. */
	int (*addr_format)(struct mp_drv *d, const void *blob, size_t len, char *text, size_t cap);

	/** Listen on @p bind (text, may say port 0); the bound address comes back as a blob. */
	int (*listen)(struct mp_drv *d, const char *bind, void *blob, size_t *len,
		      struct mp_drv_listener **out);
	/** Take one arrived connection; -EAGAIN when none is pending. */
	int (*accept)(struct mp_drv_listener *l, struct mp_drv_conn **out);
	/** Stop listening. */
	void (*close_listener)(struct mp_drv_listener *l);
	/** Start connecting; the connection is usable for posting at once. */
	int (*connect)(struct mp_drv *d, const void *blob, size_t len, struct mp_drv_conn **out);
	/** Close a connection; its posted requests complete with -ECANCELED. */
	void (*close)(struct mp_drv_conn *c);

	/** Register memory so that it can be sent from or received into. */
	int (*reg_mr)(struct mp_drv *d, void *buf, size_t len, enum mp_mem_kind kind,
		      struct mp_drv_mr **out);
	/** Release a registration. */
	void (*dereg_mr)(struct mp_drv *d, struct mp_drv_mr *mr);

	/** Post a send of @p iovcnt (<= ::MP_DRV_IOV_MAX) pieces as one message; -EAGAIN = later. */
	int (*isend)(struct mp_drv_conn *c, const struct mp_iov *iov, int iovcnt, struct mp_drv_mr *mr,
		     struct mp_drv_req **out);
	/** Post a receive into @p buf of @p cap bytes; -EAGAIN = later. */
	int (*irecv)(struct mp_drv_conn *c, void *buf, size_t cap, struct mp_drv_mr *mr,
		     struct mp_drv_req **out);
	/**
	 * Check a request. When *done is set the request is released. Returns the
	 * request's error (negative errno) once done and failed, else 0.
	 * @p nbytes receives the message length (may be NULL).
	 */
	int (*test)(struct mp_drv_req *r, int *done, size_t *nbytes);
	/** Make progress, waiting up to @p timeout_ms (0 = poll) for an event. */
	int (*progress)(struct mp_drv *d, int timeout_ms);
	/** Wake a thread blocked in progress (may be called from any thread). */
	void (*wake)(struct mp_drv *d);

	/* Optional entries from here on: read only when `size` covers them. */

	/**
	 * What ::mp_init listens on when the configuration names no address
	 * (text for `listen`, e.g. "127.0.0.1:0"). NULL: such a transport
	 * needs MP_LISTEN, or a peer list that gives this peer's address.
	 */
	const char *default_listen;
	/**
	 * What this instance chose where the configuration left a choice, for
	 * reports (::mp_transport_detail): space-separated `key=value` pairs
	 * written NUL-terminated to @p text, such as "provider=net domain=lo".
	 * Values hold no spaces. Returns the length written (0: nothing to
	 * say), -ENOSPC when @p cap is too small, or another negative errno.
	 * May be called from any thread: it must read only what init set.
	 * NULL: the transport has nothing to report.
	 */
	int (*describe)(struct mp_drv *d, char *text, size_t cap);
	/**
	 * How many connections of this instance are still being set up by the
	 * transport itself (its own handshake under way, before `accept` hands
	 * them over or a dial carries data), for a transport whose set-up
	 * takes several `progress` calls on each side: between averages the
	 * core then calls `progress` every few milliseconds instead of every
	 * 50, so that a peer back from a failure is through its handshakes by
	 * the next average. Called from the thread that drives the instance.
	 * NULL: set-up needs no calls (tcp: the kernel's handshake).
	 */
	int (*setting_up)(struct mp_drv *d);
};

/** Longest driver name, without its NUL. */
#define MP_DRIVER_NAME_MAX 31

/**
 * Make a driver available by its name: ::mp_init then uses it when
 * mp_config::transport (MP_TRANSPORT) names it, and
 * ::mp_transport_available knows it. The table is checked first:
 *
 *  - -EINVAL: @p ops is NULL, `size` is too short for the ABI field or for
 *    the mandatory entries, the name is empty, longer than
 *    ::MP_DRIVER_NAME_MAX or not made of [A-Za-z0-9_-], or a mandatory
 *    entry is NULL;
 *  - -EPROTO: `abi` is not this library's ::MP_DRIVER_ABI;
 *  - -EEXIST: a built-in or registered driver has the name already;
 *  - -ENOSPC: the registry is full.
 *
 * A refused table changes nothing, and ::mp_last_error (NULL) says why.
 * The library keeps the pointer, not a copy: the table must live as long
 * as the process (a `static const` of the driver). Drivers cannot be
 * unregistered. Thread-safe.
 * @param ops the driver's table
 * @return 0 or a negative errno
 */
MP_API int mp_driver_register(const struct mp_driver_ops *ops);

/**
 * The function a driver plugin exports, named ::MP_DRIVER_PLUGIN_SYMBOL.
 * Every shared object that MP_DRIVER_PATH lists (colon-separated, as given
 * to dlopen) is loaded the first time the library looks for a driver, and
 * the table this function returns is registered as by
 * ::mp_driver_register; a plugin that cannot be loaded, or whose table is
 * refused, is skipped with a warning. The function may return NULL to
 * decline (no device on this host). A plugin needs the shared libmoshpit
 * for the SDK's functions: a program linked with libmoshpit.a registers its
 * drivers with ::mp_driver_register instead.
 */
typedef const struct mp_driver_ops *(*mp_driver_plugin_fn)(void);

/** The name of a plugin's ::mp_driver_plugin_fn. */
#define MP_DRIVER_PLUGIN_SYMBOL "mp_driver_plugin"

/**
 * Define a plugin's entry point, exported even from an object built with
 * hidden visibility: `MP_DRIVER_PLUGIN(my_ops)` at file scope, where
 * my_ops is the driver's `static const struct mp_driver_ops`.
 */
#define MP_DRIVER_PLUGIN(table)                                       \
	MP_API const struct mp_driver_ops *mp_driver_plugin(void);    \
	MP_API const struct mp_driver_ops *mp_driver_plugin(void)     \
	{                                                             \
		return &(table);                                      \
	}

#ifdef __cplusplus
}
#endif
#endif /* MOSHPIT_DRIVER_H */
