"""Uploads (POST /v1/audio/transcriptions' `file`): bounded by what they decode to, decoded in
bounded memory.

The header is read first (`audio.decode.probe`, on a worker thread), and an upload is refused
before any decoding (413 `upload_too_long`, naming the limit) when it holds more than
`--max-upload-s` seconds of audio, or when decoding it would make more samples (duration x
rate x channels) than that many seconds of 48 kHz stereo; a rate outside `FILE_RATES` is a
400. Files stored as floats are scanned for NaN and infinite samples (a 400) before any
engine work. Then blocks are decoded on a worker thread, mixed down and resampled on the way
(`audio.decode`), and fed to the request's engine jobs (the transcription, and the diarizer
and the pause finder when the answer needs them) through bounded queues: decoding waits while
a queue is full, so memory stays flat whatever the upload's length. A file that holds more
than its header said is cut off with the same 413 at the limit.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from ..audio.decode import AudioInfo, Decoded, check_samples, clock, probe
from ..errors import MlxSpeechError
from .jobs import AudioJob, BufferFull
from .validate import FILE_RATES

DEFAULT_MAX_UPLOAD_S = 10800.0  # --max-upload-s: 3 hours of audio
DECODE_RATE = 96000  # the samples per second of the limit: 48 kHz stereo
BLOCK_S = 2.0  # seconds of decoded audio per block
QUEUE_S = 20.0  # decoded audio a job of the request may queue before decoding waits
POLL_S = 0.02  # how often a full queue is looked at again


class UploadRefused(Exception):
    """An upload refused: the HTTP `status`, the error `code` and message (param "file")."""

    def __init__(self, status: int, code: str, message: str):
        super().__init__(message)
        self.status, self.code = status, code


@dataclass
class Upload:
    """A checked upload: its file object, header and how messages name it."""

    file: object
    info: AudioInfo
    what: str  # "the 'file' field ('talk.flac')"
    max_s: float

    @property
    def max_samples(self) -> int:
        """Samples decoding may make (frames x channels)."""
        return int(self.max_s * DECODE_RATE)

    def too_long(self, detail: str) -> UploadRefused:
        return UploadRefused(413, "upload_too_long", f"{self.what} {detail}, over this server's "
                             f"limit of {clock(self.max_s)} of audio (at most {self.max_samples} "
                             "decoded samples: that much 48 kHz stereo; --max-upload-s "
                             f"{self.max_s:g})")


def _reason(e: Exception, filename: str | None) -> str:
    """An audio error's message without the file's own name (the caller's `what` names it)."""
    msg = str(e)
    for lead in (f"cannot read {filename}: ", "cannot read the audio: "):
        if filename and msg.startswith(lead):
            return "cannot read the audio: " + msg[len(lead):]
    if filename and msg.startswith(filename + " "):
        return msg[len(filename) + 1:]
    return msg


async def open_upload(file, filename: str | None, size: int, rate: int,
                      max_s: float) -> Upload:
    """Check an upload from its header (and scan a float file's samples), on worker threads;
    UploadRefused (400 `invalid_audio` or 413 `upload_too_long`) before any engine work."""
    what = f"the 'file' field ({filename!r})" if filename else "the 'file' field"
    if not size:
        raise UploadRefused(400, "invalid_audio", f"{what} is empty")
    name = filename or "upload"

    def check() -> AudioInfo:
        info = probe(file, name=name)
        if info.sample_rate != rate and info.sample_rate not in FILE_RATES:
            raise UploadRefused(400, "invalid_audio", f"{what}: unsupported sample rate "
                                f"{info.sample_rate} Hz (supported: "
                                f"{', '.join(map(str, FILE_RATES))})")
        up = Upload(file, info, what, max_s)
        frames = max(info.frames or 0, info.declared_frames or 0)
        if frames > max_s * info.sample_rate:
            raise up.too_long(f"holds {clock(frames / info.sample_rate)} of audio")
        if frames * info.channels > up.max_samples:
            raise up.too_long(f"decodes to {frames * info.channels} samples "
                              f"({info.sample_rate} Hz x {info.channels} channels x "
                              f"{clock(frames / info.sample_rate)})")
        if info.floating:
            check_samples(file, name=name)  # NaN or infinite samples: refused now
        return info

    try:
        info = await asyncio.to_thread(check)
    except MlxSpeechError as e:
        raise UploadRefused(400, "invalid_audio", f"{what}: {_reason(e, name)}") from None
    return Upload(file, info, what, max_s)


async def feed(upload: Upload, rate: int, jobs: list[AudioJob]) -> float:
    """Decode `upload` at `rate` in blocks (each on a worker thread) into every job of `jobs`
    (their queues bounded: decoding waits while one is full), then end them; the seconds
    fed. Stops early when the first job (the transcription) has failed or closed (its error
    says why); UploadRefused for audio past the limit or a decoder error."""
    blocks = Decoded(upload.file, rate, block_s=BLOCK_S, info=upload.info,
                     name=upload.info.name)
    it = iter(blocks)
    n = 0
    while True:
        try:
            x = await asyncio.to_thread(next, it, None)
        except MlxSpeechError as e:
            raise UploadRefused(400, "invalid_audio",
                                f"{upload.what}: {_reason(e, upload.info.name)}") from None
        if x is None:
            break
        n += len(x)
        if (n > upload.max_s * rate
                or blocks.read_frames * upload.info.channels > upload.max_samples):
            raise upload.too_long(f"holds more than its header says (at least "
                                  f"{clock(n / rate)})")
        for j in jobs:
            while not (j.finished or j.closed):
                try:
                    j.push(x)
                    break
                except BufferFull:
                    await asyncio.sleep(POLL_S)
        if jobs[0].finished or jobs[0].closed:
            return n / rate
    for j in jobs:
        j.end()
    return n / rate


class PauseJob(AudioJob):
    """The pauses of an upload (`transcript.PauseFinder`): fed its 16 kHz audio, one VAD
    piece (16 s) per engine tick, so live streams step in between; ("done", breaks) at its
    end, or ("error", code, message)."""

    phase = 3

    def __init__(self, vad, sink, max_samples: int):
        super().__init__(vad, sink, max_samples)
        self.finder = None

    def start(self) -> None:
        from ..transcript import PauseFinder

        self.finder = PauseFinder(self.model)

    @classmethod
    def step_many(cls, engine, jobs: list[PauseJob]) -> bool:
        busy = False
        for j in jobs:
            n = j.input.pending
            try:
                if n >= j.finder.piece or (j.end_requested and n):
                    j.finder.push(j.input.take(j.finder.piece))
                    busy = True
                elif j.end_requested:
                    j.finished = True
                    j.emit(("done", j.finder.finish()))
                    busy = True
            except Exception as e:
                j.fail("processing_error", f"pause detection failed: {e}")
        return busy
