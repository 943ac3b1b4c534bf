"""Voxtral-4B-TTS in MLX: Mistral backbone, flow-matching acoustic head, codec.

Quirks worth knowing before reading the code:
- Backbone: 26-layer Mistral, GQA, interleaved ("traditional") RoPE theta 1e6 on
  the raw Mistral weights; the heads read the final-normed hidden state.
- Prompt: voice rows replace the [AUDIO] placeholder embeddings, in order.
- Per frame: semantic code = masked argmax of a linear head on h (EMPTY and the
  padding rows masked, END=1 allowed); 36 acoustic values from 7 Euler steps of
  a 3-token bidirectional transformer [x, time, h] with CFG 1.2 / -0.2 (cond and
  uncond as one batch of 2B for B frames; uncond = zero LLM token), then FSQ to 21 levels.
  Only token 0's output is read, so the last layer computes queries, attention
  output and FFN for token 0 alone (exact; ~20% fewer flow FLOPs at full size).
  Every code carries +2 (0 = EMPTY, 1 = END).
- The next backbone input is the sum of the 37 code embeddings (no token embedding).
- Time embedding: cos first, then sin.
- Checkpoint keys (`remap`, `check_keys`; strict, torch-free, mlx-lm's `sanitize` beside
  the model): Mistral `consolidated.safetensors` or mlx-audio / mlx-community
  `model*.safetensors` (`language_model.model.model.*`), quantized or not. Codec conv
  weights are stored weight-normed (`parametrizations.weight.original0` = g, `original1` = v,
  torch layout); they are folded, W = g * v / ||v|| (norm over every axis but 0), kept in
  fp32 (rounding the folded product back to bf16 costs ~1e-3), and moved to MLX layout
  (O, K, I).
"""

from __future__ import annotations

import math
import re

import mlx.core as mx
import mlx.nn as nn

from ...errors import CheckpointError
from ...nn import HF_BLOCK_NAMES, Block, KVCache, heads, param_name
from ..loading import raise_missing
from .codec import Codec
from .config import N_SPECIAL, AcousticConfig, VoxtralTTSConfig


def time_embedding(t: float, dim: int) -> mx.array:
    """(dim,) fp32 sinusoid of t, cos first."""
    half = dim // 2
    inv_freq = mx.exp(-math.log(10000.0) * mx.arange(half, dtype=mx.float32) / half)
    e = t * inv_freq
    return mx.concatenate([mx.cos(e), mx.sin(e)])


def inv_freq_formula(dim: int) -> mx.array:
    half = dim // 2
    return mx.exp(-math.log(10000.0) * mx.arange(half, dtype=mx.float32) / half)


def _first_token_block(layer: Block, seq: mx.array) -> mx.array:
    """`layer(seq)[:, 0]` computing only what token 0 needs (keys/values of all tokens)."""
    at, B, L = layer.attention, seq.shape[0], seq.shape[1]
    x = layer.attention_norm(seq)
    q = heads(at.wq(x[:, :1]), B, 1, at.n_heads)
    k = heads(at.wk(x), B, L, at.n_kv_heads)
    v = heads(at.wv(x), B, L, at.n_kv_heads)
    o = mx.fast.scaled_dot_product_attention(q, k, v, scale=at.scale)
    h = seq[:, 0] + at.wo(o.reshape(B, -1))
    return h + layer.feed_forward(layer.ffn_norm(h))


class FlowHead(nn.Module):
    """`acoustic_transformer.*`: semantic head and the flow-matching velocity model."""

    def __init__(self, a: AcousticConfig, llm_dim: int, n_acoustic: int, semantic_rows: int,
                 semantic_size: int, levels: int):
        super().__init__()
        self.config = a
        self.semantic_size, self.levels = semantic_size, levels
        self.input_projection = nn.Linear(n_acoustic, a.dim, bias=False)
        self.llm_projection = nn.Linear(llm_dim, a.dim, bias=False)
        self.time_projection = nn.Linear(a.dim, a.dim, bias=False)
        self.layers = [Block(a.dim, a.n_heads, a.n_kv_heads, a.head_dim, a.hidden_dim, None,
                             a.norm_eps) for _ in range(a.n_layers)]
        self.norm = nn.RMSNorm(a.dim, eps=a.norm_eps)
        self.semantic_codebook_output = nn.Linear(llm_dim, semantic_rows, bias=False)
        self.acoustic_codebook_output = nn.Linear(a.dim, n_acoustic, bias=False)

    def timesteps(self) -> list[float]:
        n = self.config.n_steps
        return [i / n for i in range(n + 1)]

    def time_table(self) -> mx.array:
        """(n_steps, dim) projected time embeddings, the same for every frame."""
        ts = self.timesteps()[:-1]
        temb = mx.stack([time_embedding(t, self.config.dim) for t in ts])
        return self.time_projection(temb)

    def semantic(self, h: mx.array) -> mx.array:
        """(B, llm_dim) -> (B,) int32 code in the +2 space (1 = END)."""
        logits = self.semantic_codebook_output(h).astype(mx.float32)
        idx = mx.arange(logits.shape[-1])
        allowed = (idx >= 1) & (idx < self.semantic_size + N_SPECIAL)
        logits = mx.where(allowed, logits, -mx.inf)
        return mx.argmax(logits, axis=-1).astype(mx.int32)

    def _first_projections(self, x: mx.array) -> tuple[mx.array, mx.array, mx.array]:
        """The first layer's queries, keys and values of tokens x (N, dim): (N, heads, 1, hd)."""
        layer = self.layers[0]
        at, n = layer.attention, layer.attention_norm(x)
        N = x.shape[0]
        return (heads(at.wq(n), N, 1, at.n_heads), heads(at.wk(n), N, 1, at.n_kv_heads),
                heads(at.wv(n), N, 1, at.n_kv_heads))

    def velocity(self, x: mx.array, t: mx.array, t_qkv: tuple, c: mx.array,
                 c_qkv: tuple) -> mx.array:
        """x (B, n_ac) -> (2B, n_ac): the conditioned velocities of the B rows, then the
        unconditioned ones, of the sequences [x, t, c] and [x, t, 0].

        t (1, dim) is this step's time token and c (B, dim) the rows' condition, with their
        first-layer projections (`_first_projections`), which do not change over the steps of a
        frame. Token x is the same in both halves, so its projections are made once; the zero
        token's are zeros. What the first layer computes is otherwise exactly `Block`'s."""
        B = x.shape[0]
        layer = self.layers[0]
        at = layer.attention
        a = self.input_projection(x.astype(c.dtype)).astype(c.dtype)
        q0, k0, v0 = self._first_projections(a)

        def both(p0: mx.array, pt: mx.array, pc: mx.array) -> mx.array:
            pt = mx.broadcast_to(pt, p0.shape)
            return mx.concatenate([mx.concatenate([p0, pt, pc], axis=2),
                                   mx.concatenate([p0, pt, mx.zeros_like(pc)], axis=2)])

        k, v = both(k0, t_qkv[1], c_qkv[1]), both(v0, t_qkv[2], c_qkv[2])
        if len(self.layers) == 1:  # only token 0's output is read: its query alone
            q = mx.concatenate([q0, q0])
            o = mx.fast.scaled_dot_product_attention(q, k, v, scale=at.scale)
            h = mx.concatenate([a, a]) + at.wo(o.reshape(2 * B, -1))
            out = h + layer.feed_forward(layer.ffn_norm(h))
        else:
            q = both(q0, t_qkv[0], c_qkv[0])
            o = mx.fast.scaled_dot_product_attention(q, k, v, scale=at.scale)
            t = mx.broadcast_to(t, a.shape)
            seq = mx.concatenate([mx.stack([a, t, c], axis=1),
                                  mx.stack([a, t, mx.zeros_like(c)], axis=1)])
            seq = seq + at.wo(o.transpose(0, 2, 1, 3).reshape(2 * B, 3, -1))
            seq = seq + layer.feed_forward(layer.ffn_norm(seq))
            for later in self.layers[1:-1]:
                seq = later(seq)
            out = _first_token_block(self.layers[-1], seq)
        return self.acoustic_codebook_output(self.norm(out))

    def acoustic(self, h: mx.array, noise: mx.array, t_table: mx.array) -> mx.array:
        """h (B, llm_dim), noise (B, n_ac) -> (B, n_ac) int32 FSQ codes (+2), each row what
        it would be alone (the rows share the matmuls, never a reduction).

        The transformer runs in h's dtype; the Euler state stays fp32.
        """
        a, B = self.config, h.shape[0]
        c = self.llm_projection(h)
        t_table = t_table.astype(c.dtype)
        c_qkv, t_qkv = self._first_projections(c), self._first_projections(t_table)
        x = noise.astype(mx.float32) * a.sigma_max
        ts = self.timesteps()
        for i in range(a.n_steps):
            t_i = tuple(p[i: i + 1] for p in t_qkv)
            v = self.velocity(x, t_table[i: i + 1], t_i, c, c_qkv)
            v = v.astype(mx.float32)
            v = a.cfg_alpha * v[:B] + (1.0 - a.cfg_alpha) * v[B:]
            x = x + v * (ts[i + 1] - ts[i])
        x = mx.clip(x, -1.0, 1.0)
        q = mx.clip(mx.round((x + 1.0) * (self.levels - 1) / 2.0), 0, self.levels - 1)
        return q.astype(mx.int32) + N_SPECIAL


class AudioCodeEmbeddings(nn.Module):
    def __init__(self, rows: int, dim: int):
        super().__init__()
        self.embeddings = nn.Embedding(rows, dim)


class Model(nn.Module):
    """Attribute names follow the Mistral checkpoint (`mm_audio_embeddings.` stripped)."""

    def __init__(self, config: VoxtralTTSConfig):
        super().__init__()
        self.config = config
        b = config.backbone
        self.tok_embeddings = nn.Embedding(b.vocab_size, b.dim)
        self.layers = [Block(b.dim, b.n_heads, b.n_kv_heads, b.head_dim, b.hidden_dim,
                             b.rope_theta, b.norm_eps) for _ in range(b.n_layers)]
        self.norm = nn.RMSNorm(b.dim, eps=b.norm_eps)
        self.audio_codebook_embeddings = AudioCodeEmbeddings(config.audio_table_rows, b.dim)
        self.acoustic_transformer = FlowHead(
            config.acoustic, b.dim, config.n_acoustic_codebook, config.semantic_head_rows,
            config.semantic_codebook_size, config.acoustic_codebook_size)
        self.audio_tokenizer = Codec(config.codec)
        self._offsets = config.code_offsets

    @property
    def dtype(self) -> mx.Dtype:
        return self.norm.weight.dtype  # the embedding may be quantized

    def make_cache(self) -> list[KVCache]:
        return [KVCache() for _ in self.layers]

    def embed_prompt(self, ids: list[int], voice: mx.array, audio_id: int) -> mx.array:
        """(1, L, dim): token embeddings with the voice rows at the [AUDIO] positions."""
        pos = [i for i, t in enumerate(ids) if t == audio_id]
        if len(pos) != voice.shape[0]:
            raise ValueError(f"prompt has {len(pos)} [AUDIO] placeholders but the voice has "
                             f"{voice.shape[0]} rows")
        e = self.tok_embeddings(mx.array(ids))
        if pos:
            e[mx.array(pos)] = voice.astype(e.dtype)
        return e[None]

    def hidden(self, x: mx.array, cache: list[KVCache] | None = None) -> mx.array:
        """(B, L, dim) input embeddings -> (B, L, dim) final-normed hidden states."""
        L = x.shape[1]
        if cache is not None:
            mask = cache[0].make_mask(L)
        else:
            mask = None if L == 1 else "causal"
        for i, layer in enumerate(self.layers):
            x = layer(x, mask, None if cache is None else cache[i])
        return self.norm(x)

    def feedback(self, codes: mx.array) -> mx.array:
        """(B, n_codebooks) codes -> (B, 1, dim) sum of their embeddings."""
        idx = codes + mx.array(self._offsets, dtype=codes.dtype)
        return self.audio_codebook_embeddings.embeddings(idx).sum(axis=1, keepdims=True)

    def decode_frame(self, h: mx.array, noise: mx.array, t_table: mx.array) -> mx.array:
        """h (B, dim) last hidden states, noise (B, n_ac) -> (B, n_codebooks) int32 codes."""
        sem = self.acoustic_transformer.semantic(h)
        ac = self.acoustic_transformer.acoustic(h, noise, t_table)
        return mx.concatenate([sem[:, None], ac], axis=-1)


# Checkpoint keys -> our parameter names (mlx-lm's `sanitize`).
_MISTRAL = [
    (r"^mm_audio_embeddings\.tok_embeddings\.", "tok_embeddings."),
    (r"^mm_audio_embeddings\.audio_codebook_embeddings\.", "audio_codebook_embeddings."),
]
_MLXA = [
    (r"^language_model\.model\.(model\.)?embed_tokens\.", "tok_embeddings."),
    (r"^language_model\.model\.(model\.)?norm\.", "norm."),
    (r"^language_model\.model\.(model\.)?layers\.", "layers."),
    *HF_BLOCK_NAMES,
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
