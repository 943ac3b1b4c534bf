"""Moshi's text stream: SentencePiece (`tokenizer_spm_32k_3.model`) without the sentencepiece lib.

Decoding reuses `mlx_speech.text.spm`; ids 0 (EPAD) and 3 (PAD) print nothing, as in Kyutai's
and NVIDIA's clients. Encoding (PersonaPlex's role prompt) is unigram Viterbi over the piece
scores with sentencepiece's whitespace rules (dummy prefix, collapsed spaces, "▁"); the model's
NFKC charsmap is approximated by `unicodedata` NFKC, exact for ordinary text.
"""

from __future__ import annotations

import struct
from pathlib import Path

from ..errors import CheckpointError
from .protobuf import fields
from .spm import (
    BYTE,
    CONTROL,
    NORMAL,
    UNKNOWN,
    USER_DEFINED,
    SentencePieceDecoder,
    StreamingDecoder,
    normalize_pieces,
    normalizer_flags,
)

SILENT_TEXT_IDS = (0, 3)  # EPAD, PAD
_UNK_PENALTY = 10.0  # sentencepiece: unknown pieces score min_score - 10


def _read_model(data: bytes):
    pieces: list[tuple[str, float, int]] = []
    for num, wire, val in fields(data):
        if num == 1 and wire == 2:
            piece, score, kind = "", 0.0, NORMAL
            for n, w, v in fields(val):
                if n == 1 and w == 2:
                    piece = v.decode("utf-8")
                elif n == 2 and w == 5:
                    score = struct.unpack("<f", v)[0]
                elif n == 3 and w == 0:
                    kind = v
            pieces.append((piece, score, kind))
    return (pieces, *normalizer_flags(data))


class TextTokenizer:
    """Encode text to ids (unigram Viterbi) and stream-decode ids to text."""

    def __init__(self, data: bytes, name: str = "tokenizer.model"):
        try:
            pieces, self.dummy_prefix, self.collapse = _read_model(data)
            self.decoder = SentencePieceDecoder.from_model_bytes(data, name)
        except (ValueError, IndexError, UnicodeDecodeError) as e:
            raise CheckpointError(f"cannot read tokenizer {name}: {e}") from None
        self.vocab: dict[str, tuple[int, float]] = {}
        self.bytes: dict[int, int] = {}
        self.unk_id = 0
        scores = []
        for i, (p, s, kind) in enumerate(pieces):
            if kind in (NORMAL, USER_DEFINED):
                self.vocab[p] = (i, s)
                scores.append(s)
            elif kind == BYTE:
                self.bytes[int(p[3:5], 16)] = i
            elif kind == UNKNOWN:
                self.unk_id = i
        self.unk_score = (min(scores) if scores else 0.0) - _UNK_PENALTY
        self.max_len = max((len(p) for p in self.vocab), default=1)
        self.kinds = [k for _, _, k in pieces]

    @classmethod
    def from_file(cls, path: str | Path) -> TextTokenizer:
        path = Path(path)
        try:
            data = path.read_bytes()
        except OSError as e:
            raise CheckpointError(f"cannot read tokenizer {path}: {e}") from None
        return cls(data, path.name)

    def __len__(self) -> int:
        return len(self.kinds)

    def normalize(self, text: str) -> str:
        return normalize_pieces(text, True, self.collapse, self.dummy_prefix)

    def encode(self, text: str) -> list[int]:
        s = self.normalize(text)
        n = len(s)
        best = [float("-inf")] * (n + 1)
        back: list[tuple[int, int]] = [(0, -1)] * (n + 1)  # (start, id); id -1 = unknown char
        best[0] = 0.0
        for i in range(n):
            if best[i] == float("-inf"):
                continue
            hit = False
            for j in range(i + 1, min(n, i + self.max_len) + 1):
                entry = self.vocab.get(s[i:j])
                if entry is not None:
                    hit = hit or j == i + 1
                    sc = best[i] + entry[1]
                    if sc > best[j]:
                        best[j], back[j] = sc, (i, entry[0])
            if not hit and best[i] + self.unk_score > best[i + 1]:
                best[i + 1], back[i + 1] = best[i] + self.unk_score, (i, -1)
        out: list[tuple[int, str]] = []
        j = n
        while j > 0:
            i, tid = back[j]
            out.append((tid, s[i:j]))
            j = i
        ids: list[int] = []
        prev_unk = False
        for tid, piece in reversed(out):
            if tid >= 0:
                ids.append(tid)
                prev_unk = False
            elif self.bytes:
                ids.extend(self.bytes[b] for b in piece.encode("utf-8"))
            elif not prev_unk:  # consecutive unknown characters merge into one unk
                ids.append(self.unk_id)
                prev_unk = True
        return ids

    def stream(self) -> TextStream:
        return TextStream(self)


class TextStream:
    """Append-only text for a stream of sampled text ids (EPAD/PAD/control print nothing)."""

    def __init__(self, tok: TextTokenizer):
        self.tok = tok
        self._dec = StreamingDecoder(tok.decoder)

    def add(self, token: int) -> str:
        if token in SILENT_TEXT_IDS or not 0 <= token < len(self.tok):
            return ""
        if self.tok.kinds[token] == CONTROL:
            return ""
        return self._dec.add(token)

    def flush(self) -> str:
        return self._dec.flush()
