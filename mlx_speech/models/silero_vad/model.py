"""Silero VAD (v5 / v6), the 16 kHz network, in MLX.

Quirks, as Silero's own code runs it:
- audio goes in 512-sample frames (32 ms); each frame is seen with the 64 samples before it
  (zeros before the first), 576 samples, padded on the right by reflection to 640;
- the "STFT" is a fixed conv, 256 taps, hop 128, 129 real + 129 imaginary rows (no window
  folded elsewhere, no bias) -> 4 magnitude frames per 32 ms frame;
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
N_FFT, HOP, PAD = 256, 128, 64  # the STFT conv; PAD: right reflection of each window
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


@lru_cache(maxsize=1)
def _window_index() -> np.ndarray:
    """(4, 256) positions in a frame's 576 samples read by each STFT window; positions past
    the end are reflected (padded[576 + j] = x[574 - j])."""
    q = np.arange(4)[:, None] * HOP + np.arange(N_FFT)[None, :]
    last = FRAME + CONTEXT - 1
    return np.where(q <= last, q, 2 * last - q).astype(np.int32)


def _check_audio(audio, sample_rate: int) -> mx.array:
    if sample_rate != SAMPLE_RATE:
        raise AudioError(f"Silero VAD runs on {SAMPLE_RATE} Hz audio, got {sample_rate} Hz: "
                         "resample first (mlx_speech.audio.resample.resample)")
    if not isinstance(audio, mx.array):
        audio = mx.array(np.asarray(audio))
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


class SileroVAD(nn.Module):
    """`probs, state = vad(audio, state)`: one probability per 512-sample frame.

    `audio` (B, n * 512) float32 at 16 kHz in [-1, 1] (or (n * 512,) for one stream, giving
    (n,) probabilities); `state` from `make_state(B)` or a previous call, None for a clip
    on its own (offline). Streaming in any chunking equals one offline call. Builds the
    graph only: the caller evaluates (`mx.eval(probs, *state.arrays())`).
    """

    def __init__(self):
        super().__init__()
        # attribute names are mlx-audio's (the mlx-community layout loads by name)
        self.stft_conv = nn.Conv1d(1, 2 * BINS, N_FFT, stride=HOP, bias=False)
        self.conv1 = nn.Conv1d(BINS, 128, 3, padding=1)
        self.conv2 = nn.Conv1d(128, 64, 3, stride=2, padding=1)
        self.conv3 = nn.Conv1d(64, 64, 3, stride=2, padding=1)
        self.conv4 = nn.Conv1d(64, HIDDEN, 3, padding=1)
        self.lstm = nn.LSTM(HIDDEN, HIDDEN)
        self.final_conv = nn.Conv1d(HIDDEN, 1, 1)

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
        idx = mx.array(_window_index())[None] + (FRAME * mx.arange(n, dtype=mx.int32))[
            :, None, None]
        windows = mx.take(padded, idx.reshape(-1), axis=1).reshape(B * n, 4, N_FFT)
        spec = windows @ self.stft_conv.weight.reshape(2 * BINS, N_FFT).T  # (B n, 4, 258)
        re, im = spec[..., :BINS], spec[..., BINS:]
        x = mx.sqrt(re * re + im * im)
        for conv in (self.conv1, self.conv2, self.conv3, self.conv4):
            x = nn.relu(conv(x))
        x = x.reshape(B, n, HIDDEN)
        hs, cs = self.lstm(x, hidden=state.h, cell=state.c)  # (B, n, 128) each
        probs = mx.sigmoid(self.final_conv(nn.relu(hs)))[..., 0]  # (B, n)
        new = VADState(hs[:, -1], cs[:, -1], padded[:, -CONTEXT:])
        return (probs[0] if single else probs), new
