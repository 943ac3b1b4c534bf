"""Many voices stepped together: each prompt's codes and each session's audio equal it alone,
for batches of 1 to 16 that grow and shrink at any frame, under the kernel watch, with the
GPU's fixed shapes and without; the frame step as a function of explicit state compiles."""

from __future__ import annotations

import functools

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten

from mlx_speech.errors import MlxSpeechError
from mlx_speech.models.voxtral_tts import step as st
from mlx_speech.nn import cache as nn_cache
from mlx_speech.nn import compiled
from tests.support.numbers import same_numbers
from tests.support.voxtral import TTS_TEXTS as TEXTS
from tests.support.voxtral import TTS_VOICES as VOICES
from tests.support.voxtral import joined, spoken_alone
from tests.support.voxtral import load_ending_tts as load_ending


@pytest.fixture(scope="module")
def tts():
    return load_ending()


@pytest.fixture(params=[False, True], ids=["cpu-shapes", "fixed-shapes"])
def fixed(request, monkeypatch):
    monkeypatch.setattr(nn_cache, "FIXED_SHAPES", request.param)
    return request.param


def _prompt(tts, i: int) -> mx.array:
    return tts.prompt(TEXTS[i % 4], VOICES[i % 2])


def test_tracks_batched_equal_alone_with_joins_and_leaves(tts, fixed, kernels):
    """16 prompts join four per frame, end at their own END or cap, two leave early: every
    frame of every prompt has the codes it has alone, whatever the batch (1 to 16 rows)."""
    alone = [np.stack(list(st.frame_codes(tts.model, _prompt(tts, i), 40, seed=i)))
             for i in range(16)]
    tracks = [st.Track(_prompt(tts, i), 40, seed=i) for i in range(16)]
    got: list[list[np.ndarray]] = [[] for _ in tracks]
    leave = {5: 10, 9: 20}  # track -> the frame it leaves at
    sizes, tick = [], 0
    while True:
        live = [i for i, t in enumerate(tracks) if i // 4 <= tick and not t.done
                and leave.get(i, 10**9) > tick]
        if not live and tick > 3:
            break
        st.start_tracks(tts.model, [tracks[i] for i in live if tracks[i].home is None])
        sizes.append(sum(tracks[i].live for i in live))
        for i, c in zip(live, st.step_tracks(tts.model, [tracks[i] for i in live]),
                        strict=True):
            if c is not None:
                got[i].append(c)
        tick += 1
    assert 16 in sizes and len(set(sizes)) >= 8, sizes
    ends = [len(a) for a in alone]
    assert min(ends) < 10 and 40 in ends  # some stop at END, some run to the cap
    for i, (a, g) in enumerate(zip(alone, got, strict=True)):
        n = min(len(a), leave[i] - i // 4 - 1) if i in leave else len(a)
        assert len(g) == n and np.array_equal(np.stack(g[:n]), a[:n]), i


def test_fixed_shapes_keep_the_codes(tts, monkeypatch):
    """Padded prompts, padded batches and masked cache slots: the same codes."""
    ref = [tts.codes(TEXTS[i], VOICES[i % 2], seed=i, max_frames=30) for i in range(4)]
    monkeypatch.setattr(nn_cache, "FIXED_SHAPES", True)
    for i in range(4):
        np.testing.assert_array_equal(tts.codes(TEXTS[i], VOICES[i % 2], seed=i,
                                                max_frames=30), ref[i])


SETUPS = [  # (text, voice, seed, max_frames, first_frames, chunk_frames)
    (TEXTS[2], 0, 1, 12, 4, 16), (TEXTS[3], 1, 2, 9, 1, 1), (TEXTS[0], 0, 3, None, 3, 5),
    (TEXTS[1], 1, 4, 20, 4, 4), (TEXTS[3], 0, 5, 7, 2, 3), (TEXTS[2], 1, 6, 15, 4, 16),
]


def _session(tts, k: int):
    text, v, seed, mf, first, every = SETUPS[k % len(SETUPS)]
    return text, dict(voice=VOICES[v], seed=seed + k, max_frames=mf, first_frames=first,
                      chunk_frames=every)


def test_sessions_batched_equal_alone(tts, fixed, kernels):
    """Sessions of several segments, chunk sizes and caps join at different frames, one is
    cancelled halfway: each session's audio is exactly its audio alone (codec chunks decoded
    together included)."""
    starts = [0, 0, 1, 3, 3, 3, 8, 8, 9, 15, 15, 16]
    alone = []
    for k in range(len(starts)):
        text, kw = _session(tts, k)
        alone.append(spoken_alone(tts, text, **kw))
    sessions: dict[int, object] = {}
    out: dict[int, list] = {k: [] for k in range(len(starts))}
    cancel_at, cancelled_len, tick = (4, 12), None, 0
    while tick < 400:
        for k, t0 in enumerate(starts):
            if t0 == tick:
                text, kw = _session(tts, k)
                s = tts.session(**kw)
                s.feed(text)
                s.finish()
                sessions[k] = s
        live = {k: s for k, s in sessions.items() if not s.done}
        if not live and tick > max(starts):
            break
        if tick == cancel_at[1]:
            live[cancel_at[0]].cancel()
            cancelled_len = sum(len(a.samples) for a in out[cancel_at[0]] if a is not None)
        for k, a in zip(live, tts.step_many(list(live.values())), strict=True):
            out[k].append(a)
        tick += 1
    for k, ref in enumerate(alone):
        got = joined(out[k])
        if k == cancel_at[0]:
            assert len(got) == cancelled_len < len(ref)
            ref = ref[: len(got)]
        assert len(ref) and same_numbers(got, ref), k


def test_cancel_stops_at_once(tts, monkeypatch):
    """After `cancel` the next step runs no frame for that session; the others go on.
    Counted where a step gathers its rows, which the plain and the compiled frame share."""
    calls = []
    plain = st.gather
    a, b = tts.session(seed=1, max_frames=30), tts.session(seed=2, max_frames=30)
    for s in (a, b):
        s.feed(TEXTS[2])
        s.finish()
    for _ in range(6):
        tts.step_many([a, b])
    a.cancel()
    monkeypatch.setattr(st, "gather",
                        lambda going, *rest: (calls.append(len(going)), plain(going, *rest))[1])
    assert tts.step_many([a, b])[0] is None
    assert a.done and a.track is None and calls == [1]  # b's frame only
    assert a.step() is None and calls == [1]


def test_frame_step_compiles_per_shape(tts):
    """The batched frame as a function of explicit state: under mx.compile (per shape) it
    gives the plain function's codes, hidden states, keys and caches."""
    m = tts.model
    tracks = [st.Track(_prompt(tts, i), 8, seed=i) for i in range(3)]
    st.start_tracks(m, tracks)
    h, keys, kv = st.gather(tracks, 3, 256)
    pos = mx.array([t.pos for t in tracks], mx.int32)
    tt = m.acoustic_transformer.time_table()
    plain = functools.partial(st.frame_step, m, m.decode_frame, tt)
    compiled = mx.compile(functools.partial(st.frame_step, m, m.decode_frame),
                          inputs=m.state)
    a = plain(h, keys, pos, kv)
    b = compiled(tt, h, keys, pos, kv)
    mx.eval(a, b)
    for x, y in zip(tree_flatten(a), tree_flatten(b), strict=True):
        assert mx.array_equal(x[1], y[1])


def test_compiled_frames_equal_plain(tts, monkeypatch, kernels):
    """At the fixed shapes the batched frame runs compiled per shape (`VoxtralTTS.frame`):
    sessions joining at different frames get exactly the audio of plain frames alone
    (MLX_SPEECH_COMPILE=0)."""
    monkeypatch.setattr(nn_cache, "FIXED_SHAPES", True)
    monkeypatch.setenv(compiled.ENV, "1")
    compiled.reset()
    starts = [0, 0, 2, 5]
    sessions, out, tick = {}, {k: [] for k in range(len(starts))}, 0
    while tick < 400:
        for k, t0 in enumerate(starts):
            if t0 == tick:
                text, kw = _session(tts, k)
                sessions[k] = tts.session(**kw)
                sessions[k].feed(text)
                sessions[k].finish()
        live = {k: s for k, s in sessions.items() if not s.done}
        if not live and tick > max(starts):
            break
        for k, a in zip(live, tts.step_many(list(live.values())), strict=True):
            out[k].append(a)
        tick += 1
    assert tts.frame.traced  # the compiled frames ran
    kernels.strict = False
    monkeypatch.setenv(compiled.ENV, "0")
    for k in range(len(starts)):
        text, kw = _session(tts, k)
        ref = spoken_alone(tts, text, **kw)
        assert len(ref) and np.array_equal(joined(out[k]), ref), k


def test_session_errors(tts):
    other = load_ending()
    s, t = tts.session(), other.session()
    with pytest.raises(MlxSpeechError, match="another model"):
        tts.step_many([s, t])
    with pytest.raises(MlxSpeechError, match="only once"):
        tts.step_many([s, s])
    with pytest.raises(MlxSpeechError, match="unknown voice 'nobody'"):
        tts.session(voice="nobody")
    for kw, needle in [({"first_frames": 0}, "first_frames"), ({"chunk_frames": 1.5},
                       "chunk_frames"), ({"max_frames": -1}, "max_frames"),
                       ({"seed": "x"}, "seed"), ({"clause_words": 0}, "clause_words"),
                       ({"max_chars": 3}, "max_chars")]:
        with pytest.raises(MlxSpeechError, match=needle):
            tts.session(**kw)
    s.finish()
    with pytest.raises(MlxSpeechError, match="already finished"):
        s.feed("More.")
    assert s.done and s.step() is None


def test_caches_grow_past_their_first_slots(fixed):
    """Prompts past 256 positions (the caches grow to 512 slots) beside ones that have not
    grown yet: the codes of each alone."""
    import mlx_speech.models.voxtral_tts as vt
    from tests.support.voxtral import TTS_CKPT

    plain = vt.load(TTS_CKPT, dtype=mx.float32, alibi="mlxa")  # never says END
    prompts = [plain.prompt(TEXTS[i], VOICES[i % 2]) for i in range(3)]
    alone = [np.stack(list(st.frame_codes(plain.model, p, 260, seed=i)))
             for i, p in enumerate(prompts)]
    tracks = [st.Track(p, 260, seed=i) for i, p in enumerate(prompts)]
    got: list[list[np.ndarray]] = [[] for _ in tracks]
    for tick in range(400):
        live = [i for i, t in enumerate(tracks) if tick >= 40 * i and not t.done]
        if not live:
            break
        st.start_tracks(plain.model, [tracks[i] for i in live if tracks[i].home is None])
        for i, c in zip(live, st.step_tracks(plain.model, [tracks[i] for i in live]),
                        strict=True):
            if c is not None:
                got[i].append(c)
    for a, g in zip(alone, got, strict=True):
        assert len(a) == 260 and np.array_equal(np.stack(g), a)
