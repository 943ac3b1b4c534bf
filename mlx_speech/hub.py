"""Where a checkpoint's files come from and what they are: a local folder or a Hugging Face repo
id resolved (configs first, then the weights its type needs), the model type detected from the
checkpoint's own config, and mlx_speech's own converted layout read.

The converted layout (written by `mlx_speech.convert`, documented there): a folder holding
`mlx_speech.json` (the manifest), the family's own config file(s) and tokenizer, and weights
already in our module names, layouts and dtypes, possibly quantized. Each weights file carries
the safetensors metadata `{"format": "mlx_speech", "version": "1"}`; a file with it is loaded
as it is: no renaming, no weight-norm folding, no transposes, no casts. The families ask
`is_converted(files)` where they would otherwise remap.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

from .errors import CheckpointError

# the configs read before any weights (processor_config.json: where transformers keeps e.g.
# Nemotron 3.5's languages, which a front door checks before the download)
CONFIG_FILES = ["config.json", "params.json", "mlx_speech.json", "processor_config.json"]


def read_json(path: Path) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise CheckpointError(f"cannot read {path}: {e}") from None


# -- mlx_speech's converted layout ------------------------------------------------------------
MANIFEST = "mlx_speech.json"
FORMAT = "mlx_speech"
VERSION = 1


def file_metadata(path: str | Path) -> dict:
    """The `__metadata__` of a safetensors file (reads only its header)."""
    try:
        with open(path, "rb") as f:
            raw = f.read(8)
            if len(raw) < 8:
                raise ValueError("file too short")
            (n,) = struct.unpack("<Q", raw)
            if n > 100 << 20:
                raise ValueError("header too large")
            header = json.loads(f.read(n))
    except (OSError, ValueError) as e:
        raise CheckpointError(f"cannot read weights {path}: {e}") from None
    meta = header.get("__metadata__") if isinstance(header, dict) else None
    return meta if isinstance(meta, dict) else {}


def is_converted(files: list[Path]) -> bool:
    """True when the weights are in our converted layout (all files, or none, must be)."""
    marked = []
    for f in files:
        meta = file_metadata(f)
        ours = meta.get("format") == FORMAT
        if ours and int(meta.get("version", 0)) > VERSION:
            raise CheckpointError(f"{f} was written by a newer mlx_speech (layout version "
                                  f"{meta['version']}, this one reads {VERSION}); upgrade")
        marked.append(ours)
    if any(marked) and not all(marked):
        raise CheckpointError(f"{files[marked.index(False)]} is not in the converted layout "
                              "but other weight files beside it are")
    return bool(files) and all(marked)


def read_manifest(folder: str | Path) -> dict | None:
    """The folder's `mlx_speech.json`, or None when it is not a converted folder."""
    p = Path(folder) / MANIFEST
    if not p.is_file():
        return None
    try:
        m = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise CheckpointError(f"cannot read {p}: {e}") from None
    if not isinstance(m, dict) or m.get("format") != FORMAT or "model_type" not in m:
        raise CheckpointError(f"{p} is not an mlx_speech manifest")
    if int(m.get("version", 0)) > VERSION:
        raise CheckpointError(f"{p}: layout version {m['version']} is newer than this "
                              f"mlx_speech reads ({VERSION}); upgrade")
    return m


def weight_files(folder: str | Path, part: str = "model") -> list[Path] | None:
    """The weights file of `part` named by the manifest (None: not a converted folder)."""
    m = read_manifest(folder)
    if m is None:
        return None
    name = (m.get("weights") or {}).get(part)
    if not name:
        raise CheckpointError(f"{Path(folder) / MANIFEST} names no {part!r} weights")
    f = Path(folder) / name
    if not f.is_file():
        raise CheckpointError(f"{folder} has no {name} (named in {MANIFEST})")
    return [f]


MIMI_FILE = "tokenizer-e351c8d8-checkpoint125.safetensors"  # Kyutai repos without config.json
_KYUTAI_LM_KEYS = ("moshi_name", "mimi_name", "dep_q", "text_card", "lm_gen_config")


def detect_model_type(folder: Path) -> str:
    """Explicit type from the checkpoint's own config, never from the repo name.

    Mistral `params.json` (Voxtral Realtime or Voxtral TTS), a `config.json`
    with `model_type` (transformers, mlx-community), a Kyutai `config.json`
    (LM kwargs naming the Moshi/Mimi/tokenizer files, as the `moshi` package's
    CheckpointInfo reads it), or a legacy Kyutai folder with no config at all.
    """
    manifest = read_manifest(folder)
    if manifest is not None:  # our converted layout says it
        return manifest["model_type"]
    params, cfg = folder / "params.json", folder / "config.json"
    c = read_json(cfg) if cfg.exists() else None
    p = read_json(params) if params.exists() else None
    if p is None and c is not None and "multimodal" in c and "model_type" not in c:
        p = c  # voxmlx: params.json saved as config.json (+ quantization)
    if p is not None:
        mm = p.get("multimodal", {})
        if "whisper_model_args" in mm and p.get("ada_rms_norm_t_cond"):
            return "voxtral_realtime"
        if p.get("model_type") == "voxtral_tts" or "audio_tokenizer_args" in mm:
            return "voxtral_tts"
    if c is not None:
        if any(k in c for k in _KYUTAI_LM_KEYS):
            kind = c.get("model_type", "moshi")
            if kind != "moshi":
                raise CheckpointError(
                    f"{folder}: Kyutai model type {kind!r} is not supported (only moshi)")
            return "moshi"
        if "model_type" in c:
            return c["model_type"]
    elif (folder / MIMI_FILE).exists():
        return "moshi"
    raise CheckpointError(
        f"{folder} is not a supported checkpoint (no params.json or config.json "
        "with a known model type)"
    )


def offline() -> bool:
    """HF_HUB_OFFLINE set (as huggingface_hub reads it)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def fetch_hint(repo: str) -> str:
    """What to do when a repo cannot be fetched: the next steps, in one line."""
    return (f"download it where the hub is reachable (hf download {repo}), then run with "
            "HF_HUB_OFFLINE=1; or give a local checkpoint folder instead of the repo id")


def _download(repo: str, patterns: list[str], tqdm_class=None) -> Path:
    try:
        from huggingface_hub import snapshot_download
    except ImportError:  # pragma: no cover - a core dependency
        raise CheckpointError("huggingface-hub is required to download models") from None
    try:
        kw = {} if tqdm_class is None else {"tqdm_class": tqdm_class}
        return Path(snapshot_download(repo, allow_patterns=patterns, **kw))
    except Exception as e:  # network, auth, missing repo: one clear line and the next step
        why = f"{type(e).__name__}: {e}".splitlines()[0]
        cause = e.__cause__ or e.__context__
        if cause is not None and type(cause).__name__ in ("ConnectError", "ConnectionError",
                                                           "ConnectTimeout", "ReadTimeout"):
            why = "the hub is unreachable (no network?)"
        if offline():
            why = "HF_HUB_OFFLINE is set and it is not in the local cache"
        raise CheckpointError(f"cannot fetch {repo!r} from the hub: {why}; "
                              f"{fetch_hint(repo)}") from None


def download_size(repo: str, patterns: list[str], timeout: float = 10.0) -> tuple[int, int]:
    """(bytes, files) of `repo`'s files matching `patterns` that are not in the local cache yet,
    from the hub's metadata; (0, 0) offline or when the hub does not answer."""
    if offline():
        return 0, 0
    from fnmatch import fnmatch

    try:
        from huggingface_hub import HfApi, try_to_load_from_cache

        info = HfApi().model_info(repo, files_metadata=True, timeout=timeout)
        total = files = 0
        for f in info.siblings or []:
            if not any(fnmatch(f.rfilename, p) for p in patterns):
                continue
            if isinstance(try_to_load_from_cache(repo, f.rfilename, revision=info.sha), str):
                continue
            total += f.size or 0
            files += 1
        return total, files
    except Exception:  # sizes are a courtesy: the download itself reports real failures
        return 0, 0


def human_size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit in ("B", "KB") else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"  # pragma: no cover


def resolve(path_or_repo: str | os.PathLike, weight_patterns, tqdm_class=None, check=None,
            log=None) -> Path:
    """A local folder as is, else a hub repo: configs first, then the files the
    model type needs (`weight_patterns(model_type, folder) -> list[str]`).
    `tqdm_class` goes to huggingface_hub (the app reads its byte progress).
    `check(model_type, folder)` runs on the configs (`folder` holds them) before any weights
    are downloaded (it raises to stop); `log(line)` hears how much is about to be downloaded."""
    p = Path(path_or_repo).expanduser()
    if p.exists():
        if not p.is_dir():
            raise CheckpointError(f"{p} is a file; pass the checkpoint folder")
        return p
    repo = str(path_or_repo)
    if repo.count("/") != 1 or repo.startswith((".", "/")):
        raise CheckpointError(f"no such model folder: {repo}")
    folder = _download(repo, CONFIG_FILES)
    if (folder / "mlx_speech.json").exists():  # converted: holds only what load reads
        patterns = ["*"]
    else:
        if not any((folder / f).exists() for f in CONFIG_FILES):
            if log is not None:
                size, files = download_size(repo, ["*.nemo"])
                if files:
                    log(f"downloading {human_size(size)} ({files} files) from {repo} to the "
                        "Hugging Face cache")
            nemo = sorted(_download(repo, ["*.nemo"], tqdm_class).glob("*.nemo"))
            if len(nemo) == 1:  # a NeMo release: one .nemo archive (returned as the file)
                return nemo[0]
            folder = _download(repo, CONFIG_FILES + [MIMI_FILE])  # legacy Kyutai layout
        patterns = None
    model_type = detect_model_type(folder)
    if check is not None:
        check(model_type, folder)
    if patterns is None:
        patterns = CONFIG_FILES + weight_patterns(model_type, folder)
    if log is not None:
        size, files = download_size(repo, patterns)
        if files:
            log(f"downloading {human_size(size)} ({files} files) from {repo} to the Hugging "
                "Face cache")
    return _download(repo, patterns, tqdm_class)
