"""RNN-T prediction and joint networks, and the full Nemotron streaming model.

Quirks: the predictor is Embedding -> 2-layer LSTM (torch gate order i, f, g, o)
-> Linear; the blank row of the embedding is zero (NeMo blank_as_pad), so
feeding blank at stream start equals NeMo's zero "start of sequence" input.
The joint is relu(enc_proj(f) + dec_proj(g)) -> Linear; not TDT (no durations).
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn

from .config import NemotronStreamingConfig
from .encoder import Encoder
from .prompt import PromptProjector


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
