"""Choosing tokens from logits, for every decoder: greedy (with an additive bias, e.g. phrase
boosting's), NeMo's greedy RNN-T choice, the chosen token's log-probability, and Kyutai's
temperature / top-k sampling. Results never depend on the order in which a backend's sort or
partition lists tied candidates."""

from __future__ import annotations

import mlx.core as mx
import numpy as np


def greedy(logits: mx.array, bias: mx.array | None = None) -> mx.array:
    """argmax over the last axis of logits + bias (bias (B, V) broadcast over middle axes)."""
    if bias is None:
        return mx.argmax(logits, axis=-1)
    shape = (bias.shape[0],) + (1,) * (logits.ndim - 2) + (bias.shape[1],)
    return mx.argmax(logits + bias.reshape(shape), axis=-1)


def greedy_transducer(logits: mx.array, bias: mx.array | None, blank: int) -> mx.array:
    """NeMo's fused greedy RNN-T choice: blank or not is decided on the plain logits; a
    non-blank choice is the argmax of the non-blank logits plus the bias."""
    raw = mx.argmax(logits, axis=-1)
    if bias is None:
        return raw
    nb = greedy(logits[..., :blank], bias[:, :blank])
    return mx.where(raw == blank, raw, nb)


def chosen_logprob(logits: mx.array, chosen: mx.array) -> mx.array:
    """log-softmax(logits) at the chosen ids (chosen: logits' shape without the last axis)."""
    lse = mx.logsumexp(logits.astype(mx.float32), axis=-1)
    pick = mx.take_along_axis(logits, chosen[..., None], axis=-1)[..., 0]
    return pick.astype(mx.float32) - lse


_RANKS: dict[int, tuple[mx.array, mx.array, mx.array]] = {}


def _ranks(V: int) -> tuple[mx.array, mx.array, mx.array]:
    """ids, ids + V, ids + 2V as int32 constants (from numpy: no graph, usable on any thread)."""
    if V not in _RANKS:
        ids = np.arange(V, dtype=np.int32)
        _RANKS[V] = (mx.array(ids), mx.array(ids + V), mx.array(ids + 2 * V))
    return _RANKS[V]


def top_k_ids(logits: mx.array, k: int) -> mx.array:
    """Ids [B, k] of the `k` largest logits, ascending, ties at the k-th value going to the
    lowest ids. Built from values and ids only, so it never depends on the order in which a
    backend's partition lists candidates (the CPU's nth_element and the GPUs' sorts differ)."""
    V = logits.shape[-1]
    kth = -mx.partition(-logits, kth=k - 1, axis=-1)[..., k - 1: k]  # the k-th largest
    above, tied, below = _ranks(V)  # above the k-th value first, then ties; each in id order
    rank = mx.where(logits > kth, above, mx.where(logits == kth, tied, below))
    return mx.sort(mx.partition(rank, kth=k - 1, axis=-1)[..., :k] % V, axis=-1)


_top_k_ids = mx.compile(top_k_ids)  # fused: a sampled step then costs what the old one did


def sample(logits: mx.array, temp: float, top_k: int, key: mx.array | None) -> mx.array:
    """Kyutai's sampling (`moshi.utils.sampling.sample_token`): greedy when `temp <= 0`, else
    softmax(logits / temp) restricted to the `top_k` largest logits (0 = all). Logits [B, V] in
    any dtype; computed in float32. Returns int32 [B]. Candidates are drawn in id order, so a
    seed picks the same token from the same logits on every backend."""
    logits = logits.astype(mx.float32)
    if temp <= 0:
        return mx.argmax(logits, axis=-1).astype(mx.int32)
    if 0 < top_k < logits.shape[-1]:
        idx = _top_k_ids(logits, top_k)
        vals = mx.take_along_axis(logits, idx, axis=-1)
        pick = mx.random.categorical(vals * (1.0 / temp), key=key)
        return mx.take_along_axis(idx, pick[..., None], axis=-1)[..., 0].astype(mx.int32)
    return mx.random.categorical(logits * (1.0 / temp), key=key).astype(mx.int32)
