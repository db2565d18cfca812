"""A big model file's large initializers are read straight from the file and taken out
of the bytes the loader parses; the check that every name a node reads is defined
still counts them (a 44 MB published IS-Net was refused: "reads 'conv_in.weight',
which is not defined"), and still refuses a name defined nowhere."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxrt
from onnxrt.load import large_weights


def _model(path, read: str) -> None:
    w = numpy_helper.from_array(np.arange(4096, dtype=np.float32).reshape(64, 64) / 4096, "w")
    g = helper.make_graph([helper.make_node("MatMul", ["x", read], ["y"])], "big",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    onnx.save(m, str(path))


@pytest.fixture
def small_threshold(monkeypatch):
    # every file counts as big, so the split path runs on a small model
    monkeypatch.setattr(large_weights, "MIN_FILE_BYTES", 0)


def test_split_off_initializers_count_as_defined(tmp_path, small_threshold):
    path = tmp_path / "big.onnx"
    _model(path, "w")
    assert large_weights.split_large_weights(path, 1024) is not None  # the split path is taken
    x = np.ones((1, 64), np.float32)
    (y,) = onnxrt.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_allclose(y, x @ (np.arange(4096, dtype=np.float32).reshape(64, 64) / 4096), rtol=1e-6)


def test_a_name_defined_nowhere_is_still_refused(tmp_path, small_threshold):
    path = tmp_path / "big.onnx"
    _model(path, "nowhere")
    with pytest.raises(onnxrt.InvalidGraph, match="reads 'nowhere', which is not defined"):
        onnxrt.InferenceSession(str(path), providers=["CPUExecutionProvider"])
