"""What a session holds while it is made and after: each weight once, and shape
inference given no weights to copy.

Exporters such as paddle2onnx keep every weight in a ``Constant`` node, and Silero
VAD keeps its weights in ``Constant`` nodes inside If branches. Left in the model's
structure, those tensors travelled through shape inference (which serializes, parses,
infers and serializes the model back) and stayed in the typed copy beside their
decoded arrays: PaddleOCR's recognizer peaked at 154 MiB against onnxruntime's 99.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxrt
from onnxrt.ir.graph import Graph
from onnxrt.ir.proto_edits import hollow, large_tensors, refill
from onnxrt.ir.value_types import typed_structure
from onnxrt.load.weights import LARGE_WEIGHT, split_weights
from onnxrt.optimizer import OptimizeContext, run_transforms
from onnxrt.optimizer.fold_conv import conv_add_fusion, conv_mul_fusion

ort = pytest.importorskip("onnxruntime")

CPU = ["CPUExecutionProvider"]


def _const(name: str, value: np.ndarray) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(value, name + "_t"))


def _model(nodes, inputs, outputs, initializers=()) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def _mlp_in_constants(layers: int = 3, width: int = 64, seed: int = 0) -> onnx.ModelProto:
    """``x -> MatMul -> Add -> Relu`` ``layers`` times, every weight and bias a Constant
    node (the weights large, the biases small), as paddle2onnx writes them."""
    rng = np.random.default_rng(seed)
    nodes, cur = [], "x"
    for i in range(layers):
        nodes.append(_const(f"w{i}", rng.standard_normal((width, width)).astype(np.float32) / 8))
        nodes.append(_const(f"b{i}", rng.standard_normal(width).astype(np.float32)))
        nodes += [helper.make_node("MatMul", [cur, f"w{i}"], [f"m{i}"]),
                  helper.make_node("Add", [f"m{i}", f"b{i}"], [f"a{i}"]),
                  helper.make_node("Relu", [f"a{i}"], [f"h{i}"])]
        cur = f"h{i}"
    nodes.append(helper.make_node("Identity", [cur], ["y"]))
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", width])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", width])])


def _both(model: onnx.ModelProto, feeds: dict, level=None):
    so = onnxrt.SessionOptions()
    if level is not None:
        so.graph_optimization_level = level
    sess = onnxrt.InferenceSession(model.SerializeToString(), so, providers=CPU)
    ref = ort.InferenceSession(model.SerializeToString(), providers=CPU).run(None, feeds)
    got = sess.run(None, feeds)
    for g, r in zip(got, ref):
        np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-6)
    return sess


# -- large Constant nodes are weights ----------------------------------------------------
@pytest.mark.parametrize("level", [None, onnxrt.GraphOptimizationLevel.ORT_DISABLE_ALL])
def test_large_constants_leave_the_kept_structure(level):
    model = _mlp_in_constants()
    x = np.random.default_rng(1).standard_normal((5, 64)).astype(np.float32)
    sess = _both(model, {"x": x}, level)
    kept = [n for n in sess._proto.graph.node if n.op_type == "Constant"]
    # the three 64x64 weights are arrays now; the 64-element biases stay in the structure
    assert sorted(n.output[0] for n in kept) == ["b0", "b1", "b2"]
    assert sorted(sess._weights) == ["w0", "w1", "w2"]
    assert sess._proto.ByteSize() < sum(a.nbytes for a in sess._weights.values()) / 10
    # held once: the graph's initializer is the very array decoded from the model
    for name, arr in sess._weights.items():
        assert np.shares_memory(sess._built.graph.initializers[name], arr)
    # not overridable: a Constant's output was never an input (IR >= 4 or not)
    assert [i.name for i in sess.get_inputs()] == ["x"]


def test_a_constant_that_is_a_graph_output_stays_a_node():
    w = np.arange(2048, dtype=np.float32).reshape(32, 64) / 2048
    model = _model([_const("w", w), helper.make_node("MatMul", ["x", "w"], ["y"])],
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 32])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 64]),
                    helper.make_tensor_value_info("w", TensorProto.FLOAT, [32, 64])])
    proto, weights = split_weights(model)
    assert weights == {} and proto is model
    x = np.ones((2, 32), np.float32)
    y, w_out = _both(model, {"x": x}).run(None, {"x": x})
    np.testing.assert_array_equal(w_out, w)


def test_a_large_constant_read_inside_an_if_body():
    rng = np.random.default_rng(2)
    w = rng.standard_normal((64, 48)).astype(np.float32)
    then = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["t"])], "then", [],
                             [helper.make_tensor_value_info("t", TensorProto.FLOAT, None)])
    other = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["e0"]), helper.make_node("Neg", ["e0"], ["e"])],
                              "else", [], [helper.make_tensor_value_info("e", TensorProto.FLOAT, None)])
    model = _model([_const("w", w), helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)],
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 64]),
                    helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    x = rng.standard_normal((3, 64)).astype(np.float32)
    for c in (True, False):
        sess = _both(model, {"x": x, "c": np.array(c)})
    assert list(sess._weights) == ["w"]


def test_integer_constants_keep_their_values_for_shape_inference():
    # a large int64 Constant stays in the structure, where inference reads its values
    shape = np.array([1] * 2000 + [6], dtype=np.int64)
    model = _model([_const("s", shape), helper.make_node("Reshape", ["x", "s"], ["y"])],
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    proto, weights = split_weights(model)
    assert weights == {}


def test_a_constant_defined_twice_is_still_refused():
    w = np.ones((64, 64), np.float32)
    model = _model([_const("w", w), _const("w", w), helper.make_node("MatMul", ["x", "w"], ["y"])],
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])])
    with pytest.raises(onnxrt.InvalidGraph, match="'w' is defined more than once"):
        onnxrt.InferenceSession(model.SerializeToString(), providers=CPU)


def test_a_name_a_large_and_a_small_constant_both_define_is_still_refused():
    model = _model([_const("w", np.ones((64, 64), np.float32)), _const("w", np.ones(4, np.float32)),
                    helper.make_node("MatMul", ["x", "w"], ["y"])],
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])])
    assert split_weights(model)[1] == {}
    with pytest.raises(onnxrt.InvalidGraph, match="'w' is defined more than once"):
        onnxrt.InferenceSession(model.SerializeToString(), providers=CPU)


def test_a_constant_with_short_data_is_refused_with_its_name():
    t = numpy_helper.from_array(np.ones((64, 64), np.float32), "wt")
    t.raw_data = t.raw_data[:-4]
    model = _model([helper.make_node("Constant", [], ["w"], value=t), helper.make_node("MatMul", ["x", "w"], ["y"])],
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])])
    with pytest.raises(onnxrt.InvalidGraph, match="raw_data holds 16380 bytes"):
        onnxrt.InferenceSession(model.SerializeToString(), providers=CPU)


# -- shape inference sees no weights ------------------------------------------------------
def _if_with_body_weights(seed: int = 3) -> onnx.ModelProto:
    """An If whose branches hold their weights: one as a Constant node, one as a body
    initializer (Silero VAD's layout)."""
    rng = np.random.default_rng(seed)
    wa = rng.standard_normal((64, 32)).astype(np.float32)
    wb = rng.standard_normal((64, 32)).astype(np.float32)
    then = helper.make_graph([_const("wa", wa), helper.make_node("MatMul", ["x", "wa"], ["t"])], "then", [],
                             [helper.make_tensor_value_info("t", TensorProto.FLOAT, None)])
    other = helper.make_graph([helper.make_node("MatMul", ["x", "wb"], ["e"])], "else", [],
                              [helper.make_tensor_value_info("e", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(wb, "wb")])
    return _model([helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)],
                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 64]),
                   helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])


def _branch(graph: onnx.GraphProto, name: str) -> onnx.GraphProto:
    return next(a.g for a in graph.node[0].attribute if a.name == name)


def test_hollow_then_refill_gives_the_tensors_back():
    model = _if_with_body_weights()
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    assert hollow(copy.graph, LARGE_WEIGHT) == 2
    assert copy.ByteSize() < model.ByteSize() / 10
    assert [(t.name, list(t.dims)) for t in large_tensors(copy.graph, LARGE_WEIGHT)] == \
        [("wb", [64, 32]), ("wa_t", [64, 32])]  # attributes in name order: else_branch first
    typed = onnx.shape_inference.infer_shapes(copy, check_type=False, strict_mode=False)
    assert refill(typed.graph, model.graph, LARGE_WEIGHT)
    for got, want in zip(large_tensors(typed.graph, LARGE_WEIGHT), large_tensors(model.graph, LARGE_WEIGHT)):
        np.testing.assert_array_equal(numpy_helper.to_array(got), numpy_helper.to_array(want))
    # the inferred types are there, in the bodies too
    assert {vi.name for vi in _branch(typed.graph, "then_branch").value_info} >= {"wa"}


def test_refill_refuses_tensors_that_do_not_match():
    model = _if_with_body_weights()
    other = _if_with_body_weights()
    _branch(other.graph, "else_branch").initializer[0].dims[:] = [32, 64]
    hollow(other.graph, LARGE_WEIGHT)
    assert not refill(other.graph, model.graph, LARGE_WEIGHT)
    assert list(large_tensors(other.graph, LARGE_WEIGHT))[0].raw_data == b""  # nothing changed


def test_typed_structure_keeps_the_body_weights_and_types_them():
    model = _if_with_body_weights()
    typed = typed_structure(model, {})
    graph = Graph.from_proto(typed.graph, {"": 17})
    (node,) = graph.nodes
    then, other = node.subgraphs["then_branch"], node.subgraphs["else_branch"]
    want = numpy_helper.to_array(_branch(model.graph, "then_branch").node[0].attribute[0].t)
    np.testing.assert_array_equal(numpy_helper.to_array(then.nodes[0].attrs["value"].t), want)
    np.testing.assert_array_equal(other.initializers["wb"],
                                  numpy_helper.to_array(_branch(model.graph, "else_branch").initializer[0]))
    assert then.value_types["t"].tensor_type.shape.dim[1].dim_value == 32
    # and the session computes what onnxruntime does, on both branches, fully optimized
    x = np.random.default_rng(4).standard_normal((3, 64)).astype(np.float32)
    for c in (True, False):
        _both(model, {"x": x, "c": np.array(c)})


def test_graph_to_proto_can_leave_large_tensors_hollow():
    graph = Graph.from_proto(typed_structure(_if_with_body_weights(), {}).graph, {"": 17})
    full, hollowed = graph.to_proto(), graph.to_proto(hollow_above=LARGE_WEIGHT)
    assert hollowed.ByteSize() < full.ByteSize() / 10
    pairs = list(zip(large_tensors(hollowed, LARGE_WEIGHT), large_tensors(full, LARGE_WEIGHT)))
    assert len(pairs) == 2
    for h, f in pairs:
        assert (h.name, h.data_type, list(h.dims)) == (f.name, f.data_type, list(f.dims))
        assert not h.raw_data and not h.float_data and f.raw_data


# -- a refused fold leaves nothing behind --------------------------------------------------
def _conv_read_twice(op: str) -> onnx.ModelProto:
    """A Conv whose output a per-channel ``op`` and a Relu both read: the fold must not
    swallow the Conv, which the Relu still needs."""
    rng = np.random.default_rng(5)
    w = numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "W")
    s = numpy_helper.from_array(rng.standard_normal((1, 8, 1, 1)).astype(np.float32), "S")
    nodes = [helper.make_node("Conv", ["x", "W"], ["c"]), helper.make_node(op, ["c", "S"], ["y"]),
             helper.make_node("Relu", ["c"], ["r"])]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
                   helper.make_tensor_value_info("r", TensorProto.FLOAT, None)], [w, s])


@pytest.mark.parametrize("op, fusion", [("Mul", conv_mul_fusion), ("Add", conv_add_fusion)])
def test_a_refused_conv_fold_adds_no_weights(op, fusion):
    model = _conv_read_twice(op)
    sess = onnxrt.InferenceSession(model.SerializeToString(), providers=CPU)
    graph = Graph.from_proto(model.graph, {"": 17})
    before = dict(graph.initializers)
    assert not fusion(graph, OptimizeContext(sess._built.providers, None, None, 1 << 30))
    assert graph.initializers.keys() == before.keys()
    # the level-1 transforms settle in one round: nothing is made and dropped again
    fired = run_transforms(graph, OptimizeContext(sess._built.providers, None, None, 1 << 30),
                           onnxrt.GraphOptimizationLevel.ORT_ENABLE_BASIC, "pre", set())
    assert "dead_node_elimination" not in fired
    x = np.random.default_rng(6).standard_normal((1, 3, 8, 8)).astype(np.float32)
    _both(model, {"x": x})


def test_a_conv_add_fold_keeps_the_conv_weight():
    rng = np.random.default_rng(7)
    w = numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "W")
    b = numpy_helper.from_array(rng.standard_normal((8, 1, 1)).astype(np.float32), "B")
    model = _model([helper.make_node("Conv", ["x", "W"], ["c"]), helper.make_node("Add", ["c", "B"], ["y"])],
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w, b])
    x = rng.standard_normal((1, 3, 8, 8)).astype(np.float32)
    sess = _both(model, {"x": x})
    convs = [n for n in sess._built.graph.nodes if n.op_type in ("Conv", "FusedConv")]
    assert len(convs) == 1 and convs[0].inputs[1] == "W"
    assert [n.op_type for n in sess._built.graph.nodes if n.op_type == "Add"] == []


# -- the peak, measured in a fresh process -------------------------------------------------
_PROBE = textwrap.dedent("""
    import json, re, sys
    import numpy as np
    import onnxrt

    def vm(key):
        return int(re.search(key + r":\\s+(\\d+)", open("/proc/self/status").read()).group(1)) * 1024

    tiny, big = sys.argv[1], sys.argv[2]
    # a first session imports the kernels, so that the second measures only its model
    onnxrt.InferenceSession(tiny, providers=["CPUExecutionProvider"])
    before = vm("VmRSS")
    sess = onnxrt.InferenceSession(big, providers=["CPUExecutionProvider"])
    sess.run(None, {"x": np.ones((2, 512), np.float32)})
    print(json.dumps({"growth": vm("VmHWM") - before}))
""")


def _mlp_in_initializers(layers: int, width: int) -> onnx.ModelProto:
    """:func:`_mlp_in_constants` with its weights and biases as initializers."""
    model = _mlp_in_constants(layers, width)
    g = model.graph
    consts = [n for n in g.node if n.op_type == "Constant"]
    g.initializer.extend(numpy_helper.from_array(numpy_helper.to_array(n.attribute[0].t), n.output[0])
                         for n in consts)
    rest = [n for n in g.node if n.op_type != "Constant"]
    del g.node[:]
    g.node.extend(rest)
    return model


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads /proc/self/status")
@pytest.mark.parametrize("layout, bound", [("constants", 3.0), ("initializers", 1.5)])
def test_the_peak_while_a_session_is_made_stays_near_the_weights(tmp_path, layout, bound):
    """A model file with 16 MiB of weights, all in Constant nodes or all initializers:
    the session's peak above where it started. Constant nodes are parsed with the
    model and decoded beside it (about 2x the weights), where shape inference's copies
    and the typed model took it to 8x; initializers are read straight from the file
    into their arrays (about 1x), where parsing the file whole (its bytes, then the
    parsed model beside the arrays) took it to 2x."""
    make = _mlp_in_constants if layout == "constants" else _mlp_in_initializers
    model = make(layers=16, width=512)
    weights = 16 * 512 * 512 * 4
    tiny = _mlp_in_constants(layers=1, width=8)
    big_path, tiny_path = tmp_path / "big.onnx", tmp_path / "tiny.onnx"
    onnx.save(model, str(big_path))
    onnx.save(tiny, str(tiny_path))
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", _PROBE, str(tiny_path), str(big_path)], capture_output=True,
                         text=True, timeout=300, env=env, check=True)
    growth = json.loads(out.stdout.strip().splitlines()[-1])["growth"]
    assert growth < bound * weights, f"the peak grew {growth / weights:.2f}x the weights"
