"""The OpenCL execution provider: partition, device memory and kernel creation.

It claims the nodes it has kernels for, groups chains of elementwise nodes into fused
groups that :mod:`onnxrt_opencl.fusion` compiles into one generated kernel each, and
leaves everything else (and the shape computations) to the CPU provider.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from onnxrt.errors import EPFail
from onnxrt.plugin.kernel import KernelRegistry, NodeInfo
from onnxrt.partition import cpu_preferred_nodes
from onnxrt.plugin.provider import Capability, Device, ExecutionProvider, flag_option, size_option

__all__ = ["OpenCLExecutionProvider", "OpenCLDevice"]

#: host arrays up to this many elements (and integer arrays of any size) keep a host copy
#: next to their device copy, so kernels needing shapes or indices on the host never read back
SMALL_HOST_COPY = 64


def _selector(v: Any) -> Any:
    """A platform/device selector: an index (int or digit string) or a name substring."""
    if isinstance(v, bool):
        raise ValueError("expected an index or a name")
    if isinstance(v, int):
        return v
    s = str(v).strip()
    if not s:
        raise ValueError("expected an index or a name")
    return int(s) if s.lstrip("-").isdigit() else s


class OpenCLDevice(Device):
    """Device arrays are ``pyopencl.array.Array`` on one :class:`CLRuntime`.

    Constant initializers are uploaded once: the provider registers them and
    :meth:`from_host` returns the cached device copy whenever the plan copies one.
    """

    kind = "opencl"

    def __init__(self, provider: "OpenCLExecutionProvider"):
        self._provider = provider
        self._consts: dict[int, tuple[np.ndarray, Any]] = {}
        self._const_ids: dict[int, np.ndarray] = {}
        self._lock = threading.Lock()

    @property
    def rt(self):
        """The provider's :class:`~onnxrt_opencl.runtime.CLRuntime`."""
        return self._provider.runtime

    def register_constants(self, arrays) -> None:
        """Mark host arrays as constants: each is uploaded once, on first use."""
        with self._lock:
            for a in arrays:
                if isinstance(a, np.ndarray):
                    self._const_ids[id(a)] = a  # the reference keeps the id unique

    def to_host(self, value: Any) -> Any:
        """Copy a device array to a host numpy array."""
        if isinstance(value, np.ndarray):
            return value
        return self.rt.to_host(value)

    def from_host(self, value: Any) -> Any:
        """Copy a host array to the device (constants only once)."""
        if not isinstance(value, (np.ndarray, np.generic)):
            raise EPFail(f"OpenCLExecutionProvider cannot hold a {type(value).__name__} on the device")
        value = np.asarray(value)
        key = id(value)
        if key in self._const_ids:
            hit = self._consts.get(key)
            if hit is None:
                with self._lock:
                    hit = self._consts.get(key)
                    if hit is None:
                        hit = (value, self._upload(value))
                        self._consts[key] = hit
            return hit[1]
        return self._upload(value)

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
    option_types = {"platform": _selector, "device": _selector, "memory_limit": size_option,
                    "enable_fusion": flag_option}
    default_options = {"platform": None, "device": None, "memory_limit": 0, "enable_fusion": True}

    def __init__(self, options=None, session_options=None):
        super().__init__(options, session_options)
        from .runtime import get_runtime

        o = self.options
        self.runtime = get_runtime(o["platform"], o["device"], o["memory_limit"])
        self._kept_on_host: set[str] = set()
        self._host_constants: set[str] = set()

    # -- availability ------------------------------------------------------------------
    @classmethod
    def is_available(cls) -> str | None:
        """``None`` when pyopencl imports and the default device runs a trivial kernel."""
        with _availability_lock:
            if "default" not in _availability:
                _availability["default"] = _check_available()
            return _availability["default"]

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
        if ni.implicit_inputs or any(hasattr(v, "nodes") for v in ni.attrs.values()):
            return "nodes with subgraphs run on the CPU"
        kdef, why = self.kernel_registry().find(ni)
        if kdef is None:
            return why or "no kernel"
        return self._device_refusal(ni)

    def refusal_reason(self, node_info: NodeInfo) -> str:
        """Why this provider does not take a node (for the assignment report)."""
        if node_info.name in self._kept_on_host:
            return "shape computation kept on the CPU"
        if node_info.name in self._host_constants:
            return "a Constant whose value is read on the CPU stays there"
        return self._claims(node_info) or "not claimed"

    def get_capability(self, graph, node_info) -> list[Capability]:
        """Claim the nodes with kernels; fuse convex chains of elementwise nodes."""
        from .fusion import group_nodes

        todo = [n for n in graph.nodes if n.provider is None]
        if not todo:
            return []
        preferred = cpu_preferred_nodes(graph)
        self._kept_on_host.update(n.name for n in todo if id(n) in preferred)
        claimed = [n for n in todo if id(n) not in preferred and self._claims(node_info(n)) is None]
        kept = _constants_feeding_the_device(graph, claimed)
        dropped = {id(n) for n in claimed} - {id(n) for n in kept}
        self._host_constants.update(n.name for n in claimed if id(n) in dropped)
        claimed = kept
        self.device.register_constants(graph.initializers.values())
        return group_nodes(graph, claimed, fuse=self.options["enable_fusion"])

    def create_kernel(self, node_info: NodeInfo):
        """Build the kernel for one node and bind it to the runtime."""
        self.device.register_constants(node_info.constants.values())
        return self.kernel_registry().create(node_info).bind(self.runtime)

    def compile(self, capability: Capability, graph, node_info):
        """Compile a fused group of elementwise nodes into one generated kernel."""
        from .fusion import FusedKernel

        self.device.register_constants(graph.initializers.values())
        return FusedKernel(capability, graph, node_info, self.runtime)


def _constants_feeding_the_device(graph, claimed: list) -> list:
    """Drop Constant nodes whose value is read on the host: uploading it would cost a copy back."""
    ids = {id(n) for n in claimed}
    readers: dict[str, list] = {}
    for n in graph.nodes:
        for i in n.inputs:
            readers.setdefault(i, []).append(n)
        if n.subgraphs:
            for i in n.implicit_inputs():
                readers.setdefault(i, []).append(None)
    outputs = set(graph.output_names())
    keep = []
    for n in claimed:
        if n.op_type == "Constant" and n.domain == "":
            users = readers.get(n.outputs[0], [])
            if n.outputs[0] in outputs or not users or any(u is None or id(u) not in ids for u in users):
                continue
        keep.append(n)
    return keep


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
