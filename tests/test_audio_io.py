import numpy as np
import pytest
import soundfile as sf

from mlx_speech.audio import check_audio, load_audio, write_audio
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
    with pytest.raises(AudioError, match="not found"):
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


def test_write_ogg_and_explicit_format(tmp_path):
    write_audio(tmp_path / "o.ogg", sine(24000), 24000)
    assert sf.info(str(tmp_path / "o.ogg")).format == "OGG"
    write_audio(tmp_path / "noext", sine(16000), 16000, format="wav")
    assert sf.info(str(tmp_path / "noext")).format == "WAV"


def test_write_errors(tmp_path):
    with pytest.raises(MlxSpeechError, match="unsupported audio format 'mp3'"):
        write_audio(tmp_path / "o.mp3", sine(16000), 16000)
    with pytest.raises(MlxSpeechError, match="does not exist"):
        write_audio(tmp_path / "missing" / "o.wav", sine(16000), 16000)
    with pytest.raises(MlxSpeechError, match="cannot write"):
        write_audio(tmp_path, sine(16000), 16000, format="wav")  # a folder
    with pytest.raises(AudioError, match="NaN"):
        write_audio(tmp_path / "o.wav", np.array([np.nan], np.float32), 16000)
