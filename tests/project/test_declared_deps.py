"""Every third-party import is declared where its users install it, and nothing declared is
dead weight. Static: reads the code with ast and pyproject.toml, so it needs none of the packages.

Where an import must be declared (the first rule that matches):
- inside `with optional("EXTRA", ...)` (mlx_speech.errors): in EXTRA;
- in mlx_speech/server/: `server`; in apps/: `app`; in convert/: `convert`;
  in mlx_speech/audio/devices.py: `live`;
- anywhere else in mlx_speech/: the core dependencies.
The core counts everywhere, and an extra includes the extras it names (`mlx-realtime-speech[live]`).
Every package of the core and of those extras must be imported by the code they serve. Every
package the tests import must be in the core or `dev`, in `reference`, installed by the README's
test command, or one of REFERENCE_PEERS.
"""

from __future__ import annotations

import ast

from tests.project.helpers_deps import (
    CHECKED_EXTRAS,
    CODE,
    REFERENCE_PEERS,
    ROOT,
    Declared,
    distributions,
    imports,
    parse_requirement,
    problems,
    third_party,
)
from tests.project.helpers_readme import readme_test_block


def test_every_import_is_declared_and_every_dependency_is_imported():
    assert problems((ROOT / "pyproject.toml").read_text()) == []


def test_dropping_a_package_from_its_extra_is_caught():
    """The check can fail: remove each package an extra's code imports (sphn from [server],
    sounddevice from [live], Pillow from [app], ...) and it names the import."""
    text = (ROOT / "pyproject.toml").read_text()
    d = Declared(text)
    dropped = 0
    for extra in CHECKED_EXTRAS:
        for req in d.raw.get(extra, ()):
            name = parse_requirement(req)[0]
            if name == d.name:
                continue
            broken = text.replace(f'"{req}"', '"placeholder-package"', 1)
            assert broken != text
            found = [p for p in problems(broken) if f"imports {name}," in p]
            assert found, f"dropping {req} from [{extra}] went unnoticed"
            dropped += 1
    assert dropped >= 8
    sphn = [p for p in problems(text.replace('"sphn>=0.2"', '"placeholder-package"'))
            if "sphn" in p]
    assert any(p.startswith("mlx_speech/server/") and "nor [server]" in p for p in sphn), sphn


def test_dead_weight_and_function_level_imports_are_caught(tmp_path):
    """A core dependency nothing imports fails; an import inside a function (or inside
    `with optional(...)` naming another extra) counts as much as one at the top."""
    text = (ROOT / "pyproject.toml").read_text()
    heavy = text.replace('dependencies = [\n', 'dependencies = [\n    "mlx-lm>=0.28",\n', 1)
    assert "core dependency mlx-lm is imported by nothing in mlx_speech, convert, apps" in \
        problems(heavy)
    for top in CODE:
        (tmp_path / top).mkdir()
    (tmp_path / "mlx_speech" / "x.py").write_text(
        "def f():\n    import torch\n\n"
        "def g():\n    with optional('server', 'g'):\n        import fastapi\n")
    (tmp_path / "convert" / "y.py").write_text("import numpy\n")
    found = problems(text, tmp_path)
    assert "mlx_speech/x.py:2 imports torch, which is not in the core dependencies" in found
    assert not [p for p in found if "fastapi" in p or "numpy" in p]


def test_every_package_the_tests_import_is_declared():
    """A test whose package no install list names would be skipped (importorskip) or fail
    on every fresh machine."""
    d = Declared((ROOT / "pyproject.toml").read_text())
    allowed = d.extra("dev") | d.extra("reference") | REFERENCE_PEERS
    for line in readme_test_block():  # e.g. a `pip install --no-deps X` line
        for cmd in line.split("&&"):
            words = cmd.split()
            if "pip" in words and "install" in words[words.index("pip"):]:
                rest = words[words.index("install", words.index("pip")) + 1:]
                allowed |= {parse_requirement(w)[0] for w in rest
                            if not w.startswith(("-", ".", '"', "'"))}
    missing = []
    for f in sorted((ROOT / "tests").glob("*.py")):
        tree = ast.parse(f.read_text(encoding="utf-8"))
        found = [(m, line) for m, line, _ in imports(tree)]
        found += [(n.args[0].value.split(".")[0], n.lineno) for n in ast.walk(tree)
                  if isinstance(n, ast.Call) and getattr(n.func, "attr", None) == "importorskip"
                  and n.args and isinstance(n.args[0], ast.Constant)]
        missing += [f"{f.name}:{line} {m} ({distributions(m)[0]})" for m, line in found
                    if third_party(m) and not (ROOT / "tests" / f"{m}.py").exists()
                    and not allowed.intersection(distributions(m))]
    assert missing == []
