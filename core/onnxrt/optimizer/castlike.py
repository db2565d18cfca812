"""``CastLike`` whose target type is known becomes the ``Cast`` it means.

``CastLike(x, like)`` casts ``x`` to ``like``'s element type; once that type is known
(an initializer, or an inferred type) the node is a plain ``Cast(x, to=T)``, which is
what onnxruntime runs (it expands CastLike's function body) and what an optimized
model written by onnxruntime contains. ``like`` is then no longer read by this node.
"""

from __future__ import annotations

import numpy as np
from onnx import helper

from ..dtypes import onnx_elem_type
from ..options import GraphOptimizationLevel

__all__ = ["castlike_to_cast", "register"]


def _elem_type(graph, name: str) -> int:
    if name in graph.initializers:
        try:
            return onnx_elem_type(np.asarray(graph.initializers[name]).dtype)
        except TypeError:
            return 0
    tp = graph.value_types.get(name)
    if tp is not None and tp.WhichOneof("value") == "tensor_type":
        return int(tp.tensor_type.elem_type)
    return 0


def castlike_to_cast(graph, ctx) -> bool:
    """Rewrite every CastLike of the graph (and its subgraphs) whose target type is known."""
    changed = False
    for node in graph.nodes:
        for sg in node.all_subgraphs():
            changed |= castlike_to_cast(sg, ctx)
        if node.op_type != "CastLike" or node.domain not in ("", "ai.onnx") or len(node.inputs) != 2:
            continue
        to = _elem_type(graph, node.inputs[1])
        if not to:
            continue
        attrs = {k: a for k, a in node.attrs.items() if k == "saturate" and node.opset >= 19}
        attrs["to"] = helper.make_attribute("to", to)
        node.op_type = "Cast"
        node.inputs = node.inputs[:1]
        node.attrs = attrs
        changed = True
    return changed


def register(reg) -> None:
    """Add the rewrite, as a basic (level 1) transform."""
    reg.add("castlike_to_cast", castlike_to_cast, GraphOptimizationLevel.ORT_ENABLE_BASIC)
