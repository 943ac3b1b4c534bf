import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from mlx_speech.audio.devices import Microphone
from mlx_speech.errors import DeviceError


class PortAudioError(Exception):
    pass


def fake_sounddevice(monkeypatch, *, has_input=True, open_error=None):
    sd = types.ModuleType("sounddevice")
    sd.PortAudioError = PortAudioError
    sd.streams = []

    def query_devices(device=None, kind=None):
        if not has_input:
            raise PortAudioError("Error querying device -1")
        return {"name": "fake mic", "max_input_channels": 1}

    class InputStream:
        def __init__(self, **kw):
            if open_error is not None:
                raise open_error
            self.kw, self.started, self.closed = kw, False, False
            sd.streams.append(self)

        def start(self):
            self.started = True

        def stop(self):
            self.started = False

        def close(self):
            self.closed = True

    sd.query_devices, sd.InputStream = query_devices, InputStream
    monkeypatch.setitem(sys.modules, "sounddevice", sd)
    return sd


def block(value: float, n: int = 1280) -> np.ndarray:
    return np.full((n, 1), value, np.float32)


def test_callback_enqueues_blocks(monkeypatch):
    sd = fake_sounddevice(monkeypatch)
    with Microphone(sample_rate=16000, block_samples=1280) as mic:
        (stream,) = sd.streams
        assert stream.started
        assert stream.kw["samplerate"] == 16000 and stream.kw["blocksize"] == 1280
        assert stream.kw["channels"] == 1 and stream.kw["dtype"] == "float32"
        data = block(0.25)
        stream.kw["callback"](data, 1280, None, None)
        data[:] = 9.0  # PortAudio reuses its buffer: the queue must hold a copy
        got = mic.read(timeout=0.1)
        assert got.shape == (1280,) and got.dtype == np.float32 and np.all(got == 0.25)
        assert mic.read(timeout=0.01) is None
    assert stream.closed and not stream.started
    assert mic.read() is None  # closed and drained: never blocks


def test_full_queue_drops_and_counts(monkeypatch):
    sd = fake_sounddevice(monkeypatch)
    mic = Microphone(max_blocks=2)
    mic.start()
    cb = sd.streams[0].kw["callback"]
    for v in range(5):
        cb(block(float(v)), 1280, None, None)
    assert mic.dropped == 3
    assert mic.read(0)[0] == 0.0 and mic.read(0)[0] == 1.0 and mic.read(0) is None
    mic.close()
    mic.close()


def test_missing_sounddevice(monkeypatch):
    monkeypatch.setitem(sys.modules, "sounddevice", None)
    with pytest.raises(DeviceError, match=r"pip install 'mlx-speech\[live\]'"):
        Microphone().start()


def test_no_input_device(monkeypatch):
    fake_sounddevice(monkeypatch, has_input=False)
    with pytest.raises(DeviceError, match="no microphone"):
        with Microphone():
            pass


@pytest.mark.parametrize(
    "err, match",
    [
        (
            PortAudioError(
                "Error opening InputStream: Unanticipated host error [-9999]"
            ),
            "cannot open microphone.*Privacy",
        ),
        (
            PortAudioError(
                "Error opening InputStream: Invalid sample rate [PaErrorCode -9997]"
            ),
            "does not support 16000 Hz",
        ),
    ],
)
def test_portaudio_errors(monkeypatch, err, match):
    fake_sounddevice(monkeypatch, open_error=err)
    with pytest.raises(DeviceError, match=match):
        Microphone().start()


def test_import_does_not_load_sounddevice():
    code = (
        "import sys, mlx_speech.audio.devices, mlx_speech.audio;"
        "print('sounddevice' in sys.modules, 'soundfile' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[1],
    )
    assert out.stdout.split() == ["False", "False"]
