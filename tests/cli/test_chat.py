"""mlx_speech.chat: the offline and live step loops, and bad input, on a fake duplex model.

The real-model end to end test (tiny Moshi checkpoint) lives in test_duplex_session.py.
"""

from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

import mlx_speech
from mlx_speech import chat
from mlx_speech.errors import MlxSpeechError

SR, FRAME = 1600, 32


class FakeSession:
    def __init__(self, **kwargs):
        self.kwargs = kwargs
        self.steps = 0

    def step(self, user):
        assert user.shape == (FRAME,) and user.dtype == np.float32
        self.steps += 1
        return np.full(FRAME, 0.01 * self.steps, np.float32), ("hi " if self.steps == 2 else "")


class FakeDuplex:
    kind = "duplex"
    sample_rate, frame_size, voices = SR, FRAME, ["NATF0", "NATM1"]

    def __init__(self):
        self.sessions = []

    def session(self, **kwargs):
        if kwargs["voice"] not in (None, *self.voices):
            raise MlxSpeechError(f"unknown voice {kwargs['voice']!r} (known: NATF0, NATM1)")
        s = FakeSession(**kwargs)
        self.sessions.append(s)
        return s


@pytest.fixture
def fake(monkeypatch):
    model = FakeDuplex()
    monkeypatch.setattr(mlx_speech, "load", lambda *a, **k: model)
    return model


def _wav(path, n):
    sf.write(str(path), np.random.default_rng(0).uniform(-0.5, 0.5, n).astype(np.float32), SR)
    return path


def test_offline_writes_every_frame_and_prints_text(fake, tmp_path, capsys):
    src, dst = _wav(tmp_path / "q.wav", 100), tmp_path / "a.wav"
    rc = chat.main(["--input", str(src), "-o", str(dst), "--tail", "0.1", "--voice", "NATF0",
                    "--role", "tutor", "--seed", "3", "--temp", "0", "--user-lag", "1"])
    assert rc == 0
    out, rate = sf.read(str(dst), dtype="float32")
    n_frames = -(-(100 + 160) // FRAME)
    assert rate == SR and len(out) == n_frames * FRAME
    assert fake.sessions[0].steps == n_frames
    assert fake.sessions[0].kwargs == dict(voice="NATF0", role="tutor", seed=3, temp=0.0,
                                           temp_text=None, user_lag=1)
    assert np.allclose(out[FRAME:2 * FRAME], 0.02, atol=1e-4)  # second frame = second step
    assert "hi" in capsys.readouterr().out


def test_list_voices(fake, capsys):
    assert chat.main(["--list-voices"]) == 0
    assert capsys.readouterr().out.split() == ["NATF0", "NATM1"]


@pytest.mark.parametrize("argv, message", [
    (["-o", "x.wav"], "-o needs --input"),
    (["--input", "missing.wav"], "no such file"),
    (["--input", "{wav}", "-o", "{tmp}/a.xyz"], "unsupported audio format"),
    (["--input", "{wav}", "-o", "{tmp}/nofolder/a.wav"], "does not exist"),
    (["--input", "{wav}", "--voice", "NOPE"], "unknown voice"),
    (["--input", "{empty}"], "empty"),
    (["--input", "{wav}", "--tail", "-1"], "--tail"),
])
def test_bad_input_is_one_line(fake, tmp_path, capsys, argv, message):
    wav = _wav(tmp_path / "q.wav", 64)
    empty = tmp_path / "e.wav"
    sf.write(str(empty), np.zeros(0, np.float32), SR)
    argv = [a.format(wav=wav, tmp=tmp_path, empty=empty) for a in argv]
    assert chat.main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error:") and message in err[-1]


def test_not_a_duplex_model(tmp_path, capsys):
    asr = Path(__file__).parents[1] / "golden" / "voxtral_realtime" / "mistral"  # a real one
    assert chat.main(["--model", str(asr), "--input", str(_wav(tmp_path / "q.wav", 64))]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert "speech-to-text model, not full-duplex" in err[-1]


class FakeMic:
    """Delivers a burst of frames at once, as if the model had stalled."""

    ended = False
    check = staticmethod(lambda device=None: None)  # a microphone is there

    def __init__(self, sample_rate, block_samples):
        self.blocks = [np.full(block_samples, i, np.float32) for i in range(8)]
        self.dropped = 2

    def silent_for(self):
        return 0.0

    def problem(self, quiet_seconds):
        return None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass

    def read(self, timeout=None):
        if self.blocks:
            return self.blocks.pop(0)
        if timeout == 0:
            return None
        raise KeyboardInterrupt  # the user stops the session

    def read_watched(self, timeout, warn):
        return self.read(timeout)


class FakeSpeaker:
    failure, dropped = None, 0
    check = staticmethod(lambda device=None, hint="": None)  # a speaker is there

    def __init__(self, sample_rate, block_samples, **kw):
        self.written, self.underruns = [], 1

    def problem(self):
        return None

    def close(self, abort=False):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass

    def offer(self, pcm):
        self.written.append(pcm)


def test_live_loop_drops_backlog_and_reports(fake, monkeypatch, capsys):
    import mlx_speech.audio.devices as devices
    from tests.support.sounddevice_fakes import fake_sounddevice

    fake_sounddevice(monkeypatch)  # the device checks pass without PortAudio installed
    monkeypatch.setattr(devices, "Microphone", FakeMic)
    monkeypatch.setattr(devices, "Speaker", FakeSpeaker, raising=False)
    assert chat.main([]) == 0
    s = fake.sessions[0]
    # 8 frames arrive at once; only the newest 3 are kept, so 3 steps run and 5 + 2 are dropped
    assert s.steps == 3
    err = capsys.readouterr().err
    assert "3 frames" in err and "7 mic frames dropped" in err and "1 speaker underruns" in err
