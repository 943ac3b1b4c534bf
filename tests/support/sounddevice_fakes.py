"""A fake `sounddevice` module (PortAudio streams run by hand or by a thread), shared by
tests/audio/test_devices.py and tests/cli/test_say.py."""

import sys
import threading
import time
import types

import numpy as np


class PortAudioError(Exception):
    pass


def fake_sounddevice(monkeypatch, *, has_input=True, has_output=True, open_error=None,
                     run_device=False, hang_on_stop=False):
    """A stand-in sounddevice. With run_device, an OutputStream pulls audio from its
    callback on a thread (like PortAudio) and records it in `stream.played`."""
    sd = types.ModuleType("sounddevice")
    sd.PortAudioError = PortAudioError
    sd.streams = []

    def query_devices(device=None, kind=None):
        if not (has_input if kind == "input" else has_output):
            raise PortAudioError("Error querying device -1")
        return {"name": "fake device", "max_input_channels": 1, "max_output_channels": 2}

    class OutputStream:
        def __init__(self, **kw):
            if open_error is not None:
                raise open_error
            self.kw, self.started, self.closed, self.aborted = kw, False, False, False
            self.played: list[np.ndarray] = []
            self._thread = None
            sd.streams.append(self)

        def pull(self, frames=None):
            frames = frames or self.kw["blocksize"]
            out = np.full((frames, 1), np.nan, np.float32)  # the callback must fill it all
            self.kw["callback"](out, frames, None, None)
            self.played.append(out[:, 0].copy())
            return out[:, 0]

        def _run(self):
            while self.started:
                self.pull()
                time.sleep(0.001)

        def start(self):
            self.started = True
            if run_device:
                self._thread = threading.Thread(target=self._run, daemon=True)
                self._thread.start()

        def stop(self):
            if hang_on_stop:  # Pa_StopStream waits for a stalled device to play out
                time.sleep(30)
            self.started = False
            if self._thread is not None:
                self._thread.join()

        def abort(self):
            self.aborted = True
            self.started = False
            if self._thread is not None:
                self._thread.join()

        def close(self):
            self.closed = True

    class InputStream:
        def __init__(self, **kw):
            if open_error is not None:
                raise open_error
            self.kw, self.started, self.closed, self.aborted = kw, False, False, False
            self.active = True
            sd.streams.append(self)

        def start(self):
            self.started = True

        def stop(self):
            if hang_on_stop:  # Pa_StopStream on a device that stopped delivering
                time.sleep(30)
            self.started = False

        def abort(self):
            self.aborted = True
            self.started = False

        def close(self):
            self.closed = True

    sd.query_devices, sd.InputStream, sd.OutputStream = query_devices, InputStream, OutputStream
    monkeypatch.setitem(sys.modules, "sounddevice", sd)
    return sd
