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
from collections import deque
from collections.abc import Callable, Iterable

import numpy as np

from ..errors import MlxSpeechError
from .vocabulary import DEFAULT_BOOST, check_boost  # noqa: F401 (re-exported)
from .vocabulary import phrases as parse_hotwords  # noqa: F401 (re-exported)

CONTEXT_SCORE = 1.0  # NeMo's BoostingTreeModelConfig defaults (RNN-T / TDT / CTC)
DEPTH_SCALING = 2.0
MIN_WIDTH = 8  # the sparse part's width: a power of two at least this


class _Node:
    __slots__ = ("token_score", "node_score", "is_end", "level", "next", "fail", "id")

    def __init__(self, token_score: float, node_score: float, is_end: bool, level: int):
        self.token_score, self.node_score = token_score, node_score
        self.is_end, self.level = is_end, level
        self.next: dict[int, _Node] = {}
        self.fail: _Node | None = None
        self.id = -1


class ContextGraph:
    """Built once per phrase list; any number of `Booster`s (streams) walk it."""

    def __init__(self, token_ids: Iterable[list[int]], vocab_size: int,
                 context_score: float = CONTEXT_SCORE, depth_scaling: float = DEPTH_SCALING):
        self.vocab_size = vocab_size
        self.root = _Node(0.0, 0.0, False, 0)
        self.root.fail = self.root
        n = 0
        for tokens in token_ids:
            node = self.root
            for i, tok in enumerate(tokens):
                if not 0 <= tok < vocab_size:
                    raise MlxSpeechError(f"hotword token id {tok} outside the vocabulary")
                is_end = i == len(tokens) - 1
                child = node.next.get(tok)
                if child is None:  # NeMo: depth scaling only when a node is created
                    ts = context_score * depth_scaling + math.log(i + 1) if i else context_score
                    child = node.next[tok] = _Node(ts, node.node_score + ts, is_end, i + 1)
                    n += 1
                else:  # a shared node keeps the larger token score
                    child.token_score = max(context_score, child.token_score)
                    child.node_score = node.node_score + child.token_score
                    child.is_end = child.is_end or is_end
                node = child
        self.n_nodes = n
        self._fill_fail()
        self.nodes = self._number()
        self.root_scores = np.zeros(vocab_size, np.float32)
        for tok, child in self.root.next.items():
            self.root_scores[tok] = child.token_score
        self._sparse: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self.width = MIN_WIDTH
        widest = max((len(self._corrections(s)[0]) for s in range(len(self.nodes))), default=0)
        while self.width < widest:
            self.width *= 2

    def _fill_fail(self) -> None:
        queue = deque()
        for child in self.root.next.values():
            child.fail = self.root
            queue.append(child)
        while queue:
            cur = queue.popleft()
            for tok, child in cur.next.items():
                fail = cur.fail
                while tok not in fail.next and fail is not self.root:
                    fail = fail.fail
                child.fail = fail.next[tok] if tok in fail.next and fail.next[tok] is not child \
                    else self.root
                queue.append(child)

    def _number(self) -> list[_Node]:
        nodes, queue = [], deque([self.root])
        while queue:
            node = queue.popleft()
            node.id = len(nodes)
            nodes.append(node)
            queue.extend(node.next.values())
        return nodes

    @staticmethod
    def backoff(node: _Node) -> float:
        return 0.0 if node.is_end else node.fail.node_score - node.node_score

    def step(self, state: int, token: int) -> int:
        """The state after `token`: the first arc for it on the back-off chain."""
        node = self.nodes[state]
        while True:
            child = node.next.get(token)
            if child is not None:
                return child.id
            if node is self.root:
                return 0
            node = node.fail

    def score(self, state: int, token: int) -> float:
        """NeMo's boosting-tree score of `token` from `state` (back-offs included)."""
        node, acc = self.nodes[state], 0.0
        while True:
            child = node.next.get(token)
            if child is not None:
                return acc + child.token_score
            if node is self.root:
                return acc
            acc += self.backoff(node)
            node = node.fail

    def scores(self, state: int) -> np.ndarray:
        """Every token's score from `state` (for tests and references)."""
        return np.array([self.score(state, v) for v in range(self.vocab_size)], np.float32)

    def _corrections(self, state: int) -> tuple[np.ndarray, np.ndarray]:
        """(tokens, values): score(state, v) - const - root_scores[v] where nonzero."""
        got = self._sparse.get(state)
        if got is None:
            chain, node = [], self.nodes[state]
            while node is not self.root:
                chain.append(node)
                node = node.fail
            total = sum(self.backoff(n) for n in chain)  # the constant: back-offs to the root
            seen: dict[int, float] = {}
            acc = 0.0
            for n in chain:
                for tok, child in n.next.items():
                    if tok not in seen:
                        root = self.root.next.get(tok)
                        seen[tok] = acc + child.token_score - total - (
                            root.token_score if root is not None else 0.0)
                acc += self.backoff(n)
            toks = np.array([t for t, v in seen.items() if v], np.int32)
            vals = np.array([v for v in seen.values() if v], np.float32)
            got = self._sparse[state] = (toks, vals)
        return got


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
    """The graphs of recent phrase lists of one model (a server's sessions share them)."""

    def __init__(self, size: int = 16):
        self.size, self._graphs = size, {}

    def get(self, key: tuple, build: Callable[[], ContextGraph]) -> ContextGraph:
        g = self._graphs.pop(key, None)
        if g is None:
            g = build()
        self._graphs[key] = g
        while len(self._graphs) > self.size:
            self._graphs.pop(next(iter(self._graphs)))
        return g
