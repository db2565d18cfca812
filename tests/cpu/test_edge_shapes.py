"""Edge cases found by a differential sweep against onnxruntime, each of which used
to fail or differ in onnxrt: empty tensors and rank-0 inputs through kernels that
reshaped with an inferred (-1) size or checked axes and pads too strictly, and
special values (NaN, infinities, the float maximum, unsigned wrap-around). Each case
runs on onnxrt and on onnxruntime; outputs must be equal in shape, type and value."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

import onnxrt

ort = pytest.importorskip("onnxruntime")

F32, U8 = np.float32, np.uint8


def _model(op, inputs, attrs, opset, n_out):
    names = [n for n, _ in inputs]
    infos = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), None) for n, a in inputs]
    outs = [f"y{i}" for i in range(n_out)]
    graph = helper.make_graph([helper.make_node(op, names, outs, **attrs)], "g", infos,
                              [helper.make_empty_tensor_value_info(o) for o in outs])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)
    # declared output types, from shape inference (onnxruntime needs them)
    inferred = onnx.shape_inference.infer_shapes(model)
    types = {v.name: v.type.tensor_type.elem_type for v in inferred.graph.output}
    for o in model.graph.output:
        o.CopyFrom(helper.make_tensor_value_info(o.name, types[o.name], None))
    return model.SerializeToString()


CASES = [
    ("Softmax", [("x", np.ones((0, 3), F32))], {"axis": 1}, 11, 1),
    ("Softmax", [("x", np.ones((2, 0, 3), F32))], {"axis": -1}, 11, 1),
    ("LogSoftmax", [("x", np.ones((0, 3), F32))], {"axis": 1}, 11, 1),
    ("Hardmax", [("x", np.ones((0, 3), F32))], {"axis": 1}, 11, 1),
    ("TopK", [("x", np.ones((0, 3), F32)), ("k", np.array([0], np.int64))], {"axis": 0}, 11, 2),
    ("TopK", [("x", np.ones((2, 0), np.int64)), ("k", np.array([0], np.int64))], {"axis": 1}, 11, 2),
    ("LayerNormalization", [("x", np.ones((0, 4), F32)), ("s", np.ones(4, F32)), ("b", np.ones(4, F32))],
     {"axis": -1}, 17, 3),
    ("RMSNormalization", [("x", np.ones((0, 4), F32)), ("s", np.ones(4, F32))], {}, 23, 1),
    ("Conv", [("x", np.ones((2, 3, 5, 5), F32)), ("w", np.ones((0, 3, 3, 3), F32))], {}, 11, 1),
    ("ConvTranspose", [("x", np.ones((1, 0, 3, 3), F32)), ("w", np.ones((0, 2, 3, 3), F32)),
                       ("b", np.array([1, 2], F32))], {}, 11, 1),
    ("ConvInteger", [("x", np.ones((1, 2, 5, 5), U8)), ("w", np.ones((0, 2, 3, 3), U8))], {}, 10, 1),
    ("QLinearConv", [("x", np.ones((1, 2, 5, 5), U8)), ("xs", np.array(0.1, F32)), ("xz", np.array(3, U8)),
                     ("w", np.ones((0, 2, 3, 3), U8)), ("ws", np.array(0.2, F32)), ("wz", np.array(1, U8)),
                     ("ys", np.array(0.5, F32)), ("yz", np.array(7, U8))], {}, 10, 1),
    ("DeformConv", [("x", np.ones((0, 2, 4, 4), F32)), ("w", np.ones((3, 2, 2, 2), F32)),
                    ("o", np.ones((0, 8, 3, 3), F32))], {}, 19, 1),
    ("ReduceSum", [("x", np.array(3.0, F32)), ("axes", np.array([0], np.int64))], {"keepdims": 1}, 18, 1),
    ("ReduceMax", [("x", np.array(3.0, F32)), ("axes", np.array([-1], np.int64))], {"keepdims": 0}, 18, 1),
    ("ReduceMean", [("x", np.array(3, np.int64)), ("axes", np.array([0], np.int64))], {"keepdims": 1}, 18, 1),
    ("Pad", [("x", np.ones((0, 3), F32)), ("p", np.array([0, 1, 0, 1], np.int64))], {"mode": "reflect"}, 19, 1),
    ("DynamicQuantizeLinear", [("x", np.ones((0,), F32))], {}, 11, 3),
    ("GatherND", [("x", np.arange(6, dtype=F32).reshape(2, 3)), ("i", np.zeros((2, 0), np.int64))], {}, 18, 1),
    ("Einsum", [("x", np.array(2.5, F32))], {"equation": ""}, 12, 1),
    ("MeanVarianceNormalization", [("x", np.ones((0, 2, 3, 2), F32))], {}, 13, 1),
    # three or more rank-0 inputs to a variadic op
    ("Sum", [("a", np.array(1.5, F32)), ("b", np.array(2.0, F32)), ("c", np.array(-4.0, F32))], {}, 13, 1),
    ("Max", [("a", np.array(1.5, F32)), ("b", np.array(2.0, F32)), ("c", np.array(-4.0, F32))], {}, 13, 1),
    ("Mean", [("a", np.array(1, np.float16)), ("b", np.array(2, np.float16)), ("c", np.array(3, np.float16))],
     {}, 13, 1),
    # a pooling window that fits nowhere along an axis: that axis is empty
    ("MaxPool", [("x", np.ones((2, 3, 2, 4), F32))], {"kernel_shape": [3, 2]}, 19, 2),
    ("MaxPool", [("x", np.ones((1, 1, 3), F32))], {"kernel_shape": [5], "strides": [2]}, 19, 1),
    ("AveragePool", [("x", np.ones((1, 1, 3), F32))], {"kernel_shape": [4], "ceil_mode": 1}, 19, 1),
    ("LpPool", [("x", np.ones((2, 3, 2, 4), F32))], {"kernel_shape": [3, 2], "pads": [0, 0, 0, 1]}, 19, 1),
    # special values
    ("ThresholdedRelu", [("x", np.array([np.nan, -np.inf, 2.0, 0.5, -3.0], F32))], {}, 18, 1),
    ("ThresholdedRelu", [("x", np.array([np.nan, -np.inf, 2.0, 0.5, -3.0], F32))], {"alpha": -1.0}, 18, 1),
    ("ReduceLogSumExp", [("x", np.array([[1, 2], [3, 4]], np.uint32))], {"keepdims": 0}, 18, 1),
    ("ReduceLogSumExp", [("x", np.array([[1, 2], [3, 4]], np.uint64))], {"keepdims": 0}, 18, 1),
    ("Gelu", [("x", np.array([3.4e38, 2e38, -3.4e38, 0.0], F32))], {}, 20, 1),
    ("Gelu", [("x", np.array([3.4e38, 2e38, -3.4e38, 0.0], F32))], {"approximate": "tanh"}, 20, 1),
    ("TopK", [("x", np.array([1, np.nan, 2, np.nan], F32)), ("k", np.array([2], np.int64))], {"largest": 1}, 11, 2),
    ("TopK", [("x", np.array([[np.nan, 0, 2], [5, 1, np.nan]], F32)), ("k", np.array([3], np.int64))],
     {"largest": 1}, 11, 2),
    ("TopK", [("x", np.array([1, np.nan, 2, np.nan], F32)), ("k", np.array([4], np.int64))], {"largest": 0}, 11, 2),
]


@pytest.mark.filterwarnings("error::RuntimeWarning")  # numpy's warnings on empty or special values leak no more
@pytest.mark.parametrize("op, inputs, attrs, opset, n_out", CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_edge_shape_matches_onnxruntime(op, inputs, attrs, opset, n_out):
    model = _model(op, inputs, attrs, opset, n_out)
    feeds = dict(inputs)
    got = onnxrt.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)
    exp = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)
    for g, e in zip(got, exp):
        assert g.shape == e.shape and g.dtype == e.dtype
        np.testing.assert_array_equal(g, e)


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool", "LpPool"])
def test_pooling_window_past_the_padded_input_fails(op):
    """A window longer than the padded input by more than one stride leaves a negative
    number of outputs: onnxruntime fails the run, and onnxrt names the axis."""
    x = np.ones((1, 1, 2), F32)
    model = _model(op, [("x", x)], {"kernel_shape": [6]}, 19, 1)
    with pytest.raises(onnxrt.InvalidArgument, match="does not fit spatial axis 0 of size 2"):
        onnxrt.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    with pytest.raises(Exception, match="negative"):
        ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})


@pytest.mark.parametrize("op, attrs", [("Div", {}), ("Mod", {"fmod": 0}), ("Mod", {"fmod": 1})])
def test_integer_division_by_zero_fails_the_run(op, attrs):
    """Integer division or modulo by zero is undefined: onnxruntime fails the run, and
    so does onnxrt, with the reason (numpy would quietly give 0)."""
    feeds = {"a": np.array([1, 2, 3], np.int32), "b": np.array([1, 0, 2], np.int32)}
    model = _model(op, list(feeds.items()), attrs, 18, 1)
    with pytest.raises(onnxrt.OnnxRtError, match="by zero"):
        onnxrt.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)
    with pytest.raises(Exception, match="by zero"):
        ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)


@pytest.mark.parametrize("shape", [[-2, 3], [2, -7], [-1, -1]])
def test_reshape_rejects_negative_dimensions_other_than_one_minus_one(shape):
    """numpy takes any negative dimension for "infer"; ONNX allows one -1 only, and
    onnxruntime refuses the rest, as onnxrt now does (fed and constant shapes)."""
    feeds = {"x": np.arange(6, dtype=F32), "s": np.array(shape, np.int64)}
    model = _model("Reshape", list(feeds.items()), {}, 18, 1)
    with pytest.raises(onnxrt.OnnxRtError, match="one -1"):
        onnxrt.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)
    with pytest.raises(Exception):
        ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "s"], ["y"])], "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [6])],
        [helper.make_empty_tensor_value_info("y")], [onnx.numpy_helper.from_array(feeds["s"], "s")])
    const = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    with pytest.raises(onnxrt.OnnxRtError, match="one -1"):
        onnxrt.InferenceSession(const.SerializeToString(), providers=["CPUExecutionProvider"]).run(
            None, {"x": feeds["x"]})


@pytest.mark.parametrize("to, strings", [
    (onnx.TensorProto.FLOAT, ["1e", "0b1", "1_000", "0x10", " 2.5x", "-.5e1", "inf"]),
    (onnx.TensorProto.INT32, ["1e10", "0x10", "12abc", " -7", "+3.9"]),
    (onnx.TensorProto.INT64, ["9", "1_000", "-0"]),
])
def test_cast_from_string_reads_the_leading_number(to, strings):
    """Strings convert as C's strtod and strtoll read them, the longest number at the
    start (as onnxruntime does): "1e" is 1.0, "0b1" 0, "1_000" 1, "0x10" 16.0 as a
    float but 0 as an integer, "1e10" the integer 1."""
    graph = helper.make_graph(
        [helper.make_node("Cast", ["x"], ["y"], to=to)], "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.STRING, None)],
        [helper.make_tensor_value_info("y", to, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10).SerializeToString()
    feeds = {"x": np.array(strings, dtype=object)}
    got = onnxrt.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    exp = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    assert got.dtype == exp.dtype
    np.testing.assert_array_equal(got, exp)


@pytest.mark.parametrize("text", ["abc", "ff", "e5", ""])
def test_cast_from_a_string_without_a_leading_number_fails(text):
    graph = helper.make_graph(
        [helper.make_node("Cast", ["x"], ["y"], to=onnx.TensorProto.FLOAT)], "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.STRING, None)],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10).SerializeToString()
    with pytest.raises(onnxrt.OnnxRtError, match="cannot convert string"):
        onnxrt.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": np.array([text], object)})


def test_max_pool_indices_point_at_the_values_returned_with_nan():
    """NaN propagates into MaxPool's values (as numpy's maximum does); its Indices
    output then points at the NaN, never at a value the output does not hold."""
    x = np.array([[[[2.0, np.nan, 1.0, 3.0, 6.0], [0.0, 5.0, 7.0, 4.0, 2.0]]]], F32)
    graph = helper.make_graph(
        [helper.make_node("MaxPool", ["x"], ["y", "i"], kernel_shape=[2, 2])], "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, list(x.shape))],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None),
         helper.make_tensor_value_info("i", onnx.TensorProto.INT64, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 12)], ir_version=10).SerializeToString()
    y, i = onnxrt.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_array_equal(x.reshape(-1)[i], y)  # NaN positions and values alike
    np.testing.assert_array_equal(y.reshape(-1), [np.nan, np.nan, 7.0, 6.0])


@pytest.mark.parametrize("shape, attrs", [((2, 3, 4), {}), ((3, 4), {}), ((2, 3, 4), {"axes": [0, 2, 3]}),
                                          ((2, 3, 4, 5, 2), {})])
def test_mean_variance_normalization_drops_axes_past_the_rank(shape, attrs):
    """The default axes [0, 2, 3] on an input of another rank: onnxruntime drops the
    axes the input lacks (a 3-D input is normalized over [0, 2]) instead of failing."""
    x = np.random.default_rng(len(shape)).standard_normal(shape).astype(F32)
    model = _model("MeanVarianceNormalization", [("x", x)], attrs, 13, 1)
    (got,) = onnxrt.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    (exp,) = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    assert got.shape == exp.shape
    np.testing.assert_allclose(got, exp, rtol=1e-5, atol=1e-5)


def test_mean_variance_normalization_without_an_axis_in_range_fails():
    x = np.ones((2, 3), F32)
    model = _model("MeanVarianceNormalization", [("x", x)], {"axes": [3]}, 13, 1)
    with pytest.raises(onnxrt.OnnxRtError, match="none of the axes"):
        onnxrt.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})
