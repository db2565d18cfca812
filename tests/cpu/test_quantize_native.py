"""The compiled 8-bit QuantizeLinear and DequantizeLinear (``quantize8``/``dequantize8``
in igemm.c): the same codes and values as the numpy path and as onnx's reference
implementation, per tensor and per axis, with NaN, infinities and saturation."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import onnxrt as ort
from onnxrt_cpu import native
from onnxrt_cpu.kernels import quantize as q

pytestmark = pytest.mark.skipif(native.kernels() is None or not hasattr(native.kernels(), "quantize8"),
                                reason="the compiled kernels are not built")

BYTES = [np.uint8, np.int8]


def _data(shape, seed=0, special=True):
    x = np.asarray(np.random.default_rng(seed).standard_normal(shape) * 3, np.float32)
    flat = x.reshape(-1)
    if special and flat.size > 8:
        flat[:6] = [np.inf, -np.inf, 1e30, -1e30, 0.5 * 0.02, -1.5 * 0.02]  # saturation and ties
    return x


def _params(dt, count, seed=1):
    rng = np.random.default_rng(seed)
    lo, hi = np.iinfo(dt).min, np.iinfo(dt).max
    scale = rng.uniform(0.005, 0.05, count).astype(np.float32)
    zp = rng.integers(lo // 4, hi // 4, count).astype(dt)
    return scale, zp


@pytest.mark.parametrize("dt", BYTES)
@pytest.mark.parametrize("shape,axis", [((70001,), 0), ((3, 400, 384), 1), ((3, 400, 384), -1), ((6, 50, 7), 0),
                                        ((5, 33), 1), ((), 1)])
@pytest.mark.parametrize("per_axis", [False, True])
def test_quantize_and_dequantize_match_the_numpy_path(dt, shape, axis, per_axis):
    if per_axis and not shape:
        pytest.skip("a scalar has no axis")
    x = _data(shape)
    count = shape[axis] if per_axis else 1
    scale, zp = _params(dt, count)
    if not per_axis:
        scale, zp = scale.reshape(()), zp.reshape(())
    got = q.quantize8(x, scale, zp, np.dtype(dt), axis)
    assert got is not None and got.dtype == dt and got.shape == x.shape
    with np.errstate(all="ignore"):
        want = q.quantize(x, scale, zp, dt, axis=axis)
    np.testing.assert_array_equal(got, want)
    back = q.dequantize8(got, scale, zp, axis)
    assert back is not None and back.dtype == np.float32
    np.testing.assert_array_equal(back, q.dequantize(got, scale, zp, np.dtype(np.float32), axis=axis))
    # without a zero point
    np.testing.assert_array_equal(q.quantize8(x, scale, None, np.dtype(dt), axis),
                                  q.quantize(x, scale, None, dt, axis=axis))
    np.testing.assert_array_equal(q.dequantize8(got, scale, None, axis),
                                  q.dequantize(got, scale, None, np.dtype(np.float32), axis=axis))


@pytest.mark.parametrize("dt", BYTES)
def test_nan_quantizes_to_zero(dt):
    x = np.array([np.nan, 1.0, -np.nan], np.float32)
    got = q.quantize8(x, np.array(0.1, np.float32), np.array(7, dt), np.dtype(dt))
    np.testing.assert_array_equal(got, np.array([0, 17, 0], dt))


def test_arguments_the_compiled_path_does_not_take():
    x = _data((4, 5))
    s = np.float32(0.1)
    assert q.quantize8(x.astype(np.float64), np.array(s), None, np.dtype(np.uint8)) is None
    assert q.quantize8(x, np.array(s, np.float64), None, np.dtype(np.uint8)) is None
    assert q.quantize8(x, np.array(s), None, np.dtype(np.int16)) is None
    assert q.quantize8(x, np.array(s), np.array(1, np.int8), np.dtype(np.uint8)) is None  # zp of another type
    assert q.quantize8(x, np.full(4, s), None, np.dtype(np.uint8), 1) is None  # 4 scales for an axis of 5
    assert q.quantize8(x, np.full((4, 5), s), None, np.dtype(np.uint8)) is None  # blocked
    assert q.dequantize8(x, np.array(s), None) is None
    k = native.kernels()
    with pytest.raises(ValueError, match="whole runs"):
        k.quantize8(x, np.full(3, s), None, np.empty((4, 5), np.uint8), 5, 1)
    with pytest.raises(TypeError, match="out"):
        k.quantize8(x, np.array([s]), None, np.empty((4, 5), np.int16), 1, 1)


def _qdq_model(dt, shape, axis, count):
    elem = TensorProto.UINT8 if dt == np.uint8 else TensorProto.INT8
    scale, zp = _params(dt, count)
    inits = [numpy_helper.from_array(scale if count > 1 else scale.reshape(()), "s"),
             numpy_helper.from_array(zp if count > 1 else zp.reshape(()), "z")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], axis=axis),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], axis=axis)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("q", elem, shape),
                               helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)], ir_version=9)


@pytest.mark.parametrize("dt", BYTES)
@pytest.mark.parametrize("axis,count", [(1, 1), (1, 384), (0, 2)])
@pytest.mark.parametrize("compiled", [True, False])
def test_session_matches_the_onnx_reference(dt, axis, count, compiled, request):
    if not compiled:
        request.getfixturevalue("numpy_kernels")
    m = _qdq_model(dt, [2, 384, 300] if axis == 0 else [2, 300, 384] if count == 1 else [2, 384, 300], axis, count)
    onnx.checker.check_model(m)
    x = _data([d.dim_value for d in m.graph.input[0].type.tensor_type.shape.dim], special=False)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    got = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    want = ReferenceEvaluator(m).run(None, {"x": x})
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])


def _qlinear_matmul_model(a_shape, b_shape, a_type, b_type, y_type):
    elems = {np.uint8: TensorProto.UINT8, np.int8: TensorProto.INT8}
    zps = {np.uint8: 120, np.int8: -3}
    inits = [numpy_helper.from_array(np.array(v, np.float32), n) for n, v in (("as", 0.02), ("bs", 0.03), ("ys", 0.4))]
    inits += [numpy_helper.from_array(np.array(zps[t] + d, t), n)
              for n, t, d in (("az", a_type, 5), ("bz", b_type, 0), ("yz", y_type, -7))]
    node = helper.make_node("QLinearMatMul", ["a", "as", "az", "b", "bs", "bz", "ys", "yz"], ["y"])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("a", elems[a_type], a_shape),
                                            helper.make_tensor_value_info("b", elems[b_type], b_shape)],
                              [helper.make_tensor_value_info("y", elems[y_type], None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


@pytest.mark.parametrize("a_shape,b_shape", [((1, 6, 40, 64), (1, 6, 64, 40)), ((2, 3, 37, 50), (3, 50, 9)),
                                             ((5, 33), (2, 33, 70)), ((4, 7, 5), (5, 3))])
@pytest.mark.parametrize("types", [(np.uint8, np.uint8, np.uint8), (np.uint8, np.int8, np.int8),
                                   (np.int8, np.int8, np.uint8)])
@pytest.mark.parametrize("compiled", [True, False])
def test_qlinear_matmul_of_two_activations_matches_the_reference(a_shape, b_shape, types, compiled, request):
    """Attention's Q K' and P V: B is an input, packed for the 8-bit product a matrix
    of the batch at a time (batch axes broadcast), exactly as the numpy path and
    onnx's reference compute it."""
    if not compiled:
        request.getfixturevalue("numpy_kernels")
    a_type, b_type, y_type = types
    m = _qlinear_matmul_model(a_shape, b_shape, *types)
    rng = np.random.default_rng(7)
    feeds = {"a": rng.integers(np.iinfo(a_type).min, np.iinfo(a_type).max + 1, a_shape).astype(a_type),
             "b": rng.integers(np.iinfo(b_type).min, np.iinfo(b_type).max + 1, b_shape).astype(b_type)}
    got = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    want = ReferenceEvaluator(m).run(None, feeds)[0]
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)
    # the compiled path took it (a 2-D B with more than one matrix in the batch included)
    mult = np.asarray(np.float32(0.02) * np.float32(0.03) / np.float32(0.4))
    zp = {np.uint8: 120, np.int8: -3}
    direct = q._batched_int8(feeds["a"], np.array(zp[a_type] + 5, a_type), feeds["b"], np.array(zp[b_type], b_type),
                             mult, np.dtype(y_type), np.array(zp[y_type] - 7, y_type))
    if compiled and native.K.igemm_ready():
        np.testing.assert_array_equal(direct, want)
    else:
        assert direct is None


def _conv_integer_model(x_shape, w, w_zp, x_zp, **attrs):
    elems = {np.dtype(np.uint8): TensorProto.UINT8, np.dtype(np.int8): TensorProto.INT8}
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.asarray(x_zp[0], x_zp[1]), "xz"),
             numpy_helper.from_array(w_zp, "wz")]
    node = helper.make_node("ConvInteger", ["x", "w", "xz", "wz"], ["y"], **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", elems[np.dtype(x_zp[1])], x_shape)],
                              [helper.make_tensor_value_info("y", TensorProto.INT32, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 10)], ir_version=9)


def _centred_conv_reference(x, xz, w, wz, per_channel, **attrs):
    """The convolution of the centred integers in float64 by onnx's reference Conv
    (exact at these sizes)."""
    xc = x.astype(np.float64) - float(xz)
    wc = w.astype(np.float64) - (wz.astype(np.float64).reshape((-1,) + (1,) * (w.ndim - 1)) if per_channel
                                 else float(wz))
    node = helper.make_node("Conv", ["x", "w"], ["y"], **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.DOUBLE, list(x.shape))],
                              [helper.make_tensor_value_info("y", TensorProto.DOUBLE, None)],
                              [numpy_helper.from_array(wc, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)], ir_version=9)
    return ReferenceEvaluator(model).run(None, {"x": xc})[0]


@pytest.mark.parametrize("x_type,w_type", [(np.uint8, np.uint8), (np.uint8, np.int8), (np.int8, np.int8)])
@pytest.mark.parametrize("case", [
    dict(x=(1, 3, 33, 31), m=8, k=(3, 3), strides=[2, 2], pads=[1, 1, 1, 1]),   # an RGB stem at stride 2
    dict(x=(2, 16, 12, 12), m=24, k=(3, 3), pads=[1, 1, 1, 1], dilations=[2, 2]),
    dict(x=(1, 12, 9, 10), m=6, k=(1, 1)),
    dict(x=(1, 8, 10, 10), m=8, k=(3, 3), group=2, pads=[0, 1, 2, 1]),
    dict(x=(1, 4, 40), m=5, k=(5,), pads=[2, 2]),                              # 1-D
], ids=["stem", "dilated", "pointwise", "grouped", "1d"])
@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("compiled", [True, False])
def test_conv_integer_on_8bit_products_is_exact(x_type, w_type, case, per_channel, compiled, monkeypatch, request):
    """ConvInteger by qconv8's int32 output (the numpy paths set aside where this CPU
    has the 8-bit kernels), and by the numpy paths alone: the exact sums of the
    centred integers."""
    from onnxrt_cpu.conv import integer

    if not compiled:
        request.getfixturevalue("numpy_kernels")
    elif native.K.igemm_ready():
        def refuse(*args, **kwargs):
            raise AssertionError("the numpy path ran")

        monkeypatch.setattr(integer.IntConvBase, "_accumulate", refuse)
        monkeypatch.setattr(integer.IntConvBase, "_accumulate_rows", refuse)
    rng = np.random.default_rng(9)
    case = dict(case)
    x_shape, m, k = case.pop("x"), case.pop("m"), case.pop("k")
    cg = x_shape[1] // case.get("group", 1)
    lo, hi = np.iinfo(w_type).min, np.iinfo(w_type).max
    w = rng.integers(lo, hi + 1, (m, cg, *k)).astype(w_type)
    w[0] = lo  # a whole channel at the type's edge
    wz = np.asarray(rng.integers(lo // 2, hi // 2, m if per_channel else ()).astype(w_type))
    xz = int(rng.integers(np.iinfo(x_type).min, np.iinfo(x_type).max))
    model = _conv_integer_model(list(x_shape), w, wz, (xz, x_type), kernel_shape=list(k), **case)
    x = rng.integers(np.iinfo(x_type).min, np.iinfo(x_type).max + 1, x_shape).astype(x_type)
    got = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    want = _centred_conv_reference(x, xz, w, wz, per_channel, kernel_shape=list(k), **case)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, want.astype(np.int64))
