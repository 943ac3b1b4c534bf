"""What a benchmark's CPU numbers depend on, for its header: MLX's CPU matmul speed and the
BLAS serving it, as `mlx_speech doctor` measures them (its `cpu blas` row, run in a child
process with this one's environment, so a preloaded BLAS shows)."""

from __future__ import annotations

import json
import subprocess
import sys


def cpu_blas() -> str:
    """`mlx_speech doctor`'s `cpu blas` detail, or why it could not be read."""
    r = subprocess.run([sys.executable, "-m", "mlx_speech", "doctor", "--json", "--offline"],
                       capture_output=True, text=True, timeout=120)
    try:
        rows = {row["name"]: row for row in json.loads(r.stdout)["rows"]}
        return rows["cpu blas"]["detail"].split(": a reference BLAS")[0]
    except (ValueError, KeyError):
        return f"not read (mlx_speech doctor exited {r.returncode})"
