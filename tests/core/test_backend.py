"""``onnxrt.backend`` is a standard ``onnx.backend.base.Backend``."""

import re

import numpy as np
import onnx.backend.test
from onnx import helper

import onnxrt.backend as backend

# the onnx package's own backend test runner, over a few node tests (the whole
# node suite runs through sessions in tests/conformance)
_PATTERN = re.compile(r"^test_(abs|relu|gemm_default_.*|if|loop11|scan9_sum|sequence_map_.*)_cpu$")
_suite = onnx.backend.test.BackendTest(backend, __name__)
for _name, _cls in _suite.test_cases.items():
    for _attr in [a for a in vars(_cls) if a.startswith("test_")]:
        if not _PATTERN.match(_attr):
            delattr(_cls, _attr)
    globals()[_name] = _cls


def test_run_node_and_prepare():
    node = helper.make_node("Mul", ["a", "b"], ["c"])
    (c,) = backend.run_node(node, [np.array([2.0], np.float32), np.array([3.0], np.float32)])
    assert c.tolist() == [6.0]
    assert backend.supports_device("CPU")
    assert not backend.supports_device("TPU")
