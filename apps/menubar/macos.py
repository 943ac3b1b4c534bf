"""The macOS layer: menu bar (rumps), hotkeys (pynput), NSPasteboard, Accessibility, CGEvents.

Imported only on darwin (by `cli`), never by the core or by `import mlx_speech`. It is thin
on purpose: every decision lives in the tested core. Threads: AppKit, the pasteboard, CGEvent
posting and the core's `pump()` all run on the main thread (a rumps timer); the pynput
listener thread, the capture thread and the engine thread only `post()` to the core's queue.
"""

from __future__ import annotations

import subprocess
import time

from mlx_speech.errors import optional

from .core import App
from .devices import DeviceMicrophone, DeviceSpeaker
from .engine import Engine
from .events import Key, MenuAction, Quit
from .menu import SEPARATOR, present
from .ports import ClipboardSnapshot, InsertResult, Ports, copy_selection
from .settings import Settings, save_settings

KEY_V, KEY_C = 9, 8  # ANSI virtual key codes (US layout position)
TYPE_CHUNK = 16  # UTF-16 units per CGEvent
PANES = {
    "microphone": "x-apple.systempreferences:com.apple.preference.security?Privacy_Microphone",
    "accessibility": ("x-apple.systempreferences:com.apple.preference.security?"
                      "Privacy_Accessibility"),
}


class MacClipboard:
    def __init__(self):
        from AppKit import NSPasteboard

        self.pb = NSPasteboard.generalPasteboard()

    def token(self) -> int:
        return int(self.pb.changeCount())

    def snapshot(self) -> ClipboardSnapshot:
        items = []
        for item in self.pb.pasteboardItems() or []:
            entries = []
            for t in item.types():
                data = item.dataForType_(t)
                if data is not None:
                    entries.append((str(t), bytes(data)))
            items.append(tuple(entries))
        return ClipboardSnapshot(tuple(items))

    def restore(self, snap: ClipboardSnapshot) -> int:
        from AppKit import NSPasteboardItem
        from Foundation import NSData

        self.pb.clearContents()
        objs = []
        for entries in snap.items:
            item = NSPasteboardItem.alloc().init()
            for t, data in entries:
                item.setData_forType_(NSData.dataWithBytes_length_(data, len(data)), t)
            objs.append(item)
        if objs:
            self.pb.writeObjects_(objs)
        return self.token()

    def write_text(self, text: str) -> int:
        from AppKit import NSPasteboardTypeString

        self.pb.clearContents()
        self.pb.setString_forType_(text, NSPasteboardTypeString)
        return self.token()

    def read_text(self) -> str | None:
        from AppKit import NSPasteboardTypeString

        s = self.pb.stringForType_(NSPasteboardTypeString)
        return None if s is None else str(s)


def _utf16_chunks(text: str, n: int):
    """Pieces of at most n UTF-16 units, never splitting a surrogate pair."""
    piece, units = [], 0
    for ch in text:
        u = 2 if ord(ch) > 0xFFFF else 1
        if units + u > n:
            yield "".join(piece), units
            piece, units = [], 0
        piece.append(ch)
        units += u
    if piece:
        yield "".join(piece), units


def _post_key(code: int, command: bool = False) -> None:
    import Quartz as Q

    for down in (True, False):
        ev = Q.CGEventCreateKeyboardEvent(None, code, down)
        if command:
            Q.CGEventSetFlags(ev, Q.kCGEventFlagMaskCommand)
        Q.CGEventPost(Q.kCGHIDEventTap, ev)


class MacInserter:
    def focus(self) -> object:
        from AppKit import NSWorkspace

        app = NSWorkspace.sharedWorkspace().frontmostApplication()
        return None if app is None else int(app.processIdentifier())

    def type_text(self, text: str) -> InsertResult:
        import Quartz as Q

        if not _trusted():
            return InsertResult.NO_PERMISSION
        for piece, units in _utf16_chunks(text, TYPE_CHUNK):
            for down in (True, False):
                ev = Q.CGEventCreateKeyboardEvent(None, 0, down)
                Q.CGEventKeyboardSetUnicodeString(ev, units, piece)
                Q.CGEventPost(Q.kCGHIDEventTap, ev)
            time.sleep(0.004)  # some apps drop events that come too fast
        return InsertResult.OK

    def paste(self) -> InsertResult:
        if not _trusted():
            return InsertResult.NO_PERMISSION
        _post_key(KEY_V, command=True)
        return InsertResult.OK


def _trusted(prompt: bool = False) -> bool:
    from ApplicationServices import AXIsProcessTrusted, AXIsProcessTrustedWithOptions

    if prompt:
        return bool(AXIsProcessTrustedWithOptions({"AXTrustedCheckOptionPrompt": True}))
    return bool(AXIsProcessTrusted())


class MacSelection:
    """The Accessibility API's selected text, else Cmd-C with a sentinel (full restore)."""

    def __init__(self, clipboard: MacClipboard):
        self.clipboard = clipboard

    def read(self) -> str | None:
        import ApplicationServices as AS

        system = AS.AXUIElementCreateSystemWide()
        err, el = AS.AXUIElementCopyAttributeValue(system, AS.kAXFocusedUIElementAttribute, None)
        if err == 0 and el is not None:
            err, text = AS.AXUIElementCopyAttributeValue(el, AS.kAXSelectedTextAttribute, None)
            if err == 0 and text:
                return str(text)
        return copy_selection(self.clipboard, lambda: _post_key(KEY_C, command=True), time.sleep)


class MacPermissions:
    def granted(self, kind: str) -> bool:
        if kind == "accessibility":
            return _trusted()
        if kind == "microphone":
            from AVFoundation import AVCaptureDevice, AVMediaTypeAudio

            # 0 not determined (opening the mic asks), 1 restricted, 2 denied, 3 authorized
            return AVCaptureDevice.authorizationStatusForMediaType_(AVMediaTypeAudio) in (0, 3)
        return True

    def open_settings(self, kind: str) -> None:
        if kind == "accessibility":
            _trusted(prompt=True)  # adds this app to the list
        subprocess.run(["open", PANES[kind]], check=False)


# ANSI virtual key codes: a chord's letter is matched by key position, because with Option
# held macOS reports another character (Option-S is "ß")
ANSI_VK = dict(zip("asdfhgzxcvbqweryt123465=97-80]ou[ip\rlj'k;\\,/nm.",
                   [*range(0, 10), *range(11, 34), *range(34, 48)], strict=False))


class Hotkeys:
    """pynput listener -> Key events. A spec is "alt_r" or "ctrl+alt+s"; its "down" comes
    when all its keys are down and its "up" when the last of them is released."""

    def __init__(self, post, specs: dict[str, str]):
        from pynput import keyboard

        self.kb, self.post = keyboard, post
        self.chords = {name: self._parse(spec) for name, spec in specs.items()}
        self.down: set = set()
        self.active: set[str] = set()
        self.listener = keyboard.Listener(on_press=self._press, on_release=self._release)

    def _parse(self, spec: str) -> frozenset:
        keys = set()
        for part in spec.lower().split("+"):
            part = {"control": "ctrl", "option": "alt", "opt": "alt",
                    "command": "cmd"}.get(part, part)
            if hasattr(self.kb.Key, part):
                keys.add(getattr(self.kb.Key, part))
            elif part in ANSI_VK:
                keys.add(("vk", ANSI_VK[part]))
            else:
                raise ValueError(f"unknown key {part!r} in hotkey {spec!r}")
        return frozenset(keys)

    def _token(self, key):
        if isinstance(key, self.kb.Key):
            return key
        vk = getattr(key, "vk", None)
        if vk is not None:
            return ("vk", vk)
        return ("char", (key.char or "").lower())

    def _press(self, key) -> None:
        tok = self._token(key)
        if tok == self.kb.Key.esc:
            self.post(Key("esc", True))
        self.down.add(tok)
        for name, chord in self.chords.items():
            if name not in self.active and chord <= self.down:
                self.active.add(name)
                self.post(Key(name, True))

    def _release(self, key) -> None:
        self.down.discard(self._token(key))
        for name in list(self.active):
            if not (self.chords[name] & self.down):  # all of the chord's keys are up
                self.active.discard(name)
                self.post(Key(name, False))

    def start(self) -> None:
        self.listener.start()


def run(settings: Settings) -> None:
    with optional("app", "the menu-bar app"):  # every platform package, before anything starts
        import AppKit  # noqa: F401
        import ApplicationServices  # noqa: F401
        import AVFoundation  # noqa: F401
        import Foundation  # noqa: F401
        import pynput  # noqa: F401
        import Quartz  # noqa: F401
        import rumps

    from .bundle import set_login_item

    clipboard = MacClipboard()
    ports = Ports(microphone=DeviceMicrophone(), inserter=MacInserter(), clipboard=clipboard,
                  selection=MacSelection(clipboard), permissions=MacPermissions())
    holder: list[App] = []
    engine = Engine(lambda ev: holder[0].post(ev), speaker_factory=DeviceSpeaker)

    def on_save(s: Settings) -> None:
        old = holder[0].settings if holder else settings
        save_settings(s)
        if s.login_item != old.login_item:
            set_login_item(s.login_item)

    app = App(ports, engine, settings, clock=time.monotonic, save_settings=on_save)
    holder.append(app)

    class MenuBar(rumps.App):
        def __init__(self):
            super().__init__("MLX Speech", title="\u25cb", quit_button=None)
            self.shown = None
            rumps.Timer(self.tick, 0.03).start()

        def tick(self, _timer) -> None:  # main thread
            app.pump()
            if app.done:
                engine.shutdown(timeout=5)
                rumps.quit_application()
                return
            menu = present(app.view())
            if menu != self.shown:
                self.shown = menu
                self.title = menu.title
                self.menu.clear()
                self.menu.update([self._item(it) for it in menu.items])

        def _item(self, it):
            if it is SEPARATOR:
                return rumps.separator
            cb = (lambda _sender, aid=it.id: app.post(MenuAction(aid))) if it.id else None
            item = rumps.MenuItem(it.title, callback=cb)
            item.state = 1 if it.checked else 0
            for child in it.children:
                item.add(self._item(child))
            return item

    engine.start()
    Hotkeys(app.post, {"dictate": settings.dictate_hotkey,
                       "speak": settings.speak_hotkey}).start()
    app.start()
    try:
        MenuBar().run()
    finally:
        app.post(Quit())
