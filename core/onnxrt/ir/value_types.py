"""The graph's value types: inferred from the model, and the free-dimension overrides."""

from __future__ import annotations

import logging

import numpy as np
import onnx
from onnx import ModelProto

from .graph import Graph
from .proto_edits import hollow, refill

__all__ = ["typed_structure", "apply_free_dims"]

logger = logging.getLogger("onnxrt")


#: tensors above this many elements go to shape inference without their data
HOLLOW_LIMIT = 1024


def typed_structure(proto: ModelProto, weights: dict[str, np.ndarray]) -> ModelProto:
    """The model's structure with inferred types; large ``weights`` enter as typed inputs.

    Shape inference copies the model it is given several times over; given only the
    structure (large weights declared as inputs of their type and shape, the large
    tensors left in the model, in subgraphs and ``Constant`` nodes, emptied of their
    data: :func:`~onnxrt.ir.proto_edits.hollow`) it costs no weight copy, and the
    values it propagates (shapes, small integer tensors) all stay. The tensors get
    their data back in the typed model it returns.
    """
    light = ModelProto()
    light.CopyFrom(proto)
    hollowed = hollow(light.graph, HOLLOW_LIMIT) > 0
    declared = {vi.name for vi in light.graph.input}
    light.graph.input.extend(
        onnx.helper.make_tensor_value_info(name, onnx.helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
        for name, a in weights.items() if name not in declared
    )
    try:
        typed = onnx.shape_inference.infer_shapes(light, check_type=False, strict_mode=False)
        if light.graph.value_info:
            # The model's own value_info can be stale (a shape that passes the checker
            # but is not what the graph computes), and fusions and folds act on types:
            # what inference computes from the graph alone wins, the declared types
            # fill in only where it computes nothing (after ops it does not know)
            bare = ModelProto()
            bare.CopyFrom(light)
            del bare.graph.value_info[:]
            computed = {vi.name: vi for vi in
                        onnx.shape_inference.infer_shapes(bare, check_type=False, strict_mode=False).graph.value_info}
            merged = [computed.pop(vi.name, vi) for vi in typed.graph.value_info] + list(computed.values())
            del typed.graph.value_info[:]
            typed.graph.value_info.extend(merged)
        if hollowed and not refill(typed.graph, proto.graph, HOLLOW_LIMIT):
            raise ValueError("shape inference moved the model's tensors")
        return typed
    except Exception as e:  # noqa: BLE001 - types help, but are optional
        logger.info("shape inference failed (%s); continuing without inferred types", e)
        if hollowed:
            refill(light.graph, proto.graph, HOLLOW_LIMIT)
        return light


def apply_free_dims(graph: Graph, by_name: dict[str, int], by_denotation: dict[str, int]) -> None:
    """Fix the graph inputs' symbolic dimensions the session options name."""
    if not by_name and not by_denotation:
        return
    for vi in graph.inputs:
        tp = graph.value_types.get(vi.name)
        if tp is None or tp.WhichOneof("value") != "tensor_type":
            continue
        for d in tp.tensor_type.shape.dim:
            if d.HasField("dim_param") and d.dim_param in by_name:
                d.dim_value = by_name[d.dim_param]
            elif d.denotation and d.denotation in by_denotation:
                d.dim_value = by_denotation[d.denotation]
