"""Silero VAD (v5 / v6), the 16 kHz network, in MLX.

Quirks, as Silero's own code runs it:
- audio goes in 512-sample frames (32 ms); each frame is seen with the 64 samples before it
  (zeros before the first), 576 samples, padded on the right by reflection to 640;
- the "STFT" is a fixed conv, 256 taps, hop 128, whose 258 rows are a periodic Hann window
  times the DFT's 129 cosines and 129 negated sines -> 4 magnitude frames per 32 ms frame (run
  here as an rFFT; the loader checks the basis is exactly that);
- four convs (k 3, pad 1, strides 1 2 2 1, ReLU) take those 4 positions to 1 vector of 128;
- an LSTM cell (128) carries state across frames; ReLU, a 1x1 conv and a sigmoid give the
  frame's speech probability.
Frames depend on each other only through the LSTM and the 64-sample context, so every frame of
a call goes through the front end at once and only the LSTM steps frame by frame. A lone stream
is a batch of one; the state is a `VADState` passed in and returned, never kept on the module.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from ...errors import AudioError, MlxSpeechError

SAMPLE_RATE = 16_000
FRAME = 512  # samples per probability (32 ms)
CONTEXT = 64  # samples of the previous frame each frame sees
N_FFT, HOP = 256, 128  # the STFT conv (each frame is reflected 64 samples past its end)
BINS = N_FFT // 2 + 1
HIDDEN = 128


@dataclass(frozen=True)
class VADState:
    """Streaming state of a batch of streams: LSTM `h`, `c` (B, 128), the last 64 samples
    (B, 64). Immutable: a call returns a new one. `stack` / `rows` build a batch from
    per-stream states and split it back, so streams can join and leave a batched call."""

    h: mx.array
    c: mx.array
    context: mx.array

    @property
    def batch(self) -> int:
        return self.h.shape[0]

    def arrays(self) -> list[mx.array]:
        """For the caller's `mx.eval(probs, *state.arrays())`."""
        return [self.h, self.c, self.context]

    @staticmethod
    def stack(states: Sequence[VADState]) -> VADState:
        """One state whose rows are the given states' rows, in order."""
        if not states:
            raise MlxSpeechError("VADState.stack needs at least one state")
        if len(states) == 1:
            return states[0]
        return VADState(*(mx.concatenate(parts, axis=0) for parts in
                          zip(*(s.arrays() for s in states), strict=True)))

    def rows(self, indices: int | Sequence[int] | mx.array) -> VADState:
        """The state of the streams at `indices` (an int keeps a batch of one)."""
        idx = [indices] if isinstance(indices, int) else indices
        if not isinstance(idx, mx.array):
            idx = list(idx)
            bad = [i for i in idx if not -self.batch <= i < self.batch]
            if bad:
                raise MlxSpeechError(f"row {bad[0]} is out of range for a batch of {self.batch}")
            idx = mx.array([i % self.batch for i in idx], dtype=mx.int32)
        return VADState(*(a[idx] for a in self.arrays()))

    def split(self) -> list[VADState]:
        """One batch-of-one state per stream."""
        return [self.rows(i) for i in range(self.batch)]


@lru_cache(maxsize=8)
def _window_index(n: int) -> mx.array:
    """(n * 4 * 256,) positions in (context + n frames) read by the 4 STFT windows of each
    frame; positions past a frame's 576 samples are reflected (x[576 + j] -> x[574 - j])."""
    q = np.arange(4)[:, None] * HOP + np.arange(N_FFT)[None, :]
    last = FRAME + CONTEXT - 1
    q = np.where(q <= last, q, 2 * last - q)
    return mx.array((FRAME * np.arange(n)[:, None, None] + q).reshape(-1).astype(np.int32))


def _check_audio(audio, sample_rate: int) -> mx.array:
    if sample_rate != SAMPLE_RATE:
        raise AudioError(f"Silero VAD runs on {SAMPLE_RATE} Hz audio, got {sample_rate} Hz: "
                         "resample first (mlx_speech.audio.resample.resample)")
    if not isinstance(audio, mx.array):  # numpy: cast there (no float64 into MLX)
        a = np.asarray(audio)
        audio = mx.array(a.astype(np.float32) if np.issubdtype(a.dtype, np.floating) else a)
    if not mx.issubdtype(audio.dtype, mx.floating):
        raise AudioError(f"VAD audio must be float samples in [-1, 1], got {audio.dtype} "
                         "(divide integer PCM by 32768)")
    if audio.ndim not in (1, 2):
        raise AudioError(f"VAD audio must be (samples,) or (batch, samples), got {audio.shape}")
    n = audio.shape[-1]
    if n % FRAME:
        raise AudioError(f"VAD audio must be whole {FRAME}-sample frames (32 ms at 16 kHz), "
                         f"got {n} samples ({n % FRAME} too many or {FRAME - n % FRAME} "
                         "too few)")
    return audio.astype(mx.float32)


class _Conv(nn.Module):
    """A k-tap conv kept as one matrix for im2col: weight (k * in, out), rows tap-major."""

    def __init__(self, taps: int, cin: int, cout: int):
        super().__init__()
        self.weight = mx.zeros((taps * cin, cout))
        self.bias = mx.zeros((cout,))


class _LSTMCell(nn.Module):
    """PyTorch's LSTMCell (gates i, f, g, o), weights (in, 4 * hidden), biases summed."""

    def __init__(self, n: int):
        super().__init__()
        self.wx = mx.zeros((n, 4 * n))
        self.wh = mx.zeros((n, 4 * n))
        self.bias = mx.zeros((4 * n,))


# Weights are stored (in, out) and contiguous: MLX's CPU matmul runs 2-6x faster on them than on
# a transposed view. The convs run as im2col matmuls over their few positions.
def _encode(win, window, w1, b1, w2, b2, w3, b3, w4, b4, wx, bx):
    """(N, 4, 256) STFT windows of N frames -> (N, 512) LSTM input projections."""
    # |rFFT| == the conv with Silero's basis. The complex spectrum is read as (re, im) float
    # pairs (a view): CUDA's fused kernels cannot take a complex input.
    spec = mx.view(mx.fft.rfft(win * window, axis=-1), mx.float32)
    re, im = spec[..., 0::2], spec[..., 1::2]
    mag = mx.sqrt(re * re + im * im)
    xp = mx.pad(mag, [(0, 0), (1, 1), (0, 0)])
    x = nn.relu(mx.concatenate([xp[:, 0:4], xp[:, 1:5], xp[:, 2:6]], axis=-1) @ w1 + b1)
    xp = mx.pad(x, [(0, 0), (1, 1), (0, 0)])  # stride 2: outputs at 0 and 2
    x = nn.relu(mx.concatenate([xp[:, 0:4:2], xp[:, 1:5:2], xp[:, 2:6:2]], axis=-1) @ w2 + b2)
    c = x.shape[-1]
    x = nn.relu(x.reshape(-1, 2 * c) @ w3[c:] + b3)  # 2 -> 1: tap 0 sees only the zero pad
    c = x.shape[-1]
    x = nn.relu(x @ w4[c:2 * c] + b4)  # length 1: only the middle tap sees data
    return x @ wx + bx


def _cell(gx, h, c, wh):
    i, f, g, o = mx.split(gx + h @ wh, 4, axis=-1)
    c = mx.sigmoid(f) * c + mx.sigmoid(i) * mx.tanh(g)
    return mx.sigmoid(o) * mx.tanh(c), c


def _decode(hs, w, b):
    return mx.sigmoid(nn.relu(hs) @ w + b)[..., 0]


class SileroVAD(nn.Module):
    """`probs, state = vad(audio, state)`: one probability per 512-sample frame.

    `audio` (B, n * 512) float32 at 16 kHz in [-1, 1] (or (n * 512,) for one stream, giving
    (n,) probabilities); `state` from `make_state(B)` or a previous call, None for a clip
    on its own (offline). Streaming in any chunking equals one offline call. Builds the
    graph only: the caller evaluates (`mx.eval(probs, *state.arrays())`).
    """

    kind = "vad"  # the model contract (mlx_speech/models/base.py)
    family = "silero_vad"
    name = "Silero VAD"

    def __init__(self):
        super().__init__()
        self.stft_window = mx.zeros((N_FFT,))  # Silero's STFT basis is this window x the DFT
        self.conv1 = _Conv(3, BINS, 128)
        self.conv2 = _Conv(3, 128, 64)
        self.conv3 = _Conv(3, 64, 64)
        self.conv4 = _Conv(3, 64, HIDDEN)
        self.lstm = _LSTMCell(HIDDEN)
        self.final = _Conv(1, HIDDEN, 1)

    @property
    def sample_rate(self) -> int:
        return SAMPLE_RATE

    def weight_bytes(self) -> int:
        from ..base import parameter_bytes

        return parameter_bytes([self])

    def make_state(self, batch: int = 1) -> VADState:
        if batch < 1:
            raise MlxSpeechError(f"batch must be at least 1, got {batch}")
        z = mx.zeros((batch, HIDDEN), dtype=mx.float32)
        return VADState(z, z, mx.zeros((batch, CONTEXT), dtype=mx.float32))

    def __call__(self, audio: mx.array, state: VADState | None = None, *,
                 sample_rate: int = SAMPLE_RATE) -> tuple[mx.array, VADState]:
        audio = _check_audio(audio, sample_rate)
        single = audio.ndim == 1
        if single:
            audio = audio[None]
        B, n = audio.shape[0], audio.shape[1] // FRAME
        if state is None:
            state = self.make_state(B)
        elif state.batch != B:
            raise MlxSpeechError(f"state is for {state.batch} streams, audio has {B}")
        if n == 0:
            probs = mx.zeros((B, 0), dtype=mx.float32)
            return (probs[0] if single else probs), state
        padded = mx.concatenate([state.context, audio], axis=1)  # (B, 64 + n * 512)
        windows = mx.take(padded, _window_index(n), axis=1).reshape(B * n, 4, N_FFT)
        c1, c2, c3, c4, cell = self.conv1, self.conv2, self.conv3, self.conv4, self.lstm
        gx = _ENCODE(windows, self.stft_window, c1.weight, c1.bias, c2.weight, c2.bias,
                     c3.weight, c3.bias, c4.weight, c4.bias, cell.wx, cell.bias)
        gx = gx.reshape(B, n, -1)
        h, c, hs = state.h, state.c, []
        for t in range(n):  # the only sequential part
            h, c = _CELL(gx[:, t], h, c, cell.wh)
            hs.append(h)
        probs = _DECODE(mx.stack(hs, axis=1), self.final.weight, self.final.bias)  # (B, n)
        new = VADState(h, c, padded[:, -CONTEXT:])
        return (probs[0] if single else probs), new


_ENCODE, _CELL, _DECODE = mx.compile(_encode), mx.compile(_cell), mx.compile(_decode)
