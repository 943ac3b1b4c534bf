"""NeMo's FilterbankFeatures (inference settings) with an exact streaming form: the mel front end
of every NeMo family here (Nemotron ASR, Sortformer diarization).

Pre-emphasis 0.97, centred STFT (n_fft 512, constant zero padding), symmetric
400-sample Hann, power spectrum, Slaney mel, log(mel + 2^-24), no normalisation.
`len(audio) // hop` frames (NeMo zeroes the centred STFT's last frame and its
length excludes it). Float64 numpy, cast to float32: a frame computed in any
streaming chunk equals the same frame computed offline, bit for bit.
"""

from __future__ import annotations

import numpy as np

from ...audio.mel import SparseFilterbank, mel_filters

SAMPLE_RATE = 16_000
HOP = 160
N_FFT = 512
WIN = 400
PREEMPHASIS = 0.97
LOG_GUARD = 2.0**-24


class NemoLogMel:
    """Frame t covers pre-emphasised samples [hop*t - win/2, hop*t + win/2)."""

    def __init__(self, n_mels: int = 128, sample_rate: int = SAMPLE_RATE, n_fft: int = N_FFT,
                 win: int = WIN, hop: int = HOP, preemphasis: float = PREEMPHASIS):
        self.n_mels, self.n_fft, self.win, self.hop = n_mels, n_fft, win, hop
        self.preemphasis = preemphasis
        n = np.arange(win)
        self.window = 0.5 - 0.5 * np.cos(2 * np.pi * n / (win - 1))  # symmetric Hann
        self.filters = mel_filters(sample_rate, n_fft, n_mels)  # (n_fft//2 + 1, n_mels)
        self.filterbank = SparseFilterbank(self.filters)

    def frames(self, y: np.ndarray, n_frames: int) -> np.ndarray:
        """(n_frames, n_mels) float32 from pre-emphasised `y` whose sample 0 starts frame 0."""
        if n_frames <= 0:
            return np.zeros((0, self.n_mels), np.float32)
        seg = np.lib.stride_tricks.sliding_window_view(y, self.win)[:: self.hop][:n_frames]
        # a 400-sample window centred in 512 only shifts the phase: |X|^2 is unchanged
        spec = np.fft.rfft(seg * self.window, n=self.n_fft, axis=-1)
        power = spec.real**2 + spec.imag**2
        return np.log(self.filterbank(power) + LOG_GUARD).astype(np.float32)

    def __call__(self, audio: np.ndarray) -> np.ndarray:
        """Offline: (len(audio) // hop, n_mels) float32."""
        x = np.asarray(audio, np.float64)
        y = np.concatenate([x[:1], x[1:] - self.preemphasis * x[:-1]])
        half = self.win // 2
        y = np.concatenate([np.zeros(half), y, np.zeros(half)])
        return self.frames(y, len(x) // self.hop)


class StreamingNemoLogMel:
    """Emits exactly `NemoLogMel`'s frames for any chunking; keeps < win + hop samples."""

    def __init__(self, mel: NemoLogMel):
        self.mel = mel
        self.buf = np.zeros(mel.win // 2, np.float64)  # frame 0 starts half a window early
        self.prev = 0.0  # last raw sample, for the pre-emphasis across chunks
        self.n_samples = 0
        self.emitted = 0

    def feed(self, x: np.ndarray) -> np.ndarray:
        """Append samples; return every newly complete frame."""
        m = self.mel
        x = np.asarray(x, np.float64)
        if len(x):
            y = x.copy()
            y[0] -= m.preemphasis * self.prev if self.n_samples else 0.0
            y[1:] -= m.preemphasis * x[:-1]
            self.prev = float(x[-1])
            self.n_samples += len(x)
            self.buf = np.concatenate([self.buf, y])
        n = max(0, (len(self.buf) - m.win) // m.hop + 1)
        n = min(n, self.n_samples // m.hop - self.emitted)  # never past the offline count
        return self._take(n)

    def finish(self) -> np.ndarray:
        """End of audio: the remaining frames, zeros standing in for the future."""
        n = self.n_samples // self.mel.hop - self.emitted
        self.buf = np.concatenate([self.buf, np.zeros(self.mel.win)])
        return self._take(n)

    def _take(self, n: int) -> np.ndarray:
        out = self.mel.frames(self.buf, n)
        self.buf = self.buf[n * self.mel.hop:]
        self.emitted += n
        return out
