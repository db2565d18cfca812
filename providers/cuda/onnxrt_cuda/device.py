"""CUDA device memory: CuPy arrays on one GPU, uploaded and read back on this thread's stream."""

from __future__ import annotations

from typing import Any

import numpy as np
from onnxrt.errors import EPFail, InvalidArgument
from onnxrt.plugin.provider import Device

from .codegen import CTYPES
from .runtime import DeviceScope

__all__ = ["CUDADevice"]


class CUDADevice(Device):
    """Values are ``cupy.ndarray`` on GPU ``device_id`` (the core uploads each constant
    initializer once, while the session is built)."""

    kind = "cuda"

    def __init__(self, device_id: int, scope: DeviceScope):
        self.device_id = device_id
        self.scope = scope
        self.cp = scope.cp

    def run_scope(self):
        """The provider's scope (device, this thread's stream, the session's pool), which
        the plan enters once per run; the kernels' own entries inside it cost a counter."""
        return self.scope

    def holds(self, value: Any) -> bool:
        """Whether ``value`` already lives on this GPU (a CuPy array on ``device_id``)."""
        return isinstance(value, self.cp.ndarray) and value.device.id == self.device_id

    def wrap(self, obj: Any) -> Any:
        """A CuPy view of a device array from another library, with no copy."""
        cp = self.cp
        with self.scope:
            if hasattr(obj, "__cuda_array_interface__"):
                return cp.asarray(obj)
            if hasattr(obj, "__dlpack__"):
                return cp.from_dlpack(obj)
        raise InvalidArgument(f"a {type(obj).__name__} is not a CUDA array (no __cuda_array_interface__ or DLPack)")

    def wrap_pointer(self, ptr: int, shape: tuple, dtype: np.dtype) -> Any:
        """A CuPy array over device memory at ``ptr`` that the caller keeps alive."""
        cp = self.cp
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        mem = cp.cuda.UnownedMemory(int(ptr), nbytes, None, self.device_id)
        return cp.ndarray(tuple(shape), dtype=dtype, memptr=cp.cuda.MemoryPointer(mem, 0))

    def from_host(self, value: Any) -> Any:
        """Copy a host array to the GPU."""
        if self.holds(value):
            return value
        if not isinstance(value, (np.ndarray, np.generic)):
            raise EPFail(f"CUDAExecutionProvider cannot hold a {type(value).__name__} on the device")
        value = np.asarray(value)
        if value.dtype not in CTYPES:
            raise EPFail(f"CUDAExecutionProvider cannot hold {value.dtype} arrays on the device")
        return self._upload(value)

    def _upload(self, value: np.ndarray):
        with self.scope:
            return self.cp.asarray(value)

    def to_host(self, value: Any) -> Any:
        """Copy a GPU array to a host numpy array (waits for this thread's stream)."""
        if not self.holds(value) and isinstance(value, np.ndarray):
            return value
        with self.scope as s:
            return value.get(stream=s.stream())

    def synchronize(self) -> None:
        """Wait for the work this thread queued on the device."""
        self.scope.stream().synchronize()

    def __repr__(self) -> str:
        return f"<Device cuda:{self.device_id}>"
