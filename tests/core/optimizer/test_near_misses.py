"""Patterns a fusion must leave alone, or fold only where the result stays the same:
found by fuzzing random graphs at every optimization level against ORT_DISABLE_ALL.
Each case runs its graph at ORT_DISABLE_ALL and ORT_ENABLE_ALL and compares shapes and
values (NaN and infinities included)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxrt

F = TensorProto.FLOAT


def _model(nodes, inputs, inits, opset=17):
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
                              [helper.make_tensor_value_info("y", F if nodes[-1].op_type != "QuantizeLinear"
                                                             else TensorProto.INT8, None)],
                              [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8).SerializeToString()


def _run(model, feeds, level):
    so = onnxrt.SessionOptions()
    so.graph_optimization_level = level
    return onnxrt.InferenceSession(model, so, providers=["CPUExecutionProvider"]).run(None, feeds)[0]


def _same_at_every_level(model, feeds):
    plain = _run(model, feeds, onnxrt.GraphOptimizationLevel.ORT_DISABLE_ALL)
    fused = _run(model, feeds, onnxrt.GraphOptimizationLevel.ORT_ENABLE_ALL)
    assert fused.shape == plain.shape
    np.testing.assert_allclose(fused, plain, rtol=1e-6, atol=1e-6, equal_nan=True)


X23 = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
ONE4 = (1, 1, 1, 1)


def test_a_one_element_constant_of_higher_rank_keeps_the_rank_it_broadcasts_to():
    """Mul(x, a) with ``a`` of shape [1, 1, 1, 1] makes a [2, 3] x rank 4; a fused
    QuickGelu kept x's rank."""
    nodes = [helper.make_node("Mul", ["x", "a"], ["xa"]), helper.make_node("Sigmoid", ["xa"], ["s"]),
             helper.make_node("Mul", ["x", "s"], ["y"])]
    _same_at_every_level(_model(nodes, [("x", F, [2, 3])], {"a": np.full(ONE4, 1.702, np.float32)}), {"x": X23})


@pytest.mark.parametrize("power", [2.0001, 2.0], ids=["near square", "square"])
def test_layer_norm_fusion_takes_only_an_exact_square(power):
    """Pow(d, 2.0001) of a negative deviation is NaN; read as a square it was not."""
    nodes = [helper.make_node("ReduceMean", ["x"], ["mu"], axes=[-1]), helper.make_node("Sub", ["x", "mu"], ["d"]),
             helper.make_node("Pow", ["d", "p"], ["q"]), helper.make_node("ReduceMean", ["q"], ["v"], axes=[-1]),
             helper.make_node("Add", ["v", "eps"], ["ve"]), helper.make_node("Sqrt", ["ve"], ["sd"]),
             helper.make_node("Div", ["d", "sd"], ["y"])]
    inits = {"p": np.float32(power), "eps": np.float32(1e-5)}
    _same_at_every_level(_model(nodes, [("x", F, [2, 3])], inits), {"x": X23})


def test_gelu_fusion_takes_only_an_exact_one():
    """``x * 0.5 * (1.00005 + erf(x / sqrt 2))`` is not Gelu."""
    nodes = [helper.make_node("Div", ["x", "c"], ["d"]), helper.make_node("Erf", ["d"], ["e"]),
             helper.make_node("Add", ["e", "one"], ["a"]), helper.make_node("Mul", ["x", "a"], ["m"]),
             helper.make_node("Mul", ["m", "half"], ["y"])]
    inits = {"c": np.float32(math.sqrt(2)), "one": np.float32(1.00005), "half": np.float32(0.5)}
    x = np.array([[-4.0, -3.0, 0.5], [1.0, 2.0, -0.1]], np.float32)
    _same_at_every_level(_model(nodes, [("x", F, [2, 3])], inits), {"x": x})


@pytest.mark.parametrize("op,value", [("Div", 1e-39), ("Mul", 1e38)], ids=["subnormal divisor", "huge factor"])
def test_matmul_scale_fusion_leaves_factors_that_would_overflow(op, value):
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node(op, ["m", "c"], ["y"])]
    inits = {"w": np.array([[3.0, 1.0], [2.0, -2.0], [1.0, 0.5]], np.float32), "c": np.float32(value)}
    _same_at_every_level(_model(nodes, [("x", F, [2, 3])], inits), {"x": X23})


def test_a_transposed_product_with_a_1d_operand_stays_unfused():
    """FusedMatMul with a 1-D operand: onnxruntime computes it wrongly, so a saved
    optimized model would change results there."""
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=[1, 0]), helper.make_node("MatMul", ["t", "v"], ["y"])]
    model = _model(nodes, [("x", F, [2, 3])], {"v": np.array([1.0, -0.5], np.float32)})
    so = onnxrt.SessionOptions()
    so.graph_optimization_level = onnxrt.GraphOptimizationLevel.ORT_ENABLE_ALL
    sess = onnxrt.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    assert "FusedMatMul" not in {n.op_type for n in sess._built.graph.nodes}
    _same_at_every_level(model, {"x": X23})


@pytest.mark.parametrize("factor", [np.inf, np.nan], ids=["inf", "nan"])
def test_conv_mul_fusion_leaves_factors_that_are_not_finite(factor):
    """Conv(x) * inf is +-inf; Conv(x, W * inf) sums +inf and -inf products to NaN."""
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Mul", ["c", "s"], ["y"])]
    inits = {"w": np.array([[[1.0, -1.0]], [[2.0, 1.0]]], np.float32),
             "s": np.array([[factor], [2.0]], np.float32)}
    x = np.array([[[1.0, 2.0, 0.5, -3.0, 1.0]]], np.float32)
    _same_at_every_level(_model(nodes, [("x", F, [1, 1, 5])], inits), {"x": x})


def test_shape_slicing_backwards_to_the_start_is_folded_as_slice_reads_it():
    """Slice(Shape(x), -1, INT64_MAX, step -1) is every dimension backwards (an end of
    INT64_MAX means "to the last end"); the fold took it as none."""
    nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Slice", ["s", "st", "en", "ax", "sp"], ["t"]),
             helper.make_node("ReduceProd", ["t"], ["p"], keepdims=1), helper.make_node("Reshape", ["x", "p"], ["r"]),
             helper.make_node("Shape", ["r"], ["rs"]), helper.make_node("Cast", ["rs"], ["y"], to=F)]
    inits = {"st": np.array([-1], np.int64), "en": np.array([np.iinfo(np.int64).max], np.int64),
             "ax": np.array([0], np.int64), "sp": np.array([-1], np.int64)}
    model = _model(nodes, [("x", F, ["N", 3, 4])], inits)
    x = np.ones((2, 3, 4), np.float32)
    _same_at_every_level(model, {"x": x})
    assert _run(model, {"x": x}, onnxrt.GraphOptimizationLevel.ORT_ENABLE_ALL).tolist() == [24.0]


def test_qdq_gemm_with_alpha_and_a_bias_stays_unfused():
    """QGemm scales its int32 bias with the product (alpha (A B + C)); Gemm adds C after
    alpha A B, so at alpha 0.5 the fused bias was halved."""
    a_s, b_s = np.float32(0.05), np.float32(0.02)
    nodes = [helper.make_node("QuantizeLinear", ["x", "as", "az"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "as", "az"], ["xd"]),
             helper.make_node("DequantizeLinear", ["wq", "bs", "bz"], ["wd"]),
             helper.make_node("DequantizeLinear", ["cq", "cs"], ["cd"]),
             helper.make_node("Gemm", ["xd", "wd", "cd"], ["y"], alpha=0.5)]
    inits = {"as": a_s, "az": np.uint8(128), "bs": b_s, "bz": np.int8(0),
             "wq": np.array([[10, -20], [30, 5], [-7, 12]], np.int8), "cq": np.array([500, -300], np.int32),
             "cs": np.float32(a_s * b_s)}
    _same_at_every_level(_model(nodes, [("x", F, [2, 3])], inits, opset=13), {"x": X23})


def test_qdq_max_pool_with_a_negative_scale_stays_unfused():
    """With a negative scale the largest value is the smallest integer: MaxPool on the
    integers picked the other element."""
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["d"]),
             helper.make_node("MaxPool", ["d"], ["p"], kernel_shape=[2, 2]),
             helper.make_node("QuantizeLinear", ["p", "s", "z"], ["y"])]
    inits = {"s": np.float32(-0.1), "z": np.int8(0)}
    x = np.array([[[[1.0, -1.5], [0.2, 0.7]]]], np.float32)
    _same_at_every_level(_model(nodes, [("x", F, [1, 1, 2, 2])], inits, opset=13), {"x": x})


def _saved_runs_on_onnxruntime(model, feeds, tmp_path):
    ort = pytest.importorskip("onnxruntime")
    so = onnxrt.SessionOptions()
    so.graph_optimization_level = onnxrt.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.optimized_model_filepath = str(tmp_path / "saved.onnx")
    ours = onnxrt.InferenceSession(model, so, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    theirs = ort.InferenceSession(str(tmp_path / "saved.onnx"), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_allclose(theirs.astype(np.float64), ours.astype(np.float64), rtol=1e-5, atol=1e-5)


def test_saved_qdq_products_use_type_pairs_onnxruntime_has(tmp_path):
    """int8 activations with uint8 weights: no QLinearMatMul in the saved model, which
    onnxruntime could not load."""
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"]),
             helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"]),
             helper.make_node("MatMul", ["xd", "wd"], ["p"]),
             helper.make_node("QuantizeLinear", ["p", "ys", "z"], ["y"])]
    inits = {"s": np.float32(0.05), "z": np.int8(0), "ws": np.float32(0.01), "wz": np.uint8(128), "ys": np.float32(0.02),
             "w": np.random.default_rng(1).integers(0, 255, (3, 2)).astype(np.uint8)}
    _saved_runs_on_onnxruntime(_model(nodes, [("x", F, [2, 3])], inits, opset=13), {"x": X23}, tmp_path)


def test_saved_skip_layer_norm_has_no_negative_epsilon(tmp_path):
    """A decomposed layer norm with a negative epsilon stays decomposed: onnxruntime's
    SkipLayerNormalization refuses one."""
    nodes = [helper.make_node("Add", ["x", "s"], ["a"]),
             helper.make_node("ReduceMean", ["a"], ["mu"], axes=[-1]), helper.make_node("Sub", ["a", "mu"], ["d"]),
             helper.make_node("Mul", ["d", "d"], ["q"]), helper.make_node("ReduceMean", ["q"], ["v"], axes=[-1]),
             helper.make_node("Add", ["v", "eps"], ["ve"]), helper.make_node("Sqrt", ["ve"], ["sd"]),
             helper.make_node("Div", ["d", "sd"], ["n"]), helper.make_node("Mul", ["n", "g"], ["ng"]),
             helper.make_node("Add", ["ng", "b"], ["y"])]
    x = np.array([[3.0, -1.0, 2.0, 0.5], [1.0, 2.0, -2.0, 4.0]], np.float32)
    inits = {"s": np.ones((2, 4), np.float32), "eps": np.float32(-0.5), "g": np.ones(4, np.float32),
             "b": np.zeros(4, np.float32)}
    _saved_runs_on_onnxruntime(_model(nodes, [("x", F, [2, 4])], inits), {"x": x}, tmp_path)


def test_a_stale_declared_shape_does_not_drive_the_optimizer():
    """value_info declaring Reshape's [3, 2] output as [2, 3] (the checker passes it):
    the Reshape looked like a no-op and Shape(y) folded to [2, 3]; the shapes inference
    computes from the graph win over declared ones."""
    nodes = [helper.make_node("Reshape", ["x", "t"], ["r"]), helper.make_node("Shape", ["r"], ["s"]),
             helper.make_node("Cast", ["s"], ["y"], to=F)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, [2, 3])],
                              [helper.make_tensor_value_info("y", F, None)],
                              [numpy_helper.from_array(np.array([3, 2], np.int64), "t")],
                              value_info=[helper.make_tensor_value_info("r", F, [2, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    _same_at_every_level(model, {"x": x})
    assert _run(model, {"x": x}, onnxrt.GraphOptimizationLevel.ORT_ENABLE_ALL).tolist() == [3.0, 2.0]
