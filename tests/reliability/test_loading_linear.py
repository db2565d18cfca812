"""Loading cost that grows with the model, not faster: function inlining, recursion
and exponential expansion. The tests count operations, never wall-clock time
(``benchmarks/load_time.py`` measures the time of the full-size models)."""

import numpy as np
import pytest
from onnx import TensorProto, helper

import onnxrt as ort
from onnxrt.ir import inline
from onnxrt.ir.graph import Graph

F = TensorProto.FLOAT
OPSETS = [helper.make_opsetid("", 18), helper.make_opsetid("local", 1)]


def _vi(name, shape=(1,)):
    return helper.make_tensor_value_info(name, F, list(shape))


def _model(nodes, functions, n_out="y"):
    graph = helper.make_graph(nodes, "g", [_vi("x")], [_vi(n_out)])
    return helper.make_model(graph, opset_imports=OPSETS, ir_version=10, functions=functions).SerializeToString()


def _add_one():
    return helper.make_function("local", "AddOne", ["x"], ["y"], [
        helper.make_node("Constant", [], ["one"], value_float=1.0),
        helper.make_node("Add", ["x", "one"], ["y"])], [helper.make_opsetid("", 18)])


def _calls(n):
    nodes = [helper.make_node("AddOne", ["x" if i == 0 else f"v{i}"], [f"v{i + 1}"], domain="local")
             for i in range(n)]
    return _model(nodes, [_add_one()], n_out=f"v{n}")


def _counting(monkeypatch, cls, name):
    count = [0]
    orig = getattr(cls, name)

    def wrapped(*a, **k):
        count[0] += 1
        return orig(*a, **k)

    monkeypatch.setattr(cls, name, wrapped)
    return count


@pytest.mark.parametrize("n", [50, 400])
def test_many_calls_of_one_function_collect_the_graph_names_once(monkeypatch, n):
    # each inlined call used to collect every name of the graph again (59 s for 10,000 calls)
    names = _counting(monkeypatch, Graph, "defined_names")
    sess = ort.InferenceSession(_calls(n))
    assert names[0] <= 2, names[0]
    (y,) = sess.run(None, {"x": np.zeros(1, np.float32)})
    assert y.tolist() == [float(n)]


def test_inlined_names_stay_unique_across_calls():
    sess = ort.InferenceSession(_calls(30))
    (y,) = sess.run(None, {"x": np.full(1, 2.0, np.float32)})
    assert y.tolist() == [32.0]


def _mutual(calls_each=2):
    f = helper.make_function("local", "F", ["x"], ["y"], [
        helper.make_node("G", ["x" if i == 0 else f"a{i}"], [f"a{i + 1}" if i < calls_each - 1 else "y"],
                         domain="local") for i in range(calls_each)], OPSETS)
    g = helper.make_function("local", "G", ["x"], ["y"], [
        helper.make_node("F", ["x" if i == 0 else f"b{i}"], [f"b{i + 1}" if i < calls_each - 1 else "y"],
                         domain="local") for i in range(calls_each)], OPSETS)
    return _model([helper.make_node("F", ["x"], ["y"], domain="local")], [f, g])


@pytest.mark.parametrize("calls_each", [1, 2])
def test_functions_calling_each_other_are_invalid_graph_at_once(monkeypatch, calls_each):
    inlined = _counting(monkeypatch, inline, "inline_node")
    with pytest.raises(ort.InvalidGraph, match=r"functions call themselves \(local.F -> local.G -> local.F\)"):
        ort.InferenceSession(_mutual(calls_each))
    assert inlined[0] == 0  # refused before anything was expanded


def test_a_function_calling_itself_inside_its_body_is_refused():
    f = helper.make_function("local", "F", ["x"], ["y"], [
        helper.make_node("Relu", ["x"], ["r"]), helper.make_node("F", ["r"], ["y"], domain="local")], OPSETS)
    with pytest.raises(ort.InvalidGraph, match="call themselves"):
        ort.InferenceSession(_model([helper.make_node("F", ["x"], ["y"], domain="local")], [f]))


def _doubling_chain(depth):
    """f0 calls f1 twice, f1 calls f2 twice, ...: 2**depth nodes, no recursion."""
    fns = []
    for d in range(depth):
        callee = f"f{d + 1}" if d + 1 < depth else None
        if callee is None:
            body = [helper.make_node("Relu", ["x"], ["y"])]
        else:
            body = [helper.make_node(callee, ["x"], ["m"], domain="local"),
                    helper.make_node(callee, ["m"], ["y"], domain="local")]
        fns.append(helper.make_function("local", f"f{d}", ["x"], ["y"], body, OPSETS))
    return _model([helper.make_node("f0", ["x"], ["y"], domain="local")], fns)


def test_exponential_expansion_is_refused_before_building_it(monkeypatch):
    inlined = _counting(monkeypatch, inline, "inline_node")
    with pytest.raises(ort.InvalidGraph, match=f"more than {inline.MAX_INLINED_NODES} nodes"):
        ort.InferenceSession(_doubling_chain(24))  # 2**23 Relu nodes
    assert inlined[0] == 0


def test_moderate_expansion_still_loads_and_runs():
    sess = ort.InferenceSession(_doubling_chain(6))  # 32 Relus
    (y,) = sess.run(None, {"x": np.array([-1.0], np.float32)})
    assert y.tolist() == [0.0]


def test_a_chain_of_plain_ops_asks_no_provider_about_functions(monkeypatch):
    # the inliner asked every provider for a kernel for every node, functions or not
    # (a second of a 40,000-node chain's load); now only nodes that may be functions
    asked = []
    real = inline.expand_functions

    def spy(graph, local_functions, has_kernel, input_types, *a, **k):
        def counted(node):
            asked.append(node.op_type)
            return has_kernel(node)
        return real(graph, local_functions, counted, input_types, *a, **k)

    import onnxrt.pipeline as pipeline

    monkeypatch.setattr(pipeline, "expand_functions", spy)
    n = 300
    nodes = [helper.make_node("Abs" if i % 2 else "Neg", ["x" if i == 0 else f"v{i}"], [f"v{i + 1}"])
             for i in range(n)]
    sess = ort.InferenceSession(_model(nodes, [], n_out=f"v{n}"))
    assert asked == []
    (y,) = sess.run(None, {"x": np.array([-3.0], np.float32)})
    assert y.tolist() == [3.0]  # Neg, Abs, ... ends with Abs
