"""model_type -> implementing module; each exposes `load(folder)` and `weight_patterns`."""

from __future__ import annotations

import importlib

MODELS = {
    "voxtral_realtime": "mlx_speech.models.voxtral_realtime",
    "nemotron_asr_streaming": "mlx_speech.models.nemotron_streaming",
    "voxtral_tts": "mlx_speech.models.voxtral_tts",
    "moshi": "mlx_speech.models.moshi",
    "personaplex": "mlx_speech.models.moshi",  # the community MLX layout's config.json
    "silero_vad": "mlx_speech.models.silero_vad",  # voice activity (mlx-community layout too)
}
ARCHIVES = {".nemo": "nemotron_asr_streaming"}  # single-file checkpoints


def model_module(model_type: str):
    from .errors import CheckpointError

    if model_type not in MODELS:
        known = ", ".join(sorted(MODELS))
        raise CheckpointError(f"unsupported model type {model_type!r} (known: {known})")
    return importlib.import_module(MODELS[model_type])


def weight_patterns(model_type: str, folder) -> list[str]:
    return model_module(model_type).weight_patterns(folder)
