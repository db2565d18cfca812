"""The compute kernels in float64, on devices that have it: each family compared with
the CPU provider at float64 tolerances (the same programs, built with ``real`` = double)."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from ..conftest import make_model
from .kernel_checks import compare_with_cpu, has_fp64, skip_without_opencl

pytestmark = [skip_without_opencl()]

D = TensorProto.DOUBLE


@pytest.fixture(autouse=True)
def _needs_fp64():
    if not has_fp64():
        pytest.skip("the OpenCL device has no float64")


def _model(nodes, x_shapes, inits=(), opset=18):
    return make_model(
        nodes,
        [helper.make_tensor_value_info(n, D, list(s)) for n, s in x_shapes.items()],
        [helper.make_tensor_value_info(o, D, None) for o in nodes[-1].output],
        [numpy_helper.from_array(v, n) for n, v in inits],
        opset=opset,
    )


def _rand(*shape, seed=0):
    return np.random.default_rng(seed + sum(shape)).standard_normal(shape)


def test_matmul_and_gemm():
    a, b, c = _rand(3, 37, 53), _rand(53, 29), _rand(29)
    compare_with_cpu(_model([helper.make_node("MatMul", ["a", "b"], ["y"])], {"a": a.shape, "b": b.shape}),
                     {"a": a, "b": b}, rtol=1e-12, atol=1e-12)
    g = _model([helper.make_node("Gemm", ["a", "w", "c"], ["y"], transB=1, alpha=0.5)], {"a": (37, 53)},
               [("w", _rand(29, 53)), ("c", c)])
    compare_with_cpu(g, {"a": a[0]}, rtol=1e-12, atol=1e-12)


def test_conv_and_conv_transpose():
    x = _rand(2, 4, 9, 11)
    for attrs, w in (({"pads": [1, 1, 1, 1], "strides": [2, 1]}, _rand(6, 4, 3, 3)),
                     ({"group": 4, "pads": [1, 1, 1, 1]}, _rand(4, 1, 3, 3)),
                     ({}, _rand(5, 4, 1, 1))):
        m = _model([helper.make_node("Conv", ["x", "w", "b"], ["y"], **attrs)], {"x": x.shape},
                   [("w", w), ("b", _rand(w.shape[0]))])
        compare_with_cpu(m, {"x": x}, rtol=1e-12, atol=1e-12)
    m = _model([helper.make_node("ConvTranspose", ["x", "w"], ["y"], strides=[2, 2], output_padding=[1, 0])],
               {"x": x.shape}, [("w", _rand(4, 3, 3, 2))])
    compare_with_cpu(m, {"x": x}, rtol=1e-12, atol=1e-12)


def test_pooling():
    x = _rand(2, 3, 11, 10)
    for op, attrs, n_out in (("MaxPool", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}, 2),
                             ("AveragePool", {"kernel_shape": [3, 2], "ceil_mode": 1, "count_include_pad": 1,
                                              "pads": [1, 0, 1, 1]}, 1),
                             ("GlobalAveragePool", {}, 1)):
        outs = ["y", "i"][:n_out]
        m = make_model([helper.make_node(op, ["x"], outs, **attrs)], [helper.make_tensor_value_info("x", D, list(x.shape))],
                       [helper.make_tensor_value_info("y", D, None)]
                       + [helper.make_tensor_value_info("i", TensorProto.INT64, None)] * (n_out - 1))
        compare_with_cpu(m, {"x": x}, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceL2", "ReduceLogSumExp"])
def test_reductions(op):
    x = np.abs(_rand(4, 5, 300)) + 0.1
    for axes in ([2], [0, 2], [1]):
        m = _model([helper.make_node(op, ["x", "axes"], ["y"], keepdims=0)], {"x": x.shape},
                   [("axes", np.array(axes, np.int64))])
        compare_with_cpu(m, {"x": x}, rtol=1e-12, atol=1e-12)


def test_softmax_argmax_and_normalization():
    x = _rand(3, 4, 300) * 10
    for op in ("Softmax", "LogSoftmax"):
        for axis in (-1, 1):
            compare_with_cpu(_model([helper.make_node(op, ["x"], ["y"], axis=axis)], {"x": x.shape}), {"x": x},
                             rtol=1e-12, atol=1e-12)
    m = make_model([helper.make_node("ArgMax", ["x"], ["y"], axis=1)], [helper.make_tensor_value_info("x", D, [3, 4, 300])],
                   [helper.make_tensor_value_info("y", TensorProto.INT64, None)])
    compare_with_cpu(m, {"x": x})
    c = x.shape[1]
    bn = _model([helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"])], {"x": x.shape},
                [("s", _rand(c)), ("b", _rand(c, seed=1)), ("m", _rand(c, seed=2)), ("v", np.abs(_rand(c)) + 0.5)])
    compare_with_cpu(bn, {"x": x}, rtol=1e-12, atol=1e-12)
    inorm = _model([helper.make_node("InstanceNormalization", ["x", "s", "b"], ["y"])], {"x": x.shape},
                   [("s", _rand(c)), ("b", _rand(c, seed=1))])
    compare_with_cpu(inorm, {"x": x + 50}, rtol=1e-10, atol=1e-10)


def test_resize_linear():
    x = _rand(1, 2, 7, 9)
    m = _model([helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="linear")], {"x": x.shape},
               [("scales", np.array([1, 1, 2.5, 0.6], np.float32))])
    compare_with_cpu(m, {"x": x}, rtol=1e-12, atol=1e-12)
