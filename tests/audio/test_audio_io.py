from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from mlx_speech.audio import (
    atomic_output,
    audio_at,
    check_audio,
    check_writable,
    load_audio,
    output_format,
    resample,
    write_audio,
)
from mlx_speech.errors import AudioError, MlxSpeechError


def sine(sr: int, seconds: float = 0.5, f: float = 440.0) -> np.ndarray:
    return (0.5 * np.sin(2 * np.pi * f * np.arange(int(sr * seconds)) / sr)).astype(
        np.float32
    )


def test_load_mono_no_log(tmp_path):
    x = sine(16000)
    sf.write(tmp_path / "a.wav", x, 16000, subtype="FLOAT")
    msgs = []
    y, sr = load_audio(tmp_path / "a.wav", 16000, log=msgs.append)
    assert sr == 16000 and y.dtype == np.float32 and y.ndim == 1
    assert np.array_equal(y, x) and msgs == []


def test_load_stereo_is_mixed_and_logged(tmp_path):
    left, right = sine(16000), sine(16000, f=880.0)
    sf.write(tmp_path / "s.wav", np.stack([left, right], 1), 16000, subtype="FLOAT")
    msgs = []
    y, sr = load_audio(tmp_path / "s.wav", log=msgs.append)
    assert sr == 16000 and y.shape == left.shape
    assert np.allclose(y, (left + right) / 2, atol=1e-6)
    assert len(msgs) == 1 and "2 channels" in msgs[0] and "mono" in msgs[0]


def test_load_resamples_and_logs(tmp_path):
    sf.write(tmp_path / "r.flac", sine(44100), 44100)
    msgs = []
    y, sr = load_audio(tmp_path / "r.flac", 16000, log=msgs.append)
    assert sr == 16000 and len(y) == 8000
    assert len(msgs) == 1 and "44100" in msgs[0] and "16000" in msgs[0]
    assert np.abs(y[800:-800] - sine(16000)[800:-800]).max() < 1e-2


def test_load_keeps_rate_when_not_asked(tmp_path):
    sf.write(tmp_path / "r.wav", sine(22050), 22050)
    msgs = []
    _, sr = load_audio(tmp_path / "r.wav", log=msgs.append)
    assert sr == 22050 and msgs == []


def test_default_log_goes_to_stderr(tmp_path, capsys):
    sf.write(tmp_path / "r.wav", sine(8000), 8000)
    load_audio(tmp_path / "r.wav", 16000)
    cap = capsys.readouterr()
    assert "resampling" in cap.err and cap.out == ""


def test_missing_and_directory(tmp_path):
    with pytest.raises(AudioError, match="no such file"):
        load_audio(tmp_path / "nope.wav")
    with pytest.raises(AudioError, match="folder"):
        load_audio(tmp_path)


@pytest.mark.parametrize(
    "name, content", [("bad.wav", b"RIFF\x00\x00garbage"), ("notes.txt", b"hello")]
)
def test_corrupt_or_unsupported(tmp_path, name, content):
    (tmp_path / name).write_bytes(content)
    with pytest.raises(AudioError, match="not supported or .*corrupt") as e:
        load_audio(tmp_path / name)
    assert name in str(e.value)


def test_empty_file(tmp_path):
    sf.write(tmp_path / "e.wav", np.zeros(0, np.float32), 16000)
    with pytest.raises(AudioError, match="empty"):
        load_audio(tmp_path / "e.wav")


def test_nan_in_file(tmp_path):
    x = sine(16000)
    x[100] = np.nan
    sf.write(tmp_path / "n.wav", x, 16000, subtype="FLOAT")
    with pytest.raises(AudioError, match="NaN"):
        load_audio(tmp_path / "n.wav")


def test_check_audio():
    assert check_audio([0.0, 0.5]).dtype == np.float32
    assert np.allclose(check_audio(np.array([[1.0, 0.0], [0.0, 1.0]])), [0.5, 0.5])
    assert np.allclose(check_audio(np.array([16384, -32768], np.int16)), [0.5, -1.0])
    assert check_audio(np.zeros(0)).shape == (0,)
    with pytest.raises(AudioError, match="mic.*NaN"):
        check_audio(np.array([0.0, np.nan]), name="mic")
    with pytest.raises(AudioError, match="infinite"):
        check_audio(np.array([np.inf]))
    with pytest.raises(AudioError, match="1-D"):
        check_audio(np.zeros((2, 2, 2)))


@pytest.mark.parametrize("ext", ["wav", "flac"])
def test_write_round_trip(tmp_path, ext):
    x = sine(24000)
    write_audio(tmp_path / f"o.{ext}", x, 24000)
    y, sr = load_audio(tmp_path / f"o.{ext}", log=lambda m: None)
    assert sr == 24000 and len(y) == len(x)
    assert np.abs(y - x).max() < 1e-4
    assert sf.info(str(tmp_path / f"o.{ext}")).format == ext.upper()


# (suffix, sample rate in, container, subtype, rate in the file)
LOSSY = [
    ("ogg", 24000, "OGG", "VORBIS", 24000),
    ("opus", 24000, "OGG", "OPUS", 24000),  # a rate Opus takes: kept
    ("opus", 22050, "OGG", "OPUS", 48000),  # one it does not: resampled to 48 kHz
    ("mp3", 24000, "MP3", "MPEG_LAYER_III", 24000),
    ("mp3", 96000, "MP3", "MPEG_LAYER_III", 48000),  # above MPEG's rates
    ("mp3", 20000, "MP3", "MPEG_LAYER_III", 22050),  # the next MPEG rate up
]


@pytest.mark.parametrize("ext,sr,container,subtype,sr_file", LOSSY)
def test_write_lossy_formats(tmp_path, ext, sr, container, subtype, sr_file):
    x = sine(sr, seconds=1.0)
    p = tmp_path / f"o.{ext}"
    write_audio(p, x, sr)
    info = sf.info(str(p))
    assert (info.format, info.subtype, info.samplerate) == (container, subtype, sr_file)
    y, sr_read = sf.read(str(p), dtype="float32")
    assert sr_read == sr_file
    assert abs(len(y) - sr_file) <= 0.01 * sr_file  # 1 s, give or take codec padding
    # still a 440 Hz tone: its energy sits in the 440 Hz bin
    spec = np.abs(np.fft.rfft(y[: sr_file // 2] * np.hanning(sr_file // 2)))
    assert abs(np.argmax(spec) * 2 - 440) <= 4


def test_write_raw_pcm(tmp_path):
    x = np.array([0.0, 0.5, -0.5, 1.0, -1.0, 2.0], np.float32)
    for name in ("o.pcm", "o.raw"):
        write_audio(tmp_path / name, x, 24000)
        y = np.fromfile(tmp_path / name, dtype="<i2")
        assert y.tolist() == [0, 16384, -16384, 32767, -32767, 32767]  # clipped, no header
    write_audio(tmp_path / "o.bin", sine(24000), 24000, format="pcm")
    assert (tmp_path / "o.bin").stat().st_size == 2 * 12000


def test_write_ogg_and_explicit_format(tmp_path):
    write_audio(tmp_path / "o.ogg", sine(24000), 24000)
    assert sf.info(str(tmp_path / "o.ogg")).format == "OGG"
    write_audio(tmp_path / "noext", sine(16000), 16000, format="wav")
    assert sf.info(str(tmp_path / "noext")).format == "WAV"
    write_audio(tmp_path / "x.wav", sine(16000), 16000, format="FLAC")  # format wins
    assert sf.info(str(tmp_path / "x.wav")).format == "FLAC"


def test_output_format():
    assert output_format("a.WAV") == "wav" and output_format("a.raw") == "pcm"
    assert output_format("a", "opus") == "opus"
    with pytest.raises(MlxSpeechError, match="unsupported audio format 'm4a'.*wav, flac, ogg"):
        output_format("a.m4a")
    with pytest.raises(MlxSpeechError, match="no extension"):
        output_format("out")


def test_missing_encoder_is_named(monkeypatch):
    monkeypatch.setattr(sf, "available_formats", lambda: {"WAV": "", "FLAC": "", "OGG": ""})
    with pytest.raises(MlxSpeechError, match=r"no mp3 encoder \(needs libsndfile >= 1.1"):
        output_format("a.mp3")
    assert output_format("a.wav") == "wav"


def test_write_errors(tmp_path):
    with pytest.raises(MlxSpeechError, match="unsupported audio format 'aac'"):
        write_audio(tmp_path / "o.aac", sine(16000), 16000)
    with pytest.raises(MlxSpeechError, match="does not exist"):
        write_audio(tmp_path / "missing" / "o.wav", sine(16000), 16000)
    with pytest.raises(MlxSpeechError, match="is a folder"):
        write_audio(tmp_path, sine(16000), 16000, format="wav")
    (tmp_path / "file").write_text("x")
    with pytest.raises(MlxSpeechError, match="cannot write"):
        write_audio(tmp_path / "file" / "o.wav", sine(16000), 16000)
    with pytest.raises(AudioError, match="NaN"):
        write_audio(tmp_path / "o.wav", np.array([np.nan], np.float32), 16000)
    with pytest.raises(AudioError, match="mono"):
        write_audio(tmp_path / "o.wav", np.zeros((4, 2), np.float32), 16000)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]  # no temp files left


def test_failed_write_keeps_the_old_file(tmp_path, monkeypatch):
    p = tmp_path / "o.wav"
    write_audio(p, sine(16000), 16000)
    before = p.read_bytes()

    def broken(path, *a, **k):
        Path(path).write_bytes(b"RIFF half")
        raise RuntimeError("disk full")

    monkeypatch.setattr(sf, "write", broken)
    with pytest.raises(MlxSpeechError, match="cannot write .*o.wav: disk full"):
        write_audio(p, sine(8000), 8000)
    assert p.read_bytes() == before
    assert [q.name for q in tmp_path.iterdir()] == ["o.wav"]


def test_atomic_output_and_check_writable(tmp_path):
    p = tmp_path / "a.bin"
    with atomic_output(p) as tmp:
        assert tmp.parent == tmp_path and tmp.suffix == ".bin" and tmp.exists()
        tmp.write_bytes(b"ok")
        assert not p.exists()
    assert p.read_bytes() == b"ok"
    with pytest.raises(KeyboardInterrupt), atomic_output(p) as tmp:
        tmp.write_bytes(b"partial")
        raise KeyboardInterrupt
    assert p.read_bytes() == b"ok" and [q.name for q in tmp_path.iterdir()] == ["a.bin"]
    check_writable(p)
    check_writable(tmp_path / "new.wav")
    assert p.read_bytes() == b"ok" and [q.name for q in tmp_path.iterdir()] == ["a.bin"]
    with pytest.raises(MlxSpeechError, match="does not exist"):
        check_writable(tmp_path / "no" / "x.wav")


def test_audio_at_reads_checks_and_resamples_one_way(tmp_path):
    """A file, samples at the rate, samples at another rate: what the models take, one way."""
    x = sine(24000)
    sf.write(tmp_path / "a.wav", x, 24000, subtype="FLOAT")
    np.testing.assert_array_equal(audio_at(tmp_path / "a.wav", 16000),
                                  load_audio(tmp_path / "a.wav", 16000)[0])
    np.testing.assert_array_equal(audio_at(x, 24000), x)
    np.testing.assert_array_equal(audio_at(x, 16000, 24000), resample(x, 24000, 16000))
    pcm = (x * 32767).astype(np.int16)
    np.testing.assert_array_equal(audio_at(pcm, 24000, 24000), pcm / np.float32(32768))
    with pytest.raises(AudioError, match="NaN"):
        audio_at(np.array([0.0, np.nan], np.float32), 16000)
