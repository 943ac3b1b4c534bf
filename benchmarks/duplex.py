"""Duplex step cost per 80 ms frame, ours vs mlx-audio 0.6.2's Moshi, on identical random weights.

    NO_TORCH_COMPILE=1 python benchmarks/duplex.py [--config tiny|mid|real-width] [--layers N]
        [--dtype bf16|fp32] [--steps N] [--warmup N] [--check-steps N] [--workdir DIR]
        [--no-peer]

Builds one Kyutai-layout folder: `config.json` (LM kwargs), a random LM `model.safetensors`
under the released key names (spec duplex_moshi.md §5.1, bf16 like the release, fused attention
weights), a random full-size Mimi in the released format (`benchmarks/mimi.py`'s
`make_checkpoint`: moshi 0.2.13 `get_mimi(None)`; needs torch + moshi) and a SentencePiece file
with `text_card` pieces. Ours loads the folder with `mlx_speech.models.moshi.load`; mlx-audio
builds `Lm(LmConfig.from_config_dict(kwargs))` + `Lm.load_pytorch_weights` and
`Mimi(mimi_202407(8))` + `Mimi.load_pytorch_weights` from the same files. The LM runs in
`--dtype` on both sides, Mimi in float32 (as the references do).

Both sides stream the same audio (benchmarks/mimi.py's chirp + noise) with greedy sampling,
steps interleaved ours / theirs so background load hits both alike. Two passes, each on fresh
streams:

* whole step, as a session runs it: ours `session.step(pcm)` (Mimi encode -> LM -> depformer ->
  Mimi decode as one lazy graph, one eval); theirs `encode_step -> LmGen.step ->
  last_audio_tokens -> decode_step` (its LmGen syncs on token checks inside the step).
* split: an eval at each component boundary. Mimi encode | LM = the token column, embeddings,
  temporal transformer, out_norm, text logits and the text sample | depformer = dep_q sub-steps
  with their samples and the token-cache update | Mimi decode. Ours: a session's `KyutaiGen` and
  Mimi state driven piece by piece, the gen's LM wrapped so that the text token is evaluated
  when the gen asks for depformer sub-step 0 (the gen has no timing hook). Theirs: `LmGen`'s
  `on_text_hook`. These syncs are extra: the split sum is not what the fused step costs.

Medians over `--steps` after `--warmup` steps; ratio = ours / theirs; "% frame" = share of the
80 ms real-time budget. User alignment (spec §6.2): mlx-audio's LmGen consumes a user frame one
step after it arrives, so ours runs with `user_lag=1` (the Kyutai-family session default is 0;
the cost is the same) and the text / audio tokens of each step must then be equal.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import os
import tempfile
import time
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten

from mlx_speech.models import moshi
from mlx_speech.models.moshi.config import MOSHI_7B

FRAME_MS = 80.0
TOK_NAME = "tokenizer_spm_32k_3.model"

# Temporal transformer sizes; Mimi is always the real one, the depformer is real from `mid` on.
CONFIGS = {
    "tiny": dict(dim=64, num_heads=4, num_layers=2, depformer_dim=32, depformer_num_heads=4,
                 depformer_num_layers=2, depformer_dim_feedforward=int(4.125 * 32)),
    "mid": dict(dim=1024, num_heads=8, num_layers=4),
    "real-width": dict(dim=4096, num_heads=32, num_layers=2),
}


def _mimi_bench():
    """benchmarks/mimi.py as a module (its checkpoint writer and test audio)."""
    spec = importlib.util.spec_from_file_location("mimi_bench", Path(__file__).with_name("mimi.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def lm_kwargs(name: str, layers: int | None) -> dict:
    kw = dict(MOSHI_7B, **CONFIGS[name])
    if layers is not None:
        kw["num_layers"] = layers
    return kw


def _gated(dim_ff: int, dim: int) -> int:
    """Kyutai's gated FFN hidden size (spec §3)."""
    return 21 * dim // 8 if dim_ff == 4 * dim else 2 * dim_ff // 3


def lm_checkpoint(kw: dict, seed: int = 0) -> dict[str, mx.array]:
    """Random LM tensors under the released names and shapes (spec §5.1), bfloat16."""
    dim, D, q = kw["dim"], kw["depformer_dim"], kw["dep_q"]
    H = _gated(int(kw["hidden_scale"] * dim), dim)
    Hd = _gated(int(kw["depformer_dim_feedforward"]), D)
    shapes = {"text_emb.weight": (kw["text_card"] + 1, dim),
              "out_norm.alpha": (1, 1, dim),
              "text_linear.weight": (kw["text_card"], dim),
              "depformer_text_emb.weight": (kw["text_card"] + 1, D)}
    shapes.update({f"emb.{k}.weight": (kw["card"] + 1, dim) for k in range(kw["n_q"])})
    for i in range(kw["num_layers"]):
        p = f"transformer.layers.{i}."
        shapes.update({p + "self_attn.in_proj_weight": (3 * dim, dim),
                       p + "self_attn.out_proj.weight": (dim, dim),
                       p + "norm1.alpha": (1, 1, dim), p + "norm2.alpha": (1, 1, dim),
                       p + "gating.linear_in.weight": (2 * H, dim),
                       p + "gating.linear_out.weight": (dim, H)})
    for k in range(q):
        shapes[f"depformer_in.{k}.weight"] = (D, dim)
        shapes[f"linears.{k}.weight"] = (kw["card"], D)
        if k < q - 1:
            shapes[f"depformer_emb.{k}.weight"] = (kw["card"] + 1, D)
    for j in range(kw["depformer_num_layers"]):
        p = f"depformer.layers.{j}."
        shapes.update({p + "self_attn.in_proj_weight": (q * 3 * D, D),
                       p + "self_attn.out_proj.weight": (q * D, D),
                       p + "norm1.alpha": (1, 1, D), p + "norm2.alpha": (1, 1, D)})
        for k in range(q):
            shapes[p + f"gating.{k}.linear_in.weight"] = (2 * Hd, D)
            shapes[p + f"gating.{k}.linear_out.weight"] = (D, Hd)
    key = mx.random.key(seed)
    out = {}
    for name, shape in shapes.items():
        key, sub = mx.random.split(key)
        w = mx.random.uniform(-(3**0.5), 3**0.5, shape, key=sub)  # unit variance; fast
        if name.endswith("alpha"):
            w = 1.0 + 0.1 * w
        elif name.split(".")[0] not in ("text_emb", "emb", "depformer_text_emb", "depformer_emb"):
            w = w * shape[-1] ** -0.5  # Linear: unit-variance outputs; embeddings unit variance
        out[name] = w.astype(mx.bfloat16)
        mx.eval(out[name])
    return out


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def write_tokenizer(path: Path, size: int) -> None:
    """A SentencePiece ModelProto with `size` pieces (4 control ids, then '▁w{i}')."""
    buf = bytearray()
    for i in range(size):
        piece, kind = (("<unk>", 2) if i == 0 else (f"<c{i}>", 3)) if i < 4 else (f"\u2581w{i}", 1)
        b = piece.encode()
        msg = (b"\x0a" + _varint(len(b)) + b + b"\x15" + np.float32(-i).tobytes()
               + b"\x18" + _varint(kind))
        buf += b"\x0a" + _varint(len(msg)) + msg
    path.write_bytes(bytes(buf))


def make_folder(folder: Path, kw: dict) -> None:
    """The Kyutai hub layout; reused when its config.json already holds `kw`."""
    cfg = folder / "config.json"
    mimi_file = folder / moshi.config.MIMI_NAME
    if cfg.exists() and json.loads(cfg.read_text()) == kw and mimi_file.exists():
        print(f"reusing {folder}")
        return
    folder.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    mx.save_safetensors(str(folder / moshi.config.MOSHI_NAME), lm_checkpoint(kw))
    if not mimi_file.exists():
        _mimi_bench().make_checkpoint(mimi_file)
    write_tokenizer(folder / TOK_NAME, kw["text_card"])
    cfg.write_text(json.dumps(kw))
    print(f"wrote random checkpoint to {folder} in {time.perf_counter() - t0:.0f} s")


class _TimedLM:
    """Our LM, evaluating the text token when the gen starts the depformer (LM/depformer split)."""

    def __init__(self, lm):
        self._lm = lm
        self.t_lm = 0.0

    def __getattr__(self, name):
        return getattr(self._lm, name)

    def depformer_logits(self, k, prev, z, dep):
        if k == 0:
            mx.eval(prev, z)
            self.t_lm = time.perf_counter()
        return self._lm.depformer_logits(k, prev, z, dep)


class Ours:
    name = "ours"

    def __init__(self, folder: Path, dtype):
        self.d = moshi.load(folder, dtype=dtype)
        self.cfg = self.d.config

    def start(self, split: bool) -> None:
        self.tokens: list[tuple[int, np.ndarray | None]] = []
        self.pcm: list[np.ndarray] = []
        self.session = self.d.session(temp=0.0, temp_text=0.0, user_lag=1)
        if split:  # the session's own gen and Mimi state, driven piece by piece
            self.gen, self.mimi_state = self.session.gen, self.session.mimi_state
            self.tlm = self.gen.lm = _TimedLM(self.gen.lm)
            return
        gen_step = self.session.gen.step

        def step(user):
            self._out = gen_step(user)
            return self._out

        self.session.gen.step = step

    def _record(self, out, pcm) -> None:
        audio = None if out.tokens is None else np.array(out.tokens[0, 1:, 0])
        self.tokens.append((int(out.text[0].item()), audio))
        self.pcm.append(pcm)

    def whole(self, frame: np.ndarray) -> dict:
        t0 = time.perf_counter()
        pcm, _ = self.session.step(frame)
        t1 = time.perf_counter()
        self._record(self._out, pcm)
        return {"step": t1 - t0}

    def split(self, frame: np.ndarray) -> dict:
        mimi, st, n = self.d.mimi, self.mimi_state, self.cfg.n_agent
        t0 = time.perf_counter()
        codes = mimi.encode_step(mx.array(frame)[None, None], st)
        mx.eval(codes, st.arrays())
        t1 = time.perf_counter()
        out = self.gen.step(codes[:, : self.cfg.n_user])
        mx.eval([a for a in (out.tokens, out.text) if a is not None], self.gen.arrays())
        t2 = time.perf_counter()
        pcm = None
        if out.tokens is not None:
            pcm = mimi.decode_step(out.tokens[:, 1 : 1 + n], st)
            mx.eval(pcm, st.arrays())
            pcm = np.array(pcm[0, 0])
        t3 = time.perf_counter()
        self._record(out, pcm)
        return {"encode": t1 - t0, "lm": self.tlm.t_lm - t1, "depformer": t2 - self.tlm.t_lm,
                "decode": t3 - t2}


class Theirs:
    name = "mlx-audio"

    def __init__(self, folder: Path, kw: dict, dtype):
        from mlx_audio.codec.models.mimi.mimi import Mimi, mimi_202407
        from mlx_audio.sts.models.moshi.lm import Lm, LmConfig

        cfg = LmConfig.from_config_dict(kw)
        self.lm = Lm(cfg)
        self.lm.load_pytorch_weights(str(folder / moshi.config.MOSHI_NAME), cfg, strict=True)
        self.lm.set_dtype(dtype)
        self.mimi = Mimi(mimi_202407(8))
        # the file has 32 RVQ levels, 8 are used
        self.mimi.load_pytorch_weights(str(folder / moshi.config.MIMI_NAME), strict=False)
        mx.eval(self.lm.parameters(), self.mimi.parameters())

    def start(self, split: bool) -> None:
        from mlx_audio.sts.models.moshi.generate import LmGen
        from mlx_audio.sts.models.moshi.utils.sampling import Sampler

        self.tokens, self.pcm = [], []
        for c in self.lm.transformer_cache:
            c.reset()
        # mlx-audio's Mimi.reset_state leaves the 12.5 Hz resampling convs stale
        for m in (self.mimi, self.mimi.downsample, self.mimi.upsample):
            m.reset_state()
        hooks = {"on_text_hook": self._text_done} if split else {}
        self.gen = LmGen(self.lm, max_steps=4096, text_sampler=Sampler(temp=0.0),
                         audio_sampler=Sampler(temp=0.0), **hooks)

    def _text_done(self, text) -> None:
        """Called by mlx-audio's Lm between the text sample and the depformer."""
        mx.eval(text)
        self.t_lm = time.perf_counter()

    def _lm_step(self, codes):
        text, _ = self.gen.step(codes[:, :, 0])
        return text, self.gen.last_audio_tokens()

    def _record(self, text, audio, pcm) -> None:
        self.tokens.append((int(text[0, 0].item()), None if audio is None else np.array(audio[0])))
        self.pcm.append(pcm)

    def whole(self, frame: np.ndarray) -> dict:
        t0 = time.perf_counter()
        codes = self.mimi.encode_step(mx.array(frame)[None, None])
        text, audio = self._lm_step(codes)
        pcm = None if audio is None else self.mimi.decode_step(audio[:, :, None])
        mx.eval([a for a in (text, pcm) if a is not None])
        int(text[0, 0].item())
        pcm = None if pcm is None else np.array(pcm[0, 0])
        t1 = time.perf_counter()
        self._record(text, audio, pcm)
        return {"step": t1 - t0}

    def split(self, frame: np.ndarray) -> dict:
        t0 = time.perf_counter()
        codes = self.mimi.encode_step(mx.array(frame)[None, None])
        mx.eval(codes)
        t1 = time.perf_counter()
        text, audio = self._lm_step(codes)
        mx.eval([a for a in (text, audio) if a is not None])
        t2 = time.perf_counter()
        pcm = None
        if audio is not None:
            pcm = self.mimi.decode_step(audio[:, :, None])
            mx.eval(pcm)
            pcm = np.array(pcm[0, 0])
        t3 = time.perf_counter()
        self._record(text, audio, pcm)
        return {"encode": t1 - t0, "lm": self.t_lm - t1, "depformer": t2 - self.t_lm,
                "decode": t3 - t2}


def run(sides, frames: np.ndarray, warmup: int, split: bool) -> list[dict[str, np.ndarray]]:
    """Interleaved steps (the order alternates); per side, ms per key over the timed steps."""
    for s in sides:
        s.start(split)
    times = [[] for _ in sides]
    for i, frame in enumerate(frames):
        order = range(len(sides)) if i % 2 == 0 else reversed(range(len(sides)))
        for j in order:
            t = (sides[j].split if split else sides[j].whole)(frame)
            if i >= warmup:
                times[j].append(t)
    return [{k: 1e3 * np.array([t[k] for t in ts]) for k in ts[0]} if ts else {}
            for ts in times]


def agreement(a, b) -> str:
    """Per step: text token and output audio frame equal? Plus |pcm| diff while all agree."""
    n = len(a.tokens)
    same_text = [a.tokens[i][0] == b.tokens[i][0] for i in range(n)]
    same_audio = []  # None: neither side has an output frame yet
    for (_, x), (_, y) in zip(a.tokens, b.tokens, strict=True):
        same_audio.append(None if x is None and y is None else
                          x is not None and y is not None and np.array_equal(x, y))
    ok = [t and s is not False for t, s in zip(same_text, same_audio, strict=True)]
    first_bad = ok.index(False) if not all(ok) else None
    prefix = n if first_bad is None else first_bad
    diffs = [np.abs(p - q).max() for p, q in zip(a.pcm[:prefix], b.pcm[:prefix], strict=True)
             if p is not None and q is not None]
    frames = [s for s in same_audio if s is not None]
    out = (f"text tokens equal {sum(same_text)}/{n} steps, output audio frames equal "
           f"{sum(frames)}/{len(frames)}")
    if first_bad is not None:
        out += f", first difference at step {first_bad}"
    if diffs:
        out += f"; max |pcm ours - theirs| over the agreeing steps {max(diffs):.1e}"
    return ("MATCH: " if first_bad is None else "MISMATCH: ") + out


def table(ours: dict, theirs: dict | None, rows) -> None:
    head = f"{'':28} {'ours ms':>9} {'%frame':>7}"
    if theirs is not None:
        head += f" {'mlx-audio ms':>13} {'%frame':>7} {'ours/theirs':>12}"
    print(head)
    for label, key in rows:
        o = float(np.median(ours[key])) if key != "sum" else sum(
            float(np.median(v)) for v in ours.values())
        line = f"{label:28} {o:9.1f} {100 * o / FRAME_MS:6.0f}%"
        if theirs is not None:
            t = float(np.median(theirs[key])) if key != "sum" else sum(
                float(np.median(v)) for v in theirs.values())
            line += f" {t:13.1f} {100 * t / FRAME_MS:6.0f}% {o / t:12.2f}"
        print(line)


def param_counts(lm) -> str:
    n = {"temporal layers": 0, "depformer": 0, "embeddings + text head": 0}
    for k, v in tree_flatten(lm.parameters()):
        part = ("temporal layers" if k.startswith("transformer.") else "depformer"
                if k.startswith(("depformer", "linears")) else "embeddings + text head")
        n[part] += v.size
    return ", ".join(f"{k} {v / 1e6:.1f} M" for k, v in n.items())


def make_sides(folder: Path, kw: dict, dtype, peer: bool) -> list:
    sides = [Ours(folder, dtype)]
    if peer:
        try:
            sides.append(Theirs(folder, kw, dtype))
        except ImportError as e:
            print(f"peer skipped: {e}")
    return sides


def main():
    os.environ.setdefault("MLX_ENABLE_TF32", "0")  # full float32 on CUDA / new Macs
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", choices=sorted(CONFIGS), default="mid")
    ap.add_argument("--layers", type=int, help="temporal transformer layers (config default)")
    ap.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16", help="LM dtype")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--check-steps", type=int, default=4,
                    help="with --dtype bf16: steps of the extra fp32 exactness check (0: skip)")
    ap.add_argument("--workdir", type=Path, help="keep / reuse the random checkpoint here")
    ap.add_argument("--no-peer", action="store_true", help="ours only")
    args = ap.parse_args()
    if args.warmup < 2 or args.steps < 1:
        ap.error("need --warmup >= 2 (the first step has no audio to decode) and --steps >= 1")
    kw = lm_kwargs(args.config, args.layers)
    dtype = {"bf16": mx.bfloat16, "fp32": mx.float32}[args.dtype]
    tmp = None
    folder = args.workdir
    if folder is None:
        tmp = tempfile.TemporaryDirectory()
        folder = Path(tmp.name)
    make_folder(folder, kw)

    sides = make_sides(folder, kw, dtype, not args.no_peer)
    peer = len(sides) == 2
    print(f"device {mx.default_device()}, mlx {mx.__version__}; config {args.config}: temporal "
          f"dim {kw['dim']} x {kw['num_layers']} layers ({kw['num_heads']} heads), depformer "
          f"dim {kw['depformer_dim']} x {kw['depformer_num_layers']} layers "
          f"({kw['depformer_num_heads']} heads) x dep_q {kw['dep_q']}, n_q {kw['n_q']}, "
          f"card {kw['card']}, text_card {kw['text_card']}; LM {args.dtype} "
          f"({param_counts(sides[0].d.lm)}), Mimi fp32 (full size, 8 codebooks); greedy; "
          f"{args.steps} steps after {args.warmup} warm-up")
    frames = _mimi_bench().audio(args.warmup + args.steps)[0, 0].reshape(-1, 1920)

    whole = run(sides, frames, args.warmup, split=False)
    check_whole = agreement(*sides) if peer else None
    split = run(sides, frames, args.warmup, split=True)
    check_split = agreement(*sides) if peer else None

    print("\nsplit (mx.eval at each component boundary; these syncs are extra: the fused step "
          "has one eval)")
    table(split[0], split[1] if peer else None,
          [("Mimi encode", "encode"), ("LM (temporal + text sample)", "lm"),
           (f"depformer ({kw['dep_q']} sub-steps)", "depformer"), ("Mimi decode", "decode"),
           ("sum of components", "sum")])
    print("\nwhole step as a session runs it (ours: one eval; mlx-audio: LmGen's own syncs)")
    table(whole[0], whole[1] if peer else None, [("step", "step")])
    print(f"p90 whole step: ours {np.percentile(whole[0]['step'], 90):.1f} ms" + (
        f", mlx-audio {np.percentile(whole[1]['step'], 90):.1f} ms" if peer else ""))
    if not peer:
        return
    print(f"\nagreement, greedy, ours user_lag=1 (mlx-audio's alignment), same user audio, "
          f"LM {args.dtype}:\n  whole-step pass: {check_whole}\n  split pass:      {check_split}")
    if args.dtype == "fp32" or not args.check_steps:
        return
    print("  (bf16 rounds differently in the two implementations, e.g. ours computes RMSNorm "
          "in float32 as PyTorch does; a near-tied greedy argmax then flips and the streams "
          "drift apart. In fp32 they must match exactly:)")
    del sides
    gc.collect()
    mx.clear_cache()
    sides = make_sides(folder, kw, mx.float32, True)
    run(sides, frames[: 2 + args.check_steps], 2 + args.check_steps, split=False)
    print(f"  fp32 check, whole-step pass: {agreement(*sides)}")


if __name__ == "__main__":
    main()
