"""mlx_speech.audio.decode: files probed, then decoded block by block (mixed down and resampled
on the way) in memory flat in their length; truncated, damaged, NaN and unsupported files;
the formats PyAV reads (m4a, mp4, mov, webm, mkv, aac)."""

from __future__ import annotations

import io
import struct
import sys
import tracemalloc

import numpy as np
import pytest
import soundfile as sf

from mlx_speech.audio.decode import check_samples, decode, probe
from mlx_speech.audio.resample import resample
from mlx_speech.errors import AudioError, MissingDependency


def _stereo(seconds: float, rate: int = 48000, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * rate)) / rate
    left = 0.3 * np.sin(2 * np.pi * 440 * t)
    return np.stack([left, 0.5 * left + 0.05 * rng.standard_normal(len(t))], 1).astype(
        np.float32)


def test_blocks_join_to_the_whole_file_mixed_down_and_resampled(tmp_path):
    x = _stereo(7.3)
    sf.write(tmp_path / "s.wav", x, 48000, subtype="FLOAT")
    info = probe(tmp_path / "s.wav")
    assert (info.sample_rate, info.channels, info.frames) == (48000, 2, len(x))
    assert info.duration == pytest.approx(7.3) and info.floating
    said: list[str] = []
    d = decode(tmp_path / "s.wav", 16000, block_s=1.0, log=said.append)
    blocks = list(d)
    assert [len(b) for b in blocks[:-1]] == [16000] * 7 and 0 < len(blocks[-1]) <= 16000
    want = resample(x.mean(axis=1, dtype=np.float32), 48000, 16000)
    np.testing.assert_array_equal(np.concatenate(blocks), want)  # exactly the whole at once
    assert d.read_s == pytest.approx(7.3) and d.problem is None
    assert said == ["s.wav: mixing 2 channels down to mono",
                    "s.wav: resampling 48000 Hz -> 16000 Hz"]


def test_memory_is_flat_in_the_file_length(tmp_path):
    """Old: a file was decoded whole at its own rate and channels (a 30-minute 48 kHz stereo
    WAV took 1.98 GB). Now the blocks' memory does not grow with the file: 4 minutes peak as
    1 minute does (the resampler's bounded window gathers, ~36 MB), below the 92 MB the 4
    minutes take decoded whole at their own rate."""
    peaks = {}
    for minutes in (1, 4):
        path = tmp_path / f"{minutes}.wav"
        with sf.SoundFile(path, "w", 48000, 2, "PCM_16") as f:
            for i in range(minutes * 6):
                f.write(_stereo(10.0, seed=i))
        tracemalloc.start()
        n = sum(len(b) for b in decode(path, 16000))
        peaks[minutes] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert n == minutes * 60 * 16000
    assert peaks[4] < 1.5 * peaks[1] + (1 << 20), peaks
    assert peaks[4] < 48 << 20, peaks


def _claims_more(path, seconds: float) -> None:
    """Rewrite a WAV header so it announces `seconds` of audio (a truncated download)."""
    b = bytearray(path.read_bytes())
    i = b.find(b"data")
    size = int(seconds * 16000) * 2
    b[i + 4: i + 8] = struct.pack("<I", size)
    b[4:8] = struct.pack("<I", size + i)
    path.write_bytes(bytes(b))


def test_a_truncated_wav_ends_with_a_warning_naming_what_was_read(tmp_path):
    """Old: a WAV whose header claimed 3 hours but held 2 s decoded silently."""
    p = tmp_path / "cut.wav"
    sf.write(p, np.full(32000, 0.1, np.float32), 16000, subtype="PCM_16")
    _claims_more(p, 3 * 3600)
    info = probe(p)
    assert info.frames == 32000 and info.declared_frames == 3 * 3600 * 16000
    said: list[str] = []
    assert sum(len(b) for b in decode(p, 16000, log=said.append)) == 32000
    assert said == [f"warning: {p} is truncated: its header announces 3:00:00 of audio, the "
                    "file holds 2.0 s; only that much was read"]
    whole = tmp_path / "whole.wav"  # a header that says what the file holds: no warning
    sf.write(whole, np.full(32000, 0.1, np.float32), 16000, subtype="PCM_16")
    said.clear()
    list(decode(whole, 16000, log=said.append))
    assert said == [] and probe(whole).declared_frames is None


def test_a_damaged_flac_keeps_what_was_read_and_says_so(tmp_path):
    p = tmp_path / "d.flac"
    sf.write(p, _stereo(20.0, 16000)[:, 0], 16000, format="FLAC")
    data = p.read_bytes()
    p.write_bytes(data[: len(data) // 4])
    said: list[str] = []
    d = decode(p, 16000, log=said.append)
    n = sum(len(b) for b in d)
    assert 0 < n < 20 * 16000 and d.problem
    assert len(said) == 1 and said[0].startswith(f"warning: {p} is damaged or truncated: "
                                                 "decoding stopped after ")
    assert "only that much was read" in said[0]


def test_nan_is_found_before_any_model_loads(tmp_path):
    x = np.zeros(48000, np.float32)
    x[30000] = np.nan
    sf.write(tmp_path / "n.wav", x, 16000, subtype="FLOAT")
    with pytest.raises(AudioError, match=r"n\.wav contains NaN or infinite samples \(first at "
                                         r"1\.875 s\)"):
        check_samples(tmp_path / "n.wav")
    with pytest.raises(AudioError, match="NaN"):
        list(decode(tmp_path / "n.wav", 16000))
    sf.write(tmp_path / "ok.wav", np.zeros(480, np.float32), 16000, subtype="PCM_16")
    assert not check_samples(tmp_path / "ok.wav").floating  # integers: nothing to scan


def test_empty_missing_and_unsupported_files_say_what_is_supported(tmp_path):
    (tmp_path / "zero.wav").write_bytes(b"")
    with pytest.raises(AudioError, match=r"zero\.wav is empty \(0 bytes\)$"):
        probe(tmp_path / "zero.wav")
    sf.write(tmp_path / "none.wav", np.zeros(0, np.float32), 16000)
    with pytest.raises(AudioError, match=r"is empty \(0 samples\)$"):
        probe(tmp_path / "none.wav")
    with pytest.raises(AudioError, match="no such file"):
        probe(tmp_path / "absent.wav")
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(AudioError) as e:
        probe(tmp_path / "notes.txt")
    msg = str(e.value)
    assert "format not supported or file is corrupt" in msg
    for fmt in ("wav", "flac", "ogg", "mp3", "m4a", "mp4", "webm", "aac"):
        assert fmt in msg.split("; ", 1)[1], msg
    assert "mlx-realtime-speech[formats]" in msg


def test_file_objects_decode_like_paths(tmp_path):
    """What the server will hand it: an upload's bytes, no file name."""
    x = _stereo(2.0, 44100)
    buf = io.BytesIO()
    sf.write(buf, x, 44100, format="FLAC")
    buf.seek(0)
    info = probe(buf)
    assert (info.sample_rate, info.channels) == (44100, 2) and buf.tell() == 0
    got = np.concatenate(list(decode(buf, 16000)))
    sf.write(tmp_path / "f.flac", x, 44100)
    np.testing.assert_array_equal(got, np.concatenate(list(decode(tmp_path / "f.flac", 16000))))


def _encode(path, fmt: str, codec: str, x: np.ndarray, rate: int, with_video=False) -> None:
    av = pytest.importorskip("av")
    c = av.open(str(path), "w", format=fmt)
    s = c.add_stream(codec, rate=rate, layout="stereo")
    if with_video:
        v = c.add_stream("mpeg4", rate=10)
        v.width, v.height, v.pix_fmt = 32, 32, "yuv420p"
        for i in range(5):
            frame = av.VideoFrame.from_ndarray(np.full((32, 32, 3), i * 40, np.uint8), "rgb24")
            for pkt in v.encode(frame):
                c.mux(pkt)
        for pkt in v.encode(None):
            c.mux(pkt)
    frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(x.T), format="fltp",
                                       layout="stereo")
    frame.sample_rate = rate
    for pkt in [*s.encode(frame), *s.encode(None)]:
        c.mux(pkt)
    c.close()


@pytest.mark.parametrize("name, fmt, codec", [
    ("memo.m4a", "ipod", "aac"), ("clip.mp4", "mp4", "aac"), ("clip.mov", "mov", "aac"),
    ("rec.webm", "webm", "libopus"), ("rec.mkv", "matroska", "libopus"),
    ("raw.aac", "adts", "aac"),
])
def test_voice_memos_and_browser_recordings_open(tmp_path, name, fmt, codec):
    """Old: "format not supported or file is corrupt" for what phones and browsers record."""
    x = _stereo(3.0)
    _encode(tmp_path / name, fmt, codec, x, 48000, with_video=name.endswith(".mp4"))
    info = probe(tmp_path / name)
    assert info.reader == "av" and (info.sample_rate, info.channels) == (48000, 2)
    assert info.duration == pytest.approx(3.0, abs=0.2)
    said: list[str] = []
    y = np.concatenate(list(decode(tmp_path / name, 16000, log=said.append)))
    assert abs(len(y) - 48000) < 16000 * 0.1 and not [m for m in said if "warning" in m]
    # the lossy codecs keep the 440 Hz tone: compare spectra, not samples
    ref = resample(x.mean(axis=1), 48000, 16000)
    spec = np.abs(np.fft.rfft(y[4000:36000]))
    assert np.argmax(spec) == np.argmax(np.abs(np.fft.rfft(ref[4000:36000])))


def test_without_pyav_the_error_names_the_extra(tmp_path, monkeypatch):
    (tmp_path / "memo.m4a").write_bytes(b"\0\0\0\x20ftypM4A ")
    monkeypatch.setitem(sys.modules, "av", None)
    with pytest.raises(MissingDependency, match=r"^reading \.m4a files needs av: pip install "
                                                r"'mlx-realtime-speech\[formats\]'$"):
        probe(tmp_path / "memo.m4a")
