"""Strided convolutions with few input channels on the CPU provider: the taps gathered
from the stride phases of the padded input (``onnxrt_cpu.conv.phases.conv_phases``), against
onnxruntime, with the bias folded into the product, a bias fed at run time, a
residual and an activation (FusedConv), batches, dilations and 1-D and 3-D maps."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import onnxrt
from onnxrt_cpu.conv import bands, forward, phases

# these tests check the numpy paths' internals; the compiled kernels have their own
# (tests/cpu/test_native_kernels.py)
pytestmark = pytest.mark.usefixtures("numpy_kernels")

rt = pytest.importorskip("onnxruntime")


def _conv_model(x_shape, w_shape, *, strides, pads, dilations=None, bias="constant", relu=False, residual=None,
                w_std=1.0):
    """A Conv (optionally + a residual input ``z`` and a Relu) with a constant weight
    (standard deviation ``w_std``) and a bias that is a constant, a graph input
    ("input") or absent (None)."""
    rng = np.random.default_rng(7)
    nd = len(x_shape) - 2
    inits = [numpy_helper.from_array((w_std * rng.standard_normal(w_shape)).astype(np.float32), "w")]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))]
    conv_inputs = ["x", "w"]
    if bias == "constant":
        inits.append(numpy_helper.from_array(rng.standard_normal(w_shape[0]).astype(np.float32), "b"))
        conv_inputs.append("b")
    elif bias == "input":
        inputs.append(helper.make_tensor_value_info("b", TensorProto.FLOAT, [w_shape[0]]))
        conv_inputs.append("b")
    attrs = {"strides": list(strides), "pads": list(pads), "kernel_shape": list(w_shape[2:])}
    if dilations is not None:
        attrs["dilations"] = list(dilations)
    nodes = [helper.make_node("Conv", conv_inputs, ["c"], **attrs)]
    last = "c"
    if residual is not None:
        inputs.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, list(residual)))
        nodes.append(helper.make_node("Add", ["c", "z"], ["s"]))
        last = "s"
    if relu:
        nodes.append(helper.make_node("Relu", [last], ["r"]))
        last = "r"
    nodes.append(helper.make_node("Identity", [last], ["y"]))
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              inits)
    assert nd in (1, 2, 3)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8).SerializeToString()


def _run_both(model, feeds):
    got = onnxrt.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    want = rt.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    return got, want


@pytest.fixture
def phase_calls(monkeypatch):
    """The images each call of the phase path convolved (so a test knows it ran).
    Batches of small maps take the channels-last path (``_conv_rows``) first; its
    budget set to nothing, they take the phases too. Layers with stride 2 along the
    row take the banded im2col on their column phases (``onnxrt_cpu.conv.bands.column_phases``,
    tests/cpu/test_conv_column_phases.py); with those off, they take the phase path
    as every other stride does."""
    monkeypatch.setattr(bands, "BAND_ELEMS", 0)
    monkeypatch.setattr(forward, "_COLUMN_PHASES", False)
    calls = []
    real = forward.conv_phases

    def spy(x, *args, **kwargs):
        calls.append(x.shape)
        return real(x, *args, **kwargs)

    monkeypatch.setattr(forward, "conv_phases", spy)
    return calls


@pytest.mark.parametrize("x_shape, w_shape, strides, pads, dilations", [
    ((1, 3, 40, 40), (8, 3, 3, 3), (2, 2), (1, 1, 1, 1), None),  # a detector's stem
    ((1, 3, 41, 39), (8, 3, 3, 3), (2, 2), (1, 1, 1, 1), None),  # odd sizes: uneven phases
    ((1, 8, 20, 20), (16, 8, 3, 3), (2, 2), (0, 0, 1, 1), None),  # padding at the end only
    ((2, 4, 31, 29), (6, 4, 5, 5), (3, 3), (2, 1, 2, 0), None),  # stride 3, asymmetric pads, a batch
    ((1, 3, 33, 35), (8, 3, 7, 7), (2, 2), (3, 3, 3, 3), None),  # a 7x7 stem
    ((1, 4, 24, 24), (8, 4, 3, 3), (2, 1), (1, 1, 1, 1), None),  # strided along the rows only
    ((1, 4, 24, 24), (8, 4, 3, 3), (1, 2), (1, 1, 1, 1), None),  # along the columns only
    ((1, 3, 30, 30), (8, 3, 3, 3), (2, 2), (2, 2, 2, 2), (2, 2)),  # dilated
    ((1, 2, 17, 17), (4, 2, 2, 2), (2, 2), (0, 0, 0, 0), None),  # an even kernel, no padding
])
def test_strided_convolutions_match_onnxruntime(phase_calls, x_shape, w_shape, strides, pads, dilations):
    model = _conv_model(x_shape, w_shape, strides=strides, pads=pads, dilations=dilations)
    x = np.random.default_rng(0).standard_normal(x_shape).astype(np.float32)
    got, want = _run_both(model, {"x": x})
    assert phase_calls, "the phase path did not run"
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("bias", [None, "input"])
def test_no_bias_and_a_bias_fed_at_run_time(phase_calls, bias):
    model = _conv_model((1, 3, 26, 26), (8, 3, 3, 3), strides=(2, 2), pads=(1, 1, 1, 1), bias=bias)
    sess = onnxrt.InferenceSession(model, providers=["CPUExecutionProvider"])
    ref = rt.InferenceSession(model, providers=["CPUExecutionProvider"])
    x = np.random.default_rng(1).standard_normal((1, 3, 26, 26)).astype(np.float32)
    for seed in (2, 3):  # new bias values in each run are not taken from the last
        feeds = {"x": x}
        if bias == "input":
            feeds["b"] = np.random.default_rng(seed).standard_normal(8).astype(np.float32)
        np.testing.assert_allclose(sess.run(None, feeds)[0], ref.run(None, feeds)[0], rtol=1e-5, atol=1e-5)
    assert len(phase_calls) == 2


def test_residual_and_activation_of_a_fused_convolution(phase_calls):
    model = _conv_model((2, 3, 34, 34), (8, 3, 3, 3), strides=(2, 2), pads=(1, 1, 1, 1), relu=True,
                        residual=(2, 8, 17, 17))
    rng = np.random.default_rng(4)
    feeds = {"x": rng.standard_normal((2, 3, 34, 34)).astype(np.float32),
             "z": rng.standard_normal((2, 8, 17, 17)).astype(np.float32)}
    sess = onnxrt.InferenceSession(model, providers=["CPUExecutionProvider"])
    assert any(r["op_type"] == "FusedConv" for r in sess.get_provider_assignment())
    got = sess.run(None, feeds)[0]
    want = rt.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    assert phase_calls
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert (got >= 0).all()


def test_bands_cover_a_map_taller_than_one_band(phase_calls, monkeypatch):
    # bands of a few output rows: every band's taps start at its own rows of the phases
    monkeypatch.setattr(phases, "_PHASE_BAND_ELEMS", 600)
    model = _conv_model((1, 3, 45, 40), (8, 3, 3, 3), strides=(2, 2), pads=(1, 1, 1, 1), relu=True)
    x = np.random.default_rng(5).standard_normal((1, 3, 45, 40)).astype(np.float32)
    got, want = _run_both(model, {"x": x})
    assert phase_calls
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("x_shape, w_shape, strides, pads", [
    ((2, 3, 50), (4, 3, 5), (2,), (2, 1)),  # 1-D
    ((1, 2, 9, 10, 11), (4, 2, 3, 3, 3), (2, 2, 2), (1, 1, 1, 1, 1, 1)),  # 3-D
])
def test_one_and_three_dimensional_maps(phase_calls, x_shape, w_shape, strides, pads):
    model = _conv_model(x_shape, w_shape, strides=strides, pads=pads)
    x = np.random.default_rng(6).standard_normal(x_shape).astype(np.float32)
    got, want = _run_both(model, {"x": x})
    assert phase_calls
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_more_output_channels_than_taps_keep_the_banded_im2col(phase_calls):
    # 3 -> 64 channels with a 3x3 kernel (27 taps): the cropping copy would cost more
    model = _conv_model((1, 3, 30, 30), (64, 3, 3, 3), strides=(2, 2), pads=(1, 1, 1, 1))
    x = np.random.default_rng(8).standard_normal((1, 3, 30, 30)).astype(np.float32)
    got, want = _run_both(model, {"x": x})
    assert not phase_calls
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_float64_against_the_reference_evaluator(phase_calls):
    # onnxruntime has no float64 Conv kernel on the CPU
    rng = np.random.default_rng(9)
    w = numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)), "w")
    node = helper.make_node("Conv", ["x", "w"], ["y"], strides=[2, 2], pads=[1, 1, 1, 1])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.DOUBLE, [1, 3, 33, 30])],
                              [helper.make_tensor_value_info("y", TensorProto.DOUBLE, None)], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    x = rng.standard_normal((1, 3, 33, 30))
    got = onnxrt.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    want = ReferenceEvaluator(model).run(None, {"x": x})[0]
    assert phase_calls == [(1, 3, 33, 30)] and got.dtype == np.float64
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("x_shape, w_shape, strides", [
    ((1, 1, 32, 64), (64, 1, 16, 16), (10, 10)),  # an audio spectrogram transformer's patches
    ((1, 3, 64, 64), (64, 3, 16, 16), (16, 16)),  # a vision transformer's, on a small image
])
def test_patch_embeddings_take_one_strided_gather_not_the_phases(monkeypatch, x_shape, w_shape, strides):
    """Strides of 10 or 16 would split the input into 100 or 256 phases, a copy call
    each (a 2 x 4 output took 1.1 ms); past _MAX_PHASES the banded im2col gathers the
    patches in one strided copy."""
    calls = []
    real = forward.conv_phases
    monkeypatch.setattr(forward, "conv_phases", lambda *a, **k: calls.append(1) or real(*a, **k))
    # weights scaled by 1 / sqrt(fan-in), as trained layers are: with unit weights a
    # 768-term sum of values near 30 carries float32 rounding of 2e-5 in either runtime
    fan_in = int(np.prod(w_shape[1:]))
    model = _conv_model(x_shape, w_shape, strides=strides, pads=(0, 0, 0, 0), w_std=fan_in ** -0.5)
    x = np.random.default_rng(0).standard_normal(x_shape).astype(np.float32)
    got, want = _run_both(model, {"x": x})
    assert not calls
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
