"""Real models on OpenCL: most nodes on the device, onnxruntime's answers.

The ``light_*`` models shipped with onnx (random weights, as in ``tests/models``), the
exported ResNet, MobileNetV2-style and YOLO-style nets. Each must run at least 80% of
its nodes on the OpenCL provider and match onnxruntime (rtol 1e-3, atol 1e-4).
"""

import numpy as np
import onnx
import pytest

import onnxrt as ort

from ..models.test_real_models import ATOL, DATA, LIGHT, LIGHT_DIR, RTOL, _feeds, _randomized

rt = pytest.importorskip("onnxruntime")
pytest.importorskip("onnxrt_opencl")
from onnxrt_opencl import OpenCLExecutionProvider  # noqa: E402

OCL = "OpenCLExecutionProvider"
REASON = OpenCLExecutionProvider.is_available()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"OpenCL unavailable: {REASON}")
MIN_SHARE = 0.8


def _check(path, so=None, shapes=None):
    sess = ort.InferenceSession(str(path), so, providers=[OCL, "CPUExecutionProvider"])
    assignment = sess.get_provider_assignment()
    on = [a for a in assignment if a["provider"] == OCL]
    off = {(a["op_type"], a["reason"]) for a in assignment if a["provider"] != OCL}
    assert len(on) >= MIN_SHARE * len(assignment), f"{len(on)}/{len(assignment)} on OpenCL; off: {off}"
    assert all(a["reason"] for a in assignment if a["provider"] != OCL)
    ref = rt.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feeds = _feeds(sess, shapes)
    got, want = sess.run(None, feeds), ref.run(None, feeds)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL)
    return sess, got


@pytest.mark.parametrize("name", LIGHT)
def test_light_model_on_opencl(name, tmp_path):
    path = tmp_path / name
    onnx.save(_randomized(LIGHT_DIR / name, expose=False), path)
    _, (y, *_) = _check(path)
    assert float(np.std(y)) > 1e-5  # random weights make the output informative


@pytest.mark.parametrize("batch", [1, 3])
def test_resnet_small_on_opencl(batch):
    sess, (y,) = _check(DATA / "resnet_small.onnx", shapes={"batch": batch})
    assert y.shape == (batch, 10)
    assert all(a["provider"] == OCL for a in sess.get_provider_assignment() if a["op_type"] == "Conv")


def test_mobilenet_small_on_opencl():
    sess, (y,) = _check(DATA / "mobilenet_small.onnx", shapes={"batch": 2})
    assert y.shape == (2, 10)


@pytest.mark.parametrize("level", [ort.GraphOptimizationLevel.ORT_DISABLE_ALL, ort.GraphOptimizationLevel.ORT_ENABLE_ALL])
def test_yolo_small_on_opencl(level):
    path = DATA / "yolo_small.onnx"
    if not path.exists():
        pytest.skip("yolo_small.onnx is not in the repository yet")
    so = ort.SessionOptions()
    so.graph_optimization_level = level
    # fixed input sizes let the shape computations fold away, as a deployment would
    for k, v in {"batch": 1, "height": 64, "width": 64}.items():
        so.add_free_dimension_override_by_name(k, v)
    sess, (boxes, scores) = _check(path, so, shapes={"batch": 1, "height": 64, "width": 64})
    assert boxes.shape[0] == scores.shape[0] == 1 and boxes.shape[-1] == 4


def test_yolo_small_with_dynamic_sizes_keeps_shape_math_on_the_cpu():
    path = DATA / "yolo_small.onnx"
    if not path.exists():
        pytest.skip("yolo_small.onnx is not in the repository yet")
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess, _ = _check(path, so, shapes={"batch": 2, "height": 96, "width": 64})
    kept = [a for a in sess.get_provider_assignment() if a["op_type"] == "Shape"]
    assert kept and all(a["provider"] == "CPUExecutionProvider" for a in kept)
