"""Reading and writing audio files; soundfile is imported only when used."""

from __future__ import annotations

import contextlib
import os
import secrets
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from mlx_speech.audio.resample import resample
from mlx_speech.errors import AudioError, MlxSpeechError

# name -> (soundfile major format, subtype, sample rates the codec takes or None for any)
WRITE_FORMATS = {
    "wav": ("WAV", "PCM_16", None),
    "flac": ("FLAC", "PCM_16", None),
    "ogg": ("OGG", "VORBIS", None),
    "opus": ("OGG", "OPUS", (8000, 12000, 16000, 24000, 48000)),
    "mp3": ("MP3", "MPEG_LAYER_III",
            (8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000)),
    "pcm": ("RAW", "PCM_16", None),  # 16-bit little-endian mono, no header; written by numpy
}
_ALIASES = {"raw": "pcm", "wave": "wav", "oga": "ogg"}


def warn(msg: str) -> None:
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
    """Read a file as float32 mono, resampled to `sample_rate` when given.

    Decoded in blocks (`mlx_speech.audio.decode`): the file is mixed down and resampled on the
    way, so memory holds the result, never the file at its own rate and channels. Any format
    `decode` reads (m4a, webm... with PyAV)."""
    from mlx_speech.audio.decode import decode

    blocks = decode(path, sample_rate, log=log or warn)
    info, rate = blocks.info, blocks.sample_rate
    if info.frames is None or info.reader != "soundfile":  # a length the header estimates
        return np.concatenate(list(blocks)), rate
    out = np.empty(-(-info.frames * rate // info.sample_rate), np.float32)  # resample's length
    n = 0
    for b in blocks:  # filled in place: the result, never twice its size
        out[n: n + len(b)] = b
        n += len(b)
    return out[:n], rate


def audio_at(audio, rate: int, sample_rate: int | None = None) -> np.ndarray:
    """Float32 mono samples at `rate`: a file path is read (`load_audio`), in-memory samples
    at `sample_rate` (default: `rate`) are checked (`check_audio`) and resampled."""
    if isinstance(audio, (str, Path)):
        return load_audio(audio, rate)[0]
    x = check_audio(audio)
    return x if sample_rate in (None, rate) else resample(x, sample_rate, rate)


def check_readable(path: str | Path) -> None:
    """Raise AudioError now if `path` is not an audio file `load_audio` can read: it exists, is
    readable, its header decodes and it holds samples; a file stored as floats is scanned for
    NaN or infinite samples (block by block). Commands call it before they load a model."""
    from mlx_speech.audio.decode import check_samples

    check_samples(path)


def output_format(path: str | Path, format: str | None = None) -> str:
    """The WRITE_FORMATS name for `format`, else for the file suffix; raises if unsupported."""
    path = Path(path)
    fmt = (format or path.suffix.lstrip(".")).lower()
    fmt = _ALIASES.get(fmt, fmt)
    if fmt not in WRITE_FORMATS:
        what = f"format {fmt!r}" if fmt else "format (the file name has no extension)"
        raise MlxSpeechError(f"cannot write {path}: unsupported audio {what}; "
                             f"use one of {', '.join(WRITE_FORMATS)}")
    major, subtype, _ = WRITE_FORMATS[fmt]
    if major != "RAW":
        import soundfile as sf

        if major not in sf.available_formats() or subtype not in sf.available_subtypes(major):
            need = {"mp3": "1.1 with LAME", "opus": "1.0.29 with Opus"}.get(fmt, "")
            raise MlxSpeechError(
                f"cannot write {fmt}: the installed libsndfile "
                f"({sf.__libsndfile_version__}) has no {fmt} encoder"
                + (f" (needs libsndfile >= {need})" if need else "") + "; use wav or flac")
    return fmt


def _make_temp(path: Path) -> Path:
    """An empty file next to `path` (same folder, so a rename is atomic; same suffix)."""
    if path.is_dir():
        raise MlxSpeechError(f"cannot write {path}: it is a folder")
    if not path.parent.is_dir():
        raise MlxSpeechError(f"cannot write {path}: folder {path.parent} does not exist")
    tmp = path.parent / f".{path.stem}.{os.getpid()}.{secrets.token_hex(4)}.tmp{path.suffix}"
    try:  # mode 0666 minus the umask, like a plain open()
        os.close(os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
    except OSError as e:
        raise MlxSpeechError(f"cannot write {path}: {e.strerror or e}") from None
    return tmp


@contextlib.contextmanager
def atomic_output(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path next to `path`; when the block succeeds it replaces `path`.

    A failure (or Ctrl-C) removes the temporary file, so `path` is never left
    truncated or half-written.
    """
    path = Path(path)
    tmp = _make_temp(path)
    try:
        yield tmp
        try:
            os.replace(tmp, path)
        except OSError as e:
            raise MlxSpeechError(f"cannot write {path}: {e.strerror or e}") from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def check_writable(path: str | Path) -> None:
    """Raise MlxSpeechError now if `path` could not be written later (touches nothing)."""
    _make_temp(Path(path)).unlink()


def write_audio(
    path: str | Path, samples, sample_rate: int, format: str | None = None
) -> None:
    """Write mono `samples` (float, nominally [-1, 1]) in one of WRITE_FORMATS.

    The format defaults to the file suffix. wav/flac/pcm are 16-bit; pcm is
    headerless little-endian. opus and mp3 take only some rates, so other rates
    are resampled (opus to 48 kHz, mp3 to the next rate up); nothing else is.
    The file appears only once complete (written aside, then renamed).
    """
    path = Path(path)
    fmt = output_format(path, format)
    x = np.asarray(samples, dtype=np.float32)
    if x.ndim != 1:
        raise AudioError(f"cannot write {path}: expected mono 1-D samples, got {x.shape}")
    if not np.isfinite(x).all():
        raise AudioError(f"cannot write {path}: samples contain NaN or infinite values")
    major, subtype, rates = WRITE_FORMATS[fmt]
    if rates is not None and sample_rate not in rates:
        to = 48000 if fmt == "opus" else min((r for r in rates if r >= sample_rate),
                                             default=rates[-1])
        x, sample_rate = resample(x, sample_rate, to), to
    x = np.clip(x, -1.0, 1.0)
    with atomic_output(path) as tmp:
        try:
            if fmt == "pcm":
                np.round(x * 32767.0).astype("<i2").tofile(tmp)
            else:
                import soundfile as sf

                sf.write(str(tmp), x, sample_rate, subtype, format=major)
        except OSError as e:
            raise MlxSpeechError(f"cannot write {path}: {e.strerror or e}") from None
        except (RuntimeError, TypeError, ValueError) as e:  # sf.SoundFileError is a RuntimeError
            raise MlxSpeechError(f"cannot write {path}: {e}") from None
