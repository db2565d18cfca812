"""``float16_compute``: float16 nodes on the CPU provider computed in float32.

The models are built here in float16 with ``onnx.helper`` and run on onnxrt (with and
without the transform) and on onnxruntime, whose CPU provider computes them in float32
between inserted casts as well.

Tolerance, in units of the float16 spacing at the output's largest magnitude ("ulps"):
with the transform, both runtimes compute the same float32 chains and round once where
a chain leaves float32, so they differ only where a float32 difference (summation order
in Conv/MatMul, a fused kernel against onnxruntime's expanded function body) moves a
value across a rounding boundary: at most one ulp, asserted as ``ORT_ULPS = 2``
(measured: 0-1). Without it, onnxrt rounds after every node, each rounding at most half
an ulp of that node's output, carried through the 6-8 nodes of these models; the
activations at their ends (Sigmoid, Softmax, LayerNormalization) shrink what comes
before, and ``SELF_ULPS = 4`` bounds it (measured: 1-2).
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh

import onnxrt

from ...float16_models import conv_net, ln_block

ort = pytest.importorskip("onnxruntime")

ORT_ULPS = 2
SELF_ULPS = 4
F16 = np.float16


def _init(name, arr):
    return nh.from_array(arr, name)


def side_paths(rng, n=64):
    """float16 compute with integer and bool side paths, data movement and a shape."""
    inits = [_init("k", (rng.random(n) * 3).astype(F16)), _init("idx", np.array([3, 1, 0, 7], np.int64))]
    nodes = [
        h.make_node("Mul", ["x", "k"], ["xk"]),
        h.make_node("Sigmoid", ["xk"], ["sg"]),
        h.make_node("Cast", ["sg"], ["sg_i"], to=TP.INT64),
        h.make_node("ArgMax", ["xk"], ["am"], axis=0, keepdims=1),
        h.make_node("Greater", ["xk", "x"], ["gt"]),
        h.make_node("Where", ["gt", "sg", "x"], ["w"]),
        h.make_node("Gather", ["w", "idx"], ["gw"]),
        h.make_node("Transpose", ["sg"], ["tsg"]),
        h.make_node("Exp", ["tsg"], ["e"]),
        h.make_node("Shape", ["x"], ["shp"]),
        h.make_node("Cast", ["shp"], ["count"], to=TP.FLOAT16),
        h.make_node("Add", ["e", "count"], ["y"]),
    ]
    outs = [h.make_tensor_value_info("y", TP.FLOAT16, None), h.make_tensor_value_info("gw", TP.FLOAT16, None),
            h.make_tensor_value_info("sg_i", TP.INT64, None), h.make_tensor_value_info("am", TP.INT64, None),
            h.make_tensor_value_info("gt", TP.BOOL, None)]
    g = h.make_graph(nodes, "side_paths", [h.make_tensor_value_info("x", TP.FLOAT16, [n])], outs, inits)
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=9)


MODELS = {"conv_net": (conv_net, (1, 3, 32, 32)), "ln_block": (ln_block, (1, 16, 64)),
          "side_paths": (side_paths, (64,))}


def _session(model, level=None, disabled=()):
    so = onnxrt.SessionOptions()
    so.intra_op_num_threads = 1
    if level is not None:
        so.graph_optimization_level = level
    return onnxrt.InferenceSession(model, so, providers=["CPUExecutionProvider"],
                                   disabled_optimizers=list(disabled))


def _ulps(got, exp):
    """The largest difference, in float16 spacings at ``exp``'s largest magnitude."""
    exp32 = exp.astype(np.float32)
    ulp = float(np.spacing(F16(np.abs(exp32).max())))
    return float(np.abs(got.astype(np.float32) - exp32).max()) / ulp


def _ops(sess):
    return [n.op_type for n in sess._built.graph.nodes]


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("seed", [0, 1])
def test_agrees_with_onnxruntime_and_with_itself(name, seed):
    build, shape = MODELS[name]
    model = build(np.random.default_rng(seed)).SerializeToString()
    x = (np.random.default_rng(seed + 10).standard_normal(shape) * 2).astype(F16)
    got = _session(model).run(None, {"x": x})
    plain = _session(model, disabled=["float16_compute"]).run(None, {"x": x})
    exp = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    for g, p, e in zip(got, plain, exp):
        assert g.dtype == p.dtype == e.dtype and g.shape == e.shape
        if e.dtype == np.float16:
            assert _ulps(g, e) <= ORT_ULPS
            assert _ulps(g, p) <= SELF_ULPS
        else:
            # integer and bool outputs read the same float32 values onnxruntime reads
            np.testing.assert_array_equal(g, e)


def test_conv_net_runs_in_float32_between_two_casts():
    sess = _session(conv_net(np.random.default_rng(0)).SerializeToString())
    ops = _ops(sess)
    # one Cast in, one out; the Reshape between Resize and Softmax is an isolated
    # float16 node (onnxruntime's rule) and runs in float32 too: no rounding inside
    assert ops.count("Cast") == 2 and ops[0] == "Cast" and ops[-1] == "Cast"
    g = sess._built.graph
    casts = [n for n in g.nodes if n.op_type == "Cast"]
    assert [n.attr("to") for n in casts] == [TP.FLOAT, TP.FLOAT16]
    assert casts[-1].outputs == ["y"]
    # the weights became float32 initializers once, the float16 ones are gone
    assert all(np.asarray(v).dtype != np.float16 for v in g.initializers.values())
    for n in g.nodes[1:-1]:
        for o in n.outputs:
            assert g.value_types[o].tensor_type.elem_type == TP.FLOAT
    plain = _ops(_session(conv_net(np.random.default_rng(0)).SerializeToString(), disabled=["float16_compute"]))
    assert "Cast" not in plain and len(plain) == len(ops) - 2


def test_layer_norm_stays_float16_with_its_float16_weights():
    sess = _session(ln_block(np.random.default_rng(0)).SerializeToString())
    g = sess._built.graph
    ops = _ops(sess)
    assert ops.count("LayerNormalization") == 2 and ops.count("Cast") == 3
    for n in g.nodes:
        if n.op_type == "LayerNormalization":
            # onnxruntime has a float16 kernel: the node and its scale and bias stay
            assert all(np.asarray(g.initializers[i]).dtype == np.float16 for i in n.inputs[1:])
    # the residual reads the float16 graph input through a Cast; the MatMuls and Gelu
    # between are float32 without rounding between them
    names = {o: n for n in g.nodes for o in n.outputs}
    assert names["res"].op_type == "Cast" and names["res"].attr("to") == TP.FLOAT16
    res = names[names["res"].inputs[0]]
    assert res.op_type == "Add"
    assert any(names[i].op_type == "Cast" and names[i].inputs == ["x"] for i in res.inputs)
    assert any(names[i].op_type == "MatMul" for i in res.inputs)
    gelu = next(n for n in g.nodes if n.op_type == "Gelu")
    assert names[gelu.inputs[0]].op_type == "Add" and g.value_types[gelu.outputs[0]].tensor_type.elem_type == TP.FLOAT


def test_side_paths_keep_integer_and_bool_values():
    sess = _session(side_paths(np.random.default_rng(0)).SerializeToString())
    g = sess._built.graph
    by_out = {o: n for n in g.nodes for o in n.outputs}
    # the model's Cast to int64 now truncates the float32 Sigmoid, as in onnxruntime
    assert g.value_types[by_out["sg_i"].inputs[0]].tensor_type.elem_type == TP.FLOAT
    assert by_out["am"].op_type == "ArgMax" and by_out["gt"].op_type == "Greater"
    assert g.value_types["am"].tensor_type.elem_type == TP.INT64
    assert g.value_types["gt"].tensor_type.elem_type == TP.BOOL
    # Gather has a float16 kernel and reads Where's float16 output, which is also
    # read from nowhere else: it stays float16 behind one Cast
    assert by_out["gw"].op_type == "Gather"
    assert by_out[by_out["gw"].inputs[0]].op_type == "Cast"
    assert _ops(sess).count("Cast") == 4


def test_not_run_at_disable_all():
    model = conv_net(np.random.default_rng(0)).SerializeToString()
    sess = _session(model, level=onnxrt.GraphOptimizationLevel.ORT_DISABLE_ALL)
    assert "Cast" not in _ops(sess)
    assert all(np.asarray(v).dtype == np.float16 for k, v in sess._built.graph.initializers.items()
               if k not in ("scales", "shape"))
    basic = _session(model, level=onnxrt.GraphOptimizationLevel.ORT_ENABLE_BASIC)
    assert _ops(basic).count("Cast") == 2


def test_nan_inf_and_overflow_as_onnxruntime():
    # Mul then Add in float32: 3e4 * 4 overflows float16 but not float32, and the
    # Add brings it back into range before the one rounding at the output
    nodes = [h.make_node("Mul", ["x", "four"], ["m"]), h.make_node("Sub", ["m", "big"], ["d"]),
             h.make_node("Relu", ["d"], ["y"])]
    g = h.make_graph(nodes, "ovf", [h.make_tensor_value_info("x", TP.FLOAT16, [6])],
                     [h.make_tensor_value_info("y", TP.FLOAT16, [6])],
                     [_init("four", np.array(4, F16)), _init("big", np.array(6e4, F16))])
    model = h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=9).SerializeToString()
    x = np.array([3e4, 2e4, np.nan, np.inf, -np.inf, 1.5e4], F16)
    got = _session(model).run(None, {"x": x})[0]
    exp = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_array_equal(got, exp)  # NaN at the same places, same infinities
    assert got[0] == F16(6e4)  # float16 throughout would give inf - 6e4 = inf
    plain = _session(model, disabled=["float16_compute"]).run(None, {"x": x})[0]
    assert np.isinf(plain[0])


def test_keep_io_types_rounding_of_the_input_is_onnxruntimes():
    # a float32 input cast to float16 for a float16 Sigmoid: onnxruntime removes the
    # Cast pair and the Sigmoid reads the float32 input; so does onnxrt
    nodes = [h.make_node("Cast", ["x"], ["x16"], to=TP.FLOAT16), h.make_node("Sigmoid", ["x16"], ["s"]),
             h.make_node("Mul", ["s", "x16"], ["y16"]), h.make_node("Cast", ["y16"], ["y"], to=TP.FLOAT)]
    g = h.make_graph(nodes, "io", [h.make_tensor_value_info("x", TP.FLOAT, [256])],
                     [h.make_tensor_value_info("y", TP.FLOAT, [256])])
    model = h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=9).SerializeToString()
    x = np.random.default_rng(3).standard_normal(256).astype(np.float32) * 3
    sess = _session(model)
    got = sess.run(None, {"x": x})[0]
    exp = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    # no float16 rounding on either side: float32 agreement (the two Sigmoid
    # implementations differ by about 1e-7), where rounding to float16 anywhere
    # would differ by up to 2e-3 at these magnitudes
    np.testing.assert_allclose(got, exp, rtol=1e-6, atol=1e-6)
    plain = _session(model, disabled=["float16_compute"]).run(None, {"x": x})[0]
    assert np.abs(plain - exp).max() > 1e-4
    # Sigmoid and Mul read x itself, in float32; of the Casts only the model's last one
    # remains (its output is a graph output), now a float32 to float32 Cast, as
    # onnxruntime leaves it
    basic = _session(model, level=onnxrt.GraphOptimizationLevel.ORT_ENABLE_BASIC)._built.graph
    assert [(n.op_type, n.attr("to")) for n in basic.nodes] == [("Sigmoid", None), ("Mul", None),
                                                                ("Cast", TP.FLOAT)]
    assert basic.nodes[0].inputs == ["x"] and "x" in basic.nodes[1].inputs
    # at ORT_ENABLE_ALL the float32 x * sigmoid(x) is then fused
    assert _ops(sess) == ["QuickGelu", "Cast"]


def test_if_bodies_are_converted_and_the_if_left_alone():
    def branch(op):
        return h.make_graph([h.make_node(op, ["x"], ["b"]), h.make_node("Relu", ["b"], ["o"])], op,
                            [], [h.make_tensor_value_info("o", TP.FLOAT16, [8])])

    nodes = [h.make_node("If", ["c"], ["y"], then_branch=branch("Sigmoid"), else_branch=branch("Tanh"))]
    g = h.make_graph(nodes, "if", [h.make_tensor_value_info("c", TP.BOOL, []),
                                   h.make_tensor_value_info("x", TP.FLOAT16, [8])],
                     [h.make_tensor_value_info("y", TP.FLOAT16, [8])])
    model = h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=9).SerializeToString()
    sess = _session(model)
    top = sess._built.graph
    assert _ops(sess) == ["If"]
    for body in top.nodes[0].all_subgraphs():
        assert [n.op_type for n in body.nodes] == ["Cast", body.nodes[1].op_type, "Relu", "Cast"]
    x = np.linspace(-3, 3, 8).astype(F16)
    ref = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    for c in (True, False):
        feeds = {"c": np.array(c), "x": x}
        assert _ulps(sess.run(None, feeds)[0], ref.run(None, feeds)[0]) <= ORT_ULPS


def test_clip_between_convolutions_keeps_onnxruntimes_roundings():
    # onnxruntime has a float16 Clip: it rounds the convolution's output, clips in
    # float16 and casts back for the next convolution. onnxrt clips in float32 the
    # same rounded values: Clip of float16 values with float16 bounds is a float16
    # value, so the results are onnxruntime's exactly, and nothing rounds after it
    rng = np.random.default_rng(4)
    nodes = [h.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
             h.make_node("Clip", ["c1", "lo", "hi"], ["r1"]),
             h.make_node("Conv", ["r1", "w2"], ["y"], pads=[1, 1, 1, 1])]
    g = h.make_graph(nodes, "clip", [h.make_tensor_value_info("x", TP.FLOAT16, [1, 4, 16, 16])],
                     [h.make_tensor_value_info("y", TP.FLOAT16, [1, 8, 16, 16])],
                     [_init("w1", (rng.standard_normal((8, 4, 3, 3)) * 0.5).astype(F16)),
                      _init("w2", (rng.standard_normal((8, 8, 3, 3)) * 0.3).astype(F16)),
                      _init("lo", np.array(0, F16)), _init("hi", np.array(6, F16))])
    model = h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=9).SerializeToString()
    sess = _session(model, level=onnxrt.GraphOptimizationLevel.ORT_ENABLE_BASIC)
    graph = sess._built.graph
    by_out = {o: n for n in graph.nodes for o in n.outputs}
    clip = next(n for n in graph.nodes if n.op_type == "Clip")
    assert graph.value_types[clip.outputs[0]].tensor_type.elem_type == TP.FLOAT
    up = by_out[clip.inputs[0]]
    assert up.op_type == "Cast" and up.attr("to") == TP.FLOAT
    assert by_out[up.inputs[0]].op_type == "Cast" and by_out[up.inputs[0]].attr("to") == TP.FLOAT16
    conv2 = next(n for n in graph.nodes if n.op_type == "Conv" and n.inputs[0] == clip.outputs[0])
    assert conv2 is not None
    assert [n.op_type for n in graph.nodes].count("Cast") == 4
    x = (rng.standard_normal((1, 4, 16, 16)) * 3).astype(F16)
    exp = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    for s in (sess, _session(model)):
        assert _ulps(s.run(None, {"x": x})[0], exp) <= ORT_ULPS


def test_a_cast_an_if_body_reads_stays():
    # the model's Cast(to=float) of a converted Sigmoid is read inside an If branch:
    # the Cast pair cannot be removed there, the branch reading the Cast's name
    then = h.make_graph([h.make_node("Neg", ["s32"], ["o"])], "then", [],
                        [h.make_tensor_value_info("o", TP.FLOAT, [8])])
    els = h.make_graph([h.make_node("Abs", ["s32"], ["o2"])], "else", [],
                       [h.make_tensor_value_info("o2", TP.FLOAT, [8])])
    nodes = [h.make_node("Sigmoid", ["x"], ["s"]), h.make_node("Cast", ["s"], ["s32"], to=TP.FLOAT),
             h.make_node("If", ["c"], ["y"], then_branch=then, else_branch=els)]
    g = h.make_graph(nodes, "if_reads", [h.make_tensor_value_info("c", TP.BOOL, []),
                                         h.make_tensor_value_info("x", TP.FLOAT16, [8])],
                     [h.make_tensor_value_info("y", TP.FLOAT, [8])])
    model = h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=9).SerializeToString()
    sess = _session(model)
    assert "s32" in {o for n in sess._built.graph.nodes for o in n.outputs}
    x = np.linspace(-4, 4, 8).astype(F16)
    ref = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    for c in (True, False):
        feeds = {"c": np.array(c), "x": x}
        np.testing.assert_allclose(sess.run(None, feeds)[0], ref.run(None, feeds)[0], rtol=0, atol=1e-3)


def test_an_initializer_two_converted_nodes_read():
    # the 6 of a hard-sigmoid read by both Clip and Div: one float32 copy, and the
    # float16 original dropped once (the transform raised KeyError dropping it twice)
    nodes = [h.make_node("Clip", ["x", "zero", "six"], ["c"]), h.make_node("Div", ["c", "six"], ["y"])]
    g = h.make_graph(nodes, "shared", [h.make_tensor_value_info("x", TP.FLOAT16, [2, 3])],
                     [h.make_tensor_value_info("y", TP.FLOAT16, [2, 3])],
                     [_init("six", np.array(6, F16)), _init("zero", np.array(0, F16))])
    model = h.make_model(g, opset_imports=[h.make_opsetid("", 13)], ir_version=9).SerializeToString()
    x = np.array([[-5, -2, 1], [4, 7, 10]], F16)
    sess = _session(model)
    assert "six" not in sess._built.graph.initializers
    got = sess.run(None, {"x": x})[0]
    exp = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_array_equal(got, exp)
