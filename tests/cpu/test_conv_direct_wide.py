"""The compiled direct kernel on longer reductions (input channels times taps from 301
to 1200) of float convolutions with maps of at least 1600 outputs in 4 rows or more
from inputs of at most 4M values (``conv.compiled.direct_pays(wide=True)``), and the
layers just outside that, which keep im2col; QLinearConv keeps its own limit of 300.
Checked against onnxruntime and the numpy paths, on one and two threads."""

from __future__ import annotations

import numpy as np
import pytest

from onnxrt_cpu import native
from onnxrt_cpu.conv import compiled
from onnxrt_cpu.conv.packing import ConvWeights
from tests.cpu.conv_cases import Counting, conv_feeds, conv_model, needs_native, run

rt = pytest.importorskip("onnxruntime")

#: the compiled float convolutions
CONVS = {"conv2d", "direct2d", "winograd3x3", "narrow_conv2d", "depthwise2d"}

#: (input shape, weight shape, attributes, the compiled function that takes it)
LAYERS = [
    ((1, 40, 40, 40), (96, 40, 3, 3), {"pads": (1, 1, 1, 1)}, "direct2d"),  # K 360, 1600 outputs
    ((1, 64, 104, 16), (128, 64, 3, 3), {"pads": (1, 1, 1, 1), "dilations": (2, 1)}, "direct2d"),  # PLCMOS-like
    ((1, 32, 48, 40), (64, 32, 5, 5), {"pads": (2, 2, 2, 2)}, "direct2d"),  # K 800
    ((2, 40, 90, 40), (24, 40, 3, 3), {"strides": (2, 1), "pads": (1, 0, 2, 1)}, "direct2d"),  # strided, a batch
    ((1, 128, 44, 44), (32, 128, 3, 3), {"dilations": (2, 2)}, "direct2d"),  # K 1152
    ((1, 40, 39, 40), (96, 40, 3, 3), {"pads": (1, 1, 1, 1)}, "conv2d"),  # 1560 outputs
    ((1, 48, 3, 800), (16, 48, 3, 3), {"pads": (0, 1, 0, 1)}, "conv2d"),  # one output row
    ((1, 136, 90, 90), (32, 136, 3, 3), {"strides": (2, 2), "pads": (1, 1, 1, 1)}, "conv2d"),  # K 1224
    ((1, 64, 60, 60), (64, 64, 3, 3), {"pads": (1, 1, 1, 1)}, "winograd3x3"),  # 3x3 stride 1: Winograd first
    ((1, 40, 330, 320), (16, 40, 3, 3), {"strides": (2, 2)}, "conv2d"),  # an input of 4.2M values
]


@needs_native
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("x_shape, w_shape, attrs, kernel", LAYERS, ids=[f"{k}-{i}" for i, (*_, k) in enumerate(LAYERS)])
def test_long_reductions_take_the_direct_kernel_and_match(x_shape, w_shape, attrs, kernel, threads, request,
                                                           monkeypatch):
    model = conv_model(x_shape, w_shape, act="LeakyRelu", **attrs)
    feeds = conv_feeds(model, x_shape, w_shape, "constant", False, np.float32)
    counting = Counting(native.K)
    monkeypatch.setattr(native, "K", counting)
    got = run(model, feeds, threads)
    assert {k: n for k, n in counting.calls.items() if k in CONVS} == {kernel: 1}
    monkeypatch.setattr(native, "K", counting.module)
    want = rt.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    request.getfixturevalue("numpy_kernels")
    np.testing.assert_allclose(got, run(model, feeds, threads), rtol=1e-4, atol=1e-4)


def test_qlinear_conv_keeps_the_short_limit():
    """The wide limit is the float convolutions' alone: QLinearConv's direct kernel
    takes reductions of up to 300 only."""
    wp = ConvWeights(np.zeros((96, 48, 3, 3), np.float32), 1, np.float32)
    x = np.empty(0, np.float32)
    assert compiled.direct_pays(x, wp, (3, 3), (40, 40), wide=True)
    assert not compiled.direct_pays(x, wp, (3, 3), (40, 40))
    narrow = ConvWeights(np.zeros((96, 32, 3, 3), np.float32), 1, np.float32)
    assert compiled.direct_pays(x, narrow, (3, 3), (20, 20)) and compiled.direct_pays(x, narrow, (3, 3), (20, 20),
                                                                                       wide=True)
