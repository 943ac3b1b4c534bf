"""Phrase boosting on logits: `logits -> boost -> greedy choice`, fixed shapes per step.

Each row's bias is `alpha * (root_scores + scatter(idx, val))` (see
`mlx_speech/text/context_graph.py`): a dense vector per graph, built once, plus a sparse
part of a fixed width (a power of two covering the graph's widest state) built on the host
from the row's graph state. Rows without phrases get zeros; a step without any phrases
builds no bias at all (the plain argmax, unchanged).
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from ..text.context_graph import Booster


def _root(b: Booster, vocab: int, dtype: mx.Dtype) -> mx.array:
    cache = b.graph.__dict__.setdefault("_root_mx", {})
    key = (b.alpha, vocab, dtype)
    if key not in cache:
        r = np.zeros(vocab, np.float32)
        n = min(vocab, len(b.graph.root_scores))
        r[:n] = b.graph.root_scores[:n] * b.alpha
        cache.clear()
        cache[key] = mx.array(r).astype(dtype)
    return cache[key]


def bias(rows: list[Booster | None], vocab: int, dtype: mx.Dtype = mx.float32
         ) -> mx.array | None:
    """(B, vocab) additive bias of each row's current state; None when no row boosts."""
    live = [b for b in rows if b is not None]
    if not live:
        return None
    width = max(b.graph.width for b in live)
    zero = None
    roots, idx, val = [], np.zeros((len(rows), width), np.int32), np.zeros(
        (len(rows), width), np.float32)
    for i, b in enumerate(rows):
        if b is None:
            if zero is None:
                zero = mx.zeros((vocab,), dtype)
            roots.append(zero)
            continue
        roots.append(_root(b, vocab, dtype))
        idx[i], val[i] = b.sparse(width)
    out = roots[0][None] if len(roots) == 1 else mx.stack(roots)
    if not val.any():  # every row at the root (most steps): the dense part alone
        return out
    r = mx.arange(len(rows))[:, None]
    return out.at[r, mx.array(idx)].add(mx.array(val).astype(dtype))


def greedy(logits: mx.array, b: mx.array | None) -> mx.array:
    """argmax over the last axis of logits + bias (bias (B, V) broadcast over middle axes)."""
    if b is None:
        return mx.argmax(logits, axis=-1)
    shape = (b.shape[0],) + (1,) * (logits.ndim - 2) + (b.shape[1],)
    return mx.argmax(logits + b.reshape(shape), axis=-1)


def greedy_transducer(logits: mx.array, b: mx.array | None, blank: int) -> mx.array:
    """NeMo's fused greedy RNN-T choice: blank or not is decided on the plain logits; a
    non-blank choice is the argmax of the non-blank logits plus the bias."""
    raw = mx.argmax(logits, axis=-1)
    if b is None:
        return raw
    nb = greedy(logits[..., :blank], b[:, :blank])
    return mx.where(raw == blank, raw, nb)


def chosen_logprob(logits: mx.array, chosen: mx.array) -> mx.array:
    """log-softmax(logits) at the chosen ids (chosen: logits' shape without the last axis)."""
    lse = mx.logsumexp(logits.astype(mx.float32), axis=-1)
    pick = mx.take_along_axis(logits, chosen[..., None], axis=-1)[..., 0]
    return pick.astype(mx.float32) - lse
