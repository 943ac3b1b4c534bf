"""The context graph's bounds (issue 31): built in time linear in its tokens, at most
MAX_GRAPH_TOKENS per list (refused before the rest is read), a model's cache bounded by
bytes, graphs in use found again without a rebuild, one build for concurrent asks. (Its
scores against NeMo's boosting tree: tests/models/test_boosting.py.)"""

from __future__ import annotations

import threading

import numpy as np
import pytest

from mlx_speech.errors import MlxSpeechError
from mlx_speech.models.asr import make_booster
from mlx_speech.text.context_graph import ContextGraph, GraphCache
from mlx_speech.text.vocabulary import MAX_GRAPH_TOKENS, Vocabulary


def _graph(seed: int, n: int = 200, vocab: int = 64) -> ContextGraph:
    rng = np.random.default_rng(seed)
    return ContextGraph([list(rng.integers(0, vocab, 5)) for _ in range(n)], vocab)


def test_the_token_bound_refuses_before_reading_the_rest():
    read = []

    def sequences():
        for i in range(10**6):
            read.append(i)
            yield [i % 50, (i * 7) % 50, 3]

    with pytest.raises(MlxSpeechError, match=f"more than {MAX_GRAPH_TOKENS} tokens"):
        ContextGraph(sequences(), 64, max_tokens=MAX_GRAPH_TOKENS)
    assert len(read) == MAX_GRAPH_TOKENS // 3 + 1  # the first list past the bound, no more


def test_make_booster_dedupes_in_linear_time_and_bounds_the_tokens():
    """Old: each tokenization was looked up in the list of those kept (`ids not in seqs`),
    quadratic in the phrases. Now by hash: no list comparison at all."""
    compared = [0]

    class Ids(list):
        def __eq__(self, other):
            compared[0] += 1
            return list.__eq__(self, other)

        __hash__ = None

    phrases = tuple(f"w{i}" for i in range(3000))
    codes = {p: Ids([1 + i % 30, 1 + (i // 30) % 30, 1 + i // 900]) for i, p in
             enumerate(phrases)}
    walk = make_booster(GraphCache(), Vocabulary(phrases), 64, lambda p: [codes[p], codes[p]])
    assert compared[0] == 0
    assert walk.graph.n_nodes > 3000  # every distinct tokenization went in
    def spelled(p):  # two distinct tokenizations (3 and 4 tokens) per phrase
        i = int(p[1:])
        ids = [1 + i % 60, 1 + (i // 60) % 60, 1 + (i // 3600) % 60]
        return [ids, [63, *ids[::-1]]]

    big = tuple(f"x{i}" for i in range(MAX_GRAPH_TOKENS // 7 + 10))
    with pytest.raises(MlxSpeechError, match="tokens"):
        make_booster(GraphCache(), Vocabulary(big), 64, spelled)


def test_the_cache_is_bounded_by_bytes_and_keeps_graphs_in_use():
    size = _graph(0).nbytes  # each graph here is about this big
    cache = GraphCache(max_bytes=int(2.5 * size))
    builds = []

    def build(i):
        def make():
            builds.append(i)
            return _graph(i)
        return make

    held = cache.get(("a",), build(0))  # held by the caller (a session) from here on
    for i in range(1, 6):
        cache.get((str(i),), build(i))
    assert cache.nbytes <= cache.max_bytes and builds == [0, 1, 2, 3, 4, 5]
    assert cache.get(("a",), build(0)) is held and builds[-1] == 5  # in use: no rebuild
    assert cache.get(("1",), None) is None  # evicted and used by nobody: gone
    assert cache.get(("5",), None) is not None  # the latest are kept


def test_concurrent_asks_for_one_list_build_it_once():
    cache = GraphCache()
    started, release, builds = threading.Event(), threading.Event(), []

    def slow():
        builds.append(1)
        started.set()
        assert release.wait(30)
        return _graph(9)

    got = []
    threads = [threading.Thread(target=lambda: got.append(cache.get(("k",), slow)))
               for _ in range(4)]
    threads[0].start()
    assert started.wait(30)
    for t in threads[1:]:
        t.start()
    release.set()
    for t in threads:
        t.join(30)
    assert builds == [1] and len(got) == 4 and all(g is got[0] for g in got)


def test_a_failed_build_reaches_every_asker_and_is_retried():
    cache = GraphCache()

    def bad():
        raise MlxSpeechError("no")

    for _ in range(2):
        with pytest.raises(MlxSpeechError):
            cache.get(("k",), bad)
    assert cache.get(("k",), lambda: _graph(1)) is not None


def test_width_bounds_every_state_and_the_graph_is_small():
    g = _graph(3, n=2000)
    widest = max(len(g._corrections(s)[0]) for s in range(g.n_nodes + 1))
    assert widest <= g.width <= 64
    assert g.nbytes < 64 * (g.n_nodes + 1) + 64 * 4 + 1024  # tens of bytes a node
