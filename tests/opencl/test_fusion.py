"""Elementwise fusion: convex groups, one generated kernel launch per group, same answers.

Launches are counted by the runtime (``CLRuntime.launches``), so these tests see how
many kernels really ran on the device.
"""

import numpy as np
import pytest
from onnx import TensorProto, helper

import onnxrt as ort

from ..conftest import make_model

pytest.importorskip("onnxrt_opencl")
from onnxrt_opencl import OpenCLExecutionProvider  # noqa: E402

REASON = OpenCLExecutionProvider.is_available()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"OpenCL unavailable: {REASON}")
OCL = "OpenCLExecutionProvider"
F = TensorProto.FLOAT
UNARY = ["Relu", "Sigmoid", "Tanh", "Neg", "Abs", "Softsign", "Exp", "Erf", "HardSwish", "Softplus"]


def _session(model, fusion=True, level=ort.GraphOptimizationLevel.ORT_ENABLE_ALL):
    so = ort.SessionOptions()
    so.graph_optimization_level = level
    return ort.InferenceSession(model.SerializeToString(), so,
                                providers=[(OCL, {"enable_fusion": fusion}), "CPUExecutionProvider"])


def _launches(sess, feeds):
    rt = sess._built.providers[0].runtime
    before = rt.launches.count
    out = sess.run(None, feeds)
    return out, rt.launches.count - before


def _chains_model(n_chains=3, length=12):
    """``n_chains`` elementwise chains of ``length`` nodes over broadcast inputs, then summed."""
    nodes, outs = [], []
    for c in range(n_chains):
        prev = "x"
        for k in range(length):
            out = f"c{c}_{k}"
            if k % 3 == 1:
                nodes.append(helper.make_node("Mul", [prev, "s"], [out]))
            elif k % 3 == 2:
                nodes.append(helper.make_node("Add", [prev, "b"], [out]))
            else:
                nodes.append(helper.make_node(UNARY[(c + k) % len(UNARY)], [prev], [out]))
            prev = out
        outs.append(prev)
    nodes.append(helper.make_node("Sum", outs, ["y"]))
    return make_model(
        nodes,
        [helper.make_tensor_value_info("x", F, ["N", 8, 16]), helper.make_tensor_value_info("s", F, [16]),
         helper.make_tensor_value_info("b", F, [8, 1])],
        [helper.make_tensor_value_info("y", F, ["N", 8, 16])],
    )


def _feeds(rng, n=2):
    return {"x": rng.standard_normal((n, 8, 16)).astype(np.float32),
            "s": rng.uniform(0.5, 1.5, 16).astype(np.float32),
            "b": rng.uniform(-0.5, 0.5, (8, 1)).astype(np.float32)}


def _cpu(model, feeds):
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


@pytest.mark.parametrize("level", [ort.GraphOptimizationLevel.ORT_DISABLE_ALL, ort.GraphOptimizationLevel.ORT_ENABLE_ALL])
def test_a_long_chain_model_launches_one_kernel(level):
    model = _chains_model()
    n_nodes = len(model.graph.node)
    feeds = _feeds(np.random.default_rng(0))
    sess = _session(model, level=level)
    assert all(a["provider"] == OCL for a in sess.get_provider_assignment())
    groups = sess.get_fused_groups()
    assert len(groups) == 1 and len(groups[0]["nodes"]) == n_nodes == 37
    sess.run(None, feeds)  # compile
    (y,), launches = _launches(sess, feeds)
    assert launches == 1 < n_nodes
    np.testing.assert_allclose(y, _cpu(model, feeds)[0], rtol=1e-5, atol=1e-5)


def test_without_fusion_every_node_is_a_launch_and_the_answers_agree():
    model = _chains_model(2, 6)
    feeds = _feeds(np.random.default_rng(1), n=3)
    fused, plain = _session(model, True), _session(model, False)
    assert plain.get_fused_groups() == []
    fused.run(None, feeds)
    plain.run(None, feeds)
    (a,), n_fused = _launches(fused, feeds)
    (b,), n_plain = _launches(plain, feeds)
    assert n_plain == len(model.graph.node) == 13 and n_fused == 1
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(a, _cpu(model, feeds)[0], rtol=1e-5, atol=1e-5)


def test_groups_stay_convex_around_a_cpu_node():
    # a -> CumSum (CPU) -> c, and c also reads a: {a, c} fused would need CumSum's result
    # before running, so a and c must land in different groups
    nodes = [
        helper.make_node("Relu", ["x"], ["a"]),
        helper.make_node("Sigmoid", ["a"], ["a2"]),
        helper.make_node("CumSum", ["a2", "axis"], ["cs"]),
        helper.make_node("Add", ["cs", "a"], ["c"]),
        helper.make_node("Tanh", ["c"], ["y"]),
    ]
    model = make_model(nodes, [helper.make_tensor_value_info("x", F, [4, 5])],
                       [helper.make_tensor_value_info("y", F, [4, 5])],
                       [helper.make_tensor("axis", TensorProto.INT64, [], [1])])
    sess = _session(model)
    where = {a["node"]: a["provider"] for a in sess.get_provider_assignment()}
    assert where["CumSum_2"] == "CPUExecutionProvider"
    groups = [set(g["nodes"]) for g in sess.get_fused_groups()]
    assert {"Relu_0", "Sigmoid_1"} in groups and {"Add_3", "Tanh_4"} in groups
    x = np.random.default_rng(2).standard_normal((4, 5)).astype(np.float32)
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], _cpu(model, {"x": x})[0], rtol=1e-5, atol=1e-6)


def test_intermediates_used_outside_and_smaller_outputs_are_written():
    # 'r' has shape [1, 16] but the group iterates over [8, 16]; it is also a graph output
    nodes = [
        helper.make_node("Relu", ["v"], ["r"]),
        helper.make_node("Add", ["r", "m"], ["s"]),
        helper.make_node("Mul", ["s", "r"], ["t"]),
        helper.make_node("Greater", ["t", "r"], ["g"]),
        helper.make_node("Where", ["g", "t", "m"], ["y"]),
    ]
    model = make_model(nodes, [helper.make_tensor_value_info("v", F, [1, 16]), helper.make_tensor_value_info("m", F, [8, 1])],
                       [helper.make_tensor_value_info("y", F, None), helper.make_tensor_value_info("r", F, None),
                        helper.make_tensor_value_info("g", TensorProto.BOOL, None)])
    sess = _session(model)
    assert len(sess.get_fused_groups()) == 1
    rng = np.random.default_rng(3)
    feeds = {"v": rng.standard_normal((1, 16)).astype(np.float32), "m": rng.standard_normal((8, 1)).astype(np.float32)}
    got, want = sess.run(None, feeds), _cpu(model, feeds)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=1e-6)


_BINARY = ["Add", "Sub", "Mul", "Max", "Min"]


def _random_graph(rng, n_nodes):
    """A random DAG of elementwise nodes over inputs of broadcast-compatible shapes."""
    shapes = {"x0": [2, 3, 4], "x1": [3, 1], "x2": [1], "x3": [2, 1, 4]}
    vals = list(shapes)
    nodes = []
    for k in range(n_nodes):
        out = f"v{k}"
        if rng.random() < 0.4:
            nodes.append(helper.make_node(str(rng.choice(UNARY[:6])), [str(rng.choice(vals))], [out]))
        else:
            a, b = rng.choice(vals, 2)
            nodes.append(helper.make_node(str(rng.choice(_BINARY)), [str(a), str(b)], [out]))
        vals.append(out)
    outputs = [helper.make_tensor_value_info(v, F, None) for v in vals[-3:]]
    inputs = [helper.make_tensor_value_info(n, F, s) for n, s in shapes.items()]
    return make_model(nodes, inputs, outputs), shapes


@pytest.mark.parametrize("seed", range(6))
def test_random_elementwise_graphs_match_the_cpu(seed):
    rng = np.random.default_rng(seed)
    model, shapes = _random_graph(rng, 14)
    feeds = {n: rng.standard_normal(s).astype(np.float32) for n, s in shapes.items()}
    sess = _session(model, level=ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    (got, launches) = _launches(sess, feeds)
    assert launches < len(model.graph.node)
    for g, w in zip(got, _cpu(model, feeds)):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def test_generated_sources_are_shared_across_sizes():
    from onnxrt_opencl.runtime import get_runtime

    model = _chains_model(1, 5)
    sess = _session(model)
    rt = get_runtime()
    rng = np.random.default_rng(4)
    sess.run(None, _feeds(rng, 2))
    n_programs = len(rt._programs)
    for n in (3, 5, 7):
        y = sess.run(None, _feeds(rng, n))[0]
        assert y.shape == (n, 8, 16)
    assert len(rt._programs) == n_programs


def test_empty_and_scalar_values():
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Add", ["a", "c"], ["y"])]
    model = make_model(nodes, [helper.make_tensor_value_info("x", F, None), helper.make_tensor_value_info("c", F, [])],
                       [helper.make_tensor_value_info("y", F, None)])
    sess = _session(model)
    for shape in [(), (0,), (3, 0, 2), (5,)]:
        x = np.asarray(np.random.default_rng(5).standard_normal(shape), dtype=np.float32)
        c = np.asarray(0.5, np.float32)
        (y,) = sess.run(None, {"x": x, "c": c})
        assert y.shape == shape
        np.testing.assert_allclose(y, np.maximum(x, 0) + c, rtol=1e-6)


def test_mixed_dtype_chains_cast_and_compare():
    nodes = [
        helper.make_node("Cast", ["i"], ["f"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["f", "x"], ["p"]),
        helper.make_node("Less", ["p", "x"], ["l"]),
        helper.make_node("Not", ["l"], ["nl"]),
        helper.make_node("Cast", ["nl"], ["y"], to=TensorProto.INT64),
        helper.make_node("Clip", ["p", "lo", "hi"], ["z"]),
    ]
    model = make_model(nodes, [helper.make_tensor_value_info("i", TensorProto.INT32, [6]),
                               helper.make_tensor_value_info("x", F, [6])],
                       [helper.make_tensor_value_info("y", TensorProto.INT64, [6]), helper.make_tensor_value_info("z", F, [6])],
                       [helper.make_tensor("lo", F, [], [-1.0]), helper.make_tensor("hi", F, [], [2.0])])
    sess = _session(model)
    assert len(sess.get_fused_groups()) == 1
    feeds = {"i": np.array([-3, -1, 0, 1, 2, 5], np.int32), "x": np.array([0.5, -2, 3, 1, -1, 0.25], np.float32)}
    for g, w in zip(sess.run(None, feeds), _cpu(model, feeds)):
        assert g.dtype == w.dtype
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("inputs", [["x"], ["x", "lo"], ["x", "", "hi"]], ids=["none", "min only", "max only"])
def test_clip_with_omitted_bounds_clamps_infinities_like_the_cpu_provider(inputs):
    """An omitted Clip bound is the type's finite limit (the spec's numeric_limits), on
    the device as on the CPU provider: infinities are clamped, NaN passes through."""
    from ..cpu.test_clip import clip_model

    model = clip_model(F, inputs)
    x = np.array([-np.inf, np.inf, np.nan, 0.5, -3.0], np.float32)
    so = ort.SessionOptions()
    got = ort.InferenceSession(model, so, providers=[OCL, "CPUExecutionProvider"]).run(None, {"x": x})[0]
    cpu = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_array_equal(got, cpu)
    assert np.isfinite(got[:2]).all()
