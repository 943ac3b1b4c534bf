"""mlx_speech.convert on models: every family's tiny checkpoint -> the converted layout, which
loads to the same tensors and outputs as its source (quantized: as on-the-fly quantization),
byte-identical on a second run, nothing left behind on an error or Ctrl-C."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten

import mlx_speech
from mlx_speech.convert import main
from mlx_speech.convert import writer as writer_mod
from mlx_speech.errors import CheckpointError
from tests.conftest import make_voxtral_checkpoint, speechlike
from tests.support.moshi import (
    GOLDEN as MOSHI,
)
from tests.support.moshi import (
    VOICE_CACHE,
    build_random_lm,
    kyutai_weights,
    random_lm_kwargs,
    write_folder,
)
from tests.support.nemo import nemo_file  # noqa: F401  (fixture)
from tests.support.numbers import assert_same_numbers

ROOT = Path(__file__).parents[1]
DELAYS = [0, 0, 1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 1]


def _moshi_src(d: Path) -> Path:
    kw = random_lm_kwargs(card=64, n_q=16, dep_q=8, delays=DELAYS)
    return write_folder(d, kw, kyutai_weights(build_random_lm(kw)))


def _pp_src(d: Path) -> Path:
    kw = json.loads((MOSHI / "tiny_pp_config.json").read_text())
    d = write_folder(d, kw, MOSHI / "tiny_pp.safetensors")
    (d / "voices").mkdir()
    rng = np.random.default_rng(0)
    from safetensors.numpy import save_file

    save_file({"embeddings": (0.1 * rng.standard_normal((3, 1, 1, 16))).astype(np.float32),
               "cache": VOICE_CACHE},
              str(d / "voices" / "NATF0.safetensors"))
    return d


SOURCES = {
    "vr_mistral": lambda d: make_voxtral_checkpoint(d, "mistral"),
    "vr_hf": lambda d: make_voxtral_checkpoint(d, "hf"),
    "tts": lambda d: shutil.copytree(ROOT / "golden" / "voxtral_tts" / "ckpt", d),
    "nemotron": lambda d: shutil.copytree(ROOT / "golden" / "nemotron", d),
    "moshi": _moshi_src,
    "personaplex": _pp_src,
}


@pytest.fixture(scope="module")
def src(tmp_path_factory, request):
    built = {}

    def get(name: str) -> Path:
        if name not in built:
            if name == "nemo":
                built[name] = request.getfixturevalue("nemo_file")
            else:
                built[name] = SOURCES[name](tmp_path_factory.mktemp(name) / "src")
        return built[name]

    return get


def outputs(m) -> list[np.ndarray]:
    """A short end-to-end output of each family (greedy / seeded, deterministic)."""
    from mlx_speech.models.moshi import Moshi
    from mlx_speech.models.voxtral_tts import VoxtralTTS

    if isinstance(m, VoxtralTTS):
        return [m.codes("Hi there.", max_frames=4)]
    if isinstance(m, Moshi):
        s = m.session(temp=0.0, temp_text=0.0)
        x = speechlike(0.3, seed=2)
        x = np.resize(x, 3 * s.frame_size)
        out = []
        for i in range(3):
            pcm, text = s.step(x[i * s.frame_size:(i + 1) * s.frame_size])
            out += [pcm, np.frombuffer(text.encode(), np.uint8)]
        return out
    return [np.array(m.transcribe(speechlike(1.5), 16000).token_ids)]


def params(m) -> dict[str, mx.array]:
    from mlx_speech.models.moshi import Moshi

    if isinstance(m, Moshi):
        return {**{"lm." + k: v for k, v in tree_flatten(m.lm.parameters())},
                **{"mimi." + k: v for k, v in tree_flatten(m.mimi.parameters())}}
    return dict(tree_flatten(m.model.parameters()))


def lm_logits(m) -> list[np.ndarray]:
    """Duplex LM text logits on fixed tokens (one offline forward)."""
    tok = np.random.default_rng(3).integers(0, 50, (1, 1 + m.config.n_q, 6))
    return [np.array(m.lm.forward_tokens(mx.array(tok))[1])]


def assert_same(a, b, run=outputs) -> None:
    pa, pb = params(a), params(b)
    assert pa.keys() == pb.keys()
    for k in pa:
        assert pa[k].dtype == pb[k].dtype, k
        assert mx.array_equal(pa[k], pb[k]).item(), k
    for x, y in zip(run(a), run(b), strict=True):
        assert_same_numbers(x, y)  # NN and NT products: exact on CI's BLAS


def files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("name,kind,extra", [
    ("vr_mistral", "voxtral_realtime", {"params.json", "tekken.json"}),
    ("vr_hf", "voxtral_realtime", {"config.json", "tekken.json"}),
    ("tts", "voxtral_tts", {"params.json", "tekken.json", "voice_embedding/casual_male.safetensors",
                            "voice_embedding/neutral_female.safetensors"}),
    ("nemotron", "nemotron_asr_streaming", {"config.json", "tokenizer.model"}),
    ("nemo", "nemotron_asr_streaming", {"config.json", "tokenizer.model"}),
    ("moshi", "moshi", {"config.json", "mimi.safetensors", "codec.json", "tok.model"}),
    ("personaplex", "moshi", {"config.json", "mimi.safetensors", "codec.json", "tok.model",
                              "voices/NATF0.safetensors"}),
])
def test_converted_folder_loads_the_same(src, tmp_path, name, kind, extra):
    s = src(name)
    assert main([str(s), str(tmp_path / "a"), "--quiet"]) == 0
    out = tmp_path / "a"
    got = files(out)
    assert set(got) == {"mlx_speech.json", "model.safetensors"} | extra
    man = json.loads(got["mlx_speech.json"])
    assert (man["format"], man["version"], man["model_type"]) == ("mlx_speech", 1, kind)
    assert man["quantization"] is None and man["overrides"] == {}
    assert man["dtype"] == ("float16" if name == "tts" else "float32")  # as stored
    assert_same(mlx_speech.load(s), mlx_speech.load(out))
    # a second run, and a conversion of the converted folder, give the same bytes
    assert main([str(s), str(tmp_path / "b"), "--quiet"]) == 0
    assert files(tmp_path / "b") == got
    assert main([str(out), str(tmp_path / "c"), "--quiet"]) == 0
    assert files(tmp_path / "c") == got


def test_dtype(src, tmp_path):
    s = src("tts")
    assert main([str(s), str(tmp_path / "o"), "--dtype", "bf16", "--quiet"]) == 0
    conv = mlx_speech.load(tmp_path / "o")
    assert_same(mlx_speech.load(s, dtype=mx.bfloat16), conv)
    assert json.loads((tmp_path / "o" / "mlx_speech.json").read_text())["dtype"] == "bfloat16"
    dt = {v.dtype for k, v in params(conv).items() if ".quantizer." not in k}
    assert dt == {mx.bfloat16}  # the semantic codebook stays float32, as the loader keeps it


def _quant_cases():
    # tiny widths: the group must divide them (moshi 32, others 64)
    return [("vr_mistral", 4, None), ("vr_hf", 8, 32), ("tts", 4, None), ("tts", 6, 32),
            ("nemotron", 8, 32), ("nemo", 4, 32), ("moshi", 4, 32), ("moshi", 8, 32)]


@pytest.mark.parametrize("name,bits,group", _quant_cases())
def test_quantized_equals_on_the_fly(src, tmp_path, name, bits, group):
    s = src(name)
    args = [str(s), str(tmp_path / "q"), "--quantize", str(bits), "--quiet"]
    if group:
        args += ["--group-size", str(group)]
    assert main(args) == 0
    kwargs = {"quantize": bits} if group is None else {"quantize": bits, "group_size": group}
    ref, conv = mlx_speech.load(s, **kwargs), mlx_speech.load(tmp_path / "q")
    assert_same(ref, conv)
    man = json.loads((tmp_path / "q" / "mlx_speech.json").read_text())
    assert man["quantization"]["bits"] == bits
    assert any(k.endswith(".scales") for k in mx.load(str(tmp_path / "q" / "model.safetensors")))
    assert main(args[:1] + [str(tmp_path / "q2")] + args[2:]) == 0
    assert files(tmp_path / "q2") == files(tmp_path / "q")


@pytest.mark.parametrize("exc,code", [(KeyboardInterrupt, 130), (CheckpointError, 1)])
def test_interrupted_conversion_leaves_nothing(src, tmp_path, monkeypatch, exc, code):
    real = writer_mod.save_safetensors
    calls = []

    def failing(path, tensors, metadata=None, progress=None):
        def tick(n):
            calls.append(n)
            if len(calls) == 3:  # mid-file
                raise exc("stop")
        return real(path, tensors, metadata, tick)

    monkeypatch.setattr(writer_mod, "save_safetensors", failing)
    (tmp_path / "keep").mkdir()
    assert main([str(src("vr_mistral")), str(tmp_path / "out"), "--quiet"]) == code
    assert len(calls) == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep"]


def _write(d: Path, name: str, text: str = "x") -> Path:
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_text(text)
    return d


@pytest.mark.parametrize("setup,args,needle", [
    (lambda d: None, ["missing_folder", "o"], "no such file or folder"),
    (lambda d: None, ["nobody/no-such-model-xyz", "o"], "cannot fetch 'nobody/no-such-model-xyz'"),
    (lambda d: _write(d / "m", "config.json", '{"model_type": "llama"}'), ["m", "o"],
     "unsupported model type 'llama'"),
    (lambda d: _write(d, "x.onnx"), ["x.onnx", "o"], "don't know how to convert x.onnx"),
    (lambda d: _write(d / "o", "junk"), ["SRC", "o"],
     "output o already exists and is not an empty folder"),
    (lambda d: None, ["SRC", "o", "--quantize", "7"], "takes bits in 2, 3, 4, 5, 6, 8, got 7"),
    (lambda d: None, ["SRC", "o", "--quantize", "four"], "--quantize needs a whole number"),
    (lambda d: None, ["SRC", "o", "--quantize", "4", "--group-size", "48"],
     "takes group size 32, 64, 128, got 48"),
    (lambda d: None, ["SRC", "o", "--group-size", "64"], "--group-size needs --quantize"),
    (lambda d: None, ["SRC", "o", "--dtype", "int8"], "--dtype must be one of bf16, fp16, fp32"),
    (lambda d: None, ["SRC", "nofolder/o"], "folder nofolder does not exist"),
])
def test_bad_input_is_one_line(src, tmp_path, capsys, monkeypatch, setup, args, needle):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    setup(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    args = [str(src("vr_mistral")) if a == "SRC" else a for a in args]
    assert main(args) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and len(err.splitlines()) == 1, err
    assert needle in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written


def test_torch_file_options_are_refused(tmp_path, capsys):
    (tmp_path / "v.pt").write_bytes(b"PK")
    assert main([str(tmp_path / "v.pt"), str(tmp_path / "o"), "--dtype", "bf16"]) == 1
    assert "apply to models, not to torch files" in capsys.readouterr().err


def test_newer_layout_is_refused(src, tmp_path):
    out = tmp_path / "o"
    assert main([str(src("nemotron")), str(out), "--quiet"]) == 0
    man = json.loads((out / "mlx_speech.json").read_text())
    (out / "mlx_speech.json").write_text(json.dumps({**man, "version": 99}))
    with pytest.raises(CheckpointError, match="layout version 99 is newer"):
        mlx_speech.load(out)


def _published(name: str, tmp: Path) -> Path:
    """The published quantized layouts `tests/models/test_quantized.py` checks against their
    producers."""
    import tests.support.quantized as tq

    kind, _, sub = name.partition(":")
    if kind == "vr":
        return tq.vr_folder(tmp, sub)
    if kind == "tts":
        return tq.tts_folder(tmp, sub)
    if kind == "nemotron":
        return shutil.copytree(tq.NEMO / sub, tmp / sub)
    if kind == "moshi":
        return tq.moshi_folder(tmp, sub)
    from tests.support.moshi import build_random_lm, kyutai_weights, random_lm_kwargs

    kyutai = kyutai_weights(build_random_lm(random_lm_kwargs(**tq.PP_KW), seed=1))
    return tq.write_personaplex_mlx(tmp / "pp", kyutai, int(sub), 64)[0]


@pytest.mark.parametrize("name", [
    "vr:mlx_audio_4bit", "vr:mlx_audio_4bit_keep", "vr:voxmlx_6bit", "tts:mlx_4bit",
    "nemotron:q4", "moshi:model.q4.safetensors", "personaplex:8"])
def test_published_quantized_layouts_convert(name, tmp_path, monkeypatch):
    if name.startswith("personaplex"):  # the layout's Mimi is the 7B's; the test's is tiny
        from mlx_speech.models import mimi as mimi_pkg

        cfg = json.loads((MOSHI / "mimi24k_config.json").read_text())
        cfg["quantizer"]["bins"] = 64
        real = mimi_pkg.load
        monkeypatch.setattr(mimi_pkg, "load", lambda path, config=None, **kw:
                            real(path, config=config or cfg, **kw))
    s = _published(name, tmp_path / "src")
    assert main([str(s), str(tmp_path / "out"), "--quiet"]) == 0
    src, conv = mlx_speech.load(s), mlx_speech.load(tmp_path / "out")
    # the test's random PersonaPlex weights overflow in a session (the source run twice
    # differs too): its LM is compared on one forward
    assert_same(src, conv, lm_logits if name.startswith("personaplex") else outputs)
    man = json.loads((tmp_path / "out" / "mlx_speech.json").read_text())
    q = {k: v for k, v in params(src).items() if k.endswith(".scales")}
    assert q and man["quantization"] is not None
    assert man["model_type"] == ("moshi" if name.startswith("personaplex") else conv_kind(conv))


def conv_kind(m) -> str:
    return {"VoxtralRealtime": "voxtral_realtime", "VoxtralTTS": "voxtral_tts",
            "NemotronStreaming": "nemotron_asr_streaming", "Moshi": "moshi"}[type(m).__name__]


def test_hub_ids_in_and_out(tmp_path, monkeypatch):
    """A hub id converts (from a pre-filled cache, offline), and a converted folder published on
    the hub loads by its id, its whole folder fetched."""
    import fnmatch
    import os
    import subprocess
    import sys

    import mlx.nn as nn

    from mlx_speech import hub

    cache = tmp_path / "hub"
    snap = cache / "models--acme--tiny" / "snapshots" / ("a" * 40)
    make_voxtral_checkpoint(snap, "mistral")
    (cache / "models--acme--tiny" / "refs").mkdir()
    (cache / "models--acme--tiny" / "refs" / "main").write_text("a" * 40)
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(cache), HF_HOME=str(tmp_path),
               PYTHONPATH=str(ROOT.parent))
    r = subprocess.run([sys.executable, "-m", "mlx_speech.convert", "acme/tiny",
                        str(tmp_path / "conv"), "--quantize", "8", "--group-size", "32"],
                       env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr

    def download(repo, patterns, tqdm_class=None):  # the hub, serving only the files asked for
        assert repo == "acme/tiny-q8"
        got = tmp_path / "dl"
        for f in (tmp_path / "conv").rglob("*"):
            rel = str(f.relative_to(tmp_path / "conv"))
            if f.is_file() and any(fnmatch.fnmatch(rel, p) for p in patterns):
                (got / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(f, got / rel)
        return got

    monkeypatch.setattr(hub, "_download", download)
    m = mlx_speech.load("acme/tiny-q8")
    assert isinstance(m.model.whisper_encoder.transformer.layers[0].attention.wq,
                      nn.QuantizedLinear)


@pytest.mark.parametrize("name", ["vr_hf", "tts", "nemotron", "moshi"])
def test_converted_folder_loads_without_remapping(src, tmp_path, monkeypatch, name):
    assert main([str(src(name)), str(tmp_path / "o"), "--quiet"]) == 0

    def boom(*a, **k):
        raise AssertionError("remapped at load time")

    import mlx_speech.models.mimi as mimi
    import mlx_speech.models.moshi as moshi
    import mlx_speech.models.nemotron_streaming as nemotron
    import mlx_speech.models.voxtral_realtime as vr
    import mlx_speech.models.voxtral_tts as tts

    for mod in (vr, tts, nemotron, moshi, mimi):
        monkeypatch.setattr(mod, "remap", boom)
    mlx_speech.load(tmp_path / "o")
    with pytest.raises(AssertionError, match="remapped"):
        mlx_speech.load(src(name))  # the source layouts do go through remap


def test_manifest_names_modules_quantized_differently():
    import mlx.nn as nn

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = [nn.Linear(64, 64) for _ in range(3)]
            self.head = nn.Linear(64, 32)
            self.norm = nn.RMSNorm(64)

    m = M()
    nn.quantize(m, group_size=64, bits=4, class_predicate=lambda p, _: p.startswith("a."))
    nn.quantize(m, group_size=32, bits=8, class_predicate=lambda p, _: p == "head")
    common, overrides = writer_mod._quant_summary(m)
    assert common == {"bits": 4, "group_size": 64, "mode": "affine"}
    assert overrides == {"head": {"bits": 8, "group_size": 32, "mode": "affine"}}
    assert writer_mod._quant_summary(M()) == (None, {})
