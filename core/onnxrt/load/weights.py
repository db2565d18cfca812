"""The model's large initializers, held as arrays beside a proto without them.

A session keeps the model's structure and its weights as arrays, never the weights
twice: the full proto is dropped once they are decoded. A big model file's large
weights are read straight from the file (:mod:`.large_weights`); a model given as bytes
or a ``ModelProto`` has them decoded from the parsed message (:func:`split_weights`).
"""

from __future__ import annotations

import math
import os
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
    """The model without its large main-graph initializers, and those decoded to arrays.

    Integer tensors stay in the proto at any size: shape inference propagates their
    values (Reshape targets, Slice bounds, Gather indices).
    """
    keep_ints = (onnx.TensorProto.INT64, onnx.TensorProto.INT32)
    big = [t for t in proto.graph.initializer
           if t.data_type not in keep_ints and math.prod(t.dims) > LARGE_WEIGHT]
    if not big:
        return proto, {}
    weights = {}
    for t in big:
        if t.name in weights:
            raise InvalidGraph(f"initializer {t.name!r} is defined twice")
        weights[t.name] = tensor_to_array(t, "initializer")
    light = ModelProto()
    _copy_fields(proto, light, skip="graph")
    _copy_fields(proto.graph, light.graph, skip="initializer")
    light.graph.initializer.extend(t for t in proto.graph.initializer if t.name not in weights)
    return light, weights


def _copy_fields(src, dst, skip: str) -> None:
    """Copy every set field of message ``src`` into ``dst`` except ``skip``, leaving ``src`` as it is."""
    for fd, value in src.ListFields():
        if fd.name == skip:
            continue
        # protobuf 5.28 added is_repeated and later ones dropped label
        if fd.is_repeated if hasattr(fd, "is_repeated") else fd.label == fd.LABEL_REPEATED:
            getattr(dst, fd.name).extend(value)
        elif fd.message_type is not None:
            getattr(dst, fd.name).CopyFrom(value)
        else:
            setattr(dst, fd.name, value)
