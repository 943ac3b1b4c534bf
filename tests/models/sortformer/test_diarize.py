"""Speakers on transcripts: words aligned to the diarizer's frames, live and offline, and the
txt / srt / vtt / json forms, on the three-voice espeak-ng recording with the tiny Sortformer.
The ASR is a stand-in whose words sit where the recording's utterances are (the tiny random ASR
models emit arbitrary words), so the alignment is checked exactly; labels themselves mean
nothing with random weights."""

from __future__ import annotations

import json
import re
from argparse import Namespace
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from mlx_speech.diarize import (
    SpeakerTracker,
    SpeakerTurns,
    diarize_result,
    label_words,
)
from mlx_speech.models import sortformer
from mlx_speech.models.asr import Transcript
from mlx_speech.transcribe import transcribe_file
from mlx_speech.transcript import Segment, write_transcript
from tests.support.diarize import script_words as _words

DATA = Path(__file__).parents[2] / "data"
NEMO = Path(__file__).parents[2] / "golden" / "sortformer" / "tiny.nemo"


@pytest.fixture(scope="module")
def diarizer():
    return sortformer.load(NEMO)


@pytest.fixture(scope="module")
def recording():
    x, _ = sf.read(DATA / "voices_3spk.wav", dtype="float32")
    return x, json.loads((DATA / "voices_3spk.json").read_text())


class FakeASR:
    sample_rate = 16000

    def __init__(self, words):
        self.words = words

    def transcribe(self, audio, sample_rate, progress=None, **kw):
        return Transcript(" ".join(w.text for w in self.words), [], self.words)

    def session(self, **kw):  # `transcribe` on the command line streams the file through one
        asr = self

        class Session:
            def feed(self, audio):
                return ""

            def finish(self):
                return ""

            def result(self):
                return asr.transcribe(None, asr.sample_rate)

        return Session()


def _expected(words, probs) -> list[int]:
    """The rule, written out: most frames above 0.5 in [start, end), then total probability;
    none active: the previous word's speaker; numbers (from 0) by first appearance."""
    names, last, out = {}, None, []
    for w in words:
        a = min(int(w.start / 0.08), len(probs) - 1)
        b = min(len(probs), max(a + 1, int(np.ceil(w.end / 0.08))))
        win = probs[a:b]
        act = (win > 0.5).sum(0)
        if act.max() > 0:
            slot = int(np.lexsort((win.sum(0), act))[-1])
            last = names.setdefault(slot, len(names))
        out.append(last)
    first = next(x for x in out if x is not None)
    return [first if x is None else x for x in out]


def test_words_take_the_speaker_of_their_frames(diarizer, recording):
    audio, meta = recording
    words = _words(meta)
    probs = diarizer.probabilities(audio)
    labels = label_words(words, probs)
    assert labels == _expected(words, probs)
    assert len(set(labels)) >= 2 and labels[0] == 0


def test_live_labels_equal_offline_labels_across_chunks(diarizer, recording):
    audio, meta = recording
    words = _words(meta)
    tracker = SpeakerTracker(diarizer)
    live = []
    for i in range(0, len(audio), 4000):  # 250 ms blocks, words labelled as they are covered
        tracker.feed(audio[i: i + 4000])
        ready = [w for w in words[len(live):] if w.end <= tracker.time]
        live += tracker.label(ready)
    tracker.finish()
    live += tracker.label(words[len(live):])
    assert live == label_words(words, diarizer.probabilities(audio))


def test_turn_numbering_only_grows():
    t = SpeakerTurns()
    assert [t.number(s) for s in (2, None, 0, 2, 3)] == [0, 0, 1, 0, 2]


def _args(fmt, diarizer=None):
    return Namespace(format=fmt, latency_ms=None, delay_ms=None, diarizer_model=diarizer,
                     vocabulary=None)


@pytest.mark.parametrize("fmt", ["txt", "json", "srt", "vtt"])
def test_formats_with_speakers(diarizer, recording, fmt):
    audio, meta = recording
    words = _words(meta)
    # the command line's form of the library's speaker numbers (docs/diarization.md)
    labels = [f"Speaker {n + 1}" for n in label_words(words, diarizer.probabilities(audio))]
    out = transcribe_file(FakeASR(words), str(DATA / "voices_3spk.wav"), _args(fmt, diarizer))
    if fmt == "txt":  # a line per speaker turn
        lines = out.strip().split("\n")
        turns = [labels[0]] + [b for a, b in zip(labels, labels[1:], strict=False) if a != b]
        assert [ln.split(":")[0] for ln in lines] == turns
        assert " ".join(ln.split(": ", 1)[1] for ln in lines) == " ".join(w.text for w in words)
    elif fmt == "json":
        doc = json.loads(out)
        assert [w["speaker"] for w in doc["words"]] == labels
        assert all(s["speaker"].startswith("Speaker ") for s in doc["segments"])
        by_time = {(w["start"], w["end"]): w["speaker"] for w in doc["words"]}
        for s in doc["segments"]:  # a segment never mixes speakers
            inside = {v for (a, b), v in by_time.items() if a >= s["start"] and b <= s["end"]}
            assert inside == {s["speaker"]}
    if fmt in ("srt", "vtt"):
        cues = [c for c in out.split("\n\n") if "-->" in c]
        assert cues
        for c in cues:
            text = c.split("-->")[1].split("\n", 1)[1]
            if fmt == "vtt":
                assert re.fullmatch(r"<v Speaker \d>[^<]+", text.strip()), text
            else:
                assert re.match(r"Speaker \d: ", text), text


def test_no_change_without_diarize(recording):
    _, meta = recording
    words = _words(meta)
    plain = {fmt: transcribe_file(FakeASR(words), str(DATA / "voices_3spk.wav"), _args(fmt))
             for fmt in ("txt", "json", "srt", "vtt")}
    for out in plain.values():
        assert "peaker" not in out and "<v " not in out
    assert plain["txt"] == " ".join(w.text for w in words) + "\n"
    segs = [Segment(0.0, 1.5, "Hello there.")]
    assert write_transcript("vtt", "x", segs, None) == (
        "WEBVTT\n\n00:00:00.000 --> 00:00:01.500\nHello there.\n")
    assert write_transcript("srt", "x", segs, None) == (
        "1\n00:00:00,000 --> 00:00:01,500\nHello there.\n")
    assert json.loads(write_transcript("json", "x", segs, None))["segments"] == [
        {"start": 0.0, "end": 1.5, "text": "Hello there."}]


def test_diarized_transcript_turns(diarizer, recording):
    audio, meta = recording
    words = _words(meta)
    d = diarize_result(Transcript("t", [], words), audio, diarizer)
    assert [w.speaker for w in d.words] == label_words(words, d.probs)
    assert "".join(t for _, t in d.turns()).replace(" ", "") == "".join(w.text for w in words)


def test_cli_diarize_json(vr_dir, tmp_path):
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[3]

    def run(*args):
        return subprocess.run([sys.executable, "-m", "mlx_speech.transcribe", *args],
                              capture_output=True, text=True, timeout=300,
                              env=dict(os.environ, PYTHONPATH=str(root)),
                              stdin=subprocess.DEVNULL)

    wav = str(DATA / "voices_3spk.wav")
    r = run(wav, "--model", str(vr_dir), "--diarize", "--diarizer", str(NEMO), "--format", "json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["words"] and all(w["speaker"].startswith("Speaker ") for w in doc["words"])
    assert all(s["speaker"].startswith("Speaker ") for s in doc["segments"])
    r = run(wav, "--model", str(vr_dir), "--diarizer", str(NEMO))
    assert r.returncode != 0 and r.stderr.strip().splitlines()[-1] == (
        "error: --diarizer needs --diarize")


def test_frame_log_keeps_every_frame_without_copying_history_each_chunk():
    """A day-long live stream appends speaker frames in amortised constant time: the log
    equals concatenating every piece, and its buffer grows by doubling, not per chunk."""
    from mlx_speech.diarize import FrameLog

    rng = np.random.default_rng(0)
    log, pieces, grows, cap = FrameLog(4), [], 0, None
    for n in [0, 6, 1, 0, 300, 6, 6, 1000, 0, 13] * 20:
        p = rng.random((n, 4), dtype=np.float32)
        pieces.append(p)
        log.add(p)
        if cap is not None and len(log._buf) != cap:
            grows += 1
        cap = len(log._buf)
    want = np.concatenate(pieces)
    np.testing.assert_array_equal(log.frames, want)
    assert grows <= int(np.log2(len(want))) + 1
