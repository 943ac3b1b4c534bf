"""Watch what reaches MLX's kernels: no zero-size input, and which shapes attention sees.

A GPU backend launches a kernel per op; a launch over an empty grid crashes the process on
CUDA (SIGFPE in a grid-size division, or `cudaGraphAddKernelNode ... invalid argument`), where
the CPU backend quietly returns an empty array. `kernels` (the fixture) wraps the function
kernels the models reach, directly or through `mlx.nn` (`nn.Linear` calls `mx.addmm` or
`array.__matmul__`, `nn.Conv1d` `mx.conv1d`, `nn.LayerNorm`/`nn.RMSNorm` `mx.fast.*`,
`nn.Embedding` `array.__getitem__` with an index array), and raises `EmptyKernelInput` at the
call that passes a zero-size array, so the traceback names the line to fix.

It also records the input shapes of every call (`watch.shapes("scaled_dot_product_attention")`):
a GPU builds kernels and graphs per shape, so a stream should use a small fixed set.

Compiled steps (mlx_speech/nn/compiled.py) call these functions while they are traced, with
the real shapes; `install` drops every compiled graph first, so each step shape a test runs is
traced (and watched) again.
"""

from __future__ import annotations

from collections import Counter

import mlx.core as mx
import pytest

from mlx_speech.nn import compiled

_ARRAY = mx.array

CORE = ("addmm", "matmul", "conv1d", "conv2d", "conv3d", "conv_general", "conv_transpose1d",
        "conv_transpose2d", "pad", "concatenate", "stack", "take", "take_along_axis", "softmax",
        "quantized_matmul", "gather_mm", "gather_qmm", "dequantize", "argmax", "logsumexp")
FAST = ("rope", "rms_norm", "layer_norm", "scaled_dot_product_attention")


class EmptyKernelInput(AssertionError):
    pass


def _arrays(args, kwargs):
    for a in (*args, *kwargs.values()):
        if isinstance(a, _ARRAY):
            yield a
        elif isinstance(a, (list, tuple)):
            yield from (b for b in a if isinstance(b, _ARRAY))


class KernelWatch:
    """Records (name, input shapes) per call; raises on a zero-size input while `strict`."""

    def __init__(self):
        self.calls: Counter = Counter()
        self.strict = True

    def check(self, name: str, args, kwargs) -> None:
        arrays = list(_arrays(args, kwargs))
        shapes = tuple(tuple(a.shape) for a in arrays)
        self.calls[(name, shapes)] += 1
        if self.strict and any(a.size == 0 for a in arrays):
            raise EmptyKernelInput(f"{name} got a zero-size input: shapes {list(shapes)}")

    def shapes(self, name: str) -> set[tuple]:
        """Distinct input shapes one kernel was called with."""
        return {s for (n, s) in self.calls if n == name}

    def reset(self) -> None:
        self.calls.clear()

    def wrap(self, fn, name: str):
        def wrapped(*args, **kwargs):
            self.check(name, args, kwargs)
            return fn(*args, **kwargs)

        wrapped.__name__ = name
        return wrapped


def install(monkeypatch, watch: KernelWatch) -> KernelWatch:
    compiled.reset()
    for name in CORE:
        if hasattr(mx, name):
            monkeypatch.setattr(mx, name, watch.wrap(getattr(mx, name), name))
    for name in FAST:
        monkeypatch.setattr(mx.fast, name, watch.wrap(getattr(mx.fast, name), name))
    matmul = _ARRAY.__matmul__
    monkeypatch.setattr(_ARRAY, "__matmul__", watch.wrap(matmul, "matmul"))
    getitem = _ARRAY.__getitem__

    def index(a, idx):  # a gather (array index) is a kernel; a slice is a view
        if isinstance(idx, _ARRAY) or (isinstance(idx, tuple)
                                       and any(isinstance(i, _ARRAY) for i in idx)):
            watch.check("gather", (a, idx), {})
        return getitem(a, idx)

    monkeypatch.setattr(_ARRAY, "__getitem__", index)
    return watch


@pytest.fixture
def kernels(monkeypatch):
    """Every watched MLX kernel call is recorded; a zero-size input raises EmptyKernelInput."""
    return install(monkeypatch, KernelWatch())
