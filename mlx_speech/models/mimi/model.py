"""Mimi neural audio codec (Kyutai, moshi 0.2.13 `MimiModel`) in MLX, offline and streaming.

Quirks worth knowing before reading the code:
- encode: SEANet encoder (hop 960 at 24 kHz -> 25 Hz, causal convs, zero left padding) ->
  transformer (T=2 per 80 ms frame) -> learnt conv downsample (k 4, stride 2, *replicate* left
  padding) -> split RVQ (1 semantic + num_codebooks-1 acoustic levels) -> 12.5 Hz codes.
- decode: RVQ sum -> depthwise transposed-conv upsample -> transformer -> SEANet decoder.
- Transposed convs keep the overlap of the last chunk (bias excluded) and drop it offline.
- The transformers stream with PyTorch's ring KV (capacity = context 250): once full, the first
  query of each two-step call sees 249 keys, so streaming PCM differs from offline (spec 8.6);
  codes normally agree. Offline encode pads the input with zeros to whole frames.
- The first streamed frame sees fresh left padding; Kyutai's server discards it (caller's choice).
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn

from ...nn import (
    CausalConv1d,
    CausalConvTranspose1d,
    ConvCache,
    ConvTrCache,
    Transformer,
    TransformerState,
)
from .config import MimiConfig, MimiTransformerConfig
from .quantizer import SplitResidualVQ
from .seanet import SeanetDecoder, SeanetEncoder


class ProjectedTransformer(nn.Module):
    """The transformer with optional in/out projections (none in the released Mimi)."""

    def __init__(self, c: MimiTransformerConfig):
        super().__init__()
        d = c.transformer.d_model
        self.transformer = Transformer(c.transformer)
        if c.input_dimension != d:
            self.input_proj = nn.Linear(c.input_dimension, d, bias=False)
        if c.output_dimension != d:
            self.output_projs = [nn.Linear(d, c.output_dimension, bias=False)]

    def __call__(self, x: mx.array, state: TransformerState | None = None) -> mx.array:
        if "input_proj" in self:
            x = self.input_proj(x)
        x = self.transformer(x, state)
        return self.output_projs[0](x) if "output_projs" in self else x


def _reset_caches(caches) -> None:
    for c in caches:
        if isinstance(c, list):
            _reset_caches(c)
        elif isinstance(c, ConvCache):
            c.tail = None
        elif isinstance(c, ConvTrCache):
            c.partial = None


def _cache_arrays(caches) -> list[mx.array]:
    out: list[mx.array] = []
    for c in caches:
        if isinstance(c, list):
            out += _cache_arrays(c)
        elif c is not None:
            out += c.state
    return out


@dataclass
class EncoderState:
    seanet: list
    transformer: TransformerState
    downsample: ConvCache

    def reset(self) -> None:
        _reset_caches(self.seanet)
        self.transformer.reset()
        self.downsample.tail = None

    def arrays(self) -> list[mx.array]:
        return (_cache_arrays(self.seanet) + self.transformer.arrays()
                + self.downsample.state)


@dataclass
class DecoderState:
    seanet: list
    transformer: TransformerState
    upsample: ConvTrCache

    def reset(self) -> None:
        _reset_caches(self.seanet)
        self.transformer.reset()
        self.upsample.partial = None

    def arrays(self) -> list[mx.array]:
        return _cache_arrays(self.seanet) + self.transformer.arrays() + self.upsample.state


@dataclass
class MimiState:
    """One encoder and one decoder stream; either may be driven alone."""

    encoder: EncoderState
    decoder: DecoderState

    def reset(self) -> None:
        self.encoder.reset()
        self.decoder.reset()

    def arrays(self) -> list[mx.array]:
        return self.encoder.arrays() + self.decoder.arrays()


class Mimi(nn.Module):
    def __init__(self, cfg: MimiConfig, num_codebooks: int = 8):
        super().__init__()
        self.cfg = cfg
        dim = cfg.seanet.dimension
        self.encoder = SeanetEncoder(cfg.seanet)
        self.decoder = SeanetDecoder(cfg.seanet)
        self.encoder_transformer = ProjectedTransformer(cfg.transformer)
        self.decoder_transformer = ProjectedTransformer(cfg.transformer)
        s = cfg.resample_stride
        self.downsample = CausalConv1d(dim, dim, 2 * s, stride=s, bias=False, replicate=True)
        self.upsample = CausalConvTranspose1d(dim, dim, 2 * s, stride=s, bias=False, groups=dim)
        self.quantizer = SplitResidualVQ(cfg.quantizer)
        self.num_codebooks = num_codebooks

    @property
    def num_codebooks(self) -> int:
        return self._num_codebooks

    @num_codebooks.setter
    def num_codebooks(self, n: int) -> None:
        q = self.cfg.quantizer
        if not q.n_q_semantic <= n <= q.n_q:
            raise ValueError(f"num_codebooks {n} outside {q.n_q_semantic}..{q.n_q}")
        self._num_codebooks = n

    @property
    def sample_rate(self) -> int:
        return self.cfg.sample_rate

    @property
    def frame_rate(self) -> float:
        return self.cfg.frame_rate

    @property
    def frame_size(self) -> int:
        return self.cfg.frame_size

    @property
    def cardinality(self) -> int:
        return self.cfg.quantizer.bins

    # ---------------------------------------------------------------- state
    def make_encoder_state(self, batch: int = 1) -> EncoderState:
        return EncoderState(self.encoder.make_state(),
                            self.encoder_transformer.transformer.make_state(batch), ConvCache())

    def make_decoder_state(self, batch: int = 1) -> DecoderState:
        return DecoderState(self.decoder.make_state(),
                            self.decoder_transformer.transformer.make_state(batch), ConvTrCache())

    def make_state(self, batch: int = 1) -> MimiState:
        return MimiState(self.make_encoder_state(batch), self.make_decoder_state(batch))

    # ---------------------------------------------------------------- pipelines
    def _encode(self, pcm: mx.array, state: EncoderState | None) -> mx.array:
        x = pcm.transpose(0, 2, 1)  # (B, T, channels)
        x = self.encoder(x, state.seanet if state else None)
        x = self.encoder_transformer(x, state.transformer if state else None)
        x = self.downsample(x, state.downsample if state else None)
        return self.quantizer.encode(x, self.num_codebooks)

    def _decode(self, codes: mx.array, state: DecoderState | None) -> mx.array:
        x = self.quantizer.decode(codes)
        x = self.upsample(x, state.upsample if state else None)
        x = self.decoder_transformer(x, state.transformer if state else None)
        x = self.decoder(x, state.seanet if state else None)
        return x.transpose(0, 2, 1)

    def encode(self, pcm: mx.array) -> mx.array:
        """Offline: pcm (B, 1, T) float -> codes (B, num_codebooks, ceil(T / frame_size))."""
        extra = -pcm.shape[-1] % self.frame_size
        if extra:
            pcm = mx.pad(pcm, [(0, 0), (0, 0), (0, extra)])
        return self._encode(pcm, None)

    def decode(self, codes: mx.array) -> mx.array:
        """Offline: codes (B, K, frames) -> pcm (B, 1, frames * frame_size)."""
        return self._decode(codes, None)

    def encode_step(self, pcm: mx.array, state: MimiState | EncoderState) -> mx.array:
        """Streaming: pcm (B, 1, n * frame_size) -> codes (B, num_codebooks, n)."""
        if pcm.shape[-1] == 0 or pcm.shape[-1] % self.frame_size:
            raise ValueError(f"streaming input of {pcm.shape[-1]} samples is not a positive "
                             f"multiple of the frame size {self.frame_size}")
        return self._encode(pcm, state.encoder if isinstance(state, MimiState) else state)

    def decode_step(self, codes: mx.array, state: MimiState | DecoderState) -> mx.array:
        """Streaming: codes (B, K, n) -> pcm (B, 1, n * frame_size)."""
        return self._decode(codes, state.decoder if isinstance(state, MimiState) else state)
