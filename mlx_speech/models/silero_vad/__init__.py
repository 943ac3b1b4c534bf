"""Silero VAD (v5 / v6, 16 kHz) in MLX: a speech probability per 32 ms frame, streaming.

    from mlx_speech.models.silero_vad import load_vad
    vad = load_vad()                        # Silero's release model, shipped with mlx_speech
    state = vad.make_state(batch=2)
    probs, state = vad(audio, state)        # audio (2, n * 512) float32 16 kHz -> (2, n)
    mx.eval(probs, *state.arrays())

Weights, read without torch: by default `data/silero_vad.onnx`, shipped in this package (MIT,
Silero Team; provenance and license in data/): Silero's v6.2 release from the `silero-vad`
6.2.3 wheel, the network its JIT model, pipecat and LiveKit run. Also, when passed: the
`silero-vad` wheel's files or data folder (its `silero_vad_16k.safetensors` holds different
weights, a port's, snakers4/silero-vad#768), a local `.safetensors` / `.onnx` file or folder, a
hub repo (mlx-community's `silero-vad` / `silero-vad-v6` layout), or our converted layout. Only
the 16 kHz network is implemented (Silero's 8 kHz branch is not).
"""

from __future__ import annotations

import os
from pathlib import Path

import mlx.core as mx
import numpy as np

from ...errors import DISTRIBUTION, CheckpointError, MlxSpeechError
from ...hub import weight_files
from ..loading import fill, read_config, read_weights
from .model import CONTEXT, FRAME, SAMPLE_RATE, SileroVAD, VADState
from .onnxfile import read_onnx
from .weights import remap

__all__ = ["CONTEXT", "FRAME", "SAMPLE_RATE", "SileroVAD", "VADState", "frame_probs", "load",
           "load_vad", "packaged_weights", "weight_patterns", "wheel_weights"]

MODEL_TYPE = "silero_vad"
WHEEL_FILE = "silero_vad/data/silero_vad.onnx"  # Silero's release model
WHEEL_PORT = "silero_vad/data/silero_vad_16k.safetensors"  # a port's weights (#768)
PACKAGED = Path(__file__).parent / "data" / "silero_vad.onnx"  # Silero's v6.2 release, MIT
_HOW = "pass a .onnx or .safetensors file, a folder or a hub repo id"


def weight_patterns(folder: Path) -> list[str]:
    return ["*.safetensors"]


def packaged_weights() -> Path:
    """Silero's release model as shipped inside mlx_speech (`data/silero_vad.onnx`)."""
    if not PACKAGED.is_file():
        raise CheckpointError(f"the Silero VAD weights shipped with mlx_speech are missing "
                              f"({PACKAGED}): reinstall {DISTRIBUTION}, or {_HOW}")
    return PACKAGED


def wheel_weights() -> Path:
    """The installed `silero-vad` wheel's release model (`silero_vad.onnx`; its
    `silero_vad_16k.safetensors` if a build lacks it), found without importing the package
    (it imports torch)."""
    from importlib import metadata

    try:
        dist = metadata.distribution("silero-vad")
    except metadata.PackageNotFoundError:
        raise CheckpointError("the silero-vad wheel is not installed (mlx_speech ships Silero's "
                              "release model: load_vad() with no path)") from None
    for name in (WHEEL_FILE, WHEEL_PORT):
        f = Path(str(dist.locate_file(name)))
        if f.is_file():
            return f
    raise CheckpointError(f"the installed silero-vad {dist.version} has no {WHEEL_FILE} "
                          "(older releases lack it): `pip install --no-deps -U silero-vad`")


def _folder_file(folder: Path) -> Path:
    """The one weights file of a folder: converted, mlx-community (config.json model_type
    silero_vad) or one holding Silero's file (e.g. the wheel's data folder)."""
    if (folder / "config.json").exists():  # converted or mlx-community
        read_config(folder, MODEL_TYPE)
    else:
        for name in (WHEEL_FILE, WHEEL_PORT):  # Silero's own folder (the wheel's data/)
            if (folder / Path(name).name).is_file():
                return folder / Path(name).name
    files = weight_files(folder) or sorted(folder.glob("*.safetensors"))
    if len(files) != 1:
        what = "no" if not files else f"{len(files)}"
        raise CheckpointError(f"{folder}: {what} .safetensors files (expected one with the "
                              "Silero VAD weights)")
    return files[0]


def _find(path: str | os.PathLike | None) -> Path:
    if path is None:
        return packaged_weights()
    p = Path(path).expanduser()
    if p.is_file():
        if p.suffix not in (".safetensors", ".onnx"):
            raise CheckpointError(f"{p} is not Silero VAD weights: pass a .safetensors file "
                                  "(silero_vad_16k.safetensors) or Silero's .onnx model")
        return p
    if not p.exists():
        if p.suffix in (".onnx", ".safetensors") or str(path).startswith(("/", ".", "~")):
            what = "file" if p.suffix else "file or folder"
            raise CheckpointError(f"no such {what}: {path} (the Silero VAD weights: {_HOW})")
        from ...hub import resolve

        p = resolve(str(path), lambda kind, folder: weight_patterns(folder))
    return _folder_file(p)


def load_vad(path: str | os.PathLike | None = None, *, dtype: mx.Dtype | None = None,
             quantize: int | None = None, group_size: int | None = None) -> SileroVAD:
    """Silero VAD, strictly (every key mapped, none missing) and memory-mapped.

    `path`: None for Silero's release model shipped with mlx_speech (data/silero_vad.onnx,
    the `silero-vad` 6.2.3 wheel's); else a
    `.safetensors` file, one of Silero's `.onnx` models (read without onnx / onnxruntime; the
    wheel's `silero_vad.onnx` is Silero's v6.2 release, which its JIT model shares and its
    safetensors does not), a folder (our converted layout, mlx-community's, or one holding
    Silero's file) or a hub repo id. Runs in float32 unless `dtype` says otherwise.
    """
    if quantize is not None or group_size is not None:
        raise MlxSpeechError("the Silero VAD (0.3 M parameters) is not quantized; "
                             "drop --quantize")
    file = _find(path)
    if file.suffix == ".onnx":  # Silero's release weights, read without onnx / onnxruntime
        weights, converted = {k: mx.array(v) for k, v in read_onnx(file).items()}, False
    else:
        weights, converted = read_weights([file])
    model = SileroVAD()
    fill(model, weights, file, converted=converted, remap=lambda w, _: remap(w), dtype=dtype)
    return model


def load(folder: str | os.PathLike, **kwargs) -> SileroVAD:
    """The registry's entry (`mlx_speech.load(folder)` on a silero_vad checkpoint)."""
    return load_vad(folder, **kwargs)


def frame_probs(vad: SileroVAD, audio, *, piece_frames: int = 512) -> np.ndarray:
    """Speech probability of every 32 ms frame of a whole clip (1-D float 16 kHz numpy or
    mlx), zero-padded to whole frames, as Silero does; run `piece_frames` frames at a time
    (evaluated between pieces, so memory and graph size stay bounded)."""
    x = np.asarray(audio, dtype=np.float32)
    if x.ndim != 1:
        raise MlxSpeechError(f"frame_probs takes one clip (samples,), got {x.shape}")
    x = np.pad(x, (0, -len(x) % FRAME))
    state, out = vad.make_state(1), []
    step = piece_frames * FRAME
    for i in range(0, len(x), step):
        probs, state = vad(mx.array(x[None, i:i + step]), state)
        mx.eval(probs, *state.arrays())
        out.append(np.array(probs[0]))
    return np.concatenate(out) if out else np.zeros(0, np.float32)
