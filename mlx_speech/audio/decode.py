"""Audio files decoded block by block: a header probe first, then float32 mono blocks at the
rate the caller asks for, mixed down and resampled on the way. Memory stays flat whatever the
file's length: a 3-hour 48 kHz stereo recording is never held whole, at any rate.

    from mlx_speech.audio.decode import decode, probe

    info = probe("talk.m4a")             # the header only: rate, channels, duration, codec
    blocks = decode("talk.m4a", 16000)   # float32 mono 16 kHz blocks of 10 s (the last shorter)
    for block in blocks:
        session.feed(block)
    blocks.read_s, blocks.problem        # seconds decoded; why decoding stopped short, if it did

libsndfile (soundfile, a core dependency) reads wav, flac, ogg (Vorbis, Opus), mp3, aiff, caf;
FFmpeg through PyAV (the `formats` extra) reads m4a, mp4, mov, webm, mkv and aac. A source is
a path or a binary file object (an upload). A header that announces more audio than the file
holds, or a decoder that stops on damaged data, ends the blocks early with a warning through
`log` naming the file and how much was read; NaN or infinite samples raise AudioError.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

from mlx_speech.errors import DISTRIBUTION, AudioError, optional

# container suffixes FFmpeg reads for us (through PyAV); everything else goes to libsndfile
AV_SUFFIXES = (".m4a", ".mp4", ".mov", ".webm", ".mkv", ".aac")
SOUNDFILE_NAMES = "wav, flac, ogg, opus, mp3, aiff, caf"
BLOCK_S = 10.0  # seconds of output per block
READ_FRAMES = 1 << 16  # source frames per read (~1.4 s at 48 kHz)
FLOAT_CODECS = ("FLOAT", "DOUBLE")  # stored samples that can be NaN or infinite

Source = str | os.PathLike | BinaryIO


@dataclass(frozen=True)
class AudioInfo:
    """What a file's header says, before anything is decoded."""

    name: str  # how messages name the source
    sample_rate: int
    channels: int
    frames: int | None  # samples per channel the decoder will give (an estimate for PyAV)
    format: str  # container: "WAV", "FLAC", "mov,mp4,m4a,3gp,3g2,mj2"...
    codec: str  # soundfile's subtype ("PCM_16", "FLOAT") or FFmpeg's codec ("aac", "opus")
    reader: str  # "soundfile" or "av"
    declared_frames: int | None = None  # the header's claim, when it says more than `frames`

    @property
    def duration(self) -> float | None:
        """Seconds of audio (None when the container does not say)."""
        return None if self.frames is None else self.frames / self.sample_rate

    @property
    def floating(self) -> bool:
        """Stored as floats: samples that can be NaN or infinite (`check_samples` scans)."""
        return self.codec in FLOAT_CODECS


def supported() -> str:
    """The formats, as error messages list them."""
    av = ", ".join(s[1:] for s in AV_SUFFIXES)
    return (f"mlx_speech reads {SOUNDFILE_NAMES}; {av} with PyAV (pip install "
            f"'{DISTRIBUTION}[formats]')")


def clock(seconds: float) -> str:
    """2.0 s, 1:05.2, 3:00:00: durations in messages."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    h, rem = divmod(int(seconds), 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def _source(source: Source, name: str | None) -> tuple[object, str, str]:
    """(what the readers open, the name messages use, the lower-case suffix); a path that
    cannot be read or holds nothing is refused here."""
    if hasattr(source, "read"):
        label = name or getattr(source, "name", None) or "the audio"
        return source, str(label), Path(str(label)).suffix.lower()
    path = Path(source)
    if not path.exists():
        raise AudioError(f"no such file: {path}")
    if path.is_dir():
        raise AudioError(f"{path} is a folder, not an audio file")
    if not os.access(path, os.R_OK):
        raise AudioError(f"cannot read {path}: permission denied")
    if path.stat().st_size == 0:
        raise AudioError(f"{path} is empty (0 bytes)")
    return str(path), name or str(path), path.suffix.lower()


def _unsupported(label: str, why: str = "") -> AudioError:
    return AudioError(f"cannot read {label}: format not supported or file is corrupt"
                      + (f" ({why})" if why else "") + f"; {supported()}")


def _av_available() -> bool:
    from importlib.util import find_spec

    return find_spec("av") is not None


def probe(source: Source, *, name: str | None = None) -> AudioInfo:
    """The header of `source` (a path or a binary file object, left at its start): rate,
    channels and length, without decoding. Raises AudioError for a missing, empty, unreadable
    or unsupported file (the message lists what is supported), MissingDependency for an m4a,
    mp4, webm, aac... file without PyAV."""
    src, label, suffix = _source(source, name)
    if suffix in AV_SUFFIXES:
        info = _probe_av(src, label, suffix)
    else:
        try:
            info = _probe_soundfile(src, label)
        except AudioError:
            if not hasattr(src, "read") or suffix or not _av_available():
                raise
            info = _probe_av(src, label, suffix)  # an upload with no name: FFmpeg may know it
    if info.frames == 0:
        raise AudioError(f"{label} is empty (0 samples)")
    return info


def _rewound(src):
    if hasattr(src, "seek"):
        src.seek(0)
    return src


def _probe_soundfile(src, label: str) -> AudioInfo:
    import soundfile as sf

    try:
        i = sf.info(_rewound(src))
    except (sf.SoundFileError, RuntimeError, TypeError, ValueError) as e:
        why = str(e)
        if why.startswith("Error opening"):  # "Error opening '<name>': <why>"
            why = why.split(": ", 1)[-1] if ": " in why else ""
        raise _unsupported(label, why.strip()) from None
    except OSError as e:
        raise AudioError(f"cannot read {label}: {e.strerror or e}") from None
    finally:
        _rewound(src)
    declared = _header_frames(src)
    return AudioInfo(label, int(i.samplerate), int(i.channels), int(i.frames), i.format,
                     i.subtype, "soundfile",
                     declared if declared is not None and declared > i.frames else None)


def _header_frames(src) -> int | None:
    """The frame count a WAV / RF64 / AIFF header announces (libsndfile quietly trusts the file
    size instead, so a truncated file would pass unnoticed); None for other formats or an
    unknown size (a stream written without one)."""
    f = open(src, "rb") if isinstance(src, str) else _rewound(src)
    try:
        head = f.read(12)
        if len(head) < 12:
            return None
        if head[:4] in (b"RIFF", b"RF64") and head[8:] == b"WAVE":
            return _wav_frames(f)
        if head[:4] == b"FORM" and head[8:] in (b"AIFF", b"AIFC"):
            return _aiff_frames(f)
        return None
    except (OSError, struct.error):
        return None
    finally:
        if isinstance(src, str):
            f.close()
        else:
            _rewound(src)


def _wav_frames(f) -> int | None:
    align, data64 = 0, None
    for _ in range(64):  # the chunks before `data` (fmt, ds64, LIST, fact...)
        hdr = f.read(8)
        if len(hdr) < 8:
            return None
        cid, size = hdr[:4], struct.unpack("<I", hdr[4:])[0]
        if cid == b"ds64":  # RF64: the real sizes
            body = f.read(size)
            data64 = struct.unpack("<QQ", body[:16])[1]
            size = 0
        elif cid == b"fmt ":
            body = f.read(size)
            align = struct.unpack("<H", body[12:14])[0]
            size = 0
        elif cid == b"data":
            if size == 0xFFFFFFFF and data64 is not None:
                size = data64
            if size in (0, 0xFFFFFFFF) or not align:
                return None  # written as a stream: no size announced
            return size // align
        f.seek(size + (size & 1), 1)
    return None


def _aiff_frames(f) -> int | None:
    for _ in range(64):
        hdr = f.read(8)
        if len(hdr) < 8:
            return None
        cid, size = hdr[:4], struct.unpack(">I", hdr[4:])[0]
        if cid == b"COMM":
            return struct.unpack(">hI", f.read(6))[1]
        f.seek(size + (size & 1), 1)
    return None


def _import_av(suffix: str):
    with optional("formats", f"reading {suffix} files" if suffix else "this audio format"):
        import av
    return av


def _probe_av(src, label: str, suffix: str) -> AudioInfo:
    av = _import_av(suffix)
    try:
        c = av.open(_rewound(src))
    except (av.error.FFmpegError, ValueError) as e:
        raise _unsupported(label, str(e).split(": '")[0]) from None
    except OSError as e:
        raise AudioError(f"cannot read {label}: {e.strerror or e}") from None
    try:
        if not c.streams.audio:
            raise AudioError(f"{label} has no audio track")
        s = c.streams.audio[0]
        cc = s.codec_context
        rate = int(cc.sample_rate or s.rate or 0)
        if rate <= 0:
            raise _unsupported(label, "no sample rate")
        seconds = (float(s.duration * s.time_base) if s.duration else
                   c.duration / 1e6 if c.duration else None)
        frames = None if seconds is None else round(seconds * rate)
        return AudioInfo(label, rate, len(cc.layout.channels) or 1, frames, c.format.name,
                         cc.name, "av")
    finally:
        c.close()
        _rewound(src)


def _raw_soundfile(src, label: str, reader: Decoded):
    """(frames, channels) float32 arrays as stored; a decoder error ends them (reader.problem)."""
    import soundfile as sf

    with sf.SoundFile(_rewound(src)) as f:
        while True:
            try:
                x = f.read(READ_FRAMES, dtype="float32", always_2d=True)
            except (sf.SoundFileError, RuntimeError) as e:
                reader.problem = str(e).replace("Error :", "").strip() or type(e).__name__
                return
            if not len(x):
                return
            yield x


def _raw_av(src, label: str, reader: Decoded):
    av = _import_av(Path(label).suffix.lower())
    c = av.open(_rewound(src))
    try:
        s = c.streams.audio[0]
        to_float = av.AudioResampler(format="fltp")  # planar float, same rate and layout
        packets = c.demux(s)
        while True:
            try:
                packet = next(packets)
                frames = packet.decode()
            except StopIteration:
                break
            except av.error.FFmpegError as e:  # damaged data: what came before stands
                reader.problem = str(e).split(": '")[0]
                break
            for fr in frames:
                for out in to_float.resample(fr):
                    yield np.ascontiguousarray(out.to_ndarray().T)
        for out in to_float.resample(None):
            yield np.ascontiguousarray(out.to_ndarray().T)
    finally:
        c.close()


class Decoded:
    """`decode`'s iterator: float32 mono blocks of `block_s` seconds at `sample_rate` (the last
    one shorter). While and after iterating: `read_s` (seconds of the source decoded) and
    `problem` (why decoding stopped before the end, else None)."""

    def __init__(self, source: Source, sample_rate: int | None = None, *,
                 block_s: float = BLOCK_S, name: str | None = None,
                 log: Callable[[str], None] | None = None, info: AudioInfo | None = None):
        self.info = info or probe(source, name=name)
        self._src, self.name, _ = _source(source, name or self.info.name)
        self.sample_rate = int(sample_rate or self.info.sample_rate)
        self.block = max(1, int(round(block_s * self.sample_rate)))
        self.log = log or (lambda m: None)
        self.read_frames = 0  # source frames decoded so far
        self.problem: str | None = None

    @property
    def read_s(self) -> float:
        return self.read_frames / self.info.sample_rate

    def raw(self) -> Iterator[np.ndarray]:
        """The source as stored: (frames, channels) float32, no mixing or resampling."""
        read = _raw_av if self.info.reader == "av" else _raw_soundfile
        for x in read(self._src, self.name, self):
            self.read_frames += len(x)
            yield x

    def __iter__(self) -> Iterator[np.ndarray]:
        from mlx_speech.audio.resample import StreamingResampler

        info, short = self.info, Path(self.name).name
        if info.channels > 1:
            self.log(f"{short}: mixing {info.channels} channels down to mono")
        if info.sample_rate != self.sample_rate:
            self.log(f"{short}: resampling {info.sample_rate} Hz -> {self.sample_rate} Hz")
        rs = StreamingResampler(info.sample_rate, self.sample_rate)
        pending: list[np.ndarray] = []
        held = 0
        for x in self.raw():
            mono = x.mean(axis=1, dtype=np.float32) if x.shape[1] > 1 else x[:, 0]
            if not np.isfinite(mono).all():
                at = (self.read_frames - len(x) + int(np.argmin(np.isfinite(mono))))
                raise AudioError(f"{self.name} contains NaN or infinite samples (first at "
                                 f"{at / info.sample_rate:.3f} s)")
            y = rs.feed(mono)
            pending.append(y)
            held += len(y)
            while held >= self.block:
                joined = np.concatenate(pending)
                yield joined[: self.block]
                pending, held = [joined[self.block:]], held - self.block
        if self.read_frames == 0:
            why = f": {self.problem}" if self.problem else ""
            raise AudioError(f"cannot read {self.name}: no samples could be decoded{why}")
        rest = np.concatenate([*pending, rs.finish()])
        for i in range(0, len(rest), self.block):
            yield rest[i: i + self.block]
        self._report()

    def _report(self) -> None:
        """The warning for a file that ended before its header said it would."""
        info, got = self.info, self.read_s
        expected = info.declared_frames or info.frames
        short = expected is not None and self.read_frames < expected and (
            info.reader == "soundfile" or info.format != "aac"  # raw AAC: a bitrate estimate
            and expected - self.read_frames > max(info.sample_rate, expected // 100))
        if self.problem:
            self.log(f"warning: {self.name} is damaged or truncated: decoding stopped after "
                     f"{clock(got)} ({self.problem}); only that much was read")
        elif short:
            self.log(f"warning: {self.name} is truncated: its header announces "
                     f"{clock(expected / info.sample_rate)} of audio, the file holds "
                     f"{clock(got)}; only that much was read")


def decode(source: Source, sample_rate: int | None = None, *, block_s: float = BLOCK_S,
           name: str | None = None, log: Callable[[str], None] | None = None,
           info: AudioInfo | None = None) -> Decoded:
    """Float32 mono blocks of `source` at `sample_rate` Hz (default: the file's), `block_s`
    seconds each; see `Decoded`. Joined, they equal the whole file mixed down (the mean of its
    channels) and resampled at once (`mlx_speech.audio.resample`)."""
    return Decoded(source, sample_rate, block_s=block_s, name=name, log=log, info=info)


def check_samples(source: Source, *, name: str | None = None) -> AudioInfo:
    """`probe`, and for files stored as floats a scan for NaN or infinite samples (block by
    block, without resampling): what a command checks before it loads a model."""
    info = probe(source, name=name)
    if info.floating:
        d = Decoded(source, name=name, info=info)
        for x in d.raw():
            if not np.isfinite(x).all():
                bad = int(np.argmin(np.isfinite(x).all(axis=1)))
                at = (d.read_frames - len(x) + bad) / info.sample_rate
                raise AudioError(f"{d.name} contains NaN or infinite samples (first at "
                                 f"{at:.3f} s)")
    return info
