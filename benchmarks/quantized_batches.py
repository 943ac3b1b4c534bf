"""Quantized Linears at batch sizes: mx.quantized_matmul vs dequantize + dense GEMM vs bf16.

    python benchmarks/quantized_batches.py [--shape 4096x1024] [--rows 1,8,32,128]
        [--reps 5] [--dtype bfloat16|float16|float32]

One Linear of the given (out x in) shape, quantized 4-bit and 8-bit (affine, group 64), fed
`rows` rows (streams x positions) of `dtype` activations on the default device. Prints ms (min
of `reps`: least disturbed by a shared machine) and ratios to the dense layer, numbers only:

* dense: the full-precision weight (the bf16 baseline);
* qmm: `mx.quantized_matmul` (mlx's QuantizedLinear);
* deq: dequantize, then the dense GEMM (our QuantizedLinear above its row threshold);
* ours: `mlx_speech.nn.quant.QuantizedLinear` with this backend's `DENSE_FROM_ROWS` default.

The target (issue 21): quantized no slower than dense at any batch size.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from batched_asr_profile import best_ms  # noqa: E402

from mlx_speech.nn import quant  # noqa: E402


def main() -> None:
    os.environ.setdefault("MLX_ENABLE_TF32", "0")  # full float32 on CUDA / new Macs
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="4096x1024")
    ap.add_argument("--rows", default="1,8,32,128")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default="bfloat16")
    args = ap.parse_args()
    out_dim, in_dim = (int(v) for v in args.shape.split("x"))
    dt = getattr(mx, args.dtype)
    be = quant.backend()
    print(f"# mlx {mx.__version__} backend {be} ({mx.default_device()}), {args.dtype} "
          f"activations, Linear {in_dim} -> {out_dim}, affine group 64; DENSE_FROM_ROWS "
          f"{quant.DENSE_FROM_ROWS[be]}")
    print("bits  rows   dense_ms     qmm_ms     deq_ms    ours_ms  qmm/dense  deq/dense  "
          "ours/dense")
    mx.random.seed(0)
    dense = nn.Linear(in_dim, out_dim)
    dense.set_dtype(dt)
    mx.eval(dense.parameters())
    for bits in (4, 8):
        q = quant.QuantizedLinear.from_linear(dense, group_size=64, bits=bits)
        q.__class__ = quant.QuantizedLinear
        mx.eval(q.parameters())
        for rows in (int(r) for r in args.rows.split(",")):
            x = mx.random.normal((rows, in_dim)).astype(dt)
            mx.eval(x)
            t_dense = best_ms(lambda x=x: mx.eval(dense(x)), args.reps)
            t_qmm = best_ms(lambda x=x, q=q: mx.eval(nn.QuantizedLinear.__call__(q, x)), args.reps)
            saved = quant.DENSE_FROM_ROWS[be]
            quant.DENSE_FROM_ROWS[be] = 1
            t_deq = best_ms(lambda x=x, q=q: mx.eval(q(x)), args.reps)
            quant.DENSE_FROM_ROWS[be] = saved
            t_ours = best_ms(lambda x=x, q=q: mx.eval(q(x)), args.reps)
            print(f"{bits:4d} {rows:5d} {t_dense:10.2f} {t_qmm:10.2f} {t_deq:10.2f} "
                  f"{t_ours:10.2f} {t_qmm / t_dense:10.2f} {t_deq / t_dense:10.2f} "
                  f"{t_ours / t_dense:11.2f}")


if __name__ == "__main__":
    main()
