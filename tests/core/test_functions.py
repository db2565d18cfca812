"""Function ops: model-local functions and ONNX schema function bodies are expanded."""

import numpy as np
import pytest
from onnx import TensorProto, helper

import onnxrt as ort
from onnxrt.ir.inline import expand_functions
from onnxrt.ir import Graph

from ..conftest import make_model


def _local_function_model():
    # scaled_add(a, b) = (a + b) * alpha, alpha an attribute with a default of 2
    fn = helper.make_function(
        "local.ops", "ScaledAdd", ["a", "b"], ["out"],
        [
            helper.make_node("Add", ["a", "b"], ["s"]),
            helper.make_node("Constant", [], ["alpha"]),
            helper.make_node("Mul", ["s", "alpha"], ["out"]),
        ],
        opset_imports=[helper.make_opsetid("", 18)],
        attributes=[],
        attribute_protos=[helper.make_attribute("alpha", 2.0)],
    )
    # Constant.value_float refers to the function's attribute
    const = fn.node[1]
    ref = const.attribute.add()
    ref.name = "value_float"
    ref.ref_attr_name = "alpha"
    ref.type = 1  # FLOAT
    model = make_model(
        [helper.make_node("ScaledAdd", ["x", "y"], ["z1"], domain="local.ops"),
         helper.make_node("ScaledAdd", ["z1", "y"], ["z"], domain="local.ops", alpha=10.0)],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3]),
         helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [3])],
        functions=[fn],
    )
    model.opset_import.append(helper.make_opsetid("local.ops", 1))
    return model


def test_model_local_function_with_attribute_reference():
    sess = ort.InferenceSession(_local_function_model())
    x = np.array([1, 2, 3], np.float32)
    y = np.array([1, 1, 1], np.float32)
    (z,) = sess.run(None, {"x": x, "y": y})
    np.testing.assert_allclose(z, (((x + y) * 2.0) + y) * 10.0)
    ops = [d["op_type"] for d in sess.get_provider_assignment()]
    assert "ScaledAdd" not in ops and ops.count("Add") == 2


def test_schema_function_body_is_expanded_when_no_kernel():
    model = make_model([helper.make_node("HardSwish", ["x"], ["y"])],
                       [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])])
    g = Graph.from_proto(model.graph, {"": 18})
    n = expand_functions(g, {}, has_kernel=lambda node: node.op_type != "HardSwish", input_types=lambda node: [None])
    assert n == 1
    assert [node.op_type for node in g.nodes] == ["HardSigmoid", "Mul"]
    assert g.nodes[-1].outputs == ["y"]


def test_recursive_local_functions_are_invalid_graph():
    fn = helper.make_function("local.ops", "Loopy", ["a"], ["b"],
                              [helper.make_node("Loopy", ["a"], ["b"], domain="local.ops")],
                              opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("local.ops", 1)])
    model = make_model([helper.make_node("Loopy", ["x"], ["y"], domain="local.ops")],
                       [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])], functions=[fn])
    model.opset_import.append(helper.make_opsetid("local.ops", 1))
    with pytest.raises(ort.InvalidGraph, match="recursion"):
        ort.InferenceSession(model)


def _nested_control_flow_function_model(main_has_x: bool, attr_ref: bool = False):
    """``F(c, x) = If(c, then=If(c, then=-x * k, else=|x|), else=x)``: the innermost
    branch, two subgraphs below the function body, reads the function's input ``x``
    (and, with ``attr_ref``, its attribute ``k`` through a Constant)."""
    f = TensorProto.FLOAT
    vi = helper.make_tensor_value_info
    inner_nodes = [helper.make_node("Neg", ["x"], ["n1"])]
    if attr_ref:
        const = helper.make_node("Constant", [], ["k"])
        ref = const.attribute.add()
        ref.name, ref.ref_attr_name, ref.type = "value_float", "k", ref.FLOAT
        inner_nodes += [const, helper.make_node("Mul", ["n1", "k"], ["o1"])]
    else:
        inner_nodes.append(helper.make_node("Identity", ["n1"], ["o1"]))
    inner_then = helper.make_graph(inner_nodes, "inner_then", [], [vi("o1", f, None)])
    inner_else = helper.make_graph([helper.make_node("Abs", ["x"], ["o2"])], "inner_else", [], [vi("o2", f, None)])
    outer_then = helper.make_graph(
        [helper.make_node("If", ["c"], ["z"], then_branch=inner_then, else_branch=inner_else)],
        "outer_then", [], [vi("z", f, None)])
    outer_else = helper.make_graph([helper.make_node("Identity", ["x"], ["e"])], "outer_else", [], [vi("e", f, None)])
    fn = helper.make_function(
        "local", "F", ["c", "x"], ["y"],
        [helper.make_node("If", ["c"], ["y"], then_branch=outer_then, else_branch=outer_else)],
        [helper.make_opsetid("", 13)], attributes=["k"] if attr_ref else [])
    call = helper.make_node("F", ["C", "A"], ["Y"], domain="local", **({"k": 3.0} if attr_ref else {}))
    nodes, ins, outs = [call], [vi("C", TensorProto.BOOL, []), vi("A", f, [3])], [vi("Y", f, None)]
    if main_has_x:  # a value of the main graph with the same name as the function's input
        ins.append(vi("x", f, [3]))
        nodes.append(helper.make_node("Identity", ["x"], ["XO"]))
        outs.append(vi("XO", f, None))
    graph = helper.make_graph(nodes, "g", ins, outs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid("local", 1)],
                              ir_version=8, functions=[fn])
    return model.SerializeToString()


@pytest.mark.parametrize("main_has_x", [False, True], ids=["no x outside", "another x outside"])
@pytest.mark.parametrize("attr_ref", [False, True], ids=["input", "input and attribute"])
def test_function_inputs_read_two_subgraphs_deep(main_has_x, attr_ref):
    """A function's names are its own at every depth of its body's subgraphs: the
    inner If read the main graph's ``x`` (or failed to find one), and an attribute
    reference two subgraphs down was never substituted."""
    feeds = {"C": np.array(True), "A": np.array([1.0, -2.0, 3.0], np.float32)}
    if main_has_x:
        feeds["x"] = np.full(3, 100.0, np.float32)
    sess = ort.InferenceSession(_nested_control_flow_function_model(main_has_x, attr_ref),
                                providers=["CPUExecutionProvider"])
    got = sess.run(None, feeds)
    np.testing.assert_array_equal(got[0], -feeds["A"] * (3.0 if attr_ref else 1.0))
    if main_has_x:
        np.testing.assert_array_equal(got[1], feeds["x"])
