"""Speakers in REST transcripts: OpenAI's `response_format=diarized_json` and Mistral's
`diarize=true` (`speaker_id` per segment) on `verbose_json`.

The diarizer (`--diarizer MODEL`, a streaming Sortformer) runs on the engine thread like every
MLX call, as a job advanced one 16 s piece per tick (live streams step in between); its frames
are then aligned to the transcript's words (`mlx_speech.diarize`). Labels: OpenAI's form names
speakers "A", "B", ... by first appearance, as OpenAI does without known speakers; the
verbose_json form uses "speaker_1", "speaker_2", ... (segment `speaker_id`, word `speaker_id`).
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import numpy as np

PIECE = 16 * 16000


def diarizer_steps(diarizer, audio: np.ndarray):
    """A diarizer session over `audio` a piece at a time: yields None per piece, then the
    (frames, n_spk) probabilities."""
    s = diarizer.session()
    parts = []
    for i in range(0, len(audio), PIECE):
        parts.append(s.feed(audio[i: i + PIECE]))
        yield None
    parts.append(s.finish())
    yield np.concatenate(parts)


async def diarize_upload(served, audio: np.ndarray, result, sink_cls) -> object:
    """The upload's diarized transcript (`mlx_speech.diarize.DiarizedTranscript`)."""
    from ..diarize import diarize_result
    from ..transcript import segments_from_words

    q: asyncio.Queue = asyncio.Queue()
    served.engine.open_speech(
        lambda: (SimpleNamespace(samples=x) for x in diarizer_steps(served.diarizer, audio)),
        sink_cls(q, asyncio.get_running_loop()))
    probs = None
    while True:
        ev = await q.get()
        if ev[0] == "audio":
            if ev[1] is not None:
                probs = ev[1]
        elif ev[0] == "done":
            break
        else:
            raise RuntimeError(f"diarization failed: {ev[2]}")

    class _Given:  # the frames are already computed; diarize_result asks for them
        n_speakers = served.diarizer.n_speakers

        @staticmethod
        def probabilities(_audio):
            return probs

    return diarize_result(result, audio, _Given, segments_from_words)


def _letter(label: str | None, names: dict) -> str:
    if label not in names:
        n = len(names)
        names[label] = chr(ord("A") + n) if n < 26 else f"S{n + 1}"
    return names[label]


def diarized_json(d, seconds: float) -> dict:
    """OpenAI's TranscriptionDiarized."""
    names: dict = {}
    segs = [{"type": "transcript.text.segment", "id": f"seg_{i}",
             "start": round(s.start, 3), "end": round(s.end, 3), "text": s.text,
             "speaker": _letter(s.speaker, names)} for i, s in enumerate(d.segments)]
    return {"task": "transcribe", "duration": round(seconds, 3), "text": d.text,
            "segments": segs, "usage": {"type": "duration", "seconds": round(seconds, 3)}}


def _speaker_id(label: str | None) -> str | None:
    return None if label is None else "speaker_" + label.rsplit(" ", 1)[-1]


def speaker_fields(out: dict, d) -> dict:
    """Add `speaker_id` to a verbose_json response built from `d.segments`."""
    for seg, s in zip(out["segments"], d.segments, strict=True):
        seg["speaker_id"] = _speaker_id(s.speaker)
    if "words" in out:
        for w, sw in zip(out["words"], d.words, strict=True):
            w["speaker_id"] = _speaker_id(sw.speaker)
    return out


# -- realtime: a speaker on every completed item ---------------------------------------------

class _Frames:
    """A feed's new frames; truthy only when there are some (the engine emits a "delta" per
    truthy feed result, as it does for text)."""

    def __init__(self, probs: np.ndarray):
        self.probs = probs

    def __bool__(self) -> bool:
        return len(self.probs) > 0


class _Session:
    def __init__(self, inner):
        self.inner = inner

    def result(self):
        return None


class DiarizerOwner:
    """A diarizer behind the engine's transcription-stream interface (`feed_many` /
    `finish_many` / `session()`), so every connection's diarizer stream is stepped by the
    engine, batched with the other connections'."""

    def __init__(self, diarizer):
        self.diarizer = diarizer
        self.sample_rate = diarizer.sample_rate

    def session(self) -> _Session:
        return _Session(self.diarizer.session())

    def feed_many(self, pairs) -> list[_Frames]:
        return [_Frames(p) for p in self.diarizer.feed_many([(s.inner, x) for s, x in pairs])]

    def finish_many(self, sessions) -> list[_Frames]:
        return [_Frames(p) for p in self.diarizer.finish_many([s.inner for s in sessions])]


_OWNERS: dict[int, DiarizerOwner] = {}


def owner_for(diarizer) -> DiarizerOwner:
    o = _OWNERS.get(id(diarizer))
    if o is None or o.diarizer is not diarizer:
        o = _OWNERS[id(diarizer)] = DiarizerOwner(diarizer)
    return o


class ConnectionSpeakers:
    """One realtime connection's speakers: a diarizer stream over all of its 16 kHz audio
    (items and turns alike, one timeline), each item's start on that timeline, and the labels
    ("Speaker 1", ... by first appearance, kept for the whole connection) of each completed
    item's words. Frames lag the audio by the diarizer's chunk latency; an item completed
    before its last frames exist is labelled with the frames there are (words past them take
    the last frame's speaker)."""

    def __init__(self, engine, diarizer, sink):
        from ..diarize import FrameLog, SpeakerTurns

        owner = owner_for(diarizer)
        self.stream = engine.open_asr(owner, owner.session, sink)
        self.log = FrameLog(diarizer.n_speakers)
        self.pushed = 0  # samples on the connection's timeline
        self.base = 0  # where the current TurnStream's sample 0 sits on that timeline
        self.starts: dict[str, int] = {}
        self.turns = SpeakerTurns()

    def push(self, y: np.ndarray) -> None:
        from .engine import BufferFull

        if len(y):
            try:
                self.stream.push(y)
            except BufferFull:  # the diarizer is far behind: its frames end earlier
                pass
            self.pushed += len(y)

    def event(self, ev) -> None:
        if ev[0] in ("delta", "done") and ev[1]:
            self.log.add(ev[1].probs)

    @property
    def probs(self) -> np.ndarray:
        return self.log.frames

    def start_item(self, item: str, at: int | None = None) -> None:
        """`item` starts now (client commits) or at TurnStream sample `at` (VAD turns)."""
        self.starts[item] = self.pushed if at is None else self.base + at

    def fields(self, item: str, result) -> dict:
        """`speaker` for a completed item (its words' most common label) and, when its words
        hold several speakers, `speaker_segments` [{speaker, start, end, text}] in seconds
        on the item's own clock."""
        from ..models.asr import Word

        off = self.starts.pop(item, self.pushed) / 16000
        words = list(getattr(result, "words", None) or [])
        if not words or not len(self.probs):
            return {"speaker": self.turns.last}
        shifted = [Word(w.text, w.start + off, w.end + off) for w in words]
        labels = self.turns.label(shifted, self.probs)
        counts: dict = {}
        for lab in labels:
            counts[lab] = counts.get(lab, 0) + 1
        out = {"speaker": max(counts, key=lambda k: (counts[k], -labels.index(k)))}
        if len(counts) > 1:
            segs = []
            for w, lab in zip(words, labels, strict=True):
                if segs and segs[-1]["speaker"] == lab:
                    segs[-1]["end"], segs[-1]["text"] = w.end, segs[-1]["text"] + " " + w.text
                else:
                    segs.append({"speaker": lab, "start": w.start, "end": w.end, "text": w.text})
            out["speaker_segments"] = [dict(s, start=round(s["start"], 3),
                                            end=round(s["end"], 3)) for s in segs]
        return out

    def close(self) -> None:
        self.stream.close()
