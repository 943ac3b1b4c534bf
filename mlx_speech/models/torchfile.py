"""Read torch.save zip archives (.pt, .pth, .ckpt, .bin) without torch and without running code.

A torch.save file (torch >= 1.6) is a zip holding `<root>/data.pkl`, a pickle in
which every tensor is a call to `torch._utils._rebuild_tensor_v2/v3` on a
storage that the pickle names by a persistent id `("storage", type, key, ...)`;
the storage's raw little-endian bytes are the member `<root>/data/<key>`.

The unpickler here knows only those tensor globals, torch's storage and dtype
names, `collections.OrderedDict` and a few builtin containers; any other
global (os.system, a model class, a numpy scalar) raises `CheckpointError`
before it is built, so loading never runs code from the file.

    obj = load_torch("voice.pt")          # tensors come back as mx.array
    flat = flatten_tensors(obj)           # {"layers.0.weight": mx.array, ...}

float64 tensors come back as float32, cast in numpy: MLX's GPU backends refuse any
operation on a float64 array, so none is ever created.
"""

from __future__ import annotations

import collections
import contextlib
import io
import math
import mmap
import pickle
import struct
import zipfile
from collections.abc import Iterator
from pathlib import Path

import mlx.core as mx
import numpy as np

from ..errors import CheckpointError

# (numpy dtype used to read the bytes, mlx dtype of the result); bf16 is read as uint16,
# float64 is narrowed to float32 in numpy (see the module docstring)
_BF16 = (np.dtype(np.uint16), mx.bfloat16)
_BY_STORAGE = {  # legacy typed-storage class names, still what torch 2.x writes
    "FloatStorage": (np.dtype(np.float32), mx.float32),
    "HalfStorage": (np.dtype(np.float16), mx.float16),
    "BFloat16Storage": _BF16,
    "DoubleStorage": (np.dtype(np.float64), mx.float32),
    "LongStorage": (np.dtype(np.int64), mx.int64),
    "IntStorage": (np.dtype(np.int32), mx.int32),
    "ShortStorage": (np.dtype(np.int16), mx.int16),
    "CharStorage": (np.dtype(np.int8), mx.int8),
    "ByteStorage": (np.dtype(np.uint8), mx.uint8),
    "BoolStorage": (np.dtype(np.bool_), mx.bool_),
    "ComplexFloatStorage": (np.dtype(np.complex64), mx.complex64),
}
_BY_DTYPE = {  # torch.<dtype> names, used with UntypedStorage (_rebuild_tensor_v3)
    "float32": _BY_STORAGE["FloatStorage"], "float": _BY_STORAGE["FloatStorage"],
    "float16": _BY_STORAGE["HalfStorage"], "half": _BY_STORAGE["HalfStorage"],
    "bfloat16": _BF16,
    "float64": _BY_STORAGE["DoubleStorage"], "double": _BY_STORAGE["DoubleStorage"],
    "int64": _BY_STORAGE["LongStorage"], "long": _BY_STORAGE["LongStorage"],
    "int32": _BY_STORAGE["IntStorage"], "int": _BY_STORAGE["IntStorage"],
    "int16": _BY_STORAGE["ShortStorage"], "short": _BY_STORAGE["ShortStorage"],
    "int8": _BY_STORAGE["CharStorage"],
    "uint8": _BY_STORAGE["ByteStorage"],
    "bool": _BY_STORAGE["BoolStorage"],
    "uint16": (np.dtype(np.uint16), mx.uint16),
    "uint32": (np.dtype(np.uint32), mx.uint32),
    "uint64": (np.dtype(np.uint64), mx.uint64),
    "complex64": _BY_STORAGE["ComplexFloatStorage"], "cfloat": _BY_STORAGE["ComplexFloatStorage"],
}
_BUILTINS = {"dict": dict, "list": list, "tuple": tuple, "set": set, "frozenset": frozenset,
             "bytearray": bytearray}


class _DType:
    """A torch dtype or typed-storage class named by the pickle."""

    def __init__(self, name: str):
        self.name = name
        self.spec = _BY_STORAGE.get(name) or _BY_DTYPE.get(name)


class _Storage:
    """Raw storage bytes (zero-copy where possible) and, for typed storages, a dtype."""

    def __init__(self, raw: np.ndarray, dtype: _DType | None, key: str):
        self.raw, self.dtype, self.key = raw, dtype, key


def _encode(text: str, encoding: str = "latin1") -> bytes:
    # protocol 2 pickles `bytes` as _codecs.encode(str, "latin1"); allow only that
    if not isinstance(text, str) or encoding != "latin1":
        raise pickle.UnpicklingError("refusing to load _codecs.encode with these arguments")
    return text.encode("latin1")


def _size(shape) -> tuple[int, ...]:
    return tuple(int(s) for s in shape)


class _Unpickler(pickle.Unpickler):
    def __init__(self, data: bytes, archive: _Archive):
        super().__init__(io.BytesIO(data))
        self.archive = archive
        self.storages: dict[str, _Storage] = {}
        self.narrowed: list[mx.array] = []  # tensors stored as float64

    def find_class(self, module: str, name: str):
        if module == "torch._utils":
            if name == "_rebuild_tensor_v2":
                return self._rebuild_v2
            if name == "_rebuild_tensor_v3":
                return self._rebuild_v3
            if name in ("_rebuild_parameter", "_rebuild_parameter_with_state"):
                return lambda data, *_: data  # nn.Parameter -> its tensor
        if module in ("torch", "torch.storage") and name == "UntypedStorage":
            return _DType(name)
        if module == "torch":
            if name == "Size":
                return tuple
            # dtypes MLX lacks (float8, complex128, quantized) are refused when a tensor uses them
            if (name in _BY_STORAGE or name in _BY_DTYPE or name.endswith("Storage")
                    or name.startswith(("float8", "complex"))):
                return _DType(name)
        if module == "collections" and name == "OrderedDict":
            return collections.OrderedDict
        if module in ("builtins", "__builtin__") and name in _BUILTINS:
            return _BUILTINS[name]
        if module == "_codecs" and name == "encode":
            return _encode
        raise pickle.UnpicklingError(
            f"refusing to load {module}.{name}: only tensors and plain containers are allowed")

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and len(pid) >= 3 and pid[0] == "storage"):
            raise pickle.UnpicklingError(f"unexpected persistent id {pid!r}")
        kind, key = pid[1], str(pid[2])
        if not isinstance(kind, _DType):
            raise pickle.UnpicklingError("storage without a known type")
        if key not in self.storages:
            dtype = None if kind.name == "UntypedStorage" else kind
            self.storages[key] = _Storage(self.archive.member(f"data/{key}"), dtype, key)
        return self.storages[key]

    def _rebuild_v2(self, storage, offset, size, stride, *_):
        if not isinstance(storage, _Storage) or storage.dtype is None:
            raise pickle.UnpicklingError("tensor without a typed storage")
        return self._tensor(storage, storage.dtype, offset, size, stride)

    def _rebuild_v3(self, storage, offset, size, stride, requires_grad, hooks, dtype, *_):
        if not isinstance(storage, _Storage) or not isinstance(dtype, _DType):
            raise pickle.UnpicklingError("tensor without a storage or dtype")
        return self._tensor(storage, dtype, offset, size, stride)

    def _tensor(self, storage: _Storage, dtype: _DType, offset, size, stride) -> mx.array:
        if dtype.spec is None:
            raise CheckpointError(f"tensor dtype {dtype.name} is not supported by MLX")
        np_dtype, mx_dtype = dtype.spec
        np_dtype = np_dtype.newbyteorder(self.archive.byteorder)
        raw = storage.raw
        if raw.nbytes % np_dtype.itemsize:
            raise CheckpointError(f"storage {storage.key} is not a whole number of "
                                  f"{dtype.name} elements")
        flat = raw.view(np_dtype)
        offset, size, stride = int(offset), _size(size), _size(stride)
        if len(size) != len(stride) or offset < 0 or min(size + stride, default=0) < 0:
            raise CheckpointError(f"bad tensor layout (offset {offset}, size {size}, "
                                  f"stride {stride})")
        n = math.prod(size)
        if n:  # the last element must lie inside the storage (no reads past it)
            last = offset + sum((s - 1) * st for s, st in zip(size, stride, strict=True))
            if last >= flat.size:
                raise CheckpointError(f"tensor runs past the end of storage {storage.key}")
            view = np.lib.stride_tricks.as_strided(
                flat[offset:], shape=size, strides=tuple(st * np_dtype.itemsize for st in stride),
                writeable=False)
        else:
            view = np.zeros(size, np_dtype)
        arr = view.copy().astype(np_dtype.newbyteorder("="), copy=False)
        if mx_dtype == mx.bfloat16:
            return mx.array(arr).view(mx.bfloat16)
        if arr.dtype == np.float64:
            out = mx.array(arr.astype(np.float32))
            self.narrowed.append(out)
            return out
        return mx.array(arr, dtype=mx_dtype)


class _Archive:
    """The zip members under one root folder; stored members are read without a copy."""

    def __init__(self, zf: zipfile.ZipFile, buf, root: str):
        self.zf, self.buf, self.root = zf, buf, root
        names = set(zf.namelist())
        order = root + "byteorder"
        self.byteorder = "<"
        if order in names:
            text = zf.read(order).decode("ascii", "replace").strip()
            if text not in ("little", "big"):
                raise CheckpointError(f"unknown byteorder {text!r}")
            self.byteorder = "<" if text == "little" else ">"

    def member(self, name: str) -> np.ndarray:
        try:
            info = self.zf.getinfo(self.root + name)
        except KeyError:
            raise CheckpointError(f"archive lacks {self.root + name}") from None
        if info.compress_type == zipfile.ZIP_STORED and self.buf is not None:
            head = info.header_offset
            sig, = struct.unpack_from("<I", self.buf, head)
            n_name, n_extra = struct.unpack_from("<HH", self.buf, head + 26)
            start = head + 30 + n_name + n_extra
            if sig == 0x04034B50 and start + info.file_size <= len(self.buf):
                return np.frombuffer(self.buf, np.uint8, info.file_size, start)
        return np.frombuffer(self.zf.read(info), np.uint8)


def _zip(src, stack: contextlib.ExitStack, name: str | None
         ) -> tuple[zipfile.ZipFile, object, str]:
    """(zip, buffer for zero-copy reads or None, name for messages)."""
    if isinstance(src, (bytes, bytearray, memoryview)):
        buf, name = src, name or "data"
        f = io.BytesIO(src)  # shares a bytes object instead of copying it
    else:
        path = Path(src)
        name = name or str(path)
        if not path.exists():
            raise CheckpointError(f"no such file: {path}")
        if path.is_dir():
            raise CheckpointError(f"{path} is a folder, not a checkpoint file")
        try:
            f = stack.enter_context(open(path, "rb"))
        except OSError as e:
            raise CheckpointError(f"cannot read {path}: {e.strerror or e}") from None
        try:
            # not closed explicitly: numpy views into it live until the unpickler is freed
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except (ValueError, OSError):  # an empty file, or no mmap on this file system
            buf = None
    try:
        return stack.enter_context(zipfile.ZipFile(f)), buf, name
    except zipfile.BadZipFile:
        f.seek(0)
        hint = ""
        if f.read(1) == b"\x80":  # a bare pickle: torch.save's legacy (pre-1.6) format
            hint = (" (it is the legacy torch.save format: re-save it with "
                    "torch.save(torch.load(f), f) from torch >= 1.6)")
        raise CheckpointError(f"{name} is not a torch zip archive{hint}") from None


def load_torch(src: str | Path | bytes, *, name: str | None = None,
               narrowed: list[mx.array] | None = None) -> object:
    """The object a torch.save file holds, with every tensor as an mx.array.

    `src` is a path or the file's bytes (`name` labels errors). Containers come back as dict,
    OrderedDict, list and tuple; bfloat16 stays bfloat16, float64 becomes float32 (the
    tensors it concerns are appended to `narrowed` when given) and strided or offset
    views (a transpose, a slice, tensors sharing one storage) come back as the
    tensor torch would show. Raises CheckpointError for anything else.
    """
    with contextlib.ExitStack() as stack:
        zf, buf, name = _zip(src, stack, name)
        pkls = [n for n in zf.namelist() if n == "data.pkl" or n.endswith("/data.pkl")]
        if not pkls:
            raise CheckpointError(f"{name} is a zip archive but not a torch.save file "
                                  "(no data.pkl)")
        pkl = min(pkls, key=len)  # the top-level one, not a nested archive's
        root = pkl[: -len("data.pkl")]
        unpickler = _Unpickler(zf.read(pkl), _Archive(zf, buf, root))
        try:
            obj = unpickler.load()
        except CheckpointError as e:
            raise CheckpointError(f"cannot read {name}: {e}") from None
        except (pickle.UnpicklingError, AttributeError, EOFError, ImportError, IndexError,
                KeyError, TypeError, ValueError, struct.error, zipfile.BadZipFile) as e:
            raise CheckpointError(f"cannot read {name}: {e}") from None
        if narrowed is not None:
            narrowed.extend(unpickler.narrowed)
        return obj


def _walk(obj, prefix: str) -> Iterator[tuple[str, object]]:
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _walk(v, f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from _walk(v, f"{prefix}.{i}" if prefix else str(i))
    else:
        yield prefix, obj


def flatten_tensors(obj, prefix: str = "") -> dict[str, mx.array]:
    """Every tensor in nested dicts/lists/tuples under a dotted name.

    `{"a": {"b": t}, "c": [t0, t1]}` -> `{"a.b": t, "c.0": t0, "c.1": t1}`; a
    bare tensor gives `{prefix: t}` (so `{"": t}` without a prefix). Leaves
    that are not tensors (ints, strings, None) are skipped; two tensors that
    flatten to one name raise CheckpointError.
    """
    out: dict[str, mx.array] = {}
    for name, v in _walk(obj, prefix):
        if isinstance(v, mx.array):
            if name in out:
                raise CheckpointError(f"two tensors flatten to the same name {name!r}")
            out[name] = v
    return out


def non_tensor_leaves(obj) -> list[str]:
    """Dotted names of the leaves `flatten_tensors` skips."""
    return [n for n, v in _walk(obj, "") if not isinstance(v, mx.array)]


__all__ = ["flatten_tensors", "load_torch", "non_tensor_leaves"]
