"""Tools for testing onnxrt providers: ONNX node tests, output comparison, model builders.

Provider authors use these directly or through the pytest plugin
(:mod:`onnxrt.testing.plugin`, loaded automatically when onnxrt is installed), whose
fixtures are ``onnxrt_node_test``, ``onnxrt_compare``, ``onnxrt_models`` and
``onnxrt_provider``.
"""

from . import models
from .compare import Comparison, assert_outputs_close, compare_with_cpu
from .nodetests import (
    NodeRefused,
    NodeTest,
    claimed_ops,
    iter_node_tests,
    provider_node_tests,
    run_node_test,
    run_provider_node_test,
)

__all__ = [
    "assert_outputs_close",
    "compare_with_cpu",
    "Comparison",
    "NodeTest",
    "NodeRefused",
    "iter_node_tests",
    "run_node_test",
    "claimed_ops",
    "provider_node_tests",
    "run_provider_node_test",
    "models",
]
