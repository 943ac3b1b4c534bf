"""Hotkey gestures from raw key-down/up events and a clock: press, hold, release, tap, double tap.

One recogniser per hotkey. Times are the injected clock's seconds; `tick(t)` must run now and
then (the core does, up to `next_deadline()`) so a hold is seen while the key stays down.

- `press`: the key went down (the core starts capturing at once: no first syllable is lost).
- `hold`: still down `hold_delay` after the press: push-to-talk.
- `release`: up after a hold.
- `tap`: up before `hold_delay`; `double_tap` instead when it comes within `double_tap_window`
  of the previous tap's release.
- Up events are confirmed only `debounce` later: macOS sometimes fires a modifier's flag change
  twice (up then down again within a few ms); a down inside the window cancels the up, and
  repeated downs (auto-repeat) or ups are ignored. Until confirmed, the key counts as down.
"""

from __future__ import annotations

from dataclasses import dataclass

PRESS, HOLD, RELEASE, TAP, DOUBLE_TAP = "press", "hold", "release", "tap", "double_tap"


@dataclass
class GestureConfig:
    hold_delay: float = 0.25
    double_tap_window: float = 0.35
    debounce: float = 0.04


class Gestures:
    def __init__(self, config: GestureConfig | None = None):
        self.config = config or GestureConfig()
        self._down_at: float | None = None  # key physically down since (None: up)
        self._up_at: float | None = None  # an up waiting for its debounce
        self._held = False  # HOLD was emitted for this press
        self._last_tap_at: float | None = None  # when the previous tap was confirmed
        self._double = False  # this press came soon after a tap

    @property
    def is_down(self) -> bool:
        """Down, or up but not yet confirmed."""
        return self._down_at is not None

    def down(self, t: float) -> list[str]:
        out = self.tick(t)
        if self._down_at is not None:
            if self._up_at is not None:  # the up was a double fire: still the same press
                self._up_at = None
            return out
        self._down_at, self._held = t, False
        self._double = (self._last_tap_at is not None
                        and t - self._last_tap_at <= self.config.double_tap_window)
        return out + [PRESS]

    def up(self, t: float) -> list[str]:
        out = self.tick(t)
        if self._down_at is not None and self._up_at is None:
            self._up_at = t
        return out

    def cancel(self) -> None:
        """Forget the current press (Esc): its up will produce nothing."""
        self._held = True  # the up then ends quietly as a "release" the core ignores
        self._last_tap_at = None

    def tick(self, t: float) -> list[str]:
        c, out = self.config, []
        if self._down_at is None:
            return out
        if not self._held and self._up_at is None and t - self._down_at >= c.hold_delay:
            self._held = True
            out.append(HOLD)
        if self._up_at is not None and t - self._up_at >= c.debounce:
            up_at = self._up_at
            if not self._held and up_at - self._down_at >= c.hold_delay:
                out.append(HOLD)  # the hold delay passed before the (late-seen) up
                self._held = True
            if self._held:
                out.append(RELEASE)
                self._last_tap_at = None
            elif self._double:
                out.append(DOUBLE_TAP)
                self._last_tap_at = None
            else:
                out.append(TAP)
                self._last_tap_at = up_at
            self._down_at = self._up_at = None
        return out

    def next_deadline(self) -> float | None:
        if self._down_at is None:
            return None
        if self._up_at is not None:
            return self._up_at + self.config.debounce
        if not self._held:
            return self._down_at + self.config.hold_delay
        return None
