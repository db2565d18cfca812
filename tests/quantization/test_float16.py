"""convert_float_to_float16: the same models on onnxrt and onnxruntime, close to float32."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto

from onnxrt.errors import InvalidArgument
from onnxrt.quantization import convert_float_to_float16

from .conftest import run_onnxrt, run_onnxruntime, top1
from .models import cosine


def _rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / max(1.0, np.abs(b).max()))


@pytest.mark.parametrize("which", ["cnn", "encoder"])
@pytest.mark.parametrize("keep_io_types", [False, True])
def test_float16_model_is_close_to_float32_and_the_same_on_onnxruntime(request, which, keep_io_types):
    model, _, test = request.getfixturevalue(which)
    ref = run_onnxrt(model, {"x": test})[0]
    m16 = convert_float_to_float16(model, keep_io_types=keep_io_types)
    onnx.checker.check_model(m16)
    x = test if keep_io_types else test.astype(np.float16)
    ours = run_onnxrt(m16, {"x": x})[0]
    assert ours.dtype == (np.float32 if keep_io_types else np.float16)
    assert not any(t.data_type == TensorProto.FLOAT for t in m16.graph.initializer if t.name != "split_shape")
    assert cosine(ours, ref) >= 0.99999
    assert _rel(ours, ref) <= 4e-3
    # float16 results: onnxrt rounds once after float32 arithmetic, onnxruntime rounds
    # inside some kernels; they agree to a few float16 steps (2**-10 relative)
    assert _rel(run_onnxruntime(m16, {"x": x})[0], ours) <= 4 * 2.0 ** -10


def test_digits_float16_keeps_top1(digits):
    path, _, x_test, y_test = digits
    m16 = convert_float_to_float16(path, keep_io_types=True)
    labels, probs = run_onnxrt(m16, {"pixels": x_test})
    ref_labels, ref_probs = run_onnxrt(path, {"pixels": x_test})
    assert top1(labels, y_test) >= top1(ref_labels, y_test) - 0.005
    # the logits reach about 350, where a float16 step is 0.25; a probability p moves by
    # p (1 - p) times the change of its logit's lead, which matters only where two logits
    # are close (a handful of samples, at most 0.01 here)
    np.testing.assert_allclose(probs, ref_probs, atol=1.5e-2)
    ort_labels, ort_probs = run_onnxruntime(m16, {"pixels": x_test})
    assert (ort_labels == labels).mean() >= 0.995
    np.testing.assert_allclose(ort_probs, probs, atol=1.5e-2)


def test_blocked_ops_and_nodes_stay_float32_behind_casts(cnn):
    model, _, test = cnn
    m16 = convert_float_to_float16(model, op_block_list=["GlobalAveragePool"], node_block_list=["conv1"])
    by = {n.name: n for n in m16.graph.node}
    inits = {t.name: t.data_type for t in m16.graph.initializer}
    assert inits["w1"] == TensorProto.FLOAT and inits["w2"] == TensorProto.FLOAT16
    casts = [n for n in m16.graph.node if n.op_type == "Cast"]
    # x to float32 for conv1, its output to float16, and around the pool
    assert {n.input[0] for n in casts} == {"x", "c1", "r2", "g"}
    assert by["conv1"].input[0] == "x_to_fp32" and by["gap"].input[0] == "r2_to_fp32"
    ours = run_onnxrt(m16, {"x": test.astype(np.float16)})[0]
    assert cosine(ours, run_onnxrt(model, {"x": test})[0]) >= 0.99999
    assert _rel(run_onnxruntime(m16, {"x": test.astype(np.float16)})[0], ours) <= 4 * 2.0 ** -10


def test_matches_onnxconverter_commons_conversion(encoder):
    f16 = pytest.importorskip("onnxconverter_common.float16")
    model, _, test = encoder
    ours = run_onnxrt(convert_float_to_float16(model, keep_io_types=True), {"x": test})[0]
    theirs = run_onnxrt(f16.convert_float_to_float16(model, keep_io_types=True), {"x": test})[0]
    assert _rel(ours, theirs) <= 2 * 2.0 ** -10


def test_constants_are_clipped_to_float16s_range():
    from onnx import helper, numpy_helper

    w = np.array([1e-9, -1e-9, 0.0, 1e6, -1e6, 0.5], dtype=np.float32)
    g = helper.make_graph([helper.make_node("Mul", ["x", "w"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [6])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [6])],
                          [numpy_helper.from_array(w, "w")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    got = numpy_helper.to_array(convert_float_to_float16(m).graph.initializer[0])
    np.testing.assert_array_equal(got, np.array([1e-7, -1e-7, 0, 1e4, -1e4, 0.5], dtype=np.float16))
    with pytest.raises(InvalidArgument, match="node_block_list"):
        convert_float_to_float16(m, node_block_list=["nope"])


def test_an_already_float16_model_is_refused_unless_asked(cnn):
    model, _, _ = cnn
    m16 = convert_float_to_float16(model)
    with pytest.raises(InvalidArgument, match="already holds float16"):
        convert_float_to_float16(m16)
    assert convert_float_to_float16(m16, check_fp16_ready=False).graph.input[0].type.tensor_type.elem_type == \
        TensorProto.FLOAT16
