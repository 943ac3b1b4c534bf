"""Quantized models: bf16 vs 8-bit vs 4-bit, per family, converted once with mlx_speech.convert.

    python benchmarks/quantized.py [--config short|mid] [--families vr,tts,nemotron,moshi]
        [--steps N] [--no-peer] [--workdir DIR]   (the default run: ~5.5 min on a 2-core CPU)

For each family a random checkpoint at realistic widths (the writers and sizes of the other
benchmarks here, few layers) is written in its source layout, then converted three times:
`--dtype bf16`, `--quantize 8` and `--quantize 4` (group 64; Moshi 4-bit group 32, as Kyutai's
q4). Each converted folder is then measured, numbers only (no assertions):

* conv s: the conversion; load s: `mlx_speech.load(folder)` incl. reading every weight;
* weights MB on disk; peak MB: mx.get_peak_memory over load + the runs below;
* RSS/W: peak RSS growth while loading the folder in a fresh process / its weight bytes
  (target <= 1.1: no copy of the weights is made at load time);
* step ms: median of the family's per-step unit (VR: one decoder token incl. the tied LM head;
  TTS: one frame = backbone token + flow head; Nemotron: one 160 ms streaming chunk through
  encoder + joint; Moshi: one LM step, temporal + 8 depformer sub-steps, no Mimi);
* compute: float32 on CPU by default (the folders are loaded with dtype=float32: packed weights
  as they are, scales / biases / activations in float32), because MLX's CPU quantized matmul in
  bf16 is ~10x slower than dense and accumulates in bf16 (the kernel check line shows both);
* quality vs the bf16 folder on the same inputs (teacher forced, one offline forward): max and
  mean |logit - logit_bf16| / max|logit_bf16| per row, and greedy (argmax) agreement per row;
* peer (Voxtral Realtime, Voxtral TTS, Nemotron): mlx-audio's model built from the same random
  weights as the single-family benchmarks build it (their `load_peer` / `build_checkpoint`),
  cast to bf16 and quantized with our `quantize` (same bits, group and the family's
  `keep_high_precision` rule); the check line says whether every quantized .weight / .scales /
  .biases equals ours bit for bit. Then its file is saved and re-read (load s), its own step is
  timed (VR: the streaming session's decode step; TTS: its generate loop's frame,
  decode_one_frame + code embeddings + backbone token; Nemotron: ConformerStreamingState.push
  of one 160 ms chunk + joint), with peak memory over load + runs, and greedy (argmax)
  agreement of its teacher-forced logits with ours on the same inputs and quantized weights;
* peer (Moshi): mlx-audio's Moshi LM (the moshi_mlx port) from the same bf16 file, quantized
  with Kyutai's own recipe (nn.quantize of the whole LM, q4 group 32 / q8 group 64, then
  save_weights / load_weights as moshi_mlx's q4/q8 files), per-step ms and load time of that
  file, and greedy text-token agreement of the two on the same user codes.

Random weights make the absolute quality numbers pessimistic-ish but comparable across bit
widths; CPU timings are for ratios only.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import mlx.core as mx
import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

import mlx_speech  # noqa: E402
from mlx_speech.convert import convert_model  # noqa: E402

VARIANTS = {"bf16": None, "q8": 8, "q4": 4}


def _bench(name: str):
    """Another benchmark script as a module (for its checkpoint writer)."""
    mod_name = f"bench_{name}"
    if mod_name not in sys.modules:
        spec = importlib.util.spec_from_file_location(mod_name, HERE / f"{name}.py")
        sys.modules[mod_name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[mod_name])
    return sys.modules[mod_name]


def median_ms(fn, n: int, warmup: int = 2) -> float:
    return _bench("voxtral_tts").median_ms(fn, n, warmup)


# ---------------------------------------------------------------- families
class VoxtralRealtime:
    name, kind, L = "voxtral_realtime", "voxtral_realtime", 16
    CONFIGS = {
        "short": (dict(dim=1280, n_layers=1, n_heads=32, head_dim=64, hidden_dim=5120,
                       sliding_window=750),
                  dict(dim=3072, n_layers=2, n_heads=32, n_kv_heads=8, head_dim=128,
                       hidden_dim=9216, vocab_size=32768, sliding_window=8192)),
        "mid": (dict(dim=1280, n_layers=2, n_heads=32, head_dim=64, hidden_dim=5120,
                     sliding_window=750),
                dict(dim=3072, n_layers=4, n_heads=32, n_kv_heads=8, head_dim=128,
                     hidden_dim=9216, vocab_size=131072, sliding_window=8192)),
    }

    def make(self, folder: Path, config: str) -> str:
        enc, dec = self.CONFIGS[config]
        _bench("voxtral_realtime").write_checkpoint(folder, enc, dec, mx.bfloat16, seed=0)
        self.vocab = dec["vocab_size"]
        return (f"enc {enc['dim']}x{enc['n_layers']}, dec {dec['dim']}x{dec['n_layers']}, "
                f"vocab {dec['vocab_size']} (tied head)")

    def inputs(self, rng):
        return (rng.integers(1000, self.vocab, (1, self.L)),
                (0.5 * rng.standard_normal((1, 8 * self.L, 128))).astype(np.float32))

    def logits(self, w, inp) -> np.ndarray:
        m = w.model
        audio = m.embed_audio(mx.array(inp[1]))
        return np.array(m(mx.array(inp[0]), audio, m.ffn_scales(6))[0].astype(mx.float32))

    def step(self, w, inp, n: int) -> float:
        from mlx_speech.nn import RingBatch

        m = w.model
        tok, audio, scales = mx.array(inp[0]), m.embed_audio(mx.array(inp[1])), m.ffn_scales(6)
        caches = [RingBatch.gather([r]) for r in m.make_decoder_cache(8)]  # batch of 1
        mx.eval(audio, scales, m.hidden(tok[:, :8], audio[:, :8], scales, caches))
        i = [8]

        def one():
            k = i[0] % self.L
            h = m.hidden(tok[:, k:k + 1], audio[:, k:k + 1], scales, caches)
            mx.eval(mx.argmax(m.logits(h[:, -1]), axis=-1))
            i[0] += 1

        return median_ms(one, n)

    pkg = "voxtral_realtime"

    def build_peer(self, src: Path):
        return _bench("voxtral_realtime").load_peer(src)

    def peer_logits(self, pm, inp) -> np.ndarray:
        a = self.peer_audio(pm, inp)
        h, _ = pm.decoder.forward(a + pm.decoder.embed_tokens(mx.array(inp[0][0])), start_pos=0)
        return np.array(pm.decoder.logits(h).astype(mx.float32))

    def peer_audio(self, pm, inp) -> mx.array:
        pm._ensure_ada_scales(_bench("voxtral_realtime").DELAY_MS)  # ffn_scales(6) of ours
        return pm.encoder.encode_full(pm.encoder.conv_stem(mx.array(inp[1][0].T)))

    def peer_step(self, pm, inp, n: int) -> float:
        """Its session's _decode_some step: adapter row + token embedding, decoder, logits."""
        d, tok = pm.decoder, mx.array(inp[0][0])
        a = self.peer_audio(pm, inp)
        _, cache = d.forward(a[:8] + d.embed_tokens(tok[:8]), start_pos=0)
        i = [8]

        def one():
            k = i[0] % self.L
            x = a[k] + d.tok_embeddings(tok[k:k + 1])[0]
            h, _ = d.forward(x[None], start_pos=i[0], cache=cache)
            mx.eval(mx.argmax(d.logits(h.squeeze(0))))
            i[0] += 1

        return median_ms(one, n)


class VoxtralTTS:
    name, kind, L = "voxtral_tts", "voxtral_tts", 24

    def make(self, folder: Path, config: str) -> str:
        b = _bench("voxtral_tts")
        c = b.CONFIGS["mid" if config in ("short", "mid") else config]
        b.build_checkpoint(c, folder, mx.bfloat16)
        self.vocab = b.N_SPECIAL + 256
        return (f"backbone {c['dim']}x{c['n_layers']}, flow head {c['a_layers']} layers, "
                f"semantic {c['semantic']}, codec {c['c_dim']}")

    def inputs(self, rng):
        return rng.integers(100, self.vocab, (self.L,))

    def logits(self, w, inp) -> np.ndarray:
        m = w.model
        h = m.hidden(m.tok_embeddings(mx.array(inp))[None])
        return np.array(m.acoustic_transformer.semantic_codebook_output(h)[0].astype(mx.float32))

    def step(self, w, inp, n: int) -> float:
        m = w.model
        cache = m.make_cache()
        t_table = m.acoustic_transformer.time_table()
        h = m.hidden(m.tok_embeddings(mx.array(inp))[None], cache)[:, -1]
        noise = mx.random.normal((1, m.config.n_acoustic_codebook), key=mx.random.key(0))
        st = {"h": h}

        def one():
            codes = m.decode_frame(st["h"], noise, t_table)
            st["h"] = m.hidden(m.feedback(codes), cache)[:, -1]
            mx.eval(codes, st["h"])

        return median_ms(one, n)

    pkg = "voxtral_tts"

    def build_peer(self, src: Path):
        """mlx-audio's Model (built by the writer) given the source file's weights, whose
        names are its own parameter names through the writer's `mistral_name`."""
        from make_voxtral_tts import mistral_name  # tests/golden, on sys.path via the writer
        from mlx.utils import tree_flatten

        b = _bench("voxtral_tts")
        folder = src.parent / "peer_src"
        shutil.rmtree(folder, ignore_errors=True)
        pm = b.build_checkpoint(b.CONFIGS["mid"], folder, mx.bfloat16)
        name = {mistral_name(k): k for k, _ in tree_flatten(pm.parameters())}
        pm.load_weights([(name[k], v) for k, v in
                         mx.load(str(src / "consolidated.safetensors")).items()], strict=True)
        return pm

    def peer_logits(self, pm, inp) -> np.ndarray:
        h = pm.language_model.model.model(mx.array(inp)[None])
        return np.array(pm.acoustic_transformer.semantic_codebook_output(h)[0]
                        .astype(mx.float32))

    def peer_step(self, pm, inp, n: int) -> float:
        """Its generate loop's frame: decode_one_frame, code embeddings, backbone token."""
        from mlx_audio.lm.models.cache import make_prompt_cache

        lm, at = pm.language_model.model.model, pm.acoustic_transformer
        emb = pm.audio_codebook_embeddings["embeddings"]
        cache = make_prompt_cache(pm.language_model.model)
        dummy = mx.array([[24]])
        st = {"h": lm(mx.array(inp)[None], cache=cache)[:, -1]}

        def one():
            codes = at.decode_one_frame(st["h"])
            e = emb(pm._codes_to_global_indices(codes)).sum(1, keepdims=True)
            st["h"] = lm(dummy, cache=cache, input_embeddings=e)[:, -1]
            mx.eval(codes, st["h"])

        return median_ms(one, n)


class Nemotron:
    name, kind = "nemotron", "nemotron_asr_streaming"

    def make(self, folder: Path, config: str) -> str:
        b = _bench("nemotron_streaming")
        b.write_random_checkpoint(folder, "full-narrow", 2 if config == "short" else 6, 2.0)
        return f"encoder 1024 x {2 if config == 'short' else 6} layers, pred 640, vocab 1025"

    def inputs(self, rng):
        return (0.5 * rng.standard_normal((1, 400, 128))).astype(np.float32)

    def logits(self, w, inp) -> np.ndarray:
        m = w.model
        enc = m.encoder_projector(m.encoder(mx.array(inp).astype(m.dtype)))
        return np.array(m.joint(enc[0], m.make_decoder_state().g[0]).astype(mx.float32))

    def step(self, w, inp, n: int) -> float:
        m = w.model
        state = m.encoder.make_state(1)  # 160 ms mode: 2 encoder frames = 16 mel frames
        g = m.make_decoder_state().g[0]
        mel = mx.array(inp).astype(m.dtype)
        i = [0]

        def one():
            k = (i[0] * 16) % (mel.shape[1] - 16)
            x = m.encoder_projector(m.encoder(mel[:, k:k + 16], state=state))
            mx.eval(mx.argmax(m.joint(x[0], g), axis=-1), *state.arrays())
            i[0] += 1

        return median_ms(one, n)

    pkg = "nemotron_streaming"

    def build_peer(self, src: Path):
        return _bench("nemotron_streaming").load_peer(src, mx.float32)

    @staticmethod
    def peer_dtype(pm) -> mx.Dtype:
        return getattr(pm.joint.enc, "scales", pm.joint.enc.weight).dtype

    def peer_logits(self, pm, inp) -> np.ndarray:
        enc, _ = pm.encoder(mx.array(inp).astype(self.peer_dtype(pm)))
        enc = pm.apply_prompt(enc, pm.default_language)
        pred, _ = pm.decoder(None, None)
        return np.array(pm.joint(enc, pred.astype(enc.dtype))[0, :, 0].astype(mx.float32))

    def peer_step(self, pm, inp, n: int) -> float:
        """Its streaming pieces per 160 ms chunk (as PeerSession): ConformerStreamingState.push
        of 16 mel frames, apply_prompt, joint with the start prediction, materialize."""
        from mlx_audio.stt.models.nemotron_asr import ConformerStreamingState

        left = pm.default_att_context_size[0]
        state = ConformerStreamingState(pm.encoder, att_context_size=[left, 1])
        mel = mx.array(inp).astype(self.peer_dtype(pm))
        pred, _ = pm.decoder(None, None)
        i = [0]

        def one():
            k = (i[0] * 16) % (mel.shape[1] - 16)
            for h in state.push(mel[:, k:k + 16]):
                h = pm.apply_prompt(h, pm.default_language)
                state.materialize(mx.argmax(pm.joint(h, pred.astype(h.dtype)), axis=-1))
            i[0] += 1

        return median_ms(one, n)


class Moshi:
    name, kind, T = "moshi", "moshi", 12

    def make(self, folder: Path, config: str) -> str:
        b = _bench("duplex")
        self.kw = b.lm_kwargs("mid", 2 if config == "short" else 4)
        b.make_folder(folder, self.kw)
        k = self.kw
        return (f"temporal {k['dim']}x{k['num_layers']}, depformer {k['depformer_dim']}x"
                f"{k['depformer_num_layers']} x dep_q {k['dep_q']}, text_card {k['text_card']}, "
                "real-size Mimi (fp32, never quantized)")

    def inputs(self, rng):
        tok = rng.integers(0, 2048, (1, 17, self.T))
        tok[:, 0] = rng.integers(0, 32000, (1, self.T))
        return tok

    def logits(self, w, inp) -> np.ndarray:
        _, text = w.lm.forward_tokens(mx.array(inp))
        return np.array(text[0].astype(mx.float32))

    def user(self, n: int) -> np.ndarray:
        return np.random.default_rng(1).integers(0, 2048, (n, 1, 8, 1))

    def step(self, w, inp, n: int, texts: list | None = None) -> float:
        from mlx_speech.models.moshi import KyutaiGen, Sampling

        gen = KyutaiGen(w.lm, w.lm.config, Sampling(0.0, 0.0, 250, 25), user_lag=1)  # as LmGen
        users = self.user(n + 2)
        i = [0]

        def one():
            out = gen.step(mx.array(users[i[0]]))
            mx.eval(out.text, gen.arrays())
            if texts is not None:
                texts.append(int(out.text[0].item()))
            i[0] += 1

        return median_ms(one, n)

    def peer(self, src: Path, bits: int | None, work: Path, n: int, compute) -> dict:
        import mlx.nn as nn
        from mlx_audio.sts.models.moshi.generate import LmGen
        from mlx_audio.sts.models.moshi.lm import Lm, LmConfig
        from mlx_audio.sts.models.moshi.utils.sampling import Sampler

        cfg = LmConfig.from_config_dict(self.kw)
        lm = Lm(cfg)
        lm.load_pytorch_weights(str(src / "model.safetensors"), cfg, strict=True)
        lm.set_dtype(mx.bfloat16)
        group = 32 if bits == 4 else 64
        if bits:
            nn.quantize(lm, bits=bits, group_size=group)
        f = work / f"peer.q{bits or 16}.safetensors"
        lm.save_weights(str(f))
        del lm
        gc.collect()
        t = time.perf_counter()
        lm = Lm(cfg)
        if bits:
            nn.quantize(lm, bits=bits, group_size=group)
        lm.load_weights(str(f), strict=True)
        if compute is not None:
            lm.set_dtype(compute)
        mx.eval(lm.parameters())
        load_s = time.perf_counter() - t
        gen = LmGen(lm, max_steps=4096, text_sampler=Sampler(temp=0.0),
                    audio_sampler=Sampler(temp=0.0))
        users = self.user(n + 2)
        i, texts = [0], []

        def one():
            text, _ = gen.step(mx.array(users[i[0]])[:, :, 0])
            mx.eval(text)
            texts.append(int(text[0, 0].item()))
            i[0] += 1

        return {"step": median_ms(one, n), "load": load_s, "texts": texts}


FAMILIES = {"vr": VoxtralRealtime, "tts": VoxtralTTS, "nemotron": Nemotron, "moshi": Moshi}


# ---------------------------------------------------------------- measurement
def rss_ratio(folder: Path, kind: str) -> float:
    """Peak RSS growth while loading `folder` in a fresh process / its weight bytes."""
    code = f"""
import sys; sys.path.insert(0, {str(ROOT)!r})
import mlx_speech
from mlx_speech.registry import model_module
model_module({kind!r})
def kb(key):
    for line in open('/proc/self/status'):
        if line.startswith(key):
            return int(line.split()[1])
base = kb('VmRSS:')
m = mlx_speech.load({str(folder)!r})
print(base, kb('VmHWM:'))
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(r.stderr.strip().splitlines()[-1])
    base, hwm = map(int, r.stdout.split())
    return (hwm - base) * 1024 / weight_bytes(folder)


def weight_bytes(folder: Path) -> int:
    man = json.loads((folder / "mlx_speech.json").read_text())
    return sum((folder / f).stat().st_size for f in man["weights"].values())


def quality(ref: np.ndarray, got: np.ndarray) -> tuple[float, float, float]:
    scale = np.abs(ref).max(axis=-1, keepdims=True)
    rel = np.abs(got - ref) / scale
    agree = float((got.argmax(-1) == ref.argmax(-1)).mean())
    return float(rel.max()), float(rel.mean()), agree


def _qtensors(flat: dict) -> dict[str, str]:
    """name -> digest of every quantized module's packed .weight / .scales / .biases."""
    out = {}
    for k in flat:
        if k.endswith(".scales"):
            for name in (k[:-7] + s for s in (".weight", ".scales", ".biases")):
                if name in flat:
                    a = flat[name]
                    a = a.view(mx.uint16) if a.dtype == mx.bfloat16 else a
                    out[name] = hashlib.sha1(np.array(a).tobytes()).hexdigest()
    return out


def same_quantized(folder: Path, peer) -> str:
    """Are the peer's quantized tensors exactly ours (those in the converted folder)?"""
    from mlx.utils import tree_flatten

    ours: dict = {}
    for f in set(json.loads((folder / "mlx_speech.json").read_text())["weights"].values()):
        ours.update(mx.load(str(folder / f)))
    o, p = _qtensors(ours), _qtensors(dict(tree_flatten(peer.parameters())))
    where = {h: k for k, h in p.items()}
    pairs = [(k, where[h]) for k, h in o.items() if h in where]
    same = Counter(o.values()) == Counter(p.values())
    ex = [f"{a} == {b}" for a, b in pairs if a.endswith(".scales")][:2]
    return (f"quantized tensors: ours {len(o)}, peer {len(p)}, {len(pairs)} of ours found in "
            f"the peer bit for bit -> {'IDENTICAL' if same else 'DIFFERENT'} "
            f"(e.g. {'; '.join(ex) or 'none'})")


def audio_peer(fam, src: Path, bits: int | None, group: int | None, folder: Path, work: Path,
               n: int, compute, inp) -> dict:
    """mlx-audio's model from the same random weights, quantized like ours (our quantize with
    the family's keep rule, group and bits), its file saved and re-read, its step timed."""
    import importlib

    from mlx_speech.nn.quant import quantize

    pm = fam.build_peer(src)
    pm.set_dtype(mx.bfloat16)  # as our convert --dtype bf16, before quantizing
    check = "bf16: same source weights"
    if bits:
        keep = importlib.import_module(f"mlx_speech.models.{fam.pkg}").keep_high_precision
        quantize(pm, bits, group, keep=keep)
        check = same_quantized(folder, pm)
    f = work / "peer.safetensors"
    pm.save_weights(str(f))
    gc.collect()
    mx.clear_cache()
    mx.reset_peak_memory()
    t = time.perf_counter()
    pm.load_weights(str(f), strict=True)
    if compute is not None:
        pm.set_dtype(compute)
    mx.eval(pm.parameters())
    load_s = time.perf_counter() - t
    lg = fam.peer_logits(pm, inp)
    step = fam.peer_step(pm, inp, n)
    return {"step": step, "load": load_s, "peak": mx.get_peak_memory() / 2**20, "logits": lg,
            "check": check}


def cpu_kernel_check() -> str:
    """MLX's CPU quantized_matmul in bf16 vs float32 on one decoder-sized layer."""
    w = (mx.random.normal((9216, 3072), key=mx.random.key(0)) * 0.02).astype(mx.bfloat16)
    x = mx.random.normal((1, 3072), key=mx.random.key(1)).astype(mx.bfloat16)
    ref = x.astype(mx.float32) @ w.astype(mx.float32).T
    wq, s, b = mx.quantize(w, group_size=64, bits=8)
    out = []
    for dt in (mx.bfloat16, mx.float32):
        args = (x.astype(dt), wq, s.astype(dt), b.astype(dt))
        f = lambda a=args: mx.quantized_matmul(*a, transpose=True, group_size=64, bits=8)  # noqa
        ms = median_ms(lambda f=f: mx.eval(f()), 3, 1)
        err = (mx.abs(f().astype(mx.float32) - ref).max() / mx.abs(ref).max()).item()
        out.append(f"{str(dt).split('.')[-1]} {ms:.1f} ms, max rel err {err:.4f}")
    dense = median_ms(lambda: mx.eval(x @ w.T), 3, 1)
    return f"8-bit 3072->9216 matvec: {'; '.join(out)} (dense bf16 {dense:.1f} ms)"


def run_family(key: str, args, work: Path, compute) -> list[dict]:
    fam = FAMILIES[key]()
    src = work / key / "src"
    src.mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    desc = fam.make(src, args.config)
    print(f"\n## {fam.name}: {desc}  (source written in {time.perf_counter() - t:.0f} s)",
          flush=True)
    inp = fam.inputs(np.random.default_rng(0))
    rows, ref = [], None
    for label, bits in VARIANTS.items():
        out = work / key / label
        shutil.rmtree(out, ignore_errors=True)
        group = None if bits is None else (32 if key == "moshi" and bits == 4 else 64)
        t = time.perf_counter()
        convert_model(src, out, quantize=bits, group_size=group, dtype="bf16", progress=False)
        conv_s = time.perf_counter() - t
        gc.collect()
        t = time.perf_counter()
        w = mlx_speech.load(out)  # as stored: memory-mapped, no work
        load_s = time.perf_counter() - t
        if compute is not None:
            del w
            gc.collect()
        mx.clear_cache()
        mx.reset_peak_memory()
        if compute is not None:
            w = mlx_speech.load(out, dtype=compute)
        lg = fam.logits(w, inp)
        texts = [] if key == "moshi" else None
        step = fam.step(w, inp, args.steps, texts) if key == "moshi" else \
            fam.step(w, inp, args.steps)
        row = dict(family=fam.name, variant=label, conv_s=conv_s, load_s=load_s,
                   mb=weight_bytes(out) / 2**20, peak_mb=mx.get_peak_memory() / 2**20,
                   step=step, rss=rss_ratio(out, fam.kind), texts=texts)
        if ref is None:
            ref = lg
        row["q"] = quality(ref, lg)
        del w
        gc.collect()
        if key == "moshi" and not args.no_peer:
            row["peer"] = fam.peer(src, bits, work / key, args.steps, compute)
        elif not args.no_peer:
            p = row["peer"] = audio_peer(fam, src, bits, group, out, work / key, args.steps,
                                         compute, inp)
            p["agree"] = float((p.pop("logits").argmax(-1) == lg.argmax(-1)).mean())
            gc.collect()
        rows.append(row)
        print_row(row, rows[0], flush=True)
    return rows


HEAD = (f"{'variant':8} {'conv s':>6} {'load s':>6} {'MB':>7} {'peak MB':>8} {'RSS/W':>5} "
        f"{'step ms':>8} {'x bf16':>6} {'max rel':>8} {'mean rel':>9} {'greedy':>7}")


def print_row(r: dict, base: dict, flush=False) -> None:
    if r is base:
        print(HEAD)
    mx_, mean, agree = r["q"]
    print(f"{r['variant']:8} {r['conv_s']:6.1f} {r['load_s']:6.2f} {r['mb']:7.0f} "
          f"{r['peak_mb']:8.0f} {r['rss']:5.2f} {r['step']:8.2f} "
          f"{base['step'] / r['step']:5.2f}x {mx_:8.4f} {mean:9.5f} {100 * agree:6.1f}%",
          flush=flush)
    p = r.get("peer")
    if p and "agree" in p:
        print(f"  mlx-audio {p['check']}", flush=flush)
        print(f"  mlx-audio, same weights: step {p['step']:.2f} ms (ours/theirs "
              f"{r['step'] / p['step']:.2f}), peak {p['peak']:.0f} MB (ours/theirs "
              f"{r['peak_mb'] / p['peak']:.2f}), load {p['load']:.2f} s; greedy tokens (teacher "
              f"forced) equal ours vs peer {100 * p['agree']:.1f}%", flush=flush)
    elif p:
        same = sum(a == b for a, b in zip(r["texts"], p["texts"], strict=False))
        print(f"  mlx-audio Moshi (moshi_mlx recipe), same bits: step {p['step']:.2f} ms "
              f"(ours/theirs {r['step'] / p['step']:.2f}), load {p['load']:.2f} s; greedy text "
              f"tokens equal {same}/{min(len(r['texts']), len(p['texts']))}", flush=flush)


def main() -> None:
    os.environ.setdefault("MLX_ENABLE_TF32", "0")  # full float32 on CUDA / new Macs
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", choices=["short", "mid"], default="short")
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--compute", choices=["auto", "stored", "float32"], default="auto",
                    help="dtype the runs compute in (auto: float32 on CPU, where MLX's bf16 "
                         "quantized matmul is slow and inaccurate; as stored on a GPU)")
    ap.add_argument("--no-peer", action="store_true")
    ap.add_argument("--workdir", type=Path, help="keep the checkpoints here")
    args = ap.parse_args()
    keys = [k.strip() for k in args.families.split(",") if k.strip()]
    bad = [k for k in keys if k not in FAMILIES]
    if bad:
        ap.error(f"unknown family {bad[0]!r} (known: {', '.join(FAMILIES)})")
    cpu = mx.default_device() == mx.cpu
    compute = mx.float32 if args.compute == "float32" or (args.compute == "auto" and cpu) \
        else None
    print(f"device {mx.default_device()}, mlx {mx.__version__}; config {args.config}; "
          f"{args.steps} timed steps; weights stored bf16 (+ packed); compute "
          f"{'float32 (scales, biases, activations)' if compute else 'as stored'}; "
          "ratios within one run only")
    print(f"kernel check: {cpu_kernel_check()}")
    tmp = None
    work = args.workdir
    if work is None:
        tmp = tempfile.TemporaryDirectory()
        work = Path(tmp.name)
    t = time.perf_counter()
    for k in keys:
        run_family(k, args, work, compute)
        if args.workdir is None:
            shutil.rmtree(work / k, ignore_errors=True)
    print(f"\ntotal {time.perf_counter() - t:.0f} s")


if __name__ == "__main__":
    main()
