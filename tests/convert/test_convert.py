"""mlx_speech.convert: torch.save files and folders of voices (.nemo: test_nemotron_nemo)."""

from __future__ import annotations

import io
import json
import struct
import zipfile
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from mlx_speech.convert import convert, main
from mlx_speech.errors import CheckpointError, MlxSpeechError


def _header(path: Path) -> dict:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + n])


def _bf16_voice_archive(rows: int, dim: int = 8) -> tuple[bytes, np.ndarray]:
    """A bare bf16 tensor [rows, dim] as torch.save writes it, built without torch."""
    vals = (np.arange(rows * dim, dtype=np.float32).reshape(rows, dim) - 7) / 4  # exact in bf16
    bits = (vals.view(np.uint32) >> 16).astype("<u2")
    glob = lambda m, n: b"c" + f"{m}\n{n}\n".encode()  # noqa: E731
    text = lambda t: b"X" + struct.pack("<I", len(t)) + t.encode()  # noqa: E731
    num = lambda i: b"J" + struct.pack("<i", i)  # noqa: E731
    pkl = (b"\x80\x02" + glob("torch._utils", "_rebuild_tensor_v2")
           + b"((" + text("storage") + glob("torch", "BFloat16Storage") + text("0") + text("cpu")
           + num(rows * dim) + b"tQ" + num(0) + b"(" + num(rows) + num(dim) + b"t"
           + b"(" + num(dim) + num(1) + b"t" + b"\x89" + glob("collections", "OrderedDict")
           + b")RtR.")
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("voice_embed/data.pkl", pkl)
        z.writestr("voice_embed/byteorder", "little")
        z.writestr("voice_embed/data/0", bits.tobytes())
    return buf.getvalue(), vals


def test_bare_tensor_voice_without_torch(tmp_path):
    raw, vals = _bf16_voice_archive(5)
    (tmp_path / "casual_male.pt").write_bytes(raw)
    out = tmp_path / "casual_male.safetensors"
    assert convert(tmp_path / "casual_male.pt", out, progress=False) == [out]
    got = mx.load(str(out))
    assert list(got) == ["embedding"] and got["embedding"].dtype == mx.bfloat16
    np.testing.assert_array_equal(np.array(got["embedding"].astype(mx.float32)), vals)
    assert _header(out)["__metadata__"] == {"format": "pt"}


def test_same_input_same_bytes(tmp_path):
    raw, _ = _bf16_voice_archive(3)
    (tmp_path / "v.pt").write_bytes(raw)
    convert(tmp_path / "v.pt", tmp_path / "a.safetensors", progress=False)
    convert(tmp_path / "v.pt", tmp_path / "b.safetensors", progress=False)
    assert (tmp_path / "a.safetensors").read_bytes() == (tmp_path / "b.safetensors").read_bytes()


def test_state_dicts_keep_names_and_dtypes(tmp_path, capsys):
    torch = pytest.importorskip("torch")
    sd = {"embeddings": torch.randn(4, 1, 1, 16).to(torch.bfloat16),  # PersonaPlex voice layout
          "cache": torch.arange(68).reshape(1, 17, 4),
          "nested": {"w": torch.randn(3, 2).T.half(), "list": [torch.ones(2, dtype=torch.float64)]},
          "step": 7}
    torch.save(sd, tmp_path / "NATF0.pt")
    (out,) = convert(tmp_path / "NATF0.pt", tmp_path / "out", progress=False)
    assert out == tmp_path / "out" / "NATF0.safetensors"
    got = mx.load(str(out))
    assert set(got) == {"embeddings", "cache", "nested.w", "nested.list.0"}
    dtypes = {k: v["dtype"] for k, v in _header(out).items() if k != "__metadata__"}
    assert dtypes == {"embeddings": "BF16", "cache": "I64", "nested.w": "F16",
                      "nested.list.0": "F32"}  # mx.load cannot read F64: said on stderr
    assert "1 float64 tensor(s) as float32 (nested.list.0)" in capsys.readouterr().err
    np.testing.assert_array_equal(np.array(got["embeddings"].astype(mx.float32)),
                                  sd["embeddings"].float().numpy())
    np.testing.assert_array_equal(np.array(got["cache"]), sd["cache"].numpy())
    np.testing.assert_array_equal(np.array(got["nested.w"]), sd["nested"]["w"].numpy())
    # torch's own save of the same data converts to the same bytes again
    torch.save(sd, tmp_path / "again.pt")
    (again,) = convert(tmp_path / "again.pt", tmp_path / "again.safetensors", progress=False)
    assert again.read_bytes() == out.read_bytes()


def test_bare_torch_tensor_is_embedding(tmp_path):
    torch = pytest.importorskip("torch")
    t = torch.randn(6, 12).to(torch.bfloat16)
    torch.save(t, tmp_path / "neutral_female.pt")
    (out,) = convert(tmp_path / "neutral_female.pt", tmp_path / "nf.safetensors")
    e = mx.load(str(out))["embedding"]
    assert e.dtype == mx.bfloat16 and e.shape == (6, 12)
    np.testing.assert_array_equal(np.array(e.astype(mx.float32)), t.float().numpy())


def test_folder_of_voices(tmp_path, capsys):
    src = tmp_path / "voice_embedding"
    src.mkdir()
    for name, rows in (("ar_male", 2), ("fr_female", 3), ("de_male", 4)):
        (src / f"{name}.pt").write_bytes(_bf16_voice_archive(rows)[0])
    (src / "README.md").write_text("not a voice")
    assert main([str(src), str(tmp_path / "out")]) == 0
    out = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert out == ["ar_male.safetensors", "de_male.safetensors", "fr_female.safetensors"]
    assert mx.load(str(tmp_path / "out" / "fr_female.safetensors"))["embedding"].shape == (3, 8)
    assert "wrote 3 files" in capsys.readouterr().err


@pytest.mark.parametrize("setup,args,needle", [
    (lambda d: None, ["missing.pt", "o.safetensors"], "no such file or folder"),
    (lambda d: (d / "x.pt").write_text("hello"), ["x.pt", "o.safetensors"],
     "not a torch zip archive"),
    (lambda d: (d / "x.onnx").write_text("hello"), ["x.onnx", "o"], "don't know how to convert"),
    (lambda d: (d / "empty").mkdir(), ["empty", "o"], "no .pt/.pth/.ckpt/.bin files"),
    (lambda d: (d / "v.pt").write_bytes(_bf16_voice_archive(2)[0]),
     ["v.pt", "nofolder/o.safetensors"], "folder .*nofolder does not exist"),
    (lambda d: ((d / "v.pt").write_bytes(_bf16_voice_archive(2)[0]), (d / "f").write_text("")),
     ["v.pt", "f/sub"], "cannot create folder"),
    (lambda d: ((d / "vs").mkdir(), (d / "vs" / "a.pt").write_bytes(b"PK junk")),
     ["vs", "out.safetensors"], "must be a folder"),
])
def test_errors_are_one_line(tmp_path, capsys, monkeypatch, setup, args, needle):
    monkeypatch.chdir(tmp_path)
    setup(tmp_path)
    assert main(args) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and len(err.splitlines()) == 1
    assert pytest.importorskip("re").search(needle, err), err


def test_bad_file_in_a_folder_is_named(tmp_path):
    (tmp_path / "a.pt").write_bytes(_bf16_voice_archive(2)[0])
    (tmp_path / "b.pt").write_text("junk")
    with pytest.raises(CheckpointError, match="b.pt is not a torch zip archive"):
        convert(tmp_path, tmp_path / "out", progress=False)


def test_pickled_code_in_a_voice_is_refused(tmp_path):
    payload = b"\x80\x02cposix\nsystem\n(X\x04\x00\x00\x00trueo."
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("archive/data.pkl", payload)
    (tmp_path / "evil.pt").write_bytes(buf.getvalue())
    with pytest.raises(MlxSpeechError, match="refusing to load posix.system"):
        convert(tmp_path / "evil.pt", tmp_path / "evil.safetensors")
    assert not (tmp_path / "evil.safetensors").exists()
