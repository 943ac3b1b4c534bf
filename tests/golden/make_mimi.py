"""A second Mimi golden from Kyutai's PyTorch moshi 0.2.13, closer to the real codec.

    NO_TORCH_COMPILE=1 python tests/golden/make_mimi.py

`tiny_mimi*` (the spec's fixture) has constant codes. This one uses the released topology at
24 kHz (ratios [8, 6, 5, 4], frame 1920, downsample x2) with tiny widths, a file holding 12
codebooks of which 8 are used, batch 2, and codebooks seeded from the model's own latents
(k-means style) so the codes vary over time. Context 4 (< 2 x 8 steps) makes the ring wrap.
Writes tests/golden/moshi/mimi24k.safetensors, mimi24k_config.json, mimi24k_ref.npz.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

os.environ.setdefault("NO_TORCH_COMPILE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from make_moshi_transformer import checkpoint_names  # noqa: E402
from moshi.models.compression import MimiModel  # noqa: E402
from moshi.modules import SEANetDecoder, SEANetEncoder, transformer  # noqa: E402
from moshi.quantization import SplitResidualVectorQuantizer  # noqa: E402
from safetensors.numpy import save_file  # noqa: E402

OUT = Path(__file__).parent / "moshi"
SR, FR, N_USED, FRAMES = 24000, 12.5, 8, 8
SEANET = dict(channels=1, dimension=16, causal=True, n_filters=4, n_residual_layers=1,
              activation="ELU", compress=2, dilation_base=2, disable_norm_outer_blocks=0,
              kernel_size=7, residual_kernel_size=3, last_kernel_size=3, norm="none",
              pad_mode="constant", ratios=[8, 6, 5, 4], true_skip=True)
TR = dict(d_model=16, num_heads=2, num_layers=2, causal=True, layer_scale=0.01, context=4,
          conv_layout=True, max_period=10000, gating="none", norm="layer_norm",
          positional_embedding="rope", dim_feedforward=32, input_dimension=16,
          output_dimensions=[16])
Q = dict(dimension=8, n_q=12, bins=64, input_dimension=16, output_dimension=16)


def seed_codebooks(mimi, x):
    """Codewords drawn from the latents each level actually sees (+ noise)."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        emb = mimi._encode_to_unquantized_latent(x)
        for rvq in (mimi.quantizer.rvq_first, mimi.quantizer.rvq_rest):
            r = rvq.input_proj(emb).transpose(1, 2).reshape(-1, Q["dimension"])
            for layer in rvq.vq.layers:
                cb = layer._codebook
                pick = r[torch.randint(0, r.shape[0], (Q["bins"],), generator=g)]
                scale = r.std() * 0.3
                words = pick + scale * torch.randn(pick.shape, generator=g)
                usage = torch.rand(Q["bins"], generator=g) + 0.5
                cb.embedding_sum.copy_(words * usage[:, None])
                cb.cluster_usage.copy_(usage)
                cb._initialized.fill_(1.0)
                cb._embedding = None
                r = r - cb.decode(cb.encode(r))


def main():
    torch.manual_seed(0)
    enc, dec = SEANetEncoder(**SEANET), SEANetDecoder(**SEANET)
    mimi = MimiModel(enc, dec, SplitResidualVectorQuantizer(**Q), channels=1, sample_rate=SR,
                     frame_rate=FR, encoder_frame_rate=SR / enc.hop_length, causal=True,
                     resample_method="conv",
                     encoder_transformer=transformer.ProjectedTransformer(**TR),
                     decoder_transformer=transformer.ProjectedTransformer(**TR)).eval()
    F = mimi.frame_size
    t = torch.arange(F * FRAMES) / SR
    tone = 0.3 * torch.sin(2 * torch.pi * (220 + 300 * t) * t)
    x = torch.stack([tone + 0.02 * torch.randn_like(tone), 0.1 * torch.randn_like(tone)])[:, None]
    with torch.no_grad():
        for p in mimi.parameters():
            p.add_(0.05 * torch.randn_like(p))
        seed_codebooks(mimi, x)
    mimi.set_num_codebooks(N_USED)
    with torch.no_grad():
        codes_b = mimi.encode(x)
        pcm_b = mimi.decode(codes_b)
        cs, ps = [], []
        with mimi.streaming(2):
            for i in range(FRAMES):
                c = mimi.encode(x[..., F * i:F * (i + 1)])
                cs.append(c)
                ps.append(mimi.decode(c))
    sd = {k: v for k, v in checkpoint_names(mimi.state_dict()).items()
          if not k.endswith("._embedding")}
    OUT.mkdir(parents=True, exist_ok=True)
    save_file(sd, str(OUT / "mimi24k.safetensors"))
    (OUT / "mimi24k_config.json").write_text(json.dumps(
        dict(sample_rate=SR, frame_rate=FR, seanet=SEANET, transformer=TR, quantizer=Q), indent=1))
    np.savez(OUT / "mimi24k_ref.npz", x=x.numpy(), codes_batch=codes_b.numpy(),
             pcm_batch=pcm_b.numpy(), codes_stream=torch.cat(cs, -1).numpy(),
             pcm_stream=torch.cat(ps, -1).numpy())
    print("distinct codes per level:", [len(set(r.tolist())) for r in codes_b[0]],
          "stream==batch:", bool((torch.cat(cs, -1) == codes_b).all()),
          "pcm stream-batch:", float((torch.cat(ps, -1) - pcm_b).abs().max()))


if __name__ == "__main__":
    main()
