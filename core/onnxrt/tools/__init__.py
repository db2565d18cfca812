"""Tools built on the session, usable from Python and behind the ``onnxrt`` command.

- :mod:`onnxrt.tools.feeds`: random inputs for a session, with symbolic dimensions fixed;
- :mod:`onnxrt.tools.compare`: run a model two ways (two provider lists, or onnxrt
  and onnxruntime), measure the error per output, and find the first node whose
  outputs differ.
"""

from .compare import CompareReport, NodeDivergence, ValueDiff, compare_models
from .feeds import random_feeds, resolve_shape

__all__ = ["compare_models", "CompareReport", "NodeDivergence", "ValueDiff", "random_feeds", "resolve_shape"]
