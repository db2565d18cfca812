"""Models and data shared by the quantization tests (built once per session)."""

import numpy as np
import pytest

from . import models


@pytest.fixture(scope="session")
def digits():
    """(model path, calibration pixels, held-out pixels, held-out labels)."""
    return models.digits()


@pytest.fixture(scope="session")
def cnn():
    """(model, calibration images, test images)."""
    return models.cnn(), models.cnn_data(64, seed=1), models.cnn_data(32, seed=2)


@pytest.fixture(scope="session")
def encoder():
    """(model, calibration inputs, test inputs)."""
    return models.encoder(), models.encoder_data(64, seed=1), models.encoder_data(32, seed=2)


def run_onnxrt(model, feeds, level=None):
    """The outputs of ``model`` (a ModelProto or path) on onnxrt."""
    import onnxrt

    so = onnxrt.SessionOptions()
    if level is not None:
        so.graph_optimization_level = level
    data = model if isinstance(model, str) else model.SerializeToString()
    return onnxrt.InferenceSession(data, so).run(None, feeds)


def run_onnxruntime(model, feeds, basic=False):
    """The outputs of ``model`` on onnxruntime's CPU provider (``basic``: its level 1
    optimizations only, without its QDQ node-unit rewrites)."""
    ort = pytest.importorskip("onnxruntime")
    so = ort.SessionOptions()
    if basic:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    data = model if isinstance(model, str) else model.SerializeToString()
    return ort.InferenceSession(data, so, providers=["CPUExecutionProvider"]).run(None, feeds)


class OrtReader:
    """An onnxruntime CalibrationDataReader over the same batches, for its own tool."""

    def __init__(self, batches):
        self.batches = list(batches)
        self.pos = 0

    def get_next(self):
        if self.pos >= len(self.batches):
            return None
        self.pos += 1
        return self.batches[self.pos - 1]


def batches(name, x, size=16):
    return [{name: x[i:i + size]} for i in range(0, len(x), size)]


def top1(labels, truth) -> float:
    return float((np.asarray(labels) == truth).mean())
