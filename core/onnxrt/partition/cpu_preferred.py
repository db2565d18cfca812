"""Partitioning helpers: which nodes should stay on the CPU whatever their provider.

Like onnxruntime's ``GetCpuPreferredNodes``: shape computations (``Shape``/``Size``
and the small integer arithmetic on their results that feeds ``Reshape``, ``Expand``
and friends) are cheap on the host and would only cost device round trips, so a
device provider does not take them even when it has kernels for them.
"""

from __future__ import annotations

import numpy as np

from ..ir.graph import Graph

__all__ = ["cpu_preferred_nodes", "SHAPE_SOURCES"]

#: ops whose output is a shape (or size) of their input
SHAPE_SOURCES = {"Shape", "Size"}
#: ops that merely rearrange or compute on small integer vectors
_SHAPE_ARITH = {
    "Gather", "Concat", "Unsqueeze", "Squeeze", "Slice", "Cast", "Add", "Sub", "Mul", "Div", "Mod",
    "Max", "Min", "Equal", "Where", "Range", "ReduceProd", "ReduceSum", "Reshape", "Identity",
    "ConstantOfShape", "Neg", "Abs", "Floor", "Ceil", "Less", "Greater", "Not", "And", "Or",
}
#: above this many elements an initializer is data, not a shape
_SMALL = 64


def cpu_preferred_nodes(graph: Graph) -> set[int]:
    """``id``s of the nodes in ``graph`` that compute shapes and should stay on the host."""
    small_consts = {k for k, v in graph.initializers.items() if np.size(v) <= _SMALL}
    shape_values: set[str] = set()
    preferred: set[int] = set()
    for node in graph.nodes:  # topological order: producers come first
        if node.domain != "":
            continue
        if node.op_type in SHAPE_SOURCES:
            ok = True
        elif node.op_type in _SHAPE_ARITH:
            ins = [i for i in node.inputs if i]
            ok = bool(ins) and any(i in shape_values for i in ins) and all(
                i in shape_values or i in small_consts for i in ins
            )
        else:
            ok = False
        if ok:
            preferred.add(id(node))
            shape_values.update(o for o in node.outputs if o)
    return preferred
