"""A stream calls attention and its caches with a small fixed set of shapes from its first
second on, however long it runs and whoever joins or leaves its batch (GPU backends build
kernels and graphs per shape; see tests/shape_watch.py)."""

from __future__ import annotations

import numpy as np
import pytest

import mlx_speech
from mlx_speech.nn import cache as nn_cache
from tests.conftest import make_voxtral_checkpoint, speechlike
from tests.shape_watch import ShapeWatch


@pytest.fixture
def shape_watch(monkeypatch) -> ShapeWatch:
    monkeypatch.setattr(nn_cache, "FIXED_SHAPES", True)  # the GPU default
    return ShapeWatch(monkeypatch)


@pytest.fixture(scope="module")
def vr_wide(tmp_path_factory):
    """The tiny model with windows that take a 200 s stream through every ring size."""
    return mlx_speech.load(make_voxtral_checkpoint(
        tmp_path_factory.mktemp("wide") / "m", "mistral", sliding_window=1000,
        **{"multimodal/whisper_model_args/encoder_args/sliding_window": 300}))


def _endless(s):
    s.eos = -1  # random weights may emit EOS; these tests need the whole stream
    return s


def test_voxtral_long_stream_uses_few_shapes(vr_wide, shape_watch):
    s = _endless(vr_wide.session())
    audio = speechlike(200.0, seed=3)
    first = None
    for i in range(0, len(audio), 16000):
        s.feed(audio[i: i + 16000])
        if i == 0:
            first = shape_watch.count()
    s.finish()
    assert len(s.token_ids) > 2400
    # decoder: prefill, then one query against 256, 512, 1024 slots and the capacity;
    # encoder: chunks of 1-16 tokens against 256 slots and the capacity
    # (1034 shapes before the rings were allocated in buckets)
    assert first <= 6 and shape_watch.count() <= 16, sorted(shape_watch.seen["attention"])
    assert shape_watch.count("cache") <= 16


def test_voxtral_batch_joining_and_leaving_uses_few_shapes(vr_wide, shape_watch):
    """Sessions join and leave every few ticks: with batch sizes bucketed the shapes stay
    few; each session's tokens equal it run alone."""
    rng = np.random.default_rng(0)
    live, done, audios, tick = [], [], {}, 0
    while tick < 120:
        if tick % 7 == 0 and len(live) < 7:
            s = _endless(vr_wide.session(delay_ms=int(rng.choice([160, 480]))))
            audios[id(s)] = speechlike(float(rng.uniform(2, 6)), seed=tick)
            s.fed = 0
            live.append(s)
        pairs = []
        for s in live:
            n = int(rng.choice([1280, 2560, 640, 4000]))
            pairs.append((s, audios[id(s)][s.fed: s.fed + n]))
            s.fed += n
        vr_wide.feed_many(pairs)
        ending = [s for s in live if s.fed >= len(audios[id(s)])]
        if ending:
            vr_wide.finish_many(ending)
        live = [s for s in live if s not in ending]
        done += ending
        tick += 1
    if live:
        vr_wide.finish_many(live)
        done += live
    assert len(done) >= 12
    assert shape_watch.count() <= 40, sorted(shape_watch.seen["attention"])  # 451 before
    shape_watch.reset()
    for s in done[:4]:
        ref = _endless(vr_wide.session(delay_ms=s.delay_ms))
        ref.feed(audios[id(s)])
        ref.finish()
        assert s.token_ids == ref.token_ids


@pytest.mark.parametrize("sizes", [[1280], [3, 5000, 1, 1279, 2561]])
def test_voxtral_fixed_shapes_keep_the_reference_tokens(vr_model, golden, monkeypatch, sizes):
    """The GPU's fixed shapes on the CPU: still the reference's tokens, streamed or not."""
    monkeypatch.setattr(nn_cache, "FIXED_SHAPES", True)
    audio, ref = golden["audio"], [int(t) for t in golden["tokens"]]
    assert vr_model.transcribe(audio).token_ids == ref
    s = vr_model.session()
    i = k = 0
    while i < len(audio):
        s.feed(audio[i: i + sizes[k % len(sizes)]])
        i, k = i + sizes[k % len(sizes)], k + 1
    s.finish()
    assert s.token_ids == ref
