"""`.nemo` -> a transformers-layout folder (config.json, model.safetensors in the transformers
names and torch layouts, tokenizer.model; Nemotron 3.5 also processor_config.json, where
transformers keeps the prompt dictionary), for tools that read that layout. `mlx_speech.convert`
itself writes the converted layout (see the package docstring)."""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx

from mlx_speech.models.nemotron_streaming.weights import nemo_config_json, read_nemo


def convert_nemo(path: str | Path, out: str | Path) -> Path:
    """Write a transformers-layout folder (config.json, model.safetensors,
    tokenizer.model) that `load()` reads; tensors keep their torch layouts."""
    import json

    config, weights, tok = read_nemo(path)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    config = nemo_config_json(config)
    if "prompt_dictionary" in config:  # the processor's, in transformers
        proc = {k: config.pop(k) for k in ("prompt_dictionary",)}
        proc.update(num_prompts=config["num_prompts"],
                    supported_num_lookahead_tokens=config["supported_num_lookahead_tokens"])
        (out / "processor_config.json").write_text(json.dumps(proc, indent=2))
    (out / "config.json").write_text(json.dumps(config, indent=2))
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "pt"})
    (out / "tokenizer.model").write_bytes(tok)
    return out
