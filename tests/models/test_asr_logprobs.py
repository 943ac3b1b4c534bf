"""Token logprobs: the model's own log-softmax at each emitted token (Nemotron: the joint's,
blank included), the same tokens as without them, and nothing computed when not asked."""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from mlx_speech.models.nemotron_streaming import step as nemotron_step
from mlx_speech.models.voxtral_realtime import step as vr_step
from mlx_speech.nn import compiled, sampling
from tests.conftest import speechlike

GOLDEN = Path(__file__).parents[1] / "golden"


@pytest.fixture(scope="module")
def nemotron():
    from mlx_speech.models.nemotron_streaming import load

    return load(GOLDEN / "nemotron")


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def test_nemotron_logprobs_are_the_joints_log_softmax(nemotron):
    g = np.load(GOLDEN / "nemotron" / "golden.npz")
    plain = nemotron.transcribe(g["audio"], latency_ms=1120)
    s = nemotron.session(1120, logprobs=True)
    step = 16000 // 5
    taken = []
    for i in range(0, len(g["audio"]), step):
        s.feed(g["audio"][i: i + step])
        taken += s.lp.take()
    s.finish()
    taken += s.lp.take()
    r = s.result()
    assert r.token_ids == plain.token_ids and plain.logprobs is None
    assert [t for t, _ in taken] == r.token_ids and [v for _, v in taken] == r.logprobs
    # teacher-forced reference over the golden encoder output
    m = nemotron.model
    x = m.encoder_projector(mx.array(g["encoder_r13"]))
    state = m.make_decoder_state()
    ref = []
    for tok, f in zip(r.token_ids, r.frames, strict=True):
        logits = np.array(m.joint(x[f][None], state.g))[0]
        ref.append(_log_softmax(logits)[tok])
        state = m.decoder(mx.array([tok]), state)
    np.testing.assert_allclose(r.logprobs, ref, atol=2e-4)
    assert min(r.logprobs) < -0.1


def test_voxtral_logprobs_are_the_models_log_softmax(vr_model, monkeypatch):
    # the spy reads the logits on the host, which a compiled step's trace cannot: plain steps
    # here (compiled == plain logprobs: tests/models/voxtral_realtime/test_compiled_steps.py)
    monkeypatch.setenv("MLX_SPEECH_COMPILE", "0")
    a = speechlike(2.0)
    plain = vr_model.transcribe(a)
    seen = []
    real = sampling.greedy

    def spy(logits, b):
        out = real(logits, b)
        seen.append((np.array(logits.astype(mx.float32)), np.array(out)))
        return out

    monkeypatch.setattr(vr_step, "greedy", spy)  # the name Voxtral's step chooses with
    r = vr_model.transcribe(a, logprobs=True)
    assert r.token_ids == plain.token_ids and plain.logprobs is None
    ref = [_log_softmax(lg[0])[int(c[0])] for lg, c in seen][: len(r.token_ids)]
    assert [int(c[0]) for _, c in seen][: len(r.token_ids)] == r.token_ids
    np.testing.assert_allclose(r.logprobs, ref, atol=1e-4)


def test_nothing_is_computed_when_not_asked(vr_model, nemotron, monkeypatch):
    compiled.reset()  # compiled steps trace again: the spy sees what each graph computes
    calls = []
    real = sampling.chosen_logprob
    for step in (vr_step, nemotron_step):  # where each family's step takes the name
        monkeypatch.setattr(step, "chosen_logprob", lambda *a: calls.append(1) or real(*a))
    vr_model.transcribe(speechlike(1.0))
    nemotron.transcribe(speechlike(1.0))
    assert calls == []
    vr_model.transcribe(speechlike(1.0), logprobs=True)
    assert calls


def test_batched_logprobs_equal_alone(vr_model):
    a, b = speechlike(1.5, seed=2), speechlike(1.5, seed=3)
    alone = [vr_model.transcribe(x, logprobs=True).logprobs for x in (a, b)]
    s1, s2 = vr_model.session(logprobs=True), vr_model.session()
    vr_model.feed_many([(s1, a), (s2, b)])
    vr_model.finish_many([s1, s2])
    np.testing.assert_allclose(s1.result().logprobs, alone[0], atol=1e-5)
    assert s2.result().logprobs is None
