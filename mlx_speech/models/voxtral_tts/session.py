"""Speech sessions: one voice speaking text that arrives in pieces, many stepped together.

A `Session` takes text (`feed`, any pieces, from any thread), cuts it into segments as they
complete (`text.Segmenter`) and speaks each with a fresh prompt (segment j draws from
seed + j; `PAUSE_S` of silence between segments). `step_many(owner, sessions)` advances every
given session by one frame: sessions starting a segment are prefilled together, every live
segment's frame is one batched forward (`step.step_tracks`), and the codec chunks due are
decoded together (`generate.decode_streams`). Sessions join and leave at any call, and each
gets exactly the audio it would get alone: `Session.step` is a batch of one.
"""

from __future__ import annotations

import operator
import threading
from collections import deque
from typing import TYPE_CHECKING

import numpy as np

from ...audio.clip import Audio
from ...errors import MlxSpeechError
from .generate import CodecStream, decode_streams
from .step import Track, start_tracks, step_tracks
from .text import CLAUSE_WORDS, SEGMENT_CHARS, Segmenter

if TYPE_CHECKING:
    from . import VoxtralTTS

MAX_FRAMES = 2048  # 164 s per text chunk
PAUSE_S = 0.25  # silence between the segments (chunks of a long text)


def default_max_frames(text: str) -> int:
    """Generous cap: ~5x a normal speaking rate (~15 characters per second)."""
    return min(MAX_FRAMES, 64 + 4 * len(text))


def _positive(name: str, value, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise MlxSpeechError(f"{name} must be a positive integer, not {value!r}")


class Session:
    """One voice speaking: text in (`feed`, `finish`), audio out one frame per `step`.

    `first_frames` / `chunk_frames`: frames in a segment's first and later audio chunks
    (80 ms each). `max_frames`: a cap per segment (default from its length). `clause_words`
    / `max_chars`: where text is cut (see `text.Segmenter`). `feed`, `finish` and `cancel`
    may be called from any thread; `step` from the one thread that owns MLX work."""

    def __init__(self, owner: VoxtralTTS, voice: str | None = None, seed: int = 0,
                 max_frames: int | None = None, first_frames: int = 4, chunk_frames: int = 16,
                 clause_words: int | None = CLAUSE_WORDS, max_chars: int = SEGMENT_CHARS):
        voice = owner.default_voice() if voice is None else voice
        owner.voice_rows(voice)  # unknown voice: fail before any work
        if isinstance(seed, bool) or not hasattr(seed, "__index__"):
            raise MlxSpeechError(f"seed must be an integer, not {seed!r}")
        seed = operator.index(seed)
        _positive("max_frames", max_frames, allow_none=True)
        _positive("first_frames", first_frames)
        _positive("chunk_frames", chunk_frames)
        self.owner, self.voice, self.seed, self.max_frames = owner, voice, seed, max_frames
        self.first_frames, self.chunk_frames = first_frames, chunk_frames
        self._segmenter = Segmenter(clause_words, max_chars)
        self._todo: deque[str] = deque()
        self._lock = threading.Lock()
        self._changed = threading.Event()
        self.finished = False  # no more text will come
        self.cancelled = False
        self.error: BaseException | None = None  # what the text source raised
        self.track: Track | None = None  # the segment being spoken
        self.codec: CodecStream | None = None
        self.text = ""  # the segment being spoken
        self.segments = 0  # segments started; segment j draws from seed + j
        self.segments_done = 0
        self.chars_done = 0  # characters of the segments spoken so far
        self.frames = 0  # frames spoken (all segments)

    # -- text in (any thread) ---------------------------------------------------------------
    def feed(self, text: str) -> None:
        """Add a piece of text (any size); the segments it completes are queued."""
        with self._lock:
            if self.finished:
                raise MlxSpeechError("session text already finished")
            self._todo.extend(self._segmenter.feed(text))
        self._changed.set()

    def finish(self) -> None:
        """No more text: the rest is spoken as the last segment."""
        with self._lock:
            if not self.finished:
                self._todo.extend(self._segmenter.finish())
                self.finished = True
        self._changed.set()

    def add_segments(self, segments: list[str], final: bool = True) -> None:
        """Queue segments cut elsewhere (spoken as given)."""
        with self._lock:
            self._todo.extend(segments)
            self.finished |= final
        self._changed.set()

    def cancel(self) -> None:
        """Stop: the next step speaks nothing more (barge-in)."""
        self.cancelled = True
        self._changed.set()

    def fail(self, error: BaseException) -> None:
        """The text source failed: `wait` returns and the caller raises `error`."""
        self.error = error
        self.cancel()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until there is something to do (or done); False on timeout."""
        got = self._changed.wait(timeout)
        self._changed.clear()
        return got

    # -- state -------------------------------------------------------------------------------
    @property
    def ready(self) -> bool:
        """A step would do work now (a segment is being spoken or one is queued)."""
        return not self.cancelled and (self.track is not None or bool(self._todo))

    @property
    def pending_chars(self) -> int:
        """Characters given and not started yet: the segments queued and the text not cut."""
        with self._lock:
            return sum(map(len, self._todo)) + len(self._segmenter.buf)

    @property
    def done(self) -> bool:
        """Cancelled, or every segment of the finished text spoken."""
        return self.cancelled or (self.finished and self.track is None and not self._todo)

    def step(self) -> Audio | None:
        """One frame alone (a batch of one): the audio it completed, or None."""
        return self.owner.step_many([self])[0]

    # -- used by step_many --------------------------------------------------------------------
    def _begin(self) -> np.ndarray | None:
        """Start the next queued segment; returns the pause before it (not the first)."""
        with self._lock:
            if not self._todo:
                return None
            self.text = self._todo.popleft()
        o = self.owner
        n = default_max_frames(self.text) if self.max_frames is None else self.max_frames
        self.track = Track(o.prompt(self.text, self.voice), n, self.seed + self.segments)
        self.codec = CodecStream(o.model.audio_tokenizer, self.first_frames, self.chunk_frames)
        self.segments += 1
        if self.segments == 1:
            return None
        return np.zeros(int(PAUSE_S * o.sample_rate), np.float32)

    def _end_segment(self) -> None:
        self.track = self.codec = None
        self.segments_done += 1
        self.chars_done += len(self.text)
        self._changed.set()


def check_sessions(owner, sessions: list[Session]) -> None:
    seen = set()
    for s in sessions:
        if not isinstance(s, Session) or s.owner is not owner:
            raise MlxSpeechError("a session belongs to another model")
        if id(s) in seen:
            raise MlxSpeechError("a session may appear only once per call")
        seen.add(id(s))


def step_many(owner: VoxtralTTS, sessions: list[Session]) -> list[Audio | None]:
    """Advance each session by one frame, all in shared batched calls; returns each session's
    new audio (or None), exactly as `[s.step() for s in sessions]` would."""
    sessions = list(sessions)
    check_sessions(owner, sessions)
    parts: dict[int, list[np.ndarray]] = {id(s): [] for s in sessions}
    live = []
    for s in sessions:
        if s.cancelled:
            if s.track is not None:
                s.track.release()
                s.track = s.codec = None
            continue
        if s.track is None and (pause := s._begin()) is not None:
            parts[id(s)].append(pause)
        if s.track is not None:
            live.append(s)
    model = owner.model
    audio_step = owner.ids["audio"] if owner.first_frame == "audio_step" else None
    start_tracks(model, [s.track for s in live if s.track.home is None], audio_step)
    codes = step_tracks(model, [s.track for s in live], owner.decode_frame, owner.frame)
    due, final = [], []
    for s, c in zip(live, codes, strict=True):
        if c is not None:
            s.codec.add(c)
            s.frames += 1
        if s.codec.due(s.track.done):
            due.append(s)
            final.append(s.track.done)
    for s, wav in zip(due, decode_streams([s.codec for s in due], final), strict=True):
        parts[id(s)].append(wav)
    for s in live:
        if s.track.done:
            s._end_segment()
    sr = owner.sample_rate
    return [Audio(np.concatenate(p) if len(p) > 1 else p[0], sr) if p else None
            for p in (parts[id(s)] for s in sessions)]
