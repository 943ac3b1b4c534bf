"""`--install-app`: MLX Speech.app, a real app bundle; and the Login Item (plain Python).

The bundle's main executable is a copy of this Python's interpreter binary (a Mach-O; on a
framework build the one inside Python.app, never the `bin/python3` stub that re-executes
it). `Contents/pyvenv.cfg` makes `Contents/` a virtual environment of that Python, and a
`.pth` file in the bundle's own site-packages runs `launcher.boot()` (copied in as
`Resources/boot.py`): it adds this
environment's site folders and starts `mlx_speech.app` in the same process. So the process
that runs IS the bundle: macOS reads its Info.plist (LSUIElement, the microphone usage
string), names it in the permission prompts, and keeps its grants apart from every other
Python script. It is signed ad-hoc (or with `--sign IDENTITY`) under a stable identifier.

An ad-hoc signature pins the executable's hash: after a Python upgrade (or any reinstall
that copies a different interpreter) macOS treats the app as new and asks again.

The Login Item is a LaunchAgent that runs `open -g <bundle>` at login. It is only written
(or removed): loading it now would start a second copy of the running app.
"""

from __future__ import annotations

import hashlib
import json
import os
import plistlib
import shutil
import site
import subprocess
import sys
import sysconfig
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from mlx_speech import __version__
from mlx_speech.errors import MlxSpeechError

from . import launcher, macho

BUNDLE_ID = "io.github.mlx-realtime-speech.menubar"
APP_NAME = "MLX Speech"
EXECUTABLE = APP_NAME
BOOT_PTH = "mlx_speech_app.pth"
# a .pth "import" line runs at startup; runpy compiles boot.py in memory (no __pycache__
# written into the signed bundle)
BOOT_LINE = ("import os, runpy, sys; runpy.run_path(os.path.join(sys.prefix, 'Resources', "
             "'boot.py'), run_name='_mlx_speech_boot')['boot']()\n")
MIC_USAGE = ("MLX Speech transcribes what you say while you hold the dictation hotkey, "
             "on this Mac.")
# what a Finder/login launch must see as the shell does (the model cache above all)
ENV_KEYS = ("HF_HOME", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_ENDPOINT",
            "HF_HUB_OFFLINE", "HF_HUB_DISABLE_TELEMETRY", "XDG_CACHE_HOME",
            "MLX_SPEECH_APP_CONFIG", "MLX_SPEECH_APP_LOG")
LSREGISTER = ("/System/Library/Frameworks/CoreServices.framework/Frameworks/"
              "LaunchServices.framework/Support/lsregister")


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
        "LSUIElement": True,  # a menu-bar app: no Dock icon, no main menu, no focus at launch
        "LSMinimumSystemVersion": "13.0",
        "NSMicrophoneUsageDescription": MIC_USAGE,
        "NSHighResolutionCapable": True,
    }


@dataclass
class Interpreter:
    """What the bundle is built from: this Python and the environment it runs in."""

    binary: Path  # the real interpreter executable (copied)
    home: str  # pyvenv.cfg's home: the base interpreter's bin folder (finds the stdlib)
    version: str  # "3.12.4"
    site: list[str] = field(default_factory=list)  # site folders to add (with their .pth)
    path: list[str] = field(default_factory=list)  # plain sys.path entries (a checkout)
    env: dict[str, str] = field(default_factory=dict)

    @property
    def short(self) -> str:
        return ".".join(self.version.split(".")[:2])


def find_interpreter() -> Interpreter:
    """This process's interpreter binary, environment, and the variables to carry over."""
    framework = sysconfig.get_config_var("PYTHONFRAMEWORK")
    base = getattr(sys, "_base_executable", None) or sys.executable
    binary = Path(os.path.realpath(base))
    if framework:  # bin/python3.x is a stub that re-executes Resources/Python.app
        app = Path(sys.base_prefix) / "Resources" / "Python.app" / "Contents" / "MacOS"
        if (app / framework).exists():
            binary = app / framework
    sites = [d for d in site.getsitepackages() if os.path.isdir(d)]
    user = site.getusersitepackages() if site.ENABLE_USER_SITE else None
    if user and os.path.isdir(user):
        sites.append(user)
    import mlx_speech

    pkg_root = str(Path(mlx_speech.__file__).resolve().parents[1])
    path = [] if any(pkg_root == str(Path(d).resolve()) for d in sites) else [pkg_root]
    env = {k: os.environ[k] for k in ENV_KEYS if os.environ.get(k)}
    try:  # where the shell's hub cache really is, whatever set it
        from huggingface_hub import constants

        env.setdefault("HF_HUB_CACHE", str(constants.HF_HUB_CACHE))
    except Exception:  # pragma: no cover - huggingface_hub is a core dependency
        pass
    v = sys.version_info
    return Interpreter(binary, os.path.dirname(base), f"{v.major}.{v.minor}.{v.micro}",
                       sites, path, env)


def _copy_dependencies(exe_src: Path, macos_dir: Path) -> list[Path]:
    """Libraries the interpreter loads relative to itself (`@executable_path/../lib/
    libpython3.x.dylib`, directly or through an rpath), copied to the same place relative to
    the copy. Absolute ones (python.org, Homebrew: the framework) need nothing."""
    try:
        dylibs, rpaths = macho.load_commands(exe_src.read_bytes())
    except ValueError:
        return []
    src_dir, copied = exe_src.parent, []
    rel_dirs = [r.split("/", 1)[1] if "/" in r else "" for r in rpaths
                if r.startswith(("@executable_path", "@loader_path"))]
    for name in dylibs:
        candidates = []
        if name.startswith(("@executable_path/", "@loader_path/")):
            candidates = [name.split("/", 1)[1]]
        elif name.startswith("@rpath/"):
            candidates = [os.path.join(d, name[len("@rpath/"):]) for d in rel_dirs]
        for rel in candidates:
            src = (src_dir / rel).resolve()
            dst = (macos_dir / rel).resolve()
            if not src.is_file():
                continue
            if macos_dir.parent.resolve() not in dst.parents:
                raise MlxSpeechError(f"{exe_src} loads {name} from outside any bundle layout")
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)
            copied.append(dst)
            break
    return copied


def write_app_bundle(folder: str | Path, interp: Interpreter | None = None,
                     log: str | None = None) -> Path:
    """Write `<folder>/MLX Speech.app` (replacing an older one); returns its path."""
    interp = interp or find_interpreter()
    with open(interp.binary, "rb") as f:
        head = f.read(4)
    if macho.kind(head) not in ("mach-o", "elf"):
        raise MlxSpeechError(f"{interp.binary} is not an interpreter binary")
    folder = Path(folder).expanduser()
    app = folder / f"{APP_NAME}.app"
    tmp = folder / f".{APP_NAME}.app.tmp"
    if tmp.exists():
        shutil.rmtree(tmp)
    try:
        contents = tmp / "Contents"
        (contents / "MacOS").mkdir(parents=True)
        (contents / "Resources").mkdir()
        with open(contents / "Info.plist", "wb") as f:
            plistlib.dump(info_plist(), f)
        (contents / "PkgInfo").write_text("APPL????")
        exe = contents / "MacOS" / EXECUTABLE
        shutil.copy2(interp.binary, exe)
        exe.chmod(0o755)
        _copy_dependencies(interp.binary, contents / "MacOS")
        (contents / "pyvenv.cfg").write_text(
            f"home = {interp.home}\ninclude-system-site-packages = false\n"
            f"version = {interp.version}\n")
        sp = contents / "lib" / f"python{interp.short}" / "site-packages"
        sp.mkdir(parents=True)
        shutil.copy2(launcher.__file__, contents / "Resources" / "boot.py")
        (sp / BOOT_PTH).write_text(BOOT_LINE)
        cfg = {"site": interp.site, "path": interp.path, "env": interp.env,
               "log": log if log is not None else _log_path(), "python": interp.version,
               "interpreter": str(interp.binary), "mlx_speech": __version__}
        (contents / "Resources" / "launch.json").write_text(json.dumps(cfg, indent=2))
        if app.exists():
            shutil.rmtree(app)
        os.replace(tmp, app)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise MlxSpeechError(f"cannot write {app}: {e.strerror or e}") from None
    return app


def _log_path() -> str:
    from .settings import log_path

    return str(log_path())


def _sha256(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def check_bundle(app: Path, run: Callable = subprocess.run) -> str:
    """Run the bundle's executable as a launch from Finder would (no shell variables) and
    import the app: returns its sys.prefix, or raises with what went wrong."""
    exe = app / "Contents" / "MacOS" / EXECUTABLE
    env = {"HOME": os.path.expanduser("~"), "PATH": "/usr/bin:/bin:/usr/sbin:/sbin",
           "TMPDIR": os.environ.get("TMPDIR", "/tmp"), "PYTHONDONTWRITEBYTECODE": "1"}
    code = "import sys, mlx_speech.app.cli; print(sys.prefix)"
    try:
        r = run([str(exe), "-c", code], capture_output=True, text=True, env=env, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise MlxSpeechError(f"the bundle's interpreter does not start: {e}") from None
    if r.returncode != 0:
        tail = (r.stderr or r.stdout or "").strip().splitlines()[-3:]
        raise MlxSpeechError("the bundle's interpreter cannot import the app: "
                             + " | ".join(tail))
    return r.stdout.strip().splitlines()[-1]


def sign(app: Path, identity: str = "-", run: Callable = subprocess.run) -> list[str]:
    """Sign the copied libraries, then the bundle, under BUNDLE_ID (codesign replaces the
    interpreter's own signature: its identifier would be org.python.python). Returns notes
    (a failed strict verification is reported, not fatal)."""
    contents = app / "Contents"
    for lib in sorted(contents.rglob("*.dylib")):
        _codesign(["--force", "--sign", identity, str(lib)], run)
    _codesign(["--force", "--sign", identity, "--identifier", BUNDLE_ID, str(app)], run)
    try:
        _codesign(["--verify", "--strict", str(app)], run)
    except MlxSpeechError as e:
        return [f"{e} (please report it with `mlx_speech.app --doctor`)"]
    return []


def _codesign(args: list[str], run: Callable) -> None:
    try:
        r = run(["codesign", *args], capture_output=True, text=True)
    except FileNotFoundError:
        raise MlxSpeechError("codesign not found") from None
    if r.returncode != 0:
        msg = (r.stderr or r.stdout or "").strip().splitlines()
        raise MlxSpeechError(f"codesign {' '.join(args[:2])} failed: "
                             f"{msg[-1] if msg else r.returncode}")


def install_app(folder: str | Path = "~/Applications", *, identity: str = "-",
                run: Callable = subprocess.run, platform: str = sys.platform,
                interp: Interpreter | None = None) -> tuple[Path, list[str]]:
    """Write, sign (macOS) and check the bundle; returns its path and notes for the user."""
    folder = Path(folder).expanduser()
    old = _sha256(folder / f"{APP_NAME}.app" / "Contents" / "MacOS" / EXECUTABLE)
    app = write_app_bundle(folder, interp)
    notes = []
    if platform == "darwin":
        notes += sign(app, identity, run)
        if os.path.exists(LSREGISTER):  # LaunchServices re-reads the Info.plist
            run([LSREGISTER, "-f", str(app)], capture_output=True)
    check_bundle(app, run)
    new = _sha256(app / "Contents" / "MacOS" / EXECUTABLE)
    if platform != "darwin":
        notes.append("this is the layout macOS gets; the app itself only runs on macOS")
    elif old is not None and old != new and identity == "-":
        notes.append("the app's executable changed (another Python): macOS will ask for "
                     "its permissions again; if a switch in System Settings stays on but "
                     f"does nothing, run: tccutil reset All {BUNDLE_ID}")
    return app, notes


def launch_agent_plist(app: Path) -> dict:
    return {
        "Label": BUNDLE_ID,
        "ProgramArguments": ["/usr/bin/open", "-g", str(app)],
        "RunAtLoad": True,  # at login (a plist in LaunchAgents is loaded then)
        "ProcessType": "Interactive",
        "LimitLoadToSessionType": "Aqua",
    }


def login_item_path(home: Path | None = None) -> Path:
    home = Path.home() if home is None else Path(home)
    return home / "Library" / "LaunchAgents" / f"{BUNDLE_ID}.plist"


def set_login_item(enabled: bool, *, home: Path | None = None, app: Path | None = None,
                   run: Callable = subprocess.run, uid: int | None = None) -> str:
    """On: write the LaunchAgent, which macOS loads at the next login (nothing starts now:
    the app is already running). Off: unload it (it only ran `open`, so the app keeps
    running) and remove it."""
    plist = login_item_path(home)
    home = plist.parents[2]
    if not enabled:
        uid = os.getuid() if uid is None else uid
        try:
            run(["launchctl", "bootout", f"gui/{uid}/{BUNDLE_ID}"], capture_output=True,
                text=True)
        except FileNotFoundError:  # not macOS: there is nothing loaded to stop
            pass
        plist.unlink(missing_ok=True)
        return "Login Item off"
    app = Path(app) if app else home / "Applications" / f"{APP_NAME}.app"
    if not (app / "Contents" / "MacOS" / EXECUTABLE).exists():
        raise MlxSpeechError(f"no {app}: run mlx_speech.app --install-app first")
    plist.parent.mkdir(parents=True, exist_ok=True)
    tmp = plist.with_name(plist.name + ".tmp")
    with open(tmp, "wb") as f:
        plistlib.dump(launch_agent_plist(app), f)
    os.replace(tmp, plist)
    return f"Login Item on from your next login: {plist}"


def running_bundle() -> Path | None:
    """The .app this process runs as (its executable is Contents/MacOS/<name>), if any."""
    exe = Path(sys.executable).resolve()
    if exe.parent.name == "MacOS" and exe.parent.parent.name == "Contents" \
            and exe.parents[2].suffix == ".app":
        return exe.parents[2]
    return None


def login_item_enabled(home: Path | None = None) -> bool:
    return login_item_path(home).exists()
