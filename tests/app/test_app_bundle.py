"""`--install-app` (MLX Speech.app: the interpreter's own binary inside the bundle, booting the
app in-process), the Login Item, the single-instance lock, the log file and `--doctor`,
checked on Linux: the bundle's layout is the one macOS gets, and it really runs the app."""

from __future__ import annotations

import json
import os
import plistlib
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from mlx_speech.app import bundle

ROOT = Path(__file__).resolve().parents[2]
EXE = Path("Contents") / "MacOS" / "MLX Speech"


def _env(home: Path, **extra) -> dict:
    """What a launch from Finder or launchd gets: no shell variables."""
    return {"HOME": str(home), "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", **extra}


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    home = tmp_path_factory.mktemp("home")
    r = subprocess.run([sys.executable, "-m", "mlx_speech.app", "--install-app",
                        str(home / "Applications")], cwd=ROOT, capture_output=True, text=True,
                       env={**os.environ, "HOME": str(home)}, timeout=300)
    assert r.returncode == 0, r.stderr
    return home, home / "Applications" / "MLX Speech.app", r.stderr


def test_install_app_writes_the_layout_macos_gets(installed):
    home, app, said = installed
    from mlx_speech.app import launcher, macho

    assert "only works on macOS" in said
    exe = app / EXE
    with open(exe, "rb") as f:
        assert macho.kind(f.read(4)) in ("elf", "mach-o")  # the interpreter, not a script
    assert exe.stat().st_mode & 0o111
    info = plistlib.loads((app / "Contents" / "Info.plist").read_bytes())
    assert info["CFBundleExecutable"] == "MLX Speech" and info["LSUIElement"] is True
    assert info["CFBundleIdentifier"] == "io.github.mlx-realtime-speech.menubar"
    assert info["CFBundlePackageType"] == "APPL" and "what you say" in info[
        "NSMicrophoneUsageDescription"]
    cfg = (app / "Contents" / "pyvenv.cfg").read_text()
    assert f"home = {os.path.dirname(sys._base_executable)}" in cfg
    v = f"python{sys.version_info.major}.{sys.version_info.minor}"
    pth = app / "Contents" / "lib" / v / "site-packages" / "mlx_speech_app.pth"
    assert pth.read_text().startswith("import ")
    assert (app / "Contents" / "Resources" / "boot.py").read_text() == Path(
        launcher.__file__).read_text()
    launch = json.loads((app / "Contents" / "Resources" / "launch.json").read_text())
    import site

    assert set(launch["site"]) >= {d for d in site.getsitepackages() if os.path.isdir(d)}
    assert launch["env"]["HF_HUB_CACHE"] == str(home / ".cache" / "huggingface" / "hub")
    assert launch["log"].endswith("app.log")


def test_the_bundle_runs_the_app_as_itself(installed):
    home, app, _ = installed
    before = sorted(p.relative_to(app) for p in app.rglob("*"))
    # launched bare, as Finder or the Login Item do: the app starts (and says it needs macOS)
    r = subprocess.run([str(app / EXE)], env=_env(home), stdin=subprocess.DEVNULL,
                       capture_output=True, text=True, timeout=120, cwd="/")
    assert r.returncode == 1
    log = json.loads((app / "Contents" / "Resources" / "launch.json").read_text())["log"]
    assert "the menu-bar app needs macOS" in Path(log).read_text()  # output went to the log
    # with arguments (`open -a "MLX Speech" --args mlx_speech.app --doctor`): the doctor, run
    # by the bundle's own executable
    r = subprocess.run([str(app / EXE), "mlx_speech.app", "--doctor"], env=_env(home),
                       capture_output=True, text=True, timeout=120, cwd="/")
    assert r.returncode == 0, r.stderr
    assert f"({app / EXE})" in r.stdout and "MLX Speech.app (" in r.stdout
    # nothing was written into the (signed) bundle by running it
    assert sorted(p.relative_to(app) for p in app.rglob("*")) == before


def _fat(*slices: bytes) -> bytes:
    from mlx_speech.app import macho

    head = struct.pack(">II", macho.FAT_MAGIC, len(slices))
    off, body, arch = 4096, b"", b""
    for s in slices:
        arch += struct.pack(">iiIII", 0x0100000C, 0, off + len(body), len(s), 12)
        body += s.ljust(4096, b"\0")
    return (head + arch).ljust(4096, b"\0") + body


def _thin(dylibs: list[str], rpaths: list[str] = ()) -> bytes:
    from mlx_speech.app import macho

    cmds = b""
    for cmd, names, head in ((macho.LC_LOAD_DYLIB, dylibs, 24), (macho.LC_RPATH, rpaths, 12)):
        for name in names:
            raw = name.encode() + b"\0"
            size = (head + len(raw) + 7) // 8 * 8
            body = struct.pack("<III", cmd, size, head)
            if cmd == macho.LC_LOAD_DYLIB:
                body += struct.pack("<III", 2, 0x10000, 0x10000)
            cmds += (body + raw).ljust(size, b"\0")
    n = len(dylibs) + len(rpaths)
    return struct.pack("<IiiIIIII", macho.MH_MAGIC_64, 0x0100000C, 0, 2, n, len(cmds), 0, 0) \
        + cmds


def test_a_relatively_linked_interpreter_brings_its_libpython(tmp_path):
    from mlx_speech.app import macho

    py = tmp_path / "python" / "bin" / "python3.12"
    py.parent.mkdir(parents=True)
    py.write_bytes(_fat(_thin(["@executable_path/../lib/libpython3.12.dylib",
                               "/usr/lib/libSystem.B.dylib", "@rpath/libffi.8.dylib"],
                              ["@executable_path/../lib/extra", "/opt/abs"]),
                        _thin(["@executable_path/../lib/libpython3.12.dylib"])))
    assert macho.kind(py.read_bytes()) == "mach-o" and macho.kind(b"#!/bin/sh") == "script"
    assert macho.load_commands(py.read_bytes()) == (
        ["@executable_path/../lib/libpython3.12.dylib", "/usr/lib/libSystem.B.dylib",
         "@rpath/libffi.8.dylib"], ["@executable_path/../lib/extra", "/opt/abs"])
    for lib in ("lib/libpython3.12.dylib", "lib/extra/libffi.8.dylib"):
        (tmp_path / "python" / lib).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "python" / lib).write_bytes(b"\xcf\xfa\xed\xfe lib")
    interp = bundle.Interpreter(py, str(py.parent), "3.12.4", [], [], {})
    app = bundle.write_app_bundle(tmp_path / "Apps", interp, log="/tmp/x.log")
    assert (app / "Contents" / "lib" / "libpython3.12.dylib").exists()
    assert (app / "Contents" / "lib" / "extra" / "libffi.8.dylib").exists()
    assert (app / "Contents" / "lib" / "python3.12" / "site-packages").is_dir()


def test_on_macos_the_bundle_is_signed_under_its_identifier(tmp_path):
    calls = []

    class R:
        returncode, stdout, stderr = 0, "/prefix\n", ""

    def run(argv, **kw):
        calls.append([str(a) for a in argv])
        return R()

    real = bundle.find_interpreter()
    app, notes = bundle.install_app(tmp_path, run=run, platform="darwin", interp=real)
    signs = [c for c in calls if c[0] == "codesign"]
    assert signs == [["codesign", "--force", "--sign", "-", "--identifier",
                      "io.github.mlx-realtime-speech.menubar", str(app)],
                     ["codesign", "--verify", "--strict", str(app)]]
    check = [c for c in calls if c[0] == str(app / EXE)]
    assert check and check[0][1] == "-c" and notes == []
    # a reinstall from another Python changes the executable: say what it means for grants
    other = tmp_path / "other-python"
    other.write_bytes(real.binary.read_bytes() + b"\0")
    interp = bundle.Interpreter(other, real.home, real.version, real.site, real.path, {})
    _, notes = bundle.install_app(tmp_path, run=run, platform="darwin", interp=interp)
    assert any("tccutil reset All io.github.mlx-realtime-speech.menubar" in n for n in notes)
    R.returncode, R.stderr = 1, "code object is not signed at all"
    with pytest.raises(Exception, match="codesign --force --sign failed: code object"):
        bundle.install_app(tmp_path, run=run, platform="darwin", interp=real)


def test_boot_runs_the_app_only_for_a_launch(tmp_path, monkeypatch):
    from mlx_speech.app import launcher

    assert launcher.app_args([""]) == [] and launcher.app_args([]) == []
    assert launcher.app_args(["mlx_speech.app", "--doctor"]) == ["--doctor"]
    assert launcher.app_args(["-c"]) is None and launcher.app_args(["tool.py"]) is None
    contents = tmp_path / "Contents"
    (contents / "Resources").mkdir(parents=True)
    site_dir = tmp_path / "env-site"
    site_dir.mkdir()
    (site_dir / "extra.pth").write_text(str(tmp_path / "from-pth") + "\n")
    (contents / "Resources" / "launch.json").write_text(json.dumps(
        {"site": [str(site_dir)], "path": ["/checkout"], "env": {"HF_HOME": "/models"},
         "log": ""}))
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delenv("MLX_SPEECH_BOOTED", raising=False)
    monkeypatch.delenv("HF_HOME", raising=False)
    (tmp_path / "from-pth").mkdir()
    execs = []
    launcher.boot(str(contents), argv=[""], execv=lambda exe, argv: execs.append(argv))
    assert execs == [[sys.executable, "-m", "mlx_speech.app"]]
    assert str(site_dir) in sys.path and str(tmp_path / "from-pth") in sys.path
    assert "/checkout" in sys.path and os.environ["HF_HOME"] == "/models"
    assert os.environ["MLX_SPEECH_BOOTED"] == "1"
    launcher.boot(str(contents), argv=[""], execv=lambda exe, argv: execs.append(argv))
    assert len(execs) == 1  # the re-executed process does not boot again


# ---------------------------------------------------------------- Login Item


def test_login_item_is_written_for_the_next_login_not_started(tmp_path):
    calls = []

    class R:
        returncode, stdout, stderr = 0, "", ""

    def run(argv, **kw):
        calls.append(argv)
        return R()

    home = tmp_path / "home"
    with pytest.raises(Exception, match="--install-app first"):
        bundle.set_login_item(True, home=home, run=run, uid=501)
    exe = home / "Applications" / "MLX Speech.app" / EXE
    exe.parent.mkdir(parents=True)
    exe.write_bytes(b"\xcf\xfa\xed\xfe")
    assert "next login" in bundle.set_login_item(True, home=home, run=run, uid=501)
    plist = home / "Library" / "LaunchAgents" / "io.github.mlx-realtime-speech.menubar.plist"
    agent = plistlib.loads(plist.read_bytes())
    assert agent["ProgramArguments"] == ["/usr/bin/open", "-g",
                                         str(home / "Applications" / "MLX Speech.app")]
    assert agent["RunAtLoad"] is True and calls == []  # not loaded: nothing starts now
    assert bundle.login_item_enabled(home)
    bundle.set_login_item(False, home=home, run=run, uid=501)
    assert calls == [["launchctl", "bootout", "gui/501/io.github.mlx-realtime-speech.menubar"]]
    assert not plist.exists() and not bundle.login_item_enabled(home)


def test_login_item_on_from_the_command_line_starts_nothing(tmp_path):
    home, log, bin_dir = tmp_path / "home", tmp_path / "calls.log", tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("launchctl", "open"):
        (bin_dir / tool).write_text(f'#!/bin/sh\necho "{tool} $*" >> "{log}"\n')
        (bin_dir / tool).chmod(0o755)
    exe = home / "Applications" / "MLX Speech.app" / EXE
    exe.parent.mkdir(parents=True)
    exe.write_bytes(b"\xcf\xfa\xed\xfe")
    r = subprocess.run([sys.executable, "-m", "mlx_speech.app", "--login-item", "on"],
                       cwd=ROOT, capture_output=True, text=True,
                       env={**os.environ, "HOME": str(home),
                            "PATH": f"{bin_dir}:{os.environ['PATH']}"})
    assert r.returncode == 0, r.stderr
    assert not log.exists() or "bootstrap" not in log.read_text()
    agents = home / "Library" / "LaunchAgents"
    assert (agents / "io.github.mlx-realtime-speech.menubar.plist").exists()


# ---------------------------------------------------------------- one instance, the log


def test_one_instance_holds_the_lock(tmp_path):
    from mlx_speech.app.instance import InstanceLock, holder

    a, b = InstanceLock(tmp_path / "app.lock"), InstanceLock(tmp_path / "app.lock")
    assert a.acquire() and holder(a.path) == os.getpid()
    assert not b.acquire()  # a second open file: flock says no
    a.release()
    assert b.acquire()
    b.release()


def test_output_goes_to_the_log_file(tmp_path):
    log = tmp_path / "Logs" / "app.log"
    log.parent.mkdir()
    log.write_bytes(b"x" * 200)
    code = ("import os; from mlx_speech.app.settings import open_log; open_log(max_bytes=100);"
            "print('from python'); os.write(2, b'from C\\n')")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       env={**os.environ, "MLX_SPEECH_APP_LOG": str(log)})
    assert r.returncode == 0 and r.stdout == r.stderr == ""
    assert log.read_text().splitlines() == ["from python", "from C"]
    assert (tmp_path / "Logs" / "app.log.1").read_bytes() == b"x" * 200  # rotated


def test_doctor_on_linux_says_what_it_cannot_check(tmp_path):
    r = subprocess.run([sys.executable, "-m", "mlx_speech.app", "--doctor"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120,
                       env={**os.environ, "HOME": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    rows = {line.split()[0]: line for line in r.stdout.splitlines() if line.strip()}
    assert "cannot check on Linux" in rows["permissions"]
    assert "cannot check on Linux" in rows["event"]
    assert "no " in rows["bundle"] and "--install-app" in rows["bundle"]
    for name in ("microphone", "model", "settings", "log", "versions", "running"):
        assert name in rows, r.stdout
    assert "mlx " in rows["versions"] and "the rest needs a Mac" in r.stdout
