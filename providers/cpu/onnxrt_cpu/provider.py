"""The CPU execution provider: numpy kernels for every operator."""

from __future__ import annotations

from onnxrt.kernel import KernelRegistry
from onnxrt.providers import ExecutionProvider

__all__ = ["CPUExecutionProvider"]


class CPUExecutionProvider(ExecutionProvider):
    """Runs every ONNX operator on the host with numpy.

    It comes last in every session, so it must run whatever the other providers
    leave. Its kernels are also used for constant folding.
    """

    name = "CPUExecutionProvider"
    aliases = ("cpu",)
    priority = 0
    option_types = {}

    @classmethod
    def build_registry(cls) -> KernelRegistry:
        from . import kernels
        from .registry import REGISTRY

        kernels.load_all()
        reg = KernelRegistry()
        reg.update(REGISTRY)
        return reg
