"""The app's state machine: pure Python, an injected clock, one event queue.

Hotkeys, menu clicks, microphone levels and engine results arrive as events (`post()` is the
only thread-safe entry); whoever owns the UI thread calls `pump()`, which handles them and
runs the timers (`tick()`; `wait_time()` says how long it may sleep). Nothing here blocks on
MLX: the engine does that on its own thread.

Rules it keeps:
- every final transcript is inserted or kept in Recent (including one spoken while the model
  loads: the engine's queue holds the audio; a cancelled one goes to Recent, not to the app);
- nothing is inserted while a hotkey key is still down;
- short text is typed, long text pasted; the clipboard's FULL snapshot is restored after a
  paste only if its change token is still ours;
- nothing is synthesized (typed, pasted, Cmd-C) while the user holds a modifier key;
- permissions are states, checked at start, requested once, polled until granted; the hotkeys
  start (again) when the system allows them; capture never starts without them;
- failures show in the menu (error / needs permission), never silently;
- quitting stops recording and speech at once and waits (bounded) for what is finishing.
"""

from __future__ import annotations

import itertools
import queue
import sys
import traceback
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from mlx_speech.errors import MlxSpeechError

from .committer import Committer
from .events import (
    Final,
    Key,
    Level,
    MenuAction,
    ModelStatus,
    Partial,
    PermissionChanged,
    Quit,
    SessionFailed,
    SpeakDone,
    SpeakFailed,
    SpeakStarted,
    SpeechEnded,
)
from .gestures import DOUBLE_TAP, HOLD, PRESS, RELEASE, TAP, GestureConfig, Gestures
from .ports import (
    GRANTED,
    NOT_DETERMINED,
    PERMISSIONS,
    SENTINEL,
    ClipboardSnapshot,
    InsertResult,
    Ports,
)
from .settings import Settings

__all__ = ["App", "Key", "MenuAction", "Quit", "View"]

SILENCE_RMS = 1e-3  # about -60 dBFS: below this a block counts as silence
MAX_WAIT = 1.0  # the pump wakes at least this often
POLL_S = 1.5  # permissions and the hotkeys' health are re-checked this often
KEYS_WAIT_S = 3.0  # insertion/Cmd-C wait this long for the user's keys to go up, then give up
COPY_WAIT_S = 0.5  # the Cmd-C fallback waits this long for the app to copy
POLL_KEYS_S = 0.03  # how often the modifier keys are looked at while something waits on them
QUIT_WAIT_S = 8.0  # quitting waits at most this long for transcripts still finishing
PARTIAL_CHARS = 60  # the partial text the menu shows (its tail)


@dataclass
class Capture:
    """The dictation being recorded."""

    sid: int
    started_at: float
    focus: object
    mode: str | None = None  # None until the gesture is known, then "hold" | "toggle"
    last_sound_at: float = 0.0
    blocks: int = 0
    silent: bool = False


@dataclass
class Pending:
    """A dictation whose session is finishing, or whose text waits for the keys to go up."""

    sid: int
    focus: object
    cancelled: bool = False
    text: str | None = None
    audio: str | None = None


@dataclass
class CopyProbe:
    """Speak selection's Cmd-C fallback: waiting for the keys, then for the app to copy."""

    started_at: float
    stage: str = "keys"  # "keys" -> "copy"
    snap: ClipboardSnapshot | None = None
    token: int = 0
    sent_at: float = 0.0


@dataclass(frozen=True)
class RecentItem:
    text: str
    inserted: bool
    how: str | None = None  # "typed" | "pasted"
    note: str = ""


@dataclass(frozen=True)
class ModelInfo:
    model_id: str
    status: str = "unloaded"
    done: int = 0
    total: int = 0
    error: str | None = None
    voices: tuple[str, ...] = ()
    latencies: tuple[int, ...] = ()  # a speech model's latency choices (ms)
    languages: tuple[str, ...] = ()  # the languages a speech model takes (none: it takes none)


@dataclass(frozen=True)
class View:
    """Everything the menu shows: `present(view)` turns it into a menu model."""

    settings: Settings
    listening: bool = False  # capturing, gesture confirmed
    mode: str | None = None
    partial: str = ""
    silent: bool = False
    finalizing: int = 0
    speaking: bool = False
    speak_text: str = ""
    asr: ModelInfo = ModelInfo("")
    tts: ModelInfo = ModelInfo("")
    recent: tuple[RecentItem, ...] = ()
    error: str | None = None
    needs: tuple[str, ...] = ()
    notice: str | None = None


class App:
    def __init__(self, ports: Ports, engine, settings: Settings | None = None, *,
                 clock: Callable[[], float], emit: Callable[[dict], None] | None = None,
                 save_settings: Callable[[Settings], None] | None = None,
                 wake: Callable[[], None] | None = None):
        self.ports, self.engine, self.clock = ports, engine, clock
        self.settings = settings or Settings()
        self._emit_fn = emit
        self._save = save_settings
        self._wake = wake  # called after post(): the UI thread runs pump() soon
        self._queue: queue.Queue = queue.Queue()
        self._ids = itertools.count(1)
        s = self.settings
        cfg = GestureConfig(s.hold_delay_ms / 1000, s.double_tap_ms / 1000, s.debounce_ms / 1000)
        self.gestures = {"dictate": Gestures(cfg), "speak": Gestures(cfg)}
        self.capture: Capture | None = None
        self.pending: dict[int, Pending] = {}  # sid -> finishing or waiting to insert
        self.partials: dict[int, Committer] = {}
        self.speaking: tuple[int, str] | None = None
        self.recent: deque[RecentItem] = deque(maxlen=max(1, s.recent_size))
        self.models = {"asr": ModelInfo(s.asr_model), "tts": ModelInfo(s.tts_model)}
        self.error: str | None = None
        self.perms: dict[str, str] = {}  # kind -> state, for the kinds this app needs
        self._requested: set[str] = set()
        self._next_poll = clock()
        self.notice: str | None = None
        self._restore: tuple[float, ClipboardSnapshot | None, int] | None = None
        self._probe: CopyProbe | None = None
        self._held_since: float | None = None  # modifiers seen down while text waits
        self._last_used = clock()
        self._state = None
        self.quitting = self.done = False
        self._quit_by: float | None = None

    # ------------------------------------------------------------------ driving
    def start(self) -> None:
        """Check every permission (asking once for the missing ones), start the hotkeys,
        preload the speech model."""
        li = self.ports.login_item
        if li is not None:
            try:
                on = bool(li.enabled())
            except Exception:  # the file's state is only shown, never worth a crash
                on = self.settings.login_item
            if on != self.settings.login_item:
                self._set(login_item=on)
        self._refresh_permissions(request=True)
        self._state_changed()
        if self.settings.preload_asr:
            self.engine.load("asr", self.settings.asr_model)

    def post(self, event) -> None:
        """Thread-safe: hotkey listeners, the capture thread and the engine call this."""
        self._queue.put(event)
        if self._wake is not None:
            self._wake()

    def pump(self, timeout: float = 0.0) -> None:
        """Handle every queued event (waiting up to `timeout` for the first), then the timers."""
        try:
            ev = self._queue.get(timeout=timeout) if timeout > 0 else self._queue.get_nowait()
        except queue.Empty:
            ev = None
        while ev is not None:
            self.handle(ev)
            try:
                ev = self._queue.get_nowait()
            except queue.Empty:
                ev = None
        self.tick()

    def wait_time(self) -> float:
        """How long the pump may sleep before a timer is due."""
        now = self.clock()
        due = [g.next_deadline() for g in self.gestures.values()]
        if self._restore is not None:
            due.append(self._restore[0])
        if self.capture is not None or self.quitting:
            due.append(now + 0.25)
        if self._probe is not None or self._held_since is not None:
            due.append(now + POLL_KEYS_S)
        if self.ports.hotkeys is not None or self.needs:
            due.append(self._next_poll)
        due = [d for d in due if d is not None]
        return max(0.0, min([MAX_WAIT] + [d - now for d in due]))

    def handle(self, ev) -> None:
        try:
            self._handle(ev)
        except Exception as e:  # a bug must show in the menu, not kill the app
            traceback.print_exc(file=sys.stderr)
            self._fail(f"internal error: {type(e).__name__}: {e}")
        self._state_changed()

    def tick(self) -> None:
        t = self.clock()
        for name, g in self.gestures.items():
            for gesture in g.tick(t):
                self._gesture(name, gesture)
        if t >= self._next_poll:
            self._refresh_permissions()
        self._try_insert()
        if self._probe is not None:
            self._advance_probe()
        if self._restore is not None and t >= self._restore[0]:
            self._restore_clipboard()
        c = self.capture
        if c is not None and c.mode is not None:
            silent = t - max(c.last_sound_at, c.started_at) >= self.settings.silent_after_s
            if silent != c.silent:
                c.silent = silent
        self._maybe_unload(t)
        if self.quitting and not self.done and (not self.busy or t >= self._quit_by):
            for p in self.pending.values():
                if p.text:  # never silently: the log keeps what could not be inserted
                    print(f"quit: not inserted: {p.text!r}", file=sys.stderr)
            self.done = True
        self._state_changed()

    @property
    def busy(self) -> bool:
        return bool(self.capture or self.pending or self.speaking or self._restore
                    or self._probe)

    @property
    def needs(self) -> tuple[str, ...]:
        """The permissions not granted (in PERMISSIONS order)."""
        return tuple(k for k in PERMISSIONS if self.perms.get(k, GRANTED) != GRANTED)

    # ------------------------------------------------------------------ what the menu shows
    def view(self) -> View:
        c = self.capture
        sid = c.sid if c is not None else (max(self.pending) if self.pending else None)
        partial = self.partials[sid].tail(PARTIAL_CHARS) if sid in self.partials else ""
        return View(
            settings=self.settings, listening=c is not None and c.mode is not None,
            mode=c.mode if c else None, partial=partial, silent=bool(c and c.silent),
            finalizing=sum(1 for p in self.pending.values() if not p.cancelled),
            speaking=self.speaking is not None,
            speak_text=self.speaking[1] if self.speaking else "",
            asr=self.models["asr"], tts=self.models["tts"], recent=tuple(self.recent),
            error=self.error, needs=self.needs, notice=self.notice)

    # ------------------------------------------------------------------ events
    def _handle(self, ev) -> None:
        if isinstance(ev, Key):
            self._key(ev)
        elif isinstance(ev, Level):
            self._level(ev)
        elif isinstance(ev, Partial):
            com = self.partials.get(ev.sid)
            if com is not None and com.add(ev.delta):
                self._emit({"event": "partial", "text": com.text})
        elif isinstance(ev, Final):
            self._final(ev)
        elif isinstance(ev, SessionFailed):
            self.pending.pop(ev.sid, None)
            self.partials.pop(ev.sid, None)
            self._fail(f"transcription failed: {ev.message}")
        elif isinstance(ev, ModelStatus):
            self._model_status(ev)
        elif isinstance(ev, SpeakStarted):
            if self.speaking and self.speaking[0] == ev.sid:
                self._emit({"event": "speaking", "text": self.speaking[1]})
        elif isinstance(ev, SpeakDone):
            if self.speaking and self.speaking[0] == ev.sid:
                self.speaking = None
            self._touch()
            self._emit({"event": "spoken", "seconds": round(ev.seconds, 3),
                        "stopped": ev.stopped})
        elif isinstance(ev, SpeakFailed):
            if self.speaking and self.speaking[0] == ev.sid:
                self.speaking = None
            self._fail(f"cannot speak: {ev.message}")
        elif isinstance(ev, MenuAction):
            self._action(ev.id)
        elif isinstance(ev, PermissionChanged):
            self._refresh_permissions()
        elif isinstance(ev, SpeechEnded):
            c = self.capture
            if c is not None and c.sid == ev.sid and c.mode == "toggle":
                self._stop_capture()
        elif isinstance(ev, Quit):
            if not self.quitting:
                self.quitting, self._quit_by = True, self.clock() + QUIT_WAIT_S
            if self.capture is not None:
                self._stop_capture()
            if self.speaking:
                self._stop_speaking()
            if self._probe is not None:
                self._end_probe(None, quiet=True)
        else:
            raise TypeError(f"unknown event {ev!r}")

    def _key(self, ev: Key) -> None:
        if ev.name == "esc":
            if ev.down:
                self._cancel()
            return
        g = self.gestures.get(ev.name)
        if g is None:
            raise ValueError(f"unknown hotkey {ev.name!r}")
        now = self.clock()
        # the key's own time: a pump that runs late still sees a 300 ms hold as a hold
        t = now if ev.t is None else min(ev.t, now)
        for gesture in (g.down(t) if ev.down else g.up(t)):
            self._gesture(ev.name, gesture)
        self._try_insert()

    def _gesture(self, name: str, gesture: str) -> None:
        if name == "speak":
            if gesture == PRESS:
                self._speak_pressed()
            return
        c = self.capture
        if gesture == PRESS:
            if self.speaking:
                self._stop_speaking()
            if c is None:
                self._start_capture()
            elif c.mode == "toggle":
                self._stop_capture()
        elif c is None or c.mode not in (None, "hold"):
            return
        elif gesture == HOLD and c.mode is None:
            c.mode = "hold"
        elif gesture == RELEASE and c.mode == "hold":
            self._stop_capture()
        elif gesture == TAP and c.mode is None:
            if self.settings.toggle == "tap":
                c.mode = "toggle"
            else:  # the first of a double tap: not a dictation
                self._discard_capture()
        elif gesture == DOUBLE_TAP and c.mode is None:
            c.mode = "toggle"

    # ------------------------------------------------------------------ dictation
    def _kinds(self) -> tuple[str, ...]:
        """The permissions this app needs (no event tap of ours: no Input Monitoring)."""
        return tuple(k for k in PERMISSIONS
                     if k != "input_monitoring" or self.ports.hotkeys is not None)

    def _refresh_permissions(self, request: bool = False) -> None:
        """Read every permission's state; ask once for missing ones (`request`); start the
        hotkeys when they are allowed (again: they may have died or come in late)."""
        self._next_poll = self.clock() + POLL_S
        perms, hk = self.ports.permissions, self.ports.hotkeys
        for kind in self._kinds():
            try:
                st = perms.state(kind)
            except Exception as e:
                traceback.print_exc(file=sys.stderr)
                st = f"unknown ({type(e).__name__})"
            if kind == "input_monitoring":  # what counts is a live event tap
                ok = self._call_bool(hk.running) or self._call_bool(hk.start)
                st = GRANTED if ok else (st if st != GRANTED else "cannot listen")
            if st != GRANTED and request and kind not in self._requested and (
                    kind != "microphone" or st == NOT_DETERMINED):
                self._requested.add(kind)
                try:
                    perms.request(kind)
                except Exception:
                    traceback.print_exc(file=sys.stderr)
                if kind == "input_monitoring" and self._call_bool(hk.start):
                    st = GRANTED
            self.perms[kind] = st

    def _check(self, kinds: tuple[str, ...]) -> bool:
        self._refresh_permissions()
        missing = tuple(k for k in kinds if self.perms.get(k, GRANTED) != GRANTED)
        if "microphone" in missing and self.perms["microphone"] == NOT_DETERMINED:
            self._refresh_permissions(request=True)  # the prompt, before the first capture
            self.notice = "Allow the microphone in the dialog, then start again"
        if missing:
            self._emit({"event": "error", "message": "permission needed: " + ", ".join(missing)})
        return not missing

    @staticmethod
    def _call_bool(fn) -> bool:
        try:
            return bool(fn())
        except Exception:
            traceback.print_exc(file=sys.stderr)
            return False

    def _start_capture(self, mode: str | None = None) -> None:
        if not self._check(("microphone", "accessibility")):
            self.gestures["dictate"].cancel()
            return
        self.error = self.notice = None
        sid = next(self._ids)
        t = self.clock()
        focus = self.ports.inserter.focus()
        self.partials[sid] = Committer()
        s = self.settings
        # the session is queued before the first block (it waits behind a model load)
        self.engine.begin(sid, s.asr_model, {"latency_ms": s.latency_ms.get(s.asr_model),
                                             "language": s.language.get(s.asr_model),
                                             "stop_after_silence_ms": s.handsfree_stop_ms,
                                             "vocabulary": s.dictation_vocabulary()})
        try:
            self.ports.microphone.open(lambda block: self._on_block(sid, block))
        except Exception as e:
            self.engine.cancel(sid)
            self.partials.pop(sid, None)
            self.gestures["dictate"].cancel()
            self._fail(str(e))
            return
        self.capture = Capture(sid, t, focus, mode=mode, last_sound_at=t)
        self._touch()

    def _on_block(self, sid: int, block: np.ndarray) -> None:
        """On the capture thread: queues only."""
        self.engine.audio(sid, block)
        rms = float(np.sqrt(np.mean(np.square(block, dtype=np.float64)))) if len(block) else 0.0
        self.post(Level(sid, rms))

    def _level(self, ev: Level) -> None:
        c = self.capture
        if c is None or c.sid != ev.sid:
            return
        c.blocks += 1
        if ev.rms > SILENCE_RMS:
            c.last_sound_at = self.clock()
            c.silent = False

    def _stop_capture(self) -> None:
        c, self.capture = self.capture, None
        self.ports.microphone.close()  # every captured block is in the engine's queue now
        self.engine.finish(c.sid)
        self.pending[c.sid] = Pending(c.sid, c.focus)
        self._touch()

    def _discard_capture(self) -> None:
        c, self.capture = self.capture, None
        self.ports.microphone.close()
        self.engine.cancel(c.sid)
        self.partials.pop(c.sid, None)

    def _cancel(self) -> None:
        """Esc: stop recording and speaking; what was said goes to Recent, not to the app."""
        cancelled = False
        if self.capture is not None:
            sid = self.capture.sid
            self._stop_capture()
            self.gestures["dictate"].cancel()
            self.pending[sid].cancelled = True
            cancelled = True
        for p in self.pending.values():
            if not p.cancelled:
                p.cancelled = cancelled = True
        if self.speaking:
            self._stop_speaking()
        if self._probe is not None:
            self._end_probe(None, quiet=True)
        if cancelled:
            self.notice = "Cancelled: the text goes to Recent, not to the app"

    def _final(self, ev: Final) -> None:
        p = self.pending.get(ev.sid)
        self.partials.pop(ev.sid, None)
        if p is None:  # a discarded session
            return
        text = ev.text.strip()
        rec = self.ports.recorder
        if rec is not None and ev.audio is not None:
            p.audio = rec.save(ev.sid, np.asarray(ev.audio), self.ports.microphone.sample_rate,
                               {"text": ev.text, "tokens": list(ev.tokens)})
        if not text:
            del self.pending[ev.sid]
            self.notice = "Heard nothing"
            return
        if p.cancelled:
            del self.pending[ev.sid]
            self._keep(text, False, note="cancelled", audio=p.audio)
            return
        p.text = text
        self._try_insert()

    def _keys_down(self) -> bool:
        return any(g.is_down for g in self.gestures.values())

    def _modifiers_held(self) -> bool:
        """The user's modifier keys are down (asked of the platform: any key, not only ours)."""
        return self._call_bool(self.ports.inserter.modifiers_down)

    def _try_insert(self) -> None:
        ready = [p for p in self.pending.values() if p.text is not None]
        if not ready or self._keys_down():
            return
        if not self._modifiers_held():
            self._held_since = None
        else:
            if self._held_since is None:
                self._held_since = self.clock()
            if self.clock() - self._held_since < KEYS_WAIT_S:
                return  # typed keys or Cmd-V would combine with them
            self._held_since = None
            for p in sorted(ready, key=lambda p: p.sid):
                del self.pending[p.sid]
                self._keep(p.text, False, note="keys-held", audio=p.audio)
            self._fail("modifier keys stayed down: kept in Recent (Paste last)")
            return
        for p in sorted(ready, key=lambda p: p.sid):
            if any(q.sid < p.sid and q.text is None and not q.cancelled
                   for q in self.pending.values()):
                break  # an earlier dictation is still finishing: keep the order
            del self.pending[p.sid]
            self._deliver(p)

    def _deliver(self, p: Pending) -> None:
        r, how = self._insert(p.text, p.focus)
        if r is InsertResult.OK:
            ev = {"event": "inserted", "text": p.text, "how": how}
            self._emit(ev)
            self._keep(p.text, True, how=how, audio=p.audio)
            return
        msg = {InsertResult.NO_PERMISSION: "Accessibility permission is needed to type",
               InsertResult.FOCUS_CHANGED: "the focused app changed",
               InsertResult.NO_TARGET: "no app had the focus",
               InsertResult.SECURE_INPUT: ("Secure Input is on (a password field, or Secure "
                                           "Keyboard Entry in a terminal)"),
               InsertResult.FAILED: "the text could not be inserted"}[r]
        if r is InsertResult.NO_PERMISSION:  # the platform knows better, until the next poll
            self.perms["accessibility"] = "denied"
        self._fail(f"{msg}: kept in Recent (Paste last)")
        self._keep(p.text, False, note=r.value, audio=p.audio)

    def _insert(self, text: str, focus: object | None,
                paste: bool = False) -> tuple[InsertResult, str]:
        """Type short text, paste long text (restoring the clipboard later)."""
        ports = self.ports
        if ports.permissions.state("accessibility") != GRANTED:
            return InsertResult.NO_PERMISSION, ""
        cur = ports.inserter.focus()
        if cur is None:
            return InsertResult.NO_TARGET, ""
        if focus is not None and cur != focus:
            return InsertResult.FOCUS_CHANGED, ""
        if not paste and len(text) <= self.settings.type_max_chars:
            return self._call(ports.inserter.type_text, text), "typed"
        if self._restore is not None:  # an earlier paste's restore first
            self._restore_clipboard()
        snap = ports.clipboard.snapshot()
        token = ports.clipboard.write_text(text)
        r = self._call(ports.inserter.paste)
        if r is not InsertResult.OK and snap is not None:
            token = ports.clipboard.restore(snap)  # nothing pasted: put it back now
            return r, "pasted"
        # slow apps (Electron, remote desktops) read the clipboard late: longer for long text
        delay = self.settings.restore_delay_ms / 1000 + min(2.0, len(text) / 4000)
        self._restore = (self.clock() + delay, snap, token)
        return r, "pasted"

    @staticmethod
    def _call(fn, *args) -> InsertResult:
        try:
            return InsertResult(fn(*args))
        except Exception:
            traceback.print_exc(file=sys.stderr)
            return InsertResult.FAILED

    def _restore_clipboard(self) -> None:
        _, snap, token = self._restore
        self._restore = None
        cb = self.ports.clipboard
        # nobody wrote it since our paste: give it back, all of it (a concealed item, a
        # password, was never copied: it lapses, as its password manager intends)
        if snap is not None and cb.token() == token:
            cb.restore(snap)

    def _keep(self, text: str, inserted: bool, how: str | None = None, note: str = "",
              audio: str | None = None) -> None:
        self.recent.appendleft(RecentItem(text, inserted, how, note))
        ev = {"event": "recent", "text": text, "inserted": inserted}
        if audio:
            ev["audio"] = audio
        self._emit(ev)

    # ------------------------------------------------------------------ speak selection
    def _speak_pressed(self) -> None:
        if self.speaking:
            self._stop_speaking()
            return
        if self.capture is not None:
            self.notice = "Dictating: speak selection waits"
            return
        if self._probe is not None:
            return  # already reading the selection
        if not self._check(("accessibility",)):
            return
        try:
            text = self.ports.selection.read()
        except Exception as e:
            traceback.print_exc(file=sys.stderr)
            text = None
            print(f"accessibility selection failed: {e}", file=sys.stderr)
        if text and text.strip():
            self._speak(text)
            return
        # the app does not expose its selection: copy it (Cmd-C), once the keys are up
        self._probe = CopyProbe(self.clock())
        self._advance_probe()

    def _advance_probe(self) -> None:
        p, t, cb = self._probe, self.clock(), self.ports.clipboard
        if p.stage == "keys":
            if self.gestures["speak"].is_down or self._modifiers_held():
                if t - p.started_at >= KEYS_WAIT_S:
                    self._probe = None
                    self._fail("release the keys to read the selection (Cmd-C)")
                return
            # a sentinel first: a selection equal to the old clipboard is still seen
            p.snap = cb.snapshot()
            p.token = cb.write_text(SENTINEL)
            r = self._call(self.ports.inserter.send_copy)
            if r is not InsertResult.OK:
                self._end_probe(None)
                self._fail(f"cannot copy the selection: {r.value}")
                return
            p.stage, p.sent_at = "copy", t
            return
        if cb.token() != p.token:
            got = cb.read_text()
            p.token = cb.token()
            self._end_probe(None if got in (None, SENTINEL) else got)
        elif t - p.sent_at >= COPY_WAIT_S:
            self._end_probe(None)

    def _end_probe(self, text: str | None, quiet: bool = False) -> None:
        """Put the user's clipboard back (if only we wrote it since), then speak."""
        p, self._probe = self._probe, None
        cb = self.ports.clipboard
        if p.stage == "copy" and p.snap is not None and cb.token() == p.token:
            cb.restore(p.snap)
        if quiet or self.quitting:
            return
        if not text or not text.strip():
            self._fail("nothing selected to speak")
            return
        self._speak(text)

    def _speak(self, text: str) -> None:
        self.error = self.notice = None
        sid = next(self._ids)
        text = text.strip()
        self.speaking = (sid, text)
        s = self.settings
        self.engine.speak(sid, text, s.tts_model, {"voice": s.voice, "seed": s.tts_seed,
                                                   "max_frames": s.tts_max_frames})
        self._touch()

    def _stop_speaking(self) -> None:
        sid, _ = self.speaking
        self.speaking = None
        self.engine.stop_speaking(sid)  # silences the speaker now, from this thread

    # ------------------------------------------------------------------ models, menu, timers
    def _model_status(self, ev: ModelStatus) -> None:
        old = self.models[ev.kind]
        same = old.model_id == ev.model_id
        self.models[ev.kind] = ModelInfo(ev.model_id, ev.status, ev.done, ev.total, ev.error,
                                         ev.voices or (old.voices if same else ()),
                                         ev.latencies or (old.latencies if same else ()),
                                         ev.languages or (old.languages if same else ()))
        if ev.status == "failed":
            self._fail(f"cannot load {ev.model_id}: {ev.error}")
        if ev.status == "ready":
            self._touch()

    def _maybe_unload(self, t: float) -> None:
        minutes = self.settings.unload_after_min
        if not minutes or self.busy or t - self._last_used < minutes * 60:
            return
        for kind, m in self.models.items():
            if m.status == "ready":
                self.engine.unload(kind)
                self.models[kind] = ModelInfo(m.model_id, "unloading", voices=m.voices,
                                              latencies=m.latencies, languages=m.languages)

    def _touch(self) -> None:
        self._last_used = self.clock()

    def _action(self, aid: str) -> None:
        name, _, arg = aid.partition(":")
        s = self.settings
        if name == "dictate":
            if self.capture is not None:
                self._stop_capture()
            else:
                self._start_capture(mode="toggle")
        elif name == "speak":
            self._speak_pressed()
        elif name in ("paste_last", "paste", "copy"):
            i = int(arg or 0)
            if i >= len(self.recent):
                return
            text = self.recent[i].text
            if name == "copy":
                self.ports.clipboard.write_text(text, transient=False)  # the user's own copy
                self.notice = "Copied"
                return
            if self._modifiers_held():
                self._fail("cannot paste while a modifier key is down")
                return
            r, how = self._insert(text, None, paste=True)  # the user asked for a paste
            if r is InsertResult.OK:
                self._emit({"event": "inserted", "text": text, "how": how})
            else:
                self._fail(f"cannot paste: {r.value}")
        elif name == "dismiss":
            self.error, self.notice = None, None
        elif name == "open_settings":
            if self.perms.get(arg) == NOT_DETERMINED:
                self.ports.permissions.request(arg)  # the prompt is the quicker way
            else:
                self.ports.permissions.open_settings(arg)
            self._next_poll = min(self._next_poll, self.clock() + POLL_S)
        elif name in ("asr_model", "tts_model"):
            kind = name[:3]
            if getattr(s, name) != arg:
                self._set(**{name: arg})
                was = self.models[kind]
                self.models[kind] = ModelInfo(arg)
                if was.status in ("ready", "loading", "downloading"):
                    self.engine.unload(kind)
                    self.engine.load(kind, arg)
        elif name == "voice":
            self._set(voice=arg or None)
        elif name == "toggle":
            self._set(toggle=arg)
        elif name == "unload_after":
            self._set(unload_after_min=int(arg))
        elif name == "handsfree_stop":
            self._set(handsfree_stop_ms=int(arg))
        elif name == "latency_ms":  # the current speech model's; "": its default
            latency = {k: v for k, v in s.latency_ms.items() if k != s.asr_model}
            self._set(latency_ms={**latency, **({s.asr_model: int(arg)} if arg else {})})
        elif name == "language":  # the current speech model's; "": its default
            language = {k: v for k, v in s.language.items() if k != s.asr_model}
            self._set(language={**language, **({s.asr_model: arg} if arg else {})})
        elif name == "login_item":
            self._login_item(not s.login_item)
        elif name == "quit":
            self.post(Quit())
        else:
            raise ValueError(f"unknown menu action {aid!r}")

    def _login_item(self, on: bool) -> None:
        """Written for the next login; never started now (that would be a second copy)."""
        li = self.ports.login_item
        if li is not None:
            try:
                li.set(on)
            except (MlxSpeechError, OSError) as e:
                self._fail(f"cannot change Launch at login: {e}")
                return
            self.notice = ("Launch at login: on, from your next login" if on
                           else "Launch at login: off")
        self._set(login_item=on)

    def _set(self, **changes) -> None:
        self.settings = self.settings.replace(**changes)
        if self._save is not None:
            try:
                self._save(self.settings)
            except OSError as e:
                self._fail(f"cannot save settings: {e}")

    def _fail(self, message: str) -> None:
        self.error = message
        self._emit({"event": "error", "message": message})

    def _emit(self, ev: dict) -> None:
        if self._emit_fn is not None:
            self._emit_fn(ev)

    def _state_changed(self) -> None:
        from .menu import state_name

        st = state_name(self.view())
        if st != self._state:
            self._state = st
            self._emit({"event": "state", "state": st})
