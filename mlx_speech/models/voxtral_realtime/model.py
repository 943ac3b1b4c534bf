"""Voxtral Mini 4B Realtime in MLX.

Quirks worth knowing before reading the code:
- Weights use Mistral-native names and interleaved ("traditional") RoPE; the
  transformers layout is permuted into it at load.
- Audio: causal conv stem (k=3, strides 1 and 2), a causal sliding-window (750)
  encoder, 4 frames concatenated, then a 2-layer GELU adapter: one embedding
  per 80 ms, *added* to the token embedding at the same decoder position.
- Decoder FFN norms are scaled by 1 + MLP(t_cond), t_cond a sinusoidal
  embedding (cos first) of the delay in tokens; the LM head is tied.
- `state=None` / `caches=None` is offline; streaming passes explicit state and
  gives the same numbers for any chunking (multiples of 8 mel frames).
- `remap` (the end of the file) maps both checkpoint layouts' keys onto ours, strictly and
  without torch: Mistral-native names, transformers' (q/k permuted back to interleaved) and
  the MLX ports' (mlx-audio, voxmlx).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn

from ...errors import CheckpointError
from ...nn import (
    HF_BLOCK_NAMES,
    CausalConv1d,
    ConvCache,
    RingBatch,
    RingRow,
    dense_weight,
    param_name,
    window_mask,
)
from ...nn import Block as _Block
from ..loading import raise_missing
from .config import EncoderConfig, VoxtralRealtimeConfig


class Block(_Block):
    """Mistral block plus the decoder's ada-norm MLP (`ffn_scale` = 1 + ada(t_cond))."""

    def __init__(self, dim, n_heads, n_kv_heads, head_dim, hidden, rope_theta, eps,
                 bias: bool, ada_dim: int = 0):
        super().__init__(dim, n_heads, n_kv_heads, head_dim, hidden, rope_theta, eps, bias)
        if ada_dim:
            self.ada_rms_norm_t_cond = [nn.Linear(dim, ada_dim, bias=False), nn.GELU(),
                                        nn.Linear(ada_dim, dim, bias=False)]


def _mask(L: int, window: int, cache: RingBatch | None):
    if cache is not None:
        return cache.make_mask(L)
    if L <= window:
        return "causal" if L > 1 else None
    pos = mx.arange(L)
    return window_mask(pos, pos, window)


def reanchor(caches: list[RingBatch], L: int, limit: int, head_dim: int,
              theta: float) -> None:
    """Keep every row's RoPE positions below `limit` forever (python ints: no sync)."""
    deltas = caches[0].deltas(L, limit)
    if any(deltas):
        for cache in caches:
            cache.reanchor(deltas, head_dim, traditional=True, base=theta)


@dataclass
class EncoderState:
    """Encoder streaming state: a stream's own (ConvCache tails, RingRow per layer),
    or a batch's (tails stacked on axis 0, RingBatch per layer)."""

    conv: list[ConvCache]
    kv: list[RingRow] | list[RingBatch]

    def arrays(self) -> list[mx.array]:
        return [a for c in (*self.conv, *self.kv) for a in c.state]


class Transformer(nn.Module):
    def __init__(self, c: EncoderConfig):
        super().__init__()
        self.layers = [Block(c.dim, c.n_heads, c.n_heads, c.head_dim, c.hidden_dim,
                             c.rope_theta, c.norm_eps, bias=True)
                       for _ in range(c.n_layers)]
        self.norm = nn.RMSNorm(c.dim, eps=c.norm_eps)


class WhisperEncoder(nn.Module):
    def __init__(self, c: EncoderConfig):
        super().__init__()
        self.config = c
        self.conv_layers = [CausalConv1d(c.n_mels, c.dim, 3, 1),
                            CausalConv1d(c.dim, c.dim, 3, 2)]
        self.transformer = Transformer(c)

    def __call__(self, mel: mx.array, state: EncoderState | None = None) -> mx.array:
        """(B, T, n_mels) mel frames -> (B, T/2, dim) encoder frames."""
        c = self.config
        conv = state.conv if state is not None else [None, None]
        x = nn.gelu(self.conv_layers[0](mel, conv[0]))
        x = nn.gelu(self.conv_layers[1](x, conv[1]))
        L = x.shape[1]
        kv = state.kv if state is not None else [None] * c.n_layers
        if state is not None:
            reanchor(state.kv, L, c.max_position, c.head_dim, c.rope_theta)
        mask = _mask(L, c.sliding_window, kv[0])
        B, _, D = x.shape
        x = x.reshape(B * L, D)  # the layers run on rows (nn.transformer.Block)
        for layer, cache in zip(self.transformer.layers, kv, strict=True):
            x = layer(x, mask, cache, shape=(B, L))
        return self.transformer.norm(x).reshape(B, L, D)


def time_embedding(n_delay: int, dim: int) -> mx.array:
    """Sinusoidal embedding of the delay in tokens, cos first (fp32)."""
    half = dim // 2
    inv_freq = mx.exp(-math.log(10000.0) * mx.arange(half, dtype=mx.float32) / half)
    e = n_delay * inv_freq
    return mx.concatenate([mx.cos(e), mx.sin(e)])


class Model(nn.Module):
    """Attribute names follow the Mistral-native checkpoint (prefix stripped)."""

    def __init__(self, config: VoxtralRealtimeConfig):
        super().__init__()
        self.config = config
        e, d = config.encoder, config.decoder
        self.whisper_encoder = WhisperEncoder(e)
        ds = config.audio.downsample
        self.audio_language_projection = [nn.Linear(e.dim * ds, d.dim, bias=False),
                                          nn.GELU(), nn.Linear(d.dim, d.dim, bias=False)]
        self.tok_embeddings = nn.Embedding(d.vocab_size, d.dim)
        self.layers = [Block(d.dim, d.n_heads, d.n_kv_heads, d.head_dim, d.hidden_dim,
                             d.rope_theta, d.norm_eps, bias=False, ada_dim=d.ada_dim)
                       for _ in range(d.n_layers)]
        self.norm = nn.RMSNorm(d.dim, eps=d.norm_eps)

    @property
    def dtype(self) -> mx.Dtype:
        return self.norm.weight.dtype  # the embedding may be quantized

    def make_encoder_state(self, max_chunk_frames: int,
                           kv_bits: int | None = None) -> EncoderState:
        e = self.config.encoder
        return EncoderState([ConvCache(), ConvCache()],
                            [RingRow(e.sliding_window, max_chunk_frames, kv_bits=kv_bits)
                             for _ in range(e.n_layers)])

    def make_decoder_cache(self, max_chunk: int, kv_bits: int | None = None) -> list[RingRow]:
        """One stream's decoder caches; `RingBatch.gather` stacks streams for a step.
        `kv_bits=8` stores keys and values in 8 bits (`nn.cache.pack8`)."""
        d = self.config.decoder
        # L > 1 only for the prompt, at position 0: when the window holds it, the ring is the
        # window (a full ring's decode step then sees every slot: no mask, the fused kernels)
        chunk = 1 if max_chunk <= d.sliding_window else max_chunk
        return [RingRow(d.sliding_window, chunk, kv_bits=kv_bits) for _ in range(d.n_layers)]

    def ffn_scales(self, n_delay: int) -> list[mx.array]:
        """Per-layer 1 + ada(t_cond), constant for a session."""
        t = time_embedding(n_delay, self.config.decoder.dim)
        out = []
        for layer in self.layers:
            down, _, up = layer.ada_rms_norm_t_cond
            h = nn.gelu(t[None] @ dense_weight(down).astype(mx.float32).T)
            s = h @ dense_weight(up).astype(mx.float32).T
            out.append((1.0 + s).astype(self.dtype))
        return out

    def embed_audio(self, mel: mx.array, state: EncoderState | None = None) -> mx.array:
        """(B, 8n, n_mels) mel frames -> (B, n, dim) audio embeddings."""
        x = self.whisper_encoder(mel.astype(self.dtype), state)
        B, T, D = x.shape
        ds = self.config.audio.downsample
        x = x.reshape(B, T // ds, D * ds)
        p0, act, p2 = self.audio_language_projection
        return p2(act(p0(x)))

    def hidden(self, tokens: mx.array, audio: mx.array, ffn_scales: list[mx.array],
               caches: list[RingBatch] | None = None) -> mx.array:
        """Decoder: (B, L) tokens + (B, L, dim) audio embeddings -> (B, L, dim) normed."""
        d = self.config.decoder
        h = self.tok_embeddings(tokens) + audio
        L = h.shape[1]
        if caches is not None:
            reanchor(caches, L, d.max_position, d.head_dim, d.rope_theta)
        else:
            caches = [None] * d.n_layers
        mask = _mask(L, d.sliding_window, caches[0])
        B, _, D = h.shape
        h = h.reshape(B * L, D)  # the layers run on rows (nn.transformer.Block)
        for layer, cache, s in zip(self.layers, caches, ffn_scales, strict=True):
            h = layer(h, mask, cache, s, shape=(B, L))
        return self.norm(h).reshape(B, L, D)

    def logits(self, h: mx.array) -> mx.array:
        return self.tok_embeddings.as_linear(h)  # tied head

    def __call__(self, tokens: mx.array, audio: mx.array, ffn_scales: list[mx.array],
                 caches: list[RingBatch] | None = None) -> mx.array:
        """(B, L, vocab) logits for every position (teacher forcing, tests)."""
        return self.logits(self.hidden(tokens, audio, ffn_scales, caches))


# -- checkpoint keys (both layouts) -> ours ----------------------------------------------------

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
    *HF_BLOCK_NAMES,
    (r"\.self_attn_layer_norm\.", ".attention_norm."),
    (r"\.final_layer_norm\.", ".ffn_norm."),
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
        if param_name(name) not in expected:
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
