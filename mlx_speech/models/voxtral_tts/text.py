"""Text clean-up for Voxtral TTS prompts, and sentence chunking for long texts.

`normalize`: drop invisible characters (zero-width space, bidi marks, soft
hyphen, BOM, ...; ZWJ/ZWNJ kept, as in mlx-audio), turn every whitespace run
(line breaks included) into one space, and end the text with "." unless it
already ends in sentence punctuation (possibly followed by closing quotes or
brackets). Raises MlxSpeechError on empty text or text without a letter or digit.
"""

from __future__ import annotations

import re
import unicodedata

from ...errors import MlxSpeechError

_INVISIBLE = re.compile("[\u200b\u200e\u200f\u2028\u2029\u2060-\u2064\u00ad\u180e\ufeff"
                        "\ufff9-\ufffb]")
_TERMINAL = ".!?\u2026\u061f\u3002\uff01\uff1f"
_CLOSERS = "\"')]}\u201d\u2019\u00bb"
_SENTENCE_END = re.compile(r"(?<=[.!?\u2026\u061f\u3002\uff01\uff1f])[\"')\]}\u201d\u2019\u00bb]*"
                           r"\s+")


def _speakable(text: str) -> bool:
    return any(unicodedata.category(ch)[0] in "LN" for ch in text)


def normalize(text: str) -> str:
    if not isinstance(text, str):
        raise MlxSpeechError(f"text must be a string, not {type(text).__name__}")
    text = " ".join(_INVISIBLE.sub("", text).split())
    if not text:
        raise MlxSpeechError("text is empty: nothing to say")
    if not _speakable(text):
        raise MlxSpeechError(f"text {text[:40]!r} has no letters or digits to speak")
    if not text.rstrip(_CLOSERS).endswith(tuple(_TERMINAL)):
        text += "."
    return text


def split_sentences(text: str, max_chars: int = 400) -> list[str]:
    """Normalised chunks of whole sentences, each at most `max_chars` where possible."""
    text = normalize(text)
    sentences = [s for s in re.split(_SENTENCE_END, text) if s.strip()]
    pieces: list[str] = []
    for s in sentences:  # a sentence longer than max_chars is cut at spaces
        while len(s) > max_chars:
            cut = s.rfind(" ", 0, max_chars)
            cut = cut if cut > 0 else max_chars
            pieces.append(s[:cut])
            s = s[cut:].strip()
        pieces.append(s)
    chunks: list[str] = []
    for p in pieces:
        if chunks and len(chunks[-1]) + 1 + len(p) <= max_chars:
            chunks[-1] += " " + p
        else:
            chunks.append(p)
    return [normalize(c) for c in chunks if _speakable(c)]
