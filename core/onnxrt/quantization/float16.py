"""float32 -> float16 conversion, with onnxconverter-common's signature.

Every float32 tensor becomes float16 except around the nodes kept in float32: the
ops of :data:`DEFAULT_OP_BLOCK_LIST` (which have no float16 kernels in the usual
runtimes), those in ``op_block_list``, the nodes named in ``node_block_list``, nodes
with subgraphs and nodes of domains other than ai.onnx and com.microsoft. A ``Cast``
joins a float16 tensor to a float32 reader and back; a constant read in both
precisions is stored in both. Node outputs keep their names, so a converted model's
values can be compared with the float32 model's by name.

Constants are clipped to float16's useful range first: magnitudes below
``min_positive_val`` become ``min_positive_val`` (with their sign), those above
``max_finite_val`` become ``max_finite_val``. Inputs that the ONNX schema types as
float32 only (``Resize``'s scales, ``Upsample``'s) stay float32.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ..errors import InvalidArgument
from ..ir.proto_edits import name_nodes
from .graph import GraphIndex, Names, load_input_model

__all__ = ["convert_float_to_float16", "DEFAULT_OP_BLOCK_LIST", "float16_plan"]

#: onnxconverter-common's list: ops kept in float32 by default.
DEFAULT_OP_BLOCK_LIST = (
    "ArrayFeatureExtractor", "Binarizer", "CastMap", "CategoryMapper", "DictVectorizer", "FeatureVectorizer",
    "Imputer", "LabelEncoder", "LinearClassifier", "LinearRegressor", "Normalizer", "OneHotEncoder",
    "RandomUniformLike", "SVMClassifier", "SVMRegressor", "Scaler", "TreeEnsembleClassifier",
    "TreeEnsembleRegressor", "ZipMap", "NonMaxSuppression", "TopK", "RoiAlign", "Range", "CumSum", "Min",
    "Max", "Upsample",
)

#: Inputs the schema types as float32 only, by op type.
_FLOAT32_INPUTS = {"Resize": {2}, "Upsample": {1}}
_DOMAINS = ("", "ai.onnx", "com.microsoft")


def _to_half(arr: np.ndarray, min_positive_val: float, max_finite_val: float) -> np.ndarray:
    a = np.asarray(arr, dtype=np.float32)
    mag = np.abs(a)
    a = np.where((mag > 0) & (mag < min_positive_val), np.sign(a) * min_positive_val, a)
    a = np.where(mag > max_finite_val, np.sign(a) * max_finite_val, a)  # inf becomes the limit too
    return a.astype(np.float16)


def _blocked(node: onnx.NodeProto, ops: set[str], names: set[str]) -> bool:
    if node.op_type in ops or node.name in names or node.domain not in _DOMAINS:
        return True
    return any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute)


def float16_plan(model: onnx.ModelProto, op_block_list: Sequence[str] | None = None,
                 node_block_list: Sequence[str] | None = None) -> dict[str, bool]:
    """``{node name: True when it runs in float16}`` for :func:`convert_float_to_float16`'s rules."""
    name_nodes(model.graph)
    ops = set(DEFAULT_OP_BLOCK_LIST if op_block_list is None else op_block_list)
    names = set(node_block_list or ())
    return {n.name: not _blocked(n, ops, names) for n in model.graph.node}


def convert_float_to_float16(
    model,
    min_positive_val: float = 1e-7,
    max_finite_val: float = 1e4,
    keep_io_types: bool = False,
    disable_shape_infer: bool = False,
    op_block_list: Sequence[str] | None = None,
    node_block_list: Sequence[str] | None = None,
    check_fp16_ready: bool = True,
) -> onnx.ModelProto:
    """The float16 version of ``model`` (a path, bytes or ``ModelProto``; not modified).

    :param keep_io_types: keep float32 graph inputs and outputs (a ``Cast`` at each).
    :param disable_shape_infer: use only the types the model declares (for models
        onnx's shape inference cannot handle); tensors of unknown type stay as they are.
    :param op_block_list: op types kept in float32 (default :data:`DEFAULT_OP_BLOCK_LIST`).
    :param node_block_list: node names kept in float32.
    :param check_fp16_ready: refuse a model that already holds float16 inputs or weights.
    """
    if not (0 < min_positive_val < max_finite_val):
        raise InvalidArgument(f"need 0 < min_positive_val < max_finite_val, got {min_positive_val}, {max_finite_val}")
    m = load_input_model(model)
    if check_fp16_ready and (any(t.data_type == TensorProto.FLOAT16 for t in m.graph.initializer)
                             or any(v.type.tensor_type.elem_type == TensorProto.FLOAT16 for v in m.graph.input)):
        raise InvalidArgument("the model already holds float16 inputs or weights; pass check_fp16_ready=False "
                              "to convert the rest")
    name_nodes(m.graph)
    known = {n.name for n in m.graph.node}
    missing = sorted(set(node_block_list or ()) - known)
    if missing:
        raise InvalidArgument(f"node_block_list names nodes the model does not have: {missing[:10]}")
    half = float16_plan(m, op_block_list, node_block_list)
    index = GraphIndex(m, infer=not disable_shape_infer)
    g = m.graph
    names = Names(g)
    F32, F16 = TensorProto.FLOAT, TensorProto.FLOAT16
    is_f32 = index.is_float

    def wants_half(node: onnx.NodeProto, i: int) -> bool:
        return half[node.name] and i not in _FLOAT32_INPUTS.get(node.op_type, ())

    # constants: converted in place where every float reader wants float16
    uses: dict[str, set[bool]] = {}
    for n in g.node:
        for i, t in enumerate(n.input):
            if t in index.initializers and is_f32(t):
                uses.setdefault(t, set()).add(wants_half(n, i))
    state: dict[str, int] = {}  # float tensor -> F32 or F16 as the new graph holds it
    inits = {t.name: t for t in g.initializer}
    for t, kinds in uses.items():
        if kinds == {True} and t not in index.graph_outputs:
            inits[t].CopyFrom(numpy_helper.from_array(
                _to_half(numpy_helper.to_array(inits[t]), min_positive_val, max_finite_val), t))
            state[t] = F16
        else:
            state[t] = F32
    for v in g.input:
        if v.name in inits or not is_f32(v.name):
            continue
        if keep_io_types:
            state[v.name] = F32
        else:
            v.type.tensor_type.elem_type = F16
            state[v.name] = F16

    casts: dict[tuple[str, int], str] = {}
    out_nodes: list[onnx.NodeProto] = []

    def as_type(t: str, want: int) -> str:
        if state.get(t, want) == want:
            return t
        key = (t, want)
        if key not in casts:
            if t in inits and want == F16:  # a constant read in both precisions: a float16 copy
                name = names(f"{t}_fp16")
                g.initializer.append(numpy_helper.from_array(
                    _to_half(numpy_helper.to_array(inits[t]), min_positive_val, max_finite_val), name))
            else:
                name = names(f"{t}_to_{'fp16' if want == F16 else 'fp32'}")
                out_nodes.append(helper.make_node("Cast", [t], [name], to=want, name=names(f"{name}_Cast")))
            casts[key] = name
        return casts[key]

    for n in list(g.node):
        h = half[n.name]
        for i, t in enumerate(n.input):
            if t and t in state:
                n.input[i] = as_type(t, F16 if wants_half(n, i) else F32)
        if h:
            for a in n.attribute:
                if a.name in ("to", "dtype") and a.type == onnx.AttributeProto.INT and a.i == F32:
                    a.i = F16
                elif a.name in ("value",) and a.type == onnx.AttributeProto.TENSOR and a.t.data_type == F32:
                    a.t.CopyFrom(numpy_helper.from_array(
                        _to_half(numpy_helper.to_array(a.t), min_positive_val, max_finite_val), a.t.name))
        for o in n.output:
            if o and is_f32(o):
                state[o] = F16 if h else F32
        out_nodes.append(n)

    # graph outputs
    for v in g.output:
        t = v.name
        if state.get(t) != F16:
            continue
        if keep_io_types:
            inner = names(f"{t}_fp16")
            for n in out_nodes:
                for k, o in enumerate(n.output):
                    if o == t:
                        n.output[k] = inner
                for k, i in enumerate(n.input):
                    if i == t:
                        n.input[k] = inner
            out_nodes.append(helper.make_node("Cast", [inner], [t], to=F32, name=names(f"{t}_Cast")))
            state[inner], state[t] = F16, F32
        else:
            v.type.tensor_type.elem_type = F16
    for v in g.value_info:
        if v.type.HasField("tensor_type") and v.type.tensor_type.elem_type == F32 and state.get(v.name) == F16:
            v.type.tensor_type.elem_type = F16
    del g.node[:]
    g.node.extend(out_nodes)
    return m
