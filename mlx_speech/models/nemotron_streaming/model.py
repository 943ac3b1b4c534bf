"""The Nemotron streaming network in MLX: cache-aware FastConformer encoder, the language-ID
prompt (Nemotron 3.5), RNN-T prediction and joint networks, and the full model.

Quirks worth knowing before reading the code:
- Causal dw_striding subsampling x8: three k3/s2 Conv2d over (time, freq), each
  padded (k-1, s-1) on both axes; flattened channel-major (C, F) before a Linear.
- Transformer-XL rel-pos attention with untied per-layer bias_u / bias_v and a
  sinusoidal table over relative distances; no biases in the attention, FFN or
  conv module (config flags); the conv module's norm is a LayerNorm.
- chunked_limited attention: frames form blocks of r+1 (r = right context, one
  value for all layers, chosen by the latency mode); a frame sees its own block
  and the left_context // (r+1) blocks before it. Blocks start at frame 0.
- Streaming is exact from the first chunk (no warm-up): caches start empty and
  grow to left_context frames, the causal convs keep their input tails, and
  subsampled frames wait in `pending` until their block is complete.
- `state=None` is offline; a state makes any mel chunking give the offline frames.
- The prompt (NeMo's `EncDecRNNTBPEModelWithPrompt`): each row's language slot becomes a
  one-hot of `num_prompts` joined to the encoder frames; a two-layer MLP (NeMo
  `prompt_kernel.0/2`, transformers `prompt_projector.linear_1/2`) maps them back to the
  encoder width before the joint's encoder projection. Frame by frame: no state.
- The predictor is Embedding -> 2-layer LSTM (torch gate order i, f, g, o) -> Linear; the
  blank row of the embedding is zero (NeMo blank_as_pad), so feeding blank at stream start
  equals NeMo's zero "start of sequence" input. The joint is relu(enc_proj(f) + dec_proj(g))
  -> Linear; not TDT (no durations).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn

from ...nn import ConformerLayer, ConvCache, rel_positions
from .config import EncoderConfig, NemotronStreamingConfig


class StridedConvCache:
    """Input time steps of a causal strided conv not yet consumed by an output.

    Starts as the offline left padding (k - 1 zero steps); on the final call the
    offline right padding (s - 1 zeros) is appended, so for any chunking the
    outputs equal the offline conv over the whole input.
    """

    def __init__(self):
        self.buf: mx.array | None = None

    def update_and_fetch(self, x: mx.array | None, k: int, s: int,
                         final: bool) -> mx.array | None:
        """New input steps `x` (None: none) -> the input steps of every output now complete,
        or None when there is none (nothing zero-size reaches a kernel)."""
        if self.buf is None:
            if x is None:
                return None
            self.buf = mx.zeros((x.shape[0], k - 1, *x.shape[2:]), x.dtype)
        parts = [self.buf] if x is None else [self.buf, x]
        if final and s > 1:
            b = self.buf
            parts.append(mx.zeros((b.shape[0], s - 1, *b.shape[2:]), b.dtype))
        n_in = sum(a.shape[1] for a in parts)
        n_out = max(0, (n_in - k) // s + 1)
        if not n_out and len(parts) == 1:
            return None
        x = parts[0] if len(parts) == 1 else mx.concatenate(parts, axis=1)
        self.buf = x[:, n_out * s:]  # never empty: k > s keeps k - s steps at least
        return x[:, : (n_out - 1) * s + k] if n_out else None

    @property
    def state(self) -> list[mx.array]:
        return [] if self.buf is None else [self.buf]


class CausalConv2d(nn.Module):
    """Conv2d over (B, T, F, C): causal in time, (k-1, s-1) zero padding in frequency."""

    def __init__(self, in_ch: int, out_ch: int, kernel: int, stride: int, groups: int = 1):
        super().__init__()
        self.weight = mx.zeros((out_ch, kernel, kernel, in_ch // groups))
        self.bias = mx.zeros((out_ch,))
        self.kernel, self.stride, self.groups = kernel, stride, groups

    def __call__(self, x: mx.array | None, cache: StridedConvCache | None,
                 final: bool) -> mx.array | None:
        """None in (no new steps) or out (no complete output): nothing reaches a kernel."""
        k, s = self.kernel, self.stride
        if x is not None:
            x = mx.pad(x, [(0, 0), (0, 0), (k - 1, s - 1), (0, 0)])
        if cache is not None:
            x = cache.update_and_fetch(x, k, s, final)
        elif x is not None:
            x = mx.pad(x, [(0, 0), (k - 1, s - 1), (0, 0), (0, 0)])
            x = x if x.shape[1] >= k else None
        if x is None:
            return None
        return mx.conv2d(x, self.weight, stride=s, groups=self.groups) + self.bias


class SubsamplingLayer(nn.Module):
    def __init__(self, c: EncoderConfig):
        super().__init__()
        ch = c.subsampling_conv_channels
        self.depthwise_conv = CausalConv2d(ch, ch, c.subsampling_conv_kernel_size,
                                           c.subsampling_conv_stride, groups=ch)
        self.pointwise_conv = nn.Linear(ch, ch)  # a 1x1 Conv2d


class Subsampling(nn.Module):
    def __init__(self, c: EncoderConfig):
        super().__init__()
        ch = c.subsampling_conv_channels
        self.conv_in = CausalConv2d(1, ch, c.subsampling_conv_kernel_size,
                                    c.subsampling_conv_stride)
        self.layers = [SubsamplingLayer(c) for _ in range(c.n_subsampling_layers - 1)]
        self.linear = nn.Linear(ch * c.subsampled_freqs, c.hidden_size)

    def __call__(self, mel: mx.array | None, caches: list[StridedConvCache] | None,
                 final: bool) -> mx.array | None:
        """(B, T, n_mels) -> (B, T', hidden): frame t reads mel frames 8t-14 .. 8t.
        None when no frame is complete (a stage with nothing new is not run)."""
        caches = caches or [None] * (1 + len(self.layers))
        x = self.conv_in(None if mel is None else mel[..., None], caches[0], final)
        for layer, cache in zip(self.layers, caches[1:], strict=True):
            if x is None and not final:
                return None
            x = layer.depthwise_conv(None if x is None else nn.relu(x), cache, final)
            x = None if x is None else layer.pointwise_conv(x)
        if x is None:
            return None
        x = nn.relu(x)
        B, T, F, C = x.shape
        return self.linear(x.transpose(0, 1, 3, 2).reshape(B, T, C * F))


class ContextKVCache:
    """Keys/values of the last `size` frames, kept in time order (rel-pos needs it).

    Always `size` frames long: zeros stand in front until `valid` frames are real, and the
    encoder masks them, so the first chunk sees exactly what offline sees while attention
    keeps one key length from the first chunk on (a GPU builds kernels per shape). The copy
    per call is bounded by size + chunk frames.
    """

    def __init__(self, size: int):
        self.size = size
        self.keys: mx.array | None = None
        self.values: mx.array | None = None
        self.valid = 0  # real frames among the last `size`

    @property
    def length(self) -> int:
        """Real (unmasked) frames held."""
        return self.valid

    def update_and_fetch(self, k: mx.array, v: mx.array) -> tuple[mx.array, mx.array]:
        """(B, H, T, dh) new keys/values -> the `size` cached frames and the new ones."""
        if self.keys is None:
            B, H, _, dh = k.shape
            self.keys = mx.zeros((B, H, self.size, dh), k.dtype)
            self.values = mx.zeros((B, H, self.size, v.shape[-1]), v.dtype)
        k = mx.concatenate([self.keys, k], axis=2)
        v = mx.concatenate([self.values, v], axis=2)
        start = k.shape[2] - self.size
        self.keys, self.values = k[:, :, start:], v[:, :, start:]
        self.valid = min(self.size, self.valid + k.shape[2] - self.size)
        return k, v

    @property
    def state(self) -> list[mx.array]:
        return [a for a in (self.keys, self.values) if a is not None]


@dataclass
class EncoderState:
    """Everything a stream carries between encoder calls (python ints need no sync)."""

    right_context: int
    subsampling: list[StridedConvCache]
    kv: list[ContextKVCache]
    conv: list[ConvCache]
    pending: mx.array | None = None  # subsampled frames whose block is incomplete
    offset: int = 0  # frames already through the conformer layers
    # per-layer position keys for the last (n_keys, n_queries): constant once the
    # cache is full, so steady-state chunks skip the (left + T) x D x D projection
    pos_shape: tuple[int, int] | None = None
    pos_keys: list[mx.array] | None = None
    # streams stacked on the batch axis: row b's cache holds n_valid[b] real frames (the
    # rest, in front, is masked); None: read kv[0].valid (one stream)
    n_valid: list[int] | None = None

    def arrays(self) -> list[mx.array]:
        out = [a for c in (*self.subsampling, *self.kv, *self.conv) for a in c.state]
        out += self.pos_keys or []
        return out + ([self.pending] if self.pending is not None else [])


def chunked_limited_mask(q_pos: mx.array, k_pos: mx.array, block: int,
                         left_blocks: int) -> mx.array:
    """(Lq, Lk) bool: query block minus key block in [0, left_blocks]."""
    d = (q_pos // block)[:, None] - (k_pos // block)[None, :]
    return (d >= 0) & (d <= left_blocks)


class Encoder(nn.Module):
    def __init__(self, c: EncoderConfig):
        super().__init__()
        self.config = c
        self.subsampling = Subsampling(c)
        self.layers = [
            ConformerLayer(c.hidden_size, c.num_attention_heads, c.intermediate_size,
                           c.conv_kernel_size, c.attention_bias, c.convolution_bias, c.norm_eps)
            for _ in range(c.num_hidden_layers)
        ]

    def make_state(self, right_context: int) -> EncoderState:
        c = self.config
        return EncoderState(
            right_context, [StridedConvCache() for _ in range(c.n_subsampling_layers)],
            [ContextKVCache(c.left_context) for _ in range(c.num_hidden_layers)],
            [ConvCache() for _ in range(c.num_hidden_layers)],
        )

    def __call__(self, mel: mx.array | None, right_context: int | None = None,
                 state: EncoderState | None = None, final: bool = False,
                 layers=None) -> mx.array | None:
        """(B, T, n_mels) mel -> (B, T', hidden) encoder frames, or None for no frame.

        Offline (`state=None`): all frames of the utterance. Streaming: only frames
        whose block is complete; `final=True` flushes the rest exactly as offline. An empty
        or None `mel` is no new input; no zero-size array reaches a kernel. `layers`: what
        runs the conformer layers over the state's caches (`run_layers`'s signature; a
        compiled step), default `run_layers`.
        """
        c = self.config
        r = state.right_context if state is not None else right_context
        r = c.default_right_context if r is None else r
        block = r + 1
        if mel is not None and mel.shape[1] == 0:
            mel = None
        if mel is None and (state is None or not final):
            return None
        x = self.subsampling(mel, state.subsampling if state is not None else None,
                             final or state is None)
        if x is not None and c.scale_input:
            x = x * math.sqrt(c.hidden_size)
        offset, n_cached = 0, 0
        if state is not None:
            if state.pending is not None:
                x = state.pending if x is None else mx.concatenate([state.pending, x], axis=1)
            have = 0 if x is None else x.shape[1]
            n = have if final else have // block * block
            state.pending = x[:, n:] if n < have else None
            if not n:
                return None
            x = x if n == have else x[:, :n]
            offset, n_cached = state.offset, state.kv[0].size
            n_valid = state.n_valid or [state.kv[0].valid]
            state.offset += n
        if x is None:
            return None
        T = x.shape[1]
        mask = None
        if T > block:  # several blocks in one call: restrict by absolute block index
            q = mx.arange(offset, offset + T)
            mask = chunked_limited_mask(q, mx.arange(offset - n_cached, offset + T), block,
                                        c.left_context // block)
        if state is not None and min(n_valid) < n_cached:  # hide the caches' zero fill
            first = mx.array([n_cached - n for n in n_valid])[:, None, None, None]
            valid = mx.arange(n_cached + T)[None, None, None] >= first  # (B, 1, 1, Tk)
            mask = valid if mask is None else valid & mask
        shape = (n_cached + T, T)
        if state is not None and state.pos_shape == shape:
            pos_keys = state.pos_keys
        else:
            pos = rel_positions(*shape, c.hidden_size).astype(x.dtype)
            pos_keys = [layer.self_attn.project_positions(pos) for layer in self.layers]
            if state is not None:
                state.pos_shape, state.pos_keys = shape, pos_keys
        if state is None:
            return self.run_layers(x, pos_keys, mask)
        return (layers or self.run_layers)(x, pos_keys, mask, state.kv, state.conv)

    def run_layers(self, x: mx.array, pos_keys: list[mx.array], mask: mx.array | None,
                   kv: list[ContextKVCache] | None = None,
                   conv: list[ConvCache] | None = None) -> mx.array:
        """The conformer layers over (B, T, hidden) frames with their caches (None:
        offline)."""
        kv = kv or [None] * len(self.layers)
        conv = conv or [None] * len(self.layers)
        for layer, p, k, cv in zip(self.layers, pos_keys, kv, conv, strict=True):
            x = layer(x, p, mask, k, cv)
        return x


# -- the language-ID prompt (Nemotron 3.5) -----------------------------------------------------

class PromptProjector(nn.Module):
    def __init__(self, hidden: int, num_prompts: int, intermediate: int):
        super().__init__()
        self.num_prompts = num_prompts
        self.linear_1 = nn.Linear(hidden + num_prompts, intermediate)
        self.linear_2 = nn.Linear(intermediate, hidden)

    def __call__(self, frames: mx.array, slots: list[int]) -> mx.array:
        """(B, T, hidden) encoder frames, one slot per row -> (B, T, hidden)."""
        B, T, _ = frames.shape
        one = mx.arange(self.num_prompts)[None] == mx.array(slots, mx.int32)[:, None]
        one = mx.broadcast_to(one.astype(frames.dtype)[:, None], (B, T, self.num_prompts))
        x = self.linear_1(mx.concatenate([frames, one], axis=-1))
        return self.linear_2(nn.relu(x))


# -- RNN-T prediction and joint networks, the full model ---------------------------------------

class LSTM(nn.Module):
    """Stacked LSTM, one time step, parameters named as torch's nn.LSTM."""

    def __init__(self, dim: int, n_layers: int):
        super().__init__()
        self.n_layers = n_layers
        for i in range(n_layers):
            setattr(self, f"weight_ih_l{i}", mx.zeros((4 * dim, dim)))
            setattr(self, f"weight_hh_l{i}", mx.zeros((4 * dim, dim)))
            setattr(self, f"bias_ih_l{i}", mx.zeros((4 * dim,)))
            setattr(self, f"bias_hh_l{i}", mx.zeros((4 * dim,)))

    def __call__(self, x: mx.array, h: list[mx.array], c: list[mx.array]):
        """x (B, dim); h, c: per layer (B, dim). Returns (top h, new h, new c)."""
        hs, cs = [], []
        for i in range(self.n_layers):
            gates = (x @ getattr(self, f"weight_ih_l{i}").T + getattr(self, f"bias_ih_l{i}")
                     + h[i] @ getattr(self, f"weight_hh_l{i}").T + getattr(self, f"bias_hh_l{i}"))
            gi, gf, gg, go = mx.split(gates, 4, axis=-1)
            cell = mx.sigmoid(gf) * c[i] + mx.sigmoid(gi) * mx.tanh(gg)
            x = mx.sigmoid(go) * mx.tanh(cell)
            hs.append(x)
            cs.append(cell)
        return x, hs, cs


@dataclass
class DecoderState:
    """Predictor state after the last emitted token; `g` is its projected output."""

    g: mx.array  # (B, hidden)
    h: list[mx.array]
    c: list[mx.array]

    def arrays(self) -> list[mx.array]:
        return [self.g, *self.h, *self.c]


class Decoder(nn.Module):
    def __init__(self, vocab: int, dim: int, n_layers: int):
        super().__init__()
        self.embedding = nn.Embedding(vocab, dim)
        self.lstm = LSTM(dim, n_layers)
        self.decoder_projector = nn.Linear(dim, dim)

    def __call__(self, tokens: mx.array, state: DecoderState) -> DecoderState:
        """Advance the predictor by one token per batch row, tokens (B,) int."""
        out, h, c = self.lstm(self.embedding(tokens), state.h, state.c)
        return DecoderState(self.decoder_projector(out), h, c)


class Joint(nn.Module):
    def __init__(self, dim: int, vocab: int):
        super().__init__()
        self.head = nn.Linear(dim, vocab)

    def __call__(self, enc: mx.array, g: mx.array) -> mx.array:
        """Projected encoder frames (..., dim) + projected predictor (dim) -> logits."""
        return self.head(nn.relu(enc + g))


class Model(nn.Module):
    """Attribute names follow the transformers checkpoint."""

    def __init__(self, config: NemotronStreamingConfig):
        super().__init__()
        self.config = config
        e, d = config.encoder, config.decoder_hidden_size
        self.encoder = Encoder(e)
        self.encoder_projector = nn.Linear(e.hidden_size, d)
        self.decoder = Decoder(config.vocab_size, d, config.num_decoder_layers)
        self.joint = Joint(d, config.vocab_size)
        if config.num_prompts:  # Nemotron 3.5: the language-ID prompt
            self.prompt_projector = PromptProjector(e.hidden_size, config.num_prompts,
                                                    config.prompt_intermediate_size)

    def project(self, frames: mx.array, prompts: list[int] | None = None) -> mx.array:
        """Encoder frames (B, T, hidden) -> the joint's encoder input (B, T, dim); a prompted
        model first joins each row's language slot (`prompts`, one per row)."""
        if "prompt_projector" in self:
            frames = self.prompt_projector(frames, prompts)
        return self.encoder_projector(frames)

    @property
    def dtype(self) -> mx.Dtype:
        return self.decoder.lstm.weight_ih_l0.dtype  # Linears may be quantized

    def make_decoder_state(self, batch: int = 1) -> DecoderState:
        """Zero LSTM state advanced by the blank (start) token, as NeMo and HF do."""
        d, n = self.config.decoder_hidden_size, self.config.num_decoder_layers
        zero = mx.zeros((batch, d), self.dtype)
        st = DecoderState(zero, [zero] * n, [zero] * n)
        return self.decoder(mx.full((batch,), self.config.blank_id, mx.int32), st)
