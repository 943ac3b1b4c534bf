"""Mimi streaming cost per 80 ms frame, ours vs mlx-audio's Mimi, on identical random weights.

    NO_TORCH_COMPILE=1 python benchmarks/mimi.py [--frames N] [--model FILE] [--no-peer]

Without --model, writes a full-size random Mimi (moshi 0.2.13 `get_mimi(None)`, the released
mimi_202407 config, codebooks randomised; needs torch + moshi) to a temp file in the released
checkpoint format. Both codecs load that file (ours: `mimi.load`; mlx-audio:
`Mimi.load_pytorch_weights`, 8 codebooks) and stream the same noise-plus-chirp audio, one
1920-sample frame per call: encode_step -> eval, then decode_step -> eval. Prints median / p90
ms per frame for each half after 2 warm-up frames, the ours/theirs ratio, whether the codes
agree and the largest PCM difference. mlx-audio's reset does not clear its resample convs, so
each codec gets one fresh stream.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import mlx.core as mx
import numpy as np

from mlx_speech.models import mimi

FRAME = 1920


def make_checkpoint(path: Path) -> None:
    os.environ.setdefault("NO_TORCH_COMPILE", "1")
    import torch
    from moshi.models.loaders import get_mimi
    from safetensors.torch import save_file

    torch.manual_seed(0)
    model = get_mimi(None, device="cpu")
    with torch.no_grad():
        for name, buf in model.named_buffers():
            if name.endswith("embedding_sum"):
                buf.copy_(torch.randn_like(buf))
            elif name.endswith("cluster_usage"):
                buf.copy_(torch.rand_like(buf) + 0.5)
            elif name.endswith("_initialized"):
                buf.fill_(1.0)
    sd = {}
    for k, v in model.state_dict().items():
        if k.endswith("._embedding"):
            continue
        k = k.replace("in_projs.0.weight", "in_proj_weight").replace("out_projs.0.", "out_proj.")
        sd[k] = v.contiguous()
    save_file(sd, str(path))


def audio(frames: int) -> np.ndarray:
    t = np.arange(frames * FRAME) / 24000
    noise = np.random.default_rng(0).standard_normal(t.size)
    x = 0.3 * np.sin(2 * np.pi * (200 + 100 * t) * t) + 0.02 * noise
    return x.astype(np.float32)[None, None]


def run(encode_step, decode_step, x: np.ndarray):
    enc_ms, dec_ms, codes, pcm = [], [], [], []
    for i in range(x.shape[-1] // FRAME):
        frame = mx.array(x[..., i * FRAME : (i + 1) * FRAME])
        t0 = time.perf_counter()
        c = encode_step(frame)
        mx.eval(c)
        t1 = time.perf_counter()
        p = decode_step(c)
        mx.eval(p)
        t2 = time.perf_counter()
        enc_ms.append(1e3 * (t1 - t0))
        dec_ms.append(1e3 * (t2 - t1))
        codes.append(np.array(c))
        pcm.append(np.array(p))
    return (np.array(enc_ms[2:]), np.array(dec_ms[2:]), np.concatenate(codes, -1),
            np.concatenate(pcm, -1))


def run_ours(path: Path, x: np.ndarray):
    model = mimi.load(path, num_codebooks=8)
    st = model.make_state()
    return run(lambda f: model.encode_step(f, st), lambda c: model.decode_step(c, st), x)


def fmt(ms: np.ndarray) -> str:
    return f"{np.median(ms):7.1f} / {np.percentile(ms, 90):7.1f}"


def main():
    os.environ.setdefault("MLX_ENABLE_TF32", "0")  # full float32 on CUDA / new Macs
    ap = argparse.ArgumentParser()
    ap.add_argument("--frames", type=int, default=20)
    ap.add_argument("--model", type=Path)
    ap.add_argument("--no-peer", action="store_true")
    args = ap.parse_args()
    tmp = None
    path = args.model
    if path is None:
        tmp = tempfile.TemporaryDirectory()
        path = Path(tmp.name) / "mimi.safetensors"
        make_checkpoint(path)
    x = audio(args.frames + 2)
    print(f"device {mx.default_device()}, mlx {mx.__version__}, {args.frames} frames of 80 ms")

    o_enc, o_dec, o_codes, o_pcm = run_ours(path, x)  # model freed before the peer loads
    print(f"{'':8} {'encode ms med / p90':>20} {'decode ms med / p90':>20}")
    print(f"{'ours':8} {fmt(o_enc):>20} {fmt(o_dec):>20}")
    if args.no_peer:
        return
    try:
        from mlx_audio.codec.models.mimi.mimi import Mimi, mimi_202407
    except ImportError as e:
        print(f"peer skipped: {e}")
        return
    theirs = Mimi(mimi_202407(8))
    theirs.load_pytorch_weights(str(path), strict=False)  # the file has 32 levels, 8 used
    theirs.reset_state()
    t_enc, t_dec, t_codes, t_pcm = run(theirs.encode_step, theirs.decode_step, x)
    print(f"{'mlx-audio':8} {fmt(t_enc):>20} {fmt(t_dec):>20}")
    ratio_e = np.median(o_enc) / np.median(t_enc)
    ratio_d = np.median(o_dec) / np.median(t_dec)
    print(f"{'ratio':8} {ratio_e:>20.2f} {ratio_d:>20.2f}   (ours / theirs, median)")
    same = o_codes.shape == t_codes.shape and bool((o_codes == t_codes).all())
    print(f"codes equal: {same}; max |pcm ours - theirs| = {np.abs(o_pcm - t_pcm).max():.2e} "
          "(mlx-audio: tanh GELU, no ring-buffer mask)")


if __name__ == "__main__":
    main()
