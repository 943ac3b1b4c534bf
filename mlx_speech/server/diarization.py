"""Speakers on the server: REST transcripts (OpenAI's `response_format=diarized_json`,
Mistral's `diarize=true` on verbose_json) and realtime items (a connection's `Speakers`).

The diarizer (`--diarizer MODEL`, a streaming Sortformer) runs on the engine thread like every
MLX call, as a diarizer stream (`jobs.DiarizerStream`) batched with every other of its model
(an upload's is fed the same decoded blocks as its transcription, server/uploads.py); its
frames are then aligned to the transcript's words (`mlx_speech.diarize`). The library
numbers speakers 0, 1, ... by first appearance; each protocol's form is made here, at its edge
(the table: docs/diarization.md): OpenAI's diarized_json "A", "B", ... (as OpenAI names
speakers without known ones), verbose_json's `speaker_id` "speaker_1", "speaker_2", ..., the
realtime events' `speaker` "Speaker 1", ... (the command line's form).
"""

from __future__ import annotations

import numpy as np

from ..diarize import FrameLog, SpeakerTurns, main_speaker, speaker_runs
from ..transcript import speaker_name
from .jobs import BufferFull, DiarizerStream


def _letter(speaker: int | None) -> str:
    """OpenAI's form: "A", "B", ... (a transcript where nobody was heard: all "A")."""
    n = speaker or 0
    return chr(ord("A") + n) if n < 26 else f"S{n + 1}"


def diarized_json(d, seconds: float) -> dict:
    """OpenAI's TranscriptionDiarized."""
    segs = [{"type": "transcript.text.segment", "id": f"seg_{i}",
             "start": round(s.start, 3), "end": round(s.end, 3), "text": s.text,
             "speaker": _letter(s.speaker)} for i, s in enumerate(d.segments)]
    return {"task": "transcribe", "duration": round(seconds, 3), "text": d.text,
            "segments": segs, "usage": {"type": "duration", "seconds": round(seconds, 3)}}


def _speaker_id(speaker: int | None) -> str | None:
    """Mistral's verbose_json form: "speaker_1", ..."""
    return None if speaker is None else f"speaker_{speaker + 1}"


def speaker_fields(out: dict, d) -> dict:
    """Add `speaker_id` to a verbose_json response built from `d.segments`."""
    for seg, s in zip(out["segments"], d.segments, strict=True):
        seg["speaker_id"] = _speaker_id(s.speaker)
    if "words" in out:
        for w, sw in zip(out["words"], d.words, strict=True):
            w["speaker_id"] = _speaker_id(sw.speaker)
    return out


# -- realtime: a speaker on every completed item ---------------------------------------------

class Speakers:
    """A realtime connection's speakers, as the dialects use them: every sample the
    connection's items and turns take goes through `push` (one timeline), `start_item` marks
    where an item starts on it, `fields` labels a completed item. This one is the connection
    without a diarizer: no work, no fields."""

    on = False

    def push(self, samples: np.ndarray) -> None: ...

    def event(self, ev) -> None: ...

    def start_turns(self) -> None: ...

    def start_item(self, item: str, at: int | None = None) -> None: ...

    def fields(self, item: str, result) -> dict:
        return {}

    def close(self) -> None: ...


NO_SPEAKERS = Speakers()


class ConnectionSpeakers(Speakers):
    """A connection with `diarize: true`: a diarizer stream over all of its 16 kHz audio (its
    events, tagged "speakers", come back through the connection's queue to `event`), each
    item's start on that timeline, and the speakers of each completed item's words, numbered
    by first appearance over the whole connection. Frames lag the audio by the diarizer's
    chunk latency; an item completed before its last frames exist is labelled with the frames
    there are (words past them take the last frame's speaker)."""

    on = True

    def __init__(self, engine, diarizer, sink):
        self.stream = engine.submit(DiarizerStream(diarizer, sink))
        self.log = FrameLog(diarizer.n_speakers)
        self.pushed = 0  # samples on the connection's timeline
        self.base = 0  # where the current TurnStream's sample 0 sits on that timeline
        self.starts: dict[str, int] = {}
        self.turns = SpeakerTurns()

    def push(self, samples: np.ndarray) -> None:
        if len(samples):
            try:
                self.stream.push(samples)
            except BufferFull:  # the diarizer is far behind: its frames end earlier
                pass
            self.pushed += len(samples)

    def event(self, ev) -> None:
        if ev[0] == "frames":
            self.log.add(ev[1])

    def start_turns(self) -> None:
        """A TurnStream starts now: its sample positions count from here."""
        self.base = self.pushed

    def start_item(self, item: str, at: int | None = None) -> None:
        """`item` starts now (client commits) or at TurnStream sample `at` (VAD turns)."""
        self.starts[item] = self.pushed if at is None else self.base + at

    def fields(self, item: str, result) -> dict:
        """`speaker` for a completed item (its words' most common speaker) and, when its words
        hold several speakers, `speaker_segments` [{speaker, start, end, text}] in seconds
        on the item's own clock."""
        from ..models.asr import Word

        off = self.starts.pop(item, self.pushed) / 16000
        words = result.words
        probs = self.log.frames
        if not words or not len(probs):
            return {"speaker": speaker_name(self.turns.last)}
        labels = self.turns.label([Word(w.text, w.start + off, w.end + off) for w in words],
                                  probs)
        out = {"speaker": speaker_name(main_speaker(labels))}
        runs = speaker_runs(list(zip(words, labels, strict=True)), lambda wl: wl[1])
        if len(runs) > 1:
            out["speaker_segments"] = [
                {"speaker": speaker_name(who), "start": round(run[0][0].start, 3),
                 "end": round(run[-1][0].end, 3), "text": " ".join(w.text for w, _ in run)}
                for who, run in runs]
        return out

    def close(self) -> None:
        self.stream.close()
