"""The keyboard layout and Secure Event Input, through Carbon (ctypes: PyObjC wraps neither).

Text Input Sources (TIS) must be called on the main thread: macOS 14+ traps
(`_dispatch_assert_queue_fail`) when TSM runs elsewhere, which is what crashes pynput's
listener (pynput#424). Every function here is called from the main thread only.

`load()` opens the libraries once; tests replace it with a stand-in that has the same names.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from types import SimpleNamespace

CMD_KEY = 1  # UCKeyTranslate's modifier state: (cmdKey >> 8) & 0xFF
ACTION_DISPLAY = 3  # kUCKeyActionDisplay
NO_DEAD_KEYS = 1  # kUCKeyTranslateNoDeadKeysMask
CARBON = "/System/Library/Frameworks/Carbon.framework/Carbon"
CORE_FOUNDATION = "/System/Library/Frameworks/CoreFoundation.framework/CoreFoundation"

_lib = None


def load():
    """The Carbon functions this module uses, typed (cached)."""
    global _lib
    if _lib is None:
        c = ctypes.cdll.LoadLibrary(ctypes.util.find_library("Carbon") or CARBON)
        cf = ctypes.cdll.LoadLibrary(ctypes.util.find_library("CoreFoundation")
                                     or CORE_FOUNDATION)
        vp = ctypes.c_void_p
        for name in ("TISCopyCurrentKeyboardLayoutInputSource",
                     "TISCopyCurrentASCIICapableKeyboardLayoutInputSource"):
            getattr(c, name).restype, getattr(c, name).argtypes = vp, []
        c.TISGetInputSourceProperty.restype = vp
        c.TISGetInputSourceProperty.argtypes = [vp, vp]
        c.LMGetKbdType.restype, c.LMGetKbdType.argtypes = ctypes.c_uint8, []
        c.UCKeyTranslate.restype = ctypes.c_int32
        c.UCKeyTranslate.argtypes = [
            vp, ctypes.c_uint16, ctypes.c_uint16, ctypes.c_uint32, ctypes.c_uint32,
            ctypes.c_uint32, ctypes.POINTER(ctypes.c_uint32), ctypes.c_ulong,
            ctypes.POINTER(ctypes.c_ulong), ctypes.POINTER(ctypes.c_uint16)]
        c.IsSecureEventInputEnabled.restype = ctypes.c_bool
        c.IsSecureEventInputEnabled.argtypes = []
        cf.CFDataGetBytePtr.restype, cf.CFDataGetBytePtr.argtypes = vp, [vp]
        cf.CFRelease.restype, cf.CFRelease.argtypes = None, [vp]
        _lib = SimpleNamespace(
            TISCopyCurrentKeyboardLayoutInputSource=c.TISCopyCurrentKeyboardLayoutInputSource,
            TISCopyCurrentASCIICapableKeyboardLayoutInputSource=(
                c.TISCopyCurrentASCIICapableKeyboardLayoutInputSource),
            TISGetInputSourceProperty=c.TISGetInputSourceProperty,
            kTISPropertyUnicodeKeyLayoutData=vp.in_dll(
                c, "kTISPropertyUnicodeKeyLayoutData").value,
            LMGetKbdType=c.LMGetKbdType, UCKeyTranslate=c.UCKeyTranslate,
            IsSecureEventInputEnabled=c.IsSecureEventInputEnabled,
            CFDataGetBytePtr=cf.CFDataGetBytePtr, CFRelease=cf.CFRelease)
    return _lib


def _translate(lib, layout, code: int, modifiers: int, kbd: int) -> str:
    dead = ctypes.c_uint32(0)
    n = ctypes.c_ulong(0)
    buf = (ctypes.c_uint16 * 4)()
    err = lib.UCKeyTranslate(layout, code, ACTION_DISPLAY, modifiers, kbd, NO_DEAD_KEYS,
                             ctypes.byref(dead), 4, ctypes.byref(n), buf)
    if err:
        return ""
    return "".join(chr(buf[i]) for i in range(min(n.value, 4)))


def keycode_for(char: str, command: bool = False, lib=None) -> int | None:
    """The virtual key code that types `char` in the current layout (with Command held when
    `command`: "Dvorak - QWERTY ⌘" maps keys differently then); the ASCII-capable layout when
    the current one has no such key (e.g. Russian); None when neither has it."""
    lib = lib or load()
    mods = CMD_KEY if command else 0
    for copy in (lib.TISCopyCurrentKeyboardLayoutInputSource,
                 lib.TISCopyCurrentASCIICapableKeyboardLayoutInputSource):
        src = copy()
        if not src:
            continue
        try:
            data = lib.TISGetInputSourceProperty(src, lib.kTISPropertyUnicodeKeyLayoutData)
            if not data:  # an input method without a Unicode layout
                continue
            layout, kbd = lib.CFDataGetBytePtr(data), lib.LMGetKbdType()
            for code in range(128):
                if _translate(lib, layout, code, mods, kbd).lower() == char:
                    return code
        finally:
            lib.CFRelease(src)
    return None


def secure_input(lib=None) -> bool:
    """Secure Event Input is on (a password field, Terminal's Secure Keyboard Entry):
    synthesized key events are dropped, so nothing may be reported "inserted"."""
    return bool((lib or load()).IsSecureEventInputEnabled())
