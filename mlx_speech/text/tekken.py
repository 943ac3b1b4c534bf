"""Reader for Mistral's Tekken tokenizer file (tekken.json, mistral_common format).

Ids 0..num_special-1 are special tokens; id i >= num_special is the byte-level
BPE token of rank i - num_special, whose bytes are base64 in ``vocab``. Ranks
0..255 are the single bytes, so every text can be encoded and every id decoded.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable
from functools import cached_property
from pathlib import Path
from typing import Any

from mlx_speech.errors import CheckpointError

# The Tekken pre-tokenizer regex, used when a file has no "pattern".
TEKKEN_PATTERN = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _compile(pattern: str):
    """The pre-tokenizer needs Unicode property classes (\\p{L}...): `regex`, never `re`
    (a look-alike pattern would silently change the ids)."""
    try:
        import regex
    except ImportError:
        raise CheckpointError(
            "the Tekken tokenizer needs the regex module: pip install regex") from None
    try:
        return regex.compile(pattern)
    except regex.error as e:
        raise CheckpointError(f"bad Tekken pre-tokenizer pattern ({e})") from None


class Tekken:
    def __init__(
        self,
        vocab: list[bytes],
        specials: list[str],
        pattern: str = TEKKEN_PATTERN,
        audio: dict[str, Any] | None = None,
        name: str = "tekken.json",
    ):
        self._vocab = vocab
        self._specials = specials
        self._special_ids = {s: i for i, s in enumerate(specials)}
        self._pattern = pattern
        self._audio = audio or {}
        self._name = name
        self._cache: dict[bytes, list[int]] = {}

    @classmethod
    def from_folder(cls, folder: Path) -> Tekken:
        """The `tekken.json` of a Voxtral checkpoint folder."""
        path = Path(folder) / "tekken.json"
        if not path.exists():
            raise CheckpointError(f"{folder} has no tekken.json (the Voxtral tokenizer)")
        return cls.from_file(path)

    @classmethod
    def from_file(cls, path: str | Path) -> Tekken:
        path = Path(path)
        if not path.is_file():
            raise CheckpointError(f"tokenizer file not found: {path}")
        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise CheckpointError(f"cannot read tokenizer {path}: {e}") from None
        try:
            return cls._from_data(data, str(path))
        except (KeyError, TypeError, ValueError, IndexError) as e:
            raise CheckpointError(
                f"{path} is not a Tekken tokenizer file ({type(e).__name__}: {e})"
            ) from None

    @classmethod
    def _from_data(cls, data: dict, name: str) -> Tekken:
        config = data["config"]
        num_special = int(config["default_num_special_tokens"])
        inner = int(config["default_vocab_size"]) - num_special
        entries = data["vocab"]
        if inner < 0 or len(entries) < inner:
            raise ValueError(
                f"default_vocab_size {config['default_vocab_size']} needs "
                f"{inner} vocab entries, file has {len(entries)}"
            )
        vocab = []
        for i, e in enumerate(entries[:inner]):
            if int(e["rank"]) != i:
                raise ValueError(f"vocab entry {i} has rank {e['rank']}")
            vocab.append(base64.b64decode(e["token_bytes"]))
        # Files list every special rank; older ones may list fewer, and
        # mistral_common fills the gaps with <SPECIAL_i>.
        specials = [f"<SPECIAL_{i}>" for i in range(num_special)]
        for e in data.get("special_tokens") or []:
            specials[int(e["rank"])] = e["token_str"]
        return cls(
            vocab,
            specials,
            config.get("pattern") or TEKKEN_PATTERN,
            data.get("audio"),
            name,
        )

    @property
    def num_special(self) -> int:
        return len(self._specials)

    @property
    def vocab_size(self) -> int:
        return len(self._specials) + len(self._vocab)

    @property
    def audio(self) -> dict[str, Any]:
        return self._audio

    def special_id(self, name: str) -> int:
        try:
            return self._special_ids[name]
        except KeyError:
            raise CheckpointError(
                f"tokenizer {self._name} has no special token {name}"
            ) from None

    def is_special(self, id: int) -> bool:
        return 0 <= id < len(self._specials)

    def token_bytes(self, id: int) -> bytes:
        if not 0 <= id < self.vocab_size:
            raise IndexError(f"token id {id} outside vocabulary of {self.vocab_size}")
        n = len(self._specials)
        return b"" if id < n else self._vocab[id - n]

    def decode(self, ids: Iterable[int]) -> str:
        return b"".join(self.token_bytes(int(i)) for i in ids).decode(
            "utf-8", errors="replace"
        )

    @cached_property
    def _ranks(self) -> dict[bytes, int]:
        return {b: r for r, b in enumerate(self._vocab)}

    @cached_property
    def _regex(self):
        return _compile(self._pattern)

    def encode(self, text: str) -> list[int]:
        """Plain text to ids (no BOS/EOS, special names are not parsed)."""
        out: list[int] = []
        pos = 0
        for m in self._regex.finditer(text):
            if m.start() > pos:  # never drop text the pattern skipped
                out += self._encode_piece(text[pos : m.start()].encode())
            out += self._encode_piece(m.group().encode())
            pos = m.end()
        if pos < len(text):
            out += self._encode_piece(text[pos:].encode())
        return out

    def _encode_piece(self, piece: bytes) -> list[int]:
        if not piece:
            return []
        if (ids := self._cache.get(piece)) is not None:
            return ids
        ranks = self._ranks
        if piece in ranks:
            ranks_out = [ranks[piece]]
        else:
            # tiktoken's rule: repeatedly merge the adjacent pair whose
            # concatenation has the lowest rank.
            parts = [piece[i : i + 1] for i in range(len(piece))]
            while len(parts) > 1:
                best, best_rank = -1, len(ranks)
                for i in range(len(parts) - 1):
                    r = ranks.get(parts[i] + parts[i + 1])
                    if r is not None and r < best_rank:
                        best, best_rank = i, r
                if best < 0:
                    break
                parts[best : best + 2] = [parts[best] + parts[best + 1]]
            try:
                ranks_out = [ranks[p] for p in parts]
            except KeyError as e:
                raise CheckpointError(
                    f"tokenizer {self._name} has no token for byte {e.args[0]!r}"
                ) from None
        ids = [r + len(self._specials) for r in ranks_out]
        if len(self._cache) < 65536:
            self._cache[piece] = ids
        return ids


class StreamingDetokenizer:
    """Turns ids into text as they arrive, holding back split UTF-8 characters."""

    def __init__(self, tokenizer: Tekken):
        self._tok = tokenizer
        self._tail = b""

    def reset(self) -> None:
        self._tail = b""

    def add(self, id: int) -> str:
        data = self._tail + self._tok.token_bytes(id)
        cut = _complete_prefix(data)
        self._tail = data[cut:]
        return data[:cut].decode("utf-8", errors="replace")

    def flush(self) -> str:
        text = self._tail.decode("utf-8", errors="replace")
        self._tail = b""
        return text


def _complete_prefix(data: bytes) -> int:
    """Length of data without a trailing, still incomplete UTF-8 sequence."""
    n = len(data)
    for k in range(1, min(4, n) + 1):
        c = data[n - k]
        if c < 0x80:
            return n
        if c >= 0xC0:  # lead byte: hold it back if its sequence is unfinished
            need = 2 if c < 0xE0 else 3 if c < 0xF0 else 4
            return n - k if k < need else n
    return n
