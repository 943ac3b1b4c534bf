"""Every third-party import is declared where its users install it, and nothing declared is
dead weight. Static: reads the code with ast and pyproject.toml, so it needs none of the packages.

Where an import must be declared (the first rule that matches):
- inside `with optional("EXTRA", ...)` (mlx_speech.errors): in EXTRA;
- in mlx_speech/server/: `server`; in apps/: `app`; in convert/: `convert`;
  in mlx_speech/audio/devices.py: `live`;
- anywhere else in mlx_speech/: the core dependencies.
The core counts everywhere, and an extra includes the extras it names (`mlx-speech[live]`).
Every package of the core and of those extras must be imported by the code they serve. Every
package the tests import must be in the core or `dev`, in `reference`, installed by the README's
test command, or one of REFERENCE_PEERS.
"""

from __future__ import annotations

import ast
import functools
import re
import sys
from collections import defaultdict
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest

from mlx_speech.errors import DISTRIBUTIONS
from tests.test_ci import readme_test_block

tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11+")

ROOT = Path(__file__).resolve().parents[1]
CODE = ("mlx_speech", "convert", "apps")
SUBSYSTEMS = (("mlx_speech/server/", "server"), ("apps/", "app"), ("convert/", "convert"),
              ("mlx_speech/audio/devices.py", "live"))
CHECKED_EXTRAS = ("live", "app", "server", "convert")  # each package imported by its code
# Reference implementations the tests compare against when they are installed; CI never
# installs them (torch stacks, or MLX ports we measure against).
REFERENCE_PEERS = {"moshi", "moshi-mlx", "mlx-audio", "voxmlx"}
LOCAL = {"mlx_speech", "convert", "apps", "tests", "__future__"}


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_requirement(req: str) -> tuple[str, set[str]]:
    """(normalized name, extras) of a PEP 508 requirement string."""
    m = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[([^\]]*)\])?", req)
    assert m, req
    return norm(m.group(1)), {norm(e) for e in (m.group(2) or "").split(",") if e.strip()}


class Declared:
    """pyproject.toml's name, core dependencies and extras."""

    def __init__(self, text: str):
        project = tomllib.loads(text)["project"]
        self.name = norm(project["name"])
        self.core = {parse_requirement(r)[0] for r in project["dependencies"]}
        self.raw: dict[str, list[str]] = project["optional-dependencies"]

    def own(self, extra: str) -> set[str]:
        """The packages an extra lists itself (not through another extra)."""
        return {n for n, _ in map(parse_requirement, self.raw.get(extra, ())) if n != self.name}

    def extra(self, extra: str, seen: frozenset = frozenset()) -> set[str]:
        """The core, the extra's packages and those of the extras it names."""
        out = set(self.core)
        for n, extras in map(parse_requirement, self.raw.get(extra, ())):
            if n != self.name:
                out.add(n)
            else:
                for e in extras - seen - {extra}:
                    out |= self.extra(e, seen | {extra})
        return out


@functools.cache
def distributions(module: str) -> tuple[str, ...]:
    """The distributions that install a top-level module (a namespace package has several),
    the likeliest first: the table where the names differ, else the installed metadata, else
    the module's own name."""
    if module in DISTRIBUTIONS:
        return (norm(DISTRIBUTIONS[module]),)
    found = sorted({norm(d) for d in _installed().get(module, ())}, key=lambda d: d != norm(module))
    return tuple(found) or (norm(module),)


@functools.lru_cache(maxsize=1)
def _installed() -> dict[str, list[str]]:
    return packages_distributions()


def _optional_extra(node: ast.With) -> str | None:
    for item in node.items:
        c = item.context_expr
        if (isinstance(c, ast.Call) and getattr(c.func, "id", getattr(c.func, "attr", None))
                == "optional" and c.args and isinstance(c.args[0], ast.Constant)):
            return c.args[0].value
    return None


def imports(tree: ast.AST, extra: str | None = None):
    """(top-level module, line, the extra of an enclosing `with optional(...)` or None), for
    every absolute import anywhere in the tree (function bodies included)."""
    for node in ast.iter_child_nodes(tree):
        inner = extra
        if isinstance(node, ast.With):
            inner = _optional_extra(node) or extra
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name.split(".")[0], node.lineno, extra
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module.split(".")[0], node.lineno, extra
        yield from imports(node, inner)


def third_party(module: str) -> bool:
    return module not in sys.stdlib_module_names and module not in LOCAL


def subsystem(rel: str) -> str | None:
    return next((extra for prefix, extra in SUBSYSTEMS if rel.startswith(prefix)), None)


@functools.cache
def code_imports(root: Path = ROOT) -> list[tuple[tuple[str, ...], str, int, str | None]]:
    """(distributions, file, line, where it must be declared: an extra or None for core)."""
    out = []
    for top in CODE:
        for f in sorted((root / top).rglob("*.py")):
            rel = f.relative_to(root).as_posix()
            for module, line, guarded in imports(ast.parse(f.read_text(encoding="utf-8"))):
                if third_party(module):
                    out.append((distributions(module), rel, line, guarded or subsystem(rel)))
    return out


def problems(pyproject_text: str, root: Path = ROOT) -> list[str]:
    """Undeclared imports and declared packages nothing imports, one line each."""
    d = Declared(pyproject_text)
    out, used = [], defaultdict(set)
    for dists, rel, line, extra in code_imports(root):
        used[extra].update(dists)
        dist = dists[0]
        allowed = d.core if extra is None else d.extra(extra)
        if extra is not None and extra not in d.raw:
            out.append(f"{rel}:{line} imports {dist} for the extra [{extra}], which does not exist")
        elif not allowed.intersection(dists):
            where = "the core dependencies" + (f" nor [{extra}]" if extra else "")
            out.append(f"{rel}:{line} imports {dist}, which is not in {where}")
    everywhere = set().union(*used.values())
    for dist in sorted(d.core - everywhere):
        out.append(f"core dependency {dist} is imported by nothing in {', '.join(CODE)}")
    for extra in CHECKED_EXTRAS:
        for dist in sorted(d.own(extra) - used[extra]):
            out.append(f"[{extra}] declares {dist}, which its code never imports")
    return out


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
    for line in readme_test_block():  # e.g. `pip install --no-deps silero-vad`
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
