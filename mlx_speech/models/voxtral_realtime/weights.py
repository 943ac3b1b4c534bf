"""Checkpoint key mapping for both Voxtral Realtime layouts (strict, torch-free)."""

from __future__ import annotations

import re

import mlx.core as mx

from ...errors import CheckpointError
from ..asr import raise_missing
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
_QK = re.compile(r"(whisper_encoder\.transformer\.)?layers\.\d+\.attention\.w[qk]\.(weight|bias)$")


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


def remap(weights: dict[str, mx.array], config: VoxtralRealtimeConfig,
          expected: set[str]) -> dict[str, mx.array]:
    """Checkpoint tensors -> our parameter names; raises on any unmapped key."""
    out: dict[str, mx.array] = {}
    hf = config.layout == "hf"
    for key, w in weights.items():
        if hf:
            name = _hf_key(key)
        else:
            name = None if key == "output.weight" else _mistral_key(key)  # tied head
        if name is None:
            continue
        if name not in expected:
            raise CheckpointError(f"unexpected checkpoint key {key!r} (mapped to {name!r})")
        if _CONV.search(name):
            w = w.swapaxes(1, 2)  # torch (O, I, K) -> mlx (O, K, I)
        if hf and _QK.fullmatch(name):
            enc = name.startswith("whisper_encoder.")
            c = config.encoder if enc else config.decoder
            n = c.n_heads if (enc or ".wq." in name) else c.n_kv_heads
            w = _to_interleaved(w, n)
        out[name] = w
    raise_missing(expected, out)
    return out
