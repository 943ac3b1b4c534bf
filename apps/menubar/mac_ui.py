"""The menu bar on AppKit (main thread only): one NSStatusItem whose NSMenu follows
`present(view)` in place.

Menu items are made once and re-titled, checked or enabled where they are; an item is
replaced only where the menu's shape changes (a Recent entry, a permission button), and a
replaced NSMenuItem is released (no registry keeps it, unlike rumps', which leaks every item
of every rebuild). Titles come cut to length from `menu.present`.

A repeating NSTimer in the common run-loop modes drives `App.pump()` (it fires while the menu
is open, where rumps' default-mode timer stops), and `wake()` runs it at once when another
thread posts. While the app is busy an NSProcessInfo activity keeps App Nap from stretching
the timers.
"""

from __future__ import annotations

import sys
import traceback

from .events import MenuAction, Quit
from .menu import SEPARATOR, Menu, MenuItem, present

TICK_S = 0.05
TERMINATE_NOW, TERMINATE_LATER = 1, 2  # NSApplicationTerminateReply

_handler_class = None


def handler_class():
    """The NSObject the menu items, the timer and NSApp's delegate call (defined once: an
    Objective-C class name is global to the process)."""
    global _handler_class
    if _handler_class is None:
        from Foundation import NSObject

        class MLXSpeechMenuHandler(NSObject):
            def menuAction_(self, sender):
                self.owner.clicked(sender)

            def tick_(self, timer):
                self.owner.tick()

            def applicationShouldTerminate_(self, sender):
                return self.owner.should_terminate()

        _handler_class = MLXSpeechMenuHandler
    return _handler_class


class _Node:
    __slots__ = ("model", "ns", "sub")

    def __init__(self, model: MenuItem, ns, sub: _Level | None):
        self.model, self.ns, self.sub = model, ns, sub


class _Level:
    __slots__ = ("menu", "nodes")

    def __init__(self, menu):
        self.menu, self.nodes = menu, []


def _shape(it: MenuItem) -> tuple[bool, bool]:
    return it is SEPARATOR, bool(it.children)


class StatusMenu:
    def __init__(self, appkit, handler):
        self.ak, self.handler = appkit, handler
        bar = appkit.NSStatusBar.systemStatusBar()
        self.item = bar.statusItemWithLength_(appkit.NSVariableStatusItemLength)
        self.root = _Level(self._new_menu())
        self.item.setMenu_(self.root.menu)
        self.title: str | None = None

    def _new_menu(self):
        m = self.ak.NSMenu.alloc().init()
        m.setAutoenablesItems_(False)
        return m

    def show(self, menu: Menu) -> None:
        if menu.title != self.title:
            self.item.button().setTitle_(menu.title)
            self.title = menu.title
        self._sync(self.root, menu.items)

    def pop_up(self) -> None:
        self.item.button().performClick_(None)

    def _sync(self, level: _Level, items: tuple[MenuItem, ...]) -> None:
        for i, it in enumerate(items):
            node = level.nodes[i] if i < len(level.nodes) else None
            if node is not None and _shape(node.model) == _shape(it):
                self._update(node, it)
                continue
            new = self._make(it)
            if node is not None:
                level.menu.removeItemAtIndex_(i)
                level.nodes[i] = new
            else:
                level.nodes.append(new)
            level.menu.insertItem_atIndex_(new.ns, i)
        while len(level.nodes) > len(items):
            level.menu.removeItemAtIndex_(len(level.nodes) - 1)
            level.nodes.pop()

    def _make(self, it: MenuItem) -> _Node:
        ak = self.ak
        if it is SEPARATOR:
            return _Node(it, ak.NSMenuItem.separatorItem(), None)
        ns = ak.NSMenuItem.alloc().initWithTitle_action_keyEquivalent_(
            it.title, "menuAction:" if it.id else None, "")
        if it.id:
            ns.setTarget_(self.handler)
            ns.setRepresentedObject_(it.id)
        ns.setEnabled_(it.enabled)
        ns.setState_(1 if it.checked else 0)
        sub = None
        if it.children:
            sub = _Level(self._new_menu())
            ns.setSubmenu_(sub.menu)
            self._sync(sub, it.children)
        return _Node(it, ns, sub)

    def _update(self, node: _Node, it: MenuItem) -> None:
        old, ns = node.model, node.ns
        if it is SEPARATOR or old == it:
            return
        if it.title != old.title:
            ns.setTitle_(it.title)
        if it.id != old.id:
            ns.setAction_("menuAction:" if it.id else None)
            ns.setTarget_(self.handler if it.id else None)
            ns.setRepresentedObject_(it.id)
        if it.enabled != old.enabled:
            ns.setEnabled_(it.enabled)
        if it.checked != old.checked:
            ns.setState_(1 if it.checked else 0)
        if it.children != old.children:
            self._sync(node.sub, it.children)
        node.model = it


class MenuBarUI:
    """Owns the status item, the pump timer and the quit sequence (all on the main thread)."""

    def __init__(self, app, *, appkit, foundation, app_helper, on_done):
        self.app, self.ak, self.fd, self.helper = app, appkit, foundation, app_helper
        self.on_done = on_done
        self.handler = handler_class().alloc().init()
        self.handler.owner = self
        self.status = StatusMenu(appkit, self.handler)
        self.shown: Menu | None = None
        self._woken = False
        self._activity = None
        self._finished = False
        nsapp = appkit.NSApplication.sharedApplication()
        nsapp.setDelegate_(self.handler)
        self.timer = foundation.NSTimer.timerWithTimeInterval_target_selector_userInfo_repeats_(
            TICK_S, self.handler, "tick:", None, True)
        foundation.NSRunLoop.mainRunLoop().addTimer_forMode_(
            self.timer, foundation.NSRunLoopCommonModes)

    def wake(self) -> None:
        """Any thread: run a tick on the main thread soon (coalesced)."""
        if not self._woken:
            self._woken = True
            self.helper.callAfter(self.tick)

    def clicked(self, sender) -> None:
        try:
            aid = sender.representedObject()
            if aid is not None:
                self.app.post(MenuAction(str(aid)))
        except Exception:
            traceback.print_exc(file=sys.stderr)

    def tick(self) -> None:
        self._woken = False
        if self._finished:
            return
        try:
            self.app.pump()
            self._keep_awake(self.app.busy or any(g.is_down for g in self.app.gestures.values()))
            if self.app.done:
                self.finish()
                return
            menu = present(self.app.view())
            if menu != self.shown:
                self.status.show(menu)
                self.shown = menu
        except Exception:
            traceback.print_exc(file=sys.stderr)

    def _keep_awake(self, busy: bool) -> None:
        pi = self.fd.NSProcessInfo.processInfo()
        if busy and self._activity is None:
            opts = (self.fd.NSActivityUserInitiatedAllowingIdleSystemSleep
                    | self.fd.NSActivityLatencyCritical)
            self._activity = pi.beginActivityWithOptions_reason_(opts, "dictation")
        elif not busy and self._activity is not None:
            pi.endActivity_(self._activity)
            self._activity = None

    def pop_up(self) -> None:
        try:
            self.status.pop_up()
        except Exception:
            traceback.print_exc(file=sys.stderr)

    def should_terminate(self) -> int:
        """NSApp asks before it exits (Quit, logout, shutdown): our own cleanup first."""
        if self._finished:
            return TERMINATE_NOW
        self._terminate_later = True
        self.app.post(Quit())
        return TERMINATE_LATER

    def finish(self) -> None:
        """The core is done: stop the timer, clean up (`on_done` joins the engine), exit."""
        if self._finished:
            return
        self._finished = True
        self.timer.invalidate()
        self._keep_awake(False)
        try:
            self.on_done()
        except Exception:
            traceback.print_exc(file=sys.stderr)
        nsapp = self.ak.NSApplication.sharedApplication()
        if getattr(self, "_terminate_later", False):
            nsapp.replyToApplicationShouldTerminate_(True)
        else:
            nsapp.terminate_(None)
