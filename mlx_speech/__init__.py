"""mlx_speech: MLX-native realtime speech models."""

from __future__ import annotations

__version__ = "0.1.0"

DEFAULT_ASR_MODEL = "mistralai/Voxtral-Mini-4B-Realtime-2602"

from ._subpackages import install as _install_subpackages  # noqa: E402

_install_subpackages()  # convert/ as mlx_speech.convert in a source checkout


def load(path_or_repo: str = DEFAULT_ASR_MODEL, **kwargs):
    """Load a model from a local folder or a Hugging Face repo id.

    The type comes from the checkpoint's own config (never the repo name); the
    result is that model's wrapper: speech-to-text (`VoxtralRealtime`,
    `NemotronStreaming`: `transcribe()`, `session()`), text-to-speech
    (`VoxtralTTS`: `generate()`, `stream()`, `voices`) or full duplex (`Moshi`,
    also PersonaPlex: `session().step()`) or voice activity detection (`SileroVAD`, see
    `mlx_speech.models.silero_vad.load_vad`). A `.nemo` archive path also works.
    Quantized MLX checkpoints load as they are; `quantize=4|6|8` (`group_size=64`)
    quantizes a full-precision one while loading.
    """
    import inspect
    from pathlib import Path

    from .errors import MlxSpeechError
    from .hub import detect_model_type, resolve
    from .registry import ARCHIVES, model_module, weight_patterns

    p = Path(path_or_repo).expanduser()
    if p.is_file() and p.suffix in ARCHIVES:  # e.g. a NeMo .nemo archive
        return model_module(ARCHIVES[p.suffix]).load(p, **kwargs)
    folder = resolve(path_or_repo, weight_patterns)
    kind = detect_model_type(folder)
    loader = model_module(kind).load
    unknown = sorted(set(kwargs) - set(inspect.signature(loader).parameters))
    if unknown:  # e.g. a Voxtral-only option for another model
        raise MlxSpeechError(f"{kind} models take no {', '.join(unknown)} option")
    return loader(folder, **kwargs)


__all__ = ["DEFAULT_ASR_MODEL", "__version__", "load"]
