"""Shared layers: ring KV cache, re-anchoring, causal conv streaming."""

import mlx.core as mx
import numpy as np
import pytest

from mlx_speech.nn import (
    CausalConv1d,
    ConvCache,
    RingBatch,
    RingRow,
    SlidingKVCache,
    window_mask,
)
from mlx_speech.nn import cache as cache_module


def _attend(q, k, v, mask):
    return mx.fast.scaled_dot_product_attention(q, k, v, scale=0.5, mask=mask)


@pytest.mark.parametrize("window,max_chunk,chunks", [
    (5, 1, [1] * 23),
    (7, 4, [4, 1, 3, 4, 2, 4, 4, 1, 4]),
    (6, 9, [9, 2, 9, 9, 1]),
])
def test_ring_cache_matches_full_window_attention(window, max_chunk, chunks):
    T = sum(chunks)
    rng = np.random.default_rng(0)
    q, k, v = (mx.array(rng.standard_normal((1, 2, T, 4)).astype(np.float32)) for _ in range(3))
    pos = mx.arange(T)
    ref = _attend(q, k, v, window_mask(pos, pos, window))
    cache, outs, t = SlidingKVCache(window, max_chunk, step=3), [], 0
    for n in chunks:
        mask = cache.make_mask(n)
        kk, vv = cache.update_and_fetch(k[:, :, t:t + n], v[:, :, t:t + n])
        assert kk.shape[2] <= cache.capacity
        outs.append(_attend(q[:, :, t:t + n], kk, vv, mask))
        t += n
    np.testing.assert_allclose(np.array(mx.concatenate(outs, 2)), np.array(ref), atol=1e-5)


def test_ring_cache_rejects_oversized_chunk():
    cache = SlidingKVCache(4, 2)
    with pytest.raises(ValueError):
        cache.update_and_fetch(mx.zeros((1, 1, 3, 2)), mx.zeros((1, 1, 3, 2)))


def test_reanchor_rotates_keys_to_the_lowered_clock():
    rng = np.random.default_rng(1)
    raw = mx.array(rng.standard_normal((1, 2, 6, 8)).astype(np.float32))

    def rope(x, off):
        return mx.fast.rope(x, 8, traditional=True, base=1e4, scale=1.0, offset=off)

    cache = SlidingKVCache(6, 6)
    cache.update_and_fetch(rope(raw, 100), raw)  # keys stored at clock 100..105
    cache.reanchor(90, 8, traditional=True, base=1e4)
    assert (cache.offset, cache.rope_offset) == (6, 6 - 90)
    got = cache.keys[:, :, :6]
    np.testing.assert_allclose(np.array(got), np.array(rope(raw, 10)), atol=1e-5)


@pytest.mark.parametrize("traditional", [True, False])
def test_reanchor_under_gpu_rope_arithmetic(gpu_rope, traditional):
    """The GPU rope kernels wrap negative positions (tests/support/gpu_emulation.py): re-anchoring
    lowers the clock without one, for one stream's ring and for a batch of rows."""
    rng = np.random.default_rng(2)
    raw = mx.array(rng.standard_normal((3, 2, 6, 8)).astype(np.float32))

    def rope(x, off):
        return mx.fast.rope(x, 8, traditional=traditional, base=1e4, scale=1.0, offset=off)

    cache = SlidingKVCache(6, 6)  # its (N, 1, D) rotation takes CUDA's general kernel
    cache.update_and_fetch(rope(raw[:1], 100), raw[:1])
    cache.reanchor(90, 8, traditional=traditional, base=1e4)
    np.testing.assert_allclose(np.array(cache.keys[:, :, :6]), np.array(rope(raw[:1], 10)),
                               atol=1e-5)
    batch = RingBatch.gather([RingRow(6, 6) for _ in range(3)])  # B >= 2: the general kernel
    batch.update_and_fetch(rope(raw, mx.array([100, 50, 7])), raw)
    batch.reanchor([90, 0, 5], 8, traditional=traditional, base=1e4)
    assert [r.rope_offset for r in batch.rows] == [6 - 90, 6, 6 - 5]
    np.testing.assert_allclose(np.array(batch.keys[:, :, :6]),
                               np.array(rope(raw, mx.array([10, 50, 2]))), atol=1e-5)
    with pytest.raises(ValueError, match="only lowers"):
        batch.reanchor([1, -1, 0], 8, traditional=traditional, base=1e4)


def test_batched_reanchor_within_cuda_launch_limits(gpu_rope):
    """Four rows of a 64-slot ring, two heads, head_dim 8: one position over (4, 128) rows,
    the rope launch CUDA refused on an H200 (tests/support/gpu_emulation.py). The rotation
    still lands every key at its lowered clock."""
    rng = np.random.default_rng(3)
    raw = mx.array(rng.standard_normal((4, 2, 64, 8)).astype(np.float32))

    def rope(x, off):
        return mx.fast.rope(x, 8, traditional=False, base=1e4, scale=1.0, offset=off)

    batch = RingBatch.gather([RingRow(64, 64) for _ in range(4)])
    batch.update_and_fetch(rope(raw, mx.array([300, 90, 64, 7])), raw)
    batch.reanchor([290, 0, 60, 7], 8, traditional=False, base=1e4)
    np.testing.assert_allclose(np.array(batch.keys[:, :, :64]),
                               np.array(rope(raw, mx.array([10, 90, 4, 0]))), atol=2e-5)


def _window_mask_of(rows, length: int, used: int) -> np.ndarray:
    """The (B, 1, L, S) boolean mask from slot positions, written out in numpy."""
    cap, window = rows[0].capacity, rows[0].window
    out = np.zeros((len(rows), 1, length, used), bool)
    for b, r in enumerate(rows):
        for t in range(length):
            q = r.offset + t
            for s in range(used):  # the newest position <= the row's last one in slot s
                last = r.offset + length - 1
                p = last - ((last - s) % cap) if last >= cap else s
                out[b, 0, t, s] = 0 <= q - p < window and p <= last
    return out


@pytest.mark.parametrize("fixed", [True, False])
def test_ring_batch_mask_takes_the_forms_fused_kernels_take(monkeypatch, fixed):
    """With fixed shapes (GPU backends) attention sees every allocated slot (power-of-two
    sizes from `step`, then the capacity; unwritten slots masked), else the slots in use.
    None when every query sees every slot (decode inside
    the window), "causal" when rows in step see exactly their earlier positions, else the
    boolean mask; attention is the same as with the boolean mask in every case."""
    monkeypatch.setattr(cache_module, "FIXED_SHAPES", fixed)
    rng = np.random.default_rng(3)
    rows = [RingRow(8, 3) for _ in range(3)]  # capacity 10
    late = RingRow(8, 3)
    forms, sizes = [], []
    for step, L in enumerate([2, 1, 1, 1, 1, 1, 1, 1, 3, 1]):
        group = rows + [late] if step in (4, 5) else rows  # a row out of step, for 2 steps
        batch = RingBatch.gather(group, step=2)
        mask = batch.make_mask(L)
        expect = _window_mask_of(group, L, batch.attended(max(r.offset for r in group) + L))
        q, k, v = (mx.array(rng.standard_normal((len(group), 2, L, 4)).astype(np.float32))
                   for _ in range(3))
        kk, vv = batch.update_and_fetch(k, v)
        assert kk.shape[2] == expect.shape[-1]
        sizes.append(kk.shape[2])
        forms.append(mask if mask is None or isinstance(mask, str) else "array")
        if not isinstance(mask, str) and mask is not None:
            np.testing.assert_array_equal(np.array(mask), expect)
        np.testing.assert_allclose(np.array(_attend(q, kk, vv, mask)),
                                   np.array(_attend(q, kk, vv, mx.array(expect))), atol=1e-6)
    # the window binds from position 8 on
    if fixed:
        assert sizes == [2, 4, 4, 8, 8, 8, 8, 10, 10, 10]  # the fixed set: 2, 4, 8, capacity
        assert forms == ["causal", "array", None, "array", "array", "array", None, "array",
                         "array", "array"]
    else:
        assert sizes == [2, 3, 4, 5, 6, 7, 8, 9, 10, 10]
        assert forms == ["causal", None, None, None, "array", "array", None, "array",
                         "array", "array"]
    single = RingBatch.gather([RingRow(4, 1)])  # capacity == window: full, never masked
    for i in range(9):
        assert (single.make_mask(1) is None) == (i >= 3 or not fixed)
        single.update_and_fetch(mx.zeros((1, 1, 1, 2)), mx.zeros((1, 1, 1, 2)))


@pytest.mark.parametrize("stride,sizes", [(1, [1, 3, 2, 7]), (2, [2, 4, 6, 2])])
def test_causal_conv_streaming_equals_offline(stride, sizes):
    mx.random.seed(0)
    conv = CausalConv1d(3, 5, 3, stride)
    x = mx.random.normal((1, sum(sizes), 3))
    ref = conv(x)
    cache, outs, t = ConvCache(), [], 0
    for n in sizes:
        outs.append(conv(x[:, t:t + n], cache))
        t += n
    np.testing.assert_allclose(np.array(mx.concatenate(outs, 1)), np.array(ref), atol=1e-6)


@pytest.mark.parametrize("B,T,I,O,K,stride", [
    (2, 7, 5, 3, 4, 2),  # K a multiple of the stride (the codecs' upsamplers)
    (1, 9, 4, 6, 5, 2),  # K not a multiple: zero taps pad it
    (3, 1, 4, 4, 3, 3),  # one input frame
    (2, 6, 3, 2, 2, 4),  # K below the stride: gaps of zeros
    (1, 5, 8, 8, 1, 1),  # a 1-tap, stride-1 conv
])
def test_conv_transpose_equals_mlx_transposed_convolution(B, T, I, O, K, stride):
    from mlx_speech.nn.conv import conv_transpose

    x = mx.random.normal((B, T, I), key=mx.random.key(1))
    w = mx.random.normal((O, K, I), key=mx.random.key(2))
    ref = mx.conv_transpose1d(x, w, stride=stride)
    got = conv_transpose(x, w, stride)
    assert got.shape == ref.shape == (B, (T - 1) * stride + K, O)
    np.testing.assert_allclose(np.array(got), np.array(ref), atol=1e-5, rtol=1e-5)
    # grouped (Mimi's depthwise upsampler) goes to MLX's own convolution
    wg = mx.random.normal((4, K, 1), key=mx.random.key(3))
    xg = mx.random.normal((B, T, 4), key=mx.random.key(4))
    assert mx.array_equal(conv_transpose(xg, wg, stride, groups=4),
                          mx.conv_transpose1d(xg, wg, stride=stride, groups=4))
