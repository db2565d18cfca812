"""Names for a ``GraphProto``'s unnamed nodes, for tools that report nodes by name."""

from __future__ import annotations

import onnx

__all__ = ["name_nodes"]


def name_nodes(graph: onnx.GraphProto) -> None:
    """Give every unnamed node of ``graph`` a unique name (``OpType_index``), in place,
    so that options and reports can name it; named nodes keep their names."""
    seen = {n.name for n in graph.node if n.name}
    for i, n in enumerate(graph.node):
        if not n.name:
            name = f"{n.op_type}_{i}"
            while name in seen:
                name += "_"
            n.name = name
            seen.add(name)
