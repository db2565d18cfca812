"""The compiled call a Conv or FusedConv kernel keeps per input shape
(:class:`onnxrt_cpu.conv.compiled.NativeCall`): built on the first call of a shape
with the node's own weight and bias, then run on every later call without the
checks and the choice of algorithm.

Every layer the compiled kernels take (1x1 products, im2col tiles, the direct
kernel, Winograd, both depthwise layouts, 1-D) gives, run after run, what
onnxruntime gives and exactly what the uncached path gives; each run's output is
a new array; a new input shape builds a new call; a fed weight, an activation only
numpy applies and the numpy path keep no call.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import onnxrt as ort
from onnxrt_cpu import native
from onnxrt_cpu.conv import compiled
from onnxrt_cpu.kernels import conv as conv_kernels
from tests.cpu.conv_cases import GEOMETRIES, conv_feeds, conv_model, needs_native

rt = pytest.importorskip("onnxruntime")


def _session(model, threads=2):
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])


def _onnxruntime(model, feeds):
    so = rt.SessionOptions()
    so.intra_op_num_threads = 2
    return rt.InferenceSession(model, so, providers=["CPUExecutionProvider"]).run(None, feeds)[0]


class _CountingCalls:
    """:func:`compiled.native_call` with a count of its calls and of the calls it
    built (not None)."""

    def __init__(self):
        self.calls = 0
        self.built = 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        call = compiled.native_call(*args, **kwargs)
        self.built += call is not None
        return call


def _uncached(monkeypatch):
    """Make the Conv kernels keep no compiled call (the path before the cache)."""
    monkeypatch.setattr(conv_kernels, "native_call", lambda *args, **kwargs: None)


def _fused_model(x_shape, w_shape, attrs, act, out_shape):
    """FusedConv(x, w, b, z) with ``act`` (None: no activation), the residual ``z``
    fed, shaped ``out_shape``; or, without ``out_shape``, no residual."""
    rng = np.random.default_rng(0)
    w = (rng.standard_normal(w_shape) / np.sqrt(np.prod(w_shape[1:]))).astype(np.float32)
    b = rng.standard_normal(w_shape[0]).astype(np.float32)
    fused = {"activation": act} if act else {}
    if act == "LeakyRelu":
        fused["activation_params"] = [0.1]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))]
    names = ["x", "w", "b"]
    if out_shape is not None:
        inputs.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, list(out_shape)))
        names.append("z")
    node = helper.make_node("FusedConv", names, ["y"], domain="com.microsoft", **fused,
                            **{k: list(v) for k, v in attrs.items() if k != "group"}, group=attrs.get("group", 1))
    graph = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=9).SerializeToString()


@needs_native
@pytest.mark.parametrize("act", [None, "Relu", "LeakyRelu"])
@pytest.mark.parametrize("x_shape, w_shape, attrs", GEOMETRIES, ids=[f"layer{i}" for i in range(len(GEOMETRIES))])
def test_kept_call_matches_onnxruntime_and_the_uncached_path_run_after_run(x_shape, w_shape, attrs, act,
                                                                          monkeypatch):
    out_shape = ReferenceEvaluator(conv_model(x_shape, w_shape, **attrs)).run(
        None, {"x": np.zeros(x_shape, np.float32)})[0].shape
    # a depthwise layer with Z adds it in numpy: no kept call, so no residual there
    residual = attrs.get("group", 1) != w_shape[0] or w_shape[1] != 1
    model = _fused_model(x_shape, w_shape, attrs, act, out_shape if residual else None)
    counting = _CountingCalls()
    monkeypatch.setattr(conv_kernels, "native_call", counting)
    sess = _session(model)
    rng = np.random.default_rng(1)
    runs = []
    for _ in range(3):
        feeds = {"x": rng.standard_normal(x_shape).astype(np.float32)}
        if residual:
            feeds["z"] = rng.standard_normal(out_shape).astype(np.float32)
        runs.append(feeds)
    got = [sess.run(None, feeds)[0] for feeds in runs]
    assert counting.calls == 1  # one call built for the shape, then kept
    with monkeypatch.context() as m:
        _uncached(m)
        plain = _session(model)
        want_plain = [plain.run(None, feeds)[0] for feeds in runs]
    for feeds, y, y_plain in zip(runs, got, want_plain):
        np.testing.assert_array_equal(y, y_plain)
        np.testing.assert_allclose(y, _onnxruntime(model, feeds), rtol=1e-5, atol=1e-5)
    assert not np.array_equal(got[0], got[1])


@needs_native
def test_kept_calls_take_the_layers_the_compiled_kernels_take(monkeypatch):
    """The cache is not idle: the 1x1, im2col, direct, Winograd and depthwise layers
    of the geometries above each built a call."""
    counting = _CountingCalls()
    monkeypatch.setattr(conv_kernels, "native_call", counting)
    for i in (0, 4, 9, 13, 20, 27):
        x_shape, w_shape, attrs = GEOMETRIES[i]
        sess = _session(_fused_model(x_shape, w_shape, attrs, "Relu", None))
        sess.run(None, {"x": np.ones(x_shape, np.float32)})
    assert counting.calls == 6 and counting.built == 6


@needs_native
@pytest.mark.parametrize("x_shape, w_shape, attrs", [GEOMETRIES[0], GEOMETRIES[13], GEOMETRIES[20], GEOMETRIES[27]],
                         ids=["conv2d", "depthwise2d", "direct2d", "winograd3x3"])
def test_each_run_hands_out_a_new_output(x_shape, w_shape, attrs, monkeypatch):
    counting = _CountingCalls()
    monkeypatch.setattr(conv_kernels, "native_call", counting)
    model = conv_model(x_shape, w_shape, act="Relu", **attrs)
    sess = _session(model)
    rng = np.random.default_rng(4)
    x1, x2 = (rng.standard_normal(x_shape).astype(np.float32) for _ in range(2))
    y1 = sess.run(None, {"x": x1})[0]
    kept = y1.copy()
    y2 = sess.run(None, {"x": x2})[0]
    assert counting.built == 1
    assert not np.shares_memory(y1, y2)
    np.testing.assert_array_equal(y1, kept)  # the second run wrote elsewhere
    np.testing.assert_allclose(y2, _onnxruntime(model, {"x": x2}), rtol=1e-5, atol=1e-5)


def _dynamic_model(channels, out_channels, kernel, pads, act_node=None):
    """A Conv (+ an activation node) whose input's batch and map sizes are symbolic."""
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((out_channels, channels, *kernel)) / np.sqrt(channels * np.prod(kernel))).astype(
        np.float32)
    b = rng.standard_normal(out_channels).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c" if act_node else "y"], pads=list(pads))]
    if act_node:
        nodes.append(helper.make_node(act_node, ["c"], ["y"]))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                         ["n", channels, "h", "w"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9).SerializeToString()


@needs_native
def test_a_new_input_shape_builds_its_own_call(monkeypatch):
    counting = _CountingCalls()
    monkeypatch.setattr(conv_kernels, "native_call", counting)
    model = _dynamic_model(24, 24, (1, 3), (0, 1, 0, 1), "Relu")
    sess = _session(model)
    rng = np.random.default_rng(5)
    shapes = [(1, 24, 74, 32), (1, 24, 30, 8), (2, 24, 74, 32), (1, 24, 74, 32), (1, 24, 30, 8)]
    for shape in shapes:
        feeds = {"x": rng.standard_normal(shape).astype(np.float32)}
        y = sess.run(None, feeds)[0]
        assert y.shape == (shape[0], 24, shape[2], shape[3])
        np.testing.assert_allclose(y, _onnxruntime(model, feeds), rtol=1e-5, atol=1e-5)
    assert counting.calls == 3  # one per shape; the shapes seen before kept theirs


@needs_native
def test_a_fed_weight_keeps_no_call(monkeypatch):
    counting = _CountingCalls()
    monkeypatch.setattr(conv_kernels, "native_call", counting)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 20, 20]),
         helper.make_tensor_value_info("w", TensorProto.FLOAT, [16, 8, 3, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9).SerializeToString()
    sess = _session(model)
    rng = np.random.default_rng(6)
    x = rng.standard_normal((1, 8, 20, 20)).astype(np.float32)
    w = rng.standard_normal((16, 8, 3, 3)).astype(np.float32)
    y1 = sess.run(None, {"x": x, "w": w})[0]
    w *= -2  # the same array, changed in place between runs
    y2 = sess.run(None, {"x": x, "w": w})[0]
    assert counting.calls == 0
    np.testing.assert_allclose(y2, ReferenceEvaluator(model).run(None, {"x": x, "w": w})[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(y2, -2 * y1, rtol=1e-5, atol=1e-5)


@needs_native
def test_an_activation_only_numpy_applies_keeps_no_call(monkeypatch):
    counting = _CountingCalls()
    monkeypatch.setattr(conv_kernels, "native_call", counting)
    rng = np.random.default_rng(7)
    w = (rng.standard_normal((16, 8, 3, 3)) * 0.2).astype(np.float32)
    node = helper.make_node("FusedConv", ["x", "w"], ["y"], domain="com.microsoft", activation="Elu",
                            activation_params=[0.5], pads=[1, 1, 1, 1])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 24, 24])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)],
                              ir_version=9).SerializeToString()
    sess = _session(model)
    x = rng.standard_normal((1, 8, 24, 24)).astype(np.float32)
    for _ in range(2):
        y = sess.run(None, {"x": x})[0]
    assert counting.calls == 1 and counting.built == 0
    conv = ReferenceEvaluator(helper.make_model(helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Elu", ["c"], ["y"], alpha=0.5)],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 24, 24])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [numpy_helper.from_array(w, "w")]),
        opset_imports=[helper.make_opsetid("", 17)], ir_version=9))
    np.testing.assert_allclose(y, conv.run(None, {"x": x})[0], rtol=1e-5, atol=1e-5)


@needs_native
def test_the_numpy_path_after_the_compiled_module_is_gone(monkeypatch):
    """A kept call finds the compiled module by name on every call: with it gone, the
    kernel computes the layer in numpy (and still right)."""
    x_shape, w_shape, attrs = GEOMETRIES[4]
    model = conv_model(x_shape, w_shape, act="Relu", **attrs)
    sess = _session(model)
    feeds = conv_feeds(model, x_shape, w_shape, "constant", None, np.float32)
    first = sess.run(None, feeds)[0]
    monkeypatch.setattr(native, "K", None)
    again = sess.run(None, feeds)[0]
    np.testing.assert_allclose(again, first, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(again, _onnxruntime(model, feeds), rtol=1e-5, atol=1e-5)
