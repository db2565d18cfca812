"""The compiled 8-bit matrix products (``onnxrt_cpu.native.int8_matmul``, AVX-512 VNNI).

- Integer products are exact: equal to int64 arithmetic for every mix of uint8 and
  int8 A and B, zero points per tensor or per column, inner sizes that are not whole
  groups of four, column counts that are not whole panels, 1 to 3 threads, and row
  and column splits of the work.
- Float A quantized in the kernel (DynamicQuantizeMatMul) gives bit for bit what the
  numpy path gives, and what onnxruntime gives; a NaN falls back to the numpy path.
- MatMulNBits at accuracy_level 4 (A's int8 blocks in integers with the 4-bit
  weight) agrees with onnxruntime and the numpy path to float32 rounding.
- MatMulInteger, MatMulIntegerToFloat, DynamicQuantizeMatMul, DynamicQuantizeLSTM's
  input products, QLinearMatMul (8-bit
  out, requantized in the kernel), QAttention and the
  fused DynamicQuantizeLinear + QAttention sessions agree with onnxruntime and with
  the numpy paths.
- Arguments the kernel does not take are refused (None) or raise typed errors.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxrt as ort
from onnxrt_cpu import native

rt = pytest.importorskip("onnxruntime")

pytestmark = pytest.mark.skipif(
    native.K is None or not native.K.igemm_ready(),
    reason="no compiled 8-bit products here (not built, turned off, or no AVX-512 VNNI)",
)

_INT8 = {np.dtype(np.uint8): TensorProto.UINT8, np.dtype(np.int8): TensorProto.INT8}


def _exact(a, za, b, zb):
    return (a.astype(np.int64) - int(za)) @ (b.astype(np.int64) - np.asarray(zb).astype(np.int64))


def _rand8(rng, dtype, shape):
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max + 1, shape).astype(dtype)


@pytest.mark.parametrize("a_type", [np.uint8, np.int8])
@pytest.mark.parametrize("b_type", [np.uint8, np.int8])
@pytest.mark.parametrize("per_column", [False, True])
def test_integer_products_are_exact(a_type, b_type, per_column):
    rng = np.random.default_rng(7)
    for m, k, n in [(1, 1, 1), (3, 5, 7), (8, 4, 32), (9, 67, 33), (64, 130, 95), (70, 255, 64), (200, 33, 17)]:
        a, b = _rand8(rng, a_type, (m, k)), _rand8(rng, b_type, (k, n))
        za = _rand8(rng, a_type, ())
        zb = _rand8(rng, b_type, (n,) if per_column else ())
        w = native.pack_int8_weights(b, zb)
        y = native.int8_matmul(a, w, int(za))
        assert y.dtype == np.int32 and y.shape == (m, n)
        np.testing.assert_array_equal(y, _exact(a, za, b, zb), err_msg=f"{m}x{k}x{n}")


def test_extreme_values_use_the_whole_int32_range():
    # 255 * 255 * 33024 is just below 2^31: the corrections wrap and still come out exact
    k = native.INT8_MAX_K
    a = np.full((2, k), 255, np.uint8)
    a[1] = 0
    b = np.zeros((k, 3), np.uint8)
    b[:, 1] = 255
    w = native.pack_int8_weights(b, np.array(255, np.uint8))
    y = native.int8_matmul(a, w, 0)
    np.testing.assert_array_equal(y, _exact(a, 0, b, 255))
    assert y[0, 0] == -255 * 255 * k
    assert native.pack_int8_weights(np.zeros((k + 1, 3), np.int8)) is None


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("m", [1, 5, 8, 17, 64, 129, 300])
def test_row_and_column_splits_cover_every_output(threads, m):
    rng = np.random.default_rng(m)
    n = 700  # many pairs of panels: small m splits the columns too
    a, b = _rand8(rng, np.uint8, (m, 40)), _rand8(rng, np.int8, (40, n))
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    model = _matmul_integer_model(a.dtype, b, None)
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(sess.run(None, {"a": a})[0], _exact(a, 0, b, 0))


def test_batched_a_keeps_its_leading_axes():
    rng = np.random.default_rng(1)
    a, b = _rand8(rng, np.int8, (2, 3, 5, 12)), _rand8(rng, np.uint8, (12, 9))
    w = native.pack_int8_weights(b, np.array(3, np.uint8))
    y = native.int8_matmul(a, w, -4)
    assert y.shape == (2, 3, 5, 9)
    np.testing.assert_array_equal(y, _exact(a, -4, b, 3))
    np.testing.assert_array_equal(native.int8_matmul(a[0, 0, 0], w, -4), _exact(a[0, 0, 0], -4, b, 3))


def _quantized_like_numpy(x):
    from onnxrt_cpu.kernels.contrib_quant import _dynamic_centred

    return _dynamic_centred(x)


def test_float_a_is_quantized_as_the_numpy_path_quantizes_it():
    rng = np.random.default_rng(3)
    for m, k, n in [(1, 1, 1), (7, 19, 5), (33, 64, 192), (256, 100, 40)]:
        x = (rng.standard_normal((m, k)) * 4 + rng.standard_normal()).astype(np.float32)
        b = _rand8(rng, np.int8, (k, n))
        centred, sa, za = _quantized_like_numpy(x)
        scale = (sa * rng.random(n)).astype(np.float32)
        bias = rng.standard_normal(n).astype(np.float32)
        want = (centred.astype(np.float64) @ b.astype(np.float64)).astype(np.float32)
        want *= scale
        want += bias
        got = native.int8_matmul(x, native.pack_int8_weights(b), za, a_scale=sa, scale=scale, bias=bias)
        np.testing.assert_array_equal(got, want)


def test_a_nan_in_float_a_is_refused():
    x = np.ones((4, 8), np.float32)
    x[2, 3] = np.nan
    w = native.pack_int8_weights(np.ones((8, 2), np.int8))
    assert native.int8_matmul(x, w, 0, a_scale=np.float32(0.01)) is None


def test_arguments_the_kernel_does_not_take():
    w = native.pack_int8_weights(np.ones((8, 2), np.int8))
    assert native.pack_int8_weights(np.ones((2, 8, 2), np.int8)) is None
    assert native.pack_int8_weights(np.ones((8, 2), np.int16)) is None
    assert native.pack_int8_weights(np.ones((8, 2), np.int8), np.ones(3, np.int8)) is None
    assert native.int8_matmul(np.ones((3, 7), np.uint8), w) is None  # inner sizes differ
    assert native.int8_matmul(np.ones((3, 8), np.float32), w) is None  # float A needs a scale
    assert native.int8_matmul(np.ones((3, 8), np.uint8), w, scale=np.ones(3, np.float32)) is None
    with pytest.raises(TypeError, match="igemm: a"):
        native.K.igemm(np.ones((3, 8), np.int16), 0.0, 0, w.packed, w.zb, w.colsum, None, None,
                       np.empty((3, 2), np.int32), (3, 8, 2, 8), 1)
    with pytest.raises(ValueError, match="invalid dimensions"):
        native.K.igemm(np.ones((3, 8), np.uint8), 0.0, 0, w.packed, w.zb, w.colsum, None, None,
                       np.empty((3, 2), np.int32), (3, 8, 2, 4), 1)
    with pytest.raises(ValueError, match="holds 4 elements"):
        native.K.igemm(np.ones((3, 8), np.uint8), 0.0, 0, w.packed, w.zb, w.colsum, None, None,
                       np.empty((2, 2), np.int32), (3, 8, 2, 8), 1)
    with pytest.raises(ValueError, match="a_zero_point outside"):
        native.K.igemm(np.ones((3, 8), np.uint8), 0.0, 300, w.packed, w.zb, w.colsum, None, None,
                       np.empty((3, 2), np.int32), (3, 8, 2, 8), 1)
    with pytest.raises(ValueError, match="positive scale"):
        native.K.igemm(np.ones((3, 8), np.float32), -1.0, 0, w.packed, w.zb, w.colsum, None, None,
                       np.empty((3, 2), np.float32), (3, 8, 2, 8), 1)
    with pytest.raises(ValueError, match="float32 output"):
        native.K.igemm(np.ones((3, 8), np.uint8), 0.0, 0, w.packed, w.zb, w.colsum, np.ones(2, np.float32), None,
                       np.empty((3, 2), np.int32), (3, 8, 2, 8), 1)
    with pytest.raises(ValueError, match="y_zero_point outside"):
        native.K.igemm(np.ones((3, 8), np.uint8), 0.0, 0, w.packed, w.zb, w.colsum, np.ones(1, np.float32), None,
                       np.empty((3, 2), np.int8), (3, 8, 2, 8), 1, 200)
    with pytest.raises(ValueError, match="8-bit output takes 8-bit a, a scale and no bias"):
        native.K.igemm(np.ones((3, 8), np.uint8), 0.0, 0, w.packed, w.zb, w.colsum, None, None,
                       np.empty((3, 2), np.uint8), (3, 8, 2, 8), 1, 0)
    with pytest.raises(ValueError, match="scale holds 3 values, expected 1 or 2"):
        native.K.igemm(np.ones((3, 8), np.uint8), 0.0, 0, w.packed, w.zb, w.colsum, np.ones(3, np.float32), None,
                       np.empty((3, 2), np.float32), (3, 8, 2, 8), 1)


def test_one_scale_for_every_column_is_each_column_times_it():
    rng = np.random.default_rng(5)
    a, b = _rand8(rng, np.uint8, (11, 37)), _rand8(rng, np.int8, (37, 45))
    w = native.pack_int8_weights(b, np.array(-3, np.int8))
    scale = np.array([0.0123], np.float32)
    want = _exact(a, 9, b, -3).astype(np.float32) * scale[0]
    np.testing.assert_array_equal(native.int8_matmul(a, w, 9, scale=scale), want)
    assert native.int8_matmul(a, w, 9, scale=np.ones(2, np.float32)) is None  # neither 1 nor N values


# ---- sessions: the ops that take the compiled products --------------------------------


def _model(nodes, inputs, inits, out_type=TensorProto.FLOAT, opsets=(("", 17), ("com.microsoft", 1))):
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("y", out_type, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets], ir_version=9)


def _matmul_integer_model(a_type, b, b_zp):
    inits = [numpy_helper.from_array(b, "b")]
    ins = ["a", "b"]
    if b_zp is not None:
        inits.append(numpy_helper.from_array(np.array(0, a_type), "az"))
        inits.append(numpy_helper.from_array(b_zp, "bz"))
        ins += ["az", "bz"]
    return _model([helper.make_node("MatMulInteger", ins, ["y"])],
                  [helper.make_tensor_value_info("a", _INT8[np.dtype(a_type)], None)], inits, TensorProto.INT32)


def _sessions(model, threads=2):
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    ours = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    ro = rt.SessionOptions()
    ro.intra_op_num_threads = 1
    ref = rt.InferenceSession(model.SerializeToString(), ro, providers=["CPUExecutionProvider"])
    return ours, ref


@pytest.mark.parametrize("a_type,b_type", [(np.uint8, np.int8), (np.uint8, np.uint8), (np.int8, np.int8)])
def test_matmul_integer_matches_onnxruntime_and_the_numpy_path(a_type, b_type, numpy_kernels_later, int8_calls):
    rng = np.random.default_rng(11)
    b = _rand8(rng, b_type, (70, 45))
    b_zp = _rand8(rng, b_type, (45,))
    model = _matmul_integer_model(a_type, b, b_zp)
    ours, ref = _sessions(model)
    a = _rand8(rng, a_type, (3, 10, 70))
    got = ours.run(None, {"a": a})[0]
    assert int8_calls == [(3, 10, 45)]
    np.testing.assert_array_equal(got, ref.run(None, {"a": a})[0])
    with numpy_kernels_later():
        np.testing.assert_array_equal(got, ours.run(None, {"a": a})[0])


def _dqmm_model(b, b_scale, b_zp, bias):
    inits = [numpy_helper.from_array(b, "b"), numpy_helper.from_array(b_scale, "bs"),
             numpy_helper.from_array(b_zp, "bz"), numpy_helper.from_array(bias, "bias")]
    node = helper.make_node("DynamicQuantizeMatMul", ["a", "b", "bs", "bz", "bias"], ["y"], domain="com.microsoft")
    return _model([node], [helper.make_tensor_value_info("a", TensorProto.FLOAT, None)], inits)


@pytest.mark.parametrize("per_column", [False, True])
def test_dynamic_quantize_matmul_matches_onnxruntime_and_the_numpy_path(per_column, numpy_kernels_later,
                                                                        int8_calls):
    rng = np.random.default_rng(5)
    k, n = 96, 77
    b = _rand8(rng, np.int8, (k, n))
    shape = (n,) if per_column else ()
    b_scale = (rng.random(shape) * 0.02 + 0.001).astype(np.float32)
    b_zp = np.zeros(shape, np.int8)
    bias = rng.standard_normal(n).astype(np.float32)
    ours, ref = _sessions(_dqmm_model(b, b_scale, b_zp, bias))
    a = (rng.standard_normal((4, 20, k)) * 2 + 0.3).astype(np.float32)
    got = ours.run(None, {"a": a})[0]
    assert int8_calls == [(4, 20, n)]
    np.testing.assert_allclose(got, ref.run(None, {"a": a})[0], rtol=1e-5, atol=1e-5)
    with numpy_kernels_later():
        np.testing.assert_array_equal(got, ours.run(None, {"a": a})[0])
    # a NaN takes the numpy path, whatever it makes of it, rather than an undefined conversion
    a[1, 3, 5] = np.nan
    got = ours.run(None, {"a": a})[0]
    with numpy_kernels_later():
        np.testing.assert_array_equal(got, ours.run(None, {"a": a})[0])


def test_matmul_integer_to_float_matches_onnxruntime_and_the_numpy_path(numpy_kernels_later, int8_calls):
    rng = np.random.default_rng(9)
    k, n = 50, 33
    b = _rand8(rng, np.uint8, (k, n))
    inits = [numpy_helper.from_array(b, "b"),
             numpy_helper.from_array(np.array(0.02, np.float32), "as"),
             numpy_helper.from_array((rng.random(n) * 0.01 + 0.001).astype(np.float32), "bs"),
             numpy_helper.from_array(np.array(130, np.uint8), "az"),
             numpy_helper.from_array(_rand8(rng, np.uint8, (n,)), "bz"),
             numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), "bias")]
    node = helper.make_node("MatMulIntegerToFloat", ["a", "b", "as", "bs", "az", "bz", "bias"], ["y"],
                            domain="com.microsoft")
    model = _model([node], [helper.make_tensor_value_info("a", TensorProto.UINT8, None)], inits)
    ours, ref = _sessions(model)
    a = _rand8(rng, np.uint8, (6, 13, k))
    got = ours.run(None, {"a": a})[0]
    assert int8_calls == [(6, 13, n)]
    np.testing.assert_allclose(got, ref.run(None, {"a": a})[0], rtol=1e-5, atol=1e-5)
    with numpy_kernels_later():
        np.testing.assert_array_equal(got, ours.run(None, {"a": a})[0])


@pytest.mark.parametrize("a_type,b_type,y_type", [(np.uint8, np.int8, np.uint8), (np.int8, np.int8, np.int8),
                                                   (np.uint8, np.uint8, np.uint8), (np.int8, np.uint8, np.uint8)])
@pytest.mark.parametrize("per_column", [False, True])
def test_qlinear_matmul_matches_onnxruntime_and_the_numpy_path(a_type, b_type, y_type, per_column,
                                                               numpy_kernels_later, int8_calls):
    rng = np.random.default_rng(17)
    k, n = 75, 41
    b = _rand8(rng, b_type, (k, n))
    shape = (n,) if per_column else ()
    inits = [numpy_helper.from_array(np.array(0.03, np.float32), "as"),
             numpy_helper.from_array(np.array(131 if a_type == np.uint8 else 3, a_type), "az"),
             numpy_helper.from_array(b, "b"),
             numpy_helper.from_array((rng.random(shape) * 0.01 + 0.002).astype(np.float32), "bs"),
             numpy_helper.from_array(_rand8(rng, b_type, shape) // 8 + (128 if b_type == np.uint8 else 0), "bz"),
             numpy_helper.from_array(np.array(0.4, np.float32), "ys"),
             numpy_helper.from_array(np.array(-9 if y_type == np.int8 else 121, y_type), "yz")]
    node = helper.make_node("QLinearMatMul", ["a", "as", "az", "b", "bs", "bz", "ys", "yz"], ["y"])
    model = _model([node], [helper.make_tensor_value_info("a", _INT8[np.dtype(a_type)], None)], inits,
                   _INT8[np.dtype(y_type)], opsets=(("", 13),))
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    ours = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    a = _rand8(rng, a_type, (3, 11, k))
    got = ours.run(None, {"a": a})[0]
    assert int8_calls == [(3, 11, n)] and got.dtype == y_type
    assert len(np.unique(got)) > 30  # neither saturated nor constant
    if a_type == y_type and not (a_type == np.int8 and b_type == np.uint8):  # what onnxruntime implements
        ref = rt.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        np.testing.assert_array_equal(got, ref.run(None, {"a": a})[0])
    with numpy_kernels_later():
        np.testing.assert_array_equal(got, ours.run(None, {"a": a})[0])


@pytest.mark.parametrize("w_type,per_column,direction", [(np.int8, False, "bidirectional"),
                                                          (np.uint8, True, "bidirectional"),
                                                          (np.uint8, False, "reverse")])
def test_dynamic_quantize_lstm_input_products(w_type, per_column, direction, numpy_kernels_later, int8_calls):
    """X's dynamic quantization and its product with every direction's W (one product
    for all steps) by the compiled kernel: the outputs are the numpy path's bit for
    bit (int8 and uint8 W, zero points a direction or a column) and onnxruntime's
    within the LSTM's float tolerance."""
    rng = np.random.default_rng(23)
    d = 2 if direction == "bidirectional" else 1
    seq, batch, size, hidden = 6, 3, 10, 8
    shape = (d, 4 * hidden) if per_column else (d,)
    info = np.iinfo(w_type)
    w = rng.integers(info.min, info.max + 1, (d, size, 4 * hidden)).astype(w_type)
    r = rng.integers(info.min, info.max + 1, (d, hidden, 4 * hidden)).astype(w_type)  # R and W share a type
    mid = 128 if w_type == np.uint8 else 0
    inits = {"w": w, "r": r, "b": (rng.standard_normal((d, 8 * hidden)) * 0.3).astype(np.float32),
             "ws": (rng.random(shape) * 0.01 + 0.005).astype(np.float32),
             "wz": (rng.integers(-5, 6, shape) + mid).astype(w_type),
             "rs": np.full((d,), 0.01, np.float32), "rz": np.full((d,), mid, w_type)}
    names = ["x", "w", "r", "b", "", "", "", "", "ws", "wz", "rs", "rz"]
    node = helper.make_node("DynamicQuantizeLSTM", names, ["y"], domain="com.microsoft", hidden_size=hidden,
                            direction=direction)
    model = _model([node], [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
                   [numpy_helper.from_array(v, k) for k, v in inits.items()])
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    ours = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    ro = rt.SessionOptions()
    ro.intra_op_num_threads = 2  # onnxruntime groups the rows by its threads, as onnxrt does
    ref = rt.InferenceSession(model.SerializeToString(), ro, providers=["CPUExecutionProvider"])
    x = rng.standard_normal((seq, batch, size)).astype(np.float32)
    got = ours.run(None, {"x": x})[0]
    assert int8_calls == [(seq * batch, d * 4 * hidden)]
    if not per_column:  # onnxruntime takes one weight zero point a direction only
        np.testing.assert_allclose(got, ref.run(None, {"x": x})[0], rtol=1e-5, atol=1e-5)
    with numpy_kernels_later():
        np.testing.assert_array_equal(got, ours.run(None, {"x": x})[0])


@pytest.mark.parametrize("bits,block,k,n,rows,packed_zp", [(4, 32, 64, 24, 10, True), (4, 16, 100, 45, 130, True),
                                                            (4, 128, 256, 33, 7, False), (2, 32, 96, 70, 65, True)])
def test_matmul_nbits_at_accuracy_level_4(bits, block, k, n, rows, packed_zp, numpy_kernels_later, monkeypatch):
    """A's int8 blocks times the 4-bit (or 2-bit) weight's centred codes in integers,
    block by block: onnxruntime's results to float32 rounding, and the numpy path's
    (a float32 GEMM of the rounded A and the dequantized weight) alike; K not whole
    blocks, N not whole panels, row counts over a task's 64, bias, an all-zero block."""
    rng = np.random.default_rng(bits * 1000 + k)
    kb = -(-k // block)
    inits = [numpy_helper.from_array(rng.integers(0, 256, (n, kb, block * bits // 8)).astype(np.uint8), "b"),
             numpy_helper.from_array((rng.random((n, kb)) * 0.1 + 0.01).astype(np.float32), "s")]
    ins = ["a", "b", "s"]
    if packed_zp:
        inits.append(numpy_helper.from_array(rng.integers(0, 256, (n, -(-kb * bits // 8))).astype(np.uint8), "zp"))
        ins.append("zp")
    else:
        ins.append("")
    inits.append(numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), "bias"))
    ins += ["", "bias"]
    node = helper.make_node("MatMulNBits", ins, ["y"], domain="com.microsoft", K=k, N=n, bits=bits,
                            block_size=block, accuracy_level=4)
    model = _model([node], [helper.make_tensor_value_info("a", TensorProto.FLOAT, None)], inits)
    calls = []
    real = native.nbits_matmul
    monkeypatch.setattr(native, "nbits_matmul", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    ours, ref = _sessions(model)
    a = rng.standard_normal((rows, k)).astype(np.float32)
    a[0, :block] = 0  # an all-zero block: no scale to divide by
    got = ours.run(None, {"a": a})[0]
    assert calls == [1] and got.shape == (rows, n)
    want = ref.run(None, {"a": a})[0]
    span = float(np.abs(want).max())
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * span)
    with numpy_kernels_later():
        np.testing.assert_allclose(got, ours.run(None, {"a": a})[0], rtol=0, atol=1e-5 * span)


def _attention_model(dynamic, w, w_scale, w_zp, bias, heads):
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(bias, "bias"),
             numpy_helper.from_array(w_scale, "ws"), numpy_helper.from_array(w_zp, "wz")]
    nodes = []
    if dynamic:  # what quantize_dynamic writes; onnxrt fuses the pair into one op
        nodes.append(helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"]))
        x_type = TensorProto.FLOAT
    else:
        inits += [numpy_helper.from_array(np.array(0.03, np.float32), "xs"),
                  numpy_helper.from_array(np.array(121, np.uint8), "xz")]
        x_type = TensorProto.UINT8
    nodes.append(helper.make_node("QAttention", ["xq" if dynamic else "x", "w", "bias", "xs", "ws", "", "xz", "wz"],
                                  ["y"], domain="com.microsoft", num_heads=heads))
    return _model(nodes, [helper.make_tensor_value_info("x", x_type, None)], inits)


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("per_column", [False, True])
def test_quantized_attention_matches_onnxruntime_and_the_numpy_path(dynamic, per_column, numpy_kernels_later,
                                                                     int8_calls):
    rng = np.random.default_rng(13)
    hidden, heads = 48, 4
    w = _rand8(rng, np.uint8, (hidden, 3 * hidden))
    shape = (3 * hidden,) if per_column else ()
    w_scale = (rng.random(shape) * 0.01 + 0.002).astype(np.float32)
    w_zp = _rand8(rng, np.uint8, shape)
    bias = rng.standard_normal(3 * hidden).astype(np.float32)
    ours, ref = _sessions(_attention_model(dynamic, w, w_scale, w_zp, bias, heads))
    x = (rng.standard_normal((2, 9, hidden)) * 1.5).astype(np.float32) if dynamic else \
        _rand8(rng, np.uint8, (2, 9, hidden))
    got = ours.run(None, {"x": x})[0]
    assert int8_calls == [(2, 9, 3 * hidden)]
    np.testing.assert_allclose(got, ref.run(None, {"x": x})[0], rtol=1e-4, atol=1e-5)
    with numpy_kernels_later():
        # the projections are bit for bit; the attention after them is the numpy one
        np.testing.assert_allclose(got, ours.run(None, {"x": x})[0], rtol=1e-6, atol=1e-6)


@pytest.fixture
def int8_calls(monkeypatch):
    """A list that gets one entry per product the compiled kernel computed."""
    calls = []
    real = native.int8_matmul

    def counted(*args, **kwargs):
        y = real(*args, **kwargs)
        if y is not None:
            calls.append(y.shape)
        return y

    monkeypatch.setattr(native, "int8_matmul", counted)
    return calls


@pytest.fixture
def numpy_kernels_later(monkeypatch):
    """A context that sets the compiled kernels aside for the runs inside it (the
    sessions were created with them, so their packed weights exist and go unused)."""
    import contextlib

    @contextlib.contextmanager
    def off():
        with monkeypatch.context() as m:
            m.setattr(native, "K", None)
            yield

    return off
