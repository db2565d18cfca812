"""OpenCL Conv and ConvTranspose: the ONNX node tests, and comparisons with the CPU
provider over groups, depthwise, 1x1, strides, dilations, padding modes and 1-D/3-D."""

import numpy as np
import onnx
import onnxrt as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxrt.errors import InvalidArgument

from ..conftest import make_model
from .kernel_checks import (
    CPU,
    OCL,
    check_node_case,
    compare_with_cpu,
    node_cases,
    skip_without_opencl,
)

pytestmark = skip_without_opencl()

OPS = {"Conv", "ConvTranspose"}


@pytest.mark.parametrize("case", node_cases(OPS))
def test_node_case(case):
    check_node_case(case, OPS, {})


def _conv_model(op, x_shape, w, b, **attrs):
    inits = [numpy_helper.from_array(w, "w")]
    names = ["x", "w"]
    if b is not None:
        inits.append(numpy_helper.from_array(b, "b"))
        names.append("b")
    return make_model(
        [helper.make_node(op, names, ["y"], **attrs)],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )


CONV_CASES = [
    # x shape, w shape, bias, attributes
    ((2, 6, 11, 13), (8, 3, 3, 3), True, dict(group=2, pads=[1, 0, 2, 1], strides=[2, 1], dilations=[1, 2])),
    ((3, 8, 9, 10), (8, 1, 3, 3), True, dict(group=8, pads=[1, 1, 1, 1])),  # depthwise
    ((2, 4, 9, 10), (12, 1, 5, 3), False, dict(group=4, strides=[2, 3], auto_pad="SAME_LOWER")),  # multiplier 3
    ((2, 16, 7, 5), (33, 16, 1, 1), True, {}),  # 1x1: one GEMM per image
    ((2, 16, 7, 5), (33, 16, 1, 1), True, dict(strides=[2, 2])),  # strided 1x1 goes through im2col
    ((3, 5, 17), (7, 5, 4), True, dict(pads=[2, 1])),  # 1-D
    ((2, 3, 5, 6, 7), (4, 3, 2, 3, 2), True, dict(strides=[1, 2, 1], pads=[1, 0, 1, 0, 1, 1])),  # 3-D
    ((1, 3, 23, 19), (5, 3, 4, 4), True, dict(auto_pad="SAME_UPPER", strides=[3, 2])),
    ((2, 64, 12, 12), (40, 64, 3, 3), True, dict(pads=[1, 1, 1, 1])),  # long K = 576
    ((2, 4, 8, 8), (6, 2, 3, 3), False, dict(group=2, auto_pad="VALID", dilations=[2, 2])),
]


@pytest.mark.parametrize("xs,ws,bias,attrs", CONV_CASES, ids=[str(i) for i in range(len(CONV_CASES))])
def test_conv_matches_cpu(xs, ws, bias, attrs):
    rng = np.random.default_rng(sum(xs) + sum(ws))
    x = rng.standard_normal(xs).astype(np.float32)
    w = rng.standard_normal(ws).astype(np.float32)
    b = rng.standard_normal(ws[0]).astype(np.float32) if bias else None
    k = int(np.prod(ws[1:]))
    compare_with_cpu(_conv_model("Conv", xs, w, b, **attrs), {"x": x}, atol=1e-4 * np.sqrt(k))


TRANSPOSE_CASES = [
    ((2, 6, 5, 7), (6, 2, 3, 3), True, dict(group=3, strides=[2, 2], output_padding=[1, 0], pads=[1, 0, 0, 1])),
    ((2, 4, 5, 7), (4, 3, 3, 2), True, dict(strides=[3, 2], dilations=[2, 1], output_shape=[16, 14])),
    ((1, 4, 6), (4, 3, 3), False, dict(strides=[2], auto_pad="SAME_UPPER")),
    ((1, 4, 6), (4, 3, 4), True, dict(strides=[2], auto_pad="SAME_LOWER")),
    ((1, 2, 3, 4, 3), (2, 3, 2, 2, 2), True, dict(strides=[2, 1, 2])),
    ((3, 8, 4, 4), (8, 1, 3, 3), True, dict(group=8, strides=[2, 2], pads=[1, 1, 1, 1], output_padding=[1, 1])),
]


@pytest.mark.parametrize("xs,ws,bias,attrs", TRANSPOSE_CASES, ids=[str(i) for i in range(len(TRANSPOSE_CASES))])
def test_conv_transpose_matches_cpu(xs, ws, bias, attrs):
    rng = np.random.default_rng(sum(xs) + sum(ws))
    x = rng.standard_normal(xs).astype(np.float32)
    w = rng.standard_normal(ws).astype(np.float32)
    b = rng.standard_normal(ws[1] * attrs.get("group", 1)).astype(np.float32) if bias else None
    compare_with_cpu(_conv_model("ConvTranspose", xs, w, b, **attrs), {"x": x}, atol=1e-4 * np.sqrt(xs[1] * 9))


def test_weight_as_runtime_input():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 3, 9, 9)).astype(np.float32)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    model = make_model(
        [helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape)),
         helper.make_tensor_value_info("w", TensorProto.FLOAT, list(w.shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    compare_with_cpu(model, {"x": x, "w": w})


def test_four_spatial_axes_fall_back_to_cpu():
    x = np.random.default_rng(0).standard_normal((1, 2, 3, 3, 3, 3)).astype(np.float32)
    w = np.ones((1, 2, 2, 2, 2, 2), np.float32)
    sess = ort.InferenceSession(_conv_model("Conv", x.shape, w, None), providers=[OCL, CPU])
    (row,) = sess.get_provider_assignment()
    assert row["provider"] == CPU and "spatial axes" in row["reason"]
    ref = ort.InferenceSession(_conv_model("Conv", x.shape, w, None), providers=[CPU]).run(None, {"x": x})
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], ref[0])


def test_channel_mismatch_is_a_typed_error():
    w = np.ones((4, 3, 3, 3), np.float32)
    model = make_model(
        [helper.make_node("Conv", ["x", "w"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, "w")],
    )
    sess = ort.InferenceSession(model, providers=[OCL, CPU])
    with pytest.raises(InvalidArgument, match="input has 5 channels"):
        sess.run(None, {"x": np.ones((1, 5, 6, 6), np.float32)})
    # the session is still usable after the error
    y = sess.run(None, {"x": np.ones((1, 3, 6, 6), np.float32)})[0]
    np.testing.assert_allclose(y, np.full((1, 4, 4, 4), 27.0, np.float32))


def _fused_conv_model(x_shape, w, b, with_z, **attrs):
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")]
    names = ["x", "w", "b"] + (["z"] if with_z else [])
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))]
    if with_z:
        inputs.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, None))
    model = make_model(
        [helper.make_node("FusedConv", names, ["y"], domain="com.microsoft", **attrs)],
        inputs,
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return model


@pytest.mark.parametrize(
    "activation,act_params",
    [("Relu", None), ("Sigmoid", None), ("Tanh", None), ("LeakyRelu", [0.2]), ("Clip", [-0.5, 0.7]),
     ("HardSigmoid", [0.3, 0.4]), ("Elu", [0.8]), ("ThresholdedRelu", [0.25]), ("ScaledTanh", [1.5, 0.5])],
)
@pytest.mark.parametrize("route", ["im2col", "depthwise", "1x1"])
def test_fused_conv_epilogue_matches_cpu(activation, act_params, route):
    # the residual and the activation are applied in the GEMM's or the direct kernel's store
    rng = np.random.default_rng(5)
    ws = {"im2col": (6, 4, 3, 3), "depthwise": (8, 1, 3, 3), "1x1": (6, 4, 1, 1)}[route]
    c = 8 if route == "depthwise" else 4
    attrs = {"activation": activation, "group": c if route == "depthwise" else 1}
    if ws[2] == 3:
        attrs["pads"] = [1, 1, 1, 1]
    if act_params is not None:
        attrs["activation_params"] = act_params
    x = rng.standard_normal((2, c, 7, 9)).astype(np.float32)
    w = rng.standard_normal(ws).astype(np.float32) * 0.3
    b = rng.standard_normal(ws[0]).astype(np.float32)
    z = rng.standard_normal((2, ws[0], 7, 9)).astype(np.float32)
    compare_with_cpu(_fused_conv_model(x.shape, w, b, True, **attrs), {"x": x, "z": z}, rtol=1e-5, atol=1e-5)
    compare_with_cpu(_fused_conv_model(x.shape, w, b, False, **attrs), {"x": x}, rtol=1e-5, atol=1e-5)


def test_fused_conv_in_float16_falls_back_to_cpu():
    # com.microsoft schemas are not onnx's: the kernel checks the type itself
    w = np.ones((2, 1, 3, 3), np.float16)
    model = make_model(
        [helper.make_node("FusedConv", ["x", "w"], ["y"], domain="com.microsoft", activation="Relu")],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [1, 1, 5, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT16, None)],
        [numpy_helper.from_array(w, "w")],
    )
    model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    sess = ort.InferenceSession(model, providers=[OCL, CPU])
    # the CPU provider computes the float16 FusedConv in float32 between Casts (float16_compute)
    (row,) = [r for r in sess.get_provider_assignment() if r["op_type"] == "FusedConv"]
    assert row["provider"] == CPU and "float16" in row["reason"]
    y = sess.run(None, {"x": np.ones((1, 1, 5, 5), np.float16)})[0]
    np.testing.assert_array_equal(y, np.full((1, 2, 3, 3), 9, np.float16))


def test_conv_relu_runs_fused_on_opencl(tmp_path):
    # the level-2 optimizer turns Conv + Relu into FusedConv where OpenCL has that kernel
    rng = np.random.default_rng(6)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    model = make_model(
        [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])],
        [numpy_helper.from_array(w, "w")],
    )
    x = rng.standard_normal((1, 3, 8, 8)).astype(np.float32)
    so = ort.SessionOptions()
    so.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    sess = ort.InferenceSession(model, so, providers=[OCL, CPU])
    assert [n.op_type for n in onnx.load(so.optimized_model_filepath).graph.node] == ["FusedConv"]
    ref = ort.InferenceSession(model, providers=[CPU]).run(None, {"x": x})[0]
    got = sess.run(None, {"x": x})[0]
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
    assert (got >= 0).all() and (got > 0).any()


def test_column_buffer_chunks_over_images(monkeypatch):
    # a small column budget makes im2col and ConvTranspose's GEMM walk the batch in chunks
    from onnxrt_opencl.kernels import conv as conv_module

    monkeypatch.setattr(conv_module, "_COLS_BYTES", 2000)
    rng = np.random.default_rng(8)
    x = rng.standard_normal((5, 4, 9, 8)).astype(np.float32)
    w = rng.standard_normal((6, 2, 3, 3)).astype(np.float32)
    b = rng.standard_normal(6).astype(np.float32)
    compare_with_cpu(_conv_model("Conv", x.shape, w, b, group=2, pads=[1, 1, 1, 1]), {"x": x})
    wt = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    compare_with_cpu(_conv_model("ConvTranspose", x.shape, wt, rng.standard_normal(6).astype(np.float32),
                                 group=2, strides=[2, 2], pads=[1, 0, 0, 1]), {"x": x})
