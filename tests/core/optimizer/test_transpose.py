"""Level-2 transpose transforms: cancellation, merging, and folding into FusedMatMul."""

import numpy as np
import pytest
from onnx import helper

from .util import assert_same_outputs, f32, model, ops, session, vi

N = helper.make_node


def test_inverse_transposes_cancel():
    m = model([N("Transpose", ["x"], ["t"], perm=[0, 2, 3, 1]), N("Transpose", ["t"], ["u"], perm=[0, 3, 1, 2]),
               N("Relu", ["u"], ["y"])], [vi("x", [2, 3, 4, 5])], [vi("y", None)])
    sess = assert_same_outputs(m, {"x": f32(2, 3, 4, 5)})
    assert ops(sess) == {"Relu": 1}
    assert sess._built.graph.nodes[0].inputs == ["x"]
    assert ops(session(m, disabled=["transpose_cancellation"]))["Transpose"] == 2


def test_two_transposes_merge_into_one():
    m = model([N("Transpose", ["x"], ["t"], perm=[1, 0, 2]), N("Transpose", ["t"], ["y"], perm=[0, 2, 1])],
              [vi("x", [2, 3, 4])], [vi("y", None)])
    sess = assert_same_outputs(m, {"x": f32(2, 3, 4)})
    assert ops(sess) == {"Transpose": 1}
    assert sess._built.graph.nodes[0].attr("perm") == [1, 2, 0]


def test_default_perms_reverse_and_cancel():
    m = model([N("Transpose", ["x"], ["t"]), N("Transpose", ["t"], ["u"]), N("Neg", ["u"], ["y"])],
              [vi("x", [2, 3, 4])], [vi("y", None)])
    assert ops(assert_same_outputs(m, {"x": f32(2, 3, 4)})) == {"Neg": 1}


def test_transpose_read_elsewhere_stays_for_its_other_reader():
    m = model([N("Transpose", ["x"], ["t"], perm=[1, 0]), N("Transpose", ["t"], ["u"], perm=[1, 0]),
               N("Neg", ["u"], ["y"])], [vi("x", [2, 3])], [vi("y", None), vi("t", None)])
    sess = assert_same_outputs(m, {"x": f32(2, 3)})
    assert ops(sess) == {"Transpose": 1, "Neg": 1}


def test_cancelling_transposes_whose_result_is_a_graph_output_still_give_it():
    m = model([N("Transpose", ["x"], ["t"], perm=[1, 0]), N("Transpose", ["t"], ["y"], perm=[1, 0])],
              [vi("x", [2, 3])], [vi("y", None)])
    sess = assert_same_outputs(m, {"x": f32(2, 3)})
    assert ops(sess) == {"Transpose": 1} and sess._built.graph.nodes[0].attr("perm") == [0, 1]


@pytest.mark.parametrize("side", ["A", "B", "both"])
def test_last_axes_transpose_folds_into_fused_matmul(side):
    nodes, a, b = [], "a", "b"
    if side in ("A", "both"):
        nodes.append(N("Transpose", ["a"], ["at"], perm=[0, 2, 1]))
        a = "at"
    if side in ("B", "both"):
        nodes.append(N("Transpose", ["b"], ["bt"], perm=[0, 2, 1]))
        b = "bt"
    nodes.append(N("MatMul", [a, b], ["y"]))
    a_shape = [2, 5, 4] if side in ("A", "both") else [2, 4, 5]
    b_shape = [2, 3, 5] if side in ("B", "both") else [2, 5, 3]
    m = model(nodes, [vi("a", a_shape), vi("b", b_shape)], [vi("y", None)])
    sess = assert_same_outputs(m, {"a": f32(*a_shape), "b": f32(*b_shape, seed=1)})
    assert ops(sess) == {"com.microsoft:FusedMatMul": 1}
    node = sess._built.graph.nodes[0]
    assert node.attr("transA") == (side in ("A", "both")) and node.attr("transB") == (side in ("B", "both"))
    assert ops(session(m, disabled=["transpose_matmul_fusion"]))["MatMul"] == 1


def test_other_permutations_stay_transposes():
    m = model([N("Transpose", ["a"], ["at"], perm=[1, 0, 2]), N("MatMul", ["at", "b"], ["y"])],
              [vi("a", [4, 2, 5]), vi("b", [2, 5, 3])], [vi("y", None)])
    assert ops(assert_same_outputs(m, {"a": f32(4, 2, 5), "b": f32(2, 5, 3)})) == {"Transpose": 1, "MatMul": 1}


@pytest.mark.parametrize("op,c,alpha", [("Mul", 0.25, 0.25), ("Div", 4.0, 0.25)])
def test_matmul_scaled_by_a_scalar_becomes_fused_matmul_alpha(op, c, alpha):
    m = model([N("MatMul", ["a", "b"], ["p"]), N(op, ["p", "c"], ["y"])],
              [vi("a", [2, 4, 5]), vi("b", [2, 5, 3])], [vi("y", None)], {"c": np.float32(c)})
    sess = assert_same_outputs(m, {"a": f32(2, 4, 5), "b": f32(2, 5, 3, seed=1)})
    assert ops(sess) == {"com.microsoft:FusedMatMul": 1}
    assert sess._built.graph.nodes[0].attr("alpha") == pytest.approx(alpha)
    assert ops(session(m, disabled=["matmul_scale_fusion"]))[op] == 1


def test_matmul_divided_into_a_scalar_or_by_a_tensor_is_not_scaled():
    m = model([N("MatMul", ["a", "b"], ["p"]), N("Div", ["c", "p"], ["y"])],
              [vi("a", [4, 5]), vi("b", [5, 3])], [vi("y", None)], {"c": np.float32(2.0)})
    assert ops(assert_same_outputs(m, {"a": f32(4, 5), "b": f32(5, 3, seed=1)})) == {"MatMul": 1, "Div": 1}
    m = model([N("MatMul", ["a", "b"], ["p"]), N("Mul", ["p", "c"], ["y"])],
              [vi("a", [4, 5]), vi("b", [5, 3])], [vi("y", None)], {"c": f32(3, seed=2)})
    assert ops(assert_same_outputs(m, {"a": f32(4, 5), "b": f32(5, 3, seed=1)})) == {"MatMul": 1, "Mul": 1}
