"""Quantized weights for every model: read them from a file, or quantize on the fly.

Built on mlx's own `nn.quantize` / `nn.QuantizedLinear` / `nn.QuantizedEmbedding` (the packed
format and `mx.quantized_matmul` are the same in mlx-lm, mlx-audio and moshi_mlx, so identical
tensors give identical outputs). Each quantized module is `.weight` (uint32, packed) + `.scales`
(+ `.biases` in affine mode; the fp modes store uint8 scales and no biases).

- `quantize_from_weights(model, weights)`: swap in the quantized module wherever the file has
  `<path>.scales`, with bits / group size / mode read from the tensor shapes, so partly quantized
  files load as they are. The caller then loads strictly, as for any other file.
- `quantize(model, bits, group_size, mode, keep)`: on the fly; `keep(path, module)` is the
  family's keep-in-high-precision rule, and layers whose input width is not a multiple of the
  group stay as they are.
- `transposed_views(model)`: the full-precision Linears read their weight through a transposed
  view made once at load (no Transpose node per call).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from ..errors import CheckpointError, MlxSpeechError

# bits and group sizes mx.quantize accepts, per mode
MODES: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {
    "affine": ((2, 3, 4, 5, 6, 8), (32, 64, 128)),
    "mxfp4": ((4,), (32,)),
    "nvfp4": ((4,), (16,)),
    "mxfp8": ((8,), (32,)),
}
_FP_MODES = {(b[0], g[0]): m for m, (b, g) in MODES.items() if m != "affine"}

Keep = Callable[[str, nn.Module], bool]

# Rows (the product of the input's leading dims) from which a quantized Linear with half-precision
# activations dequantizes its weight and runs a dense GEMM instead of `mx.quantized_matmul`, per
# backend (None: never). MLX's quantized matmul is tuned for few rows (one token per stream): on
# an H100, Voxtral in 4-bit ran slower than bf16 from 32 streams on (issue 21's measurements).
# On the CPU its bf16 kernel is 8-40x slower than dense at any row count and dequantize + GEMM
# 1-2x (benchmarks/quantized_batches.py), but the CPU keeps the quantized kernel: its outputs are
# what the quantized parity tests compare, and CPU runs default to float32 activations. Metal is
# unmeasured.
DENSE_FROM_ROWS: dict[str, int | None] = {"cpu": None, "metal": None, "cuda": 32}


def backend() -> str:
    """"cpu", "cuda" or "metal": where the default device runs."""
    if mx.default_device().type == mx.DeviceType.cpu:
        return "cpu"
    return "cuda" if mx.cuda.is_available() else "metal"


def check_params(bits: int, group_size: int = 64, mode: str = "affine") -> None:
    """User input -> one-line MlxSpeechError when mlx cannot quantize with it."""
    if mode not in MODES:
        raise MlxSpeechError(f"unknown quantization mode {mode!r} (known: {', '.join(MODES)})")
    allowed_bits, allowed_groups = MODES[mode]
    if isinstance(bits, bool) or bits not in allowed_bits:
        raise MlxSpeechError(f"{mode} quantization takes bits in "
                             f"{', '.join(map(str, allowed_bits))}, got {bits!r}")
    if isinstance(group_size, bool) or group_size not in allowed_groups:
        raise MlxSpeechError(f"{mode} quantization takes group size "
                             f"{', '.join(map(str, allowed_groups))}, got {group_size!r}")


def param_name(key: str) -> str:
    """`X.scales` / `X.biases` (a quantized module's extra tensors) -> `X.weight`, so key maps
    written for full-precision parameter names accept quantized files too."""
    for suffix in (".scales", ".biases"):
        if key.endswith(suffix):
            return key[: -len(suffix)] + ".weight"
    return key


def is_quantized(module: nn.Module) -> bool:
    return isinstance(module, (nn.QuantizedLinear, nn.QuantizedEmbedding))


def _dense_shape(module: nn.Module) -> tuple[int, ...] | None:
    """(out, in) of the full-precision weight (rows, width for an embedding)."""
    if is_quantized(module):
        *lead, packed = module.weight.shape
        return (*lead, packed * 32 // module.bits)
    if isinstance(module, (nn.Linear, nn.Embedding)):
        return tuple(module.weight.shape)
    return None


def dense_weight(module: nn.Module) -> mx.array:
    """The weight of a Linear / Embedding in full precision (dequantized when quantized)."""
    if not is_quantized(module):
        return module.weight
    return mx.dequantize(module.weight, module.scales, module.get("biases"),
                         group_size=module.group_size, bits=module.bits, mode=module.mode)


class QuantizedLinear(nn.QuantizedLinear):
    """mlx's QuantizedLinear (same parameters, same file format); a call with many rows of
    half-precision input dequantizes and runs a dense GEMM (`DENSE_FROM_ROWS`)."""

    def __call__(self, x: mx.array) -> mx.array:
        rows = x.size // x.shape[-1] if x.ndim else 0
        limit = DENSE_FROM_ROWS.get(backend())
        if x.dtype == mx.float32 or limit is None or rows < limit:
            return super().__call__(x)
        w = mx.dequantize(self["weight"], self["scales"], self.get("biases"),
                          group_size=self.group_size, bits=self.bits, mode=self.mode)
        w = w.astype(x.dtype)
        if "bias" in self:
            return mx.addmm(self["bias"].astype(x.dtype), x, w.T)
        return x @ w.T


class Linear(nn.Linear):
    """mlx's Linear (same parameters, same numbers) reading `weight.T` from a view made once
    (`transposed_views`): mlx's `x @ weight.T` adds a Transpose node to the graph on every
    call, and each node costs host time, compiled steps included (7 of a transformer layer's
    ~40 nodes with one-node kernels). The view shares the weight's memory; a weight replaced
    since (update, load) is read as mlx reads it, and the stale view is dropped (it would keep
    the old weight alive)."""

    def __call__(self, x: mx.array) -> mx.array:
        w = self["weight"]
        view = self.__dict__.get("_t")
        if view is not None and view[0] is not w:
            del self.__dict__["_t"]
            view = None
        wt = w.T if view is None else view[1]
        if "bias" in self:
            return mx.addmm(self["bias"], x, wt)
        return x @ wt


def transposed_views(model: nn.Module) -> list[mx.array]:
    """Make every full-precision `nn.Linear` of `model` a `Linear` with its weight's transposed
    view (a subclass: parameters and state stay as they are); returns the views for the
    caller's eval (outside any compiled trace)."""
    out = []
    for _, m in _leaves(model):
        if type(m) in (nn.Linear, Linear):
            m.__class__ = Linear
            w = m["weight"]
            object.__setattr__(m, "_t", (w, w.T))  # not a parameter: outside the module dict
            out.append(m._t[1])
    return out


def _use_dense_batches(model: nn.Module) -> None:
    """Make every quantized Linear ours (a subclass: parameters and state stay as they are)."""
    for _, m in _leaves(model):
        if type(m) is nn.QuantizedLinear:
            m.__class__ = QuantizedLinear


def infer_quantization(weights: Mapping[str, mx.array], path: str,
                       module: nn.Module) -> dict | None:
    """{bits, group_size, mode} of `path` from the tensors in `weights`; None if not quantized.

    group = in_dims / scales.shape[-1] and bits = weight.shape[-1] * 32 / in_dims (as mlx-lm's
    infer_quant_config); uint8 scales and no biases are mlx's fp modes. Shapes that fit no valid
    setting (a wrong group size or bit width, a truncated tensor) raise a CheckpointError naming
    the key.
    """
    scales = weights.get(f"{path}.scales")
    if scales is None:
        return None
    shape = _dense_shape(module)
    if shape is None or not hasattr(module, "to_quantized"):
        raise CheckpointError(f"{path}.scales: {type(module).__name__} {path!r} cannot be "
                              "quantized")
    w = weights.get(f"{path}.weight")
    if w is None:
        raise CheckpointError(f"checkpoint has {path}.scales but no {path}.weight")
    biases = weights.get(f"{path}.biases")
    *lead, in_dims = shape
    if w.dtype != mx.uint32:
        raise CheckpointError(f"{path}.weight is {w.dtype}, a quantized weight is uint32")
    if tuple(w.shape[:-1]) != tuple(lead) or w.ndim != len(shape):
        raise CheckpointError(f"{path}.weight has shape {tuple(w.shape)}, the model needs "
                              f"{tuple(lead)} rows of packed {in_dims}-wide weights")
    if tuple(scales.shape[:-1]) != tuple(lead) or scales.ndim != len(shape):
        raise CheckpointError(f"{path}.scales has shape {tuple(scales.shape)}, which does not "
                              f"match {path}.weight {tuple(w.shape)}")
    n_groups, packed = scales.shape[-1], w.shape[-1]
    if n_groups == 0 or in_dims % n_groups or (packed * 32) % in_dims:
        raise CheckpointError(f"{path}: weight {tuple(w.shape)} and scales "
                              f"{tuple(scales.shape)} fit no bit width / group size for "
                              f"width {in_dims}")
    group, bits = in_dims // n_groups, packed * 32 // in_dims
    if scales.dtype == mx.uint8 and biases is None:
        mode = _FP_MODES.get((bits, group))
        if mode is None:
            raise CheckpointError(f"{path}: uint8 scales with {bits} bits / group {group} "
                                  "match no fp quantization mode")
    else:
        mode = "affine"
        if biases is None:
            raise CheckpointError(f"checkpoint has {path}.scales but no {path}.biases")
        if tuple(biases.shape) != tuple(scales.shape):
            raise CheckpointError(f"{path}.biases has shape {tuple(biases.shape)}, "
                                  f"{path}.scales {tuple(scales.shape)}")
    if bits not in MODES[mode][0] or group not in MODES[mode][1]:
        raise CheckpointError(f"{path}: {bits}-bit group-{group} {mode} quantization is not "
                              "supported by mlx")
    return {"group_size": group, "bits": bits, "mode": mode}


def declared(config: Mapping | None) -> dict | None:
    """The {bits, group_size, mode} a config declares under `quantization` /
    `quantization_config`; None when absent or set per layer."""
    if config is None:
        return None
    q = config.get("quantization") or config.get("quantization_config")
    if not isinstance(q, Mapping) or "bits" not in q:
        return None
    if any(isinstance(v, (Mapping, bool)) for v in q.values()):  # per-layer settings
        return None
    return {"bits": q["bits"], "group_size": q.get("group_size", 64),
            "mode": q.get("mode", "affine")}


def quantize_from_weights(model: nn.Module, weights: Mapping[str, mx.array],
                          expect: Mapping | None = None, where: str = "") -> None:
    """Swap in the quantized version of every module with `<path>.scales` in `weights`.

    Modules without `.scales` stay as they are, so partly quantized files load as they are.
    `expect` (optional): the {bits, group_size[, mode]} the checkpoint declares (its config or
    file name); a module quantized differently is an error naming it and `where`.
    """
    found: dict[str, dict] = {}
    for path, m in _leaves(model):
        q = infer_quantization(weights, path, m)
        if q is None:
            continue
        if expect is not None:
            want = (expect.get("bits"), expect.get("group_size"), expect.get("mode", "affine"))
            got = (q["bits"], q["group_size"], q["mode"])
            if got != want:
                at = f"{where}: " if where else ""
                raise CheckpointError(
                    f"{at}{path} is {got[0]}-bit group {got[1]} {got[2]}, but the checkpoint "
                    f"says {want[0]}-bit group {want[1]} {want[2]}")
        found[path] = q
    if found:
        nn.quantize(model, class_predicate=lambda p, _: found.get(p, False))
        _use_dense_batches(model)


def _leaves(model: nn.Module):
    return tree_flatten(model.leaf_modules(), is_leaf=nn.Module.is_module)


def quantize(model: nn.Module, bits: int, group_size: int = 64, mode: str = "affine",
             keep: Keep | None = None) -> None:
    """Quantize every Linear / Embedding in place, except where `keep(path, module)` is true or
    the input width is not a multiple of `group_size`. Evaluated one module at a time, so a
    memory-mapped model never holds all its full-precision weights at once."""
    check_params(bits, group_size, mode)

    def pick(path: str, m: nn.Module) -> bool:
        if not isinstance(m, (nn.Linear, nn.Embedding)) or is_quantized(m):
            return False
        if m.weight.shape[-1] % group_size:
            return False
        return not (keep is not None and keep(path, m))

    chosen = [p for p, m in _leaves(model) if pick(p, m)]
    todo = set(chosen)
    nn.quantize(model, group_size=group_size, bits=bits, mode=mode,
                class_predicate=lambda p, _: p in todo)
    _use_dense_batches(model)
    modules = dict(_leaves(model))
    for p in chosen:
        mx.eval(modules[p].parameters())
