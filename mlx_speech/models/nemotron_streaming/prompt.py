"""The language-ID prompt of Nemotron 3.5 ASR (NeMo's `EncDecRNNTBPEModelWithPrompt`).

Each row's language slot becomes a one-hot of `num_prompts`, broadcast over time and joined to
the encoder frames; a two-layer MLP (NeMo `prompt_kernel.0/2`, transformers
`prompt_projector.linear_1/2`) maps them back to the encoder width, before the joint's encoder
projection. Frame by frame, so streaming and batching need no state for it.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn


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
