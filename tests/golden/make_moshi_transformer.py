"""Goldens for mlx_speech.nn.moshi_transformer from Kyutai's PyTorch moshi 0.2.13.

    NO_TORCH_COMPILE=1 python tests/golden/make_moshi_transformer.py

Builds tiny `StreamingTransformer`s with perturbed random weights and writes, per case, one
`tests/golden/moshi/transformer_<case>.npz` holding the config (json), the weights under
checkpoint names (fused `in_proj_weight` / `out_proj.weight`, prefix `w.`), the input and the
PyTorch outputs: offline, streaming in chunks of 1 and 2 (context < T, so the ring wraps), and
for the per-step case one streamed frame per fresh state.
"""

from __future__ import annotations

import collections
import json
import os
import re
from pathlib import Path

os.environ.setdefault("NO_TORCH_COMPILE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from moshi.modules.transformer import StreamingTransformer  # noqa: E402

OUT = Path(__file__).parent / "moshi"

CASES = {
    # Mimi's flavour: LayerNorm, exact GELU, layer scale.
    "mimi": dict(d_model=16, num_heads=2, num_layers=2, dim_feedforward=32, causal=True,
                 context=4, norm="layer_norm", gating="none", layer_scale=0.01,
                 positional_embedding="rope", max_period=10000.0),
    # The LM's flavour: fp32 RMSNorm, SiLU gating (4.125 * d), no layer scale.
    "lm": dict(d_model=32, num_heads=2, num_layers=2, dim_feedforward=132, causal=True,
               context=5, norm="rms_norm_f32", gating="silu", layer_scale=None,
               positional_embedding="rope", max_period=10000.0),
    # Plain RMSNorm (eps 1e-5) + gating + layer scale, long period.
    "rms": dict(d_model=16, num_heads=4, num_layers=1, dim_feedforward=64, causal=True,
                context=3, norm="rms_norm", gating="silu", layer_scale=0.1,
                positional_embedding="rope", max_period=500.0),
    # The depformer's flavour: per-step weights, no positions, no window.
    "dep": dict(d_model=16, num_heads=2, num_layers=2, dim_feedforward=66, causal=True,
                context=None, norm="rms_norm_f32", gating="silu", layer_scale=None,
                positional_embedding="none", max_period=10000.0, weights_per_step=3),
}
T = 12


def checkpoint_names(sd: dict) -> dict:
    ck, groups = {}, collections.defaultdict(dict)
    for k, v in sd.items():
        m = re.match(r"(.*self_attn)\.(in_projs|out_projs)\.(\d+)\.weight$", k)
        if m:
            groups[(m.group(1), m.group(2))][int(m.group(3))] = v
        else:
            ck[k] = v
    for (pre, kind), d in groups.items():
        name = ".in_proj_weight" if kind == "in_projs" else ".out_proj.weight"
        ck[pre + name] = torch.cat([d[i] for i in sorted(d)], 0)
    return {k: v.detach().numpy().copy() for k, v in ck.items()}


def stream(tr, x, chunk):
    outs = []
    with torch.no_grad(), tr.streaming(x.shape[0]):
        for i in range(0, x.shape[1], chunk):
            outs.append(tr(x[:, i:i + chunk]))
    return torch.cat(outs, 1).numpy()


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    for seed, (name, kw) in enumerate(CASES.items()):
        torch.manual_seed(seed)
        tr = StreamingTransformer(**kw).eval()
        with torch.no_grad():
            for p in tr.parameters():
                p.add_(0.2 * torch.randn_like(p))
        batch = 2 if name == "lm" else 1
        res = {}
        if kw.get("weights_per_step"):
            n = kw["weights_per_step"]
            x = torch.randn(batch, 2 * n, kw["d_model"])
            with torch.no_grad():
                res["offline"] = torch.cat([tr(x[:, :n]), tr(x[:, n:])], 1).numpy()
            # one fresh stream per frame of n sub-steps, as the depformer runs
            res["stream1"] = np.concatenate([stream(tr, x[:, :n], 1), stream(tr, x[:, n:], 1)], 1)
        else:
            x = torch.randn(batch, T, kw["d_model"])
            with torch.no_grad():
                res["offline"] = tr(x).numpy()
            res["stream1"] = stream(tr, x, 1)
            res["stream2"] = stream(tr, x, 2)
        w = {f"w.{k}": v for k, v in checkpoint_names(tr.state_dict()).items()}
        np.savez(OUT / f"transformer_{name}.npz", config=np.array(json.dumps(kw)),
                 x=x.numpy(), **res, **w)
        print(name, {k: v.shape for k, v in res.items()})


if __name__ == "__main__":
    main()
