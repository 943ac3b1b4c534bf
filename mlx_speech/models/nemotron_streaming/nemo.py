"""Read a NeMo `.nemo` archive without torch and without running pickled code.

A `.nemo` file is a tar (plain or gzip) holding `model_config.yaml`,
`model_weights.ckpt` (a torch.save zip of a plain state dict) and tokenizer
artifacts named `<uuid>_tokenizer.model`. The state dict's pickle is read by an
unpickler that only knows the handful of globals torch.save writes for tensors;
anything else is rejected. Keys are renamed to the transformers layout, so the
rest of the loader (and `convert_nemo`'s output folder) is the HF path.
"""

from __future__ import annotations

import io
import pickle
import re
import tarfile
import zipfile
from pathlib import Path

import mlx.core as mx
import numpy as np

from ...errors import CheckpointError
from .weights import hf_name

_DTYPES = {  # torch storage class -> numpy dtype (bfloat16 read as raw uint16)
    "FloatStorage": np.float32, "HalfStorage": np.float16, "BFloat16Storage": np.uint16,
    "DoubleStorage": np.float64, "LongStorage": np.int64, "IntStorage": np.int32,
    "ShortStorage": np.int16, "CharStorage": np.int8, "ByteStorage": np.uint8,
    "BoolStorage": np.bool_,
}

class _Storage:
    def __init__(self, kind: str):
        self.kind = kind


def _rebuild_tensor(storage, offset, size, stride, *_):
    flat = storage
    itemsize = flat.dtype.itemsize
    view = np.lib.stride_tricks.as_strided(
        flat[offset:], shape=tuple(size), strides=tuple(s * itemsize for s in stride))
    return np.ascontiguousarray(view)


class _OrderedDict(dict):
    pass


class _SafeUnpickler(pickle.Unpickler):
    """Only tensors, storages and (ordered) dicts: no other global can be built."""

    def __init__(self, data: bytes, zf: zipfile.ZipFile, prefix: str):
        super().__init__(io.BytesIO(data))
        self.zf, self.prefix = zf, prefix
        self.bf16: set[int] = set()

    def find_class(self, module: str, name: str):
        if module == "torch._utils" and name == "_rebuild_tensor_v2":
            return self._rebuild
        if module == "torch" and name in _DTYPES:
            return _Storage(name)
        if module == "collections" and name == "OrderedDict":
            return _OrderedDict
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}")

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and pid and pid[0] == "storage"):
            raise pickle.UnpicklingError(f"unexpected persistent id {pid!r}")
        kind, key = pid[1], pid[2]
        if not isinstance(kind, _Storage):
            raise pickle.UnpicklingError("storage without a known type")
        raw = self.zf.read(f"{self.prefix}data/{key}")
        arr = np.frombuffer(raw, dtype=_DTYPES[kind.kind])
        return (arr, kind.kind == "BFloat16Storage")

    def _rebuild(self, storage, offset, size, stride, *rest):
        arr, is_bf16 = storage
        out = _rebuild_tensor(arr, offset, size, stride)
        if is_bf16:
            self.bf16.add(id(out))
        return out


def read_state_dict(data: bytes) -> dict[str, mx.array]:
    """A torch.save zip archive of a flat name -> tensor dict, as MLX arrays."""
    try:
        zf = zipfile.ZipFile(io.BytesIO(data))
        pkl = next(n for n in zf.namelist() if n.endswith("data.pkl"))
        up = _SafeUnpickler(zf.read(pkl), zf, pkl[: -len("data.pkl")])
        sd = up.load()
    except (zipfile.BadZipFile, StopIteration):
        raise CheckpointError("model_weights.ckpt is not a torch zip archive "
                              "(legacy torch.save format is not supported)") from None
    except (pickle.UnpicklingError, KeyError, ValueError, TypeError, EOFError) as e:
        raise CheckpointError(f"cannot read model_weights.ckpt: {e}") from None
    if "state_dict" in sd and isinstance(sd["state_dict"], dict):
        sd = sd["state_dict"]
    out = {}
    for k, v in sd.items():
        if not isinstance(v, np.ndarray):
            raise CheckpointError(f"model_weights.ckpt entry {k!r} is not a tensor")
        a = mx.array(v)
        out[k] = a.view(mx.bfloat16) if id(v) in up.bf16 else a
    return out


def _member(tar: tarfile.TarFile, pattern: str) -> tarfile.TarInfo | None:
    for m in tar.getmembers():
        if m.isfile() and re.fullmatch(pattern, Path(m.name).name):
            return m
    return None


def read_nemo(path: str | Path) -> tuple[dict, dict[str, mx.array], bytes]:
    """(model_config, transformers-named weights, tokenizer.model bytes)."""
    import yaml

    path = Path(path)
    try:
        with tarfile.open(path, "r:*") as tar:
            cfg_m = _member(tar, r"model_config\.yaml")
            w_m = _member(tar, r"model_weights\.ckpt")
            tok_m = _member(tar, r"(.+_)?tokenizer\.model")
            if cfg_m is None or w_m is None:
                raise CheckpointError(f"{path} lacks model_config.yaml or model_weights.ckpt")
            if tok_m is None:
                raise CheckpointError(f"{path} has no SentencePiece tokenizer.model")
            config = yaml.safe_load(tar.extractfile(cfg_m).read())
            raw = tar.extractfile(w_m).read()
            tok = tar.extractfile(tok_m).read()
    except (tarfile.TarError, OSError, yaml.YAMLError) as e:
        raise CheckpointError(f"cannot read {path}: {e}") from None
    weights = {}
    for k, v in read_state_dict(raw).items():
        name = hf_name(k)
        if name is not None:
            weights[name] = v
    return config, weights, tok


def hf_config(nemo: dict) -> dict:
    """NeMo model_config.yaml -> a transformers `nemotron_asr_streaming` config.json."""
    e = nemo.get("encoder") or {}
    want = {"subsampling": "dw_striding", "causal_downsampling": True,
            "att_context_style": "chunked_limited", "conv_norm_type": "layer_norm",
            "conv_context_size": "causal", "self_attention_model": "rel_pos"}
    for k, v in want.items():
        if k in e and e[k] != v:
            raise CheckpointError(f"unsupported NeMo encoder setting {k}={e[k]!r} (need {v!r})")
    ctx = e.get("att_context_size") or [[70, 13]]
    if not isinstance(ctx[0], (list, tuple)):
        ctx = [ctx]
    d = e.get("d_model", 1024)
    ch = e.get("subsampling_conv_channels", -1)
    dec = nemo.get("decoder") or {}
    pred = dec.get("prednet") or {}
    joint = (nemo.get("joint") or {}).get("jointnet") or {}
    pred_hidden = pred.get("pred_hidden", 640)
    if joint.get("joint_hidden", pred_hidden) != pred_hidden:
        raise CheckpointError("joint_hidden != pred_hidden is not supported")
    n_vocab = dec.get("vocab_size") or len((nemo.get("joint") or {}).get("vocabulary", []))
    use_bias = e.get("use_bias", True)
    return {
        "model_type": "nemotron_asr_streaming",
        "vocab_size": n_vocab + 1, "blank_token_id": n_vocab,
        "decoder_hidden_size": pred_hidden, "num_decoder_layers": pred.get("pred_rnn_layers", 2),
        "max_symbols_per_step": ((nemo.get("decoding") or {}).get("greedy") or {}).get(
            "max_symbols", 10),
        "hidden_act": "relu",
        "encoder_config": {
            "hidden_size": d, "num_hidden_layers": e.get("n_layers", 24),
            "num_attention_heads": e.get("n_heads", 8),
            "intermediate_size": d * e.get("ff_expansion_factor", 4),
            "attention_bias": use_bias, "convolution_bias": use_bias,
            "conv_kernel_size": e.get("conv_kernel_size", 9),
            "subsampling_factor": e.get("subsampling_factor", 8),
            "subsampling_conv_channels": d if ch in (-1, None) else ch,
            "num_mel_bins": e.get("feat_in", 128),
            "scale_input": e.get("xscaling", True),
            "sliding_window": ctx[0][0] + 1, "default_num_lookahead_tokens": ctx[0][1],
            "max_position_embeddings": e.get("pos_emb_max_len", 5000),
            "hidden_act": "silu",
        },
        "supported_num_lookahead_tokens": [c[1] for c in ctx],
    }


def convert_nemo(path: str | Path, out: str | Path) -> Path:
    """Write a transformers-layout folder (config.json, model.safetensors,
    tokenizer.model) that `load()` reads; tensors keep their torch layouts."""
    import json

    config, weights, tok = read_nemo(path)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(hf_config(config), indent=2))
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "pt"})
    (out / "tokenizer.model").write_bytes(tok)
    return out
