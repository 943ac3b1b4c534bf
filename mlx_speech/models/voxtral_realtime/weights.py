"""Checkpoint key mapping for both Voxtral Realtime layouts (strict, torch-free)."""

from __future__ import annotations

import re

import mlx.core as mx

from ...errors import CheckpointError
from ...nn import quant
from ..loading import raise_missing
from .config import VoxtralRealtimeConfig

_MISTRAL_PREFIXES = ("mm_streams_embeddings.embedding_module.", "mm_whisper_embeddings.")

# transformers names -> ours; the encoder sits under whisper_encoder.transformer.
_HF_RULES = [
    (r"^audio_tower\.embedder\.conv1\.", "whisper_encoder.conv_layers.0.conv."),
    (r"^audio_tower\.embedder\.conv2\.", "whisper_encoder.conv_layers.1.conv."),
    (r"^audio_tower\.norm\.", "whisper_encoder.transformer.norm."),
    (r"^audio_tower\.layers\.", "whisper_encoder.transformer.layers."),
    (r"^multi_modal_projector\.linear_1\.", "audio_language_projection.0."),
    (r"^multi_modal_projector\.linear_2\.", "audio_language_projection.2."),
    (r"^language_model\.(model\.)?embed_tokens\.", "tok_embeddings."),
    (r"^language_model\.(model\.)?norm\.", "norm."),
    (r"^language_model\.(model\.)?layers\.", "layers."),
    (r"\.self_attn\.q_proj\.", ".attention.wq."),
    (r"\.self_attn\.k_proj\.", ".attention.wk."),
    (r"\.self_attn\.v_proj\.", ".attention.wv."),
    (r"\.self_attn\.o_proj\.", ".attention.wo."),
    (r"\.self_attn_layer_norm\.", ".attention_norm."),
    (r"\.final_layer_norm\.", ".ffn_norm."),
    (r"\.input_layernorm\.", ".attention_norm."),
    (r"\.post_attention_layernorm\.", ".ffn_norm."),
    (r"\.mlp\.gate_proj\.", ".feed_forward.w1."),
    (r"\.mlp\.up_proj\.", ".feed_forward.w3."),
    (r"\.mlp\.down_proj\.", ".feed_forward.w2."),
    (r"\.ada_rms_norm\.linear1\.", ".ada_rms_norm_t_cond.0."),
    (r"\.ada_rms_norm\.linear2\.", ".ada_rms_norm_t_cond.2."),
]
_HF_TIED = re.compile(r"^(language_model\.)?lm_head\.weight$")
_CONV = re.compile(r"conv_layers\.\d\.conv\.weight$")
_QK = re.compile(r"(whisper_encoder\.transformer\.)?layers\.\d+\.attention\.w[qk]\."
                 r"(weight|bias|scales|biases)$")

# MLX layouts (weights already in MLX conv layout, possibly quantized) -> ours.
# mlx-audio (mlx-community/...-2602-4bit, -fp16): its Model's module names.
_MLX_AUDIO_RULES = [
    (r"^decoder\.tok_embeddings\.", "tok_embeddings."),
    (r"^decoder\.norm\.", "norm."),
    (r"^decoder\.layers\.", "layers."),
    (r"^encoder\.conv_layers_(\d)_conv\.conv\.", r"whisper_encoder.conv_layers.\1.conv."),
    (r"^encoder\.transformer_layers\.", "whisper_encoder.transformer.layers."),
    (r"^encoder\.transformer_norm\.", "whisper_encoder.transformer.norm."),
    (r"^encoder\.audio_language_projection_(\d)\.", r"audio_language_projection.\1."),
    (r"\.feed_forward_w(\d)\.", r".feed_forward.w\1."),
    (r"\.ada_rms_norm_t_cond\.ada_down\.", ".ada_rms_norm_t_cond.0."),
    (r"\.ada_rms_norm_t_cond\.ada_up\.", ".ada_rms_norm_t_cond.2."),
]
# voxmlx (mlx-community/Voxtral-Mini-4B-Realtime-6bit, ...-8bit-mlx): voxmlx's module names.
_VOXMLX_RULES = [
    (r"^encoder\.conv([12])\.", lambda m: f"whisper_encoder.conv_layers.{int(m[1]) - 1}.conv."),
    (r"^encoder\.layers\.", "whisper_encoder.transformer.layers."),
    (r"^encoder\.norm\.", "whisper_encoder.transformer.norm."),
    (r"^adapter\.w_in\.", "audio_language_projection.0."),
    (r"^adapter\.w_out\.", "audio_language_projection.2."),
    (r"^language_model\.embed_tokens\.", "tok_embeddings."),
    (r"^language_model\.", ""),
    (r"\.attention\.([qkvo])_proj\.", r".attention.w\1."),
    (r"\.attn_norm\.", ".attention_norm."),
    (r"\.mlp\.gate_proj\.", ".feed_forward.w1."),
    (r"\.mlp\.down_proj\.", ".feed_forward.w2."),
    (r"\.mlp\.up_proj\.", ".feed_forward.w3."),
    (r"\.ada_norm\.linear_in\.", ".ada_rms_norm_t_cond.0."),
    (r"\.ada_norm\.linear_out\.", ".ada_rms_norm_t_cond.2."),
]
_MLX_RULES = {"mlx_audio": _MLX_AUDIO_RULES, "voxmlx": _VOXMLX_RULES}


def _to_interleaved(w: mx.array, n_heads: int) -> mx.array:
    """Rows in rotate_half (HF) order -> interleaved (Mistral) order, per head."""
    d = w.shape[0]
    rest = tuple(w.shape[1:])
    w = w.reshape(n_heads, 2, d // n_heads // 2, *rest)
    return w.swapaxes(1, 2).reshape(d, *rest)


def _mistral_key(k: str) -> str:
    for p in _MISTRAL_PREFIXES:
        if k.startswith(p):
            k = k[len(p):]
            break
    # some Voxtral checkpoints drop the inner ".conv." of the conv stem
    return re.sub(r"(whisper_encoder\.conv_layers\.\d)\.(weight|bias)$", r"\1.conv.\2", k)


def _hf_key(k: str) -> str | None:
    if k.startswith("model."):
        k = k[len("model."):]
    if _HF_TIED.match(k):
        return None
    for pat, rep in _HF_RULES:
        k = re.sub(pat, rep, k)
    return k


def _mlx_key(k: str, rules) -> str:
    for pat, rep in rules:
        k = re.sub(pat, rep, k)
    return k


def remap(weights: dict[str, mx.array], config: VoxtralRealtimeConfig,
          expected: set[str]) -> dict[str, mx.array]:
    """Checkpoint tensors -> our parameter names; raises on any unmapped key.

    Quantized modules (`.scales` / `.biases` beside `.weight`) keep their suffixes."""
    out: dict[str, mx.array] = {}
    hf = config.layout == "hf"
    mlx_rules = _MLX_RULES.get(config.layout)
    for key, w in weights.items():
        if mlx_rules is not None:
            name = _mlx_key(key, mlx_rules)
        elif hf:
            name = _hf_key(key)
        else:
            name = None if key == "output.weight" else _mistral_key(key)  # tied head
        if name is None:
            continue
        if quant.param_name(name) not in expected:
            raise CheckpointError(f"unexpected checkpoint key {key!r} (mapped to {name!r})")
        if _CONV.search(name) and mlx_rules is None:
            w = w.swapaxes(1, 2)  # torch (O, I, K) -> mlx (O, K, I)
        if hf and _QK.fullmatch(name):
            enc = name.startswith("whisper_encoder.")
            c = config.encoder if enc else config.decoder
            n = c.n_heads if (enc or ".wq." in name) else c.n_kv_heads
            w = _to_interleaved(w, n)
        out[name] = w
    raise_missing(expected, out)
    return out
