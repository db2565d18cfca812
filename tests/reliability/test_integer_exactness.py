"""Integer arithmetic stays in integers: lengths, bounds and indices near the int64
limits give exact results or typed errors, never a count computed through float64."""

import numpy as np
import pytest
from onnx import TensorProto, helper

import onnxrt as ort

from ..conftest import make_model

I32, I64, F = TensorProto.INT32, TensorProto.INT64, TensorProto.FLOAT
IMAX, IMIN = 2**63 - 1, -(2**63)


def _vi(name, t, shape=None):
    return helper.make_tensor_value_info(name, t, shape)


def _range_session(t=I64):
    model = make_model([helper.make_node("Range", ["a", "b", "d"], ["y"])],
                       [_vi("a", t, []), _vi("b", t, []), _vi("d", t, [])], [_vi("y", t)])
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("start,limit,delta", [
    (0, 2**62 + 3, 2**62),           # np.arange counts 1 element: float64 rounds 2**62 + 3
    (2**62, 2**62 + 5, 1),
    (IMIN, IMAX, 2**62),             # the whole int64 range in four steps
    (IMAX, IMIN, -(2**62)),
    (IMAX - 1000, IMAX, 100),        # bounds next to the limit: no wrap-around past it
    (IMIN + 7, IMIN, -1),            # empty
    (IMIN, IMIN + 3, 1),
    (-(2**62) - 1, 2**62 + 1, 2**61),
])
def test_int64_range_has_exactly_the_python_range_elements(start, limit, delta):
    (y,) = _range_session().run(None, {"a": np.int64(start), "b": np.int64(limit), "d": np.int64(delta)})
    expected = list(range(start, limit, delta))
    assert y.dtype == np.int64
    assert y.tolist() == expected


def test_int32_range_near_its_limits():
    lo, hi = -(2**31), 2**31 - 1
    (y,) = _range_session(I32).run(None, {"a": np.int32(lo), "b": np.int32(hi), "d": np.int32(2**30)})
    assert y.dtype == np.int32 and y.tolist() == list(range(lo, hi, 2**30))


def test_int64_range_too_long_is_refused_with_its_exact_length():
    with pytest.raises(ort.InvalidArgument, match=r"Range output: a tensor of shape \[18446744073709551615\]"):
        _range_session().run(None, {"a": np.int64(IMIN), "b": np.int64(IMAX), "d": np.int64(1)})


@pytest.mark.parametrize("k,upper,expected", [
    (IMIN, 1, np.ones((3, 3))), (IMAX, 1, np.zeros((3, 3))),
    (IMIN, 0, np.zeros((3, 3))), (IMAX, 0, np.ones((3, 3))),
    (-1, 1, np.triu(np.ones((3, 3)), -1)), (2, 0, np.tril(np.ones((3, 3)), 2)),
])
def test_trilu_k_at_the_int64_limits(k, upper, expected):
    # numpy takes k as a C long: the limits overflowed it (a raw OverflowError)
    model = make_model([helper.make_node("Trilu", ["x", "k"], ["y"], upper=upper)],
                       [_vi("x", F, [3, 3]), _vi("k", I64, [])], [_vi("y", F)])
    (y,) = ort.InferenceSession(model.SerializeToString()).run(None, {"x": np.ones((3, 3), np.float32),
                                                                      "k": np.int64(k)})
    np.testing.assert_array_equal(y, expected)


@pytest.mark.parametrize("start,end,step", [
    (IMIN, IMAX, 1), (IMAX, IMIN, -1), (0, IMAX, IMAX), (IMAX, IMIN, IMIN), (-1, IMIN, -(2**62)),
    (IMIN, IMAX, 2**62), (3, IMAX, 2), (-3, IMIN, -3),
])
def test_slice_bounds_at_the_int64_limits_clamp_exactly(start, end, step):
    model = make_model([helper.make_node("Slice", ["x", "s", "e", "a", "p"], ["y"])],
                       [_vi("x", F, [10])] + [_vi(n, I64, [1]) for n in "seap"], [_vi("y", F)])
    x = np.arange(10, dtype=np.float32)
    (y,) = ort.InferenceSession(model.SerializeToString()).run(
        None, {"x": x, "s": np.array([start]), "e": np.array([end]), "a": np.array([0]), "p": np.array([step])})
    # Python slices clamp arbitrary ints exactly, as ONNX's Slice does
    np.testing.assert_array_equal(y, x[slice(start, end, step)])


@pytest.mark.parametrize("op", ["Gather", "GatherElements"])
@pytest.mark.parametrize("index", [IMIN, IMIN + 10, IMAX, 2**32, -11])
def test_gather_indices_at_the_int64_limits_are_refused(op, index):
    # IMIN + 10 wraps to 0 if the index is made non-negative in int64 arithmetic
    model = make_model([helper.make_node(op, ["x", "i"], ["y"])], [_vi("x", F, [10]), _vi("i", I64, [1])],
                       [_vi("y", F)])
    with pytest.raises(ort.InvalidArgument, match="out of range"):
        ort.InferenceSession(model.SerializeToString()).run(
            None, {"x": np.arange(10, dtype=np.float32), "i": np.array([index])})


def test_shape_products_past_int64_are_refused_not_wrapped():
    # 2**32 * 2**32 wraps to 0 in int64: the cap check counts in Python ints
    model = make_model([helper.make_node("ConstantOfShape", ["s"], ["y"])], [_vi("s", I64, [2])], [_vi("y", F)])
    sess = ort.InferenceSession(model.SerializeToString())
    with pytest.raises(ort.InvalidArgument, match="max_allocation_bytes"):
        sess.run(None, {"s": np.array([2**32, 2**32], np.int64)})
    model = make_model([helper.make_node("Expand", ["x", "s"], ["y"])], [_vi("x", F, [1]), _vi("s", I64, [3])],
                       [_vi("y", F)])
    with pytest.raises(ort.InvalidArgument, match="max_allocation_bytes"):
        ort.InferenceSession(model.SerializeToString()).run(
            None, {"x": np.ones(1, np.float32), "s": np.array([2**31, 2**31, 4], np.int64)})
