"""A missing optional package is one `error: ...` line naming the extra to install, from every
entry point, before any model loads; and the core install alone runs files end to end."""

from __future__ import annotations

import ast
import sys

import numpy as np
import pytest
import soundfile as sf

import mlx_speech
from mlx_speech.errors import MissingDependency, optional
from tests.project.helpers_deps import CODE, ROOT, Declared, distributions, imports, third_party


def _optional_modules() -> set[str]:
    """Every top-level module the code imports that the core dependencies do not install."""
    core = Declared((ROOT / "pyproject.toml").read_text()).core
    found = set()
    for top in CODE:
        for f in (ROOT / top).rglob("*.py"):
            for m, _, _ in imports(ast.parse(f.read_text(encoding="utf-8"))):
                if third_party(m) and not core.intersection(distributions(m)):
                    found.add(m)
    return found


OPTIONAL = _optional_modules()


@pytest.fixture
def without(monkeypatch):
    """Make modules unimportable (`import x` raises ModuleNotFoundError, as when absent)."""

    def block(*names: str) -> None:
        for name in names:
            for m in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
                monkeypatch.delitem(sys.modules, m)
            monkeypatch.setitem(sys.modules, name, None)

    return block


@pytest.fixture
def no_load(monkeypatch):
    def load(*a, **k):
        raise AssertionError("a model was loaded before the missing package was reported")

    monkeypatch.setattr(mlx_speech, "load", load)


def _one_error_line(capsys, rc: int) -> str:
    err = capsys.readouterr().err
    assert rc == 1, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


def test_the_optional_modules_are_read_from_the_code():
    assert {"fastapi", "uvicorn", "sphn", "sounddevice", "PIL", "platformdirs",
            "AppKit"} <= OPTIONAL
    assert not OPTIONAL & {"numpy", "mlx", "soundfile", "regex", "yaml", "huggingface_hub"}


@pytest.mark.parametrize("module, dist", [("fastapi", "fastapi"), ("uvicorn", "uvicorn"),
                                          ("sphn", "sphn"), ("websockets", "websockets"),
                                          ("python_multipart", "python-multipart")])
def test_server_without_its_extra(module, dist, without, no_load, capsys):
    from mlx_speech import cli

    without(module)
    line = _one_error_line(capsys, cli.main(["server", "--model", "some/model"]))
    assert line == f"error: the server needs {dist}: pip install 'mlx-realtime-speech[server]'"


def test_server_ray_without_the_cluster_extra(without, no_load, capsys, monkeypatch):
    """--ray without Ray: one line naming the cluster extra, before any model is looked at
    (the server's own extra is there)."""
    from mlx_speech import cli

    monkeypatch.delitem(sys.modules, "mlx_speech.server.ray_serve", raising=False)  # anew
    without("ray")
    line = _one_error_line(capsys, cli.main(["server", "--model", "some/model", "--ray"]))
    assert line == ("error: Ray Serve (mlx_speech.server --ray, serve run) needs ray: "
                    "pip install 'mlx-realtime-speech[cluster]'")


def test_make_app_without_fastapi(without, monkeypatch):
    from mlx_speech.server import make_app

    monkeypatch.delitem(sys.modules, "mlx_speech.server.app", raising=False)  # import it anew
    without("fastapi", "starlette")
    with pytest.raises(MissingDependency, match=r"^the server needs fastapi: pip install "
                                                r"'mlx-realtime-speech\[server\]'$"):
        make_app({})


@pytest.mark.parametrize("argv", [["transcribe", "--live"], ["say", "Hello."], ["chat"]])
def test_live_audio_without_sounddevice(argv, without, no_load, capsys):
    """(`app --simulate` reports device errors as events and goes on, by design.)"""
    from mlx_speech import cli

    without("sounddevice")
    line = _one_error_line(capsys, cli.main(argv))
    assert line.startswith("error: live audio needs sounddevice: pip install "
                           "'mlx-realtime-speech[live]'")


def test_app_preview_without_pillow(without, tmp_path, capsys):
    from mlx_speech.app.cli import main

    without("PIL")
    out = tmp_path / "previews"
    line = _one_error_line(capsys, main(["--preview", str(out)]))
    assert line == "error: the preview needs pillow: pip install 'mlx-realtime-speech[app]'"
    assert not out.exists()


def test_app_settings_without_platformdirs(without, monkeypatch):
    from mlx_speech.app.settings import settings_path

    monkeypatch.delenv("MLX_SPEECH_APP_CONFIG", raising=False)
    without("platformdirs")
    with pytest.raises(MissingDependency, match=r"needs platformdirs: pip install "
                                                r"'mlx-realtime-speech\[app\]'$"):
        settings_path()


def test_menu_bar_app_without_its_platform_packages(without):
    from mlx_speech.app import macos
    from mlx_speech.app.settings import Settings

    without("AppKit", "Foundation", "Quartz", "ApplicationServices", "AVFoundation",
            "PyObjCTools")
    with pytest.raises(MissingDependency, match=r"^the menu-bar app needs pyobjc-framework-"
                                                r"Cocoa: pip install "
                                                r"'mlx-realtime-speech\[app\]'$"):
        macos.run(Settings())


def test_optional_reports_only_third_party_modules():
    with pytest.raises(ModuleNotFoundError):  # our own code missing is a bug, not an extra
        with optional("server", "x"):
            import mlx_speech.no_such_module  # noqa: F401
    with pytest.raises(MissingDependency, match=r"^x needs a working numpy \(cannot import"):
        with optional("server", "x"):
            from numpy import no_such_name  # noqa: F401


def test_the_core_alone_transcribes_and_converts(vr_dir, tmp_path, without, capsys):
    """With every optional package unimportable, files in and out still work."""
    from mlx_speech import cli

    without(*OPTIONAL)
    wav = tmp_path / "a.wav"
    sf.write(wav, np.zeros(16000, np.float32), 16000)
    assert cli.main(["transcribe", str(wav), "--model", str(vr_dir)]) == 0, capsys.readouterr()
    assert cli.main(["convert", str(vr_dir), str(tmp_path / "c"), "--quiet"]) == 0
    assert (tmp_path / "c" / "mlx_speech.json").exists()
