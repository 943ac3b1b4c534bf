"""Other layouts' configs -> our config.json (the transformers keys: `nemotron_asr_streaming`, or
`nemotron3_5_asr` with the language prompt's, plus its `prompt_dictionary`): NeMo's
model_config.yaml, a transformers folder's processor_config.json (Nemotron 3.5's languages),
and mlx-audio's `nemotron_asr` config.json (NeMo sections flattened; its MLX weights keep
NeMo's names, read by weights.remap_nemo_mlx)."""

from __future__ import annotations

import json
from pathlib import Path

from ...errors import CheckpointError, MlxSpeechError
from .languages import AUTO, prompt_dictionary, release_prompts
from .nemo import hf_config


def nemo_prompt_config(nemo: dict) -> dict:
    """What a NeMo model_config.yaml adds to the transformers config of a prompted model
    (empty for the English seed model): the transformers keys plus the dictionary."""
    md = nemo.get("model_defaults") or {}
    if not md.get("prompt_dictionary"):
        return {}
    prompts = prompt_dictionary(md["prompt_dictionary"])
    hidden = md.get("enc_hidden") or (nemo.get("encoder") or {}).get("d_model", 1024)
    return {"model_type": "nemotron3_5_asr", "num_prompts": int(md.get("num_prompts", 128)),
            "prompt_intermediate_size": 2 * int(hidden),  # NeMo's prompt_kernel width
            "prompt_dictionary": prompts, "default_prompt_id": prompts.get(AUTO)}


def nemo_config_json(nemo: dict) -> dict:
    """NeMo model_config.yaml -> our config.json: the transformers keys (`nemotron3_5_asr` with
    the prompt's, or the seed's `nemotron_asr_streaming`) and the prompt dictionary."""
    return {**hf_config(nemo), **nemo_prompt_config(nemo)}


def with_folder_prompts(folder, config: dict) -> dict:
    """A transformers-layout Nemotron 3.5 config with its prompt dictionary: transformers keeps
    it in processor_config.json (the release's when that file is missing, as transformers
    does); our converted folders keep it in config.json."""
    if config.get("model_type") != "nemotron3_5_asr" or "prompt_dictionary" in config:
        return config
    proc, prompts = Path(folder) / "processor_config.json", None
    if proc.exists():
        try:
            prompts = json.loads(proc.read_text(encoding="utf-8")).get("prompt_dictionary")
        except (OSError, ValueError, AttributeError) as e:
            raise MlxSpeechError(f"cannot read {proc}: {e}") from None
    prompts = prompt_dictionary(prompts) if prompts else release_prompts()
    return {"num_prompts": 128, "default_prompt_id": prompts.get(AUTO), **config,
            "prompt_dictionary": prompts}


def mlx_audio_config_json(c: dict) -> dict:
    """mlx-audio's `nemotron_asr` config.json (its converter's: `encoder` as NeMo's, `prompt`,
    flattened `decoder` / `joint`, `max_symbols`, `default_language`) -> ours; the
    `quantization` it declares is kept."""
    try:
        enc, dec, joint = c["encoder"], c["decoder"], c["joint"]
        prompt = c.get("prompt") or {}
        nemo = {
            "encoder": enc,
            "decoder": {"vocab_size": dec["vocab_size"],
                        "prednet": {"pred_hidden": dec["pred_hidden"],
                                    "pred_rnn_layers": dec.get("pred_rnn_layers", 2)}},
            "joint": {"jointnet": {"joint_hidden": joint.get("joint_hidden",
                                                             dec["pred_hidden"])}},
            "decoding": {"greedy": {"max_symbols": c.get("max_symbols", 10)}},
        }
    except (KeyError, TypeError) as e:
        raise CheckpointError(f"mlx-audio nemotron_asr config without {e}") from None
    if prompt.get("num_prompts") and prompt.get("prompt_dictionary"):
        nemo["model_defaults"] = {"num_prompts": prompt["num_prompts"],
                                  "enc_hidden": enc.get("d_model"),
                                  "prompt_dictionary": prompt["prompt_dictionary"]}
    out = nemo_config_json(nemo)
    if "prompt_dictionary" in out:
        out["prompt_intermediate_size"] = prompt.get("prompt_hidden",
                                                     out["prompt_intermediate_size"])
        default = c.get("default_language", AUTO)
        out["default_prompt_id"] = out["prompt_dictionary"].get(default,
                                                                out["default_prompt_id"])
    for key in ("quantization", "quantization_config"):
        if key in c:
            out[key] = c[key]
    return out
