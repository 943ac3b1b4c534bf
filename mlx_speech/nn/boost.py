"""Phrase boosting on logits: the (B, vocab) bias of a step's rows, fixed shapes per step.

Each row's bias is `alpha * (root_scores + scatter(idx, val))` (the context graph of
`mlx_speech/text/context_graph.py`): a dense vector per graph, put on the device once, plus a
sparse part of a fixed width (a power of two covering the graph's widest state) that the row's
walk gives from its graph state on the host. Rows without phrases get zeros; a step without
any phrases builds no bias at all. The chosen token is `nn.sampling`'s (greedy over logits +
bias).
"""

from __future__ import annotations

from typing import Protocol
from weakref import WeakKeyDictionary

import mlx.core as mx
import numpy as np


class Graph(Protocol):
    root_scores: np.ndarray  # (graph vocab,) the root's arc scores
    width: int  # the sparse part's width


class Walk(Protocol):
    """One stream's walk through a graph (`text.context_graph.Booster`)."""

    graph: Graph
    alpha: float

    def sparse(self, width: int) -> tuple[np.ndarray, np.ndarray]: ...


# the dense part of each live graph on the device, per (alpha, vocab, dtype): kept as long as
# the graph (a model's graph cache holds it; the sessions boosting with it share one copy)
_ROOTS: WeakKeyDictionary = WeakKeyDictionary()


def _root(w: Walk, vocab: int, dtype: mx.Dtype) -> mx.array:
    cache = _ROOTS.setdefault(w.graph, {})
    key = (w.alpha, vocab, dtype)
    if key not in cache:
        r = np.zeros(vocab, np.float32)
        n = min(vocab, len(w.graph.root_scores))
        r[:n] = w.graph.root_scores[:n] * w.alpha
        cache.clear()
        cache[key] = mx.array(r).astype(dtype)
    return cache[key]


def bias(rows: list[Walk | None], vocab: int, dtype: mx.Dtype = mx.float32) -> mx.array | None:
    """(B, vocab) additive bias of each row's current state; None when no row boosts."""
    live = [w for w in rows if w is not None]
    if not live:
        return None
    width = max(w.graph.width for w in live)
    zero = None
    roots, idx, val = [], np.zeros((len(rows), width), np.int32), np.zeros(
        (len(rows), width), np.float32)
    for i, w in enumerate(rows):
        if w is None:
            if zero is None:
                zero = mx.zeros((vocab,), dtype)
            roots.append(zero)
            continue
        roots.append(_root(w, vocab, dtype))
        idx[i], val[i] = w.sparse(width)
    out = roots[0][None] if len(roots) == 1 else mx.stack(roots)
    if not val.any():  # every row at the root (most steps): the dense part alone
        return out
    r = mx.arange(len(rows))[:, None]
    return out.at[r, mx.array(idx)].add(mx.array(val).astype(dtype))
