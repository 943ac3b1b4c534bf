"""Published quantized layouts load strictly and match their producers (committed goldens made by
tests/golden/make_quantized_*.py with mlx-audio / voxmlx / moshi_mlx), and on-the-fly
quantization gives exactly the tensors of the published file made from the same bf16 weights."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_flatten

import mlx_speech
from mlx_speech.errors import CheckpointError, MlxSpeechError
from tests.support.quantized import (
    MOSHI,
    NEMO,
    PP_KW,
    TTS_CKPT,
    VR,
    Q,
    moshi_folder,
    tts_folder,
    vr_folder,
    write_personaplex_mlx,
)


@pytest.fixture(scope="module")
def goldens():
    """The producers' recorded outputs, per family folder."""
    return {d.name: dict(np.load(d / "golden.npz")) for d in Q.iterdir() if d.is_dir()}


@pytest.fixture
def vr_gold(goldens):
    return goldens["voxtral_realtime"]


@pytest.fixture
def moshi_gold(goldens):
    return goldens["moshi"]


@pytest.fixture
def tts_gold(goldens):
    return goldens["voxtral_tts"]


def _params(model) -> dict[str, mx.array]:
    return dict(tree_flatten(model.parameters()))


def _assert_same_tensors(a, b, any_dtype: str = "") -> None:
    """Same names, dtypes and values (`any_dtype`: a name part whose dtype may differ)."""
    pa, pb = _params(a), _params(b)
    assert sorted(pa) == sorted(pb)
    for k in pa:
        assert pa[k].dtype == pb[k].dtype or (any_dtype and any_dtype in k), k
        assert mx.array_equal(pa[k], pb[k]).item(), k


# -- Voxtral Realtime: mlx-audio and voxmlx layouts ---------------------------------------
VR_PROMPT = [1] + [32] * (32 + 6)
VR_LAYOUTS = ["mlx_audio_4bit", "mlx_audio_4bit_keep", "voxmlx_6bit", "voxmlx_8bit"]


def vr_run(asr, mel: np.ndarray, n_tokens: int):
    """Adapter output and greedy teacher-forced decoding, as the generator runs the peers."""
    model = asr.model
    a = model.embed_audio(mx.array(mel.T)[None])
    scales = model.ffn_scales(6)
    tokens = list(VR_PROMPT)

    def logits(t):
        return model(mx.array(t)[None], a[:, : len(t)], scales)[0]

    while len(tokens) < n_tokens:
        tokens.append(int(mx.argmax(logits(tokens)[-1]).item()))
    out = logits(tokens)[len(VR_PROMPT) - 1:]
    return a[0], tokens[len(VR_PROMPT):], np.array(out.astype(mx.float32))


@pytest.mark.parametrize("name", VR_LAYOUTS)
def test_voxtral_realtime_layouts_match_their_producer(name, vr_gold, tmp_path):
    asr = mlx_speech.load(vr_folder(tmp_path, name))
    q = [p for p, m in tree_flatten(asr.model.leaf_modules(), is_leaf=nn.Module.is_module)
         if isinstance(m, (nn.QuantizedLinear, nn.QuantizedEmbedding))]
    assert ("tok_embeddings" in q) == (name != "mlx_audio_4bit_keep")
    mel = vr_gold["mel"].astype(np.float32)
    want = vr_gold[f"{name}/tokens"]
    a, tokens, logits = vr_run(asr, mel, len(VR_PROMPT) + len(want))
    np.testing.assert_allclose(np.array(a.astype(mx.float32)), vr_gold[f"{name}/adapter"],
                               atol=1e-5, rtol=0)
    assert tokens == list(want)
    np.testing.assert_allclose(logits, vr_gold[f"{name}/logits"], atol=1e-5, rtol=0)


def test_voxtral_realtime_on_the_fly_equals_mlx_audio_file(tmp_path):
    src = vr_folder(tmp_path, "fp32")
    ours = mlx_speech.load(src, quantize=4, group_size=64)
    theirs = mlx_speech.load(vr_folder(tmp_path, "mlx_audio_4bit"))
    _assert_same_tensors(ours.model, theirs.model)
    mel = np.random.default_rng(0).standard_normal((128, 8 * 44)).astype(np.float32)
    a1, t1, l1 = vr_run(ours, mel, 44)
    a2, t2, l2 = vr_run(theirs, mel, 44)
    assert t1 == t2 and np.array_equal(l1, l2)


def test_voxtral_realtime_mlx_audio_fp16_layout(tmp_path):
    src = vr_folder(tmp_path, "fp32")
    _assert_same_tensors(mlx_speech.load(vr_folder(tmp_path, "mlx_audio_fp16")).model,
                         mlx_speech.load(src, dtype=mx.float16).model)


def test_voxtral_realtime_declared_bits_must_match_the_tensors(tmp_path):
    folder = vr_folder(tmp_path, "voxmlx_6bit")
    cfg = json.loads((folder / "config.json").read_text())
    cfg["quantization"]["bits"] = 4
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=r"is 6-bit group 64.*says 4-bit") as e:
        mlx_speech.load(folder)
    assert str(folder) in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("edit,msg", [
    (("scales",), r"layers\.0\.attention\.wq\.biases has shape"),
    (("scales", "biases"), r"layers\.0\.attention\.wq is 4-bit group 32.*says 4-bit group 64"),
    (("weight",), r"layers\.0\.attention\.wq: weight \(64, 5\)"),
])
def test_voxtral_realtime_bad_quantized_tensors(edit, msg, tmp_path):
    folder = vr_folder(tmp_path, "mlx_audio_4bit")
    f = folder / "model.safetensors"
    w = dict(mx.load(str(f)))
    for part in edit:
        k = f"decoder.layers.0.attention.wq.{part}"
        w[k] = mx.concatenate([w[k], w[k]], axis=1) if part != "weight" else w[k][:, :5]
    mx.save_safetensors(str(f), w)
    with pytest.raises(CheckpointError, match=msg) as e:
        mlx_speech.load(folder)
    assert str(folder) in str(e.value) and "\n" not in str(e.value)


def test_truncated_quantized_file_is_one_line_error(tmp_path):
    folder = vr_folder(tmp_path, "mlx_audio_4bit")
    f = folder / "model.safetensors"
    data = f.read_bytes()
    f.write_bytes(data[: len(data) * 2 // 3])
    with pytest.raises(CheckpointError) as e:
        mlx_speech.load(folder)
    assert "model.safetensors" in str(e.value) or str(folder) in str(e.value)
    assert "\n" not in str(e.value)


def test_bad_quantize_settings_are_one_line_errors(tmp_path):
    src = vr_folder(tmp_path, "fp32")
    for kw in ({"quantize": 5 + 2}, {"quantize": 4, "group_size": 100}):
        with pytest.raises(MlxSpeechError) as e:
            mlx_speech.load(src, **kw)
        assert "\n" not in str(e.value)


# -- Moshi: Kyutai's moshi_mlx files (model.safetensors / model.q4 / model.q8) --------------
MOSHI_FILES = ["model.safetensors", "model.q4.safetensors", "model.q8.safetensors"]


def moshi_run(lm, text, audio):
    """Step the LM over fixed inputs; greedy text and depformer tokens, text logits."""
    state = lm.make_state(1)
    logits, text_out, audio_out = [], [], []
    for t in range(len(text)):
        tok = mx.array([[text[t]] + [a[t] for a in audio]], dtype=mx.int32)[..., None]
        z, lg = lm.forward_tokens(tok, state)
        prev = mx.argmax(lg[:, -1], axis=-1)
        logits.append(np.array(lg[0, -1].astype(mx.float32)))
        text_out.append(int(prev.item()))
        state.dep.reset()
        row = []
        for k in range(lm.config.dep_q):
            prev = mx.argmax(lm.depformer_logits(k, prev, z, state.dep), axis=-1)
            row.append(int(prev.item()))
        audio_out.append(row)
    return np.stack(logits), text_out, audio_out


@pytest.mark.parametrize("name", MOSHI_FILES)
def test_moshi_mlx_files_match_moshi_mlx(name, moshi_gold, tmp_path):
    d = mlx_speech.load(moshi_folder(tmp_path, name))
    assert isinstance(d.lm.text_emb, nn.QuantizedEmbedding) == (name != "model.safetensors")
    assert type(d.mimi.quantizer).__name__ == "SplitResidualVQ"  # Mimi is never quantized
    logits, text, audio = moshi_run(d.lm, moshi_gold["text_in"].tolist(),
                                    moshi_gold["audio_in"].tolist())
    assert text == moshi_gold[f"{name}/text_tokens"].tolist()
    assert audio == moshi_gold[f"{name}/audio_tokens"].tolist()
    np.testing.assert_allclose(logits, moshi_gold[f"{name}/text_logits"], atol=1e-4, rtol=0)


@pytest.mark.parametrize("bits,group", [(4, 32), (8, 64)])
def test_moshi_on_the_fly_equals_kyutai_file(bits, group, moshi_gold, tmp_path):
    ours = mlx_speech.load(moshi_folder(tmp_path, "model.safetensors"), quantize=bits,
                           group_size=group)
    theirs = mlx_speech.load(moshi_folder(tmp_path, f"model.q{bits}.safetensors"))
    _assert_same_tensors(ours.lm, theirs.lm)
    args = moshi_gold["text_in"].tolist(), moshi_gold["audio_in"].tolist()
    a, b = moshi_run(ours.lm, *args), moshi_run(theirs.lm, *args)
    assert a[1:] == b[1:] and np.array_equal(a[0], b[0])


def test_moshi_minus_one_is_zero_when_quantized(tmp_path):
    d = mlx_speech.load(moshi_folder(tmp_path, "model.q4.safetensors"))
    tok = mx.full((1, 1 + d.lm.config.n_q, 1), -1, dtype=mx.int32)
    assert not mx.any(d.lm.embed_tokens(tok)).item()


def test_kyutai_file_name_bits_must_match_the_tensors(tmp_path):
    folder = moshi_folder(tmp_path, "model.q4.safetensors")
    (folder / "model.q4.safetensors").rename(folder / "model.q8.safetensors")
    shutil.copy(MOSHI / "model.q4.safetensors", folder / "model.q8.safetensors")
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(cfg | {"moshi_name": "model.q8.safetensors"}))
    with pytest.raises(CheckpointError, match=r"model\.q8\.safetensors: .*is 4-bit group 32.*"
                                              r"says 8-bit group 64") as e:
        mlx_speech.load(folder)
    assert "\n" not in str(e.value)


# -- Voxtral TTS: mlx-audio / mlx-community layout ----------------------------------------
@pytest.mark.parametrize("name", ["mlx_4bit", "mlx_6bit"])
def test_voxtral_tts_mlx_community_layout_matches_mlx_audio(name, tts_gold, tmp_path):
    tts = mlx_speech.load(tts_folder(tmp_path, name), alibi="mlxa")
    m = tts.model
    assert isinstance(m.tok_embeddings, nn.QuantizedEmbedding)
    assert type(m.audio_codebook_embeddings.embeddings) is nn.Embedding
    assert isinstance(m.acoustic_transformer.input_projection, nn.Linear)  # width 4: kept
    voice, text = str(tts_gold["voice"]), str(tts_gold["text"])
    ids = tts.prompt_ids(text, 5)
    assert ids == tts_gold["ids"].tolist()
    h = m.hidden(m.embed_prompt(ids, tts._voices[voice], tts.ids["audio"]))[0, -1]
    np.testing.assert_allclose(np.array(h), tts_gold[f"{name}/h0"], atol=1e-5)
    want = tts_gold[f"{name}/codes"]
    args = dict(text=text, voice=voice, max_frames=len(want), seed=int(tts_gold["seed"]))
    np.testing.assert_array_equal(tts.codes(**args), want)
    wav = tts.generate(**args).samples
    np.testing.assert_allclose(wav, tts_gold[f"{name}/wav"], atol=1e-4)


def test_voxtral_tts_on_the_fly_equals_mlx_audio_file(tmp_path):
    from mlx_speech.models import voxtral_tts as vt

    ours = vt.load(TTS_CKPT, dtype=mx.float32, quantize=4, group_size=64)
    theirs = vt.load(tts_folder(tmp_path, "mlx_4bit"))
    # the codec's semantic codebook stays as stored (fp16 in the Mistral folder)
    _assert_same_tensors(ours.model, theirs.model, any_dtype=".quantizer.")
    args = dict(text="Hi there.", voice="neutral_female", max_frames=4, seed=1)
    np.testing.assert_array_equal(ours.codes(**args), theirs.codes(**args))


# -- Nemotron: NeMo-named MLX layout (mlx-audio's nemotron_asr export) -------------------------
NEMO_SRC = Path(__file__).parents[1] / "golden" / "nemotron"


@pytest.mark.parametrize("name", ["fp32", "q8", "q4"])
def test_nemotron_nemo_mlx_layout_matches_mlx_audio(name):
    asr = mlx_speech.load(NEMO / name)
    assert isinstance(asr.model.encoder_projector, nn.QuantizedLinear) == (name != "fp32")
    audio = np.load(NEMO_SRC / "golden.npz")["audio"]
    tokens = asr.transcribe(audio).token_ids
    want = np.load(NEMO / "golden.npz")[f"{name}/tokens"].tolist()
    assert [t for t in tokens if t != 0] == want  # mlx-audio leaves <unk> (0) out


def _fold_lstm_biases(model) -> None:
    """The MLX export stores bias_ih + bias_hh as one vector: compare in that form."""
    lstm = model.decoder.lstm
    for i in range(model.config.num_decoder_layers):
        b = getattr(lstm, f"bias_ih_l{i}") + getattr(lstm, f"bias_hh_l{i}")
        setattr(lstm, f"bias_ih_l{i}", b)
        setattr(lstm, f"bias_hh_l{i}", mx.zeros_like(b))


def test_nemotron_nemo_mlx_layout_gives_the_same_tensors():
    ref = mlx_speech.load(NEMO_SRC).model
    _fold_lstm_biases(ref)
    _assert_same_tensors(mlx_speech.load(NEMO / "fp32").model, ref)
    on_the_fly = mlx_speech.load(NEMO_SRC, quantize=8, group_size=32).model
    _fold_lstm_biases(on_the_fly)
    _assert_same_tensors(mlx_speech.load(NEMO / "q8").model, on_the_fly)


# -- command lines ------------------------------------------------------------------------
def test_transcribe_quantize_flag_runs(tmp_path, capsys):
    import soundfile as sf

    from mlx_speech import transcribe
    from tests.conftest import speechlike

    src = vr_folder(tmp_path, "fp32")
    wav = tmp_path / "a.wav"
    sf.write(wav, speechlike(1.5), 16000)
    want = mlx_speech.load(src, quantize=4, group_size=32).transcribe(str(wav)).text
    assert transcribe.main([str(wav), "--model", str(src), "--quantize", "4",
                            "--group-size", "32"]) == 0
    assert capsys.readouterr().out == want + "\n"
    with pytest.raises(SystemExit):
        transcribe.main([str(wav), "--model", str(src), "--quantize", "7"])


@pytest.mark.parametrize("cli", ["transcribe", "say", "chat"])
def test_clis_pass_quantize_to_load(cli, monkeypatch, capsys, tmp_path):
    import importlib

    seen = {}

    def fake_load(path, **kw):
        seen.update(kw)
        raise MlxSpeechError("stop here")

    import soundfile as sf

    monkeypatch.setattr(mlx_speech, "load", fake_load)
    mod = importlib.import_module(f"mlx_speech.{cli}")
    wav = tmp_path / "in.wav"  # inputs are checked (decoded) before any load
    sf.write(wav, np.zeros(1600, np.float32), 16000)
    first = {"say": ["hi", "-o", str(tmp_path / "x.wav")], "chat": ["--input", str(wav)],
             "transcribe": [str(wav)]}
    argv = first[cli] + ["--model", "x", "--quantize", "8", "--group-size", "128"]
    assert mod.main(argv) == 1
    assert {k: seen[k] for k in ("quantize", "group_size")} == {"quantize": 8, "group_size": 128}
    assert "stop here" in capsys.readouterr().err


# -- PersonaPlex: the community MLX layout (split files, flat in_proj_* quantization) ------------
# Written here by its key scheme (no reference implementation runs in Python): temporal /
# depformer files hold their part without the `transformer.` / `depformer.` prefix, the
# attention, FFN and (flat) fused in_proj weights whose width divides by the group are
# quantized with min/max affine scales (fp16 scales and biases), everything stored as fp16.
@pytest.fixture
def tiny_mimi_config(monkeypatch):
    """The community layout's Mimi is the 7B's (config fixed); ours is the tiny golden one."""
    import functools

    from mlx_speech.models import mimi as mimi_pkg
    from tests.support.moshi import GOLDEN

    cfg = json.loads((GOLDEN / "mimi24k_config.json").read_text())
    cfg["quantizer"]["bins"] = PP_KW["card"]
    monkeypatch.setattr(mimi_pkg, "load", functools.partial(mimi_pkg.load, config=cfg))


@pytest.mark.parametrize("bits,first", [(4, False), (8, False), (4, True)])
def test_personaplex_mlx_layout_equals_its_dequantized_weights(bits, first, tmp_path,
                                                               tiny_mimi_config):
    from tests.support.moshi import build_random_lm, kyutai_weights, random_lm_kwargs

    kyutai = kyutai_weights(build_random_lm(random_lm_kwargs(**PP_KW), seed=1))
    folder, ref = write_personaplex_mlx(tmp_path / f"pp{bits}", kyutai, bits, 64, first)
    d = mlx_speech.load(folder)
    assert d.roles and d.config.dep_q == 16
    at = d.lm.transformer.layers[0]
    flat = isinstance(at.self_attn.in_projs[0], nn.QuantizedLinear)  # flat in_proj_*
    assert flat == (not first)
    assert isinstance(at.self_attn.out_projs[0], nn.QuantizedLinear)
    assert isinstance(at.gating.linear_out, nn.Linear)  # width 176: not quantized in the file
    dep = d.lm.depformer.layers[0].self_attn.in_projs[15]
    assert isinstance(dep, nn.QuantizedLinear) == (not first)
    assert type(d.lm.text_emb) is nn.Embedding and isinstance(d.lm.linears[0], nn.Linear)
    r = mlx_speech.load(ref)
    rng = np.random.default_rng(2)
    text, audio = rng.integers(0, 50, 6).tolist(), rng.integers(0, 64, (16, 6)).tolist()
    (l1, t1, a1), (l2, t2, a2) = moshi_run(d.lm, text, audio), moshi_run(r.lm, text, audio)
    assert (t1, a1) == (t2, a2)
    np.testing.assert_allclose(l1, l2, atol=2e-3, rtol=0)


def test_personaplex_mlx_layout_missing_file(tmp_path):
    from tests.support.moshi import build_random_lm, kyutai_weights, random_lm_kwargs

    kyutai = kyutai_weights(build_random_lm(random_lm_kwargs(**PP_KW), seed=1))
    folder, _ = write_personaplex_mlx(tmp_path / "pp", kyutai, 4, 64)
    (folder / "depformer.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"no depformer file \(depformer\.safetensors\)"):
        mlx_speech.load(folder)


@pytest.mark.parametrize("name,key,msg", [
    ("mlx_audio_4bit", "encoder.conv_layers_0_conv.conv.scales",
     r"conv_layers\.0\.conv\.scales: Conv1d"),  # a module that cannot be quantized
    ("voxmlx_6bit", "language_model.layers.0.mystery.scales",
     r"language_model\.layers\.0\.mystery\.scales"),  # an unknown key
])
def test_stray_scales_are_named(name, key, msg, tmp_path):
    folder = vr_folder(tmp_path, name)
    f = folder / "model.safetensors"
    mx.save_safetensors(str(f), dict(mx.load(str(f))) | {key: mx.zeros((64, 1))})
    with pytest.raises(CheckpointError, match=msg) as e:
        mlx_speech.load(folder)
    assert "\n" not in str(e.value)


# -- live re-checks: the producers still give the committed goldens ---------------------------
GEN = Path(__file__).parents[1] / "golden"


def _regenerate(script: str, out: Path, extra_path: str = "") -> dict:
    import os
    import subprocess
    import sys

    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (extra_path, root, env.get("PYTHONPATH"))
                                        if p)
    r = subprocess.run([sys.executable, str(GEN / script), str(out)], capture_output=True,
                       text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    return dict(np.load(out / "golden.npz"))


def _same_goldens(fresh: dict, committed: dict) -> None:
    assert sorted(fresh) == sorted(committed)
    for k, v in committed.items():
        if v.dtype.kind in "iu":
            np.testing.assert_array_equal(fresh[k], v, err_msg=k)
        elif v.dtype.kind == "f":
            np.testing.assert_allclose(fresh[k], v, atol=1e-5, err_msg=k)


@pytest.mark.reference
def test_live_voxtral_realtime_producers(tmp_path):
    pytest.importorskip("mlx_audio.stt.models.voxtral_realtime")
    import importlib.util
    import os

    site = os.environ.get("VOXMLX_PATH", "/tmp/quant-site")
    if importlib.util.find_spec("voxmlx") is None and not (Path(site) / "voxmlx").is_dir():
        pytest.skip("voxmlx not installed (pip install --target DIR voxmlx==0.0.2)")
    _same_goldens(_regenerate("make_quantized_voxtral_realtime.py", tmp_path, site),
                  dict(np.load(VR / "golden.npz")))



@pytest.mark.reference
@pytest.mark.parametrize("family,producer", [
    ("moshi", "moshi_mlx"), ("voxtral_tts", "mlx_audio.tts.models.voxtral_tts"),
    ("nemotron", "mlx_audio.stt.models.nemotron_asr")])
def test_live_producers(family, producer, goldens, tmp_path):
    pytest.importorskip(producer)
    _same_goldens(_regenerate(f"make_quantized_{family}.py", tmp_path), goldens[family])


def test_kyutai_mlx_folder_without_config_picks_the_quantized_file(tmp_path):
    """kyutai/moshiko-mlx-q4 has no config.json: the Moshi 7B config and model.q4.safetensors
    (here a tiny file, so the 7B config refuses it by name)."""
    from mlx_speech.hub import MIMI_FILE
    from mlx_speech.models.moshi import weight_patterns

    d = moshi_folder(tmp_path, "model.q4.safetensors")
    (d / "config.json").unlink()
    (d / "codec.safetensors").rename(d / MIMI_FILE)
    (d / "tok.model").rename(d / "tokenizer_spm_32k_3.model")
    assert "model.q4.safetensors" in weight_patterns(d)
    with pytest.raises(CheckpointError, match=r"model\.q4\.safetensors: config says dep_q=8"):
        mlx_speech.load(d)
