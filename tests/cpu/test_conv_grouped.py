"""Grouped convolutions of small maps (``onnxrt_cpu.conv.bands.conv_grouped``): every channel's taps
gathered at once and one product batched over images and groups. Checked against
onnxruntime over strides, dilations, paddings, batches, bias and fused activations,
and that the path ran."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxrt
from onnxrt_cpu.conv import forward

# these tests check the numpy paths' internals; the compiled kernels have their own
# (tests/cpu/test_native_kernels.py)
pytestmark = pytest.mark.usefixtures("numpy_kernels")

ort = pytest.importorskip("onnxruntime")


def _model(x_shape, w_shape, group, strides, pads, dilations, act):
    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array(rng.standard_normal(w_shape).astype(np.float32) * 0.3, "w"),
             numpy_helper.from_array(rng.standard_normal(w_shape[0]).astype(np.float32), "b")]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], group=group, strides=list(strides), pads=list(pads),
                              dilations=list(dilations), kernel_shape=list(w_shape[2:]))]
    nodes.append(helper.make_node(act, ["c"], ["y"]))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8).SerializeToString()


CASES = [
    # x shape, w shape, group, strides, pads, dilations
    ((1, 440, 4, 4), (440, 8, 3, 3), 55, (1, 1), (1, 1, 1, 1), (1, 1)),  # RegNet's many groups of 8
    ((2, 64, 7, 7), (128, 8, 3, 3), 8, (2, 2), (1, 1, 1, 1), (1, 1)),  # a batch, stride 2, more out channels
    ((1, 32, 9, 6), (32, 4, 3, 3), 8, (1, 2), (2, 0, 1, 1), (2, 1)),  # dilated rows, uneven pads and strides
    ((1, 12, 5, 5), (6, 4, 2, 2), 3, (1, 1), (0, 0, 0, 0), (1, 1)),  # fewer out channels than in, no padding
    ((1, 16, 10), (16, 4, 3), 4, (1,), (1, 1), (1,)),  # 1-D
]


@pytest.mark.parametrize("act", ["Relu", "Identity"])
@pytest.mark.parametrize("x_shape, w_shape, group, strides, pads, dilations", CASES)
def test_grouped_small_maps_match_onnxruntime(monkeypatch, x_shape, w_shape, group, strides, pads, dilations, act):
    calls = []
    real = forward.conv_grouped
    monkeypatch.setattr(forward, "conv_grouped", lambda *a, **k: calls.append(1) or real(*a, **k))
    model = _model(x_shape, w_shape, group, strides, pads, dilations, act)
    x = np.random.default_rng(0).standard_normal(x_shape).astype(np.float32)
    got = onnxrt.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    exp = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert calls, "the grouped path did not run"
    assert got.shape == exp.shape
    np.testing.assert_allclose(got, exp, rtol=1e-4, atol=1e-4)
