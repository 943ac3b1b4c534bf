"""mlx_speech: MLX-native realtime speech models."""

from __future__ import annotations

__version__ = "0.1.0"

DEFAULT_ASR_MODEL = "mistralai/Voxtral-Mini-4B-Realtime-2602"

from ._subpackages import install as _install_subpackages  # noqa: E402
from .errors import DISTRIBUTION  # noqa: E402  (what pip installs this project as)

_install_subpackages()  # convert/ as mlx_speech.convert in a source checkout


def load(path_or_repo: str = DEFAULT_ASR_MODEL, *, kind: str | tuple[str, ...] | None = None,
         check=None, log=None, options: dict | None = None, **kwargs):
    """Load a model from a local folder or a Hugging Face repo id.

    The type comes from the checkpoint's own config (never the repo name); the
    result is that model's wrapper, which says what it is through the model contract
    (`mlx_speech/models/base.py`: `kind`, `family`, `sample_rate`, `latency`...):
    speech-to-text ("asr":
    `VoxtralRealtime`, `NemotronStreaming`: `transcribe()`, `session()`), text-to-speech
    ("tts": `VoxtralTTS`: `generate()`, `stream()`, `voices`), full duplex ("duplex": `Moshi`,
    also PersonaPlex: `session().step()`) or voice activity detection ("vad": `SileroVAD`, see
    `mlx_speech.models.silero_vad.load_vad`). A `.nemo` archive path also works.
    Quantized MLX checkpoints load as they are; `quantize=4|6|8` (`group_size=64`)
    quantizes a full-precision one while loading.

    `kind` (one kind or a tuple): the kinds the caller can use; another kind raises
    `CheckpointError` from the config files, before any weights are downloaded or read.
    `check(model_type)` runs at the same point (it raises to stop: a caller's own checks that
    depend on the model type). `log(line)` hears how much a hub download is about to fetch,
    and `loading ...` once the checks pass. `options`: the session options the caller will use
    (e.g. `{"voice": "x", "role": "..."}`), checked against the checkpoint's own files by its
    family (`registry.check_session_options`) at the same points, so a voice it lacks is refused
    before the weights are read.
    """
    from .registry import model_module, name_of

    model_type, folder = locate(path_or_repo, kind=kind, check=check, log=log, options=options,
                                **kwargs)
    if log is not None:
        log(f"loading {path_or_repo} ({name_of(model_type)})")
    return model_module(model_type).load(folder, **kwargs)


def locate(path_or_repo: str = DEFAULT_ASR_MODEL, *, kind: str | tuple[str, ...] | None = None,
           check=None, log=None, options: dict | None = None, **kwargs):
    """Everything `load` does before reading weights: (model type, local path of the
    checkpoint). The checks of `load` run (`kind`, `check`, the options the family's loader
    takes and their values against the checkpoint's configs), a hub repo's files are
    downloaded, nothing is loaded: `load(path, **kwargs)` later loads the same model (a server
    that loads models on first use checks them at start)."""
    import inspect
    from pathlib import Path

    from .errors import CheckpointError, MlxSpeechError
    from .hub import detect_model_type, resolve
    from .registry import (
        ARCHIVES,
        archive_type,
        check_load_options,
        check_session_options,
        model_module,
        name_of,
        weight_patterns,
        wrong_kind,
    )

    def checks(model_type: str, folder=None) -> None:
        if kind is not None and (msg := wrong_kind(str(path_or_repo), model_type, kind)):
            raise CheckpointError(msg)
        if check is not None:
            check(model_type)
        load = model_module(model_type).load  # options it does not take: refused here
        params = inspect.signature(load).parameters
        if not any(q.kind is q.VAR_KEYWORD for q in params.values()):
            unknown = sorted(set(kwargs) - set(params))
            if unknown:  # e.g. a Voxtral-only option for another model
                raise MlxSpeechError(f"{name_of(model_type)} models take no "
                                     f"{', '.join(unknown)} option")
        if folder is not None:  # option values against the checkpoint's own files
            check_load_options(model_type, folder, kwargs)
            if options:
                check_session_options(model_type, folder, str(path_or_repo), options)

    p = Path(path_or_repo).expanduser()
    if p.is_file() and p.suffix in ARCHIVES:  # e.g. a NeMo .nemo archive
        model_type, folder = archive_type(p), p
    else:
        folder = resolve(path_or_repo, weight_patterns, check=checks, log=log)
        # a hub repo holding one .nemo archive resolves to that file
        model_type = archive_type(folder) if folder.is_file() else detect_model_type(folder)
    checks(model_type, folder)
    return model_type, folder


__all__ = ["DEFAULT_ASR_MODEL", "DISTRIBUTION", "__version__", "load", "locate"]
