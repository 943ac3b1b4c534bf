"""The README's parts the tests read: the block `.ci/run` runs (tests/project/test_ci.py,
tests/project/test_declared_deps.py)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MARKER = "<!-- ci: test command"


def readme_test_block(readme: Path = ROOT / "README.md") -> list[str]:
    """The lines of the fenced block after the marker line (the README's test command)."""
    lines = readme.read_text(encoding="utf-8").splitlines()
    marks = [i for i, line in enumerate(lines) if line.startswith(MARKER)]
    assert len(marks) == 1, f"README.md needs exactly one {MARKER!r} line, found {len(marks)}"
    i = marks[0] + 1
    assert lines[i].startswith("```"), "the marker line must be right above the fenced block"
    end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
    return lines[i + 1 : end]
