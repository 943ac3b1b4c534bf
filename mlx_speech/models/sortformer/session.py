"""Streaming diarizer sessions: audio in, speaker probabilities per 80 ms frame out.

A session turns samples into NeMo's mel frames exactly (any chunking gives the offline
frames), cuts them into NeMo's streaming chunks (`chunk_bounds`) as soon as a chunk and its
right context are available, and advances its `StreamState`. `SortformerDiarizer.feed_many` steps
many sessions together (`models/stepper.py`): round r batches the r-th ready chunk of every
session that has one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..nemo import StreamingNemoLogMel
from .config import FRAME_S
from .streaming import SUB, Chunk, StreamState, chunk_bounds


@dataclass
class Segment:
    speaker: int  # 0-based arrival-order speaker slot
    start: float  # seconds
    end: float

    def to_dict(self) -> dict:
        return {"speaker": self.speaker, "start": self.start, "end": self.end}


@dataclass
class Diarization:
    """Frame probabilities (frames of 80 ms, n_spk) and the speaker segments drawn from them."""

    probs: np.ndarray
    segments: list[Segment] = field(default_factory=list)
    frame_s: float = FRAME_S

    def speaker_at(self, start: float, end: float) -> int | None:
        """The speaker most active over [start, end) in seconds (None: nobody above 0.5)."""
        return speaker_at(self.probs, start, end, self.frame_s)


def speaker_at(probs: np.ndarray, start: float, end: float, frame_s: float = FRAME_S,
               threshold: float = 0.5) -> int | None:
    if len(probs) == 0:
        return None
    a = min(max(0, int(start / frame_s)), len(probs) - 1)
    b = min(len(probs), max(a + 1, int(np.ceil(end / frame_s))))
    window = probs[a:b]
    active = (window > threshold).sum(axis=0)
    if active.max() == 0:
        return None
    score = active * 1000.0 + window.sum(axis=0)  # frames active, then total probability
    return int(np.argmax(score))


def segments(probs: np.ndarray, onset: float = 0.5, offset: float = 0.5,
             frame_s: float = FRAME_S) -> list[Segment]:
    """NeMo's `ts_vad_post_processing` with its default parameters, per speaker: each 80 ms
    frame repeated as eight 10 ms frames; speech starts at the first frame above `onset` and
    ends at the first below `offset`; a segment still open at the end ends at the last 10 ms
    frame's start. Times rounded to 10 ms; sorted by start, then speaker."""
    out = []
    n10 = round(frame_s / 0.01)
    for spk in range(probs.shape[1]):
        seq = np.repeat(probs[:, spk], n10)
        speech, start = False, 0.0
        for i, v in enumerate(seq):
            if speech and v < offset:
                if i * 0.01 > start:
                    out.append(Segment(spk, round(start, 2), round(i * 0.01, 2)))
                start, speech = i * 0.01, False
            elif not speech and v > onset:
                start, speech = i * 0.01, True
        if speech:
            out.append(Segment(spk, round(start, 2), round((len(seq) - 1) * 0.01, 2)))
    out.sort(key=lambda s: (s.start, s.speaker))
    return out


class DiarizerSession:
    """`feed(samples) -> probs (new frames, n_spk)`, `finish() -> probs`; frames in order."""

    def __init__(self, owner, config, state: StreamState):
        self.owner, self.config, self.state = owner, config, state
        self.mel = StreamingNemoLogMel(owner.features)
        self.buf = np.zeros((0, owner.config.n_mels), np.float32)
        self.buf_start = 0  # absolute mel index of buf[0]
        self.n_mel = 0  # mel frames received
        self.start = 0  # absolute mel index where the next chunk starts
        self.frames = 0  # diarization frames emitted
        self.finished = False

    @property
    def time(self) -> float:
        """Seconds of audio whose speaker probabilities have been returned."""
        return self.frames * FRAME_S

    def feed(self, samples: np.ndarray) -> np.ndarray:
        return self.owner.feed_many([(self, samples)])[0]

    def finish(self) -> np.ndarray:
        return self.owner.finish_many([self])[0]

    def feed_features(self, mel: np.ndarray) -> np.ndarray:
        """Feed NeMo log-mel frames (n, n_mels) instead of samples (a session takes one or
        the other): parity tests feed NeMo's own features this way."""
        if self.mel.n_samples:
            raise ValueError("this session was fed samples")
        self.push(np.asarray(mel, np.float32))
        return self.owner.advance([self], final=False)[0]

    def push(self, mel: np.ndarray) -> None:
        if len(mel):
            self.buf = np.concatenate([self.buf, mel])
            self.n_mel += len(mel)

    def next_chunk(self, final: bool) -> Chunk | None:
        bounds = chunk_bounds(self.start, self.n_mel, self.config, final)
        if bounds is None:
            return None
        left, end, right = bounds
        a, b = self.start - left - self.buf_start, end + right - self.buf_start
        chunk = Chunk(self.buf[a:b], left, right)
        self.start = end
        keep = max(0, self.start - self.config.chunk_left_context * SUB - self.buf_start)
        self.buf, self.buf_start = self.buf[keep:], self.buf_start + keep
        return chunk
