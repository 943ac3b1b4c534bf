"""The project installs under a name of its own: `mlx-speech` on the package index is another
project with the same import name (issue 32)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import mlx_speech

ROOT = Path(__file__).resolve().parents[2]
tomllib = pytest.importorskip("tomllib")


def test_pyproject_readme_and_hints_use_our_name():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["name"] == mlx_speech.DISTRIBUTION == "mlx-realtime-speech"
    assert any(d.startswith("mlx-realtime-speech[") for d in
               project["optional-dependencies"]["dev"])  # the dev extra's self-reference
    readme = (ROOT / "README.md").read_text()
    assert not re.search(r"pip install [\"']?mlx-speech", readme)  # somebody else's project
    assert 'pip install -e ".[' in readme  # from a clone
    from mlx_speech.errors import install_hint

    assert install_hint("server") == "pip install 'mlx-realtime-speech[server]'"


def test_no_code_names_the_other_project_as_ours():
    """Only doctor's conflict check and the comments explaining the name mention it."""
    hits = []
    for top in ("mlx_speech", "apps", "convert"):
        for f in (ROOT / top).rglob("*.py"):
            for n, line in enumerate(f.read_text().splitlines(), 1):
                if re.search(r"mlx-speech\[|install mlx-speech|io\.github\.mlx-speech", line):
                    hits.append(f"{f.relative_to(ROOT)}:{n}")
    assert hits == []
