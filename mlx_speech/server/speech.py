"""Speech jobs: every concurrent speech request of one TTS model stepped together.

A `SpeechJob` is one speech session (`model.session(...)`, made on the engine thread): a REST
request's whole text, or one generation of a streaming-text WebSocket whose text arrives as
the client sends it (`feed`, `flush`, from the I/O side; thread-safe). Each engine tick, the
jobs of one model that have something to say advance by one 80 ms frame in ONE batched call
(`model.step_many(sessions)`: the backbone step, the flow head and the codec chunks due, for
every voice at once); each session's audio is exactly what it would be alone. A job whose
`after` (the generation before it on the same socket) has not finished waits, so one socket's
generations never overlap. `cancel` (barge-in) stops a job before its next frame; `close`
(the client left) drops it at the next tick.

Events: ("audio", float32 samples) as codec chunks are decoded, then ("done", {"frames",
"segments", "cancelled"}); or ("error", code, message). `text_at`: the `time.perf_counter()`
when the text that completed the job's first segment arrived (its time-to-first-audio
starts there).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import numpy as np

from .jobs import Job, Sink, batched_calls

NO_AUDIO = ("the model produced no audio (END on the first frame); try another seed or voice, "
            "or rephrase the text")


class SpeechJob(Job):
    """One voice speaking. `make_session()` (called on the engine thread) returns a TTS
    session: already holding its whole text (REST), or fed later with `feed` / `flush`."""

    phase = 2

    def __init__(self, model, make_session: Callable, sink: Sink, after: SpeechJob | None = None):
        super().__init__(model, sink)
        self.make_session, self.session = make_session, None
        self.after = after
        self.text_at: float | None = None
        self.cancelled = False
        self._lock = threading.Lock()
        self._early: list[tuple[str | None, float]] = []  # (text or None: flush, arrival time)

    # -- the I/O side (any thread) ---------------------------------------------------------
    def feed(self, text: str, at: float | None = None) -> None:
        """A piece of text, arrived at `at` (perf_counter; default now)."""
        self._put(text, time.perf_counter() if at is None else at)

    def flush(self, at: float | None = None) -> None:
        """No more text: the rest is spoken as the last segment."""
        self._put(None, time.perf_counter() if at is None else at)

    def cancel(self) -> None:
        """Barge-in: no frame after the one in flight; ("done", {"cancelled": True, ...})."""
        self.cancelled = True
        with self._lock:
            if self.session is not None:
                self.session.cancel()
        if self.engine is not None:
            self.engine.wake()

    @property
    def pending_chars(self) -> int:
        """Text given and not started yet (the socket's backpressure bound)."""
        with self._lock:
            if self.session is None:
                return sum(len(t) for t, _ in self._early if t)
            return self.session.pending_chars

    def _put(self, text: str | None, at: float) -> None:
        with self._lock:
            if self.session is None:
                self._early.append((text, at))
            else:
                self._apply(text, at)
        if self.engine is not None:
            self.engine.wake()

    def _apply(self, text: str | None, at: float) -> None:
        """(under the lock, the session made) one piece, or the flush (None)."""
        s = self.session
        if text is None:
            s.finish()
        else:
            s.feed(text)
        if self.text_at is None and s.ready:
            self.text_at = at

    # -- the engine thread -------------------------------------------------------------------
    def start(self) -> None:
        s = self.make_session()
        with self._lock:
            self.session = s
            if self.cancelled:
                s.cancel()
            for text, at in self._early:
                self._apply(text, at)
            self._early = []
            if self.text_at is None and s.ready:  # a whole text given at the start (REST)
                self.text_at = time.perf_counter()

    def _waiting(self) -> bool:
        a = self.after
        if a is not None and (a.finished or a.closed):
            self.after = a = None  # no chain of a socket's old jobs is kept alive
        return a is not None

    @classmethod
    def step_many(cls, engine, jobs: list[SpeechJob]) -> bool:
        model = jobs[0].model
        going = [j for j in jobs if j.session.ready and not j._waiting()]
        for b, out in batched_calls(engine, going,
                                    lambda b: model.step_many([j.session for j in b]),
                                    "speech step_many"):
            for j, a in zip(b, out, strict=True):
                if a is not None:
                    j.emit(("audio", a.samples))
        ended = [j for j in jobs if not j.finished and j.session.done]
        for j in ended:
            j.finished = True
            s = j.session
            j.emit(("done", {"frames": s.frames, "segments": s.segments,
                             "cancelled": s.cancelled}))
        return bool(going or ended)


OPUS_FRAME = 960  # samples per Opus frame the writer takes (40 ms at 24 kHz)


class OpusChunks:
    """Audio chunks into one Ogg/Opus stream (sphn): whole frames as they come, the rest
    padded with silence at the end. Encoding is CPU work: call from a worker thread."""

    def __init__(self, sample_rate: int):
        import sphn

        self.writer = sphn.OpusStreamWriter(sample_rate)
        self.pending = np.zeros(0, np.float32)

    def push(self, x: np.ndarray) -> bytes:
        x = np.concatenate([self.pending, x])
        n = len(x) // OPUS_FRAME * OPUS_FRAME
        self.pending = x[n:]
        return b"".join(self.writer.append_pcm(x[i:i + OPUS_FRAME])
                        for i in range(0, n, OPUS_FRAME))

    def finish(self) -> bytes:
        if not len(self.pending):
            return b""
        x, self.pending = self.pending, self.pending[:0]
        return self.writer.append_pcm(np.pad(x, (0, OPUS_FRAME - len(x))))
