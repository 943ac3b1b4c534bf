"""Every command checks what it can before it loads a model, and says it in one `error:` line.

Each case runs with every family's loader replaced by one that fails the test: the error must
come from the inputs and the checkpoint's config files alone.
"""

from __future__ import annotations

import shutil
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

import mlx_speech
from mlx_speech import chat, say, transcribe
from mlx_speech.registry import MODELS, model_module
from tests.conftest import make_voxtral_checkpoint

GOLDEN = Path(__file__).parents[1] / "golden"
TTS = GOLDEN / "voxtral_tts" / "ckpt"
NEMOTRON = GOLDEN / "nemotron"


@pytest.fixture
def no_load(monkeypatch):
    """Loading any model's weights fails the test."""
    for t in MODELS:
        mod = model_module(t)
        monkeypatch.setattr(mod, "load", lambda *a, **k: pytest.fail("a model was loaded"))


@pytest.fixture(scope="module")
def wav(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("audio") / "a.wav"
    sf.write(p, np.zeros(16000, np.float32), 16000)
    return p


@pytest.fixture(scope="module")
def moshi_dir(tmp_path_factory) -> Path:
    from tests.support.moshi import build_random_lm, kyutai_weights, random_lm_kwargs, write_folder

    kw = random_lm_kwargs(card=64, n_q=16, dep_q=8,  # as tests/server/test_server.py's Moshi
                          delays=[0, 0, 1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 1])
    return write_folder(tmp_path_factory.mktemp("ky") / "moshi", kw,
                        kyutai_weights(build_random_lm(kw)))


@pytest.fixture(scope="module")
def vr_folder(tmp_path_factory) -> Path:
    return make_voxtral_checkpoint(tmp_path_factory.mktemp("vr") / "mistral")


def one_error(capsys) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err and " object at 0x" not in err, err
    return lines[0]


# -- the right kind of model, from its config files ---------------------------------------------
@pytest.mark.parametrize("folder, says", [
    ("tts", "is a Voxtral TTS model, not speech-to-text; use mlx_speech.say"),
    ("moshi", "is a Moshi / PersonaPlex full-duplex model, not speech-to-text; "
              "use mlx_speech.chat"),
])
def test_transcribe_refuses_another_kind(no_load, capsys, wav, moshi_dir, folder, says):
    path = {"tts": TTS, "moshi": moshi_dir}[folder]
    assert transcribe.main([str(wav), "--model", str(path)]) == 1
    assert one_error(capsys) == f"error: {path} {says}"


def test_say_and_chat_refuse_another_kind(no_load, capsys, wav, tmp_path):
    assert say.main(["Hello.", "--model", str(NEMOTRON), "-o", str(tmp_path / "a.wav")]) == 1
    assert one_error(capsys) == (f"error: {NEMOTRON} is a Nemotron streaming speech-to-text "
                                 "model, not text-to-speech; use mlx_speech.transcribe")
    assert chat.main(["--model", str(TTS), "--input", str(wav)]) == 1
    assert one_error(capsys) == (f"error: {TTS} is a Voxtral TTS model, not full-duplex; "
                                 "use mlx_speech.say")


def test_a_hub_id_is_refused_before_its_weights_download(monkeypatch, capsys, wav):
    """The configs come first; the weights are never asked for."""
    import mlx_speech.hub as hub

    asked = []

    def download(repo, patterns, tqdm_class=None):
        asked.append(patterns)
        return TTS

    monkeypatch.setattr(hub, "_download", download)
    assert transcribe.main([str(wav), "--model", "acme/tts"]) == 1
    assert one_error(capsys) == ("error: acme/tts is a Voxtral TTS model, not speech-to-text; "
                                 "use mlx_speech.say")
    assert asked == [hub.CONFIG_FILES]


def test_latency_is_checked_against_the_family(no_load, capsys, wav, vr_folder):
    assert transcribe.main([str(wav), "--model", str(NEMOTRON), "--latency-ms", "240"]) == 1
    assert one_error(capsys) == "error: Nemotron's latency is one of 80, 160, 560, 1120 ms, got 240"
    assert transcribe.main([str(wav), "--model", str(vr_folder), "--delay-ms", "100"]) == 1
    assert "multiple of 80" in one_error(capsys)


# -- inputs and outputs -------------------------------------------------------------------------
@pytest.mark.parametrize("argv, says", [
    (["{wav}", "-o", "{tmp}/out.docx"], "error: cannot write {tmp}/out.docx: unknown transcript "
                                        "format 'docx'; use one of txt, json, srt, vtt "
                                        "(or --format)"),
    (["{wav}", "-o", "{tmp}/no/such/out.txt"], "does not exist"),
    (["{tmp}/notes.txt"], "error: cannot read {tmp}/notes.txt: format not supported or file "
                          "is corrupt (Format not recognised.)"),
    (["{tmp}/empty.wav"], "error: {tmp}/empty.wav is empty (0 samples)"),
    (["{tmp}/missing.wav"], "error: no such file: {tmp}/missing.wav"),
    (["{wav}", "{wav}", "-o", "{wav}"], "several inputs need a folder"),
])
def test_transcribe_inputs_and_outputs(no_load, capsys, wav, tmp_path, vr_folder, argv, says):
    (tmp_path / "notes.txt").write_text("hello")
    sf.write(tmp_path / "empty.wav", np.zeros(0, np.float32), 16000)
    argv = [a.format(wav=wav, tmp=tmp_path) for a in argv]
    assert transcribe.main([*argv, "--model", str(vr_folder)]) == 1
    line = one_error(capsys)
    assert says.format(wav=wav, tmp=tmp_path) in line, line


def test_explicit_format_allows_any_name(monkeypatch, capsys, wav, tmp_path, vr_folder):
    """-o out.docx is refused only when its extension is the only hint; --format decides."""
    loaded = []
    monkeypatch.setattr(mlx_speech.models.voxtral_realtime, "load",
                        lambda *a, **k: loaded.append(a) or pytest.fail("stop"))
    with pytest.raises(pytest.fail.Exception):
        transcribe.main([str(wav), "--model", str(vr_folder), "-o", str(tmp_path / "x.docx"),
                         "--format", "txt"])
    assert len(loaded) == 1


def _no_input_sounddevice(monkeypatch):
    sd = types.ModuleType("sounddevice")

    class PortAudioError(Exception):
        pass

    def query_devices(device=None, kind=None):
        raise ValueError("No input device matching")

    sd.PortAudioError, sd.query_devices = PortAudioError, query_devices
    monkeypatch.setitem(sys.modules, "sounddevice", sd)


def test_live_without_a_microphone(no_load, monkeypatch, capsys, vr_folder):
    _no_input_sounddevice(monkeypatch)
    assert transcribe.main(["--live", "--model", str(vr_folder)]) == 1
    assert one_error(capsys) == "error: no microphone found (no audio input device)"
    assert chat.main(["--model", str(vr_folder)]) == 1
    assert one_error(capsys) == "error: no microphone found (no audio input device)"


def test_chat_input_is_decoded_first(no_load, capsys, tmp_path, moshi_dir):
    (tmp_path / "q.wav").write_bytes(b"RIFF junk")
    assert chat.main(["--model", str(moshi_dir), "--input", str(tmp_path / "q.wav")]) == 1
    assert "format not supported or file is corrupt" in one_error(capsys)


def test_wrong_kind_after_load_is_one_line_not_attribute_error(monkeypatch, capsys, wav):
    """A model that arrives some other way is asked its kind too (no AttributeError)."""
    class Duplex:
        kind, sample_rate = "duplex", 24000

    monkeypatch.setattr(mlx_speech, "load", lambda *a, **k: Duplex())
    assert transcribe.main([str(wav), "--model", "x"]) == 1
    assert one_error(capsys) == ("error: x is a full-duplex model, not speech-to-text; "
                                 "use mlx_speech.chat")


# -- convert ------------------------------------------------------------------------------------
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs a /proc that takes no folders")
def test_convert_into_a_folder_that_takes_none(no_load, capsys):
    from mlx_speech import convert

    assert convert.main([str(NEMOTRON), "/proc/out6"]) == 1
    line = one_error(capsys)
    assert line.startswith("error: cannot write /proc/out6: /proc does not take new folders")


def test_convert_into_a_read_only_folder(no_load, capsys, tmp_path):
    import os

    from mlx_speech import convert

    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        if os.access(ro, os.W_OK):
            pytest.skip("running as a user who can write anywhere")
        assert convert.main([str(NEMOTRON), str(ro / "out")]) == 1
        assert "does not take new folders" in one_error(capsys)
    finally:
        ro.chmod(0o755)
        shutil.rmtree(ro)


def test_every_model_type_has_a_kind():
    """Every registered family says what it is (the model contract) before any load."""
    from mlx_speech.models.base import COMMANDS, KIND_NAMES
    from mlx_speech.registry import family, kind_of, name_of

    for t in MODELS:
        cls = family(t)
        assert kind_of(t) == cls.kind in KIND_NAMES and name_of(t) == cls.name and cls.family
        if cls.kind == "asr":
            assert cls.latency.check(cls.latency.default_ms) == cls.latency.default_ms
            # what `language=` takes (None: none), and the ISO 639 codes it transcribes
            assert cls.languages is None or (cls.languages and all(
                isinstance(n, str) for n in cls.languages))
            assert cls.spoken and all(c.isalpha() and c.islower() and 2 <= len(c) <= 3
                                      for c in cls.spoken)
    assert set(COMMANDS) <= set(KIND_NAMES)


def test_loaded_models_say_their_kind(vr_folder):
    from mlx_speech.models.silero_vad import SileroVAD

    assert mlx_speech.load(vr_folder).kind == "asr"
    assert mlx_speech.load(vr_folder).family == "voxtral_realtime"
    assert mlx_speech.load(NEMOTRON).kind == "asr"
    assert mlx_speech.load(NEMOTRON).family == "nemotron_streaming"
    assert mlx_speech.load(TTS).kind == "tts"
    assert SileroVAD().kind == "vad"


def test_one_latency_name_for_both_families(vr_folder):
    vr, nm = mlx_speech.load(vr_folder), mlx_speech.load(NEMOTRON)
    x = np.random.default_rng(0).uniform(-0.3, 0.3, 16000).astype(np.float32)
    assert vr.session(latency_ms=160).latency_ms == 160 == vr.session(delay_ms=160).delay_ms
    assert nm.session(latency_ms=160).latency_ms == 160
    assert (vr.transcribe(x, latency_ms=160).token_ids
            == vr.transcribe(x, delay_ms=160).token_ids)
    with pytest.raises(mlx_speech.errors.MlxSpeechError, match="not both"):
        vr.session(latency_ms=160, delay_ms=240)


@pytest.mark.parametrize("exc, rc, says", [
    (RuntimeError("[metal] out of memory\nstack..."), 2,
     "error: unexpected failure (RuntimeError: [metal] out of memory); this is a bug: please "
     "report it with the output of --verbose and mlx_speech doctor"),
    (PermissionError(13, "Permission denied", "/models/x/model.safetensors"), 1,
     "error: Permission denied: /models/x/model.safetensors"),
])
def test_anything_else_is_one_line_too(monkeypatch, capsys, wav, exc, rc, says):
    def load(*a, **k):
        raise exc

    monkeypatch.setattr(mlx_speech, "load", load)
    assert transcribe.main([str(wav), "--model", "x"]) == rc
    assert one_error(capsys) == says
    with pytest.raises(type(exc)):
        transcribe.main([str(wav), "--model", "x", "--verbose"])


def test_live_with_a_bad_vad_path(no_load, monkeypatch, capsys, vr_folder, tmp_path):
    import mlx_speech.audio.devices as devices

    monkeypatch.setattr(devices, "check_live_audio", lambda speaker=False: None)
    (tmp_path / "vad.txt").write_text("no")
    assert transcribe.main(["--live", "--model", str(vr_folder), "--vad",
                            str(tmp_path / "vad.txt")]) == 1
    assert "is not Silero VAD weights" in one_error(capsys)


def test_live_save_audio_and_chat_voice_files(no_load, monkeypatch, capsys, vr_folder, wav,
                                              moshi_dir, tmp_path):
    import mlx_speech.audio.devices as devices

    monkeypatch.setattr(devices, "check_live_audio", lambda speaker=False: None)
    for name, says in (("heard.docx", "unsupported audio format 'docx'"),
                       ("heard.pcm", "--save-audio takes wav")):
        assert transcribe.main(["--live", "--no-vad", "--model", str(vr_folder),
                                "--save-audio", str(tmp_path / name)]) == 1
        assert says in one_error(capsys)
    assert chat.main(["--model", str(moshi_dir), "--input", str(wav), "--voice",
                      str(tmp_path / "me.wav")]) == 1
    assert one_error(capsys) == f"error: no such voice file: {tmp_path / 'me.wav'}"


@pytest.mark.parametrize("main, argv", [
    (transcribe.main, ["a.wav", "--latency-ms", "soon"]),
    (say.main, ["hi", "--bogus"]),
    (chat.main, ["--user-lag", "7"]),
])
def test_a_bad_option_is_one_line(capsys, main, argv):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    line = one_error(capsys)
    assert line.endswith("--help)") and "usage:" not in line


# -- languages (Nemotron 3.5), from the checkpoint's configs ------------------------------------
N35 = GOLDEN / "nemotron35"


def test_language_is_checked_against_the_checkpoint(no_load, capsys, wav):
    for model in (N35 / "tiny.nemo", N35 / "hf"):
        assert transcribe.main([str(wav), "--model", str(model), "--language", "xx"]) == 1
        assert one_error(capsys) == ("error: unknown language 'xx'; this model takes auto, de, "
                                     "de-DE, en, en-US, es, es-ES, fr, fr-FR")
    assert transcribe.main([str(wav), "--model", str(NEMOTRON), "--language", "de"]) == 1
    assert one_error(capsys) == ("error: this model is English only and takes no language "
                                 "(got 'de')")
    assert transcribe.main([str(wav), "--model", str(N35 / "hf"), "--latency-ms", "240"]) == 1
    assert one_error(capsys) == ("error: Nemotron 3.5's latency is one of 80, 160, 320, 560, "
                                 "1120 ms, got 240")


def test_a_hub_language_is_refused_before_its_weights_download(monkeypatch, capsys, wav,
                                                               tmp_path):
    import mlx_speech.hub as hub

    configs = tmp_path / "snap"
    configs.mkdir()
    for name in ("config.json", "processor_config.json"):
        shutil.copy(N35 / "hf" / name, configs / name)
    asked = []

    def download(repo, patterns, tqdm_class=None):
        asked.append(patterns)
        return configs

    monkeypatch.setattr(hub, "_download", download)
    assert transcribe.main([str(wav), "--model", "acme/n35", "--language", "klingon"]) == 1
    assert one_error(capsys).startswith("error: unknown language 'klingon'; this model takes")
    assert asked == [hub.CONFIG_FILES]
