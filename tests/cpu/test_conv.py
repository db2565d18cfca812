"""The CPU provider's convolutions, as a specification: every algorithm of
``onnxrt_cpu.conv`` against onnxruntime (and the reference evaluator for float64),
and that each layer takes the path it is meant to.

Sections: the banded im2col on column phases (stride 2 along the rows); stride
phases (strided layers with few channels); every numpy lowering (pointwise, bands,
the row pitch, grouped, depthwise, channels last, 1-D and 3-D, FusedConv, biases
constant or fed, weights fed); grouped convolutions of small maps; the compiled
kernels (im2col tiles, the direct kernel, Winograd, depthwise; bias, residual,
activations; float64; NaN and infinities); the integer convolutions (channels-last
rows, exact accumulation, the 8-bit kernels); errors (the named geometry, limits).
Tests of the numpy paths run with the compiled kernels set aside (``numpy_paths``);
the compiled kernels' own are checked against them.
"""

from __future__ import annotations

import collections

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import onnxrt as ort
from onnxrt_cpu import native, parallel
from onnxrt_cpu.conv import bands, buffers, channels_last, forward, packing, phases
from tests.cpu.conv_cases import GEOMETRIES, Counting, conv_feeds, conv_model, make_model, needs_native, run, \
    small_conv_model
from tests.ort_oracle import int8_weight_range, u8s8_pairs_saturate

rt = pytest.importorskip("onnxruntime")

#: The numpy paths alone: the compiled kernels set aside, as where they were not built.
numpy_paths = pytest.mark.usefixtures("numpy_kernels")


# -- The banded im2col on column phases (stride 2 along the rows) ----------------------------------------------------


def _column_model(x_shape, w_shape, *, strides, pads, dilations=(1, 1), group=1, dtype=TensorProto.FLOAT, relu=False):
    rng = np.random.default_rng(11)
    np_type = np.float64 if dtype == TensorProto.DOUBLE else np.float32
    inits = [numpy_helper.from_array(rng.standard_normal(w_shape).astype(np_type), "w"),
             numpy_helper.from_array(rng.standard_normal(w_shape[0]).astype(np_type), "b")]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], strides=list(strides), pads=list(pads),
                              dilations=list(dilations), group=group, kernel_shape=list(w_shape[2:]))]
    nodes.append(helper.make_node("Relu" if relu else "Identity", ["c"], ["y"]))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", dtype, list(x_shape))],
                              [helper.make_tensor_value_info("y", dtype, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8).SerializeToString()


@pytest.fixture
def split_calls(monkeypatch):
    """The input shapes each call of ``_column_phases`` split (so a test knows the
    path ran)."""
    calls = []
    real = bands.column_phases
    monkeypatch.setattr(bands, "column_phases", lambda x, *a, **k: calls.append(x.shape) or real(x, *a, **k))
    monkeypatch.setattr(forward, "_GROUPED_ELEMS", 0)  # grouped layers here take the banded path too
    return calls


def _run_on_x(model, x, threads=1):
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    return ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


COLUMN_CASES = [
    # x shape, w shape, strides, pads (top, left, bottom, right), dilations, group
    ((1, 3, 30, 30), (64, 3, 3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 1),  # a 3x3 stem, even width
    ((1, 3, 31, 29), (40, 3, 3, 3), (2, 2), (1, 0, 1, 2), (1, 1), 1),  # odd sizes, asymmetric pads
    ((1, 3, 33, 35), (160, 3, 7, 7), (2, 2), (3, 3, 3, 3), (1, 1), 1),  # a 7x7 stem
    ((1, 3, 27, 27), (64, 3, 4, 4), (2, 2), (0, 0, 0, 0), (1, 1), 1),  # an even kernel, no padding
    ((1, 4, 20, 26), (48, 4, 3, 3), (1, 2), (1, 1, 1, 1), (1, 1), 1),  # strided along the rows only
    ((1, 4, 25, 24), (48, 4, 3, 3), (2, 2), (2, 1, 2, 1), (2, 1), 1),  # dilated across the rows
    ((1, 4, 19, 22), (48, 4, 1, 3), (1, 2), (0, 1, 0, 1), (1, 1), 1),  # three taps along the row
    ((1, 4, 30, 31), (48, 4, 5, 1), (2, 2), (2, 0, 2, 0), (1, 1), 1),  # one tap along the row: one phase read
    ((1, 8, 18, 18), (16, 4, 3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 2),  # two groups
    ((1, 16, 28, 28), (160, 16, 3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 1),  # more channels out than taps
]


@numpy_paths
@pytest.mark.parametrize("x_shape, w_shape, strides, pads, dilations, group", COLUMN_CASES)
def test_equal_to_the_strided_gather_and_to_onnxruntime(split_calls, monkeypatch, x_shape, w_shape, strides, pads,
                                                        dilations, group):
    model = _column_model(x_shape, w_shape, strides=strides, pads=pads, dilations=dilations, group=group)
    x = np.random.default_rng(0).standard_normal(x_shape).astype(np.float32)
    got = _run_on_x(model, x)
    assert split_calls, "the column phases were not used"
    monkeypatch.setattr(forward, "_COLUMN_PHASES", False)
    calls = len(split_calls)
    plain = _run_on_x(model, x)
    assert len(split_calls) == calls
    np.testing.assert_array_equal(got, plain)
    want = rt.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@numpy_paths
def test_few_output_channels_take_the_column_phases_too(split_calls, monkeypatch):
    # a detector's stem, fewer output channels than taps: the banded im2col on the
    # column phases, not the stride phases with their cropping copy
    phase_path = []
    real = forward.conv_phases
    monkeypatch.setattr(forward, "conv_phases", lambda *a, **k: phase_path.append(1) or real(*a, **k))
    model = _column_model((1, 3, 40, 38), (8, 3, 3, 3), strides=(2, 2), pads=(1, 1, 1, 1), relu=True)
    x = np.random.default_rng(4).standard_normal((1, 3, 40, 38)).astype(np.float32)
    got = _run_on_x(model, x)
    assert split_calls and not phase_path
    want = rt.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # stride 3 along the row keeps the stride phases
    model = _column_model((1, 3, 40, 38), (8, 3, 3, 3), strides=(3, 3), pads=(1, 1, 1, 1))
    got = _run_on_x(model, x)
    assert phase_path and len(split_calls) == 1
    want = rt.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@numpy_paths
def test_bands_of_a_batch_and_both_threads(split_calls, monkeypatch):
    # bands of a few output rows each (every band's taps start at its own rows of the
    # phases), two images, and the bands shared by two threads
    monkeypatch.setattr(bands, "BAND_ELEMS", 2000)
    monkeypatch.setattr(parallel, "PARALLEL_MIN_FLOPS", 1)
    model = _column_model((2, 3, 41, 38), (32, 3, 5, 5), strides=(2, 2), pads=(2, 2, 2, 1), relu=True)
    x = np.random.default_rng(1).standard_normal((2, 3, 41, 38)).astype(np.float32)
    got = _run_on_x(model, x, threads=2)
    assert split_calls
    want = rt.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert (got >= 0).all()


@numpy_paths
def test_float64_column_phases_against_the_reference_evaluator(split_calls):
    # onnxruntime has no float64 Conv kernel on the CPU
    model = _column_model((1, 3, 29, 30), (40, 3, 3, 3), strides=(2, 2), pads=(1, 1, 0, 1), dtype=TensorProto.DOUBLE)
    x = np.random.default_rng(2).standard_normal((1, 3, 29, 30))
    got = _run_on_x(model, x)
    assert split_calls and got.dtype == np.float64
    want = ReferenceEvaluator(model).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


@numpy_paths
@pytest.mark.parametrize("w_shape, strides", [
    ((48, 4, 1, 1), (2, 2)),  # a 1x1 shortcut reads a quarter of the input: no split
    ((48, 4, 5, 5), (4, 4)),  # stride 4: a copy call per phase costs more than it saves
])
def test_layers_that_keep_the_strided_gather(split_calls, w_shape, strides):
    model = _column_model((1, 4, 30, 30), w_shape, strides=strides, pads=(0, 0, 0, 0))
    x = np.random.default_rng(3).standard_normal((1, 4, 30, 30)).astype(np.float32)
    got = _run_on_x(model, x)
    assert not split_calls
    want = rt.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@numpy_paths
@pytest.mark.parametrize("shape, pb, pe", [
    ((1, 2, 5, 7), (1, 2), (0, 1)),
    ((2, 1, 4, 6), (0, 0), (2, 0)),
    ((1, 1, 3, 5), (2, 3), (1, 3)),
])
def test_the_split_holds_every_padded_column_in_its_phase(shape, pb, pe):
    x = np.arange(np.prod(shape), dtype=np.float32).reshape(shape) + 1
    q = bands.column_phases(x, pb, pe, 2, -1.0)
    padded = np.pad(x, ((0, 0), (0, 0), (pb[0], pe[0]), (pb[1], pe[1])), constant_values=-1.0)
    wp = padded.shape[3]
    for b in range(2):
        count = len(range(b, wp, 2))
        np.testing.assert_array_equal(q[:, :, :, b, :count], padded[..., b::2])


# -- Stride phases (strided layers with few channels) ----------------------------------------------------------------


def _phase_model(x_shape, w_shape, *, strides, pads, dilations=None, bias="constant", relu=False, residual=None,
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
    got = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    want = rt.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    return got, want


@pytest.fixture
def phase_calls(monkeypatch):
    """The images each call of the phase path convolved (so a test knows it ran).
    Batches of small maps take the channels-last path (``conv_rows``) first; its
    budget set to nothing, they take the phases too. Layers with stride 2 along the
    row take the banded im2col on their column phases (``bands.column_phases``, the
    section above); with those off, they take the phase path as every other stride
    does."""
    monkeypatch.setattr(bands, "BAND_ELEMS", 0)
    monkeypatch.setattr(forward, "_COLUMN_PHASES", False)
    calls = []
    real = forward.conv_phases

    def spy(x, *args, **kwargs):
        calls.append(x.shape)
        return real(x, *args, **kwargs)

    monkeypatch.setattr(forward, "conv_phases", spy)
    return calls


@numpy_paths
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
    model = _phase_model(x_shape, w_shape, strides=strides, pads=pads, dilations=dilations)
    x = np.random.default_rng(0).standard_normal(x_shape).astype(np.float32)
    got, want = _run_both(model, {"x": x})
    assert phase_calls, "the phase path did not run"
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@numpy_paths
@pytest.mark.parametrize("bias", [None, "input"])
def test_no_bias_and_a_bias_fed_at_run_time(phase_calls, bias):
    model = _phase_model((1, 3, 26, 26), (8, 3, 3, 3), strides=(2, 2), pads=(1, 1, 1, 1), bias=bias)
    sess = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    ref = rt.InferenceSession(model, providers=["CPUExecutionProvider"])
    x = np.random.default_rng(1).standard_normal((1, 3, 26, 26)).astype(np.float32)
    for seed in (2, 3):  # new bias values in each run are not taken from the last
        feeds = {"x": x}
        if bias == "input":
            feeds["b"] = np.random.default_rng(seed).standard_normal(8).astype(np.float32)
        np.testing.assert_allclose(sess.run(None, feeds)[0], ref.run(None, feeds)[0], rtol=1e-5, atol=1e-5)
    assert len(phase_calls) == 2


@numpy_paths
def test_residual_and_activation_of_a_fused_convolution(phase_calls):
    model = _phase_model((2, 3, 34, 34), (8, 3, 3, 3), strides=(2, 2), pads=(1, 1, 1, 1), relu=True,
                        residual=(2, 8, 17, 17))
    rng = np.random.default_rng(4)
    feeds = {"x": rng.standard_normal((2, 3, 34, 34)).astype(np.float32),
             "z": rng.standard_normal((2, 8, 17, 17)).astype(np.float32)}
    sess = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    assert any(r["op_type"] == "FusedConv" for r in sess.get_provider_assignment())
    got = sess.run(None, feeds)[0]
    want = rt.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    assert phase_calls
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert (got >= 0).all()


@numpy_paths
def test_bands_cover_a_map_taller_than_one_band(phase_calls, monkeypatch):
    # bands of a few output rows: every band's taps start at its own rows of the phases
    monkeypatch.setattr(phases, "_PHASE_BAND_ELEMS", 600)
    model = _phase_model((1, 3, 45, 40), (8, 3, 3, 3), strides=(2, 2), pads=(1, 1, 1, 1), relu=True)
    x = np.random.default_rng(5).standard_normal((1, 3, 45, 40)).astype(np.float32)
    got, want = _run_both(model, {"x": x})
    assert phase_calls
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@numpy_paths
@pytest.mark.parametrize("x_shape, w_shape, strides, pads", [
    ((2, 3, 50), (4, 3, 5), (2,), (2, 1)),  # 1-D
    ((1, 2, 9, 10, 11), (4, 2, 3, 3, 3), (2, 2, 2), (1, 1, 1, 1, 1, 1)),  # 3-D
])
def test_one_and_three_dimensional_maps(phase_calls, x_shape, w_shape, strides, pads):
    model = _phase_model(x_shape, w_shape, strides=strides, pads=pads)
    x = np.random.default_rng(6).standard_normal(x_shape).astype(np.float32)
    got, want = _run_both(model, {"x": x})
    assert phase_calls
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@numpy_paths
def test_more_output_channels_than_taps_keep_the_banded_im2col(phase_calls):
    # 3 -> 64 channels with a 3x3 kernel (27 taps): the cropping copy would cost more
    model = _phase_model((1, 3, 30, 30), (64, 3, 3, 3), strides=(2, 2), pads=(1, 1, 1, 1))
    x = np.random.default_rng(8).standard_normal((1, 3, 30, 30)).astype(np.float32)
    got, want = _run_both(model, {"x": x})
    assert not phase_calls
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@numpy_paths
def test_float64_stride_phases_against_the_reference_evaluator(phase_calls):
    # onnxruntime has no float64 Conv kernel on the CPU
    rng = np.random.default_rng(9)
    w = numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)), "w")
    node = helper.make_node("Conv", ["x", "w"], ["y"], strides=[2, 2], pads=[1, 1, 1, 1])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.DOUBLE, [1, 3, 33, 30])],
                              [helper.make_tensor_value_info("y", TensorProto.DOUBLE, None)], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    x = rng.standard_normal((1, 3, 33, 30))
    got = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    want = ReferenceEvaluator(model).run(None, {"x": x})[0]
    assert phase_calls == [(1, 3, 33, 30)] and got.dtype == np.float64
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


@numpy_paths
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
    model = _phase_model(x_shape, w_shape, strides=strides, pads=(0, 0, 0, 0), w_std=fan_in ** -0.5)
    x = np.random.default_rng(0).standard_normal(x_shape).astype(np.float32)
    got, want = _run_both(model, {"x": x})
    assert not calls
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


# -- Every numpy lowering (pointwise, bands, row pitch, grouped, depthwise, channels last, 1-D and 3-D) --------------


# (name, input shape, weight shape, attributes). The 2-thread runs lower
# parallel.PARALLEL_MIN_FLOPS so that every case takes the parallel branches.
CONVS = [
    ("1x1", (1, 64, 40, 40), (96, 64, 1, 1), {}),
    ("1x1-batch", (3, 32, 20, 20), (48, 32, 1, 1), {}),
    ("1x1-stride2", (1, 32, 33, 33), (64, 32, 1, 1), {"strides": [2, 2]}),
    ("3x3-bands", (1, 32, 64, 64), (48, 32, 3, 3), {"pads": [1, 1, 1, 1]}),
    ("3x3-deep-one-band", (1, 256, 7, 7), (256, 256, 3, 3), {"pads": [1, 1, 1, 1]}),
    ("5x5-stride2-asym", (2, 8, 37, 30), (16, 8, 5, 5), {"pads": [2, 1, 0, 2], "strides": [2, 2]}),
    ("dilated", (1, 16, 30, 30), (32, 16, 3, 3), {"dilations": [2, 2], "pads": [2, 1, 2, 3]}),
    # output rows as wide as the input's: taps gathered on the input's own row pitch
    ("rows-stride2x1", (1, 8, 21, 17), (16, 8, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 1]}),
    ("rows-left-pad-only", (2, 6, 11, 9), (10, 6, 2, 3), {"pads": [1, 2, 0, 0]}),
    ("grouped", (2, 32, 24, 24), (64, 8, 3, 3), {"group": 4, "pads": [1, 1, 1, 1]}),
    ("grouped-1x1", (2, 32, 10, 10), (48, 8, 1, 1), {"group": 4}),
    ("depthwise", (1, 96, 56, 56), (96, 1, 3, 3), {"group": 96, "pads": [1, 1, 1, 1]}),
    ("depthwise-stride2", (2, 48, 57, 56), (48, 1, 3, 3), {"group": 48, "pads": [1, 1, 1, 1], "strides": [2, 2]}),
    ("depthwise-5x5-s2-dil", (1, 24, 41, 40), (24, 1, 5, 5),
     {"group": 24, "pads": [3, 4, 4, 3], "strides": [2, 3], "dilations": [2, 1]}),
    ("depthwise-same-lower", (1, 16, 31, 32), (16, 1, 4, 4), {"group": 16, "auto_pad": "SAME_LOWER", "strides": [2, 2]}),
    # without a bias (no row of ones), and a 3-D one whose phases' taps are 3-D grids
    ("depthwise-stride2-no-bias", (1, 10, 40, 41), (10, 1, 3, 3), {"group": 10, "pads": [1, 1, 1, 1], "strides": [2, 2],
                                                                   "bias": False}),
    ("depthwise-3d-stride2", (1, 12, 9, 10, 11), (12, 1, 3, 3, 3), {"group": 12, "pads": [1] * 6, "strides": [2, 2, 2]}),
    # stride 1, output rows as wide as the input's: the taps read on the input's own row pitch
    ("depthwise-rows-asym", (2, 20, 9, 11), (20, 1, 3, 5), {"group": 20, "pads": [0, 4, 2, 0]}),
    ("depthwise-rows-dilated", (1, 24, 10, 6), (24, 1, 3, 3), {"group": 24, "pads": [2, 3, 2, 1], "dilations": [2, 2]}),
    ("depthwise-rows-narrow", (1, 8, 5, 2), (8, 1, 5, 5), {"group": 8, "pads": [2, 2, 2, 2]}),
    ("depthwise-rows-blocks", (1, 200, 40, 40), (200, 1, 3, 3), {"group": 200, "auto_pad": "SAME_UPPER"}),
    # small maps, many channels or strided: channels last, one einsum over a strided view
    ("depthwise-last-7x7", (2, 160, 7, 7), (160, 1, 3, 3), {"group": 160, "pads": [1, 1, 1, 1]}),
    ("depthwise-last-s2-dil-asym", (1, 64, 13, 12), (64, 1, 5, 5),
     {"group": 64, "pads": [2, 3, 1, 0], "strides": [2, 1], "dilations": [1, 2]}),
    ("depthwise-last-same-lower", (1, 16, 15, 16), (16, 1, 4, 4),
     {"group": 16, "auto_pad": "SAME_LOWER", "strides": [2, 2]}),
    ("depthwise-last-unpadded-no-bias", (1, 300, 8, 8), (300, 1, 3, 3), {"group": 300, "bias": False}),
    # batches of small images: channels-last im2col of several images per product
    ("batch-stem-7x7-s2", (8, 3, 64, 64), (16, 3, 7, 7), {"pads": [3, 3, 3, 3], "strides": [2, 2]}),
    ("batch-3x3", (8, 16, 16, 16), (32, 16, 3, 3), {"pads": [1, 1, 1, 1]}),
    ("batch-3x3-s2-dil-rows", (5, 12, 19, 17), (24, 12, 3, 3),
     {"pads": [2, 0, 1, 2], "strides": [2, 1], "dilations": [2, 1]}),
    ("batch-many-blocks", (64, 8, 24, 24), (16, 8, 3, 3), {"pads": [1, 1, 1, 1]}),
    # up to 16 output channels and an even output width: two outputs per im2col row
    ("batch-paired-dil-rows", (3, 6, 13, 14), (12, 6, 3, 3), {"pads": [1, 1, 2, 1], "dilations": [2, 1]}),
    ("batch-odd-width", (3, 4, 9, 9), (8, 4, 3, 3), {}),
    ("conv1d", (2, 16, 500), (32, 16, 5), {"pads": [2, 2]}),
    ("conv1d-depthwise", (1, 32, 300), (32, 1, 7), {"group": 32, "strides": [3]}),
    ("conv3d", (1, 8, 10, 12, 12), (16, 8, 3, 3, 3), {"pads": [1, 1, 1, 1, 1, 1], "strides": [1, 2, 2]}),
]


@numpy_paths
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("name,x_shape,w_shape,attrs", CONVS, ids=[c[0] for c in CONVS])
def test_conv_paths_match_onnxruntime(name, x_shape, w_shape, attrs, threads, monkeypatch):
    if threads > 1:
        monkeypatch.setattr(parallel, "PARALLEL_MIN_FLOPS", 1 << 14)
    model = small_conv_model(x_shape, w_shape, **attrs).SerializeToString()
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    sess = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    ref = rt.InferenceSession(model, providers=["CPUExecutionProvider"])
    x = np.random.default_rng(1).standard_normal(x_shape).astype(np.float32)
    got, = sess.run(None, {"x": x})
    want, = ref.run(None, {"x": x})
    assert got.shape == want.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    # the per-thread scratch buffers are reused: a second run with other data is right too
    x2 = np.random.default_rng(2).standard_normal(x_shape).astype(np.float32)
    np.testing.assert_allclose(sess.run(None, {"x": x2})[0], ref.run(None, {"x": x2})[0], rtol=1e-4, atol=1e-4)


@numpy_paths
@pytest.mark.parametrize("name", [c[0] for c in CONVS if c[0].startswith("depthwise")])
def test_depthwise_runs_channels_last_on_small_maps_only(name, monkeypatch):
    """The cases named ``depthwise-last-*`` take the channels-last path, and the other
    depthwise cases keep the gathered taps (so both stay covered above)."""
    _, x_shape, w_shape, attrs = next(c for c in CONVS if c[0] == name)
    calls = []
    original = channels_last.depthwise_channels_last
    monkeypatch.setattr(channels_last, "depthwise_channels_last",
                        lambda *a, **k: calls.append(1) or original(*a, **k))
    sess = ort.InferenceSession(small_conv_model(x_shape, w_shape, **attrs).SerializeToString(),
                                providers=["CPUExecutionProvider"])
    sess.run(None, {"x": np.zeros(x_shape, np.float32)})
    assert bool(calls) == name.startswith("depthwise-last")


FUSED = [
    # a batch of small images: channels-last product, transposed back, then finished
    ("batch-3x3", (6, 16, 12, 12), 3, 1),
    # one image, 1x1: the split product applies bias, residual and Relu part by part
    ("1x1-split-rows", (1, 64, 4, 4), 1, 1),
    ("1x1-split-cols", (1, 16, 40, 40), 1, 1),
    # one image in one band: the split product again
    ("3x3-one-band", (1, 64, 7, 7), 3, 1),
    # grouped 1x1: one batched product over the groups, finished per image
    ("1x1-grouped", (2, 24, 9, 9), 1, 4),
    # depthwise: the bias rides in the product, the residual and Relu follow
    ("depthwise", (2, 40, 14, 14), 3, 40),
    # depthwise channels last: bias added to the channels-last result, then the rest
    ("depthwise-channels-last", (2, 200, 7, 7), 3, 200),
]


@numpy_paths
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("name,x_shape,k,group", FUSED, ids=[f[0] for f in FUSED])
def test_fused_conv_matches_onnxruntime(name, x_shape, k, group, threads, monkeypatch):
    """Conv + residual Add + Relu fused (ORT_ENABLE_ALL): bias, residual and activation
    are applied after the product on every path, by the thread that made each part."""
    if threads > 1:
        monkeypatch.setattr(parallel, "PARALLEL_MIN_FLOPS", 1 << 12)
    rng = np.random.default_rng(0)
    c = x_shape[1]
    w = (rng.standard_normal((c, c // group, k, k)) / (3 * k)).astype(np.float32)
    b = rng.standard_normal(c).astype(np.float32)
    p = k // 2
    model = make_model(
        [
            helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[p, p, p, p], group=group),
            helper.make_node("Add", ["c", "x"], ["s"]),
            helper.make_node("Relu", ["s"], ["y"]),
        ],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
    ).SerializeToString()
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    sess = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    assert any(r["op_type"] == "FusedConv" for r in sess.get_provider_assignment())
    x = rng.standard_normal(x_shape).astype(np.float32)
    want, = rt.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], want, rtol=1e-4, atol=1e-4)


@numpy_paths
@pytest.mark.parametrize("hw", [(28, 28), (112, 112)], ids=["one-thread", "split"])
@pytest.mark.parametrize("residual", [False, True])
def test_expanding_1x1_conv_with_bias_in_the_product_matches_onnxruntime(residual, hw, monkeypatch):
    """A 1x1 convolution to more channels than it reads carries its bias as one more
    input row of ones; the residual and activation still follow (on each thread's
    part when the product is split), and a bias fed at run time (a new array each
    run) is the one used."""
    rng = np.random.default_rng(3)
    c, m = 24, 144
    split = hw == (112, 112)
    assert (c * m * hw[0] * hw[1] >= parallel.PARALLEL_MIN_FLOPS) == split
    w = (rng.standard_normal((m, c, 1, 1)) / np.sqrt(c)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"])]
    inputs = [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, *hw]),
        helper.make_tensor_value_info("b", TensorProto.FLOAT, [m]),
    ]
    last = "c"
    if residual:
        nodes.append(helper.make_node("Add", ["c", "z"], ["s"]))
        inputs.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, m, *hw]))
        last = "s"
    nodes.append(helper.make_node("Clip", [last, "lo", "hi"], ["y"]))
    inits = [
        numpy_helper.from_array(w, "w"),
        numpy_helper.from_array(np.array(0, np.float32), "lo"),
        numpy_helper.from_array(np.array(6, np.float32), "hi"),
    ]
    model = make_model(nodes, inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = model.SerializeToString()
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    sess = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    assert any(r["op_type"] == "FusedConv" for r in sess.get_provider_assignment())
    ref = rt.InferenceSession(model, providers=["CPUExecutionProvider"])
    parts = []
    original = parallel.parallel_for

    def spy(count, fn, threads=None):
        parts.append(count)
        return original(count, fn, threads)

    monkeypatch.setattr(parallel, "parallel_for", spy)
    for seed in (4, 5):
        r = np.random.default_rng(seed)
        feeds = {"x": (3 * r.standard_normal((1, c, *hw))).astype(np.float32),
                 "b": (3 * r.standard_normal(m)).astype(np.float32)}
        if residual:
            feeds["z"] = r.standard_normal((1, m, *hw)).astype(np.float32)
        got, = sess.run(None, feeds)
        want, = ref.run(None, feeds)
        assert 0 < (got == 6).mean() < 0.5 and 0 < (got == 0).mean() < 0.9  # both bounds bite
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert bool(parts) == split  # the product was split exactly when it is large enough


@numpy_paths
@pytest.mark.parametrize("x_shape,strides", [((1, 24, 30, 30), [1, 1]), ((1, 24, 41, 40), [2, 2])],
                         ids=["rows", "phases"])
def test_depthwise_constant_bias_folded_once(x_shape, strides, monkeypatch):
    """The depthwise weight with its constant bias as one more tap is built on the
    first run and kept, not rebuilt on every run."""
    rng = np.random.default_rng(6)
    c = x_shape[1]
    w = (rng.standard_normal((c, 1, 3, 3)) / 3).astype(np.float32)
    b = rng.standard_normal(c).astype(np.float32)
    model = make_model([helper.make_node("Conv", ["x", "w", "b"], ["y"], group=c, pads=[1, 1, 1, 1],
                                         strides=strides)],
                       [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                       [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")]).SerializeToString()
    folded = []
    original = packing.ConvWeights.depthwise_taps

    def spy(self, *args):
        result = original(self, *args)
        folded.append(result[0])
        return result

    monkeypatch.setattr(packing.ConvWeights, "depthwise_taps", spy)
    sess = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    x = rng.standard_normal(x_shape).astype(np.float32)
    want, = rt.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    for _ in range(2):
        np.testing.assert_allclose(sess.run(None, {"x": x})[0], want, rtol=1e-5, atol=1e-5)
    assert len(folded) == 2 and folded[0] is folded[1]


@numpy_paths
@pytest.mark.parametrize("x_shape,group,k,strides", [
    ((1, 24, 30, 30), 24, 3, [1, 1]),  # depthwise on the row pitch
    ((1, 24, 41, 40), 24, 3, [2, 2]),  # depthwise through stride phases
    ((1, 24, 28, 28), 1, 1, [1, 1]),  # 1x1 to more channels: the bias as a row of ones
], ids=["depthwise-rows", "depthwise-phases", "1x1-expanding"])
def test_conv_bias_fed_at_run_time_in_the_same_array(x_shape, group, k, strides):
    """A bias fed at run time is folded into the weight afresh on every run: the same
    array holding new values gives the new answer."""
    rng = np.random.default_rng(7)
    c = x_shape[1]
    m = c if group > 1 else 6 * c
    w = (rng.standard_normal((m, c // group, k, k)) / (3 * k)).astype(np.float32)
    p = k // 2
    model = make_model([helper.make_node("Conv", ["x", "w", "b"], ["y"], group=group, pads=[p] * 4, strides=strides)],
                       [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape)),
                        helper.make_tensor_value_info("b", TensorProto.FLOAT, [m])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                       [numpy_helper.from_array(w, "w")]).SerializeToString()
    sess = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    ref = rt.InferenceSession(model, providers=["CPUExecutionProvider"])
    x = rng.standard_normal(x_shape).astype(np.float32)
    bias = np.empty(m, np.float32)
    for seed in (8, 9):
        bias[...] = np.random.default_rng(seed).standard_normal(m)
        np.testing.assert_allclose(sess.run(None, {"x": x, "b": bias})[0], ref.run(None, {"x": x, "b": bias})[0],
                                   rtol=1e-5, atol=1e-5)


@numpy_paths
def test_conv_without_constant_weight_matches_onnxruntime():
    """A weight fed at run time (not prepacked) takes the same paths."""
    model = make_model(
        [helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1], group=2)],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 20, 20]),
         helper.make_tensor_value_info("w", TensorProto.FLOAT, [6, 4, 3, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    ).SerializeToString()
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((1, 8, 20, 20)).astype(np.float32),
             "w": rng.standard_normal((6, 4, 3, 3)).astype(np.float32)}
    got = ort.InferenceSession(model).run(None, feeds)[0]
    want = rt.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


# -- Grouped and depthwise convolutions of small maps ----------------------------------------------------------------


def _grouped_model(x_shape, w_shape, group, strides, pads, dilations, act):
    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array(rng.standard_normal(w_shape).astype(np.float32) * 0.3, "w"),
             numpy_helper.from_array(rng.standard_normal(w_shape[0]).astype(np.float32), "b")]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], group=group, strides=list(strides), pads=list(pads),
                              dilations=list(dilations), kernel_shape=list(w_shape[2:]))]
    nodes.append(helper.make_node(act, ["c"], ["y"]))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8).SerializeToString()


GROUPED_CASES = [
    # x shape, w shape, group, strides, pads, dilations
    ((1, 440, 4, 4), (440, 8, 3, 3), 55, (1, 1), (1, 1, 1, 1), (1, 1)),  # RegNet's many groups of 8
    ((2, 64, 7, 7), (128, 8, 3, 3), 8, (2, 2), (1, 1, 1, 1), (1, 1)),  # a batch, stride 2, more out channels
    ((1, 32, 9, 6), (32, 4, 3, 3), 8, (1, 2), (2, 0, 1, 1), (2, 1)),  # dilated rows, uneven pads and strides
    ((1, 12, 5, 5), (6, 4, 2, 2), 3, (1, 1), (0, 0, 0, 0), (1, 1)),  # fewer out channels than in, no padding
    ((1, 16, 10), (16, 4, 3), 4, (1,), (1, 1), (1,)),  # 1-D
]


@numpy_paths
@pytest.mark.parametrize("act", ["Relu", "Identity"])
@pytest.mark.parametrize("x_shape, w_shape, group, strides, pads, dilations", GROUPED_CASES)
def test_grouped_small_maps_match_onnxruntime(monkeypatch, x_shape, w_shape, group, strides, pads, dilations, act):
    calls = []
    real = forward.conv_grouped
    monkeypatch.setattr(forward, "conv_grouped", lambda *a, **k: calls.append(1) or real(*a, **k))
    model = _grouped_model(x_shape, w_shape, group, strides, pads, dilations, act)
    x = np.random.default_rng(0).standard_normal(x_shape).astype(np.float32)
    got = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    exp = rt.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert calls, "the grouped path did not run"
    assert got.shape == exp.shape
    np.testing.assert_allclose(got, exp, rtol=1e-4, atol=1e-4)


# -- The compiled kernels: im2col tiles, the direct kernel, Winograd's F(2x2, 3x3), depthwise ------------------------


def _gid(g):
    x, w, a = g
    return "x" + "x".join(map(str, x)) + "-w" + "x".join(map(str, w)) + "".join(f"-{k}{''.join(map(str, v)) if isinstance(v, tuple) else v}" for k, v in a.items())


def _expected_kernel(x_shape, w_shape, attrs) -> str:
    """The compiled function a float32 convolution of these shapes goes to (the rules
    of onnxrt_cpu.conv: depthwise, narrow, Winograd, direct, im2col)."""
    group, kernel = attrs.get("group", 1), tuple(w_shape[2:])
    m, c = w_shape[:2]
    if group == x_shape[1] and c == 1:
        return "depthwise2d"
    pads = attrs.get("pads", (0,) * 4)
    taps = int(np.prod(kernel))
    if group == 1 and c * taps <= 32 and not _takes_direct(x_shape, w_shape, attrs) \
            and x_shape[0] * _out_positions(x_shape, w_shape, attrs) >= 64 \
            and not (taps == 1 and "strides" not in attrs and not any(pads)):
        return "narrow_conv2d"
    if kernel == (3, 3) and group == 1 and "strides" not in attrs and "dilations" not in attrs \
            and m * c >= 64 * 64 and min(x_shape[2] + pads[0] + pads[2], x_shape[3] + pads[1] + pads[3]) - 2 >= 12:
        return "winograd3x3"
    return "direct2d" if _takes_direct(x_shape, w_shape, attrs, wide=True) else "conv2d"


def _out_positions(x_shape, w_shape, attrs) -> int:
    nd = len(x_shape) - 2
    pads = attrs.get("pads", (0,) * 2 * nd)
    strides = attrs.get("strides", (1,) * nd)
    dil = attrs.get("dilations", (1,) * nd)
    return int(np.prod([(x_shape[2 + a] + pads[a] + pads[a + nd] - dil[a] * (w_shape[2 + a] - 1) - 1) // strides[a] + 1
                        for a in range(nd)]))


def _takes_direct(x_shape, w_shape, attrs, wide=False) -> bool:
    """Whether a convolution (QLinearConv, or float with ``wide``) goes to the direct
    kernel: reductions of up to 300 on maps of 400 outputs, and for float also of up to
    1200 on maps of 1600 outputs in 4 rows or more, inputs of at most 4M values."""
    m, c = w_shape[:2]
    taps = int(np.prod(w_shape[2:]))
    if attrs.get("group", 1) != 1 or taps == 1 or not (m <= 16 or c >= 8):
        return False
    positions = _out_positions(x_shape, w_shape, attrs)
    if c * taps <= 300:
        return positions >= 400
    return wide and c * taps <= 1200 and positions >= 1600 and _out_rows(x_shape, w_shape, attrs) >= 4 \
        and np.prod(x_shape) <= 4 << 20


def _out_rows(x_shape, w_shape, attrs) -> int:
    """Output rows of a convolution as the compiled kernels see it: 1-D maps, and
    one-column planes by a k x 1 kernel, run as one row."""
    pads = attrs.get("pads", (0,) * 4)
    if len(x_shape) != 4 or (x_shape[3] == 1 and w_shape[3] == 1 and pads[1] == 0):
        return 1
    stride, dil = attrs.get("strides", (1, 1))[0], attrs.get("dilations", (1, 1))[0]
    return (x_shape[2] + pads[0] + pads[2] - dil * (w_shape[2] - 1) - 1) // stride + 1


@needs_native
@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("geometry", GEOMETRIES, ids=[_gid(g) for g in GEOMETRIES])
def test_convolutions_match_the_numpy_paths_and_onnxruntime(geometry, threads, request, monkeypatch):
    x_shape, w_shape, attrs = geometry
    model = conv_model(x_shape, w_shape, **attrs)
    feeds = conv_feeds(model, x_shape, w_shape, "constant", False, np.float32)
    counting = Counting(native.K)
    monkeypatch.setattr(native, "K", counting)
    got = run(model, feeds, threads)
    assert counting.calls == {_expected_kernel(x_shape, w_shape, attrs): 1}
    want = rt.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    request.getfixturevalue("numpy_kernels")
    numpy_path = run(model, feeds, threads)
    np.testing.assert_allclose(got, numpy_path, rtol=1e-5, atol=1e-5)


# (bias, activation, residual): FusedConv's variants and a Conv fed its bias
VARIANTS = [
    ("constant", "Relu", False),
    ("constant", "Clip", False),
    ("constant", "LeakyRelu", False),
    ("input", None, False),
    (None, "Clip", False),
    ("constant", "Relu", True),
    (None, None, True),
]


@needs_native
@pytest.mark.parametrize("bias, act, residual", VARIANTS)
@pytest.mark.parametrize("geometry", [GEOMETRIES[0], GEOMETRIES[20], GEOMETRIES[9], GEOMETRIES[13], GEOMETRIES[15],
                                      GEOMETRIES[27], GEOMETRIES[4]],
                         ids=["1x1", "direct", "rows", "depthwise", "depthwise-last", "winograd", "im2col"])
def test_bias_residual_and_activations_match_onnxruntime(geometry, bias, act, residual):
    x_shape, w_shape, attrs = geometry
    kw = dict(bias=bias, act=act, residual=residual, **attrs)
    model = conv_model(x_shape, w_shape, **kw)
    feeds = conv_feeds(model, x_shape, w_shape, bias, dict(bias=bias, **attrs) if residual else False, np.float32)
    want = rt.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    for threads in (1, 2):
        got = run(model, feeds, threads)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    if act is not None:
        assert (want < 0).any() == (act == "LeakyRelu")  # the activation did something


@needs_native
@pytest.mark.parametrize("geometry", [GEOMETRIES[1], GEOMETRIES[5], GEOMETRIES[11], GEOMETRIES[14], GEOMETRIES[16]],
                         ids=["1x1-batch", "5x5-s2", "grouped", "depthwise-s2", "depthwise-last-5x5"])
def test_float64_matches_the_reference_evaluator(geometry):
    x_shape, w_shape, attrs = geometry
    model = conv_model(x_shape, w_shape, dtype=np.float64, act="Relu", **attrs)
    feeds = conv_feeds(model, x_shape, w_shape, "constant", False, np.float64)
    want = ReferenceEvaluator(model).run(None, feeds)[0]
    for threads in (1, 2):
        got = run(model, feeds, threads)
        assert got.dtype == np.float64
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


@needs_native
def test_nan_and_infinity_pass_through_as_in_numpy():
    """Relu and Clip keep NaN (numpy's maximum and clip do), infinities clip."""
    x_shape, w_shape = (1, 4, 6, 6), (4, 1, 3, 3)
    for act in ("Relu", "Clip"):
        model = conv_model(x_shape, w_shape, group=4, pads=(1, 1, 1, 1), act=act)
        x = np.random.default_rng(0).standard_normal(x_shape).astype(np.float32)
        x[0, 0, 2, 2] = np.nan
        x[0, 1, 3, 3] = np.inf
        x[0, 2, 1, 1] = -np.inf
        want = rt.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
        got = run(model, {"x": x}, 1)
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


# -- Integer convolutions (ConvInteger, QLinearConv): channels-last rows, exact accumulation, 8-bit kernels ----------


def _qlinear_conv(name, x, w_name, y_name, m, k, stride):
    p = k // 2
    return helper.make_node(
        "QLinearConv",
        [x, "s_in", "z_in", w_name, "s_w", "z_w", "s_in", "z_in", f"{w_name}_b"],
        [y_name], name=name, kernel_shape=[k, k], pads=[p] * 4, strides=[stride] * 2,
    )


@numpy_paths
@pytest.mark.parametrize("threads", [1, 2])
def test_quantized_conv_chain_in_channels_last_views_matches_onnxruntime(threads, monkeypatch):
    """QLinearConv on a batch of small images hands on a channels-last view: the
    next QLinearConv reads it without a transposing copy, an elementwise QLinearAdd and
    a Reshape read it as NCHW, and the session's outputs come back C-ordered. The
    stem has 3 channels (copied channel by channel), the rest 16 (one copy)."""
    if threads > 1:
        monkeypatch.setattr(parallel, "PARALLEL_MIN_FLOPS", 1 << 14)
    rng = np.random.default_rng(0)
    inits = [
        helper.make_tensor("s_in", TensorProto.FLOAT, [], [0.05]),
        helper.make_tensor("z_in", TensorProto.UINT8, [], [128]),
        helper.make_tensor("s_w", TensorProto.FLOAT, [], [0.01]),
        helper.make_tensor("z_w", TensorProto.INT8, [], [0]),
    ]
    nodes = []
    for name, cin, m, k, stride, src, dst in [
        ("stem", 3, 16, 7, 2, "x", "a"), ("c1", 16, 16, 3, 1, "a", "b"), ("c2", 16, 16, 1, 1, "b", "c"),
    ]:
        inits.append(numpy_helper.from_array(rng.integers(-60, 60, (m, cin, k, k)).astype(np.int8), f"w_{name}"))
        inits.append(numpy_helper.from_array(rng.integers(-500, 500, m).astype(np.int32), f"w_{name}_b"))
        nodes.append(_qlinear_conv(name, src, f"w_{name}", dst, m, k, stride))
    nodes += [
        helper.make_node("QLinearAdd", ["c", "s_in", "z_in", "a", "s_in", "z_in", "s_in", "z_in"], ["sum"],
                         domain="com.microsoft"),
        helper.make_node("Reshape", ["sum", "flat"], ["y"]),
    ]
    inits.append(numpy_helper.from_array(np.array([8, -1], np.int64), "flat"))
    graph = helper.make_graph(
        nodes, "qchain", [helper.make_tensor_value_info("x", TensorProto.UINT8, [8, 3, 24, 24])],
        [helper.make_tensor_value_info("b", TensorProto.UINT8, None),
         helper.make_tensor_value_info("y", TensorProto.UINT8, None)], inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)],
                              ir_version=10).SerializeToString()
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    sess = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    ref = rt.InferenceSession(model, providers=["CPUExecutionProvider"])
    for seed in (1, 2):
        x = np.random.default_rng(seed).integers(0, 256, (8, 3, 24, 24)).astype(np.uint8)
        got = sess.run(None, {"x": x})
        want = ref.run(None, {"x": x})
        for g, w in zip(got, want):
            assert g.flags.c_contiguous and g.dtype == np.uint8
            np.testing.assert_array_equal(g, w)


@numpy_paths
@pytest.mark.parametrize("threads", [1, 2])
def test_integer_conv_in_row_bands_equals_the_int64_convolution(threads, monkeypatch):
    """ConvInteger on images whose im2col exceeds one cache-sized block: the
    channels-last path gathers and multiplies bands of output rows, claimed by the
    threads, and K (800) is longer than one exact float32 product, so each band sums
    its K chunks in float64. The result equals the int64 convolution exactly."""
    if threads > 1:
        monkeypatch.setattr(parallel, "PARALLEL_MIN_FLOPS", 1 << 14)
    blocks = []
    plan = channels_last.row_blocks

    def spy(*args):
        jobs = plan(*args)
        blocks.extend(jobs)
        return jobs

    monkeypatch.setattr(channels_last, "row_blocks", spy)
    rng = np.random.default_rng(3)
    x = rng.integers(0, 256, (3, 32, 40, 40)).astype(np.uint8)
    x[:, :, ::3] = 255
    w = rng.integers(-128, 128, (8, 32, 5, 5)).astype(np.int8)
    w[0] = -128
    graph = helper.make_graph(
        [helper.make_node("ConvInteger", ["x", "w", "xz"], ["y"], pads=[2, 2, 2, 2])],
        "ci", [helper.make_tensor_value_info("x", TensorProto.UINT8, list(x.shape))],
        [helper.make_tensor_value_info("y", TensorProto.INT32, None)],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.array(3, np.uint8), "xz")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 10)], ir_version=10)
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    got, = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    xi = np.pad(x.astype(np.int64) - 3, ((0, 0), (0, 0), (2, 2), (2, 2)))
    windows = np.lib.stride_tricks.sliding_window_view(xi, (5, 5), axis=(2, 3))  # [n, c, 40, 40, 5, 5]
    cols = windows.transpose(0, 2, 3, 1, 4, 5).reshape(3, 40, 40, -1)
    want = (cols @ w.astype(np.int64).reshape(8, -1).T).transpose(0, 3, 1, 2)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, want)
    # bands of rows of one image each, not whole images, and all of every image
    assert blocks and all(i1 - i0 == 1 and r1 - r0 < 40 for i0, i1, r0, r1 in blocks)
    assert sum(r1 - r0 for _, _, r0, r1 in blocks) == 3 * 40


@numpy_paths
def test_quantized_1x1_conv_reads_its_rows_from_the_input(monkeypatch):
    """An unpadded 1x1 QLinearConv (stride 2 here) takes its rows straight from the
    subsampled input, without an im2col buffer; per-channel weight scales and a bias
    reach every channel; the geometry kept per input shape serves batches of 3, 1 and
    3 again and a new image size. Each run equals onnxruntime's bit for bit."""
    gathers = []
    scratch = buffers.scratch
    monkeypatch.setattr(buffers, "scratch", lambda *a: gathers.append(a) or scratch(*a))
    rng = np.random.default_rng(5)
    m, c = 24, 20
    inits = [
        helper.make_tensor("s_in", TensorProto.FLOAT, [], [0.05]),
        helper.make_tensor("z_in", TensorProto.UINT8, [], [121]),
        numpy_helper.from_array(rng.uniform(0.002, 0.02, m).astype(np.float32), "s_w"),
        numpy_helper.from_array(np.zeros(m, np.int8), "z_w"),
        helper.make_tensor("s_out", TensorProto.FLOAT, [], [0.07]),
        helper.make_tensor("z_out", TensorProto.UINT8, [], [7]),
        numpy_helper.from_array(rng.integers(*int8_weight_range(), (m, c, 1, 1)).astype(np.int8), "w"),
        numpy_helper.from_array(rng.integers(-3000, 3000, m).astype(np.int32), "b"),
    ]
    node = helper.make_node("QLinearConv", ["x", "s_in", "z_in", "w", "s_w", "z_w", "s_out", "z_out", "b"],
                            ["y"], kernel_shape=[1, 1], strides=[2, 2])
    graph = helper.make_graph([node], "q1x1", [helper.make_tensor_value_info("x", TensorProto.UINT8, None)],
                              [helper.make_tensor_value_info("y", TensorProto.UINT8, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10).SerializeToString()
    sess = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    ref = rt.InferenceSession(model, providers=["CPUExecutionProvider"])
    for shape in [(3, c, 15, 16), (1, c, 15, 16), (3, c, 15, 16), (2, c, 9, 7)]:
        x = rng.integers(0, 256, shape).astype(np.uint8)
        got, = sess.run(None, {"x": x})
        want, = ref.run(None, {"x": x})
        assert got.shape == want.shape
        np.testing.assert_array_equal(got, want)
    assert not gathers


@numpy_paths
@pytest.mark.parametrize("shape", [(3, 8, 12, 12), (1, 8, 30, 30)], ids=["batch-rows", "one-image"])
def test_qlinear_conv_bias_fed_at_run_time_in_the_same_array(shape):
    """QLinearConv with its int32 bias fed at run time: the same array holding new
    values (one large enough to leave the float32 accumulator) gives the new answer,
    bit for bit onnxruntime's; nothing derived from a fed bias is kept."""
    rng = np.random.default_rng(8)
    m, c = 16, shape[1]
    inits = [
        helper.make_tensor("s_in", TensorProto.FLOAT, [], [0.05]),
        helper.make_tensor("z_in", TensorProto.UINT8, [], [121]),
        helper.make_tensor("s_w", TensorProto.FLOAT, [], [0.01]),
        helper.make_tensor("z_w", TensorProto.INT8, [], [0]),
        helper.make_tensor("s_out", TensorProto.FLOAT, [], [0.4]),
        helper.make_tensor("z_out", TensorProto.UINT8, [], [128]),
        numpy_helper.from_array(rng.integers(*int8_weight_range(), (m, c, 3, 3)).astype(np.int8), "w"),
    ]
    node = helper.make_node("QLinearConv", ["x", "s_in", "z_in", "w", "s_w", "z_w", "s_out", "z_out", "b"],
                            ["y"], pads=[1, 1, 1, 1])
    graph = helper.make_graph([node], "qbias", [helper.make_tensor_value_info("x", TensorProto.UINT8, None),
                                                helper.make_tensor_value_info("b", TensorProto.INT32, [m])],
                              [helper.make_tensor_value_info("y", TensorProto.UINT8, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10).SerializeToString()
    sess = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    ref = rt.InferenceSession(model, providers=["CPUExecutionProvider"])
    x = rng.integers(0, 256, shape).astype(np.uint8)
    bias = np.empty(m, np.int32)
    for values in (rng.integers(-3000, 3000, m), rng.integers(-3000, 3000, m), np.full(m, 2**25), -np.arange(m) * 700):
        bias[...] = values
        got, = sess.run(None, {"x": x, "b": bias})
        np.testing.assert_array_equal(got, ref.run(None, {"x": x, "b": bias})[0])


def _qconv_model(x_shape, w, *, x_type, y_type, w_scale, bias, xz, yz, **attrs):
    et = {np.uint8: TensorProto.UINT8, np.int8: TensorProto.INT8}
    inits = [numpy_helper.from_array(v, n) for n, v in (
        ("xs", np.array(0.05, np.float32)), ("xz", np.array(xz, x_type)), ("w", w),
        ("ws", np.asarray(w_scale, np.float32)), ("wz", np.zeros(np.asarray(w_scale).shape, np.int8)),
        ("ys", np.array(0.07, np.float32)), ("yz", np.array(yz, y_type)))]
    ins = ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz"]
    if bias is not None:
        inits.append(numpy_helper.from_array(bias, "b"))
        ins.append("b")
    graph = helper.make_graph([helper.make_node("QLinearConv", ins, ["y"], **attrs)], "g",
                              [helper.make_tensor_value_info("x", et[x_type], list(x_shape))],
                              [helper.make_tensor_value_info("y", et[y_type], None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8).SerializeToString()


# (input shape, weight shape, attributes, input type, output type, per-channel scales, bias)
QCONVS = [
    ((8, 3, 32, 32), (16, 3, 7, 7), {"strides": [2, 2], "pads": [3, 3, 3, 3]}, np.uint8, np.uint8, False, True),
    ((2, 3, 64, 64), (16, 3, 7, 7), {"strides": [2, 2], "pads": [3, 3, 3, 3]}, np.uint8, np.uint8, True, True),
    ((2, 16, 14, 14), (32, 16, 3, 3), {"pads": [1, 1, 1, 1]}, np.int8, np.int8, True, True),
    ((2, 16, 24, 24), (32, 16, 3, 3), {"pads": [1, 1, 1, 1]}, np.int8, np.uint8, False, True),
    ((3, 8, 800), (10, 8, 5), {"pads": [2, 2], "strides": [2]}, np.int8, np.int8, True, False),
    ((1, 24, 9, 9), (40, 24, 1, 1), {}, np.uint8, np.int8, True, False),
    ((1, 64, 7, 7), (96, 64, 3, 3), {"pads": [1, 1, 1, 1]}, np.uint8, np.uint8, False, True),  # rows mode
    ((2, 12, 10, 11), (12, 3, 3, 3), {"group": 4, "pads": [0, 1, 2, 1], "dilations": [2, 1]}, np.int8, np.uint8,
     True, True),
    ((3, 8, 40), (10, 8, 5), {"pads": [2, 2], "strides": [2]}, np.uint8, np.uint8, False, True),
]


@needs_native
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("case", QCONVS, ids=[f"q{i}" for i in range(len(QCONVS))])
def test_qlinear_conv_matches_onnxruntime_and_the_numpy_path_exactly(case, threads, request, monkeypatch):
    """Bit for bit: the products are exact integers in float32 and the requantization is
    onnxruntime's (the weights keep within [-64, 63] where onnxruntime's own u8 x s8
    products may saturate in pairs, tests/ort_oracle.py). Mixed input and output types,
    which onnxruntime does not implement, against the numpy path alone."""
    x_shape, w_shape, attrs, x_type, y_type, per_channel, with_bias = case
    rng = np.random.default_rng(11)
    lo, hi = int8_weight_range() if x_type == np.uint8 else (-128, 128)
    w = rng.integers(lo, hi, w_shape).astype(np.int8)
    m = w_shape[0]
    scale = (rng.random(m) * 0.02 + 0.005) if per_channel else 0.01
    bias = rng.integers(-5000, 5000, m).astype(np.int32) if with_bias else None
    info = np.iinfo(x_type)
    xz = (info.max + info.min + 1) // 2 + 3
    yz = 7 if y_type == np.int8 else 120
    model = _qconv_model(x_shape, w, x_type=x_type, y_type=y_type, w_scale=scale, bias=bias, xz=xz, yz=yz, **attrs)
    x = rng.integers(info.min, info.max + 1, x_shape).astype(x_type)
    counting = Counting(native.K)
    monkeypatch.setattr(native, "K", counting)
    got = run(model, {"x": x}, threads, ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    want_kernel = "qconv8" if native.K.igemm_ready() else \
        "qdirect2d" if _takes_direct(x_shape, w_shape, attrs) else "qconv2d"
    calls = {k: v for k, v in counting.calls.items() if not k.endswith("_ready")}  # (the packing asks)
    assert calls == {want_kernel: 1} and got.dtype == y_type
    if x_type == y_type:  # onnxruntime implements no mixed 8-bit types here
        want = rt.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
        np.testing.assert_array_equal(got, want)
    assert len(np.unique(got)) > 20  # neither saturated nor constant
    request.getfixturevalue("numpy_kernels")
    np.testing.assert_array_equal(got, run(model, {"x": x}, threads, ort.GraphOptimizationLevel.ORT_DISABLE_ALL))


def _qconv_reference(x, xz, w, wz, bias, mult, yz, y_type, group, kernel, strides, dil, pads):
    """QLinearConv in int64 (numpy), requantized in float32 as onnxruntime does."""
    n, c, h, wd = x.shape
    m = w.shape[0]
    cg, mg = c // group, m // group
    xp = np.pad(x.astype(np.int64) - xz, ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
    oh = (h + pads[0] + pads[2] - dil[0] * (kernel[0] - 1) - 1) // strides[0] + 1
    ow = (wd + pads[1] + pads[3] - dil[1] * (kernel[1] - 1) - 1) // strides[1] + 1
    wc = w.astype(np.int64) - np.asarray(wz, np.int64).reshape(-1, 1, 1, 1)
    acc = np.zeros((n, m, oh, ow), np.int64)
    for gi in range(group):
        for ky in range(kernel[0]):
            for kx in range(kernel[1]):
                taps = xp[:, gi * cg:(gi + 1) * cg, ky * dil[0]:ky * dil[0] + strides[0] * (oh - 1) + 1:strides[0],
                          kx * dil[1]:kx * dil[1] + strides[1] * (ow - 1) + 1:strides[1]]
                acc[:, gi * mg:(gi + 1) * mg] += np.einsum("mc,nchw->nmhw", wc[gi * mg:(gi + 1) * mg, :, ky, kx], taps)
    v = acc.astype(np.float32)
    if bias is not None:
        v += bias.reshape(1, -1, 1, 1)
    v *= np.broadcast_to(mult, (m,)).reshape(1, -1, 1, 1)
    info = np.iinfo(y_type)
    return np.clip(np.rint(v) + yz, info.min, info.max).astype(y_type)


@needs_native
@pytest.mark.skipif(native.K is None or not native.K.igemm_ready(), reason="no AVX-512 VNNI here")
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_qconv8_is_exact_for_every_geometry_and_type(threads):
    """The 8-bit products against int64 arithmetic and against qconv2d (float32
    products): both bit for bit, over strides, dilations, asymmetric pads, groups,
    channel counts that are not whole blocks of 8, maps that are not whole tiles of 32,
    reductions that are not whole groups of 4, int8 and uint8 inputs, outputs and
    weights, per-channel weight zero points (the positions' sums), and maps smaller
    than the kernel's reach into the padding."""
    rng = np.random.default_rng(21 + threads)
    cases = [  # x shape, m, group, kernel, strides, dilations, pads (top, left, bottom, right)
        ((2, 3, 17, 19), 13, 1, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1)),
        ((1, 5, 9, 40), 9, 1, (1, 7), (1, 3), (1, 1), (0, 3, 0, 2)),
        ((3, 8, 6, 6), 16, 2, (3, 3), (2, 2), (2, 1), (2, 1, 0, 3)),
        ((2, 16, 4, 4), 24, 1, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1)),
        ((1, 2, 70, 70), 3, 1, (5, 5), (2, 2), (1, 1), (2, 2, 2, 2)),
        ((2, 6, 3, 3), 6, 3, (5, 5), (1, 1), (1, 1), (2, 2, 2, 2)),
        ((1, 32, 12, 12), 40, 1, (1, 1), (1, 1), (1, 1), (0, 0, 0, 0)),
        ((4, 4, 11, 13), 8, 4, (3, 2), (3, 2), (1, 2), (1, 0, 2, 1)),
    ]
    for x_shape, m, group, kernel, strides, dil, pads in cases:
        for x_type, w_type, y_type in [(np.uint8, np.int8, np.uint8), (np.int8, np.uint8, np.int8),
                                       (np.uint8, np.uint8, np.int8), (np.int8, np.int8, np.uint8)]:
            n, c, h, wd = x_shape
            xi, wi = np.iinfo(x_type), np.iinfo(w_type)
            x = rng.integers(xi.min, xi.max + 1, x_shape).astype(x_type)
            w = rng.integers(wi.min, wi.max + 1, (m, c // group, *kernel)).astype(w_type)
            xz = int(rng.integers(xi.min, xi.max + 1))
            wz = rng.integers(wi.min, wi.max + 1, m).astype(w_type)
            bias = rng.integers(-3000, 3000, m).astype(np.float32) if m % 2 else None
            k = c // group * kernel[0] * kernel[1]
            # outputs spread over tens of levels: sums of k products of about 100 x 100
            mult = ((rng.random(m if c % 2 else 1) + 0.5) * 40 / (np.sqrt(k) * 1e4)).astype(np.float32)
            yz = 5 if y_type == np.int8 else 131
            oh = (h + pads[0] + pads[2] - dil[0] * (kernel[0] - 1) - 1) // strides[0] + 1
            ow = (wd + pads[1] + pads[3] - dil[1] * (kernel[1] - 1) - 1) // strides[1] + 1
            geometry = native.ConvGeometry(n=n, c=c, h=h, w=wd, m=m, groups=group, kh=kernel[0], kw=kernel[1],
                                           sh=strides[0], sw=strides[1], dh=dil[0], dw=dil[1], pad_top=pads[0],
                                           pad_left=pads[1], oh=oh, ow=ow)
            w8, zw = native.pack_conv_int8(w, wz)
            y = np.empty((n, m, oh, ow), y_type)
            native.K.qconv8(x, w8, zw, bias, mult, y, geometry, xz, yz, threads)
            want = _qconv_reference(x, xz, w, wz, bias, mult, yz, y_type, group, kernel, strides, dil, pads)
            label = f"{x_shape} m={m} g={group} k={kernel} s={strides} d={dil} p={pads} {x_type.__name__} " \
                    f"{w_type.__name__} {y_type.__name__}"
            np.testing.assert_array_equal(y, want, err_msg=label)
            assert len(np.unique(y)) > 10, label  # neither saturated nor constant
            y2 = np.empty_like(y)
            centred = (w.astype(np.float32) - wz.astype(np.float32).reshape(-1, 1, 1, 1)).reshape(m, -1)
            native.K.qconv2d(x, centred, bias, mult, y2, geometry, xz, yz, threads)
            np.testing.assert_array_equal(y, y2, err_msg=label)


@needs_native
@pytest.mark.skipif(native.K is None or not native.K.igemm_ready(), reason="no AVX-512 VNNI here")
def test_qconv8_refuses_what_it_cannot_take():
    x = np.zeros((1, 4, 5, 5), np.uint8)
    w8, zw = native.pack_conv_int8(np.ones((8, 4, 3, 3), np.int8))
    y = np.empty((1, 8, 3, 3), np.uint8)
    mult = np.ones(1, np.float32)
    geometry = native.ConvGeometry(n=1, c=4, h=5, w=5, m=8, groups=1, kh=3, kw=3, sh=1, sw=1, dh=1, dw=1, pad_top=0,
                                   pad_left=0, oh=3, ow=3)
    with pytest.raises(ValueError, match="invalid geometry"):
        native.K.qconv8(x, w8, zw, None, mult, y, geometry._replace(m=0), 0, 0, 1)
    with pytest.raises(ValueError, match="qconv8: y holds 24 elements, at least 72"):
        native.K.qconv8(x, w8, zw, None, mult, y[:, :, :, :1].copy(), geometry, 0, 0, 1)
    with pytest.raises(ValueError, match="mult holds 2 values"):
        native.K.qconv8(x, w8, zw, None, np.ones(2, np.float32), y, geometry, 0, 0, 1)
    with pytest.raises(ValueError, match="x_zero_point -3 outside"):
        native.K.qconv8(x, w8, zw, None, mult, y, geometry, -3, 0, 1)
    with pytest.raises(TypeError, match="qconv8: w8"):
        native.K.qconv8(x, w8.astype(np.int16), zw, None, mult, y, geometry, 0, 0, 1)
    assert native.pack_conv_int8(np.ones((8, 4, 3, 3), np.int16)) is None
    assert native.pack_conv_int8(np.ones((2, native.INT8_MAX_K + 1, 1, 1), np.int8)) is None
    assert native.pack_conv_int8(np.ones((8, 4, 3, 3), np.int8), np.zeros(3, np.int8)) is None
    assert native.pack_conv_int8(np.ones((8, 4, 3, 3), np.int8), np.zeros(8, np.uint8)) is None


@needs_native
def test_qlinear_conv_with_a_fed_scale_follows_each_runs_value():
    """The scale ratio is kept from run to run only for the session's constants: a fed
    scale, even the same array object changed in place, is read anew on every run."""
    rng = np.random.default_rng(3)
    w = rng.integers(-60, 60, (8, 4, 3, 3)).astype(np.int8)
    model = _qconv_model((1, 4, 6, 6), w, x_type=np.uint8, y_type=np.uint8, w_scale=0.01, bias=None, xz=128,
                         yz=128, pads=[1, 1, 1, 1])
    m = onnx.load_from_string(model)
    init = next(i for i in m.graph.initializer if i.name == "xs")
    m.graph.initializer.remove(init)
    m.graph.input.append(helper.make_tensor_value_info("xs", TensorProto.FLOAT, []))
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    ref = rt.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    x = rng.integers(0, 256, (1, 4, 6, 6)).astype(np.uint8)
    xs = np.array(0.05, np.float32)
    first = sess.run(None, {"x": x, "xs": xs})[0]
    np.testing.assert_array_equal(first, ref.run(None, {"x": x, "xs": xs})[0])
    xs[...] = 0.01  # the same array, another value
    second = sess.run(None, {"x": x, "xs": xs})[0]
    np.testing.assert_array_equal(second, ref.run(None, {"x": x, "xs": xs})[0])
    assert not np.array_equal(first, second)


@needs_native
def test_qlinear_conv_past_the_exact_bound_takes_the_numpy_path(monkeypatch):
    """58 channels of 3x3 weights of 127 on inputs of 255 reach 16.9M, past float32's
    exact integers (2**24 = 16.8M): the compiled kernel is not used, and the result is
    still exact."""
    c, m = 58, 4
    w = np.full((m, c, 3, 3), 127, np.int8)
    model = _qconv_model((1, c, 6, 6), w, x_type=np.uint8, y_type=np.uint8, w_scale=0.001, bias=None, xz=0, yz=0,
                         pads=[1, 1, 1, 1])
    x = np.full((1, c, 6, 6), 255, np.uint8)
    x[0, :, 0] = 3
    counting = Counting(native.K)
    monkeypatch.setattr(native, "K", counting)
    got = run(model, {"x": x}, 1, ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    assert not {"qconv2d", "qconv8"} & set(counting.calls)
    acc = np.zeros((m, 6, 6), np.int64)
    xp = np.pad(x[0].astype(np.int64), ((0, 0), (1, 1), (1, 1)))
    for ky in range(3):
        for kx in range(3):
            acc += np.einsum("mc,chw->mhw", w[:, :, ky, kx].astype(np.int64), xp[:, ky:ky + 6, kx:kx + 6])
    mult = np.float32(0.05) * np.float32(0.001) / np.float32(0.07)
    want = np.clip(np.rint(acc.astype(np.float32) * mult), 0, 255).astype(np.uint8)
    np.testing.assert_array_equal(got[0], want)


def _exact_conv(x, w, pad):
    """The convolution of integer ``x`` ``[N, C, H, W]`` and ``w`` ``[M, C, k, k]``
    (stride 1, ``pad`` on every side) in int64: the exact accumulator."""
    k = w.shape[-1]
    windows = np.lib.stride_tricks.sliding_window_view(
        np.pad(x.astype(np.int64), ((0, 0), (0, 0), (pad, pad), (pad, pad))), (k, k), axis=(2, 3))
    return np.einsum("ncyxij,mcij->nmyx", windows, w.astype(np.int64))


def test_qlinear_conv_is_exact_at_the_extremes():
    # 64 channels x 5x5 taps x 255 x 255 > 2**24: the accumulator needs exact sums
    x = np.full((1, 64, 8, 8), 255, np.uint8)
    x[0, :, ::2] = 0
    w = np.full((2, 64, 5, 5), 127, np.int8)
    w[1] = -128
    inits = [
        numpy_helper.from_array(np.array(1.0, np.float32), "xs"),
        numpy_helper.from_array(np.array(0, np.uint8), "xz"),
        numpy_helper.from_array(w, "w"),
        numpy_helper.from_array(np.array(1.0, np.float32), "ws"),
        numpy_helper.from_array(np.array(0, np.int8), "wz"),
        numpy_helper.from_array(np.array(2.0**20, np.float32), "ys"),
        numpy_helper.from_array(np.array(128, np.uint8), "yz"),
    ]
    node = helper.make_node(
        "QLinearConv",
        ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz"],
        ["y"],
        pads=[2] * 4,
    )
    graph = helper.make_graph(
        [node],
        "qc",
        [helper.make_tensor_value_info("x", TensorProto.UINT8, [1, 64, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.UINT8, None)],
        inits,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=10
    )
    got = ort.InferenceSession(
        model.SerializeToString(), providers=["CPUExecutionProvider"]
    ).run(None, {"x": x})[0]
    # the exact int32 accumulator in numpy, then onnxruntime's float32 requantization
    acc = _exact_conv(x, w, 2)
    want = np.clip(np.rint(acc.astype(np.int32).astype(np.float32) * np.float32(2.0**-20)) + 128, 0, 255)
    np.testing.assert_array_equal(got, want.astype(np.uint8))
    assert len(np.unique(got)) > 3  # neither all saturated nor constant
    if not u8s8_pairs_saturate():  # tests/ort_oracle.py: else onnxruntime saturates here
        exp = rt.InferenceSession(
            model.SerializeToString(), providers=["CPUExecutionProvider"]
        ).run(None, {"x": x})[0]
        np.testing.assert_array_equal(got, exp)


@pytest.mark.parametrize("op", ["ConvInteger", "QLinearConv"])
@pytest.mark.parametrize("pads", [0, 1])
def test_integer_conv_accumulator_past_2_24_with_constant_weights(op, pads):
    """A 1x1 convolution whose accumulator is 2**24 + 1, with constant weights (the
    channels-last path): float32 cannot hold it, so ConvInteger must still return it
    exactly, and QLinearConv must add its bias to it before the one rounding to float,
    as onnxruntime does (acc + 1 = 2**24 + 2 scaled to 0.5000001 rounds to 1, where
    float32(acc) + 1 would give 0.5, rounded to 0)."""
    k = 259
    x = np.full((1, k, 1, 1), 255, np.uint8)
    x[0, -1] = 13
    w = np.full((1, k, 1, 1), 255, np.uint8)
    w[0, -1] = 59  # 258 * 255 * 255 + 13 * 59 = 2**24 + 1
    if op == "ConvInteger":
        names, inits = ["x", "w"], [numpy_helper.from_array(w, "w")]
        out_type = TensorProto.INT32
    else:
        names = ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz", "b"]
        inits = [numpy_helper.from_array(v, n) for n, v in (
            ("xs", np.array(1, np.float32)), ("xz", np.array(0, np.uint8)), ("w", w),
            ("ws", np.array(1, np.float32)), ("wz", np.array(0, np.uint8)),
            ("ys", np.array(1 / (0.5 / (2**24 + 1)), np.float32)), ("yz", np.array(0, np.uint8)),
            ("b", np.array([1], np.int32)))]
        out_type = TensorProto.UINT8
    graph = helper.make_graph(
        [helper.make_node(op, names, ["y"], pads=[pads] * 4)], "c",
        [helper.make_tensor_value_info("x", TensorProto.UINT8, [1, k, 1, 1])],
        [helper.make_tensor_value_info("y", out_type, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=10).SerializeToString()
    got = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    exp = rt.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_array_equal(got, exp)
    centre = got[0, 0, pads, pads]
    assert centre == (2**24 + 1 if op == "ConvInteger" else 1)


@pytest.mark.parametrize("kernel", [1, 3])
@pytest.mark.parametrize("fits", [True, False])
@pytest.mark.usefixtures("numpy_kernels")  # the numpy path's bias row; the compiled one: test_conv
def test_qlinear_conv_bias_in_the_product_up_to_the_exact_bound(kernel, fits, monkeypatch):
    """A batch's QLinearConv carries a bias in its float32 product (one more weight row
    times a column of ones) only while every partial sum, bias included, stays below
    2**24: 57 channels of 3x3 weights of 127 on inputs up to 255 reach 16.6M (1x1:
    1.8M), so a bias of 100 rides in the product and one 1000 past the bound is added
    afterwards, exactly, as onnxruntime adds it to its int32 accumulator."""
    rng = np.random.default_rng(7)
    c, m = 57, 6
    bias = 100 if fits else 2**24 - c * kernel * kernel * 127 * 255 + 1000
    x = rng.integers(0, 256, (3, c, 7, 9)).astype(np.uint8)
    x[0] = 255  # one image at the bound
    w = np.full((m, c, kernel, kernel), 127, np.int8)
    w[1::2] = rng.integers(-128, 128, w[1::2].shape)
    b = np.array([bias, -bias, 3, -7, bias // 2, 0], np.int32)
    inits = [numpy_helper.from_array(v, n) for n, v in (
        ("xs", np.array(0.02, np.float32)), ("xz", np.array(0, np.uint8)), ("w", w),
        ("ws", np.array(0.01, np.float32)), ("wz", np.array(0, np.int8)),
        ("ys", np.array(2.0 * kernel * kernel, np.float32)), ("yz", np.array(128, np.uint8)), ("b", b))]
    graph = helper.make_graph(
        [helper.make_node("QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz", "b"], ["y"],
                          pads=[kernel // 2] * 4)], "c",
        [helper.make_tensor_value_info("x", TensorProto.UINT8, list(x.shape))],
        [helper.make_tensor_value_info("y", TensorProto.UINT8, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=10).SerializeToString()
    from onnxrt_cpu.conv import integer

    folded = []
    with_bias_row = integer.IntConvBase._with_bias_row

    def spy(self, *args):
        folded.append(True)
        return with_bias_row(self, *args)

    monkeypatch.setattr(integer.IntConvBase, "_with_bias_row", spy)
    sess = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    ref = rt.InferenceSession(model, providers=["CPUExecutionProvider"])
    mult = np.float32(0.02) * np.float32(0.01) / np.float32(2.0 * kernel * kernel)

    def exact(xb):
        """The int32 accumulator in integers, requantized in float32 as onnxruntime does."""
        acc = _exact_conv(xb, w, kernel // 2) + b.astype(np.int64)[:, None, None]
        return np.clip(np.rint(acc.astype(np.float32) * mult) + 128, 0, 255).astype(np.uint8)

    for xb in (x, rng.integers(0, 256, x.shape).astype(np.uint8)):
        # the second batch runs through the same session (its cached weight with the bias row)
        got = sess.run(None, {"x": xb})[0]
        np.testing.assert_array_equal(got, exact(xb))
        if not u8s8_pairs_saturate():  # tests/ort_oracle.py: else onnxruntime saturates here
            np.testing.assert_array_equal(got, ref.run(None, {"x": xb})[0])
        assert len(np.unique(got)) > 10
        assert bool(folded) == fits  # past the bound the bias is added afterwards


@pytest.mark.parametrize("constant_weight", [True, False])
def test_conv_integer_wraps_its_int32_accumulator(constant_weight):
    """33,100 channels of 255 * 255 overflow int32: the result wraps as onnxruntime's
    32-bit accumulator does (-2142639796), not the float conversion's INT_MIN."""
    k = 33100
    x = np.full((1, k, 1, 1), 255, np.uint8)
    w = np.full((1, k, 1, 1), 255, np.uint8)
    graph = helper.make_graph(
        [helper.make_node("ConvInteger", ["x", "w"], ["y"])], "c",
        [helper.make_tensor_value_info("x", TensorProto.UINT8, [1, k, 1, 1])]
        + ([] if constant_weight else [helper.make_tensor_value_info("w", TensorProto.UINT8, [1, k, 1, 1])]),
        [helper.make_tensor_value_info("y", TensorProto.INT32, None)],
        [numpy_helper.from_array(w, "w")] if constant_weight else [])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=10).SerializeToString()
    feeds = {"x": x} if constant_weight else {"x": x, "w": w}
    got = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    exp = rt.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_array_equal(got, exp)
    assert got.ravel()[0] == np.int64(k * 255 * 255).astype(np.int32)


# -- Errors: the compiled kernels' geometry and limits ---------------------------------------------------------------


@needs_native
def test_the_geometry_is_a_named_type_whose_fields_the_kernels_check():
    """The kernels take their geometry as ConvGeometry or WindowGeometry only: a plain
    tuple of the same integers, the other type or a field that is not an integer is a
    TypeError naming the kernel; set_geometry_types refuses types whose fields are not
    the kernels' (the module then keeps the types it has)."""
    k = native.K
    x = np.ones((1, 2, 4, 4), np.float32)
    w = np.ones((4, 18), np.float32)
    y = np.empty((1, 4, 4, 4), np.float32)
    conv = native.ConvGeometry(n=1, c=2, h=4, w=4, m=4, groups=1, kh=3, kw=3, sh=1, sw=1, dh=1, dw=1, pad_top=1,
                               pad_left=1, oh=4, ow=4)
    k.conv2d(x, w, None, None, y, conv, 0, 0.0, 0.0, 1)
    np.testing.assert_array_equal(y[0, :, 1:3, 1:3], np.full((4, 2, 2), 18.0, np.float32))
    with pytest.raises(TypeError, match="conv2d: geometry must be a ConvGeometry, not tuple"):
        k.conv2d(x, w, None, None, y, tuple(conv), 0, 0.0, 0.0, 1)
    with pytest.raises(TypeError, match="depthwise2d: geometry must be a WindowGeometry, not ConvGeometry"):
        k.depthwise2d(x, w[:2, :9], None, y[:, :2], conv, 0, 0.0, 0.0, 1)
    with pytest.raises(TypeError, match="pool2d: geometry field kh must be an integer"):
        k.pool2d(x, y[:, :2], conv.window()._replace(kh=3.0), 0, None, 1)
    with pytest.raises(ValueError, match="direct2d: invalid geometry \\(groups 2"):
        k.direct2d(x, w, None, None, y, conv._replace(groups=2), 0, 0.0, 0.0, 1)
    with pytest.raises(ValueError, match="winograd3x3: invalid geometry"):
        k.winograd3x3(x, np.ones((16, 4, 2), np.float32), None, None, y, conv._replace(sh=2), 0, 0.0, 0.0, 1)
    Shuffled = collections.namedtuple("Shuffled", ("c", "n") + native.ConvGeometry._fields[2:])
    with pytest.raises(TypeError, match="conv's fields are not the kernels'"):
        k.set_geometry_types(Shuffled, native.WindowGeometry)
    with pytest.raises(TypeError, match="window must be a named tuple type"):
        k.set_geometry_types(native.ConvGeometry, dict)
    k.conv2d(x, w, None, None, y, conv, 0, 0.0, 0.0, 1)  # the module kept its types


@needs_native
def test_a_huge_kernel_is_refused_before_allocating_and_the_numpy_path_takes_it(monkeypatch):
    """A kernel of 1100 x 1100 taps over a 64 x 64 output would need 310 MB of gathered
    columns per tile: the compiled kernel refuses with MemoryError before allocating,
    and the convolution falls back to the numpy path, which gathers in bounded bands."""
    x = np.zeros((1, 1, 1163, 1163), np.float32)
    w = np.zeros((1, 1100 * 1100), np.float32)
    y = np.empty((1, 1, 64, 64), np.float32)
    with pytest.raises(MemoryError, match="gathered columns exceed"):
        geometry = native.ConvGeometry(n=1, c=1, h=1163, w=1163, m=1, groups=1, kh=1100, kw=1100, sh=1, sw=1, dh=1,
                                       dw=1, pad_top=0, pad_left=0, oh=64, ow=64)
        native.K.conv2d(x, w, None, None, y, geometry, 0, 0.0, 0.0, 1)
    from onnxrt_cpu.conv import compiled, packing

    wp = packing.ConvWeights(w.reshape(1, 1, 1100, 1100), 1, np.dtype(np.float32))
    assert not compiled.conv_native(x, wp, (1, 1), (1, 1), (0, 0), (0, 0), (64, 64), y, 0, None, None, None)
