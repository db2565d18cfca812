"""Function ops: model-local functions and ONNX schema function bodies are expanded."""

import numpy as np
import pytest
from onnx import TensorProto, helper

import onnxrt as ort
from onnxrt.functions import expand_functions
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
