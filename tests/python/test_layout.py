# SPDX-License-Identifier: BSD-3-Clause
"""The ctypes mirrors in moshpit._lib against what a C compiler makes of
include/moshpit/moshpit.h (tests/python/layout.c)."""

import ctypes
import os
import subprocess

from moshpit import _lib

STRUCTS = {"mp_config": _lib.MpConfig, "mp_result": _lib.MpResult,
           "mp_peer_info": _lib.MpPeerInfo, "mp_stats": _lib.MpStats,
           "mp_state_info": _lib.MpStateInfo}


def test_struct_layouts_match_the_header():
    tool = os.environ["MOSHPIT_LAYOUT_TOOL"]
    out = subprocess.run([tool], check=True, capture_output=True, text=True, timeout=30).stdout
    seen = {name: [] for name in STRUCTS}
    checked = 0
    consts = 0
    for line in out.splitlines():
        struct, field, offset, size = line.split()
        if struct == "const":
            assert getattr(_lib, field[len("MP_"):]) == int(offset), field
            consts += 1
            continue
        cls = STRUCTS[struct]
        if field == "-":
            assert ctypes.sizeof(cls) == int(offset), f"sizeof(struct {struct})"
            continue
        seen[struct].append(field)
        desc = getattr(cls, field)
        assert (desc.offset, desc.size) == (int(offset), int(size)), f"{struct}.{field}"
        checked += 1
    for struct, cls in STRUCTS.items():
        assert seen[struct] == [f for f, _ in cls._fields_], f"layout.c lists {struct}'s fields"
    assert checked > 70
    assert consts == 7


def test_library_agrees_on_the_config_size():
    lib = _lib.load()
    room = ctypes.create_string_buffer(_lib.CONFIG_ROOM)
    lib.mp_config_init(room)
    assert _lib.MpConfig.from_buffer(room).size == ctypes.sizeof(_lib.MpConfig)
