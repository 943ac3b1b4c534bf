"""Sliding-window KV cache: a ring buffer that also supports RoPE re-anchoring."""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx
import numpy as np


def rotate_back(x: mx.array, delta: int | Sequence[int], dims: int, *, traditional: bool,
                base: float) -> mx.array:
    """Rotate (..., 1, D) keys by -delta RoPE positions (an int, or one per row of axis 0,
    each >= 0): RoPE's rotation of every pair by -delta * base^(-2i / dims).

    Elementwise in float32 (as the rope kernels compute; half-precision keys are rounded
    once), with the angles' cos and sin made on the host in float64, not through
    `mx.fast.rope`: its CUDA kernel (MLX 0.32) launches one position over many rows with a
    thread block deeper than CUDA's 64 in z when head_dim <= 16 (`invalid argument`), and
    a negative offset wraps there to ~4.3e9 (the kernels take an unsigned position).
    """
    half = dims // 2
    freqs = float(base) ** (-np.arange(0, dims, 2, dtype=np.float64) / dims)
    theta = np.multiply.outer(np.asarray(delta, dtype=np.float64), freqs)
    if theta.ndim == 2:  # one angle set per row: (B, 1, ..., 1, half)
        theta = theta.reshape(theta.shape[:1] + (1,) * (x.ndim - 2) + theta.shape[1:])
    cos = mx.array(np.cos(theta).astype(np.float32))
    sin = mx.array(np.sin(theta).astype(np.float32))
    rot = (x if dims == x.shape[-1] else x[..., :dims]).astype(mx.float32)
    if traditional:
        pairs = rot.reshape(*rot.shape[:-1], half, 2)
        a, b = pairs[..., 0], pairs[..., 1]
    else:
        a, b = rot[..., :half], rot[..., half:]
    a, b = a * cos + b * sin, b * cos - a * sin
    if traditional:
        rot = mx.stack([a, b], axis=-1).reshape(rot.shape)
    else:
        rot = mx.concatenate([a, b], axis=-1)
    rot = rot.astype(x.dtype)
    return rot if dims == x.shape[-1] else mx.concatenate([rot, x[..., dims:]], axis=-1)


# Attention over a fixed set of shapes (every allocated ring slot, masked, instead of the slots
# in use; callers also bucket batch sizes and chunk lengths): GPU backends build kernels and
# graphs per shape, so a stream then reuses a few from its first second on. On the CPU the
# extra mask costs more than a new shape does: None = GPU backends only.
FIXED_SHAPES: bool | None = None


def fixed_shapes() -> bool:
    """Whether streaming steps use a fixed set of shapes (see FIXED_SHAPES)."""
    if FIXED_SHAPES is not None:
        return FIXED_SHAPES
    return mx.default_device().type == mx.DeviceType.gpu


def ring_slots(end: int, capacity: int, step: int) -> int:
    """Slots a ring holds once `end` positions were written: a power of two from `step` up,
    then `capacity`; a stream's attention shapes come from this small fixed set."""
    return min(capacity, max(step, 1 << (end - 1).bit_length()))


def pack8(x: mx.array) -> mx.array:
    """(..., D) floats -> (..., D + 4) uint8: int8 values scaled per vector (max |x| -> 127)
    and the float32 scale's bytes, one array, so ring writes, gathers and pads need nothing
    new. About 8.25 (D = 128) or 8.5 (D = 64) bits per element."""
    s = mx.maximum(mx.abs(x).max(-1, keepdims=True).astype(mx.float32), 1e-30) / 127
    q = mx.round(x.astype(mx.float32) / s).astype(mx.int8)
    return mx.concatenate([q.view(mx.uint8), s.view(mx.uint8)], axis=-1)


def unpack8(p: mx.array, dtype: mx.Dtype) -> mx.array:
    """`pack8`'s inverse (zeros unpack to zeros)."""
    D = p.shape[-1] - 4
    return (p[..., :D].view(mx.int8).astype(mx.float32) * p[..., D:].view(mx.float32)
            ).astype(dtype)


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

    def attended(self, end: int) -> int:
        """Slots attention sees once `end` positions were written: every allocated one
        with `fixed_shapes()` (a power of two from `step`, then the capacity), else those
        in use."""
        if not fixed_shapes():
            return min(end, self.capacity)
        n = ring_slots(end, self.capacity, self.step)
        return n if self.keys is None else max(n, self.keys.shape[2])

    def slot_positions(self, end: int) -> mx.array:
        """The position each attended slot holds once `end` positions were written (a slot
        not written yet gets a position past the newest, so masks hide it)."""
        n = self.attended(end)
        s = mx.arange(n)
        if end <= self.capacity:
            return s
        return (end - 1) - ((end - 1 - s) % self.capacity)

    def make_mask(self, length: int) -> mx.array:
        """Mask for `length` new queries against the slots after they are written."""
        q = mx.arange(self.offset, self.offset + length)
        return window_mask(q, self.slot_positions(self.offset + length), self.window)

    def _grow(self, k: mx.array, v: mx.array, end: int) -> None:
        B, H, _, D = k.shape
        n = ring_slots(end, self.capacity, self.step)
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
        """Write (B, H, L, D) keys/values; return the slots attention sees (`attended`)."""
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
        n = self.attended(end)
        if n == self.keys.shape[2]:
            return self.keys, self.values
        return self.keys[:, :, :n], self.values[:, :, :n]

    def reanchor(self, delta: int, head_dim: int, *, traditional: bool, base: float):
        """Lower the RoPE clock by `delta`: rotate every cached key by -delta.

        Attention scores depend only on position differences, so every score
        inside the window is unchanged (seed 002's unbounded-session idea).
        """
        if delta < 0:
            raise ValueError(f"re-anchoring only lowers the RoPE clock, got delta {delta}")
        if self.keys is not None:
            k = self.keys
            flat = rotate_back(k.reshape(-1, 1, k.shape[-1]), delta, head_dim,
                               traditional=traditional, base=base)
            self.keys = flat.reshape(k.shape)
        self.shift += delta

    def prepare(self, length: int) -> int | None:
        """Before a compiled step (RingStep) writing `length` positions: the slots it sees
        (every allocated one), grown to the next size when needed; None before the first
        write (a plain step allocates)."""
        if self.keys is None:
            return None
        n = max(ring_slots(self.offset + length, self.capacity, self.step), self.keys.shape[2])
        self.keys, self.values = grown(self.keys, self.values, n)
        return n

    def advance(self, keys: mx.array, values: mx.array, length: int) -> None:
        """After a compiled step: its new slots, `length` positions further."""
        self.keys, self.values = keys, values
        self.offset += length

    @property
    def state(self) -> list[mx.array]:
        return [a for a in (self.keys, self.values) if a is not None]


def stack_rows(refs: list[tuple[mx.array, int]]) -> mx.array:
    """Rows `(array, i)` of batched arrays -> one array stacked on axis 0.

    When the refs are exactly the rows of one array in order (a batch that steps
    together again) that array is returned as is: no copy.
    """
    a0 = refs[0][0]
    if len(refs) == a0.shape[0] and all(a is a0 and i == j for j, (a, i) in enumerate(refs)):
        return a0
    parts, k = [], 0
    while k < len(refs):  # one take per run of rows from the same array
        a, j = refs[k][0], k
        while j < len(refs) and refs[j][0] is a:
            j += 1
        idx = [i for _, i in refs[k:j]]
        parts.append(a if idx == list(range(a.shape[0])) else a[mx.array(idx)])
        k = j
    return parts[0] if len(parts) == 1 else mx.concatenate(parts, axis=0)


def ring_mask(offsets: mx.array, length: int, n: int, capacity: int,
              window: int) -> mx.array:
    """Bool mask of `length` new queries from each row's position (offsets (B,): (B, 1, L, n);
    one position for every row, a scalar: (L, n)) against the first `n` slots of a ring of
    `capacity` after they were written (a slot not written yet holds a position past the
    newest: hidden)."""
    offs = offsets[..., None]
    s = mx.arange(n)
    last = offs + length - 1
    slot_pos = mx.where(last >= capacity, last - ((last - s) % capacity), s)
    q = offs + mx.arange(length)
    d = q[..., :, None] - slot_pos[..., None, :]  # < 0 for a slot not written yet
    m = (d >= 0) & (d < window)
    return m[:, None] if offsets.ndim else m


def ring_mask_kind(offsets: list[int], length: int, n: int, capacity: int,
                   window: int) -> str | None:
    """How `length` new queries per row (rows at `offsets`) see the first `n` slots of a ring
    after the write: None when every query sees every slot, "causal" when rows in step see
    exactly their earlier positions (the forms the fused GPU kernels take; CUDA runs no fused
    decode step with a mask), else "rows" (a mask per row, `ring_mask`)."""
    if length == 1 and n <= window and all(min(x + 1, capacity) >= n for x in offsets):
        return None  # every row wrote every slot, all within its window
    if min(offsets) == max(offsets) and offsets[0] + length == n <= window:
        return "causal"  # slot s holds position s (no wrap); window never binds
    return "rows"


def write_start(offsets: list[int], length: int, capacity: int) -> int | None:
    """The first slot rows at `offsets` write `length` positions to when they all write the
    same slots without wrapping (one slice write), else None (an index write per row)."""
    start = offsets[0] % capacity
    if min(offsets) != max(offsets) or start + length > capacity:
        return None
    return start


def grown(keys: mx.array, values: mx.array, n: int) -> tuple[mx.array, mx.array]:
    """(B, H, S, D) keys/values padded with zero slots to `n` (as they are when S >= n)."""
    if keys.shape[2] >= n:
        return keys, values
    pad = [(0, 0), (0, 0), (0, n - keys.shape[2]), (0, 0)]
    return mx.pad(keys, pad), mx.pad(values, pad)


def ring_write(keys: mx.array, values: mx.array, slots: mx.array, k: mx.array,
               v: mx.array) -> tuple[mx.array, mx.array]:
    """Write (B, H, L, D) keys/values at each row's slots (B, L), or every row's (L,)."""
    idx = slots[:, None, :, None] if slots.ndim == 2 else slots[None, None, :, None]
    return mx.put_along_axis(keys, idx, k, axis=2), mx.put_along_axis(values, idx, v, axis=2)


_ROPE_OFFSETS: list = [None, None]  # the last (clocks, array) RingBatch.rope_offset made


class RingRow:
    """One stream's sliding-window ring cache (see SlidingKVCache), stored as a row
    of a RingBatch: streams that step together share one batched array, each row
    with its own clock (`offset`, `shift`), so streams at different positions and
    fill levels run in one step. `keys` / `values` are that row, (1, H, n, D).
    A `pad` row only fills a batch up to a bucketed size (its results are dropped)."""

    def __init__(self, window: int, max_chunk: int = 1, pad: bool = False,
                 kv_bits: int | None = None):
        if kv_bits not in (None, 8):
            raise ValueError(f"kv_bits must be None or 8, got {kv_bits!r}")
        self.window, self.max_chunk = window, max_chunk
        self.capacity = window + max_chunk - 1
        self.offset = self.shift = 0
        self.pad = pad
        self.kv_bits = kv_bits  # 8: keys and values stored 8-bit (`pack8`)
        self.home: RingBatch | None = None
        self.index = 0

    @property
    def rope_offset(self) -> int:
        return self.offset - self.shift

    def _row(self, name: str) -> mx.array | None:
        a = None if self.home is None else getattr(self.home, name)
        return None if a is None else a[self.index: self.index + 1]

    @property
    def keys(self) -> mx.array | None:
        return self._row("keys")

    @property
    def values(self) -> mx.array | None:
        return self._row("values")

    @property
    def state(self) -> list[mx.array]:
        return [a for a in (self.keys, self.values) if a is not None]


class RingBatch:
    """The ring caches of one layer for several streams, stacked on the batch axis.

    Same interface as SlidingKVCache for the attention (`rope_offset` is a (B,)
    array: mx.fast.rope takes one offset per row), with per-row slot writes, masks
    and re-anchoring. Work per step is bounded by the ring capacity whatever the
    streams' lengths. Rings grow in a few power-of-two sizes, then the capacity
    (`ring_slots`). With `fixed_shapes()` attention sees every allocated slot, unwritten
    ones masked, so a stream calls attention with a small fixed set of shapes however long
    it runs; else only the slots in use.
    """

    def __init__(self, rows: list[RingRow], keys: mx.array | None = None,
                 values: mx.array | None = None, step: int = 256):
        self.rows, self.keys, self.values, self.step = rows, keys, values, step
        r = rows[0]
        self.window, self.max_chunk, self.capacity = r.window, r.max_chunk, r.capacity
        self.kv_bits = r.kv_bits
        self.dtype: mx.Dtype | None = None  # the attention's (kv_bits 8 stores `pack8`)
        for i, row in enumerate(rows):
            row.home, row.index = self, i

    @classmethod
    def gather(cls, rows: list[RingRow], step: int = 256, size: int | None = None) -> RingBatch:
        """The batch holding exactly `rows` (in order), padded to `size` rows with pad rows
        (clones of the first row's clock and slots): reused when it exists, else built from
        the rows' current homes (one copy, only when the set changes)."""
        r0, size = rows[0], size or len(rows)
        if any((r.window, r.max_chunk, r.kv_bits) != (r0.window, r0.max_chunk, r0.kv_bits)
               for r in rows):
            raise ValueError("rows of one RingBatch need the same window, max_chunk, kv_bits")
        h = r0.home
        if (h is not None and len(h.rows) == size
                and all(r.home is h and r.index == i for i, r in enumerate(rows))
                and all(r.pad for r in h.rows[len(rows):])):
            return h
        pads = []
        for _ in range(size - len(rows)):
            p = RingRow(r0.window, r0.max_chunk, pad=True, kv_bits=r0.kv_bits)
            p.offset, p.shift, p.home, p.index = r0.offset, r0.shift, r0.home, r0.index
            pads.append(p)
        rows = rows + pads
        homed = [r for r in rows if r.home is not None and r.home.keys is not None]
        if not homed:
            return cls(rows, step=step)
        n = max(r.home.keys.shape[2] for r in homed)
        like = homed[0].home

        def part(r: RingRow, name: str) -> tuple[mx.array, int]:
            a = getattr(r.home, name) if r.home is not None else None
            if a is None:
                shape = getattr(like, name).shape
                return mx.zeros((1, shape[1], n, shape[3]), like.keys.dtype), 0
            if a.shape[2] < n:
                a = mx.pad(a, [(0, 0), (0, 0), (0, n - a.shape[2]), (0, 0)])
            return a, r.index

        keys = stack_rows([part(r, "keys") for r in rows])
        values = stack_rows([part(r, "values") for r in rows])
        out = cls(rows, keys, values, step)
        out.dtype = like.dtype
        return out

    @property
    def rope_offset(self) -> mx.array:
        """(B,) int32 RoPE clocks; every layer of a step shares one array (one host copy per
        step, not one per layer)."""
        key = tuple(r.offset - r.shift for r in self.rows)
        if _ROPE_OFFSETS[0] != key:
            _ROPE_OFFSETS[:] = [key, mx.array(key, mx.int32)]
        return _ROPE_OFFSETS[1]

    def _slots(self, end: int) -> int:
        """Slots held once the rows' positions reach `end` (never fewer than now)."""
        n = ring_slots(end, self.capacity, self.step)
        return n if self.keys is None else max(n, self.keys.shape[2])

    def attended(self, end: int) -> int:
        """Slots attention sees once the rows' positions reach `end`."""
        return self._slots(end) if fixed_shapes() else min(end, self.capacity)

    def mask_kind(self, length: int, n: int) -> str | None:
        """`ring_mask_kind` of the rows."""
        return ring_mask_kind([r.offset for r in self.rows], length, n, self.capacity,
                              self.window)

    def make_mask(self, length: int) -> mx.array | str | None:
        """(B, 1, L, S) mask for `length` new queries per row, against the slots attention
        sees after the write (S = `attended`, unwritten slots hidden), or None / "causal"
        (`mask_kind`)."""
        o = [r.offset for r in self.rows]
        n = self.attended(max(o) + length)
        kind = self.mask_kind(length, n)
        if kind != "rows":
            return kind
        return ring_mask(mx.array(o, mx.int32), length, n, self.capacity, self.window)

    def _grow(self, k: mx.array, v: mx.array, end: int) -> None:
        B, H, _, D = k.shape
        n = self._slots(end)
        if self.keys is None:
            self.keys = mx.zeros((B, H, n, D), k.dtype)
            self.values = mx.zeros((B, H, n, v.shape[-1]), v.dtype)
        elif self.keys.shape[2] < n:
            pad = [(0, 0), (0, 0), (0, n - self.keys.shape[2]), (0, 0)]
            self.keys, self.values = mx.pad(self.keys, pad), mx.pad(self.values, pad)

    def update_and_fetch(self, k: mx.array, v: mx.array) -> tuple[mx.array, mx.array]:
        """Write (B, H, L, D) keys/values, row b at its own positions; return the slots
        attention sees (`attended`). A chunk longer than `max_chunk` is fine while no row
        wraps (e.g. a prompt at position 0)."""
        L, cap = k.shape[2], self.capacity
        offs = [r.offset for r in self.rows]
        end = max(offs) + L
        if L > self.max_chunk and end > cap:
            raise ValueError(f"chunk of {L} positions exceeds max_chunk={self.max_chunk}")
        self.dtype = k.dtype
        if self.kv_bits:  # stored 8-bit, a scale per vector (`pack8`)
            k, v = pack8(k), pack8(v)
        self._grow(k, v, end)
        if all(o == offs[0] for o in offs):  # rows in step: contiguous slot writes
            start = offs[0] % cap
            first = min(L, cap - start)
            self.keys[:, :, start: start + first] = k[:, :, :first]
            self.values[:, :, start: start + first] = v[:, :, :first]
            if first < L:
                self.keys[:, :, : L - first] = k[:, :, first:]
                self.values[:, :, : L - first] = v[:, :, first:]
        else:
            slots = mx.array([[(o + t) % cap for t in range(L)] for o in offs])
            self.keys, self.values = ring_write(self.keys, self.values, slots, k, v)
        for r in self.rows:
            r.offset += L
        n = self.attended(end)
        keys, values = self.keys, self.values
        if n != keys.shape[2]:
            keys, values = keys[:, :, :n], values[:, :, :n]
        if self.kv_bits:
            keys, values = unpack8(keys, self.dtype), unpack8(values, self.dtype)
        return keys, values

    def deltas(self, length: int, limit: int) -> list[int]:
        """Per row, how far to lower the RoPE clock so `length` more positions stay
        below `limit` (0: no need)."""
        out = []
        for r in self.rows:
            if r.rope_offset + length <= limit:
                out.append(0)
                continue
            d = r.rope_offset - r.window
            if d <= 0:
                raise ValueError(f"RoPE limit {limit} too small for window {r.window} + {length}")
            out.append(d)
        return out

    def reanchor(self, deltas: list[int], head_dim: int, *, traditional: bool,
                 base: float) -> None:
        """Lower row b's RoPE clock by deltas[b]: rotate its cached keys by -deltas[b]
        (scores inside the window are unchanged; see SlidingKVCache.reanchor)."""
        if min(deltas) < 0:
            raise ValueError(f"re-anchoring only lowers the RoPE clock, got deltas {deltas}")
        if self.keys is not None:
            k = self.keys if not self.kv_bits else unpack8(self.keys, self.dtype)
            flat = rotate_back(k.reshape(k.shape[0], -1, 1, k.shape[-1]), deltas, head_dim,
                               traditional=traditional, base=base)
            self.keys = flat.reshape(k.shape)
            if self.kv_bits:
                self.keys = pack8(self.keys)
        for r, d in zip(self.rows, deltas, strict=True):
            r.shift += d

    # -- compiled steps (nn.compiled): the host's side of a RingStep ------------------------
    def prepare(self, length: int) -> int | None:
        """Before a compiled step writing `length` positions per row: the slots that step
        sees (every allocated one, the fixed shapes), grown to the next size when the rows'
        positions need it. None when the rows hold no slots yet (a plain step allocates)."""
        if self.keys is None:
            return None
        n = self._slots(max(r.offset for r in self.rows) + length)
        self.keys, self.values = grown(self.keys, self.values, n)
        return n

    def clocks(self) -> tuple[mx.array, mx.array]:
        """(B,) int32 positions written so far and RoPE clocks of the rows."""
        return (mx.array([r.offset for r in self.rows], mx.int32),
                mx.array([r.offset - r.shift for r in self.rows], mx.int32))

    def advance(self, keys: mx.array, values: mx.array, length: int) -> None:
        """After a compiled step: its new slots, every row `length` positions further."""
        self.keys, self.values = keys, values
        for r in self.rows:
            r.offset += length

    @property
    def state(self) -> list[mx.array]:
        return [a for a in (self.keys, self.values) if a is not None]


class RingStep:
    """A RingBatch inside a compiled step (`nn.compiled`): the attention's interface with the
    rows' clocks as arrays (`offsets` (B,), or a scalar when every row is at one position),
    so the step's trace never changes with their positions. Rows write
    at their own slots by index; attention sees every slot given (the fixed shapes), the ones
    not written yet masked (`mask`: RingBatch.mask_kind, decided on the host). `start`: when
    every row writes the same slots without wrapping (`write_start`), the first of them (a
    (1,) int32 array), one slice write instead of an index write. The host re-anchors before
    the step (`deltas`: none here) and advances the rows after it (RingBatch.advance with this
    view's `keys` / `values`)."""

    def __init__(self, keys: mx.array, values: mx.array, offsets: mx.array, rope: mx.array,
                 capacity: int, window: int, kv_bits: int | None, mask: str | None,
                 start: mx.array | None = None):
        self.keys, self.values, self.offsets, self.rope_offset = keys, values, offsets, rope
        self.capacity, self.window, self.kv_bits, self.mask = capacity, window, kv_bits, mask
        self.start = start

    def deltas(self, length: int, limit: int) -> list[int]:
        return [0]

    def make_mask(self, length: int) -> mx.array | str | None:
        if self.mask != "rows":
            return self.mask
        return ring_mask(self.offsets, length, self.keys.shape[2], self.capacity, self.window)

    def update_and_fetch(self, k: mx.array, v: mx.array) -> tuple[mx.array, mx.array]:
        dtype, L = k.dtype, k.shape[2]
        if self.kv_bits:
            k, v = pack8(k), pack8(v)
        if self.start is not None:
            self.keys = mx.slice_update(self.keys, k, self.start, axes=(2,))
            self.values = mx.slice_update(self.values, v, self.start, axes=(2,))
        else:
            slots = (self.offsets[..., None] + mx.arange(L)) % self.capacity
            self.keys, self.values = ring_write(self.keys, self.values, slots, k, v)
        if self.kv_bits:
            return unpack8(self.keys, dtype), unpack8(self.values, dtype)
        return self.keys, self.values
