"""The engine: one thread owns every MLX call; the asyncio side only queues audio and reads events.

Each tick gathers every live transcription stream that has a frame (80 ms) ready and
steps all of them with one `owner.feed_many` per model (or one session at a time with
`batch=False`, a debug/benchmark switch), finishes the streams whose end was asked for,
steps each duplex conversation by one frame and advances each speech job by one chunk.
Results go back through each stream's `sink` (thread-safe; the server's sink hands them to
the event loop with `call_soon_threadsafe`). There is no timeout on waiting for the next
step: a stream waits as long as the engine is alive, and an engine that dies fails every
open stream with an error event and marks itself unhealthy.
"""

from __future__ import annotations

import collections
import logging
import threading
import traceback
from collections.abc import Callable, Iterator

import numpy as np

from ..errors import MlxSpeechError
from .vocabulary import new_logprobs

log = logging.getLogger("mlx_speech.server")

FRAME_S = 0.08  # every streaming model here steps in 80 ms frames
MAX_FEED_S = 2.0  # audio one stream feeds per tick (a long upload does not starve others)
IDLE_WAIT_S = 0.5  # how often an idle engine looks at its stop flag (not a step timeout)

Event = tuple
Sink = Callable[[Event], None]


class BufferFull(Exception):
    """A stream's input queue is at its bound; the audio was not taken."""


class _Input:
    """A bounded queue of float32 samples, filled by I/O and drained by the engine."""

    def __init__(self, max_samples: int):
        self.max_samples = max_samples
        self._lock = threading.Lock()
        self._chunks: collections.deque[np.ndarray] = collections.deque()
        self.pending = 0

    def push(self, x: np.ndarray) -> None:
        with self._lock:
            if self.pending + len(x) > self.max_samples:
                raise BufferFull(f"input buffer full ({self.pending} samples queued, "
                                 f"limit {self.max_samples}); send audio no faster than real time")
            if len(x):
                self._chunks.append(x)
                self.pending += len(x)

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
        return np.concatenate(out) if out else np.zeros(0, np.float32)


class _Stream:
    """What every engine-driven stream shares: input, sink, end/close flags."""

    def __init__(self, engine: Engine, sink: Sink, max_samples: int):
        self.engine, self.sink = engine, sink
        self.input = _Input(max_samples)
        self.end_requested = False
        self.closed = False  # the client is gone: drop at the next tick
        self.finished = False

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
        self.closed = True
        self.engine.wake()

    def emit(self, event: Event) -> None:
        try:
            self.sink(event)
        except Exception:  # a sink whose loop is gone: the client left
            self.closed = True

    def fail(self, code: str, message: str) -> None:
        self.finished = True
        self.emit(("error", code, message))


class AsrStream(_Stream):
    """A live transcription: 16 kHz float32 in; ("delta", text) events (("delta", text,
    [(id, logprob)...]) for sessions that keep logprobs), then ("done", final_text,
    Transcript), or ("error", code, message)."""

    def __init__(self, engine: Engine, owner, make_session, sink: Sink, max_samples: int):
        super().__init__(engine, sink, max_samples)
        self.owner, self.make_session, self.session = owner, make_session, None
        self.frame = int(round(owner.sample_rate * FRAME_S))


class DuplexStream(_Stream):
    """A Moshi/PersonaPlex conversation: `frame_size` samples in per step; per step a
    ("text", text) event when there is new text, then ("audio", pcm)."""

    def __init__(self, engine: Engine, owner, make_session, sink: Sink, max_samples: int):
        super().__init__(engine, sink, max_samples)
        self.owner, self.make_session, self.session = owner, make_session, None
        self.frame = owner.frame_size


class SpeechJob:
    """A text-to-speech request: an iterator of Audio chunks advanced one chunk per tick;
    ("audio", samples) events, then ("done",) or ("error", code, message)."""

    def __init__(self, make: Callable[[], Iterator], sink: Sink):
        self.make, self.sink = make, sink
        self.it: Iterator | None = None
        self.closed = False
        self.finished = False

    def close(self) -> None:
        self.closed = True

    emit = _Stream.emit
    fail = _Stream.fail


class Engine:
    """Owns the models' MLX work on one thread. Create, `start()`, then open streams."""

    def __init__(self, batch: bool = True, max_buffer_s: float = 60.0):
        self.batch = batch
        self.max_buffer_s = max_buffer_s
        self.failed: str | None = None
        self._wake = threading.Event()
        self._stop = False
        self._new: collections.deque = collections.deque()  # streams and jobs to adopt
        self._streams: list = []
        self._thread = threading.Thread(target=self._run, name="mlx_speech-engine", daemon=True)
        self.ticks = 0
        self.batch_sizes: collections.Counter = collections.Counter()
        self.cancel_reason: str | None = None  # set (from a signal handler): fail everything

    def cancel_all(self, reason: str) -> None:
        """Fail every open stream and job at the engine's next look (within IDLE_WAIT_S):
        a plain attribute store, safe from a signal handler (no lock taken)."""
        self.cancel_reason = reason

    # -- lifecycle -----------------------------------------------------------
    def start(self) -> Engine:
        self._thread.start()
        return self

    def stop(self, timeout: float = 30.0) -> None:
        self._stop = True
        self.wake()
        if self._thread.is_alive():
            self._thread.join(timeout)

    @property
    def healthy(self) -> bool:
        return self.failed is None and self._thread.is_alive() and not self._stop

    def wake(self) -> None:
        self._wake.set()

    # -- the I/O side's API (any thread) -------------------------------------------
    def _adopt(self, item):
        self._new.append(item)
        self.wake()
        if self.failed is not None:  # checked after queueing: no race with a dying engine
            item.fail("processing_error", f"engine failed: {self.failed}")
        return item

    def open_asr(self, owner, make_session: Callable, sink: Sink,
                 max_samples: int | None = None) -> AsrStream:
        """A transcription stream; `make_session()` runs on the engine thread (it does
        model work)."""
        n = int(self.max_buffer_s * owner.sample_rate) if max_samples is None else max_samples
        return self._adopt(AsrStream(self, owner, make_session, sink, n))

    def open_duplex(self, owner, make_session: Callable, sink: Sink) -> DuplexStream:
        """A conversation; ("ready",) once `make_session()` (voice/role prompts) has run."""
        n = int(self.max_buffer_s * owner.sample_rate)
        return self._adopt(DuplexStream(self, owner, make_session, sink, n))

    def open_turns(self, vad, owner, make_session: Callable, sink: Sink, item_sink: Callable,
                   config, new_item: Callable[[], str]):
        """A live stream cut into turns by `vad` (see server/turns.py): each turn is its own
        transcription stream, opened on the engine thread, its events to `item_sink(item)`."""
        from .turns import TurnStream

        n = int(self.max_buffer_s * 16000)
        return self._adopt(TurnStream(self, vad, owner, make_session, sink, item_sink, config,
                                      new_item, n))

    def open_speech(self, make: Callable[[], Iterator], sink: Sink) -> SpeechJob:
        return self._adopt(SpeechJob(make, sink))

    # -- the engine thread -------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self._stop:
                if not self._tick():
                    self._wake.wait(IDLE_WAIT_S)
                    self._wake.clear()
        except BaseException as e:  # a dead engine must not leave clients hanging
            self.failed = f"{type(e).__name__}: {e}"
            log.error("engine thread died:\n%s", traceback.format_exc())
            for s in self._streams + list(self._new):
                if not s.finished:
                    s.fail("processing_error", f"engine failed: {self.failed}")
        finally:
            # MLX aborts the process at exit when a thread that ran MLX work left its streams
            # behind (mlx#3126); this thread owns them, so it frees them on the way out.
            import mlx.core as mx

            mx.clear_streams()

    def _tick(self) -> bool:
        """One round over everything; False when there was nothing to do."""
        busy = False
        if self.cancel_reason is not None:
            for s in self._streams + list(self._new):
                if not (s.finished or s.closed):
                    s.fail("server_shutdown", self.cancel_reason)
                s.closed = True
        while self._new:
            s = self._new.popleft()
            busy = True
            if isinstance(s, (AsrStream, DuplexStream)):
                try:
                    s.session = s.make_session()
                except Exception as e:
                    s.fail("invalid_request" if isinstance(e, MlxSpeechError)
                           else "processing_error", str(e))
                    continue
                if isinstance(s, DuplexStream):
                    s.emit(("ready",))
            self._streams.append(s)
        self._streams = [s for s in self._streams if not (s.closed or s.finished)]
        turns = [s for s in self._streams if getattr(s, "cuts_turns", False)]
        if turns:  # VAD first: it opens, feeds and ends turns' AsrStreams for this tick
            from .turns import step_turns

            busy |= step_turns(self, turns, MAX_FEED_S)
        asr = [s for s in self._streams if isinstance(s, AsrStream)]
        busy |= self._feed_asr(asr)
        busy |= self._finish_asr(asr)
        for s in self._streams:
            if isinstance(s, DuplexStream):
                busy |= self._step_duplex(s)
            elif isinstance(s, SpeechJob):
                busy |= self._step_speech(s)
        if busy:
            self.ticks += 1
        return busy

    def _feed_asr(self, streams: list[AsrStream]) -> bool:
        groups: dict[int, list] = {}
        for s in streams:
            n = s.input.pending
            if n >= s.frame or (s.end_requested and n):
                cap = int(MAX_FEED_S * s.owner.sample_rate)
                groups.setdefault(id(s.owner), []).append((s, s.input.take(min(n, cap))))
        for items in groups.values():
            batches = [items] if self.batch else [[it] for it in items]
            for b in batches:
                owner = b[0][0].owner
                self.batch_sizes[len(b)] += 1
                try:
                    texts = owner.feed_many([(s.session, x) for s, x in b])
                except Exception as e:
                    log.exception("feed_many failed")
                    for s, _ in b:
                        s.fail("processing_error", f"model step failed: {e}")
                    continue
                for (s, _), t in zip(b, texts, strict=True):
                    lps = new_logprobs(s.session)  # None unless the client asked
                    if t or lps:
                        s.emit(("delta", t) if lps is None else ("delta", t, lps))
        return bool(groups)

    def _finish_asr(self, streams: list[AsrStream]) -> bool:
        groups: dict[int, list[AsrStream]] = {}
        for s in streams:
            if s.end_requested and not s.input.pending and not s.finished and not s.closed:
                groups.setdefault(id(s.owner), []).append(s)
        batches = [b for g in groups.values() for b in ([g] if self.batch else [[s] for s in g])]
        for b in batches:
            try:
                texts = b[0].owner.finish_many([s.session for s in b])
            except Exception as e:
                log.exception("finish_many failed")
                for s in b:
                    s.fail("processing_error", f"model step failed: {e}")
                continue
            for s, t in zip(b, texts, strict=True):
                s.finished = True
                if lps := new_logprobs(s.session):  # the last tokens' logprobs, when asked
                    s.emit(("delta", "", lps))
                s.emit(("done", t, s.session.result()))
        return bool(groups)

    def _step_duplex(self, s: DuplexStream) -> bool:
        if s.input.pending < s.frame:
            return False
        x = s.input.take(s.frame)
        try:
            pcm, text = s.session.step(x)
        except Exception as e:
            log.exception("duplex step failed")
            s.fail("processing_error", f"model step failed: {e}")
            return True
        if text:  # before the frame's audio: a client that has the audio has its text too
            s.emit(("text", text))
        s.emit(("audio", pcm))
        return True

    def _step_speech(self, job: SpeechJob) -> bool:
        try:
            if job.it is None:
                job.it = iter(job.make())
            chunk = next(job.it)
        except StopIteration:
            job.finished = True
            job.emit(("done",))
            return True
        except Exception as e:
            log.exception("speech job failed")
            job.fail("processing_error", str(e))
            return True
        job.emit(("audio", chunk.samples))
        return True
