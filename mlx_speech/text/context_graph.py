"""Phrase boosting: an Aho-Corasick context graph over the token ids of each phrase.

The graph is icefall's / NeMo's ContextGraph, scored as NeMo 3.0's GPU-PB boosting tree
(`GPUBoostingTreeModel`, non-uniform weights): the first token of a phrase earns
`context_score`, the i-th (i > 0) `context_score * depth_scaling + log(i + 1)`; a node that
a failed partial match leaves falls back along its fail arc, and the back-off takes back
what the match had earned (`fail.node_score - node.node_score`; nothing after a whole
phrase). `score(state, v)` walks the back-off chain to the first state with an arc for `v`
(the root has one for every token: 0 unless a phrase starts with it).

For decoding, the score vector of a state is split into a dense part shared by every state
(the root's arcs) and a few sparse corrections (the arcs of the states on the back-off chain
below the root); the back-off sum to the root is a constant over the vocabulary, which no
argmax sees, so it is left out. `Booster` holds one stream's state and gives the sparse part
padded to a fixed width, so a decoding step adds `alpha * (root + scatter(idx, val))`: shapes
independent of the phrase count (see `mlx_speech/nn/boost.py`).
"""

from __future__ import annotations

import math
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterable

import numpy as np

from ..errors import MlxSpeechError
from .vocabulary import DEFAULT_BOOST, check_boost  # noqa: F401 (re-exported)
from .vocabulary import phrases as parse_hotwords  # noqa: F401 (re-exported)

CONTEXT_SCORE = 1.0  # NeMo's BoostingTreeModelConfig defaults (RNN-T / TDT / CTC)
DEPTH_SCALING = 2.0
MIN_WIDTH = 8  # the sparse part's width: a power of two at least this
SPARSE_CACHE = 1024  # states whose sparse corrections a graph keeps (the latest walked)
CACHE_BYTES = 64 << 20  # a model's graph cache: the graphs of recent lists, in bytes


class ContextGraph:
    """Built once per phrase list, in time linear in its tokens, as flat arrays (a few dozen
    bytes a node, `nbytes` in all); any number of `Booster`s (streams) walk it. `max_tokens`:
    refuse a list whose sequences hold more tokens than that (MlxSpeechError), before
    building anything past it."""

    def __init__(self, token_ids: Iterable[list[int]], vocab_size: int,
                 context_score: float = CONTEXT_SCORE, depth_scaling: float = DEPTH_SCALING,
                 max_tokens: int | None = None):
        self.vocab_size = V = int(vocab_size)
        arcs: dict[int, int] = {}  # parent * V + token -> child (the build's only lookup)
        parent, token, level = [0], [-1], [0]
        ts, ns, end = [0.0], [0.0], [False]  # token score, node score, ends a phrase
        total = 0
        for tokens in token_ids:
            total += len(tokens)
            if max_tokens is not None and total > max_tokens:
                raise MlxSpeechError(f"hotwords: the phrases make more than {max_tokens} "
                                     "tokens for this model; use fewer or shorter phrases")
            node, last = 0, len(tokens) - 1
            for i, tok in enumerate(tokens):
                tok = int(tok)
                if not 0 <= tok < V:
                    raise MlxSpeechError(f"hotword token id {tok} outside the vocabulary")
                key = node * V + tok
                child = arcs.get(key)
                if child is None:  # NeMo: depth scaling only when a node is created
                    t = context_score * depth_scaling + math.log(i + 1) if i else context_score
                    child = arcs[key] = len(parent)
                    parent.append(node)
                    token.append(tok)
                    level.append(i + 1)
                    ts.append(t)
                    ns.append(ns[node] + t)
                    end.append(i == last)
                else:  # a shared node keeps the larger token score
                    ts[child] = max(context_score, ts[child])
                    ns[child] = ns[node] + ts[child]
                    end[child] = end[child] or i == last
                node = child
        n = len(parent)
        self.n_nodes = n - 1
        order = _by_level(level)
        fail = [0] * n
        for node in order:  # parents before children: Aho-Corasick's fail arcs, amortised
            if level[node] == 1:  # linear in the tokens (a fail arc climbs at most one level
                continue  # per token of its phrase)
            tok, f = token[node], fail[parent[node]]
            while True:
                c = arcs.get(f * V + tok)
                if c is not None:
                    fail[node] = c if c != node else 0
                    break
                if f == 0:
                    break
                f = fail[f]
        del arcs
        # children of each node, by token: a node's arcs are child_tok/child_id[start[n]:
        # start[n + 1]], sorted, found by binary search
        p = np.asarray(parent[1:], np.int64)
        t = np.asarray(token[1:], np.int64)
        by = np.lexsort((t, p))
        self.child_tok = t[by].astype(np.int32)
        self.child_id = (by + 1).astype(np.int32)
        self.start = np.zeros(n + 1, np.int64)
        np.cumsum(np.bincount(p, minlength=n), out=self.start[1:])
        self.token_score = np.asarray(ts, np.float64)
        self.node_score = np.asarray(ns, np.float64)
        self.is_end = np.asarray(end, bool)
        self.fail = np.asarray(fail, np.int32)
        self.root_scores = np.zeros(V, np.float32)
        r0, r1 = self.start[0], self.start[1]
        self.root_scores[self.child_tok[r0:r1]] = self.token_score[self.child_id[r0:r1]]
        # the sparse part's width: a bound on any state's corrections (the arcs on its
        # back-off chain below the root), counted in one pass, at most the vocabulary
        deg = np.diff(self.start)
        wide = [0] * n
        for node in order:
            wide[node] = int(deg[node]) + wide[fail[node]]
        widest = min(max(wide, default=0), V)
        self.width = MIN_WIDTH
        while self.width < widest:
            self.width *= 2
        self._sparse: OrderedDict[int, tuple[np.ndarray, np.ndarray]] = OrderedDict()

    @property
    def nbytes(self) -> int:
        """The graph's memory (its arrays; the corrections cache adds at most SPARSE_CACHE
        small entries)."""
        return sum(a.nbytes for a in (self.child_tok, self.child_id, self.start,
                                      self.token_score, self.node_score, self.is_end,
                                      self.fail, self.root_scores))

    def children(self, node: int) -> list[tuple[int, int]]:
        """(token, child) of each arc out of `node`, by token."""
        a, b = self.start[node], self.start[node + 1]
        return list(zip(self.child_tok[a:b].tolist(), self.child_id[a:b].tolist(),
                        strict=True))

    def _child(self, node: int, tok: int) -> int:
        a, b = int(self.start[node]), int(self.start[node + 1])
        if a == b:
            return -1
        k = a + int(np.searchsorted(self.child_tok[a:b], tok))
        return int(self.child_id[k]) if k < b and self.child_tok[k] == tok else -1

    def backoff(self, node: int) -> float:
        return 0.0 if self.is_end[node] else float(
            self.node_score[self.fail[node]] - self.node_score[node])

    def step(self, state: int, token: int) -> int:
        """The state after `token`: the first arc for it on the back-off chain."""
        node = state
        while True:
            child = self._child(node, token)
            if child >= 0:
                return child
            if node == 0:
                return 0
            node = int(self.fail[node])

    def score(self, state: int, token: int) -> float:
        """NeMo's boosting-tree score of `token` from `state` (back-offs included)."""
        node, acc = state, 0.0
        while True:
            child = self._child(node, token)
            if child >= 0:
                return acc + float(self.token_score[child])
            if node == 0:
                return acc
            acc += self.backoff(node)
            node = int(self.fail[node])

    def scores(self, state: int) -> np.ndarray:
        """Every token's score from `state` (for tests and references)."""
        return np.array([self.score(state, v) for v in range(self.vocab_size)], np.float32)

    def _corrections(self, state: int) -> tuple[np.ndarray, np.ndarray]:
        """(tokens, values): score(state, v) - const - root_scores[v] where nonzero; the
        states walked lately are kept (SPARSE_CACHE of them)."""
        got = self._sparse.get(state)
        if got is not None:
            self._sparse.move_to_end(state)
            return got
        chain, node = [], state
        while node != 0:
            chain.append(node)
            node = int(self.fail[node])
        total = sum(self.backoff(c) for c in chain)  # the constant: back-offs to the root
        seen: dict[int, float] = {}
        acc = 0.0
        for c in chain:
            for tok, child in self.children(c):
                if tok not in seen:
                    root = self._child(0, tok)
                    seen[tok] = (acc + float(self.token_score[child]) - total
                                 - (float(self.token_score[root]) if root >= 0 else 0.0))
            acc += self.backoff(c)
        toks = np.array([t for t, v in seen.items() if v], np.int32)
        vals = np.array([v for v in seen.values() if v], np.float32)
        got = self._sparse[state] = (toks, vals)
        if len(self._sparse) > SPARSE_CACHE:
            self._sparse.popitem(last=False)
        return got


def _by_level(level: list[int]) -> list[int]:
    """The non-root nodes in order of depth (a counting sort: linear)."""
    buckets: list[list[int]] = [[] for _ in range(max(level) + 1)]
    for node in range(1, len(level)):
        buckets[level[node]].append(node)
    return [node for b in buckets for node in b]


class Booster:
    """One stream's walk through a graph: `advance(token)` per emitted token; `sparse()`
    its padded corrections. `transparent(token)`: tokens that leave the state as it is
    (e.g. Voxtral's streaming pads and word markers)."""

    def __init__(self, graph: ContextGraph, alpha: float,
                 transparent: Callable[[int], bool] | None = None):
        self.graph, self.alpha, self.state = graph, float(alpha), 0
        self.transparent = transparent

    def advance(self, token: int) -> None:
        if self.transparent is not None and self.transparent(token):
            return
        if 0 <= token < self.graph.vocab_size:
            self.state = self.graph.step(self.state, token)

    def sparse(self, width: int) -> tuple[np.ndarray, np.ndarray]:
        """(idx, val) of length `width` (>= graph.width), alpha applied, zero-padded."""
        toks, vals = self.graph._corrections(self.state)
        idx = np.zeros(width, np.int32)
        val = np.zeros(width, np.float32)
        idx[: len(toks)] = toks
        val[: len(vals)] = vals * self.alpha
        return idx, val


class GraphCache:
    """The context graphs of one model's phrase lists, shared by its sessions: the lists used
    lately, up to `max_bytes` of graphs, and any graph still in use (held by a session or a
    caller) whatever its age. Thread-safe: a server builds a list's graph on a worker thread
    before the engine's thread makes sessions with it, and concurrent asks for one list
    build it once."""

    def __init__(self, max_bytes: int = CACHE_BYTES):
        self.max_bytes = max_bytes
        self._graphs: OrderedDict[tuple, ContextGraph] = OrderedDict()  # by last use
        self._bytes = 0
        self._live: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
        self._building: dict[tuple, threading.Event] = {}
        self._lock = threading.Lock()

    @property
    def nbytes(self) -> int:
        """The bytes of the graphs this cache keeps (graphs in use elsewhere not counted)."""
        return self._bytes

    def _keep(self, key: tuple, g: ContextGraph) -> None:
        if key not in self._graphs:
            self._bytes += g.nbytes
        self._graphs[key] = g
        self._graphs.move_to_end(key)
        self._live[key] = g
        while self._bytes > self.max_bytes and len(self._graphs) > 1:
            _, old = self._graphs.popitem(last=False)
            self._bytes -= old.nbytes

    def get(self, key: tuple, build: Callable[[], ContextGraph] | None) -> ContextGraph | None:
        """The graph of `key`, built with `build()` when neither kept nor in use (None: look
        only, None when absent). An exception from `build` reaches every caller waiting."""
        while True:
            with self._lock:
                g = self._graphs.get(key) or self._live.get(key)
                if g is not None:
                    self._keep(key, g)
                    return g
                if build is None:
                    return None
                wait = self._building.get(key)
                if wait is None:
                    done = self._building[key] = threading.Event()
            if wait is not None:  # someone builds it: theirs, once ready
                wait.wait()
                continue
            try:
                g = build()
                with self._lock:
                    self._keep(key, g)
                return g
            finally:
                with self._lock:
                    del self._building[key]
                done.set()
