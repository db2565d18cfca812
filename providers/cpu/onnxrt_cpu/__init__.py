"""onnxrt-cpu: the CPU execution provider for onnxrt, on numpy."""

from .provider import CPUExecutionProvider

__all__ = ["CPUExecutionProvider"]
