"""Shared fixtures: small models built with onnx.helper, and a fake device provider."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import onnxrt


def make_model(nodes, inputs, outputs, initializers=(), opset=18, ir_version=10, functions=()):
    """A model from node/value-info lists (IR version explicit so onnxruntime accepts it)."""
    graph = helper.make_graph(nodes, "test", inputs, outputs, initializer=list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=ir_version,
                              functions=list(functions))
    return model


@pytest.fixture
def mlp_model():
    """x[N,4] -> MatMul -> Add -> Relu -> MatMul -> Softmax -> y[N,3], random weights."""
    rng = np.random.default_rng(0)
    w1 = rng.standard_normal((4, 8)).astype(np.float32)
    b1 = rng.standard_normal(8).astype(np.float32)
    w2 = rng.standard_normal((8, 3)).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h0"]),
        helper.make_node("Add", ["h0", "b1"], ["h1"]),
        helper.make_node("Relu", ["h1"], ["h2"]),
        helper.make_node("MatMul", ["h2", "w2"], ["logits"]),
        helper.make_node("Softmax", ["logits"], ["y"], axis=-1),
    ]
    return make_model(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])],
        [onnx.numpy_helper.from_array(w1, "w1"), onnx.numpy_helper.from_array(b1, "b1"),
         onnx.numpy_helper.from_array(w2, "w2")],
    )


@pytest.fixture
def fake_provider():
    """Register the fake device provider for one test, then remove it."""
    from . import fakes

    onnxrt.plugin.discovery.register_plugin(fakes, name="fakes")
    try:
        yield fakes.FakeDeviceProvider
    finally:
        onnxrt.plugin.discovery.unregister_plugin(fakes)


@pytest.fixture
def numpy_kernels(monkeypatch):
    """The CPU provider's numpy paths alone: its compiled kernels
    (``onnxrt_cpu.native``) set aside, as on a machine where they were not built.
    Tests of those paths' internals use it; the compiled kernels are checked against
    them in ``tests/cpu/test_native_kernels.py``."""
    from onnxrt_cpu import native

    monkeypatch.setattr(native, "K", None)
    monkeypatch.setattr(native, "BLAS", False)
