"""Silero's ONNX files -> its 16 kHz weights, with neither onnx nor onnxruntime.

An ONNX file is a protobuf `ModelProto`; the weights are float32 `TensorProto`s, stored as
graph initializers (`silero_vad_16k_op15.onnx`: `model.encoder.0.reparam_conv.weight`, ...) or
as `Constant` nodes inside the `If` subgraph that runs at 16 kHz (`silero_vad.onnx`:
`If_0_then_branch__Inline_0__encoder.0...`). We walk the protobuf wire format (varints and
length-delimited fields only), collect every float tensor with its name, group them by the
prefix before `stft.forward_basis_buffer`, and keep the group whose STFT basis has 256 taps
(the 16 kHz network; the 8 kHz one has 128). Names come out in Silero's safetensors layout.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ...errors import CheckpointError
from ...text.protobuf import fields as _fields
from ...text.protobuf import varint as _varint

# protobuf field numbers (onnx.proto3)
_MODEL_GRAPH = 7
_GRAPH_NODE, _GRAPH_INIT = 1, 5
_NODE_OUTPUT, _NODE_ATTR = 2, 5
_ATTR_T, _ATTR_G, _ATTR_GRAPHS = 5, 6, 11
_T_DIMS, _T_TYPE, _T_FLOATS, _T_NAME, _T_RAW = 1, 2, 4, 8, 9
_FLOAT = 1

_NAMES = {  # Silero's module names -> its safetensors names
    "stft.forward_basis_buffer": "stft_conv.weight",
    **{f"encoder.{i}.reparam_conv.{p}": f"conv{i + 1}.{p}" for i in range(4)
       for p in ("weight", "bias")},
    **{f"decoder.rnn.{p}": f"lstm_cell.{p}"
       for p in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")},
    "decoder.decoder.2.weight": "final_conv.weight",
    "decoder.decoder.2.bias": "final_conv.bias",
}


def _tensor(buf: memoryview, name: str) -> tuple[str, np.ndarray | None]:
    dims, dtype, raw, floats = [], None, None, None
    for field, wire, v in _fields(buf):
        if field == _T_DIMS:
            if wire == 2:  # packed
                j = 0
                while j < len(v):
                    d, j = _varint(v, j)
                    dims.append(d)
            else:
                dims.append(v)
        elif field == _T_TYPE:
            dtype = v
        elif field == _T_NAME and not name:
            name = bytes(v).decode()
        elif field == _T_RAW:
            raw = v
        elif field == _T_FLOATS and wire == 2:
            floats = v
    if dtype != _FLOAT:
        return name, None
    data = raw if raw is not None else floats
    if data is None:
        return name, None
    return name, np.frombuffer(bytes(data), dtype="<f4").reshape(dims)


def _walk(graph: memoryview, out: dict[str, np.ndarray]) -> None:
    for field, _, v in _fields(graph):
        if field == _GRAPH_INIT:
            name, arr = _tensor(v, "")
            if arr is not None:
                out[name] = arr
        elif field == _GRAPH_NODE:
            outputs = [bytes(x).decode() for f, _, x in _fields(v) if f == _NODE_OUTPUT]
            for f, _, attr in _fields(v):
                if f != _NODE_ATTR:
                    continue
                for af, _, av in _fields(attr):
                    if af == _ATTR_T:  # a Constant node: the tensor is named by its output
                        name, arr = _tensor(av, outputs[0] if outputs else "")
                        if arr is not None:
                            out[name] = arr
                    elif af in (_ATTR_G, _ATTR_GRAPHS):
                        _walk(av, out)


def read_onnx(path: str | Path) -> dict[str, np.ndarray]:
    """The 16 kHz weights of a Silero VAD ONNX file, under Silero's safetensors names."""
    try:
        data = memoryview(Path(path).read_bytes())
        graphs = [v for f, w, v in _fields(data) if f == _MODEL_GRAPH and w == 2]
        if not graphs:
            raise ValueError("no graph")
        found: dict[str, np.ndarray] = {}
        _walk(graphs[0], found)
    except (OSError, ValueError, IndexError, UnicodeDecodeError) as e:
        raise CheckpointError(f"cannot read ONNX file {path}: {e}") from None
    key = "stft.forward_basis_buffer"
    prefixes = [n[: -len(key)] for n in found if n.endswith(key)]
    groups = {p: {theirs: found[p + ours] for ours, theirs in _NAMES.items() if p + ours in found}
              for p in prefixes}
    for group in groups.values():
        basis = group.get("stft_conv.weight")
        if basis is not None and basis.shape[-1] == 256:
            missing = sorted(set(_NAMES.values()) - set(group))
            if missing:
                raise CheckpointError(f"{path}: the 16 kHz network lacks {missing[0]!r}")
            return group
    if groups:
        raise CheckpointError(f"{path} holds no 16 kHz Silero VAD network (only 8 kHz)")
    raise CheckpointError(f"{path} is not a Silero VAD ONNX file (no stft.forward_basis_buffer)")
