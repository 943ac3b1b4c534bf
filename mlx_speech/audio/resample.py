"""Band-limited polyphase resampling (Kaiser-windowed sinc FIR) in numpy."""

from __future__ import annotations

from functools import lru_cache
from math import gcd

import numpy as np

# 32 zero crossings a side and beta 8.6 give ~-85 dB stopband with a transition
# ~0.075 * min rate wide; rolloff 0.9 puts the stopband edge just below the new
# Nyquist, so nothing above it aliases back (pass band is flat to ~0.41 * rate).
_ZEROS = 32
_BETA = 8.6
_ROLLOFF = 0.9
_CHUNK = 1 << 22  # elements of one gathered window block (16 MiB float32)


@lru_cache(maxsize=16)
def _phases(up: int, down: int) -> tuple[np.ndarray, int]:
    """Filter taps split into `up` phases: (up, taps) reversed per phase, and half."""
    m = max(up, down)
    half = int(np.ceil(_ZEROS * m / _ROLLOFF))
    t = np.arange(-half, half + 1, dtype=np.float64)
    fc = _ROLLOFF / (2 * m)  # cutoff in cycles per upsampled sample
    h = 2 * fc * np.sinc(2 * fc * t) * np.kaiser(2 * half + 1, _BETA)
    h *= up / h.sum()  # unit DC gain after zero-stuffing by `up`
    taps = -(-len(h) // up)
    h = np.pad(h, (0, taps * up - len(h)))
    # phase p uses h[p], h[p + up], ...; reversed so it dots a forward window
    return np.ascontiguousarray(h.reshape(taps, up).T[:, ::-1], np.float32), half


def _dot_rows(w: np.ndarray, h: np.ndarray) -> np.ndarray:
    """Each row of `w` dotted with `h`, rounded the same whatever the number of rows
    (BLAS gemv is not: one row takes another kernel), so streaming equals offline."""
    return (w * h).sum(axis=1, dtype=np.float32)


def resample(x: np.ndarray, sr_in: int, sr_out: int) -> np.ndarray:
    """Resample 1-D `x` from sr_in to sr_out Hz into ceil(n * out / in) samples."""
    x = np.asarray(x, dtype=np.float32)
    if x.ndim != 1:
        raise ValueError(f"resample expects a 1-D array, got shape {x.shape}")
    if sr_in <= 0 or sr_out <= 0:
        raise ValueError(f"sample rates must be positive, got {sr_in} and {sr_out}")
    if sr_in == sr_out:
        return x.copy()
    g = gcd(sr_in, sr_out)
    up, down = sr_out // g, sr_in // g
    n_out = -(-len(x) * up // down)
    if n_out == 0:
        return np.zeros(0, np.float32)
    h, half = _phases(up, down)
    taps = h.shape[1]
    # Output m sits at upsampled time m * down; with the filter centred (zero
    # phase) it needs x[j0 - taps + 1 .. j0], j0 = (m * down + half) // up,
    # through the taps of phase (m * down + half) % up.
    last = ((n_out - 1) * down + half) // up
    xp = np.concatenate(
        [
            np.zeros(taps - 1, np.float32),
            x,
            np.zeros(max(0, last + 1 - len(x)), np.float32),
        ]
    )
    windows = np.lib.stride_tricks.sliding_window_view(xp, taps)
    y = np.empty(n_out, np.float32)
    rows = max(1, _CHUNK // taps)
    # outputs m, m + up, m + 2 up, ... share a phase: one strided batch each
    for m0 in range(min(up, n_out)):
        p = (m0 * down + half) % up
        ms = np.arange(m0, n_out, up)
        j0 = (ms * down + half) // up
        for s in range(0, len(ms), rows):
            y[ms[s : s + rows]] = _dot_rows(windows[j0[s : s + rows]], h[p])
    return y


class StreamingResampler:
    """`resample` fed in pieces: the joined output of `feed` calls and `finish`
    equals `resample(whole, sr_in, sr_out)` (the same windows and taps)."""

    def __init__(self, sr_in: int, sr_out: int):
        if sr_in <= 0 or sr_out <= 0:
            raise ValueError(f"sample rates must be positive, got {sr_in} and {sr_out}")
        g = gcd(sr_in, sr_out)
        self.up, self.down = sr_out // g, sr_in // g
        self.same = sr_in == sr_out
        if not self.same:
            self.h, self.half = _phases(self.up, self.down)
        self.taps = 1 if self.same else self.h.shape[1]
        # xp as in `resample`: taps - 1 zeros, then the input; xp[base:] is kept
        self._xp = np.zeros(self.taps - 1, np.float32)
        self._base = 0
        self.n_in = 0
        self.n_out = 0  # outputs emitted so far

    def _emit(self, upto: int) -> np.ndarray:
        """Outputs [n_out, upto), all of whose windows are inside the kept xp."""
        if upto <= self.n_out:
            return np.zeros(0, np.float32)
        up, down, half, taps = self.up, self.down, self.half, self.taps
        ms = np.arange(self.n_out, upto)
        j0 = (ms * down + half) // up - self._base  # window end, relative to the kept xp
        windows = np.lib.stride_tricks.sliding_window_view(self._xp, taps)
        y = np.empty(len(ms), np.float32)
        phase = (ms * down + half) % up
        rows = max(1, _CHUNK // taps)  # gathered windows stay small whatever the feed's size
        for p in np.unique(phase):
            idx = np.flatnonzero(phase == p)
            for s in range(0, len(idx), rows):
                sel = idx[s: s + rows]
                y[sel] = _dot_rows(windows[j0[sel]], self.h[p])
        self.n_out = upto
        # drop what no later output needs (xp windows start at j0 = (m * down + half) // up)
        keep = (upto * down + half) // up - self._base
        if keep > 0:
            self._xp = self._xp[keep:]
            self._base += keep
        return y

    def feed(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=np.float32).reshape(-1)
        self.n_in += len(x)
        if self.same:
            return x.copy()
        self._xp = np.concatenate([self._xp, x])
        last = self._base + len(self._xp) - 1  # the last xp index held
        # output m reads xp[j0 : j0 + taps], j0 = (m * down + half) // up
        upto = max(0, ((last - self.taps + 2) * self.up - self.half - 1) // self.down + 1)
        total = -(-self.n_in * self.up // self.down)
        return self._emit(min(upto, total))

    def finish(self) -> np.ndarray:
        if self.same:
            return np.zeros(0, np.float32)
        total = -(-self.n_in * self.up // self.down)
        if total <= self.n_out:
            return np.zeros(0, np.float32)
        need = ((total - 1) * self.down + self.half) // self.up + self.taps - self._base
        if need > len(self._xp):
            self._xp = np.concatenate([self._xp, np.zeros(need - len(self._xp), np.float32)])
        return self._emit(total)
