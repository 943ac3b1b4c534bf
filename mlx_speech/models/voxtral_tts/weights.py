"""Checkpoint keys -> our parameter names for Voxtral TTS (strict, torch-free).

Two layouts: Mistral `consolidated.safetensors` and mlx-audio / mlx-community
`model*.safetensors` (`language_model.model.model.*`), quantized or not (`.scales` /
`.biases` beside a quantized `.weight`). Codec conv weights are
stored weight-normed (`parametrizations.weight.original0` = g, `original1` = v,
torch layout); they are folded here, W = g * v / ||v|| (norm over every axis but
0), kept in fp32 (rounding the folded product back to bf16 costs ~1e-3), and
moved to MLX layout (O, K, I).
"""

from __future__ import annotations

import re

import mlx.core as mx

from ...errors import CheckpointError
from ...nn.quant import param_name
from ..loading import raise_missing
from .config import VoxtralTTSConfig
from .model import inv_freq_formula

_MISTRAL = [
    (r"^mm_audio_embeddings\.tok_embeddings\.", "tok_embeddings."),
    (r"^mm_audio_embeddings\.audio_codebook_embeddings\.", "audio_codebook_embeddings."),
]
_MLXA = [
    (r"^language_model\.model\.(model\.)?embed_tokens\.", "tok_embeddings."),
    (r"^language_model\.model\.(model\.)?norm\.", "norm."),
    (r"^language_model\.model\.(model\.)?layers\.", "layers."),
    (r"\.self_attn\.q_proj\.", ".attention.wq."),
    (r"\.self_attn\.k_proj\.", ".attention.wk."),
    (r"\.self_attn\.v_proj\.", ".attention.wv."),
    (r"\.self_attn\.o_proj\.", ".attention.wo."),
    (r"\.mlp\.gate_proj\.", ".feed_forward.w1."),
    (r"\.mlp\.down_proj\.", ".feed_forward.w2."),
    (r"\.mlp\.up_proj\.", ".feed_forward.w3."),
    (r"\.input_layernorm\.", ".attention_norm."),
    (r"\.post_attention_layernorm\.", ".ffn_norm."),
]
_DROP = re.compile(r"^(output\.weight|language_model\.(model\.)?lm_head\.weight)$")
_INV_FREQ = re.compile(r"^acoustic_transformer\.(_)?time_embedding\.inv_freq$")
_WN = re.compile(r"^(audio_tokenizer\..*\.conv)\.parametrizations\.weight\.original([01])$")
_STAGE = re.compile(r"^audio_tokenizer\.decoder_blocks\.(\d+)\.conv$")


def _rename(key: str) -> str:
    rules = _MLXA if key.startswith("language_model.") else _MISTRAL
    for pat, rep in rules:
        key = re.sub(pat, rep, key)
    return key


def _fold(g: mx.array, v: mx.array, transpose: bool) -> mx.array:
    v32 = v.astype(mx.float32)
    norm = mx.sqrt((v32 * v32).sum(axis=tuple(range(1, v.ndim)), keepdims=True))
    w = g.astype(mx.float32) * v32 / norm
    return w.transpose(1, 2, 0) if transpose else w.transpose(0, 2, 1)  # kept in fp32


def remap(weights: dict[str, mx.array], config: VoxtralTTSConfig
          ) -> tuple[dict[str, mx.array], dict[str, str]]:
    """Checkpoint tensors -> our names, and our name -> checkpoint key (for errors)."""
    out: dict[str, mx.array] = {}
    origin: dict[str, str] = {}
    wn: dict[str, dict[str, mx.array]] = {}
    for key, w in weights.items():
        if _DROP.match(key):
            continue  # LM head: not used for speech
        if _INV_FREQ.match(key):
            ref = inv_freq_formula(config.acoustic.dim)
            if w.shape != ref.shape or not mx.allclose(w.astype(mx.float32), ref,
                                                       rtol=1e-3, atol=1e-6).item():
                raise CheckpointError(f"{key} differs from exp(-ln(1e4) j / {ref.size})")
            continue
        if m := _WN.match(key):
            wn.setdefault(m.group(1), {})[m.group(2)] = w
            continue
        name = _rename(key)
        out[name], origin[name] = w, key
    for conv, parts in wn.items():
        if set(parts) != {"0", "1"}:
            raise CheckpointError(f"{conv}: weight norm needs both original0 and original1")
        m = _STAGE.match(conv)
        transpose = False
        if m and int(m.group(1)) % 2 == 0:
            stage = int(m.group(1)) // 2
            transpose = stage < len(config.codec.strides) and config.codec.strides[stage] > 1
        out[conv + ".weight"] = _fold(parts["0"], parts["1"], transpose)
        origin[conv + ".weight"] = conv + ".parametrizations.weight.original1"
    return out, origin


def check_keys(weights: dict[str, mx.array], origin: dict[str, str], expected: set[str]) -> None:
    """Every checkpoint key maps to a parameter and every parameter is present."""
    for k in weights:
        if param_name(k) not in expected:
            raise CheckpointError(f"unexpected checkpoint key {origin.get(k, k)!r}"
                                  f" (mapped to {k!r})")
    raise_missing(expected, weights)
