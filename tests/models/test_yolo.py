"""The YOLO-style detector gives onnxruntime's boxes and scores at any input size.

``yolo_small.onnx`` (``scripts/export_test_models.py``) takes ``[batch, 3, height, width]``
with all three dimensions symbolic. Its decoding grid is built at run time from the
input's height and width (Shape, Gather, Range, Expand), so a second input size checks
that no shape was frozen when the session was built.
"""

from pathlib import Path

import numpy as np
import onnx
import pytest

import onnxrt as ort

rt = pytest.importorskip("onnxruntime")

MODEL = Path(__file__).parent / "data" / "yolo_small.onnx"
CLASSES = 4


def test_detector_has_symbolic_image_dims_and_the_expected_ops():
    model = onnx.load(MODEL)
    dims = [d.dim_param or d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    assert dims == ["batch", 3, "height", "width"]
    ops = {n.op_type for n in model.graph.node}
    assert {"Conv", "Sigmoid", "Mul", "Resize", "Concat", "Range", "Shape"} <= ops
    assert MODEL.stat().st_size < 1_000_000


@pytest.mark.parametrize("batch,height,width", [(1, 64, 96), (2, 128, 160)])
def test_detector_matches_onnxruntime(batch, height, width):
    x = np.random.default_rng(height).standard_normal((batch, 3, height, width)).astype(np.float32)
    sess = ort.InferenceSession(str(MODEL), providers=["CPUExecutionProvider"])
    boxes, scores = sess.run(None, {"images": x})
    want_boxes, want_scores = rt.InferenceSession(str(MODEL), providers=["CPUExecutionProvider"]).run(
        None, {"images": x})
    anchors = (height // 8) * (width // 8) + (height // 16) * (width // 16)
    assert boxes.shape == (batch, anchors, 4) and boxes.dtype == np.float32
    assert scores.shape == (batch, anchors, CLASSES)
    np.testing.assert_allclose(boxes, want_boxes, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(scores, want_scores, rtol=1e-4, atol=1e-5)
    # the boxes are spread over the whole image, and x2 > x1, y2 > y1
    assert boxes[..., 2].max() > 0.8 * width and boxes[..., 3].max() > 0.8 * height
    assert (boxes[..., 2] > boxes[..., 0]).all() and (boxes[..., 3] > boxes[..., 1]).all()
    assert ((scores > 0) & (scores < 1)).all()
