"""Reading the code's imports and pyproject.toml's declared dependencies (ast, no package
imported): shared by tests/project/test_declared_deps.py and
tests/project/test_missing_extras.py."""

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

tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11+")

ROOT = Path(__file__).resolve().parents[2]
CODE = ("mlx_speech", "convert", "apps")
SUBSYSTEMS = (("mlx_speech/server/", "server"), ("apps/", "app"), ("convert/", "convert"),
              ("mlx_speech/audio/devices.py", "live"))
CHECKED_EXTRAS = ("live", "app", "server", "convert", "cluster")  # each imported by its code
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


