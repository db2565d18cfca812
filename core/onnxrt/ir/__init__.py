"""Stage 2, IR: the in-memory graph (:mod:`.graph`) and the inlining of ONNX functions
(:mod:`.inline`) that no provider has a kernel for."""

from .graph import MAX_NESTING, Graph, Node, check_tensor_data, tensor_to_array

__all__ = ["Node", "Graph", "MAX_NESTING", "tensor_to_array", "check_tensor_data"]
