"""Resize of the last two axes through the compiled kernel (native/src/resize2d.c):
the same values as the numpy path, and onnxruntime's and the onnx reference's within
float32 rounding, over every coordinate mode, nearest / linear / cubic, odd sizes,
downscaling and upscaling."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import onnxrt
from onnxrt_cpu import native

pytestmark = pytest.mark.skipif(native.K is None, reason="the native module is not built")

_COORDS = ["half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric",
           "tf_crop_and_resize"]


def _model(rank, mode, coord, *, scales=None, sizes=None, roi=None, dtype=TensorProto.FLOAT, opset=19, **attrs):
    """One Resize with constant roi / scales / sizes."""
    inits = []
    names = ["x", "", "", ""]
    if roi is not None:
        inits.append(numpy_helper.from_array(np.asarray(roi, np.float32), "roi"))
        names[1] = "roi"
    if scales is not None:
        inits.append(numpy_helper.from_array(np.asarray(scales, np.float32), "scales"))
        names[2] = "scales"
    if sizes is not None:
        inits.append(numpy_helper.from_array(np.asarray(sizes, np.int64), "sizes"))
        names[3] = "sizes"
    while names[-1] == "":
        names.pop()
    node = helper.make_node("Resize", names, ["y"], mode=mode, coordinate_transformation_mode=coord, **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", dtype, [None] * rank)],
                              [helper.make_tensor_value_info("y", dtype, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=9)


def _onnxrt(model, x):
    return onnxrt.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def _native_and_numpy(model, x, monkeypatch):
    """The output through the compiled kernel (asserted taken) and through numpy."""
    calls = []
    real = native.K

    class Counting:
        def __getattr__(self, name):
            fn = getattr(real, name)
            if name != "resize2d":
                return fn
            return lambda *a: calls.append(a) or fn(*a)

    monkeypatch.setattr(native, "K", Counting())
    got = _onnxrt(model, x)
    assert calls, "the compiled kernel did not take this Resize"
    monkeypatch.setattr(native, "K", None)
    want = _onnxrt(model, x)
    monkeypatch.setattr(native, "K", real)
    return got, want


def _reference(model, x):
    return ReferenceEvaluator(model).run(None, {"x": x})[0]


_CASES = [
    # (input shape, scales or None, sizes or None)
    ((2, 3, 5, 7), [1, 1, 2, 2], None),  # integer upscaling
    ((1, 2, 7, 9), [1, 1, 3, 3], None),
    ((1, 2, 9, 11), None, [1, 2, 4, 5]),  # odd downscaling
    ((1, 3, 6, 5), None, [1, 3, 13, 17]),  # odd upscaling
    ((2, 2, 8, 8), [1, 1, 0.5, 1.75], None),  # down on one axis, up on the other
    ((1, 1, 6, 7), [1, 1, 1, 2.5], None),  # only the last axis resized
    ((1, 1, 6, 7), [1, 1, 1.5, 1], None),  # only the rows
]


@pytest.mark.parametrize("coord", _COORDS)
@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize("shape, scales, sizes", _CASES)
def test_native_matches_numpy_and_the_reference(coord, mode, shape, scales, sizes, monkeypatch):
    roi = None
    if coord == "tf_crop_and_resize":
        roi = [0, 0, 0.1, -0.2, 1, 1, 0.8, 1.15]  # partly outside: extrapolated
    model = _model(4, mode, coord, scales=scales, sizes=sizes, roi=roi, extrapolation_value=-3.0)
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    got, numpy_path = _native_and_numpy(model, x, monkeypatch)
    np.testing.assert_array_equal(got, numpy_path)
    np.testing.assert_allclose(got, _reference(model, x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("coord, mode", [("half_pixel", "linear"), ("asymmetric", "nearest"),
                                         ("align_corners", "linear"), ("pytorch_half_pixel", "cubic"),
                                         ("tf_crop_and_resize", "linear")])
@pytest.mark.parametrize("shape, sizes", [((1, 4, 15, 21), [1, 4, 30, 42]), ((1, 2, 33, 17), [1, 2, 10, 9]),
                                          ((2, 3, 64, 48), [2, 3, 256, 192])])
def test_native_matches_onnxruntime(coord, mode, shape, sizes, monkeypatch):
    rt = pytest.importorskip("onnxruntime")
    roi = [0, 0, 0.05, 0.1, 1, 1, 0.9, 1.1] if coord == "tf_crop_and_resize" else None
    model = _model(4, mode, coord, sizes=sizes, roi=roi, opset=13, nearest_mode="floor", extrapolation_value=2.0)
    x = np.random.default_rng(2).standard_normal(shape).astype(np.float32)
    got, numpy_path = _native_and_numpy(model, x, monkeypatch)
    np.testing.assert_array_equal(got, numpy_path)
    want = rt.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    # onnxruntime maps crop coordinates in float32 (the reference and onnxrt in float64):
    # a few of its samples sit up to 2e-5 away
    tol = 1e-4 if coord == "tf_crop_and_resize" else 1e-5
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    np.testing.assert_allclose(got, _reference(model, x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", ["linear", "cubic"])
def test_antialiased_downscaling(mode, monkeypatch):
    model = _model(4, mode, "half_pixel", sizes=[1, 2, 7, 5], antialias=1)
    x = np.random.default_rng(3).standard_normal((1, 2, 23, 19)).astype(np.float32)
    got, numpy_path = _native_and_numpy(model, x, monkeypatch)
    np.testing.assert_array_equal(got, numpy_path)
    np.testing.assert_allclose(got, _reference(model, x), rtol=1e-5, atol=1e-5)


def test_float16_is_interpolated_in_float32(monkeypatch):
    model = _model(4, "linear", "half_pixel", scales=[1, 1, 2, 2], dtype=TensorProto.FLOAT16)
    x = np.random.default_rng(4).standard_normal((1, 3, 9, 10)).astype(np.float16)
    got, numpy_path = _native_and_numpy(model, x, monkeypatch)
    assert got.dtype == np.float16
    np.testing.assert_array_equal(got, numpy_path)
    np.testing.assert_allclose(got.astype(np.float32), _reference(model, x).astype(np.float32), rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("rank, scales", [(2, [2, 1.5]), (3, [1, 0.5, 3]), (5, [1, 2, 1, 2, 2])])
def test_other_ranks(rank, scales, monkeypatch):
    shape = (5, 6) if rank == 2 else (2, 6, 5) if rank == 3 else (1, 2, 2, 5, 4)
    model = _model(rank, "linear", "half_pixel", scales=scales)
    x = np.random.default_rng(5).standard_normal(shape).astype(np.float32)
    if rank == 5:  # a resized third-to-last axis: the numpy path alone
        np.testing.assert_allclose(_onnxrt(model, x), _reference(model, x), rtol=1e-5, atol=1e-5)
        return
    got, numpy_path = _native_and_numpy(model, x, monkeypatch)
    np.testing.assert_array_equal(got, numpy_path)
    np.testing.assert_allclose(got, _reference(model, x), rtol=1e-5, atol=1e-5)


def test_non_contiguous_input_and_a_nan(monkeypatch):
    x = np.random.default_rng(6).standard_normal((1, 2, 12, 14)).astype(np.float32)[:, :, ::2, ::2]
    x[0, 1, 3, 2] = np.nan
    model = _model(4, "linear", "align_corners", sizes=[1, 2, 11, 13])
    got, numpy_path = _native_and_numpy(model, x, monkeypatch)
    np.testing.assert_array_equal(got, numpy_path)
    assert np.isnan(got[0, 1]).any() and not np.isnan(got[0, 0]).any()


def test_bad_tables_are_refused():
    x = np.zeros((1, 4, 4), np.float32)
    y = np.empty((1, 8, 8), np.float32)
    iy = np.full((8, 1), 4, np.int64)  # row 4 of a 4-row map
    ix = np.zeros((8, 1), np.int64)
    with pytest.raises(ValueError, match="row index out of range"):
        native.K.resize2d(x, y, 1, 4, 4, 8, 8, iy, None, 1, ix, None, 1, 0, 1)
    with pytest.raises(ValueError, match="invalid geometry"):
        native.K.resize2d(x, y, 1, 4, 4, 8, 8, iy, None, 2, ix, None, 1, 0, 1)
