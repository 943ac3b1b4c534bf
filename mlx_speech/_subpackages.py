"""Top-level source folders that pip installs as subpackages of mlx_speech.

pyproject.toml maps them with setuptools' package-dir (`"mlx_speech.convert" = "convert"`), so a
wheel holds them under `mlx_speech/` and an editable install's finder maps them too. A source
checkout put on sys.path some other way (`PYTHONPATH=.`, or an editable install made from another
checkout or before the mapping existed) has no such map: `import mlx_speech.convert` would fail,
or find a stale copy. This finder, active only when the package runs from a source tree (the
folder sits beside `mlx_speech/` and is not inside it), maps exactly these names and nothing
else. Keep SOURCE_TREE equal to pyproject's package-dir table (tests/project/test_layout.py checks).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

SOURCE_TREE = {"mlx_speech.convert": "convert", "mlx_speech.app": "apps/menubar"}


class _SourceTreeFinder:
    def __init__(self, mapping: dict[str, Path]):
        self.mapping = mapping

    def find_spec(self, fullname, path=None, target=None):
        d = self.mapping.get(fullname)
        if d is None:
            return None
        return importlib.util.spec_from_file_location(
            fullname, d / "__init__.py", submodule_search_locations=[str(d)])


def install() -> None:
    pkg = Path(__file__).resolve().parent
    root = pkg.parent
    found = {}
    for name, folder in SOURCE_TREE.items():
        inside = pkg / name.rsplit(".", 1)[1]
        installed = inside.exists() or inside.with_suffix(".py").exists()
        if not installed and (root / folder / "__init__.py").is_file():
            found[name] = root / folder
    if found and not any(isinstance(f, _SourceTreeFinder) for f in sys.meta_path):
        # first: an editable finder of another checkout must not answer for these names
        sys.meta_path.insert(0, _SourceTreeFinder(found))
