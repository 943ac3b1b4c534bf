"""Server-side turn detection: each connection's audio through one batched VAD call per tick,
its turns transcribed by one engine stream each.

A `TurnStream` is a connection's whole audio (16 kHz). On the engine thread every tick takes
the audio queued since the last one, runs the Silero VAD of every stream that has whole
32 ms frames in one batched call (`VADState.stack` / `split`), and lets `TurnAudio` cut turns.
A turn is its own ASR session (an `AsrStream` submitted to the engine, batched with every
other stream of its model), opened when speech starts and fed the turn's prefix, then its
audio as the VAD passes it; speech stopped (or the client's commit) ends it. So no audio is
doubled or dropped at a boundary, a turn's text is the library's transcription of exactly its
span, and the work per turn does not grow with the number of turns before it.

Client commits and clears travel in order with the audio (`control`).
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable

import numpy as np

from ..audio.turns import FRAME, SAMPLE_RATE, TurnAudio, TurnConfig, TurnDetector, frame_pitch
from .jobs import MAX_FEED_S, AsrStream, AudioJob, Budget, BufferFull, Sink

log = logging.getLogger("mlx_speech.server")


class TurnStream(AudioJob):
    """A connection's 16 kHz audio cut into turns by `vad`, each transcribed by `asr` (an ASR
    model; `make_session` makes a turn's session). Events (to `sink`): ("started", item,
    start_sample), ("stopped", item, end_sample), ("committed", item, end_sample, event_id)
    for a client commit, ("commit_empty", event_id), ("cleared", event_id), ("timeout", item,
    start_sample, end_sample), ("error", code, msg). Each item's text comes from its own
    AsrStream, whose events go to `item_sink(item)`. The streams of one VAD share its batched
    calls. With a `budget` (the connection's), the audio queued here and in its items counts
    against it."""

    phase = 0  # before the transcription streams: it opens, feeds and ends them this tick

    def __init__(self, vad, asr, make_session: Callable, sink: Sink,
                 item_sink: Callable[[str], Sink], config: TurnConfig,
                 new_item: Callable[[], str], budget: Budget | None = None):
        super().__init__(vad, sink, budget=budget)
        self.vad, self.asr, self.make_session = vad, asr, make_session
        self.item_sink, self.new_item = item_sink, new_item
        self.audio = TurnAudio(TurnDetector(config))
        self.vad_state = None  # made on the engine thread
        self.turn: AsrStream | None = None
        self.item: str | None = None
        self._lock = threading.Lock()
        self.pushed = 0  # samples queued by the client so far
        self.taken = 0  # samples the engine took
        self.controls: collections.deque = collections.deque()  # (at_sample, op, arg)

    def push(self, samples: np.ndarray) -> None:
        with self._lock:
            super().push(samples)
            self.pushed += len(samples)

    def control(self, op: str, arg=None) -> None:
        """"commit" / "clear" (arg: the client's event id) or "config" (a TurnConfig), after
        every sample pushed before it."""
        with self._lock:
            self.controls.append((self.pushed, op, arg))
        self.engine.wake()

    def close(self) -> None:
        super().close()
        if self.turn is not None:
            self.turn.close()

    # -- the engine thread -----------------------------------------------------
    def _open_item(self, item: str) -> AsrStream:
        """The item's transcription, adopted (its session made) before the engine steps the
        transcription streams of this tick."""
        return self.engine.submit(AsrStream(self.asr, self.make_session, self.item_sink(item),
                                            budget=self.input.budget))

    def _feed_item(self, s: AsrStream, x: np.ndarray) -> None:
        if s.finished:
            return
        try:
            s.input.push(x)
        except BufferFull as e:  # the model is far behind real time
            s.fail("buffer_full", f"{e}; the turn is dropped")

    def apply(self, actions: list[tuple], commit_id=None) -> None:
        for a in actions:
            if a[0] == "start":
                self.item = self.new_item()
                self.emit(("started", self.item, a[1]))
                self.turn = self._open_item(self.item)
            elif a[0] == "audio":
                self._feed_item(self.turn, a[1])
            elif a[0] == "stop":
                if commit_id is None:
                    self.emit(("stopped", self.item, a[1]))
                else:
                    self.emit(("committed", self.item, a[1], commit_id))
                if self.turn is not None:
                    self.turn.end()
                self.turn = self.item = None
            elif a[0] == "idle":
                item = self.new_item()
                self.emit(("timeout", item, a[1], a[2]))
                s = self._open_item(item)
                self._feed_item(s, a[3])
                s.end()

    def run_control(self, op: str, arg) -> None:
        if op == "commit":
            acts = self.audio.commit()
            if acts:
                self.apply(acts, commit_id=arg)
            else:
                self.emit(("commit_empty", arg))
        elif op == "clear":
            if self.turn is not None:
                self.turn.close()
            self.turn = self.item = None
            self.audio.clear()
            self.emit(("cleared", arg))
        elif op == "config":
            self.audio.detector.reconfigure(arg)

    @classmethod
    def step_many(cls, engine, streams: list[TurnStream]) -> bool:
        """One tick of the turn streams of one VAD: take audio (up to the next control),
        batched VAD, turn actions, then the controls reached."""
        busy = False
        for s in streams:
            limit = int(MAX_FEED_S * SAMPLE_RATE)
            if s.controls:
                limit = min(limit, s.controls[0][0] - s.taken)
            if limit > 0 and s.input.pending:
                x = s.input.take(limit)
                s.taken += len(x)
                s.audio.push(x)
                busy = True
        group = [s for s in streams if s.audio.received - s.audio.seen >= FRAME]
        if group:
            try:
                _vad_group(group)
            except Exception as e:
                log.exception("VAD step failed")
                for s in group:
                    s.fail("processing_error", f"VAD step failed: {e}")
        for s in streams:
            while s.controls and s.controls[0][0] <= s.taken and not s.finished:
                _, op, arg = s.controls.popleft()
                s.run_control(op, arg)
                busy = True
        return busy


def _vad_group(group: list[TurnStream]) -> None:
    """Every whole frame of each stream through their shared VAD, in batched calls: each
    call takes k frames of every stream that still has k (the fewest any has left)."""
    import mlx.core as mx

    vad = group[0].vad
    frames = {id(s): s.audio.frames() for s in group}
    done = {id(s): 0 for s in group}
    for s in group:
        if s.vad_state is None:
            s.vad_state = vad.make_state(1)
    while True:
        rows = [s for s in group if done[id(s)] < len(frames[id(s)])]
        if not rows:
            return
        k = min(len(frames[id(s)]) - done[id(s)] for s in rows)
        chunks = [frames[id(s)][done[id(s)]: done[id(s)] + k] for s in rows]
        audio = mx.array(np.stack([c.reshape(-1) for c in chunks]))
        state = type(rows[0].vad_state).stack([s.vad_state for s in rows])
        probs, state = vad(audio, state)
        mx.eval(probs, *state.arrays())
        p = np.array(probs)
        for i, (s, states) in enumerate(zip(rows, state.split() if len(rows) > 1 else [state],
                                            strict=True)):
            s.vad_state = states
            done[id(s)] += k
            semantic = s.audio.detector.config.type == "semantic_vad"
            s.apply(s.audio.step(p[i], frame_pitch(chunks[i]) if semantic else None))
