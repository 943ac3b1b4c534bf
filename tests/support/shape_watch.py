"""Count the distinct shapes a streaming path hands to attention and to its caches.

GPU backends build kernels and graphs per input shape (cuDNN caches them by exact shape), so a
stream must use a small fixed set of shapes, not one per tick. `ShapeWatch` wraps
`mx.fast.scaled_dot_product_attention` and the `update_and_fetch` of the cache classes and
records each call's signature: the shapes (and dtypes) of its array arguments and the mask's
form ("causal", None or an array's shape). Compiled steps (mlx_speech/nn/compiled.py) reach
both while traced: a watch drops every compiled graph when it starts, so each shape a test
runs is traced (and seen) again.
"""

from __future__ import annotations

from collections import defaultdict

import mlx.core as mx
import pytest

from mlx_speech.nn import compiled
from mlx_speech.nn.cache import RingBatch, RingStep, SlidingKVCache
from mlx_speech.nn.transformer import KVCache


def _sig(x):
    if isinstance(x, mx.array):
        return (tuple(x.shape), str(x.dtype))
    if isinstance(x, (list, tuple)):
        return tuple(_sig(a) for a in x)
    return x if x is None or isinstance(x, (str, int, float, bool)) else type(x).__name__


class ShapeWatch:
    def __init__(self, monkeypatch: pytest.MonkeyPatch):
        compiled.reset()
        self.seen: dict[str, set] = defaultdict(set)
        self.calls: dict[str, int] = defaultdict(int)
        self._wrap(monkeypatch, mx.fast, "scaled_dot_product_attention", "attention",
                   method=False)
        for cls in (RingBatch, RingStep, SlidingKVCache, KVCache):
            self._wrap(monkeypatch, cls, "update_and_fetch", "cache", method=True)

    def _wrap(self, monkeypatch, owner, name: str, label: str, method: bool) -> None:
        fn = getattr(owner, name)

        def spy(*args, **kw):
            a = args[1:] if method else args
            self.seen[label].add((_sig(a), tuple(sorted((k, _sig(v)) for k, v in kw.items()))))
            self.calls[label] += 1
            return fn(*args, **kw)

        monkeypatch.setattr(owner, name, spy)

    def count(self, label: str = "attention") -> int:
        return len(self.seen[label])

    def reset(self) -> None:
        self.seen.clear()
        self.calls.clear()
