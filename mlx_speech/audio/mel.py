"""Whisper-style log-mel front end (Voxtral Realtime) with an exact streaming form.

Computed in float64 numpy and cast to float32: frames are independent, so a
frame computed in a 1-sample chunk equals the same frame computed offline.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np


def _hz_to_mel(f: np.ndarray) -> np.ndarray:
    f = np.asarray(f, np.float64)
    log_part = 15.0 + np.log(np.maximum(f, 1e-10) / 1000.0) * (27.0 / np.log(6.4))
    return np.where(f < 1000.0, 3.0 * f / 200.0, log_part)


def _mel_to_hz(m: np.ndarray) -> np.ndarray:
    m = np.asarray(m, np.float64)
    return np.where(m < 15.0, 200.0 * m / 3.0, 1000.0 * np.exp((m - 15.0) * np.log(6.4) / 27.0))


@lru_cache(maxsize=8)
def mel_filters(sample_rate: int, n_fft: int, n_mels: int) -> np.ndarray:
    """Slaney-scale, Slaney-normalised triangular filters, shape (n_fft//2+1, n_mels)."""
    fft_freqs = np.linspace(0.0, sample_rate / 2, n_fft // 2 + 1)
    pts = _mel_to_hz(np.linspace(_hz_to_mel(0.0), _hz_to_mel(sample_rate / 2), n_mels + 2))
    lo, mid, hi = pts[:-2, None], pts[1:-1, None], pts[2:, None]
    up = (fft_freqs[None] - lo) / (mid - lo)
    down = (hi - fft_freqs[None]) / (hi - mid)
    fb = np.maximum(0.0, np.minimum(up, down)) * (2.0 / (hi - lo))
    return np.ascontiguousarray(fb.T)


class SparseFilterbank:
    """`power @ filters` over the filters' nonzero taps only (triangular mel filters have about
    two per frequency bin, not n_mels): a few dozen microseconds per streaming chunk where a
    BLAS call on a (16, 257) x (257, 128) float64 product spends milliseconds waking threads,
    and each row's sums in one fixed order whatever the number of rows."""

    def __init__(self, filters: np.ndarray):
        self.n_mels = filters.shape[1]
        mels, bins = np.nonzero(filters.T)  # ordered by mel, then bin
        self.bins, self.weights = bins, filters.T[mels, bins]
        self.mels, self.starts = np.unique(mels, return_index=True)

    def __call__(self, power: np.ndarray) -> np.ndarray:
        out = np.zeros((power.shape[0], self.n_mels), power.dtype)
        out[:, self.mels] = np.add.reduceat(power[:, self.bins] * self.weights, self.starts,
                                            axis=1)
        return out


class LogMel:
    """Frame k is centred on sample k*hop of the signal, window `n_fft`."""

    def __init__(self, sample_rate: int = 16000, n_fft: int = 400, hop: int = 160,
                 n_mels: int = 128, log_mel_max: float | None = 1.5):
        self.sample_rate, self.n_fft, self.hop, self.n_mels = sample_rate, n_fft, hop, n_mels
        self.log_mel_max = log_mel_max
        n = np.arange(n_fft)
        self.window = 0.5 - 0.5 * np.cos(2 * np.pi * n / n_fft)  # periodic Hann
        self.filters = mel_filters(sample_rate, n_fft, n_mels)

    def frames(self, x: np.ndarray, n_frames: int) -> np.ndarray:
        """(n_frames, n_mels) float32 from `x` whose sample 0 is frame 0's first sample."""
        if n_frames <= 0:
            return np.zeros((0, self.n_mels), np.float32)
        idx = np.lib.stride_tricks.sliding_window_view(x, self.n_fft)[:: self.hop][:n_frames]
        spec = np.fft.rfft(idx.astype(np.float64) * self.window, axis=-1)
        power = spec.real**2 + spec.imag**2
        mel = np.log10(np.maximum(power @ self.filters, 1e-10))
        # Voxtral uses a fixed floor (global max - 8) instead of Whisper's per-clip max.
        floor = (self.log_mel_max if self.log_mel_max is not None else mel.max()) - 8.0
        return ((np.maximum(mel, floor) + 4.0) / 4.0).astype(np.float32)

    def __call__(self, audio: np.ndarray) -> np.ndarray:
        """Offline: len(audio)//hop frames (the centred STFT's last frame dropped).

        Zero edge padding; equal to reflect padding for Voxtral, whose padded
        audio always starts and ends with silence.
        """
        half = self.n_fft // 2
        x = np.concatenate([np.zeros(half), np.asarray(audio, np.float64), np.zeros(half)])
        return self.frames(x, len(audio) // self.hop)


class StreamingLogMel:
    """Emits exactly the frames `LogMel` computes offline, for any chunking."""

    def __init__(self, mel: LogMel):
        self.mel = mel
        self.buf = np.zeros(mel.n_fft // 2, np.float64)  # frame 0 starts half a window early
        self.emitted = 0

    def feed(self, x: np.ndarray, final_frames: int | None = None) -> np.ndarray:
        """Append samples; return every newly complete frame.

        With `final_frames`, the stream has ended: zeros stand in for the
        missing right context and frames stop at that total.
        """
        m = self.mel
        buf = np.concatenate([self.buf, np.asarray(x, np.float64)])
        if final_frames is not None:
            buf = np.concatenate([buf, np.zeros(m.n_fft)])
            n = max(0, final_frames - self.emitted)
        else:
            n = max(0, (len(buf) - m.n_fft) // m.hop + 1)
        out = m.frames(buf, n)
        self.buf = buf[n * m.hop :]
        self.emitted += n
        return out
