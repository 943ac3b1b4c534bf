"""What differs between MLX's backends: the GPU emulations (tests/support/gpu_emulation.py) really
behave like the GPU kernels they stand for, and TF32 is off wherever float32 is compared."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from tests import conftest
from tests.support.gpu_emulation import emulated_rope, ordered_ops

ROOT = Path(__file__).resolve().parents[2]


def _rope(x, offset, rope=mx.fast.rope, traditional=True):
    return rope(x, 8, traditional=traditional, base=1e4, scale=1.0, offset=offset)


@pytest.mark.parametrize("traditional", [True, False])
def test_emulated_rope_wraps_negative_positions_like_the_gpu_kernels(traditional):
    x = mx.array(np.random.default_rng(0).standard_normal((3, 2, 4, 8)).astype(np.float32))
    same = lambda a, b: np.array_equal(np.array(a), np.array(b))  # noqa: E731
    emu = lambda x, off: _rope(x, off, emulated_rope, traditional)  # noqa: E731
    cpu = lambda x, off: _rope(x, off, traditional=traditional)  # noqa: E731
    # positions >= 0: exactly the CPU's numbers, scalar or per-row offsets
    assert same(emu(x, 5), cpu(x, 5))
    assert same(emu(x, mx.array([0, 7, 900])), cpu(x, mx.array([0, 7, 900])))
    # the single kernels (one row, one position, one offset) take a signed offset
    assert same(emu(x[:1, :, :1], -5), cpu(x[:1, :, :1], -5))
    # the general kernel adds the offset to an unsigned position: -5 becomes 2**32 - 5,
    # a rotation (pair norms kept) by the wrong angle; rows without a negative one are exact
    k = x[:, :, :1]
    wrong = np.array(emu(k, -5))
    assert not np.allclose(wrong, np.array(cpu(k, -5)), atol=1e-3)
    pairs = lambda a: (a[..., 0::2] ** 2 + a[..., 1::2] ** 2 if traditional  # noqa: E731
                       else a[..., :4] ** 2 + a[..., 4:] ** 2)
    np.testing.assert_allclose(pairs(wrong), pairs(np.array(k)), rtol=1e-4)
    got = np.array(emu(k, mx.array([3, -5, 0])))
    np.testing.assert_allclose(got[[0, 2]], np.array(cpu(k, mx.array([3, 0, 0])))[[0, 2]],
                               atol=1e-5)
    assert not np.allclose(got[1], np.array(cpu(k, mx.array([3, -5, 0])))[1], atol=1e-3)
    # a chunk starting below 0 wraps only its negative positions
    chunk = np.array(emu(x, -2))
    np.testing.assert_allclose(chunk[:, :, 2:], np.array(cpu(x, -2))[:, :, 2:], atol=1e-5)
    assert not np.allclose(chunk[:, :, :2], np.array(cpu(x, -2))[:, :, :2], atol=1e-3)


def test_emulated_rope_refuses_the_launch_cuda_refused():
    """MLX 0.32's CUDA rope sizes its thread block with no cap at 64 in z: one position over
    (4, 156) rows with head_dim 8 failed on an H200 (`cudaGraphAddKernelNode ... invalid
    argument`). The emulation raises there, and passes the real models' head sizes."""
    from tests.support.gpu_emulation import cuda_rope_block

    assert cuda_rope_block((4, 156, 1, 8), 8) == (4, 1, 128)
    with pytest.raises(RuntimeError, match="invalid argument"):
        _rope(mx.zeros((4, 156, 1, 8)), mx.array([1, 2, 3, 4]), emulated_rope)
    for shape in ((4, 156, 1, 64), (4, 156, 1, 128), (64, 32, 1, 128), (4, 8, 40, 8)):
        assert max(cuda_rope_block(shape, shape[-1])[2:]) <= 64, shape
    assert cuda_rope_block((1, 156, 1, 8), 8) == (1, 1, 1)  # the single kernel


def test_no_float64_guard_refuses_every_way_to_make_one(no_float64):
    """On the CPU the guard raises its Float64Error (a ValueError); on a GPU MLX itself raises
    a ValueError with the same words first: either passes."""
    assert issubclass(no_float64, ValueError)
    ok = mx.array(np.arange(3.0))  # numpy float64 in, float32 out: allowed
    assert ok.dtype == mx.float32 and isinstance(ok, mx.array)
    assert isinstance(mx.ones(2) + 1, mx.array)
    for make in (lambda: mx.array(np.zeros(2), dtype=mx.float64),
                 lambda: mx.array([1.0], mx.float64),
                 lambda: mx.zeros(3, dtype=mx.float64),
                 lambda: ok.astype(mx.float64),
                 lambda: mx.astype(ok, mx.float64),
                 lambda: mx.ones(2, mx.int64).view(mx.float64)):
        with pytest.raises(ValueError, match="float64 is not supported on the GPU"):
            make()


@pytest.mark.parametrize("order", ["stable", "reversed", "shuffled"])
def test_ordered_ops_give_valid_results_in_another_order(order):
    argpartition, partition, argsort = ordered_ops(order)
    a = mx.array([[3.0, 1.0, 2.0, 1.0, 5.0, 2.0, 0.0]])
    kth = 3
    idx = np.array(argpartition(a, kth))[0]
    ref = np.array(mx.argpartition(a, kth))[0]
    v = np.array(a)[0]
    assert sorted(idx) == list(range(7))
    assert (v[idx[:kth]] <= v[idx[kth]]).all() and (v[idx[kth + 1:]] >= v[idx[kth]]).all()
    assert v[idx[kth]] == v[ref[kth]]
    np.testing.assert_array_equal(np.array(partition(a, kth))[0], v[idx])
    s = np.array(argsort(a))[0]
    assert (np.diff(v[s]) >= 0).all()
    tied = s[v[s] == 1.0].tolist()
    assert tied == ([1, 3] if order == "stable" else [3, 1])


def test_tf32_is_off_where_float32_is_compared():
    """MLX turns TF32 on by default on CUDA (and for float32 on new Macs) and reads
    MLX_ENABLE_TF32 once, at its first float32 matmul: the tests set it before importing
    MLX, every benchmark before any MLX work."""
    if conftest.TF32_SET_BY_CALLER:
        pytest.skip("MLX_ENABLE_TF32 was set by the caller")
    assert os.environ["MLX_ENABLE_TF32"] == "0"
    for path in sorted((ROOT / "benchmarks").glob("*.py")):
        tree = ast.parse(path.read_text())
        mains = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main"]
        if not mains:
            continue
        body = [n for n in mains[0].body
                if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))]
        first = ast.unparse(body[0])
        assert first == "os.environ.setdefault('MLX_ENABLE_TF32', '0')", path.name


def test_complex_spectra_reach_no_fused_kernel():
    """CUDA's fused kernels (MLX 0.32) cannot take a complex input: Silero's compiled
    `abs(rfft(...))` failed to build on an H200 ("no suitable conversion from complex64_t to
    float"). Every MLX FFT in the package is read at once as float (re, im) pairs through
    `mx.view(..., mx.float32)`, so no complex array reaches another op."""
    calls = 0
    for path in sorted((ROOT / "mlx_speech").rglob("*.py")):
        tree = ast.parse(path.read_text())
        parents = {c: n for n in ast.walk(tree) for c in ast.iter_child_nodes(n)}
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and ast.unparse(node.func).startswith("mx.fft.")):
                continue
            calls += 1
            up = parents.get(node)
            where = f"{path.relative_to(ROOT)}:{node.lineno}"
            assert isinstance(up, ast.Call) and ast.unparse(up.func) == "mx.view", where
            assert up.args[0] is node and ast.unparse(up.args[1]) == "mx.float32", where
    assert calls >= 1  # Silero VAD's STFT


@pytest.mark.skipif(os.environ.get("CI") != "true",
                    reason="CI's own arithmetic: the Linux mlx[cpu] wheel's reference BLAS")
def test_ci_compares_batched_and_alone_bit_for_bit():
    """tests/support/numbers.py compares batched == alone within float rounding only where
    products are not row-exact (GPUs, an optimized BLAS). On CI they are: if a new wheel
    brought another BLAS, these checks would loosen without this failing."""
    from tests.support.numbers import exact_products

    assert exact_products()
