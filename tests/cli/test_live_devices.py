"""The live commands end to end through real audio devices: PortAudio on a private
PulseAudio daemon (tests/support/pulse.py), with a microphone fed in real time from a FIFO and a
speaker whose output is recorded, on the tiny checkpoints. Skipped without pulseaudio.

Each program runs as a user would start it (a subprocess) and is stopped with SIGINT.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from tests.conftest import speechlike
from tests.support.pulse import align, favoured, without_gaps

ROOT = Path(__file__).resolve().parents[2]
TINY_TTS = ROOT / "tests" / "golden" / "voxtral_tts" / "ckpt"
BLOCK = 1280  # transcribe --live reads 80 ms blocks at 16 kHz
EXIT_S = 1.0  # Ctrl-C must end a live command within this (what the bug broke: it hung)


def _exit_limit() -> float:
    """EXIT_S on an idle machine, stretched by CPU contention (load per core above 1) so a
    shared, busy box does not make these flaky; a hang never passes either way."""
    try:
        per_core = os.getloadavg()[0] / (os.cpu_count() or 1)
    except OSError:
        per_core = 1.0
    return EXIT_S * max(1.0, per_core)


class Cli:
    """A command in a subprocess on the virtual devices; stderr is collected as it comes."""

    def __init__(self, pulse, *args: str):
        env = dict(os.environ, PYTHONPATH=str(ROOT), **pulse.env)
        self.proc = subprocess.Popen([sys.executable, "-m", *args], env=env, text=True,
                                     preexec_fn=favoured,  # audio ahead of other work
                                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE)
        self.err_lines: list[str] = []
        self._ready = threading.Event()
        self._reader = threading.Thread(target=self._read_err, daemon=True)
        self._reader.start()
        self.out = self.err = ""
        self.exit_s: float | None = None

    def _read_err(self) -> None:
        for line in self.proc.stderr:
            self.err_lines.append(line)
            if "listening" in line or "speaking" in line:
                self._ready.set()
        self._ready.set()

    def wait_ready(self, timeout: float = 120) -> None:
        assert self._ready.wait(timeout), "the command never started listening"
        assert self.proc.poll() is None, "".join(self.err_lines)

    def interrupt(self) -> int:
        """SIGINT (Ctrl-C); returns the exit code and records how long the exit took."""
        t0 = time.monotonic()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        return self.finish(t0)

    def finish(self, t0: float | None = None, timeout: float = 10) -> int:
        t0 = time.monotonic() if t0 is None else t0
        try:
            self.out = self.proc.stdout.read() if self._wait(t0 + timeout) else ""
        finally:
            if self.proc.poll() is None:  # hung: the test fails, the process must not stay
                self.proc.kill()
                self.proc.wait()
        self.exit_s = time.monotonic() - t0
        self._reader.join(5)
        self.err = "".join(self.err_lines)
        return self.proc.returncode

    def _wait(self, deadline: float) -> bool:
        try:
            self.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            return True
        except subprocess.TimeoutExpired:
            return False


def _expected_live_text(model, audio: np.ndarray) -> str:
    """What transcribe --live prints for these blocks: the same loop, in process."""
    session, lines, line = model.session(), [], ""
    for i in range(0, len(audio), BLOCK):
        line += session.feed(audio[i:i + BLOCK])
        if session.done:
            lines.append(line)
            session, line = model.session(), ""
    lines.append(line + session.finish())
    # a line starts at its first non-space character; a session that said nothing prints nothing
    return "".join(t.lstrip() + "\n" for t in lines if t.strip())


def _wait_saved(saved: Path, samples: int, timeout: float = 60.0) -> None:
    """Until --save-audio's file holds `samples` float32 samples past its header: every fed
    block reached the command (it writes whole blocks as they arrive). A generous bound: on a
    busy machine the audio server can lag by seconds."""
    deadline = time.monotonic() + timeout
    while not (saved.exists() and saved.stat().st_size >= samples * 4 + 44):
        assert time.monotonic() < deadline, "the fed audio never all arrived"
        time.sleep(0.05)


def _fed(x: np.ndarray) -> np.ndarray:
    """The samples a float32 PortAudio input returns for x written to the FIFO as s16."""
    return (np.round(np.clip(x, -1, 1) * 32767) / 32768).astype(np.float32)


def _check_transcript(vr_model, saved: Path, cli: Cli, fed: np.ndarray | None = None):
    got, rate = sf.read(str(saved), dtype="float32")
    assert rate == 16000 and len(got) % BLOCK == 0 and len(got) > 0
    if fed is not None:  # every block that was fed arrived, unchanged: none dropped
        assert len(got) == len(fed)
        np.testing.assert_array_equal(got, fed)
    assert cli.out == _expected_live_text(vr_model, got)
    ids = vr_model.transcribe(got).token_ids
    if vr_model.tokenizer.special_id("</s>") not in ids:  # one session: the offline transcript
        assert cli.out.strip() == vr_model.transcribe(got).text.strip()


# ------------------------------------------------------------------ transcribe --live


def test_transcribe_live_prints_the_transcript_of_what_it_heard(pulse, vr_dir, vr_model,
                                                                tmp_path):
    audio = speechlike(20 * BLOCK / 16000, seed=5)  # 20 whole blocks, 1.6 s
    saved = tmp_path / "heard.wav"
    cli = Cli(pulse, "mlx_speech.transcribe", "--live", "--no-vad", "--model", str(vr_dir),
              "--save-audio", str(saved))
    cli.wait_ready()
    feed = pulse.feed_mic(audio)  # at real-time pace
    assert feed.wait(30)
    _wait_saved(saved, len(audio))  # the last blocks through the server, however busy it is
    assert cli.interrupt() == 0, cli.err
    assert cli.exit_s < _exit_limit(), cli.err
    assert "warning" not in cli.err and "dropped" not in cli.err, cli.err
    _check_transcript(vr_model, saved, cli, fed=_fed(audio))


def test_transcribe_live_microphone_goes_quiet_then_away(pulse, vr_dir, vr_model, tmp_path):
    audio = speechlike(15 * BLOCK / 16000, seed=6)
    saved = tmp_path / "heard.wav"
    cli = Cli(pulse, "mlx_speech.transcribe", "--live", "--no-vad", "--model", str(vr_dir),
              "--save-audio", str(saved))
    cli.wait_ready()
    feed = pulse.feed_mic(np.concatenate([audio, audio]))
    time.sleep(0.5)
    feed.pause()  # the microphone stops delivering
    time.sleep(1.2)
    feed.close()  # and its writer goes away
    time.sleep(0.1)
    assert cli.interrupt() == 0, cli.err
    assert cli.exit_s < _exit_limit(), cli.err
    assert "warning: the microphone delivered no audio for" in cli.err, cli.err
    _check_transcript(vr_model, saved, cli)  # the text so far, flushed


def test_transcribe_live_microphone_unplugged(pulse, vr_dir, vr_model, tmp_path):
    saved = tmp_path / "heard.wav"
    cli = Cli(pulse, "mlx_speech.transcribe", "--live", "--no-vad", "--model", str(vr_dir),
              "--save-audio", str(saved))
    cli.wait_ready()
    pulse.feed_mic(speechlike(2.0, seed=7))
    time.sleep(0.6)
    with pulse.unplugged("mic"):
        time.sleep(0.5)
        assert cli.interrupt() == 0, cli.err  # it may have ended by itself already
    assert cli.exit_s < _exit_limit(), cli.err
    assert "warning: the microphone stream ended" in cli.err, cli.err
    _check_transcript(vr_model, saved, cli)


# ------------------------------------------------------------------ say


def test_say_plays_exactly_what_generate_makes(pulse):
    import mlx_speech.models.voxtral_tts as vt

    args = ["Hello there.", "--voice", "neutral_female", "--seed", "2", "--max-frames", "5"]
    ref = vt.load(TINY_TTS).generate(args[0], voice="neutral_female", seed=2, max_frames=5)
    want = np.clip(ref.samples, -1, 1)
    assert ref.sample_rate == pulse.speaker_rate and np.abs(want).max() > 0.01
    with pulse.record_speaker() as rec:
        cli = Cli(pulse, "mlx_speech.say", *args, "--model", str(TINY_TTS))
        assert cli.finish(timeout=120) == 0, cli.err
    # a speaker underrun on a busy machine plays silence between blocks: drop exact-silence
    # runs on both sides (as 16-bit samples, which the recording holds)
    got, want = without_gaps(rec.samples), without_gaps(np.round(want * 32767) / 32767)
    start = align(got, want)
    assert len(got) >= start + len(want)  # nothing cut off at the end
    # PulseAudio converts PortAudio's float32 to the sink's s16: one step of 16 bits
    np.testing.assert_allclose(got[start:start + len(want)], want, atol=1.5 / 32767)


def test_say_speaker_stalls(pulse):
    cli = Cli(pulse, "mlx_speech.say", "Hello there. " * 3, "--max-frames", "60",
              "--model", str(TINY_TTS))
    pulse.wait_client("sink-inputs")
    time.sleep(0.5)
    with pulse.stalled_speaker():
        t0 = time.monotonic()
        code = cli.finish(timeout=15)  # no Ctrl-C: it gives up by itself
    assert code == 1, cli.err
    assert time.monotonic() - t0 < 3.0 + 2.0, cli.err
    last = cli.err.strip().splitlines()[-1]
    assert last.startswith("error: the audio output took no audio for"), cli.err


def test_say_speaker_unplugged(pulse):
    cli = Cli(pulse, "mlx_speech.say", "Hello there. " * 3, "--max-frames", "60",
              "--model", str(TINY_TTS))
    pulse.wait_client("sink-inputs")
    time.sleep(0.5)
    with pulse.unplugged("speaker"):
        code = cli.finish(timeout=15)
    assert code == 1, cli.err
    assert "error: the audio output device went away" in cli.err, cli.err


# ------------------------------------------------------------------ chat


@pytest.fixture(scope="module")
def chat_dir(tmp_path_factory):
    """A tiny Kyutai-layout Moshi, small enough to keep up with 80 ms frames here."""
    from tests.support.moshi import build_random_lm, kyutai_weights, random_lm_kwargs, write_folder

    kw = random_lm_kwargs(card=64, n_q=8, dep_q=4, delays=[0] + [0, 1, 1, 1] * 2)
    return write_folder(tmp_path_factory.mktemp("chat") / "moshi", kw,
                        kyutai_weights(build_random_lm(kw)))


def _stats(err: str) -> str:
    lines = [line for line in err.splitlines() if "frames," in line and "budget" in line]
    assert lines, err
    return lines[-1]


def test_chat_live_conversation(pulse, chat_dir):
    cli = Cli(pulse, "mlx_speech.chat", "--model", str(chat_dir))
    cli.wait_ready()
    with pulse.record_speaker() as rec:
        feed = pulse.feed_mic(speechlike(2.0, seed=8))
        assert feed.wait(30)
        time.sleep(0.3)
        assert cli.interrupt() == 0, cli.err
    assert cli.exit_s < _exit_limit(), cli.err
    stats = _stats(cli.err)
    steps = int(stats.split(" frames,")[0])
    assert steps >= 20, stats  # ~2 s of 80 ms frames went through the model
    assert "0 mic frames dropped" in stats and "warning" not in cli.err, cli.err
    assert np.abs(rec.samples).max() > 0  # the model's answer reached the speaker


def test_chat_live_microphone_goes_quiet(pulse, chat_dir):
    cli = Cli(pulse, "mlx_speech.chat", "--model", str(chat_dir))
    cli.wait_ready()
    feed = pulse.feed_mic(speechlike(3.0, seed=9))
    time.sleep(0.6)
    feed.pause()
    time.sleep(1.2)
    assert cli.interrupt() == 0, cli.err
    assert cli.exit_s < _exit_limit(), cli.err
    assert "warning: the microphone delivered no audio for" in cli.err, cli.err
    assert int(_stats(cli.err).split(" frames,")[0]) > 0
    feed.close()


def test_chat_live_speaker_stalls(pulse, chat_dir):
    cli = Cli(pulse, "mlx_speech.chat", "--model", str(chat_dir))
    cli.wait_ready()
    pulse.feed_mic(speechlike(4.0, seed=10))
    time.sleep(0.6)
    with pulse.stalled_speaker():
        time.sleep(1.2)
        assert cli.interrupt() == 0, cli.err
    assert cli.exit_s < _exit_limit(), cli.err
    assert "warning: the audio output took no audio for" in cli.err, cli.err
    _stats(cli.err)


def test_chat_live_devices_unplugged(pulse, chat_dir):
    cli = Cli(pulse, "mlx_speech.chat", "--model", str(chat_dir))
    cli.wait_ready()
    pulse.feed_mic(speechlike(3.0, seed=11))
    time.sleep(0.6)
    with pulse.unplugged("mic"):  # the headset is pulled out: microphone and speaker go
        time.sleep(0.5)
        assert cli.interrupt() == 0, cli.err
    assert cli.exit_s < _exit_limit(), cli.err
    assert "warning: the microphone stream ended" in cli.err, cli.err
    _stats(cli.err)
