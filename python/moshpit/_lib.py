# SPDX-License-Identifier: BSD-3-Clause
"""ctypes bindings of libmoshpit's public API (include/moshpit/moshpit.h).

Only this module knows the C layout. The structures mirror the header field
for field; tests/python/test_layout.py compares them with the offsets a C
compiler gives, so a field added to the header without its mirror here fails
the suite instead of shifting every field after it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from ctypes import (POINTER, c_char_p, c_double, c_float, c_int, c_size_t, c_uint,
                    c_uint64, c_void_p)

# The string fields are declared c_void_p, not c_char_p: the Context keeps
# the bytes alive itself and sets the pointers, and reading a field back
# must not make a Python copy of whatever the environment pointed to.
_str = c_void_p


class MpConfig(ctypes.Structure):
    """struct mp_config, in the header's order."""

    _fields_ = [
        ("size", c_size_t),
        ("rank", c_int),
        ("npeers", c_int),
        ("peers", _str),
        ("hostfile", _str),
        ("listen", _str),
        ("run_name", _str),
        ("transport", _str),
        ("grid", _str),
        ("bandwidths", _str),
        ("algo", c_int),
        ("rounds", c_int),
        ("codec", c_int),
        ("chunk_bytes", c_size_t),
        ("streams", c_int),
        ("window", c_int),
        ("connect_timeout_ms", c_int),
        ("round_timeout_ms", c_int),
        ("checksum_payload", c_int),
        ("spin_us", c_int),
        ("log_level", c_int),
        ("codec_block", c_uint),
        ("codec_sigmas", c_float),
        ("topk_ratio", c_float),
        ("adacomp_bin", c_uint),
        ("rendezvous", _str),
        ("bootstrap", _str),
        ("dht_port", c_int),
        ("mode", c_int),
        ("bandwidth", c_double),
        ("run_key", _str),
        ("run_key_file", _str),
        ("peer_id", c_uint64),
        ("group_size", c_int),
        ("min_group_size", c_int),
        ("matchmaking_ms", c_int),
        ("request_timeout_ms", c_int),
        ("allreduce_timeout_ms", c_int),
        ("record_ttl_ms", c_int),
        ("join_timeout_ms", c_int),
        ("min_part", c_uint64),
        ("contrib_log", _str),
        ("fault", _str),
        ("balance", c_int),
        ("check_finite", c_int),
        ("probe_min_ms", c_int),
        ("probe_max_ms", c_int),
        ("direct_max", c_size_t),
        ("max_handshakes", c_int),
        ("cuda_stage", c_int),
        ("state_rate", c_uint64),
        ("direct_pairs", c_int),
    ]


STRING_FIELDS = frozenset(name for name, kind in MpConfig._fields_ if kind is _str)


class MpResult(ctypes.Structure):
    """struct mp_result."""

    _fields_ = [
        ("rounds", c_int),
        ("peers", c_int),
        ("weight", c_float),
        ("bytes_sent", c_uint64),
        ("bytes_received", c_uint64),
        ("frames_rejected", c_uint64),
        ("failed_peers", c_int),
        ("codec", c_int),
        ("values_sent", c_uint64),
        ("rounds_alone", c_int),
        ("group_size", c_int),
    ]


ADDR_STRLEN = 128


class MpPeerInfo(ctypes.Structure):
    """struct mp_peer_info."""

    _fields_ = [
        ("id", c_uint64),
        ("rank", c_int),
        ("mode", c_int),
        ("state", c_int),
        ("failures", c_int),
        ("addr", ctypes.c_char * ADDR_STRLEN),
        ("since_progress_s", c_double),
        ("bandwidth_Bps", c_double),
        ("rtt_s", c_double),
        ("bytes_sent", c_uint64),
        ("bytes_received", c_uint64),
        ("rate_Bps", c_double),
        ("weight", c_double),
    ]


class MpStats(ctypes.Structure):
    """struct mp_stats."""

    _fields_ = [(name, c_uint64) for name in (
        "frames_rejected", "conns_accepted", "conns_authenticated", "conns_refused",
        "conns_timed_out", "conns_evicted", "conns_hung_up", "handshakes_pending",
        "handshakes_max", "peers_known", "peers_held", "state_served", "state_refused",
        "state_cut", "state_busy")]


class MpStateInfo(ctypes.Structure):
    """struct mp_state_info."""

    _fields_ = [
        ("version", c_uint64),
        ("bytes", c_uint64),
        ("nbufs", c_int),
        ("meta_len", c_size_t),
        ("source", c_int),
        ("tries", c_int),
        ("resumed", c_uint64),
    ]


AVG_UNCOMPRESSED = 0x1
AVG_FLUSH = 0x2
MEM_CUDA = 1  # enum mp_mem_kind
MEM_PATH_HOST = 0  # enum mp_mem_path
MEM_PATH_STAGED = 1
MEM_PATH_DEVICE = 2
MEM_PATH_GPUDIRECT = 3
MEM_PATHS = {MEM_PATH_HOST: "host", MEM_PATH_STAGED: "staged", MEM_PATH_DEVICE: "device",
             MEM_PATH_GPUDIRECT: "gpudirect"}
# Room for the library's struct mp_config however much it grows: the
# library's own mp_config_init and mp_config_from_env write all of it.
CONFIG_ROOM = 4096

_PROTOTYPES = {
    "mp_config_init": (None, [c_void_p]),
    "mp_config_from_env": (c_int, [c_void_p]),
    "mp_init": (c_int, [c_void_p, POINTER(c_void_p)]),
    "mp_local_address": (c_int, [c_void_p, ctypes.c_char_p, c_size_t]),
    "mp_transport_detail": (c_int, [c_void_p, ctypes.c_char_p, c_size_t]),
    "mp_set_peers": (c_int, [c_void_p, POINTER(c_char_p), c_int]),
    "mp_rank": (c_int, [c_void_p]),
    "mp_npeers": (c_int, [c_void_p]),
    "mp_finalize": (c_int, [c_void_p]),
    "mp_average_start_ex": (c_int, [c_void_p, c_void_p, c_size_t, c_float, c_void_p, c_uint,
                                    POINTER(c_void_p)]),
    "mp_average_start_stream": (c_int, [c_void_p, c_void_p, c_size_t, c_float, c_void_p, c_uint,
                                        c_void_p, POINTER(c_void_p)]),
    "mp_request_stream_wait": (c_int, [c_void_p, c_void_p]),
    "mp_mem_register": (c_int, [c_void_p, c_void_p, c_size_t, c_int, POINTER(c_void_p)]),
    "mp_mem_deregister": (c_int, [c_void_p, c_void_p]),
    "mp_mem_path": (c_int, [c_void_p, c_char_p, c_size_t]),
    "mp_test": (c_int, [c_void_p, POINTER(c_int), POINTER(MpResult)]),
    "mp_wait": (c_int, [c_void_p, c_int, POINTER(MpResult)]),
    "mp_average_ex": (c_int, [c_void_p, c_void_p, c_size_t, c_float, c_uint, POINTER(MpResult)]),
    "mp_peers_info": (c_int, [c_void_p, c_void_p, c_int, c_size_t]),
    "mp_stats": (c_int, [c_void_p, POINTER(MpStats), c_size_t]),
    "mp_peer_id": (c_uint64, [c_void_p]),
    "mp_dht_address": (c_int, [c_void_p, ctypes.c_char_p, c_size_t]),
    "mp_leave": (c_int, [c_void_p]),
    "mp_mode_from_name": (c_int, [c_char_p]),
    "mp_strerror": (c_char_p, [c_int]),
    "mp_last_error": (c_char_p, [c_void_p]),
    "mp_log_set_level": (None, [c_int]),
    "mp_algo_from_name": (c_int, [c_char_p]),
    "mp_codec_from_name": (c_int, [c_char_p]),
    "mp_codec_parse": (c_int, [c_char_p, c_void_p]),
    "mp_transport_available": (c_int, [c_char_p]),
    "mp_grid_shape": (c_int, [c_char_p, c_int, POINTER(c_int), c_int]),
    "mp_state_serve": (c_int, [c_void_p, c_char_p]),
    "mp_state_address": (c_int, [c_void_p, ctypes.c_char_p, c_size_t]),
    "mp_state_publish": (c_int, [c_void_p, c_uint64, POINTER(c_void_p), POINTER(c_size_t), c_int,
                                 c_void_p, c_size_t]),
    "mp_state_query": (c_int, [c_void_p, POINTER(c_char_p), c_int, POINTER(MpStateInfo),
                               POINTER(c_size_t), c_int, c_void_p, c_size_t, c_int]),
    "mp_state_fetch": (c_int, [c_void_p, POINTER(c_char_p), c_int, POINTER(c_void_p),
                               POINTER(c_size_t), c_int, c_void_p, c_size_t,
                               POINTER(MpStateInfo), c_int]),
}


def _candidates() -> list[str]:
    """Where to look for libmoshpit.so, in order."""
    env = os.environ.get("MOSHPIT_LIB")
    if env:
        # An explicit choice is the only one: falling back to another copy
        # would run code the user did not ask for.
        return [env]
    found = []
    try:
        from . import _paths  # written by meson at install time
        found.append(os.path.join(_paths.LIBDIR, "libmoshpit.so.0"))
    except ImportError:
        pass
    name = ctypes.util.find_library("moshpit")
    if name:
        found.append(name)
    found.append("libmoshpit.so.0")
    return found


def load() -> ctypes.CDLL:
    """Load libmoshpit and declare the prototypes; raise OSError naming
    every place tried."""
    tried = []
    for path in _candidates():
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            tried.append(f"{path} ({e})")
            continue
        for name, (restype, argtypes) in _PROTOTYPES.items():
            fn = getattr(lib, name)
            fn.restype = restype
            fn.argtypes = argtypes
        return lib
    raise OSError("moshpit: cannot load libmoshpit.so: tried " + "; ".join(tried) +
                  ". Set MOSHPIT_LIB to the path of libmoshpit.so (a build tree's "
                  "build/src/libmoshpit.so, or the installed one)")
