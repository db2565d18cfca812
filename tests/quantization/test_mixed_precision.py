"""auto_mixed_precision: float16 except the nodes whose float16 error is too large."""

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from onnxrt.quantization import auto_convert_mixed_precision, auto_mixed_precision, convert_float_to_float16

from .conftest import run_onnxrt, run_onnxruntime
from .models import encoder, encoder_data


def _overflowing() -> onnx.ModelProto:
    """x * 500 @ W (values near 2e5, beyond float16's 65504) * 1e-4, then ReLU."""
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((16, 16)) * 30).astype(np.float32)
    nodes = [helper.make_node("Mul", ["x", "k"], ["big"], name="scale_up"),
             helper.make_node("MatMul", ["big", "W"], ["mm"], name="mm"),
             helper.make_node("Mul", ["mm", "inv"], ["small"], name="scale_down"),
             helper.make_node("Relu", ["small"], ["y"], name="relu")]
    g = helper.make_graph(nodes, "overflow", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 16])],
                          [numpy_helper.from_array(np.float32(500.0), "k"), numpy_helper.from_array(w, "W"),
                           numpy_helper.from_array(np.float32(1e-4), "inv")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    return m


def test_overflowing_nodes_are_kept_in_float32_with_the_reason():
    model = _overflowing()
    x = np.random.default_rng(1).standard_normal((4, 16)).astype(np.float32)
    ref = run_onnxrt(model, {"x": x})[0]
    # plain float16 overflows (without graph fusions, which would keep MatMul * 1e-4 in one float32 product)
    plain = run_onnxrt(convert_float_to_float16(model, keep_io_types=True), {"x": x}, level=0)[0]
    assert not np.isfinite(plain).all()
    rep = auto_mixed_precision(model, {"x": x})
    assert rep.ok
    assert [(k.node, k.op_type) for k in rep.kept] == [("mm", "MatMul"), ("scale_down", "Mul")]
    assert "float16's range" in rep.kept[0].reason and "'mm'" in rep.kept[1].reason
    assert rep.converted == 2 and rep.total == 4
    ours = run_onnxrt(rep.model, {"x": x})[0]
    scale = np.abs(ref).max()
    assert np.abs(ours - ref).max() <= 1e-2 * scale
    np.testing.assert_allclose(run_onnxruntime(rep.model, {"x": x})[0], ours, atol=2e-3 * scale)


def test_a_model_that_is_fine_in_float16_keeps_nothing():
    model = encoder(layers=1)
    x = encoder_data(4)
    rep = auto_mixed_precision(model, {"x": x})
    assert rep.ok and rep.kept == [] and rep.iterations == 1 and rep.converted == rep.total
    m = auto_convert_mixed_precision(model, {"x": x}, rtol=1e-2, atol=1e-3, keep_io_types=True)
    assert m.graph.input[0].type.tensor_type.elem_type == TensorProto.FLOAT
    # float16 inputs and outputs: measured against the float32 model on the rounded inputs
    half_io = auto_mixed_precision(model, {"x": x}, keep_io_types=False)
    assert half_io.ok and half_io.kept == []
    assert half_io.model.graph.input[0].type.tensor_type.elem_type == TensorProto.FLOAT16


def test_a_tight_tolerance_keeps_nodes_until_the_outputs_agree():
    model = encoder(layers=1)
    x = encoder_data(4)
    rep = auto_mixed_precision(model, {"x": x}, rtol=1e-4, atol=1e-4)
    assert rep.kept and all(k.reason for k in rep.kept)
    ref = run_onnxrt(model, {"x": x})[0]
    got = run_onnxrt(rep.model, {"x": x})[0]
    scale = max(1.0, float(np.abs(ref).max()))
    assert rep.ok == bool(np.all(np.abs(got - ref) <= 1e-4 * scale + 1e-4 * np.abs(ref)))
    assert rep.ok


def test_validate_fn_has_the_last_word():
    model = encoder(layers=1)
    x = encoder_data(4)
    calls = []

    def never_exact(ref, got):
        calls.append(1)
        return bool(np.array_equal(ref[0], got[0]))

    rep = auto_mixed_precision(model, {"x": x}, validate_fn=never_exact, max_kept=3)
    assert len(calls) >= 2 and len(rep.kept) == 3 and not rep.ok
