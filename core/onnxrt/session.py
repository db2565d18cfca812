"""``InferenceSession``: the public API of a session (onnxruntime's).

Building a session runs the pipeline (:mod:`onnxrt.pipeline`): load the model
(:mod:`onnxrt.load`), build the IR, optimize, partition, compile and plan. A run
checks the feed (:mod:`onnxrt.run.feeds`), runs the plan with per-run state only,
and hands back outputs the caller owns.
"""

from __future__ import annotations

import copy
import threading
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
from onnx import ModelProto

from .adapters import adapter_feeds
from .assignment import assigned_subgraphs
from .compile.compiler import Subgraph
from .devices import OrtMemoryInfo
from .environment import check_thread_pools
from .model_config import apply_model_config, wants_model_config
from .run.async_run import start_async
from .sparse import densify_feeds, densify_model, to_sparse
from .errors import InvalidArgument, InvalidGraph
from .load.model import check_versions
from .load.weights import load_with_weights, split_weights
from .logs import session_logging
from .options import RunOptions, SessionOptions
from .pipeline import Built, build
from .plan import RunContext, array_root, caller_owned
from .run.feeds import FeedChecker, NodeArg
from .run.limits import limit_allocations, session_max_bytes
from .run.malloc import CONFIG_KEY as HEAP_CONFIG_KEY
from .run.malloc import tune_heap
from .run.threads import ThreadSettings

if TYPE_CHECKING:
    from .ir.graph import Graph

__all__ = ["InferenceSession", "ModelMetadata", "Subgraph"]


def _root_id(a: np.ndarray) -> int:
    """``id(array_root(a))`` for an ndarray: the id of the object owning its memory."""
    while True:
        b = a.base
        if b is None:
            return id(a)
        if not isinstance(b, np.ndarray):
            return id(b)
        a = b


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
        read_config = kwargs.pop("read_config_from_model", None)
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
        self._max_bytes = session_max_bytes(self._sess_options)
        tune_heap(self._sess_options._config.get(HEAP_CONFIG_KEY, "1").strip() != "0")
        with limit_allocations(self._max_bytes):
            proto, self._model_dir, direct = load_with_weights(path_or_bytes, self._sess_options)
            self._opsets = check_versions(proto)
            if wants_model_config(read_config):
                self._sess_options = apply_model_config(proto, self._sess_options)
                if self._sess_options.enable_profiling and self._profiler is None:
                    self._profiler = Profiler(self._sess_options)
                    t0 = self._profiler.now()
            # sparse values compute densely; sparse inputs and outputs convert at the boundary
            self._declared_io = {vi.name: vi.type for vi in list(proto.graph.input) + list(proto.graph.output)}
            dense = densify_model(proto)
            if dense[0] is not proto:
                proto, self._sparse_inputs, self._sparse_outputs = dense
                self._opsets = check_versions(proto)
            else:
                self._sparse_inputs, self._sparse_outputs = set(), set()
            # the session keeps the model's structure and its weights as arrays, never
            # the weights twice: the full proto is dropped once they are decoded
            self._proto, self._weights = split_weights(proto)
            del proto
            if direct:
                kept = set(self._weights) | {t.name for t in self._proto.graph.initializer}
                twice = sorted(kept & set(direct))
                if twice:
                    raise InvalidGraph(f"initializer {twice[0]!r} is defined twice")
                self._weights = {**direct, **self._weights}
            self._threads = ThreadSettings(check_thread_pools(self._sess_options))
            self._lock = threading.Lock()
            # IR < 4 lists every initializer as an input; only IR >= 4 makes them overridable
            self._ir_overridable = self._proto.ir_version >= 4
            with session_logging(self._sess_options):  # log_severity_level 0/1 shows the partition decisions
                self._built = self._build(providers, provider_options)
        self._describe_io(self._built.graph)
        if self._profiler:
            self._profiler.session_event("model_loading_and_initialization", t0)

    # -- building -----------------------------------------------------------------------
    def _build(self, providers, provider_options) -> Built:
        if providers is None and provider_options is None:
            # providers chosen through the options (add_provider, a selection policy)
            providers = self._sess_options.session_providers()
        return build(self._proto, self._weights, self._opsets, self._sess_options, providers, provider_options,
                     max_bytes=self._max_bytes, ir_overridable=self._ir_overridable)

    def _describe_io(self, graph: Graph) -> None:
        """Inputs, outputs and the feed checker: fixed for the session's lifetime."""
        og = self._proto.graph
        init_names = ({t.name for t in og.initializer} | {t.values.name for t in og.sparse_initializer}
                      | set(self._weights))
        so = self._sess_options
        overrides = bool(so._free_dims_by_name or so._free_dims_by_denotation)

        def declared(vi):
            # sparse inputs keep their declared type; free-dimension overrides show as onnxruntime shows them
            if vi.name in self._sparse_inputs:
                return self._declared_io[vi.name]
            return graph.value_types.get(vi.name, vi.type) if overrides else vi.type

        self._inputs = [NodeArg(vi.name, declared(vi)) for vi in og.input if vi.name not in init_names]
        self._overridable = (
            [NodeArg(vi.name, vi.type) for vi in og.input if vi.name in init_names] if self._ir_overridable else []
        )
        self._outputs = [NodeArg(vi.name, self._declared_io.get(vi.name, vi.type)) for vi in og.output]
        self._output_names = [a.name for a in self._outputs]
        # each output named once: a run's outputs are the plan's list in order, with no lookup by name
        self._distinct_outputs = len(set(self._output_names)) == len(self._output_names)
        # the graph's input types carry the session's free-dimension overrides
        feed_types = [(a.name, graph.value_types.get(a.name, a._tp)) for a in self._inputs + self._overridable]
        self._checker = FeedChecker(feed_types, {a.name for a in self._inputs})

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

    def get_plan_code(self) -> str:
        """The Python source a run of the main graph executes: one line per step
        (:attr:`onnxrt.plan.Plan.code`)."""
        return self._built.plan.code

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
        if run_options is None and self._profiler is None and not self._sparse_inputs:
            # the common run (numpy feeds of the declared types, no options, no profiler):
            # the feed is checked in a few comparisons and the plan runs with no context
            feeds = self._checker.check_fast(input_feed)
            if feeds is not None:
                names = self._output_names if output_names is None else self._resolve_outputs(output_names)
                with self._threads:
                    outs = built.plan.run(feeds, None, None)
                return self._hand_out(outs, names, feeds, built)
        if run_options is not None and run_options._adapters:
            input_feed = adapter_feeds(run_options._adapters, input_feed)
        if self._sparse_inputs:
            input_feed = densify_feeds(input_feed, self._sparse_inputs)
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
        return self._hand_out(outs, names, feeds, built)

    def _hand_out(self, outs: list, names: list[str], feeds: dict[str, Any], built: Built) -> list:
        """The outputs ``names`` of a run's ``outs`` (the plan's, in the model's output
        order) as the caller's own: never a feed's, a constant's or another output's
        memory (a sequence as a new list)."""
        feed_roots = set()
        for v in feeds.values():
            if type(v) is np.ndarray:
                feed_roots.add(_root_id(v))
            elif isinstance(v, np.ndarray):
                feed_roots.add(id(array_root(v)))
            elif isinstance(v, list):
                feed_roots.update(id(array_root(a)) for a in v if isinstance(a, np.ndarray))
        const_roots = built.const_roots
        seen: set[int] = set()

        def owned(v):
            if type(v) is np.ndarray:
                # caller_owned, spelled out for the common output (a plain array)
                r = _root_id(v)
                flags = v.flags
                if not flags.writeable or not flags.c_contiguous or r in feed_roots or r in const_roots or r in seen:
                    v = v.copy()
                    r = id(v)
                seen.add(r)
                if v.base is None:
                    # as onnxruntime's outputs do, the array views the buffer the run made (no copy)
                    v = v.view()
            elif isinstance(v, np.ndarray):
                v = caller_owned(v, feed_roots, const_roots, seen)
                seen.add(id(array_root(v)))
                if v.base is None:
                    v = v.view()
            elif isinstance(v, list):
                v = [owned(e) for e in v]
            return v

        if names is self._output_names and self._distinct_outputs:
            result = [owned(v) for v in outs]
        else:
            by_name = dict(zip(self._output_names, outs))
            result = [owned(by_name[n]) for n in names]
        if self._sparse_outputs:
            result = [to_sparse(v) if n in self._sparse_outputs else v for n, v in zip(names, result)]
        return result

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

        feeds = {k: (v.device_array() if isinstance(v, OrtValue) and v.is_sparse_tensor()
                     else v.numpy() if isinstance(v, OrtValue) else v)
                 for k, v in input_dict_ort_values.items()}
        return [OrtValue.ortvalue_from_numpy(v) if isinstance(v, np.ndarray) else OrtValue(v)
                for v in self.run(output_names, feeds, run_options)]

    def run_async(self, output_names, input_feed: dict[str, Any], callback, user_data, run_options=None) -> None:
        """Run on another thread and call ``callback(outputs, user_data, error)`` when done
        (``error`` is ``""`` on success); the session and the feeds stay alive until then."""
        start_async(self, output_names, input_feed, callback, user_data, run_options)

    def get_input_memory_infos(self) -> list:
        """Where each input is expected: an :class:`~onnxrt.OrtMemoryInfo` per input (the host)."""
        return [OrtMemoryInfo.for_device("cpu") for _ in self._inputs]

    def get_output_memory_infos(self) -> list:
        """Where each output is produced for ``run``: an :class:`~onnxrt.OrtMemoryInfo` per output."""
        return [OrtMemoryInfo.for_device("cpu") for _ in self._outputs]

    def get_input_epdevices(self) -> list:
        """onnxruntime's EP device per input; onnxrt has no EP-device objects, so each is ``None``."""
        return [None for _ in self._inputs]

    def get_provider_graph_assignment_info(self) -> list:
        """The providers' subgraphs (:class:`~onnxrt.assignment.OrtEpAssignedSubgraph`);
        needs the session config entry ``session.record_ep_graph_assignment_info`` = ``"1"``."""
        return assigned_subgraphs(self._built, self._sess_options)

    def io_binding(self):
        """A new :class:`IOBinding` for this session."""
        from .ortvalue import IOBinding

        return IOBinding(self)

    def run_with_iobinding(self, iobinding, run_options: RunOptions | None = None) -> None:
        """Run with the inputs and outputs bound on ``iobinding``."""
        iobinding._run(run_options)

    def __repr__(self) -> str:
        return f"<InferenceSession providers={self.get_providers()}>"
