"""`mlx_speech.app --doctor`: one screen to read (and paste into a bug report) before anything
else: who this process is, each permission's state, whether an event tap can be created,
whether the microphone gives sound, the bundle, the model cache, versions.

Permissions belong to the app macOS holds responsible for a process: run from Terminal, the
rows are Terminal's. So on a Mac the doctor also runs itself inside MLX Speech.app (through
`open`, as Finder would) and prints that report too. On Linux it says what it cannot check.
"""

from __future__ import annotations

import platform
import plistlib
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

from mlx_speech import __version__
from mlx_speech.doctor import FAIL, NA, OK, WARN, mlx_row, render, vad_row

from .ports import GRANTED, PERMISSIONS

__all__ = ["FAIL", "NA", "OK", "WARN", "collect", "main", "render"]
LABELS = {"input_monitoring": "input monitoring", "accessibility": "accessibility",
          "microphone": "microphone"}
FIX = {"input_monitoring": "Privacy & Security > Input Monitoring: switch MLX Speech on",
       "accessibility": "Privacy & Security > Accessibility: switch MLX Speech on",
       "microphone": "Privacy & Security > Microphone: switch MLX Speech on"}


def _installed_app() -> Path:
    from .bundle import APP_NAME, running_bundle

    return running_bundle() or Path.home() / "Applications" / f"{APP_NAME}.app"


def identity_rows(darwin: bool) -> list[tuple[str, str, str]]:
    from .bundle import BUNDLE_ID, EXECUTABLE, running_bundle
    from .macho import kind

    rows = [("mlx_speech", OK, f"{__version__}, Python {platform.python_version()} "
             f"({sys.executable})")]
    bundle = running_bundle()
    if bundle is not None:
        rows.append(("process", OK, f"MLX Speech.app ({bundle}): the rows below are the app's"))
    elif darwin:
        rows.append(("process", WARN, "not the app: permission rows belong to the app that "
                     "started this (Terminal...)"))
    else:
        rows.append(("process", NA, f"{platform.system()}: the menu-bar app needs macOS"))
    app = _installed_app()
    exe = app / "Contents" / "MacOS" / EXECUTABLE
    if not exe.exists():
        rows.append(("bundle", WARN if darwin else NA,
                     f"no {app}: mlx_speech.app --install-app"))
        return rows
    with open(exe, "rb") as f:
        what = kind(f.read(4))
    try:
        info = plistlib.loads((app / "Contents" / "Info.plist").read_bytes())
    except (OSError, ValueError):
        info = {}
    bad = [k for k, want in (("CFBundleIdentifier", BUNDLE_ID), ("LSUIElement", True))
           if info.get(k) != want]
    bad += [] if info.get("NSMicrophoneUsageDescription") else ["NSMicrophoneUsageDescription"]
    if what not in ("mach-o", "elf"):
        bad.append(f"the executable is {what or 'unknown'}, not the interpreter")
    state = FAIL if bad else OK
    rows.append(("bundle", state, f"{app}" + (f": wrong {', '.join(bad)}" if bad else
                                              f" ({what}, {BUNDLE_ID})")))
    if darwin:
        rows.append(_signature(app))
    return rows


def _signature(app: Path) -> tuple[str, str, str]:
    try:
        r = subprocess.run(["codesign", "-dv", str(app)], capture_output=True, text=True,
                           timeout=20)
    except (OSError, subprocess.TimeoutExpired) as e:
        return ("signature", WARN, f"codesign: {e}")
    fields = dict(line.split("=", 1) for line in r.stderr.splitlines() if "=" in line)
    if r.returncode != 0:
        return ("signature", FAIL, (r.stderr.strip().splitlines() or ["unsigned"])[-1])
    ident, sig = fields.get("Identifier", "?"), fields.get("Signature", "a certificate")
    from .bundle import BUNDLE_ID

    return ("signature", OK if ident == BUNDLE_ID else FAIL, f"{ident}, {sig}")


def permission_rows(darwin: bool) -> list[tuple[str, str, str]]:
    if not darwin:
        return [("permissions", NA, "cannot check on Linux: Input Monitoring, Accessibility "
                 "and Microphone are macOS privacy settings"),
                ("event tap", NA, "cannot check on Linux (Quartz)"),
                ("secure input", NA, "cannot check on Linux (Carbon)"),
                ("keyboard layout", NA, "cannot check on Linux (Text Input Sources)")]
    from . import carbon
    from .macos import MacPermissions, missing_pyobjc

    missing = missing_pyobjc()
    if missing:
        from mlx_speech.errors import install_hint

        return [("permissions", FAIL, f"cannot check: PyObjC missing ({', '.join(missing)}): "
                 + install_hint("app"))]
    perms = MacPermissions(lambda ev: None)
    rows = []
    for kind in PERMISSIONS:
        try:
            st = perms.state(kind)
        except Exception as e:
            st = f"unknown ({type(e).__name__}: {e})"
        rows.append((LABELS[kind], OK if st == GRANTED else FAIL,
                     st if st == GRANTED else f"{st}: System Settings > {FIX[kind]}"))
    rows.append(_tap_row())
    try:
        on = carbon.secure_input()
        rows.append(("secure input", WARN if on else OK,
                     "ON: another app holds Secure Input, typing is blocked" if on else "off"))
    except Exception as e:
        rows.append(("secure input", WARN, f"unreadable: {e}"))
    try:
        v, c = carbon.keycode_for("v", command=True), carbon.keycode_for("c", command=True)
        rows.append(("keyboard layout", OK if None not in (v, c) else WARN,
                     f"Cmd-V key {v}, Cmd-C key {c}" + (" (US positions 9/8 used)"
                                                         if None in (v, c) else "")))
    except Exception as e:
        rows.append(("keyboard layout", WARN, f"unreadable ({e}): US positions used"))
    return rows


def _tap_row() -> tuple[str, str, str]:
    import Quartz as Q

    mask = Q.CGEventMaskBit(Q.kCGEventKeyDown) | Q.CGEventMaskBit(Q.kCGEventFlagsChanged)
    tap = Q.CGEventTapCreate(Q.kCGSessionEventTap, Q.kCGHeadInsertEventTap,
                             Q.kCGEventTapOptionListenOnly, mask,
                             lambda proxy, etype, event, refcon: event, None)
    if tap is None:
        return ("event tap", FAIL, "cannot be created: hotkeys will not work "
                "(Input Monitoring)")
    Q.CFMachPortInvalidate(tap)
    return ("event tap", OK, "can be created (hotkeys can listen)")


def mic_row(seconds: float = 1.0, darwin: bool = False) -> tuple[str, str, str]:
    if darwin:
        from .macos import MacPermissions, missing_pyobjc

        if missing_pyobjc():
            return ("microphone audio", NA, "not tried: PyObjC is missing")
        st = MacPermissions(lambda ev: None).state("microphone")
        if st != GRANTED:
            return ("microphone audio", NA, f"not tried: the microphone permission is {st}")
    try:
        import numpy as np

        from mlx_speech.audio.devices import Microphone
    except Exception as e:
        return ("microphone audio", NA, f"cannot open audio devices: {e}")
    try:
        mic = Microphone(16000, 1600)
        mic.start()
        blocks, deadline = [], time.monotonic() + seconds + 2.0
        try:
            while sum(len(b) for b in blocks) < 16000 * seconds and time.monotonic() < deadline:
                b = mic.read(timeout=0.2)
                if b is not None:
                    blocks.append(b)
        finally:
            mic.close()
    except Exception as e:
        return ("microphone audio", FAIL, f"{type(e).__name__}: {e}")
    x = np.concatenate(blocks) if blocks else np.zeros(0, np.float32)
    if not len(x):
        return ("microphone audio", FAIL, "no audio arrived in 3 s")
    peak = float(np.max(np.abs(x)))
    if peak < 1e-4:
        return ("microphone audio", FAIL, f"{len(x) / 16000:.1f} s of silence (all zeros: "
                "the permission is denied to this process, or the input is muted)")
    db = 20 * np.log10(max(float(np.sqrt(np.mean(x.astype(np.float64) ** 2))), 1e-9))
    return ("microphone audio", OK, f"{len(x) / 16000:.1f} s, level {db:.0f} dBFS")


def place_rows() -> list[tuple[str, str, str]]:
    from .bundle import login_item_path
    from .instance import InstanceLock, holder
    from .settings import load_settings, lock_path, log_path, settings_path

    rows = []
    try:
        from huggingface_hub import constants

        cache = Path(constants.HF_HUB_CACHE)
        s = load_settings()
        have = [m for m in (s.asr_model, s.tts_model)
                if (cache / ("models--" + m.replace("/", "--"))).is_dir() or Path(m).is_dir()]
        rows.append(("model cache", OK if cache.is_dir() else WARN,
                     f"{cache} ({len(have)} of the 2 chosen models there)"))
    except Exception as e:
        rows.append(("model cache", WARN, f"unknown: {e}"))
    rows.append(("settings", OK, str(settings_path())))
    rows.append(("log", OK, str(log_path())))
    li = login_item_path()
    rows.append(("login item", OK, f"on ({li})" if li.exists() else "off"))
    lock = InstanceLock(lock_path())
    if lock.path.exists() and not lock.acquire():
        rows.append(("running", OK, f"yes (pid {holder(lock.path)})"))
    else:
        lock.release()
        rows.append(("running", OK, "no"))
    return rows


def version_row() -> tuple[str, str, str]:
    names = ("mlx", "numpy", "sounddevice", "huggingface-hub", "pyobjc-core",
             "pyobjc-framework-Quartz")
    got = []
    for n in names:
        try:
            got.append(f"{n} {metadata.version(n)}")
        except metadata.PackageNotFoundError:
            if n.startswith("pyobjc") and sys.platform != "darwin":
                continue
            got.append(f"{n} missing")
    mac = platform.mac_ver()[0]
    osname = f"macOS {mac} {platform.machine()}" if mac else f"{platform.system()} " \
        f"{platform.release()} {platform.machine()}"
    return ("versions", OK, f"{osname}; " + ", ".join(got))


def collect(darwin: bool | None = None, mic_seconds: float = 1.0) -> list[tuple[str, str, str]]:
    darwin = sys.platform == "darwin" if darwin is None else darwin
    rows = identity_rows(darwin) + permission_rows(darwin)
    rows.append(mic_row(mic_seconds, darwin))
    return rows + place_rows() + [vad_row(), mlx_row(), version_row()]


def _as_app(app: Path, timeout: float = 60.0) -> str | None:
    """This report from inside MLX Speech.app, launched by LaunchServices like a double click
    (so its rows are the app's own permissions)."""
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "doctor.txt"
        try:
            subprocess.run(["open", "-W", "-n", "-g", str(app), "--args", "mlx_speech.app",
                            "--doctor", "--report", str(out)], timeout=timeout,
                           capture_output=True)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return out.read_text() if out.exists() else None


def main(report: str | None = None, darwin: bool | None = None) -> None:
    darwin = sys.platform == "darwin" if darwin is None else darwin
    text = render(collect(darwin))
    if report:  # the in-bundle run: the caller prints it
        Path(report).write_text(text + "\n")
        return
    print(text)
    from .bundle import running_bundle

    app = _installed_app()
    if darwin and running_bundle() is None and app.exists():
        print(f"\n== as {app.name} (what the app itself is allowed)")
        inner = _as_app(app)
        print(inner.rstrip() if inner else "could not run it (open -W -n failed); double "
              "click the app once, then run this again")
    if not darwin:
        print("\nOn Linux only the microphone, the model cache, the VAD, MLX and the versions "
              "are checked; the rest needs a Mac.")
    sys.stdout.flush()
