"""Choosing tokens (mlx_speech/nn/sampling.py): Kyutai's temperature / top-k sampling and
its top-k, independent of the order a backend lists tied candidates in. (Greedy choices with a
phrase bias and their logprobs are tested with boosting, tests/models/test_boosting.py and
test_asr_logprobs.py.)"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from mlx_speech.nn.sampling import sample, top_k_ids


def test_sampling_top_k_and_seed():
    logits = mx.array(np.linspace(0, 3, 50, dtype=np.float32))[None]
    picks = {sample(logits, 1.0, 5, mx.random.key(i)).item() for i in range(60)}
    assert picks <= set(range(45, 50)) and len(picks) > 1
    a = [sample(logits, 0.8, 25, mx.random.key(7)).item() for _ in range(3)]
    assert len(set(a)) == 1
    assert sample(logits, 0.0, 25, None).item() == 49


@pytest.mark.parametrize("order", ["stable", "reversed", "shuffled"])
def test_sampled_token_does_not_depend_on_candidate_order(gpu_order, order):
    """Partitions list the top-k in a backend's own order (the CPU's nth_element, the GPUs'
    sorts; ties in any order): a seed gives the same tokens whatever order they come in."""
    rng = np.random.default_rng(0)
    # quarter steps, as coarse as bf16 logits: ties everywhere, across the k-th value too
    vals = np.round(rng.standard_normal((6, 64)) * 4) / 4
    kth = -np.sort(-vals, axis=-1)
    assert any((kth[:, k - 1] == kth[:, k]).any() for k in (5, 25))
    logits = mx.array(vals.astype(np.float32))

    def draw():
        return np.stack([np.array(sample(logits, 0.9, k, mx.random.key(i)))
                         for k in (5, 25) for i in range(30)])

    ref = draw()
    ids = [np.array(top_k_ids(logits, k)) for k in (5, 25)]  # eager: the emulation applies
    gpu_order(order)
    np.testing.assert_array_equal(draw(), ref)
    for k, want in zip((5, 25), ids, strict=True):
        np.testing.assert_array_equal(np.array(top_k_ids(logits, k)), want)


def test_top_k_keeps_the_lowest_ids_among_ties():
    logits = mx.array([[1.0, 2.0, 2.0, 2.0, 0.0, 3.0], [5.0, 5.0, 5.0, 5.0, 5.0, 5.0]])
    assert np.array(top_k_ids(logits, 3)).tolist() == [[1, 2, 5], [0, 1, 2]]
    assert np.array(top_k_ids(logits, 1)).tolist() == [[5], [0]]
    assert np.array(top_k_ids(logits, 5)).tolist() == [[0, 1, 2, 3, 5], [0, 1, 2, 3, 4]]
