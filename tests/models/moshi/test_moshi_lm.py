"""Moshi LM + depformer + Kyutai LMGen vs moshi 0.2.13 goldens (tests/golden/moshi/tiny_lm*)."""

from __future__ import annotations

import json

import mlx.core as mx
import numpy as np
import pytest

from mlx_speech.errors import CheckpointError
from mlx_speech.models.loading import load_safetensors
from mlx_speech.models.moshi import (
    KyutaiGen,
    LmConfig,
    PersonaPlexGen,
    Sampling,
    build_lm,
)
from mlx_speech.models.moshi.lm import embed
from tests.support.moshi import GOLDEN, spy_inputs

GREEDY = Sampling(0.0, 0.0, 250, 25)


def _cfg() -> LmConfig:
    return LmConfig.from_dict(json.loads((GOLDEN / "tiny_lm_config.json").read_text()))


def _weights() -> dict:
    return load_safetensors([GOLDEN / "tiny_lm.safetensors"])


@pytest.fixture(scope="module")
def lm():
    return build_lm(_cfg(), _weights())


@pytest.fixture(scope="module")
def ref():
    return dict(np.load(GOLDEN / "tiny_lm_ref.npz"))


def test_teacher_forced_logits(lm, ref):
    toks, st = ref["tf_tokens"], lm.make_state(1)
    err_t = err_z = err_d = 0.0
    for t in range(toks.shape[-1]):  # 14 steps > context 10: the KV ring wraps
        z, logits = lm.forward_tokens(mx.array(toks[:, :, t:t + 1]), st)
        st.dep.reset()
        prev, dl = mx.array(toks[:, 0, t]), []
        for k in range(lm.config.dep_q):
            dl.append(lm.depformer_logits(k, prev, z, st.dep))
            prev = mx.array(toks[:, 1 + k, t])
        mx.eval(z, logits, dl, st.arrays())
        err_t = max(err_t, np.abs(np.array(logits[0, 0]) - ref["tf_text_logits"][t]).max())
        err_z = max(err_z, np.abs(np.array(z[0, 0]) - ref["tf_transformer_out"][t]).max())
        err_d = max(err_d, np.abs(np.stack([np.array(d[0]) for d in dl])
                                  - ref["tf_dep_logits"][t]).max())
    assert err_t <= 1e-5 and err_z <= 1e-5 and err_d <= 1e-5, (err_t, err_z, err_d)


@pytest.mark.parametrize("compiled", ["1", "0"])
@pytest.mark.parametrize("lag,suffix", [(0, ""), (1, "_lag1")])
def test_greedy_generation(lm, ref, lag, suffix, compiled, monkeypatch):
    monkeypatch.setenv("MLX_SPEECH_COMPILE", compiled)  # compiled steps, and plain
    gen = KyutaiGen(lm, lm.config, GREEDY, user_lag=lag)
    seen = spy_inputs(gen)
    out = np.full_like(ref["gen_out"], -100)
    for t, u in enumerate(ref["gen_user"]):
        o = gen.step(mx.array(u).reshape(1, -1, 1))
        mx.eval(gen.arrays())
        if o.tokens is not None:
            out[t] = np.array(o.tokens)[0, :, 0]
    np.testing.assert_array_equal(out, ref["gen_out" + suffix])
    np.testing.assert_array_equal(np.stack([np.array(x)[0, :, 0] for x in seen]),
                                  ref["gen_seen_inputs" + suffix])


def test_lags_differ(ref):
    assert (ref["gen_out"] != ref["gen_out_lag1"]).any()  # the fixture tells the modes apart


def test_minus_one_is_a_zero_vector(lm):
    tok = mx.full((1, 1 + lm.config.n_q, 1), -1, dtype=mx.int32)
    assert not mx.any(lm.embed_tokens(tok)).item()
    assert mx.any(embed(lm.text_emb, mx.array([[0]]))).item()


def test_minus_one_survives_quantisation():
    lm = build_lm(_cfg(), _weights(), quantize=4, group_size=32)
    assert type(lm.text_emb).__name__ == "QuantizedEmbedding"
    tok = mx.array([[[-1], [5], [-1], [-1], [-1]]], dtype=mx.int32)
    only = mx.array([[[5]]])
    np.testing.assert_array_equal(np.array(lm.embed_tokens(tok)),
                                  np.array(lm.emb[0](only[:, 0])))
    z, logits = lm.forward_tokens(tok, lm.make_state(1))
    assert np.isfinite(np.array(logits)).all()


def test_ungenerated_never_reaches_model(lm):
    cfg = LmConfig.from_dict(json.loads((GOLDEN / "tiny_pp_config.json").read_text()))
    pp = build_lm(cfg, load_safetensors([GOLDEN / "tiny_pp.safetensors"]))
    gen = PersonaPlexGen(pp, cfg, GREEDY)
    gen.set_cache(np.full((1, cfg.num_codebooks, gen.columns), -2))
    gen.offset = 5
    with pytest.raises(RuntimeError, match="not generated"):
        gen.step(user=mx.zeros((1, 8, 1), dtype=mx.int32))


def test_a_voice_cache_token_outside_its_table_is_an_error():
    """A stored voice's cache feeds the embedding tables as they are: an id past a stream's
    table (2048 in the text stream, whose table has text_card + 1 = 51 rows) would be an
    out-of-bounds gather, so it is refused with the stream named."""
    cfg = LmConfig.from_dict(json.loads((GOLDEN / "tiny_pp_config.json").read_text()))
    pp = build_lm(cfg, load_safetensors([GOLDEN / "tiny_pp.safetensors"]))
    gen = PersonaPlexGen(pp, cfg, GREEDY)
    cache = np.full((1, cfg.num_codebooks, gen.columns), cfg.card)
    with pytest.raises(CheckpointError, match=r"stream 0 holds token 2048, outside -1\.\.50"):
        gen.set_cache(cache)
    cache[:, 0] = cfg.text_card
    gen.set_cache(cache)  # the initial tokens of every stream are in range
    cache[:, 3, 1] = cfg.card + 1
    with pytest.raises(CheckpointError, match="stream 3"):
        gen.set_cache(cache)


def test_missing_and_extra_keys_are_named():
    w = _weights()
    del w["depformer_emb.0.weight"]
    with pytest.raises(CheckpointError, match=r"depformer_emb\.0\.weight"):
        build_lm(_cfg(), w)
    w = _weights()
    w["transformer.layers.0.bogus.weight"] = mx.zeros((2,))
    with pytest.raises(CheckpointError, match=r"transformer\.layers\.0\.bogus\.weight"):
        build_lm(_cfg(), w)
    w = _weights()
    w["text_linear.weight"] = mx.zeros((3, 3))
    with pytest.raises(CheckpointError, match="text_linear.weight"):
        build_lm(_cfg(), w)


def test_config_rejects_unknown_and_unsupported():
    kw = json.loads((GOLDEN / "tiny_lm_config.json").read_text())
    with pytest.raises(CheckpointError, match="bogus_key"):
        LmConfig.from_dict({**kw, "bogus_key": 1})
    with pytest.raises(CheckpointError, match="norm_emb"):
        LmConfig.from_dict({**kw, "norm_emb": True})
    with pytest.raises(CheckpointError, match="delays"):
        LmConfig.from_dict({**kw, "delays": [0, 1]})
    cfg = LmConfig.from_dict({**kw, "depformer_context": 1, "moshi_name": "x.safetensors"})
    assert (cfg.n_agent, cfg.n_user, cfg.max_delay) == (2, 2, 1)


def test_delays_come_from_config():
    kw = json.loads((GOLDEN / "tiny_lm_config.json").read_text())
    cfg = LmConfig.from_dict({**kw, "delays": [0, 0, 2, 0, 2]})
    lm = build_lm(cfg, _weights())
    gen = KyutaiGen(lm, cfg, GREEDY)
    outs = [gen.step(mx.zeros((1, 2, 1), dtype=mx.int32)).tokens for _ in range(4)]
    assert [o is None for o in outs] == [True, True, False, False]
    assert gen.columns == 4


def test_gated_hidden_comes_from_weights(lm, ref):
    # hidden_scale 4 would give moshi's 21/8 rule (84), but the file holds 88: the file wins
    kw = json.loads((GOLDEN / "tiny_lm_config.json").read_text())
    other = build_lm(LmConfig.from_dict({**kw, "hidden_scale": 4.0}), _weights())
    assert other.transformer.layers[0].gating.linear_out.weight.shape == (32, 88)
    assert other.depformer.layers[0].gating[1].linear_in.weight.shape == (88, 16)


def test_seeded_generation_is_reproducible(lm):
    def run(seed):
        gen = KyutaiGen(lm, lm.config, Sampling(1.0, 1.0, 0, 0), seed=seed)
        toks = []
        for t in range(6):
            o = gen.step(mx.array([[[t % 16], [(3 * t) % 16]]]))
            mx.eval(gen.arrays())
            toks.append(np.array(o.text))
        return np.concatenate(toks)

    np.testing.assert_array_equal(run(3), run(3))
    assert (run(3) != run(4)).any()
