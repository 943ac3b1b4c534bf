"""Any checkpoint `mlx_speech.load` reads -> our converted layout (see the package docstring).

The model is loaded by its family's own loader (remap, weight-norm folding, dtype, quantization
all happen there, once), then its parameters are written as they are, one tensor at a time,
into a temporary sibling folder that is renamed to OUT only when everything is written.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from collections import Counter
from dataclasses import asdict
from pathlib import Path

from mlx_speech.errors import MlxSpeechError
from mlx_speech.hub import FORMAT, MANIFEST, VERSION

from .torchfiles import TORCH_SUFFIXES, save_safetensors, torch_tensors

WEIGHTS_METADATA = {"format": FORMAT, "version": str(VERSION)}
DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


class _Plan:
    """What one converted folder holds: weight parts and other files."""

    def __init__(self):
        self.parts: dict[str, tuple[str, object]] = {}  # part -> (file name, nn.Module)
        self.files: dict[str, Path | bytes | dict] = {}  # relative name -> source, bytes, json
        self.voices: dict[str, Path] = {}  # relative name (.safetensors) -> torch.save file


def _dtype_name(d) -> str:
    return str(d).rsplit(".", 1)[-1]


def _copy_voices(plan: _Plan, files: dict[str, Path], subdir: str) -> None:
    for name, p in sorted(files.items()):
        if p.suffix.lower() in TORCH_SUFFIXES:
            plan.voices[f"{subdir}/{name}.safetensors"] = p  # no torch reader at load time
        else:
            plan.files[f"{subdir}/{p.name}"] = p


def _plan_voxtral(plan: _Plan, folder: Path, loaded) -> None:
    cfg = "params.json" if (folder / "params.json").exists() else "config.json"
    plan.files[cfg] = folder / cfg  # the family's own config, read as the source's
    plan.files["tekken.json"] = folder / "tekken.json"
    plan.parts["model"] = ("model.safetensors", loaded.model)
    voices = folder / "voice_embedding"
    if voices.is_dir():  # Voxtral TTS preset voices
        found = {p.stem: p for p in sorted(voices.iterdir())
                 if p.is_file() and p.suffix in (".pt", ".safetensors")}
        _copy_voices(plan, found, "voice_embedding")


def _plan_nemotron(plan: _Plan, src: Path, loaded) -> None:
    from mlx_speech.models.nemotron_streaming import folder_config
    from mlx_speech.models.nemotron_streaming.weights import nemo_config_json

    if src.is_file():  # .nemo: the transformers config and the SentencePiece model inside
        from mlx_speech.models.nemotron_streaming.weights import read_nemo

        nemo_config, _, tok = read_nemo(src, weights=False)
        plan.files["config.json"] = nemo_config_json(nemo_config)  # Nemotron 3.5: + languages
        plan.files["tokenizer.model"] = tok
    else:  # Nemotron 3.5's languages join config.json; mlx-audio's config becomes ours
        from mlx_speech.hub import read_json

        config = folder_config(src)
        same = config == read_json(src / "config.json")
        plan.files["config.json"] = src / "config.json" if same else config
        for name in ("tokenizer.json", "tokenizer.model"):
            if (src / name).exists():
                plan.files[name] = src / name
    plan.parts["model"] = ("model.safetensors", loaded.model)


def _plan_moshi(plan: _Plan, folder: Path, loaded) -> None:
    from mlx_speech.hub import read_json
    from mlx_speech.models.moshi import CheckpointFiles
    from mlx_speech.models.moshi.config import PERSONAPLEX_MLX_FILES
    from mlx_speech.models.moshi.personaplex import list_voices, voice_dir

    cfg = folder / "config.json"
    raw = read_json(cfg) if cfg.exists() else None
    if raw is not None and raw.get("model_type") == "personaplex":  # community MLX layout
        src = CheckpointFiles(tokenizer_name=PERSONAPLEX_MLX_FILES["tokenizer"])
    else:
        src = CheckpointFiles.from_config(raw)
    lm = {k: v for k, v in asdict(loaded.config).items() if k != "extra"}
    config = {**lm, "model_type": "moshi", "moshi_name": "model.safetensors",
              "mimi_name": "mimi.safetensors", "tokenizer_name": src.tokenizer_name}
    if src.lm_gen:
        config["lm_gen_config"] = src.lm_gen
    if src.mimi_config_name:
        config["mimi_config_name"] = src.mimi_config_name
        plan.files[src.mimi_config_name] = folder / src.mimi_config_name
    plan.files["config.json"] = config
    plan.files[src.tokenizer_name] = folder / src.tokenizer_name
    plan.parts["lm"] = ("model.safetensors", loaded.lm)
    plan.parts["mimi"] = ("mimi.safetensors", loaded.mimi)
    if loaded.config.personaplex:
        _copy_voices(plan, list_voices(voice_dir(folder)), "voices")


def _plan_sortformer(plan: _Plan, src: Path, loaded) -> None:
    plan.files["config.json"] = loaded.config.to_mlx_audio()  # mlx-audio's form, which we read
    plan.parts["model"] = ("model.safetensors", loaded.model)


def _plan_vad(plan: _Plan, folder: Path, loaded) -> None:
    plan.files["config.json"] = {"model_type": "silero_vad"}
    plan.parts["model"] = ("model.safetensors", loaded)


PLANS = {"voxtral_realtime": _plan_voxtral, "voxtral_tts": _plan_voxtral,
         "nemotron_asr_streaming": _plan_nemotron, "nemotron3_5_asr": _plan_nemotron,
         "nemotron_asr": _plan_nemotron,  # mlx-audio's layout, written as ours
         "moshi": _plan_moshi,
         "personaplex": _plan_moshi,  # the community PersonaPlex MLX layout -> moshi
         "silero_vad": _plan_vad, "sortformer": _plan_sortformer}


def _quant_summary(module) -> tuple[dict | None, dict]:
    """(the most common quantization, modules quantized differently) of a loaded model."""
    import mlx.nn as nn
    from mlx.utils import tree_flatten

    from mlx_speech.nn.quant import is_quantized

    leaves = tree_flatten(module.leaf_modules(), is_leaf=nn.Module.is_module)
    found = {p: {"bits": m.bits, "group_size": m.group_size, "mode": m.mode}
             for p, m in leaves if is_quantized(m)}
    if not found:
        return None, {}
    key = lambda q: json.dumps(q, sort_keys=True)  # noqa: E731
    common = Counter(key(q) for q in found.values()).most_common(1)[0][0]
    return json.loads(common), {p: q for p, q in sorted(found.items()) if key(q) != common}


def _float_dtype(weights: dict) -> str | None:
    """The float dtype holding most of the bytes (quantization scales aside)."""
    by = Counter()
    for k, v in weights.items():
        if not k.endswith((".scales", ".biases")) and v.dtype in _floats():
            by[_dtype_name(v.dtype)] += v.nbytes
    return by.most_common(1)[0][0] if by else None


def _floats():
    import mlx.core as mx

    return (mx.float16, mx.bfloat16, mx.float32)


def _check_out(out: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise MlxSpeechError(f"output {out} already exists and is not an empty folder")
    if not out.parent.is_dir():
        raise MlxSpeechError(f"folder {out.parent} does not exist")
    try:  # the hidden sibling the conversion is written into, made and removed at once
        os.rmdir(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".check", dir=out.parent))
    except OSError as e:
        raise MlxSpeechError(f"cannot write {out}: {out.parent} does not take new folders "
                             f"({e.strerror or e})") from None


def check_options(quantize: int | None, group_size: int | None, dtype: str | None) -> None:
    """One-line errors for bad options, before anything is read."""
    if group_size is not None and quantize is None:
        raise MlxSpeechError("--group-size needs --quantize")
    if quantize is not None:
        from mlx_speech.nn.quant import check_params

        check_params(quantize, 64 if group_size is None else group_size)
    if dtype is not None and dtype not in DTYPES:
        raise MlxSpeechError(f"--dtype must be one of {', '.join(DTYPES)}, not {dtype!r}")


def load_source(src: str | Path, quantize: int | None = None, group_size: int | None = None,
                dtype: str | None = None):
    """(model_type, resolved source path, the loaded model) through the families' loaders."""
    import mlx.core as mx

    from mlx_speech.hub import detect_model_type, resolve
    from mlx_speech.registry import ARCHIVES, archive_type, model_module, weight_patterns

    p = Path(src).expanduser()
    if p.is_file() and p.suffix in ARCHIVES:
        kind, path = archive_type(p), p
    else:
        from mlx_speech.cliutil import log

        path = resolve(src, weight_patterns, log=log)
        kind = archive_type(path) if path.is_file() else detect_model_type(path)
    kwargs = {}
    if dtype is not None:
        kwargs["dtype"] = getattr(mx, DTYPES[dtype])
    if quantize is not None:
        kwargs["quantize"] = quantize
        if group_size is not None:
            kwargs["group_size"] = group_size
    return kind, path, model_module(kind).load(path, **kwargs)


def convert_model(src: str | Path, out: str | Path, *, quantize: int | None = None,
                  group_size: int | None = None, dtype: str | None = None,
                  progress: bool = True) -> Path:
    """Write `src` (folder, hub id or .nemo) as a converted folder `out`; returns `out`."""
    from mlx.utils import tree_flatten

    check_options(quantize, group_size, dtype)
    out = Path(out).expanduser()
    _check_out(out)
    if progress and sys.stderr.isatty():  # reading (and quantizing) comes before the bar
        print(f"loading {src}" + (f", quantizing to {quantize} bits" if quantize else ""),
              file=sys.stderr, flush=True)
    kind, path, loaded = load_source(src, quantize, group_size, dtype)
    plan = _Plan()
    PLANS[kind](plan, path, loaded)
    kind = "moshi" if kind == "personaplex" else kind  # written in the Kyutai form
    if kind == "nemotron_asr":  # mlx-audio's Nemotron: written in the transformers form
        kind = plan.files["config.json"]["model_type"]
    weights = {part: dict(tree_flatten(m.parameters())) for part, (_, m) in plan.parts.items()}
    main = "lm" if "lm" in plan.parts else "model"
    quant, overrides = _quant_summary(plan.parts[main][1])
    manifest = {
        "format": FORMAT, "version": VERSION, "model_type": kind,
        "dtype": _float_dtype(weights[main]), "quantization": quant, "overrides": overrides,
        "weights": {part: name for part, (name, _) in sorted(plan.parts.items())},
    }
    total = sum(v.nbytes for w in weights.values() for v in w.values())
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".partial", dir=out.parent))
    except OSError as e:
        raise MlxSpeechError(f"cannot write {out}: {e.strerror or e}") from None
    try:
        from tqdm import tqdm

        with tqdm(total=total, unit="B", unit_scale=True, desc=f"converting {kind}",
                  file=sys.stderr, delay=2, leave=False, disable=not progress) as bar:
            for part, (name, _) in sorted(plan.parts.items()):
                save_safetensors(tmp / name, weights[part], WEIGHTS_METADATA, bar.update)
        for rel, what in sorted(plan.files.items()):
            dst = tmp / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(what, dict):
                dst.write_text(json.dumps(what, indent=2, sort_keys=True) + "\n")
            elif isinstance(what, bytes):
                dst.write_bytes(what)
            else:
                shutil.copyfile(what, dst)
        for rel, pt in sorted(plan.voices.items()):
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            save_safetensors(tmp / rel, torch_tensors(pt))
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        os.chmod(tmp, 0o755)
        if out.exists():
            out.rmdir()  # empty, checked above
        os.rename(tmp, out)
    except BaseException:  # Ctrl-C included: leave nothing half-written
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out
