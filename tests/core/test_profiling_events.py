"""Profiling's node events: recorded as tuples during a run and made onnxruntime's
dicts when read, with the same fields; an If's nodes profiled inside it; no output
kept alive by the profile."""

from __future__ import annotations

import gc
import json
import weakref

import numpy as np
from onnx import TensorProto, helper, numpy_helper

import onnxrt as ort

F = TensorProto.FLOAT


def _if_model(n_body: int = 20):
    body_nodes = [helper.make_node("Neg", ["x" if i == 0 else f"b{i - 1}"], [f"b{i}"]) for i in range(n_body)]
    then_g = helper.make_graph(body_nodes, "then", [], [helper.make_tensor_value_info(f"b{n_body - 1}", F, None)])
    else_g = helper.make_graph([helper.make_node("Identity", ["x"], ["e"])], "else", [],
                               [helper.make_tensor_value_info("e", F, None)])
    nodes = [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
             helper.make_node("Greater", ["s", "zero"], ["c"]),
             helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g),
             helper.make_node("SequenceConstruct", ["y", "y"], ["seq"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, [2, 3])],
                              [helper.make_tensor_value_info("y", F, None),
                               helper.make_tensor_sequence_value_info("seq", F, None)],
                              [numpy_helper.from_array(np.float32(0), "zero")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def _session(tmp_path, n_body=20):
    so = ort.SessionOptions()
    so.enable_profiling = True
    so.profile_file_prefix = str(tmp_path / "p")
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(_if_model(n_body).SerializeToString(), so, providers=["CPUExecutionProvider"])


def test_node_events_have_onnxruntimes_fields(tmp_path):
    sess = _session(tmp_path)
    x = np.ones((2, 3), np.float32)
    y, seq = sess.run(None, {"x": x})
    np.testing.assert_array_equal(y, x)  # twenty negations
    with open(sess.end_profiling()) as f:
        events = json.load(f)
    nodes = [e for e in events if e["cat"] == "Node"]
    assert len(nodes) == 3 + 20 + 1
    for e in nodes:
        assert set(e) == {"cat", "ph", "name", "ts", "dur", "pid", "tid", "args"}
        assert isinstance(e["ts"], int) and isinstance(e["dur"], int) and e["dur"] >= 0
        assert e["name"] == e["args"]["node_name"] + "_kernel_time"
    neg = next(e for e in nodes if e["args"]["op_name"] == "Neg")
    assert neg["args"]["output_type_shape"] == [{"float": [2, 3]}] and neg["args"]["output_size"] == "24"
    seq_ev = next(e for e in nodes if e["args"]["op_name"] == "SequenceConstruct")
    assert seq_ev["args"]["output_type_shape"] == [{"list": []}] and seq_ev["args"]["output_size"] == "0"
    # the body's nodes lie inside the If's event, after the nodes before it
    if_ev = next(e for e in nodes if e["args"]["op_name"] == "If")
    body = [e for e in nodes if e["args"]["op_name"] == "Neg"]
    assert all(if_ev["ts"] <= e["ts"] and e["ts"] + e["dur"] <= if_ev["ts"] + if_ev["dur"] + 1 for e in body)
    # the events read twice are the same
    assert sess._profiler.events == sess._profiler.events
    assert [e["name"] for e in sess._profiler.events if e["cat"] == "Session"][-1] == "model_run"


def test_profile_keeps_no_output_alive(tmp_path):
    sess = _session(tmp_path, n_body=3)
    y, _ = sess.run(None, {"x": np.ones((2, 3), np.float32)})
    ref = weakref.ref(y.base if y.base is not None else y)
    del y, _
    gc.collect()
    assert ref() is None
    assert sum(e["cat"] == "Node" for e in sess._profiler.events) == 3 + 3 + 1
