"""Empty tensors and rank-0 inputs through the kernels that reshaped them with an
inferred (-1) size, or checked their axes and pads too strictly: each case runs on
onnxrt and on onnxruntime, and the outputs must be equal in shape, type and value.
(Found by a differential sweep against onnxruntime; each used to fail in onnxrt.)"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

import onnxrt

ort = pytest.importorskip("onnxruntime")

F32, U8 = np.float32, np.uint8


def _model(op, inputs, attrs, opset, n_out):
    names = [n for n, _ in inputs]
    infos = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), None) for n, a in inputs]
    outs = [f"y{i}" for i in range(n_out)]
    graph = helper.make_graph([helper.make_node(op, names, outs, **attrs)], "g", infos,
                              [helper.make_empty_tensor_value_info(o) for o in outs])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)
    # declared output types, from shape inference (onnxruntime needs them)
    inferred = onnx.shape_inference.infer_shapes(model)
    types = {v.name: v.type.tensor_type.elem_type for v in inferred.graph.output}
    for o in model.graph.output:
        o.CopyFrom(helper.make_tensor_value_info(o.name, types[o.name], None))
    return model.SerializeToString()


CASES = [
    ("Softmax", [("x", np.ones((0, 3), F32))], {"axis": 1}, 11, 1),
    ("Softmax", [("x", np.ones((2, 0, 3), F32))], {"axis": -1}, 11, 1),
    ("LogSoftmax", [("x", np.ones((0, 3), F32))], {"axis": 1}, 11, 1),
    ("Hardmax", [("x", np.ones((0, 3), F32))], {"axis": 1}, 11, 1),
    ("TopK", [("x", np.ones((0, 3), F32)), ("k", np.array([0], np.int64))], {"axis": 0}, 11, 2),
    ("TopK", [("x", np.ones((2, 0), np.int64)), ("k", np.array([0], np.int64))], {"axis": 1}, 11, 2),
    ("LayerNormalization", [("x", np.ones((0, 4), F32)), ("s", np.ones(4, F32)), ("b", np.ones(4, F32))],
     {"axis": -1}, 17, 3),
    ("RMSNormalization", [("x", np.ones((0, 4), F32)), ("s", np.ones(4, F32))], {}, 23, 1),
    ("Conv", [("x", np.ones((2, 3, 5, 5), F32)), ("w", np.ones((0, 3, 3, 3), F32))], {}, 11, 1),
    ("ConvTranspose", [("x", np.ones((1, 0, 3, 3), F32)), ("w", np.ones((0, 2, 3, 3), F32)),
                       ("b", np.array([1, 2], F32))], {}, 11, 1),
    ("ConvInteger", [("x", np.ones((1, 2, 5, 5), U8)), ("w", np.ones((0, 2, 3, 3), U8))], {}, 10, 1),
    ("QLinearConv", [("x", np.ones((1, 2, 5, 5), U8)), ("xs", np.array(0.1, F32)), ("xz", np.array(3, U8)),
                     ("w", np.ones((0, 2, 3, 3), U8)), ("ws", np.array(0.2, F32)), ("wz", np.array(1, U8)),
                     ("ys", np.array(0.5, F32)), ("yz", np.array(7, U8))], {}, 10, 1),
    ("DeformConv", [("x", np.ones((0, 2, 4, 4), F32)), ("w", np.ones((3, 2, 2, 2), F32)),
                    ("o", np.ones((0, 8, 3, 3), F32))], {}, 19, 1),
    ("ReduceSum", [("x", np.array(3.0, F32)), ("axes", np.array([0], np.int64))], {"keepdims": 1}, 18, 1),
    ("ReduceMax", [("x", np.array(3.0, F32)), ("axes", np.array([-1], np.int64))], {"keepdims": 0}, 18, 1),
    ("ReduceMean", [("x", np.array(3, np.int64)), ("axes", np.array([0], np.int64))], {"keepdims": 1}, 18, 1),
    ("Pad", [("x", np.ones((0, 3), F32)), ("p", np.array([0, 1, 0, 1], np.int64))], {"mode": "reflect"}, 19, 1),
    ("DynamicQuantizeLinear", [("x", np.ones((0,), F32))], {}, 11, 3),
    ("GatherND", [("x", np.arange(6, dtype=F32).reshape(2, 3)), ("i", np.zeros((2, 0), np.int64))], {}, 18, 1),
]


@pytest.mark.parametrize("op, inputs, attrs, opset, n_out", CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_edge_shape_matches_onnxruntime(op, inputs, attrs, opset, n_out):
    model = _model(op, inputs, attrs, opset, n_out)
    feeds = dict(inputs)
    got = onnxrt.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)
    exp = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)
    for g, e in zip(got, exp):
        assert g.shape == e.shape and g.dtype == e.dtype
        np.testing.assert_array_equal(g, e)
