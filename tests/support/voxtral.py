"""Shared by the Voxtral tests (tests/models/voxtral_tts/test_voxtral_tts.py,
tests/models/test_batched_asr.py) and the backend-shape tests that rerun them
(tests/kernels/test_fixed_shapes.py, tests/kernels/test_no_empty_kernels.py):
the TTS goldens, random codec codes, and the batched re-anchoring check of Voxtral Realtime."""

from __future__ import annotations

from pathlib import Path

import numpy as np

import mlx_speech
from tests.conftest import make_voxtral_checkpoint, speechlike

TTS_GOLDEN = Path(__file__).parents[1] / "golden" / "voxtral_tts"
TTS_CKPT = TTS_GOLDEN / "ckpt"


def random_codes(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.concatenate([rng.integers(2, 32, (n, 1)), rng.integers(2, 23, (n, 4))],
                          axis=1).astype(np.int32)


def check_batched_reanchoring(tmp_path, vr_model):
    """Limits just above window + chunk: rows re-anchor at different steps; each row's tokens
    equal its audio transcribed alone (callers choose the RoPE arithmetic and cache shapes)."""
    small = mlx_speech.load(make_voxtral_checkpoint(
        tmp_path / "small", "mistral", model_max_length=80,
        **{"multimodal/whisper_model_args/encoder_args/max_source_positions": 28}))
    audios = [speechlike(6.0, seed=2), speechlike(5.0, seed=7), speechlike(4.0, seed=8)]
    sessions = [small.session(), small.session(delay_ms=160), small.session()]
    starts = [0, 7, 12]
    for tick in range(90):
        pairs = [(s, a[(tick - t0) * 1280: (tick - t0 + 1) * 1280])
                 for s, a, t0 in zip(sessions, audios, starts, strict=True)
                 if tick >= t0 and not s.finished]
        small.feed_many(pairs)
        for s in sessions:
            assert s.dec_cache[0].rope_offset <= 80 and s.enc_state.kv[0].rope_offset <= 28
    small.finish_many(sessions)
    for s, a in zip(sessions, audios, strict=True):
        assert s.dec_cache[0].shift > 0 and s.enc_state.kv[0].shift > 0
        assert s.token_ids == vr_model.transcribe(a, delay_ms=s.delay_ms).token_ids
