"""Batched stepping of streaming ASR sessions (`feed_many` / `finish_many`): every
session's tokens equal the same session run alone and offline transcription."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from mlx_speech.errors import MlxSpeechError
from mlx_speech.models.nemotron_streaming import load as load_nemotron
from mlx_speech.nn import cache as nn_cache
from tests.conftest import speechlike
from tests.support.voxtral import check_batched_reanchoring

NEMOTRON = Path(__file__).parents[1] / "golden" / "nemotron"


@pytest.fixture(scope="module")
def nm():
    return load_nemotron(NEMOTRON)


def _drive(owner, specs):
    """specs: per session (audio, chunk sizes, start tick, mode kwargs). Runs every
    session through shared feed_many ticks; a session finishes (alone in a
    finish_many with whoever else ends that tick) right after its last chunk."""
    sessions = [owner.session(**kw) for _, _, _, kw in specs]
    pos = [0] * len(specs)
    k = [0] * len(specs)
    texts = [[] for _ in specs]
    tick = 0
    while not all(s.finished for s in sessions):
        pairs, idx, ending = [], [], []
        for i, (audio, sizes, start, _) in enumerate(specs):
            s = sessions[i]
            if s.finished or tick < start:
                continue
            n = sizes[k[i] % len(sizes)]
            pairs.append((s, audio[pos[i]: pos[i] + n]))
            idx.append(i)
            pos[i] += n
            k[i] += 1
            if pos[i] >= len(audio):
                ending.append(i)
        for i, t in zip(idx, owner.feed_many(pairs), strict=True):
            texts[i].append(t)
        for i, t in zip(ending, owner.finish_many([sessions[i] for i in ending]),
                        strict=True):
            texts[i].append(t)
        tick += 1
    return sessions, ["".join(t) for t in texts]


def _check(owner, specs):
    sessions, texts = _drive(owner, specs)
    for (audio, _, _, kw), s, text in zip(specs, sessions, texts, strict=True):
        ref = owner.transcribe(audio, **kw)
        assert s.token_ids == ref.token_ids
        assert text.strip() == ref.text.strip()


def _batch_sizes(monkeypatch, owner) -> list[int]:
    """Record the batch size of every decoder forward (plain or compiled)."""
    sizes: list[int] = []
    forward = owner.steps._forward

    def spy(batch, tokens, *a, **k):
        sizes.append(tokens.shape[0])
        return forward(batch, tokens, *a, **k)

    monkeypatch.setattr(owner.steps, "_forward", spy)
    return sizes


def test_voxtral_feed_many_equals_alone(vr_model, monkeypatch):
    # different audio, chunkings, delays (prompt lengths), a late joiner, one ending early;
    # 3-4 s cross the tiny decoder's 30-position window
    specs = [(speechlike(3.9, seed=1), [1280], 0, {}),
             (speechlike(1.3, seed=2), [777, 3000], 0, {"delay_ms": 160}),
             (speechlike(3.2, seed=3), [4000, 1, 2561], 3, {"delay_ms": 960}),
             (speechlike(3.4, seed=4), [1280, 160], 1, {"delay_ms": 160})]
    sizes = _batch_sizes(monkeypatch, vr_model)
    sessions, texts = _drive(vr_model, specs)
    assert max(sizes) == 4 and sum(b > 1 for b in sizes) >= 20  # really batched
    monkeypatch.undo()
    for (audio, _, _, kw), s, text in zip(specs, sessions, texts, strict=True):
        ref = vr_model.transcribe(audio, **kw)
        assert s.token_ids == ref.token_ids
        assert text.strip() == ref.text


def test_voxtral_batched_reanchoring(tmp_path, vr_model, gpu_rope):
    """Limits just above window + chunk: rows re-anchor at different steps. RoPE computes
    positions as the GPU kernels do (a negative one would wrap, tests/support/gpu_emulation.py)."""
    check_batched_reanchoring(tmp_path, vr_model)


def _probe_flat(owner, sessions, ticks: tuple[int, int], probe) -> None:
    """Feed 80 ms per tick (the last session joins at tick 5); the state `probe`
    reads must be the same at both ticks."""
    chunks = [speechlike(0.08, seed=k) for k in range(len(sessions))]
    seen = {}
    for tick in range(1, ticks[1] + 1):
        owner.feed_many([(s, c) for s, c in zip(sessions, chunks, strict=True)
                         if tick > 5 or s is not sessions[-1]])
        if tick in ticks:
            seen[tick] = [probe(s) for s in sessions]
    assert seen[ticks[0]] == seen[ticks[1]]


def test_voxtral_batched_work_is_flat(vr_model):
    """Tick 60 and tick 300 of a 3-session batch hold the same state."""
    sessions = [vr_model.session(), vr_model.session(delay_ms=160), vr_model.session()]
    for s in sessions:
        s.eos = -1  # random weights may emit EOS; this test needs endless sessions
    _probe_flat(vr_model, sessions, (60, 300), lambda s: (
        sum(a.size for r in s.dec_cache + s.enc_state.kv for a in r.state),
        len(s._audio), len(s.mel_todo), s.dec_cache[0].home.keys.shape))
    assert sessions[0].dec_cache[0].home is sessions[2].dec_cache[0].home  # one batch
    assert all(len(s.token_ids) > 250 for s in sessions)


def _encoder_batches(monkeypatch, model) -> list[int]:
    sizes: list[int] = []
    call = type(model.encoder).__call__

    def spy(self, mel, *a, **k):
        sizes.append(mel.shape[0])
        return call(self, mel, *a, **k)

    monkeypatch.setattr(type(model.encoder), "__call__", spy)
    return sizes


def test_nemotron_feed_many_equals_alone(nm):
    # mixed modes and chunkings: grouped by state shape inside each feed_many
    specs = [(speechlike(2.9, seed=1), [1280], 0, {}),
             (speechlike(1.3, seed=2), [777, 3000], 0, {"latency_ms": 160}),
             (speechlike(2.2, seed=3), [4000, 1, 2561], 3, {"latency_ms": 80}),
             (speechlike(1.7, seed=4), [160], 1, {})]
    sessions, texts = _drive(nm, specs)
    for (audio, _, _, kw), s, text in zip(specs, sessions, texts, strict=True):
        ref = nm.transcribe(audio, **kw)
        assert s.token_ids == ref.token_ids and s.frames == ref.frames
        assert text == ref.text
    assert sum(len(s.token_ids) for s in sessions) > 20


@pytest.mark.parametrize("pad", [False, True])
def test_nemotron_live_sessions_joining_late(nm, monkeypatch, pad):
    """80 ms frames per tick, staggered joins: caches at different fill levels share
    encoder calls (left-padded, masked). `pad`: batches padded to powers of two (the GPU
    default, for shapes the backend's graph caches reuse)."""
    starts, secs = [0, 3, 7, 12, 20], [3.0, 2.5, 1.2, 2.8, 1.5]
    specs = [(speechlike(t, seed=10 + k), [1280], t0, {"latency_ms": 160})
             for k, (t0, t) in enumerate(zip(starts, secs, strict=True))]
    monkeypatch.setattr(nn_cache, "FIXED_SHAPES", pad)
    sizes = _encoder_batches(monkeypatch, nm.model)
    sessions, _ = _drive(nm, specs)
    if pad:
        assert set(sizes) <= {1, 2, 4, 8} and 4 in sizes  # 3 sessions: one padded row
    else:
        assert max(sizes) >= 3 and 3 in sizes
    monkeypatch.undo()
    for (audio, _, _, kw), s in zip(specs, sessions, strict=True):
        ref = nm.transcribe(audio, **kw)
        assert s.token_ids == ref.token_ids and s.frames == ref.frames


def test_nemotron_batched_work_is_flat(nm):
    """Tick 40 and tick 160 of a 3-session batch hold the same state."""
    _probe_flat(nm, [nm.session(160) for _ in range(3)], (40, 160), lambda s: (
        sum(a.size for a in s.enc_state.arrays() + s.dec_state.arrays()), len(s.mel.buf)))


def test_feed_many_input_errors(vr_model, nm):
    for owner in (vr_model, nm):
        a, b = owner.session(), owner.session()
        assert owner.feed_many([]) == [] and owner.finish_many([]) == []
        assert owner.feed_many([(a, np.zeros(0, np.float32))]) == [""]
        with pytest.raises(MlxSpeechError, match="only once"):
            owner.feed_many([(a, np.zeros(10, np.float32)), (a, np.zeros(10, np.float32))])
        b.finish()
        with pytest.raises(MlxSpeechError, match="finished"):
            owner.feed_many([(a, np.zeros(10, np.float32)), (b, np.zeros(10, np.float32))])
        assert owner.finish_many([b]) == [""]
    with pytest.raises(MlxSpeechError, match="another model"):
        vr_model.feed_many([(nm.session(), np.zeros(10, np.float32))])
