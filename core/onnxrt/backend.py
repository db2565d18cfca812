"""``onnxrt.backend``: the standard ``onnx.backend.base.Backend`` over onnxrt sessions.

``onnx.backend.test.BackendTest(onnxrt.backend, __name__)`` runs the ONNX backend
test suite against onnxrt. ``device`` is ``"CPU"`` or a provider name/alias.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx.backend.base import Backend, BackendRep

from .options import SessionOptions
from .plugin.discovery import get_available_providers, provider_registry
from .session import InferenceSession

__all__ = ["OnnxRtBackend", "OnnxRtBackendRep", "prepare", "run_model", "run_node", "supports_device", "is_compatible"]


def _providers_for(device: str) -> list[str]:
    if device.upper() == "CPU":
        return ["CPUExecutionProvider"]
    if device.upper() in ("CUDA", "GPU"):
        return ["CUDAExecutionProvider", "CPUExecutionProvider"]
    cls = provider_registry().lookup(device)
    if cls is None:
        raise ValueError(f"unknown device {device!r}")
    return [cls.name, "CPUExecutionProvider"]


class OnnxRtBackendRep(BackendRep):
    """A prepared model."""

    def __init__(self, session: InferenceSession):
        self.session = session

    def run(self, inputs: Any, **kwargs) -> tuple:
        """Run with inputs as a list (graph-input order), a dict, or a single array."""
        names = [i.name for i in self.session.get_inputs()]
        if isinstance(inputs, dict):
            feeds = inputs
        elif isinstance(inputs, (list, tuple)):
            feeds = dict(zip(names, inputs))
        else:
            feeds = {names[0]: inputs}
        return tuple(self.session.run(None, feeds))


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
        for k, v in kwargs.items():
            if hasattr(so, k):
                setattr(so, k, v)
        if isinstance(model, onnx.ModelProto):
            model = model.SerializeToString()
        return OnnxRtBackendRep(InferenceSession(model, so, providers=_providers_for(device)))

    @classmethod
    def run_model(cls, model, inputs: Any, device: str = "CPU", **kwargs) -> tuple:
        """Prepare and run in one call."""
        return cls.prepare(model, device, **kwargs).run(inputs)

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
run_node = OnnxRtBackend.run_node
supports_device = OnnxRtBackend.supports_device
is_compatible = OnnxRtBackend.is_compatible
