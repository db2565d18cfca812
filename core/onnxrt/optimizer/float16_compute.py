"""float16 nodes on the CPU provider computed in float32, as onnxruntime's CPU provider does.

numpy's float16 arithmetic is emulated and slow, and most of onnxruntime's CPU kernels
have no float16 form either: onnxruntime's ``InsertCastTransformer`` puts
``Cast(to=float)`` on the float16 inputs of every node its CPU provider has no float16
kernel for, runs the node in float32 and puts ``Cast(to=float16)`` on its float16
outputs; its ``RemoveDuplicateCastTransformer`` then removes the casts that cancel.
``float16_compute`` does the same, with the same choices, so that results stay those
of onnxruntime:

- **Which nodes.** A node the CPU provider owns, with a float16 tensor input, whose op
  onnxruntime's CPU provider has no float16 kernel for (:data:`ORT_FLOAT16_KERNELS`,
  read from onnxruntime 1.32's kernel registry on x86-64: data movement such as
  Reshape, Transpose, Concat, Slice, Gather, Shape, and Cast itself, but also
  LayerNormalization, Clip, Max/Min, which stay float16 here too), and that the CPU
  provider can run with float32 in place of float16. Nodes with subgraphs, nodes whose
  output type an attribute sets (``dtype``, ``to``) and random ops are left alone;
  integer and bool inputs and outputs are untouched. Bodies of If/Loop/Scan are
  visited as graphs of their own.
- **Isolated float16 nodes.** A node that has a float16 kernel but whose float16
  inputs all come from nodes computed in float32 (none from a graph input, an
  initializer or a float16 node), that makes a float16 output and no graph output,
  is computed in float32 too (onnxruntime's ``IsIsolatedFp16Node``): a Transpose
  between two convolutions does not round.
- **Exact float16 nodes.** Clip, Max, Min, Round and Sign give a float16 value for
  float16 inputs: those that stay float16 in onnxruntime run here in float32 on the
  same rounded inputs (the Cast pair before them is kept, none is needed after), which
  is onnxruntime's result exactly, without numpy's emulated float16 arithmetic.
- **Which roundings stay.** A float32 value rounded to float16 and straight back to
  float32 (``Cast(to=float16)`` then ``Cast(to=float)``) reads the float32 value
  instead, as onnxruntime's cast removal does (it treats float16 and float32 as one
  type group, so the pair is "lossless" to it): a chain of nodes computed in float32
  rounds once, where it leaves float32 (a graph output, a float16 node, a Cast to
  another type), **not at every node output**. Keeping the intermediate roundings
  would make onnxrt differ from onnxruntime by up to the accumulated rounding of the
  chain. A Cast whose output is a graph output is never removed, and a rounding Cast
  read only by Casts is dropped, those reading the float32 value (onnxruntime's rule),
  so ``Cast(to=int64)`` of a Sigmoid output truncates the float32 value. onnxruntime
  applies the removal to every Cast of the model; here it applies where one Cast of
  the pair is one this transform made (the model's own ``Cast(to=float16)`` of a
  float32 input feeding a converted node included: ``keep_io_types`` models).
- **Constants.** A float16 initializer read by a converted node gets a float32 twin
  (exact), made once at session creation, instead of a Cast at every run; one a feed
  may override gets a Cast.

Cast rounds to nearest even, and overflow gives inf, NaN stays NaN, in both runtimes.
The transform is basic (level 1) and runs after partitioning (it needs to know which
provider owns a node), so ``ORT_DISABLE_ALL`` runs float16 nodes as they are;
``disabled_optimizers=["float16_compute"]`` does too.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
from onnx import TensorProto, helper

from ..options import GraphOptimizationLevel

__all__ = ["ORT_FLOAT16_KERNELS", "float16_compute", "register"]

CPU = "CPUExecutionProvider"
_F16 = TensorProto.FLOAT16
_F32 = TensorProto.FLOAT
_INF = 2**31 - 1

#: (domain, op) -> opset ranges where onnxruntime's CPU provider has a float16 kernel
#: (onnxruntime 1.32, x86-64, ``get_all_opkernel_def``); these ops stay float16
ORT_FLOAT16_KERNELS: dict[tuple[str, str], tuple[tuple[int, int], ...]] = {
    **{("", op): ((since, _INF),) for op, since in {
        "Attention": 23, "BitCast": 26, "Cast": 6, "Celu": 28, "Clip": 12, "Compress": 9,
        "Concat": 4, "ConstantOfShape": 9, "DequantizeLinear": 19, "DynamicSlice": 1,
        "Expand": 8, "Flatten": 1, "Gather": 1, "GatherElements": 11, "GatherND": 11,
        "Identity": 1, "If": 1, "IsInf": 20, "IsNaN": 9, "LayerNormalization": 1, "Loop": 1,
        "Max": 12, "Min": 12, "Mod": 10, "Optional": 15, "OptionalGetElement": 15,
        "OptionalHasElement": 18, "QuantizeLinear": 19, "RMSNormalization": 23,
        "RandomNormalLike": 1, "RandomUniformLike": 1, "Reshape": 1, "ReverseSequence": 10,
        "RotaryEmbedding": 23, "Round": 11, "Scan": 8, "ScatterElements": 11,
        "ScatterND": 11, "SequenceAt": 11, "SequenceConstruct": 11, "Shape": 1,
        "Shrink": 9, "Sign": 9, "SimplifiedLayerNormalization": 1, "Slice": 1,
        "Split": 2, "SplitToSequence": 11, "Squeeze": 1, "TensorScatter": 24,
        "Transpose": 1, "Unsqueeze": 1,
    }.items()},
    ("", "Dropout"): ((7, 11),),
    ("", "Scatter"): ((9, 10),),
    **{("com.microsoft", op): ((1, _INF),) for op in (
        "BranchwiseRMSNorm", "EngramGate", "ExpandDims", "GatedAdd", "GatedDeltaNet",
        "GatedRMSNorm", "GatherBlockQuantized", "GatherND", "GatherPacked",
        "GroupQueryAttention", "HyperConnectionPostMix", "HyperConnectionPreMix", "Inverse",
        "LinearAttentionGate", "MRotaryEmbedding", "MatMulNBits", "MoEGroupRouter", "QMoE",
        "RotaryEmbedding", "ScaledSiLU", "SkipLayerNormalization",
        "SkipSimplifiedLayerNormalization", "SparseAttention", "UnfoldTensor",
        "VarlenCausalConvWithState",
    )},
}

#: never converted: random ops (their output type is an attribute, and onnxruntime
#: runs them as they are) and ops that make or read state
_LEFT_ALONE = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
               "Bernoulli", "Multinomial", "Constant", "CastLike", "EyeLike"}
#: float16 ops whose result on float16 values is exactly a float16 value: computed in
#: float32 on float16 inputs they need no rounding after them
_EXACT = {"Clip", "Max", "Min", "Round", "Sign"}


def _clip_bound_omitted(node) -> bool:
    """Whether a Clip leaves a bound out: the omitted bound is its type's limit, and
    float16's (65504) is not float32's, so such a Clip is not exact in float32."""
    if node.op_type != "Clip":
        return False
    if node.opset < 11:
        return "min" not in node.attrs or "max" not in node.attrs
    return len(node.inputs) < 3 or not node.inputs[1] or not node.inputs[2]
#: marks the Casts this transform made (node attribute ``doc_string``)
_MADE = "float16_compute: a float16 node computed in float32 on the CPU provider"
#: and the Casts to float32 that keep a rounding to float16 onnxruntime makes
_ROUNDING = _MADE + "; the rounding to float16 before it stays"


def _ort_has_float16(node) -> bool:
    domain = "" if node.domain in ("", "ai.onnx") else node.domain
    ranges = ORT_FLOAT16_KERNELS.get((domain, node.op_type))
    return bool(ranges) and any(lo <= node.opset <= hi for lo, hi in ranges)


class _Types:
    """Element types and value types of one graph (and the scopes around it)."""

    def __init__(self, graph):
        self.graph = graph
        self.overridable = set(graph.input_names())

    def type_proto(self, name: str):
        g = self.graph
        while g is not None:
            tp = g.value_types.get(name)
            if tp is not None:
                return tp
            g = g.parent
        return None

    def elem(self, name: str) -> int:
        g = self.graph
        while g is not None:
            if name in g.initializers:
                try:
                    return helper.np_dtype_to_tensor_dtype(np.asarray(g.initializers[name]).dtype)
                except (KeyError, TypeError, ValueError):
                    return 0
            tp = g.value_types.get(name)
            if tp is not None:
                return int(tp.tensor_type.elem_type) if tp.WhichOneof("value") == "tensor_type" else 0
            g = g.parent
        return 0

    def as_float32(self, name: str):
        """``name``'s type with float32 as its element type (shape kept)."""
        tp = self.type_proto(name)
        new = onnx.TypeProto()
        if tp is not None and tp.WhichOneof("value") == "tensor_type":
            new.CopyFrom(tp)
        else:
            arr = self.graph.initializers.get(name)
            if arr is not None:
                return helper.make_tensor_type_proto(_F32, list(np.shape(arr)))
        new.tensor_type.elem_type = _F32
        return new


def _schema(node):
    try:
        return onnx.defs.get_schema(node.op_type, node.opset, node.domain)
    except Exception:  # noqa: BLE001 - contrib ops have no onnx schema
        return None


def _outputs_follow_inputs(node, types: _Types) -> bool:
    """Whether every float16 output becomes float32 when the float16 inputs do: its type
    parameter is one a float16 input binds (not an attribute, as EyeLike's ``dtype``).
    Ops without an onnx schema (com.microsoft) qualify when every float input and
    output is float16."""
    f16_out = [i for i, o in enumerate(node.outputs) if o and types.elem(o) == _F16]
    schema = _schema(node)
    if schema is None:
        floats = [n for n in list(node.inputs) + list(node.outputs) if n
                  and types.elem(n) in (_F16, _F32, TensorProto.DOUBLE, TensorProto.BFLOAT16)]
        return all(types.elem(n) == _F16 for n in floats)

    def param(formals, i):
        if not formals:
            return None
        f = formals[min(i, len(formals) - 1)]  # variadic: the last formal repeats
        return f.type_str

    bound = {param(schema.inputs, i) for i, n in enumerate(node.inputs) if n and types.elem(n) == _F16}
    bound.discard(None)
    for i in f16_out:
        p = param(schema.outputs, i)
        if p is None or p not in bound or p.startswith("tensor("):
            return False
    return True


def _eligible(node, types: _Types) -> bool:
    """Whether ``node`` could run in float32 in place of float16 (kernels aside)."""
    if node.provider not in (None, CPU) or node.subgraphs:
        return False
    if node.domain not in ("", "ai.onnx", "com.microsoft") or node.op_type in _LEFT_ALONE:
        return False
    if "dtype" in node.attrs or "to" in node.attrs:
        return False
    if any(a.type in (onnx.AttributeProto.TENSOR, onnx.AttributeProto.TENSORS) for a in node.attrs.values()):
        return False
    if not any(i and types.elem(i) == _F16 for i in node.inputs):
        return False
    return _outputs_follow_inputs(node, types)


def _has_float32_kernel(node, ctx, types: _Types) -> bool:
    """Whether the CPU provider has a kernel for ``node`` with float32 for float16."""
    info = ctx.node_info(node)

    def retype(names, tps):
        out = []
        for n, tp in zip(names, tps):
            if n and types.elem(n) == _F16:
                out.append(types.as_float32(n))
            else:
                out.append(tp)
        return out

    info = dataclasses.replace(info, input_types=retype(node.inputs, info.input_types),
                               output_types=retype(node.outputs, info.output_types), constants={})
    for p in ctx.providers:
        if p.name == CPU:
            kdef, _ = p.kernel_registry().find(info)
            return kdef is not None
    return False


class _Names:
    """New value and node names, unused in the graph, its ancestors and its subgraphs
    (``Graph.unique_name`` looks the graph over at every call: quadratic here)."""

    def __init__(self, graph):
        self.taken = {n.name for _, n in graph.walk()}
        for g, n in graph.walk():
            self.taken.update(o for o in n.outputs if o)
            self.taken.update(g.initializers)
            self.taken.update(vi.name for vi in g.inputs)
        p = graph.parent
        while p is not None:
            self.taken |= p.defined_names()
            p = p.parent
        self.count = 0

    def __call__(self, base: str) -> str:
        while True:
            self.count += 1
            name = f"{base}__{self.count}"
            if name not in self.taken:
                self.taken.add(name)
                return name


def _cast(graph, names: _Names, src: str, dst: str, to: int):
    from ..ir.graph import Node

    node = Node(op_type="Cast", domain="", inputs=[src], outputs=[dst],
                name=names("float16_compute_cast"), opset=graph.opsets.get("", 1),
                doc_string=_MADE, provider=CPU)
    node.attrs["to"] = helper.make_attribute("to", to)
    return node


def _convert(graph, ctx) -> bool:
    types = _Types(graph)
    frozen = {id(n) for _, cap in getattr(graph, "_fused_groups", []) for n in cap.nodes}
    outputs = set(graph.output_names())
    producers = graph.producers()
    nodes = list(graph.nodes)
    cache: dict[tuple, bool] = {}

    def convertible(n) -> bool:
        if id(n) in frozen or not _eligible(n, types):
            return False
        key = (n.op_type, n.domain, n.opset, tuple(types.elem(i) for i in n.inputs),
               tuple(sorted((k, a.SerializeToString()) for k, a in n.attrs.items())))
        if key not in cache:
            cache[key] = _has_float32_kernel(n, ctx, types)
        return cache[key]

    converted: set[int] = set()
    for n in nodes:
        if not _ort_has_float16(n) and convertible(n):
            converted.add(id(n))
    # onnxruntime's IsIsolatedFp16Node, in graph order: a node with a float16 kernel
    # whose float16 inputs all come from converted nodes is converted too
    if len(nodes) > 1:
        for n in nodes:
            if id(n) in converted or not _ort_has_float16(n) or any(o in outputs for o in n.outputs):
                continue
            f16_in = [i for i in n.inputs if i and types.elem(i) == _F16]
            if not f16_in or not any(o and types.elem(o) == _F16 for o in n.outputs):
                continue
            if all(i in producers and id(producers[i]) in converted for i in f16_in) and convertible(n):
                converted.add(id(n))
    # float16 nodes whose result on float16 values is a float16 value (Clip, Max...):
    # computed in float32 on their rounded inputs, they give onnxruntime's float16
    # result exactly, without numpy's emulated float16 arithmetic
    exact = {id(n) for n in nodes if id(n) not in converted and n.op_type in _EXACT and n.domain in ("", "ai.onnx")
             and _ort_has_float16(n) and convertible(n) and not _clip_bound_omitted(n)}
    converted |= exact
    if not converted:
        return False

    names = _Names(graph)
    cast_of: dict[tuple[str, bool], str] = {}  # (float16 value, rounding kept) -> its float32 form
    new_nodes = []
    for n in nodes:
        if id(n) not in converted:
            new_nodes.append(n)
            continue
        ins = []
        for i in n.inputs:
            if not i or types.elem(i) != _F16:
                ins.append(i)
                continue
            # an exact node reads its inputs rounded to float16, as onnxruntime's
            # float16 kernel does, unless they come from another exact node
            keep = id(n) in exact and not (i in producers and id(producers[i]) in exact)
            key = (i, keep)
            if key not in cast_of:
                name = names(f"{i}_float32")
                if i in graph.initializers and i not in types.overridable:
                    # exact: every float16 value is a float32 value
                    graph.initializers[name] = np.asarray(graph.initializers[i]).astype(np.float32)
                else:
                    cast = _cast(graph, names, i, name, _F32)
                    if keep:
                        cast.doc_string = _ROUNDING
                    new_nodes.append(cast)
                graph.value_types[name] = types.as_float32(i)
                cast_of[key] = name
            ins.append(cast_of[key])
        outs, after = [], []
        for o in n.outputs:
            if not o or types.elem(o) != _F16:
                outs.append(o)
                continue
            name = names(f"{o}_float32")
            graph.value_types[name] = types.as_float32(o)
            after.append(_cast(graph, names, name, o, _F16))
            outs.append(name)
        n.inputs, n.outputs = ins, outs
        n.provider = CPU
        new_nodes.append(n)
        new_nodes.extend(after)
    graph.nodes = new_nodes
    _remove_cast_pairs(graph, types)
    # an initializer read by several converted nodes has a key per reader: name it once
    _drop_unread(graph, list(dict.fromkeys(i for i, _ in cast_of if i in graph.initializers)))
    graph.topological_sort()
    return True


def _remove_cast_pairs(graph, types: _Types) -> None:
    """``Cast(to=float16)`` of a float32 value ``u`` then ``Cast(to=float)``: readers of
    the second read ``u`` (onnxruntime's RemoveDuplicateCastTransformer, for the pairs
    where one Cast is this transform's)."""
    outputs = set(graph.output_names())
    consumers = graph.consumers()
    # values a subgraph reads by name: a Cast making one stays, the body reading it
    in_bodies = {i for n in graph.nodes if n.subgraphs for i in n.implicit_inputs()}
    drop: set[int] = set()
    renames: dict[str, str] = {}
    for y in graph.nodes:
        if not _is_cast(y, _F16) or types.elem(y.inputs[0]) != _F32 or id(y) in drop:
            continue
        readers = consumers.get(y.outputs[0], [])
        # a protected Cast is a reader like any other node: the rounding before it stays
        casts = [r for r in readers if r.op_type == "Cast" and r.domain in ("", "ai.onnx")
                 and r.doc_string != _ROUNDING]
        if not (y.doc_string == _MADE or any(r.doc_string == _MADE for r in casts)):
            continue
        if any(not _known_group(int(r.attr("to", 0))) for r in casts):
            continue
        src = y.inputs[0]
        kept = []
        for x in casts:
            if int(x.attr("to", 0)) == _F32 and x.outputs[0] not in outputs and x.outputs[0] not in in_bodies:
                renames[x.outputs[0]] = src
                drop.add(id(x))
            else:
                kept.append(x)
        if len(casts) == len(readers) and readers and y.outputs[0] not in outputs:
            for x in kept:
                x.inputs = [src]
            drop.add(id(y))
    if not renames and not drop:
        return

    def resolve(name):
        while name in renames:
            name = renames[name]
        return name

    for n in graph.nodes:
        n.inputs = [resolve(i) for i in n.inputs]
    graph.nodes = [n for n in graph.nodes if id(n) not in drop]


def _known_group(to: int) -> bool:
    """Whether onnxruntime's cast removal knows the type (bool, integers, floats)."""
    return to in (TensorProto.BOOL, TensorProto.INT8, TensorProto.INT16, TensorProto.INT32, TensorProto.INT64,
                  TensorProto.UINT8, TensorProto.UINT16, TensorProto.UINT32, TensorProto.UINT64,
                  TensorProto.FLOAT16, TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.BFLOAT16)


def _is_cast(n, to: int) -> bool:
    return n.op_type == "Cast" and n.domain in ("", "ai.onnx") and len(n.inputs) == 1 and int(n.attr("to", 0)) == to


def _drop_unread(graph, replaced) -> None:
    """This transform's Casts nobody reads any more, and float16 initializers that only
    converted nodes read (their float32 twins replace them)."""
    while True:
        used = graph.read_names()
        keep = [n for n in graph.nodes if n.doc_string not in (_MADE, _ROUNDING) or n.outputs[0] in used]
        if len(keep) == len(graph.nodes):
            break
        graph.nodes = keep
    listed = set(graph.input_names())
    for name in replaced:
        if name not in used and name not in listed:
            del graph.initializers[name]


def float16_compute(graph, ctx) -> bool:
    """Compute the CPU provider's float16 nodes in float32 (see the module docstring)."""
    changed = False
    for node in graph.nodes:
        for sg in node.all_subgraphs():
            changed |= float16_compute(sg, ctx)
    return _convert(graph, ctx) or changed


def register(reg) -> None:
    """Add the transform: basic (level 1), after partitioning."""
    reg.add("float16_compute", float16_compute, GraphOptimizationLevel.ORT_ENABLE_BASIC, phase="post")
