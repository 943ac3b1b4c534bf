"""Test doubles for the app's ports and models (the core itself is always real)."""

from __future__ import annotations

import threading
import time

import numpy as np

from mlx_speech.app.core import App
from mlx_speech.app.engine import Engine
from mlx_speech.app.events import Key
from mlx_speech.app.ports import (
    GrantedPermissions,
    InsertResult,
    MemoryClipboard,
    Ports,
    ScriptedSelection,
)
from mlx_speech.app.settings import Settings
from mlx_speech.models.base import DELAY_NAMES, Latency

BLOCK = 1280


class Clock:
    def __init__(self, t: float = 100.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def key(app, clock, name, down, dt=0.0):
    clock.t += dt
    app.post(Key(name, down))
    app.pump()


class FakeMic:
    sample_rate = 16000

    def __init__(self, fail: Exception | None = None):
        self.on_block = None
        self.opened = self.closed = 0
        self.fail = fail

    def open(self, on_block):
        if self.fail:
            raise self.fail
        self.on_block = on_block
        self.opened += 1

    def close(self):
        if self.on_block is not None:
            self.closed += 1
        self.on_block = None

    def push(self, block):
        self.on_block(np.asarray(block, np.float32))


class Inserter:
    def __init__(self, clipboard=None):
        self.clipboard = clipboard
        self.calls: list[tuple[str, str | None]] = []
        self.result = InsertResult.OK
        self.focused = "editor"
        self.mods = False  # the user holds a modifier key
        self.selected: str | None = None  # what the focused app copies on Cmd-C

    def focus(self):
        return self.focused

    def modifiers_down(self):
        return self.mods

    def send_copy(self):
        self.calls.append(("copy", "mods down" if self.mods else None))
        if self.selected is not None and not self.mods:
            self.clipboard.write_text(self.selected, transient=False)
        return self.result

    def type_text(self, text):
        self.calls.append(("typed", text))
        return self.result

    def paste(self):
        self.calls.append(("pasted", self.clipboard.read_text() if self.clipboard else None))
        return self.result


class FakeEngine:
    """Records the core's commands; tests post the engine's events themselves."""

    def __init__(self):
        self.calls: list[tuple] = []

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)

        def record(*args):
            self.calls.append((name, *args))
        return record

    def names(self):
        return [c[0] for c in self.calls]

    def audio_blocks(self, sid):
        return [c[2] for c in self.calls if c[0] == "audio" and c[1] == sid]


# ---------------------------------------------------------------- fake models for the real Engine


class _Result:  # a Transcript's text and token ids
    def __init__(self, text):
        self.text = text
        self.token_ids = ()


class FakeSession:
    """One word per 1280 samples of sound ("w<index>"), nothing for silence."""

    def __init__(self):
        self.n_samples = 0
        self.words: list[str] = []
        self._buf = np.zeros(0, np.float32)
        self.finished = False

    def feed(self, x):
        x = np.concatenate([self._buf, np.asarray(x, np.float32)])
        out = []
        while len(x) >= BLOCK:
            b, x = x[:BLOCK], x[BLOCK:]
            k = self.n_samples // BLOCK
            self.n_samples += BLOCK
            if np.abs(b).max() > 0.01:
                w = f"w{k}"
                out.append((" " if self.words else "") + w)
                self.words.append(w)
        self._buf = x
        return "".join(out)

    def finish(self):
        self.finished = True
        return ""

    @property
    def seconds(self):
        return self.n_samples / 16000

    def result(self):
        return _Result(" ".join(self.words))


class FakeASR:
    kind, family, name = "asr", "nemotron_streaming", "Fake speech-to-text"
    sample_rate = 16000
    languages, spoken = None, ("en",)  # it takes no language
    latency = Latency("latency", 160, dict(zip(DELAY_NAMES, (80, 160, 560, 1120, 1120),
                                               strict=True)), choices_ms=(80, 160, 560, 1120))

    def __init__(self):
        self.sessions: list[FakeSession] = []

    def session(self, **kw):
        s = FakeSession()
        self.sessions.append(s)
        return s


class _Chunk:
    def __init__(self, samples, rate):
        self.samples, self.sample_rate = samples, rate


class FakeTTS:
    """Yields a 0.16 s chunk each time `gate` is released (so tests control generation)."""

    kind = "tts"
    sample_rate = 24000
    voices = ["a", "b"]

    def __init__(self, chunks: int = 20, gated: bool = True):
        self.gate = threading.Semaphore(0)
        self.chunks, self.gated = chunks, gated
        self.yielded = 0

    def stream(self, text, **kw):
        for k in range(self.chunks):
            if self.gated and not self.gate.acquire(timeout=10):
                return
            self.yielded += 1
            yield _Chunk(np.full(3840, 0.1 * (k + 1), np.float32), 24000)


class FakeSpeaker:
    def __init__(self):
        self.written: list[np.ndarray] = []
        self.stopped_at: int | None = None  # how many writes had happened at stop()
        self.started = self.closed = False

    def start(self, sr):
        self.started = True

    def write(self, x):
        if self.stopped_at is not None:
            return False
        self.written.append(x)
        return True

    def drain(self):
        pass

    def stop(self):
        self.stopped_at = len(self.written)

    def close(self):
        self.closed = True


class Store:
    def __init__(self, gate: threading.Event | None = None):
        self.gate = gate

    def ensure(self, model_id, progress, kind=None):
        if self.gate is not None:
            progress(0, 100)
            assert self.gate.wait(10)
            progress(100, 100)
        return model_id


def make_app(settings: Settings | None = None, *, engine=None, missing=(), clipboard=None,
             selection=None, mic=None, events=None, **kw):
    clock = Clock()
    clipboard = clipboard or MemoryClipboard("old clipboard")
    ports = Ports(microphone=mic or FakeMic(), inserter=Inserter(clipboard), clipboard=clipboard,
                  selection=selection or ScriptedSelection(),
                  permissions=GrantedPermissions(set(missing)))
    events = [] if events is None else events
    app = App(ports, engine if engine is not None else FakeEngine(),
              settings or Settings(preload_asr=False), clock=clock, emit=events.append, **kw)
    app.start()
    return app, clock, events


def real_engine(app_holder: list, *, asr=None, tts=None, speaker=None, store=None):
    models = {"asr": asr or FakeASR(), "tts": tts or FakeTTS()}

    def load(folder):
        return models[folder]

    eng = Engine(lambda ev: app_holder[0].post(ev), store=store or Store(), load=load,
                 speaker_factory=lambda: speaker or FakeSpeaker())
    return eng.start(), models


def pump_until(app: App, cond, timeout: float = 60.0):  # generous: a busy machine is slow
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting")
        app.pump(timeout=0.01)
