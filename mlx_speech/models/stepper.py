"""The one batched stepper of the streaming families (Voxtral Realtime, Nemotron, Sortformer).

A tick advances many streams of one model together, in rounds. Each round takes every
stream's next piece of work (the family's `take`: a chunk of mel, a decoder position...),
groups the streams whose state has the same shape (the family's `key`), pads each group to
one of a small fixed set of batch sizes and calls the family's step once per group. The one
switch is `mlx_speech.nn.cache.FIXED_SHAPES` (default: GPU backends only, which build
kernels and graphs per input shape): with it a group of n streams runs as the next power of
two rows, the rows past n copies of row 0 whose results are dropped, and the streaming
caches keep their own fixed shapes; without it a step runs exactly its n rows.

A family supplies only its step (what the network does with a `Batch`) and how its state
rows stack, written with the `Batch` helpers: `stack` gathers one array per stream into
the padded batch (a stream that has none yet, a fresh cache, gets zeros shaped like the
others), `rows` scatters a batched result back to the streams, `pad` fills a batch-shaped
array with copies of row 0. Ring KV caches stack themselves (`nn.cache.RingBatch.gather`,
a clock per row). A session is a batch of one: the same code, no special case.

No zero-size array reaches a kernel from here: a round only steps streams that have work,
and a family's `take` returns None for a stream with nothing to run.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any, Generic, TypeVar

import mlx.core as mx
import numpy as np

from ..nn.cache import fixed_shapes

CLEAR_CACHE_EVERY = 256  # steps of one stepper between mx.clear_cache calls

S = TypeVar("S")  # a stream (a session, or its state)


def batch_size(n: int) -> int:
    """Rows a step of `n` streams runs with: with fixed shapes the next power of two (the
    rows past `n` are padding), else `n`."""
    return 1 << (n - 1).bit_length() if n > 1 and fixed_shapes() else n


def chunk_size(n: int) -> int:
    """How many of `n` ready units (tokens, frames) one call takes: with fixed shapes the
    largest power of two up to `n`, else all `n`."""
    return 1 << (n.bit_length() - 1) if n > 1 and fixed_shapes() else n


class Batch(Generic[S]):
    """One step's streams, padded to `size` rows (`batch_size`): `streams` the n real
    ones, `rows` the streams of every row (rows past n repeat `streams[0]`)."""

    def __init__(self, streams: Sequence[S], size: int | None = None):
        self.streams = list(streams)
        self.n = len(self.streams)
        if not self.n:
            raise ValueError("a batch needs at least one stream")
        self.size = batch_size(self.n) if size is None else size
        if self.size < self.n:
            raise ValueError(f"a batch of {self.n} streams cannot run as {self.size} rows")
        self.rows = self.padded(self.streams)

    def padded(self, items: Sequence) -> list:
        """One item per real stream -> one per row (padding rows get item 0's)."""
        if len(items) != self.n:
            raise ValueError(f"{len(items)} items for a batch of {self.n} streams")
        if self.size == self.n:
            return items if isinstance(items, list) else list(items)
        return [*items, *[items[0]] * (self.size - self.n)]

    def stack(self, arrays: Sequence[mx.array | None]) -> mx.array | None:
        """One (1, ...) array per real stream -> the (size, ...) batch. None (a stream whose
        state does not exist yet) stands for zeros shaped like the others, as a fresh cache
        starts; None when no stream has one."""
        if self.size == 1:
            return arrays[0]
        arrays = list(arrays)
        like = next((a for a in arrays if a is not None), None)
        if like is None:
            return None
        zero = None
        for i, a in enumerate(arrays):
            if a is None:
                zero = mx.zeros_like(like) if zero is None else zero
                arrays[i] = zero
        parts = self.padded(arrays)
        return parts[0] if len(parts) == 1 else mx.concatenate(parts, axis=0)

    def stack_host(self, arrays: Sequence[np.ndarray], dtype: mx.Dtype | None = None
                   ) -> mx.array:
        """Equally shaped host arrays, one per real stream -> the (size, ...) batch, one copy
        to the device."""
        a = mx.array(np.stack(self.padded(arrays)))
        return a if dtype is None else a.astype(dtype)

    def pad(self, a: mx.array) -> mx.array:
        """A (n, ...) array -> (size, ...), the padding rows copies of row 0."""
        extra = self.size - a.shape[0]
        return a if not extra else mx.concatenate([a, mx.repeat(a[:1], extra, axis=0)])

    def rows_of(self, a: mx.array | None) -> list[mx.array | None]:
        """A (size, ...) batched result -> each real stream's (1, ...) row (the array itself
        for a batch of one; None for None)."""
        if a is None:
            return [None] * self.n
        if self.size == 1:
            return [a]
        return [a[i: i + 1] for i in range(self.n)]


Step = Callable[[Batch, list], Sequence]


class Stepper:
    """Steps streams in batched rounds with a family's `step(batch, items) -> outputs`.

    `key(stream, item)`: streams whose keys are equal step together (their state has the
    same shapes); None: one group a round. `run` returns each stream's outputs in order.
    Every CLEAR_CACHE_EVERY steps MLX's buffer cache is released (a long stream's changing
    shapes would otherwise keep buffers it no longer needs)."""

    def __init__(self, step: Step, key: Callable[[Any, Any], Hashable] | None = None):
        self.step, self.key = step, key
        self.steps = 0

    def run(self, streams: Sequence[S], take: Callable[[S], Any]) -> dict[int, list]:
        """Round after round, `take(stream)` gives each stream's next item (None: nothing
        this round); the streams that have one step in groups. Stops at a round where no
        stream has an item. Returns {id(stream): [output of each step it took part in]}."""
        out: dict[int, list] = {id(s): [] for s in streams}
        while True:
            items = [(s, it) for s in streams if (it := take(s)) is not None]
            if not items:
                return out
            for group in [items] if self.key is None else grouped(items, self.key):
                batch = Batch([s for s, _ in group])
                results = self.step(batch, [it for _, it in group])
                for s, r in zip(batch.streams, results, strict=True):
                    out[id(s)].append(r)
                self.tick()

    def tick(self) -> None:
        """Count one step (clearing MLX's buffer cache every CLEAR_CACHE_EVERY)."""
        self.steps += 1
        if self.steps % CLEAR_CACHE_EVERY == 0:
            mx.clear_cache()


def grouped(items: Sequence[tuple[S, Any]], key: Callable[[S, Any], Hashable] | None
            ) -> list[list[tuple[S, Any]]]:
    """(stream, item) pairs -> groups of equal `key(stream, item)`, in first-seen order
    (all in one group when `key` is None)."""
    if key is None:
        return [list(items)] if items else []
    groups: dict[Hashable, list] = {}
    for s, it in items:
        groups.setdefault(key(s, it), []).append((s, it))
    return list(groups.values())
