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
    "sortformer": "mlx_speech.models.sortformer",  # speaker diarization (.nemo, mlx-audio)
}
ARCHIVES = {".nemo": "nemotron_asr_streaming"}  # single-file checkpoints (default family)


def archive_type(path) -> str:
    """The model type of a single-file checkpoint: a `.nemo` holding a Sortformer diarizer
    (its model_config.yaml has `sortformer_modules`) or, otherwise, Nemotron ASR."""
    from pathlib import Path

    path = Path(path)
    if path.suffix == ".nemo":
        import tarfile

        import yaml

        try:
            with tarfile.open(path, "r:*") as tar:
                for m in tar.getmembers():
                    if m.isfile() and Path(m.name).name == "model_config.yaml":
                        cfg = yaml.safe_load(tar.extractfile(m).read())
                        if isinstance(cfg, dict) and "sortformer_modules" in cfg:
                            return "sortformer"
                        break
        except (tarfile.TarError, OSError, yaml.YAMLError):
            pass  # the family's loader reports the unreadable archive
    return ARCHIVES[path.suffix]


def model_module(model_type: str):
    from .errors import CheckpointError

    if model_type not in MODELS:
        known = ", ".join(sorted(MODELS))
        raise CheckpointError(f"unsupported model type {model_type!r} (known: {known})")
    return importlib.import_module(MODELS[model_type])


def weight_patterns(model_type: str, folder) -> list[str]:
    return model_module(model_type).weight_patterns(folder)
