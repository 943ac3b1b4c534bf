"""Mimi's split residual vector quantizer (moshi 0.2.13 `SplitResidualVectorQuantizer`).

Two RVQs read the same latent through their own 1x1 projections: `rvq_first` (the semantic
level) and `rvq_rest` (acoustic levels, residual among themselves only). A level's code is the
Euclidean-nearest codeword; decoding sums codewords, projects back, and adds the two RVQs.
Codewords are stored precomputed (`embedding = embedding_sum / max(cluster_usage, 1e-5)`).
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from .config import QuantizerConfig


class Codebook(nn.Module):
    def __init__(self, bins: int, dim: int):
        super().__init__()
        self.embedding = mx.zeros((bins, dim))

    def encode(self, x: mx.array) -> mx.array:
        """x (..., dim) -> nearest codeword index (...)."""
        e = self.embedding
        # argmin |x - e|^2 = argmin (|e|^2 - 2 x.e); |x|^2 is common to all codewords
        d = (e * e).sum(-1) - 2 * (x @ e.T)
        return mx.argmin(d, axis=-1)

    def decode(self, codes: mx.array) -> mx.array:
        return self.embedding[codes]


class Levels(nn.Module):
    def __init__(self, n: int, bins: int, dim: int):
        super().__init__()
        self.layers = [Codebook(bins, dim) for _ in range(n)]


class ResidualVQ(nn.Module):
    def __init__(self, n_q: int, c: QuantizerConfig, force_projection: bool):
        super().__init__()
        if force_projection or c.input_dimension != c.dimension:
            self.input_proj = nn.Linear(c.input_dimension, c.dimension, bias=False)
        if force_projection or c.output_dimension != c.dimension:
            self.output_proj = nn.Linear(c.dimension, c.output_dimension, bias=False)
        self.vq = Levels(n_q, c.bins, c.dimension)

    def encode(self, x: mx.array, n: int) -> mx.array:
        """x (B, T, input_dimension) -> codes (B, n, T)."""
        if "input_proj" in self:
            x = self.input_proj(x)
        codes = []
        for level in self.vq.layers[:n]:
            c = level.encode(x)
            x = x - level.decode(c)
            codes.append(c)
        return mx.stack(codes, axis=1)

    def decode(self, codes: mx.array) -> mx.array:
        """codes (B, n, T) -> (B, T, output_dimension)."""
        q = self.vq.layers[0].decode(codes[:, 0])
        for i in range(1, codes.shape[1]):
            q = q + self.vq.layers[i].decode(codes[:, i])
        return self.output_proj(q) if "output_proj" in self else q


class SplitResidualVQ(nn.Module):
    def __init__(self, c: QuantizerConfig):
        super().__init__()
        self.n_q_semantic = c.n_q_semantic
        self.total_codebooks = c.n_q
        self.rvq_first = ResidualVQ(c.n_q_semantic, c, force_projection=True)
        self.rvq_rest = ResidualVQ(c.n_q - c.n_q_semantic, c, force_projection=False)

    def encode(self, x: mx.array, n: int) -> mx.array:
        """x (B, T, D) -> codes (B, n, T) with n active codebooks."""
        codes = self.rvq_first.encode(x, self.n_q_semantic)
        if n > self.n_q_semantic:
            rest = self.rvq_rest.encode(x, n - self.n_q_semantic)
            codes = mx.concatenate([codes, rest], axis=1)
        return codes

    def decode(self, codes: mx.array) -> mx.array:
        """codes (B, n, T) -> (B, T, D)."""
        s = self.n_q_semantic
        q = self.rvq_first.decode(codes[:, :s])
        if codes.shape[1] > s:
            q = q + self.rvq_rest.decode(codes[:, s:])
        return q
