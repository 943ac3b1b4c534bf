"""The one batched stepper (mlx_speech/models/stepper.py): grouping, padding to the fixed set of
batch sizes under the one switch (nn.cache.FIXED_SHAPES, on and off), gathering per-stream
state into a batch and scattering it back, and that nothing zero-size reaches a kernel."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from mlx_speech.models import stepper as stepper_mod
from mlx_speech.models.stepper import Batch, Stepper, batch_size, chunk_size, grouped
from mlx_speech.nn import cache as nn_cache


@pytest.fixture(params=[False, True], ids=["exact", "fixed"])
def fixed(request, monkeypatch):
    monkeypatch.setattr(nn_cache, "FIXED_SHAPES", request.param)
    return request.param


def test_sizes_follow_the_one_switch(fixed):
    rows = [batch_size(n) for n in range(1, 10)]
    chunks = [chunk_size(n) for n in range(1, 10)]
    if fixed:
        assert rows == [1, 2, 4, 4, 8, 8, 8, 8, 16]
        assert chunks == [1, 2, 2, 4, 4, 4, 4, 8, 8]
    else:
        assert rows == chunks == list(range(1, 10))


def test_padding_rows_repeat_the_first_stream(fixed):
    b = Batch(["a", "b", "c"])
    assert (b.n, b.size) == (3, 4 if fixed else 3)
    assert b.rows == (["a", "b", "c", "a"] if fixed else ["a", "b", "c"])
    assert b.padded(["a", "b", "c"]) == b.rows and b.padded([7, 8, 9])[3:] == ([7] if fixed else [])
    a = mx.arange(6).reshape(3, 2)
    np.testing.assert_array_equal(np.array(b.pad(a)), np.array(a)[[0, 1, 2, 0][: b.size]])
    host = b.stack_host([np.full((2,), i, np.float32) for i in range(3)], mx.float16)
    assert host.dtype == mx.float16 and host.shape == (b.size, 2)
    assert np.array(host)[-1, 0] == (0 if fixed else 2)


def test_bad_batches_are_refused():
    with pytest.raises(ValueError, match="at least one"):
        Batch([])
    with pytest.raises(ValueError, match="cannot run as"):
        Batch(["a", "b"], size=1)
    with pytest.raises(ValueError, match="items for a batch"):
        Batch(["a", "b"]).padded([1])


def test_gather_scatter_round_trip(fixed):
    """Rows stacked (a fresh stream's None as zeros), stepped, and scattered back: each
    stream gets its own row, whatever the padding."""
    rng = np.random.default_rng(0)
    own = [mx.array(rng.standard_normal((1, 3, 2)).astype(np.float32)) for _ in range(4)]
    states = [own[0], None, own[2], own[3], None]
    b = Batch(states)
    stacked = b.stack(states)
    assert stacked.shape == (b.size, 3, 2)
    want = np.concatenate([np.array(a) if a is not None else np.zeros((1, 3, 2), np.float32)
                           for a in states])
    np.testing.assert_array_equal(np.array(stacked)[:5], want)
    np.testing.assert_array_equal(np.array(stacked)[5:], np.repeat(want[:1], b.size - 5, 0))
    back = b.rows_of(stacked * 2)
    assert len(back) == 5 and all(r.shape == (1, 3, 2) for r in back)
    for r, w in zip(back, want, strict=True):
        np.testing.assert_array_equal(np.array(r)[0], 2 * w)
    assert b.stack([None] * 5) is None and b.rows_of(None) == [None] * 5


def test_a_batch_of_one_is_the_stream_itself(fixed):
    a = mx.ones((1, 4))
    b = Batch(["only"])
    assert b.size == 1 and b.stack([a]) is a and b.rows_of(a)[0] is a and b.pad(a) is a


def test_grouping_keeps_first_seen_order():
    items = [("s1", 3), ("s2", 5), ("s3", 3), ("s4", 1), ("s5", 5)]
    assert grouped(items, lambda s, it: it) == [[("s1", 3), ("s3", 3)],
                                                [("s2", 5), ("s5", 5)], [("s4", 1)]]
    assert grouped(items, None) == [items]
    assert grouped([], None) == []


class Stream:
    """A toy stream: a queue of (T, 2) chunks, a running sum as its state (None: fresh)."""

    def __init__(self, chunks):
        self.queue = list(chunks)
        self.total: mx.array | None = None


def _toy(fixed: bool):
    seen = []

    def step(batch: Batch[Stream], chunks: list[np.ndarray]):
        seen.append((batch.n, batch.size, chunks[0].shape[0]))
        x = batch.stack_host(chunks).sum(axis=1, keepdims=True)  # (size, 1, 2)
        prev = batch.stack([s.total for s in batch.streams])
        total = x if prev is None else prev + x
        for s, t in zip(batch.streams, batch.rows_of(total), strict=True):
            s.total = t
        return [float(t.sum()) for t in batch.rows_of(total)]

    return Stepper(step, key=lambda s, chunk: chunk.shape[0]), seen


def test_rounds_group_pad_and_equal_alone(fixed, kernels):
    """Streams with different chunk lengths step in groups per round; streams with nothing
    left are not stepped; every stream ends as it ends stepped alone. Under the kernel watch:
    fresh states, padding rows and idle streams never hand a kernel a zero-size array."""
    rng = np.random.default_rng(1)

    def chunks(lengths):
        return [rng.standard_normal((t, 2)).astype(np.float32) for t in lengths]

    plans = [[2, 2, 2], [2, 3], [3], [], [2, 2, 2, 2, 2]]
    data = [chunks(p) for p in plans]
    streams = [Stream(d) for d in data]
    st, seen = _toy(fixed)
    out = st.run(streams, lambda s: s.queue.pop(0) if s.queue else None)
    # round 0: lengths 2 (3 streams) and 3 (1); round 1: 2 (2) and 3 (1); rounds 2-4: 2
    want_groups = [(3, 2), (1, 3), (2, 2), (1, 3), (2, 2), (1, 2), (1, 2)]
    assert [(n, t) for n, _, t in seen] == want_groups
    assert all(size == (batch_size(n)) for n, size, _ in seen)
    assert fixed == any(size > n for n, size, _ in seen)
    assert st.steps == len(want_groups) and out[id(streams[3])] == []
    assert [len(out[id(s)]) for s in streams] == [len(p) for p in plans]
    kernels.strict = False
    for s, d in zip(streams, data, strict=True):
        alone, _ = _toy(fixed)
        ref = Stream(d)
        got = alone.run([ref], lambda s: s.queue.pop(0) if s.queue else None)[id(ref)]
        assert got == out[id(s)]
        if d:
            np.testing.assert_array_equal(np.array(s.total), np.array(ref.total))
        else:
            assert s.total is None


def test_no_work_no_step(kernels):
    st, seen = _toy(False)
    streams = [Stream([]), Stream([])]
    assert st.run(streams, lambda s: None) == {id(s): [] for s in streams}
    assert st.run([], lambda s: 1) == {}
    assert not seen and not kernels.calls and st.steps == 0


def test_cache_is_cleared_every_few_hundred_steps(monkeypatch):
    cleared = []
    monkeypatch.setattr(stepper_mod, "CLEAR_CACHE_EVERY", 3)
    monkeypatch.setattr(mx, "clear_cache", lambda: cleared.append(1))
    st = Stepper(lambda batch, items: [None] * batch.n)
    s = Stream([0] * 7)
    st.run([s], lambda s: s.queue.pop() if s.queue else None)
    assert st.steps == 7 and len(cleared) == 2
