"""Shared by the CUDA tests: whether a GPU is usable here, and why not."""

import pytest

pytest.importorskip("onnxrt_cuda")
from onnxrt_cuda import CUDAExecutionProvider

CUDA = "CUDAExecutionProvider"
#: None on a machine with a usable GPU, else the provider's own reason
REASON = CUDAExecutionProvider.is_available()
needs_gpu = pytest.mark.skipif(REASON is not None, reason=f"CUDA unavailable: {REASON}")
