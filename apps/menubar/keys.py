"""Hotkeys from raw keyboard events (plain Python: the macOS event tap only feeds it).

`KeyTracker.event(kind, keycode, flags, t)` turns the events a Quartz event tap sees (key down,
key up, modifier flags changed) into the core's `Key` events. Keys are virtual key codes, so
left and right Option are different keys; a modifier is down or up by its device-dependent
flag bit (NX_DEVICE*KEYMASK), reconciled with the flags on every event, so a missed event
cannot leave a key "stuck" down.

A hotkey spec is keys joined by "+": "alt_r", "ctrl+alt+s", "fn", "cmd+shift+space". `alt`,
`ctrl`, `shift`, `cmd` match either side, `alt_l`/`alt_r` (etc.) one side; a letter, digit or
symbol is the key that types it in the keyboard layout (`keycode_for`), else its US position.
A chord goes "down" when every part has a key down, and "up" when all of its keys are up.
"""

from __future__ import annotations

from collections.abc import Callable

from .events import Key

KEY_DOWN, KEY_UP, FLAGS_CHANGED = "down", "up", "flags"

# side-independent modifier flags (kCGEventFlagMask*)
SHIFT, CONTROL, OPTION, COMMAND, FN = 0x20000, 0x40000, 0x80000, 0x100000, 0x800000
MODIFIER_FLAGS = SHIFT | CONTROL | OPTION | COMMAND

# keycode -> (name, its side-independent flag, its device-dependent flag, the other side's)
MODIFIERS = {
    59: ("ctrl_l", CONTROL, 0x0001, 0x2000), 62: ("ctrl_r", CONTROL, 0x2000, 0x0001),
    56: ("shift_l", SHIFT, 0x0002, 0x0004), 60: ("shift_r", SHIFT, 0x0004, 0x0002),
    55: ("cmd_l", COMMAND, 0x0008, 0x0010), 54: ("cmd_r", COMMAND, 0x0010, 0x0008),
    58: ("alt_l", OPTION, 0x0020, 0x0040), 61: ("alt_r", OPTION, 0x0040, 0x0020),
    63: ("fn", FN, 0, 0),
}
ESC = 53
NAMED = {
    "ctrl": (59, 62), "alt": (58, 61), "shift": (56, 60), "cmd": (55, 54),
    **{name: (code,) for code, (name, *_rest) in MODIFIERS.items()},
    "esc": (ESC,), "space": (49,), "tab": (48,), "return": (36,), "enter": (36, 76),
    "delete": (51,), "f1": (122,), "f2": (120,), "f3": (99,), "f4": (118,), "f5": (96,),
    "f6": (97,), "f7": (98,), "f8": (100,), "f9": (101,), "f10": (109,), "f11": (103,),
    "f12": (111,), "f13": (105,), "f14": (107,), "f15": (113,),
}
ALIASES = {"control": "ctrl", "option": "alt", "opt": "alt", "command": "cmd", "escape": "esc",
           "ctrl_l": "ctrl_l", "alt_gr": "alt_r"}

# US (ANSI) key positions: the fallback when the layout cannot be read
ANSI_VK = dict(zip("asdfhgzxcvbqweryt123465=97-80]ou[ip\rlj'k;\\,/nm.`",
                   [*range(0, 10), *range(11, 34), *range(34, 48), 50], strict=True))


def parse_hotkey(spec: str, keycode_for: Callable[[str], int | None] | None = None
                 ) -> tuple[frozenset[int], ...]:
    """"ctrl+alt+s" -> ({59, 62}, {58, 61}, {1}): each part's acceptable key codes."""
    parts = []
    for raw in spec.lower().replace(" ", "").split("+"):
        part = ALIASES.get(raw, raw)
        if part in NAMED:
            parts.append(frozenset(NAMED[part]))
            continue
        if len(part) != 1:
            raise ValueError(f"unknown key {raw!r} in hotkey {spec!r}")
        code = keycode_for(part) if keycode_for is not None else None
        if code is None:
            code = ANSI_VK.get(part)
        if code is None:
            raise ValueError(f"no key types {raw!r} (hotkey {spec!r})")
        parts.append(frozenset((code,)))
    if not parts:
        raise ValueError(f"empty hotkey {spec!r}")
    return tuple(parts)


def modifier_down(code: int, flags: int, changed: int | None) -> bool | None:
    """Is modifier `code` down given the event's flags? None: the flags cannot say (no
    device bits, and this event is not about this key)."""
    _, side_free, mine, other = MODIFIERS[code]
    if mine or other:
        if flags & (mine | other):
            return bool(flags & mine)
        if not flags & side_free:
            return False
        return (changed == code) if changed is not None else None
    # fn has no sided bit; arrow keys also carry it, so only its own event sets it down
    if not flags & side_free:
        return False
    return True if changed == code else None


class KeyTracker:
    def __init__(self, specs: dict[str, str],
                 keycode_for: Callable[[str], int | None] | None = None):
        self.chords = {name: parse_hotkey(spec, keycode_for) for name, spec in specs.items()}
        self.down: set[int] = set()
        self.active: set[str] = set()

    def event(self, kind: str, keycode: int, flags: int, t: float | None = None,
              autorepeat: bool = False) -> list[Key]:
        """One tap event -> the Key events it causes (esc presses; chords down or up)."""
        out: list[Key] = []
        if kind == FLAGS_CHANGED and keycode in MODIFIERS:
            if modifier_down(keycode, flags, keycode):
                self.down.add(keycode)
            else:
                self.down.discard(keycode)
        elif kind == KEY_DOWN:
            if autorepeat:
                return out
            if keycode == ESC:
                out.append(Key("esc", True, t))
            self.down.add(keycode)
        elif kind == KEY_UP:
            self.down.discard(keycode)
        for code in [c for c in self.down if c in MODIFIERS and c != keycode]:
            if modifier_down(code, flags, None) is False:  # its release was missed
                self.down.discard(code)
        for name, chord in self.chords.items():
            if name not in self.active and all(part & self.down for part in chord):
                self.active.add(name)
                out.append(Key(name, True, t))
            elif name in self.active and not any(part & self.down for part in chord):
                self.active.discard(name)
                out.append(Key(name, False, t))
        return out

    def reset(self, t: float | None = None) -> list[Key]:
        """Forget every key (the tap stopped): active chords go up."""
        self.down.clear()
        out = [Key(name, False, t) for name in sorted(self.active)]
        self.active.clear()
        return out


# An event's timestamp is nanoseconds of the clock time.monotonic() reads on macOS
# (mach_absolute_time); on Apple silicon some macOS versions report raw mach ticks instead
# (125/3 ns each). The candidate that puts the event in the recent past wins.
TICK_SCALES = (1.0, 125 / 3)
MAX_EVENT_AGE_NS = 10_000_000_000


def event_time(timestamp: int, now_ns: int) -> float:
    """A CGEvent timestamp -> seconds on the time.monotonic() clock (now if implausible)."""
    for scale in TICK_SCALES:
        t = timestamp * scale
        if 0 <= now_ns - t <= MAX_EVENT_AGE_NS:
            return t / 1e9
    return now_ns / 1e9
