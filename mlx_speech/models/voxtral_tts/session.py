"""Speech sessions: one voice speaking text that arrives in pieces, many stepped together.

A `Session` takes text (`feed`, any pieces, from any thread), cuts it into segments as they
complete (`text.Segmenter`) and speaks each with a fresh prompt (segment j draws from
seed + j; `PAUSE_S` of silence between segments). `step_many(owner, sessions)` advances every
given session by one frame: sessions starting a segment are prefilled together, every live
segment's frame is one batched forward (`step.step_tracks`), and the codec chunks due are
decoded together (`decode_streams`). Sessions join and leave at any call, and each
gets exactly the audio it would get alone: `Session.step` is a batch of one.

Streamed codec decoding, many streams at once: a `CodecStream` holds one stream's codec state
and the frames not decoded yet; a chunk is due at `first` frames, then every `every` frames.
`decode_streams` decodes the pending frames of many streams in one codec call per group of
streams whose chunk and state have the same shapes (padded to a power of two with fixed
shapes): each stream gets what it would get alone.
"""

from __future__ import annotations

import operator
import threading
from collections import deque
from typing import TYPE_CHECKING

import mlx.core as mx
import numpy as np

from ...audio import Audio
from ...errors import MlxSpeechError
from ...nn import fixed_shapes
from .codec import Codec, CodecState
from .step import Track, padded, start_tracks, step_tracks
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


# Streamed codec decoding.
class CodecStream:
    """Decode frames as they come with an explicit codec state: the joined
    output equals one offline decode and each chunk costs the same."""

    def __init__(self, codec: Codec, first: int = 4, every: int = 16):
        self.codec, self.first, self.every = codec, first, every
        self.state = codec.make_state()
        self.pending: list[np.ndarray] = []
        self.emitted = 0

    @property
    def need(self) -> int:
        """Frames the next chunk takes."""
        return self.first if self.emitted == 0 else self.every

    def add(self, codes: np.ndarray) -> None:
        self.pending.append(codes)

    def due(self, final: bool = False) -> bool:
        """A chunk is ready: `need` frames are pending (`final`: any frame, the stream's end)."""
        return len(self.pending) >= self.need or (final and bool(self.pending))

    def push(self, codes: np.ndarray) -> np.ndarray | None:
        self.add(codes)
        return decode_streams([self])[0] if self.due() else None

    def flush(self) -> np.ndarray | None:
        return decode_streams([self], [True])[0] if self.pending else None


def _slots(state: CodecState) -> list[tuple[object, str]]:
    """Every array a codec state holds, as (holder, attribute)."""
    out = [(t, "x") for t in (*state.convs, state.out)]
    return out + [(c, a) for st in state.kv for c in st for a in ("k", "v")]


def _signature(state: CodecState) -> tuple:
    return tuple(None if (a := getattr(o, n)) is None else a.shape for o, n in _slots(state))


def decode_streams(streams: list[CodecStream],
                   final: list[bool] | None = None) -> list[np.ndarray]:
    """Decode every pending frame of each stream (a stream's end when `final`): one codec call
    per group of streams with the same chunk length and state shapes. Returns each stream's
    float32 samples.

    With fixed shapes a stream's last chunk is padded to a whole chunk by repeating its last
    frame (the codec is causal: the real frames' samples do not see the padding; the state is
    then spent)."""
    final = final or [False] * len(streams)
    groups: dict[tuple, list[tuple[CodecStream, np.ndarray, int]]] = {}
    for s, end in zip(streams, final, strict=True):
        codes, n = np.stack(s.pending), len(s.pending)
        if end and fixed_shapes() and n < s.need:
            codes = np.concatenate([codes, np.repeat(codes[-1:], s.need - n, axis=0)])
        groups.setdefault((len(codes), _signature(s.state)), []).append((s, codes, n))
        s.emitted += n
        s.pending = []
    out: dict[int, mx.array] = {}
    for g in groups.values():
        size = padded(len(g))
        rows = g + [g[0]] * (size - len(g))
        codec = g[0][0].codec
        fs = codec.config.frame_samples
        if size == 1:
            s, codes, n = g[0]
            wav = codec(mx.array(codes)[None], s.state)
            out[id(s)] = wav[0, : n * fs]
            continue
        state = codec.make_state()
        for (o, name), *parts in zip(_slots(state), *(_slots(s.state) for s, _, _ in rows),
                                     strict=True):
            got = [getattr(po, pn) for po, pn in parts]
            setattr(o, name, None if got[0] is None else mx.concatenate(got))
        wav = codec(mx.array(np.stack([c for _, c, _ in rows])), state)
        for i, (s, _, n) in enumerate(g):
            out[id(s)] = wav[i, : n * fs]
            for (o, name), (so, sn) in zip(_slots(state), _slots(s.state), strict=True):
                a = getattr(o, name)
                setattr(so, sn, None if a is None else a[i: i + 1])
    mx.eval(list(out.values()), *(s.state.arrays() for s in streams))
    return [np.array(out[id(s)].astype(mx.float32)) for s in streams]
