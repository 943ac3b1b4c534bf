"""Reading and writing audio files; soundfile is imported only when used."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

from mlx_speech.audio.resample import resample
from mlx_speech.errors import AudioError, MlxSpeechError

WRITE_FORMATS = {
    "wav": ("WAV", "PCM_16"),
    "flac": ("FLAC", "PCM_16"),
    "ogg": ("OGG", "VORBIS"),
}


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr)


def check_audio(samples, name: str = "audio") -> np.ndarray:
    """In-memory samples as float32 mono 1-D; (n, channels) is mixed down."""
    x = np.asarray(samples)
    if np.issubdtype(x.dtype, np.signedinteger):  # integer PCM -> [-1, 1)
        x = x.astype(np.float32) / float(-np.iinfo(x.dtype).min)
    try:
        x = x.astype(np.float32, copy=False)
    except (TypeError, ValueError):
        raise AudioError(f"{name} must be numeric samples, got {x.dtype}") from None
    if x.ndim == 2:
        x = x.mean(axis=1, dtype=np.float32)
    elif x.ndim != 1:
        raise AudioError(f"{name} must be 1-D (or samples x channels), got {x.shape}")
    if not np.isfinite(x).all():
        raise AudioError(f"{name} contains NaN or infinite samples")
    return x


def load_audio(
    path: str | Path,
    sample_rate: int | None = None,
    *,
    log: Callable[[str], None] | None = None,
) -> tuple[np.ndarray, int]:
    """Read a file as float32 mono, resampled to `sample_rate` when given."""
    import soundfile as sf

    log = log or _stderr
    path = Path(path)
    if not path.exists():
        raise AudioError(f"audio file not found: {path}")
    if path.is_dir():
        raise AudioError(f"{path} is a folder, not an audio file")
    if not os.access(path, os.R_OK):
        raise AudioError(f"cannot read {path}: permission denied")
    try:
        data, sr = sf.read(str(path), dtype="float32", always_2d=True)
    except (sf.SoundFileError, RuntimeError, TypeError, ValueError) as e:
        raise AudioError(
            f"cannot read {path}: format not supported or file is corrupt ({e})"
        ) from None
    except OSError as e:
        raise AudioError(f"cannot read {path}: {e.strerror or e}") from None
    if data.shape[1] > 1:
        log(f"{path.name}: mixing {data.shape[1]} channels down to mono")
    x = data.mean(axis=1, dtype=np.float32) if data.shape[1] > 1 else data[:, 0]
    if x.size == 0:
        raise AudioError(f"{path} is empty (0 samples)")
    if not np.isfinite(x).all():
        raise AudioError(f"{path} contains NaN or infinite samples")
    if sample_rate is not None and sr != sample_rate:
        log(f"{path.name}: resampling {sr} Hz -> {sample_rate} Hz")
        x, sr = resample(x, sr, sample_rate), sample_rate
    return np.ascontiguousarray(x), sr


def write_audio(
    path: str | Path, samples, sample_rate: int, format: str | None = None
) -> None:
    """Write wav/flac (16-bit PCM) or ogg (Vorbis); format defaults to the suffix."""
    import soundfile as sf

    path = Path(path)
    fmt = (format or path.suffix.lstrip(".")).lower()
    if fmt not in WRITE_FORMATS:
        raise MlxSpeechError(
            f"cannot write {path}: unsupported audio format {fmt or '(none)'!r}, "
            "use .wav, .flac or .ogg"
        )
    x = np.asarray(samples, dtype=np.float32)
    if not np.isfinite(x).all():
        raise AudioError(f"cannot write {path}: samples contain NaN or infinite values")
    if not path.parent.is_dir():
        raise MlxSpeechError(
            f"cannot write {path}: folder {path.parent} does not exist"
        )
    major, subtype = WRITE_FORMATS[fmt]
    try:
        sf.write(str(path), np.clip(x, -1.0, 1.0), sample_rate, subtype, format=major)
    except (sf.SoundFileError, RuntimeError, OSError, TypeError, ValueError) as e:
        raise MlxSpeechError(f"cannot write {path}: {e}") from None
