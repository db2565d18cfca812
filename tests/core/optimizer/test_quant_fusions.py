"""Quantization fusions: QDQ node units and dynamic-quantization chains become integer
ops at level 2, and compute what the unfused graph (and onnxruntime) computes."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from ...ort_oracle import int8_weight_range, u8s8_pairs_saturate
from .util import ALL, BASIC, OFF, model, ops, session, vi

ort = pytest.importorskip("onnxruntime")
quantization = pytest.importorskip("onnxruntime.quantization")

DATA = Path(__file__).resolve().parents[2] / "models" / "data"
I8, U8 = TensorProto.INT8, TensorProto.UINT8


def _q(name, out, scale, zp):
    return helper.make_node("QuantizeLinear", [name, scale, zp], [out])


def _dq(name, out, scale, zp, **attrs):
    return helper.make_node("DequantizeLinear", [name, scale, zp], [out], **attrs)


def _within_one_step(got, want, step):
    """Outputs (dequantized) differ by at most one quantization step, and rarely."""
    diff = np.abs(got.astype(np.float64) - want)
    assert diff.max() <= step * 1.0001, diff.max() / step
    assert (diff > step * 1e-3).mean() <= 0.02


def _conv_model(*, w_scale=None, bias_scale=None, extra_output=False, y_zp=3):
    """x -Q-DQ-> Conv(DQ(w), DQ(b)) -Q-DQ-> y, int8 activations and weights."""
    rng = np.random.default_rng(0)
    w = rng.integers(-127, 128, (8, 4, 3, 3)).astype(np.int8)
    xs, ys = np.float32(0.05), np.float32(0.2)
    ws = np.float32(0.01) if w_scale is None else w_scale
    bias_scale = np.asarray(xs * ws, np.float32) if bias_scale is None else bias_scale
    inits = {
        "xs": xs, "xz": np.int8(-2), "w": w, "ws": ws, "wz": np.zeros(np.shape(ws), np.int8),
        "b": rng.integers(-500, 500, 8).astype(np.int32), "bs": bias_scale,
        "bz": np.zeros(np.shape(bias_scale), np.int32), "ys": ys, "yz": np.int8(y_zp),
    }
    nodes = [
        _q("x", "xq", "xs", "xz"), _dq("xq", "xd", "xs", "xz"),
        _dq("w", "wd", "ws", "wz", axis=0), _dq("b", "bd", "bs", "bz", axis=0),
        helper.make_node("Conv", ["xd", "wd", "bd"], ["c"], pads=[1, 1, 1, 1]),
        _q("c", "cq", "ys", "yz"), _dq("cq", "y", "ys", "yz"),
    ]
    outs = [vi("y", None)] + ([vi("c", None)] if extra_output else [])
    return model(nodes, [vi("x", [2, 4, 9, 9])], outs, inits.items(), opset=13)


def _x(shape, seed=1):
    return {"x": np.random.default_rng(seed).standard_normal(shape).astype(np.float32)}


def _compare(m, feeds, step, expect_fused, absent):
    fused = session(m, ALL)
    assert expect_fused <= set(ops(fused)), ops(fused)
    assert not (absent & set(ops(fused))), ops(fused)
    got = fused.run(None, feeds)[0]
    want = session(m, OFF).run(None, feeds)[0]
    _within_one_step(got, want, step)
    return got


def test_qdq_conv_becomes_qlinear_conv():
    m = _conv_model()
    _compare(m, _x([2, 4, 9, 9]), 0.2, {"QLinearConv"}, {"Conv"})


def test_qdq_conv_per_channel_weights():
    ws = np.linspace(0.005, 0.02, 8).astype(np.float32)
    m = _conv_model(w_scale=ws)
    _compare(m, _x([2, 4, 9, 9]), 0.2, {"QLinearConv"}, {"Conv"})


def test_qdq_conv_not_fused_with_a_bias_scale_other_than_x_times_w():
    m = _conv_model(bias_scale=np.asarray(0.05 * 0.01 * 1.5, np.float32))
    assert ops(session(m, ALL))["Conv"] == 1


def test_qdq_conv_not_fused_when_its_float_output_is_a_graph_output():
    m = _conv_model(extra_output=True)
    sess = session(m, ALL)
    assert "QLinearConv" not in ops(sess)
    got = sess.run(None, _x([2, 4, 9, 9]))
    want = session(m, OFF).run(None, _x([2, 4, 9, 9]))
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def test_level_one_still_folds_weight_dequantization():
    m = _conv_model()
    basic = ops(session(m, BASIC))
    assert basic["DequantizeLinear"] == 2  # the activation's and the output's
    # at level 2 the ones left unfused are folded after the fusions
    assert ops(session(m, ALL))["DequantizeLinear"] == 1


def _binary_model(op, b_scale=0.03):
    inits = {"as": np.float32(0.02), "az": np.uint8(120), "bs": np.float32(b_scale), "bz": np.uint8(128),
             "cs": np.float32(0.04), "cz": np.uint8(100)}
    nodes = [
        _q("a", "aq", "as", "az"), _dq("aq", "ad", "as", "az"),
        _q("b", "bq", "bs", "bz"), _dq("bq", "bd", "bs", "bz"),
        helper.make_node(op, ["ad", "bd"], ["c"]),
        _q("c", "cq", "cs", "cz"), _dq("cq", "y", "cs", "cz"),
    ]
    return model(nodes, [vi("a", [3, 16]), vi("b", [16])], [vi("y", None)], inits.items(), opset=13)


@pytest.mark.parametrize("op", ["Add", "Mul"])
def test_qdq_add_mul_become_qlinear(op):
    rng = np.random.default_rng(2)
    feeds = {"a": rng.standard_normal((3, 16)).astype(np.float32), "b": rng.standard_normal(16).astype(np.float32)}
    _compare(_binary_model(op), feeds, 0.04, {f"com.microsoft:QLinear{op}"}, {op})


def _matmul_model(quantized_out=True, n=5):
    rng = np.random.default_rng(3)
    inits = {"as": np.float32(0.03), "az": np.int8(4), "w": rng.integers(-127, 128, (16, n)).astype(np.int8),
             "ws": np.float32(0.01), "wz": np.int8(0), "ys": np.float32(0.05), "yz": np.int8(-1)}
    nodes = [
        _q("x", "xq", "as", "az"), _dq("xq", "xd", "as", "az"), _dq("w", "wd", "ws", "wz"),
        helper.make_node("MatMul", ["xd", "wd"], ["c" if quantized_out else "y"]),
    ]
    if quantized_out:
        nodes += [_q("c", "cq", "ys", "yz"), _dq("cq", "y", "ys", "yz")]
    return model(nodes, [vi("x", [2, 7, 16])], [vi("y", None)], inits.items(), opset=13)


def test_qdq_matmul_becomes_qlinear_matmul():
    _compare(_matmul_model(), _x([2, 7, 16]), 0.05, {"QLinearMatMul"}, {"MatMul"})


def _per_column_matmul_model(k=48, n=40, axis=1, zp_shift=0):
    """uint8 activations times an int8 weight quantized per column (its scale and zero
    point [N] on axis 1), requantized: a Whisper-style encoder's QDQ linear layer."""
    rng = np.random.default_rng(4)
    ws = rng.uniform(0.001, 0.02, n).astype(np.float32)
    wz = np.zeros(n, np.int8) + np.int8(zp_shift)
    inits = {"as": np.float32(0.04), "az": np.uint8(131), "w": rng.integers(-127, 128, (k, n)).astype(np.int8),
             "ws": ws if axis == 1 else ws[:k], "wz": wz if axis == 1 else wz[:k],
             "ys": np.float32(0.03), "yz": np.uint8(120)}
    nodes = [
        _q("x", "xq", "as", "az"), _dq("xq", "xd", "as", "az"), _dq("w", "wd", "ws", "wz", axis=axis),
        helper.make_node("MatMul", ["xd", "wd"], ["c"]),
        _q("c", "cq", "ys", "yz"), _dq("cq", "y", "ys", "yz"),
    ]
    return model(nodes, [vi("x", [1, 37, k])], [vi("y", None)], inits.items(), opset=13)


@pytest.mark.parametrize("zp_shift", [0, 3])
@pytest.mark.parametrize("compiled", [True, False])
def test_qdq_matmul_per_column_weights_become_qlinear_matmul(zp_shift, compiled, request):
    if not compiled:
        request.getfixturevalue("numpy_kernels")  # the per-column ratio on the numpy path
    m = _per_column_matmul_model(zp_shift=zp_shift)
    feeds = _x([1, 37, 48], seed=5)
    got = _compare(m, feeds, 0.03, {"QLinearMatMul"}, {"MatMul"})
    # onnxruntime fuses the same unit into its QLinearMatMul: the integers agree
    ref = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    _within_one_step(got, ref, 0.03)


def test_qdq_matmul_per_row_weights_stay_float():
    """A weight quantized along K (axis 0) has no per-column form: the MatMul stays."""
    m = _per_column_matmul_model(k=40, n=40, axis=0)
    sess = session(m, ALL)
    assert "QLinearMatMul" not in ops(sess) and ops(sess)["MatMul"] == 1
    feeds = _x([1, 37, 40], seed=6)
    np.testing.assert_array_equal(sess.run(None, feeds)[0], session(m, OFF).run(None, feeds)[0])


def test_qdq_matmul_with_float_output_becomes_matmul_integer_to_float():
    m = _matmul_model(quantized_out=False)
    fused = session(m, ALL)
    assert "com.microsoft:MatMulIntegerToFloat" in ops(fused)
    got = fused.run(None, _x([2, 7, 16]))[0]
    want = session(m, OFF).run(None, _x([2, 7, 16]))[0]
    # the same integers, scaled once instead of per product: float32 rounding only
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def _pool_model(op, same=True, **attrs):
    inits = {"s": np.float32(0.02), "z": np.int8(-5), "s2": np.float32(0.02 if same else 0.03), "z2": np.int8(-5)}
    nodes = [
        _q("x", "xq", "s", "z"), _dq("xq", "xd", "s", "z"),
        helper.make_node(op, ["xd"], ["p"], **attrs),
        _q("p", "pq", "s2", "z2"), _dq("pq", "y", "s2", "z2"),
    ]
    return model(nodes, [vi("x", [2, 3, 8, 8])], [vi("y", None)], inits.items(), opset=13)


def test_qdq_maxpool_runs_on_integers():
    m = _pool_model("MaxPool", kernel_shape=[2, 2], strides=[2, 2])
    fused = session(m, ALL)
    assert ops(fused)["QuantizeLinear"] == 1 and ops(fused)["MaxPool"] == 1
    feeds = _x([2, 3, 8, 8])
    # max commutes with a monotonic dequantization: exactly equal
    np.testing.assert_array_equal(fused.run(None, feeds)[0], session(m, OFF).run(None, feeds)[0])


def test_qdq_maxpool_kept_when_the_scales_differ():
    m = _pool_model("MaxPool", same=False, kernel_shape=[2, 2], strides=[2, 2])
    assert ops(session(m, ALL))["QuantizeLinear"] == 2


def test_qdq_global_average_pool_becomes_qlinear():
    m = _pool_model("GlobalAveragePool", same=False)
    _compare(m, _x([2, 3, 8, 8]), 0.03, {"com.microsoft:QLinearGlobalAveragePool"}, {"GlobalAveragePool"})


def test_qdq_gemm_becomes_qgemm():
    rng = np.random.default_rng(4)
    xs, ws = np.float32(0.03), np.float32(0.01)
    inits = {"xs": xs, "xz": np.uint8(128), "w": rng.integers(-127, 128, (6, 16)).astype(np.int8),
             "ws": ws, "wz": np.int8(0), "b": rng.integers(-300, 300, 6).astype(np.int32),
             "bs": np.float32(xs * ws), "bz": np.int32(0)}
    nodes = [
        _q("x", "xq", "xs", "xz"), _dq("xq", "xd", "xs", "xz"), _dq("w", "wd", "ws", "wz"),
        _dq("b", "bd", "bs", "bz"), helper.make_node("Gemm", ["xd", "wd", "bd"], ["y"], transB=1),
    ]
    m = model(nodes, [vi("x", [4, 16])], [vi("y", None)], inits.items(), opset=13)
    fused = session(m, ALL)
    assert "com.microsoft:QGemm" in ops(fused) and "Gemm" not in ops(fused)
    np.testing.assert_allclose(fused.run(None, _x([4, 16]))[0], session(m, OFF).run(None, _x([4, 16]))[0],
                               rtol=1e-5, atol=1e-6)


def _lookup_model(dt, second_input=False, extra_reader=False):
    """x -Q-DQ-> Div(1.414) -> Erf -> Add(1) -Q-DQ-> y (the Gelu pieces of a QDQ model)."""
    zp = np.int8(-3) if dt == I8 else np.uint8(130)
    inits = {"s": np.float32(0.03), "z": zp, "k": np.float32(1.4142135), "one": np.float32(1.0),
             "ys": np.float32(0.008), "yz": np.zeros((), zp.dtype)}
    nodes = [
        _q("x", "xq", "s", "z"), _dq("xq", "xd", "s", "z"),
        helper.make_node("Div", ["xd", "d" if second_input else "k"], ["t"]),
        helper.make_node("Erf", ["t"], ["e"]),
        helper.make_node("Add", ["e", "one"], ["a"]),
        _q("a", "aq", "ys", "yz"), _dq("aq", "y", "ys", "yz"),
    ]
    inputs = [vi("x", [4, 33])] + ([vi("d", [])] if second_input else [])
    outs = [vi("y", None)] + ([vi("e", None)] if extra_reader else [])
    return model(nodes, inputs, outs, inits.items(), opset=13)


@pytest.mark.parametrize("dt", [I8, U8])
def test_qdq_elementwise_chain_becomes_a_table_lookup(dt):
    m = _lookup_model(dt)
    fused = session(m, ALL)
    counts = ops(fused)
    assert "Erf" not in counts and "Div" not in counts and counts["ai.onnxrt:LookupTable"] == 1, counts
    feeds = {"x": np.linspace(-6, 6, 132, dtype=np.float32).reshape(4, 33)}
    got = fused.run(None, feeds)[0]
    # the table holds what the float ops compute for each of the 256 inputs: equal
    np.testing.assert_array_equal(got, session(m, OFF).run(None, feeds)[0])
    assert len(np.unique(got)) > 20


@pytest.mark.parametrize("kw", [{"second_input": True}, {"extra_reader": True}])
def test_qdq_elementwise_chain_kept_when_not_a_function_of_x_alone(kw):
    m = _lookup_model(I8, **kw)
    assert ops(session(m, ALL))["Erf"] == 1


def _gelu_model(dt, *, read_inside=False, const_shape=()):
    """x -Q-DQ-> Gelu as onnxruntime's static quantizer leaves it: each op's output
    quantized, and the last-but-one Mul reading DQ(x) again. ``read_inside`` makes the
    Erf's quantized output a graph output too; ``const_shape`` shapes the constant 1."""
    zp = np.int8(4) if dt == I8 else np.uint8(120)
    z = lambda: np.zeros((), zp.dtype)  # noqa: E731
    inits = {"s": np.float32(0.04), "z": zp, "k": np.float32(1.4142135),
             "one": np.ones(const_shape, np.float32), "half": np.float32(0.5),
             "es": np.float32(1 / 127), "ez": z(), "as": np.float32(2 / 255), "az": z(),
             "ms": np.float32(0.05), "mz": z(), "ys": np.float32(0.03), "yz": zp}
    nodes = [
        _q("x", "xq", "s", "z"), _dq("xq", "xd", "s", "z"),
        helper.make_node("Div", ["xd", "k"], ["t"]),
        helper.make_node("Erf", ["t"], ["e"]),
        _q("e", "eq", "es", "ez"), _dq("eq", "ed", "es", "ez"),
        helper.make_node("Add", ["ed", "one"], ["a"]),
        _q("a", "aq", "as", "az"), _dq("aq", "ad", "as", "az"),
        helper.make_node("Mul", ["xd", "ad"], ["m"]),
        _q("m", "mq", "ms", "mz"), _dq("mq", "md", "ms", "mz"),
        helper.make_node("Mul", ["md", "half"], ["h"]),
        _q("h", "hq", "ys", "yz"), _dq("hq", "y", "ys", "yz"),
    ]
    outs = [vi("y", None)] + ([vi("eq", None, dt)] if read_inside else [])
    return model(nodes, [vi("x", [3, 40])], outs, inits.items(), opset=13)


@pytest.mark.parametrize("dt", [I8, U8])
def test_qdq_gelu_becomes_one_table_lookup(dt):
    m = _gelu_model(dt)
    counts = ops(session(m, ALL))
    # the two Muls, the Add and the Div -> Erf: one table, nothing else left of them
    assert counts["ai.onnxrt:LookupTable"] == 1, counts
    assert not {"Erf", "Mul", "Add", "com.microsoft:QLinearMul", "com.microsoft:QLinearAdd"} & set(counts), counts
    feeds = {"x": np.linspace(-5, 5, 120, dtype=np.float32).reshape(3, 40)}
    got = session(m, ALL).run(None, feeds)[0]
    np.testing.assert_array_equal(got, session(m, OFF).run(None, feeds)[0])
    assert len(np.unique(got)) > 40
    # onnxruntime runs the node units one by one: the same codes
    np.testing.assert_array_equal(got, ort.InferenceSession(m.SerializeToString()).run(None, feeds)[0])


def test_qdq_gelu_table_stops_where_a_value_is_read_outside():
    m = _gelu_model(U8, read_inside=True)
    sess = session(m, ALL)
    counts = ops(sess)
    # the Erf's codes are a graph output: Div -> Erf is a table of x, which ends there;
    # the Mul reading x and the Erf's (added) codes, two tensors, is a QLinearMul, and
    # the Add of 1 and the Mul by 0.5 (float constants) are tables of their inputs
    assert counts["ai.onnxrt:LookupTable"] == 3 and "Erf" not in counts, counts
    assert counts["com.microsoft:QLinearMul"] == 1 and "Mul" not in counts and "Add" not in counts, counts
    feeds = {"x": np.linspace(-5, 5, 120, dtype=np.float32).reshape(3, 40)}
    for g, w in zip(sess.run(None, feeds), session(m, OFF).run(None, feeds)):
        np.testing.assert_array_equal(g, w)


def test_qdq_table_not_made_when_a_constant_adds_dimensions():
    # Add of a [1, 1, 1] one makes the [3, 40] result [1, 3, 40]: no table of x's shape
    m = _gelu_model(U8, const_shape=(1, 1, 1))
    sess = session(m, ALL)
    feeds = {"x": np.linspace(-5, 5, 120, dtype=np.float32).reshape(3, 40)}
    got, want = sess.run(None, feeds)[0], session(m, OFF).run(None, feeds)[0]
    assert got.shape == want.shape == (1, 3, 40)
    np.testing.assert_array_equal(got, want)


def test_lookup_table_op_checks_its_operands():
    nodes = [helper.make_node("LookupTable", ["x", "t"], ["y"], domain="ai.onnxrt")]
    m = helper.make_model(
        helper.make_graph(nodes, "g", [vi("x", [5], I8), vi("t", [None], U8)], [vi("y", None, U8)]),
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnxrt", 1)], ir_version=10)
    sess = session(m, OFF)
    table = np.arange(256, dtype=np.uint8)[::-1].copy()
    x = np.array([-128, -1, 0, 1, 127], np.int8)
    # indexed by bit pattern: -128 is entry 128, -1 entry 255
    assert sess.run(None, {"x": x, "t": table})[0].tolist() == [127, 0, 255, 254, 128]
    with pytest.raises(Exception, match="256 one-byte values"):
        sess.run(None, {"x": x, "t": table[:10]})


def _dynamic_model(shared=False):
    rng = np.random.default_rng(5)
    inits = {"w": rng.integers(-127, 128, (16, 6)).astype(np.int8), "wz": np.int8(0),
             "ws": np.float32(0.007), "bias": rng.standard_normal(6).astype(np.float32)}
    nodes = [
        helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"]),
        helper.make_node("Mul", ["xs", "ws"], ["scale"]),
        helper.make_node("MatMulInteger", ["xq", "w", "xz", "wz"], ["acc"]),
        helper.make_node("Cast", ["acc"], ["accf"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["accf", "scale"], ["mm"]),
        helper.make_node("Add", ["bias", "mm"], ["y"]),
    ]
    outs = [vi("y", None)]
    if shared:
        nodes += [helper.make_node("MatMulInteger", ["xq", "w", "xz", "wz"], ["acc2"]),
                  helper.make_node("Cast", ["acc2"], ["acc2f"], to=TensorProto.FLOAT),
                  helper.make_node("Mul", ["acc2f", "scale"], ["y2"])]
        outs.append(vi("y2", None))
    return model(nodes, [vi("x", [3, 4, 16])], outs, inits.items(), opset=13)


@pytest.mark.parametrize("shared,fused_op", [(False, "DynamicQuantizeMatMul"), (True, "MatMulIntegerToFloat")])
def test_dynamic_quantized_matmul_chain_is_fused(shared, fused_op):
    m = _dynamic_model(shared)
    fused = session(m, ALL)
    counts = ops(fused)
    assert counts[f"com.microsoft:{fused_op}"] == (2 if shared else 1), counts
    assert "MatMulInteger" not in counts and "Cast" not in counts
    feeds = _x([3, 4, 16])
    # the same integer products, scaled by the same float32 product: bit for bit
    for g, w in zip(fused.run(None, feeds), session(m, OFF).run(None, feeds)):
        np.testing.assert_array_equal(g, w)


def test_dynamic_chain_not_fused_when_an_intermediate_is_read_elsewhere():
    m = _dynamic_model()
    m.graph.output.append(vi("acc", None))
    assert ops(session(m, ALL))["MatMulInteger"] == 1


def _dynamic_conv_model(bias_shape=(1, 8, 1, 1), relu=True, extra_output=None, wtype=np.uint8):
    """A dynamically quantized convolution as quantize_dynamic writes it (IS-Net's):
    ``Relu(Mul(Cast(ConvInteger(DynamicQuantizeLinear(x), W)), x_scale * w_scale) + b)``."""
    rng = np.random.default_rng(8)
    lo, hi = np.iinfo(wtype).min, np.iinfo(wtype).max
    inits = {"w": rng.integers(lo, hi + 1, (8, 4, 3, 3)).astype(wtype), "wz": wtype(hi // 2 + 1),
             "ws": np.float32(0.004), "b": rng.standard_normal(bias_shape).astype(np.float32)}
    nodes = [
        helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"]),
        helper.make_node("Mul", ["xs", "ws"], ["scale"]),
        helper.make_node("ConvInteger", ["xq", "w", "xz", "wz"], ["acc"], pads=[1, 1, 1, 1], strides=[2, 1]),
        helper.make_node("Cast", ["acc"], ["accf"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["accf", "scale"], ["mm"]),
        helper.make_node("Add", ["mm", "b"], ["biased"]),
    ]
    nodes.append(helper.make_node("Relu", ["biased"], ["y"]) if relu else helper.make_node("Identity", ["biased"], ["y"]))
    outs = [vi("y", None)] + ([vi(extra_output, None)] if extra_output else [])
    return model(nodes, [vi("x", [2, 4, 11, 10])], outs, inits.items(), opset=13)


@pytest.mark.parametrize("relu", [True, False])
@pytest.mark.parametrize("wtype", [np.uint8, np.int8])
@pytest.mark.parametrize("compiled", [True, False])
def test_dynamic_quantized_conv_chain_is_fused(relu, wtype, compiled, request):
    if not compiled:
        request.getfixturevalue("numpy_kernels")
    m = _dynamic_conv_model(relu=relu, wtype=wtype)
    fused = session(m, ALL)
    counts = ops(fused)
    assert counts["ai.onnxrt:ConvIntegerToFloat"] == 1, counts
    assert not {"ConvInteger", "Cast", "Add", "Relu"} & set(counts), counts
    feeds = _x([2, 4, 11, 10], seed=3)
    got = fused.run(None, feeds)[0]
    # the same int32 sums, converted, scaled, biased and clamped as the four ops: bit for bit
    np.testing.assert_array_equal(got, session(m, OFF).run(None, feeds)[0])
    if wtype == np.uint8:  # (onnxruntime's ConvInteger takes uint8 weights)
        want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
        np.testing.assert_array_equal(got, want)


def test_dynamic_quantized_conv_fused_op_runs_its_numpy_path(monkeypatch):
    """Where the compiled convolution does not take the node, the fused op computes
    the same values on the numpy path."""
    from onnxrt_cpu.conv import integer

    monkeypatch.setattr(integer.IntConvBase, "_native_int32", lambda self, *a, **k: None)
    m = _dynamic_conv_model()
    fused = session(m, ALL)
    assert ops(fused)["ai.onnxrt:ConvIntegerToFloat"] == 1
    feeds = _x([2, 4, 11, 10], seed=4)
    np.testing.assert_array_equal(fused.run(None, feeds)[0], session(m, OFF).run(None, feeds)[0])


@pytest.mark.parametrize("kw", [dict(bias_shape=(8,)), dict(bias_shape=(1, 1, 8, 1, 1)), dict(extra_output="accf")])
def test_dynamic_quantized_conv_kept_where_the_fused_op_would_differ(kw):
    """A bias that does not add one value a channel without changing the output's
    shape (an [8] bias adds along the last axis), or an intermediate read
    elsewhere: the Add (or the whole chain) stays as written."""
    m = _dynamic_conv_model(**kw)
    counts = ops(session(m, ALL))
    if "extra_output" in kw:
        assert "ai.onnxrt:ConvIntegerToFloat" not in counts and counts["ConvInteger"] == 1, counts
    else:
        assert counts["Add"] == 1, counts
    feeds = {"x": np.random.default_rng(5).standard_normal((2, 4, 11, 10)).astype(np.float32)}
    if kw.get("bias_shape") == (8,):
        feeds = {"x": np.random.default_rng(5).standard_normal((2, 4, 11, 8)).astype(np.float32)}
        m = _dynamic_conv_model(**kw)
        m.graph.input[0].type.tensor_type.shape.dim[3].dim_value = 8
    for g, w in zip(session(m, ALL).run(None, feeds), session(m, OFF).run(None, feeds)):
        np.testing.assert_array_equal(g, w)


def _dynamic_attention_model(wtype=np.int8, shared=None, weight_scale="ws"):
    """``QAttention(DynamicQuantizeLinear(x))`` as quantize_dynamic writes it for BERT
    (two heads of 4, a key mask); ``shared`` names a DynamicQuantizeLinear output that
    is also a graph output."""
    rng = np.random.default_rng(7)
    # int8 weights where onnxruntime's uint8 x int8 products are exact here (tests/ort_oracle.py)
    lo, hi = (max(-127, int8_weight_range()[0]), int8_weight_range()[1]) if wtype == np.int8 else (0, 256)
    inits = {"w": rng.integers(lo, hi, (8, 24)).astype(wtype), "wz": np.array(3, wtype),
             "ws": np.linspace(0.002, 0.01, 24).astype(np.float32),
             "bias": rng.standard_normal(24).astype(np.float32)}
    nodes = [
        helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"]),
        helper.make_node("QAttention", ["xq", "w", "bias", "xs", weight_scale, "mask", "xz", "wz"], ["y"],
                         domain="com.microsoft", num_heads=2),
    ]
    outs = [vi("y", None)] + ([vi(shared, None, TensorProto.UNDEFINED)] if shared else [])
    m = model(nodes, [vi("x", [3, 5, 8]), vi("mask", [3], TensorProto.INT32)], outs, inits.items(), opset=13)
    m.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return m


def _attention_feeds():
    rng = np.random.default_rng(8)
    return {"x": (rng.standard_normal((3, 5, 8)) * 2).astype(np.float32), "mask": np.array([5, 3, 4], np.int32)}


@pytest.mark.parametrize("wtype", [np.int8, np.uint8])
def test_dynamically_quantized_attention_input_is_fused(wtype):
    m = _dynamic_attention_model(wtype)
    fused = session(m, ALL)
    counts = ops(fused)
    assert counts["ai.onnxrt:DynamicQuantizeAttention"] == 1, counts
    assert "DynamicQuantizeLinear" not in counts and "com.microsoft:QAttention" not in counts
    feeds = _attention_feeds()
    got = fused.run(None, feeds)[0]
    # the same uint8 codes and integer products: bit for bit the two ops' result
    np.testing.assert_array_equal(got, session(m, ALL, disabled=["dynamic_quant_attention_fusion"]).run(None, feeds)[0])
    ref = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shared", ["xq", "xs", "xz"])
def test_dynamically_quantized_attention_kept_when_its_quantization_is_read_elsewhere(shared):
    counts = ops(session(_dynamic_attention_model(shared=shared), ALL))
    assert counts["com.microsoft:QAttention"] == 1 and counts["DynamicQuantizeLinear"] == 1, counts


def test_dynamically_quantized_attention_kept_when_it_reads_the_scale_twice():
    # the input's scale as the weight's scale too: the fused op would lose it
    m = _dynamic_attention_model(weight_scale="xs")
    counts = ops(session(m, ALL))
    assert counts["com.microsoft:QAttention"] == 1 and counts["DynamicQuantizeLinear"] == 1, counts
    feeds = _attention_feeds()
    ref = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_allclose(session(m, ALL).run(None, feeds)[0], ref, rtol=1e-5, atol=1e-5)


def test_dynamic_quantize_attention_refuses_a_non_float_input():
    nodes = [helper.make_node("DynamicQuantizeAttention", ["x", "w", "", "", "ws"], ["y"], domain="ai.onnxrt",
                              num_heads=1)]
    m = helper.make_model(
        helper.make_graph(nodes, "g", [vi("x", [1, 2, 4], TensorProto.DOUBLE)], [vi("y", None)],
                          initializer=[onnx.numpy_helper.from_array(np.ones((4, 3), np.int8), "w"),
                                       onnx.numpy_helper.from_array(np.float32(0.1), "ws")]),
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnxrt", 1)], ir_version=10)
    with pytest.raises(Exception, match="input must be float32"):
        session(m, OFF).run(None, {"x": np.ones((1, 2, 4))})


# -- models quantized by onnxruntime.quantization -------------------------------------


class _Reader(quantization.CalibrationDataReader):
    def __init__(self, feeds):
        self._it = iter(feeds)

    def get_next(self):
        return next(self._it, None)


def _feeds(name, n, seed):
    rng = np.random.default_rng(seed)
    if name == "resnet_small":
        return {"image": rng.standard_normal((n, 3, 64, 64)).astype(np.float32)}
    return {"input_ids": rng.integers(0, 100, (n, 32)).astype(np.int64)}


@pytest.fixture(scope="module")
def quantized(tmp_path_factory):
    from onnxruntime.quantization import QuantFormat, quantize_dynamic, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    folder = tmp_path_factory.mktemp("quant_fusions")
    logging.getLogger().setLevel(logging.ERROR)
    paths = {}
    for name in ("resnet_small", "transformer_encoder"):
        pre = folder / f"{name}_pre.onnx"
        quant_pre_process(str(DATA / f"{name}.onnx"), str(pre), skip_symbolic_shape=name == "transformer_encoder")
        qdq = folder / f"{name}_qdq.onnx"
        # 7-bit weights where onnxruntime's products would saturate (tests/ort_oracle.py)
        quantize_static(str(pre), str(qdq), _Reader([_feeds(name, 2, s) for s in range(3)]),
                        quant_format=QuantFormat.QDQ, reduce_range=u8s8_pairs_saturate())
        paths[name, "qdq"] = qdq
        if name == "transformer_encoder":
            dyn = folder / f"{name}_dynamic.onnx"
            quantize_dynamic(str(pre), str(dyn), reduce_range=u8s8_pairs_saturate())
            paths[name, "dynamic"] = dyn
    return paths


REAL = [
    ("resnet_small", "qdq", {"QLinearConv": 9, "com.microsoft:QLinearAdd": 3, "com.microsoft:QGemm": 1,
                             "com.microsoft:QLinearGlobalAveragePool": 1}, {"Conv", "Gemm", "Add"}),
    # each layer's Gelu (Div, Erf, Add, Mul, Mul and their Q/DQ) is one table, and so
    # is the division of its attention scores by a constant
    ("transformer_encoder", "qdq", {"QLinearMatMul": 12, "com.microsoft:QLinearAdd": 15,
                                    "com.microsoft:QLinearMul": 1, "com.microsoft:QGemm": 1,
                                    "ai.onnxrt:LookupTable": 4},
     {"MatMul", "Gemm", "Erf"}),
    ("transformer_encoder", "dynamic", {"com.microsoft:DynamicQuantizeMatMul": 9},
     {"MatMulInteger", "DynamicQuantizeLinear"}),
]


@pytest.mark.parametrize("name,fmt,expect,absent", REAL, ids=[f"{r[0]}-{r[1]}" for r in REAL])
def test_real_quantized_models_fuse_and_match_onnxruntime(quantized, name, fmt, expect, absent):
    path = quantized[name, fmt]
    fused = session(path, ALL)
    counts = ops(fused)
    for op, n in expect.items():
        assert counts[op] == n, (op, counts)
    assert not (absent & set(counts)), counts
    assert len(fused._built.graph.nodes) < len(onnx.load(str(path)).graph.node) * 0.7
    feeds = _feeds(name, 4, 9)
    got = fused.run(None, feeds)[0]
    unfused = session(path, OFF).run(None, feeds)[0]
    ref = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    # onnxruntime runs these node units as the same integer ops: the same results
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-5)
    # the unfused graph rounds in float: an int8 activation may land one step away,
    # which moves the float output by a fraction of its range
    assert np.abs(got - unfused).max() <= 0.02 * np.abs(unfused).max()


# -- the integer convolution's batched channels-last path -----------------------------


def _qconv_session(w, wz, b, const, x_type, **attrs):
    names = ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz"] + (["b"] if b is not None else [])
    node = helper.make_node("QLinearConv", names, ["y"], **attrs)
    inits = {"w": w, "wz": wz, "b": b} if const else {}
    feeds = [vi("x", None, x_type)]
    g = helper.make_graph([node], "g", feeds + [vi(n, None, TensorProto.UNDEFINED) for n in names[1:] if n not in inits],
                          [vi("y", None, TensorProto.UNDEFINED)],
                          initializer=[onnx.numpy_helper.from_array(v, k) for k, v in inits.items() if v is not None])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=10)
    return session(m, OFF)


@pytest.mark.parametrize("case", ["stem", "per_channel_bias", "long_k", "long_k_one_image", "uint8_one_by_one"])
@pytest.mark.usefixtures("numpy_kernels")  # the numpy paths; the compiled one: tests/cpu/test_native_kernels.py
def test_qlinear_conv_constant_weight_path_matches_fed_weight(case, monkeypatch):
    """Constant weights take a batched channels-last im2col (one copy and GEMMs split
    over images, K cut into exact float32 chunks when long); fed weights take the
    banded NCHW path. Both must give the same integers."""
    rng = np.random.default_rng(11)
    attrs, x_dt = {}, np.int8
    ws = np.float32(0.003)
    b = None
    if case == "stem":
        x = rng.integers(-128, 128, (5, 3, 20, 20))
        w = rng.integers(-127, 128, (8, 3, 7, 7))
        attrs = {"strides": [2, 2], "pads": [3, 3, 3, 3]}
    elif case == "per_channel_bias":
        x = rng.integers(-128, 128, (3, 6, 9, 7))
        w = rng.integers(-127, 128, (10, 6, 3, 3))
        ws = np.linspace(0.001, 0.004, 10).astype(np.float32)
        b = rng.integers(-20000, 20000, 10).astype(np.int32)
        attrs = {"pads": [1, 0, 1, 2], "strides": [1, 2]}
    elif case.startswith("long_k"):
        # K = 128 * 9 at the extremes: too long for one exact float32 product
        x = np.where(rng.random((1 if case.endswith("image") else 4, 128, 5, 5)) < 0.5, -128, 127)
        w = np.where(rng.random((16, 128, 3, 3)) < 0.5, -127, 127)
        attrs = {"pads": [1, 1, 1, 1]}
    else:
        x_dt = np.uint8
        x = rng.integers(0, 256, (6, 16, 8, 8))
        w = rng.integers(-127, 128, (32, 16, 1, 1))
        attrs = {"strides": [2, 2]}
    x = x.astype(x_dt)
    w = w.astype(np.int8)
    wz = np.zeros(np.shape(ws), np.int8)
    feeds = {"x": x, "xs": np.array(0.02, np.float32), "xz": np.array(3 if x_dt == np.uint8 else -4, x_dt),
             "ws": np.asarray(ws), "ys": np.array(0.7, np.float32), "yz": np.array(2, np.int8)}
    fed = dict(feeds, w=w, wz=wz, **({"b": b} if b is not None else {}))
    x_type = I8 if x_dt == np.int8 else U8
    from onnxrt_cpu.conv import integer

    taken = []
    rows = integer.IntConvBase._accumulate_rows

    def spy(self, *args):
        r = rows(self, *args)
        taken.append(r is not None)
        return r

    monkeypatch.setattr(integer.IntConvBase, "_accumulate_rows", spy)
    got = _qconv_session(w, wz, b, True, x_type, **attrs).run(None, feeds)[0]
    assert taken == [True]
    want = _qconv_session(w, wz, b, False, x_type, **attrs).run(None, fed)[0]
    assert taken == [True, False]
    assert got.shape == want.shape and got.dtype == want.dtype == np.int8
    assert got.flags.c_contiguous
    np.testing.assert_array_equal(got, want)
    assert len(np.unique(got)) > 10


def _qoperator_gelu_model(dt):
    """A Gelu as onnxruntime's QOperator quantizer writes it: DQ -> Div -> Erf -> Q, then
    com.microsoft QLinearAdd (+1), QLinearMul (by x again) and QLinearMul (by 0.5), on an
    8-bit graph input."""
    t = np.int8 if dt == I8 else np.uint8
    # zero points placing each value's range inside the type: e in [-1, 1], a = e + 1 in
    # [0, 2], m = x * a in [-0.4, 11], y = m / 2
    zps = {"z": 4, "ez": 0, "az": -128, "mz": -100, "yz": -120} if dt == I8 else \
        {"z": 120, "ez": 128, "az": 0, "mz": 10, "yz": 8}
    inits = {k: t(v) for k, v in zps.items()}
    inits.update({"s": np.float32(0.04), "k": np.float32(1.4142135), "es": np.float32(1 / 127),
                  "one": t(1), "os": np.float32(1.0), "oz": t(0), "as": np.float32(2 / 255), "ms": np.float32(0.05),
                  "half": t(100), "hs": np.float32(0.005), "hz": t(0), "ys": np.float32(0.025)})
    ms = "com.microsoft"
    nodes = [
        _dq("x", "xd", "s", "z"), helper.make_node("Div", ["xd", "k"], ["t"]), helper.make_node("Erf", ["t"], ["e"]),
        _q("e", "eq", "es", "ez"),
        helper.make_node("QLinearAdd", ["eq", "es", "ez", "one", "os", "oz", "as", "az"], ["aq"], domain=ms),
        helper.make_node("QLinearMul", ["x", "s", "z", "aq", "as", "az", "ms", "mz"], ["mq"], domain=ms),
        helper.make_node("QLinearMul", ["mq", "ms", "mz", "half", "hs", "hz", "ys", "yz"], ["y"], domain=ms),
    ]
    graph = helper.make_graph(nodes, "g", [vi("x", [3, 40], dt)], [vi("y", None, dt)],
                              initializer=[onnx.numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid(ms, 1)],
                             ir_version=10)


@pytest.mark.parametrize("dt", [I8, U8])
def test_qoperator_gelu_becomes_one_table_lookup(dt):
    m = _qoperator_gelu_model(dt)
    sess = session(m, ALL)
    counts = ops(sess)
    assert counts == {"ai.onnxrt:LookupTable": 1}, counts
    lo, hi = (-128, 127) if dt == I8 else (0, 255)
    x = np.linspace(lo, hi, 120).round().reshape(3, 40).astype(np.int8 if dt == I8 else np.uint8)
    got = sess.run(None, {"x": x})[0]
    np.testing.assert_array_equal(got, session(m, OFF).run(None, {"x": x})[0])
    np.testing.assert_array_equal(got, ort.InferenceSession(m.SerializeToString()).run(None, {"x": x})[0])
    assert len(np.unique(got)) > 20


def test_qdq_table_leaves_a_dequantize_that_others_read():
    # x's DequantizeLinear feeds the Erf chain and a graph output: the chain becomes a
    # table of x, and the DequantizeLinear stays for its other reader
    m = _lookup_model(U8)
    m.graph.output.append(vi("xd", None))
    sess = session(m, ALL)
    counts = ops(sess)
    assert counts["ai.onnxrt:LookupTable"] == 1 and "Erf" not in counts and counts["DequantizeLinear"] >= 1, counts
    feeds = {"x": np.linspace(-6, 6, 132, dtype=np.float32).reshape(4, 33)}
    for g, w in zip(sess.run(None, feeds), session(m, OFF).run(None, feeds)):
        np.testing.assert_array_equal(g, w)
