"""Host time per streaming step: what a step's Python costs, plain against compiled steps
(mlx_speech/nn/compiled.py), per family at the real depth with tiny widths.

    python benchmarks/host_time.py [--families voxtral,nemotron,sortformer,moshi]
        [--config deep|wide|full] [--steps N] [--warmup N] [--no-peer] [--dtype D]

On a GPU a stream's step costs max(host time, device time): the Python that builds the next
step's graph runs while the device works on the step before. Host time here is the wall time
of a step minus the time blocked inside `mx.eval` / `mx.async_eval` / `array.item` /
`array.tolist` / numpy conversions (the device's share, and the CPU backend's compute).
`deep` keeps each family's real layer counts with tiny widths, so the matmuls cost little and
host time shows (Voxtral Realtime: encoder 32 layers x 64, decoder 26 x 128 with GQA 4:1 and
the real 131072-token vocabulary; Nemotron: 24 conformer layers x 64; Sortformer: 17
conformer + 18 transformer layers x 32/16; Moshi: 32 temporal layers x 64 and a depformer of
6 layers x 32 over 8 codebooks); `wide` the real widths with 2 layers (each family's
`full-narrow`: nothing may get slower there); `full` the real widths and depths (a GPU's job).

`--gpu-graphs` estimates a GPU's host time on this CPU: on the CPU backend each `mx.fast`
kernel (rope, rms_norm, layer_norm, scaled_dot_product_attention) is its fallback graph of
10-30 ops, on Metal and CUDA it is one node, and a compiled step's host time is the replay of
its nodes. The flag swaps each kernel for a one-node stand-in of the same shape (both sides,
mlx-audio too; end-of-stream tokens off; each stand-in depends on what its kernel reads), so
the graphs have a GPU's node counts. The outputs
are then meaningless: only the host times count.

Per family one session per side steps one frame per tick (Voxtral: 80 ms through `feed_many`,
encoder chunk and decoder step; Nemotron: one 160 ms block, encoder and RNN-T rounds;
Sortformer: one 480 ms chunk; Moshi: one 80 ms frame, temporal step and depformer loop), the
plain side (MLX_SPEECH_COMPILE=0) and the compiled side ticking alternately in one process.
Against mlx-audio's Voxtral Realtime on the same weights (its streaming session's feed and
step per 80 ms) when `mlx_audio` imports (see /work/shared/oracles/README.md: mlx-audio 0.6.2;
e.g. `pip install --no-deps --target DIR mlx-audio==0.6.2 transformers tokenizers miniaudio`
and DIR on PYTHONPATH). Prints medians after `--warmup` ticks. Numbers only; no assertions.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import mlx.core as mx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import batched_asr as ba  # noqa: E402
import voxtral_realtime as vb  # noqa: E402
from machine import cpu_blas  # noqa: E402

VOXTRAL = {
    "deep": {"enc": dict(dim=64, n_layers=32, n_heads=4, head_dim=16, hidden_dim=256,
                         sliding_window=750),
             "dec": dict(dim=128, n_layers=26, n_heads=8, n_kv_heads=2, head_dim=16,
                         hidden_dim=512, vocab_size=131072, sliding_window=8192)},
    "wide": vb.CONFIGS["full-narrow"],
    "full": vb.CONFIGS["full"],
}


def gpu_graphs() -> None:
    """One node per `mx.fast` kernel, as on Metal / CUDA (see the module docstring): each
    stand-in is one `Depends` node with the kernel's output shape, on what the kernel reads."""

    def one(x, *reads):
        return mx.depends([x], [r for r in reads if isinstance(r, mx.array)])[0]

    fast = mx.fast
    fast.rope = lambda x, *a, offset=0, **k: one(x, offset)
    fast.rms_norm = lambda x, w, eps: one(x, w)
    fast.layer_norm = lambda x, w, b, eps: one(x, w, b)
    fast.scaled_dot_product_attention = (
        lambda q, k, v, scale, mask=None, **_: one(q, k, v, mask))
    NO_EOS[0] = True


GPU_NOTE = " | gpu graphs (mx.fast kernels as one node each; host times only)"
NO_EOS = [False]  # --gpu-graphs: random outputs must not end a stream
DTYPE = [mx.float32]  # --dtype: the weights' type (Voxtral Realtime and Sortformer)


class Blocked:
    """Seconds spent inside the calls that wait for the device (patched while installed)."""

    NAMES = ("eval", "async_eval", "synchronize")
    METHODS = ("item", "tolist", "__array__")

    def __init__(self):
        self.seconds = 0.0
        self._saved: list = []

    def _wrap(self, fn):
        def timed(*a, **k):
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                self.seconds += time.perf_counter() - t0

        return timed

    def __enter__(self) -> Blocked:
        for name in self.NAMES:
            self._saved.append((mx, name, getattr(mx, name)))
            setattr(mx, name, self._wrap(getattr(mx, name)))
        for name in self.METHODS:
            if hasattr(mx.array, name):
                self._saved.append((mx.array, name, getattr(mx.array, name)))
                setattr(mx.array, name, self._wrap(getattr(mx.array, name)))
        real_np, timed_np = np.array, self._wrap(np.array)
        self._saved.append((np, "array", real_np))
        np.array = lambda a, *r, **k: (timed_np if isinstance(a, mx.array) else real_np)(
            a, *r, **k)
        return self

    def __exit__(self, *exc) -> None:
        for owner, name, fn in reversed(self._saved):
            setattr(owner, name, fn)
        self._saved.clear()


def paired(sides: dict[str, Callable[[int], None]], steps: int, warmup: int
           ) -> dict[str, tuple[float, float]]:
    """Median (host ms, wall ms) per tick of each side, the sides ticking alternately."""
    times: dict[str, list[tuple[float, float]]] = {k: [] for k in sides}
    names = list(sides)
    with Blocked() as blocked:
        for t in range(warmup + steps):
            for name in names if t % 2 == 0 else names[::-1]:
                os.environ["MLX_SPEECH_COMPILE"] = "0" if name == "plain" else "1"
                b0, w0 = blocked.seconds, time.perf_counter()
                sides[name](t)
                mx.synchronize()  # the step's queued work done (blocked time)
                wall = time.perf_counter() - w0
                if t >= warmup:
                    times[name].append(((wall - (blocked.seconds - b0)) * 1e3, wall * 1e3))
    os.environ.pop("MLX_SPEECH_COMPILE", None)
    return {k: (statistics.median(h for h, _ in v), statistics.median(w for _, w in v))
            for k, v in times.items()}


def report(title: str, res: dict[str, tuple[float, float]], targets: str = "") -> None:
    print(f"\n{title}")
    print(f"{'':<12}{'host ms':>9}{'wall ms':>9}{'host x plain':>14}{'wall x plain':>14}")
    ph, pw = res["plain"]
    for name, (h, w) in res.items():
        print(f"{name:<12}{h:>9.2f}{w:>9.2f}{h / ph:>14.2f}{w / pw:>14.2f}")
    if "mlx-audio" in res:
        ah, aw = res["mlx-audio"]
        h, w = res["compiled"]
        print(f"compiled / mlx-audio: host {h / ah:.2f}x, wall {w / aw:.2f}x {targets}")


def feeder(owner, session, frame: int, seed: int) -> Callable[[int], None]:
    audio = ba.stream_audio(600.0, seed)

    def tick(t: int) -> None:
        owner.feed_many([(session, audio[t * frame: (t + 1) * frame])])

    return tick


# -- families -----------------------------------------------------------------------
def voxtral(config: str, steps: int, warmup: int, peer: bool) -> None:
    import mlx_speech

    enc, dec = VOXTRAL[config]["enc"], VOXTRAL[config]["dec"]
    with tempfile.TemporaryDirectory(prefix="host_time_") as tmp:
        folder = Path(tmp)
        vb.write_checkpoint(folder, enc, dec, DTYPE[0], seed=0)  # (full: a GPU's job)
        vr = mlx_speech.load(folder)
        sides = {}
        for name in ("plain", "compiled"):
            s = vr.session(vb.DELAY_MS)
            s.eos = -1  # a timed stream never ends
            sides[name] = feeder(vr, s, vb.TOKEN_SAMPLES, seed=1)
        if peer:
            model = vb.load_peer(folder)
            if NO_EOS[0]:
                model.config.eos_token_id = -1
            ps = model.create_streaming_session(transcription_delay_ms=vb.DELAY_MS,
                                                max_tokens=1 << 30)
            audio = ba.stream_audio(600.0, 1)

            def peer_tick(t: int) -> None:
                ps.feed(audio[t * vb.TOKEN_SAMPLES: (t + 1) * vb.TOKEN_SAMPLES])
                ps.step(max_decode_tokens=1 << 30)

            sides["mlx-audio"] = peer_tick
        lead = len(vb.PROMPT) + 2  # ticks until the prompt's audio is there
        res = paired(sides, steps, warmup + lead)
    report(f"Voxtral Realtime {config}: encoder {enc['n_layers']} x {enc['dim']}, decoder "
           f"{dec['n_layers']} x {dec['dim']} (GQA {dec['n_heads']}:{dec['n_kv_heads']}), "
           f"vocab {dec['vocab_size']}; one 80 ms token per tick", res,
           "(targets: host <= 0.4x, wall <= 0.85x)")


NEMOTRON = {"deep": dict(hidden_size=64, num_attention_heads=4, intermediate_size=256,
                         subsampling_conv_channels=16, layers=24, pred=64, vocab=1024)}


def nemotron(config: str, steps: int, warmup: int, peer: bool) -> None:
    import nemotron_streaming as nb

    from mlx_speech.models.nemotron_streaming import load

    name = {"deep": "host-deep", "wide": "full-narrow"}.get(config, config)
    nb.CONFIGS.setdefault("host-deep", NEMOTRON["deep"])
    with tempfile.TemporaryDirectory(prefix="host_time_") as tmp:
        nm = load(nb.write_random_checkpoint(Path(tmp) / "nm", name, None, blank_bias=4.5))
        frame = 2 * vb.TOKEN_SAMPLES  # one 160 ms block
        sides = {name: feeder(nm, nm.session(160), frame, seed=2)
                 for name in ("plain", "compiled")}
        res = paired(sides, steps, warmup)
    c = nb.CONFIGS[name]
    report(f"Nemotron {config}: {c['layers']} conformer layers x {c['hidden_size']}; one 160 ms "
           "block per tick (encoder chunk and RNN-T rounds)", res, "")
    print("target: compiled host <= 0.5x plain")


def sortformer(config: str, steps: int, warmup: int, peer: bool) -> None:
    import sortformer as sb

    sb.CONFIGS.setdefault("host-deep", dict(sb.CONFIGS["tiny"], n_layers=17, tf_layers=18))
    name = {"deep": "host-deep", "wide": "full-narrow"}.get(config, config)
    diar = sb.random_diarizer(name, None, DTYPE[0])
    sides = {k: feeder(diar, diar.session(), sb.TICK, seed=3) for k in ("plain", "compiled")}
    res = paired(sides, steps, warmup + 3)  # the first chunks wait for their right context
    c = sb.CONFIGS[name]
    report(f"Sortformer {config}: {c['n_layers']} conformer layers x {c['d_model']}, "
           f"{c['tf_layers']} transformer layers x {c['tf_d_model']}; one 480 ms chunk per "
           "tick", res, "")
    print("target: compiled host <= 0.5x plain")


def moshi(config: str, steps: int, warmup: int, peer: bool) -> None:
    from mlx.utils import tree_flatten

    from mlx_speech.models.moshi import KyutaiGen, LmConfig, Sampling
    from mlx_speech.models.moshi.lm import LM

    dims = (dict(dim=64, num_heads=4, depformer_dim=32, depformer_num_heads=4,
                 depformer_dim_feedforward=132, num_layers=32, depformer_num_layers=6)
            if config == "deep" else
            dict(dim=4096, num_heads=32, depformer_dim=1024, depformer_num_heads=16,
                 depformer_dim_feedforward=4224, num_layers=32 if config == "full" else 2,
                 depformer_num_layers=6 if config == "full" else 2))
    cfg = LmConfig.from_dict(dict(
        dims, text_card=32000, existing_text_padding_id=3, n_q=16, dep_q=8, card=2048,
        hidden_scale=4.125, causal=True, layer_scale=None, context=3000,
        max_period=10000, gating="silu", norm="rms_norm_f32", positional_embedding="rope",
        depformer_layer_scale=None, depformer_multi_linear=True,
        depformer_context=8, depformer_max_period=10000, depformer_gating="silu",
        depformer_pos_emb="none", depformer_weights_per_step=True,
        delays=[0] + [0] + [1] * 7 + [0] + [1] * 7))
    lm = LM(cfg)
    rng = np.random.default_rng(0)
    lm.load_weights([(k, mx.array(rng.standard_normal(v.shape).astype(np.float32)
                                  / max(1.0, v.shape[-1] ** 0.5)))
                     for k, v in tree_flatten(lm.parameters())])
    mx.eval(lm.parameters())
    user = rng.integers(0, cfg.card, (warmup + steps + 4, 1, cfg.n_user, 1)).astype(np.int32)
    sides = {}
    for name in ("plain", "compiled"):
        gen = KyutaiGen(lm, cfg, Sampling(0.8, 0.7, 250, 25), seed=1)

        def tick(t: int, gen=gen) -> None:
            gen.step(mx.array(user[t]))
            mx.eval(gen.arrays())

        sides[name] = tick
    res = paired(sides, steps, warmup)
    report(f"Moshi {config}: temporal {cfg.num_layers} layers x {cfg.dim}, depformer "
           f"{cfg.depformer_num_layers} layers x {cfg.depformer_dim} over {cfg.dep_q} codebooks; "
           "one 80 ms frame per tick (temporal step, text sample, depformer loop)", res, "")
    print("target: compiled host <= 0.4x plain")


FAMILIES: dict[str, Callable[..., None]] = {"voxtral": voxtral, "nemotron": nemotron,
                                            "sortformer": sortformer, "moshi": moshi}


def main(argv: list[str] | None = None) -> None:
    os.environ.setdefault("MLX_ENABLE_TF32", "0")  # full float32 on CUDA / new Macs
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--config", choices=["deep", "wide", "full"], default="deep")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--no-peer", action="store_true", help="skip mlx-audio")
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                    help="Voxtral Realtime's and Sortformer's weights (the real models: bfloat16)")
    ap.add_argument("--gpu-graphs", action="store_true",
                    help="one-node stand-ins for the mx.fast kernels (a GPU's node counts; "
                         "host times only)")
    args = ap.parse_args(argv)
    if args.gpu_graphs:
        gpu_graphs()
    DTYPE[0] = getattr(mx, args.dtype)
    peer = not args.no_peer
    if peer:
        try:
            import mlx_audio.stt.models.voxtral_realtime.voxtral_realtime  # noqa: F401
        except Exception as e:  # any import problem: the peer is optional
            print(f"mlx-audio skipped: {e!r}")
            peer = False
    print(f"host time per step | device {mx.default_device()} | mlx {mx.__version__} | "
          f"{args.config} {args.dtype}{GPU_NOTE if args.gpu_graphs else ''} | "
          f"median of {args.steps} ticks after {args.warmup} warm-up")
    print(f"CPU BLAS: {cpu_blas()}")
    for name in args.families.split(","):
        FAMILIES[name](args.config, args.steps, args.warmup, peer)


if __name__ == "__main__":
    main()
