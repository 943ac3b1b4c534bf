"""The few facts `--install-app` needs from an executable's header (no otool: it is a
Command Line Tools shim on a Mac without them).

`kind(data)` says what a file is ("mach-o", "elf", "script" or None); `load_commands(data)`
lists a Mach-O's dylibs and rpaths (thin or universal, 64- or 32-bit). A copied interpreter
that loads libpython through `@executable_path`/`@rpath` needs that library beside it.
"""

from __future__ import annotations

import struct

MH_MAGIC, MH_MAGIC_64 = 0xFEEDFACE, 0xFEEDFACF
FAT_MAGIC, FAT_MAGIC_64 = 0xCAFEBABE, 0xCAFEBABF
LC_REQ_DYLD = 0x80000000
LC_LOAD_DYLIB, LC_LOAD_WEAK_DYLIB, LC_REEXPORT_DYLIB = 0xC, 0x18 | LC_REQ_DYLD, 0x1F | LC_REQ_DYLD
LC_LAZY_LOAD_DYLIB, LC_LOAD_UPWARD_DYLIB = 0x20, 0x23 | LC_REQ_DYLD
LC_RPATH = 0x1C | LC_REQ_DYLD
DYLIB_COMMANDS = {LC_LOAD_DYLIB, LC_LOAD_WEAK_DYLIB, LC_REEXPORT_DYLIB, LC_LAZY_LOAD_DYLIB,
                  LC_LOAD_UPWARD_DYLIB}


def kind(data: bytes) -> str | None:
    if len(data) < 4:
        return None
    if data[:2] == b"#!":
        return "script"
    if data[:4] == b"\x7fELF":
        return "elf"
    for order in "<>":
        if struct.unpack(order + "I", data[:4])[0] in (MH_MAGIC, MH_MAGIC_64):
            return "mach-o"
    if struct.unpack(">I", data[:4])[0] in (FAT_MAGIC, FAT_MAGIC_64):
        return "mach-o"
    return None


def _cstr(blob: bytes, offset: int) -> str:
    end = blob.find(b"\0", offset)
    return blob[offset:end if end >= 0 else len(blob)].decode("utf-8", "replace")


def _thin(data: bytes, base: int) -> tuple[list[str], list[str]]:
    for order in "<>":
        magic = struct.unpack_from(order + "I", data, base)[0]
        if magic in (MH_MAGIC, MH_MAGIC_64):
            break
    else:
        raise ValueError("not a Mach-O image")
    ncmds = struct.unpack_from(order + "I", data, base + 16)[0]
    off = base + (32 if magic == MH_MAGIC_64 else 28)
    dylibs, rpaths = [], []
    for _ in range(ncmds):
        cmd, size = struct.unpack_from(order + "II", data, off)
        if size < 8:
            raise ValueError("corrupt load command")
        blob = data[off:off + size]
        if cmd in DYLIB_COMMANDS:
            dylibs.append(_cstr(blob, struct.unpack_from(order + "I", blob, 8)[0]))
        elif cmd == LC_RPATH:
            rpaths.append(_cstr(blob, struct.unpack_from(order + "I", blob, 8)[0]))
        off += size
    return dylibs, rpaths


def load_commands(data: bytes) -> tuple[list[str], list[str]]:
    """(dylibs, rpaths) of every architecture in the file, in order, without repeats."""
    if len(data) < 8:
        raise ValueError("not a Mach-O file")
    magic = struct.unpack(">I", data[:4])[0]
    bases = [0]
    if magic in (FAT_MAGIC, FAT_MAGIC_64):
        n = struct.unpack_from(">I", data, 4)[0]
        step, fmt = (32, ">iiQQI") if magic == FAT_MAGIC_64 else (20, ">iiIII")
        bases = [struct.unpack_from(fmt, data, 8 + i * step)[2] for i in range(n)]
    dylibs: list[str] = []
    rpaths: list[str] = []
    for b in bases:
        d, r = _thin(data, b)
        dylibs += [x for x in d if x not in dylibs]
        rpaths += [x for x in r if x not in rpaths]
    return dylibs, rpaths

