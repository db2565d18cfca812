"""Small edits of a model for the tools that inspect one (``onnxrt compare``, the
quantization tools): names for unnamed nodes, every value exposed as an output; and,
for shape inference, its large weights emptied of their data and filled again."""

from __future__ import annotations

import math
from typing import Iterator

import onnx

__all__ = ["name_nodes", "expose_all_outputs", "large_tensors", "hollow", "refill"]

#: integer tensors keep their data at any size: shape inference propagates their values
_KEEP_INTS = (onnx.TensorProto.INT64, onnx.TensorProto.INT32)


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


def _is_large(t: onnx.TensorProto, limit: int) -> bool:
    return t.data_type not in _KEEP_INTS and math.prod(t.dims) > limit


def large_tensors(graph: onnx.GraphProto, limit: int) -> Iterator[onnx.TensorProto]:
    """The tensors of ``graph`` and its subgraphs holding more than ``limit`` elements of
    a type other than INT32/INT64: initializers and ``Constant`` nodes' ``value``, in one
    fixed order (a graph's initializers, then its nodes in order, each node's subgraphs
    where they stand), so that two copies of one model list theirs alike."""
    for t in graph.initializer:
        if _is_large(t, limit):
            yield t
    for n in graph.node:
        for a in n.attribute:
            if a.type == onnx.AttributeProto.TENSOR and n.op_type == "Constant" and a.name == "value":
                if _is_large(a.t, limit):
                    yield a.t
            elif a.type == onnx.AttributeProto.GRAPH:
                yield from large_tensors(a.g, limit)
            elif a.type == onnx.AttributeProto.GRAPHS:
                for g in a.graphs:
                    yield from large_tensors(g, limit)


def hollow(graph: onnx.GraphProto, limit: int) -> int:
    """Empty the :func:`large_tensors` of ``graph`` of their data, in place, keeping
    their names, types and shapes; return how many.

    Shape inference reads a large float tensor's type and shape, never its values (the
    values it propagates are shapes and indices, integers, and small), but it copies the
    whole model it is given several times over (serialized, parsed, inferred, serialized
    back): given the model hollowed, the copies hold no weights.
    """
    count = 0
    for t in large_tensors(graph, limit):
        for field in ("raw_data", "float_data", "double_data", "int32_data", "int64_data",
                      "uint64_data", "string_data"):
            t.ClearField(field)
        count += 1
    return count


def refill(hollowed: onnx.GraphProto, source: onnx.GraphProto, limit: int) -> bool:
    """Copy the data of ``source``'s :func:`large_tensors` back into those of
    ``hollowed`` (``source`` hollowed, then given types by shape inference, which adds
    value types and leaves nodes and tensors where they are). Returns False, changing
    nothing, where the two do not list the same tensors (by name, type and shape)."""
    dst, src = list(large_tensors(hollowed, limit)), list(large_tensors(source, limit))
    if len(dst) != len(src) or any((a.name, a.data_type, list(a.dims)) != (b.name, b.data_type, list(b.dims))
                                   for a, b in zip(dst, src)):
        return False
    for a, b in zip(dst, src):
        a.CopyFrom(b)
    return True
