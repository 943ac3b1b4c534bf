"""Transcripts as library code, used by the CLI and the server alike: the output formats
(txt, json, srt, vtt), cues from timed words, pauses from the VAD.

Speakers (the library's numbers, 0 first: `mlx_speech.diarize`) are shown here as
"Speaker 1", "Speaker 2", ...: the command line's form (txt, json, srt, vtt and --live), which
the realtime server's events share (docs/diarization.md has every surface's form)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import MlxSpeechError

FORMATS = ("txt", "json", "srt", "vtt")


@dataclass
class Segment:
    start: float
    end: float
    text: str
    speaker: int | None = None  # set only when diarizing (0: the first voice heard)


def speaker_name(speaker: int | None) -> str | None:
    """A speaker number as the command line shows it: 0 -> "Speaker 1"; None stays None."""
    return None if speaker is None else f"Speaker {speaker + 1}"


def _timestamp(seconds: float, sep: str) -> str:
    ms = max(0, int(seconds * 1000 + 0.5))  # half up, not banker's
    h, ms = divmod(ms, 3_600_000)
    m, ms = divmod(ms, 60_000)
    s, ms = divmod(ms, 1000)
    return f"{h:02d}:{m:02d}:{s:02d}{sep}{ms:03d}"


def _cue(s: Segment, sep: str) -> str:
    # blank lines would end the cue early in srt/vtt
    lines = [line.strip() for line in s.text.strip().splitlines() if line.strip()]
    name = speaker_name(s.speaker)
    if name and lines:  # VTT voice tag; SRT has none, so a "Speaker N: " prefix
        lines[0] = f"<v {name}>{lines[0]}" if sep == "." else f"{name}: {lines[0]}"
    times = f"{_timestamp(s.start, sep)} --> {_timestamp(s.end, sep)}"
    return "\n".join([times, *lines]) + "\n"


def format_txt(text: str) -> str:
    return text.strip() + "\n"


def format_turns(turns) -> str:
    """(speaker, text) per speaker turn -> the txt form: a "Speaker N: text" line each."""
    return "\n".join(f"{speaker_name(s)}: {t}" if s is not None else t for s, t in turns)


def format_json(
    text: str, segments: Sequence[Segment], extra: dict[str, Any] | None = None
) -> str:
    data = {
        "text": text.strip(),
        "segments": [
            {"start": round(s.start, 3), "end": round(s.end, 3), "text": s.text.strip(),
             **({"speaker": speaker_name(s.speaker)} if s.speaker is not None else {})}
            for s in segments
        ],
        **(extra or {}),
    }
    return json.dumps(data, ensure_ascii=False, indent=2) + "\n"


def format_srt(segments: Sequence[Segment]) -> str:
    return "\n".join(f"{i}\n{_cue(s, ',')}" for i, s in enumerate(segments, 1))


def format_vtt(segments: Sequence[Segment]) -> str:
    return "\n".join(["WEBVTT\n", *(_cue(s, ".") for s in segments)])


def write_transcript(
    fmt: str,
    text: str,
    segments: Sequence[Segment],
    out: str | Path | None,
    extra: dict[str, Any] | None = None,
) -> str:
    """Format the transcript; write it to `out` when given. Returns the string."""
    if fmt == "txt":
        s = format_txt(text)
    elif fmt == "json":
        s = format_json(text, segments, extra)
    elif fmt == "srt":
        s = format_srt(segments)
    elif fmt == "vtt":
        s = format_vtt(segments)
    else:
        raise MlxSpeechError(
            f"unknown output format {fmt!r}: use txt, json, srt or vtt"
        )
    if out is not None:
        try:
            Path(out).write_text(s, encoding="utf-8")
        except OSError as e:
            raise MlxSpeechError(f"cannot write {out}: {e.strerror or e}") from None
    return s


__all__ = ["FORMATS", "PauseFinder", "Segment", "format_json", "format_srt", "format_turns",
           "format_txt", "format_vtt", "pause_break_steps", "pause_breaks", "segments_from_words",
           "speaker_name", "write_transcript"]


def segments_from_words(words, max_gap: float = 0.8, max_len: float = 10.0, breaks=()):
    """Group words into cues: split after . ? ! or at a pause or a long run, and before the
    first word at or after each of `breaks` (seconds: where the VAD found a pause ending,
    see `pause_breaks`)."""
    segs, cur = [], []
    breaks, b = sorted(breaks), 0
    for w in words:
        crossed = False
        while b < len(breaks) and w.start >= breaks[b]:
            b += 1
            crossed = True
        if cur and (crossed or w.start - cur[-1].end > max_gap
                    or w.end - cur[0].start > max_len):
            segs.append(cur)
            cur = []
        cur.append(w)
        if w.text.endswith((".", "?", "!", "。", "？", "！")):
            segs.append(cur)
            cur = []
    if cur:
        segs.append(cur)
    return [Segment(s[0].start, s[-1].end, " ".join(w.text for w in s)) for s in segs]


class PauseFinder:
    """`pause_breaks` fed a block at a time, so memory stays flat in the clip's length:
    `push(samples)` (16 kHz) runs the VAD over each whole piece of `piece_s` seconds as it
    fills, `finish()` over the rest and returns the breaks (as `pause_breaks` of the whole)."""

    def __init__(self, vad, silence_ms: int = 500, piece_s: float = 16.384):
        import numpy as np

        from .audio.turns import FRAME, TurnConfig, TurnDetector

        self.vad, self.state = vad, vad.make_state(1)
        self.det = TurnDetector(TurnConfig(silence_duration_ms=silence_ms))
        self.piece = int(piece_s * 16000) // FRAME * FRAME
        self._held = np.zeros(0, np.float32)
        self._starts: list[int] = []

    def push(self, samples) -> int:
        """Queue `samples`; returns how many pieces went through the VAD."""
        import numpy as np

        x = np.concatenate([self._held, np.asarray(samples, np.float32)])
        n = len(x) // self.piece
        for i in range(n):
            self._run(x[i * self.piece: (i + 1) * self.piece])
        self._held = x[n * self.piece:]
        return n

    def _run(self, x) -> None:
        import mlx.core as mx
        import numpy as np

        from .audio.turns import SpeechStarted

        probs, self.state = self.vad(mx.array(x[None]), self.state)
        mx.eval(probs, *self.state.arrays())
        self._starts += [e.start for e in self.det.push(np.array(probs[0]))
                         if isinstance(e, SpeechStarted)]

    def finish(self) -> list[float]:
        """The rest (padded to whole VAD frames, as Silero pads), then the breaks: where
        speech resumes after each pause, in seconds (the first turn's start left out)."""
        import numpy as np

        from .audio.turns import FRAME

        if len(self._held):
            self._run(np.pad(self._held, (0, -len(self._held) % FRAME)))
            self._held = self._held[:0]
        return [s / 16000 for s in self._starts[1:]]


def pause_break_steps(vad, audio, silence_ms: int = 500, piece_s: float = 16.384):
    """`pause_breaks` a piece at a time: yields None after each `piece_s` of audio through the
    VAD (so a server's engine can step live streams in between), then the breaks."""
    import numpy as np

    finder = PauseFinder(vad, silence_ms, piece_s)
    x = np.asarray(audio, np.float32)
    for i in range(0, len(x), finder.piece):
        finder.push(x[i: i + finder.piece])
        yield None
    yield finder.finish()


def pause_breaks(vad, audio, silence_ms: int = 500) -> list[float]:
    """Where speech resumes after each pause of `silence_ms` or more in a whole clip (16 kHz),
    in seconds (the turns' starts, prefix padding included; the first turn's left out)."""
    *_, breaks = pause_break_steps(vad, audio, silence_ms)
    return breaks
