"""Compiled streaming steps (mlx_speech/nn/compiled.py) give what the plain steps give: token
for token (Voxtral Realtime, Nemotron, Moshi) and frame for frame (Sortformer), batched and
alone, under the kernel watch, with fixed shapes on and off; memory stays flat over a long
stream; MLX_SPEECH_COMPILE=0 turns compiling off."""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from mlx_speech.nn import cache as nn_cache
from mlx_speech.nn import compiled
from tests.conftest import speechlike
from tests.support.numbers import assert_same_numbers

GOLDEN = Path(__file__).parents[1] / "golden"


@pytest.fixture(params=[False, True], ids=["exact-shapes", "fixed-shapes"])
def fixed(request, monkeypatch):
    monkeypatch.setattr(nn_cache, "FIXED_SHAPES", request.param)
    return request.param


def _plain(monkeypatch):
    monkeypatch.setenv(compiled.ENV, "0")


def _compiled(monkeypatch):
    monkeypatch.setenv(compiled.ENV, "1")


def _drive(owner, specs) -> list:
    """Every session fed its chunks in shared `feed_many` ticks (joining at its start tick),
    then finished; returns the sessions."""
    sessions = [owner.session(**kw) for _, _, _, kw in specs]
    pos, k, tick = [0] * len(specs), [0] * len(specs), 0
    while not all(s.finished for s in sessions):
        pairs, ending = [], []
        for i, ((audio, sizes, start, _), s) in enumerate(zip(specs, sessions, strict=True)):
            if s.finished or tick < start:
                continue
            n = sizes[k[i] % len(sizes)]
            pairs.append((s, audio[pos[i]: pos[i] + n]))
            pos[i], k[i] = pos[i] + n, k[i] + 1
            if pos[i] >= len(audio):
                ending.append(s)
        owner.feed_many(pairs)
        if ending:
            owner.finish_many(ending)
        tick += 1
    return sessions


def _alone_plain(owner, monkeypatch, audio, kw):
    _plain(monkeypatch)
    try:
        s = owner.session(**kw)
        s.feed(audio)
        s.finish()
        return s
    finally:
        _compiled(monkeypatch)


def test_the_switch(monkeypatch):
    calls = []
    step = compiled.CompiledStep(lambda x: calls.append(1) or x * 2, "double")
    x = mx.ones((3,))
    _compiled(monkeypatch)
    for _ in range(4):
        np.testing.assert_array_equal(np.array(step("k", x)), [2, 2, 2])
    assert calls == [1, 1] and step.traced == {"k"}  # plain once, traced once, replayed
    _plain(monkeypatch)
    step("k", x)
    assert len(calls) == 3  # off: the plain function every call
    _compiled(monkeypatch)
    compiled.reset()
    assert not step.traced and not step.seen


def test_compiled_graphs_are_bounded(monkeypatch):
    _compiled(monkeypatch)
    monkeypatch.setattr(compiled, "MAX_SHAPES", 3)
    step = compiled.CompiledStep(lambda x: x + 1, "inc")
    for n in range(1, 9):
        for _ in range(2):
            step(n, mx.zeros((n,)))
        assert len(step.traced) <= 3


# -- Voxtral Realtime ------------------------------------------------------------------
def test_voxtral_compiled_equals_plain(vr_model, golden, monkeypatch, kernels, fixed):
    """Three sessions batched (different delays and feeds, one boosting phrases, one with
    logprobs), compiled; each equals itself alone, plain. The golden tokens hold compiled."""
    _compiled(monkeypatch)
    compiled.reset()
    specs = [(speechlike(3.0, seed=1), [1280], 0, {"logprobs": True}),
             (speechlike(2.2, seed=2), [777, 3000], 1, {"delay_ms": 160}),
             (speechlike(2.6, seed=3), [1280, 640], 2, {"hotwords": [">", "0K"], "boost": 3.0})]
    sessions = _drive(vr_model, specs)
    steps = vr_model.steps
    assert steps.decoder_step.traced and steps.encoder_step.traced  # compiled graphs ran
    kernels.strict = False
    for (audio, _, _, kw), s in zip(specs, sessions, strict=True):
        ref = _alone_plain(vr_model, monkeypatch, audio, kw)
        assert s.token_ids == ref.token_ids and len(s.token_ids) > 20
        if s.lp is not None:
            np.testing.assert_allclose(s.lp.values, ref.lp.values, atol=1e-5)
    assert vr_model.transcribe(golden["audio"]).token_ids == [int(t) for t in golden["tokens"]]


def test_voxtral_kv8_compiled_equals_plain(vr_dir, monkeypatch):
    import mlx_speech

    vr8 = mlx_speech.load(vr_dir, kv_bits=8)
    audio = speechlike(3.0, seed=4)
    _compiled(monkeypatch)
    got = vr8.transcribe(audio).token_ids
    assert vr8.steps.decoder_step.traced
    assert got == _alone_plain(vr8, monkeypatch, audio, {}).token_ids


def test_voxtral_memory_is_flat_over_a_long_stream(vr_model, monkeypatch):
    """Tick 150 and tick 600 of a compiled stream (80 ms a tick, the decoder's window wrapped
    many times): the same compiled graphs and the same memory."""
    _compiled(monkeypatch)
    s = vr_model.session()
    s.eos = -1  # random weights may emit EOS; this stream never ends
    x = speechlike(0.08 * 600, seed=9)
    seen = {}
    for t in range(600):
        s.feed(x[t * 1280: (t + 1) * 1280])
        s.drain()
        if t + 1 in (150, 600):
            mx.synchronize()
            steps = vr_model.steps
            seen[t + 1] = (mx.get_active_memory(), len(steps.decoder_step.traced),
                           len(steps.encoder_step.traced))
    (m1, *k1), (m2, *k2) = seen[150], seen[600]
    assert k1 == k2 and k1[0] >= 1
    assert m2 - m1 < 2 << 20, (m1, m2)


# -- Nemotron --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def nm():
    from mlx_speech.models.nemotron_streaming import load

    return load(GOLDEN / "nemotron")


def test_nemotron_compiled_equals_plain(nm, monkeypatch, kernels, fixed):
    _compiled(monkeypatch)
    compiled.reset()
    specs = [(speechlike(2.9, seed=1), [1280], 0, {"logprobs": True}),
             (speechlike(1.8, seed=2), [777, 3000], 0, {"latency_ms": 160}),
             (speechlike(2.2, seed=3), [2560], 1, {"latency_ms": 160, "hotwords": "hello"}),
             (speechlike(1.7, seed=4), [160, 4000], 2, {"latency_ms": 80})]
    sessions = _drive(nm, specs)
    steps = nm.steps
    assert steps.layers_step.traced and steps.joint_step.traced and steps.predict_step.traced
    kernels.strict = False
    for (audio, _, _, kw), s in zip(specs, sessions, strict=True):
        ref = _alone_plain(nm, monkeypatch, audio, kw)
        assert s.token_ids == ref.token_ids and s.frames == ref.frames
        if s.lp is not None:
            assert_same_numbers(s.lp.values, ref.lp.values, atol=1e-5)
    assert sum(len(s.token_ids) for s in sessions) > 20


# -- Sortformer ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def diar():
    from mlx_speech.models import sortformer

    return sortformer.load(GOLDEN / "sortformer" / "tiny.nemo")


@pytest.fixture(scope="module")
def voices():
    import soundfile as sf

    x, _ = sf.read(Path(__file__).parents[1] / "data" / "voices_3spk.wav", dtype="float32")
    return x


def test_sortformer_compiled_equals_plain(diar, voices, monkeypatch, kernels, fixed):
    _compiled(monkeypatch)
    compiled.reset()
    audios = [voices[: 16000 * 5], voices[8000: 16000 * 4], voices[16000: 16000 * 6]]
    sessions = [diar.session() for _ in audios]
    got = [[] for _ in audios]
    step = 4000
    for i in range(0, 16000 * 5, step):
        live = [(k, s) for k, s in enumerate(sessions) if i < len(audios[k])]
        for (k, _), p in zip(live, diar.feed_many([(s, audios[k][i: i + step])
                                                   for k, s in live]), strict=True):
            got[k].append(p)
        done = [(k, s) for k, s in live if i + step >= len(audios[k])]
        for (k, _), p in zip(done, diar.finish_many([s for _, s in done]), strict=True):
            got[k].append(p)
    assert diar.network.traced
    kernels.strict = False
    _plain(monkeypatch)
    for a, g in zip(audios, got, strict=True):
        s = diar.session()
        alone = np.concatenate([s.feed(a), s.finish()])
        assert_same_numbers(np.concatenate(g), alone)


# -- Moshi -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def moshi_model(tmp_path_factory):
    import mlx_speech.models.moshi as moshi
    from tests.support.moshi import tiny_kyutai_moshi

    return moshi.load(tiny_kyutai_moshi(tmp_path_factory.mktemp("cm") / "moshi", context=40))


def _converse(m, monkeypatch, mode: str, frames: int, **kw):
    monkeypatch.setenv(compiled.ENV, mode)
    s = m.session(**kw)
    F = s.frame_size
    x = speechlike(frames * F / 16000, seed=5)
    pcm, tokens = [], []
    real = s.gen.step

    def step(*a, **k):
        out = real(*a, **k)
        if out.tokens is not None:
            tokens.append(out.tokens)
        return out

    s.gen.step = step
    for i in range(frames):
        pcm.append(s.step(x[i * F:(i + 1) * F])[0])
    return np.concatenate([np.array(t)[0, :, 0] for t in tokens]), np.concatenate(pcm)


@pytest.mark.parametrize("sampling", [dict(temp=0.0, temp_text=0.0), dict(temp=0.8, seed=3)])
def test_moshi_compiled_equals_plain(moshi_model, monkeypatch, kernels, fixed, sampling):
    """60 frames (the 40-position ring wraps): the output codes and audio of the compiled
    temporal step and depformer loop equal the plain ones, greedy and sampled."""
    compiled.reset()
    codes, pcm = _converse(moshi_model, monkeypatch, "1", 60, **sampling)
    assert moshi_model.steps.temporal.traced and moshi_model.steps.depformer.traced
    kernels.strict = False
    ref_codes, ref_pcm = _converse(moshi_model, monkeypatch, "0", 60, **sampling)
    np.testing.assert_array_equal(codes, ref_codes)
    np.testing.assert_allclose(pcm, ref_pcm, atol=1e-6)
