"""``InferenceSession``: load, optimize, partition, plan and run a model.

The steps follow the design: load and check the model, build the IR, expand
functions no provider has a kernel for, run basic transforms, partition among the
providers in priority order, run the provider-specific transforms, build kernels
(compiling fused groups), plan, and then run with per-run state only.
"""

from __future__ import annotations

import copy

import logging
import math
import os
import threading
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import onnx
from onnx import ModelProto

from .errors import Fail, InvalidArgument, InvalidGraph, NotImplemented, OnnxRtError
from .ir.inline import expand_functions
from .ir.graph import Graph, Node, tensor_to_array
from .plugin.kernel import NodeInfo, decode_attribute
from .run.malloc import CONFIG_KEY as HEAP_CONFIG_KEY
from .run.malloc import tune_heap
from .run.limits import CONFIG_KEY as LIMIT_CONFIG_KEY
from .run.limits import limit_allocations
from .load.model import check_versions, load_model
from .logs import session_logging
from .optimizer import OptimizeContext, run_transforms
from .options import RunOptions, SessionOptions
from .partition.cpu_preferred import cpu_preferred_nodes
from .plan import Plan, PlanBuilder, RunContext, array_root, caller_owned
from .plugin.discovery import resolve_providers
from .plugin.provider import ExecutionProvider, HostDevice, group_io
from .plan.shape_memo import CONFIG_KEY as SHAPE_MEMO_CONFIG_KEY
from .run.threads import ThreadSettings
from .load.large_weights import split_large_weights
from .run.feeds import FeedChecker, NodeArg

__all__ = ["InferenceSession", "ModelMetadata", "Subgraph"]

logger = logging.getLogger("onnxrt")


class ModelMetadata:
    """``session.get_modelmeta()``: the model's descriptive fields."""

    def __init__(self, proto: ModelProto):
        self.producer_name = proto.producer_name
        self.graph_name = proto.graph.name
        self.domain = proto.domain
        self.description = proto.doc_string
        self.graph_description = proto.graph.doc_string
        self.version = proto.model_version
        self.custom_metadata_map = {p.key: p.value for p in proto.metadata_props}

    def __repr__(self) -> str:
        return f"ModelMetadata(producer={self.producer_name!r}, graph={self.graph_name!r}, version={self.version})"


class Subgraph:
    """A compiled If/Loop/Scan body: call it with inputs and the outer-scope values.

    ``sub(*inputs, outer={...})`` returns the list of the body's outputs.
    """

    def __init__(self, plan: Plan, input_names: list[str], output_names: list[str], graph: Graph):
        self.plan = plan
        self.input_names = input_names
        self.output_names = output_names
        self.graph = graph

    def __call__(self, *inputs, outer: dict | None = None, ctx=None) -> list:
        feeds = dict(zip(self.input_names, inputs))
        return self.plan.run(feeds, outer, ctx)

    def __repr__(self) -> str:
        return f"<Subgraph {self.graph.name!r} {self.input_names} -> {self.output_names}>"


class _Built:
    """Everything a built session holds, swapped atomically by ``set_providers``."""

    def __init__(self):
        self.providers: list[ExecutionProvider] = []
        self.plan: Plan | None = None
        self.graph: Graph | None = None
        self.assignment: list[dict] = []
        self.fused: list[dict] = []
        self.const_roots: set[int] = set()


class InferenceSession:
    """Runs an ONNX model; the API is onnxruntime's.

    :param path_or_bytes: a model path, serialized bytes, or an ``onnx.ModelProto``.
    :param sess_options: a :class:`SessionOptions`.
    :param providers: provider names, aliases or ``(name, options)`` tuples, in
        priority order; ``None`` uses every available provider by default priority.
    :param provider_options: a list of option dicts, one per entry of ``providers``.
    """

    def __init__(
        self,
        path_or_bytes,
        sess_options: SessionOptions | None = None,
        providers: Sequence | None = None,
        provider_options: Sequence[dict] | None = None,
        **kwargs,
    ):
        disabled = kwargs.pop("disabled_optimizers", None)
        if kwargs:
            unknown = ", ".join(sorted(kwargs))
            raise InvalidArgument(f"unknown InferenceSession argument(s): {unknown}")
        if sess_options is not None and not isinstance(sess_options, SessionOptions):
            raise InvalidArgument(f"sess_options must be a SessionOptions, not {type(sess_options).__name__}")
        self._sess_options = sess_options or SessionOptions()
        if disabled is not None:
            # onnxruntime's keyword: on a copy of the options, never the caller's
            if isinstance(disabled, str) or not all(isinstance(d, str) for d in disabled):
                raise InvalidArgument("disabled_optimizers must be a list of transform names")
            self._sess_options = copy.copy(self._sess_options)
            self._sess_options.disabled_optimizers = list(self._sess_options.disabled_optimizers) + list(disabled)
        self._model_path = path_or_bytes if isinstance(path_or_bytes, str) else None
        from .run.profiling import Profiler

        self._profiler = Profiler(self._sess_options) if self._sess_options.enable_profiling else None
        t0 = self._profiler.now() if self._profiler else 0
        self._max_bytes = _max_allocation_bytes(self._sess_options)
        tune_heap(self._sess_options._config.get(HEAP_CONFIG_KEY, "1").strip() != "0")
        with limit_allocations(self._max_bytes):
            proto, self._model_dir, direct = _load_with_weights(path_or_bytes)
            self._opsets = check_versions(proto)
            # the session keeps the model's structure and its weights as arrays, never
            # the weights twice: the full proto is dropped once they are decoded
            self._proto, self._weights = _split_weights(proto)
            del proto
            if direct:
                kept = set(self._weights) | {t.name for t in self._proto.graph.initializer}
                twice = sorted(kept & set(direct))
                if twice:
                    raise InvalidGraph(f"initializer {twice[0]!r} is defined twice")
                self._weights = {**direct, **self._weights}
            self._threads = ThreadSettings(self._sess_options.intra_op_num_threads)
            self._lock = threading.Lock()
            # IR < 4 lists every initializer as an input; only IR >= 4 makes them overridable
            self._ir_overridable = self._proto.ir_version >= 4
            with session_logging(self._sess_options):  # log_severity_level 0/1 shows the partition decisions
                self._built = self._build(providers, provider_options)
        self._describe_io(self._built.graph)
        if self._profiler:
            self._profiler.session_event("model_loading_and_initialization", t0)

    # -- building -----------------------------------------------------------------------
    def _typed_proto(self) -> ModelProto:
        """The structure with inferred types; large weights enter as typed inputs.

        Shape inference copies the model it is given; given only the structure (large
        weights declared as inputs of their type and shape) it costs no weight copy,
        and the values it propagates (shapes, small integer tensors) all stay.
        """
        light = ModelProto()
        light.CopyFrom(self._proto)
        declared = {vi.name for vi in light.graph.input}
        light.graph.input.extend(
            onnx.helper.make_tensor_value_info(name, onnx.helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
            for name, a in self._weights.items() if name not in declared
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
            return typed
        except Exception as e:  # noqa: BLE001 - types help, but are optional
            logger.info("shape inference failed (%s); continuing without inferred types", e)
            return light

    def _build(self, providers, provider_options) -> _Built:
        so = self._sess_options
        built = _Built()
        typed = self._typed_proto()
        graph = Graph.from_proto(typed.graph, self._opsets)
        if self._weights:
            declared = {vi.name for vi in self._proto.graph.input}
            graph.inputs = [vi for vi in graph.inputs if vi.name in declared]
            graph.initializers.update(self._weights)
        self._apply_free_dims(graph)
        for name, value in so._initializers.items():
            if name not in graph.initializers:
                raise InvalidArgument(f"add_initializer: the model has no initializer {name!r}")
            graph.initializers[name] = np.asarray(getattr(value, "numpy", lambda: value)())
        built.providers = resolve_providers(
            providers, provider_options, so, allow_fallback=so.allow_provider_fallback
        )
        info = _NodeInfoFactory(graph)
        cpu = next(p for p in built.providers if p.name == "CPUExecutionProvider")
        local_functions = {(f.domain, f.name): f for f in self._proto.functions}

        def has_kernel(node: Node) -> bool:
            ni = info(node)
            return any(p.kernel_registry().find(ni)[0] is not None for p in built.providers)

        def walk_expand(g: Graph):
            expand_functions(g, local_functions, has_kernel, lambda n: info.input_types(n))

        walk_expand(graph)
        level = int(so.graph_optimization_level)
        disabled = set(so.disabled_optimizers)
        unknown = disabled - set(_transformer_names())
        if unknown:
            raise InvalidArgument(
                f"disabled_optimizers names unknown transforms: {', '.join(sorted(unknown))}; "
                f"known: {', '.join(_transformer_names())}"
            )
        octx = OptimizeContext(built.providers, info, cpu.kernel_registry(), self._max_bytes, so)

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
            walk_expand(graph)
        transform("pre", disabled)
        self._partition(graph, built, info, top=True)
        transform("post", disabled)
        _report_fused_nodes(graph, built)
        built.graph = graph
        built.plan = self._compile(graph, built, info, top=True)
        built.const_roots = {id(array_root(v)) for v in graph.initializers.values()}
        if so.optimized_model_filepath:
            self._save_optimized(graph, so.optimized_model_filepath)
        return built

    def _describe_io(self, graph: Graph) -> None:
        """Inputs, outputs and the feed checker: fixed for the session's lifetime."""
        og = self._proto.graph
        init_names = ({t.name for t in og.initializer} | {t.values.name for t in og.sparse_initializer}
                      | set(self._weights))
        self._inputs = [NodeArg(vi.name, vi.type) for vi in og.input if vi.name not in init_names]
        self._overridable = (
            [NodeArg(vi.name, vi.type) for vi in og.input if vi.name in init_names] if self._ir_overridable else []
        )
        self._outputs = [NodeArg(vi.name, vi.type) for vi in og.output]
        self._output_names = [a.name for a in self._outputs]
        # the graph's input types carry the session's free-dimension overrides
        feed_types = [(a.name, graph.value_types.get(a.name, a._tp)) for a in self._inputs + self._overridable]
        self._checker = FeedChecker(feed_types, {a.name for a in self._inputs})

    def _apply_free_dims(self, graph: Graph) -> None:
        so = self._sess_options
        if not so._free_dims_by_name and not so._free_dims_by_denotation:
            return
        for vi in graph.inputs:
            tp = graph.value_types.get(vi.name)
            if tp is None or tp.WhichOneof("value") != "tensor_type":
                continue
            for d in tp.tensor_type.shape.dim:
                if d.HasField("dim_param") and d.dim_param in so._free_dims_by_name:
                    d.dim_value = so._free_dims_by_name[d.dim_param]
                elif d.denotation and d.denotation in so._free_dims_by_denotation:
                    d.dim_value = so._free_dims_by_denotation[d.denotation]

    def _partition(self, graph: Graph, built: _Built, info: "_NodeInfoFactory", top: bool) -> None:
        providers = built.providers
        for node in graph.nodes:
            node.provider = None
        taken_by: dict[int, int] = {}
        groups: list[tuple[ExecutionProvider, Any]] = []
        # only a device provider would take shape computations off the host
        preferred = cpu_preferred_nodes(graph) if any(not p.device.is_host for p in providers) else set()
        kept_on_host: set[int] = set()
        for pi, p in enumerate(providers):
            try:
                caps = p.get_capability(graph, info)
            except Exception as e:  # noqa: BLE001 - a broken provider must not break the session
                logger.warning("%s.get_capability failed: %s", p.name, e)
                continue
            for cap in caps:
                nodes = [n for n in cap.nodes if n.provider is None]
                if not p.device.is_host and any(id(n) in preferred for n in nodes):
                    # shape computations stay on the host: refuse the whole group
                    kept_on_host.update(id(n) for n in nodes if id(n) in preferred)
                    continue
                if not nodes:
                    continue
                for n in nodes:
                    n.provider = p.name
                    taken_by[id(n)] = pi
                if len(nodes) > 1 or cap.fused_name:
                    cap.nodes = nodes
                    groups.append((p, cap))
        missing = [n for n in graph.nodes if n.provider is None]
        if missing:
            n = missing[0]
            reasons = "; ".join(f"{p.name}: {p.refusal_reason(info(n))}" for p in providers)
            raise NotImplemented(
                f"no provider can run {n.op_type} node {n.name!r} "
                f"(domain {n.domain or 'ai.onnx'!r}, opset {n.opset}): {reasons}"
            )
        graph._fused_groups = groups  # type: ignore[attr-defined]
        if top:
            built.assignment = []
            for node in graph.nodes:
                pi = taken_by[id(node)]
                reasons = []
                for p in providers[:pi]:
                    if id(node) in kept_on_host and not p.device.is_host:
                        reasons.append(f"{p.name}: shape computation kept on the CPU")
                    else:
                        reasons.append(f"{p.name}: {p.refusal_reason(info(node))}")
                built.assignment.append(
                    {"node": node.name, "op_type": node.op_type, "provider": node.provider,
                     "reason": "; ".join(reasons)}
                )
                if logger.isEnabledFor(logging.DEBUG):
                    logger.debug("node %s (%s) -> %s %s", node.name, node.op_type, node.provider,
                                 f"({'; '.join(reasons)})" if reasons else "")
        for node in graph.nodes:
            for sg in node.all_subgraphs():
                self._partition(sg, built, info, top=False)

    def _compile(self, graph: Graph, built: _Built, info: "_NodeInfoFactory", top: bool) -> Plan:
        so = self._sess_options
        by_name = {p.name: p for p in built.providers}
        builder = PlanBuilder(HostDevice(), self._max_bytes,
                              memoize_shapes=so._config.get(SHAPE_MEMO_CONFIG_KEY, "1").strip() != "0")
        overridable = set(graph.input_names()) if (self._ir_overridable or not top) else set()
        for vi in graph.inputs:
            if vi.name not in graph.initializers:
                builder.add_input(vi.name)
        for name, value in graph.initializers.items():
            builder.add_constant(name, value, overridable=name in overridable)
        if not top:
            for name in graph.free_names():
                if name not in builder.vals:
                    builder.add_outer(name)
        constants = {k: v for k, v in graph.initializers.items() if k not in overridable}
        fused_nodes: dict[int, tuple] = {}
        for p, cap in getattr(graph, "_fused_groups", []):
            for n in cap.nodes:
                fused_nodes[id(n)] = (p, cap)
        emitted: set[int] = set()
        for node in graph.nodes:
            p = by_name[node.provider]
            if id(node) in fused_nodes:
                fp, cap = fused_nodes[id(node)]
                if id(cap) in emitted:
                    continue
                emitted.add(id(cap))
                kernel = fp.compile(cap, graph, info)
                inputs, outputs = group_io(graph, cap.nodes)
                builder.add_step(kernel.run, inputs, outputs, fp.device, cap.fused_name or cap.nodes[0].name,
                                 "FusedGroup", fp.name)
                built.fused.append({"provider": fp.name, "nodes": [n.name for n in cap.nodes]})
                continue
            ni = info(node, constants)
            if node.subgraphs:
                for k, sg in node.subgraphs.items():
                    if isinstance(sg, list):
                        ni.attrs[k] = [self._subgraph(s, built, info) for s in sg]
                    else:
                        ni.attrs[k] = self._subgraph(sg, built, info)
            try:
                kernel = p.create_kernel(ni)
            except (InvalidArgument, InvalidGraph, NotImplemented):
                raise
            except Exception as e:  # noqa: BLE001
                raise Fail(f"{p.name} could not build the kernel for {ni.describe()}: {type(e).__name__}: {e}") from e
            builder.add_step(kernel.run, node.inputs, node.outputs, p.device, node.name, node.op_type, p.name,
                             implicit=ni.implicit_inputs, domain=node.domain,
                             host_inputs=getattr(kernel, "host_inputs", frozenset()))
        return builder.build(graph.output_names())

    def _subgraph(self, sg: Graph, built: _Built, info) -> Subgraph:
        plan = self._compile(sg, built, info, top=False)
        return Subgraph(plan, sg.input_names(), sg.output_names(), sg)

    def _save_optimized(self, graph: Graph, path: str) -> None:
        model = onnx.helper.make_model(
            graph.to_proto(),
            # fusions add domains (com.microsoft) to the graph's opsets
            opset_imports=[onnx.helper.make_opsetid(d, v) for d, v in {**graph.opsets, **self._opsets}.items()],
            ir_version=self._proto.ir_version,
            producer_name="onnxrt",
        )
        model.functions.extend(self._proto.functions)
        onnx.save(model, path)

    # -- introspection -------------------------------------------------------------------
    def get_inputs(self) -> list[NodeArg]:
        """The inputs a run must be fed (initializers excluded)."""
        return list(self._inputs)

    def get_outputs(self) -> list[NodeArg]:
        """The model's outputs."""
        return list(self._outputs)

    def get_overridable_initializers(self) -> list[NodeArg]:
        """Initializers that are also graph inputs, which a feed may replace."""
        return list(self._overridable)

    def get_modelmeta(self) -> ModelMetadata:
        """The model's metadata."""
        return ModelMetadata(self._proto)

    def get_providers(self) -> list[str]:
        """The providers this session uses, in priority order."""
        return [p.name for p in self._built.providers]

    def get_provider_options(self) -> dict[str, dict]:
        """Each provider's validated options, as strings (as onnxruntime returns them)."""
        return {p.name: {k: str(v) for k, v in p.options.items()} for p in self._built.providers}

    def get_session_options(self) -> SessionOptions:
        """The options the session was built with."""
        return self._sess_options

    def get_provider_assignment(self) -> list[dict]:
        """One dict per main-graph node: ``node``, ``op_type``, ``provider``, ``reason``.

        ``reason`` says why each higher-priority provider did not take the node, and is
        empty when the first provider took it.
        """
        return [dict(d) for d in self._built.assignment]

    def get_fused_groups(self) -> list[dict]:
        """The groups of nodes providers fused and compiled into one kernel each."""
        return [dict(d) for d in self._built.fused]

    def get_profiling_start_time_ns(self) -> int:
        """When profiling started, in nanoseconds since the epoch (0 if off)."""
        return self._profiler.start_ns if self._profiler else 0

    def set_providers(self, providers=None, provider_options=None) -> None:
        """Rebuild the session with other providers."""
        with session_logging(self._sess_options), limit_allocations(self._max_bytes):
            built = self._build(providers, provider_options)
        with self._lock:
            self._built = built

    def end_profiling(self) -> str:
        """Write the profile (Chrome-trace JSON) and return its file name."""
        if self._profiler is None:
            return ""
        return self._profiler.write()

    # -- running -------------------------------------------------------------------------
    def run(self, output_names, input_feed: dict[str, Any], run_options: RunOptions | None = None) -> list:
        """Run the model; return the requested outputs (all when ``output_names`` is None)."""
        built = self._built
        feeds = self._checker.check(input_feed)
        names = self._resolve_outputs(output_names)
        ctx = None
        if run_options is not None or self._profiler is not None:
            ctx = RunContext(run_options, self._profiler)
        t0 = self._profiler.now() if self._profiler else 0
        with self._threads:
            outs = built.plan.run(feeds, None, ctx)
        if self._profiler:
            self._profiler.session_event("model_run", t0)
        feed_roots = {id(array_root(a)) for v in feeds.values() for a in (v if isinstance(v, list) else [v])
                      if isinstance(a, np.ndarray)}
        protect = feed_roots | built.const_roots
        seen: set[int] = set()

        def owned(v):
            # tensors, and the tensors of sequences, as the caller's own arrays: never
            # a feed's, a constant's or another output's memory (a sequence, a new list)
            if isinstance(v, np.ndarray):
                v = caller_owned(v, protect, seen)
                seen.add(id(array_root(v)))
            elif isinstance(v, list):
                v = [owned(e) for e in v]
            return v

        by_name = dict(zip(self._output_names, outs))
        return [owned(by_name[n]) for n in names]

    def _resolve_outputs(self, output_names) -> list[str]:
        if output_names is None or (isinstance(output_names, (list, tuple)) and len(output_names) == 0):
            return list(self._output_names)
        if isinstance(output_names, str):
            output_names = [output_names]
        for n in output_names:
            if n not in self._output_names:
                raise InvalidArgument(
                    f"unknown output {n!r}; the model's outputs are: {', '.join(self._output_names)}"
                )
        return list(output_names)

    def run_with_ort_values(self, output_names, input_dict_ort_values: dict, run_options=None) -> list:
        """Run with ``OrtValue`` feeds; return ``OrtValue`` outputs."""
        from .ortvalue import OrtValue

        feeds = {k: (v.numpy() if isinstance(v, OrtValue) else v) for k, v in input_dict_ort_values.items()}
        return [OrtValue.ortvalue_from_numpy(v) if isinstance(v, np.ndarray) else OrtValue(v)
                for v in self.run(output_names, feeds, run_options)]

    def io_binding(self):
        """A new :class:`IOBinding` for this session."""
        from .ortvalue import IOBinding

        return IOBinding(self)

    def run_with_iobinding(self, iobinding, run_options: RunOptions | None = None) -> None:
        """Run with the inputs and outputs bound on ``iobinding``."""
        iobinding._run(run_options)

    def __repr__(self) -> str:
        return f"<InferenceSession providers={self.get_providers()}>"


def _max_allocation_bytes(so: SessionOptions) -> int:
    """The session's allocation cap: the config entry if set, else the option."""
    text = so._config.get(LIMIT_CONFIG_KEY)
    if text is None:
        return int(so.max_allocation_bytes)
    try:
        value = int(text.strip())
    except ValueError:
        value = 0
    if value <= 0:
        raise InvalidArgument(f"session config entry {LIMIT_CONFIG_KEY!r} must be a positive integer, not {text!r}")
    return value


#: initializers above this many elements are held as arrays, outside the kept proto
_LARGE_WEIGHT = 1024


def _load_with_weights(model) -> tuple[ModelProto, Path | None, dict[str, np.ndarray]]:
    """:func:`~onnxrt.load.load_model`, with the large weights of a big model file read
    straight from the file (:mod:`onnxrt.load.large_weights`) and returned beside the model rather
    than inside it; everything else goes the ordinary way."""
    if isinstance(model, (str, os.PathLike)):
        path = Path(model)
        if path.is_file():
            split = split_large_weights(path, _LARGE_WEIGHT)
            if split is not None:
                data, weights = split
                proto, model_dir = load_model(data, base_dir=path.resolve().parent, source=str(path))
                return proto, model_dir, weights
    proto, model_dir = load_model(model)
    return proto, model_dir, {}


def _split_weights(proto: ModelProto) -> tuple[ModelProto, dict[str, np.ndarray]]:
    """The model without its large main-graph initializers, and those decoded to arrays.

    Integer tensors stay in the proto at any size: shape inference propagates their
    values (Reshape targets, Slice bounds, Gather indices).
    """
    keep_ints = (onnx.TensorProto.INT64, onnx.TensorProto.INT32)
    big = [t for t in proto.graph.initializer
           if t.data_type not in keep_ints and math.prod(t.dims) > _LARGE_WEIGHT]
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


def _report_fused_nodes(graph: Graph, built: "_Built") -> None:
    """Make the assignment report describe the nodes that run.

    Post-partition fusions replace nodes with fused ones (Conv + Relu becomes
    FusedConv on the provider that owned both); the report lists the graph as it
    runs, and a fused node keeps the refusal reasons recorded for the node whose
    name it took.
    """
    recorded = {d["node"]: d for d in built.assignment}
    built.assignment = [
        {"node": n.name, "op_type": n.op_type, "provider": n.provider,
         "reason": recorded.get(n.name, {}).get("reason", "")}
        for n in graph.nodes
    ]


def _transformer_names() -> list[str]:
    from .optimizer import transformer_registry

    return transformer_registry().names()


class _NodeInfoFactory:
    """Builds :class:`NodeInfo` for IR nodes, with types from the enclosing graphs."""

    def __init__(self, graph: Graph):
        # value names are unique across a model's scopes, so one table serves all graphs
        self._types: dict[str, Any] = {}
        stack = [graph]
        while stack:
            g = stack.pop()
            for k, v in g.value_types.items():
                self._types.setdefault(k, v)
            for n in g.nodes:
                stack.extend(n.all_subgraphs())

    def _types_for(self, node: Node, names: list[str]) -> list:
        t = self._types
        return [t.get(n) if n else None for n in names]

    def input_types(self, node: Node) -> list:
        """The node's input ``TypeProto``s (``None`` where unknown)."""
        return self._types_for(node, node.inputs)

    def __call__(self, node: Node, constants: dict | None = None) -> NodeInfo:
        attrs = {k: decode_attribute(a) for k, a in node.attrs.items()}
        for k, sg in node.subgraphs.items():
            attrs[k] = sg
        return NodeInfo(
            name=node.name,
            op_type=node.op_type,
            domain=node.domain,
            opset=node.opset,
            attrs=attrs,
            inputs=list(node.inputs),
            outputs=list(node.outputs),
            input_types=self.input_types(node),
            output_types=self._types_for(node, node.outputs),
            constants={i: constants[n] for i, n in enumerate(node.inputs) if constants and n in constants},
            implicit_inputs=node.implicit_inputs() if node.subgraphs else [],
        )
