"""The partitioner (onnxrt.partition): the core's policy around each provider's answer.

A provider answers ``get_capability`` for the candidates the core offers it; the core
keeps shape computations, nodes with subgraphs and host-read Constants on the CPU for
device providers, takes a fused group whole or not at all, survives a provider that
raises, and records every refusal with its reason in the :class:`Partition` it returns
(nothing on the graph but each node's ``provider``).
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxrt as ort
from onnxrt.compile import NodeInfoFactory
from onnxrt.errors import NotImplemented
from onnxrt.ir import Graph
from onnxrt.partition import CONSTANT_KEPT, CONTROL_FLOW_KEPT, SHAPE_KEPT, GraphView, partition
from onnxrt.plugin import Capability
from onnxrt_cpu.provider import CPUExecutionProvider

from ..conftest import make_model
from ..fakes import FakeDeviceProvider

F = TensorProto.FLOAT
FAKE = FakeDeviceProvider.name
CPU = CPUExecutionProvider.name


def _vi(name, shape=(2, 3), t=F):
    return helper.make_tensor_value_info(name, t, list(shape))


def _graph(nodes, inputs, outputs, inits=()):
    gp = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return Graph.from_proto(gp, {"": 17})


def _partition(graph, *providers):
    provs = list(providers) or [FakeDeviceProvider(), CPUExecutionProvider()]
    return partition(graph, provs, NodeInfoFactory(graph)), provs


def _where(graph):
    return {n.name: n.provider for n in graph.nodes}


def test_a_device_provider_is_offered_only_its_candidates():
    seen = {}

    class Recording(FakeDeviceProvider):
        def get_capability(self, graph, node_info):
            seen["view"] = graph
            seen["candidates"] = [n.name for n in graph.candidates]
            return super().get_capability(graph, node_info)

    g = _graph([helper.make_node("Relu", ["x"], ["r"], name="relu"),
                helper.make_node("Shape", ["r"], ["s"], name="shape"),
                helper.make_node("Add", ["s", "zero"], ["s2"], name="shape_add"),
                helper.make_node("Reshape", ["r", "s2"], ["y"], name="reshape")],
               [_vi("x")], [_vi("y")], [numpy_helper.from_array(np.zeros(2, np.int64), "zero")])
    part, _ = _partition(g, Recording(), CPUExecutionProvider())
    assert isinstance(seen["view"], GraphView)
    assert [n.name for n in seen["view"].nodes] == [n.name for n in g.nodes]  # the whole graph reads through
    assert seen["candidates"] == ["relu", "reshape"]  # the shape computation is not offered
    assert _where(g) == {"relu": FAKE, "shape": CPU, "shape_add": CPU, "reshape": CPU}
    assert f"{FAKE}: {SHAPE_KEPT}" in part.reasons["shape_add"]
    assert f"{FAKE}: no kernel for Reshape" in part.reasons["reshape"]
    assert part.reasons["relu"] == ""
    assert not hasattr(g, "_fused_groups")


def test_host_providers_are_offered_everything_left():
    g = _graph([helper.make_node("Shape", ["x"], ["s"], name="shape")], [_vi("x")], [_vi("s", (2,), TensorProto.INT64)])
    seen = []

    class Host(CPUExecutionProvider):
        def get_capability(self, graph, node_info):
            seen.extend(n.name for n in graph.candidates)
            return super().get_capability(graph, node_info)

    _partition(g, Host())
    assert seen == ["shape"]


def test_nodes_with_subgraphs_stay_on_the_cpu_unless_the_device_runs_them():
    body = helper.make_graph([helper.make_node("Relu", ["x"], ["t"])], "b", [], [_vi("t")])
    nodes = [helper.make_node("If", ["c"], ["y"], then_branch=body, else_branch=body, name="if")]
    g = _graph(nodes, [_vi("x"), _vi("c", (), TensorProto.BOOL)], [_vi("y")])
    part, _ = _partition(g)
    assert g.nodes[0].provider == CPU
    assert f"{FAKE}: {CONTROL_FLOW_KEPT}" in part.reasons["if"]
    # the bodies are partitioned too: their Relu goes to the device
    (then_g, _) = g.nodes[0].all_subgraphs()
    assert then_g.nodes[0].provider == FAKE

    offered = []

    class RunsControlFlow(FakeDeviceProvider):
        runs_control_flow = True

        def get_capability(self, graph, node_info):
            offered.extend(n.op_type for n in graph.candidates)
            return []

    _partition(g, RunsControlFlow(), CPUExecutionProvider())
    assert "If" in offered


def test_a_constant_read_on_the_host_stays_there():
    class TakesConstants(FakeDeviceProvider):
        def get_capability(self, graph, node_info):
            return [Capability([n]) for n in graph.candidates if n.op_type in ("Constant", "Relu")]

    c = helper.make_node("Constant", [], ["k"], name="k", value=numpy_helper.from_array(np.ones((2, 3), np.float32)))
    c2 = helper.make_node("Constant", [], ["k2"], name="k2", value=numpy_helper.from_array(np.ones((2, 3), np.float32)))
    g = _graph([c, c2, helper.make_node("Relu", ["k2"], ["r"], name="relu"),
                helper.make_node("Softmax", ["k"], ["s"], name="softmax"),
                helper.make_node("Add", ["r", "s"], ["y"], name="add")], [_vi("x")], [_vi("y")])
    part, _ = _partition(g, TakesConstants(), CPUExecutionProvider())
    where = _where(g)
    assert where["k"] == CPU and f"{FAKE}: {CONSTANT_KEPT}" in part.reasons["k"]  # Softmax reads it on the CPU
    assert where["k2"] == FAKE and where["relu"] == FAKE  # read only on the device


def test_a_group_is_taken_whole_or_not_at_all():
    class GreedyFuser(FakeDeviceProvider):
        def get_capability(self, graph, node_info):
            # claims every node of the graph as one group, candidates or not
            return [Capability(list(graph.nodes), fused_name="everything")]

    g = _graph([helper.make_node("Relu", ["x"], ["r"], name="relu"),
                helper.make_node("Shape", ["r"], ["y"], name="shape")],
               [_vi("x")], [_vi("y", (2,), TensorProto.INT64)])
    part, _ = _partition(g, GreedyFuser(), CPUExecutionProvider())
    assert _where(g) == {"relu": CPU, "shape": CPU}
    assert part.groups_of(g) == []
    assert f"{FAKE}: {SHAPE_KEPT}" in part.reasons["shape"]


def test_fused_groups_are_recorded_in_the_partition():
    class Fuser(FakeDeviceProvider):
        def get_capability(self, graph, node_info):
            return [Capability(list(graph.candidates), fused_name="chain")]

    g = _graph([helper.make_node("Relu", ["x"], ["r"], name="relu"),
                helper.make_node("Add", ["r", "x"], ["y"], name="add")], [_vi("x")], [_vi("y")])
    part, provs = _partition(g, Fuser(), CPUExecutionProvider())
    ((p, cap),) = part.groups_of(g)
    assert p is provs[0] and cap.fused_name == "chain" and [n.name for n in cap.nodes] == ["relu", "add"]
    assert [r["provider"] for r in part.report(g)] == [FAKE, FAKE]


def test_a_provider_that_raises_takes_nothing_and_says_why(caplog):
    class Broken(FakeDeviceProvider):
        def get_capability(self, graph, node_info):
            raise RuntimeError("driver fell over")

    g = _graph([helper.make_node("Relu", ["x"], ["y"], name="relu")], [_vi("x")], [_vi("y")])
    with caplog.at_level("WARNING", logger="onnxrt"):
        part, _ = _partition(g, Broken(), CPUExecutionProvider())
    assert g.nodes[0].provider == CPU
    assert "get_capability failed: RuntimeError: driver fell over" in part.reasons["relu"]
    assert "driver fell over" in caplog.text


def test_no_provider_for_a_node_names_every_providers_reason():
    g = _graph([helper.make_node("Softmax", ["x"], ["y"], name="sm")], [_vi("x")], [_vi("y")])
    with pytest.raises(NotImplemented, match=f"no provider can run Softmax node 'sm'.*{FAKE}: no kernel for Softmax"):
        _partition(g, FakeDeviceProvider())


def test_the_session_reports_what_the_partition_recorded(fake_provider):
    model = helper.make_model(helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"], name="relu"), helper.make_node("Softmax", ["r"], ["y"], name="sm")],
        "g", [_vi("x")], [_vi("y")]), opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["fake", "cpu"])
    rows = {r["node"]: r for r in sess.get_provider_assignment()}
    assert rows["relu"]["provider"] == FAKE and rows["relu"]["reason"] == ""
    assert rows["sm"]["provider"] == CPU and rows["sm"]["reason"].startswith(f"{FAKE}: no kernel for Softmax")


# -- through a session: priorities, options, copies between devices ---------------------------
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
