"""`transcribe --live` at pauses and over long runs: one line per turn of real speech (each the
library's transcription of its span), timestamps, and constant memory: sessions drain their
transcript (the drained pieces join to the whole), turns forget their audio."""

from __future__ import annotations

import numpy as np
import pytest

import mlx_speech
from mlx_speech.models import asr
from tests.conftest import speechlike
from tests.support.sounddevice_fakes import fake_sounddevice
from tests.support.turns_audio import BLOCK, blocks, fake_microphone, scene, silero
from tests.support.turns_audio import turns_offline as _turns_offline

GOLDEN_NM = "tests/golden/nemotron"


@pytest.fixture(scope="module")
def nm():
    return mlx_speech.load(GOLDEN_NM)


@pytest.fixture(scope="module")
def vad():
    return silero()


@pytest.mark.parametrize("name", ["nm", "vr"])
def test_drain_pieces_join_to_the_whole(name, nm, vr_model, monkeypatch):
    model = nm if name == "nm" else vr_model
    cap = asr.DRAIN_HOLD_MAX
    if name == "vr":  # the cap path (its tiny vocabulary has no words to wait for)
        cap = 12
        monkeypatch.setattr(asr, "DRAIN_HOLD_MAX", cap)
    x = speechlike(3.0, seed=21)
    whole = model.transcribe(x)
    s, pieces, most = model.session(), [], 0
    for b in blocks(x, 1000):
        s.feed(b)
        pieces.append(s.drain())
        most = max(most, len(s.token_ids))
    s.finish()
    pieces.append(s.result())
    assert sum((p.token_ids for p in pieces), []) == whole.token_ids
    assert sum((p.token_times for p in pieces), []) == whole.token_times
    assert "".join(p.text for p in pieces).strip() == whole.text
    if name == "nm":  # real words: none split by a drain
        assert [(w.text, w.start, w.end) for p in pieces for w in p.words] == [
            (w.text, w.start, w.end) for w in whole.words]
        assert len(whole.words) > 3
    assert most <= cap + 40  # held back: one word's tokens, and one feed's


def test_no_vad_live_line_holds_constant_memory(nm):
    """A minute of audio into the endless line: the same text as offline, while the session
    holds a bounded number of tokens (without drain it holds them all)."""
    from mlx_speech.transcribe import LiveLines

    x = speechlike(60.0, seed=3)
    out = []
    lines = LiveLines(nm, {}, out.append)
    most = 0
    for b in blocks(x):
        lines.feed(b)
        most = max(most, len(lines.session.token_ids))
    lines.finish()
    whole = nm.transcribe(x)
    assert "".join(out).strip() == whole.text
    assert len(whole.token_ids) > 1500 and most < asr.DRAIN_HOLD_MAX


def test_vad_live_lines_one_per_turn_with_timestamps(nm, vad):
    from mlx_speech.transcribe import LiveLines

    x, spans = scene(("please", "meeting", "go"), lead_s=0.5, gap_s=0.9, tail_s=0.9, seed=4)
    out = []
    lines = LiveLines(nm, {}, out.append, vad=vad, timestamps=True)
    for b in blocks(x):
        lines.feed(b)
    lines.finish()
    got = "".join(out).splitlines()
    turns = _turns_offline(vad, x)
    assert len(turns) == len(spans) == len(got)
    for line, (a, b), (on, _) in zip(got, turns, spans, strict=True):
        stamp, text = line[1:13], line[15:]
        assert line[0] == "[" and line[13:15] == "] "
        h, m, sec = stamp.split(":")
        assert int(h) == 0 and int(m) == 0 and abs(float(sec) - a / 16000) < 1e-3
        assert abs(a / 16000 - (on - 0.3)) < 0.1  # the turn's audio begins at its prefix
        assert text == nm.transcribe(x[a:b]).text and text


def test_vad_live_memory_is_flat_over_many_turns(nm, vad):
    """Many turns (simulating a long dictation): lines keep coming, nothing accumulates."""
    from mlx_speech.transcribe import LiveLines

    one, _ = scene(("go", "meeting"), lead_s=0.3, gap_s=0.7, tail_s=0.6, seed=5)
    x = np.concatenate([one] * 6)
    out = []
    lines = LiveLines(nm, {}, out.append, vad=vad)
    buf, toks = [], []
    for b in blocks(x):
        lines.feed(b)
        buf.append(len(lines.turns.buf))
        toks.append(0 if lines.session is None else len(lines.session.token_ids))
    lines.finish()
    assert len("".join(out).splitlines()) == 12
    # between turns: at most the prefix window and a block; in a turn: the unseen frames
    assert max(buf) <= 4800 + 2 * BLOCK
    assert max(toks) < asr.DRAIN_HOLD_MAX
    half = len(buf) // 2
    assert max(buf[half:]) <= max(buf[:half]) + BLOCK  # no growth with time


def test_live_cli_ends_lines_at_pauses(nm, vad, monkeypatch, capsys):
    """`transcribe --live --timestamps` through main(), the microphone faked."""
    import mlx_speech.audio.devices as devices
    from mlx_speech import transcribe

    x, _ = scene(("go", "please"), lead_s=0.4, gap_s=0.9, tail_s=0.9, seed=6)
    queue = blocks(x)

    fake_sounddevice(monkeypatch)  # device checks pass without PortAudio
    monkeypatch.setattr(devices, "Microphone", fake_microphone(queue))
    monkeypatch.setattr(mlx_speech, "load", lambda *a, **k: nm)
    assert transcribe.main(["--live", "--timestamps", "--model", "nm"]) == 0
    got = capsys.readouterr().out.splitlines()
    turns = _turns_offline(vad, x)
    assert [line[15:] for line in got] == [nm.transcribe(x[a:b]).text for a, b in turns]
    assert len(got) == 2


def test_pause_breaks_in_pieces_equal_whole(vad):
    from mlx_speech.transcribe import pause_break_steps, pause_breaks

    x, _ = scene(("go", "meeting", "please"), lead_s=0.4, gap_s=0.8, tail_s=0.5, seed=7)
    whole = [a / 16000 for a, _ in _turns_offline(vad, x)][1:]
    *progress, pieces = pause_break_steps(vad, x, piece_s=1.024)
    assert len(progress) == -(-len(x) // 16384) and set(progress) == {None}
    assert pieces == pause_breaks(vad, x) == whole and len(whole) == 2
