"""The engine's one job protocol, without a server: a kind is one class whose `step_many` gets
the live jobs of one model together, kinds step in phase order (a job submitted during a tick
steps in a later phase of the same tick), closed jobs are dropped; the diarizer stream is a
kind of its own (batched streams == the diarizer alone) and ends with its client."""

from __future__ import annotations

import asyncio
import io
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from mlx_speech.server.engine import Engine
from mlx_speech.server.jobs import AudioJob, BufferFull, DiarizerStream, Job
from tests.support.numbers import assert_same_numbers

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
        assert_same_numbers(_frames(e), diar.probabilities(audio[:n]))
    assert (max(eng.batch_sizes) > 1) == batch


def test_rest_diarization_ends_with_its_client(diar_audio):
    """An upload's diarizer stream, fed the upload's decoded blocks (`uploads.feed`), ends
    with its client: the feed cancelled and the job closed (as the route does when
    `while_connected` sees the client gone) while its first piece is in the model, the
    engine drops it without feeding the rest; uncancelled, its frames aligned to a
    transcript equal the library's."""
    from mlx_speech.diarize import FrameLog, diarize_result, from_frames
    from mlx_speech.models.asr import Transcript, Word
    from mlx_speech.server.uploads import QUEUE_S, feed, open_upload

    diar, audio = diar_audio
    buf = io.BytesIO()
    sf.write(buf, audio, 16000, format="WAV", subtype="FLOAT")  # the samples exactly
    data = buf.getvalue()
    eng = Engine().start()
    result = Transcript("a b", [], [Word("a", 0.5, 1.0), Word("b", 5.0, 5.5)])
    gate = threading.Event()
    real, fed = diar.feed_many, []

    def slow_feed(pairs):  # the first piece waits for the test: the job is mid-way
        fed.append(len(pairs))
        assert gate.wait(DEADLINE_S)
        return real(pairs)

    async def diarize(cancel: bool):
        up = await open_upload(io.BytesIO(data), "v.wav", len(data), 16000, 3600.0)
        events: list = []
        job = eng.submit(DiarizerStream(diar, events.append, max_samples=int(QUEUE_S * 16000)))
        feeder = asyncio.ensure_future(feed(up, 16000, [job]))
        if not cancel:
            await feeder
            t0 = time.monotonic()
            while not events or events[-1][0] != "done":
                assert time.monotonic() - t0 < DEADLINE_S
                await asyncio.sleep(0.01)
            return events
        t0 = time.monotonic()
        while not fed:  # the first piece is in the model
            assert time.monotonic() - t0 < DEADLINE_S
            await asyncio.sleep(0.01)
        feeder.cancel()  # the route's `finally`, the client gone (the feed may be done:
        job.close()  # the whole clip fits the job's queue)
        await asyncio.gather(feeder, return_exceptions=True)
        return events

    try:
        diar.feed_many = slow_feed
        asyncio.run(diarize(cancel=True))
        gate.set()
        t0 = time.monotonic()
        while eng.open_jobs:
            assert time.monotonic() - t0 < DEADLINE_S, "the gone client's job was kept"
            time.sleep(0.01)
        assert fed == [1]  # 10 s of audio, 2 s a tick: the rest was never fed
        del diar.feed_many
        events = asyncio.run(asyncio.wait_for(diarize(cancel=False), DEADLINE_S))
        frames = FrameLog(diar.n_speakers)
        for ev in events[:-1]:
            assert ev[0] == "frames"
            frames.add(ev[1])
        d = from_frames(result, frames.frames)
        want = diarize_result(result, audio, diar)
        np.testing.assert_array_equal(d.probs, want.probs)
        assert d.words == want.words and d.segments == want.segments
    finally:
        gate.set()
        diar.__dict__.pop("feed_many", None)
        eng.stop()
