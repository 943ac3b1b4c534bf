"""model_type -> the family class that loads it: the one place a family registers.

Each family's module exposes `load(folder, **options)` and `weight_patterns(folder)`; its class
carries the model contract (`mlx_speech/models/base.py`: kind, family, name, latency...), which
front doors read here, before anything is loaded, and on the loaded model after.
"""

from __future__ import annotations

import importlib

from .models.base import COMMANDS, KIND_NAMES

MODELS = {
    "voxtral_realtime": "mlx_speech.models.voxtral_realtime:VoxtralRealtime",
    "nemotron_asr_streaming": "mlx_speech.models.nemotron_streaming:NemotronStreaming",
    # Nemotron 3.5: the same family with a language prompt (nemotron_asr: mlx-audio's layout)
    "nemotron3_5_asr": "mlx_speech.models.nemotron_streaming:Nemotron35Streaming",
    "nemotron_asr": "mlx_speech.models.nemotron_streaming:Nemotron35Streaming",
    "voxtral_tts": "mlx_speech.models.voxtral_tts:VoxtralTTS",
    "moshi": "mlx_speech.models.moshi:Moshi",
    "personaplex": "mlx_speech.models.moshi:Moshi",  # the community MLX layout's config.json
    "silero_vad": "mlx_speech.models.silero_vad:SileroVAD",  # mlx-community layout too
    "sortformer": "mlx_speech.models.sortformer:SortformerDiarizer",  # .nemo, mlx-audio
}
ARCHIVES = {".nemo": "nemotron_asr_streaming"}  # single-file checkpoints (default family)


def archive_type(path) -> str:
    """The model type of a single-file checkpoint: a `.nemo` holding a Sortformer diarizer
    (its model_config.yaml has `sortformer_modules`), Nemotron 3.5 ASR (a language prompt
    dictionary in its `model_defaults`) or, otherwise, Nemotron ASR."""
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
                        if isinstance(cfg, dict) and isinstance(cfg.get("model_defaults"), dict) \
                                and cfg["model_defaults"].get("prompt_dictionary"):
                            return "nemotron3_5_asr"
                        break
        except (tarfile.TarError, OSError, yaml.YAMLError):
            pass  # the family's loader reports the unreadable archive
    return ARCHIVES[path.suffix]


def model_module(model_type: str):
    """The family's module (its `load` and `weight_patterns`); imports code, loads nothing."""
    from .errors import CheckpointError

    if model_type not in MODELS:
        known = ", ".join(sorted(MODELS))
        raise CheckpointError(f"unsupported model type {model_type!r} (known: {known})")
    return importlib.import_module(MODELS[model_type].split(":")[0])


def family(model_type: str) -> type:
    """The family class of `model_type`, whose class attributes are the contract's values
    that need no weights (`kind`, `name`, `latency`...)."""
    return getattr(model_module(model_type), MODELS[model_type].split(":")[1])


def weight_patterns(model_type: str, folder) -> list[str]:
    return model_module(model_type).weight_patterns(folder)


def check_load_options(model_type: str, configs, options: dict) -> None:
    """Load options checked against a checkpoint's configs before any weights are read or
    downloaded (`configs`: the folder holding them, or the single-file archive), by the
    family's `check_load_options(configs, **options)` where it has one (Nemotron 3.5:
    `language`)."""
    check = getattr(model_module(model_type), "check_load_options", None)
    if check is not None:
        check(configs, **options)


def kind_of(model_type: str) -> str:
    """'asr', 'tts', 'duplex', 'vad' or 'diarizer' for a model type of `MODELS`."""
    return family(model_type).kind


def name_of(model_type: str) -> str:
    """How messages name a model of this type ("Voxtral TTS", ...)."""
    return family(model_type).name


def wrong_kind(what: str, model_type: str, want) -> str | None:
    """None when `model_type` is one of the kinds in `want` (a kind or a tuple of kinds), else
    the one-line error: `X is a Voxtral TTS model; use mlx_speech.say`."""
    want = (want,) if isinstance(want, str) else tuple(want)
    kind = kind_of(model_type)
    if kind in want:
        return None
    wanted = " or ".join(KIND_NAMES[k] for k in want)
    hint = COMMANDS.get(kind)
    return (f"{what} is a {name_of(model_type)} model, not {wanted}"
            + (f"; {hint}" if hint else ""))


def check_loaded(what: str, model, want) -> None:
    """The same check on a loaded model (its `kind`), for models that did not come through
    `mlx_speech.load(kind=...)`."""
    from .errors import CheckpointError

    want = (want,) if isinstance(want, str) else tuple(want)
    kind = getattr(model, "kind", None)
    if kind in want:
        return
    wanted = " or ".join(KIND_NAMES[k] for k in want)
    if kind not in KIND_NAMES:
        raise CheckpointError(f"{what} is not a {wanted} model")
    hint = COMMANDS.get(kind)
    raise CheckpointError(f"{what} is a {KIND_NAMES[kind]} model, not {wanted}"
                          + (f"; {hint}" if hint else ""))


def check_session_options(model_type: str, folder, what: str, options: dict) -> None:
    """The session options a front door will use (`{"voice": ..., "role": ...}`, None values
    ignored), checked against the checkpoint's files before any weights are read, by the
    family class's `check_session_options(folder, what, **options)` where it has one (it
    checks what the files present allow: a hub repo's configs come before its voices)."""
    given = {k: v for k, v in options.items() if v is not None}
    hook = getattr(family(model_type), "check_session_options", None)
    if given and hook is not None:
        hook(folder, what, **given)
