"""The app's command line, packaging and platform-free pieces: imports stay light, --preview
draws every state, the bundle and LaunchAgent plists, the simulator's command parser."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from mlx_speech.app.menu import STATES
from mlx_speech.app.simulate import parse

ROOT = Path(__file__).resolve().parents[2]
PLATFORM = ("rumps", "objc", "AppKit", "Quartz", "ApplicationServices", "AVFoundation",
            "pynput", "PIL", "sounddevice", "platformdirs")


def _loaded(code: str) -> list[str]:
    probe = (f"{code}\nimport sys\n"
             f"print(sorted(m for m in sys.modules if m.split('.')[0] in {PLATFORM!r}"
             " or m.startswith('mlx_speech.app')))")
    r = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return eval(r.stdout.strip().splitlines()[-1])


def test_import_mlx_speech_and_the_clis_load_nothing_of_the_app():
    assert _loaded("import mlx_speech, mlx_speech.cli, mlx_speech.transcribe, mlx_speech.say, "
                   "mlx_speech.chat") == []


def test_the_app_package_and_its_cli_load_no_platform_module():
    mods = _loaded("import mlx_speech.app, mlx_speech.app.cli, mlx_speech.app.simulate, "
                   "mlx_speech.app.bundle, mlx_speech.app.doctor, mlx_speech.app.macos, "
                   "mlx_speech.app.mac_ui, mlx_speech.app.mac_input, mlx_speech.app.keys, "
                   "mlx_speech.app.carbon, mlx_speech.app.instance, mlx_speech.app.launcher; "
                   "from mlx_speech.app import App, present")
    assert mods and not [m for m in mods if not m.startswith("mlx_speech.app")]


def test_help_runs_everywhere():
    for argv in (["-m", "mlx_speech.app", "--help"], ["-m", "mlx_speech", "app", "--help"]):
        r = subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True)
        assert r.returncode == 0 and "--simulate" in r.stdout, r.stderr


@pytest.mark.skipif(sys.platform == "darwin", reason="the menu bar starts on macOS")
def test_plain_start_off_macos_is_one_clear_error():
    r = subprocess.run([sys.executable, "-m", "mlx_speech.app"], cwd=ROOT, capture_output=True,
                       text=True)
    assert r.returncode == 1
    assert r.stderr.strip() == ("error: the menu-bar app needs macOS; try --simulate or "
                                "--preview DIR")


def test_preview_writes_a_png_per_state(tmp_path):
    from PIL import Image

    r = subprocess.run([sys.executable, "-m", "mlx_speech.app", "--preview", str(tmp_path)],
                       cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    pngs = sorted(p.stem for p in tmp_path.glob("*.png"))
    assert pngs == sorted(STATES)
    sizes, pixels = set(), set()
    for s in STATES:
        assert f"== {s}\n[{s}]" in r.stdout  # each menu as text too
        with Image.open(tmp_path / f"{s}.png") as im:
            im.load()
            assert im.width == 440 and im.height > 200
            sizes.add(im.size)
            pixels.add(im.tobytes())
    assert len(pixels) == len(STATES)  # every state looks different
    assert "Downloading speech model: 1.2 GB / 3.1 GB (40%)" in r.stdout
    assert "Open Accessibility settings" in r.stdout


def test_simulate_command_parser():
    assert parse("press dictate\n") == ("key", "dictate", True)
    assert parse("release speak") == ("key", "speak", False)
    assert parse("tap dictate") == ("tap", "dictate")
    assert parse("select  Hello, world.  \n") == ("select", " Hello, world.  ")
    assert parse("wait 0.5") == ("wait", 0.5)
    assert parse("quit") == ("quit",) and parse("   ") is None
    for bad in ("press paste", "wait soon", "wait -1", "jump"):
        with pytest.raises(ValueError):
            parse(bad)


def test_simulate_reports_bad_commands_and_a_missing_model(tmp_path):
    r = subprocess.run([sys.executable, "-m", "mlx_speech.app", "--simulate", "--asr-model",
                        str(tmp_path / "nope")], cwd=ROOT, input="jump\nquit\n",
                       capture_output=True, text=True, timeout=120)
    import json

    events = [json.loads(x) for x in r.stdout.splitlines()]
    assert r.returncode == 0, r.stderr
    errors = [e["message"] for e in events if e["event"] == "error"]
    assert "unknown command 'jump'" in errors
    assert any("no such model folder" in m for m in errors)
    assert [e["state"] for e in events if e["event"] == "state"][-1] == "error"


def test_install_app_without_a_folder_is_refused_off_macos(tmp_path, monkeypatch, capsys):
    """Old: on Linux it wrote ~/Applications/MLX Speech.app, which nothing there opens."""
    import sys

    from mlx_speech.app.cli import main

    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert main(["--install-app"]) == 1
    assert "the app bundle is for macOS" in capsys.readouterr().err
    assert not (tmp_path / "Applications").exists()
