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
    from ..transcribe import segments_from_words

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


def verbose_segments(d) -> list:
    """writers.Segment cues with speakers, for verbose_json (each gets `speaker_id`)."""
    return d.segments


def speaker_fields(out: dict, d) -> dict:
    """Add `speaker_id` to a verbose_json response built from `verbose_segments(d)`."""
    for seg, s in zip(out["segments"], d.segments, strict=True):
        seg["speaker_id"] = _speaker_id(s.speaker)
    if "words" in out:
        for w, sw in zip(out["words"], d.words, strict=True):
            w["speaker_id"] = _speaker_id(sw.speaker)
    return out
