"""mlx_speech.say with a small fake TTS model (real-checkpoint runs come with the model)."""

from __future__ import annotations

import io
import os
import sys
import threading
import time

import numpy as np
import pytest
import soundfile as sf

import mlx_speech
from mlx_speech import cli, say
from mlx_speech.audio.clip import Audio
from mlx_speech.errors import MlxSpeechError
from tests.support.sounddevice_fakes import fake_sounddevice

SR = 24000


def tone(seconds: float, f: float, sr: int = SR) -> np.ndarray:
    return (0.4 * np.sin(2 * np.pi * f * np.arange(round(seconds * sr)) / sr)).astype(np.float32)


class FakeTTS:
    """One 0.25 s tone per sentence; the pitch depends on the voice and seed."""

    kind = "tts"
    sample_rate = SR
    voices = ["neutral_female", "casual_male"]

    def __init__(self, delay: float = 0.0, interrupt_after: int | None = None):
        self.delay, self.interrupt_after = delay, interrupt_after
        self.calls: list[dict] = []
        self.last_chunk_at = None
        self.piece_seen = threading.Event()

    def _sentences(self, text):
        return [s for s in text.replace("!", ".").split(".") if s.strip()] or [text]

    def stream(self, text, voice=None, seed=0, max_frames=None):
        self.calls.append({"text": text, "voice": voice, "seed": seed, "max_frames": max_frames})
        if voice is not None and voice not in self.voices:
            raise MlxSpeechError(f"unknown voice {voice!r}; known voices: "
                                 + ", ".join(self.voices))
        f = 300.0 + 100 * (self.voices.index(voice) if voice else 0) + seed
        for i, _ in enumerate(self._sentences(text)):
            if self.interrupt_after is not None and i == self.interrupt_after:
                raise KeyboardInterrupt
            if i and self.delay:
                time.sleep(self.delay)
            self.last_chunk_at = time.monotonic()
            yield Audio(tone(0.25, f), SR)

    def stream_text(self, pieces, voice=None, seed=0, max_frames=None):
        """One tone per sentence as soon as its "." or "!" has arrived (the same tones as
        `stream`); records the pieces as they come."""
        call = {"text": None, "voice": voice, "seed": seed, "max_frames": max_frames}
        self.calls.append(call)
        self.pieces, buf, said = [], "", 0
        for piece in pieces:
            self.pieces.append(piece)
            self.piece_seen.set()
            buf += piece
            ends = buf.replace("!", ".").count(".")
            for _ in range(ends - said):
                yield from self.stream("x.", voice, seed, max_frames)
            said = ends
        call["text"] = buf.strip()
        if buf.replace("!", ".").rsplit(".", 1)[-1].strip():
            yield from self.stream("x.", voice, seed, max_frames)

    def generate(self, text, voice=None, seed=0, max_frames=None):
        return Audio.concat(list(self.stream(text, voice, seed, max_frames)))

    def expected(self, text, voice=None, seed=0):
        return self.generate(text, voice, seed).samples


class ProgressTTS(FakeTTS):
    def stream(self, text, voice=None, seed=0, max_frames=None, progress=None):
        n = len(self._sentences(text))
        for i, chunk in enumerate(super().stream(text, voice, seed, max_frames)):
            yield chunk
            if progress is not None:
                progress(i + 1, n)
                self.reported = (i + 1, n)


@pytest.fixture
def fake(monkeypatch):
    model = FakeTTS()
    loads = []

    def load(path, **kw):
        loads.append((path, {k: v for k, v in kw.items() if k != "log"}))
        return model

    monkeypatch.setattr(mlx_speech, "load", load)
    model.loads = loads
    return model


def run(argv, capsys):
    code = say.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def one_line_error(err: str) -> str:
    lines = err.strip().splitlines()
    assert "Traceback" not in err and lines[-1].startswith("error: "), err
    return lines[-1]


def test_parser_defaults_and_choices():
    a = say.build_parser().parse_args(["hi"])
    assert (a.text, a.model, a.voice, a.output, a.format, a.seed, a.max_frames, a.dtype) == (
        "hi", "mistralai/Voxtral-4B-TTS-2603", None, None, None, 0, None, None)
    a = say.build_parser().parse_args(["--format", "MP3", "-o", "x", "--seed", "3"])
    assert a.text is None and a.format == "mp3" and a.seed == 3
    with pytest.raises(SystemExit):
        say.build_parser().parse_args(["hi", "--format", "aac"])


def test_write_wav_with_voice_and_options(fake, tmp_path, capsys):
    out = tmp_path / "hello.wav"
    code, stdout, err = run(["Hello. World.", "--voice", "casual_male", "--seed", "5",
                             "--max-frames", "40", "--dtype", "float16", "-o", str(out)], capsys)
    assert code == 0, err
    assert stdout == "" and f"wrote {out} (0.5 s of audio)" in err
    assert fake.loads == [("mistralai/Voxtral-4B-TTS-2603", {
        "kind": "tts", "dtype": "float16",
        "options": {"voice": "casual_male", "text": "Hello. World."}})]  # checked before load
    assert fake.calls[0] == {"text": "Hello. World.", "voice": "casual_male", "seed": 5,
                             "max_frames": 40}
    y, sr = sf.read(out, dtype="float32")
    assert sr == SR and sf.info(str(out)).subtype == "PCM_16"
    np.testing.assert_allclose(y, fake.expected("Hello. World.", "casual_male", 5), atol=1e-4)
    assert [p.name for p in tmp_path.iterdir()] == ["hello.wav"]  # no temp file left


@pytest.mark.parametrize("name,fmt,container,rate", [
    ("a.flac", None, "FLAC", SR), ("a.ogg", None, "OGG", SR), ("a.opus", None, "OGG", SR),
    ("a.mp3", None, "MP3", SR), ("a.wav", "flac", "FLAC", SR), ("noext", "ogg", "OGG", SR),
])
def test_every_container_format(fake, tmp_path, capsys, name, fmt, container, rate):
    argv = ["One. Two.", "-o", str(tmp_path / name)] + (["--format", fmt] if fmt else [])
    code, _, err = run(argv, capsys)
    assert code == 0, err
    info = sf.info(str(tmp_path / name))
    assert info.format == container and info.samplerate == rate
    assert abs(info.frames - 0.5 * rate) <= 0.02 * rate


def test_raw_pcm(fake, tmp_path, capsys):
    code, _, err = run(["One.", "-o", str(tmp_path / "a.pcm")], capsys)
    assert code == 0, err
    y = np.fromfile(tmp_path / "a.pcm", "<i2").astype(np.float32) / 32767
    np.testing.assert_allclose(y, fake.expected("One."), atol=1e-4)


@pytest.mark.parametrize("arg", [None, "-"])
def test_text_from_stdin(fake, tmp_path, capsys, monkeypatch, arg):
    monkeypatch.setattr(sys, "stdin", io.StringIO("  Piped text. Two sentences.\n"))
    argv = ([arg] if arg else []) + ["-o", str(tmp_path / "p.wav")]
    code, _, err = run(argv, capsys)
    assert code == 0, err
    assert fake.calls[0]["text"] == "Piped text. Two sentences."
    assert sf.info(str(tmp_path / "p.wav")).frames == 2 * round(0.25 * SR)


def test_stdin_is_spoken_as_it_is_read(fake, tmp_path, capsys, monkeypatch):
    """A pipe whose writer sends its second sentence only once the model has the first, with
    no newline between: say hands the pieces over as they arrive, not at the pipe's end."""
    r, w = os.pipe()
    stdin = os.fdopen(r, "r", encoding="utf-8")
    monkeypatch.setattr(sys, "stdin", stdin)
    waited = []

    def writer():
        os.write(w, b"First one. ")
        waited.append(fake.piece_seen.wait(60))  # the model got the first piece
        os.write(w, "Second one, caf\u00e9.".encode())
        os.close(w)

    t = threading.Thread(target=writer)
    t.start()
    try:
        code, _, err = run(["-", "-o", str(tmp_path / "p.wav")], capsys)
    finally:
        t.join(60)
        stdin.close()
    assert code == 0, err
    assert waited == [True]
    assert fake.pieces == ["First one. ", "Second one, caf\u00e9."]
    assert fake.calls[0]["text"] == "First one. Second one, caf\u00e9."
    assert sf.info(str(tmp_path / "p.wav")).frames == 2 * round(0.25 * SR)


class _Tty(io.StringIO):
    def isatty(self):
        return True


@pytest.mark.parametrize("argv,stdin,needle", [
    (["   \n\t"], None, "empty"),
    ([], io.StringIO(""), "stdin is empty"),
    (["-"], io.StringIO("  \n "), "empty"),
    ([], _Tty(""), "give the text to speak"),
    (["hi", "-o", "x.aac"], None, "unsupported audio format 'aac'"),
    (["hi", "-o", "noext"], None, "no extension"),
    (["hi", "-o", "missing/x.wav"], None, "missing does not exist"),
    (["hi", "-o", ".", "--format", "wav"], None, "it is a folder"),
    (["hi", "--format", "wav"], None, "--format needs -o FILE"),
    (["hi", "--max-frames", "0", "-o", "x.wav"], None, "--max-frames must be a positive"),
])
def test_bad_input_fails_before_loading(fake, tmp_path, capsys, monkeypatch, argv, stdin,
                                        needle):
    monkeypatch.chdir(tmp_path)
    if stdin is not None:
        monkeypatch.setattr(sys, "stdin", stdin)
    code, out, err = run(argv, capsys)
    assert code == 1 and out == ""
    assert needle in one_line_error(err)
    assert fake.loads == []  # nothing was loaded
    assert list(tmp_path.iterdir()) == []  # and nothing was written


def test_unknown_voice_is_the_models_message(fake, tmp_path, capsys):
    code, _, err = run(["hi", "--voice", "robot", "-o", str(tmp_path / "x.wav")], capsys)
    assert code == 1
    assert one_line_error(err) == ("error: unknown voice 'robot'; known voices: "
                                   "neutral_female, casual_male")
    assert list(tmp_path.iterdir()) == []


def test_list_voices(fake, capsys):
    code, out, _ = run(["--list-voices"], capsys)
    assert code == 0 and out.split() == ["neutral_female", "casual_male"]
    fake.voices = []
    code, out, _ = run(["--list-voices"], capsys)
    assert code == 0 and "no voices" in out


def test_not_a_tts_model(tmp_path, capsys):
    asr = TINY_TTS.parents[1] / "voxtral_realtime" / "mistral"  # a real speech-to-text one
    code, _, err = run(["hi", "--model", str(asr), "-o", str(tmp_path / "x.wav")], capsys)
    assert code == 1 and "speech-to-text model, not text-to-speech" in one_line_error(err)


def test_ctrl_c_while_writing_leaves_no_file(fake, tmp_path, capsys):
    fake.interrupt_after = 1
    out = tmp_path / "x.wav"
    out.write_bytes(b"old")
    code, _, err = run(["One. Two. Three.", "-o", str(out)], capsys)
    assert code == 130 and "interrupted" in err and "Traceback" not in err
    assert out.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == ["x.wav"]


def test_progress_callback_is_used_when_offered(monkeypatch, tmp_path, capsys):
    model = ProgressTTS()
    monkeypatch.setattr(mlx_speech, "load", lambda path, **kw: model)
    text = " ".join(f"Sentence {i}." for i in range(60))  # long: a bar even without a tty
    code, _, err = run([text, "-o", str(tmp_path / "long.wav")], capsys)
    assert code == 0, err
    assert model.reported == (60, 60) and "speaking" in err
    assert sf.info(str(tmp_path / "long.wav")).frames == 60 * round(0.25 * SR)


def test_short_text_has_no_bar_off_a_terminal(fake, tmp_path, capsys):
    code, _, err = run(["Short.", "-o", str(tmp_path / "s.wav")], capsys)
    assert code == 0 and "speaking" not in err


def test_playback_streams_while_generating(fake, capsys, monkeypatch):
    sd = fake_sounddevice(monkeypatch, run_device=True)  # pulls much faster than real time
    fake.delay = 0.05
    pulls: list[tuple[float, bool]] = []

    def record(stream):
        def run_device():
            while stream.started:
                out = stream.pull()
                pulls.append((time.monotonic(), bool(out.any())))
                time.sleep(0.001)
        return run_device

    orig = sd.OutputStream.start

    def start(self):
        self._run = record(self)
        orig(self)

    monkeypatch.setattr(sd.OutputStream, "start", start)
    code, out, err = run(["One. Two. Three. Four.", "--voice", "neutral_female"], capsys)
    assert code == 0, err
    assert out == ""
    (stream,) = sd.streams
    assert stream.kw["samplerate"] == SR and stream.closed  # drained: all of it below
    played = np.concatenate(stream.played)
    played = played[np.flatnonzero(played)[0]:]  # startup silence
    expected = fake.expected("One. Two. Three. Four.", "neutral_female")
    # every sample was played, in order, with silent gaps where generation lagged
    assert np.count_nonzero(played) == np.count_nonzero(expected)
    np.testing.assert_array_equal(played[played != 0], expected[expected != 0])
    first_sound = next(t for t, loud in pulls if loud)
    assert first_sound < fake.last_chunk_at  # audio started before generation ended
    assert "playback ran dry" in err  # this device outruns the 50 ms gaps between chunks


def test_no_speaker_suggests_a_file(fake, capsys, monkeypatch):
    fake_sounddevice(monkeypatch, has_output=False)
    code, _, err = run(["hi"], capsys)
    assert code == 1
    assert one_line_error(err) == ("error: no audio output device; "
                                   "use -o FILE to write a file instead")
    monkeypatch.setitem(sys.modules, "sounddevice", None)
    code, _, err = run(["hi"], capsys)
    assert code == 1 and "use -o FILE" in one_line_error(err)
    assert fake.loads == []


def test_ctrl_c_during_playback_stops_at_once(fake, capsys, monkeypatch):
    sd = fake_sounddevice(monkeypatch)  # nobody pulls: a drain would wait
    fake.interrupt_after = 2
    code, _, err = run(["One. Two. Three."], capsys)
    assert code == 130 and "interrupted" in err
    assert sd.streams[0].aborted and sd.streams[0].closed


def test_dispatcher_runs_say(fake, tmp_path, capsys):
    assert {"say", "chat", "transcribe", "convert"} <= set(cli.COMMANDS)
    assert cli.main(["say", "Hi.", "-o", str(tmp_path / "d.wav")]) == 0
    assert sf.info(str(tmp_path / "d.wav")).frames == round(0.25 * SR)


def test_import_is_light():
    import subprocess
    from pathlib import Path

    code = ("import sys, mlx_speech.say, mlx_speech.convert, mlx_speech.cli;"
            "print([m for m in ('torch', 'sounddevice', 'soundfile', 'tqdm') if m in sys.modules])")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       cwd=Path(__file__).resolve().parents[2])
    assert r.stdout.strip() == "[]", r.stderr


TINY_TTS = __import__("pathlib").Path(__file__).parents[1] / "golden" / "voxtral_tts" / "ckpt"


@pytest.mark.parametrize("suffix", ["wav", "mp3"])
def test_end_to_end_on_a_tiny_checkpoint(tmp_path, capsys, suffix):
    """The real model (tiny random Voxtral TTS in the Mistral layout), not a fake."""
    import mlx_speech.models.voxtral_tts as vt

    out = tmp_path / f"hello.{suffix}"
    argv = ["Hello there.", "--model", str(TINY_TTS), "--voice", "neutral_female",
            "--max-frames", "5", "--seed", "2", "-o", str(out)]
    assert say.main(argv) == 0, capsys.readouterr().err
    audio, rate = sf.read(str(out), dtype="float32")
    ref = vt.load(TINY_TTS).generate("Hello there.", voice="neutral_female", seed=2, max_frames=5)
    assert rate == 24000 and len(ref.samples) % 1920 == 0 and len(ref.samples) > 0
    if suffix == "wav":  # 16-bit PCM of the same samples
        assert len(audio) == len(ref.samples)
        assert np.abs(audio - np.clip(ref.samples, -1, 1)).max() < 1e-4
    else:  # mp3 frames pad the ends
        assert abs(len(audio) - len(ref.samples)) < 2 * 1152


def test_end_to_end_list_voices(capsys):
    assert say.main(["--model", str(TINY_TTS), "--list-voices"]) == 0
    assert capsys.readouterr().out.split() == ["casual_male", "neutral_female"]


def test_end_to_end_stdin_on_a_tiny_checkpoint(tmp_path, capsys, monkeypatch):
    """Text from stdin through the real tiny model: its `stream_text`, sentence by sentence."""
    import mlx_speech.models.voxtral_tts as vt

    text = "Hello there. Bye now.\n"
    monkeypatch.setattr(sys, "stdin", io.StringIO(text))
    out = tmp_path / "piped.wav"
    argv = ["-", "--model", str(TINY_TTS), "--voice", "neutral_female", "--max-frames", "5",
            "--seed", "2", "-o", str(out)]
    assert say.main(argv) == 0, capsys.readouterr().err
    audio, _ = sf.read(str(out), dtype="float32")
    ref = np.concatenate([a.samples for a in vt.load(TINY_TTS).stream_text(
        text, voice="neutral_female", seed=2, max_frames=5)])
    assert len(ref) == 2 * 5 * 1920 + round(vt.PAUSE_S * 24000) == len(audio)
    assert np.abs(audio - np.clip(ref, -1, 1)).max() < 1e-4
