"""`transcribe --live --diarize`: the diarizer's streaming session hears the microphone beside
the ASR, and each line carries its speaker. On the three-voice espeak-ng recording with the tiny
Nemotron and the tiny Sortformer (random weights: the labels mean nothing), the lines must be
exactly the live ASR's words, labelled as offline `diarize.transcribe` labels the same words,
split at every pause and every change of speaker; without --diarize nothing changes."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import soundfile as sf

import mlx_speech
from mlx_speech import diarize
from mlx_speech.models import sortformer
from mlx_speech.models.asr import Transcript, Word
from tests.support.sounddevice_fakes import fake_sounddevice
from tests.support.turns_audio import BLOCK, blocks, fake_microphone, silero
from tests.support.turns_audio import turns_offline as _turns_offline

DATA = Path(__file__).parents[1] / "data"
NEMO = Path(__file__).parents[1] / "golden" / "sortformer" / "tiny.nemo"
GOLDEN_NM = "tests/golden/nemotron"


@pytest.fixture(scope="module")
def nm():
    return mlx_speech.load(GOLDEN_NM)


@pytest.fixture(autouse=True)
def whole_words(monkeypatch):
    """The tiny random Nemotron's "words" run to hundreds of tokens, which a live session's
    drain releases in pieces (test_live_turns); whole words here, as offline transcribes."""
    from mlx_speech.models import asr

    monkeypatch.setattr(asr, "DRAIN_HOLD_MAX", 10 ** 6)


@pytest.fixture(scope="module")
def diar():
    return sortformer.load(NEMO)


@pytest.fixture(scope="module")
def vad():
    return silero()


@pytest.fixture(scope="module")
def audio():
    x, sr = sf.read(DATA / "voices_3spk.wav", dtype="float32")
    assert sr == 16000
    return x


class Words:
    """An ASR whose transcript is given words (offline `diarize.transcribe`'s input)."""

    sample_rate = 16000

    def __init__(self, words):
        self.words = words

    def transcribe(self, audio, sample_rate, **kw):
        return Transcript(" ".join(w.text for w in self.words), [], self.words)


def _expected_lines(groups: list[list[Word]], audio, diar, timestamps=False) -> list[str]:
    """Each group (a VAD turn's words, on the stream's clock) split where the speaker
    changes; the labels are offline `diarize.transcribe`'s for all the words at once."""
    flat = [w for g in groups for w in g]
    labelled = diarize.transcribe(Words(flat), audio, diar).words
    assert [(w.text, w.start, w.end) for w in labelled] == [(w.text, w.start, w.end)
                                                            for w in flat]
    lines, i = [], 0
    for g in groups:
        run: list = []
        for w in labelled[i: i + len(g)]:
            if run and run[-1].speaker != w.speaker:
                lines.append(run)
                run = []
            run.append(w)
        if run:
            lines.append(run)
        i += len(g)
    out = []
    for run in lines:
        text = " ".join(w.text for w in run)
        who = run[0].speaker  # the library's number; lines show "Speaker N" from 1
        line = f"Speaker {who + 1}: {text}" if who is not None else text
        if timestamps:
            from mlx_speech.transcribe import _clock

            line = f"[{_clock(run[0].start)}] {line}"
        out.append(line)
    return out


def _turn_words(nm, vad, audio) -> list[list[Word]]:
    """The live ASR's words per VAD turn (a turn's session == offline on its span), shifted
    to the stream's clock."""
    out = []
    for a, b in _turns_offline(vad, audio):
        t0 = a / 16000
        out.append([Word(w.text, w.start + t0, w.end + t0)
                    for w in nm.transcribe(audio[a:b]).words])
    return out


class Scripted:
    """A streaming ASR stand-in that says the recording's words (`test_diarize._words`: each
    utterance's words spread over its span): session k, opened for VAD turn k, says the words
    starting inside that turn, on its own clock, each released by `drain` once the audio has
    passed its end (the tiny random ASR models' words are a few giant ones)."""

    sample_rate = 16000

    def __init__(self, words, turns):
        self.words, self.turns, self.opened = words, list(turns), 0

    def groups(self) -> list[list[Word]]:
        return [[w for w in self.words if a <= w.start * 16000 < b] for a, b in self.turns]

    def session(self, **mode):
        t0 = self.turns[self.opened][0] / 16000
        words = [Word(w.text, w.start - t0, w.end - t0) for w in self.groups()[self.opened]]
        self.opened += 1
        return ScriptedSession(words)


class ScriptedSession:
    done = False

    def __init__(self, words):
        self.words, self.t, self.out = words, 0.0, 0

    def _ready(self, final=False):
        n = len(self.words) if final else sum(w.end <= self.t for w in self.words)
        new, self.out = self.words[self.out: n], max(self.out, n)
        return new

    def feed(self, x):
        self.t += len(x) / 16000
        self.pending = self._ready()
        return "".join(" " + w.text for w in self.pending)

    def drain(self):
        new, self.pending = getattr(self, "pending", []), []
        return Transcript("", [], new)

    def finish(self):
        self.pending = self._ready(final=True)
        return "".join(" " + w.text for w in self.pending)

    def result(self):
        return self.drain()


@pytest.fixture(scope="module")
def script(vad, audio):
    import json

    from tests.support.diarize import script_words as _words

    meta = json.loads((DATA / "voices_3spk.json").read_text())
    return _words(meta), _turns_offline(vad, audio, 300)


def test_vad_lines_carry_the_offline_speakers(diar, vad, audio, script):
    from mlx_speech.transcribe import LiveLines

    asr = Scripted(*script)
    groups = asr.groups()
    expected = _expected_lines(groups, audio, diar, timestamps=True)
    out = []
    lines = LiveLines(asr, {}, out.append, vad=vad, silence_ms=300, timestamps=True,
                      diarizer=diar)
    for b in blocks(audio):
        lines.feed(b)
    lines.finish()
    got = "".join(out).splitlines()
    assert got == expected
    assert asr.opened == len(groups) >= 3
    assert sum(map(len, groups)) == len(script[0])  # every word said
    speakers = {re.match(r"\[[^]]+\] (Speaker \d):", ln).group(1) for ln in got}
    assert len(speakers) >= 2
    assert len(got) > len(groups)  # some turn holds a change of speaker
    assert not lines.queue and lines.speakers.time >= len(audio) / 16000 - 0.08


def test_lines_wait_for_their_speaker_frames(diar, vad, audio, script):
    """A line is written only once every word in it is covered by speaker frames, so a
    label is never revised: the text out so far is always a prefix of the final output."""
    from mlx_speech.transcribe import LiveLines

    out, seen = [], []
    lines = LiveLines(Scripted(*script), {}, out.append, vad=vad, silence_ms=300,
                      diarizer=diar)
    for b in blocks(audio, 3 * BLOCK):
        lines.feed(b)
        seen.append("".join(out))
        covered = [w.end <= lines.speakers.time for w in lines.queue if w is not None]
        assert covered[:1] != [True] or lines.speakers.turns.last is None
    lines.finish()
    final = "".join(out)
    assert all(final.startswith(s) for s in seen)
    assert any(s and s != final for s in seen)  # lines came out while audio kept coming


def test_no_vad_line_splits_at_speaker_changes(diar, audio, script):
    from mlx_speech.transcribe import LiveLines

    words = script[0]
    out = []
    lines = LiveLines(Scripted(words, [(0, len(audio))]), {}, out.append, diarizer=diar,
                      words=True)
    for b in blocks(audio):
        lines.feed(b)
    lines.finish()
    got = "".join(out).splitlines()
    text_lines, word_lines = got[0::2], got[1::2]
    assert text_lines == _expected_lines([words], audio, diar)
    assert len(text_lines) >= 3
    # --words: each line's words with their times, on the stream's clock
    stamps = [re.findall(r"\[([\d:.]+)-([\d:.]+)\] (\S+)", ln) for ln in word_lines]
    assert [len(s) for s in stamps] == [len(ln.split(": ", 1)[1].split()) for ln in text_lines]
    flat = [x for s in stamps for x in s]
    assert [t for *_, t in flat] == [w.text for w in words]
    secs = [float(a.split(":")[-1]) + 60 * int(a.split(":")[1]) for a, _, _ in flat]
    np.testing.assert_allclose(secs, [w.start for w in words], atol=1e-3)


def test_live_cli_diarize_through_main(nm, diar, vad, audio, monkeypatch, capsys):
    """`--live --diarize --diarizer` through main(), the microphone faked: the diarizer is
    loaded (kind-checked) before the ASR model, and the lines are the offline labels."""
    import mlx_speech.audio.devices as devices
    from mlx_speech import transcribe

    loads = []
    real = mlx_speech.load

    def load(name, kind=None, **kw):
        loads.append(kind)
        return real(name, kind=kind, **kw) if kind == "diarizer" else nm

    fake_sounddevice(monkeypatch)  # device checks pass without PortAudio
    monkeypatch.setattr(devices, "Microphone", fake_microphone(blocks(audio)))
    monkeypatch.setattr(mlx_speech, "load", load)
    assert transcribe.main(["--live", "--diarize", "--diarizer", str(NEMO),
                            "--model", "nm"]) == 0
    assert loads == ["diarizer", "asr"]
    got = capsys.readouterr().out.splitlines()
    assert got == _expected_lines(_turn_words(nm, vad, audio), audio, diar)
    # a diarizer of the wrong kind fails before the ASR model loads
    loads.clear()
    assert transcribe.main(["--live", "--diarize", "--diarizer", GOLDEN_NM,
                            "--model", "nm"]) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("error: ") and loads == ["diarizer"]


def test_without_diarize_live_output_is_unchanged(nm, vad, audio, monkeypatch, capsys):
    """No diarizer session is made, and the lines are the ASR's turn texts as before."""
    import mlx_speech.audio.devices as devices
    from mlx_speech import transcribe

    def no_tracker(*a, **k):
        raise AssertionError("a diarizer session without --diarize")

    monkeypatch.setattr(diarize, "SpeakerTracker", no_tracker)
    fake_sounddevice(monkeypatch)  # device checks pass without PortAudio
    monkeypatch.setattr(devices, "Microphone", fake_microphone(blocks(audio)))
    monkeypatch.setattr(mlx_speech, "load", lambda *a, **k: nm)
    assert transcribe.main(["--live", "--words", "--model", "nm"]) == 0
    got = capsys.readouterr().out.splitlines()
    turns = _turns_offline(vad, audio)
    assert got[0::2] == [nm.transcribe(audio[a:b]).text for a, b in turns]
    for ln, (a, b) in zip(got[1::2], turns, strict=True):  # word times on the turn's clock
        first = nm.transcribe(audio[a:b]).words[0]
        m = re.match(r"  \[00:00:([\d.]+)-", ln)
        assert abs(float(m.group(1)) - (a / 16000 + first.start)) < 1e-3
    assert "Speaker" not in "".join(got)


def test_live_streaming_settings():
    """The released config's 15 s chunks would hold every live line that long: a live run
    takes NVIDIA's 1.04 s setting, unless the model's own chunks are shorter."""
    from mlx_speech.models.sortformer.config import SortformerConfig

    released = SimpleNamespace(config=SortformerConfig())
    assert diarize.live_streaming(released) == diarize.LIVE_STREAMING
    SortformerConfig().streaming(**diarize.LIVE_STREAMING)  # valid for the released model
    tiny = sortformer.load(NEMO)
    assert diarize.live_streaming(tiny) == {}
