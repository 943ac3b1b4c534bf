"""SentencePiece decoding from tokenizer.model (protobuf) and tokenizer.json."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from mlx_speech.errors import CheckpointError
from mlx_speech.text.spm import SentencePieceDecoder, StreamingDecoder

MODEL = Path(__file__).parents[1] / "golden" / "nemotron" / "tokenizer.model"


def _json_tokenizer(path: Path) -> Path:
    vocab = {"<unk>": 0, "\u2581he": 1, "llo": 2, "\u2581w": 3, "orld": 4, ",": 5,
             "<0xC3>": 6, "<0xA9>": 7, "\u2581caf": 8}
    tj = {"model": {"type": "BPE", "vocab": vocab, "merges": [], "unk_token": "<unk>",
                    "byte_fallback": True},
          "added_tokens": [{"id": 9, "content": "<blank>", "special": True}]}
    path.write_text(json.dumps(tj))
    return path


def test_model_file_matches_sentencepiece():
    spm = pytest.importorskip("sentencepiece")
    sp = spm.SentencePieceProcessor(model_file=str(MODEL))
    d = SentencePieceDecoder.from_file(MODEL)
    assert len(d) == sp.get_piece_size()
    rng = np.random.default_rng(0)
    for _ in range(20):
        ids = [int(i) for i in rng.integers(1, len(d), 30)]
        assert d.decode(ids) == sp.decode(ids)
    for ids in ([3, 3, 5], [1, 3], [5, 3, 3, 5], [3, 3, 3, 1], [0, 3, 5], [3, 0, 5], []):
        assert d.decode(ids) == sp.decode(ids), ids  # leading spaces and unknowns
    text = "we stream audio and read tokens"
    assert d.decode(sp.encode(text)) == text


def test_json_bpe_with_byte_fallback_and_blank(tmp_path):
    d = SentencePieceDecoder.from_file(_json_tokenizer(tmp_path / "tokenizer.json"))
    assert d.decode([1, 2, 5, 3, 4]) == "hello, world"
    assert d.decode([8, 6, 7, 9, 9]) == "café"  # blank (added special) renders as nothing
    assert d.decode([1, 2, 99]) == "hello"  # ids past the vocabulary are ignored
    assert d.decode([3, 0, 4]) == "w \u2047 orld"
    assert d.decode([0, 1]) == " \u2047  he"


def test_streaming_decoder_joins_split_utf8(tmp_path):
    d = SentencePieceDecoder.from_file(_json_tokenizer(tmp_path / "tokenizer.json"))
    s = StreamingDecoder(d)
    deltas = [s.add(i) for i in (1, 2, 8, 6, 7)]
    assert deltas == ["he", "llo", " caf", "", "é"]  # first leading space dropped
    assert "".join(deltas) + s.flush() == d.decode([1, 2, 8, 6, 7])


def test_unreadable_tokenizer(tmp_path):
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{")
    with pytest.raises(CheckpointError, match="tokenizer.json"):
        SentencePieceDecoder.from_file(bad)
    bad = tmp_path / "tokenizer.model"
    bad.write_bytes(b"\x0a\xff\xff")
    with pytest.raises(CheckpointError, match="tokenizer.model"):
        SentencePieceDecoder.from_file(bad)
