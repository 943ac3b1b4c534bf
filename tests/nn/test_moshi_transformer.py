"""Kyutai streaming transformer vs PyTorch moshi 0.2.13 (goldens from make_moshi_transformer.py)."""

from __future__ import annotations

import json

import mlx.core as mx
import numpy as np
import pytest

from mlx_speech.nn import cache as nn_cache
from mlx_speech.nn.moshi_transformer import (
    TransformerConfig,
    remap_checkpoint,
)
from tests.support.moshi_transformer import (
    CASES,
    GOLDEN,
    TOL,
    check_streaming_matches_torch_streaming,
)
from tests.support.moshi_transformer import err as _err
from tests.support.moshi_transformer import load_case as _load


@pytest.mark.parametrize("case", CASES)
def test_offline_matches_torch(case):
    model, g = _load(case)
    x = mx.array(g["x"])
    if model.cfg.weights_per_step:
        n = model.cfg.weights_per_step
        y = mx.concatenate([model(x[:, :n]), model(x[:, n:])], axis=1)
    else:
        y = model(x)
    assert _err(y, g["offline"]) < TOL


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("chunk", [1, 2])
def test_streaming_matches_torch_streaming(case, chunk):
    check_streaming_matches_torch_streaming(case, chunk)


def test_ring_semantics_differ_from_offline_once_full():
    # With T=2 per call and a full ring, the first query of a pair sees context-1 keys (spec 8.6):
    # the stream must agree with offline before the ring fills and differ after.
    model, g = _load("mimi")
    ctx = model.cfg.context
    assert _err(mx.array(g["stream2"][:, :ctx]), g["offline"][:, :ctx]) < TOL
    assert np.abs(g["stream2"][:, ctx:] - g["offline"][:, ctx:]).max() > 1e-4
    assert _err(mx.array(g["stream1"]), g["offline"]) < TOL


def test_masks_take_the_forms_fused_kernels_take(monkeypatch):
    """A ring wider than the window: no mask while a query sees every slot, "causal" while the
    window does not bind, else the boolean mask; the stream still equals offline. At the
    exact shapes (the CPU's default): with fixed shapes (GPUs) every allocated slot is
    attended, so the mask is an array from the first step (tests/kernels/test_fixed_shapes)."""
    monkeypatch.setattr(nn_cache, "FIXED_SHAPES", False)
    model, g = _load("mimi")
    ctx = model.cfg.context
    st = model.make_state(batch=g["x"].shape[0], capacity=ctx + 3)
    forms = []
    for L in (1, 2, 1):
        m = st.mask(L)
        forms.append(m if m is None or isinstance(m, str) else "array")
        st.offset += L
    assert forms == [None, "causal", None]
    st.offset = ctx - 1
    assert st.mask(1) is None and st.mask(2).shape == (2, ctx + 1)
    st.offset = ctx
    assert st.mask(1).shape == (1, ctx + 1)
    x = mx.array(g["x"])
    st = model.make_state(batch=x.shape[0], capacity=ctx + 3)
    y = mx.concatenate([model(x[:, i: i + 1], st) for i in range(x.shape[1])], axis=1)
    assert _err(y, g["offline"]) < TOL


def test_state_is_bounded_and_reset_replays():
    model, g = _load("lm")
    x = mx.array(g["x"])
    st = model.make_state(batch=2)
    first = [model(x[:, i : i + 1], st) for i in range(x.shape[1])]
    for i in range(40):
        model(x[:, i % 12 : i % 12 + 1], st)
    mx.eval(st.arrays())
    assert all(a.shape[2] == model.cfg.context for a in st.arrays())
    st.reset()
    again = [model(x[:, i : i + 1], st) for i in range(x.shape[1])]
    assert _err(mx.concatenate(again, 1), np.array(mx.concatenate(first, 1))) == 0.0


def test_remap_splits_fused_per_step_projections():
    g = dict(np.load(GOLDEN / "transformer_dep.npz"))
    cfg = TransformerConfig(**json.loads(str(g["config"])))
    w = {"pre." + k[2:]: mx.array(v) for k, v in g.items() if k.startswith("w.")}
    w["other.x"] = mx.zeros((1,))
    out = remap_checkpoint(w, cfg, prefix="pre.")
    fused = g["w.layers.0.self_attn.in_proj_weight"]
    rows = fused.shape[0] // 3
    np.testing.assert_array_equal(np.array(out["layers.0.self_attn.in_projs.2.weight"]),
                                  fused[2 * rows:])
    assert "layers.0.self_attn.in_proj_weight" not in out and "other.x" not in out
    assert "layers.1.gating.2.linear_in.weight" in out


def test_bad_step_and_batch_raise():
    model, _ = _load("dep")
    st = model.make_state()
    with pytest.raises(ValueError):
        model(mx.zeros((1, 1, 16)), st, step=3)
    with pytest.raises(ValueError):
        model(mx.zeros((2, 1, 16)), st)


@pytest.mark.reference
def test_live_torch_rebuild_matches_golden():
    pytest.importorskip("moshi")
    torch = pytest.importorskip("torch")
    from moshi.modules.transformer import StreamingTransformer

    g = dict(np.load(GOLDEN / "transformer_mimi.npz"))
    kw = json.loads(str(g["config"]))
    tr = StreamingTransformer(**kw).eval()
    sd = {k[2:]: torch.tensor(v) for k, v in g.items() if k.startswith("w.")}
    tr.load_state_dict(sd, strict=True)
    with torch.no_grad():
        assert np.abs(tr(torch.tensor(g["x"])).numpy() - g["offline"]).max() < 1e-6
