"""quantize_dynamic: integer weights, activations quantized at run time."""

import numpy as np
import onnx
import pytest

from onnxrt.errors import InvalidArgument
from onnxrt.quantization import QuantType, quantize_dynamic

from .conftest import run_onnxrt, run_onnxruntime, top1
from .models import cosine


def test_digits_dynamic_keeps_top1_and_runs_the_same_on_onnxruntime(digits, tmp_path):
    path, _, x_test, y_test = digits
    out = tmp_path / "dyn.onnx"
    r = quantize_dynamic(path, out)
    assert set(r.quantized) == {"hidden", "output"}  # Gemm too, which onnxruntime's tool leaves in float
    ops = [n.op_type for n in onnx.load(out).graph.node]
    assert ops.count("MatMulInteger") == 2 and ops.count("DynamicQuantizeLinear") == 2 and "Gemm" not in ops
    ours = run_onnxrt(str(out), {"pixels": x_test})
    assert top1(ours[0], y_test) >= top1(run_onnxrt(path, {"pixels": x_test})[0], y_test) - 0.01
    theirs = run_onnxruntime(str(out), {"pixels": x_test})
    np.testing.assert_array_equal(theirs[0], ours[0])
    np.testing.assert_allclose(theirs[1], ours[1], atol=1e-6)


@pytest.mark.parametrize("per_channel", [False, True])
def test_encoder_dynamic_matches_onnxruntimes_tool(encoder, per_channel, tmp_path):
    oq = pytest.importorskip("onnxruntime.quantization")
    model, _, test = encoder
    ref = run_onnxrt(model, {"x": test})[0]
    r = quantize_dynamic(model, None, per_channel=per_channel)
    assert len(r.quantized) == 12 and all("not a constant" in why for why in r.skipped.values())
    ours = run_onnxrt(r.model, {"x": test})[0]
    src = tmp_path / "float.onnx"
    onnx.save(model, src)
    oq.quantize_dynamic(str(src), str(tmp_path / "ort.onnx"), per_channel=per_channel, weight_type=oq.QuantType.QInt8)
    theirs = run_onnxruntime(str(tmp_path / "ort.onnx"), {"x": test})[0]
    assert cosine(ours, ref) >= 0.9995
    assert cosine(ours, ref) >= cosine(theirs, ref) - 1e-4
    np.testing.assert_allclose(run_onnxruntime(r.model, {"x": test})[0], ours, atol=1e-5)


def test_cnn_dynamic_uses_conv_integer(cnn):
    model, _, test = cnn
    r = quantize_dynamic(model, None, op_types_to_quantize=["Conv"], weight_type=QuantType.QUInt8)
    ops = [n.op_type for n in r.model.graph.node]
    assert ops.count("ConvInteger") == 2 and "Gemm" in ops
    ours = run_onnxrt(r.model, {"x": test})[0]
    assert cosine(ours, run_onnxrt(model, {"x": test})[0]) >= 0.999
    np.testing.assert_allclose(run_onnxruntime(r.model, {"x": test})[0], ours, atol=1e-5)


def test_dynamic_refuses_what_it_cannot_write(cnn):
    model, _, _ = cnn
    with pytest.raises(InvalidArgument, match="8-bit"):
        quantize_dynamic(model, None, weight_type=QuantType.QInt16)
    with pytest.raises(InvalidArgument, match="Softmax"):
        quantize_dynamic(model, None, op_types_to_quantize=["Softmax"])
    with pytest.raises(InvalidArgument, match="model_input"):
        quantize_dynamic(42, None)


def test_external_data_is_written_beside_the_model(cnn, tmp_path):
    model, _, test = cnn
    out = tmp_path / "q.onnx"
    quantize_dynamic(model, out, use_external_data_format=True)
    assert (tmp_path / "q.onnx.data").stat().st_size > 0
    np.testing.assert_array_equal(run_onnxrt(str(out), {"x": test})[0], run_onnxruntime(str(out), {"x": test})[0])
