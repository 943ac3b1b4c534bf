"""CPU emulations of what MLX's GPU backends (Metal, CUDA) do differently from its CPU backend.

CI has no GPU, so a test guarding a GPU-only hazard runs on the CPU with one of these patched
in (sources: ../shared/research/mlx-backends.md, MLX 0.32 kernels):

* `gpu_rope`: `mx.fast.rope` with the GPU kernels' position arithmetic. The general kernel
  (Metal `rope.metal` `rope_impl`, CUDA `rope.cu` `rope_impl`) computes `pos.y + offset` with
  `pos.y` unsigned, so a negative position wraps to ~4.3e9. Only the "single" kernels
  (T == 1 with one offset on Metal, B == 1 and T == 1 on CUDA) take a signed offset; a call
  wraps here unless both backends would pick the single kernel. And CUDA's launch: its
  general kernel runs a thread block of (dims/2, T, B * ceil(N/4)) threads, sized by
  `get_block_dims_common` with no cap at CUDA's 64 in z, so one position over many rows with
  head_dim <= 16 failed on an H200 with `cudaGraphAddKernelNode ... invalid argument`
  (Voxtral's batched re-anchoring: (4, 156, 1, 8)); such a call raises here.
* `no_float64`: any float64 MLX array (a GPU op on one raises "float64 is not supported on the
  GPU") raises here when it is created: constructor, `astype`, `view`, every `mx.*` function.
* `gpu_order`: `mx.argpartition` / `mx.partition` / `mx.argsort` returning another valid
  order (Metal and CUDA partition by a full sort, the CPU by `nth_element`; ties in any order).
* `TieOrderNumpy`: numpy's `argsort` / `lexsort` with ties in another order, for host code
  that must not depend on it (Sortformer's speaker-cache compression; NeMo's `torch.topk`
  keeps no order among ties).

`gpu_rope` and `gpu_order` read array values on the host, which a compiled step's trace cannot
(mlx_speech.nn.compiled): under them the steps run plainly (MLX_SPEECH_COMPILE=0), through the
same clocks and inputs the compiled steps take.
"""

from __future__ import annotations

import inspect

import mlx.core as mx
import numpy as np
import pytest

_REAL_ROPE = mx.fast.rope
_WRAP = 2**32


def _rope_general(x: mx.array, dims: int, traditional: bool, base: float, scale: float,
                  pos: np.ndarray, freqs) -> mx.array:
    """RoPE at explicit float positions `pos` (B or 1, T), in numpy float32."""
    a = np.array(x.astype(mx.float32))
    shape = a.shape
    a = a.reshape(shape[0], -1, shape[-2], shape[-1])  # (B, N, T, D) as the kernels see it
    half = dims // 2
    if freqs is None:
        inv = np.exp(np.arange(0, -half, -1, dtype=np.float32) * np.float32(np.log(base) / half))
    else:
        inv = 1.0 / np.array(freqs, np.float32)
    theta = (pos.astype(np.float32) * np.float32(scale))[:, None, :, None] * inv
    cos, sin = np.cos(theta), np.sin(theta)
    out = a.copy()
    i1, i2 = (slice(0, dims, 2), slice(1, dims, 2)) if traditional else (
        slice(0, half), slice(half, dims))
    x1, x2 = a[..., i1], a[..., i2]
    out[..., i1] = x1 * cos - x2 * sin
    out[..., i2] = x1 * sin + x2 * cos
    return mx.array(out.reshape(shape)).astype(x.dtype)


def cuda_rope_block(x_shape: tuple[int, ...], dims: int) -> tuple[int, int, int]:
    """The thread block MLX 0.32's CUDA rope launches for an input of `x_shape`
    (`rope.cu`, `get_block_dims_common`: powers of two grown in turn, 2^10 threads at most,
    no per-axis cap); (1, 1, 1) sizes aside for the single kernel (B == 1, T == 1)."""
    B, T = x_shape[0], x_shape[-2]
    N = int(np.prod(x_shape[1:-2], dtype=np.int64))
    if B == 1 and T == 1:
        return (1, 1, 1)
    want, p, total = (dims // 2, T, B * -(-N // 4)), [0, 0, 0], 0
    while True:
        before = total
        for axis in range(3):
            if want[axis] >= 1 << (p[axis] + 1):
                p[axis] += 1
                total += 1
            if total == 10:
                return tuple(1 << q for q in p)
        if total == before:
            return tuple(1 << q for q in p)


def emulated_rope(x: mx.array, dims: int, *, traditional: bool, base: float | None,
                  scale: float, offset, freqs=None, stream=None) -> mx.array:
    """`mx.fast.rope` as the GPU kernels compute it (see the module docstring)."""
    block = cuda_rope_block(x.shape, dims)
    if block[2] > 64:
        raise RuntimeError(f"cudaGraphAddKernelNode failed: invalid argument (emulated: CUDA's "
                           f"rope for {x.shape} launches a {block} thread block; z <= 64)")
    off = np.array(offset, np.int64).reshape(-1)
    B, T = x.shape[0], x.shape[-2]
    pos = np.arange(T)[None, :] + off[:, None]
    single = T == 1 and B == 1 and off.size == 1
    if single or pos.min() >= 0:
        return _REAL_ROPE(x, dims, traditional=traditional, base=base, scale=scale,
                          offset=offset, freqs=freqs, stream=stream)
    return _rope_general(x, dims, traditional, base, scale, pos % _WRAP, freqs)


@pytest.fixture
def gpu_rope(monkeypatch):
    """Every `mx.fast.rope` call computes positions as the GPU kernels do."""
    monkeypatch.setenv("MLX_SPEECH_COMPILE", "0")
    monkeypatch.setattr(mx.fast, "rope", emulated_rope)
    return emulated_rope


class Float64Error(ValueError):
    pass


def _check(out, what: str):
    arrays = out if isinstance(out, (list, tuple)) else (out,)
    for a in arrays:
        if isinstance(a, _REAL_ARRAY) and a.dtype == mx.float64:
            raise Float64Error(f"{what} made a float64 array: float64 is not supported on "
                               "the GPU (emulated)")
    return out


_REAL_ARRAY = mx.array


class _GuardedMeta(type):
    def __instancecheck__(cls, obj):
        return isinstance(obj, _REAL_ARRAY)

    def __subclasscheck__(cls, sub):
        return issubclass(sub, _REAL_ARRAY)

    def __call__(cls, *args, **kwargs):
        return _check(_REAL_ARRAY(*args, **kwargs), "mx.array(...)")


class _GuardedArray(metaclass=_GuardedMeta):
    """Stands in for `mx.array`: constructs real arrays, refuses float64 ones."""


def _guard(fn, name: str):
    def wrapped(*args, **kwargs):
        return _check(fn(*args, **kwargs), name)

    return wrapped


@pytest.fixture
def no_float64(monkeypatch):
    """Creating a float64 MLX array anywhere raises Float64Error."""
    for name, fn in vars(mx).items():
        if callable(fn) and not inspect.isclass(fn) and not inspect.ismodule(fn):
            monkeypatch.setattr(mx, name, _guard(fn, f"mx.{name}"))
    for name in ("astype", "view"):
        monkeypatch.setattr(_REAL_ARRAY, name, _guard(getattr(_REAL_ARRAY, name),
                                                      f"array.{name}"))
    monkeypatch.setattr(mx, "array", _GuardedArray)
    return Float64Error


def _permuted_sort(a: np.ndarray, order: str) -> np.ndarray:
    """Indices that sort `a` along the last axis, equal values in `order`:
    "stable" (lowest index first) or "reversed" (highest first)."""
    n = a.shape[-1]
    tie = np.broadcast_to(np.arange(n) if order == "stable" else -np.arange(n), a.shape)
    return np.lexsort((tie, a), axis=-1)


def _reverse_sides(idx: np.ndarray, kth: int) -> np.ndarray:
    """Another valid partition: each side of `kth` in reverse."""
    return np.concatenate([idx[..., :kth][..., ::-1], idx[..., kth: kth + 1],
                           idx[..., kth + 1:][..., ::-1]], axis=-1)


def ordered_ops(order: str):
    """(argpartition, partition, argsort) returning valid results in a given order:
    "stable", "reversed" (ties highest index first) or "shuffled" (reversed, and each
    side of a partition reversed)."""
    ties = "stable" if order == "stable" else "reversed"

    def _norm(a, axis):
        a = np.array(a)
        axis = axis % a.ndim
        return np.moveaxis(a, axis, -1), axis

    def argpartition(a, kth, axis=-1, stream=None):
        x, ax = _norm(a, axis)
        idx = _permuted_sort(x, ties)
        if order == "shuffled":
            idx = _reverse_sides(idx, kth % x.shape[-1])
        return _REAL_ARRAY(np.moveaxis(idx, -1, ax).astype(np.uint32))

    def partition(a, kth, axis=-1, stream=None):
        x, ax = _norm(a, axis)
        idx = argpartition(a, kth, axis)
        vals = np.take_along_axis(x, np.moveaxis(np.array(idx), ax, -1).astype(np.int64), -1)
        return _REAL_ARRAY(np.moveaxis(vals, -1, ax)).astype(a.dtype)

    def argsort(a, axis=-1, stream=None):
        x, ax = _norm(a, axis)
        return _REAL_ARRAY(np.moveaxis(_permuted_sort(x, ties), -1, ax).astype(np.uint32))

    return argpartition, partition, argsort


@pytest.fixture
def gpu_order(monkeypatch):
    """Call with an order name to make MLX's partitions/sorts return that order."""

    def use(order: str) -> None:
        monkeypatch.setenv("MLX_SPEECH_COMPILE", "0")
        argpartition, partition, argsort = ordered_ops(order)
        monkeypatch.setattr(mx, "argpartition", argpartition)
        monkeypatch.setattr(mx, "partition", partition)
        monkeypatch.setattr(mx, "argsort", argsort)

    return use


class TieOrderNumpy:
    """numpy as a module sees it, with `argsort` and `lexsort` listing equal keys in `order`
    ("stable" or "reversed") whatever `kind` asks: what a sort that keeps no order among ties
    (torch.topk, on another device) may return. Patch it over a module's `np` to show that the
    module's result does not depend on the order of ties."""

    def __init__(self, order: str):
        self.order = order

    def __getattr__(self, name):
        return getattr(np, name)

    def argsort(self, a, axis=-1, kind=None):
        x = np.moveaxis(np.asarray(a), axis, -1)
        return np.moveaxis(_permuted_sort(x, self.order), -1, axis)

    def lexsort(self, keys, axis=-1):
        keys = [np.moveaxis(np.asarray(k), axis, -1) for k in keys]
        n = keys[0].shape[-1]
        tie = np.broadcast_to(np.arange(n) if self.order == "stable" else -np.arange(n),
                              keys[0].shape)
        return np.moveaxis(np.lexsort((tie, *keys), axis=-1), -1, axis)
