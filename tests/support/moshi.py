"""Shared helpers for the Moshi / PersonaPlex tests: tiny checkpoints in Kyutai's layouts."""

from __future__ import annotations

import json
import re
import shutil
import struct
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten

GOLDEN = Path(__file__).parents[1] / "golden" / "moshi"
SILENCE_TOKENS = [948, 243, 1178, 546, 1736, 1030, 1978, 2008]
SINE_TOKENS = [430, 1268, 381, 1611, 1095, 1495, 56, 472]
DELAYS = [0, 0, 1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 1]  # a tiny Kyutai LM's 17 streams
# a stored voice's token cache for the tiny PersonaPlex (tiny_pp: card 2048, text_card 50, 4
# columns): the text stream at PAD (3), the 16 audio streams at the initial token (2048)
VOICE_CACHE = np.concatenate([np.full((1, 1, 4), 3, np.int64), np.full((1, 16, 4), 2048, np.int64)],
                             axis=1)


def speech(n: int, sr: int = 24000, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(n) / sr
    return (0.3 * np.sin(2 * np.pi * 220 * t) + 0.05 * rng.standard_normal(n)).astype(np.float32)


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def write_spm(path: Path, words: list[str], size: int) -> None:
    """A SentencePiece ModelProto with `size` pieces: <unk>, <s>, </s>, <pad>, then words."""
    pieces = [("<unk>", 0.0, 2), ("<s>", 0.0, 3), ("</s>", 0.0, 3), ("<pad>", 0.0, 3)]
    pieces += [(w, -1.0 - i, 1) for i, w in enumerate(words)]
    pieces += [(f"\u2581x{i}", -50.0 - i, 1) for i in range(size - len(pieces))]
    buf = bytearray()
    for p, s, t in pieces[:size]:
        b = p.encode()
        msg = b"\x0a" + _varint(len(b)) + b + b"\x15" + struct.pack("<f", s) + b"\x18" + _varint(t)
        buf += b"\x0a" + _varint(len(msg)) + msg
    path.write_bytes(bytes(buf))


def kyutai_weights(lm) -> dict[str, np.ndarray]:
    """An MLX LM's parameters under the released checkpoint names (fused attention)."""
    out, groups = {}, {}
    for k, v in tree_flatten(lm.parameters()):
        m = re.match(r"(.*self_attn)\.(in_projs|out_projs)\.(\d+)\.weight$", k)
        if m:
            groups.setdefault((m.group(1), m.group(2)), {})[int(m.group(3))] = v
        else:
            out[k] = np.array(v)
    for (pre, kind), d in groups.items():
        name = ".in_proj_weight" if kind == "in_projs" else ".out_proj.weight"
        out[pre + name] = np.concatenate([np.array(d[i]) for i in sorted(d)], 0)
    return out


def _mimi_with_bins(src: str, bins: int, dest_weights: Path, dest_config: Path) -> None:
    """The golden Mimi with `bins` codes per codebook (extra codewords drawn like the first)."""
    from safetensors.numpy import load_file, save_file

    w = load_file(str(GOLDEN / f"{src}.safetensors"))
    rng = np.random.default_rng(0)
    for k in list(w):
        if k.endswith("embedding_sum"):
            e = w[k]
            extra = rng.standard_normal((bins - e.shape[0], e.shape[1])).astype(np.float32)
            w[k] = np.concatenate([e, extra * e.std()], 0)
        elif k.endswith("cluster_usage"):
            u = w[k]
            w[k] = np.concatenate([u, np.ones(bins - u.shape[0], np.float32)])
    save_file(w, str(dest_weights))
    cfg = json.loads((GOLDEN / f"{src}_config.json").read_text())
    cfg["quantizer"]["bins"] = bins
    dest_config.write_text(json.dumps(cfg))


def write_folder(dest: Path, lm_kwargs: dict, lm_weights: Path | dict, *, mimi: str = "mimi24k",
                 names: dict | None = None, config: bool = True) -> Path:
    """A Kyutai hub-layout folder: config.json naming the LM, Mimi and tokenizer files; the
    Mimi codebooks are grown to the LM's `card`."""
    from safetensors.numpy import save_file

    names = {"moshi_name": "lm.safetensors", "mimi_name": "codec.safetensors",
             "tokenizer_name": "tok.model", "mimi_config_name": "codec.json", **(names or {})}
    dest.mkdir(parents=True, exist_ok=True)
    if isinstance(lm_weights, dict):
        save_file(lm_weights, str(dest / names["moshi_name"]))
    else:
        shutil.copy(lm_weights, dest / names["moshi_name"])
    _mimi_with_bins(mimi, lm_kwargs["card"], dest / names["mimi_name"],
                    dest / names["mimi_config_name"])
    write_spm(dest / names["tokenizer_name"], ["\u2581hello", "\u2581world", "!"],
              lm_kwargs["text_card"])
    if config:
        (dest / "config.json").write_text(json.dumps({**lm_kwargs, **names}))
    return dest


def random_lm_kwargs(**over) -> dict:
    kw = json.loads((GOLDEN / "tiny_lm_config.json").read_text())
    kw.update(over)
    return kw


def build_random_lm(kw: dict, seed: int = 0):
    from mlx_speech.models.moshi import LM, LmConfig

    mx.random.seed(seed)
    lm = LM(LmConfig.from_dict(dict(kw)))
    params = tree_flatten(lm.parameters())
    rng = np.random.default_rng(seed)
    new = [(k, mx.array(rng.standard_normal(v.shape).astype(np.float32)
                        / max(1.0, v.shape[-1] ** 0.5))) for k, v in params]
    lm.load_weights(new)
    return lm


def tiny_kyutai_moshi(dest: Path, **over) -> Path:
    """A tiny random Moshi folder in Kyutai's layout (card 64, 16 codebooks, depformer 8;
    `over`: other LM settings, e.g. a `context` a test crosses)."""
    kw = random_lm_kwargs(card=64, n_q=16, dep_q=8, delays=DELAYS, **over)
    return write_folder(dest, kw, kyutai_weights(build_random_lm(kw)))


def spy_inputs(gen) -> list:
    """Records the token column each main-transformer step of an LMGen `gen` sees (on the
    host, so compiled steps are seen too)."""
    seen, real = [], gen._forward

    def forward(x):
        seen.append(x)
        return real(x)

    gen._forward = forward
    return seen
