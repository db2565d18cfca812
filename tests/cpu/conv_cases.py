"""Conv models, runs and counts shared by the convolution specification
(``test_conv.py``) and the tests of the compiled kernels and the fast paths."""

from __future__ import annotations

import collections

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import onnxrt as ort
from onnxrt_cpu import native

__all__ = ["GEOMETRIES", "Counting", "conv_feeds", "conv_model", "make_model", "needs_native", "run",
           "small_conv_model"]

needs_native = pytest.mark.skipif(native.K is None, reason=f"compiled kernels not loaded: {native.status()['reason']}")


def conv_model(x_shape, w_shape, *, group=1, strides=None, pads=None, dilations=None, bias="constant",
                act=None, residual=False, dtype=np.float32, seed=0):
    """A Conv, optionally + a residual input ``z`` and an activation node, which the
    optimizer fuses into FusedConv at ORT_ENABLE_ALL."""
    rng = np.random.default_rng(seed)
    et = TensorProto.FLOAT if dtype == np.float32 else TensorProto.DOUBLE
    fan_in = int(np.prod(w_shape[1:]))
    inits = [numpy_helper.from_array((rng.standard_normal(w_shape) / np.sqrt(fan_in)).astype(dtype), "w")]
    inputs = [helper.make_tensor_value_info("x", et, list(x_shape))]
    conv_in = ["x", "w"]
    if bias == "constant":
        inits.append(numpy_helper.from_array(rng.standard_normal(w_shape[0]).astype(dtype), "b"))
        conv_in.append("b")
    elif bias == "input":
        inputs.append(helper.make_tensor_value_info("b", et, [w_shape[0]]))
        conv_in.append("b")
    attrs = {"group": group}
    for k, v in (("strides", strides), ("pads", pads), ("dilations", dilations)):
        if v is not None:
            attrs[k] = list(v)
    nodes = [helper.make_node("Conv", conv_in, ["c"], **attrs)]
    last = "c"
    if residual:
        inputs.append(helper.make_tensor_value_info("z", et, None))
        nodes.append(helper.make_node("Add", [last, "z"], ["s"]))
        last = "s"
    if act == "Relu":
        nodes.append(helper.make_node("Relu", [last], ["y"]))
    elif act == "Clip":
        inits += [numpy_helper.from_array(np.array(0, dtype), "lo"), numpy_helper.from_array(np.array(6, dtype), "hi")]
        nodes.append(helper.make_node("Clip", [last, "lo", "hi"], ["y"]))
    elif act == "LeakyRelu":
        nodes.append(helper.make_node("LeakyRelu", [last], ["y"], alpha=0.1))
    else:
        nodes.append(helper.make_node("Identity", [last], ["y"]))
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("y", et, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8).SerializeToString()


def run(model, feeds, threads, level=ort.GraphOptimizationLevel.ORT_ENABLE_ALL):
    """The first output of ``model`` on onnxrt's CPU provider with ``threads`` threads."""
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.graph_optimization_level = level
    return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"]).run(None, feeds)[0]


def conv_feeds(model, x_shape, w_shape, bias, residual, dtype, seed=1):
    """Random feeds of :func:`conv_model`'s inputs: ``x``, a fed bias ``b`` and a
    residual ``z`` of the convolution's output shape, as asked."""
    rng = np.random.default_rng(seed)
    feeds = {"x": rng.standard_normal(x_shape).astype(dtype)}
    if bias == "input":
        feeds["b"] = rng.standard_normal(w_shape[0]).astype(dtype)
    if residual:
        out = ReferenceEvaluator(conv_model(x_shape, w_shape, **residual)).run(None, {
            k: v for k, v in feeds.items() if k != "z"})[0]
        feeds["z"] = rng.standard_normal(out.shape).astype(dtype)
    return feeds


# (input shape, weight shape, attributes): every kind of layer the compiled kernels take
GEOMETRIES = [
    # 1x1 products on the input itself, one image and a batch
    ((1, 16, 28, 28), (40, 16, 1, 1), {}),
    ((3, 8, 9, 11), (12, 8, 1, 1), {}),
    # 1x1 with a stride or padding: gathered like any kernel
    ((1, 8, 15, 15), (16, 8, 1, 1), {"strides": (2, 2)}),
    ((1, 4, 6, 6), (6, 4, 1, 1), {"pads": (1, 0, 0, 1)}),
    # 3x3 and 5x5, same and valid padding, strides 1-3, dilations
    ((1, 8, 20, 17), (16, 8, 3, 3), {"pads": (1, 1, 1, 1)}),
    ((2, 3, 33, 30), (8, 3, 5, 5), {"strides": (2, 2), "pads": (2, 2, 2, 2)}),
    ((1, 6, 19, 23), (10, 6, 3, 3), {"strides": (3, 2), "pads": (0, 1, 2, 0)}),
    ((1, 5, 21, 21), (7, 5, 3, 3), {"dilations": (2, 3), "pads": (2, 3, 2, 3)}),
    ((1, 4, 10, 10), (4, 4, 3, 2), {}),
    # small maps with many channels: the rows mode when several threads run
    ((1, 128, 7, 7), (96, 128, 3, 3), {"pads": (1, 1, 1, 1)}),
    ((1, 256, 7, 7), (320, 256, 1, 1), {}),
    # grouped
    ((1, 12, 14, 14), (24, 3, 3, 3), {"group": 4, "pads": (1, 1, 1, 1)}),
    ((2, 16, 9, 9), (16, 8, 1, 1), {"group": 2}),
    # depthwise: flat (large maps) and channels last (small), strides and dilations
    ((1, 32, 40, 40), (32, 1, 3, 3), {"group": 32, "pads": (1, 1, 1, 1)}),
    ((1, 24, 41, 39), (24, 1, 3, 3), {"group": 24, "strides": (2, 2), "pads": (1, 1, 1, 1)}),
    ((2, 40, 14, 14), (40, 1, 3, 3), {"group": 40, "pads": (1, 1, 1, 1)}),
    ((1, 37, 7, 9), (37, 1, 5, 5), {"group": 37, "pads": (2, 2, 2, 2)}),
    ((1, 20, 16, 16), (20, 1, 3, 3), {"group": 20, "strides": (2, 2), "dilations": (2, 2), "pads": (2, 0, 1, 2)}),
    ((1, 18, 30, 31), (18, 1, 7, 3), {"group": 18, "strides": (3, 1), "pads": (3, 1, 3, 1)}),
    # the direct kernel (short reductions, maps of 400 outputs and more): strides,
    # dilations, asymmetric pads, a few output channels or many inputs, 1-D
    ((1, 3, 64, 64), (8, 3, 5, 5), {"strides": (2, 2), "pads": (2, 2, 2, 2)}),
    ((1, 8, 40, 37), (16, 8, 3, 3), {"pads": (1, 0, 2, 1)}),
    ((2, 6, 50, 45), (10, 6, 3, 3), {"strides": (2, 1), "dilations": (1, 2), "pads": (0, 2, 1, 2)}),
    ((1, 24, 24, 24), (40, 24, 3, 3), {"pads": (1, 1, 1, 1)}),
    ((2, 8, 500), (12, 8, 3), {"pads": (1, 1)}),
    # reductions past the direct kernel's: im2col, strided and dilated
    ((1, 48, 20, 20), (40, 48, 3, 3), {"strides": (2, 2), "pads": (1, 1, 1, 1)}),
    ((1, 40, 18, 18), (24, 40, 3, 3), {"dilations": (2, 2), "pads": (2, 2, 2, 2)}),
    # 3x3, stride 1, 64 x 64 channels and more, maps of 12 and more: Winograd's F(2x2, 3x3)
    ((1, 64, 14, 14), (64, 64, 3, 3), {"pads": (1, 1, 1, 1)}),
    ((2, 64, 17, 13), (96, 64, 3, 3), {"pads": (0, 1, 2, 0)}),
    ((1, 80, 30, 31), (64, 80, 3, 3), {}),
    ((3, 64, 12, 12), (72, 64, 3, 3), {"pads": (1, 1, 1, 1)}),  # tile rows split over images
    # 1-D
    ((2, 8, 50), (12, 8, 3), {"pads": (1, 1)}),
    ((1, 6, 31), (6, 1, 5), {"group": 6, "strides": (2,), "pads": (2, 1)}),
]


class Counting:
    """The compiled module with a count of the calls of each of its functions."""

    def __init__(self, module):
        self.module = module
        self.calls = collections.Counter()

    def __getattr__(self, name):
        fn = getattr(self.module, name)

        def counted(*args):
            self.calls[name] += 1
            return fn(*args)

        return counted


def make_model(nodes, inputs, outputs, initializers=()):
    """A model at IR version 10, which onnxruntime also accepts."""
    graph = helper.make_graph(nodes, "test", inputs, outputs, initializer=list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


def small_conv_model(x_shape, w_shape, bias=True, **attrs):
    """A single Conv with a constant weight of unit-variance outputs and, with ``bias``,
    a constant bias (an ``onnx.ModelProto``)."""
    rng = np.random.default_rng(0)
    w = (rng.standard_normal(w_shape) / np.sqrt(np.prod(w_shape[1:]))).astype(np.float32)
    inits = [numpy_helper.from_array(w, "w")]
    inputs = ["x", "w"]
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(w_shape[0]).astype(np.float32), "b"))
        inputs.append("b")
    return make_model(
        [helper.make_node("Conv", inputs, ["y"], **attrs)],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
