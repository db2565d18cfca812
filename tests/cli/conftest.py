"""Fixtures for the ``onnxrt`` command tests: the YOLO-style detector and a planted bug."""

from pathlib import Path

import pytest

import onnxrt

YOLO = Path(__file__).parent.parent / "models" / "data" / "yolo_small.onnx"
#: small image dims keep every verb fast
DIMS = ["--dim", "batch=1", "--dim", "height=64", "--dim", "width=96"]


@pytest.fixture
def yolo():
    """Path to the detector: ``images [batch, 3, height, width]`` -> ``boxes``, ``scores``."""
    return str(YOLO)


@pytest.fixture
def wrong_sigmoid():
    """Register the provider with the wrong Sigmoid for one test, then remove it."""
    from . import planted

    onnxrt.plugin.discovery.register_plugin(planted, name="planted")
    planted.WrongSigmoidProvider.targets = None
    try:
        yield planted.WrongSigmoidProvider
    finally:
        planted.WrongSigmoidProvider.targets = None
        onnxrt.plugin.discovery.unregister_plugin(planted)
