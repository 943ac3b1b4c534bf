"""`.nemo` archives: torch-free reading (no pickled code runs), NeMo -> transformers
names and config, and the same tokens as the transformers-layout checkpoint."""

from __future__ import annotations

import io
import json
import pickle
import zipfile
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from mlx_speech.convert.nemo import convert_nemo
from mlx_speech.errors import CheckpointError
from mlx_speech.models.nemo.checkpoint import read_state_dict
from mlx_speech.models.nemotron_streaming import load
from mlx_speech.models.nemotron_streaming.weights import hf_name
from tests.support import nemo as nemo_helpers
from tests.support.nemo import nemo_config

GOLDEN = Path(__file__).parents[2] / "golden" / "nemotron"
nemo_file = nemo_helpers.nemo_file  # the fixture: a tiny .nemo archive


def test_nemo_names_map_to_transformers():
    assert hf_name("encoder.pre_encode.conv.5.weight") == \
        "encoder.subsampling.layers.1.depthwise_conv.weight"
    assert hf_name("joint.joint_net.2.bias") == "joint.head.bias"
    assert hf_name("encoder.layers.3.self_attn.pos_bias_u") == "encoder.layers.3.self_attn.bias_u"
    assert hf_name("preprocessor.featurizer.fb") is None
    with pytest.raises(CheckpointError, match="pre_encode.conv.4"):
        hf_name("encoder.pre_encode.conv.4.weight")


def test_nemo_archive_gives_the_reference_tokens(nemo_file):
    g = np.load(GOLDEN / "golden.npz")
    m = load(nemo_file)
    assert m.config.encoder.left_context == 14 and not m.config.encoder.scale_input
    for ms, r in ((1120, 13), (80, 0)):
        assert m.transcribe(g["audio"], latency_ms=ms).token_ids == \
            [int(t) for t in g[f"tokens_r{r}"]]


def test_convert_nemo_writes_a_transformers_folder(nemo_file, tmp_path):
    out = convert_nemo(nemo_file, tmp_path / "hf")
    assert {p.name for p in out.iterdir()} == {"config.json", "model.safetensors",
                                               "tokenizer.model"}
    ref, got = mx.load(str(GOLDEN / "model.safetensors")), mx.load(str(out / "model.safetensors"))
    assert ref.keys() == got.keys()
    assert all(mx.array_equal(ref[k], got[k]).item() for k in ref)
    g = np.load(GOLDEN / "golden.npz")
    assert load(out).transcribe(g["audio"], latency_ms=160).token_ids == \
        [int(t) for t in g["tokens_r1"]]


def _zip_pickle(payload: bytes) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("archive/data.pkl", payload)
    return buf.getvalue()


class _Evil:
    def __reduce__(self):
        import os

        return (os.system, ("echo pwned > /dev/null",))


def test_pickled_code_is_refused():
    with pytest.raises(CheckpointError, match="refusing to load"):
        read_state_dict(_zip_pickle(pickle.dumps({"a": _Evil()}, protocol=2)))
    with pytest.raises(CheckpointError, match="not a torch zip"):
        read_state_dict(b"\x80\x02}q\x00.")


def test_bf16_and_strided_tensors_round_trip():
    torch = pytest.importorskip("torch")
    sd = {"a": torch.randn(3, 4).T, "b": torch.randn(5).to(torch.bfloat16),
          "c": torch.arange(6).reshape(2, 3)[:, 1:]}
    buf = io.BytesIO()
    torch.save(sd, buf)
    got = read_state_dict(buf.getvalue())
    np.testing.assert_array_equal(np.array(got["a"]), sd["a"].numpy())
    assert got["b"].dtype == mx.bfloat16
    np.testing.assert_array_equal(np.array(got["b"].astype(mx.float32)), sd["b"].float().numpy())
    np.testing.assert_array_equal(np.array(got["c"]), sd["c"].numpy())


def test_unsupported_nemo_settings_are_named(tmp_path):
    from mlx_speech.models.nemotron_streaming.weights import hf_config

    hf = json.loads((GOLDEN / "config.json").read_text())
    cfg = nemo_config(hf)
    cfg["encoder"]["att_context_style"] = "regular"
    with pytest.raises(CheckpointError, match="att_context_style"):
        hf_config(cfg)
    bad = tmp_path / "x.nemo"
    bad.write_bytes(b"not a tar")
    with pytest.raises(CheckpointError, match="x.nemo"):
        load(bad)


def test_convert_cli_and_transcribe_a_nemo_archive(nemo_file, tmp_path):
    import os
    import subprocess
    import sys

    import soundfile as sf

    import mlx_speech

    root = Path(__file__).resolve().parents[3]
    env = dict(os.environ, PYTHONPATH=str(root))

    def run(*args):
        return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True,
                              env=env, stdin=subprocess.DEVNULL, timeout=300)

    r = run("mlx_speech", "convert", str(nemo_file), str(tmp_path / "out"))
    assert r.returncode == 0, r.stderr
    wav = tmp_path / "a.wav"
    sf.write(wav, np.load(GOLDEN / "golden.npz")["audio"], 16000)
    ref = mlx_speech.load(GOLDEN).transcribe(str(wav), latency_ms=160)
    for model in (tmp_path / "out", nemo_file):
        r = run("mlx_speech.transcribe", str(wav), "--model", str(model), "--latency-ms", "160",
                "--format", "json")
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["text"] == ref.text
    # --delay-ms is --latency-ms's older name; 480 is a Voxtral delay, not a Nemotron mode
    r = run("mlx_speech.transcribe", str(wav), "--model", str(nemo_file), "--delay-ms", "480")
    assert r.returncode == 1 and "latency is one of 80, 160, 560, 1120 ms, got 480" in r.stderr
    r = run("mlx_speech", "convert", str(wav), str(tmp_path / "x"))
    assert r.returncode == 1 and "supported: .nemo" in r.stderr
