"""A session's stages, in order: the one place that strings them together.

1. load (:mod:`onnxrt.load`): the model, its external data and large weights;
2. IR (:mod:`onnxrt.ir`): the graph, its inferred types, function inlining;
3. optimize, level 1 (:mod:`onnxrt.optimizer`, phases ``expand`` and ``pre``);
4. partition (:mod:`onnxrt.partition`): a :class:`~onnxrt.partition.Partition`;
5. optimize, levels 2 and 3 (phase ``post``: fusions on the owning provider);
6. compile (:mod:`onnxrt.compile`): kernels and compiled fused groups;
7. plan (:mod:`onnxrt.plan`): steps over slots, compiled to straight-line Python;
8. run (:mod:`onnxrt.run` and :meth:`InferenceSession.run`).

Loading is the session's own first step (it keeps the model for its metadata and
inputs); :func:`build` runs stages 2 to 7 and returns a :class:`Built`.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import ModelProto

from .compile.compiler import compile_plan
from .compile.node_info import NodeInfoFactory
from .errors import Fail, InvalidArgument, OnnxRtError
from .ir.graph import Graph, Node
from .ir.inline import expand_functions
from .ir.value_types import apply_free_dims, typed_structure
from .optimizer import OptimizeContext, run_transforms, transformer_registry
from .partition.partitioner import partition
from .plan import Plan, array_root
from .plan.shape_memo import CONFIG_KEY as SHAPE_MEMO_CONFIG_KEY
from .plugin.discovery import resolve_providers
from .plugin.provider import ExecutionProvider
from .save import write_optimized

__all__ = ["Built", "build"]


class Built:
    """Everything a built session holds, swapped atomically by ``set_providers``."""

    def __init__(self):
        self.providers: list[ExecutionProvider] = []
        self.plan: Plan | None = None
        self.graph: Graph | None = None
        self.assignment: list[dict] = []
        self.fused: list[dict] = []
        self.const_roots: set[int] = set()


def build(proto: ModelProto, weights: dict[str, np.ndarray], opsets: dict[str, int], so, providers,
          provider_options, *, max_bytes: int, ir_overridable: bool) -> Built:
    """Stages 2 to 7 for a loaded model: IR, optimize, partition, compile and plan.

    :param proto: the model without its large weights, which ``weights`` holds.
    :param so: the session's :class:`~onnxrt.SessionOptions`.
    :param ir_overridable: whether initializers that are also inputs may be fed (IR >= 4).
    """
    built = Built()
    # -- IR
    typed = typed_structure(proto, weights)
    graph = Graph.from_proto(typed.graph, opsets)
    if weights:
        declared = {vi.name for vi in proto.graph.input}
        graph.inputs = [vi for vi in graph.inputs if vi.name in declared]
        graph.initializers.update(weights)
    apply_free_dims(graph, so._free_dims_by_name, so._free_dims_by_denotation)
    for name, value in so._initializers.items():
        if name not in graph.initializers:
            raise InvalidArgument(f"add_initializer: the model has no initializer {name!r}")
        graph.initializers[name] = np.asarray(getattr(value, "numpy", lambda: value)())
    built.providers = resolve_providers(providers, provider_options, so, allow_fallback=so.allow_provider_fallback)
    info = NodeInfoFactory(graph)
    cpu = next(p for p in built.providers if p.name == "CPUExecutionProvider")
    local_functions = {(f.domain, f.name): f for f in proto.functions}

    def has_kernel(node: Node) -> bool:
        ni = info(node)
        return any(p.kernel_registry().find(ni)[0] is not None for p in built.providers)

    def inline():
        expand_functions(graph, local_functions, has_kernel, info.input_types)

    inline()
    # -- optimize, level 1
    level = int(so.graph_optimization_level)
    names = transformer_registry().names()
    disabled = set(so.disabled_optimizers)
    unknown = disabled - set(names)
    if unknown:
        raise InvalidArgument(
            f"disabled_optimizers names unknown transforms: {', '.join(sorted(unknown))}; known: {', '.join(names)}"
        )
    octx = OptimizeContext(built.providers, info, cpu.kernel_registry(), max_bytes, so)

    def transform(phase: str, skip: set) -> bool:
        try:
            return run_transforms(graph, octx, level, phase, skip)
        except OnnxRtError:
            raise
        except Exception as e:  # noqa: BLE001
            # transforms see models that parse and validate but can still be
            # inconsistent (a Conv bias of the wrong shape); say so, typed, with
            # the cause chained, rather than let a raw exception escape
            raise Fail(
                f"a {phase!r} graph transform failed on this model: {type(e).__name__}: {e}. "
                "The model may be malformed; SessionOptions.graph_optimization_level = "
                "ORT_DISABLE_ALL skips the optional transforms"
            ) from e

    if transform("expand", set()):
        inline()
    transform("pre", disabled)
    # -- partition, then the provider-specific levels
    part = partition(graph, built.providers, info)
    transform("post", disabled)
    built.assignment = part.report(graph)
    built.graph = graph
    # -- compile and plan
    overridable = set(graph.input_names()) if ir_overridable else set()
    memoize = so._config.get(SHAPE_MEMO_CONFIG_KEY, "1").strip() != "0"
    built.plan = compile_plan(graph, part, info, max_bytes=max_bytes, memoize_shapes=memoize,
                              overridable=overridable, fused=built.fused)
    built.const_roots = {id(array_root(v)) for v in graph.initializers.values()}
    if so.optimized_model_filepath:
        save_optimized(graph, proto, opsets, so.optimized_model_filepath, so._config)
    return built


def save_optimized(graph: Graph, proto: ModelProto, opsets: dict[str, int], path: str,
                   config: dict[str, str] | None = None) -> None:
    """Write the optimized ``graph`` as a model at ``path`` (large initializers in the
    external file the session ``config`` names, :mod:`onnxrt.save`)."""
    model = onnx.helper.make_model(
        graph.to_proto(),
        # fusions add domains (com.microsoft) to the graph's opsets
        opset_imports=[onnx.helper.make_opsetid(d, v) for d, v in {**graph.opsets, **opsets}.items()],
        ir_version=proto.ir_version,
        producer_name="onnxrt",
    )
    model.functions.extend(proto.functions)
    write_optimized(model, path, config or {})
