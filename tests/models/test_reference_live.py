"""Re-runs the transformers reference (when torch + transformers are installed)
and checks the committed goldens are still what it produces."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers.models.voxtral_realtime")

GOLDEN = Path(__file__).parents[1] / "golden"


@pytest.mark.reference
def test_goldens_reproduce_with_transformers(tmp_path, golden):
    r = subprocess.run([sys.executable, str(GOLDEN / "make_voxtral_realtime.py"), str(tmp_path)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    fresh = np.load(tmp_path / "golden.npz")
    assert list(fresh["tokens"]) == list(golden["tokens"])
    # fp32 reductions run in a different order under another torch build / BLAS: the adapter
    # (two matmuls on values of magnitude ~10) moves by ~3e-5, so hold the reference to the
    # same 1e-4 our implementation is held to against these goldens.
    for k in ("mel", "encoder", "adapter", "logits"):
        np.testing.assert_allclose(fresh[k], golden[k], atol=1e-4, err_msg=k)
