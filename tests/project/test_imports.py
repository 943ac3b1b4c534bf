"""The package's import graph, read from the source (nothing imported): no import circles, and
each model family's path from `load` to output opens at most ten files of the package (its own
files and the files they import, the leaf libraries read through their package faces)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "mlx_speech"
FAMILIES = ("voxtral_realtime", "nemotron_streaming", "sortformer", "voxtral_tts", "moshi")
MAX_FILES = 10


def _file(module: str) -> Path | None:
    p = ROOT.joinpath(*module.split("."))
    if (p / "__init__.py").exists():
        return p / "__init__.py"
    return p.with_suffix(".py") if p.with_suffix(".py").exists() else None


def _module(f: Path) -> str:
    parts = f.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _nodes(body: list[ast.stmt], anywhere: bool) -> list[ast.AST]:
    """Module-level statements (an `if` block's too), or with `anywhere` every node of the
    file outside `if TYPE_CHECKING:` blocks."""
    out: list[ast.AST] = []
    for n in body:
        if _type_checking(n) and anywhere:
            continue
        if isinstance(n, ast.If) and not anywhere:
            out += n.body + n.orelse
        elif anywhere:
            out += [m for c in ast.iter_child_nodes(n) if isinstance(c, ast.stmt)
                    for m in _nodes([c], True)] + [n]
        else:
            out.append(n)
    return out


def imports(f: Path, anywhere: bool = False) -> set[Path]:
    """The package files `f` imports at module level, or `anywhere` (functions too; type
    checkers' imports aside). A name taken from a package is its `__init__.py`; a submodule
    named in `from pkg import sub` is that file."""
    me = _module(f)
    pkg = me if f.name == "__init__.py" else me.rpartition(".")[0]
    nodes = _nodes(ast.parse(f.read_text()).body, anywhere)
    names = set()
    for n in nodes:
        if isinstance(n, ast.Import):
            names |= {a.name for a in n.names}
        elif isinstance(n, ast.ImportFrom):
            base = n.module or ""
            if n.level:
                up = pkg.split(".")[:len(pkg.split(".")) - n.level + 1]
                base = ".".join(up + ([n.module] if n.module else []))
            subs = {f"{base}.{a.name}" for a in n.names if _file(f"{base}.{a.name}")}
            names |= subs if len(subs) == len(n.names) else subs | {base}
    found = {_file(name) for name in names if name.split(".")[0] == "mlx_speech"}
    return found - {f, None}


def test_no_import_circles():
    files = sorted(PKG.rglob("*.py"))
    graph = {f: imports(f, anywhere=True) for f in files}
    state: dict[Path, int] = {}  # 1: on the current path, 2: done

    def visit(f: Path, path: list[Path]) -> None:
        state[f] = 1
        for g in sorted(graph[f]):
            if state.get(g) == 1:
                loop = path[path.index(g):] + [g]
                raise AssertionError("import circle: " + " -> ".join(
                    str(p.relative_to(ROOT)) for p in loop))
            if g not in state:
                visit(g, path + [g])
        state[f] = 2

    for f in files:
        if f not in state:
            visit(f, [f])


def family_files(family: str) -> set[Path]:
    """A family's files and the package files they import (in functions and for type checkers
    too), package faces outside it aside."""
    own = set((PKG / "models" / family).glob("*.py"))
    read = set(own)
    for f in own:
        read |= imports(f) | imports(f, anywhere=True)
    return {f for f in read if f in own or f.name != "__init__.py"}


def test_each_family_opens_at_most_ten_files():
    for family in FAMILIES:
        files = family_files(family)
        assert len(files) <= MAX_FILES, (
            f"{family} opens {len(files)} files from load to output (at most {MAX_FILES}): "
            + ", ".join(sorted(str(f.relative_to(PKG)) for f in files)))


def test_the_count_sees_what_a_family_imports():
    """The count follows a submodule named through its package, and leaves a face alone."""
    files = {str(f.relative_to(PKG)) for f in family_files("voxtral_realtime")}
    assert {"models/base.py", "models/loading.py", "models/stepper.py"} <= files
    assert "nn/__init__.py" not in files
    f = PKG / "models" / "loading.py"
    assert PKG / "hub.py" in imports(f)
