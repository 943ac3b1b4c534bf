"""Shared by the Voxtral tests (tests/models/voxtral_tts/, tests/models/test_batched_asr.py)
and the backend-shape tests that rerun them (tests/kernels/test_fixed_shapes.py,
tests/kernels/test_no_empty_kernels.py): the TTS goldens, random codec codes, a tiny TTS that
stops at different frames and runners for its sessions, and the batched re-anchoring check of
Voxtral Realtime."""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import numpy as np

import mlx_speech
from tests.conftest import make_voxtral_checkpoint, speechlike

TTS_GOLDEN = Path(__file__).parents[1] / "golden" / "voxtral_tts"
TTS_CKPT = TTS_GOLDEN / "ckpt"


def random_codes(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.concatenate([rng.integers(2, 32, (n, 1)), rng.integers(2, 23, (n, 4))],
                          axis=1).astype(np.int32)


TTS_VOICES = ("casual_male", "neutral_female")
TTS_TEXTS = ("Hi there.", "One more voice here.", "Hello there. How are you?",
             "Third one. A fourth sentence is long, very long indeed.")


def load_ending_tts():
    """The golden tiny TTS with a semantic END row that wins now and then: with TTS_TEXTS and
    small seeds, prompts end after 2 to 21 frames or run to their cap."""
    import mlx_speech.models.voxtral_tts as vt

    tts = vt.load(TTS_CKPT, dtype=mx.float32, alibi="mlxa")
    head = tts.model.acoustic_transformer.semantic_codebook_output
    w = mx.array(head.weight)
    w[1] = 0.1 * mx.random.normal((w.shape[1],), key=mx.random.key(3))
    head.weight = w
    return tts


def joined(chunks) -> np.ndarray:
    """The samples of Audio chunks (None skipped), joined."""
    parts = [c.samples for c in chunks if c is not None]
    return np.concatenate(parts) if parts else np.zeros(0, np.float32)


def spoken_alone(tts, text: str, **kw) -> np.ndarray:
    """A speech session's audio, stepped on its own until done."""
    s = tts.session(**kw)
    s.feed(text)
    s.finish()
    out = []
    while not s.done:
        out.append(s.step())
    return joined(out)


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
