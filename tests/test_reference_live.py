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

GOLDEN = Path(__file__).parent / "golden"


@pytest.mark.reference
def test_goldens_reproduce_with_transformers(tmp_path, golden):
    r = subprocess.run([sys.executable, str(GOLDEN / "make_voxtral_realtime.py"), str(tmp_path)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    fresh = np.load(tmp_path / "golden.npz")
    assert list(fresh["tokens"]) == list(golden["tokens"])
    for k in ("mel", "encoder", "adapter", "logits"):
        np.testing.assert_allclose(fresh[k], golden[k], atol=1e-5, err_msg=k)
