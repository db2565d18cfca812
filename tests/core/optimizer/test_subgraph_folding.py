"""Constant folding inside If, Loop and Scan bodies.

A body's Constant nodes, its initializers and the enclosing graphs' constants are
constants there too: nodes computing only from them run once at session creation and
their results become the body's initializers. Values a body is fed (its inputs, outer
values computed from graph inputs) are not folded.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh

import onnxrt

ort = pytest.importorskip("onnxruntime")


def _const(name, arr):
    return h.make_node("Constant", [], [name], value=nh.from_array(np.asarray(arr), name + "_v"))


def _session(model, level=None):
    so = onnxrt.SessionOptions()
    so.intra_op_num_threads = 1
    if level is not None:
        so.graph_optimization_level = level
    return onnxrt.InferenceSession(model, so, providers=["CPUExecutionProvider"])


def _bodies(sess):
    node = next(n for n in sess._built.graph.nodes if n.subgraphs)
    return node, list(node.all_subgraphs())


def _ops(graph):
    return [n.op_type for n in graph.nodes]


def if_model():
    """An If whose branches compute a scale from Constants and an outer weight."""
    w = np.random.default_rng(0).standard_normal((4, 4)).astype(np.float32)
    then = h.make_graph([
        _const("a", np.float32(2.0)), _const("b", np.float32(0.5)),
        h.make_node("Mul", ["a", "b"], ["ab"]),               # Constants only: folds
        h.make_node("Transpose", ["w"], ["wt"]),              # outer initializer: folds
        h.make_node("Mul", ["wt", "ab"], ["ws"]),             # folds
        h.make_node("Shape", ["w"], ["ws_shape"]),            # shape of a constant: folds
        h.make_node("Reshape", ["x", "ws_shape"], ["xr"]),    # reads the fed x: stays
        h.make_node("MatMul", ["xr", "ws"], ["t"]),           # stays
    ], "then", [], [h.make_tensor_value_info("t", TP.FLOAT, [4, 4])])
    els = h.make_graph([
        _const("c", np.float32(3.0)),
        h.make_node("Add", ["x", "c"], ["e"]),                # reads x: stays
        h.make_node("Mul", ["e", "d"], ["e2"]),               # d is computed from x outside: stays
    ], "else", [], [h.make_tensor_value_info("e2", TP.FLOAT, [4, 4])])
    g = h.make_graph([
        h.make_node("Neg", ["x"], ["d"]),
        h.make_node("If", ["cond"], ["y"], then_branch=then, else_branch=els),
    ], "if_model", [h.make_tensor_value_info("cond", TP.BOOL, []),
                    h.make_tensor_value_info("x", TP.FLOAT, [4, 4])],
        [h.make_tensor_value_info("y", TP.FLOAT, [4, 4])], [nh.from_array(w, "w")])
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=9).SerializeToString()


def loop_model():
    """A Loop whose body adds a step made of a Constant and an outer constant."""
    body = h.make_graph([
        _const("one", np.float32(1.0)),
        h.make_node("Add", ["one", "k"], ["step"]),           # Constant + outer initializer: folds
        h.make_node("Mul", ["step", "step"], ["step2"]),      # folds
        h.make_node("Add", ["acc_in", "step2"], ["acc_out"]),  # loop-carried: stays
        h.make_node("Identity", ["cond_in"], ["cond_out"]),
        h.make_node("Cast", ["i"], ["fi"], to=TP.FLOAT),      # the iteration number: stays
        h.make_node("Mul", ["fi", "step2"], ["scan_out"]),    # stays
    ], "body", [h.make_tensor_value_info("i", TP.INT64, []), h.make_tensor_value_info("cond_in", TP.BOOL, []),
                h.make_tensor_value_info("acc_in", TP.FLOAT, [3])],
        [h.make_tensor_value_info("cond_out", TP.BOOL, []), h.make_tensor_value_info("acc_out", TP.FLOAT, [3]),
         h.make_tensor_value_info("scan_out", TP.FLOAT, [3])])
    g = h.make_graph([h.make_node("Loop", ["n", "", "acc0"], ["acc", "scans"], body=body)], "loop_model",
                     [h.make_tensor_value_info("n", TP.INT64, []), h.make_tensor_value_info("acc0", TP.FLOAT, [3])],
                     [h.make_tensor_value_info("acc", TP.FLOAT, [3]),
                      h.make_tensor_value_info("scans", TP.FLOAT, None)],
                     [nh.from_array(np.array([0.5, 1.5, -2.0], np.float32), "k")])
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=9).SerializeToString()


def scan_model():
    """A Scan whose body scales each row by a folded constant."""
    body = h.make_graph([
        _const("two", np.float32(2.0)),
        h.make_node("Sqrt", ["two"], ["r2"]),                 # folds
        h.make_node("Mul", ["row", "r2"], ["scaled"]),        # reads the scanned row: stays
        h.make_node("Add", ["s_in", "scaled"], ["s_out"]),
        h.make_node("Identity", ["scaled"], ["row_out"]),
    ], "scan_body", [h.make_tensor_value_info("s_in", TP.FLOAT, [2]), h.make_tensor_value_info("row", TP.FLOAT, [2])],
        [h.make_tensor_value_info("s_out", TP.FLOAT, [2]), h.make_tensor_value_info("row_out", TP.FLOAT, [2])])
    g = h.make_graph([h.make_node("Scan", ["s0", "rows"], ["s", "outs"], body=body, num_scan_inputs=1)], "scan_model",
                     [h.make_tensor_value_info("s0", TP.FLOAT, [2]),
                      h.make_tensor_value_info("rows", TP.FLOAT, [5, 2])],
                     [h.make_tensor_value_info("s", TP.FLOAT, [2]), h.make_tensor_value_info("outs", TP.FLOAT, [5, 2])])
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=9).SerializeToString()


def _check_outputs(model, feeds_list):
    got = _session(model)
    exp = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    for feeds in feeds_list:
        for g, e in zip(got.run(None, feeds), exp.run(None, feeds)):
            np.testing.assert_allclose(g, e, rtol=1e-6, atol=1e-6)


def test_if_branches_fold_their_constants_and_outer_constants():
    model = if_model()
    node, _ = _bodies(_session(model, onnxrt.GraphOptimizationLevel.ORT_DISABLE_ALL))
    assert _ops(node.subgraphs["then_branch"]) == ["Constant", "Constant", "Mul", "Transpose", "Mul", "Shape",
                                                   "Reshape", "MatMul"]
    assert _ops(node.subgraphs["else_branch"]) == ["Constant", "Add", "Mul"]
    node, _ = _bodies(_session(model))
    then, els = node.subgraphs["then_branch"], node.subgraphs["else_branch"]
    assert _ops(then) == ["Reshape", "MatMul"]
    # the folded values are the branch's own initializers, as computed
    assert set(then.initializers) == {"ws", "ws_shape"}
    import onnx

    ref_w = nh.to_array(onnx.load_from_string(model).graph.initializer[0])
    np.testing.assert_array_equal(then.initializers["ws"], ref_w.T * np.float32(2.0 * 0.5))
    np.testing.assert_array_equal(then.initializers["ws_shape"], [4, 4])
    # the else branch reads x and d, which are fed and computed from a feed: only its
    # Constant folds
    assert _ops(els) == ["Add", "Mul"] and set(els.initializers) == {"c"}
    # the outer weight is read by no body any more
    assert "w" not in node.implicit_inputs()
    x = np.random.default_rng(1).standard_normal((4, 4)).astype(np.float32)
    _check_outputs(model, [{"cond": np.array(c), "x": x} for c in (True, False)])


def test_loop_body_folds_what_does_not_change_between_iterations():
    model = loop_model()
    _, (before,) = _bodies(_session(model, onnxrt.GraphOptimizationLevel.ORT_DISABLE_ALL))
    assert len(before.nodes) == 7
    _, (body,) = _bodies(_session(model))
    # Constant, Add and Mul of the step fold; what reads the iteration number or the
    # carried value stays (the Identity of the condition is a body output's producer)
    assert sorted(_ops(body)) == ["Add", "Cast", "Identity", "Mul"]
    assert set(body.initializers) == {"step2"}
    np.testing.assert_allclose(body.initializers["step2"], (np.array([0.5, 1.5, -2.0]) + 1) ** 2)
    _check_outputs(model, [{"n": np.array(4, np.int64), "acc0": np.arange(3, dtype=np.float32)}])


def test_scan_body_folds_its_constant():
    model = scan_model()
    _, (before,) = _bodies(_session(model, onnxrt.GraphOptimizationLevel.ORT_DISABLE_ALL))
    assert _ops(before) == ["Constant", "Sqrt", "Mul", "Add", "Identity"]
    _, (body,) = _bodies(_session(model))
    assert _ops(body) == ["Mul", "Add", "Identity"]
    np.testing.assert_allclose(body.initializers["r2"], np.sqrt(np.float32(2)))
    rows = np.random.default_rng(2).standard_normal((5, 2)).astype(np.float32)
    _check_outputs(model, [{"s0": np.zeros(2, np.float32), "rows": rows}])


def test_an_overridable_outer_initializer_is_not_folded_into_a_body():
    # 'k' is also a graph input: a feed may replace it, so the body reads it at run time
    import onnx

    m = onnx.load_from_string(loop_model())
    m.graph.input.append(h.make_tensor_value_info("k", TP.FLOAT, [3]))
    model = m.SerializeToString()
    _, (body,) = _bodies(_session(model))
    assert "Add" in _ops(body) and _ops(body).count("Mul") == 2
    assert "step2" not in body.initializers
    feeds = {"n": np.array(3, np.int64), "acc0": np.ones(3, np.float32), "k": np.array([1, 2, 3], np.float32)}
    _check_outputs(model, [feeds])
