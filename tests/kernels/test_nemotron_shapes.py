"""Nemotron streaming runs attention over a small fixed set of shapes from the first chunk.

A GPU builds kernels (and CUDA graphs, cuDNN plans) per input shape, so a stream whose
attention key length grows with its cache pays a new build every tick of its first seconds.
The attention caches are allocated at their full left context (zeros in front, masked) and
batches are padded to powers of two (`nn.cache.FIXED_SHAPES`, the GPU default), so the shapes
that reach `mx.fast.scaled_dot_product_attention` (counted by tests/support/kernel_watch.py) are one
per (batch bucket, frames per call), never one per tick.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from mlx_speech.models.nemotron_streaming import load
from mlx_speech.nn import cache as nn_cache
from tests.conftest import speechlike

NEMOTRON = Path(__file__).parents[1] / "golden" / "nemotron"
SDPA = "scaled_dot_product_attention"


@pytest.fixture(scope="module")
def nm():
    return load(NEMOTRON)


def _key_context(shapes: set[tuple]) -> set[int]:
    """Keys minus queries of every attention call: the cached frames it attended over."""
    return {k[2] - q[2] for q, k, *_ in shapes}


def test_a_long_stream_uses_two_attention_shapes(nm, kernels):
    """20 s fed 80 ms at a time in the 160 ms mode: one shape per block from the first
    chunk, one for the final flush (the growing cache gave one per tick until it was full)."""
    s = nm.session(160)
    x = speechlike(20.0, seed=5)
    cache_shapes = set()
    for i in range(0, len(x), 1280):
        s.feed(x[i: i + 1280])
        cache_shapes |= {tuple(c.keys.shape) for c in s.enc_state.kv if c.keys is not None}
    s.finish()
    shapes = kernels.shapes(SDPA)
    assert len(shapes) <= 2, sorted(shapes)
    assert _key_context(shapes) == {nm.config.encoder.left_context}
    assert len(cache_shapes) == 1
    kernels.strict = False
    assert s.token_ids == nm.transcribe(x, latency_ms=160).token_ids


@pytest.mark.parametrize("pad", [True, None])
def test_a_batch_joining_and_leaving_uses_few_shapes(nm, kernels, monkeypatch, pad):
    """Seven sessions join and leave over 120 ticks: attention shapes are one per batch size
    (bucketed to powers of two when padding, the GPU default) and frames per call."""
    monkeypatch.setattr(nn_cache, "FIXED_SHAPES", pad)
    starts, secs = [0, 3, 7, 12, 20, 40, 41], [3.0, 2.5, 1.2, 2.8, 1.5, 2.0, 1.0]
    audios = [speechlike(t, seed=k) for k, t in enumerate(secs)]
    sessions = [nm.session(160) for _ in starts]
    pos = [0] * len(starts)
    sizes = set()
    for tick in range(120):
        pairs = []
        for i, s in enumerate(sessions):
            if tick >= starts[i] and not s.finished:
                pairs.append((s, audios[i][pos[i]: pos[i] + 1280]))
                pos[i] += 1280
        sizes.add(len(pairs))
        nm.feed_many(pairs)
        nm.finish_many([s for i, s in enumerate(sessions)
                        if not s.finished and pos[i] >= len(audios[i])])
    shapes = kernels.shapes(SDPA)
    batches = {q[0] for q, *_ in shapes}
    if pad:
        assert batches <= {1, 2, 4, 8}
    assert len(shapes) <= 2 * len(batches) <= 2 * len(sizes), sorted(shapes)
    assert _key_context(shapes) == {nm.config.encoder.left_context}
    kernels.strict = False
    monkeypatch.undo()
    for s, x in zip(sessions, audios, strict=True):
        assert s.token_ids == nm.transcribe(x, latency_ms=160).token_ids


def test_warm_up_frames_are_masked_not_attended(nm):
    """The zero-filled cache is invisible: the first chunk's frames equal offline's."""
    import mlx.core as mx

    x = speechlike(1.0, seed=3)
    mel = mx.array(nm.features(x)[None])
    off = np.array(nm.model.encoder(mel, 1)[0])
    st = nm.model.encoder.make_state(1)
    first = np.array(nm.model.encoder(mel[:, :17], state=st)[0])
    assert all(c.keys.shape[2] == c.size for c in st.kv) and st.kv[0].valid == len(first)
    np.testing.assert_allclose(first, off[: len(first)], atol=1e-5)
