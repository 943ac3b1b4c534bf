"""Checkpoint key mapping (strict, torch-free): NeMo names -> transformers names ->
our parameters, which use the transformers names with MLX conv layouts."""

from __future__ import annotations

import re

import mlx.core as mx

from ...errors import CheckpointError
from ...nn.conformer import NEMO_CONFORMER_RENAMES
from ...nn.quant import param_name
from ..asr import raise_missing

_CONV2D = re.compile(r"^encoder\.subsampling\.(conv_in|layers\.\d+\.depthwise_conv)\.weight$")
_POINTWISE2D = re.compile(r"^encoder\.subsampling\.layers\.\d+\.pointwise_conv\.weight$")
_POINTWISE1D = re.compile(r"^encoder\.layers\.\d+\.conv\.pointwise_conv[12]\.weight$")
_DEPTHWISE1D = re.compile(r"^encoder\.layers\.\d+\.conv\.depthwise_conv\.weight$")
# transformers' first Nemotron 3.5 port kept NeMo's prompt_kernel.0/2 names
_PROMPT_KERNEL = re.compile(r"^prompt_kernel\.([02])\.")


def remap(weights: dict[str, mx.array], expected: set[str]) -> dict[str, mx.array]:
    """transformers tensors -> our parameters (same names, MLX conv layouts).

    Raises CheckpointError naming the first unknown or missing key.
    """
    out: dict[str, mx.array] = {}
    for key, w in weights.items():
        name = key[len("model."):] if key.startswith("model.") else key
        name = _PROMPT_KERNEL.sub(lambda m: f"prompt_projector.linear_{int(m[1]) // 2 + 1}.", name)
        if param_name(name) not in expected:
            raise CheckpointError(f"unexpected checkpoint key {key!r}")
        if _CONV2D.match(name):
            w = w.transpose(0, 2, 3, 1)  # torch (O, I, H, W) -> mlx (O, H, W, I)
        elif _POINTWISE2D.match(name) or _POINTWISE1D.match(name):
            w = w.reshape(w.shape[0], w.shape[1])  # 1x1 convs are Linears here
        elif _DEPTHWISE1D.match(name):
            w = w.swapaxes(1, 2)  # torch (O, I, K) -> mlx (O, K, I)
        out[name] = w
    raise_missing(expected, out)
    return out


_MLX_LSTM = re.compile(r"^decoder\.prediction\.dec_rnn\.lstm\.(\d+)\.(Wx|Wh|bias)$")


def is_nemo_mlx(keys) -> bool:
    """NeMo-named MLX weights (mlx-audio's nemotron_asr and parakeet-style exports)."""
    return any(k.startswith(("encoder.pre_encode.", "decoder.prediction.")) for k in keys)


def remap_nemo_mlx(weights: dict[str, mx.array], expected: set[str]) -> dict[str, mx.array]:
    """NeMo-named MLX tensors -> our parameters. Convs are already in MLX layouts (1x1 convs
    are squeezed to Linears), and each LSTM layer is one `nn.LSTM` (Wx, Wh and the sum of the
    two biases: it goes to bias_ih, bias_hh is zero). Quantized modules keep `.scales` /
    `.biases`. Raises CheckpointError naming the first unknown or missing key."""
    out: dict[str, mx.array] = {}
    for key, w in weights.items():
        if key.startswith("preprocessor."):  # mlx-audio's mel filterbank buffers
            continue
        if m := _MLX_LSTM.match(key):
            layer, part = m.group(1), m.group(2)
            if part == "bias":
                out[f"decoder.lstm.bias_ih_l{layer}"] = w
                out[f"decoder.lstm.bias_hh_l{layer}"] = mx.zeros_like(w)
                continue
            name = f"decoder.lstm.weight_{'ih' if part == 'Wx' else 'hh'}_l{layer}"
        else:
            name = hf_name(key)
        if name is None or param_name(name) not in expected:
            raise CheckpointError(f"unexpected checkpoint key {key!r}")
        if (_POINTWISE2D.match(name) or _POINTWISE1D.match(name)) and w.ndim > 2:
            w = w.reshape(w.shape[0], w.shape[-1])  # (O, 1[, 1], I) -> (O, I)
        out[name] = w
    raise_missing(expected, out)
    return out


# NeMo (.nemo state dict) -> transformers, after the HF converter's table
_RENAMES = [
    (r"^encoder\.pre_encode\.out\.", "encoder.subsampling.linear."),
    *NEMO_CONFORMER_RENAMES,
    (r"^decoder\.prediction\.embed\.", "decoder.embedding."),
    (r"^decoder\.prediction\.dec_rnn\.lstm\.", "decoder.lstm."),
    (r"^joint\.enc\.", "encoder_projector."),
    (r"^joint\.pred\.", "decoder.decoder_projector."),
    (r"^joint\.joint_net\.[12]\.", "joint.head."),  # .1 when trained without dropout
    (r"^prompt_kernel\.0\.", "prompt_projector.linear_1."),  # Nemotron 3.5's language prompt
    (r"^prompt_kernel\.2\.", "prompt_projector.linear_2."),
]
_PRE_ENCODE = re.compile(r"^encoder\.pre_encode\.conv\.(\d+)\.(weight|bias)$")


def hf_name(key: str) -> str | None:
    """NeMo state-dict key -> transformers key (None: not a model weight)."""
    if key.startswith("preprocessor."):
        return None
    m = _PRE_ENCODE.match(key)
    if m:  # Sequential: conv 0, ReLU 1, then (depthwise, pointwise, ReLU) per stage
        n, leaf = int(m.group(1)), m.group(2)
        if n == 0:
            return f"encoder.subsampling.conv_in.{leaf}"
        i, kind = divmod(n - 2, 3)
        if kind == 2 or n < 2:
            raise CheckpointError(f"unexpected checkpoint key {key!r}")
        part = "depthwise_conv" if kind == 0 else "pointwise_conv"
        return f"encoder.subsampling.layers.{i}.{part}.{leaf}"
    for pat, rep in _RENAMES:
        key = re.sub(pat, rep, key)
    return key
