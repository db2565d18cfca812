"""Level-2 transformer fusions: Gelu, FastGelu, BiasGelu, LayerNormalization,
SimplifiedLayerNormalization and SkipLayerNormalization."""

import io
import math
import warnings

import numpy as np
import onnx
import pytest
from onnx import helper

from .util import assert_same_outputs, f32, model, ops, session, vi

X = [vi("x", ["b", 4, 16])]
FEEDS = {"x": f32(2, 4, 16, seed=1, scale=2.0)}
N = helper.make_node


def gelu_nodes(order: str, scale_op: str = "Div"):
    """x * 0.5 * (1 + erf(x / sqrt 2)) with the final products in ``order``."""
    nodes = [N(scale_op, ["x", "k"], ["d"]), N("Erf", ["d"], ["e"]), N("Add", ["e", "one"], ["p"])]
    if order == "x_first":
        nodes += [N("Mul", ["x", "p"], ["m"]), N("Mul", ["m", "half"], ["y"])]
    elif order == "half_first":
        nodes += [N("Mul", ["half", "p"], ["m"]), N("Mul", ["x", "m"], ["y"])]
    else:
        nodes += [N("Mul", ["x", "half"], ["m"]), N("Mul", ["m", "p"], ["y"])]
    k = math.sqrt(2.0) if scale_op == "Div" else 1 / math.sqrt(2.0)
    return nodes, {"k": np.float32(k), "one": np.float32(1.0), "half": np.float32(0.5)}


@pytest.mark.parametrize("order", ["x_first", "half_first", "x_half_first"])
@pytest.mark.parametrize("scale_op", ["Div", "Mul"])
def test_erf_gelu_becomes_gelu(order, scale_op):
    nodes, inits = gelu_nodes(order, scale_op)
    m = model(nodes, X, [vi("y", None)], inits)
    sess = assert_same_outputs(m, FEEDS)
    assert ops(sess) == {"com.microsoft:Gelu": 1}
    assert ops(session(m, disabled=["gelu_fusion"]))["Erf"] == 1


def test_gelu_with_a_wrong_constant_is_not_fused():
    nodes, inits = gelu_nodes("x_first")
    inits["half"] = np.float32(0.6)
    assert ops(assert_same_outputs(model(nodes, X, [vi("y", None)], inits), FEEDS))["Erf"] == 1


def test_gelu_whose_inner_value_is_a_graph_output_is_not_fused():
    nodes, inits = gelu_nodes("x_first")
    m = model(nodes, X, [vi("y", None), vi("e", None)], inits)
    assert ops(assert_same_outputs(m, FEEDS))["Erf"] == 1


@pytest.mark.parametrize("mul_order", ["x_sig", "sig_x"])
@pytest.mark.parametrize("alpha", [None, 1.702, 0.8])
def test_x_times_sigmoid_becomes_quick_gelu(alpha, mul_order, tmp_path):
    """SiLU (x * sigmoid(x)) and x * sigmoid(alpha * x) -> QuickGelu, which onnxruntime
    also runs: the optimized model loads there and gives the same values."""
    nodes, inits = [], {}
    inner = "x"
    if alpha is not None:
        nodes.append(N("Mul", ["a", "x"], ["s"]))
        inits["a"] = np.float32(alpha)
        inner = "s"
    nodes.append(N("Sigmoid", [inner], ["g"]))
    nodes.append(N("Mul", ["x", "g"] if mul_order == "x_sig" else ["g", "x"], ["y"]))
    m = model(nodes, X, [vi("y", None)], inits)
    sess = assert_same_outputs(m, FEEDS)
    assert ops(sess) == {"com.microsoft:QuickGelu": 1}
    assert ops(session(m, disabled=["quick_gelu_fusion"]))["Sigmoid"] == 1
    rt = pytest.importorskip("onnxruntime")
    saved = tmp_path / "quick.onnx"
    session(m, save=saved)
    assert {n.op_type for n in onnx.load(str(saved)).graph.node} == {"QuickGelu"}
    want = rt.InferenceSession(str(saved), providers=["CPUExecutionProvider"]).run(None, FEEDS)[0]
    np.testing.assert_allclose(sess.run(None, FEEDS)[0], want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("case", ["sigmoid_read_twice", "other_operand", "non_scalar_alpha"])
def test_sigmoid_products_that_are_not_quick_gelu_stay(case):
    inits = {}
    if case == "sigmoid_read_twice":
        nodes = [N("Sigmoid", ["x"], ["g"]), N("Mul", ["x", "g"], ["y"])]
        outs = [vi("y", None), vi("g", None)]
    elif case == "other_operand":
        nodes = [N("Sigmoid", ["x"], ["g"]), N("Neg", ["x"], ["n"]), N("Mul", ["n", "g"], ["y"])]
        outs = [vi("y", None)]
    else:
        nodes = [N("Mul", ["a", "x"], ["s"]), N("Sigmoid", ["s"], ["g"]), N("Mul", ["x", "g"], ["y"])]
        inits["a"] = f32(16, seed=4)
        outs = [vi("y", None)]
    sess = assert_same_outputs(model(nodes, X, outs, inits), FEEDS)
    assert ops(sess)["Sigmoid"] == 1


def test_bias_then_gelu_becomes_bias_gelu():
    nodes, inits = gelu_nodes("x_first")
    nodes = [N("Add", ["bias", "a"], ["x"])] + nodes
    inits["bias"] = f32(16, seed=3)
    m = model(nodes, [vi("a", ["b", 4, 16])], [vi("y", None)], inits)
    sess = assert_same_outputs(m, {"a": FEEDS["x"]})
    assert ops(sess) == {"com.microsoft:BiasGelu": 1}
    assert ops(session(m, disabled=["bias_gelu_fusion"])) == {"Add": 1, "com.microsoft:Gelu": 1}


def test_bias_that_broadcasts_over_more_than_the_last_axis_stays_an_add():
    nodes, inits = gelu_nodes("x_first")
    nodes = [N("Add", ["bias", "a"], ["x"])] + nodes
    inits["bias"] = f32(4, 16, seed=3)
    m = model(nodes, [vi("a", ["b", 4, 16])], [vi("y", None)], inits)
    assert ops(assert_same_outputs(m, {"a": FEEDS["x"]})) == {"Add": 1, "com.microsoft:Gelu": 1}


def layer_norm_nodes(square="Pow", beta=True):
    nodes = [N("ReduceMean", ["x"], ["mu"], axes=[-1]), N("Sub", ["x", "mu"], ["d"])]
    nodes.append(N("Pow", ["d", "two"], ["sq"]) if square == "Pow" else N("Mul", ["d", "d"], ["sq"]))
    nodes += [N("ReduceMean", ["sq"], ["var"], axes=[-1]), N("Add", ["var", "eps"], ["ve"]),
              N("Sqrt", ["ve"], ["sd"]), N("Div", ["d", "sd"], ["n"]), N("Mul", ["n", "gamma"], ["g" if beta else "y"])]
    if beta:
        nodes.append(N("Add", ["beta", "g"], ["y"]))
    inits = {"two": np.float32(2), "eps": np.float32(1e-5), "gamma": f32(16, seed=4), "beta": f32(16, seed=5)}
    return nodes, inits


@pytest.mark.parametrize("square", ["Pow", "Mul"])
@pytest.mark.parametrize("beta", [True, False])
def test_decomposed_layer_norm_becomes_layer_normalization(square, beta):
    nodes, inits = layer_norm_nodes(square, beta)
    m = model(nodes, X, [vi("y", None)], inits)
    sess = assert_same_outputs(m, FEEDS, atol=1e-5)
    assert ops(sess) == {"LayerNormalization": 1}
    ln = sess._built.graph.nodes[0]
    assert len(ln.inputs) == (3 if beta else 2) and abs(ln.attr("epsilon") - 1e-5) < 1e-9
    assert "LayerNormalization" not in ops(session(m, disabled=["layer_norm_fusion"]))


def test_layer_norm_over_another_axis_is_not_fused():
    nodes, inits = layer_norm_nodes()
    nodes[0] = N("ReduceMean", ["x"], ["mu"], axes=[1])
    m = model(nodes, X, [vi("y", None)], inits)
    got = ops(assert_same_outputs(m, FEEDS, atol=1e-5))
    assert "LayerNormalization" not in got and got["ReduceMean"] >= 1


def test_layer_norm_before_opset_17_is_fused_and_saved_as_onnxruntime_reads_it(tmp_path):
    # onnxruntime defines LayerNormalization in the default domain before opset 17 and
    # fuses the decomposed form there too (openWakeWord's opset-13 heads)
    rt = pytest.importorskip("onnxruntime")
    nodes, inits = layer_norm_nodes()
    m = model(nodes, X, [vi("y", None)], inits, opset=13)
    out = tmp_path / "opt.onnx"
    sess = session(m, save=out)
    assert ops(sess) == {"LayerNormalization": 1}
    assert ops(assert_same_outputs(m, FEEDS, atol=1e-5)) == {"LayerNormalization": 1}
    got = rt.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(None, FEEDS)[0]
    np.testing.assert_allclose(got, sess.run(None, FEEDS)[0], rtol=1e-5, atol=1e-5)


def test_layer_norm_opset_18_reads_axes_from_an_input():
    nodes, inits = layer_norm_nodes()
    nodes[0] = N("ReduceMean", ["x", "ax"], ["mu"])
    nodes[3] = N("ReduceMean", ["sq", "ax"], ["var"])
    inits["ax"] = np.array([-1], np.int64)
    m = model(nodes, X, [vi("y", None)], inits, opset=18)
    assert ops(assert_same_outputs(m, FEEDS, atol=1e-5)) == {"LayerNormalization": 1}


def rms_nodes(form):
    nodes = [N("Pow", ["x", "two"], ["sq"]), N("ReduceMean", ["sq"], ["ms"], axes=[-1]),
             N("Add", ["ms", "eps"], ["me"]), N("Sqrt", ["me"], ["rt"])]
    if form == "div":
        nodes.append(N("Div", ["x", "rt"], ["n"]))
    elif form == "reciprocal":
        nodes += [N("Reciprocal", ["rt"], ["r"]), N("Mul", ["x", "r"], ["n"])]
    else:
        nodes += [N("Div", ["one", "rt"], ["r"]), N("Mul", ["r", "x"], ["n"])]
    nodes.append(N("Mul", ["gamma", "n"], ["y"]))
    return nodes, {"two": np.float32(2), "eps": np.float32(1e-6), "one": np.float32(1), "gamma": f32(16, seed=4)}


@pytest.mark.parametrize("form", ["div", "reciprocal", "one_over"])
def test_rms_norm_becomes_simplified_layer_normalization(form):
    nodes, inits = rms_nodes(form)
    m = model(nodes, X, [vi("y", None)], inits)
    sess = assert_same_outputs(m, FEEDS, atol=1e-5)
    assert ops(sess) == {"SimplifiedLayerNormalization": 1}
    assert ops(session(m, disabled=["simplified_layer_norm_fusion"]))["ReduceMean"] == 1


def skip_ln_model(b_shape, extra_outputs=()):
    nodes = [N("Add", ["a", "r"], ["s"]), N("LayerNormalization", ["s", "gamma", "beta"], ["y"], axis=-1,
                                            epsilon=1e-6)]
    return model(nodes, [vi("a", ["b", 4, 16]), vi("r", b_shape)], [vi("y", None)] + [vi(o, None) for o in extra_outputs],
                 {"gamma": f32(16, seed=4), "beta": f32(16, seed=5)})


def test_add_then_layer_norm_becomes_skip_layer_normalization():
    feeds = {"a": f32(2, 4, 16), "r": f32(2, 4, 16, seed=3)}
    m = skip_ln_model(["b", 4, 16])
    sess = assert_same_outputs(m, feeds, atol=1e-5)
    assert ops(sess) == {"com.microsoft:SkipLayerNormalization": 1}
    assert ops(session(m, disabled=["skip_layer_norm_fusion"])) == {"Add": 1, "LayerNormalization": 1}
    # the sum is also an output: it comes out of SkipLayerNormalization's fourth output
    m = skip_ln_model(["b", 4, 16], extra_outputs=["s"])
    sess = assert_same_outputs(m, feeds, atol=1e-5)
    assert ops(sess) == {"com.microsoft:SkipLayerNormalization": 1}
    assert sess._built.graph.nodes[0].outputs == ["y", "", "", "s"]


@pytest.mark.parametrize("b_shape", [[1, 4, 16], ["c", 4, 16], [16]])
def test_add_that_may_broadcast_is_not_fused_into_skip_layer_norm(b_shape):
    m = skip_ln_model(b_shape)
    feeds = {"a": f32(2, 4, 16), "r": f32(*[2 if d == "c" else d for d in b_shape], seed=3)}
    assert ops(assert_same_outputs(m, feeds, atol=1e-5)) == {"Add": 1, "LayerNormalization": 1}


@pytest.fixture(scope="module")
def torch_block():
    """A torch-exported block: Linear, tanh Gelu, a hand-written LayerNorm, an RMSNorm."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 16)
            self.w = torch.nn.Parameter(torch.randn(16))
            self.b = torch.nn.Parameter(torch.randn(16))

        def forward(self, x):
            h = torch.nn.functional.gelu(self.lin(x), approximate="tanh")
            d = h - h.mean(-1, keepdim=True)
            n = d / torch.sqrt(d.pow(2).mean(-1, keepdim=True) + 1e-5) * self.w + self.b
            return n * torch.rsqrt(n.pow(2).mean(-1, keepdim=True) + 1e-6) * self.w

    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # the TorchScript exporter is deprecated
        torch.onnx.export(Block(), (torch.randn(2, 3, 8),), buf, opset_version=17, dynamo=False,
                          input_names=["x"], output_names=["y"], dynamic_axes={"x": {0: "batch"}})
    m = onnx.load_from_string(buf.getvalue())
    m.ir_version = 10
    return m


def test_torch_exported_patterns_fuse(torch_block):
    sess = assert_same_outputs(torch_block, {"x": f32(2, 3, 8, seed=2)}, atol=1e-5)
    assert ops(sess) == {"MatMul": 1, "com.microsoft:FastGelu": 1, "LayerNormalization": 1,
                         "SimplifiedLayerNormalization": 1}
    fast = next(n for n in sess._built.graph.nodes if n.op_type == "FastGelu")
    assert len(fast.inputs) == 2  # the Linear's bias went into FastGelu
    assert ops(session(torch_block, disabled=["fast_gelu_fusion"]))["Tanh"] == 1


def test_saved_rms_norm_runs_in_onnxruntime(tmp_path):
    """SimplifiedLayerNormalization is saved in the default domain, where onnxruntime defines it."""
    rt = pytest.importorskip("onnxruntime")
    nodes, inits = rms_nodes("reciprocal")
    m = model(nodes, X, [vi("y", None)], inits)
    out = tmp_path / "opt.onnx"
    sess = session(m, save=out)
    assert [n.op_type for n in onnx.load(out).graph.node] == ["SimplifiedLayerNormalization"]
    got = rt.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(None, FEEDS)[0]
    np.testing.assert_allclose(got, sess.run(None, FEEDS)[0], rtol=1e-5, atol=1e-5)
