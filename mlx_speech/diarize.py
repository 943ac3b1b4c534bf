"""Speaker labels for transcripts: ASR words aligned to a diarizer's 80 ms speaker frames.

The diarizer (streaming Sortformer, `mlx_speech.models.sortformer`) gives per-frame speaker
probabilities in arrival order; each word takes the speaker most active over its time span
(frames above 0.5 first, then total probability); a word over silence keeps the previous word's
speaker (the next word's at the start). Speakers are numbered by first appearance in the
transcript, from 0, so the first voice heard is speaker 0 whichever slot the diarizer used, and
the numbering only grows while streaming. That number (an int; None while nobody was heard) is
the library's one form of a speaker: each front door shows it its own way ("Speaker 1",
"A", "speaker_1"), mapped once at its edge (the table: docs/diarization.md).

- `label_words(words, probs)` -> a speaker per word;
- `SpeakerTurns` keeps that numbering across calls (live sessions, one per stream);
- `speaker_runs` / `main_speaker`: a labelled transcript's turns and its main speaker;
- `SpeakerTracker` runs a diarizer session beside any ASR session on the same audio;
- `transcribe(asr, audio, diarizer)` -> a transcript whose words and segments carry speakers;
  `from_frames(result, probs)` the same from frames already computed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .transcript import segments_from_words

FRAME_S = 0.08
DEFAULT_DIARIZER = "mlx-community/diar_streaming_sortformer_4spk-v2.1-fp16"


def _slot(probs: np.ndarray, start: float, end: float, frame_s: float) -> int | None:
    from .models.sortformer.session import speaker_at

    return speaker_at(probs, start, end, frame_s)


class SpeakerTurns:
    """Diarizer slot -> speaker number (0, 1, ... by first appearance); one per stream."""

    def __init__(self):
        self.numbers: dict[int, int] = {}
        self.last: int | None = None

    def number(self, slot: int | None) -> int | None:
        if slot is None:
            return self.last
        if slot not in self.numbers:
            self.numbers[slot] = len(self.numbers)
        self.last = self.numbers[slot]
        return self.last

    def label(self, words, probs: np.ndarray, frame_s: float = FRAME_S) -> list[int | None]:
        """A speaker per word (None only when no word so far had an active speaker)."""
        slots = [_slot(probs, w.start, w.end, frame_s) for w in words]
        labels = [self.number(s) for s in slots]
        first = next((x for x in labels if x is not None), None)
        return [first if x is None else x for x in labels] if self.last is not None else labels


def label_words(words, probs: np.ndarray, frame_s: float = FRAME_S) -> list[int | None]:
    """A speaker label per word (see the module docstring)."""
    return SpeakerTurns().label(words, probs, frame_s)


def speaker_runs(items, speaker: Callable = lambda w: w.speaker) -> list[tuple]:
    """(speaker, [items]) per run of consecutive items of one speaker, in order."""
    out: list[tuple] = []
    for it in items:
        who = speaker(it)
        if out and out[-1][0] == who:
            out[-1][1].append(it)
        else:
            out.append((who, [it]))
    return out


def main_speaker(labels: list):
    """The speaker of most of `labels` (ties: the one heard first)."""
    counts: dict = {}
    for lab in labels:
        counts[lab] = counts.get(lab, 0) + 1
    return max(counts, key=lambda k: (counts[k], -labels.index(k)))


@dataclass
class SpeakerWord:
    text: str
    start: float
    end: float
    speaker: int | None


@dataclass
class DiarizedTranscript:
    text: str
    words: list[SpeakerWord]
    probs: np.ndarray  # (frames, n_spk) diarizer output
    segments: list = field(default_factory=list)  # transcript.Segment with .speaker

    def turns(self) -> list[tuple[int | None, str]]:
        """(speaker, text) per speaker turn, in order."""
        return [(who, " ".join(w.text for w in run)) for who, run in speaker_runs(self.words)]


def speaker_segments(words: list[SpeakerWord]) -> list:
    """Cues that never mix speakers: `segments_from_words` within each speaker turn."""
    out = []
    for who, run in speaker_runs(words):
        for seg in segments_from_words(run):
            seg.speaker = who
            out.append(seg)
    return out


class FrameLog:
    """Speaker frames (frames, n_speakers) appended in amortised constant time: the buffer
    doubles when full, so a day-long stream never copies its whole history per chunk.
    `frames` is everything so far (a view)."""

    def __init__(self, n_speakers: int):
        self._buf = np.zeros((256, n_speakers), np.float32)
        self._n = 0

    def add(self, p: np.ndarray) -> None:
        need = self._n + len(p)
        if need > len(self._buf):
            buf = np.zeros((max(need, 2 * len(self._buf)), self._buf.shape[1]), np.float32)
            buf[: self._n] = self._buf[: self._n]
            self._buf = buf
        self._buf[self._n: need] = p
        self._n = need

    @property
    def frames(self) -> np.ndarray:
        return self._buf[: self._n]


class SpeakerTracker:
    """A diarizer session beside an ASR session: feed both the same samples, then ask who
    spoke a word or a span. Frames arrive with the diarizer's chunk latency
    ((chunk_len + right context) x 80 ms); `label` on a span not yet covered uses what exists
    (the previous speaker for frames still missing)."""

    def __init__(self, diarizer, **streaming):
        self.diarizer = diarizer
        self.session = diarizer.session(**streaming)
        self._log = FrameLog(diarizer.n_speakers)
        self.turns = SpeakerTurns()

    @property
    def probs(self) -> np.ndarray:
        """Every speaker frame so far, (frames, n_speakers)."""
        return self._log.frames

    def _add(self, p: np.ndarray) -> np.ndarray:
        self._log.add(p)
        return p

    def feed(self, samples: np.ndarray) -> np.ndarray:
        return self._add(self.session.feed(samples))

    def finish(self) -> np.ndarray:
        return self._add(self.session.finish())

    @property
    def time(self) -> float:
        """Seconds of audio with speaker frames."""
        return len(self.probs) * FRAME_S

    def covers(self, word) -> bool:
        """Whether every frame `label` reads for `word` exists, so its label is final (the
        one offline labelling of the whole recording gives)."""
        a = max(0, int(word.start / FRAME_S))
        return max(a + 1, int(np.ceil(word.end / FRAME_S))) <= len(self.probs)

    def label(self, words) -> list[int | None]:
        return self.turns.label(words, self.probs)

    def speaker(self, start: float, end: float) -> int | None:
        return self.turns.number(_slot(self.probs, start, end, FRAME_S))


# NVIDIA's 1.04 s streaming setting (model card): live lines wait for their speaker frames, and
# the released v2.1 config's chunks (188 frames, 15 s) would hold each line that long
LIVE_STREAMING = dict(chunk_len=6, chunk_right_context=7, fifo_len=188,
                      spkcache_update_period=144)


def live_streaming(diarizer) -> dict:
    """The streaming overrides for a live transcript: `LIVE_STREAMING` when the diarizer's own
    chunk latency is longer, else none (its own settings)."""
    c = diarizer.config
    own = c.chunk_len + c.chunk_right_context
    if own <= LIVE_STREAMING["chunk_len"] + LIVE_STREAMING["chunk_right_context"]:
        return {}
    return dict(LIVE_STREAMING)


def load_diarizer(name: str | Path | None = None, **kwargs):
    """A diarizer model (default: the streaming Sortformer v2.1, fp16)."""
    import mlx_speech

    # the kind is checked from the config files, before any weights load
    return mlx_speech.load(name or DEFAULT_DIARIZER, kind="diarizer", **kwargs)


def transcribe(asr, audio, diarizer, sample_rate: int = 16000, **asr_kwargs
               ) -> DiarizedTranscript:
    """Transcribe with `asr` (any ASR family) and label every word with its speaker."""
    from .audio.io import audio_at

    audio = audio_at(audio, asr.sample_rate, sample_rate)
    result = asr.transcribe(audio, asr.sample_rate, **asr_kwargs)
    return diarize_result(result, audio, diarizer)


def diarize_result(result, audio: np.ndarray, diarizer) -> DiarizedTranscript:
    """An ASR result (text + timed words) and its 16 kHz audio -> a diarized transcript."""
    return from_frames(result, diarizer.probabilities(audio))


def from_frames(result, probs: np.ndarray) -> DiarizedTranscript:
    """An ASR result and the diarizer's frames over its audio -> a diarized transcript."""
    labels = label_words(result.words, probs)
    words = [SpeakerWord(w.text, w.start, w.end, s)
             for w, s in zip(result.words, labels, strict=True)]
    return DiarizedTranscript(result.text, words, probs, speaker_segments(words))
