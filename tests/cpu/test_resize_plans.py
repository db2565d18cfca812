"""Resize on the CPU provider: the resampling plan kept per input geometry, and the
integer upsampling of the last axis by strided copies, against onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxrt
from onnxrt_cpu.kernels import image

rt = pytest.importorskip("onnxruntime")


def _resize_model(rank, mode="nearest", coord="asymmetric", nearest="floor", scales=None, dtype=TensorProto.FLOAT):
    """A Resize whose scales are a constant (``scales``) or, when None, a graph input."""
    inputs = [helper.make_tensor_value_info("x", dtype, ["d%d" % i for i in range(rank)])]
    inits = []
    if scales is None:
        inputs.append(helper.make_tensor_value_info("s", TensorProto.FLOAT, [rank]))
    else:
        inits.append(numpy_helper.from_array(np.asarray(scales, np.float32), "s"))
    node = helper.make_node("Resize", ["x", "", "s"], ["y"], mode=mode, coordinate_transformation_mode=coord,
                            nearest_mode=nearest)
    graph = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info("y", dtype, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8).SerializeToString()


def _both(model, feeds):
    got = onnxrt.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    want = rt.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    return got, want


@pytest.mark.parametrize("scales, coord, nearest", [
    ([1, 1, 2, 2], "asymmetric", "floor"),  # a detector's 2x Upsample
    ([1, 1, 3, 3], "asymmetric", "floor"),
    ([1, 1, 2, 4], "half_pixel", "round_prefer_floor"),  # repeats too: each source 4 times in order
    ([1, 1, 1, 2], "align_corners", "round_prefer_floor"),  # not a plain repeat: taken value by value
    ([1, 1, 2, 1.5], "asymmetric", "floor"),
])
def test_nearest_upsampling_matches_onnxruntime(scales, coord, nearest):
    model = _resize_model(4, coord=coord, nearest=nearest, scales=scales)
    x = np.random.default_rng(0).standard_normal((2, 3, 5, 7)).astype(np.float32)
    got, want = _both(model, {"x": x})
    np.testing.assert_array_equal(got, want)


def test_integer_upsampling_of_the_last_axis_takes_the_strided_copies(monkeypatch):
    calls = []
    real = image._repeat_last
    monkeypatch.setattr(image, "_repeat_last", lambda y, k: calls.append(k) or real(y, k))
    # the numpy path: float32 maps go to the compiled kernel first (test_resize_native.py)
    monkeypatch.setattr(image.native, "K", None)
    model = _resize_model(4, scales=[1, 1, 2, 2])
    x = np.arange(2 * 3 * 4 * 5, dtype=np.float32).reshape(2, 3, 4, 5)
    got = onnxrt.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert calls == [2]
    np.testing.assert_array_equal(got, np.repeat(np.repeat(x, 2, axis=2), 2, axis=3))
    # any dtype: the copies move bits (an int8 map and a NaN's payload)
    xi = np.arange(-60, 60, dtype=np.int8).reshape(2, 3, 4, 5)
    model_i = _resize_model(4, scales=[1, 1, 1, 3], dtype=TensorProto.INT8)
    got_i = onnxrt.InferenceSession(model_i, providers=["CPUExecutionProvider"]).run(None, {"x": xi})[0]
    np.testing.assert_array_equal(got_i, np.repeat(xi, 3, axis=3))


def test_a_plan_is_kept_per_geometry_and_scales_fed_at_run_time_take_effect():
    model = _resize_model(3, mode="linear", coord="half_pixel", scales=None)
    ours = onnxrt.InferenceSession(model, providers=["CPUExecutionProvider"])
    ref = rt.InferenceSession(model, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(1)
    (step,) = ours._built.plan.steps
    kernel = step.fn.__self__
    for shape, scales in [((2, 4, 6), [1, 2, 2]), ((2, 4, 6), [1, 2, 2]), ((2, 4, 6), [1, 0.5, 3]),
                          ((3, 5, 2), [1, 2, 2]), ((2, 4, 6), [1, 2, 2])]:
        feeds = {"x": rng.standard_normal(shape).astype(np.float32), "s": np.asarray(scales, np.float32)}
        np.testing.assert_allclose(ours.run(None, feeds)[0], ref.run(None, feeds)[0], rtol=1e-5, atol=1e-6)
    # three geometries: (2, 4, 6) at two scales and (3, 5, 2)
    assert len(kernel._plans) == 3


def test_an_empty_output_and_a_bad_scale_are_still_checked_on_every_geometry():
    model = _resize_model(2, mode="nearest", scales=None)
    sess = onnxrt.InferenceSession(model, providers=["CPUExecutionProvider"])
    x = np.ones((2, 3), np.float32)
    assert sess.run(None, {"x": x, "s": np.array([1, 0.2], np.float32)})[0].shape == (2, 0)
    with pytest.raises(onnxrt.OnnxRtError, match="scale"):
        sess.run(None, {"x": x, "s": np.array([1, -2], np.float32)})
    assert sess.run(None, {"x": x, "s": np.array([1, 2], np.float32)})[0].shape == (2, 6)
