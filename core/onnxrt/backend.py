"""``onnxrt.backend``: the standard ``onnx.backend.base.Backend`` over onnxrt sessions.

``onnx.backend.test.BackendTest(onnxrt.backend, __name__)`` runs the ONNX backend
test suite against onnxrt. ``device`` is ``"CPU"`` or a provider name/alias.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx.backend.base import Backend, BackendRep

from .errors import InvalidArgument
from .options import RunOptions, SessionOptions
from .plugin.discovery import get_available_providers, provider_registry
from .session import InferenceSession

__all__ = ["OnnxRtBackend", "OnnxRtBackendRep", "prepare", "run", "run_model", "run_node", "supports_device",
           "is_compatible", "ALLOWED_SESSION_OPTIONS", "ALLOWED_RUN_OPTIONS", "OptionNotPermitted"]


def _providers_for(device: str) -> list[str]:
    if device.upper() == "CPU":
        return ["CPUExecutionProvider"]
    if device.upper() in ("CUDA", "GPU"):
        return ["CUDAExecutionProvider", "CPUExecutionProvider"]
    cls = provider_registry().lookup(device)
    if cls is None:
        raise ValueError(f"unknown device {device!r}")
    return [cls.name, "CPUExecutionProvider"]


#: SessionOptions a backend caller may set through keyword arguments (onnxruntime's list):
#: settings that change how a model runs, never where files are written
ALLOWED_SESSION_OPTIONS = frozenset({
    "enable_cpu_mem_arena", "enable_mem_pattern", "enable_mem_reuse", "execution_mode", "execution_order",
    "graph_optimization_level", "inter_op_num_threads", "intra_op_num_threads", "log_severity_level",
    "log_verbosity_level", "logid", "use_deterministic_compute", "use_per_session_threads",
})
#: RunOptions a backend caller may set through keyword arguments
ALLOWED_RUN_OPTIONS = frozenset({"log_severity_level", "log_verbosity_level", "logid",
                                 "only_execute_path_to_fetches"})


class OptionNotPermitted(InvalidArgument, RuntimeError):
    """A backend keyword names a real option that a backend caller may not set (it would
    write files or stop runs): an ``InvalidArgument`` and, as onnxruntime raises it, a
    ``RuntimeError``."""


def _apply_options(target, kwargs: dict, allowed: frozenset, what: str) -> None:
    """Set the allowed options of ``kwargs`` on ``target``; a known option outside
    ``allowed`` is refused and an unknown keyword ignored (onnxruntime's rules)."""
    for k, v in kwargs.items():
        if not hasattr(target, k):
            continue
        if k not in allowed:
            raise OptionNotPermitted(
                f"{what} option {k!r} is not permitted through the backend API; "
                f"permitted: {', '.join(sorted(allowed))}"
            )
        setattr(target, k, v)


class OnnxRtBackendRep(BackendRep):
    """A prepared model."""

    def __init__(self, session: InferenceSession):
        self.session = session

    def run(self, inputs: Any, **kwargs) -> tuple:
        """Run with inputs as a list (graph-input order), a dict of input names, or the
        single input's value (an array, or a dict for a map input). Keyword arguments set
        :data:`ALLOWED_RUN_OPTIONS`."""
        run_options = RunOptions()
        _apply_options(run_options, kwargs, ALLOWED_RUN_OPTIONS, "RunOptions")
        names = [i.name for i in self.session.get_inputs()]
        if isinstance(inputs, dict) and inputs and all(k in names for k in inputs):
            feeds = inputs
        elif isinstance(inputs, (list, tuple)):
            feeds = dict(zip(names, inputs))
        else:
            if len(names) != 1:
                raise InvalidArgument(f"the model expects {len(names)} inputs; pass them as a list or a dict")
            feeds = {names[0]: inputs}
        return tuple(self.session.run(None, feeds, run_options))


class OnnxRtBackend(Backend):
    """The onnx backend protocol for onnxrt."""

    @classmethod
    def is_compatible(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs) -> bool:
        """Whether the model loads (a cheap check: opsets and device)."""
        return cls.supports_device(device)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        """Whether a provider for ``device`` is available."""
        try:
            provs = _providers_for(device)
        except ValueError:
            return False
        return provs[0] in get_available_providers()

    @classmethod
    def prepare(cls, model, device: str = "CPU", **kwargs) -> OnnxRtBackendRep:
        """Build a session for ``model`` (a ModelProto, bytes or path)."""
        so = SessionOptions()
        _apply_options(so, kwargs, ALLOWED_SESSION_OPTIONS, "SessionOptions")
        if isinstance(model, onnx.ModelProto):
            model = model.SerializeToString()
        return OnnxRtBackendRep(InferenceSession(model, so, providers=_providers_for(device)))

    @classmethod
    def run_model(cls, model, inputs: Any, device: str = "CPU", **kwargs) -> tuple:
        """Prepare and run in one call; keyword arguments set session and run options
        (each from its allowed list)."""
        so_kwargs = {k: v for k, v in kwargs.items() if hasattr(SessionOptions(), k)}
        run_kwargs = {k: v for k, v in kwargs.items() if k not in so_kwargs}
        return cls.prepare(model, device, **so_kwargs).run(inputs, **run_kwargs)

    @classmethod
    def run_node(cls, node: onnx.NodeProto, inputs: Any, device: str = "CPU", outputs_info=None, **kwargs) -> tuple:
        """Run a single node, building a one-node model around it."""
        opset = kwargs.pop("opset_version", onnx.defs.onnx_opset_version())
        ins = [
            onnx.helper.make_tensor_value_info(n, onnx.helper.np_dtype_to_tensor_dtype(np.asarray(x).dtype), None)
            for n, x in zip(node.input, inputs)
        ]
        outs = [onnx.helper.make_empty_tensor_value_info(n) for n in node.output]
        graph = onnx.helper.make_graph([node], "run_node", ins, outs)
        model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid(node.domain or "", opset)])
        return cls.run_model(model, list(inputs), device, **kwargs)


prepare = OnnxRtBackend.prepare
run_model = OnnxRtBackend.run_model
#: onnxruntime.backend's name for :meth:`OnnxRtBackend.run_model`
run = OnnxRtBackend.run_model
run_node = OnnxRtBackend.run_node
supports_device = OnnxRtBackend.supports_device
is_compatible = OnnxRtBackend.is_compatible
