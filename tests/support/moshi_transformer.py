"""Shared by tests/nn/test_moshi_transformer.py and tests/kernels/test_fixed_shapes.py:
the Kyutai
streaming transformer's goldens (PyTorch moshi 0.2.13, make_moshi_transformer.py) and the
streaming check against them."""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from mlx_speech.nn.moshi_transformer import (
    Transformer,
    TransformerConfig,
    remap_checkpoint,
)

GOLDEN = Path(__file__).parents[1] / "golden" / "moshi"
CASES = ["mimi", "lm", "rms", "dep"]
TOL = 1e-5


def load_case(case: str):
    g = dict(np.load(GOLDEN / f"transformer_{case}.npz"))
    cfg = TransformerConfig(**json.loads(str(g["config"])))
    model = Transformer(cfg)
    w = {k[2:]: mx.array(v) for k, v in g.items() if k.startswith("w.")}
    model.load_weights(list(remap_checkpoint(w, cfg).items()), strict=True)
    return model, g


def err(a, b) -> float:
    return float(np.abs(np.array(a) - b).max())


def check_streaming_matches_torch_streaming(case, chunk):
    model, g = load_case(case)
    if f"stream{chunk}" not in g:
        pytest.skip("per-step weights stream one sub-step at a time")
    x = mx.array(g["x"])
    if model.cfg.weights_per_step:
        n = model.cfg.weights_per_step
        st = model.make_state(batch=x.shape[0])
        outs = []
        for f in range(x.shape[1] // n):  # a depformer frame per reset; explicit, implicit step
            st.reset()
            for k in range(n):
                step = k if f == 0 else None
                outs.append(model(x[:, f * n + k : f * n + k + 1], st, step=step))
    else:
        st = model.make_state(batch=x.shape[0])
        outs = [model(x[:, i : i + chunk], st) for i in range(0, x.shape[1], chunk)]
    y = mx.concatenate(outs, axis=1)
    assert err(y, g[f"stream{chunk}"]) < TOL
