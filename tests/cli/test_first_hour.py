"""What a new user hits in the first hour (issue 32), each finding as it was and as it is: MLX
without its backend, Ctrl-C, outputs that collided, checks after the load, truncated and long
files, the formats people have, and the smaller frictions."""

from __future__ import annotations

import contextlib
import json
import os
import struct
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

import mlx_speech
from mlx_speech import chat, say, transcribe
from mlx_speech.models.asr import Transcript, Word
from tests.conftest import speechlike

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "golden"
NEMOTRON = GOLDEN / "nemotron"
TTS = GOLDEN / "voxtral_tts" / "ckpt"


@pytest.fixture
def no_load(no_weights_loaded):
    """Loading any model's weights fails the test."""


def last_error(capsys) -> str:
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines and lines[-1].startswith("error: "), lines
    return lines[-1]


class WordPerBlock:
    """A stand-in ASR model: one word per block fed ("w0", "w1", ...), 1 s apart."""

    kind, sample_rate = "asr", 16000

    def __init__(self, after=None):
        self.after = after  # called with the number of blocks fed so far

    def session(self, **kw):
        asr = self

        class Session:
            def __init__(self):
                self.words = []

            def feed(self, x):
                self.words.append(Word(f"w{len(self.words)}", len(self.words), len(self.words)
                                       + 0.5))
                if asr.after is not None:
                    asr.after(len(self.words))
                return ""

            def finish(self):
                return ""

            def result(self):
                return Transcript(" ".join(w.text for w in self.words), [], list(self.words))

        return Session()


def _wav(path: Path, seconds: float, rate: int = 16000) -> Path:
    sf.write(path, speechlike(seconds)[: int(seconds * 16000)], 16000)
    return path


# ---- 2. MLX installed without its backend ---------------------------------------------------
COMMANDS = [["doctor", "--offline"], ["transcribe", "{wav}", "--model", str(NEMOTRON)],
            ["say", "Hello.", "-o", "{tmp}/x.wav", "--model", str(TTS)],
            ["convert", str(NEMOTRON), "{tmp}/out"],
            ["server", "--model", str(NEMOTRON), "--port", "0", "--no-vad"]]


@pytest.mark.parametrize("argv", COMMANDS, ids=lambda a: a[0])
def test_without_an_mlx_backend_every_command_says_which_extra(argv, tmp_path):
    """Old: `ImportError: libmlx.so...` as a traceback (doctor) or 'this is a bug'."""
    fake = tmp_path / "nomlx" / "mlx"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "core.py").write_text('raise ImportError("libmlx.so: cannot open shared object '
                                  'file: No such file or directory")\n')
    (fake / "utils.py").write_text("import mlx.core\n")  # as MLX's own Python parts do
    (fake / "nn").mkdir()
    (fake / "nn" / "__init__.py").write_text("import mlx.core\n")
    argv = [a.format(wav=_wav(tmp_path / "a.wav", 1.0), tmp=tmp_path) for a in argv]
    r = subprocess.run([sys.executable, "-m", "mlx_speech", *argv], cwd=ROOT, text=True,
                       capture_output=True, timeout=300, stdin=subprocess.DEVNULL,
                       env={**os.environ, "PYTHONPATH": f"{fake.parent}{os.pathsep}{ROOT}",
                            "HF_HUB_OFFLINE": "1"})
    assert "Traceback" not in r.stderr and "this is a bug" not in r.stderr, r.stderr
    want = "pip install 'mlx-realtime-speech[cpu]' (no NVIDIA GPU) or pip install " \
           "'mlx-realtime-speech[cuda]' (an NVIDIA GPU)"
    if argv[0] == "doctor":
        row = next(line for line in r.stdout.splitlines() if line.startswith("mlx "))
        assert r.returncode == 0 and "FAIL" in row and want in row, r.stdout
    else:
        assert r.returncode == 1, r.stderr
        assert r.stderr.strip().splitlines()[-1] == (
            "error: MLX has no backend here (libmlx.so: cannot open shared object file: No such "
            f"file or directory): {want}")


# ---- 6. Ctrl-C keeps what is done -----------------------------------------------------------
@pytest.fixture
def ctrl_c_after(monkeypatch):
    """transcribe's first Ctrl-C, pressed once `n` blocks were fed."""
    from mlx_speech import cliutil

    stop = threading.Event()

    @contextlib.contextmanager
    def fake_stop():
        yield stop

    monkeypatch.setattr(cliutil, "stop_on_ctrl_c", fake_stop)

    def arm(n: int) -> WordPerBlock:
        model = WordPerBlock(after=lambda fed: fed >= n and stop.set())
        monkeypatch.setattr(mlx_speech, "load", lambda *a, **k: model)
        return model

    return arm


@pytest.mark.parametrize("out", ["long.srt", None])
def test_ctrl_c_writes_the_finished_segments_then_exits_130(ctrl_c_after, tmp_path, capsys,
                                                           out):
    """Old: at 16 % of a 3-hour file, `interrupted`, exit 130, nothing written."""
    ctrl_c_after(3)
    wav = _wav(tmp_path / "long.wav", 20.0)
    argv = [str(wav)] + (["-o", str(tmp_path / out)] if out else ["--format", "srt"])
    assert transcribe.main(argv) == 130
    cap = capsys.readouterr()
    text = (tmp_path / out).read_text() if out else cap.out
    said = " ".join(line for line in text.splitlines() if line.startswith("w")).split()
    assert said == ["w0", "w1", "w2"]  # the blocks before the Ctrl-C, nothing after
    assert "interrupted at 00:00:06.000 of" in cap.err and cap.err.strip().endswith(
        "interrupted")


def test_ctrl_c_json_says_how_much_was_transcribed(ctrl_c_after, tmp_path, capsys):
    ctrl_c_after(2)
    wav = _wav(tmp_path / "long.wav", 20.0)
    assert transcribe.main([str(wav), "-o", str(tmp_path / "t.json")]) == 130
    doc = json.loads((tmp_path / "t.json").read_text())
    assert doc["text"] == "w0 w1" and doc["transcribed"] == 4.0 and doc["duration"] == 20.0


def test_live_o_keeps_the_lines_in_the_file(vr_dir, monkeypatch, tmp_path, capsys):
    """Old: --live -o FILE wrote nothing to FILE."""
    import mlx_speech.audio.devices as devices
    from tests.support.sounddevice_fakes import fake_sounddevice
    from tests.support.turns_audio import fake_microphone

    audio = speechlike(2.0, seed=3)
    fake_sounddevice(monkeypatch)
    monkeypatch.setattr(devices, "Microphone", fake_microphone(
        [audio[i: i + 1280] for i in range(0, len(audio), 1280)]))
    out = tmp_path / "live.txt"
    assert transcribe.main(["--live", "--no-vad", "--model", str(vr_dir), "-o", str(out)]) == 0
    cap = capsys.readouterr()
    assert out.read_text() == cap.out and f"wrote {out}" in cap.err
    assert transcribe.main(["--live", "--model", str(vr_dir), "-o", str(tmp_path / "l.srt")]) == 1
    assert "--live writes its lines as text" in last_error(capsys)


# ---- 7. outputs never collide ---------------------------------------------------------------
def test_same_stem_inputs_get_one_output_each(monkeypatch, tmp_path, capsys):
    """Old: talk.wav talk.flac talk.ogg -o out/ wrote out/talk.vtt three times: one file."""
    monkeypatch.setattr(mlx_speech, "load", lambda *a, **k: WordPerBlock())
    x = speechlike(1.0)
    files = []
    for ext in ("wav", "flac", "ogg"):
        sf.write(tmp_path / f"talk.{ext}", x, 16000)
        files.append(str(tmp_path / f"talk.{ext}"))
    sf.write(tmp_path / "other.wav", x, 16000)
    files.append(str(tmp_path / "other.wav"))
    assert transcribe.main([*files, "-o", str(tmp_path / "out"), "--format", "vtt"]) == 0
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "other.vtt", "talk.flac.vtt", "talk.ogg.vtt", "talk.wav.vtt"]
    capsys.readouterr()


@pytest.mark.parametrize("argv, says", [
    (["{a}", "{b}", "-o", "{tmp}/single.txt"], "-o {tmp}/single.txt names a file, but 2 inputs "
                                              "write one transcript each: give a folder"),
    (["{a}", "{a}", "-o", "{tmp}/o"], "{a} is given twice"),
    (["{a}", "{sub}", "-o", "{tmp}/o"], "{a} and {sub} would both write {tmp}/o/a.wav.txt"),
    (["{a}", "--format", "json", "-o", "{tmp}/x.srt"], "cannot write {tmp}/x.srt: its extension "
                                                       "says srt, --format says json"),
])
def test_colliding_or_contradicting_outputs_are_refused_before_any_work(no_load, tmp_path,
                                                                        capsys, argv, says):
    a, b = _wav(tmp_path / "a.wav", 0.5), _wav(tmp_path / "b.wav", 0.5)
    (tmp_path / "sub").mkdir()
    sub = _wav(tmp_path / "sub" / "a.wav", 0.5)
    fill = {"a": a, "b": b, "sub": sub, "tmp": tmp_path}
    argv = [x.format(**fill) for x in argv] + ["--model", str(NEMOTRON)]
    assert transcribe.main(argv) == 1
    assert says.format(**fill) in last_error(capsys)
    assert not (tmp_path / "single.txt").exists() and not (tmp_path / "x.srt").exists()


def test_o_is_a_file_for_one_input_and_a_folder_when_it_is_one(monkeypatch, tmp_path, capsys):
    """Old: one input with -o out/ (an existing folder): 'cannot write out: it is a folder'."""
    monkeypatch.setattr(mlx_speech, "load", lambda *a, **k: WordPerBlock())
    wav = _wav(tmp_path / "talk.wav", 0.5)
    (tmp_path / "out").mkdir()
    assert transcribe.main([str(wav), "-o", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "talk.txt").read_text() == "w0\n"
    assert transcribe.main([str(wav), "-o", str(tmp_path / "new") + "/"]) == 0
    assert (tmp_path / "new" / "talk.txt").exists()
    assert transcribe.main([str(wav), "-o", str(tmp_path / "one.json")]) == 0
    assert json.loads((tmp_path / "one.json").read_text())["text"] == "w0"
    capsys.readouterr()


# ---- 8. every check before the load ---------------------------------------------------------
@pytest.fixture(scope="module")
def moshi_dir(tmp_path_factory) -> Path:
    from tests.support.moshi import build_random_lm, kyutai_weights, random_lm_kwargs, write_folder

    kw = random_lm_kwargs(card=64, n_q=16, dep_q=8,
                          delays=[0, 0, 1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 1])
    return write_folder(tmp_path_factory.mktemp("ky") / "moshi", kw,
                        kyutai_weights(build_random_lm(kw)))


def test_chat_prompts_on_a_moshi_checkpoint_are_refused_before_the_load(no_load, moshi_dir,
                                                                       tmp_path, capsys):
    wav = _wav(tmp_path / "q.wav", 0.5)
    for flag in (["--role", "You are a tutor."], ["--voice", "NATF2"]):
        assert chat.main(["--model", str(moshi_dir), "--input", str(wav), *flag]) == 1
        assert last_error(capsys) == (
            f"error: {moshi_dir} is a Kyutai Moshi model: voice and role prompts need a "
            "PersonaPlex checkpoint (e.g. nvidia/personaplex-7b-v1)")


@pytest.mark.parametrize("argv, says", [
    (["Hello.", "--voice", "nobody"], "error: unknown voice 'nobody'; known voices: casual_male, "
                                      "neutral_female"),
    (["?!"], "error: text '?!' has no letters or digits to speak"),
    (["hi", "--seed", "-1"], None),  # a usage error now (was 'unexpected failure ... bug')
])
def test_say_input_is_checked_before_the_load(no_load, tmp_path, capsys, argv, says):
    argv = [*argv, "--model", str(TTS), "-o", str(tmp_path / "x.wav")]
    if says is None:
        with pytest.raises(SystemExit) as e:
            say.main(argv)
        assert e.value.code == 2 and "--seed: must be between 0 and" in capsys.readouterr().err
        return
    assert say.main(argv) == 1
    assert last_error(capsys) == says


def test_a_wav_with_nan_is_refused_before_the_load(no_load, tmp_path, capsys):
    x = np.zeros(16000, np.float32)
    x[8000] = np.inf
    sf.write(tmp_path / "n.wav", x, 16000, subtype="FLOAT")
    assert transcribe.main([str(tmp_path / "n.wav"), "--model", str(NEMOTRON)]) == 1
    assert last_error(capsys) == (f"error: {tmp_path / 'n.wav'} contains NaN or infinite "
                                  "samples (first at 0.500 s)")
    assert chat.main(["--input", str(tmp_path / "n.wav"), "--model", str(TTS)]) == 1
    assert "NaN" in last_error(capsys)


# ---- 11. truncated input --------------------------------------------------------------------
def test_a_truncated_wav_is_transcribed_with_a_warning(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(mlx_speech, "load", lambda *a, **k: WordPerBlock())
    p = _wav(tmp_path / "cut.wav", 2.0)
    b = bytearray(p.read_bytes())
    i = b.find(b"data")
    b[i + 4: i + 8] = struct.pack("<I", 3 * 3600 * 32000)
    p.write_bytes(bytes(b))
    assert transcribe.main([str(p)]) == 0
    cap = capsys.readouterr()
    assert cap.out == "w0\n"
    assert (f"warning: {p} is truncated: its header announces 3:00:00 of audio, the file holds "
            "2.0 s; only that much was read") in cap.err


# ---- 12. long files in bounded memory -------------------------------------------------------
PEAK_RSS = """
import resource, runpy, sys
sys.argv = ["mlx_speech.transcribe", *sys.argv[1:]]
try:
    runpy.run_module("mlx_speech.transcribe", run_name="__main__")
except SystemExit as e:
    assert not e.code, e.code
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)
"""


def test_peak_memory_is_flat_in_the_file_length(tmp_path):
    """Old: a 30-minute 48 kHz stereo WAV peaked at 1.98 GB (decoded whole at its own rate and
    channels), ~60 MB more per minute. Now 3 minutes peak as 20 s do, with a tiny model."""
    peaks = {}
    for seconds in (20, 180):
        path = tmp_path / f"{seconds}.wav"
        with sf.SoundFile(path, "w", 48000, 2, "PCM_16") as f:
            for i in range(seconds // 10):
                t = np.arange(480000) / 48000
                f.write(np.stack([0.2 * np.sin(2 * np.pi * (200 + i) * t)] * 2, 1))
        r = subprocess.run([sys.executable, "-c", PEAK_RSS, str(path), "--model", str(NEMOTRON),
                            "-o", str(tmp_path / f"{seconds}.txt")], cwd=ROOT, text=True,
                           capture_output=True, timeout=600,
                           env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert r.returncode == 0, r.stderr[-2000:]
        peaks[seconds] = int(r.stderr.strip().splitlines()[-1]) / 1024  # MB
    # 160 s more of 48 kHz stereo is 61 MB as float32, 122 MB with the mix and resample of old
    assert peaks[180] - peaks[20] < 25, peaks


# ---- 13. the formats people have ------------------------------------------------------------
def test_a_voice_memo_transcribes_as_its_decoded_audio_does(tmp_path, capsys):
    av = pytest.importorskip("av")
    from mlx_speech.audio.decode import decode

    x = speechlike(2.0)
    c = av.open(str(tmp_path / "memo.m4a"), "w", format="ipod")
    s = c.add_stream("aac", rate=16000, layout="mono")
    frame = av.AudioFrame.from_ndarray(x[None], format="fltp", layout="mono")
    frame.sample_rate = 16000
    for pkt in [*s.encode(frame), *s.encode(None)]:
        c.mux(pkt)
    c.close()
    assert transcribe.main([str(tmp_path / "memo.m4a"), "--model", str(NEMOTRON)]) == 0
    got = capsys.readouterr().out
    heard = np.concatenate(list(decode(tmp_path / "memo.m4a", 16000)))
    assert got == mlx_speech.load(NEMOTRON).transcribe(heard).text + "\n"


# ---- 14. the smaller points -----------------------------------------------------------------
@pytest.mark.parametrize("cmd", ["mlx_speech", "mlx_speech.transcribe", "mlx_speech.say",
                                 "mlx_speech.chat", "mlx_speech.convert", "mlx_speech.server",
                                 "mlx_speech.app", "mlx_speech.doctor"])
def test_every_command_has_version(cmd):
    r = subprocess.run([sys.executable, "-m", cmd, "--version"], cwd=ROOT, text=True,
                       capture_output=True, timeout=120, env={**os.environ,
                                                             "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0 and r.stdout.strip() == (
        f"mlx_speech {mlx_speech.__version__} (mlx-realtime-speech)"), r.stderr


def test_exit_codes_are_the_ones_the_readme_gives(no_load, tmp_path, capsys):
    readme = (ROOT / "README.md").read_text()
    assert "exit code 1" in readme and "a malformed option exits 2" in readme
    with pytest.raises(SystemExit) as e:
        transcribe.main(["--no-such-flag"])
    assert e.value.code == 2
    assert transcribe.main([str(tmp_path / "absent.wav"), "--model", str(NEMOTRON)]) == 1
    capsys.readouterr()


def test_latency_zero_says_positive(no_load, tmp_path, capsys):
    wav = _wav(tmp_path / "a.wav", 0.5)
    assert transcribe.main([str(wav), "--latency-ms", "0", "--model", str(NEMOTRON)]) == 1
    assert last_error(capsys) == ("error: Nemotron's latency is one of 80, 160, 560, 1120 ms, "
                                  "got 0")  # the family's own rule, from its config files
    vr = GOLDEN / "voxtral_realtime" / "mistral"
    assert transcribe.main([str(wav), "--latency-ms", "0", "--model", str(vr)]) == 1
    assert "must be a multiple of 80 ms between 80 and" in last_error(capsys)


def test_convert_hub_failure_suggests_nothing_convert_lacks(tmp_path, monkeypatch, capsys):
    from mlx_speech import convert

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    assert convert.main(["nvidia/absent", str(tmp_path / "out")]) == 1
    line = last_error(capsys)
    assert "cannot fetch 'nvidia/absent'" in line and "--model" not in line
    assert "a local checkpoint folder instead of the repo id" in line


def test_a_long_hotword_names_its_line(no_load, tmp_path, capsys):
    wav = _wav(tmp_path / "a.wav", 0.5)
    (tmp_path / "words.txt").write_text("Kubernetes\n# a comment\n" + "x" * 201 + "\n")
    assert transcribe.main([str(wav), "--hotwords-file", str(tmp_path / "words.txt"),
                            "--model", str(NEMOTRON)]) == 1
    assert last_error(capsys) == (f"error: hotwords file {tmp_path / 'words.txt'}: line 3 is "
                                  "longer than 200 characters")
    assert transcribe.main([str(wav), "--hotwords", "ok," + "y" * 300,
                            "--model", str(NEMOTRON)]) == 1
    assert last_error(capsys) == "error: hotword 2 is longer than 200 characters"


def test_chat_input_without_o_says_the_answer_is_not_kept(monkeypatch, tmp_path, capsys):
    class Duplex:
        kind, sample_rate, frame_size = "duplex", 24000, 1920

        def session(self, **kw):
            class S:
                def step(self, x):
                    return np.zeros(1920, np.float32), ""

            return S()

    monkeypatch.setattr(mlx_speech, "load", lambda *a, **k: Duplex())
    wav = _wav(tmp_path / "q.wav", 0.2)
    assert chat.main(["--input", str(wav), "--tail", "0"]) == 0
    assert "note: without -o the model's answer is not kept" in capsys.readouterr().err


def test_say_progress_bar_reads_as_words(capsys):
    p = say._Progress(True)
    p.chunk(1.2)
    p.model(1, 4)
    p.close()
    err = capsys.readouterr().err
    assert "part [" not in err and "?part/s" not in err and "it/s" not in err
    assert "1.2 s of audio" in err and "1/4 parts" in err


def test_doctor_names_the_debian_portaudio_package(monkeypatch, tmp_path):
    """sounddevice installed, the system's PortAudio not: the fix is a Debian package."""
    from mlx_speech import doctor

    (tmp_path / "sounddevice.py").write_text('raise OSError("PortAudio library not found")\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "sounddevice", raising=False)
    (row,) = doctor.audio_rows()
    assert row[1] == "n/a" and "sudo apt-get install libportaudio2" in row[2], row


def test_an_empty_file_is_empty_everywhere(no_load, tmp_path, capsys):
    """Old: a 0-byte file was 'format not supported' on the command line, 'is empty' from the
    server."""
    (tmp_path / "zero.wav").write_bytes(b"")
    assert transcribe.main([str(tmp_path / "zero.wav"), "--model", str(NEMOTRON)]) == 1
    assert last_error(capsys) == f"error: {tmp_path / 'zero.wav'} is empty (0 bytes)"
