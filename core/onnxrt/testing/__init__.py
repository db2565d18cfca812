"""Tools for testing onnxrt providers: ONNX node tests, output comparison, model builders.

Provider authors use these directly or through the pytest plugin, whose fixtures are
``onnxrt_node_test``, ``onnxrt_compare``, ``onnxrt_models`` and ``onnxrt_provider``
(:mod:`onnxrt.testing.plugin`). The plugin is opt-in: ``-p onnxrt.testing`` on pytest's
command line or in its ``addopts``, or ``pytest_plugins = ["onnxrt.testing"]`` in a
top-level ``conftest.py``.
"""

from . import models
from .outputs import Comparison, assert_outputs_close, compare_with_cpu
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

#: ``-p onnxrt.testing`` registers this package with pytest, which then loads the
#: modules named here: the hooks and fixtures live in :mod:`.plugin`, so importing
#: these tools outside pytest does not import pytest
pytest_plugins = ["onnxrt.testing.plugin"]
