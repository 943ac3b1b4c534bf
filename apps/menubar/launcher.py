"""Boots MLX Speech.app (copied into the bundle as `Contents/Resources/boot.py`; stdlib only).

The bundle's main executable is a copy of this Python's interpreter, and `Contents/pyvenv.cfg`
makes `Contents/` a virtual environment of it, so the interpreter reads the site-packages
folder inside the bundle at startup. A `.pth` file there runs this file (with runpy: nothing
is compiled into the signed bundle) and calls `boot()`, which

- adds the site folders of the environment `--install-app` ran in (`Resources/launch.json`),
  so the bundle imports exactly what the shell imports;
- sets the environment variables recorded at install time (HF_HOME and friends: a launch
  from Finder or at login has none of the shell's, and would download models again);
- when the app was launched bare (Finder, `open`, the Login Item: no arguments) or as
  `MLX Speech mlx_speech.app ARGS...`, re-executes the same executable, in the same process,
  as `-m mlx_speech.app ARGS...`, with stdout and stderr in the log file when no terminal
  has them.

The process stays the bundle's own executable throughout, so macOS attributes it, its
permission prompts and its grants to MLX Speech.app.
"""

import json
import os
import site
import sys

MODULE = "mlx_speech.app"
BOOTED = "MLX_SPEECH_BOOTED"


def contents_dir(here: str | None = None) -> str:
    """Contents/ of the bundle: this file is Contents/Resources/boot.py."""
    return os.path.dirname(os.path.dirname(os.path.abspath(here or __file__)))


def app_args(argv: list) -> list | None:
    """The app's arguments from sys.argv as Python has it while starting up; None when this
    run is not a launch of the app (`-c`, `-m`, a script: a check or a tool)."""
    if not argv or argv == [""]:
        return []
    if argv[0] == MODULE:
        return list(argv[1:])
    return None


def _to_log(path: str) -> None:
    try:
        if os.isatty(1) or os.isatty(2):
            return
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    except OSError:
        return
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def boot(contents: str | None = None, argv: list | None = None, execv=os.execv) -> None:
    contents = contents or contents_dir()
    try:
        with open(os.path.join(contents, "Resources", "launch.json"), encoding="utf-8") as f:
            cfg = json.load(f)
    except (OSError, ValueError):
        return
    for d in cfg.get("site", []):
        if os.path.isdir(d):
            site.addsitedir(d)
    for p in cfg.get("path", []):
        if p not in sys.path:
            sys.path.append(p)
    for k, v in cfg.get("env", {}).items():
        os.environ.setdefault(k, v)
    if os.environ.get(BOOTED):
        return
    args = app_args(sys.argv if argv is None else argv)
    if args is None:
        return
    os.environ[BOOTED] = "1"
    if not args and cfg.get("log"):  # Finder/launchd: no terminal would ever see it
        _to_log(cfg["log"])
    execv(sys.executable, [sys.executable, "-m", MODULE, *args])
