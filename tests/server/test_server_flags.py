"""The server's flags are range-checked by argparse, and every flag that names a file or a
model is checked before the served models load (issue 32)."""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi")

import mlx_speech  # noqa: E402
from mlx_speech import server as srv_mod  # noqa: E402


@pytest.mark.parametrize("flag, value, says", [
    ("--port", "99999", "must be between 0 and 65535, got 99999"),  # was an OverflowError
    ("--port", "-1", "must be between 0 and 65535"),
    ("--max-upload-mb", "-1", "must be more than 0, got -1"),  # started, then refused all
    ("--max-upload-mb", "inf", "must be a finite number"),
    ("--max-sessions", "0", "must be at least 1, got 0"),
    ("--max-connections-per-ip", "0", "must be at least 1"),
    ("--max-buffer-s", "0", "must be more than 0"),
    ("--idle-timeout-s", "nan", "must be a finite number"),
    ("--decoder-window", "0", "must be at least 1"),
    ("--allowed-origin", "https://app.example/", "is not a browser origin"),  # never matched
    ("--allowed-origin", "app.example", "is not a browser origin"),
])
def test_flags_out_of_range_are_usage_errors(flag, value, says, monkeypatch, capsys):
    monkeypatch.setattr(mlx_speech, "load", lambda *a, **k: pytest.fail("loaded"))
    with pytest.raises(SystemExit) as e:
        srv_mod.main(["--model", "m", flag, value])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: argument {flag}") and says in err, err


@pytest.fixture
def loads(monkeypatch):
    """The ids `mlx_speech.load` was asked for, in order; it fails each one."""
    asked = []

    def load(name, **kw):
        asked.append(str(name))
        raise AssertionError(f"{name} was loaded")

    monkeypatch.setattr(mlx_speech, "load", load)
    return asked


def test_voices_folder_is_checked_first(loads, capsys, tmp_path):
    assert srv_mod.main(["--model", "m", "--port", "0", "--voices", str(tmp_path / "none")]) == 1
    assert capsys.readouterr().err.strip() == f"error: --voices {tmp_path / 'none'}: no such folder"
    assert loads == []


def test_a_missing_vad_file_is_named_before_any_model_loads(loads, capsys):
    """Old: --vad /nonexistent.onnx loaded every model first, then called it a model folder."""
    assert srv_mod.main(["--model", "m", "--port", "0", "--vad", "/nonexistent.onnx"]) == 1
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "error: no such file: /nonexistent.onnx (the Silero VAD weights: pass a .onnx or "
        ".safetensors file, a folder or a hub repo id)")
    assert loads == []


def test_the_diarizer_loads_before_the_served_models(capsys, monkeypatch, tmp_path):
    """Old: --diarizer nvidia/absent was tried only after every served model had loaded."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    asked, real = [], mlx_speech.load
    monkeypatch.setattr(mlx_speech, "load", lambda name, **kw: asked.append(name) or real(
        name, **kw))
    assert srv_mod.main(["--model", "big/model", "--port", "0", "--no-vad",
                         "--diarizer", "nvidia/absent"]) == 1
    assert asked == ["nvidia/absent"]  # the diarizer first: the big model never started
    assert "cannot fetch 'nvidia/absent'" in capsys.readouterr().err
