"""The engine's one job protocol, without a server: a kind is one class whose `step_many` gets
the live jobs of one model together, kinds step in phase order (a job submitted during a tick
steps in a later phase of the same tick), closed jobs are dropped; the diarizer stream is a
kind of its own (batched streams == the diarizer alone) and ends with its client."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import soundfile as sf

from mlx_speech.server.engine import Engine
from mlx_speech.server.jobs import AudioJob, BufferFull, DiarizerStream, Job

DATA = Path(__file__).parents[1] / "data"
NEMO = Path(__file__).parents[1] / "golden" / "sortformer" / "tiny.nemo"
DEADLINE_S = 60.0


class Later(Job):
    """A kind of the last phase: records each step's group."""

    phase = 9
    log: list = []

    @classmethod
    def step_many(cls, engine, jobs):
        cls.log.append(("later", [j.name for j in jobs]))
        return True


class Sum(AudioJob):
    """A new kind in one class: audio in, per tick one ("sum", total) per job of a group, the
    group's model called once; a job may submit a Later job mid-tick."""

    log: list = []

    def __init__(self, model, sink, name, spawn=False):
        super().__init__(model, sink, max_samples=1000)
        self.name, self.spawn = name, spawn

    def start(self):
        self.log.append(("start", self.name))

    @classmethod
    def step_many(cls, engine, jobs):
        ready = [j for j in jobs if j.input.pending]
        if not ready:
            return False
        totals = jobs[0].model([j.input.take(1000) for j in ready])  # one call a group
        cls.log.append(("sum", [j.name for j in ready]))
        for j, t in zip(ready, totals, strict=True):
            j.emit(("sum", t))
            if j.spawn:
                j.spawn = False
                later = engine.submit(Later(None, j.sink))
                later.name = j.name + "'"
        return True


def test_a_new_kind_is_one_class_stepped_per_model_and_phase():
    calls = []

    def model(xs):
        calls.append(len(xs))
        return [float(x.sum()) for x in xs]

    other = lambda xs: model(xs)  # noqa: E731 - a second model: its own group
    other.sample_rate = model.sample_rate = 16000
    eng = Engine()  # not started: this thread steps it
    Sum.log.clear()
    Later.log.clear()
    got = []
    a = eng.submit(Sum(model, got.append, "a", spawn=True))
    b = eng.submit(Sum(model, got.append, "b"))
    c = eng.submit(Sum(other, got.append, "c"))
    for j in (a, b, c):
        j.push(np.ones(10, np.float32))
    assert eng.open_jobs == 3
    assert eng.step()
    assert Sum.log == [("start", "a"), ("start", "b"), ("start", "c"),
                       ("sum", ["a", "b"]), ("sum", ["c"])]
    assert calls == [2, 1]  # one call per model
    assert Later.log == [("later", ["a'"])]  # submitted mid-tick, stepped this tick
    assert sorted(got) == [("sum", 10.0)] * 3
    b.close()
    a.push(np.ones(3, np.float32))
    with pytest.raises(BufferFull):  # closed: refuses audio
        b.push(np.ones(3, np.float32))
    assert eng.step()
    assert Sum.log[-1] == ("sum", ["a"]) and eng.open_jobs == 3  # a, c and a' (b dropped)
    eng2 = Engine(batch=False)  # one job at a time: the kinds that batch ask engine.batches
    assert eng2.batches([1, 2]) == [[1], [2]] and eng.batches([1, 2]) == [[1, 2]]
    assert eng.batches([]) == []


@pytest.fixture(scope="module")
def diar_audio():
    """The tiny Sortformer and the three-voice recording."""
    import mlx_speech

    return mlx_speech.load(NEMO), sf.read(DATA / "voices_3spk.wav", dtype="float32")[0]


def _frames(events) -> np.ndarray:
    assert events[-1] == ("done",)
    parts = [e[1] for e in events[:-1]]
    assert all(e[0] == "frames" and len(e[1]) for e in events[:-1])
    return np.concatenate(parts)


@pytest.mark.parametrize("batch", [True, False])
def test_diarizer_streams_batched_equal_the_diarizer_alone(diar_audio, batch):
    diar, audio = diar_audio
    eng = Engine(batch=batch)
    cuts = (len(audio), len(audio) // 3)
    evs = [[], []]
    jobs = [eng.submit(DiarizerStream(diar, evs[i].append)) for i in range(2)]
    for j, n in zip(jobs, cuts, strict=True):
        j.push(audio[:n])  # several ticks of MAX_FEED_S each, the two together
        j.end()
    for _ in range(100):
        if not eng.step():
            break
    assert eng.open_jobs == 0
    for e, n in zip(evs, cuts, strict=True):
        np.testing.assert_array_equal(_frames(e), diar.probabilities(audio[:n]))
    assert (max(eng.batch_sizes) > 1) == batch


def test_rest_diarization_ends_with_its_client(diar_audio):
    """`diarize_upload` cancelled (the client left, as `while_connected` cancels it) while
    its first piece is in the model: its diarizer stream is closed and the engine drops it
    without feeding the rest; uncancelled, it equals the library."""
    from mlx_speech.diarize import diarize_result
    from mlx_speech.models.asr import Transcript, Word
    from mlx_speech.server.diarization import diarize_upload

    diar, audio = diar_audio
    eng = Engine().start()
    served = SimpleNamespace(engine=eng, diarizer=diar)
    result = Transcript("a b", [], [Word("a", 0.5, 1.0), Word("b", 5.0, 5.5)])
    gate = threading.Event()
    real, fed = diar.feed_many, []

    def slow_feed(pairs):  # the first piece waits for the test: the job is mid-way
        fed.append(len(pairs))
        assert gate.wait(DEADLINE_S)
        return real(pairs)

    try:
        async def cancelled():
            task = asyncio.ensure_future(diarize_upload(served, audio, result))
            t0 = time.monotonic()
            while not fed:  # the first piece is in the model
                assert time.monotonic() - t0 < DEADLINE_S
                await asyncio.sleep(0.01)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

        diar.feed_many = slow_feed
        asyncio.run(cancelled())
        gate.set()
        t0 = time.monotonic()
        while eng.open_jobs:
            assert time.monotonic() - t0 < DEADLINE_S, "the gone client's job was kept"
            time.sleep(0.01)
        assert fed == [1]  # 10 s of audio, 2 s a tick: the rest was never fed
        del diar.feed_many
        d = asyncio.run(asyncio.wait_for(diarize_upload(served, audio, result), DEADLINE_S))
        want = diarize_result(result, audio, diar)
        np.testing.assert_array_equal(d.probs, want.probs)
        assert d.words == want.words and d.segments == want.segments
    finally:
        gate.set()
        diar.__dict__.pop("feed_many", None)
        eng.stop()
