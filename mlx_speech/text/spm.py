"""SentencePiece detokenisation without sentencepiece: tokenizer.model or tokenizer.json.

Only decoding (ids -> text) is needed for ASR. Pieces use U+2581 for spaces;
byte-fallback pieces `<0xNN>` carry raw UTF-8 bytes; unknown pieces render as
" ⁇ " (as sentencepiece's decode_ids, which NeMo uses); control pieces and ids
past the vocabulary (e.g. an RNN-T blank) render as nothing.
"""

from __future__ import annotations

import codecs
import json
import re
import struct
from pathlib import Path

from ..errors import CheckpointError

SPACE = "\u2581"
_BYTE = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    out = shift = 0
    while True:
        b = buf[i]
        i += 1
        out |= (b & 0x7F) << shift
        if not b & 0x80:
            return out, i
        shift += 7


def _fields(buf: bytes):
    """(field number, wire type, value) of one protobuf message, top level only."""
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        num, wire = key >> 3, key & 7
        if wire == 0:
            val, i = _varint(buf, i)
        elif wire == 1:
            val, i = buf[i: i + 8], i + 8
        elif wire == 2:
            n, i = _varint(buf, i)
            val, i = buf[i: i + n], i + n
        elif wire == 5:
            val, i = buf[i: i + 4], i + 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        yield num, wire, val


def _pieces_from_model(data: bytes) -> list[tuple[str, int]]:
    pieces = []
    for num, wire, val in _fields(data):
        if num == 1 and wire == 2:  # ModelProto.pieces
            piece, kind = "", NORMAL
            for n, w, v in _fields(val):
                if n == 1 and w == 2:
                    piece = v.decode("utf-8")
                elif n == 3 and w == 0:
                    kind = v
                elif n == 2 and w == 5:
                    struct.unpack("<f", v)  # score: unused for decoding
            pieces.append((piece, kind))
    return pieces


def _pieces_from_json(tj: dict) -> list[tuple[str, int]]:
    model = tj.get("model") or {}
    vocab = model.get("vocab")
    if isinstance(vocab, dict):  # BPE: piece -> id
        table = {i: (p, NORMAL) for p, i in vocab.items()}
    elif isinstance(vocab, list):  # Unigram: [piece, score] in id order
        table = {i: (p[0], NORMAL) for i, p in enumerate(vocab)}
    else:
        raise ValueError("tokenizer.json has no model.vocab")
    for t in tj.get("added_tokens", []):
        table[t["id"]] = (t["content"], CONTROL if t.get("special") else USER_DEFINED)
    unk = model.get("unk_token")
    out = []
    for i in range(max(table) + 1 if table else 0):
        p, kind = table.get(i, ("", UNUSED))
        if p == unk:
            kind = UNKNOWN
        elif kind == NORMAL and _BYTE.match(p):
            kind = BYTE
        out.append((p, kind))
    return out


class SentencePieceDecoder:
    def __init__(self, pieces: list[tuple[str, int]]):
        self.pieces = pieces
        self._bytes: list[bytes] = []
        for p, kind in pieces:
            if kind == BYTE and _BYTE.match(p):
                self._bytes.append(bytes([int(_BYTE.match(p).group(1), 16)]))
            elif kind == UNKNOWN:
                self._bytes.append(" \u2047 ".encode())
            elif kind in (NORMAL, USER_DEFINED):
                self._bytes.append(p.replace(SPACE, " ").encode("utf-8"))
            else:
                self._bytes.append(b"")

    @classmethod
    def from_file(cls, path: str | Path) -> SentencePieceDecoder:
        path = Path(path)
        try:
            if path.suffix == ".json":
                return cls(_pieces_from_json(json.loads(path.read_text(encoding="utf-8"))))
            return cls(_pieces_from_model(path.read_bytes()))
        except (OSError, ValueError, KeyError, IndexError, UnicodeDecodeError) as e:
            raise CheckpointError(f"cannot read tokenizer {path}: {e}") from None

    @classmethod
    def from_model_bytes(cls, data: bytes, name: str = "tokenizer.model") -> SentencePieceDecoder:
        try:
            return cls(_pieces_from_model(data))
        except (ValueError, IndexError, UnicodeDecodeError) as e:
            raise CheckpointError(f"cannot read tokenizer {name}: {e}") from None

    def __len__(self) -> int:
        return len(self.pieces)

    def token_bytes(self, i: int) -> bytes:
        return self._bytes[i] if 0 <= i < len(self._bytes) else b""

    def is_unknown(self, i: int) -> bool:
        return 0 <= i < len(self.pieces) and self.pieces[i][1] == UNKNOWN

    def decode(self, ids: list[int]) -> str:
        s = StreamingDecoder(self)
        return "".join(s.add(i) for i in ids) + s.flush()


class StreamingDecoder:
    """Append-only text deltas, equal in sum to sentencepiece's decode.

    Like sentencepiece, spaces are dropped until the first visible text (the
    dummy prefix); an unknown piece ends that state as it is.
    """

    def __init__(self, spm: SentencePieceDecoder):
        self.spm = spm
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")
        self._started = False

    def add(self, i: int) -> str:
        b = self.spm.token_bytes(i)
        if not self._started:
            if not self.spm.is_unknown(i):
                b = b.lstrip(b" ")
            self._started = bool(b)
        return self._utf8.decode(b)

    def flush(self) -> str:
        return self._utf8.decode(b"", final=True)
