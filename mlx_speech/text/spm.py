"""SentencePiece detokenisation without sentencepiece: tokenizer.model or tokenizer.json.

Only decoding (ids -> text) is needed for ASR. Pieces use U+2581 for spaces;
byte-fallback pieces `<0xNN>` carry raw UTF-8 bytes; unknown pieces render as
" ⁇ " (as sentencepiece's decode_ids, which NeMo uses); control pieces and ids
past the vocabulary (e.g. an RNN-T blank) render as nothing.
"""

from __future__ import annotations

import json
import re
import struct
import unicodedata
from pathlib import Path

from ..errors import CheckpointError, MlxSpeechError
from .protobuf import fields as _fields
from .spm_encode import SentencePieceEncoder

SPACE = "\u2581"


def normalize_pieces(text: str, nfkc: bool, collapse: bool, dummy_prefix: bool) -> str:
    """SentencePiece's input normalization: NFKC (its nmt_nfkc rules' Unicode part),
    whitespace collapsed, the dummy prefix space, spaces as U+2581."""
    if nfkc:
        text = unicodedata.normalize("NFKC", text)
    if collapse:
        text = " ".join(text.split())
    if dummy_prefix and text:
        text = " " + text
    return text.replace(" ", SPACE)
_BYTE = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
UNKNOWN_SURFACE = " \u2047 "


def _pieces_from_model(data: bytes) -> tuple[list[tuple[str, int]], list[float]]:
    pieces, scores = [], []
    for num, wire, val in _fields(data):
        if num == 1 and wire == 2:  # ModelProto.pieces
            piece, kind, score = "", NORMAL, 0.0
            for n, w, v in _fields(val):
                if n == 1 and w == 2:
                    piece = v.decode("utf-8")
                elif n == 3 and w == 0:
                    kind = v
                elif n == 2 and w == 5:
                    score = struct.unpack("<f", v)[0]  # only encoding (hotwords) uses it
            pieces.append((piece, kind))
            scores.append(score)
    return pieces, scores


def _model_type(data: bytes) -> str:
    """TrainerSpec.model_type: unigram (the default) or bpe (word / char: as unigram)."""
    for num, wire, val in _fields(data):
        if num == 2 and wire == 2:
            for n, w, v in _fields(val):
                if n == 3 and w == 0:
                    return "bpe" if v == 2 else "unigram"
    return "unigram"


def _normalizer_name(data: bytes) -> str:
    for num, wire, val in _fields(data):
        if num == 3 and wire == 2:
            for n, w, v in _fields(val):
                if n == 1 and w == 2:
                    return v.decode("utf-8")
    return "nmt_nfkc"


def normalizer_flags(data: bytes) -> tuple[bool, bool]:
    """NormalizerSpec (add_dummy_prefix, remove_extra_whitespaces) of a .model file,
    both on by default."""
    dummy_prefix = collapse = True
    for num, wire, val in _fields(data):
        if num == 3 and wire == 2:  # ModelProto.normalizer_spec
            for n, w, v in _fields(val):
                if n == 3 and w == 0:
                    dummy_prefix = bool(v)
                elif n == 4 and w == 0:
                    collapse = bool(v)
    return dummy_prefix, collapse


def _unk_surface(data: bytes) -> str:
    for num, wire, val in _fields(data):
        if num == 2 and wire == 2:  # ModelProto.trainer_spec
            for n, w, v in _fields(val):
                if n == 44 and w == 2:  # TrainerSpec.unk_surface
                    return v.decode("utf-8")
    return UNKNOWN_SURFACE


def _read_model_proto(data: bytes) -> dict:
    dummy_prefix, collapse = normalizer_flags(data)
    pieces, scores = _pieces_from_model(data)
    return {"pieces": pieces, "dummy_prefix": dummy_prefix,
            "collapse": collapse, "unk_surface": _unk_surface(data),
            "encoding": {"scores": scores, "type": _model_type(data),
                         "normalizer": _normalizer_name(data)}}


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


def _encoding_from_json(tj: dict) -> dict | None:
    model = tj.get("model") or {}
    if model.get("type") == "Unigram" and isinstance(model.get("vocab"), list):
        return {"scores": [float(p[1]) for p in model["vocab"]], "type": "unigram",
                "normalizer": "identity"}
    if model.get("type") == "BPE" and model.get("merges"):
        merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
        return {"merges": merges, "type": "bpe", "normalizer": "identity"}
    return None


class SentencePieceDecoder:
    """ids -> text exactly as sentencepiece's `decode` (see StreamingDecoder).

    `dummy_prefix` / `collapse`: the model normalizer's add_dummy_prefix and
    remove_extra_whitespaces, which decide how leading spaces are dropped.
    """

    def __init__(self, pieces: list[tuple[str, int]], *, dummy_prefix: bool = True,
                 collapse: bool = False, unk_surface: str = UNKNOWN_SURFACE,
                 encoding: dict | None = None):
        self.pieces = pieces
        self.encoding = encoding  # what `encode` needs: scores / merges, model type
        self.dummy_prefix, self.collapse = dummy_prefix, collapse
        self.unk_surface = unk_surface
        self._encoder: SentencePieceEncoder | None = None  # built by the first `encode`
        self._bytes: list[bytes] = []
        for p, kind in pieces:
            if kind == BYTE and _BYTE.match(p):
                self._bytes.append(bytes([int(_BYTE.match(p).group(1), 16)]))
            elif kind == UNKNOWN:
                self._bytes.append(unk_surface.encode())
            elif kind in (NORMAL, USER_DEFINED, UNUSED):
                self._bytes.append(p.replace(SPACE, " ").encode("utf-8"))
            else:
                self._bytes.append(b"")

    @classmethod
    def from_file(cls, path: str | Path) -> SentencePieceDecoder:
        path = Path(path)
        try:
            if path.suffix == ".json":
                tj = json.loads(path.read_text(encoding="utf-8"))
                return cls(_pieces_from_json(tj), encoding=_encoding_from_json(tj))
            return cls(**_read_model_proto(path.read_bytes()))
        except (OSError, ValueError, KeyError, IndexError, UnicodeDecodeError) as e:
            raise CheckpointError(f"cannot read tokenizer {path}: {e}") from None

    @classmethod
    def from_model_bytes(cls, data: bytes, name: str = "tokenizer.model") -> SentencePieceDecoder:
        try:
            return cls(**_read_model_proto(data))
        except (ValueError, IndexError, UnicodeDecodeError) as e:
            raise CheckpointError(f"cannot read tokenizer {name}: {e}") from None

    def __len__(self) -> int:
        return len(self.pieces)

    def kind(self, i: int) -> int:
        """The piece type of id `i` (CONTROL for ids past the vocabulary, e.g. a blank)."""
        return self.pieces[i][1] if 0 <= i < len(self.pieces) else CONTROL

    def token_bytes(self, i: int) -> bytes:
        return self._bytes[i] if 0 <= i < len(self._bytes) else b""

    def hide(self, ids) -> None:
        """Make pieces `ids` control pieces: they print nothing (a model's markup, such as a
        language tag, that must never reach text)."""
        for i in ids:
            self.pieces[i] = (self.pieces[i][0], CONTROL)
            self._bytes[i] = b""
        self._encoder = None  # encoding no longer yields them

    def is_unknown(self, i: int) -> bool:
        return self.kind(i) == UNKNOWN

    def is_special(self, i: int) -> bool:
        """A control piece (or an id past the vocabulary, e.g. a blank): it prints nothing."""
        return self.kind(i) == CONTROL

    def encode(self, text: str) -> list[int]:
        """text -> ids as sentencepiece's `encode` (used for hotwords; see spm_encode)."""
        if self._encoder is None:
            self._encoder = self._make_encoder()
        return self._encoder.encode(text)

    def _make_encoder(self) -> SentencePieceEncoder:
        enc = self.encoding
        if enc is None:
            raise MlxSpeechError("this tokenizer file has no scores or merges: it cannot "
                                 "encode text (hotwords need tokenizer.model or a BPE/Unigram "
                                 "tokenizer.json)")
        ids, byte_ids, unk = {}, {}, None
        for i, (p, kind) in enumerate(self.pieces):
            if kind in (NORMAL, USER_DEFINED):
                ids.setdefault(p, i)
            elif kind == BYTE:
                byte_ids[self.token_bytes(i)[0]] = i
            elif kind == UNKNOWN and unk is None:
                unk = i
        nfkc = enc.get("normalizer", "identity") != "identity"
        return SentencePieceEncoder(ids, byte_ids, unk, enc, lambda text: normalize_pieces(
            text, nfkc, self.collapse, self.dummy_prefix))

    def decode(self, ids: list[int]) -> str:
        s = StreamingDecoder(self)
        return "".join(s.add(i) for i in ids) + s.flush()


def _utf8_prefix(data: bytes, final: bool) -> tuple[str, bytes]:
    """Decode like sentencepiece: each byte that does not start a well-formed UTF-8
    character becomes one U+FFFD. Unless `final`, a trailing incomplete character is
    returned undecoded (more bytes may complete it)."""
    out, i, n = [], 0, len(data)
    while i < n:
        c = data[i]
        need = 1 if c < 0x80 else 2 if 0xC2 <= c < 0xE0 else 3 if 0xE0 <= c < 0xF0 \
            else 4 if 0xF0 <= c < 0xF5 else 0
        if need == 1:
            out.append(chr(c))
            i += 1
            continue
        if need and i + need <= n:
            try:
                out.append(data[i:i + need].decode("utf-8"))  # strict: overlong, surrogates
                i += need
                continue
            except UnicodeDecodeError:
                pass
        elif need and not final:
            try:  # a valid start of a character cut short: hold it back
                data[i:].decode("utf-8", "strict")
            except UnicodeDecodeError as e:
                if e.reason == "unexpected end of data":
                    return "".join(out), data[i:]
        out.append("\ufffd")
        i += 1
    return "".join(out), b""


class StreamingDecoder:
    """Append-only text deltas, equal in sum to sentencepiece's decode.

    sentencepiece's rules: control pieces (and here ids past the vocabulary)
    print nothing; unknown pieces print the unknown surface (" \u2047 "); runs of
    byte pieces are UTF-8, each stray byte becoming U+FFFD. Leading spaces: while
    nothing has been printed, a piece loses one leading U+2581 (the dummy prefix);
    with remove_extra_whitespaces every such piece does, else only the first.
    """

    def __init__(self, spm: SentencePieceDecoder):
        self.spm = spm
        self._pending = b""  # byte pieces of a character not complete yet
        self._printed = False
        self._bos = spm.dummy_prefix or spm.collapse  # a leading U+2581 is still dropped
        self._dropped = False  # the previous piece had its leading U+2581 dropped

    def add(self, i: int) -> str:
        kind = self.spm.kind(i)
        b = self.spm.token_bytes(i)
        if kind == BYTE:
            text, self._pending = _utf8_prefix(self._pending + b, False)
            self._printed = self._printed or bool(text)
            return text
        out = self.flush()
        if self._dropped or self._printed:
            self._bos = False
        self._dropped = False
        if kind not in (CONTROL, UNKNOWN) and self._bos and b.startswith(b" "):
            b = b[1:]
            self._dropped = not self.spm.collapse
        text = b.decode("utf-8")
        self._printed = self._printed or bool(text)
        return out + text

    def flush(self) -> str:
        text, self._pending = _utf8_prefix(self._pending, True)
        self._printed = self._printed or bool(text)
        return text
