"""Sliding-window KV cache: a ring buffer that also supports RoPE re-anchoring."""

from __future__ import annotations

import mlx.core as mx


def window_mask(q_pos: mx.array, k_pos: mx.array, window: int) -> mx.array:
    """Boolean (Lq, Lk) mask: query at q sees key at k iff q - window < k <= q."""
    d = q_pos[:, None] - k_pos[None, :]
    return (d >= 0) & (d < window)


class SlidingKVCache:
    """Keys/values of the last `window` positions, stored in a ring of fixed size.

    The ring holds `window + max_chunk - 1` slots so a chunk of up to `max_chunk`
    new positions never overwrites a key that one of its own queries still needs.
    Slot order is irrelevant to attention (keys carry their RoPE rotation), so
    writes go to `position % capacity` and the mask is built from slot positions.
    `offset` counts every position ever written; RoPE uses `offset - shift`, and
    `reanchor` lowers that clock by rotating the cached keys back.
    """

    def __init__(self, window: int, max_chunk: int = 1, step: int = 256):
        self.window = window
        self.max_chunk = max_chunk
        self.capacity = window + max_chunk - 1
        self.step = step
        self.keys: mx.array | None = None
        self.values: mx.array | None = None
        self.offset = 0
        self.shift = 0

    @property
    def rope_offset(self) -> int:
        return self.offset - self.shift

    def _slot_positions(self, end: int) -> mx.array:
        if end <= self.capacity:
            return mx.arange(end)
        s = mx.arange(self.capacity)
        return (end - 1) - ((end - 1 - s) % self.capacity)

    def make_mask(self, length: int) -> mx.array:
        """Mask for `length` new queries against the slots after they are written."""
        q = mx.arange(self.offset, self.offset + length)
        return window_mask(q, self._slot_positions(self.offset + length), self.window)

    def _grow(self, k: mx.array, v: mx.array, end: int) -> None:
        B, H, _, D = k.shape
        n = min(self.capacity, -(-end // self.step) * self.step)
        if self.keys is not None and self.keys.shape[2] >= n:
            return
        new_k = mx.zeros((B, H, n, D), k.dtype)
        new_v = mx.zeros((B, H, n, v.shape[-1]), v.dtype)
        if self.keys is not None:
            m = self.keys.shape[2]
            new_k[:, :, :m] = self.keys
            new_v[:, :, :m] = self.values
        self.keys, self.values = new_k, new_v

    def update_and_fetch(self, k: mx.array, v: mx.array) -> tuple[mx.array, mx.array]:
        """Write (B, H, L, D) keys/values; return every slot in use."""
        L = k.shape[2]
        if L > self.max_chunk:
            raise ValueError(f"chunk of {L} positions exceeds max_chunk={self.max_chunk}")
        end = self.offset + L
        self._grow(k, v, end)
        start = self.offset % self.capacity
        first = min(L, self.capacity - start)
        self.keys[:, :, start : start + first] = k[:, :, :first]
        self.values[:, :, start : start + first] = v[:, :, :first]
        if first < L:
            self.keys[:, :, : L - first] = k[:, :, first:]
            self.values[:, :, : L - first] = v[:, :, first:]
        self.offset = end
        used = min(end, self.capacity)
        return self.keys[:, :, :used], self.values[:, :, :used]

    def reanchor(self, delta: int, head_dim: int, *, traditional: bool, base: float):
        """Lower the RoPE clock by `delta`: rotate every cached key by -delta.

        Attention scores depend only on position differences, so every score
        inside the window is unchanged (seed 002's unbounded-session idea).
        """
        if self.keys is not None:
            k = self.keys
            flat = k.reshape(-1, 1, k.shape[-1])
            flat = mx.fast.rope(
                flat, head_dim, traditional=traditional, base=base, scale=1.0,
                offset=-delta,
            )
            self.keys = flat.reshape(k.shape)
        self.shift += delta

    @property
    def state(self) -> list[mx.array]:
        return [a for a in (self.keys, self.values) if a is not None]
