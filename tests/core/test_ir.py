"""The IR (onnxrt.ir): a graph of nodes joined by value names, cheap to rewrite.

What it promises: nodes keep their op, domain, opset version, attributes (raw, and
decoded on request) and subgraphs; every node has a unique name; nodes are in
topological order; single assignment, defined reads and acyclicity are checked;
subgraphs resolve names in their enclosing scopes; producers, consumers and free names
are derived on demand; the graph serializes back to a model that runs the same.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxrt as ort
from onnxrt.errors import InvalidGraph
from onnxrt.ir import Graph, Node

F = TensorProto.FLOAT


def _vi(name, shape=(2,)):
    return helper.make_tensor_value_info(name, F, list(shape))


def _graph(nodes, inputs=("x",), outputs=("y",), inits=(), opsets=None):
    gp = helper.make_graph(nodes, "g", [_vi(i) for i in inputs], [_vi(o) for o in outputs], list(inits))
    return Graph.from_proto(gp, opsets or {"": 17})


def _if_node(cond, then_out, else_out, out="y"):
    then_g = helper.make_graph([helper.make_node("Relu", ["x"], [then_out])], "then", [], [_vi(then_out)])
    else_g = helper.make_graph([helper.make_node("Neg", ["x"], [else_out])], "else", [], [_vi(else_out)])
    return helper.make_node("If", [cond], [out], then_branch=then_g, else_branch=else_g)


# -- building ---------------------------------------------------------------------------
def test_nodes_keep_op_domain_opset_and_attributes():
    g = _graph([helper.make_node("LeakyRelu", ["x"], ["y"], alpha=0.25, name="lr")],
               opsets={"": 16, "com.microsoft": 1})
    (n,) = g.nodes
    assert (n.op_type, n.domain, n.opset, n.name) == ("LeakyRelu", "", 16, "lr")
    assert n.attr("alpha") == pytest.approx(0.25)
    assert n.attr("missing", 7) == 7
    assert n.attrs["alpha"].type == onnx.AttributeProto.FLOAT  # raw, for serialization


def test_ai_onnx_domain_is_the_default_domain():
    g = _graph([helper.make_node("Relu", ["x"], ["y"], domain="ai.onnx")])
    assert g.nodes[0].domain == ""


def test_every_node_gets_a_unique_name():
    g = _graph([helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Relu", ["a"], ["b"], name="r"),
                helper.make_node("Relu", ["b"], ["y"], name="r")])
    names = [n.name for n in g.nodes]
    assert len(set(names)) == 3 and all(names)
    assert names[1] == "r"


def test_nodes_are_sorted_topologically():
    g = _graph([helper.make_node("Neg", ["a"], ["y"], name="second"), helper.make_node("Relu", ["x"], ["a"], name="first")])
    assert [n.name for n in g.nodes] == ["first", "second"]


def test_initializers_are_arrays_with_their_types():
    w = np.arange(2, dtype=np.float32)
    g = _graph([helper.make_node("Add", ["x", "w"], ["y"])], inits=[numpy_helper.from_array(w, "w")])
    np.testing.assert_array_equal(g.initializers["w"], w)
    assert g.value_types["w"].tensor_type.elem_type == F


# -- what is refused ----------------------------------------------------------------------
@pytest.mark.parametrize("nodes, message", [
    ([helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Neg", ["x"], ["y"])], "defined more than once"),
    ([helper.make_node("Relu", ["nowhere"], ["y"])], "not defined"),
    ([helper.make_node("Relu", ["b"], ["a"]), helper.make_node("Relu", ["a"], ["b"]),
      helper.make_node("Relu", ["x"], ["y"])], "cycle"),
    ([helper.make_node("Relu", ["x"], ["z"])], "never produced"),
])
def test_malformed_graphs_are_invalid_graph_errors(nodes, message):
    with pytest.raises(InvalidGraph, match=message):
        _graph(nodes)


def test_an_initializer_defined_twice_is_refused():
    t = numpy_helper.from_array(np.zeros(2, np.float32), "w")
    with pytest.raises(InvalidGraph, match="defined twice"):
        _graph([helper.make_node("Add", ["x", "w"], ["y"])], inits=[t, t])


# -- subgraphs and scopes ---------------------------------------------------------------------
def test_subgraphs_read_outer_values_through_their_parent():
    g = _graph([_if_node("c", "t", "e")], inputs=("x", "c"))
    (node,) = g.nodes
    then_g, else_g = node.subgraphs["then_branch"], node.subgraphs["else_branch"]
    assert then_g.parent is g and else_g.parent is g
    assert then_g.free_names() == ["x"]
    assert node.implicit_inputs() == ["x"]
    assert sorted(sg.name for sg in node.all_subgraphs()) == ["else", "then"]
    walked = [n.op_type for _, n in g.walk()]
    assert walked[0] == "If" and sorted(walked[1:]) == ["Neg", "Relu"]  # a node, then its bodies


def test_a_subgraph_reading_an_undefined_outer_name_is_refused():
    then_g = helper.make_graph([helper.make_node("Relu", ["ghost"], ["t"])], "then", [], [_vi("t")])
    else_g = helper.make_graph([helper.make_node("Relu", ["x"], ["e"])], "else", [], [_vi("e")])
    node = helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)
    with pytest.raises(InvalidGraph, match="ghost"):
        _graph([node], inputs=("x", "c"))


def test_outer_values_produced_later_order_the_reading_node_after_them():
    # the If reads 'a' from inside its branches only: the sort still sees the dependency
    then_g = helper.make_graph([helper.make_node("Relu", ["a"], ["t"])], "then", [], [_vi("t")])
    else_g = helper.make_graph([helper.make_node("Neg", ["a"], ["e"])], "else", [], [_vi("e")])
    nodes = [helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g, name="if"),
             helper.make_node("Relu", ["x"], ["a"], name="make_a")]
    g = _graph(nodes, inputs=("x", "c"))
    assert [n.name for n in g.nodes] == ["make_a", "if"]


# -- queries and rewriting -----------------------------------------------------------------------
def test_producers_and_consumers_are_derived_from_names():
    g = _graph([helper.make_node("Relu", ["x"], ["a"], name="r"), helper.make_node("Add", ["a", "a"], ["y"], name="s")])
    assert g.producers()["a"].name == "r"
    assert [n.name for n in g.consumers()["a"]] == ["s"]  # once, though read twice
    assert g.input_names() == ["x"] and g.output_names() == ["y"]


def test_unique_name_avoids_every_name_in_scope():
    g = _graph([helper.make_node("Relu", ["x"], ["y"], name="y__0")])
    name = g.unique_name("y")
    assert name not in g.defined_names() and name not in {n.name for n in g.nodes}


def test_a_rewrite_is_an_edit_of_names():
    g = _graph([helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Neg", ["a"], ["y"])])
    # drop the Relu: its reader reads x instead
    relu, neg = g.nodes
    neg.inputs = ["x"]
    g.nodes.remove(relu)
    g.validate()
    assert g.consumers()["x"] == [neg]


# -- serialization -------------------------------------------------------------------------------
def test_to_proto_round_trips_to_a_model_that_runs_the_same():
    w = np.array([1.5, -2.0], np.float32)
    nodes = [helper.make_node("Mul", ["x", "w"], ["m"]), _if_node("c", "t", "e", out="i"),
             helper.make_node("Add", ["m", "i"], ["y"])]
    g = _graph(nodes, inputs=("x", "c"), inits=[numpy_helper.from_array(w, "w")])
    gp = g.to_proto()
    gp.input[1].CopyFrom(helper.make_tensor_value_info("c", TensorProto.BOOL, []))
    model = helper.make_model(gp, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    onnx.checker.check_model(model)
    x = np.array([3.0, -4.0], np.float32)
    for c in (True, False):
        (y,) = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x, "c": np.array(c)})
        branch = np.maximum(x, 0) if c else -x
        np.testing.assert_allclose(y, x * w + branch)


def test_node_to_proto_keeps_attributes_and_subgraphs():
    g = _graph([_if_node("c", "t", "e")], inputs=("x", "c"))
    p = g.nodes[0].to_proto()
    assert {a.name for a in p.attribute} == {"then_branch", "else_branch"}
    assert p.attribute[0].g.node[0].op_type in ("Relu", "Neg")


def test_a_node_is_a_plain_record():
    n = Node("Relu", inputs=["x"], outputs=["y"], name="r")
    assert (n.domain, n.provider, n.subgraphs) == ("", None, {})
    assert "Relu" in repr(n) and "'r'" in repr(n)
