"""Microphone capture and speaker playback; sounddevice (PortAudio) is imported only
when a stream opens."""

from __future__ import annotations

import math
import queue
import threading
import time

import numpy as np

from mlx_speech.errors import DeviceError

_PERMISSION_HINT = (
    "check that it is connected and that this app may use it "
    "(macOS: System Settings > Privacy & Security > Microphone)"
)


def _sounddevice():
    try:
        import sounddevice
    except ImportError:
        raise DeviceError(
            "live audio needs sounddevice: pip install 'mlx-speech[live]'"
        ) from None
    except OSError as e:  # the wheel is there but libportaudio is not
        raise DeviceError(f"cannot load PortAudio ({e}); install PortAudio") from None
    return sounddevice


def _open_stream(sd, kind, owner, what: str, hint: str):
    """Start a mono float32 PortAudio stream (`sd.InputStream`/`sd.OutputStream`)
    that calls `owner._callback`; failures become DeviceError naming `what`."""
    stream = None
    try:
        stream = kind(samplerate=owner.sample_rate, blocksize=owner.block_samples, channels=1,
                      dtype="float32", device=owner.device, callback=owner._callback)
        stream.start()
    except (sd.PortAudioError, ValueError) as e:
        if stream is not None:
            stream.close()
        if "sample rate" in str(e).lower():
            raise DeviceError(
                f"{what} does not support {owner.sample_rate} Hz ({e}){hint}") from None
        raise DeviceError(f"cannot open {what}: {e}{hint}") from None
    return stream


class Microphone:
    """Mono float32 blocks from an input device, handed over through a queue.

    The PortAudio callback runs on a realtime thread, so it only copies the
    block; when the consumer falls `max_blocks` behind, new blocks are dropped
    (counted in `dropped`) instead of blocking that thread.
    """

    def __init__(
        self,
        sample_rate: int = 16000,
        block_samples: int = 1280,
        *,
        device: int | str | None = None,
        max_blocks: int = 256,
    ):
        self.sample_rate = sample_rate
        self.block_samples = block_samples
        self.device = device
        self.dropped = 0
        self._queue: queue.Queue[np.ndarray] = queue.Queue(maxsize=max_blocks)
        self._stream = None

    def _callback(self, indata, frames, time, status) -> None:
        try:
            self._queue.put_nowait(indata[:, 0].copy())
        except queue.Full:
            self.dropped += 1

    def start(self) -> None:
        if self._stream is not None:
            return
        sd = _sounddevice()
        try:
            sd.query_devices(self.device, kind="input")
        except (ValueError, sd.PortAudioError):
            what = "" if self.device is None else f" matching {self.device!r}"
            raise DeviceError(
                f"no microphone found (no audio input device{what})"
            ) from None
        stream = _open_stream(sd, sd.InputStream, self, "microphone",
                              f"; {_PERMISSION_HINT}")
        self._stream = stream

    def close(self) -> None:
        stream, self._stream = self._stream, None
        if stream is not None:
            try:
                stream.stop()
            finally:
                stream.close()

    def __enter__(self) -> Microphone:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def read(self, timeout: float | None = None) -> np.ndarray | None:
        """Next block (float32, block_samples), or None on timeout or once closed."""
        if self._stream is None and self._queue.empty():
            return None
        try:
            return self._queue.get(timeout=timeout)
        except queue.Empty:
            return None


def check_output_device(device: int | str | None = None, *, hint: str = "") -> None:
    """Raise DeviceError now if no speaker can be opened (PortAudio missing, no device)."""
    sd = _speaker_sounddevice(hint)
    try:
        sd.query_devices(device, kind="output")
    except (ValueError, sd.PortAudioError):
        what = "" if device is None else f" matching {device!r}"
        raise DeviceError(f"no audio output device{what}{hint}") from None


def _speaker_sounddevice(hint: str):
    try:
        return _sounddevice()
    except DeviceError as e:
        raise DeviceError(f"{e}{hint}") from None


class Speaker:
    """Play mono float32 audio written from a producer thread.

    `write()` splits samples into `block_samples` blocks and queues them,
    blocking while `max_seconds` of audio is already waiting, so generated
    audio is never dropped. The PortAudio callback only pops blocks: when the
    queue runs dry mid-stream it plays silence and counts one underrun (a gap
    the listener hears); silence before the first write is not counted.
    `drain()` waits until everything written has been played. Leaving the
    `with` block normally drains; leaving it by an exception stops at once.
    `prebuffer_seconds` holds playback back until that much audio is queued
    (or `drain()` is called), which trades start latency for fewer gaps.
    """

    def __init__(
        self,
        sample_rate: int,
        block_samples: int = 1024,
        *,
        device: int | str | None = None,
        max_seconds: float = 30.0,
        prebuffer_seconds: float = 0.0,
        hint: str = "",
    ):
        if block_samples <= 0 or sample_rate <= 0:
            raise ValueError("sample_rate and block_samples must be positive")
        self.sample_rate = sample_rate
        self.block_samples = block_samples
        self.device = device
        self.hint = hint  # appended to DeviceError messages, e.g. "; use -o FILE"
        self.underruns = 0
        max_blocks = max(2, math.ceil(max_seconds * sample_rate / block_samples))
        self._queue: queue.Queue[np.ndarray] = queue.Queue(maxsize=max_blocks)
        self._prebuffer = math.ceil(prebuffer_seconds * sample_rate / block_samples)
        self._carry = np.zeros(0, np.float32)  # the tail of a write shorter than a block
        self._current: np.ndarray | None = None  # the block being played and its position
        self._pos = 0
        self._started = False  # playback has begun (prebuffer filled or draining)
        self._starved = False  # the last callback ran out of audio
        self._draining = False
        self._played = threading.Event()  # set by the callback once draining and empty
        self._stream = None

    # ---- the realtime side: never blocks, never raises ----
    def _callback(self, outdata, frames, time_info, status) -> None:
        try:
            out = outdata[:, 0]
            if not self._started:
                if self._queue.qsize() < max(1, self._prebuffer) and not self._draining:
                    out.fill(0)
                    return
                self._started = True
            filled = 0
            while filled < frames:
                if self._current is None:
                    try:
                        self._current, self._pos = self._queue.get_nowait(), 0
                    except queue.Empty:
                        break
                n = min(frames - filled, len(self._current) - self._pos)
                out[filled:filled + n] = self._current[self._pos:self._pos + n]
                filled += n
                self._pos += n
                if self._pos == len(self._current):
                    self._current = None
            if filled < frames:
                out[filled:] = 0
                if self._draining:
                    self._played.set()
                elif not self._starved:
                    self.underruns += 1
                self._starved = True
            else:
                self._starved = False
        except Exception:  # a realtime callback must not raise into PortAudio
            try:
                outdata.fill(0)
            except Exception:
                pass

    # ---- the producer side ----
    def start(self) -> None:
        if self._stream is not None:
            return
        sd = _speaker_sounddevice(self.hint)
        check_output_device(self.device, hint=self.hint)
        stream = _open_stream(sd, sd.OutputStream, self, "the audio output", self.hint)
        self._stream = stream

    def write(self, samples, timeout: float | None = None) -> None:
        """Queue mono samples for playback; blocks while the queue is full.

        Raises DeviceError if the stream is closed while waiting, or if
        `timeout` seconds pass without room (the device stopped pulling audio).
        """
        x = np.asarray(samples, dtype=np.float32).reshape(-1)
        if self._carry.size:
            x = np.concatenate([self._carry, x])
        n_full = len(x) // self.block_samples * self.block_samples
        self._carry = x[n_full:].copy()
        for i in range(0, n_full, self.block_samples):
            self._put(np.clip(x[i:i + self.block_samples], -1.0, 1.0), timeout)

    def _put(self, block: np.ndarray, timeout: float | None) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if self._stream is None:
                raise DeviceError("the audio output is closed")
            try:
                self._queue.put(block, timeout=0.1)
                self._played.clear()
                return
            except queue.Full:
                if deadline is not None and time.monotonic() > deadline:
                    raise DeviceError("the audio output stopped taking audio") from None

    def pending_seconds(self) -> float:
        """Audio queued but not yet played (approximate)."""
        n = self._queue.qsize() * self.block_samples + len(self._carry)
        if self._current is not None:
            n += len(self._current) - self._pos
        return n / self.sample_rate

    def drain(self, timeout: float | None = None) -> bool:
        """Play out everything written (a short last block is padded with silence).

        Waits at most `timeout` seconds (default: the queued audio plus 2 s) and
        returns whether everything was played.
        """
        if self._carry.size:
            block = np.zeros(self.block_samples, np.float32)
            block[: len(self._carry)] = np.clip(self._carry, -1.0, 1.0)
            self._carry = np.zeros(0, np.float32)
            self._put(block, timeout)
        if timeout is None:
            timeout = self.pending_seconds() + 2.0
        self._draining = True
        try:
            return self._played.wait(timeout)
        finally:
            self._draining = False

    def close(self, abort: bool = False) -> None:
        stream, self._stream = self._stream, None
        if stream is not None:
            try:
                (stream.abort if abort and hasattr(stream, "abort") else stream.stop)()
            finally:
                stream.close()

    def __enter__(self) -> Speaker:
        self.start()
        return self

    def __exit__(self, exc_type, *exc) -> None:
        try:
            if exc_type is None and self._stream is not None:
                self.drain()
        finally:
            self.close(abort=exc_type is not None)
