"""Convolutions with stride 2 along the rows on the CPU provider: the banded im2col
gathers its taps from the column phases of the padded input (``onnxrt_cpu.conv.bands.column_phases``)
instead of reading every second value of a row. The gathered columns are the same
values in the same order, so the results equal the plain strided gather's bit for
bit; they are checked against onnxruntime too (and the reference evaluator for
float64), with odd and even widths, asymmetric padding, dilated rows, groups,
batches, bands and both threads."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import onnxrt
from onnxrt_cpu import parallel
from onnxrt_cpu.conv import bands, forward

# these tests check the numpy paths' internals; the compiled kernels have their own
# (tests/cpu/test_native_kernels.py)
pytestmark = pytest.mark.usefixtures("numpy_kernels")

rt = pytest.importorskip("onnxruntime")


def _model(x_shape, w_shape, *, strides, pads, dilations=(1, 1), group=1, dtype=TensorProto.FLOAT, relu=False):
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


def _run(model, x, threads=1):
    opts = onnxrt.SessionOptions()
    opts.intra_op_num_threads = threads
    return onnxrt.InferenceSession(model, opts, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


CASES = [
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


@pytest.mark.parametrize("x_shape, w_shape, strides, pads, dilations, group", CASES)
def test_equal_to_the_strided_gather_and_to_onnxruntime(split_calls, monkeypatch, x_shape, w_shape, strides, pads,
                                                        dilations, group):
    model = _model(x_shape, w_shape, strides=strides, pads=pads, dilations=dilations, group=group)
    x = np.random.default_rng(0).standard_normal(x_shape).astype(np.float32)
    got = _run(model, x)
    assert split_calls, "the column phases were not used"
    monkeypatch.setattr(forward, "_COLUMN_PHASES", False)
    calls = len(split_calls)
    plain = _run(model, x)
    assert len(split_calls) == calls
    np.testing.assert_array_equal(got, plain)
    want = rt.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_few_output_channels_take_the_column_phases_too(split_calls, monkeypatch):
    # a detector's stem, fewer output channels than taps: the banded im2col on the
    # column phases, not the stride phases with their cropping copy
    phase_path = []
    real = forward.conv_phases
    monkeypatch.setattr(forward, "conv_phases", lambda *a, **k: phase_path.append(1) or real(*a, **k))
    model = _model((1, 3, 40, 38), (8, 3, 3, 3), strides=(2, 2), pads=(1, 1, 1, 1), relu=True)
    x = np.random.default_rng(4).standard_normal((1, 3, 40, 38)).astype(np.float32)
    got = _run(model, x)
    assert split_calls and not phase_path
    want = rt.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # stride 3 along the row keeps the stride phases
    model = _model((1, 3, 40, 38), (8, 3, 3, 3), strides=(3, 3), pads=(1, 1, 1, 1))
    got = _run(model, x)
    assert phase_path and len(split_calls) == 1
    want = rt.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_bands_of_a_batch_and_both_threads(split_calls, monkeypatch):
    # bands of a few output rows each (every band's taps start at its own rows of the
    # phases), two images, and the bands shared by two threads
    monkeypatch.setattr(bands, "BAND_ELEMS", 2000)
    monkeypatch.setattr(parallel, "PARALLEL_MIN_FLOPS", 1)
    model = _model((2, 3, 41, 38), (32, 3, 5, 5), strides=(2, 2), pads=(2, 2, 2, 1), relu=True)
    x = np.random.default_rng(1).standard_normal((2, 3, 41, 38)).astype(np.float32)
    got = _run(model, x, threads=2)
    assert split_calls
    want = rt.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert (got >= 0).all()


def test_float64_against_the_reference_evaluator(split_calls):
    # onnxruntime has no float64 Conv kernel on the CPU
    model = _model((1, 3, 29, 30), (40, 3, 3, 3), strides=(2, 2), pads=(1, 1, 0, 1), dtype=TensorProto.DOUBLE)
    x = np.random.default_rng(2).standard_normal((1, 3, 29, 30))
    got = _run(model, x)
    assert split_calls and got.dtype == np.float64
    want = ReferenceEvaluator(model).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("w_shape, strides", [
    ((48, 4, 1, 1), (2, 2)),  # a 1x1 shortcut reads a quarter of the input: no split
    ((48, 4, 5, 5), (4, 4)),  # stride 4: a copy call per phase costs more than it saves
])
def test_layers_that_keep_the_strided_gather(split_calls, w_shape, strides):
    model = _model((1, 4, 30, 30), w_shape, strides=strides, pads=(0, 0, 0, 0))
    x = np.random.default_rng(3).standard_normal((1, 4, 30, 30)).astype(np.float32)
    got = _run(model, x)
    assert not split_calls
    want = rt.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


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
