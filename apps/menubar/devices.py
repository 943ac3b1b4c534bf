"""Microphone and speaker ports on real devices (the library's sounddevice classes)."""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np

from mlx_speech.errors import DeviceError

CLOSE_WAIT = 1.0  # seconds

_open_lock = threading.Lock()
_open_streams = 0  # the app's streams open now (microphone and speaker)


def _opened(delta: int) -> int:
    global _open_streams
    with _open_lock:
        _open_streams += delta
        return _open_streams


def rescan_devices() -> bool:
    """PortAudio lists devices once, when it starts: a menu-bar app running for days would
    never see AirPods or a USB microphone plugged in later, nor a new system default.
    Restart it, only when none of our streams is open. True if it was restarted."""
    with _open_lock:
        if _open_streams:
            return False
        try:
            import sounddevice as sd
        except (ImportError, OSError):
            return False
        if not (hasattr(sd, "_terminate") and hasattr(sd, "_initialize")):
            return False
        sd._terminate()
        sd._initialize()
        return True


class DeviceMicrophone:
    """Opens the input device per dictation; a small thread hands blocks to `on_block`
    (the PortAudio callback itself only copies into the library Microphone's queue)."""

    def __init__(self, device: int | str | None = None, sample_rate: int = 16000,
                 block_samples: int = 1280):
        self.device, self.sample_rate, self.block_samples = device, sample_rate, block_samples
        self._mic = None
        self._thread: threading.Thread | None = None
        self._closing = threading.Event()

    def open(self, on_block: Callable[[np.ndarray], None]) -> None:
        from mlx_speech.audio.devices import Microphone

        self.close()
        rescan_devices()
        _opened(+1)
        try:
            mic = Microphone(self.sample_rate, self.block_samples, device=self.device,
                             max_blocks=4096)
            mic.start()
        except BaseException:
            _opened(-1)
            raise
        self._mic, self._closing = mic, threading.Event()
        self._thread = threading.Thread(target=self._pump, args=(mic, on_block, self._closing),
                                        name="mic-pump", daemon=True)
        self._thread.start()

    @staticmethod
    def _pump(mic, on_block, closing: threading.Event) -> None:
        while True:
            block = mic.read(timeout=0.1)
            if block is not None:
                on_block(block)
            elif closing.is_set():
                while (block := mic.read(timeout=0)) is not None:  # the last blocks
                    on_block(block)
                return

    def close(self) -> None:
        mic, self._mic = self._mic, None
        if mic is None:
            return
        # a stalled device can block PortAudio's stop; the blocks already captured are in
        # the queue either way, so wait a little, never forever (this is the UI thread)
        closer = threading.Thread(target=mic.close, name="mic-close", daemon=True)
        closer.start()
        closer.join(CLOSE_WAIT)
        if not closer.is_alive():
            _opened(-1)  # a stalled one stays counted: PortAudio is not restarted under it
        self._closing.set()
        self._thread.join(CLOSE_WAIT)


class DeviceSpeaker:
    """One output stream per utterance; `stop()` aborts it at once from any thread."""

    def __init__(self, device: int | str | None = None, prebuffer_seconds: float = 0.2):
        self.device, self.prebuffer = device, prebuffer_seconds
        self._sp = None
        self._stopped = False

    def start(self, sample_rate: int) -> None:
        from mlx_speech.audio.devices import Speaker

        sp = Speaker(sample_rate, max(1, sample_rate // 25), device=self.device,  # 40 ms
                     prebuffer_seconds=self.prebuffer)
        sp.start()
        self._sp, self._rate = sp, sample_rate

    def write(self, samples: np.ndarray) -> bool:
        if self._stopped:
            return False
        try:
            self._sp.write(samples)
        except DeviceError:
            if self._stopped:
                return False
            raise
        return not self._stopped

    def drain(self) -> None:
        """Play out everything written (polled, so `stop()` can end it from another thread);
        `close()` then lets the device play what its buffers still hold."""
        while not self._stopped:
            try:
                if self._sp.drain(timeout=0.05):
                    return
            except DeviceError:
                if self._stopped:
                    return
                raise

    def stop(self) -> None:
        self._stopped = True
        sp = self._sp
        if sp is not None:
            sp.close(abort=True)

    def close(self) -> None:
        sp, self._sp = self._sp, None
        if sp is not None:
            sp.close(abort=self._stopped)
            _opened(-1)

    @property
    def underruns(self) -> int:
        return self._sp.underruns if self._sp is not None else 0
