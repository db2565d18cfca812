"""The model's large initializers, held as arrays beside a proto without them.

A session keeps the model's structure and its weights as arrays, never the weights
twice: the full proto is dropped once they are decoded. A big model file's large
weights are read straight from the file (:mod:`.large_weights`); a model given as bytes
or a ``ModelProto`` has them decoded from the parsed message (:func:`split_weights`).
"""

from __future__ import annotations

import math
import os
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
from onnx import ModelProto

from ..errors import InvalidGraph
from ..ir.graph import tensor_to_array
from .large_weights import split_large_weights
from .model import load_model

__all__ = ["LARGE_WEIGHT", "load_with_weights", "split_weights"]

#: initializers above this many elements are held as arrays, outside the kept proto
LARGE_WEIGHT = 1024


def load_with_weights(model, session_options=None) -> tuple[ModelProto, Path | None, dict[str, np.ndarray]]:
    """:func:`~onnxrt.load.load_model`, with the large weights of a big model file read
    straight from the file and returned beside the model rather than inside it;
    everything else goes the ordinary way. ``session_options`` supplies external
    initializers and in-memory external-data files (``add_external_initializers``...)."""
    supplied = {"external_initializers": getattr(session_options, "_external_initializers", None) or None,
                "external_files": getattr(session_options, "_external_files", None) or None}
    if isinstance(model, (str, os.PathLike)):
        path = Path(model)
        if _is_file(path):
            split = split_large_weights(path, LARGE_WEIGHT)
            if split is not None:
                data, weights = split
                # external data resolves beside the path as given (a symlinked model too)
                proto, model_dir = load_model(data, base_dir=Path(os.path.abspath(path)).parent,
                                              source=str(path), real_dir=path.resolve().parent,
                                              split_off=weights.keys(), **supplied)
                return proto, model_dir, weights
    proto, model_dir = load_model(model, **supplied)
    return proto, model_dir, {}


def _is_file(path: Path) -> bool:
    """``path.is_file()``, False where the system refuses the path itself (a name too
    long, a NUL byte): :func:`~onnxrt.load.load_model` then says why, with its type."""
    try:
        return path.is_file()
    except (OSError, ValueError):
        return False


def split_weights(proto: ModelProto) -> tuple[ModelProto, dict[str, np.ndarray]]:
    """The model without its large main-graph weights, and those decoded to arrays.

    The weights are the large initializers and the large tensors of main-graph
    ``Constant`` nodes (exporters such as paddle2onnx put every weight in one): such a
    node's output is a constant of the graph either way, and left in the structure it
    would travel through shape inference, which copies the whole model several times
    over (ppocr-rec, 11 MB of weights in 420 Constant nodes: 48 MB more at the peak).
    Integer tensors stay in the proto at any size: shape inference propagates their
    values (Reshape targets, Slice bounds, Gather indices).
    """
    keep_ints = (onnx.TensorProto.INT64, onnx.TensorProto.INT32)

    def large(t: onnx.TensorProto) -> bool:
        return t.data_type not in keep_ints and math.prod(t.dims) > LARGE_WEIGHT

    g = proto.graph
    big = [t for t in g.initializer if large(t)]
    constants = _large_constants(g, large)
    if not big and not constants:
        return proto, {}
    weights = {}
    for t in big:
        if t.name in weights:
            raise InvalidGraph(f"initializer {t.name!r} is defined twice")
        weights[t.name] = tensor_to_array(t, "initializer")
    for name, t in constants.items():
        weights[name] = tensor_to_array(t, f"Constant {name}")
    light = ModelProto()
    _copy_fields(proto, light, skip="graph")
    _copy_fields(g, light.graph, skip=("initializer", "node", "value_info"))
    light.graph.initializer.extend(t for t in g.initializer if t.name not in weights)
    light.graph.node.extend(n for n in g.node
                            if not (n.op_type == "Constant" and n.domain in ("", "ai.onnx")
                                    and len(n.output) == 1 and n.output[0] in constants))
    # a constant's declared type is its array's now (it enters shape inference as a typed input)
    light.graph.value_info.extend(vi for vi in g.value_info if vi.name not in constants)
    return light, weights


def _large_constants(g: onnx.GraphProto, large) -> dict[str, onnx.TensorProto]:
    """The main graph's ``Constant`` nodes holding one large tensor (``value``), by
    output name: those whose output is a plain name of the graph, neither one of its
    outputs (a graph output stays produced by a node) nor a name something else defines
    (a malformed graph keeps its node, and the checks report it as before)."""
    found: dict[str, onnx.TensorProto] = {}
    for n in g.node:
        if (n.op_type == "Constant" and n.domain in ("", "ai.onnx") and len(n.output) == 1
                and n.output[0] and len(n.attribute) == 1 and n.attribute[0].name == "value"
                and n.attribute[0].type == onnx.AttributeProto.TENSOR and large(n.attribute[0].t)):
            found[n.output[0]] = n.attribute[0].t
    if not found:
        return {}
    # a name defined more than once (by any two nodes, or a node and an input or an
    # initializer) keeps its nodes: the graph's checks refuse it as before
    defined = Counter(o for n in g.node for o in n.output if o in found)
    taken = {vi.name for vi in g.input} | {vi.name for vi in g.output} | {t.name for t in g.initializer}
    return {k: t for k, t in found.items() if defined[k] == 1 and k not in taken}


def _copy_fields(src, dst, skip: str | tuple[str, ...]) -> None:
    """Copy every set field of message ``src`` into ``dst`` except those ``skip`` names, leaving ``src`` as it is."""
    skip = (skip,) if isinstance(skip, str) else skip
    for fd, value in src.ListFields():
        if fd.name in skip:
            continue
        # protobuf 5.28 added is_repeated and later ones dropped label
        if fd.is_repeated if hasattr(fd, "is_repeated") else fd.label == fd.LABEL_REPEATED:
            getattr(dst, fd.name).extend(value)
        elif fd.message_type is not None:
            getattr(dst, fd.name).CopyFrom(value)
        else:
            setattr(dst, fd.name, value)
