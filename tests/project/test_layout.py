"""Packaging: top-level source folders (convert/) install as mlx_speech subpackages; the model
loaders never import the converter."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _pyproject() -> dict:
    tomllib = pytest.importorskip("tomllib")
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_pyproject_lists_every_package():
    st = _pyproject()
    mapped = st.get("package-dir", {})
    found = {".".join(p.parent.relative_to(ROOT).parts)
             for p in (ROOT / "mlx_speech").rglob("__init__.py")}
    for name, folder in mapped.items():
        found |= {".".join((name, *p.parent.relative_to(ROOT / folder).parts))
                  for p in (ROOT / folder).rglob("__init__.py")}
    missing, extra = sorted(found - set(st["packages"])), sorted(set(st["packages"]) - found)
    assert not missing, f"add to [tool.setuptools] packages in pyproject.toml: {missing}"
    assert not extra, f"pyproject.toml lists packages with no __init__.py: {extra}"


def test_source_tree_map_matches_pyproject():
    from mlx_speech import SOURCE_TREE

    assert _pyproject().get("package-dir", {}) == SOURCE_TREE


def test_convert_is_imported_from_the_top_level_folder():
    import mlx_speech.convert

    assert Path(mlx_speech.convert.__file__).resolve() == ROOT / "convert" / "__init__.py"
    assert not (ROOT / "mlx_speech" / "convert.py").exists()
    r = subprocess.run([sys.executable, "-m", "mlx_speech.convert", "--help"], cwd=ROOT,
                       capture_output=True, text=True)
    assert r.returncode == 0 and "converted layout" in r.stdout, r.stderr


def test_loading_never_imports_the_converter():
    code = ("import sys, mlx_speech; m = mlx_speech.load('tests/golden/nemotron');"
            "print(sorted(k for k in sys.modules if k.split('.')[:2] == ['mlx_speech', 'convert']"
            " or k == 'convert'), m.config.encoder.hidden_size > 0)")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert r.stdout.strip() == "[] True", r.stderr


def test_package_data_ships_every_data_file():
    """Every non-Python file under mlx_speech/ (the web page, Silero's VAD model and its
    license) matches a [tool.setuptools.package-data] glob, so a wheel carries it."""
    from fnmatch import fnmatch

    data = _pyproject().get("package-data", {})
    files = [p for p in (ROOT / "mlx_speech").rglob("*")
             if p.is_file() and p.suffix not in (".py", ".pyc") and "__pycache__" not in p.parts]
    assert any(p.name == "silero_vad.onnx" for p in files)
    for p in files:
        rel = p.relative_to(ROOT)
        owners = [pkg for pkg in data
                  if rel.parts[:len(pkg.split("."))] == tuple(pkg.split("."))]
        ok = any(fnmatch("/".join(rel.parts[len(pkg.split(".")):]), g)
                 for pkg in owners for g in data[pkg])
        assert ok, f"{rel} is not in [tool.setuptools.package-data] (pyproject.toml)"


def test_test_modules_share_helpers_not_each_other():
    """Shared test code lives in helper modules (not named test_*): a test module importing
    another one runs that module's tests' imports and fixtures twice, and hides what is shared."""
    import ast

    bad = []
    for f in sorted((ROOT / "tests").rglob("*.py")):
        rel = f.relative_to(ROOT / "tests")
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""] + [f"{node.module or ''}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            bad += [f"{rel}:{node.lineno} {n}" for n in names
                    if any(part.startswith("test_") for part in n.split("."))]
    assert not bad, bad


AREAS = {"app", "audio", "cli", "convert", "kernels", "models", "nn", "project", "server",
         "text", "web"}


def test_tests_live_in_area_folders_with_one_naming():
    """A newcomer finds an area's tests in one folder: `tests/<area>/test_*.py` (models per
    family under `tests/models/<family>/`), the area's own helpers beside them as
    `helpers_<topic>.py`, helpers several areas share in `tests/support/`; only conftest.py and
    packages' __init__.py at the top (golden/ and data/ hold generators of committed files)."""
    bad = []
    for f in sorted((ROOT / "tests").rglob("*.py")):
        rel = f.relative_to(ROOT / "tests")
        top = rel.parts[0]
        if top in ("golden", "data", "support") or f.name == "__init__.py":
            continue
        if len(rel.parts) == 1:
            ok = f.name == "conftest.py"
        else:
            ok = top in AREAS and (f.name.startswith(("test_", "helpers_"))
                                   or f.name == "conftest.py")
        if not ok:
            bad.append(str(rel))
    assert not bad, f"place these as tests/<area>/test_*.py or helpers_*.py: {bad}"
    families = {p.name for p in (ROOT / "mlx_speech" / "models").iterdir()
                if (p / "__init__.py").exists()}
    for d in (ROOT / "tests" / "models").iterdir():
        if d.is_dir() and d.name != "__pycache__":
            assert d.name in families, f"tests/models/{d.name} names no family"
