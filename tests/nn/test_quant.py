"""The shared quantization layer (mlx_speech.nn.quant) on a small module tree."""

import mlx.core as mx
import mlx.nn as nn
import pytest
from mlx.utils import tree_flatten

from mlx_speech.errors import CheckpointError, MlxSpeechError
from mlx_speech.nn import quant


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 64)
        self.layers = [nn.Linear(64, 128), nn.Linear(128, 48, bias=False), nn.Linear(48, 64)]
        self.norm = nn.RMSNorm(64)

    def __call__(self, ids):
        x = self.emb(ids)
        for layer in self.layers:
            x = layer(x)
        return self.norm(x)


def _quantized(bits=4, group=32, mode="affine", keep=None):
    mx.random.seed(0)
    m = Tiny()
    quant.quantize(m, bits, group, mode, keep=keep)
    return m, dict(tree_flatten(m.parameters()))


def _reload(weights, **kw):
    m = Tiny()
    quant.quantize_from_weights(m, weights, **kw)
    m.load_weights(list(weights.items()), strict=True)
    return m


def test_quantize_keeps_rule_and_non_divisible_layers():
    m, _ = _quantized(keep=lambda p, _: p == "layers.1")
    assert isinstance(m.emb, nn.QuantizedEmbedding)
    assert isinstance(m.layers[0], nn.QuantizedLinear)
    assert type(m.layers[1]) is nn.Linear  # kept by the rule
    assert type(m.layers[2]) is nn.Linear  # width 48 is not a multiple of 32


@pytest.mark.parametrize("bits,group,mode", [(4, 32, "affine"), (8, 64, "affine"),
                                             (6, 64, "affine"), (4, 32, "mxfp4"),
                                             (4, 16, "nvfp4"), (8, 32, "mxfp8")])
def test_round_trip_infers_params_and_gives_identical_outputs(bits, group, mode):
    m, w = _quantized(bits, group, mode)
    for path in ("emb", "layers.0"):
        got = quant.infer_quantization(w, path, Tiny().emb if path == "emb" else Tiny().layers[0])
        assert got == {"bits": bits, "group_size": group, "mode": mode}
    assert quant.infer_quantization(w, "norm", Tiny().norm) is None
    m2 = _reload(w)
    ids = mx.array([[1, 2, 3]])
    assert mx.array_equal(m(ids), m2(ids))


def test_partly_quantized_file_loads_as_it_is():
    _, w = _quantized(keep=lambda p, _: p == "emb")
    m = _reload(w)
    assert type(m.emb) is nn.Embedding and isinstance(m.layers[0], nn.QuantizedLinear)


def test_dense_weight_dequantizes():
    m, _ = _quantized(8, 64)
    d = quant.dense_weight(m.layers[0])
    assert d.shape == (128, 64) and d.dtype == mx.float32


@pytest.mark.parametrize("edit,msg", [
    (lambda w: w.update({"layers.0.scales": w["layers.0.scales"][:, :1]}), "layers.0"),
    (lambda w: w.update({"layers.0.weight": w["layers.0.weight"][:, :5]}), "layers.0"),
    (lambda w: w.update({"layers.0.weight": w["layers.0.weight"][:7]}), "layers.0.weight"),
    (lambda w: w.pop("layers.0.biases"), "layers.0.biases"),
    (lambda w: w.pop("layers.0.weight"), "layers.0.weight"),
    (lambda w: w.update({"layers.0.weight": w["layers.0.weight"].astype(mx.float32)}),
     "uint32"),
])
def test_bad_quantized_tensors_are_one_line_errors_naming_the_key(edit, msg):
    _, w = _quantized()
    edit(w)
    with pytest.raises(CheckpointError, match=msg) as e:
        quant.quantize_from_weights(Tiny(), w)
    assert "\n" not in str(e.value)


def test_declared_bits_or_group_mismatch_is_an_error():
    _, w = _quantized(4, 32)
    quant.quantize_from_weights(Tiny(), w, expect={"bits": 4, "group_size": 32})
    with pytest.raises(CheckpointError, match="emb is 4-bit group 32.*8-bit group 64"):
        quant.quantize_from_weights(Tiny(), w, expect={"bits": 8, "group_size": 64}, where="f")


@pytest.mark.parametrize("bits,group,mode", [(7, 64, "affine"), (4, 48, "affine"),
                                             (8, 32, "mxfp4"), (4, 64, "int4"),
                                             (True, 64, "affine")])
def test_bad_user_settings(bits, group, mode):
    with pytest.raises(MlxSpeechError) as e:
        quant.quantize(Tiny(), bits, group, mode)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("bits", [4, 8])
def test_many_half_precision_rows_run_a_dense_gemm(bits, monkeypatch):
    """From `DENSE_FROM_ROWS` rows on (CUDA: 32), a quantized Linear with bf16 input
    dequantizes and runs a dense GEMM: the dense layer's result on the dequantized weight.
    Fewer rows, float32 input, and the CPU by default keep mx.quantized_matmul. The limit is
    set for the backend this runs on (the CPU in CI, CUDA on a lent GPU)."""
    m, _ = _quantized(bits=bits)
    lin = m.layers[0]
    assert type(lin) is quant.QuantizedLinear and isinstance(lin, nn.QuantizedLinear)
    calls = []
    real = mx.quantized_matmul
    monkeypatch.setattr(mx, "quantized_matmul", lambda *a, **k: calls.append(1) or real(*a, **k))
    x = mx.random.normal((2, 20, 64)).astype(mx.bfloat16)
    dense = x @ quant.dense_weight(lin).astype(mx.bfloat16).T + lin.bias.astype(mx.bfloat16)
    assert quant.DENSE_FROM_ROWS["cpu"] is None  # the CPU default: never dense
    here = quant.backend()
    monkeypatch.setitem(quant.DENSE_FROM_ROWS, here, None)
    lin(x)
    assert len(calls) == 1
    monkeypatch.setitem(quant.DENSE_FROM_ROWS, here, 32)
    out = lin(x)  # 40 rows
    assert len(calls) == 1 and out.dtype == mx.bfloat16
    assert mx.allclose(out, dense, atol=1e-2, rtol=2e-2).item()
    assert mx.allclose(out.astype(mx.float32), nn.QuantizedLinear.__call__(lin, x).astype(
        mx.float32), atol=5e-2, rtol=5e-2).item()
    lin(x[:1, :31])  # 31 rows
    lin(x.astype(mx.float32))  # float32 input
    assert len(calls) == 4  # and the explicit nn.QuantizedLinear call above
    no_bias = m.layers[1]
    h = mx.random.normal((40, 128)).astype(mx.bfloat16)
    assert mx.allclose(no_bias(h), h @ quant.dense_weight(no_bias).astype(mx.bfloat16).T,
                       atol=1e-2, rtol=2e-2).item()


def test_loaded_quantized_layers_are_ours():
    m, weights = _quantized(bits=8, group=64)
    fresh = Tiny()
    quant.quantize_from_weights(fresh, weights)
    assert type(fresh.layers[0]) is quant.QuantizedLinear
    assert type(fresh.emb) is nn.QuantizedEmbedding
