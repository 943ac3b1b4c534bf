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


# -- text that arrives in pieces ---------------------------------------------------------------
CLAUSE_WORDS = 12  # a clause boundary cuts a segment that has this many words
SEGMENT_CHARS = 400  # longest segment: cut at the last space before it
_CLAUSE = ",;:\u2014\u2013\uff0c\uff1b\uff1a"
_WIDE = "\u3002\uff01\uff1f\uff0c\uff1b\uff1a"  # CJK marks end without a following space
_CANDIDATE = re.compile(f"[{re.escape(_TERMINAL + _CLAUSE)}][{re.escape(_CLOSERS)}]*"
                        r"|\n[^\S\n]*\n")


def _boundary(buf: str, clause_words: int | None, max_chars: int) -> int | None:
    """Where the first segment of `buf` ends (`buf[:cut]`), or None while the text so far
    cannot tell. A segment ends after sentence punctuation (and closing quotes or brackets)
    followed by a space (CJK marks: by anything), at a clause mark (, ; : dashes) once the
    segment has `clause_words` words, at a blank line, or, with none of those within
    `max_chars`, at the last space before `max_chars` (else at `max_chars`).

    The answer for a prefix never changes as text is appended, so a text sent in any pieces
    is cut at the same places."""
    for m in _CANDIDATE.finditer(buf):
        if m.group().startswith("\n"):
            if m.start() > max_chars:
                break
            if buf[: m.start()].strip():
                return m.start()
            continue
        end = m.end()
        if end > max_chars:
            break
        if end == len(buf):
            return None  # what follows decides
        mark = m.group()[0]
        if not (mark in _WIDE or buf[end].isspace()):
            continue
        if mark in _TERMINAL or (clause_words and len(buf[:end].split()) >= clause_words):
            return end
    if len(buf) <= max_chars:
        return None
    cut = max(buf.rfind(c, 0, max_chars + 1) for c in " \t\n")
    return cut if cut > 0 else max_chars


def speakable_segment(raw: str) -> str | None:
    """A segment as spoken: invisible characters dropped, whitespace runs made one space, "."
    added unless it ends in sentence or clause punctuation; None when it has nothing to say."""
    text = " ".join(_INVISIBLE.sub("", raw).split())
    if not text or not _speakable(text):
        return None
    if not text.rstrip(_CLOSERS).endswith(tuple(_TERMINAL + _CLAUSE)):
        text += "."
    return text


class Segmenter:
    """Cuts text that arrives in pieces (an LLM's reply, a pipe) into segments to speak as
    soon as each is complete (see `_boundary`), at the same places whatever the pieces."""

    def __init__(self, clause_words: int | None = CLAUSE_WORDS, max_chars: int = SEGMENT_CHARS):
        if clause_words is not None and (not isinstance(clause_words, int) or clause_words < 1):
            raise MlxSpeechError(f"clause_words must be a positive number of words or None, "
                                 f"not {clause_words!r}")
        if not isinstance(max_chars, int) or max_chars < 16:
            raise MlxSpeechError(f"max_chars must be at least 16, not {max_chars!r}")
        self.clause_words, self.max_chars = clause_words, max_chars
        self.buf = ""

    def feed(self, text: str) -> list[str]:
        """Add a piece; returns the segments it completed (speakable ones, in order)."""
        if not isinstance(text, str):
            raise MlxSpeechError(f"text pieces must be strings, not {type(text).__name__}")
        self.buf = (self.buf + text).lstrip()
        out = []
        while (cut := _boundary(self.buf, self.clause_words, self.max_chars)) is not None:
            out.append(self.buf[:cut])
            self.buf = self.buf[cut:].lstrip()
        return [s for raw in out if (s := speakable_segment(raw)) is not None]

    def finish(self) -> list[str]:
        """End of text: the rest is the last segment."""
        rest, self.buf = self.buf, ""
        s = speakable_segment(rest)
        return [] if s is None else [s]


def segments(text: str, clause_words: int | None = CLAUSE_WORDS,
             max_chars: int = SEGMENT_CHARS) -> list[str]:
    """The segments of a whole text, as `Segmenter` cuts it sent in any pieces."""
    seg = Segmenter(clause_words, max_chars)
    return seg.feed(text) + seg.finish()
