"""The CUDA execution provider: partition, options, memory pool and kernel creation.

It claims the nodes it has kernels for and groups chains of elementwise nodes into fused
groups that :mod:`onnxrt_cuda.fusion` compiles into one generated CuPy kernel each; the
core keeps shape computations on the CPU, uploads constants once and builds the kernels
inside the device's scope (device, stream, memory pool), which each run enters too.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from onnxrt.errors import EPFail, InvalidArgument
from onnxrt.plugin import Capability, Device, ExecutionProvider, KernelRegistry, NodeInfo, flag_option, group_io, size_option

from . import runtime
from .codegen import CTYPES, fusable

__all__ = ["CUDAExecutionProvider", "parse_options"]

ARENA_STRATEGIES = ("kNextPowerOfTwo", "kSameAsRequested")


def _device_id(v: Any) -> int:
    if isinstance(v, bool):
        raise ValueError("expected a device index")
    n = int(v)
    if n < 0:
        raise ValueError("must be >= 0")
    return n


def _strategy(v: Any) -> str:
    # onnxruntime also takes the enum's integer value (0: kNextPowerOfTwo, 1: kSameAsRequested)
    if isinstance(v, (int, np.integer)) and not isinstance(v, bool) and 0 <= int(v) < len(ARENA_STRATEGIES):
        return ARENA_STRATEGIES[int(v)]
    s = str(v).strip()
    if s.isdigit() and int(s) < len(ARENA_STRATEGIES):
        return ARENA_STRATEGIES[int(s)]
    if s not in ARENA_STRATEGIES:
        raise ValueError(f"expected one of {', '.join(ARENA_STRATEGIES)}")
    return s


def _next_power_of_two(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def parse_options(options: dict[str, Any]) -> dict[str, Any]:
    """Validate CUDA provider options (unknown keys and bad values raise ``InvalidArgument``)."""
    o = CUDAExecutionProvider.validate_options(options)
    if o["gpu_mem_limit"] and not o["use_memory_pool"]:
        raise InvalidArgument("CUDAExecutionProvider: gpu_mem_limit needs use_memory_pool (the limit is the pool's)")
    return o


class CUDAExecutionProvider(ExecutionProvider):
    """Runs nodes on an NVIDIA GPU through CuPy.

    Options: ``device_id`` (default 0), ``gpu_mem_limit`` (bytes, 0 for none: the
    session's memory pool never grows past it), ``arena_extend_strategy``
    (``kNextPowerOfTwo`` rounds each pool allocation up to a power of two, trading memory
    for reuse; ``kSameAsRequested`` keeps CuPy's 512-byte rounding), ``use_memory_pool``
    (a per-session CuPy memory pool, or plain ``cudaMalloc``/``cudaFree`` when off) and
    ``enable_fusion`` (compile elementwise chains into one kernel; on by default).
    """

    name = "CUDAExecutionProvider"
    aliases = ("cuda",)
    priority = 100
    option_types = {"device_id": _device_id, "gpu_mem_limit": size_option, "arena_extend_strategy": _strategy,
                    "use_memory_pool": flag_option, "enable_fusion": flag_option}
    default_options = {"device_id": 0, "gpu_mem_limit": 0, "arena_extend_strategy": "kNextPowerOfTwo",
                       "use_memory_pool": True, "enable_fusion": True}

    def __init__(self, options=None, session_options=None):
        self.options = parse_options(options or {})
        why = runtime.availability(self.options["device_id"])
        if why is not None:
            raise EPFail(f"CUDAExecutionProvider is not available: {why}")
        self.session_options = session_options
        self.scope = runtime.DeviceScope(self.options["device_id"], self._allocator())
        self.device: Device = self.create_device()

    def _allocator(self):
        o = self.options
        cp = runtime.import_cupy()
        if not o["use_memory_pool"]:
            return None  # CuPy: no pool, cudaMalloc per array
        with cp.cuda.Device(o["device_id"]):
            self.pool = cp.cuda.MemoryPool()
            if o["gpu_mem_limit"]:
                self.pool.set_limit(size=o["gpu_mem_limit"])
        if o["arena_extend_strategy"] == "kNextPowerOfTwo":
            pool = self.pool
            return lambda n: pool.malloc(_next_power_of_two(n))
        return self.pool.malloc

    # -- availability ----------------------------------------------------------------------
    @classmethod
    def is_available(cls) -> str | None:
        """``None`` when CuPy imports and GPU 0 runs a test kernel, else why not."""
        return runtime.availability(0)

    @classmethod
    def build_registry(cls) -> KernelRegistry:
        from .registry import build_registry

        return build_registry(runtime.import_cupy())

    def create_device(self) -> Device:
        from .device import CUDADevice

        return CUDADevice(self.options["device_id"], self.scope)

    # -- partition -----------------------------------------------------------------------------
    def _claims(self, ni: NodeInfo) -> str | None:
        """``None`` when this provider takes the node, else the reason it does not."""
        dts = [ni.input_dtype(i) for i in range(len(ni.inputs)) if ni.inputs[i]]
        dts += [ni.output_dtype(i) for i in range(len(ni.outputs)) if ni.outputs[i]]
        for dt in dts:
            if dt is not None and dt not in CTYPES:
                return f"CUDA does not hold {dt} tensors"
        if self._fusable(ni) is None:
            return None
        kdef, why = self.kernel_registry().find(ni)
        return None if kdef is not None else (why or "no kernel")

    def _fusable(self, ni: NodeInfo) -> str | None:
        """``None`` when the node can join a generated elementwise kernel."""
        in_dts = [ni.input_dtype(i) for i in range(len(ni.inputs)) if ni.inputs[i]]
        if len(ni.outputs) != 1 or any(d is None for d in in_dts):
            return "input types unknown"
        return fusable(ni.op_type, ni.domain, in_dts, ni.attrs)

    def refusal_reason(self, node_info: NodeInfo) -> str:
        """Why this provider does not take a node (for the assignment report)."""
        return self._claims(node_info) or "not claimed"

    def get_capability(self, graph, node_info) -> list[Capability]:
        """Claim the candidates with kernels; fuse convex chains of elementwise nodes."""
        from .fusion import group_nodes

        claimed = [n for n in graph.candidates if self._claims(node_info(n)) is None]
        fuse = {id(n) for n in claimed if self.options["enable_fusion"] and self._fusable(node_info(n)) is None}
        # fusable ops without a kernel can only run compiled
        claimed = [n for n in claimed if id(n) in fuse or self.kernel_registry().find(node_info(n))[0] is not None]
        return group_nodes(graph, claimed, fuse)

    def compile(self, capability: Capability, graph, node_info):
        """Compile a fused group of elementwise nodes into one generated kernel."""
        from .fusion import FusedKernel

        inputs, outputs = group_io(graph, capability.nodes)
        return FusedKernel(capability.nodes, inputs, outputs, lambda n: node_info(n).attrs,
                           capability.fused_name or capability.nodes[0].name, self.scope.cp)
