"""Comparing runtime outputs with expected ones, as the ONNX backend tests do."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["assert_outputs_close"]


def _as_comparable(a: np.ndarray) -> np.ndarray:
    # ml_dtypes (bfloat16, float8, int4...) do not promote with Python floats
    if a.dtype.kind == "V" or a.dtype.name in ("bfloat16",) or a.dtype.name.startswith(("float8", "float4", "float6", "int4", "uint4", "int2", "uint2")):
        with np.errstate(over="ignore", invalid="ignore"):  # float8/int4 infinities and NaNs
            return a.astype(np.float32)
    return a


def assert_outputs_close(expected: Any, got: Any, rtol: float = 1e-3, atol: float = 1e-7, where: str = "output") -> None:
    """Assert ``got`` matches ``expected``: same structure, shape and dtype, values within tolerance.

    Sequences (lists) compare element-wise, ``None`` (absent optional) must match,
    strings compare exactly, and dicts (ZipMap rows) compare key by key.
    """
    if isinstance(expected, (list, tuple)):
        assert isinstance(got, (list, tuple)), f"{where}: expected a sequence, got {type(got).__name__}"
        assert len(got) == len(expected), f"{where}: sequence has {len(got)} elements, expected {len(expected)}"
        for i, (e, g) in enumerate(zip(expected, got)):
            assert_outputs_close(e, g, rtol, atol, f"{where}[{i}]")
        return
    if isinstance(expected, dict):
        assert isinstance(got, dict), f"{where}: expected a dict, got {type(got).__name__}"
        assert set(expected) == set(got), f"{where}: keys {sorted(got)} != {sorted(expected)}"
        for k in expected:
            np.testing.assert_allclose(got[k], expected[k], rtol=rtol, atol=atol, err_msg=f"{where}[{k!r}]")
        return
    if expected is None:
        assert got is None, f"{where}: expected an absent optional (None), got {type(got).__name__}"
        return
    expected = np.asarray(expected)
    assert isinstance(got, np.ndarray), f"{where}: expected an array, got {type(got).__name__}"
    assert got.shape == expected.shape, f"{where}: shape {list(got.shape)} != expected {list(expected.shape)}"
    if expected.dtype == object:
        np.testing.assert_array_equal(got, expected, err_msg=where)
        return
    assert got.dtype == expected.dtype, f"{where}: dtype {got.dtype} != expected {expected.dtype}"
    r = rtol
    if got.dtype.name == "bfloat16":
        r = max(rtol, 2**-6)  # two bfloat16 ulps, as the ONNX backend tests allow
    np.testing.assert_allclose(_as_comparable(got), _as_comparable(expected), rtol=r, atol=atol, err_msg=where)
