"""What the engine steps: jobs, each of a kind that steps its jobs of one model together.

A job is one client's work: a live transcription, a diarizer stream, a conversation, a speech
request. The I/O side builds one and hands it to `Engine.submit`; the engine adopts it on its
own thread (`start`: the session is made there, as it does model work), then every tick
groups its live jobs by kind (the job's class) and model and calls the kind's
`step_many(engine, jobs)`: one batched model call for the streams of one model. Kinds step in
the order of their `phase` (turn streams first: they open, feed and end the transcription
streams the same tick then steps). Results go back through each job's `sink` (thread-safe:
the server's hands them to the event loop); a failed job gets ("error", code, message).

The kinds here: `AsrStream`, `DiarizerStream`, `Conversation` (full duplex); `TurnStream`
(server/turns.py), `SpeechJob` (server/speech.py: the speech of one TTS model, a frame per
tick, batched), `PauseJob` (server/uploads.py: an upload's pauses, a VAD piece per tick). A
new kind is one class: its events, `start` if it needs a session, and `step_many`.
"""

from __future__ import annotations

import abc
import collections
import logging
import threading
from collections.abc import Callable, Iterator
from typing import ClassVar

import numpy as np

from .vocabulary import new_logprobs

log = logging.getLogger("mlx_speech.server")

FRAME_S = 0.08  # every streaming model here steps in 80 ms frames
MAX_FEED_S = 2.0  # audio one stream feeds per tick (a long upload does not starve others)

Event = tuple
Sink = Callable[[Event], None]


class BufferFull(Exception):
    """A stream's input queue is at its bound; the audio was not taken."""


class Budget:
    """Samples queued in several inputs at once (the streams of one client connection), at
    most `max_samples` in all: a connection that opens stream after stream holds no more
    unprocessed audio than one stream may."""

    def __init__(self, max_samples: int):
        self.max_samples = max_samples
        self.pending = 0
        self.lock = threading.Lock()


class Input:
    """A bounded queue of float32 samples, filled by I/O and drained by the engine: at most
    `max_samples`, and within its `budget` (shared with other inputs) when it has one.
    `drop()` (its job closed or failed) empties it for good and gives its samples back."""

    def __init__(self, max_samples: int, budget: Budget | None = None):
        self.max_samples = max_samples
        self.budget = budget
        self._lock = threading.Lock()
        self._chunks: collections.deque[np.ndarray] = collections.deque()
        self.pending = 0
        self.dropped = False

    def push(self, x: np.ndarray) -> None:
        with self._lock:
            if self.dropped or not len(x):
                return
            if self.pending + len(x) > self.max_samples:
                raise BufferFull(f"input buffer full ({self.pending} samples queued, "
                                 f"limit {self.max_samples}); send audio no faster than real time")
            if self.budget is not None:
                self._charge(len(x))
            self._chunks.append(x)
            self.pending += len(x)

    def _charge(self, n: int) -> None:
        b = self.budget
        with b.lock:
            if b.pending + n > b.max_samples:
                raise BufferFull(f"input buffer full ({b.pending} samples queued in this "
                                 f"connection's streams, limit {b.max_samples}); send audio no "
                                 "faster than it is transcribed")
            b.pending += n

    def _release(self, n: int) -> None:
        if self.budget is not None and n:
            with self.budget.lock:
                self.budget.pending -= n

    def take(self, n: int) -> np.ndarray:
        """Up to `n` samples from the front (fewer when fewer are queued)."""
        out, got = [], 0
        with self._lock:
            while self._chunks and got < n:
                c = self._chunks.popleft()
                if got + len(c) > n:
                    c, rest = c[: n - got], c[n - got:]
                    self._chunks.appendleft(rest)
                out.append(c)
                got += len(c)
            self.pending -= got
            self._release(got)
        return np.concatenate(out) if out else np.zeros(0, np.float32)

    def drop(self) -> None:
        with self._lock:
            self.dropped = True
            self._chunks.clear()
            self._release(self.pending)
            self.pending = 0


def batched_calls(engine, items: list, call: Callable[[list], list], what: str,
                  job_of: Callable | None = None, count: bool = True) -> Iterator[tuple]:
    """Each of `engine.batches(items)` through one model `call`, counted in
    `engine.batch_sizes` when `count`: yields (batch, its results). A call that raises fails
    every job of its batch (`job_of(item)`, default the item itself) and is logged once."""
    for b in engine.batches(items):
        if count:
            engine.batch_sizes[len(b)] += 1
        try:
            results = call(b)
        except Exception as e:
            log.exception("%s failed", what)
            for item in b:
                (item if job_of is None else job_of(item)).fail(
                    "processing_error", f"model step failed: {e}")
            continue
        yield b, results


class Job(abc.ABC):
    """One client's work for one model. `closed`: the client is gone (dropped at the next
    tick); `finished`: done or failed (no more events). A kind is a subclass with its own
    `step_many` (one that lacks it cannot be made)."""

    phase: ClassVar[int] = 1  # kinds step in this order within a tick

    def __init__(self, model, sink: Sink):
        self.model, self.sink = model, sink
        self.engine = None  # set by Engine.submit
        self.closed = False
        self.finished = False

    def attach(self, engine) -> None:
        """Called by `Engine.submit` (any thread), before the job is queued."""
        self.engine = engine

    def start(self) -> None:
        """On the engine thread, once, before the first step (e.g. make the session); an
        exception fails the job. Kinds without a session have nothing to start."""
        return

    @classmethod
    @abc.abstractmethod
    def step_many(cls, engine, jobs: list) -> bool:
        """One tick of `jobs` (live, all of this kind and one model); False when none of them
        had anything to do."""

    def close(self) -> None:
        self.closed = True
        if self.engine is not None:
            self.engine.wake()

    def emit(self, event: Event) -> None:
        try:
            self.sink(event)
        except Exception:  # a sink whose loop is gone: the client left
            self.closed = True

    def fail(self, code: str, message: str) -> None:
        self.finished = True
        self.emit(("error", code, message))


class AudioJob(Job):
    """A job fed audio (at the model's rate) through a bounded queue: `push` from any thread,
    `end` when the client has sent it all. The queue holds `max_samples` (default: the
    engine's `max_buffer_s` of audio), and within `budget` when several jobs share one (a
    connection's). A closed or failed job's queued audio is dropped at once."""

    def __init__(self, model, sink: Sink, max_samples: int | None = None,
                 budget: Budget | None = None):
        super().__init__(model, sink)
        self.input = Input(max_samples or 0, budget)
        self.sized = max_samples is not None
        self.end_requested = False

    def attach(self, engine) -> None:
        super().attach(engine)
        if not self.sized:
            self.input.max_samples = int(engine.max_buffer_s * self.model.sample_rate)

    def push(self, samples: np.ndarray) -> None:
        if self.closed or self.end_requested:
            raise BufferFull("this stream has ended; start a new one")
        if self.finished:  # failed on the engine thread: its error event, on its way to the
            return  # client, says so; an error of our own now would overtake it
        self.input.push(samples)
        self.engine.wake()

    def end(self) -> None:
        self.end_requested = True
        self.engine.wake()

    def close(self) -> None:
        super().close()
        self.input.drop()

    def fail(self, code: str, message: str) -> None:
        super().fail(code, message)
        self.input.drop()


class ModelStream(AudioJob):
    """A stream its model steps with `feed_many` / `finish_many` (ASR and diarizer sessions):
    every tick, each stream with a frame (80 ms) queued feeds up to MAX_FEED_S of it, all of
    one model in one call (one at a time with the engine's `batch=False`); a stream whose end
    was asked for and whose audio is all fed is finished, batched the same way. Subclasses
    say what a feed's and a finish's results are as events (`fed`, `done`)."""

    def __init__(self, model, make_session: Callable, sink: Sink,
                 max_samples: int | None = None, budget: Budget | None = None):
        super().__init__(model, sink, max_samples, budget)
        self.make_session, self.session = make_session, None
        self.frame = int(round(model.sample_rate * FRAME_S))

    def start(self) -> None:
        self.session = self.make_session()

    def fed(self, result) -> None: ...

    def done(self, result) -> None: ...

    @classmethod
    def step_many(cls, engine, jobs: list[ModelStream]) -> bool:
        model = jobs[0].model
        cap = int(MAX_FEED_S * model.sample_rate)
        ready = []
        for s in jobs:
            n = s.input.pending
            if n >= s.frame or (s.end_requested and n):
                ready.append((s, s.input.take(min(n, cap))))
        for b, results in batched_calls(
                engine, ready, lambda b: model.feed_many([(s.session, x) for s, x in b]),
                "feed_many", job_of=lambda item: item[0]):
            for (s, _), r in zip(b, results, strict=True):
                s.fed(r)
        ending = [s for s in jobs if s.end_requested and not s.input.pending
                  and not s.finished and not s.closed]
        for b, results in batched_calls(
                engine, ending, lambda b: model.finish_many([s.session for s in b]),
                "finish_many", count=False):
            for s, r in zip(b, results, strict=True):
                s.finished = True
                s.done(r)
        return bool(ready or ending)


class AsrStream(ModelStream):
    """A live transcription: audio at the model's rate in; ("delta", text) events
    (("delta", text, [(id, logprob)...]) for sessions that keep logprobs), then
    ("done", final_text, Transcript), or ("error", code, message)."""

    def fed(self, text: str) -> None:
        lps = new_logprobs(self.session)  # None unless the client asked
        if text or lps:
            self.emit(("delta", text) if lps is None else ("delta", text, lps))

    def done(self, text: str) -> None:
        if lps := new_logprobs(self.session):  # the last tokens' logprobs, when asked
            self.emit(("delta", "", lps))
        self.emit(("done", text, self.session.result()))


class DiarizerStream(ModelStream):
    """A diarizer over a stream's audio (16 kHz): ("frames", probs) events (new speaker
    frames, (n, n_speakers) float32) as they come out, then ("done",); or ("error", code,
    message). `make_session`: default the model's own streaming settings."""

    def __init__(self, model, sink: Sink, max_samples: int | None = None,
                 make_session: Callable | None = None):
        super().__init__(model, make_session or model.session, sink, max_samples)

    def fed(self, probs: np.ndarray) -> None:
        if len(probs):
            self.emit(("frames", probs))

    def done(self, probs: np.ndarray) -> None:
        self.fed(probs)
        self.emit(("done",))


class Conversation(AudioJob):
    """A full-duplex conversation (Moshi / PersonaPlex): ("ready",) once `make_session()`
    (voice and role prompts) has run; then per `frame_size` samples in, a ("text", text)
    event when there is new text and ("audio", pcm)."""

    phase = 2

    def __init__(self, model, make_session: Callable, sink: Sink):
        super().__init__(model, sink)
        self.make_session, self.session = make_session, None

    def start(self) -> None:
        self.session = self.make_session()
        self.emit(("ready",))

    @classmethod
    def step_many(cls, engine, jobs: list[Conversation]) -> bool:
        busy = False
        for s in jobs:
            busy |= s.step()
        return busy

    def step(self) -> bool:
        frame = self.model.frame_size
        if self.input.pending < frame:
            return False
        x = self.input.take(frame)
        try:
            pcm, text = self.session.step(x)
        except Exception as e:
            log.exception("duplex step failed")
            self.fail("processing_error", f"model step failed: {e}")
            return True
        if text:  # before the frame's audio: a client that has the audio has its text too
            self.emit(("text", text))
        self.emit(("audio", pcm))
        return True
