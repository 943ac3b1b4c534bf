"""Mimi, Kyutai's streaming neural audio codec (24 kHz <-> 12.5 Hz codes), in MLX."""

from __future__ import annotations

import os
from pathlib import Path

import mlx.core as mx

from ...errors import CheckpointError
from ..loading import fill, read_json, read_weights
from .config import MIMI_FILE, MimiConfig, QuantizerConfig, SeanetConfig
from .model import DecoderState, EncoderState, Mimi, MimiState
from .weights import remap

__all__ = ["DecoderState", "EncoderState", "Mimi", "MimiConfig", "MimiState",
           "QuantizerConfig", "SeanetConfig", "load", "remap"]


def _find(path: Path) -> tuple[Path, dict | None]:
    if path.is_file():
        return path, None
    cfg = read_json(path / "config.json", required=False) or {}
    name = cfg.get("mimi_name", MIMI_FILE)
    if not (path / name).exists():
        raise CheckpointError(f"{path} has no Mimi weights ({name})")
    # Kyutai's config.json may name a separate Mimi json (moshi CheckpointInfo)
    cfg_name = cfg.get("mimi_config_name")
    return path / name, read_json(path / cfg_name) if cfg_name else None


def load(path_or_folder: str | os.PathLike, config: MimiConfig | dict | None = None,
         num_codebooks: int = 8, dtype: mx.Dtype | None = None) -> Mimi:
    """Mimi from a safetensors file or a folder holding one (Kyutai layout).

    `config`: a MimiConfig or Kyutai's Mimi json dict; default the released mimi_202407.
    Weights are memory-mapped; every checkpoint key must map to a parameter and vice versa.
    Kyutai runs Mimi in float32 (the default here).
    """
    file, found_cfg = _find(Path(path_or_folder).expanduser())
    if config is None:
        config = found_cfg or {}
    cfg = config if isinstance(config, MimiConfig) else MimiConfig.from_dict(config)
    model = Mimi(cfg, num_codebooks=num_codebooks)
    weights, converted = read_weights([file])  # converted: in our names and layouts already
    fill(model, weights, file, converted=converted, remap=lambda w, _: remap(w, cfg),
         dtype=dtype)
    return model
