"""A fake macOS for the app's platform layer: modules standing in for AppKit, Foundation,
Quartz, ApplicationServices/HIServices, AVFoundation, PyObjCTools.AppHelper and Carbon (the
ctypes functions `carbon.load()` returns).

Names and call shapes are PyObjC's (`AXUIElementCopyAttributeValue(el, attr, None)` returns
`(err, value)`, blocks are plain callables, selectors end in `_`). Every call is counted,
and the ones that must run on the main thread (AppKit, Foundation's run loop and timers, Text
Input Sources) are recorded with their thread when they do not.

`World` is the Mac: TCC state (each permission and its prompts), the keyboard (HID modifier
state, the layout), Secure Event Input, the general pasteboard, the frontmost app (a text
field that types, pastes on Cmd-V and copies its selection on Cmd-C, as its layout reads
the keys), event taps, status items and menus, and the main run loop with a virtual clock
(`time.monotonic` follows it). The app runs on the test's main thread inside
`NSApplication.run()`; a script thread acts as the user: keys, clicks, grants, time.
"""

from __future__ import annotations

import gc
import os
import sys
import threading
import time
import traceback
import types
import weakref
from collections import Counter, deque

MAIN = threading.main_thread()
WORLD: World | None = None

# Quartz constants (the values PyObjC exposes)
KEY_DOWN, KEY_UP, FLAGS_CHANGED = 10, 11, 12
SHIFT, CONTROL, OPTION, COMMAND, FN = 0x20000, 0x40000, 0x80000, 0x100000, 0x800000
NON_COALESCED = 0x100
# keycode -> (side-independent flag, device-dependent flag)
MODS = {59: (CONTROL, 0x1), 62: (CONTROL, 0x2000), 56: (SHIFT, 0x2), 60: (SHIFT, 0x4),
        55: (COMMAND, 0x8), 54: (COMMAND, 0x10), 58: (OPTION, 0x20), 61: (OPTION, 0x40),
        63: (FN, 0)}
ANSI = dict(zip("asdfhgzxcvbqweryt123465=97-80]ou[ip\rlj'k;\\,/nm.`",
                [*range(0, 10), *range(11, 34), *range(34, 48), 50], strict=True))
US = {code: ch for ch, code in ANSI.items()}
DVORAK = dict(US)
for _q, _d in zip("qwertyuiop[]asdfghjkl;'zxcvbnm,./", "',.pyfgcrl/=aoeuidhtns-;qjkxbmwvz",
                  strict=True):
    DVORAK[ANSI[_q]] = _d
MAIN_ONLY = ("AppKit", "Foundation", "Carbon")


def _w() -> World:
    return WORLD


def rec(name: str) -> None:
    WORLD.record(name)


# ---------------------------------------------------------------- the Mac


class TargetApp:
    """The frontmost app: a text field."""

    def __init__(self, pid=4242, bundle="com.apple.TextEdit", selection=None, ax=True):
        self.pid, self.bundle = pid, bundle
        self.text = ""
        self.selection = selection  # what is selected (Cmd-C copies it)
        self.ax = ax  # exposes kAXSelectedTextAttribute
        self.shortcuts: list = []  # key presses that were not text, paste or copy
        self.garbled: list[str] = []  # text typed with a modifier stuck on: shortcuts

    def receive(self, world: World, ev, flags: int) -> None:
        if ev.type != KEY_DOWN:
            return
        mods = flags & (CONTROL | OPTION | COMMAND)
        if ev.unicode is not None:
            (self.garbled.append if mods else lambda s: setattr(self, "text", self.text + s))(
                ev.unicode)
            return
        ch = world.char_for(ev.keycode, command=bool(flags & COMMAND))
        if flags & (SHIFT | CONTROL | OPTION | COMMAND) == COMMAND and ch in ("v", "c"):
            if ch == "v":
                self.text += world.pb.string() or ""
            elif self.selection is not None:
                world.pb.set_items([{"public.utf8-plain-text": self.selection.encode()}])
            return
        self.shortcuts.append((hex(flags & ~NON_COALESCED), ch))


class Pasteboard:
    def __init__(self):
        self.items: list[dict] = []  # type -> bytes, or a callable that renders them
        self.count = 0
        self.renders: Counter = Counter()  # lazily provided types rendered (bytes read)
        self.options: list[int] = []

    def clear(self) -> None:
        self.items = []
        self.count += 1

    def set_items(self, items: list[dict]) -> None:
        self.clear()
        self.items = [dict(i) for i in items]

    def data(self, i: int, t: str) -> bytes | None:
        v = self.items[i].get(t)
        if callable(v):
            v = v()
            self.renders[t] += len(v)
        return v

    def string(self) -> str | None:
        for i, item in enumerate(self.items):
            if "public.utf8-plain-text" in item:
                return self.data(i, "public.utf8-plain-text").decode()
        return None


class World:
    def __init__(self, *, ax=True, listen=True, mic=3, layout=None, front=None):
        self.t_ns = 5_000 * 10**9
        self.counts: Counter = Counter()
        self.off_main: list[tuple[str, str]] = []
        self.ax_trusted, self.listen_access, self.mic_status = ax, listen, mic
        self.prompts: list[str] = []
        self.mic_handlers: list = []
        self.opened: list[str] = []
        self.layout = layout or US
        self.hid_flags = 0
        self._mods: set[int] = set()
        self.secure_input = False
        self.pb = Pasteboard()
        self.front = front or TargetApp()
        self.posted: list = []  # (event, effective flags)
        self.dropped: list = []
        self.ax_timeouts: list[float] = []
        self.taps: list = []
        self.timers: list = []
        self.jobs: deque = deque()
        self.cv = threading.Condition()
        self.running = False
        self.menu_tracking = False  # a menu is open: default-mode timers wait
        self.status_items: list = []
        self.live_items: weakref.WeakSet = weakref.WeakSet()
        self.nsapp = None
        self.policy = None
        self.activations = 0
        self.activity: list = []  # ("begin"/"end", options)
        self.popped = 0
        self.exited: dict | None = None  # what was true when the process exited
        self.on_exit = None  # callable -> dict, evaluated at exit
        self.on_run = None
        self.carbon = _carbon_module()

    # -- clock and records
    def monotonic(self) -> float:
        return self.t_ns / 1e9

    def monotonic_ns(self) -> int:
        return self.t_ns

    def record(self, name: str) -> None:
        self.counts[name] += 1
        th = threading.current_thread()
        if th is not MAIN and name.split(".")[0] in MAIN_ONLY:
            self.off_main.append((name, th.name))

    def char_for(self, code: int, command: bool = False) -> str:
        return self.layout.get(code, "")

    # -- the main run loop
    def put(self, job) -> None:
        with self.cv:
            self.jobs.append(job)
            self.cv.notify_all()

    def run_loop(self) -> None:
        assert threading.current_thread() is MAIN, "NSApplication.run() off the main thread"
        self.running = True
        if self.on_run is not None:
            self.on_run()
        idle_since = time.perf_counter()
        while self.running:
            with self.cv:
                if not self.jobs:
                    self.cv.wait(0.05)
                job = self.jobs.popleft() if self.jobs else None
            if job is None:
                if time.perf_counter() - idle_since > 120:
                    raise AssertionError("the fake run loop idled for 2 minutes")
                continue
            idle_since = time.perf_counter()
            job()

    def _drain(self) -> None:
        while True:
            with self.cv:
                job = self.jobs.popleft() if self.jobs else None
            if job is None:
                return
            job()

    def on_main(self, fn, timeout: float = 30.0):
        """Script thread: run fn on the main thread (between run-loop events), return it."""
        if threading.current_thread() is MAIN:
            return fn()
        done, box = threading.Event(), {}

        def job():
            try:
                box["r"] = fn()
            except BaseException as e:
                box["e"] = e
                if not isinstance(e, Exception):
                    done.set()
                    raise
            done.set()

        self.put(job)
        deadline = time.perf_counter() + timeout
        while not done.wait(0.02):
            if self.exited is not None or (not self.running and self.on_run is None):
                return None  # the app has exited: nothing runs on its main thread any more
            if time.perf_counter() > deadline:
                raise AssertionError("the main thread did not run the job")
        if isinstance(box.get("e"), Exception):
            raise box["e"]
        return box.get("r")

    def advance(self, seconds: float) -> None:
        """Let `seconds` of virtual time pass on the main run loop, firing timers in order
        (and running what other threads queued in between)."""
        def go():
            end = self.t_ns + int(seconds * 1e9)
            while True:
                due = [t for t in self.timers if t.valid and t.fire_at <= end
                       and (not self.menu_tracking or t.common)]
                if not due:
                    self.t_ns = end
                    self._drain()
                    return
                t = min(due, key=lambda t: t.fire_at)
                self.t_ns = max(self.t_ns, t.fire_at)
                if t.repeats:
                    t.fire_at += t.interval_ns
                else:
                    t.valid = False
                t.fire()
                self._drain()
        self.on_main(go)

    # -- input
    def key(self, code: int, down: bool, *, at: float | None = None) -> None:
        self.keys([(code, down, at)])

    def keys(self, events) -> None:
        """Keys moving (at virtual times, default now), delivered to the taps in one go."""
        evs = []
        for code, down, at in events:
            ts = self.t_ns if at is None else int(at * 1e9)
            if code in MODS:
                (self._mods.add if down else self._mods.discard)(code)
                flags = 0
                for c in self._mods:
                    flags |= MODS[c][0] | MODS[c][1]
                self.hid_flags = flags
                evs.append(Event(FLAGS_CHANGED, code, flags | NON_COALESCED, ts))
            else:
                evs.append(Event(KEY_DOWN if down else KEY_UP, code,
                                 self.hid_flags | NON_COALESCED, ts))
        main_taps = [t for t in self.taps if t.loop == "main"]
        if main_taps:
            def fire():
                for ev in evs:
                    for tap in list(self.taps):
                        if tap.loop == "main" and tap.enabled:
                            tap.callback(None, ev.type, ev, tap.refcon)
            self.on_main(fire)

    def answer_mic(self, granted: bool) -> None:
        """The user clicks the microphone prompt (the handler runs on another queue)."""
        self.mic_status = 3 if granted else 2
        handlers, self.mic_handlers = self.mic_handlers, []
        for h in handlers:
            th = threading.Thread(target=h, args=(granted,), name="avfoundation-queue")
            th.start()
            th.join()

    # -- the menu bar
    def status_item(self):
        return self.status_items[-1] if self.status_items else None

    def menu(self):
        si = self.status_item()
        return None if si is None else si._menu

    def titles(self, menu=None) -> list[str]:
        menu = menu or self.menu()
        return [] if menu is None else [i._title for i in menu._items if not i._sep]

    def find(self, title: str):
        """The menu item with this title, else the first whose title starts with it."""
        items = list(self._walk(self.menu()))
        return next((it for it in items if it._title == title), None) or next(
            (it for it in items if it._title.startswith(title)), None)

    def _walk(self, menu):
        for it in ([] if menu is None else menu._items):
            if not it._sep:
                yield it
            if it._submenu is not None:
                yield from self._walk(it._submenu)

    def click(self, prefix: str) -> None:
        def go():
            item = self.find(prefix)
            assert item is not None, f"no menu item {prefix!r} in {self.titles()}"
            assert item._enabled and item._action, f"{prefix!r} is not clickable"
            getattr(item._target, item._action.replace(":", "_"))(item)
        self.on_main(go)

    def live_menu_items(self) -> int:
        gc.collect()
        return len(self.live_items)

    # -- exit
    def terminate(self) -> None:
        d = self.nsapp._delegate if self.nsapp is not None else None
        if d is not None and hasattr(d, "applicationShouldTerminate_"):
            if d.applicationShouldTerminate_(self.nsapp) == 2:  # NSTerminateLater
                return
        self.exit()

    def exit(self) -> None:
        self.exited = {"threads": sorted(t.name for t in threading.enumerate()
                                         if t.is_alive()), "t": self.t_ns}
        if self.on_exit is not None:
            self.exited.update(self.on_exit())
        self.running = False
        raise SystemExit(0)


class Event:
    def __init__(self, etype, keycode, flags, ts):
        self.type, self.keycode, self.flags, self.ts = etype, keycode, flags, ts
        self.unicode: str | None = None
        self.userdata = 0


# ---------------------------------------------------------------- Carbon (ctypes stand-in)


def _carbon_module():
    def tis(name, value):
        def f(*args):
            rec("Carbon." + name)
            return value
        return f

    def get_property(src, key):
        rec("Carbon.TISGetInputSourceProperty")
        return src * 10 if key == 777 else None

    def translate(layout, code, action, mods, kbd, opts, dead, maxlen, n, buf):
        rec("Carbon.UCKeyTranslate")
        table = WORLD.layout if layout == 10 else US
        ch = table.get(code, "")
        for i, c in enumerate(ch[:maxlen]):
            buf[i] = ord(c)
        n._obj.value = len(ch)
        return 0

    def secure():
        rec("Carbon.IsSecureEventInputEnabled")
        return WORLD.secure_input

    return types.SimpleNamespace(
        TISCopyCurrentKeyboardLayoutInputSource=tis(
            "TISCopyCurrentKeyboardLayoutInputSource", 1),
        TISCopyCurrentASCIICapableKeyboardLayoutInputSource=tis(
            "TISCopyCurrentASCIICapableKeyboardLayoutInputSource", 2),
        TISCopyCurrentKeyboardInputSource=tis("TISCopyCurrentKeyboardInputSource", 1),
        TISGetInputSourceProperty=get_property, kTISPropertyUnicodeKeyLayoutData=777,
        CFDataGetBytePtr=lambda d: d, LMGetKbdType=tis("LMGetKbdType", 40),
        UCKeyTranslate=translate, IsSecureEventInputEnabled=secure,
        CFRelease=lambda x: None)


# ---------------------------------------------------------------- Foundation / AppKit


class NSObject:
    @classmethod
    def alloc(cls):
        return cls.__new__(cls)

    def init(self):
        return self


def _cls(module: str, name: str, methods: dict, base=NSObject):
    def wrap(mname, fn):
        def m(*a, **k):
            rec(f"{module}.{name}.{mname}")
            return fn(*a, **k)
        return m

    ns = {k: (classmethod(wrap(k, v.__func__)) if isinstance(v, classmethod)
              else wrap(k, v) if callable(v) else v) for k, v in methods.items()}
    return type(name, (base,), ns)


class _Data:
    def __init__(self, b: bytes):
        self._b = bytes(b)

    def __bytes__(self):
        return self._b

    def length(self):
        return len(self._b)


def _data_methods():
    return {"dataWithBytes_length_": classmethod(lambda cls, b, n: _Data(bytes(b)[:n])),
            "data": classmethod(lambda cls: _Data(b""))}


class _Timer:
    def __init__(self, interval, target, selector, repeats, common):
        self.interval_ns = int(interval * 1e9)
        self.target, self.selector, self.repeats = target, selector, repeats
        self.fire_at = WORLD.t_ns + self.interval_ns
        self.valid, self.common = True, common
        self.added = False

    def fire(self):
        if callable(self.target) and self.selector is None:
            self.target(self)
        else:
            getattr(self.target, self.selector.replace(":", "_"))(self)

    def invalidate(self):
        rec("Foundation.NSTimer.invalidate")
        self.valid = False


def _timer_methods():
    def timer(cls, interval, target, sel, info, repeats):
        return _Timer(interval, target, sel, repeats, False)

    def scheduled(cls, interval, target, sel, info, repeats):
        t = _Timer(interval, target, sel, repeats, False)
        WORLD.timers.append(t)
        return t

    return {"timerWithTimeInterval_target_selector_userInfo_repeats_": classmethod(timer),
            "scheduledTimerWithTimeInterval_target_selector_userInfo_repeats_":
                classmethod(scheduled)}


class _RunLoop:
    def addTimer_forMode_(self, timer, mode):
        rec("Foundation.NSRunLoop.addTimer_forMode_")
        timer.common = timer.common or mode == "kCFRunLoopCommonModes"
        if not timer.added:
            timer.added = True
            WORLD.timers.append(timer)


class _ProcessInfo:
    def beginActivityWithOptions_reason_(self, opts, reason):
        rec("Foundation.NSProcessInfo.beginActivityWithOptions_reason_")
        token = object()
        WORLD.activity.append(("begin", opts))
        return token

    def endActivity_(self, token):
        rec("Foundation.NSProcessInfo.endActivity_")
        WORLD.activity.append(("end", 0))

    def operatingSystemVersionString(self):
        return "Version 14.5 (fake)"


class _MenuItem:
    def __init__(self, title="", action=None, sep=False):
        self._title, self._action, self._sep = title, action, sep
        self._target = self._represented = self._submenu = None
        self._enabled, self._state = True, 0
        WORLD.live_items.add(self)


def _menuitem_methods():
    def init_title(self, title, action, key):
        _MenuItem.__init__(self, str(title), action)
        return self

    def sep(cls):
        it = cls.__new__(cls)
        _MenuItem.__init__(it, "", None, True)
        return it

    def set(attr):
        return lambda self, v: setattr(self, attr, v)

    def get(attr):
        return lambda self: getattr(self, attr)

    return {
        "initWithTitle_action_keyEquivalent_": init_title, "separatorItem": classmethod(sep),
        "setTitle_": lambda self, t: setattr(self, "_title", str(t)), "title": get("_title"),
        "setAction_": set("_action"), "action": get("_action"),
        "setTarget_": set("_target"), "target": get("_target"),
        "setRepresentedObject_": set("_represented"), "representedObject": get("_represented"),
        "setEnabled_": set("_enabled"), "isEnabled": get("_enabled"),
        "setState_": set("_state"), "state": get("_state"),
        "setSubmenu_": set("_submenu"), "submenu": get("_submenu"),
        "isSeparatorItem": get("_sep"),
        "setKeyEquivalent_": lambda self, k: None,
    }


def _menu_methods():
    def init(self):
        self._items = []
        self._auto = True
        return self

    return {
        "init": init,
        "addItem_": lambda self, it: self._items.append(it),
        "insertItem_atIndex_": lambda self, it, i: self._items.insert(i, it),
        "removeItemAtIndex_": lambda self, i: self._items.pop(i) and None,
        "removeItem_": lambda self, it: self._items.remove(it),
        "removeAllItems": lambda self: self._items.clear(),
        "itemArray": lambda self: list(self._items),
        "numberOfItems": lambda self: len(self._items),
        "itemAtIndex_": lambda self, i: self._items[i],
        "setAutoenablesItems_": lambda self, b: setattr(self, "_auto", b),
    }


class _Button:
    def __init__(self):
        self._title = ""

    def setTitle_(self, t):
        rec("AppKit.NSStatusBarButton.setTitle_")
        self._title = str(t)

    def title(self):
        return self._title

    def performClick_(self, sender):
        rec("AppKit.NSStatusBarButton.performClick_")
        WORLD.popped += 1

    def setImage_(self, img):
        rec("AppKit.NSStatusBarButton.setImage_")


def _accessors(cls_name: str, name: str):
    """`setName_(v)` (recorded) and `name()` over the attribute `_name`."""
    def setter(self, v):
        rec(f"AppKit.{cls_name}.set{name[0].upper()}{name[1:]}_")
        setattr(self, "_" + name, v)

    return setter, lambda self: getattr(self, "_" + name)


class _StatusItem:
    def __init__(self):
        self._button, self._menu = _Button(), None

    def button(self):
        rec("AppKit.NSStatusItem.button")
        return self._button

    setMenu_, menu = _accessors("NSStatusItem", "menu")

    def setHighlightMode_(self, b):
        pass


class _StatusBar:
    def statusItemWithLength_(self, length):
        rec("AppKit.NSStatusBar.statusItemWithLength_")
        si = _StatusItem()
        WORLD.status_items.append(si)
        return si


class _App:
    def __init__(self):
        self._delegate = None

    def setActivationPolicy_(self, p):
        rec("AppKit.NSApplication.setActivationPolicy_")
        WORLD.policy = p
        return True

    def activationPolicy(self):
        return WORLD.policy

    setDelegate_, delegate = _accessors("NSApplication", "delegate")

    def activateIgnoringOtherApps_(self, flag):
        rec("AppKit.NSApplication.activateIgnoringOtherApps_")
        WORLD.activations += 1
        WORLD.front = None  # we are frontmost now

    def run(self):
        rec("AppKit.NSApplication.run")
        WORLD.run_loop()

    def terminate_(self, sender):
        rec("AppKit.NSApplication.terminate_")
        WORLD.terminate()

    def replyToApplicationShouldTerminate_(self, ok):
        rec("AppKit.NSApplication.replyToApplicationShouldTerminate_")
        if ok:
            WORLD.exit()


class _Running:
    def __init__(self, pid, bundle):
        self._pid, self._bundle = pid, bundle

    def processIdentifier(self):
        return self._pid

    def bundleIdentifier(self):
        return self._bundle


class _Workspace:
    def frontmostApplication(self):
        rec("AppKit.NSWorkspace.frontmostApplication")
        f = WORLD.front
        return _Running(os.getpid(), "io.github.mlx-realtime-speech.menubar") if f is None \
            else _Running(f.pid, f.bundle)

    def openURL_(self, url):
        rec("AppKit.NSWorkspace.openURL_")
        WORLD.opened.append(url._s)
        return True


class _URL:
    def __init__(self, s):
        self._s = s

    def absoluteString(self):
        return self._s


class _PBItem:
    """A pasteboard item: a view of one of the pasteboard's items, or a new one."""

    def __init__(self, idx=None):
        self._idx, self._own = idx, {}

    def types(self):
        rec("AppKit.NSPasteboardItem.types")
        return list(WORLD.pb.items[self._idx] if self._idx is not None else self._own)

    def dataForType_(self, t):
        rec("AppKit.NSPasteboardItem.dataForType_")
        if self._idx is None:
            v = self._own.get(t)
        else:
            v = WORLD.pb.data(self._idx, t)
        return None if v is None else _Data(v)

    def stringForType_(self, t):
        d = self.dataForType_(t)
        return None if d is None else bytes(d).decode()

    def setData_forType_(self, data, t):
        rec("AppKit.NSPasteboardItem.setData_forType_")
        self._own[str(t)] = bytes(data)
        return True

    def setString_forType_(self, s, t):
        rec("AppKit.NSPasteboardItem.setString_forType_")
        self._own[str(t)] = str(s).encode()
        return True


class _NSPasteboardItem(NSObject, _PBItem):
    def init(self):
        rec("AppKit.NSPasteboardItem.init")
        _PBItem.__init__(self)
        return self


class _Pasteboard:
    def changeCount(self):
        rec("AppKit.NSPasteboard.changeCount")
        return WORLD.pb.count

    def pasteboardItems(self):
        rec("AppKit.NSPasteboard.pasteboardItems")
        return [_PBItem(i) for i in range(len(WORLD.pb.items))]

    def types(self):
        return [t for item in WORLD.pb.items for t in item]

    def clearContents(self):
        rec("AppKit.NSPasteboard.clearContents")
        WORLD.pb.clear()
        return WORLD.pb.count

    def prepareForNewContentsWithOptions_(self, opts):
        rec("AppKit.NSPasteboard.prepareForNewContentsWithOptions_")
        WORLD.pb.clear()
        WORLD.pb.options.append(opts)
        return WORLD.pb.count

    def writeObjects_(self, objs):
        rec("AppKit.NSPasteboard.writeObjects_")
        WORLD.pb.items += [dict(o._own) for o in objs]
        return True

    def setString_forType_(self, s, t):
        rec("AppKit.NSPasteboard.setString_forType_")
        if not WORLD.pb.items:
            WORLD.pb.items.append({})
        WORLD.pb.items[0][str(t)] = str(s).encode()
        return True

    def stringForType_(self, t):
        rec("AppKit.NSPasteboard.stringForType_")
        for i, item in enumerate(WORLD.pb.items):
            if t in item:
                return WORLD.pb.data(i, t).decode()
        return None

    def dataForType_(self, t):
        for i, item in enumerate(WORLD.pb.items):
            if t in item:
                return _Data(WORLD.pb.data(i, t))
        return None


def _singleton(module, name, inst_cls, accessor):
    holder = {}  # one per build_modules(), i.e. per World

    def get(cls):
        rec(f"{module}.{name}.{accessor}")
        if "i" not in holder:
            holder["i"] = inst_cls()
            if accessor == "sharedApplication":
                WORLD.nsapp = holder["i"]
        return holder["i"]

    return type(name, (), {accessor: classmethod(get)})


def build_modules() -> dict[str, types.ModuleType]:
    F = types.ModuleType("Foundation")
    F.NSObject = NSObject
    F.NSData = _cls("Foundation", "NSData", _data_methods())
    F.NSTimer = _cls("Foundation", "NSTimer", _timer_methods())
    F.NSRunLoop = type("NSRunLoop", (), {
        "mainRunLoop": classmethod(lambda cls: (rec("Foundation.NSRunLoop.mainRunLoop"),
                                                _RunLoop())[1]),
        "currentRunLoop": classmethod(lambda cls: (rec("Foundation.NSRunLoop.currentRunLoop"),
                                                   _RunLoop())[1])})
    F.NSRunLoopCommonModes = "kCFRunLoopCommonModes"
    F.NSDefaultRunLoopMode = "kCFRunLoopDefaultMode"
    F.NSProcessInfo = _singleton("Foundation", "NSProcessInfo", _ProcessInfo, "processInfo")
    F.NSActivityUserInitiatedAllowingIdleSystemSleep = 0x00EFFFFF
    F.NSActivityLatencyCritical = 0xFF00000000
    F.NSDate = type("NSDate", (), {"date": classmethod(lambda cls: WORLD.monotonic())})

    A = types.ModuleType("AppKit")
    A.__dict__.update({k: v for k, v in F.__dict__.items() if not k.startswith("__")})
    A.NSApplication = _singleton("AppKit", "NSApplication", _App, "sharedApplication")
    A.NSApplicationActivationPolicyRegular = 0
    A.NSApplicationActivationPolicyAccessory = 1
    A.NSStatusBar = _singleton("AppKit", "NSStatusBar", _StatusBar, "systemStatusBar")
    A.NSVariableStatusItemLength = -1.0
    A.NSMenu = _cls("AppKit", "NSMenu", _menu_methods())
    A.NSMenuItem = _cls("AppKit", "NSMenuItem", _menuitem_methods())
    A.NSWorkspace = _singleton("AppKit", "NSWorkspace", _Workspace, "sharedWorkspace")
    A.NSURL = type("NSURL", (), {"URLWithString_": classmethod(
        lambda cls, s: (rec("AppKit.NSURL.URLWithString_"), _URL(s))[1])})
    A.NSPasteboard = _singleton("AppKit", "NSPasteboard", _Pasteboard, "generalPasteboard")
    A.NSPasteboardItem = _NSPasteboardItem
    A.NSPasteboardTypeString = "public.utf8-plain-text"
    A.NSPasteboardContentsCurrentHostOnly = 1
    A.NSControlStateValueOn, A.NSControlStateValueOff = 1, 0

    Q = types.ModuleType("Quartz")
    Q.__dict__.update(_quartz())
    H = types.ModuleType("HIServices")
    H.__dict__.update(_hiservices())
    AS = types.ModuleType("ApplicationServices")
    AS.__dict__.update({k: v for k, v in Q.__dict__.items() if not k.startswith("__")})
    AS.__dict__.update({k: v for k, v in H.__dict__.items() if not k.startswith("__")})
    AV = types.ModuleType("AVFoundation")
    AV.AVMediaTypeAudio = "soun"
    AV.AVCaptureDevice = type("AVCaptureDevice", (), {
        "authorizationStatusForMediaType_": classmethod(_mic_status),
        "requestAccessForMediaType_completionHandler_": classmethod(_mic_request)})
    P = types.ModuleType("PyObjCTools")
    P.__path__ = []
    AH = types.ModuleType("PyObjCTools.AppHelper")

    def call_after(fn, *args):
        rec("AppHelper.callAfter")
        WORLD.put(lambda: fn(*args))

    AH.callAfter = call_after
    AH.runEventLoop = lambda *a, **k: A.NSApplication.sharedApplication().run()
    AH.stopEventLoop = lambda: WORLD.exit()
    P.AppHelper = AH
    O = types.ModuleType("objc")
    O.python_method = lambda f: f
    O.error = Exception
    mods = {"Foundation": F, "AppKit": A, "Quartz": Q, "HIServices": H,
            "ApplicationServices": AS, "AVFoundation": AV, "PyObjCTools": P,
            "PyObjCTools.AppHelper": AH, "objc": O}
    return mods


def _mic_status(cls, media):
    rec("AVFoundation.AVCaptureDevice.authorizationStatusForMediaType_")
    return WORLD.mic_status


def _mic_request(cls, media, handler):
    rec("AVFoundation.AVCaptureDevice.requestAccessForMediaType_completionHandler_")
    WORLD.prompts.append("microphone")
    if WORLD.mic_status == 0:
        WORLD.mic_handlers.append(handler)
    else:  # answered before: the handler runs at once, elsewhere
        threading.Thread(target=handler, args=(WORLD.mic_status == 3,)).start()


# ---------------------------------------------------------------- Quartz / HIServices


class _Tap:
    def __init__(self, callback, refcon, mask, options):
        self.callback, self.refcon, self.mask, self.options = callback, refcon, mask, options
        self.enabled, self.loop, self.valid = False, None, True


def _recorded(module: str, fns: dict) -> dict:
    """Each function wrapped to record `module.name` (and its thread) when called."""
    def one(name, fn):
        def f(*a):
            rec(f"{module}.{name}")
            return fn(*a)
        return f

    return {k: one(k, v) for k, v in fns.items()}


def _quartz() -> dict:
    def tap_create(tap, place, options, mask, callback, refcon):
        if not (WORLD.listen_access or WORLD.ax_trusted):
            return None
        return _Tap(callback, refcon, mask, options)

    def add_source(loop, src, mode):
        src.loop = loop
        if src not in WORLD.taps:
            WORLD.taps.append(src)

    def remove_source(loop, src, mode):
        if src in WORLD.taps:
            WORLD.taps.remove(src)

    def invalidate(tap):
        tap.valid = False
        if tap in WORLD.taps:
            WORLD.taps.remove(tap)

    def create_event(source, code, down):
        ev = Event(KEY_DOWN if down else KEY_UP, code,
                   WORLD.hid_flags & (SHIFT | CONTROL | OPTION | COMMAND), WORLD.t_ns)
        return ev

    def set_unicode(ev, n, s):
        assert n == len(s.encode("utf-16-le")) // 2 and n <= 20
        ev.unicode = s

    def post(tap, ev):
        # posted at the HID level, an event merges with the keys the user still holds
        flags = ev.flags | (WORLD.hid_flags & (SHIFT | CONTROL | OPTION | COMMAND))
        WORLD.posted.append((ev, flags))
        if not WORLD.ax_trusted or WORLD.secure_input or WORLD.front is None:
            WORLD.dropped.append(ev)
            return
        WORLD.front.receive(WORLD, ev, flags)

    def get_field(ev, field):
        return {9: ev.keycode, 8: 0, 42: ev.userdata}[field]

    def set_field(ev, field, value):
        if field == 42:
            ev.userdata = value

    def set_flags(ev, flags):
        ev.flags = flags

    def runloop_current():
        return "main" if threading.current_thread() is MAIN else threading.current_thread()

    fns = {
        "CGEventTapCreate": tap_create,
        "CFMachPortCreateRunLoopSource": lambda alloc, tap, order: tap,
        "CFRunLoopGetMain": lambda: "main", "CFRunLoopGetCurrent": runloop_current,
        "CFRunLoopAddSource": add_source, "CFRunLoopRemoveSource": remove_source,
        "CFRunLoopRun": lambda: None,
        "CGEventTapEnable": lambda tap, on: setattr(tap, "enabled", bool(on)),
        "CGEventTapIsEnabled": lambda tap: tap.enabled,
        "CFMachPortInvalidate": invalidate,
        "CGEventMaskBit": lambda t: 1 << t,
        "CGPreflightListenEventAccess": lambda: WORLD.listen_access,
        "CGRequestListenEventAccess": lambda: (WORLD.prompts.append("input_monitoring"),
                                               WORLD.listen_access)[1],
        "CGEventSourceFlagsState": lambda state: WORLD.hid_flags,
        "CGEventSourceCreate": lambda state: object(),
        "CGEventCreateKeyboardEvent": create_event,
        "CGEventSetFlags": set_flags, "CGEventGetFlags": lambda ev: ev.flags,
        "CGEventKeyboardSetUnicodeString": set_unicode, "CGEventPost": post,
        "CGEventGetTimestamp": lambda ev: ev.ts, "CGEventGetType": lambda ev: ev.type,
        "CGEventGetIntegerValueField": get_field, "CGEventSetIntegerValueField": set_field,
    }
    out = _recorded("Quartz", fns)
    out.update(kCGSessionEventTap=1, kCGHIDEventTap=0, kCGAnnotatedSessionEventTap=2,
               kCGHeadInsertEventTap=0, kCGEventTapOptionListenOnly=1,
               kCGEventTapOptionDefault=0, kCGEventKeyDown=KEY_DOWN, kCGEventKeyUp=KEY_UP,
               kCGEventFlagsChanged=FLAGS_CHANGED, kCGEventTapDisabledByTimeout=0xFFFFFFFE,
               kCGEventTapDisabledByUserInput=0xFFFFFFFF, kCGKeyboardEventKeycode=9,
               kCGKeyboardEventAutorepeat=8, kCGEventSourceUserData=42,
               kCFRunLoopCommonModes="kCFRunLoopCommonModes",
               kCFRunLoopDefaultMode="kCFRunLoopDefaultMode",
               kCGEventFlagMaskShift=SHIFT, kCGEventFlagMaskControl=CONTROL,
               kCGEventFlagMaskAlternate=OPTION, kCGEventFlagMaskCommand=COMMAND,
               kCGEventFlagMaskSecondaryFn=FN, kCGEventSourceStateHIDSystemState=1,
               kCGEventSourceStateCombinedSessionState=0, kCGEventSourceStatePrivate=-1)
    return out


class _AXElement:
    def __init__(self, kind, app=None):
        self.kind, self.app = kind, app


def _hiservices() -> dict:
    def trusted_with(opts):
        if opts and opts.get("AXTrustedCheckOptionPrompt"):
            WORLD.prompts.append("accessibility")
        return WORLD.ax_trusted

    def copy_attr(el, attr, out):
        assert out is None  # PyObjC: the output argument is passed as None
        if el.kind == "system" and attr == "AXFocusedUIElement":
            app = WORLD.front
            return (0, _AXElement("field", app)) if app is not None else (-25212, None)
        if el.kind == "field" and attr == "AXSelectedText":
            if not el.app.ax:
                return (-25205, None)  # kAXErrorAttributeUnsupported
            return (0, el.app.selection or "")
        return (-25205, None)

    def set_timeout(el, seconds):
        WORLD.ax_timeouts.append((el.kind, seconds))
        return 0

    fns = {"AXIsProcessTrusted": lambda: WORLD.ax_trusted,
           "AXIsProcessTrustedWithOptions": trusted_with,
           "AXUIElementCreateSystemWide": lambda: _AXElement("system"),
           "AXUIElementCopyAttributeValue": copy_attr,
           "AXUIElementSetMessagingTimeout": set_timeout}
    out = _recorded("HIServices", fns)
    out.update(kAXFocusedUIElementAttribute="AXFocusedUIElement",
               kAXSelectedTextAttribute="AXSelectedText",
               kAXTrustedCheckOptionPrompt="AXTrustedCheckOptionPrompt", kAXErrorSuccess=0)
    return out


# ---------------------------------------------------------------- installing and running


def install(monkeypatch, world: World) -> World:
    """Put the fake modules in sys.modules and the virtual clock in `time` (monkeypatch
    undoes both)."""
    global WORLD
    WORLD = world
    for name, mod in build_modules().items():
        monkeypatch.setitem(sys.modules, name, mod)
    monkeypatch.setattr(time, "monotonic", world.monotonic)
    monkeypatch.setattr(time, "monotonic_ns", world.monotonic_ns)
    from mlx_speech.app import carbon

    monkeypatch.setattr(carbon, "load", lambda: world.carbon)
    return world


def run_app(world: World, main, script, timeout: float = 120.0):
    """Run `main()` (the app) on this, the main thread, while `script(world)` acts on a
    thread of its own once NSApplication.run() has started. Returns (main's result or
    SystemExit, the script's exception or None)."""
    err: dict = {}

    def runner():
        try:
            script(world)
        except BaseException as e:  # reported by the caller
            err["e"] = e
            err["tb"] = traceback.format_exc()
        finally:
            if world.running:
                world.put(_stop)

    def _stop():
        world.running = False

    th = threading.Thread(target=runner, name="script", daemon=True)
    world.on_run = th.start
    try:
        result = main()
    except SystemExit as e:
        result = e
    if th.ident is not None:
        th.join(timeout)
    if "e" in err:
        raise AssertionError(f"the script failed:\n{err['tb']}") from err["e"]
    return result


def wait_exit(world: World, timeout: float = 60.0) -> dict:
    """Script thread: let time pass until the app has exited; returns what was true then."""
    deadline = time.perf_counter() + timeout
    while world.exited is None:
        if time.perf_counter() > deadline:
            raise AssertionError("the app did not exit")
        world.advance(0.05)
        time.sleep(0.005)
    return world.exited


def wait_until(world: World, cond, timeout: float = 20.0, step: float = 0.05) -> None:
    """Script thread: advance time in steps until cond() holds (real threads run meanwhile)."""
    deadline = time.perf_counter() + timeout
    while not world.on_main(cond):
        if time.perf_counter() > deadline:
            raise AssertionError("timed out waiting")
        world.advance(step)
        time.sleep(0.002)

