"""User-facing errors: the CLIs print these as one line, never a traceback."""

from __future__ import annotations

import contextlib


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
    'mlx-speech[server]'`. Write the imports as usual inside it:

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
        fix = f"pip install 'mlx-speech[{extra}]'"
        if isinstance(e, ModuleNotFoundError):
            raise error(f"{what} needs {dist}: {fix}") from None
        raise error(f"{what} needs a working {dist} ({e}): {fix}") from None
