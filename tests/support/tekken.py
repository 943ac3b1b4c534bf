"""Writes tiny tekken.json files in the real mistral_common layout for tests."""

from __future__ import annotations

import base64
import json
from pathlib import Path

from mlx_speech.text.tekken import TEKKEN_PATTERN

NAMED_SPECIALS = {
    0: "<unk>",
    1: "<s>",
    2: "</s>",
    3: "[INST]",
    4: "[/INST]",
    11: "<pad>",
    24: "[AUDIO]",
    25: "[BEGIN_AUDIO]",
    32: "[STREAMING_PAD]",
    33: "[STREAMING_WORD]",
    35: "[REPEAT_AUDIO_TEXT]",
    36: "[NEXT_AUDIO_TEXT]",
}

VOXTRAL_AUDIO = {
    "sampling_rate": 16000,
    "frame_rate": 12.5,
    "audio_encoding_config": {
        "num_mel_bins": 128,
        "hop_length": 160,
        "window_size": 400,
    },
    "chunk_length_s": None,
    "transcription_delay_ms": 480,
    "streaming_look_ahead_ms": 2.5,
    "streaming_look_back_ms": 52.5,
    "streaming_n_left_pad_tokens": 32,
    "transcription_format": "streaming",
}


def write_tekken(
    path: str | Path,
    pieces: list[bytes],
    num_special: int = 1000,
    audio: dict | None = None,
    vocab_size: int | None = None,
) -> None:
    """Vocab = the 256 single bytes (ranks 0..255) then `pieces` (ranks 256..).

    Piece k gets id num_special + 256 + k. `vocab_size` (default: all entries)
    is written as default_vocab_size, so a smaller value truncates the vocab.
    """
    tokens = [bytes([i]) for i in range(256)] + list(pieces)
    assert all(len(p) > 1 for p in pieces) and len(set(tokens)) == len(tokens)
    vocab = [
        {
            "rank": r,
            "token_bytes": base64.b64encode(b).decode("ascii"),
            "token_str": b.decode("utf-8", errors="replace"),
        }
        for r, b in enumerate(tokens)
    ]
    specials = [
        {
            "rank": i,
            "token_str": NAMED_SPECIALS.get(i, f"<SPECIAL_{i}>"),
            "is_control": True,
        }
        for i in range(num_special)
    ]
    data = {
        "config": {
            "pattern": TEKKEN_PATTERN,
            "num_vocab_tokens": len(vocab),
            "default_vocab_size": vocab_size or num_special + len(vocab),
            "default_num_special_tokens": num_special,
            "version": "v7",
        },
        "vocab": vocab,
        "special_tokens": specials,
    }
    if audio is not None:
        data["audio"] = audio
    Path(path).write_text(json.dumps(data), encoding="utf-8")
