"""Level-1 (basic) transforms: provider independent, run before partitioning.

- ``constant_folding``: nodes whose inputs are all constants run once, with the
  CPU provider's kernels, and become initializers (random ops excepted, and no
  result larger than the session's allocation cap).
- ``shape_folding``: ``Shape``/``Size`` of a value whose shape is static become constants,
  and so does a ``Gather`` or ``Slice`` with constant indices of a ``Shape`` where the
  dimensions it picks are static (the head size of an attention whose batch is
  dynamic); shapes are inferred again first where free-dimension overrides or folded
  constants may have made more of them static.
- ``eliminate_identity``, ``eliminate_dropout``: these do nothing at inference.
- ``eliminate_noop``: Cast to the same type, Reshape/Expand to the same static shape.
- ``dead_node_elimination``: nodes whose outputs nobody reads, and unused initializers.
"""

from __future__ import annotations

import logging

import numpy as np

from ..errors import InvalidGraph
from ..options import GraphOptimizationLevel

__all__ = ["register"]

logger = logging.getLogger("onnxrt")

NONDETERMINISTIC = {
    ("", "RandomNormal"), ("", "RandomUniform"), ("", "RandomNormalLike"), ("", "RandomUniformLike"),
    ("", "Bernoulli"), ("", "Multinomial"),
}
#: ops never folded: they read or make state, or their result would be huge for no gain
NEVER_FOLD = NONDETERMINISTIC | {("", "If"), ("", "Loop"), ("", "Scan"), ("", "SequenceMap"), ("", "ImageDecoder")}


def _overridable(graph) -> set[str]:
    return {vi.name for vi in graph.inputs}


def _constants(graph) -> dict[str, np.ndarray]:
    ov = _overridable(graph)
    return {k: v for k, v in graph.initializers.items() if k not in ov}


def _rename_uses(graph, old: str, new: str) -> None:
    for n in graph.nodes:
        n.inputs = [new if i == old else i for i in n.inputs]


def _used_in_subgraphs(graph) -> set[str]:
    used: set[str] = set()
    for n in graph.nodes:
        if n.subgraphs:
            used.update(n.implicit_inputs())
    return used


def eliminate_identity(graph, ctx) -> bool:
    """Drop Identity nodes by reading their input directly."""
    return _bypass(graph, lambda n: n.op_type == "Identity" and n.domain == "" and len(n.inputs) == 1)


def eliminate_dropout(graph, ctx) -> bool:
    """Drop inference-mode Dropout whose mask output is unused."""

    def ok(n):
        if n.op_type != "Dropout" or n.domain != "":
            return False
        if len(n.outputs) > 1 and n.outputs[1]:
            return False
        if len(n.inputs) >= 3 and n.inputs[2]:
            return False  # training_mode given as an input: may be true
        return True

    return _bypass(graph, ok)


def _bypass(graph, pred) -> bool:
    outputs = set(graph.output_names())
    sub_used = _used_in_subgraphs(graph)
    changed = False
    keep = []
    for n in graph.nodes:
        if pred(n) and n.inputs and n.inputs[0] and n.outputs[0] not in outputs and n.outputs[0] not in sub_used:
            _rename_uses(graph, n.outputs[0], n.inputs[0])
            changed = True
            continue
        keep.append(n)
    graph.nodes = keep
    return changed


def eliminate_noop(graph, ctx) -> bool:
    """Drop Cast to the same type and Reshape/Expand that keep a static shape."""
    from ..run.feeds import shape_of

    def static(name):
        tp = graph.value_types.get(name)
        if tp is None or tp.WhichOneof("value") != "tensor_type":
            return None
        s = shape_of(tp)
        if s is None or not all(isinstance(d, int) for d in s):
            return None
        return s, tp.tensor_type.elem_type

    consts = _constants(graph)

    def ok(n):
        if n.domain != "" or not n.inputs or not n.outputs:
            return False
        a = static(n.inputs[0])
        b = static(n.outputs[0])
        if a is None or b is None or a != b:
            return False
        if n.op_type == "Cast":
            return True
        if n.op_type in ("Reshape", "Expand") and len(n.inputs) > 1 and n.inputs[1] in consts:
            return True
        return False

    return _bypass(graph, ok)


def _is_static(tp) -> bool:
    from ..run.feeds import shape_of

    if tp is None or tp.WhichOneof("value") != "tensor_type":
        return False
    shape = shape_of(tp)
    return shape is not None and all(isinstance(d, int) for d in shape)


#: initializers larger than this travel to shape inference as typed inputs, not data
_INFER_CONST_LIMIT = 4096


def refresh_shapes(graph) -> bool:
    """Infer value shapes again from the graph's current input types and constants.

    The session infers shapes once, before free-dimension overrides fix input
    dimensions and before constant folding turns computed shapes into constants;
    inferring again makes those dimensions static, so ``Shape`` of them folds.
    Known types are only ever made more precise. Returns whether any type changed.
    """
    import onnx
    from onnx import helper, numpy_helper

    from ..run.feeds import shape_of

    gp = onnx.GraphProto(name=graph.name)
    # the Constant nodes' and subgraphs' large tensors travel without their data, as
    # the large initializers do: inference copies the model several times over and
    # reads only their types
    gp.node.extend(n.to_proto(hollow_above=_INFER_CONST_LIMIT) for n in graph.nodes)
    gp.input.extend(graph.inputs)
    gp.output.extend(graph.outputs)
    listed = set(graph.input_names())
    for name, arr in graph.initializers.items():
        if name in listed:
            continue
        arr = np.asarray(arr)
        if arr.size <= _INFER_CONST_LIMIT:
            gp.initializer.append(numpy_helper.from_array(arr, name))
        else:
            gp.input.append(helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(arr.dtype),
                                                          list(arr.shape)))
    model = helper.make_model(gp, opset_imports=[helper.make_opsetid(d, v) for d, v in graph.opsets.items()],
                              ir_version=10)
    try:
        inferred = onnx.shape_inference.infer_shapes(model, check_type=False, strict_mode=False, data_prop=True)
    except Exception as e:  # noqa: BLE001 - the shapes already known stay
        logger.debug("shape inference again failed: %s", e)
        return False

    def known(tp):
        s = shape_of(tp) if tp is not None and tp.WhichOneof("value") == "tensor_type" else None
        return -1 if s is None else sum(isinstance(d, int) for d in s)

    changed = False
    for vi in list(inferred.graph.value_info) + list(inferred.graph.output):
        if not vi.HasField("type") or vi.type.WhichOneof("value") != "tensor_type":
            continue
        old = graph.value_types.get(vi.name)
        if old is None:
            graph.value_types[vi.name] = vi.type
            changed = True
        elif old.WhichOneof("value") == "tensor_type" and known(vi.type) > known(old):
            old_shape, new_shape = shape_of(old), shape_of(vi.type)
            if old_shape is not None and (len(old_shape) != len(new_shape) or any(
                    isinstance(a, int) and a != b for a, b in zip(old_shape, new_shape))):
                continue
            # in place: kernel lookups hold these very objects
            old.CopyFrom(vi.type)
            changed = True
    return changed


def shape_folding(graph, ctx) -> bool:
    """Replace Shape/Size of statically shaped values by constants."""
    from ..run.feeds import shape_of

    key = (len(graph.nodes), len(graph.initializers))
    if graph.parent is None and getattr(graph, "_shapes_refreshed_at", None) != key:
        # later transforms (fusions included) match on shapes: keep them as precise as
        # the graph allows, once per change of the graph
        graph._shapes_refreshed_at = key
        if any(not _is_static(graph.value_types.get(o)) for n in graph.nodes for o in n.outputs if o):
            refresh_shapes(graph)
    changed = False
    keep = []
    # Shape nodes kept (some dimension not static): name of the output -> its dims
    partial: dict[str, list] = {}
    for n in graph.nodes:
        if n.domain == "" and n.op_type in ("Shape", "Size") and n.inputs and n.outputs[0]:
            tp = graph.value_types.get(n.inputs[0])
            shape = shape_of(tp) if tp is not None and tp.WhichOneof("value") == "tensor_type" else None
            if shape is not None and all(isinstance(d, int) for d in shape):
                if n.op_type == "Size":
                    val = np.array(int(np.prod(shape, dtype=np.int64)), dtype=np.int64)
                else:
                    start = n.attr("start", 0)
                    end = n.attr("end", None)
                    val = np.array(shape[slice(start, end)], dtype=np.int64)
                graph.initializers[n.outputs[0]] = val
                changed = True
                continue
            if shape is not None and n.op_type == "Shape":
                partial[n.outputs[0]] = shape[slice(n.attr("start", 0), n.attr("end", None))]
        elif partial and n.domain == "" and n.op_type in ("Gather", "Slice") and n.inputs[0] in partial:
            val = _picked_dims(graph, n, partial[n.inputs[0]])
            if val is not None:
                graph.initializers[n.outputs[0]] = val
                changed = True
                continue
        keep.append(n)
    graph.nodes = keep
    return changed


def _slice_range(start: int, end: int, step: int, n: int) -> np.ndarray:
    """The indices ONNX Slice takes from an axis of length ``n``: negative bounds count
    from the end, then clamp to ``[0, n]`` (``[-1, n - 1]`` for a negative step), which
    a Python slice does not; an end of INT32_MAX or INT64_MAX means "to the last end"
    whatever the step's sign (``[-1:INT64_MAX:-1]`` takes the whole axis backwards), as
    the Slice kernels read it."""
    if start < 0:
        start += n
    if end in (2**31 - 1, 2**63 - 1):
        end = -1 if step < 0 else n
    elif end < 0:
        end += n
    if step > 0:
        start, end = min(max(start, 0), n), min(max(end, 0), n)
    else:
        start, end = min(max(start, 0), n - 1), min(max(end, -1), n - 1)
    return np.arange(start, end, step)


def _picked_dims(graph, node, dims: list) -> np.ndarray | None:
    """What a Gather or Slice with constant indices computes from a ``Shape`` output
    whose dimensions are ``dims`` (ints where static), when every dimension it picks is
    static (a model's head size from ``Shape(x)[2]`` while the batch is dynamic), or
    None. The Shape node stays for its other readers."""
    consts = graph.initializers
    outer = set(graph.input_names())
    args = [consts.get(i) if i and i not in outer else None for i in node.inputs[1:]]
    if any(a is None for i, a in zip(node.inputs[1:], args) if i) or len(node.outputs) != 1:
        return None
    if any(a.dtype.kind not in "iu" for a in args if a is not None):
        return None
    idx = np.arange(len(dims))
    try:
        if node.op_type == "Gather":
            if int(node.attr("axis", 0)) not in (0, -1):
                return None
            picked = idx[args[0]]  # negative indices wrap, as Gather's do; out of range raises
        else:
            starts, ends = args[0], args[1]
            axes = args[2] if len(args) > 2 and args[2] is not None else None
            steps = args[3] if len(args) > 3 and args[3] is not None else None
            if starts.ndim != 1 or starts.shape != ends.shape or (axes is not None and np.any((axes != 0) & (axes != -1))):
                return None
            if steps is not None and (steps.shape != starts.shape or np.any(steps == 0)):
                return None
            if starts.size != 1:
                return None
            step = int(steps[0]) if steps is not None else 1
            picked = idx[_slice_range(int(starts[0]), int(ends[0]), step, len(dims))]
    except IndexError:
        return None  # the run reports it
    static = np.array([isinstance(d, int) for d in dims], dtype=bool)
    if not static[picked].all():
        return None
    values = np.array([d if isinstance(d, int) else 0 for d in dims], dtype=np.int64)
    # a scalar index gives a scalar, as Gather does
    return np.array(values[picked], dtype=np.int64)


def _qdq_fusions_follow(ctx) -> bool:
    so = getattr(ctx, "session_options", None)
    level = getattr(so, "graph_optimization_level", GraphOptimizationLevel.ORT_ENABLE_BASIC)
    return int(level) >= GraphOptimizationLevel.ORT_ENABLE_EXTENDED


def constant_folding(graph, ctx, fold_dequantize: bool | None = None) -> bool:
    """Run nodes whose inputs are all constant once, and keep their outputs.

    DequantizeLinear is not folded when the level-2 QDQ fusions follow (they read the
    integers behind it, as onnxruntime's folding leaves it for its QDQ transformers);
    their ``qdq_constant_folding`` folds what they leave, with ``fold_dequantize``.
    """
    if fold_dequantize is None:
        fold_dequantize = not _qdq_fusions_follow(ctx)
    return _fold_graph(graph, ctx, _constants(graph), fold_dequantize)


def _fold_graph(graph, ctx, consts: dict[str, np.ndarray], fold_dequantize: bool) -> bool:
    """Fold ``graph``'s nodes whose inputs are all in ``consts`` (the graph's own
    constants and, in a subgraph, the outer-scope constants it can see), then the
    subgraphs of the nodes that remain. A subgraph's folded values become its own
    initializers; a node making one of its outputs stays (its kernel is cheap, and the
    output of a body is the body's to produce)."""
    from ..plugin.kernel import NoKernelError

    outputs = set(graph.output_names())
    body = graph.parent is not None
    changed = False
    keep = []
    for n in graph.nodes:
        key = (n.domain, n.op_type)
        if (
            key in NEVER_FOLD
            or (key == ("", "DequantizeLinear") and not fold_dequantize)
            or n.subgraphs
            or not all((not i) or i in consts for i in n.inputs)
            or not any(n.outputs)
            or (body and any(o in outputs for o in n.outputs))
        ):
            keep.append(n)
            continue
        try:
            kernel = ctx.cpu_registry.create(ctx.node_info(n))
            with np.errstate(all="ignore"):  # inf and NaN are values here, as at run time
                results = kernel.run(*[consts[i] if i else None for i in n.inputs])
        except NoKernelError:
            keep.append(n)
            continue
        except MemoryError:
            raise InvalidGraph(
                f"constant folding {n.op_type} node {n.name!r} ran out of memory: the model asks for a huge tensor"
            ) from None
        except Exception as e:  # noqa: BLE001 - leave the node for run time, which reports it
            logger.debug("constant folding skipped %s: %s", n.name, e)
            keep.append(n)
            continue
        if not isinstance(results, (tuple, list)):
            results = (results,)
        # a kernel may hand back a 0-d result as a numpy scalar
        results = [np.asarray(r) if isinstance(r, np.generic) else r for r in results]
        if not all(isinstance(r, np.ndarray) for r, o in zip(results, n.outputs) if o):
            keep.append(n)
            continue
        size = sum(r.nbytes for r, o in zip(results, n.outputs) if o)
        if size > ctx.max_bytes:
            raise InvalidGraph(
                f"constant folding {n.op_type} node {n.name!r} makes {size} bytes, over the "
                f"session's max_allocation_bytes ({ctx.max_bytes})"
            )
        for r, o in zip(results, n.outputs):
            if o:
                if o in outputs:
                    r = r.copy()
                graph.initializers[o] = r
                consts[o] = r
        changed = True
    graph.nodes = keep
    for n in graph.nodes:
        for sg in n.all_subgraphs():
            changed |= _fold_body(sg, ctx, consts, fold_dequantize)
    return changed


def _fold_body(body, ctx, outer: dict[str, np.ndarray], fold_dequantize: bool) -> bool:
    """Fold constants inside an If/Loop/Scan body: its initializers, its Constant nodes
    and the outer-scope constants it reads (never its inputs, which each iteration or
    call feeds, nor a name the body defines itself)."""
    own = set(body.input_names()) | {o for n in body.nodes for o in n.outputs if o}
    consts = {k: v for k, v in outer.items() if k not in own and k not in body.initializers}
    consts.update(_constants(body))
    if not _fold_graph(body, ctx, consts, fold_dequantize):
        return False
    # what the folded nodes read and nothing reads any more
    dead_node_elimination(body, ctx)
    return True


def dead_node_elimination(graph, ctx) -> bool:
    """Remove nodes whose outputs nobody reads, then initializers nobody reads."""
    changed = False
    while True:
        used = graph.read_names()
        keep = [n for n in graph.nodes if any(o and o in used for o in n.outputs)]
        if len(keep) == len(graph.nodes):
            break
        graph.nodes = keep
        changed = True
    inputs = set(graph.input_names())
    for name in list(graph.initializers):
        if name not in used and name not in inputs:
            del graph.initializers[name]
            changed = True
    return changed


def register(reg) -> None:
    """Add the basic transforms to a :class:`TransformerRegistry`."""
    basic = GraphOptimizationLevel.ORT_ENABLE_BASIC
    reg.add("eliminate_identity", eliminate_identity, basic)
    reg.add("eliminate_dropout", eliminate_dropout, basic)
    reg.add("eliminate_noop", eliminate_noop, basic)
    reg.add("shape_folding", shape_folding, basic)
    reg.add("constant_folding", constant_folding, basic)
    reg.add("dead_node_elimination", dead_node_elimination, basic)
