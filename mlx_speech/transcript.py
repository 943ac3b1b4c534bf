"""Transcripts as library code: cues from timed words, pauses from the VAD, and the output
formats (`mlx_speech.writers`). The CLI and the server both use these."""

from __future__ import annotations

from .writers import (
    FORMATS,
    Segment,
    format_json,
    format_srt,
    format_turns,
    format_txt,
    format_vtt,
    speaker_name,
    write_transcript,
)

__all__ = ["FORMATS", "Segment", "format_json", "format_srt", "format_turns", "format_txt",
           "format_vtt", "pause_break_steps", "pause_breaks", "segments_from_words",
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


def pause_break_steps(vad, audio, silence_ms: int = 500, piece_s: float = 16.384):
    """`pause_breaks` a piece at a time: yields None after each `piece_s` of audio through the
    VAD (so a server's engine can step live streams in between), then the breaks."""
    import mlx.core as mx
    import numpy as np

    from .audio.turns import FRAME, SpeechStarted, TurnConfig, TurnDetector

    det, state = TurnDetector(TurnConfig(silence_duration_ms=silence_ms)), vad.make_state(1)
    x = np.pad(np.asarray(audio, np.float32), (0, -len(audio) % FRAME))  # as Silero pads
    starts, step = [], int(piece_s * 16000) // FRAME * FRAME
    for i in range(0, len(x), step):
        probs, state = vad(mx.array(x[None, i:i + step]), state)
        mx.eval(probs, *state.arrays())
        starts += [e.start for e in det.push(np.array(probs[0])) if isinstance(e, SpeechStarted)]
        yield None
    yield [s / 16000 for s in starts[1:]]


def pause_breaks(vad, audio, silence_ms: int = 500) -> list[float]:
    """Where speech resumes after each pause of `silence_ms` or more in a whole clip (16 kHz),
    in seconds (the turns' starts, prefix padding included; the first turn's left out)."""
    *_, breaks = pause_break_steps(vad, audio, silence_ms)
    return breaks
