"""Shared by tests/models/moshi/test_mimi.py, tests/kernels/test_fixed_shapes.py and
tests/kernels/test_no_empty_kernels.py:
the tiny Mimi goldens (PyTorch moshi 0.2.13's outputs) and the streaming check against them."""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import numpy as np

from mlx_speech.models import mimi

GOLDEN = Path(__file__).parents[1] / "golden" / "moshi"
TOL = 1e-5
FIXTURES = {"tiny": ("tiny_mimi", 4), "24k": ("mimi24k", 8)}


def load_case(fixture: str):
    """(model, reference outputs) of one of FIXTURES."""
    name, n_q = FIXTURES[fixture]
    cfg = json.loads((GOLDEN / f"{name}_config.json").read_text())
    model = mimi.load(GOLDEN / f"{name}.safetensors", config=cfg, num_codebooks=n_q)
    return model, dict(np.load(GOLDEN / f"{name}_ref.npz"))


def stream(model, x, state):
    F = model.frame_size
    codes, pcm = [], []
    for i in range(x.shape[-1] // F):
        c = model.encode_step(x[..., F * i : F * (i + 1)], state)
        codes.append(c)
        pcm.append(model.decode_step(c, state))
    return np.array(mx.concatenate(codes, -1)), np.array(mx.concatenate(pcm, -1))


def check_streaming_matches_torch_streaming(case):
    model, r = case
    codes, pcm = stream(model, mx.array(r["x"]), model.make_state(batch=r["x"].shape[0]))
    np.testing.assert_array_equal(codes, r["codes_stream"])
    assert np.abs(pcm - r["pcm_stream"]).max() < TOL
    # spec 8.6: the streaming ring differs from offline once the window fills
    assert np.abs(pcm - r["pcm_batch"]).max() > 1e-4
