"""The CPU provider's one-operand Relu ufunc (``onnxrt_cpu.native._ufuncs.relu``): the
same values as ``np.maximum(x, 0)`` for every type it has a loop for, and what Relu
nodes with small static shapes call in the generated plan."""

import numpy as np
import pytest
from onnx import TensorProto, helper

import onnxrt as ort
from onnxrt_cpu import native

relu = native.RELU_UFUNC
pytestmark = pytest.mark.skipif(relu is None, reason="the ufunc module is not built here (or ONNXRT_CPU_NATIVE=0)")


@pytest.mark.parametrize("dt", [np.float32, np.float64])
def test_floats_match_np_maximum_bit_for_bit(dt):
    specials = np.array([-0.0, 0.0, np.nan, -np.nan, np.inf, -np.inf, np.finfo(dt).tiny, -np.finfo(dt).tiny,
                         np.finfo(dt).max, -np.finfo(dt).max, 5e-324 if dt == np.float64 else 1e-45], dt)
    x = np.concatenate([specials, np.random.default_rng(0).standard_normal(1000).astype(dt)])
    with np.errstate(all="raise"):  # no floating-point flag raised, NaN included
        got = relu(x)
    want = np.maximum(x, dt(0))
    assert got.dtype == dt
    np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))  # -0.0 -> +0.0, NaN kept


@pytest.mark.parametrize("dt", [np.int8, np.int16, np.int32, np.int64])
def test_integers_match_np_maximum(dt):
    info = np.iinfo(dt)
    x = np.array([info.min, -1, 0, 1, info.max], dt)
    got = relu(x)
    assert got.dtype == dt
    np.testing.assert_array_equal(got, np.maximum(x, dt(0)))


def test_strided_and_zero_d_inputs():
    x = np.arange(-6, 6, dtype=np.float32).reshape(3, 4)[:, ::2]
    np.testing.assert_array_equal(relu(x), np.maximum(x, 0))
    y = relu(np.array(-2.0, np.float32), out=...)
    assert type(y) is np.ndarray and y.shape == () and y == 0


def _relu_model(shape, elem=TensorProto.FLOAT):
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Relu", ["r"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", elem, shape)],
                          [helper.make_tensor_value_info("y", elem, shape)])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=9).SerializeToString()


@pytest.mark.parametrize("shape", [[3], []])
def test_small_static_relu_nodes_call_the_ufunc(shape):
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(_relu_model(shape), so, providers=["CPUExecutionProvider"])
    x = np.array([-1.5, -0.0, 2.0], np.float32) if shape else np.array(-1.5, np.float32)
    (y,) = sess.run(None, {"x": x})
    np.testing.assert_array_equal(y, np.maximum(x, 0))
    assert type(y) is np.ndarray and y.shape == x.shape
    # the generated run calls the ufunc itself for both nodes (d0, d1 in its globals)
    code = sess.get_plan_code()
    run = sess._built.plan._fns[False]
    called = [name for name in ("d0", "d1") if f"{name}(v" in code]
    assert called == ["d0", "d1"] and all(run.__globals__[n] is relu for n in called)
