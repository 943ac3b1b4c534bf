"""Partial text while you speak: committed words, the word still forming, and a short view.

Streaming sessions return text deltas that are never retracted; a word is committed once a
space follows it (the last piece may still grow: "trans" -> "transcript"). The menu bar shows
the tail of the text, cut at a word boundary.
"""

from __future__ import annotations


class Committer:
    def __init__(self) -> None:
        self.text = ""

    def add(self, delta: str) -> bool:
        """Append a delta; True when the visible text changed."""
        if not delta:
            return False
        if not self.text:
            delta = delta.lstrip()
        self.text += delta
        return bool(delta)

    @property
    def committed(self) -> str:
        """Whole words only (everything up to the last space)."""
        i = self.text.rfind(" ")
        return self.text[:i].strip() if i >= 0 else ""

    @property
    def forming(self) -> str:
        i = self.text.rfind(" ")
        return self.text[i + 1:] if i >= 0 else self.text

    def tail(self, width: int = 32) -> str:
        """The last `width` characters, starting at a word when cut: "…end of the text".
        Looks at the end of the text only: its cost does not grow with the dictation."""
        t = " ".join(self.text[-4 * width:].split())
        if len(t) <= width:
            return t
        start = len(t) - width + 1
        cut = t[start:]
        sp = cut.find(" ")
        if t[start - 1] != " " and 0 <= sp < len(cut) - 1:  # cut inside a word: drop it
            cut = cut[sp + 1:]
        return "\u2026" + cut
