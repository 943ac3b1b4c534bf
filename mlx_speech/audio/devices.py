"""Microphone capture; sounddevice (PortAudio) is imported only when a stream opens."""

from __future__ import annotations

import queue

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
        stream = None
        try:
            stream = sd.InputStream(
                samplerate=self.sample_rate,
                blocksize=self.block_samples,
                channels=1,
                dtype="float32",
                device=self.device,
                callback=self._callback,
            )
            stream.start()
        except (sd.PortAudioError, ValueError) as e:
            if stream is not None:
                stream.close()
            if "sample rate" in str(e).lower():
                raise DeviceError(
                    f"microphone does not support {self.sample_rate} Hz ({e})"
                ) from None
            raise DeviceError(
                f"cannot open microphone: {e}; {_PERMISSION_HINT}"
            ) from None
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
