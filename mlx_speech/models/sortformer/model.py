"""NeMo's SortformerEncLabelModel network in MLX: FastConformer -> projection -> transformer ->
sigmoid speaker heads.

- dw_striding x8 subsampling, NOT causal: three k3/s2 Conv2d over (time, freq) with one zero
  frame of padding on every side; flattened channel-major (C, F) before a Linear. Rows shorter
  than the batch's longest are handled exactly: after each stage the frames past the row's
  length are zeroed, which is what the next conv's zero padding would have given it.
- Full-context FastConformer: rel-pos attention over every valid frame, centred depthwise conv
  with an inference BatchNorm; layers are shared with Nemotron (`mlx_speech.nn.conformer`).
- Post-LN transformer encoder (no positional embedding), ReLU FFN, scores scaled by
  1/sqrt(head_dim); padded keys are masked.
- Heads: ReLU -> Linear -> ReLU -> Linear -> sigmoid, times the valid mask.

`infer(emb, lengths)` is the one network function after subsampling: offline it sees the whole
recording; the streaming step (`streaming.py`) calls it on [speaker cache, FIFO, chunk].
"""

from __future__ import annotations

import math

import mlx.core as mx
import mlx.nn as nn

from ...nn import ConformerLayer, rel_positions
from .config import SortformerConfig


def conv_out_len(n, stages: int = 3):
    """Frames after `stages` k3/s2/p1 convs (NeMo's calc_length), for ints or int arrays."""
    for _ in range(stages):
        n = (n - 1) // 2 + 1
    return n


class Conv2d(nn.Module):
    """Conv2d over (B, T, F, C) with one zero of padding on every side."""

    def __init__(self, in_ch: int, out_ch: int, kernel: int, stride: int, groups: int = 1):
        super().__init__()
        self.weight = mx.zeros((out_ch, kernel, kernel, in_ch // groups))
        self.bias = mx.zeros((out_ch,))
        self.stride, self.groups, self.pad = stride, groups, (kernel - 1) // 2

    def __call__(self, x: mx.array) -> mx.array:
        return mx.conv2d(x, self.weight, stride=self.stride, padding=self.pad,
                         groups=self.groups) + self.bias


class Subsampling(nn.Module):
    """NeMo's pre_encode (Sequential indices 0, 2, 3, 5, 6 are the weighted layers)."""

    def __init__(self, c: SortformerConfig):
        super().__init__()
        ch = c.subsampling_channels
        self.layers_0 = Conv2d(1, ch, 3, 2)
        self.layers_2 = Conv2d(ch, ch, 3, 2, groups=ch)
        self.layers_3 = nn.Linear(ch, ch)  # a 1x1 Conv2d
        self.layers_5 = Conv2d(ch, ch, 3, 2, groups=ch)
        self.layers_6 = nn.Linear(ch, ch)
        freqs = conv_out_len(c.n_mels)
        self.linear = nn.Linear(ch * freqs, c.d_model)

    def __call__(self, mel: mx.array, lengths: mx.array | None = None) -> mx.array:
        """(B, T, n_mels) -> (B, conv_out_len(T), d_model); `lengths` (B,) mel frames per row
        (None: all T). Frames past a row's length must be zero in `mel`."""

        def keep(x, n):  # zero the frames past each row's length
            if n is None:
                return x
            valid = mx.arange(x.shape[1])[None] < n[:, None]
            return mx.where(valid[:, :, None, None], x, mx.array(0, x.dtype))

        n = lengths
        x = nn.relu(self.layers_0(mel[..., None]))
        n = None if n is None else conv_out_len(n, 1)
        x = keep(x, n)
        x = nn.relu(self.layers_3(self.layers_2(x)))
        n = None if n is None else conv_out_len(n, 1)
        x = keep(x, n)
        x = nn.relu(self.layers_6(self.layers_5(x)))
        B, T, F, C = x.shape
        return self.linear(x.transpose(0, 1, 3, 2).reshape(B, T, C * F))


class FastConformer(nn.Module):
    def __init__(self, c: SortformerConfig):
        super().__init__()
        self.config = c
        self.subsampling = Subsampling(c)
        self.layers = [
            ConformerLayer(c.d_model, c.n_heads, c.ff_hidden, c.conv_kernel, c.use_bias,
                           c.use_bias, 1e-5, conv_norm="batch_norm", causal_conv=False)
            for _ in range(c.n_layers)
        ]

    def __call__(self, x: mx.array, valid: mx.array | None) -> mx.array:
        """Subsampled frames (B, T, d_model) -> encoder frames; `valid` (B, T) bool or None."""
        c = self.config
        if c.xscaling:
            x = x * math.sqrt(c.d_model)
        T = x.shape[1]
        pos = rel_positions(T, T, c.d_model).astype(x.dtype)
        mask = None if valid is None else valid[:, None, None, :]  # padded keys
        for layer in self.layers:
            x = layer(x, layer.self_attn.project_positions(pos), mask, None, None, valid)
        return x


class TransformerAttention(nn.Module):
    def __init__(self, dim: int, n_heads: int):
        super().__init__()
        self.n_heads = n_heads
        self.q_proj = nn.Linear(dim, dim)
        self.k_proj = nn.Linear(dim, dim)
        self.v_proj = nn.Linear(dim, dim)
        self.out_proj = nn.Linear(dim, dim)

    def __call__(self, x: mx.array, mask: mx.array | None) -> mx.array:
        B, T, D = x.shape
        H = self.n_heads

        def heads(y):
            return y.reshape(B, T, H, D // H).transpose(0, 2, 1, 3)

        q, k, v = heads(self.q_proj(x)), heads(self.k_proj(x)), heads(self.v_proj(x))
        o = mx.fast.scaled_dot_product_attention(q, k, v, scale=(D // H) ** -0.5, mask=mask)
        return self.out_proj(o.transpose(0, 2, 1, 3).reshape(B, T, D))


class TransformerLayer(nn.Module):
    """Post-LN: x = LN(x + attn(x)); x = LN(x + ffn(x))."""

    def __init__(self, dim: int, n_heads: int, hidden: int):
        super().__init__()
        self.self_attn = TransformerAttention(dim, n_heads)
        self.self_attn_layer_norm = nn.LayerNorm(dim, eps=1e-5)
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)
        self.final_layer_norm = nn.LayerNorm(dim, eps=1e-5)

    def __call__(self, x: mx.array, mask: mx.array | None) -> mx.array:
        x = self.self_attn_layer_norm(x + self.self_attn(x, mask))
        return self.final_layer_norm(x + self.fc2(nn.relu(self.fc1(x))))


class TransformerEncoder(nn.Module):
    def __init__(self, c: SortformerConfig):
        super().__init__()
        self.layers = [TransformerLayer(c.tf_d_model, c.tf_heads, c.tf_ff_hidden)
                       for _ in range(c.tf_layers)]

    def __call__(self, x: mx.array, mask: mx.array | None) -> mx.array:
        for layer in self.layers:
            x = layer(x, mask)
        return x


class SortformerModules(nn.Module):
    def __init__(self, c: SortformerConfig):
        super().__init__()
        self.encoder_proj = nn.Linear(c.d_model, c.tf_d_model)
        self.first_hidden_to_hidden = nn.Linear(c.tf_d_model, c.tf_d_model)
        self.single_hidden_to_spks = nn.Linear(c.tf_d_model, c.n_spk)
        # in every checkpoint, never used by NeMo's inference (kept so loading stays strict)
        self.hidden_to_spks = nn.Linear(2 * c.tf_d_model, c.n_spk)

    def speaker_probs(self, x: mx.array) -> mx.array:
        x = self.first_hidden_to_hidden(nn.relu(x))
        return mx.sigmoid(self.single_hidden_to_spks(nn.relu(x)))


class Sortformer(nn.Module):
    def __init__(self, c: SortformerConfig):
        super().__init__()
        self.config = c
        self.fc_encoder = FastConformer(c)
        self.tf_encoder = TransformerEncoder(c)
        self.sortformer_modules = SortformerModules(c)

    def pre_encode(self, mel: mx.array, lengths: mx.array | None = None) -> mx.array:
        """(B, T, n_mels) log-mel -> (B, T', d_model) subsampled frames (NeMo's pre_encode)."""
        return self.fc_encoder.subsampling(mel, lengths)

    def infer(self, emb: mx.array, lengths: mx.array | None = None) -> mx.array:
        """Subsampled frames (B, T, d_model) -> speaker probabilities (B, T, n_spk).

        `lengths` (B,): valid frames per row, the rest right padding (None: all valid). A row's
        valid outputs do not depend on its padding; padded outputs are 0."""
        valid = None
        if lengths is not None:
            valid = mx.arange(emb.shape[1])[None] < lengths[:, None]
        x = self.fc_encoder(emb, valid)
        x = self.sortformer_modules.encoder_proj(x)
        mask = None if valid is None else valid[:, None, None, :]
        x = self.tf_encoder(x, mask)
        probs = self.sortformer_modules.speaker_probs(x)
        if valid is not None:
            probs = probs * valid[..., None].astype(probs.dtype)
        return probs

    def __call__(self, mel: mx.array, lengths: mx.array | None = None) -> mx.array:
        """Offline (`state=None` in the session): (B, T, n_mels) -> (B, T', n_spk)."""
        emb = self.pre_encode(mel, lengths)
        n = None if lengths is None else conv_out_len(lengths)
        return self.infer(emb, n)
