"""The compiled convolutions' fused LeakyRelu, HardSigmoid and HardSwish (ONNX's, and
PaddlePaddle's spelled-out ``Div(Mul(c, Clip(Add(c, 3), 0, 6)), 6)``), and 1-D
convolutions along one-column planes (``[N, C, H, 1]`` by a ``k x 1`` kernel).

Each activation is fused into FusedConv by the optimizer and applied by every compiled
kernel (1x1 products, im2col tiles, the direct kernel, Winograd, both depthwise
layouts) to its tiles: the numpy activation never runs. Results are checked against
onnxruntime, which runs the same graph (fusing LeakyRelu and HardSigmoid itself, and
HardSwish as its own node), against the numpy paths, and for float64 against the
onnx reference evaluator.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import onnxrt as ort
from onnxrt_cpu import native
from onnxrt_cpu.kernels import contrib_fused
from tests.cpu.conv_cases import Counting, needs_native

rt = pytest.importorskip("onnxruntime")

#: (activation, its attributes); QuickGelu is com.microsoft's
ACTS = [("LeakyRelu", {"alpha": 0.1}), ("HardSigmoid", {"alpha": 0.3, "beta": 0.4}), ("HardSwish", {}),
        ("Sigmoid", {}), ("QuickGelu", {"alpha": 1.0}), ("QuickGelu", {})]
ACT_IDS = ["LeakyRelu", "HardSigmoid", "HardSwish", "Sigmoid", "SiLU", "QuickGelu"]

#: (input shape, weight shape, Conv attributes, the compiled function that takes it)
LAYERS = [
    ((1, 16, 28, 28), (40, 16, 1, 1), {}, "conv2d"),
    ((1, 8, 40, 37), (16, 8, 3, 3), {"pads": [1, 0, 2, 1]}, "direct2d"),
    ((1, 32, 20, 64), (64, 32, 3, 3), {"pads": [1, 1, 1, 1], "dilations": [2, 1]}, "direct2d"),
    ((1, 48, 20, 20), (40, 48, 3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1]}, "conv2d"),
    ((1, 64, 14, 14), (64, 64, 3, 3), {"pads": [1, 1, 1, 1]}, "winograd3x3"),
    ((1, 32, 40, 40), (32, 1, 3, 3), {"group": 32, "pads": [1, 1, 1, 1]}, "depthwise2d"),
    ((2, 40, 14, 14), (40, 1, 3, 3), {"group": 40, "pads": [1, 1, 1, 1]}, "depthwise2d"),
]


def _model(x_shape, w_shape, attrs, act=None, act_attrs=None, dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    et = TensorProto.FLOAT if dtype == np.float32 else TensorProto.DOUBLE
    w = (rng.standard_normal(w_shape) / np.sqrt(np.prod(w_shape[1:]))).astype(dtype)
    b = (0.5 * rng.standard_normal(w_shape[0])).astype(dtype)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c" if act else "y"], **attrs)]
    if act:
        domain = "com.microsoft" if act == "QuickGelu" else ""
        nodes.append(helper.make_node(act, ["c"], ["y"], domain=domain, **(act_attrs or {})))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", et, list(x_shape))],
                              [helper.make_tensor_value_info("y", et, None)],
                              [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=9).SerializeToString()


def _session(model, threads):
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])


def _onnxruntime(model, feeds):
    return rt.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)[0]


@pytest.fixture
def no_numpy_activation(monkeypatch):
    """FusedConv's numpy activation made to fail: a test that passes with it applied
    its activation in the compiled kernel's epilogue."""

    def refuse(name, x, params):
        raise AssertionError(f"the numpy {name} ran on a FusedConv output")

    monkeypatch.setattr(contrib_fused, "apply_activation", refuse)


@needs_native
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("act, act_attrs", ACTS, ids=ACT_IDS)
@pytest.mark.parametrize("x_shape, w_shape, attrs, kernel", LAYERS, ids=[f"{k}-{i}" for i, (*_, k) in enumerate(LAYERS)])
def test_activation_in_the_compiled_epilogue_matches_onnxruntime(x_shape, w_shape, attrs, kernel, act, act_attrs,
                                                                 threads, monkeypatch, no_numpy_activation):
    model = _model(x_shape, w_shape, attrs, act, act_attrs)
    feeds = {"x": np.random.default_rng(1).standard_normal(x_shape).astype(np.float32)}
    sess = _session(model, threads)
    node, = sess._built.graph.nodes
    assert node.op_type == "FusedConv" and node.attr("activation") == act
    counting = Counting(native.K)
    monkeypatch.setattr(native, "K", counting)
    got = sess.run(None, feeds)[0]
    assert counting.calls == {kernel: 1}
    want = _onnxruntime(model, feeds)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # the activation did something: negative inputs were scaled, or clipped to 0 and 1
    if act == "LeakyRelu":
        assert (want < 0).any()
    elif act == "HardSigmoid":
        assert (want == 0).any() and (want == 1).any()
    elif act == "Sigmoid":
        assert ((want > 0) & (want < 1)).all()
    elif act == "QuickGelu":
        assert (want < 0).any() and want.min() > -0.3
    else:
        assert (want == 0).any() and (want < 0).any()


@needs_native
@pytest.mark.parametrize("act, act_attrs", ACTS[3:], ids=ACT_IDS[3:])
def test_sigmoid_and_quick_gelu_in_the_epilogue_agree_with_the_unfused_nodes(act, act_attrs):
    """The epilogue's sigmoid is the compiled elementwise kernels' (vmath.h's exp, within
    1-2 ulp of numpy's, which the Sigmoid node uses): the fused convolution gives the
    values of Conv followed by the Sigmoid or QuickGelu node to a few ulp."""
    for x_shape, w_shape, attrs, _ in LAYERS:
        model = _model(x_shape, w_shape, attrs, act, act_attrs)
        feeds = {"x": np.random.default_rng(10).standard_normal(x_shape).astype(np.float32)}
        got = _session(model, 2).run(None, feeds)[0]
        np.testing.assert_allclose(got, _unfused(model).run(None, feeds)[0], rtol=5e-7, atol=1e-7)


@needs_native
@pytest.mark.parametrize("act, act_attrs", ACTS, ids=ACT_IDS)
def test_activation_in_the_epilogue_equals_the_numpy_paths(act, act_attrs, monkeypatch):
    """The compiled epilogue against the numpy paths (the activation applied by numpy
    after the products), layer by layer."""
    for x_shape, w_shape, attrs, _ in LAYERS:
        model = _model(x_shape, w_shape, attrs, act, act_attrs)
        feeds = {"x": np.random.default_rng(2).standard_normal(x_shape).astype(np.float32)}
        got = _session(model, 2).run(None, feeds)[0]
        with monkeypatch.context() as m:
            m.setattr(native, "K", None)
            numpy_path = _session(model, 2).run(None, feeds)[0]
        np.testing.assert_allclose(got, numpy_path, rtol=1e-5, atol=1e-5)


@needs_native
@pytest.mark.parametrize("act, act_attrs", ACTS, ids=ACT_IDS)
def test_float64_activations_match_the_reference_evaluator(act, act_attrs, no_numpy_activation):
    for x_shape, w_shape, attrs, kernel in LAYERS:
        if kernel in ("direct2d", "winograd3x3"):
            continue  # float32 kernels: float64 takes im2col
        model = _model(x_shape, w_shape, attrs, act, act_attrs, dtype=np.float64)
        feeds = {"x": np.random.default_rng(3).standard_normal(x_shape)}
        got = _session(model, 2).run(None, feeds)[0]
        assert got.dtype == np.float64
        if act == "HardSwish":
            # the reference expands HardSwish into its function body, whose alpha is a
            # float32 attribute; onnxrt's HardSwish, fused or not, takes 1/6 in float64
            c = ReferenceEvaluator(_model(x_shape, w_shape, attrs, dtype=np.float64)).run(None, feeds)[0]
            want = c * np.clip(c / 6 + 0.5, 0, 1)
        elif act == "QuickGelu":  # com.microsoft's, which the reference does not know
            # alpha travels as FusedConv's activation_params, a float32 attribute
            c = ReferenceEvaluator(_model(x_shape, w_shape, attrs, dtype=np.float64)).run(None, feeds)[0]
            want = c / (1 + np.exp(-float(np.float32(act_attrs.get("alpha", 1.702))) * c))
        else:
            want = ReferenceEvaluator(model).run(None, feeds)[0]
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


@needs_native
@pytest.mark.parametrize("act, act_attrs", ACTS, ids=ACT_IDS)
def test_nan_and_infinity_through_the_new_activations(act, act_attrs, no_numpy_activation):
    """NaN stays NaN (LeakyRelu's NaN * alpha, the clips' comparisons), and the
    infinities go where the formulas send them, as in numpy."""
    x_shape, w_shape, attrs = (1, 4, 6, 6), (4, 1, 3, 3), {"group": 4, "pads": [1, 1, 1, 1]}
    model = _model(x_shape, w_shape, attrs, act, act_attrs)
    x = np.random.default_rng(0).standard_normal(x_shape).astype(np.float32)
    x[0, 0, 2, 2] = np.nan
    x[0, 1, 3, 3] = np.inf
    x[0, 2, 1, 1] = -np.inf
    with np.errstate(invalid="ignore"):
        # onnxruntime for com.microsoft's QuickGelu, which the reference does not know
        want = _onnxruntime(model, {"x": x}) if act == "QuickGelu" else ReferenceEvaluator(model).run(None, {"x": x})[0]
        got = _session(model, 1).run(None, {"x": x})[0]
    assert np.isnan(want).any()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_hard_swish_is_fused_only_where_the_provider_takes_it():
    """A Conv followed by HardSwish becomes one FusedConv on the CPU provider; with the
    fusion disabled, the two nodes stay."""
    model = _model((1, 8, 10, 10), (8, 8, 3, 3), {"pads": [1, 1, 1, 1]}, "HardSwish")
    feeds = {"x": np.random.default_rng(4).standard_normal((1, 8, 10, 10)).astype(np.float32)}
    so = ort.SessionOptions()
    # HardSwish is onnxrt's own FusedConv activation: its fusion is the level-3 one
    so.disabled_optimizers = ["conv_onnxrt_activation_fusion"]
    plain = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    assert [n.op_type for n in plain._built.graph.nodes] == ["Conv", "HardSwish"]
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    extended = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    assert [n.op_type for n in extended._built.graph.nodes] == ["Conv", "HardSwish"]
    fused = _session(model, 1)
    assert [n.op_type for n in fused._built.graph.nodes] == ["FusedConv"]
    np.testing.assert_allclose(fused.run(None, feeds)[0], plain.run(None, feeds)[0], rtol=1e-6, atol=1e-6)


# -- 1-D convolutions along one-column planes ------------------------------------------------------------------------

#: (input shape, weight shape, Conv attributes, whether the layer is taken as one row)
COLUMNS = [
    ((1, 64, 128, 1), (96, 64, 5, 1), {}, True),  # Magika's layer, smaller
    ((2, 16, 90, 1), (24, 16, 3, 1), {"pads": [1, 0, 1, 0]}, True),
    ((1, 12, 75, 1), (20, 12, 3, 1), {"strides": [2, 1], "dilations": [3, 1], "pads": [2, 0, 0, 0]}, True),
    ((1, 40, 60, 1), (8, 40, 7, 1), {"pads": [3, 0, 3, 0]}, True),
    # padded along the columns: not a 1-D layer, kept as it is
    ((1, 16, 40, 1), (24, 16, 3, 1), {"pads": [1, 1, 1, 1]}, False),
]


@needs_native
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("x_shape, w_shape, attrs, as_row", COLUMNS, ids=[f"col{i}" for i in range(len(COLUMNS))])
def test_one_column_planes_match_onnxruntime(x_shape, w_shape, attrs, as_row, threads, monkeypatch):
    model = _model(x_shape, w_shape, attrs, "LeakyRelu", {"alpha": 0.05})
    feeds = {"x": np.random.default_rng(5).standard_normal(x_shape).astype(np.float32)}
    sess = _session(model, threads)
    shapes = []
    real = native.conv_geometry

    def seen(shape, *args):
        shapes.append(tuple(shape))
        return real(shape, *args)

    monkeypatch.setattr(native, "conv_geometry", seen)
    got = sess.run(None, feeds)[0]
    n, c, h, _ = x_shape
    assert shapes == [(n, c, 1, h) if as_row else x_shape]
    np.testing.assert_allclose(got, _onnxruntime(model, feeds), rtol=1e-5, atol=1e-5)


# -- HardSwish as PaddlePaddle's exports spell it: Div(Mul(c, Clip(Add(c, 3), 0, 6)), 6) ----------------------------


def _paddle_model(x_shape, w_shape, attrs, *, offset=3.0, lo=0.0, hi=6.0, div=6.0, swap=False, extra_output=False):
    rng = np.random.default_rng(0)
    w = (rng.standard_normal(w_shape) / np.sqrt(np.prod(w_shape[1:]))).astype(np.float32)
    b = (2.0 * rng.standard_normal(w_shape[0])).astype(np.float32)
    consts = {"k_off": offset, "k_lo": lo, "k_hi": hi, "k_div": div}
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], **attrs),
             helper.make_node("Add", ["k_off", "c"] if swap else ["c", "k_off"], ["a"]),
             helper.make_node("Clip", ["a", "k_lo", "k_hi"], ["t"]),
             helper.make_node("Mul", ["t", "c"] if swap else ["c", "t"], ["m"]),
             helper.make_node("Div", ["m", "k_div"], ["y"])]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    if extra_output:
        outputs.append(helper.make_tensor_value_info("t", TensorProto.FLOAT, None))
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")]
    inits += [numpy_helper.from_array(np.array(v, np.float32), k) for k, v in consts.items()]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
                              outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9).SerializeToString()


def _unfused(model):
    so = ort.SessionOptions()
    so.disabled_optimizers = ["conv_activation_fusion", "conv_onnxrt_activation_fusion"]
    return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])


@needs_native
@pytest.mark.parametrize("swap", [False, True], ids=["c-first", "c-second"])
@pytest.mark.parametrize("x_shape, w_shape, attrs, kernel", LAYERS, ids=[f"{k}-{i}" for i, (*_, k) in enumerate(LAYERS)])
def test_paddle_hard_swish_fuses_and_equals_the_four_nodes(x_shape, w_shape, attrs, kernel, swap, monkeypatch,
                                                           no_numpy_activation):
    model = _paddle_model(x_shape, w_shape, attrs, swap=swap)
    feeds = {"x": np.random.default_rng(6).standard_normal(x_shape).astype(np.float32)}
    sess = _session(model, 2)
    node, = sess._built.graph.nodes
    assert node.op_type == "FusedConv" and node.attr("activation") == "HardSwish"
    assert list(node.attr("activation_params")) == [3.0, 6.0]
    counting = Counting(native.K)
    monkeypatch.setattr(native, "K", counting)
    got = sess.run(None, feeds)[0]
    assert counting.calls == {kernel: 1}
    monkeypatch.setattr(native, "K", counting.module)
    # the pattern's own order of operations: the same values as the unfused nodes
    np.testing.assert_array_equal(got, _unfused(model).run(None, feeds)[0])
    want = _onnxruntime(model, feeds)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert (want == 0).any() and (want < 0).any() and (want > 3).any()


def test_paddle_hard_swish_in_the_numpy_paths(monkeypatch):
    """Without the compiled kernels FusedConv's numpy HardSwish of offset 3 and
    threshold 6 gives the four nodes' values."""
    monkeypatch.setattr(native, "K", None)
    x_shape = (1, 8, 12, 12)
    model = _paddle_model(x_shape, (16, 8, 3, 3), {"pads": [1, 1, 1, 1]})
    feeds = {"x": np.random.default_rng(7).standard_normal(x_shape).astype(np.float32)}
    sess = _session(model, 1)
    assert [n.op_type for n in sess._built.graph.nodes] == ["FusedConv"]
    np.testing.assert_array_equal(sess.run(None, feeds)[0], _unfused(model).run(None, feeds)[0])


@pytest.mark.parametrize("change", [{"div": 5.0}, {"lo": -1.0}, {"hi": 5.0}, {"extra_output": True}],
                         ids=["other-divisor", "clip-below-zero", "divisor-not-the-bound", "clip-read-outside"])
def test_near_misses_of_the_paddle_hard_swish_are_left_alone(change):
    x_shape = (1, 4, 8, 8)
    model = _paddle_model(x_shape, (6, 4, 3, 3), {"pads": [1, 1, 1, 1]}, **change)
    feeds = {"x": np.random.default_rng(8).standard_normal(x_shape).astype(np.float32)}
    sess = _session(model, 1)
    assert "FusedConv" not in [n.op_type for n in sess._built.graph.nodes]
    for got, want in zip(sess.run(None, feeds), _onnxruntime_all(model, feeds)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def _onnxruntime_all(model, feeds):
    return rt.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)


def test_gemm_followed_by_hard_swish_stays_two_nodes():
    """FusedGemm takes no HardSwish (onnxruntime's neither): Gemm -> HardSwish is not
    fused, and a FusedGemm that names it is refused."""
    rng = np.random.default_rng(9)
    nodes = [helper.make_node("Gemm", ["a", "w"], ["g"]), helper.make_node("HardSwish", ["g"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("a", TensorProto.FLOAT, [3, 5])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(rng.standard_normal((5, 4)).astype(np.float32), "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9).SerializeToString()
    sess = _session(model, 1)
    assert [n.op_type for n in sess._built.graph.nodes] == ["Gemm", "HardSwish"]
    feeds = {"a": rng.standard_normal((3, 5)).astype(np.float32)}
    np.testing.assert_allclose(sess.run(None, feeds)[0], _onnxruntime(model, feeds), rtol=1e-6, atol=1e-6)
    fused = helper.make_node("FusedGemm", ["a", "w"], ["y"], domain="com.microsoft", activation="HardSwish")
    graph = helper.make_graph([fused], "g", [helper.make_tensor_value_info("a", TensorProto.FLOAT, [3, 5])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(rng.standard_normal((5, 4)).astype(np.float32), "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)],
                              ir_version=9).SerializeToString()
    with pytest.raises(ort.Fail, match="FusedGemm does not take HardSwish"):
        _session(model, 1)


@needs_native
@pytest.mark.parametrize("act", [-1, 9])
def test_kernels_refuse_an_activation_kind_they_do_not_have(act):
    """Kinds 0-8 exist (none, Relu, Clip, LeakyRelu, HardSigmoid, HardSwish twice,
    Sigmoid, QuickGelu); the kernels refuse the others by name."""
    k = native.K
    x = np.ones((1, 64, 14, 14), np.float32)
    y = np.empty((1, 64, 14, 14), np.float32)
    geo = native.conv_geometry(x.shape, 64, 1, (3, 3), (1, 1), (1, 1), (1, 1), (14, 14))
    w = np.ones((64, 64 * 9), np.float32)
    with pytest.raises(ValueError, match="conv2d: invalid geometry or activation"):
        k.conv2d(x, w, None, None, y, geo, act, 0.0, 0.0, 1)
    with pytest.raises(ValueError, match="direct2d: invalid activation"):
        k.direct2d(x, w, None, None, y, geo, act, 0.0, 0.0, 1)
    with pytest.raises(ValueError, match="winograd3x3: invalid geometry or activation"):
        k.winograd3x3(x, np.ones((16, 64, 64), np.float32), None, None, y, geo, act, 0.0, 0.0, 1)
    with pytest.raises(ValueError, match="depthwise2d: invalid geometry or activation"):
        k.depthwise2d(x, np.ones((64, 9), np.float32), None, y, geo.window(), act, 0.0, 0.0, 1)
