"""Reading mlx_speech's own converted layout (written by `mlx_speech.convert`, documented there).

A converted folder holds `mlx_speech.json` (the manifest), the family's own config file(s) and
tokenizer, and weights already in our module names, layouts and dtypes, possibly quantized. Each
weights file carries the safetensors metadata `{"format": "mlx_speech", "version": "1"}`; a file
with it is loaded as it is: no renaming, no weight-norm folding, no transposes, no casts. The
families ask `is_converted(files)` where they would otherwise remap.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

from .errors import CheckpointError

MANIFEST = "mlx_speech.json"
FORMAT = "mlx_speech"
VERSION = 1


def file_metadata(path: str | Path) -> dict:
    """The `__metadata__` of a safetensors file (reads only its header)."""
    try:
        with open(path, "rb") as f:
            raw = f.read(8)
            if len(raw) < 8:
                raise ValueError("file too short")
            (n,) = struct.unpack("<Q", raw)
            if n > 100 << 20:
                raise ValueError("header too large")
            header = json.loads(f.read(n))
    except (OSError, ValueError) as e:
        raise CheckpointError(f"cannot read weights {path}: {e}") from None
    meta = header.get("__metadata__") if isinstance(header, dict) else None
    return meta if isinstance(meta, dict) else {}


def is_converted(files: list[Path]) -> bool:
    """True when the weights are in our converted layout (all files, or none, must be)."""
    marked = []
    for f in files:
        meta = file_metadata(f)
        ours = meta.get("format") == FORMAT
        if ours and int(meta.get("version", 0)) > VERSION:
            raise CheckpointError(f"{f} was written by a newer mlx_speech (layout version "
                                  f"{meta['version']}, this one reads {VERSION}); upgrade")
        marked.append(ours)
    if any(marked) and not all(marked):
        raise CheckpointError(f"{files[marked.index(False)]} is not in the converted layout "
                              "but other weight files beside it are")
    return bool(files) and all(marked)


def read_manifest(folder: str | Path) -> dict | None:
    """The folder's `mlx_speech.json`, or None when it is not a converted folder."""
    p = Path(folder) / MANIFEST
    if not p.is_file():
        return None
    try:
        m = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise CheckpointError(f"cannot read {p}: {e}") from None
    if not isinstance(m, dict) or m.get("format") != FORMAT or "model_type" not in m:
        raise CheckpointError(f"{p} is not an mlx_speech manifest")
    if int(m.get("version", 0)) > VERSION:
        raise CheckpointError(f"{p}: layout version {m['version']} is newer than this "
                              f"mlx_speech reads ({VERSION}); upgrade")
    return m


def weight_files(folder: str | Path, part: str = "model") -> list[Path] | None:
    """The weights file of `part` named by the manifest (None: not a converted folder)."""
    m = read_manifest(folder)
    if m is None:
        return None
    name = (m.get("weights") or {}).get(part)
    if not name:
        raise CheckpointError(f"{Path(folder) / MANIFEST} names no {part!r} weights")
    f = Path(folder) / name
    if not f.is_file():
        raise CheckpointError(f"{folder} has no {name} (named in {MANIFEST})")
    return [f]
