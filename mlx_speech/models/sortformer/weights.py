"""Checkpoint key mapping (strict, torch-free): NeMo's state dict and mlx-audio's MLX export ->
our parameters (mlx-audio's module names, MLX conv layouts, 1x1 convs as Linears).

Dropped on purpose, and only these: NeMo's `preprocessor.*` buffers (the mel filterbank and
window, which `NemoLogMel` computes), BatchNorm's `num_batches_tracked`, and mlx-audio's
`tf_encoder.embed_positions.weight` (a sinusoid table NeMo's transformer encoder does not have).
Any other unknown key, or a missing one, is an error naming it.
"""

from __future__ import annotations

import re

import mlx.core as mx

from ...errors import CheckpointError
from ...nn import param_name
from ..loading import raise_missing
from ..nemo import CONFORMER_RENAMES, renamed

_SKIP = re.compile(r"^preprocessor\.|\.num_batches_tracked$|^tf_encoder\.embed_positions\.")
_POINTWISE = re.compile(r"(subsampling\.layers_[36]|conv\.pointwise_conv[12])\.weight$")
_RENAMES = [
    (r"^encoder\.pre_encode\.conv\.(\d+)\.", r"fc_encoder.subsampling.layers_\1."),
    (r"^encoder\.pre_encode\.out\.", "fc_encoder.subsampling.linear."),
    (r"^encoder\.layers\.", "fc_encoder.layers."),
    *CONFORMER_RENAMES,
    (r"^transformer_encoder\.", "tf_encoder."),
    (r"\.first_sub_layer\.query_net\.", ".self_attn.q_proj."),
    (r"\.first_sub_layer\.key_net\.", ".self_attn.k_proj."),
    (r"\.first_sub_layer\.value_net\.", ".self_attn.v_proj."),
    (r"\.first_sub_layer\.out_projection\.", ".self_attn.out_proj."),
    (r"\.second_sub_layer\.dense_in\.", ".fc1."),
    (r"\.second_sub_layer\.dense_out\.", ".fc2."),
    (r"\.layer_norm_1\.", ".self_attn_layer_norm."),
    (r"\.layer_norm_2\.", ".final_layer_norm."),
]


def is_nemo(keys) -> bool:
    """A NeMo state dict (as read from a .nemo archive) rather than an MLX export."""
    return any(k.startswith(("encoder.", "transformer_encoder.")) for k in keys)


def nemo_name(key: str) -> str:
    return renamed(key, _RENAMES)


def remap(weights: dict[str, mx.array], expected: set[str]) -> dict[str, mx.array]:
    """NeMo (torch layouts) or mlx-audio (MLX layouts) tensors -> our parameters.

    Raises CheckpointError naming the first unknown or missing key."""
    torch_layout = is_nemo(weights)
    out: dict[str, mx.array] = {}
    for key, w in weights.items():
        if _SKIP.search(key):
            continue
        name = nemo_name(key) if torch_layout else key
        if param_name(name) not in expected:
            raise CheckpointError(f"unexpected checkpoint key {key!r}")
        if _POINTWISE.search(name):
            w = w.reshape(w.shape[0], -1)  # 1x1 convs: (O, I, 1[, 1]) or (O, 1[, 1], I)
        elif torch_layout and w.ndim == 4:
            w = w.transpose(0, 2, 3, 1)  # Conv2d (O, I, H, W) -> (O, H, W, I)
        elif torch_layout and w.ndim == 3:
            w = w.swapaxes(1, 2)  # depthwise Conv1d (O, 1, K) -> (O, K, 1)
        out[name] = w
    raise_missing(expected, out)
    return out
