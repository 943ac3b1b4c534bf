"""A stream calls attention and its caches with a small fixed set of shapes from its first
second on, however long it runs and whoever joins or leaves its batch (GPU backends build
kernels and graphs per shape; see tests/support/shape_watch.py)."""

from __future__ import annotations

import numpy as np
import pytest

import mlx_speech
from mlx_speech.nn import cache as nn_cache
from tests.conftest import make_voxtral_checkpoint, speechlike
from tests.support import mimi as mimi_helpers
from tests.support import moshi_transformer as tmt
from tests.support.shape_watch import ShapeWatch


@pytest.fixture
def shape_watch(monkeypatch) -> ShapeWatch:
    monkeypatch.setattr(nn_cache, "FIXED_SHAPES", True)  # the GPU default
    return ShapeWatch(monkeypatch)


@pytest.fixture(scope="module")
def vr_wide(tmp_path_factory):
    """The tiny model with windows that take a 200 s stream through every ring size."""
    return mlx_speech.load(make_voxtral_checkpoint(
        tmp_path_factory.mktemp("wide") / "m", "mistral", sliding_window=1000,
        **{"multimodal/whisper_model_args/encoder_args/sliding_window": 300}))


def _endless(s):
    s.eos = -1  # random weights may emit EOS; these tests need the whole stream
    return s


def test_voxtral_long_stream_uses_few_shapes(vr_wide, shape_watch):
    s = _endless(vr_wide.session())
    audio = speechlike(200.0, seed=3)
    first = None
    for i in range(0, len(audio), 16000):
        s.feed(audio[i: i + 16000])
        if i == 0:
            first = shape_watch.count()
    s.finish()
    assert len(s.token_ids) > 2400
    # decoder: prefill, then one query against 256, 512, 1024 slots and the capacity;
    # encoder: chunks of 1-16 tokens against 256 slots and the capacity
    # (1034 shapes before the rings were allocated in buckets)
    assert first <= 6 and shape_watch.count() <= 16, sorted(map(str, shape_watch.seen["attention"]))
    assert shape_watch.count("cache") <= 16
    # the full decoder ring is the window: its decode steps see every slot, no mask
    assert s.dec_cache[0].capacity == 1000
    assert any(a[1][0][2] == 1000 and dict(kw).get("mask") is None
               for a, kw in shape_watch.seen["attention"])


def test_voxtral_batch_joining_and_leaving_uses_few_shapes(vr_wide, shape_watch):
    """Sessions join and leave every few ticks: with batch sizes bucketed the shapes stay
    few; each session's tokens equal it run alone."""
    rng = np.random.default_rng(0)
    live, done, audios, tick = [], [], {}, 0
    while tick < 120:
        if tick % 7 == 0 and len(live) < 7:
            s = _endless(vr_wide.session(delay_ms=int(rng.choice([160, 480]))))
            audios[id(s)] = speechlike(float(rng.uniform(2, 6)), seed=tick)
            s.fed = 0
            live.append(s)
        pairs = []
        for s in live:
            n = int(rng.choice([1280, 2560, 640, 4000]))
            pairs.append((s, audios[id(s)][s.fed: s.fed + n]))
            s.fed += n
        vr_wide.feed_many(pairs)
        ending = [s for s in live if s.fed >= len(audios[id(s)])]
        if ending:
            vr_wide.finish_many(ending)
        live = [s for s in live if s not in ending]
        done += ending
        tick += 1
    if live:
        vr_wide.finish_many(live)
        done += live
    assert len(done) >= 12
    assert shape_watch.count() <= 40, sorted(map(str, shape_watch.seen["attention"]))  # 451 before
    shape_watch.reset()
    for s in done[:4]:
        ref = _endless(vr_wide.session(delay_ms=s.delay_ms))
        ref.feed(audios[id(s)])
        ref.finish()
        assert s.token_ids == ref.token_ids


@pytest.mark.parametrize("sizes", [[1280], [3, 5000, 1, 1279, 2561]])
def test_voxtral_fixed_shapes_keep_the_reference_tokens(vr_model, golden, monkeypatch, sizes):
    """The GPU's fixed shapes on the CPU: still the reference's tokens, streamed or not."""
    monkeypatch.setattr(nn_cache, "FIXED_SHAPES", True)
    audio, ref = golden["audio"], [int(t) for t in golden["tokens"]]
    assert vr_model.transcribe(audio).token_ids == ref
    s = vr_model.session()
    i = k = 0
    while i < len(audio):
        s.feed(audio[i: i + sizes[k % len(sizes)]])
        i, k = i + sizes[k % len(sizes)], k + 1
    s.finish()
    assert s.token_ids == ref


@pytest.fixture(scope="module")
def moshi_long(tmp_path_factory):
    """A Moshi-shaped random LM whose 40-position context a test crosses (24 kHz Mimi)."""
    import mlx_speech.models.moshi as moshi
    from tests.support.moshi import tiny_kyutai_moshi

    return moshi.load(tiny_kyutai_moshi(tmp_path_factory.mktemp("ml") / "moshi", context=40))


def test_moshi_long_session_uses_few_shapes(moshi_long, shape_watch):
    """LM ring, depformer ring, Mimi's encoder and decoder rings: the same few shapes from
    the ring filling on, over 90 frames that wrap every ring."""
    s = moshi_long.session()
    F = s.frame_size
    x = speechlike(90 * F / 16000, seed=5)  # its samples read as 24 kHz
    for i in range(90):
        s.step(x[i * F:(i + 1) * F])
        if i == 45:  # every ring has filled
            first = shape_watch.count()
    assert shape_watch.count() == first <= 6, sorted(map(str, shape_watch.seen["attention"]))


@pytest.mark.parametrize("case", tmt.CASES)
@pytest.mark.parametrize("chunk", [1, 2])
def test_moshi_transformer_fixed_shapes_match_torch_streaming(monkeypatch, case, chunk):
    monkeypatch.setattr(nn_cache, "FIXED_SHAPES", True)
    tmt.check_streaming_matches_torch_streaming(case, chunk)


@pytest.mark.parametrize("name", list(mimi_helpers.FIXTURES))
def test_mimi_fixed_shapes_match_torch_streaming(monkeypatch, name):
    monkeypatch.setattr(nn_cache, "FIXED_SHAPES", True)
    mimi_helpers.check_streaming_matches_torch_streaming(mimi_helpers.load_case(name))


def test_voxtral_tts_fixed_shapes_keep_the_codes_with_few_shapes(monkeypatch):
    """The TTS backbone's growing cache: every frame against 256 slots (one shape) instead
    of one shape per frame, and mlx-audio's codes unchanged."""
    import mlx.core as mx

    import mlx_speech.models.voxtral_tts as vt
    from tests.support.voxtral import TTS_CKPT as CKPT
    from tests.support.voxtral import TTS_GOLDEN as GOLDEN

    g = dict(np.load(GOLDEN / "golden.npz"))
    tts = vt.load(CKPT, dtype=mx.float32, alibi="mlxa")
    watch = ShapeWatch(monkeypatch)
    monkeypatch.setattr(nn_cache, "FIXED_SHAPES", True)
    args = str(g["text"]), str(g["voice"]), int(g["seed"])
    np.testing.assert_array_equal(tts.codes(*args, len(g["codes"])), g["codes"])
    watch.reset()
    codes = tts.codes(*args, 40)
    backbone = {s for s in watch.seen["attention"] if s[0][1][0][2] >= 256}
    assert len(codes) > 20 and len(backbone) == 2  # the prompt, then every frame
    monkeypatch.setattr(nn_cache, "FIXED_SHAPES", False)
    watch.reset()
    np.testing.assert_array_equal(tts.codes(*args, 40), codes)
    assert len(watch.seen["attention"]) > len(codes)  # one shape per frame on the CPU


def test_voxtral_batched_reanchoring_with_fixed_shapes(tmp_path, vr_model, gpu_rope,
                                                       monkeypatch):
    """Rows re-anchoring at different steps, in batches padded to powers of two (pad rows
    clone a clock), under the GPU's rope arithmetic: the tokens of each row alone."""
    from tests.support.voxtral import check_batched_reanchoring

    monkeypatch.setattr(nn_cache, "FIXED_SHAPES", True)
    check_batched_reanchoring(tmp_path, vr_model)


def test_voxtral_tts_sessions_joining_and_leaving_use_few_shapes(shape_watch):
    """Speech sessions join every 3 frames and end at their own END or cap: with batch sizes,
    prompt lengths and cache slots bucketed, the backbone, the flow head and the codec call
    attention with a few shapes (157 with the CPU's shapes)."""
    from tests.support.voxtral import TTS_TEXTS, TTS_VOICES, load_ending_tts

    tts = load_ending_tts()
    sessions, tick = [], 0
    while tick < 200:
        if tick % 3 == 0 and tick < 60:
            s = tts.session(voice=TTS_VOICES[tick % 2], seed=tick, max_frames=30,
                            chunk_frames=8)
            s.feed(TTS_TEXTS[tick % 4])
            s.finish()
            sessions.append(s)
        live = [s for s in sessions if not s.done]
        if not live and tick > 60:
            break
        tts.step_many(live)
        tick += 1
    batches = {a[0][0][0][0] for a in shape_watch.seen["attention"]}
    assert max(batches) == 32  # 16 flow-head rows (cond and uncond) of 9 to 16 sessions
    assert shape_watch.count() <= 32, sorted(map(str, shape_watch.seen["attention"]))
