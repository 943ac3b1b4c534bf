"""Write the quantized Moshi goldens with moshi_mlx (run once, commit).

A tiny moshi_mlx `Lm` (from Kyutai LM kwargs with `LmConfig.from_config_dict`, widths 64 so
every layer quantizes, gated hidden 128) with random weights is saved the way Kyutai's MLX
releases are made: `save_weights("model.safetensors")` (the -bf16 layout; float32 here so the
comparison is not lost in rounding), then `nn.quantize(bits=4, group_size=32)` /
`(bits=8, group_size=64)` on the whole LM + `save_weights("model.q4/.q8.safetensors")`.

Each file is then loaded as moshi_mlx's `local.py` does (`nn.quantize` then
`load_weights(strict=True)`) and stepped over fixed input tokens with greedy samplers
(`Lm._sample`); the text logits and greedy text / depformer tokens go to golden.npz. Input
tokens are all >= 0: moshi_mlx's quantized embeddings lose its "-1 is a zero vector" rule.

    pip install moshi_mlx==0.3.0 --no-deps
    python tests/golden/make_quantized_moshi.py [OUT]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten, tree_map_with_path
from moshi_mlx.models.lm import Lm, LmConfig
from moshi_mlx.utils.sampling import Sampler

KWARGS = {
    "dim": 64, "text_card": 50, "existing_text_padding_id": 3, "n_q": 4, "dep_q": 2,
    "card": 64, "num_heads": 4, "num_layers": 2, "hidden_scale": 4.125, "causal": True,
    "layer_scale": None, "context": 10, "max_period": 10000, "gating": "silu",
    "norm": "rms_norm_f32", "positional_embedding": "rope", "depformer_dim": 64,
    "depformer_dim_feedforward": 192, "depformer_num_heads": 4, "depformer_num_layers": 1,
    "depformer_layer_scale": None, "depformer_multi_linear": True, "depformer_context": 2,
    "depformer_max_period": 10000, "depformer_gating": "silu", "depformer_pos_emb": "none",
    "depformer_weights_per_step": True, "delays": [0, 0, 1, 0, 1],
}
STEPS, SEED = 8, 5
VARIANTS = {"model.safetensors": None, "model.q4.safetensors": (4, 32),
            "model.q8.safetensors": (8, 64)}


def mlx_config() -> LmConfig:
    cfg = LmConfig.from_config_dict(dict(KWARGS))
    cfg.transformer.dim_feedforward = 192  # gated hidden 128 (divisible by 64)
    return cfg


def random_lm() -> Lm:
    mx.random.seed(SEED)
    lm = Lm(mlx_config())
    rng = np.random.default_rng(SEED)

    def draw(path, v):
        x = rng.standard_normal(v.shape).astype(np.float32)
        if v.ndim == 1:  # norms: around 1, so a dropped or misplaced norm shows
            return mx.array(1.0 + 0.2 * x)
        return mx.array(x / np.sqrt(v.shape[-1]))

    lm.update(tree_map_with_path(draw, lm.parameters()))
    # the depformer's norms are shared by its steps: every slice holds copies (as in
    # Kyutai's files, made by moshi_mlx's load_pytorch_weights)
    first = lm.depformer.slices[0].transformer.layers
    for s in lm.depformer.slices[1:]:
        for a, b in zip(s.transformer.layers, first, strict=True):
            a.norm1.weight, a.norm2.weight = b.norm1.weight, b.norm2.weight
    mx.eval(lm.parameters())
    return lm


def run(file: Path, bits_group, text, audio) -> dict[str, np.ndarray]:
    lm = Lm(mlx_config())
    if bits_group is not None:
        nn.quantize(lm, bits=bits_group[0], group_size=bits_group[1])
    lm.load_weights(str(file), strict=True)
    greedy = Sampler(temp=0.0)
    logits, text_out, audio_out = [], [], []
    for t in range(STEPS):
        tt, at, z = lm._sample(mx.array([[text[t]]]), [mx.array([[a[t]]]) for a in audio],
                               greedy, greedy)
        logits.append(np.array(lm.text_linear(z)[0, -1]))
        text_out.append(int(tt.item()))
        audio_out.append(np.array(at).reshape(-1))
    return {"text_logits": np.stack(logits), "text_tokens": np.array(text_out),
            "audio_tokens": np.stack(audio_out)}


def main() -> None:
    out = (Path(sys.argv[1]) if len(sys.argv) > 1
           else Path(__file__).parent / "quantized" / "moshi")
    out.mkdir(parents=True, exist_ok=True)
    lm = random_lm()
    lm.save_weights(str(out / "model.safetensors"))
    for name, bg in VARIANTS.items():
        if bg is not None:  # Kyutai's scripts/quantize_mlx.py: load, nn.quantize, save
            q = Lm(mlx_config())
            q.load_weights(str(out / "model.safetensors"), strict=True)
            nn.quantize(q, bits=bg[0], group_size=bg[1])
            q.save_weights(str(out / name))
    (out / "lm_config.json").write_text(json.dumps(KWARGS, indent=1))
    rng = np.random.default_rng(SEED + 1)
    text = rng.integers(0, KWARGS["text_card"], STEPS).tolist()
    audio = rng.integers(0, KWARGS["card"], (KWARGS["n_q"], STEPS)).tolist()
    gold = {"text_in": np.array(text), "audio_in": np.array(audio)}
    for name, bg in VARIANTS.items():
        r = run(out / name, bg, text, audio)
        gold |= {f"{name}/{k}": v for k, v in r.items()}
        print(name, r["text_tokens"].tolist(), r["audio_tokens"].tolist())
    np.savez_compressed(out / "golden.npz", **gold)
    print({k: v.shape for k, v in tree_flatten(lm.parameters())}.__len__(), "tensors")


if __name__ == "__main__":
    main()
