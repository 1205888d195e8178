# SPDX-License-Identifier: BSD-3-Clause
"""Moshpit All-Reduce from Python: average float vectors in place across
unreliable peers with libmoshpit.

    import numpy as np, moshpit
    with moshpit.Context(rank=0, peers="10.0.0.1:7000,10.0.0.2:7000") as ctx:
        x = np.ones(1024, dtype=np.float32)
        result = ctx.average(x)          # x now holds the mean

CUDA tensors (and any float32 array with ``__cuda_array_interface__``) are
averaged where they are: registered with the library once, reduced on the
GPU where its kernels run, in the order of the tensor's current stream.

The library is found through MOSHPIT_LIB (a path to libmoshpit.so), else
the installed one. Every setting of struct mp_config is a keyword of
Context under the same name; those not given come from the MP_* variables
(doc/python.md).
"""

from __future__ import annotations

import ctypes
import errno as _errno
import numbers
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Iterable, Optional

from . import _lib

__all__ = [
    "Context", "Handle", "Result", "PeerInfo", "Stats", "Error", "InvalidArgument",
    "SettingsMismatch", "LengthMismatch", "Timeout", "Unsupported", "Busy", "Closed",
    "PeerFailure", "NotFound", "StateInfo", "CODECS", "transport_available", "grid_shape",
]

_lib_handle: Optional[ctypes.CDLL] = None
_lib_lock = threading.Lock()


def _L() -> ctypes.CDLL:
    global _lib_handle
    with _lib_lock:
        if _lib_handle is None:
            _lib_handle = _lib.load()
        return _lib_handle


# ---------------------------------------------------------------- errors

class Error(Exception):
    """A failure of libmoshpit: ``errno`` is the (positive) errno value, and
    ``message`` the library's own words (mp_last_error), naming the setting,
    length or peer that went wrong."""

    def __init__(self, errno: int, message: str, call: str = "") -> None:
        name = _strerror(errno)
        text = f"{call}: {name}" if call else name
        if message:
            text += f": {message}"
        super().__init__(text)
        self.errno = errno
        self.message = message
        self.call = call


class InvalidArgument(Error, ValueError):
    """EINVAL: a bad setting or argument; nothing was changed or sent."""


class SettingsMismatch(Error):
    """EBADE: a peer runs with other run-shared settings (grid, codec, ...),
    or averages this call compressed where this peer does not. Nothing of the
    exchange that met it was applied."""


class LengthMismatch(Error):
    """EMSGSIZE: a peer averages another number of values. Nothing of the
    exchange that met it was applied."""


class Timeout(Error, TimeoutError):
    """ETIMEDOUT: a wait with a timeout ran out (the operation goes on), or
    the rendezvous did not see its peers in time."""


class Unsupported(Error):
    """ENOTSUP: this build, transport or buffer cannot do it."""


class Busy(Error):
    """EBUSY: the object is in use (say, peers already set)."""


class Closed(Error):
    """ESHUTDOWN or ECANCELED: the context left the run or was closed."""


class PeerFailure(Error, ConnectionError):
    """The operation failed with its peers (refused, cut, a protocol error;
    EACCES: they refused our run key; EBADMSG: data that did not match its
    digest)."""


class NotFound(Error, LookupError):
    """ENOENT: no such transport; no server has published a state."""


_CLASSES = {
    _errno.EINVAL: InvalidArgument,
    _errno.EBADE: SettingsMismatch,
    _errno.EMSGSIZE: LengthMismatch,
    _errno.ETIMEDOUT: Timeout,
    _errno.ENOTSUP: Unsupported,
    _errno.EBUSY: Busy,
    _errno.ESHUTDOWN: Closed,
    _errno.ECANCELED: Closed,
    _errno.ECONNREFUSED: PeerFailure,
    _errno.ECONNRESET: PeerFailure,
    _errno.ENOTCONN: PeerFailure,
    _errno.EPROTO: PeerFailure,
    _errno.EHOSTUNREACH: PeerFailure,
    _errno.EACCES: PeerFailure,
    _errno.EBADMSG: PeerFailure,
    _errno.ENOENT: NotFound,
}


def _strerror(errno: int) -> str:
    try:
        s = _L().mp_strerror(-errno)
        return s.decode() if s else _errno.errorcode.get(errno, str(errno))
    except OSError:
        return _errno.errorcode.get(errno, str(errno))


def _error(rc: int, message: str, call: str) -> Error:
    err = -rc
    return _CLASSES.get(err, Error)(err, message, call)


def _init_error(rc: int, call: str) -> Error:
    msg = _L().mp_last_error(None)
    return _error(rc, msg.decode(errors="replace") if msg else "", call)


# ---------------------------------------------------------------- values

CODECS = {0: "none", 1: "fp16", 2: "bf16", 3: "uniform8", 4: "blockwise8", 5: "topk",
          6: "adacomp", 255: "auto"}
_MODES = {0: "normal", 1: "client", 2: "aux"}
_STATES = {0: "live", 1: "down", 2: "gone", 3: "self"}
_BALANCE = {"configured": 0, "measured": 1}
_LOG_LEVELS = {"none": 0, "warn": 1, "info": 2, "trace": 3}


@dataclass(frozen=True)
class Result:
    """What one average did (struct mp_result)."""

    rounds: int
    """rounds (group all-reduces or ring passes) completed"""
    peers: int
    """peers whose contributions reached this result"""
    weight: float
    """this peer's weight after averaging"""
    bytes_sent: int
    bytes_received: int
    frames_rejected: int
    failed_peers: int
    """peers dropped in this operation (timeouts, errors, bad frames)"""
    codec: str
    """the codec the average used (what "auto" chose)"""
    values_sent: int
    rounds_alone: int
    """rounds in which no group formed"""
    group_size: int

    @classmethod
    def _from(cls, r: _lib.MpResult) -> "Result":
        return cls(r.rounds, r.peers, r.weight, r.bytes_sent, r.bytes_received,
                   r.frames_rejected, r.failed_peers, CODECS.get(r.codec, str(r.codec)),
                   r.values_sent, r.rounds_alone, r.group_size)


@dataclass(frozen=True)
class PeerInfo:
    """One peer as the context knows it (struct mp_peer_info)."""

    id: int
    rank: int
    mode: str
    state: str
    """"live", "down", "gone" or "self\""""
    failures: int
    addr: str
    since_progress_s: float
    bandwidth_Bps: float
    rtt_s: float
    bytes_sent: int
    bytes_received: int
    rate_Bps: float
    weight: float


@dataclass(frozen=True)
class Stats:
    """Counters of a context since it started (struct mp_stats)."""

    frames_rejected: int
    conns_accepted: int
    conns_authenticated: int
    conns_refused: int
    conns_timed_out: int
    conns_evicted: int
    conns_hung_up: int
    handshakes_pending: int
    handshakes_max: int
    peers_known: int
    peers_held: int
    state_served: int
    """state service: version queries answered and downloads sent whole"""
    state_refused: int
    """state service: clients that did not prove the run key"""
    state_cut: int
    state_busy: int


@dataclass(frozen=True)
class StateInfo:
    """A state a server published (struct mp_state_info, with its lengths
    and metadata)."""

    version: int
    bytes: int
    lens: list
    """each buffer's length in bytes"""
    meta: bytes
    source: str
    """the address it came from"""
    tries: int = 0
    """fetch: servers a download was started with"""
    resumed: int = 0
    """fetch: bytes kept from a server that failed mid-transfer"""


def transport_available(name: str) -> bool:
    """Whether a transport ("tcp", "loop", "dpdk", ...) can be used."""
    return bool(_L().mp_transport_available(name.encode()))


def grid_shape(npeers: int, grid: Optional[str] = None) -> tuple[int, ...]:
    """The grid a context of ``npeers`` peers would use (``grid`` parsed, or
    the library's automatic choice)."""
    dims = (ctypes.c_int * 8)()
    n = _L().mp_grid_shape(grid.encode() if grid else None, npeers, dims, 8)
    if n < 0:
        raise _init_error(n, "grid_shape")
    return tuple(dims[:n])


# ---------------------------------------------------------------- buffers

class _Buf:
    """A float32 view of what the caller passed: its address and count, what
    keeps it alive while the library uses it, and, for a converted copy, how
    to write the result back. CUDA memory also says so (``cuda``), and which
    stream computes it: the CUstream as an int (0 or None: the legacy
    default stream)."""

    __slots__ = ("ptr", "count", "keep", "writeback", "cuda", "stream", "owner")

    def __init__(self, ptr: int, count: int, keep: Any, writeback: Any = None, *,
                 cuda: bool = False, stream: Optional[int] = None, owner: Any = None) -> None:
        self.ptr = ptr
        self.count = count
        self.keep = keep
        self.writeback = writeback
        self.cuda = cuda
        self.stream = stream
        self.owner = owner  # CUDA: whose lifetime the registration follows


def _as_float32(x: Any) -> _Buf:
    """Map ``x`` to float32 memory the library may write in place.

    float32 memory that is contiguous and writable is used as it is (no
    copy). torch fp16 and bf16 tensors, numpy float16 arrays and
    non-contiguous float32 ones go through a float32 copy that is written
    back when the average ends: exact for the upcast, then rounded once to
    the tensor's precision. CUDA tensors stay on their device, and so does
    such a copy. Anything else (float64, integers, read-only memory) is
    refused: averaging it through float32 would change its values without
    saying so."""
    mod = type(x).__module__
    if mod.startswith("torch"):
        return _torch_buf(x)
    if mod.startswith("numpy"):
        return _numpy_buf(x)
    if hasattr(x, "__cuda_array_interface__"):
        return _cai_buf(x)
    try:
        mv = memoryview(x)
    except TypeError:
        raise InvalidArgument(_errno.EINVAL, f"cannot average a {type(x).__name__}: pass a "
                              "numpy array, a torch tensor or a writable float32 buffer",
                              "average") from None
    if mv.format not in ("f", "<f", "=f") or mv.itemsize != 4:
        raise InvalidArgument(_errno.EINVAL, f"buffer format {mv.format!r}: only float32 "
                              "('f') buffers are averaged", "average")
    if mv.readonly or not mv.c_contiguous:
        raise InvalidArgument(_errno.EINVAL, "the buffer must be writable and contiguous: "
                              "the average is written in place", "average")
    if mv.nbytes == 0:
        raise InvalidArgument(_errno.EINVAL, "cannot average an empty buffer", "average")
    holder = (ctypes.c_char * mv.nbytes).from_buffer(mv)
    return _Buf(ctypes.addressof(holder), mv.nbytes // 4, (x, mv, holder))


def _numpy_buf(a: Any) -> _Buf:
    import numpy as np
    if not isinstance(a, np.ndarray):
        raise InvalidArgument(_errno.EINVAL, f"cannot average a {type(a).__name__}", "average")
    if a.size == 0:
        raise InvalidArgument(_errno.EINVAL, "cannot average an empty array", "average")
    if not a.flags.writeable:
        raise InvalidArgument(_errno.EINVAL, "the array is read-only: the average is written "
                              "in place", "average")
    if a.dtype == np.float32 and a.flags.c_contiguous and a.dtype.isnative:
        return _Buf(a.ctypes.data, a.size, a)
    if a.dtype in (np.float32, np.float16):
        tmp = np.ascontiguousarray(a, dtype=np.float32)

        def back() -> None:
            a[...] = tmp
        return _Buf(tmp.ctypes.data, tmp.size, (a, tmp), back)
    raise InvalidArgument(_errno.EINVAL, f"dtype {a.dtype}: only float32 (in place) and "
                          "float16 (through a float32 copy) are averaged", "average")


def _torch_buf(t: Any) -> _Buf:
    import torch
    if not isinstance(t, torch.Tensor):
        raise InvalidArgument(_errno.EINVAL, f"cannot average a {type(t).__name__}", "average")
    if t.device.type not in ("cpu", "cuda"):
        raise Unsupported(_errno.ENOTSUP, f"a tensor on {t.device}: the Python layer averages "
                          "CPU and CUDA tensors (move it with .cpu(), average, and copy back)",
                          "average")
    if t.numel() == 0:
        raise InvalidArgument(_errno.EINVAL, "cannot average an empty tensor", "average")
    cuda = t.device.type == "cuda"
    # The stream that computes the tensor: the average waits for it, on the device.
    stream = torch.cuda.current_stream(t.device).cuda_stream if cuda else None
    if t.dtype == torch.float32 and t.is_contiguous():
        return _Buf(t.data_ptr(), t.numel(), t, cuda=cuda, stream=stream, owner=t)
    if t.dtype in (torch.float32, torch.float16, torch.bfloat16):
        tmp = t.detach().to(dtype=torch.float32, memory_format=torch.contiguous_format,
                            copy=True)

        def back() -> None:
            with torch.no_grad():
                t.copy_(tmp.view_as(t))
        return _Buf(tmp.data_ptr(), tmp.numel(), (t, tmp), back, cuda=cuda, stream=stream,
                    owner=tmp)
    raise InvalidArgument(_errno.EINVAL, f"dtype {t.dtype}: float32 tensors are averaged in "
                          "place, float16 and bfloat16 through a float32 copy", "average")


def _cai_buf(x: Any) -> _Buf:
    """CUDA memory of another library (CuPy, Numba...): float32, contiguous,
    averaged in place; its interface's stream (version 3) is waited for."""
    cai = x.__cuda_array_interface__
    shape = tuple(cai.get("shape", ()))
    n = _prod(shape)
    if cai.get("typestr") not in ("<f4", "=f4", "|f4"):
        raise InvalidArgument(_errno.EINVAL, f"CUDA array of type {cai.get('typestr')!r}: only "
                              "float32 ('<f4') device arrays are averaged", "average")
    ptr, readonly = cai["data"]
    if readonly:
        raise InvalidArgument(_errno.EINVAL, "the CUDA array is read-only: the average is "
                              "written in place", "average")
    strides = cai.get("strides")
    if strides is not None and tuple(strides) != tuple(
            4 * _prod(shape[i + 1:]) for i in range(len(shape))):
        raise InvalidArgument(_errno.EINVAL, "the CUDA array must be contiguous: the average "
                              "is written in place", "average")
    if n == 0 or not ptr:
        raise InvalidArgument(_errno.EINVAL, "cannot average an empty CUDA array", "average")
    # Version 3's stream: None (nothing to wait for: the legacy default
    # stream then, whose work so far is all there is to order after) and 1,
    # the legacy default stream; 2, the per-thread one (CU_STREAM_PER_THREAD);
    # else the cudaStream_t itself.
    s = cai.get("stream")
    stream = None if s is None else (0 if s == 1 else int(s))
    return _Buf(int(ptr), n, x, cuda=True, stream=stream, owner=x)


def _prod(dims: Iterable[int]) -> int:
    n = 1
    for d in dims:
        n *= int(d)
    return n


def _raw(x: Any, writable: bool) -> tuple[int, int, Any]:
    """(address, bytes, keep-alive) of the contiguous memory of ``x``, any
    dtype: state is moved as bytes. bytes-like objects are accepted for
    publishing; destinations must be writable."""
    mod = type(x).__module__
    if mod.startswith("torch"):
        if x.device.type != "cpu":
            raise Unsupported(_errno.ENOTSUP, f"a tensor on {x.device}: state is moved in host "
                              "memory", "state")
        if not x.is_contiguous():
            raise InvalidArgument(_errno.EINVAL, "a non-contiguous tensor: state buffers must "
                                  "be contiguous", "state")
        return x.data_ptr(), x.numel() * x.element_size(), x
    if mod.startswith("numpy"):
        if not x.flags.c_contiguous or (writable and not x.flags.writeable):
            raise InvalidArgument(_errno.EINVAL, "state buffers must be contiguous (and "
                                  "writable to fetch into)", "state")
        return x.ctypes.data, x.nbytes, x
    mv = memoryview(x)
    if not mv.c_contiguous or (writable and mv.readonly):
        raise InvalidArgument(_errno.EINVAL, "state buffers must be contiguous (and writable "
                              "to fetch into)", "state")
    if mv.nbytes == 0:
        return 0, 0, mv
    if mv.readonly:
        b = bytes(mv)
        return ctypes.cast(ctypes.c_char_p(b), ctypes.c_void_p).value or 0, len(b), b
    holder = (ctypes.c_char * mv.nbytes).from_buffer(mv)
    return ctypes.addressof(holder), mv.nbytes, (x, mv, holder)


def _addr_array(addrs: Iterable[str]) -> tuple[Any, int]:
    items = [a.encode() for a in addrs]
    if not items:
        raise InvalidArgument(_errno.EINVAL, "no server addresses", "state")
    return (ctypes.c_char_p * len(items))(*items), len(items)


# ---------------------------------------------------------------- context

def _join(value: Any, sep: str) -> str:
    if isinstance(value, str):
        return value
    return sep.join(str(v) for v in value)


class Context:
    """One peer of a run (mp_ctx). Keywords are struct mp_config's fields by
    name; those not given come from the MP_* environment variables, then the
    library's defaults. Names may be given for ``codec`` ("blockwise8",
    "topk:0.05"), ``algo``, ``mode``, ``balance`` and ``log_level``; ``peers``
    and ``bandwidths`` may be lists, ``grid`` a tuple of sizes.

    Calls on one context are serialised with a lock: it may be shared by
    threads. Close it (or use ``with``) to leave the run."""

    def __init__(self, **config: Any) -> None:
        lib = _L()
        self._lock = threading.RLock()
        self._pending: set[Handle] = set()
        self._closing = False
        self._ctx: Optional[int] = None
        self._keep: list[bytes] = []  # the strings the configuration points to
        # CUDA memory, registered once (the library keeps its chunk buffers
        # with the registration): (address, bytes) -> mp_mr
        self._mrs: dict[tuple[int, int], int] = {}
        room = ctypes.create_string_buffer(_lib.CONFIG_ROOM)
        lib.mp_config_init(room)
        cfg = _lib.MpConfig.from_buffer(room)
        lib_size = cfg.size
        if lib_size > _lib.CONFIG_ROOM:
            raise Unsupported(_errno.ENOTSUP, f"the library's struct mp_config is {lib_size} "
                              "bytes, more than this package's room", "Context")
        rc = lib.mp_config_from_env(room)
        if rc < 0:
            raise _init_error(rc, "Context (MP_* environment)")
        offsets = {name: getattr(_lib.MpConfig, name) for name, _ in _lib.MpConfig._fields_}
        for key, value in config.items():
            if key not in offsets or key == "size":
                known = ", ".join(n for n, _ in _lib.MpConfig._fields_ if n != "size")
                raise TypeError(f"moshpit.Context: unknown setting {key!r} (known: {known})")
            field = offsets[key]
            if field.offset + field.size > lib_size:
                raise Unsupported(_errno.ENOTSUP, f"setting {key!r}: the loaded libmoshpit is "
                                  "older and does not know it", "Context")
            self._set(cfg, room, key, value)
        out = ctypes.c_void_p()
        rc = lib.mp_init(room, ctypes.byref(out))
        if rc < 0:
            raise _init_error(rc, "Context")
        self._ctx = out.value
        self._codec = CODECS.get(cfg.codec, str(cfg.codec))

    def _set(self, cfg: _lib.MpConfig, room: Any, key: str, value: Any) -> None:
        lib = _L()
        if key == "codec" and isinstance(value, str):
            rc = lib.mp_codec_parse(value.encode(), room)
            if rc < 0:
                raise _init_error(rc, "Context")
            return
        names = {"algo": lib.mp_algo_from_name, "mode": lib.mp_mode_from_name}
        if key in names and isinstance(value, str):
            v = names[key](value.encode())
            if v < 0:
                raise InvalidArgument(_errno.EINVAL, f"{key} {value!r} is not known", "Context")
            value = v
        elif key == "balance" and isinstance(value, str):
            if value.lower() not in _BALANCE:
                raise InvalidArgument(_errno.EINVAL, f"balance {value!r}: configured or "
                                      "measured", "Context")
            value = _BALANCE[value.lower()]
        elif key == "log_level" and isinstance(value, str):
            if value.lower() not in _LOG_LEVELS:
                raise InvalidArgument(_errno.EINVAL, f"log_level {value!r}: none, warn, info "
                                      "or trace", "Context")
            value = _LOG_LEVELS[value.lower()]
        elif key == "peer_id" and isinstance(value, str):
            value = int(value, 16)
        if key in _lib.STRING_FIELDS:
            if value is None:
                setattr(cfg, key, None)
                return
            if key == "grid" and not isinstance(value, str):
                value = _join(value, "x")
            elif key in ("peers", "bandwidths") and not isinstance(value, str):
                value = _join(value, ",")
            if not isinstance(value, str):
                raise InvalidArgument(_errno.EINVAL, f"{key} must be a string, not "
                                      f"{type(value).__name__}", "Context")
            b = ctypes.create_string_buffer(value.encode())
            self._keep.append(b)
            setattr(cfg, key, ctypes.addressof(b))
            return
        kind = dict(_lib.MpConfig._fields_)[key]
        if kind in (ctypes.c_float, ctypes.c_double):
            if not isinstance(value, (int, float)):
                raise InvalidArgument(_errno.EINVAL, f"{key} must be a number", "Context")
            setattr(cfg, key, float(value))
            return
        if not isinstance(value, int):
            raise InvalidArgument(_errno.EINVAL, f"{key} must be an integer, not "
                                  f"{type(value).__name__}", "Context")
        # ctypes would wrap an out-of-range value silently.
        bits = ctypes.sizeof(kind) * 8
        signed = kind in (ctypes.c_int,)
        lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
        if not lo <= int(value) <= hi:
            raise InvalidArgument(_errno.EINVAL, f"{key}={value} out of range [{lo}, {hi}]",
                                  "Context")
        setattr(cfg, key, int(value))

    # -- lifetime

    def __enter__(self) -> "Context":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def close(self) -> None:
        """Leave the run and free the context. Averages still in flight are
        cancelled: their handles raise Closed."""
        with self._lock:
            if self._ctx is None or self._closing:
                return
            self._closing = True
            pending = list(self._pending)
        # A handle's wait may need the context lock for its error message:
        # take the handles first, then the context.
        for h in pending:
            h._lock.acquire()
        try:
            with self._lock:
                _L().mp_finalize(self._ctx)  # releases the registrations too
                self._ctx = None
                self._mrs.clear()
                for h in pending:
                    h._cancel()
                self._pending.clear()
        finally:
            for h in pending:
                h._lock.release()

    def _handle(self) -> int:
        if self._ctx is None or self._closing:
            raise Closed(_errno.ESHUTDOWN, "the context is closed", "moshpit")
        return self._ctx

    def last_error(self) -> str:
        """The library's last message on this context ("" if none)."""
        with self._lock:
            if self._ctx is None:
                return ""
            s = _L().mp_last_error(self._ctx)
            return s.decode(errors="replace") if s else ""

    def _fail(self, rc: int, call: str) -> Error:
        return _error(rc, self.last_error(), call)

    # -- facts

    @property
    def rank(self) -> int:
        with self._lock:
            return _L().mp_rank(self._handle())

    @property
    def npeers(self) -> int:
        with self._lock:
            return _L().mp_npeers(self._handle())

    @property
    def codec(self) -> str:
        """The codec this context averages with ("none", "blockwise8", ...)."""
        return self._codec

    @property
    def peer_id(self) -> int:
        with self._lock:
            return _L().mp_peer_id(self._handle())

    @property
    def address(self) -> str:
        """This peer's listening address, for the other peers' ``peers``."""
        return self._text(_L().mp_local_address, "address")

    @property
    def dht_address(self) -> str:
        """This peer's DHT node ("host:port"), for others' ``bootstrap``."""
        return self._text(_L().mp_dht_address, "dht_address")

    def _text(self, fn: Any, call: str) -> str:
        buf = ctypes.create_string_buffer(_lib.ADDR_STRLEN * 2)
        with self._lock:
            rc = fn(self._handle(), buf, len(buf))
            if rc < 0:
                raise self._fail(rc, call)
        return buf.value.decode()

    def set_peers(self, addrs: Iterable[str]) -> None:
        """Set every peer's address in rank order (this one's included), when
        the configuration did not list them."""
        items = [a.encode() for a in addrs]
        arr = (ctypes.c_char_p * len(items))(*items)
        with self._lock:
            rc = _L().mp_set_peers(self._handle(), arr, len(items))
            if rc < 0:
                raise self._fail(rc, "set_peers")

    def peers(self) -> list[PeerInfo]:
        """Every peer this context knows, with its state and measurements."""
        lib = _L()
        with self._lock:
            h = self._handle()
            n = lib.mp_peers_info(h, None, 0, ctypes.sizeof(_lib.MpPeerInfo))
            while True:
                if n < 0:
                    raise self._fail(n, "peers")
                arr = (_lib.MpPeerInfo * max(n, 1))()
                m = lib.mp_peers_info(h, arr, n, ctypes.sizeof(_lib.MpPeerInfo))
                if m <= n:
                    break
                n = m  # a peer joined meanwhile
        return [PeerInfo(p.id, p.rank, _MODES.get(p.mode, str(p.mode)),
                         _STATES.get(p.state, str(p.state)), p.failures,
                         p.addr.decode(errors="replace"), p.since_progress_s, p.bandwidth_Bps,
                         p.rtt_s, p.bytes_sent, p.bytes_received, p.rate_Bps, p.weight)
                for p in arr[:m]]

    def stats(self) -> Stats:
        """The context's counters (strangers refused, handshakes, peers held)."""
        s = _lib.MpStats()
        with self._lock:
            rc = _L().mp_stats(self._handle(), ctypes.byref(s), ctypes.sizeof(s))
            if rc < 0:
                raise self._fail(rc, "stats")
        return Stats(*(getattr(s, n) for n, _ in _lib.MpStats._fields_))

    def leave(self) -> None:
        """Tell the run this peer leaves (averaging afterwards fails)."""
        with self._lock:
            _L().mp_leave(self._handle())

    # -- state download (doc/python.md, "State download")

    def serve_state(self, listen: Optional[str] = None) -> str:
        """Start this peer's state service (threads of its own; averaging
        goes on) and return its address, for joiners."""
        with self._lock:
            rc = _L().mp_state_serve(self._handle(), listen.encode() if listen else None)
            if rc < 0:
                raise self._fail(rc, "serve_state")
        return self.state_address

    @property
    def state_address(self) -> str:
        """The "host:port" of this peer's state service."""
        return self._text(_L().mp_state_address, "state_address")

    def publish_state(self, buffers: Iterable[Any], version: int, meta: bytes = b"") -> None:
        """Publish ``buffers`` (arrays, tensors or bytes-like, any dtype,
        contiguous) and ``meta`` as this peer's state: copied now, so they may
        change as soon as this returns."""
        items = [_raw(b, writable=False) for b in buffers]
        ptrs = (ctypes.c_void_p * max(1, len(items)))(*[p for p, _, _ in items])
        lens = (ctypes.c_size_t * max(1, len(items)))(*[n for _, n, _ in items])
        m = bytes(meta)
        with self._lock:
            rc = _L().mp_state_publish(self._handle(), int(version), ptrs, lens, len(items),
                                       m or None, len(m))
            if rc < 0:
                raise self._fail(rc, "publish_state")

    def query_state(self, addrs: Iterable[str], timeout: float = 30.0) -> StateInfo:
        """Ask the state services at ``addrs`` for their versions; describe
        the most advanced (lengths, metadata). Downloads nothing."""
        arr, n = _addr_array(addrs)
        info = _lib.MpStateInfo()
        cap_lens, cap_meta = 4096, 1 << 20
        while True:
            lens = (ctypes.c_size_t * cap_lens)()
            meta = ctypes.create_string_buffer(cap_meta)
            with self._lock:
                rc = _L().mp_state_query(self._handle(), arr, n, ctypes.byref(info), lens,
                                         cap_lens, meta, cap_meta, max(1, int(timeout * 1000)))
                if rc < 0:
                    raise self._fail(rc, "query_state")
            if info.nbufs <= cap_lens:
                break
            cap_lens = info.nbufs
        return StateInfo(info.version, info.bytes, list(lens[:info.nbufs]),
                         meta.raw[:info.meta_len], arr[info.source].decode())

    def fetch_state(self, addrs: Iterable[str], buffers: Iterable[Any],
                    timeout: float = 300.0) -> StateInfo:
        """Download the most advanced state at ``addrs`` into ``buffers``
        (contiguous, writable, each as long as the server's), checked
        against its digest; a server that fails mid-transfer is replaced by
        the next. Raises NotFound, PeerFailure (EACCES: refused; EBADMSG),
        LengthMismatch, Timeout."""
        arr, n = _addr_array(addrs)
        items = [_raw(b, writable=True) for b in buffers]
        ptrs = (ctypes.c_void_p * max(1, len(items)))(*[p for p, _, _ in items])
        lens = (ctypes.c_size_t * max(1, len(items)))(*[k for _, k, _ in items])
        info = _lib.MpStateInfo()
        meta = ctypes.create_string_buffer(1 << 20)
        with self._lock:
            rc = _L().mp_state_fetch(self._handle(), arr, n, ptrs, lens, len(items), meta,
                                     len(meta), ctypes.byref(info), max(1, int(timeout * 1000)))
            if rc < 0:
                raise self._fail(rc, "fetch_state")
        return StateInfo(info.version, info.bytes, [k for _, k, _ in items],
                         meta.raw[:info.meta_len], arr[info.source].decode(), info.tries,
                         info.resumed)

    # -- averaging

    @staticmethod
    def _flags(uncompressed: bool, flush: bool = False) -> int:
        return (_lib.AVG_UNCOMPRESSED if uncompressed else 0) | (_lib.AVG_FLUSH if flush else 0)

    @staticmethod
    def _weight(weight: float) -> float:
        # ctypes would turn a non-number into garbage; the library checks the value.
        if isinstance(weight, bool) or not isinstance(weight, numbers.Real):
            raise InvalidArgument(_errno.EINVAL, f"weight must be a number, not "
                                  f"{type(weight).__name__}", "average")
        return float(weight)

    def _cuda_mr(self, buf: _Buf) -> int:
        """The registration of CUDA memory ``buf`` (under the lock): one that
        covers it, else a new one, released when its owner is collected (a
        new tensor at the same address registers anew) or at close."""
        end = buf.ptr + 4 * buf.count
        for (p, n), mr in self._mrs.items():
            if p <= buf.ptr and end <= p + n:
                return mr
        mr = ctypes.c_void_p()
        rc = _L().mp_mem_register(self._handle(), buf.ptr, 4 * buf.count, _lib.MEM_CUDA,
                                  ctypes.byref(mr))
        if rc < 0:
            raise self._fail(rc, "average (registering CUDA memory)")
        key = (buf.ptr, 4 * buf.count)
        self._mrs[key] = mr.value
        try:
            weakref.finalize(buf.owner, self._release_mr, key, mr.value)
        except TypeError:
            pass  # not weak-referenceable: kept until close
        return mr.value

    def _release_mr(self, key: tuple[int, int], mr: int) -> None:
        with self._lock:
            if self._ctx is None or self._mrs.get(key) != mr:
                return
            # Busy (-EBUSY) only while an average runs on it, which holds
            # its owner alive: then it is kept until close.
            if _L().mp_mem_deregister(self._ctx, mr) == 0:
                del self._mrs[key]

    def _start_cuda(self, buf: _Buf, w: float, flags: int, req: Any) -> int:
        """Under the lock: start an average of CUDA memory ``buf``."""
        mr = self._cuda_mr(buf)
        # Always with a stream, whose event is recorded now: without one the
        # library waits for the legacy default stream when the average
        # starts, which a stream_wait queued there meanwhile would hold up.
        return _L().mp_average_start_stream(self._handle(), buf.ptr, buf.count, w, mr, flags,
                                            buf.stream or None, ctypes.byref(req))

    def average(self, x: Any, weight: float = 1.0, *, uncompressed: bool = False,
                flush: bool = False) -> Result:
        """Average ``x`` in place with every peer, with this peer's ``weight``
        (0 contributes nothing). Blocks until done; the GIL is released
        meanwhile. ``uncompressed=True`` sends this call as fp32 whatever the
        codec (all peers must agree). ``flush=True`` first adds what the
        sparse codecs (topk, adacomp) held back for ``x`` (its error
        feedback) and sends it uncompressed, as ``mp_average_flush``: at the
        end of training, or before a checkpoint (all peers together). Raises Error on failure; after a
        failure ``x`` may hold the rounds completed before it, except after
        SettingsMismatch and LengthMismatch (``x`` as it was).

        A CUDA tensor is read once the work queued on its current stream so
        far has run, and holds the average when this returns."""
        w = self._weight(weight)
        buf = _as_float32(x)
        res = _lib.MpResult()
        if buf.cuda:
            return self.average_async(buf, weight, uncompressed=uncompressed,
                                      flush=flush).wait()
        with self._lock:
            rc = _L().mp_average_ex(self._handle(), buf.ptr, buf.count, w,
                                    self._flags(uncompressed, flush), ctypes.byref(res))
            err = self._fail(rc, "average") if rc < 0 else None
        if buf.writeback:
            buf.writeback()
        if err:
            raise err
        return Result._from(res)

    def average_async(self, x: Any, weight: float = 1.0, *, uncompressed: bool = False,
                      flush: bool = False) -> "Handle":
        """Start averaging ``x`` in place and return at once; ``x`` must not
        be touched until the handle is done. The context keeps ``x`` alive
        until then."""
        w = self._weight(weight)
        buf = x if isinstance(x, _Buf) else _as_float32(x)
        req = ctypes.c_void_p()
        with self._lock:
            if buf.cuda:
                rc = self._start_cuda(buf, w, self._flags(uncompressed, flush), req)
            else:
                rc = _L().mp_average_start_ex(self._handle(), buf.ptr, buf.count, w, None,
                                              self._flags(uncompressed, flush),
                                              ctypes.byref(req))
            if rc < 0:
                raise self._fail(rc, "average_async")
            h = Handle(self, req.value, buf)
            self._pending.add(h)
        return h

    def memory_path(self, x: Any) -> tuple[str, str]:
        """How averages of ``x`` go, and why, as ``mp_mem_path`` says:
        ``("host", "host memory")`` for host memory; for CUDA memory
        ``"device"`` (reduced on the GPU, encoded chunks crossing the bus
        through pinned buffers), ``"gpudirect"`` (the same, the chunks moving
        between the NIC and GPU memory) or ``"staged"`` (copied whole through
        a pinned host copy), with the reason the library's INFO line gives.
        A CUDA tensor is registered for it, as its first average does."""
        buf = x if isinstance(x, _Buf) else _as_float32(x)
        if not buf.cuda:
            return "host", "host memory"
        why = ctypes.create_string_buffer(512)
        with self._lock:
            rc = _L().mp_mem_path(self._cuda_mr(buf), why, len(why))
        if rc < 0:
            raise self._fail(rc, "memory_path")
        return _lib.MEM_PATHS[rc], why.value.decode(errors="replace")

    def _forget(self, h: "Handle") -> None:
        with self._lock:
            self._pending.discard(h)


class Handle:
    """An average in flight (mp_request). Complete it with ``wait`` or poll
    with ``done``; either may be called from any thread."""

    def __init__(self, ctx: Context, req: int, buf: _Buf) -> None:
        self._ctx = ctx
        self._req: Optional[int] = req
        self._buf: Optional[_Buf] = buf
        self._lock = threading.Lock()
        self._result: Optional[Result] = None
        self._error: Optional[Error] = None

    def _cancel(self) -> None:
        # Called by Context.close with this handle's lock held.
        if self._req is not None:
            self._req = None
            self._error = Closed(_errno.ECANCELED, "the context was closed while the "
                                 "average ran", "wait")
            self._buf = None

    def _finish(self, rc: int, res: _lib.MpResult) -> None:
        self._req = None
        buf, self._buf = self._buf, None
        if buf is not None and buf.writeback:
            buf.writeback()
        if rc < 0:
            self._error = self._ctx._fail(rc, "average_async")
        else:
            self._result = Result._from(res)
        self._ctx._forget(self)

    def _outcome(self) -> Result:
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result

    def done(self) -> bool:
        """Whether the average has ended (successfully or not); never blocks
        (False while another thread waits on it)."""
        if not self._lock.acquire(blocking=False):
            return False
        try:
            if self._req is None:
                return True
            flag = ctypes.c_int(0)
            res = _lib.MpResult()
            rc = _L().mp_test(self._req, ctypes.byref(flag), ctypes.byref(res))
            if flag.value or rc < 0:
                self._finish(rc, res)
                return True
            return False
        finally:
            self._lock.release()

    def stream_wait(self, stream: Optional[int] = None) -> None:
        """CUDA memory: make ``stream`` (a CUstream as an int, or a
        torch.cuda.Stream; None: torch's current stream, else the legacy
        default one) wait on the device until the average has ended, without
        blocking this thread. The handle must still be waited for."""
        if stream is None:
            try:
                import torch
                stream = torch.cuda.current_stream().cuda_stream if torch.cuda.is_available() \
                    else 0
            except ImportError:
                stream = 0
        elif hasattr(stream, "cuda_stream"):
            stream = stream.cuda_stream
        with self._lock:
            if self._req is None:
                return  # ended: the buffer holds what it will hold
            rc = _L().mp_request_stream_wait(self._req, int(stream) or None)
            if rc < 0:
                raise self._ctx._fail(rc, "stream_wait")

    def wait(self, timeout: Optional[float] = None) -> Result:
        """Wait for the average and return its Result, or raise its Error.
        ``timeout`` (seconds) bounds this wait only: past it Timeout is
        raised and the average goes on; with None the context's own
        deadlines bound it. The GIL is released while waiting."""
        ms = -1 if timeout is None else max(0, int(timeout * 1000))
        with self._lock:
            if self._req is None:
                return self._outcome()
            res = _lib.MpResult()
            rc = _L().mp_wait(self._req, ms, ctypes.byref(res))
            if rc == -_errno.ETIMEDOUT and timeout is not None:
                raise Timeout(_errno.ETIMEDOUT, f"not done within {timeout} s (the average "
                              "goes on)", "wait")
            self._finish(rc, res)
            return self._outcome()
