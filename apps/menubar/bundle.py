"""The double-clickable launcher bundle and the Login Item (plain Python: testable anywhere).

The bundle is thin: Info.plist plus a shell launcher that runs this Python with
`-m mlx_speech.app`. macOS then attributes Microphone and Accessibility permissions to the
bundle (a stable CFBundleIdentifier), not to the terminal or to an interpreter path that
changes when Python is upgraded. `LSUIElement` keeps it out of the Dock.

The Login Item is a LaunchAgent that runs `open -g <bundle>`; it is written AND loaded
(`launchctl bootstrap`), and unloaded and removed when switched off.
"""

from __future__ import annotations

import os
import plistlib
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from mlx_speech import __version__
from mlx_speech.errors import MlxSpeechError

BUNDLE_ID = "io.github.mlx-speech.menubar"
APP_NAME = "MLX Speech"
EXECUTABLE = "mlx-speech"
MIC_USAGE = ("MLX Speech transcribes what you say while you hold the dictation hotkey, "
             "on this Mac.")


def info_plist(version: str = __version__) -> dict:
    return {
        "CFBundleIdentifier": BUNDLE_ID,
        "CFBundleName": APP_NAME,
        "CFBundleDisplayName": APP_NAME,
        "CFBundleExecutable": EXECUTABLE,
        "CFBundlePackageType": "APPL",
        "CFBundleShortVersionString": version,
        "CFBundleVersion": version,
        "CFBundleInfoDictionaryVersion": "6.0",
        "LSUIElement": True,  # a menu-bar app: no Dock icon, no main menu
        "LSMinimumSystemVersion": "13.0",
        "NSMicrophoneUsageDescription": MIC_USAGE,
        "NSHighResolutionCapable": True,
    }


def launcher_script(python: str) -> str:
    q = python.replace("'", "'\\''")
    return ("#!/bin/sh\n"
            "# MLX Speech launcher: runs the app with the Python it was installed from\n"
            f"exec '{q}' -m mlx_speech.app \"$@\"\n")


def write_app_bundle(folder: str | Path, python: str | None = None) -> Path:
    """Write `<folder>/MLX Speech.app` (replacing an older one); returns its path."""
    folder = Path(folder).expanduser()
    app = folder / f"{APP_NAME}.app"
    contents = app / "Contents"
    tmp = folder / f".{APP_NAME}.app.tmp"
    if tmp.exists():
        shutil.rmtree(tmp)
    try:
        (tmp / "Contents" / "MacOS").mkdir(parents=True)
        (tmp / "Contents" / "Resources").mkdir()
        with open(tmp / "Contents" / "Info.plist", "wb") as f:
            plistlib.dump(info_plist(), f)
        (tmp / "Contents" / "PkgInfo").write_text("APPL????")
        exe = tmp / "Contents" / "MacOS" / EXECUTABLE
        exe.write_text(launcher_script(python or sys.executable))
        exe.chmod(0o755)
        if app.exists():
            shutil.rmtree(app)
        os.replace(tmp, app)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise MlxSpeechError(f"cannot write {app}: {e.strerror or e}") from None
    assert contents.exists()
    return app


def install_app(folder: str | Path = "~/Applications",
                run: Callable = subprocess.run) -> Path:
    app = write_app_bundle(folder)
    if sys.platform == "darwin" and shutil.which("codesign"):
        # an ad-hoc signature gives the bundle a stable identity for the permission prompts
        run(["codesign", "--force", "--sign", "-", str(app)], check=False,
            capture_output=True)
    return app


def launch_agent_plist(app: Path) -> dict:
    return {
        "Label": BUNDLE_ID,
        "ProgramArguments": ["/usr/bin/open", "-g", str(app)],
        "RunAtLoad": True,
        "ProcessType": "Interactive",
        "LimitLoadToSessionType": "Aqua",
    }


def set_login_item(enabled: bool, *, home: Path | None = None, app: Path | None = None,
                   run: Callable = subprocess.run, uid: int | None = None) -> str:
    """Switch the Login Item on (write + load the LaunchAgent) or off (unload + remove)."""
    home = Path.home() if home is None else Path(home)
    uid = os.getuid() if uid is None else uid
    plist = home / "Library" / "LaunchAgents" / f"{BUNDLE_ID}.plist"
    domain = f"gui/{uid}"

    def launchctl(*args, check=True):
        try:
            r = run(["launchctl", *args], capture_output=True, text=True)
        except FileNotFoundError:
            raise MlxSpeechError("launchctl not found: Login Items are for macOS") from None
        if check and r.returncode != 0:
            msg = (r.stderr or r.stdout or "").strip().splitlines()
            raise MlxSpeechError(f"launchctl {args[0]} failed: {msg[0] if msg else r.returncode}")
        return r

    if not enabled:
        launchctl("bootout", f"{domain}/{BUNDLE_ID}", check=False)
        plist.unlink(missing_ok=True)
        return "Login Item off"
    app = Path(app) if app else home / "Applications" / f"{APP_NAME}.app"
    if not app.exists():
        raise MlxSpeechError(f"no {app}: run mlx_speech.app --install-app first")
    plist.parent.mkdir(parents=True, exist_ok=True)
    with open(plist, "wb") as f:
        plistlib.dump(launch_agent_plist(app), f)
    launchctl("bootout", f"{domain}/{BUNDLE_ID}", check=False)  # an older one
    launchctl("bootstrap", domain, str(plist))
    return f"Login Item on: {plist}"
