"""Shared by tests/cli/test_cli.py and tests/models/test_boosting.py: a CLI entry point run as
a user runs it, in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run(*args, env=None, cwd=None):
    e = dict(os.environ, PYTHONPATH=str(ROOT), **(env or {}))
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True,
                          env=e, cwd=cwd, stdin=subprocess.DEVNULL, timeout=300)
