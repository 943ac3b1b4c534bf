"""The published quantized layouts as test folders (committed goldens under
tests/golden/quantized/, and a PersonaPlex community-layout writer): shared by
tests/models/test_quantized.py and tests/convert/test_convert_model.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np

from tests.support.tekken import VOXTRAL_AUDIO, write_tekken

Q = Path(__file__).parents[1] / "golden" / "quantized"
VR = Q / "voxtral_realtime"


def vr_folder(tmp_path: Path, name: str) -> Path:
    dest = tmp_path / name
    shutil.copytree(VR / name, dest)
    write_tekken(dest / "tekken.json", [], vocab_size=1100, audio=VOXTRAL_AUDIO)
    return dest


MOSHI = Q / "moshi"


def moshi_folder(tmp_path: Path, name: str) -> Path:
    from tests.support.moshi import write_folder

    kw = json.loads((MOSHI / "lm_config.json").read_text())
    return write_folder(tmp_path / name, kw, MOSHI / name, names={"moshi_name": name})


TTS = Q / "voxtral_tts"
TTS_CKPT = Path(__file__).parents[1] / "golden" / "voxtral_tts" / "ckpt"


def tts_folder(tmp_path: Path, name: str) -> Path:
    d = tmp_path / name
    shutil.copytree(TTS / name, d)
    shutil.copytree(TTS_CKPT / "voice_embedding", d / "voice_embedding")
    shutil.copy(TTS_CKPT / "tekken.json", d)
    return d


NEMO = Q / "nemotron"


PP_KW = dict(dim=64, num_heads=4, num_layers=1, n_q=16, dep_q=16, card=64, context=40,
             depformer_dim=64, depformer_num_heads=4, depformer_num_layers=1,
             depformer_dim_feedforward=192, delays=[0, 0] + [1] * 7 + [0] + [1] * 7)
_PP_LINEARS = {"in_proj", "out_proj", "linear_in", "linear_out"}


def pp_quantize(w: np.ndarray, bits: int, group: int):
    rows, cols = w.shape
    g = w.astype(np.float32).reshape(rows, cols // group, group)
    lo, hi = g.min(-1), g.max(-1)
    n = 2**bits - 1
    scales = np.maximum((hi - lo) / n, 1e-10).astype(np.float16)
    biases = lo.astype(np.float16)
    s32, b32 = scales.astype(np.float32)[..., None], biases.astype(np.float32)[..., None]
    q = np.clip(np.round((g - b32) / s32), 0, n).astype(np.uint32)
    deq = (q * s32 + b32).reshape(rows, cols).astype(np.float16)
    q = q.reshape(rows, cols)
    per = 32 // bits
    packed = np.zeros((rows, cols // per), np.uint32)
    for i in range(per):
        packed |= q[:, i::per] << np.uint32(bits * i)
    return packed, scales, biases, deq


def write_personaplex_mlx(dest: Path, kyutai: dict, bits: int, group: int,
                          first_version: bool = False):
    """(folder, the dequantized weights under Kyutai names) for a Kyutai-named weight dict.
    `first_version`: the converter's first release (temporal part only; the fused
    `in_proj_weight` is left as it is, its name not ending in `.weight`)."""
    from safetensors.numpy import save_file

    from tests.support.moshi import random_lm_kwargs, write_folder

    parts: dict[str, dict] = {"temporal": {}, "depformer": {}, "embeddings": {}}
    deq = {}
    for key, w in kyutai.items():
        if key.startswith(("transformer.", "out_norm.")):
            part, name = "temporal", key.removeprefix("transformer.")
        elif key.startswith(("depformer.", "depformer_in.")):
            part, name = "depformer", key.removeprefix("depformer.")
        else:
            part, name = "embeddings", key
        w16 = w.astype(np.float16)
        layer = name.rsplit(".", 2)[-2] if name.endswith(".weight") else ""
        flat = name.endswith(".in_proj_weight")
        parts_q = ("temporal",) if first_version else ("temporal", "depformer")
        if (part in parts_q and w.ndim == 2 and w.shape[1] % group == 0
                and ((flat and not first_version) or layer in _PP_LINEARS)):
            packed, scales, biases, d = pp_quantize(w, bits, group)
            stem = name[: -len("weight")] if flat else name[: -len(".weight")] + "."
            parts[part] |= {stem + "weight": packed, stem + "scales": scales,
                            stem + "biases": biases}
            deq[key] = d
        else:
            parts[part][name] = w16
            deq[key] = w16
    kw = random_lm_kwargs(**PP_KW)
    ref = write_folder(dest.parent / (dest.name + "_ref"), kw, deq)
    dest.mkdir(parents=True)
    for part, tensors in parts.items():
        save_file(tensors, str(dest / f"{part}.safetensors"))
    shutil.copy(ref / "codec.safetensors", dest / "mimi.safetensors")
    shutil.copy(ref / "tok.model", dest / "tokenizer_spm_32k_3.model")
    (dest / "voices").mkdir()
    config = {
        "model_type": "personaplex", "version": "personaplex-7b-v1",
        "temporal": {"dim": 64, "num_layers": 1, "num_heads": 4, "hidden_scale": 4.125,
                     "n_q": 8, "card": 64, "text_card": 50, "context": 40, "max_period": 10000},
        "depformer": {"dim": 64, "num_layers": 1, "num_heads": 4, "dim_feedforward": 192,
                      "num_steps": 16, "card": 64, "text_card": 50, "context": 8,
                      "weights_per_step": True, "multi_linear": True},
        "delays": PP_KW["delays"],
        "quantization": {"bits": bits, "group_size": group,
                         "quantized_components": ["temporal"] + ["depformer"] * (
                             not first_version)},
        "voices": [],
    }
    (dest / "config.json").write_text(json.dumps(config))
    return dest, ref
