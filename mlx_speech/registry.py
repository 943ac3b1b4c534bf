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


# What each model type is (`model.kind` of the loaded model says the same), how to name it in
# a message, and the command for each kind.
KINDS = {"voxtral_realtime": "asr", "nemotron_asr_streaming": "asr", "voxtral_tts": "tts",
         "moshi": "duplex", "personaplex": "duplex", "silero_vad": "vad",
         "sortformer": "diarizer"}
NAMES = {"voxtral_realtime": "Voxtral Realtime speech-to-text",
         "nemotron_asr_streaming": "Nemotron streaming speech-to-text",
         "voxtral_tts": "Voxtral TTS", "moshi": "Moshi / PersonaPlex full-duplex",
         "personaplex": "PersonaPlex full-duplex", "silero_vad": "Silero VAD",
         "sortformer": "Sortformer speaker diarization"}
KIND_NAMES = {"asr": "speech-to-text", "tts": "text-to-speech", "duplex": "full-duplex",
              "vad": "voice activity detection", "diarizer": "speaker diarization"}
COMMANDS = {"asr": "use mlx_speech.transcribe", "tts": "use mlx_speech.say",
            "duplex": "use mlx_speech.chat", "vad": "give it to --vad"}


def kind_of(model_type: str) -> str:
    """'asr', 'tts', 'duplex', 'vad' or 'diarizer' for a model type of `MODELS`."""
    model_module(model_type)  # unknown types: the same error as loading
    return KINDS[model_type]


def wrong_kind(what: str, model_type: str, want) -> str | None:
    """None when `model_type` is one of the kinds in `want` (a kind or a tuple of kinds), else
    the one-line error: `X is a Voxtral TTS model; use mlx_speech.say`."""
    want = (want,) if isinstance(want, str) else tuple(want)
    kind = kind_of(model_type)
    if kind in want:
        return None
    wanted = " or ".join(KIND_NAMES[k] for k in want)
    hint = COMMANDS.get(kind)
    return (f"{what} is a {NAMES.get(model_type, model_type)} model, not {wanted}"
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
