"""OpenCL Resize: the ONNX node tests, and comparisons with the CPU provider for
odd sizes, every claimed coordinate mode and rounding mode, and scales or sizes
that arrive at run time rather than as constants."""

import numpy as np
import onnxrt as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from ..conftest import make_model
from .kernel_checks import (
    CPU,
    OCL,
    check_node_case,
    compare_with_cpu,
    node_cases,
    skip_without_opencl,
)

pytestmark = skip_without_opencl()

OPS = {"Resize"}
FALLBACKS = {
    name: "tf_crop_and_resize"
    for name in (
        "test_resize_tf_crop_and_resize",
        "test_resize_tf_crop_and_resize_extrapolation_value",
        "test_resize_tf_crop_and_resize_axes_2_3",
        "test_resize_tf_crop_and_resize_axes_3_2",
    )
}


@pytest.mark.parametrize("case", node_cases(OPS))
def test_node_case(case):
    check_node_case(case, OPS, FALLBACKS)


def _resize_model(x_shape, scales=None, sizes=None, runtime=False, **attrs):
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))]
    inits = []
    names = ["x", ""]
    if scales is not None:
        names.append("scales")
        if runtime:
            inputs.append(helper.make_tensor_value_info("scales", TensorProto.FLOAT, [len(scales)]))
        else:
            inits.append(numpy_helper.from_array(np.array(scales, np.float32), "scales"))
    else:
        names += ["", "sizes"]
        if runtime:
            inputs.append(helper.make_tensor_value_info("sizes", TensorProto.INT64, [len(sizes)]))
        else:
            inits.append(numpy_helper.from_array(np.array(sizes, np.int64), "sizes"))
    return make_model(
        [helper.make_node("Resize", names, ["y"], **attrs)],
        inputs,
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )


COORDS = ["half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric"]


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize("coord", COORDS)
def test_resize_modes_match_cpu(mode, coord):
    x = np.random.default_rng(0).standard_normal((2, 3, 7, 9)).astype(np.float32)
    for scales in ([1, 1, 2.5, 1.7], [1, 1, 0.6, 0.45]):
        model = _resize_model(x.shape, scales=scales, mode=mode, coordinate_transformation_mode=coord,
                              nearest_mode="round_prefer_ceil")
        compare_with_cpu(model, {"x": x}, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("nearest_mode", ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"])
def test_nearest_rounding_modes_match_cpu(nearest_mode):
    x = np.random.default_rng(1).standard_normal((1, 2, 5, 6)).astype(np.float32)
    model = _resize_model(x.shape, sizes=[1, 2, 13, 4], mode="nearest", nearest_mode=nearest_mode,
                          coordinate_transformation_mode="tf_half_pixel_for_nn")
    compare_with_cpu(model, {"x": x})


def test_antialias_and_exclude_outside_match_cpu():
    x = np.random.default_rng(2).standard_normal((1, 3, 20, 17)).astype(np.float32)
    for mode in ("linear", "cubic"):
        model = _resize_model(x.shape, sizes=[1, 3, 7, 6], mode=mode, antialias=1, exclude_outside=1)
        compare_with_cpu(model, {"x": x}, rtol=1e-5, atol=1e-5)


def test_runtime_scales_and_sizes():
    x = np.random.default_rng(3).standard_normal((2, 2, 4, 5)).astype(np.float32)
    model = _resize_model(x.shape, scales=[1, 1, 2, 3], runtime=True, mode="linear")
    compare_with_cpu(model, {"x": x, "scales": np.array([1, 1, 2, 3], np.float32)}, expect_ops={"Resize"})
    model = _resize_model(x.shape, sizes=[1, 1, 1, 1], runtime=True, mode="nearest")
    sess = ort.InferenceSession(model, providers=[OCL, CPU])
    for sizes in ([2, 2, 9, 3], [2, 2, 4, 5], [1, 2, 2, 11]):
        feeds = {"x": x, "sizes": np.array(sizes, np.int64)}
        ref = ort.InferenceSession(model, providers=[CPU]).run(None, feeds)[0]
        np.testing.assert_array_equal(sess.run(None, feeds)[0], ref)


def test_tf_crop_and_resize_falls_back_with_a_reason():
    x = np.ones((1, 1, 4, 4), np.float32)
    model = make_model(
        [helper.make_node("Resize", ["x", "roi", "scales"], ["y"], mode="linear",
                          coordinate_transformation_mode="tf_crop_and_resize")],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.array([0, 0, 0.2, 0.2, 1, 1, 0.8, 0.8], np.float32), "roi"),
         numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")],
    )
    (row,) = ort.InferenceSession(model, providers=[OCL, CPU]).get_provider_assignment()
    assert row["provider"] == CPU and "tf_crop_and_resize" in row["reason"]
