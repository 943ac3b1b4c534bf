"""Hotkeys from a listen-only Quartz event tap on the MAIN run loop (macOS only).

Not pynput: its listener thread reads the keyboard layout (TSM) off the main thread, which
traps on macOS 14+ (pynput#424), dies silently when the tap cannot be created, and never
re-enables a tap macOS disabled. Here the tap's callbacks run on the main thread, the layout
is read there when the tap starts, the tap is re-enabled when macOS disables it for a slow
callback, and `start()` can be called again (the core does, when the permission arrives).
Every event carries its own timestamp, so a late run loop cannot turn a hold into a tap.
"""

from __future__ import annotations

import sys
import time
import traceback
from collections.abc import Callable

from .keys import FLAGS_CHANGED, KEY_DOWN, KEY_UP, KeyTracker, event_time, parse_hotkey

SYNTH_MARK = 0x4D4C5853  # kCGEventSourceUserData of the keys we post ourselves: ignored


class TapHotkeys:
    def __init__(self, post: Callable, specs: dict[str, str],
                 keycode_for: Callable[[str], int | None] | None = None,
                 now_ns: Callable[[], int] | None = None):
        for spec in specs.values():
            parse_hotkey(spec)  # a bad setting is an error at start, not a silent dead key
        self.post, self.specs, self.keycode_for = post, specs, keycode_for
        self.now_ns = now_ns or (lambda: time.monotonic_ns())
        self.tap = self.source = None
        self.tracker: KeyTracker | None = None

    def running(self) -> bool:
        return self.tap is not None

    def start(self) -> bool:
        """Main thread. False while neither Input Monitoring nor Accessibility allows a tap."""
        if self.tap is not None:
            return True
        import ApplicationServices as AS
        import Quartz as Q

        if not (Q.CGPreflightListenEventAccess() or AS.AXIsProcessTrusted()):
            return False
        self.tracker = KeyTracker(self.specs, self.keycode_for)  # TIS: main thread
        mask = (Q.CGEventMaskBit(Q.kCGEventKeyDown) | Q.CGEventMaskBit(Q.kCGEventKeyUp)
                | Q.CGEventMaskBit(Q.kCGEventFlagsChanged))
        tap = Q.CGEventTapCreate(Q.kCGSessionEventTap, Q.kCGHeadInsertEventTap,
                                 Q.kCGEventTapOptionListenOnly, mask, self._callback, None)
        if tap is None:
            return False
        source = Q.CFMachPortCreateRunLoopSource(None, tap, 0)
        Q.CFRunLoopAddSource(Q.CFRunLoopGetMain(), source, Q.kCFRunLoopCommonModes)
        Q.CGEventTapEnable(tap, True)
        self.tap, self.source = tap, source
        return True

    def stop(self) -> None:
        if self.tap is None:
            return
        import Quartz as Q

        tap, source, self.tap, self.source = self.tap, self.source, None, None
        Q.CGEventTapEnable(tap, False)
        Q.CFRunLoopRemoveSource(Q.CFRunLoopGetMain(), source, Q.kCFRunLoopCommonModes)
        Q.CFMachPortInvalidate(tap)
        for k in self.tracker.reset(self.now_ns() / 1e9):
            self.post(k)

    def _callback(self, proxy, etype, event, refcon):
        try:
            import Quartz as Q

            if etype in (Q.kCGEventTapDisabledByTimeout, Q.kCGEventTapDisabledByUserInput):
                if self.tap is not None:
                    Q.CGEventTapEnable(self.tap, True)
                return event
            kind = {Q.kCGEventKeyDown: KEY_DOWN, Q.kCGEventKeyUp: KEY_UP,
                    Q.kCGEventFlagsChanged: FLAGS_CHANGED}.get(etype)
            if kind is None or self.tracker is None:
                return event
            if Q.CGEventGetIntegerValueField(event, Q.kCGEventSourceUserData) == SYNTH_MARK:
                return event
            code = int(Q.CGEventGetIntegerValueField(event, Q.kCGKeyboardEventKeycode))
            flags = int(Q.CGEventGetFlags(event))
            t = event_time(int(Q.CGEventGetTimestamp(event)), self.now_ns())
            repeat = kind == KEY_DOWN and bool(
                Q.CGEventGetIntegerValueField(event, Q.kCGKeyboardEventAutorepeat))
            for k in self.tracker.event(kind, code, flags, t, repeat):
                self.post(k)
        except Exception:  # never let an exception reach the tap: report and go on
            traceback.print_exc(file=sys.stderr)
        return event
