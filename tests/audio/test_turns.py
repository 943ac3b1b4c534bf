"""Turn detection on injected speech probabilities (exact positions) and on real intonation."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from mlx_speech.audio.turns import (
    FRAME,
    IdleTimeout,
    SpeechStarted,
    SpeechStopped,
    TurnConfig,
    TurnDetector,
    end_of_turn_score,
    frame_pitch,
    semantic_wait_ms,
)

DATA = Path(__file__).parents[1] / "data"


def probs(*runs: tuple[float, int]) -> list[float]:
    return [p for p, n in runs for _ in range(n)]


def test_server_vad_positions_are_sample_exact():
    d = TurnDetector(TurnConfig(threshold=0.5, prefix_padding_ms=300, silence_duration_ms=500))
    ev = d.push(probs((0.1, 10), (0.9, 20), (0.1, 30)))
    # speech from frame 10, confirmed after 3 frames (96 ms); 300 ms = 4800 samples earlier
    # stop after ceil(500 / 32) = 16 silent frames: frames 30..45, so the end is frame 46
    assert ev == [SpeechStarted(10 * FRAME - 4800, 13 * FRAME), SpeechStopped(46 * FRAME)]
    assert d.position == 60 * FRAME and not d.in_speech
    # a second turn's prefix never reaches back into the first turn
    ev = d.push(probs((0.9, 5), (0.0, 20)))
    assert ev == [SpeechStarted(60 * FRAME - 4800, 63 * FRAME), SpeechStopped(81 * FRAME)]
    # a turn right after another: its prefix stops at the previous turn's end
    ev = d.push(probs((0.9, 3), (0.0, 16)))
    assert ev == [SpeechStarted(81 * FRAME, 88 * FRAME), SpeechStopped(104 * FRAME)]


def test_chunking_does_not_change_events():
    rng = np.random.default_rng(0)
    lows, highs = rng.uniform(0, 0.3, 40), rng.uniform(0.6, 1.0, 40)
    p = np.repeat(np.stack([lows, highs], 1).ravel(), rng.integers(1, 40, 80))
    for cfg in (TurnConfig(), TurnConfig(threshold=0.3, silence_duration_ms=200,
                                         idle_timeout_ms=1000)):
        whole = TurnDetector(cfg).push(p)
        d, parts, i = TurnDetector(cfg), [], 0
        while i < len(p):
            n = int(rng.integers(1, 9))
            parts += d.push(p[i:i + n])
            i += n
        assert parts == whole and len(whole) > 4


def test_blips_hysteresis_and_start_clamp():
    d = TurnDetector(TurnConfig(prefix_padding_ms=1000))
    # two-frame blips never start a turn
    assert d.push(probs((0.9, 2), (0.1, 5), (0.95, 2), (0.0, 5))) == []
    # 0.4 is above threshold - 0.15 = 0.35: the turn goes on through it; prefix clamped at 0
    ev = d.push(probs((0.9, 4), (0.4, 30), (0.3, 16)))
    assert ev == [SpeechStarted(0, 17 * FRAME), SpeechStopped((14 + 34 + 16) * FRAME)]


def test_idle_timeout_reports_each_stretch_without_speech():
    d = TurnDetector(TurnConfig(idle_timeout_ms=320))  # 10 frames
    ev = d.push(probs((0.0, 25)))
    assert ev == [IdleTimeout(0, 10 * FRAME), IdleTimeout(10 * FRAME, 20 * FRAME)]
    ev = d.push(probs((0.9, 3), (0.0, 16)))
    assert ev == [SpeechStarted(20 * FRAME, 28 * FRAME), SpeechStopped(44 * FRAME)]
    assert d.push(probs((0.0, 10))) == [IdleTimeout(44 * FRAME, 54 * FRAME)]
    assert d.earliest_start() == 54 * FRAME


def test_earliest_start_force_stop_and_clear():
    d = TurnDetector(TurnConfig(prefix_padding_ms=320))
    d.push(probs((0.0, 30)))
    assert d.earliest_start() == 20 * FRAME  # the next frame's prefix
    d.push(probs((0.9, 2)))
    assert d.earliest_start() == 20 * FRAME  # a candidate run pins its prefix
    ev = d.push(probs((0.9, 1)))
    assert ev == [SpeechStarted(20 * FRAME, 33 * FRAME)]
    assert d.force_stop() == SpeechStopped(33 * FRAME) and d.force_stop() is None
    d.push(probs((0.9, 3)))
    d.clear()
    assert not d.in_speech and d.earliest_start() == 36 * FRAME


def test_openai_config_parsing():
    c = TurnConfig.from_openai({"type": "server_vad", "threshold": 0.6, "prefix_padding_ms": 600,
                                "silence_duration_ms": 350, "create_response": True})
    assert (c.threshold, c.prefix_padding_ms, c.silence_duration_ms) == (0.6, 600, 350)
    assert c.to_openai() == {"type": "server_vad", "threshold": 0.6, "prefix_padding_ms": 600,
                             "silence_duration_ms": 350, "idle_timeout_ms": None}
    s = TurnConfig.from_openai({"type": "semantic_vad"})
    assert s.to_openai() == {"type": "semantic_vad", "eagerness": "auto"}
    for bad, msg in [({"type": "magic"}, "type must be one of"),
                     ({"type": "server_vad", "threshold": 2}, "threshold must be in"),
                     ({"type": "server_vad", "silence_duration_ms": -1}, "non-negative"),
                     ({"type": "semantic_vad", "eagerness": "eager"}, "eagerness must be"),
                     ({"type": "semantic_vad", "threshold": 0.5}, "not a semantic_vad option"),
                     ("server_vad", "must be an object")]:
        with pytest.raises(ValueError, match=msg):
            TurnConfig.from_openai(bad)


def test_semantic_wait_follows_the_end_of_turn_score():
    st = lambda semis: [100.0 * 2 ** (s / 12) for s in semis]  # noqa: E731
    falling = st([4, 4, 3, 3, 2, 2, 1, 0, -1, -2])
    level = st([0] * 10)
    question = st([0, 0, 0, 0, 0, 1, 2, 3, 5, 6])
    assert end_of_turn_score(falling) == 1.0
    assert end_of_turn_score(level) == 0.0
    assert end_of_turn_score(question) == 1.0
    assert end_of_turn_score(st([0, 1])) == 0.5  # too little voicing: in between
    assert semantic_wait_ms("medium", 1.0) == 500 and semantic_wait_ms("medium", 0.0) == 4000
    assert semantic_wait_ms("low", 0.0) == 8000 and semantic_wait_ms("high", 0.0) == 2000
    assert semantic_wait_ms("auto", 1.0) == semantic_wait_ms("medium", 1.0)

    def stop_frame(pitch, eagerness):
        d = TurnDetector(TurnConfig(type="semantic_vad", eagerness=eagerness))
        p = probs((0.9, 10), (0.0, 300))
        ev = d.push(p, pitch + [0.0] * (len(p) - len(pitch)))
        return ev[1].end // FRAME - 10

    assert stop_frame(falling, "high") == 10  # ceil(300 / 32) silent frames
    assert stop_frame(level, "high") == 63  # ceil(2000 / 32)
    assert stop_frame(level, "low") == 250
    assert stop_frame(falling, "auto") == 16


def _pitch_before_pause(name: str) -> list[float]:
    x, sr = sf.read(DATA / f"turns_{name}.wav", dtype="float32")
    assert sr == 16000
    n = len(x) // FRAME * FRAME
    frames = x[:n].reshape(-1, FRAME)
    level = 20 * np.log10(np.sqrt((frames ** 2).mean(axis=1)) + 1e-9)
    speech = np.flatnonzero(level > level.max() - 35)
    return list(frame_pitch(frames[: speech[-1] + 1])[speech[0]:])


def test_real_intonation_statement_question_and_comma():
    """espeak-ng's intonation: statements fall, a question rises, a comma's clause stays up."""
    scores = {n: end_of_turn_score(_pitch_before_pause(n)) for n in
              ("go", "please", "meeting", "comma")}
    assert scores["go"] == 1.0 and scores["please"] == 1.0, scores
    assert scores["meeting"] > 0.7, scores
    assert scores["comma"] < 0.3, scores
    # a finished sentence ends its turn at once (medium: 500 ms), the comma keeps waiting
    assert semantic_wait_ms("auto", scores["go"]) == 500
    assert semantic_wait_ms("auto", scores["comma"]) > 2000


def test_frame_pitch_of_a_tone():
    t = np.arange(4 * FRAME) / 16000
    for hz in (90.0, 180.0, 300.0):
        x = 0.3 * np.sin(2 * np.pi * hz * t)
        p = frame_pitch(x.reshape(-1, FRAME))
        assert np.all(np.abs(p - hz) / hz < 0.03), (hz, p)
    assert np.all(frame_pitch(np.zeros((2, FRAME))) == 0)
    noise = np.random.default_rng(0).standard_normal((3, FRAME)) * 0.1
    assert np.all(frame_pitch(noise) == 0)


def _route(x, cfg, chunks, commit_at=None):
    """TurnAudio over `x` pushed in `chunks`, an energy gate as the VAD; the turns it made."""
    from mlx_speech.audio.turns import TurnAudio

    ta = TurnAudio(TurnDetector(cfg))
    turns, cur, most = [], None, 0
    i = 0
    for n in chunks:
        ta.push(x[i:i + n])
        i += n
        f = ta.frames()
        acts = ta.step((np.abs(f).max(axis=1) > 0.5).astype(np.float32) if len(f) else [])
        if commit_at is not None and i >= commit_at and ta.open:
            acts += ta.commit()
            commit_at = None
        for a in acts:
            if a[0] == "start":
                cur = [a[1], []]
            elif a[0] == "audio":
                cur[1].append(a[1])
            elif a[0] == "stop":
                turns.append((cur[0], a[1], np.concatenate(cur[1])))
                cur = None
        most = max(most, len(ta.buf))
    return turns, most


def test_turn_audio_routes_every_sample_once():
    rng = np.random.default_rng(1)
    x = np.zeros(16000 * 12, np.float32)
    bursts = [(1.0, 2.0), (2.3, 2.6), (5.0, 7.5), (10.0, 10.4)]
    for a, b in bursts:
        x[int(a * 16000): int(b * 16000)] = 0.9 * np.sign(rng.standard_normal(int((b - a) * 16000)))
    cfg = TurnConfig(prefix_padding_ms=300, silence_duration_ms=500)
    chunks = list(rng.integers(1, 5000, 200))
    turns, most = _route(x, cfg, chunks)
    # 2.0 -> 2.3 is a shorter pause than 500 ms: one turn; the others are apart
    assert len(turns) == 3
    for start, end, audio in turns:
        assert np.array_equal(audio, x[start:end])  # every sample of the span, in order
    for (_, e0, _), (s1, _, _) in zip(turns, turns[1:], strict=False):
        assert s1 >= e0  # never overlapping
    for (start, end, _), (a, b) in zip(turns, [(1.0, 2.6), (5.0, 7.5), (10.0, 10.4)], strict=True):
        assert abs(start - (a * 16000 - 4800)) < FRAME  # prefix padding
        assert 0 <= end - (b * 16000 + 8000) < 2 * FRAME  # closing silence included
    # between turns only the prefix window is kept; during a turn only unseen frames
    assert most < 16000 * 0.3 + 6 * FRAME + 5000
    # the same turns whatever the chunking
    assert [(s, e) for s, e, _ in _route(x, cfg, [len(x)])[0]] == [(s, e) for s, e, _ in turns]


def test_turn_audio_commit_ends_at_the_last_sample():
    x = np.zeros(16000 * 4, np.float32)
    x[16000:40000] = 0.9
    turns, _ = _route(x, TurnConfig(), [1000] * 64, commit_at=30000)
    (s0, e0, a0), (s1, e1, a1) = turns
    assert e0 == 30000 and s1 == e0  # the rest of the speech is the next turn, no overlap
    assert np.array_equal(a0, x[s0:e0]) and np.array_equal(a1, x[s1:e1])
