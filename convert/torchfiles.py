"""torch.save files and folders of them -> safetensors, no pickled code run.

    mlx_speech.convert voice.pt voice.safetensors        # one torch.save file
    mlx_speech.convert voice_embedding/ voices/          # every .pt in a folder

torch.save files (.pt .pth .ckpt .bin) are read without torch. A file holding
a bare tensor (a Voxtral TTS voice) is saved under the key "embedding"; a
state dict or nested dict keeps its names, joined with dots. dtypes (bf16
included) are kept, except float64, which MLX cannot load (nor compute with on a
GPU) and is stored as float32. Converting the same file twice gives identical bytes.
"""

from __future__ import annotations

import sys
from pathlib import Path

from mlx_speech.errors import CheckpointError, MlxSpeechError

TORCH_SUFFIXES = (".pt", ".pth", ".ckpt", ".bin")
METADATA = {"format": "pt"}  # tensors keep torch's names and layouts


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def torch_tensors(src: str | Path, float64: list[str] | None = None) -> dict:
    """The tensors of a torch.save file, by name: a bare tensor becomes "embedding".

    float64 tensors come back as float32; their names are appended to `float64` if given."""
    import mlx.core as mx

    from mlx_speech.models.torchfile import flatten_tensors, load_torch

    narrowed: list = []
    obj = load_torch(src, narrowed=narrowed)
    tensors = {"embedding": obj} if isinstance(obj, mx.array) else flatten_tensors(obj)
    if not tensors:
        raise CheckpointError(f"{src} holds no tensors")
    if float64 is not None:
        ids = {id(a) for a in narrowed}
        float64.extend(k for k, v in tensors.items() if id(v) in ids)
    return tensors


_ST_DTYPES = {"bool": "BOOL", "uint8": "U8", "int8": "I8", "uint16": "U16", "int16": "I16",
              "uint32": "U32", "int32": "I32", "uint64": "U64", "int64": "I64",
              "float16": "F16", "bfloat16": "BF16", "float32": "F32", "float64": "F64",
              "complex64": "C64"}


def save_safetensors(path: str | Path, tensors: dict, metadata: dict | None = None,
                     progress=None) -> None:
    """Write a safetensors file atomically and byte-for-byte reproducibly.

    Keys are sorted, the header is compact JSON with fixed metadata, and every
    dtype MLX arrays hold is kept (mx.save_safetensors refuses float64).
    Tensors are evaluated one at a time as they are written; `progress(nbytes)`
    is called after each.
    """
    import json

    import mlx.core as mx
    import numpy as np

    from mlx_speech.audio.io import atomic_output

    names = sorted(tensors)
    header: dict = {"__metadata__": dict(METADATA if metadata is None else metadata)}
    start = 0
    for k in names:
        a = tensors[k]
        kind = str(a.dtype).rsplit(".", 1)[-1]
        if kind not in _ST_DTYPES:
            raise MlxSpeechError(f"tensor {k!r} has dtype {kind}, which safetensors cannot hold")
        header[k] = {"dtype": _ST_DTYPES[kind], "shape": list(a.shape),
                     "data_offsets": [start, start + a.nbytes]}
        start += a.nbytes
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # the data starts 8-byte aligned
    with atomic_output(path) as tmp:
        with open(tmp, "wb") as f:
            f.write(len(blob).to_bytes(8, "little") + blob)
            for k in names:
                a = tensors[k]
                arr = np.asarray(a.view(mx.uint16) if a.dtype == mx.bfloat16 else a)
                arr = np.ascontiguousarray(arr.astype(arr.dtype.newbyteorder("<"), copy=False))
                f.write(memoryview(arr).cast("B"))
                if progress is not None:
                    progress(a.nbytes)


def convert_torch_file(src: Path, dst: Path) -> Path:
    f64: list[str] = []
    tensors = torch_tensors(src, float64=f64)
    if f64:
        log(f"{src.name}: storing {len(f64)} float64 tensor(s) as float32 "
            f"({', '.join(f64[:3])}{', ...' if len(f64) > 3 else ''})")
    save_safetensors(dst, tensors)
    return dst


def _file_target(src: Path, out: Path) -> Path:
    if out.suffix == ".safetensors":
        return out
    if out.exists() and not out.is_dir():
        raise MlxSpeechError(f"output {out} must be a .safetensors file or a folder")
    _mkdir(out)
    return out / (src.stem + ".safetensors")


def _mkdir(out: Path) -> None:
    try:
        out.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise MlxSpeechError(f"cannot create folder {out}: a file is in the way") from None
    except OSError as e:
        raise MlxSpeechError(f"cannot create folder {out}: {e.strerror or e}") from None


def convert_folder(src: Path, out: Path, *, progress: bool = True) -> list[Path]:
    """Every torch.save file directly in `src` -> `out/<stem>.safetensors`."""
    files = sorted(p for p in src.iterdir() if p.is_file() and p.suffix in TORCH_SUFFIXES)
    if not files:
        raise MlxSpeechError(f"no {'/'.join(TORCH_SUFFIXES)} files in {src}")
    stems = [p.stem for p in files]
    if len(set(stems)) != len(stems):
        dup = sorted({s for s in stems if stems.count(s) > 1})
        raise MlxSpeechError(f"{src} has several files named {dup[0]}.*; convert them one by one")
    if out.suffix == ".safetensors" or (out.exists() and not out.is_dir()):
        raise MlxSpeechError(f"output {out} must be a folder when converting a folder")
    _mkdir(out)
    bar = None
    if progress and len(files) > 1:
        from tqdm import tqdm

        bar = tqdm(total=len(files), unit="file", desc="converting", file=sys.stderr,
                   leave=False)
    written = []
    try:
        for f in files:
            if bar is not None:
                bar.set_postfix_str(f.name)
            written.append(convert_torch_file(f, out / (f.stem + ".safetensors")))
            if bar is not None:
                bar.update()
    finally:
        if bar is not None:
            bar.close()
    return written


def convert_torch(src: str | Path, out: str | Path, *, progress: bool = True) -> list[Path]:
    """Convert a torch.save file or a folder of them into `out`; returns the paths written."""
    src, out = Path(src), Path(out)
    if src.is_dir():
        return convert_folder(src, out, progress=progress)
    return [convert_torch_file(src, _file_target(src, out))]
