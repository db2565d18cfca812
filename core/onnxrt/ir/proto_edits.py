"""Small edits of a model for the tools that inspect one (``onnxrt compare``, the
quantization tools): names for unnamed nodes, every value exposed as an output."""

from __future__ import annotations

import onnx

__all__ = ["name_nodes", "expose_all_outputs"]


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


def expose_all_outputs(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` with every node output of its main graph also a graph output
    (untyped), so that one run shows every intermediate value."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    outputs = {o.name for o in m.graph.output}
    for n in m.graph.node:
        for o in n.output:
            if o and o not in outputs:
                m.graph.output.append(onnx.ValueInfoProto(name=o))
                outputs.add(o)
    return m
