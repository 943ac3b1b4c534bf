"""Batched stepping of streaming ASR sessions (`feed_many` / `finish_many`): every
session's tokens equal the same session run alone and offline transcription."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from mlx_speech.errors import MlxSpeechError
from mlx_speech.models.nemotron_streaming import load as load_nemotron
from tests.conftest import speechlike

NEMOTRON = Path(__file__).parent / "golden" / "nemotron"


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


def test_voxtral_feed_many_equals_alone(vr_model):
    specs = [(speechlike(2.9, seed=1), [1280], 0, {}),
             (speechlike(1.3, seed=2), [777, 3000], 0, {"delay_ms": 160}),
             (speechlike(2.2, seed=3), [4000, 1, 2561], 3, {}),
             (speechlike(1.7, seed=4), [160], 1, {"delay_ms": 960})]
    _check(vr_model, specs)


def test_nemotron_feed_many_equals_alone(nm):
    specs = [(speechlike(2.9, seed=1), [1280], 0, {}),
             (speechlike(1.3, seed=2), [777, 3000], 0, {"latency_ms": 160}),
             (speechlike(2.2, seed=3), [4000, 1, 2561], 3, {"latency_ms": 80}),
             (speechlike(1.7, seed=4), [160], 1, {})]
    _check(nm, specs)


def test_feed_many_input_errors(vr_model, nm):
    for owner in (vr_model, nm):
        a, b = owner.session(), owner.session()
        assert owner.feed_many([]) == [] and owner.finish_many([]) == []
        with pytest.raises(MlxSpeechError, match="only once"):
            owner.feed_many([(a, np.zeros(10, np.float32)), (a, np.zeros(10, np.float32))])
        b.finish()
        with pytest.raises(MlxSpeechError, match="finished"):
            owner.feed_many([(a, np.zeros(10, np.float32)), (b, np.zeros(10, np.float32))])
        assert owner.finish_many([b]) == [""]
    with pytest.raises(MlxSpeechError, match="another model"):
        vr_model.feed_many([(nm.session(), np.zeros(10, np.float32))])
