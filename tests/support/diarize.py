"""Shared by the diarization tests: the 3-voice clip's words, placed from its script."""

from __future__ import annotations

from mlx_speech.models.asr import Word


def script_words(meta) -> list[Word]:
    """Each utterance's words spread evenly over its span."""
    out = []
    for u in meta:
        toks = u["text"].split()
        step = (u["end"] - u["start"]) / len(toks)
        out += [Word(t, round(u["start"] + i * step, 3), round(u["start"] + (i + 1) * step, 3))
                for i, t in enumerate(toks)]
    return sorted(out, key=lambda w: w.start)
