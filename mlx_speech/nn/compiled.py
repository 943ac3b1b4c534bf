"""Compiled streaming steps: `mx.compile` a step once per shape, the one helper every family
uses (`CompiledStep`).

A streaming step builds the same graph every call: tens of layers of small ops whose Python
costs more than the device work at the real depth (a 26-layer decoder step builds its graph in
~6 ms of host time; compiled, ~2 ms). Compiled, the graph is traced once per input shape and
replayed from C++ after that, and the fixed set of shapes the streaming caches keep (ring
slots in power-of-two buckets, batch sizes bucketed with `nn.cache.FIXED_SHAPES`) makes a
stream reuse a few compiled graphs from its first second on.

A compiled step must be a pure function of its inputs: every cache, ring and clock it reads or
writes is an explicit input (arrays, lists / tuples / dicts of arrays, or constants: ints,
floats, strings, None, which select a separate trace) and every new state an output. Python
side effects inside it happen once, while it is traced: the host keeps its own bookkeeping
(positions, fill levels) outside and advances it after the call. Per-row positions that change
every step are arrays (`mx.fast.rope` takes an array offset; ring writes are index writes), so
the step's trace does not change with them.

`CompiledStep(fn)(key, *args)` runs `fn(*args)`: `key` names the step's shape (any hashable
the caller builds cheaply from its shapes and constants). The first call with a key runs `fn`
plainly (a shape seen once, a prompt, a stream's first chunk, is not worth a trace); from the
second on the compiled function runs. Compiled graphs are kept for at most `MAX_SHAPES` keys
per step (then all are dropped and traced again), so memory stays bounded whatever the shapes.

Compiled steps are on by default where the steps run at the fixed shapes (GPU backends, or
`nn.cache.FIXED_SHAPES = True`), where a step's host time bounds a stream. On the CPU backend
they are off by default: there the device work is the host's own, the host saving is smaller,
and the first call of each shape JIT-compiles its fused kernels with the system's C++ compiler
(about a second at the real depth: a live stream would drop its first frames).
`MLX_SPEECH_COMPILE=1` turns them on anywhere, `MLX_SPEECH_COMPILE=0` off (read at each call,
so a test or a debugging session can flip it); `reset()` drops every compiled graph (the
kernel watch of the tests does, to see the traced ops again).
Results are the same either way: MLX's compiled kernels compute what the plain ops do, and
the tests check compiled == plain token for token and frame for frame.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable, Hashable

import mlx.core as mx

from .cache import fixed_shapes

ENV = "MLX_SPEECH_COMPILE"
MAX_SHAPES = 64  # compiled keys kept per step before its graphs are dropped

_STEPS: weakref.WeakSet[CompiledStep] = weakref.WeakSet()


def enabled() -> bool:
    """Whether steps run compiled: `MLX_SPEECH_COMPILE` "0" (off) or anything else (on);
    unset, where the streaming steps run at the fixed shapes (`nn.cache.fixed_shapes()`: GPU
    backends by default)."""
    value = os.environ.get(ENV)
    return fixed_shapes() if value is None else value != "0"


class CompiledStep:
    """`fn` compiled once per shape key; see the module docstring."""

    def __init__(self, fn: Callable, name: str | None = None):
        self.fn = fn
        self.name = name or getattr(fn, "__name__", "step")
        self.seen: set[Hashable] = set()  # keys run once (plainly)
        self.traced: set[Hashable] = set()  # keys run compiled
        self._compiled: Callable | None = None
        _STEPS.add(self)

    def __call__(self, key: Hashable, *args):
        if not enabled():
            return self.fn(*args)
        if key not in self.traced:
            if key not in self.seen:
                self.seen.add(key)
                return self.fn(*args)
            if len(self.traced) >= MAX_SHAPES:
                self.reset()
            self.traced.add(key)
        if self._compiled is None:
            self._compiled = mx.compile(self.fn)
        return self._compiled(*args)

    def reset(self) -> None:
        """Drop the compiled graphs (the next calls trace again)."""
        self._compiled = None
        self.seen.clear()
        self.traced.clear()


def reset() -> None:
    """Drop every step's compiled graphs."""
    for step in list(_STEPS):
        step.reset()
