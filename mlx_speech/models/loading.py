"""The one loader: what every family's `load()` shares, from a checkpoint folder to a model
whose every parameter is set from the file.

A family's `load` reads its config (`read_config`, `mistral_or_hf_layout`, or its own format),
finds and maps its weights (`weight_files`, `read_weights`: memory-mapped, and whether they are
already in our converted layout), builds its model from the config, and ends in `fill`:
tensors in the checkpoint's own names go through the family's `remap` (never for converted
files), then `load_strict` swaps in the modules the file stores quantized, checks every shape,
sets every parameter (a missing or unknown key is an error naming it), quantizes the rest on
the fly when asked, and reads the mapped files in one evaluation. No family loads through
another family.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten

from ..errors import CheckpointError
from ..hub import is_converted
from ..hub import read_json as _read_json
from ..hub import weight_files as converted_files
from ..nn import quant

Remap = Callable[[dict[str, mx.array], set[str]], dict[str, mx.array]]


def read_json(path: Path, required: bool = True) -> dict | None:
    """A JSON file of a checkpoint (a one-line CheckpointError when unreadable); None when it is
    absent and not `required`."""
    if not required and not Path(path).exists():
        return None
    return _read_json(path)


def read_config(folder: Path, model_type: str) -> dict:
    """The folder's config.json, which must name `model_type`."""
    path = folder / "config.json"
    if not path.exists():
        raise CheckpointError(f"{folder} has no config.json")
    c = read_json(path)
    if c.get("model_type") != model_type:
        raise CheckpointError(f"{folder} holds a {c.get('model_type')!r} model, not {model_type}")
    return c


def declared_quantization(folder: Path) -> dict | None:
    """What a folder's config.json declares of its quantization (`quant.declared`), if any."""
    return quant.declared(read_json(Path(folder) / "config.json", required=False))


def weight_files(folder: Path, pattern: str = "model*.safetensors") -> list[Path]:
    """The weights of a folder: the file its converted manifest names, else every `pattern`."""
    files = converted_files(folder) or sorted(folder.glob(pattern))
    if not files:
        raise CheckpointError(f"no safetensors weights in {folder}")
    return files


def mistral_or_hf_layout(folder: Path, model_type: str, from_params, from_config):
    """(config, weight files) of a Mistral-native folder (`params.json` +
    `consolidated*.safetensors`), else of a `config.json` + `model*.safetensors` folder whose
    `model_type` must be `model_type`. A converted folder keeps its source's config file; its
    weights file is the one its manifest names."""
    if (folder / "params.json").exists():
        return (from_params(read_json(folder / "params.json")),
                weight_files(folder, "consolidated*.safetensors"))
    if (folder / "config.json").exists():
        return from_config(read_config(folder, model_type)), weight_files(folder)
    raise CheckpointError(f"{folder} has neither params.json nor config.json")


def load_safetensors(files: list[Path]) -> dict[str, mx.array]:
    """Memory-mapped, lazy: tensors are read when the model evaluates them."""
    out: dict[str, mx.array] = {}
    for f in files:
        try:
            out.update(mx.load(str(f)))
        except (RuntimeError, ValueError, OSError) as e:
            raise CheckpointError(f"cannot read weights {f}: {str(e).splitlines()[0]}") from None
    return out


def read_tensors(path: Path, what: str = "weights"):
    """One tensor file, `.safetensors` (memory-mapped) or torch's `.pt` (read without torch,
    `torchfile`): a dict of arrays, or the one array a `.pt` holds. A file that cannot be read
    is a one-line CheckpointError naming `what` and the file."""
    try:
        if Path(path).suffix.lower() == ".safetensors":
            return dict(mx.load(str(path)))
        from .torchfile import load_torch

        return load_torch(path)
    except (OSError, RuntimeError, ValueError) as e:
        raise CheckpointError(f"cannot read {what} {path}: {str(e).splitlines()[0]}") from None


def read_weights(files: list[Path]) -> tuple[dict[str, mx.array], bool]:
    """(the files' tensors, memory-mapped; whether they are in our converted layout)."""
    return load_safetensors(files), is_converted(files)


def parameter_names(model) -> set[str]:
    return {k for k, _ in tree_flatten(model.parameters())}


def fill(model, weights: dict[str, mx.array], where, *, converted: bool = False,
         remap: Remap | None = None, dtype: mx.Dtype | None = None,
         quantize: int | None = None, group_size: int = 64, keep: quant.Keep | None = None,
         declared: dict | None = None) -> None:
    """Set every parameter of `model` from `weights` (read from `where`): the end of every
    family's load.

    Unless `converted` (already in our names, layouts and quantization), `remap(weights,
    parameter names)` renames the checkpoint's tensors first (a ValueError or TypeError of
    it becomes a CheckpointError naming `where`), and `declared` is the quantization the
    checkpoint's config or file names declare, which each quantized module must match. Then
    `load_strict`. With `quantize`, the tensors' dicts are emptied as they are consumed: hold
    no other reference to the file's arrays.
    """
    if not converted and remap is not None:
        try:
            source, weights = weights, remap(weights, parameter_names(model))
        except (ValueError, TypeError) as e:
            raise CheckpointError(f"{where}: {e}") from None
        if quantize is not None and source is not weights:
            source.clear()  # the remapped dict holds the only references now
    load_strict(model, weights, where, dtype, quantize, group_size, keep,
                None if converted else declared)


def raise_missing(expected: set[str], got) -> None:
    missing = sorted(expected - set(got))
    if missing:
        more = f" (+{len(missing) - 1} more)" if len(missing) > 1 else ""
        raise CheckpointError(f"checkpoint is missing key {missing[0]!r}{more}")


def raise_unmatched(expected: set[str], got, where) -> None:
    """A missing key, else a key no parameter takes: an error naming the first."""
    raise_missing(expected, got)
    extra = sorted(set(got) - expected)
    if extra:
        more = f" (+{len(extra) - 1} more)" if len(extra) > 1 else ""
        raise CheckpointError(f"{where}: unexpected key {extra[0]!r}{more}")


def load_strict(model, weights: dict[str, mx.array], where, dtype: mx.Dtype | None,
                quantize: int | None = None, group_size: int = 64,
                keep: quant.Keep | None = None, expect: dict | None = None) -> None:
    """Shapes checked, every parameter set, then one eval reads the mapped files.

    Modules the file stores quantized (`<path>.scales`) are swapped in first, with the
    bits / group size their tensors say (`expect`: what the checkpoint declares); then a
    parameter without a tensor, or a tensor no parameter takes, is an error naming it. `quantize`
    (bits) then quantizes the rest on the fly, except what `keep(path, module)` keeps, one
    module at a time; `weights` is emptied first (callers must hold no other reference to the
    file's arrays), so full-precision tensors are freed as soon as they are quantized.
    """
    if quantize is not None:
        quant.check_params(quantize, group_size)
    try:
        quant.quantize_from_weights(model, weights, expect)
    except CheckpointError as e:
        raise CheckpointError(f"{where}: {e}") from None
    params = tree_flatten(model.parameters())
    raise_unmatched({k for k, _ in params}, weights, where)
    for k, p in params:
        if tuple(weights[k].shape) != tuple(p.shape):
            raise CheckpointError(f"weight {k!r} has shape {tuple(weights[k].shape)}, "
                                  f"config expects {tuple(p.shape)}")
    items = list(weights.items())
    if dtype is not None:  # packed quantized weights and fp-mode scales stay as they are
        items = [(k, v.astype(dtype) if mx.issubdtype(v.dtype, mx.floating) else v)
                 for k, v in items]
    if quantize is not None:
        weights.clear()
    model.load_weights(items, strict=True)
    del items
    model.eval()
    try:
        if quantize is not None:
            quant.quantize(model, quantize, group_size, keep=keep)
        mx.eval(model.parameters(), quant.transposed_views(model))
    except RuntimeError as e:
        msg = str(e).splitlines()[0]
        raise CheckpointError(f"cannot read weights in {where}: {msg}") from None
