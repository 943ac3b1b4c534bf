"""Token sampling shared by the decoders."""

from __future__ import annotations

import mlx.core as mx


def sample(logits: mx.array, temperature: float = 0.0, key: mx.array | None = None):
    """Greedy for temperature 0, else categorical over logits / temperature."""
    if temperature <= 0:
        return mx.argmax(logits, axis=-1)
    return mx.random.categorical(logits * (1.0 / temperature), key=key)
