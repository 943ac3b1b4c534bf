from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

# Float32 results are compared with CPU-made goldens: no TF32 on CUDA / new Macs (MLX reads
# this once, at its first float32 matmul). `MLX_ENABLE_TF32=1 pytest` runs with TF32 on.
TF32_SET_BY_CALLER = "MLX_ENABLE_TF32" in os.environ
os.environ.setdefault("MLX_ENABLE_TF32", "0")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

# helper modules that hold whole test bodies: plain asserts there report like a test's own
pytest.register_assert_rewrite("tests.support.mimi", "tests.support.moshi_transformer",
                               "tests.support.voxtral")

from tests.support.gpu_emulation import gpu_order, gpu_rope, no_float64  # noqa: E402, F401
from tests.support.kernel_watch import kernels  # noqa: E402, F401
from tests.support.pulse import pulse  # noqa: E402, F401  (the PulseAudio device fixture)
from tests.support.tekken import VOXTRAL_AUDIO, write_tekken  # noqa: E402

GOLDEN = Path(__file__).parent / "golden" / "voxtral_realtime"


def make_voxtral_checkpoint(dest: Path, layout: str = "mistral", **overrides) -> Path:
    """Copy the tiny reference checkpoint and add a real-format tekken.json.

    `overrides` patch params.json / config.json (e.g. small RoPE limits)."""
    shutil.copytree(GOLDEN / layout, dest)
    write_tekken(dest / "tekken.json", [], vocab_size=1100, audio=VOXTRAL_AUDIO)
    if overrides:
        name = "params.json" if layout == "mistral" else "config.json"
        cfg = json.loads((dest / name).read_text())
        for path, value in overrides.items():
            node = cfg
            *parents, leaf = path.split("/")
            for p in parents:
                node = node[p]
            node[leaf] = value
        (dest / name).write_text(json.dumps(cfg))
    return dest


@pytest.fixture(scope="session")
def golden():
    return dict(np.load(GOLDEN / "golden.npz"))


@pytest.fixture(scope="session")
def vr_dir(tmp_path_factory) -> Path:
    return make_voxtral_checkpoint(tmp_path_factory.mktemp("vr") / "mistral")


@pytest.fixture(scope="session")
def vr_model(vr_dir):
    import mlx_speech

    return mlx_speech.load(vr_dir)


def speechlike(seconds: float, seed: int = 1) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(int(16000 * seconds)) / 16000
    f = 200 + 150 * np.sin(2 * np.pi * 0.7 * t)
    x = 0.3 * np.sin(2 * np.pi * np.cumsum(f) / 16000) * (0.6 + 0.4 * np.sin(2 * np.pi * 2.1 * t))
    return (x + 0.03 * rng.standard_normal(len(t))).astype(np.float32)


@pytest.fixture
def no_weights_loaded(monkeypatch):
    """Every family's loader fails the test (the checks before a load may still run). The
    family modules are all imported first, then patched: one that re-exports another's
    `load` (Nemotron 3.5's) must not bind the patched function for the rest of the run."""
    import importlib

    from mlx_speech.registry import MODELS

    modules = {importlib.import_module(m.split(":")[0]) for m in MODELS.values()}
    for mod in modules:
        monkeypatch.setattr(mod, "load", lambda *a, **k: pytest.fail("a model was loaded"))
