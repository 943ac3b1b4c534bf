"""No zero-size array reaches an MLX kernel, in every family's streaming paths (ASR, TTS, duplex,
VAD, diarization).

On CUDA a launch over an empty grid kills the process (SIGFPE in Nemotron's batched step,
`cudaGraphAddKernelNode ... invalid argument` in Voxtral's encoder); the CPU backend returns
an empty array and says nothing. Under the `kernels` fixture (tests/support/kernel_watch.py) a
zero-size kernel input raises at the call: ragged feeds from 1 sample up, empty chunks,
`finish()` with nothing pending, single sessions and batched `feed_many` ticks with sessions
joining and leaving. Each run also checks its tokens against offline, so the early returns
that keep empty work away do not change results.
"""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from mlx_speech.models.nemotron_streaming import load as load_nemotron
from mlx_speech.nn import cache as nn_cache
from tests.conftest import speechlike
from tests.support.kernel_watch import EmptyKernelInput
from tests.support.numbers import assert_same_numbers

NEMOTRON = Path(__file__).parents[1] / "golden" / "nemotron"
RAGGED = [[1], [3], [17], [160], [1000], [1279, 3, 0, 5000], [12000]]  # 1000: live_turns


@pytest.fixture(scope="module")
def nm():
    return load_nemotron(NEMOTRON)


def _chunks(x: np.ndarray, sizes: list[int], limit: int | None = None):
    i, k = 0, 0
    while i < len(x) and (limit is None or k < limit):
        n = sizes[k % len(sizes)]
        yield x[i: i + n]
        i, k = i + n, k + 1


def _run_alone(owner, x, sizes, limit=None, **kw):
    s = owner.session(**kw)
    text = "".join(s.feed(c) for c in _chunks(x, sizes, limit))
    text += s.feed(np.zeros(0, np.float32))
    return s, text + s.finish()


def test_the_watch_catches_what_crashed_on_cuda(kernels):
    """The fixture raises on the forms the CUDA runs died on; non-empty work passes."""
    import mlx.nn as nn

    lin = nn.Linear(32, 24)
    lin(mx.zeros((1, 2, 32)))
    with pytest.raises(EmptyKernelInput, match="addmm"):
        lin(mx.zeros((1, 0, 32)))  # nemotron_streaming/step.py _step, 207 times per run
    with pytest.raises(EmptyKernelInput, match="pad"):
        mx.pad(mx.zeros((1, 0, 65, 8)), [(0, 0), (2, 0), (0, 0), (0, 0)])
    with pytest.raises(EmptyKernelInput, match="matmul"):
        _ = mx.zeros((2, 0)) @ mx.zeros((0, 3))
    with pytest.raises(EmptyKernelInput, match="concatenate"):
        mx.concatenate([mx.zeros((1, 2)), mx.zeros((1, 0))], axis=1)
    with pytest.raises(EmptyKernelInput, match="conv1d"):
        mx.conv1d(mx.zeros((1, 0, 4)), mx.zeros((4, 1, 4)))
    with pytest.raises(EmptyKernelInput, match="scaled_dot_product_attention"):
        q = mx.zeros((1, 2, 0, 8))
        mx.fast.scaled_dot_product_attention(q, q, q, scale=1.0)
    with pytest.raises(EmptyKernelInput, match="gather"):
        _ = mx.zeros((5, 3))[mx.zeros((0,), mx.int32)]
    assert ("addmm", ((24,), (1, 2, 32), (32, 24))) in kernels.calls


# -- Nemotron ------------------------------------------------------------------------

@pytest.mark.parametrize("latency_ms", [1120, 160, 80])
@pytest.mark.parametrize("sizes", RAGGED)
def test_nemotron_ragged_feeds(nm, kernels, latency_ms, sizes):
    """The SIGFPE in test_streaming_* and test_live_turns' [nm]: a feed that completes no
    encoder block ran the projector on (1, 0, 32); a feed shorter than the conv stem's
    window padded a (1, 0, 65, 8)."""
    x = speechlike(1.3, seed=len(sizes))
    limit = 600 if sizes == [1] else None  # one sample at a time: the first 600 feeds
    s, text = _run_alone(nm, x, sizes, limit, latency_ms=latency_ms)
    kernels.strict = False
    if limit is None:
        ref = nm.transcribe(x, latency_ms=latency_ms)
        assert s.token_ids == ref.token_ids and text == ref.text


def test_nemotron_finish_with_nothing_pending(nm, kernels):
    for n in (0, 1, 159, 160, 1280):  # no audio, less than a mel frame, whole frames
        s = nm.session(160)
        s.feed(np.zeros(n, np.float32))
        s.finish()
        assert s.finish() == ""  # a second finish is a no-op
    s = nm.session(80)
    for c in _chunks(speechlike(0.64), [1280]):
        s.feed(c)
    s.finish()


def test_nemotron_feed_many_joining_and_leaving(nm, kernels):
    """The SIGFPE in test_nemotron_feed_many_equals_alone: batched ticks with ragged feeds,
    empty chunks and members joining and leaving."""
    specs = [(speechlike(1.5, seed=1), [1280]), (speechlike(1.1, seed=2), [777, 3, 0]),
             (speechlike(0.9, seed=3), [17, 4000]), (speechlike(0.4, seed=4), [1])]
    sessions = [nm.session(160) for _ in specs]
    pos = [0] * len(specs)
    tick = 0
    while not all(s.finished for s in sessions):
        pairs = []
        for i, ((x, sizes), s) in enumerate(zip(specs, sessions, strict=True)):
            if s.finished or tick < i:  # joining one tick after another
                continue
            n = sizes[tick % len(sizes)] if sizes != [1] else 1 + 160 * (tick % 2)
            pairs.append((s, x[pos[i]: pos[i] + n]))
            pos[i] += n
        nm.feed_many(pairs)
        nm.finish_many([s for s, _ in pairs if pos[sessions.index(s)] >= len(
            specs[sessions.index(s)][0])])
        tick += 1
    kernels.strict = False
    for (x, _), s in zip(specs, sessions, strict=True):
        assert s.token_ids == nm.transcribe(x, latency_ms=160).token_ids


@pytest.fixture(scope="module")
def n35():
    return load_nemotron(NEMOTRON.parent / "nemotron35" / "tiny.nemo")


@pytest.mark.parametrize("sizes", [[1], [17], [1279, 3, 0, 5000]])
def test_nemotron35_languages_in_one_batch(n35, kernels, sizes):
    """Nemotron 3.5's language prompt (a one-hot per row joined to the frames) in ragged
    batched ticks: sessions of different languages, `auto` among them, 320 ms blocks."""
    x = speechlike(1.1, seed=7)
    langs = ["auto", "de", "fr-FR"]
    sessions = [n35.session(320, language=lang) for lang in langs]
    chunks = list(_chunks(x, sizes, 400 if sizes == [1] else None))
    for c in chunks:
        n35.feed_many([(s, c) for s in sessions])
    n35.finish_many(sessions)
    kernels.strict = False
    if sizes != [1]:
        for s, lang in zip(sessions, langs, strict=True):
            assert s.token_ids == n35.transcribe(x, latency_ms=320, language=lang).token_ids


# -- Voxtral Realtime ------------------------------------------------------------------

@pytest.mark.parametrize("sizes", RAGGED)
def test_voxtral_ragged_feeds(vr_model, kernels, sizes):
    x = speechlike(1.2, seed=len(sizes))
    limit = 600 if sizes == [1] else None
    s, text = _run_alone(vr_model, x, sizes, limit)
    kernels.strict = False
    if limit is None:
        assert s.token_ids == vr_model.transcribe(x).token_ids


def test_voxtral_finish_with_nothing_pending(vr_model, kernels):
    for n in (0, 1, 1280):
        s = vr_model.session()
        s.feed(np.zeros(n, np.float32))
        s.finish()
        assert s.finish() == ""


def test_voxtral_feed_many_joining_and_leaving(vr_model, kernels):
    """test_voxtral_feed_many_equals_alone's ticks (the CUDA run's `cudaGraphAddKernelNode`
    failure was raised there): sessions at different ring fills and delays, joining late,
    ragged and empty chunks."""
    specs = [(speechlike(1.6, seed=1), [1280], {}),
             (speechlike(1.0, seed=2), [777, 0, 3000], {"delay_ms": 160}),
             (speechlike(1.3, seed=3), [4000, 1, 2561], {"delay_ms": 960})]
    sessions = [vr_model.session(**kw) for _, _, kw in specs]
    pos = [0] * len(specs)
    for tick in range(40):
        pairs = []
        for i, ((x, sizes, _), s) in enumerate(zip(specs, sessions, strict=True)):
            if not s.finished and tick >= 2 * i:
                n = sizes[tick % len(sizes)]
                pairs.append((s, x[pos[i]: pos[i] + n]))
                pos[i] += n
        vr_model.feed_many(pairs)
        vr_model.finish_many([s for i, s in enumerate(sessions)
                              if not s.finished and pos[i] >= len(specs[i][0])])
    kernels.strict = False
    for (x, _, kw), s in zip(specs, sessions, strict=True):
        assert s.finished and s.token_ids == vr_model.transcribe(x, **kw).token_ids


# -- Moshi / Mimi, Voxtral TTS, Silero VAD -----------------------------------------------

def test_mimi_streams_frames_one_and_several_at_a_time(kernels):
    import json

    from mlx_speech.models import mimi
    from tests.support.mimi import FIXTURES
    from tests.support.mimi import GOLDEN as MIMI

    name, n_q = FIXTURES["24k"]
    cfg = json.loads((MIMI / f"{name}_config.json").read_text())
    model = mimi.load(MIMI / f"{name}.safetensors", config=cfg, num_codebooks=n_q)
    F = model.frame_size
    x = mx.array(0.1 * np.random.default_rng(0).standard_normal((2, 1, 6 * F)), mx.float32)
    st = model.make_state(2)
    for a, b in ((0, 1), (1, 3), (3, 4), (4, 6)):  # 1, 2, 1, 2 frames per step
        model.decode_step(model.encode_step(x[..., a * F: b * F], st), st)
        mx.eval(st.arrays())


def test_duplex_session_steps(kernels, tmp_path):
    import mlx_speech.models.moshi as moshi
    from tests.support.moshi import (
        DELAYS,
        build_random_lm,
        kyutai_weights,
        random_lm_kwargs,
        speech,
        write_folder,
    )

    kernels.strict = False  # building the random checkpoint is not under test
    kw = random_lm_kwargs(card=64, n_q=16, dep_q=8, delays=DELAYS)
    d = write_folder(tmp_path / "moshi", kw, kyutai_weights(build_random_lm(kw)))
    model = moshi.load(d)
    kernels.strict = True
    s = model.session(seed=1)
    x = speech(6 * s.frame_size)
    for i in range(6):  # the first steps run before the model's first complete frame
        s.step(x[i * s.frame_size: (i + 1) * s.frame_size])


def test_voxtral_tts_stream_and_codec_chunks(kernels):
    import mlx_speech.models.voxtral_tts as vt
    from mlx_speech.models.voxtral_tts.session import CodecStream
    from tests.support.voxtral import TTS_CKPT as CKPT
    from tests.support.voxtral import random_codes as _random_codes

    tts = vt.load(CKPT, dtype=mx.float32, alibi="mlxa")
    codes = _random_codes(9)
    for first, every in [(1, 1), (4, 3)]:
        s = CodecStream(tts.model.audio_tokenizer, first, every)
        for c in codes:
            s.push(c)
        s.flush()
        assert s.flush() is None  # nothing pending: no call
    for _ in tts.stream("Hello there.", max_frames=6):
        pass


def test_silero_vad_ragged_feeds_and_batches(kernels):
    from mlx_speech.audio.turns import TurnAudio, TurnDetector
    from mlx_speech.models.silero_vad import FRAME, VADState, load_vad, wheel_weights

    try:
        vad = load_vad(wheel_weights())
    except Exception as e:  # the wheel is optional outside CI (test_silero_vad.py)
        pytest.skip(str(e))
    x = speechlike(1.0)
    for sizes in RAGGED:
        audio, state = TurnAudio(TurnDetector()), vad.make_state(1)
        for c in _chunks(x, sizes, 600 if sizes == [1] else None):
            audio.push(c)
            _, state = audio.run_vad(vad, state)
    probs, st = vad(mx.zeros((2, 0)), vad.make_state(2))  # no frame: no call
    assert probs.shape == (2, 0)
    a, b = vad.make_state(1), vad.make_state(1)
    for k in (1, 3, 2):
        st = VADState.stack([a, b])
        _, st = vad(mx.array(np.stack([x[:k * FRAME], x[k * FRAME: 2 * k * FRAME]])), st)
        a, b = st.split()


# -- Streaming Sortformer (diarization) --------------------------------------------------

SORTFORMER = Path(__file__).parents[1] / "golden" / "sortformer" / "tiny.nemo"


@pytest.fixture(scope="module")
def diar():
    from mlx_speech.models import sortformer

    return sortformer.load(SORTFORMER)


@pytest.fixture(scope="module")
def voices():
    import soundfile as sf

    x, _ = sf.read(Path(__file__).parents[1] / "data" / "voices_3spk.wav", dtype="float32")
    return x


def _diarize_alone(diar, x, sizes, limit=None, **kw):
    """Frames from ragged feeds (the first `limit` of them, then the rest at once), an empty
    feed, finish, and a second finish."""
    s = diar.session(**kw)
    got, i = [], 0
    for c in _chunks(x, sizes, limit):
        got.append(s.feed(c))
        i += len(c)
    got += [s.feed(x[i:]), s.feed(np.zeros(0, np.float32)), s.finish()]
    assert s.finish().shape == (0, diar.n_speakers)  # nothing pending: no call
    return np.concatenate(got)


@pytest.mark.parametrize("sizes", RAGGED)
def test_sortformer_ragged_feeds(diar, voices, kernels, sizes):
    """A feed too short for a chunk and its right context runs nothing; the last chunk, any
    length down to one mel frame, is one step; results are offline's (the streaming
    algorithm over the whole recording in one feed)."""
    x = voices[: int(16000 * 3.3)]
    got = _diarize_alone(diar, x, sizes, 600 if sizes == [1] else None)
    assert kernels.shapes("conv2d") and kernels.shapes("scaled_dot_product_attention")
    kernels.strict = False
    assert_same_numbers(got, diar.probabilities(x))


@pytest.mark.parametrize("n", [0, 1, 159, 160, 400, 1280, 8 * 160 * 7 + 240])
def test_sortformer_finish_with_nothing_pending(diar, voices, kernels, n):
    """No audio, less than a mel frame, one frame, part of a chunk, exactly a chunk and its
    right context (so finish has nothing left to step)."""
    x = voices[16000: 16000 + n]
    got = _diarize_alone(diar, x, [n or 1])
    if n < 160:  # not a whole mel frame: no frames, no call
        assert got.shape == (0, diar.n_speakers) and not kernels.calls
    else:
        assert len(got) and kernels.shapes("conv2d")  # watched: the steps ran under the fixture
    off = diar.probabilities(x, streaming=False)  # NeMo's offline forward, as short
    assert off.shape[1] == diar.n_speakers and (len(off) > 0) == (n >= 160)
    kernels.strict = False
    assert_same_numbers(got, diar.probabilities(x))


@pytest.mark.parametrize("pad", [False, True])
def test_sortformer_feed_many_joining_and_leaving(diar, voices, kernels, monkeypatch, pad):
    """Batched ticks with ragged and empty chunks, sessions joining late and finishing early,
    one with other streaming parameters (stepped in its own group), with and without the GPU
    batch padding: every session's frames are what it gives alone."""
    monkeypatch.setattr(nn_cache, "FIXED_SHAPES", pad)
    specs = [(voices[: 16000 * 4], [1280], {}),
             (voices[8000: 16000 * 3], [777, 0, 3000], {}),
             (voices[16000 * 2: 16000 * 5], [17, 4000], {}),
             (voices[: 1000], [1], {}),
             (voices[16000: 16000 * 4], [2561, 0], dict(fifo_len=0, chunk_len=10,
                                                      spkcache_update_period=10))]
    sessions = [diar.session(**kw) for _, _, kw in specs]
    got = [[] for _ in specs]
    pos = [0] * len(specs)
    tick = 0
    while not all(s.finished for s in sessions):
        pairs, idx = [], []
        for i, ((x, sizes, _), s) in enumerate(zip(specs, sessions, strict=True)):
            if s.finished or tick < i:  # joining one tick after another
                continue
            n = sizes[tick % len(sizes)]
            pairs.append((s, x[pos[i]: pos[i] + n]))
            idx.append(i)
            pos[i] += n
        for i, p in zip(idx, diar.feed_many(pairs), strict=True):
            got[i].append(p)
        done = [i for i in idx if pos[i] >= len(specs[i][0])]
        for i, p in zip(done, diar.finish_many([sessions[i] for i in done]), strict=True):
            got[i].append(p)
        tick += 1
    batches = {s[0][0] for s in kernels.shapes("conv2d")}  # rows per step
    assert max(batches) >= 2 and (not pad or batches <= {1, 2, 4, 8})
    kernels.strict = False
    monkeypatch.setattr(nn_cache, "FIXED_SHAPES", False)
    for (x, _, kw), g in zip(specs, got, strict=True):
        s = diar.session(**kw)
        alone = np.concatenate([s.feed(x), s.finish()])
        assert_same_numbers(np.concatenate(g), alone, atol=1e-5)
