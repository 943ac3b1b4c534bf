"""`.nemo` -> a transformers-layout folder (config.json, model.safetensors in the transformers
names and torch layouts, tokenizer.model), for tools that read that layout. `mlx_speech.convert`
itself writes the converted layout (see the package docstring)."""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx

from mlx_speech.models.nemotron_streaming.nemo import hf_config, read_nemo


def convert_nemo(path: str | Path, out: str | Path) -> Path:
    """Write a transformers-layout folder (config.json, model.safetensors,
    tokenizer.model) that `load()` reads; tensors keep their torch layouts."""
    import json

    config, weights, tok = read_nemo(path)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(hf_config(config), indent=2))
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "pt"})
    (out / "tokenizer.model").write_bytes(tok)
    return out
