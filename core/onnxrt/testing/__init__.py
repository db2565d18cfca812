"""Tools for testing onnxrt providers: ONNX node tests, output comparison, model builders.

Provider authors use these directly or through the pytest plugin
(:mod:`onnxrt.testing.plugin`).
"""

from .compare import assert_outputs_close
from .nodetests import NodeTest, iter_node_tests, run_node_test

__all__ = ["assert_outputs_close", "NodeTest", "iter_node_tests", "run_node_test"]
