"""Partitioning among providers and the assignment report (the plan's slots, copies and
frees: test_plan.py)."""

import numpy as np
import pytest
from onnx import TensorProto, helper

import onnxrt as ort

from ..conftest import make_model


def _model():
    # Relu and Add go to the fake device; Softmax only the CPU has
    return make_model(
        [
            helper.make_node("Relu", ["x"], ["r"], name="relu"),
            helper.make_node("Add", ["r", "x"], ["a"], name="add"),
            helper.make_node("Softmax", ["a"], ["s"], name="softmax"),
            helper.make_node("Relu", ["s"], ["y"], name="relu2"),
        ],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
    )


def _expected(x):
    a = np.maximum(x, 0) + x
    e = np.exp(a - a.max(-1, keepdims=True))
    return np.maximum(e / e.sum(-1, keepdims=True), 0)


def test_assignment_and_copies(fake_provider):
    from ..fakes import FakeDevice

    sess = ort.InferenceSession(_model(), providers=["fake", "CPUExecutionProvider"])
    assert sess.get_providers() == ["FakeDeviceExecutionProvider", "CPUExecutionProvider"]
    got = {d["node"]: (d["provider"], d["reason"]) for d in sess.get_provider_assignment()}
    assert got["relu"] == ("FakeDeviceExecutionProvider", "")
    assert got["add"] == ("FakeDeviceExecutionProvider", "")
    assert got["softmax"][0] == "CPUExecutionProvider"
    assert "FakeDeviceExecutionProvider: no kernel for Softmax" in got["softmax"][1]
    x = np.array([[1, -2, 3], [-4, 5, -6]], np.float32)
    FakeDevice.to_host_count = FakeDevice.from_host_count = 0
    (y,) = sess.run(None, {"x": x})
    np.testing.assert_allclose(y, _expected(x), rtol=1e-6)
    # x goes to the device once (shared by Relu and Add), a comes back, s goes again, y comes back
    assert FakeDevice.from_host_count == 2
    assert FakeDevice.to_host_count == 2


def test_cpu_first_runs_everything_on_cpu(fake_provider):
    sess = ort.InferenceSession(_model(), providers=["CPUExecutionProvider", "fake"])
    assert {d["provider"] for d in sess.get_provider_assignment()} == {"CPUExecutionProvider"}
    x = np.ones((2, 3), np.float32)
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], _expected(x), rtol=1e-6)


def test_default_priority_prefers_higher(fake_provider):
    assert ort.get_available_providers()[0] == "FakeDeviceExecutionProvider"
    sess = ort.InferenceSession(_model())
    assert sess.get_providers()[0] == "FakeDeviceExecutionProvider"


def test_provider_options_are_validated(fake_provider):
    sess = ort.InferenceSession(_model(), providers=[("fake", {"device_id": "1"})])
    assert sess.get_provider_options()["FakeDeviceExecutionProvider"] == {"device_id": "1"}
    with pytest.raises(ort.InvalidArgument, match="unknown provider option 'colour'"):
        ort.InferenceSession(_model(), providers=[("fake", {"colour": "red"})])


def test_cpu_is_appended_when_missing(fake_provider):
    sess = ort.InferenceSession(_model(), providers=["FakeDeviceExecutionProvider"])
    assert sess.get_providers() == ["FakeDeviceExecutionProvider", "CPUExecutionProvider"]


def test_unknown_provider_is_a_clear_error():
    with pytest.raises(ort.InvalidArgument, match="provider 'TPUExecutionProvider' is not installed"):
        ort.InferenceSession(_model(), providers=["TPUExecutionProvider"])


def test_no_kernel_anywhere_is_not_implemented():
    model = make_model(
        [helper.make_node("Frobnicate", ["x"], ["y"], domain="acme.ops")],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    model.opset_import.append(helper.make_opsetid("acme.ops", 1))
    with pytest.raises(ort.NotImplemented, match="Frobnicate"):
        ort.InferenceSession(model)


def test_shape_computations_stay_on_the_cpu(fake_provider):
    # Shape -> Add(shape, 0) -> Reshape: the Add could run on the device, but it is a
    # shape computation, so it stays on the host; the data path Relu goes to the device
    model = make_model(
        [
            helper.make_node("Relu", ["x"], ["r"], name="relu"),
            helper.make_node("Shape", ["r"], ["s"], name="shape"),
            helper.make_node("Add", ["s", "zero"], ["s2"], name="shape_add"),
            helper.make_node("Reshape", ["r", "s2"], ["y"], name="reshape"),
        ],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])],
        [helper.make_tensor("zero", TensorProto.INT64, [2], [0, 0])],
    )
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model, so, providers=["fake", "cpu"])
    got = {d["node"]: d for d in sess.get_provider_assignment()}
    assert got["relu"]["provider"] == "FakeDeviceExecutionProvider"
    assert got["shape_add"]["provider"] == "CPUExecutionProvider"
    assert "shape computation kept on the CPU" in got["shape_add"]["reason"]
    x = np.array([[-1, 2, -3]], np.float32)
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], np.maximum(x, 0))
