"""`mlx_speech.app --simulate` end to end: real models (tiny random checkpoints), the real
core and engine, and real audio devices (a private PulseAudio: a FIFO-fed microphone and a
null-sink speaker that the test records)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from tests.app.helpers_sim import Sim
from tests.conftest import speechlike
from tests.support.pulse import align, without_gaps

ROOT = Path(__file__).resolve().parents[2]
TINY_TTS = ROOT / "tests" / "golden" / "voxtral_tts" / "ckpt"
NEMOTRON = ROOT / "tests" / "golden" / "nemotron"


def _state(name):
    return lambda e: e == {**e, "event": "state", "state": name}


def _dictate(sim, pulse, audio, tmp_path):
    sim.until(lambda e: e["event"] == "state" and e["state"] == "idle"
              and any(x.get("state") == "loading" for x in sim.events))  # the model is ready
    sim.send("press dictate")
    sim.until(_state("listening"))
    # a real microphone keeps delivering (silence) after the words: release during it
    feed = pulse.feed_mic(np.concatenate([audio, np.zeros(16000, np.float32)]), realtime=True)
    deadline = time.monotonic() + 30
    while feed.sent < len(audio) + 4800 and time.monotonic() < deadline:
        time.sleep(0.02)
    sim.send("release dictate")
    sim.until(lambda e: e["event"] == "state" and e["state"] in ("idle", "error"))
    feed.close()
    saved = sorted(tmp_path.glob("dictation-*.json"))
    assert len(saved) == 1, sim.events
    got = json.loads(saved[0].read_text())
    import soundfile as sf

    samples, rate = sf.read(str(saved[0].with_suffix(".wav")), dtype="float32")
    assert rate == 16000
    # the session heard the fed audio (not silence or a dead stream)
    assert len(samples) >= 0.8 * len(audio) and np.abs(samples).max() > 0.1
    return got, samples


def test_simulate_dictation_equals_transcribe_voxtral(pulse, vr_dir, vr_model, tmp_path):
    audio = np.concatenate([speechlike(1.0, seed=1), np.zeros(16000, np.float32),
                            speechlike(1.0, seed=2)])  # with a second of silence inside
    sim = Sim(["--asr-model", vr_dir, "--save-audio", tmp_path], pulse.env)
    got, samples = _dictate(sim, pulse, audio, tmp_path)
    sim.quit()
    ref = vr_model.transcribe(samples, 16000)
    assert got["tokens"] == ref.token_ids and len(ref.token_ids) > 30  # streaming == offline
    assert got["text"] == ref.text
    assert [e["text"] for e in sim.of("inserted")] == ([ref.text] if ref.text.strip() else [])


def test_simulate_dictation_inserts_the_transcript_nemotron(pulse, tmp_path):
    import mlx_speech

    audio = speechlike(1.5, seed=0)
    sim = Sim(["--asr-model", NEMOTRON, "--save-audio", tmp_path], pulse.env)
    got, samples = _dictate(sim, pulse, audio, tmp_path)
    sim.quit()
    ref = mlx_speech.load(NEMOTRON).transcribe(samples, 16000).text
    assert len(ref) > 80  # long: pasted through the (in-memory) clipboard
    assert [(e["text"], e["how"]) for e in sim.of("inserted")] == [(ref, "pasted")]
    assert sim.of("recent")[0]["text"] == ref
    assert [p["text"] for p in sim.of("partial")][-1].strip() == ref  # partials grew to it


def test_simulate_speak_selection_plays_generate(pulse, tmp_path):
    import mlx_speech.models.voxtral_tts as vt

    text, frames = "Hello there.", 12
    sim = Sim(["--tts-model", TINY_TTS, "--voice", "neutral_female", "--max-frames", frames,
               "--no-preload"], pulse.env)
    sim.until(_state("idle"))
    sim.send(f"select {text}")
    with pulse.record_speaker() as rec:
        sim.send("press speak", "release speak")
        sim.until(lambda e: e["event"] == "spoken", timeout=60)
        rec.settle(0.5)  # what is still in the device's buffers
    sim.quit()
    assert sim.of("speaking")[0]["text"] == text
    ref = vt.load(TINY_TTS).generate(text, voice="neutral_female", max_frames=frames).samples
    ref = np.clip(ref, -1, 1)
    assert len(ref) == frames * 1920
    assert abs(sim.of("spoken")[0]["seconds"] - len(ref) / 24000) < 1e-3
    # generate()'s samples, played exactly (16-bit precision) and in order; on a machine too
    # busy to generate in real time an underrun plays silence between blocks, never anything
    # else: exact-silence runs are dropped on both sides (as 16-bit samples)
    got, ref = without_gaps(rec.samples), without_gaps(np.round(ref * 32767) / 32767)
    off = align(got, ref)
    assert np.abs(got[off: off + len(ref)] - ref).max() < 2.5 / 32767
