"""User-facing errors: the CLIs print these as one line, never a traceback."""

from __future__ import annotations

import contextlib

# what pip installs this project as (pyproject's [project] name; the import name is mlx_speech).
# `mlx-speech` on the package index is another project with the same import name.
DISTRIBUTION = "mlx-realtime-speech"


class MlxSpeechError(Exception):
    """Base class for errors caused by bad input, files or environment."""


class AudioError(MlxSpeechError):
    """Audio that cannot be read or used (missing, corrupt, empty, NaN...)."""


class CheckpointError(MlxSpeechError):
    """A model folder or file that is not a checkpoint we can load."""


class DeviceError(MlxSpeechError):
    """No microphone/speaker, or permission denied."""


class MissingDependency(MlxSpeechError):
    """An optional package that is not installed: the message names the extra to install."""


# Import names whose distribution (what pip installs) is named differently.
# tests/project/test_declared_deps.py uses the same table to check pyproject.toml.
DISTRIBUTIONS = {
    "PIL": "pillow",
    "yaml": "pyyaml",
    "huggingface_hub": "huggingface-hub",
    "AppKit": "pyobjc-framework-Cocoa",
    "Foundation": "pyobjc-framework-Cocoa",
    "Quartz": "pyobjc-framework-Quartz",
    "ApplicationServices": "pyobjc-framework-ApplicationServices",
    "AVFoundation": "pyobjc-framework-AVFoundation",
    "objc": "pyobjc-core",
    "PyObjCTools": "pyobjc-core",
    "python_multipart": "python-multipart",
}


@contextlib.contextmanager
def optional(extra: str, what: str, error: type[MlxSpeechError] = MissingDependency):
    """Import optional packages inside this block; a missing one raises `error` with one line
    naming the extra that installs it, e.g. `the server needs fastapi: pip install
    'mlx-realtime-speech[server]'`. Write the imports as usual inside it:

        with optional("app", "the preview"):
            from PIL import Image
    """
    try:
        yield
    except ImportError as e:
        name = (e.name or "").split(".")[0]
        if not name or name in ("mlx_speech", "convert", "apps"):
            raise
        dist = DISTRIBUTIONS.get(name, name)
        fix = install_hint(extra)
        if isinstance(e, ModuleNotFoundError):
            raise error(f"{what} needs {dist}: {fix}") from None
        raise error(f"{what} needs a working {dist} ({e}): {fix}") from None


def install_hint(extra: str) -> str:
    """`pip install 'mlx-realtime-speech[EXTRA]'`: what adds an extra (from a clone too: pip
    keeps the installed checkout and adds the extra's packages)."""
    return f"pip install '{DISTRIBUTION}[{extra}]'"


def backend_extra(platform: str | None = None) -> str:
    """What to install for MLX's backend on this platform, as one clause."""
    import sys

    platform = platform or sys.platform
    if platform == "darwin":
        return ("reinstall MLX for Apple silicon: pip install --force-reinstall mlx "
                "(macOS 14 or newer, an arm64 Python)")
    return f"{install_hint('cpu')} (no NVIDIA GPU) or {install_hint('cuda')} (an NVIDIA GPU)"


def is_mlx_import_error(e: BaseException) -> bool:
    """An ImportError from MLX itself: the wheel without its backend library (`pip install
    -e .` on Linux installs MLX's Python part only)."""
    if not isinstance(e, ImportError):
        return False
    name = (e.name or "").split(".")[0]
    return name == "mlx" or "libmlx" in str(e)


def missing_backend(e: ImportError) -> MissingDependency:
    """The one line for an MLX that cannot load: why, and which extra to install."""
    first = (str(e).splitlines() or [""])[0]
    return MissingDependency(f"MLX has no backend here ({first}): {backend_extra()}")
