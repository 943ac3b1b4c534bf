import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from mlx_speech.audio.devices import Microphone, Speaker, check_output_device
from mlx_speech.errors import DeviceError
from tests.support.sounddevice_fakes import PortAudioError, fake_sounddevice


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


def _returns_within(fn, seconds: float) -> bool:
    t = threading.Thread(target=fn, daemon=True)
    t.start()
    t.join(seconds)
    return not t.is_alive()


def test_microphone_close_never_waits_on_a_stalled_device(monkeypatch):
    sd = fake_sounddevice(monkeypatch, hang_on_stop=True)
    mic = Microphone()
    mic.start()
    assert _returns_within(mic.close, 2.0)  # Ctrl-C must be able to end a live session
    assert sd.streams[0].aborted and sd.streams[0].closed


def test_microphone_tells_quiet_from_gone(monkeypatch):
    sd = fake_sounddevice(monkeypatch)
    with Microphone(max_blocks=4) as mic:
        cb = sd.streams[0].kw["callback"]
        cb(block(0.5), 1280, None, None)
        assert mic.problem(0.05) is None and mic.blocks == 1
        time.sleep(0.1)
        assert mic.problem(0.05).startswith("the microphone delivered no audio for 0.1")
        assert not mic.ended and mic.read(0)[0] == 0.5
        for _ in range(10):  # a consumer that never reads: bounded memory, drops counted
            cb(block(0.5), 1280, None, None)
        assert mic._queue.qsize() == 4 and mic.dropped == 6
        sd.streams[0].active = False  # PortAudio ended the stream: the device went away
        assert mic.ended and mic.problem(60).startswith("the microphone stream ended")
        while mic.read(0) is not None:
            pass
        t0 = time.monotonic()
        assert mic.read(timeout=5) is None and time.monotonic() - t0 < 0.5  # no waiting


def test_read_watched_warns_once_per_quiet_stretch(monkeypatch):
    sd = fake_sounddevice(monkeypatch)
    warnings = []
    with Microphone() as mic:
        cb = sd.streams[0].kw["callback"]
        for _ in range(3):
            assert mic.read_watched(0.05, warnings.append, quiet_seconds=0.08) is None
        assert len(warnings) == 1 and "delivered no audio for" in warnings[0]
        assert warnings[0].endswith("; still listening (Ctrl-C to stop)")
        cb(block(0.5), 1280, None, None)  # audio again: a later quiet stretch is new
        assert mic.read_watched(0.05, warnings.append, quiet_seconds=0.08)[0] == 0.5
        for _ in range(3):
            mic.read_watched(0.05, warnings.append, quiet_seconds=0.08)
        assert len(warnings) == 2
        sd.streams[0].active = False  # gone: the loop ends on `ended`, no quiet warning
        mic.read_watched(0.05, warnings.append, quiet_seconds=0.0)
        assert len(warnings) == 2


def test_missing_sounddevice(monkeypatch):
    monkeypatch.setitem(sys.modules, "sounddevice", None)
    with pytest.raises(DeviceError, match=r"pip install 'mlx-realtime-speech\[live\]'"):
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
        cwd=Path(__file__).resolve().parents[2],
    )
    assert out.stdout.split() == ["False", "False"]


# ---- Speaker ----

def test_speaker_plays_everything_in_order(monkeypatch):
    sd = fake_sounddevice(monkeypatch, run_device=True)
    x = np.linspace(-0.9, 0.9, 1000, dtype=np.float32)
    with Speaker(24000, 256) as sp:
        (stream,) = sd.streams
        assert stream.kw["samplerate"] == 24000 and stream.kw["blocksize"] == 256
        assert stream.kw["channels"] == 1 and stream.kw["dtype"] == "float32"
        for part in np.split(x, [7, 300, 301, 820]):  # odd sizes: carried across writes
            sp.write(part)
    # left normally: drained (all of it is below), then aborted, never stopped: stopping
    # waits on the device, forever if it stalled
    assert stream.closed and stream.aborted
    out = np.concatenate(stream.played)
    start = np.flatnonzero(out)[0]  # silence before the first write is fine
    np.testing.assert_array_equal(out[start:start + 1000], x)
    assert not np.any(out[start + 1000:]) and not np.isnan(out).any()
    assert sp.underruns == 0


def test_speaker_counts_gaps_not_startup_silence(monkeypatch):
    sd = fake_sounddevice(monkeypatch)
    sp = Speaker(16000, 100)
    sp.start()
    stream = sd.streams[0]
    assert not stream.pull().any() and sp.underruns == 0  # nothing written yet
    sp.write(np.full(150, 0.5, np.float32))  # one block queued, 50 samples carried
    assert np.all(stream.pull() == 0.5)
    assert not stream.pull().any() and sp.underruns == 1  # ran dry mid-stream
    stream.pull()
    assert sp.underruns == 1  # one gap, however long
    sp.write(np.full(50, 0.25, np.float32))  # completes the carried block
    got = stream.pull(60)  # callback sizes need not match the block size
    assert np.all(got[:50] == 0.5) and np.all(got[50:] == 0.25)
    got = stream.pull(60)
    assert np.all(got[:40] == 0.25) and not got[40:].any() and sp.underruns == 2
    sp.close()


def test_speaker_write_blocks_instead_of_dropping(monkeypatch):
    sd = fake_sounddevice(monkeypatch)
    sp = Speaker(1000, 100, max_seconds=0.2)  # room for 2 blocks
    sp.start()
    blocks = [np.full(100, v / 10, np.float32) for v in range(5)]
    writer = threading.Thread(target=lambda: sp.write(np.concatenate(blocks)), daemon=True)
    writer.start()
    time.sleep(0.3)
    assert writer.is_alive()  # waiting for room, not dropping
    assert sp.pending_seconds() == pytest.approx(0.2)
    got, deadline = [], time.monotonic() + 5
    while len(got) < 5 and time.monotonic() < deadline:
        if sp.pending_seconds() > 0:  # pull only when audio is there: no underruns here
            got.append(sd.streams[0].pull()[0])
        else:
            time.sleep(0.005)
    writer.join(timeout=2)
    assert not writer.is_alive()
    np.testing.assert_allclose(got, [0.0, 0.1, 0.2, 0.3, 0.4], atol=1e-7)
    sp.close()
    with pytest.raises(DeviceError, match="closed"):
        sp.write(np.zeros(100, np.float32))


def test_speaker_drain_times_out_if_the_device_stalls(monkeypatch):
    fake_sounddevice(monkeypatch)  # nobody pulls audio
    sp = Speaker(1000, 100)
    sp.start()
    sp.write(np.zeros(250, np.float32))
    t0 = time.monotonic()
    assert sp.drain(timeout=0.2) is False
    assert 0.15 < time.monotonic() - t0 < 2
    sp.close()


def test_speaker_that_stops_taking_audio_never_hangs(monkeypatch):
    sd = fake_sounddevice(monkeypatch, hang_on_stop=True)  # and nobody pulls
    sp = Speaker(1000, 100, max_seconds=0.2, stall_seconds=0.3)
    sp.start()
    raised = []

    def write():  # the queue fills, then the stall shows
        try:
            sp.write(np.zeros(1000, np.float32))
        except DeviceError as e:
            raised.append(str(e))

    assert _returns_within(write, 2.0)
    assert raised and raised[0].startswith("the audio output took no audio for 0.")
    assert not sp.offer(np.zeros(100, np.float32)) and sp.dropped == 1  # never blocks
    assert sp.drain() is False and sp.failure.startswith("the audio output took no audio")
    assert _returns_within(sp.close, 2.0) and sd.streams[0].aborted


def test_speaker_device_gone(monkeypatch):
    sd = fake_sounddevice(monkeypatch)
    sp = Speaker(1000, 100, max_seconds=0.2)
    sp.start()
    sd.streams[0].active = False  # PortAudio ended the stream
    with pytest.raises(DeviceError, match="the audio output device went away"):
        sp.write(np.zeros(1000, np.float32))
    sp.close()


def test_speaker_exception_aborts_without_draining(monkeypatch):
    sd = fake_sounddevice(monkeypatch)  # nobody pulls: draining would hang
    with pytest.raises(KeyboardInterrupt):
        with Speaker(1000, 100) as sp:
            sp.write(np.zeros(10000, np.float32))
            raise KeyboardInterrupt
    assert sd.streams[0].aborted and sd.streams[0].closed


def test_speaker_prebuffer(monkeypatch):
    sd = fake_sounddevice(monkeypatch)
    sp = Speaker(1000, 100, prebuffer_seconds=0.3)
    sp.start()
    sp.write(np.ones(200, np.float32))
    assert not sd.streams[0].pull().any() and sp.underruns == 0  # 2 of 3 blocks: waiting
    sp.write(np.ones(100, np.float32))
    assert sd.streams[0].pull().all()
    sp.close()


def test_speaker_callback_never_raises(monkeypatch):
    fake_sounddevice(monkeypatch)
    sp = Speaker(1000, 100)
    sp.start()
    sp.write(np.ones(100, np.float32))
    bad = np.ones(7, np.float32)  # not (frames, channels): the callback must swallow it
    sp._callback(bad, 100, None, None)
    assert not bad.any()
    sp.close()


def test_speaker_device_errors_carry_the_hint(monkeypatch):
    fake_sounddevice(monkeypatch, has_output=False)
    with pytest.raises(DeviceError, match="no audio output device; use -o FILE"):
        Speaker(24000, 480, hint="; use -o FILE").start()
    with pytest.raises(DeviceError, match="no audio output device matching 'hdmi'"):
        check_output_device("hdmi")
    fake_sounddevice(monkeypatch, open_error=PortAudioError("Invalid sample rate"))
    with pytest.raises(DeviceError, match="does not support 24000 Hz"):
        Speaker(24000).start()
    monkeypatch.setitem(sys.modules, "sounddevice", None)
    with pytest.raises(DeviceError, match=r"mlx-realtime-speech\[live\]'; use -o FILE"):
        check_output_device(hint="; use -o FILE")
