"""Fewer graph nodes, the same numbers: a step's host time is spent per node (building the
graph, or replaying a compiled one), so the transformer block runs on rows, one position
reshapes into heads without a transpose, and loaded Linears read a transposed view made once."""

from __future__ import annotations

import re

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_flatten

from mlx_speech.nn import quant
from mlx_speech.nn.transformer import Block


def node_kinds(tmp_path, *outs: mx.array) -> list[str]:
    """The primitives of the graph that would evaluate `outs` (not yet evaluated)."""
    path = tmp_path / "g.dot"
    mx.export_to_dot(str(path), *outs)
    return re.findall(r'label ="([A-Za-z]+)', path.read_text())


@pytest.fixture
def one_node_kernels(monkeypatch):
    """The mx.fast kernels as one node each, as on Metal / CUDA (on the CPU each is its
    fallback graph, whose own reshapes and transposes would hide the block's)."""

    def one(x, *reads):
        return mx.depends([x], [r for r in reads if isinstance(r, mx.array)])[0]

    monkeypatch.setattr(mx.fast, "rope", lambda x, *a, offset=0, **k: one(x, offset))
    monkeypatch.setattr(mx.fast, "rms_norm", lambda x, w, eps: one(x, w))
    monkeypatch.setattr(mx.fast, "scaled_dot_product_attention",
                        lambda q, k, v, scale, mask=None, **_: one(q, k, v, mask))


def data(*shape: int) -> mx.array:
    x = mx.random.normal(shape)
    mx.eval(x)
    return x


def block(bias: bool = False) -> Block:
    mx.random.seed(3)
    b = Block(32, 4, 2, 8, 64, 10000.0, 1e-5, bias)
    mx.eval(b.parameters())
    return b


def reference(b: Block, x: mx.array, scale: mx.array | None) -> mx.array:
    """The block as written plainly: (B, L, dim) through every op."""
    a = b.attention
    B, L, _ = x.shape
    h = b.attention_norm(x)
    q = (h @ a.wq.weight.T).reshape(B, L, a.n_heads, -1).transpose(0, 2, 1, 3)
    k = (h @ a.wk.weight.T).reshape(B, L, a.n_kv_heads, -1).transpose(0, 2, 1, 3)
    v = (h @ a.wv.weight.T).reshape(B, L, a.n_kv_heads, -1).transpose(0, 2, 1, 3)
    q, k = a.rope(q, 0), a.rope(k, 0)
    o = mx.fast.scaled_dot_product_attention(q, k, v, scale=a.scale, mask="causal"
                                             if L > 1 else None)
    h = x + o.transpose(0, 2, 1, 3).reshape(B, L, -1) @ a.wo.weight.T
    f = b.ffn_norm(h) * (1 if scale is None else scale)
    ff = b.feed_forward
    return h + (nn.silu(f @ ff.w1.weight.T) * (f @ ff.w3.weight.T)) @ ff.w2.weight.T


@pytest.mark.parametrize("B,L", [(1, 1), (3, 1), (2, 5)])
@pytest.mark.parametrize("scaled", [False, True])
def test_block_on_rows_equals_the_plain_block(B, L, scaled):
    b = block()
    x = mx.random.normal((B, L, 32))
    scale = (1 + 0.1 * mx.random.normal((B, 1, 32))) if scaled else None
    mask = "causal" if L > 1 else None
    want = reference(b, x, scale)
    got = b(x, mask, None, scale)
    rows = b(x.reshape(B * L, 32), mask, None, scale, shape=(B, L)).reshape(B, L, 32)
    assert got.shape == (B, L, 32)
    np.testing.assert_array_equal(np.array(got), np.array(want))
    np.testing.assert_array_equal(np.array(rows), np.array(want))


def test_block_builds_no_flatten_and_one_position_no_head_transposes(tmp_path,
                                                                    one_node_kernels):
    b = block()
    kinds = node_kinds(tmp_path, b(data(2, 1, 32)))
    assert "Flatten" not in kinds and "Unflatten" not in kinds
    # the seven weight transposes of mlx's Linear; the heads of one position are reshaped
    assert kinds.count("Transpose") == 7
    kinds = node_kinds(tmp_path, b(data(2, 4, 32), "causal"))
    assert kinds.count("Transpose") == 7 + 4  # q, k, v and the output, for L > 1


def test_quantized_block_keeps_3d_input(tmp_path, one_node_kernels):
    b = block()
    nn.quantize(b, group_size=32, bits=8)
    mx.eval(b.parameters())
    kinds = node_kinds(tmp_path, b(data(2, 1, 32)))
    assert "Flatten" not in kinds and "Transpose" not in kinds
    assert kinds.count("Reshape") == 4  # q, k, v into heads, and the heads out


@pytest.mark.parametrize("bias", [False, True])
def test_transposed_views_drop_the_weight_transpose_and_keep_the_numbers(tmp_path, bias):
    m = nn.Sequential(nn.Linear(16, 24, bias=bias), nn.Linear(24, 8, bias=bias))
    mx.eval(m.parameters())
    x = data(5, 16)
    want = np.array(m(x))
    before = tree_flatten(m.parameters())
    mx.eval(quant.transposed_views(m))
    assert all(type(layer) is quant.Linear for layer in m.layers)
    assert [k for k, _ in tree_flatten(m.parameters())] == [k for k, _ in before]
    kinds = node_kinds(tmp_path, m(x))
    assert "Transpose" not in kinds
    np.testing.assert_array_equal(np.array(m(x)), want)
    # a weight replaced since is read as mlx reads it, and the stale view (of the old weight,
    # which it would keep alive) is dropped
    new = mx.random.normal((24, 16))
    m.layers[0].update({"weight": new})
    got = np.array(m.layers[0](x))
    assert "_t" not in m.layers[0].__dict__ and "_t" in m.layers[1].__dict__
    ref = np.array(x @ new.T + (m.layers[0].bias if bias else 0))
    np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-6)
    assert "Transpose" in node_kinds(tmp_path, m.layers[0](x))


def test_transposed_views_leave_quantized_layers_alone():
    m = nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 64))
    nn.quantize(m, group_size=64, bits=4, class_predicate=lambda p, _: p == "layers.0")
    views = quant.transposed_views(m)
    assert len(views) == 1 and type(m.layers[0]) is nn.QuantizedLinear
