"""Batched == alone, compiled == plain, converted == source: exact where the arithmetic is.

Those checks hold bit for bit when a matrix product computes each row the same way whatever
rows share it, and a transposed weight the same as a contiguous one. The reference BLAS that
the Linux mlx[cpu] wheel bundles does (CI runs on it). An optimized BLAS (OpenBLAS, which the
doctor recommends on Linux; Accelerate on a Mac's CPU) and GPU GEMMs pick their kernels by the
product's shape. There a row's numbers move in their last bits with the batch: 1e-7 to 3e-5 on
the H200 and with OpenBLAS (docs/gpu-and-memory.md). There these checks compare within
`RTOL` / `ATOL` instead. Tokens, frames and every other discrete output stay exact everywhere.
`exact_products()` decides by multiplying on the default device, not by guessing the platform.
"""

from __future__ import annotations

import functools

import mlx.core as mx
import numpy as np

RTOL, ATOL = 2e-4, 5e-5  # float rounding through tens of layers, where products are not exact


@functools.cache
def exact_products() -> bool:
    """Whether the default device's float32 products give each row the same bits whatever
    rows share the product, with a transposed weight as with a contiguous one."""
    rng = np.random.default_rng(0)
    for k, n in ((32, 48), (256, 240), (1024, 64)):
        a = mx.array(rng.standard_normal((19, k)).astype(np.float32))
        w = rng.standard_normal((k, n)).astype(np.float32)
        full = np.array(a @ mx.array(w))
        if not np.array_equal(np.array(a @ mx.array(np.ascontiguousarray(w.T)).T), full):
            return False
        for rows in (1, 2, 5, 16):
            if not np.array_equal(np.array(a[:rows] @ mx.array(w)), full[:rows]):
                return False
    return True


def assert_same_numbers(got, want, *, atol: float = 0.0, err_msg: str = "") -> None:
    """`got` equals `want` within `atol` (0: bit for bit) where products are exact, within
    float rounding elsewhere; shapes must match either way."""
    got, want = np.asarray(got), np.asarray(want)
    if exact_products():
        if atol:
            np.testing.assert_allclose(got, want, atol=atol, rtol=0, err_msg=err_msg)
        else:
            np.testing.assert_array_equal(got, want, err_msg=err_msg)
    else:
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=max(atol, ATOL), err_msg=err_msg)


def same_numbers(got, want) -> bool:
    """`assert_same_numbers` as a bool (one rule for both)."""
    try:
        assert_same_numbers(got, want)
    except AssertionError:
        return False
    return True
