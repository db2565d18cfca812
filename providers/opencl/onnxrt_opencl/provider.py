"""The OpenCL execution provider: what it claims, and its device memory.

It claims the nodes it has kernels for and groups chains of elementwise nodes into fused
groups that :mod:`onnxrt_opencl.fusion` compiles into one generated kernel each; the
core keeps shape computations and host-read Constants on the CPU and uploads constant
initializers once.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from onnxrt.errors import EPFail
from onnxrt.plugin import Capability, Device, ExecutionProvider, KernelRegistry, NodeInfo, flag_option, selector_option, size_option

__all__ = ["OpenCLExecutionProvider", "OpenCLDevice"]

#: host arrays up to this many elements (and integer arrays of any size) keep a host copy
#: next to their device copy, so kernels needing shapes or indices on the host never read back
SMALL_HOST_COPY = 64


class OpenCLDevice(Device):
    """Device arrays are ``pyopencl.array.Array`` on the provider's :class:`CLRuntime`."""

    kind = "opencl"

    def __init__(self, provider: "OpenCLExecutionProvider"):
        self._provider = provider

    @property
    def rt(self):
        """The provider's :class:`~onnxrt_opencl.runtime.CLRuntime`."""
        return self._provider.runtime

    def to_host(self, value: Any) -> Any:
        """Copy a device array to a host numpy array."""
        if isinstance(value, np.ndarray):
            return value
        return self.rt.to_host(value)

    def from_host(self, value: Any) -> Any:
        """Copy a host array to the device."""
        if not isinstance(value, (np.ndarray, np.generic)):
            raise EPFail(f"OpenCLExecutionProvider cannot hold a {type(value).__name__} on the device")
        return self._upload(np.asarray(value))

    def _upload(self, value: np.ndarray) -> Any:
        if value.dtype.kind not in "biuf":
            raise EPFail(f"OpenCLExecutionProvider cannot hold {value.dtype} arrays on the device")
        arr = self.rt.to_device(value)
        # kernels read shapes and indices on the host (a Reshape's shape, Gather's bounds check)
        if value.size <= SMALL_HOST_COPY:
            arr.host_copy = np.array(value)
        elif value.dtype.kind in "iu":
            arr.host_copy = value  # the plan holds the value for the run; no copy needed
        return arr

    def synchronize(self) -> None:
        """Wait for every enqueued command."""
        self.rt.synchronize()

    @property
    def device_id(self) -> int:  # type: ignore[override]
        return 0


_availability: dict[str, str | None] = {}
_availability_lock = threading.Lock()


class OpenCLExecutionProvider(ExecutionProvider):
    """Runs nodes on an OpenCL device through PyOpenCL.

    Options: ``platform`` and ``device`` (an index or a case-insensitive name substring;
    by default the first GPU, else the first device), ``memory_limit`` (bytes for the
    buffer pool, 0 for none) and ``enable_fusion`` (fuse elementwise chains; on by default).
    """

    name = "OpenCLExecutionProvider"
    aliases = ("opencl",)
    #: below the CPU provider: an OpenCL CPU device (PoCL) is no faster than numpy, so
    #: sessions use OpenCL when asked for it by name; see :func:`default_priority`
    priority = -10
    option_types = {"platform": selector_option, "device": selector_option, "memory_limit": size_option,
                    "enable_fusion": flag_option}
    default_options = {"platform": None, "device": None, "memory_limit": 0, "enable_fusion": True}

    def __init__(self, options=None, session_options=None):
        super().__init__(options, session_options)
        from .runtime import get_runtime

        o = self.options
        self.runtime = get_runtime(o["platform"], o["device"], o["memory_limit"])

    # -- availability ------------------------------------------------------------------
    @classmethod
    def is_available(cls) -> str | None:
        """``None`` when pyopencl imports and the default device runs a trivial kernel."""
        with _availability_lock:
            if "default" not in _availability:
                _availability["default"] = _check_available()
            return _availability["default"]

    @classmethod
    def details(cls) -> str:
        """The default device sessions get: its name, platform and type; empty when the
        provider is unavailable (its reason says why).

        Cheap: it reuses the runtime :meth:`is_available` already built, and it never
        raises (pyopencl missing, no ICD, a driver error) so the listing always prints."""
        try:
            if cls.is_available() is not None:
                return ""
            from .runtime import get_runtime

            return _describe_device(get_runtime().device)
        except Exception as e:  # noqa: BLE001 - a driver's error must not break the listing
            return f"device unknown ({type(e).__name__}: {e})"

    @classmethod
    def build_registry(cls) -> KernelRegistry:
        from . import kernels
        from .registry import REGISTRY

        kernels.load_all()
        reg = KernelRegistry()
        reg.update(REGISTRY)
        return reg

    def create_device(self) -> Device:
        return OpenCLDevice(self)

    # -- partition -----------------------------------------------------------------------
    def _device_refusal(self, ni: NodeInfo) -> str | None:
        if self.runtime.has_fp64:
            return None
        for dt in [ni.input_dtype(i) for i in range(len(ni.inputs))] + [ni.output_dtype(i) for i in range(len(ni.outputs))]:
            if dt is not None and dt == np.float64:
                return f"the device {self.runtime.device_name!r} has no float64 support"
        return None

    def _claims(self, ni: NodeInfo) -> str | None:
        """``None`` when this provider takes the node, else the reason it does not."""
        kdef, why = self.kernel_registry().find(ni)
        if kdef is None:
            return why or "no kernel"
        return self._device_refusal(ni)

    def refusal_reason(self, node_info: NodeInfo) -> str:
        """Why this provider does not take a node (for the assignment report)."""
        return self._claims(node_info) or "not claimed"

    def get_capability(self, graph, node_info) -> list[Capability]:
        """Claim the candidates with kernels; fuse convex chains of elementwise nodes."""
        from .fusion import group_nodes

        claimed = [n for n in graph.candidates if self._claims(node_info(n)) is None]
        return group_nodes(graph, claimed, fuse=self.options["enable_fusion"])

    def compile(self, capability: Capability, graph, node_info):
        """Compile a fused group of elementwise nodes into one generated kernel."""
        from .fusion import FusedKernel

        return FusedKernel(capability, graph, node_info, self.device)


def _check_available() -> str | None:
    try:
        import pyopencl  # noqa: F401
    except Exception as e:  # noqa: BLE001 - ImportError, or OSError when the ICD loader is missing
        return f"pyopencl cannot be imported: {type(e).__name__}: {e}"
    from .runtime import get_runtime, probe

    try:
        rt = get_runtime()
    except Exception as e:  # noqa: BLE001
        return str(e) if isinstance(e, EPFail) else f"OpenCL setup failed: {type(e).__name__}: {e}"
    return probe(rt)


def _describe_device(device) -> str:
    """``device <name> (<platform>, <type>)``, as ``onnxrt providers`` shows it."""
    import pyopencl as cl

    kinds = [name for name in ("GPU", "CPU", "ACCELERATOR") if device.type & getattr(cl.device_type, name)]
    kind = "/".join(kinds) or "other"
    return f"device {device.name.strip()} ({device.platform.name.strip()}, {kind})"
