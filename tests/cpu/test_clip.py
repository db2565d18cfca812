"""Clip's omitted bounds are the type's finite limits (the spec's
``numeric_limits::lowest()`` and ``max()``), as in onnxruntime and in onnxrt's own
fused Conv + Clip: infinities are clamped to them, NaN passes through."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import onnxrt

ort = pytest.importorskip("onnxruntime")

TYPES = [(np.float32, TensorProto.FLOAT), (np.float16, TensorProto.FLOAT16), (np.float64, TensorProto.DOUBLE)]


def clip_model(elem, inputs, opset=13) -> bytes:
    inits = []
    if "lo" in inputs:
        inits.append(helper.make_tensor("lo", elem, [], [0.0]))
    if "hi" in inputs:
        inits.append(helper.make_tensor("hi", elem, [], [1.0]))
    graph = helper.make_graph([helper.make_node("Clip", inputs, ["y"])], "clip",
                              [helper.make_tensor_value_info("x", elem, [5])],
                              [helper.make_tensor_value_info("y", elem, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8).SerializeToString()


@pytest.mark.parametrize("dtype,elem", TYPES, ids=["float32", "float16", "float64"])
@pytest.mark.parametrize("inputs", [["x"], ["x", "lo"], ["x", "", "hi"]], ids=["none", "min only", "max only"])
def test_omitted_bounds_clamp_infinities_to_the_finite_limits(dtype, elem, inputs):
    model = clip_model(elem, inputs)
    x = np.array([-np.inf, np.inf, np.nan, 0.5, -3.0], dtype)
    got = onnxrt.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    exp = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert got.dtype == exp.dtype
    np.testing.assert_array_equal(got, exp)
    assert np.isfinite(got[:2]).all()
