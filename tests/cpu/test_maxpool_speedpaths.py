"""The compiled pooling kernels' paths (``pool2d``, native/src/pool2d.c): one-row
windows tiling every row (all planes as one flat row), 2 x 2 windows of stride 2,
planes past 64 KB by output rows, and smaller planes through their stride phases;
pads, strides, dilations, ceil_mode, auto_pad, odd widths, float64 and NaN, against
onnxruntime and the onnx reference implementation."""

from __future__ import annotations

import numpy as np
import onnxruntime as rt
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import onnxrt as ort
from onnxrt_cpu import native
from tests.cpu.conv_cases import Counting, needs_native

# (op, input shape, attributes, the kernel the shape goes to)
POOLS = [
    # one-row windows tiling the rows: plcmos's 1 x 4 / 4 over rows of 64 and 16, 1 x 2 / 2
    ("MaxPool", (1, 8, 60, 64), {"kernel_shape": [1, 4], "strides": [1, 4]}, "flat"),
    ("MaxPool", (2, 5, 37, 16), {"kernel_shape": [1, 4], "strides": [1, 4]}, "flat"),
    ("MaxPool", (1, 6, 9, 18), {"kernel_shape": [1, 2], "strides": [1, 2]}, "flat"),
    ("MaxPool", (1, 3, 11, 21), {"kernel_shape": [1, 3], "strides": [1, 1]}, "flat"),
    # rows of 257 that 1 x 4 / 4 does not tile (the last column dropped), large planes: by rows
    ("MaxPool", (1, 4, 498, 257), {"kernel_shape": [1, 4], "strides": [1, 4]}, "rows"),
    # and small ones: phases
    ("MaxPool", (1, 4, 30, 257), {"kernel_shape": [1, 4], "strides": [1, 4]}, "phases"),
    # 2 x 2 / 2 inside the input: even and odd sizes
    ("MaxPool", (1, 24, 72, 32), {"kernel_shape": [2, 2], "strides": [2, 2]}, "2x2"),
    ("MaxPool", (2, 3, 33, 47), {"kernel_shape": [2, 2], "strides": [2, 2]}, "2x2"),
    ("MaxPool", (1, 2, 900, 120), {"kernel_shape": [2, 2], "strides": [2, 2], "auto_pad": "VALID"}, "2x2"),
    # 2 x 2 / 2 past the input (ceil_mode, padding): by rows (large) or phases
    ("MaxPool", (1, 2, 301, 121), {"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1}, "rows"),
    ("MaxPool", (1, 3, 17, 23), {"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1}, "phases"),
    ("MaxPool", (1, 2, 200, 133), {"kernel_shape": [2, 2], "strides": [2, 2], "pads": [1, 1, 0, 0]}, "rows"),
    # by rows: pads, strides 1-4, dilations, auto_pad, ceil_mode, odd widths
    ("MaxPool", (1, 2, 130, 140), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}, "rows"),
    ("MaxPool", (1, 2, 131, 139), {"kernel_shape": [3, 3], "strides": [1, 1], "pads": [1, 1, 1, 1]}, "rows"),
    ("MaxPool", (1, 2, 129, 141), {"kernel_shape": [3, 5], "strides": [3, 4], "pads": [0, 2, 2, 1]}, "rows"),
    ("MaxPool", (1, 2, 133, 137), {"kernel_shape": [3, 3], "strides": [2, 3], "dilations": [2, 3],
                                   "pads": [2, 2, 1, 2]}, "rows"),
    ("MaxPool", (1, 2, 150, 121), {"kernel_shape": [2, 3], "strides": [2, 2], "auto_pad": "SAME_UPPER"}, "rows"),
    ("MaxPool", (1, 2, 150, 121), {"kernel_shape": [3, 2], "strides": [2, 2], "auto_pad": "SAME_LOWER"}, "rows"),
    ("MaxPool", (1, 2, 127, 143), {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}, "rows"),
    ("MaxPool", (1, 1, 140, 200), {"kernel_shape": [1, 4], "strides": [1, 4], "pads": [0, 1, 0, 2]}, "rows"),
    ("MaxPool", (1, 1, 90, 250), {"kernel_shape": [5, 1], "strides": [4, 1], "pads": [2, 0, 2, 0]}, "rows"),
    # the phases: small planes
    ("MaxPool", (1, 16, 28, 28), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}, "phases"),
    ("MaxPool", (1, 4, 13, 29), {"kernel_shape": [3, 2], "strides": [1, 2], "dilations": [2, 1]}, "phases"),
    # AveragePool by rows: padding counted or not, ceil_mode
    ("AveragePool", (1, 2, 130, 141), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}, "rows"),
    ("AveragePool", (1, 2, 130, 141), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1],
                                       "count_include_pad": 1}, "rows"),
    ("AveragePool", (1, 2, 129, 139), {"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1}, "rows"),
    ("AveragePool", (1, 2, 140, 150), {"kernel_shape": [2, 2], "strides": [2, 2]}, "rows"),
    ("AveragePool", (1, 2, 140, 256), {"kernel_shape": [1, 4], "strides": [1, 4]}, "rows"),
]


def _pool_model(op, x_shape, attrs, dtype=np.float32):
    et = TensorProto.FLOAT if dtype == np.float32 else TensorProto.DOUBLE
    node = helper.make_node(op, ["x"], ["y"], **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", et, list(x_shape))],
                              [helper.make_tensor_value_info("y", et, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)], ir_version=9)


def _run(model, feeds, threads):
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)[0]


def _pid(i, p):
    return f"{p[3]}-{p[0]}-{'x'.join(map(str, p[1]))}-{i}"


def _plane_bytes(x_shape, itemsize=4):
    return x_shape[2] * x_shape[3] * itemsize


def test_the_cases_are_what_they_say():
    """Each case's shape is on the side of the kernels' thresholds that its label names
    (planes past 64 KB go by rows)."""
    for op, x_shape, attrs, kind in POOLS:
        if kind == "rows":
            assert _plane_bytes(x_shape) > 65536, (op, x_shape)
        elif kind == "phases":
            assert _plane_bytes(x_shape) <= 65536, (op, x_shape)


@needs_native
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("op, x_shape, attrs, kind", POOLS, ids=[_pid(i, p) for i, p in enumerate(POOLS)])
def test_pools_match_onnxruntime(op, x_shape, attrs, kind, threads, monkeypatch):
    model = _pool_model(op, x_shape, attrs)
    x = np.random.default_rng(7).standard_normal(x_shape).astype(np.float32)
    counting = Counting(native.K)
    monkeypatch.setattr(native, "K", counting)
    got = _run(model, {"x": x}, threads)
    monkeypatch.undo()
    assert counting.calls["pool2d"] == 1
    want = rt.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert got.shape == want.shape
    if op == "MaxPool":
        np.testing.assert_array_equal(got, want)  # a max is exact
    else:
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


@needs_native
@pytest.mark.parametrize("index", [0, 1, 4, 6, 7, 9, 13, 15, 20, 21, 23, 25],
                         ids=lambda i: _pid(i, POOLS[i]))
def test_float64_matches_the_reference(index):
    op, x_shape, attrs, _ = POOLS[index]
    model = _pool_model(op, x_shape, attrs, np.float64)
    x = np.random.default_rng(8).standard_normal(x_shape)
    want = ReferenceEvaluator(model).run(None, {"x": x})[0]
    for threads in (1, 2):
        got = _run(model, {"x": x}, threads)
        assert got.dtype == np.float64
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def _numpy_maxpool(x, attrs):
    """MaxPool by numpy's max over every window of the input padded with -inf (explicit
    pads, no ceil_mode): NaN propagates, as numpy's max does (the reference
    implementation's MaxPool leaves NaN out)."""
    kh, kw = attrs["kernel_shape"]
    sh, sw = attrs.get("strides", [1, 1])
    dh, dw = attrs.get("dilations", [1, 1])
    pt, pl, pb, pr = attrs.get("pads", [0, 0, 0, 0])
    xp = np.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr)), constant_values=-np.inf)
    eh, ew = (kh - 1) * dh + 1, (kw - 1) * dw + 1
    windows = np.lib.stride_tricks.sliding_window_view(xp, (eh, ew), axis=(2, 3))[:, :, ::sh, ::sw, ::dh, ::dw]
    return windows.max(axis=(4, 5))


@needs_native
@pytest.mark.parametrize("index", [0, 3, 4, 6, 7, 12, 15, 19, 21], ids=lambda i: _pid(i, POOLS[i]))
def test_nan_and_infinity_propagate_as_in_numpy(index):
    """A NaN anywhere in a window makes its maximum NaN (numpy's maximum), wherever in
    the window it lies; -inf never wins over a value, +inf always does."""
    op, x_shape, attrs, _ = POOLS[index]
    model = _pool_model(op, x_shape, attrs)
    rng = np.random.default_rng(9)
    x = rng.standard_normal(x_shape).astype(np.float32)
    flat = x.reshape(-1)
    spots = rng.choice(flat.size, size=3 * max(1, flat.size // 500), replace=False)
    third = len(spots) // 3
    flat[spots[:third]] = np.nan
    flat[spots[third:2 * third]] = np.inf
    flat[spots[2 * third:]] = -np.inf
    want = _numpy_maxpool(x, attrs)
    assert np.isnan(want).any() and np.isposinf(want).any()
    for threads in (1, 2):
        got = _run(model, {"x": x}, threads)
        np.testing.assert_array_equal(got, want)  # assert_array_equal takes NaN == NaN
    # without the NaNs, the reference implementation agrees with the numpy windows
    x = np.nan_to_num(x, nan=0.5, posinf=np.inf, neginf=-np.inf)
    np.testing.assert_array_equal(_numpy_maxpool(x, attrs), ReferenceEvaluator(model).run(None, {"x": x})[0])
