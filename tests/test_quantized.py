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
from tests.helpers_tekken import VOXTRAL_AUDIO, write_tekken

Q = Path(__file__).parent / "golden" / "quantized"


def _params(model) -> dict[str, mx.array]:
    return dict(tree_flatten(model.parameters()))


def _assert_same_tensors(a, b) -> None:
    pa, pb = _params(a), _params(b)
    assert sorted(pa) == sorted(pb)
    for k in pa:
        assert pa[k].dtype == pb[k].dtype, k
        assert mx.array_equal(pa[k], pb[k]).item(), k


# -- Voxtral Realtime: mlx-audio and voxmlx layouts ---------------------------------------
VR = Q / "voxtral_realtime"
VR_PROMPT = [1] + [32] * (32 + 6)
VR_LAYOUTS = ["mlx_audio_4bit", "mlx_audio_4bit_keep", "voxmlx_6bit", "voxmlx_8bit"]


@pytest.fixture(scope="module")
def vr_gold():
    return dict(np.load(VR / "golden.npz"))


def vr_folder(tmp_path: Path, name: str) -> Path:
    dest = tmp_path / name
    shutil.copytree(VR / name, dest)
    write_tekken(dest / "tekken.json", [], vocab_size=1100, audio=VOXTRAL_AUDIO)
    return dest


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
    src = tmp_path / "fp32"
    shutil.copytree(VR / "fp32", src)
    write_tekken(src / "tekken.json", [], vocab_size=1100, audio=VOXTRAL_AUDIO)
    ours = mlx_speech.load(src, quantize=4, group_size=64)
    theirs = mlx_speech.load(vr_folder(tmp_path, "mlx_audio_4bit"))
    _assert_same_tensors(ours.model, theirs.model)
    mel = np.random.default_rng(0).standard_normal((128, 8 * 44)).astype(np.float32)
    a1, t1, l1 = vr_run(ours, mel, 44)
    a2, t2, l2 = vr_run(theirs, mel, 44)
    assert t1 == t2 and np.array_equal(l1, l2)


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
    src = tmp_path / "fp32"
    shutil.copytree(VR / "fp32", src)
    write_tekken(src / "tekken.json", [], vocab_size=1100, audio=VOXTRAL_AUDIO)
    for kw in ({"quantize": 5 + 2}, {"quantize": 4, "group_size": 100}):
        with pytest.raises(MlxSpeechError) as e:
            mlx_speech.load(src, **kw)
        assert "\n" not in str(e.value)
