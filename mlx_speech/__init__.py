"""mlx_speech: MLX-native realtime speech models."""

from __future__ import annotations

__version__ = "0.1.0"

DEFAULT_ASR_MODEL = "mistralai/Voxtral-Mini-4B-Realtime-2602"


def load(path_or_repo: str = DEFAULT_ASR_MODEL, **kwargs):
    """Load a model from a local folder or a Hugging Face repo id.

    The type comes from the checkpoint's own config (never the repo name); the
    result is that model's wrapper, e.g. `VoxtralRealtime` with `transcribe()`
    and `session()`.
    """
    from .hub import detect_model_type, resolve
    from .registry import model_module, weight_patterns

    folder = resolve(path_or_repo, weight_patterns)
    return model_module(detect_model_type(folder)).load(folder, **kwargs)


__all__ = ["DEFAULT_ASR_MODEL", "__version__", "load"]
