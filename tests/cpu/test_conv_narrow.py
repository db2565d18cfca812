"""The compiled direct kernel for convolutions with a short reduction
(``onnxrt_cpu.conv.narrow``: input channels times taps at most 32, the first layers
of audio and image networks): strides, dilations, pads, auto_pad, odd widths,
output channels that are not a multiple of the kernel's block of eight, batches,
1-D maps, the residual and every FusedConv activation, against onnxruntime and the
onnx reference implementation."""

from __future__ import annotations

import numpy as np
import onnxruntime as rt
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import onnxrt as ort
from onnxrt_cpu import native
from onnxrt_cpu.conv.narrow import narrow_activation
from tests.cpu.conv_cases import Counting, needs_native

# (input shape, weight shape, Conv attributes)
GEOMETRIES = [
    # plcmos's first layer, smaller: a dilation along the rows, "same" pads, 257 columns
    ((1, 1, 40, 257), (32, 1, 3, 3), {"dilations": [2, 1], "pads": [1, 1, 1, 1]}),
    # openWakeWord's: pads along the row only, 24 channels (three blocks of eight)
    ((1, 1, 76, 32), (24, 1, 3, 3), {"pads": [0, 1, 0, 1]}),
    # 3 -> 32 stride 2 stem, odd map
    ((1, 3, 57, 61), (32, 3, 3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1]}),
    # output channels past a block, batch of two, asymmetric pads, odd widths
    ((2, 2, 23, 17), (13, 2, 3, 3), {"pads": [0, 2, 1, 0]}),
    ((2, 1, 40, 1), (20, 1, 3, 1), {"pads": [1, 0, 1, 0]}),
    ((1, 3, 30, 47), (40, 3, 3, 3), {"strides": [1, 3], "pads": [1, 1, 1, 1]}),
    ((1, 3, 31, 35), (17, 3, 3, 3), {"strides": [3, 2], "dilations": [1, 2], "pads": [2, 0, 0, 2]}),
    # 5x5 of one channel, 1x1 of 8 channels at stride 2, a 2x4 kernel of 4
    ((1, 1, 20, 33), (18, 1, 5, 5), {"pads": [2, 2, 2, 2]}),
    ((1, 8, 15, 15), (24, 8, 1, 1), {"strides": [2, 2]}),
    ((1, 4, 12, 19), (19, 4, 2, 4), {}),
    # auto_pad
    ((1, 1, 14, 21), (32, 1, 3, 3), {"auto_pad": "SAME_UPPER", "strides": [2, 2]}),
    ((1, 2, 13, 18), (24, 2, 3, 3), {"auto_pad": "SAME_LOWER"}),
    ((1, 3, 16, 29), (32, 3, 3, 3), {"auto_pad": "VALID"}),
    # 1-D
    ((2, 1, 300), (32, 1, 9), {"pads": [4, 4]}),
    ((1, 3, 201), (40, 3, 5), {"strides": [2], "pads": [2, 1]}),
]

# FusedConv's activations: (name, activation_params, the onnx node that computes it)
ACTIVATIONS = [
    (None, [], None),
    ("Relu", [], ("Relu", {})),
    ("Clip", [-0.5, 0.75], ("Clip", None)),
    ("LeakyRelu", [0.1], ("LeakyRelu", {"alpha": 0.1})),
    ("HardSigmoid", [0.3, 0.4], ("HardSigmoid", {"alpha": 0.3, "beta": 0.4})),
    ("Sigmoid", [], ("Sigmoid", {})),  # lane by lane through the epilogue's exp
    ("Tanh", [], ("Tanh", {})),  # not the kernel's: numpy applies it afterwards
]


def _gid(g):
    x, w, a = g
    return "x" + "x".join(map(str, x)) + "-w" + "x".join(map(str, w)) + "".join(
        f"-{k}{''.join(map(str, v)) if isinstance(v, list) else v}" for k, v in a.items())


def _weights(w_shape, seed=0):
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal(w_shape) / np.sqrt(np.prod(w_shape[1:]))).astype(np.float32)
    b = rng.standard_normal(w_shape[0]).astype(np.float32)
    return w, b


def _fused_model(x_shape, w_shape, attrs, act, params, residual):
    """FusedConv (com.microsoft) with a constant weight and bias, and ``z`` as an
    input where ``residual``."""
    w, b = _weights(w_shape)
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))]
    names = ["x", "w", "b"]
    if residual:
        inputs.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, None))
        names.append("z")
    kw = dict(attrs)
    if act:
        kw["activation"] = act
        if params:
            kw["activation_params"] = params
    node = helper.make_node("FusedConv", names, ["y"], domain="com.microsoft", **kw)
    graph = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)],
                             ir_version=9)


def _plain_model(x_shape, w_shape, attrs, act, params, residual):
    """The same as :func:`_fused_model` in standard nodes: Conv, Add, the activation."""
    w, b = _weights(w_shape)
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))]
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], **attrs)]
    last = "c"
    if residual:
        inputs.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, None))
        nodes.append(helper.make_node("Add", [last, "z"], ["s"]))
        last = "s"
    spec = dict((a[0], a[2]) for a in ACTIVATIONS)[act]
    if spec is None:
        nodes.append(helper.make_node("Identity", [last], ["y"]))
    elif spec[0] == "Clip":
        inits += [numpy_helper.from_array(np.array(params[0], np.float32), "lo"),
                  numpy_helper.from_array(np.array(params[1], np.float32), "hi")]
        nodes.append(helper.make_node("Clip", [last, "lo", "hi"], ["y"]))
    else:
        nodes.append(helper.make_node(spec[0], [last], ["y"], **spec[1]))
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def _feeds(x_shape, out_shape, residual, seed=1):
    rng = np.random.default_rng(seed)
    feeds = {"x": rng.standard_normal(x_shape).astype(np.float32)}
    if residual:
        feeds["z"] = rng.standard_normal(out_shape).astype(np.float32)
    return feeds


def _run(model, feeds, threads):
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)[0]


#: The compiled convolutions: which of them ran is what the tests count.
_CONVOLUTIONS = {"narrow_conv2d", "direct2d", "conv2d", "winograd3x3", "depthwise2d"}


def _counted_run(model, feeds, threads, monkeypatch):
    """The first output of ``model`` and the compiled convolutions it called."""
    counting = Counting(native.K)
    monkeypatch.setattr(native, "K", counting)
    got = _run(model, feeds, threads)
    monkeypatch.undo()
    return got, {k: v for k, v in counting.calls.items() if k in _CONVOLUTIONS}


@needs_native
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("geometry", GEOMETRIES, ids=[_gid(g) for g in GEOMETRIES])
def test_geometries_take_the_narrow_kernel_and_match_onnxruntime(geometry, threads, monkeypatch):
    x_shape, w_shape, attrs = geometry
    plain = _plain_model(x_shape, w_shape, attrs, "LeakyRelu", [0.1], False)
    feeds = _feeds(x_shape, None, False)
    want = rt.InferenceSession(plain.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    got, calls = _counted_run(_fused_model(x_shape, w_shape, attrs, "LeakyRelu", [0.1], False), feeds, threads,
                              monkeypatch)
    assert calls == {"narrow_conv2d": 1}
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert (want < 0).any()  # the slope applied somewhere


@needs_native
@pytest.mark.parametrize("residual", [False, True], ids=["plain", "residual"])
@pytest.mark.parametrize("act, params, spec", ACTIVATIONS, ids=[str(a[0]) for a in ACTIVATIONS])
@pytest.mark.parametrize("geometry", [GEOMETRIES[0], GEOMETRIES[2], GEOMETRIES[3], GEOMETRIES[13]],
                         ids=["dilated", "stride2", "odd", "1d"])
def test_activations_and_residual_match_the_reference(geometry, act, params, spec, residual, monkeypatch):
    x_shape, w_shape, attrs = geometry
    plain = _plain_model(x_shape, w_shape, attrs, act, params, residual)
    out_shape = ReferenceEvaluator(_plain_model(x_shape, w_shape, attrs, None, [], False)).run(
        None, _feeds(x_shape, None, False))[0].shape
    feeds = _feeds(x_shape, out_shape, residual)
    want = ReferenceEvaluator(plain).run(None, feeds)[0]
    for threads in (1, 2):
        got, calls = _counted_run(_fused_model(x_shape, w_shape, attrs, act, params, residual), feeds, threads,
                                  monkeypatch)
        assert calls == {"narrow_conv2d": 1}
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    if act in ("Relu", "Clip", "HardSigmoid"):
        # the activation clipped something, and nothing past its bounds is left
        lo = {"Relu": 0.0, "Clip": params[0] if act == "Clip" else 0.0, "HardSigmoid": 0.0}[act]
        assert (want == lo).any() and got.min() >= lo


@needs_native
def test_nan_and_infinity_pass_through_as_in_numpy(monkeypatch):
    """NaN stays NaN through every activation of the kernel (numpy's where, maximum
    and clip keep it), infinities clip."""
    x_shape, w_shape, attrs = (1, 1, 6, 37), (16, 1, 3, 3), {"pads": [1, 1, 1, 1]}
    x = np.random.default_rng(0).standard_normal(x_shape).astype(np.float32)
    x[0, 0, 2, 2] = np.nan
    x[0, 0, 4, 30] = np.inf
    x[0, 0, 1, 20] = -np.inf
    for act, params, _ in ACTIVATIONS[:5]:
        want = ReferenceEvaluator(_plain_model(x_shape, w_shape, attrs, act, params, False)).run(None, {"x": x})[0]
        with np.errstate(invalid="ignore"):
            got, calls = _counted_run(_fused_model(x_shape, w_shape, attrs, act, params, False), {"x": x}, 1,
                                      monkeypatch)
        assert calls == {"narrow_conv2d": 1}
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_activation_forms():
    """The kernel's (kind, p0, p1) of each activation; None for those only numpy applies."""

    class Act:
        def __init__(self, name, params, form=None):
            self.name, self.params, self.native = name, params, form

    assert narrow_activation(None) == (0, 0.0, 0.0)
    assert narrow_activation(Act("Relu", [])) == (1, 0.0, 0.0)
    assert narrow_activation(Act("Clip", [0.0])) == (2, 0.0, np.inf)
    assert narrow_activation(Act("LeakyRelu", [0.25])) == (3, 0.25, 0.0)
    assert narrow_activation(Act("HardSigmoid", [0.3, 0.4])) == (4, 0.3, 0.4)
    assert narrow_activation(Act("Sigmoid", [])) is None
    assert narrow_activation(Act("Elu", [1.0])) is None
    # a compiled form given by the activation itself wins, one past the kernel's does not
    assert narrow_activation(Act("HardSwish", [], (5, 1 / 6, 0.5))) == (5, 1 / 6, 0.5)
    assert narrow_activation(Act("Sigmoid", [], (7, 0.0, 0.0))) == (7, 0.0, 0.0)
    assert narrow_activation(Act("Other", [], (9, 0.0, 0.0))) is None


def _sigmoid(v):
    return np.float32(1) / (np.float32(1) + np.exp(-v))


#: The compiled kinds past FusedConv's own activations, as numpy computes them:
#: (kind, p0, p1, function of the plain convolution's output)
_FORMS = [
    (5, 1 / 6, 0.5, lambda v: v * np.clip(v * np.float32(1 / 6) + np.float32(0.5), 0, 1)),
    (6, 3.0, 6.0, lambda v: v * np.clip(v + np.float32(3), 0, 6) / np.float32(6)),
    (7, 0.0, 0.0, _sigmoid),
    (8, 1.702, 0.0, lambda v: v * _sigmoid(np.float32(1.702) * v)),
]


@needs_native
@pytest.mark.parametrize("kind, p0, p1, fn", _FORMS, ids=["hard-swish", "hard-swish-div", "sigmoid", "silu"])
def test_compiled_forms_match_numpy(kind, p0, p1, fn):
    """The kinds a fused Conv + HardSwish, Sigmoid or QuickGelu hands over, against
    numpy on the kernel's own convolution without an activation, partial vectors
    (45 columns) included."""
    from onnxrt_cpu.conv.compiled import native_geometry
    from onnxrt_cpu.conv.packing import ConvWeights

    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 3, 19, 45)).astype(np.float32) * 4
    w, b = _weights((21, 3, 3, 3))
    wp = ConvWeights(w, 1, np.float32)
    x4, g = native_geometry(x, wp, (1, 1), (1, 1), (1, 1), (1, 1), (19, 45), 0)
    plain = np.empty((1, 21, 19, 45), np.float32)
    native.K.narrow_conv2d(x4, wp.gemm, b, None, plain, g, 0, 0.0, 0.0, 2)
    got = np.empty_like(plain)
    native.K.narrow_conv2d(x4, wp.gemm, b, None, got, g, kind, p0, p1, 2)
    np.testing.assert_allclose(got, fn(plain), rtol=1e-5, atol=1e-6)
    assert (plain < -3).any() and (plain > 3).any()


@needs_native
def test_bad_arguments_are_refused():
    from onnxrt_cpu.conv.compiled import native_geometry
    from onnxrt_cpu.conv.packing import ConvWeights

    x = np.zeros((1, 4, 8, 8), np.float32)
    wp = ConvWeights(np.zeros((8, 4, 3, 3), np.float32), 1, np.float32)
    x4, g = native_geometry(x, wp, (1, 1), (1, 1), (0, 0), (0, 0), (6, 6), 0)
    y = np.empty((1, 8, 6, 6), np.float32)
    with pytest.raises(ValueError, match="activation"):
        native.K.narrow_conv2d(x4, wp.gemm, None, None, y, g, 9, 0.0, 0.0, 1)
    with pytest.raises(TypeError, match="narrow_conv2d: y"):
        native.K.narrow_conv2d(x4, wp.gemm, None, None, y.astype(np.float64), g, 0, 0.0, 0.0, 1)
    big = ConvWeights(np.zeros((8, 8, 3, 3), np.float32), 1, np.float32)
    x8 = np.zeros((1, 8, 8, 8), np.float32)
    x48, g8 = native_geometry(x8, big, (1, 1), (1, 1), (0, 0), (0, 0), (6, 6), 0)
    with pytest.raises(ValueError, match="reduction of 72"):
        native.K.narrow_conv2d(x48, big.gemm, None, None, y, g8, 0, 0.0, 0.0, 1)


@needs_native
def test_rows_past_the_kernels_limit_fall_back(monkeypatch):
    """A layer whose band of input rows passes the kernel's 64 MiB (a dilation of 1100
    rows: 2201 rows of 8192 values a band) takes another path, with the same result."""
    x_shape, w_shape, attrs = (1, 1, 2205, 8192), (24, 1, 3, 1), {"dilations": [1100, 1]}
    rng = np.random.default_rng(4)
    x = rng.standard_normal(x_shape).astype(np.float32)
    model = _plain_model(x_shape, w_shape, attrs, "Relu", [], False)
    got, calls = _counted_run(_fused_model(x_shape, w_shape, attrs, "Relu", [], False), {"x": x}, 1, monkeypatch)
    assert calls["narrow_conv2d"] == 1 and len(calls) == 2  # refused, then another kernel
    want = rt.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
