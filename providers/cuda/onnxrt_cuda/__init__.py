"""onnxrt's CUDA execution provider, on CuPy."""

from .provider import CUDAExecutionProvider

__all__ = ["CUDAExecutionProvider"]
