"""What the quantizers and the float16 converter share: loading and saving models,
the opset, unique names, and an index of a graph's tensors (producers, consumers,
constants and element types)."""

from __future__ import annotations

import copy
import os
from collections import defaultdict
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ..errors import InvalidArgument, InvalidGraph

__all__ = ["load_input_model", "save_output_model", "ensure_opset", "opset_of", "Names", "GraphIndex",
           "FLOAT_TYPES", "op_counts"]

#: The element types quantization and float16 conversion rewrite.
FLOAT_TYPES = (TensorProto.FLOAT,)

MS_DOMAIN = "com.microsoft"


def load_input_model(model_input) -> onnx.ModelProto:
    """A private copy of ``model_input`` (a path, serialized bytes or a ``ModelProto``),
    its external data loaded."""
    if isinstance(model_input, onnx.ModelProto):
        return copy.deepcopy(model_input)
    if isinstance(model_input, (bytes, bytearray)):
        from ..load import load_model

        return load_model(bytes(model_input))[0]
    if isinstance(model_input, (str, os.PathLike)):
        from ..load import load_model

        return load_model(os.fspath(model_input))[0]
    raise InvalidArgument(f"model_input must be a path, bytes or an onnx.ModelProto, not {type(model_input).__name__}")


def save_output_model(model: onnx.ModelProto, model_output, use_external_data_format: bool = False) -> None:
    """Write ``model`` to the path ``model_output`` (its weights in a side file when
    ``use_external_data_format``)."""
    if not isinstance(model_output, (str, os.PathLike)):
        raise InvalidArgument(f"model_output must be a path, not {type(model_output).__name__}")
    path = Path(model_output)
    if path.is_dir():
        raise InvalidArgument(f"model_output {str(path)!r} is a directory, not a file path")
    path.parent.mkdir(parents=True, exist_ok=True)
    if use_external_data_format:
        onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                        location=path.name + ".data", size_threshold=1024)
    else:
        onnx.save_model(model, str(path))


def opset_of(model: onnx.ModelProto, domain: str = "") -> int:
    """The model's opset version for ``domain`` (0 when not imported)."""
    for o in model.opset_import:
        if o.domain in (domain, "ai.onnx" if domain == "" else domain):
            return int(o.version)
    return 0


def ensure_opset(model: onnx.ModelProto, version: int) -> onnx.ModelProto:
    """``model`` with an ai.onnx opset of at least ``version`` (converted with onnx's
    version converter when lower)."""
    current = opset_of(model)
    if current >= version:
        return model
    from onnx import version_converter

    ir = model.ir_version
    try:
        converted = version_converter.convert_version(model, version)
    except Exception as e:  # noqa: BLE001 - onnx raises plain RuntimeErrors
        raise InvalidArgument(f"the model has opset {current}; quantizing needs opset {version} or later, "
                              f"and converting it failed: {e}") from e
    converted.ir_version = max(ir, 7)
    return converted


def add_domain(model: onnx.ModelProto, domain: str, version: int = 1) -> None:
    """Import ``domain`` into ``model`` unless it is already imported."""
    if not any(o.domain == domain for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(domain, version))


class Names:
    """Fresh tensor and node names that collide with none of the graph's."""

    def __init__(self, graph: onnx.GraphProto):
        self.used: set[str] = set()
        for v in list(graph.input) + list(graph.output) + list(graph.value_info):
            self.used.add(v.name)
        for t in graph.initializer:
            self.used.add(t.name)
        for n in graph.node:
            self.used.update(n.output)
            self.used.update(n.input)
            if n.name:
                self.used.add(n.name)

    def __call__(self, base: str) -> str:
        name, k = base, 1
        while name in self.used:
            name = f"{base}_{k}"
            k += 1
        self.used.add(name)
        return name


class GraphIndex:
    """Producers, consumers, constants and element types of a graph's tensors."""

    def __init__(self, model: onnx.ModelProto, infer: bool = True):
        self.model = model
        g = model.graph
        self.initializers = {t.name: t for t in g.initializer}
        self.graph_inputs = [v.name for v in g.input if v.name not in self.initializers]
        self.graph_outputs = [v.name for v in g.output]
        self.producer: dict[str, onnx.NodeProto] = {}
        self.consumers: dict[str, list[onnx.NodeProto]] = defaultdict(list)
        for n in g.node:
            for o in n.output:
                if o:
                    self.producer[o] = n
            for i in n.input:
                if i:
                    self.consumers[i].append(n)
        self.types: dict[str, int] = {}
        typed = model
        if infer:
            try:
                typed = onnx.shape_inference.infer_shapes(model, data_prop=True)
            except Exception:  # noqa: BLE001 - an op shape inference cannot handle: keep what is declared
                typed = model
        for v in list(typed.graph.input) + list(typed.graph.output) + list(typed.graph.value_info):
            if v.type.HasField("tensor_type") and v.type.tensor_type.elem_type:
                self.types[v.name] = v.type.tensor_type.elem_type
        for t in g.initializer:
            self.types[t.name] = t.data_type
        for n in g.node:
            if n.op_type == "Constant" and n.domain in ("", "ai.onnx"):
                for a in n.attribute:
                    if a.name == "value":
                        self.types[n.output[0]] = a.t.data_type

    def is_float(self, name: str) -> bool:
        """True when ``name`` is known to be a float32 tensor."""
        return self.types.get(name) in FLOAT_TYPES

    def constant(self, name: str) -> np.ndarray | None:
        """The value of initializer ``name`` (``None`` when it is not one)."""
        t = self.initializers.get(name)
        return None if t is None else numpy_helper.to_array(t)


def op_counts(model: onnx.ModelProto) -> dict[str, int]:
    """``{op_type: count}`` over the main graph (domain-qualified for custom domains)."""
    counts: dict[str, int] = {}
    for n in model.graph.node:
        key = n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}.{n.op_type}"
        counts[key] = counts.get(key, 0) + 1
    return counts


def is_valid(model: onnx.ModelProto) -> bool:
    """Whether ``model`` passes onnx's checker."""
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError:
        return False
    return True


def check_graph(model: onnx.ModelProto, input_valid: bool = True) -> None:
    """Raise :class:`~onnxrt.errors.InvalidGraph` when ``model`` fails onnx's checker
    (only when the input model passed it: what it already broke is not checked again)."""
    if not input_valid:
        return
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as e:
        raise InvalidGraph(f"the quantized model is not valid ONNX: {e}") from e
