""".ci/run runs the README's test command as written, in a new virtual environment."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.project.helpers_readme import MARKER, readme_test_block

ROOT = Path(__file__).resolve().parents[2]


def test_ci_runs_the_readme_test_command():
    block = readme_test_block()
    r = subprocess.run([str(ROOT / ".ci" / "run"), "--print"], capture_output=True, text=True,
                       stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == block
    commands = [c.strip() for line in block for c in line.split("&&")]
    assert 'pip install -e ".[cpu,dev]"' in commands
    assert commands[-1].startswith("python -m pytest")


def test_ci_uses_a_new_venv_each_run_and_fails_when_no_test_ran(tmp_path):
    """A block that reports where it runs, then exits as pytest does when it collects nothing."""
    (tmp_path / ".ci").mkdir()
    shutil.copy(ROOT / ".ci" / "run", tmp_path / ".ci" / "run")
    probe = ("import importlib.util as u, json, os, sys; print(json.dumps([sys.prefix, "
             "sys.base_prefix, os.environ.get('CI'), sys.stdin.read(), "
             "u.find_spec('numpy') is None]))")
    (tmp_path / "README.md").write_text(f"# x\n\n{MARKER} -->\n```bash\npython -c \"{probe}\"\n"
                                        "exit 5\n```\n\n```bash\nexit 0\n```\n")
    env = {**os.environ, "MLX_SPEECH_CI_APT": "0", "PYTHON": sys.executable,
           "TMPDIR": str(tmp_path)}
    r = subprocess.run([str(tmp_path / ".ci" / "run")], capture_output=True, text=True, env=env,
                       timeout=120)
    assert r.returncode == 1 and "collected no tests" in r.stderr, r.stderr
    prefix, base, ci, stdin, bare = json.loads(r.stdout.strip().splitlines()[-1])
    assert prefix != base  # a venv of its own
    assert Path(prefix).parent.resolve() == tmp_path.resolve()
    assert prefix != sys.prefix and bare  # nothing from the caller's environment
    assert ci == "true" and stdin == ""
    assert not Path(prefix).exists()  # removed afterwards
