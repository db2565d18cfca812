"""com.microsoft GatherBlockQuantized against onnxruntime: the embedding table that
onnxruntime's own 4-bit weight quantizer writes, and every data type and layout of
the schema (int4/uint4, packed uint8 of 2, 4 and 8 bits, float8 and float4 with
broadcast scales), out-of-range indices, and a typed error for a misfit scale."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
ml_dtypes = pytest.importorskip("ml_dtypes")

import onnxrt
from onnx import TensorProto, helper, numpy_helper

MS = "com.microsoft"


def _model(data, scales, zero_points, index_dtype=np.int64, **attrs) -> bytes:
    inits = [numpy_helper.from_array(data, "data"), numpy_helper.from_array(scales, "scales")]
    names = ["data", "indices", "scales"]
    if zero_points is not None:
        inits.append(numpy_helper.from_array(zero_points, "zero_points"))
        names.append("zero_points")
    node = helper.make_node("GatherBlockQuantized", names, ["y"], domain=MS, **attrs)
    graph = helper.make_graph(
        [node], "gbq",
        [helper.make_tensor_value_info("indices", helper.np_dtype_to_tensor_dtype(np.dtype(index_dtype)), None)],
        [onnx.ValueInfoProto(name="y")], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(MS, 1)],
                              ir_version=10)
    return model.SerializeToString()


def _both(model: bytes, feeds: dict):
    got = onnxrt.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)
    exp = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)
    return got, exp


def _assert_same(got, exp, rtol=1e-6):
    for g, e in zip(got, exp):
        assert g.shape == e.shape and g.dtype == e.dtype
        np.testing.assert_allclose(g.astype(np.float32), e.astype(np.float32), rtol=rtol, atol=1e-6)


@pytest.mark.parametrize("symmetric", [False, True], ids=["asymmetric", "symmetric"])
def test_embedding_quantized_by_onnxruntimes_weight_quantizer(symmetric):
    """Gather + MatMul quantized by ``MatMulNBitsQuantizer`` with Gather among its op
    types: a GatherBlockQuantized (uint4 table, scales and zero points per 32 values)
    feeding a MatMulNBits, as 4-bit language models ship their embeddings."""
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    rng = np.random.default_rng(0)
    emb = rng.standard_normal((96, 64)).astype(np.float32)
    w = rng.standard_normal((64, 48)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Gather", ["emb", "ids"], ["e"]), helper.make_node("MatMul", ["e", "w"], ["y"])], "lm",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "sequence"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(emb, "emb"), numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    quantizer = MatMulNBitsQuantizer(model, block_size=32, is_symmetric=symmetric,
                                     op_types_to_quantize=("MatMul", "Gather"))
    quantizer.process()
    quantized = quantizer.model.model
    assert "GatherBlockQuantized" in [n.op_type for n in quantized.graph.node]
    ids = rng.integers(0, 96, size=(2, 7))
    got, exp = _both(quantized.SerializeToString(), {"ids": ids})
    _assert_same(got, exp, rtol=1e-5)
    # and close to the float model it came from (4-bit weights: loose)
    assert np.abs(got[0] - emb[ids] @ w).max() < 0.2 * np.abs(emb[ids] @ w).max()


def _int4_case(rng, kind, shape, qa, block, with_zp):
    dt, lo, hi = (ml_dtypes.int4, -8, 8) if kind == "int4" else (ml_dtypes.uint4, 0, 16)
    data = rng.integers(lo, hi, size=shape).astype(dt)
    sshape = list(shape)
    sshape[qa] = -(-shape[qa] // block)
    scales = rng.uniform(0.01, 0.2, size=sshape).astype(np.float32)
    zp = rng.integers(lo, hi, size=sshape).astype(dt) if with_zp else None
    return data, scales, zp


@pytest.mark.parametrize("kind", ["int4", "uint4"])
@pytest.mark.parametrize("with_zp", [False, True], ids=["no zero points", "zero points"])
@pytest.mark.parametrize("shape,gather_axis,quantize_axis", [
    ((10, 40), 0, 1),  # an embedding table, a partial last block
    ((3, 32, 5), 1, 1),  # gathered along the quantized axis
    ((4, 6, 16), -1, 0),  # negative axis, gathered along the last
], ids=["rows", "same axis", "last axis"])
def test_int4_tables(kind, with_zp, shape, gather_axis, quantize_axis):
    rng = np.random.default_rng(1)
    data, scales, zp = _int4_case(rng, kind, shape, quantize_axis, 16, with_zp)
    s = shape[gather_axis]
    indices = np.array([[0, s - 1, -1], [-s, 1, 0]], np.int64)
    model = _model(data, scales, zp, block_size=16, gather_axis=gather_axis, quantize_axis=quantize_axis, bits=4)
    _assert_same(*_both(model, {"indices": indices}))


@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("with_zp", [False, True], ids=["default zero point", "zero points"])
def test_packed_uint8_tables(bits, with_zp):
    rng = np.random.default_rng(2)
    rows, width, block = 7, 64, 16
    data = rng.integers(0, 256, size=(rows, width * bits // 8)).astype(np.uint8)
    scales = rng.uniform(0.01, 0.2, size=(rows, width // block)).astype(np.float16)
    zp = rng.integers(0, 256, size=(rows, -(-(width // block) * bits // 8))).astype(np.uint8) if with_zp else None
    indices = np.array([3, 0, 6, 3], np.int32)
    model = _model(data, scales, zp, index_dtype=np.int32, bits=bits, block_size=block, gather_axis=0,
                   quantize_axis=1)
    got, exp = _both(model, {"indices": indices})
    assert got[0].dtype == np.float16
    _assert_same(got, exp, rtol=1e-3)


def test_out_of_range_indices_give_zero_slices():
    rng = np.random.default_rng(3)
    data, scales, zp = _int4_case(rng, "int4", (5, 32), 1, 32, True)
    indices = np.array([[5, -6, 2], [100, -1, -100]], np.int64)
    model = _model(data, scales, zp, block_size=32, gather_axis=0, quantize_axis=1, bits=4)
    got, exp = _both(model, {"indices": indices})
    _assert_same(got, exp)
    assert not got[0][0, 0].any() and not got[0][1, 2].any() and got[0][0, 2].any()


@pytest.mark.parametrize("dtype", ["float8_e4m3fn", "float8_e5m2", "float4_e2m1fn"])
@pytest.mark.parametrize("block,scale_shape", [(16, (6, 3)), (0, (6, 1)), (0, (1, 1))],
                         ids=["blocks", "one block a row", "one scale for all"])
def test_float8_and_float4_tables(dtype, block, scale_shape):
    rng = np.random.default_rng(4)
    data = rng.standard_normal((6, 40)).astype(np.float32).astype(getattr(ml_dtypes, dtype))
    scales = rng.uniform(0.5, 2.0, size=scale_shape).astype(np.float32)
    model = _model(data, scales, None, block_size=block, gather_axis=0, quantize_axis=1)
    _assert_same(*_both(model, {"indices": np.array([5, 0, 2], np.int64)}))


def test_scales_that_do_not_fit_the_table_get_a_typed_error():
    rng = np.random.default_rng(5)
    data, scales, _ = _int4_case(rng, "int4", (5, 64), 1, 16, False)
    model = _model(data, scales[:, :3], None, block_size=16, gather_axis=0, quantize_axis=1, bits=4)
    sess = onnxrt.InferenceSession(model, providers=["CPUExecutionProvider"])
    with pytest.raises(onnxrt.OnnxRtError, match="scales"):
        sess.run(None, {"indices": np.array([1], np.int64)})
