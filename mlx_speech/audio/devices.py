"""Microphone capture and speaker playback; sounddevice (PortAudio) is imported only
when a stream opens."""

from __future__ import annotations

import math
import queue
import threading
import time

import numpy as np

from mlx_speech.errors import DeviceError, optional

QUIET_WARN_S = 5.0  # live loops say so once a microphone is quiet this long
QUIET_REPORT_S = 1.0  # and, when they end, if it had been quiet this long
REPORT_STALL_S = 1.0  # a speaker this long without a callback when closed is reported

_PERMISSION_HINT = (
    "check that it is connected and that this app may use it "
    "(macOS: System Settings > Privacy & Security > Microphone)"
)


def sounddevice_module():
    """The `sounddevice` module (PortAudio); DeviceError when it or PortAudio is missing."""
    try:
        with optional("live", "live audio", DeviceError):
            import sounddevice
    except OSError as e:  # the wheel is there but libportaudio is not
        raise DeviceError(f"cannot load PortAudio ({e}); {PORTAUDIO_HINT}") from None
    return sounddevice


# sounddevice's wheels carry PortAudio on macOS and Windows; Linux takes the system's
PORTAUDIO_HINT = ("install PortAudio: sudo apt-get install libportaudio2 (Debian, Ubuntu), "
                  "sudo dnf install portaudio (Fedora)")


def check_live_audio(speaker: bool = False) -> None:
    """Raise now, before a model loads, when sounddevice or PortAudio is missing or there is no
    microphone (and, with `speaker`, no audio output device)."""
    sounddevice_module()
    Microphone.check()
    if speaker:
        Speaker.check()


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


def _stream_ended(stream) -> bool:
    """PortAudio stopped the stream by itself (the device failed or went away)."""
    try:
        return stream is not None and not stream.active
    except Exception:  # a closed stream or a stand-in without the property
        return False


def _abort_and_close(stream) -> None:
    """Abort, never stop: Pa_StopStream waits for the device to play out or deliver,
    and a device that stalled or went away never does (Ctrl-C could not end it)."""
    try:
        (stream.abort if hasattr(stream, "abort") else stream.stop)()
    finally:
        stream.close()


class Microphone:
    """Mono float32 blocks from an input device, handed over through a queue.

    The PortAudio callback runs on a realtime thread, so it only copies the
    block; when the consumer falls `max_blocks` behind, new blocks are dropped
    (counted in `dropped`) instead of blocking that thread, so memory stays
    bounded however long a session runs. `silent_for()` and `ended` tell a
    microphone that stopped delivering (muted, stalled) from one that went away.
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
        self.blocks = 0  # delivered by the device so far
        self._queue: queue.Queue[np.ndarray] = queue.Queue(maxsize=max_blocks)
        self._stream = None
        self._last = time.monotonic()  # the last block (or the start)
        self._warned = False  # read_watched() reported the current quiet stretch

    def _callback(self, indata, frames, time_info, status) -> None:
        self._last = time.monotonic()
        self.blocks += 1
        try:
            self._queue.put_nowait(indata[:, 0].copy())
        except queue.Full:
            self.dropped += 1

    @staticmethod
    def check(device: int | str | None = None):
        """Raise DeviceError now if there is no microphone (`device`: a name or index); returns
        the sounddevice module. Commands call it before they load a model."""
        sd = sounddevice_module()
        try:
            sd.query_devices(device, kind="input")
        except (ValueError, sd.PortAudioError):
            what = "" if device is None else f" matching {device!r}"
            raise DeviceError(
                f"no microphone found (no audio input device{what})"
            ) from None
        return sd

    def start(self) -> None:
        if self._stream is not None:
            return
        sd = self.check(self.device)
        self._last = time.monotonic()
        stream = _open_stream(sd, sd.InputStream, self, "microphone",
                              f"; {_PERMISSION_HINT}")
        self._stream = stream

    def close(self) -> None:
        stream, self._stream = self._stream, None
        if stream is not None:
            _abort_and_close(stream)

    def __enter__(self) -> Microphone:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def ended(self) -> bool:
        """The device stopped the stream (unplugged, taken away): no more audio will come."""
        return _stream_ended(self._stream)

    def silent_for(self) -> float:
        """Seconds since the device last delivered a block (or since it was opened)."""
        return time.monotonic() - self._last

    def problem(self, quiet_seconds: float) -> str | None:
        """What is wrong, if anything: the stream ended, or no audio for `quiet_seconds`."""
        if self.ended:
            return "the microphone stream ended (the device went away)"
        if self._stream is not None and self.silent_for() >= quiet_seconds:
            return f"the microphone delivered no audio for {self.silent_for():.1f} s"
        return None

    def read_watched(self, timeout: float, warn, quiet_seconds: float = QUIET_WARN_S):
        """`read(timeout)` for live loops: once per quiet stretch of `quiet_seconds`,
        `warn(message)` says the microphone delivers nothing (the loop goes on)."""
        block = self.read(timeout)
        if block is not None:
            self._warned = False
        elif not self._warned and (problem := self.problem(quiet_seconds)) and not self.ended:
            warn(f"{problem}; still listening (Ctrl-C to stop)")
            self._warned = True
        return block

    def read(self, timeout: float | None = None) -> np.ndarray | None:
        """Next block (float32, block_samples), or None on timeout or once closed/ended."""
        if (self._stream is None or self.ended) and self._queue.empty():
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
        return sounddevice_module()
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

    A device that stops pulling audio for `stall_seconds`, or goes away, never
    hangs the producer: `write()` and `drain()` give up (DeviceError / False)
    and `problem()` says what happened. `offer()` is the never-blocking write
    for realtime loops. The stream is always aborted, never stopped (stopping
    waits on the device); a normal exit first waits for the played-out audio.
    """

    check = staticmethod(check_output_device)  # no speaker: DeviceError before a model loads

    def __init__(
        self,
        sample_rate: int,
        block_samples: int = 1024,
        *,
        device: int | str | None = None,
        max_seconds: float = 30.0,
        prebuffer_seconds: float = 0.0,
        stall_seconds: float = 3.0,
        hint: str = "",
    ):
        if block_samples <= 0 or sample_rate <= 0:
            raise ValueError("sample_rate and block_samples must be positive")
        self.sample_rate = sample_rate
        self.block_samples = block_samples
        self.device = device
        self.hint = hint  # appended to DeviceError messages, e.g. "; use -o FILE"
        self.stall_seconds = stall_seconds
        self.underruns = 0
        self.dropped = 0  # blocks offer() could not queue
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
        self._last_pull = time.monotonic()  # the device's last callback (or the start)
        self._audio_end: float | None = None  # stream time when the last audio is heard
        self.failure: str | None = None  # why playback gave up or looked wrong, if it did

    # ---- the realtime side: never blocks, never raises ----
    def _callback(self, outdata, frames, time_info, status) -> None:
        try:
            self._last_pull = time.monotonic()
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
            if filled and time_info is not None:
                self._audio_end = time_info.outputBufferDacTime + filled / self.sample_rate
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
        self._last_pull = time.monotonic()
        stream = _open_stream(sd, sd.OutputStream, self, "the audio output", self.hint)
        self._stream = stream

    @property
    def ended(self) -> bool:
        """The device stopped the stream by itself (unplugged, taken away)."""
        return _stream_ended(self._stream)

    def stalled_for(self) -> float:
        """Seconds since the device last asked for audio (or since it was opened)."""
        return time.monotonic() - self._last_pull

    def problem(self, stalled_seconds: float | None = None) -> str | None:
        """What is wrong with the device, if anything: it went away, or it took no
        audio for `stalled_seconds` (default `stall_seconds`)."""
        if self.ended:
            return "the audio output device went away"
        limit = self.stall_seconds if stalled_seconds is None else stalled_seconds
        if self._stream is not None and self.stalled_for() >= limit:
            return f"the audio output took no audio for {self.stalled_for():.1f} s"
        return None

    def write(self, samples, timeout: float | None = None) -> None:
        """Queue mono samples for playback; blocks while the queue is full.

        Raises DeviceError if the stream is closed while waiting, if the device
        goes away or stops taking audio for `stall_seconds`, or if `timeout`
        seconds pass without room.
        """
        for block in self._blocks(samples):
            self._put(block, timeout)

    def offer(self, samples) -> bool:
        """Queue what fits without ever blocking; blocks that do not fit are dropped
        (counted in `dropped`). Returns whether everything was queued."""
        ok = True
        for block in self._blocks(samples):
            try:
                self._queue.put_nowait(block)
                self._played.clear()
            except queue.Full:
                self.dropped += 1
                ok = False
        return ok

    def _blocks(self, samples):
        x = np.asarray(samples, dtype=np.float32).reshape(-1)
        if self._carry.size:
            x = np.concatenate([self._carry, x])
        n_full = len(x) // self.block_samples * self.block_samples
        self._carry = x[n_full:].copy()
        return [np.clip(x[i:i + self.block_samples], -1.0, 1.0)
                for i in range(0, n_full, self.block_samples)]

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
                if (problem := self.problem()) is not None:
                    self.failure = self.failure or problem
                    raise DeviceError(problem) from None
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

        Waits at most `timeout` seconds (default: the queued audio plus 2 s), less
        if the device goes away or stalls, and returns whether everything was played.
        """
        if self._carry.size:
            block = np.zeros(self.block_samples, np.float32)
            block[: len(self._carry)] = np.clip(self._carry, -1.0, 1.0)
            self._carry = np.zeros(0, np.float32)
            self._put(block, timeout)
        if timeout is None:
            timeout = self.pending_seconds() + 2.0
        deadline = time.monotonic() + timeout
        self._draining = True
        try:
            while not self._played.wait(min(0.1, max(0.0, deadline - time.monotonic()))):
                if (problem := self.problem()) is not None or time.monotonic() >= deadline:
                    self.failure = self.failure or problem or (
                        f"the audio output played too slowly ({timeout:.1f} s were not enough)")
                    return False
            return True
        finally:
            self._draining = False

    def _wait_until_heard(self, limit: float = 2.0) -> None:
        """After a drain: let the device play what PortAudio and the audio server still
        hold (up to the last sample's DAC time), so aborting cuts nothing off."""
        stream, end = self._stream, self._audio_end
        if stream is None or end is None:
            return
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline and self.problem() is None:
            try:
                if stream.time >= end + 0.05:
                    return
            except Exception:  # no clock on this stream
                return
            time.sleep(0.01)

    def close(self, abort: bool = False) -> None:
        if not abort:
            self._wait_until_heard()
        if self._stream is not None and self.failure is None:
            self.failure = self.problem(REPORT_STALL_S)
        stream, self._stream = self._stream, None
        if stream is not None:
            _abort_and_close(stream)

    def __enter__(self) -> Speaker:
        self.start()
        return self

    def __exit__(self, exc_type, *exc) -> None:
        drained = False
        try:
            if exc_type is None and self._stream is not None:
                drained = self.drain()
        finally:
            self.close(abort=not drained)
