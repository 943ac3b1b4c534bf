import numpy as np
import pytest

from mlx_speech.audio.resample import resample


def tone(f: float, sr: int, n: int) -> np.ndarray:
    return np.sin(2 * np.pi * f * np.arange(n) / sr).astype(np.float32)


def inner(y: np.ndarray, edge: int) -> np.ndarray:
    return y[edge:-edge]


@pytest.mark.parametrize(
    "sr_in, sr_out, f",
    [
        (44100, 16000, 1000),
        (48000, 16000, 1000),
        (16000, 44100, 1000),
        (8000, 16000, 3000),
    ],
)
def test_tone_keeps_frequency_and_amplitude(sr_in, sr_out, f):
    y = resample(tone(f, sr_in, sr_in), sr_in, sr_out)
    assert y.dtype == np.float32 and len(y) == sr_out
    ref = tone(f, sr_out, len(y))
    assert np.abs(inner(y - ref, sr_out // 20)).max() < 1e-2


def test_roll_off_band_is_attenuated():
    # 7.5 kHz sits in the roll-off just below the new 8 kHz Nyquist
    y = resample(tone(7500, 48000, 48000), 48000, 16000)
    assert np.abs(inner(y, 800)).max() < 0.15


@pytest.mark.parametrize(
    "sr_in, f", [(48000, 9000), (48000, 12000), (44100, 8500), (44100, 20000)]
)
def test_tones_above_new_nyquist_do_not_alias(sr_in, f):
    y = resample(tone(f, sr_in, sr_in), sr_in, 16000)
    assert np.abs(inner(y, 800)).max() < 1e-3  # -60 dB


def test_upsampling_has_no_images():
    y = resample(tone(3000, 16000, 16000), 16000, 48000)
    spec = np.abs(np.fft.rfft(inner(y, 2400) * np.hanning(len(y) - 4800)))
    freqs = np.fft.rfftfreq(len(y) - 4800, 1 / 48000)
    assert spec[freqs > 8000].max() < 1e-3 * spec.max()


def test_identity_and_dtype():
    x = np.random.default_rng(0).standard_normal(1000)
    y = resample(x, 16000, 16000)
    assert y.dtype == np.float32 and np.array_equal(y, x.astype(np.float32))


@pytest.mark.parametrize(
    "n, sr_in, sr_out",
    [
        (0, 44100, 16000),
        (1, 44100, 16000),
        (7, 48000, 16000),
        (441, 44100, 16000),
        (1001, 16000, 24000),
        (12345, 22050, 16000),
    ],
)
def test_lengths(n, sr_in, sr_out):
    y = resample(np.ones(n, np.float32), sr_in, sr_out)
    assert len(y) == -(-n * sr_out // sr_in)


def test_dc_is_preserved():
    y = resample(np.full(44100, 0.5, np.float32), 44100, 16000)
    assert np.allclose(inner(y, 800), 0.5, atol=1e-4)


def test_rejects_bad_input():
    with pytest.raises(ValueError):
        resample(np.zeros((2, 10)), 16000, 8000)
    with pytest.raises(ValueError):
        resample(np.zeros(10), 0, 8000)
